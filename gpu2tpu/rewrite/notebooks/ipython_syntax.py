"""IPython syntax in a notebook cell: find it as IPython does, mask it, put it back exactly.

A code cell is Python plus IPython's own syntax (`%magic`, `%%cell_magic`, `!shell`,
`x = !cmd`, `obj?`, ...). libcst parses only Python, so before the cell is rewritten every piece
of IPython syntax is replaced by a Python line that carries a token found nowhere in the cell,
and after the rewrite each token's line is replaced by the original text again. One physical
line in, one physical line out, so findings keep the cell's own line numbers.

The pieces are found with IPython's own token transformers (`IPython.core.inputtransformer2`),
in IPython's order, so that exactly what IPython treats as special syntax is masked and nothing
else (a `%` inside a string or a comment stays Python). The masks:

- `%matplotlib inline`, `!pip install x \\` + continuation, `obj?`: `import <token>` per line,
  at the line's indentation. An import statement is valid anywhere a statement is, and it keeps
  the device definition (inserted after a cell's leading imports) below leading magics.
- `files = !ls`, `out = %env`: `files = <token>`, keeping the assigned name visible.
- `%time y = x.cuda()` (and `%timeit`, `%prun`): the Python is kept and rewritten; the magic
  and its options are cut off and put back, and the line ends with `  # <token>`.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from ..analysis.lines import python_lines

if TYPE_CHECKING:
    from IPython.core.inputtransformer2 import TokenTransformBase


class IPythonMissing(ValueError):
    """IPython is not installed, so a notebook's IPython syntax cannot be found exactly."""


class _LazyInputTransformer:
    """`IPython.core.inputtransformer2`, imported on first use: `pip install gpu2tpu` (the
    codemod alone) comes without IPython, and `gpu2tpu check`/`rules` on `.py` files must work
    there; a notebook then gets one error line naming the install command."""

    _module: ModuleType | None = None

    def __getattr__(self, name: str) -> Any:
        if self._module is None:
            try:
                from IPython.core import inputtransformer2
            except ModuleNotFoundError as err:
                if (err.name or "").split(".")[0] != "IPython":
                    raise
                raise IPythonMissing(
                    "reading a notebook needs IPython, which is not installed: "
                    "pip install ipython (or pip install 'gpu2tpu[notebook]'); file left as it is"
                ) from None
            type(self)._module = inputtransformer2
        return getattr(self._module, name)


it2 = _LazyInputTransformer()

# Cell magics whose body is Python that runs in the notebook's namespace (rewritten);
# `timeit` runs its body inside a timing function, so what it defines does not persist.
PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun", "tpu"})
SCOPED_CELL_MAGICS = frozenset({"timeit"})

# Line magics whose argument, after their options, is Python: (getopt short options, long).
PYTHON_LINE_MAGICS: dict[str, tuple[str, tuple[str, ...]]] = {
    "time": ("", ("no-raise-error",)),
    "timeit": ("n:r:tcp:qov:", ()),
    "prun": ("D:l:rs:T:q", ()),
}

Kind = Literal["line_magic", "shell", "shell_capture", "help", "autocall"]

_NEWLINE = re.compile(r"\r\n|\r|\n")
# Every piece of IPython syntax holds one of these: `%` (magics), `!` (shell), `?` (help),
# or starts a line with an autocall escape (`/`, `,`, `;`). A cell without any is Python.
_SPECIAL = re.compile(r"[%!?]|^[ \t]*[/,;]", re.MULTILINE)


