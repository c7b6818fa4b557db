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
import contextlib
import difflib
import functools
import inspect
import linecache
import os
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, ModuleType, TracebackType
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from ..backends import Backend
    from ..rewrite.notebooks.notebook import CellRewrite

# The variable rewritten cells use for the device; another name when the user has one of
# their own that is not a device.
DEVICE_VARIABLE = "device"
FALLBACK_DEVICE_VARIABLE = "tpu_device"
_CUDA_STRING = re.compile(r"cuda(:\d+)?")
_LINE_IN_MESSAGE = re.compile(r"\bline (\d+)\b")
_DEVICE_NAME = re.compile(r"(?i)(\w*_)?dev(ice)?(_\w*)?")


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
    for tag, i1, i2, j1, j2 in _opcodes(old, new):
        if tag == "equal" or tag == "replace" and i2 - i1 == j2 - j1:
            mapped[j1:j2] = range(i1, i2)
        elif tag == "replace":
            _pair_similar(old, new, i1, i2, j1, j2, mapped)
    out: list[int] = []
    following: int | None = None
    for j in range(len(new) - 1, -1, -1):  # unmapped lines take the next mapped line's
        here = mapped[j]
        if here is not None:
            following = here
        out.append(here if here is not None else (following if following is not None else -1))
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


# How far apart two equal lines may be for the quick alignment to pair them.
_RESYNC = 12


def _opcodes(old: Sequence[str], new: Sequence[str]) -> list[tuple[str, int, int, int, int]]:
    """`SequenceMatcher.get_opcodes()` for a rewrite: most lines are kept, changes are local.

    A linear walk pairs equal lines and, at a difference, resumes at the nearest pair of
    equal lines within `_RESYNC` lines on each side; when it finds none (a cell rewritten
    throughout), difflib's matcher does the whole alignment.
    """
    out: list[tuple[str, int, int, int, int]] = []
    i = j = 0
    while i < len(old) and j < len(new):
        if old[i] == new[j]:
            start_i, start_j = i, j
            while i < len(old) and j < len(new) and old[i] == new[j]:
                i += 1
                j += 1
            out.append(("equal", start_i, i, start_j, j))
            continue
        found = None
        for distance in range(1, 2 * _RESYNC + 1):
            for a in range(max(0, distance - _RESYNC), min(distance, _RESYNC) + 1):
                b = distance - a
                if i + a < len(old) and j + b < len(new) and old[i + a] == new[j + b]:
                    found = (a, b)
                    break
            if found:
                break
        if found is None:
            if len(old) - i > _RESYNC and len(new) - j > _RESYNC:
                matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
                return cast(list[tuple[str, int, int, int, int]], matcher.get_opcodes())
            break
        a, b = found
        out.append(("replace" if a and b else ("insert" if b else "delete"), i, i + a, j, j + b))
        i, j = i + a, j + b
    if i < len(old) or j < len(new):
        tag = (
            "replace" if i < len(old) and j < len(new) else ("insert" if j < len(new) else "delete")
        )
        out.append((tag, i, len(old), j, len(new)))
    return out


_WORD = re.compile(r"\w+")


def _words(line: str) -> frozenset[str]:
    return frozenset(_WORD.findall(line))


