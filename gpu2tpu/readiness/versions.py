"""Do the installed torch, torch_tpu, torch_xla, torchax, jax, jaxlib and libtpu fit together?

Versions are read from the distributions' metadata (`importlib.metadata`), never by importing
the packages: a torch_tpu or torch_xla built for another torch can die at import (undefined
symbols), which is exactly the state the doctor must be able to describe. The rules come from
three places, each recorded with the finding it produces:

- the packages' own `Requires-Dist` and `Requires-Python` (torch_tpu's torch range, jax's
  jaxlib range, the libtpu that `jax[tpu]` pins);
- PyTorch/XLA's rule that torch_xla runs only with the torch release of the same minor;
- `KNOWN_FACTS`, constraints a package does not declare but that were observed, with sources.

Each mismatch comes back as one sentence and the one command that fixes it, a pinned
`pip install` chosen to satisfy every other rule on the same package too.
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from ..backends.torchax_compat import NEWEST_TORCH

__all__ = [
    "CHECKED",
    "KNOWN_FACTS",
    "Constraint",
    "InstalledDistribution",
    "KnownFact",
    "REPORTED",
    "VersionFinding",
    "allocator_finding",
    "check_versions",
    "constraints_for",
    "display_name",
    "read_installed",
    "reported_versions",
    "tested_sets",
    "untested_set_findings",
]

# The distributions whose versions decide whether PyTorch runs on a TPU (canonical names).
CHECKED: tuple[str, ...] = (
    "torch",
    "torch-tpu",
    "torch-xla",
    "torchax",
    "jax",
    "jaxlib",
    "libtpu",
    "optax",
)
# The packages whose versions `gpu2tpu doctor` and `%tpu_info` report, in this order (the one
# list of them): the TPU stack above, then what gpu2tpu's own parts stand on.
REPORTED: tuple[str, ...] = (*CHECKED, "ipython", "ipywidgets", "libcst", "gpu2tpu")
# How users spell them in Python (`import torch_tpu`).
_DISPLAY = {"torch-tpu": "torch_tpu", "torch-xla": "torch_xla"}
# Extras whose requirements matter only where a TPU runs (jax[tpu], torch_xla[tpu]).
TPU_EXTRAS = ("tpu",)
# Python minors the fix for a Python mismatch may suggest, oldest first.
_PYTHON_MINORS = ((3, 9), (3, 10), (3, 11), (3, 12), (3, 13), (3, 14))


def display_name(name: str) -> str:
    """'torch-tpu' -> 'torch_tpu': the name users import and search for."""
    return _DISPLAY.get(canonicalize_name(name), canonicalize_name(name))


@dataclass(frozen=True)
class InstalledDistribution:
    """One installed distribution as its metadata describes it."""

    name: str  # canonical, e.g. "torch-tpu"
    version: str
    requires: tuple[str, ...] = ()
    requires_python: str | None = None

    @property
    def label(self) -> str:
        return f"{display_name(self.name)} {self.version}"


@dataclass(frozen=True)
class KnownFact:
    """A constraint a package does not declare in its metadata, with where it was observed.

    It applies when `package` is installed at a version in `package_versions` (empty: any).
    """

    package: str
    package_versions: str
    target: str
    specifier: str
    reason: str
    source: str
    required: bool = False
    verified: tuple[str, ...] = ()


# The torch after the newest that gpu2tpu's torchax layer is tested with: "2.16" for (2, 15).
_NEWEST = NEWEST_TORCH["0.0.13"]
_PAST_NEWEST_TORCH = f"{_NEWEST[0]}.{_NEWEST[1] + 1}"

KNOWN_FACTS: tuple[KnownFact, ...] = (
    KnownFact(
        package="torchax",
        package_versions="<=0.0.13",
        target="torch",
        specifier=f"<{_PAST_NEWEST_TORCH}",
        reason=(
            "torchax 0.0.13 names ATen ops that torch 2.13 and 2.14 removed "
            "(aten.prod.dim_Dimname, aten.cholesky); gpu2tpu imports it through a "
            f"compatibility layer tested up to torch {_NEWEST[0]}.{_NEWEST[1]}, and the "
            "forecast refuses a newer torch"
        ),
        source=(
            "gpu2tpu/backends/torchax_compat.py and tests/test_torchax_compat.py; torchax's "
            "main branch fixed the named overloads after 0.0.13 (google/torchax#102)"
        ),
        verified=(f"{_NEWEST[0]}.{_NEWEST[1]}.0",),
    ),
    KnownFact(
        package="torchax",
        package_versions="",
        target="jax",
        specifier=">=0.6.2",
        reason="torchax runs every op on JAX but declares jax only in its extras",
        source="torchax 0.0.13 pyproject.toml: dependencies = [], extra cpu = jax[cpu]>=0.6.2",
        required=True,
    ),
)

# torch_xla is compiled against one torch release (PyTorch/XLA's install line pins both to the
# same version: pip install torch==2.9.0 'torch_xla[tpu]==2.9.0').
_TORCH_XLA_SOURCE = (
    "PyTorch/XLA README: torch and torch_xla are installed at the same version "
    "(pip install torch==2.9.0 'torch_xla[tpu]==2.9.0'); another torch fails with undefined "
    "symbols at import"
)


@dataclass(frozen=True)
class Constraint:
    """One rule on an installed or missing distribution (or on "python")."""

    target: str  # canonical distribution name, or "python"
    specifier: str  # PEP 440, e.g. ">=2.11,<=2.15"
    required_by: str  # "torch_tpu 0.2.0"
    source: str  # where the rule is written
    reason: str = ""
    required: bool = False  # the target must be installed
    tpu_only: bool = False  # matters only where a TPU runs (a [tpu] extra)
    verified: tuple[str, ...] = ()  # versions known to satisfy it: candidates for the fix

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class VersionFinding:
    """A mismatch: one sentence, the command that fixes it, and the rule behind it.

    `severity` is "problem" (something will fail) or "note" (a mismatch that does not matter
    on this machine, such as jax[tpu]'s libtpu pin where no TPU runs).
    """

    message: str
    fix: str
    severity: str
    package: str
    source: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- reading metadata ------------------------------------------------------------------------


def read_installed(
    names: Iterable[str] = CHECKED,
    paths: Sequence[str | os.PathLike[str]] | None = None,
) -> dict[str, InstalledDistribution]:
    """The installed distributions among `names`, keyed by canonical name.

    `paths` are the directories to search for `*.dist-info` (default: `sys.path`), the same
    lookup `importlib.metadata` does for `pip show`.
    """
    found: dict[str, InstalledDistribution] = {}
    search = [str(Path(p)) for p in paths] if paths is not None else None
    for name in names:
        kwargs: dict[str, Any] = {"name": name}
        if search is not None:
            kwargs["path"] = search
        dist = next(iter(importlib.metadata.distributions(**kwargs)), None)
        if dist is None:
            continue
        meta = dist.metadata
        found[canonicalize_name(name)] = InstalledDistribution(
            name=canonicalize_name(meta["Name"] or name),
            version=dist.version,
            requires=tuple(dist.requires or ()),
            requires_python=meta.get("Requires-Python"),  # type: ignore[attr-defined]  # an email Message at run time; typeshed lists only a protocol
        )
    return found


def reported_versions(installed: Mapping[str, InstalledDistribution]) -> dict[str, str | None]:
    """{name as imported: version, or None where not installed} for each of `REPORTED`.

    gpu2tpu's own is the version of the code running, which a source checkout on the path
    has without any installed metadata.
    """
    from .. import __version__

    versions = {
        display_name(name): installed[name].version if name in installed else None
        for name in REPORTED
    }
    versions["gpu2tpu"] = __version__
    return versions


# -- collecting the rules --------------------------------------------------------------------


def _version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _contains(specifier: str, version: str) -> bool:
    """Whether `version` satisfies `specifier`; an unparsable version satisfies nothing."""
    parsed = _version(version)
    if parsed is None:
        return False
    return SpecifierSet(specifier).contains(parsed, prereleases=True)


def constraints_for(installed: Mapping[str, InstalledDistribution]) -> list[Constraint]:
    """Every rule the installed distributions impose on each other and on Python."""
    rules: list[Constraint] = []
    for dist in installed.values():
        if dist.requires_python:
            rules.append(
                Constraint(
                    target="python",
                    specifier=dist.requires_python,
                    required_by=dist.label,
                    source=f"Requires-Python of {dist.label}",
                    required=True,
                )
            )
        for text in dist.requires:
            rule = _requirement_rule(dist, text)
            if rule is not None:
                rules.append(rule)
    xla = installed.get("torch-xla")
    if xla is not None and (v := _version(xla.version)) is not None:
        rules.append(
            Constraint(
                target="torch",
                specifier=f"=={v.major}.{v.minor}.*",
                required_by=xla.label,
                source=_TORCH_XLA_SOURCE,
                reason="torch_xla runs only with the torch release it was built for",
                required=True,
                verified=(v.base_version,),
            )
        )
    for fact in KNOWN_FACTS:
        owner = installed.get(canonicalize_name(fact.package))
        if owner is None:
            continue
        if fact.package_versions and not _contains(fact.package_versions, owner.version):
            continue
        rules.append(
            Constraint(
                target=canonicalize_name(fact.target),
                specifier=fact.specifier,
                required_by=owner.label,
                source=fact.source,
                reason=fact.reason,
                required=fact.required,
                verified=fact.verified,
            )
        )
    return rules


def _requirement_rule(dist: InstalledDistribution, text: str) -> Constraint | None:
    """A `Requires-Dist` line as a rule, if it names a checked package and applies here."""
    try:
        req = Requirement(text)
    except InvalidRequirement:
        return None
    target = canonicalize_name(req.name)
    if target not in CHECKED or not str(req.specifier):
        return None
    source = f"Requires-Dist of {dist.label}: {text.strip()}"
    if req.marker is None or req.marker.evaluate({"extra": ""}):
        return Constraint(target, str(req.specifier), dist.label, source, required=True)
    for extra in TPU_EXTRAS:
        if req.marker.evaluate({"extra": extra}):
            label = f"{display_name(dist.name)}[{extra}] {dist.version}"
            return Constraint(target, str(req.specifier), label, source, tpu_only=True)
    return None


# -- choosing the fix ------------------------------------------------------------------------


def _candidates(rules: Sequence[Constraint]) -> list[str]:
    """Versions a pin could name: exact and upper bounds in the rules, and verified versions."""
    out: list[str] = []
    for rule in rules:
        try:
            specs = SpecifierSet(rule.specifier)
        except InvalidSpecifier:
            continue
        for spec in specs:
            if spec.operator in ("==", "===", "<=", "~="):
                out.append(spec.version)
        out.extend(rule.verified)
    return out


def _pin(rules: Sequence[Constraint]) -> str | None:
    """'==2.12.1' (or '==0.0.42.*'): the highest candidate satisfying every rule; else None."""
    best: tuple[Version, str] | None = None
    for candidate in _candidates(rules):
        wildcard = candidate.endswith(".*")
        representative = _version(candidate[:-2] if wildcard else candidate)
        if representative is None:
            continue
        if not all(_contains(r.specifier, str(representative)) for r in rules):
            continue
        # On a tie a concrete version beats a wildcard: '==2.9.0' over '==2.9.*'.
        better = best is None or representative > best[0]
        if not better and best is not None and representative == best[0]:
            better = best[1].endswith(".*") and not wildcard
        if better:
            release = representative.release
            padded = ".".join(str(p) for p in (*release, 0, 0)[: max(3, len(release))])
            best = (representative, f"=={candidate}" if wildcard else f"=={padded}")
    return best[1] if best else None


def _python_fix(rules: Sequence[Constraint], installed: Mapping[str, InstalledDistribution]) -> str:
    """A virtual environment with the oldest Python every rule accepts, and the same packages."""
    for major, minor in _PYTHON_MINORS:
        if all(_contains(r.specifier, f"{major}.{minor}") for r in rules):
            env = f".venv-py{major}{minor}"
            again = " ".join(f'"{d.name}=={d.version}"' for d in installed.values())
            return (
                f"python{major}.{minor} -m venv {env} && . {env}/bin/activate && "
                f"pip install {again}"
            )
    specs = ", ".join(sorted({r.specifier for r in rules}))
    return f"# no released Python satisfies {specs}; install the packages in separate environments"


def _install_command(target: str, rules: Sequence[Constraint], tpu_present: bool) -> str:
    name = display_name(target)
    if target == "jax" and tpu_present:
        name = "jax[tpu]"
    pin = _pin(rules)
    if pin is None:
        combined = ",".join(sorted({s for r in rules for s in r.specifier.split(",")}))
        pin = combined
    return f'pip install "{name}{pin}"'


# -- checking --------------------------------------------------------------------------------


def check_versions(
    installed: Mapping[str, InstalledDistribution],
    python_version: Sequence[int] | None = None,
    tpu_present: bool = False,
) -> list[VersionFinding]:
    """Every rule an installed version breaks, as a sentence and a fix.

    `python_version` defaults to the running interpreter's; rules from `[tpu]` extras are
    problems only when `tpu_present`, and notes otherwise.
    """
    py = tuple(python_version or sys.version_info[:3])
    py_text = ".".join(str(p) for p in py)
    rules = constraints_for(installed)
    findings: list[VersionFinding] = []
    by_target: dict[str, list[Constraint]] = {}
    for rule in rules:
        by_target.setdefault(rule.target, []).append(rule)

    for target, target_rules in by_target.items():
        binding = [r for r in target_rules if tpu_present or not r.tpu_only]
        if target == "python":
            failing: dict[str, list[Constraint]] = {}
            for rule in target_rules:
                if not _contains(rule.specifier, py_text):
                    failing.setdefault(str(SpecifierSet(rule.specifier)), []).append(rule)
            for specifier, group in failing.items():
                owners = [r.required_by for r in group]
                who = (
                    owners[0] if len(owners) == 1 else f"{', '.join(owners[:-1])} and {owners[-1]}"
                )
                findings.append(
                    VersionFinding(
                        message=(
                            f"{who} need{'s' if len(owners) == 1 else ''} Python {specifier}, "
                            f"but this is Python {py_text}."
                        ),
                        fix=_python_fix(target_rules, installed),
                        severity="problem",
                        package="python",
                        source="; ".join(r.source for r in group),
                    )
                )
            continue
        present = installed.get(target)
        name = display_name(target)
        reported: set[str] = set()  # one finding per range, however many packages ask for it
        for rule in target_rules:
            if str(SpecifierSet(rule.specifier)) in reported:
                continue
            why = f": {rule.reason}" if rule.reason else ""
            severity = "problem" if (tpu_present or not rule.tpu_only) else "note"
            if present is None:
                if not rule.required:
                    continue
                reported.add(str(SpecifierSet(rule.specifier)))
                findings.append(
                    VersionFinding(
                        message=(
                            f"{rule.required_by} needs {name}{rule.specifier}, which is not "
                            f"installed{why}."
                        ),
                        fix=_install_command(target, binding, tpu_present),
                        severity=severity,
                        package=target,
                        source=rule.source,
                    )
                )
                continue
            if _contains(rule.specifier, present.version):
                continue
            reported.add(str(SpecifierSet(rule.specifier)))
            clash = _clashes_with_torch_tpu(rule, installed)
            if clash is not None:
                findings.append(_torch_tpu_finding(rule, clash, present, severity, tpu_present))
                continue
            scope = [*binding, rule] if rule not in binding else binding
            fix = _install_command(target, scope, tpu_present)
            conflict = ""
            if _pin(scope) is None and _pin([rule]) is not None:
                others = [r.required_by for r in scope if r is not rule]
                conflict = (
                    f"; no {name} release satisfies it and {', '.join(others)} together, "
                    "so install them in separate environments"
                )
                fix = _install_command(target, [rule], tpu_present)
            if rule.tpu_only and not tpu_present:
                message = (
                    f"{rule.required_by} pins {name}{rule.specifier} for TPUs, but {name} "
                    f"{present.version} is installed; that matters only on a TPU machine."
                )
            else:
                message = (
                    f"{rule.required_by} needs {name}{rule.specifier}, but {name} "
                    f"{present.version} is installed{why}{conflict}."
                )
            findings.append(
                VersionFinding(
                    message=message,
                    fix=fix,
                    severity=severity,
                    package=target,
                    source=rule.source,
                )
            )
    return findings


def torch_tpu_rules() -> list[Constraint]:
    """TorchTPU's requirements (backends/torchtpu.py, the one statement of them) as rules."""
    from ..backends import torchtpu

    label = f"TorchTPU (torch_tpu {torchtpu.RELEASE})"
    source = f"Requires-Dist of torch_tpu {torchtpu.RELEASE} (docs/backends.md)"
    rules = []
    for text in torchtpu.REQUIRES:
        req = Requirement(text)
        rules.append(Constraint(canonicalize_name(req.name), str(req.specifier), label, source))
    return rules


def _clashes_with_torch_tpu(
    rule: Constraint, installed: Mapping[str, InstalledDistribution]
) -> Constraint | None:
    """TorchTPU's rule on the same package, when a TPU-only pin (jax[tpu]'s libtpu) leaves no
    version both accept: following the pin would break the backend `%%tpu` prefers."""
    if not rule.tpu_only:
        return None
    for other in torch_tpu_rules():
        if other.target == rule.target and _pin([rule, other]) is None and _pin([rule]):
            return other
    return None


def _torch_tpu_finding(
    rule: Constraint,
    clash: Constraint,
    present: InstalledDistribution,
    severity: str,
    tpu_present: bool,
) -> VersionFinding:
    """A pin that TorchTPU's requirement contradicts: keep the package TorchTPU needs and give
    the pinning package an environment of its own (never the pin that breaks TorchTPU)."""
    name = display_name(rule.target)
    owner, _, version = rule.required_by.partition(" ")
    fits = (
        f", which {name} {present.version} meets"
        if _contains(clash.specifier, present.version)
        else ""
    )
    where = "" if tpu_present else "; that matters only on a TPU machine"
    env = f".venv-{owner.split('[')[0]}"
    return VersionFinding(
        message=(
            f"{rule.required_by} pins {name}{rule.specifier} for TPUs, but {clash.required_by}, "
            f"the backend %%tpu prefers on a TPU, needs {name}{clash.specifier}{fits}: no {name} "
            f"serves both, so run {owner} from an environment of its own{where}."
        ),
        fix=f'python -m venv {env} && {env}/bin/pip install "{owner}=={version}"',
        severity=severity,
        package=rule.target,
        source=f"{rule.source}; {clash.source}",
    )


# -- TorchTPU's allocator ----------------------------------------------------------------------

TCMALLOC_NAMES = ("libtcmalloc.so.4", "libtcmalloc_minimal.so.4", "libtcmalloc.so")
TCMALLOC_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
)
# Debian/Ubuntu package and path of tcmalloc, for machines that do not have it yet.
TCMALLOC_INSTALL = (
    "sudo apt-get install -y libgoogle-perftools4 && "
    "export LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4"
)


