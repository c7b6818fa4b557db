"""The extension in real Jupyter kernels, run by nbclient as papermill or CI would run them.

1. The magic demo notebook: `%%tpu` cells, the CPU dry run, `%tpu_auto`, `%tpu_info`, and a
   cell that fails half-way, which must stop the run with the error at the cell's own line
   and with the cell's own execution count.
2. Notebooks people bring — the project's examples, its templates, and a Colab notebook
   written for a T4 runtime (tests/notebooks_factory.py) — run top to bottom on this CPU-only
   machine under `%tpu_auto on`, and with `%%tpu` on every code cell. Where `gpu2tpu rewrite`
   has something to do, both print what the notebook the CLI rewrote prints: the magics run
   what the CLI writes.
3. Errors in both modes: the traceback names the cell's execution count, shows the cell as
   written, and a syntax error looks as IPython shows one.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import nbformat
import notebooks_factory as nbf
import pytest
from jupyter_kernels import NotebookClient
from nbclient.exceptions import CellExecutionError

from gpu2tpu.rewrite.core.model import Options
from gpu2tpu.rewrite.notebooks.notebook import rewrite_notebook
from gpu2tpu.templates import TEMPLATES, template_text

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "tests" / "fixtures" / "notebooks" / "magic_demo.ipynb"
EXAMPLES = ROOT / "examples"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Kernels run side by side, at most this many at once (two shared cores).
PARALLEL_KERNELS = 3

# One xdist worker runs the module: its kernels are started once, in the module's fixture.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("kernels")]


def _env() -> dict[str, str]:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    env.pop("PJRT_DEVICE", None)
    # One thread per kernel; libtpu locks a file per process (the quickstart forecasts).
    env.update(OMP_NUM_THREADS="1", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    return env


def _text(cell: nbformat.NotebookNode) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            parts.append(out.text)
        elif "data" in out:
            parts.append(str(out.data.get("text/plain", "")))
            parts.append(str(out.data.get("text/html", "")))
        elif out.output_type == "error":
            parts.append(ANSI.sub("", "\n".join(out.traceback)))
    return "".join(parts)


def _stream(nb: nbformat.NotebookNode, name: str) -> str:
    return "".join(
        o.text
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o.output_type == "stream" and o.name == name
    )


def _by_tag(nb: nbformat.NotebookNode, tag: str) -> nbformat.NotebookNode:
    [cell] = [c for c in nb.cells if tag in c.metadata.get("tags", [])]
    return cell


def test_example_notebook_runs_and_a_failing_cell_stops_it(tmp_path: Path) -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        nb,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    with pytest.raises(CellExecutionError) as err:
        client.execute(env=_env())

    rewritten = _by_tag(nb, "rewritten")
    assert "cpu" in _text(rewritten)
    assert rewritten.outputs[-1].output_type == "execute_result"  # the last expression

    dry = _by_tag(nb, "dry-run")
    dry_text = _text(dry)
    assert "host sync" in dry_text and "line 5" in dry_text
    assert f"Dry run of In[{dry.execution_count}]" in dry_text  # its own number

    auto = _by_tag(nb, "auto-cell")
    assert "'cpu'" in _text(auto)

    info = _by_tag(nb, "info")
    [shown] = [o for o in info.outputs if "data" in o]
    assert "application/vnd.jupyter.widget-view+json" in shown.data
    assert "<table" in shown.data["text/html"] and "VBox" not in shown.data["text/plain"]

    failing = _by_tag(nb, "fails")
    assert failing.outputs[-1].output_type == "error"
    assert failing.outputs[-1].ename == "ZeroDivisionError"
    assert f"Cell In[{failing.execution_count}], line 4" in _text(failing)
    assert "ZeroDivisionError" in str(err.value)
    # The run stopped at the failing cell: the cell after it never ran.
    assert _by_tag(nb, "after-failure").get("execution_count") is None


# -- notebooks people bring ------------------------------------------------------------------


def _under_auto(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    nb.cells.insert(0, nbformat.v4.new_code_cell("%load_ext gpu2tpu\n%tpu_auto on"))
    return nb


def _under_tpu(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = "%%tpu\n" + cell.source
    nb.cells.insert(0, nbformat.v4.new_code_cell("%load_ext gpu2tpu"))
    return nb


def _as_migrated(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    text = json.dumps(nb, indent=1)
    result = rewrite_notebook(text, Options())
    assert not result.cell_errors, result.cell_errors
    return nbformat.reads(result.new_text, as_version=4)


def _colab() -> nbformat.NotebookNode:
    return nbformat.reads(json.dumps(nbf.colab_training_notebook()), as_version=4)


def _template(name: str) -> nbformat.NotebookNode:
    return nbformat.reads(template_text(name), as_version=4)


# name -> (the notebook, the lines every run of it prints alike (per-step losses, ...))
CASES: dict[str, tuple[Callable[[], nbformat.NotebookNode], re.Pattern[str] | None]] = {
    "image_classification": (
        lambda: nbformat.read(EXAMPLES / "image_classification.ipynb", as_version=4),
        re.compile(r"^epoch \d+ step \d+ loss [0-9.]+$|^test accuracy [0-9.]+$", re.M),
    ),
    "inference_benchmark": (
        lambda: nbformat.read(EXAMPLES / "inference_benchmark.ipynb", as_version=4),
        re.compile(r"^batch \d+ confidence [0-9.]+ classes \[[0-9, ]+\]$", re.M),
    ),
    "colab_training": (_colab, re.compile(r"^step \d+ loss [0-9.]+$|^train accuracy .*$", re.M)),
    **{f"template_{name}": (lambda name=name: _template(name), None) for name in TEMPLATES},
}

Runs = dict[tuple[str, str], tuple[nbformat.NotebookNode, BaseException | None]]


async def _execute(
    nb: nbformat.NotebookNode, cwd: Path, gate: asyncio.Semaphore, *, allow_errors: bool = False
) -> tuple[nbformat.NotebookNode, BaseException | None]:
    cwd.mkdir(parents=True, exist_ok=True)
    client = NotebookClient(
        nb,
        timeout=600,
        startup_timeout=180,
        kernel_name="python3",
        allow_errors=allow_errors,
        resources={"metadata": {"path": str(cwd)}},
    )
    async with gate:
        try:
            await client.async_execute(env=_env())
        except CellExecutionError as err:
            return nb, err
    return nb, None


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """Every case under auto mode and under `%%tpu`, plus the CLI's rewrite of the cases it
    changes, each in its own kernel and folder, a few kernels at a time."""
    root = tmp_path_factory.mktemp("kernels")
    jobs: dict[tuple[str, str], nbformat.NotebookNode] = {}
    for name, (build, record) in CASES.items():
        jobs[(name, "auto")] = _under_auto(build())
        jobs[(name, "tpu")] = _under_tpu(build())
        if record is not None:
            jobs[(name, "cli")] = _as_migrated(build())

    async def run_all() -> list[tuple[nbformat.NotebookNode, BaseException | None]]:
        gate = asyncio.Semaphore(PARALLEL_KERNELS)
        return await asyncio.gather(
            *(_execute(nb, root / f"{n}-{m}", gate) for (n, m), nb in jobs.items())
        )

    return dict(zip(jobs, asyncio.run(run_all()), strict=True))


def _ran(runs: Runs, name: str, mode: str) -> nbformat.NotebookNode:
    nb, error = runs[(name, mode)]
    assert error is None, f"{name} under {mode} stopped: {error}"
    return nb


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("mode", ["auto", "tpu"])
def test_notebook_runs_top_to_bottom(runs: Runs, name: str, mode: str) -> None:
    nb = _ran(runs, name, mode)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code)
    _, record = CASES[name]
    if record is not None:  # the same numbers as the notebook `gpu2tpu rewrite` wrote
        migrated = _ran(runs, name, "cli")
        want = record.findall(_stream(migrated, "stdout"))
        assert want and record.findall(_stream(nb, "stdout")) == want


def test_colab_notebook_says_what_it_could_not_migrate(runs: Runs) -> None:
    for mode in ("auto", "tpu"):
        nb = _ran(runs, "colab_training", mode)
        said = _stream(nb, "stderr")
        offset = 1 if mode == "tpu" else 0  # the %%tpu line
        assert f"gpu2tpu: line {1 + offset}: `!nvidia-smi` has no TPU equivalent" in said
        assert re.search(rf"gpu2tpu: line {8 + offset}: `torch\.backends\.cudnn\.benchmark`", said)
        assert "(G2T209)" in said and "(G2T203)" in said
        out = _stream(nb, "stdout")
        assert "8 steps in" in out and "Wall time" in out and "peak memory" in out


def test_quickstart_template_trains_in_both_modes(runs: Runs) -> None:
    for mode in ("auto", "tpu"):
        nb = _ran(runs, "template_tpu-quickstart", mode)
        losses = [float(v) for v in re.findall(r"mean loss ([0-9.]+)", _stream(nb, "stdout"))]
        assert len(losses) == 3 and losses[-1] < losses[0]


# -- errors ----------------------------------------------------------------------------------

ERROR_CELLS = [
    ("setup", "%load_ext gpu2tpu\nimport torch"),
    ("tpu-error", "%%tpu --backend cpu\na = 1\nx = torch.ones(2).cuda() @ torch.ones(3)\n"),
    ("tpu-syntax", "%%tpu --backend cpu\nb = (1,\nc = 3\n"),
    ("plain-syntax", "b = (1,\nc = 3\n"),
    ("auto-on", "%tpu_auto on"),
    ("auto-error", "\nw = torch.ones(2).cuda()\ny = w @ torch.ones(3).cuda()\n"),
    ("auto-syntax", "b = (1,\nc = 3\n"),
]


def test_errors_name_the_cells_own_execution_count(tmp_path: Path) -> None:
    cells = []
    for tag, source in ERROR_CELLS:
        cell = nbformat.v4.new_code_cell(source)
        cell.metadata["tags"] = [tag]
        cells.append(cell)
    nb = nbformat.v4.new_notebook(cells=cells)

    async def run() -> tuple[nbformat.NotebookNode, BaseException | None]:
        return await _execute(nb, tmp_path, asyncio.Semaphore(1), allow_errors=True)

    nb, _ = asyncio.run(run())
    for tag, line, shown in (
        ("tpu-error", 3, "x = torch.ones(2).cuda() @ torch.ones(3)"),
        ("auto-error", 3, "y = w @ torch.ones(3).cuda()"),
    ):
        cell = _by_tag(nb, tag)
        text = _text(cell)
        assert f"Cell In[{cell.execution_count}], line {line}" in text, text
        assert f"----> {line} {shown}" in text  # the line as written
        assert "ran rewritten as:" in text and ".to(device)" in text  # what ran there
        assert "gpu2tpu/magics" not in text  # no frame of the extension
    plain = _text(_by_tag(nb, "plain-syntax"))
    for tag in ("tpu-syntax", "auto-syntax"):
        cell = _by_tag(nb, tag)
        [error] = [o for o in cell.outputs if o.output_type == "error"]
        assert error.ename == "SyntaxError"
        assert f"Cell In[{cell.execution_count}]" in _text(cell)
        # as IPython shows a syntax error in a cell it compiled itself
        normal = re.sub(r"In\[\d+\], line \d+", "In[n], line k", _text(cell))
        assert normal == re.sub(r"In\[\d+\], line \d+", "In[n], line k", plain)


# -- the second hour in a notebook (issue 28) ------------------------------------------------


def _widget_values(nb: nbformat.NotebookNode) -> list[dict]:
    """The state of every widget the kernel made (nbclient stores it in the metadata)."""
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    return [m.get("state", {}) for m in state.get("state", {}).values()]


def test_what_the_second_hour_in_a_notebook_meets(tmp_path: Path) -> None:
    """Each item of issue 28 a notebook user saw, in a real kernel: the dry run follows calls
    into earlier cells and sees a backward-only loop over batch sizes, a cell that only
    defines functions prints nothing, auto mode says it runs no dry run, `%tpu_info` says
    auto's choice once, `--profile` prints one line after a live progress bar, a local module
    with CUDA code is named, and a traceback holds the user's frames only."""
    (tmp_path / "helper_functions.py").write_text(
        "import torch\n\ndef to_gpu(x):\n    return x.cuda()\n", encoding="utf-8"
    )
    cells = [
        ("load", "%load_ext gpu2tpu\nimport time\nimport torch"),
        ("info", "%tpu_info"),
        (
            "defs",
            "def generate(idx, n):\n    for _ in range(n):\n        nxt = idx[:, -1:] + 1\n"
            "        idx = torch.cat((idx, nxt), dim=1)\n    return idx\n\n"
            "def project(x):\n    return lin(x)\n\nlin = torch.nn.Linear(6, 1)",
        ),
        ("follow", "%%tpu --dry-run\nout = generate(torch.zeros(1, 3), 5)"),
        (
            "backward",
            "%%tpu --dry-run\nfor n in (3, 5, 7, 9): lin(torch.randn(n, 6)).sum().backward()",
        ),
        ("module", "%%tpu\nfrom helper_functions import to_gpu"),  # auto's choice said here
        ("silent", "%%tpu\ndef double(x):\n    return 2 * x"),
        (
            "profile",
            "%%tpu --profile --steps 25 --warmup 1\ntime.sleep(0.03)\n"
            "lin(torch.randn(4, 6)).sum().backward()",
        ),
        ("auto", "%tpu_auto on\n%tpu_auto off"),
        ("fails", "%%tpu\ny = 1\nproject(torch.randn(3, 5))"),
    ]
    nb = nbformat.v4.new_notebook()
    for tag, source in cells:
        nb.cells.append(nbformat.v4.new_code_cell(source, metadata={"tags": [tag]}))
    client = NotebookClient(
        nb,
        timeout=300,
        kernel_name="python3",
        store_widget_state=True,
        allow_errors=True,  # the last cell fails; the widgets' state is stored at the end
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute(env=_env())

    defs = _by_tag(nb, "defs")
    follow = _text(_by_tag(nb, "follow"))
    assert f"In[{defs.execution_count}] line 4 (from line 2)" in follow
    assert "shape change" in follow and "No TPU hazards found" not in follow
    assert "shape change" in _text(_by_tag(nb, "backward"))
    assert _by_tag(nb, "silent").outputs == []
    module = _text(_by_tag(nb, "module"))
    assert "`helper_functions.py` holds CUDA code" in module
    assert "`gpu2tpu rewrite helper_functions.py` migrates it" in module

    profile = _by_tag(nb, "profile")
    profiled = "".join(o.text for o in profile.outputs if o.output_type == "stream")
    lines = profiled.splitlines()
    assert lines[0].startswith("gpu2tpu: step ") and "per 1k steps" in lines[0]
    assert "e-0" not in profiled
    widgets = _widget_values(nb)
    [bar] = [w for w in widgets if w.get("_model_name") == "IntProgressModel"]
    assert (bar["value"], bar["max"], bar["bar_style"]) == (27, 27, "success")
    assert any(
        re.search(r"gpu2tpu\.profile: 27/27 steps, done in", str(w.get("value", "")))
        for w in widgets
    )
    # Saved without its widget state, the bar's output says how the run ended (issue 32: it
    # stayed at its first frame, "5/13 steps").
    [plain] = [
        o.data["text/plain"]
        for o in profile.outputs
        if o.output_type == "display_data" and "application/vnd.jupyter.widget-view+json" in o.data
    ]
    assert re.fullmatch(r"gpu2tpu\.profile: 27/27 steps, done in [\d.]+ s", plain), plain

    auto = _text(_by_tag(nb, "auto"))
    assert "without a dry run" in auto and "using the CPU dry run" not in auto
    choice = "auto: no TPU backend found"
    assert sum(choice in str(w.get("value", "")) for w in widgets) == 1  # %tpu_info's widget

    failing = _by_tag(nb, "fails")
    error = failing.outputs[-1]
    assert error.output_type == "error" and error.ename == "RuntimeError"
    shown = ANSI.sub("", "\n".join(error.traceback))
    assert f"In[{failing.execution_count}], line 3" in shown
    assert f"In[{defs.execution_count}], line 8" in shown
    assert "site-packages" not in shown and "run_cell_magic" not in shown
    assert "frames inside torch and gpu2tpu not shown" in shown
    assert len(shown.splitlines()) < 25
