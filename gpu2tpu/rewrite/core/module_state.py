"""What the engine keeps about one run of the rules over one text, apart from the rules' API.

`source.py` makes one `ModuleState` per run and hands it to the `RuleContext` the rules see;
the context keeps it private. Rules add to it only through the context's methods (`report`,
`add_fix`, `claim`, `adopt_device`, `require_import`, ...) and never read its bookkeeping:
the statement spans and first lines, the placeholders of statements libcst was not given, the
laid-out positions, the reports and fixes in the engine's own shape, the device decision's
outcome. So what a rule may touch is the context's
public methods, and what the engine may change without a rule noticing is here.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper

from ..analysis.lines import python_lines
from .model import Finding, Options

if TYPE_CHECKING:
    from ..rules.base import Rule, RuleContext

Fix = Callable[[cst.CSTNode], cst.CSTNode]

_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z0-9, ]+))?", re.IGNORECASE)


def _compound_types() -> tuple[type, ...]:
    kinds = ("If", "For", "AsyncFor", "While", "With", "AsyncWith", "Try", "TryStar",
             "FunctionDef", "AsyncFunctionDef", "ClassDef", "Match")  # fmt: skip
    return tuple(getattr(ast, n) for n in kinds if hasattr(ast, n))


_COMPOUND = _compound_types()


@dataclass
class Pending:
    """A finding or edit as the rules reported it, before it is placed (`resolve_pending`)
    and becomes a `Finding`."""

    rule: type[Rule]
    node: cst.CSTNode
    message: str
    hint: str
    before: str
    fixed: bool
    fixable: bool
    uses_device: bool = False
    line: int = 0
    col: int = 0
    after: list[str] = field(default_factory=list)
    # Whether the rewrite applies the fix: `fixed` when it fixes, and in `check`, which
    # fixes nothing, what `rewrite` with the same options would do. The rules decide on it,
    # so that `check` says exactly what `rewrite` leaves.
    applies: bool = False

    def settled(self, options: Options) -> bool:
        """Whether the rewrite takes care of it: fixed, or (in `check`, which fixes nothing)
        fixed by `rewrite` under these options."""
        return self.applies


class ModuleState:
    """The engine's state for one run: reports and fixes, and where the text's statements are.

    `source` is the text the rules see and `module` its libcst tree (None for a context made
    only to answer questions about a text, as tests do); `tree` is Python's own tree of it
    when the caller has made one already.
    """

    def __init__(
        self, source: str, module: cst.Module | None, tree: ast.Module | None = None
    ) -> None:
        self.source = source
        self.module = module
        self._tree: ast.Module | None | Literal[False] = tree
        # Top-level statements libcst did not parse (nothing in them is rewritten; see
        # rewrite/core/statements.py): id of the placeholder in `module.body` -> a function that
        # parses the real statement on demand (for module-wide facts such as bindings).
        self.unparsed: dict[int, Callable[[], cst.BaseStatement]] = {}
        # A faster way to place a node, tried first by `RuleContext.position`
        # (rewrite/core/positions.py: lay out the innermost statement only); None from it, or no
        # function: the layout of the top-level statement.
        self.fast_position: Callable[[RuleContext, cst.CSTNode], tuple[int, int] | None] | None
        self.fast_position = None
        # (line, column, text) of a node from Python's tree (positions.source_span), or None
        self.fast_span: (
            Callable[[RuleContext, cst.CSTNode], tuple[int, int, str | None] | None] | None
        )
        self.fast_span = None
        self.node_spans: dict[int, tuple[int, int, str | None] | None] = {}
        # Each top-level statement laid out with positions, by its index (`cst_internals`).
        self.positions: dict[int, Mapping[cst.CSTNode, CodeRange]] = {}
        self._wrapper: MetadataWrapper | None = None
        self._stmt_lines: list[int] | None = None
        self._stmt_index: dict[int, int] = {}
        self._stmt_code: list[str] | None = None
        self._spans: list[tuple[int, int]] | bool | None = None
        # What the rules reported, and the fixes by the id of the node they replace.
        self.fixes: dict[int, list[tuple[Fix, Pending | None]]] = {}
        self.pending: list[Pending] = []
        self.claimed: set[int] = set()
        # What each top-level statement became once the fixes ran, by its original index.
        self.rewritten_statements: dict[int, object] = {}
        # The device decision (`RuleContext.decide_device_name`), and what it makes the engine
        # add: the module's own device variable a rule offered, as (name, line), and its kind
        # ("device": a torch.device, "str": its type string); why no device line may go in
        # (None: it may); the variable's name, whether the engine defines it, and whether as a
        # function (a library module); and the imports the fixes need.
        self.adopted_device: tuple[str, int] | None = None
        self.adopted_kind: str = "device"
        self.device_line_blocked: str | None = None
        self.device_name: str | None = None
        self.device_defined = False
        self.device_lazy = False
        # A fix was not applied because the caller's device variable (`Options.device_name`)
        # means something else where it would go: the caller may offer another name.
        self.device_shadowed = False
        self.needs_torch_import = False
        # Import statements the new text needs but may not add (`insert_statements=False`).
        self.required_imports: list[str] = []
        self._noqa = _noqa_lines(source)

    @property
    def tree(self) -> ast.Module | None:
        """The text as Python's own parser sees it (C speed; None if it does not parse)."""
        if self._tree is None:
            try:
                self._tree = ast.parse(self.source)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                self._tree = False
        return self._tree or None

    def lazy_metadata(self, key: type) -> object:
        """Any libcst metadata provider's mapping, computed on first use only."""
        assert self.module is not None
        if self._wrapper is None:
            self._wrapper = MetadataWrapper(self.module, unsafe_skip_copy=True)
        return self._wrapper.resolve(key)

    # -- the top-level statements ---------------------------------------------------------------

    def index_statements(self) -> None:
        assert self.module is not None
        self._stmt_index = {id(stmt): i for i, stmt in enumerate(self.module.body)}

    def statement_index(self) -> dict[int, int]:
        """Original top-level statement id -> its index in the module's body."""
        return self._stmt_index

    def real_statement(self, stmt: cst.BaseStatement) -> cst.BaseStatement:
        """A top-level statement of `module.body` as written (parsed now if libcst was given
        a placeholder for it)."""
        load = self.unparsed.get(id(stmt))
        return stmt if load is None else load()

    def statement_first_lines(self) -> list[int]:
        """The line each top-level statement starts on (its leading comments included)."""
        if self._stmt_lines is None:
            self._stmt_lines = self._statement_first_lines()
        return self._stmt_lines

    def _statement_first_lines(self) -> list[int]:
        assert self.module is not None
        spans = self.statement_spans()
        if spans is not None:
            return [
                first - len(getattr(stmt, "leading_lines", ()))
                for (first, _), stmt in zip(spans, self.module.body, strict=True)
            ]
        lines = []
        line = 1 + len(self.module.header)
        for code in self.statement_code():
            lines.append(line)
            line += code.count("\n")
        return lines

    def statement_spans(self) -> list[tuple[int, int]] | None:
        """(first, last) line of each top-level statement, from Python's own parser (fast, in
        C), grouped like libcst's (`a = 1; b = 2` is one statement); None if they differ."""
        if self._spans is False:
            return None
        if self._spans is None:
            assert self.module is not None
            tree = self.tree
            if tree is None:
                self._spans = False
                return None
            body = tree.body
            spans: list[tuple[int, int]] = []
            previous_end = -1
            for stmt in body:
                first = min([stmt.lineno, *(d.lineno for d in getattr(stmt, "decorator_list", ()))])
                last = stmt.end_lineno or stmt.lineno
                if spans and first == previous_end and not isinstance(stmt, _COMPOUND):
                    spans[-1] = (spans[-1][0], last)  # `a = 1; b = 2`: one libcst statement
                else:
                    spans.append((first, last))
                previous_end = last
            if len(spans) != len(self.module.body):
                self._spans = False
                return None
            self._spans = spans
        return self._spans  # type: ignore[return-value]  # a list here: False and None returned above

    def statement_code(self) -> list[str]:
        """The text of each top-level statement (computed once; from the source's lines when
        Python's parser agrees with libcst's statements, else by libcst's codegen)."""
        assert self.module is not None
        if self._stmt_code is None:
            spans = self.statement_spans()
            if spans is not None:
                lines = python_lines(self.source)  # Python's line ends only, not \f or \x85
                self._stmt_code = ["".join(lines[a - 1 : b]) for a, b in spans]
            else:
                self._stmt_code = [self.module.code_for_node(s) for s in self.module.body]
        return self._stmt_code

    # -- reports and fixes ------------------------------------------------------------------

    def suppressed(self, code: str, line: int) -> bool:
        """Whether a `# noqa` (for every code, or naming `code`) is on `line`."""
        if line not in self._noqa:
            return False
        codes = self._noqa[line]
        return codes is None or code in codes

    def resolve_pending(self, ctx: RuleContext) -> None:
        """After the traversal: place every report, drop those silenced by `# noqa`."""
        kept: list[Pending] = []
        dropped: set[int] = set()
        for p in self.pending:
            p.line, p.col = ctx.position(p.node)
            p.before = ctx.source_of(p.node)
            if self.suppressed(p.rule.code, p.line):
                dropped.add(id(p))
                continue
            kept.append(p)
        self.pending = kept
        if dropped:
            for key in list(self.fixes):
                fixes = [f for f in self.fixes[key] if f[1] is None or id(f[1]) not in dropped]
                if fixes:
                    self.fixes[key] = fixes
                else:
                    del self.fixes[key]

    def finalize(self) -> tuple[list[Finding], list[Finding]]:
        """Turn the pending reports into edits and findings, in text order."""
        edits: list[Finding] = []
        findings: list[Finding] = []
        for p in sorted(self.pending, key=lambda p: (p.line, p.col, p.rule.code)):
            rec = Finding(
                code=p.rule.code,
                name=p.rule.name,
                line=p.line,
                col=p.col,
                message=p.message,
                hint=p.hint,
                safety=p.rule.safety,
                severity=p.rule.severity,
                fixed=p.fixed,
                fixable=p.fixable,
                before=p.before,
                after=p.after[-1] if p.after else "",
            )
            (edits if p.fixed else findings).append(rec)
        return edits, findings


def _noqa_lines(source: str) -> dict[int, frozenset[str] | None]:
    found: dict[int, frozenset[str] | None] = {}
    if "noqa" not in source:
        return found
    for i, text in enumerate(source.splitlines(), 1):
        hit = _NOQA.search(text)
        if hit:
            codes = hit.group("codes")
            found[i] = frozenset(c.strip() for c in codes.split(",")) if codes else None
    return found
