"""The op-by-op model of CNNs, encoders and U-Nets (pricing/class_fit.py) and the profiler's
figure for a step with no matrix FLOPs (issue 35).

Each test would fail if the physics it names were ignored: depthwise convolutions' own
bandwidth, the per-class factor, the fusion of elementwise ops, the calibration check that
turns an uncalibrated regime into a bound, the LLM fit left as it was, the traffic table
matching the profiler's count."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu2tpu.measure.flops import count_meta_step
from gpu2tpu.pricing.catalogue import HardwareCatalogue
from gpu2tpu.pricing.class_fit import (
    MODELS_TABLE,
    OpTraffic,
    default_class_fit,
    expected_step_by_op,
    fit_without_error,
    load_traffic,
    traffic_key,
)
from gpu2tpu.pricing.published import PublishedRun, load_published_runs
from gpu2tpu.pricing.utilisation import StepFeatures, default_fit, fit_utilisation

sys.path.insert(0, str(Path(__file__).parent))
from published_models import build, count_run

CATALOGUE = HardwareCatalogue.load()
A100 = CATALOGUE.get("a100-80gb")


def _features(
    key: str,
    batch: int,
    chip: str = "a100-80gb",
    precision: str = "fp16",
    layout: str = "channels_last",
    **kw: object,
) -> StepFeatures:
    """A published run's step: DeepLearningExamples' AMP runs are channels-last, its TF32
    runs and every TPU run channels-first (PyTorch's default)."""
    if precision != "fp16":
        layout = "channels_first"
    traffic = load_traffic()[traffic_key(key, batch, precision, layout)].scaled(batch)
    flops = sum(f for _, f, _ in traffic.matrix)
    return StepFeatures(
        chip=chip,
        chips=1,
        flops_per_chip=flops,
        model_class="cnn",
        precision=precision,
        framework="pytorch",
        traffic=traffic,
        **kw,  # type: ignore[arg-type]
    )


def test_a_cnn_with_its_traffic_gets_an_expected_figure_from_the_op_by_op_model() -> None:
    step = expected_step_by_op(_features("resnet50_v1_5", 256), A100)
    assert step is not None and step.kind == "expected"
    assert "op-by-op" in step.source and "leave-one-publisher-out" in step.source
    assert step.low < step.seconds < step.high
    # without its traffic the same step is only a bound: the LLM fit has no CNN run
    bare = expected_step_by_op(replace(_features("resnet50_v1_5", 256), traffic=None), A100)
    assert bare is not None and bare.kind == "bound"


def test_depthwise_convolutions_run_at_their_own_bandwidth() -> None:
    """EfficientNet-B0 does a tenth of ResNet-50's FLOPs and timm's runs show it 1.4x faster
    on one RTX 3090: its depthwise convolutions' bytes at their fitted bandwidth say why."""
    fit = default_class_fit()
    assert fit.depthwise and math.exp(fit.coefficients["depthwise"]) < math.exp(
        fit.coefficients["bandwidth"]
    )
    effnet = _features("efficientnet_b0", 256)
    assert effnet.traffic is not None and effnet.traffic.has_depthwise
    with_dw = expected_step_by_op(effnet, A100)
    moved = effnet.traffic
    as_other = OpTraffic(moved.matrix, moved.other_bytes + moved.depthwise_bytes, 0.0)
    without = expected_step_by_op(replace(effnet, traffic=as_other), A100)
    assert with_dw is not None and without is not None
    assert with_dw.seconds > without.seconds
    resnet = expected_step_by_op(_features("resnet50_v1_5", 256), A100)
    assert resnet is not None
    # ResNet-50 does 10.6x the FLOPs; its step is predicted within 2x of EfficientNet-B0's
    # (timm, RTX 3090: 1,218 and 1,752 img/s), where FLOPs at one utilisation say 10.6x
    assert 0.5 < with_dw.seconds / resnet.seconds < 2.0
    assert resnet.bound_seconds / with_dw.bound_seconds > 10


def test_the_class_factor_and_fusion_enter_the_figure() -> None:
    fit = default_class_fit()
    base = _features("resnet50_v1_5", 256)
    cnn = expected_step_by_op(base, A100)
    unet = expected_step_by_op(replace(base, model_class="unet"), A100)
    assert cnn is not None and unet is not None
    factor = math.exp(fit.coefficients["class:cnn"] - fit.coefficients["class:unet"])
    assert factor != pytest.approx(1.0, abs=0.05) and cnn.seconds != pytest.approx(unet.seconds)
    fused = expected_step_by_op(replace(base, framework="mxnet"), A100)
    assert fused is not None and fused.seconds < cnn.seconds  # fused kernels move fewer bytes


def test_a_convolutional_steps_matmuls_run_as_an_encoders_do() -> None:
    """The CNN and U-Net factors are their convolutions': a diffusion U-Net's transformer
    blocks (Stable Diffusion 2: a third of its matrix FLOPs) run as an encoder's matmuls. A
    compute-bound step priced with half its FLOPs outside convolutions takes the mean of the
    two rates; counted as all convolutions, or its convolutions uncounted, the class's alone."""
    fit = default_class_fit()
    c = fit.coefficients
    flops = 1e15  # at 10,000 FLOPs a byte: compute-bound on any chip

    def traffic(conv: float | None) -> OpTraffic:
        return OpTraffic(((1e4, flops, flops / 1e4),), 0.0, conv_flops=conv)

    def seconds(model_class: str, conv: float | None) -> float:
        features = replace(_features("resnet50_v1_5", 256), model_class=model_class,
                           flops_per_chip=flops, traffic=traffic(conv))  # fmt: skip
        step = expected_step_by_op(features, A100)
        assert step is not None and step.kind == "expected"
        return step.seconds

    # a U-Net with matmuls and attention is a diffusion U-Net: its convolutions take that
    # factor (`class:diffusion`), a U-Net of convolutions alone the segmentation U-Nets'
    for cls, factor in (("cnn", "cnn"), ("unet", "diffusion")):
        convolutions = seconds(cls, flops)
        assert seconds(cls, None) == pytest.approx(convolutions, rel=1e-9)
        ratio = math.exp(c[f"class:{factor}"] - c["class:encoder"])  # u_class / u_encoder
        own = math.exp(c[f"class:{cls}"] - c[f"class:{factor}"])  # the factor of convolutions
        assert seconds(cls, flops / 2) == pytest.approx(convolutions * own * (0.5 + 0.5 * ratio))
        assert ratio != pytest.approx(1.0, abs=0.05)
    # an encoder's FLOPs are priced at its own factor, convolutions or not
    assert seconds("encoder", flops / 2) == pytest.approx(seconds("encoder", flops), rel=1e-9)
    # Stable Diffusion 2's step, as counted: a third of its matrix FLOPs are not convolutions
    table = load_traffic()
    sd2 = table[traffic_key("sd2_base_unet_512", 64, "bf16")]
    assert 0.3 < sd2.matmul_share < 0.4
    # without an encoder run nothing calibrates those matmuls: a bound that says so, where
    # a U-Net of convolutions alone keeps its figure
    runs = [r for r in load_published_runs(MODELS_TABLE) if r.model_class != "encoder"]
    fold = fit_without_error(runs, table, CATALOGUE, default_fit())
    v5p = CATALOGUE.get("v5p")
    mixed = fold.predict(default_fit(), v5p, sd2, "unet", "pytorch_xla", "bf16")
    assert mixed is not None and not mixed.calibrated
    assert "no published encoder run (for its matmuls)" in mixed.why_not
    convs = fold.predict(default_fit(), A100, traffic(flops), "unet", "pytorch", "fp16")
    assert convs is not None and convs.calibrated


def test_a_unet_with_attention_takes_the_diffusion_unets_factor() -> None:
    """Segmentation U-Nets (3-D, from 32 channels) run their convolutions far below a CNN's
    rate, the latent diffusion U-Nets of two publishers (diffusers' on TPU v5p, MLPerf's on
    H100s) near it: a U-Net whose matmuls and attention do 5% of its matrix FLOPs or more
    takes a factor of its own, calibrated by diffusion U-Nets alone. Without any, its figure
    is a bound that says so, while a U-Net of convolutions alone keeps its figure."""
    from gpu2tpu.pricing.class_fit import _terms

    table = load_traffic()
    sd2 = table[traffic_key("sd2_base_unet_512", 64, "bf16")]
    nnunet = table[traffic_key("nnunet_3d_brats", 2, "fp16", "channels_last")]
    assert "class:diffusion" in _terms("unet", "xla", "bf16", sd2)
    assert "class:unet" in _terms("unet", "eager", "fp16", nnunet)
    shipped = default_class_fit()
    v5p = CATALOGUE.get("v5p")
    as_diffusion = shipped.predict(default_fit(), v5p, sd2, "unet", "pytorch_xla", "bf16")
    assert as_diffusion is not None and as_diffusion.calibrated
    diffusion = {"diffusers-pytorch-xla"}
    runs = [
        r
        for r in load_published_runs(MODELS_TABLE)
        if r.source_group not in diffusion and r.model.key != "mlperf_sd2_moments"
    ]
    fold = fit_without_error(runs, table, CATALOGUE, default_fit())
    assert "class:diffusion" not in fold.coefficients and "class:unet" in fold.coefficients
    bound = fold.predict(default_fit(), v5p, sd2, "unet", "pytorch_xla", "bf16")
    assert bound is not None and not bound.calibrated
    assert "no published run of a U-Net with attention" in bound.why_not
    segmentation = fold.predict(default_fit(), A100, nnunet, "unet", "pytorch", "fp16")
    assert segmentation is not None and segmentation.calibrated
    # and the other way round: with diffusion U-Nets alone, a segmentation U-Net is the bound
    only = [
        r for r in load_published_runs(MODELS_TABLE) if r not in runs or r.model_class != "unet"
    ]
    other = fit_without_error(only, table, CATALOGUE, default_fit())
    unseen = other.predict(default_fit(), A100, nnunet, "unet", "pytorch", "fp16")
    assert unseen is not None and not unseen.calibrated
    assert "no published run of a U-Net without attention" in unseen.why_not


def test_a_regime_no_other_publisher_calibrates_is_a_bound() -> None:
    """Without any TPU publisher's runs nothing calibrates XLA's fusion of a CNN on a TPU."""
    tpu = {"mlperf-google", "diffusers-pytorch-xla"}
    runs = [r for r in load_published_runs(MODELS_TABLE) if r.source_group not in tpu]
    fold = fit_without_error(runs, load_traffic(), CATALOGUE, default_fit())
    assert "xla" not in fold.fusions
    v4 = CATALOGUE.get("v4")
    traffic = _features("resnet50_v1_5", 128, chip="v4", precision="bf16").traffic
    assert traffic is not None
    prediction = fold.predict(default_fit(), v4, traffic, "cnn", "tensorflow", "bf16")
    assert prediction is not None and not prediction.calibrated
    assert "XLA" in prediction.why_not
    # Shipped, two publishers' TPU runs calibrate it (Google's MLPerf, diffusers' PyTorch/XLA
    # Stable Diffusion), so each was predicted from the other: a figure.
    shipped = default_class_fit().predict(default_fit(), v4, traffic, "cnn", "tensorflow", "bf16")
    assert shipped is not None and shipped.calibrated
    assert "fusion:xla" not in default_class_fit().unchecked
    # With Google's runs alone, XLA's fusion is a term one publisher calibrates: a bound.
    google = [
        r for r in load_published_runs(MODELS_TABLE) if r.source_group != "diffusers-pytorch-xla"
    ]
    from gpu2tpu.pricing.class_fit import fit_classes

    alone = fit_classes(google, load_traffic(), CATALOGUE, default_fit())
    assert alone.unchecked.get("fusion:xla") == "mlperf-google"
    single = alone.predict(default_fit(), v4, traffic, "cnn", "tensorflow", "bf16")
    assert single is not None and not single.calibrated
    assert "only mlperf-google's runs" in single.why_not


def test_a_term_one_publisher_alone_calibrates_is_shown_as_a_bound() -> None:
    """TF32 steps are calibrated by NVIDIA's DeepLearningExamples alone: leaving it out
    leaves them uncalibrated, so no cross-publisher error exists for a TF32 figure and the
    shipped fit shows one as a bound, while the same model in fp16 gets a figure. Once a
    second publisher's TF32 runs are in the table, the figure is shown."""
    fit = default_class_fit()
    assert fit.unchecked.get("precision:tf32") == "nvidia-dle"
    fp16 = expected_step_by_op(_features("resnet50_v1_5", 256), A100)
    tf32 = expected_step_by_op(_features("resnet50_v1_5", 256, precision="tf32"), A100)
    assert fp16 is not None and fp16.kind == "expected"
    assert tf32 is not None and tf32.kind == "bound"
    assert any("only nvidia-dle's runs calibrate tf32 steps" in n for n in tf32.notes)
    runs = load_published_runs(MODELS_TABLE)
    second = [
        replace(r, id=f"{r.id}-again", source_group="another-publisher")
        for r in runs
        if r.precision == "tf32" and r.model.key == "resnet50_v1_5"
    ]
    from gpu2tpu.pricing.class_fit import fit_classes

    both = fit_classes([*runs, *second], load_traffic(), CATALOGUE, default_fit())
    assert "precision:tf32" not in both.unchecked
    traffic = _features("resnet50_v1_5", 256, precision="tf32").traffic
    assert traffic is not None
    again = both.predict(default_fit(), A100, traffic, "cnn", "pytorch", "tf32")
    assert again is not None and again.calibrated


def test_a_run_its_host_limited_is_a_floor_not_a_point_of_the_fit() -> None:
    """DeepLearningExamples' ResNet-50 and EfficientNet-B0, steps tenfold apart in FLOPs, ran
    at one rate: their data loader's. Such a run says nothing about the chip: moving its
    rate moves no coefficient, its error is in no median, and the range of the figure
    predicted for it without its publisher is checked to reach its rate."""
    from gpu2tpu.pricing.class_fit import fit_classes

    runs = load_published_runs(MODELS_TABLE)
    limited = [r for r in runs if r.limited_by]
    assert {r.model.key for r in limited} == {"resnet50_v1_5", "efficientnet_b0"}
    assert all(r.limited_by == "input" and r.source_group == "nvidia-dle" for r in limited)
    fit = default_class_fit()
    assert {e.run.id for e in fit.floors} == {r.id for r in limited}
    assert not {e.run.id for e in fit.cross_source} & {r.id for r in limited}
    # the fast end of the figure's range reaches the host's rate (the step could run so fast)
    assert all(
        e.expected is not None
        and e.expected * math.exp(fit.range_for(e.run.model_class)[1]) >= e.published
        for e in fit.floors
    )
    halved = [replace(r, value=r.value / 2) if r.limited_by else r for r in runs]
    moved = fit_classes(halved, load_traffic(), CATALOGUE, default_fit())
    assert moved.coefficients == fit.coefficients
    # the same rows as points of the fit would move it
    as_points = [replace(r, limited_by="") for r in halved]
    pulled = fit_classes(as_points, load_traffic(), CATALOGUE, default_fit())
    assert pulled.coefficients != fit.coefficients


def test_3d_convolutions_on_a_tpu_are_a_bound_until_a_second_publisher_runs_them() -> None:
    """Google's MLPerf UNet3D on TPU v4 ran at a seventh of an A100's rate a chip, where its
    ResNet-50 ran at par: 3-D convolutions on a TPU have a factor of their own, which that
    run alone calibrates, so a 3-D U-Net's TPU figure is a bound naming it; the same step
    on a GPU, and a 2-D U-Net on a TPU, get figures; a second publisher's run would too."""
    from gpu2tpu.pricing.class_fit import fit_classes

    fit = default_class_fit()
    assert fit.unchecked.get("conv3d:tpu") == "mlperf-google"
    assert math.exp(fit.coefficients["conv3d:tpu"]) < 0.7
    v4 = CATALOGUE.get("v4")
    volume = load_traffic()[traffic_key("mlperf_unet3d", 1, "bf16")]
    flat = load_traffic()[traffic_key("nnunet_2d_brats", 64, "fp16")]
    assert volume.has_volumetric and not flat.has_volumetric
    on_tpu = fit.predict(default_fit(), v4, volume, "unet", "jax", "bf16")
    assert on_tpu is not None and not on_tpu.calibrated
    assert "only mlperf-google's runs calibrate 3-D convolutions on a TPU" in on_tpu.why_not
    on_gpu = fit.predict(default_fit(), A100, volume, "unet", "pytorch", "bf16")
    assert on_gpu is not None and on_gpu.calibrated
    flat_tpu = fit.predict(default_fit(), v4, flat, "unet", "jax", "bf16")
    assert flat_tpu is not None and flat_tpu.calibrated
    # the factor slows the 3-D step on a TPU (what the published run says)
    without = replace(volume, volumetric_flops=0.0)
    plain = fit.predict(default_fit(), v4, without, "unet", "jax", "bf16")
    assert plain is not None and on_tpu.seconds > 1.4 * plain.seconds
    runs = load_published_runs(MODELS_TABLE)
    second = [
        replace(r, id=f"{r.id}-again", source_group="another-publisher")
        for r in runs
        if r.model.key == "mlperf_unet3d" and r.chip == "v4"
    ]
    both = fit_classes([*runs, *second], load_traffic(), CATALOGUE, default_fit())
    assert "conv3d:tpu" not in both.unchecked
    again = both.predict(default_fit(), v4, volume, "unet", "jax", "bf16")
    assert again is not None and again.calibrated
    # without any TPU 3-D run nothing calibrates the factor: a bound saying so
    fold = fit_without_error(
        [r for r in runs if r.source_group != "mlperf-google"], load_traffic(), CATALOGUE,
        default_fit(),
    )  # fmt: skip
    alone = fold.predict(default_fit(), v4, volume, "unet", "jax", "bf16")
    assert alone is not None and "no published run of 3-D convolutions on a TPU" in alone.why_not


def test_the_counter_keeps_the_flops_of_3d_convolutions() -> None:
    """The profiler's traffic carries a step's 3-D convolution FLOPs (what the TPU factor
    reads); a 2-D network has none."""
    for conv, shape, volumetric in ((torch.nn.Conv3d, (2, 4, 8, 8, 8), True),
                                    (torch.nn.Conv2d, (2, 4, 8, 8), False)):  # fmt: skip
        with torch.device("meta"):
            model = torch.nn.Sequential(conv(4, 8, 3, padding=1), torch.nn.ReLU(), conv(8, 4, 1))
        step = count_meta_step(
            model,
            (torch.empty(shape, device="meta"),),
            {},
            torch.empty(shape, device="meta"),
            lambda out, target: (out - target).pow(2).mean(),
        )
        traffic = step.traffic()
        assert traffic.has_volumetric is volumetric
        assert traffic.volumetric_flops == pytest.approx(step.mix.conv3d_flops)
        if volumetric:
            assert traffic.volumetric_flops == pytest.approx(sum(f for _, f, _ in traffic.matrix))


def test_channels_first_convolutions_on_a_gpu_run_slower_than_channels_last() -> None:
    """timm ran the same CNNs on one RTX 3090 in both layouts: channels-first, PyTorch's
    default, at 0.68-0.83 of channels-last. The count tells the layouts apart, and the
    fit's factor for the default layout (calibrated by timm's and DeepLearningExamples'
    runs) slows a GPU figure; a TPU's compiler picks its own layout: no factor there."""
    fit = default_class_fit()
    factor = math.exp(fit.coefficients["layout:channels_first"])
    assert 0.6 < factor < 0.9
    assert "layout:channels_first" not in fit.unchecked
    table = load_traffic()
    first = table[traffic_key("resnet50_v1_5", 512, "fp16")]
    last = table[traffic_key("resnet50_v1_5", 512, "fp16", "channels_last")]
    assert first.has_channels_first and not last.has_channels_first
    assert first.total_bytes == pytest.approx(last.total_bytes)
    rtx = CATALOGUE.get("rtx-3090")
    slow = fit.predict(default_fit(), rtx, first, "cnn", "pytorch", "fp16")
    fast = fit.predict(default_fit(), rtx, last, "cnn", "pytorch", "fp16")
    assert slow is not None and fast is not None and slow.calibrated and fast.calibrated
    # the factor is the convolutions': the classifier head's matmuls keep an encoder's rate
    assert 0 < first.matmul_share < 0.01
    assert slow.utilisation == pytest.approx(fast.utilisation * factor, rel=first.matmul_share)
    assert slow.seconds > 1.05 * fast.seconds  # its memory-bound ops move as many bytes
    # the figure says so, and what lifts it
    shown = expected_step_by_op(
        _features("resnet50_v1_5", 512, "rtx-3090", layout="channels_first"), rtx
    )
    assert shown is not None and shown.kind == "expected"
    assert any("channels-first" in n and "channels_last" in n for n in shown.notes)
    plain = expected_step_by_op(_features("resnet50_v1_5", 512, "rtx-3090"), rtx)
    assert plain is not None and not any("channels-first" in n for n in plain.notes)
    v4 = CATALOGUE.get("v4")
    on_tpu = [fit.predict(default_fit(), v4, t, "cnn", "jax", "bf16") for t in (first, last)]
    assert on_tpu[0] is not None and on_tpu[1] is not None
    assert on_tpu[0].seconds == pytest.approx(on_tpu[1].seconds)
    # without either publisher of channels-first GPU runs the default layout is uncalibrated
    runs = [
        r for r in load_published_runs(MODELS_TABLE) if r.source_group not in ("timm", "nvidia-dle")
    ]
    fold = fit_without_error(runs, table, CATALOGUE, default_fit())
    alone = fold.predict(default_fit(), rtx, first, "cnn", "pytorch", "fp16")
    assert alone is not None and not alone.calibrated
    assert "no published run of channels-first convolutions on a GPU" in alone.why_not


def test_the_count_reads_a_step_s_convolution_layout() -> None:
    """A model converted with `.to(memory_format=torch.channels_last)` runs every
    convolution channels-last (its weights say so even where the meta device's outputs do
    not; a 1x1 kernel's weight alone cannot); one left as it is runs them channels-first."""
    for layout in (None, torch.channels_last):
        with torch.device("meta"):
            model = torch.nn.Sequential(
                torch.nn.Conv2d(3, 8, 1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3, padding=1)
            )
        image = torch.empty(2, 3, 16, 16, device="meta")
        if layout is not None:
            model = model.to(memory_format=layout)
            image = image.contiguous(memory_format=layout)
        step = count_meta_step(
            model, (image,), {}, torch.empty(2, 8, 16, 16, device="meta"),
            lambda out, target: (out - target).pow(2).mean(),
        )  # fmt: skip
        first = step.mix.channels_first_flops
        assert first == (step.mix.conv_flops if layout is None else 0.0)
        assert step.traffic().has_channels_first is (layout is None)


def test_each_class_s_figures_take_that_class_s_range() -> None:
    """A CNN's range is the CNNs' cross-publisher residuals, an encoder's the encoders':
    pooled, the encoders' narrower errors would widen nothing and the U-Nets' wider ones
    would fall outside (issue 35: the range holding its stated share per class)."""
    fit = default_class_fit()
    assert set(fit.class_ranges) == {"cnn", "encoder", "unet"}
    assert fit.range_for("encoder") != fit.range_for("unet")
    for cls in ("cnn", "encoder", "unet"):
        errors = fit.class_errors(cls)
        assert errors is not None
        assert fit.range_holds(cls) >= 0.8 * errors[0], cls
        # the figure's range is its class's
        step = expected_step_by_op(replace(_features("resnet50_v1_5", 256), model_class=cls),
                                   A100)  # fmt: skip
        assert step is not None and step.kind == "expected"
        under, over = fit.range_for(cls)
        assert step.high == pytest.approx(step.seconds * math.exp(-under))
        assert step.low == pytest.approx(max(step.bound_seconds, step.seconds * math.exp(-over)))
        assert f"the range holds every run of {fit.range_holds(cls)} of them" in step.source
    # a class no publisher was left out for takes every class's
    assert fit.range_for("small") == fit.log_range


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(st.floats(-3, 3, allow_nan=False), min_size=1, max_size=4),
        min_size=1,
        max_size=40,
    )
)
def test_a_range_holds_every_run_of_its_stated_share_of_configurations(
    configurations: list[list[float]],
) -> None:
    """Each end is the outer quantile of the configurations' extreme runs on its side: each
    leaves out at most a tenth, so at least 80% of the configurations lie wholly inside,
    whatever their runs' spread (the benchmark counts a configuration as held only so)."""
    from gpu2tpu.pricing.class_fit import _range

    low, high = _range(configurations)
    held = sum(all(low <= r <= high for r in runs) for runs in configurations)
    assert held >= 0.8 * len(configurations)
    # and no wider than the runs themselves
    assert min(map(min, configurations)) <= low <= high <= max(map(max, configurations))


