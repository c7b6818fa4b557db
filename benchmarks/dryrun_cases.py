"""Small training and inference steps with known TPU hazards, and clean variants of them.

Each case builds, for a device, a `step(i)` that runs step number `i` of a loop (model and
optimizer are made once, by the builder). `benchmarks/dryrun_accuracy.py` runs every case on
PyTorch/XLA (the ground truth, read from torch_xla's metrics) and under the CPU dry run, and
scores the dry run per hazard kind; `tests/xla/test_dryrun_accuracy.py` checks the same
agreement case by case. `intended` names the hazards the case was written to have; it is a
description for the reader, never the truth the dry run is scored against.

The kinds:
- "host sync": a read of device data by Python (.item(), .tolist(), .cpu(), print, `if loss`)
- "recompile": a new graph after warm-up (new shapes, loop counts that change, baked scalars)
- "float64": float64 in a compiled graph
- "dynamic shape": an op whose output shape depends on the data (nonzero, x[mask], unique)
- "cpu fallback": an op with no XLA lowering, run on the CPU
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from dryrun_earlier import Widening, generate, read_loss, train_step

KINDS = ("host sync", "recompile", "float64", "dynamic shape", "cpu fallback")
STEPS = 6  # steps per case: WARMUP steps of warm-up, then the steps that are judged
WARMUP = 2

Step = Callable[[int], Any]


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[torch.device], Step]
    intended: frozenset[str]
    note: str = ""


CASES: list[Case] = []


def case(*intended: str, note: str = "") -> Callable[[Callable[[torch.device], Step]], Any]:
    """Register a builder as a case named after it."""
    unknown = set(intended) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown hazard kinds {sorted(unknown)}")

    def register(build: Callable[[torch.device], Step]) -> Callable[[torch.device], Step]:
        CASES.append(Case(build.__name__, build, frozenset(intended), note))
        return build

    return register


def _mlp(dev: torch.device, d_in: int = 8, d_out: int = 3) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(d_in, 16), nn.ReLU(), nn.Linear(16, d_out)).to(dev)


def _batch(dev: torch.device, n: int = 8, d_in: int = 8, classes: int = 3) -> tuple[Any, Any]:
    return torch.randn(n, d_in, device=dev), torch.randint(0, classes, (n,), device=dev)


def _trainer(dev: torch.device, opt: str = "adamw", **kw: Any) -> tuple[nn.Module, Any]:
    model = _mlp(dev)
    cls = {
        "adamw": torch.optim.AdamW,
        "adam": torch.optim.Adam,
        "sgd": torch.optim.SGD,
        "rmsprop": torch.optim.RMSprop,
        "adagrad": torch.optim.Adagrad,
    }[opt]
    lr = kw.pop("lr", 0.01)
    return model, cls(model.parameters(), lr=lr, **kw)


def _loader_steps(dev: torch.device, model: nn.Module, opt: Any, drop_last: bool) -> Step:
    """Steps over a shuffled DataLoader of 8 * STEPS - 3 rows in batches of 8: the last
    batch has 5 rows unless `drop_last` (then the loader starts again)."""
    from torch.utils.data import DataLoader, TensorDataset

    gen = torch.Generator().manual_seed(0)
    rows = 8 * STEPS - 3
    data = TensorDataset(torch.randn(rows, 8, generator=gen), torch.randint(0, 3, (rows,)))
    loader = DataLoader(data, batch_size=8, shuffle=True, drop_last=drop_last, generator=gen)
    batches = iter(())

    def step(i: int) -> Any:
        nonlocal batches
        batch = next(batches, None)
        if batch is None:
            batches = iter(loader)
            batch = next(batches)
        x, y = batch[0].to(dev), batch[1].to(dev)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


# -- clean steps ----------------------------------------------------------------------------


@case()
def clean_adamw(dev: torch.device) -> Step:
    model, opt = _trainer(dev, "adamw")

    def step(i: int) -> Any:
        x, y = _batch(dev)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


@case()
def clean_adam_foreach_off(dev: torch.device) -> Step:
    model, opt = _trainer(dev, "adam", foreach=False)

    def step(i: int) -> Any:
        x, y = _batch(dev)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


@case()
def clean_sgd_momentum(dev: torch.device) -> Step:
    model, opt = _trainer(dev, "sgd", momentum=0.9, nesterov=True)

    def step(i: int) -> Any:
        x, y = _batch(dev)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


@case()
def clean_rmsprop(dev: torch.device) -> Step:
    model, opt = _trainer(dev, "rmsprop")

    def step(i: int) -> Any:
        x, y = _batch(dev)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


@case()
def clean_adagrad(dev: torch.device) -> Step:
    model, opt = _trainer(dev, "adagrad")

    def step(i: int) -> Any:
        x, y = _batch(dev)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


@case(note="the learning rate changes every step, as a scheduler does; XLA takes it as data")
def clean_lr_schedule(dev: torch.device) -> Step:
    model, opt = _trainer(dev, "sgd", momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))

    def step(i: int) -> Any:
        x, y = _batch(dev)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        return loss

    return step


@case(note="a Python scalar that changes every step, in arithmetic: XLA takes it as data")
def clean_scalar_in_arithmetic(dev: torch.device) -> Step:
    model, opt = _trainer(dev, "sgd")

    def step(i: int) -> Any:
        x, y = _batch(dev)
        scale = 1.0 + 0.1 * i
        loss = F.cross_entropy(model(x) * scale, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


@case(note="the DataLoader's sampler calls .tolist() on CPU indices: no device read")
def clean_dataloader_sampler(dev: torch.device) -> Step:
    model, opt = _trainer(dev, "sgd", momentum=0.9)
    return _loader_steps(dev, model, opt, drop_last=True)


@case(note="torch.where with three arguments keeps the shape static")
def clean_where_instead_of_mask(dev: torch.device) -> Step:
    model = _mlp(dev)

    def step(i: int) -> Any:
        x, _ = _batch(dev)
        out = model(x)
        return torch.where(out > 0, out, torch.zeros_like(out)).sum()

    return step


@case(note="a DataLoader with drop_last=True: every batch has one shape")
def clean_drop_last(dev: torch.device) -> Step:
    model, opt = _trainer(dev, "adamw")
    return _loader_steps(dev, model, opt, drop_last=True)


@case(note="inference with max_pool2d and adaptive_avg_pool2d, both lowered")
def clean_cnn_inference(dev: torch.device) -> Step:
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, padding=1).to(dev)

    @torch.no_grad()
    def step(i: int) -> Any:
        x = torch.randn(2, 3, 8, 8, device=dev)
        h = F.max_pool2d(conv(x).relu(), 2)
        return F.adaptive_avg_pool2d(h, 1).flatten(1).softmax(-1)

    return step


# -- host syncs -----------------------------------------------------------------------------


@case("host sync")
def item_every_step(dev: torch.device) -> Step:
    model, opt = _trainer(dev, "adamw")
    history: list[float] = []

    def step(i: int) -> Any:
        x, y = _batch(dev)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        history.append(loss.item())
        return loss

    return step


@case("host sync")
def tolist_of_predictions(dev: torch.device) -> Step:
    model = _mlp(dev)

    def step(i: int) -> Any:
        x, _ = _batch(dev)
        return model(x).argmax(-1).tolist()

    return step


@case("host sync")
def print_loss_tensor(dev: torch.device) -> Step:
    model, opt = _trainer(dev, "sgd")

    def step(i: int) -> Any:
        x, y = _batch(dev)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        text = f"step {i}: {loss}"
        return text

    return step


@case("host sync")
def cpu_numpy_metrics(dev: torch.device) -> Step:
    model = _mlp(dev)

    def step(i: int) -> Any:
        x, _ = _batch(dev)
        return model(x).softmax(-1).detach().cpu().numpy().mean()

    return step


@case("host sync", note="data-dependent Python control flow: the branch reads the loss")
def branch_on_loss(dev: torch.device) -> Step:
    model, opt = _trainer(dev, "sgd")

    def step(i: int) -> Any:
        x, y = _batch(dev)
        loss = F.cross_entropy(model(x), y)
        if loss > 0.5:
            loss = loss * 2
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


@case("host sync", note="GradScaler reads found_inf on the host in step()")
def grad_scaler(dev: torch.device) -> Step:
    model, opt = _trainer(dev, "sgd")
    scaler = torch.amp.GradScaler(dev.type)

    def step(i: int) -> Any:
        x, y = _batch(dev)
        loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        return loss

    return step


@case("host sync", note="GradScaler under bfloat16 autocast: the dry run says to drop it")
def grad_scaler_bf16(dev: torch.device) -> Step:
    model, opt = _trainer(dev, "adamw")
    scaler = torch.amp.GradScaler(dev.type)

    def step(i: int) -> Any:
        x, y = _batch(dev)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        return loss

    return step


@case("host sync", note="clip_grad_norm_ with error_if_nonfinite checks the norm on the host")
def clip_grad_norm_checked(dev: torch.device) -> Step:
    model, opt = _trainer(dev, "adamw")

    def step(i: int) -> Any:
        x, y = _batch(dev)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)
        opt.step()
        opt.zero_grad()
        return loss

    return step


# -- recompilations -------------------------------------------------------------------------


@case("recompile", note="a DataLoader without drop_last: the last batch is short")
def last_short_batch(dev: torch.device) -> Step:
    model, opt = _trainer(dev, "adamw")
    return _loader_steps(dev, model, opt, drop_last=False)


@case("recompile")
def growing_batch_size(dev: torch.device) -> Step:
    model, opt = _trainer(dev, "sgd")

    def step(i: int) -> Any:
        x, y = _batch(dev, 4 + i)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


@case("recompile", note="a shape made inside the loop from the loop counter")
def shape_from_loop_counter(dev: torch.device) -> Step:
    model = _mlp(dev, d_in=4)

    def step(i: int) -> Any:
        x = torch.randn(i + 1, 4, device=dev)
        return model(x).sum()

    return step


@case("recompile", note="variable sequence lengths in a token model")
def variable_sequence_length(dev: torch.device) -> Step:
    torch.manual_seed(0)
    emb = nn.Embedding(32, 8).to(dev)
    head = nn.Linear(8, 32).to(dev)
    opt = torch.optim.AdamW([*emb.parameters(), *head.parameters()], lr=0.01)

    def step(i: int) -> Any:
        tokens = torch.randint(0, 32, (2, 6 + 2 * i), device=dev)
        logits = head(emb(tokens[:, :-1]))
        loss = F.cross_entropy(logits.reshape(-1, 32), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


@case("recompile", note="a Python loop whose count changes every step unrolls differently")
def loop_count_changes(dev: torch.device) -> Step:
    model, opt = _trainer(dev, "sgd")

    def step(i: int) -> Any:
        x, y = _batch(dev)
        h = model(x)
        for _ in range(i % 3 + 1):
            h = h.tanh()
        loss = F.cross_entropy(h, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


@case("recompile", note="a changing Python exponent: pow's backward bakes it into the graph")
def changing_exponent(dev: torch.device) -> Step:
    model, opt = _trainer(dev, "sgd")

    def step(i: int) -> Any:
        x, y = _batch(dev)
        p = 1.5 + 0.1 * i
        loss = F.cross_entropy(model(x), y) ** p
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


# -- code in earlier cells, and loops with a backward pass (issue 28) ------------------------


@case("recompile", note="the step calls a train_step an earlier cell defined; batch sizes vary")
def earlier_cell_train_step_sizes(dev: torch.device) -> Step:
    model, opt = _trainer(dev, "sgd")
    batches = [_batch(dev, n) for n in (8, 8, 7, 6, 5, 4)]

    def step(i: int) -> Any:
        return train_step(model, opt, *batches[i])

    return step


@case(note="the same train_step from an earlier cell, one batch size: nothing to report")
def clean_earlier_cell_train_step(dev: torch.device) -> Step:
    model, opt = _trainer(dev, "adamw")
    batches = [_batch(dev) for _ in range(STEPS)]

    def step(i: int) -> Any:
        return train_step(model, opt, *batches[i])

    return step


@case("recompile", note="an earlier cell's generate(), one token more every third step")
def earlier_cell_generate_grows(dev: torch.device) -> Step:
    torch.manual_seed(0)
    lm = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16)).to(dev)
    prompt = torch.randint(0, 16, (2, 3), device=dev)

    @torch.no_grad()
    def step(i: int) -> Any:
        return generate(lm, prompt, 2 + i % 3)

    return step


@case("recompile", note="forward and backward on a new batch size each step, no optimizer step")
def backward_only_varying_batch(dev: torch.device) -> Step:
    model = _mlp(dev)

    def step(i: int) -> Any:
        return model(torch.randn(4 + i, 8, device=dev)).sum().backward()

    return step


@case(note="forward and backward on one batch size, no optimizer step: one graph a step")
def clean_backward_only(dev: torch.device) -> Step:
    model = _mlp(dev)

    def step(i: int) -> Any:
        return model(torch.randn(8, 8, device=dev)).sum().backward()

    return step


@case("host sync", note="a logging helper from an earlier cell reads the loss")
def earlier_cell_reads_loss(dev: torch.device) -> Step:
    model, opt = _trainer(dev, "sgd")

    def step(i: int) -> Any:
        return read_loss(train_step(model, opt, *_batch(dev)))

    return step


@case(note="layers of different widths in a Python loop inside forward: one graph a step")
def clean_widening_layers_loop(dev: torch.device) -> Step:
    torch.manual_seed(0)
    model = Widening().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [_batch(dev) for _ in range(STEPS)]

    def step(i: int) -> Any:
        return train_step(model, opt, *batches[i])

    return step


@case(note="AdamW without foreach reads its CPU step counters with .item() each step")
def clean_adamw_single_tensor(dev: torch.device) -> Step:
    model, opt = _trainer(dev, "adamw", foreach=False)

    def step(i: int) -> Any:
        x, y = _batch(dev)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


# -- float64 --------------------------------------------------------------------------------


@case("float64", note="numpy arrays are float64; torch.from_numpy keeps the dtype")
def float64_from_numpy(dev: torch.device) -> Step:
    import numpy as np

    model = _mlp(dev).double()
    rng = np.random.default_rng(0)

    def step(i: int) -> Any:
        x = torch.from_numpy(rng.standard_normal((8, 8))).to(dev)
        return model(x).sum()

    return step


@case("float64", note="a float64 accumulator for per-class scores")
def float64_metric(dev: torch.device) -> Step:
    model = _mlp(dev)
    total = torch.zeros(3, dtype=torch.float64, device=dev)

    def step(i: int) -> Any:
        nonlocal total
        x, _ = _batch(dev)
        total = total + model(x).detach().sum(0).double()
        return total

    return step


# -- data-dependent shapes ------------------------------------------------------------------


@case("dynamic shape")
def boolean_mask_loss(dev: torch.device) -> Step:
    model, opt = _trainer(dev, "sgd")

    def step(i: int) -> Any:
        x, y = _batch(dev)
        out = model(x)
        keep = y != 0
        loss = F.cross_entropy(out[keep], y[keep])
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


@case("dynamic shape")
def nonzero_indices(dev: torch.device) -> Step:
    model = _mlp(dev)

    def step(i: int) -> Any:
        out = model(torch.randn(8, 8, device=dev))
        idx = torch.nonzero(out > 0)
        return idx.float().mean()

    return step


@case("dynamic shape")
def unique_labels(dev: torch.device) -> Step:
    def step(i: int) -> Any:
        y = torch.randint(0, 5, (16,), device=dev)
        return torch.unique(y).float().sum()

    return step


@case("dynamic shape")
def masked_select_values(dev: torch.device) -> Step:
    model = _mlp(dev)

    def step(i: int) -> Any:
        out = model(torch.randn(8, 8, device=dev))
        return torch.masked_select(out, out > 0).sum()

    return step


# -- ops without a lowering -----------------------------------------------------------------


@case("cpu fallback")
def fractional_max_pool(dev: torch.device) -> Step:
    torch.manual_seed(0)
    conv = nn.Conv2d(1, 2, 3, padding=1).to(dev)

    def step(i: int) -> Any:
        x = torch.randn(2, 1, 8, 8, device=dev)
        return F.fractional_max_pool2d(conv(x), 2, output_size=(4, 4)).sum()

    return step


@case("cpu fallback")
def bincount_histogram(dev: torch.device) -> Step:
    def step(i: int) -> Any:
        y = torch.randint(0, 4, (32,), device=dev)
        return torch.bincount(y, minlength=4).float().sum()

    return step


@case("cpu fallback")
def embedding_bag_mean(dev: torch.device) -> Step:
    torch.manual_seed(0)
    bag = nn.EmbeddingBag(16, 4, mode="mean").to(dev)

    def step(i: int) -> Any:
        return bag(torch.randint(0, 16, (4, 3), device=dev)).sum()

    return step


@case("cpu fallback")
def ctc_loss_step(dev: torch.device) -> Step:
    def step(i: int) -> Any:
        logp = torch.randn(10, 2, 5, device=dev).log_softmax(-1)
        targets = torch.randint(1, 5, (2, 4), device=dev)
        lengths = torch.full((2,), 10, dtype=torch.long, device=dev)
        target_lengths = torch.full((2,), 4, dtype=torch.long, device=dev)
        return F.ctc_loss(logp, targets, lengths, target_lengths)

    return step
