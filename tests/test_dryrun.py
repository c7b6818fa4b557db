"""The dry-run hazard detector, through `dry_run(fn, *args)` on real PyTorch code."""

from __future__ import annotations

import inspect
import json

import numpy as np
import pytest
import torch

from gpu2tpu.readiness.dryrun import FIX, DryRunReport, HazardKind, dry_run


def line_of(fn, text: str) -> int:
    """The file line number of the first line of `fn` that contains `text`."""
    lines, start = inspect.getsourcelines(fn)
    for offset, line in enumerate(lines):
        if text in line:
            return start + offset
    raise AssertionError(f"{text!r} not in {fn.__name__}")


def host_syncs(x: torch.Tensor) -> float:
    total = 0.0
    for _ in range(3):
        total += x.sum().item()
    x.cpu()
    x.tolist()
    x.numpy()
    print(x)
    big = x[x > 0]
    idx = torch.nonzero(x)
    return total + big.numel() + idx.numel()


def test_host_syncs_are_counted_at_the_user_lines(capsys) -> None:
    report = dry_run(host_syncs, torch.randn(4, 4))
    syncs = {h.line: h for h in report.by_kind(HazardKind.HOST_SYNC)}
    item_line = line_of(host_syncs, ".item()")
    assert syncs[item_line].count == 3
    assert syncs[item_line].code == "total += x.sum().item()"
    assert syncs[line_of(host_syncs, "x.cpu()")].causes == {".cpu()": 1}
    assert syncs[line_of(host_syncs, "x.tolist()")].causes == {".tolist()": 1}
    assert syncs[line_of(host_syncs, "x.numpy()")].causes == {".numpy()": 1}
    # Printing counts once, not once per element it reads.
    assert syncs[line_of(host_syncs, "print(x)")].count == 1
    # nonzero and x[mask] are data-dependent shapes (PyTorch/XLA runs them on the CPU).
    dynamic = {h.line: h for h in report.by_kind(HazardKind.DYNAMIC_SHAPE)}
    assert "boolean-mask indexing x[mask]" in dynamic[line_of(host_syncs, "x[x > 0]")].causes
    assert dynamic[line_of(host_syncs, "torch.nonzero")].causes == {
        "nonzero / torch.where(mask)": 1
    }
    assert line_of(host_syncs, "torch.nonzero") not in syncs
    assert isinstance(report.result, float)
    assert "tensor(" in capsys.readouterr().out  # the function still printed


def float64_and_dynamic(x: np.ndarray) -> torch.Tensor:
    t = torch.from_numpy(x)
    y = t * 2
    u = torch.unique(y.float())
    return u


def test_float64_and_data_dependent_shapes() -> None:
    report = dry_run(float64_and_dynamic, np.arange(6.0))
    f64 = report.by_kind("float64")
    # float64 enters at from_numpy and is worked on by the multiplication; not after .float().
    assert [h.line for h in f64] == [
        line_of(float64_and_dynamic, "from_numpy"),
        line_of(float64_and_dynamic, "y = t * 2"),
    ]
    assert f64[1].causes == {"aten.mul": 1}
    dyn = report.by_kind(HazardKind.DYNAMIC_SHAPE)
    assert [h.line for h in dyn] == [line_of(float64_and_dynamic, "torch.unique")]
    assert torch.equal(report.result, torch.arange(0.0, 12.0, 2.0))


def converted_on_the_line(a: np.ndarray) -> torch.Tensor:
    t = torch.from_numpy(a).float()
    moved = torch.from_numpy(a).to(torch.float32) * 2
    kept = torch.from_numpy(a)
    later = kept.float()
    return t + moved + later


def float64_copied_then_used(a: np.ndarray) -> torch.Tensor:
    t = torch.from_numpy(a)
    same = t.clone()
    return same.sum()


def test_float64_from_the_host_converted_before_use_is_no_hazard() -> None:
    # issue 32: `torch.from_numpy(a).float()` converts on the line; no float64 reaches a TPU.
    report = dry_run(converted_on_the_line, np.random.rand(4, 3))
    assert report.by_kind("float64") == []
    # Used before a conversion, it is: reported at the line that made it, where the fix goes.
    used = dry_run(float64_copied_then_used, np.random.rand(4, 3))
    lines = [h.line for h in used.by_kind("float64")]
    assert line_of(float64_copied_then_used, "from_numpy") in lines


