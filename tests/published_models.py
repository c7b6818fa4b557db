"""The non-LLM models of the published-runs table, built to their published shapes.

torchvision is not a dependency, so the networks are written here from their papers and the
reference implementations' settings, as the published runs trained them:

- ResNet-50 v1.5 (the stride on the 3x3 convolution), ResNeXt-101 32x4d and SE-ResNeXt-101
  32x4d (squeeze-and-excitation, reduction 16): NVIDIA DeepLearningExamples'
  PyTorch/Classification/ConvNets and MLPerf's ResNet-50;
- EfficientNet-B0 and B4 (MBConv blocks: expansion, depthwise convolution,
  squeeze-and-excitation, SiLU; B4 is width 1.4, depth 1.8 at 380x380);
- BERT-large (24 layers, 1,024 wide, 16 heads, 4,096 MLP, 30,522 words), pre-training with
  the masked-LM head on the masked positions only (NVIDIA's dense sequence output: 20 of 128
  and 80 of 512 positions) and next-sentence prediction, or SQuAD's span head; attention
  written out with matmuls inside a module named `attention`, as BERT's reference code does
  (DeepLearningExamples), or in one fused kernel, as every MLPerf BERT entry runs it;
- nnU-Net's U-Net (2-D and 3-D: two conv-norm-LeakyReLU per level, strided convolutions
  down, transposed convolutions up, filters doubling from 32 up to 320 in 3-D and 512 in 2-D)
  and MLPerf's UNet3D (the same blocks, filters 32-320, one input channel, three classes);
- ViT-B/16 (timm's vit_base_patch16_224: 12 pre-norm layers, 768 wide, 12 heads, 197 tokens)
  and EfficientNet-B4 at 320x320 (timm's benchmark resolution).

`build(key, batch)` gives the model, the inputs and targets of one training step, and its loss
function; every tensor may be on the meta device (nothing is allocated).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from gpu2tpu.measure.flops import StepCount, count_meta_step
from gpu2tpu.pricing.published import PublishedRun

# -- ResNet, ResNeXt, SE-ResNeXt -----------------------------------------------------------------


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, squeezed: int, act: type[nn.Module] = nn.ReLU) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(channels, squeezed, 1)
        self.expand = nn.Conv2d(squeezed, channels, 1)
        self.act = act()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.expand(self.act(self.reduce(x.mean((2, 3), keepdim=True))))
        return x * torch.sigmoid(scale)


class Bottleneck(nn.Module):
    def __init__(
        self, inplanes: int, planes: int, stride: int, groups: int, width: int, se: bool
    ) -> None:
        super().__init__()
        out = planes * 4
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, groups=groups, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.se = SqueezeExcite(out, out // 16) if se else None
        self.down = None
        if stride != 1 or inplanes != out:
            self.down = nn.Sequential(
                nn.Conv2d(inplanes, out, 1, stride, bias=False), nn.BatchNorm2d(out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        if self.se is not None:
            y = self.se(y)
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    def __init__(
        self, layers: Sequence[int], groups: int = 1, width_per_group: int = 64, se: bool = False
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        )
        blocks: list[nn.Module] = []
        inplanes = 64
        for stage, count in enumerate(layers):
            planes = 64 * 2**stage
            width = int(planes * width_per_group / 64) * groups
            for i in range(count):
                stride = 2 if i == 0 and stage > 0 else 1
                blocks.append(Bottleneck(inplanes, planes, stride, groups, width, se))
                inplanes = planes * 4
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(inplanes, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


# -- EfficientNet --------------------------------------------------------------------------------

# (expansion, kernel, stride, output channels, repeats) of EfficientNet-B0's stages.
_B0_STAGES = (
    (1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
    (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1),
)  # fmt: skip


def _round_filters(channels: int, width: float) -> int:
    scaled = channels * width
    rounded = max(8, int(scaled + 4) // 8 * 8)
    return int(rounded + 8) if rounded < 0.9 * scaled else rounded


class MBConv(nn.Module):
    def __init__(self, cin: int, cout: int, expansion: int, kernel: int, stride: int) -> None:
        super().__init__()
        mid = cin * expansion
        layers: list[nn.Module] = []
        if expansion != 1:
            layers += [nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.SiLU()]
        layers += [
            nn.Conv2d(mid, mid, kernel, stride, kernel // 2, groups=mid, bias=False),
            nn.BatchNorm2d(mid),
            nn.SiLU(),
            SqueezeExcite(mid, max(1, cin // 4), nn.SiLU),
            nn.Conv2d(mid, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        ]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


class EfficientNet(nn.Module):
    def __init__(self, width: float, depth: float) -> None:
        super().__init__()
        stem = _round_filters(32, width)
        layers: list[nn.Module] = [
            nn.Conv2d(3, stem, 3, 2, 1, bias=False),
            nn.BatchNorm2d(stem),
            nn.SiLU(),
        ]
        cin = stem
        for expansion, kernel, stride, channels, repeats in _B0_STAGES:
            cout = _round_filters(channels, width)
            for i in range(math.ceil(repeats * depth)):
                layers.append(MBConv(cin, cout, expansion, kernel, stride if i == 0 else 1))
                cin = cout
        head = _round_filters(1280, width)
        layers += [nn.Conv2d(cin, head, 1, bias=False), nn.BatchNorm2d(head), nn.SiLU()]
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(head, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x).mean((2, 3)))


# -- BERT ------------------------------------------------------------------------------------------


class SelfAttention(nn.Module):
    """BERT's attention as its reference code writes it: scores by matmul, softmax, dropout."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, width = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        return self.out(self.context(q, k, v).transpose(1, 2).reshape(b, s, width))

    def context(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        return self.dropout(scores.softmax(-1)) @ v


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention in one fused kernel, written with the CPU flash kernel's aten op, which runs
    on the meta device with its backward (SDPA itself falls back to the score-holding
    formula there)."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.1)[0]


class FusedSelfAttention(SelfAttention):
    """Attention in one fused kernel (NVIDIA's FMHA, FlashAttention, XLA's fusion: what the
    MLPerf BERT entries run): the scores never reach memory."""

    def context(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return _flash(q, k, v)


class PackedSelfAttention(SelfAttention):
    """Attention over a packed stream: the real tokens of every sequence one after the
    other, (tokens, width), as NVIDIA's `--unpad --unpad_fmha` runs BERT; the projections run
    on the whole stream, the attention within each sequence (`groups`: (length, sequences)
    in stream order), in one fused kernel or, `fused=False`, as the reference code writes it
    (what a batch of sequences padded to one length costs: DeepLearningExamples' binned
    phase 2)."""

    def __init__(self, width: int, heads: int, groups: Sequence[tuple[int, int]],
                 fused: bool = True) -> None:  # fmt: skip
        super().__init__(width, heads)
        self.groups, self.fused = tuple(groups), fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens, width = x.shape
        parts = []
        # one split (its backward is one concatenation), not a slice a group (a zeroed
        # full-size gradient each)
        chunks = self.qkv(x).split([length * count for length, count in self.groups])
        for (length, count), chunk in zip(self.groups, chunks, strict=True):
            q, k, v = chunk.view(count, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            context = self.context(q, k, v)
            parts.append(context.transpose(1, 2).reshape(length * count, width))
        return self.out(torch.cat(parts))

    def context(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return _flash(q, k, v) if self.fused else super().context(q, k, v)


class EncoderLayer(nn.Module):
    def __init__(self, width: int, heads: int, ffn: int, fused: bool = False,
                 groups: Sequence[tuple[int, int]] = ()) -> None:  # fmt: skip
        super().__init__()
        self.attention: nn.Module
        if groups:
            self.attention = PackedSelfAttention(width, heads, groups, fused)
        else:
            self.attention = (FusedSelfAttention if fused else SelfAttention)(width, heads)
        self.norm1 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, ffn), nn.GELU(), nn.Linear(ffn, width))
        self.norm2 = nn.LayerNorm(width)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.dropout(self.attention(x)))
        return self.norm2(x + self.dropout(self.mlp(x)))


class Bert(nn.Module):
    """BERT-large; `head` is "pretraining" (masked LM on `predictions` positions a sequence,
    next-sentence prediction) or "squad" (start and end logits). With `lengths` (one a
    sequence of the batch) each sequence runs at its own length, packed into one stream with
    attention per sequence: fused (NVIDIA's unpadding) or as written (a length-binned batch)."""

    def __init__(self, head: str, predictions: int = 0, layers: int = 24, width: int = 1024,
                 heads: int = 16, ffn: int = 4096, vocab: int = 30522,
                 fused: bool = False, lengths: Sequence[int] = ()) -> None:  # fmt: skip
        super().__init__()
        self.head, self.predictions = head, predictions
        # (length, sequences) in stream order; empty for a dense batch
        self.groups = groups = sorted(Counter(lengths).items())
        self.words = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(512, width)
        self.types = nn.Embedding(2, width)
        self.norm = nn.LayerNorm(width)
        self.layers = nn.ModuleList(
            EncoderLayer(width, heads, ffn, fused, groups) for _ in range(layers)
        )
        if head == "pretraining":
            self.transform = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.LayerNorm(width))
            self.decoder = nn.Linear(width, vocab)
            self.pooler = nn.Linear(width, width)
            self.nsp = nn.Linear(width, 2)
        else:
            self.qa = nn.Linear(width, 2)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        s = ids.shape[1]
        return self.norm(self.words(ids) + self.positions.weight[:s] + self.types.weight[0])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, _ = ids.shape
        if self.groups:
            assert b == sum(n for _, n in self.groups), "one length a sequence"
            # the real tokens of every sequence, one stream: (tokens, width)
            x = torch.cat([self.embed(ids[:n, :length]).flatten(0, 1) for length, n in self.groups])
        else:
            x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        if self.head == "squad":
            return self.qa(x)
        # each sequence's first token, and its masked positions (dense sequence output: only
        # they reach the word decoder); in a stream, as many tokens of it (the same work)
        if self.groups:
            firsts, masked = x[:b], x[: b * self.predictions]
        else:
            firsts, masked = x[:, 0], x[:, : self.predictions].reshape(-1, x.shape[-1])
        words = self.decoder(self.transform(masked))
        nsp = self.nsp(torch.tanh(self.pooler(firsts)))
        return torch.cat((words.reshape(b, -1), nsp), dim=1)


