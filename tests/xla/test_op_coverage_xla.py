"""The op tables against the real PyTorch/XLA: what they call unlowered falls back to the CPU.

Each sample runs twice: on the CPU under gpu2tpu's OpRecorder (the ATen ops it runs, as the
dry run sees them) and on `torch_xla.device()`, where torch_xla counts every op it hands to
the CPU in a counter `aten::<op>`. The PyTorch/XLA table (torch_xla_ops.json) must name
exactly those ops as not lowered. The torchax table (xla_ops.json) describes torchax, another
runtime; its "no lowering" ops are checked to be unlowered on PyTorch/XLA too where they are,
and the ones PyTorch/XLA does lower are listed as such by the PyTorch/XLA table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from gpu2tpu.readiness.op_coverage import (
    REPLACEMENTS,
    TORCH_XLA_TABLE,
    OpName,
    OpRecorder,
    Status,
    TorchXLATable,
    coverage,
    shipped_lowering_table,
    shipped_torch_xla_table,
)

Sample = Callable[[torch.device], Any]


def _frac(dev: torch.device) -> Any:
    return F.fractional_max_pool2d(torch.randn(1, 2, 8, 8, device=dev), 2, output_size=(4, 4))


def _ctc(dev: torch.device) -> Any:
    logp = torch.randn(10, 2, 5, device=dev).log_softmax(-1)
    targets = torch.randint(1, 5, (2, 4), device=dev)
    n = torch.full((2,), 10, dtype=torch.long, device=dev)
    return F.ctc_loss(logp, targets, n, torch.full((2,), 4, dtype=torch.long, device=dev))


def _index_reduce(dev: torch.device) -> Any:
    x = torch.zeros(4, 3, device=dev)
    index = torch.tensor([0, 2, 0], device=dev)
    return x.index_reduce_(0, index, torch.randn(3, 3, device=dev), "amax")


def _segment_reduce(dev: torch.device) -> Any:
    data = torch.randn(6, device=dev)
    lengths = torch.tensor([2, 4], device=dev)
    return torch.segment_reduce(data, "sum", lengths=lengths)


def _histogram(dev: torch.device) -> Any:
    return torch.histc(torch.randn(32, device=dev), bins=4)


def _geqrf(dev: torch.device) -> Any:
    return torch.geqrf(torch.randn(4, 4, device=dev))


def _rrelu(dev: torch.device) -> Any:
    return F.rrelu(torch.randn(8, device=dev), training=True)


def _adaptive_max(dev: torch.device) -> Any:
    return F.adaptive_max_pool2d(torch.randn(1, 2, 8, 8, device=dev), (2, 2))


def _embedding_bag(dev: torch.device) -> Any:
    weight = torch.randn(10, 4, device=dev)
    return F.embedding_bag(torch.randint(0, 10, (3, 2), device=dev), weight, mode="mean")


def _bincount(dev: torch.device) -> Any:
    return torch.bincount(torch.randint(0, 4, (16,), device=dev), minlength=4)


# Ops commonly found in training steps, which the tables call lowered.
def _mlp_step(dev: torch.device) -> Any:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
    model = model.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    loss = F.cross_entropy(
        model(torch.randn(4, 8, device=dev)), torch.randint(0, 3, (4,), device=dev)
    )
    loss.backward()
    opt.step()
    return loss


def _cnn(dev: torch.device) -> Any:
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 4, 3, padding=1).to(dev)
    norm = torch.nn.BatchNorm2d(4).to(dev)
    x = F.max_pool2d(norm(conv(torch.randn(2, 3, 8, 8, device=dev))).relu(), 2)
    return F.adaptive_avg_pool2d(x, 1).flatten(1).softmax(-1).sum()


def _attention(dev: torch.device) -> Any:
    torch.manual_seed(0)
    emb = torch.nn.Embedding(16, 8).to(dev)
    norm = torch.nn.LayerNorm(8).to(dev)
    h = norm(emb(torch.randint(0, 16, (2, 5), device=dev)))
    q = h.view(2, 5, 2, 4).transpose(1, 2)
    out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    return F.dropout(out, 0.1).sum()


SAMPLES: dict[str, Sample] = {
    "fractional_max_pool2d": _frac,
    "ctc_loss": _ctc,
    "index_reduce": _index_reduce,
    "segment_reduce": _segment_reduce,
    "histc": _histogram,
    "geqrf": _geqrf,
    "rrelu": _rrelu,
    "adaptive_max_pool2d": _adaptive_max,
    "embedding_bag": _embedding_bag,
    "bincount": _bincount,
    "mlp_adamw_step": _mlp_step,
    "cnn_forward": _cnn,
    "attention_forward": _attention,
}


def _fallbacks(sample: Sample) -> set[str]:
    """The ops torch_xla ran on the CPU for `sample`, as "aten::op.overload" names."""
    import torch_xla
    import torch_xla.debug.metrics as met

    def counters() -> dict[str, int]:
        return {n: met.counter_value(n) for n in met.counter_names() if n.startswith("aten::")}

    before = counters()
    sample(torch_xla.device())
    torch_xla.sync()
    grew = {n for n, v in counters().items() if v > before.get(n, 0)}
    return {_canonical(n) for n in grew - {"aten::_local_scalar_dense"}}


def _canonical(name: str) -> str:
    """One spelling per op; an in-place op by its functional name, which is what torch_xla
    runs (and counts) after functionalization: index_reduce_ falls back as index_reduce."""
    op = OpName.parse(name)
    packet = f"{op.namespace}::{op.name.rstrip('_')}" if not op.name.startswith("__") else op.packet
    return packet if op.overload in (None, "default") else f"{packet}.{op.overload}"


def _table_says_not_lowered(sample: Sample, table: Any) -> set[str]:
    recorder = OpRecorder(set())
    with recorder:
        sample(torch.device("cpu"))
    report = coverage(recorder.counts, backward=recorder.backward_only, table=table)
    return {_canonical(entry.op) for entry in report.not_lowered}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_the_torch_xla_table_names_exactly_the_ops_that_fall_back(name: str) -> None:
    sample = SAMPLES[name]
    expected = _table_says_not_lowered(sample, shipped_torch_xla_table())
    assert _fallbacks(sample) == expected


def test_the_shipped_torch_xla_table_is_the_dispatchers() -> None:
    shipped = shipped_torch_xla_table(TORCH_XLA_TABLE)
    live = TorchXLATable.from_dispatcher()
    assert shipped == live, "regenerate: scripts/regenerate_op_table.py --torch-xla"


def test_torchax_no_lowering_ops_are_judged_by_the_torch_xla_table() -> None:
    """Every curated torchax gap (REPLACEMENTS) that PyTorch/XLA also lacks falls back there;
    those PyTorch/XLA lowers are marked lowered by its own table, so no report claims a
    fallback PyTorch/XLA would not make."""
    torchax = shipped_lowering_table()
    xla_table = shipped_torch_xla_table()
    sampled = {
        "aten::fractional_max_pool2d": _frac,
        "aten::_ctc_loss": _ctc,
        "aten::index_reduce": _index_reduce,
        "aten::segment_reduce": _segment_reduce,
        "aten::geqrf": _geqrf,
        "aten::rrelu_with_noise": _rrelu,
        "aten::adaptive_max_pool2d": _adaptive_max,
    }
    for op, sample in sampled.items():
        assert op in REPLACEMENTS
        assert torchax.resolve(op).status is Status.NOT_LOWERED, op
        fell_back = any(f.split(".")[0] == _canonical(op) for f in _fallbacks(sample))
        said = _table_says_not_lowered(sample, xla_table)
        assert fell_back == any(n.split(".")[0] == _canonical(op) for n in said), (op, said)
