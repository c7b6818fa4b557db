"""The per-step floor: a small step's expected time is never under what dispatching its ops
(and feeding its batch) takes, in the profiler's comparison and in the forecast; and no
expected time is under the compiler's own estimate."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from gpu2tpu import profile
from gpu2tpu.forecasting import forecast as fc
from gpu2tpu.forecasting.aot import split_batch
from gpu2tpu.forecasting.result import TargetForecast
from gpu2tpu.measure.flops import count_meta_step, count_step
from gpu2tpu.pricing.catalogue import HardwareCatalogue
from gpu2tpu.pricing.step_floor import (
    DISPATCH_COSTS,
    HOST_LINK_BYTES_PER_S,
    apply_floor,
    compiler_floor,
    framework_key,
    step_floor,
)
from gpu2tpu.pricing.utilisation import ExpectedStep

CATALOGUE = HardwareCatalogue.load()
PER_OP = DISPATCH_COSTS["pytorch"].per_op_seconds


def expected(seconds: float, low: float | None = None, high: float | None = None) -> ExpectedStep:
    return ExpectedStep(
        seconds=seconds,
        low=seconds * 0.9 if low is None else low,
        high=seconds * 1.1 if high is None else high,
        bound_seconds=seconds / 2,
        utilisation=0.5,
        limited_by="compute",
        calibrated=True,
        source="test",
    )


def test_the_floor_is_the_larger_of_dispatch_and_feeding_not_their_sum():
    dispatch_only = step_floor("pytorch", "v5e", ops=110, input_bytes=1e9)  # no published link
    assert dispatch_only.seconds == pytest.approx(110 * PER_OP)
    assert dispatch_only.feed_seconds is None
    link = HOST_LINK_BYTES_PER_S["h100"][0]
    fed = step_floor("pytorch", "h100", ops=110, input_bytes=64e6)
    assert fed.feed_seconds == pytest.approx(64e6 / link)
    assert fed.seconds == pytest.approx(max(110 * PER_OP, 64e6 / link))
    assert "input over the host link" in fed.describe()
    split = step_floor("pytorch", "h100", ops=0, input_bytes=64e6, chips=4)
    assert split.seconds == pytest.approx(64e6 / 4 / link)  # each chip is fed its share
    traced_once = step_floor("jax", "v5e", ops=110)
    assert traced_once.seconds == 0.0 and traced_once.framework == "jax"


def test_framework_names_and_their_errors():
    assert framework_key("XLA") == "pytorch_xla"
    assert framework_key("cuda") == "pytorch"
    assert framework_key("tensorflow") == "jax"  # a graph traced once
    with pytest.raises(ValueError, match="unknown framework 'caffe'"):
        framework_key("caffe")


def test_apply_floor_lifts_the_figure_or_only_its_range():
    step = expected(1e-3)
    assert apply_floor(step, step_floor("pytorch", "v5e", ops=10)) == step  # far below
    cut = apply_floor(step, replace(step_floor("pytorch", "v5e"), seconds=0.95e-3))
    assert (cut.seconds, cut.low, cut.limited_by) == (1e-3, 0.95e-3, "compute")
    floor = step_floor("pytorch", "v5e", ops=1000)  # 3.3 ms
    lifted = apply_floor(step, floor)
    assert lifted.seconds == lifted.low == floor.seconds
    assert lifted.high >= lifted.seconds
    assert lifted.limited_by == "per-step floor" and not lifted.calibrated
    assert "1000 ops" in lifted.notes[-1]


def test_the_compiler_estimate_is_a_floor_only_when_positive():
    assert compiler_floor(None) is None and compiler_floor(-0.2) is None
    lifted = apply_floor(expected(1e-3), compiler_floor(2e-3))
    assert lifted.seconds == 2e-3 and lifted.limited_by == "compiler estimate"


def tiny_step():
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 4), torch.randn(8, 2)

    def step() -> None:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    return step


def test_a_tiny_step_is_never_shown_faster_than_dispatching_its_ops():
    r = profile(tiny_step(), steps=3, warmup=1, backend="cpu", targets=["v5e", "h100"])
    ops = r.step_count.kernel_ops
    assert ops >= 8  # forward, loss, backward, SGD: each op is dispatched
    for key, framework in (("v5e", "torchtpu"), ("h100", "pytorch")):
        row = r.row(key)
        floor = ops * DISPATCH_COSTS[framework].per_op_seconds
        assert row.step_seconds == pytest.approx(floor)
        assert row.time_kind == "bound"  # the floor: at least this, never "expected"
        assert row.note.startswith("at least") and f"{ops} ops" in row.note


class SmallCNN(nn.Module):
    """The bundled demo's CIFAR CNN (examples/image_classification.ipynb)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )  # fmt: skip
        self.classifier = nn.Linear(32 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def test_the_demo_cnn_is_a_figure_with_its_floor_or_a_labelled_bound():
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.005, momentum=0.9, weight_decay=5e-4)
    images, labels = torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(images), labels).backward()
        opt.step()

    r = profile(step, steps=3, warmup=1, backend="cpu", targets=["v5e", "h100"])
    assert r.model_class == "small_step" and r.precision == "fp32"
    ops = r.step_count.kernel_ops
    assert ops > 50  # conv, batch norm, ReLU, pooling, linear, loss, their gradients, SGD
    for key in ("v5e", "h100"):
        row = r.row(key)
        # no published small-step run calibrates a figure, and the floor is far longer than
        # the FLOPs: a bound that states its floor, never an "expected" few microseconds
        assert row.time_kind == "bound"
        assert row.step_seconds == pytest.approx(ops * PER_OP)
        assert row.note.startswith("at least") and f"{ops} ops" in row.note