class VisionTransformer(nn.Module):
    """ViT (Dosovitskiy et al. 2020) as timm builds it: 16x16 patches by a strided
    convolution, a class token, pre-norm encoder layers with the attention written out by
    matmuls in a module named `attention` (timm 0.6's), a linear head on the class token."""

    def __init__(self, layers: int = 12, width: int = 768, heads: int = 12, ffn: int = 3072,
                 image: int = 224, patch: int = 16, classes: int = 1000) -> None:  # fmt: skip
        super().__init__()
        self.patches = nn.Conv2d(3, width, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        self.positions = nn.Parameter(torch.zeros(1, (image // patch) ** 2 + 1, width))
        self.layers = nn.ModuleList(PreNormLayer(width, heads, ffn) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patches(x).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls.expand(x.shape[0], -1, -1), x), dim=1) + self.positions
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x[:, 0]))


class PreNormLayer(nn.Module):
    def __init__(self, width: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = SelfAttention(width, heads)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, ffn), nn.GELU(), nn.Linear(ffn, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


# -- U-Nets ------------------------------------------------------------------------------------------


class ConvBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, dims: int) -> None:
        super().__init__()
        conv = nn.Conv3d if dims == 3 else nn.Conv2d
        norm = nn.InstanceNorm3d if dims == 3 else nn.InstanceNorm2d
        self.body = nn.Sequential(
            conv(cin, cout, 3, stride, 1), norm(cout, affine=True), nn.LeakyReLU(0.01),
            conv(cout, cout, 3, 1, 1), norm(cout, affine=True), nn.LeakyReLU(0.01),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class UNet(nn.Module):
    """nnU-Net's U-Net: the first level at full size, each next one strided by 2."""

    def __init__(self, cin: int, classes: int, filters: Sequence[int], dims: int) -> None:
        super().__init__()
        self.down = nn.ModuleList(
            ConvBlock(cin if i == 0 else filters[i - 1], f, 1 if i == 0 else 2, dims)
            for i, f in enumerate(filters)
        )
        up = nn.ConvTranspose3d if dims == 3 else nn.ConvTranspose2d
        self.up = nn.ModuleList(
            up(filters[i + 1], filters[i], 2, 2) for i in range(len(filters) - 1)
        )
        self.merge = nn.ModuleList(
            ConvBlock(2 * filters[i], filters[i], 1, dims) for i in range(len(filters) - 1)
        )
        self.out = (nn.Conv3d if dims == 3 else nn.Conv2d)(filters[0], classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for block in self.down:
            x = block(x)
            skips.append(x)
        x = skips.pop()
        for i in reversed(range(len(self.up))):
            x = self.merge[i](torch.cat((self.up[i](x), skips.pop()), dim=1))
        return self.out(x)


# -- Stable Diffusion 2 (base): one fine-tuning step ---------------------------------------------


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fused: bool) -> torch.Tensor:
    """(b, heads, s, d) attention: one fused kernel (the XLA flash kernel the diffusers script
    enables), or the scores written out as SDPA's math path does where no flash kernel runs."""
    if fused:
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)[0]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return scores.softmax(-1) @ v


class CrossAttention(nn.Module):
    """diffusers' `Attention` (no q/k/v bias): self-attention, or attention to the text."""

    def __init__(
        self, width: int, heads: int, context: int | None = None, flash: bool = True
    ) -> None:
        super().__init__()
        self.heads = heads
        self.flash = flash
        self.flash_from = 4096  # the shortest sequence the flash kernel runs for
        self.to_q = nn.Linear(width, width, bias=False)
        self.to_k = nn.Linear(context or width, width, bias=False)
        self.to_v = nn.Linear(context or width, width, bias=False)
        self.to_out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        b, s, width = x.shape
        source = x if context is None else context

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, -1, self.heads, width // self.heads).transpose(1, 2)

        q, k, v = split(self.to_q(x)), split(self.to_k(source)), split(self.to_v(source))
        # diffusers' XLAFlashAttnProcessor2_0 runs the flash kernel where every sequence has
        # 4,096 tokens or more (self-attention at 64x64), SDPA elsewhere
        out = _attend(q, k, v, fused=self.flash and min(q.shape[2], k.shape[2]) >= self.flash_from)
        return self.to_out(out.transpose(1, 2).reshape(b, s, width))


class TransformerBlock(nn.Module):
    """Self-attention, attention to the text, GEGLU feed-forward, each pre-norm."""

    def __init__(self, width: int, heads: int, context: int) -> None:
        super().__init__()
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(width) for _ in range(3))
        self.attn1 = CrossAttention(width, heads)
        self.attn2 = CrossAttention(width, heads, context)
        self.geglu = nn.Linear(width, 8 * width)
        self.ff_out = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        x = x + self.attn1(self.norm1(x))
        x = x + self.attn2(self.norm2(x), context)
        hidden, gate = self.geglu(self.norm3(x)).chunk(2, dim=-1)
        return x + self.ff_out(hidden * F.gelu(gate))


