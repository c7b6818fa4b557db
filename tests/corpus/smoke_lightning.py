"""Smoke run for lightning: a Trainer and a Fabric on the accelerator each picks by itself.

Run as `python smoke_lightning.py OUT SCRATCH` with the package under test on PYTHONPATH;
writes the chosen accelerators, the losses and the final weights to OUT (torch.save).
"""

from __future__ import annotations

import sys

import torch


def main(out: str, scratch: str) -> None:
    import lightning as L

    class Regressor(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
            )
            self.losses: list[torch.Tensor] = []

        def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.losses.append(loss.detach().cpu())
            return loss

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.Adam(self.parameters(), lr=0.01)

    def data() -> torch.utils.data.DataLoader:
        gen = torch.Generator().manual_seed(1)
        ds = torch.utils.data.TensorDataset(
            torch.randn(16, 8, generator=gen), torch.randn(16, 1, generator=gen)
        )
        return torch.utils.data.DataLoader(ds, batch_size=4)

    results: dict[str, object] = {}
    L.seed_everything(0, verbose=False)
    module = Regressor()
    trainer = L.Trainer(
        max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=scratch, deterministic=True,
    )  # fmt: skip
    trainer.fit(module, data())
    results["trainer.accelerator"] = type(trainer.accelerator).__name__
    results["trainer.root_device"] = str(trainer.strategy.root_device)
    results["trainer.precision"] = str(trainer.precision)
    results["trainer.losses"] = torch.stack(module.losses)
    results["trainer.weights"] = {k: v.cpu() for k, v in module.state_dict().items()}

    L.seed_everything(0, verbose=False)
    fabric = L.Fabric()
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    net, opt = fabric.setup(net, opt)
    loader = fabric.setup_dataloaders(data())
    losses = []
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(net(x), y)
        fabric.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().cpu())
    results["fabric.device"] = str(fabric.device)
    results["fabric.losses"] = torch.stack(losses)
    results["fabric.weights"] = {k: v.cpu() for k, v in net.state_dict().items()}
    torch.save(results, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