def test_the_llm_fit_is_untouched_by_the_non_llm_runs() -> None:
    alone = fit_utilisation(load_published_runs(), CATALOGUE)
    assert dict(default_fit().coefficients) == pytest.approx(dict(alone.coefficients))
    assert "cnn" not in default_fit().model_classes


def test_every_class_is_predicted_without_its_publisher() -> None:
    fit = default_class_fit()
    for cls in ("cnn", "encoder", "unet"):
        errors = fit.class_errors(cls)
        assert errors is not None and errors[0] >= 3
    assert {h.run.source_group for h in fit.cross_source} >= {"timm", "nvidia-dle", "mlperf-nvidia"}


def test_the_traffic_table_is_the_profilers_count() -> None:
    model, (inputs, targets), recipe = build("efficientnet_b0", 256, "channels_last")
    step = count_meta_step(model, (inputs,), {}, targets, recipe.loss, torch.float16)
    table = load_traffic()[traffic_key("efficientnet_b0", 256, "fp16", "channels_last")]
    counted = step.traffic().scaled(1 / 256)
    assert table.total_bytes == pytest.approx(counted.total_bytes, rel=1e-4)
    assert table.depthwise_bytes == pytest.approx(counted.depthwise_bytes, rel=1e-4)
    assert table.channels_first_flops == counted.channels_first_flops == 0
    assert table.conv_flops == pytest.approx(counted.conv_flops, rel=1e-4)
    assert counted.conv_flops == pytest.approx(step.mix.conv_flops / 256, rel=1e-9)
    assert step.bytes_accessed / 256 == pytest.approx(counted.total_bytes, rel=1e-9)


