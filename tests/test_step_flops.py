"""The profiler's FLOP count against analytic counts: grouped and depthwise convolutions,
attention through SDPA's CPU kernels and through `bmm`; and what the count says about the
step (precision, model class, kernel launches). Models run on the meta device where they are
large, so nothing is allocated."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from published_models import build
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from gpu2tpu.measure.flop_formulas import torch_overcounts_grouped_conv_backward
from gpu2tpu.measure.flops import count_meta_step, count_step
from gpu2tpu.measure.workload import (
    CONV_SHARE,
    SMALL_STEP_FLOPS,
    OpMix,
    guess_model_class,
    step_precision,
)


def conv_forward(batch: int, c_in: int, c_out: int, groups: int, kernel: int, out_hw: int) -> int:
    """2 x multiply-adds of a 2-D convolution, written out: every output element sums
    kernel x kernel x c_in / groups products."""
    return 2 * batch * c_out * out_hw * out_hw * kernel * kernel * (c_in // groups)


def train_step(module: nn.Module, x: torch.Tensor):
    def step() -> None:
        module(x).sum().backward()

    return step


@pytest.mark.parametrize(
    ("c_in", "c_out", "groups"),
    [(96, 96, 96), (64, 128, 4), (32, 32, 1)],
    ids=["depthwise", "grouped", "dense"],
)
def test_a_convolution_step_is_counted_as_three_forward_convolutions(c_in, c_out, groups):
    conv = nn.Conv2d(c_in, c_out, 3, padding=1, groups=groups, bias=False)
    x = torch.randn(2, c_in, 14, 14, requires_grad=True)
    count = count_step(train_step(conv, x))
    # forward, input gradient, weight gradient: each the same products
    assert count.flops == 3 * conv_forward(2, c_in, c_out, groups, 3, 14)
    assert count.mix.conv_flops == count.flops


def test_transposed_and_3d_grouped_convolutions_are_counted_analytically():
    with torch.device("meta"):
        up = nn.ConvTranspose3d(32, 16, 2, stride=2, groups=8, bias=False)
        x = torch.empty(2, 32, 8, 8, 8, requires_grad=True)
    count = count_step(train_step(up, x))
    # a transposed convolution: every input position times kernel x c_out / groups products
    forward = 2 * 2 * 8**3 * 2**3 * 32 * (16 // 8)
    assert count.flops == 3 * forward
    assert count.mix.conv3d_flops == count.mix.transposed_conv_flops == count.flops


def test_the_installed_torch_still_needs_the_grouped_convolution_correction():
    """torch 2.1 through 2.12 count a grouped convolution's weight gradient `groups` times
    (docs/profiler.md). If this fails, the installed torch counts it right: the correction is
    then no longer applied (the probe decides), so record from which version in the docs and
    in flop_formulas.py's docstring."""
    conv = nn.Conv2d(96, 96, 3, padding=1, groups=96, bias=False)
    x = torch.randn(2, 96, 14, 14, requires_grad=True)
    with FlopCounterMode(display=False) as raw:
        conv(x).sum().backward()
    analytic = 3 * conv_forward(2, 96, 96, 96, 3, 14)
    assert raw.get_total_flops() / analytic == pytest.approx((1 + 1 + 96) / 3)
    assert torch_overcounts_grouped_conv_backward()


def test_sdpa_on_the_cpu_is_counted_as_attention():
    b, h, s, d = 2, 4, 64, 16
    q = torch.randn(b, h, s, d, requires_grad=True)
    count = count_step(lambda: F.scaled_dot_product_attention(q, q, q).sum().backward())
    products = 2 * b * h * s * s * d  # one s x s x d product
    assert count.flops == count.attention_flops == (2 + 5) * products
    assert not count.mix.causal_attention
    causal = count_step(
        lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    )
    assert causal.mix.causal_attention


