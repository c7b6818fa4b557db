"""Forecast a GPT-2-sized training step (124M parameters, batch 8 x 1024, AdamW) on TPUs.

Measures what a user waits for: the compile time per target on this machine with a cold
figure cache, the time of the same forecast again (read from the cache), and prints the
forecast table. The model is built on the meta device, so no weight is allocated.

    .venv/bin/python benchmarks/forecast_gpt.py                     # v5e, v6e, v5p, tpu7x
    .venv/bin/python benchmarks/forecast_gpt.py --targets v5e --search --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F


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
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(
            nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2 small: 12 layers, d=768, 12 heads, vocab 50257, 1024 positions, tied embeddings."""

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


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="v5e,v6e,v5p,tpu7x")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--search", action="store_true", help="also search for the largest batch")
    parser.add_argument("--budget", type=float, default=300.0, help="search seconds per target")
    parser.add_argument("--json", type=Path, help="write the forecast and timings here")
    args = parser.parse_args()

    from rich.console import Console

    from gpu2tpu.profile.forecast import forecast

    with torch.device("meta"):
        model = GPT(seq=args.seq)
    params = sum(p.numel() for p in model.parameters())
    batch = (
        torch.empty(args.batch, args.seq, dtype=torch.long, device="meta"),
        torch.empty(args.batch, args.seq, dtype=torch.long, device="meta"),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    cache = Path(tempfile.mkdtemp(prefix="gpu2tpu-forecast-bench-"))
    options = dict(
        loss_fn=lm_loss,
        optimizer=optimizer,
        targets=args.targets.split(","),
        batch_search=args.search,
        time_budget_s=args.budget,
        cache=cache,
    )
    console = Console(width=None if Console().is_terminal else 180)  # a log file gets it all
    console.print(
        f"GPT-2 small: {params / 1e6:.1f}M parameters, batch {args.batch} x {args.seq}, AdamW; "
        f"{os.cpu_count()} CPUs; cold cache in {cache}"
    )
    t0 = time.perf_counter()
    cold = forecast(model, batch, **options)
    cold_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    warm = forecast(model, batch, **options)
    warm_s = time.perf_counter() - t0

    console.print(cold)
    console.print("\n[bold]Timings[/bold] (seconds on this machine)")
    for first, second in zip(cold.targets, warm.targets, strict=True):
        search = f", search {first.search_seconds:.1f} s" if args.search else ""
        console.print(
            f"  {first.label:8s} compile {first.compile_seconds:6.1f} s{search}; "
            f"again from the cache {second.compile_seconds + second.search_seconds:5.2f} s"
            f"{' (cached)' if second.cached else ''}"
        )
    console.print(f"  whole forecast: {cold_s:.1f} s cold, {warm_s:.1f} s again with the cache")
    if args.json:
        data = {
            "parameters": params,
            "cold_seconds": cold_s,
            "warm_seconds": warm_s,
            "cpus": os.cpu_count(),
            "forecast": json.loads(cold.to_json()),
            "warm_targets": [t.to_dict() for t in warm.targets],
        }
        args.json.write_text(json.dumps(data, indent=2))


if __name__ == "__main__":
    main()
