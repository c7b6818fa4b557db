"""The statement-level path gives the same answers as a whole-module parse.

`rewrite_source` lets libcst parse only the top-level statements that hold a token of a
selected rule (gpu2tpu/rewrite/core/statements.py); `statement_level=False` parses the whole module.
Both must return the same `Result`: the same text byte for byte, the same edits and findings
with the same lines and columns, in `check` (no fixes) and in `rewrite` — on generated files
built to stress what a placeholder could change (comments and blank lines after blocks,
whitespace-only lines, decorators, semicolons, two-space and tab indents, CRLF), on a sample
of torch's own sources and on the corpus packages.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import tarfile
from pathlib import Path

import pytest
from corpus import harness
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu2tpu.rewrite.core import parsing, statements
from gpu2tpu.rewrite.core.model import Options
from gpu2tpu.rewrite.core.source import SourceError, parse_for_rules, rewrite_source

# The CLI's modes, and those of the notebook callers (a `%%tpu` cell: the kernel's device
# variable, earlier cells' imports, no statement may be added).
CELL = Options(
    device_name="device",
    define_device=False,
    insert_statements=False,
    prior_imports=("import torch",),
)
MODES = (
    Options(fix=False),
    Options(),
    Options(unsafe_fixes=True),
    CELL,
    dataclasses.replace(CELL, fix=False),
)

CUDA = [
    "{v} = torch.zeros({n}).cuda()",
    "{v} = torch.randn({n}, device='cuda')",
    "torch.cuda.synchronize()",
    "{v} = torch.cuda.device_count() + {n}",
    "if torch.cuda.is_available(): {v} = {n}",
    "torch.backends.cudnn.benchmark = True",
    "{v} = synchronize()",
    "{v} = torch.cuda.amp.autocast()",
    "torch.cuda.manual_seed({n})",
    "torch.cuda.manual_seed_all({n})",
    "{v} = torch.cuda.Event(enable_timing=True)",
    "{v} = [t.cuda() for t in ({v}, {v})]",
    "for batch in loader:\n    loss = model(batch)\n    loss.backward()\n    print(loss.item())",
]
PLAIN = [
    "{v} = {n}",
    "torch.manual_seed({n})",
    "{v}.record()",
    "print(a.elapsed_time({v}))",
    "{v} = torch.zeros({n})",
    "{v} = nn.Linear({n}, {n})",
    "print({v!r}); {v} = {n}",
    "pass  # a comment about {v}",
    "{v} = ({n},\n    {n} + 1)",
    "class Model{n}(nn.Module):\n    pass",
]
BLOCKS = [
    "{body}",
    "def f_{n}(a, b={n}):\n{ibody}\n    return a",
    "@decorator\ndef g_{n}():\n{ibody}",
    "for i in range({n}):\n{ibody}\nelse:\n    pass",
    "if {n} > 1:\n{ibody}\nelif {n}:\n    pass\nelse:\n    pass",
    "try:\n{ibody}\nexcept ValueError:\n    pass\nfinally:\n    pass",
    "with open('x') as fh:\n{ibody}",
    "class C{n}:\n    def m(self):\n{iibody}",
    "match {n}:\n    case 1:\n{iibody}\n    case _:\n        pass",
    # Classes whose methods are held out one by one (statements.held_methods): a method
    # reading what a kept one assigns from a token, comments between methods, decorators.
    "class D{n}(nn.Module):\n    def m(self, a):\n{iibody}\n        # after m\n\n"
    "    @property\n    def p(self):\n        return self.gpu\n\n"
    "    def cuda_part(self):\n        self.gpu = int(os.environ['LOCAL_RANK'])\n"
    "        return torch.zeros(1).to(self.gpu)",
    "class E{n}:\n    x = {n}\n\n    def plain(self):\n        return {n}\n"
    "    # a comment at the methods' indent\n\n    async def later(self):\n{iibody}\n\n"
    "    def last(self):\n        global g\n        g = 1",
]
# What may follow a block before the next statement: whose lines libcst gives to whom.
GAPS = ["\n", "\n\n", "\n# a comment\n", "\n    # an indented comment\n", "\n    \n", "\n\t\n",
        "\n\n# two\n\n# comments\n\n", "\n  # odd indent\n\n"]  # fmt: skip
HEADERS = [
    "import torch\nimport torch.nn as nn\nfrom torch.cuda import synchronize\n",
    '"""Docstring."""\nfrom __future__ import annotations\n\nimport os\nimport torch\n'
    "import torch.nn as nn\nfrom torch.cuda import synchronize\n",
    "# a leading comment\nimport torch\nimport torch.nn as nn\nfrom torch.cuda import synchronize\n"
    "os.environ['CUDA_VISIBLE_DEVICES'] = '0'\n",
    "import torch.nn as nn\nfrom torch.cuda import synchronize\n",  # no `import torch`
]

names = st.sampled_from(["a", "x", "model", "batch", "device", "out", "accel_device", "time"])
numbers = st.integers(min_value=0, max_value=9)


@st.composite
def statement(draw: st.DrawFn, pool: list[str]) -> str:
    return draw(st.sampled_from(pool)).format(v=draw(names), n=draw(numbers))


@st.composite
def block(draw: st.DrawFn) -> str:
    cuda = draw(st.booleans())
    pool = PLAIN + CUDA if cuda else PLAIN
    stmts = draw(st.lists(statement(pool), min_size=1, max_size=3))
    indent = draw(st.sampled_from(["    ", "  ", "\t"]))

    def indented(depth: int) -> str:
        lines = "\n".join(stmts).split("\n")
        return "\n".join(indent * depth + line for line in lines)

    wrapper = draw(st.sampled_from(BLOCKS)).replace("    ", indent)
    return wrapper.format(
        body="\n".join(stmts), ibody=indented(1), iibody=indented(2), n=draw(numbers)
    )


@st.composite
def program(draw: st.DrawFn) -> str:
    blocks = draw(st.lists(block(), min_size=3, max_size=9))
    text = draw(st.sampled_from(HEADERS))
    for item in blocks:
        text += draw(st.sampled_from(GAPS)) + item
    text += draw(st.sampled_from(["\n", "\n    # the end\n", "\n\n", ""]))
    if draw(st.booleans()):
        text = text.replace("\n", "\r\n")
    return text


def assert_same(text: str, options: Options) -> None:
    try:
        whole = rewrite_source(text, options, statement_level=False)
    except SourceError as err:
        with pytest.raises(SourceError) as again:
            rewrite_source(text, options)
        assert (again.value.reason, again.value.line) == (err.reason, err.line)
        return
    fast = rewrite_source(text, options)
    assert fast.new_text == whole.new_text
    assert fast.edits == whole.edits  # lines, columns, before and after included
    assert fast.findings == whole.findings
    assert fast == whole


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program(), st.sampled_from(MODES))
def test_generated_files_give_the_same_result(text: str, options: Options) -> None:
    ast.parse(text)  # the generator makes valid programs
    assert_same(text, options)


def _prepared_by_check(text: str) -> parsing.Prepared:
    """What `rewrite_source(text)` in check mode parsed (its first `prepare`)."""
    seen: list[parsing.Prepared] = []
    real = parsing.prepare

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(real(*args, **kwargs))
        return seen[-1]

    import gpu2tpu.rewrite.core.source as source

    source.prepare = spy  # type: ignore[assignment]
    try:
        rewrite_source(text, Options(fix=False))
    finally:
        source.prepare = real  # type: ignore[assignment]
    return seen[0]


def _held_lines(text: str) -> int:
    """How many lines the statement-level path kept from libcst in `text`."""
    skipped = _prepared_by_check(text).skipped or ()
    return sum(g.last - g.first + 1 for g in skipped)


def _held_methods(text: str) -> list[str]:
    """The methods the statement-level path held out of libcst's parse in `text`."""
    prepared = parse_for_rules(text, Options(fix=False))
    assert prepared is not None and prepared.module is not None
    lines = text.splitlines()
    return [
        lines[hold.line - 1].strip()
        for hold in prepared.holds
        if hold.prefix.strip() == "" and hold.prefix  # indented: inside a class
    ]


