"""Which name a default gives its value to.

A `"cuda"` default that the rewrite makes the device's type (`def __init__(self,
accelerator="cuda")`, `parser.add_argument("--device", default="cuda")`) changes what the
code's own tests of that name read: `if accelerator == "cuda":` is then False on a TPU, where
it was True. The rules that look at such tests ask here which names a default feeds, by the
name the code reads it under (`accelerator`, `args.device`, `self.device`, `cfg["device"]`).
"""

from __future__ import annotations

import ast
import bisect
from collections.abc import Iterable
from typing import TYPE_CHECKING

import libcst as cst

from .literals import last_segment, string_value

if TYPE_CHECKING:
    from ..rules.base import RuleContext


def option_name(call: cst.Call) -> str | None:
    """`--device` for `add_argument("-d", "--device", ...)`, or its `dest=`/`name=`."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value in ("dest", "name"):
            return string_value(arg.value)
    options = [string_value(a.value) for a in call.args if a.keyword is None]
    named = [o for o in options if o]
    return max(named, key=len) if named else None


def fed_names(ctx: RuleContext, literal: cst.CSTNode) -> set[str]:
    """The names under which code reads the value a default `literal` gives: a parameter's,
    an option's destination (`--local-device` -> `local_device`), an annotated or assigned
    attribute's, a configuration key's, and the variable a fallback (`os.environ.get(k,
    "cuda")`, `cfg.get(k, "cuda")`) is assigned to."""
    parent = ctx.parents.get(id(literal))
    names: set[str] = set()
    if isinstance(parent, cst.Param):
        names.add(parent.name.value)
    elif isinstance(parent, cst.AnnAssign | cst.Assign):
        targets = [parent.target] if isinstance(parent, cst.AnnAssign) else []
        if isinstance(parent, cst.Assign):
            targets = [t.target for t in parent.targets]
        names.update(n for n in (last_segment(t) for t in targets) if n)
    elif isinstance(parent, cst.DictElement):
        key = string_value(parent.key)
        if key:
            names.add(key)
    elif isinstance(parent, cst.Arg):
        call = ctx.parents.get(id(parent))
        if not isinstance(call, cst.Call):
            return names
        if parent.keyword is not None and parent.keyword.value == "default":
            option = option_name(call)
            if option:
                names.add(option.lstrip("-").replace("-", "_"))
            return names
        key = string_value(call.args[0].value) if call.args else None
        if key:
            names.add(key)
        assigned = ctx.parents.get(id(call))
        if isinstance(assigned, cst.Assign):
            names.update(n for n in (last_segment(t.target) for t in assigned.targets) if n)
    return names


def device_type_defaults(tree: ast.Module | None, devices: Iterable[str]) -> dict[str, int]:
    """name -> line for each parameter or option whose default is the device's type as the
    rewrite writes it (`accelerator=device.type`, `default=accelerator_device().type`, for a
    device variable or function named in `devices`): a `"cuda"` default rewritten before, so
    that `check` after `rewrite` reads its tests as `rewrite` did."""
    found: dict[str, int] = {}
    if tree is None:
        return found
    known = frozenset(devices)

    def is_device_type(value: ast.AST | None) -> bool:
        if not (isinstance(value, ast.Attribute) and value.attr == "type"):
            return False
        owner = value.value
        if isinstance(owner, ast.Call) and not owner.args:
            owner = owner.func
        return isinstance(owner, ast.Name) and owner.id in known

    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            args = node.args
            positional = [*args.posonlyargs, *args.args]
            with_default = positional[len(positional) - len(args.defaults) :]
            pairs = list(zip(with_default, args.defaults, strict=True))
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d]
            for arg, value in pairs:
                if is_device_type(value):
                    found.setdefault(arg.arg, value.lineno)
        elif isinstance(node, ast.Call):
            default = next((k.value for k in node.keywords if k.arg == "default"), None)
            if default is None or not is_device_type(default):
                continue
            named = [a.value for a in node.args if isinstance(a, ast.Constant)]
            named += [k.value.value for k in node.keywords if k.arg == "dest"]  # type: ignore[attr-defined]  # a constant's value, checked below
            options = [o for o in named if isinstance(o, str) and o]
            if options:
                name = max(options, key=len).lstrip("-").replace("-", "_")
                found.setdefault(name, node.lineno)
    return found


def scaled_later(ctx: RuleContext, name: str, line: int) -> int | None:
    """The first line after `line`, in the scope that assigns `name` there, where `name` is
    a factor, divisor or modulus (`64 * n_gpu`, `total // world`) outside a test of `name`
    itself (`if n_gpu > 0: rank % n_gpu` has chosen a floor); None if there is none. The
    module's scaling operations are indexed once (`_ScaleIndex`), so a file with many counts
    costs one walk, not one per count."""
    index = ctx.memo.get("defaults.scales")
    if not isinstance(index, _ScaleIndex):
        index = _ScaleIndex(ctx.tree)
        ctx.memo["defaults.scales"] = index
    return index.first_after(name, line)


_NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_SCALING = (ast.Mult, ast.Div, ast.FloorDiv, ast.Mod)


class _ScaleIndex:
    """Per scope (the module, or a function), the lines where each name is a factor, divisor
    or modulus outside a test that reads it, and which scope each line is in (the innermost
    function around it)."""

    def __init__(self, tree: ast.Module | None) -> None:
        self.scope_of_line: dict[int, int] = {}
        self.lines: dict[int, dict[str, list[int]]] = {}
        if tree is None:
            return
        scopes: list[ast.AST] = [tree]
        for node in ast.walk(tree):  # breadth first: an inner function comes after its outer
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                scopes.append(node)
                for at in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                    self.scope_of_line[at] = id(node)
        for scope in scopes:
            self.lines[id(scope)] = self._scaling(scope)

    @staticmethod
    def _scaling(scope: ast.AST) -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        stack: list[tuple[ast.AST, frozenset[str]]] = [
            (child, frozenset()) for child in ast.iter_child_nodes(scope)
        ]
        while stack:
            node, tested = stack.pop()
            if isinstance(node, _NESTED):
                continue  # another scope: its names are its own
            if isinstance(node, ast.If | ast.IfExp | ast.While):
                read = {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)}
                tested = tested | read  # the code tests these first
            stack.extend((child, tested) for child in ast.iter_child_nodes(node))
            if isinstance(node, ast.BinOp) and isinstance(node.op, _SCALING):
                for operand in (node.left, node.right):
                    if isinstance(operand, ast.Name) and operand.id not in tested:
                        found.setdefault(operand.id, []).append(node.lineno)
        for lines in found.values():
            lines.sort()
        return found

    def first_after(self, name: str, line: int) -> int | None:
        scope = self.scope_of_line.get(line)
        by_name = self.lines.get(scope) if scope is not None else None
        if by_name is None:
            by_name = next(iter(self.lines.values()), {})  # the module's
        lines = by_name.get(name, [])
        at = bisect.bisect_right(lines, line)
        return lines[at] if at < len(lines) else None
