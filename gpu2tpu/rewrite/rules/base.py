"""The rule framework: a rule is one small class that visits a libcst tree and reports.

Every rule of a run shares one `RuleContext` and runs in the engine's one traversal
(`source._Dispatch`, which finds each rule's hooks with `hook_methods`). A rule never edits the tree itself: it registers a fix, a
function from the *updated* node to its replacement, keyed by the original node. The engine
applies all fixes in one transformer pass, so nested fixes compose (`torch.zeros(2,
device="cuda").cuda()` gets both) and each rule stays a pure decision.

A new rule is a subclass of `Rule` in a module of this package plus a fixture pair under
`tests/fixtures/rules/`; subclasses register themselves. Rules ask the analysis layer
(`gpu2tpu/rewrite/analysis/`) what the code means; a rule module imports only that layer and
this one, never another rule module.
"""

from __future__ import annotations

import ast
import dis
import functools
import keyword
from collections.abc import Callable
from typing import ClassVar

import libcst as cst
from libcst.metadata import PositionProvider

from ..analysis import names
from ..analysis.branches import in_compat_fallback
from ..analysis.flow import FlowFacts
from ..analysis.literals import code_for, shorten
from ..analysis.names import ModuleNames, enclosing_scopes, variable_names
from ..analysis.placement import runs_as_script
from ..analysis.torch_api import checks_available, float16_tests, has_accelerator
from ..core.cst_internals import layout
from ..core.model import Options, Safety, Severity
from ..core.module_state import Fix as Fix  # the type of the fixes rules build
from ..core.module_state import ModuleState, Pending

# The device definition the codemod writes: checked, because a CUDA build of torch without a
# GPU reports `cuda` from a plain `current_accelerator()` (docs/backends.md).
DEVICE_EXPR = 'torch.accelerator.current_accelerator(check_available=True) or torch.device("cpu")'
# The same answer for a target-torch older than 2.7, which has no `check_available`.
DEVICE_EXPR_2_6 = (
    "torch.accelerator.current_accelerator() if torch.accelerator.is_available() "
    'else torch.device("cpu")'
)
# For a target-torch older than 2.6, which has no `torch.accelerator`: the accelerator where
# torch has the module, else what the classic idiom picks (the same on CUDA, on any torch).
DEVICE_EXPR_COMPAT = (
    'torch.accelerator.current_accelerator() if hasattr(torch, "accelerator") and '
    'torch.accelerator.is_available() else torch.device("cuda" if torch.cuda.is_available() '
    'else "cpu")'
)
DEVICE_NAMES = ("device", "accel_device", "torch_device")


def own_device_kind(code: str, torch: str = "torch") -> str | None:
    """ "device" when `code` is a device expression the codemod writes (any target-torch's
    form), "str" when it is that expression's `.type`; None otherwise. A later run (after a
    pin was raised) reuses such a variable instead of defining another."""
    text = " ".join(code.split())
    for expr in (DEVICE_EXPR, DEVICE_EXPR_2_6, DEVICE_EXPR_COMPAT):
        own = expr.replace("(torch,", f"({torch},").replace("torch.", f"{torch}.")
        if text == own:
            return "device"
        if text == f"({own}).type":
            return "str"
    return None


# The same, as a function a library module defines instead (asked when needed, not at import).
DEVICE_FUNCTIONS = ("accelerator_device", "accel_device", "torch_device")

# Every rule by code: the libcst rules (`Rule`) and the notebook checks (`NotebookRule`).
REGISTRY: dict[str, type[BaseRule]] = {}


