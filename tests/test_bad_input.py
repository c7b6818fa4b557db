"""Bad input: one clear line naming the file and the reason; the file untouched; others go on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import run_cli
from gpu2tpu.rewrite.files.engine import Config, Mode, Status, run

GOOD = "import torch\nx = torch.zeros(1).cuda()\n"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "good.py").write_text(GOOD)
    return tmp_path


def _check_one_bad(tree: Path, name: str, reason: str) -> None:
    bad = tree / name
    before = bad.read_bytes() if bad.exists() and not bad.is_symlink() else None
    proc = run_cli("rewrite", ".", cwd=tree)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith(f"error: ./{name}: ") or errors[0].startswith(f"error: {name}: ")
    assert reason in errors[0]
    assert proc.returncode == 2
    if before is not None:
        assert bad.read_bytes() == before
    assert ".to(device)" in (tree / "good.py").read_text(), "the good file was not processed"


def test_syntax_error(tree: Path) -> None:
    (tree / "broken.py").write_text("import torch\nx = torch.zeros(1).cuda(\n")
    _check_one_bad(tree, "broken.py", "syntax error")


def test_non_utf8(tree: Path) -> None:
    (tree / "latin.py").write_bytes(b"import torch\n# caf\xe9\nx = torch.zeros(1).cuda()\n")
    _check_one_bad(tree, "latin.py", "not valid UTF-8 text")


def test_binary_named_py(tree: Path) -> None:
    (tree / "blob.py").write_bytes(b"\x7fELF\x00\x01cuda\x00" * 50)
    _check_one_bad(tree, "blob.py", "binary file")


def test_very_large_file(tree: Path) -> None:
    big = "import torch\n" + "x = torch.zeros(1).cuda()\n" * 400_000
    (tree / "big.py").write_text(big)
    _check_one_bad(tree, "big.py", "over the 8 MiB limit")


def test_symlink_loop(tree: Path) -> None:
    os.symlink("loop.py", tree / "loop.py")
    proc = run_cli("rewrite", "loop.py", "good.py", cwd=tree)
    assert proc.returncode == 2
    assert "error: loop.py: symbolic link loop" in proc.stderr
    assert ".to(device)" in (tree / "good.py").read_text()


def test_missing_path(tree: Path) -> None:
    proc = run_cli("check", "nowhere.py", "good.py", cwd=tree)
    assert proc.returncode == 2
    assert "error: nowhere.py: no such file or directory" in proc.stderr
    assert "good.py:2:5: G2T101" in proc.stdout


def test_empty_file_is_left_alone(tree: Path) -> None:
    (tree / "empty.py").write_text("")
    proc = run_cli("rewrite", ".", cwd=tree)
    assert proc.returncode == 0, proc.stderr
    assert (tree / "empty.py").read_bytes() == b""
    assert "error" not in proc.stderr


def test_unreadable_file(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Root can read any file whatever its mode, so the denial is injected at the read.
    locked = tree / "locked.py"
    locked.write_text(GOOD)
    real = Path.read_bytes

    def read_bytes(self: Path) -> bytes:
        if self.name == "locked.py":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    report = run([str(tree)], Config(jobs=1), Mode.WRITE)
    by_name = {Path(o.path).name: o for o in report.files}
    assert by_name["locked.py"].status is Status.ERROR
    assert by_name["locked.py"].error == "permission denied"
    assert by_name["good.py"].status is Status.REWRITTEN
    assert locked.read_text() == GOOD


def test_unreadable_folder_entry_reported(tree: Path) -> None:
    os.symlink("missing-target.py", tree / "dangling.py")
    proc = run_cli("check", "dangling.py", cwd=tree)
    assert proc.returncode == 2
    assert "error: dangling.py: broken symbolic link" in proc.stderr


# -- input that breaks parsers, and workers that die ----------------------------------------------

DEEP_BRACKETS = (
    "import torch\nx = " + "(" * 3000 + "1" + ")" * 3000 + "\ny = torch.zeros(1).cuda()\n"
)
AND_CHAIN = " and ".join(["a"] * 8000)


def _errors(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("error:")]


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_deep_nesting_is_one_error_line_and_the_run_goes_on(tree: Path, jobs: str) -> None:
    # 3,000 brackets and an 8,000-term `and` chain holding `.cuda()`: libcst's native parser
    # would overflow its stack (SIGSEGV with -j 1, BrokenProcessPool with -j 2)
    (tree / "brackets.py").write_text(DEEP_BRACKETS)
    (tree / "chain.py").write_text(f"import torch\nok = {AND_CHAIN} and x.cuda()\n")
    for i in range(16):  # enough files for two workers
        (tree / f"more{i}.py").write_text(GOOD)
    proc = run_cli("rewrite", "-j", jobs, ".", cwd=tree)
    errors = sorted(_errors(proc.stderr))
    assert len(errors) == 2, proc.stderr
    assert errors[0].startswith("error: brackets.py: syntax error: too many nested parentheses")
    assert errors[1].startswith("error: chain.py: a statement nested 8002 levels deep")
    assert errors[1].endswith("(line 2); file left as it is")
    assert proc.returncode == 2
    assert "17 files rewritten" in proc.stdout, proc.stdout
    assert (tree / "brackets.py").read_text() == DEEP_BRACKETS


def test_a_deep_statement_without_cuda_is_kept_aside(tree: Path) -> None:
    # nothing to rewrite in the chain: it is held out of libcst's parse and put back verbatim
    text = f"import torch\nok = {AND_CHAIN}\ny = torch.zeros(1).cuda()\n"
    (tree / "chain.py").write_text(text)
    proc = run_cli("rewrite", "chain.py", cwd=tree)
    assert proc.returncode == 0, proc.stderr
    new = (tree / "chain.py").read_text()
    assert f"ok = {AND_CHAIN}\n" in new and "torch.zeros(1).to(device)" in new


def test_long_operator_chains_are_bounded(tree: Path) -> None:
    # libcst takes super-linear time on long chains (2,000 `+` terms: about 20 s): a chain
    # past the limit never reaches it. Python itself cannot compile 4,000 terms: an error.
    chain = " + ".join(["a"] * 1500)
    (tree / "sum.py").write_text(f"import torch\ns = {chain}\ny = torch.zeros(1).cuda()\n")
    (tree / "huge.py").write_text("import torch\ns = x.cuda() + " + " + ".join(["a"] * 4000) + "\n")
    proc = run_cli("rewrite", "sum.py", "huge.py", cwd=tree)
    (error,) = _errors(proc.stderr)
    assert error.startswith("error: huge.py: too deeply nested for Python's parser")
    assert f"s = {chain}\n" in (tree / "sum.py").read_text()
    assert ".to(device)" in (tree / "sum.py").read_text()


def test_valid_python_that_libcst_rejects(tree: Path) -> None:
    concat = " ".join(f'"piece{i}"' for i in range(1000))
    text = f"import torch\n(y): int = 1\nmessage = ({concat})\nx = torch.zeros(1).cuda()\n"
    (tree / "valid.py").write_text(text)
    proc = run_cli("rewrite", "valid.py", cwd=tree)
    assert proc.returncode == 0, proc.stderr
    new = (tree / "valid.py").read_text()
    assert "(y): int = 1\n" in new and f"message = ({concat})\n" in new
    assert "torch.zeros(1).to(device)" in new
    # the same statement with something to rewrite in it cannot be held aside: one error line
    (tree / "inside.py").write_text("import torch\n(y): int = torch.zeros(1).cuda()\n")
    proc = run_cli("rewrite", "inside.py", cwd=tree)
    (error,) = _errors(proc.stderr)
    assert error.startswith("error: inside.py: a statement that libcst's parser rejects")
    assert error.endswith("(line 2); file left as it is")


def test_unparseable_file_without_cuda_is_not_reported(tree: Path) -> None:
    # the prefilter never parses a file with no token of any rule (README, "bad input")
    (tree / "py2.py").write_text("print 'hello'\n")
    proc = run_cli("rewrite", ".", cwd=tree)
    assert proc.returncode == 0 and not _errors(proc.stderr)
    assert "1 file rewritten" in proc.stdout


def test_exit_code_after_a_complete_rewrite_is_zero(tree: Path) -> None:
    proc = run_cli("rewrite", "good.py", cwd=tree)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = run_cli("rewrite", "good.py", cwd=tree)  # nothing left: still 0
    assert proc.returncode == 0


def _crash_on(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the worker die in native code (SIGSEGV) on the file called `name`."""
    import signal

    from gpu2tpu.rewrite.files import engine

    real = engine._process_file

    def process(path: str, *args: object) -> object:
        if Path(path).name == name:
            import faulthandler

            faulthandler.disable()  # pytest's handler would print the worker's stack
            os.kill(os.getpid(), signal.SIGSEGV)
        return real(path, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(engine, "_process_file", process)


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_crashing_worker_costs_one_file(
    tree: Path, monkeypatch: pytest.MonkeyPatch, jobs: int
) -> None:
    for i in range(30):
        (tree / f"m{i:02d}.py").write_text(GOOD)
        # files without a token, answered in bulk before the batch's real work
        (tree / f"m{i:02d}_plain.py").write_text(f"x = {i}\n")
    _crash_on("m07.py", monkeypatch)
    report = run([str(tree)], Config(jobs=jobs), Mode.WRITE)
    by_name = {Path(o.path).name: o for o in report.files}
    assert len(by_name) == 61
    crashed = by_name.pop("m07.py")
    assert crashed.status is Status.ERROR
    assert crashed.error == "the worker processing this file crashed (SIGSEGV); file left as it is"
    assert (tree / "m07.py").read_text() == GOOD
    plain = {n: o for n, o in by_name.items() if n.endswith("_plain.py")}
    assert {o.status for o in plain.values()} == {Status.PREFILTERED}
    assert {o.status for n, o in by_name.items() if n not in plain} == {Status.REWRITTEN}


def test_positions_after_a_held_statement_are_the_original_ones() -> None:
    from gpu2tpu.rewrite.core.model import Options
    from gpu2tpu.rewrite.core.source import rewrite_source

    chain = " and ".join(["a"] * 400)  # held out of libcst's parse: a placeholder stands in
    text = f"import torch\nok = ({chain}\n      and b); y = torch.ones(1).cuda()\nx = torch.zeros(1).cuda()\n"
    result = rewrite_source(text, Options(fix=False))
    found = sorted((f.line, f.col) for f in result.findings if f.code == "G2T101")
    assert found == [(3, 19), (4, 5)]
    new = rewrite_source(text).new_text
    assert f"ok = ({chain}\n      and b); y = torch.ones(1).to(device)\n" in new
