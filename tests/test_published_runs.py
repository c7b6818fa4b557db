"""The published-runs table and the utilisation model fitted on it (issues 25, 34 and 35).

Nothing here is a measured number written by hand: the table is read, the fit is refitted,
and the errors are computed from the runs themselves. The tests of the fit's inputs
(framework, scale, model class, precision) each fail if the fit ignored that input.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest
from script_module import load_script

from gpu2tpu.pricing import utilisation
from gpu2tpu.pricing.catalogue import HardwareCatalogue
from gpu2tpu.pricing.class_fit import MODELS_TABLE
from gpu2tpu.pricing.published import (
    CONVENTIONS,
    DEFAULT_PATH,
    FRAMEWORKS,
    MODEL_CLASSES,
    PRECISIONS,
    RECOMPUTE_PARTS,
    PublishedRunsError,
    load_published_runs,
)
from gpu2tpu.pricing.utilisation import (
    ATTENTION_RATE_BOUNDS,
    RANGE_QUANTILES,
    RIDGE,
    StepFeatures,
    default_fit,
    default_framework,
    expected_step,
    fit_utilisation,
    nested_cross_source,
)

ROOT = Path(__file__).resolve().parent.parent
RUNS = load_published_runs()
CATALOGUE = HardwareCatalogue.load()
# "repository path @commit", a named vendor recipe, or a page's address.
SOURCE = re.compile(
    r"^[\w.-]+/[\w.-]+ \S+ @[0-9a-f]{40}$|^NVIDIA DGX Cloud benchmarking recipe |^https://\S+ "
)


def load_benchmark(name: str):  # type: ignore[no-untyped-def]
    return load_script(ROOT / "benchmarks" / "forecast_vs_published.py", name)


def test_every_run_has_its_source_shape_and_fields():
    assert len(RUNS) >= 100
    for run in RUNS:
        assert SOURCE.match(run.source), run.id
        assert re.fullmatch(r"\d{4}(-\d{2}(-\d{2})?)?", run.date), run.id
        assert run.precision in PRECISIONS and run.framework in FRAMEWORKS, run.id
        assert run.model_class in MODEL_CLASSES and run.source_group and run.software, run.id
        chip = CATALOGUE.get(run.chip)
        assert chip.peak_for(run.precision)[0], run.id
        assert run.chips >= 1 and run.global_batch > 0 and run.slices >= 1, run.id
        assert run.per_device_batch == pytest.approx(run.global_batch / run.chips), run.id
        assert run.slice and run.parallelism, run.id
        assert run.tokens_per_s_per_chip > 0 and 0.1 < run.utilisation(chip.peak_bf16_flops) < 0.8
    kinds = {CATALOGUE.get(r.chip).kind for r in RUNS}
    assert kinds == {"tpu", "gpu"}
    assert {"jax", "pytorch", "pytorch_xla", "megatron"} <= {r.framework for r in RUNS}
    assert {"v4", "v5e", "v5p", "v6e", "tpu7x", "h100", "h100-hbm2e-500w"} <= {r.chip for r in RUNS}


def test_the_held_out_split_is_by_configuration_with_no_fitted_twin():
    by_configuration = defaultdict(set)
    for run in RUNS:
        by_configuration[run.configuration].add(run.held_out)
    assert all(len(v) == 1 for v in by_configuration.values())
    held = [k for k, v in by_configuration.items() if True in v]
    assert len(held) * 4 >= len(by_configuration)
    for kind in ("tpu", "gpu"):
        assert any(CATALOGUE.get(k[2]).kind == kind for k in held), kind


def test_model_shapes_give_the_published_parameter_counts():
    shapes = {r.model.key: r.model for r in RUNS}
    # Meta's model cards: 8.03B, 70.6B, 405.9B parameters.
    assert shapes["llama3_1_8b"].parameters() == pytest.approx(8.03e9, rel=0.01)
    assert shapes["llama3_1_70b"].parameters() == pytest.approx(70.6e9, rel=0.01)
    assert shapes["llama3_1_405b"].parameters() == pytest.approx(405.9e9, rel=0.01)
    assert shapes["llama2_7b"].parameters() == pytest.approx(6.74e9, rel=0.01)
    # llm-foundry's table (NumParams at 2048 tokens, less its 2048 x d learned positions).
    assert shapes["mpt_7b"].parameters() == pytest.approx(6658859008 - 2048 * 4096, rel=0.002)
    # MaxText's 2023 synthetic models: 8 heads of 256 x scale, one relu MLP, vocab 32768,
    # logits through the embedding; each is named by its size.
    for size in (16, 32, 64, 128, 256, 512, 1024, 22, 52):
        shape = shapes[f"maxtext_{size}b"]
        assert shape.parameters() == pytest.approx(size * 1e9, rel=0.07), size
        assert (shape.head_dim, shape.vocab, shape.mlp, shape.activation, shape.tied) == (
            256,
            32768,
            "plain",
            "relu",
            True,
        )
    assert (shapes["maxtext_16b"].d_model, shapes["maxtext_16b"].heads) == (5120, 32)


def test_the_flop_count_causal_and_full():
    shape = next(r.model for r in RUNS if r.model.key == "llama3_1_8b")
    full = shape.flops_per_token(4096, causal=False)
    causal = shape.flops_per_token(4096)
    assert full - causal == pytest.approx(6 * 32 * 4096 * 32 * 128)
    assert causal == pytest.approx(6 * shape.matmul_parameters() + 6 * 32 * 4096 * 4096)


def test_each_source_figure_is_converted_with_the_count_of_its_commit():
    """MaxText counted 6N only (v4, spring 2023), full attention (v5e, 2023-11-08) and causal
    attention (v5p, 2023-12-15): its published MFU is TFLOP/s over the chip's peak, so each
    row's MFU must follow from its throughput under its own convention."""
    conventions = {
        r.id.split("-")[1]: r.flops_convention for r in RUNS if r.source_group == "maxtext"
    }
    assert conventions == {
        "v4": "maxtext_params_only",
        "v5e": "maxtext_full_attention",
        "v5p": "maxtext_causal_attention",
    }
    for run in RUNS:
        if run.mfu is None or run.shape is None:
            continue
        counted = CONVENTIONS.get(run.flops_convention, "full")
        flops = (
            6.0 * run.shape.matmul_parameters()
            if counted == "none"
            else run.shape.flops_per_token(run.sequence, causal=counted == "causal")
        )
        peak = CATALOGUE.get(run.chip).peak_bf16_flops
        # 8%: the FSDP blog's 34B is IBM's own shape; Code Llama 34B's is 7% larger per token.
        assert run.tokens_per_s_per_chip * flops / peak == pytest.approx(run.mfu, rel=0.08), run.id