def test_a_kept_class_holds_out_its_methods_with_nothing_to_rewrite() -> None:
    """One CUDA call in one method no longer has libcst parse the whole class; what the other
    methods need stays parsed: a read of what a kept method assigns from a token (`.to(self.
    gpu_id)`, G2T407), a use of an event a kept method makes (`self.start.record()`), a
    `global`. Both paths give the same result."""
    text = (
        "import os\nimport time\nimport torch\n\n\nclass Trainer:\n"
        "    def __init__(self):\n        self.gpu_id = int(os.environ['LOCAL_RANK'])\n"
        "        self.start = torch.cuda.Event(enable_timing=True)\n\n"
        "    def plain(self, y):\n        return y + 1\n\n"
        "    @staticmethod\n    def helper(a, b):\n        return [a, b]\n\n"
        "    def batch(self, x):\n        return x.to(self.gpu_id)\n\n"
        "    def timed(self):\n        self.start.record()\n\n"
        "    def counter(self):\n        global COUNT\n        COUNT = 1\n\n\n"
        "x = torch.zeros(2).cuda()\n"
    )
    assert _held_methods(text) == ["def plain(self, y):", "@staticmethod"]
    for options in MODES:
        assert_same(text, options)
    new = rewrite_source(text).new_text
    assert 'x.to(self.gpu_id if device.type == "cuda" else device)' in new
    assert "def plain(self, y):\n        return y + 1\n" in new  # put back as written