class RuleContext:
    """What the rules of one `rewrite_source` call see: the facade over the engine's state.

    It answers the questions rules ask about the tree — qualified names and scopes, parents,
    positions, flow facts — cheaply and lazily: libcst's metadata providers each cost
    several times a parse, and most nodes are never asked about (docs/architecture.md). It
    builds the names fixes write (`torch_attr`, `device`, ...) and takes what rules report
    (`Rule.report`, `add_fix`, `claim`, ...). The engine's bookkeeping behind it is a
    `ModuleState` (rewrite/core/module_state.py) that `source.py` makes and the context keeps
    private; rules use only the public attributes and methods (tests/test_rule_api.py).
    """

    def __init__(
        self,
        source: str,
        options: Options,
        module: cst.Module | None = None,
        tree: ast.Module | None = None,
        module_names: ModuleNames | None = None,
        state: ModuleState | None = None,
    ) -> None:
        self.options = options
        self.source = source
        self.module = module
        # The engine's bookkeeping (source.py makes it; rewrite/core/module_state.py): reports,
        # fixes, statement spans, placeholders, positions. Rules reach it only through the
        # methods below.
        self._state = state if state is not None else ModuleState(source, module, tree)
        self._module_names: ModuleNames | None = module_names
        self.parents: dict[int, cst.CSTNode] = {}
        self.qualified_cache: dict[int, str | None] = {}
        self.defined_attributes: dict[str, bool] = {}
        # The scopes the engine's traversal is in now, outermost first (analysis/names.py).
        self.scope_stack: list[tuple[str, cst.CSTNode]] = []
        # The node the engine's traversal is visiting now (its parents are recorded).
        self.visiting: cst.CSTNode | None = None
        # The original node whose fix is being applied (set by the engine while fixes run).
        self.fix_site: cst.CSTNode | None = None
        # Per block, the statements a fix removes, as (code, occurrence among equal lines).
        self.removals: dict[int, list[tuple[str, int]]] = {}
        # What an analysis keeps for the rest of the run, under a key of its own (so that a
        # question asked once per finding does not redo work over the whole module).
        self.memo: dict[str, object] = {}
        self._flow: FlowFacts | None = None
        self._float16_tests: tuple[int, ...] | None = None
        self._names: frozenset[str] | None = None

    # -- questions about the tree -------------------------------------------------------------

    @property
    def tree(self) -> ast.Module | None:
        """The text as Python's own parser sees it (C speed; None if it does not parse)."""
        return self._state.tree

    @property
    def names(self) -> ModuleNames:
        """The module's imports and scopes (analysis/names.py), from the whole text."""
        if self._module_names is None:
            self._module_names = ModuleNames(self.source, self.tree, self.options.prior_imports)
        return self._module_names

    @property
    def imports(self) -> dict[str, str]:
        """Every name some import binds (any scope) -> its qualified name: a cheap filter."""
        return self.names.imports

    @property
    def torch_alias(self) -> str | None:
        """The module-level name of torch (`import torch [as X]`, or an earlier cell's)."""
        return self.names.module_torch()

    def binds_in_scopes(self, name: str, node: cst.CSTNode) -> bool:
        """Whether a function, lambda or comprehension around `node` binds `name` itself, so a
        use of `name` there does not reach the module-level variable."""
        scopes = enclosing_scopes(self, node)
        return bool(scopes) and self.names.binds_in_scopes(name, scopes, self)

    def qualified_name(self, node: cst.CSTNode) -> str | None:
        """`torch.cuda.synchronize` for `T.cuda.synchronize` after `import torch as T`."""
        return names.qualified(self, node)

    @property
    def flow(self) -> FlowFacts:
        """Loops, branches and value kinds of this module (analysis/flow.py), made on first use."""
        if self._flow is None:
            self._flow = FlowFacts(self)
        return self._flow

    def float16_tests(self) -> tuple[int, ...]:
        """Lines of the module's comparisons with float16 (analysis/torch_api.py)."""
        if self._float16_tests is None:
            torch_names = {n for n, q in self.names.module_imports.items() if q == "torch"}
            torch_names.add("torch")
            self._float16_tests = float16_tests(self.tree, frozenset(torch_names))
        return self._float16_tests

    def fix_active(self, rule: type[Rule]) -> bool:
        """Whether a rule's fixes are applied under this run's options (cross-rule decisions);
        `check` decides as `rewrite` with its options would."""
        options = self.options
        if not options.enabled(rule.code):
            return False
        return rule.safety is Safety.SAFE or options.unsafe_fixes

    def position(self, node: cst.CSTNode) -> tuple[int, int]:
        """1-based line and column of `node` in the original text.

        Only the top-level statement holding the node is laid out with positions; the lines
        before it come from the code of the statements before it.
        """
        assert self.module is not None
        self.reach(node)
        span = self._span(node)
        if span is not None:
            return span[0], span[1]
        state = self._state
        if state.fast_position is not None:
            found = state.fast_position(self, node)
            if found is not None:
                return found
        top = node
        while True:
            parent = self.parents.get(id(top))
            if parent is None or parent is self.module:
                break
            top = parent
        index = state.statement_index().get(id(top))
        if index is None:
            pos = state.lazy_metadata(PositionProvider)[node]  # type: ignore[index]  # the provider's mapping, typed object by lazy_metadata
            return pos.start.line, pos.start.column + 1
        first_lines = state.statement_first_lines()
        computed = state.positions.get(index)
        if computed is None:
            computed = state.positions[index] = layout(
                top, self.module.default_indent, self.module.default_newline, fast=False
            )
        pos = computed[node]
        return first_lines[index] + pos.start.line - 1, pos.start.column + 1

    def reach(self, node: cst.CSTNode) -> None:
        """Record the parents down to `node` when it is a part of the node being visited that
        the traversal has not reached yet (a rule reporting on a call's argument as it visits
        the call). Every way of placing a node climbs its parents: without them, the only one
        left lays out the whole module (a third of a second on a large file, per run)."""
        visiting = self.visiting
        if visiting is None or visiting is node or id(node) in self.parents:
            return
        if id(visiting) not in self.parents:
            return
        path: list[cst.CSTNode] = [visiting]
        stack = [iter(visiting.children)]
        while stack:
            child = next(stack[-1], None)
            if child is None:
                stack.pop()
                path.pop()
                continue
            if child is node:
                path.append(child)
                for parent, inner in zip(path, path[1:], strict=False):
                    self.parents[id(inner)] = parent
                return
            path.append(child)
            stack.append(iter(child.children))

    def _span(self, node: cst.CSTNode) -> tuple[int, int, str | None] | None:
        state = self._state
        if state.fast_span is None:
            return None
        key = id(node)
        if key not in state.node_spans:
            state.node_spans[key] = state.fast_span(self, node)
        return state.node_spans[key]

    def source_of(self, node: cst.CSTNode) -> str:
        """The node's text as written (libcst's `code_for_node` of the original node)."""
        self.reach(node)
        span = self._span(node)
        return span[2] if span is not None and span[2] is not None else code_for(node)

    def real_statement(self, stmt: cst.BaseStatement) -> cst.BaseStatement:
        """A top-level statement of `module.body` as written (parsed now if libcst was given
        a placeholder for it)."""
        return self._state.real_statement(stmt)

    def statement_spans(self) -> list[tuple[int, int]] | None:
        """(first, last) line of each top-level statement, as libcst groups them; None when
        Python's parser and libcst do not agree on the statements."""
        return self._state.statement_spans()

    def statement_code(self) -> list[str]:
        """The text of each top-level statement, as written."""
        return self._state.statement_code()

    # -- what the rules have said so far: the rules' way to read and add to it ---------------
    #
    # The reports, fixes and claims are the engine's state (`ModuleState`): a rule adds to them
    # through `Rule.report` or these methods, and reads them through `reports`, so that what
    # it may change is in one place.

    def claim(self, node: cst.CSTNode) -> None:
        """Mark the nodes under `node` as handled by its fix, so no other rule reports them."""
        stack = list(node.children)
        while stack:
            child = stack.pop()
            self._state.claimed.add(id(child))
            stack.extend(child.children)

    def claim_node(self, node: cst.CSTNode) -> None:
        """Mark `node` itself as handled, so no other rule reports it."""
        self._state.claimed.add(id(node))

    def is_claimed(self, node: cst.CSTNode) -> bool:
        """Whether a fix has claimed `node` (`claim`, `claim_node`)."""
        return id(node) in self._state.claimed

    def reports(self, start: int = 0) -> list[Pending]:
        """The findings and edits reported so far, in order, from the `start`-th on (a copy:
        `report_count()` before a call and `reports(count)` after give what it reported)."""
        return self._state.pending[start:]

    def last_report(self) -> Pending:
        """The finding or edit reported last (to tie another part of its edit to it)."""
        return self._state.pending[-1]

    def report_count(self) -> int:
        """How many findings and edits have been reported so far."""
        return len(self._state.pending)

    def add_report(self, report: Pending) -> None:
        """Record a finding or edit (`Rule.report` makes it; a rule calls that)."""
        self._state.pending.append(report)

    def add_fix(self, node: cst.CSTNode, fix: Fix, report: Pending | None = None) -> None:
        """Apply `fix` to `node` too: a fix with no finding of its own (an import it needs, a
        line it removes), or, with `report`, one more part of that finding's edit (a `noqa`
        on the finding's line then drops both)."""
        self._state.fixes.setdefault(id(node), []).append((fix, report))

    def move_last_fix(self, node: cst.CSTNode, target: cst.CSTNode | None) -> None:
        """Move the fix just registered at `node` to `target` (None: drop it); its finding
        stays at `node`."""
        fixes = self._state.fixes
        entries = fixes[id(node)]
        entry = entries.pop()
        if not entries:
            del fixes[id(node)]
        if target is not None:
            fixes.setdefault(id(target), []).append(entry)

    def adopt_device(self, name: str, node: cst.CSTNode, kind: str) -> None:
        """Offer the module's own device variable (`name`, bound by `node`; `kind` "device"
        for a torch.device, "str" for its type string) for the fixes to reuse: the first one
        offered is kept."""
        if self._state.adopted_device is None:
            self._state.adopted_device = (name, self.position(node)[0])
            self._state.adopted_kind = kind

    def require_import(self, statement: str) -> None:
        """An import statement the new text needs where the rewrite may add none
        (`Options.insert_statements=False`): the caller runs it (`Result.required_imports`)."""
        self._state.required_imports.append(statement)

    # -- names the fixes refer to ------------------------------------------------------------

    def torch_name(self) -> str:
        """The name for torch where the current fix goes: the module's own, else a local
        `import torch as th` in scope there; `torch`, imported by the rewrite, when there is
        none."""
        site = self.fix_site
        if site is not None and self.torch_alias is None:
            local = self.names.torch_in_scopes(enclosing_scopes(self, site), self)
            if local is not None:
                return local
        if self.torch_alias is None:
            if self.options.insert_statements:
                self._state.needs_torch_import = True
            elif "import torch" not in self._state.required_imports:
                self._state.required_imports.append("import torch")
            return "torch"
        return self.torch_alias

    def device_unavailable(self) -> str | None:
        """Why a fix that needs the module's device variable cannot have one, or None.

        The variable is the caller's (`Options.device_name`), the module's own (an adopted
        idiom variable already seen), or a new device line, which may be impossible.
        """
        if self.options.device_name or self._state.adopted_device is not None:
            return None
        if not self.options.insert_statements:
            return "no device variable is given and no statement may be added here"
        return self._state.device_line_blocked

    def shadowed_at(self, node: cst.CSTNode, uses_device: bool = True) -> str | None:
        """A name a fix at `node` would emit that means something else there (a parameter or
        local variable named like torch's alias or, for a fix that writes the device
        (`uses_device`), the caller's device variable), or None."""
        torch = self.torch_alias or "torch"
        scopes = enclosing_scopes(self, node)
        if not scopes:
            return None
        if self.names.resolve(torch, scopes, self) != "torch":
            if self.torch_alias is not None or self.names.torch_in_scopes(scopes, self) is None:
                return torch
        given = self.options.device_name
        if uses_device and given and self.names.binds_in_scopes(given, scopes, self):
            self._state.device_shadowed = True
            return given
        return None

    def torch_attr(self, dotted: str) -> cst.BaseExpression:
        """`torch.<dotted>` through the module's own alias for torch.

        Built from nodes when every part is a plain name (a call to libcst's parser costs
        about half a millisecond, and a fix may ask for one per call it rewrites); the
        generated text is the same as the parsed one's.
        """
        parts = [self.torch_name(), *dotted.split(".")]
        if not all(part.isidentifier() and not keyword.iskeyword(part) for part in parts):
            return cst.parse_expression(".".join(parts))
        node: cst.BaseExpression = cst.Name(parts[0])
        for part in parts[1:]:
            node = cst.Attribute(value=node, attr=cst.Name(part))
        return node

    def device_name(self) -> str:
        """The module's device variable; decided once all rules have visited."""
        assert self._state.device_name is not None, "device name is decided before fixes run"
        return self._state.device_name

    def device(self) -> cst.BaseExpression:
        """The module's device: its variable, or in a library module a call of its device
        function (`accelerator_device()`, asked when needed, not at import)."""
        if self._state.device_lazy:
            return cst.Call(func=cst.Name(self.device_name()))
        return cst.Name(self.device_name())

    def device_type(self) -> cst.BaseExpression:
        """An expression for the device *type* string (what autocast and GradScaler want)."""
        if self.device_is_str():
            return self.device()
        return cst.Attribute(value=self.device(), attr=cst.Name("type"))

    def device_is_str(self) -> bool:
        return (
            self.options.device_name is None
            and self._state.adopted_device is not None
            and self._state.device_name == self._state.adopted_device[0]
            and self._state.adopted_kind == "str"
        )

    def indexed_device(self, index: str | cst.BaseExpression) -> cst.Call:
        """`torch.device(device.type, <index>)`: the device with that index on the module's
        device type (`cuda:<index>` on CUDA)."""
        value = cst.Integer(index) if isinstance(index, str) else index
        comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        return cst.Call(
            func=self.torch_attr("device"),
            args=[cst.Arg(self.device_type(), comma=comma), cst.Arg(value)],
        )

    def current_device(self, known: bool = False) -> cst.BaseExpression:
        """The module's device; where a branch has just found an accelerator (`known`), the
        accelerator itself, with no CPU fallback."""
        if known:
            return cst.parse_expression(f"{self.torch_name()}.accelerator.current_accelerator()")
        return self.device()

    def device_expression(self, kind: str = "device") -> cst.BaseExpression:
        """The checked accelerator expression, as a torch.device or as its type string."""
        t = self.torch_name()
        target = self.options.target_torch
        if not has_accelerator(target):
            expr = DEVICE_EXPR_COMPAT.replace("(torch,", f"({t},")
        else:
            expr = DEVICE_EXPR if checks_available(target) else DEVICE_EXPR_2_6
        expr = expr.replace("torch.", f"{t}.")
        if kind == "str":
            return cst.parse_expression(f"({expr}).type")
        return cst.parse_expression(expr)

    def name_in_use(self, name: str) -> bool:
        """Whether `name` is taken: a variable anywhere in the text (attributes and keywords
        aside), a name the caller says is bound already or reserved."""
        options = self.options
        if name in options.prior_names or name in options.reserved_names:
            return True
        if name not in self.source:
            return False
        if self.tree is None:
            return True
        if name in self.names.symbols:
            return True  # the cheap answer; only a "no" needs the walk of the whole tree
        if self._names is None:
            self._names = variable_names(self.tree)
        return name in self._names

    def device_name_or_none(self) -> str | None:
        """The device variable later text (a notebook's next cell) may reuse, if any."""
        if self.options.device_name:
            return self.options.device_name
        if self._state.device_defined and not self._state.device_lazy:
            return self._state.device_name
        if self._state.adopted_device and self._state.device_name == self._state.adopted_device[0]:
            return self._state.device_name
        return None

    def decide_device_name(self, pick_free: bool = True) -> None:
        """Reuse the caller's or the module's idiom variable, else pick a free name (with
        `pick_free` False, none: no fix writes it, and the search reads every name)."""
        if self.options.device_name:
            self._state.device_name = self.options.device_name
            return
        use_lines = [p.line for p in self._state.pending if p.applies and p.uses_device]
        first_use = min(use_lines, default=None)
        if (
            self._state.adopted_device
            and (first_use is None or self._state.adopted_device[1] <= first_use)
            and not any(
                self.binds_in_scopes(self._state.adopted_device[0], p.node)
                for p in self._state.pending
                if p.applies and p.uses_device
            )
        ):
            self._state.device_name = self._state.adopted_device[0]
            return
        if not pick_free:
            return
        defined = bool(use_lines) and self.options.define_device and self.options.insert_statements
        self._state.device_lazy = defined and self._lazy_device()
        names = DEVICE_FUNCTIONS if self._state.device_lazy else DEVICE_NAMES
        for candidate in (*names, *(f"{names[0]}_{i}" for i in range(2, 100))):
            if not self.name_in_use(candidate):
                self._state.device_name = candidate
                self._state.device_defined = defined
                return
        raise RuntimeError("no free name for the device variable")

    def _lazy_device(self) -> bool:
        """Whether the module's device is a function instead of a module-level line: in a
        library module (never run, only imported: `placement.runs_as_script`) whose every
        use of the device is inside a function, so nothing asks for the accelerator at
        import."""
        library = self.options.library
        tree = self.tree
        if library is False or tree is None:
            return False
        if library is None and runs_as_script(tree, self.source):
            return False
        return all(
            any(kind in ("def", "lambda") for kind, _ in enclosing_scopes(self, p.node))
            for p in self._state.pending
            if p.applies and p.uses_device
        )


