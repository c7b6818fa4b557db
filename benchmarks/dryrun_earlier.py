"""Functions a notebook defined in earlier cells (or a local module it imports).

The cases of benchmarks/dryrun_cases.py call them from their steps, as a training cell calls
the `train_step` or `generate` an earlier cell defined. The dry run treats this file as the
user's code outside the code being dry-run, and follows calls into it: a hazard here is
reported at its own line, with the step's line that called it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F


def train_step(model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor) -> Any:
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def generate(model: nn.Module, idx: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy decoding that grows `idx` by one token per step, as a course's `generate()`."""
    for _ in range(new_tokens):
        logits = model(idx)[:, -1, :]
        nxt = logits.argmax(-1, keepdim=True)
        idx = torch.cat((idx, nxt), dim=1)
    return idx


def read_loss(loss: torch.Tensor) -> float:
    """A logging helper that reads the loss on the host."""
    value = loss.detach()
    return float(value.cpu())


class Widening(nn.Module):
    """Layers of different widths in a Python loop (as a CNN's stages): one graph a step."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 16), nn.Linear(16, 32), nn.Linear(32, 3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x).relu()
            x = x * 1.0
        return x
