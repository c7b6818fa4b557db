"""A step's FLOPs and unfused bytes op by op, as the profiler counts them: what the op-by-op
cost of CNNs, encoders and U-Nets (`class_fit`) reads. Pure data, no imports of the fits."""

from __future__ import annotations

from dataclasses import dataclass

# Depthwise convolutions count as present where they move this share of a step's bytes.
DEPTHWISE_SHARE = 0.05


@dataclass(frozen=True)
class OpTraffic:
    """A step's FLOPs and unfused bytes op by op: the matrix ops by arithmetic intensity
    (`(FLOPs per byte, FLOPs, bytes)` per bin), the bytes of every other op, and those of
    depthwise convolutions. Per chip per step (or per sample, in the table)."""

    matrix: tuple[tuple[float, float, float], ...]
    other_bytes: float
    depthwise_bytes: float = 0.0

    def scaled(self, factor: float) -> OpTraffic:
        return OpTraffic(
            tuple((i, f * factor, b * factor) for i, f, b in self.matrix),
            self.other_bytes * factor,
            self.depthwise_bytes * factor,
        )

    @property
    def total_bytes(self) -> float:
        return sum(b for _, _, b in self.matrix) + self.other_bytes + self.depthwise_bytes

    @property
    def has_depthwise(self) -> bool:
        total = self.total_bytes
        return total > 0 and self.depthwise_bytes / total >= DEPTHWISE_SHARE
