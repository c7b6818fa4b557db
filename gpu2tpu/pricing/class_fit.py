"""Expected step time of CNNs, encoders and U-Nets: each op at the chip's achieved compute
or memory rate, calibrated on their published runs without touching the LLM fit.

By FLOPs alone the published runs of one class disagree sevenfold: EfficientNet-B0 reaches
6% of an RTX 3090's peak where ResNet-50 reaches 42% (timm's runs). Their ops tell why: a depthwise
convolution does a few FLOPs per byte it moves, batch norms and activations none, and in
eager PyTorch every one of them goes through HBM. So the time is summed op by op, each at
the slower of its two rates (the profiler counts both FLOPs and bytes of every op):

    t = sum over matrix ops of max(FLOPs / (peak x u), bytes / (bandwidth x e))
        + phi[fusion] x other ops' bytes / (bandwidth x e)
        + depthwise convolutions' bytes / (bandwidth x e_dw)

- `u`, the matrix ops' share of peak, is the LLM fit's utilisation for the chip, framework
  and precision (`UtilisationFit.utilisation`, unchanged) times a per-class factor
  exp(class[c]): the LLM runs teach how chips and frameworks differ, these runs how far a
  CNN's convolutions or an encoder's matmuls sit from an LLM's. A CNN's or U-Net's factor is
  its convolutions': the share of its matrix FLOPs in matmuls and attention (a classifier
  head, a diffusion U-Net's transformer blocks: `OpTraffic.matmul_share`) runs at the
  encoders' factor. A U-Net with such matmuls and attention (a latent diffusion U-Net) takes
  a factor of its own for its convolutions (`DIFFUSION`): the segmentation U-Nets' sits at
  half a CNN's;
- `e`, the share of HBM bandwidth the memory-bound ops reach, and `e_dw` that of depthwise
  convolutions (cuDNN's depthwise kernels run well below the bandwidth);
- `phi`, the share of the elementwise ops' unfused bytes that still moves after fusion: 1 in
  eager PyTorch (what the profiler counts), fitted for XLA (every framework on a TPU) and
  for GPU frameworks with fused kernels (MXNet, PaddlePaddle, TensorFlow), as a logistic
  share (shrunk towards a half);
- a factor for fp32/TF32 steps (`precision:*`), whose convolutions run further below the
  TF32 peak than 16-bit ones do below theirs;
- a factor for 3-D convolutions on a TPU (`conv3d:tpu`, on `u` where they do 5% or more of
  the matrix FLOPs): Google's MLPerf UNet3D ran at a seventh of an A100's rate a chip where
  its ResNet-50 ran at par. One publisher calibrates it, so such a figure is a bound.

A run whose rate its host's data loading set (`PublishedRun.limited_by`: different models at
one rate) says nothing about the chip; it is not fitted, only checked as a floor.

The class, fusion and depthwise terms are fitted by weighted least squares on the log of the
step time (each configuration weighs one; Levenberg-Marquardt), shrunk towards their priors
(class and precision 0, phi one half, e_dw = e, e 0.8) by the same ridge as the LLM fit. How sure: each publisher of
these runs is left out in turn and predicted by the others (`ClassFit.cross_source`); the
range printed with a figure is the 10th-90th percentile of those errors. A class, a fusion
group or depthwise convolutions that no other publisher's run calibrates give no figure:
the caller shows a bound. So does, in the fit shipped to users, a term one publisher's runs
alone calibrate (`ClassFit.unchecked`): leaving that publisher out leaves the term
uncalibrated, so no error was ever measured for a figure that uses it.

Pure: the published runs' traffic comes in as data (`published_traffic.toml`, counted by
benchmarks/figures_vs_published_models.py on the models built to their shapes).
"""

from __future__ import annotations

import functools
import math
import statistics
import tomllib
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from .catalogue import Chip, HardwareCatalogue
from .op_traffic import OpTraffic
from .published import PublishedRun, load_published_runs
from .utilisation import (
    RANGE_QUANTILES,
    RIDGE,
    ExpectedStep,
    StepFeatures,
    UtilisationFit,
    _outer_quantile,
    _solve,
    default_framework,
    expected_step,
    infer_model_class,
)

