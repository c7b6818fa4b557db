"""At the edges of the operating system: special files, the standard streams, limits and the
configuration's own words, each driven through the real `gpu2tpu` command in a subprocess.

Every case asserts the exit status, the lines on standard error (one line per problem, never a
traceback), and every file's bytes, mode and kind afterwards. FIFOs, sockets and device nodes
are made in the test's folder (never /dev: only /dev/full is opened, for writing, as a child's
standard output); limits are set with `resource` in the child before it runs Python.

docs/bad-inputs.md lists the cases ("At the edges of the operating system");
`test_the_cases_are_documented` keeps it true.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import resource
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import ROOT

GOOD = "import torch\nx = torch.zeros(1).cuda()\n"
REWRITTEN = (
    "import torch\n\n"
    'device = torch.accelerator.current_accelerator(check_available=True) or torch.device("cpu")'
    "\n\nx = torch.zeros(1).to(device)\n"
)
CASES: list[str] = []  # every case's name, in the order docs/bad-inputs.md lists them


def case(*names: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register a test as the cases `names` of docs/bad-inputs.md (one per parameter)."""
    CASES.extend(names)

    def mark(test: Callable[..., None]) -> Callable[..., None]:
        return test

    return mark


@dataclass
class Ran:
    code: int
    out: bytes
    err: str

    def lines(self) -> list[str]:
        return self.err.splitlines()


def gpu2tpu(
    *args: str,
    cwd: Path,
    stdin: bytes | int | None = None,
    stdout: int | None = None,
    env: dict[str, str] | None = None,
    limits: Callable[[], None] | None = None,
    timeout: float = 120,
) -> Ran:
    """`gpu2tpu ARGS` in a child process; `stdout` a descriptor to write to (else a pipe)."""
    feed = stdin if isinstance(stdin, bytes) else None
    proc = subprocess.run(
        [sys.executable, "-m", "gpu2tpu", *args],
        cwd=cwd,
        input=feed,
        stdin=stdin
        if isinstance(stdin, int)
        else (None if feed is not None else subprocess.DEVNULL),
        stdout=stdout if stdout is not None else subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
        preexec_fn=limits,
        timeout=timeout,
    )
    return Ran(proc.returncode, proc.stdout or b"", proc.stderr.decode("utf-8", "replace"))


def snapshot(root: Path) -> dict[str, tuple[object, ...]]:
    """Every entry under `root`: a file's bytes, mode and owner; a link's target; another
    kind's type and device number."""
    found: dict[str, tuple[object, ...]] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder, name)
            st = path.lstat()
            rel = path.relative_to(root).as_posix()
            if stat.S_ISLNK(st.st_mode):
                found[rel] = ("link", os.readlink(path))
            elif stat.S_ISREG(st.st_mode):
                found[rel] = ("file", path.read_bytes(), st.st_mode, st.st_uid, st.st_gid)
            elif stat.S_ISDIR(st.st_mode):
                found[rel] = ("folder",)
            else:
                found[rel] = ("other", stat.S_IFMT(st.st_mode), st.st_rdev)
    return found


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "good.py").write_text(GOOD)
    return root


def expect(before: dict[str, tuple[object, ...]], root: Path, **changed: str) -> None:
    """Every entry is what it was, but the files in `changed` (name: their new text)."""
    after = snapshot(root)
    for name, text in changed.items():
        kind, _data, *rest = before[name]
        before = {**before, name: (kind, text.encode(), *rest)}
    assert after == before


def one_line(ran: Ran, says: str, code: int = 2) -> None:
    """Exactly one line on standard error, saying `says`; the exit status `code`."""
    assert "Traceback" not in ran.err, ran.err
    assert len(ran.lines()) == 1 and says in ran.err, ran.err
    assert ran.code == code, (ran.code, ran.err)


def quiet(ran: Ran, code: int) -> None:
    """No error and no warning line (the summary aside); the exit status `code`."""
    assert "Traceback" not in ran.err, ran.err
    assert not [ln for ln in ran.lines() if "error" in ln or "warning" in ln], ran.err
    assert ran.code == code, (ran.code, ran.err)


