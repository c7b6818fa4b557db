"""How fast is `gpu2tpu check` on a large tree, against the floor of libcst itself?

Builds 3,000 generated files (10% with CUDA idioms, the rest ordinary PyTorch or plain
Python), then times, in one run, side by side:
  floor   libcst parsing and regenerating only the 10% files that need it, one process;
  check   `gpu2tpu check --jobs 1` on the whole tree (a real subprocess);
  check2  `gpu2tpu check --jobs 2`;
  version `gpu2tpu --version`.
Prints ratios (machines here are shared and noisy: absolute times are not stable).
Goals: check/floor <= 1.5; jobs1/jobs2 >= 1.7 (on 2 free cores); --version well under 0.5 s.

    python benchmarks/rewrite_speed.py [--files 3000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CUDA_BODY = """import torch
import torch.nn as nn

device = "cuda" if torch.cuda.is_available() else "cpu"


class Block{i}(nn.Module):
    def __init__(self, dim: int = {dim}) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, dim * 4)
        self.fc2 = nn.Linear(dim * 4, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


def build(n_blocks: int = {blocks}):
    model = nn.Sequential(*[Block{i}() for _ in range(n_blocks)]).cuda()
    torch.cuda.synchronize()
    x = torch.randn(8, {dim}, device="cuda")
    return model, x.to(device)
"""
TORCH_BODY = '''import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention{i}(nn.Module):
    """Multi-head attention, {dim} wide."""

    def __init__(self, dim: int = {dim}, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.proj(y)


def init_weights(module: nn.Module, std: float = {std}) -> None:
    for p in module.parameters():
        if p.dim() > 1:
            nn.init.normal_(p, mean=0.0, std=std)
'''
PLAIN_BODY = '''"""Configuration helpers, module {i}."""

import dataclasses
import json
from pathlib import Path


@dataclasses.dataclass
class Config{i}:
    name: str = "run-{i}"
    lr: float = {std}
    steps: int = {blocks}
    tags: tuple[str, ...] = ("a", "b")

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(dataclasses.asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> "Config{i}":
        return cls(**json.loads(path.read_text()))


def merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for key, value in b.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and key in out else value
    return out
'''


def build_tree(root: Path, n: int, seed: int = 0) -> list[Path]:
    rng = random.Random(seed)
    cuda_files = []
    for i in range(n):
        params = {"i": i, "dim": rng.choice([64, 128, 256]), "blocks": rng.randint(2, 12),
                  "std": rng.choice([0.02, 0.01, 0.1])}  # fmt: skip
        if i % 10 == 0:
            body, target = CUDA_BODY, cuda_files
        elif i % 10 < 6:
            body, target = TORCH_BODY, None
        else:
            body, target = PLAIN_BODY, None
        folder = root / f"pkg{i // 100:02d}"
        folder.mkdir(exist_ok=True)
        path = folder / f"mod{i:04d}.py"
        path.write_text(body.format(**params))
        if target is not None:
            target.append(path)
    return cuda_files


def floor_seconds(files: list[Path]) -> float:
    import libcst as cst

    start = time.perf_counter()
    for path in files:
        module = cst.parse_module(path.read_text())
        _ = module.code
    return time.perf_counter() - start


def cli_seconds(*args: str) -> float:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "gpu2tpu", *args], capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise SystemExit(f"gpu2tpu {' '.join(args)} failed:\n{proc.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cuda_files = build_tree(root, args.files)
        print(f"tree: {args.files} files, {len(cuda_files)} with CUDA idioms")
        floor, one, two, version = [], [], [], []
        for _ in range(args.repeat):
            floor.append(floor_seconds(cuda_files))
            one.append(cli_seconds("check", "--jobs", "1", "-q", str(root)))
            two.append(cli_seconds("check", "--jobs", "2", "-q", str(root)))
            version.append(cli_seconds("--version"))
        empty = [cli_seconds("check", "-q", "--jobs", "1", str(root / "pkg00" / "mod0001.py"))
                 for _ in range(args.repeat)]  # fmt: skip
    f, o, t, v, e = (statistics.median(x) for x in (floor, one, two, version, empty))
    print(f"floor (libcst parse+codegen of {len(cuda_files)} files): {f:.2f} s")
    print(f"check --jobs 1: {o:.2f} s   (start-up alone, one clean file: {e:.2f} s)")
    print(f"check --jobs 2: {t:.2f} s")
    print(f"ratio check/floor: {o / f:.2f}   (goal <= 1.5)")
    print(f"ratio check/floor without interpreter start-up: {(o - e) / f:.2f}")
    print(f"speed-up jobs1/jobs2: {o / t:.2f}x   (goal >= 1.7)")
    print(f"gpu2tpu --version: {v * 1000:.0f} ms (goal well under 500 ms)")


if __name__ == "__main__":
    main()