CLASSES = ("cnn", "encoder", "unet")
MODELS_TABLE = Path(__file__).with_name("published_runs_models.toml")
TRAFFIC_TABLE = Path(__file__).with_name("published_traffic.toml")
# Frameworks that run a GPU step through fused kernels of their own rather than one kernel
# per PyTorch op; on a TPU every framework runs XLA's fused program.
_GRAPH_ON_GPU = frozenset({"mxnet", "paddle", "tensorflow", "jax"})
# 16-bit tensor-core precisions: the LLM fit's utilisation holds for them; fp32 and TF32
# steps get a fitted factor of their own (`precision:*`) where a run calibrates it.
_SAME_AS_BF16 = frozenset({"bf16", "fp16"})
_PRIOR = {"bandwidth": math.log(0.8)}
# Classes whose factor is their convolutions'; their other matrix work is priced as an
# encoder's where it does this share of the matrix FLOPs or more (`_terms`).
_CONVOLUTIONAL = frozenset({"cnn", "unet"})
MATMUL_IN_CONVOLUTIONAL = 0.05
# The factor of a U-Net with matmuls and attention doing `MATMUL_IN_CONVOLUTIONAL` or more
# of its matrix FLOPs: a latent diffusion U-Net (a transformer after its ResNet blocks, 320
# to 1,280 channels). The segmentation U-Nets (3-D, or 2-D from 32 channels) run their
# convolutions at half a CNN's rate, the diffusion U-Nets of two publishers at about a
# CNN's; one factor for both was off by 23-39% on each diffusion U-Net (docs/forecast.md).
DIFFUSION = "diffusion"
_FACTOR_WHAT = {
    DIFFUSION: "a U-Net with attention (a diffusion U-Net)",
    "unet": "a U-Net without attention",
}


def fusion_group(framework: str, chip_kind: str) -> str:
    """How a framework moves the bytes of elementwise ops on a kind of chip: "xla" (every
    framework on a TPU), "graph" (fused GPU kernels) or "eager" (one kernel per op)."""
    if chip_kind == "tpu":
        return "xla"
    return "graph" if framework in _GRAPH_ON_GPU else "eager"


def traffic_key(model: str, batch: int, precision: str, layout: str = "channels_first") -> str:
    """The traffic table's key of a run's step: "model/batch a chip/precision", and
    "/channels_last" where its convolutions ran in that layout."""
    return f"{model}/{batch}/{precision}" + ("" if layout == "channels_first" else f"/{layout}")


def load_traffic(path: Path = TRAFFIC_TABLE) -> dict[str, OpTraffic]:
    """The published runs' traffic per sample, keyed by `traffic_key`."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the published runs' traffic ({exc}).") from exc
    out = {}
    for key, entry in data.get("traffic", {}).items():
        out[key] = OpTraffic(
            tuple((float(i), float(f), float(b)) for i, f, b in entry["matrix"]),
            float(entry["other_bytes"]),
            float(entry.get("depthwise_bytes", 0.0)),
            float(entry.get("volumetric_flops", 0.0)),
            float(entry.get("channels_first_flops", 0.0)),
            float(entry["conv_flops"]) if "conv_flops" in entry else None,
        )
    return out


@dataclass(frozen=True)
class _Case:
    """One published run as the class fit sees it: its step's traffic and what it ran on."""

    run: PublishedRun
    chip: Chip
    traffic: OpTraffic  # per chip per step
    seconds: float  # published step time
    weight: float


@dataclass(frozen=True)
class ClassPrediction:
    """A step time and whether every term of it was calibrated (else why not)."""

    seconds: float
    calibrated: bool
    why_not: str = ""
    utilisation: float = 0.0


@dataclass(frozen=True)
class ClassError:
    """One run predicted without its publisher: expected against published samples/s."""

    run: PublishedRun
    expected: float | None  # samples a second a chip; None where only a bound is given
    published: float

    @property
    def error(self) -> float | None:
        return None if self.expected is None else self.expected / self.published - 1


