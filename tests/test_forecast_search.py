"""The largest-batch search: the line and its check, and the fall-back, on memory curves.

`compile_at` is a stand-in that answers from a memory function the way libtpu does: figures
when the step fits, "oom" with the required and available bytes when it does not. The truth
is found by trying every batch size; a plain bisection is the slow path the fast one must
agree with.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from gpu2tpu.forecasting.aot import CompileOutcome
from gpu2tpu.forecasting.batchsearch import MAX_SEARCH_COMPILES, BatchSearch

STATE = 300  # argument = output = alias bytes: what memory_bytes adds on top of temporaries


def fake_compiles(memory_of, capacity: float):
    calls: list[int] = []

    def compile_at(batch: int) -> CompileOutcome:
        calls.append(batch)
        need = memory_of(batch)
        if need > capacity:
            return CompileOutcome("oom", batch, required_bytes=need, available_bytes=capacity)
        return CompileOutcome(
            "compiled",
            batch,
            argument_bytes=STATE,
            output_bytes=STATE,
            alias_bytes=STATE,
            temp_bytes=int(need - STATE),
        )

    return compile_at, calls


def truth(memory_of, capacity: float, granularity: int, limit: int) -> int:
    """The largest multiple of `granularity` up to `limit` that fits (0: none)."""
    fitting = [b for b in range(granularity, limit + 1, granularity) if memory_of(b) <= capacity]
    return max(fitting, default=0)


def bisection(compile_at, granularity: int, start: int, limit: int) -> int:
    """The slow path: double until a batch does not fit, then halve the bracket to one step."""
    fits = compile_at(start).status == "compiled"
    lo, hi = (start, None) if fits else (0, start)
    while hi is None:
        candidate = lo * 2
        if candidate > limit:
            return lo
        if compile_at(candidate).status == "compiled":
            lo = candidate
        else:
            hi = candidate
    while hi - lo > granularity:
        mid = (lo + hi) // 2 // granularity * granularity
        mid = max(mid, lo + granularity)
        if compile_at(mid).status == "compiled":
            lo = mid
        else:
            hi = mid
    return lo


def search(memory_of, capacity: float, granularity: int, first: int, **kwargs) -> tuple:
    compile_at, calls = fake_compiles(memory_of, capacity)
    kwargs.setdefault("ceiling", first * 256)
    engine = BatchSearch(compile_at, granularity, capacity=capacity, deadline=math.inf, **kwargs)
    start = compile_at(first)
    lo, hi = engine.run(start)
    return lo, hi, engine, calls[1:]


@settings(max_examples=300, deadline=None)
@given(
    granularity=st.sampled_from([1, 2, 4, 8]),
    first_steps=st.integers(1, 64),
    fixed=st.floats(0.0, 0.8),
    slope=st.floats(1e-5, 1e-2),
)
# a steep line that reaches capacity 2e-4 of a batch below 192: not a tie (found by hypothesis;
# a fixed nudge of 1e-4 x granularity took it to 192 and lost the check)
@example(granularity=4, first_steps=1, fixed=1.7781440393971646e-06, slope=0.0078125)
def test_affine_memory_is_settled_by_the_line_in_three_compiles(
    granularity, first_steps, fixed, slope
):
    capacity = 1e9
    first = first_steps * granularity

    def memory(b: int) -> float:
        return (fixed + slope * b) * capacity / (1 + slope * 64)

    limit = first * 256
    expected = truth(memory, capacity, granularity, limit)
    # A batch whose memory equals the capacity to the last float bit is a tie, not a case.
    assume(
        all(abs(memory(b) - capacity) > 1e-6 * capacity for b in (expected, expected + granularity))
    )
    lo, hi, engine, calls = search(memory, capacity, granularity, first)
    assert len(calls) <= 3
    assert engine.method == "line"
    assert all(b % granularity == 0 for b in calls)
    if expected == 0:
        assert lo is None
    elif expected >= limit:
        assert lo == limit  # a lower bound: the ceiling fits
    else:
        assert lo <= expected < hi
        assert hi - lo <= max(granularity, lo // 64 // granularity * granularity)
        if lo < 64 * granularity:
            assert lo == expected  # exact to one step for all but large batches


# Derandomized: a fixed set of 300 curves, so CI's verdict does not depend on the draw; the
# cost bound below was measured on 6,000 random curves as well (2026-12-01: at most 5 more).
@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    granularity=st.sampled_from([1, 2, 4]),
    first_steps=st.integers(1, 16),
    fixed=st.floats(0.05, 0.6),
    linear=st.floats(1e-4, 2e-2),
    curve=st.floats(0.0, 1e-3),
    plateau=st.booleans(),
)
def test_any_growing_memory_gives_what_bisection_gives(
    granularity, first_steps, fixed, linear, curve, plateau
):
    """Curved memory, and XLA's rematerialisation plateau near the capacity: the fast path
    falls back when its check fails and still agrees with a plain bisection."""
    capacity = 1e9
    first = first_steps * granularity

    def memory(b: int) -> float:
        value = (fixed + linear * b + curve * b * b) * capacity
        if plateau and 0.85 * capacity < value <= 1.3 * capacity:
            return 0.85 * capacity + (value - 0.85 * capacity) * 0.05  # remat flattens it
        return value

    lo, hi, engine, calls = search(memory, capacity, granularity, first, max_compiles=64)
    reference, slow_calls = fake_compiles(memory, capacity)
    slow = bisection(reference, granularity, first, first * 256)
    assert (lo or 0) <= slow and (hi is None or slow < hi)  # what it found is never wrong
    assert engine.settled
    if hi is not None and lo is not None and lo < 64 * granularity:
        assert lo == slow
    # Never much dearer than bisection: at worst the line's three compiles and two more (a
    # plateau makes the line predict far past what fits, and the bracket it leaves is wider
    # than the one doubling finds).
    assert len(calls) <= len(slow_calls) - 1 + 5


def test_the_line_and_its_check_are_the_compiles_reported():
    def memory(b: int) -> float:
        return 2e8 + 1e7 * b

    lo, hi, engine, calls = search(memory, 1e9, 1, 8)
    assert (lo, hi) == (80, 81)
    assert engine.method == "line" and engine.compiles == len(calls) <= 3
    assert calls[-2:] == [80, 81] or set(calls) >= {80, 81}


def test_gpt2_on_v5e_memory_stops_growing_near_capacity():
    """Measured shape: from batch 9 on XLA rematerialises and memory stays near 15.5 GB;
    the line's check fails (10 fits although the line said no) and bisection decides."""
    capacity = 15.75 * 2**30

    def memory(b: int) -> float:
        return 13.9e9 if b <= 8 else (15.5e9 if b <= 21 else 1.62e9 * b)

    lo, hi, engine, calls = search(memory, capacity, 1, 8)
    assert (lo, hi) == (21, 22)
    assert engine.method == "bisection"
    assert len(calls) <= MAX_SEARCH_COMPILES


