"""The published-runs table and the utilisation model fitted on it (issue 25, section 3).

Nothing here is a measured number written by hand: the table is read, the fit is refitted,
and the held-out error is computed from the runs themselves.
"""

from __future__ import annotations

import importlib.util
import math
import re
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gpu2tpu.pricing.catalogue import HardwareCatalogue
from gpu2tpu.pricing.published import (
    DEFAULT_PATH,
    PublishedRunsError,
    load_published_runs,
)
from gpu2tpu.pricing.utilisation import (
    StepFeatures,
    default_fit,
    expected_step,
    fit_utilisation,
)

ROOT = Path(__file__).resolve().parent.parent
RUNS = load_published_runs()
CATALOGUE = HardwareCatalogue.load()
# "repository path @commit" or a named vendor recipe: something a reader can open again.
SOURCE = re.compile(r"^[\w.-]+/[\w.-]+ \S+ @[0-9a-f]{40}$|^NVIDIA DGX Cloud benchmarking recipe ")


def test_every_run_has_its_source_shape_and_fields():
    assert len(RUNS) >= 60
    for run in RUNS:
        assert SOURCE.match(run.source), run.id
        assert re.fullmatch(r"\d{4}(-\d{2})?", run.date), run.id
        assert run.precision == "bf16", run.id
        assert run.chip in CATALOGUE and CATALOGUE.get(run.chip).has_peak, run.id
        assert run.chips >= 1 and run.sequence >= 512 and run.global_batch > 0, run.id
        assert run.per_device_batch == pytest.approx(run.global_batch / run.chips), run.id
        assert run.slice and run.parallelism and run.framework, run.id
        assert run.model.source and run.model.layers >= 1, run.id
        assert run.tokens_per_s_per_chip > 0, run.id
    kinds = {CATALOGUE.get(r.chip).kind for r in RUNS}
    assert kinds == {"tpu", "gpu"}
    assert {"v5e", "v5p", "v6e", "tpu7x", "h100", "a100-80gb"} <= {r.chip for r in RUNS}


def test_at_least_a_third_of_the_runs_is_held_out_on_every_kind_of_chip():
    held = [r for r in RUNS if r.held_out]
    assert len(held) * 3 >= len(RUNS)
    for kind in ("tpu", "gpu"):
        assert any(CATALOGUE.get(r.chip).kind == kind for r in held), kind


def test_model_shapes_give_the_published_parameter_counts():
    shapes = {r.model.key: r.model for r in RUNS}
    # Meta's model cards: 8.03B, 70.6B, 405.9B parameters.
    assert shapes["llama3_1_8b"].parameters() == pytest.approx(8.03e9, rel=0.01)
    assert shapes["llama3_1_70b"].parameters() == pytest.approx(70.6e9, rel=0.01)
    assert shapes["llama3_1_405b"].parameters() == pytest.approx(405.9e9, rel=0.01)
    # llm-foundry's table (NumParams at 2048 tokens, less its 2048 x d learned positions).
    assert shapes["mpt_7b"].parameters() == pytest.approx(6658859008 - 2048 * 4096, rel=0.002)
    assert shapes["mpt_70b"].parameters() == pytest.approx(64862437376 - 2048 * 8192, rel=0.002)
    # MaxText's synthetic models are named by their size.
    for size in (16, 32, 64, 128, 256, 512, 1024):
        assert shapes[f"maxtext_{size}b"].parameters() == pytest.approx(size * 1e9, rel=0.05)


def test_the_flop_count_causal_and_full():
    shape = next(r.model for r in RUNS if r.model.key == "llama3_1_8b")
    full = shape.flops_per_token(4096, causal=False)
    causal = shape.flops_per_token(4096)
    assert full - causal == pytest.approx(6 * 32 * 4096 * 32 * 128)
    assert causal == pytest.approx(6 * shape.matmul_parameters() + 6 * 32 * 4096 * 4096)