@contextlib.contextmanager
def reading(fifo: Path) -> Iterator[list[bytes]]:
    """A process that reads `fifo` to its end (started first, as a consumer is); what it read
    is in the list once the block ends."""
    got: list[bytes] = []
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    try:
        yield got
    finally:
        try:
            got.append(reader.communicate(timeout=30)[0])
        except subprocess.TimeoutExpired:  # the run never opened the FIFO: end the reader
            reader.kill()
            reader.communicate()


def device_node(path: Path, minor: int) -> None:
    """A character device made in the test's folder: 1,3 is a null device, 1,7 a full one
    (Linux's numbers). Making one needs root (CAP_MKNOD)."""
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root; CI and the dev machines run as root")
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))


def interrupt_after(seconds: float, *args: str, cwd: Path) -> tuple[Ran, float]:
    """`gpu2tpu ARGS` with standard input open and empty (a pipe this test holds open);
    Ctrl-C (SIGINT) after `seconds`. The exit status, what it said, and how long it took to
    end after the SIGINT."""
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpu2tpu", *args],
            cwd=cwd,
            stdin=read_end,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        time.sleep(seconds)
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        try:
            out, err = proc.communicate(timeout=20)
            took = time.monotonic() - sent
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            took = float("inf")
    finally:
        os.close(read_end)
        os.close(write_end)
    return Ran(proc.returncode, out, err.decode("utf-8", "replace")), took


# -- special files are never replaced -------------------------------------------------------------


# `check -o` and `rewrite --report`: the same writer, the report's own format.
REPORTS = {
    "check": (("check", "-o", "out"), 1, b"good.py:2:5: G2T101", {}),
    "rewrite": (("rewrite", "--report", "out"), 0, b"G2T101", {"good.py": REWRITTEN}),
}


@case("output-file-fifo", "report-fifo")
@pytest.mark.parametrize("command", list(REPORTS))
def test_a_report_into_a_fifo_is_written_as_a_stream(command: str, project: Path) -> None:
    args, code, says, changed = REPORTS[command]
    os.mkfifo(project / "out")
    before = snapshot(project)
    with reading(project / "out") as got:
        ran = gpu2tpu(*args, ".", cwd=project, timeout=60)
    quiet(ran, code)
    assert says in got[0], got
    expect(before, project, **changed)


@case("output-file-fifo-ctrl-c")
def test_a_fifo_nobody_reads_waits_and_ctrl_c_ends_it(project: Path) -> None:
    os.mkfifo(project / "report.txt")
    before = snapshot(project)
    ran, took = interrupt_after(3, "check", "-o", "report.txt", ".", cwd=project)
    one_line(ran, "interrupted: 0 files written", 130)
    assert took < 10
    expect(before, project)


@case("output-file-null-device")
def test_a_report_into_a_null_device_keeps_the_device(project: Path) -> None:
    device_node(project / "null", 3)
    before = snapshot(project)
    quiet(gpu2tpu("check", "-o", "null", ".", cwd=project), 1)
    expect(before, project)


@case("output-file-full-device", "report-full-device")
@pytest.mark.parametrize("command", list(REPORTS))
def test_a_report_into_a_full_device_is_one_line(command: str, project: Path) -> None:
    args, _code, _says, changed = REPORTS[command]
    device_node(project / "out", 7)
    before = snapshot(project)
    ran = gpu2tpu(*args, ".", cwd=project)
    one_line(ran, "gpu2tpu: error: cannot write out: No space left on device")
    expect(before, project, **changed)


@case("output-file-socket")
def test_a_report_onto_a_socket_is_refused(project: Path) -> None:
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(project / "sock"))
    before = snapshot(project)
    try:
        ran = gpu2tpu("check", "-o", "sock", ".", cwd=project)
    finally:
        server.close()
    one_line(ran, "gpu2tpu: error: cannot write sock: a socket")
    expect(before, project)


