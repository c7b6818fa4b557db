"""Op coverage: which ATen ops code ran, and which of them have no XLA lowering.

Real models run on the CPU; verdicts come from the development lock's torchax registry (or
the shipped table generated from it, which a test keeps equal to the registry), and the
slow tests confirm verdicts by running the ops under torchax itself.
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # libtpu is installed: keep JAX quiet on the CPU

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gpu2tpu.backends.torchax_compat import import_torchax
from gpu2tpu.readiness.op_coverage import (
    FUNCTION_LEVEL,
    REPLACEMENTS,
    SHIPPED_TABLE,
    OpName,
    Status,
    coverage,
    coverage_of_dry_run,
    coverage_of_run,
    live_lowering_table,
    lowering_table,
    shipped_lowering_table,
)

ROOT = Path(__file__).resolve().parent.parent


class PoolNet(nn.Module):
    """A small CNN whose forward uses fractional max pooling, which torchax cannot lower."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.fc = nn.Linear(4 * 3 * 3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv(x))
        x = F.fractional_max_pool2d(x, 2, output_size=3)
        return self.fc(x.flatten(1))


def train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor):
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss


def line_of(function, text: str) -> int:
    """The line number, in this file, of the line of `function` that contains `text`."""
    lines, start = inspect.getsourcelines(function)
    (offset,) = [i for i, line in enumerate(lines) if text in line]
    return start + offset


def pool_batch() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(2, 1, 8, 8), torch.tensor([0, 1])


def test_unlowered_op_in_a_training_step_is_reported_with_its_line() -> None:
    torch.manual_seed(0)
    model = PoolNet()
    opt = torch.optim.AdamW(model.parameters())
    report = coverage_of_run(train_step, model, opt, *pool_batch())
    entry = report.get("aten::fractional_max_pool2d")
    assert entry is not None and entry.status is Status.NOT_LOWERED
    assert entry.lines == [line_of(PoolNet.forward, "fractional_max_pool2d")]
    assert "fractional_max_pool2d" in entry.code
    assert "max_pool2d" in entry.hint
    assert not report.fully_covered
    assert [e.op for e in report.not_lowered] == [entry.op]
    assert f"line {entry.lines[0]}" in str(report)
    assert report.result is not None  # the loss the step returned
    # Its backward kernel is not a finding: torchax differentiates the forward with JAX.
    backward = report.get("aten::fractional_max_pool2d_backward")
    assert backward is not None and backward.status is Status.NOT_NEEDED


def test_plain_mlp_training_step_is_fully_covered() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters())
    report = coverage_of_run(train_step, model, opt, torch.randn(4, 8), torch.tensor([0, 1, 2, 3]))
    assert report.fully_covered, str(report)
    assert report.get("aten::addmm").status is Status.LOWERED
    forward_line = line_of(train_step, "cross_entropy")
    assert forward_line in report.get("aten::addmm").lines
    assert "every op has an XLA lowering" in str(report)


def test_geqrf_is_not_lowered_and_its_replacement_is() -> None:
    def factorise(a: torch.Tensor):
        return torch.geqrf(a)

    report = coverage_of_run(factorise, torch.randn(4, 4))
    entry = report.get("aten::geqrf")
    assert entry.status is Status.NOT_LOWERED
    assert entry.lines == [line_of(factorise, "torch.geqrf")]
    assert "torch.linalg.qr" in entry.hint
    qr = coverage_of_run(lambda a: torch.linalg.qr(a), torch.randn(4, 4))
    assert qr.fully_covered, str(qr)


def test_lstm_cpu_kernel_is_not_needed_on_a_tpu() -> None:
    # On the CPU nn.LSTM runs oneDNN's mkldnn_rnn_layer; on a TPU torch takes the generic path.
    lstm = nn.LSTM(4, 8, batch_first=True)
    report = coverage_of_run(lambda x: lstm(x)[0].sum(), torch.randn(2, 3, 4))
    entry = report.get("aten::mkldnn_rnn_layer")
    assert entry is not None and entry.status is Status.NOT_NEEDED
    assert report.fully_covered, str(report)


def test_an_error_in_the_code_carries_the_coverage_so_far() -> None:
    def broken(a: torch.Tensor):
        torch.geqrf(a)
        raise ValueError("stop")

    with pytest.raises(ValueError) as caught:
        coverage_of_run(broken, torch.randn(3, 3))
    assert caught.value.op_coverage_report.get("aten::geqrf").status is Status.NOT_LOWERED


# -- names and resolution ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("aten::mul.Tensor", ("aten", "mul", "Tensor")),
        ("aten.mul.Tensor", ("aten", "mul", "Tensor")),
        ("torch.ops.aten.mul.Tensor", ("aten", "mul", "Tensor")),
        ("aten::relu.default", ("aten", "relu", "default")),
        ("aten.mul", ("aten", "mul", None)),
        ("aten::geqrf", ("aten", "geqrf", None)),
        ("geqrf", ("aten", "geqrf", None)),
    ],
)
def test_op_names_in_every_spelling(text: str, parsed: tuple) -> None:
    op = OpName.parse(text)
    assert (op.namespace, op.name, op.overload) == parsed


