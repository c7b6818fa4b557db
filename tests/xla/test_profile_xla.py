"""The profiler on PyTorch/XLA: compile time and compilations from torch_xla's compile events."""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from gpu2tpu import profile
from gpu2tpu.backends import get_backend


def _trainer(dev: torch.device):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    ).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, opt


def test_profile_takes_compile_time_from_xla_and_sees_no_compile_in_steady_steps() -> None:
    import torch_xla.debug.metrics as met

    xla = get_backend("xla")
    dev = xla.device()
    model, opt = _trainer(dev)

    def step() -> None:
        x = torch.randn(8, 16, device=dev)
        loss = F.cross_entropy(model(x), torch.randint(0, 4, (8,), device=dev))
        loss.backward()
        opt.step()
        opt.zero_grad()

    before = met.metric_data("CompileTime") or (0, 0.0, [])
    result = profile(step, backend=xla, steps=4, warmup=3, count_flops=False, targets=())
    after = met.metric_data("CompileTime")
    # Warm-up compiled the step's graphs (AdamW's first step differs from the next one), and
    # the compile time is XLA's own figure, not the warm-up-minus-steady estimate.
    assert result.compilations_warmup >= 2
    assert result.compilations_warmup + result.compilations_timed == after[0] - before[0]
    assert result.compile_seconds_measured
    total = (after[1] - before[1]) / 1e9
    assert abs(result.compile_seconds + result.compile_seconds_timed - total) < 1e-6
    assert result.compilations_timed == 0
    details = result.details()
    assert "the runtime's compile events" in details["Warm-up"]
    assert "Recompiled in timed steps" not in details
    data = result.to_dict()
    assert data["compile_seconds_measured"] is True and data["compilations_timed"] == 0


def test_a_shape_that_changes_in_timed_steps_is_counted_and_reported() -> None:
    xla = get_backend("xla")
    dev = xla.device()
    model, opt = _trainer(dev)
    # 3 warm-up steps, then 6 timed ones; fast steps may be re-timed in groups (of 8 rows).
    sizes = itertools.chain([8] * 6, [5, 8, 3], itertools.repeat(8))

    def step() -> None:
        n = next(sizes)
        loss = F.cross_entropy(
            model(torch.randn(n, 16, device=dev)), torch.randint(0, 4, (n,), device=dev)
        )
        loss.backward()
        opt.step()
        opt.zero_grad()

    result = profile(step, backend=xla, steps=6, warmup=3, count_flops=False, targets=())
    # Batches of 5 and 3 rows came after warm-up: two new graphs, with their compile time.
    assert result.compilations_timed == 2
    assert result.compile_seconds_timed > 0
    note = result.details()["Recompiled in timed steps"]
    assert note.startswith("2 new graph(s)") and "--dry-run" in note
