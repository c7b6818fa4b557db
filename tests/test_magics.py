"""`%%tpu`, `%tpu_auto`, `%tpu_info` through a real IPython InteractiveShell."""

from __future__ import annotations

import linecache
import os
import re
import subprocess
import sys
import traceback

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from standins import forget_standins, use_standins
from traitlets.config import Config

import gpu2tpu.profile
from gpu2tpu.magics.execution import rewrite_in_place
from gpu2tpu.profile.dryrun import DryRunReport, HazardKind

NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")


@pytest.fixture(scope="module")
def shell() -> InteractiveShell:
    config = Config()
    config.HistoryManager.enabled = False  # no sqlite files, no "too many open files"
    ip = InteractiveShell.instance(config=config)
    ip.displayhook.flush = lambda: None  # jupysql's workaround for a gc hang at exit
    ip.run_line_magic("colors", "nocolor")  # tracebacks as plain text
    return ip


@pytest.fixture
def ip(shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch) -> InteractiveShell:
    """The shell with the extension loaded and no TPU runtime importable."""
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    use_standins(monkeypatch)  # hides torch_tpu and torch_xla
    shell.run_line_magic("load_ext", "gpu2tpu")
    shell.run_cell("import torch")
    yield shell
    shell.run_line_magic("unload_ext", "gpu2tpu")
    for name in ("device", "tpu_device", "x", "y", "z", "_tpu_dry_run"):
        shell.user_ns.pop(name, None)
    forget_standins()
    assert torch.get_default_device().type == "cpu"


def run(ip: InteractiveShell, cell: str):  # type: ignore[no-untyped-def]
    with capture_output() as cap:
        result = ip.run_cell(cell)
    return result, cap


def last_frame(error: BaseException) -> traceback.FrameSummary:
    return traceback.extract_tb(error.__traceback__)[-1]


# -- loading ---------------------------------------------------------------------------------------


def test_unload_removes_every_hook(shell: InteractiveShell) -> None:
    transformers = list(shell.input_transformers_post)
    callbacks = {e: list(shell.events.callbacks[e]) for e in ("pre_run_cell", "post_run_cell")}
    shell.run_line_magic("load_ext", "gpu2tpu")
    assert shell.find_cell_magic("tpu") and shell.find_line_magic("tpu_info")
    with capture_output():
        shell.run_line_magic("tpu_auto", "on --backend cpu")
    assert len(shell.input_transformers_post) == len(transformers) + 1
    shell.run_line_magic("unload_ext", "gpu2tpu")
    assert shell.find_cell_magic("tpu") is None
    assert shell.find_line_magic("tpu_auto") is None and shell.find_line_magic("tpu_info") is None
    assert shell.input_transformers_post == transformers
    for event, hooks in callbacks.items():
        assert shell.events.callbacks[event] == hooks


def test_help_documents_the_options(ip: InteractiveShell) -> None:
    doc = ip.find_cell_magic("tpu").__doc__
    for option in (
        "--backend",
        "--no-rewrite",
        "--show-diff",
        "--dry-run",
        "--profile",
        "--forecast",
    ):
        assert option in doc
    assert "silent fallback" in doc


# -- running a cell --------------------------------------------------------------------------------


@NO_GPU
def test_cuda_cell_runs_rewritten_and_shows_last_expression(ip: InteractiveShell) -> None:
    cell = "%%tpu --backend cpu\nx = torch.ones(3).cuda()\ntorch.cuda.synchronize()\ny = x * 2\ny.sum()\n"
    result, _ = run(ip, cell)
    assert result.success, result.error_in_exec
    assert result.result == 6.0  # the last expression is Out[n]
    assert ip.user_ns["y"].device.type == "cpu"
    silenced, _ = run(ip, "%%tpu --backend cpu\ny.sum();\n")
    assert silenced.success and silenced.result is None
    # The same cell without the rewrite fails here: the rewrite is what made it run.
    unrewritten, _ = run(ip, "%%tpu --backend cpu --no-rewrite\nz = torch.ones(3).cuda()\n")
    assert not unrewritten.success
    assert "NVIDIA" in str(unrewritten.error_in_exec)


def test_show_diff_prints_the_rewrite(ip: InteractiveShell) -> None:
    result, cap = run(ip, "%%tpu --backend cpu --show-diff\nx = torch.zeros(2).cuda()\n")
    assert result.success
    assert "-x = torch.zeros(2).cuda()" in cap.stdout
    assert "+x = torch.zeros(2).to(device)" in cap.stdout


