"""`rewrite_source`: CUDA-specific PyTorch text in, device-agnostic text out. Pure: no I/O.

One libcst parse, every selected rule in one traversal over qualified names, one transformer
pass that applies the fixes, one codegen. Text that no rule could touch comes back as the very
same string object, and top-level statements that hold no token of any selected rule are
neither parsed by libcst (a placeholder of the same lines stands in: statements.py) nor
visited; the transformer descends only towards the nodes it fixes (docs/architecture.md
explains the speed budget behind this).
"""

from __future__ import annotations

import ast
import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import ClassVar, cast

import libcst as cst

from ..analysis.edits import merge_guards
from ..analysis.flow_recorder import FlowRecorder
from ..analysis.lines import python_lines
from ..analysis.names import ModuleNames, caller_names
from ..analysis.placement import device_line_after, device_line_blocked, leading_imports_end
from ..analysis.torch_api import has_accelerator
from ..analysis.values import ordinal_argument_lines
from ..rules.base import Rule, RuleContext, hook_methods, rules_for
from . import net, statements
from .model import Finding, Options, Result
from .module_state import Fix, ModuleState, Pending
from .parsing import Prepared, SourceError, parse_module, prepare
from .positions import source_span, statement_position
from .torch_compat import compat_calls
from .verify import Problem

__all__ = [
    "SourceError",
    "one_parse",
    "parse_for_rules",
    "parse_module",
    "prefilter_tokens",
    "rewrite_source",
]


def prefilter_tokens(options: Options) -> tuple[bytes, ...]:
    """Byte strings at least one of which a file must contain for any selected rule to fire."""
    tokens: set[bytes] = set()
    for rule in rules_for(options):
        tokens.update(rule.tokens)
    return tuple(sorted(tokens))


def rewrite_source(
    text: str,
    options: Options | None = None,
    *,
    statement_level: bool = True,
    prefilter: bool = True,
) -> Result:
    """Rewrite one module's text; raise `SourceError` when it does not parse.

    With `options.fix` False (the `check` mode) nothing is transformed: the rules only decide,
    and the result lists what would be fixed. A changed text is verified before it is returned
    (net.py): it compiles, and names nothing undefined and nothing before its binding that the
    original did not; the fixes that break it are withheld and reported (`Result.withheld`).
    Python's parser reads the text before libcst does (parsing.py): what it rejects is a
    `SourceError`, and statements too deep for libcst are kept away from it.

    libcst parses only the top-level statements that hold a token of a selected rule (and the
    module's start-up block), where it can be sure that this changes nothing
    (statements.py); `statement_level=False` parses the whole module, as the property tests
    do to prove that both give the same result.

    `prefilter=False` runs every selected rule over every top-level statement, whether or not
    the text holds one of the rule's `tokens`. Neither switch is a user option: they are the
    reference paths `tests/test_fast_paths.py` compares the fast ones with.
    """
    options = options or Options()
    holds = _token_finder(text) if prefilter else None
    selected = _selected(options, holds)
    if not selected:
        return Result(text, (), (), options.device_name, False)
    shared = _SHARED.get()
    if shared is not None and shared.covers(selected):
        parsed_for = [r for r in shared.rules if holds is None or any(map(holds, r.tokens))]
    else:
        shared, parsed_for = None, selected
    level = statement_level and _statement_level(parsed_for, options)
    key = (text, options.prior_imports, level)
    if shared is not None and key in shared.made:
        prepared, names = shared.made[key]
    else:
        prepared, names = _prepare(text, parsed_for, options, level)
        if shared is not None:
            shared.made[key] = prepared, names
    attempt = functools.partial(
        _run_rules, statement_level=statement_level, prefilter=prefilter, names=names
    )
    first = attempt(prepared, selected, options)
    if not options.fix or (first.text is text and first.problem is None):
        return first.result

    def rerun(withhold: tuple[tuple[str, int, int], ...]) -> net.Attempt:
        return attempt(prepared, selected, dataclasses.replace(options, withhold=withhold))

    known = caller_names(
        options.device_name,
        options.prior_imports,
        options.prior_names,
        first.result.required_imports,
    )
    return net.verified(text, first, rerun, _top_level_spans(prepared), known, prepared.tree)