# Line pairs that share less than this share of their words are not paired inside a replaced
# block; blocks larger than this many line pairs are paired in order (the search is
# quadratic).
_SIMILAR = 0.3
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
    if i2 - i1 == 1:  # one line became several (a guard around a call): all come from it
        mapped[j1:j2] = [i1] * (j2 - j1)
        return
    if (i2 - i1) * (j2 - j1) > _PAIRING_LIMIT:
        for k in range(j2 - j1):
            mapped[j1 + k] = min(i1 + k, i2 - 1)
        return
    best, best_i, best_j = _SIMILAR, -1, -1
    olds = [(_target(old[i].strip()), _words(old[i])) for i in range(i1, i2)]
    for j in range(j1, j2):
        target, words = _target(new[j].strip()), _words(new[j])
        for k, (old_target, old_words) in enumerate(olds):
            if target is not None and old_target == target:
                score = 0.9  # the same variable assigned: `start = ...` stays `start = ...`
            elif words and old_words:
                score = len(words & old_words) / len(words | old_words)
            else:
                continue
            if score > best:
                best, best_i, best_j = score, i1 + k, j
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
    tree: ast.Module,
    to_cell: Sequence[int] | None,
    python: Sequence[str],
    cell: Sequence[str],
    offset: int = 0,
) -> None:
    """Move the nodes of `tree` (parsed from `python`) to the cell lines they came from.

    `to_cell[i]` is the 1-based cell line of python line i+1; None when the lines only
    shifted by `offset` (the tree was parsed with them already shifted). On a line whose
    text differs from the cell's line (rewritten, or IPython syntax), a node's columns cover
    the cell's line, so that carets never point past what the traceback shows. Statements
    that need neither are not visited.
    """
    count = len(python)
    lines = list(to_cell) if to_cell is not None else [i + 1 + offset for i in range(count)]
    shift = offset if to_cell is None else 0

    def written(cell_line: int) -> str:
        return cell[cell_line - 1].rstrip("\r\n") if 0 < cell_line <= len(cell) else ""

    # per python line (1-based, unshifted): the cell line's (start, end) columns when changed
    columns: dict[int, tuple[int, int]] = {}
    for i, text in enumerate(python, 1):
        target = lines[i - 1] if i <= len(lines) else lines[-1] if lines else 1
        shown = written(target)
        if text.rstrip("\r\n") != shown:
            columns[i] = (_utf8_len(shown[: _indent(shown)]), _utf8_len(shown))
    last = len(lines)
    for stmt in tree.body:
        first_line = stmt.lineno - shift
        end_line = (stmt.end_lineno or stmt.lineno) - shift
        if to_cell is None and not any(i in columns for i in range(first_line, end_line + 1)):
            continue  # nothing moved, nothing rewritten: its positions are right already
        for node in ast.walk(stmt):
            lineno = getattr(node, "lineno", None)
            if lineno is None:
                continue
            py_start = lineno - shift
            py_end = (node.end_lineno or lineno) - shift  # type: ignore[attr-defined]  # a node of Python's tree with a position
            if to_cell is not None:
                start = lines[min(max(py_start, 1), last) - 1]
                node.lineno = start  # type: ignore[attr-defined]  # a node of Python's tree with a position
                node.end_lineno = max(lines[min(max(py_end, 1), last) - 1], start)  # type: ignore[attr-defined]  # a node of Python's tree with a position
            start_cols = columns.get(py_start)
            end_cols = columns.get(py_end)
            if start_cols is not None:
                node.col_offset = start_cols[0]  # type: ignore[attr-defined]  # a node of Python's tree with a position
            if end_cols is not None and node.end_col_offset is not None:  # type: ignore[attr-defined]  # a node of Python's tree with a position
                node.end_col_offset = end_cols[1]  # type: ignore[attr-defined]  # a node of Python's tree with a position
            if (
                node.end_col_offset is not None  # type: ignore[attr-defined]  # a node of Python's tree with a position
                and node.end_lineno == node.lineno  # type: ignore[attr-defined]  # a node of Python's tree with a position
                and node.end_col_offset < node.col_offset  # type: ignore[attr-defined]  # a node of Python's tree with a position
            ):
                node.end_col_offset = node.col_offset  # type: ignore[attr-defined]  # a node of Python's tree with a position


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
    _ran_as: dict[int, list[str]] | None = field(default=None, repr=False)

    @property
    def changed(self) -> bool:
        return self.rewritten != self.written

    def ran_as(self, line: int) -> str | None:
        """What ran for cell line `line`, when the rewrite changed that line; else None."""
        if self._ran_as is None:  # worked out when an error asks, not for every cell
            self._ran_as = rewritten_lines(self.written, self.rewritten, self.header_lines)
        lines = self._ran_as.get(line)
        return "; ".join(lines) if lines else None

    @functools.cached_property
    def binds(self) -> frozenset[str]:
        """Names the cell's top level binds (asked by `%%tpu --forecast` only)."""
        try:
            tree = ast.parse(self.python)
        except (SyntaxError, ValueError, RecursionError):
            return frozenset()
        return frozenset(name for stmt in tree.body for name in _bound_by(stmt))


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


