"""A notebook's JSON as text: read it, write changed values back byte for byte, diff it.

The JSON is edited as text, not re-serialised through nbformat. When `json.dumps` with the
file's own indent and escaping reproduces the file exactly, the changed notebook is dumped the
same way; otherwise (hand-edited JSON) only the changed values are spliced into the original
text. Either way the result is checked to hold exactly the intended JSON, so outputs, ids,
metadata, key order, indent, escapes and the trailing newline stay byte for byte. notebook.py
decides what changes; this module only reads and writes.
"""

from __future__ import annotations

import difflib
import json
import re
from json.decoder import scanstring  # type: ignore[attr-defined]  # there at run time; typeshed omits it
from typing import Any


class NotebookError(ValueError):
    """The file as a whole cannot be handled (not JSON, not nbformat 4, no cells...)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def cell_label(index: int) -> str:
    """How a cell is named in messages and diff headers (as the report names it)."""
    return f"cell {index}"


# -- reading the notebook ------------------------------------------------------------------


def load_notebook(text: str) -> dict[str, Any]:
    try:
        nb = json.loads(text)
    except json.JSONDecodeError as err:
        raise NotebookError(
            f"not valid JSON: {err.msg} (line {err.lineno}, column {err.colno})"
        ) from None
    except RecursionError:
        raise NotebookError("JSON nested too deeply to read") from None
    if not isinstance(nb, dict):
        raise NotebookError("not a Jupyter notebook: the JSON is not an object")
    version = nb.get("nbformat")
    if version == 3 or "worksheets" in nb:
        raise NotebookError(
            "nbformat 3 notebook; convert it first with "
            "`jupyter nbconvert --to notebook --nbformat 4`"
        )
    if version is None:
        raise NotebookError("not a Jupyter notebook: no `nbformat` version")
    if version != 4:
        raise NotebookError(f"nbformat {version!r} is not supported (only nbformat 4)")
    if not isinstance(nb.get("cells"), list):
        raise NotebookError("not a Jupyter notebook: it has no `cells` list")
    return nb


def notebook_language(nb: dict[str, Any]) -> str | None:
    meta = nb.get("metadata")
    if not isinstance(meta, dict):
        return None
    for key, field_name in (("language_info", "name"), ("kernelspec", "language")):
        section = meta.get(key)
        if isinstance(section, dict):
            value = section.get(field_name)
            if isinstance(value, str):
                return value
    return None


def cell_source(cell: dict[str, Any]) -> str | None:
    source = cell.get("source")
    if isinstance(source, str):
        return source
    if isinstance(source, list) and all(isinstance(s, str) for s in source):
        return "".join(source)
    return None


MetaPath = tuple[str, ...]  # a key path into the notebook's metadata


def value_at(nb: dict[str, Any], path: MetaPath) -> object:
    """The value at `path` in the notebook's JSON."""
    value: object = nb
    for key in path:
        value = value[key]  # type: ignore[index]  # a path found in the notebook's JSON: dicts along it
    return value


# -- writing the JSON back ------------------------------------------------------------------

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()
JsonPath = tuple[object, ...]


def _matches(path: JsonPath, pattern: JsonPath) -> bool:
    return len(path) == len(pattern) and all(
        p == "*" or p == x for x, p in zip(path, pattern, strict=True)
    )


def value_spans(text: str, patterns: list[JsonPath]) -> dict[JsonPath, tuple[int, int]]:
    """Start and end offsets in `text` of the JSON values at `patterns` ("*": any key/index).

    Only containers on the way to a pattern are walked; every other value is skipped with the
    C decoder. With duplicate keys the last one wins, as in `json.loads`.
    """
    found: dict[JsonPath, tuple[int, int]] = {}

    def descend(path: JsonPath) -> bool:
        return any(len(p) > len(path) and _matches(path, p[: len(path)]) for p in patterns)

    def walk(i: int, path: JsonPath) -> int:
        i = _WS.match(text, i).end()  # type: ignore[union-attr]  # the pattern matches the empty string too
        start, ch = i, text[i : i + 1]
        if ch in ("{", "[") and descend(path):
            close = "}" if ch == "{" else "]"
            i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]  # the pattern matches the empty string too
            n = 0
            while text[i] != close:
                if ch == "{":
                    key, i = scanstring(text, i + 1)
                    i = _WS.match(text, i).end()  # type: ignore[union-attr]  # the pattern matches the empty string too
                    i = walk(i + 1, (*path, key))  # skips the ':'
                else:
                    i = walk(i, (*path, n))
                n += 1
                i = _WS.match(text, i).end()  # type: ignore[union-attr]  # the pattern matches the empty string too
                if text[i] == ",":
                    i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]  # the pattern matches the empty string too
            end = i + 1
        else:
            _, end = _DECODER.raw_decode(text, i)
        if any(_matches(path, p) for p in patterns):
            found[path] = (start, end)
        return end

    walk(0, ())
    return found


def _split_newlines(text: str) -> list[str]:
    return re.findall(r"[^\n]*\n|[^\n]+$", text)


def _split_like(new: str, old: list[str]) -> list[str]:
    """Split a new source into list items the way the original list was split."""
    joined = "".join(old)
    if old == joined.splitlines(keepends=True):
        return new.splitlines(keepends=True)
    return _split_newlines(new)