@case("output-file-is-the-config", "report-is-the-config", "output-file-is-the-pins")
@pytest.mark.parametrize(
    ("option", "path", "text"),
    [
        ("--output-file", "pyproject.toml", '[tool.gpu2tpu]\nignore = ["G2T6"]\n'),
        ("--report", "sub/pyproject.toml", '[tool.gpu2tpu]\nignore = ["G2T6"]\n'),
        ("--output-file", "requirements.txt", "torch>=2.6\n"),
    ],
)
def test_a_report_over_a_configuration_file_is_refused(
    option: str, path: str, text: str, project: Path
) -> None:
    (project / path).parent.mkdir(exist_ok=True)
    (project / path).write_text(text)
    before = snapshot(project)
    command = "check" if option == "--output-file" else "rewrite"
    ran = gpu2tpu(command, option, path, ".", cwd=project)
    one_line(ran, f"{option} {path} is a configuration file this run reads")
    expect(before, project)


def _repository(root: Path) -> None:
    (root / ".git" / "info").mkdir(parents=True)
    (root / "skipped.py").write_text(GOOD)


@case("gitignore-fifo")
def test_a_gitignore_that_is_a_fifo_is_not_opened(project: Path) -> None:
    _repository(project)
    os.mkfifo(project / ".gitignore")
    before = snapshot(project)
    ran = gpu2tpu("rewrite", ".", cwd=project, timeout=60)
    one_line(ran, "warning: .gitignore: not a regular file; its patterns are not read", 0)
    expect(before, project, **{"good.py": REWRITTEN, "skipped.py": REWRITTEN})


@case("git-info-exclude-fifo")
def test_an_info_exclude_that_is_a_fifo_is_not_opened(project: Path) -> None:
    _repository(project)
    os.mkfifo(project / ".git" / "info" / "exclude")
    (project / ".gitignore").write_text("skipped.py\n")
    before = snapshot(project)
    ran = gpu2tpu("rewrite", ".", cwd=project, timeout=60)
    one_line(ran, "warning: .git/info/exclude: not a regular file; its patterns are not read", 0)
    expect(before, project, **{"good.py": REWRITTEN})


@case("setuid-setgid-kept")
def test_a_rewrite_keeps_setuid_setgid_and_the_owner(project: Path) -> None:
    good = project / "good.py"
    if os.geteuid() == 0:
        os.chown(good, 4321, 4321)  # another owner: giving it back after the write is root's
    good.chmod(0o6755)
    before = snapshot(project)
    assert stat.S_IMODE(good.stat().st_mode) == 0o6755
    quiet(gpu2tpu("rewrite", ".", cwd=project), 0)
    expect(before, project, **{"good.py": REWRITTEN})


@case("xattrs-kept")
def test_a_rewrite_keeps_extended_attributes(project: Path) -> None:
    good = project / "good.py"
    if not hasattr(os, "setxattr"):
        pytest.skip("extended attributes through os: Linux only")
    try:
        os.setxattr(good, "user.origin", b"vendor")
    except OSError as err:
        pytest.skip(f"this file system takes no user attributes ({err.strerror})")
    quiet(gpu2tpu("rewrite", ".", cwd=project), 0)
    assert good.read_text() == REWRITTEN
    assert os.getxattr(good, "user.origin") == b"vendor"


@case("hard-link-other-name")
def test_the_other_name_of_a_hard_link_keeps_the_old_text(project: Path) -> None:
    os.link(project / "good.py", project / "copy.txt")
    before = snapshot(project)
    quiet(gpu2tpu("rewrite", ".", cwd=project), 0)
    expect(before, project, **{"good.py": REWRITTEN})  # copy.txt: the old text (documented)


# -- the standard streams -------------------------------------------------------------------------


@contextlib.contextmanager
def full_device() -> Iterator[int]:
    """/dev/full opened for writing, as a child's standard output (the device itself is only
    opened, never replaced)."""
    fd = os.open("/dev/full", os.O_WRONLY)
    try:
        yield fd
    finally:
        os.close(fd)