class MaskError(ValueError):
    """A cell's IPython syntax could not be masked or put back; carries a one-line reason."""

    def __init__(self, reason: str, line: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.line = line


def line_ending(line: str) -> str:
    hit = _NEWLINE.search(line)
    return hit.group(0) if hit else ""


def _body(line: str) -> str:
    return line[: len(line) - len(line_ending(line))]


@dataclass(frozen=True)
class CellMagic:
    """A `%%name args` cell: `head` is everything before the body (leading blank lines and the
    magic line with its newline); `head_lines` is its number of lines."""

    head: str
    name: str
    args: str
    body: str
    head_lines: int


def split_cell_magic(source: str) -> CellMagic | None:
    """The cell magic of a cell, if it has one (IPython's rule: the first non-blank line)."""
    lines = python_lines(source)
    i = next((n for n, line in enumerate(lines) if line.strip()), None)
    if i is None:
        return None
    first = lines[i]
    if not first.startswith("%%") or re.match(r"%%\w+\?", first):
        return None
    name, _, args = _body(first)[2:].rstrip().partition(" ")
    head = "".join(lines[: i + 1])
    return CellMagic(head, name, args, source[len(head) :], i + 1)


@dataclass(frozen=True)
class Escape:
    """One piece of IPython syntax in a cell.

    `line`/`col` are 1-based and point at the escape character (`%`, `!`, ...), or at the
    start of the line for `obj?`. `command` is the text after the escape with backslash
    continuations joined (`pip install x`, `env CUDA_VISIBLE_DEVICES=0`); `magic` is the
    magic's name for line magics. `python` is True when the Python in it is rewritten.
    """

    kind: Kind
    line: int
    col: int
    end_line: int
    command: str
    magic: str = ""
    python: bool = False


@dataclass(frozen=True)
class _Restore:
    masked_prefix: str  # python magics: the text the masked line starts with
    original_prefix: str  # python magics: what replaces it (indent, target, magic, options)
    masked: str  # opaque lines: the whole masked line, without its ending
    original: str  # opaque lines: the original line, without its ending
    python: bool


@dataclass
class MaskedCell:
    """A cell's source with its IPython syntax masked; `unmask` reverses it after a rewrite."""

    source: str
    text: str
    escapes: tuple[Escape, ...]
    token_prefix: str
    _restore: dict[int, _Restore] = field(default_factory=dict)
    _col_shift: dict[int, int] = field(default_factory=dict)

    def column_shift(self, line: int) -> int:
        """Columns to add to a position on (1-based, input) `line` to point into the source."""
        return self._col_shift.get(line, 0)

    def unmask(self, new_text: str) -> str:
        """Put the IPython syntax back into the rewritten masked text."""
        if not self._restore:
            return new_text
        token = re.compile(re.escape(self.token_prefix) + r"(\d+)")
        out: list[str] = []
        seen: set[int] = set()
        for line in python_lines(new_text):
            hit = token.search(line)
            if hit is None:
                out.append(line)
                continue
            key = int(hit.group(1))
            entry = self._restore.get(key)
            text, ending = _body(line), line_ending(line)
            if entry is None or key in seen:
                raise MaskError("the rewrite moved IPython syntax; the cell is left as it was")
            seen.add(key)
            if entry.python:
                suffix = f"  # {self.token_prefix}{key}"
                if not (text.startswith(entry.masked_prefix) and text.endswith(suffix)):
                    raise MaskError("the rewrite changed a line magic; the cell is left as it was")
                middle = text[len(entry.masked_prefix) : len(text) - len(suffix)]
                out.append(entry.original_prefix + middle + ending)
            else:
                if text != entry.masked:
                    raise MaskError(
                        "the rewrite changed IPython syntax; the cell is left as it was"
                    )
                out.append(entry.original + ending)
        if seen != set(self._restore):
            raise MaskError("the rewrite dropped IPython syntax; the cell is left as it was")
        return "".join(out)


def _token_prefix(source: str) -> str:
    n = 0
    while f"_g2t{n}_" in source:
        n += 1
    return f"_g2t{n}_"


def python_start(args: str, shortopts: str, longopts: tuple[str, ...]) -> int | None:
    """Offset in `args` where the Python starts after a magic's options, as getopt reads them.

    None when an option is unknown (IPython would refuse the line) or no Python follows.
    """
    pos = 0
    while True:
        while pos < len(args) and args[pos] in " \t":
            pos += 1
        end = pos
        while end < len(args) and args[end] not in " \t":
            end += 1
        word = args[pos:end]
        if not word.startswith("-") or word == "-":
            break
        if word == "--":
            pos = end
            break
        if word.startswith("--"):
            if word[2:].split("=", 1)[0] not in longopts:
                return None
            pos = end
            continue
        i, needs_value = 1, False
        while i < len(word):
            spec = shortopts.find(word[i])
            if word[i] == ":" or spec < 0:
                return None
            if shortopts[spec + 1 : spec + 2] == ":":
                needs_value = i + 1 == len(word)
                break
            i += 1
        pos = end
        if needs_value:
            while pos < len(args) and args[pos] in " \t":
                pos += 1
            while pos < len(args) and args[pos] not in " \t":
                pos += 1
    while pos < len(args) and args[pos] in " \t":
        pos += 1
    return pos if pos < len(args) else None


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


_TRANSFORMERS = ("MagicAssign", "SystemAssign", "EscapedCommand", "HelpEnd")


def _next_escape(lines: list[str]) -> TokenTransformBase | None:
    """IPython's next piece of special syntax in `lines`, in IPython's own order."""
    tokens = it2.make_tokens_by_line(lines)
    classes = [getattr(it2, name) for name in _TRANSFORMERS]
    found = [t for t in (cls.find(tokens) for cls in classes) if t is not None]
    for candidate in sorted(found, key=it2.TokenTransformBase.sortby):
        try:
            candidate.transform(list(lines))
        except SyntaxError:
            continue
        return candidate
    return None


def mask(source: str, *, python_magics: bool = True) -> MaskedCell:
    """Mask every piece of IPython syntax in a cell without a cell magic.

    With `python_magics`, the Python inside `%time`/`%timeit`/`%prun` stays visible to the
    rewrite; otherwise those lines are masked whole like any other magic.
    """
    prefix = _token_prefix(source)
    if _SPECIAL.search(source) is None:  # plain Python: nothing for IPython's tokenizer to find
        return MaskedCell(source, source, (), prefix)
    original = python_lines(source)
    # IPython's finders expect "\n" (Jupyter sends nothing else); CRLF is put back at the end
    work = [_body(line) + ("\n" if line_ending(line) else "") for line in original]
    cell = MaskedCell(source, source, (), prefix)
    escapes: list[Escape] = []
    counter = 0
    for _ in range(it2.TRANSFORM_LOOP_LIMIT):
        found = _next_escape(work)
        if found is None:
            break
        start, col = found.start_line, found.start_col
        if isinstance(found, it2.HelpEnd):
            end = found.q_line
        else:
            end = it2.find_end_of_continued_line(work, start)
        lead = work[start][:col]
        indent = lead[: len(lead) - len(lead.lstrip(" \t"))]
        rest = it2.assemble_continued_line(work, (start, col), end)
        kind, command, magic = _describe(found, rest)
        is_python = False
        if python_magics and kind == "line_magic" and magic in PYTHON_LINE_MAGICS and start == end:
            shortopts, longopts = PYTHON_LINE_MAGICS[magic]
            text = _body(work[start])
            args_at = col + 1 + len(magic)
            offset = python_start(text[args_at:], shortopts, longopts)
            if offset is not None and _parses(text[args_at + offset :].strip()):
                code_at = args_at + offset
                masked_prefix = indent if not lead.strip() else lead
                key = counter
                counter += 1
                suffix = f"  # {prefix}{key}"
                cell._restore[key] = _Restore(masked_prefix, text[:code_at], "", "", True)
                cell._col_shift[start + 1] = code_at - len(masked_prefix)
                work[start] = masked_prefix + text[code_at:] + suffix + line_ending(work[start])
                is_python = True
        if not is_python:
            for n in range(start, end + 1):
                key = counter
                counter += 1
                if n == start and lead.strip():
                    masked = f"{lead}{prefix}{key}"  # `x = !ls` keeps `x = `
                else:
                    masked = f"{indent}import {prefix}{key}"
                cell._restore[key] = _Restore("", "", masked, _body(work[n]), False)
                work[n] = masked + line_ending(work[n])
        escapes.append(Escape(kind, start + 1, col + 1, end + 1, command, magic, is_python))
    else:
        raise MaskError("IPython syntax nests too deeply to mask")
    cell.text = "".join(_body(w) + line_ending(o) for w, o in zip(work, original, strict=True))
    cell.escapes = tuple(escapes)
    return cell


def _describe(found: TokenTransformBase, rest: str) -> tuple[Kind, str, str]:
    """(kind, command, magic name) of one piece of syntax; `rest` starts at its escape."""
    if isinstance(found, it2.HelpEnd):
        return "help", rest.strip(), ""
    if rest.startswith("!!"):
        return "shell_capture", rest[2:], ""
    if rest.startswith("!"):
        return "shell", rest[1:], ""
    if rest.startswith("%"):
        command = rest[1:]
        return "line_magic", command, command.partition(" ")[0]
    if rest.startswith("?"):
        return "help", rest, ""
    return "autocall", rest, ""
