"""The environment doctor: `gpu2tpu doctor` and `%tpu_doctor`.

It says where the code runs, checks that the installed versions fit together and that the
environment does not keep a TPU idle, and gives, for every problem, one sentence and the exact
command that fixes it. With nothing wrong it says what is usable here. Exit code 1 when
something is wrong, as `ruff check`.

The version checks read metadata only (versions.py). Backends are asked whether they run
here only when those checks found nothing wrong with torch, torch_tpu or torch_xla: importing
a torch_tpu built for another torch can kill the process, which is the failure the doctor
exists to explain.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.utils import canonicalize_name

from .._extras import EXTRA_OF
from .environment import Environment, detect_environment
from .versions import (
    CHECKED,
    REPORTED,
    TCMALLOC_DIRS,
    InstalledDistribution,
    allocator_finding,
    check_versions,
    display_name,
    read_installed,
    reported_versions,
    untested_set_findings,
)

if TYPE_CHECKING:
    import ipywidgets
    from rich.console import RenderableType

    from ..backends import BackendStatus

__all__ = ["DoctorReport", "Missing", "Note", "Problem", "add_arguments", "diagnose", "run"]

# A problem with these distributions means torch itself might not import cleanly.
_UNSAFE_TO_IMPORT = {"torch", "torch-tpu", "torch-xla", "python"}
# What each extra of gpu2tpu is for, said when its packages are missing (which packages each
# brings is `_extras.EXTRA_OF`).
EXTRA_PURPOSE = {
    "notebook": "%%tpu, %tpu_auto, %tpu_info, the profiler, the dry run and the demo",
    "forecast": "the TPU forecast (gpu2tpu.forecast, %%tpu --forecast)",
}
# What the forecast needs (pyproject's `forecast` extra), as distributions.
_FORECAST = tuple(canonicalize_name(m) for m, extra in EXTRA_OF.items() if extra == "forecast")
_OPTIONAL_BACKENDS = {"torch-tpu": "tpu", "torch-xla": "xla", "torchax": "jax"}


@dataclass(frozen=True)
class Problem:
    """Something that will fail or keep the TPU idle: one sentence and the command that fixes it."""

    message: str
    fix: str
    kind: str  # "versions", "python", "allocator" or "environment"
    package: str = ""  # the distribution to change ("python" for the interpreter)
    source: str = ""  # where the rule behind it is written

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class Note:
    """Worth knowing, but nothing fails here; `fix` is what to run where it would matter."""

    message: str
    fix: str = ""
    source: str = ""

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class Missing:
    """Packages one of gpu2tpu's extras brings that are not installed: the parts of gpu2tpu
    that need them, and the command that installs them. Not a problem: the codemod alone is
    a complete install (`pip install gpu2tpu`)."""

    packages: tuple[str, ...]
    needed_for: str
    install: str

    @property
    def line(self) -> str:
        return f"{', '.join(self.packages)}, needed by {self.needed_for}: {self.install}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "packages": list(self.packages)}


@dataclass
class DoctorReport:
    """What `diagnose()` found. `ok` is True when there are no problems (notes are fine)."""

    environment: Environment
    python: str
    versions: dict[str, str | None]
    problems: list[Problem] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    usable: list[str] = field(default_factory=list)
    missing: list[Missing] = field(default_factory=list)
    missing_optional: list[str] = field(default_factory=list)
    backends: list[BackendStatus] | None = None
    probe_note: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def headline(self) -> str:
        if self.ok:
            return "No problems found."
        n = len(self.problems)
        return f"{n} problem{'s' if n != 1 else ''} found:"

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "environment": self.environment.to_dict(),
            "python": self.python,
            "versions": dict(self.versions),
            "problems": [p.to_dict() for p in self.problems],
            "notes": [n.to_dict() for n in self.notes],
            "usable": list(self.usable),
            "missing": [m.to_dict() for m in self.missing],
            "missing_optional": list(self.missing_optional),
            "backends": [b.to_dict() for b in self.backends] if self.backends is not None else None,
            "probe_note": self.probe_note,
        }

    # -- views (gpu2tpu.views.doctor draws them) ---------------------------------------------

    def __str__(self) -> str:
        from ..views.doctor import doctor_text

        return doctor_text(self)

    def __repr__(self) -> str:
        return str(self)

    def __rich__(self) -> RenderableType:
        """A rich rendering for terminals: `rich.print(report)`."""
        from ..views.doctor import doctor_rich

        return doctor_rich(self)

    def _repr_html_(self) -> str:
        from ..views.doctor import doctor_html

        return doctor_html(self)

    def widget(self) -> ipywidgets.VBox:
        """Core ipywidgets only (a VBox of HTML), so it renders in Colab without set-up."""
        from ..views.doctor import doctor_widget

        return doctor_widget(self)


# -- diagnosing ------------------------------------------------------------------------------


def _python_text(version: Sequence[int] | None) -> str:
    if version is None:
        return platform.python_version()
    return ".".join(str(p) for p in version)


def _torch_build() -> str | None:
    """'cuda' or 'cpu' for the installed torch, from its files (torch is not imported)."""
    module = sys.modules.get("torch")
    if module is not None:
        return "cuda" if getattr(module.version, "cuda", None) else "cpu"
    from ..backends.base import has_module

    if not has_module("torch"):
        return None
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
    return "cuda" if any(lib.glob("libtorch_cuda*")) else "cpu"


def _environment_findings(
    env: Environment,
    installed: Mapping[str, InstalledDistribution],
    environ: Mapping[str, str],
) -> tuple[list[Problem], list[Note]]:
    """Settings that keep a TPU idle, and runtimes a TPU backend cannot use."""
    problems: list[Problem] = []
    notes: list[Note] = []
    if env.accelerator == "tpu":
        platforms = environ.get("JAX_PLATFORMS", "")
        if platforms and "tpu" not in platforms.lower() and "jax" in installed:
            problems.append(
                Problem(
                    message=(
                        f"JAX_PLATFORMS={platforms} keeps JAX and torchax off the TPU chips "
                        "this machine has."
                    ),
                    fix="unset JAX_PLATFORMS",
                    kind="environment",
                    source="JAX reads JAX_PLATFORMS at start-up to choose its platforms",
                )
            )
        pjrt = environ.get("PJRT_DEVICE", "")
        if pjrt and pjrt.upper() != "TPU" and "torch-xla" in installed:
            problems.append(
                Problem(
                    message=f"PJRT_DEVICE={pjrt} makes PyTorch/XLA run on the {pjrt} "
                    "instead of the TPU chips this machine has.",
                    fix="export PJRT_DEVICE=TPU",
                    kind="environment",
                    source="PyTorch/XLA docs (_pjrt.md): PJRT_DEVICE selects the device",
                )
            )
        if not any(name in installed for name in _OPTIONAL_BACKENDS):
            from ..backends import backend_class

            problems.append(
                Problem(
                    message="This machine has TPU chips but no PyTorch TPU backend is "
                    "installed (torch_tpu, torch_xla or torchax).",
                    fix=backend_class("tpu").install,
                    kind="environment",
                    source="gpu2tpu backends",
                )
            )
    if env.remote_tpu:
        notes.append(
            Note(
                message=(
                    f"This Colab runtime reaches its TPU over gRPC at {env.remote_tpu} (the "
                    "retired TPU-node runtime), which TorchTPU, torchax and current PyTorch/XLA "
                    "cannot use; choose a TPU VM runtime (v5e-1, v6e-1 or v2-8) under Runtime > "
                    "Change runtime type."
                ),
                source="COLAB_TPU_ADDR",
            )
        )
    for line in env.evidence:
        if "no TPU chip is visible" in line:
            notes.append(
                Note(
                    message=f"{line[0].upper()}{line[1:]}: fine for a deviceless compile, but "
                    "nothing will run on a TPU here."
                )
            )
    return problems, notes


def _troubled(problems: Sequence[Problem]) -> set[str]:
    """The distributions (and "python") that a version problem asks to change."""
    return {p.package for p in problems if p.kind in ("versions", "python") and p.package}


def _probe(report: DoctorReport) -> list[BackendStatus] | None:
    """The backends' own answers, unless a version problem makes importing torch unsafe."""
    unsafe = sorted(_troubled(report.problems) & _UNSAFE_TO_IMPORT)
    if unsafe:
        names = ", ".join(display_name(n) for n in unsafe)
        report.probe_note = (
            f"Backends were not started: fix the {names} problem first, since importing torch "
            "with mismatched versions can crash the process."
        )
        return None
    from ..backends import available_backends

    try:
        return available_backends()
    except Exception as err:  # a report, not a crash: say what failed
        report.probe_note = f"Asking the backends failed ({type(err).__name__}: {err})."
        return None


