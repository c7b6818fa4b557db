"""Expected step time: a model of the utilisation real training runs reach, fitted on the
published runs (`published_runs.toml`), with its error on the runs kept out of the fit.

A roofline, `max(FLOPs / peak, bytes / bandwidth)`, is the time at 100% of the chip; tuned
public runs of dense LLMs reach 15-71% of peak by this project's FLOP count. The expected
step time is

    expected = FLOPs per chip / (peak x predicted utilisation)

and the utilisation is predicted as

    log(utilisation) = base[chip] - slope x sqrt(attention share of the FLOPs)

fitted by least squares on the runs that are not held out: one base per chip (what tuned
runs reach on dense matmuls there), and one slope for all chips (attention kernels run below
the matmul rate, and their share grows with the sequence). Other candidate inputs were fitted
too (model size, chips, tokens per chip: docs/forecast.md shows their coefficients and
errors): each moved the held-out error by about a point, with coefficients too small to
matter (2% per tenfold FLOPs per token), so the model leaves them out. The range is the 10th
to the 90th percentile of the held-out runs' errors. Where the roofline says the step is
memory-bound, or its collectives take longer than its compute, the expected time is that
term, which the table does not calibrate (every published run is compute-bound), and the
figure says so.

Pure: `fit_utilisation(runs, catalogue)` decides from its arguments; `default_fit()` reads the
shipped table and catalogue once.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .catalogue import Chip, HardwareCatalogue
from .published import PublishedRun, load_published_runs

# The range: this share of held-out runs fall inside it.
RANGE_QUANTILES = (0.1, 0.9)
# Matmul shares below this are outside what the table covers (every run is ~99% matmul).
MATMUL_SHARE_CALIBRATED = 0.9


@dataclass(frozen=True)
class StepFeatures:
    """What a compile (or a profiled step) knows about one training step on one target.

    `flops_per_chip` is the step's FLOPs per chip (compiled, counted or analytic);
    `attention_flops_per_chip` the part of them in attention products (QK^T, PV; None:
    unknown, taken as none). `attention` says how those are counted: "causal" (half the
    score matrix, as flash kernels compute) or "full" (the whole matrix, as a plain compiled
    SDPA does): the fit counts causal attention, so full attention is halved first.
    `collective_seconds` is the time the step's collectives take on the interconnect as the
    forecast models it; `matmul_share` the share of dot/convolution FLOPs.
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


