"""End to end: a realistic CUDA-first training script, rewritten by every rule family.

The script (tests/fixtures/e2e/train_cuda.py) uses AMP autocast and GradScaler, TF32 and cuDNN
flags, seeds, memory logging, CUDA-event timing, `.cuda()`, device strings, the
`is_available` idiom, a checkpoint round trip, and DDP over NCCL when LOCAL_RANK is set.
The rewrite runs with every rule that exists at test time (safe fixes, as `gpu2tpu rewrite`
applies them), so the checks are properties of the output, not its exact text:

1. the output names no `torch.cuda` API, holds no `"cuda"` string and calls no `.cuda()`;
2. it runs on this CPU-only machine;
3. its per-step losses equal the original's, run with CUDA mapped to the CPU (same seed).

"Mapped to the CPU" is a small shim (`CUDA_ON_CPU` below) that sends every CUDA request of the
original to the CPU, as a runtime patcher such as Ascend's transfer_to_npu would: `.cuda()`
and `"cuda"` devices become the CPU, CUDA autocast and GradScaler act on the CPU, CUDA events
read the wall clock, and NCCL becomes gloo.
"""

from __future__ import annotations

import ast
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, QualifiedNameProvider

from gpu2tpu.rewrite.core.model import Options, Result
from gpu2tpu.rewrite.core.source import rewrite_source

SCRIPT = Path(__file__).parent / "fixtures" / "e2e" / "train_cuda.py"
STEPS = 4
LOSS_LINE = re.compile(r"^step (\d+) loss ([0-9.eE+-]+)", re.MULTILINE)

CUDA_ON_CPU = '''
"""Run a CUDA-first script with every CUDA request sent to the CPU: the test's baseline."""
import runpy
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.parallel


def on_cpu(device):
    if isinstance(device, torch.device | str) and str(device).startswith("cuda"):
        return "cpu"
    return device


tensor_to = torch.Tensor.to


def to(self, *args, **kwargs):
    args = tuple(on_cpu(a) for a in args)
    if "device" in kwargs:
        kwargs["device"] = on_cpu(kwargs["device"])
    return tensor_to(self, *args, **kwargs)


torch.Tensor.to = to
torch.Tensor.cuda = lambda self, device=None, non_blocking=False, **kw: self.to("cpu")
torch.nn.Module.cuda = lambda self, device=None: self.to("cpu")


class CpuAutocast(torch.amp.autocast):
    def __init__(self, device_type, *args, **kwargs):
        super().__init__(on_cpu(device_type), *args, **kwargs)


def cuda_autocast(enabled=True, dtype=None, cache_enabled=True):
    return CpuAutocast("cpu", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


torch.autocast = torch.amp.autocast = CpuAutocast
torch.cuda.amp.autocast = cuda_autocast
torch.cuda.amp.GradScaler = lambda *args, **kwargs: torch.amp.GradScaler("cpu", *args, **kwargs)


class WallClockEvent:
    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self.at = None

    def record(self, stream=None):
        self.at = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end.at - self.at) * 1000.0


torch.cuda.Event = WallClockEvent
torch.cuda.synchronize = lambda device=None: None
torch.cuda.set_device = lambda device: None
torch.cuda.reset_peak_memory_stats = lambda device=None: None
torch.cuda.max_memory_allocated = lambda device=None: 0
torch.cuda.empty_cache = lambda: None

torch_load = torch.load
torch.load = lambda f, *a, map_location=None, **k: torch_load(f, *a, map_location=on_cpu(map_location), **k)

init_process_group = dist.init_process_group


def gloo_process_group(backend=None, *args, **kwargs):
    return init_process_group("gloo" if backend == "nccl" else backend, *args, **kwargs)


dist.init_process_group = gloo_process_group


class CpuDDP(torch.nn.parallel.DistributedDataParallel):
    def __init__(self, module, device_ids=None, output_device=None, **kwargs):
        super().__init__(module, **kwargs)


torch.nn.parallel.DistributedDataParallel = CpuDDP

script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
'''


@pytest.fixture(scope="module")
def rewritten(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Result]:
    """The script rewritten with every rule (safe fixes), written next to a copy of the original."""
    text = SCRIPT.read_text()
    result = rewrite_source(text, Options())
    folder = tmp_path_factory.mktemp("e2e")
    (folder / "train_cuda.py").write_text(text)
    out = folder / "train_rewritten.py"
    out.write_text(result.new_text)
    (folder / "cuda_on_cpu.py").write_text(CUDA_ON_CPU)
    return out, result