def leading_blank_lines(cell: str, transformed: str) -> int:
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
    """For each line of `python`, the 1-based line of the cell it comes from; None when each
    python line i comes from cell line i + `offset` (line counts kept).

    `python` is what IPython's transforms made of `rewritten`, which the codemod made of
    `written`; `offset` lines (the magic line, leading blank lines) sit above `written`.
    """
    if python == rewritten == written:
        return None
    written_lines = written.splitlines()
    rewritten_text = rewritten.splitlines()
    python_lines = python.splitlines()
    drop = leading_blank_lines(rewritten, python)
    to_rewritten = line_map(rewritten_text[drop:], python_lines)
    to_written = line_map(written_lines, rewritten_text)
    last = len(to_written) - 1
    if last < 0:
        return [1 + offset] * len(python_lines)
    to_cell = [to_written[min(r + drop, last)] + 1 + offset for r in to_rewritten]
    if to_cell == list(range(1 + offset, len(python_lines) + 1 + offset)):
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
        if to_cell is None:  # lines in place: the parser shifts them below the header
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
    silent = _ends_with_semicolon(tree, python_lines, offset if to_cell is None else 0)
    if to_cell is not None or python != written:
        remap_positions(tree, to_cell, python_lines, shown.splitlines(), offset)
    tree = shell.transform_ast(tree)
    last = None
    # Top-level `await` compiles as IPython compiles a cell (autoawait on): `execute` runs it.
    awaits = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT if getattr(shell, "autoawait", False) else 0
    with shell.compile.extra_flags(awaits):
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


def execute(prepared: PreparedCell, namespace: dict[str, Any], loop_runner: Any = None) -> Any:
    """Run the prepared code once in `namespace`; the last expression's value. Code with a
    top-level `await` is a coroutine, run by `loop_runner` (the shell's: IPython runs an
    async cell so)."""
    __tracebackhide__ = True  # IPython hides this frame in tracebacks
    if prepared.body is not None:
        if prepared.body.co_flags & inspect.CO_COROUTINE:
            _await(eval(prepared.body, namespace), loop_runner)
        else:
            exec(prepared.body, namespace)
    if prepared.last is not None:
        value = eval(prepared.last, namespace)
        if prepared.last.co_flags & inspect.CO_COROUTINE:
            value = _await(value, loop_runner)
        return None if prepared.silent else value
    return None


def _await(coroutine: Any, loop_runner: Any) -> Any:
    """Run a cell's coroutine to its end with the shell's loop runner, as IPython runs an
    async cell; in a Jupyter kernel, whose event loop is running the magic itself and cannot
    wait on a second task, say why instead."""
    __tracebackhide__ = True
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        if loop_runner is not None:
            return loop_runner(coroutine)
    coroutine.close()
    raise RuntimeError(
        "gpu2tpu: top-level `await` in a %%tpu cell cannot run while an event loop runs the "
        "cell (a Jupyter kernel's does); `%tpu_auto on` runs such a cell as IPython does"
    )


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
        explained = backend.explain_failure(error, source)
        if explained and explained not in notes:
            error.add_note(explained)


def diff_text(written: str, rewritten: str, label: str, backend: str) -> str:
    """A unified diff of the cell as written and as it runs on `backend` (its name)."""
    lines = difflib.unified_diff(
        written.splitlines(keepends=True),
        rewritten.splitlines(keepends=True),
        fromfile=f"{label} (as written)",
        tofile=f"{label} (as run on {backend})",
    )
    text = "".join(line if line.endswith("\n") else line + "\n" for line in lines)
    return text or f"{label}: nothing to rewrite\n"


# -- tracebacks with the user's frames only ----------------------------------------------------------

_SITE_PARTS = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")
_GPU2TPU_DIR = str(Path(__file__).resolve().parent.parent) + os.sep


