"""How well the CPU dry run predicts what PyTorch/XLA's compiler does, per hazard kind.

Every case of benchmarks/dryrun_cases.py runs twice in this process:

1. on PyTorch/XLA (`torch_xla.device()`, PJRT_DEVICE=CPU), with `torch_xla.sync()` after each
   step; the truth comes from torch_xla's own records over the steps after warm-up:
   - host sync: the counter `aten::_local_scalar_dense` grew, or data went to the host
     (`TransferFromDeviceTime`) in a case with no CPU fallback (a fallback moves data too);
   - recompile: the counter `UncachedCompile` grew after warm-up;
   - float64: a float64 array (not a scalar) in the HLO torch_xla builds for the live XLA
     tensors before each sync (`torch_xla._XLAC._get_xla_tensors_hlo`);
   - dynamic shape / cpu fallback: an `aten::<op>` fallback counter grew, for an op torch tags
     as data-dependent (dynamic shape) or for any other op (cpu fallback);
2. on the CPU under the dry run (gpu2tpu.readiness.dryrun), all steps under one detector; its
   report's hazard kinds are the prediction, and for "cpu fallback" its op coverage against
   PyTorch/XLA's lowerings (gpu2tpu/readiness/torch_xla_ops.json), ops torch tags as
   data-dependent aside.

It prints precision and recall per kind and every case where the two disagree.
Run (needs the XLA environment, `make install-xla`):
    PJRT_DEVICE=CPU .venv-xla/bin/python benchmarks/dryrun_accuracy.py [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("PJRT_DEVICE", "CPU")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch_xla
import torch_xla.debug.metrics as met
from dryrun_cases import CASES, KINDS, STEPS, WARMUP, Case

from gpu2tpu.readiness.dryrun import DryRunDetector, HazardKind
from gpu2tpu.readiness.user_code import UserCode

_HOST_READ = "aten::_local_scalar_dense"
_DYNAMIC_TAGS = (torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output)


def is_dynamic(op: str) -> bool:
    """Whether torch tags an op ("aten::nonzero", "aten.index.Tensor") as having an output
    shape (or value) that depends on the data: the "dynamic shape" kind, not "cpu fallback"."""
    text = op.replace("::", ".")
    parts = text.split(".")
    packet = getattr(getattr(torch.ops, parts[0]), parts[1], None)
    if packet is None:
        return False
    overloads = [parts[2]] if len(parts) > 2 else ["default"]
    if overloads[0] not in packet.overloads():
        overloads = packet.overloads()
    return any(tag in getattr(packet, o).tags for o in overloads for tag in _DYNAMIC_TAGS)


def _counters() -> dict[str, int]:
    out = {n: met.counter_value(n) for n in met.counter_names()}
    data = met.metric_data("TransferFromDeviceTime")
    out["TransferFromDevice"] = int(data[0]) if data else 0
    return out


# A float64 array in HLO ("f64[8,3]"); float64 scalars ("f64[]") are Python numbers that
# torch_xla hands to the graph as data, and cost nothing.
_F64_ARRAY = re.compile(r"f64\[\d")


def _graph_has_f64() -> bool:
    """Whether the graph a sync would run now holds a float64 array: the HLO torch_xla
    builds for every live XLA tensor (pending ops and the device data they read)."""
    live = [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.device.type == "xla"]
    return bool(live) and bool(_F64_ARRAY.search(torch_xla._XLAC._get_xla_tensors_hlo(live)))


def ground_truth(case: Case) -> tuple[set[str], dict[str, int]]:
    """What PyTorch/XLA did in the case's steps after warm-up, as hazard kinds."""
    gc.collect()  # earlier cases' tensors must not count as this one's live tensors
    dev = torch_xla.device()
    torch.manual_seed(0)
    step = case.build(dev)
    f64 = False
    for i in range(STEPS):
        if i == WARMUP:
            before = _counters()
        out = step(i)  # kept until the sync, as a training loop keeps its loss
        f64 = _graph_has_f64() or f64
        torch_xla.sync()
        del out
    after = _counters()
    delta = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    fallbacks = {k for k in delta if k.startswith("aten::") and k != _HOST_READ}
    kinds = set()
    if delta.get(_HOST_READ) or (delta.get("TransferFromDevice") and not fallbacks):
        kinds.add("host sync")
    if delta.get("UncachedCompile"):
        kinds.add("recompile")
    if f64:
        kinds.add("float64")
    if any(is_dynamic(op) for op in fallbacks):
        kinds.add("dynamic shape")
    if any(not is_dynamic(op) for op in fallbacks):
        kinds.add("cpu fallback")
    return kinds, delta