@dataclass(frozen=True)
class ClassFit:
    """The fitted class, bandwidth, depthwise and fusion terms, what calibrated them, and
    their error on publishers left out."""

    coefficients: Mapping[str, float]
    classes: frozenset[str]
    fusions: frozenset[str]
    depthwise: bool
    sources: tuple[str, ...]
    precisions: frozenset[str] = frozenset()
    cross_source: tuple[ClassError, ...] = ()
    # The range of all classes' cross-source residuals, and each class's own: a CNN's figure
    # takes the CNNs' range, so that it holds its stated share for CNNs, not just on average
    log_range: tuple[float, float] = (0.0, 0.0)
    class_ranges: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    # term -> its only publisher, for the fit shipped to users: a term one publisher alone
    # calibrates was never predicted for a publisher the fit did not see, so no error
    # measured here holds for it and a figure using it is shown as a bound (empty in folds)
    unchecked: Mapping[str, str] = field(default_factory=dict)
    # runs whose rate the host set (`PublishedRun.limited_by`), not fitted: each predicted
    # without its publisher, as `cross_source`; the step's own rate is at least theirs
    floors: tuple[ClassError, ...] = ()

    def predict(
        self,
        llm: UtilisationFit,
        chip: Chip,
        traffic: OpTraffic,
        model_class: str,
        framework: str,
        precision: str,
    ) -> ClassPrediction | None:
        """The step time of `traffic` on `chip`, or None where the chip has no peak."""
        peak, _ = chip.peak_for(precision)
        if not peak or not chip.hbm_bandwidth:
            return None
        base = llm.utilisation(chip, 0.0, framework=framework, precision=precision)
        if base is None:
            return None
        fusion = fusion_group(framework, chip.kind)
        seconds, u = _seconds(self.coefficients, traffic, peak, chip.hbm_bandwidth, base,
                              model_class, fusion, precision)  # fmt: skip
        missing = []
        factor = _class_factor(model_class, traffic)
        if model_class not in self.classes:
            missing.append(f"no published {model_class} run")
        elif f"class:{factor}" not in self.coefficients:
            # a U-Net of one kind where only the other kind was published
            missing.append(f"no published run of {_FACTOR_WHAT[factor]}")
        elif _matmuls_as_encoder(model_class, traffic) and "encoder" not in self.classes:
            missing.append("no published encoder run (for its matmuls)")
        if fusion != "eager" and fusion not in self.fusions:
            missing.append(f"no published run of {_FUSION_WHAT[fusion]}")
        if precision not in _SAME_AS_BF16 and precision not in self.precisions:
            missing.append(f"no published {precision} run")
        if traffic.has_depthwise and not self.depthwise:
            missing.append("no published run with depthwise convolutions")
        missing += [
            f"no published run of {_term_what(t)}"
            for t in _convolution_terms(traffic, fusion)
            if t not in self.coefficients
        ]
        if not missing:
            used = _terms(model_class, fusion, precision, traffic)
            missing += [
                f"only {self.unchecked[t]}'s runs calibrate {_term_what(t)} (no error measured "
                "on another publisher)"
                for t in used
                if t in self.unchecked
            ]
        return ClassPrediction(seconds, not missing, "; ".join(missing), u)

    def range_for(self, model_class: str) -> tuple[float, float]:
        """The range of `model_class`'s residuals, log(published rate / expected rate), low
        end first: from its own configurations, else (a class no publisher was left out for)
        from every class's. A figure's time runs from exp(-high) to exp(-low) of it."""
        return self.class_ranges.get(model_class, self.log_range)

    def configuration_errors(self) -> dict[tuple[object, ...], float]:
        grouped: dict[tuple[object, ...], list[float]] = defaultdict(list)
        for h in self.cross_source:
            if h.error is not None:
                grouped[h.run.configuration].append(math.log1p(h.error))
        return {k: math.expm1(statistics.fmean(v)) for k, v in grouped.items()}

    def class_errors(self, model_class: str) -> tuple[int, float, float] | None:
        """Configurations, median and worst absolute cross-source error of one class."""
        errors = [
            abs(e)
            for k, e in self.configuration_errors().items()
            if any(h.run.configuration == k and h.run.model_class == model_class
                   for h in self.cross_source)
        ]  # fmt: skip
        if not errors:
            return None
        return len(errors), statistics.median(errors), max(errors)

    def range_holds(self, model_class: str) -> int:
        """How many of `model_class`'s configurations its range holds every run of."""
        low, high = self.range_for(model_class)
        runs = _run_residuals(self.cross_source, model_class).values()
        return sum(all(low <= r <= high for r in rs) for rs in runs)

    def source_line(self, model_class: str) -> str:
        errors = self.class_errors(model_class)
        measured = (
            f"leave-one-publisher-out error over {errors[0]} {model_class} configurations: "
            f"median {errors[1]:.0%}, worst {errors[2]:.0%}; the range holds every run of "
            f"{self.range_holds(model_class)} of them"
            if errors
            else f"no {model_class} configuration predicted without its publisher"
        )
        return (
            f"op-by-op model (compute or memory per op) on {len(self.sources)} publishers' "
            f"CNN, encoder and U-Net runs ({measured})"
        )


