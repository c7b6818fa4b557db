"""One cell under gpu2tpu: rewritten as `gpu2tpu rewrite` rewrites a notebook cell, its
problems said before it runs, and compiled so that a traceback shows the cell as written.

The rewrite is `rewrite_cell`, the function the notebook rewriter applies to every code cell,
on the cell's raw text (IPython syntax included: the Python inside `%time` is rewritten, a
`!nvidia-smi` is reported). IPython's own transforms then turn the rewritten text into
Python, which is parsed once. Its line numbers are mapped back to the lines the user wrote
(the rewrite may add or split lines, IPython's transforms may drop leading blank lines), and
the text registered for the cell's traceback name is the cell as written: a traceback reads
`Cell In[n], line k` and shows the user's own line k; `ran_as(k)` gives what really ran there,
which the magics add to an error as a note.
"""

from __future__ import annotations

import ast
import difflib
import functools
import linecache
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import CodeType, ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from ..backends import Backend
    from ..rewrite.notebook import CellRewrite

# The variable rewritten cells use for the device; another name when the user has one of
# their own that is not a device.
DEVICE_VARIABLE = "device"
FALLBACK_DEVICE_VARIABLE = "tpu_device"
# IPython's special syntax needs one of these characters; a cell without any is plain Python
# and skips the masking pass (IPython's tokenizer) in the rewrite.
_IPYTHON_SYNTAX = re.compile(r"[%!?]|^[ \t]*[/,;]", re.MULTILINE)
_CUDA_STRING = re.compile(r"cuda(:\d+)?")


# -- which cell this is ----------------------------------------------------------------------------


def cell_number(shell: InteractiveShell) -> int:
    """The execution count of the cell running now, as its `In[n]` prompt shows it.

    IPython 9 counts the cell before running it (`shell.execution_count` is already n+1
    inside a magic); the result object IPython keeps for the running cell has the number it
    prints. Outside a cell run (a magic called from code), the shell's count.
    """
    running = getattr(getattr(shell, "displayhook", None), "exec_result", None)
    number = getattr(running, "execution_count", None)
    return number if isinstance(number, int) else shell.execution_count


# -- line maps -----------------------------------------------------------------------------------


def line_map(old: Sequence[str], new: Sequence[str]) -> list[int]:
    """For each line of `new` (0-based), the 0-based line of `old` it comes from.

    Equal lines map to each other; inside a block the rewrite replaced, each new line maps
    to the most similar old line (as `difflib.ndiff` pairs them), in order; added lines map
    to the old line of the next mapped line (an inserted `synchronize()` belongs to the
    statement below it), or of the previous one at the end.
    """
    if list(old) == list(new):
        return list(range(len(new)))
    mapped: list[int | None] = [None] * len(new)
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            mapped[j1:j2] = range(i1, i2)
        elif tag == "replace":
            _pair_similar(old, new, i1, i2, j1, j2, mapped)
    out: list[int] = []
    following: int | None = None
    for j in range(len(new) - 1, -1, -1):  # unmapped lines take the next mapped line's
        if mapped[j] is not None:
            following = mapped[j]
        out.append(
            mapped[j] if mapped[j] is not None else (following if following is not None else -1)
        )
    out.reverse()
    previous = 0
    for j, i in enumerate(out):  # at the end: the last mapped line's
        if i < 0:
            out[j] = previous
        previous = out[j]
    return out


_ASSIGNED = re.compile(r"([A-Za-z_][\w.]*(?:\s*,\s*[A-Za-z_][\w.]*)*)\s*=[^=]")


def _target(line: str) -> str | None:
    """The names a line assigns to (`start` in `start = ...`), if it is an assignment."""
    hit = _ASSIGNED.match(line)
    return hit.group(1).replace(" ", "") if hit else None


# Line pairs less similar than this are not paired inside a replaced block; blocks larger
# than this many line pairs are paired in order (the search is quadratic).
_SIMILAR = 0.5
_PAIRING_LIMIT = 4096


