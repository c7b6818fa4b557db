"""`.ipynb` text in, `.ipynb` text out: code cells rewritten as `.py` files are, nothing else touched.

Pure: `rewrite_notebook` takes the file's text and returns the new text; the engine reads and
writes. Each code cell's Python (IPython syntax masked, see `ipython_syntax`) goes through the
same `rewrite_source` as a `.py` file. The notebook shares one device variable: the first cell
that needs it defines it after its imports, later cells reuse it, and a device variable the
notebook already builds with the usual `'cuda' if torch.cuda.is_available() else 'cpu'` idiom
is kept and reused.

Fidelity: the JSON is edited as text, never re-serialised through nbformat, so everything but
the changed sources stays byte for byte (notebook_json.py reads, writes and diffs it).

Notebook-only checks (IPython syntax and metadata that libcst never sees):
G2T510 NVIDIA tools in shell escapes, G2T511 `CUDA_VISIBLE_DEVICES`, G2T512 installing a
CUDA-only package (notebook_shell.py), G2T513 a notebook that asks Colab or Kaggle for a GPU
runtime, G2T519 a local module it imports that holds CUDA code (`local_module_findings` reads
those files: the one check here that looks beyond the notebook's text).
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..analysis.lines import python_lines
from ..analysis.names import variable_names
from ..core.model import CellFinding, Finding, Options, Result, Severity
from ..core.source import SourceError, prefilter_tokens, rewrite_source
from ..rules.base import DEVICE_NAMES
from .ipython_syntax import (
    PYTHON_CELL_MAGICS,
    SCOPED_CELL_MAGICS,
    MaskedCell,
    MaskError,
    line_ending,
    mask,
    split_cell_magic,
)
from .notebook_json import (
    MetaPath,
    NotebookError,
    cell_label,
    cell_source,
    load_notebook,
    notebook_language,
    render_notebook,
    value_at,
    value_spans,
)
from .notebook_shell import (
    SHELL_CELL_MAGICS,
    escape_findings,
    notebook_finding,
    shell_body_findings,
)


@dataclass(frozen=True)
class NotebookResult:
    """What `rewrite_notebook` returns.

    `new_text` is the very same string when nothing changed. Findings of the notebook as a
    whole (its runtime metadata) have `cell_index` -1, and their line and column point into
    the file's JSON text. `device_name` is the notebook's device variable after its last cell;
    `skipped` says why no cell was looked at (a notebook in another language), else "".
    """

    new_text: str
    edits: tuple[CellFinding, ...] = ()
    findings: tuple[CellFinding, ...] = ()
    cell_errors: tuple[str, ...] = ()
    device_name: str | None = None
    skipped: str = ""
    withheld: tuple[CellFinding, ...] = ()  # findings whose fix the safety net held back


# The runtimes a notebook may ask Colab and Kaggle for (G2T513; the other notebook checks, on
# IPython syntax, are in notebook_shell.py).
COLAB_TPU = {"accelerator": "TPU", "gpuType": "V5E1"}
COLAB_TPU_TYPES = frozenset({"V28", "V5E1", "V6E1"})
KAGGLE_TPU = "tpuV5e8"


# -- the notebook -----------------------------------------------------------------------------


@dataclass
class _CodeCell:
    """One code cell's Python, ready for the rewrite."""

    index: int
    cell_id: str | None
    source: str
    head: str = ""  # cell magic lines above the Python (`%%time\n`)
    offset: int = 0  # number of lines in `head`
    python: str | None = None  # the Python to rewrite; None when there is none
    persists: bool = True  # what the Python defines outlives the cell (not `%%timeit`)
    masked: MaskedCell | None = None
    names: frozenset[str] = frozenset()
    imports: tuple[str, ...] = ()  # its top-level import statements, one line each
    idiom: tuple[str, str] | None = None  # (name, "device" | "str") of a device idiom
    findings: list[Finding] = field(default_factory=list)
    error: str = ""

    @property
    def newline(self) -> str:
        first = python_lines(self.python or "")[:1]
        return (line_ending(first[0]) if first else "") or "\n"


