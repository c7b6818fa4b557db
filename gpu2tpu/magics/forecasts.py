"""The forecasts a session made, so that a later `%%tpu --profile` of the same model shows the
compiled TPU figures instead of rooflines from a CPU run.

A profile on a machine without a TPU estimates TPU rows from the CPU run: FLOPs and bytes
counted by PyTorch on the CPU, unfused, scaled by the CPU's efficiency. A forecast of the
same model compiled the step with libtpu for those TPUs. Shown side by side without a word,
the two disagree by one or two orders of magnitude; here the profile's TPU rows take the
forecast's compiled step times and say where they come from.

It also holds what `%%tpu --forecast` reads from the notebook (`FORECAST_INPUTS`): the magic
names every value an earlier cell left behind before using it, and checks that an optimizer
it would use trains the model being forecast.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any


@dataclass
class _Remembered:
    forecast: Any
    number: int
    name: str


class ForecastMemory:
    """Forecasts by the model object they forecast (held weakly: a deleted model is forgotten)."""

    def __init__(self) -> None:
        self._by_model: weakref.WeakKeyDictionary[Any, _Remembered] = weakref.WeakKeyDictionary()

    def remember(self, model: Any, forecast: Any, number: int, name: str = "model") -> None:
        if model is None or not hasattr(forecast, "comparison"):
            return
        try:
            self._by_model[model] = _Remembered(forecast, number, name)
        except TypeError:  # not weak-referenceable: nothing to remember it by
            return

    def apply(self, result: Any, model: Any) -> str | None:
        """Give `result`'s estimated TPU rows the compiled figures of the forecast of `model`.

        Only when the forecast was made at the batch the profile ran (when the profile knows
        its batch). Returns the line to say, or None when nothing changed.
        """
        if model is None or not hasattr(result, "comparison"):
            return None
        try:
            remembered = self._by_model.get(model)
        except TypeError:
            return None
        if remembered is None:
            return None
        forecast = remembered.forecast
        batch = getattr(result, "samples_per_step", None)
        if batch is not None and batch != getattr(forecast, "batch", batch):
            return None
        from ..pricing.compare import Comparison, ComparisonRow

        comparison = result.comparison
        catalogue = comparison.catalogue
        compiled = {
            (r.device_key, r.chips): r for r in forecast.comparison.rows if r.source == "compiled"
        }
        rows = []
        replaced = []
        column = (comparison.prices_used or {}).get("column", "on_demand")
        for row in comparison.rows:
            twin = compiled.get((row.device_key, row.chips))
            chip = catalogue.find(row.device_key) if catalogue is not None else None
            if row.source != "estimated" or twin is None or chip is None:
                rows.append(row)
                continue
            rows.append(
                ComparisonRow.build(
                    chip,
                    twin.step_seconds,
                    "compiled",
                    chips=row.chips,
                    price=column,
                    samples_per_step=comparison.workload.get("samples_per_step"),
                    tokens_per_step=comparison.workload.get("tokens_per_step"),
                    dataset_size=comparison.workload.get("dataset_size"),
                    memory_bytes=twin.memory_bytes,
                    fits=twin.fits,
                    time_kind=twin.time_kind,
                    step_low=twin.step_low,
                    step_high=twin.step_high,
                    bound_seconds=twin.bound_seconds,
                    note=(
                        f"compiled figures of the forecast of `{remembered.name}` in "
                        f"In[{remembered.number}] (libtpu), not this run's figures"
                    ),
                )
            )
            replaced.append(row.label)
        if not replaced:
            return None
        result.comparison = Comparison.from_rows(
            rows,
            baseline_key=comparison.baseline_key,
            catalogue=catalogue,
            price=column,
            workload=comparison.workload,
            title=comparison.title,
        )
        return (
            f"gpu2tpu: {', '.join(replaced)}: the compiled figures of the forecast of "
            f"`{remembered.name}` in In[{remembered.number}], not this run's figures"
        )


# -- what `%%tpu --forecast` reads from the notebook ---------------------------------------------

# The variables the forecast reads, what each should hold, and whether it must be there.
FORECAST_INPUTS: tuple[tuple[tuple[str, ...], str, bool], ...] = (
    (("model",), "a torch.nn.Module", True),
    (("batch", "example_batch"), "a pair (inputs, targets)", True),
    (("optimizer",), "a torch optimizer or a name", False),
    (("loss_fn",), "loss_fn(output, targets)", False),
    (("tokens_per_step",), "a number", False),
    (("dtype",), "a torch dtype", False),
)


def describe(value: Any) -> str:
    """A short description of a value the forecast will use."""
    import torch

    if isinstance(value, torch.nn.Module) and not list(value.children()) and _is_loss(value):
        return f"{type(value).__name__}()"
    if isinstance(value, torch.nn.Module):
        count = sum(p.numel() for p in value.parameters())
        return f"{type(value).__name__} ({count:,} parameters)"
    if isinstance(value, torch.optim.Optimizer):
        count = sum(len(g["params"]) for g in value.param_groups)
        lr = value.param_groups[0].get("lr") if value.param_groups else None
        rate = f", lr={lr:g}" if isinstance(lr, int | float) else ""
        return f"{type(value).__name__} over {count} tensors{rate}"
    if isinstance(value, tuple | list):
        shapes = [tuple(getattr(v, "shape", ())) or type(v).__name__ for v in value]
        return f"{type(value).__name__} of {', '.join(str(s) for s in shapes)}"
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"{type(value).__name__} {tuple(shape)}"
    if callable(value):
        return getattr(value, "__qualname__", None) or type(value).__name__
    return repr(value) if isinstance(value, int | float | str) else type(value).__name__


def _is_loss(module: Any) -> bool:
    import torch

    return isinstance(module, torch.nn.modules.loss._Loss)


def optimizer_mismatch(optimizer: Any, model: Any) -> str | None:
    """Why `optimizer` cannot train `model` (it holds other tensors, or none of the model's
    trainable parameters), as a phrase; None when it fits or is a name or class."""
    groups = getattr(optimizer, "param_groups", None)
    parameters = getattr(model, "parameters", None)
    if groups is None or parameters is None:
        return None
    own = {id(p): p for p in parameters()}
    held = [p for g in groups for p in g.get("params", ())]
    foreign = sum(id(p) not in own for p in held)
    if foreign:
        return f"holds {foreign} of {len(held)} tensors that are not parameters of `model`"
    if not any(id(p) in own and p.requires_grad for p in held):
        return "holds none of `model`'s trainable parameters"
    return None
