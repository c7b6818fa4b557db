"""What kind of step was counted: its precision and a guess at its model class, from its ops.

The expected step time depends on both (docs/profiler.md): published CNN and U-Net runs reach
a fraction of what tuned LLM runs reach on the same chip, and an fp32 step runs against
another peak than a bf16 one (TF32 on NVIDIA Ampere and later, fp32 on TPUs). A profiled step
does not say what it is, so both are read from what `FlopCounterMode` and the traffic count
saw: the dtype its matrix FLOPs ran in, and how its FLOPs split between convolutions (3-D or
transposed ones marking a U-Net), attention (causal or not) and plain matmuls. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The model classes a step can be guessed as (the published-runs table's `model_class`).
MODEL_CLASSES = ("llm_decoder", "encoder", "cnn", "unet", "small_step")
# Under this many FLOPs a step is a "small_step": at 30% of a 200 TFLOP/s chip it lasts under
# 0.2 ms, where per-step launch, dispatch and feeding costs (pricing/step_floor.py) rule.
SMALL_STEP_FLOPS = 1e10
# A step whose convolutions do at least this share of its matrix FLOPs is a convolutional net.
CONV_SHARE = 0.5
# A step that upsamples is a U-Net from this share on: a latent diffusion U-Net runs a
# transformer after most of its ResNet blocks, and its convolutions do about half of its
# matrix FLOPs (SD 2's at 64x64 latents: 49.9%), an encoder's next to none.
UNET_CONV_SHARE = 0.25
_PRECISIONS = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32"}
# Matrix ops are binned by arithmetic intensity (FLOPs per byte moved) this finely: a quarter
# of an octave, so a chip's balance splits them into compute- and memory-bound within 19%.
_BINS_PER_OCTAVE = 4


class IntensityProfile:
    """Matrix ops' FLOPs and unfused bytes, summed by arithmetic intensity. Whether an op is
    compute- or memory-bound depends on the chip it runs on (its FLOPs per byte of bandwidth),
    so the profile keeps the split open: `OpMix.split(balance)` makes it for one chip."""

    def __init__(self) -> None:
        self.bins: dict[int, list[float]] = {}

    def add(self, flops: float, nbytes: float) -> None:
        if flops <= 0 or nbytes <= 0:
            return
        key = math.floor(math.log2(flops / nbytes) * _BINS_PER_OCTAVE)
        slot = self.bins.setdefault(key, [0.0, 0.0])
        slot[0] += flops
        slot[1] += nbytes

    def frozen(self) -> tuple[tuple[float, float, float], ...]:
        """(intensity at the bin's centre, FLOPs, bytes) per bin, lowest intensity first."""
        return tuple(
            (2 ** ((key + 0.5) / _BINS_PER_OCTAVE), f, b)
            for key, (f, b) in sorted(self.bins.items())
        )


@dataclass(frozen=True)
class OpMix:
    """How a step's counted FLOPs split by kind of op, and what else its ops show.

    `matmul_flops` are plain matrix products (mm, addmm, bmm outside attention);
    `attention_flops` SDPA's kernels and bmm inside modules named for attention;
    `conv_flops` all convolutions, `conv3d_flops` and `transposed_conv_flops` parts of them,
    and `channels_first_flops` the part laid out channels-first, PyTorch's default, which a
    GPU's tensor cores transpose (none once a convolution of the step runs channels-last:
    docs/forecast.md);
    `other_bytes` the unfused bytes in and out of every op that is not a matrix op, and
    `depthwise_bytes` those of depthwise convolutions (forward and backward) and
    `matrix_intensity` the other matrix ops' FLOPs and bytes by arithmetic intensity
    (`IntensityProfile`): together the step's memory traffic op by op, as eager PyTorch
    moves it;
    `other_elements` the elements of the largest tensor of every other op that is not a view
    (one FLOP each: elementwise work, reductions, norms, the optimizer), `kernel_ops` how many such ops and matrix
    ops ran (each is a kernel launch in eager PyTorch); `flops_by_dtype` the matrix FLOPs by
    the dtype of their first operand.
    """

    matmul_flops: float = 0.0
    attention_flops: float = 0.0
    conv_flops: float = 0.0
    conv3d_flops: float = 0.0
    transposed_conv_flops: float = 0.0
    channels_first_flops: float = 0.0
    other_elements: float = 0.0
    kernel_ops: int = 0
    causal_attention: bool = False
    upsampling: bool = False
    flops_by_dtype: Mapping[str, float] = field(default_factory=dict)
    other_bytes: float = 0.0
    depthwise_bytes: float = 0.0
    matrix_intensity: tuple[tuple[float, float, float], ...] = ()

    def split(self, balance: float) -> tuple[float, float]:
        """The matrix FLOPs of ops at or above `balance` FLOPs per byte (compute-bound on a
        chip of that balance) and the bytes of the matrix ops below it (memory-bound there)."""
        flops = sum(f for i, f, _ in self.matrix_intensity if i >= balance)
        nbytes = sum(b for i, _, b in self.matrix_intensity if i < balance)
        return flops, nbytes

    @property
    def matrix_flops(self) -> float:
        return self.matmul_flops + self.attention_flops + self.conv_flops

    @property
    def matmul_share(self) -> float | None:
        """Matrix FLOPs (products and convolutions) over all the step's FLOPs, other ops
        counted as one FLOP per element; None when nothing was counted."""
        total = self.matrix_flops + self.other_elements
        return self.matrix_flops / total if total > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "matmul_flops": self.matmul_flops,
            "attention_flops": self.attention_flops,
            "conv_flops": self.conv_flops,
            "conv3d_flops": self.conv3d_flops,
            "transposed_conv_flops": self.transposed_conv_flops,
            "channels_first_flops": self.channels_first_flops,
            "other_elements": self.other_elements,
            "kernel_ops": self.kernel_ops,
            "causal_attention": self.causal_attention,
            "upsampling": self.upsampling,
            "flops_by_dtype": dict(self.flops_by_dtype),
            "matmul_share": self.matmul_share,
            "other_bytes": self.other_bytes,
            "depthwise_bytes": self.depthwise_bytes,
            "matrix_intensity": [list(b) for b in self.matrix_intensity],
        }


