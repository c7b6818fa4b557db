"""Every fixture pair under tests/fixtures/rules/ is one test.

`<CODE>_<name>.in.py` is rewritten and must equal `<CODE>_<name>.out.py`; the output must
parse and be stable under a second run. An optional `<CODE>_<name>.findings` lists the
expected `line:col CODE` of every edit and finding (lines of the *input*), one per line.
A first line `# gpu2tpu: --unsafe-fixes` (or `--select X`, `--ignore X`, `--target-torch V`)
sets the options.
"""

from __future__ import annotations

import ast
import dataclasses
import shlex
from pathlib import Path

import pytest

from conftest import installed_torch_minor
from gpu2tpu.rewrite.core.model import Options
from gpu2tpu.rewrite.core.source import rewrite_source
from gpu2tpu.rewrite.core.torch_target import rewrite_for_target
from gpu2tpu.rewrite.rules.base import Rule, all_rules

FIXTURES = Path(__file__).parent / "fixtures" / "rules"
CASES = sorted(FIXTURES.glob("*.in.py"))


def options_for(text: str) -> Options:
    first = text.splitlines()[0] if text else ""
    if not first.startswith("# gpu2tpu:"):
        return Options()
    words = shlex.split(first.removeprefix("# gpu2tpu:"))
    select: list[str] = []
    ignore: list[str] = []
    unsafe = False
    target: str | None = None
    it = iter(words)
    for w in it:
        if w == "--unsafe-fixes":
            unsafe = True
        elif w == "--target-torch":
            target = next(it)
        elif w == "--select":
            select += next(it).split(",")
        elif w == "--ignore":
            ignore += next(it).split(",")
    return Options(
        select=tuple(select), ignore=tuple(ignore), unsafe_fixes=unsafe, target_torch=target
    )


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name.removesuffix(".in.py"))
def test_fixture(case: Path) -> None:
    text = case.read_text()
    options = options_for(text)
    result = rewrite_source(text, options)
    out = case.with_name(case.name.replace(".in.py", ".out.py"))
    expected = out.read_text() if out.exists() else text
    assert result.new_text == expected
    ast.parse(result.new_text)
    again = rewrite_source(result.new_text, options)
    assert again.new_text == result.new_text, "a second run changed the output"
    assert not again.edits
    expected_findings = case.with_name(case.name.replace(".in.py", ".findings"))
    if expected_findings.exists():
        want = [ln.strip() for ln in expected_findings.read_text().splitlines() if ln.strip()]
        got = [f"{f.line}:{f.col} {f.code}" for f in result.all]
        assert got == want


def test_every_rule_has_a_fixture_and_docs() -> None:
    codes_with_fixture = {p.name.split("_")[0] for p in CASES}
    for rule in all_rules():
        # the notebook checks (no Python to visit) are tested in test_notebook_rewrite.py
        if issubclass(rule, Rule):
            assert rule.code in codes_with_fixture, f"{rule.code} has no fixture"
            assert rule.message, f"{rule.code} has no message"
        doc = rule.__doc__ or ""
        assert "Why:" in doc and "Example:" in doc, f"{rule.code} docs lack Why/Example"
        assert rule.name


def test_fixtures_import_nothing_from_gpu2tpu() -> None:
    for out in FIXTURES.glob("*.out.py"):
        assert "gpu2tpu" not in out.read_text().replace("# gpu2tpu:", ""), out.name


def test_rule_modules_import_only_the_analysis_layer_and_the_base() -> None:
    """A rule module asks the analysis layer and the rule base, never another rule family."""
    import gpu2tpu.rewrite.rules as package

    allowed = {"base", "..analysis", "..core.model"}
    for path in sorted(Path(package.__path__[0]).glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                target = "." * node.level + (node.module or "")
                if node.level == 1 and (node.module or "") == "base":
                    continue
                module = node.module or ""
                if node.level == 2 and (
                    module.split(".")[0] == "analysis" or module == "core.model"
                ):
                    continue
                if path.name == "base.py" and target == "..":
                    continue  # the registry loads the rule modules by package
                if path.name == "base.py" and target == "..core.cst_internals":
                    continue  # the framework places findings with libcst's layout
                if path.name == "base.py" and target == "..core.module_state":
                    continue  # the engine's state the rule context holds for it
                raise AssertionError(f"{path.name} imports {target}: only {sorted(allowed)}")


# Namespaces whose calls the rewrite emits; each call in a fixture's output must bind to the
# installed torch's real signature (positional-only devices, keyword-only device types).
EMITTED = ("torch.accelerator.", "torch.amp.", "torch.distributed.", "torch.profiler.",
           "torch.nn.attention.", "torch.get_device_module", "torch.set_float32_matmul_precision",
           "torch.device", "torch.manual_seed", "torch.seed", "torch.get_rng_state",
           "torch.set_rng_state")  # fmt: skip


def _torch_calls(tree: ast.Module) -> list[tuple[str, ast.Call]]:
    """(qualified name, call) for calls to torch names, through the file's imports."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    aliases[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        parts: list[str] = []
        func = node.func
        while isinstance(func, ast.Attribute):
            parts.append(func.attr)
            func = func.value
        if not isinstance(func, ast.Name) or func.id not in aliases:
            continue
        name = ".".join([aliases[func.id], *reversed(parts)])
        if name.startswith(EMITTED):
            found.append((name, node))
    return found


def _resolve(name: str) -> object | None:
    import importlib

    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def _older(a: str, b: str) -> str:
    return min(a, b, key=lambda v: tuple(int(p) for p in v.split(".")))


def _check_calls_bind(name_of: str, text: str) -> int:
    """Bind each torch call `text` emits to the installed torch's signature; how many."""
    import inspect

    checked = 0
    tree = ast.parse(text)
    for name, call in _torch_calls(tree):
        target = _resolve(name)
        assert target is not None, f"{name_of}:{call.lineno}: {name} does not exist"
        try:
            signature = inspect.signature(target)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue  # a C function without a signature (torch.device, manual_seed)
        if any(isinstance(a, ast.Starred) for a in call.args) or any(
            k.arg is None for k in call.keywords
        ):
            continue
        args = [object()] * len(call.args)
        kwargs = {k.arg: object() for k in call.keywords if k.arg}
        try:
            signature.bind(*args, **kwargs)
        except TypeError as err:
            raise AssertionError(f"{name_of}:{call.lineno}: {name}{signature}: {err}") from None
        checked += 1
    return checked


@pytest.mark.torch_matrix
def test_every_call_emitted_for_the_installed_torch_binds() -> None:
    """Each fixture rewritten with target-torch set to the installed torch (its own target if
    older): every torch call it writes exists in this torch and binds to its signature.
    `make test-all` runs it on each torch minor the rules write for (2.6, 2.9, 2.12, newest)."""
    installed = installed_torch_minor()
    checked = 0
    for case in CASES:
        text = case.read_text()
        options = options_for(text)
        target = _older(options.target_torch or installed, installed)
        targeted = dataclasses.replace(options, target_torch=target)
        result = rewrite_for_target(rewrite_source, text, targeted)  # as the CLI does
        checked += _check_calls_bind(f"{case.name} (target-torch {target})", result.new_text)
    assert checked >= 40, checked  # the fixtures emit many such calls: the test sees them


def test_every_emitted_call_binds_to_the_installed_torchs_signature() -> None:
    checked = sum(_check_calls_bind(out.name, out.read_text()) for out in FIXTURES.glob("*.out.py"))
    assert checked >= 40, checked  # the fixtures emit many such calls: the test sees them
