"""`%%tpu --backend xla` in a real Jupyter kernel of the XLA environment (nbclient).

The kernel is this environment's own Python (.venv-xla), so the cells run on the real
torch_xla, on `xla:0` (PJRT_DEVICE=CPU): a CUDA training cell is rewritten and trains there,
its results stay in the notebook's namespace, `--profile` reports XLA's own compile events,
an error names the user's line, and the project's migrated GPT script and its example
notebooks run top to bottom through `%%tpu --backend xla` and through auto mode with the
losses (and predictions) of a CPU run.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[2]
GPT = ROOT / "examples" / "migrated" / "train_gpt.py"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
ITER_LINE = re.compile(r"^iter (\d+): loss ([0-9.]+),", re.MULTILINE)
GPT_ARGV = ["train_gpt.py", "--compile=False", "--max_iters=3", "--eval_interval=100"]
GPT_ARGV += ["--dtype='float32'", "--eval_iters=1", "--n_layer=1", "--n_embd=32", "--n_head=2"]
GPT_ARGV += ["--block_size=16", "--batch_size=4", "--gradient_accumulation_steps=1"]

# One xdist worker runs the module: its kernels are started once, in the module's fixture.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("xla-notebooks")]

TRAINING_CELL = """%%tpu --backend xla
import torch
import torch.nn as nn

torch.manual_seed(0)
device = torch.device("cuda")
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(32, 8).cuda()
y = (x.sum(1) > 0).long().to(device)
losses = []
for _ in range(5):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    losses.append(loss.item())
print("trained on", next(model.parameters()).device)
"""


def _run(cells: list[str], tmp_path: Path, allow_errors: bool = False) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    env = dict(os.environ, PJRT_DEVICE="CPU", OMP_NUM_THREADS="1")
    client = NotebookClient(
        nb,
        timeout=900,
        kernel_name="python3",
        allow_errors=allow_errors,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute(env=env)
    return nb


def _text(cell: nbformat.NotebookNode) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            parts.append(out.text)
        elif "data" in out:
            parts.append(str(out.data.get("text/plain", "")))
        elif out.output_type == "error":
            parts.append(ANSI.sub("", "\n".join(out.traceback)))
    return "".join(parts)


def test_a_cuda_training_cell_trains_on_xla_and_its_results_stay(tmp_path: Path) -> None:
    nb = _run(
        [
            "%load_ext gpu2tpu",
            TRAINING_CELL,
            "print(type(model).__name__, str(x.device), len(losses), losses[-1] < losses[0])\n"
            "import torch_xla.debug.metrics as met\n"
            "print('compiled', met.metric_data('CompileTime')[0] > 0)",
        ],
        tmp_path,
    )
    assert "trained on xla:0" in _text(nb.cells[1])
    # A plain cell after it sees the cell's names: the model, the data on xla:0, the losses.
    assert _text(nb.cells[2]).split("\n")[:2] == ["Sequential xla:0 5 True", "compiled True"]


def test_profile_reports_xlas_compile_events(tmp_path: Path) -> None:
    step = TRAINING_CELL.replace("%%tpu --backend xla", "%%tpu --backend xla --profile --full")
    step = step.replace("for _ in range(5):", "for _ in range(1):")
    nb = _run(["%load_ext gpu2tpu", step], tmp_path)
    text = _text(nb.cells[1])
    assert "the runtime's compile events" in text, text[-3000:]
    assert re.search(r"Compilations: warm-up [1-9]\d*, timed steps 0", text), text[-3000:]


def test_an_error_keeps_the_users_line(tmp_path: Path) -> None:
    cell = "%%tpu --backend xla\nimport torch\nx = torch.ones(3).cuda()\ny = x.view(7)\n"
    with pytest.raises(CellExecutionError):
        _run(["%load_ext gpu2tpu", cell], tmp_path)
    nb = _run(["%load_ext gpu2tpu", cell], tmp_path, allow_errors=True)
    failing = nb.cells[1]
    text = _text(failing)
    # The cell's own line as the notebook shows it (the %%tpu line is line 1), not a line of
    # the rewritten code, and no gpu2tpu frame.
    assert f"Cell In[{failing.execution_count}], line 4" in text
    # No frame of the package (a path segment `/gpu2tpu/`; the environment's own path may
    # hold the name, as CI's cached `~/.cache/gpu2tpu-ci/venv-xla-…` does).
    after = text.split("line 4", 1)[1]
    assert "----> 4 y = x.view(7)" in text and not re.search(r"[/\\]gpu2tpu[/\\]", after), after


def _gpt_losses(text: str) -> list[float]:
    return [float(loss) for _, loss in ITER_LINE.findall(text)]


def test_the_migrated_gpt_script_trains_on_xla_like_on_the_cpu(tmp_path: Path) -> None:
    source = GPT.read_text(encoding="utf-8")
    argv = f"import sys\nsys.argv = {GPT_ARGV!r}"
    # XLA first: a backward pass before torch_xla is imported leaves autograd without an
    # XLA queue (the adapter's note says so; test_a_backward_before_torch_xla_is_explained).
    nb = _run(
        [
            "%load_ext gpu2tpu",
            argv,
            "%%tpu --backend xla\n" + source,
            "print('device', device)",
            "%tpu_auto on --backend xla",
            source,
            "%tpu_auto off",
            "print('device', device)",
            "%%tpu --backend cpu\n" + source,
            "print('device', device)",
        ],
        tmp_path,
    )
    xla, auto, cpu = (_gpt_losses(_text(nb.cells[i])) for i in (2, 5, 8))
    devices = [_text(nb.cells[i]).strip() for i in (3, 7, 9)]
    assert devices == ["device xla", "device xla", "device cpu"]
    assert len(cpu) == 3, _text(nb.cells[8])[-2000:]
    assert len(xla) == len(auto) == len(cpu)
    # The backend leaves torch's default device alone, so the script builds its model on the
    # host from torch's seeded generator, as on the CPU, and moves it: the same first loss,
    # then the arithmetic of two compilers (measured: at most 6e-4 apart after 3 steps).
    for run in (xla, auto):
        assert abs(run[0] - cpu[0]) <= 1e-5 * abs(cpu[0]), (run, cpu)
        for a, b in zip(run, cpu, strict=True):
            assert abs(a - b) <= 0.005 * abs(b), (run, cpu)


SAME_START = """%%tpu --backend {backend}
import torch
import torch.nn as nn

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(8, 16, device="cpu"), nn.Tanh(), nn.Linear(16, 2, device="cpu"))
data = torch.randn(32, 8, device="cpu")
net = net.cuda()
data = data.cuda()
target = (data.sum(1) > 0).long()
opt = torch.optim.AdamW(net.parameters(), lr=0.05)
trace = []
for _ in range(6):
    loss = nn.functional.cross_entropy(net(data), target)
    opt.zero_grad()
    loss.backward()
    opt.step()
    trace.append(round(loss.item(), 6))
