"""target-torch: the oldest torch the rewritten code must run on, like ruff's target-version.

Every fix writes APIs that exist only from some torch release on (`torch.accelerator` 2.6,
`torch.accelerator.device_index` 2.8, `torch.accelerator.memory` 2.9: docs/torch-versions.md
has the table and how it was checked). Each rule says the torch its fix needs
(`Rule.min_torch`). With a target, a fix whose rule needs a newer torch is not applied: it
becomes a finding that says which torch it needs, and the report says once per file that
applying it would raise the project's minimum torch, and to what.

The target comes from `--target-torch`, else `[tool.gpu2tpu] target-torch`, else the project's
own pins: the lowest torch that its pyproject.toml (dependencies, optional dependencies,
dependency groups, Poetry), requirements*.txt, environment.yml, setup.cfg or setup.py admit.
A requirement with no lower bound (`torch`, `torch<3`) pins nothing.

Below torch 2.6, which brought `torch.accelerator`, a rule with `Rule.compat_torch` is not
held back: its fix is written in a form that asks `hasattr(torch, "accelerator")` and falls
back to what the code did (core/torch_compat.py). `raise_pin` raises the requirement that set
the target, for G2T520 (files/pins.py).

The decision is made around `rewrite_source`/`rewrite_notebook`, not inside the rules: the
fixes that may be applied run as usual with the held-back rules switched off, and those rules
then run once more in report-only mode to say where their fixes would have gone. Both runs
share each text's parse (`source.one_parse`), so the second costs only its rules' traversal.
"""

from __future__ import annotations

import ast
import configparser
import dataclasses
import functools
import re
import tomllib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, Specifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from .model import CellFinding, Finding, Options, Safety

TORCH_NAMES = ("torch", "pytorch")  # pytorch: conda's name


class TargetError(ValueError):
    """A target-torch value that is not a torch version."""


def normalize(value: object) -> str:
    """`2.6`, `"2.6"`, `"2.6.1"`, `"v2.7"` -> `"2.6"`, `"2.6"`, `"2.6"`, `"2.7"` (major.minor)."""
    text = str(value).strip().removeprefix("v")
    try:
        version = Version(text)
    except InvalidVersion:
        raise TargetError(
            f'target-torch must be a torch version such as "2.6", not {value!r}'
        ) from None
    major, minor = (*version.release, 0)[:2]
    if (major, minor) < (0, 1):
        raise TargetError(f"target-torch {value!r} is older than any torch release")
    return f"{major}.{minor}"


def _key(version: str) -> Version:
    return Version(version)


# -- the project's own pins --------------------------------------------------------------------


@dataclass(frozen=True)
class Pin:
    """The lowest torch one requirement admits, and where it was read."""

    version: str  # major.minor
    source: str  # e.g. "requirements.txt: torch>=2.4"
    path: Path | None = None  # the file that holds it
    # The requirement as written there (`torch>=2.4`, conda's `pytorch=2.4`); "" where it is
    # no one string (Poetry's table), so that no fix may raise it.
    text: str = ""
    conda: bool = False


def lower_bound(spec: SpecifierSet | str) -> str | None:
    """The lowest torch (major.minor) a specifier admits; None when it sets no lower bound."""
    bounds: list[Version] = []
    for item in SpecifierSet(str(spec)):
        if item.operator in ("==", "===", ">=", "~=", ">"):
            text = item.version.removesuffix(".*")
            try:
                bounds.append(Version(text))
            except InvalidVersion:
                continue
    if not bounds:
        return None
    return normalize(max(bounds).base_version)


def _requirement_pin(text: str, source: str, path: Path | None = None) -> Pin | None:
    try:
        req = Requirement(text)
    except InvalidRequirement:
        return None
    if req.name.lower() not in TORCH_NAMES:
        return None
    try:
        version = lower_bound(req.specifier)
    except TargetError:  # `torch>=0.0.1`: no torch release is that old
        return None
    return Pin(version, f"{source}: {text.strip()}", path, text.strip()) if version else None


def _table(data: object, *keys: str) -> dict[str, Any]:
    """`data[k1][k2]...` where each level is a table; {} where one is missing or of another
    shape (`tool = 5`, `project = "x"`: a pyproject.toml no tool could install from pins
    nothing, and is never a traceback)."""
    for key in keys:
        data = data.get(key) if isinstance(data, dict) else None
    return data if isinstance(data, dict) else {}