def test_a_malformed_table_is_refused_naming_the_file_row_and_field(tmp_path):
    text = DEFAULT_PATH.read_text(encoding="utf-8")
    bad = tmp_path / "runs.toml"
    bad.write_text(text.replace('measured = "tflops_per_chip"', 'measured = "tflops"', 1))
    first = re.search(r'^id = "([^"]+)"', text, re.M).group(1)
    with pytest.raises(PublishedRunsError, match=rf"runs\.toml: run {re.escape(first)}\.measured"):
        load_published_runs(bad)
    bad.write_text(text.replace("held_out = false", "", 1))
    with pytest.raises(PublishedRunsError, match=r"missing held_out"):
        load_published_runs(bad)
    bad.write_text(text.replace('framework = "jax"', 'framework = "flax"', 1))
    with pytest.raises(PublishedRunsError, match=r"\.framework: one of jax"):
        load_published_runs(bad)
    with pytest.raises(PublishedRunsError, match="does not exist"):
        load_published_runs(tmp_path / "absent.toml")
    bad.write_text(text.replace('recompute = ["full"]', 'recompute = ["everything"]', 1))
    with pytest.raises(PublishedRunsError, match=r"\.recompute: a list of q, k, v"):
        load_published_runs(bad)
    bad.write_text(re.sub(r"^recompute = .*\n", "", text, count=1, flags=re.M))
    with pytest.raises(PublishedRunsError, match="missing recompute"):
        load_published_runs(bad)
    models = MODELS_TABLE.read_text(encoding="utf-8")
    bad.write_text(re.sub(r'^memory_format = "channels_last"', 'memory_format = "nhwc"', models,
                          count=1, flags=re.M))  # fmt: skip
    with pytest.raises(PublishedRunsError, match=r"\.memory_format: one of channels_first"):
        load_published_runs(bad)
    bad.write_text(models.replace('limited_by = "input"', 'limited_by = "network"', 1))
    with pytest.raises(PublishedRunsError, match=r"\.limited_by: one of input, not 'network'"):
        load_published_runs(bad)
    # a run said to be limited by its host says what shows it
    bad.write_text(re.sub(r'(limited_by = "input"\n)notes = .*\n', r"\1", models, count=1))
    with pytest.raises(PublishedRunsError, match=r"\.notes: what shows the run was limited"):
        load_published_runs(bad)


