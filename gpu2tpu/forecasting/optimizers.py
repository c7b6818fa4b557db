"""Map a torch optimizer to the optax optimizer that does the same update, for the forecast.

The forecast compiles the whole training step in JAX (docs/forecast.md: torchax trains through
optax only), so the user's torch optimizer is read, not run: its class picks the update rule
and its `param_groups` give the hyperparameters. Reading is plain torch and happens before
anything heavy is imported, so an optimizer that has no optax equivalent is refused in one
sentence before a single compile starts. Building the optax transformation is a separate,
lazy step (`to_optax`).

Supported: SGD (with momentum, Nesterov, L2 weight decay), Adam (L2 or decoupled weight
decay, AMSGrad), AdamW (AMSGrad too) and RMSprop (momentum, centered). Parameter groups with
different hyperparameters become an `optax.multi_transform`; parameters that no group holds
or that do not require a gradient are frozen: they get no gradient and no optimizer state,
as in torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

SUPPORTED = ("SGD", "Adam", "AdamW", "RMSprop")

# torch's defaults, used when the optimizer is given by name; SGD has no default lr in torch.
_DEFAULTS: dict[str, dict[str, Any]] = {
    "SGD": {"lr": 1e-3, "momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0, "nesterov": False},
    "Adam": {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "amsgrad": False},
    "AdamW": {
        "lr": 1e-3,
        "betas": (0.9, 0.999),
        "eps": 1e-8,
        "weight_decay": 1e-2,
        "amsgrad": False,
    },
    "RMSprop": {
        "lr": 1e-2,
        "alpha": 0.99,
        "eps": 1e-8,
        "weight_decay": 0.0,
        "momentum": 0.0,
        "centered": False,
    },
}
# Options that change the update rule (everything else, like foreach/fused, only changes speed).
_RULE_KEYS: dict[str, tuple[str, ...]] = {
    "SGD": ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"),
    "Adam": ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "decoupled_weight_decay"),
    "AdamW": ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"),
    "RMSprop": ("lr", "alpha", "eps", "weight_decay", "momentum", "centered", "maximize"),
}


class UnsupportedOptimizer(ValueError):
    """A torch optimizer (or option) that the forecast cannot map to optax; says what works."""


@dataclass(frozen=True)
class GroupRule:
    """One parameter group's update rule: the optimizer kind and its hyperparameters."""

    kind: str
    hyper: tuple[tuple[str, Any], ...]

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.hyper)

    def describe(self) -> str:
        """`AdamW(lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.01)`."""
        shown = ", ".join(f"{k}={v!r}" for k, v in self.hyper if _worth_showing(k, v))
        return f"{self.kind}({shown})"


@dataclass(frozen=True)
class OptimizerPlan:
    """Which parameters train under which rule; everything `to_optax` needs, torch-free.

    `labels` maps each trainable parameter name to an index into `rules`; parameter names
    are those of `model.named_parameters()`.
    """

    rules: tuple[GroupRule, ...]
    labels: Mapping[str, int] = field(default_factory=dict)

    @property
    def trainable(self) -> list[str]:
        return list(self.labels)

    def describe(self) -> str:
        """One rule, or the distinct rules joined with " | " (one per parameter group)."""
        return " | ".join(rule.describe() for rule in self.rules)


def _worth_showing(key: str, value: Any) -> bool:
    """Hide options at their neutral value, so the description stays short."""
    return not (
        value is False or (key in ("maximize", "decoupled_weight_decay", "dampening") and not value)
    )


def _canonical_kind(name: str) -> str:
    lowered = name.strip().lower().replace("_", "").replace("-", "")
    for kind in SUPPORTED:
        if kind.lower() == lowered:
            return kind
    raise UnsupportedOptimizer(
        f"the forecast cannot map the optimizer {name!r} to optax; supported optimizers are "
        f"{', '.join(SUPPORTED)} (pass one of them, by instance or by name)."
    )


def _plain(value: Any) -> Any:
    """A hyperparameter as a plain Python value (torch allows tensors for lr and betas)."""
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    if isinstance(value, list | tuple):
        return tuple(_plain(v) for v in value)
    return value


def _rule(kind: str, group: Mapping[str, Any]) -> GroupRule:
    merged = {**_DEFAULTS[kind], **{k: _plain(v) for k, v in group.items() if k != "params"}}
    hyper = tuple((k, merged[k]) for k in _RULE_KEYS[kind] if k in merged)
    rule = GroupRule(kind, hyper)
    _check_rule(rule)
    return rule


def _check_rule(rule: GroupRule) -> None:
    options = rule.options
    if rule.kind == "SGD" and options.get("dampening", 0.0):
        raise UnsupportedOptimizer(
            f"SGD with dampening={options['dampening']} has no optax equivalent (optax's "
            "momentum is undampened); use dampening=0 for the forecast."
        )
    for key, value in options.items():
        if isinstance(value, float) and value != value:
            raise UnsupportedOptimizer(f"{rule.kind} has {key}=nan, which cannot be compiled.")


