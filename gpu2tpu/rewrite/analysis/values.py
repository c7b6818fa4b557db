"""Where values go, module-wide: CUDA device values into device arguments, CUDA availability
answers into the tests that guard code, and attributes that are set only where CUDA is.

A rule sees one node; whether `"cuda"` there breaks another accelerator depends on where the
value goes. `dev = "cuda"` then `x.to(dev)` ties `x` to CUDA whatever the variable is called,
and so do `loc = f"cuda:{rank}"` then `torch.load(p, map_location=loc)`, a list item
(`net.to(gpu_ids[0])` with `gpu_ids = [0, 1]`), an attribute set in `__init__` and read in
`forward`, a parameter's default, a function's return. Likewise `USE_FLEX = ... and
torch.cuda.is_available()` guards every `if USE_FLEX:` block, wherever it is.

The facts come from Python's own tree of the whole text (C-parsed, already at hand; the
statements libcst did not parse are in it too), in one walk that records, per scope, how each
name is bound, and the device arguments of every call. Scopes follow Python: a function's
parameters and assignments are its own, a class body does not enclose its methods, `global`
reaches the module; `self.x` is the attribute `x` of the class whose method it is in. A use's
sources are found backwards from it through bindings, containers, conditional expressions,
f-strings, `.format`, `str()`, `torch.device(...)` and the returns of the module's own
functions (each followed once: a cycle means "nothing more"). Everything unknown (a call to
another module, an argument of the function) is nothing, so the answers err towards silence
only where the code does not show a value.

Positions are (line, column) as findings give them: 1-based, the column counted in
characters (Python's tree counts bytes).
"""

from __future__ import annotations

import ast
import re
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from .names import ModuleNames

if TYPE_CHECKING:
    from ..rules.base import RuleContext

# `cuda`, `cuda:0`: a device string that names CUDA (literals.CUDA_STRING's pattern).
_CUDA = re.compile(r"^cuda(:\d+)?$")
# `"cuda:%d"`, `"cuda:" + str(i)`: the start of a CUDA device string built by hand.
_CUDA_PREFIX = re.compile(r"^cuda:(?!\d+$)")
# Keywords whose value is a device, in any call.
DEVICE_KEYWORDS = frozenset({"device", "map_location", "output_device"})
# Calls whose first positional argument is a device (qualified names).
DEVICE_FIRST = frozenset(
    {
        "torch.device",
        "torch.Generator",
        "torch.set_default_device",
        "torch.distributed.device_mesh.init_device_mesh",
        "torch.distributed.init_device_mesh",
    }
)
# Calls whose first positional argument (or `device_type=`) is a device type string.
TYPE_FIRST = frozenset(
    {"torch.autocast", "torch.amp.autocast", "torch.amp.GradScaler", "torch.get_device_module"}
)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_TRY_STAR = getattr(ast, "TryStar", ast.Try)
# Expressions that open a scope of their own or bind a name.
_OPENS = (ast.Lambda, ast.NamedExpr, *_COMPREHENSIONS)
# torch's per-device APIs, whose `device` is an index as often as a device.
_INDEXED_APIS = ("torch.cuda.", "torch.accelerator.", "torch.xpu.", "torch.mps.")
# An int bound to a name or listed: `gpu = 0`, `gpu_ids = [0, 1]`, `devices = (0,)`.
_INT_HINT = re.compile(r"(?:=|\[|\(|,)\s*\d+\s*(?:[\n,\])]|$)")


@dataclass(frozen=True)
class DeviceUse:
    """A device argument a CUDA value reaches: where, and what takes it."""

    line: int
    what: str  # "`x.to(...)`", "`map_location=`", ...
    location: bool = False  # `map_location=`: a CPU load wants "cpu", not "cpu:0"


@dataclass
class _Binding:
    how: str  # "assign", "param", "for", "def", "other"
    value: ast.AST | None
    scope: _Scope  # where `value` is evaluated
    path: tuple[int, ...] = ()  # position inside a tuple target: `a, (b, c) = ...`
    # The CUDA tests that must have passed for it to be made (`if torch.cuda...:`), if any.
    guards: tuple[ast.AST, ...] = ()