def test_findings_the_rewrite_cannot_fix_are_listed_with_cell_lines(ip: InteractiveShell) -> None:
    cell = "%%tpu --backend cpu\nx = torch.ones(2)\nwith torch.cuda.stream(None):\n    y = x + 1\n"
    result, cap = run(ip, cell)
    assert result.success, result.error_in_exec
    # A report-only finding, at the cell's own line 3.
    assert re.search(r"gpu2tpu: line 3: G2T\d{3} `torch\.cuda\.stream`", cap.stderr), cap.stderr


def test_error_halfway_points_at_the_cell_line_and_restores_device(ip: InteractiveShell) -> None:
    cell = "%%tpu --backend cpu\na = 1\nx = torch.ones(2).cuda()\nraise ValueError('boom')\nb = 2\n"
    result, cap = run(ip, cell)
    error = result.error_in_exec
    assert isinstance(error, ValueError)
    frame = last_frame(error)
    assert frame.lineno == 4  # line 1 is the %%tpu line, as the notebook numbers it
    assert ip.compile._filename_map[frame.filename] == ip.execution_count
    assert linecache.getline(frame.filename, 4).strip() == "raise ValueError('boom')"
    assert "b" not in ip.user_ns and ip.user_ns["a"] == 1
    assert "Cell In[" in cap.stdout and "line 4" in cap.stdout


def test_leading_blank_lines_keep_line_numbers(ip: InteractiveShell) -> None:
    result, _ = run(ip, "%%tpu --backend cpu\n\n\nraise ValueError('line 4')\n")
    assert last_frame(result.error_in_exec).lineno == 4


