"""One compile per TPU generation: a large slice's figures from the basis slice's whole
compile and the large slice's partitioned program (gpu2tpu/forecasting/slices.py).

The arithmetic (`anchored`, the basis, the buffer assignment) is checked without JAX; the
slow tests compare derived targets with whole compiles of the same targets.
"""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from forecast_models import Llama, lm_loss

from gpu2tpu.forecasting.aot import CompileOutcome, topology_for
from gpu2tpu.forecasting.hlo import buffer_memory, standard_hlo
from gpu2tpu.forecasting.slices import BASIS_CHIPS, anchored, basis_batch, basis_topology


def test_slices_above_the_basis_are_compiled_on_the_basis():
    big = topology_for("v5p", 64)
    basis = basis_topology(big, "fsdp")
    assert basis is not None and basis.name == "v5p:2x2x2" and basis.chips == BASIS_CHIPS
    assert basis_topology(big, "data") == basis
    assert basis_topology(topology_for("v6e", 256), "fsdp").name == "v6e:2x4"
    assert basis_topology(topology_for("v5p", 8), "fsdp") is None  # the basis itself
    assert basis_topology(topology_for("v5e", 4), "fsdp") is None
    assert basis_topology(big, "tensor") is None  # only sharding that splits the batch
    # One sequence per chip on 64 chips is one per chip on the basis too.
    assert basis_batch(64, big, basis) == 8
    assert basis_batch(128, big, basis) == 16
    assert basis_batch(8, big, basis) == 1
    assert basis_batch(4, big, basis) is None  # half a sequence per chip: not derivable


def _outcome(**figures: float) -> CompileOutcome:
    return CompileOutcome("compiled", 8, **figures)  # type: ignore[arg-type]


def test_anchored_figures_take_flops_and_bytes_from_the_whole_compile():
    anchor = _outcome(
        flops=1000.0, bytes_accessed=500.0, transcendentals=7.0, compiler_flops=800.0,
        compiler_bytes=400.0, matmul_flops=900.0, loop_flops=200.0, program_bytes=450.0,
        program_bytes_once=380.0, argument_bytes=64, temp_bytes=100, ici_bytes=10.0,
    )  # fmt: skip
    program = CompileOutcome(
        "compiled", 64, matmul_flops=905.0, loop_flops=300.0, program_bytes=430.0,
        program_bytes_once=330.0, argument_bytes=8, output_bytes=8, alias_bytes=8,
        temp_bytes=120, ici_bytes=30.0, partitioned=True,
    )  # fmt: skip
    derived = anchored(program, anchor)
    assert derived.flops == 1005.0  # the anchor's + the difference in matrix products
    assert derived.bytes_accessed == 480.0
    assert derived.transcendentals == 7.0
    assert derived.compiler_flops == 800.0 + (905 - 300) - (900 - 200)
    assert derived.compiler_bytes == 350.0
    # memory and collectives stay the partitioned program's own
    assert (derived.argument_bytes, derived.temp_bytes, derived.ici_bytes) == (8, 120, 30.0)
    assert derived.memory_bytes == 8 + 8 - 8 + 120
    assert derived.batch == 64
    # Where XLA read both programs, bytes scale with its generic counts (loop bodies once),
    # plus the program's own loops' further runs.
    anchor.generic_bytes, program.generic_bytes, program.loop_bytes = 200.0, 150.0, 40.0
    scaled = anchored(program, anchor)
    assert scaled.compiler_bytes == 400.0 * 150 / 200
    assert scaled.bytes_accessed == 300.0 + 40.0
    failed = CompileOutcome("oom", 64, required_bytes=1e12, partitioned=True)
    assert anchored(failed, anchor) is failed
    with pytest.raises(ValueError, match="anchor"):
        anchored(program, CompileOutcome("oom", 8))


BUFFERS = """BufferAssignment:
allocation 0: size 4, color 8, page 0, thread-local:
 value: <1 x @0> (size=4,offset=0): u32[]{:S(8)}
allocation 1: size 4194304, page 0, parameter 0, shape |bf16[2048,1024]| at ShapeIndex {}, maybe-live-out:
 value: <2 p0 @0> (size=4194304,offset=0): bf16[2048,1024]{1,0}
allocation 2: size 8192, page 0, parameter 1, shape |s32[1,1024]| at ShapeIndex {}:
 value: <3 p1 @0> (size=8192,offset=0): s32[1,1024]{1,0}
allocation 3: size 512, page 0, maybe-live-out:
 value: <4 loss @0> (size=512,offset=0): f32[]
allocation 4: size 288, page 0, output shape is |(f32[], bf16[2048,1024])|, maybe-live-out:
 value: <5 tuple @0> (size=288,offset=0): (f32[], bf16[2048,1024])
allocation 5: size 67108864, page 0, thread-local:
 value: <6 scratch @0> (size=67108864,offset=0): f32[16777216]
allocation 6: size 512, page 0, constant:
 value: <7 c @0> (size=512,offset=0): f32[128]
allocation 7: size 50233856, color 1, page 0, preallocated-temp:
 value: <8 vmem @0> (size=50233856,offset=0): f32[1]
allocation 8: size 338608160, page 0, preallocated-temp:
 value: <9 temps @0> (size=338608160,offset=0): f32[1]
"""


