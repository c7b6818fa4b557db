"""An 8B-parameter Llama-style model on TPU slices: which fit, and how long the forecast takes.

Llama 3 8B's shape (32 layers, d=4096, 32 heads with 8 key/value heads, SwiGLU 14336, vocab
128256, RMSNorm, rotary positions), built on the meta device in bfloat16, trained with AdamW
on sequences of 4096 tokens, one sequence per chip. Each target is a slice of 8 or 64 chips
of v5p and v6e, data parallel (weights and optimizer state on every chip) and FSDP (sharded
over the chips). A full compile of 32 such blocks takes many minutes here, so the forecast
compiles one and two blocks and extends the line (`extrapolate`); each target is timed as
its own forecast call.

    .venv/bin/python benchmarks/forecast_llama.py
    .venv/bin/python benchmarks/forecast_llama.py --targets v5p --chips 8 --sharding fsdp
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from datetime import date
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype) * self.weight


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int, theta: float = 500000.0) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, d // heads
        self.theta = theta
        self.q_proj = nn.Linear(d, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        hd = self.head_dim
        q = self.q_proj(x).view(b, t, self.heads, hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, hd).transpose(1, 2)
        inv = 1.0 / self.theta ** (torch.arange(0, hd, 2, device=x.device).float() / hd)
        angles = torch.outer(torch.arange(t, device=x.device).float(), inv)
        cos = torch.cat((angles, angles), dim=-1).cos().to(x.dtype)
        sin = torch.cat((angles, angles), dim=-1).sin().to(x.dtype)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        repeat = self.heads // self.kv_heads
        k = k[:, :, None].expand(b, self.kv_heads, repeat, t, hd).reshape(b, self.heads, t, hd)
        v = v[:, :, None].expand(b, self.kv_heads, repeat, t, hd).reshape(b, self.heads, t, hd)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.heads * hd))


class DecoderLayer(nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int, hidden: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(d)
        self.self_attn = Attention(d, heads, kv_heads)
        self.post_attention_layernorm = RMSNorm(d)
        self.gate_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(
        self,
        layers: int = 32,
        d: int = 4096,
        heads: int = 32,
        kv_heads: int = 8,
        hidden: int = 14336,
        vocab: int = 128256,
    ) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(DecoderLayer(d, heads, kv_heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="v5p,v6e")
    parser.add_argument("--chips", default="8,64")
    parser.add_argument("--sharding", default="data,fsdp")
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--cache", default=None, help="figure cache (default: a new one)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from gpu2tpu.forecasting.forecast import forecast
    from gpu2tpu.views.format import format_bytes

    with torch.device("meta"):
        model = Llama(layers=args.layers).to(torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    cache = args.cache or tempfile.mkdtemp(prefix="gpu2tpu-forecast-llama-")
    print(
        f"Llama-style {params / 1e9:.2f}B parameters, bfloat16, sequence {args.seq}, AdamW; "
        f"{date.today()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; cache {cache}",
        flush=True,
    )
    rows = []
    for target in args.targets.split(","):
        for chips in (int(c) for c in args.chips.split(",")):
            for sharding in args.sharding.split(","):
                tokens = torch.empty(chips, args.seq, dtype=torch.long, device="meta")
                wall, cpu = time.perf_counter(), cpu_seconds()
                result = forecast(
                    model, (tokens, tokens), loss_fn=lm_loss, optimizer=optimizer,
                    targets=[target], chips=chips, sharding=sharding, cache=cache, progress=False,
                )  # fmt: skip
                wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
                t = result.targets[0]
                row = {
                    "target": t.label, "sharding": sharding, "status": t.status, "fits": t.fits,
                    "memory_per_chip": t.memory_per_chip, "usable": t.capacity_per_chip,
                    "breakdown": t.memory_breakdown,
                    "step_seconds": t.step_seconds, "bound": t.bound, "wall": wall, "cpu": cpu,
                    "extrapolation": t.extrapolation, "message": t.message,
                }  # fmt: skip
                rows.append(row)
                step = (
                    f"{t.step_seconds * 1e3:.0f} ms/step ({t.bound}-bound)"
                    if t.step_seconds
                    else ""
                )
                parts = t.memory_breakdown or {}
                held = (
                    f" (arguments {format_bytes(parts['argument'])}, temporaries "
                    f"{format_bytes(parts['temp'])})"
                    if "argument" in parts and "temp" in parts
                    else ""
                )
                print(
                    f"  {t.label:12s} {sharding:5s} {t.status:13s} {format_bytes(t.memory_per_chip):>10s} "
                    f"of {format_bytes(t.capacity_per_chip):>10s} per chip {step:28s} "
                    f"forecast {wall:6.1f} s wall {cpu:6.1f} s CPU{held}",
                    flush=True,
                )
    fits = [f"{r['target']} {r['sharding']}" for r in rows if r["fits"]]
    print(f"\nFits: {', '.join(fits) or 'none'}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
