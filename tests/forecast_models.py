"""Models the forecast's FLOP tests compile, and the analytic count they are checked against.

`Llama` is the benchmark's 8B model (benchmarks/forecast_llama.py imports it) at any
size (`LLAMA3_8B` is the full shape): RMSNorm, rotary positions, grouped-query attention through
`F.scaled_dot_product_attention(..., is_causal=True)`, a SwiGLU MLP and an untied LM head.
`analytic_step_flops` is the formula docs/forecast.md states ("FLOPs you can trust").
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype) * self.weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int, theta: float = 10000.0) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, d // heads
        self.theta = theta
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        hd = self.head_dim
        q = self.q_proj(x).view(b, t, self.heads, hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, hd).transpose(1, 2)
        inv = 1.0 / self.theta ** (torch.arange(0, hd, 2, device=x.device).float() / hd)
        angles = torch.outer(torch.arange(t, device=x.device).float(), inv)
        cos = torch.cat((angles, angles), dim=-1).cos().to(x.dtype)
        sin = torch.cat((angles, angles), dim=-1).sin().to(x.dtype)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        repeat = self.heads // self.kv_heads
        k = k[:, :, None].expand(b, self.kv_heads, repeat, t, hd).reshape(b, self.heads, t, hd)
        v = v[:, :, None].expand(b, self.kv_heads, repeat, t, hd).reshape(b, self.heads, t, hd)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.heads * hd))


class DecoderLayer(nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int, hidden: int, theta: float) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(d)
        self.self_attn = Attention(d, heads, kv_heads, theta)
        self.post_attention_layernorm = RMSNorm(d)
        self.gate_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(
        self,
        layers: int = 2,
        d: int = 512,
        heads: int = 8,
        kv_heads: int = 4,
        hidden: int = 1536,
        vocab: int = 8192,
        theta: float = 10000.0,
    ) -> None:
        super().__init__()
        self.shape = {"layers": layers, "d": d, "heads": heads, "kv_heads": kv_heads}
        self.shape.update(hidden=hidden, vocab=vocab)
        self.embed_tokens = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(
            DecoderLayer(d, heads, kv_heads, hidden, theta) for _ in range(layers)
        )
        self.norm = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


# Llama 3 8B: 32 layers, d 4096, 32 heads with 8 key/value heads, SwiGLU 14336, vocab 128256,
# rotary base 500000.
LLAMA3_8B = {"d": 4096, "heads": 32, "kv_heads": 8, "hidden": 14336, "vocab": 128256}


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def matmul_parameters(model: nn.Module) -> int:
    """Weights that multiply activations: every Linear's weight (the LM head included);
    embeddings are a lookup and norms elementwise, so neither counts."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


def analytic_step_flops(
    matmul_params: int, layers: int, attention_width: int, batch: int, seq: int, causal: bool
) -> float:
    """Training FLOPs of one step of a decoder-only transformer (docs/forecast.md).

    6 · N · tokens for the weights (forward 2, backward 4 per weight and token), plus the
    attention score and context products: forward 2 · 2 · seq² · width per layer and
    sequence, backward twice that, so 12 · layers · batch · seq² · width in all; a causal
    count keeps the lower triangle only (half). Compilers that compute the masked scores
    anyway (the reference formula) do the non-causal count's work.
    """
    attention = 12 * layers * batch * seq * seq * attention_width
    return 6 * matmul_params * batch * seq + (attention / 2 if causal else attention)
