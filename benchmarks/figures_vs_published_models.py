"""The expected step of CNNs, encoders and U-Nets against their published training runs.

Every row of `gpu2tpu/pricing/published_runs_models.toml` (NVIDIA DeepLearningExamples' A100
tables, MLPerf Training v1.0 on TPU v4 and A100) is rebuilt to its published shape on the meta
device (tests/published_models.py), one training step at the published batch per chip is
counted as the profiler counts it (`count_meta_step`: FlopCounterMode with the grouped-
convolution and attention corrections, the op mix, the kernel launches), and the expected
samples a second a chip comes from the fit's public entry point (`expected_step`) and the
per-step floor (`step_floor`), as the profiler's comparison computes them. Two fits:

- **shipped**: the fit on published_runs.toml alone (LLM runs), as users get it today: a model
  class it has no run of is a bound (>=), which must never be slower than the published run;
- **joint, leave-one-source-out**: the fit on published_runs.toml plus these rows, refitted
  without the row's source (`source_group`) and predicting it: the error the issue's goal is
  stated in (median <= 20% and worst <= 40% per class, the range holding its stated share).

Run: `PYTHONPATH=. python benchmarks/figures_vs_published_models.py` (about a minute: counting
every model on the meta device, then the fits). `--raw` also prints torch's own count of each
model, uncorrected, beside the corrected one.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from published_models import build, count_run

from gpu2tpu.measure.flops import StepCount, count_meta_step
from gpu2tpu.pricing.catalogue import HardwareCatalogue
from gpu2tpu.pricing.class_fit import (
    TRAFFIC_TABLE,
    ClassFit,
    default_class_fit,
    expected_class_step,
    expected_step_by_op,
    fit_without_error,
    load_traffic,
    traffic_key,
)
from gpu2tpu.pricing.op_traffic import OpTraffic
from gpu2tpu.pricing.published import PublishedRun, load_published_runs
from gpu2tpu.pricing.step_floor import apply_floor, step_floor
from gpu2tpu.pricing.utilisation import StepFeatures, default_fit

MODELS_TABLE = Path(__file__).resolve().parents[1] / "gpu2tpu/pricing/published_runs_models.toml"
GOAL_MEDIAN, GOAL_WORST = 0.20, 0.40


@dataclass
class Row:
    run: PublishedRun
    count: StepCount
    batch: int
    kind: str = ""
    expected: float | None = None  # samples a second a chip
    low: float | None = None
    high: float | None = None
    floor_limited: bool = False
    floor_seconds: float = 0.0

    @property
    def published(self) -> float:
        return self.run.samples_per_s_per_chip

    @property
    def error(self) -> float | None:
        """Signed error of an expected figure (a bound has none: it is checked to hold; nor
        has a run its host limited: the figure must only be at least its rate)."""
        if self.expected is None or self.kind != "expected" or self.run.limited_by:
            return None
        return self.expected / self.published - 1

    @property
    def in_range(self) -> bool:
        """The published rate within the range, its ends included. An end is one run's own
        residual (an outer quantile of the fit's, from the traffic table, kept to six digits);
        this run's figure comes from its count, which `same_traffic` holds to 1e-4 of the
        table: a run at the end is in when within that."""
        if self.low is None or self.high is None:
            return False
        slack = 1e-4 * self.published
        return self.low - slack <= self.published <= self.high + slack

    @property
    def holds(self) -> bool:
        """A bound is at least the published rate; so is the fast end of the range of a
        figure for a run its host limited (the step alone would run at least that fast)."""
        if self.kind == "bound":
            return (self.expected or 0) >= self.published
        if self.run.limited_by:
            return (self.high or self.expected or 0) >= self.published
        return True


def features(row: Row) -> StepFeatures:
    run, step = row.run, row.count
    per_sample = step.flops / row.batch
    flops = per_sample * run.per_device_batch
    chip_kind = "tpu" if run.chip.startswith("v") else "gpu"
    inputs = step.fit_inputs(chip_kind)
    return StepFeatures(
        chip=run.chip,
        chips=1,
        flops_per_chip=flops,
        attention_flops_per_chip=step.attention_flops / row.batch * run.per_device_batch,
        attention="full",
        matmul_share=inputs.get("matmul_share"),
        conv_share=inputs.get("conv_share"),
        samples_per_chip=run.per_device_batch,
        model_class=run.model_class,
        precision=run.precision,
        framework=run.framework,
        traffic=step.traffic().scaled(run.per_device_batch / row.batch),
    )


def predict(
    row: Row,
    catalogue: HardwareCatalogue,
    classes: ClassFit | None = None,
    ranged: ClassFit | None = None,
) -> None:
    """The row's figure as the profiler computes it: op by op with `classes` (the shipped
    fit when None), the range of `ranged` (the shipped fit's cross-publisher range), the
    per-step floor under it."""
    chip = catalogue.get(row.run.chip)
    wanted = features(row)
    llm = default_fit()
    if classes is None:
        step = expected_step_by_op(wanted, chip, llm)
    else:
        step = expected_class_step(
            wanted, chip, llm, row.run.model_class, row.run.framework, (), classes
        )
        if step is not None and ranged is not None and step.kind == "expected":
            span = ranged.range_for(row.run.model_class)
            step = replace(
                step,
                low=max(step.bound_seconds, step.seconds * math.exp(-span[1])),
                high=step.seconds * math.exp(-span[0]),
            )
    if step is None:
        return
    floor = step_floor(row.run.framework, chip.key, ops=row.count.kernel_ops)
    floored = apply_floor(step, floor)
    row.kind = floored.kind
    row.floor_seconds = floor.seconds
    row.floor_limited = floored.limited_by == floor.kind
    per_chip = row.run.per_device_batch
    row.expected = per_chip / floored.seconds
    row.low, row.high = per_chip / floored.high, per_chip / floored.low


def summary(rows: list[Row]) -> tuple[int, float, float, int]:
    """Per configuration (the geometric mean of its rows' errors): count, median, worst, in range."""
    grouped: dict[tuple[object, ...], list[Row]] = defaultdict(list)
    for row in rows:
        if row.error is not None:
            grouped[row.run.configuration].append(row)
    errors = [
        math.expm1(statistics.fmean(math.log1p(r.error) for r in group if r.error is not None))
        for group in grouped.values()
    ]
    held = sum(all(r.in_range for r in g) for g in grouped.values())
    if not errors:
        return 0, math.nan, math.nan, 0
    return len(errors), statistics.median(abs(e) for e in errors), max(map(abs, errors)), held


def raw_ratio(run: PublishedRun) -> float:
    """torch's own FlopCounterMode count of the step over the corrected one."""
    model, (inputs, targets), recipe = build(run.model.key, 1)
    state = {
        n: torch.empty(p.shape, device="meta", requires_grad=True)
        for n, p in model.named_parameters()
    }
    state.update(
        {n: torch.empty(b.shape, dtype=b.dtype, device="meta") for n, b in model.named_buffers()}
    )
    with FlopCounterMode(display=False) as mode, torch.device("meta"):
        out = torch.func.functional_call(model, state, (inputs,))
        recipe.loss(out, targets).backward()
    corrected = count_meta_step(model, (inputs,), {}, targets, recipe.loss).flops
    return mode.get_total_flops() / corrected


def same_traffic(table: OpTraffic, counted: OpTraffic) -> bool:
    """Whether a table entry is the count, field by field (to the six digits it keeps)."""

    def close(a: float | None, b: float | None) -> bool:
        return (a is None) == (b is None) and (
            a is None or math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6)
        )

    sums = [
        (sum(f for _, f, _ in t.matrix), sum(b for _, _, b in t.matrix)) for t in (table, counted)
    ]
    return all(close(a, b) for a, b in zip(*sums, strict=True)) and all(
        close(getattr(table, name), getattr(counted, name))
        for name in (
            "other_bytes",
            "depthwise_bytes",
            "volumetric_flops",
            "channels_first_flops",
            "conv_flops",
        )
    )


def write_traffic(counted: dict[tuple[str, int, str, str], tuple[StepCount, int]]) -> None:
    """Write every counted step's traffic per sample (pricing/class_fit.py reads it)."""
    lines = [
        "# The unfused traffic of one training step per sample of every published non-LLM run, keyed",
        '# "model/batch a chip/precision": matrix ops as [FLOPs per byte, FLOPs, bytes] by intensity, the',
        "# bytes of every other op and of depthwise convolutions, the FLOPs of 3-D, channels-first and all",
        "# convolutions. Counted by the profiler's counter on the",
        "# models built to their published shapes (tests/published_models.py) on the meta device;",
        "# regenerate with `benchmarks/figures_vs_published_models.py --write-traffic`.",
    ]
    for key, (step, batch) in sorted(counted.items()):
        mix = step.mix
        bins = ", ".join(
            f"[{i:.4g}, {f / batch:.6g}, {b / batch:.6g}]" for i, f, b in mix.matrix_intensity
        )
        lines += [
            f'[traffic."{traffic_key(*key)}"]',
            f"flops = {step.flops / batch:.6g}",
            f"other_bytes = {mix.other_bytes / batch:.6g}",
            f"depthwise_bytes = {mix.depthwise_bytes / batch:.6g}",
            f"volumetric_flops = {mix.conv3d_flops / batch:.6g}",
            f"channels_first_flops = {mix.channels_first_flops / batch:.6g}",
            f"conv_flops = {mix.conv_flops / batch:.6g}",
            f"matrix = [{bins}]",
            "",
        ]
    target = TRAFFIC_TABLE.with_suffix(".tmp")
    target.write_text("\n".join(lines), encoding="utf-8")
    target.replace(TRAFFIC_TABLE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--raw", action="store_true", help="torch's uncorrected count beside")
    parser.add_argument(
        "--write-traffic",
        action="store_true",
        help="rewrite gpu2tpu/pricing/published_traffic.toml",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    catalogue = HardwareCatalogue.load()
    model_runs = list(load_published_runs(MODELS_TABLE))
    counted: dict[tuple[str, int, str, str], tuple[StepCount, int]] = {}
    rows = []
    for run in model_runs:
        key = (
            run.model.key,
            max(1, math.ceil(run.per_device_batch)),
            run.precision,
            run.memory_format,
        )
        if key not in counted:
            counted[key] = count_run(run)
        step, batch = counted[key]
        rows.append(Row(run, step, batch))
    print(
        f"counted {len(counted)} steps on the meta device in {time.perf_counter() - started:.0f} s"
    )

    print("\n## FLOPs: the profiler's count against the table's flops_per_sample")
    print(
        "| model | batch | FLOPs/sample | table | class guessed | kernel ops | torch raw / corrected |"
    )
    print("|---|---|---|---|---|---|---|")
    seen = set()
    for row in rows:
        if row.run.model.key in seen:
            continue
        seen.add(row.run.model.key)
        per_sample = row.count.flops / row.batch
        raw = f"{raw_ratio(row.run):.2f}x" if args.raw else "-"
        print(
            f"| {row.run.model.key} | {row.batch} | {per_sample:.4g} | "
            f"{row.run.flops_per_sample:.4g} | {row.count.model_class} | {row.count.kernel_ops} | {raw} |"
        )

    table = load_traffic()
    stale = [
        key
        for key, (step, batch) in counted.items()
        if traffic_key(*key) not in table
        or not same_traffic(table[traffic_key(*key)], step.traffic().scaled(1 / batch))
    ]
    if args.write_traffic:
        write_traffic(counted)
        table = load_traffic()
        stale = []
    print(f"\npublished_traffic.toml entries that differ from this count (must be 0): {len(stale)}")

    shipped = default_class_fit()
    print("\n## Shipped fit (every publisher): what a user's profile of these models shows")
    print("| row | published /s/chip | shipped figure /s/chip | kind | holds |")
    print("|---|---|---|---|---|")
    broken = 0
    for row in rows:
        predict(row, catalogue)
        broken += not row.holds
        print(
            f"| {row.run.id} | {row.published:.4g} | {row.expected or float('nan'):.4g} | "
            f"{row.kind} | {'yes' if row.holds else 'NO'} |"
        )
    print(
        f"bounds, and the ranges of host-limited runs, slower than published (must be 0): {broken}"
    )
    print(
        "coefficients: "
        + ", ".join(f"{k} {math.exp(v):.3g}" for k, v in shipped.coefficients.items())
    )
    print(
        "terms one publisher alone calibrates (no cross-publisher error: shown as bounds): "
        + (", ".join(f"{t} ({p})" for t, p in shipped.unchecked.items()) or "none")
    )

    print("\n## Leave-one-publisher-out: each source predicted by the op-by-op fit on the others")
    by_group = defaultdict(list)
    for row in rows:
        by_group[row.run.source_group].append(row)
    llm = default_fit()
    for group, members in sorted(by_group.items()):
        others = [r for r in model_runs if r.source_group != group]
        fold = fit_without_error(others, table, catalogue, llm)
        for row in members:
            predict(row, catalogue, fold, shipped)
    print("| row | class | published /s/chip | expected /s/chip | error | range | floor |")
    print("|---|---|---|---|---|---|---|")
    under_floor = 0
    for row in rows:
        err = row.error
        in_range = row.in_range
        if (
            row.kind == "expected"
            and row.expected
            and row.run.per_device_batch / row.expected < row.floor_seconds
        ):
            under_floor += 1
        note = f"{row.run.limited_by}-limited" if row.run.limited_by else ""
        print(
            f"| {row.run.id} | {row.run.model_class} | {row.published:.4g} | "
            f"{row.expected or float('nan'):.4g}{'' if row.kind == 'expected' else ' (>=)'} | "
            f"{note if err is None else f'{err:+.0%}'} | "
            f"{'in' if in_range else 'out'} | {'limits' if row.floor_limited else ''} |"
        )
    bounds = [r for r in rows if r.kind == "bound"]
    wrong = sum(not r.holds for r in bounds)
    limited = [r for r in rows if r.run.limited_by]
    print(f"\nexpected steps under the per-step floor (must be 0): {under_floor}")
    print(
        f"runs their host's input limited (not fitted, not in the errors): {len(limited)}, "
        f"predicted slower than published (must be 0): {sum(not r.holds for r in limited)}"
    )
    print(
        f"rows shown as bounds (a term no other publisher calibrates): {len(bounds)}, "
        f"of which slower than published (must be 0): {wrong}"
    )
    print("\nexpected figures only (per configuration):")
    print("\n| class | configurations | median | worst | range holds | goal (<=20% / <=40%) |")
    print("|---|---|---|---|---|---|")
    for cls in ("cnn", "encoder", "unet", "all"):
        members = [r for r in rows if cls == "all" or r.run.model_class == cls]
        n, median, worst, held = summary(members)
        met = median <= GOAL_MEDIAN and worst <= GOAL_WORST
        print(
            f"| {cls} | {n} | {median:.1%} | {worst:.1%} | {held}/{n} | {'met' if met else 'not met'} |"
        )
    print(f"\n{time.perf_counter() - started:.0f} s in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
