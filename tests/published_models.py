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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

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
        scores = q @ k.transpose(-1, -2) / math.sqrt(width // self.heads)
        context = self.dropout(scores.softmax(-1)) @ v
        return self.out(context.transpose(1, 2).reshape(b, s, width))


class FusedSelfAttention(SelfAttention):
    """Attention in one fused kernel (NVIDIA's FMHA, FlashAttention, XLA's fusion: what the
    MLPerf BERT entries run): the scores never reach memory. Written with the CPU flash
    kernel's aten op, which runs on the meta device with its backward (SDPA itself falls
    back to the score-holding formula there)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, width = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        context = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.1)[0]
        return self.out(context.transpose(1, 2).reshape(b, s, width))


class EncoderLayer(nn.Module):
    def __init__(self, width: int, heads: int, ffn: int, fused: bool = False) -> None:
        super().__init__()
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
    next-sentence prediction) or "squad" (start and end logits)."""

    def __init__(self, head: str, predictions: int = 0, layers: int = 24, width: int = 1024,
                 heads: int = 16, ffn: int = 4096, vocab: int = 30522,
                 fused: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.head, self.predictions = head, predictions
        self.words = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(512, width)
        self.types = nn.Embedding(2, width)
        self.norm = nn.LayerNorm(width)
        self.layers = nn.ModuleList(EncoderLayer(width, heads, ffn, fused) for _ in range(layers))
        if head == "pretraining":
            self.transform = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.LayerNorm(width))
            self.decoder = nn.Linear(width, vocab)
            self.pooler = nn.Linear(width, width)
            self.nsp = nn.Linear(width, 2)
        else:
            self.qa = nn.Linear(width, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, s = ids.shape
        x = self.words(ids) + self.positions.weight[:s] + self.types.weight[0]
        x = self.norm(x)
        for layer in self.layers:
            x = layer(x)
        if self.head == "squad":
            return self.qa(x)
        masked = x[:, : self.predictions].reshape(-1, x.shape[-1])  # the masked positions
        words = self.decoder(self.transform(masked))
        nsp = self.nsp(torch.tanh(self.pooler(x[:, 0])))
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


# -- the table's models --------------------------------------------------------------------------


@dataclass(frozen=True)
class Recipe:
    """One published model: how to build it and one step's batch."""

    build: Callable[[], nn.Module]
    inputs: Callable[[int], tuple[torch.Tensor, ...]]
    loss: Callable[[Any, Any], Any]
    what: str


def _images(size: int) -> Callable[[int], tuple[torch.Tensor, ...]]:
    return lambda b: (
        torch.empty(b, 3, size, size, device="meta"),
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
    "resnet50_v1_5": Recipe(lambda: ResNet((3, 4, 6, 3)), _images(224), _classify, "224x224"),
    "resnext101_32x4d": Recipe(
        lambda: ResNet((3, 4, 23, 3), 32, 4), _images(224), _classify, "224x224"
    ),
    "se_resnext101_32x4d": Recipe(
        lambda: ResNet((3, 4, 23, 3), 32, 4, se=True), _images(224), _classify, "224x224"
    ),
    "efficientnet_b0": Recipe(lambda: EfficientNet(1.0, 1.0), _images(224), _classify, "224"),
    "efficientnet_b4": Recipe(lambda: EfficientNet(1.4, 1.8), _images(380), _classify, "380"),
    "efficientnet_b4_320": Recipe(lambda: EfficientNet(1.4, 1.8), _images(320), _classify, "320"),
    "vit_base_patch16_224": Recipe(VisionTransformer, _images(224), _classify, "224x224"),
    "bert_large_pretrain_128": Recipe(
        lambda: Bert("pretraining", 20), _tokens(128), _pretraining(30522, 20), "seq 128"
    ),
    "bert_large_pretrain_512": Recipe(
        lambda: Bert("pretraining", 80), _tokens(512), _pretraining(30522, 80), "seq 512"
    ),
    "bert_large_mlperf_512": Recipe(
        lambda: Bert("pretraining", 76, fused=True),
        _tokens(512),
        _pretraining(30522, 76),
        "seq 512, fused attention",
    ),
    "bert_large_squad_384": Recipe(lambda: Bert("squad"), _tokens(384), _squad, "seq 384"),
    "nnunet_3d_brats": Recipe(
        lambda: UNet(4, 4, (32, 64, 128, 256, 320, 320), 3),
        _volumes(4, (128, 128, 128), 4),
        _segment,
        "128^3",
    ),
    "nnunet_2d_brats": Recipe(
        lambda: UNet(4, 4, (32, 64, 128, 256, 512, 512), 2),
        _volumes(4, (192, 160), 4),
        _segment,
        "192x160",
    ),
    "mlperf_unet3d": Recipe(
        lambda: UNet(1, 3, (32, 64, 128, 256, 320, 320), 3),
        _volumes(1, (128, 128, 128), 3),
        _segment,
        "128^3",
    ),
}


def build(key: str, batch: int) -> tuple[nn.Module, tuple[torch.Tensor, ...], Recipe]:
    """The model of `key` on the meta device, one step's (inputs, targets), and its recipe."""
    recipe = RECIPES[key]
    with torch.device("meta"):
        model = recipe.build()
    return model, recipe.inputs(batch), recipe
