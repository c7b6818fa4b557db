"""Host syncs, one classification (gpu2tpu/measure/syncs.py), against PyTorch/XLA's own count.

Each read of device data by the host is one device-to-host transfer on PyTorch/XLA
(`TransferFromDeviceTime` grows by one). The same training step is counted four ways: by
torch_xla, by the profiler on XLA (the tensors' devices decide), by the profiler on the CPU
and by the dry run (both standing in for a TPU). AdamW's step counters are CPU tensors on
XLA too: no transfer, and none of the three counts them.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gpu2tpu import profile
from gpu2tpu.backends import get_backend
from gpu2tpu.readiness.dryrun import HazardKind, dry_run

# What each step reads on the host, and how many reads that is.
READS = {
    "nothing": 0,
    "item": 1,
    "tolist": 1,
    "cpu": 1,
    "print": 1,
    "branch": 1,
    "twice": 2,
    "cpu_item": 1,
    "cpu_numpy": 1,
    "cpu_then_again": 2,
    "cpu_apart": 2,
}


def _step(dev: torch.device, reads: str):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).to(
        dev
    )
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)

    def step() -> object:
        x = torch.randn(8, 8, device=dev)
        y = torch.randint(0, 3, (8,), device=dev)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if reads == "item":
            return loss.item()
        if reads == "tolist":
            return model(x).argmax(-1).tolist()
        if reads == "cpu":
            return model(x).detach().cpu()
        if reads == "print":
            return f"{loss}"
        if reads == "branch":
            return bool(loss > 0.5)
        if reads == "twice":
            return loss.item() + loss.item()
        if reads == "cpu_item":  # one transfer; the item reads the host copy
            return float(loss.detach().cpu())
        if reads == "cpu_numpy":
            return loss.detach().cpu().numpy()
        if reads == "cpu_then_again":  # the copy, then the device tensor again
            return float(loss.detach().cpu()) + loss.item()
        if reads == "cpu_apart":  # a copy dropped, then the device tensor read on its own line
            loss.cpu()
            return loss.item()
        return loss

    return step


def _transfers() -> int:
    import torch_xla.debug.metrics as met

    data = met.metric_data("TransferFromDeviceTime")
    return int(data[0]) if data else 0


@pytest.mark.parametrize("reads", list(READS))
def test_the_profiler_and_the_dry_run_count_what_xla_transfers(reads: str) -> None:
    import torch_xla

    xla = get_backend("xla")
    step = _step(xla.device(), reads)
    for _ in range(2):  # warm-up: AdamW creates its state
        step()
        torch_xla.sync()
    before = _transfers()
    step()
    torch_xla.sync()
    per_step = _transfers() - before
    assert per_step == READS[reads]

    on_xla = profile(_step(xla.device(), reads), backend=xla, steps=1, warmup=2, targets=())
    on_cpu = profile(_step(torch.device("cpu"), reads), backend="cpu", steps=1, warmup=2)
    report = dry_run(_step(torch.device("cpu"), reads))
    dry = sum(h.count for h in report.by_kind(HazardKind.HOST_SYNC))
    assert (on_xla.host_syncs_per_step, on_cpu.host_syncs_per_step, dry) == (per_step,) * 3
