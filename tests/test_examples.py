"""The bundled examples (examples/): CUDA-first code as users bring it, and its migration.

For each example the tests check that:
1. `gpu2tpu rewrite` on a copy gives exactly the checked-in golden (examples/migrated/), so a
   change in the codemod's output shows up here, and the golden is stable under a second
   rewrite;
2. the original stops at its first CUDA call on this CPU-only machine;
3. the migrated version runs to the end on the CPU, printing the same per-step losses (or
   predictions) as the original run under the CUDA-on-CPU test shim
   (tests/cuda_on_cpu_shim/sitecustomize.py), i.e. with CUDA mapped to the CPU.
Notebooks run in real Jupyter kernels (nbclient, the python3 kernel, checked to be this
interpreter); the three runs of one notebook share the wall clock, not the kernel.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
from jupyter_kernels import NotebookClient
from nbclient.exceptions import CellExecutionError

from gpu2tpu.rewrite.core.model import Options
from gpu2tpu.rewrite.core.source import rewrite_source
from gpu2tpu.rewrite.notebooks.notebook import rewrite_notebook

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
GOLDEN = EXAMPLES / "migrated"
SHIM = Path(__file__).resolve().parent / "cuda_on_cpu_shim"
NAMES = ("image_classification.ipynb", "train_gpt.py", "inference_benchmark.ipynb")
REGENERATE = (
    "cp examples/{name} examples/migrated/ && gpu2tpu rewrite examples/migrated/{name}, "
    "then review the diff by eye before committing it"
)

# What each example must keep doing the CUDA way (issue 8): the idioms users bring.
IDIOMS = {
    "image_classification.ipynb": [
        ".cuda(",
        "torch.cuda.amp.autocast(",
        "torch.cuda.amp.GradScaler(",
        "torch.backends.cudnn.benchmark = True",
        "pin_memory=True",
        "torch.cuda.Event(enable_timing=True)",
        "!nvidia-smi",
    ],
    "train_gpt.py": [
        'device = "cuda"',
        "torch.backends.cuda.matmul.allow_tf32 = True",
        "torch.backends.cudnn.allow_tf32 = True",
        "torch.cuda.amp.autocast(",
        "torch.cuda.amp.GradScaler(",
        "torch.cuda.is_bf16_supported()",
        'backend = "nccl"',
        'os.environ.get("LOCAL_RANK"',
        "DDP(model",
        "torch.compile(model)",
        "torch.cuda.max_memory_allocated()",
    ],
    "inference_benchmark.ipynb": [
        ".half()",
        "torch.cuda.synchronize()",
        "torch.cuda.max_memory_allocated()",
        "torch.cuda.reset_peak_memory_stats()",
    ],
}
# CUDA-only calls of the originals that the codemod fixes safely: none may be left in a golden.
FIXED_IN_GOLDEN = [
    ".cuda(",
    "torch.cuda.amp",
    "torch.cuda.Event",
    "torch.cuda.synchronize",
    "torch.cuda.max_memory_allocated",
    "torch.cuda.reset_peak_memory_stats",
    "torch.cuda.set_device",
]


def code_text(path: Path) -> str:
    """A script's text, or a notebook's code cells joined (what a person reads as code)."""
    if path.suffix == ".py":
        return path.read_text(encoding="utf-8")
    nb = json.loads(path.read_text(encoding="utf-8"))
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")


# -- the rewrite and the goldens ------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_example_keeps_the_cuda_idioms_users_bring(name: str) -> None:
    text = code_text(EXAMPLES / name)
    missing = [idiom for idiom in IDIOMS[name] if idiom not in text]
    assert not missing, f"examples/{name} no longer uses {missing}"
    assert "gpu2tpu" not in text, f"examples/{name} must be plain CUDA-first code"


def test_rewrite_of_a_copy_matches_the_goldens(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    for name in NAMES:
        shutil.copyfile(EXAMPLES / name, tmp_path / name)
    proc = cli("rewrite", *NAMES, cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr
    assert "error:" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert "3 files rewritten" in proc.stdout, proc.stdout
    for name in NAMES:
        got = (tmp_path / name).read_text(encoding="utf-8")
        want = (GOLDEN / name).read_text(encoding="utf-8")
        if got != want:
            diff = "".join(
                difflib.unified_diff(
                    want.splitlines(keepends=True),
                    got.splitlines(keepends=True),
                    f"examples/migrated/{name} (golden)",
                    f"{name} (gpu2tpu rewrite now)",
                )
            )
            pytest.fail(
                f"the codemod's output for examples/{name} drifted from the golden; if the "
                f"change is right, regenerate it: {REGENERATE.format(name=name)}\n{diff}"
            )


@pytest.mark.parametrize("name", NAMES)
def test_golden_is_migrated_and_stable(name: str) -> None:
    golden = GOLDEN / name
    text = golden.read_text(encoding="utf-8")
    left = [api for api in FIXED_IN_GOLDEN if api in code_text(golden)]
    assert not left, f"examples/migrated/{name} still calls {left}"
    assert "torch.accelerator" in text
    assert "gpu2tpu" not in code_text(golden), "migrated code must not import gpu2tpu"
    if golden.suffix == ".py":
        again = rewrite_source(text, Options()).new_text
    else:
        again = rewrite_notebook(text, Options()).new_text
    assert again == text, f"a second rewrite changes examples/migrated/{name}"


def test_golden_notebooks_change_only_code_cell_sources() -> None:
    for name in NAMES:
        if not name.endswith(".ipynb"):
            continue
        original = json.loads((EXAMPLES / name).read_text(encoding="utf-8"))
        golden = json.loads((GOLDEN / name).read_text(encoding="utf-8"))
        changed = [
            i
            for i, (a, b) in enumerate(zip(original["cells"], golden["cells"], strict=True))
            if a != b
        ]
        assert changed, name
        for i in changed:
            a, b = original["cells"][i], golden["cells"][i]
            assert a["cell_type"] == "code", (name, i)
            assert {**a, "source": None} == {**b, "source": None}, (name, i)
        assert {**original, "cells": None} == {**golden, "cells": None}, name


# -- running them --------------------------------------------------------------------------


def _env(shim: bool, **extra: str) -> dict[str, str]:
    """This machine as the issue means it: CPU only, one thread per process (2 shared cores)."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARIABLES}
    env.pop("PJRT_DEVICE", None)
    env.pop("GPU2TPU_TEST_CUDA_ON_CPU", None)
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONHASHSEED="0", **extra)
    if shim:
        env["GPU2TPU_TEST_CUDA_ON_CPU"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SHIM), env.get("PYTHONPATH")]))
    return env