class SpatialTransformer(nn.Module):
    """diffusers' Transformer2DModel with linear projections (SD 2), one block."""

    def __init__(self, width: int, context: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(32, width, eps=1e-6)
        self.proj_in = nn.Linear(width, width)
        self.block = TransformerBlock(width, width // 64, context)
        self.proj_out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        tokens = self.proj_in(self.norm(x).permute(0, 2, 3, 1).reshape(b, h * w, c))
        tokens = self.proj_out(self.block(tokens, context))
        return x + tokens.reshape(b, h, w, c).permute(0, 3, 1, 2)


class ResnetBlock(nn.Module):
    """diffusers' ResnetBlock2D: two GroupNorm-SiLU-conv, the time embedding added between."""

    def __init__(self, cin: int, cout: int, time: int | None, eps: float = 1e-5) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(32, cin, eps=eps)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.time = nn.Linear(time, cout) if time else None
        self.norm2 = nn.GroupNorm(32, cout, eps=eps)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x: torch.Tensor, temb: torch.Tensor | None = None) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        if self.time is not None and temb is not None:
            h = h + self.time(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return (x if self.shortcut is None else self.shortcut(x)) + h


class DiffusionUNet(nn.Module):
    """SD 2's UNet2DConditionModel: channels 320-640-1280-1280, two ResNet blocks a level
    down and three up, a transformer after each ResNet block of the first three levels and
    in the middle, attention to 1,024-wide text states."""

    def __init__(self, channels: Sequence[int] = (320, 640, 1280, 1280), context: int = 1024):
        super().__init__()
        time = 4 * channels[0]
        self.base = channels[0]
        self.time = nn.Sequential(nn.Linear(channels[0], time), nn.SiLU(), nn.Linear(time, time))
        self.conv_in = nn.Conv2d(4, channels[0], 3, padding=1)
        levels = len(channels)
        attends = [i < levels - 1 for i in range(levels)]
        self.down_res, self.down_attn, self.downsample = (
            nn.ModuleList(),
            nn.ModuleList(),
            nn.ModuleList(),
        )
        skips = [channels[0]]
        cin = channels[0]
        for i, c in enumerate(channels):
            for _ in range(2):
                self.down_res.append(ResnetBlock(cin, c, time))
                self.down_attn.append(
                    SpatialTransformer(c, context) if attends[i] else nn.Identity()
                )
                cin = c
                skips.append(c)
            if i < levels - 1:
                self.downsample.append(nn.Conv2d(c, c, 3, stride=2, padding=1))
                skips.append(c)
        self.mid = nn.ModuleList(
            [
                ResnetBlock(cin, cin, time),
                SpatialTransformer(cin, context),
                ResnetBlock(cin, cin, time),
            ]
        )
        self.up_res, self.up_attn, self.upsample = nn.ModuleList(), nn.ModuleList(), nn.ModuleList()
        for i, c in enumerate(reversed(channels)):
            level = levels - 1 - i
            for _ in range(3):
                self.up_res.append(ResnetBlock(cin + skips.pop(), c, time))
                self.up_attn.append(
                    SpatialTransformer(c, context) if attends[level] else nn.Identity()
                )
                cin = c
            if level > 0:
                self.upsample.append(nn.Conv2d(c, c, 3, padding=1))
        self.norm_out = nn.GroupNorm(32, channels[0])
        self.conv_out = nn.Conv2d(channels[0], 4, 3, padding=1)
        self.levels = levels

    def _embed(self, timesteps: torch.Tensor) -> torch.Tensor:
        half = self.base // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
        angles = timesteps.float()[:, None] * freqs[None]
        return torch.cat((angles.cos(), angles.sin()), dim=-1)

    def forward(
        self, x: torch.Tensor, timesteps: torch.Tensor, context: torch.Tensor
    ) -> torch.Tensor:
        temb = self.time(self._embed(timesteps).to(x.dtype))
        x = self.conv_in(x)
        skips = [x]
        for i in range(self.levels):
            for j in (2 * i, 2 * i + 1):
                x = self.down_res[j](x, temb)
                x = (
                    x
                    if isinstance(self.down_attn[j], nn.Identity)
                    else self.down_attn[j](x, context)
                )
                skips.append(x)
            if i < self.levels - 1:
                x = self.downsample[i](x)
                skips.append(x)
        first, attention, second = self.mid
        x = second(attention(first(x, temb), context), temb)
        for i in range(self.levels):
            for j in range(3 * i, 3 * i + 3):
                x = self.up_res[j](torch.cat((x, skips.pop()), dim=1), temb)
                x = x if isinstance(self.up_attn[j], nn.Identity) else self.up_attn[j](x, context)
            if i < self.levels - 1:
                x = self.upsample[i](F.interpolate(x, scale_factor=2.0, mode="nearest"))
        return self.conv_out(F.silu(self.norm_out(x)))


class VaeEncoder(nn.Module):
    """The encoder of SD's AutoencoderKL: 128-256-512-512 channels, two ResNet blocks a level,
    single-head attention in the middle at 64x64, mean and log-variance of 4 latents."""

    def __init__(self, channels: Sequence[int] = (128, 256, 512, 512)) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(3, channels[0], 3, padding=1)
        blocks: list[nn.Module] = []
        cin = channels[0]
        for i, c in enumerate(channels):
            blocks += [ResnetBlock(cin, c, None, 1e-6), ResnetBlock(c, c, None, 1e-6)]
            cin = c
            if i < len(channels) - 1:
                blocks.append(nn.Sequential(nn.ZeroPad2d((0, 1, 0, 1)), nn.Conv2d(c, c, 3, 2)))
        self.down = nn.Sequential(*blocks)
        self.mid1 = ResnetBlock(cin, cin, None, 1e-6)
        self.attn_norm = nn.GroupNorm(32, cin, eps=1e-6)
        self.attn = CrossAttention(cin, 1, flash=False)  # the script enables flash on the U-Net
        for proj in (self.attn.to_q, self.attn.to_k, self.attn.to_v):
            proj.bias = nn.Parameter(torch.zeros(cin))
        self.mid2 = ResnetBlock(cin, cin, None, 1e-6)
        self.norm_out = nn.GroupNorm(32, cin, eps=1e-6)
        self.conv_out = nn.Conv2d(cin, 8, 3, padding=1)
        self.quant = nn.Conv2d(8, 8, 1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.mid1(self.down(self.conv_in(images)))
        b, c, h, w = x.shape
        tokens = self.attn_norm(x).flatten(2).transpose(1, 2)
        x = x + self.attn(tokens).transpose(1, 2).reshape(b, c, h, w)
        moments = self.quant(self.conv_out(F.silu(self.norm_out(self.mid2(x)))))
        mean, logvar = moments.chunk(2, dim=1)  # latent_dist.sample(), scaled
        return (mean + torch.exp(0.5 * logvar) * torch.randn_like(mean)) * 0.18215


class TextEncoder(nn.Module):
    """SD 2's text encoder: OpenCLIP ViT-H/14's text tower less its last layer (23 pre-norm
    layers, 1,024 wide, 16 heads, causal, 77 tokens)."""

    def __init__(self, layers: int = 23, width: int = 1024, vocab: int = 49408) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Parameter(torch.zeros(77, width))
        self.layers = nn.ModuleList(
            PreNormLayer(width, width // 64, 4 * width) for _ in range(layers)
        )
        self.norm = nn.LayerNorm(width)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class StableDiffusionStep(nn.Module):
    """What the diffusers PyTorch/XLA script does a step: the frozen VAE encodes the images
    and the frozen text encoder the captions (forward only), the U-Net predicts the noise
    added to the latents (epsilon), trained on the mean squared error."""

    def __init__(self) -> None:
        super().__init__()
        self.vae = VaeEncoder().requires_grad_(False)
        self.text = TextEncoder().requires_grad_(False)
        self.unet = DiffusionUNet()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        b = images.shape[0]
        with torch.no_grad():
            latents = self.vae(images)
            context = self.text(torch.zeros(b, 77, dtype=torch.long))
        noise = torch.randn_like(latents)
        timesteps = torch.zeros(b, dtype=torch.long)
        noisy = latents * 0.9 + noise * 0.4  # the scheduler's add_noise
        return self.unet(noisy, timesteps, context) - noise


class StableDiffusionLatentStep(nn.Module):
    """MLPerf Training v3.1's Stable Diffusion step (NVIDIA's NeMo implementation): the images
    come as the VAE's moments, encoded before training (`first_stage_key: images_moments`), so
    a step samples the latents from them, runs the frozen text encoder forward and trains the
    U-Net, with flash attention on every attention of the U-Net (`FLASH_ATTENTION=True`)."""

    def __init__(self) -> None:
        super().__init__()
        self.text = TextEncoder().requires_grad_(False)
        self.unet = DiffusionUNet()
        for module in self.unet.modules():
            if isinstance(module, CrossAttention):
                module.flash_from = 0

    def forward(self, moments: torch.Tensor) -> torch.Tensor:
        b = moments.shape[0]
        with torch.no_grad():
            mean, logvar = moments.chunk(2, dim=1)
            latents = (mean + torch.exp(0.5 * logvar) * torch.randn_like(mean)) * 0.18215
            context = self.text(torch.zeros(b, 77, dtype=torch.long))
        noise = torch.randn_like(latents)
        timesteps = torch.zeros(b, dtype=torch.long)
        noisy = latents * 0.9 + noise * 0.4  # the scheduler's q_sample
        return self.unet(noisy, timesteps, context) - noise


def _denoising(out: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
    return out.float().pow(2).mean()


# -- the table's models --------------------------------------------------------------------------


# MLPerf BERT's training sequences are mostly shorter than 512 tokens. The lengths of one
# batch, as the (k + 1/2)/n quantiles of the Wikipedia phase-2 length histogram
# (graphcore/tutorials blogs_code/packedBERT/histograms.py
# @e9dbe4825f034a47871c4db0deb86d727cbd69b9, 16,279,552 sequences; its README @4b67f8f22a5b
# states the packing speed-up limit 2.0013, i.e. a mean length of 255.8): for 56 and for 48
# sequences. Mean 255.8 and 255.6 tokens; mean square 0.377 x 512^2 (docs/forecast.md).
WIKIPEDIA_LENGTHS_56 = (
    21, 30, 35, 39, 43, 47, 51, 55, 59, 63, 67, 72, 76, 81, 87, 92, 98, 105, 112, 119, 127, 135,
    144, 154, 164, 174, 186, 198, 210, 224, 238, 253, 269, 286, 305, 324, 345, 366, 390, 415, 441,
    469, 500, *[512] * 13,
)  # fmt: skip
WIKIPEDIA_LENGTHS_48 = (
    22, 31, 37, 42, 46, 51, 55, 60, 65, 70, 75, 81, 87, 94, 101, 109, 117, 126, 136, 147, 158, 170,
    183, 197, 211, 227, 244, 262, 282, 303, 326, 350, 376, 404, 434, 467, 502, *[512] * 11,
)  # fmt: skip
# The same quantiles for 32 and 16 sequences (DeepLearningExamples' phase-2 batches a GPU).
WIKIPEDIA_LENGTHS_32 = (
    25, 35, 43, 50, 57, 64, 71, 79, 89, 99, 111, 124, 139, 155, 173, 193, 215, 240, 267, 298, 332,
    369, 411, 459, 511, *[512] * 7,
)  # fmt: skip
WIKIPEDIA_LENGTHS_16 = (31, 46, 60, 75, 94, 117, 147, 183, 227, 282, 350, 434, *[512] * 4)
WIKIPEDIA_LENGTHS = {
    len(lengths): lengths
    for lengths in (
        WIKIPEDIA_LENGTHS_16,
        WIKIPEDIA_LENGTHS_32,
        WIKIPEDIA_LENGTHS_48,
        WIKIPEDIA_LENGTHS_56,
    )
}
# Google's MLPerf v1.0 BERT pads each sequence to its bucket (--seq_len_buckets 128, 256, 512).
SEQUENCE_BUCKETS = (128, 256, 512)
# DeepLearningExamples' phase 2 (LDDL, --bin-size 64) draws each batch from one bin of
# sequences whose lengths round up to the same multiple of 64, and pads to it: over many
# batches the work a sequence is that of its length rounded up to 64.
BINS_OF_64 = tuple(range(64, 513, 64))


def bucketed(lengths: Sequence[int], buckets: Sequence[int] = SEQUENCE_BUCKETS) -> tuple[int, ...]:
    return tuple(min(b for b in buckets if b >= length) for length in lengths)


@dataclass(frozen=True)
class Recipe:
    """One published model: how to build it and one step's batch."""

    # the model for a step of this many samples a chip (only the models that run each
    # sequence at its own length need the number: one length a sequence)
    build: Callable[[int], nn.Module]
    inputs: Callable[[int], tuple[torch.Tensor, ...]]
    loss: Callable[[Any, Any], Any]
    what: str


def _images(size: int) -> Callable[[int], tuple[torch.Tensor, ...]]:
    return lambda b: (
        torch.empty(b, 3, size, size, device="meta"),
        torch.empty(b, dtype=torch.long, device="meta"),
    )


def _latent_moments(size: int) -> Callable[[int], tuple[torch.Tensor, ...]]:
    """The VAE's mean and log-variance of 4 latent channels each, as a step reads them."""
    return lambda b: (
        torch.empty(b, 8, size, size, device="meta"),
        torch.empty(b, dtype=torch.long, device="meta"),
    )


def _volumes(channels: int, shape: Sequence[int], classes: int) -> Callable[[int], Any]:
    return lambda b: (
        torch.empty(b, channels, *shape, device="meta"),
        torch.empty(b, *shape, dtype=torch.long, device="meta"),
    )


def _tokens(sequence: int) -> Callable[[int], tuple[torch.Tensor, ...]]:
    return lambda b: (
        torch.empty(b, sequence, dtype=torch.long, device="meta"),
        torch.empty(b, dtype=torch.long, device="meta"),
    )


def _classify(out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.float(), labels)


def _segment(out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.float(), labels)


def _pretraining(vocab: int, predictions: int) -> Callable[[Any, Any], Any]:
    def loss(out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        b = out.shape[0]
        words = out[:, :-2].reshape(b * predictions, vocab).float()
        return F.cross_entropy(words, labels.repeat_interleave(predictions)) + F.cross_entropy(
            out[:, -2:].float(), labels % 2
        )

    return loss


def _squad(out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out[..., 0].float(), labels) + F.cross_entropy(
        out[..., 1].float(), labels
    )


RECIPES: dict[str, Recipe] = {
    "resnet50_v1_5": Recipe(lambda _: ResNet((3, 4, 6, 3)), _images(224), _classify, "224x224"),
    "resnext101_32x4d": Recipe(
        lambda _: ResNet((3, 4, 23, 3), 32, 4), _images(224), _classify, "224x224"
    ),
    "se_resnext101_32x4d": Recipe(
        lambda _: ResNet((3, 4, 23, 3), 32, 4, se=True), _images(224), _classify, "224x224"
    ),
    "efficientnet_b0": Recipe(lambda _: EfficientNet(1.0, 1.0), _images(224), _classify, "224"),
    "efficientnet_b4": Recipe(lambda _: EfficientNet(1.4, 1.8), _images(380), _classify, "380"),
    "efficientnet_b4_320": Recipe(lambda _: EfficientNet(1.4, 1.8), _images(320), _classify, "320"),
    "vit_base_patch16_224": Recipe(
        lambda _: VisionTransformer(), _images(224), _classify, "224x224"
    ),
    "bert_large_pretrain_128": Recipe(
        lambda _: Bert("pretraining", 20), _tokens(128), _pretraining(30522, 20), "seq 128"
    ),
    "bert_large_pretrain_512": Recipe(
        lambda _: Bert("pretraining", 80), _tokens(512), _pretraining(30522, 80), "seq 512"
    ),
    "bert_large_mlperf_512": Recipe(
        lambda _: Bert("pretraining", 76, fused=True),
        _tokens(512),
        _pretraining(30522, 76),
        "seq 512, fused attention",
    ),
    "bert_large_mlperf_unpadded": Recipe(
        lambda b: Bert("pretraining", 76, fused=True, lengths=WIKIPEDIA_LENGTHS[b]),
        _tokens(512),
        _pretraining(30522, 76),
        "56 sequences at their own lengths (unpadded), fused attention a sequence",
    ),
    "bert_large_mlperf_buckets": Recipe(
        lambda b: Bert("pretraining", 76, fused=True, lengths=bucketed(WIKIPEDIA_LENGTHS[b])),
        _tokens(512),
        _pretraining(30522, 76),
        "48 sequences each padded to its bucket (128, 256, 512), fused attention",
    ),
    # 15% of a sequence's real tokens are masked (38.4 on average), and only they reach the
    # word decoder (DeepLearningExamples' dense sequence output)
    "bert_large_pretrain_512_binned": Recipe(
        lambda b: Bert("pretraining", 38, lengths=bucketed(WIKIPEDIA_LENGTHS[b], BINS_OF_64)),
        _tokens(512),
        _pretraining(30522, 38),
        "sequences padded to their length rounded up to 64 (LDDL's bins), attention as written",
    ),
    "bert_large_squad_384": Recipe(lambda _: Bert("squad"), _tokens(384), _squad, "seq 384"),
    "nnunet_3d_brats": Recipe(
        lambda _: UNet(4, 4, (32, 64, 128, 256, 320, 320), 3),
        _volumes(4, (128, 128, 128), 4),
        _segment,
        "128^3",
    ),
    "nnunet_2d_brats": Recipe(
        lambda _: UNet(4, 4, (32, 64, 128, 256, 512, 512), 2),
        _volumes(4, (192, 160), 4),
        _segment,
        "192x160",
    ),
    "sd2_base_unet_512": Recipe(
        lambda _: StableDiffusionStep(),
        _images(512),
        _denoising,
        "512x512, VAE and text encoder forward",
    ),
    "mlperf_sd2_moments": Recipe(
        lambda _: StableDiffusionLatentStep(),
        _latent_moments(64),
        _denoising,
        "64x64 latents from the VAE's moments, text encoder forward",
    ),
    "mlperf_unet3d": Recipe(
        lambda _: UNet(1, 3, (32, 64, 128, 256, 320, 320), 3),
        _volumes(1, (128, 128, 128), 3),
        _segment,
        "128^3",
    ),
}


def build(
    key: str, batch: int, memory_format: str = "channels_first"
) -> tuple[nn.Module, tuple[torch.Tensor, ...], Recipe]:
    """The model of `key` on the meta device, one step's (inputs, targets), and its recipe;
    with `memory_format="channels_last"` its weights and image inputs laid out so, as
    `model.to(memory_format=torch.channels_last)` and the input's `.contiguous(...)` do."""
    recipe = RECIPES[key]
    with torch.device("meta"):
        model = recipe.build(batch)
    inputs, targets = recipe.inputs(batch)
    if memory_format == "channels_last" and inputs.dim() in (4, 5):
        layout = torch.channels_last if inputs.dim() == 4 else torch.channels_last_3d
        model = model.to(memory_format=layout)
        inputs = inputs.contiguous(memory_format=layout)
    return model, (inputs, targets), recipe


# The dtype a published run's precision computes its products in (TF32 and fp32: float32).
PRECISION_DTYPES = {
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "tf32": torch.float32,
    "fp32": torch.float32,
}


def count_run(run: PublishedRun) -> tuple[StepCount, int]:
    """One training step of the run's model at its batch a chip (at least one sample),
    counted on the meta device as the profiler counts it; the batch counted."""
    batch = max(1, math.ceil(run.per_device_batch))
    model, (inputs, targets), recipe = build(run.model.key, batch, run.memory_format)
    step = count_meta_step(
        model, (inputs,), {}, targets, recipe.loss, PRECISION_DTYPES[run.precision]
    )
    return step, batch