def test_every_decoder_row_states_its_recomputation_and_its_hardware_flops_follow():
    """The chip executes the model's FLOPs plus the forward products its run recomputes:
    "full" is every product of every layer (not the output layer), a list only those."""
    for run in RUNS:
        if run.shape is None:
            continue
        assert set(run.recompute) <= {*RECOMPUTE_PARTS, "full"}, run.id
        assert run.recompute_source or not run.recompute, run.id
        shape, s = run.shape, run.sequence
        layer = (run.parameters - shape.vocab * shape.d_model) / shape.layers  # matmul weights
        forward = {
            "full": shape.layers * (2 * layer + 2 * s * shape.heads * shape.head_dim),
            "attention": shape.layers * 2 * s * shape.heads * shape.head_dim,
        }
        extra = run.hardware_flops_per_sample - run.flops_per_sample
        if not run.recompute:
            assert extra == 0, run.id
        elif run.recompute in (("full",), ("attention",)):
            expected = run.recompute_layers * forward[run.recompute[0]] * s
            assert extra == pytest.approx(expected), run.id
        else:
            assert 0 < extra < forward["full"] * s, run.id
    # What the sources say, spot-checked: llm-foundry's checkpointed rows, NeMo's none.
    by_id = {r.id: r for r in RUNS}
    assert by_id["llmfoundry-h100-mpt-1b-65536-8"].recompute == ("full",)
    assert by_id["llmfoundry-h100-mpt-1b-2048-8"].recompute == ()
    assert by_id["dgxc-h100-llama3.1-70b-64"].recompute == ()


def test_recomputation_is_an_input_of_the_fit():
    """Each run is fitted on the FLOPs its chip executed: dropping the rows' recomputation
    changes the fit and every source's cross-source prediction of a checkpointed run."""
    fit = default_fit()
    stripped = fit_utilisation([replace(r, recompute=()) for r in RUNS], CATALOGUE)
    assert stripped.coefficients != fit.coefficients
    before = {h.run.id: h.expected_tokens_per_s for h in fit.cross_source}
    for h in stripped.cross_source:
        if h.run.recompute:
            assert h.expected_tokens_per_s != pytest.approx(before[h.run.id], rel=1e-3), h.run.id
    # A step that recomputes runs that many more FLOPs at the same rate: proportionally longer.
    v6e = CATALOGUE.get("v6e")
    plain = expected_step(_features(attention_flops_per_chip=0.0), v6e)
    again = expected_step(_features(flops_per_chip=4e15 * 4 / 3, attention_flops_per_chip=0.0), v6e)
    assert again.seconds / plain.seconds == pytest.approx(4 / 3)


def test_attention_runs_at_its_own_fitted_rate(monkeypatch):
    """The attention products take 1/r of the time their FLOPs would take as dense matmuls,
    with r fitted on every run (an attention kernel runs no faster than the matmuls)."""
    fit = default_fit()
    rate = fit.attention_rate
    assert ATTENTION_RATE_BOUNDS[0] < rate < ATTENTION_RATE_BOUNDS[1]
    v6e = CATALOGUE.get("v6e")
    none = expected_step(_features(attention_flops_per_chip=0.0), v6e)
    half = expected_step(_features(attention_flops_per_chip=2e15), v6e)
    assert half.seconds / none.seconds == pytest.approx(1 + 0.5 * (1 / rate - 1))
    assert fit.utilisation(v6e, 0.5) == pytest.approx(
        fit.utilisation(v6e, 0.0) / (0.5 / rate + 0.5)
    )
    # Held at the matmuls' rate, the long-context runs are predicted otherwise.
    monkeypatch.setattr(utilisation, "ATTENTION_RATE_BOUNDS", (1.0, 1.0))
    flat = fit_utilisation(RUNS, CATALOGUE)
    assert flat.attention_rate == pytest.approx(1.0)
    before = {h.run.id: h.expected_tokens_per_s for h in fit.cross_source}
    for h in flat.cross_source:
        if h.run.hardware_attention_share > 0.3:
            assert h.expected_tokens_per_s != pytest.approx(before[h.run.id], rel=0.05), h.run.id