def test_memory_is_read_from_the_buffer_assignment_as_memory_analysis_reports_it():
    """HBM only (color 0); the parameters, those donated to the results, the results, and
    the temporaries' block rounded up to 16 KiB (measured against memory_analysis() on
    three FSDP programs: 338,608,160 bytes in the dump are 338,624,512 reported)."""
    memory = buffer_memory(BUFFERS)
    assert memory is not None
    assert memory.argument == 4194304 + 8192
    assert memory.alias == 4194304
    assert memory.output == 4194304 + 512 + 288
    assert memory.temp == 338624512
    assert buffer_memory("BufferAssignment:\n") is None


SHAPE = {"layers": 2, "d": 1024, "heads": 8, "kv_heads": 8, "hidden": 3584, "vocab": 16384}
SEQ = 1024


def _forecast(generation: str, chips: int, **options: object):
    from gpu2tpu.forecasting.forecast import forecast

    with torch.device("meta"):
        model = Llama(**SHAPE).to(torch.bfloat16)
    ids = torch.empty(chips, SEQ, dtype=torch.long, device="meta")
    result = forecast(
        model, (ids, ids), loss_fn=lm_loss, targets=[generation], chips=chips,
        sharding="fsdp", extrapolate=False, progress=False, **options,
    )  # fmt: skip
    return result.targets[0]


def _whole(forecast_call, *args, **options):
    """The reference: every target compiled whole, in line (`isolate=False`), in a child of
    its own, so that this process never imports torchax (a forecast here would then run in
    line too, and compile every slice whole)."""
    from gpu2tpu.forecasting.isolate import run_in_child

    return run_in_child(forecast_call, *args, cache=False, isolate=False, **options)


FRESH = """
import sys
sys.path.insert(0, sys.argv[1])
import test_forecast_slices
getattr(test_forecast_slices, sys.argv[2])(*sys.argv[3:])
"""


def _in_a_fresh_interpreter(check: str, *args: str) -> None:
    """Run `check(*args)` of this module in an interpreter of its own. On an xdist worker an
    earlier test may have started JAX: a forecast there runs in line (every slice compiled
    whole, nothing derived), and a child forked from it can deadlock in JAX's thread pools
    (seen in CI: MLIR's verifier waiting on a pool the fork did not copy)."""
    done = subprocess.run(
        [sys.executable, "-c", FRESH, str(Path(__file__).parent), check, *args],
        capture_output=True, text=True, timeout=3300,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])


@pytest.mark.slow
@pytest.mark.torchax
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("generation", ["v5p", "v6e"])
def test_derived_slices_agree_with_whole_compiles(generation, tmp_path):
    _in_a_fresh_interpreter("derived_slices_agree_with_whole_compiles", generation, str(tmp_path))


def derived_slices_agree_with_whole_compiles(generation: str, cache: str) -> None:
    """A 2-layer Llama (d 1,024, vocab 16,384), one 1,024-token sequence per chip, FSDP on
    16 and 32 chips: derived from the 8-chip compile and the slice's partitioned program,
    against the whole compile of that slice. XLA's partitioner gathers activations for the
    LM head on 8 chips and the head's weights on 16 and more (16 x 1,024 tokens is the
    vocabulary), so the collectives are the slice's own, not the basis's scaled."""
    for chips in (16, 32):
        derived = _forecast(generation, chips, cache=Path(cache))
        whole = _whole(_forecast, generation, chips)
        assert derived.derived_from == topology_for(generation, BASIS_CHIPS).name
        assert whole.derived_from is None
        assert derived.status == whole.status == "compiled", derived.message
        assert derived.flops == pytest.approx(whole.flops, rel=0.02), chips
        assert derived.memory_per_chip == pytest.approx(whole.memory_per_chip, rel=0.02), chips
        assert derived.collective_bytes_per_chip == pytest.approx(
            whole.collective_bytes_per_chip, rel=0.05
        ), chips
        assert set(derived.collectives) == set(whole.collectives), chips
        assert derived.bytes_accessed == pytest.approx(whole.bytes_accessed, rel=0.2), chips
        assert "FLOPs and bytes from the whole compile on" in derived.summary()