def test_the_forecast_prices_no_expected_time_under_the_floor_or_the_compiler():
    chip = CATALOGUE.get("v5e")
    target = TargetForecast(
        target="v5e", name=chip.name, topology="v5e:1x1", chips=1, devices_per_chip=1,
        status="compiled", batch=8, hbm_per_chip=float(chip.hbm_bytes), flops=1e9,
        bytes_accessed=1e6, attention_flops=0.0, matmul_flops=1e9,
    )  # fmt: skip
    fc._price(target, chip, None, "on_demand")
    free = target.expected_seconds
    floor = step_floor("torchtpu", "v5e", ops=500)
    assert floor.seconds > free
    fc._price(target, chip, None, "on_demand", floor)
    # the floor is longer than the expected compute: no expected figure, a bound at the floor
    assert target.expected_seconds is None
    assert target.floor_seconds == pytest.approx(floor.seconds)
    assert target.expected_limited_by == "per-step floor"
    assert target.cost_per_step == pytest.approx(chip.price_on_demand * floor.seconds / 3600)
    row = fc._tpu_row(target, chip, 8, None, "on_demand")
    assert row.time_kind == "bound" and row.step_seconds == pytest.approx(floor.seconds)
    assert "at least" in row.note and "500 ops" in row.note
    target.compiler_seconds = 10 * floor.seconds  # libtpu's own estimate, longer still
    fc._price(target, chip, None, "on_demand", floor)
    assert target.floor_seconds == pytest.approx(10 * floor.seconds)
    assert target.expected_limited_by == "compiler estimate"
    gpu = fc._gpu_row(target, CATALOGUE.get("h100"), 8, None, "on_demand", floor)
    assert gpu.step_seconds >= floor.seconds and gpu.time_kind == "bound"
    assert gpu.note.startswith("at least")


def test_the_forecast_counts_the_step_on_the_meta_device_for_its_floor():
    model = SmallCNN()
    batch = (torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,)))
    job = SimpleNamespace(
        model=model, layout=split_batch(batch), loss_fn=None, dtype=None, counted=False,
        step_count=None,
    )  # fmt: skip
    floor = fc._floor(job, CATALOGUE.get("h100"), 1)
    real = count_step(lambda: nn.functional.cross_entropy(model(batch[0]), batch[1]).backward())
    assert floor.ops == job.step_count.kernel_ops == real.kernel_ops
    assert floor.input_bytes == 64 * 3 * 32 * 32 * 4 + 64 * 8
    assert job.step_count.flops == real.flops
    assert fc._floor(job, CATALOGUE.get("cpu"), 1) is None


def test_count_meta_step_takes_the_dtype_asked_for():
    model = nn.Linear(64, 64)
    count = count_meta_step(
        model, (torch.empty(8, 64),), {}, None, lambda out, _: out.sum(), dtype=torch.bfloat16
    )
    assert count.precision == "bf16"
    assert count.flops == 2 * (2 * 8 * 64 * 64)  # forward and weight gradient: the input has none
