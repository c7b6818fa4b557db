"""The forecast against the bare compile it is built on, side by side, in one run.

For GPT-2 small (124M parameters, batch 8 x 1024 tokens, AdamW, fp32, built on the meta
device) on one TPU target, each in a fresh process so nothing is shared but the disk:

1. bare compile: the step written by hand (torchax functional call + jax.value_and_grad +
   optax.adamw), `jax.jit(...).lower(...).compile()` on libtpu's topology: the floor;
2. cold forecast: `forecast(...)` with its defaults and an empty cache, as a user calls it;
3. warm forecast: the same call again, in a new process;
4. batch search: `forecast(..., batch_search=True)` (the first compile comes from the cache):
   its compiles, its time, and how it ended (the line confirmed, or the bisection);
5. extrapolation: `forecast(..., extrapolate=True)`, compiled at one and two blocks,
   against the full compile of step 2: the error in FLOPs, bytes and memory per chip.
6. depths (only when asked: `--parts depths`): the step compiled through gpu2tpu's own path
   (`aot.TrainingStep`, libtpu) at 0, 1, 2 and all blocks, each in a fresh process, with
   libtpu's default effort and with XLA's lowest optimization level (`optimization_level`
   O0, openxla.org/xla/effort_levels): where a shallow compile's time goes, and whether the
   cheaper level gives the same figures.

`--models gpt2-medium,vit-b16` adds those models' extrapolation against their full compile
(each costs a full compile and two shallow ones). Times are wall seconds and CPU seconds
(the process and its children): on a shared machine the CPU figures are the steadier ones.

    .venv/bin/python benchmarks/forecast_gpt.py                  # v5e, GPT-2 small
    .venv/bin/python benchmarks/forecast_gpt.py --target v5p --models gpt2-medium,vit-b16
    .venv/bin/python benchmarks/forecast_gpt.py --parts bare,cold,warm --json out.json
    .venv/bin/python benchmarks/forecast_gpt.py --parts depths
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

MARK = "@@result "
PARTS = ("bare", "cold", "warm", "search", "extrapolate")
OPTIONAL_PARTS = ("depths",)
# XLA's effort levels as ExecutableBuildOptions holds them (jax's config.EffortLevel values).
EFFORT_O0 = 9


# -- models --------------------------------------------------------------------------------


class CausalSelfAttention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d: int, heads: int, causal: bool = True) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads) if causal else SelfAttention(d, heads)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(
            nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2: 12 layers, d=768, 12 heads (small) or 24, 1024, 16 (medium); vocab 50257,
    1024 positions, tied embeddings."""

    def __init__(
        self, layers: int = 12, d: int = 768, heads: int = 12, vocab: int = 50257, seq: int = 1024
    ):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class SelfAttention(CausalSelfAttention):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class ViT(nn.Module):
    """ViT-B/16: 224x224 images in 16x16 patches (196 + a class token), 12 blocks of d=768."""

    def __init__(self, layers: int = 12, d: int = 768, heads: int = 12, classes: int = 1000):
        super().__init__()
        self.patch = nn.Conv2d(3, d, kernel_size=16, stride=16)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.zeros(1, 197, d))
        self.blocks = nn.Sequential(*[Block(d, heads, causal=False) for _ in range(layers)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


MODELS = {
    "gpt2-small": dict(kind="gpt", layers=12, d=768, heads=12, batch=8),
    "gpt2-medium": dict(kind="gpt", layers=24, d=1024, heads=16, batch=8),
    "vit-b16": dict(kind="vit", layers=12, d=768, heads=12, batch=32),
}


def build(name: str) -> tuple[nn.Module, tuple, object]:
    """The model on the meta device, a batch, and its loss function."""
    spec = MODELS[name]
    with torch.device("meta"):
        if spec["kind"] == "gpt":
            model = GPT(spec["layers"], spec["d"], spec["heads"])
            tokens = torch.empty(spec["batch"], 1024, dtype=torch.long)
            return model, (tokens, tokens), lm_loss
        model = ViT(spec["layers"], spec["d"], spec["heads"])
        images = torch.empty(spec["batch"], 3, 224, 224)
        labels = torch.empty(spec["batch"], dtype=torch.long)
        return model, (images, labels), F.cross_entropy


def optimizer_for(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)


# -- what each fresh process measures ---------------------------------------------------------


def cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_bare(model_name: str, target: str) -> dict:
    """The step by hand: no gpu2tpu between the user and libtpu."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    for key, value in {
        "TPU_SKIP_MDS_QUERY": "1",
        "TPU_ACCELERATOR_TYPE": "v5litepod-1",
        "TPU_WORKER_HOSTNAMES": "localhost",
        "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    }.items():
        os.environ.setdefault(key, value)
    import jax
    import optax
    from jax.experimental import topologies

    from gpu2tpu.backends.torchax_compat import import_torchax

    torchax = import_torchax()  # torch 2.13 and newer need gpu2tpu's layer to import it

    jax.config.update("jax_enable_compilation_cache", False)
    names = {"v5e": "v5e:1x1", "v6e": "v6e:1x1", "v5p": "v5p:1x1x1", "tpu7x": "tpu7x:1x1x1"}
    device = topologies.get_topology_desc(
        platform="tpu",
        topology_name=names[target],
        chip_config_name="default",
        chips_per_host_bounds=(1, 1, 1),
        num_slices=1,
    ).devices[0]
    model, batch, loss_fn = build(model_name)
    sharding = jax.sharding.SingleDeviceSharding(device)
    env = torchax.default_env()

    def spec(t: torch.Tensor) -> jax.ShapeDtypeStruct:
        dtype = {torch.float32: jax.numpy.float32, torch.long: jax.numpy.int32}[t.dtype]
        return jax.ShapeDtypeStruct(tuple(t.shape), dtype, sharding=sharding)

    params = {n: spec(p) for n, p in model.named_parameters()}
    inputs, targets = (spec(t) for t in batch)
    tx = optax.adamw(6e-4, b1=0.9, b2=0.95, weight_decay=0.1)
    opt_state = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding),
        jax.eval_shape(tx.init, params),
    )

    def loss(p: dict, x: jax.Array, y: jax.Array) -> jax.Array:
        with env:
            out = torch.func.functional_call(model, env.j2t_iso(p), (env.j2t_iso(x),))
            return env.t2j_iso(loss_fn(out, env.j2t_iso(y)))

    def step(p: dict, state: object, x: jax.Array, y: jax.Array) -> tuple:
        value, grads = jax.value_and_grad(loss)(p, x, y)
        updates, state = tx.update(grads, state, p)
        return value, optax.apply_updates(p, updates), state

    wall, cpu = time.perf_counter(), cpu_seconds()
    lowered = jax.jit(step, donate_argnums=(0, 1)).lower(params, opt_state, inputs, targets)
    lower_s = time.perf_counter() - wall
    compiled = lowered.compile()
    memory = compiled.memory_analysis()
    return {
        "wall": time.perf_counter() - wall,
        "cpu": cpu_seconds() - cpu,
        "lower": lower_s,
        "flops": compiled.cost_analysis()["flops"],
        "memory": memory.argument_size_in_bytes
        + memory.output_size_in_bytes
        - memory.alias_size_in_bytes
        + memory.temp_size_in_bytes,
    }


def run_forecast(model_name: str, target: str, cache: str, options: dict) -> dict:
    from gpu2tpu.forecasting.forecast import forecast

    model, batch, loss_fn = build(model_name)
    optimizer = optimizer_for(model)
    wall, cpu = time.perf_counter(), cpu_seconds()
    result = forecast(
        model, batch, loss_fn=loss_fn, optimizer=optimizer, targets=[target], cache=cache,
        progress=False, **options,
    )  # fmt: skip
    t = result.targets[0]
    return {
        "wall": time.perf_counter() - wall,
        "cpu": cpu_seconds() - cpu,
        "phases": result.phases,
        "target_phases": t.phases,
        "status": t.status,
        "cached": t.cached,
        "flops": t.flops,
        "bytes": t.bytes_accessed,
        "memory": t.memory_per_chip,
        "capacity": t.capacity_per_chip,
        "max_batch": t.max_batch,
        "max_batch_exact": t.max_batch_exact,
        "search_compiles": t.search_compiles,
        "search_seconds": t.search_seconds,
        "search_method": t.search_method,
        "search": t.search,
        "extrapolation": t.extrapolation,
        "compile_seconds": t.compile_seconds,
        "message": t.message,
    }


def run_depth(model_name: str, target: str, depth: int, level: int | None) -> dict:
    """The step at `depth` blocks through gpu2tpu's own compile path, at libtpu's default
    effort or at XLA's optimization level `level`: lowering and compile timed apart."""
    from gpu2tpu.forecasting import aot
    from gpu2tpu.forecasting.optimizers import plan_optimizer, to_optax

    aot.forecast_versions()
    MODELS[model_name] = {**MODELS[model_name], "layers": depth}
    model, batch, loss_fn = build(model_name)
    plan = plan_optimizer(optimizer_for(model), list(model.named_parameters()))
    layout = aot.split_batch(batch)
    step = aot.TrainingStep(model, loss_fn, plan, layout)
    devices = aot.topology_devices(aot.topology_for(target))
    wall, cpu = time.perf_counter(), cpu_seconds()
    lowered = step.lower(to_optax(plan), devices, layout.batch_size)
    lower_wall, lower_cpu = time.perf_counter() - wall, cpu_seconds() - cpu
    import jax

    jax.config.update("jax_enable_compilation_cache", False)  # it cannot reload these
    options = {} if level is None else {"optimization_level": level}
    compiled = lowered.compile(compiler_options=options) if options else lowered.compile()
    cost, memory = compiled.cost_analysis(), compiled.memory_analysis()
    return {
        "wall": time.perf_counter() - wall,
        "cpu": cpu_seconds() - cpu,
        "lower": lower_wall,
        "lower_cpu": lower_cpu,
        "flops": cost["flops"],
        "bytes": cost["bytes accessed"],
        "memory": memory.argument_size_in_bytes
        + memory.output_size_in_bytes
        - memory.alias_size_in_bytes
        + memory.temp_size_in_bytes,
        "argument": memory.argument_size_in_bytes,
        "temp": memory.temp_size_in_bytes,
    }


def child(part: str, spec: dict) -> None:
    if part == "bare":
        result = run_bare(spec["model"], spec["target"])
    elif part == "depth":
        result = run_depth(spec["model"], spec["target"], spec["depth"], spec["level"])
    else:
        result = run_forecast(spec["model"], spec["target"], spec["cache"], spec["options"])
    print(MARK + json.dumps(result), flush=True)


def measure(part: str, spec: dict) -> dict:
    """Run one part in a fresh interpreter and read its result line."""
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, __file__, "--child", part, json.dumps(spec)],
        capture_output=True,
        text=True,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if proc.returncode or not lines:
        raise RuntimeError(f"{part} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(lines[-1][len(MARK) :])
    result["process"] = time.perf_counter() - started
    return result


# -- the report ----------------------------------------------------------------------------------


def error(estimate: float | None, truth: float | None) -> str:
    if estimate is None or truth is None or not truth:
        return "—"
    return f"{(estimate - truth) / truth * 100:+.2f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="v5e")
    parser.add_argument("--model", default="gpt2-small", choices=sorted(MODELS))
    parser.add_argument(
        "--parts", default=",".join(PARTS), help=f"any of {','.join(PARTS + OPTIONAL_PARTS)}"
    )
    parser.add_argument(
        "--models", default="", help="more models to extrapolate: gpt2-medium,vit-b16"
    )
    parser.add_argument("--budget", type=float, default=3600.0, help="search seconds")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], json.loads(args.child[1]))
        return
    parts = [p for p in args.parts.split(",") if p]
    cache = tempfile.mkdtemp(prefix="gpu2tpu-forecast-bench-")
    base = {"model": args.model, "target": args.target, "cache": cache}
    print(
        f"{args.model} on {args.target}; {date.today()}, {platform.node()}: {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f}; torch {torch.__version__}; empty cache {cache}",
        flush=True,
    )
    figures: dict[str, dict] = {}

    def step(name: str, part: str, **options: object) -> dict:
        result = measure(part, {**base, "options": options})
        figures[name] = result
        print(f"  {name:28s} {result['wall']:8.1f} s wall {result['cpu']:8.1f} s CPU", flush=True)
        return result

    if "bare" in parts:
        bare = step("bare compile", "bare")
    if "cold" in parts:
        cold = step("cold forecast (defaults)", "forecast")
        phases = {**cold["phases"], **cold["target_phases"]}
        print("      where it went: " + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items()))
    if "warm" in parts:
        step("warm forecast", "forecast")
    if "search" in parts:
        search = step(
            "forecast with batch search", "forecast", batch_search=True, time_budget_s=args.budget
        )
        print(
            f"      largest batch {search['max_batch']}{'' if search['max_batch_exact'] else '+'} "
            f"({search['search_method']}): {search['search_compiles']} search compiles in "
            f"{search['search_seconds']:.1f} s; points "
            + ", ".join(f"{p['batch']}:{p['status']}" for p in search["search"])
        )
    depths: dict[tuple[int, int | None], dict] = {}
    if "depths" in parts:
        layers = MODELS[args.model]["layers"]
        for depth, level in ((0, None), (1, None), (2, None), (layers, None), (1, EFFORT_O0),
                             (2, EFFORT_O0), (layers, EFFORT_O0)):  # fmt: skip
            name = f"{depth} blocks, {'O0' if level else 'default effort'}"
            depths[depth, level] = result = measure(
                "depth", {**base, "depth": depth, "level": level}
            )
            figures[name] = result
            print(
                f"  {name:28s} {result['wall']:8.1f} s wall {result['cpu']:8.1f} s CPU "
                f"(lowering {result['lower']:.1f} s)",
                flush=True,
            )
    extrapolations = []
    if "extrapolate" in parts and "cold" in parts:
        shallow = step("extrapolated forecast", "forecast", extrapolate=True)
        extrapolations.append((args.model, cold, shallow))
    for name in [m for m in args.models.split(",") if m]:
        base["model"] = name
        full = step(f"{name}: full compile", "forecast", extrapolate=False)
        shallow = step(f"{name}: extrapolated", "forecast", extrapolate=True)
        extrapolations.append((name, full, shallow))

    print("\nResults")
    if "bare" in parts and "cold" in parts:
        print(
            f"  cold forecast / bare compile: {cold['wall'] / bare['wall']:.2f}x wall, "
            f"{cold['cpu'] / bare['cpu']:.2f}x CPU (goal: at most 1.3x)"
        )
        same = abs(cold["flops"] - bare["flops"]) / bare["flops"]
        print(f"  same program: FLOPs differ by {same * 100:.3f}% from the bare compile's")
    if "warm" in parts:
        print(f"  warm forecast: {figures['warm forecast']['wall']:.2f} s (goal: under 5 s)")
    for name, full, shallow in extrapolations:
        print(
            f"  {name} extrapolated from {shallow['extrapolation']['compiled_depths']} of "
            f"{shallow['extrapolation']['depth']} blocks: FLOPs {error(shallow['flops'], full['flops'])}, "
            f"bytes {error(shallow['bytes'], full['bytes'])}, memory/chip "
            f"{error(shallow['memory'], full['memory'])}; {shallow['wall']:.0f} s against "
            f"{full['wall']:.0f} s ({shallow['cpu']:.0f} against {full['cpu']:.0f} s CPU)"
        )
    if depths:
        report_depths(depths, MODELS[args.model]["layers"])
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


def report_depths(depths: dict[tuple[int, int | None], dict], layers: int) -> None:
    """Where a compile's time goes by depth, and what the lowest effort level changes."""
    cpu = {d: depths[d, None]["cpu"] for d in (0, 1, 2, layers)}
    print(
        f"  compile CPU by depth: 0 blocks {cpu[0]:.0f} s (embeddings, head, loss, optimizer), "
        f"1 block {cpu[1]:.0f} s, 2 blocks {cpu[2]:.0f} s, {layers} blocks {cpu[layers]:.0f} s; "
        f"the extrapolation's two compiles {cpu[1] + cpu[2]:.0f} s "
        f"= {(cpu[1] + cpu[2]) / cpu[layers]:.2f}x the full compile"
    )
    for depth in (1, 2, layers):
        default, low = depths[depth, None], depths[depth, EFFORT_O0]
        print(
            f"  O0 at {depth} blocks: {low['cpu']:.0f} s CPU against {default['cpu']:.0f} s; "
            f"FLOPs {error(low['flops'], default['flops'])}, bytes "
            f"{error(low['bytes'], default['bytes'])}, memory/chip "
            f"{error(low['memory'], default['memory'])} against the default effort"
        )


if __name__ == "__main__":
    main()
