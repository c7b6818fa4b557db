"""A text's lines as Python numbers them: the one place that splits text into lines.

`str.splitlines` also splits at form feeds, `\\x1c`-`\\x1e`, `\\x85` and the Unicode line
separators, which Python's tokenizer treats as whitespace inside a line: splitting there
would break the one-line-in, one-line-out mapping between a text, Python's tree and libcst's.
"""

from __future__ import annotations

import re

_LINES = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")


def python_lines(text: str) -> list[str]:
    """The physical lines of `text`, each with its ending (`\\r\\n`, `\\r` or `\\n`; none
    for a last line without one)."""
    return _LINES.findall(text)
