"""`%%tpu`, `%tpu_auto`, `%tpu_info` through a real IPython InteractiveShell."""

from __future__ import annotations

import linecache
import os
import re
import subprocess
import sys
import time
import traceback

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from standins import forget_standins, use_standins
from traitlets.config import Config

import gpu2tpu.forecasting.forecast
import gpu2tpu.measure
from gpu2tpu.readiness.dryrun import DryRunReport, HazardKind

LINE_MAGICS = ("tpu_auto", "tpu_info", "tpu_doctor")
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
    """Run a cell as a kernel does: counted in the history (IPython 9 counts it first)."""
    with capture_output() as cap:
        result = ip.run_cell(cell, store_history=True)
    return result, cap


def shown_traceback(cap) -> str:  # type: ignore[no-untyped-def]
    """What IPython printed for an error, with cell and line numbers made comparable."""
    return re.sub(r"In\[\d+\], line \d+", "In[n], line k", cap.stdout)


def last_frame(error: BaseException) -> traceback.FrameSummary:
    return traceback.extract_tb(error.__traceback__)[-1]


# -- loading ---------------------------------------------------------------------------------------


def test_unload_removes_every_hook(shell: InteractiveShell) -> None:
    hooks = {
        "cleanup": list(shell.input_transformers_cleanup),
        "post": list(shell.input_transformers_post),
        "ast": list(shell.ast_transformers),
    }
    callbacks = {e: list(shell.events.callbacks[e]) for e in ("pre_run_cell", "post_run_cell")}
    custom = shell.custom_exceptions
    shell.run_line_magic("load_ext", "gpu2tpu")
    for kind, name in (("cell", "tpu"), *(("line", n) for n in LINE_MAGICS)):
        assert shell.find_magic(name, kind), name
    with capture_output():
        shell.run_line_magic("tpu_auto", "on --backend cpu")
    assert len(shell.input_transformers_cleanup) == len(hooks["cleanup"]) + 1
    assert len(shell.ast_transformers) == len(hooks["ast"]) + 1
    assert "showtraceback" in shell.__dict__
    shell.run_line_magic("unload_ext", "gpu2tpu")
    assert shell.find_cell_magic("tpu") is None
    for name in LINE_MAGICS:  # %tpu_doctor included
        assert shell.find_line_magic(name) is None, name
    assert shell.input_transformers_cleanup == hooks["cleanup"]
    assert shell.input_transformers_post == hooks["post"]
    assert shell.ast_transformers == hooks["ast"]
    assert "showtraceback" not in shell.__dict__
    assert shell.custom_exceptions == custom
    for event, registered in callbacks.items():
        assert shell.events.callbacks[event] == registered


def test_help_documents_the_options(ip: InteractiveShell) -> None:
    doc = ip.find_cell_magic("tpu").__doc__
    for option in (
        "--backend",
        "--no-rewrite",
        "--show-diff",
        "--dry-run",
        "--profile",
        "--forecast",
        "--output",
        "--steps",
        "--warmup",
        "--tokens-per-step",
        "--samples-per-step",
        "--chips",
        "--search",
        "--full",
        "--trace",
    ):
        assert option in doc
    assert "silent fallback" in doc
    auto_doc = ip.find_line_magic("tpu_auto").__doc__
    assert "--backend" in auto_doc and "{on,off,log}" in auto_doc  # magic_arguments' usage
    assert "--show-diff" in auto_doc


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
    assert re.fullmatch(
        r"gpu2tpu: line 3: `torch\.cuda\.stream`[^\n]*\(G2T\d{3}\)\n", cap.stderr
    ), cap.stderr


def test_a_size_scaled_by_the_device_count_is_said_to_be_0_without_an_accelerator(
    ip: InteractiveShell,
) -> None:
    cell = "%%tpu --backend cpu\nn = 3\nbatch = 64 * torch.cuda.device_count()\n"
    result, cap = run(ip, cell)
    assert result.success, result.error_in_exec
    assert ip.user_ns["batch"] == 0  # as the cell says: no accelerator in this kernel
    assert re.search(
        r"gpu2tpu: line 3: `torch\.cuda\.device_count\(\)` is 0 [^\n]*\(G2T116\)\n", cap.stderr
    ), cap.stderr
    assert "gpu2tpu: line 3: the device count is 0 in this kernel" in cap.stderr, cap.stderr
    ip.user_ns.pop("batch", None)
    ip.user_ns.pop("n", None)


def test_error_halfway_shows_the_cell_as_written_with_its_own_number(
    ip: InteractiveShell,
) -> None:
    cell = "%%tpu --backend cpu\na = 1\nx = torch.ones(2).cuda()\nraise ValueError('boom')\nb = 2\n"
    result, cap = run(ip, cell)
    error = result.error_in_exec
    assert isinstance(error, ValueError)
    frame = last_frame(error)
    assert frame.lineno == 4  # line 1 is the %%tpu line, as the notebook numbers it
    # the cell's own number, although IPython 9 has counted the next one already
    assert ip.compile._filename_map[frame.filename] == result.execution_count
    assert linecache.getline(frame.filename, 3) == "x = torch.ones(2).cuda()\n"  # as written
    assert "b" not in ip.user_ns and ip.user_ns["a"] == 1
    assert f"Cell In[{result.execution_count}], line 4" in cap.stdout
    assert "gpu2tpu" not in cap.stdout  # no frame of the extension is shown


