"""STAND-IN distribution metadata for the doctor's version checks; not real installs.

Each set below is a list of distributions as their `*.dist-info/METADATA` would declare them.
`build_site(directory, name)` writes the set as `*.dist-info` folders with only a METADATA
file, so `importlib.metadata.distributions(path=[site])` reads them exactly as it reads a
real site-packages; nothing is importable from the site. The `Requires-Dist` and
`Requires-Python` lines copy what the real wheels declare (torch_tpu 0.2.0 from PyPI, jax
0.10.2, torchax 0.0.13, optax 0.2.8), so the rules under test are the real ones; only the
combinations are staged. Every Summary line says STAND-IN.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StandInDistribution:
    name: str
    version: str
    requires: tuple[str, ...] = ()
    requires_python: str | None = None


def _torch(version: str) -> StandInDistribution:
    return StandInDistribution("torch", version, ("filelock", "sympy>=1.13.3"), ">=3.10")


def _jax(version: str, jaxlib_range: str, libtpu_pin: str) -> StandInDistribution:
    return StandInDistribution(
        "jax",
        version,
        (
            f"jaxlib{jaxlib_range}",
            "numpy>=2.0",
            f'jaxlib<={version},>={version}; extra == "tpu"',
            f'libtpu=={libtpu_pin}; extra == "tpu"',
            'requests; extra == "tpu"',
        ),
        ">=3.11",
    )


# Word for word the METADATA of the released wheel (tests/test_torchtpu_contract.py compares).
TORCH_TPU_020 = StandInDistribution(
    "torch_tpu",
    "0.2.0",
    (
        "numpy>=2",
        "absl-py>=2",
        "libtpu>=0.0.50",
        "portpicker>=1.6",
        "tensorboard>=2.20",
        "frozendict>=2",
        "immutabledict>=4",
        "pyzmq>=27",
        "torch>=2.11.0,<=2.15.0",
    ),
    ">=3.11",
)
TORCHAX_0013 = StandInDistribution(
    "torchax",
    "0.0.13",
    ('jax[cpu]>=0.6.2; extra == "cpu"', 'jax[tpu]; extra == "tpu"'),
    ">=3.11",
)
JAX_0102 = _jax("0.10.2", "<=0.10.2,>=0.10.1", "0.0.42.*")
JAXLIB_0102 = StandInDistribution("jaxlib", "0.10.2", ("numpy>=2.0",), ">=3.11")
TORCH_XLA_290 = StandInDistribution(
    "torch_xla", "2.9.0", ("absl-py>=1.0.0", 'libtpu==0.0.21; extra == "tpu"'), ">=3.10"
)

STANDIN_SETS: dict[str, tuple[StandInDistribution, ...]] = {
    # TorchTPU on a TPU VM, every declared range satisfied.
    "torchtpu_matching": (
        _torch("2.12.1"),
        TORCH_TPU_020,
        StandInDistribution("libtpu", "0.0.52", (), ">=3.11"),
    ),
    # torchax on JAX with the libtpu that jax[tpu] 0.10.2 pins.
    "torchax_matching": (
        _torch("2.12.1"),
        TORCHAX_0013,
        JAX_0102,
        JAXLIB_0102,
        StandInDistribution("libtpu", "0.0.42.1", (), ">=3.11"),
    ),
    # PyTorch/XLA 2.9 with its torch and bundled libtpu.
    "xla_matching": (
        _torch("2.9.0"),
        TORCH_XLA_290,
        StandInDistribution("libtpu", "0.0.21", (), ">=3.10"),
    ),
    # torch below torch_tpu 0.2.0's range (torch<=2.15,>=2.11).
    "torchtpu_torch_too_old": (
        _torch("2.10.0"),
        TORCH_TPU_020,
        StandInDistribution("libtpu", "0.0.52", (), ">=3.11"),
    ),
    # torch 2.16 with torchax 0.0.13 (past the newest torch gpu2tpu's layer is tested with)
    # and torch_tpu (past its torch range): the fix must suit both.
    "torchax_torch_216_with_torchtpu": (
        _torch("2.16.0"),
        TORCH_TPU_020,
        StandInDistribution("libtpu", "0.0.52", (), ">=3.11"),
        TORCHAX_0013,
        JAX_0102,
        JAXLIB_0102,
    ),
    # torch_xla 2.9 next to torch 2.12: different minors.
    "xla_torch_minor_mismatch": (
        _torch("2.12.1"),
        TORCH_XLA_290,
    ),
    # jaxlib behind jax's declared range.
    "jaxlib_behind_jax": (
        JAX_0102,
        StandInDistribution("jaxlib", "0.9.0", ("numpy>=2.0",), ">=3.11"),
    ),
    # torchax without jax, and torch_tpu without libtpu: required packages missing.
    "required_missing": (
        _torch("2.12.1"),
        TORCHAX_0013,
        TORCH_TPU_020,
    ),
}


def _metadata(dist: StandInDistribution) -> str:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {dist.name}",
        f"Version: {dist.version}",
        f"Summary: STAND-IN for {dist.name} {dist.version}, written by gpu2tpu's tests",
    ]
    if dist.requires_python:
        lines.append(f"Requires-Python: {dist.requires_python}")
    lines += [f"Requires-Dist: {req}" for req in dist.requires]
    return "\n".join(lines) + "\n"


def build_site(directory: Path, name: str) -> Path:
    """Write stand-in set `name` as `*.dist-info` folders under `directory`; return the site."""
    site = directory / f"standin-site-{name}"
    site.mkdir(parents=True)
    for dist in STANDIN_SETS[name]:
        info = site / f"{dist.name}-{dist.version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(_metadata(dist), encoding="utf-8")
    return site
