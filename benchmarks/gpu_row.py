"""A GPU row of our own for the published-runs table (issue 34): a Llama-style decoder's
training step measured with `gpu2tpu.profile` on the GPU at hand, printed as a [[runs]] block
of gpu2tpu/pricing/published_runs.toml, with the fit's expected figure for it beside it.

    python benchmarks/gpu_row.py [--model tinyllama_1_1b] [--batch 8] [--sequence 2048]
        [--steps 20] [--device cuda] [--layers N]

The model is a shape of the table (`[models.*]`), built by the benchmark's own decoder
(forecast_vs_published.build_model: RMSNorm, causal SDPA, SwiGLU), in bf16, trained with
AdamW, no activation checkpointing, eager PyTorch: the setup a notebook user starts from. The
step is timed on the device (`gpu2tpu.profile`: warm-up apart, a synchronize after each
step); the row's value is tokens a second of the median step. The expected figure is the
shipped fit's for that row, as `forecast_vs_published.py` computes it for every published
row (the row's own source is new to the fit, so that is a cross-source prediction).

A row for the table needs the full model on a GPU in the catalogue; `--layers` (fewer
layers) and `--device cpu` are smoke runs: the block they print says so and is not for the
table.
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from forecast_vs_published import analytic, build_model, lm_loss  # the benchmark's own

from gpu2tpu.pricing.catalogue import HardwareCatalogue, UnknownChip
from gpu2tpu.pricing.published import DEFAULT_PATH, ModelShape, load_published_runs
from gpu2tpu.pricing.utilisation import default_fit

ROOT = Path(__file__).resolve().parent.parent


def _commit() -> str:
    done = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or "0" * 40


def measure(shape: ModelShape, args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The profiled training step (a `ProfileResult`)."""
    import torch

    from gpu2tpu import profile

    model = build_model(shape, layers=args.layers, device=args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    tokens = torch.randint(0, shape.vocab, (args.batch, args.sequence), device=args.device)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        lm_loss(model(tokens), tokens).backward()
        optimizer.step()

    return profile(
        step,
        steps=args.steps,
        warmup=args.warmup,
        backend=args.device,
        tokens_per_step=args.batch * args.sequence,
        progress=False,
    )


def row(shape: ModelShape, args: argparse.Namespace, result, date: str) -> str:  # type: ignore[no-untyped-def]
    """The [[runs]] block of the measured step."""
    import torch

    tokens = args.batch * args.sequence
    value = tokens / result.median
    smoke = args.layers is not None or args.device == "cpu"
    chip = result.device_key
    run_id = f"gpu2tpu-{chip}-{shape.key.replace('_', '-')}-{args.sequence}"
    notes = (
        f"a smoke run ({args.layers or shape.layers} of {shape.layers} layers on {args.device}): "
        "not for the table"
        if smoke
        else "measured by this repository: eager PyTorch, the setup a notebook starts from"
    )
    step_times = ", ".join(f"{t * 1e3:.1f}" for t in result.step_times)
    return "\n".join(
        [
            "[[runs]]",
            f'id = "{run_id}{"-smoke" if smoke else ""}"',
            f'model = "{shape.key}"',
            f'chip = "{chip}"',
            "chips = 1",
            "slices = 1",
            f'slice = "one {result.device_name}"',
            f"sequence = {args.sequence}",
            f"global_batch = {args.batch}",
            f"per_device_batch = {args.batch}",
            'precision = "bf16"',
            'parallelism = "one GPU, no sharding"',
            "recompute = []",
            'recompute_source = "benchmarks/gpu_row.py: no activation checkpointing"',
            'framework = "pytorch"',
            f'software = "torch {torch.__version__} eager, bf16 weights, AdamW (foreach), SDPA"',
            'source_group = "gpu2tpu"',
            'model_class = "llm_decoder"',
            'measured = "tokens_per_s_per_chip"',
            f"value = {value:.1f}",
            f'source = "gpu2tpu/gpu2tpu benchmarks/gpu_row.py @{_commit()}"',
            f'config = "python benchmarks/gpu_row.py --model {shape.key} --batch {args.batch} '
            f"--sequence {args.sequence} --steps {args.steps} --device {args.device}: median of "
            f'{len(result.step_times)} timed steps, ms: {step_times}"',
            f'date = "{date}"',
            "held_out = false",
            f'notes = "{notes}"',
            "",
        ]
    )


def expected_line(block: str, run_id: str) -> str:
    """The shipped fit's expected tokens/s for the row (it never saw the row's source)."""
    with tempfile.TemporaryDirectory() as folder:
        table = Path(folder) / "runs.toml"
        table.write_text(DEFAULT_PATH.read_text(encoding="utf-8") + "\n" + block, "utf-8")
        run = next(r for r in load_published_runs(table) if r.id == run_id)
    catalogue = HardwareCatalogue.load()
    try:
        catalogue.get(run.chip)
    except UnknownChip:
        return f"expected: none ({run.chip} is not in the catalogue)"
    comparison = analytic(run, catalogue, default_fit())
    if comparison.expected_tokens_per_s is None:
        return f"expected: none ({comparison.how})"
    error = comparison.expected_tokens_per_s / run.tokens_per_s_per_chip - 1
    return (
        f"expected {comparison.expected_tokens_per_s:,.0f} tokens/s/chip against {run.tokens_per_s_per_chip:,.0f}"
        f" measured ({error:+.1%}; the fit has no row of this source)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tinyllama_1_1b", help="a [models.*] shape")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--sequence", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layers", type=int, default=None, help="fewer layers: a smoke run")
    args = parser.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_row.py: no CUDA device here; --device cpu makes a smoke run", file=sys.stderr)
        return 2
    shapes = {r.model.key: r.model for r in load_published_runs() if r.shape is not None}
    shape = shapes.get(args.model)
    if shape is None or not isinstance(shape, ModelShape):
        print(f"gpu_row.py: {args.model} is not a decoder shape of the table", file=sys.stderr)
        return 2
    result = measure(shape, args)
    block = row(shape, args, result, datetime.date.today().isoformat())
    print(block)
    run_id = next(line for line in block.splitlines() if line.startswith("id = "))[6:-1]
    print("# " + expected_line(block, run_id))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