def _strings(value: object) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _pyproject_pins(path: Path) -> Iterator[Pin]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return
    project = _table(data, "project")
    texts = _strings(project.get("dependencies"))
    for group in _table(project, "optional-dependencies").values():
        texts += _strings(group)
    for group in _table(data, "dependency-groups").values():
        texts += _strings(group)  # `{include-group = ...}` entries name no package
    for text in texts:
        if pin := _requirement_pin(text, path.name, path):
            yield pin
    poetry = _table(data, "tool", "poetry")
    tables = [_table(poetry, "dependencies")]
    tables += [_table(g, "dependencies") for g in _table(poetry, "group").values()]
    for table in tables:
        spec = table.get("torch")
        if isinstance(spec, dict):
            spec = spec.get("version")
        if isinstance(spec, str) and (version := _poetry_bound(spec)):
            yield Pin(version, f"{path.name}: torch = {spec!r} (Poetry)", path)


def _poetry_bound(spec: str) -> str | None:
    """Poetry's `^2.4`, `~2.4`, `2.4.*`, `>=2.4,<3` -> `2.4`."""
    spec = spec.strip()
    if spec[:1] in ("^", "~") and spec[1:2] != "=":
        spec = ">=" + spec[1:]
    elif spec[:1].isdigit():
        spec = "==" + spec
    try:
        return lower_bound(spec)
    except (InvalidSpecifier, TargetError):
        return None


def _requirements_pins(path: Path) -> Iterator[Pin]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return
    for raw in text.replace("\\\n", " ").splitlines():
        line = re.split(r"(?:^|\s)#", raw, maxsplit=1)[0].strip()
        if not line or line.startswith("-"):
            continue
        line = re.split(r"\s--", line, maxsplit=1)[0]  # `--hash=...` and other options
        if pin := _requirement_pin(line, path.name, path):
            yield pin


_CONDA_ITEM = re.compile(r"^\s*-\s*(?:[\w.-]+::)?(?:py)?torch(?![\w.-])\s*(?P<spec>.*)$")
_CONDA_PART = re.compile(r"\s*(?P<op>>=|===|==|~=|>|=|<=|<|!=)?\s*v?(?P<v>\d+(?:\.\d+)*)")


def _conda_pins(path: Path) -> Iterator[Pin]:
    """`- pytorch=2.6`, `- pytorch>=2.4,<3`, `- torch==2.6.0` (also under `pip:`)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return
    for raw in text.splitlines():
        m = _CONDA_ITEM.match(raw.split("#", 1)[0])
        if not m:
            continue
        spec = m["spec"].strip().strip("'\"")
        if spec[:1].isdigit():  # `pytorch 2.6.*`: a version (and a build) after a space
            spec = "=" + spec.split()[0]
        if re.match(r"=\d", spec):  # `pytorch=2.6` or `pytorch=2.6=build`: 2.6.*
            parts = [spec.split("=")[1]]
        else:
            parts = spec.split(",")
        bounds = []
        for part in parts:
            hit = _CONDA_PART.match(part)
            if hit and hit["op"] in (None, "=", "==", "===", ">=", "~=", ">"):
                bounds.append(Version(hit["v"]))
        if bounds and max(bounds).release[:2] >= (0, 1):
            written = raw.split("#", 1)[0].strip().lstrip("- ").strip()
            yield Pin(
                normalize(max(bounds)),
                f"{path.name}: {raw.strip().lstrip('- ')}",
                path,
                written,
                True,
            )


def _setup_cfg_pins(path: Path) -> Iterator[Pin]:
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path, encoding="utf-8")
    except (OSError, configparser.Error, UnicodeDecodeError):
        return
    values: list[str] = []
    if parser.has_option("options", "install_requires"):
        values.append(parser.get("options", "install_requires"))
    if parser.has_section("options.extras_require"):
        values += [v for _, v in parser.items("options.extras_require")]
    for value in values:
        for line in value.splitlines():
            if pin := _requirement_pin(line.split("#", 1)[0].strip() or "-", path.name, path):
                yield pin


def _setup_py_pins(path: Path) -> Iterator[Pin]:
    """`install_requires=[...]` and `extras_require={...}` literals of any call, or module-level
    names bound to such literals."""
    try:
        tree = ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return
    names: dict[str, ast.expr] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    names[target.id] = stmt.value

    def strings(node: ast.expr | None) -> Iterator[str]:
        if isinstance(node, ast.Name):
            node = names.get(node.id)
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            for item in node.elts:
                if isinstance(item, ast.Constant) and isinstance(item.value, str):
                    yield item.value
        elif isinstance(node, ast.Dict):
            for value in node.values:
                yield from strings(value)

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg in ("install_requires", "extras_require"):
                    for text in strings(kw.value):
                        if pin := _requirement_pin(text, path.name, path):
                            yield pin


def iter_pins(folder: Path) -> Iterator[Pin]:
    """Every torch requirement with a lower bound in the project files of `folder`."""
    readers: list[tuple[Iterable[Path], Callable[[Path], Iterator[Pin]]]] = [
        ([folder / "pyproject.toml"], _pyproject_pins),
        (
            sorted(
                {*folder.glob("requirements*.txt"), *folder.glob("requirements/*.txt")},
                key=lambda p: p.as_posix(),
            ),
            _requirements_pins,
        ),
        ([folder / "environment.yml", folder / "environment.yaml"], _conda_pins),
        ([folder / "setup.cfg"], _setup_cfg_pins),
        ([folder / "setup.py"], _setup_py_pins),
    ]
    for paths, read in readers:
        for path in paths:
            if path.is_file():
                for pin in read(path):
                    if path.parent != folder:
                        pin = dataclasses.replace(pin, source=f"{path.parent.name}/{pin.source}")
                    yield pin


def project_floor(folder: Path) -> Pin | None:
    """The lowest torch the project's pins admit (the lowest over all of them), if any."""
    pins = list(iter_pins(folder))
    return min(pins, key=lambda p: _key(p.version)) if pins else None