_FUSION_WHAT = {
    "xla": "an XLA-compiled (TPU) CNN, encoder or U-Net",
    "graph": "a fused-kernel GPU framework",
}


# Factors on `u` for kinds of convolution a chip runs below its other matrix work.
_CONVOLUTION_TERMS = ("conv3d:tpu", "layout:channels_first")


def _convolution_terms(traffic: OpTraffic, fusion: str) -> list[str]:
    """The convolution factors a step's figure uses: 3-D convolutions on a TPU (every TPU
    step is XLA-fused; the one published 3-D U-Net there ran at a seventh of an A100's rate,
    where 2-D CNNs run at par) and channels-first ones, PyTorch's default, on a GPU, whose
    tensor cores work channels-last (timm ran the same models both ways: 0.68-0.83x; a TPU's
    compiler picks its own layout). docs/forecast.md has both."""
    terms = []
    if fusion == "xla" and traffic.has_volumetric:
        terms.append("conv3d:tpu")
    if fusion != "xla" and traffic.has_channels_first:
        terms.append("layout:channels_first")
    return terms


def _class_factor(model_class: str, traffic: OpTraffic) -> str:
    """The class whose factor a step's convolutions take: its own, or a U-Net with
    attention's (`DIFFUSION`)."""
    if model_class == "unet" and _matmuls_as_encoder(model_class, traffic):
        return DIFFUSION
    return model_class


def _terms(model_class: str, fusion: str, precision: str, traffic: OpTraffic) -> list[str]:
    """The fitted terms a step's figure uses, named as the coefficients are."""
    terms = [f"class:{_class_factor(model_class, traffic)}"]
    if fusion != "eager":
        terms.append(f"fusion:{fusion}")
    if precision not in _SAME_AS_BF16:
        terms.append(f"precision:{precision}")
    if _matmuls_as_encoder(model_class, traffic):
        terms.append("class:encoder")
    if traffic.has_depthwise:
        terms.append("depthwise")
    return terms + _convolution_terms(traffic, fusion)


def _matmuls_as_encoder(model_class: str, traffic: OpTraffic) -> bool:
    """Whether a step's figure uses the encoders' factor: a CNN's or U-Net's with matmuls and
    attention doing `MATMUL_IN_CONVOLUTIONAL` of its matrix FLOPs or more."""
    return model_class in _CONVOLUTIONAL and traffic.matmul_share >= MATMUL_IN_CONVOLUTIONAL


def _term_what(term: str) -> str:
    kind, _, value = term.partition(":")
    if kind == "class":
        return "U-Nets with attention" if value == DIFFUSION else f"the {value} factor"
    if kind == "fusion":
        return _FUSION_WHAT[value]
    if kind == "precision":
        return f"{value} steps"
    if kind == "conv3d":
        return "3-D convolutions on a TPU"
    if kind == "layout":
        return "channels-first convolutions on a GPU"
    return "depthwise convolutions"


def _single_publisher_terms(cases: Sequence[_Case]) -> dict[str, str]:
    """Each fitted term that one publisher's runs alone calibrate, with that publisher."""
    publishers: dict[str, set[str]] = defaultdict(set)
    for c in cases:
        fusion = fusion_group(c.run.framework, c.chip.kind)
        for term in _terms(c.run.model_class, fusion, c.run.precision, c.traffic):
            publishers[term].add(c.run.source_group)
    return {t: next(iter(p)) for t, p in sorted(publishers.items()) if len(p) == 1}