def plan_optimizer(
    optimizer: Any, named_parameters: Sequence[tuple[str, torch.Tensor]]
) -> OptimizerPlan:
    """Read a torch optimizer (instance, class, or name such as "adamw") into a plan.

    `named_parameters` is `list(model.named_parameters())`. A name or class uses torch's
    default hyperparameters (lr 1e-3 for SGD, which has none) and trains every parameter
    that requires a gradient. An instance must hold the model's own parameters.
    """
    if isinstance(optimizer, str):
        kind = _canonical_kind(optimizer)
        rule = _rule(kind, {})
        return OptimizerPlan((rule,), {n: 0 for n, p in named_parameters if p.requires_grad})
    if isinstance(optimizer, type):
        return plan_optimizer(optimizer.__name__, named_parameters)
    groups = getattr(optimizer, "param_groups", None)
    if groups is None:
        raise UnsupportedOptimizer(
            f"the optimizer must be a torch.optim optimizer or a name such as 'adamw', not "
            f"{type(optimizer).__name__}."
        )
    kind = _canonical_kind(type(optimizer).__name__)
    names_by_id = {id(p): n for n, p in named_parameters}
    rules: list[GroupRule] = []
    labels: dict[str, int] = {}
    foreign = 0
    for group in groups:
        rule = _rule(kind, group)
        if rule not in rules:
            rules.append(rule)
        index = rules.index(rule)
        for param in group["params"]:
            name = names_by_id.get(id(param))
            if name is None:
                foreign += 1
            elif param.requires_grad:
                labels[name] = index
    if foreign:
        raise UnsupportedOptimizer(
            f"the {kind} optimizer holds {foreign} tensor(s) that are not parameters of the "
            "model being forecast; build the optimizer from this model's parameters."
        )
    if not labels:
        raise UnsupportedOptimizer(
            f"the {kind} optimizer holds none of the model's trainable parameters, so there is "
            "no training step to forecast."
        )
    return OptimizerPlan(tuple(rules), labels)


def _transform(rule: GroupRule) -> Any:
    """The optax transformation for one group, matching torch's update rule."""
    import optax

    o = rule.options
    lr = float(o["lr"])
    wd = float(o.get("weight_decay", 0.0))
    parts: list[Any] = []
    if o.get("maximize"):
        parts.append(optax.scale(-1.0))  # torch's maximize ascends: flip the gradient first
    if rule.kind == "SGD":
        if wd:
            parts.append(optax.add_decayed_weights(wd))  # torch SGD: L2 added to the gradient
        momentum = float(o["momentum"]) or None
        parts.append(optax.sgd(lr, momentum=momentum, nesterov=bool(o["nesterov"])))
    elif rule.kind in ("Adam", "AdamW"):
        b1, b2 = (float(b) for b in o["betas"])
        eps = float(o["eps"])
        decoupled = rule.kind == "AdamW" or bool(o.get("decoupled_weight_decay"))
        if wd and not decoupled:
            parts.append(optax.add_decayed_weights(wd))  # torch Adam: coupled L2
        if o.get("amsgrad"):
            parts.append(optax.scale_by_amsgrad(b1=b1, b2=b2, eps=eps))
        else:
            parts.append(optax.scale_by_adam(b1=b1, b2=b2, eps=eps))
        if wd and decoupled:
            parts.append(optax.add_decayed_weights(wd))  # AdamW: p -= lr * wd * p
        parts.append(optax.scale_by_learning_rate(lr))
    elif rule.kind == "RMSprop":
        if wd:
            parts.append(optax.add_decayed_weights(wd))
        parts.append(
            optax.rmsprop(
                lr,
                decay=float(o["alpha"]),
                eps=float(o["eps"]),
                eps_in_sqrt=False,  # torch adds eps after the square root
                centered=bool(o["centered"]),
                momentum=float(o["momentum"]) or None,
            )
        )
    else:  # _canonical_kind admits only SUPPORTED kinds
        raise UnsupportedOptimizer(f"no optax mapping for {rule.kind}.")
    return parts[0] if len(parts) == 1 else optax.chain(*parts)


def to_optax(plan: OptimizerPlan) -> Any:
    """The optax GradientTransformation for the plan's trainable parameters (a name -> array dict)."""
    import optax

    if len(plan.rules) == 1:
        return _transform(plan.rules[0])
    transforms = {str(i): _transform(rule) for i, rule in enumerate(plan.rules)}
    labels = {name: str(index) for name, index in plan.labels.items()}
    return optax.multi_transform(transforms, labels)