def _prepare(index: int, cell: dict[str, Any], *, facts: bool = True) -> _CodeCell:
    source = cell_source(cell)
    cell_id = cell.get("id") if isinstance(cell.get("id"), str) else None
    if source is None:
        return _CodeCell(index, cell_id, "", error="`source` is neither text nor a list of lines")
    code = _CodeCell(index, cell_id, source)
    if not source.strip():
        return code
    body = source
    while (magic := split_cell_magic(body)) is not None:
        if magic.name not in PYTHON_CELL_MAGICS:
            script = magic.args.split()[:1]
            if magic.name in SHELL_CELL_MAGICS or (
                magic.name == "script" and script and script[0] in ("bash", "sh", "zsh")
            ):
                code.findings += shell_body_findings(magic.body, code.offset + magic.head_lines + 1)
            return code  # other languages (`%%writefile`, `%%html`, ...) are left alone
        code.head += magic.head
        code.offset += magic.head_lines
        code.persists = code.persists and magic.name not in SCOPED_CELL_MAGICS
        body = magic.body
    code.python = body
    try:
        code.masked = mask(body)
    except MaskError as err:
        code.error = err.reason
        return code
    lines = python_lines(body)
    for escape in code.masked.escapes:
        for f in escape_findings(escape, lines):
            code.findings.append(replace(f, line=f.line + code.offset))
    if facts:  # what the notebook planner needs about the other cells
        code.names, code.imports = _facts(code.masked.text, code.masked.token_prefix)
    return code


def _facts(text: str, token_prefix: str) -> tuple[frozenset[str], tuple[str, ...]]:
    """The variable names a cell's Python binds or reads (what `rewrite_source` counts as in
    use), and its top-level imports (what later cells can refer to), one line each."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return frozenset(), ()
    names = variable_names(tree)
    imports = tuple(
        ast.unparse(node)
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom)
        and not (isinstance(node, ast.ImportFrom) and node.module == "__future__")
        and not any(a.name.startswith(token_prefix) for a in node.names)
    )
    return names, imports


# What a cell must contain to hold a device idiom (G2T103): `torch.cuda.is_available()`, or a
# `device = "cuda"` setting; cells without either skip the extra parse.
_IDIOM_HINT = re.compile(
    r"cuda.*is_available|is_available.*cuda|^[ \t]*\w*device\w*[ \t]*=[^=].*cuda", re.M | re.I
)


def _idiom(text: str, imports: tuple[str, ...]) -> tuple[str, str] | None:
    """The device variable a cell builds with the `'cuda' if ... else 'cpu'` idiom, and whether
    it holds a `torch.device` ("device") or a string ("str"); `imports` ran before it."""
    try:
        options = Options(select=("G2T103",), fix=False, prior_imports=imports)
        result = rewrite_source(text, options)
    except SourceError:
        return None
    name = result.device_name
    if name is None:
        return None
    for node in ast.walk(ast.parse(text)):
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == name
        ):
            return name, "device" if isinstance(node.value, ast.Call) else "str"
    return None


def _candidates() -> Iterable[str]:
    """The device names `rewrite_source` tries, in its order."""
    yield from DEVICE_NAMES
    yield from (f"device_{i}" for i in range(2, 100))


class _Imports:
    """The import statements of the cells run so far: what a later cell's names refer to."""

    def __init__(self) -> None:
        self.lines: dict[str, None] = {}

    def add(self, imports: Iterable[str]) -> None:
        self.lines.update(dict.fromkeys(imports))