# -- holding fixes back ------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def rule_min_torch() -> dict[str, str]:
    """Rule code -> the torch its fix needs (`Rule.min_torch`; notebook checks: 2.6)."""
    from ..rules.base import all_rules

    return {r.code: normalize(r.min_torch) for r in all_rules()}


@functools.lru_cache(maxsize=1)
def rule_compat_torch() -> dict[str, str]:
    """Rule code -> the torch its fix runs on in the form written for a torch without
    `torch.accelerator` (`Rule.compat_torch`; core/torch_compat.py), for the rules that have one."""
    from ..rules.base import all_rules

    return {r.code: normalize(r.compat_torch) for r in all_rules() if r.compat_torch}


def rewrite_floor() -> str:
    """The oldest torch any fix writes for: below it, every fix is held back."""
    needs = {**rule_min_torch(), **rule_compat_torch()}
    return min(needs.values(), key=_key)


def fix_needs(code: str, target: str | None) -> str | None:
    """The torch rule `code`'s fix needs beyond `target` (None: it applies there, in its
    compat form where the target is older than its `min_torch`)."""
    need = rule_min_torch()[code]
    if not target or _key(need) <= _key(normalize(target)):
        return None
    compat = rule_compat_torch().get(code)
    if compat is not None and _key(compat) <= _key(normalize(target)):
        return None
    return need


@functools.lru_cache(maxsize=1)
def report_only_rules() -> frozenset[str]:
    """The rules that never fix (`Safety.REPORT`): nothing of theirs waits for a torch."""
    from ..rules.base import all_rules

    return frozenset(r.code for r in all_rules() if r.safety is Safety.REPORT)


def held_back(options: Options) -> dict[str, str]:
    """The switched-on rules whose fixes need a newer torch than `options.target_torch`. A
    rule that only reports is never held back: it runs with the others, so that what it asks
    of their fixes (G2T111 of G2T113's) is answered as in a run without a target."""
    if not options.target_torch:
        return {}
    report_only = report_only_rules()
    found = {
        code: fix_needs(code, options.target_torch)
        for code in rule_min_torch()
        if code not in report_only
    }
    return {code: need for code, need in found.items() if need and options.enabled(code)}


R = TypeVar("R")