def show_user_frames(error: BaseException, shell: InteractiveShell) -> None:
    """Have IPython show only the user's frames of `error`: the notebook's cells and its
    local modules, not torch's, gpu2tpu's or IPython's. A note says how many frames were
    left out and where; `%xmode Verbose` shows every frame.

    Uses the hook IPython offers exceptions for their own display (`_render_traceback_`),
    so the error itself, its notes and its full `__traceback__` are unchanged.
    """
    if getattr(error, "_render_traceback_", None) is not None:
        return  # the error renders itself (or was given this already)

    def render() -> list[str]:
        formatter = shell.InteractiveTB
        full = error.__traceback__
        if getattr(formatter, "mode", "") != "Verbose":
            kept, hidden = user_frames(full, shell)
            if kept is not None:
                note = _hidden_note(hidden)
                added = note is not None and note not in getattr(error, "__notes__", ())
                if note is not None and added:
                    error.add_note(note)
                try:
                    return formatter.structured_traceback(type(error), error, kept, tb_offset=0)
                finally:
                    if note is not None and added:  # shown in this rendering only
                        error.__notes__.remove(note)
        return formatter.structured_traceback(type(error), error, full, tb_offset=1)

    with contextlib.suppress(AttributeError, TypeError):  # a type that takes no attributes
        error._render_traceback_ = render  # type: ignore[attr-defined]  # IPython reads _render_traceback_ off the exception


def user_frames(tb: TracebackType | None, shell: Any) -> tuple[TracebackType | None, list[str]]:
    """A traceback of the user's frames of `tb` only, and the files of the frames left out
    below the first one kept. None when no frame is the user's (then nothing is left out).

    The frame of the cell that hands a cell magic its body (`get_ipython().run_cell_magic(...)`)
    is IPython's, not the user's: the body's own frames follow.
    """
    from IPython.core.interactiveshell import InteractiveShell

    from ..readiness.user_code import UserCode, cell_labels

    code = UserCode(cell_labels(shell))
    dispatch = InteractiveShell.run_cell_magic.__code__
    kept: list[TracebackType] = []
    hidden: list[str] = []
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        magic_line = tb.tb_next is not None and tb.tb_next.tb_frame.f_code is dispatch
        if code.label(filename) is not None and not magic_line:
            kept.append(tb)
        elif kept:
            hidden.append(filename)
        tb = tb.tb_next
    if not kept:
        return None, []
    chain = None
    for item in reversed(kept):
        chain = TracebackType(chain, item.tb_frame, item.tb_lasti, item.tb_lineno)
    return chain, hidden


def _hidden_note(hidden: list[str]) -> str | None:
    if not hidden:
        return None
    packages = list(dict.fromkeys(_package(f) for f in hidden))
    where = packages[0] if len(packages) == 1 else f"{', '.join(packages[:-1])} and {packages[-1]}"
    count = f"{len(hidden)} frame{'s' * (len(hidden) != 1)}"
    return f"gpu2tpu: {count} inside {where} not shown (`%xmode Verbose` shows every frame)"


def _package(filename: str) -> str:
    """The installed package a frame's file belongs to ("torch"), for the note."""
    if filename.startswith(_GPU2TPU_DIR):
        return "gpu2tpu"
    for part in _SITE_PARTS:
        if part in filename:
            top = filename.split(part, 1)[1].split(os.sep, 1)[0]
            return top.removesuffix(".py")
    return "Python's library" if filename.startswith(sys.base_prefix) else "library code"


# -- what the magics say before a cell runs -------------------------------------------------------


def problem_lines(rewrite: CellRewrite | None, offset: int = 0) -> list[str]:
    """One line per thing the rewrite could not migrate: its cell line, what, and the code."""
    if rewrite is None:
        return []
    out: list[str] = []
    for f in rewrite.findings:
        message = f.message
        if offset:  # "the `for` loop at line 3" counts from the first line under the magic
            message = _LINE_IN_MESSAGE.sub(lambda m: f"line {int(m[1]) + offset}", message)
        text = f"gpu2tpu: line {f.line + offset}: {message} ({f.code})"
        if text not in out:
            out.append(text)
    if rewrite.error and not rewrite.error.startswith("syntax error"):
        out.append(f"gpu2tpu: the cell runs as written, not rewritten: {rewrite.error}")
    return out


