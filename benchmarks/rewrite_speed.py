"""How fast are `gpu2tpu check` and `gpu2tpu rewrite` on a large tree, against libcst itself?

Trees, each measured side by side in one run:
  generated  3,000 files (10% with CUDA idioms, the rest ordinary PyTorch or plain Python);
  torch      a copy of real sources: torch's cuda, amp, nn, backends, optim, utils/data and
             distributed/fsdp packages (CUDA idioms among much that is not), from the
             installed torch;
  diffusers  diffusers 0.40.0 (issue 36): by default the sdist from PyPI (its `src/`, 1,033
             files; downloaded once into $GPU2TPU_BENCH_CACHE, default
             ~/.cache/gpu2tpu-bench, and checked against its sha256), or with `--diffusers DIR`
             a checkout of the tag v0.40.0 (commit d035dcd7cc7c88e0a154609b62887d50bba9fdc2,
             2,089 files with its tests and examples: the issue's tree); floor, floor-c and
             `check --jobs 1` only;
  long       one module with a CUDA idiom on every line (tests/fix_every_line.py) of 20,000
             and 50,000 lines (`--long`), and of half as many (issue 33): check and rewrite
             against the floor, against the module of half the length (linear: 2.0), and the
             command's peak memory.
For each tree of files:
  floor    libcst parsing and regenerating the files the prefilter lets through (those holding
           a token of some rule: what `check` must look at), in this process;
  floor-c  the same for the files holding `cuda` only (the issue's wording of the floor);
  check    `gpu2tpu check --jobs 1` on the whole tree (a real subprocess);
  parse    (diffusers) what check parses before any rule runs, in this process: Python's
           parse, the statement plan, libcst's parse of the statements kept
           (`source.parse_for_rules`), the part of check no faster rule can remove;
  check2   `gpu2tpu check --jobs 2`;
  rewrite  `gpu2tpu rewrite --jobs 1` on a fresh copy of the tree.
And `gpu2tpu --version` (start-up; whether torch was imported, from `python -X importtime`).
Prints ratios of wall time and of CPU time (the command's and its workers'; machines here are
shared and noisy, and CPU time is less disturbed by other work than wall time; the load
average is printed before and after). Goals: check/floor <= 1.0 (stretch 0.5), rewrite/floor
<= 1.2, jobs1/jobs2 >= 1.7 on two free cores, --version under 100 ms without torch; diffusers'
check/floor-c <= 1.3 (issue 36); the long module's time at n against n/2 about 2 (linear).

    python benchmarks/rewrite_speed.py [--files 3000] [--repeat 3]
        [--trees generated,torch,diffusers,long] [--diffusers DIR] [--long 20000,50000]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fix_every_line import module_text  # the tests' module (sys.path above)

DIFFUSERS_SDIST = "diffusers-0.40.0.tar.gz"
DIFFUSERS_SHA256 = "49f112ce52ff6d332ab68afec01f79a53e6489b42cb69104444c98b4a2f64af8"

TORCH_PACKAGES = ("cuda", "amp", "nn", "backends", "optim", "utils/data", "distributed/fsdp")
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


def copy_torch(root: Path) -> None:
    """The torch packages of `TORCH_PACKAGES` (their .py files) under `root`."""
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None, "torch is installed with the project"
    torch_root = Path(spec.origin).parent
    for package in TORCH_PACKAGES:
        for path in (torch_root / package).rglob("*.py"):
            target = root / "torch" / path.relative_to(torch_root)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)


def diffusers_tree(given: Path | None) -> Path:
    """The diffusers tree to measure: `given`, else the pinned sdist's files (fetched with
    pip into the cache when missing, its sha256 checked, unpacked once)."""
    if given is not None:
        if not given.is_dir():
            raise SystemExit(f"--diffusers {given}: not a folder")
        return given
    cache = Path(os.environ.get("GPU2TPU_BENCH_CACHE") or Path.home() / ".cache/gpu2tpu-bench")
    unpacked = cache / DIFFUSERS_SDIST.removesuffix(".tar.gz")
    if unpacked.is_dir():
        return unpacked
    sdist = cache / DIFFUSERS_SDIST
    if not sdist.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        name, version = DIFFUSERS_SDIST.removesuffix(".tar.gz").split("-")
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
             "-d", str(cache), f"{name}=={version}"],
            capture_output=True, text=True,
        )  # fmt: skip
        if proc.returncode != 0 or not sdist.is_file():
            raise SystemExit(f"pip could not download {DIFFUSERS_SDIST}:\n{proc.stderr}")
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != DIFFUSERS_SHA256:
        raise SystemExit(f"{sdist}: sha256 {digest}, not the pinned {DIFFUSERS_SHA256}")
    part = cache / (unpacked.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        tar.extractall(part, filter="data")
    part.rename(unpacked)
    return unpacked


def floor_files(root: Path) -> tuple[list[Path], list[Path]]:
    """The files `check` parses (a token of some rule) and those holding `cuda`."""
    from gpu2tpu.rewrite.core.model import Options
    from gpu2tpu.rewrite.core.source import prefilter_tokens
    from gpu2tpu.rewrite.files.engine import holds_token

    tokens = prefilter_tokens(Options())
    parsed, cuda = [], []
    for path in sorted(root.rglob("*.py")):
        data = path.read_bytes()
        if holds_token(data, tokens):
            parsed.append(path)
        if b"cuda" in data:
            cuda.append(path)
    return parsed, cuda


Timing = tuple[float, float]  # (wall seconds, CPU seconds)


def floor_seconds(files: list[Path], collector: bool = False) -> Timing:
    """libcst's parse and codegen of `files`, with Python's default garbage collection, or
    (`collector`) with the thresholds the codemod's runs set (rewrite/files/collector.py)."""
    import libcst as cst

    from gpu2tpu.rewrite.files.collector import fewer_collections

    with fewer_collections() if collector else contextlib.nullcontext():
        start, cpu = time.perf_counter(), time.process_time()
        for path in files:
            module = cst.parse_module(path.read_text(encoding="utf-8"))
            _ = module.code
        return time.perf_counter() - start, time.process_time() - cpu