class _Samples(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self) -> None:
        self.x = torch.randn(16, 4)
        self.y = torch.randint(0, 2, (16,))

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.x[i], int(self.y[i])


def train_from_a_dataset(model: torch.nn.Module) -> float:
    loss = torch.zeros(())
    for xb, yb in torch.utils.data.DataLoader(_Samples(), batch_size=8):
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
    return loss.item()


def test_a_datasets_own_reads_run_on_the_host_and_are_no_sync() -> None:
    # issue 32: `int(self.y[i])` in `__getitem__` is host-side loading, not a sync per sample.
    report = dry_run(train_from_a_dataset, torch.nn.Linear(4, 2))
    [sync] = report.by_kind(HazardKind.HOST_SYNC)
    assert sync.line == line_of(train_from_a_dataset, "return loss.item()")
    assert sync.count == 1
    assert report.ops["aten._local_scalar_dense"]  # the dataset's reads did run


def clipped_step(model: torch.nn.Module) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(8, 4)).pow(2).mean().backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def test_coverage_is_pytorch_xlas_and_both_op_counts_agree() -> None:
    # issue 32: clip_grad_norm_ runs foreach ops on CPU tensors; PyTorch/XLA lowers them (and
    # XLA tensors take the per-tensor path): not "no XLA lowering" from torchax's table.
    report = dry_run(clipped_step, torch.nn.Linear(4, 2))
    assert any(op.startswith("aten._foreach") for op in report.ops)
    assert report.coverage.table.startswith("PyTorch/XLA")
    assert not any("foreach" in entry.op for entry in report.coverage.not_lowered)
    assert report.torchax_coverage.table != report.coverage.table
    # The head line's and the coverage's distinct op counts are the same count.
    text = str(report)
    head = text.splitlines()[0]
    assert f"({len(report.coverage.ops)} distinct)" in head
    assert report.coverage.summary().startswith(f"{len(report.coverage.ops)} distinct")