def _pair_similar(
    old: Sequence[str],
    new: Sequence[str],
    i1: int,
    i2: int,
    j1: int,
    j2: int,
    mapped: list[int | None],
) -> None:
    """Pair each line of new[j1:j2] with the most similar line of old[i1:i2], in order."""
    if i1 >= i2 or j1 >= j2:
        return
    if (i2 - i1) * (j2 - j1) > _PAIRING_LIMIT:
        for k in range(j2 - j1):
            mapped[j1 + k] = min(i1 + k, i2 - 1)
        return
    best, best_i, best_j = _SIMILAR, -1, -1
    matcher = difflib.SequenceMatcher(autojunk=False)
    for j in range(j1, j2):
        line = new[j].strip()
        target = _target(line)
        matcher.set_seq2(line)
        for i in range(i1, i2):
            if target is not None and _target(old[i].strip()) == target:
                score = 0.9  # the same variable assigned: `start = ...` stays `start = ...`
            else:
                matcher.set_seq1(old[i].strip())
                if not (matcher.real_quick_ratio() > best and matcher.quick_ratio() > best):
                    continue
                score = matcher.ratio()
            if score > best:
                best, best_i, best_j = score, i, j
    if best_i < 0:
        return
    mapped[best_j] = best_i
    _pair_similar(old, new, i1, best_i, j1, best_j, mapped)
    _pair_similar(old, new, best_i + 1, i2, best_j + 1, j2, mapped)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def remap_positions(
    tree: ast.AST, to_cell: Sequence[int], python: Sequence[str], cell: Sequence[str]
) -> None:
    """Move every node of `tree` (parsed from `python`) to the cell line it came from.

    `to_cell[i]` is the 1-based cell line of python line i+1. On a line whose text differs
    from the cell's line (rewritten, or IPython syntax), a node's columns cover the cell's
    line, so that carets never point past what the traceback shows.
    """

    def columns(py_line: int, cell_line: int) -> tuple[int, int] | None:
        written = cell[cell_line - 1].rstrip("\r\n") if 0 < cell_line <= len(cell) else ""
        ran = python[py_line - 1].rstrip("\r\n") if 0 < py_line <= len(python) else ""
        if written == ran:
            return None
        return _utf8_len(written[: _indent(written)]), _utf8_len(written)

    last = len(to_cell)
    for node in ast.walk(tree):
        lineno = getattr(node, "lineno", None)
        if lineno is None:
            continue
        end = getattr(node, "end_lineno", None) or lineno
        start_line = to_cell[min(lineno, last) - 1]
        end_line = max(to_cell[min(end, last) - 1], start_line)
        node.lineno = start_line  # type: ignore[attr-defined]
        node.end_lineno = end_line  # type: ignore[attr-defined]
        start_cols = columns(lineno, start_line)
        end_cols = columns(end, end_line)
        if start_cols is not None:
            node.col_offset = start_cols[0]  # type: ignore[attr-defined]
        if end_cols is not None and getattr(node, "end_col_offset", None) is not None:
            node.end_col_offset = end_cols[1]  # type: ignore[attr-defined]
        end_col = getattr(node, "end_col_offset", None)
        if end_col is not None and end_line == start_line and end_col < node.col_offset:  # type: ignore[attr-defined]
            node.end_col_offset = node.col_offset  # type: ignore[attr-defined]


# -- syntax errors that look like IPython's own ----------------------------------------------------


class CellSyntaxError(SyntaxError):
    """A syntax error in a `%%tpu` cell, at the cell's own line.

    IPython prints the stack under an error raised inside a magic; for this class the
    extension's handler prints it as IPython prints a syntax error in a cell it compiled
    itself (`error`, the plain SyntaxError, is what is shown).
    """

    error: SyntaxError


class CellIndentationError(IndentationError):
    """`CellSyntaxError` for an IndentationError."""

    error: SyntaxError


# The kernel reports an error by its class name: keep Python's.
CellSyntaxError.__name__ = CellSyntaxError.__qualname__ = "SyntaxError"
CellIndentationError.__name__ = CellIndentationError.__qualname__ = "IndentationError"
CELL_SYNTAX_ERRORS = (CellSyntaxError, CellIndentationError)


def show_cell_syntax_error(
    shell: InteractiveShell, etype: type, value: BaseException, tb: Any, tb_offset: Any = None
) -> None:
    """The shell's handler for `CELL_SYNTAX_ERRORS`: IPython's own display of the error."""
    error = getattr(value, "error", value)
    try:
        raise error.with_traceback(None) from None
    except SyntaxError:
        shell.showsyntaxerror()