def parse_seconds(files: list[Path]) -> Timing:
    """What `check` parses of `files` before any rule runs (`source.parse_for_rules`: Python's
    parse, the statement plan, libcst's parse of the statements it keeps), in this process
    with the garbage collection thresholds check runs with: a floor under check that no faster
    rule can lower."""
    from gpu2tpu.rewrite.core.model import Options
    from gpu2tpu.rewrite.core.source import SourceError, parse_for_rules
    from gpu2tpu.rewrite.files.collector import fewer_collections

    options = Options(fix=False)
    with fewer_collections():
        start, cpu = time.perf_counter(), time.process_time()
        for path in files:
            with contextlib.suppress(SourceError):
                parse_for_rules(path.read_text(encoding="utf-8"), options)
        return time.perf_counter() - start, time.process_time() - cpu


# The commands run as an installed tool does: with its modules' bytecode cached (pip writes
# it at install). A shell with PYTHONDONTWRITEBYTECODE set would recompile gpu2tpu's ~40
# modules in every run (about 0.1 s each time, not the tool's work); the first run writes it.
_COMMAND_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cli_seconds(*args: str) -> Timing:
    """Wall and CPU seconds (the command and its worker processes) of one `gpu2tpu` run.

    It runs in the temporary folder, as in a project of its own: from this repository, the
    tree would inherit gpu2tpu's own `torch>=2.6` pin as its target-torch, and the rules
    whose fixes need a newer torch would run a second, report-only pass over every file.
    """
    start, cpu = time.perf_counter(), _children_cpu()
    proc = subprocess.run(
        [sys.executable, "-m", "gpu2tpu", *args],
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),
        env=_COMMAND_ENV,
    )
    elapsed, used = time.perf_counter() - start, _children_cpu() - cpu
    if proc.returncode not in (0, 1):
        raise SystemExit(f"gpu2tpu {' '.join(args)} failed:\n{proc.stderr}")
    return elapsed, used


