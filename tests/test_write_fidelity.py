"""Writes keep the encoding, BOM, newline style and file mode, and are atomic."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu2tpu.rewrite.files.engine import Config, Mode, Status, run

BODY = "import torch\r\nx = torch.zeros(1).cuda()\r\n"


def rewrite(path: Path) -> Status:
    report = run([str(path)], Config(jobs=1), Mode.WRITE)
    return report.files[0].status


def test_crlf_bom_and_mode_survive(tmp_path: Path) -> None:
    p = tmp_path / "crlf.py"
    p.write_bytes(b"\xef\xbb\xbf" + BODY.encode())
    p.chmod(0o751)
    assert rewrite(p) is Status.REWRITTEN
    data = p.read_bytes()
    assert data.startswith(b"\xef\xbb\xbf")
    assert b"\r\n" in data and b"\n" not in data.replace(b"\r\n", b"")
    assert b".to(device)" in data
    assert stat.S_IMODE(p.stat().st_mode) == 0o751
    assert not [q for q in tmp_path.iterdir() if q.name != "crlf.py"], "a temp file was left"


def test_declared_latin1_encoding_is_kept(tmp_path: Path) -> None:
    p = tmp_path / "latin.py"
    text = "# -*- coding: latin-1 -*-\nimport torch\n# café\nx = torch.zeros(1).cuda()\n"
    p.write_bytes(text.encode("latin-1"))
    assert rewrite(p) is Status.REWRITTEN
    data = p.read_bytes()
    assert "café".encode("latin-1") in data
    assert data.decode("latin-1").count(".to(device)") == 1


def test_unchanged_file_is_not_touched(tmp_path: Path) -> None:
    p = tmp_path / "clean.py"
    p.write_text("import torch\n# mentions cuda only in a comment\n")
    before = p.stat().st_mtime_ns
    assert rewrite(p) is Status.UNCHANGED
    assert p.stat().st_mtime_ns == before


def test_parallel_matches_serial(tmp_path: Path) -> None:
    for i in range(40):
        (tmp_path / f"m{i}.py").write_text(f"import torch\nx{i} = torch.zeros({i}).cuda()\n")
    serial = run([str(tmp_path)], Config(jobs=1), Mode.CHECK)
    parallel = run([str(tmp_path)], Config(jobs=2), Mode.CHECK)
    assert [o.path for o in serial.files] == [o.path for o in parallel.files]
    assert [o.edits for o in serial.files] == [o.edits for o in parallel.files]


# -- links, owners, newlines, temporaries, killed runs ------------------------------------------

GOOD = "import torch\nx = torch.zeros(1).cuda()\n"


def test_cr_only_newlines_keep_the_last_one(tmp_path: Path) -> None:
    p = tmp_path / "mac.py"
    p.write_bytes(b"import torch\rx = torch.zeros(1).cuda()\r")
    assert rewrite(p) is Status.REWRITTEN
    data = p.read_bytes()
    assert data.endswith(b".to(device)\r") and b"\n" not in data


def test_owner_and_group_are_kept(tmp_path: Path) -> None:
    p = tmp_path / "owned.py"
    p.write_text(GOOD)
    if os.geteuid() == 0:  # root may give the file to anyone: the rewrite must keep that
        os.chown(p, 12345, 23456)
    before = p.stat()
    assert rewrite(p) is Status.REWRITTEN
    after = p.stat()
    assert (after.st_uid, after.st_gid) == (before.st_uid, before.st_gid)


def test_link_inside_the_given_paths_is_written_through(tmp_path: Path) -> None:
    (tmp_path / "real.py").write_text(GOOD)
    (tmp_path / "alias.py").symlink_to("real.py")
    report = run([str(tmp_path)], Config(jobs=1), Mode.WRITE)
    assert [Path(o.path).name for o in report.files] == ["real.py"]  # rewritten once
    assert (tmp_path / "alias.py").is_symlink()
    assert ".to(device)" in (tmp_path / "real.py").read_text()
    # a link named on the command line: its target is what was asked for
    (tmp_path / "other.py").write_text(GOOD)
    (tmp_path / "named.py").symlink_to("other.py")
    report = run([str(tmp_path / "named.py")], Config(jobs=1), Mode.WRITE)
    assert report.files[0].status is Status.REWRITTEN
    assert (tmp_path / "named.py").is_symlink()
    assert ".to(device)" in (tmp_path / "other.py").read_text()


def test_link_outside_the_given_paths_is_left_and_said(tmp_path: Path) -> None:
    outside = tmp_path / "library"
    outside.mkdir()
    (outside / "shared.py").write_text(GOOD)
    project = tmp_path / "project"
    project.mkdir()
    (project / "shared.py").symlink_to(outside / "shared.py")
    report = run([str(project)], Config(jobs=1), Mode.WRITE)
    (outcome,) = report.files
    assert outcome.status is Status.ERROR
    assert outcome.error == (
        f"symbolic link to {outside / 'shared.py'}, outside the given paths; left as it is "
        "(name the target to rewrite it)"
    )
    assert (project / "shared.py").is_symlink()
    assert (outside / "shared.py").read_text() == GOOD


def _temporary(folder: Path, name: str, age_s: float) -> Path:
    p = folder / name
    p.write_text("half a file")
    old = time.time() - age_s
    os.utime(p, (old, old))
    return p


def _ours(folder: Path, pid: int, age_s: float, data: bytes = b"half a file") -> Path:
    """A temporary named as a write names it, holding the bytes its name's digest says."""
    from gpu2tpu.rewrite.files.atomic_write import digest

    p = folder / f".m.py.{pid}.abcd1234.{digest(data)}.gpu2tpu"
    p.write_bytes(data)
    old = time.time() - age_s
    os.utime(p, (old, old))
    return p