class _Planner:
    """Walks the code cells in order and keeps the notebook's one device variable.

    Each cell is rewritten knowing the imports of the cells above it (`Options.prior_imports`),
    so that `torch.cuda.synchronize()` in cell 5 is recognised through the `import torch` of
    cell 1, as the kernel would resolve it.
    """

    def __init__(self, cells: list[_CodeCell], options: Options) -> None:
        self.options = options
        self.all_names = frozenset().union(*(c.names for c in cells))
        seen = _Imports()
        for cell in cells:
            assert cell.masked is not None
            if options.enabled("G2T103") and cell.persists and _IDIOM_HINT.search(cell.masked.text):
                cell.idiom = _idiom(cell.masked.text, tuple(seen.lines))
            if cell.persists:
                seen.add(cell.imports)
        self.first_idiom = next(((c.index, *c.idiom) for c in cells if c.idiom), None)
        self.imports = _Imports()
        self.name: str | None = options.device_name
        self.kind = "device"

    def reserved(self, cell: _CodeCell) -> list[str]:
        """Names the cell must not pick for a new device variable: those other cells use, and
        those before a later idiom cell's name (so that the notebook ends up with one name)."""
        target = None
        if self.first_idiom and self.first_idiom[0] > cell.index:
            idiom_name = self.first_idiom[1]
            if idiom_name in set(_candidates()) and idiom_name not in cell.names:
                target = idiom_name
        out = []
        for name in _candidates():
            if name == target or (target is None and name not in self.all_names):
                break
            if name not in cell.names:
                out.append(name)
        return out

    def rewrite(self, cell: _CodeCell) -> tuple[str, Result]:
        """The cell's new Python and the rewrite's result (positions in the cell's Python)."""
        assert cell.masked is not None
        try:
            new, result, masked = self._decide(cell)
        except (SourceError, MaskError):
            if cell.persists:
                self.imports.add(cell.imports)
            raise
        cell.masked = masked
        if cell.persists:
            changed = new != masked.text
            self.imports.add(_facts(new, masked.token_prefix)[1] if changed else cell.imports)
        return masked.unmask(new), result

    def _decide(self, cell: _CodeCell) -> tuple[str, Result, MaskedCell]:
        if self.name is None:
            opts = replace(self.options, device_name=None)
            new, result, masked = self._run(cell, opts, self.reserved(cell))
            if cell.persists and result.device_name:
                if result.device_defined:
                    self.name, self.kind = result.device_name, "device"
                elif cell.idiom and cell.idiom[0] == result.device_name:
                    self.name, self.kind = cell.idiom
            return new, result, masked
        opts = replace(self.options, device_name=self.name, define_device=False)
        new, result, masked = self._run(cell, opts, [])
        if self.kind == "str" and _type_uses(self.name, new) > _type_uses(self.name, masked.text):
            # the rules need a torch.device (`device.type`), but the idiom made a string
            opts = replace(self.options, device_name=None)
            new, result, masked = self._run(cell, opts, [*self.reserved(cell), self.name])
            if cell.persists and result.device_defined and result.device_name:
                self.name, self.kind = result.device_name, "device"
        elif cell.persists and cell.idiom and cell.idiom[0] == self.name:
            self.kind = cell.idiom[1]
        return new, result, masked

    def _run(
        self, cell: _CodeCell, opts: Options, reserve: list[str]
    ) -> tuple[str, Result, MaskedCell]:
        return _rewrite_python(cell, opts, tuple(self.imports.lines), reserve)


def _rewrite_python(
    cell: _CodeCell, opts: Options, prior_imports: tuple[str, ...], reserve: list[str]
) -> tuple[str, Result, MaskedCell]:
    """`rewrite_source` on a cell's masked Python, told what the cells before it imported and
    which names a new device variable must not take; if its line magics' Python does not
    parse in place, those lines are masked whole and it is tried again. Returns the new
    masked text, the result (positions in the cell's Python) and the mask that goes with it."""
    assert cell.masked is not None
    opts = replace(
        opts,
        prior_imports=(*opts.prior_imports, *prior_imports),
        reserved_names=opts.reserved_names | frozenset(reserve),
        library=False,  # a notebook runs: its device line is shared by the cells after it
    )
    try:
        result = rewrite_source(cell.masked.text, opts)
        return result.new_text, result, cell.masked
    except SourceError:
        if not any(e.python for e in cell.masked.escapes):
            raise
    masked = mask(cell.python or "", python_magics=False)
    result = rewrite_source(masked.text, opts)
    return result.new_text, result, masked


def _type_uses(name: str, text: str) -> int:
    return len(re.findall(rf"\b{re.escape(name)}\.type\b", text))