@dataclass(eq=False)
class _Scope:
    node: ast.AST
    parent: _Scope | None
    kind: str  # "module", "function", "class", "comprehension"
    names: dict[str, list[_Binding]] = field(default_factory=dict)
    globals: set[str] = field(default_factory=set)
    cls: _Scope | None = None  # for a method: its class
    self_name: str | None = None  # for a method: its first parameter
    returns: list[ast.AST] = field(default_factory=list)  # for a function
    # for a class: attribute -> bindings (`self.x = ...` in its methods, `x = ...` in its body)
    attributes: dict[str, list[_Binding]] = field(default_factory=dict)


class ModuleValues:
    """The module's bindings, device arguments and availability tests (from Python's tree)."""

    def __init__(
        self, tree: ast.Module, lines: list[bytes], resolve: Callable[[str], str | None]
    ) -> None:
        self._lines = lines
        self._resolve = resolve  # module-level name -> qualified name (imports)
        self.module = _Scope(tree, None, "module")
        self._sinks: list[tuple[ast.AST, _Scope, DeviceUse]] = []
        self._tests: list[tuple[ast.AST, _Scope, list[ast.stmt] | list[ast.expr], bool]] = []
        self._functions: dict[int, _Scope] = {}  # id(FunctionDef) -> its scope
        self._guards: list[ast.AST] = []  # the CUDA tests the walk is inside
        self._walk_body(tree.body, self.module)
        self._reached: dict[tuple[int, int], list[DeviceUse]] | None = None
        self._memo: dict[tuple[int, bool], frozenset[int]] = {}
        self._nodes: dict[int, ast.AST] = {}
        self._guarded: dict[tuple[int, int], list[int]] | None = None
        self._value_calls: dict[int, frozenset[tuple[int, int]]] = {}  # by id of a bound value

    # -- the walk ------------------------------------------------------------------------

    def _walk_body(self, body: list[ast.stmt], scope: _Scope) -> None:
        depth = len(self._guards)
        for stmt in body:
            self._walk(stmt, scope)
            if isinstance(stmt, ast.If) and _leaves(stmt.body):
                # `if not torch.cuda.is_available() or ...: return`: CUDA is there below
                for part in _disjuncts(stmt.test):
                    negated = _negation(part)
                    found = self._cuda_test(negated, scope) if negated is not None else None
                    if found is not None:
                        self._guards.append(found)
        del self._guards[depth:]

    def _walk(self, node: ast.AST, scope: _Scope) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            self._walk_all(node.decorator_list, scope)
            self._bind(scope, node.name, _Binding("def", node, scope))
            inner = _Scope(node, scope, "function")
            self._functions[id(node)] = inner
            if scope.kind == "class":
                positional = [*node.args.posonlyargs, *node.args.args]
                if positional and not any(_is_static(d) for d in node.decorator_list):
                    inner.cls, inner.self_name = scope, positional[0].arg
            self._walk_arguments(node.args, scope, inner)
            if node.returns is not None:
                self._walk(node.returns, scope)
            self._walk_body(node.body, inner)
            return
        if isinstance(node, ast.Lambda):
            inner = _Scope(node, scope, "function")
            self._walk_arguments(node.args, scope, inner)
            inner.returns.append(node.body)
            self._walk(node.body, inner)
            return
        if isinstance(node, ast.ClassDef):
            self._walk_all([*node.decorator_list, *node.bases, *node.keywords], scope)
            self._bind(scope, node.name, _Binding("def", node, scope))
            self._walk_body(node.body, _Scope(node, scope, "class"))
            return
        if isinstance(node, _COMPREHENSIONS):
            inner = _Scope(node, scope, "comprehension")
            for i, generator in enumerate(node.generators):
                self._walk(generator.iter, scope if i == 0 else inner)
                self._bind_target(generator.target, "for", generator.iter, inner)
                self._walk_all(generator.ifs, inner)
            parts = (node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,)
            self._walk_all(parts, inner)
            return
        if isinstance(node, ast.Assign):
            self._walk(node.value, scope)
            for target in node.targets:
                self._bind_target(target, "assign", node.value, scope)
                self._walk_target(target, scope)
            return
        if isinstance(node, ast.AnnAssign):
            if node.value is not None:
                self._walk(node.value, scope)
                self._bind_target(node.target, "assign", node.value, scope)
            self._walk_target(node.target, scope)
            return
        if isinstance(node, ast.AugAssign):
            self._walk(node.value, scope)
            self._bind_target(node.target, "other", None, scope)
            self._walk_target(node.target, scope)
            return
        if isinstance(node, ast.NamedExpr):
            self._walk(node.value, scope)
            binds: _Scope = scope
            while binds.kind == "comprehension" and binds.parent is not None:
                binds = binds.parent
            self._bind_target(node.target, "assign", node.value, binds)
            return
        if isinstance(node, ast.For | ast.AsyncFor):
            self._walk(node.iter, scope)
            self._bind_target(node.target, "for", node.iter, scope)
            self._walk_target(node.target, scope)
            self._walk_body(node.body, scope)
            self._walk_body(node.orelse, scope)
            return
        if isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                self._walk(item.context_expr, scope)
                if item.optional_vars is not None:
                    self._bind_target(item.optional_vars, "other", None, scope)
            self._walk_body(node.body, scope)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                local = alias.asname or alias.name.split(".")[0]
                if local != "*":
                    self._bind(scope, local, _Binding("other", None, scope))
            return
        if isinstance(node, ast.Global | ast.Nonlocal):
            scope.globals.update(node.names)
            return
        if isinstance(node, ast.ExceptHandler):
            if node.name:
                self._bind(scope, node.name, _Binding("other", None, scope))
            if node.type is not None:
                self._walk(node.type, scope)
            self._walk_body(node.body, scope)
            return
        if isinstance(node, ast.Return):
            if node.value is not None:
                self._walk(node.value, scope)
                function = _function_of(scope)
                if function is not None:
                    function.returns.append(node.value)
            return
        if isinstance(node, ast.If | ast.While):
            self._walk(node.test, scope)
            self._tests.append((node.test, scope, node.body, True))
            if node.orelse:
                self._tests.append((node.test, scope, node.orelse, False))
            cuda = self._cuda_test(node.test, scope)
            if cuda is not None:
                self._guards.append(cuda)
            self._walk_body(node.body, scope)
            if cuda is not None:
                self._guards.pop()
            self._walk_body(node.orelse, scope)
            return
        if isinstance(node, ast.IfExp):
            self._walk(node.test, scope)
            self._tests.append((node.test, scope, [node.body], True))
            self._tests.append((node.test, scope, [node.orelse], False))
            self._walk(node.body, scope)
            self._walk(node.orelse, scope)
            return
        if isinstance(node, ast.expr) and self._plain(node, scope):
            return
        if isinstance(node, ast.Call):
            self._sink(node, scope)
        elif isinstance(node, ast.Match):
            self._walk(node.subject, scope)
            for case in node.cases:
                self._walk_all([case.pattern, *([case.guard] if case.guard else [])], scope)
                self._walk_body(case.body, scope)
            return
        elif isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
            self._bind(scope, node.name, _Binding("other", None, scope))
        elif isinstance(node, ast.MatchMapping) and node.rest:
            self._bind(scope, node.rest, _Binding("other", None, scope))
        if isinstance(node, ast.Try | _TRY_STAR):
            self._walk_body(node.body, scope)
            self._walk_all(node.handlers, scope)
            self._walk_body(node.orelse, scope)
            self._walk_body(node.finalbody, scope)
            return
        for child in ast.iter_child_nodes(node):
            self._walk(child, scope)

    def _plain(self, expr: ast.expr, scope: _Scope) -> bool:
        """Record an expression that opens no scope and binds nothing in one pass (most do:
        `ast.walk` is cheaper than this walk's dispatch); False, recording nothing, when it
        holds a lambda, a comprehension or `:=`."""
        found = list(ast.walk(expr))
        if any(isinstance(n, _OPENS) for n in found):
            return False
        for node in found:
            if isinstance(node, ast.Call):
                self._sink(node, scope)
            elif isinstance(node, ast.IfExp):
                self._tests.append((node.test, scope, [node.body], True))
                self._tests.append((node.test, scope, [node.orelse], False))
        return True

    def _walk_all(self, nodes: object, scope: _Scope) -> None:
        for node in nodes:  # type: ignore[attr-defined]  # a list of Python's nodes
            self._walk(node, scope)

    def _walk_target(self, target: ast.AST, scope: _Scope) -> None:
        """The loads inside an assignment target (`a[i] = ...` reads `a` and `i`)."""
        if isinstance(target, ast.Tuple | ast.List):
            for element in target.elts:
                self._walk_target(element, scope)
        elif isinstance(target, ast.Starred):
            self._walk_target(target.value, scope)
        elif isinstance(target, ast.Attribute | ast.Subscript):
            self._walk(target.value, scope)
            if isinstance(target, ast.Subscript):
                self._walk(target.slice, scope)

    def _walk_arguments(self, args: ast.arguments, outer: _Scope, inner: _Scope) -> None:
        positional = [*args.posonlyargs, *args.args]
        defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults))
        defaults += list(args.defaults)
        pairs = [
            *zip(positional, defaults, strict=True),
            *zip(args.kwonlyargs, args.kw_defaults, strict=True),
        ]
        for arg, default in pairs:
            if default is not None:
                self._walk(default, outer)
            self._bind(inner, arg.arg, _Binding("param", default, outer))
            if arg.annotation is not None:
                self._walk(arg.annotation, outer)
        for star in (args.vararg, args.kwarg):
            if star is not None:
                self._bind(inner, star.arg, _Binding("other", None, outer))

    def _bind(self, scope: _Scope, name: str, binding: _Binding) -> None:
        binding.guards = tuple(self._guards)
        if name in scope.globals:
            scope = self.module
        scope.names.setdefault(name, []).append(binding)

    def _bind_target(
        self,
        target: ast.AST,
        how: str,
        value: ast.AST | None,
        scope: _Scope,
        path: tuple[int, ...] = (),
    ) -> None:
        if isinstance(target, ast.Name):
            self._bind(scope, target.id, _Binding(how, value, scope, path))
        elif isinstance(target, ast.Tuple | ast.List):
            for i, element in enumerate(target.elts):
                if isinstance(element, ast.Starred):
                    self._bind_target(element.value, "other", None, scope)
                else:
                    self._bind_target(element, how, value, scope, (*path, i))
        elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
            owner = self._class_of_self(target.value, scope)
            if owner is not None:
                binding = _Binding(how, value, scope, path, tuple(self._guards))
                owner.attributes.setdefault(target.attr, []).append(binding)
        if isinstance(target, ast.Name) and scope.kind == "class":
            binding = _Binding(how, value, scope, path, tuple(self._guards))
            scope.attributes.setdefault(target.id, []).append(binding)

    def _class_of_self(self, name: ast.Name, scope: _Scope) -> _Scope | None:
        """The class whose instance `name` is: `self` in one of its methods."""
        function = _function_of(scope)
        if function is None or function.self_name != name.id:
            return None
        return function.cls

    # -- device arguments -----------------------------------------------------------------

    def _sink(self, call: ast.Call, scope: _Scope) -> None:
        """Record the device arguments of a call."""
        name = self._qualified(call.func)
        if name is not None and name.startswith(_INDEXED_APIS):
            return  # they take an index, and rules of their own rewrite them
        line = call.lineno
        for kw in call.keywords:
            if kw.arg in DEVICE_KEYWORDS:
                use = DeviceUse(line, f"`{kw.arg}=`", kw.arg == "map_location")
                self._sinks.append((kw.value, scope, use))
            elif kw.arg == "device_type":
                self._sinks.append((kw.value, scope, DeviceUse(line, "`device_type=`")))
        first = call.args[0] if call.args and not isinstance(call.args[0], ast.Starred) else None
        if first is None:
            return
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr in ("to", "cuda") and name is None:
            self._sinks.append((first, scope, DeviceUse(line, f"`.{func.attr}(...)`")))
        elif name in DEVICE_FIRST or name in TYPE_FIRST:
            self._sinks.append((first, scope, DeviceUse(line, f"`{name}(...)`")))

    def _qualified(self, node: ast.AST) -> str | None:
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        head = self._resolve(node.id)
        if head is None:
            return None
        return ".".join([head, *reversed(parts)])

    def device_uses(self, line: int, column: int) -> list[DeviceUse]:
        """The device arguments the CUDA device value written at (line, column) reaches
        (a string, an f-string, a `.format` call, or an int used as a device ordinal)."""
        if self._reached is None:
            self._reached = {}
            for value, scope, use in self._sinks:
                for source in self._sources(value, scope, ints=use.what != "`device_type=`"):
                    node = self._nodes[source]
                    key = (node.lineno, self._column(node))  # type: ignore[attr-defined]  # a node of Python's tree with a position
                    self._reached.setdefault(key, []).append(use)
        return self._reached.get((line, column), [])

    def ordinal_source(self, line: int, column: int) -> tuple[int, bool] | None:
        """For a device argument written at (line, column) that is not a literal itself: the
        line of an int it may be (`gpu_ids[0]` after `gpu_ids = [0, 1]`), a CUDA ordinal,
        and whether it is always such an int (every binding of its name is one)."""
        for value, scope, use in self._sinks:
            if getattr(value, "lineno", None) != line or isinstance(value, ast.Constant):
                continue
            if use.what == "`device_type=`" or self._column(value) != column:
                continue
            for source in self._sources(value, scope, ints=True):
                node = self._nodes[source]
                if isinstance(node, ast.Constant) and type(node.value) is int:
                    return node.lineno, self._always_int(value, scope)
        return None

    def _always_int(self, value: ast.AST, scope: _Scope) -> bool:
        """`gpu` or `gpu_ids[i]` where every binding of the name is an int literal, or a list
        or tuple of them."""
        listed = isinstance(value, ast.Subscript)
        if listed:
            value = value.value  # type: ignore[attr-defined]  # a Subscript, tested above
        if not isinstance(value, ast.Name):
            return False
        bindings = self._lookup(value.id, scope) or []
        for binding in bindings:
            bound = binding.value
            if binding.how != "assign" or binding.path or bound is None:
                return False
            items = bound.elts if listed and isinstance(bound, ast.List | ast.Tuple) else [bound]
            if listed != isinstance(bound, ast.List | ast.Tuple) or not all(
                isinstance(i, ast.Constant) and type(i.value) is int and i.value >= 0 for i in items
            ):
                return False
        return bool(bindings)

    def ordinal_arguments(self) -> frozenset[int]:
        """Lines of the device arguments (not literals) that an int literal reaches."""
        found = set()
        for value, scope, use in self._sinks:
            if isinstance(value, ast.Constant) or use.what == "`device_type=`":
                continue
            if not isinstance(value, ast.Name | ast.Subscript | ast.Attribute):
                continue
            for source in self._sources(value, scope, ints=True):
                node = self._nodes[source]
                if isinstance(node, ast.Constant) and type(node.value) is int:
                    found.add(value.lineno)
                    break
        return frozenset(found)

    def _column(self, node: ast.AST) -> int:
        text = self._lines[node.lineno - 1]  # type: ignore[attr-defined]  # a node of Python's tree with a position
        return len(text[: node.col_offset].decode("utf-8", "surrogatepass")) + 1  # type: ignore[attr-defined]  # a node of Python's tree with a position

    def _sources(
        self, expr: ast.AST, scope: _Scope, *, ints: bool, depth: int = 0
    ) -> frozenset[int]:
        """The CUDA device values `expr` may be (ids of the nodes that write them)."""
        key = (id(expr), ints)
        found = self._memo.get(key)
        if found is not None:
            return found
        if depth > 40:
            return frozenset()
        self._memo[key] = frozenset()  # a cycle through this node adds nothing
        result = self._compute(expr, scope, ints, depth + 1)
        self._memo[key] = result
        return result

    def _source(self, node: ast.AST) -> frozenset[int]:
        self._nodes[id(node)] = node
        return frozenset({id(node)})

    def _compute(self, expr: ast.AST, scope: _Scope, ints: bool, depth: int) -> frozenset[int]:
        def inner(node: ast.AST, *, where: _Scope = scope, numbers: bool = ints) -> frozenset[int]:
            return self._sources(node, where, ints=numbers, depth=depth)

        if isinstance(expr, ast.Constant):
            value = expr.value
            if isinstance(value, str) and (_CUDA.match(value) or _CUDA_PREFIX.match(value)):
                return self._source(expr)
            if ints and type(value) is int and value >= 0:
                return self._source(expr)
            return frozenset()
        if isinstance(expr, ast.JoinedStr):
            first = expr.values[0] if expr.values else None
            if isinstance(first, ast.Constant) and str(first.value).startswith("cuda:"):
                return self._source(expr)
            return _union(
                inner(v.value, numbers=False)
                for v in expr.values
                if isinstance(v, ast.FormattedValue)
            )
        if isinstance(expr, ast.Name):
            return self._name_sources(expr, scope, ints, depth)
        if isinstance(expr, ast.Attribute):
            owner = (
                self._class_of_self(expr.value, scope) if isinstance(expr.value, ast.Name) else None
            )
            if owner is None:
                return frozenset()
            return _union(
                self._binding_sources(b, ints, depth) for b in owner.attributes.get(expr.attr, ())
            )
        if isinstance(expr, ast.Subscript):
            return inner(expr.value)
        if isinstance(expr, ast.List | ast.Tuple | ast.Set):
            return _union(inner(e) for e in expr.elts)
        if isinstance(expr, ast.Dict):
            return _union(inner(v) for v in expr.values if v is not None)
        if isinstance(expr, ast.IfExp):
            return inner(expr.body) | inner(expr.orelse)
        if isinstance(expr, ast.BoolOp):
            return _union(inner(v) for v in expr.values)
        if isinstance(expr, ast.NamedExpr):
            return inner(expr.value)
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add | ast.Mod):
            left = inner(expr.left, numbers=False)
            return left | inner(expr.right, numbers=False) if isinstance(expr.op, ast.Add) else left
        if isinstance(expr, ast.Call):
            return self._call_sources(expr, scope, ints, depth)
        return frozenset()

    def _call_sources(
        self, call: ast.Call, scope: _Scope, ints: bool, depth: int
    ) -> frozenset[int]:
        func = call.func
        args = [a for a in call.args if not isinstance(a, ast.Starred)]
        if isinstance(func, ast.Attribute) and func.attr == "format":
            receiver = func.value
            if isinstance(receiver, ast.Constant) and receiver.value in ("cuda:{}", "cuda:{0}"):
                return self._source(call)
            return _union(self._sources(a, scope, ints=False, depth=depth) for a in args)
        name = self._qualified(func)
        if name == "torch.device" or (isinstance(func, ast.Name) and func.id == "str"):
            return self._sources(args[0], scope, ints=ints, depth=depth) if args else frozenset()
        target: _Scope | None = None
        if isinstance(func, ast.Name):
            found = self._lookup(func.id, scope)
            defs = [b.value for b in found or () if b.how == "def"]
            if len(defs) == 1 and id(defs[0]) in self._functions and len(found or ()) == 1:
                target = self._functions[id(defs[0])]
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            owner = self._class_of_self(func.value, scope)
            bound = owner.attributes.get(func.attr, ()) if owner is not None else ()
            methods = (
                [b.value for b in owner.names.get(func.attr, ()) if b.how == "def"]
                if owner is not None
                else []
            )
            if len(methods) == 1 and not bound and id(methods[0]) in self._functions:
                target = self._functions[id(methods[0])]
        if target is None:
            return frozenset()
        return _union(self._sources(r, target, ints=ints, depth=depth) for r in target.returns)

    def _name_sources(
        self, name: ast.Name, scope: _Scope, ints: bool, depth: int
    ) -> frozenset[int]:
        found = self._lookup(name.id, scope)
        return _union(self._binding_sources(b, ints, depth) for b in found or ())

    def _binding_sources(self, binding: _Binding, ints: bool, depth: int) -> frozenset[int]:
        value = binding.value
        if value is None or binding.how not in ("assign", "param", "for"):
            return frozenset()
        if binding.how == "assign":
            for index in binding.path:
                if isinstance(value, ast.Tuple | ast.List) and 0 <= index < len(value.elts):
                    value = value.elts[index]
                else:
                    break
        return self._sources(value, binding.scope, ints=ints, depth=depth)

    def _lookup(self, name: str, scope: _Scope) -> list[_Binding] | None:
        """The bindings of `name` where a use of it in `scope` reads it."""
        current: _Scope | None = scope
        first = True
        while current is not None:
            if name in current.globals and current is not self.module:
                return self.module.names.get(name)
            if current.kind != "class" or first:
                found = current.names.get(name)
                if found:
                    return found
            first = False
            current = current.parent
        return None

    # -- CUDA tests -----------------------------------------------------------------------

    def _cuda_test(self, test: ast.AST, scope: _Scope) -> ast.AST | None:
        """The part of a test that passes only where CUDA is: `torch.cuda.is_available()`,
        `x.is_cuda`, `device.type == "cuda"`, also in an `and` chain; None if none."""
        for part in _conjuncts(test):
            if (
                isinstance(part, ast.Call)
                and self._qualified(part.func) == "torch.cuda.is_available"
            ):
                return part
            if isinstance(part, ast.Attribute) and part.attr == "is_cuda":
                return part
            if (
                isinstance(part, ast.Compare)
                and len(part.ops) == 1
                and isinstance(part.ops[0], ast.Eq)
                and any(
                    isinstance(o, ast.Constant) and o.value == "cuda"
                    for o in (part.left, *part.comparators)
                )
            ):
                return part
        return None

    def cuda_only_value(
        self,
        name: str,
        line: int,
        attribute: bool = False,
        widened: Callable[[int, int], bool] = lambda line, column: False,
    ) -> int | None:
        """For the name (or, with `attribute`, `self.<name>` in a method) read at `line`:
        the line of a binding made only where a CUDA test passed, when every other binding
        is a placeholder (None, False); else None. On another accelerator such a value is
        missing. A test that this run widens to every accelerator (`widened(line, column)`)
        does not count."""
        function = self._function_at(line)
        if attribute:
            owner = function.cls if function is not None else None
            bindings = owner.attributes.get(name, []) if owner is not None else []
        else:
            bindings = self._lookup(name, function or self.module) or []
        guarded = [
            b
            for b in bindings
            if any(not widened(g.lineno, self._column(g)) for g in b.guards)  # type: ignore[attr-defined]  # a node of Python's tree with a position
        ]
        if not guarded:
            return None
        for binding in bindings:
            if binding not in guarded and not _placeholder(binding.value):
                return None
        return getattr(guarded[0].value, "lineno", None)

    def _function_at(self, line: int) -> _Scope | None:
        """The innermost function whose text holds `line`."""
        found = None
        for function in self._functions.values():
            node = function.node
            if node.lineno <= line <= (node.end_lineno or 0):  # type: ignore[attr-defined]  # a node of Python's tree with a position
                if found is None or node.lineno >= found.node.lineno:  # type: ignore[attr-defined]  # a node of Python's tree with a position
                    found = function
        return found

    # -- availability answers kept in variables -------------------------------------------

    def guarded_by_value(self, line: int, column: int) -> list[list[ast.AST]]:
        """For a test written at (line, column) whose answer is kept in a variable (`use_cuda
        = torch.cuda.is_available()`, `USE_FLEX = ... and torch.cuda.is_available()`,
        `self.use_cuda = ...`): the blocks that tests of that variable guard (an `if`'s body,
        its `else` when the test is negated)."""
        if self._guarded is None:
            self._guarded = self._tests_by_call()
        return [list(self._tests[i][2]) for i in self._guarded.get((line, column), ())]

    def _tests_by_call(self) -> dict[tuple[int, int], list[int]]:
        """(line, column) of each call whose answer a variable keeps -> the tests (indexes
        in `_tests`, in order) that read the variable. Made once: a scan of every test for
        each CUDA test cost their product on a module with many of both (issue 33)."""
        found: dict[tuple[int, int], list[int]] = {}
        for i, (test, scope, _, outcome) in enumerate(self._tests):
            inner = _negation(test)
            parts = _conjuncts(test) if outcome else [inner] if inner is not None else []
            held: set[tuple[int, int]] = set()
            for part in parts:
                held |= self._calls_held(part, scope)
            for key in held:
                found.setdefault(key, []).append(i)
        return found

    def _calls_held(self, expr: ast.AST, scope: _Scope) -> frozenset[tuple[int, int]]:
        """(line, column) of the calls in the values `expr` (a name or `self.x`) is bound
        to."""
        if isinstance(expr, ast.Name):
            bindings = self._lookup(expr.id, scope) or []
        elif isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            owner = self._class_of_self(expr.value, scope)
            bindings = owner.attributes.get(expr.attr, []) if owner is not None else []
        else:
            return frozenset()
        found: set[tuple[int, int]] = set()
        for binding in bindings:
            if binding.how != "assign" or binding.value is None:
                continue
            calls = self._value_calls.get(id(binding.value))
            if calls is None:
                calls = self._value_calls[id(binding.value)] = frozenset(
                    (node.lineno, self._column(node))
                    for node in ast.walk(binding.value)
                    if isinstance(node, ast.Call)
                )
            found |= calls
        return frozenset(found)