def test_published_figures_agree_with_each_other():
    """Each row's second figure (its MFU or TFLOP/s) follows from its throughput under the
    source's FLOP count: a typo in any number of the table breaks this."""
    for run in RUNS:
        peak = CATALOGUE.get(run.chip).peak_bf16_flops
        full = run.model.flops_per_token(run.sequence, causal=False)
        if run.mfu is not None:  # MaxText, llm-foundry, NVIDIA: MFU counts full attention
            assert run.tokens_per_s_per_chip * full / peak == pytest.approx(run.mfu, rel=0.06), (
                run.id
            )
        if run.tflops_per_chip is not None and run.measured != "tflops_per_chip":
            causal = "causal" in run.flops_convention
            flops = run.model.flops_per_token(run.sequence, causal=causal)
            assert run.tokens_per_s_per_chip * flops / 1e12 == pytest.approx(
                run.tflops_per_chip, rel=0.06
            ), run.id


def test_a_malformed_table_is_refused_naming_the_file_row_and_field(tmp_path):
    text = DEFAULT_PATH.read_text(encoding="utf-8")
    bad = tmp_path / "runs.toml"
    bad.write_text(text.replace('measured = "tflops_per_chip"', 'measured = "tflops"', 1))
    with pytest.raises(
        PublishedRunsError, match=r"runs\.toml: run maxtext-v5e-16b-1x256\.measured"
    ):
        load_published_runs(bad)
    bad.write_text(text.replace("held_out = false", "", 1))
    with pytest.raises(PublishedRunsError, match=r"run maxtext-v5e-16b-1x256: missing held_out"):
        load_published_runs(bad)
    with pytest.raises(PublishedRunsError, match="does not exist"):
        load_published_runs(tmp_path / "absent.toml")


def test_the_fit_uses_only_the_runs_not_held_out():
    fit = fit_utilisation(RUNS, CATALOGUE)
    assert fit.fitted_runs == sum(not r.held_out for r in RUNS)
    assert len(fit.held_out) == sum(r.held_out for r in RUNS)
    one_held = next(r for r in RUNS if r.held_out)
    changed = [replace(r, value=r.value * 3) if r is one_held else r for r in RUNS]
    assert fit_utilisation(changed, CATALOGUE).bases == fit.bases
    one_fitted = next(r for r in RUNS if not r.held_out and r.chip == "v5e")
    changed = [replace(r, value=r.value * 3) if r is one_fitted else r for r in RUNS]
    assert fit_utilisation(changed, CATALOGUE).bases["v5e"] != fit.bases["v5e"]


def test_held_out_error_is_computed_from_the_table_and_meets_the_goal():
    fit = default_fit()
    errors = []
    for run in (r for r in RUNS if r.held_out):
        chip = CATALOGUE.get(run.chip)
        utilisation = math.exp(
            fit.bases[run.chip] - fit.attention_slope * math.sqrt(run.attention_share)
        )
        expected = utilisation * chip.peak_bf16_flops / run.flops_per_token
        errors.append(abs(expected / run.tokens_per_s_per_chip - 1))
    assert statistics.median(errors) == pytest.approx(fit.median_error)
    assert max(errors) == pytest.approx(fit.worst_error)
    assert fit.median_error <= 0.20 and fit.worst_error <= 0.35
    line = fit.source_line()
    assert f"median error is {fit.median_error:.0%}" in line and "held-out" in line