class BaseRule:
    """What every rule declares, whatever it reads: its code, name, safety and documentation.

    Subclasses that set `code` register themselves in `REGISTRY`, which `gpu2tpu rules`,
    docs/rules.md, `--select`/`--ignore` and `noqa` read: a code names one rule. `code`
    (G2Txxx), `name`, `safety`, `severity`, `message` (`{call}` in it becomes the user's
    construct), `hint`, and the docstring with "Why:" and "Example:" that `gpu2tpu rules` and
    docs/rules.md show. `min_torch` is the oldest torch its fix runs on: with
    `--target-torch` older than that, the fix is held back and reported
    (rewrite/core/torch_target.py). `compat_torch`, where set, is the oldest torch the fix
    runs on in the form written for a torch without `torch.accelerator` (the device line's
    `hasattr(torch, "accelerator")` form, each `torch.accelerator` call it writes falling back
    to its `torch.cuda` counterpart: rewrite/core/torch_compat.py); a target between the two
    gets that form. Set it only for a fix that writes nothing else newer than the code had.
    """

    code: ClassVar[str]
    name: ClassVar[str]
    safety: ClassVar[Safety]
    severity: ClassVar[Severity] = Severity.ERROR
    message: ClassVar[str]
    hint: ClassVar[str] = ""
    min_torch: ClassVar[str] = "2.6"
    compat_torch: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__:
            if cls.code in REGISTRY and REGISTRY[cls.code] is not cls:
                raise ValueError(f"rule code {cls.code} is used twice")
            REGISTRY[cls.code] = cls