def _usable(
    env: Environment,
    installed: Mapping[str, InstalledDistribution],
    statuses: list[BackendStatus] | None,
    troubled: set[str],
    torch_build: str | None,
) -> list[str]:
    """One line per part of gpu2tpu, and per way of running PyTorch, that works here."""
    lines: list[str] = []
    libcst = installed.get("libcst")
    if libcst is not None:  # the one dependency of the codemod whose version matters
        lines.append(f"Codemod: gpu2tpu check, rewrite and rules (libcst {libcst.version})")
    status = {s.name: s for s in statuses} if statuses is not None else {}

    def works(backend: str, packages: Sequence[str]) -> bool:
        if any(p not in installed or p in troubled for p in packages):
            return False
        return status[backend].available if backend in status else True

    torch = installed.get("torch")
    if torch is not None and "torch" not in troubled:
        if env.gpu is not None and status.get("cuda") is not None and status["cuda"].available:
            lines.append(f"CUDA: PyTorch {torch.version} on {env.gpu.describe()}")
        if torch_build == "cuda" and env.gpu is None:
            lines.append(
                f"CPU: PyTorch {torch.version} (a CUDA build, but no NVIDIA GPU is visible, "
                "so CUDA is not usable here)"
            )
        else:
            lines.append(f"CPU: PyTorch {torch.version}")
    where = "TPU" if env.accelerator == "tpu" else "CPU"
    tpu_chips = env.tpu.chips_on_host if env.tpu else 0
    if works("tpu", ("torch", "torch-tpu")) and env.accelerator == "tpu":
        chips = f"{tpu_chips} TPU chip{'s' if tpu_chips != 1 else ''}"
        lines.append(f"TorchTPU {installed['torch-tpu'].version} on {chips}")
    if works("xla", ("torch", "torch-xla")):
        lines.append(f"PyTorch/XLA {installed['torch-xla'].version} on the {where}")
    if works("jax", ("torch", "torchax", "jax", "jaxlib")):
        platform_name = "TPU" if env.accelerator == "tpu" else "JAX's CPU platform"
        lines.append(
            f"torchax {installed['torchax'].version} on JAX {installed['jax'].version} "
            f"({platform_name})"
        )
    if all(p in installed and p not in troubled for p in _FORECAST) and "torch" in installed:
        lines.append(
            "TPU forecast (gpu2tpu.forecast): deviceless compiles for v5e, v6e, v5p and TPU7x "
            f"with libtpu {installed['libtpu'].version}"
        )
    return lines