@case("stdout-full-check", "stdout-full-rewrite")
@pytest.mark.parametrize("command", ["check", "rewrite"])
def test_a_full_stdout_is_one_line(command: str, project: Path) -> None:
    before = snapshot(project)
    with full_device() as full:
        ran = gpu2tpu(command, ".", cwd=project, stdout=full)
    one_line(ran, "gpu2tpu: error: cannot write to standard output: No space left on device")
    expect(before, project, **({"good.py": REWRITTEN} if command == "rewrite" else {}))


@case("stdout-full-stdin")
def test_rewrite_stdin_onto_a_full_stdout_is_one_line(project: Path) -> None:
    before = snapshot(project)
    with full_device() as full:
        ran = gpu2tpu("rewrite", "-", cwd=project, stdin=GOOD.encode(), stdout=full)
    one_line(ran, "gpu2tpu: error: cannot write to standard output: No space left on device")
    expect(before, project)


def _close(fd: int) -> Callable[[], None]:
    return lambda: os.close(fd)


@case("stdout-closed-check")
def test_check_with_stdout_closed_is_one_line(project: Path) -> None:
    before = snapshot(project)
    ran = gpu2tpu("check", ".", cwd=project, limits=_close(1))
    one_line(ran, "gpu2tpu: error: standard output is closed")
    expect(before, project)


@case("stdout-closed-stdin")
def test_rewrite_stdin_with_stdout_closed_is_one_line(project: Path) -> None:
    before = snapshot(project)
    ran = gpu2tpu("rewrite", "-", cwd=project, stdin=GOOD.encode(), limits=_close(1))
    one_line(ran, "gpu2tpu: error: standard output is closed")
    expect(before, project)


def _file_size_limit(size: int) -> Callable[[], None]:
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))


@case("stdout-short-write-stdin")
def test_rewrite_stdin_cut_short_by_a_file_size_limit_exits_2(project: Path) -> None:
    text = "import torch\n" + "x = torch.zeros(1).cuda()\n" * 530  # 13,807 bytes
    out_path = project.parent / "out.py"
    before = snapshot(project)
    with out_path.open("wb") as out:
        ran = gpu2tpu(
            "rewrite", "-", cwd=project, stdin=text.encode(), stdout=out.fileno(),
            limits=_file_size_limit(4096),
        )  # fmt: skip
    one_line(ran, "gpu2tpu: error: cannot write to standard output: File too large")
    assert out_path.stat().st_size <= 4096
    expect(before, project)


@case("stdout-short-write-check")
def test_check_cut_short_by_a_file_size_limit_exits_2(project: Path) -> None:
    (project / "many.py").write_text("import torch\n" + "x = torch.zeros(1).cuda()\n" * 200)
    out_path = project.parent / "out.json"
    before = snapshot(project)
    with out_path.open("wb") as out:
        ran = gpu2tpu(
            "check", "--format", "json", ".", cwd=project, stdout=out.fileno(),
            limits=_file_size_limit(4096),
        )  # fmt: skip
    one_line(ran, "gpu2tpu: error: cannot write to standard output: File too large")
    expect(before, project)


@case("stderr-closed")
def test_with_stderr_closed_the_errors_go_to_stdout_and_the_status_is_2(project: Path) -> None:
    (project / "broken.py").write_text("import torch\nx = torch.zeros(1).cuda(\n")
    before = snapshot(project)
    ran = gpu2tpu("rewrite", ".", cwd=project, limits=_close(2))
    assert ran.code == 2 and ran.err == ""
    out = ran.out.decode()
    assert "Traceback" not in out
    assert "error: ./broken.py: syntax error" in out or "error: broken.py: syntax error" in out
    assert "1 file rewritten" in out, out
    expect(before, project, **{"good.py": REWRITTEN})


@case("stderr-closed-stdin")
def test_rewrite_stdin_with_stderr_closed_gives_the_text_back(project: Path) -> None:
    before = snapshot(project)
    ran = gpu2tpu("rewrite", "-", cwd=project, stdin=GOOD.encode(), limits=_close(2))
    assert (ran.code, ran.out, ran.err) == (2, GOOD.encode(), "")
    expect(before, project)


