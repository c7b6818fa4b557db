"""What a training step holds per chip, read from its shapes (`fit_verdict.StepMemory`).

The weights, their gradients, the optimizer's state and the batch are sizes the step's
shapes fix: the compiler holds them whatever it schedules. The attention-dropout masks are
found by running the step's forward on the meta device (nothing is allocated) and noting
every dropout applied to a (batch, heads, sequence, sequence) tensor, the probabilities of an attention
written out by hand, or `scaled_dot_product_attention` with `dropout_p`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .fit_verdict import StepMemory

if TYPE_CHECKING:
    import torch

    from .optimizers import GroupRule, OptimizerPlan

_PRECISION = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}


def step_memory(
    model: torch.nn.Module,
    plan: OptimizerPlan,
    batch_tensors: list[torch.Tensor],
    dtype: torch.dtype | None,
    *,
    chips: int,
    devices_per_chip: int,
    sharding: str,
    sequence: int | None,
    model_class: str | None,
    dropout_elements: float,
) -> StepMemory:
    """Per-chip sizes of a step on `chips` chips (`dropout_elements`: `attention_dropout_elements`
    for the whole batch)."""

    def size(t: torch.Tensor) -> int:
        itemsize = dtype.itemsize if dtype is not None and t.is_floating_point() else t.itemsize
        return t.numel() * itemsize

    named = list(model.named_parameters())
    weights = sum(size(p) for _, p in named) + sum(size(b) for b in model.buffers())
    trainable = [(n, p) for n, p in named if n in plan.labels]
    gradients = sum(size(p) for _, p in trainable)
    state = sum(state_tensors(plan.rules[plan.labels[n]]) * size(p) for n, p in trainable)
    # Data parallel: every device holds the whole state; FSDP: a share of it.
    copies = devices_per_chip if sharding == "data" else 1 / chips
    floating = [p.dtype for _, p in named if p.is_floating_point()]
    activations = dtype or (floating[0] if floating else None)
    rules = {rule.kind for rule in plan.rules}
    return StepMemory(
        weights=weights * copies,
        gradients=gradients * copies,
        optimizer_state=state * copies,
        batch=sum(size(t) for t in batch_tensors) / chips,
        activations=_PRECISION.get(str(activations).replace("torch.", ""), str(activations)),
        optimizer=" | ".join(sorted(rules)),
        state_per_weight=max((state_tensors(rule) for rule in plan.rules), default=0),
        parameters=sum(p.numel() for _, p in named),
        sequence=sequence,
        model_class=model_class,
        attention_dropout_elements=dropout_elements / chips,
    )


def state_tensors(rule: GroupRule) -> int:
    """How many tensors the size of a weight `rule` keeps (optax's state for it)."""
    options = rule.options
    if rule.kind == "SGD":
        return 1 if options.get("momentum") else 0
    if rule.kind in ("Adam", "AdamW"):
        return 3 if options.get("amsgrad") else 2
    if rule.kind == "RMSprop":
        return 1 + bool(options.get("centered")) + bool(options.get("momentum"))
    return 0


def attention_dropout_elements(
    model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], dtype: Any = None
) -> float:
    """Elements of the (sequence x sequence) tensors dropout is applied to in one forward,
    found on the meta device; 0.0 when the forward cannot run there."""
    import torch
    from torch.func import functional_call
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_map

    aten = torch.ops.aten
    dropouts = {aten.native_dropout.default, aten.bernoulli.p, aten.bernoulli_.float,
                aten.dropout.default}  # fmt: skip
    attention = {
        aten._scaled_dot_product_efficient_attention.default: 4,
        aten._scaled_dot_product_flash_attention.default: 3,
        aten._scaled_dot_product_flash_attention_for_cpu.default: 3,
        aten.scaled_dot_product_attention.default: 4,
    }
    found = [0.0]

    def square(t: Any) -> bool:
        # (batch, heads, sequence, sequence): a 3-D (batch, sequence, width) hidden state
        # whose width equals the sequence is not a score matrix.
        return isinstance(t, torch.Tensor) and t.dim() >= 4 and t.shape[-1] == t.shape[-2] > 1

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, a: Any = (), kw: Any = None) -> Any:
            kw = kw or {}
            if func in dropouts and a and square(a[0]):
                found[0] += a[0].numel()
            elif func in attention:
                q, k = a[0], a[1]
                p = kw.get("dropout_p", a[attention[func]] if len(a) > attention[func] else 0.0)
                if isinstance(p, float) and p > 0:
                    found[0] += q.numel() // q.shape[-1] * k.shape[-2]
            return func(*a, **kw)

    def meta(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        cast = dtype if dtype is not None and value.is_floating_point() else value.dtype
        return torch.empty(value.shape, dtype=cast, device="meta")

    state = {n: meta(p) for n, p in model.named_parameters()}
    state.update({n: meta(b) for n, b in model.named_buffers()})
    meta_args, meta_kwargs = tree_map(meta, (tuple(args), dict(kwargs)))
    modes = {m: m.training for m in model.modules()}  # the step trains, as aot.py traces it
    try:
        model.train()
        with torch.device("meta"), torch.no_grad(), Watch():
            functional_call(model, state, meta_args, meta_kwargs)
    except Exception:  # an op without a meta kernel: no masks found, the verdict goes on
        return 0.0
    finally:
        for module, training in modes.items():
            module.training = training
    return found[0]
