"""Names: what a dotted name refers to, through the imports in scope where it is used.

`torch.cuda.synchronize` is spelled `T.cuda.synchronize` after `import torch as T`, `cuda.
synchronize` after `from torch import cuda`, or `sync` after `from torch.cuda import
synchronize as sync`; rules match the qualified name, never the spelling. Names follow
Python's scopes: `def f(): import torch as th` binds `th` in `f` only, a parameter or local
variable named `torch` is not torch, a class body does not enclose its methods, and `global`
reaches the module.

The facts come from the whole text, with Python's own parser and `symtable` (C speed, a few
percent of a libcst parse; libcst's scope provider costs several parses, docs/architecture.md):
`symtable` says which names each function binds and how, and a walk over the statements (never
the expressions) finds the import statements. A libcst node is placed in its scopes by walking
up its parents. Each node's answer is cached on the run's context.
"""

from __future__ import annotations

import ast
import functools
import symtable
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import libcst as cst

from .literals import dotted_name

if TYPE_CHECKING:
    from ..rules.base import RuleContext


def full_name(node: cst.CSTNode) -> str:
    """libcst's dotted name of an import's module or alias (`torch.cuda.amp`)."""
    return cst.helpers.get_full_name_for_node(node) or ""


def import_bindings(node: ast.Import | ast.ImportFrom) -> Iterator[tuple[str, str]]:
    """(local name, qualified name) for each name an import statement binds.

    `import torch.nn` binds `torch` (to `torch`); relative imports and `*` bind nothing known.
    """
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.asname is not None:
                yield alias.asname, alias.name
            else:
                top = alias.name.split(".")[0]
                yield top, top
        return
    if node.level or node.module is None:
        return
    for alias in node.names:
        if alias.name != "*":
            yield alias.asname or alias.name, f"{node.module}.{alias.name}"


def torch_binding(node: ast.Import) -> str | None:
    """The name `import torch [as X]` binds to torch itself, if the statement does; `import
    torch.cuda` binds `torch` too (an `import torch` after it would add nothing)."""
    for alias in node.names:
        if alias.name == "torch":
            return alias.asname or "torch"
    for alias in node.names:
        if alias.asname is None and alias.name.startswith("torch."):
            return "torch"
    return None


# Frameworks a module may use instead of torch (`ModuleNames.other_framework`).
OTHER_FRAMEWORKS = frozenset(
    {"tensorflow", "keras", "tf_keras", "jax", "flax", "paddle", "mxnet", "mindspore"}
)
# Fields of compound statements that hold blocks running in the same scope.
_BLOCK_FIELDS = ("body", "orelse", "finalbody", "handlers", "cases")
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_COMPREHENSION_SCOPES = frozenset({"lambda", "listcomp", "setcomp", "dictcomp", "genexpr"})

ScopeKey = tuple[tuple[str, ...], int]  # (names of the enclosing defs and classes, def line)


def statements(
    body: Iterable[ast.AST], path: tuple[str, ...] = (), line: int = 0
) -> Iterator[tuple[ast.AST, tuple[str, ...], int]]:
    """Every statement under `body` with the scope it runs in (the names of the enclosing
    functions and classes, and the line of the innermost one's `def`), parents first.

    Only statement blocks are walked, never expressions: a fraction of the nodes.
    """
    stack = [(iter(body), path, line)]
    while stack:
        stmts, path, line = stack[-1]
        stmt = next(stmts, None)
        if stmt is None:
            stack.pop()
            continue
        yield stmt, path, line
        if isinstance(stmt, _SCOPES):
            stack.append((iter(stmt.body), (*path, stmt.name), stmt.lineno))
            continue
        for field in reversed(_BLOCK_FIELDS):
            inner = getattr(stmt, field, None)
            if inner:
                stack.append((iter(inner), path, line))


