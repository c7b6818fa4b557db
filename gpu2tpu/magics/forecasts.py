"""The forecasts a session made, so that a later `%%tpu --profile` of the same model shows the
compiled TPU figures instead of rooflines from a CPU run.

A profile on a machine without a TPU estimates TPU rows from the CPU run: FLOPs and bytes
counted by PyTorch on the CPU, unfused, scaled by the CPU's efficiency. A forecast of the
same model compiled the step with libtpu for those TPUs. Shown side by side without a word,
the two disagree by one or two orders of magnitude; here the profile's TPU rows take the
forecast's compiled step times and say where they come from.

It also finds what `%%tpu --forecast` forecasts in the notebook (`find_forecast_inputs`): the
model, the batch, the optimizer and the loss, by name first and then by type (a notebook's
model is often `cnn` or `net`, its optimizer `opt`), checks them all (an optimizer must train
the model), and only then says which value it took from where and which default it assumed.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
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

# What the forecast assumes for an input the notebook does not give (forecasting/forecast.py's
# defaults: `optimizer="adamw"` with torch's AdamW defaults, `default_loss`, the model's dtypes).
DEFAULTS = {
    "optimizer": "no optimizer found: AdamW(lr=1e-3, weight_decay=0.01) assumed",
    "loss_fn": (
        "no loss function found: cross-entropy assumed for integer targets, mean squared "
        "error otherwise"
    ),
    "dtype": "no `dtype`: the model's own dtypes",
}


class ForecastInputError(ValueError):
    """The notebook does not say what to forecast, or says it twice: one line on what to name."""


@dataclass
class ForecastInputs:
    """What `%%tpu --forecast` forecasts: the values by the names `forecast_cell` reads
    (`model`, `batch`, `optimizer`, ...), and the lines to say first (which value was taken
    from where, which default was assumed)."""

    values: dict[str, Any]
    lines: list[str]
    names: dict[str, str]  # the notebook's name of each value ("model" -> "cnn")


def find_forecast_inputs(
    ns: Mapping[str, Any], binds: frozenset[str] = frozenset()
) -> ForecastInputs:
    """The forecast's inputs, by name first (`model`, `optimizer`, `loss_fn`), then by type:
    the one torch.nn.Module that is not a loss or a part of another (`cnn`), the one
    optimizer that trains it (`opt`, `d_optimizer`), the one loss module (`criterion`).

    `binds` are the names the cell itself bound: the others are said to come from an earlier
    cell. Everything is checked before anything is said, so no value is announced and then
    refused. Raises `ForecastInputError` when a required input is missing or ambiguous.
    """
    values: dict[str, Any] = {}
    lines: list[str] = []
    names: dict[str, str] = {}

    def take(role: str, name: str, how: str) -> None:
        values[role], names[role] = ns[name], name
        where = "this cell" if name in binds else "an earlier cell"
        if name == role and name in binds:
            return  # the cell named it as the forecast reads it: nothing to say
        lines.append(f"gpu2tpu: --forecast uses `{name}` {how}from {where}: {describe(ns[name])}")

    model_name = _find_model(ns)
    take("model", model_name, "" if model_name == "model" else "as the model ")
    model = values["model"]
    batch_name = next((n for n in ("batch", "example_batch") if ns.get(n) is not None), None)
    if batch_name is None:
        raise ForecastInputError(
            "%%tpu --forecast needs the cell to define `batch` (or `example_batch`): a pair "
            "(inputs, targets) with the model called as model(inputs)"
        )
    take("batch", batch_name, "")
    optimizer_name = _find_optimizer(ns, model, model_name, binds)
    if optimizer_name is None:
        lines.append(f"gpu2tpu: --forecast: {DEFAULTS['optimizer']}")
    else:
        take(
            "optimizer",
            optimizer_name,
            "" if optimizer_name == "optimizer" else "as the optimizer ",
        )
    loss_name = _find_loss(ns)
    if loss_name is None:
        lines.append(f"gpu2tpu: --forecast: {DEFAULTS['loss_fn']}")
    else:
        take("loss_fn", loss_name, "" if loss_name == "loss_fn" else "as the loss ")
    for name in ("tokens_per_step", "dtype"):
        if ns.get(name) is not None:
            take(name, name, "")
    if "dtype" not in values:
        lines.append(f"gpu2tpu: --forecast: {DEFAULTS['dtype']}")
    return ForecastInputs(values, lines, names)


def _user_names(ns: Mapping[str, Any]) -> list[str]:
    """The namespace's own names: not IPython's (`_`, `_i3`, `Out`) nor private ones."""
    return [n for n in ns if not n.startswith("_") and n not in ("In", "Out")]


def could_find_a_model(ns: Mapping[str, Any], binds: frozenset[str]) -> bool:
    """Whether a model may be there once the cell has run: the cell binds a name, or the
    notebook already holds a model (checked before the cell runs, to stop early)."""
    if binds:
        return True
    try:
        _find_model(ns)
    except ForecastInputError as err:
        return "several models" in str(err)
    return True


def model_in(ns: Mapping[str, Any]) -> Any:
    """The model `%%tpu --forecast` would take from `ns`, or None (none, or several)."""
    try:
        return ns[_find_model(ns)]
    except ForecastInputError:
        return None


def _find_model(ns: Mapping[str, Any]) -> str:
    import torch

    if isinstance(ns.get("model"), torch.nn.Module):
        return "model"
    found = {
        n: v
        for n in _user_names(ns)
        if isinstance(v := ns[n], torch.nn.Module) and not _is_loss(v) and _has_parameters(v)
    }
    # A part of another (`encoder = model.encoder`) is not a model of its own.
    parts = {id(m) for v in found.values() for m in v.modules() if m is not v}
    roots = sorted(n for n, v in found.items() if id(v) not in parts)
    unique = {id(found[n]): n for n in roots}  # two names of one model are one model
    if len(unique) == 1:
        return next(iter(unique.values()))
    if not unique:
        raise ForecastInputError(
            "%%tpu --forecast needs the cell to define `model` (a torch.nn.Module); neither "
            "this cell nor an earlier one made one"
        )
    names = ", ".join(f"`{n}`" for n in sorted(unique.values()))
    raise ForecastInputError(
        f"%%tpu --forecast found several models ({names}); name the one to forecast "
        "`model` (`model = ...`)"
    )


def _find_optimizer(
    ns: Mapping[str, Any], model: Any, model_name: str, binds: frozenset[str]
) -> str | None:
    import torch

    named = ns.get("optimizer")
    if named is not None:
        why = optimizer_mismatch(named, model)
        if why is None:
            return "optimizer"
        origin = "this cell's" if "optimizer" in binds else "an earlier cell's"
        kind = type(named).__name__
        raise ForecastInputError(
            f"%%tpu --forecast: `optimizer` ({kind}, {origin}) {why.replace('`model`', f'`{model_name}`')} "
            f"({describe(model)}); define it in this cell as `optimizer = "
            f"torch.optim.{kind}({model_name}.parameters(), ...)`, or `del optimizer` to "
            "forecast with AdamW"
        )
    trains = sorted(
        n
        for n in _user_names(ns)
        if isinstance(ns[n], torch.optim.Optimizer) and optimizer_mismatch(ns[n], model) is None
    )
    if len(trains) > 1:
        names = ", ".join(f"`{n}`" for n in trains)
        raise ForecastInputError(
            f"%%tpu --forecast found several optimizers of `{model_name}` ({names}); name the "
            "one to use `optimizer`"
        )
    return trains[0] if trains else None


def _find_loss(ns: Mapping[str, Any]) -> str | None:
    if ns.get("loss_fn") is not None:
        return "loss_fn"
    losses = sorted(n for n in _user_names(ns) if _is_loss(ns[n]))
    if len(losses) > 1:
        names = ", ".join(f"`{n}`" for n in losses)
        raise ForecastInputError(
            f"%%tpu --forecast found several loss functions ({names}); name the one to use "
            "`loss_fn`"
        )
    return losses[0] if losses else None


def _has_parameters(module: Any) -> bool:
    return next(module.parameters(), None) is not None


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
