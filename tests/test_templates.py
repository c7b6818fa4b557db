"""`gpu2tpu new NAME.ipynb --template ...`: the packaged templates, created and executed.

Fast tests cover the command (listing, unknown template, never overwriting without --force,
bad paths) and the templates' shape (valid nbformat, no outputs). The slow test creates each
template through the real command and runs it top to bottom in a Jupyter kernel on the CPU,
the three kernels side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import nbformat
import pytest
from jupyter_kernels import NotebookClient
from nbclient.exceptions import CellExecutionError

from gpu2tpu.backends.base import has_module
from gpu2tpu.cli import main
from gpu2tpu.templates import TEMPLATES, TemplateError, create_notebook, template_text


def _main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["new", *argv])
    return code, out.getvalue(), err.getvalue()


# -- the command ----------------------------------------------------------------------------


def test_every_listed_template_is_shipped_and_nothing_else() -> None:
    shipped = {
        p.name.removesuffix(".ipynb")
        for p in resources.files("gpu2tpu.templates").iterdir()
        if p.name.endswith(".ipynb")
    }
    assert shipped == set(TEMPLATES)


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_template_is_a_clean_valid_notebook(name: str) -> None:
    nb = nbformat.reads(template_text(name), as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)
    assert nb.metadata.kernelspec.name == "python3"


def test_list_names_every_template() -> None:
    code, out, _ = _main("--list")
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()] == list(TEMPLATES)


def test_new_writes_the_template(tmp_path: Path) -> None:
    target = tmp_path / "cost.ipynb"
    code, out, err = _main(str(target), "--template", "compare-cost")
    assert (code, err) == (0, "")
    assert target.read_text(encoding="utf-8") == template_text("compare-cost")
    assert "created" in out and "compare-cost" in out


def test_new_adds_the_suffix_and_defaults_to_the_quickstart(tmp_path: Path) -> None:
    code, _, _ = _main(str(tmp_path / "start"))
    assert code == 0
    assert (tmp_path / "start.ipynb").read_text(encoding="utf-8") == template_text("tpu-quickstart")


def test_new_never_overwrites_without_force(tmp_path: Path) -> None:
    target = tmp_path / "mine.ipynb"
    target.write_text("my work", encoding="utf-8")
    code, out, err = _main(str(target), "--template", "migrate")
    assert code == 2 and out == ""
    assert "already exists" in err and "--force" in err
    assert target.read_text(encoding="utf-8") == "my work"

    code, _, _ = _main(str(target), "--template", "migrate", "--force")
    assert code == 0
    assert target.read_text(encoding="utf-8") == template_text("migrate")


def test_unknown_template_lists_the_known_ones(tmp_path: Path) -> None:
    target = tmp_path / "x.ipynb"
    code, _, err = _main(str(target), "--template", "quickstart")
    assert code == 2
    assert "unknown template 'quickstart'" in err
    assert all(name in err for name in TEMPLATES)
    assert not target.exists()


@pytest.mark.parametrize(
    ("name", "reason"),
    [("notes.txt", "must end in .ipynb"), ("missing/x.ipynb", "does not exist")],
)
def test_bad_paths_are_refused_with_a_reason(tmp_path: Path, name: str, reason: str) -> None:
    with pytest.raises(TemplateError, match=reason):
        create_notebook(tmp_path / name, "migrate")
    assert list(tmp_path.iterdir()) == []


def test_a_name_is_required() -> None:
    code, _, err = _main()
    assert code == 2 and "give the notebook" in err


def test_cli_new_subcommand_reaches_the_templates(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    proc = cli("new", "demo.ipynb", "--template", "migrate", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "demo.ipynb").read_text(encoding="utf-8") == template_text("migrate")


def test_cli_new_takes_options_first(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    listing = cli("new", "--list", cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    assert [line.split()[0] for line in listing.stdout.splitlines()] == list(TEMPLATES)
    made = cli("new", "--template", "migrate", "first.ipynb", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "first.ipynb").read_text(encoding="utf-8") == template_text("migrate")


# -- the install cell -------------------------------------------------------------------------

# Runs a template's first code cell in a fresh IPython shell in which gpu2tpu and torch are
# not installed (as on a new Colab runtime), with `%pip` recorded instead of run, and prints
# what `%pip` was asked to do. argv: the cell's source, then "tpu" to show a TPU on the bus.
# One xdist worker runs the module: the templates' kernels run once, in the module's fixture.
pytestmark = pytest.mark.xdist_group("templates")

FRESH_RUNTIME = """
import glob, json, os, sys, tempfile
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config
for name in ("gpu2tpu", "torch", "torch_tpu"):
    sys.modules[name] = None  # find_spec answers None: not installed
