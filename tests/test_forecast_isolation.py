"""`gpu2tpu.forecast` leaves the user's process as it was: no torchax, same accelerator."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import sys, torch, gpu2tpu
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
batch = (torch.randn(8, 16), torch.randint(0, 4, (8,)))
fc = gpu2tpu.forecast(model, batch, targets=("v5e",), batch_search=False, progress=False, cache=False)
target = fc.targets[0]
print("compiled", target.status == "compiled", target.flops > 0)
print("torchax", "torchax" in sys.modules)
print("accelerator", torch.accelerator.current_accelerator(check_available=True))
"""


@pytest.mark.slow
def test_forecast_compiles_in_a_child_and_leaves_torch_alone() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "compiled True True" in lines
    assert "torchax False" in lines
    assert "accelerator None" in lines