def find_tcmalloc(search_dirs: Sequence[str | os.PathLike[str]] = TCMALLOC_DIRS) -> str | None:
    """The first tcmalloc shared library in `search_dirs`, or None."""
    for directory in search_dirs:
        for name in TCMALLOC_NAMES:
            path = Path(directory) / name
            if path.exists():
                return str(path)
    return None


def allocator_finding(
    installed: Mapping[str, InstalledDistribution],
    environ: Mapping[str, str],
    search_dirs: Sequence[str | os.PathLike[str]] = TCMALLOC_DIRS,
    tpu_present: bool = True,
) -> VersionFinding | None:
    """TorchTPU's recommendation to preload tcmalloc, where TorchTPU is installed without it.

    A problem where TorchTPU runs (a TPU machine), a note elsewhere.
    """
    tpu = installed.get("torch-tpu")
    if tpu is None:
        return None
    preload = environ.get("LD_PRELOAD", "")
    if "tcmalloc" in preload:
        return None
    library = find_tcmalloc(search_dirs)
    if library is None:
        fix = TCMALLOC_INSTALL
    else:
        fix = f"export LD_PRELOAD={library}" + (":$LD_PRELOAD" if preload else "")
    return VersionFinding(
        message=(
            f"{tpu.label} recommends tcmalloc for host memory (it warns at `import torch` "
            "without it), and LD_PRELOAD takes effect only for processes started after it is "
            "set, so restart the shell, kernel or runtime once it is."
        ),
        fix=fix,
        severity="problem" if tpu_present else "note",
        package="torch-tpu",
        source="TorchTPU prints a tcmalloc warning at import when tcmalloc is not preloaded "
        '(docs/backends.md, "TorchTPU 0.2.0 as released")',
    )


