"""Real code nobody here wrote: the rewrite over torch's own CUDA-heavy Python sources.

The whole of torch (2,187 files) is benchmarks/torch_sources.py; this runs the same checks on
the packages densest in CUDA idioms: every file that compiled still compiles, no new undefined
names (by the project's verifier and, as a second opinion, by `ruff check --select F821`),
and a second rewrite changes nothing.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpu2tpu.rewrite import verify
from gpu2tpu.rewrite.source import SourceError, rewrite_source

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
        if rewrite_source(new).new_text != new:
            failures.append(f"{name}: a second rewrite changes it again")
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
