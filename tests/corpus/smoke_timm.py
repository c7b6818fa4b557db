"""Smoke run for timm: models forward and backward, a training step, the data loader.

Run as `python smoke_timm.py OUT` with the package under test on PYTHONPATH; writes a dict of
results (tensors and plain values) to OUT with torch.save. The corpus test runs it once against
the original sources and once against the rewritten ones and compares the two files.
"""

from __future__ import annotations

import random
import sys

import numpy as np
import torch
from PIL import Image


def seed(n: int = 0) -> None:
    random.seed(n)
    np.random.seed(n)
    torch.manual_seed(n)


class TinyImages(torch.utils.data.Dataset):
    """Eight random RGB images; timm's create_loader sets `transform`."""

    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self.images = [
            Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)) for _ in range(8)
        ]
        self.transform = None

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):  # type: ignore[no-untyped-def]
        img = self.images[i]
        return (self.transform(img) if self.transform else img), i % 3


def main(out: str) -> None:
    import timm
    from timm.data import create_loader
    from timm.optim import create_optimizer_v2
    from timm.scheduler import create_scheduler_v2
    from timm.utils import ModelEmaV3

    results: dict[str, object] = {}
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    for name, kwargs in (
        ("resnet18", {}),
        ("vit_tiny_patch16_224", {"img_size": 64}),
        ("convnext_atto", {}),
    ):
        seed()
        model = timm.create_model(name, pretrained=False, num_classes=10, **kwargs)
        y = model(x)
        y.square().mean().backward()
        results[f"{name}.out"] = y.detach()
        results[f"{name}.grad_sums"] = torch.stack([p.grad.sum() for p in model.parameters()])
        results[f"{name}.grad_norms"] = torch.stack([p.grad.norm() for p in model.parameters()])

    # Two training steps with timm's optimizer factory, scheduler and EMA.
    seed()
    model = timm.create_model("resnet18", pretrained=False, num_classes=3)
    ema = ModelEmaV3(model, decay=0.9)
    opt = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05)
    sched, _ = create_scheduler_v2(opt, "cosine", num_epochs=2, warmup_epochs=0)
    for step in range(2):
        loss = torch.nn.functional.cross_entropy(model(x), torch.tensor([0, 2]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        ema.update(model, step=step)
        sched.step(step + 1)
        results[f"train.loss{step}"] = loss.detach()
    results["train.params"] = torch.stack([p.detach().sum() for p in model.parameters()])
    results["train.ema"] = torch.stack([p.detach().sum() for p in ema.module.parameters()])

    # The loader with timm's prefetcher, on the CPU.
    seed()
    loader = create_loader(
        TinyImages(),
        input_size=(3, 32, 32),
        batch_size=4,
        is_training=True,
        use_prefetcher=True,
        device=torch.device("cpu"),
        num_workers=0,
    )
    for i, (images, targets) in enumerate(loader):
        results[f"loader.images{i}"] = images
        results[f"loader.targets{i}"] = targets
    torch.save(results, out)


if __name__ == "__main__":
    main(sys.argv[1])
