"""The PyTorch/XLA adapter against the real torch_xla on the CPU, and the stand-in against it."""

from __future__ import annotations

import copy
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path

import pytest
import torch

from gpu2tpu import backends
from gpu2tpu.backends.xla import XLABackend

STANDIN = Path(__file__).resolve().parent.parent / "standins" / "torch_xla"


@pytest.fixture(scope="module")
def xla() -> XLABackend:
    backend = backends.get_backend("xla")
    assert isinstance(backend, XLABackend)
    return backend


def test_the_real_backend_runs_on_xla_cpu(xla: XLABackend) -> None:
    import torch_xla

    dev = xla.device()
    assert dev == torch_xla.device() and dev.type == "xla"
    chip = xla.chip()
    assert (chip.name, chip.kind) == ("XLA CPU", "cpu") and chip.count >= 1
    # On the CPU, `auto` does not pick torch_xla, and says why.
    assert XLABackend.auto_skip_reason() == (
        "torch_xla is installed but would run on the CPU (PJRT_DEVICE=CPU)"
    )
    assert backends.choose_backend("auto")[0].name == "cpu"
    assert XLABackend.version() == torch_xla.__version__.split("+")[0]


def test_compile_events_count_real_compilations_and_their_time(xla: XLABackend) -> None:
    import torch_xla.debug.metrics as met

    dev = xla.device()
    count0, seconds0 = xla.compilation_count(), xla.compilation_seconds()
    x = torch.randn(7, 3, device=dev)
    (x * 2 + 1).sum()
    xla.synchronize()
    count1, seconds1 = xla.compilation_count(), xla.compilation_seconds()
    assert count1 == count0 + 1 and seconds1 > seconds0
    data = met.metric_data("CompileTime")
    assert (count1, seconds1) == (data[0], data[1] / 1e9)
    # The same graph again comes from the cache: no compilation, no compile time.
    (torch.randn(7, 3, device=dev) * 2 + 1).sum()
    xla.synchronize()
    assert (xla.compilation_count(), xla.compilation_seconds()) == (count1, seconds1)


def test_fallbacks_and_host_reads_are_read_from_torch_xla(xla: XLABackend) -> None:
    import torch.nn.functional as F

    dev = xla.device()
    before, reads = xla.fallback_ops(), xla.host_reads()
    pooled = F.fractional_max_pool2d(torch.randn(1, 1, 8, 8, device=dev), 2, output_size=(4, 4))
    value = pooled.sum().item()
    after = xla.fallback_ops()
    grew = {op for op, n in after.items() if n > before.get(op, 0)}
    assert grew == {"aten::fractional_max_pool2d"}
    assert xla.host_reads() == reads + 1 and isinstance(value, float)


def test_memory_is_unknown_on_the_cpu_rather_than_an_error(xla: XLABackend) -> None:
    import torch_xla.core.xla_model as xm

    # PJRT's CPU client keeps no allocator statistics: torch_xla raises, the adapter says
    # "unknown" (None), as the profiler expects.
    with pytest.raises(RuntimeError, match="UNIMPLEMENTED"):
        xm.get_memory_info(xla.device())
    assert xla.memory() is None


