"""FLOP formulas PyTorch's `FlopCounterMode` gets wrong or lacks, as corrections to it.

- **Grouped and depthwise convolutions' weight gradient.** torch's `conv_backward_flop`
  counts the weight gradient as a convolution of the transposed input with the transposed
  output gradient, shapes from which the group division is lost: it counts `groups` times
  the real work (docs/profiler.md, "FLOPs you can trust"). A depthwise layer of 96 channels
  is counted 32.7x over for its whole step (forward, input gradient, weight gradient: 1 + 1
  + 96 where 1 + 1 + 1 is right); EfficientNet-B0's step 13.9x. The weight gradient does as
  many multiply-adds as the forward convolution, so it is counted as that here. Whether the
  installed torch needs this is probed once (`torch_overcounts_grouped_conv_backward`): the
  correction is applied only where it does, so a torch that fixes its formula is trusted.
- **SDPA's CPU kernels.** `F.scaled_dot_product_attention` runs
  `_scaled_dot_product_flash_attention_for_cpu` (and its backward) on the CPU, which torch's
  table (torch 2.12) does not list, so a dry run on the CPU counted no attention at all.
  They are counted as torch counts the GPU kernels: two products forward (QK^T, PV), five
  backward (the scores recomputed, then dV, dP, dQ, dK).

Shapes only: the formulas are pure arithmetic on sizes; torch is imported by the functions
that build the mapping and run the probe.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

Shape = Sequence[int]


def conv_flops(x_shape: Shape, w_shape: Shape, out_shape: Shape, transposed: bool) -> int:
    """Multiply-adds x 2 of one convolution, groups included (the weight holds C/groups).

    A plain convolution does, for every output position, `prod(kernel) x C_in/groups` products
    per output channel; a transposed one the same for every *input* position, its weight being
    `(C_in, C_out/groups, *kernel)`.
    """
    batch = x_shape[0]
    positions = math.prod((x_shape if transposed else out_shape)[2:])
    c_a, c_b, *kernel = w_shape
    return 2 * batch * positions * math.prod(kernel) * c_a * c_b


def conv_backward_flops(
    grad_out_shape: Shape,
    x_shape: Shape,
    w_shape: Shape,
    _bias: Any,
    _stride: Any,
    _padding: Any,
    _dilation: Any,
    transposed: bool,
    _output_padding: Any,
    _groups: int,
    output_mask: Sequence[bool],
    out_shape: Sequence[Any] | None = None,
    **_: Any,
) -> int:
    """`aten.convolution_backward`: the input gradient (a convolution of the output gradient
    with the weight, transposed the other way) and the weight gradient (as many products as
    the forward convolution, whose output is `grad_out`)."""
    flops = 0
    if output_mask[0]:
        assert out_shape is not None and out_shape[0] is not None
        flops += conv_flops(grad_out_shape, w_shape, out_shape[0], not transposed)
    if output_mask[1]:
        flops += conv_flops(x_shape, w_shape, grad_out_shape, transposed)
    return flops


def sdpa_forward_flops(query: Shape, key: Shape, value: Shape) -> int:
    """QK^T and PV over the whole score matrix (batch, heads, queries, keys)."""
    b, h, s_q, d_q = query
    s_k, d_v = key[-2], value[-1]
    return 2 * b * h * s_q * s_k * (d_q + d_v)


def sdpa_backward_flops(query: Shape, key: Shape, value: Shape) -> int:
    """The scores recomputed (QK^T), then dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q."""
    b, h, s_q, d_q = query
    s_k, d_v = key[-2], value[-1]
    return 2 * b * h * s_q * s_k * (d_q + d_v + d_v + d_q + d_q)


def _cpu_sdpa_forward(query: Shape, key: Shape, value: Shape, *_: Any, **__: Any) -> int:
    return sdpa_forward_flops(query, key, value)


def _cpu_sdpa_backward(
    _grad_out: Shape, query: Shape, key: Shape, value: Shape, *_: Any, **__: Any
) -> int:
    return sdpa_backward_flops(query, key, value)


# Ops whose FLOPs are attention products, by name (SDPA's kernels, forward and backward).
ATTENTION_OP_MARKERS = ("scaled_dot_product", "flash_attention", "efficient_attention")


def is_attention_op(name: str) -> bool:
    """Whether an op is one of SDPA's attention kernels (forward or backward)."""
    return any(marker in name for marker in ATTENTION_OP_MARKERS)


@functools.cache
def torch_overcounts_grouped_conv_backward() -> bool:
    """Whether the installed torch's FlopCounterMode counts a grouped convolution's weight
    gradient `groups` times over (torch 2.1-2.12 do): a depthwise 1x1 convolution of 4
    channels on the meta device, weight gradient only, against its analytic count."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    meta = {"device": "meta"}
    grad_out = torch.empty(1, 4, 2, 2, **meta)
    x = torch.empty(1, 4, 2, 2, **meta)
    weight = torch.empty(4, 1, 1, 1, **meta)
    with FlopCounterMode(display=False) as mode:
        torch.ops.aten.convolution_backward(
            grad_out, x, weight, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 4,
            [False, True, False],
        )  # fmt: skip
    return int(mode.get_total_flops()) != conv_flops(x.shape, weight.shape, grad_out.shape, False)


def corrections() -> dict[Any, Any]:
    """`FlopCounterMode(custom_mapping=...)` for this torch: the formulas above where the
    installed torch needs them (op packets that do not exist in this torch are left out)."""
    import torch

    aten = torch.ops.aten
    mapping: dict[Any, Any] = {}
    if torch_overcounts_grouped_conv_backward():
        mapping[aten.convolution_backward] = conv_backward_flops
    from torch.utils.flop_counter import flop_registry

    for name, formula in (
        ("_scaled_dot_product_flash_attention_for_cpu", _cpu_sdpa_forward),
        ("_scaled_dot_product_flash_attention_for_cpu_backward", _cpu_sdpa_backward),
    ):
        packet = getattr(aten, name, None)
        if packet is not None and packet not in flop_registry:
            mapping[packet] = formula
    return mapping
