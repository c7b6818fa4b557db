"""How the traced step runs the calls TPU training runs differently from a plain trace.

Two calls in a user's model decide a large model's memory, and torchax alone traces both as
if they were not there:

- `torch.utils.checkpoint.checkpoint` (either `use_reentrant`), `checkpoint_sequential`
  and FSDP's `checkpoint_wrapper` (torch.distributed.algorithms) recompute a block's
  activations in the backward pass instead of keeping them. Under torchax the gradient is
  JAX's, not autograd's, so torch's checkpoint only runs its function and nothing is
  recomputed. Here every call goes to `jax.checkpoint` (JAX's rematerialisation) around
  the same function, so the compiled step keeps only the block's inputs and recomputes the
  rest: memory falls and FLOPs rise as they do on a TPU.
- `F.scaled_dot_product_attention` is traced by torchax as the reference formula, which
  holds the (sequence x sequence) scores. TPU training runs it as a flash-attention kernel
  that never holds them: `attention="flash"` compiles it as the Pallas flash-attention
  kernel that PyTorch/XLA's `flash_attention` and JAX ship
  (`jax.experimental.pallas.ops.tpu.flash_attention`), split over the batch with
  `shard_map`; a call the kernel cannot take (an explicit mask, dropout, sequences not a
  multiple of 128) keeps the reference formula. `attention="full"` keeps the reference
  everywhere. The kernel's FLOPs are invisible to XLA's cost analysis (only its forward
  carries an estimate, of the full-attention formula), so each call records the FLOPs it
  executes (`flash_attention_flops`) and the forecast adds them.

Both are installed only while a step is traced (`lowered_calls`) and undone afterwards.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

ATTENTION_MODES = ("flash", "full")
# The Pallas kernel's block sizes (BlockSizes.get_default in jax 0.10: 128 everywhere).
FLASH_BLOCK = 128


@dataclass
class TraceRecord:
    """What the lowered calls did during one trace, per device.

    `kernel_flops` are the FLOPs the flash-attention kernels execute (forward and backward)
    on one device; `flash_calls` and `full_calls` count attention calls by how they ran, and
    `full_reasons` says why a call kept the reference formula. `remat_calls` counts the
    checkpointed regions lowered to `jax.checkpoint`; `remat_supported` is False when this
    torch's `checkpoint` could not be reached (then checkpoints run as plain calls).
    """

    kernel_flops: float = 0.0
    flash_calls: int = 0
    full_calls: int = 0
    full_reasons: list[str] = field(default_factory=list)
    remat_calls: int = 0
    remat_supported: bool = True

    @property
    def attention_kind(self) -> str | None:
        """ "flash", "full", "mixed" or None (no attention call was traced)."""
        if self.flash_calls and self.full_calls:
            return "mixed"
        if self.flash_calls:
            return "flash"
        if self.full_calls:
            return "full"
        return None


def flash_attention_flops(
    batch: int, heads: int, q_len: int, kv_len: int, head_dim: int, causal: bool
) -> float:
    """FLOPs the Pallas flash-attention kernels execute for one call, forward and backward.

    Per (query block, key block) pair the forward computes QK^T and PV (2 products), the
    backward's dK/dV kernel recomputes QK^T and computes dV, dP and dK (4), its dQ kernel
    recomputes QK^T and computes dP and dQ (3): 9 products of 2·bq·bk·d FLOPs each. A causal
    call skips the pairs wholly above the diagonal.
    """
    blocks_q, blocks_k = math.ceil(q_len / FLASH_BLOCK), math.ceil(kv_len / FLASH_BLOCK)
    if causal:
        pairs = sum(
            min(blocks_k, (i * FLASH_BLOCK + FLASH_BLOCK - 1) // FLASH_BLOCK + 1)
            for i in range(blocks_q)
        )
    else:
        pairs = blocks_q * blocks_k
    per_pair = 9 * 2.0 * FLASH_BLOCK * FLASH_BLOCK * head_dim
    return batch * heads * pairs * per_pair


@contextlib.contextmanager
def lowered_calls(env: Any, mesh: Any, attention: str, record: TraceRecord) -> Iterator[None]:
    """Lower checkpoints to `jax.checkpoint` and SDPA as `attention` says, while tracing."""
    if attention not in ATTENTION_MODES:
        raise ValueError(
            f"attention must be one of {', '.join(ATTENTION_MODES)}, not {attention!r}."
        )
    with _checkpoints_as_remat(env, record), _attention_lowered(env, mesh, attention, record):
        yield


# -- activation checkpointing -------------------------------------------------------------


@contextlib.contextmanager
def _checkpoints_as_remat(env: Any, record: TraceRecord) -> Iterator[None]:
    """Route every call of torch.utils.checkpoint.checkpoint to `jax.checkpoint`.

    `checkpoint` is wrapped by `torch._disable_dynamo`, whose wrapper calls the function
    cached on the undecorated function as `__dynamo_disable` (torch 2.12's
    torch/_compile.py). Setting that attribute reaches every caller, however it imported
    `checkpoint`: `checkpoint_sequential`, FSDP's `checkpoint_wrapper` (a
    `functools.partial` of the function) and `from torch.utils.checkpoint import
    checkpoint` in user code. The module attribute itself is left alone: a module imported
    during the trace (torch imports some lazily) would keep a replaced function for good.
    A torch without that wrapper is left as it is, and the record says so.
    """
    import torch.utils.checkpoint as torch_checkpoint

    inner = getattr(torch_checkpoint.checkpoint, "__wrapped__", None)
    if inner is None:
        record.remat_supported = False
        yield
        return
    missing = object()
    saved = getattr(inner, "__dynamo_disable", missing)

    def remat(function: Callable, *args: Any, **kwargs: Any) -> Any:
        record.remat_calls += 1
        return _rematerialised(env, function, args, kwargs)

    inner.__dynamo_disable = remat
    try:
        yield
    finally:
        if saved is missing:
            del inner.__dynamo_disable
        else:
            inner.__dynamo_disable = saved


# Keyword arguments of torch.utils.checkpoint.checkpoint that only steer autograd's own
# recomputation; JAX's rematerialisation has no use for them.
_CHECKPOINT_OPTIONS = (
    "use_reentrant", "preserve_rng_state", "context_fn", "determinism_check", "debug",
    "early_stop",
)  # fmt: skip


def _rematerialised(env: Any, function: Callable, args: tuple, kwargs: dict) -> Any:
    """`function(*args, **kwargs)` under `jax.checkpoint`: its insides are recomputed in the
    backward pass, only its tensor inputs are kept."""
    import jax
    import torch
    from torch.utils import _pytree as pytree

    kwargs = {k: v for k, v in kwargs.items() if k not in _CHECKPOINT_OPTIONS}
    leaves, spec = pytree.tree_flatten((args, kwargs))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    shape: dict[str, Any] = {}

    def pure(*arrays: Any) -> list:
        filled = list(leaves)
        for position, array in zip(positions, arrays, strict=True):
            filled[position] = env.j2t_iso(array)
        call_args, call_kwargs = pytree.tree_unflatten(filled, spec)
        state = env.param
        key = state.prng
        result = function(*call_args, **call_kwargs)
        state.prng = key  # a key drawn inside must not leak out of the checkpoint's trace
        out, out_spec = pytree.tree_flatten(result)
        shape["spec"] = out_spec
        shape["tensors"] = [isinstance(o, torch.Tensor) for o in out]
        shape["plain"] = [None if isinstance(o, torch.Tensor) else o for o in out]
        return [env.t2j_iso(o) for o in out if isinstance(o, torch.Tensor)]

    arrays = jax.checkpoint(pure)(*[env.t2j_iso(leaves[i]) for i in positions])
    arrays = iter(arrays)
    out = [
        env.j2t_iso(next(arrays)) if is_tensor else plain
        for is_tensor, plain in zip(shape["tensors"], shape["plain"], strict=True)
    ]
    return pytree.tree_unflatten(out, shape["spec"])


# -- attention ----------------------------------------------------------------------------


@contextlib.contextmanager
def _attention_lowered(env: Any, mesh: Any, attention: str, record: TraceRecord) -> Iterator[None]:
    """Answer F.scaled_dot_product_attention with the flash kernel (or count the reference)."""
    import torch
    from torchax.ops import ops_registry

    functions = (
        torch.nn.functional.scaled_dot_product_attention,
        torch.ops.aten.scaled_dot_product_attention.default,
    )
    lookup = env._get_op_or_decomp

    def sdpa(*args: Any, **kwargs: Any) -> Any:
        return _attention(env, mesh, attention, record, *args, **kwargs)

    def patched(func: Any) -> Any:
        if func in functions:
            return ops_registry.Operator(
                func, sdpa, is_jax_function=False, is_user_defined=False, needs_env=False,
                is_view_op=False,
            )  # fmt: skip
        return lookup(func)

    env._get_op_or_decomp = patched
    try:
        yield
    finally:
        env._get_op_or_decomp = lookup


def _attention(
    env: Any,
    mesh: Any,
    attention: str,
    record: TraceRecord,
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Any:
    from torchax.ops.jtorch import _sdpa_reference

    reason = _flash_refusal(attention, query, key, value, attn_mask, dropout_p)
    if reason:
        record.full_calls += 1
        if reason not in record.full_reasons:
            record.full_reasons.append(reason)
        return _sdpa_reference(
            query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa
        )
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.flash_attention import flash_attention
    from jax.sharding import PartitionSpec

    q, k, v = (env.t2j_iso(t) for t in (query, key, value))
    lead = q.shape[:-3]
    heads = q.shape[-3]
    if k.shape[-3] != heads:  # grouped-query attention: each key/value head serves a group
        k = jnp.repeat(k, heads // k.shape[-3], axis=-3)
        v = jnp.repeat(v, heads // v.shape[-3], axis=-3)
    q, k, v = (a.reshape((-1, *a.shape[-3:])) for a in (q, k, v))
    batch, _, q_len, head_dim = q.shape
    sm_scale = float(scale) if scale is not None else 1.0 / math.sqrt(head_dim)

    def kernel(q: Any, k: Any, v: Any) -> Any:
        return flash_attention(q, k, v, causal=bool(is_causal), sm_scale=sm_scale)

    devices = mesh.devices.size if mesh is not None else 1
    split = devices > 1 and batch % devices == 0
    if split:
        spec = PartitionSpec("data")
        kernel = jax.shard_map(
            kernel, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec, check_vma=False
        )
    out = kernel(q, k, v)
    record.flash_calls += 1
    record.kernel_flops += flash_attention_flops(
        batch // devices if split else batch, heads, q_len, k.shape[-2], head_dim, bool(is_causal)
    )
    return env.j2t_iso(out.reshape((*lead, *out.shape[-3:])))


def _flash_refusal(
    attention: str, query: Any, key: Any, value: Any, attn_mask: Any, dropout_p: float
) -> str:
    """Why a call keeps the reference formula ("" when the flash kernel takes it)."""
    if attention == "full":
        return "attention='full'"
    if attn_mask is not None:
        return "an explicit attention mask"
    if dropout_p:
        return "attention dropout"
    if query.ndim < 3 or key.ndim != query.ndim or value.shape[-1] != query.shape[-1]:
        return "a query, key and value layout the kernel does not take"
    if query.shape[-2] % FLASH_BLOCK or key.shape[-2] % FLASH_BLOCK:
        return f"sequences that are not a multiple of {FLASH_BLOCK}"
    if query.shape[-3] % key.shape[-3]:
        return "query heads that are not a multiple of the key/value heads"
    return ""
