"""benchmarks/gpu_row.py: the row a GPU session measures is one the published-runs table takes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from script_module import load_script

from gpu2tpu.pricing.published import DEFAULT_PATH, load_published_runs

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def gpu_row():  # type: ignore[no-untyped-def]
    return load_script(ROOT / "benchmarks" / "gpu_row.py", "gpu_row")


@pytest.mark.slow  # a one-layer TinyLlama trained two steps on the CPU
def test_a_smoke_run_prints_a_row_the_table_loads(gpu_row, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    argv = ["--device", "cpu", "--layers", "1", "--sequence", "32", "--batch", "1"]
    assert gpu_row.main([*argv, "--steps", "2", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    block, _, expected = out.partition("\n# ")
    assert expected.startswith("expected")
    table = tmp_path / "runs.toml"
    table.write_text(DEFAULT_PATH.read_text(encoding="utf-8") + "\n" + block, encoding="utf-8")
    run = next(r for r in load_published_runs(table) if r.source_group == "gpu2tpu")
    assert run.id.endswith("-smoke") and "not for the table" in run.notes
    assert run.model.key == "tinyllama_1_1b" and run.sequence == 32
    assert run.tokens_per_s_per_chip > 0 and run.recompute == ()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here")
def test_without_cuda_it_says_so_and_stops(gpu_row, capsys) -> None:  # type: ignore[no-untyped-def]
    assert gpu_row.main([]) == 2
    assert "no CUDA device" in capsys.readouterr().err