class _Block(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


class _Stack(torch.nn.Module):
    """Sixteen MLP blocks whose activations overflow a v5e at batch 32 (not a v5p)."""

    def __init__(self, d: int = 1024, layers: int = 16) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Block(d) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


@pytest.mark.slow
@pytest.mark.torchax
@pytest.mark.timeout(3600)
def test_the_checkpointed_recheck_runs_for_what_does_not_fit_and_is_cached(tmp_path):
    _in_a_fresh_interpreter("the_checkpointed_recheck_agrees_and_is_cached", str(tmp_path))


def the_checkpointed_recheck_agrees_and_is_cached(cache: str) -> None:
    """v5e does not fit and gets its re-check (run by the parent beside v5p, from the
    checkpointed step's partitioned programs anchored on the compiles without checkpoints);
    v5p fits and gets none. The re-check agrees with whole compiles of the checkpointed
    step, and a second forecast finds every compile in the cache."""
    from gpu2tpu.forecasting.forecast import forecast

    tmp_path = Path(cache)

    with torch.device("meta"):
        model = _Stack()
    batch = (torch.empty(32, 2048, 1024, device="meta"), torch.empty(32, 2048, 1024, device="meta"))
    options = {"loss_fn": torch.nn.functional.mse_loss, "progress": False}
    result = forecast(model, batch, targets=["v5e", "v5p"], cache=tmp_path, **options)
    v5e, v5p = result.target("v5e"), result.target("v5p")
    assert v5p.status == "compiled" and v5p.checkpointed is None
    assert v5e.status == "does not fit" and v5e.extrapolated
    variant = v5e.checkpointed
    assert variant is not None and variant.status == "compiled", v5e.summary()
    assert variant.derived_from is not None  # anchored: partitioned, not compiled whole
    whole = _whole(forecast, model, batch, targets=["v5e"], **options)
    reference = whole.target("v5e").checkpointed
    assert reference is not None and reference.derived_from is None
    assert variant.flops == pytest.approx(reference.flops, rel=0.02)
    assert variant.memory_per_chip == pytest.approx(reference.memory_per_chip, rel=0.02)
    assert variant.fits is reference.fits is True
    # Again, without the per-target answers: every compile, the re-check's too, is cached.
    for entry in tmp_path.glob("target-*.json"):
        entry.unlink()
    stored = sorted(p.name for p in tmp_path.iterdir())
    again = forecast(model, batch, targets=["v5e", "v5p"], cache=tmp_path, **options)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("target-")) == [
        name for name in stored if not name.startswith("target-")
    ]
    checked = again.target("v5e").checkpointed
    assert checked is not None and checked.cached
    assert checked.memory_per_chip == variant.memory_per_chip
    assert again.target("v5e").cached and again.target("v5p").cached


FIXTURE = Path(__file__).parent / "fixtures" / "hlo" / "llama_fsdp_v5p8.after_optimizations.txt.gz"

OFFLOAD = """ENTRY %main (p0: f32[8,4], p1: s32[8]) -> f32[8] {
  %p0 = f32[8,4]{1,0} parameter(0)
  %p1 = s32[8]{0} parameter(1)
  %g.start = ((), (), s32[4]{0}) async-start(), async_execution_thread="sparsecore", calls=%c
  %g.start.update = ((f32[8,4]{1,0}, s32[8]{0}), f32[8]{0}, s32[4]{0}) async-update(%g.start, %p0, %p1)
  ROOT %g.done = f32[8]{0} async-done(%g.start.update)
}"""


def test_sparsecore_offloads_become_one_custom_call_xla_can_read():
    """libtpu's offloaded gathers (an async-update that adds operands) are the one thing in
    its programs XLA's parser rejects; written as a custom call of the same operands, the
    real FSDP program parses, and XLA's generic cost analysis counts its bytes."""
    text = standard_hlo(OFFLOAD)
    assert "async" not in text
    assert '%g.done = f32[8]{0} custom-call(%p0, %p1), custom_call_target="sc"' in text
    assert "%p0 = f32[8,4]{1,0} parameter(0)" in text
    untouched = "  %x = f32[8]{0} async-done(%other.start)"
    assert standard_hlo(untouched) == untouched
    from gpu2tpu.forecasting.aot import _generic_bytes, _prepare_jax

    _prepare_jax()
    program = gzip.decompress(FIXTURE.read_bytes()).decode()
    assert "sparsecore" in program
    generic = _generic_bytes(program)
    assert generic is not None and generic > 1e9
    from jaxlib import _hlo

    with pytest.raises(Exception, match="async-update|AsyncUpdate|operand"):
        _hlo.hlo_module_from_text(program)