if sys.argv[2] == "tpu":
    vendor = os.path.join(tempfile.mkdtemp(), "vendor")
    with open(vendor, "w") as fh:
        fh.write("0x1ae0\\n")
    real_glob = glob.glob
    glob.glob = lambda pattern: [vendor] if pattern.endswith("/vendor") else real_glob(pattern)
config = Config()
config.HistoryManager.enabled = False
ip = InteractiveShell.instance(config=config)
asked = []
ip.register_magic_function(lambda line: asked.append(line), "line", "pip")
result = ip.run_cell(sys.argv[1])
assert result.success, result.error_in_exec
print(json.dumps(asked))
"""


@pytest.mark.parametrize("name", list(TEMPLATES))
@pytest.mark.parametrize("tpu", [False, True], ids=["cpu", "tpu"])
def test_template_starts_with_an_install_cell_for_a_fresh_runtime(name: str, tpu: bool) -> None:
    nb = nbformat.reads(template_text(name), as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    assert "%pip install" in first.source
    done = subprocess.run(
        [sys.executable, "-c", FRESH_RUNTIME, first.source, "tpu" if tpu else "cpu"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    extras = "notebook,tpu" if tpu else "notebook"
    assert json.loads(done.stdout.splitlines()[-1]) == [f'install --quiet "gpu2tpu[{extras}]"']
    assert f"installing gpu2tpu[{extras}] (missing here: gpu2tpu, torch" in done.stdout


# -- running them ---------------------------------------------------------------------------

# A stand-in for a baseline file saved on a GPU machine (`result.save_baseline(path)` there):
# the compare-cost template must load it and show it as a baseline row.
STANDIN_GPU_BASELINE = {
    "gpu2tpu_baseline": 1,
    "device_key": "a100-80gb",
    "device_name": "NVIDIA A100 80GB (test stand-in)",
    "chips": 1,
    "backend": "cuda",
    "step_seconds": 0.0005,
    "stats": {
        "n": 20,
        "median": 0.0005,
        "p10": 0.00048,
        "p90": 0.00055,
        "mean": 0.0005,
        "min": 0.00047,
        "max": 0.0006,
    },
    "samples_per_step": 64,
    "tokens_per_step": None,
    "flops_per_step": None,
    "memory_peak_bytes": None,
    "memory_kind": "device",
    "created": "2026-01-01T00:00:00+00:00",
    "host": "test-standin",
}


def _kernel_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PJRT_DEVICE", None)
    # Two shared cores: one thread per kernel. libtpu locks /tmp/libtpu_lockfile per process;
    # other test processes may hold it while the forecast cell runs.
    env.update(OMP_NUM_THREADS="1", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    return env


async def _run(path: Path) -> tuple[nbformat.NotebookNode, BaseException | None]:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=600,
        startup_timeout=180,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    try:
        await client.async_execute(env=_kernel_env())
    except CellExecutionError as err:
        return nb, err
    return nb, None


def _text(cell: nbformat.NotebookNode) -> str:
    """Everything a cell showed as text: streams and the text/plain of results."""
    parts = []
    for o in cell.outputs:
        if o.output_type == "stream":
            parts.append(o.text)
        elif o.output_type in ("execute_result", "display_data"):
            parts.append(o.data.get("text/plain", ""))
    return "".join(parts)


def _by_source(nb: nbformat.NotebookNode, needle: str) -> nbformat.NotebookNode:
    return next(c for c in nb.cells if c.cell_type == "code" and needle in c.source)


Executed = dict[str, tuple[nbformat.NotebookNode, Path, BaseException | None]]


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> Executed:
    """Each template created by the real `gpu2tpu new` in its own folder, then run to the
    end in its own kernel, the three side by side; a failing one raises in its own test."""
    from conftest import run_cli

    root = tmp_path_factory.mktemp("templates")
    folders = {name: root / name for name in TEMPLATES}
    for name, folder in folders.items():
        folder.mkdir()
        proc = run_cli("new", f"{name}.ipynb", "--template", name, cwd=folder)
        assert proc.returncode == 0, proc.stderr
    (folders["compare-cost"] / "gpu_baseline.json").write_text(json.dumps(STANDIN_GPU_BASELINE))

    async def run_all() -> list[tuple[nbformat.NotebookNode, BaseException | None]]:
        return await asyncio.gather(*(_run(f / f"{n}.ipynb") for n, f in folders.items()))

    runs = dict(zip(TEMPLATES, asyncio.run(run_all()), strict=True))
    return {name: (nb, folders[name], error) for name, (nb, error) in runs.items()}


def _ran(executed: Executed, name: str) -> tuple[nbformat.NotebookNode, Path]:
    nb, folder, error = executed[name]
    assert error is None, f"the {name} template failed: {error}"
    return nb, folder


@pytest.mark.slow
def test_quickstart_template_runs_on_the_cpu(executed: Executed) -> None:
    quick, _ = _ran(executed, "tpu-quickstart")
    installed = _text(_by_source(quick, "%pip install"))
    assert "nothing to install" in installed and "no TPU on this machine" in installed
    assert "auto:" in _text(_by_source(quick, "%tpu_info"))  # the backend it would pick, and why
    epochs = _text(_by_source(quick, "for epoch")).splitlines()
    losses = [float(line.rsplit(" ", 1)[1]) for line in epochs]
    assert len(losses) == 3 and losses[-1] < losses[0]
    profiled = _text(_by_source(quick, "result = profile("))
    assert "measured" in profiled and "TPU v5e" in profiled
    forecast = _text(_by_source(quick, "forecast("))
    if has_module("jax") and has_module("torchax") and has_module("libtpu"):
        assert re.search(r"^v5e +compiled", forecast, re.MULTILINE), forecast
        assert re.search(r"^v6e +compiled", forecast, re.MULTILINE), forecast
    else:
        assert "Forecast skipped:" in forecast and "pip install" in forecast


@pytest.mark.slow
def test_migrate_template_runs_on_the_cpu(executed: Executed) -> None:
    migrate, folder = _ran(executed, "migrate")
    assert "G2T101" in _text(_by_source(migrate, "gpu2tpu check"))
    assert "+++ " in _text(_by_source(migrate, "rewrite --diff"))
    ran = _text(_by_source(migrate, "%run"))
    assert "step 4 loss" in ran and "peak memory" in ran
    assert ".to(device)" in _text(_by_source(migrate, "%%tpu --show-diff"))
    assert "measured" in _text(_by_source(migrate, "%%tpu --profile"))
    assert "spot" in _text(_by_source(migrate, "repriced"))
    assert ".cuda()" in (folder / "cuda_sample.py").read_text(encoding="utf-8"), (
        "the rewrite must work on a copy, never on SOURCE"
    )
    assert ".cuda()" not in (folder / "cuda_sample_tpu.py").read_text(encoding="utf-8")


@pytest.mark.slow
def test_compare_cost_template_loads_the_baseline(executed: Executed) -> None:
    cost, _ = _ran(executed, "compare-cost")
    loaded = _text(_by_source(cost, "BASELINE ="))
    assert "GPU baseline: NVIDIA A100 80GB (test stand-in)" in loaded
    table = _text(_by_source(cost, "print(result.comparison)"))
    assert "baseline" in table and "measured" in table and "gpu_baseline.json" in table
    assert "Ratios are against a100-80gb" in table
    assert "spot" in _text(_by_source(cost, "repriced"))


def test_kernel_is_this_interpreter() -> None:
    """nbclient starts the python3 kernelspec; jupyter_client runs it with this Python."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    command = KernelManager(kernel_name="python3").format_kernel_cmd()
    assert spec.argv[0] in ("python", "python3", sys.executable)
    assert command[0] == sys.executable
