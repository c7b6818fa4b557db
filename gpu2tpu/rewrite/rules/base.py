"""The rule framework: a rule is one small class that visits a libcst tree and reports.

Every rule of a run shares one `RuleContext` and runs in one batched pass
(`MetadataWrapper.visit_batched`). A rule never edits the tree itself: it registers a fix, a
function from the *updated* node to its replacement, keyed by the original node. The engine
applies all fixes in one transformer pass, so nested fixes compose (`torch.zeros(2,
device="cuda").cuda()` gets both) and each rule stays a pure decision.

A new rule is a subclass of `Rule` in a module of this package plus a fixture pair under
`tests/fixtures/rules/`; subclasses register themselves.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import ClassVar

import libcst as cst
import libcst.matchers as m
from libcst.metadata import (
    ParentNodeProvider,
    PositionProvider,
    QualifiedName,
    QualifiedNameProvider,
    QualifiedNameSource,
)

from ..model import Finding, Options, Safety, Severity

Fix = Callable[[cst.CSTNode], cst.CSTNode]

# The device definition the codemod writes: checked, because a CUDA build of torch without a
# GPU reports `cuda` from a plain `current_accelerator()` (shared/docs/DESIGN.md).
DEVICE_EXPR = 'torch.accelerator.current_accelerator(check_available=True) or torch.device("cpu")'
DEVICE_NAMES = ("device", "accel_device", "torch_device")

_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z0-9, ]+))?", re.IGNORECASE)

REGISTRY: dict[str, type[Rule]] = {}


@dataclass
class _Pending:
    rule: type[Rule]
    line: int
    col: int
    message: str
    hint: str
    before: str
    fixed: bool
    fixable: bool
    node_id: int | None = None
    after: list[str] = field(default_factory=list)


class RuleContext:
    """State shared by all rules of one `rewrite_source` call."""

    def __init__(self, source: str, options: Options) -> None:
        self.options = options
        self.fixes: dict[int, list[tuple[Fix, _Pending | None]]] = {}
        self.pending: list[_Pending] = []
        self.names_in_use: set[str] = set()
        self.torch_alias: str | None = None  # `import torch [as X]` at module level
        self.adopted_device: tuple[str, int] | None = None  # (name, line) of an idiom variable
        self.adopted_kind: str = "device"  # "device" (torch.device) or "str"
        self.device_use_lines: list[int] = []
        self.needs_torch_import = False
        self._device_name: str | None = None
        self.device_defined = False
        self._noqa = self._noqa_lines(source)
        self.claimed: set[int] = set()

    def claim(self, node: cst.CSTNode) -> None:
        """Mark the nodes under `node` as handled by its fix, so no other rule reports them."""
        stack = list(node.children)
        while stack:
            child = stack.pop()
            self.claimed.add(id(child))
            stack.extend(child.children)

    @staticmethod
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

    def suppressed(self, code: str, line: int) -> bool:
        if line not in self._noqa:
            return False
        codes = self._noqa[line]
        return codes is None or code in codes

    # -- names the fixes refer to ------------------------------------------------------------

    def torch_name(self) -> str:
        if self.torch_alias is None:
            self.needs_torch_import = True
            return "torch"
        return self.torch_alias

    def torch_attr(self, dotted: str) -> cst.BaseExpression:
        """`torch.<dotted>` through the module's own alias for torch."""
        return cst.parse_expression(f"{self.torch_name()}.{dotted}")

    def device_name(self) -> str:
        """The module's device variable; decided once all rules have visited."""
        assert self._device_name is not None, "device name is decided before fixes run"
        return self._device_name

    def device(self) -> cst.Name:
        return cst.Name(self.device_name())

    def device_type(self) -> cst.BaseExpression:
        """An expression for the device *type* string (what autocast and GradScaler want)."""
        if self.device_is_str():
            return self.device()
        return cst.Attribute(value=self.device(), attr=cst.Name("type"))

    def device_is_str(self) -> bool:
        return (
            self.options.device_name is None
            and self.adopted_device is not None
            and self._device_name == self.adopted_device[0]
            and self.adopted_kind == "str"
        )

    def device_expression(self, kind: str = "device") -> cst.BaseExpression:
        """The checked accelerator expression, as a torch.device or as its type string."""
        t = self.torch_name()
        expr = DEVICE_EXPR.replace("torch.", f"{t}.")
        if kind == "str":
            return cst.parse_expression(f"({expr}).type")
        return cst.parse_expression(expr)

    def device_name_or_none(self) -> str | None:
        """The device variable later text (a notebook's next cell) may reuse, if any."""
        if self.options.device_name:
            return self.options.device_name
        if self.device_defined:
            return self._device_name
        if self.adopted_device and self._device_name == self.adopted_device[0]:
            return self._device_name
        return None

    def decide_device_name(self) -> None:
        """Reuse the caller's or the module's idiom variable, else pick a free name."""
        if self.options.device_name:
            self._device_name = self.options.device_name
            return
        first_use = min(self.device_use_lines, default=None)
        if self.adopted_device and (first_use is None or self.adopted_device[1] <= first_use):
            self._device_name = self.adopted_device[0]
            return
        for candidate in (*DEVICE_NAMES, *(f"device_{i}" for i in range(2, 100))):
            if candidate not in self.names_in_use:
                self._device_name = candidate
                self.device_defined = bool(self.device_use_lines) and self.options.define_device
                return
        raise RuntimeError("no free name for the device variable")