# -- the sets the project tests ----------------------------------------------------------------


@dataclass(frozen=True)
class TestedSet:
    """The versions of one stack that one environment of `make test-all` runs the tests on."""

    name: str  # what the stack is for: "the forecast and the jax backend"
    key: str  # the distribution whose presence means this stack is installed
    source: str  # the lock file(s) it comes from
    versions: dict[str, str]  # canonical name -> version

    def describe(self) -> str:
        return ", ".join(f"{display_name(n)} {v}" for n, v in self.versions.items())


def tested_sets() -> list[TestedSet]:
    """The table shipped with gpu2tpu (readiness/tested_sets.json)."""
    text = (
        importlib.resources.files("gpu2tpu.readiness")
        .joinpath("tested_sets.json")
        .read_text("utf-8")
    )
    return [
        TestedSet(
            name=entry["name"],
            key=canonicalize_name(entry["key"]),
            source=entry["source"],
            versions={canonicalize_name(n): v for n, v in entry["versions"].items()},
        )
        for entry in json.loads(text)["sets"]
    ]


def _same_release(installed: str, tested: str) -> bool:
    """2.15.0+cu132 is the tested 2.15.0: a local build tag names the build, not the release."""
    a, b = _version(installed), _version(tested)
    return a is not None and b is not None and a.public == b.public


