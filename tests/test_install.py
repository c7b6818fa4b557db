"""Every install line in the README gives a working set, resolved from the registries.

The wheel is built from this checkout; each `pip install ...` line of the README's Install
section is run, with the wheel in place of the name `gpu2tpu`, into a fresh virtual
environment with no lock: pip resolves it against the registries as a user's pip would
(with this machine's pip configuration). Then, in that environment, `gpu2tpu doctor` must
find no problem, `gpu2tpu rewrite` must migrate a CUDA script, and where the line installs the
`notebook` and `forecast` extras a tiny forecast must compile for a TPU.

No line downgrades torch: where a line brings torch (the `notebook`, `forecast` and `tpu`
extras), the environment first gets the newest torch the registry has, as a user on current
torch has it, and the line must leave that torch as it was (a cap on torch anywhere in the
extras' requirements would make pip replace it, or refuse).

To spare the network, pip first downloads each line's resolution into one wheelhouse
(`pip download` resolves exactly as `pip install` does; files already there are reused) and
installs from it with `--no-index`. The wheelhouse is kept between runs in
$GPU2TPU_CI_CACHE (default ~/.cache/gpu2tpu-ci)/install-wheels. The lines run on several
xdist workers: each download holds an exclusive lock on the wheelhouse, since two pips saving
the same wheel at once break each other's copy (CI failed so with an empty wheelhouse: one
pip's chmod found the other's file gone); the installs, the slow part, run side by side.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CACHE = Path(os.environ.get("GPU2TPU_CI_CACHE", Path.home() / ".cache" / "gpu2tpu-ci"))
LOCK_TORCH = re.findall(r"^torch==(\S+)$", (ROOT / "requirements" / "dev.lock").read_text(), re.M)[
    0
]

pytestmark = pytest.mark.slow

CUDA_SCRIPT = """import torch

model = torch.nn.Linear(4, 2).cuda()
x = torch.randn(3, 4).to("cuda")
print(model(x).sum().item())
"""

TINY_FORECAST = """
import torch
import gpu2tpu

model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
batch = (torch.randn(8, 16), torch.randint(0, 4, (8,)))
fc = gpu2tpu.forecast(model, batch, loss_fn=torch.nn.functional.cross_entropy, targets=("v5e",))
print("FORECAST-OK", fc)
"""


def readme_install_lines(text: str) -> list[str]:
    """The `pip install` lines of the README's "## Install" section, comments removed."""
    section = text.split("\n## Install", 1)[1].split("\n## ", 1)[0]
    lines = []
    for raw in section.splitlines():
        command = raw.split("#", 1)[0].strip()
        if command.startswith("pip install "):
            lines.append(command)
    return lines


def test_the_readme_lists_install_lines() -> None:
    lines = readme_install_lines(README.read_text(encoding="utf-8"))
    assert lines and all("gpu2tpu" in line for line in lines)
    assert "pip install gpu2tpu" in lines  # the plain codemod install


def _requirement(line: str, wheel: Path) -> list[str]:
    """`pip install 'gpu2tpu[a,b]'` -> ['/path/gpu2tpu-...whl[a,b]'] (other words kept)."""
    words = shlex.split(line)[2:]
    out = []
    for word in words:
        match = re.fullmatch(r"gpu2tpu(\[[\w,]+\])?", word)
        out.append(f"{wheel}{match.group(1) or ''}" if match else word)
    return out


def _extras(line: str) -> set[str]:
    match = re.search(r"gpu2tpu\[([\w,]+)\]", line)
    return set(match.group(1).split(",")) if match else set()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # setuptools builds in the source's own build/ folder: two xdist workers building from
    # the checkout at once collide there ("File exists: ...dist-info"). Build from a copy of
    # what the wheel is made of.
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "gpu2tpu", source / "gpu2tpu", ignore=shutil.ignore_patterns("__pycache__")
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
        check=True,
        timeout=600,
    )
    [built] = out.glob("gpu2tpu-*.whl")
    return built