def test_scale_terms_are_not_extrapolated_beyond_the_fitted_runs():
    fit = default_fit()
    v5e = CATALOGUE.get("v5e")
    most = fit.max_slices
    at_most = expected_step(_features(chip="v5e", slices=most), v5e)
    beyond = expected_step(_features(chip="v5e", slices=most * 8), v5e)
    assert beyond.seconds == pytest.approx(at_most.seconds)
    assert any(f"no published run used more than {most}" in n for n in beyond.notes)
    low, high = fit.size_range
    big = expected_step(_features(chip="v5e", parameters=int(high)), v5e)
    bigger = expected_step(_features(chip="v5e", parameters=int(high * 100)), v5e)
    assert bigger.seconds == pytest.approx(big.seconds)


def test_cross_source_predictions_never_see_their_own_source():
    fit = default_fit()
    assert {h.run.id for h in fit.cross_source} == {r.id for r in RUNS}
    group = "pytorch-fsdp-blog"
    changed = [replace(r, value=r.value * 3) if r.source_group == group else r for r in RUNS]
    refit = fit_utilisation(changed, CATALOGUE)
    before = {h.run.id: h.expected_tokens_per_s for h in fit.cross_source}
    for h in refit.cross_source:
        if h.run.source_group == group:  # its prediction came from the other sources
            assert h.expected_tokens_per_s == pytest.approx(before[h.run.id])
    assert refit.coefficients != fit.coefficients  # the shipped fit uses every run


def test_a_penalty_for_one_group_of_terms_moves_that_group_only():
    plain = utilisation._bare_fit(RUNS, CATALOGUE)
    same = utilisation._bare_fit(RUNS, CATALOGUE, {"framework": RIDGE})
    assert same.coefficients == pytest.approx(plain.coefficients)
    pinned = utilisation._bare_fit(RUNS, CATALOGUE, {"framework": 1e9})
    frameworks = [k for k in plain.coefficients if k.startswith("framework:")]
    assert frameworks and all(abs(plain.coefficients[k]) > 0.01 for k in frameworks)
    assert all(abs(pinned.coefficients[k]) < 1e-6 for k in frameworks)
    design = utilisation._design(utilisation._training_points(RUNS, CATALOGUE), {"framework": 5})
    penalties = {design.names[i]: p for i, p in design.penalties}
    assert {n for n, p in penalties.items() if p == 5} == set(frameworks)
    assert {p for n, p in penalties.items() if n not in frameworks} == {RIDGE}


@pytest.mark.slow  # 120 refits
def test_the_nested_check_chooses_the_ridge_without_the_source_it_predicts():
    """With the shipped penalty as the only candidate the nested check is the plain
    cross-source error; with several, a source's own figures change neither the penalty it is
    predicted with nor its predictions (they were chosen and fitted on the others)."""
    fit = default_fit()
    plain, chosen = nested_cross_source(RUNS, CATALOGUE, candidates=(RIDGE,))
    assert set(chosen.values()) == {RIDGE}
    before = {h.run.id: h.expected_tokens_per_s for h in fit.cross_source}
    assert {h.run.id: h.expected_tokens_per_s for h in plain} == pytest.approx(before)

    group = "pytorch-fsdp-blog"
    changed = [replace(r, value=r.value * 3) if r.source_group == group else r for r in RUNS]
    nested, picks = nested_cross_source(RUNS, CATALOGUE, candidates=(0.1, 10.0))
    moved, moved_picks = nested_cross_source(changed, CATALOGUE, candidates=(0.1, 10.0))
    assert picks[group] == moved_picks[group]
    ours = {h.run.id: h.expected_tokens_per_s for h in nested if h.run.source_group == group}
    theirs = {h.run.id: h.expected_tokens_per_s for h in moved if h.run.source_group == group}
    assert ours and theirs == pytest.approx(ours)
    # ... while the sources whose inner folds saw the change may be predicted differently
    assert {h.run.id: h.expected_tokens_per_s for h in moved} != pytest.approx(
        {h.run.id: h.expected_tokens_per_s for h in nested}
    )


def test_the_held_out_split_is_fitted_without_its_configurations():
    fit = default_fit()
    assert {h.run.id for h in fit.held_out} == {r.id for r in RUNS if r.held_out}
    one = next(r for r in RUNS if r.held_out)
    changed = [
        replace(r, value=r.value * 3) if r.configuration == one.configuration else r for r in RUNS
    ]
    refit = fit_utilisation(changed, CATALOGUE)
    assert [h.expected_tokens_per_s for h in refit.held_out] == pytest.approx(
        [h.expected_tokens_per_s for h in fit.held_out]
    )


