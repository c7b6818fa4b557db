"""Fit verdicts: a step that does not fit says what it is made of and what would make it fit.

The verdict's logic is tested on built `TargetForecast`s (fast); the step's sizes and its
attention-dropout masks on the meta device (fast); one real compile of a small encoder
built from torch's own modules checks the whole path (slow: two compiles for v5e).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from gpu2tpu.forecasting.fit_verdict import FitVerdict, StepMemory, fit_verdict
from gpu2tpu.forecasting.optimizers import plan_optimizer
from gpu2tpu.forecasting.result import TargetForecast
from gpu2tpu.forecasting.step_memory import attention_dropout_elements, step_memory
from gpu2tpu.pricing.published_setups import (
    PublishedSetupsError,
    load_published_setups,
)

GiB = 2.0**30


def target(**changes) -> TargetForecast:
    base = TargetForecast(
        target="v4", name="TPU v4", topology="v4:1x1x1", chips=1, devices_per_chip=1,
        status="does not fit", batch=48, memory_per_chip=40 * GiB,
        available_per_chip=30 * GiB, fits=False,
    )  # fmt: skip
    return dataclasses.replace(base, **changes)


def step(**changes) -> StepMemory:
    base = StepMemory(
        weights=1 * GiB, gradients=1 * GiB, optimizer_state=2 * GiB, batch=0.0,
        activations="fp32", optimizer="AdamW", state_per_weight=2, parameters=335_000_000,
        sequence=512, model_class="encoder", attention_dropout_elements=2 * GiB,
    )  # fmt: skip
    return dataclasses.replace(base, **changes)


def remedy(verdict: FitVerdict, start: str):
    return next(r for r in verdict.remedies if r.change.startswith(start))


# -- the verdict's logic, on built records -------------------------------------------------------


def test_the_breakdown_is_the_steps_state_and_the_compilers_rest():
    verdict = fit_verdict(target(), step())
    assert verdict is not None
    assert verdict.parts == {
        "weights": 1 * GiB, "gradients": 1 * GiB, "optimizer state": 2 * GiB,
        "activations and temporaries": 36 * GiB,
    }  # fmt: skip
    assert sum(verdict.parts.values()) == verdict.required == 40 * GiB
    assert verdict.attention_dropout == 2 * GiB  # a byte a score
    assert fit_verdict(target(status="compiled", fits=True), step()) is None


def test_each_change_says_its_memory_what_it_saves_and_whether_it_fits():
    verdict = fit_verdict(target(), step())
    # activations at half: 40 - 18 = 22 GiB, fits 30
    half = remedy(verdict, "bf16 activations")
    assert (half.kind, half.saves, half.memory_per_chip, half.fits) == (
        "estimated", 18 * GiB, 22 * GiB, True,
    )  # fmt: skip
    dropout = remedy(verdict, "no attention dropout")
    assert (dropout.saves, dropout.fits) == (2 * GiB, False)
    optimizer = remedy(verdict, "an optimizer with one state")
    assert optimizer.saves == 1 * GiB and optimizer.fits is False
    # The batch line: 4 GiB fixed, 36 GiB for 48 samples; 26 GiB of room holds 34 samples.
    batch = remedy(verdict, "batch ")
    assert batch.change == "batch 34" and batch.kind == "estimated" and batch.fits
    assert batch.memory_per_chip == pytest.approx(4 * GiB + 34 * 36 * GiB / 48)
    assert batch.memory_per_chip <= 30 * GiB < 4 * GiB + 35 * 36 * GiB / 48
    assert "fits with batch 34 (estimated), or bf16 activations" in verdict.short()


def test_compiled_figures_come_first_and_replace_the_estimates():
    variant = target(status="compiled", fits=True, memory_per_chip=12 * GiB, max_batch=96)
    searched = target(
        checkpointed=variant, max_batch=32, max_batch_exact=True,
        search=[{"batch": 32, "status": "compiled", "memory_per_chip": 29 * GiB},
                {"batch": 33, "status": "oom", "memory_per_chip": 31 * GiB}],
    )  # fmt: skip
    verdict = fit_verdict(searched, step())
    first, second = verdict.remedies[:2]
    assert (first.change, first.kind, first.memory_per_chip, first.saves, first.fits) == (
        "checkpoint every block", "compiled", 12 * GiB, 28 * GiB, True,
    )  # fmt: skip
    assert "largest batch so: 96" in first.detail
    assert (second.change, second.kind, second.memory_per_chip) == (
        "batch 32",
        "compiled",
        29 * GiB,
    )
    # The summary already says what checkpointing does; the clause adds the others.
    assert "checkpoint every block" not in verdict.short(shown=("checkpoint every block",))


def test_bf16_and_dropout_changes_only_where_the_step_has_them():
    verdict = fit_verdict(target(), step(activations="bf16", attention_dropout_elements=0.0))
    changes = [r.change for r in verdict.remedies]
    assert not any("bf16" in c or "dropout" in c for c in changes)
    sgd = fit_verdict(target(), step(optimizer="SGD", state_per_weight=0, optimizer_state=0.0))
    assert not any(r.change.startswith("an optimizer") for r in sgd.remedies)


def test_no_batch_fits_when_the_state_alone_fills_the_chip():
    verdict = fit_verdict(
        target(), step(weights=10 * GiB, gradients=10 * GiB, optimizer_state=20 * GiB)
    )
    batch = remedy(verdict, "a smaller batch")
    assert batch.fits is False and "no room" in batch.detail


def test_the_published_run_is_named_with_the_settings_the_step_does_not_share():
    verdict = fit_verdict(target(), step(), load_published_setups())
    published = verdict.published
    assert published["run"] == "mlperf-google-v4-bert-large-64"
    assert published["per_chip_batch"] == 48 and published["activations"] == "bf16"
    assert "mlcommons/training_results_v1.0" in published["source"]
    assert verdict.differences == ["your activations are fp32, its bf16 (its weights fp32)"]
    lines = verdict.lines()
    assert any(line.startswith("MLPerf Training v1.0, Google") for line in lines)
    # Another chip, another sequence or another size is not that run.
    for other in (target(target="v5e"), target(batch=24)):
        again = fit_verdict(other, step(), load_published_setups())
        assert (again.published is None) == (other.target != "v4")
    assert fit_verdict(target(), step(sequence=128), load_published_setups()).published is None
    small = step(parameters=110_000_000)
    assert fit_verdict(target(), small, load_published_setups()).published is None
    half = fit_verdict(target(batch=24), step(activations="bf16"), load_published_setups())
    assert half.differences == ["your step holds 24 sequences a chip, it 48"]


def test_the_verdict_round_trips_and_renders():
    verdict = fit_verdict(target(), step(), load_published_setups())
    t = target(fit=verdict)
    again = TargetForecast.from_dict(t.to_dict())
    assert again.fit == verdict
    assert "fits with batch 34 (estimated)" in again.summary()


def test_a_setup_without_its_sources_is_refused(tmp_path):
    path = tmp_path / "setups.toml"
    path.write_text('[[setups]]\nrun = "x"\nwhat = "y"\n')
    with pytest.raises(PublishedSetupsError, match="lacks .*sources"):
        load_published_setups(path)


# -- the step's sizes, on the meta device ---------------------------------------------------------


class Encoder(nn.Module):
    """A BERT-shaped encoder from torch's own modules: tokens, `nn.TransformerEncoder`
    (post-norm, GELU, dropout 0.1 on the attention probabilities too), one class a sequence."""

    def __init__(self, layers=4, d=256, heads=4, ffn=1024, vocab=1024, dropout=0.1) -> None:
        super().__init__()
        self.words = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(
            d, heads, ffn, dropout, activation="gelu", batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.words(ids))[:, 0])


def encoder_batch(batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.empty(batch, seq, dtype=torch.long, device="meta"),
        torch.empty(batch, dtype=torch.long, device="meta"),
    )


def test_attention_dropout_masks_are_counted_where_dropout_applies():
    with torch.device("meta"):
        model, still = Encoder(), Encoder(dropout=0.0)
    ids = encoder_batch(8, 256)[0]
    assert attention_dropout_elements(model, (ids,), {}) == 4 * 8 * 4 * 256 * 256
    assert attention_dropout_elements(still, (ids,), {}) == 0
    model.eval()
    assert attention_dropout_elements(model, (ids,), {}) == 4 * 8 * 4 * 256 * 256  # trains
    assert not model.training  # and left as it was


def test_the_steps_sizes_follow_the_optimizer_dtype_and_sharding():
    with torch.device("meta"):
        model = Encoder()
    n = sum(p.numel() for p in model.parameters())
    tensors = list(encoder_batch(8, 256))

    def sizes(optimizer, dtype=None, chips=1, sharding="data"):
        plan = plan_optimizer(optimizer, list(model.named_parameters()))
        return step_memory(
            model, plan, tensors, dtype, chips=chips, devices_per_chip=1, sharding=sharding,
            sequence=256, model_class="encoder", dropout_elements=0.0,
        )  # fmt: skip

    adamw = sizes("adamw")
    assert (adamw.weights, adamw.gradients, adamw.optimizer_state) == (4 * n, 4 * n, 8 * n)
    assert adamw.batch == 8 * 256 * 8 + 8 * 8 and adamw.activations == "fp32"
    assert sizes("sgd").optimizer_state == 0
    assert sizes(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)).optimizer_state == 4 * n
    bf16 = sizes("adamw", torch.bfloat16)
    assert bf16.weights == 2 * n and bf16.activations == "bf16"
    fsdp = sizes("adamw", chips=4, sharding="fsdp")
    assert fsdp.optimizer_state == 2 * n and fsdp.batch == adamw.batch / 4


# -- a real compile ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.torchax
@pytest.mark.timeout(1800)
def test_an_encoder_that_does_not_fit_gets_a_verdict_from_its_compiles():
    """Sixteen `nn.TransformerEncoderLayer`s (d 128, 2,048 tokens, fp32, AdamW) at batch 16:
    compiled at one and two blocks and extended to sixteen (the default for a stack this
    deep), the score-sized attention tensors overflow a v5e; checkpointed per block they fit.
    The verdict's checkpoint line is that compile's figure, the batch line an estimate from
    the breakdown, and both fit. (At four blocks XLA's own rematerialisation squeezes even
    48 sequences into the chip: 14.2 GiB.)"""
    from gpu2tpu.forecasting.forecast import forecast

    with torch.device("meta"):
        model = Encoder(layers=16, d=128, heads=4, ffn=512)
    result = forecast(
        model, encoder_batch(16, 2048), loss_fn=nn.functional.cross_entropy, targets="v5e",
        gpus=(), cache=False, progress=False,
    )  # fmt: skip
    t = result.target("v5e")
    assert t.status == "does not fit" and t.extrapolated, t.summary()
    assert t.checkpointed is not None and t.checkpointed.status == "compiled"
    verdict = t.fit
    assert verdict is not None and verdict.required == t.memory_per_chip
    checkpoint = remedy(verdict, "checkpoint every block")
    assert checkpoint.kind == "compiled" and checkpoint.fits
    assert checkpoint.memory_per_chip == t.checkpointed.memory_per_chip
    assert checkpoint.saves == t.memory_per_chip - t.checkpointed.memory_per_chip
    batch = remedy(verdict, "batch ")
    assert batch.kind == "estimated" and batch.fits and 0 < int(batch.change.split()[1]) < 16
    # The masks are a share of what does not fit: 16 layers x 16 x 4 heads x 2048^2 scores.
    assert verdict.attention_dropout == 16 * 16 * 4 * 2048 * 2048
    assert verdict.published is None  # no published run of this model
    assert any(note.startswith("v5e does not fit at batch 16: needs") for note in result.notes)
    assert "checkpoint every block: fits" in repr(result)


# -- the checkpointed re-check finds encoders' blocks -------------------------------------------


class HFLayer(nn.Module):
    """A block shaped as Hugging Face's BertLayer: called with keyword arguments, returns a
    tuple."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(d, 2, batch_first=True)
        self.output = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, hidden_states, attention_mask=None):
        attended = self.attention(hidden_states, hidden_states, hidden_states,
                                  key_padding_mask=attention_mask, need_weights=False)[0]  # fmt: skip
        return (hidden_states + self.output(hidden_states + attended),)