def test_a_training_loop_token_counts_only_where_a_loop_is() -> None:
    """`model(`, `.step(` and `.item()` select the training-loop hazards (G2T601-604), which are
    reported inside a loop only (`Rule.in_loops_only`): a method or function that holds one
    and no loop is held out, one with a loop is parsed and its finding made, as with the
    whole module parsed."""
    text = (
        "import torch\n\n\nclass Runner:\n"
        "    def once(self, model, x):\n        return model(x).item()\n\n"
        "    def train(self, model, loader, opt):\n        for x in loader:\n"
        "            loss = model(x)\n            loss.backward()\n            opt.step()\n"
        "            print(loss.item())\n\n"
        "    def gpu(self):\n        return torch.zeros(1).cuda()\n\n\n"
        "def evaluate(model, x):\n    return model(x).cpu()\n\n\n"
        "y = 1\n"
    )
    assert _held_methods(text) == ["def once(self, model, x):"]
    assert _held_lines(text) == 3  # `evaluate`, and `y = 1`
    for options in MODES:
        assert_same(text, options)
    found = rewrite_source(text, Options(fix=False)).findings
    assert [(f.code, f.line) for f in found if f.code == "G2T601"] == [("G2T601", 13)]


def test_the_statement_level_path_holds_statements_out() -> None:
    """Not vacuous: a file with one CUDA statement among plain ones keeps libcst off the rest,
    and the rewrite is still the same as with the whole module parsed."""
    text = (
        "import torch\n\n\nclass Plain:\n    def m(self):\n        return 1\n\n\n"
        "def helper(x):\n    return x + 1\n\n\nx = torch.zeros(2).cuda()\n\n\n"
        "def more():\n    # a comment\n    return [i for i in range(3)]\n"
    )
    assert _held_lines(text) == 3 + 2 + 3
    for options in MODES:
        assert_same(text, options)
    assert "device" in rewrite_source(text).new_text


def test_parse_for_rules_parses_what_rewrite_source_parses() -> None:
    """The benchmark's parse-only floor (`source.parse_for_rules`) is the parse `check` runs on:
    the same statements held out, the same libcst tree; nothing for a text with no token."""
    text = (
        "import torch\n\n\nclass Plain:\n    def m(self):\n        return 1\n\n\n"
        "x = torch.zeros(2).cuda()\n\n\ndef more():\n    return 2\n"
    )
    checked = _prepared_by_check(text)
    alone = parse_for_rules(text, Options(fix=False))
    assert alone is not None and alone.module is not None and checked.module is not None
    spans = [(g.first, g.last) for g in alone.skipped or ()]
    assert spans == [(g.first, g.last) for g in checked.skipped or ()] == [(4, 6), (12, 13)]
    assert alone.module.code == checked.module.code
    assert alone.module.deep_equals(checked.module)
    assert parse_for_rules("import os\nprint(os.sep)\n") is None


def test_the_uses_of_a_timing_event_are_parsed_wherever_they_are() -> None:
    """`start.record()` holds no token, and a function stands between it and the event: the
    event is rewritten only if every use is, so the uses must be parsed (they once were not,
    and the statement-level path left the file as it was while the whole parse rewrote it)."""
    text = (
        "import torch\n\nstart = torch.cuda.Event(enable_timing=True)\n"
        "end = torch.cuda.Event(enable_timing=True)\n\n\ndef work():\n    return 1\n\n\n"
        "start.record()\nwork()\nend.record()\nprint(start.elapsed_time(end))\n"
    )
    assert "time.perf_counter()" in rewrite_source(text).new_text
    for options in MODES:
        assert_same(text, options)


