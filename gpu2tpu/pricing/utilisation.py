"""Expected step time: a model of the utilisation real training runs reach, fitted on the
published runs (`published_runs.toml`), with its error measured on sources the fit never saw.

A roofline, `max(FLOPs / peak, bytes / bandwidth)`, is the time at 100% of the chip; public
training runs reach 15-72% of peak by this project's FLOP count, and which share depends on
the chip, the framework, the model and its scale. The chip executes the model's FLOPs plus
those its activation recomputation runs again (the *hardware* FLOPs: a compiled or profiled
step counts them; each published run states its recomputation), and it runs the attention
products (QK^T, PV: flash kernels) at a lower rate than the dense matmuls. The expected time
is the matmul part at the predicted utilisation u plus the attention part at `r` times it:

    expected = (hardware FLOPs - attention FLOPs + attention FLOPs / r) / (peak[precision] x u)

    log u = b0 + b_gpu [GPU] + b_bal log2(peak / HBM bandwidth / 250 FLOP/B)
            + g_size log10(parameters / 10B) + g_dcn log2(slices)
            + framework[f] + model_class[c] + precision[p] + chip[k]

with one attention rate `r` for every chip, fitted with the rest (`ATTENTION_RATE_BOUNDS`).

by weighted ridge regression: each configuration (one source's model on one chip at one
sequence, precision and framework) weighs as much as any other however many chip counts it
was published at, and the per-level effects (framework, class, precision, chip) and the
scale terms are shrunk towards zero (`RIDGE`), so that a level seen in one source only moves
the prediction as far as that source supports. The chip's machine balance (its FLOPs per byte
of HBM bandwidth) carries what one chip's runs teach about another.

How sure: every source is left out in turn, the model refitted on the others and the left-out
source's runs predicted (leave-one-source-out, `UtilisationFit.cross_source`); the error is
reported per configuration, and the range printed with every expected figure is the 10th to
90th percentile of those cross-source errors (it holds 80% of them by construction; the
benchmark prints how many it holds). The shipped fit uses every run.

Where nothing calibrates a figure there is no expected time, only a bound: a model class or a
precision the table has no run of, a step whose compiled HBM traffic or collectives take longer
than the expected compute. The profiler's unfused byte count is never used as a floor.

Pure: `fit_utilisation(runs, catalogue)` decides from its arguments; `default_fit()` reads the
shipped table and catalogue once.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from .catalogue import Chip, HardwareCatalogue
from .op_traffic import OpTraffic
from .published import FRAMEWORKS, MODEL_CLASSES, PRECISIONS, PublishedRun, load_published_runs

# The range: this share of cross-source predictions falls inside it.
RANGE_QUANTILES = (0.1, 0.9)
# Ridge penalty on every effect but the intercept, the GPU term, the machine balance and the
# attention slope, in units of configurations (the fit's weights sum to the configurations).
# Chosen once among RIDGE_CANDIDATES by the cross-source error, which thereby saw every source;
# `nested_cross_source` measures what that choice flatters (docs/forecast.md has the figures).
RIDGE = 1.0
# The penalties `nested_cross_source` chooses among inside each fold.
RIDGE_CANDIDATES = (0.3, 1.0, 3.0)
# The attention rate r (attention products per second over dense-matmul FLOPs per second) is
# fitted within these bounds: an attention kernel does the same products plus its softmax on
# the vector units, so it runs no faster than the dense matmuls.
ATTENTION_RATE_BOUNDS = (0.05, 1.0)
# Machine balance the balance term is centred on (FLOP per byte of HBM bandwidth).
BALANCE_CENTRE = 250.0
# Matmul shares below this are outside what the LLM runs cover (they are ~99% matmuls).
MATMUL_SHARE_CALIBRATED = 0.9
# The tuned framework shown as the ceiling beside a PyTorch figure, per kind of chip.
CEILING_FRAMEWORK = {"tpu": "jax", "gpu": "megatron"}
# What a framework with no published run of its own is costed as (and the figure says so):
# TorchTPU and torchax run PyTorch programs through XLA, as PyTorch/XLA does.
FRAMEWORK_FALLBACK = {"torchtpu": "pytorch_xla", "torchax": "pytorch_xla"}
# The backend names of gpu2tpu.backends, as frameworks.
BACKEND_FRAMEWORK = {"tpu": "torchtpu", "xla": "pytorch_xla", "jax": "torchax", "cuda": "pytorch"}

_NUMERIC = ("gpu", "balance", "size", "dcn")
_PENALISED_NUMERIC = ("size", "dcn")


@dataclass(frozen=True)
class StepFeatures:
    """What a compile (or a profiled step) knows about one training step on one target.

    `flops_per_chip` is the step's FLOPs per chip as the chip executes them (compiled or
    counted: activation recomputation included); `attention_flops_per_chip` the part of them
    in attention products (QK^T, PV; None: unknown, taken as none). `attention` says how those are counted: "causal" (half the
    score matrix, as flash kernels compute) or "full" (the whole matrix, as a plain compiled
    SDPA does): the fit counts causal attention, so full attention is halved first.
    `bytes_per_chip` is the step's HBM traffic: "compiled" (XLA's fused program: a floor at
    full bandwidth) or "unfused" (the profiler's per-op count: never a floor).
    `collective_seconds` is the step's collectives on the interconnect as the forecast models
    them; `matmul_share` and `conv_share` the shares of dot/convolution FLOPs and of
    convolution FLOPs. `parameters` (matmul weights) and `slices` (slices over the
    data-centre network) are the scale inputs; `model_class`, `precision` and `framework` say
    what kind of step it is and what runs it (None: inferred / the default for the chip).
    `traffic` is the step's FLOPs and unfused bytes op by op (the profiler's count): with
    it `class_fit.expected_step_by_op` costs CNNs, encoders and U-Nets op by op; this
    function, the LLM fit, ignores it.
    """

    chip: str
    chips: int
    flops_per_chip: float
    tokens_per_chip: float | None = None
    attention_flops_per_chip: float | None = None
    attention: str = "causal"
    matmul_share: float | None = None
    bytes_per_chip: float | None = None
    collective_seconds: float | None = None
    parameters: int | None = None
    conv_share: float | None = None
    bytes_kind: str = "compiled"
    samples_per_chip: float | None = None
    slices: int = 1
    model_class: str | None = None
    precision: str = "bf16"
    framework: str | None = None
    traffic: OpTraffic | None = None

    @property
    def model_flops_per_chip(self) -> float:
        """FLOPs per chip with attention counted causally (the fit's count)."""
        if self.attention == "full" and self.attention_flops_per_chip:
            return self.flops_per_chip - self.attention_flops_per_chip / 2
        return self.flops_per_chip

    @property
    def attention_share(self) -> float | None:
        if self.attention_flops_per_chip is None or self.flops_per_chip <= 0:
            return None
        attention = self.attention_flops_per_chip
        if self.attention == "full":
            attention /= 2
        return min(1.0, max(0.0, attention / self.model_flops_per_chip))


def infer_model_class(features: StepFeatures) -> str:
    """The model class a step most likely is, from what its FLOP count knows: convolutions
    over half the FLOPs make a CNN, attention FLOPs a decoder (an encoder's bidirectional
    attention looks the same to a FLOP count: pass `model_class="encoder"` for one), anything
    else an LLM-like matmul step. (U-Nets and small steps are named by the caller.)"""
    if features.conv_share is not None and features.conv_share >= 0.5:
        return "cnn"
    return "llm_decoder"


def default_framework(kind: str, backend: str | None = None) -> str:
    """The framework a figure is for when the caller names none: the backend `%%tpu` would
    use (`backend`, a gpu2tpu backend name), else TorchTPU on a TPU (costed as PyTorch/XLA
    while no TorchTPU run is published), and PyTorch on a GPU."""
    if backend in BACKEND_FRAMEWORK and (kind == "tpu") == (backend != "cuda"):
        return BACKEND_FRAMEWORK[backend]
    return "torchtpu" if kind == "tpu" else "pytorch"


@dataclass(frozen=True)
class ExpectedStep:
    """An expected step time with its range, the bound beside it, and where it comes from.

    `kind` is "expected" (a prediction with its range `low`-`high`, which held 80% of the
    cross-source predictions) or "bound" (nothing calibrates a figure: `seconds` is a lower
    bound, `low == high == seconds`, and views show it as ">= x");
    `bound_seconds` the roofline at 100% of peak; `utilisation` the predicted share of
    `peak_flops`; `limited_by` "compute", "memory" or "interconnect"; `framework` the
    framework the figure is for and `ceiling_seconds` what the tuned framework reaches on the
    chip where it differs; `precision` and `model_class` what was costed; `calibrated` is
    False where the figure rests on a prior (no run of the chip, the framework or the class).
    """

    seconds: float
    low: float
    high: float
    bound_seconds: float
    utilisation: float
    limited_by: str
    calibrated: bool
    source: str
    notes: tuple[str, ...] = ()
    kind: str = "expected"
    framework: str = ""
    ceiling_seconds: float | None = None
    precision: str = "bf16"
    peak_flops: float = 0.0
    model_class: str = "llm_decoder"


@dataclass(frozen=True)
class HeldOutError:
    """One run predicted by a fit that never saw it: expected against published."""

    run: PublishedRun
    expected_tokens_per_s: float
    published_tokens_per_s: float

    @property
    def error(self) -> float:
        """Signed relative error of the expected figure (+0.1: 10% too fast)."""
        return self.expected_tokens_per_s / self.published_tokens_per_s - 1


@dataclass(frozen=True)
class _Point:
    """What the model reads of one step: the chip and the categorical and numeric inputs."""

    chip: Chip
    peak: float
    framework: str
    model_class: str
    precision: str
    attention_share: float
    parameters: float | None
    slices: int


def _point_of_run(run: PublishedRun, catalogue: HardwareCatalogue) -> _Point | None:
    chip = catalogue.get(run.chip)
    peak, _ = chip.peak_for(run.precision)
    if not peak:
        return None
    return _Point(
        chip,
        peak,
        run.framework,
        run.model_class,
        run.precision,
        run.hardware_attention_share,
        run.parameters,
        run.slices,
    )


@dataclass(frozen=True)
class UtilisationFit:
    """The fitted model: named coefficients, the levels it saw, and its measured error."""

    coefficients: Mapping[str, float]
    fitted_runs: int
    frameworks: frozenset[str]
    model_classes: frozenset[str]
    precisions: frozenset[str]
    chips: frozenset[str]
    cross_source: tuple[HeldOutError, ...] = ()
    held_out: tuple[HeldOutError, ...] = ()
    log_range: tuple[float, float] = (0.0, 0.0)
    sources: tuple[str, ...] = field(default=())
    max_slices: int = 1
    size_range: tuple[float, float] = (0.0, math.inf)

    # -- predicting ---------------------------------------------------------------------------

    def resolve_framework(self, framework: str) -> tuple[str, str]:
        """The framework the fit costs `framework` as, and a note when it is not its own."""
        if framework in self.frameworks:
            return framework, ""
        fallback = FRAMEWORK_FALLBACK.get(framework)
        if fallback in self.frameworks:
            return fallback, (
                f"no published {framework} training run: costed as {fallback}, "
                "which runs PyTorch programs through XLA the same way"
            )
        return framework, f"no published {framework} training run: its effect is taken as none"

    @property
    def attention_rate(self) -> float:
        """The attention products' rate as a share of the dense matmuls' (fitted)."""
        return self.coefficients.get("attention_rate", 1.0)

    def slowdown(self, attention_share: float) -> float:
        """How much longer a step with this share of its FLOPs in attention takes than one
        of pure matmuls with as many FLOPs."""
        return 1.0 + max(0.0, attention_share) * (1.0 / self.attention_rate - 1.0)

    def log_utilisation(self, point: _Point) -> float:
        """Log of the dense-matmul utilisation predicted for such a step. The scale terms are
        not extrapolated: slices beyond the most any fitted run used count as that many, and a
        model size outside the fitted runs' counts as the nearest end of their range."""
        c = self.coefficients
        if point.slices > self.max_slices:
            point = replace(point, slices=self.max_slices)
        if point.parameters:
            low, high = self.size_range
            point = replace(point, parameters=min(high, max(low, point.parameters)))
        value = c["intercept"]
        for name, x in _numeric(point).items():
            value += c.get(name, 0.0) * x
        for prefix, level in _levels(point).items():
            value += c.get(f"{prefix}:{level}", 0.0)
        return value

    def utilisation(
        self,
        chip: Chip,
        attention_share: float | None,
        *,
        framework: str | None = None,
        model_class: str = "llm_decoder",
        precision: str = "bf16",
        parameters: float | None = None,
        slices: int = 1,
    ) -> float | None:
        """Predicted share of `chip`'s peak (for `precision`) the whole step reaches, attention
        included, or None where the chip has no such peak or is not a TPU or GPU."""
        peak, _ = chip.peak_for(precision) if chip.kind in ("tpu", "gpu") else (None, "")
        if not peak:
            return None
        framework = self.resolve_framework(framework or default_framework(chip.kind))[0]
        point = _Point(
            chip,
            peak,
            framework,
            model_class,
            precision,
            attention_share or 0.0,
            parameters,
            slices,
        )
        matmul = min(1.0, math.exp(self.log_utilisation(point)))
        return matmul / self.slowdown(point.attention_share)

    # -- its error ----------------------------------------------------------------------------

    def configuration_errors(self, which: str = "cross_source") -> dict[tuple[object, ...], float]:
        """One signed error per configuration: the geometric mean of its runs' errors."""
        return configuration_errors(self.cross_source if which == "cross_source" else self.held_out)

    @property
    def median_error(self) -> float:
        """Median absolute cross-source error over configurations."""
        return statistics.median(abs(e) for e in self.configuration_errors().values())

    @property
    def worst_error(self) -> float:
        return max(abs(e) for e in self.configuration_errors().values())

    def source_line(self) -> str:
        """One line: where expected figures come from and how sure they are."""
        configurations = len(self.configuration_errors())
        return (
            f"Expected = FLOPs / (peak x utilisation); utilisation fitted on {self.fitted_runs} "
            f"published training runs from {len(self.sources)} sources; predicting each source "
            f"from the others, its median error is {self.median_error:.0%} (worst "
            f"{self.worst_error:.0%}) over {configurations} configurations; ranges hold "
            f"{RANGE_QUANTILES[1] - RANGE_QUANTILES[0]:.0%} of those predictions. A bound "
            "(>=) is the time at 100% of peak."
        )


def configuration_errors(rows: Iterable[HeldOutError]) -> dict[tuple[object, ...], float]:
    """One signed error per configuration: the geometric mean of its runs' errors."""
    grouped: dict[tuple[object, ...], list[float]] = defaultdict(list)
    for h in rows:
        grouped[h.run.configuration].append(math.log1p(h.error))
    return {key: math.expm1(statistics.fmean(v)) for key, v in grouped.items()}


def _numeric(point: _Point) -> dict[str, float]:
    balance = point.peak / point.chip.hbm_bandwidth if point.chip.hbm_bandwidth else BALANCE_CENTRE
    return {
        "gpu": 1.0 if point.chip.kind == "gpu" else 0.0,
        "balance": math.log2(balance / BALANCE_CENTRE),
        "size": math.log10(point.parameters / 1e10) if point.parameters else 0.0,
        "dcn": math.log2(max(1, point.slices)),
    }


def _levels(point: _Point) -> dict[str, str]:
    return {
        "framework": point.framework,
        "class": point.model_class,
        "precision": point.precision,
        "chip": point.chip.key,
    }


# Reference levels: absorbed by the intercept, never penalised.
_REFERENCE = {"framework": "jax", "class": "llm_decoder", "precision": "bf16"}


def _solve(matrix: list[list[float]], vector: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (the normal equations are small)."""
    n = len(vector)
    a = [row[:] + [vector[i]] for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-12:
            raise ValueError("the published runs do not determine the fit (a singular system).")
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(n):
            if r != col:
                factor = a[r][col] / a[col][col]
                a[r] = [x - factor * y for x, y in zip(a[r], a[col], strict=True)]
    return [a[i][n] / a[i][i] for i in range(n)]


def _outer_quantile(values: Sequence[float], q: float) -> float:
    """The order statistic at or beyond the q-quantile, away from the median: a range
    between two such quantiles holds at least its stated share of `values`."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    return ordered[math.floor(pos) if q < 0.5 else math.ceil(pos)]


@dataclass(frozen=True)
class _Design:
    """The weighted ridge regression's fixed part: the regressors do not depend on the
    attention rate, only the targets do."""

    names: tuple[str, ...]
    rows: tuple[tuple[tuple[tuple[int, float], ...], float, float, float], ...]
    normal: tuple[tuple[float, ...], ...]
    penalties: tuple[tuple[int, float], ...]  # (term, its ridge penalty)


# A ridge penalty: one for every penalised term, or one per group of terms ("framework",
# "chip", "class", "precision", "size", "dcn"), RIDGE for a group not named.
Ridge = float | Mapping[str, float]


def _penalty(ridge: Ridge, name: str) -> float:
    if isinstance(ridge, Mapping):
        return ridge.get(name.split(":")[0], RIDGE)
    return ridge


def _design(points: Sequence[tuple[_Point, float, float]], ridge: Ridge) -> _Design:
    names = ["intercept", *_NUMERIC]
    for point, _, _ in points:
        for prefix, level in _levels(point).items():
            name = f"{prefix}:{level}"
            if _REFERENCE.get(prefix) != level and name not in names:
                names.append(name)
    index = {n: i for i, n in enumerate(names)}
    normal = [[0.0] * len(names) for _ in names]
    rows = []
    for point, overall, weight in points:
        x = dict.fromkeys([0], 1.0)
        for name, value in _numeric(point).items():
            x[index[name]] = value
        for prefix, level in _levels(point).items():
            if f"{prefix}:{level}" in index:
                x[index[f"{prefix}:{level}"]] = 1.0
        nonzero = tuple((i, v) for i, v in x.items() if v)
        rows.append((nonzero, overall, point.attention_share, weight))
        for i, vi in nonzero:
            for j, vj in nonzero:
                normal[i][j] += weight * vi * vj
    penalties = tuple(
        (i, _penalty(ridge, n)) for n, i in index.items() if ":" in n or n in _PENALISED_NUMERIC
    )
    for i, penalty in penalties:
        normal[i][i] += penalty
    return _Design(tuple(names), tuple(rows), tuple(tuple(r) for r in normal), penalties)


def _coefficients(design: _Design, rate: float) -> tuple[list[float], float]:
    """Weighted ridge regression of log matmul utilisation (each step's overall utilisation
    with its attention part taken at `rate`); the solution and its penalised loss."""
    rhs = [0.0] * len(design.names)
    targets = []
    for nonzero, overall, share, weight in design.rows:
        target = overall + math.log(1.0 + share * (1.0 / rate - 1.0))
        targets.append(target)
        for i, v in nonzero:
            rhs[i] += weight * v * target
    solution = _solve([list(r) for r in design.normal], rhs)
    loss = sum(
        w * (y - sum(solution[i] * v for i, v in nz)) ** 2
        for (nz, _, _, w), y in zip(design.rows, targets, strict=True)
    )
    return solution, loss + sum(p * solution[i] ** 2 for i, p in design.penalties)


def _fit_coefficients(
    points: Sequence[tuple[_Point, float, float]], ridge: Ridge
) -> dict[str, float]:
    """The coefficients and the attention rate that minimise the penalised loss (the rate by
    golden-section search on its logarithm, within `ATTENTION_RATE_BOUNDS`)."""
    design = _design(points, ridge)

    def loss(log_rate: float) -> float:
        return _coefficients(design, math.exp(log_rate))[1]

    low, high = (math.log(b) for b in ATTENTION_RATE_BOUNDS)
    golden = (math.sqrt(5) - 1) / 2
    a, b = high - golden * (high - low), low + golden * (high - low)
    fa, fb = loss(a), loss(b)
    for _ in range(24):  # the bracket shrinks to 1e-5 of its width
        if fa <= fb:
            high, b, fb = b, a, fa
            a = high - golden * (high - low)
            fa = loss(a)
        else:
            low, a, fa = a, b, fb
            b = low + golden * (high - low)
            fb = loss(b)
    bounds = [math.log(v) for v in ATTENTION_RATE_BOUNDS]
    log_rate = min([(a + b) / 2, *bounds], key=loss)
    rate = math.exp(log_rate)
    coefficients = dict(zip(design.names, _coefficients(design, rate)[0], strict=True))
    coefficients["attention_rate"] = rate
    return coefficients


def _training_points(
    runs: Sequence[PublishedRun], catalogue: HardwareCatalogue
) -> list[tuple[_Point, float, float]]:
    per_configuration = Counter(r.configuration for r in runs)
    points = []
    for run in runs:
        point = _point_of_run(run, catalogue)
        if point is None:
            continue
        overall = run.samples_per_s_per_chip * run.hardware_flops_per_sample / point.peak
        points.append((point, math.log(overall), 1.0 / per_configuration[run.configuration]))
    return points


def _bare_fit(
    runs: Sequence[PublishedRun], catalogue: HardwareCatalogue, ridge: Ridge = RIDGE
) -> UtilisationFit:
    points = _training_points(runs, catalogue)
    if not points:
        raise ValueError("no published run can be fitted: the table is empty.")
    sizes = [p.parameters for p, _, _ in points if p.parameters]
    return UtilisationFit(
        coefficients=_fit_coefficients(points, ridge),
        fitted_runs=len(points),
        frameworks=frozenset(p.framework for p, _, _ in points),
        model_classes=frozenset(p.model_class for p, _, _ in points),
        precisions=frozenset(p.precision for p, _, _ in points),
        chips=frozenset(p.chip.key for p, _, _ in points),
        sources=tuple(sorted({r.source_group for r in runs})),
        max_slices=max(p.slices for p, _, _ in points),
        size_range=(min(sizes), max(sizes)) if sizes else (0.0, math.inf),
    )


def _predict(fit: UtilisationFit, run: PublishedRun, catalogue: HardwareCatalogue) -> HeldOutError:
    point = _point_of_run(run, catalogue)
    assert point is not None  # only runs with a peak are predicted
    point = replace(point, framework=fit.resolve_framework(run.framework)[0])
    matmul = min(1.0, math.exp(fit.log_utilisation(point)))
    utilisation = matmul / fit.slowdown(point.attention_share)
    samples = utilisation * point.peak / run.hardware_flops_per_sample
    return HeldOutError(run, samples * run.sequence, run.tokens_per_s_per_chip)


def leave_one_source_out(
    runs: Sequence[PublishedRun], catalogue: HardwareCatalogue, ridge: Ridge = RIDGE
) -> tuple[HeldOutError, ...]:
    """Every run predicted by a fit on the other sources' runs."""
    out: list[HeldOutError] = []
    for group in sorted({r.source_group for r in runs}):
        others = [r for r in runs if r.source_group != group]
        if not others:
            continue
        fit = _bare_fit(others, catalogue, ridge)
        out.extend(
            _predict(fit, r, catalogue)
            for r in runs
            if r.source_group == group and _point_of_run(r, catalogue) is not None
        )
    return tuple(out)


def nested_cross_source(
    runs: Sequence[PublishedRun],
    catalogue: HardwareCatalogue,
    candidates: Sequence[float] = RIDGE_CANDIDATES,
    group: str | None = None,
) -> tuple[tuple[HeldOutError, ...], dict[str, float]]:
    """Leave-one-source-out with the ridge penalty chosen inside each fold: for each source,
    the candidate whose own leave-one-source-out error (median over configurations) on the
    other sources is least, then that source predicted by a fit on the others with it. The
    shipped RIDGE was chosen by the plain cross-source error, which therefore saw every source;
    this error did not, and tells how much that choice flatters it. With `group` ("framework",
    ...), the candidates are that group's penalty and the others keep RIDGE. Returns the
    predictions and the penalty each source was predicted with."""
    out: list[HeldOutError] = []
    chosen: dict[str, float] = {}

    def penalty(value: float) -> Ridge:
        return value if group is None else {group: value}

    for source in sorted({r.source_group for r in runs}):
        others = [r for r in runs if r.source_group != source]
        if len({r.source_group for r in others}) < 2:
            continue

        def inner_error(value: float, others: Sequence[PublishedRun] = others) -> float:
            errors = configuration_errors(leave_one_source_out(others, catalogue, penalty(value)))
            return statistics.median(abs(e) for e in errors.values())

        value = min(candidates, key=inner_error)
        chosen[source] = value
        fit = _bare_fit(others, catalogue, penalty(value))
        out.extend(
            _predict(fit, r, catalogue)
            for r in runs
            if r.source_group == source and _point_of_run(r, catalogue) is not None
        )
    return tuple(out), chosen


def fit_utilisation(runs: Iterable[PublishedRun], catalogue: HardwareCatalogue) -> UtilisationFit:
    """Fit on every run; measure the error leave-one-source-out and on the held-out split
    (fitted without the configurations marked `held_out`)."""
    runs = list(runs)
    full = _bare_fit(runs, catalogue)
    cross = leave_one_source_out(runs, catalogue)
    if not cross:
        raise ValueError("one source only: the cross-source error is unknown.")
    train = [r for r in runs if not r.held_out]
    held: tuple[HeldOutError, ...] = ()
    if train and len(train) < len(runs):
        split = _bare_fit(train, catalogue)
        held = tuple(
            _predict(split, r, catalogue)
            for r in runs
            if r.held_out and _point_of_run(r, catalogue) is not None
        )
    interim = UtilisationFit(
        coefficients=full.coefficients,
        fitted_runs=full.fitted_runs,
        frameworks=full.frameworks,
        model_classes=full.model_classes,
        precisions=full.precisions,
        chips=full.chips,
        cross_source=cross,
        held_out=held,
        sources=full.sources,
        max_slices=full.max_slices,
        size_range=full.size_range,
    )
    residuals = [-math.log1p(e) for e in interim.configuration_errors().values()]
    return UtilisationFit(
        coefficients=full.coefficients,
        fitted_runs=full.fitted_runs,
        frameworks=full.frameworks,
        model_classes=full.model_classes,
        precisions=full.precisions,
        chips=full.chips,
        cross_source=cross,
        held_out=held,
        log_range=(
            _outer_quantile(residuals, RANGE_QUANTILES[0]),
            _outer_quantile(residuals, RANGE_QUANTILES[1]),
        ),
        sources=full.sources,
        max_slices=full.max_slices,
        size_range=full.size_range,
    )


@functools.cache
def default_fit() -> UtilisationFit:
    """The fit on the shipped table and catalogue (computed once per process)."""
    return fit_utilisation(load_published_runs(), HardwareCatalogue.load())


def expected_step(
    features: StepFeatures,
    chip: Chip,
    fit: UtilisationFit | None = None,
    *,
    utilisation: float | None = None,
) -> ExpectedStep | None:
    """The expected step time of `features` on `chip`, or a labelled bound, or None where
    nothing can be said (a chip without a peak for the step's precision, or not a TPU or
    GPU). `utilisation` replaces the fit's prediction when a measurement gives a better one
    (`scaled_utilisation`); the range stays the fit's."""
    fit = fit or default_fit()
    if chip.kind not in ("tpu", "gpu") or features.flops_per_chip <= 0:
        return None
    peak, peak_what = chip.peak_for(features.precision)
    if not peak:
        return None
    asked = features.framework or default_framework(chip.kind)
    framework, framework_note = fit.resolve_framework(asked)
    model_class = features.model_class or infer_model_class(features)
    notes = [n for n in (framework_note,) if n]
    if features.precision != "bf16":
        notes.append(f"costed at the {peak_what} peak ({peak / 1e12:,.0f} TFLOP/s)")
    point = _Point(
        chip,
        peak,
        framework,
        model_class,
        features.precision,
        features.attention_share or 0.0,
        features.parameters,
        features.slices,
    )
    matmul = min(1.0, math.exp(fit.log_utilisation(point)))
    if utilisation is None:
        utilisation = matmul / fit.slowdown(point.attention_share)
    compute = features.model_flops_per_chip / peak
    memory = (features.bytes_per_chip or 0.0) / chip.hbm_bandwidth if chip.hbm_bandwidth else 0.0
    bound = max(features.flops_per_chip / peak, memory)
    seconds = compute / utilisation
    limited_by, kind = "compute", "expected"
    uncalibrated: list[str] = []
    if chip.key not in fit.chips:
        uncalibrated.append(
            f"no published run on {chip.name}: its utilisation is predicted from its machine balance"
        )
    if features.slices > fit.max_slices:
        notes.append(
            f"{features.slices} slices over the data-centre network: no published run used more "
            f"than {fit.max_slices}, so the network's cost is taken as at {fit.max_slices}"
        )
    if features.attention_share is None and model_class == "llm_decoder":
        notes.append(
            "the step's attention FLOPs are unknown, so they are taken as none: long sequences "
            "run slower than this"
        )
    if model_class not in fit.model_classes:
        kind = "bound"
        notes.append(f"no published {model_class} run calibrates a figure: shown as a bound")
    if features.precision not in fit.precisions:
        kind = "bound"
        notes.append(f"no published {features.precision} run calibrates a figure: shown as a bound")
    outside = (
        model_class == "llm_decoder"
        and features.matmul_share is not None
        and features.matmul_share < MATMUL_SHARE_CALIBRATED
    )
    if outside:
        notes.append(
            f"only {features.matmul_share:.0%} of the FLOPs are matmuls; the LLM runs are ~99% "
            "matmuls, so this is outside what the fit covers"
        )
    if features.bytes_kind == "compiled" and memory > seconds:
        seconds, limited_by, kind = memory, "memory", "bound"
        notes.append(
            "memory-bound: the compiled HBM traffic at full bandwidth takes longer than the "
            "expected compute, and no published run calibrates that: a bound"
        )
    if features.collective_seconds and features.collective_seconds > seconds:
        seconds, limited_by, kind = features.collective_seconds, "interconnect", "bound"
        notes.append(
            "the collectives take longer than the compute: their time on the interconnect, "
            "which no published run calibrates, is a bound"
        )
    if kind == "bound":
        seconds = max(seconds if limited_by != "compute" else bound, bound)
        low = high = seconds
    else:
        low = seconds * math.exp(-fit.log_range[1])
        high = seconds * math.exp(-fit.log_range[0])
    ceiling = None
    tuned = CEILING_FRAMEWORK.get(chip.kind)
    if kind == "expected" and tuned and tuned != framework and tuned in fit.frameworks:
        tuned_matmul = min(1.0, math.exp(fit.log_utilisation(replace(point, framework=tuned))))
        tuned_u = tuned_matmul / fit.slowdown(point.attention_share)
        if tuned_u > utilisation * 1.02:
            ceiling = compute / tuned_u
    return ExpectedStep(
        seconds=seconds,
        low=low,
        high=high,
        bound_seconds=bound,
        utilisation=utilisation,
        limited_by=limited_by,
        calibrated=kind == "expected" and not uncalibrated and not framework_note and not outside,
        source=fit.source_line(),
        notes=tuple(notes + uncalibrated),
        kind=kind,
        framework=asked,
        ceiling_seconds=ceiling,
        precision=features.precision,
        peak_flops=peak,
        model_class=model_class,
    )


def scaled_utilisation(
    measured_utilisation: float,
    measured_chip: Chip,
    target_chip: Chip,
    attention_share: float | None,
    fit: UtilisationFit | None = None,
) -> float | None:
    """A target's utilisation from a measured one on the same step: the measurement times
    the fit's ratio between the two chips (what the step shares cancels). None when the
    measured chip has no prediction (the host CPU): then the fit alone."""
    fit = fit or default_fit()
    here = fit.utilisation(measured_chip, attention_share)
    there = fit.utilisation(target_chip, attention_share)
    if here is None or there is None or measured_utilisation <= 0:
        return None
    return min(1.0, measured_utilisation * there / here)


__all__ = [
    "FRAMEWORKS",
    "MODEL_CLASSES",
    "PRECISIONS",
    "ExpectedStep",
    "HeldOutError",
    "StepFeatures",
    "UtilisationFit",
    "default_fit",
    "default_framework",
    "expected_step",
    "fit_utilisation",
    "infer_model_class",
    "leave_one_source_out",
    "scaled_utilisation",
]