class HFEncoder(nn.Module):
    def __init__(self, d: int = 16, layers: int = 4) -> None:
        super().__init__()
        self.layer = nn.ModuleList(HFLayer(d) for _ in range(layers))

    def forward(self, hidden_states, attention_mask=None):
        for layer in self.layer:
            hidden_states = layer(hidden_states, attention_mask=attention_mask)[0]
        return hidden_states


class HFBert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = HFEncoder()

    def forward(self, x, mask):
        return self.encoder(x, attention_mask=mask)


def _saved(model: nn.Module, *args) -> int:
    count = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal count
        count += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(*args).sum().backward()
    return count


@pytest.mark.parametrize("kind", ["huggingface", "torch"])
def test_encoders_blocks_are_found_and_checkpointed(kind):
    """The blocks the re-check checkpoints, in an encoder shaped as Hugging Face's BERT
    (`encoder.layer`, keyword arguments, tuple outputs) and in torch's own
    `nn.TransformerEncoder` (`encoder.layers`): found, and the checkpointed copy computes
    the same with fewer tensors saved for the backward."""
    from gpu2tpu.forecasting.extrapolate import find_block_stack, with_checkpointed_blocks

    torch.manual_seed(0)
    x = torch.randn(2, 8, 16)
    if kind == "huggingface":
        model, args, path = HFBert(), (x, torch.zeros(2, 8, dtype=torch.bool)), "encoder.layer"
    else:
        model = Encoder(layers=4, d=16, heads=2, ffn=32, vocab=64, dropout=0.0)
        args, path = (torch.randint(0, 64, (2, 8)),), "encoder.layers"
    stack = find_block_stack(model)
    assert stack is not None and (stack.path, stack.depth) == (path, 4)
    copy = with_checkpointed_blocks(model, stack)
    torch.testing.assert_close(copy(*args), model(*args))
    plain = _saved(model, *args)
    assert _saved(copy, *args) < plain
