"""The hardware catalogue: peak compute, memory and prices of TPUs, GPUs and Trainium.

The figures live in `hardware.toml` next to this module, each with its source and date, so
that a price can be checked and refreshed without touching code. Users bring their own prices
(discounts, committed-use contracts) as overrides: a dict or a TOML/JSON file. Every
override is validated here, so a typo fails with the name of the bad field instead of
quietly costing a run at the list price.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import date
from pathlib import Path
from typing import Any

from .toml_table import read_toml

DEFAULT_PATH = Path(__file__).with_name("hardware.toml")

CHIP_KINDS = ("tpu", "gpu", "trainium", "cpu")
PRICE_FIELDS = ("price_on_demand", "price_spot")
QUANTITY_FIELDS = ("peak_bf16_flops", "hbm_bytes", "hbm_bandwidth")
# Figures only some chips have (each with its own source when present).
OPTIONAL_QUANTITY_FIELDS = (
    "ici_bandwidth",
    "peak_fp16_flops",
    "peak_tf32_flops",
    "peak_fp32_flops",
)
# The precisions a step can be costed at (docs/forecast.md, "Precision").
PRECISIONS = ("bf16", "fp16", "tf32", "fp32")
# Fields a user may override, with what each one means (for error messages).
OVERRIDE_FIELDS = {
    "price_on_demand": "a non-negative number of USD per chip-hour",
    "price_spot": "a non-negative number of USD per chip-hour",
    "note": "a string saying where the price comes from",
}

_UNITS = {
    # compute
    "flop/s": 1.0,
    "gflop/s": 1e9,
    "tflop/s": 1e12,
    "pflop/s": 1e15,
    # capacity
    "b": 1.0,
    "kb": 1e3,
    "mb": 1e6,
    "gb": 1e9,
    "tb": 1e12,
    "kib": 2.0**10,
    "mib": 2.0**20,
    "gib": 2.0**30,
    "tib": 2.0**40,
    # bandwidth
    "b/s": 1.0,
    "mb/s": 1e6,
    "gb/s": 1e9,
    "tb/s": 1e12,
    "gib/s": 2.0**30,
    "tib/s": 2.0**40,
}
_QUANTITY = re.compile(r"^\s*([0-9][0-9_,]*(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?)\s*([A-Za-z/]+)\s*$")
_DATE_AT_END = re.compile(r",\s*(\d{4}(?:-\d{2}(?:-\d{2})?)?)\s*$")


class CatalogueError(ValueError):
    """The catalogue data file is malformed; the message names the file, the chip and field."""


class UnknownChip(KeyError):
    """A chip name the catalogue does not know; the message lists the known keys."""

    def __str__(self) -> str:  # KeyError would print the message with quotes around it
        return str(self.args[0]) if self.args else ""


class PriceOverrideError(ValueError):
    """A price override that cannot be applied; the message names the bad field."""


@dataclass(frozen=True)
class Chip:
    """One accelerator with its published figures, per chip.

    `peak_bf16_flops` is dense BF16 FLOP/s (0.0 where no peak applies, as for the host CPU);
    `hbm_bytes` and `hbm_bandwidth` are bytes and bytes/s; prices are USD per chip-hour or
    None where no public price exists. `sources` maps each field to "source, date".
    `ici_bandwidth` is a TPU's bidirectional inter-chip interconnect bandwidth per chip in
    bytes/s, all its links together, as Google states it (None where no figure is published).
    """

    key: str
    name: str
    vendor: str
    kind: str
    peak_bf16_flops: float
    hbm_bytes: int
    hbm_bandwidth: float
    price_on_demand: float | None
    price_spot: float | None
    sources: Mapping[str, str]
    as_of: str
    notes: str = ""
    aliases: tuple[str, ...] = field(default=(), compare=False)
    ici_bandwidth: float | None = None
    peak_fp16_flops: float | None = None
    peak_tf32_flops: float | None = None
    peak_fp32_flops: float | None = None

    def peak_for(self, precision: str) -> tuple[float | None, str]:
        """The dense peak for a step in `precision`, and what that peak is.

        bf16 and fp16 are the tensor-core (MXU) peaks. "tf32" and "fp32" both mean float32
        arrays: on a GPU with TF32 tensor cores they are costed at the TF32 peak (NVIDIA's
        published fp32 training runs enable it; PyTorch's convolutions use it by default),
        elsewhere at the plain fp32 peak; on a TPU at XLA's default matmul precision, one
        bfloat16 pass (`peak_fp32_flops`, sourced). None where the catalogue has no figure.
        """
        if precision not in PRECISIONS:
            raise ValueError(
                f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}."
            )
        if precision == "bf16":
            return (self.peak_bf16_flops or None), "dense BF16"
        if precision == "fp16":
            return self.peak_fp16_flops, "dense FP16 tensor"
        if self.kind == "gpu" and self.peak_tf32_flops:
            return self.peak_tf32_flops, "dense TF32 tensor"
        if self.kind == "tpu":
            return self.peak_fp32_flops, "fp32 at XLA's default matmul precision (one bf16 pass)"
        return self.peak_fp32_flops, "FP32"

    def price(self, column: str = "on_demand") -> float | None:
        """The price per chip-hour in `column` ("on_demand" or "spot"), or None."""
        if column not in ("on_demand", "spot"):
            raise ValueError(f"price column must be 'on_demand' or 'spot', not {column!r}.")
        return self.price_on_demand if column == "on_demand" else self.price_spot

    @property
    def has_peak(self) -> bool:
        """Whether the catalogue gives a peak compute figure (the host CPU has none)."""
        return self.peak_bf16_flops > 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "name": self.name,
            "vendor": self.vendor,
            "kind": self.kind,
            "peak_bf16_flops": self.peak_bf16_flops,
            "hbm_bytes": self.hbm_bytes,
            "hbm_bandwidth": self.hbm_bandwidth,
            "price_on_demand": self.price_on_demand,
            "price_spot": self.price_spot,
            "sources": dict(self.sources),
            "as_of": self.as_of,
            "notes": self.notes,
            "ici_bandwidth": self.ici_bandwidth,
            "peak_fp16_flops": self.peak_fp16_flops,
            "peak_tf32_flops": self.peak_tf32_flops,
            "peak_fp32_flops": self.peak_fp32_flops,
        }


def parse_quantity(text: str | float | int, *, where: str) -> float:
    """Convert "197 TFLOP/s", "16 GiB" or "4.8 TB/s" to a plain number in base units."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        return float(text)
    match = _QUANTITY.match(str(text))
    if not match:
        raise CatalogueError(f"{where}: {text!r} is not a number with a unit like '819 GB/s'.")
    number, unit = match.groups()
    scale = _UNITS.get(unit.lower())
    if scale is None:
        raise CatalogueError(f"{where}: unknown unit {unit!r} (known: {', '.join(_UNITS)}).")
    return float(number.replace("_", "").replace(",", "")) * scale


def _normalise(name: str) -> str:
    """Lower-case and drop vendor words and separators, so "NVIDIA H100-80GB" == "h100 80gb"."""
    text = name.strip().lower()
    text = re.sub(r"^(nvidia|tesla|google|cloud|aws|amazon)[\s_-]+", "", text)
    text = re.sub(r"^(nvidia|tesla)[\s_-]+", "", text)
    return re.sub(r"[\s_\-:()]+", "", text)


def source_date(source: str) -> str | None:
    """The date at the end of a "source, date" string, or None."""
    match = _DATE_AT_END.search(source)
    return match.group(1) if match else None


def parse_date(text: str) -> date | None:
    """A date from "2026-11-09", "2026-11" or "2026" (the first day of the period)."""
    parts = str(text).strip().split("-")
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        return None
    if not 1 <= len(numbers) <= 3:
        return None
    numbers += [1] * (3 - len(numbers))
    try:
        return date(*numbers)
    except ValueError:
        return None


def describe_age(as_of: str, today: date | None = None) -> str:
    """ "as of 2026-09-26, 65 days old" (or "as of 2026, exact date unknown")."""
    parsed = parse_date(as_of)
    if parsed is None:
        return f"as of {as_of}"
    if len(as_of.split("-")) < 3:
        return f"as of {as_of} (exact date unknown)"
    days = ((today or date.today()) - parsed).days
    return f"as of {as_of}, {days} days old"


class HardwareCatalogue:
    """Chips by key, with name aliases, loaded from the TOML data file plus user overrides.

    `overrides` records what the user changed, `{key: {field: value}}`, so every view can say
    which prices it used.
    """

    def __init__(
        self,
        chips: Mapping[str, Chip],
        *,
        path: Path | None = None,
        meta: Mapping[str, Any] | None = None,
        overrides: Mapping[str, Mapping[str, Any]] | None = None,
        override_source: str | None = None,
    ) -> None:
        self._chips = dict(chips)
        self.path = path
        self.meta = dict(meta or {})
        self.overrides = {k: dict(v) for k, v in (overrides or {}).items()}
        self.override_source = override_source
        self._aliases: dict[str, str] = {}
        for chip in self._chips.values():
            for alias in (chip.key, chip.name, *chip.aliases):
                self._aliases.setdefault(_normalise(alias), chip.key)

    # -- loading -------------------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        path: str | Path | None = None,
        *,
        overrides: Mapping[str, Mapping[str, Any]] | str | Path | None = None,
    ) -> HardwareCatalogue:
        """Read the catalogue (the shipped `hardware.toml` by default) and apply overrides.

        `overrides` is `{"v5e": {"price_on_demand": 0.9}}` or the path of a TOML/JSON file
        holding that mapping (optionally under a top-level `prices` key).
        """
        data_path = Path(path) if path is not None else DEFAULT_PATH
        data = read_toml(data_path, "hardware catalogue file", CatalogueError)
        raw_chips = data.get("chips")
        if not isinstance(raw_chips, dict) or not raw_chips:
            raise CatalogueError(f"{data_path}: no [chips.<key>] tables found.")
        chips = {key: _chip_from_table(key, table, data_path) for key, table in raw_chips.items()}
        catalogue = cls(chips, path=data_path, meta=data.get("meta", {}))
        if overrides is None:
            return catalogue
        return catalogue.with_overrides(overrides)

    def with_overrides(
        self, overrides: Mapping[str, Mapping[str, Any]] | str | Path
    ) -> HardwareCatalogue:
        """A new catalogue with the user's prices applied (validated field by field)."""
        origin = "keyword overrides"
        if isinstance(overrides, str | Path):
            origin = str(overrides)
            overrides = _read_override_file(Path(overrides))
        if not isinstance(overrides, Mapping):
            raise PriceOverrideError(
                f"price overrides must be a mapping like {{'v5e': {{'price_on_demand': 0.9}}}}, "
                f"not {type(overrides).__name__}."
            )
        chips = dict(self._chips)
        applied = {k: dict(v) for k, v in self.overrides.items()}
        today = date.today().isoformat()
        for raw_key, changes in overrides.items():
            key = self._override_key(str(raw_key))
            if not isinstance(changes, Mapping):
                raise PriceOverrideError(
                    f"price override {raw_key!r} must be a table of fields "
                    f"({', '.join(OVERRIDE_FIELDS)}), not {changes!r}."
                )
            chip = chips[key]
            updates: dict[str, Any] = {}
            note = changes.get("note")
            for fld, value in changes.items():
                if fld not in OVERRIDE_FIELDS:
                    raise PriceOverrideError(
                        f"price override {raw_key}.{fld}: unknown field; "
                        f"known fields are {', '.join(OVERRIDE_FIELDS)}."
                    )
                if fld == "note":
                    if not isinstance(value, str):
                        raise PriceOverrideError(f"price override {raw_key}.note must be a string.")
                    continue
                updates[fld] = _check_price(value, f"{raw_key}.{fld}")
            sources = dict(chip.sources)
            for fld in updates:
                sources[fld] = f"user override ({note or origin}), {today}"
            chips[key] = replace(chip, **updates, sources=sources)
            applied.setdefault(key, {}).update(updates)
            if note:
                applied[key]["note"] = note
        return HardwareCatalogue(
            chips, path=self.path, meta=self.meta, overrides=applied, override_source=origin
        )

    def _override_key(self, raw_key: str) -> str:
        try:
            return self.get(raw_key).key
        except UnknownChip:
            raise PriceOverrideError(
                f"price override {raw_key!r}: unknown chip; known chips are {', '.join(self.keys())}."
            ) from None

    # -- looking up ----------------------------------------------------------------------------

    def keys(self) -> list[str]:
        return list(self._chips)

    def get(self, key_or_name: str | Chip) -> Chip:
        """The chip for a key, a name or an alias, case-insensitively ("TPU v5 lite" -> v5e)."""
        if isinstance(key_or_name, Chip):
            return self._chips.get(key_or_name.key, key_or_name)
        if not isinstance(key_or_name, str):
            raise UnknownChip(f"a chip is named by a string, not {type(key_or_name).__name__}.")
        key = self._aliases.get(_normalise(key_or_name))
        if key is None:
            hint = ""
            close = [k for k in self._chips if _normalise(key_or_name) in _normalise(k)]
            if close:
                hint = f" (did you mean {' or '.join(close)}?)"
            raise UnknownChip(
                f"unknown chip {key_or_name!r}{hint}; known chips are {', '.join(self.keys())}."
            )
        return self._chips[key]

    def find(self, key_or_name: str) -> Chip | None:
        """Like `get`, but None for an unknown name (for names reported by a runtime)."""
        try:
            return self.get(key_or_name)
        except UnknownChip:
            return None

    def __contains__(self, key_or_name: object) -> bool:
        return isinstance(key_or_name, str) and self.find(key_or_name) is not None

    def __iter__(self) -> Iterator[Chip]:
        return iter(self._chips.values())

    def __len__(self) -> int:
        return len(self._chips)

    def chips(self, kind: str | None = None) -> list[Chip]:
        """All chips, or those of one kind ("tpu", "gpu", "trainium", "cpu"), in file order."""
        if kind is not None and kind not in CHIP_KINDS:
            raise ValueError(f"chip kind must be one of {', '.join(CHIP_KINDS)}, not {kind!r}.")
        return [c for c in self._chips.values() if kind is None or c.kind == kind]

    def prices_used(
        self, keys: list[str] | None = None, column: str = "on_demand"
    ) -> dict[str, Any]:
        """What a view must show about prices: the column, per-chip dates and any overrides."""
        chosen = [self.get(k) for k in keys] if keys is not None else list(self._chips.values())
        dates = {c.key: c.as_of for c in chosen}
        field_name = f"price_{column}"
        return {
            "column": column,
            "currency": self.meta.get("currency", "USD"),
            "unit": self.meta.get("price_unit", "per chip-hour"),
            "as_of": dates,
            "sources": {c.key: c.sources.get(field_name, "") for c in chosen},
            "prices": {c.key: c.price(column) for c in chosen},
            "overrides": {k: v for k, v in self.overrides.items() if k in dates},
            "override_source": self.override_source,
            "catalogue": str(self.path) if self.path else None,
        }


