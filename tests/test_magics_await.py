"""A `%%tpu` cell with top-level `await`, in a real IPython InteractiveShell: it runs as IPython
runs an async cell (the shell's loop runner), and where an event loop already runs the cell (a
Jupyter kernel's) it says why it cannot, in one line, instead of a SyntaxError from gpu2tpu's
own frames."""

from __future__ import annotations

import asyncio

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from standins import forget_standins, use_standins
from traitlets.config import Config

CELL = (
    "%%tpu --backend cpu\n"
    "import asyncio\n"
    "x = torch.ones(3).cuda()\n"
    "await asyncio.sleep(0)\n"
    "y = x * 2\n"
    "await asyncio.sleep(0, result=y.sum())\n"
)


@pytest.fixture
def ip(monkeypatch: pytest.MonkeyPatch) -> InteractiveShell:
    config = Config()
    config.HistoryManager.enabled = False
    shell = InteractiveShell.instance(config=config)
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    use_standins(monkeypatch)
    shell.run_line_magic("load_ext", "gpu2tpu")
    shell.run_cell("import torch")
    yield shell
    shell.run_line_magic("unload_ext", "gpu2tpu")
    for name in ("device", "x", "y", "asyncio"):
        shell.user_ns.pop(name, None)
    forget_standins()
    assert torch.get_default_device().type == "cpu"


def test_a_tpu_cell_with_top_level_await_runs_as_ipython_runs_it(ip: InteractiveShell) -> None:
    with capture_output():
        result = ip.run_cell(CELL, store_history=True)
    assert result.success, result.error_in_exec or result.error_before_exec
    assert result.result == 6.0  # the awaited last expression is Out[n]
    assert ip.user_ns["y"].device.type == "cpu"  # the rewritten `.cuda()` ran on the backend


def test_without_autoawait_it_is_python_s_own_syntax_error(ip: InteractiveShell) -> None:
    ip.autoawait = False
    try:
        with capture_output():
            result = ip.run_cell(CELL, store_history=True)
    finally:
        ip.autoawait = True
    assert isinstance(result.error_in_exec, SyntaxError)
    assert "outside function" in str(result.error_in_exec)


def test_inside_a_running_event_loop_it_says_why_in_one_line(ip: InteractiveShell) -> None:
    async def as_a_kernel_runs_it() -> object:  # ipykernel runs a magic's cell in its loop
        with capture_output():
            return ip.run_cell(CELL, store_history=True)

    result = asyncio.run(as_a_kernel_runs_it())
    error = result.error_in_exec
    assert isinstance(error, RuntimeError)
    assert str(error).startswith("gpu2tpu: top-level `await` in a %%tpu cell cannot run")
    assert "%tpu_auto on" in str(error) and "\n" not in str(error)
