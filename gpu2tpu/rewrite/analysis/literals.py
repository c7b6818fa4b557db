"""Reading literals and small shapes of libcst expressions: strings, names, dotted names.

Every rule family reads string literals (device strings, backend names, file names) and asks
small structural questions ("is this `x.cuda(...)`?"); this module is the one place that does
it. The tests here are plain `isinstance` checks: libcst's matchers say the same, but importing
`libcst.matchers` costs half a second, more than checking a whole tree (docs/architecture.md).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

import libcst as cst

_BLANK = cst.Module(body=[])

# `cuda`, `cuda:0`, `cuda:12`: a device string that names CUDA.
CUDA_STRING = re.compile(r"^cuda(:\d+)?$")


def code_for(node: cst.CSTNode) -> str:
    """The node's source text, as libcst lays it out."""
    return _BLANK.code_for_node(node)


def short(node: cst.CSTNode, limit: int = 40) -> str:
    """The node's source on one line, cut to `limit` characters (for messages)."""
    return shorten(code_for(node), limit)


def shorten(code: str, limit: int = 40) -> str:
    """`code` on one line, cut to `limit` characters."""
    text = " ".join(code.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def string_value(node: cst.CSTNode | None) -> str | None:
    """The value of a plain (not f-) string literal, implicit concatenations included; None for
    anything else (bytes, f-strings, names)."""
    if isinstance(node, cst.SimpleString):
        return simple_string_value(node.value)
    if isinstance(node, cst.ConcatenatedString):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


def simple_string_value(raw: str) -> str | None:
    """The value of one string literal as written (`raw`: prefix and quotes included), None
    for bytes. libcst's `evaluated_value` runs `ast.literal_eval`, which compiles the literal:
    about 5% of `check` on diffusers, where rules read every string literal (issue 36). A
    literal without a backslash or a carriage return means its characters between the quotes
    (with any prefix: a raw string differs only in escapes); the others are evaluated."""
    start = 0
    while raw[start] not in "'\"":
        start += 1
    if "b" in raw[:start].lower():
        return None
    quotes = 3 if raw[start : start + 3] in ('"""', "'''") else 1
    inner = raw[start + quotes : len(raw) - quotes]
    if "\\" in inner or "\r" in inner:
        value = ast.literal_eval(raw)
        return value if isinstance(value, str) else None
    return inner


def strings_in(node: cst.CSTNode) -> Iterator[str]:
    """Every plain string literal inside `node` (list elements, keyword values, ...)."""
    stack = [node]
    while stack:
        current = stack.pop()
        value = string_value(current)
        if value is not None:
            yield value
            continue
        stack.extend(current.children)


def cuda_literal(node: cst.CSTNode) -> bool:
    """True for `'cuda'`, `'cuda:0'` and f-strings such as `f'cuda:{rank}'`."""
    value = string_value(node)
    if value is not None:
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


def cuda_prefix(node: cst.CSTNode) -> bool:
    """True for a plain string that starts a CUDA device string built by hand: `"cuda:%d"`
    (then `% i`), `"cuda:"` (then `+ str(i)`); not for a whole one (`"cuda:1"`)."""
    value = string_value(node)
    return (
        isinstance(node, cst.SimpleString)
        and value is not None
        and value.startswith("cuda:")
        and not CUDA_STRING.match(value)
    )


def is_name(node: cst.CSTNode | None, value: str) -> bool:
    return isinstance(node, cst.Name) and node.value == value


def is_false(node: cst.CSTNode | None) -> bool:
    return is_name(node, "False")


def last_segment(node: cst.CSTNode) -> str | None:
    """`model` for `model`, `self.model` and `a.b.model`; None for anything else."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    return None


def dotted_name(node: cst.CSTNode | None) -> str | None:
    """`a.b.c` for a Name/Attribute chain; None for anything else (calls, subscripts)."""
    parts: list[str] = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if not isinstance(node, cst.Name):
        return None
    parts.append(node.value)
    return ".".join(reversed(parts))


def attribute_named(node: cst.CSTNode, *names: str) -> bool:
    """`<anything>.name` for one of `names`."""
    return isinstance(node, cst.Attribute) and node.attr.value in names


def is_call_to_attr(node: cst.CSTNode, *names: str) -> bool:
    """`<anything>.name(...)` for one of `names`."""
    return isinstance(node, cst.Call) and attribute_named(node.func, *names)


def literal_index(node: cst.CSTNode) -> str | None:
    """The digits of a non-negative integer literal (`1`), else None."""
    if isinstance(node, cst.Integer) and node.value.isdigit():
        return node.value
    return None


def cuda_string_index(node: cst.CSTNode) -> str | None:
    """`"1"` for the literal `"cuda:1"`, `""` for `"cuda"`; None for anything else."""
    value = string_value(node)
    if value is None or not CUDA_STRING.match(value):
        return None
    return value.partition(":")[2]


def cuda_format_call(node: cst.CSTNode) -> cst.Call | None:
    """`"cuda:{}".format(i)`: a device string built with `str.format`."""
    if not (isinstance(node, cst.Call) and attribute_named(node.func, "format")):
        return None
    receiver = node.func.value  # type: ignore[attr-defined]  # func is an Attribute, matched above
    value = string_value(receiver)
    if not isinstance(receiver, cst.SimpleString) or value not in ("cuda:{}", "cuda:{0}"):
        return None
    if len(node.args) != 1 or node.args[0].keyword is not None or node.args[0].star:
        return None
    return node
