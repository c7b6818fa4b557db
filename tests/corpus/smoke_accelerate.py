"""Smoke run for accelerate: an Accelerator on whatever device it picks, three training steps.

Run as `python smoke_accelerate.py OUT` with the package under test on PYTHONPATH; writes the
chosen device, the losses, gathered values and the final weights to OUT (torch.save).
"""

from __future__ import annotations

import sys

import torch


def main(out: str) -> None:
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    set_seed(0)
    accelerator = Accelerator()
    results: dict[str, object] = {
        "device": str(accelerator.device),
        "distributed_type": str(accelerator.distributed_type),
        "mixed_precision": accelerator.mixed_precision,
    }
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(12, 8), torch.randn(12, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        results[f"loss{step}"] = accelerator.gather(loss.detach()).cpu()
    accelerator.wait_for_everyone()
    state = accelerator.unwrap_model(model).state_dict()
    results["weights"] = {k: v.cpu() for k, v in state.items()}
    torch.save(results, out)


if __name__ == "__main__":
    main(sys.argv[1])
