"""`[tool.gpu2tpu]`: its schema, checked on load, and each file's configuration, found from
the file's own project upward.

The schema (`SCHEMA`) declares every key, the type it takes and what a user is told when a
value does not fit; a bad value is never read loosely (`unsafe-fixes = "false"` is not
truthy, `exclude = "third_party"` is not a list of letters, `max-file-size = true` is not one
byte): each one is a line naming the file, the key, the value and what was expected, and the
command exits 2 (`ConfigError`). A pyproject.toml of another shape (`tool = 5`) is one line
too, never a traceback.

Each folder's configuration (`ProjectConfigs`) is, as in ruff's hierarchical configuration,
the nearest pyproject.toml with a `[tool.gpu2tpu]` table at or above the folder (one without
the table does not count); a folder with none above it takes that of the current folder, else
the defaults. Settings are not merged across files; the command line's options go over each.

select and ignore, as ruff resolves them: the table's, then the command line's over it. In
each, the most specific code or prefix that matches a rule decides (`ALL` the least
specific; `ignore` wins over a `select` as specific), so `select = ["G2T101"]` with
`ignore = ["ALL"]` keeps G2T101; `select = []` selects no rule. A `--select` starts afresh
(the table's select and ignore no longer count); an `--ignore` alone takes rules away from
what the table selected.

target-torch, per folder: `--target-torch`, else the nearest `[tool.gpu2tpu] target-torch`,
else the torch pins (torch_target.py) of the nearest folder at or above it that has any,
looking no higher than the top of its git repository; else those of the current folder. Two
projects in one run keep their own pins (and `Config.target_pin` is the one that set the
target, which G2T520 may raise: files/pins.py). Below torch 2.6 the fixes that need only the
device are written for a torch without `torch.accelerator` (core/torch_compat.py); a pin older
than the oldest torch any fix writes for (`torch>=0.3.1`) holds every fix back.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..core.model import Options
from ..core.torch_target import Pin
from .discovery import Scope
from .engine import DEFAULT_MAX_BYTES, Config


class ConfigError(ValueError):
    """Configuration that cannot be used: one line per problem (`lines`)."""

    def __init__(self, lines: list[str] | str) -> None:
        self.lines = [lines] if isinstance(lines, str) else list(lines)
        super().__init__("\n".join(self.lines))


# -- the schema ------------------------------------------------------------------------------


class _Bad(ValueError):
    """A value that does not fit its key; the message says what was expected."""


def _strings(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _Bad("expected a list of strings")
    return tuple(value)


def _codes(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _Bad('expected a list of rule codes or prefixes, such as ["G2T1", "G2T201"]')
    codes = tuple(v.strip().upper() for v in value)
    unknown = unknown_codes(codes)
    if unknown:
        raise _Bad(f"unknown rule code or prefix {unknown[0]} (see `gpu2tpu rules`)")
    return codes


def _boolean(value: object) -> bool:
    if not isinstance(value, bool):
        raise _Bad("expected true or false (a TOML boolean, without quotes)")
    return value


def _byte_count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise _Bad("expected a positive whole number of bytes, such as 8388608")
    return value


def _torch_version(value: object) -> str:
    from ..core.torch_target import TargetError, normalize

    if not isinstance(value, str):
        raise _Bad('expected a torch version in quotes, such as "2.6" (a number drops zeros)')
    try:
        return normalize(value)
    except TargetError:
        raise _Bad('expected a torch version, such as "2.6"') from None


@dataclass(frozen=True)
class _Key:
    attribute: str
    read: Callable[[object], object]


SCHEMA: dict[str, _Key] = {
    "exclude": _Key("exclude", _strings),
    "select": _Key("select", _codes),
    "ignore": _Key("ignore", _codes),
    "unsafe-fixes": _Key("unsafe_fixes", _boolean),
    "max-file-size": _Key("max_file_size", _byte_count),
    "target-torch": _Key("target_torch", _torch_version),
    "respect-gitignore": _Key("respect_gitignore", _boolean),
}


@dataclass(frozen=True)
class ToolSection:
    """`[tool.gpu2tpu]`, checked: None where the key is not set."""

    exclude: tuple[str, ...] = ()
    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] | None = None
    unsafe_fixes: bool | None = None
    max_file_size: int | None = None
    target_torch: str | None = None
    respect_gitignore: bool | None = None


Selection = tuple[tuple[str, ...] | None, tuple[str, ...] | None]  # (select, ignore); None: unset


def _specificity(selector: str, code: str) -> int:
    """How specific `selector` is for `code` (`ALL` 0, a prefix its length); -1: no match."""
    if selector == "ALL":
        return 0
    return len(selector) if code.startswith(selector) else -1


def selected_codes(layers: tuple[Selection, ...], codes: tuple[str, ...]) -> frozenset[str]:
    """The rule codes that `layers` (the table's selection, then the command line's) leave
    on, as ruff's rule selection: every rule before the first layer."""
    enabled = frozenset(codes)
    for select, ignore in layers:
        if select is None and not ignore:
            continue
        kept = set()
        for code in codes:
            ignored = max((_specificity(p, code) for p in ignore or ()), default=-1)
            if select is None:
                on = code in enabled and ignored < 0
            else:
                chosen = max((_specificity(p, code) for p in select), default=-1)
                on = chosen >= 0 and chosen > ignored
            if on:
                kept.add(code)
        enabled = frozenset(kept)
    return enabled