def test_failing_cell_restores_default_device_on_a_tpu_backend(
    ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_standins(monkeypatch, "torch_tpu")  # its "TPU" is the meta device
    cell = (
        "%%tpu --backend tpu\nz = torch.empty(2)\nkind = z.device.type\nraise KeyboardInterrupt\n"
    )
    result, _ = run(ip, cell)
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert ip.user_ns["kind"] == "meta"
    assert torch.get_default_device().type == "cpu"
    assert torch.empty(1).device.type == "cpu"


def test_xla_cell_ends_with_a_sync(ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    use_standins(monkeypatch, "torch_xla")
    import torch_xla  # the stand-in

    before = torch_xla.syncs
    result, cap = run(ip, "%%tpu\nz = torch.zeros(2).cuda()\nz.device.type\n")
    assert result.success, result.error_in_exec
    assert result.result == "meta"  # the stand-in's XLA device
    assert "auto: using PyTorch/XLA" in cap.stdout
    assert torch_xla.syncs == before + 1  # the cell's lazy graph ran when the cell ended


def test_syntax_error_is_a_normal_syntax_error_at_the_user_line(ip: InteractiveShell) -> None:
    result, _ = run(ip, "%%tpu --backend cpu\nsyntax_probe = 1\nb = (1,\nc = 3\n")
    error = result.error_in_exec
    assert isinstance(error, SyntaxError)
    assert error.lineno in (3, 4)  # where Python reports an unclosed bracket
    assert ip.compile._filename_map[error.filename] == ip.execution_count
    assert "syntax_probe" not in ip.user_ns  # nothing ran


def test_unknown_backend_unknown_option_and_unavailable_backend(ip: InteractiveShell) -> None:
    with pytest.raises(UsageError, match="known backends are: auto, tpu, xla, jax, cuda, cpu"):
        ip.run_cell_magic("tpu", "--backend tpu9", "a = 1")
    with pytest.raises(UsageError, match="unrecognized arguments: --bogus"):
        ip.run_cell_magic("tpu", "--bogus", "a = 1")
    with pytest.raises(UsageError, match=r"pip install torch-tpu"):
        ip.run_cell_magic("tpu", "--backend tpu", "a = 1")
    with pytest.raises(UsageError, match=r"torch_xla\[tpu\]==2\.9\.0"):
        ip.run_cell_magic("tpu", "--backend xla", "a = 1")
    with pytest.raises(UsageError, match="needs code"):
        ip.run_cell_magic("tpu", "", "   \n")


def test_composes_with_time_in_both_orders(ip: InteractiveShell) -> None:
    outer, cap = run(ip, "%%time\n%%tpu --backend cpu\nx = torch.ones(2).cuda()\n")
    assert outer.success and "Wall time" in cap.stdout
    assert ip.user_ns["x"].device.type == "cpu"
    failing, _ = run(ip, "%%time\n%%tpu --backend cpu\nraise ValueError('line 3')\n")
    assert last_frame(failing.error_in_exec).lineno == 3  # below both magic lines
    ip.user_ns.pop("x")
    inner, cap = run(ip, "%%tpu --backend cpu\n%%time\nx = torch.ones(2).cuda()\n")
    assert inner.success and "Wall time" in cap.stdout
    assert ip.user_ns["x"].device.type == "cpu"


def test_rewrite_keeps_every_line_in_place() -> None:
    ns: dict = {"torch": torch}
    source = "a = 1\ntorch.cuda.synchronize()\nx = torch.zeros(2).cuda()\n"
    new, result = rewrite_in_place(source, "device", ns)
    assert new.count("\n") == source.count("\n")
    assert new.splitlines()[0] == "a = 1"
    assert "torch.cuda" not in new
    assert {f.line for f in result.edits} == {2, 3}  # the cell's own lines


# -- the dry run -----------------------------------------------------------------------------------


def test_auto_without_tpu_is_a_dry_run_with_cell_lines(ip: InteractiveShell) -> None:
    cell = (
        "%%tpu\n"
        "w = torch.randn(4, 4).cuda()\n"
        "total = 0.0\n"
        "for _ in range(3):\n"
        "    total += (w @ w).sum().item()\n"
        "w64 = w.double()\n"
        "total\n"
    )
    result, cap = run(ip, cell)
    assert result.success, result.error_in_exec
    assert isinstance(result.result, float)
    assert "auto: no TPU backend found" in cap.stdout
    report: DryRunReport = ip.user_ns["_tpu_dry_run"]
    sync = report.by_kind(HazardKind.HOST_SYNC)
    assert [(h.line, h.count) for h in sync] == [(5, 3)]
    assert report.lines(HazardKind.FLOAT64) == [6]
    assert sync[0].code == "total += (w @ w).sum().item()"
    shown = "".join(str(o.data.get("text/plain", "")) for o in cap.outputs)
    assert "host sync (3)" in shown and "line 5" in shown


def test_dry_run_flags_a_new_batch_shape_on_the_second_run(ip: InteractiveShell) -> None:
    cell = "%%tpu --dry-run\nout = torch.nn.functional.linear(batch, weight)\n"
    ip.user_ns["weight"] = torch.randn(3, 8)
    ip.user_ns["batch"] = torch.randn(16, 8)
    run(ip, cell)
    assert ip.user_ns["_tpu_dry_run"].by_kind(HazardKind.SHAPE_CHANGE) == []
    run(ip, cell)
    assert ip.user_ns["_tpu_dry_run"].by_kind(HazardKind.SHAPE_CHANGE) == []
    ip.user_ns["batch"] = torch.randn(5, 8)
    run(ip, cell)
    assert ip.user_ns["_tpu_dry_run"].lines(HazardKind.SHAPE_CHANGE) == [2]


# -- auto mode -------------------------------------------------------------------------------------


@NO_GPU
def test_tpu_auto_rewrites_every_cell_until_off(ip: InteractiveShell) -> None:
    _, cap = run(ip, "%tpu_auto on --backend cpu")
    assert "auto mode on" in cap.stdout
    result, _ = run(ip, "x = torch.ones(2).cuda()\ntorch.cuda.synchronize()\nx.device.type")
    assert result.success, result.error_in_exec
    assert result.result == "cpu"
    failing, _ = run(ip, "y = 1\nraise RuntimeError('at line 2')\n")
    assert last_frame(failing.error_in_exec).lineno == 2
    run(ip, "%tpu_auto off")
    plain, _ = run(ip, "z = torch.ones(2).cuda()\n")
    assert not plain.success


def test_tpu_auto_rejects_bad_arguments(ip: InteractiveShell) -> None:
    with pytest.raises(UsageError, match="usage: %tpu_auto on"):
        ip.run_line_magic("tpu_auto", "maybe")
    with pytest.raises(UsageError, match="known backends"):
        ip.run_line_magic("tpu_auto", "on --backend nope")


# -- torchax --------------------------------------------------------------------------------------


JAX_CELLS = """
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from traitlets.config import Config
from gpu2tpu.backends.jax import BACKWARD_LIMITATION
config = Config()
config.HistoryManager.enabled = False
ip = InteractiveShell.instance(config=config)
ip.run_line_magic("load_ext", "gpu2tpu")
ip.run_cell("import torch")
forward = (
    "%%tpu --backend jax\\n"
    "m = torch.nn.Linear(4, 2).cuda()\\n"
    "x = torch.randn(3, 4).cuda()\\n"
    "y = m(x)\\n"
    "(y.device.type, tuple(y.shape))\\n"
)
with capture_output() as cap:
    result = ip.run_cell(forward)
assert result.success, result.error_in_exec
assert result.result == ("jax", (3, 2)), result.result
assert "makes 'jax' torch's accelerator" in cap.stdout
with capture_output():
    result = ip.run_cell("%%tpu --backend jax\\nloss = m(x).sum()\\nloss.backward()\\n")
assert isinstance(result.error_in_exec, RuntimeError), result.error_in_exec
assert BACKWARD_LIMITATION in result.error_in_exec.__notes__
import traceback
frames = traceback.extract_tb(result.error_in_exec.__traceback__)
assert any(f.lineno == 3 and f.line == "loss.backward()" for f in frames), frames
"""


def test_jax_backend_forward_runs_and_backward_explains() -> None:
    # torchax changes torch for the whole process: run the session in a child process.
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, "-c", JAX_CELLS], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]