def test_stale_temporaries_of_a_killed_run_are_removed(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(GOOD)
    dead = _ours(tmp_path, 999999999, 3600)  # no such process
    assert run([str(tmp_path)], Config(jobs=1), Mode.CHECK).files  # check writes nothing...
    assert dead.exists()
    run([str(tmp_path)], Config(jobs=1), Mode.WRITE)  # ... rewrite cleans up
    assert not dead.exists()
    fresh = _ours(tmp_path, 999999999, 0)  # maybe mid-write
    live = _ours(tmp_path, os.getpid(), 3600)  # a live run's
    cut = _ours(tmp_path, 999999998, 3600)
    cut.write_bytes(b"half a fi")  # cut short mid-write: not provably ours
    os.utime(cut, (time.time() - 3600,) * 2)
    (tmp_path / "m.py").write_text(GOOD)
    run([str(tmp_path)], Config(jobs=1), Mode.WRITE)
    assert fresh.exists() and live.exists() and cut.exists()
    # a file named on the command line gets its own temporaries removed too
    live.unlink()
    again = _ours(tmp_path, 999999997, 3600)
    run([str(tmp_path / "m.py")], Config(jobs=1), Mode.WRITE)
    assert not again.exists()


def test_stdin_keeps_a_declared_encoding_and_a_bom() -> None:
    latin = "# -*- coding: latin-1 -*-\nimport torch\n# café\nx = torch.zeros(1).cuda()\n"
    proc = subprocess.run(
        [sys.executable, "-m", "gpu2tpu", "rewrite", "-"], input=latin.encode("latin-1"),
        capture_output=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "# café".encode("latin-1") in proc.stdout
    assert proc.stdout.decode("latin-1").count(".to(device)") == 1
    bom = b"\xef\xbb\xbf" + GOOD.encode()
    proc = subprocess.run(
        [sys.executable, "-m", "gpu2tpu", "rewrite", "-"], input=bom, capture_output=True,
        timeout=300,
    )  # fmt: skip
    assert proc.stdout.startswith(b"\xef\xbb\xbfimport torch\n")
    # an input that cannot be rewritten goes out byte for byte
    broken = "# -*- coding: latin-1 -*-\n# café\nx = torch.cuda(\n".encode("latin-1")
    proc = subprocess.run(
        [sys.executable, "-m", "gpu2tpu", "rewrite", "-"], input=broken, capture_output=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == broken
    assert proc.stderr.decode().startswith("error: -: syntax error")


def test_json_and_csv_are_utf8_for_a_file_name_that_is_not(tmp_path: Path) -> None:
    folder = os.fsencode(tmp_path)
    with open(os.path.join(folder, b"caf\xe9.py"), "wb") as handle:
        handle.write(GOOD.encode())
    proc = subprocess.run(
        [sys.executable, "-m", "gpu2tpu", "check", "--format", "json", "."], cwd=tmp_path,
        capture_output=True, timeout=300,
    )  # fmt: skip
    doc = json.loads(proc.stdout.decode("utf-8"))  # strict: raises on invalid UTF-8
    assert [f["path"] for f in doc["findings"]] == ["caf\\xe9.py"]
    proc = subprocess.run(
        [sys.executable, "-m", "gpu2tpu", "check", "--format", "csv", "."], cwd=tmp_path,
        capture_output=True, timeout=300,
    )  # fmt: skip
    assert "\ncaf\\xe9.py,,2,5,G2T101," in proc.stdout.decode("utf-8")
    # the text output, on a terminal whose encoding is strict, prints the name's own bytes
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    proc = subprocess.run(
        [sys.executable, "-m", "gpu2tpu", "check", "."], cwd=tmp_path, capture_output=True,
        timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.startswith(b"caf\xe9.py:2:5: G2T101")


def _children(pid: int) -> set[tuple[int, str]]:
    """The children of `pid`, each as (pid, start time): a pid alone may be reused."""
    found: set[tuple[int, str]] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            pids = {int(c) for c in (task / "children").read_text().split()}
        except OSError:
            continue
        found |= {(child, started) for child in pids if (started := _stat(child)[1])}
    return found


def _stat(pid: int) -> tuple[str, str]:
    """(state, start time in clock ticks) of a process, or ("", "") when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return "", ""
    return fields[0], fields[19]


def _alive(worker: tuple[int, str]) -> bool:
    """Still running, and still the same process (the machine may reuse its pid at once)."""
    state, started = _stat(worker[0])
    return started == worker[1] and state not in ("", "Z")


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc (Linux)")
def test_workers_stop_when_the_run_is_killed(tmp_path: Path) -> None:
    body = GOOD + "".join(f"y{i} = torch.ones({i}).cuda()\n" for i in range(50))
    for i in range(400):
        (tmp_path / f"m{i:03d}.py").write_text(body)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpu2tpu", "rewrite", "-q", "-j", "2", "."], cwd=tmp_path,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    workers: set[tuple[int, str]] = set()
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            workers |= _children(proc.pid)
            done = sum(".to(device)" in p.read_text() for p in tmp_path.glob("m*.py"))
            if len(workers) == 2 and done:
                break
            time.sleep(0.05)
        assert len(workers) == 2 and done < 400, "the run ended before it could be killed"
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 30
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(w) for w in workers), "workers outlived their parent"
        snapshot = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
        time.sleep(1.0)
        assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == snapshot
        assert not list(tmp_path.glob(".*.gpu2tpu")), "a write left its temporary file"
        whole = {body.encode(), run_text(body).encode()}
        for data in snapshot.values():  # every file is either as it was or fully rewritten
            assert data in whole
    finally:
        for worker in workers:
            if _alive(worker):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker[0], signal.SIGKILL)


def run_text(text: str) -> str:
    from gpu2tpu.rewrite.core.source import rewrite_source

    return rewrite_source(text).new_text


# -- never lose a user's file or edit (issue 26) --------------------------------------------------


def test_a_users_file_named_like_a_temporary_is_never_removed(tmp_path: Path) -> None:
    """Only a temporary that a gpu2tpu write provably made is removed: the user's own files
    that happen to match the pattern stay, however old."""
    (tmp_path / "m.py").write_text(GOOD)
    mine = [
        _temporary(tmp_path, ".m.py.k2j4h5g6.gpu2tpu", 3600),
        _temporary(tmp_path, ".m.py.999999999.abcd1234.gpu2tpu", 3600),
        _temporary(tmp_path, ".notes.txt.12345678.gpu2tpu", 3600),
    ]
    (tmp_path / "sub").mkdir()
    mine.append(_temporary(tmp_path / "sub", ".x.py.999999999.abcd1234.gpu2tpu", 3600))
    run([str(tmp_path)], Config(jobs=1), Mode.WRITE)
    run([str(tmp_path / "m.py")], Config(jobs=1), Mode.WRITE)
    assert [p.read_text() for p in mine] == ["half a file"] * len(mine)


def _killed_before_replace(path: Path) -> None:
    """A write killed (SIGKILL) after its temporary is complete, before the rename."""
    import multiprocessing

    def child() -> None:
        from gpu2tpu.rewrite.files import atomic_write

        def die(*args: object) -> None:
            os.kill(os.getpid(), signal.SIGKILL)

        atomic_write.os.replace = die  # type: ignore[assignment]
        atomic_write.write_atomic(str(path), "import torch\nx = 1\n", "utf-8")

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    process.join(60)
    assert process.exitcode == -signal.SIGKILL


def test_a_temporary_a_killed_write_left_is_removed(tmp_path: Path) -> None:
    p = tmp_path / "m.py"
    p.write_text(GOOD)
    _killed_before_replace(p)
    (left,) = tmp_path.glob(".m.py.*.gpu2tpu")
    old = time.time() - 3600
    os.utime(left, (old, old))
    run([str(tmp_path)], Config(jobs=1), Mode.CHECK)  # check writes nothing, removes nothing
    assert left.exists()
    run([str(tmp_path)], Config(jobs=1), Mode.WRITE)
    assert not left.exists()
    assert ".to(device)" in p.read_text()


def _edit_during_the_run(monkeypatch: pytest.MonkeyPatch, edit) -> None:  # type: ignore[no-untyped-def]
    """Call `edit(path)` after the rewrite has read a file, before it writes it back."""
    from gpu2tpu.rewrite.core import torch_target

    real = torch_target.rewrite_for_target

    def rewrite_then_edit(rewrite, text, options):  # type: ignore[no-untyped-def]
        result = real(rewrite, text, options)
        for p in Path(os.environ["EDIT_DIR"]).glob("*.py"):
            edit(p)
        return result

    monkeypatch.setattr(torch_target, "rewrite_for_target", rewrite_then_edit)


@pytest.mark.parametrize("same_size_and_time", [False, True])
def test_an_edit_saved_during_the_run_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, same_size_and_time: bool
) -> None:
    p = tmp_path / "m.py"
    p.write_text(GOOD)
    edited = GOOD.replace("zeros", "empty") if same_size_and_time else GOOD + "y = 2\n"

    def save(path: Path) -> None:
        before = path.stat()
        path.write_text(edited)
        if same_size_and_time:  # only the bytes tell
            os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))

    monkeypatch.setenv("EDIT_DIR", str(tmp_path))
    _edit_during_the_run(monkeypatch, save)
    for config in (Config(jobs=1), Config(isolate=False)):
        p.write_text(GOOD)
        report = run([str(p)], config, Mode.WRITE)
        (outcome,) = report.files
        assert outcome.status is Status.ERROR
        assert outcome.error == "changed during the run; left as it is"
        assert not outcome.edits, "an edit that was not written is not counted"
        assert p.read_text() == edited
        assert [q.name for q in tmp_path.iterdir()] == ["m.py"]


def test_a_read_only_file_is_left_and_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tmp_path / "ro.py"
    p.write_text(GOOD)
    p.chmod(0o444)
    (outcome,) = run([str(p)], Config(jobs=1), Mode.WRITE).files
    assert outcome.status is Status.ERROR
    assert outcome.error == "read-only file; left as it is (make it writable to rewrite it)"
    assert p.read_text() == GOOD and stat.S_IMODE(p.stat().st_mode) == 0o444
    assert not outcome.edits
    # writable by its mode, but not by this user (not the owner, and not root)
    q = tmp_path / "theirs.py"
    q.write_text(GOOD)
    real = os.access
    monkeypatch.setattr(os, "access", lambda f, m, **k: False if m == os.W_OK else real(f, m))
    (outcome,) = run([str(q)], Config(isolate=False), Mode.WRITE).files
    assert outcome.error == "read-only file; left as it is (make it writable to rewrite it)"
    assert q.read_text() == GOOD


# -- Ctrl-C at random moments (issue 26) ---------------------------------------------------------

# The command, started so that it says when gpu2tpu's own code runs: an interrupt before that
# lands in Python's start-up (site, runpy), which prints its own traceback, as for any Python
# program, and is not what this measures.
BOOT = (
    "import os, sys\n"
    "from gpu2tpu.cli import entry\n"
    "os.write(int(os.environ['READY_FD']), b'r')\n"
    "entry()\n"
)
INTERRUPTED = re.compile(r"interrupted: (\d+) files? written, (\d+) untouched")


def _interrupt_once(folder: Path, delay: float | None, originals: dict[str, bytes]) -> dict:
    """Start `rewrite -j 2`, send SIGINT to its process group (as a terminal's Ctrl-C does)
    `delay` seconds after gpu2tpu's code starts (None: never); what it said, how it ended,
    how long it ran from then."""
    for name, data in originals.items():
        (folder / name).write_bytes(data)
    read_end, write_end = os.pipe()
    env = {**os.environ, "READY_FD": str(write_end)}
    proc = subprocess.Popen(
        [sys.executable, "-c", BOOT, "rewrite", "-q", "-j", "2", "."], cwd=folder, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(write_end,),
        start_new_session=True,
    )  # fmt: skip
    os.close(write_end)
    try:
        assert os.read(read_end, 1) == b"r", "the command did not start"
        started = time.monotonic()
        if delay is not None:
            time.sleep(delay)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise AssertionError(f"a run interrupted after {delay:.3f} s hung") from None
    finally:
        os.close(read_end)
    return {"code": proc.returncode, "out": out.decode(), "err": err.decode(),
            "seconds": time.monotonic() - started}  # fmt: skip


def _interrupt_tree() -> tuple[dict[str, bytes], bytes]:
    body = GOOD + "".join(f"y{i} = torch.ones({i}).cuda()\n" for i in range(8))
    originals = {f"m{i:02d}.py": body.encode() for i in range(16)}
    return originals, run_text(body).encode()


def _check_interrupts(tmp_path: Path, delays: list[float]) -> None:
    originals, rewritten = _interrupt_tree()
    interrupted = 0
    for delay in delays:
        result = _interrupt_once(tmp_path, delay, originals)
        written = sum((tmp_path / n).read_bytes() == rewritten for n in originals)
        untouched = sum((tmp_path / n).read_bytes() == originals[n] for n in originals)
        assert written + untouched == len(originals), "a file is neither whole nor as it was"
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(originals), "a leftover"
        context = (delay, result)
        assert "Traceback" not in result["err"], context
        if result["code"] == 130:
            interrupted += 1
            (line,) = result["err"].splitlines()
            match = INTERRUPTED.fullmatch(line) or (
                line == "interrupted: 0 files written, every file untouched" and written == 0
            )
            assert match, context
            if match is not True:
                assert (int(match[1]), int(match[2])) == (written, untouched), context
        else:  # the run was over before the signal came
            assert result["code"] == 0 and not result["err"], context
            assert written == len(originals), context
    assert interrupted, "no run was interrupted: the moments drawn missed every run"


def test_ctrl_c_a_few_times(tmp_path: Path) -> None:
    """While the command loads, while it works, and near its end."""
    _check_interrupts(tmp_path, [0.01, 0.4, 0.8])


@pytest.mark.slow
def test_ctrl_c_at_sixty_random_moments(tmp_path: Path) -> None:
    """Each of 60 runs is interrupted at a moment drawn from the whole run: one line with the
    true counts (every file on disk is whole or as it was, and the counts say which), exit
    130, no traceback, no temporary left, never a hang (each run has 60 s)."""
    import random

    originals, _ = _interrupt_tree()
    whole = _interrupt_once(tmp_path, None, originals)  # how long a run takes, uninterrupted
    assert whole["code"] == 0, whole["err"]
    draw = random.Random()
    _check_interrupts(tmp_path, [draw.uniform(0, whole["seconds"] * 1.1) for _ in range(60)])