def _seconds(
    c: Mapping[str, float],
    traffic: OpTraffic,
    peak: float,
    bandwidth: float,
    base_utilisation: float,
    model_class: str,
    fusion: str,
    precision: str,
) -> tuple[float, float]:
    precision_factor = math.exp(c.get(f"precision:{precision}", 0.0))
    u = base_utilisation * math.exp(c.get(f"class:{_class_factor(model_class, traffic)}", 0.0))
    for term in _convolution_terms(traffic, fusion):
        u *= math.exp(c.get(term, 0.0))
    u = min(1.0, u * precision_factor)
    # A CNN's or U-Net's matmuls and attention run as an encoder's do (its class factor and
    # the convolution terms are its convolutions'): their share of the FLOPs at that rate.
    slow = 1.0
    if model_class in _CONVOLUTIONAL and traffic.matmul_share > 0:
        u_mm = base_utilisation * math.exp(c.get("class:encoder", 0.0)) * precision_factor
        slow += traffic.matmul_share * (u / min(1.0, u_mm) - 1.0)
    e = min(1.0, math.exp(c["bandwidth"]))
    e_dw = min(1.0, math.exp(c.get("depthwise", c["bandwidth"])))
    phi = 1.0 if fusion == "eager" else 1.0 / (1.0 + math.exp(-c.get(f"fusion:{fusion}", 0.0)))
    matrix = sum(max(f * slow / (peak * u), b / (bandwidth * e)) for _, f, b in traffic.matrix)
    rest = phi * traffic.other_bytes / (bandwidth * e) + traffic.depthwise_bytes / (
        bandwidth * e_dw
    )
    return matrix + rest, u / slow


def _cases(
    runs: Iterable[PublishedRun],
    traffic: Mapping[str, OpTraffic],
    catalogue: HardwareCatalogue,
) -> list[_Case]:
    runs = [r for r in runs if r.model_class in CLASSES]
    per_configuration = Counter(r.configuration for r in runs)
    cases = []
    for run in runs:
        batch = max(1, math.ceil(run.per_device_batch))
        key = traffic_key(run.model.key, batch, run.precision, run.memory_format)
        per_sample = traffic.get(key)
        if per_sample is None:
            raise ValueError(
                f"{TRAFFIC_TABLE.name}: no traffic for {run.id} "
                f"({key}); "
                "run benchmarks/figures_vs_published_models.py --write-traffic."
            )
        cases.append(
            _Case(
                run,
                catalogue.get(run.chip),
                per_sample.scaled(run.per_device_batch),
                run.per_device_batch / run.samples_per_s_per_chip,
                1.0 / per_configuration[run.configuration],
            )
        )
    return cases


def _names(cases: Sequence[_Case]) -> list[str]:
    names = ["bandwidth"]
    names += sorted({f"class:{_class_factor(c.run.model_class, c.traffic)}" for c in cases})
    if any(c.traffic.has_depthwise for c in cases):
        names.append("depthwise")
    names += sorted(
        {f"precision:{p}" for c in cases if (p := c.run.precision) not in _SAME_AS_BF16}
    )
    names += sorted(
        {
            f"fusion:{g}"
            for c in cases
            if (g := fusion_group(c.run.framework, c.chip.kind)) != "eager"
        }
    )
    used = {
        t
        for c in cases
        for t in _convolution_terms(c.traffic, fusion_group(c.run.framework, c.chip.kind))
    }
    return names + [t for t in _CONVOLUTION_TERMS if t in used]


def _fit(cases: Sequence[_Case], llm: UtilisationFit) -> dict[str, float]:
    """Levenberg-Marquardt on the weighted, ridge-penalised log-time residuals."""
    names = _names(cases)
    bases = []
    for case in cases:
        peak, _ = case.chip.peak_for(case.run.precision)
        base = llm.utilisation(case.chip, 0.0, framework=case.run.framework,
                               precision=case.run.precision)  # fmt: skip
        bases.append((peak or 0.0, base or 0.0))

    def prior(name: str, theta: Mapping[str, float]) -> float:
        return theta["bandwidth"] if name == "depthwise" else _PRIOR.get(name, 0.0)

    def residuals(theta: Mapping[str, float]) -> list[float]:
        out = []
        for case, (peak, base) in zip(cases, bases, strict=True):
            fusion = fusion_group(case.run.framework, case.chip.kind)
            t, _ = _seconds(theta, case.traffic, peak, case.chip.hbm_bandwidth, base,
                            case.run.model_class, fusion, case.run.precision)  # fmt: skip
            out.append(math.sqrt(case.weight) * math.log(t / case.seconds))
        for name in names:
            if name != "bandwidth":
                out.append(math.sqrt(RIDGE) * (theta[name] - prior(name, theta)))
        return out

    theta = {n: _PRIOR.get(n, 0.0) for n in names}
    if "depthwise" in theta:
        theta["depthwise"] = theta["bandwidth"]
    damping = 1e-2
    loss = sum(r * r for r in residuals(theta))
    for _ in range(100):
        r0 = residuals(theta)
        jac = []
        for n in names:
            moved = dict(theta)
            moved[n] += 1e-6
            jac.append([(a - b) / 1e-6 for a, b in zip(residuals(moved), r0, strict=True)])
        normal = [[sum(x * y for x, y in zip(ji, jj, strict=True)) for jj in jac] for ji in jac]
        grad = [sum(x * y for x, y in zip(ji, r0, strict=True)) for ji in jac]
        while True:
            a = [row[:] for row in normal]
            for i in range(len(names)):
                a[i][i] *= 1 + damping
                a[i][i] += 1e-12
            step = _solve(a, [-g for g in grad])
            trial = {n: theta[n] + s for n, s in zip(names, step, strict=True)}
            trial_loss = sum(r * r for r in residuals(trial))
            if trial_loss < loss:
                theta, damping = trial, max(damping / 3, 1e-7)
                improved = loss - trial_loss
                loss = trial_loss
                break
            damping *= 4
            if damping > 1e8:
                return theta
        if improved < 1e-12:
            break
    return theta