def parse_for_rules(text: str, options: Options | None = None) -> Prepared | None:
    """What `rewrite_source(text, options)` parses before any rule runs (Python's parse, the
    statement plan and its facts, libcst's parse of the statements it keeps), and nothing
    else; None when no selected rule's token is in the text (nothing is parsed).

    `benchmarks/rewrite_speed.py` times it: the part of `check` that no faster rule can
    remove, so what `check` costs against libcst's own parse and codegen at the least.
    """
    options = options or Options()
    selected = _selected(options, _token_finder(text))
    if not selected:
        return None
    return _prepare(text, selected, options, _statement_level(selected, options))[0]


def _selected(options: Options, holds: Callable[[bytes], bool] | None) -> list[type[Rule]]:
    """The rules of `options` whose tokens the text holds (`holds`; None: every rule)."""
    return [r for r in rules_for(options) if holds is None or any(map(holds, r.tokens))]


def _token_finder(text: str) -> Callable[[bytes], bool]:
    """Whether the text holds a token, each token searched for once: rules share tokens
    (`cuda` is most rules'), and a search per rule read a large file a hundred times."""
    data = text.encode("utf-8", "surrogatepass")
    found: dict[bytes, bool] = {}

    def holds(token: bytes) -> bool:
        known = found.get(token)
        if known is None:
            known = found[token] = token in data
        return known

    return holds


def _prepare(
    text: str, rules: list[type[Rule]], options: Options, statement_level: bool
) -> tuple[Prepared, ModuleNames | None]:
    """The text parsed for `rules`: by statement, keeping those that hold one of their tokens
    (and the module names the plan needed), or whole."""
    tokens = {t.decode("utf-8", "surrogateescape") for r in rules for t in r.tokens}
    follow = {
        t.decode("utf-8", "surrogateescape") for r in rules if r.follows_names for t in r.tokens
    }
    # Tokens that only rules reporting inside loops hold: they count where a loop is.
    others = {t for r in rules if not r.in_loops_only for t in r.tokens}
    in_loops = {
        t.decode("utf-8", "surrogateescape")
        for r in rules
        if r.in_loops_only
        for t in r.tokens
        if t not in others
    }
    planner = None
    names: list[ModuleNames] = []  # made once, for the plan and the rules
    devices = any(r.follows_devices for r in rules)
    if statement_level:

        def planner(tree: ast.Module, lines: list[str]) -> statements.Plan | None:
            names.append(ModuleNames(text, tree, options.prior_imports))
            keep = ordinal_argument_lines(text, names[0]) if devices else frozenset()
            return statements.plan(tree, lines, tokens, names[0].imports, follow, keep, in_loops)

    prepared = prepare(text, tokens, planner)
    return prepared, (names[0] if names else None)


@dataclasses.dataclass
class _SharedParse:
    """The parses made inside one `one_parse` block, by text (and the caller's imports)."""

    rules: frozenset[type[Rule]]
    made: dict[tuple[str, tuple[str, ...], bool], tuple[Prepared, ModuleNames | None]] = (
        dataclasses.field(default_factory=dict)
    )

    def covers(self, selected: list[type[Rule]]) -> bool:
        return self.rules.issuperset(selected)


_SHARED: contextvars.ContextVar[_SharedParse | None] = contextvars.ContextVar(
    "gpu2tpu_shared_parse", default=None
)


@contextlib.contextmanager
def one_parse(rules: Iterable[type[Rule]]) -> Iterator[None]:
    """Within this block, `rewrite_source` parses each text once, for all of `rules`, and
    every run on that text with a selection among them reuses the parse.

    For callers that run the rules over the same text more than once with different
    selections (target-torch: the fixes that may be applied, then the held-back rules
    report-only; `rewrite_notebook` per cell in both). A statement kept for a rule that a run
    did not select is parsed but not visited, and the statement-level path gives the same
    result whichever statements it keeps (the property tests compare it with whole-module
    parses), so each run's result is what it would be alone. A run that selects a rule
    outside `rules` parses for itself.
    """
    token = _SHARED.set(_SharedParse(frozenset(rules)))
    try:
        yield
    finally:
        _SHARED.reset(token)