@case("stdin-closed")
def test_rewrite_stdin_with_stdin_closed_is_one_line(project: Path) -> None:
    before = snapshot(project)
    ran = gpu2tpu("rewrite", "-", cwd=project, limits=_close(0))
    one_line(ran, "gpu2tpu: error: standard input is closed")
    assert ran.out == b""
    expect(before, project)


@case("stdout-ascii-diff")
def test_a_diff_onto_an_ascii_stdout_escapes(project: Path) -> None:
    (project / "good.py").write_text("import torch  # café\nx = torch.zeros(1).cuda()\n")
    before = snapshot(project)
    ran = gpu2tpu("rewrite", "--diff", ".", cwd=project, env={"PYTHONIOENCODING": "ascii"})
    quiet(ran, 1)
    assert b" import torch  # caf\\xe9\n" in ran.out
    assert b"+x = torch.zeros(1).to(device)\n" in ran.out
    expect(before, project)


@case("stdout-latin1-check")
def test_findings_onto_a_latin1_stdout_escape(project: Path) -> None:
    (project / "日本.py").write_text(GOOD)
    before = snapshot(project)
    ran = gpu2tpu("check", ".", cwd=project, env={"PYTHONIOENCODING": "latin-1"})
    quiet(ran, 1)
    assert b"\\u65e5\\u672c.py:2:5: G2T101" in ran.out, ran.out
    expect(before, project)


@case("stdin-ctrl-c-rewrite", "stdin-ctrl-c-check")
@pytest.mark.parametrize("command", ["rewrite", "check"])
def test_ctrl_c_ends_a_wait_on_stdin(command: str, project: Path) -> None:
    before = snapshot(project)
    ran, took = interrupt_after(3, command, "-", cwd=project)
    one_line(ran, "interrupted: 0 files written", 130)
    assert took < 10 and ran.out == b""
    expect(before, project)


@case("stdin-over-size-limit")
def test_stdin_obeys_the_file_size_limit(project: Path) -> None:
    text = ("import torch\n" + "x = torch.zeros(1).cuda()\n" * 370_000).encode()  # 9.2 MiB
    before = snapshot(project)
    ran = gpu2tpu("rewrite", "-", cwd=project, stdin=text, timeout=60)
    one_line(ran, "error: -: input is 9.2 MiB, over the 8 MiB limit")
    assert ran.out == text
    expect(before, project)


# -- configuration and environment -----------------------------------------------------------------


def _config(root: Path, table: str) -> None:
    (root / "pyproject.toml").write_text(f"[tool.gpu2tpu]\n{table}\n")


@case("ignore-all", "ignore-all-option", "select-empty")
@pytest.mark.parametrize(
    ("table", "args"),
    [
        ('ignore = ["ALL"]', ("check", ".")),
        ("", ("rewrite", "--ignore", "ALL", ".")),
        ("select = []", ("rewrite", ".")),  # ruff's `select = []` selects nothing too
    ],
)
def test_no_rule_selected_checks_nothing_and_says_so(
    table: str, args: tuple[str, ...], project: Path
) -> None:
    if table:
        _config(project, table)
    before = snapshot(project)
    ran = gpu2tpu(*args, cwd=project)
    one_line(ran, "warning: no rule is selected", 0)
    assert b"G2T" not in ran.out
    expect(before, project)


@case("select-over-ignore-all", "ignore-option-adds-to-the-config")
@pytest.mark.parametrize(
    ("table", "option", "code", "shown"),
    [  # the more specific code wins; an --ignore alone takes rules from the table's selection
        ('select = ["G2T101"]\nignore = ["ALL"]', (), 1, b"good.py:2:5: G2T101"),
        ('ignore = ["G2T101"]', ("--ignore", "G2T108"), 0, b""),
    ],
)
def test_select_and_ignore_resolve_as_in_ruff(
    table: str, option: tuple[str, ...], code: int, shown: bytes, project: Path
) -> None:
    _config(project, table)
    (project / "sync.py").write_text("import torch\ntorch.cuda.synchronize()\n")  # G2T108
    before = snapshot(project)
    ran = gpu2tpu("check", *option, ".", cwd=project)
    quiet(ran, code)
    findings = re.findall(rb"^(\S+:\d+:\d+: G2T\d+) ", ran.out, re.MULTILINE)
    assert findings == ([shown] if shown else []), ran.out
    expect(before, project)