def test_a_block_with_an_indented_comment_after_it_is_parsed() -> None:
    """libcst gives the indented comment to the block (its footer); a placeholder would hand
    it to the next statement, so the block is not held out."""
    lines = ["import torch\n", "def f():\n", "    pass\n", "    # owned by f\n", "x = 1\n",
             "y = 2\n", "def g():\n", "    pass\n", "z = torch.zeros(1).cuda()\n"]  # fmt: skip
    plan = statements.plan(ast.parse("".join(lines)), lines, ("cuda",), {"torch": "torch"})
    assert plan is not None
    held = [g.stmts[0] for g in plan.held]
    assert [type(s).__name__ for s in held] == ["Assign", "Assign", "FunctionDef"]
    assert held[-1].name == "g"  # type: ignore[attr-defined]


def test_a_held_block_after_the_new_device_line_is_put_back() -> None:
    """The device definition goes before a held-out function, which gets a blank leading
    line: libcst writes that statement again, placeholder and all, while the other held
    statements are copied as written. The fix was once withheld as "moving a statement the
    parser could not read" where the whole-module parse applied it (found by the property
    test above)."""
    text = (
        "import torch\nimport torch.nn as nn\n\npass  # a comment\ndef f_0(a, b=0):\n"
        "    a = 0\n    return a\na = 0\nclass Model0(nn.Module):\n    pass\n"
        "a = torch.zeros(0).cuda()\n"
    )
    assert _held_lines(text) > 0
    result = rewrite_source(text)
    assert not result.withheld
    assert "def f_0(a, b=0):\n    a = 0\n" in result.new_text
    assert "torch.zeros(0).to(device)" in result.new_text
    for options in MODES:
        assert_same(text, options)


def test_a_statement_too_deep_for_libcst_is_only_measured_when_parsed() -> None:
    """A chain of 300 additions is deeper than libcst takes; with nothing to rewrite in the
    function and class holding one, the statement-level path holds them out like any other
    such statement (a deep statement anywhere once sent the whole file down the whole-module
    path), and both paths agree."""
    deep = " + ".join(["1"] * 300)
    text = (
        f"import torch\n\n\ndef f():\n    return {deep}\n\n\nclass A:\n    total = {deep}\n"
        "\n\ndef g():\n    return 2\n\n\nx = torch.zeros(2).cuda()\n"
    )
    assert _held_lines(text) >= 5
    assert "x = torch.zeros(2).to(device)" in rewrite_source(text).new_text
    for options in MODES:
        assert_same(text, options)


def test_the_default_indent_is_kept_when_its_block_is_held_out() -> None:
    text = (
        "import torch\n\n\ndef two():\n  return 2\n\n\ndef four():\n    return 4\n\n\n"
        "if torch.cuda.is_available():\n    x = 1\n"
    )
    assert _held_lines(text) > 0
    for options in MODES:
        assert_same(text, options)


def _torch_sample() -> list[Path]:
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None
    root = Path(spec.origin).parent
    files = sorted(p for p in root.rglob("*.py") if b"cuda" in p.read_bytes())
    return files[::25]  # every 25th: about 40 files from all of torch


@pytest.mark.slow
@pytest.mark.parametrize("path", _torch_sample(), ids=lambda p: p.name)
def test_torch_sources_give_the_same_result(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    for options in MODES[:2]:
        assert_same(text, options)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_corpus_files_give_the_same_result(tmp_path: Path) -> None:
    try:
        cache = harness.prepare()
    except harness.CorpusError as err:
        pytest.fail(f"the corpus could not be prepared: {err}")
    compared = 0
    for pkg in harness.load_manifest():
        with tarfile.open(cache / "sdists" / pkg.sdist) as tar:
            members = sorted(
                (m for m in tar.getmembers() if m.isfile() and m.name.endswith(".py")),
                key=lambda m: m.name,
            )
            for member in members[::7]:
                handle = tar.extractfile(member)
                assert handle is not None
                data = handle.read()
                if b"cuda" not in data:
                    continue
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError:
                    continue
                for options in MODES[:2]:
                    assert_same(text, options)
                compared += 1
    assert compared > 20


FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("**/*.py"))


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_rule_fixtures_give_the_same_result(path: Path) -> None:
    """The fixtures are each rule's edge cases: the statement-level path must not change one
    answer, with the fixture's own options, in `check` and in `rewrite`."""
    from test_rule_fixtures import options_for

    text = path.read_text(encoding="utf-8")
    options = options_for(text)
    for mode in (options, dataclasses.replace(options, fix=False)):
        assert_same(text, mode)