def _docstrings(tree: ast.AST) -> set[int]:
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def cuda_strings(text: str) -> list[str]:
    """`line: source` of each string literal (f-string parts included, docstrings aside) that
    mentions `cuda`."""
    tree = ast.parse(text)
    skip = _docstrings(tree)
    lines = text.splitlines()
    return [
        f"{node.lineno}: {lines[node.lineno - 1].strip()}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in skip
        and "cuda" in node.value
    ]


def cuda_method_calls(text: str) -> list[int]:
    """Lines with a `.cuda(...)` call."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "cuda"
    ]


class _TorchCudaNames(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (QualifiedNameProvider,)

    def __init__(self) -> None:
        super().__init__()
        self.found: set[str] = set()

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.Name | cst.Attribute):
            for q in self.get_metadata(QualifiedNameProvider, node, set()):
                if re.match(r"torch\.cuda(\.|$)", q.name):
                    self.found.add(q.name)
        return True


def torch_cuda_references(text: str) -> list[str]:
    """Every name in the text that resolves to `torch.cuda` or below (calls, imports, aliases)."""
    names = _TorchCudaNames()
    MetadataWrapper(cst.parse_module(text)).visit(names)
    return sorted(names.found)


def test_the_original_is_what_the_checks_look_for() -> None:
    """The checks find what they should in the original, so their silence below means something."""
    text = SCRIPT.read_text()
    assert "torch.cuda.amp.autocast" in torch_cuda_references(text)
    assert "torch.cuda.Event" in torch_cuda_references(text)
    assert any('y.to("cuda"' in line for line in cuda_strings(text))
    assert cuda_method_calls(text)


def cuda_only_selection(text: str, entry: str) -> bool:
    """`if <device>.type == "cuda":` around `set_device_index(local_rank)`, or `<rank> if
    <device>.type == "cuda" else ...` (DDP's `device_ids`, `.to(rank)`, the rank's device
    string of a device choice, where the device is `torch.accelerator.current_accelerator()`):
    the rewrite selects a rank's device index on CUDA only (a TPU process owns index 0), on
    purpose."""
    number, _, line = entry.partition(": ")
    following = text.splitlines()[int(number)] if int(number) < len(text.splitlines()) else ""
    if re.search(r' if [\w.()]+\.type == "cuda" else ', line):
        return True
    return (
        re.fullmatch(r'if \w+\.type == "cuda":', line) is not None
        and "torch.accelerator.set_device_index(" in following
    )


def test_rewritten_script_names_no_cuda(rewritten: tuple[Path, Result]) -> None:
    out, result = rewritten
    text = out.read_text()
    assert torch_cuda_references(text) == []
    assert [s for s in cuda_strings(text) if not cuda_only_selection(text, s)] == []
    assert cuda_method_calls(text) == []
    assert "gpu2tpu" not in text
    again = rewrite_source(text, Options())
    assert again.new_text == text, "a second rewrite changed the script"


TORCHRUN_VARIABLES = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _run(args: list[str], cwd: Path, torchrun: dict[str, str]) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARIABLES}
    env.update(
        CUDA_VISIBLE_DEVICES="",  # the CPU-only machine of the issue, even on a GPU host
        TORCH_DEVICE_BACKEND_AUTOLOAD="0",
        OMP_NUM_THREADS="1",
        PYTHONHASHSEED="0",
        **torchrun,
    )
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _losses(proc: subprocess.Popen, what: str) -> list[float]:
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"{what} failed:\n{stderr[-3000:]}"
    steps = LOSS_LINE.findall(stdout)
    assert [int(s) for s, _ in steps] == list(range(STEPS)), f"{what} printed:\n{stdout}"
    assert "accuracy" in stdout and "reloaded 6 tensors" in stdout, stdout
    return [float(loss) for _, loss in steps]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _train_both(out: Path, distributed: bool) -> tuple[list[float], list[float]]:
    """Losses of the original (CUDA mapped to the CPU) and of the rewrite, run side by side;
    `distributed` sets torchrun's variables for a one-process group."""

    def torchrun() -> dict[str, str]:
        if not distributed:
            return {}
        return {
            "LOCAL_RANK": "0",
            "RANK": "0",
            "WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(_free_port()),
        }

    folder = out.parent
    args = ["--steps", str(STEPS)]
    original = _run(
        ["cuda_on_cpu.py", "train_cuda.py", *args, "--checkpoint", "original.pt"],
        folder,
        torchrun(),
    )
    rewrite = _run([out.name, *args, "--checkpoint", "rewritten.pt"], folder, torchrun())
    return (
        _losses(original, "the original under the CUDA-on-CPU shim"),
        _losses(rewrite, "the rewritten script"),
    )