def _is_cuda_failure(text: str) -> bool:
    return "NVIDIA driver" in text or "No CUDA GPUs" in text or "CUDA" in text


# The script --------------------------------------------------------------------------------

TORCHRUN_VARIABLES = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
GPT_ITERS = 4
# compile off: Inductor on 2 shared cores takes minutes; bfloat16 named so both runs agree
# (the original asks torch.cuda.is_bf16_supported(), the migration leaves that for a person).
GPT_ARGS = [
    "--compile=False",
    f"--max_iters={GPT_ITERS}",
    "--eval_interval=2",
    "--dtype=bfloat16",
]
ITER_LINE = re.compile(r"^iter (\d+): loss ([0-9.]+),", re.MULTILINE)


def _start(script: Path, args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=600)
    return proc.returncode, out, err


def _gpt_losses(out: str, err: str, what: str) -> list[float]:
    found = ITER_LINE.findall(out)
    assert [int(i) for i, _ in found] == list(range(GPT_ITERS)), f"{what}:\n{out}\n{err[-3000:]}"
    assert f"done: {GPT_ITERS} iterations" in out, f"{what}:\n{out}\n{err[-3000:]}"
    return [float(loss) for _, loss in found]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_gpt_script_fails_as_written_and_trains_the_same_once_migrated(tmp_path: Path) -> None:
    original = shutil.copyfile(EXAMPLES / "train_gpt.py", tmp_path / "train_gpt.py")
    migrated = shutil.copyfile(GOLDEN / "train_gpt.py", tmp_path / "train_gpt_migrated.py")
    runs = {
        "as written": _start(original, GPT_ARGS, tmp_path, _env(shim=False)),
        "under the shim": _start(original, GPT_ARGS, tmp_path, _env(shim=True)),
        "migrated": _start(migrated, GPT_ARGS, tmp_path, _env(shim=False)),
    }
    results = {what: _finish(proc) for what, proc in runs.items()}

    code, out, err = results["as written"]
    assert code != 0, "the CUDA-first script ran on a machine without CUDA"
    assert _is_cuda_failure(err.strip().splitlines()[-1]), err[-2000:]
    frames = re.findall(r'File ".*train_gpt\.py", line \d+, in \w+\n\s+(.*)\n', err)
    assert frames and frames[-1] == "model.to(device)", err[-2000:]  # the first CUDA call
    assert "tokens per iteration" in out and not ITER_LINE.search(out), out

    code, out, err = results["under the shim"]
    assert code == 0, err[-3000:]
    baseline = _gpt_losses(out, err, "the original under the CUDA-on-CPU shim")
    code, out, err = results["migrated"]
    assert code == 0, err[-3000:]
    losses = _gpt_losses(out, err, "the migrated script")

    assert losses == pytest.approx(baseline, rel=1e-5, abs=1e-6)
    assert losses[-1] < losses[0], "the loss should fall as the model trains"


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason=(
        "needs a person: `device = f'cuda:{ddp_local_rank}'` (nanoGPT's DDP line) is reported "
        "(G2T103), not rewritten: CUDA wants the rank's index, a TPU process owns only tpu:0"
    ),
)
def test_gpt_script_ddp_path_trains_the_same_once_migrated(tmp_path: Path) -> None:
    """With torchrun's variables set the script takes its DDP path (one process, gloo)."""
    original = shutil.copyfile(EXAMPLES / "train_gpt.py", tmp_path / "train_gpt.py")
    migrated = shutil.copyfile(GOLDEN / "train_gpt.py", tmp_path / "train_gpt_migrated.py")

    def torchrun() -> dict[str, str]:
        return {
            "LOCAL_RANK": "0",
            "RANK": "0",
            "WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(_free_port()),
        }

    # `backend = "nccl"` is left for a person (G2T404); on the CPU that person picks gloo.
    shim = _start(original, GPT_ARGS, tmp_path, _env(shim=True, **torchrun()))
    moved = _start(migrated, [*GPT_ARGS, "--backend=gloo"], tmp_path, _env(False, **torchrun()))
    code, out, err = _finish(shim)
    assert code == 0, err[-3000:]
    baseline = _gpt_losses(out, err, "the original's DDP path under the shim")
    code, out, err = _finish(moved)
    assert code == 0, err[-3000:]
    assert _gpt_losses(out, err, "the migrated DDP path") == pytest.approx(baseline, rel=1e-5)