def cell_syntax_error(error: SyntaxError, filename: str, line: int, text: str) -> SyntaxError:
    """`error` moved to `line` of the cell registered as `filename`, ready to raise."""
    indentation = isinstance(error, IndentationError)
    same = (error.text or "").rstrip("\r\n") == text and error.offset is not None
    offset = error.offset if same else _indent(text) + 1
    end = (
        error.end_offset if same and error.end_offset and error.end_lineno == error.lineno else None
    )
    details = (filename, line, offset, text + "\n", line, end or offset)
    moved = (IndentationError if indentation else SyntaxError)(error.msg, details)
    wrapped = (CellIndentationError if indentation else CellSyntaxError)(error.msg, details)
    wrapped.error = moved
    return wrapped


# -- a prepared cell ------------------------------------------------------------------------------


@dataclass
class PreparedCell:
    """A cell ready to run: its code, what the rewrite did, and where each line came from.

    `written` is the cell's text as the user wrote it (for `%%tpu`, the body); `rewritten` the
    same after the codemod (IPython syntax kept); `python` what IPython's transforms made of
    it, which is what runs. Lines are the notebook cell's: `header_lines` magic lines sit
    above `written`.
    """

    filename: str
    number: int
    written: str
    rewritten: str
    python: str
    body: CodeType | None
    last: CodeType | None
    silent: bool = False
    rewrite: CellRewrite | None = None
    header_lines: int = 0
    loads: frozenset[str] = frozenset()
    binds: frozenset[str] = frozenset()
    _ran_as: dict[int, list[str]] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return self.rewritten != self.written

    def ran_as(self, line: int) -> str | None:
        """What ran for cell line `line`, when the rewrite changed that line; else None."""
        lines = self._ran_as.get(line)
        return "; ".join(lines) if lines else None


def rewritten_lines(written: str, rewritten: str, header_lines: int) -> dict[int, list[str]]:
    """Cell line -> the rewritten lines that replaced it (only lines the rewrite changed)."""
    if written == rewritten:
        return {}
    old = written.splitlines()
    new = rewritten.splitlines()
    out: dict[int, list[str]] = {}
    for j, i in enumerate(line_map(old, new)):
        if new[j].strip() and (i >= len(old) or new[j] != old[i]):
            out.setdefault(i + 1 + header_lines, []).append(new[j].strip())
    return out


def _leading_blank_lines(cell: str, transformed: str) -> int:
    """Blank lines IPython's transforms dropped from the top of the cell (they shift lines)."""
    raw = cell.splitlines()
    blank = 0
    for line in raw:
        if line.strip():
            break
        blank += 1
    if blank and len(transformed.splitlines()) + blank <= len(raw):
        return blank
    return 0


def cell_map(written: str, rewritten: str, python: str, offset: int) -> list[int] | None:
    """For each line of `python`, the 1-based line of the cell it comes from; None when
    `python` is `written` line for line (only the `offset` magic lines above it differ).

    `python` is what IPython's transforms made of `rewritten`, which the codemod made of
    `written`; `offset` lines (the magic line, leading blank lines) sit above `written`.
    """
    if python == rewritten == written:
        return None
    written_lines = written.splitlines()
    rewritten_lines_ = rewritten.splitlines()
    python_lines = python.splitlines()
    drop = _leading_blank_lines(rewritten, python)
    to_rewritten = line_map(rewritten_lines_[drop:], python_lines)
    to_written = line_map(written_lines, rewritten_lines_)
    last = len(to_written) - 1
    to_cell = (
        [to_written[min(r + drop, last)] + 1 + offset for r in to_rewritten] if last >= 0 else []
    )
    same = len(python_lines) == len(written_lines) and all(
        p == w for p, w in zip(python_lines, written_lines, strict=True)
    )
    if same and not drop and to_cell == list(range(1 + offset, len(python_lines) + 1 + offset)):
        return None
    return to_cell