def diagnose(
    *,
    environ: Mapping[str, str] | None = None,
    metadata_paths: Sequence[str | os.PathLike[str]] | None = None,
    python_version: Sequence[int] | None = None,
    root: str | os.PathLike[str] = "/",
    tcmalloc_dirs: Sequence[str | os.PathLike[str]] = TCMALLOC_DIRS,
    probe_backends: bool = True,
) -> DoctorReport:
    """Check this environment; every argument defaults to the real machine.

    `metadata_paths` are where to look for installed distributions (default `sys.path`),
    `root` is the file-system root for device nodes and /proc, and `probe_backends=False`
    skips asking the backends (which imports torch), as for another environment's metadata.
    """
    env_vars = os.environ if environ is None else environ
    env = detect_environment(env_vars, root=root)
    found = read_installed(REPORTED, metadata_paths)
    # The version rules are about the TPU stack; the other reported packages are shown only.
    installed = {name: dist for name, dist in found.items() if name in CHECKED}
    python = _python_text(python_version)
    report = DoctorReport(environment=env, python=python, versions=reported_versions(found))
    tpu_present = env.accelerator == "tpu"
    for finding in check_versions(installed, python_version, tpu_present=tpu_present):
        if finding.severity == "problem":
            kind = "python" if finding.package == "python" else "versions"
            report.problems.append(
                Problem(finding.message, finding.fix, kind, finding.package, finding.source)
            )
        else:
            report.notes.append(Note(finding.message, finding.fix, finding.source))
    for finding in untested_set_findings(installed):
        report.notes.append(Note(finding.message, finding.fix, finding.source))
    allocator = allocator_finding(installed, env_vars, tcmalloc_dirs, tpu_present)
    if allocator is not None and allocator.severity == "problem":
        report.problems.append(
            Problem(allocator.message, allocator.fix, "allocator", "torch-tpu", allocator.source)
        )
    elif allocator is not None:
        report.notes.append(Note(allocator.message, allocator.fix, allocator.source))
    env_problems, env_notes = _environment_findings(env, installed, env_vars)
    report.problems += env_problems
    report.notes += env_notes

    troubled = _troubled(report.problems)
    # Without torch no backend can run: asking them would only collect import errors.
    statuses = _probe(report) if probe_backends and "torch" in installed else None
    report.backends = statuses
    torch_build = _torch_build() if probe_backends and "torch" not in troubled else None
    report.usable = _usable(env, found, statuses, troubled, torch_build)
    report.missing = _missing_extras(found)
    named = {p for m in report.missing for p in m.packages}
    report.missing_optional = [
        display_name(name)
        for name in _OPTIONAL_BACKENDS
        if name not in installed and display_name(name) not in named
    ]
    if "torch-tpu" in installed and statuses is not None and not tpu_present:
        report.notes.append(
            Note(
                f"{installed['torch-tpu'].label} is installed but sees no TPU here, so it "
                "registers no 'tpu' device; it runs on a TPU VM."
            )
        )
    tpu_status = {s.name: s for s in statuses or ()}.get("tpu")
    if "torch-tpu" in installed and tpu_present and tpu_status and not tpu_status.available:
        # The backend's own answer, exceptions included (the backends layer turns them into it).
        report.notes.append(
            Note(
                f"{installed['torch-tpu'].label} is installed on this TPU machine but cannot "
                f"run: {tpu_status.reason}."
            )
        )
    xla_note = _xla_tpu_vm_note(installed, env_vars, tpu_present)
    if xla_note is not None:
        report.notes.append(xla_note)
    return report


