"""Where a statement sits in its block, found once per block.

Rules and analyses ask where a statement stands among its siblings: what comes before a seed
call, what follows a CUDA assert, which of several equal lines a removal drops. A scan of the
block for each question made a block with a finding on every line cost the square of its
length (issue 33: 20,000 such lines took minutes), so each block's index is built on the first
question and kept, per rule context, for the rest of the run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

import libcst as cst

if TYPE_CHECKING:
    from ..rules.base import RuleContext

Block = cst.Module | cst.IndentedBlock


class _BlockIndex:
    """One block's statements by id -> their index, and the texts of its first statements
    with how often each text came before (for `occurrence`, made as far as asked)."""

    def __init__(self, block: Block) -> None:
        self.block = block  # kept alive with the index, so that its id stays its own
        self.index = {id(stmt): i for i, stmt in enumerate(block.body)}
        self.seen: Counter[str] = Counter()
        self.occurrences: list[int] = []


def _index_of(ctx: RuleContext, block: Block) -> _BlockIndex:
    indexes = cast("dict[int, _BlockIndex]", ctx.memo.setdefault("block_indexes", {}))
    found = indexes.get(id(block))
    if found is None or found.block is not block:
        found = indexes[id(block)] = _BlockIndex(block)
    return found


def statement_index(ctx: RuleContext, block: Block, stmt: cst.CSTNode) -> int | None:
    """The index of `stmt` in `block.body` (None when it is not one of its statements)."""
    return _index_of(ctx, block).index.get(id(stmt))


def occurrence(
    ctx: RuleContext, block: Block, index: int, text_of: Callable[[cst.CSTNode], str]
) -> int:
    """How many statements before `block.body[index]` have its text (`text_of`: libcst's
    code of a statement). Each statement's text is made once, up to the furthest asked."""
    found = _index_of(ctx, block)
    body: Sequence[cst.CSTNode] = block.body
    while len(found.occurrences) <= index:
        text = text_of(body[len(found.occurrences)])
        found.occurrences.append(found.seen[text])
        found.seen[text] += 1
    return found.occurrences[index]