def compile_cell(
    shell: InteractiveShell,
    *,
    written: str,
    rewritten: str,
    python: str,
    number: int,
    header: Sequence[str] = (),
    rewrite: CellRewrite | None = None,
    filename: str | None = None,
) -> PreparedCell:
    """Parse `python`, map its lines to the cell as written, and compile it.

    `header` are the cell's lines above `written` (`%%tpu ...`); the text registered for
    tracebacks is `header` + `written`. With `filename`, the cell is already registered
    under that name (auto mode: IPython did it) and its entry is replaced. Raises a
    `CellSyntaxError` at the cell's own line when `python` does not parse.
    """
    shown = "".join(line + "\n" for line in header) + written
    if filename is None:
        filename = shell.compile.cache(shown, number, raw_code=shown)
    else:
        linecache.cache[filename] = (len(shown), None, shown.splitlines(keepends=True), filename)
    python_lines = python.splitlines()
    offset = len(header)
    to_cell = cell_map(written, rewritten, python, offset)
    try:
        if to_cell is None:
            tree = shell.compile.ast_parse("\n" * offset + python, filename=filename)
        else:
            tree = shell.compile.ast_parse(python, filename=filename)
    except SyntaxError as err:
        line = err.lineno or 1
        if to_cell is None:
            cell_line = line
        else:
            cell_line = to_cell[min(max(line - 1, 0), len(to_cell) - 1)] if to_cell else 1 + offset
        cell_lines = shown.splitlines()
        text = cell_lines[cell_line - 1] if 0 < cell_line <= len(cell_lines) else ""
        raise cell_syntax_error(err, filename, cell_line, text) from None
    identity = to_cell is None
    silent = _ends_with_semicolon(tree, python_lines, 0 if not identity else offset)
    if not identity:
        remap_positions(tree, to_cell, python_lines, shown.splitlines())
    loads, binds = _names(tree)
    tree = shell.transform_ast(tree)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = shell.compile(ast.Expression(tree.body.pop().value), filename, "eval")
    body = shell.compile(tree, filename, "exec") if tree.body else None
    return PreparedCell(
        filename,
        number,
        written,
        rewritten,
        python,
        body,
        last,
        silent=silent,
        rewrite=rewrite,
        header_lines=offset,
        loads=loads,
        binds=binds,
        _ran_as=rewritten_lines(written, rewritten, offset),
    )


def _ends_with_semicolon(tree: ast.Module, lines: Sequence[str], shift: int) -> bool:
    """Whether the cell's last expression is followed by `;` (IPython then shows nothing)."""
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return False
    node = tree.body[-1]
    index = (node.end_lineno or node.lineno) - 1 - shift
    if not 0 <= index < len(lines):
        return False
    rest = lines[index].encode("utf-8", "surrogatepass")[node.end_col_offset or 0 :]
    return rest.decode("utf-8", "surrogatepass").lstrip().startswith(";")


def _names(tree: ast.AST) -> tuple[frozenset[str], frozenset[str]]:
    """Names the cell reads anywhere, and names its top level binds."""
    loads: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            loads.add(node.id)
    binds: set[str] = set()
    if isinstance(tree, ast.Module):
        for stmt in tree.body:
            binds.update(_bound_by(stmt))
    return frozenset(loads), frozenset(binds)


def _bound_by(stmt: ast.stmt) -> set[str]:
    """Names a top-level statement binds (assignments, loops, imports, definitions, with),
    not those bound inside the functions, classes and comprehensions it defines."""
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {stmt.name}
    if isinstance(stmt, ast.Import | ast.ImportFrom):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    found: set[str] = set()
    scopes = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.comprehension)
    stack: list[ast.AST] = [stmt]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.add(node.name)
            continue
        elif isinstance(node, ast.Import | ast.ImportFrom):
            found.update((a.asname or a.name).split(".")[0] for a in node.names)
        if isinstance(node, scopes):
            continue
        stack.extend(ast.iter_child_nodes(node))
    return found


# -- running --------------------------------------------------------------------------------------


def execute(prepared: PreparedCell, namespace: dict[str, Any]) -> Any:
    """Run the prepared code once in `namespace`; the last expression's value."""
    __tracebackhide__ = True  # noqa: F841  (IPython hides this frame in tracebacks)
    if prepared.body is not None:
        exec(prepared.body, namespace)
    if prepared.last is not None:
        value = eval(prepared.last, namespace)
        return None if prepared.silent else value
    return None


def add_notes(
    error: BaseException, cells: Iterable[PreparedCell], backend: Backend | None = None
) -> None:
    """Say what really ran at the failing line of a rewritten cell, and what the backend
    knows about the failure, as notes on the error (shown under its message)."""
    by_name = {c.filename: c for c in cells}
    innermost: tuple[PreparedCell, int] | None = None
    tb = error.__traceback__
    while tb is not None:
        cell = by_name.get(tb.tb_frame.f_code.co_filename)
        if cell is not None:
            innermost = (cell, tb.tb_lineno)
        tb = tb.tb_next
    notes = list(getattr(error, "__notes__", ()))
    if innermost is not None:
        cell, line = innermost
        ran = cell.ran_as(line)
        if ran:
            note = f"gpu2tpu: line {line} of In[{cell.number}] ran rewritten as: {ran}"
            if note not in notes:
                error.add_note(note)
    if backend is not None:
        source = innermost[0].rewritten if innermost is not None else None
        note = backend.explain_failure(error, source)
        if note and note not in notes:
            error.add_note(note)