def test_clean_code_has_no_hazards_and_every_op_is_counted() -> None:
    layer = torch.nn.Linear(8, 4)

    def forward(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(layer(x))

    report = dry_run(forward, torch.randn(2, 8))
    assert report.hazards == []
    assert "No TPU hazards found." in str(report)
    line = line_of(forward, "torch.relu")
    assert report.ops["aten.addmm"] == {line: 1}
    assert report.ops["aten.relu"] == {line: 1}
    assert report.op_counts()["aten.addmm"] == 1
    assert report.overloads["aten.addmm.default"] == 1


def test_shape_change_between_runs_is_a_recompilation_and_same_shapes_are_not() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def step(x: torch.Tensor) -> torch.Tensor:
        return model(x).sum()

    first = dry_run(step, torch.randn(8, 16))
    # Two layers of different widths on one line are not a shape change.
    assert first.by_kind(HazardKind.SHAPE_CHANGE) == []
    again = dry_run(step, torch.randn(8, 16))
    assert again.by_kind(HazardKind.SHAPE_CHANGE) == []
    changed = dry_run(step, torch.randn(5, 16))
    shape = changed.by_kind(HazardKind.SHAPE_CHANGE)
    assert [h.line for h in shape] == [line_of(step, "model(x)")]
    assert "[8, 16]" in shape[0].detail and "[5, 16]" in shape[0].detail


def train_loop(model: torch.nn.Module, sizes: list[int]) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for n in sizes:
        x = torch.randn(n, 4)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()


def test_shape_change_inside_a_loop_last_batch() -> None:
    report = dry_run(train_loop, torch.nn.Linear(4, 2), [16, 16, 16, 7])
    lines = report.lines(HazardKind.SHAPE_CHANGE)
    assert line_of(train_loop, "loss = model(x)") in lines
    # New code (a new function) starts a new history; steady shapes are no change.
    fresh = dry_run(lambda m: train_loop(m, [16, 16]), torch.nn.Linear(4, 2))
    assert fresh.by_kind(HazardKind.SHAPE_CHANGE) == []


def test_report_renders_as_text_html_and_dict() -> None:
    report = dry_run(host_syncs, torch.randn(3, 3))
    text = str(report)
    assert text.startswith("Dry run of host_syncs() on the CPU")
    assert f"fix: {FIX[HazardKind.HOST_SYNC]}" in text
    html = report._repr_html_()
    assert "<table" in html and "host sync" in html and "total += x.sum().item()" in html
    data = json.loads(json.dumps(report.to_dict()))
    assert data["counts"]["host sync"] == sum(h.count for h in report.by_kind("host sync"))
    assert data["ops"]["aten._local_scalar_dense"]["count"] == 3
    assert all(h["fix"] for h in data["hazards"])


def test_tensor_methods_restored_and_error_carries_the_report() -> None:
    originals = (torch.Tensor.cpu, torch.Tensor.__repr__, torch.Tensor.numpy)

    def fails(x: torch.Tensor) -> None:
        x.sum().item()
        raise ValueError("half-way")

    with pytest.raises(ValueError, match="half-way") as err:
        dry_run(fails, torch.ones(2))
    assert (torch.Tensor.cpu, torch.Tensor.__repr__, torch.Tensor.numpy) == originals
    partial: DryRunReport = err.value.dry_run_report
    assert partial.lines("host sync") == [line_of(fails, ".item()")]
    assert partial.error == "ValueError: half-way"


def test_the_dry_run_lists_ops_without_a_lowering_at_the_users_line() -> None:
    import torch.nn.functional as F

    def step(x):  # type: ignore[no-untyped-def]
        pooled = F.fractional_max_pool2d(x, 2, output_ratio=(0.5, 0.5))
        return pooled.relu().sum()

    report = dry_run(step, torch.randn(2, 3, 8, 8))
    entry = report.coverage.get("aten::fractional_max_pool2d")
    assert entry is not None and str(entry.status) == "not lowered"
    assert entry.lines == [step.__code__.co_firstlineno + 1]
    assert "fractional_max_pool2d" in str(report) and "max_pool2d" in str(report)
    assert report.to_dict()["coverage"]["fully_covered"] is False
    plain = dry_run(lambda x: (x @ x).relu().sum(), torch.randn(4, 4))
    assert plain.coverage.fully_covered and "every op has an XLA lowering" in str(plain)


# -- what a TPU user should do (issue 14 §6) ---------------------------------------------------


def adamw_steps(model: torch.nn.Module, loader) -> None:  # type: ignore[no-untyped-def]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    ada = torch.optim.Adagrad(model.parameters(), lr=1e-3)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        ada.step()
        sched.step()
        opt.zero_grad()


def test_optimizer_step_counters_and_the_samplers_indices_are_not_host_syncs() -> None:
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 2))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    report = dry_run(adamw_steps, torch.nn.Linear(4, 2), loader)
    # AdamW and Adagrad read their CPU step counters with .item(), the sampler calls
    # .tolist() on CPU indices: none of it touches the device on a TPU.
    assert report.by_kind(HazardKind.HOST_SYNC) == []
    assert report.ops["aten._local_scalar_dense"]  # the reads did run
    # The same read of a model value is one.
    synced = dry_run(lambda m, x: m(x).sum().item(), torch.nn.Linear(4, 2), torch.randn(2, 4))
    assert [h.count for h in synced.by_kind(HazardKind.HOST_SYNC)] == [1]


