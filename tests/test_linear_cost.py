"""A module's cost grows with its length, not with its square (issue 33).

A module with a CUDA idiom on every line once took minutes at 20,000 lines: work per finding
over a whole block or module (a scan of the block for each statement's index, every report
read again for each CUDA test, a walk of the whole scope for each CUDA event, every variable
test scanned for each availability test). Time is no test here (the machine is shared and
its speed varies); the number of lines of Python the codemod executes is the same on every
run. Doubling the module must about double it, and no single function's count may grow much
faster: one that quadruples does work per finding over the whole module. Such work in C
(`list.index` on libcst's nodes) shows too, through the nodes' Python `__eq__`.
"""

from __future__ import annotations

import sys
from collections import Counter
from types import CodeType, FrameType
from typing import Any

import pytest
from fix_every_line import LINES, module_text

from gpu2tpu.rewrite.core.model import Options, Result
from gpu2tpu.rewrite.core.source import rewrite_source

N = 2 * len(LINES)  # each kind of line twice; the module then has 2N of them
WHOLE = 2.25  # the whole run's count at 2N against N (linear: about 2)
ONE = 3.0  # one function's (quadratic: about 4)
SMALL = 400  # functions that run fewer lines than this at 2N are not judged alone


def _run_counted(text: str, options: Options) -> tuple[Counter[CodeType], Result]:
    """The result, and how many lines of each function ran (Python's line events)."""
    counts: Counter[CodeType] = Counter()

    def line(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            counts[frame.f_code] += 1
        return line

    def call(frame: FrameType, event: str, arg: Any) -> Any:
        return line

    before = sys.gettrace()
    sys.settrace(call)
    try:
        result = rewrite_source(text, options)
    finally:
        sys.settrace(before)
    return counts, result


@pytest.mark.parametrize("fix", [False, True], ids=["check", "rewrite"])
@pytest.mark.parametrize("where", ["module", "function", "loop"])
def test_twice_the_lines_cost_twice_the_work(where: str, fix: bool) -> None:
    options = Options(fix=fix)
    rewrite_source(module_text(len(LINES), where), options)  # imports and one-time tables
    small, small_result = _run_counted(module_text(N, where), options)
    large, large_result = _run_counted(module_text(2 * N, where), options)
    # The same kinds of line twice over: twice the edits and findings, nothing withheld.
    for kind in ("edits", "findings"):
        assert len(getattr(large_result, kind)) == 2 * len(getattr(small_result, kind))
    assert len(large_result.edits if fix else large_result.findings) > N
    assert not small_result.withheld and not large_result.withheld
    whole = sum(large.values()) / sum(small.values())
    grown = {
        f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno} {code.co_name}": (
            small[code],
            count,
        )
        for code, count in large.items()
        if count >= SMALL and count > ONE * small[code]
    }
    assert whole <= WHOLE and not grown, (
        f"{2 * N} lines cost {whole:.2f}x the work of {N}; functions whose lines run grew "
        f"more than {ONE}x (at {N} and {2 * N} lines): {grown}"
    )