def _statement_level(selected: list[type[Rule]], options: Options) -> bool:
    """Whether the statement-level parse may be tried: not for rules that see the whole
    module."""
    del options  # the callers' options (a notebook's device, its earlier imports) are facts
    # of the whole text the plan reads from Python's tree, as the rules do
    return not any(rule.whole_module for rule in selected)


def _run_rules(
    prepared: Prepared,
    selected: list[type[Rule]],
    options: Options,
    statement_level: bool,
    prefilter: bool = True,
    names: ModuleNames | None = None,
) -> net.Attempt:
    """One run of the rules over the parsed text, and the text their fixes make (`names`:
    the module's names, made from the original text, when it is the text the rules see)."""
    text = prepared.original
    module = prepared.module
    assert module is not None
    tree, known = (prepared.tree, names) if prepared.text is text else (None, None)
    state = ModuleState(prepared.text, module, tree)
    ctx = RuleContext(prepared.text, options, module, tree, known, state)
    if prepared.skipped is not None:
        state.unparsed = _unparsed(prepared, module)
    if statement_level:
        state.fast_position = statement_position
        state.fast_span = source_span
    state.index_statements()
    _module_imports(module, ctx, state)
    rules: list[Rule] = [rule(ctx) for rule in selected]
    keep = _statements_to_visit(ctx, selected) if prefilter else None
    _Dispatch(ctx, rules, keep).walk(module)
    state.resolve_pending(ctx)
    # `check` writes no device line: only the caller's or the module's own name can come back.
    ctx.decide_device_name(pick_free=options.fix)

    def unchanged(edits: list[Finding], findings: list[Finding]) -> Result:
        """The original text, with what the rules found in it."""
        device = ctx.device_name_or_none()
        return Result(
            text, tuple(edits), tuple(findings), device, device_shadowed=state.device_shadowed
        )

    if not state.fixes or not options.fix:
        _, findings = state.finalize()
        return net.Attempt(text, unchanged([], findings))
    failed: list[tuple[Pending | None, Exception]] = []
    for key, entries in state.fixes.items():
        state.fixes[key] = [(_guarded(fix, pending, failed), pending) for fix, pending in entries]
    try:
        new_module = module.visit(_ApplyFixes(ctx, state))
        new_module = _define_device(new_module, ctx, state)
        code = _spliced(module, new_module, ctx, prepared) if statement_level else None
        if (
            code is not None
            and ctx.source is text
            and not (prepared.holds and prepared.marker in code)
        ):
            new_text, moved = code, 0  # copied from the original: no placeholder to put back
        else:
            new_text, moved = prepared.restore(new_module.code if code is None else code)
    except Exception as err:  # a fix that raises is withheld like one that breaks the text
        edits, findings = state.finalize()
        pending, cause = failed[0] if failed else (None, err)
        culprit = (pending.rule.code, pending.line, pending.col) if pending is not None else None
        problem = Problem("fix-error", 0, detail=f"{type(cause).__name__}: {cause}")
        return net.Attempt(text, unchanged(edits, findings), problem=problem, culprit=culprit)
    if text.endswith("\r") and not new_text.endswith(("\r", "\n")):
        new_text += "\r"  # libcst drops the last newline of a file that ends lines with CR
    edits, findings = state.finalize()
    if moved:
        return net.Attempt(text, unchanged(edits, findings), problem=Problem("held", moved))
    if new_text == text:
        return net.Attempt(text, unchanged([], findings))
    device_keys = frozenset(
        (p.rule.code, p.line, p.col) for p in state.pending if p.fixed and p.uses_device
    )
    result = Result(
        new_text,
        tuple(edits),
        tuple(findings),
        ctx.device_name_or_none(),
        state.device_defined,
        required_imports=tuple(state.required_imports),
        device_shadowed=state.device_shadowed,
    )
    return net.Attempt(new_text, result, device_keys)