def test_the_range_holds_its_stated_share_of_cross_source_predictions():
    fit = default_fit()
    low, high = fit.log_range
    residuals = [-math.log1p(e) for e in fit.configuration_errors().values()]
    inside = sum(low <= r <= high for r in residuals)
    assert inside / len(residuals) >= RANGE_QUANTILES[1] - RANGE_QUANTILES[0]
    line = fit.source_line()
    assert f"median error is {fit.median_error:.0%}" in line
    assert "predicting each source from the others" in line


# -- the fit's inputs: each test fails if the fit ignored it ------------------------------------


def _features(**extra):  # type: ignore[no-untyped-def]
    base = {"chip": "v6e", "chips": 256, "flops_per_chip": 4e15, "attention_flops_per_chip": 1e14}
    return StepFeatures(**{**base, **extra})


def test_the_framework_is_an_input_and_the_tuned_figure_is_the_ceiling():
    fit = default_fit()
    v6e = CATALOGUE.get("v6e")
    jax = expected_step(_features(framework="jax"), v6e)
    xla = expected_step(_features(framework="pytorch_xla"), v6e)
    assert xla.seconds != pytest.approx(jax.seconds)
    ratio = math.exp(fit.coefficients["framework:pytorch_xla"])
    assert jax.seconds / xla.seconds == pytest.approx(ratio)
    # A PyTorch figure carries the tuned framework's beside it where that is faster.
    if jax.seconds < xla.seconds:
        assert xla.ceiling_seconds == pytest.approx(jax.seconds) and jax.ceiling_seconds is None
    # The default is TorchTPU on a TPU (no run of its own: costed as PyTorch/XLA, and said).
    default = expected_step(_features(), v6e)
    assert default.framework == "torchtpu" == default_framework("tpu")
    assert default.seconds == pytest.approx(xla.seconds)
    assert any("costed as pytorch_xla" in n for n in default.notes)
    assert default_framework("tpu", backend="jax") == "torchax"
    assert default_framework("gpu") == "pytorch"


def test_scale_is_an_input_slices_over_dcn_and_model_size():
    fit = default_fit()
    v5e = CATALOGUE.get("v5e")
    one = expected_step(_features(chip="v5e", slices=1, parameters=int(8e9)), v5e)
    many = expected_step(_features(chip="v5e", slices=16, parameters=int(8e9)), v5e)
    big = expected_step(_features(chip="v5e", slices=1, parameters=int(4e11)), v5e)
    assert many.seconds / one.seconds == pytest.approx(math.exp(-4 * fit.coefficients["dcn"]))
    assert big.seconds / one.seconds == pytest.approx(
        math.exp(-math.log10(50) * fit.coefficients["size"])
    )
    # The network costs time; the size term's sign is the runs' (larger products run at a
    # higher share of the peak once the recomputed FLOPs are counted).
    assert fit.coefficients["dcn"] < 0 and fit.coefficients["size"] != 0


def test_the_chip_enters_through_its_machine_balance_and_its_own_runs():
    fit = default_fit()
    # H200 has no run: it is predicted from its balance (H100's compute, more bandwidth).
    h100, h200 = CATALOGUE.get("h100"), CATALOGUE.get("h200")
    u100 = fit.utilisation(h100, 0.05, framework="pytorch")
    u200 = fit.utilisation(h200, 0.05, framework="pytorch")
    assert u200 != pytest.approx(u100)
    step = expected_step(_features(chip="h200", framework="pytorch"), h200)
    assert not step.calibrated and any("machine balance" in n for n in step.notes)


def test_precision_is_an_input_with_each_chips_own_peak(tmp_path):
    a100 = CATALOGUE.get("a100-80gb")
    assert a100.peak_for("fp32")[0] == pytest.approx(156e12)  # TF32 tensor cores
    assert CATALOGUE.get("v5e").peak_for("fp32")[0] == CATALOGUE.get("v5e").peak_bf16_flops
    # No tf32 run in the LLM table: an fp32 step on a GPU is a bound, at the TF32 peak.
    fit = default_fit()
    features = _features(
        chip="a100-80gb", framework="pytorch", precision="fp32", attention_flops_per_chip=1.5e15
    )
    if "fp32" not in fit.precisions:
        bound = expected_step(features, a100)
        assert bound.kind == "bound" and bound.peak_flops == pytest.approx(156e12)
    # With runs in a precision the figure is expected, at that precision's peak, and moves
    # with the precision's effect (the FSDP blog's rows relabelled fp16: A100's and H100's
    # fp16 peak is their bf16 one, so the relabelled rows stay possible).
    assert a100.peak_for("fp16")[0] == pytest.approx(a100.peak_bf16_flops)
    runs = [
        replace(r, precision="fp16") if r.source_group == "pytorch-fsdp-blog" else r for r in RUNS
    ]
    refit = fit_utilisation(runs, CATALOGUE)
    fp16 = replace(features, precision="fp16")
    step = expected_step(fp16, a100, refit)
    assert step.kind == "expected" and step.peak_flops == pytest.approx(a100.peak_bf16_flops)
    assert step.utilisation < 1
    bf16 = expected_step(replace(fp16, precision="bf16"), a100, refit)
    effect = refit.coefficients["precision:fp16"]
    assert effect != 0
    assert step.seconds / bf16.seconds == pytest.approx(math.exp(-effect))