def _missing_extras(found: Mapping[str, InstalledDistribution]) -> list[Missing]:
    """For each extra of gpu2tpu with packages not installed: those packages and what they
    are for (a light `pip install gpu2tpu` has the codemod and none of them)."""
    absent: dict[str, list[str]] = {}
    for module, extra in EXTRA_OF.items():
        if canonicalize_name(module) not in found:
            absent.setdefault(extra, []).append(module)
    return [
        Missing(tuple(modules), EXTRA_PURPOSE[extra], f"pip install 'gpu2tpu[{extra}]'")
        for extra, modules in absent.items()
    ]


# -- PyTorch/XLA -----------------------------------------------------------------------------

# PyTorch/XLA's install line on a TPU VM (its README): the [tpu] extra brings libtpu.
XLA_TPU_INSTALL = "pip install torch=={v} 'torch_xla[tpu]=={v}'"


def _xla_tpu_vm_note(
    installed: Mapping[str, InstalledDistribution],
    environ: Mapping[str, str],
    tpu_present: bool,
) -> Note | None:
    """Where torch_xla runs on the CPU: what the same code needs on a TPU VM instead."""
    if "torch-xla" not in installed or tpu_present:
        return None
    version = installed["torch-xla"].version
    torch = installed["torch"].version if "torch" in installed else None
    if torch is None:
        paired = "without torch"
    elif _minor_of(torch) == _minor_of(version):
        paired = f"paired with torch {torch}, the release it was built for"
    else:
        paired = f"with torch {torch}, not its release (see the problem above)"
    pjrt = environ.get("PJRT_DEVICE", "")
    device = (
        f"PJRT_DEVICE={pjrt}"
        if pjrt
        else "PJRT_DEVICE is unset, so torch_xla falls back to the CPU without chips"
    )
    has_libtpu = "libtpu" in installed
    return Note(
        message=(
            f"PyTorch/XLA {version} ({paired}) runs here on the CPU ({device}): the same "
            "graphs, compiles and CPU fallbacks as on a TPU, but no TPU. On a TPU VM it needs "
            "torch_xla's [tpu] extra, which brings libtpu"
            f"{' (installed here, unused without chips)' if has_libtpu else ''}, and "
            "PJRT_DEVICE=TPU."
        ),
        fix=XLA_TPU_INSTALL.format(v=version) + " && export PJRT_DEVICE=TPU",
        source="PyTorch/XLA README (install) and docs (_pjrt.md: PJRT_DEVICE)",
    )


def _minor_of(version: str) -> tuple[str, ...]:
    return tuple(version.split("+")[0].split(".")[:2])


# -- front ends ------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`gpu2tpu doctor`'s options (the CLI builds the parser)."""
    parser.add_argument("--format", choices=["text", "json"], default="text")


def run(args: argparse.Namespace) -> int:
    """`gpu2tpu doctor [--format text|json]`: 0 when nothing is wrong, 1 otherwise."""
    report = diagnose()
    if args.format == "json":
        print(json.dumps(report.to_dict(), indent=2))
    elif sys.stdout.isatty():
        from rich.console import Console

        Console().print(report)
    else:
        print(report)
    return 0 if report.ok else 1