def _spliced(
    module: cst.Module, new_module: cst.Module, ctx: RuleContext, prepared: Prepared
) -> str | None:
    """`new_module.code`, with libcst generating only the top-level statements that changed
    or are new: the others are copied from the rules' text (`ctx.source`: the original, or
    with statements too deep for libcst held out). None when the lines each statement owns
    cannot be told from Python's tree (the caller generates it all).

    A held statement's placeholder that libcst writes again (its leading lines changed) is
    put back in place when the others are copied as written: the text then holds a
    placeholder for some held statements and not others, which `Prepared.restore` would
    take for a held statement that a fix moved.

    libcst gives a top-level statement its leading blank and comment lines and whatever
    follows its block up to the next statement's leading lines; Python's tree gives where each
    statement starts, so statement i owns the lines from its start (less its leading lines) to
    the line before statement i + 1's, the last one up to the module's footer.
    """
    if (
        not module.body
        or not module.has_trailing_newline
        or not _same_nodes(new_module.header, module.header)
        or not _same_nodes(new_module.footer, module.footer)
    ):
        return None
    spans = ctx.statement_spans()
    if spans is None:
        return None
    lines = python_lines(ctx.source)
    starts = [
        first - len(stmt.leading_lines) for (first, _), stmt in zip(spans, module.body, strict=True)
    ]
    ends = [*(start - 1 for start in starts[1:]), len(lines) - len(module.footer)]
    if starts[0] - 1 != len(module.header) or any(
        end < last or start < 1 for start, end, (_, last) in zip(starts, ends, spans, strict=True)
    ):
        return None
    index = {id(stmt): i for i, stmt in enumerate(module.body)}
    pieces = ["".join(lines[: starts[0] - 1])]
    for stmt in new_module.body:
        i = index.get(id(stmt))
        if i is None:
            piece = new_module.code_for_node(stmt)
            if ctx.source is prepared.original:
                piece = prepared.restore_within(piece)  # type: ignore[assignment]  # None is tested on the next line
                if piece is None:
                    return None
            pieces.append(piece)
        else:
            pieces.append("".join(lines[starts[i] - 1 : ends[i]]))
    pieces.append("".join(lines[ends[-1] :]))
    return "".join(pieces)