def test_a_step_with_no_matrix_flops_shows_the_floor_as_a_bound() -> None:
    from gpu2tpu import profile

    bag = torch.nn.EmbeddingBag(10000, 64)
    ids = torch.randint(0, 10000, (256, 20))
    result = profile(lambda: bag(ids), steps=3, warmup=1, backend="cpu")
    assert result.flops_per_step == 0
    assert any("per-step floor alone" in n for n in result.notes)
    estimated = [r for r in result.comparison.rows if r.source == "estimated"]
    assert estimated
    for row in estimated:
        assert row.time_kind == "bound" and row.step_seconds and row.step_seconds > 0
        assert "per-step floor" in row.note and "no published run" in row.note


@pytest.mark.slow
def test_a_cnn_profile_states_the_error_of_the_model_that_made_its_figures() -> None:
    """The accuracy printed beside a CNN's expected rows is the op-by-op model's, measured
    on publishers it never saw, not the LLM fit's (which never saw a CNN)."""
    from gpu2tpu import profile

    torch.manual_seed(0)
    layers = [torch.nn.Conv2d(64, 64, 3, padding=1) for _ in range(4)]
    net = torch.nn.Sequential(*[m for conv in layers for m in (conv, torch.nn.ReLU())])
    # bf16: an fp32 step is costed as TF32 on a GPU, which one publisher alone calibrates
    # (a bound), and as fp32 on a TPU, which none does
    net = net.to(torch.bfloat16)
    x = torch.randn(4, 64, 64, 64, dtype=torch.bfloat16)  # 1.3e10 FLOPs a step: a CNN

    def step() -> None:
        net(x).sum().backward()

    result = profile(step, steps=2, warmup=1, backend="cpu")
    expected = [r for r in result.comparison.rows if r.time_kind == "expected"]
    assert expected, [r.note for r in result.comparison.rows]
    stated = result.comparison.expected_source
    assert stated == default_class_fit().source_line("cnn")
    assert default_fit().source_line() not in stated
    # each row says its rate is the op-by-op model's, not what published runs (LLMs) reach
    for row in expected:
        assert "each op at the slower of its compute and memory rate" in row.note, row.note
        assert "what published runs reach" not in row.note