def untested_set_findings(
    installed: Mapping[str, InstalledDistribution], sets: Sequence[TestedSet] | None = None
) -> list[VersionFinding]:
    """A note for each installed stack whose versions match none of the tested sets for it."""
    sets = tested_sets() if sets is None else sets
    findings: list[VersionFinding] = []
    for key in dict.fromkeys(s.key for s in sets):
        if key not in installed:
            continue
        candidates = [s for s in sets if s.key == key]
        if any(
            all(
                n in installed and _same_release(installed[n].version, v)
                for n, v in s.versions.items()
            )
            for s in candidates
        ):
            continue
        here = ", ".join(
            installed[n].label if n in installed else f"no {display_name(n)}"
            for n in candidates[0].versions
        )
        tested = "; ".join(s.describe() for s in candidates)
        pins = " ".join(f'"{display_name(n)}=={v}"' for n, v in candidates[0].versions.items())
        findings.append(
            VersionFinding(
                message=(
                    f"This set is not one gpu2tpu has tested for {candidates[0].name}: {here} "
                    f"(tested: {tested}). It may work; what fails here may be the versions."
                ),
                fix=f"pip install {pins}",
                severity="note",
                package=key,
                source="gpu2tpu/readiness/tested_sets.json: "
                + "; ".join(s.source for s in candidates),
            )
        )
    return findings