# The notebooks -----------------------------------------------------------------------------

PROBE = "import sys\nprint('kernel python:', sys.executable)"


@dataclass(frozen=True)
class NotebookCase:
    name: str
    first_cuda_cell: str  # id of the cell whose CUDA call stops the original
    record: re.Pattern[str]  # the per-step lines both runs must print alike
    final: str  # a line the migrated run prints at its end


NOTEBOOKS = [
    NotebookCase(
        "image_classification.ipynb",
        "model",
        re.compile(r"^epoch (\d+) step (\d+) loss ([0-9.]+)$|^test accuracy ([0-9.]+)$", re.M),
        "peak GPU memory",
    ),
    NotebookCase(
        "inference_benchmark.ipynb",
        "cell-2",
        re.compile(r"^batch (\d+) confidence ([0-9.]+) classes (\[[0-9, ]+\])$", re.M),
        "batch 7 confidence",
    ),
]


def _cell_id(cell: nbformat.NotebookNode) -> str | None:
    return cell.get("id") or cell.get("metadata", {}).get("id")


def _stdout(nb: nbformat.NotebookNode) -> str:
    return "".join(
        o.text
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o.output_type == "stream" and o.name == "stdout"
    )


def _errors(nb: nbformat.NotebookNode) -> list[str]:
    return [
        f"{o.ename}: {o.evalue}"
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o.output_type == "error"
    ]