def rewrite_notebook(text: str, options: Options) -> NotebookResult:
    """Rewrite a notebook's code cells; raise `NotebookError` when the file is not a notebook.

    A cell that cannot be handled is skipped and named in `cell_errors`; the others are still
    rewritten. Nothing but code-cell sources (and, with unsafe fixes, the runtime metadata)
    changes in the text. Cells without any CUDA token are not parsed.
    """
    nb = load_notebook(text)
    language = notebook_language(nb)
    if language is not None and not language.lower().startswith(("python", "ipython")):
        return NotebookResult(text, skipped=f"the notebook's language is {language}, not Python")
    cells = [
        _prepare(index, cell)
        for index, cell in enumerate(nb["cells"])
        if isinstance(cell, dict) and cell.get("cell_type") == "code"
    ]
    planner = _Planner([c for c in cells if c.masked is not None and not c.error], options)
    edits: list[CellFinding] = []
    findings: list[CellFinding] = []
    withheld: list[CellFinding] = []
    errors: list[str] = []
    new_sources: dict[int, str] = {}
    for cell in cells:
        cell_findings = [f for f in cell.findings if options.enabled(f.code)]
        cell_edits: list[Finding] = []
        if not cell.error and cell.masked is not None:
            try:
                new_python, result = planner.rewrite(cell)
            except SourceError as err:
                line = f" (line {err.line + cell.offset})" if err.line else ""
                cell.error = f"{err.reason}{line}"
            except MaskError as err:
                cell.error = err.reason
            except RecursionError:
                cell.error = "too deeply nested to parse"
            else:
                cell_edits += [_shift(f, cell) for f in result.edits]
                cell_findings += [_shift(f, cell) for f in result.findings]
                withheld += [
                    CellFinding(cell.index, cell.cell_id, _shift(f, cell)) for f in result.withheld
                ]
                new_source = cell.head + new_python
                if new_source != cell.source:
                    new_sources[cell.index] = new_source
        if cell.error:
            errors.append(f"{cell_label(cell.index)}: {cell.error}")
        where = (cell.index, cell.cell_id)
        edits += [CellFinding(*where, f) for f in sorted(cell_edits, key=_order)]
        findings += [CellFinding(*where, f) for f in sorted(cell_findings, key=_order)]
    meta_findings, meta_changes = _metadata(text, nb, options)
    for f in meta_findings:
        (edits if f.fixed else findings).append(CellFinding(-1, None, f))
    new_text = (
        render_notebook(text, nb, new_sources, meta_changes)
        if new_sources or meta_changes
        else text
    )
    return NotebookResult(
        new_text,
        tuple(edits),
        tuple(findings),
        tuple(errors),
        planner.name,
        withheld=tuple(withheld),
    )


@dataclass(frozen=True)
class CellRewrite:
    """One code cell rewritten exactly as `rewrite_notebook` rewrites a cell: what `%%tpu` and
    `%tpu_auto` run. Lines and columns of `edits` and `findings` are the cell's own; `error`
    says why the cell was left as written ("" when it was not)."""

    source: str
    new_source: str
    edits: tuple[Finding, ...] = ()
    findings: tuple[Finding, ...] = ()
    error: str = ""
    device_name: str | None = None
    withheld: tuple[Finding, ...] = ()  # findings whose fix the safety net held back
    # With `Options.insert_statements=False`: the imports the new text needs, for the caller
    # to run before it (the text itself gains no line).
    required_imports: tuple[str, ...] = ()
    device_shadowed: bool = False  # as `Result.device_shadowed`

    @property
    def changed(self) -> bool:
        return self.new_source != self.source


def rewrite_cell(
    source: str,
    options: Options,
    *,
    prior_imports: Iterable[str] = (),
    reserved: Iterable[str] = (),
) -> CellRewrite:
    """Rewrite one notebook cell (IPython syntax and cell magics included) on its own, as
    `rewrite_notebook` rewrites each cell.

    `prior_imports` are import statements that ran before (earlier cells), one per item, so
    that `torch.cuda.synchronize()` in a cell that imports nothing is recognised; `reserved`
    are names a new device variable must not take. With `options.insert_statements` False
    (the magics), the cell gains no line: what it needs imported is in `required_imports`.
    Pure: nothing is run or read.
    """
    cell = _prepare(0, {"source": source}, facts=False)
    findings = [f for f in cell.findings if options.enabled(f.code)]
    if cell.error or cell.masked is None:
        return CellRewrite(
            source, source, findings=tuple(sorted(findings, key=_order)), error=cell.error
        )
    try:
        new, result, masked = _rewrite_python(cell, options, tuple(prior_imports), list(reserved))
        cell.masked = masked
        new_source = cell.head + masked.unmask(new)
    except SourceError as err:
        line = f" (line {err.line + cell.offset})" if err.line else ""
        error = f"{err.reason}{line}"
    except MaskError as err:
        error = err.reason
    except RecursionError:
        error = "too deeply nested to parse"
    else:
        edits = sorted((_shift(f, cell) for f in result.edits), key=_order)
        findings += [_shift(f, cell) for f in result.findings]
        return CellRewrite(
            source,
            source if new_source == source else new_source,
            tuple(edits),
            tuple(sorted(findings, key=_order)),
            device_name=result.device_name,
            withheld=tuple(sorted((_shift(f, cell) for f in result.withheld), key=_order)),
            required_imports=result.required_imports,
            device_shadowed=result.device_shadowed,
        )
    return CellRewrite(source, source, findings=tuple(sorted(findings, key=_order)), error=error)