@dataclass(frozen=True)
class ExpectedStep:
    """An expected step time with its range, the bound beside it, and where it comes from.

    `seconds` is the expected time, `low`-`high` its range (80% of held-out runs fell in
    it); `bound_seconds` the roofline at 100% of peak; `utilisation` the predicted share of
    peak; `limited_by` "compute" (calibrated), "memory" or "interconnect" (not calibrated);
    `calibrated` is False where the chip has no published run or the step is outside what
    the runs cover (`notes` say why).
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


@dataclass(frozen=True)
class HeldOutError:
    """One held-out run: the tokens/s/chip the model expects against the published figure."""

    run: PublishedRun
    expected_tokens_per_s: float
    published_tokens_per_s: float

    @property
    def error(self) -> float:
        """Signed relative error of the expected figure (+0.1: 10% too fast)."""
        return self.expected_tokens_per_s / self.published_tokens_per_s - 1


@dataclass(frozen=True)
class UtilisationFit:
    """The fitted model: a base log-utilisation per chip, the attention slope, and its error."""

    bases: dict[str, float]
    attention_slope: float
    fitted_runs: int
    held_out: tuple[HeldOutError, ...]
    log_range: tuple[float, float]  # quantiles of log(published / expected), held-out runs
    sources: tuple[str, ...] = field(default=())
    kind_of: dict[str, str] = field(default_factory=dict)  # chip key -> "tpu" / "gpu"

    # -- predicting ---------------------------------------------------------------------------

    def base_for(self, chip: Chip) -> tuple[float | None, str]:
        """The chip's base log-utilisation, and a note when it is not the chip's own."""
        if chip.key in self.bases:
            return self.bases[chip.key], ""
        same_kind = [b for key, b in self.bases.items() if self.kind_of.get(key) == chip.kind]
        if not same_kind:
            return None, f"no published run on a {chip.kind.upper()} in the table"
        return (
            statistics.fmean(same_kind),
            f"no published run on {chip.name} in the table: its utilisation is the mean of the "
            f"{len(same_kind)} {chip.kind.upper()} chips that have runs, and the range is wider",
        )

    def utilisation(self, chip: Chip, attention_share: float | None) -> float | None:
        """Predicted share of `chip`'s peak for a step with this attention share."""
        base, _ = self.base_for(chip)
        if base is None:
            return None
        share = attention_share or 0.0
        return math.exp(base - self.attention_slope * math.sqrt(share))

    # -- its error ----------------------------------------------------------------------------

    @property
    def median_error(self) -> float:
        return statistics.median(abs(h.error) for h in self.held_out)

    @property
    def worst_error(self) -> float:
        return max(abs(h.error) for h in self.held_out)

    def source_line(self) -> str:
        """One line: where expected figures come from and how sure they are."""
        chips = ", ".join(sorted(self.bases))
        return (
            f"Expected = FLOPs / (peak x utilisation); utilisation fitted on {self.fitted_runs} "
            f"published training runs ({chips}); on {len(self.held_out)} held-out runs its "
            f"median error is {self.median_error:.0%} (worst {self.worst_error:.0%}); ranges "
            f"hold {RANGE_QUANTILES[1] - RANGE_QUANTILES[0]:.0%} of them. The roofline bound "
            "is the time at 100% of peak."
        )


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


def _least_squares(rows: Sequence[Sequence[float]], targets: Sequence[float]) -> list[float]:
    k = len(rows[0])
    normal = [[sum(r[i] * r[j] for r in rows) for j in range(k)] for i in range(k)]
    rhs = [sum(r[i] * t for r, t in zip(rows, targets, strict=True)) for i in range(k)]
    return _solve(normal, rhs)


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def fit_utilisation(runs: Iterable[PublishedRun], catalogue: HardwareCatalogue) -> UtilisationFit:
    """Least squares on the runs not held out; the error on the held-out ones."""
    runs = list(runs)
    train = [r for r in runs if not r.held_out]
    chips = sorted({r.chip for r in train})
    peaks = {key: catalogue.get(key).peak_bf16_flops for key in {r.chip for r in runs}}

    def features(run: PublishedRun) -> list[float]:
        return [1.0 if run.chip == c else 0.0 for c in chips] + [math.sqrt(run.attention_share)]

    solution = _least_squares(
        [features(r) for r in train], [math.log(r.utilisation(peaks[r.chip])) for r in train]
    )
    bases = dict(zip(chips, solution[:-1], strict=True))
    model = UtilisationFit(
        bases=bases,
        attention_slope=-solution[-1],
        fitted_runs=len(train),
        held_out=(),
        log_range=(0.0, 0.0),
        sources=tuple(sorted({r.source for r in runs})),
        kind_of={key: catalogue.get(key).kind for key in bases},
    )
    held = []
    for run in (r for r in runs if r.held_out):
        chip = catalogue.get(run.chip)
        predicted = model.utilisation(chip, run.attention_share)
        if predicted is None:
            continue
        expected = predicted * chip.peak_bf16_flops / run.flops_per_token
        held.append(HeldOutError(run, expected, run.tokens_per_s_per_chip))
    if not held:
        raise ValueError("no held-out run can be predicted: the fit's error is unknown.")
    residuals = [math.log(h.published_tokens_per_s / h.expected_tokens_per_s) for h in held]
    return UtilisationFit(
        bases=bases,
        attention_slope=model.attention_slope,
        fitted_runs=len(train),
        held_out=tuple(held),
        log_range=(
            _quantile(residuals, RANGE_QUANTILES[0]),
            _quantile(residuals, RANGE_QUANTILES[1]),
        ),
        sources=model.sources,
        kind_of=model.kind_of,
    )


