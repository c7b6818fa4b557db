"""What would make a step fit: the verdict a forecast gives where the compiler says "does not fit".

libtpu's out-of-memory message gives one number, the memory the step needs. A person needs
to know what it is made of and what to change, and each change's figure must say where it
comes from (docs/forecast.md, "When a step does not fit"):

- *compiled*: measured by a compile, here the re-check with every block checkpointed and the
  batch search;
- *estimated*: read from the breakdown, which is the step's own shapes (weights, gradients,
  optimizer state, the batch: exact for a data-parallel step, a share for FSDP) and the
  compiler's total less them (activations and temporaries).

Where a published run trained the same model on the same chip (`pricing/published_setups.toml`),
the verdict says what it did and names each setting the user's step does not share.

Pure: `fit_verdict` takes a `TargetForecast` and a `StepMemory`, both plain records.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..pricing.published_setups import PublishedSetup
    from .result import TargetForecast

__all__ = ["FitVerdict", "Remedy", "StepMemory", "fit_verdict"]

# Optimizer state tensors a trainable weight carries, by rule (torch's names).
STATE_PER_WEIGHT = {"SGD": 0, "SGD+momentum": 1, "Adam": 2, "AdamW": 2, "RMSprop": 1}
# A dropout mask is at least a byte an element (XLA's PRED): the lower bound it is counted at.
MASK_BYTES = 1


@dataclass(frozen=True)
class StepMemory:
    """What a training step holds, per chip, from its shapes (`step_memory.py` reads them).

    `weights` (every parameter and buffer), `gradients` (the trainable weights' size),
    `optimizer_state` and `batch` are bytes per chip; `activations` is the floating dtype
    the forward runs in ("fp32", "bf16", ...); `attention_dropout_elements` the elements of
    the (sequence x sequence) probabilities dropout is applied to in one step, per chip;
    `state_per_weight` the optimizer's state tensors a trainable weight carries.
    """

    weights: float
    gradients: float
    optimizer_state: float
    batch: float
    activations: str
    optimizer: str
    state_per_weight: int
    parameters: int
    sequence: int | None = None
    model_class: str | None = None
    attention_dropout_elements: float = 0.0

    @property
    def fixed(self) -> float:
        """What does not grow with the batch: weights, gradients, optimizer state."""
        return self.weights + self.gradients + self.optimizer_state


@dataclass
class Remedy:
    """One change and what the step would need with it, per chip.

    `kind` is "compiled" (a compile measured it) or "estimated" (from the breakdown);
    `memory_per_chip` is what the step would need, `saves` what it no longer would.
    """

    change: str
    kind: str
    memory_per_chip: float | None
    saves: float | None
    fits: bool | None
    detail: str = ""

    def text(self) -> str:
        from ..views.format import format_bytes

        verdict = {True: "fits", False: "does not fit", None: "fit unknown"}[self.fits]
        figures = []
        if self.memory_per_chip is not None:
            figures.append(format_bytes(self.memory_per_chip))
        if self.saves is not None and self.saves > 0:
            figures.append(f"saves {format_bytes(self.saves)}")
        shown = f" ({', '.join(figures)}, {self.kind})" if figures else f" ({self.kind})"
        return f"{self.change}: {verdict}{shown}" + (f"; {self.detail}" if self.detail else "")


@dataclass
class FitVerdict:
    """Why a step does not fit and what would make it fit, per chip.

    `parts` splits the memory the compiler asked for (bytes per chip): "weights",
    "gradients", "optimizer state", "batch" from the step's shapes, and "activations and
    temporaries", the rest; `attention_dropout` is the part of that rest the score-sized
    dropout masks hold at least. `remedies` are the changes, compiled ones first.
    `published` is what a published run of the same model on the same chip did (its
    sources included), `differences` the settings of that run the user's step does not share.
    """

    required: float
    usable: float
    parts: dict[str, float] = field(default_factory=dict)
    attention_dropout: float = 0.0
    remedies: list[Remedy] = field(default_factory=list)
    published: dict[str, Any] | None = None
    differences: list[str] = field(default_factory=list)

    @property
    def fitting(self) -> list[Remedy]:
        return [r for r in self.remedies if r.fits]

    def short(self, shown: Sequence[str] = ()) -> str:
        """One clause for a summary line: the changes that fit, each with its kind (those
        in `shown`, said elsewhere on the line, left out)."""
        fitting = [r for r in self.fitting if r.change not in shown]
        if not fitting:
            return ""
        return "; fits with " + ", or ".join(f"{r.change} ({r.kind})" for r in fitting)

    def lines(self) -> list[str]:
        """The whole verdict, a line each: the breakdown, the changes, the published run."""
        from ..views.format import format_bytes

        parts = ", ".join(f"{name} {format_bytes(value)}" for name, value in self.parts.items())
        head = f"needs {format_bytes(self.required)} of {format_bytes(self.usable)} per chip"
        lines = [head + (f": {parts}" if parts else "")]
        if self.attention_dropout:
            lines.append(
                f"of which attention dropout masks at least {format_bytes(self.attention_dropout)} "
                "(one byte a score, estimated)"
            )
        lines += [r.text() for r in self.remedies]
        if self.published:
            p = self.published
            lines.append(
                f"{p['what']} ran {p['per_chip_batch']} a chip at sequence {p['sequence']}: "
                f"{p['activations']} activations, {p['weights']} weights, {p['optimizer']}, "
                f"attention dropout {p['attention_dropout']}, checkpointing {p['checkpointing']}"
                f" ({p['source']}, read {p['read']})"
                + (f"; {p['notes']}" if p.get("notes") else "")
            )
            lines += [f"unlike it, {d}" for d in self.differences]
        return lines

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FitVerdict:
        values = dict(data)
        values["remedies"] = [Remedy(**r) for r in values.get("remedies") or []]
        return cls(**values)


def fit_verdict(
    target: TargetForecast,
    step: StepMemory,
    setups: Sequence[PublishedSetup] = (),
) -> FitVerdict | None:
    """The verdict for a target that does not fit; None for any other."""
    required, usable = target.memory_per_chip, target.capacity_per_chip
    if target.status != "does not fit" or not required or not usable:
        return None
    parts = {
        "weights": step.weights,
        "gradients": step.gradients,
        "optimizer state": step.optimizer_state,
        "batch": step.batch,
    }
    rest = max(0.0, required - sum(parts.values()))
    parts = {k: v for k, v in parts.items() if v > 0}
    parts["activations and temporaries"] = rest
    verdict = FitVerdict(required, usable, parts)
    verdict.attention_dropout = min(rest, step.attention_dropout_elements * MASK_BYTES)
    verdict.remedies = _remedies(target, step, rest, verdict.attention_dropout)
    setup = next(
        (
            s
            for s in setups
            if s.matches(target.target, step.model_class, step.parameters, step.sequence)
        ),
        None,
    )
    if setup is not None:
        verdict.published = {
            "run": setup.run,
            "what": setup.what,
            "per_chip_batch": setup.per_chip_batch,
            "sequence": setup.sequence,
            "activations": setup.activations,
            "weights": setup.weights,
            "optimizer": setup.optimizer,
            "attention_dropout": setup.attention_dropout,
            "checkpointing": setup.checkpointing,
            "source": setup.source,
            "read": setup.read,
            "notes": setup.notes,
        }
        verdict.differences = _differences(target, step, setup)
    return verdict


def _remedies(
    target: TargetForecast, step: StepMemory, rest: float, dropout: float
) -> list[Remedy]:
    """Each change with its figure: compiled ones (the re-check, the search) first."""
    required, usable = target.memory_per_chip or 0.0, target.capacity_per_chip or 0.0
    remedies: list[Remedy] = []
    variant = target.checkpointed
    if variant is not None and variant.status in ("compiled", "does not fit"):
        detail = ""
        if variant.max_batch is not None:
            detail = (
                f"largest batch so: {variant.max_batch}{'' if variant.max_batch_exact else '+'}"
            )
        remedies.append(
            Remedy(
                "checkpoint every block",
                "compiled",
                variant.memory_per_chip,
                _saves(required, variant.memory_per_chip),
                variant.fits,
                detail,
            )  # fmt: skip
        )
    remedies.append(_smaller_batch(target, step, rest))

    def estimated(change: str, saves: float, detail: str = "") -> None:
        if saves > 0:
            after = required - saves
            remedies.append(Remedy(change, "estimated", after, saves, after <= usable, detail))

    if step.activations == "fp32":
        estimated(
            "bf16 activations (mixed precision, fp32 weights kept)",
            rest / 2,
            "activations and temporaries at half their fp32 bytes",
        )
        estimated(
            "bf16 weights and optimizer state too (no fp32 master copy)",
            rest / 2 + step.fixed / 2,
            "every floating tensor at half its fp32 bytes (forecast(..., dtype='bf16') compiles it)",
        )
    estimated("no attention dropout", dropout, "the score-sized masks, at a byte a score")
    if step.state_per_weight >= 2 and step.optimizer_state > 0:
        estimated(
            "an optimizer with one state tensor a weight (SGD with momentum, Adafactor-like)",
            step.optimizer_state / step.state_per_weight,
            f"{step.optimizer} keeps {step.state_per_weight} a weight",
        )
    return remedies


def _smaller_batch(target: TargetForecast, step: StepMemory, rest: float) -> Remedy:
    """The largest batch that fits: the search's (compiled), else the breakdown's line."""
    if target.max_batch is not None:
        point = next((p for p in target.search if p.get("batch") == target.max_batch), None)
        memory = point.get("memory_per_chip") if point else None
        exact = "" if target.max_batch_exact else "+"
        fits = target.max_batch > 0
        change = f"batch {target.max_batch}{exact}" if fits else "a smaller batch"
        detail = "" if fits else "no batch fits: the batch search found none"
        return Remedy(
            change, "compiled", memory, _saves(target.memory_per_chip, memory), fits, detail
        )
    usable = target.capacity_per_chip or 0.0
    granularity = max(1, target.chips * target.devices_per_chip)
    per_sample = (rest + step.batch) / target.batch if target.batch else 0.0
    room = usable - step.fixed
    if per_sample <= 0 or room <= per_sample * granularity:
        return Remedy(
            "a smaller batch", "estimated", step.fixed, None, False,
            "weights, gradients and optimizer state alone leave no room for one sample a device",
        )  # fmt: skip
    batch = int(math.floor(room / per_sample / granularity)) * granularity
    batch = min(batch, target.batch - granularity)
    memory = step.fixed + batch * per_sample
    return Remedy(
        f"batch {batch}", "estimated", memory, _saves(target.memory_per_chip, memory), True,
        "activations and the batch scaled with the batch size (batch_search=True compiles it)",
    )  # fmt: skip


def _saves(required: float | None, after: float | None) -> float | None:
    return None if required is None or after is None else required - after


def _differences(target: TargetForecast, step: StepMemory, setup: PublishedSetup) -> list[str]:
    """The published run's settings the user's step does not share, a phrase each."""
    found = []
    per_chip = target.batch / max(1, target.chips)
    if per_chip != setup.per_chip_batch:
        found.append(f"your step holds {per_chip:g} sequences a chip, it {setup.per_chip_batch}")
    if step.activations != setup.activations:
        found.append(
            f"your activations are {step.activations}, its {setup.activations} "
            f"(its weights {setup.weights})"
        )
    has_dropout = step.attention_dropout_elements > 0
    if setup.attention_dropout is not None and has_dropout != (setup.attention_dropout > 0):
        found.append(
            "your step applies attention dropout, it none"
            if has_dropout
            else f"it applied attention dropout {setup.attention_dropout}, your step none"
        )
    if target.checkpointed is None and setup.checkpointing != "none":
        found.append(f"it checkpointed ({setup.checkpointing})")
    return found