def _order(f: Finding) -> tuple[int, int, str]:
    return f.line, f.col, f.code


def _shift(f: Finding, cell: _CodeCell) -> Finding:
    """A finding's position in the cell's Python -> its position in the cell."""
    assert cell.masked is not None
    return replace(f, line=f.line + cell.offset, col=f.col + cell.masked.column_shift(f.line))


# -- runtime metadata (G2T513) --------------------------------------------------------------


def _metadata(
    text: str, nb: dict[str, Any], options: Options
) -> tuple[list[Finding], dict[MetaPath, object]]:
    """G2T513 findings, and the values the unsafe fix sets (only keys that exist change)."""
    meta = nb.get("metadata")
    if not options.enabled("G2T513") or not isinstance(meta, dict):
        return [], {}
    apply = options.fix and options.unsafe_fixes
    found: list[Finding] = []
    changes: dict[MetaPath, object] = {}
    colab_meta = meta.get("colab")
    colab: dict[str, Any] = colab_meta if isinstance(colab_meta, dict) else {}
    accelerator = meta.get("accelerator")
    gpu_type = colab.get("gpuType")
    asks = accelerator.upper() if isinstance(accelerator, str) else ""
    if asks == "GPU" or (
        isinstance(gpu_type, str) and gpu_type and gpu_type not in COLAB_TPU_TYPES and asks != "TPU"
    ):
        fix: dict[MetaPath, object] = {}
        if "accelerator" in meta:
            fix[("metadata", "accelerator")] = COLAB_TPU["accelerator"]
        if "gpuType" in colab:
            fix[("metadata", "colab", "gpuType")] = COLAB_TPU["gpuType"]
        found.append(
            _runtime_finding(text, nb, "Colab", "Runtime > Change runtime type", fix, apply)
        )
        changes.update(fix if apply else {})
    kaggle_meta = meta.get("kaggle")
    kaggle: dict[str, Any] = kaggle_meta if isinstance(kaggle_meta, dict) else {}
    k_acc = kaggle.get("accelerator")
    k_gpu = isinstance(k_acc, str) and k_acc.lower().startswith(("gpu", "nvidia"))
    if k_gpu or kaggle.get("isGpuEnabled") is True:
        fix = {}
        if k_gpu:
            fix[("metadata", "kaggle", "accelerator")] = KAGGLE_TPU
        if kaggle.get("isGpuEnabled") is True:
            fix[("metadata", "kaggle", "isGpuEnabled")] = False
        found.append(_runtime_finding(text, nb, "Kaggle", "the notebook's settings", fix, apply))
        changes.update(fix if apply else {})
    return found, changes


def _runtime_finding(
    text: str,
    nb: dict[str, Any],
    platform: str,
    where: str,
    fix: dict[MetaPath, object],
    apply: bool,
) -> Finding:
    """One G2T513 finding, placed at the first metadata value its fix would change."""
    before = ", ".join(f"{p[-1]}: {json.dumps(value_at(nb, p))}" for p in fix)
    after = ", ".join(f"{p[-1]}: {json.dumps(v)}" for p, v in fix.items())
    first = next(iter(fix))
    start, _ = value_spans(text, [first])[first]
    return notebook_finding(
        "G2T513",
        text.count("\n", 0, start) + 1,
        start - (text.rfind("\n", 0, start) + 1) + 1,
        f"the notebook asks {platform} for a GPU runtime ({before})",
        f"choose a TPU runtime ({where}); `--unsafe-fixes` writes {after}",
        fixed=apply,
        fixable=True,
        before=before,
        after=after if apply else "",
    )