@functools.cache
def default_fit() -> UtilisationFit:
    """The fit on the shipped table and catalogue (computed once per process: ~1 ms)."""
    return fit_utilisation(load_published_runs(), HardwareCatalogue.load())


def expected_step(
    features: StepFeatures,
    chip: Chip,
    fit: UtilisationFit | None = None,
    *,
    utilisation: float | None = None,
) -> ExpectedStep | None:
    """The expected step time of `features` on `chip`, or None where nothing predicts it
    (a chip without a peak, or a kind of chip the table has no run on). `utilisation`
    replaces the fit's prediction when a measurement gives a better one
    (`scaled_utilisation`); the range stays the fit's."""
    fit = fit or default_fit()
    if not chip.has_peak or features.flops_per_chip <= 0:
        return None
    base_note = ""
    if utilisation is None:
        utilisation = fit.utilisation(chip, features.attention_share)
        if utilisation is None:
            return None
        _, base_note = fit.base_for(chip)
    notes = [base_note] if base_note else []
    compute = features.model_flops_per_chip / chip.peak_bf16_flops
    memory = (features.bytes_per_chip or 0.0) / chip.hbm_bandwidth if chip.hbm_bandwidth else 0.0
    bound = max(features.flops_per_chip / chip.peak_bf16_flops, memory)
    seconds = compute / utilisation
    limited_by = "compute"
    if features.attention_share is None:
        notes.append(
            "the step's attention FLOPs are unknown, so they are taken as none: long sequences "
            "run slower than this"
        )
    outside = features.matmul_share is not None and features.matmul_share < MATMUL_SHARE_CALIBRATED
    if outside:
        notes.append(
            f"only {features.matmul_share:.0%} of the FLOPs are matmuls; the published runs "
            "are ~99% matmuls, so this is outside what the fit covers"
        )
    if memory > seconds:
        seconds, limited_by = memory, "memory"
        notes.append(
            "memory-bound: the expected time is the roofline's memory term (the bytes at full "
            "HBM bandwidth), which no published run calibrates"
        )
    if features.collective_seconds and features.collective_seconds > seconds:
        seconds, limited_by = features.collective_seconds, "interconnect"
        notes.append(
            "the collectives take longer than the compute: the expected time is their time on "
            "the interconnect, which no published run calibrates"
        )
    low_factor, high_factor = math.exp(-fit.log_range[1]), math.exp(-fit.log_range[0])
    if base_note:
        spread = _kind_spread(fit, chip.kind)
        low_factor, high_factor = low_factor * math.exp(-spread), high_factor * math.exp(spread)
    if limited_by != "compute":  # an uncalibrated floor: it can only be slower
        low_factor, high_factor = 1.0, max(high_factor, 1.0)
    return ExpectedStep(
        seconds=seconds,
        low=seconds * low_factor,
        high=seconds * high_factor,
        bound_seconds=bound,
        utilisation=utilisation,
        limited_by=limited_by,
        calibrated=not base_note and not outside and limited_by == "compute",
        source=fit.source_line(),
        notes=tuple(notes),
    )


def _kind_spread(fit: UtilisationFit, kind: str) -> float:
    bases = [b for key, b in fit.bases.items() if fit.kind_of.get(key) == kind]
    return (max(bases) - min(bases)) / 2 if len(bases) > 1 else 0.0


def scaled_utilisation(
    measured_utilisation: float,
    measured_chip: Chip,
    target_chip: Chip,
    attention_share: float | None,
    fit: UtilisationFit | None = None,
) -> float | None:
    """A target's utilisation from a measured one on the same step: the measurement times
    the fit's ratio between the two chips (the attention term cancels when the step is the
    same). None when the measured chip has no base (the host CPU): then the fit alone."""
    fit = fit or default_fit()
    here = fit.utilisation(measured_chip, attention_share)
    there = fit.utilisation(target_chip, attention_share)
    if here is None or there is None or measured_utilisation <= 0:
        return None
    return min(1.0, measured_utilisation * there / here)
