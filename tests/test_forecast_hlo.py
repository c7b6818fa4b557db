"""What the forecast reads from libtpu's optimized HLO, and the arithmetic around it.

No compile here: the HLO is a real program libtpu wrote (tests/fixtures/hlo, a 2-layer
Llama-style step, bf16, AdamW, one 1,024-token sequence per chip, FSDP over v5p 2x2x2,
libtpu 0.0.52), plus small modules in the same text format for single features. The
compiled checks of the same figures are in tests/test_forecast_flops.py.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import torch
from forecast_models import Llama, analytic_step_flops, matmul_parameters
from torch import nn

from gpu2tpu.forecasting import hlo
from gpu2tpu.forecasting.extrapolate import find_block_stack, with_checkpointed_blocks
from gpu2tpu.forecasting.lowering import FLASH_BLOCK, flash_attention_flops
from gpu2tpu.pricing.catalogue import HardwareCatalogue, source_date

FIXTURE = Path(__file__).parent / "fixtures" / "hlo" / "llama_fsdp_v5p8.after_optimizations.txt.gz"
# The fixture's model: Llama(layers=2, d=1024, heads=8, kv_heads=8, hidden=3584, vocab=16384)
# at sequence 1024, eight chips, one sequence each.
SHAPE = {"layers": 2, "d": 1024, "heads": 8, "kv_heads": 8, "hidden": 3584, "vocab": 16384}
CHIPS, SEQ = 8, 1024


@pytest.fixture(scope="module")
def fsdp_program() -> hlo.ProgramSummary:
    return hlo.summarize(gzip.decompress(FIXTURE.read_bytes()).decode())


def fixture_parameters(shape: dict[str, int] = SHAPE) -> tuple[int, int]:
    """(matmul parameters, all parameters) of a `Llama` of this shape."""
    d, layers, hidden, vocab = shape["d"], shape["layers"], shape["hidden"], shape["vocab"]
    kv_width = shape["kv_heads"] * d // shape["heads"]
    matmul = layers * (2 * d * d + 2 * d * kv_width + 3 * d * hidden) + vocab * d
    return matmul, matmul + vocab * d + (2 * layers + 1) * d


def test_the_parameter_count_is_the_models():
    small = {"layers": 3, "d": 64, "heads": 8, "kv_heads": 2, "hidden": 96, "vocab": 100}
    model = Llama(**small)
    assert fixture_parameters(small) == (
        matmul_parameters(model),
        sum(p.numel() for p in model.parameters()),
    )


def test_windowed_einsum_loops_are_counted_as_often_as_they_run(fsdp_program):
    """Under FSDP libtpu computes the weight gradients as loops of partial matmuls and
    collective-permutes; XLA's cost analysis counts each loop body once. Read with their
    trip counts, the program's matmul FLOPs per chip are the analytic count's (the
    reference attention computes all the scores: the non-causal count)."""
    analytic = analytic_step_flops(
        fixture_parameters()[0], SHAPE["layers"], SHAPE["d"], 1, SEQ, causal=False
    )
    assert fsdp_program.unknown_loops == 0
    assert fsdp_program.devices == CHIPS
    assert fsdp_program.matmul_flops == pytest.approx(analytic, rel=0.005)
    # What a body-once count misses here: 15% of the step's matmul FLOPs.
    assert fsdp_program.loop_flops > 0.1 * fsdp_program.matmul_flops
    assert fsdp_program.matmul_flops - fsdp_program.loop_flops < 0.9 * analytic
    assert fsdp_program.loop_bytes > 0
    # libtpu's online-softmax kernel holds attention's probabilities-times-values product.
    assert fsdp_program.custom_calls.get("online-softmax") == SHAPE["layers"]
    per_layer = 2 * SHAPE["heads"] * SEQ * SEQ * (SHAPE["d"] // SHAPE["heads"])
    assert fsdp_program.kernel_flops == pytest.approx(SHAPE["layers"] * per_layer)
    assert fsdp_program.attention_flops == pytest.approx(12 * SHAPE["layers"] * SEQ**2 * SHAPE["d"])


def test_fsdp_collectives_carry_every_weight_and_gradient(fsdp_program):
    """Each chip receives every weight it does not hold (an all-gather) and sends its part
    of every gradient (a reduce-scatter, here partly as collective-permutes inside the
    windowed loops): at least (n-1)/n of the bf16 weights, twice, leave each chip."""
    params = fixture_parameters()[1]
    floor = 2 * (CHIPS - 1) / CHIPS * params * 2  # weights and gradients, 2 bytes each
    assert floor <= fsdp_program.ici_bytes <= 4 * floor
    assert set(fsdp_program.collectives) >= {"all-gather", "collective-permute"}
    permutes = fsdp_program.collectives["collective-permute"]
    assert permutes.async_ici_bytes == permutes.ici_bytes > 0  # start/done pairs
    gathers = fsdp_program.collectives["all-gather"]
    assert gathers.ici_bytes == pytest.approx((CHIPS - 1) * gathers.payload_bytes)


LOOP = """\
HloModule jit_step, is_scheduled=true, num_partitions=4