def step_precision(mix: OpMix) -> str | None:
    """The precision, "bf16", "fp16" or "fp32": the dtype most of the step's matrix FLOPs ran in (autocast
    shows as the dtype its products received); None when no matrix FLOPs were counted."""
    counted = {k: v for k, v in mix.flops_by_dtype.items() if v > 0}
    if not counted:
        return None
    dtype = max(counted, key=lambda k: counted[k])
    return _PRECISIONS.get(dtype, dtype.removeprefix("torch."))


def guess_model_class(mix: OpMix, total_flops: float) -> tuple[str, str]:
    """The model class a step looks like, and why, from its op mix (first rule that holds):
    small (under `SMALL_STEP_FLOPS`), U-Net (mostly convolutions, 3-D ones; or a share of
    them with transposed ones or upsampling), CNN (mostly convolutions), LLM decoder (causal
    attention), encoder (attention that is not causal); a step of plain matmuls is taken as
    an LLM decoder's matmuls, the nearest the published runs have."""
    if total_flops < SMALL_STEP_FLOPS:
        return "small_step", f"under {SMALL_STEP_FLOPS:.0e} FLOPs a step"
    matrix = mix.matrix_flops or total_flops
    share = f"{mix.conv_flops / matrix:.0%} of the matrix FLOPs in convolutions"
    convolutional = mix.conv_flops >= CONV_SHARE * matrix
    if convolutional and mix.conv3d_flops >= CONV_SHARE * mix.conv_flops:
        return "unet", f"{share}, mostly 3-D"
    upsamples = mix.transposed_conv_flops > 0 or mix.upsampling
    if upsamples and mix.conv_flops >= UNET_CONV_SHARE * matrix:
        return "unet", f"{share}, with upsampling"
    if convolutional:
        return "cnn", share
    if mix.attention_flops > 0:
        share = f"{mix.attention_flops / matrix:.0%} of the matrix FLOPs in attention"
        if mix.causal_attention:
            return "llm_decoder", f"{share}, causal"
        return "encoder", f"{share}, not causal"
    return "llm_decoder", "plain matmuls, no attention or convolution counted"