# -- local modules the notebook imports (G2T519) --------------------------------------------------


def imported_modules(python: str) -> list[tuple[str, int, int]]:
    """(dotted module name, line, column) of each absolute import in a cell's Python."""
    try:
        tree = ast.parse(python)
    except (SyntaxError, ValueError, RecursionError):
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno, node.col_offset + 1) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append((node.module, node.lineno, node.col_offset + 1))
    return sorted(out, key=lambda t: (t[1], t[2]))


def module_file(folder: Path, dotted: str) -> Path | None:
    """The file `import dotted` finds in `folder` (a module or a package's `__init__.py`)."""
    base = folder.joinpath(*dotted.split("."))
    for candidate in (base.with_name(base.name + ".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@dataclass(frozen=True)
class LocalModule:
    """A local module that holds CUDA code: what `gpu2tpu rewrite` would say about it."""

    path: Path
    edits: int  # fixes `gpu2tpu rewrite` would apply
    findings: int  # what it would leave for a person (TPU performance hints aside)
    severity: Severity

    def describe(self, shown: str) -> str:
        parts = [f"{n} {what}" for n, what in
                 ((self.edits, "fixable"), (self.findings, "for a person")) if n]  # fmt: skip
        return f"`{shown}` holds CUDA code ({', '.join(parts)})"


@functools.lru_cache(maxsize=256)
def _module_with_cuda(path: str, stamp: tuple[int, int], options: Options) -> LocalModule | None:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if not any(token.decode() in text for token in prefilter_tokens(options)):
        return None
    try:
        result = rewrite_source(text, options)
    except SourceError:
        return None
    found = [f for f in (*result.edits, *result.findings) if not f.code.startswith("G2T6")]
    edits = [f for f in found if f.fixable or f.fixed]
    findings = [f for f in found if not (f.fixable or f.fixed)]
    if not edits and not findings:
        return None
    severe = any(f.severity is Severity.ERROR for f in (*edits, *findings))
    return LocalModule(
        Path(path), len(edits), len(findings), Severity.ERROR if severe else Severity.WARNING
    )


def module_with_cuda(path: Path, options: Options) -> LocalModule | None:
    """What `gpu2tpu rewrite` would do to the module at `path` (None: nothing CUDA there)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return _module_with_cuda(str(path), (st.st_mtime_ns, st.st_size), options)


def local_module_findings(
    notebook_path: str, text: str, options: Options, covered: Iterable[str] = ()
) -> list[CellFinding]:
    """G2T519 for each module beside the notebook that a code cell imports and that holds
    CUDA code, at the cell's import; none for modules inside `covered` (paths the same run
    rewrites)."""
    if not options.enabled("G2T519"):
        return []
    try:
        nb = load_notebook(text)
    except NotebookError:
        return []
    folder = Path(notebook_path).resolve().parent
    roots = tuple(str(Path(r).resolve()) for r in covered)
    out: list[CellFinding] = []
    seen: set[Path] = set()
    for index, raw in enumerate(nb["cells"]):
        if not isinstance(raw, dict) or raw.get("cell_type") != "code":
            continue
        cell = _prepare(index, raw, facts=False)
        if cell.error or cell.masked is None:
            continue
        for dotted, line, col in imported_modules(cell.masked.text):
            path = module_file(folder, dotted)
            if path is None or path in seen or _inside(str(path), roots):
                continue
            seen.add(path)
            module = module_with_cuda(path, replace(options, fix=False))
            if module is None:
                continue
            shown = os.path.relpath(path, folder)
            finding = replace(
                notebook_finding(
                    "G2T519",
                    line,
                    col,
                    f"{module.describe(shown)}, which rewriting the notebook leaves as it is: "
                    f"`gpu2tpu rewrite {shown}` migrates it",
                    f"gpu2tpu rewrite {shown}",
                ),
                severity=module.severity,
            )
            out.append(CellFinding(cell.index, cell.cell_id, _shift(finding, cell)))
    return out


def _inside(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in roots)