class NotebookRule(BaseRule):
    """A check on a notebook's IPython syntax (`!nvidia-smi`, `%pip install`) or metadata.

    It reads no Python, so it has no hooks: rewrite/notebooks/notebook.py runs the checks and
    reports under these codes (rules/notebook_checks.py declares them).
    """

    message: ClassVar[str] = ""


class ProjectRule(BaseRule):
    """A check on a project's own files (its torch pin), not on code: rewrite/files/ runs it
    once a run knows what the code needs (rules/project_checks.py declares them)."""

    message: ClassVar[str] = ""


class Rule(BaseRule):
    """A rule on Python text: it visits the libcst tree and reports, with or without a fix.

    It declares what `BaseRule` says, and how the engine may take its shortcuts.

    Speed flags. The engine takes shortcuts that a rule must declare its way out of; each is
    checked by tests/test_fast_paths.py, which runs every fixture and a sample of torch's
    sources with the shortcuts on and off, so a fixture that needs a flag fails without it:

    - `tokens` (default `(b"cuda",)`): byte strings one of which a text must hold for the rule
      to run at all. The engine skips files with none of any selected rule's tokens without
      reading them as Python, and the rule visits only the top-level statements that hold
      one (or a name imported from a module whose name holds one). A rule that fires on
      `float64` or `.item()` lists those; a rule with an empty tuple never runs.
    - `whole_module`: the rule must see top-level statements without its tokens (module-wide
      facts). Turns the statement-level parse and the token filter on statements off for every
      text the rule runs on: it costs speed on every file, so prefer a token.
    - `follows_names`: the rule follows the names its statements bind to every use in their
      scope (an event's `start.record()` holds no token): the statement-level parse keeps each
      top-level statement that names one of them.
    - `follows_devices`: the rule follows device values into device arguments wherever those
      are (analysis/values.py): the statements whose device argument an int written elsewhere
      reaches are parsed and visited, token or not.
    - `in_loops_only`: the rule reports only nodes inside a `for` or `while` loop of their own
      function (the training-loop hazards): the statement-level parse counts the tokens that
      only such rules hold in a top-level statement or a method only when it holds a loop.
    - `uses_flow`: the rule asks `ctx.flow` (loops, bindings, value kinds): the traversal then
      runs the flow recorder before the rules, and flow answers are complete from
      `leave_Module` on.
    - `decides_last`: the rule decides from what the other rules found (a test is widened
      only where all it guards is fixed): its `leave_Module` runs after every other rule's.

    The walk. A rule is a class of this project, not a libcst visitor: the engine walks the
    tree itself (`source._Dispatch`, one traversal for every rule; docs/architecture.md says
    why). Its hooks are found by name (`hook_methods`), and someone who knows libcst's
    visitors should know where the walk differs:

    - it calls `visit_<Node>(node)` on the way down and `leave_<Node>(original_node)` on the
      way up, for `<Node>` a libcst node class (`cst.Call`), for each such method the rule's
      class or a base class of it defines;
    - the value a `visit_` method returns is ignored: children are always visited (libcst
      skips them on False);
    - libcst's attribute hooks (`visit_<Node>_<field>`, `leave_<Node>_<field>`) are never
      called;
    - children come in the order of the node's fields, which is the text's order for nearly
      every node but not all: a function's or class's decorators come after its body;
    - whitespace, commas, parentheses and operators are visited only when some rule of the
      run has a hook for their type; top-level statements without a token are not visited.

    `check_hooks` refuses, when the class is defined, an attribute hook, a hook for no libcst
    node and a `visit_` method that returns a value. A rule reads and adds to what the rules
    found through `RuleContext` (`report`, `add_fix`, `claim`, `reports`), never by writing
    the engine's lists.
    """

    uses_flow: ClassVar[bool] = False
    tokens: ClassVar[tuple[bytes, ...]] = (b"cuda",)
    whole_module: ClassVar[bool] = False
    follows_names: ClassVar[bool] = False
    decides_last: ClassVar[bool] = False
    follows_devices: ClassVar[bool] = False
    in_loops_only: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        check_hooks(cls)  # before it registers: a refused rule leaves no code behind
        super().__init_subclass__(**kwargs)

    def __init__(self, ctx: RuleContext) -> None:
        self.ctx = ctx

    # -- helpers for subclasses ------------------------------------------------------------

    def qualified_names(self, node: cst.CSTNode) -> set[str]:
        """Imported qualified names of a Name/Attribute/Call (aliases resolved)."""
        name = names.qualified(self.ctx, node)
        return {name} if name else set()

    def matches_name(self, node: cst.CSTNode, *qualified: str) -> str | None:
        """The first of `qualified` that `node` refers to, if any."""
        return names.matches(self.ctx, node, *qualified)

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.ctx.parents.get(id(node))

    def position(self, node: cst.CSTNode) -> tuple[int, int]:
        return self.ctx.position(node)

    def code_for(self, node: cst.CSTNode) -> str:
        return code_for(node)

    def short(self, node: cst.CSTNode, limit: int = 40) -> str:
        """`literals.short`, from the text as written where Python's tree places the node."""
        return shorten(self.ctx.source_of(node), limit)

    def report(
        self,
        node: cst.CSTNode,
        message: str | None = None,
        *,
        fix: Fix | None = None,
        hint: str | None = None,
        uses_device: bool = False,
    ) -> bool:
        """Record a finding at `node`; with `fix`, an edit when the options allow it.

        Returns whether the fix will be applied to the text.
        """
        ctx = self.ctx
        if ctx.is_claimed(node):
            return False
        if in_compat_fallback(ctx, node):
            return False  # the fallback for a torch without the new API: left alone
        can_fix = fix is not None and self.safety is not Safety.REPORT
        if can_fix:
            blocked = self._fix_blocked(node, uses_device)
            if blocked:
                can_fix = False
                hint = f"{hint if hint is not None else self.hint}; not fixed: {blocked}"
        # Decided as `rewrite` decides, also in `check` (options.fix False), which only
        # applies nothing: so every rule's later decisions, and what is left, are the same.
        apply = can_fix and (self.safety is Safety.SAFE or self.ctx.options.unsafe_fixes)
        if apply and self.ctx.options.withhold:  # the safety net's rerun (net.py)
            apply = not self.ctx.options.withholds(self.code, self.ctx.position(node)[0])
        message = message or self.message
        if "{call}" in message:  # the rule's message names the user's construct
            message = message.replace("{call}", self.short(node, 50))
        pending = Pending(
            rule=type(self),
            node=node,
            message=message,
            hint=hint if hint is not None else self.hint,
            before="",  # the node's text, read with its position (resolve_pending)
            fixed=bool(apply) and self.ctx.options.fix,
            fixable=bool(can_fix),
            uses_device=uses_device,
            applies=bool(apply),
        )
        ctx.add_report(pending)
        if apply:
            assert fix is not None
            ctx.add_fix(node, fix, pending)
        return bool(apply)

    def _fix_blocked(self, node: cst.CSTNode, uses_device: bool) -> str | None:
        """Why a fix at `node` may not be applied although its rule has one, or None."""
        ctx = self.ctx
        if ctx.torch_alias is None:
            framework = ctx.names.other_framework
            if framework is not None:
                return f"the code uses `{framework}`, not torch: a fix would bring torch in"
        if uses_device:
            reason = ctx.device_unavailable()
            if reason:
                return reason
        shadowed = ctx.shadowed_at(node, uses_device)
        if shadowed:
            return f"`{shadowed}` means something else here"
        return None