def _union(parts: Iterable[frozenset[int]]) -> frozenset[int]:
    out: set[int] = set()
    for part in parts:
        out |= part
    return frozenset(out)


def _function_of(scope: _Scope) -> _Scope | None:
    current: _Scope | None = scope
    while current is not None and current.kind == "comprehension":
        current = current.parent
    return current if current is not None and current.kind == "function" else None


def _is_static(decorator: ast.AST) -> bool:
    return isinstance(decorator, ast.Name) and decorator.id in ("staticmethod", "classmethod")


def _conjuncts(test: ast.AST) -> list[ast.AST]:
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return [part for value in test.values for part in _conjuncts(value)]
    return [test]


def _disjuncts(test: ast.AST) -> list[ast.AST]:
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        return [part for value in test.values for part in _disjuncts(value)]
    return [test]


def _negation(test: ast.AST) -> ast.AST | None:
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return test.operand
    return None


def _leaves(body: list[ast.stmt]) -> bool:
    """Whether a block always leaves its function or loop (ends in return, raise, ...)."""
    return bool(body) and isinstance(body[-1], ast.Return | ast.Raise | ast.Continue | ast.Break)


def _placeholder(value: ast.AST | None) -> bool:
    """`None`, `False`, `0`, `()` ...: a value that stands for "not set up"."""
    if isinstance(value, ast.Constant):
        return not value.value
    return isinstance(value, ast.Tuple | ast.List | ast.Dict) and not getattr(
        value, "elts", getattr(value, "keys", None)
    )


