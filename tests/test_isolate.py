"""The forked child that keeps torchax out of the user's process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from gpu2tpu.forecasting.isolate import (
    ChildDied,
    emit,
    in_child,
    run_in_child,
    run_streaming,
    run_streaming_many,
)


class Local:
    """A class a notebook might define: not importable by a fresh interpreter."""

    def __init__(self, value: int) -> None:
        self.value = value


def _work(obj: Local, extra: int) -> tuple[int, int, bool]:
    sys.modules["gpu2tpu_isolate_marker"] = sys  # a change to the child's process only
    return obj.value + extra, os.getpid(), "gpu2tpu_isolate_marker" in sys.modules


def test_result_comes_back_and_the_parent_is_untouched() -> None:
    total, pid, marked = run_in_child(_work, Local(40), extra=2)
    assert total == 42 and marked
    assert pid != os.getpid()
    assert "gpu2tpu_isolate_marker" not in sys.modules


def _fail() -> None:
    raise ValueError("bad shape 3")


def test_the_childs_error_is_raised_here_with_its_traceback() -> None:
    with pytest.raises(ValueError, match="bad shape 3") as info:
        run_in_child(_fail)
    assert any("_fail" in note for note in getattr(info.value, "__notes__", []))


def _die() -> None:
    os._exit(3)


def test_a_child_that_dies_is_reported() -> None:
    with pytest.raises(ChildDied, match="exit code 3"):
        run_in_child(_die)


def _chatty(steps: int) -> str:
    for i in range(steps):
        emit(("step", i, os.getpid()))
    return f"done in child: {in_child()}"


def test_events_arrive_in_order_before_the_result() -> None:
    seen: list[tuple] = []
    result = run_streaming(_chatty, (3,), on_event=seen.append)
    assert result == "done in child: True"
    assert [e[1] for e in seen] == [0, 1, 2]
    assert {e[2] for e in seen} != {os.getpid()}
    assert emit("nobody listens here") is False and not in_child()


def _noisy() -> str:
    print("a line on stdout from the child")
    print("a line on stderr from the child", file=sys.stderr)
    os.write(2, b"native code writing to fd 2\n")
    return "quiet"


def _noisy_failure() -> None:
    os.write(2, b"libtpu said something useful\n")
    raise RuntimeError("compile failed")


def test_the_childs_output_is_held_and_shown_only_with_its_error(capfd) -> None:
    assert run_in_child(_noisy) == "quiet"
    out, err = capfd.readouterr()
    assert "child" not in out + err and "native" not in out + err
    with pytest.raises(RuntimeError, match="compile failed") as info:
        run_in_child(_noisy_failure)
    assert any("libtpu said something useful" in note for note in info.value.__notes__)


def _slow(pid_file: str) -> None:
    emit(("started", os.getpid()))
    with open(pid_file, "w") as f:
        f.write(str(os.getpid()))
    os.kill(os.getpid(), signal.SIGINT)  # a terminal's Ctrl-C reaches the child too: ignored
    time.sleep(0.5)
    emit(("still running", os.getpid()))
    time.sleep(60)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_ctrl_c_in_the_parent_kills_the_child_and_keeps_the_events(tmp_path) -> None:
    seen: list[tuple] = []

    def on_event(event: tuple) -> None:
        seen.append(event)
        if event[0] == "still running":
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, delivered to the parent

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_streaming(_slow, (str(tmp_path / "pid"),), on_event=on_event)
    assert time.monotonic() - started < 30  # not the child's 60 s
    assert [e[0] for e in seen] == ["started", "still running"]  # SIGINT did not stop the child
    child = int((tmp_path / "pid").read_text())
    assert not _alive(child)


@pytest.mark.parametrize("new_session", [False, True], ids=["nohup", "setsid"])
def test_the_ctrl_c_test_passes_in_a_run_that_inherits_an_ignored_sigint(
    new_session: bool,
) -> None:
    """`nohup make test`, or `make test &` from a script, starts pytest with SIGINT ignored
    (and `setsid` in a session of its own): the test above must still see its Ctrl-C."""
    name = "test_ctrl_c_in_the_parent_kills_the_child_and_keeps_the_events"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"{__file__}::{name}"],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        start_new_session=new_session,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout


def test_idle_callback_ticks_while_the_child_works() -> None:
    ticks: list[float] = []
    run_streaming(time.sleep, (1.0,), on_idle=lambda: ticks.append(1.0), idle_seconds=0.1)
    assert len(ticks) >= 3


def test_several_children_work_at_once_and_report_in_order(tmp_path) -> None:
    """Each child waits until every child has started: they can only all finish if they
    run at the same time. Events from all arrive; results come back in call order."""
    seen: list[tuple] = []
    flags = str(tmp_path)
    calls = [(_together, (flags, i, 3)) for i in range(3)]
    results = run_streaming_many(calls, on_event=seen.append)
    assert [r[0] for r in results] == [0, 1, 2]
    assert len({r[1] for r in results} | {os.getpid()}) == 4  # three children, not here
    assert sorted(e[1] for e in seen) == [0, 1, 2]


def _together(flags: str, index: int, count: int) -> tuple[int, int]:
    open(os.path.join(flags, str(index)), "w").close()
    deadline = time.monotonic() + 60
    while len(os.listdir(flags)) < count:
        if time.monotonic() > deadline:
            raise TimeoutError("the other children never started")
        time.sleep(0.01)
    emit(("ready", index))
    return index, os.getpid()


def _sleeper(pid_file: str) -> None:
    with open(pid_file + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(pid_file + ".tmp", pid_file)
    time.sleep(60)


def _fail_once_started(pid_file: str) -> None:
    deadline = time.monotonic() + 60
    while not os.path.exists(pid_file) and time.monotonic() < deadline:
        time.sleep(0.01)
    raise ValueError("bad shape 3")


def test_an_error_in_one_child_stops_the_others(tmp_path) -> None:
    pid_file = str(tmp_path / "pid")
    calls = [(_sleeper, (pid_file,)), (_fail_once_started, (pid_file,))]
    started = time.monotonic()
    with pytest.raises(ValueError, match="bad shape 3"):
        run_streaming_many(calls)
    assert time.monotonic() - started < 30  # the sleeper did not run its minute
    pid = int((tmp_path / "pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped
