"""Real code nobody here wrote: the rewrite over torch's own CUDA-heavy Python sources.

The whole of torch (2,187 files) is benchmarks/torch_sources.py; this runs the same checks on
the packages densest in CUDA idioms: every file that compiled still compiles, no new undefined
names (by the project's verifier and, as a second opinion, by `ruff check --select F821`),
and a second rewrite changes nothing and reports what the first left (the rewrite passes its
own check); no file where a CUDA device string reaches a device argument is called clean.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import device_flow_oracle
import pytest
import self_check

from gpu2tpu.rewrite.core import verify
from gpu2tpu.rewrite.core.model import Options
from gpu2tpu.rewrite.core.source import SourceError, rewrite_source

PACKAGES = ("cuda", "amp", "backends/cuda", "nn/parallel", "distributed/elastic/utils")


def _torch_root() -> Path:
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None, "torch is a test dependency"
    return Path(spec.origin).parent


def _ruff_undefined(texts: list[str], folder: Path) -> list[set[str]]:
    for i, text in enumerate(texts):
        (folder / f"f{i}.py").write_text(text, encoding="utf-8")
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent))
    assert ruff is not None, "ruff is a development dependency"
    proc = subprocess.run(
        [ruff, "check", "--isolated", "--no-cache", "--select", "F821", "--output-format", "json",
         str(folder)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    found: list[set[str]] = [set() for _ in texts]
    for item in json.loads(proc.stdout or "[]"):
        found[int(Path(item["filename"]).stem[1:])].add(item["message"])
    return found


@pytest.mark.slow
def test_cuda_heavy_torch_packages(tmp_path: Path) -> None:
    root = _torch_root()
    files = sorted(p for pkg in PACKAGES for p in (root / pkg).rglob("*.py"))
    assert len(files) > 40
    old_texts, new_texts, names, failures = [], [], [], []
    for path in files:
        text = path.read_text(encoding="utf-8")
        try:
            new = rewrite_source(text).new_text
        except SourceError:
            continue
        if new == text:
            continue
        name = path.relative_to(root)
        if verify.facts(text).error is None and verify.facts(new).error is not None:
            failures.append(f"{name}: no longer compiles")
        problems = verify.new_problems(verify.facts(text), new)
        failures += [f"{name}:{p.line}: {p.reason}" for p in problems]
        # one run reaches the fixed point and passes its own check (issue 27, §3)
        disagree = self_check.compare(rewrite_source(text), rewrite_source(new))
        failures += [f"{name}: {d}" for d in disagree]
        failures += [f"{name}: {d}" for d in self_check.check_disagreements(text)]  # issue 32
        old_texts.append(text)
        new_texts.append(new)
        names.append(str(name))
    assert len(new_texts) >= 10, "the rewrite should change these packages"
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    before = _ruff_undefined(old_texts, tmp_path / "old")
    after = _ruff_undefined(new_texts, tmp_path / "new")
    for name, b, a in zip(names, before, after, strict=True):
        new_names = {m.split("`")[1] for m in a} - {m.split("`")[1] for m in b}
        if new_names:
            failures.append(f"{name}: ruff finds new undefined names {sorted(new_names)}")
    assert failures == []


def _called_clean(text: str, flows: list[tuple[int, int, str]]) -> list[str]:
    """The flows `check` reports neither at the string nor at its use."""
    lines = {f.line for f in rewrite_source(text, Options(fix=False)).findings}
    return [f"{a}->{b} ({name})" for a, b, name in flows if a not in lines and b not in lines]


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_no_torch_file_with_a_cuda_device_flow_is_called_clean() -> None:
    """Issue 27, §1: every file of torch where a CUDA device string reaches a device argument
    through a variable (by an independent, narrower reading: tests/device_flow_oracle.py)
    draws a finding at the string or at its use."""
    root = _torch_root()
    missed, seen = [], 0
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if "cuda" not in text:
            continue
        try:
            flows = device_flow_oracle.device_flows(ast.parse(text))
        except (SyntaxError, ValueError, RecursionError):
            continue
        if flows:
            seen += 1
            missed += [f"{path.relative_to(root)}: {m}" for m in _called_clean(text, flows)]
    assert seen >= 3, "torch holds such flows: the reading should find them"
    assert missed == []


# A few of torch's CUDA-heavy files, small enough for the fast tier.
SAMPLE = ("cuda/random.py", "cuda/nvtx.py", "amp/autocast_mode.py", "backends/cuda/__init__.py")


@pytest.mark.parametrize("name", SAMPLE)
def test_the_rewrite_of_torch_files_passes_its_own_check(name: str) -> None:
    """Issue 27, §3, on real code: one run reaches the fixed point and leaves the findings a
    second run leaves (tests/self_check.py)."""
    text = (_torch_root() / name).read_text(encoding="utf-8")
    assert self_check.disagreements(text) == []
    assert self_check.check_disagreements(text) == []  # issue 32: check tells rewrite's story


def test_the_whole_torch_benchmark_times_the_net_it_wraps() -> None:
    """benchmarks/torch_sources.py wraps the safety net to time it: run its pass on two CUDA
    files (the wrapper once fell behind the net's signature and the benchmark crashed)."""
    from script_module import load_script

    from gpu2tpu.rewrite.core import net

    bench = load_script(Path(__file__).parent.parent / "benchmarks" / "torch_sources.py",
                        "torch_sources_bench")  # fmt: skip
    root = _torch_root()
    real = net.verified
    files = [root / "cuda" / "random.py", root / "cuda" / "memory.py"]
    out, spent, in_net, broken = bench.rewrite_all(files, root)
    assert net.verified is real
    assert set(out) == {"cuda/random.py", "cuda/memory.py"}
    assert 0 < in_net < spent and broken == []
    for old, new, _ in out.values():
        assert old != new and bench.compiles(new)
    # and the peak memory of each worker of a real `rewrite --diff -j 2` (two files may need
    # one worker; the pool's worker loop, wrapped to read its peak, is called as the pool does)
    peaks = bench.peak_memory(files, root, 2)
    assert 1 <= len(peaks) <= 2 and all(p > 10_000 for p in peaks)  # KiB: Python alone is more