%body (p: (bf16[64,128], bf16[128,256], s32[])) -> (bf16[64,128], bf16[128,256], s32[]) {
  %p = (bf16[64,128]{1,0}, bf16[128,256]{1,0}, s32[]) parameter(0)
  %x = bf16[64,128]{1,0} get-tuple-element(%p), index=0
  %w = bf16[128,256]{1,0} get-tuple-element(%p), index=1
  %i = s32[] get-tuple-element(%p), index=2
  %dot.1 = bf16[64,256]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %t = (bf16[64,128]{1,0}, bf16[128,256]{1,0}, s32[]) tuple(%x, %w, %next)
}

%cond (q: (bf16[64,128], bf16[128,256], s32[])) -> pred[] {
  %q = (bf16[64,128]{1,0}, bf16[128,256]{1,0}, s32[]) parameter(0)
  %limit = s32[] constant(5)
  %j = s32[] get-tuple-element(%q), index=2
  ROOT %lt = pred[] compare(%j, %limit), direction=LT
}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (x: bf16[64,128], w: bf16[128,256], g: f32[1024,256]) -> f32[256,256] {
  %x = bf16[64,128]{1,0} parameter(0)
  %w = bf16[128,256]{1,0} parameter(1)
  %g = f32[1024,256]{1,0} parameter(2)
  %zero = s32[] constant(0)
  %init = (bf16[64,128]{1,0}, bf16[128,256]{1,0}, s32[]) tuple(%x, %w, %zero)
  %loop = (bf16[64,128]{1,0}, bf16[128,256]{1,0}, s32[]) while(%init), condition=%cond, body=%body
  %gathered = bf16[512,256]{1,0} all-gather(%w), channel_id=1, replica_groups=[1,4]<=[4], dimensions={0}
  %summed = f32[1024,256]{1,0} all-reduce(%g), channel_id=2, replica_groups={{0,1},{2,3}}, to_apply=%add
  %scattered = f32[256,256]{1,0} reduce-scatter(%g), channel_id=3, replica_groups=mesh['x'=2,'y'=2] {'x','y'}, dimensions={0}, to_apply=%add
  ROOT %moved = f32[256,256]{1,0} collective-permute(%scattered), channel_id=4, source_target_pairs={{0,1},{1,0}}
}
"""


def test_a_counted_loop_multiplies_its_body():
    program = hlo.summarize(LOOP)
    dot = 2 * 64 * 256 * 128
    assert program.matmul_flops == 5 * dot  # i = 0, 1, 2, 3, 4
    assert program.loop_flops == 4 * dot  # what a body-once count leaves out
    assert program.unknown_loops == 0
    computations, entry = hlo.parse_computations(LOOP)
    loop = next(i for i in computations[entry] if i.opcode == "while")
    assert hlo.trip_count(loop, computations, computations[entry]) == 5
    known = LOOP.replace("body=%body", 'body=%body, backend_config={"known_trip_count":{"n":"7"}}')
    assert hlo.summarize(known).matmul_flops == 7 * dot


def test_collective_bytes_per_device_by_ring_algorithms():
    program = hlo.summarize(LOOP)
    shard, grads = 128 * 256 * 2, 1024 * 256 * 4
    c = program.collectives
    assert c["all-gather"].ici_bytes == 3 * shard  # (n-1) shards in, each forwarded
    assert c["all-reduce"].ici_bytes == pytest.approx(2 * (2 - 1) / 2 * grads)  # groups of 2
    assert c["reduce-scatter"].ici_bytes == pytest.approx(3 / 4 * grads)  # mesh x*y = 4
    assert c["collective-permute"].ici_bytes == 256 * 256 * 4
    assert program.ici_bytes == sum(t.ici_bytes for t in c.values())
    assert program.async_ici_bytes == 0  # none of these is a start/done pair


@pytest.mark.parametrize(
    ("attributes", "size"),
    [
        ("replica_groups=mesh['axis_0'=8] {'axis_0'}, dimensions={0}", 8),
        ("replica_groups=mesh['a'=2,'b'=4] {'b'}, dimensions={0}", 4),
        ("replica_groups=[2,4]<=[8], dimensions={0}", 4),
        ("replica_groups={{0,1,2},{3,4,5}}, dimensions={0}", 3),
        ("replica_groups={}, dimensions={0}", 16),
        ("dimensions={0}", 16),
    ],
)
def test_replica_group_forms(attributes, size):
    assert hlo.group_size(attributes, 16) == size


def test_a_batched_matmul_lowered_to_a_convolution_counts_real_taps_only():
    """libtpu writes attention's batched products as convolutions whose batch sits in a
    dilated spatial dimension (lhs_dilate = window size): one real tap per output."""
    text = """\