def test_expected_step_is_the_fitted_utilisation_with_its_range_and_the_bound():
    chip = CATALOGUE.get("v5p")
    features = StepFeatures(chip="v5p", chips=8, flops_per_chip=4e15, bytes_per_chip=1e12)
    step = expected_step(features, chip)
    fit = default_fit()
    assert step.utilisation == pytest.approx(math.exp(fit.bases["v5p"]))
    assert step.seconds == pytest.approx(4e15 / (chip.peak_bf16_flops * step.utilisation))
    assert step.bound_seconds == pytest.approx(4e15 / chip.peak_bf16_flops)
    assert step.low < step.seconds < step.high and step.bound_seconds < step.low
    assert step.calibrated and step.limited_by == "compute"
    # Attention slows a step down; full-attention counts are halved to the fit's count.
    longer = expected_step(replace(features, attention_flops_per_chip=1e15), chip)
    assert longer.seconds > step.seconds
    full = expected_step(
        replace(features, flops_per_chip=5e15, attention_flops_per_chip=2e15, attention="full"),
        chip,
    )
    assert full.seconds == pytest.approx(longer.seconds)


def test_memory_bound_steps_and_chips_without_runs_say_so():
    v5e = CATALOGUE.get("v5e")
    memory_bound = expected_step(
        StepFeatures(chip="v5e", chips=1, flops_per_chip=1e12, bytes_per_chip=1e12), v5e
    )
    assert memory_bound.limited_by == "memory" and not memory_bound.calibrated
    assert memory_bound.seconds == pytest.approx(1e12 / v5e.hbm_bandwidth)
    assert any("memory-bound" in n for n in memory_bound.notes)
    h200 = CATALOGUE.get("h200")
    guessed = expected_step(StepFeatures(chip="h200", chips=1, flops_per_chip=1e15), h200)
    assert not guessed.calibrated and "no published run on NVIDIA H200" in guessed.notes[0]
    assert (
        expected_step(StepFeatures(chip="cpu", chips=1, flops_per_chip=1e9), CATALOGUE.get("cpu"))
        is None
    )


def test_benchmark_fast_mode_meets_the_goal():
    path = ROOT / "benchmarks" / "forecast_vs_published.py"
    spec = importlib.util.spec_from_file_location("forecast_vs_published", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    rows = module.run_fast()
    assert len(rows) == len(RUNS) and all(r.expected_tokens_per_s for r in rows)
    stats = module.summary(rows)
    for group in ("all", "TPU", "GPU"):
        n, median, worst = stats[group]
        assert median <= module.GOAL_MEDIAN and worst <= module.GOAL_WORST, group
    assert stats["held out"][1] == pytest.approx(default_fit().median_error)


def test_docs_show_the_fit_and_the_benchmark_as_they_are():
    """docs/forecast.md's per-chip bases and the benchmark's summary must not drift from the
    table: they are recomputed here and compared cell by cell."""
    docs = (ROOT / "docs" / "forecast.md").read_text(encoding="utf-8")
    fit = default_fit()
    names = {CATALOGUE.get(key).name: key for key in fit.bases}
    names.update(
        {
            "TPU v6e": "v6e",
            "H100": "h100",
            "A100 80GB": "a100-80gb",
            "A100 40GB": "a100-40gb",
            "TPU7x": "tpu7x",
        }
    )
    seen = set()
    for match in re.finditer(
        r"^\| ([^|]+?) \| (\d+) \((\d+) \+ (\d+)\) \| ([\d.]+)% \|", docs, re.M
    ):
        key = names[match.group(1)]
        runs = [r for r in RUNS if r.chip == key]
        assert int(match.group(2)) == len(runs), key
        assert int(match.group(4)) == sum(r.held_out for r in runs), key
        assert float(match.group(5)) == pytest.approx(100 * math.exp(fit.bases[key]), abs=0.05)
        seen.add(key)
    assert seen == set(fit.bases)
    path = ROOT / "benchmarks" / "forecast_vs_published.py"
    spec = importlib.util.spec_from_file_location("forecast_vs_published_docs", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    for name, (n, median, worst) in module.summary(module.run_fast()).items():
        row = re.search(rf"^\| {name} \({n}\) \| ([\d.]+)% \| ([\d.]+)% \|", docs, re.M)
        assert row, name
        assert float(row.group(1)) == pytest.approx(100 * median, abs=0.05), name
        assert float(row.group(2)) == pytest.approx(100 * worst, abs=0.05), name
