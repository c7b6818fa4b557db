"""Where the code runs: a Colab or Kaggle runtime, a Cloud TPU VM, a GPU machine or the CPU.

Everything is read from environment variables and the file system (device nodes, the PCI bus,
the NVIDIA driver's /proc entries) without importing torch, jax or a TPU runtime, so the
doctor can describe a machine whose packages are broken. A TPU counts as present only when
its chips are visible: users set TPU_ACCELERATOR_TYPE themselves to quiet libtpu when they
cross-compile on a CPU host (docs/forecast.md, "Start-up noise"), so the variable alone
proves nothing.

`detect_environment` takes the environment, the file-system root and the `which` function as
parameters; the tests pass a temporary directory laid out like /dev, /proc and /sys.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..backends.base import GOOGLE_TPU_PCI_VENDOR, chip_kind

__all__ = ["Environment", "GPUHost", "TPUHost", "detect_environment", "chips_in_slice"]

COLAB_VARIABLES = ("COLAB_RELEASE_TAG", "COLAB_GPU", "COLAB_BACKEND_VERSION", "COLAB_TPU_ADDR")
KAGGLE_VARIABLES = ("KAGGLE_KERNEL_RUN_TYPE", "KAGGLE_URL_BASE", "KAGGLE_DATA_PROXY_TOKEN")
# Variables naming a TPU: the accelerator type (TPU VMs, GKE), a TPU name (Kaggle, TPU nodes).
TPU_TYPE_VARIABLES = ("TPU_ACCELERATOR_TYPE", "ACCELERATOR_TYPE")

# Accelerator-type suffixes count TensorCores (two per chip) for these generations and chips
# for the others (Cloud TPU docs, "TPU versions": v4-8 and v5p-8 are 4 chips, v5litepod-8
# and v6e-8 are 8 chips).
_CORES_PER_CHIP = {"v2": 2, "v3": 2, "v4": 2, "v5p": 2, "v5litepod": 1, "v5e": 1, "v6e": 1}
_TYPE = re.compile(r"^(?P<gen>[a-z0-9]+?)(?:-pod)?-(?P<n>\d+)$")


@dataclass(frozen=True)
class TPUHost:
    """The TPU as the machine shows it; a field is None when nothing says.

    `kind` is the hardware catalogue's key ("v5e", "v4", ...); `chips_on_host` counts the
    chips this machine sees, `chips_in_slice` the chips the accelerator type names, which is
    more than this host's when the slice has several hosts (`hosts`).
    """

    accelerator_type: str | None
    kind: str | None
    chips_on_host: int
    chips_in_slice: int | None
    hosts: int

    def describe(self) -> str:
        """'v5e, 4 chips on this host' (and the slice, when it spans several hosts)."""
        return _tpu_detail(self)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GPUHost:
    """NVIDIA GPUs the driver lists (`names` can be empty when only nvidia-smi was found)."""

    count: int
    names: tuple[str, ...]

    def describe(self) -> str:
        """'2 × Tesla T4', or a count when the driver gives no model names."""
        return _gpu_detail(self)

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "names": list(self.names)}


@dataclass(frozen=True)
class Environment:
    """Where the code runs, and the evidence for it.

    `hosting` is "colab", "kaggle", "cloud-tpu-vm" or "machine"; `accelerator` is "tpu",
    "gpu" or "cpu". `remote_tpu` is Colab's retired TPU-node runtime, whose TPU sits behind a
    gRPC address (COLAB_TPU_ADDR) that only TensorFlow and old torch_xla (XRT) can use.
    """

    hosting: str
    accelerator: str
    tpu: TPUHost | None = None
    gpu: GPUHost | None = None
    remote_tpu: str | None = None
    evidence: tuple[str, ...] = field(default_factory=tuple)

    @property
    def label(self) -> str:
        """One line a user recognises: 'Colab TPU runtime (v5e, 1 chip)', 'CPU-only machine'."""
        place = {"colab": "Colab", "kaggle": "Kaggle"}.get(self.hosting)
        if self.accelerator == "tpu" and self.tpu is not None:
            detail = _tpu_detail(self.tpu)
            if place:
                return f"{place} TPU runtime ({detail})"
            name = f" {self.tpu.accelerator_type}" if self.tpu.accelerator_type else ""
            return f"Cloud TPU VM{name} ({detail})"
        if self.accelerator == "gpu" and self.gpu is not None:
            detail = _gpu_detail(self.gpu)
            return f"{place} GPU runtime ({detail})" if place else f"GPU machine ({detail})"
        if self.remote_tpu and place:
            return f"{place} TPU-node runtime (remote TPU at {self.remote_tpu})"
        return f"{place} CPU runtime" if place else "CPU-only machine"

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "hosting": self.hosting,
            "accelerator": self.accelerator,
            "tpu": self.tpu.to_dict() if self.tpu else None,
            "gpu": self.gpu.to_dict() if self.gpu else None,
            "remote_tpu": self.remote_tpu,
            "evidence": list(self.evidence),
        }


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _tpu_detail(tpu: TPUHost) -> str:
    kind = tpu.kind or "TPU"
    parts = [f"{kind}, {_plural(tpu.chips_on_host, 'chip')} on this host"]
    if tpu.hosts > 1 and tpu.chips_in_slice:
        parts.append(f"{tpu.chips_in_slice} in the slice across {tpu.hosts} hosts")
    return "; ".join(parts)


def _gpu_detail(gpu: GPUHost) -> str:
    if gpu.names:
        first = gpu.names[0]
        same = all(n == first for n in gpu.names)
        return f"{gpu.count} × {first}" if same else ", ".join(gpu.names)
    return _plural(gpu.count, "NVIDIA GPU") if gpu.count else "NVIDIA driver found"


def chips_in_slice(accelerator_type: str) -> int | None:
    """Chips an accelerator type names: 'v4-8' -> 4, 'v5litepod-8' -> 8; None if unknown."""
    match = _TYPE.match(accelerator_type.strip().lower())
    if match is None:
        return None
    per_chip = _CORES_PER_CHIP.get(match["gen"])
    if per_chip is None:
        return None
    return max(1, int(match["n"]) // per_chip)


def _tpu_kind(accelerator_type: str) -> str:
    kind = chip_kind(accelerator_type)
    if "-" in kind:  # a slug: try the generation alone, spelled as the runtime spells it
        generation = accelerator_type.split("-")[0]
        kind = chip_kind(f"TPU {generation}")
    return kind


def _pci_tpu_chips(root: Path) -> int | None:
    """Google TPU chips on the PCI bus; None when the bus cannot be read (some containers)."""
    devices = root / "sys" / "bus" / "pci" / "devices"
    count = 0
    try:
        entries = list(devices.iterdir())
    except OSError:
        return None
    if not entries:
        return None
    for entry in entries:
        try:
            if (entry / "vendor").read_text(encoding="ascii").strip().lower() == (
                GOOGLE_TPU_PCI_VENDOR
            ):
                count += 1
        except OSError:
            continue
    return count


def _count(directory: Path, pattern: str) -> int:
    try:
        return sum(1 for p in directory.iterdir() if re.fullmatch(pattern, p.name))
    except OSError:
        return 0


def _gpu_names(root: Path) -> list[str]:
    """Models from /proc/driver/nvidia/gpus/*/information ('Model: NVIDIA H100 80GB HBM3')."""
    names: list[str] = []
    gpus = root / "proc" / "driver" / "nvidia" / "gpus"
    try:
        entries = sorted(gpus.iterdir())
    except OSError:
        return names
    for entry in entries:
        try:
            text = (entry / "information").read_text(encoding="utf-8", errors="replace")
        except OSError:
            names.append("NVIDIA GPU")
            continue
        model = re.search(r"^Model:\s*(.+)$", text, re.MULTILINE)
        names.append(model.group(1).strip() if model else "NVIDIA GPU")
    return names


def detect_environment(
    environ: Mapping[str, str] | None = None,
    root: str | os.PathLike[str] = "/",
    which: Callable[[str], str | None] = shutil.which,
) -> Environment:
    """Describe where this process runs, from the environment and the file system only."""
    env = os.environ if environ is None else environ
    base = Path(root)
    evidence: list[str] = []

    hosting = "machine"
    colab = [v for v in COLAB_VARIABLES if v in env]
    kaggle = [v for v in KAGGLE_VARIABLES if v in env]
    if colab:
        hosting = "colab"
        evidence.append(f"Colab: {', '.join(colab)} set")
    elif kaggle:
        hosting = "kaggle"
        evidence.append(f"Kaggle: {', '.join(kaggle)} set")

    # -- TPU ----------------------------------------------------------------------------------
    pci_seen = _pci_tpu_chips(base)
    pci = pci_seen or 0
    accel = _count(base / "dev", r"accel\d+")
    accelerator_type = next((env[v] for v in TPU_TYPE_VARIABLES if env.get(v)), None)
    # v5e and later TPU VMs expose their chips as VFIO groups; other machines can have VFIO
    # groups too, so they count only where the PCI bus cannot be read and a TPU is named.
    vfio = _count(base / "dev" / "vfio", r"\d+") if pci_seen is None and accelerator_type else 0
    chips = pci or accel or vfio
    if pci:
        evidence.append(f"{_plural(pci, 'Google TPU chip')} on the PCI bus")
    if accel:
        evidence.append(f"{_plural(accel, 'TPU device node')} /dev/accel*")
    if vfio and not (pci or accel):
        evidence.append(f"{_plural(vfio, 'VFIO device group')} in /dev/vfio")
    hostnames = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
    tpu = None
    if chips:
        if accelerator_type:
            evidence.append(f"accelerator type {accelerator_type}")
        tpu = TPUHost(
            accelerator_type=accelerator_type,
            kind=_tpu_kind(accelerator_type) if accelerator_type else None,
            chips_on_host=chips,
            chips_in_slice=chips_in_slice(accelerator_type) if accelerator_type else None,
            hosts=max(1, len(hostnames)),
        )
    elif accelerator_type or env.get("TPU_NAME"):
        named = accelerator_type or env.get("TPU_NAME")
        evidence.append(f"a TPU is named ({named}) but no TPU chip is visible on this machine")
    remote = env.get("COLAB_TPU_ADDR") or None

    # -- GPU ----------------------------------------------------------------------------------
    names = _gpu_names(base)
    nodes = _count(base / "dev", r"nvidia\d+")
    smi = which("nvidia-smi")
    driver = (base / "proc" / "driver" / "nvidia").exists()
    gpu = None
    if names or nodes or (driver and smi):
        count = len(names) or nodes
        gpu = GPUHost(count=count, names=tuple(names))
        found = [
            what
            for what, present in (
                ("/proc/driver/nvidia", driver),
                (f"{_plural(nodes, 'device node')} /dev/nvidia*", nodes),
                (f"nvidia-smi at {smi}", smi),
            )
            if present
        ]
        evidence.append("NVIDIA driver: " + ", ".join(found))
    elif smi:
        evidence.append(f"nvidia-smi at {smi}, but the NVIDIA driver lists no GPU")
    if hosting == "colab" and env.get("COLAB_GPU") == "1" and gpu is None:
        gpu = GPUHost(count=1, names=())
        evidence.append("COLAB_GPU=1")

    if tpu is not None:
        accelerator = "tpu"
        if hosting == "machine":
            hosting = "cloud-tpu-vm"
    elif gpu is not None:
        accelerator = "gpu"
    else:
        accelerator = "cpu"
    return Environment(
        hosting=hosting,
        accelerator=accelerator,
        tpu=tpu,
        gpu=gpu,
        remote_tpu=remote,
        evidence=tuple(evidence),
    )
