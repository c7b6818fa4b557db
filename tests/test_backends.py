"""The backends: selection, the CPU and torchax paths for real, TorchTPU and XLA via stand-ins."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch
from standins import forget_standins, use_standins

from gpu2tpu.backends import (
    BACKEND_NAMES,
    BackendUnavailable,
    UnknownBackend,
    ask_backends,
    available_backends,
    backend_class,
    chip_kind,
    choose_backend,
    get_backend,
)
from gpu2tpu.backends.base import accelerator_answers, tpu_chips_on_pci


@pytest.fixture
def no_tpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine as it is here: neither TPU runtime importable, no PJRT_DEVICE."""
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    use_standins(monkeypatch)  # both stand-ins hidden
    yield
    forget_standins()


@pytest.fixture
def torch_tpu(monkeypatch: pytest.MonkeyPatch) -> None:
    use_standins(monkeypatch, "torch_tpu")
    yield
    forget_standins()


@pytest.fixture
def torch_xla(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    use_standins(monkeypatch, "torch_xla")
    yield
    forget_standins()


# -- names and errors --------------------------------------------------------------------------


def test_unknown_backend_lists_every_known_name() -> None:
    with pytest.raises(UnknownBackend) as err:
        get_backend("tpuv9")
    for name in BACKEND_NAMES:
        assert name in str(err.value)


def test_aliases_resolve_to_the_same_backend() -> None:
    assert backend_class("torchax") is backend_class("jax")
    assert backend_class("TORCH_XLA") is backend_class("xla")


def test_explicit_unavailable_backend_raises_with_install_command(no_tpu: None) -> None:
    with pytest.raises(BackendUnavailable) as err:
        get_backend("tpu")
    assert "pip install torch-tpu" in str(err.value)
    assert "torch_tpu not installed" in str(err.value)
    with pytest.raises(BackendUnavailable) as err:
        get_backend("xla")
    assert "pip install torch==2.9.0 'torch_xla[tpu]==2.9.0'" in str(err.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_unavailable_without_gpu_never_falls_back() -> None:
    with pytest.raises(BackendUnavailable, match="NVIDIA GPU"):
        get_backend("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_cuda_backend_on_a_gpu() -> None:
    cuda = get_backend("cuda")
    chip = cuda.chip()
    assert chip.count == torch.cuda.device_count() and chip.kind == chip_kind(chip.name)
    cuda.reset_peak_memory()
    with cuda.activate() as dev:
        assert torch.ones(2).device.type == "cpu"  # host data stays on the host
        block = torch.ones(2**20, device=dev)
        assert block.device.type == "cuda" and dev.type == "cuda"
        cuda.synchronize()
        mem = cuda.memory()
        assert mem.in_use_bytes >= 4 * 2**20 and mem.peak_bytes >= mem.in_use_bytes
        assert mem.total_bytes > mem.in_use_bytes
    assert torch.get_default_device().type == "cpu"


def test_auto_without_tpu_picks_cpu_dry_run_and_says_why(no_tpu: None) -> None:
    backend, reason = choose_backend("auto")
    assert backend.name == "cpu"
    assert reason == (
        "auto: no TPU backend found (torch_tpu, torch_xla not installed); falling back to the CPU"
    )
    assert get_backend("auto") is backend


def test_availability_check_does_not_import_absent_packages() -> None:
    code = (
        "import sys; import gpu2tpu.backends as b;"
        "assert 'torch' not in sys.modules, 'importing backends imported torch';"
        "b.backend_class('jax').is_available(); b.backend_class('tpu').is_available();"
        "b.backend_class('xla').is_available();"
        "heavy = [m for m in ('jax', 'torchax', 'torch_tpu', 'torch_xla', 'libtpu') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_available_backends_lists_all_with_reasons(no_tpu: None) -> None:
    statuses = {s.name: s for s in available_backends()}
    assert list(statuses) == [n for n in BACKEND_NAMES if n != "auto"]
    assert statuses["cpu"].available
    assert torch.__version__.startswith(statuses["cpu"].version)
    assert not statuses["tpu"].available
    assert statuses["tpu"].reason == "torch_tpu not installed"
    assert "pip install torch-tpu" in statuses["tpu"].install


# -- the CPU, for real ---------------------------------------------------------------------------


def test_cpu_backend_reports_host_memory_and_chip() -> None:
    cpu = get_backend("cpu")
    assert cpu.device() == torch.device("cpu")
    chip = cpu.chip()
    assert chip.kind == "cpu" and chip.count == 1 and chip.name
    cpu.reset_peak_memory()
    before = cpu.memory()
    assert before.in_use_bytes and before.total_bytes and before.in_use_bytes < before.total_bytes
    block = torch.ones(64 * 2**20, dtype=torch.uint8)  # 64 MiB touched
    block.add_(1)
    after = cpu.memory()
    assert after.peak_bytes >= before.in_use_bytes + 48 * 2**20
    del block
    assert cpu.compile(len) is len  # the dry run runs eager code
    assert cpu.compilation_count() is None


def test_activate_routes_the_accelerator_and_restores_it_on_error() -> None:
    original = torch.accelerator.current_accelerator
    cpu = get_backend("cpu")
    with pytest.raises(RuntimeError, match="half-way"), cpu.activate() as dev:
        assert dev.type == "cpu"
        # What the codemod's device expression evaluates to inside the block:
        chosen = torch.accelerator.current_accelerator(check_available=True) or torch.device("cpu")
        assert chosen.type == "cpu"
        raise RuntimeError("half-way")
    assert torch.accelerator.current_accelerator is original


def test_rewritten_device_and_memory_calls_answer_for_the_backend() -> None:
    """What the codemod writes for `torch.cuda.device_count()`, `max_memory_allocated()`,
    `reset_peak_memory_stats()`, ... answers from the backend, not from torch's own
    accelerator (on this machine CUDA without a GPU, which raises when asked)."""
    from gpu2tpu.backends import MemoryInfo

    resets: list[str] = []
    memory = torch.accelerator.memory
    originals = {n: getattr(memory, n) for n in ("max_memory_allocated", "memory_stats")}
    with accelerator_answers(
        torch.device("meta"),
        memory=lambda: MemoryInfo(in_use_bytes=10, peak_bytes=30, total_bytes=100),
        reset_peak=lambda: resets.append("peak"),
        count=lambda: 4,
    ):
        assert torch.accelerator.device_count() == 4
        assert torch.accelerator.current_device_index() == 0
        with torch.accelerator.device_index(0):
            torch.accelerator.set_device_index(0)
        assert memory.memory_allocated() == 10 and memory.max_memory_allocated() == 30
        assert memory.memory_stats()["allocated_bytes.all.peak"] == 30
        assert memory.get_memory_info() == (90, 100)
        memory.reset_peak_memory_stats()
        memory.empty_cache()
    assert resets == ["peak"]
    assert {n: getattr(memory, n) for n in originals} == originals
    with accelerator_answers(torch.device("meta"), memory=lambda: None):
        assert memory.max_memory_allocated() == 0 and memory.get_memory_info() == (0, 0)
        assert torch.accelerator.device_count() == 1


def test_torch_itself_gets_torchs_own_accelerator_answers() -> None:
    """The user's code asks for the backend's device; torch's modules keep their answers,
    so a DataLoader that pins its batches does not try to pin them for the backend (on
    PyTorch/XLA: "XLA device type not an accelerator")."""
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.arange(6.0).reshape(3, 2))
    # torch's own answer: none on a machine without an accelerator, or "jax" once an earlier
    # test in this process imported torchax, which registers it for the whole process.
    native = torch.accelerator.is_available()
    native_type = torch.accelerator.current_accelerator().type if native else None
    with accelerator_answers(torch.device("meta")), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "pin_memory ... no accelerator is found", as without us
        assert torch.accelerator.current_accelerator() == torch.device("meta")
        assert torch.accelerator.is_available()
        assert torch.empty(2).device.type == "cpu"  # no default device
        loader = iter(DataLoader(data, batch_size=2, pin_memory=True))
        assert (loader._pin_memory, loader._pin_memory_device) == (native, native_type)
        if not native:  # nothing to pin for: the batches come out as they are
            [batch] = next(loader)
            assert batch.device.type == "cpu" and batch.tolist() == [[0.0, 1.0], [2.0, 3.0]]


def test_accelerator_answers_calls_backend_synchronize() -> None:
    seen: list[str] = []
    with accelerator_answers(torch.device("meta"), synchronize=lambda: seen.append("sync")):
        assert torch.accelerator.current_accelerator() == torch.device("meta")
        assert torch.accelerator.is_available()
        torch.accelerator.synchronize()
    assert seen == ["sync"]


# -- TorchTPU and PyTorch/XLA through stand-ins -------------------------------------------------


def test_torchtpu_standin_is_picked_by_auto_and_adapts_its_calls(torch_tpu: None) -> None:
    import torch_tpu._loader as loader

    with warnings.catch_warnings():
        # TorchTPU warns on each experimental API; the adapter's own calls must not show them.
        warnings.simplefilter("error")
        backend, reason = choose_backend("auto")
        assert backend.name == "tpu"
        assert reason.startswith("auto: using TorchTPU") and "sees a TPU" in reason
        chip = backend.chip()
        assert (chip.name, chip.kind, chip.count) == ("TPU v5e", "v5e", 4)
        mem = backend.memory()
        # TorchTPU reports the chip's HBM only: in use and peak stay unknown.
        assert (mem.in_use_bytes, mem.peak_bytes, mem.total_bytes) == (None, None, 16 * 2**30)
        assert backend.compilation_count() == 7
    loader.synchronized.clear()
    backend.synchronize()  # through torch.accelerator: torch.tpu.synchronize is internal
    assert loader.synchronized == ["synchronize"]
    with pytest.raises(ValueError, match="half-way"), backend.activate() as dev:
        assert dev.type == "meta" and torch.empty(3).device.type == "cpu"
        assert torch.accelerator.current_accelerator(check_available=True) == dev
        torch.accelerator.synchronize()
        raise ValueError("half-way")
    assert loader.synchronized == ["synchronize", "synchronize"]
    assert torch.get_default_device().type == "cpu"


@pytest.mark.parametrize("mode", ["defer_and_fuse", "defer_never_and_launch_blocking"])
def test_torchtpu_eager_mode_is_entered_and_left(torch_tpu: None, mode: str) -> None:
    from gpu2tpu.backends.torchtpu import TorchTPUBackend

    before = torch.tpu.eager_mode
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with TorchTPUBackend(eager_mode=mode).activate():
            assert torch.tpu.eager_mode is torch.tpu.EagerMode[mode.upper()]
    assert torch.tpu.eager_mode is before
    known = "known modes: defer_and_fuse, defer_never, defer_never_and_launch_blocking"
    with pytest.raises(ValueError, match=known):
        TorchTPUBackend(eager_mode="fused")


def test_torchtpu_eager_mode_missing_from_the_runtime_is_named(
    torch_tpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpu2tpu.backends.torchtpu import TorchTPUBackend

    monkeypatch.delattr(torch.tpu, "set_eager_mode")
    backend = TorchTPUBackend(eager_mode="defer_never")
    with pytest.raises(RuntimeError, match="no torch.tpu.set_eager_mode"), backend.activate():
        pass
    assert torch.get_default_device().type == "cpu"


def test_torchtpu_without_chip_is_skipped_and_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    use_standins(monkeypatch, "torch_tpu", chips=0)
    try:
        backend, reason = choose_backend("auto")
        assert backend.name == "cpu"
        assert "torch_tpu is installed but found no TPU chip" in reason
        with pytest.raises(BackendUnavailable, match="found no TPU chip"):
            get_backend("tpu")
    finally:
        forget_standins()


# -- one backend's failure never breaks the question about all of them -------------------------


def _raising_reason(cls: type) -> str | None:
    # What the adapter once did, and what TorchTPU 0.2.0 forbids from outside torch.
    return "found" if torch.tpu.is_available() else None


INTERNAL = "is_available is internal to TorchTPU"


def test_backend_raising_when_asked_is_listed_unavailable(
    torch_tpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpu2tpu.backends.torchtpu import TorchTPUBackend

    monkeypatch.setattr(TorchTPUBackend, "unavailable_reason", classmethod(_raising_reason))
    statuses = {s.name: s for s in available_backends()}
    assert not statuses["tpu"].available
    assert statuses["tpu"].reason.startswith(
        f"failed when asked whether it runs here (RuntimeError: {INTERNAL}"
    )
    assert "\n" not in statuses["tpu"].reason
    assert statuses["cpu"].available
    backend, reason = choose_backend("auto")
    assert backend.name == "cpu"
    assert f"tpu failed when asked (RuntimeError: {INTERNAL}" in reason
    with pytest.raises(BackendUnavailable, match=INTERNAL):
        get_backend("tpu")


def test_backend_raising_when_asked_for_its_chip_is_listed_unavailable(
    torch_tpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpu2tpu.backends.torchtpu import TorchTPUBackend

    def chip(self: object) -> None:
        torch.tpu.device_count()  # internal in TorchTPU 0.2.0

    monkeypatch.setattr(TorchTPUBackend, "chip", chip)
    reports = {r.status.name: r for r in ask_backends(describe=lambda name: name != "jax")}
    tpu = reports["tpu"]
    assert not tpu.status.available and tpu.chip is None
    assert tpu.status.reason.startswith(
        "TorchTPU is installed but failed when asked for its chip (RuntimeError: device_count "
        "is internal to TorchTPU"
    )
    assert reports["cpu"].status.available and reports["cpu"].chip.kind == "cpu"
    assert reports["tpu"].to_dict()["reason"] == tpu.status.reason


def test_adapter_that_fails_to_load_is_listed_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu2tpu import backends

    monkeypatch.setitem(backends._REGISTRY, "xla", ("no_such_adapter", "Nothing"))
    statuses = {s.name: s for s in available_backends()}
    assert not statuses["xla"].available
    assert statuses["xla"].reason.startswith(
        "gpu2tpu's no_such_adapter adapter failed to load (ModuleNotFoundError:"
    )
    assert statuses["cpu"].available


def test_torch_tpu_that_fails_to_import_is_named(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_standins(monkeypatch)  # both stand-ins hidden; a broken torch_tpu goes first
    broken = tmp_path / "torch_tpu"
    broken.mkdir()
    (broken / "__init__.py").write_text(
        "raise RuntimeError('Failed to load the backend extension: torch_tpu.\\nmore')\n"
    )
    monkeypatch.delitem(sys.modules, "torch_tpu")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        status = backend_class("tpu").status()
        assert status.reason == (
            "torch_tpu is installed but failed to import "
            "(RuntimeError: Failed to load the backend extension: torch_tpu.)"
        )
        assert choose_backend("auto")[0].name == "cpu"
    finally:
        forget_standins()


def test_xla_standin_runs_when_asked_but_auto_needs_a_tpu(torch_xla: None, monkeypatch) -> None:
    backend, reason = choose_backend("auto")
    if tpu_chips_on_pci() == 0:
        assert backend.name == "cpu"
        assert "torch_xla is installed but would run on the CPU" in reason
    xla = get_backend("xla")  # an explicit request works without a TPU
    assert xla.device().type == "meta"
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    backend, reason = choose_backend("auto")
    assert backend.name == "xla" and reason.startswith("auto: using PyTorch/XLA")
    chip = xla.chip()
    assert (chip.name, chip.kind, chip.count) == ("v5litepod-4", "v5e", 4)
    assert xla.compilation_count() == 3
    mem = xla.memory()
    assert (mem.in_use_bytes, mem.peak_bytes, mem.total_bytes) == (2048, 8192, 16 * 2**30)
    import torch_xla
    import torch_xla.core.xla_model as xm

    syncs, waits = torch_xla.syncs, xm.waits
    xla.synchronize()
    assert (torch_xla.syncs, xm.waits) == (syncs + 1, waits + 1)
    with xla.activate():
        # XLA is no torch accelerator: rewritten code still finds the XLA device.
        assert torch.accelerator.current_accelerator(check_available=True).type == "meta"
    assert torch.get_default_device().type == "cpu"


def test_auto_prefers_torchtpu_over_xla(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    use_standins(monkeypatch, "torch_tpu", "torch_xla")
    try:
        assert choose_backend("auto")[0].name == "tpu"
    finally:
        forget_standins()


# -- torchax on JAX's CPU platform, for real ---------------------------------------------------


# torchax makes "jax" torch's accelerator for the whole process once imported, so every test
# that imports it runs in a child process and leaves this one as it was.
JAX_FORWARD = """
import torch
from gpu2tpu.backends import get_backend
jax_backend = get_backend("jax")
chip = jax_backend.chip()
assert chip.kind == "cpu" and chip.count >= 1, chip
assert "torchax" not in __import__("sys").modules, "asking for the chip loaded torchax"
model = torch.nn.Linear(4, 2)
x = torch.randn(3, 4)
expected = model(x)
before = jax_backend.compilation_count()
with jax_backend.activate() as dev:
    assert dev.type == "jax"
    assert torch.accelerator.current_accelerator(check_available=True).type == "jax"
    torch.accelerator.synchronize()  # torchax leaves it broken; activate() routes it
    model_jax = model.to(dev)
    compiled = jax_backend.compile(model_jax)
    out = compiled(x.to(dev))
    assert torch.allclose(out.to("cpu"), expected, atol=1e-5)
assert jax_backend.compilation_count() > before
assert torch.get_default_device().type == "cpu"
"""


def run_python(code: str) -> None:
    """Run `code` in a fresh interpreter with JAX on its CPU platform; fail on any error."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_jax_backend_runs_forward_compiles_and_counts() -> None:
    run_python(JAX_FORWARD)


def test_jax_backend_explains_backward_limitation() -> None:
    jax_backend = get_backend("jax")
    error = RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn")
    note = jax_backend.explain_failure(error, "loss.backward()")
    assert "backward" in note and "functional route" in note
    assert jax_backend.explain_failure(ValueError("shape"), "y = m(x)") is None


# -- helpers -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("TPU v5 lite", "v5e"),
        ("TPU v5e", "v5e"),
        ("TPU v6 lite", "v6e"),
        ("TPU v5", "v5p"),
        ("TPU v5p", "v5p"),
        ("TPU v4", "v4"),
        ("TPU7x", "tpu7x"),
        ("TPU v7", "tpu7x"),  # TorchTPU's names, from the PCI device id
        ("TPU", "tpu"),  # TorchTPU's name when it knows no chip
        ("v5litepod-8", "v5e"),
        ("v6e-8", "v6e"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
        ("NVIDIA L4", "l4"),
        ("Tesla T4", "t4"),
        ("NVIDIA H200", "h200"),
        ("Some New Chip", "some-new-chip"),
    ],
)
def test_chip_kind(name: str, kind: str) -> None:
    assert chip_kind(name) == kind


def test_tpu_chips_on_pci_counts_google_devices(tmp_path) -> None:
    for i, vendor in enumerate(["0x1ae0", "0x8086", "0x1ae0"]):
        (tmp_path / f"0000:00:0{i}.0").mkdir()
        (tmp_path / f"0000:00:0{i}.0" / "vendor").write_text(vendor + "\n")
    assert tpu_chips_on_pci(str(tmp_path)) == 2
    assert tpu_chips_on_pci(str(tmp_path / "absent")) == 0