async def _execute(
    path: Path, cwd: Path, env: dict[str, str], probe: bool
) -> tuple[nbformat.NotebookNode, BaseException | None]:
    nb = nbformat.read(path, as_version=4)
    if probe:
        nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    client = NotebookClient(
        nb,
        timeout=300,
        startup_timeout=180,
        kernel_name="python3",
        resources={"metadata": {"path": str(cwd)}},
    )
    try:
        await client.async_execute(env=env)
    except CellExecutionError as err:
        return nb, err
    return nb, None


async def _three_runs(case: NotebookCase, cwd: Path) -> list[tuple[nbformat.NotebookNode, BaseException | None]]:  # fmt: skip
    original = EXAMPLES / case.name
    return await asyncio.gather(
        _execute(original, cwd, _env(shim=False), probe=False),
        _execute(original, cwd, _env(shim=True), probe=True),
        _execute(GOLDEN / case.name, cwd, _env(shim=False), probe=True),
    )


def _records(nb: nbformat.NotebookNode, case: NotebookCase) -> list[tuple[str, ...]]:
    return [
        tuple(g for g in m.groups() if g is not None) for m in case.record.finditer(_stdout(nb))
    ]


def _same_records(got: list[tuple[str, ...]], want: list[tuple[str, ...]]) -> None:
    assert len(got) == len(want) and got, (got, want)
    for a, b in zip(got, want, strict=True):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            if re.fullmatch(r"[0-9]+\.[0-9]+", x):
                assert float(x) == pytest.approx(float(y), rel=1e-5, abs=1e-6), (a, b)
            else:
                assert x == y, (a, b)


@pytest.mark.slow
@pytest.mark.parametrize("case", NOTEBOOKS, ids=[c.name for c in NOTEBOOKS])
def test_notebook_fails_as_written_and_runs_the_same_once_migrated(
    case: NotebookCase, tmp_path: Path
) -> None:
    (as_written, error), (shimmed, shim_error), (migrated, migrated_error) = asyncio.run(
        _three_runs(case, tmp_path)
    )

    # As written: every cell before the first CUDA call runs; that cell fails; nothing after.
    assert error is not None, f"{case.name} ran on a machine without CUDA"
    code = [c for c in as_written.cells if c.cell_type == "code"]
    failing = [c for c in code if any(o.output_type == "error" for o in c.outputs)]
    assert [_cell_id(c) for c in failing] == [case.first_cuda_cell]
    failure = next(o for o in failing[0].outputs if o.output_type == "error")
    assert _is_cuda_failure(failure.evalue), failure.evalue
    position = code.index(failing[0])
    assert all(c.execution_count is not None for c in code[: position + 1])
    assert all(c.execution_count is None for c in code[position + 1 :])

    assert shim_error is None, f"the original under the CUDA-on-CPU shim failed: {shim_error}"
    assert migrated_error is None, f"the migrated notebook failed: {migrated_error}"
    assert _errors(migrated) == []
    for nb in (shimmed, migrated):
        assert f"kernel python: {sys.executable}" in _stdout(nb), "the kernel is not this venv"
    assert case.final in _stdout(migrated)
    records = _records(migrated, case)
    _same_records(records, _records(shimmed, case))
    if case.name == "image_classification.ipynb":  # it trains something, not only runs
        losses = [float(r[2]) for r in records if len(r) == 3]
        assert sum(losses[-4:]) < sum(losses[:4]), losses
        assert float(records[-1][0]) > 0.2, "ten classes: chance is 0.1"