def _bare(cases: Sequence[_Case], llm: UtilisationFit) -> ClassFit:
    return ClassFit(
        coefficients=_fit(cases, llm),
        classes=frozenset(c.run.model_class for c in cases),
        fusions=frozenset(fusion_group(c.run.framework, c.chip.kind) for c in cases),
        depthwise=any(c.traffic.has_depthwise for c in cases),
        sources=tuple(sorted({c.run.source_group for c in cases})),
        precisions=frozenset(c.run.precision for c in cases),
    )


def _predicted(fit: ClassFit, case: _Case, llm: UtilisationFit) -> ClassError:
    run = case.run
    p = fit.predict(llm, case.chip, case.traffic, run.model_class, run.framework, run.precision)
    expected = None if p is None or not p.calibrated else run.per_device_batch / p.seconds
    return ClassError(run, expected, run.samples_per_s_per_chip)


def fit_classes(
    runs: Iterable[PublishedRun],
    traffic: Mapping[str, OpTraffic],
    catalogue: HardwareCatalogue,
    llm: UtilisationFit,
) -> ClassFit:
    """Fit on every run the step's own ops set the rate of; predict each publisher's runs
    (and its host-limited ones, `floors`) from a fit without it."""
    runs = list(runs)
    cases = _cases([r for r in runs if not r.limited_by], traffic, catalogue)
    limited = _cases([r for r in runs if r.limited_by], traffic, catalogue)
    full = _bare(cases, llm)
    cross: list[ClassError] = []
    floors: list[ClassError] = []
    for group in full.sources:
        others = [c for c in cases if c.run.source_group != group]
        if not others:
            continue
        fold = _bare(others, llm)
        cross.extend(_predicted(fold, c, llm) for c in cases if c.run.source_group == group)
        floors.extend(_predicted(fold, c, llm) for c in limited if c.run.source_group == group)
    classes = sorted({h.run.model_class for h in cross if h.error is not None})
    return replace(
        full,
        cross_source=tuple(cross),
        log_range=_range(list(_run_residuals(cross).values())),
        class_ranges={c: _range(list(_run_residuals(cross, c).values())) for c in classes},
        unchecked=_single_publisher_terms(cases),
        floors=tuple(floors),
    )


def _run_residuals(
    errors: Iterable[ClassError], model_class: str | None = None
) -> dict[tuple[object, ...], list[float]]:
    """Each configuration's runs' residuals, log(published rate / expected rate) (one GPU and
    eight apart are one configuration), of every class or of `model_class`."""
    out: dict[tuple[object, ...], list[float]] = defaultdict(list)
    for h in errors:
        if h.error is not None and model_class in (None, h.run.model_class):
            out[h.run.configuration].append(-math.log1p(h.error))
    return out


def _range(configurations: Sequence[Sequence[float]]) -> tuple[float, float]:
    """A log range that holds every run of at least the stated share of `configurations`
    (each its runs' residuals; `RANGE_QUANTILES`): each end the outer quantile of the
    configurations' extreme runs on its side, so that each end leaves out at most half of
    what the share does."""
    if not configurations:
        return (0.0, 0.0)
    low, high = RANGE_QUANTILES
    miss = (1.0 - (high - low)) / 2
    return (
        _outer_quantile([min(r) for r in configurations], miss),
        _outer_quantile([max(r) for r in configurations], 1.0 - miss),
    )