def rule_options(layers: tuple[Selection, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """`Options.select` and `Options.ignore` for the rules `layers` leave on: both empty for
    every rule, else the codes themselves (an empty `select` means every rule to `Options`,
    so no rule at all is every code ignored)."""
    if all(select is None and not ignore for select, ignore in layers):
        return (), ()
    from ..rules.base import all_rules

    codes = tuple(r.code for r in all_rules())
    enabled = selected_codes(layers, codes)
    if len(enabled) == len(codes):
        return (), ()
    if not enabled:
        return (), codes
    return tuple(c for c in codes if c in enabled), ()


def unknown_codes(codes: tuple[str, ...]) -> list[str]:
    """The codes that are no rule code and no prefix of one (`ALL` is every rule)."""
    if not codes:
        return []
    from ..rules.base import all_rules

    known = [r.code for r in all_rules()]
    return [c for c in codes if c != "ALL" and not any(k.startswith(c) for k in known)]


def shown(value: object) -> str:
    """A value as TOML writes it (near enough: JSON's strings, booleans, lists), cut short."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_section(raw: object, where: str) -> ToolSection:
    """`raw` (the table read from `where`) checked against `SCHEMA`; every bad value, and
    every unknown key, is a line of the `ConfigError`."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: [tool.gpu2tpu] = {shown(raw)}: expected a table")
    values: dict[str, object] = {}
    problems = []
    for key, value in raw.items():
        spec = SCHEMA.get(key)
        if spec is None:
            problems.append(
                f"{where}: unknown [tool.gpu2tpu] key {key!r} (the keys are: {', '.join(SCHEMA)})"
            )
            continue
        try:
            values[spec.attribute] = spec.read(value)
        except _Bad as bad:
            problems.append(f"{where}: [tool.gpu2tpu] {key} = {shown(value)}: {bad}")
    if problems:
        raise ConfigError(problems)
    return ToolSection(**values)  # type: ignore[arg-type]  # each value checked against SCHEMA above


def read_section(path: Path, where: str | None = None) -> ToolSection | None:
    """The checked `[tool.gpu2tpu]` of the pyproject.toml at `path` (`where`: its name in
    messages); None without one."""
    import tomllib

    where = where or str(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise ConfigError(f"{where}: cannot read [tool.gpu2tpu]: {err}") from None
    tool = data.get("tool")
    if tool is None:
        return None
    if not isinstance(tool, dict):
        raise ConfigError(f"{where}: tool = {shown(tool)}: expected a table ([tool.NAME] ...)")
    if "gpu2tpu" not in tool:
        return None
    return parse_section(tool["gpu2tpu"], where)


# -- the command line's settings, over each file's -------------------------------------------------


@dataclass(frozen=True)
class Overrides:
    """What the command line says; None where it says nothing."""

    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] | None = None
    unsafe_fixes: bool | None = None
    exclude: tuple[str, ...] = ()
    target_torch: str | None = None
    respect_gitignore: bool | None = None
    jobs: int = 0


@dataclass
class ProjectConfigs:
    """Each folder's `Config` (engine.py), from its project's files; cached by folder."""

    overrides: Overrides
    cwd: Path
    _sections: dict[str, tuple[Path, ToolSection] | None] = field(default_factory=dict)
    _pins: dict[str, Pin | None] = field(default_factory=dict)
    _configs: dict[str, Config] = field(default_factory=dict)
    _scopes: dict[str, Scope] = field(default_factory=dict)

    def __call__(self, folder: str) -> Config:
        folder = os.path.abspath(folder)
        found = self._configs.get(folder)
        if found is None:
            found = self._configs[folder] = self._build(folder)
        return found

    def scope(self, folder: str) -> Scope:
        """What a walk of `folder` needs (`Config.scope`), without looking for torch pins."""
        found = self._scopes.get(folder)
        if found is None:
            root, section = self._located(folder)
            found = self._scopes[folder] = Scope(
                root, (*section.exclude, *self.overrides.exclude), self._gitignore(section)
            )
        return found

    def _located(self, folder: str) -> tuple[Path, ToolSection]:
        located = self._section(os.path.abspath(folder)) or self._section(str(self.cwd))
        return located if located else (self.cwd, ToolSection())

    def _gitignore(self, section: ToolSection) -> bool:
        if self.overrides.respect_gitignore is not None:
            return self.overrides.respect_gitignore
        return section.respect_gitignore is not False

    def _build(self, folder: str) -> Config:
        root, section = self._located(folder)
        o = self.overrides
        select, ignore = rule_options(((section.select, section.ignore), (o.select, o.ignore)))
        target, source, pin = self._target(folder, root, section)
        unsafe = o.unsafe_fixes if o.unsafe_fixes is not None else bool(section.unsafe_fixes)
        return Config(
            options=Options(select=select, ignore=ignore, unsafe_fixes=unsafe, target_torch=target),
            exclude=(*section.exclude, *o.exclude),
            max_bytes=section.max_file_size or DEFAULT_MAX_BYTES,
            jobs=o.jobs,
            root=root,
            respect_gitignore=self._gitignore(section),
            target_source=source,
            target_pin=pin,
        )

    def selects_nothing(self) -> bool:
        """Whether every configuration this run used leaves no rule on (`select = []`,
        `ignore = ["ALL"]`): nothing was checked, which a summary alone would not say."""
        built = list(self._configs.values())
        if not built or not all(c.options.ignore for c in built):
            return False
        from ..rules.base import all_rules

        codes = [r.code for r in all_rules()]
        return not any(c.options.enabled(code) for c in built for code in codes)

    def _section(self, folder: str) -> tuple[Path, ToolSection] | None:
        """The nearest pyproject.toml with `[tool.gpu2tpu]` at or above `folder`."""
        walked = []
        found: tuple[Path, ToolSection] | None = None
        current = folder
        while True:
            if current in self._sections:
                found = self._sections[current]
                break
            walked.append(current)
            candidate = os.path.join(current, "pyproject.toml")
            section = (
                read_section(Path(candidate), self._shown_path(Path(candidate)))
                if os.path.isfile(candidate)
                else None
            )
            if section is not None:
                found = (Path(current), section)
                break
            parent = os.path.dirname(current)
            if parent == current:
                break
            current = parent
        for seen in walked:
            self._sections[seen] = found
        return found

    def _target(
        self, folder: str, root: Path, section: ToolSection
    ) -> tuple[str | None, str, Pin | None]:
        """target-torch, where it came from, and the pin that set it (when one did)."""
        from ..core.torch_target import TargetError, normalize

        if self.overrides.target_torch:
            try:
                return normalize(self.overrides.target_torch), "--target-torch", None
            except TargetError as err:
                raise ConfigError(str(err)) from None
        if section.target_torch:
            where = self._shown_path(root / "pyproject.toml")
            return section.target_torch, f"[tool.gpu2tpu] target-torch in {where}", None
        pin = self._nearest_pin(folder) or self._nearest_pin(str(self.cwd))
        return (pin.version, pin.source, pin) if pin else (None, "", None)

    def _nearest_pin(self, folder: str) -> Pin | None:
        """The lowest torch the pins of the nearest folder with any admit (its `source` says
        where it was read, from the current folder); the search stops at the top of the
        folder's git repository."""
        from ..core.torch_target import project_floor

        walked = []
        found: Pin | None = None
        current = folder
        while True:
            if current in self._pins:
                found = self._pins[current]
                break
            walked.append(current)
            pin = project_floor(Path(current))
            if pin is not None:
                where = self._shown_path(Path(current))
                prefix = "" if where == "." else f"{where}/"
                found = dataclasses.replace(pin, source=prefix + pin.source)
                break
            parent = os.path.dirname(current)
            if parent == current or os.path.exists(os.path.join(current, ".git")):
                break
            current = parent
        for seen in walked:
            self._pins[seen] = found
        return found

    def _shown_path(self, path: Path) -> str:
        """`path` relative to the current folder where it lies below it, else absolute."""
        try:
            return path.relative_to(self.cwd).as_posix() or "."
        except ValueError:
            return str(path)