class SelfAttention(nn.Module):
    """Attention written out, as BERT's eager implementation does it: matmul, softmax, matmul
    (torch runs the 4-D matmuls as `bmm`)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, width = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / math.sqrt(width // self.heads)
        return (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, width)


class EncoderBlock(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.attention = SelfAttention(width, heads)
        self.mlp = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.attention(x))


def test_attention_through_bmm_in_an_encoder_is_counted_as_attention():
    b, s, width, heads = 2, 32, 64, 4
    x = torch.randn(b, s, width)
    count = count_step(train_step(EncoderBlock(width, heads), x))
    # QK^T and PV forward, twice each backward: 12 x b x s x s x width
    assert count.attention_flops == 12 * b * s * s * width
    assert count.flops > count.attention_flops  # the projections stay matmuls
    assert not any("bmm" in note for note in count.notes)
    # torch's own MultiheadAttention, asked for its weights, runs the same products as bmm
    mha = nn.MultiheadAttention(width, heads, batch_first=True)
    count = count_step(lambda: mha(x, x, x)[0].sum().backward())
    assert count.attention_flops == 12 * b * s * s * width


def test_bmm_outside_attention_is_noted_not_counted_as_attention():
    a = torch.randn(8, 32, 16, requires_grad=True)
    count = count_step(lambda: torch.bmm(a, a.transpose(1, 2)).sum().backward())
    assert count.attention_flops == 0
    assert any("batched matmuls outside any module named for attention" in n for n in count.notes)


def test_precision_is_the_dtype_of_the_matrix_flops():
    layer = nn.Linear(64, 64)
    x = torch.randn(8, 64)
    assert count_step(train_step(layer, x)).precision == "fp32"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert count_step(train_step(layer, x)).precision == "bf16"
    assert step_precision(OpMix(flops_by_dtype={"torch.float16": 3.0, "torch.float32": 1.0})) == (
        "fp16"
    )
    assert step_precision(OpMix()) is None


def _resnet_block(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(width, width, 3, padding=1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.Conv2d(width, width, 3, padding=1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(width, 10),
    )


def test_the_model_class_is_read_from_the_counted_ops():
    with torch.device("meta"):
        cnn = _resnet_block(64)
        images = torch.empty(256, 64, 56, 56)
        unet = nn.Sequential(nn.Conv3d(4, 32, 3, padding=1), nn.Conv3d(32, 32, 3, padding=1))
        volumes = torch.empty(2, 4, 64, 64, 64)
        encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True), num_layers=2
        )
        tokens = torch.empty(16, 512, 512)
    assert count_step(train_step(cnn, images)).model_class == "cnn"
    assert count_step(train_step(unet, volumes)).model_class == "unet"
    assert count_step(train_step(encoder, tokens)).model_class == "encoder"
    tiny = count_step(train_step(nn.Linear(4, 2), torch.randn(8, 4)))
    assert tiny.model_class == "small_step"
    assert tiny.flops < SMALL_STEP_FLOPS


def test_the_class_rules_in_order():
    big = 1e12
    causal = OpMix(matmul_flops=8e11, attention_flops=2e11, causal_attention=True)
    assert guess_model_class(causal, big)[0] == "llm_decoder"
    assert guess_model_class(OpMix(matmul_flops=1e12), big)[0] == "llm_decoder"
    upsampled = OpMix(conv_flops=9e11, matmul_flops=1e11, upsampling=True)
    assert guess_model_class(upsampled, big) == ("unet", "90% of the matrix FLOPs in "
                                                 "convolutions, with upsampling")  # fmt: skip
    assert guess_model_class(OpMix(conv_flops=9e11, matmul_flops=1e11), big)[0] == "cnn"
    assert guess_model_class(OpMix(conv_flops=1e9), 1e9)[0] == "small_step"
    # a latent diffusion U-Net: half its matrix FLOPs in attention and linear layers
    latent = OpMix(conv_flops=4.9e11, matmul_flops=3.3e11, attention_flops=1.8e11, upsampling=True)
    assert guess_model_class(latent, big) == ("unet", "49% of the matrix FLOPs in convolutions, "
                                              "with upsampling")  # fmt: skip
    # the same mix without upsampling is an encoder with a convolutional stem, not a U-Net
    assert guess_model_class(replace(latent, upsampling=False), big)[0] == "encoder"


def test_a_latent_diffusion_unet_is_guessed_a_unet():
    """MLPerf's Stable Diffusion step (U-Net at 64x64 latents): convolutions just under half
    of its matrix FLOPs; a guess from the convolutions' share alone called it an encoder."""
    model, (moments, targets), recipe = build("mlperf_sd2_moments", 1)
    step = count_meta_step(model, (moments,), {}, targets, recipe.loss, torch.float16)
    assert step.mix.conv_flops < CONV_SHARE * step.mix.matrix_flops
    assert step.model_class == "unet"


def test_kernel_launches_and_the_matmul_share_are_counted():
    layer = nn.Linear(64, 64)
    x = torch.randn(8, 64)
    count = count_step(train_step(layer, x))
    # forward addmm, sum; backward: ones_like/expand, the two gradient products, the bias's
    # sum; at least those launch kernels
    assert count.kernel_ops >= 5
    share = count.matmul_share
    assert share is not None and 0.5 < share < 1.0
    assert math.isclose(
        share, count.mix.matrix_flops / (count.mix.matrix_flops + count.mix.other_elements)
    )


def test_the_models_table_holds_the_profilers_corrected_count():
    """The non-LLM rows' flops_per_sample are the profiler's count of the model built to its
    published shape (tests/published_models.py); EfficientNet's is the corrected one, about
    a fourteenth of what torch's own formula gives its depthwise-heavy step."""
    from pathlib import Path

    from published_models import build

    from gpu2tpu.measure.flops import count_meta_step
    from gpu2tpu.pricing.published import load_published_runs

    table = Path(__file__).resolve().parents[1] / "gpu2tpu/pricing/published_runs_models.toml"
    runs = {r.model.key: r for r in load_published_runs(table)}
    assert {r.model_class for r in runs.values()} == {"cnn", "encoder", "unet"}
    for key, one_image in (("resnet50_v1_5", "cnn"), ("efficientnet_b0", "small_step")):
        model, (x, y), recipe = build(key, 1)
        count = count_meta_step(model, (x,), {}, y, recipe.loss)
        assert count.flops == pytest.approx(runs[key].flops_per_sample, rel=1e-5)
        assert count.model_class == one_image  # EfficientNet's one image is under 1e10 FLOPs
    # ResNet-50 v1.5: 4.1 GMACs forward (He et al.), three passes of 2 FLOPs a MAC
    assert runs["resnet50_v1_5"].flops_per_sample == pytest.approx(3 * 2 * 4.1e9, rel=0.02)
    assert runs["efficientnet_b0"].flops_per_sample == pytest.approx(3 * 2 * 0.39e9, rel=0.03)
