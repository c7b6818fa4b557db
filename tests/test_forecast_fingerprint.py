"""The quick cache key: the same forecast gets the same key, any change that alters the
compiled program gets another. Pure torch, no JAX: the key is what lets a forecast asked
again answer without starting JAX."""

from __future__ import annotations

import functools
import types

import torch
from torch import nn

from gpu2tpu.forecasting.fingerprint import recipe_key

SOURCE = """
import torch
from torch import nn
from torch.nn import functional as F

SCALE = {scale}

def helper(x):
    return x * SCALE{helper_extra}

class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.heads = {heads}
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return helper(F.gelu(self.fc(x))){forward_extra}

class Net(nn.Module):
    def __init__(self, d=16, layers=2):
        super().__init__()
        self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
        self.head = nn.Linear(d, 4)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)
"""


def build(**changes):
    """A user module (as a notebook or script defines it), built from SOURCE with changes."""
    fields = {"scale": "2.0", "helper_extra": "", "heads": "4", "forward_extra": ""}
    fields.update(changes)
    module = types.ModuleType("user_model")
    exec(compile(SOURCE.format(**fields), "<user_model>", "exec"), module.__dict__)
    torch.manual_seed(0)
    return module


def key(module, layers=2, batch=None, loss=None, settings=None, **kwargs):
    model = module.Net(layers=layers, **kwargs)
    batch = batch if batch is not None else (torch.randn(8, 16), torch.randint(0, 4, (8,)))
    return recipe_key(model, batch, loss, settings or {"target": "v5e"})


def test_the_same_forecast_has_the_same_key_across_instances():
    assert key(build()) == key(build())
    first, second = build(), build()
    torch.manual_seed(1)
    assert key(first) == key(second)  # weights' values are not part of the program


def test_changes_to_the_program_change_the_key():
    base = key(build())
    changed = {
        "code of forward": key(build(forward_extra=" + 1")),
        "a helper the forward calls": key(build(helper_extra=" - x")),
        "a global constant the helper reads": key(build(scale="3.0")),
        "a plain attribute": key(build(heads="8")),
        "depth": key(build(), layers=3),
        "width": key(build(), d=32),
        "batch shape": key(build(), batch=(torch.randn(16, 16), torch.randint(0, 4, (16,)))),
        "batch dtype": key(build(), batch=(torch.randn(8, 16).double(), torch.randint(0, 4, (8,)))),
        "loss": key(build(), loss=nn.functional.mse_loss),
        "settings": key(build(), settings={"target": "v6e"}),
    }
    assert all(k != base for k in changed.values()), [n for n, k in changed.items() if k == base]
    assert len(set(changed.values())) == len(changed)


def test_frozen_and_tied_parameters_are_part_of_the_key():
    module = build()
    model = module.Net()
    batch = (torch.randn(8, 16), torch.randint(0, 4, (8,)))
    base = recipe_key(model, batch, None, {})
    model.head.weight.requires_grad_(False)
    frozen = recipe_key(model, batch, None, {})
    model.head.weight.requires_grad_(True)
    model.blocks[1].fc.weight = model.blocks[0].fc.weight  # tied
    tied = recipe_key(model, batch, None, {})
    assert len({base, frozen, tied}) == 3


def test_losses_by_code_partials_and_modules():
    module = build()
    batch = (torch.randn(8, 16), torch.randint(0, 4, (8,)))

    def ce(out, y):
        return nn.functional.cross_entropy(out, y)

    def ce_smooth(out, y):
        return nn.functional.cross_entropy(out, y, label_smoothing=0.1)

    keys = {
        recipe_key(module.Net(), batch, loss, {})
        for loss in (
            ce,
            ce_smooth,
            functools.partial(nn.functional.cross_entropy, label_smoothing=0.1),
            functools.partial(nn.functional.cross_entropy, label_smoothing=0.2),
            nn.CrossEntropyLoss(),
            nn.CrossEntropyLoss(label_smoothing=0.1),
        )
    }
    assert len(keys) == 6


def test_a_large_model_keys_in_milliseconds():
    import time

    with torch.device("meta"):
        model = nn.Sequential(*[nn.TransformerEncoderLayer(1024, 16) for _ in range(48)])
    batch = (torch.empty(8, 512, 1024, device="meta"), torch.empty(8, 512, 1024, device="meta"))
    started = time.perf_counter()
    first = recipe_key(model, batch, None, {})
    elapsed = time.perf_counter() - started
    assert first == recipe_key(model, batch, None, {})
    print(f"key of a 48-layer model in {elapsed * 1000:.0f} ms")  # shown with -s; no threshold
