"""scripts/mlperf_rates.py: the training rate the published MLPerf rows are converted with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from script_module import load_script

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "mlperf_rates.py"


@pytest.fixture(scope="module")
def rates():  # type: ignore[no-untyped-def]
    return load_script(SCRIPT, "mlperf_rates")


def _line(key: str, ms: int, value: object = None, **meta: object) -> str:
    event = {"namespace": "", "time_ms": ms, "key": key, "value": value, "metadata": meta}
    return ":::MLLOG " + json.dumps(event)


def _log(evaluations: bool) -> list[str]:
    """A warm-up block of 100 epochs, then three of 10, each 1 s an epoch; every block ends
    in a 4 s evaluation, logged or not."""
    lines, t, first = ["noise", _line("samples_per_epoch", 0, 192)], 1000, 1
    for epochs in (100, 10, 10, 10):
        lines.append(_line("block_start", t, first_epoch_num=first, epoch_count=epochs))
        t += epochs * 1000
        if evaluations:
            lines += [_line("eval_start", t), _line("eval_stop", t + 4000)]
        t += 4000
        lines.append(_line("block_stop", t, first_epoch_num=first, epoch_count=epochs))
        first += epochs
    return lines + [':::MLLOG {"cut']


def test_evaluations_inside_blocks_are_not_training_time(rates) -> None:  # type: ignore[no-untyped-def]
    log = rates.events(_log(evaluations=True))
    assert rates.samples_per_second(log, 168, repeat_blocks=False) == pytest.approx(192)
    # the log's own samples_per_epoch wins over the default
    assert len(rates.blocks(log)) == 4


def test_unlogged_evaluations_are_inferred_from_blocks_of_two_sizes(rates) -> None:  # type: ignore[no-untyped-def]
    log = rates.events(_log(evaluations=False))
    # read naively, each 10-epoch block's 4 s evaluation counts as training time
    assert rates.samples_per_second(log, 168, repeat_blocks=False) == pytest.approx(192 * 10 / 14)
    assert rates.samples_per_second(log, 168, repeat_blocks=True) == pytest.approx(192)


def test_the_command_names_a_folder_without_logs(rates, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert rates.main([str(tmp_path), "8"]) == 1
    assert str(tmp_path) in capsys.readouterr().err
    (tmp_path / "result_0.txt").write_text("\n".join(_log(evaluations=True)), encoding="utf-8")
    assert rates.main([str(tmp_path), "8"]) == 0
    assert "192.0 samples/s, 24.00 a chip" in capsys.readouterr().out


def _stepped_log() -> list[str]:
    """MLPerf v3.1 Stable Diffusion's shape: blocks of 100 steps named by the step they start
    and stop at, a 60 s warm-up block, then 50 s ones; an evaluation between two blocks."""
    lines, t = [_line("global_batch_size", 0, 512)], 1000
    for step, seconds in ((0, 60), (100, 50), (200, 50), (300, 50)):
        lines.append(_line("block_start", t, "training_step", step_num=step))
        t += seconds * 1000
        lines.append(_line("block_stop", t, "training_step", step_num=step + 100))
        if step == 100:
            lines += [_line("eval_start", t + 10), _line("eval_stop", t + 30_000)]
            t += 30_000
        t += 50
    return lines


def test_blocks_numbered_by_step_count_steps_of_the_global_batch(rates) -> None:  # type: ignore[no-untyped-def]
    log = rates.events(_stepped_log())
    assert [b.epochs for b in rates.blocks(log)] == [100] * 4
    # 100 steps of 512 in 50 s; the warm-up block and the evaluation between blocks left out
    assert rates.samples_per_second(log, 0, repeat_blocks=False) == pytest.approx(1024)