def rewrite_for_target(rewrite: Callable[[str, Options], R], text: str, options: Options) -> R:
    """`rewrite(text, options)` (rewrite_source or rewrite_notebook) with target-torch applied.

    Without a target, or when no switched-on rule needs a newer torch, this is one call of
    `rewrite`. Otherwise the held-back rules are switched off for the rewrite, then run alone
    in report-only mode on the same text; each place where they would have fixed something
    becomes a finding with `needs_torch` set (positions are the original text's, as for every
    finding).
    """
    held = held_back(options)
    if not held:
        return rewrite(text, options)
    from ..rules.base import rules_for
    from .source import one_parse

    with one_parse(rules_for(options)):  # both runs share each text's parse
        first = rewrite(text, dataclasses.replace(options, ignore=(*options.ignore, *held)))
        second = rewrite(text, dataclasses.replace(options, select=tuple(held), fix=False))
    extra = [
        _held(item, held, options)
        for item in second.findings  # type: ignore[attr-defined]  # a Result or a NotebookResult: both have findings
    ]
    merged = sorted([*first.findings, *extra], key=_order)  # type: ignore[attr-defined]  # a Result or a NotebookResult: both have findings
    return dataclasses.replace(first, findings=tuple(merged))  # type: ignore[type-var]  # a Result or a NotebookResult: both are dataclasses


def _order(item: Finding | CellFinding) -> tuple[int, int, int, str]:
    if isinstance(item, CellFinding):
        f = item.finding
        return (item.cell_index, f.line, f.col, f.code)
    return (-2, item.line, item.col, item.code)


def _held(
    item: Finding | CellFinding, held: dict[str, str], options: Options
) -> Finding | CellFinding:
    finding = item.finding if isinstance(item, CellFinding) else item
    applies = finding.fixable and (
        finding.safety == Safety.SAFE or (finding.safety == Safety.UNSAFE and options.unsafe_fixes)
    )
    if not applies:
        return item  # a report-only finding of that rule: the same as without a target
    need = held[finding.code]
    marked = dataclasses.replace(
        finding,
        fixable=False,
        needs_torch=need,
        message=f"{finding.message} (not fixed: the fix needs torch {need}, "
        f"target-torch is {normalize(options.target_torch)})",
    )
    if isinstance(item, CellFinding):
        return dataclasses.replace(item, finding=marked)
    return marked


# -- raising a pin (G2T520) --------------------------------------------------------------------


def raised_requirement(pin: Pin, need: str) -> str | None:
    """`pin.text` with its lower bound raised to `need` (`torch==1.9.1` -> `torch>=2.9`;
    conda's `pytorch=1.9` -> `pytorch>=2.9`), upper bounds, extras and markers kept; None where
    it cannot be said in one edit (Poetry's table, an upper bound below `need`)."""
    if not pin.text:
        return None
    floor = Version(need)
    if pin.conda:
        m = re.match(r"^(?P<name>(?:[\w.-]+::)?(?:py)?torch)(?![\w.-])", pin.text)
        return f"{m['name']}>={need}" if m else None
    try:
        req = Requirement(pin.text)
    except InvalidRequirement:
        return None
    kept = [s for s in req.specifier if s.operator in ("<", "<=", "!=")]
    # `<2`, and the upper bound `~=1.9` and `==1.9.*` carry: a person moves those
    bounding = [*kept, *(s for s in req.specifier if s.operator == "~=" or "*" in s.version)]
    if any(not s.contains(floor, prereleases=True) for s in bounding if s.operator != "!="):
        return None
    for s in req.specifier:
        if s.operator == "~=":  # `~=2.0` is also `<3`, which raising must not drop
            release = Version(s.version).release[:-1]
            upper = ".".join(map(str, (*release[:-1], release[-1] + 1)))
            kept.append(Specifier(f"<{upper}"))
    specs = ",".join([f">={need}", *(str(s) for s in kept)])
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    name = re.match(r"\s*([A-Za-z0-9._-]+)", pin.text)
    marker = f"; {req.marker}" if req.marker else ""
    return f"{name[1] if name else req.name}{extras}{specs}{marker}"


def raise_pin(text: str, pin: Pin, need: str) -> tuple[str, int] | None:
    """`text` (the file that holds `pin`) with the pin raised to `need`, and the line it is on;
    None where the requirement is not written exactly once there or cannot be raised."""
    new = raised_requirement(pin, need)
    if new is None or text.count(pin.text) != 1:
        return None
    line = text[: text.index(pin.text)].count("\n") + 1
    return text.replace(pin.text, new, 1), line