def fit_without_error(
    runs: Iterable[PublishedRun],
    traffic: Mapping[str, OpTraffic],
    catalogue: HardwareCatalogue,
    llm: UtilisationFit,
) -> ClassFit:
    """The fit on `runs` alone, its error not measured (one fold of `fit_classes`)."""
    return _bare(_cases([r for r in runs if not r.limited_by], traffic, catalogue), llm)


@functools.cache
def default_class_fit() -> ClassFit:
    """The fit on the shipped non-LLM runs (computed once per process)."""
    from .utilisation import default_fit

    return fit_classes(
        load_published_runs(MODELS_TABLE), load_traffic(), HardwareCatalogue.load(), default_fit()
    )


__all__ = [
    "CLASSES",
    "ClassError",
    "ClassFit",
    "ClassPrediction",
    "OpTraffic",
    "default_class_fit",
    "expected_class_step",
    "expected_step_by_op",
    "fit_classes",
    "fit_without_error",
    "fusion_group",
    "load_traffic",
    "traffic_key",
]


def expected_class_step(
    features: StepFeatures,
    chip: Chip,
    llm: UtilisationFit,
    model_class: str,
    framework: str,
    notes: Sequence[str],
    fit: ClassFit | None = None,
) -> ExpectedStep | None:
    """`expected_step` for a CNN, encoder or U-Net whose op-by-op traffic is known: the
    op-by-op figure with its cross-publisher range where every term of it is calibrated,
    else a bound (the roofline at peak) that says what is missing. None where the chip has
    no peak for the step's precision."""
    traffic = features.traffic
    peak, _ = chip.peak_for(features.precision)
    if traffic is None or not peak:
        return None
    fit = fit or default_class_fit()
    prediction = fit.predict(llm, chip, traffic, model_class, framework, features.precision)
    if prediction is None:
        return None
    bound = features.flops_per_chip / peak
    notes = list(notes)
    layout = fit.coefficients.get("layout:channels_first")
    if layout is not None and "layout:channels_first" in _convolution_terms(
        traffic, fusion_group(framework, chip.kind)
    ):
        notes.append(
            "convolutions channels-first (PyTorch's default): published GPU runs reach "
            f"{math.exp(layout):.2f}x of channels-last there (`model.to(memory_format="
            "torch.channels_last)` and channels-last inputs)"
        )
    if prediction.calibrated:
        seconds = max(prediction.seconds, bound)
        under, over = fit.range_for(model_class)
        low = seconds * math.exp(-over)
        high = seconds * math.exp(-under)
        kind = "expected"
        compute = sum(f for _, f, _ in traffic.matrix) / peak
        limited_by = "compute" if compute / prediction.utilisation >= seconds / 2 else "memory"
    else:
        seconds = low = high = bound
        kind, limited_by = "bound", "compute"
        notes.append(f"{prediction.why_not} calibrates a figure: shown as a bound")
    return ExpectedStep(
        seconds=seconds,
        low=max(low, bound),
        high=high,
        bound_seconds=bound,
        utilisation=bound / seconds if seconds else 0.0,
        limited_by=limited_by,
        calibrated=prediction.calibrated,
        source=fit.source_line(model_class),
        notes=tuple(notes),
        kind=kind,
        framework=features.framework or framework,
        precision=features.precision,
        peak_flops=peak,
        model_class=model_class,
    )


def expected_step_by_op(
    features: StepFeatures,
    chip: Chip,
    fit: UtilisationFit | None = None,
    *,
    utilisation: float | None = None,
) -> ExpectedStep | None:
    """`utilisation.expected_step`, with CNNs, encoders and U-Nets whose traffic is known
    costed op by op (`expected_class_step`); every other step, and any step whose
    utilisation was measured (`utilisation`), as the LLM fit costs it."""
    from .utilisation import default_fit

    llm = fit or default_fit()
    model_class = features.model_class or infer_model_class(features)
    if utilisation is None and features.traffic is not None and model_class in CLASSES:
        framework, note = llm.resolve_framework(features.framework or default_framework(chip.kind))
        by_op = expected_class_step(
            features, chip, llm, model_class, framework, [n for n in (note,) if n]
        )
        if by_op is not None:
            return by_op
    return expected_step(features, chip, llm, utilisation=utilisation)
