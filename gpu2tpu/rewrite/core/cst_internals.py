"""The one place that touches libcst's private internals: laying out one statement, and
parsing without re-validating every node the parser builds.

libcst gives positions only through `PositionProvider`, which lays out (generates the code of)
the whole module. The codemod places a finding by laying out only the statement around it
(positions.py, `RuleContext.position`), which needs three things libcst does not export: a
node's `_codegen(state)`, the provider's `_computed` mapping it fills, and its
`PositionProvidingCodegenState` (and the `NEWLINE_RE` it splits tokens with). pyproject.toml
bounds libcst below 2 for them; `tests/test_cst_internals.py` checks that each is still there
(`missing()` names what changed) and that a layout here equals libcst's `PositionProvider`.

Every libcst node checks itself when it is made (`CSTNode.__post_init__` calls `_validate`),
its parser's nodes too: about a tenth of a parse re-checks what the grammar has just
accepted (libcst's own comment there says validation could be skipped when parsing a file).
`parse_module` here skips it for the nodes its parser builds, in the parsing thread only;
`_validate` only raises, so the tree is the same (tests/test_cst_internals.py compares).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping
from typing import cast

import libcst as cst
from libcst.metadata import CodePosition, CodeRange, PositionProvider
from libcst.metadata import position_provider as _provider

# libcst's own pattern for line ends within a token (its position provider splits on it).
NEWLINE_RE: re.Pattern[str] = _provider.NEWLINE_RE
PositionProvidingCodegenState = _provider.PositionProvidingCodegenState


def missing() -> list[str]:
    """The private libcst names this module uses that the installed libcst lacks (none: [])."""
    gone = [
        f"libcst.metadata.position_provider.{name}"
        for name in ("NEWLINE_RE", "PositionProvidingCodegenState")
        if not hasattr(_provider, name)
    ]
    if not hasattr(cst.CSTNode, "_codegen"):
        gone.append("libcst.CSTNode._codegen")
    if not hasattr(PositionProvider(), "_computed"):
        gone.append("libcst.metadata.PositionProvider()._computed")
    if not all(hasattr(cst.CSTNode, name) for name in ("__post_init__", "_validate")):
        gone.append("libcst.CSTNode.__post_init__/_validate")
    return gone


_PARSING = threading.local()  # `active`: this thread is inside `parse_module`
_installed: list[object] = []  # libcst's own `CSTNode.__post_init__`, once replaced


def _post_init(self: cst.CSTNode) -> None:
    """`CSTNode.__post_init__`, less the check while this thread's `parse_module` runs."""
    if not getattr(_PARSING, "active", False):
        self._validate()


def parse_module(text: str) -> cst.Module:
    """`libcst.parse_module(text)`, without validating the nodes its parser builds (the same
    module; its errors are libcst's)."""
    if not _installed:
        _installed.append(cst.CSTNode.__post_init__)
        cst.CSTNode.__post_init__ = _post_init  # type: ignore[method-assign]  # see the docstring
    before = getattr(_PARSING, "active", False)
    _PARSING.active = True
    try:
        return cst.parse_module(text)
    finally:
        _PARSING.active = before


class FastPositionState(PositionProvidingCodegenState):
    """libcst's position layout with the same results, for less: its syntactic positions are
    recorded by a generator-based context manager per node and every token is split on
    newlines; here a small class and a test for a newline first."""

    __slots__ = ()

    def _update_position(self, value: str) -> None:
        if "\n" not in value and "\r" not in value:
            self.column += len(value)
            return
        segments = NEWLINE_RE.split(value)
        self.line += len(segments) - 1
        self.column = len(segments[-1])

    def record_syntactic_position(  # type: ignore[override]  # a plain context manager, not a generator
        self,
        node: cst.CSTNode,
        *,
        start_node: cst.CSTNode | None = None,
        end_node: cst.CSTNode | None = None,
    ) -> _Record:
        return _Record(self, node, start_node, end_node)


class _Record:
    """`PositionProvidingCodegenState.record_syntactic_position`, as a plain context manager."""

    __slots__ = ("end_node", "node", "start", "start_node", "state")

    def __init__(
        self,
        state: FastPositionState,
        node: cst.CSTNode,
        start_node: cst.CSTNode | None,
        end_node: cst.CSTNode | None,
    ) -> None:
        self.state = state
        self.node = node
        self.start_node = start_node
        self.end_node = end_node
        self.start = CodePosition(state.line, state.column)

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        state = self.state
        computed = _computed(state.provider)
        end = CodePosition(state.line, state.column)
        start = computed[self.start_node].start if self.start_node is not None else self.start
        end = computed[self.end_node].end if self.end_node is not None else end
        computed[self.node] = CodeRange(start, end)


def _computed(provider: object) -> dict[cst.CSTNode, CodeRange]:
    """The mapping a layout fills: node -> its range (libcst's provider keeps it private)."""
    return cast(dict[cst.CSTNode, CodeRange], provider._computed)  # type: ignore[attr-defined]  # private


def layout(
    stmt: cst.CSTNode,
    default_indent: str,
    default_newline: str,
    indents: Iterable[str] = (),
    *,
    fast: bool = True,
) -> Mapping[cst.CSTNode, CodeRange]:
    """Every node of `stmt` -> its range, laying out `stmt` alone as if it started on line 1
    at column 0 inside blocks with these `indents` (outermost first). `fast` uses
    `FastPositionState` (the same ranges, for less); otherwise libcst's own state."""
    provider = PositionProvider()
    kind = FastPositionState if fast else PositionProvidingCodegenState
    state = kind(default_indent=default_indent, default_newline=default_newline, provider=provider)
    state.indent_tokens.extend(indents)
    stmt._codegen(state)
    return _computed(provider)