class ModuleNames:
    """The import bindings of one module, per scope, and the scopes themselves.

    `imports` lists every name some import binds, in any scope (a cheap superset for filters);
    `resolve` answers for one use of a name.
    """

    def __init__(
        self, source: str, tree: ast.Module | None, prior_imports: Iterable[str] = ()
    ) -> None:
        self.imports: dict[str, str] = {}
        self.module_imports: dict[str, str] = {}
        self.prior: dict[str, str] = {}
        self.torch_alias: str | None = None
        self.prior_torch_alias: str | None = None
        # Module-level names bound by an import and also otherwise (`torch = None` in an
        # `except ImportError:`): they may not hold the module at run time.
        self.optional: frozenset[str] = frozenset()
        self._scope_imports: dict[ScopeKey, dict[str, str]] = {}
        self._tables: dict[tuple[str, ...], list[symtable.SymbolTable]] = {}
        self._top: symtable.SymbolTable | None = None
        self._tree = tree
        self._kernels: frozenset[str] | None = None
        for text in prior_imports:
            self._add_prior(text)
        if tree is None:
            return
        for stmt, path, line in statements(tree.body):
            if not isinstance(stmt, ast.Import | ast.ImportFrom):
                continue
            if path:
                table = self._scope_imports.setdefault((path, line), {})
            else:
                table = self.module_imports
            for local, qualified in import_bindings(stmt):
                table[local] = qualified
                self.imports[local] = qualified
            if not path and isinstance(stmt, ast.Import):
                name = torch_binding(stmt)
                if name is not None and (self.torch_alias is None or name == "torch"):
                    self.torch_alias = name
        try:
            self._top = symtable.symtable(source, "<module>", "exec")
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            self._top = None  # scopes unknown: every import counts everywhere
            return
        self._index(self._top, ())
        self.optional = frozenset(n for n in self.module_imports if self.bound_at_module(n))

    @property
    def tree(self) -> ast.Module | None:
        """The text's tree from Python's parser (None if it does not parse)."""
        return self._tree

    @property
    def triton_kernels(self) -> frozenset[str]:
        """Names of the module's functions decorated `@triton.jit` (or `autotune`,
        `heuristics`): calls to them run only on GPUs."""
        if self._kernels is None:
            found = set()
            for stmt, _, _ in statements(self._tree.body if self._tree is not None else ()):
                if not isinstance(stmt, ast.FunctionDef):
                    continue
                for deco in stmt.decorator_list:
                    target = deco.func if isinstance(deco, ast.Call) else deco
                    dotted = ast_dotted_name(target)
                    head = dotted.split(".")[0]
                    full = self.module_imports.get(head, head) + dotted[len(head) :]
                    if full.split(".")[0] == "triton":
                        found.add(stmt.name)
            self._kernels = frozenset(found)
        return self._kernels

    @functools.cached_property
    def other_framework(self) -> str | None:
        """The deep-learning framework other than torch the module works with, when it
        imports no torch at all (a TensorFlow course notebook: `import tensorflow`,
        `TFGPT2LMHeadModel`), by its package name; None when it imports torch or nothing
        else. A fix would bring torch into code that never used it."""
        imported = set(self.imports.values())
        if any(q.split(".")[0] == "torch" for q in imported):
            return None
        for qualified in sorted(imported):
            top, _, rest = qualified.partition(".")
            if top in OTHER_FRAMEWORKS:
                return top
            last = rest.rsplit(".", 1)[-1]
            if top in ("transformers", "diffusers") and last.startswith(("TF", "Flax")):
                return f"{top}.{last}"
        return None

    @functools.cached_property
    def functions(self) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
        """The module's own top-level functions by name (the last definition of each)."""
        body = self._tree.body if self._tree is not None else []
        return {s.name: s for s in body if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)}

    @functools.cached_property
    def symbols(self) -> frozenset[str]:
        """Every identifier of the module's symbol tables, all scopes: from C, about a tenth
        of the time of walking the tree. They are names `variable_names` finds too (with a
        class's private names mangled, and `__class__`), but not all of them: names only in
        annotations under `from __future__ import annotations` have no symbol."""
        found: set[str] = set()
        stack = [self._top] if self._top is not None else []
        while stack:
            table = stack.pop()
            found.update(table.get_identifiers())
            stack.extend(table.get_children())
        return frozenset(found)

    def _add_prior(self, text: str) -> None:
        """Imports that ran before this text (a notebook's earlier cells)."""
        try:
            body = ast.parse(text).body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return
        for stmt, path, _ in statements(body):
            if path or not isinstance(stmt, ast.Import | ast.ImportFrom):
                continue
            for local, qualified in import_bindings(stmt):
                self.prior[local] = qualified
                self.imports.setdefault(local, qualified)
            if isinstance(stmt, ast.Import):
                name = torch_binding(stmt)
                if name is not None and (self.prior_torch_alias is None or name == "torch"):
                    self.prior_torch_alias = name

    def _index(self, table: symtable.SymbolTable, path: tuple[str, ...]) -> None:
        for child in table.get_children():
            if child.get_name() in _COMPREHENSION_SCOPES:
                continue  # lambdas and comprehensions are read from the libcst tree
            inner = (*path, child.get_name())
            self._tables.setdefault(inner, []).append(child)
            self._index(child, inner)

    # -- answers ------------------------------------------------------------------------------

    def bound_at_module(self, name: str) -> bool:
        """Whether the module binds `name` otherwise than by an import."""
        if self._top is None:
            return False
        try:
            symbol = self._top.lookup(name)
        except KeyError:
            return False
        return symbol.is_assigned()

    def module_binding(self, name: str) -> str | None:
        """What `name` refers to at module level: an import of this text, else one that ran
        before it, else torch itself for the bare name `torch`, unless the module binds it."""
        found = self.module_imports.get(name)
        if found is not None:
            return found
        if self.bound_at_module(name):
            return None
        found = self.prior.get(name)
        if found is not None:
            return found
        return "torch" if name == "torch" else None

    def bound_once_at_module(self, name: str, source: str) -> bool:
        """Whether the module binds `name` in exactly one statement and nothing else can rebind
        it (no function declares it `global` and assigns it, no `exec`, no `globals()`): a
        variable other fixes may rely on to keep its value."""
        if self._tree is None or self._top is None:
            return False
        if "exec(" in source or "globals()" in source or "vars()" in source:
            return False
        count = 0
        for stmt, path, _ in statements(self._tree.body):
            if path:
                continue
            for node in _binding_targets(stmt):
                if isinstance(node, ast.Name) and node.id == name:
                    count += 1
        if count != 1:
            return False
        for tables in self._tables.values():
            for table in tables:
                try:
                    symbol = table.lookup(name)
                except KeyError:
                    continue
                if symbol.is_declared_global() and symbol.is_assigned():
                    return False
        return True

    def module_torch(self) -> str | None:
        """The module-level name of torch: this text's own import, else an earlier one."""
        if self.torch_alias is not None:
            return self.torch_alias
        alias = self.prior_torch_alias
        if alias is not None and not self.bound_at_module(alias):
            return alias
        return None

    def resolve(
        self, name: str, scopes: list[tuple[str, cst.CSTNode]], ctx: RuleContext
    ) -> str | None:
        """What `name` refers to where it is used, `scopes` being the enclosing scopes of the
        use, innermost first (`enclosing_scopes`)."""
        if self._top is None:
            return self.imports.get(name, "torch" if name == "torch" else None)
        path = tuple(
            n.name.value  # type: ignore[attr-defined]  # a def or class scope: it has a name
            for kind, n in reversed(scopes)
            if kind in ("def", "class")
        )
        innermost = True
        for kind, node in scopes:
            if kind == "lambda":
                assert isinstance(node, cst.Lambda)
                if name in param_names(node.params):
                    return None
                continue
            if kind == "comp":
                if name in comprehension_targets(node):
                    return None
                continue
            here, path = path, path[:-1]
            if kind == "class" and not innermost:
                continue  # a class body does not enclose the functions in it
            innermost = False
            table = self._table(here, node, ctx)
            if table is None:
                continue
            try:
                symbol = table.lookup(name)
            except KeyError:
                continue
            if symbol.is_imported():
                return self._scope_imports.get((here, table.get_lineno()), {}).get(name)
            if symbol.is_declared_global():
                break
            if symbol.is_local() or symbol.is_parameter():
                return None
            if symbol.is_global():
                break
            # free: bound in an enclosing function; go on outwards
        return self.module_binding(name)

    def torch_in_scopes(
        self, scopes: list[tuple[str, cst.CSTNode]], ctx: RuleContext
    ) -> str | None:
        """A name bound to torch itself by an import in one of `scopes` (`import torch as th`
        in the enclosing function) that means torch there; None if there is none."""
        path = tuple(
            n.name.value  # type: ignore[attr-defined]  # a def or class scope: it has a name
            for kind, n in reversed(scopes)
            if kind in ("def", "class")
        )
        for kind, node in scopes:
            if kind not in ("def", "class"):
                continue
            here, path = path, path[:-1]
            table = self._table(here, node, ctx)
            if table is None:
                continue
            imported = self._scope_imports.get((here, table.get_lineno()), {})
            for local, qualified in imported.items():
                if qualified == "torch" and self.resolve(local, scopes, ctx) == "torch":
                    return local
        return None

    def binds_in_scopes(
        self, name: str, scopes: list[tuple[str, cst.CSTNode]], ctx: RuleContext
    ) -> bool:
        """Whether one of `scopes` (innermost first) binds `name` itself, by any means, so
        that a use there does not reach the module-level binding."""
        if self._top is None:
            return False
        path = tuple(
            n.name.value  # type: ignore[attr-defined]  # a def or class scope: it has a name
            for kind, n in reversed(scopes)
            if kind in ("def", "class")
        )
        innermost = True
        for kind, node in scopes:
            if kind == "lambda":
                assert isinstance(node, cst.Lambda)
                if name in param_names(node.params):
                    return True
                continue
            if kind == "comp":
                if name in comprehension_targets(node):
                    return True
                continue
            here, path = path, path[:-1]
            if kind == "class" and not innermost:
                continue
            innermost = False
            table = self._table(here, node, ctx)
            if table is None:
                continue
            try:
                symbol = table.lookup(name)
            except KeyError:
                continue
            if symbol.is_declared_global():
                return False
            if symbol.is_local() or symbol.is_parameter() or symbol.is_imported():
                return True
        return False

    def _table(
        self, path: tuple[str, ...], node: cst.CSTNode, ctx: RuleContext
    ) -> symtable.SymbolTable | None:
        tables = self._tables.get(path)
        if not tables:
            return None
        if len(tables) == 1:
            return tables[0]
        # Two definitions of one name in one scope (a property's getter and setter): tell
        # them apart by the line of `def`.
        assert isinstance(node, cst.FunctionDef | cst.ClassDef)
        line = ctx.position(node.name)[0]
        return next((t for t in tables if t.get_lineno() == line), tables[0])