print({backend!r}, trace)
"""


def test_the_same_weights_train_to_the_same_losses(tmp_path: Path) -> None:
    nb = _run(
        [
            "%load_ext gpu2tpu",
            SAME_START.format(backend="xla"),
            SAME_START.format(backend="cpu"),
        ],
        tmp_path,
    )
    runs = []
    for cell in nb.cells[1:]:
        text = _text(cell)
        runs.append([float(v) for v in re.findall(r"-?\d+\.\d+", text.split("[", 1)[1])])
    xla, cpu = runs
    assert len(xla) == len(cpu) == 6 and cpu[-1] < cpu[0]
    for a, b in zip(xla, cpu, strict=True):
        assert abs(a - b) <= 1e-4 * max(1.0, abs(b)), (xla, cpu)


def test_a_backward_before_torch_xla_is_explained(tmp_path: Path) -> None:
    cpu_step = "import torch\nw = torch.ones(2, requires_grad=True)\n(w * 2).sum().backward()"
    xla_step = "%%tpu --backend xla\nv = torch.ones(2, requires_grad=True).cuda()\n(v * 2).sum().backward()"
    nb = _run(["%load_ext gpu2tpu", cpu_step, xla_step], tmp_path, allow_errors=True)
    text = _text(nb.cells[2])
    # torch 2.9 + torch_xla 2.9: the engine's assert, and the adapter's note on what to do.
    assert "device_ready_queues_" in text and "before torch_xla was imported" in text, text


# -- the example notebooks, top to bottom ----------------------------------------------------

EXAMPLES = ROOT / "examples"
STEP_LOSS = re.compile(r"^epoch (\d+) step (\d+) loss ([0-9.]+)$", re.MULTILINE)
ACCURACY = re.compile(r"^test accuracy ([0-9.]+)$", re.MULTILINE)
CONFIDENCE = re.compile(r"^batch (\d+) confidence ([0-9.]+) classes \[([0-9, ]+)\]$", re.M)
# Printed by a last cell in every run: where the notebook's model ended up.
WHERE = "print('model on', next(model.parameters()).device)"


def _code(path: Path) -> list[str]:
    return [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def _notebook_runs() -> dict[tuple[str, str], list[str]]:
    """Each example under `%tpu_auto on --backend xla` and with `%%tpu --backend xla` on every
    code cell, its migrated copy under auto mode, and the reference: the migrated copy run as
    it is, without gpu2tpu, which on this machine runs on the CPU."""
    runs: dict[tuple[str, str], list[str]] = {}
    for name in ("image_classification", "inference_benchmark"):
        original = _code(EXAMPLES / f"{name}.ipynb")
        migrated = _code(EXAMPLES / "migrated" / f"{name}.ipynb")
        auto = ["%load_ext gpu2tpu\n%tpu_auto on --backend xla"]
        runs[(name, "auto")] = [*auto, *original, WHERE]
        runs[(name, "tpu")] = [
            "%load_ext gpu2tpu",
            *(f"%%tpu --backend xla\n{c}" for c in original),
            WHERE,
        ]
        runs[(name, "migrated-auto")] = [*auto, *migrated, WHERE]
        runs[(name, "cpu")] = [*migrated, WHERE]
    return runs


@pytest.fixture(scope="module")
def notebooks(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], str]:
    """What each run printed, its cells run top to bottom in a kernel of their own (a failing
    cell stops the run and fails the test that reads it), two kernels at a time."""
    import asyncio

    root = tmp_path_factory.mktemp("xla-notebooks")
    env = dict(os.environ, PJRT_DEVICE="CPU", OMP_NUM_THREADS="1")

    async def execute(key: tuple[str, str], cells: list[str], gate: asyncio.Semaphore) -> str:
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
        cwd = root / "-".join(key)
        cwd.mkdir()
        client = NotebookClient(
            nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}
        )
        async with gate:
            try:
                await client.async_execute(env=env)
            except CellExecutionError as err:
                return f"STOPPED: {err}"
        return "".join(_stdout_first(c) for c in nb.cells)

    async def run_all() -> list[str]:
        gate = asyncio.Semaphore(2)
        return await asyncio.gather(*(execute(k, c, gate) for k, c in runs.items()))

    runs = _notebook_runs()
    return dict(zip(runs, asyncio.run(run_all()), strict=True))


def _stdout_first(cell: nbformat.NotebookNode) -> str:
    """A cell's stdout in one piece, then the rest: the kernel flushes stdout and stderr apart,
    so a warning can land inside a printed line (CI met `epoch 0 step 0` split that way)."""
    out = [o for o in cell.get("outputs", []) if o.get("name") == "stdout"]
    rest = [o for o in cell.get("outputs", []) if o.get("name") != "stdout"]
    return "".join(o.text for o in out) + _text(nbformat.from_dict({"outputs": rest}))


def _printed(notebooks: dict[tuple[str, str], str], name: str, mode: str) -> str:
    text = notebooks[(name, mode)]
    assert not text.startswith("STOPPED"), f"{name} ({mode}) stopped:\n{text[-4000:]}"
    return text


@pytest.mark.parametrize("mode", ["auto", "tpu", "migrated-auto"])
def test_the_image_classification_notebook_trains_on_xla_like_on_the_cpu(
    notebooks: dict[tuple[str, str], str], mode: str
) -> None:
    text = _printed(notebooks, "image_classification", mode)
    cpu = _printed(notebooks, "image_classification", "cpu")
    assert "model on xla:0" in text and "model on cpu" in cpu
    # Data built on the host, moved by the notebook's own (rewritten) `.cuda()` calls: the
    # same shuffled batches and the same initial weights as on the CPU, so the same losses
    # up to the arithmetic of two compilers (bfloat16 autocast on both; measured: at most
    # 1.8e-3 apart over the 16 steps).
    want = [(e, s, float(v)) for e, s, v in STEP_LOSS.findall(cpu)]
    got = [(e, s, float(v)) for e, s, v in STEP_LOSS.findall(text)]
    assert len(want) == 16 and [k[:2] for k in got] == [k[:2] for k in want], text[-3000:]
    for (_, _, a), (_, _, b) in zip(got, want, strict=True):
        assert abs(a - b) <= 0.01 * abs(b), (got, want)
    assert want[-1][2] < want[0][2]
    [acc_xla], [acc_cpu] = ACCURACY.findall(text), ACCURACY.findall(cpu)
    assert abs(float(acc_xla) - float(acc_cpu)) <= 0.02


@pytest.mark.parametrize("mode", ["auto", "tpu", "migrated-auto"])
def test_the_inference_notebook_predicts_on_xla_like_on_the_cpu(
    notebooks: dict[tuple[str, str], str], mode: str
) -> None:
    text = _printed(notebooks, "inference_benchmark", mode)
    cpu = _printed(notebooks, "inference_benchmark", "cpu")
    assert "model on xla:0" in text and "model on cpu" in cpu
    want, got = CONFIDENCE.findall(cpu), CONFIDENCE.findall(text)
    assert len(want) == 8 and [b for b, _, _ in got] == [b for b, _, _ in want], text[-3000:]
    # float16 weights on both (measured: confidences at most 2.3e-5 apart).
    for (_, a, _), (_, b, _) in zip(got, want, strict=True):
        assert abs(float(a) - float(b)) <= 1e-3, (got, want)