# -- what the magics say before a cell runs -------------------------------------------------------


def problem_lines(rewrite: CellRewrite | None, offset: int = 0) -> list[str]:
    """One line per thing the rewrite could not migrate: its cell line, what, and the code."""
    if rewrite is None:
        return []
    out: list[str] = []
    for f in rewrite.findings:
        text = f"gpu2tpu: line {f.line + offset}: {f.message} ({f.code})"
        if text not in out:
            out.append(text)
    if rewrite.error and not rewrite.error.startswith("syntax error"):
        out.append(f"gpu2tpu: the cell runs as written, not rewritten: {rewrite.error}")
    return out


def say(lines: Iterable[str]) -> None:
    """Write the lines to stderr, where Jupyter shows warnings."""
    text = "".join(line + "\n" for line in lines)
    if text:
        sys.stderr.write(text)
        sys.stderr.flush()


def stale_devices(
    namespace: dict[str, Any], names: Iterable[str], backend: Backend
) -> list[tuple[str, Any]]:
    """Variables among `names` that hold a CUDA device on a machine without CUDA.

    A cell that ran without gpu2tpu (before `%tpu_auto on`, or outside `%%tpu`) may have set
    `device = torch.device("cuda")`; a rewritten cell that reads it would still go to CUDA.
    Returns (name, the value to use instead): the backend's device, as a string where the
    variable held a string.
    """
    if backend.name == "cuda" or "torch" not in sys.modules:
        return []
    import torch

    found: list[tuple[str, Any]] = []
    for name in sorted(names):
        value = namespace.get(name)
        cuda = (isinstance(value, torch.device) and value.type == "cuda") or (
            isinstance(value, str) and _CUDA_STRING.fullmatch(value) is not None
        )
        if not cuda:
            continue
        if torch.cuda.is_available():
            return []
        device = backend.device()
        found.append((name, str(device) if isinstance(value, str) else device))
    return found


def replace_stale_devices(
    namespace: dict[str, Any], names: Iterable[str], backend: Backend
) -> list[str]:
    """Rebind stale CUDA device variables to the backend's device; one line each, to say."""
    out = []
    for name, replacement in stale_devices(namespace, names, backend):
        old = namespace[name]
        namespace[name] = replacement
        out.append(
            f"gpu2tpu: `{name}` holds {old!r} from a cell that ran without the rewrite, and this "
            f"machine has no CUDA: it now holds {replacement!r} ({backend.name})"
        )
    return out


# -- what earlier cells imported ------------------------------------------------------------------


def prior_imports(shell: InteractiveShell) -> tuple[str, ...]:
    """Import statements that ran before this cell, as the notebook rewriter collects them
    from earlier cells: the top-level imports of the cells in IPython's input history, and
    an import for every torch module the namespace binds (cells run without history)."""
    ns = shell.user_ns
    lines: dict[str, None] = {}
    history = ns.get("In")
    if isinstance(history, list):
        for text in history:
            if isinstance(text, str) and "import" in text:
                lines.update(dict.fromkeys(_top_level_imports(text)))
    for name, value in list(ns.items()):
        module = getattr(value, "__name__", None)
        if not isinstance(value, ModuleType) or not isinstance(module, str):
            continue
        if (module == "torch" or module.startswith("torch.")) and name.isidentifier():
            if not name.startswith("_"):
                line = f"import {module}" if name == module else f"import {module} as {name}"
                lines.setdefault(line, None)
    return tuple(lines)


@functools.lru_cache(maxsize=1024)
def _top_level_imports(text: str) -> tuple[str, ...]:
    """A cell's top-level import statements, one line each (IPython's parsed history is
    Python, with magics already turned into calls)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return ()
    return tuple(
        ast.unparse(node)
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom)
        and not (isinstance(node, ast.ImportFrom) and node.module == "__future__")
    )


def has_ipython_syntax(text: str) -> bool:
    """Whether the text may hold IPython syntax (a `%`, `!` or `?`, or an autocall line)."""
    return _IPYTHON_SYNTAX.search(text) is not None