def _standin_modules() -> list[str]:
    """The stand-in's modules by their real names ("torch_xla.debug.metrics")."""
    names = []
    for path in sorted(STANDIN.rglob("*.py")):
        parts = path.relative_to(STANDIN.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _load_standin(name: str):  # type: ignore[no-untyped-def]
    """Import a stand-in module under a private name, beside the real torch_xla."""
    relative = name.split(".")[1:]
    path = STANDIN.joinpath(*relative)
    file = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    spec = importlib.util.spec_from_file_location(f"_standin_{name.replace('.', '_')}", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", _standin_modules())
def test_the_standin_has_the_real_api(name: str) -> None:
    """Every function the stand-in defines exists in the real torch_xla with parameters that
    accept the same calls (the stand-in's parameter names are the real ones, in order)."""
    real = importlib.import_module(name)
    fake = _load_standin(name)
    functions = {
        n: f
        for n, f in vars(fake).items()
        if inspect.isfunction(f) and not n.startswith("_") and f.__module__ == fake.__name__
    }
    for fname, fake_fn in functions.items():
        assert hasattr(real, fname), f"{name}.{fname} is not in the real torch_xla"
        real_params = list(inspect.signature(getattr(real, fname)).parameters)
        fake_params = list(inspect.signature(fake_fn).parameters)
        assert real_params[: len(fake_params)] == fake_params, (
            f"{name}.{fname}: stand-in takes {fake_params}, torch_xla takes {real_params}"
        )


def test_the_standin_metrics_answer_in_the_real_shape() -> None:
    """metric_data gives (samples, accumulator, ((time, value), ...)) in both."""
    import torch_xla
    import torch_xla.debug.metrics as met

    # Kept alive, so that the sync has a graph to compile even as the process's first test.
    kept = (torch.ones(2, device=torch_xla.device()) + 1).sum()
    torch_xla.sync()
    real = met.metric_data("CompileTime")
    assert kept.item() == 4
    fake = _load_standin("torch_xla.debug.metrics").metric_data("CompileTime")
    assert len(real) == len(fake) == 3
    assert [type(v) for v in real[:2]] == [int, float] == [type(v) for v in fake[:2]]
    for recent in (real[2], fake[2]):
        assert isinstance(recent, tuple) and all(len(pair) == 2 for pair in recent)
    assert fake[1] == sum(value for _, value in fake[2])  # as real's, until its window fills
    assert "torch_xla" in sys.modules and "stand" not in (sys.modules["torch_xla"].__doc__ or "")


def test_activate_leaves_host_data_on_the_host(xla: XLABackend) -> None:
    """A CUDA notebook builds its data on the host and moves it; under the backend it still
    does: a tensor made without a device is a CPU tensor, and a DataLoader that pins its
    batches (torch asks its own accelerator, which XLA is not) yields them."""
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.randn(8, 3), torch.arange(8))
    with xla.activate() as dev:
        assert torch.empty(2).device.type == "cpu"
        assert torch.accelerator.current_accelerator(check_available=True) == torch.device("xla")
        batches = [
            (x.to(dev), y.to(dev)) for x, y in DataLoader(data, batch_size=4, pin_memory=True)
        ]
    assert [x.device.type for x, _ in batches] == ["xla", "xla"]
    assert torch.cat([y for _, y in batches]).cpu().tolist() == list(range(8))


def test_each_optimizer_step_ends_a_graph(xla: XLABackend) -> None:
    """A CUDA training loop has no `torch_xla.sync()`: without a cut, each step's weights
    update joins the next step's graph, so every step compiles a new, larger graph. Under the
    backend the optimizer step is the cut: after a warm-up, steps compile nothing, as with
    PyTorch/XLA's own `xm.optimizer_step(opt, barrier=True)`."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 3))
    data = [(torch.randn(5, 6), torch.randint(0, 3, (5,))) for _ in range(7)]

    def steps(count: int) -> list[int]:
        compiled = []
        for x, y in data[:count]:
            before = xla.compilation_count()
            loss = torch.nn.functional.cross_entropy(model(x.to(dev)), y.to(dev))
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss.item()
            compiled.append(xla.compilation_count() - before)
        return compiled

    with xla.activate() as dev:
        model.to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        compiled = steps(7)
    assert sum(compiled[3:]) == 0, compiled
    # Outside the backend nothing cuts the graph any more: the next steps compile again.
    assert sum(steps(3)) >= 2


def test_inference_mode_runs_as_no_grad_and_says_so(
    xla: XLABackend, capsys: pytest.CaptureFixture[str]
) -> None:
    """torch_xla 2.9 cannot run an op in inference mode on weights made outside it; under
    the backend `torch.inference_mode` (called, bare, or as a context) is `no_grad`, with
    one line that says so, and torch's own class comes back afterwards."""
    from gpu2tpu.backends import xla as adapter

    real = torch.inference_mode
    lin = torch.nn.Linear(4, 3)
    x = torch.ones(2, 4)
    want = lin(x).detach()
    dev = xla.device()
    on_xla = copy.deepcopy(lin).to(dev)
    with pytest.raises(RuntimeError, match="version_counter for inference tensor"), real():
        on_xla(x.to(dev)).cpu()
    adapter._noted.clear()
    with xla.activate() as dev:
        called = torch.inference_mode()(lambda t: on_xla(t.to(dev)))
        bare = torch.inference_mode(lambda t: on_xla(t.to(dev)))
        with torch.inference_mode():
            inside = on_xla(x.to(dev))
        results = [called(x), bare(x), inside]
    assert all(not r.requires_grad and torch.allclose(r.cpu(), want, atol=1e-6) for r in results)
    assert capsys.readouterr().err == adapter.INFERENCE_MODE_NOTE  # once
    assert torch.inference_mode is real