def cli_peak(*args: str) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds and peak memory (MiB, of the command or a worker of it) of
    one `gpu2tpu` run: `wait4` reports the child's own usage and its children's."""
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpu2tpu", *args],
            stdout=subprocess.DEVNULL,
            stderr=err,
            cwd=tempfile.gettempdir(),
            env=_COMMAND_ENV,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode not in (0, 1):
            err.seek(0)
            raise SystemExit(f"gpu2tpu {' '.join(args)} failed:\n{err.read().decode()}")
    return elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def measure_long(sizes: list[int], scratch: Path, repeat: int) -> None:
    """One module with a CUDA idiom on every line, at each size and at half of it (issue 33):
    check and rewrite against libcst's parse and codegen of the same text, and against the
    module of half the length (a cost linear in the length makes that 2.0)."""
    import libcst as cst

    print("\nlong: one module, a CUDA idiom on every line (tests/fix_every_line.py)")
    folder = scratch / "long"
    folder.mkdir(exist_ok=True)
    for n in sizes:
        runs: dict[tuple[int, str], list[tuple[float, float, float]]] = {}
        for size in (n // 2, n):
            text = module_text(size)
            path = folder / f"every_line_{size}.py"
            path.write_text(text)
            for _ in range(repeat):
                start, cpu = time.perf_counter(), time.process_time()
                _ = cst.parse_module(text).code
                floor = (time.perf_counter() - start, time.process_time() - cpu, 0.0)
                runs.setdefault((size, "floor"), []).append(floor)
                check = cli_peak("check", "--jobs", "1", "-q", str(path))
                runs.setdefault((size, "check"), []).append(check)
                path.write_text(text)
                rewrite = cli_peak("rewrite", "--jobs", "1", "-q", str(path))
                runs.setdefault((size, "rewrite"), []).append(rewrite)
                path.write_text(text)
        med = {
            k: tuple(statistics.median(r[i] for r in v) for i in range(3)) for k, v in runs.items()
        }
        f, h = med[(n, "floor")], med[(n // 2, "floor")]
        print(f"  {n:,} lines: floor (libcst parse+codegen) {f[0]:.2f} s wall, {f[1]:.2f} s CPU;"
              f" {n // 2:,} lines: {h[0]:.2f} s")  # fmt: skip
        for mode in ("check", "rewrite"):
            m, half = med[(n, mode)], med[(n // 2, mode)]
            print(f"    {mode} --jobs 1: {m[0]:.2f} s wall, {m[1]:.2f} s CPU, peak {m[2]:.0f} MiB;"
                  f" /floor {m[0] / f[0]:.2f} ({m[1] / f[1]:.2f} CPU);"
                  f" {n:,}/{n // 2:,} lines {m[0] / half[0]:.2f} ({m[1] / half[1]:.2f} CPU),"
                  f" floor's {f[0] / h[0]:.2f}")  # fmt: skip


def rewrite_seconds(tree: Path, scratch: Path) -> Timing:
    """`gpu2tpu rewrite --jobs 1` on a fresh copy of `tree` (the copy is not timed)."""
    copy = scratch / "copy"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(tree, copy)
    return cli_seconds("rewrite", "--jobs", "1", "-q", str(copy))


def startup() -> tuple[float, bool]:
    """Seconds of `gpu2tpu --version` (median of 5), and whether it imported torch."""
    times = [cli_seconds("--version")[0] for _ in range(5)]
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gpu2tpu", "--version"],
        capture_output=True,
        text=True,
        env=_COMMAND_ENV,
    )
    torch = bool(re.search(r"\|\s+torch$", proc.stderr, re.MULTILINE))
    return statistics.median(times), torch


def _median(timings: list[Timing]) -> Timing:
    return statistics.median(t[0] for t in timings), statistics.median(t[1] for t in timings)


def measure_check(name: str, tree: Path, repeat: int) -> None:
    """`check --jobs 1` alone against both floors (a large real tree: issue 36)."""
    parsed, cuda = floor_files(tree)
    total = sum(1 for _ in tree.rglob("*.py"))
    print(f"\n{name} ({tree}): {total} files, {len(parsed)} hold a rule's token,"
          f" {len(cuda)} hold `cuda`")  # fmt: skip
    kinds = ("floor", "floor-c", "check", "floor-c-gc", "parse")
    runs: dict[str, list[Timing]] = {k: [] for k in kinds}
    for _ in range(repeat):
        runs["floor"].append(floor_seconds(parsed))
        runs["floor-c"].append(floor_seconds(cuda))
        runs["check"].append(cli_seconds("check", "--jobs", "1", "-q", str(tree)))
        runs["floor-c-gc"].append(floor_seconds(cuda, collector=True))
        runs["parse"].append(parse_seconds(parsed))
    (f, fcpu), (fc, fccpu), (o, ocpu), (fg, fgcpu), (p, pcpu) = (_median(runs[k]) for k in kinds)
    print(f"  floor {f:.2f} s wall ({fcpu:.2f} s CPU), floor-c {fc:.2f} s ({fccpu:.2f} s),"
          f" check --jobs 1 {o:.2f} s ({ocpu:.2f} s)")  # fmt: skip
    print(f"  check/floor-c: {o / fc:.2f} ({ocpu / fccpu:.2f} CPU)   goal <= 1.3;"
          f"  check/floor: {o / f:.2f} ({ocpu / fcpu:.2f} CPU)")  # fmt: skip
    # The floors above run with Python's default garbage collection, as libcst does alone;
    # check runs with fewer collections, which speed libcst's parse as well: like for like.
    print(f"  floor-c with check's garbage collection: {fg:.2f} s ({fgcpu:.2f} s CPU);"
          f" check/that floor: {o / fg:.2f} ({ocpu / fgcpu:.2f} CPU)")  # fmt: skip
    # What check parses before any rule runs, in this process: what no faster rule removes.
    print(f"  check's parse alone (Python's, the plan, libcst's of the statements kept): {p:.2f} s"
          f" ({pcpu:.2f} s CPU) = {p / fg:.2f}x that floor ({pcpu / fgcpu:.2f} CPU);"
          f" the rules and the rest: {o - p:.2f} s")  # fmt: skip


def measure(name: str, tree: Path, scratch: Path, repeat: int) -> None:
    parsed, cuda = floor_files(tree)
    total = sum(1 for _ in tree.rglob("*.py"))
    print(f"\n{name}: {total} files, {len(parsed)} hold a rule's token, {len(cuda)} hold `cuda`")
    runs: dict[str, list[Timing]] = {k: [] for k in ("floor", "floor-c", "check", "check2", "rw")}
    for _ in range(repeat):
        runs["floor"].append(floor_seconds(parsed))
        runs["floor-c"].append(floor_seconds(cuda))
        runs["check"].append(cli_seconds("check", "--jobs", "1", "-q", str(tree)))
        runs["check2"].append(cli_seconds("check", "--jobs", "2", "-q", str(tree)))
        runs["rw"].append(rewrite_seconds(tree, scratch))
    (f, fcpu), (fc, fccpu), (o, ocpu), (t, _), (r, rcpu) = (_median(v) for v in runs.values())
    print(
        f"  floor (libcst parse+codegen of {len(parsed)} files): {f:.2f} s wall, {fcpu:.2f} s CPU"
    )
    print(
        f"  floor-c (of the {len(cuda)} files holding `cuda`): {fc:.2f} s wall, {fccpu:.2f} s CPU"
    )
    print(f"  check --jobs 1: {o:.2f} s wall, {ocpu:.2f} s CPU   check --jobs 2: {t:.2f} s wall")
    print(f"  rewrite --jobs 1: {r:.2f} s wall, {rcpu:.2f} s CPU")
    print("  ratios, wall (CPU, less sensitive to a loaded machine):")
    print(f"    check/floor:   {o / f:.2f} ({ocpu / fcpu:.2f})   goal <= 1.0, stretch 0.5;"
          f"  check/floor-c: {o / fc:.2f} ({ocpu / fccpu:.2f})")  # fmt: skip
    print(f"    rewrite/floor: {r / f:.2f} ({rcpu / fcpu:.2f})   goal <= 1.2;"
          f"  rewrite/floor-c: {r / fc:.2f} ({rcpu / fccpu:.2f})")  # fmt: skip
    print(f"    speed-up jobs1/jobs2: {o / t:.2f}x   goal >= 1.7 on two free cores")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--trees", default="generated,torch,diffusers,long")
    parser.add_argument("--diffusers", type=Path, help="a diffusers tree (default: the sdist)")
    parser.add_argument("--long", default="20000,50000", help="the long module's sizes")
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
          f" ({os.cpu_count()} cores)")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        (base / "warm-up").mkdir()
        (base / "warm-up" / "a.py").write_text("import torch\nx = torch.ones(1).cuda()\n")
        cli_seconds("rewrite", "--jobs", "1", "-q", str(base / "warm-up"))  # writes bytecode
        for name in args.trees.split(","):
            if name == "diffusers":
                measure_check(name, diffusers_tree(args.diffusers), args.repeat)
                continue
            if name == "long":
                measure_long([int(n) for n in args.long.split(",")], base, args.repeat)
                continue
            tree = base / name
            tree.mkdir()
            if name == "generated":
                build_tree(tree, args.files)
            elif name == "torch":
                copy_torch(tree)
            else:
                raise SystemExit(f"unknown tree {name!r} (generated, torch, diffusers, long)")
            measure(name, tree, base, args.repeat)
    seconds, torch = startup()
    print(f"\ngpu2tpu --version: {seconds * 1000:.0f} ms (goal < 100 ms); "
          f"imports torch: {'yes' if torch else 'no'}")  # fmt: skip
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
