"""The largest batch that fits in a chip's HBM, in as few compiles as the compiler allows.

Memory per chip is close to affine in the batch size: the weights, optimizer state and
gradients stay, the activations grow with every sample. So two compiles give the line, the
line predicts the largest batch, and compiles at that batch and one step above confirm it:
at most three compiles beyond the one the forecast made anyway. When the check fails (near
the capacity XLA rematerialises activations to fit, and memory stops growing with the
batch), a bisection of the bracket the compiles so far give takes over.

Pure logic: `compile_at(batch)` is the caller's; the tests drive it with memory curves.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .aot import CompileOutcome

# The search stops after this many compiles beyond the first even with time left...
MAX_SEARCH_COMPILES = 8
# ...and never tries more than this many times the given batch (a lower bound is enough there).
MAX_BATCH_FACTOR = 256
# A first guess never reaches further than this many times the batch compiled so far.
_MAX_LEAP = 64
# Memory within this share of the capacity of it is a tie: a line that reaches capacity a
# hair below a whole batch (127.99999 for 128: a float's error on integer byte counts) is
# taken at that batch, and one that misses it by more is not (a fixed nudge in batches was
# more than a ten-millionth of the capacity on a steep line, and lost the check).
_TIE = 1e-7


@dataclass
class BatchSearch:
    """Finds the largest batch (a multiple of `granularity`) whose step fits in `capacity`.

    `capacity` is usable HBM per device in bytes; `ceiling` the largest batch worth trying;
    the search stops when the bracket is one `granularity` wide (or within `rel_tol` of the
    batch, for large batches), at `ceiling`, or out of compiles (`max_compiles`) or time
    (`deadline`, a `time.perf_counter()` value). `method` says how it ended: "line" when the
    affine prediction was confirmed, "bisection" when the fall-back decided.
    """

    compile_at: Callable[[int], CompileOutcome]
    granularity: int
    capacity: float
    deadline: float
    max_compiles: int = MAX_SEARCH_COMPILES
    ceiling: int | None = None
    rel_tol: float = 1 / 64
    on_compile: Callable[[int, int], None] | None = None  # (compile number, batch) before each
    on_result: Callable[[], None] | None = None  # after each compile, with `points` updated
    points: dict[int, CompileOutcome] = field(default_factory=dict)
    compiles: int = 0
    method: str = ""

    def run(self, first: CompileOutcome) -> tuple[int | None, int | None]:
        """(largest batch that fits, smallest that does not), either None when not found."""
        self.points[first.batch] = first
        if first.status == "error":
            return self.bounds()
        if self._by_the_line(first):
            self.method = "line"
            return self.bounds()
        self.method = "bisection"
        while self._budget_left():
            candidate = self._next()
            if candidate is None or not self._try(candidate):
                break
        return self.bounds()

    def bounds(self) -> tuple[int | None, int | None]:
        fitting = [b for b, o in self.points.items() if o.status == "compiled"]
        failing = [b for b, o in self.points.items() if o.status == "oom"]
        return (max(fitting) if fitting else None), (min(failing) if failing else None)

    @property
    def settled(self) -> bool:
        """Whether the bracket is as tight as the search wants it."""
        lo, hi = self.bounds()
        if lo is None:
            return hi is not None and hi <= self.granularity
        if hi is None:
            return self.ceiling is not None and lo >= self.ceiling
        return hi - lo <= self._step(lo)

    # the line -----------------------------------------------------------------------------

    def _by_the_line(self, first: CompileOutcome) -> bool:
        """Two points, a prediction and its check; True when the check confirms it."""
        second = self._second_batch(first)
        if second is None or not self._try(second):
            return False
        line = self._line()
        if line is None:
            return False
        guess, slope = line
        best = self._clamp(self._round(guess + _TIE * self.capacity / slope))
        ceiling = self._round(self.ceiling) if self.ceiling is not None else None
        at_ceiling = ceiling is not None and best >= ceiling
        above = best + self._step(best)
        if ceiling is not None:
            above = min(above, ceiling)  # the check never compiles past the ceiling either
        checks = [best] if at_ceiling else [best, above]
        for batch in checks:
            if batch not in self.points and not self._try(batch):
                return False
            if self.points[best].status != "compiled":
                return False  # the prediction does not fit: no need to look above it
        return at_ceiling or self.points[checks[1]].status == "oom"

    def _second_batch(self, first: CompileOutcome) -> int | None:
        """Where to compile next for a useful line: near the one-point prediction."""
        b0, g = first.batch, self.granularity
        memory = first.memory_bytes
        if first.status == "oom":
            if not memory:
                return self._round(b0 / 2) if b0 > g else None
            candidate = self._round(b0 * self.capacity / memory)
            if candidate >= b0:
                candidate = b0 - g
            return candidate if candidate >= g else None
        if memory is None:
            return None
        # One point: what is not temporary stays, the temporaries grow with the batch (an
        # overestimate of the slope, since gradients are temporaries too: a safe first step).
        temp = first.temp_bytes or 0
        fixed = memory - temp
        guess = b0 * (self.capacity - fixed) / temp if temp > 0 else b0 * 2
        candidate = self._round(min(max(guess, b0 + g), b0 * _MAX_LEAP))
        candidate = self._clamp(max(candidate, b0 + g))
        return candidate if candidate != b0 else None

    def _line_prediction(self) -> float | None:
        """The batch at which the line through the outermost two points reaches capacity."""
        line = self._line()
        return None if line is None else line[0]

    def _line(self) -> tuple[float, float] | None:
        """That batch, and the line's slope in bytes a batch."""
        memory = sorted((b, o.memory_bytes) for b, o in self.points.items() if o.memory_bytes)
        if len(memory) < 2:
            return None
        (b1, m1), (b2, m2) = memory[0], memory[-1]
        if b2 == b1 or m2 <= m1:
            return None
        slope = (m2 - m1) / (b2 - b1)
        return b1 + (self.capacity - m1) / slope, slope

    # the fall-back ----------------------------------------------------------------------------

    def _next(self) -> int | None:
        """The next batch to try: halve while nothing fits, at least double (or follow the line,
        if it reaches further) while everything fits, bisect a bracket. Once the line has
        failed its check, memory is not near a line here (XLA's rematerialisation flattens
        it, then it jumps), and secant steps cost more compiles than halving (measured on
        curved and plateaued memory curves: 6.5 compiles on average against 6.8 for a
        safeguarded regula falsi)."""
        lo, hi = self.bounds()
        g = self.granularity
        if lo is None:  # nothing fits yet: at least halve, towards the smallest batch
            assert hi is not None
            guess = self._line_prediction()
            candidate = self._round(min(hi / 2, guess) if guess and guess > 0 else hi / 2)
            return candidate if candidate < hi and candidate not in self.points else None
        if self.settled:
            return None
        if hi is None:
            if self.ceiling is not None and lo >= self._round(self.ceiling):
                return None
            guess = max(self._line_prediction() or 0.0, lo * 2.0)
            candidate = self._round(min(guess, lo * _MAX_LEAP))
            candidate = self._clamp(candidate)
            return candidate if candidate > lo and candidate not in self.points else None
        candidate = self._round(min(max((lo + hi) / 2, lo + g), hi - g))
        return candidate if lo < candidate < hi and candidate not in self.points else None

    # pieces ---------------------------------------------------------------------------------

    def _try(self, batch: int) -> bool:
        """Compile at `batch` if the budget allows; False when it did not or it errored."""
        if not self._budget_left():
            return False
        self.compiles += 1
        if self.on_compile is not None:
            self.on_compile(self.compiles, batch)
        outcome = self.compile_at(batch)
        self.points[batch] = outcome
        if outcome.status == "oom" and outcome.available_bytes:
            self.capacity = outcome.available_bytes
        if self.on_result is not None:
            self.on_result()
        return outcome.status != "error"

    def _budget_left(self) -> bool:
        return self.compiles < self.max_compiles and time.perf_counter() < self.deadline

    def _round(self, batch: float) -> int:
        g = self.granularity
        return max(g, int(batch // g) * g)

    def _clamp(self, batch: int) -> int:
        if self.ceiling is not None:
            batch = min(batch, self._round(self.ceiling))
        return max(self.granularity, batch)

    def _step(self, batch: int) -> int:
        """The bracket width the search settles for at this batch size."""
        return max(self.granularity, self._round(batch * self.rel_tol))