_KIND_OF = {
    HazardKind.HOST_SYNC: "host sync",
    HazardKind.SHAPE_CHANGE: "recompile",
    HazardKind.FLOAT64: "float64",
    HazardKind.DYNAMIC_SHAPE: "dynamic shape",
    HazardKind.GRAD_SCALER: "host sync",  # the scaler's found_inf read, with advice to drop it
}


def prediction(case: Case) -> tuple[set[str], Any]:
    """What the CPU dry run says about the same steps, as hazard kinds."""
    torch.manual_seed(0)
    step = case.build(torch.device("cpu"))
    here = Path(__file__).resolve().parent
    # The cases' own file is the code being dry-run; dryrun_earlier.py stands for the
    # functions earlier cells defined, which the dry run follows.
    user_code = UserCode(cells={}, root=here)
    detector = DryRunDetector({str(here / "dryrun_cases.py")}, case.name, user_code=user_code)
    with detector:
        for i in range(STEPS):
            step(i)
    report = detector.report()
    kinds = {_KIND_OF[h.kind] for h in report.hazards if h.kind in _KIND_OF}
    if any(not is_dynamic(entry.op) for entry in report.coverage.not_lowered):
        kinds.add("cpu fallback")
    return kinds, report


def score(rows: list[dict[str, Any]]) -> dict[str, dict[str, float | int]]:
    """Precision and recall per kind over all cases (a case counts once per kind)."""
    table = {}
    for kind in KINDS:
        tp = sum(kind in r["truth"] and kind in r["predicted"] for r in rows)
        fp = sum(kind not in r["truth"] and kind in r["predicted"] for r in rows)
        fn = sum(kind in r["truth"] and kind not in r["predicted"] for r in rows)
        table[kind] = {
            "cases": tp + fn,
            "tp": tp,
            "fp": fp,
            "fn": fn,
            "precision": tp / (tp + fp) if tp + fp else 1.0,
            "recall": tp / (tp + fn) if tp + fn else 1.0,
        }
    return table


def run(names: list[str] | None = None) -> list[dict[str, Any]]:
    rows = []
    for case in CASES:
        if names and case.name not in names:
            continue
        t0 = time.perf_counter()
        truth, delta = ground_truth(case)
        predicted, report = prediction(case)
        rows.append(
            {
                "case": case.name,
                "intended": sorted(case.intended),
                "truth": sorted(truth),
                "predicted": sorted(predicted),
                "evidence": {
                    k: v
                    for k, v in delta.items()
                    if k.startswith("aten::") or k in ("UncachedCompile", "TransferFromDevice")
                },
                "dry_run": [f"{h.kind} {h.where()}: {dict(h.causes)}" for h in report.hazards],
                "seconds": round(time.perf_counter() - t0, 2),
            }
        )
        print(f"  {case.name}: {rows[-1]['seconds']} s", file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the rows and scores here")
    parser.add_argument("--case", action="append", help="run only this case (repeatable)")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    rows = run(args.case)
    table = score(rows)
    print(
        f"Dry run against PyTorch/XLA {torch_xla.__version__} on the CPU "
        f"(torch {torch.__version__}): {len(rows)} cases, {STEPS} steps each "
        f"({WARMUP} warm-up), {time.perf_counter() - t0:.0f} s"
    )
    print(f"{'kind':<14} {'cases':>5} {'TP':>3} {'FP':>3} {'FN':>3} {'precision':>9} {'recall':>7}")
    for kind, s in table.items():
        print(
            f"{kind:<14} {s['cases']:>5} {s['tp']:>3} {s['fp']:>3} {s['fn']:>3} "
            f"{s['precision']:>9.2f} {s['recall']:>7.2f}"
        )
    wrong = [r for r in rows if r["truth"] != r["predicted"]]
    print(f"\nDisagreements: {len(wrong)}")
    for r in wrong:
        print(f"  {r['case']}: XLA {r['truth']} / dry run {r['predicted']}")
        print(f"    evidence {r['evidence']}")
        for line in r["dry_run"]:
            print(f"    {line}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "scores": table}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