class Rule(cst.BatchableCSTVisitor):
    """Base class of every rule; subclasses set the class attributes and visit nodes.

    `tokens` are byte strings of which at least one must occur in a file for the rule to
    possibly fire: the engine's prefilter skips files that contain none of any selected rule.
    """

    METADATA_DEPENDENCIES = (QualifiedNameProvider, PositionProvider, ParentNodeProvider)

    code: ClassVar[str]
    name: ClassVar[str]
    safety: ClassVar[Safety]
    severity: ClassVar[Severity] = Severity.ERROR
    message: ClassVar[str]
    hint: ClassVar[str] = ""
    tokens: ClassVar[tuple[bytes, ...]] = (b"cuda",)
    min_torch: ClassVar[str] = "2.6"

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__:
            if cls.code in REGISTRY and REGISTRY[cls.code] is not cls:
                raise ValueError(f"rule code {cls.code} is used twice")
            REGISTRY[cls.code] = cls

    def __init__(self, ctx: RuleContext) -> None:
        super().__init__()
        self.ctx = ctx

    # -- helpers for subclasses ------------------------------------------------------------

    def qualified_names(self, node: cst.CSTNode) -> set[str]:
        """Imported qualified names of a Name/Attribute/Call (aliases resolved)."""
        target = node.func if isinstance(node, cst.Call) else node
        try:
            names: set[QualifiedName] = self.get_metadata(QualifiedNameProvider, target, set())
        except KeyError:
            return set()
        return {
            q.name
            for q in names
            if q.source is QualifiedNameSource.IMPORT
        }

    def matches_name(self, node: cst.CSTNode, *qualified: str) -> str | None:
        """The first of `qualified` that `node` refers to, if any."""
        names = self.qualified_names(node)
        for q in qualified:
            if q in names:
                return q
        return None

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        try:
            return self.get_metadata(ParentNodeProvider, node)
        except KeyError:
            return None

    def position(self, node: cst.CSTNode) -> tuple[int, int]:
        pos = self.get_metadata(PositionProvider, node)
        return pos.start.line, pos.start.column + 1

    def code_for(self, node: cst.CSTNode) -> str:
        return cst.Module(body=[]).code_for_node(node)

    def uses_device(self, node: cst.CSTNode) -> None:
        """Record that the fix for `node` refers to the module's device variable."""
        self.ctx.device_use_lines.append(self.position(node)[0])

    def report(
        self,
        node: cst.CSTNode,
        message: str | None = None,
        *,
        fix: Fix | None = None,
        hint: str | None = None,
        uses_device: bool = False,
    ) -> None:
        """Record a finding at `node`; with `fix`, an edit when the options allow it."""
        if id(node) in self.ctx.claimed:
            return
        line, col = self.position(node)
        if self.ctx.suppressed(self.code, line):
            return
        can_fix = fix is not None and self.safety is not Safety.REPORT
        apply = (
            can_fix
            and self.ctx.options.fix
            and (self.safety is Safety.SAFE or self.ctx.options.unsafe_fixes)
        )
        pending = _Pending(
            rule=type(self),
            line=line,
            col=col,
            message=message or self.message,
            hint=hint if hint is not None else self.hint,
            before=self.code_for(node),
            fixed=bool(apply),
            fixable=bool(can_fix),
            node_id=id(node),
        )
        self.ctx.pending.append(pending)
        if apply:
            assert fix is not None
            if uses_device:
                self.ctx.device_use_lines.append(line)
            self.ctx.fixes.setdefault(id(node), []).append((fix, pending))


def finalize(ctx: RuleContext) -> tuple[list[Finding], list[Finding]]:
    """Turn the context's pending reports into edits and findings, in text order."""
    edits: list[Finding] = []
    findings: list[Finding] = []
    for p in sorted(ctx.pending, key=lambda p: (p.line, p.col, p.rule.code)):
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


def rules_for(options: Options) -> list[type[Rule]]:
    """The registered rules that `options` switch on, in code order."""
    _load_rule_modules()
    return [REGISTRY[c] for c in sorted(REGISTRY) if options.enabled(c)]


def all_rules() -> list[type[Rule]]:
    _load_rule_modules()
    return [REGISTRY[c] for c in sorted(REGISTRY)]


def _load_rule_modules() -> None:
    """Import every module of this package once, so that their rules register."""
    import importlib
    import pkgutil

    from .. import rules as package

    for info in pkgutil.iter_modules(package.__path__):
        if info.name != "base" and not info.name.startswith("_"):
            importlib.import_module(f"{package.__name__}.{info.name}")


def iter_string_value(node: cst.CSTNode) -> Iterator[str]:
    """The value of a plain (non-f) string literal node, if it is one."""
    if isinstance(node, cst.SimpleString):
        yield node.evaluated_value if isinstance(node.evaluated_value, str) else ""
    elif isinstance(node, cst.ConcatenatedString):
        value = node.evaluated_value
        if isinstance(value, str):
            yield value


CUDA_STRING = re.compile(r"^cuda(:\d+)?$")


def cuda_literal(node: cst.CSTNode) -> bool:
    """True for `'cuda'`, `'cuda:0'` and f-strings such as `f'cuda:{rank}'`."""
    for value in iter_string_value(node):
        return bool(CUDA_STRING.match(value))
    if isinstance(node, cst.FormattedString):
        parts = node.parts
        return (
            len(parts) == 2
            and isinstance(parts[0], cst.FormattedStringText)
            and parts[0].value == "cuda:"
            and isinstance(parts[1], cst.FormattedStringExpression)
        )
    return False


def is_call_to_attr(node: cst.CSTNode, attr: str) -> bool:
    return m.matches(node, m.Call(func=m.Attribute(attr=m.Name(attr))))
