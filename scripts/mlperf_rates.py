"""Training samples a second a chip from MLPerf Training result logs (the published non-LLM rows).

    python scripts/mlperf_rates.py RESULTS_DIR CHIPS [--samples-per-epoch N] [--repeat-blocks]

RESULTS_DIR holds one submission's `result_*.txt` files (a checkout of
mlcommons/training_results_v1.0, v2.0 or v3.1). Every block after the first (the first holds
the warm-up) counts `epoch_count x samples_per_epoch` samples (the log's own `samples_per_epoch`
where it states one: what the chips processed, batches filled) over its time less the
evaluations logged inside it (`eval_start`/`eval_stop`). Blocks numbered by step instead
(v3.1's Stable Diffusion: a start at `step_num` 0, its stop at 100, no epochs) count the steps
between them times the log's `global_batch_size`. A log that states no evaluation but
ends every block with one (Google's v1.0 UNet3D) needs `--repeat-blocks`: the first block and
the later ones each hold one evaluation and differ only in their epoch counts, so a training
epoch takes (T_first - T_later) / (epochs_first - epochs_later). Prints the median over the
files of samples a second, in all and a chip.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Block:
    epochs: int  # or steps, in a log that numbers its blocks by step
    start_ms: int
    stop_ms: int
    evaluating_ms: int  # evaluations logged inside the block

    @property
    def seconds(self) -> float:
        return (self.stop_ms - self.start_ms) / 1000


def events(lines: Iterable[str]) -> list[dict]:
    out = []
    for line in lines:
        _, marker, payload = line.partition(":::MLLOG ")
        if marker:
            try:
                out.append(json.loads(payload))
            except json.JSONDecodeError:
                continue  # a line cut by the logger
    return out


def blocks(log: list[dict]) -> list[Block]:
    """The log's training blocks in order; a stop closes the open block it names (or, where
    the log stamps stops with another epoch, the one opened last)."""
    evaluations, opened = [], None
    for e in log:
        if e["key"] == "eval_start":
            opened = e["time_ms"]
        elif e["key"] == "eval_stop" and opened is not None:
            evaluations.append((opened, e["time_ms"]))
            opened = None
    starts: dict[object, tuple[int, int]] = {}
    out = []
    for e in log:
        meta = e.get("metadata") or {}
        if e["key"] == "block_start":
            # a block numbered by step starts its count at minus its first step
            count = -int(meta["step_num"]) if _by_step(meta) else int(meta.get("epoch_count", 0))
            starts[meta.get("first_epoch_num")] = (e["time_ms"], count)
        elif e["key"] == "block_stop" and starts:
            key = meta.get("first_epoch_num")
            start, epochs = starts.pop(key if key in starts else list(starts)[-1])
            if _by_step(meta):
                epochs += int(meta["step_num"])
            stop = e["time_ms"]
            inside = sum(
                min(b, stop) - max(a, start) for a, b in evaluations if a < stop and b > start
            )
            out.append(Block(epochs, start, stop, inside))
    return out


def _by_step(meta: dict) -> bool:
    """Whether a block event numbers its block by step (v3.1's Stable Diffusion), not epoch."""
    return "step_num" in meta and "first_epoch_num" not in meta


def samples_per_second(log: list[dict], samples_per_epoch: int, repeat_blocks: bool) -> float:
    stated = [e["value"] for e in log if e["key"] == "samples_per_epoch"]
    if any(_by_step(e.get("metadata") or {}) for e in log if e["key"] == "block_start"):
        stated = [e["value"] for e in log if e["key"] == "global_batch_size"]  # a step's
    per_epoch = int(stated[0]) if stated else samples_per_epoch
    found = blocks(log)
    if repeat_blocks:
        first, later = found[0], found[1:]
        epochs = statistics.median(b.epochs for b in later)
        seconds = statistics.median(b.seconds for b in later)
        return per_epoch * (first.epochs - epochs) / (first.seconds - seconds)
    later = found[1:]
    training = sum(b.seconds - b.evaluating_ms / 1000 for b in later)
    return per_epoch * sum(b.epochs for b in later) / training


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("chips", type=int)
    parser.add_argument("--samples-per-epoch", type=int, default=0)
    parser.add_argument("--repeat-blocks", action="store_true")
    args = parser.parse_args(argv)
    rates = []
    for path in sorted(args.results.glob("result_*.txt")):
        log = events(path.read_text(encoding="utf-8", errors="replace").splitlines())
        try:
            rates.append(samples_per_second(log, args.samples_per_epoch, args.repeat_blocks))
        except (IndexError, ZeroDivisionError, ValueError) as exc:
            print(f"{path}: no training rate ({exc!r})", file=sys.stderr)
    if not rates:
        print(f"{args.results}: no result_*.txt with training blocks", file=sys.stderr)
        return 1
    median = statistics.median(rates)
    print(f"{len(rates)} files: {median:,.1f} samples/s, {median / args.chips:,.2f} a chip")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
