"""Bad input: one clear line naming the file and the reason; the file untouched; others go on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import run_cli
from gpu2tpu.rewrite.engine import Config, Mode, Status, run

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
