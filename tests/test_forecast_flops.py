"""FLOPs, bytes and memory the forecast reports, checked against independent counts.

Every test here compiles real training steps for TPU topologies with libtpu (tens of
seconds each on a 2-core machine), so all are slow. The arithmetic they rely on (the
analytic count, the HLO reading, the kernel FLOPs) is tested without compiling in
tests/test_forecast_hlo.py. The analytic count is docs/forecast.md's: 6 x matmul parameters
x tokens, plus 12 x layers x batch x sequence^2 x attention width for the score and context
products (non-causal: what the reference formula computes even under a causal mask).
"""

from __future__ import annotations

import pytest
import torch
from forecast_models import Llama, analytic_step_flops, lm_loss, matmul_parameters
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint, checkpoint_sequential
from torch.utils.flop_counter import FlopCounterMode

from gpu2tpu.forecasting.forecast import TargetForecast, forecast
from gpu2tpu.forecasting.lowering import flash_attention_flops

# The compiles run in the forecast's forked child; the torchax mark keeps these tests in the
# torchax run, after the others (conftest.py), as the forecast's own tests are.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.torchax,
    pytest.mark.timeout(3600),
]
# The two tests that share the one-chip compile run on one worker; the others spread over the
# workers (each compiles for minutes: side by side they take the time of the longest).
ONE_CHIP = pytest.mark.xdist_group("forecast-flops-one-chip")

SMALL = {"layers": 2, "d": 512, "heads": 8, "kv_heads": 4, "hidden": 1536, "vocab": 8192}
SEQ = 1024


def meta_llama(**shape: int) -> nn.Module:
    with torch.device("meta"):
        return Llama(**shape).to(torch.bfloat16)


def tokens(batch: int, seq: int = SEQ) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.empty(batch, seq, dtype=torch.long, device="meta")
    return ids, ids


def run(model: nn.Module, batch: tuple, target: str = "v5e", **options) -> TargetForecast:
    settings = {"loss_fn": lm_loss, "targets": [target], "cache": False, "progress": False}
    settings.update(options)
    result = forecast(model, batch, **settings)
    outcome = result.targets[0]
    assert outcome.status in ("compiled", "does not fit"), outcome.message
    return outcome


def analytic(model: nn.Module, batch: int, seq: int = SEQ, causal: bool = False) -> float:
    shape = model.shape
    return analytic_step_flops(
        matmul_parameters(model), shape["layers"], shape["d"], batch, seq, causal
    )


@pytest.fixture(scope="module")
def one_chip_full() -> tuple[nn.Module, TargetForecast]:
    model = meta_llama(**SMALL)
    return model, run(model, tokens(2), attention="full")


@ONE_CHIP
def test_one_chip_flops_agree_with_the_analytic_count_and_pytorchs(one_chip_full):
    """One v5e chip, the reference attention: all FLOPs within 3% of the analytic count,
    the matrix products within 3% of PyTorch's FlopCounterMode on the same step run on
    the CPU (its SDPA forced onto the math path, so the attention products are counted)."""
    model, target = one_chip_full
    assert target.flops == pytest.approx(analytic(model, 2), rel=0.03)
    assert target.matmul_flops == pytest.approx(analytic(model, 2), rel=0.01)
    assert target.attention_kind == "full"
    cpu = Llama(**SMALL)
    ids = torch.randint(0, SMALL["vocab"], (2, SEQ))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        lm_loss(cpu(ids), ids).backward()
    assert target.matmul_flops == pytest.approx(counter.get_total_flops(), rel=0.03)


@ONE_CHIP
def test_flash_attention_holds_no_scores_and_counts_what_its_kernels_run(one_chip_full):
    """The same step with SDPA as the Pallas flash kernel: less memory (no scores held),
    and FLOPs of 6·N·tokens plus what the kernels execute (the backward recomputes the
    scores; the causal mask skips the blocks above the diagonal)."""
    model, full = one_chip_full
    flash = run(model, tokens(2), attention="flash")
    assert flash.attention_kind == "flash"
    assert flash.memory_breakdown["temp"] < full.memory_breakdown["temp"]
    head_dim = SMALL["d"] // SMALL["heads"]
    kernels = SMALL["layers"] * flash_attention_flops(2, SMALL["heads"], SEQ, SEQ, head_dim, True)
    expected = 6 * matmul_parameters(model) * 2 * SEQ + kernels
    assert flash.flops == pytest.approx(expected, rel=0.03)
    assert flash.attention_flops == pytest.approx(kernels, rel=0.001)


FIXTURE_SHAPE = {"layers": 2, "d": 1024, "heads": 8, "kv_heads": 8, "hidden": 3584, "vocab": 16384}


def test_data_parallel_and_fsdp_slices_per_chip():
    """Per chip, one sequence each: the slice's FLOPs over its chips match the analytic
    count of one sequence, data-parallel on four v5p chips and FSDP on eight. Under FSDP
    libtpu computes weight gradients as windowed loops that the compiler's own count takes
    once (`compiler_flops`, 15% short here: the 8B benchmark's missing FLOPs); and every
    weight and gradient crosses ICI."""
    model = meta_llama(**FIXTURE_SHAPE)
    one = analytic(model, 1)
    data = run(model, tokens(4), target="v5p", chips=4, attention="full")
    assert data.flops_per_chip == pytest.approx(one, rel=0.03)
    assert data.collective_bytes_per_chip > 0  # the gradients' all-reduce
    fsdp = run(model, tokens(8), target="v5p", chips=8, sharding="fsdp", attention="full")
    assert fsdp.flops_per_chip == pytest.approx(one, rel=0.03)
    assert fsdp.compiler_flops / fsdp.chips < 0.9 * one
    params = sum(p.numel() for p in model.parameters())
    assert fsdp.collective_bytes_per_chip >= 2 * 7 / 8 * params * 2
    assert fsdp.collective_seconds == pytest.approx(fsdp.collective_bytes_per_chip / 600e9)