def _chip_from_table(key: str, table: Any, path: Path) -> Chip:
    where = f"{path.name} [chips.{key}]"
    if not isinstance(table, dict):
        raise CatalogueError(f"{where}: expected a table.")
    for required in ("name", "vendor", "kind", "as_of", *QUANTITY_FIELDS):
        if required not in table:
            raise CatalogueError(f"{where}: missing field {required!r}.")
    if table["kind"] not in CHIP_KINDS:
        raise CatalogueError(f"{where}.kind: {table['kind']!r} is not one of {CHIP_KINDS}.")
    sources = table.get("sources", {})
    if not isinstance(sources, dict):
        raise CatalogueError(f"{where}.sources: expected a table of field = 'source, date'.")
    for fld in (*QUANTITY_FIELDS, *PRICE_FIELDS):
        text = sources.get(fld)
        if not isinstance(text, str) or source_date(text) is None:
            raise CatalogueError(
                f"{where}.sources.{fld}: every figure (and every missing price) needs a "
                f"'source, date' entry; got {text!r}."
            )
    optional: dict[str, float | None] = {}
    for fld in OPTIONAL_QUANTITY_FIELDS:
        if fld not in table:
            optional[fld] = None
            continue
        text = sources.get(fld)
        if not isinstance(text, str) or source_date(text) is None:
            raise CatalogueError(
                f"{where}.sources.{fld}: every figure needs a 'source, date' entry; got {text!r}."
            )
        optional[fld] = parse_quantity(table[fld], where=f"{where}.{fld}")
    prices: dict[str, float | None] = {}
    for fld in PRICE_FIELDS:
        value = table.get(fld)
        prices[fld] = None if value is None else _check_catalogue_price(value, f"{where}.{fld}")
    return Chip(
        key=key,
        name=str(table["name"]),
        vendor=str(table["vendor"]),
        kind=str(table["kind"]),
        peak_bf16_flops=parse_quantity(table["peak_bf16_flops"], where=f"{where}.peak_bf16_flops"),
        hbm_bytes=int(parse_quantity(table["hbm_bytes"], where=f"{where}.hbm_bytes")),
        hbm_bandwidth=parse_quantity(table["hbm_bandwidth"], where=f"{where}.hbm_bandwidth"),
        price_on_demand=prices["price_on_demand"],
        price_spot=prices["price_spot"],
        sources=dict(sources),
        as_of=str(table["as_of"]),
        notes=str(table.get("notes", "")),
        aliases=tuple(str(a) for a in table.get("aliases", ())),
        ici_bandwidth=optional["ici_bandwidth"],
        peak_fp16_flops=optional["peak_fp16_flops"],
        peak_tf32_flops=optional["peak_tf32_flops"],
        peak_fp32_flops=optional["peak_fp32_flops"],
    )


def _check_catalogue_price(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise CatalogueError(f"{where}: a price must be a non-negative number, not {value!r}.")
    return float(value)


def _check_price(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PriceOverrideError(
            f"price override {where}: expected {OVERRIDE_FIELDS[where.rsplit('.', 1)[1]]}, "
            f"got {value!r}."
        )
    if not math.isfinite(value) or value < 0:
        raise PriceOverrideError(
            f"price override {where}: expected a non-negative finite number of USD per "
            f"chip-hour, got {value!r}."
        )
    return float(value)


def _read_override_file(path: Path) -> Mapping[str, Any]:
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise PriceOverrideError(
            f"price override file {path}: cannot be read ({exc.strerror})."
        ) from None
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            data = tomllib.loads(text.decode("utf-8"))
    except (json.JSONDecodeError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        kind = "JSON" if path.suffix.lower() == ".json" else "TOML"
        raise PriceOverrideError(f"price override file {path}: not valid {kind} ({exc}).") from None
    if isinstance(data, dict) and isinstance(data.get("prices"), dict):
        data = data["prices"]
    if not isinstance(data, dict):
        raise PriceOverrideError(
            f"price override file {path}: expected a table of chips, e.g. [v5e] price_on_demand = 0.9."
        )
    return data