def _same_nodes(a: Sequence[cst.CSTNode], b: Sequence[cst.CSTNode]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def _unparsed(prepared: Prepared, module: cst.Module) -> dict[int, Callable[[], cst.BaseStatement]]:
    """For each placeholder of a statement held out of libcst's parse that binds a name, a
    function that parses the statement as written (`RuleContext.real_statement`)."""
    held = {id(group.stmts[0]) for group in prepared.skipped or ()}
    lines = python_lines(prepared.text)
    found: dict[int, Callable[[], cst.BaseStatement]] = {}
    for group, stmt in zip(statements.groups(prepared.tree), module.body, strict=True):
        if id(group.stmts[0]) not in held:
            continue
        if not any(isinstance(s, statements.BINDING) for s in group.stmts):
            continue  # binds nothing the flow facts record: the placeholder says as much
        code = _binding_header(group, lines) or "".join(lines[group.first - 1 : group.last])
        found[id(stmt)] = functools.cache(functools.partial(cst.parse_statement, code))
    return found


def _binding_header(group: statements.Group, lines: list[str]) -> str | None:
    """A class or function as far as its binding goes: decorators, header, and `pass` for
    its body (the flow facts read a class's bases and a function's name, never the body,
    and a big class costs libcst a parse of thousands of lines). None when the body starts
    on the header's line."""
    stmt = group.stmts[0]
    if not isinstance(stmt, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    first = stmt.body[0]
    start = min([first.lineno, *(d.lineno for d in getattr(first, "decorator_list", ()))])
    indent = lines[first.lineno - 1][: first.col_offset]  # blanks only, so bytes = characters
    if start <= stmt.lineno or indent.strip(" \t") or not indent:
        return None
    return "".join(lines[group.first - 1 : start - 1]) + indent + "pass\n"


def _guarded(
    fix: Fix, pending: Pending | None, failed: list[tuple[Pending | None, Exception]]
) -> Fix:
    """`fix`, recording which fix raised (the transformer's traceback does not say)."""

    def run(node: cst.CSTNode) -> cst.CSTNode:
        try:
            return fix(node)
        except Exception as err:
            failed.append((pending, err))
            raise

    return run


def _top_level_spans(prepared: Prepared) -> list[tuple[int, int]]:
    """First and last line of each top-level statement of the original (decorators included)."""
    spans = []
    for stmt in prepared.tree.body:
        first = min([stmt.lineno, *(d.lineno for d in getattr(stmt, "decorator_list", ()))])
        spans.append((first, stmt.end_lineno or stmt.lineno))
    return spans


def _module_imports(module: cst.Module, ctx: RuleContext, state: ModuleState) -> None:
    """The module-wide facts the rules need before the traversal, from the whole text with
    Python's own parser: imports and scopes (`ctx.names`), and whether a device line may go
    into this module at all (`state.device_line_blocked`)."""
    del module  # the facts come from the text, not from the libcst tree
    _ = ctx.names
    state.device_line_blocked = device_line_blocked(ctx.tree, ctx.source)


def _statements_to_visit(ctx: RuleContext, rules: list[type[Rule]]) -> set[int] | None:
    """Ids of the top-level statements that hold a token of some rule (None: visit all)."""
    assert ctx.module is not None
    if any(r.whole_module for r in rules) or len(ctx.module.body) < 4:
        return None
    raw = {t.decode() for r in rules for t in r.tokens}
    # A name imported from a matching module is a token too: after
    # `from torch.cuda import max_memory_allocated`, its bare calls need visiting.
    raw |= {local for local, full in ctx.imports.items() if any(t in full for t in raw)}
    tokens = tuple(raw)
    codes = ctx.statement_code()
    keep = {
        id(s)
        for s, code in zip(ctx.module.body, codes, strict=True)
        if any(t in code for t in tokens)
    }
    if any(r.follows_devices for r in rules):
        lines = ordinal_argument_lines(ctx.source, ctx.names)
        spans = ctx.statement_spans() if lines else []
        if spans is None:
            return None
        for stmt, (first, last) in zip(ctx.module.body, spans or (), strict=False):
            if any(first <= line <= last for line in lines):
                keep.add(id(stmt))
    return keep


class _Dispatch:
    """Run many rules in one traversal and record each node's parent for the rules to ask.

    It walks the nodes' fields directly: libcst's own `visit` rebuilds every node it passes
    (its source says so: "provide traversal where children are not replaced"), which costs
    more than the parse. Children come parent-first, in the order of the node's fields (for
    nearly every node the order of the text; decorators come after a function's body).
    Whitespace, commas, parentheses and operators are not descended into unless a rule asks.
    """

    _fields: ClassVar[dict[type, tuple[str, ...]]] = {}
    # What a field value's type is to the walk, per set of skipped trivia types (they depend
    # on which types the rules visit): `issubclass` on libcst's abstract classes is slow.
    _kinds: ClassVar[dict[tuple[type, ...], dict[type, int]]] = {}

    def __init__(self, ctx: RuleContext, rules: list[Rule], keep: set[int] | None) -> None:
        self.ctx = ctx
        self.keep = keep
        self.visit_fns: dict[str, list[Callable[[cst.CSTNode], object]]] = {}
        self.leave_fns: dict[str, list[Callable[[cst.CSTNode], object]]] = {}
        visitors: list[object] = list(rules)
        if any(rule.uses_flow for rule in rules):
            visitors.insert(0, FlowRecorder(ctx))  # records before any rule visits a node
        for rule in visitors:
            for attr, node_type in hook_methods(type(rule)):
                table = self.visit_fns if attr.startswith("visit_") else self.leave_fns
                table.setdefault(node_type, []).append(getattr(rule, attr))
        # The rules that decide from the others' findings decide after them (stable order).
        self.leave_fns.get("Module", []).sort(
            key=lambda fn: getattr(getattr(fn, "__self__", None), "decides_last", False)
        )
        wanted = set(self.visit_fns) | set(self.leave_fns)
        self.skip_types = tuple(t for t in _TRIVIA if t.__name__ not in wanted)
        self.kinds = self._kinds.setdefault(self.skip_types, {})
        # Per node type, what the walk does there: its hooks, fields and scope, found once.
        self.plans: dict[type, _TypePlan] = {}

    @classmethod
    def _child_fields(cls, node_type: type) -> tuple[str, ...]:
        found = cls._fields.get(node_type)
        if found is None:
            found = tuple(
                f.name for f in dataclasses.fields(node_type) if not f.name.startswith("whitespace")
            )
            cls._fields[node_type] = found
        return found

    def walk(self, module: cst.Module) -> None:
        self._walk(module, None)

    def _walk(self, node: cst.CSTNode, parent: cst.CSTNode | None) -> None:
        ctx = self.ctx
        if parent is not None:
            ctx.parents[id(node)] = parent
            if self.keep is not None and parent is ctx.module and id(node) not in self.keep:
                return
        node_type = type(node)
        plan = self.plans.get(node_type)
        if plan is None:
            plan = self._plan(node_type)
        visits, leaves, fields, scope = plan
        ctx.visiting = node
        for fn in visits:
            fn(node)
        kinds = self.kinds
        # The scopes the walk is in, for names asked about before their parents are recorded
        # (a rule visiting a call asks about its function): a body enters its function's,
        # class's or lambda's scope, a comprehension is one as a whole.
        if scope == "comp":
            ctx.scope_stack.append((scope, node))
        for field in fields:
            value = getattr(node, field)
            kind = kinds.get(type(value))
            if kind is None:
                kind = self._kind(type(value))
            if kind == _NODE:
                if scope is not None and field == "body" and scope != "comp":
                    ctx.scope_stack.append((scope, node))
                    self._walk(value, node)
                    ctx.scope_stack.pop()
                else:
                    self._walk(value, node)
            elif kind == _SEQUENCE:
                for item in value:
                    item_kind = kinds.get(type(item))
                    if item_kind is None:
                        item_kind = self._kind(type(item))
                    if item_kind == _NODE:
                        self._walk(item, node)
        if scope == "comp":
            ctx.scope_stack.pop()
        for fn in leaves:
            fn(node)

    def _plan(self, node_type: type) -> _TypePlan:
        name = node_type.__name__
        plan = (
            tuple(self.visit_fns.get(name, ())),
            tuple(self.leave_fns.get(name, ())),
            self._child_fields(node_type),
            _SCOPE_KINDS.get(name),
        )
        self.plans[node_type] = plan
        return plan

    def _kind(self, value_type: type) -> int:
        """What a field value of this type is to the walk (cached in `_kinds`)."""
        if issubclass(value_type, cst.CSTNode):
            kind = _SKIP if issubclass(value_type, self.skip_types) else _NODE
        elif value_type in (tuple, list):
            kind = _SEQUENCE
        else:
            kind = _SKIP
        self.kinds[value_type] = kind
        return kind


_SKIP, _NODE, _SEQUENCE = 0, 1, 2
_Hook = Callable[[cst.CSTNode], object]
# A node type's visit hooks, leave hooks, fields to walk, and the scope it opens (if any).
_TypePlan = tuple[tuple[_Hook, ...], tuple[_Hook, ...], tuple[str, ...], str | None]
_SCOPE_KINDS = {
    "FunctionDef": "def",
    "ClassDef": "class",
    "Lambda": "lambda",
    "ListComp": "comp",
    "SetComp": "comp",
    "DictComp": "comp",
    "GeneratorExp": "comp",
}


# Nodes that are layout, not code: never descended into unless a rule visits their type.
_TRIVIA: tuple[type, ...] = (
    cst.SimpleWhitespace,
    cst.ParenthesizedWhitespace,
    cst.TrailingWhitespace,
    cst.EmptyLine,
    cst.Newline,
    cst.Comment,
    cst.Comma,
    cst.Dot,
    cst.LeftParen,
    cst.RightParen,
    cst.LeftSquareBracket,
    cst.RightSquareBracket,
    cst.LeftCurlyBrace,
    cst.RightCurlyBrace,
    cst.Semicolon,
    cst.Colon,
    cst.AssignEqual,
    cst.BaseBinaryOp,
    cst.BaseBooleanOp,
    cst.BaseCompOp,
    cst.BaseUnaryOp,
    cst.BaseAugOp,
)


class _ApplyFixes(cst.CSTTransformer):
    """Apply every registered fix at its node, innermost first, in one pass.

    It also remembers what became of each top-level statement (`new_top`, by its index in the
    original module), so that new statements can be placed relative to the original ones.
    """

    def __init__(self, ctx: RuleContext, state: ModuleState) -> None:
        super().__init__()
        self.ctx = ctx
        self.fixes = state.fixes
        self.blank = cst.Module(body=[])
        self.top = state.statement_index()
        self.new_top: dict[int, object] = state.rewritten_statements
        self.wanted = _fix_paths(ctx, state)
        # A target-torch without `torch.accelerator`: the calls fixes write fall back to CUDA's.
        self.compat = not has_accelerator(ctx.options.target_torch)

    def on_visit(self, node: cst.CSTNode) -> bool:
        # A subtree without a fix is kept as it is: libcst rebuilds every node it passes,
        # which costs more than the parse (its leave still runs, for `new_top`).
        return self.wanted is None or id(node) in self.wanted

    def on_leave(  # type: ignore[override]  # returns what the fixes make, not libcst's narrower union
        self, original_node: cst.CSTNode, updated_node: cst.CSTNode
    ) -> cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel[cst.CSTNode]:
        fixes = self.fixes.get(id(original_node))
        if isinstance(updated_node, cst.IndentedBlock | cst.Module) and updated_node is not (
            original_node
        ):
            # Guards that fixes wrote next to each other become one (edits.merge_guards).
            original = cast("cst.IndentedBlock | cst.Module", original_node)  # same type
            merged = merge_guards(updated_node.body, original.body)
            if merged is not None:
                updated_node = updated_node.with_changes(body=merged)
        if fixes is None:
            node = super().on_leave(original_node, updated_node)
        else:
            node = super().on_leave(original_node, updated_node)
            for fix, pending in fixes:
                # Names the fix spells (torch's) are chosen for where its finding is.
                self.ctx.fix_site = pending.node if pending is not None else original_node
                before = cast(cst.CSTNode, node)
                node = fix(before)  # a fixed node is never removed
                if self.compat:
                    quote = _quote_inside(self.ctx, original_node)
                    node = compat_calls(node, before, self.ctx.torch_name(), quote)
                if pending is not None and isinstance(node, cst.CSTNode):
                    pending.after.append(self.blank.code_for_node(node))
            self.ctx.fix_site = None
        index = self.top.get(id(original_node))
        if index is not None:
            self.new_top[index] = node
        return node


def _quote_inside(ctx: RuleContext, node: cst.CSTNode) -> str:
    """The quote a string written at `node` may use: not that of an f-string around it (before
    Python 3.12 the same quote ends the f-string)."""
    current = ctx.parents.get(id(node))
    while current is not None and not isinstance(current, cst.BaseStatement):
        if isinstance(current, cst.FormattedString):
            return "'" if '"' in current.start else '"'
        current = ctx.parents.get(id(current))
    return '"'


def _fix_paths(ctx: RuleContext, state: ModuleState) -> set[int] | None:
    """Ids of the nodes with a fix and of all their ancestors (the traversal recorded the
    parents); None when a fix sits on a node whose ancestors are unknown (visit all)."""
    module = ctx.module
    wanted = {id(module)}
    parents = ctx.parents
    for key in state.fixes:
        node_id = key
        while node_id not in wanted:
            wanted.add(node_id)
            parent = parents.get(node_id)
            if parent is None:
                return None
            node_id = id(parent)
    return wanted


def _define_device(module: cst.Module, ctx: RuleContext, state: ModuleState) -> cst.Module:
    """Insert `import torch` and the device definition where the module's start-up is done.

    The place comes from the original text (`placement.device_line_after`): after the start-up
    block of imports and environment set-up, after the last import of torch and after the last
    top-level statement that sets a CUDA start-up variable. It is mapped to the rewritten
    module through what became of each original statement. A module whose torch may be None
    (`torch = None` when the import fails) gets a device line that is None there too.
    """
    if not (state.device_defined or state.needs_torch_import):
        return module
    body = list(module.body)
    insert_at = _new_index(module, ctx, state)
    new: list[cst.BaseStatement] = []
    if state.device_defined:
        expr = cst.Module(body=[]).code_for_node(ctx.device_expression())
        torch = ctx.torch_alias
        if torch is not None and torch in ctx.names.optional:
            expr = f"({expr}) if {torch} is not None else None"
        if state.device_lazy:
            # A library module asks when a function needs the device, not at import.
            definition = cst.parse_statement(
                f"def {ctx.device_name()}():\n"
                f"    # asked when first needed, not at import (this module is a library)\n"
                f"    return {expr}\n"
            )
        else:
            definition = cst.parse_statement(f"{ctx.device_name()} = {expr}\n")
        spaced = insert_at or state.needs_torch_import
        blanks = [cst.EmptyLine()] * (2 if state.device_lazy else 1)  # a function: two, as PEP 8
        new.append(definition.with_changes(leading_lines=blanks if spaced else []))
    if state.needs_torch_import:
        new.insert(0, cst.parse_statement("import torch\n"))
    if insert_at < len(body) and insert_at > 0 and state.device_defined:
        nxt = body[insert_at]
        lines = list(nxt.leading_lines)
        blank = 0
        while blank < len(lines) and lines[blank].comment is None:
            blank += 1
        if state.device_lazy and blank < 2:  # after a function: two blank lines, as PEP 8
            lines = [cst.EmptyLine()] * (2 - blank) + lines
        elif not lines:
            lines = [cst.EmptyLine()]
        body[insert_at] = nxt.with_changes(leading_lines=lines)
    elif insert_at == 0 and body and state.device_defined:
        nxt = body[0]
        body[0] = nxt.with_changes(leading_lines=[cst.EmptyLine(), *nxt.leading_lines])
    return module.with_changes(body=[*body[:insert_at], *new, *body[insert_at:]])


def _new_index(module: cst.Module, ctx: RuleContext, state: ModuleState) -> int:
    """Where, in the rewritten module's body, the new statements go."""
    original = ctx.module
    assert original is not None
    tree = ctx.tree
    spans = ctx.statement_spans()
    if tree is None or spans is None:
        return leading_imports_end(module)
    count = device_line_after(tree)
    if count == 0:
        return 0
    last_line = tree.body[count - 1].end_lineno or tree.body[count - 1].lineno
    k = next((i + 1 for i, (_, last) in enumerate(spans) if last >= last_line), len(spans))
    positions = {id(stmt): i for i, stmt in enumerate(module.body)}
    for j in range(k - 1, -1, -1):
        node = state.rewritten_statements.get(j, original.body[j])
        if isinstance(node, cst.FlattenSentinel):
            node = node.nodes[-1] if node.nodes else None
        if not isinstance(node, cst.CSTNode):
            continue  # removed: the statement before it anchors the line
        if id(node) in positions:
            return positions[id(node)] + 1
        # A fix of the module itself (an added import) may have moved its blank lines.
        bare = _without_leading_lines(node)
        for i, stmt in enumerate(module.body):
            if _without_leading_lines(stmt).deep_equals(bare):
                return i + 1
    return 0


def _without_leading_lines(stmt: cst.CSTNode) -> cst.CSTNode:
    if hasattr(stmt, "leading_lines"):
        return stmt.with_changes(leading_lines=[])
    return stmt