@case("select-option-empty")
def test_an_empty_select_option_is_refused_as_in_ruff(project: Path) -> None:
    before = snapshot(project)
    ran = gpu2tpu("check", "--select", "", ".", cwd=project)
    one_line(ran, "gpu2tpu: error: --select names no rule code")
    expect(before, project)


@case("gitignore-trailing-backslash")
def test_a_gitignore_line_ending_in_a_backslash_matches_nothing_as_in_git(project: Path) -> None:
    _repository(project)
    (project / ".gitignore").write_text("foo\\\nskipped.py\n")
    before = snapshot(project)
    quiet(gpu2tpu("rewrite", ".", cwd=project), 0)
    expect(before, project, **{"good.py": REWRITTEN})


@case("gitignore-unreadable-pattern")
def test_a_gitignore_pattern_the_library_cannot_read_is_one_warning(project: Path) -> None:
    _repository(project)
    (project / ".gitignore").write_text("[z-a]\nskipped.py\n")
    before = snapshot(project)
    ran = gpu2tpu("rewrite", ".", cwd=project)
    one_line(ran, "warning: .gitignore:1: pattern `[z-a]` cannot be read", 0)
    expect(before, project, **{"good.py": REWRITTEN})


def _remove_cwd() -> None:
    os.rmdir(os.getcwd())  # the child runs in its folder (cwd is set before this runs)


@case("deleted-working-folder")
def test_a_deleted_working_folder_is_one_line(project: Path) -> None:
    gone = project / "gone"
    gone.mkdir()
    before = snapshot(project)
    ran = gpu2tpu("rewrite", str(project), cwd=gone, limits=_remove_cwd)
    one_line(ran, "gpu2tpu: error: the current folder no longer exists")
    del before["gone"]
    expect(before, project)


def _many(root: Path, count: int) -> dict[str, str]:
    for i in range(count):
        (root / f"m{i:02}.py").write_text(GOOD)
    return {f"m{i:02}.py": REWRITTEN for i in range(count)}


@case("open-files-10")
def test_ten_open_files_fall_back_to_one_process(project: Path) -> None:
    changed = _many(project, 20)
    before = snapshot(project)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (10, 10))

    ran = gpu2tpu("rewrite", "-j", "2", ".", cwd=project, limits=limit)
    one_line(ran, "warning: cannot start worker processes", 0)
    expect(before, project, **{"good.py": REWRITTEN}, **changed)


_PR_CAPBSET_DROP = 24
_CAP_SYS_ADMIN, _CAP_SYS_RESOURCE = 21, 24


def _one_process() -> None:
    """A process limit of 1: no fork can succeed. The kernel never applies RLIMIT_NPROC to
    root (uid 0, or CAP_SYS_ADMIN/CAP_SYS_RESOURCE), so root's child takes nobody's real uid
    (its count of processes) and drops those two capabilities; it keeps root's effective uid
    to read the interpreter and the test's files."""
    if os.getuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        for cap in (_CAP_SYS_ADMIN, _CAP_SYS_RESOURCE):
            if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                os._exit(97)
        os.setresuid(65534, 0, 0)
    resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))


@case("processes-1")
def test_a_process_limit_of_one_falls_back_to_one_process(project: Path) -> None:
    changed = _many(project, 20)
    before = snapshot(project)
    ran = gpu2tpu("rewrite", "-j", "2", ".", cwd=project, limits=_one_process)
    one_line(ran, "warning: cannot start worker processes", 0)
    expect(before, project, **{"good.py": REWRITTEN}, **changed)


# -- every documented value of every [tool.gpu2tpu] key ----------------------------------------------

