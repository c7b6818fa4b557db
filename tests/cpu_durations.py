"""`--cpu-durations=N`: the N tests that cost the most CPU, beside pytest's `--durations`.

`make test-all` runs three pytest processes side by side on two cores, so a test's wall time
(`--durations`) says as much about what ran beside it as about the test: a compile that takes
300 CPU-seconds shows as 900 s when it shares the cores with four others. What the whole run
costs is the CPU its tests use, so this report is where to look for the time (issue 24):
each phase's user + system time of the test's process and of the children it waited for
(subprocesses, the forecast's forked compiles, pip). A child still running when the phase ends
(a kernel kept by a fixture) counts when it is reaped, in that later phase.

Plain hooks, imported by conftest.py: the XLA environment runs the same conftest and has no
plugins beyond pytest's. Under xdist each worker measures its own tests and the numbers reach
the controller in the reports' `user_properties`.
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

_KEY = "cpu_seconds"
_STARTED = pytest.StashKey[float]()


def _cpu() -> float:
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-durations",
        type=int,
        default=None,
        metavar="N",
        help="show the N test phases that used the most CPU (process and waited children)",
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    # makereport runs right after each phase: the CPU since the last report is that phase's.
    now = _cpu()
    started = item.stash.get(_STARTED, None)
    outcome = yield
    if started is not None:
        report = outcome.get_result()
        report.user_properties = [*report.user_properties, (_KEY, now - started)]
    item.stash[_STARTED] = _cpu()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_STARTED] = _cpu()


_COLLECTED: list[tuple[float, str, str]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for key, value in report.user_properties:
        if key == _KEY:
            _COLLECTED.append((float(value), report.when, report.nodeid))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    count = terminalreporter.config.getoption("--cpu-durations")
    if not count or not _COLLECTED:
        return
    total = sum(seconds for seconds, _, _ in _COLLECTED)
    terminalreporter.write_sep("=", f"most CPU: {count} test phases of {total:.0f} CPU-s in all")
    for seconds, when, nodeid in sorted(_COLLECTED, reverse=True)[:count]:
        terminalreporter.write_line(f"{seconds:8.2f}s {when:<8} {nodeid}")