def test_model_class_is_an_input_and_an_uncalibrated_class_is_a_bound():
    v5e = CATALOGUE.get("v5e")
    cnn = _features(chip="v5e", model_class="cnn", attention_flops_per_chip=0.0)
    fit = default_fit()
    if "cnn" not in fit.model_classes:
        step = expected_step(cnn, v5e)
        assert step.kind == "bound" and step.low == step.high == step.seconds
        assert any("no published cnn run" in n for n in step.notes)
    # A class with runs gets its own effect (here: the FSDP blog's rows relabelled).
    runs = [
        replace(r, model_class="cnn") if r.source_group == "pytorch-fsdp-blog" else r for r in RUNS
    ]
    refit = fit_utilisation(runs, CATALOGUE)
    step = expected_step(cnn, v5e, refit)
    llm = expected_step(replace(cnn, model_class="llm_decoder"), v5e, refit)
    assert step.kind == "expected"
    assert llm.seconds / step.seconds == pytest.approx(math.exp(refit.coefficients["class:cnn"]))
    # The profiler's unfused bytes never make a floor; compiled bytes beyond compute do (a bound).
    unfused = expected_step(
        replace(llm_features := _features(chip="v5e"), bytes_per_chip=1e15, bytes_kind="unfused"),
        v5e,
    )
    assert unfused.kind == "expected" and unfused.limited_by == "compute"
    compiled = expected_step(replace(llm_features, bytes_per_chip=1e15), v5e)
    assert compiled.kind == "bound" and compiled.limited_by == "memory"
    assert compiled.seconds == pytest.approx(1e15 / v5e.hbm_bandwidth)


# -- the benchmark and the docs ------------------------------------------------------------------


def test_benchmark_reports_the_cross_source_error_the_fit_reports():
    module = load_benchmark("forecast_vs_published")
    rows = module.run_fast()
    assert len(rows) == len(RUNS) and all(r.expected_tokens_per_s for r in rows)
    stats = module.summary(rows)
    n, median, worst = stats["all"]
    fit = default_fit()
    assert n == len(fit.configuration_errors())
    assert median == pytest.approx(fit.median_error, abs=0.005)
    assert worst == pytest.approx(fit.worst_error, abs=0.005)
    assert median <= module.GOAL_MEDIAN  # the median goal; the worst is reported, not met
    inside, total = module.range_coverage(rows, fit)
    assert inside / total >= RANGE_QUANTILES[1] - RANGE_QUANTILES[0]


def test_docs_show_the_benchmark_as_it_is():
    """docs/forecast.md's cross-source table must not drift from the table: recomputed here
    and compared cell by cell."""
    docs = (ROOT / "docs" / "forecast.md").read_text(encoding="utf-8")
    module = load_benchmark("forecast_vs_published_docs")
    stats = module.summary(module.run_fast())
    for name in ("all", "TPU", "GPU", "PyTorch (any)"):
        n, median, worst = stats[name]
        row = re.search(rf"^\| {re.escape(name)} \| {n} \| ([\d.]+)% \| ([\d.]+)% \|", docs, re.M)
        assert row, name
        assert float(row.group(1)) == pytest.approx(100 * median, abs=0.05), name
        assert float(row.group(2)) == pytest.approx(100 * worst, abs=0.05), name
    fit = default_fit()
    for key, value in fit.coefficients.items():
        cell = re.search(rf"^\| `{re.escape(key)}` \| ([+-][\d.]+) \|", docs, re.M)
        assert cell, key
        assert float(cell.group(1)) == pytest.approx(value, abs=0.0005), key
    assert (
        statistics.median(abs(e) for e in fit.configuration_errors().values()) == fit.median_error
    )
