"""One compile per TPU generation: a slice's figures from a smaller slice's compile.

With the batch split over the chips (data parallelism or FSDP, a fixed batch per chip), what
one chip computes in a step does not depend on how many chips the slice has: the same
matrix products on the same activations, whether the weights are replicated or gathered
from their shards. What does depend on the slice is what XLA's partitioner makes of the
sharding: how big each chip's shard of the weights and optimizer state is, which tensors
it gathers or reduces over the interconnect (it may gather activations on a small slice
and weights on a large one), and what the temporaries hold.

So a target of more than `BASIS_CHIPS` chips is compiled whole once, on the generation's
slice of `BASIS_CHIPS` chips with the same batch per chip (the *basis*, shared by every
larger slice of that generation and cached), and its own program is compiled only as far
as the end of libtpu's HLO passes (`aot.compile_lowered(..., partitioned=True)`, a tenth
of a compile: code generation is the rest). That partitioned program says exactly what
the whole compile would about memory (its buffer assignment) and collectives (its
instructions). FLOPs and bytes come from the basis's cost analysis (`anchored`): FLOPs
plus the difference in matrix products (which a loop split differently over a larger slice
still sums to the same); bytes scaled by the ratio of the two programs' bytes as XLA's
generic cost analysis counts them (libtpu's own count weighs TPU layouts, which the generic
one does not: the ratio carries over where a difference would not), plus the loop bodies'
further runs, as for a whole compile.

The same correction gives a checkpointed step's FLOPs and bytes from the step without
checkpoints on the same slice: the recomputed forward is matrix products the partitioned
program holds.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .aot import CompileOutcome, Topology

# Targets above this many chips are compiled on a slice of this many (the basis).
BASIS_CHIPS = 8
# Shardings whose per-chip work does not depend on the slice (the batch split over chips).
DERIVED_SHARDINGS = ("data", "fsdp")


def basis_topology(topology: Topology, sharding: str) -> Topology | None:
    """The slice whose whole compile gives `topology`'s FLOPs and bytes, or None when the
    target is compiled whole itself (a slice of at most `BASIS_CHIPS` chips)."""
    from .aot import topology_for

    if sharding not in DERIVED_SHARDINGS or topology.chips <= BASIS_CHIPS:
        return None
    basis = topology_for(topology.target, BASIS_CHIPS)
    return basis if basis != topology else None


def basis_batch(batch: int, topology: Topology, basis: Topology) -> int | None:
    """The basis's batch with the target's batch per chip, or None when it does not split."""
    scaled = batch * basis.chips
    if scaled % topology.chips:
        return None
    return scaled // topology.chips


def anchored(program: CompileOutcome, anchor: CompileOutcome) -> CompileOutcome:
    """`program` (partitioned: memory and collectives, no cost analysis) with FLOPs and bytes
    from `anchor`, a whole compile of a program with the same work per device.

    FLOPs = the anchor's + (the program's matrix-product FLOPs - the anchor's), the
    compiler's own count (loop bodies once) likewise. Bytes with loop bodies once = the
    anchor's x (the program's generic count / the anchor's), plus the program's loop bodies'
    further runs (`loop_bytes`); where XLA could not read a program, the anchor's plus the
    difference of this package's own counts. Transcendentals (elementwise, per device) are
    the anchor's. A program that did not compile (out of memory) is returned as it is.
    """
    if program.status != "compiled" or not program.partitioned:
        return program
    if anchor.status != "compiled":
        raise ValueError(f"the anchor compile has no figures (status {anchor.status!r})")

    def shifted(base: float | None, mine: float | None, theirs: float | None) -> float | None:
        if base is None:
            return None
        return base + (mine or 0.0) - (theirs or 0.0)

    matmul_once = _once(program.matmul_flops, program.loop_flops)
    anchor_once = _once(anchor.matmul_flops, anchor.loop_flops)
    bytes_accessed = shifted(anchor.bytes_accessed, program.program_bytes, anchor.program_bytes)
    compiler_bytes = shifted(
        anchor.compiler_bytes, program.program_bytes_once, anchor.program_bytes_once
    )
    if anchor.compiler_bytes is not None and program.generic_bytes and anchor.generic_bytes:
        compiler_bytes = anchor.compiler_bytes * program.generic_bytes / anchor.generic_bytes
        bytes_accessed = compiler_bytes + (program.loop_bytes or 0.0)
    return replace(
        program,
        flops=shifted(anchor.flops, program.matmul_flops, anchor.matmul_flops),
        bytes_accessed=bytes_accessed,
        transcendentals=anchor.transcendentals,
        optimal_seconds=None,
        compiler_flops=shifted(anchor.compiler_flops, matmul_once, anchor_once),
        compiler_bytes=compiler_bytes,
        estimated_kernel_flops=anchor.estimated_kernel_flops,
        compile_seconds=program.compile_seconds + anchor.compile_seconds,
        cached=program.cached and anchor.cached,
    )


def _once(matmul: float | None, loops: float | None) -> float | None:
    return None if matmul is None else matmul - (loops or 0.0)
