"""The package's import rules, checked on the source with Python's `ast` (nothing is imported).

docs/architecture.md ("Layout" and "Import rules") says why each rule exists:

- no import cycles between gpu2tpu's modules (imports under `if TYPE_CHECKING:` do not
  count: they never run);
- the packages form layers, and a package imports only from its own layer or lower ones;
- inside the codemod, core < notebooks < files < reports < cli_run, the same way;
- the models (measure, pricing, forecasting, readiness) import `gpu2tpu.views` only inside a
  function (a `__repr__`, `_repr_html_`, `widget()`), never when their module loads;
- `gpu2tpu.views` imports the models only for types, so a view never decides anything;
- a rule module imports only the analysis layer and the rule base.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "gpu2tpu"

# Lower layers never import higher ones (views are checked apart: see the module docstring).
LAYERS: dict[str, int] = {
    "gpu2tpu._extras": 0,
    "gpu2tpu.backends": 0,
    "gpu2tpu.rewrite": 1,
    "gpu2tpu.pricing": 1,
    "gpu2tpu.measure": 2,
    "gpu2tpu.forecasting": 2,
    "gpu2tpu.readiness": 3,
    "gpu2tpu.templates": 3,
    "gpu2tpu.magics": 4,
    "gpu2tpu.demo": 4,
    "gpu2tpu.cli": 5,
    "gpu2tpu.__main__": 6,
}
MODELS = ("gpu2tpu.measure", "gpu2tpu.pricing", "gpu2tpu.forecasting", "gpu2tpu.readiness")


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module (a package's __init__ counts as the package)
    line: int
    deferred: bool  # inside a function or method: runs only when called
    typing_only: bool  # under `if TYPE_CHECKING:`


def _module_name(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return ".".join(parts), is_package


MODULES: dict[str, Path] = {_module_name(p)[0]: p for p in ROOT.rglob("*.py")}


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str, path: Path) -> list[Import]:
    is_package = _module_name(path)[1]
    found: list[Import] = []

    def visit(node: ast.AST, deferred: bool, typing_only: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, deferred, True)
            for child in node.orelse:
                visit(child, deferred, typing_only)
            return
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            deferred = True
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node)
            # `from pkg import submodule` imports the submodule
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names
            ]
        for target in dict.fromkeys(targets):
            if target in MODULES:
                found.append(Import(module, target, node.lineno, deferred, typing_only))
        for child in ast.iter_child_nodes(node):
            visit(child, deferred, typing_only)

    visit(ast.parse(path.read_text(encoding="utf-8")), False, False)
    return found


IMPORTS: list[Import] = [i for m, p in sorted(MODULES.items()) for i in _imports(m, p)]


def _package(module: str) -> str:
    for name in sorted(LAYERS, key=len, reverse=True):
        if module == name or module.startswith(name + "."):
            return name
    return module


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_scan_sees_the_packages():
    # a scan that found nothing would pass every rule below
    assert len(MODULES) > 80
    assert any(i.source == "gpu2tpu.measure.timer" for i in IMPORTS)
    assert any(i.typing_only for i in IMPORTS) and any(i.deferred for i in IMPORTS)


def test_no_import_cycles():
    graph: dict[str, set[str]] = {}
    for i in IMPORTS:
        # Every module of the package runs `gpu2tpu/__init__.py` first, which imports nothing
        # when it loads (its public names are lazy), so reading `__version__` from it is no
        # cycle; an import *into* the root is left out of the graph.
        if not i.typing_only and i.source != i.target and i.target != "gpu2tpu":
            graph.setdefault(i.source, set()).add(i.target)
    # Tarjan's strongly connected components; any component of two or more is a cycle
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(MODULES):
        if node not in index:
            connect(node)
    assert cycles == []


def test_packages_import_only_their_own_layer_or_lower():
    wrong = [
        f"{i.source}:{i.line} imports {i.target}"
        for i in IMPORTS
        if not i.typing_only
        and _package(i.source) in LAYERS
        and _package(i.target) in LAYERS
        and LAYERS[_package(i.target)] > LAYERS[_package(i.source)]
    ]
    assert wrong == []


def test_models_import_views_only_when_drawing():
    wrong = [
        f"{i.source}:{i.line} imports {i.target} when the module loads"
        for i in IMPORTS
        if i.source.startswith(MODELS)
        and _within(i.target, "gpu2tpu.views")
        and not i.deferred
        and not i.typing_only
    ]
    assert wrong == []


def test_views_import_models_only_for_types():
    wrong = [
        f"{i.source}:{i.line} imports {i.target}"
        for i in IMPORTS
        if _within(i.source, "gpu2tpu.views")
        and not _within(i.target, "gpu2tpu.views")
        and not i.typing_only
    ]
    assert wrong == []


# Inside the codemod, the same: the pure engine (with the analysis layer and the rules, which
# it runs and which import its records) below the notebooks, below the files and workers, below
# the reports, below the commands (docs/architecture.md, "Layout").
REWRITE_LAYERS: dict[str, int] = {
    "gpu2tpu.rewrite.core": 0,
    "gpu2tpu.rewrite.analysis": 0,
    "gpu2tpu.rewrite.rules": 0,
    "gpu2tpu.rewrite.notebooks": 1,
    "gpu2tpu.rewrite.files": 2,
    "gpu2tpu.rewrite.reports": 3,
    "gpu2tpu.rewrite.cli_run": 4,
}


def _rewrite_layer(module: str) -> int | None:
    for name, layer in REWRITE_LAYERS.items():
        if _within(module, name):
            return layer
    return None


def test_every_rewrite_module_has_a_layer():
    assert [
        m for m in MODULES if m.startswith("gpu2tpu.rewrite.") and _rewrite_layer(m) is None
    ] == []
    # a table that matched nothing would pass the layer test below
    assert any(
        _within(i.source, "gpu2tpu.rewrite.files") and _within(i.target, "gpu2tpu.rewrite.core")
        for i in IMPORTS
    )


def test_rewrite_layers_import_only_their_own_layer_or_lower():
    wrong = [
        f"{i.source}:{i.line} imports {i.target}"
        for i in IMPORTS
        if not i.typing_only
        and (source := _rewrite_layer(i.source)) is not None
        and (target := _rewrite_layer(i.target)) is not None
        and target > source
    ]
    assert wrong == []


@pytest.mark.parametrize(
    "module",
    sorted(
        m
        for m in MODULES
        if m.startswith("gpu2tpu.rewrite.rules.") and m != "gpu2tpu.rewrite.rules.base"
    ),
)
def test_rule_modules_import_only_the_analysis_layer_and_the_rule_base(module: str):
    allowed = (
        "gpu2tpu.rewrite.analysis",
        "gpu2tpu.rewrite.rules.base",
        "gpu2tpu.rewrite.core.model",
    )
    wrong = [
        f"{i.source}:{i.line} imports {i.target}"
        for i in IMPORTS
        if i.source == module
        and not i.target.startswith(allowed)
        and i.target != "gpu2tpu.rewrite.rules"
    ]
    assert wrong == []


# Modules split along a seam, and what the lower side must not import back: what reads and
# writes a thing never imports the pipeline that decides what to write (issue 29).
SEAMS: dict[str, tuple[str, ...]] = {
    # the recorder fills the flow facts' record; the facts read it, never the other way
    "gpu2tpu.rewrite.analysis.flow_recorder": ("gpu2tpu.rewrite.analysis.flow",),
    # a notebook's JSON in and out, and its shell checks, below the notebook rewrite
    "gpu2tpu.rewrite.notebooks.notebook_json": (
        "gpu2tpu.rewrite.notebooks.notebook",
        "gpu2tpu.rewrite.core.source",
    ),
    "gpu2tpu.rewrite.notebooks.notebook_shell": (
        "gpu2tpu.rewrite.notebooks.notebook",
        "gpu2tpu.rewrite.core.source",
    ),
    # the engine's state holds no rule and no engine code
    "gpu2tpu.rewrite.core.module_state": ("gpu2tpu.rewrite.rules", "gpu2tpu.rewrite.core.source"),
}


@pytest.mark.parametrize("module", sorted(SEAMS))
def test_split_modules_do_not_import_the_side_above_them(module: str):
    assert module in MODULES
    wrong = [
        f"{i.source}:{i.line} imports {i.target}"
        for i in IMPORTS
        if i.source == module
        and not i.typing_only
        and any(i.target == t or i.target.startswith(f"{t}.") for t in SEAMS[module])
    ]
    assert wrong == []
