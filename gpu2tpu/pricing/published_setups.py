"""How published training runs held their step in memory (`published_setups.toml`).

A forecast whose step "does not fit" a chip sets it beside a published run of the same model
on the same chip, where one is known: what batch a chip that run held, in what precision,
with which optimizer, attention dropout and checkpointing (`forecasting/fit_verdict.py`).
Facts only, each entry with its sources; nothing here is fitted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .toml_table import read_toml

DEFAULT_PATH = Path(__file__).with_name("published_setups.toml")
_REQUIRED = ("run", "what", "chip", "model_class", "parameters", "sequence", "per_chip_batch",
             "optimizer", "activations", "weights", "checkpointing", "sources", "read")  # fmt: skip


class PublishedSetupsError(ValueError):
    """The setups table is missing, not TOML, or an entry lacks a field."""


@dataclass(frozen=True)
class PublishedSetup:
    """One published run's step as its sources state it."""

    run: str
    what: str
    chip: str
    model_class: str
    parameters: int
    sequence: int
    per_chip_batch: int
    optimizer: str
    activations: str  # "bf16" or "fp32"
    weights: str  # the stored weights' precision
    checkpointing: str  # "none", "every block", ...
    sources: tuple[str, ...]
    read: str
    parameters_tolerance: float = 0.15
    attention_dropout: float | None = None
    gradient_accumulation: bool = False
    notes: str = ""
    commit: str = ""

    def matches(
        self, chip: str, model_class: str | None, parameters: int, sequence: int | None
    ) -> bool:
        """Whether a step of this size and shape on `chip` is this run's model."""
        if chip != self.chip or sequence != self.sequence:
            return False
        if model_class is not None and model_class != self.model_class:
            return False
        return abs(parameters - self.parameters) <= self.parameters_tolerance * self.parameters

    @property
    def source(self) -> str:
        """The first source's address (its description dropped), for one-line views."""
        return self.sources[0].split(" ")[0]


def load_published_setups(path: str | Path | None = None) -> tuple[PublishedSetup, ...]:
    """Read and check the table (the shipped one by default)."""
    data_path = Path(path) if path is not None else DEFAULT_PATH
    data = read_toml(data_path, "published-setups table", PublishedSetupsError)
    return tuple(_setup(i, table, data_path) for i, table in enumerate(data.get("setups") or []))


def _setup(index: int, table: dict[str, Any], path: Path) -> PublishedSetup:
    missing = [name for name in _REQUIRED if table.get(name) in (None, "", [])]
    if missing:
        raise PublishedSetupsError(f"{path}: setup {index + 1} lacks {', '.join(missing)}.")
    known = set(PublishedSetup.__dataclass_fields__)
    unknown = sorted(set(table) - known)
    if unknown:
        raise PublishedSetupsError(
            f"{path}: setup {index + 1} has unknown fields {', '.join(unknown)}."
        )
    values = dict(table)
    values["sources"] = tuple(values["sources"])
    return PublishedSetup(**values)