@pytest.mark.slow
def test_rewritten_script_trains_like_the_original(rewritten: tuple[Path, Result]) -> None:
    out, _ = rewritten
    original, rewrite = _train_both(out, distributed=False)
    assert rewrite == pytest.approx(original, rel=1e-5, abs=1e-6)
    assert len(set(original)) > 1, "the losses should move as the model trains"


@pytest.mark.slow
def test_rewritten_script_trains_under_torchrun_variables(rewritten: tuple[Path, Result]) -> None:
    """With LOCAL_RANK set the script takes its DDP path: one process, its own process group."""
    out, _ = rewritten
    original, rewrite = _train_both(out, distributed=True)
    assert rewrite == pytest.approx(original, rel=1e-5, abs=1e-6)


RUNTIME_IDIOMS = """
import torch
from torch.cuda.amp import GradScaler, autocast

torch.backends.cuda.matmul.allow_tf32 = True
torch.manual_seed(0)
torch.cuda.manual_seed_all(0)
generator = torch.Generator(device="cuda")
torch.cuda.empty_cache()
torch.cuda.reset_peak_memory_stats()
used = torch.cuda.memory_allocated() + torch.cuda.max_memory_allocated()
held = torch.cuda.memory_reserved() + torch.cuda.max_memory_reserved()
stats = torch.cuda.memory_stats()
free, total = torch.cuda.mem_get_info()
weights = torch.cuda.FloatTensor([0.25, 0.75])
scratch = torch.cuda.LongTensor(2, 3)
scaler = GradScaler()
start = torch.cuda.Event(enable_timing=True)
end = torch.cuda.Event(enable_timing=True)
start.record()
with torch.cuda.nvtx.range("matmul"), autocast():
    product = torch.ones(4, 4) @ torch.ones(4, 4)
end.record()
torch.cuda.synchronize()
elapsed_ms = start.elapsed_time(end)
try:
    big = torch.empty(2, device="cuda")
except torch.cuda.OutOfMemoryError:
    big = None
print("RESULT", used, held, dict(stats), (free, total), weights.tolist(), tuple(scratch.shape),
      product.dtype, elapsed_ms >= 0, big is not None)
"""

RUN_BOTH = """
import sys
source = open(sys.argv[1]).read()
try:
    exec(compile(source, sys.argv[1], "exec"), {"__name__": "__main__"})
except Exception as err:
    print("FAILED", type(err).__name__, str(err).splitlines()[0])
"""


@pytest.mark.slow
def test_rewritten_runtime_idioms_run_without_a_gpu(tmp_path: Path) -> None:
    """Memory, RNG, event, legacy-tensor and AMP rewrites (unsafe ones included) run where the
    CUDA originals fail: on a machine with a CUDA build of torch and no GPU, or with no CUDA.
    (`torch.cuda.get_rng_state()` is reported, not rewritten: G2T308.)"""
    result = rewrite_source(RUNTIME_IDIOMS, Options(unsafe_fixes=True))
    assert torch_cuda_references(result.new_text) == []
    (tmp_path / "original.py").write_text(RUNTIME_IDIOMS)
    (tmp_path / "rewritten.py").write_text(result.new_text)
    (tmp_path / "run.py").write_text(RUN_BOTH)
    runs = {
        name: _run(["run.py", f"{name}.py"], tmp_path, {}) for name in ("original", "rewritten")
    }
    outputs = {name: proc.communicate(timeout=300)[0] for name, proc in runs.items()}
    # The first CUDA call fails: RuntimeError, or torch's AcceleratorError (a device call).
    assert re.search(r"FAILED (Runtime|Accelerator)Error", outputs["original"]), outputs["original"]
    assert "FAILED" not in outputs["rewritten"], outputs["rewritten"]
    # An idle (absent) accelerator: no bytes, no statistics; the data and shapes survive.
    expected = "RESULT 0 0 {} (0, 0) [0.25, 0.75] (2, 3) torch.bfloat16 True True"
    assert expected in outputs["rewritten"], outputs["rewritten"]