_LOAD_CONST = dis.opmap["LOAD_CONST"]
_RETURN_VALUE = dis.opmap["RETURN_VALUE"]
_RETURN_CONST = dis.opmap.get("RETURN_CONST", -1)  # Python 3.12 and 3.13


def check_hooks(rule: type[Rule]) -> None:
    """Refuse, when the class is defined, a hook the engine's walk would never honour
    (`Rule`'s docstring): libcst's attribute hooks (`visit_Call_func`), a name that is no
    libcst node (`visit_Cal`), and a `visit_` method that returns a value, which libcst
    reads as "skip the children" and the walk ignores. A rule that defined one would
    silently never fire, or fire where its author meant it not to."""
    for attr, fn in vars(rule).items():
        prefix, _, node_type = attr.partition("_")
        if prefix not in ("visit", "leave") or not node_type:
            continue
        where = f"{rule.__module__}.{rule.__qualname__}.{attr}"
        head, _, field_name = node_type.partition("_")
        if field_name and isinstance(getattr(cst, head, None), type):
            raise TypeError(
                f"{where}: libcst's attribute hooks are never called by the rules' walk; "
                f"use visit_{head} and look at node.{field_name}"
            )
        if not isinstance(getattr(cst, node_type, None), type):
            raise TypeError(f"{where}: `{node_type}` is not a libcst node, so it never fires")
        if prefix == "visit" and callable(fn) and _returns_a_value(fn):
            raise TypeError(
                f"{where} returns a value: the rules' walk always visits the children (libcst "
                "skips them on False); return None and test the parent where you needed that"
            )


