"""An 8B-parameter Llama-style model on TPU slices: which fit, and how long the forecast takes.

Llama 3 8B's shape (32 layers, d=4096, 32 heads with 8 key/value heads, SwiGLU 14336, vocab
128256, RMSNorm, rotary positions), built on the meta device in bfloat16, trained with AdamW
on sequences of 4096 tokens, one sequence per chip. Each target is a slice of 8 or 64 chips
of v5p and v6e, FSDP (sharded over the chips; `--sharding data,fsdp` adds data parallel).
A full compile of 32 such blocks takes many minutes here, so the forecast compiles shallow
copies and extends the line (`extrapolate`); the targets of one slice size are one forecast
call (compiled side by side, one child per CPU; `--separate` times each on its own). A slice
of more than 8 chips is compiled whole on the generation's 8-chip slice (cached, so the
64-chip call reuses the 8-chip call's compiles) and only partitioned on its own
(forecasting/slices.py); a target that does not fit is re-checked with every block
checkpointed, beside the other targets. Per target
it prints the FLOPs per chip against the analytic count (6 x matmul parameters x tokens +
attention: docs/forecast.md) and the compiler's own count, the ICI traffic, and at the end
the time all targets took (the goal: four in 6 minutes on a 2-core machine).

    .venv/bin/python benchmarks/forecast_llama.py
    .venv/bin/python benchmarks/forecast_llama.py --targets v5p --chips 8 --sharding fsdp
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

import torch

# The model the forecast's FLOP tests compile, at the 8B shape (tests/forecast_models.py).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from forecast_models import LLAMA3_8B, Llama, lm_loss, matmul_parameters


def cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _report(t: Any, sharding: str, wall: float, cpu: float, analytic: float) -> dict:
    """Print one target's line (and its FLOP and ICI line); return its JSON row."""
    from gpu2tpu.views.format import format_bytes

    step = f"{t.step_seconds * 1e3:.0f} ms/step ({t.bound}-bound)" if t.step_seconds else ""
    parts = t.memory_breakdown or {}
    held = (
        f" (arguments {format_bytes(parts['argument'])}, temporaries {format_bytes(parts['temp'])})"
        if "argument" in parts and "temp" in parts
        else ""
    )
    compiled = f"compiles {t.compile_seconds:6.1f} s"
    if t.checkpointed is not None:
        compiled += f" + {t.checkpointed.compile_seconds:.1f} s checkpointed"
    print(
        f"  {t.label:12s} {sharding:5s} {t.status:13s} {format_bytes(t.memory_per_chip):>10s} "
        f"of {format_bytes(t.capacity_per_chip):>10s} per chip {step:30s} {compiled}{held}",
        flush=True,
    )
    if t.flops_per_chip:
        ici = t.collective_bytes_per_chip or 0.0
        timed = (
            f", {t.collective_seconds * 1e3:.1f} ms on ICI"
            if t.collective_seconds is not None
            else ""
        )
        print(
            f"      FLOPs per chip {t.flops_per_chip:.4g} ({t.flops_per_chip / analytic - 1:+.1%} "
            f"against the analytic count; the compiler's own {t.compiler_flops / t.chips:.4g}); "
            f"ICI {ici / 1e9:.2f} GB sent per chip{timed}",
            flush=True,
        )
    if t.derived_from:
        print(
            f"      FLOPs and bytes from the whole compile on {t.derived_from}; memory and "
            "collectives from this slice's partitioned program",
            flush=True,
        )
    if t.checkpointed is not None:
        print(f"      {t.summary()}", flush=True)
    return {
        "target": t.label, "sharding": sharding, "status": t.status, "fits": t.fits,
        "memory_per_chip": t.memory_per_chip, "usable": t.capacity_per_chip,
        "breakdown": t.memory_breakdown, "step_seconds": t.step_seconds, "bound": t.bound,
        "call_wall": wall, "call_cpu": cpu, "compile_seconds": t.compile_seconds,
        "extrapolation": t.extrapolation, "derived_from": t.derived_from, "message": t.message,
        "bytes_per_chip": t.bytes_per_chip,
        "flops_per_chip": t.flops_per_chip, "compiler_flops": t.compiler_flops,
        "collective_bytes_per_chip": t.collective_bytes_per_chip,
        "collective_seconds": t.collective_seconds, "summary": t.summary(),
        "checkpointed": t.checkpointed.to_dict() if t.checkpointed else None,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="v5p,v6e")
    parser.add_argument("--chips", default="8,64")
    parser.add_argument("--sharding", default="fsdp")
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--cache", default=None, help="figure cache (default: a new one)")
    parser.add_argument("--attention", default="flash", choices=("flash", "full"))
    parser.add_argument("--separate", action="store_true", help="one forecast call per target")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from gpu2tpu.forecasting.forecast import forecast

    with torch.device("meta"):
        model = Llama(layers=args.layers, theta=500000.0, **LLAMA3_8B).to(torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    cache = args.cache or tempfile.mkdtemp(prefix="gpu2tpu-forecast-llama-")
    print(
        f"Llama-style {params / 1e9:.2f}B parameters, bfloat16, sequence {args.seq}, AdamW; "
        f"{date.today()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; cache {cache}",
        flush=True,
    )
    rows = []
    matmul = matmul_parameters(model)
    attention = 12 * args.layers * args.seq**2 * 4096  # per sequence, non-causal
    flash = (
        18 * args.layers * 32 * args.seq**2 * 128 * (args.seq // 128 + 1) / (2 * args.seq // 128)
    )
    analytic = {"full": 6 * matmul * args.seq + attention, "flash": 6 * matmul * args.seq + flash}
    print(
        f"analytic FLOPs per chip (one sequence): {analytic['full']:.4g} with the reference "
        f"attention, {analytic['flash']:.4g} with the flash kernel (causal)",
        flush=True,
    )
    started_wall, started_cpu = time.perf_counter(), cpu_seconds()
    generations = args.targets.split(",")
    for chips in (int(c) for c in args.chips.split(",")):
        for sharding in args.sharding.split(","):
            # One call per slice size: its targets share the traced steps and compile side
            # by side (one child per CPU); --separate times each target on its own.
            groups = [[g] for g in generations] if args.separate else [generations]
            for group in groups:
                tokens = torch.empty(chips, args.seq, dtype=torch.long, device="meta")
                wall, cpu = time.perf_counter(), cpu_seconds()
                result = forecast(
                    model, (tokens, tokens), loss_fn=lm_loss, optimizer=optimizer,
                    targets=group, chips=chips, sharding=sharding, cache=cache, progress=False,
                    attention=args.attention,
                )  # fmt: skip
                wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
                print(
                    f"forecast of {', '.join(t.label for t in result.targets)} ({sharding}): "
                    f"{wall:.1f} s wall, {cpu:.1f} s CPU",
                    flush=True,
                )
                for t in result.targets:
                    rows.append(_report(t, sharding, wall, cpu, analytic[args.attention]))
    fits = [f"{r['target']} {r['sharding']}" for r in rows if r["fits"]]
    fits += [
        f"{r['target']} {r['sharding']} with checkpointing"
        for r in rows
        if r["checkpointed"] and r["checkpointed"]["fits"]
    ]
    print(f"\nFits: {', '.join(fits) or 'none'}")
    print(
        f"All {len(rows)} targets: {time.perf_counter() - started_wall:.0f} s wall, "
        f"{cpu_seconds() - started_cpu:.0f} s CPU (goal: 360 s for four); "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
