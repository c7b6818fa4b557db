"""Writes keep the encoding, BOM, newline style and file mode, and are atomic."""

from __future__ import annotations

import stat
from pathlib import Path

from gpu2tpu.rewrite.engine import Config, Mode, Status, run

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