def test_the_wheel_ships_py_typed(wheel: Path) -> None:
    """PEP 561: without the marker, a user's type checker ignores gpu2tpu's annotations."""
    with zipfile.ZipFile(wheel) as built:
        assert "gpu2tpu/py.typed" in built.namelist()


def _run(cmd: list[str], cwd: Path, timeout: int = 1800) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(JAX_PLATFORMS="cpu", TPU_SKIP_MDS_QUERY="1")
    env.pop("PJRT_DEVICE", None)
    return subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on `path` (created if missing) for the block."""
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# The extras that bring torch (pyproject.toml): a line with one of them must keep the newest.
TORCH_EXTRAS = {"notebook", "forecast", "tpu"}


def _install(py: str, requirement: list[str], wheels: Path, cwd: Path, line: str) -> None:
    """Resolve `requirement` from the registries into the wheelhouse, then install it."""
    with _locked(wheels / ".lock"):
        fetched = _run([py, "-m", "pip", "download", "-q", "-d", str(wheels), *requirement], cwd)
    assert fetched.returncode == 0, f"{line}: pip download failed\n{fetched.stderr[-3000:]}"
    # --no-compile: the same files, without pip compiling torch's ~4,000 modules to bytecode.
    installed = _run(
        [py, "-m", "pip", "install", "-q", "--no-compile", "--no-index",
         "--find-links", str(wheels), *requirement],
        cwd,
    )  # fmt: skip
    assert installed.returncode == 0, f"{line}: pip install failed\n{installed.stderr[-3000:]}"


def _version_in(py: str, dist: str, cwd: Path) -> str:
    done = _run([py, "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"], cwd)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


# A fresh install of torch and its CUDA libraries took 9-10 min per line here (2026-12-01).
@pytest.mark.timeout(3000)
@pytest.mark.parametrize("line", readme_install_lines(README.read_text(encoding="utf-8")))
def test_each_readme_install_line_gives_a_working_set(
    line: str, wheel: Path, tmp_path: Path
) -> None:
    started = time.perf_counter()
    wheels = CACHE / "install-wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = str(venv / "bin" / "python")
    requirement = _requirement(line, wheel)

    newest_torch = None
    if _extras(line) & TORCH_EXTRAS:
        _install(py, ["torch"], wheels, tmp_path, line)  # the newest torch, as a user has it
        newest_torch = _version_in(py, "torch", tmp_path)
        # the registry's newest is at least the development lock's (no cap on this machine)
        assert Version(newest_torch).release >= Version(LOCK_TORCH).release, newest_torch
    _install(py, requirement, wheels, tmp_path, line)
    if newest_torch is not None:
        assert _version_in(py, "torch", tmp_path) == newest_torch, (
            f"{line} replaced torch {newest_torch} with {_version_in(py, 'torch', tmp_path)}"
        )

    gpu2tpu = str(venv / "bin" / "gpu2tpu")
    doctor = _run([gpu2tpu, "doctor"], tmp_path, timeout=600)
    assert doctor.returncode == 0 and "No problems found" in doctor.stdout, (
        f"{line}: gpu2tpu doctor\n{doctor.stdout}\n{doctor.stderr[-2000:]}"
    )

    script = tmp_path / "train.py"
    script.write_text(CUDA_SCRIPT, encoding="utf-8")
    rewrite = _run([gpu2tpu, "rewrite", str(script)], tmp_path, timeout=300)
    assert rewrite.returncode == 0, f"{line}: gpu2tpu rewrite\n{rewrite.stdout}{rewrite.stderr}"
    migrated = script.read_text(encoding="utf-8")
    assert ".cuda()" not in migrated and "torch.accelerator" in migrated

    if {"notebook", "forecast"} <= _extras(line):
        forecast = _run([py, "-c", TINY_FORECAST], tmp_path, timeout=1200)
        assert forecast.returncode == 0 and "FORECAST-OK" in forecast.stdout, (
            f"{line}: a tiny forecast\n{forecast.stdout[-2000:]}\n{forecast.stderr[-3000:]}"
        )
    print(f"{line}: {time.perf_counter() - started:.0f} s")