HloModule m, num_partitions=1

ENTRY %e (a: bf16[32,4096,128], b: bf16[32,128,4096]) -> bf16[32,4096,4096] {
  %a = bf16[32,4096,128]{2,1,0} parameter(0)
  %b = bf16[32,128,4096]{2,1,0} parameter(1)
  ROOT %c = bf16[32,4096,4096]{2,1,0:T(8,128)(2,1)} convolution(%a, %b), window={size=32 stride=31 lhs_dilate=32}, dim_labels=0bf_0io->0bf
}
"""
    assert hlo.summarize(text).matmul_flops == 2 * 32 * 4096 * 4096 * 128


def test_shapes():
    assert (
        hlo.shape_bytes("(bf16[8,128]{1,0:T(8,128)(2,1)}, f32[4]{0}, s32[])")
        == 8 * 128 * 2 + 16 + 4
    )
    assert hlo.shape_dims("bf16[8,4096,16032]{1,2,0:T(8,128)(2,1)}") == [8, 4096, 16032]
    line = '  %x.1 = f32[2,3]{1,0} add(f32[2,3]{1,0} %a, f32[2,3]{1,0} %b), metadata={op_name="f"}'
    instruction = hlo.parse_instruction(line)
    assert instruction is not None
    assert (instruction.name, instruction.opcode, instruction.operands) == (
        "x.1",
        "add",
        ["a", "b"],
    )


def test_flash_attention_flops_follow_the_kernels_blocks():
    """Nine products per block pair (forward 2, dK/dV 4, dQ 3); causal skips the pairs
    above the diagonal: (n + 1) / 2n of them for n blocks."""
    full = flash_attention_flops(2, 8, 1024, 1024, 64, causal=False)
    assert full == 18 * 2 * 8 * 1024 * 1024 * 64  # 1.5x the reference formula's 12
    blocks = 1024 // FLASH_BLOCK
    causal = flash_attention_flops(2, 8, 1024, 1024, 64, causal=True)
    assert causal == pytest.approx(full * (blocks + 1) / (2 * blocks))


def test_tpu_ici_bandwidths_are_sourced():
    catalogue = HardwareCatalogue.load()
    for key, gbs in (("v5e", 400), ("v5p", 1200), ("v6e", 800), ("tpu7x", 1200)):
        chip = catalogue.get(key)
        assert chip.ici_bandwidth == gbs * 1e9, key
        assert source_date(chip.sources["ici_bandwidth"]) is not None, key
    assert catalogue.get("h100").ici_bandwidth is None  # not an ICI chip


def test_a_figure_without_a_source_is_refused(tmp_path):
    from gpu2tpu.pricing.catalogue import DEFAULT_PATH, CatalogueError

    text = DEFAULT_PATH.read_text()
    start = text.index("[chips.v5e.sources]")
    line_start = text.index("ici_bandwidth = ", start)
    broken = text[:line_start] + text[text.index("\n", line_start) + 1 :]
    path = tmp_path / "hardware.toml"
    path.write_text(broken)
    with pytest.raises(CatalogueError, match=r"v5e.*ici_bandwidth"):
        HardwareCatalogue.load(path)


def test_the_roofline_bound_includes_the_interconnect():
    """ICI time is the bytes a chip sends over the outgoing half of its bidirectional
    bandwidth; the bound is the largest of compute, HBM and ICI (they overlap)."""
    from gpu2tpu.forecasting import forecast as fc

    v5p = HardwareCatalogue.load().get("v5p")
    target = fc.TargetForecast(
        "v5p", v5p.name, "v5p:2x2x2", 8, 1, "compiled", 8,
        flops=8 * 459e12 * 0.010,  # 10 ms of compute per chip
        bytes_accessed=8 * 2765e9 * 0.004,  # 4 ms of HBM traffic per chip
        collective_bytes_per_chip=600e9 * 0.020,  # 20 ms of ICI
    )  # fmt: skip
    fc._price_all(target, v5p, None, "on_demand")
    assert target.collective_seconds == pytest.approx(0.020)
    assert target.step_seconds == pytest.approx(0.020) and target.bound == "interconnect"
    target.collective_bytes_per_chip = 600e9 * 0.001
    fc._price_all(target, v5p, None, "on_demand")
    assert target.step_seconds == pytest.approx(0.010) and target.bound == "compute"
    assert target.flops_per_chip == pytest.approx(459e12 * 0.010)


def test_a_target_with_its_checkpointed_variant_round_trips():
    from gpu2tpu.forecasting import forecast as fc

    variant = fc.TargetForecast("v6e", "TPU v6e", "v6e:16x16", 256, 1, "compiled", 256,
                                memory_per_chip=20e9, flops=1e15, bytes_accessed=1e13)  # fmt: skip
    target = fc.TargetForecast("v6e", "TPU v6e", "v6e:16x16", 256, 1, "does not fit", 256,
                               memory_per_chip=80e9, available_per_chip=33.5e9,
                               checkpointed=variant)  # fmt: skip
    again = fc.TargetForecast.from_dict(target.to_dict())
    assert isinstance(again.checkpointed, fc.TargetForecast)
    assert again.checkpointed.memory_per_chip == 20e9
    assert "with activation checkpointing per block it fits" in target.summary()


class Residual(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


class Stack(nn.Module):
    def __init__(self, d: int = 16, n: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Residual(d) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def _saved_tensors(model: nn.Module, x: torch.Tensor) -> int:
    count = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal count
        count += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x).sum().backward()
    return count


def test_checkpointed_blocks_compute_the_same_and_keep_fewer_activations():
    """The copy the does-not-fit advice compiles: same names, same outputs and gradients,
    each block under torch.utils.checkpoint (fewer tensors saved for the backward)."""
    torch.manual_seed(0)
    model = Stack()
    stack = find_block_stack(model)
    assert stack is not None
    copy = with_checkpointed_blocks(model, stack)
    assert [n for n, _ in copy.named_parameters()] == [n for n, _ in model.named_parameters()]
    assert copy.blocks[0].fc1.weight is model.blocks[0].fc1.weight
    assert "forward" not in vars(model.blocks[0])  # the model's own blocks are untouched
    x = torch.randn(8, 16, requires_grad=True)
    torch.testing.assert_close(copy(x), model(x))
    plain = _saved_tensors(model, x)
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    checkpointed = _saved_tensors(copy, x)
    for p, g in zip(model.parameters(), grads, strict=True):
        torch.testing.assert_close(p.grad, g)
    assert checkpointed < plain
