"""Smoke run for ultralytics: a YOLO detector built from its YAML, trained one step, predicting.

Run as `python smoke_ultralytics.py OUT` with the package under test on PYTHONPATH (and
YOLO_CONFIG_DIR pointing at a scratch folder); writes the results to OUT (torch.save).
"""

from __future__ import annotations

import sys

import numpy as np
import torch


def main(out: str) -> None:
    from ultralytics import YOLO
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils.torch_utils import select_device

    results: dict[str, object] = {"device": str(select_device("", verbose=False))}
    torch.manual_seed(0)
    model = DetectionModel("yolov8n.yaml", nc=3, verbose=False)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    model.args = get_cfg()  # the loss reads its box/cls/dfl gains from the default config
    model.train()
    batch = {
        "img": x,
        "batch_idx": torch.tensor([0.0, 1.0]),
        "cls": torch.tensor([[1.0], [2.0]]),
        "bboxes": torch.tensor([[0.5, 0.5, 0.4, 0.3], [0.3, 0.6, 0.2, 0.2]]),
    }
    loss, items = model.loss(batch)
    loss.sum().backward()
    results["train.loss"] = loss.detach()
    grads = [p.grad.sum() for p in model.parameters() if p.grad is not None]
    results["train.grad_sums"] = torch.stack(grads)
    model.eval()
    with torch.no_grad():
        results["eval.out"] = model(x)[0]

    # The high-level API: device selection, preprocessing, inference and NMS.
    torch.manual_seed(0)
    yolo = YOLO("yolov8n.yaml", verbose=False)
    image = np.random.default_rng(0).integers(0, 256, (96, 128, 3), dtype=np.uint8)
    (pred,) = yolo.predict(image, imgsz=64, conf=0.0, max_det=5, verbose=False)
    results["predict.boxes"] = pred.boxes.data
    torch.save(results, out)


if __name__ == "__main__":
    main(sys.argv[1])