def zero_count_lines(rewrite: CellRewrite | None, offset: int, device_type: str) -> list[str]:
    """Where the cell scales a size by the device count (G2T116) and this kernel has no
    accelerator, one line per place saying the count is 0 here, as the cell runs."""
    if rewrite is None or device_type != "cpu":
        return []
    lines = sorted({f.line + offset for f in rewrite.findings if f.code == "G2T116"})
    return [
        f"gpu2tpu: line {line}: the device count is 0 in this kernel (no accelerator), so "
        "what it scales is 0 here (G2T116)"
        for line in lines
    ]


def local_module_lines(python: str, offset: int, said: set[tuple[str, int]]) -> list[str]:
    """One line per local module the cell imports that holds CUDA code (G2T519, as `gpu2tpu
    rewrite` reports it for a notebook), with the command that migrates it: `%%tpu` and
    `%tpu_auto` rewrite cells, not the modules they import. `python` is the cell as IPython
    runs it, `offset` the magic lines above it; `said` holds the modules already named this
    session (by path and modification time), which are not named again."""
    import importlib.util

    from ..readiness.user_code import UserCode
    from ..rewrite.core.model import Options
    from ..rewrite.notebooks.notebook import imported_modules, module_file, module_with_cuda

    local = UserCode(cells={})
    out = []
    for dotted, line, _col in imported_modules(python):
        top, _, rest = dotted.partition(".")
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.origin or local.label(spec.origin) is None:
            continue
        folder = Path(spec.origin).parent
        path = module_file(folder, rest) if rest and spec.submodule_search_locations else None
        path = path or Path(spec.origin)
        try:
            key = (str(path), path.stat().st_mtime_ns)
        except OSError:
            continue
        if key in said:
            continue
        module = module_with_cuda(path, Options(fix=False))
        if module is None:
            continue
        said.add(key)
        shown = local.label(str(path)) or path.name
        out.append(
            f"gpu2tpu: line {line + offset}: {module.describe(shown)} and runs as written: "
            f"%%tpu and %tpu_auto rewrite cells, not the modules they import; "
            f"`gpu2tpu rewrite {shown}` migrates it (then restart the kernel) (G2T519)"
        )
    return out


def say(lines: Iterable[str]) -> None:
    """Write the lines to stderr, where Jupyter shows warnings."""
    text = "".join(line + "\n" for line in lines)
    if text:
        sys.stderr.write(text)
        sys.stderr.flush()


def stale_devices(namespace: dict[str, Any], text: str, backend: Backend) -> list[tuple[str, Any]]:
    """Variables the cell's `text` uses that hold a CUDA device on a machine without CUDA.

    A cell that ran without gpu2tpu (before `%tpu_auto on`, or outside `%%tpu`) may have set
    `device = torch.device("cuda")`; a rewritten cell that reads it would still go to CUDA.
    A `torch.device` of type cuda counts under any name; a string ("cuda", "cuda:0") only
    under a device-like name (`device`, `dev`, `*_device`), since other strings that say
    "cuda" may mean something else. Returns (name, the value to use instead): the backend's
    device, as a string where the variable held a string.
    """
    if backend.name == "cuda":
        return []
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    found = []
    for name, value in list(namespace.items()):
        if isinstance(value, torch.device):
            cuda = value.type == "cuda"
        elif isinstance(value, str) and _DEVICE_NAME.fullmatch(name):
            cuda = _CUDA_STRING.fullmatch(value) is not None
        else:
            continue
        if cuda and not name.startswith("_") and re.search(rf"\b{re.escape(name)}\b", text):
            found.append((name, value))
    if not found or torch.cuda.is_available():
        return []
    device = backend.device()
    return [(n, str(device) if isinstance(v, str) else device) for n, v in sorted(found)]


def replace_stale_devices(namespace: dict[str, Any], text: str, backend: Backend) -> list[str]:
    """Rebind stale CUDA device variables to the backend's device; one line each, to say."""
    out = []
    for name, replacement in stale_devices(namespace, text, backend):
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