def _reproduces(text: str, nb: dict[str, Any]) -> tuple[int | None, bool, str] | None:
    """(indent, ensure_ascii, tail) with which `json.dumps` gives back `text` exactly, if any."""
    hit = re.match(r"[{\[](?:\r?\n)( *)\S", text)
    indent = len(hit.group(1)) if hit else None
    ensure_ascii = text.isascii()
    dumped = json.dumps(nb, indent=indent, ensure_ascii=ensure_ascii)
    tail = text[len(dumped) :]
    if text.startswith(dumped) and not tail.strip():
        return indent, ensure_ascii, tail
    return None


def _ensure_ascii(piece: str, text: str) -> bool:
    """Whether a changed value is written with backslash-u escapes (`\\u00e9`), as the value it
    replaces was."""
    if not piece.isascii():
        return False
    if any(int(h, 16) >= 0x80 for h in re.findall(r"\\u([0-9a-fA-F]{4})", piece)):
        return True
    return text.isascii()


def render_notebook(
    text: str, nb: dict[str, Any], new_sources: dict[int, str], meta: dict[MetaPath, object]
) -> str:
    """The file's new text: `nb` with the new sources and metadata values, in the file's layout.

    Raises `NotebookError` rather than return text that holds anything else.
    """
    layout = _reproduces(text, nb)
    for index, new in new_sources.items():
        cell = nb["cells"][index]
        old = cell["source"]
        cell["source"] = new if isinstance(old, str) else _split_like(new, old)
    for path, value in meta.items():
        parent = value_at(nb, path[:-1])
        parent[path[-1]] = value  # type: ignore[index]  # a path found in the notebook's JSON: dicts along it
    if layout is not None:
        indent, ensure_ascii, tail = layout
        out = json.dumps(nb, indent=indent, ensure_ascii=ensure_ascii) + tail
    else:
        out = _splice(text, nb, new_sources, meta)
    if not _same_json(out, nb):
        raise NotebookError(
            "the notebook's JSON layout cannot be kept while changing it; file left as it is"
        )
    return out


def _same_json(text: str, value: object) -> bool:
    """Whether `text` holds exactly `value` (NaN and Infinity compared as written)."""

    def constant(name: str) -> tuple[str, str]:
        return ("json constant", name)

    try:
        got = json.loads(text, parse_constant=constant)
    except json.JSONDecodeError:
        return False
    return bool(got == json.loads(json.dumps(value), parse_constant=constant))


def _splice(
    text: str, nb: dict[str, Any], new_sources: dict[int, str], meta: dict[MetaPath, object]
) -> str:
    """Replace only the changed values in the original text, formatted as their originals."""
    patterns: list[JsonPath] = list(meta)
    for index in new_sources:
        patterns += [("cells", index, "source"), ("cells", index, "source", "*")]
    spans = value_spans(text, patterns)
    pieces: list[tuple[int, int, str]] = []
    for index in new_sources:
        start, end = spans[("cells", index, "source")]
        value = nb["cells"][index]["source"]
        ascii_ = _ensure_ascii(text[start:end], text)
        if isinstance(value, str):
            pieces.append((start, end, json.dumps(value, ensure_ascii=ascii_)))
            continue
        items = sorted((k[3], v) for k, v in spans.items() if len(k) == 4 and k[1] == index)
        pieces.append(
            (start, end, _list_like(text, start, end, [s for _, s in items], value, ascii_))
        )
    for path, value in meta.items():
        start, end = spans[path]
        pieces.append(
            (start, end, json.dumps(value, ensure_ascii=_ensure_ascii(text[start:end], text)))
        )
    parts: list[str] = []
    done = 0
    for start, end, piece in sorted(pieces):
        parts += [text[done:start], piece]
        done = end
    return "".join([*parts, text[done:]])


def _list_like(
    text: str, start: int, end: int, items: list[tuple[int, int]], value: list[str], ascii_: bool
) -> str:
    """A JSON list of strings laid out as the list at text[start:end] was."""
    encoded = [json.dumps(s, ensure_ascii=ascii_) for s in value]
    if not items:
        return "[" + ", ".join(encoded) + "]"
    opening = text[start + 1 : items[0][0]]
    closing = text[items[-1][1] : end - 1]
    if len(items) > 1:
        separator = text[items[0][1] : items[1][0]]
    else:  # one item: take the space before commas from elsewhere in the file
        comma = re.search(r'"([ \t]*),', text)
        separator = (comma.group(1) if comma else "") + "," + opening
    return "[" + opening + separator.join(encoded) + closing + "]" if encoded else "[]"


# -- diff ------------------------------------------------------------------------------------


def notebook_diff(path: str, old_text: str, new_text: str) -> str:
    """A unified diff per changed cell (headers `path:cell N`) and for changed metadata."""
    if old_text == new_text:
        return ""
    old, new = load_notebook(old_text), load_notebook(new_text)
    out: list[str] = []
    if old.get("metadata") != new.get("metadata"):
        out += _diff(
            json.dumps(old.get("metadata"), indent=1, ensure_ascii=False) + "\n",
            json.dumps(new.get("metadata"), indent=1, ensure_ascii=False) + "\n",
            f"{path}:metadata",
        )
    for index, (a, b) in enumerate(zip(old["cells"], new["cells"], strict=False)):
        if not (isinstance(a, dict) and isinstance(b, dict)):
            continue
        before, after = cell_source(a) or "", cell_source(b) or ""
        if before != after:
            out += _diff(before, after, f"{path}:{cell_label(index)}")
    return "".join(out)


def _diff(before: str, after: str, name: str) -> list[str]:
    a, b = before.splitlines(keepends=True), after.splitlines(keepends=True)
    for lines in (a, b):
        if lines and not lines[-1].endswith(("\n", "\r")):
            lines[-1] += "\n"
    return list(difflib.unified_diff(a, b, name, name))