def test_extrapolated_flops_match_a_whole_compile():
    """Eight blocks compiled whole against one and two blocks extended to eight."""
    model = meta_llama(**{**SMALL, "layers": 8})
    whole = run(model, tokens(2), extrapolate=False)
    line = run(model, tokens(2), extrapolate=True)
    assert line.extrapolated and not whole.extrapolated
    for name in ("flops", "matmul_flops", "attention_flops"):
        assert getattr(line, name) == pytest.approx(getattr(whole, name), rel=0.03), name
    assert whole.flops == pytest.approx(
        6 * matmul_parameters(model) * 2 * SEQ + whole.attention_flops, rel=0.03
    )


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


class CheckpointedMLP(nn.Module):
    """The issue's example: four MLP blocks, d 1024, checkpointed in one of torch's ways."""

    def __init__(self, how: str, d: int = 1024, blocks: int = 4) -> None:
        super().__init__()
        self.how = how
        self.blocks = nn.Sequential(*(Block(d) for _ in range(blocks)))
        if how == "checkpoint_wrapper":
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
                checkpoint_wrapper,
            )

            self.blocks = nn.Sequential(*(checkpoint_wrapper(b) for b in self.blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how in ("use_reentrant=False", "use_reentrant=True"):
            for block in self.blocks:
                x = checkpoint(block, x, use_reentrant=self.how.endswith("True"))
            return x
        if self.how == "checkpoint_sequential":
            return checkpoint_sequential(self.blocks, 4, x, use_reentrant=False)
        return self.blocks(x)


def test_activation_checkpointing_trades_memory_for_recompute():
    """Each form of torch's activation checkpointing, lowered to jax.checkpoint: less
    memory, more FLOPs (the recomputed forward), on the issue's MLP (v5e, batch 16 x 2048)."""
    batch = (torch.empty(16, 2048, 1024, device="meta"), torch.empty(16, 2048, 1024, device="meta"))

    def forecast_mlp(how: str) -> TargetForecast:
        with torch.device("meta"):
            model = CheckpointedMLP(how)
        return run(model, batch, loss_fn=nn.functional.mse_loss)

    plain = forecast_mlp("none")
    assert plain.remat_regions == 0
    forward = 2 * 8 * 1024 * 1024 * 16 * 2048 * 4  # two products per block, 4 blocks
    # Backward twice the forward, less the first block's input gradient (nothing needs it).
    assert plain.matmul_flops == pytest.approx(3 * forward - forward / 8, rel=0.01)
    for how, regions in (
        ("use_reentrant=False", 4),
        ("use_reentrant=True", 4),
        ("checkpoint_wrapper", 4),
        ("checkpoint_sequential", 3),  # four segments: the last one is not checkpointed
    ):
        done = forecast_mlp(how)
        assert done.remat_regions == regions, how
        assert done.memory_per_chip < 0.8 * plain.memory_per_chip, how
        # XLA recomputes what the backward needs: at least fc1 of each checkpointed block.
        assert done.matmul_flops > plain.matmul_flops + regions * forward / 4 / 2 * 0.99, how
        assert done.matmul_flops <= plain.matmul_flops + forward, how


class ResidualStack(nn.Module):
    def __init__(self, d: int = 1024, layers: int = 16) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(d) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_a_step_that_does_not_fit_is_tried_with_every_block_checkpointed():
    """Sixteen MLP blocks whose activations overflow a v5e at batch 32 (about 0.9 GB per
    block at batch 16, measured on four): the forecast says it fits with checkpointing per
    block, at what bound, and the largest batch either way."""
    with torch.device("meta"):
        model = ResidualStack()
    batch = (torch.empty(32, 2048, 1024, device="meta"), torch.empty(32, 2048, 1024, device="meta"))
    target = run(
        model, batch, loss_fn=nn.functional.mse_loss, batch_search=True, time_budget_s=1800
    )
    assert target.status == "does not fit" and target.extrapolated
    variant = target.checkpointed
    assert variant is not None and variant.status == "compiled", target.summary()
    assert variant.memory_per_chip < target.available_per_chip < target.memory_per_chip
    assert variant.flops > 0 and variant.step_seconds > 0
    assert target.max_batch is not None and target.max_batch < 32
    assert variant.max_batch is not None and variant.max_batch >= 32
    text = target.summary()
    assert "with activation checkpointing per block it fits" in text
    assert f"largest batch with checkpointing: {variant.max_batch}" in text


def test_an_8b_model_at_8192_tokens_on_256_v6e_chips():
    """The issue's case: Llama-3.1-8B's shape, one 8,192-token sequence per chip, FSDP on
    256 v6e chips (the reference attention, as torchax traces plain SDPA): it does not fit,
    and the forecast says whether checkpointing every block makes it fit."""
    model = meta_llama(layers=32, d=4096, heads=32, kv_heads=8, hidden=14336, vocab=128256)
    target = run(
        model, tokens(256, 8192), target="v6e", chips=256, sharding="fsdp", attention="full"
    )
    assert target.status == "does not fit"
    assert target.checkpointed is not None
    assert target.checkpointed.status in ("compiled", "does not fit")
    assert target.checkpointed.memory_per_chip < target.memory_per_chip
    assert "activation checkpointing per block" in target.summary()