def test_when_nothing_fits_the_search_ends_at_the_smallest_batch():
    lo, hi, engine, calls = search(lambda b: 5000 + b, 1200, 2, 16)
    assert (lo, hi) == (None, 2)
    assert calls[-1] == 2 and len(calls) <= 4


def test_large_batches_stop_within_the_tolerance():
    def memory(b: int) -> float:
        return 4.8e9 + 4e5 * b + (2e8 if b > 20000 else 0)  # a step as layouts change

    lo, hi, engine, calls = search(memory, 16.9e9, 1, 8, ceiling=None)
    expected = truth(memory, 16.9e9, 1, 60000)
    assert lo <= expected < hi
    assert len(calls) <= MAX_SEARCH_COMPILES
    assert engine.settled or len(calls) == MAX_SEARCH_COMPILES  # it stops only when done or out
    assert hi - lo <= expected / 32  # 1.6% wide at most: the tolerance is 1/64 when settled


def test_the_search_stops_at_its_ceiling():
    lo, hi, engine, calls = search(lambda b: 300 + b, 10**9, 1, 8)
    assert (lo, hi) == (2048, None)  # a lower bound: 2048 and more fit
    assert max(calls) == 2048 and len(calls) <= 2


def test_the_search_stops_at_the_time_budget():
    compile_at, calls = fake_compiles(lambda b: 300 + b, 10**9)
    engine = BatchSearch(compile_at, 1, capacity=10**9, deadline=0.0)
    assert engine.run(compile_at(8)) == (8, None)
    assert calls == [8] and engine.compiles == 0


def test_progress_hooks_see_every_compile():
    seen: list[tuple] = []
    compile_at, _ = fake_compiles(lambda b: 2e8 + 1e7 * b, 1e9)
    engine = BatchSearch(
        compile_at,
        1,
        capacity=1e9,
        deadline=math.inf,
        on_compile=lambda n, b: seen.append(("start", n, b)),
        on_result=lambda: seen.append(("done", len(engine.points))),
    )
    engine.run(compile_at(8))
    starts = [s for s in seen if s[0] == "start"]
    assert [n for _, n, _ in starts] == list(range(1, engine.compiles + 1))
    assert [s[1] for s in seen if s[0] == "done"] == list(range(2, engine.compiles + 2))


@pytest.mark.parametrize("status", ["error"])
def test_a_first_compile_that_failed_is_not_searched(status):
    compile_at, calls = fake_compiles(lambda b: 1.0, 1e9)
    engine = BatchSearch(compile_at, 1, capacity=1e9, deadline=math.inf)
    assert engine.run(CompileOutcome(status, 8)) == (None, None)
    assert calls == []


def test_the_lines_check_never_compiles_past_the_ceiling():
    """Found by the property test: the line predicted just under the ceiling and its check one
    step above compiled past it, reporting a batch the search was never to try."""

    def memory(b: int) -> float:
        return (0.28125 + 0.00028275516140387154 * b) * 1e9

    lo, hi, engine, calls = search(memory, 1e9, 1, 10)
    assert max(calls) <= 10 * 256 and lo is not None and lo <= 10 * 256