_HOOKS: dict[type, tuple[tuple[str, str], ...]] = {}


def hook_methods(visitor_type: type) -> tuple[tuple[str, str], ...]:
    """The hooks the engine's walk calls on an instance of `visitor_type` (a `Rule`, or the
    flow recorder), as (method name, libcst node class name): every `visit_<Node>` and
    `leave_<Node>` that the class or a base class defines, `<Node>` a libcst node class.
    Computed once per class; the walk looks nothing else up."""
    known = _HOOKS.get(visitor_type)
    if known is not None:
        return known
    found: dict[str, str] = {}
    for klass in visitor_type.__mro__:
        if klass is object:
            continue
        for attr in vars(klass):
            prefix, _, node_type = attr.partition("_")
            if prefix in ("visit", "leave") and node_type and "_" not in node_type:
                if isinstance(getattr(cst, node_type, None), type):
                    found[attr] = node_type
    known = _HOOKS[visitor_type] = tuple(found.items())
    return known


def _returns_a_value(fn: Callable[..., object]) -> bool:
    """Whether `fn` returns something other than None: its annotation says so, or its code
    returns a constant (`return False`). Read from the bytecode, not by `dis`, which costs
    tens of milliseconds for all the rules at every start."""
    returns = getattr(fn, "__annotations__", {}).get("return", "None")
    if returns not in ("None", None):
        return True
    code = getattr(fn, "__code__", None)
    if code is None:
        return False
    raw, consts = code.co_code, code.co_consts
    if len(consts) > 256:  # an argument may then need EXTENDED_ARG: let `dis` read it
        previous = None
        for ins in dis.get_instructions(fn):
            if ins.opname == "RETURN_CONST" and ins.argval is not None:
                return True
            if ins.opname == "RETURN_VALUE" and previous is not None:
                if previous.opname == "LOAD_CONST" and previous.argval is not None:
                    return True
            previous = ins
        return False
    for i in range(0, len(raw), 2):
        op = raw[i]
        if op == _RETURN_CONST and consts[raw[i + 1]] is not None:
            return True
        if (
            op == _RETURN_VALUE
            and i >= 2
            and raw[i - 2] == _LOAD_CONST
            and consts[raw[i - 1]] is not None
        ):
            return True
    return False


def rules_for(options: Options) -> list[type[Rule]]:
    """The registered rules on Python text that `options` switch on, in code order."""
    return [r for r in text_rules() if options.enabled(r.code)]


def text_rules() -> list[type[Rule]]:
    """Every rule on Python text (no notebook check), in code order."""
    return [r for r in all_rules() if issubclass(r, Rule)]


def rule_by_code(code: str) -> type[BaseRule]:
    """The rule registered under `code` (KeyError for none)."""
    _load_rule_modules()
    return REGISTRY[code]


def all_rules() -> list[type[BaseRule]]:
    """Every rule, the notebook checks included, in code order: what the docs list."""
    _load_rule_modules()
    return [REGISTRY[c] for c in sorted(REGISTRY)]


@functools.cache
def _load_rule_modules() -> None:
    """Import every module of this package once, so that their rules register (once per
    process: listing the package's folder for every file cost 6% of a `check`)."""
    import importlib
    import pkgutil

    from .. import rules as package

    for info in pkgutil.iter_modules(package.__path__):
        if info.name != "base" and not info.name.startswith("_"):
            importlib.import_module(f"{package.__name__}.{info.name}")
