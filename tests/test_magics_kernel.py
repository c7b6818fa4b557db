"""The extension in a real Jupyter kernel, run by nbclient as papermill or CI would run it.

One kernel start: the example notebook loads the extension, runs `%%tpu` cells (a rewritten
CUDA cell, the CPU dry run), turns on `%tpu_auto`, asks `%tpu_info`, and ends with a cell that
fails half-way, which must stop the run with the error at the cell's own line.
"""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "tests" / "fixtures" / "notebooks" / "magic_demo.ipynb"

pytestmark = pytest.mark.slow


def _text(cell: nbformat.NotebookNode) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            parts.append(out.text)
        elif "data" in out:
            parts.append(str(out.data.get("text/plain", "")))
            parts.append(str(out.data.get("text/html", "")))
        elif out.output_type == "error":
            parts.append("\n".join(out.traceback))
    return "".join(parts)


def _by_tag(nb: nbformat.NotebookNode, tag: str) -> nbformat.NotebookNode:
    [cell] = [c for c in nb.cells if tag in c.metadata.get("tags", [])]
    return cell


def test_example_notebook_runs_and_a_failing_cell_stops_it(tmp_path: Path) -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    env.pop("PJRT_DEVICE", None)
    client = NotebookClient(
        nb,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    with pytest.raises(CellExecutionError) as err:
        client.execute(env=env)

    rewritten = _by_tag(nb, "rewritten")
    assert "cpu" in _text(rewritten)
    assert rewritten.outputs[-1].output_type == "execute_result"  # the last expression

    dry = _by_tag(nb, "dry-run")
    dry_text = _text(dry)
    assert "host sync" in dry_text and "line 5" in dry_text

    auto = _by_tag(nb, "auto-cell")
    assert "'cpu'" in _text(auto)

    info = _by_tag(nb, "info")
    assert any(
        "application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in info.outputs
    )

    failing = _by_tag(nb, "fails")
    assert failing.outputs[-1].output_type == "error"
    assert failing.outputs[-1].ename == "ZeroDivisionError"
    assert "line 4" in _text(failing)
    assert "ZeroDivisionError" in str(err.value)
    # The run stopped at the failing cell: the cell after it never ran.
    assert _by_tag(nb, "after-failure").get("execution_count") is None