# Keyed by the module's names (analysis/names.py): made once per text, shared by the
# statement plan and the rules of every run over that text.
_CACHE: WeakKeyDictionary[ModuleNames, ModuleValues | None] = WeakKeyDictionary()


def values_of(source: str, names: ModuleNames) -> ModuleValues | None:
    """The value facts of `source` (whose names are `names`), made on first use; None if
    Python cannot read it."""
    if names in _CACHE:
        return _CACHE[names]
    tree = names.tree
    found = None
    if tree is not None:
        lines = source.encode("utf-8", "surrogatepass").splitlines(keepends=True)
        try:
            found = ModuleValues(tree, lines, _resolver(names))
        except RecursionError:
            found = None  # too deep to follow: no value is known
    _CACHE[names] = found
    return found


def _resolver(names: ModuleNames) -> Callable[[str], str | None]:
    """`names.module_binding`, holding `names` weakly: the facts are `_CACHE`'s value for that
    key, and a value that held its key would keep both, and the module's tree, for as long
    as the process runs (every file a worker checks)."""
    ref = weakref.ref(names)

    def resolve(name: str) -> str | None:
        held = ref()
        return held.module_binding(name) if held is not None else None

    return resolve


def module_values(ctx: RuleContext) -> ModuleValues | None:
    """The value facts of the run's text."""
    return values_of(ctx.source, ctx.names)


def ordinal_argument_lines(source: str, names: ModuleNames) -> frozenset[int]:
    """Lines of the device arguments that an int written elsewhere reaches (for the
    statement plan); empty unless the text lists or names an int at all."""
    if not _INT_HINT.search(source):
        return frozenset()
    values = values_of(source, names)
    return values.ordinal_arguments() if values is not None else frozenset()
