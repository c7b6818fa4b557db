"""The codemod runs with fewer garbage collections, and gives the thresholds back
(rewrite/files/collector.py; docs/architecture.md, "Garbage collection")."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from gpu2tpu.rewrite.files import engine
from gpu2tpu.rewrite.files.collector import THRESHOLDS, fewer_collections
from gpu2tpu.rewrite.files.engine import Config, Mode, Status, run


def test_the_thresholds_hold_inside_the_block_and_come_back_after_it() -> None:
    before = gc.get_threshold()
    assert before != THRESHOLDS
    with fewer_collections():
        assert gc.get_threshold() == THRESHOLDS
    assert gc.get_threshold() == before
    with pytest.raises(RuntimeError), fewer_collections():
        raise RuntimeError("a run that fails")
    assert gc.get_threshold() == before


def test_a_run_processes_its_files_with_fewer_collections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the files' processing ran under (workers forked from it inherit it), and the
    caller's thresholds after the run: a notebook calling the engine keeps its own."""
    (tmp_path / "train.py").write_text("import torch\nx = torch.zeros(2).cuda()\n")
    seen: list[tuple[int, ...]] = []
    real = engine._process_all

    def recording(*args: object, **kwargs: object) -> object:
        seen.append(gc.get_threshold())
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(engine, "_process_all", recording)
    before = gc.get_threshold()
    report = run([str(tmp_path)], Config(jobs=1), Mode.CHECK)
    assert seen == [THRESHOLDS]
    assert gc.get_threshold() == before
    [outcome] = report.files
    assert outcome.status is Status.UNCHANGED and outcome.findings  # check writes nothing