def _binding_targets(stmt: ast.AST) -> list[ast.AST]:
    """The nodes a statement binds at its own level (not inside nested scopes)."""
    if isinstance(stmt, ast.Assign):
        roots: list[ast.AST] = list(stmt.targets)
    elif isinstance(stmt, ast.AugAssign | ast.AnnAssign | ast.For | ast.AsyncFor):
        roots = [stmt.target]
    elif isinstance(stmt, ast.With | ast.AsyncWith):
        roots = [i.optional_vars for i in stmt.items if i.optional_vars is not None]
    elif isinstance(stmt, ast.Import | ast.ImportFrom):
        return [ast.Name(id=local) for local, _ in import_bindings(stmt)]
    elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [ast.Name(id=stmt.name)]
    else:
        return []
    found: list[ast.AST] = []
    while roots:
        node = roots.pop()
        if isinstance(node, ast.Tuple | ast.List):
            roots.extend(node.elts)
        elif isinstance(node, ast.Starred):
            roots.append(node.value)
        else:
            found.append(node)
    return found


def ast_dotted_name(node: ast.AST) -> str:
    """`a.b.c` for the `ast` of a dotted name; "" for anything else (a call, a subscript)."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def param_names(params: cst.Parameters) -> set[str]:
    """The names a function's or lambda's parameters bind."""
    found = {p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)}
    for star in (params.star_arg, params.star_kwarg):
        if isinstance(star, cst.Param):
            found.add(star.name.value)
    return found


def comprehension_targets(node: cst.CSTNode) -> set[str]:
    """The names the `for` clauses of a comprehension bind (its own scope)."""
    found: set[str] = set()
    comp = getattr(node, "for_in", None)
    while isinstance(comp, cst.CompFor):
        stack: list[cst.CSTNode] = [comp.target]
        while stack:
            target = stack.pop()
            if isinstance(target, cst.Name):
                found.add(target.value)
            else:
                stack.extend(target.children)
        comp = comp.inner_for_in
    return found


_COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)


def enclosing_scopes(ctx: RuleContext, node: cst.CSTNode) -> list[tuple[str, cst.CSTNode]]:
    """The scopes `node` is evaluated in, innermost first: ("def", FunctionDef), ("class",
    ClassDef), ("lambda", Lambda), ("comp", a comprehension).

    A function's decorators, defaults and annotations run in the enclosing scope, so only a
    path through the body enters the function (a class's or lambda's likewise).
    """
    parents = ctx.parents
    parent = parents.get(id(node))
    if parent is None and node is not ctx.module:
        # Not reached by the traversal yet: a part of the node a rule is visiting, which is
        # in the scopes the traversal is in.
        return list(reversed(ctx.scope_stack))
    scopes: list[tuple[str, cst.CSTNode]] = []
    child = node
    while parent is not None:
        kind = _SCOPE_OF_TYPE.get(type(parent))
        if kind == "comp" or (kind is not None and child is parent.body):  # type: ignore[attr-defined]  # a scope's node (def, class, lambda) has a body
            scopes.append((kind, parent))
        child, parent = parent, parents.get(id(parent))
    return scopes


# By exact type: libcst's node classes have no subclasses, and `isinstance` against its
# abstract-base-class machinery costs about ten times a dictionary lookup when it fails
# (most of the time here; these helpers run for every name a rule looks at).
_SCOPE_OF_TYPE: dict[type, str] = {
    cst.FunctionDef: "def",
    cst.ClassDef: "class",
    cst.Lambda: "lambda",
    **{t: "comp" for t in _COMPREHENSIONS},
}


def head_of(node: cst.CSTNode) -> cst.CSTNode:
    """`a` for `a.b.c`; the node itself for anything else."""
    while type(node) is cst.Attribute:
        node = node.value
    return node


def qualified_name(ctx: RuleContext, node: cst.CSTNode) -> str | None:
    """`torch.cuda.synchronize` for `T.cuda.synchronize` after `import torch as T` (uncached).

    Only plain dotted names resolve (`torch.cuda.x`, not `f().x`). `torch` itself resolves even
    when this text does not import it (a notebook cell after the import cell, or code the
    rewrite adds `import torch` to), unless a binding in scope says otherwise.
    """
    dotted = dotted_name(node)
    if not dotted:
        return None
    head, _, rest = dotted.partition(".")
    target = ctx.names.resolve(head, enclosing_scopes(ctx, head_of(node)), ctx)
    if target is None:
        return None
    return f"{target}.{rest}" if rest else target


def qualified(ctx: RuleContext, node: cst.CSTNode) -> str | None:
    """The imported qualified name `node` (or a call's function) refers to, if any (cached)."""
    target = node.func if type(node) is cst.Call else node
    head = head_of(target)
    if type(head) is not cst.Name:
        return None  # `x().mean`, `a[0].b`: not an imported name
    if head.value not in ctx.names.imports and head.value != "torch":
        return None
    cache = ctx.qualified_cache
    key = id(target)
    if key not in cache:
        cache[key] = qualified_name(ctx, target)
    return cache[key]


def matches(ctx: RuleContext, node: cst.CSTNode, *names: str) -> str | None:
    """The one of `names` that `node` (or a call's function) refers to, if any."""
    name = qualified(ctx, node)
    return name if name in names else None


def is_torch_device_call(ctx: RuleContext, node: cst.CSTNode) -> bool:
    """`torch.device(...)`, through whatever name torch has where it is called."""
    return isinstance(node, cst.Call) and bool(matches(ctx, node, "torch.device"))


def is_reference_end(ctx: RuleContext, node: cst.CSTNode) -> bool:
    """True for the whole of a dotted name that is read: not a prefix of a longer one (`a.b` in
    `a.b.c`), not an attribute's own name (`b` in `a.b`), not a keyword, parameter, definition
    or import."""
    parent = ctx.parents.get(id(node))
    if isinstance(parent, cst.Attribute):
        return False  # either the prefix `parent.value` or the attribute name `parent.attr`
    if isinstance(node, cst.Name):
        if isinstance(parent, cst.Arg) and parent.keyword is node:
            return False
        if isinstance(parent, cst.FunctionDef | cst.ClassDef | cst.Param) and parent.name is node:
            return False
    return not isinstance(parent, cst.ImportAlias | cst.AsName | cst.Import | cst.ImportFrom)


def module_level_alias(ctx: RuleContext, qualified: str) -> str | None:
    """The name a module-level import binds to `qualified` (`dist` for torch.distributed)."""
    for local, full in ctx.names.module_imports.items():
        if full == qualified and local != qualified.split(".")[0]:
            return local
    return None


def variable_names(tree: ast.AST) -> frozenset[str]:
    """The names a Python `ast` tree binds or reads: variables, parameters, functions and
    classes, imported names, `global`/`nonlocal` names, `except ... as` names (not attributes
    or keywords). A new variable must not take any of them."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.Global | ast.Nonlocal):
            names.update(node.names)
        elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
            names.add(node.name)
    return frozenset(names)


# -- load and store -------------------------------------------------------------------------

_TARGET_WRAPPERS = (cst.Tuple, cst.List, cst.Element, cst.StarredElement)


def is_store(ctx: RuleContext, node: cst.CSTNode) -> bool:
    """Whether `node` is assigned or deleted rather than read: an assignment's, `for`'s,
    `with ... as`'s or `del`'s target, also inside a tuple or list target."""
    parents = ctx.parents
    child = node
    parent = parents.get(id(node))
    while isinstance(parent, _TARGET_WRAPPERS):
        child, parent = parent, parents.get(id(parent))
    if isinstance(parent, cst.AssignTarget | cst.Del):
        return parent.target is child
    if isinstance(parent, cst.AugAssign | cst.AnnAssign):
        return parent.target is child
    if isinstance(parent, cst.For | cst.CompFor):
        return parent.target is child
    if isinstance(parent, cst.AsName):
        return parent.name is child
    if isinstance(parent, cst.NamedExpr):
        return parent.target is child
    return False


def defines_attribute(ctx: RuleContext, name: str) -> bool:
    """Whether the module gives objects an attribute `name` of its own: `x.name = ...`,
    `def name(...)` or `name = ...` in a class body. Reads of `.name` may then be the
    user's attribute, not torch's."""
    cache = ctx.defined_attributes
    if name not in cache:
        cache[name] = _defines_attribute(ctx.tree, name)
    return cache[name]


def _defines_attribute(tree: ast.Module | None, name: str) -> bool:
    if tree is None:
        return True  # unknown: assume the worst
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == name:
            if not isinstance(node.ctx, ast.Load):
                return True
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return True
        elif isinstance(node, ast.ClassDef):
            for stmt in node.body:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else []
                if isinstance(stmt, ast.AnnAssign):
                    targets = [stmt.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    return True
    return False


def caller_names(
    device_name: str | None,
    prior_imports: Iterable[str],
    prior_names: Iterable[str],
    required_imports: Iterable[str],
) -> frozenset[str]:
    """The names a caller binds around a rewritten text (`Options.device_name`,
    `prior_imports`, `prior_names`, and the `Result.required_imports` it is to run): a
    verifier counts them as defined."""
    found = set(prior_names)
    if device_name:
        found.add(device_name)
    for text in (*prior_imports, *required_imports):
        try:
            body = ast.parse(text).body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        for stmt in body:
            if isinstance(stmt, ast.Import | ast.ImportFrom):
                found.update(local for local, _ in import_bindings(stmt))
    return frozenset(found)