def test_a_module_level_match_statement_is_rewritten() -> None:
    """The safety net walks module-level statements in order; a `match` among them once
    crashed it (`ast.Match` has `cases`)."""
    text = "import torch\n\nmatch 0:\n    case 1:\n        a = 0\n    case _:\n        pass\n"
    text += "a = torch.zeros(0).cuda()\n"
    result = rewrite_source(text)
    assert ".to(device)" in result.new_text
    compile(result.new_text, "m.py", "exec")
    for options in MODES:
        assert_same(text, options)


def _span_cases() -> list[Path]:
    return _torch_sample()[::4] + FIXTURES


@pytest.mark.parametrize("path", _span_cases(), ids=lambda p: p.name)
def test_every_node_placed_from_pythons_tree_is_where_libcst_lays_it_out(path: Path) -> None:
    """`positions.source_span` reads a node's line, column and text from Python's tree; for
    every node of real files (torch's sources, the rules' fixtures) that it places, libcst's
    own layout must give the same line and column, and its `code_for_node` the same text."""
    import types

    import libcst as cst
    from libcst.metadata import MetadataWrapper, PositionProvider

    from gpu2tpu.rewrite.core.positions import source_span

    text = path.read_text(encoding="utf-8")
    module = cst.parse_module(text)
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    layout = wrapper.resolve(PositionProvider)
    parents: dict[int, cst.CSTNode] = {}
    nodes: list[cst.CSTNode] = []
    stack: list[cst.CSTNode] = [module]
    while stack:
        node = stack.pop()
        for child in node.children:
            parents[id(child)] = node
            nodes.append(child)
            stack.append(child)
    ctx = types.SimpleNamespace(module=module, tree=ast.parse(text), parents=parents, source=text)
    placed = 0
    for node in nodes:
        span = source_span(ctx, node)
        if span is None:
            continue
        placed += 1
        pos = layout[node]
        assert (span[0], span[1]) == (pos.start.line, pos.start.column + 1), cst.Module(
            []
        ).code_for_node(node)
        if span[2] is not None:
            assert span[2] == cst.Module([]).code_for_node(node)
    assert placed > 0 or "\r" in text


@pytest.mark.parametrize("path", _torch_sample(), ids=lambda p: p.name)
def test_a_held_definition_binds_as_the_whole_would(path: Path) -> None:
    """The flow facts parse a held class or function only as far as its binding goes
    (decorators, header, `pass`): that must parse, and give the kind, name and bases of the
    whole statement."""
    import libcst as cst

    from gpu2tpu.rewrite.analysis.lines import python_lines
    from gpu2tpu.rewrite.core.source import _binding_header

    text = path.read_text(encoding="utf-8")
    lines = python_lines(text)
    blank = cst.Module([])
    compared = 0
    for group in statements.groups(ast.parse(text)):
        header = _binding_header(group, lines)
        if header is None:
            continue
        short = cst.parse_statement(header)
        whole = cst.parse_statement("".join(lines[group.first - 1 : group.last]))
        assert type(short) is type(whole)
        assert isinstance(short, cst.ClassDef | cst.FunctionDef)
        assert isinstance(whole, cst.ClassDef | cst.FunctionDef)
        assert short.name.value == whole.name.value
        assert [blank.code_for_node(d) for d in short.decorators] == [
            blank.code_for_node(d) for d in whole.decorators
        ]
        if isinstance(short, cst.ClassDef) and isinstance(whole, cst.ClassDef):
            assert [blank.code_for_node(b) for b in short.bases] == [
                blank.code_for_node(b) for b in whole.bases
            ]
        compared += 1
    assert compared or not any(
        isinstance(s, ast.ClassDef | ast.FunctionDef) for s in ast.parse(text).body
    )