def scaled_bf16_steps(model: torch.nn.Module, steps: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(torch.randn(4, 8)).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()


def test_a_grad_scaler_with_bfloat16_autocast_is_advice_to_drop_it() -> None:
    report = dry_run(scaled_bf16_steps, torch.nn.Linear(8, 2), 3)
    [advice] = report.by_kind(HazardKind.GRAD_SCALER)
    assert advice.line == line_of(scaled_bf16_steps, "scaler.step(opt)")
    assert "drop the GradScaler" in str(report)
    # Not a list of the scaler's internals: no host sync, no float64, no unlowered _amp_ op.
    assert report.by_kind(HazardKind.HOST_SYNC) == [] and report.by_kind("float64") == []
    assert not any(op.startswith("aten._amp_") for op in report.ops)
    assert not any("_amp_" in entry.op for entry in report.coverage.not_lowered)


def test_a_grad_scaler_without_autocast_keeps_its_host_sync() -> None:
    def steps(model: torch.nn.Module) -> None:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu")
        for _ in range(2):
            scaler.scale(model(torch.randn(4, 8)).sum()).backward()
            scaler.step(opt)
            scaler.update()

    report = dry_run(steps, torch.nn.Linear(8, 2))
    assert report.by_kind(HazardKind.GRAD_SCALER) == []
    [sync] = report.by_kind(HazardKind.HOST_SYNC)
    assert sync.causes == {"GradScaler reads found_inf on the host": 2}


def shapes_from_the_loop(model: torch.nn.Module) -> None:
    for i in range(4):
        x = torch.randn(i + 1, 4)
        model(x).sum()


def test_a_shape_made_from_the_loop_counter_is_reported_at_its_line() -> None:
    report = dry_run(shapes_from_the_loop, torch.nn.Linear(4, 2))
    changes = {h.line: h for h in report.by_kind(HazardKind.SHAPE_CHANGE)}
    made = changes[line_of(shapes_from_the_loop, "torch.randn(i + 1, 4)")]
    used = changes[line_of(shapes_from_the_loop, "model(x).sum()")]
    # Reported as the DataLoader's short last batch is: input shapes, the first and a new one.
    assert made.detail.startswith("4 input shapes, e.g. [1, 4] and then [2, 4]")
    assert used.count == 3 and "[1, 4]" in used.detail


def loop_count_changes(x: torch.Tensor) -> None:
    for i in range(5):
        h = x * 2
        for _ in range(i % 2 + 1):
            h = h.tanh()


def test_a_python_loop_whose_count_changes_is_a_recompilation() -> None:
    report = dry_run(loop_count_changes, torch.randn(3))
    [change] = report.by_kind(HazardKind.SHAPE_CHANGE)
    assert change.line == line_of(loop_count_changes, "h = h.tanh()")
    assert "the number of ops changes from run to run" in change.causes
    # A fixed count is no change.
    steady = dry_run(lambda x: [(x * 2, x.tanh().tanh()) for _ in range(4)], torch.randn(3))
    assert steady.by_kind(HazardKind.SHAPE_CHANGE) == []


def changing_exponent(w: torch.Tensor) -> None:
    for i in range(4):
        loss = (w ** (1.5 + 0.1 * i)).sum()
        loss.backward()


def test_a_changing_exponent_in_a_differentiated_power_is_a_recompilation() -> None:
    report = dry_run(changing_exponent, torch.randn(3, requires_grad=True))
    lines = report.lines(HazardKind.SHAPE_CHANGE)
    assert line_of(changing_exponent, "w ** (1.5") in lines
    # The same power without autograd keeps its exponent as data on XLA: no change.
    plain = dry_run(
        lambda w: [(w * 2, (w ** (1.5 + 0.1 * i)).sum()) for i in range(4)], torch.randn(3)
    )
    assert plain.by_kind(HazardKind.SHAPE_CHANGE) == []


# -- code the dry-run code calls, and loops with a backward pass (issue 28) ----------------------


def _local_module(tmp_path, monkeypatch, name: str, text: str):  # type: ignore[no-untyped-def]
    import importlib

    (tmp_path / f"{name}.py").write_text(text, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module(name)


def test_hazards_in_a_local_module_are_reported_at_its_line_and_the_call(
    tmp_path, monkeypatch
) -> None:
    from gpu2tpu.readiness.dryrun import DryRunDetector
    from gpu2tpu.readiness.user_code import UserCode

    helpers = _local_module(
        tmp_path,
        monkeypatch,
        "g2t_generate_helpers",
        "import torch\n\n"
        "def generate(idx, n):\n"
        "    for _ in range(n):\n"
        "        nxt = idx[:, -1:] + 1\n"
        "        idx = torch.cat((idx, nxt), dim=1)\n"
        "    return idx.sum().item()\n",
    )

    def cell() -> float:
        return helpers.generate(torch.zeros(1, 2), 4)

    here = cell.__code__.co_filename
    detector = DryRunDetector({here}, "cell", user_code=UserCode(cells={}, root=tmp_path))
    with detector:
        cell()
    report = detector.report()
    call = line_of(cell, "helpers.generate")
    changes = {h.source_line: h for h in report.by_kind(HazardKind.SHAPE_CHANGE)}
    change = changes[6]
    assert (change.source, change.line) == ("g2t_generate_helpers.py", call)
    assert change.code == "idx = torch.cat((idx, nxt), dim=1)"
    assert change.where() == f"g2t_generate_helpers.py line 6 (from line {call})"
    [sync] = report.by_kind(HazardKind.HOST_SYNC)
    assert (sync.source_line, sync.line) == (7, call)
    assert change.to_dict()["source"] == "g2t_generate_helpers.py"
    # without the local module in the user's code, everything lands on the call: no loop seen
    blind = DryRunDetector({here}, "cell", user_code=UserCode(cells={}, root=None))
    with blind:
        cell()
    assert blind.report().by_kind(HazardKind.SHAPE_CHANGE) == []


def backward_only(model: torch.nn.Module) -> None:
    for n in (3, 5, 7, 9):
        model(torch.randn(n, 6)).sum().backward()


def backward_only_one_line(model: torch.nn.Module) -> None:
    for n in (3, 5, 7, 9): model(torch.randn(n, 6)).sum().backward()  # fmt: skip  # noqa: E701


@pytest.mark.parametrize("fn", [backward_only, backward_only_one_line])
def test_a_loop_with_a_backward_pass_and_new_batch_sizes_is_a_shape_change(fn) -> None:
    report = dry_run(fn, torch.nn.Linear(6, 1))
    [change] = report.by_kind(HazardKind.SHAPE_CHANGE)
    assert change.line == line_of(fn, ".backward()") and change.count == 3


def forward_loop_inside_step(model: torch.nn.Module, x: torch.Tensor) -> None:
    for _ in range(3):
        model(x).sum().backward()


def test_layers_of_different_widths_in_a_model_are_no_shape_change(tmp_path, monkeypatch) -> None:
    """The dry run follows calls into the user's model code; the layers of one forward pass
    are one run of the line that called the model, whatever their widths."""
    from gpu2tpu.readiness.dryrun import DryRunDetector
    from gpu2tpu.readiness.user_code import UserCode

    models = _local_module(
        tmp_path,
        monkeypatch,
        "g2t_widening_model",
        "import torch\n\n"
        "class Widening(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.layers = torch.nn.ModuleList(\n"
        "            [torch.nn.Linear(8, 16), torch.nn.Linear(16, 32), torch.nn.Linear(32, 3)]\n"
        "        )\n\n"
        "    def forward(self, x):\n"
        "        for layer in self.layers:\n"
        "            x = layer(x).relu()\n"
        "            x = x * 1.0\n"
        "        return x\n",
    )
    here = forward_loop_inside_step.__code__.co_filename
    detector = DryRunDetector({here}, "step", user_code=UserCode(cells={}, root=tmp_path))
    with detector:
        forward_loop_inside_step(models.Widening(), torch.randn(4, 8))
    report = detector.report()
    assert report.by_kind(HazardKind.SHAPE_CHANGE) == []
    assert report.op_counts()["aten.addmm"] == 3 * 3  # three layers, three steps: all seen
    # the same model with new batch sizes each step is reported, at the model's own lines
    detector = DryRunDetector({here}, "step", user_code=UserCode(cells={}, root=tmp_path))
    model = models.Widening()
    with detector:
        for n in (4, 5, 6):
            forward_loop_inside_step(model, torch.randn(n, 8))
    sources = {(h.source, h.source_line) for h in detector.report().by_kind("shape change")}
    assert ("g2t_widening_model.py", 12) in sources


def test_the_html_view_places_a_hazard_in_an_earlier_cell() -> None:
    from collections import Counter

    from gpu2tpu.readiness.dryrun import Hazard

    report = DryRunReport(
        label="In[5]",
        filename=None,
        seconds=0.001,
        hazards=[
            Hazard(
                HazardKind.SHAPE_CHANGE,
                2,
                3,
                Counter({"aten.cat": 3}),
                source="In[3]",
                source_line=6,
            )
        ],
        ops={"aten.cat": Counter({2: 4})},
    )
    assert "In[3] line 6 (from line 2)" in report._repr_html_()
    assert "In[3] line 6 (from line 2)" in str(report)