# One project for every value: each file has a fix of its own rule (G2T101, G2T108, G2T202 with
# the unsafe G2T212, G2T302 that needs torch 2.9), one in a sub-folder, one that .gitignore
# leaves out.
PROJECT = {
    "good.py": GOOD,
    "sync.py": "import torch\ntorch.cuda.synchronize()\n",
    "half.py": "import torch\nwith torch.autocast('cuda', dtype=torch.float16):\n    pass\n",
    "mem.py": "import torch\nm = torch.cuda.memory_allocated()\n",
    "sub/inner.py": GOOD,
    "ignored.py": GOOD,
    ".gitignore": "ignored.py\n",
}
EVERY = tuple(name for name in PROJECT if name.endswith(".py") and name != "ignored.py")


@dataclass(frozen=True)
class Value:
    """A documented value of a key: the files `rewrite --diff` shows a change for, and what
    else its output says."""

    table: str
    changed: tuple[str, ...]
    says: str = ""
    code: int = 1


VALUES = {
    "exclude-a-glob": Value('exclude = ["sub/*.py"]', EVERY[:-1]),
    "exclude-a-folder": Value('exclude = ["sub"]', EVERY[:-1]),
    "exclude-empty": Value("exclude = []", EVERY),
    "select-a-code": Value('select = ["G2T101"]', ("good.py", "sub/inner.py")),
    "select-a-prefix": Value('select = ["G2T3"]', ("mem.py",)),
    "select-all": Value('select = ["ALL"]', EVERY),
    "select-empty": Value("select = []", (), "warning: no rule is selected", 0),
    "ignore-a-code": Value('ignore = ["G2T101"]', ("sync.py", "half.py", "mem.py")),
    "ignore-a-prefix": Value('ignore = ["G2T1"]', ("half.py", "mem.py")),
    "ignore-all": Value('ignore = ["ALL"]', (), "warning: no rule is selected", 0),
    "ignore-empty": Value("ignore = []", EVERY),
    "unsafe-fixes-true": Value("unsafe-fixes = true", EVERY, "dtype=torch.bfloat16"),
    "unsafe-fixes-false": Value("unsafe-fixes = false", EVERY, "dtype=torch.float16"),
    "max-file-size-bytes": Value(
        "max-file-size = 39", ("good.py", "sync.py", "sub/inner.py"), "mem.py: file is", 2
    ),
    "target-torch-2.6": Value(
        'target-torch = "2.6"', EVERY[:3] + EVERY[4:], "than target-torch 2.6"
    ),
    "target-torch-2.10": Value('target-torch = "2.10"', EVERY),
    "respect-gitignore-true": Value("respect-gitignore = true", EVERY),
    "respect-gitignore-false": Value("respect-gitignore = false", (*EVERY, "ignored.py")),
}


@pytest.mark.parametrize("name", list(VALUES))
def test_every_documented_value_of_every_key(name: str, tmp_path: Path) -> None:
    value = VALUES[name]
    for rel, text in {**PROJECT, "pyproject.toml": f"[tool.gpu2tpu]\n{value.table}\n"}.items():
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / ".git").mkdir()
    before = snapshot(tmp_path)
    ran = gpu2tpu("rewrite", "--diff", ".", cwd=tmp_path)
    assert "Traceback" not in ran.err, ran.err
    assert ran.code == value.code, (ran.code, ran.err)
    diff = ran.out.decode()
    shown = tuple(ln[4:] for ln in diff.splitlines() if ln.startswith("--- "))
    assert shown == tuple(sorted(value.changed, key=lambda n: ("/" in n, n))), diff  # walk order
    assert value.says in diff + ran.err, ran.err
    expect(before, tmp_path)


def test_the_cases_are_documented() -> None:
    doc = (ROOT / "docs" / "bad-inputs.md").read_text()
    section = doc.split("# At the edges of the operating system", 1)[1]
    listed = [ln.split("`")[1] for ln in section.splitlines() if ln.startswith("| `")]
    assert listed == [*CASES, *VALUES]