def test_error_on_a_rewritten_line_notes_what_ran(ip: InteractiveShell) -> None:
    result, cap = run(ip, "%%tpu --backend cpu\ny = torch.ones(2).cuda() @ torch.ones(3)\n")
    error = result.error_in_exec
    assert isinstance(error, RuntimeError)
    note = f"gpu2tpu: line 2 of In[{result.execution_count}] ran rewritten as: "
    assert note + "y = torch.ones(2).to(device) @ torch.ones(3)" in error.__notes__
    assert "----> 2 y = torch.ones(2).cuda() @ torch.ones(3)" in cap.stdout  # the user's line
    assert note in cap.stdout  # IPython shows the note under the message


def test_leading_blank_lines_keep_line_numbers(ip: InteractiveShell) -> None:
    result, _ = run(ip, "%%tpu --backend cpu\n\n\nraise ValueError('line 4')\n")
    assert last_frame(result.error_in_exec).lineno == 4


def test_host_data_stays_on_the_host_and_a_failing_cell_restores_the_accelerator(
    ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_standins(monkeypatch, "torch_tpu")  # its "TPU" is the meta device
    original = torch.accelerator.current_accelerator
    cell = (
        "%%tpu --backend tpu\nz = torch.empty(2)\nkinds = (z.device.type, z.cuda().device.type)"
        "\nraise KeyboardInterrupt\n"
    )
    result, _ = run(ip, cell)
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    # As on the GPU: made on the host, moved by the cell's own (rewritten) `.cuda()`.
    assert ip.user_ns.pop("kinds") == ("cpu", "meta")
    assert torch.get_default_device().type == "cpu"
    assert torch.accelerator.current_accelerator is original


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


def test_syntax_error_looks_like_ipythons_own(ip: InteractiveShell) -> None:
    body = "syntax_probe = 1\nb = (1,\nc = 3\n"
    result, cap = run(ip, "%%tpu --backend cpu\n" + body)
    error = result.error_in_exec
    assert isinstance(error, SyntaxError) and type(error).__name__ == "SyntaxError"
    assert error.lineno in (3, 4)  # where Python reports an unclosed bracket, below %%tpu
    assert ip.compile._filename_map[error.filename] == result.execution_count
    assert "syntax_probe" not in ip.user_ns  # nothing ran
    plain, plain_cap = run(ip, body)  # the same error in a cell IPython compiles itself
    assert isinstance(plain.error_before_exec, SyntaxError)
    assert shown_traceback(cap) == shown_traceback(plain_cap)
    assert "Traceback" not in cap.stdout and "gpu2tpu" not in cap.stdout


def test_cell_numbers_in_diff_headers_and_dry_run_titles(ip: InteractiveShell) -> None:
    result, cap = run(ip, "%%tpu --dry-run --show-diff\nx = torch.ones(2).cuda()\nx.sum().item()\n")
    assert result.success, result.error_in_exec
    label = f"In[{result.execution_count}]"
    assert f"--- {label} (as written)" in cap.stdout
    assert ip.user_ns["_tpu_dry_run"].label == label


def test_line_magics_inside_the_cell_are_rewritten(ip: InteractiveShell) -> None:
    result, cap = run(ip, "%%tpu --backend cpu\n%time z = torch.ones(2).cuda()\nz.device.type\n")
    assert result.success, result.error_in_exec
    assert result.result == "cpu" and "Wall time" in cap.stdout


def test_cuda_event_timing_keeps_every_statement_where_it_was(ip: InteractiveShell) -> None:
    import time

    cell = (
        "%%tpu --backend cpu --show-diff\n"
        "start = torch.cuda.Event(enable_timing=True)\n"
        "end = torch.cuda.Event(enable_timing=True)\n"
        "start.record()\n"
        "w = torch.ones(2).cuda() * 2\n"
        "end.record()\n"
        "torch.cuda.synchronize()\n"
        "ms = start.elapsed_time(end)\n"
    )
    ip.user_ns.pop("time", None)
    result, cap = run(ip, cell)
    assert result.success, result.error_in_exec
    assert isinstance(ip.user_ns["ms"], float) and ip.user_ns["ms"] >= 0
    assert ip.user_ns["time"] is time  # the import the rewrite needs ran before the cell
    added = [line[1:] for line in cap.stdout.splitlines() if line.startswith("+")][1:]
    assert "start = time.perf_counter()" in added  # at the top level, not under an `if`
    assert not any(line.startswith(("import", "from")) for line in added)  # no line added
    ip.user_ns.pop("time")


def test_an_import_the_rewrite_needs_never_overwrites_a_variable(ip: InteractiveShell) -> None:
    ip.user_ns["time"] = "the user's own"
    result, cap = run(ip, "%%tpu --backend cpu\nstart = torch.cuda.Event(enable_timing=True)\n")
    assert ip.user_ns["time"] == "the user's own"
    assert re.search(r"gpu2tpu: line 2: .*\(G2T\d{3}\)", cap.stderr), cap.stderr  # said, not fixed
    ip.user_ns.pop("time")


@NO_GPU
def test_a_stale_cuda_device_from_an_unwrapped_cell_is_replaced(ip: InteractiveShell) -> None:
    ip.user_ns["device"] = torch.device("cuda")  # as a cell run without gpu2tpu left it
    ip.user_ns["dev_name"] = "cuda:0"
    cell = (
        "%%tpu --backend cpu\nx = torch.ones(2).to(device)\ny = torch.ones(2, device=dev_name)\n"
        "(x.device.type, y.device.type)\n"
    )
    result, cap = run(ip, cell)
    assert result.success, result.error_in_exec
    assert result.result == ("cpu", "cpu")
    assert "gpu2tpu: `device` holds device(type='cuda') from a cell that ran without" in cap.stderr
    assert "`dev_name` holds 'cuda:0'" in cap.stderr
    assert ip.user_ns["dev_name"] == "cpu"
    ip.user_ns.pop("dev_name")


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
    assert "falling back to the CPU, as a dry run" in cap.stdout
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
    with pytest.raises(UsageError, match="invalid choice: 'maybe'"):
        ip.run_line_magic("tpu_auto", "maybe")
    with pytest.raises(UsageError, match="known backends"):
        ip.run_line_magic("tpu_auto", "on --backend nope")
    with pytest.raises(UsageError, match="--backend goes with on"):
        ip.run_line_magic("tpu_auto", "off --backend cpu")


@NO_GPU
def test_auto_mode_says_problems_maps_errors_and_times_cuda_events(ip: InteractiveShell) -> None:
    run(ip, "%tpu_auto on --backend cpu")
    try:
        result, cap = run(ip, "with torch.cuda.stream(None):\n    s = 1\n")
        assert result.success, result.error_in_exec
        assert re.fullmatch(
            r"gpu2tpu: line 1: `torch\.cuda\.stream`[^\n]*\(G2T\d{3}\)\n", cap.stderr
        )
        # CUDA-event timing: the codemod adds lines (an import, synchronizes); the cell runs
        # and its error still points at the line as written, with what ran there.
        cell = (
            "start = torch.cuda.Event(enable_timing=True)\n"
            "end = torch.cuda.Event(enable_timing=True)\n"
            "start.record()\n"
            "w = torch.ones(2).cuda()\n"
            "end.record()\n"
            "torch.cuda.synchronize()\n"
            "elapsed = start.elapsed_time(end)\n"
            "bad = w @ torch.ones(3).cuda()\n"
        )
        result, cap = run(ip, cell)
        error = result.error_in_exec
        assert isinstance(error, RuntimeError), error
        assert isinstance(ip.user_ns["elapsed"], float) and ip.user_ns["elapsed"] >= 0
        frame = last_frame(error)
        assert frame.lineno == 8
        assert linecache.getline(frame.filename, 8) == "bad = w @ torch.ones(3).cuda()\n"
        assert ip.compile._filename_map[frame.filename] == result.execution_count
        assert f"Cell In[{result.execution_count}], line 8" in cap.stdout
        ran = "ran rewritten as: bad = w @ torch.ones(3).to(device)"
        assert any(ran in note for note in error.__notes__) and ran in cap.stdout
        # line magics are rewritten too, and a syntax error is IPython's own
        result, cap = run(ip, "%time q = torch.ones(2).cuda()\nq.device.type\n")
        assert result.result == "cpu" and "Wall time" in cap.stdout
        broken, broken_cap = run(ip, "v = (1,\n")
        assert isinstance(broken.error_before_exec, SyntaxError)
    finally:
        run(ip, "%tpu_auto off")
    plain, plain_cap = run(ip, "v = (1,\n")
    assert shown_traceback(broken_cap) == shown_traceback(plain_cap)


@NO_GPU
def test_auto_mode_replaces_a_stale_cuda_device(ip: InteractiveShell) -> None:
    ip.user_ns["dev"] = torch.device("cuda:0")  # set before auto mode, by an unwrapped cell
    run(ip, "%tpu_auto on --backend cpu")
    try:
        result, cap = run(ip, "q = torch.ones(2).to(dev)\nq.device.type\n")
    finally:
        run(ip, "%tpu_auto off")
        ip.user_ns.pop("dev")
    assert result.result == "cpu", result.error_in_exec
    assert "gpu2tpu: `dev` holds device(type='cuda', index=0)" in cap.stderr


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
import time
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

    def cell_profile(run_cell, *, backend, **options):  # type: ignore[no-untyped-def]
        calls.append(("profile", backend.name, run_cell(), run_cell(), options))
        return "profiled"

    def forecast_cell(namespace, *, targets, backend, source, **options):  # type: ignore[no-untyped-def]
        calls.append(("forecast", targets, backend.name, namespace["counter"], options))
        return "forecast"

    monkeypatch.setattr(gpu2tpu.measure, "cell_profile", cell_profile)
    monkeypatch.setattr(gpu2tpu.forecasting.forecast, "forecast_cell", forecast_cell)
    ip.user_ns["counter"] = 0
    cell = (
        "counter += 1\nmodel = torch.nn.Linear(4, 2)\nbatch = (torch.ones(8, 4), None)\ncounter\n"
    )
    line = "--backend cpu --profile --steps 4 --warmup 1 --tokens-per-step 1_024 -o prof"
    assert ip.run_cell_magic("tpu", line, cell) == "profiled"
    assert ip.user_ns["prof"] == "profiled"  # -o NAME binds the result
    # the cell is the step: it runs per call
    assert calls[0] == (
        "profile",
        "cpu",
        1,
        2,
        {"steps": 4, "warmup": 1, "tokens_per_step": 1024.0},
    )
    assert ip.run_cell_magic("tpu", "--backend cpu --forecast v5e,v6e", cell) == "forecast"
    # the cell ran once before the forecast read it; the largest-batch search is off unless asked
    assert calls[1] == ("forecast", ["v5e", "v6e"], "cpu", 3, {"batch_search": False})
    ip.run_cell_magic("tpu", "--backend cpu --forecast v5e --search --chips 2", cell)
    assert calls[2][-1] == {"batch_search": True, "chips": 2}


def test_profile_of_a_forecast_model_uses_the_compiled_tpu_figures(
    ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_widgets import make_forecast  # v5e and v6e compiled at batch 64

    forecast = make_forecast()

    def forecast_cell(namespace, *, targets, backend, source, **options):  # type: ignore[no-untyped-def]
        return forecast

    monkeypatch.setattr(gpu2tpu.forecasting.forecast, "forecast_cell", forecast_cell)
    setup = (
        "%%tpu --backend cpu --forecast v5e,v6e\nmodel = torch.nn.Linear(32, 32)\n"
        "batch = (torch.randn(64, 32), torch.randn(64, 32))\n"
    )
    forecasted, _ = run(ip, setup)
    assert forecasted.result is forecast, forecasted.error_in_exec
    step = (
        "%%tpu --backend cpu --profile --steps 3 --warmup 1 --samples-per-step 64\n"
        "model(batch[0]).pow(2).mean().backward()\n"
    )
    result, cap = run(ip, step)
    assert result.result is None  # one line by default; the result is in _tpu_profile
    profiled = ip.user_ns["_tpu_profile"]
    rows = {r.device_key: r for r in profiled.comparison.rows}
    for key in ("v5e", "v6e"):
        assert rows[key].source == "compiled"
        assert rows[key].step_seconds == forecast.target(key).step_seconds
        assert f"forecast of `model` in In[{forecasted.execution_count}]" in rows[key].note
    assert rows["v5p"].source == "estimated"  # not forecast: still the roofline of this run
    assert "the compiled figures of the forecast of `model`" in cap.stdout
    for name in ("model", "batch"):
        ip.user_ns.pop(name)


def test_forecast_says_which_earlier_values_it_used(
    ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = []

    def forecast_cell(namespace, *, targets, backend, source, **options):  # type: ignore[no-untyped-def]
        seen.append(targets)
        return "forecast"

    monkeypatch.setattr(gpu2tpu.forecasting.forecast, "forecast_cell", forecast_cell)
    for name in ("model", "batch", "example_batch"):
        ip.user_ns.pop(name, None)
    result, _ = run(ip, "%%tpu --backend cpu --forecast v5e\nprint('ran')\n")
    assert isinstance(result.error_in_exec, UsageError)
    assert "needs the cell to define `model`" in str(result.error_in_exec)
    assert seen == []  # a cell that binds nothing cannot make a model: stopped before it ran
    result, _ = run(ip, "%%tpu --backend cpu --forecast v5e\nx = 1\n")
    assert "needs the cell to define `model`" in str(result.error_in_exec)
    assert seen == [] and ip.user_ns.pop("x") == 1  # `x` could have been a model
    ip.user_ns["model"] = torch.nn.Linear(4, 2)
    result, cap = run(ip, "%%tpu --backend cpu --forecast v5e\nbatch = (torch.ones(8, 4), None)\n")
    assert result.result == "forecast", result.error_in_exec
    assert "gpu2tpu: --forecast uses `model` from an earlier cell: Linear (10 parameters)" in (
        cap.stdout
    )
    assert "`batch`" not in cap.stdout  # the cell defined it
    for name in ("model", "batch"):
        ip.user_ns.pop(name)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("--forecast v9z", "unknown TPU target 'v9z'"),
        ("--forecast ,", "needs TPU targets"),
        ("--forecast h100", "names no TPU"),
        ("--profile --forecast v5e", "--profile and --forecast cannot be combined"),
        ("--dry-run --backend xla", "--dry-run runs on the CPU"),
        ("--dry-run --profile", "--dry-run and --profile cannot be combined"),
        ("--steps 5", "--steps goes with --profile"),
        ("--search", "--search goes with --forecast"),
        ("--forecast v5e --chips 3", "not a power of two"),
        ("--profile --steps 0", "--steps must be at least 1"),
        ("--profile --tokens-per-step -4", "--tokens-per-step must be a positive number"),
        ("--profile -o 2x", "-o takes a variable name"),
        ("--show-diff --no-rewrite", "no rewrite to show"),
        ("--profile --steps many", "invalid int value: 'many'"),
    ],
)
def test_bad_arguments_are_one_line_usage_errors_before_anything_runs(
    ip: InteractiveShell, line: str, message: str
) -> None:
    ip.user_ns["ran"] = 0
    result, cap = run(ip, f"%%tpu {line}\nran += 1\n")
    error = result.error_in_exec
    assert isinstance(error, UsageError), error
    assert message in str(error) and len(str(error).splitlines()) == 1
    assert ip.user_ns["ran"] == 0  # nothing ran
    assert "Traceback" not in cap.stdout + cap.stderr


def test_dry_run_result_is_returned_and_bound_with_o(ip: InteractiveShell) -> None:
    result, _ = run(ip, "%%tpu --dry-run -o report\nx = torch.ones(2)\nx.sum().item()\n")
    assert isinstance(result.result, DryRunReport)
    assert ip.user_ns["report"] is result.result
    ip.user_ns.pop("report")


# -- %tpu_info -----------------------------------------------------------------------------------


def test_tpu_info_text_in_a_terminal(ip: InteractiveShell) -> None:
    with capture_output() as cap:
        ip.run_line_magic("tpu_info", "")
    text = cap.stdout
    assert "[missing] tpu" in text and "pip install torch-tpu" in text
    assert "[found]   cpu" in text and "kind cpu" in text
    assert "torch " + torch.__version__.split("+")[0] in text
    # What auto would pick, and that only a plain %%tpu cell is dry-run there.
    assert "falling back to the CPU (a plain %%tpu cell runs there as a dry run)" in text


def test_each_backend_names_the_package_of_each_version() -> None:
    """%tpu_info said "torchax on JAX 0.0.13 (jax 0.10.2)": torchax's version as JAX's."""
    from importlib.metadata import version

    from gpu2tpu.backends import backend_class

    jax_status = backend_class("jax").status()
    assert jax_status.version_label == (f"torchax {version('torchax')}, jax {version('jax')}")
    assert backend_class("cpu").status().version_label == f"torch {version('torch')}"


def test_a_profile_on_the_cpu_is_not_called_a_dry_run(ip: InteractiveShell) -> None:
    """ "... using the CPU dry run" was printed before a profile, which runs no dry run."""
    ip.magics_manager.registry["TPUMagics"]._last_reason = None  # auto's choice is said anew
    ip.user_ns["lin"] = torch.nn.Linear(4, 4)
    _, cap = run(ip, "%%tpu --profile --steps 2 --warmup 1\nlin(torch.randn(2, 4)).sum()\n")
    assert "falling back to the CPU" in cap.stdout
    assert "dry run" not in cap.stdout
    ip.user_ns.pop("lin")


def test_tpu_info_and_doctor_in_a_kernel_carry_html_and_text_fallbacks(
    ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ipywidgets

    monkeypatch.setattr(ip, "kernel", object(), raising=False)
    for magic, needle in (
        ("tpu_info", "<code>pip install torch-tpu"),
        ("tpu_doctor", "CPU: PyTorch"),
    ):
        with capture_output() as cap:
            ip.run_line_magic(magic, "")
        assert cap.stdout == ""
        [output] = cap.outputs
        data = output.data
        assert "application/vnd.jupyter.widget-view+json" in data
        # a saved notebook shown without the widget state (GitHub, VS Code) gets the HTML
        assert needle in data["text/html"] and "VBox" not in data["text/html"]
        assert needle.removeprefix("<code>") in data["text/plain"]
        assert not data["text/plain"].startswith("VBox(")
    from gpu2tpu.magics.info import collect_info

    widget = collect_info().widget()
    assert all(isinstance(child, ipywidgets.HTML) for child in widget.children)
    assert "pip install torch-tpu" in widget.children[1].value


def test_tpu_doctor_reports_the_cpu_environment_as_usable(ip: InteractiveShell) -> None:
    with capture_output() as cap:
        ip.run_line_magic("tpu_doctor", "")
    assert "No problems found." in cap.stdout
    assert "CPU: PyTorch" in cap.stdout


def test_problem_lines_count_lines_of_the_notebook_cell() -> None:
    from gpu2tpu.magics.cells import problem_lines
    from gpu2tpu.rewrite.core.model import Finding, Safety, Severity
    from gpu2tpu.rewrite.notebooks.notebook import CellRewrite

    inside = Finding(
        "G2T601",
        "item-in-loop",
        5,
        12,
        "`.item()` inside the training loop (the `for` loop at line 3) waits every step",
        "",
        Safety.REPORT,
        Severity.WARNING,
    )
    said = problem_lines(CellRewrite("x", "x", findings=(inside, inside)), offset=1)
    # one line per problem, the %%tpu line counted, in the message too
    assert said == [
        "gpu2tpu: line 6: `.item()` inside the training loop (the `for` loop at line 4) waits "
        "every step (G2T601)"
    ]


# -- what the second hour in a notebook meets (issue 28) ------------------------------------------


def test_the_dry_run_follows_calls_into_functions_of_earlier_cells(ip: InteractiveShell) -> None:
    """A generate() from an earlier cell grew `idx` in a loop: "No TPU hazards found" once,
    while the same loop inline was a shape change; now both are, at the earlier cell's line."""
    defined, _ = run(
        ip,
        "def generate(idx, n):\n"
        "    for _ in range(n):\n"
        "        nxt = idx[:, -1:] + 1\n"
        "        idx = torch.cat((idx, nxt), dim=1)\n"
        "    return idx\n",
    )
    result, cap = run(ip, "%%tpu --dry-run\nout = generate(torch.zeros(1, 3), 5)\n")
    assert result.success, result.error_in_exec
    [change] = [
        h for h in ip.user_ns["_tpu_dry_run"].by_kind(HazardKind.SHAPE_CHANGE) if "cat" in h.code
    ]
    assert (change.source, change.source_line, change.line) == (
        f"In[{defined.execution_count}]",
        4,
        2,
    )
    shown = "".join(str(o.data.get("text/plain", "")) for o in cap.outputs)
    assert f"In[{defined.execution_count}] line 4 (from line 2)" in shown
    assert "No TPU hazards found" not in shown
    ip.user_ns.pop("generate")


@pytest.mark.parametrize(
    "loop",
    [
        "for n in (3, 5, 7, 9): m(torch.randn(n, 6)).sum().backward()\n",
        "for n in (3, 5, 7, 9):\n    m(torch.randn(n, 6)).sum().backward()\n",
    ],
)
def test_a_backward_only_loop_over_batch_sizes_is_a_shape_change(
    ip: InteractiveShell, loop: str
) -> None:
    """Without an optimizer step the loop once gave "No TPU hazards found"."""
    ip.user_ns["m"] = torch.nn.Linear(6, 1)
    run(ip, "%%tpu --dry-run\n" + loop)
    [change] = ip.user_ns["_tpu_dry_run"].by_kind(HazardKind.SHAPE_CHANGE)
    assert change.count == 3 and "4 input shapes" in change.detail
    ip.user_ns.pop("m")


def test_a_cell_that_only_defines_functions_prints_nothing(ip: InteractiveShell) -> None:
    """It printed three empty dry-run lines ("0 ATen ops ... No TPU hazards found ...")."""
    run(ip, "%%tpu\nprint('warm')\n")  # auto's one-line choice is said on its first cell
    result, cap = run(ip, "%%tpu\ndef double(x):\n    return 2 * x\n")
    assert result.success
    assert (cap.stdout, cap.stderr, cap.outputs) == ("", "", [])
    assert ip.user_ns["_tpu_dry_run"].empty  # still there for whoever asks
    ip.user_ns.pop("double")


def test_auto_mode_on_the_cpu_says_it_runs_cells_without_a_dry_run(ip: InteractiveShell) -> None:
    """It said "... using the CPU dry run" and ran none."""
    _, cap = run(ip, "%tpu_auto on")
    run(ip, "%tpu_auto off")
    assert "dry run" in cap.stdout
    assert "using the CPU dry run" not in cap.stdout
    assert "run on the CPU as usual, without a dry run" in cap.stdout


def test_a_traceback_shows_the_users_frames_only(
    ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    """40 lines with torch's dynamo frames and gpu2tpu's dispatch frames once; now the cells'
    frames, a note of what was left out, and every frame with %xmode Verbose."""
    helper, _ = run(ip, "def project(x):\n    return lin(x)\n")
    ip.user_ns["lin"] = torch.nn.Linear(6, 1)
    cell = "%%tpu\ny = 1\nproject(torch.randn(3, 5))\n"
    result, cap = run(ip, cell)
    assert isinstance(result.error_in_exec, RuntimeError)
    shown = cap.stdout
    assert f"In[{result.execution_count}], line 3" in shown
    assert f"In[{helper.execution_count}], line 2" in shown
    assert "run_cell_magic" not in shown and "site-packages" not in shown
    assert "gpu2tpu/" not in shown and "dryrun.py" not in shown
    assert re.search(r"gpu2tpu: \d+ frames inside torch and gpu2tpu not shown", shown)
    assert "mat1 and mat2 shapes cannot be multiplied" in shown
    assert len(shown.splitlines()) < 20
    # %xmode Verbose hands IPython every frame (its rendering of torch's frames is slow:
    # what it is given is checked, not drawn)
    given = []
    monkeypatch.setattr(
        ip.InteractiveTB, "structured_traceback", lambda *a, **k: given.append(a[2]) or []
    )
    ip.run_line_magic("xmode", "Verbose")
    try:
        result.error_in_exec._render_traceback_()
    finally:
        ip.run_line_magic("xmode", "Context")
    files = []
    tb = given[0]
    while tb is not None:
        files.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    assert any(f.endswith("torch/nn/modules/module.py") for f in files)
    assert "not shown" not in " ".join(getattr(result.error_in_exec, "__notes__", []))
    for name in ("project", "lin"):
        ip.user_ns.pop(name)


def test_forecast_names_every_value_it_borrows(
    ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leftover MSELoss gave a shape error with no word of which loss was used."""
    seen = []

    def forecast_cell(namespace, *, targets, backend, source, **options):  # type: ignore[no-untyped-def]
        seen.append((namespace["loss_fn"], namespace["optimizer"]))
        return "forecast"

    monkeypatch.setattr(gpu2tpu.forecasting.forecast, "forecast_cell", forecast_cell)
    model = ip.user_ns["model"] = torch.nn.Linear(4, 2)
    ip.user_ns["loss_fn"] = torch.nn.MSELoss()
    ip.user_ns["optimizer"] = torch.optim.SGD(model.parameters(), lr=0.1)
    result, cap = run(ip, "%%tpu --backend cpu --forecast v5e\nbatch = (torch.ones(8, 4), None)\n")
    assert result.result == "forecast", result.error_in_exec
    assert "gpu2tpu: --forecast uses `loss_fn` from an earlier cell: MSELoss()" in cap.stdout
    assert (
        "gpu2tpu: --forecast uses `optimizer` from an earlier cell: SGD over 2 tensors, lr=0.1"
    ) in cap.stdout
    assert len(seen) == 1
    for name in ("model", "batch", "loss_fn", "optimizer"):
        ip.user_ns.pop(name)


def test_an_optimizer_of_another_model_stops_the_forecast_in_one_line(
    ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An SGD built for another model gave a 60-line traceback ending in UnsupportedOptimizer."""
    seen = []
    monkeypatch.setattr(
        gpu2tpu.forecasting.forecast, "forecast_cell", lambda *a, **k: seen.append(a)
    )
    other = torch.nn.Linear(3, 3)
    ip.user_ns["optimizer"] = torch.optim.SGD(other.parameters(), lr=0.1)
    cell = (
        "%%tpu --backend cpu --forecast v5e\nmodel = torch.nn.Linear(4, 2)\n"
        "batch = (torch.ones(8, 4), torch.zeros(8, dtype=torch.long))\n"
    )
    result, cap = run(ip, cell)
    error = result.error_in_exec
    assert isinstance(error, UsageError) and seen == []
    message = str(error)
    assert "\n" not in message
    assert "`optimizer` (SGD, an earlier cell's) holds 2 of 2 tensors" in message
    assert "optimizer = torch.optim.SGD(model.parameters(), ...)" in message
    assert "del optimizer" in message
    assert "Traceback" not in cap.stdout
    assert "uses `optimizer`" not in cap.stdout  # never announced, then refused
    for name in ("model", "batch", "optimizer"):
        ip.user_ns.pop(name)


def test_the_forecast_finds_the_model_optimizer_and_loss_by_type_and_names_its_defaults(
    ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    """issue 32: a notebook's `cnn`, `opt` and `criterion` were not found (only `model`,
    `optimizer` and `loss_fn` were), and the defaults used in their place went unsaid."""
    seen: list[dict] = []

    def forecast_cell(namespace, *, targets, backend, source, **options):  # type: ignore[no-untyped-def]
        seen.append({k: namespace.get(k) for k in ("model", "optimizer", "loss_fn", "batch")})
        return "forecast"

    monkeypatch.setattr(gpu2tpu.forecasting.forecast, "forecast_cell", forecast_cell)
    cell = (
        "%%tpu --backend cpu --forecast v5e\n"
        "cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.LazyLinear(2))\n"
        "head = cnn[2]\n"
        "opt = torch.optim.SGD(cnn.parameters(), lr=0.1)\n"
        "criterion = torch.nn.CrossEntropyLoss()\n"
        "batch = (torch.ones(2, 3, 8, 8), torch.zeros(2, dtype=torch.long))\n"
        "_ = cnn(batch[0])\n"
    )
    result, cap = run(ip, cell)
    assert result.result == "forecast", result.error_in_exec
    [used] = seen
    ns = ip.user_ns
    assert used["model"] is ns["cnn"] and used["optimizer"] is ns["opt"]
    assert used["loss_fn"] is ns["criterion"]
    assert "uses `cnn` as the model from this cell" in cap.stdout
    assert "uses `opt` as the optimizer from this cell: SGD" in cap.stdout
    assert "uses `criterion` as the loss from this cell: CrossEntropyLoss()" in cap.stdout
    assert "no `dtype`: the model's own dtypes" in cap.stdout
    assert "no optimizer found" not in cap.stdout
    # No optimizer and no loss: the forecast's defaults, said.
    seen.clear()
    for name in ("opt", "criterion"):
        ns.pop(name)
    result, cap = run(ip, "%%tpu --backend cpu --forecast v5e\nsteps = 1\n")
    assert result.result == "forecast", result.error_in_exec
    assert seen[0]["optimizer"] is None and seen[0]["loss_fn"] is None
    assert "no optimizer found: AdamW(lr=1e-3, weight_decay=0.01) assumed" in cap.stdout
    assert "no loss function found: cross-entropy assumed for integer targets" in cap.stdout
    assert "uses `cnn` as the model from an earlier cell" in cap.stdout
    for name in ("cnn", "head", "batch", "steps", "_"):
        ns.pop(name, None)


def test_a_gan_names_its_model_and_the_optimizer_that_trains_it(
    ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two models are a question, not a guess; once `model` is named, of the two optimizers
    (`g_optimizer`, `d_optimizer`) the one that trains it is taken."""
    seen: list = []
    monkeypatch.setattr(
        gpu2tpu.forecasting.forecast,
        "forecast_cell",
        lambda ns, **k: seen.append(ns.get("optimizer")) or "forecast",
    )
    setup = (
        "generator = torch.nn.Linear(4, 8)\n"
        "discriminator = torch.nn.Linear(8, 1)\n"
        "g_optimizer = torch.optim.Adam(generator.parameters())\n"
        "d_optimizer = torch.optim.SGD(discriminator.parameters(), lr=0.1)\n"
        "batch = (torch.ones(2, 8), torch.ones(2, 1))\n"
    )
    result, cap = run(ip, "%%tpu --backend cpu --forecast v5e\n" + setup)
    error = result.error_in_exec
    assert isinstance(error, UsageError) and seen == []
    assert "several models (`discriminator`, `generator`)" in str(error)
    assert "--forecast uses" not in cap.stdout
    result, cap = run(ip, "%%tpu --backend cpu --forecast v5e\nmodel = discriminator\n")
    assert result.result == "forecast", result.error_in_exec
    assert seen == [ip.user_ns["d_optimizer"]]
    assert "uses `d_optimizer` as the optimizer from an earlier cell" in cap.stdout
    for name in ("generator", "discriminator", "g_optimizer", "d_optimizer", "batch", "model"):
        ip.user_ns.pop(name)


def test_tpu_auto_shows_each_rewrite_and_keeps_a_log(ip: InteractiveShell) -> None:
    """Auto mode's edits were invisible."""
    _, on = run(ip, "%tpu_auto on --backend cpu --show-diff")
    result, cap = run(ip, "x = torch.ones(2).cuda()\n")
    assert result.success, result.error_in_exec
    assert f"--- In[{result.execution_count}] (as written)" in cap.stdout
    assert (
        "-x = torch.ones(2).cuda()" in cap.stdout and "+x = torch.ones(2).to(device)" in cap.stdout
    )
    plain, _ = run(ip, "z = 1\n")
    _, log = run(ip, "%tpu_auto log")
    run(ip, "%tpu_auto off")
    assert "auto mode ran 2 cells; 1 rewritten" in log.stdout
    assert "+x = torch.ones(2).to(device)" in log.stdout
    assert f"as written: In[{plain.execution_count}]" in log.stdout
    with pytest.raises(UsageError, match="--show-diff goes with on"):
        ip.run_line_magic("tpu_auto", "off --show-diff")
    ip.user_ns.pop("z")


def test_a_local_module_with_cuda_code_is_named_with_its_command(
    ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """helper_functions.py beside a notebook, full of torch.cuda calls, was never mentioned."""
    (tmp_path / "helper_functions_g2t.py").write_text(
        "import torch\n\ndef to_gpu(x):\n    return x.cuda()\n", encoding="utf-8"
    )
    (tmp_path / "plain_helpers_g2t.py").write_text("def add(a, b):\n    return a + b\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    _, cap = run(
        ip,
        "%%tpu --backend cpu\nimport plain_helpers_g2t\nfrom helper_functions_g2t import to_gpu\n",
    )
    said = [line for line in cap.stderr.splitlines() if "G2T519" in line]
    assert said == [
        "gpu2tpu: line 3: `helper_functions_g2t.py` holds CUDA code (1 fixable) and runs as "
        "written: %%tpu and %tpu_auto rewrite cells, not the modules they import; "
        "`gpu2tpu rewrite helper_functions_g2t.py` migrates it (then restart the kernel) (G2T519)"
    ]
    _, again = run(ip, "%%tpu --backend cpu\nimport helper_functions_g2t\n")
    assert "G2T519" not in again.stderr  # named once a session
    for name in ("to_gpu", "plain_helpers_g2t", "helper_functions_g2t"):
        ip.user_ns.pop(name)


def test_profile_says_one_line_and_the_full_view_on_request(ip: InteractiveShell, tmp_path) -> None:
    """--profile printed about 25 lines and a table."""
    ip.user_ns["lin"] = torch.nn.Linear(8, 8)
    cell = "lin(torch.randn(4, 8)).sum().backward()\n"
    result, cap = run(ip, "%%tpu --backend cpu --profile --steps 3 --warmup 1\n" + cell)
    assert result.result is None and cap.outputs == []
    lines = cap.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("gpu2tpu: step ")
    assert "measured on" in lines[0] and "per 1k steps" in lines[0]
    assert "e-0" not in lines[0]  # plain dollars
    assert ip.user_ns["_tpu_profile"].stats.n == 3
    full, _ = run(ip, "%%tpu --backend cpu --profile --full --steps 3 --warmup 1\n" + cell)
    assert full.result is ip.user_ns["_tpu_profile"]
    trace = tmp_path / "step.json"
    traced, cap = run(ip, f"%%tpu --backend cpu --profile --trace {trace} --steps 2\n" + cell)
    assert traced.success, traced.error_in_exec
    # The op the line names is the traced table's first (which op that is depends on the
    # machine's load: an autograd node such as SumBackward0 can lead a 200 us step).
    ops = ip.user_ns["_tpu_profile"].trace.ops
    assert f"trace: {trace}" in cap.stdout and f"most time in {ops[0].name} (" in cap.stdout
    assert any(op.name.startswith("aten::") for op in ops)
    assert "traceEvents" in trace.read_text(encoding="utf-8")
    with pytest.raises(UsageError, match="--full goes with --profile"):
        ip.run_cell_magic("tpu", "--dry-run --full", cell)
    for name in ("lin", "_tpu_profile"):
        ip.user_ns.pop(name)


def test_profile_shows_a_progress_bar_in_a_kernel(
    ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gpu2tpu.profile ran for 16 s with no word; in a kernel it now draws an ipywidgets bar
    with the steps done and the time left."""
    import ipywidgets

    monkeypatch.setattr(ip, "kernel", object(), raising=False)
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, **kw: shown.append(obj))

    def step() -> None:
        time.sleep(0.02)

    gpu2tpu.profile(step, steps=20, warmup=1, backend="cpu", progress=True, targets=())
    [data] = shown  # the widget's display data, with our line as its plain text
    from ipywidgets.widgets.widget import _instances

    box = _instances[data["application/vnd.jupyter.widget-view+json"]["model_id"]]
    assert data["text/plain"].startswith("gpu2tpu.profile: ")
    bar, label = box.children
    assert isinstance(bar, ipywidgets.IntProgress) and bar.max == 22
    assert bar.value == 22 and bar.bar_style == "success"
    assert re.fullmatch(r"gpu2tpu\.profile: 22/22 steps, done in \d+\.\d s", label.value)


def test_a_long_dry_run_says_what_it_has_done_in_a_kernel(
    ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    """issue 32: a 24 s dry run said nothing until it ended; now a line counts its ops."""
    import gpu2tpu.measure.progress as progress

    monkeypatch.setattr(ip, "kernel", object(), raising=False)
    monkeypatch.setattr(progress, "DELAY_S", 0.1)
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, **kw: shown.append(obj))
    cell = "%%tpu --dry-run\nfor _ in range(6):\n    time.sleep(0.1)\n    torch.ones(3).add_(1)\n"
    ip.user_ns["time"] = time
    result, _ = run(ip, cell)
    assert result.success, result.error_in_exec
    lines = [d["text/plain"] for d in shown if isinstance(d, dict)]
    assert lines and lines[0].startswith(f"gpu2tpu: dry run of In[{result.execution_count}]: ")
    assert " ATen ops, " in lines[0]
    ip.user_ns.pop("time")


def test_tpu_info_widget_says_autos_choice_once() -> None:
    from gpu2tpu.magics.info import collect_info

    info = collect_info()
    widget = info.widget()
    texts = [child.value for child in widget.children]
    assert sum(info.auto.split(";")[0] in text for text in texts) == 1


@NO_GPU
@pytest.mark.parametrize("auto", [False, True], ids=["tpu", "tpu_auto"])
def test_a_function_local_device_is_rewritten_as_the_cli_rewrites_it(
    ip: InteractiveShell, auto: bool
) -> None:
    """Issue 32: a function of the cell binds `device` itself. The idiom there is rewritten
    (the CLI does), and `.cuda()` in a function with a `device` parameter runs on the
    magic's other device variable instead of raising without CUDA."""
    cell = (
        "def setup():\n"
        "    device = torch.device('cuda:0' if torch.cuda.is_available() else 'cpu')\n"
        "    return device\n"
        "def place(x, device):\n"
        "    return x.cuda()\n"
        "(setup().type, place(torch.ones(1), 'ignored').device.type)\n"
    )
    if auto:
        run(ip, "%tpu_auto on --backend cpu")
    try:
        result, cap = run(ip, cell if auto else "%%tpu --backend cpu\n" + cell)
    finally:
        run(ip, "%tpu_auto off")
    assert result.success, result.error_in_exec
    assert result.result == ("cpu", "cpu")
    assert "G2T103" not in cap.stderr and "G2T101" not in cap.stderr