# -- hooks for the profiler and the forecast ------------------------------------------------------


def test_profile_and_forecast_dispatch_to_the_profile_package(
    ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def cell_profile(run_cell, *, backend):  # type: ignore[no-untyped-def]
        calls.append(("profile", backend.name, run_cell(), run_cell()))
        return "profiled"

    def forecast_cell(run_cell, *, targets, backend, source):  # type: ignore[no-untyped-def]
        calls.append(("forecast", targets, backend.name, "counter" in source))
        return "forecast"

    monkeypatch.setattr(gpu2tpu.profile, "cell_profile", cell_profile, raising=False)
    monkeypatch.setattr(gpu2tpu.profile, "forecast_cell", forecast_cell, raising=False)
    ip.user_ns["counter"] = 0
    cell = "counter += 1\ncounter\n"
    assert ip.run_cell_magic("tpu", "--backend cpu --profile", cell) == "profiled"
    assert calls[0] == ("profile", "cpu", 1, 2)  # the cell is the step: it runs per call
    assert ip.run_cell_magic("tpu", "--backend cpu --forecast v5e,v6e", cell) == "forecast"
    assert calls[1] == ("forecast", ["v5e", "v6e"], "cpu", True)
    # An install without the forecast: neither the attribute nor its lazy entry.
    monkeypatch.delattr(gpu2tpu.profile, "forecast_cell")
    monkeypatch.delitem(gpu2tpu.profile._LAZY, "forecast_cell")
    with pytest.raises(UsageError, match="forecast_cell"):
        ip.run_cell_magic("tpu", "--backend cpu --forecast v5e", cell)


# -- %tpu_info -----------------------------------------------------------------------------------


def test_tpu_info_text_in_a_terminal(ip: InteractiveShell) -> None:
    with capture_output() as cap:
        ip.run_line_magic("tpu_info", "")
    text = cap.stdout
    assert "[missing] tpu" in text and "pip install torch-tpu" in text
    assert "[found]   cpu" in text and "kind cpu" in text
    assert "torch " + torch.__version__.split("+")[0] in text


def test_tpu_info_widget_in_a_kernel(ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch) -> None:
    import ipywidgets

    monkeypatch.setattr(ip, "kernel", object(), raising=False)
    with capture_output() as cap:
        ip.run_line_magic("tpu_info", "")
    assert cap.stdout == ""
    [output] = cap.outputs
    assert "application/vnd.jupyter.widget-view+json" in output.data
    from gpu2tpu.magics.info import collect_info

    widget = collect_info().widget()
    assert all(isinstance(child, ipywidgets.HTML) for child in widget.children)
    assert "pip install torch-tpu" in widget.children[1].value


def test_tpu_doctor_reports_the_cpu_environment_as_usable(ip: InteractiveShell) -> None:
    with capture_output() as cap:
        ip.run_line_magic("tpu_doctor", "")
    assert "No problems found." in cap.stdout
    assert "CPU: PyTorch" in cap.stdout