def test_the_stable_diffusion_step_has_the_published_shapes_and_counts() -> None:
    """SD 2 base as diffusers configures it: the U-Net, the VAE encoder and the text encoder
    have their published parameter counts; the step runs the frozen encoders forward only
    (no gradient for them), and the table's FLOPs are the profiler's count of it."""
    model, (images, targets), recipe = build("sd2_base_unet_512", 2)

    def parameters(module: torch.nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    assert parameters(model.unet) == 865_910_724  # UNet2DConditionModel, SD 2 base
    assert parameters(model.vae) == 34_163_664  # AutoencoderKL's encoder and quant_conv
    assert parameters(model.text) == 340_387_840  # 23 layers of 1,024, by the configuration
    assert not any(p.requires_grad for p in [*model.vae.parameters(), *model.text.parameters()])
    count = count_meta_step(model, (images,), {}, targets, recipe.loss, torch.bfloat16)
    run = next(r for r in load_published_runs(MODELS_TABLE) if r.model.key == "sd2_base_unet_512")
    assert count.flops / 2 == pytest.approx(run.flops_per_sample, rel=1e-4)
    unet_only = count_meta_step(
        model.unet,
        (torch.empty(2, 4, 64, 64), torch.zeros(2, dtype=torch.long), torch.empty(2, 77, 1024)),
        {},
        None,
        lambda out, _: out.float().pow(2).mean(),
        torch.bfloat16,
    )
    # the encoders' forward is a third of the step's work: leaving it out would misstate it
    assert 0.25 < 1 - unet_only.flops / count.flops < 0.4


def test_mlperfs_stable_diffusion_step_starts_from_the_vaes_moments() -> None:
    """MLPerf's step (NVIDIA's NeMo code) trains from latents encoded beforehand: the same
    U-Net and text encoder as diffusers' step, no VAE, the table's FLOPs the count of it, and
    about 30% less work than the step that encodes its images each time."""
    model, (moments, targets), recipe = build("mlperf_sd2_moments", 2)
    assert not hasattr(model, "vae") and moments.shape[1:] == (8, 64, 64)
    assert sum(p.numel() for p in model.unet.parameters()) == 865_910_724
    assert sum(p.numel() for p in model.text.parameters()) == 340_387_840
    count = count_meta_step(model, (moments,), {}, targets, recipe.loss, torch.float16)
    runs = load_published_runs(MODELS_TABLE)
    run = next(r for r in runs if r.model.key == "mlperf_sd2_moments")
    assert count.flops / 2 == pytest.approx(run.flops_per_sample, rel=1e-4)
    diffusers = next(r for r in runs if r.model.key == "sd2_base_unet_512")
    assert 0.6 < run.flops_per_sample / diffusers.flops_per_sample < 0.8


@pytest.mark.slow  # three BERT-large steps counted on the meta device
def test_mlperf_bert_is_counted_at_the_lengths_its_sequences_have() -> None:
    """MLPerf BERT's sequences average half the 512 tokens (the source states a packing
    speed-up limit of 2.0013); the entries that skip padding do half the dense step's work
    and a bit over a third of its attention (the mean square length), the bucketed one pads
    to 128, 256 or 512. Counting them dense at 512 would double their FLOPs."""
    from published_models import WIKIPEDIA_LENGTHS_48, WIKIPEDIA_LENGTHS_56, bucketed

    for lengths in (WIKIPEDIA_LENGTHS_56, WIKIPEDIA_LENGTHS_48):
        assert 512 / (sum(lengths) / len(lengths)) == pytest.approx(2.0013, rel=0.005)
    mean_square = sum(n * n for n in WIKIPEDIA_LENGTHS_56) / 56 / 512**2

    def per_sample(key: str, batch: int) -> tuple[float, float]:
        model, (inputs, targets), recipe = build(key, batch)
        step = count_meta_step(model, (inputs,), {}, targets, recipe.loss, torch.float16)
        return step.flops / batch, step.attention_flops / batch

    dense, dense_attention = per_sample("bert_large_mlperf_512", 56)
    unpadded, unpadded_attention = per_sample("bert_large_mlperf_unpadded", 56)
    assert unpadded_attention / dense_attention == pytest.approx(mean_square, rel=0.01)
    # the masked-LM head runs on the 76 masked positions either way, the rest on real tokens
    assert 0.49 < unpadded / dense < 0.52
    buckets, _ = per_sample("bert_large_mlperf_buckets", 48)
    share = sum(bucketed(WIKIPEDIA_LENGTHS_48)) / 48 / 512
    assert buckets / dense == pytest.approx(share, abs=0.03)
    rows = {r.id: r for r in load_published_runs(MODELS_TABLE)}
    assert rows["mlperf-nvidia-a100-bert-large-8"].flops_per_sample == pytest.approx(
        unpadded, rel=1e-4
    )
    assert rows["mlperf-google-v4-bert-large-64"].flops_per_sample == pytest.approx(
        buckets, rel=1e-4
    )


@pytest.mark.slow  # three BERT-large steps counted on the meta device
def test_deeplearningexamples_phase_2_is_counted_at_its_binned_lengths() -> None:
    """DeepLearningExamples' phase-2 table was made with batches binned by length (each
    padded to its bin's multiple of 64): a sequence costs its length rounded up to 64 (280 of
    512 tokens on average), its attention the square of that, with the scores in memory (the
    reference attention, not a fused kernel); counted dense at 512 it would cost 1.87x."""
    from published_models import BINS_OF_64, WIKIPEDIA_LENGTHS, Bert, bucketed

    def count(model: torch.nn.Module, key: str, batch: int) -> tuple[float, float, float]:
        _, (inputs, targets), recipe = build(key, batch)
        step = count_meta_step(model, (inputs,), {}, targets, recipe.loss, torch.float16)
        return step.flops / batch, step.attention_flops / batch, step.traffic().other_bytes

    key = "bert_large_pretrain_512_binned"
    dense_key = "bert_large_pretrain_512"
    dense, dense_attention, _ = count(build(dense_key, 32)[0], dense_key, 32)
    binned, attention, written = count(build(key, 32)[0], key, 32)
    lengths = bucketed(WIKIPEDIA_LENGTHS[32], BINS_OF_64)
    assert all(length % 64 == 0 for length in lengths)
    assert sum(lengths) / 32 == pytest.approx(280, abs=8)
    mean_square = sum(n * n for n in lengths) / 32 / 512**2
    assert attention / dense_attention == pytest.approx(mean_square, rel=0.01)
    # the word decoder reads 38 masked tokens a sequence, not the dense model's 80
    assert 0.52 < binned / dense < 0.55
    with torch.device("meta"):
        fused = Bert("pretraining", 38, fused=True, lengths=lengths)
    _, _, fused_written = count(fused, key, 32)
    assert written > 1.2 * fused_written  # the scores, their softmax and dropout
    rows = {r.id: r for r in load_published_runs(MODELS_TABLE)}
    assert rows["nvidia-dle-a100-80gb-bert-large-pretrain-512-fp16-1"].flops_per_sample == (
        pytest.approx(binned, rel=1e-4)
    )


def test_the_forecast_costs_a_cnn_op_by_op_as_the_profiler_does() -> None:
    """A compiled CNN target is priced with the op-by-op model from the step counted on the
    meta device (one answer: the profiler's figure for the same features), on the TPU and on
    the GPU rows beside it, and states that model's error, not the LLM fit's."""
    from gpu2tpu.forecasting.forecast import _features, _gpu_row, _price
    from gpu2tpu.forecasting.result import TargetForecast

    torch.manual_seed(0)
    layers = [torch.nn.Conv2d(64, 64, 3, padding=1) for _ in range(4)]
    net = torch.nn.Sequential(*[m for conv in layers for m in (conv, torch.nn.ReLU())])
    x = torch.randn(4, 64, 64, 64)
    step = count_meta_step(net, (x,), {}, None, lambda out, _: out.float().sum(), torch.bfloat16)
    assert step.model_class == "cnn" and step.precision == "bf16"
    v5e = CATALOGUE.get("v5e")
    target = TargetForecast(
        target="v5e", name=v5e.name, topology="v5e:1x1", chips=1, devices_per_chip=1,
        status="compiled", batch=4, flops=step.flops, bytes_accessed=step.bytes_accessed / 4,
        memory_per_chip=2**30, available_per_chip=15 * 2**30, fits=True,
    )  # fmt: skip
    _price(target, v5e, None, "on_demand", None, step)
    by_op = expected_step_by_op(_features(target, v5e, 1, None, step), v5e)
    assert by_op is not None and by_op.kind == "expected"
    assert target.expected_seconds == pytest.approx(by_op.seconds)
    assert target.expected_source == default_class_fit().source_line("cnn")
    assert default_fit().source_line() != target.expected_source
    # without the count (a model the meta device cannot run) it is the LLM fit's figure
    _price(target, v5e, None, "on_demand", None, None)
    assert target.expected_source in (None, default_fit().source_line())
    assert target.expected_seconds != pytest.approx(by_op.seconds)
    _price(target, v5e, None, "on_demand", None, step)
    gpu = _gpu_row(target, CATALOGUE.get("h100"), 4, None, "on_demand", None, step)
    assert gpu.time_kind == "expected"


@pytest.mark.slow  # every published model's step counted once on the meta device
def test_the_profiler_guesses_each_published_model_the_class_its_table_gives() -> None:
    """A user's profile takes the class the count guesses; for the published models it is
    the class their runs calibrate (the MLPerf Stable Diffusion step, convolutions just under
    half of its matrix FLOPs, was once guessed an encoder)."""
    runs: dict[str, PublishedRun] = {}
    for run in load_published_runs(MODELS_TABLE):
        runs.setdefault(run.model.key, run)
    wrong = []
    for key, run in sorted(runs.items()):
        count, _ = count_run(run)
        if count.model_class != run.model_class:
            wrong.append((key, count.model_class, run.model_class))
    assert not wrong
