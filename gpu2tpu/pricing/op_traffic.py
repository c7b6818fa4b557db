"""A step's FLOPs and unfused bytes op by op, as the profiler counts them: what the op-by-op
cost of CNNs, encoders and U-Nets (`class_fit`) reads. Pure data, no imports of the fits."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

# Depthwise convolutions count as present where they move this share of a step's bytes;
# 3-D and channels-first convolutions where they do this share of its matrix FLOPs.
DEPTHWISE_SHARE = 0.05
VOLUMETRIC_SHARE = CHANNELS_FIRST_SHARE = 0.05


@dataclass(frozen=True)
class OpTraffic:
    """A step's FLOPs and unfused bytes op by op: the matrix ops by arithmetic intensity
    (`(FLOPs per byte, FLOPs, bytes)` per bin), the bytes of every other op, those of
    depthwise convolutions, the FLOPs of 3-D convolutions and of convolutions laid out
    channels-first (among the matrix ops), and those of all convolutions (None: not
    counted). Per chip per step (or per sample, in the table)."""

    matrix: tuple[tuple[float, float, float], ...]
    other_bytes: float
    depthwise_bytes: float = 0.0
    volumetric_flops: float = 0.0
    channels_first_flops: float = 0.0
    conv_flops: float | None = None

    def scaled(self, factor: float) -> OpTraffic:
        return OpTraffic(
            tuple((i, f * factor, b * factor) for i, f, b in self.matrix),
            self.other_bytes * factor,
            self.depthwise_bytes * factor,
            self.volumetric_flops * factor,
            self.channels_first_flops * factor,
            None if self.conv_flops is None else self.conv_flops * factor,
        )

    @property
    def total_bytes(self) -> float:
        return sum(b for _, _, b in self.matrix) + self.other_bytes + self.depthwise_bytes

    # The fit asks these of every published run at every step of its solver: computed once
    # (a frozen dataclass keeps cached properties in its instance dict).
    @cached_property
    def has_depthwise(self) -> bool:
        total = self.total_bytes
        return total > 0 and self.depthwise_bytes / total >= DEPTHWISE_SHARE

    @cached_property
    def has_volumetric(self) -> bool:
        """Whether 3-D convolutions do a share of the matrix work (a TPU runs them far below
        what its 2-D convolutions reach: `class_fit`'s `conv3d:tpu`)."""
        return self._share(self.volumetric_flops) >= VOLUMETRIC_SHARE

    @cached_property
    def has_channels_first(self) -> bool:
        """Whether convolutions in PyTorch's default layout do a share of the matrix work (a
        GPU's tensor cores run them below channels-last ones: `class_fit`'s
        `layout:channels_first`)."""
        return self._share(self.channels_first_flops) >= CHANNELS_FIRST_SHARE

    @cached_property
    def matmul_share(self) -> float:
        """The share of the matrix FLOPs not in convolutions (matmuls and attention: a
        classifier's head, a diffusion U-Net's transformer blocks); 0 where the convolutions'
        FLOPs were not counted."""
        if self.conv_flops is None:
            return 0.0
        return max(0.0, 1.0 - self._share(self.conv_flops))

    def _share(self, flops: float) -> float:
        total = sum(f for _, f, _ in self.matrix)
        return flops / total if total > 0 else 0.0