def test_dry_run_style_names_resolve() -> None:
    table = shipped_lowering_table()
    report = coverage(
        {
            "aten.mul": 3,  # packet only: lowered for every overload a tensor program can use
            "aten.geqrf": 1,
            "aten.convolution_backward": 2,
            "profiler._record_function_enter_new": 1,
            "mylib.custom_kernel": 1,
        },
        {"aten.geqrf": [7, None], "aten.mul": [3]},
        table=table,
    )
    status = {e.op: e.status for e in report.ops}
    assert status == {
        "aten::mul": Status.LOWERED,
        "aten::geqrf": Status.NOT_LOWERED,
        "aten::convolution_backward": Status.NOT_NEEDED,
        "profiler::_record_function_enter_new": Status.NOT_NEEDED,
        "mylib::custom_kernel": Status.UNKNOWN,
    }
    assert report.get("aten::geqrf").lines == [7]
    assert report.ops[0].op == "aten::geqrf"  # worst first


def test_packet_with_an_unlowered_tensor_overload_is_unknown() -> None:
    # torchax lowers searchsorted.Tensor but not searchsorted.Scalar.
    table = shipped_lowering_table()
    assert table.resolve("aten::searchsorted.Tensor").status is Status.LOWERED
    assert table.resolve("aten::searchsorted.Scalar").status is Status.NOT_LOWERED
    packet = table.resolve("aten.searchsorted")
    assert packet.status is Status.UNKNOWN
    assert "Scalar" in packet.via


def test_every_replacement_is_for_an_unlowered_op_and_uses_lowered_ops() -> None:
    table = shipped_lowering_table()
    for op, replacement in REPLACEMENTS.items():
        assert table.resolve(op).status is Status.NOT_LOWERED, op
        for used in replacement.uses:
            assert table.resolve(used).status is Status.LOWERED, (op, used)


def test_function_level_lowerings_are_in_the_registry() -> None:
    table = shipped_lowering_table()
    for op, (function, spelling) in FUNCTION_LEVEL.items():
        assert function in table.torch_functions, op
        resolution = table.resolve(op)
        assert resolution.status is Status.UNKNOWN
        assert spelling in resolution.via


def test_renderings() -> None:
    report = coverage({"aten.geqrf": 1, "aten.addmm": 4}, {"aten.geqrf": [12]})
    page = report._repr_html_()
    assert "aten::geqrf" in page and "not lowered" in page and "line 12" in page
    data = json.loads(json.dumps(report.to_dict()))
    assert data["fully_covered"] is False
    assert data["ops"][0]["op"] == "aten::geqrf" and data["ops"][0]["hint"]
    assert report.table in str(report)


def test_dry_run_report_joins_the_coverage() -> None:
    from gpu2tpu.readiness.dryrun import dry_run

    model = PoolNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dry = dry_run(train_step, model, opt, *pool_batch())
    report = coverage_of_dry_run(dry)
    entry = report.get("aten::fractional_max_pool2d")
    assert entry.status is Status.NOT_LOWERED
    assert entry.lines == [line_of(PoolNet.forward, "fractional_max_pool2d")]
    assert [e.op for e in report.not_lowered] == [entry.op]


# -- the shipped table, the live registry, and torchax itself ------------------------------------


@pytest.mark.slow
@pytest.mark.torchax
def test_shipped_table_matches_the_live_registry_and_the_script_regenerates_it(
    tmp_path: Path,
) -> None:
    import runpy

    live = live_lowering_table()
    shipped = shipped_lowering_table()
    assert (shipped.torchax_version, shipped.torch_version) == (
        live.torchax_version,
        live.torch_version,
    )
    assert live.same_registry(shipped)
    assert shipped.generated  # the date it came from
    assert lowering_table().same_registry(live)

    script = runpy.run_path(str(ROOT / "scripts" / "regenerate_op_table.py"))
    out = tmp_path / "xla_ops.json"
    assert script["main"](["--output", str(out)]) == 0
    fresh = json.loads(out.read_text())
    kept = json.loads(SHIPPED_TABLE.read_text())
    fresh.pop("generated"), kept.pop("generated")
    assert fresh == kept
    assert script["main"](["--check", "--output", str(out)]) == 0
    tampered = json.loads(out.read_text())
    tampered["packets"].remove("aten::addmm")
    out.write_text(json.dumps(tampered))
    assert script["main"](["--check", "--output", str(out)]) == 1


@pytest.mark.slow
@pytest.mark.torchax
def test_torchax_agrees_with_the_verdicts() -> None:
    torchax = import_torchax()
    from torchax.tensor import OperatorNotFound

    env = torchax.default_env()
    with env:
        x = torch.randn(1, 1, 8, 8, device="jax")
        with pytest.raises(OperatorNotFound, match="fractional_max_pool2d"):
            F.fractional_max_pool2d(x, 2, output_size=3)
        with pytest.raises(OperatorNotFound, match="geqrf"):
            torch.geqrf(torch.randn(4, 4, device="jax"))
        # What the report calls lowered or not needed runs: an MLP, and an LSTM (whose CPU
        # kernel mkldnn_rnn_layer torchax lacks).
        mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to("jax")
        assert mlp(torch.randn(4, 8, device="jax")).shape == (4, 4)
        lstm = nn.LSTM(4, 8, batch_first=True).to("jax")
        assert lstm(torch.randn(2, 3, 4, device="jax"))[0].shape == (2, 3, 8)
        # And the replacement the report suggests for fractional pooling runs.
        assert F.max_pool2d(x, 2).shape == (1, 1, 4, 4)


def test_unreadable_table_and_bad_names_are_clear_errors(tmp_path: Path) -> None:
    broken = tmp_path / "xla_ops.json"
    broken.write_text("{not json")
    with pytest.raises(RuntimeError, match=r"xla_ops\.json.*regenerate_op_table\.py"):
        shipped_lowering_table(broken)
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"format": 0}))
    with pytest.raises(ValueError, match="format 0"):
        shipped_lowering_table(old)
    with pytest.raises(ValueError, match="not an operator name"):
        OpName.parse("::")
