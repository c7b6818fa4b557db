"""Rewritten code never runs worse than the original on an accelerator that is not CUDA
(issue 27, §2): each snippet runs as written and as rewritten, on an accelerator simulated
the way the backends answer for theirs (`backends.base.accelerator_answers`: torch's
`accelerator` API answers for the meta device, `torch.cuda` stays unavailable, as on a TPU
host). Where the original runs, the rewrite runs and gives the same answer, or uses the
accelerator the original left idle.
"""

from __future__ import annotations

import ast
import textwrap
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import notebooks_factory as nbf
import pytest
import torch

from conftest import installed_torch_minor
from gpu2tpu.backends.base import accelerator_answers
from gpu2tpu.rewrite.core.model import Options
from gpu2tpu.rewrite.core.source import rewrite_source
from gpu2tpu.rewrite.core.torch_target import rewrite_for_target
from gpu2tpu.rewrite.notebooks.notebook import rewrite_notebook

# name -> (snippet, what the rewrite's `result` must be on the simulated accelerator)
SNIPPETS: dict[str, tuple[str, object]] = {
    # The CUDA branch reads a value built only where CUDA is (lucidrains' Attend): widened to
    # every accelerator, the choice picked None on a TPU.
    "is_cuda_choice_of_a_cuda_only_value": (
        """
        import torch

        class Attend:
            def __init__(self):
                self.cpu_config = (True, True, True)
                self.cuda_config = None
                if not torch.cuda.is_available():
                    return
                major, _ = torch.cuda.get_device_capability()
                self.cuda_config = (major >= 8, False, False)

            def config(self, q):
                return self.cuda_config if q.is_cuda else self.cpu_config

        result = Attend().config(torch.ones(2, device="meta"))[0]
        """,
        True,
    ),
    # A test kept in a variable guards a CUDA-only call elsewhere.
    "test_kept_in_a_variable": (
        """
        import torch

        use_gpu = torch.cuda.is_available()
        name = "cpu"
        if use_gpu:
            name = torch.cuda.get_device_name(0)
        result = name
        """,
        "cpu",
    ),
    # A guard around a line the rewrite leaves CUDA-only (an index it cannot carry over).
    "guard_of_a_line_left_cuda_only": (
        """
        import torch

        gpu = int("0")
        x = torch.ones(2)
        if torch.cuda.is_available():
            x = x.cuda(gpu)
        result = x.sum().item()
        """,
        2.0,
    ),
    # The branch calls a function of the module that raises unless its tensor is on CUDA.
    "guard_of_a_function_that_needs_cuda": (
        """
        import torch

        def fused_scale(x):
            if x.device.type != "cuda":
                raise RuntimeError("fused_scale needs a CUDA tensor")
            return x * 2

        def scale(x):
            if x.is_cuda:
                return fused_scale(x)
            return x + x

        result = scale(torch.ones(2, device="meta")).shape[0]
        """,
        2,
    ),
    # The branch imports GPU kernels (whisper's median filter: `.triton_ops`), and the code
    # after it is the path for every other device.
    "guard_of_an_import_of_gpu_kernels": (
        """
        import torch

        def smooth(x):
            result = None
            if torch.cuda.is_available():
                try:
                    from gpu2tpu_test_triton_ops import smooth_cuda
                    result = smooth_cuda(x)
                except RuntimeError:
                    pass
            if result is None:
                result = x * 0.5
            return result

        result = smooth(torch.ones(2, device="meta")).shape[0]
        """,
        2,
    ),
    # The other branch is the code's own path for every device but CUDA (sam2: "repeat on
    # complex numbers may not be supported on non-CUDA devices").
    "the_codes_own_path_for_other_devices": (
        """
        import torch

        def repeat_rows(freqs, r):
            if freqs.is_cuda:
                path = "cuda"
                freqs = freqs.repeat(1, r)
            else:
                path = "expand"
                freqs = freqs.unsqueeze(1).expand(-1, r, -1).flatten(1, 2)
            return path, freqs.shape

        result = repeat_rows(torch.ones(2, 3, device="meta"), 2)
        """,
        ("expand", (2, 6)),
    ),
    # A chain that names a library's accelerator (litgpt's `L.Fabric(accelerator=...)`): no
    # torch device follows from it, so widened alone it picked "cuda" on every accelerator.
    "backend_chain_of_a_library_name": (
        """
        import torch

        if torch.cuda.is_available():
            accelerator = "cuda"
        elif torch.backends.mps.is_available():
            accelerator = "mps"
        else:
            accelerator = "cpu"
        result = accelerator
        """,
        "cpu",
    ),
    # The common device choice: the original takes the CPU on any accelerator but CUDA and
    # MPS; migrated whole, it takes the accelerator.
    "device_choice_chain": (
        """
        import torch

        if torch.cuda.is_available():
            device = torch.device("cuda")
        elif torch.backends.mps.is_available():
            device = torch.device("mps")
        else:
            device = torch.device("cpu")
        result = torch.ones(2, device=device).device.type
        """,
        "meta",
    ),
    # The rank's GPU or the CPU (a torchrun script's one-liner): the original takes the CPU
    # on a TPU; migrated, the process's one chip, never `tpu:<rank>`, which it does not own.
    "rank_or_cpu_choice": (
        """
        import torch

        local_rank = int("1")
        device = torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
        result = device
        """,
        torch.device("meta"),
    ),
}

# Where the original takes the CPU beside an idle accelerator, the rewrite takes it.
IDLE_ACCELERATOR = frozenset({"device_choice_chain", "rank_or_cpu_choice"})


# name -> (snippet, what the rewrite's `result` must be on the simulated accelerator): code
# that needs CUDA as written (it fails there) and must run once rewritten, as on a TPU, where
# a process owns one chip, index 0 (issue 32, §3).
CUDA_ONLY_SNIPPETS: dict[str, tuple[str, object]] = {
    # The rank's index in a device string names a GPU on CUDA only.
    "rank_in_a_device_string": (
        """
        import torch

        local_rank = int("1")
        device = torch.device(f"cuda:{local_rank}")
        x = torch.ones(2, device=f"cuda:{local_rank}").to(device)
        result = (device, x.device)
        """,
        (torch.device("meta"), torch.device("meta")),
    ),
    # `set_device` of the rank inside a test of a name the user sets (sam2's trainer, given
    # `accelerator: cuda` by its configuration): selected on a CUDA device only.
    "set_device_in_a_test_of_a_name": (
        """
        import torch

        class Trainer:
            def __init__(self, local_rank, accelerator="cuda"):
                if accelerator == "cuda":
                    self.device = torch.device("cuda", local_rank)
                    torch.cuda.set_device(local_rank)
                else:
                    self.device = torch.device("cpu")

        result = Trainer(1, "cuda").device
        """,
        torch.device("meta"),
    ),
    # A device built from the rank (stylegan3's training loop), then moved to as it is.
    "device_built_from_the_rank": (
        """
        import torch.cuda

        def training_loop(rank):
            device = torch.device("cuda", rank)
            net = torch.nn.Linear(2, 2).to(device)
            return next(net.parameters()).device

        result = training_loop(1)
        """,
        torch.device("meta"),
    ),
}


def _run(text: str) -> tuple[str | None, dict[str, object]]:
    namespace: dict[str, object] = {"__name__": "__main__"}
    try:
        exec(compile(text, "<snippet>", "exec"), namespace)
    except Exception as err:  # what the snippet raised is the answer
        return f"{type(err).__name__}: {err}", namespace
    return None, namespace


@pytest.mark.torch_matrix
@pytest.mark.parametrize("name", SNIPPETS)
def test_the_rewrite_runs_where_the_original_ran(name: str) -> None:
    """The rewrite made for the installed torch (target-torch), so that `make test-all`'s runs
    on each torch minor the rules write for (2.6, 2.9, 2.12, newest) check the forms of each."""
    snippet, expected = SNIPPETS[name]
    original = textwrap.dedent(snippet)
    options = Options(target_torch=installed_torch_minor())
    rewritten = rewrite_for_target(rewrite_source, original, options).new_text
    assert not torch.cuda.is_available()  # the simulated host has no CUDA, as a TPU host
    with accelerator_answers(torch.device("meta")):
        assert torch.accelerator.is_available()
        before, as_written = _run(original)
        after, migrated = _run(rewritten)
    assert before is None, f"the original does not run on the simulated accelerator: {before}"
    assert after is None, f"the rewrite fails where the original ran: {after}\n{rewritten}"
    assert migrated["result"] == expected, rewritten
    if name not in IDLE_ACCELERATOR:
        assert migrated["result"] == as_written["result"]


def test_the_tf32_switch_leaves_the_cpus_precision_alone() -> None:
    """`torch.set_float32_matmul_precision("high")` also sets oneDNN's float32 matmuls to TF32
    on the CPU, which `allow_tf32` does not: the fix is unsafe, and by default the line is
    reported, so the CPU computes as it did."""
    original = "import torch\n\ntorch.backends.cuda.matmul.allow_tf32 = True\n"
    saved = (torch.get_float32_matmul_precision(), torch.backends.mkldnn.matmul.fp32_precision)
    try:
        answers = []
        for options in (None, Options(), Options(unsafe_fixes=True)):
            torch.set_float32_matmul_precision("highest")
            torch.backends.mkldnn.matmul.fp32_precision = "none"
            text = original if options is None else rewrite_source(original, options).new_text
            assert _run(text)[0] is None
            answers.append(torch.backends.mkldnn.matmul.fp32_precision)
    finally:
        torch.set_float32_matmul_precision(saved[0])
        torch.backends.mkldnn.matmul.fp32_precision = saved[1]
    as_written, default, unsafe = answers
    assert default == as_written
    assert unsafe != as_written  # why the fix waits for --unsafe-fixes


@contextmanager
def _one_chip_per_process() -> Iterator[None]:
    """The simulated accelerator as TorchTPU's device module answers: the process owns one
    chip, and selecting any other index raises (reference/codemod.md, catalogue row 10)."""
    with accelerator_answers(torch.device("meta")):
        answer = torch.accelerator.set_device_index

        def set_device_index(index: object, /) -> None:
            if index not in (0, None):
                raise ValueError(f"this process owns chip 0, not {index}")
            answer(index)

        torch.accelerator.set_device_index = set_device_index
        try:
            yield
        finally:
            torch.accelerator.set_device_index = answer


@pytest.mark.parametrize("name", CUDA_ONLY_SNIPPETS)
def test_code_that_needs_cuda_runs_once_rewritten(name: str) -> None:
    snippet, expected = CUDA_ONLY_SNIPPETS[name]
    original = textwrap.dedent(snippet)
    rewritten = rewrite_source(original).new_text
    with _one_chip_per_process():
        before, _ = _run(original)
        after, migrated = _run(rewritten)
    assert before is not None, "the original runs without CUDA: it belongs in SNIPPETS"
    assert after is None, f"the rewrite fails on the simulated accelerator: {after}\n{rewritten}"
    assert migrated["result"] == expected, rewritten


# name -> snippet whose rewrite still fails on the simulated accelerator: `check` of the
# rewrite must report the test of the `if` chain that sends it to the failing line.
REPORTED_SNIPPETS: dict[str, str] = {
    # A "cuda" default becomes the device's type; the chain that reads it raises for any
    # other (sam2's trainer).
    "test_of_a_rewritten_default": """
        import torch

        class Trainer:
            def __init__(self, local_rank, accelerator="cuda"):
                if accelerator == "cuda":
                    self.device = torch.device("cuda", local_rank)
                    torch.cuda.set_device(local_rank)
                elif accelerator == "cpu":
                    self.device = torch.device("cpu")
                else:
                    raise ValueError(f"Unsupported accelerator: {accelerator}")

        result = Trainer(0).device
        """,
}


def _failing_line(text: str) -> int:
    """The line of the snippet where running it raised."""
    namespace: dict[str, object] = {"__name__": "__main__"}
    try:
        exec(compile(text, "<snippet>", "exec"), namespace)
    except Exception as err:
        frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == "<snippet>"]
        assert frames and frames[-1].lineno is not None
        return frames[-1].lineno
    raise AssertionError("the snippet ran")


@pytest.mark.parametrize("name", REPORTED_SNIPPETS)
def test_where_the_rewrite_still_fails_check_names_the_test(name: str) -> None:
    rewritten = rewrite_source(textwrap.dedent(REPORTED_SNIPPETS[name])).new_text
    with _one_chip_per_process():
        line = _failing_line(rewritten)
    chain_tests = {
        node.test.lineno
        for node in ast.walk(ast.parse(rewritten))
        if isinstance(node, ast.If) and node.lineno <= line <= (node.end_lineno or node.lineno)
    }
    findings = rewrite_source(rewritten, Options(fix=False)).findings
    assert any(f.line in chain_tests and not f.fixed for f in findings), rewritten


# name -> snippet whose `result` is the dtype a matmul computes in under its autocast. The
# meta device has no autocast, so these run on the CPU, a device that is not CUDA as a TPU
# is not: once rewritten, the autocast is the CPU's own, in the CPU's own dtype.
AUTOCAST_SNIPPETS: dict[str, str] = {
    # CUDA's autocast dtype, carried to every device (sgm's autocast decorator).
    "cuda_dtype_asked_inside": """
        import torch

        def matmul():
            with torch.cuda.amp.autocast(dtype=torch.get_autocast_gpu_dtype()):
                return torch.mm(torch.ones(2, 2), torch.ones(2, 2))

        result = matmul().dtype
        """,
    # Autocast through a name (generative-models' `precision_scope = autocast`).
    "autocast_through_an_alias": """
        import torch
        from torch import autocast

        def matmul():
            precision_scope = autocast
            with precision_scope("cuda"):
                return torch.mm(torch.ones(2, 2), torch.ones(2, 2))

        result = matmul().dtype
        """,
}


@pytest.mark.parametrize("name", AUTOCAST_SNIPPETS)
def test_autocast_off_cuda_computes_in_the_devices_own_dtype(name: str) -> None:
    original = textwrap.dedent(AUTOCAST_SNIPPETS[name])
    rewritten = rewrite_source(original).new_text
    assert rewritten != original, "nothing was rewritten"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CUDA's autocast, asked where CUDA is not
        before, as_written = _run(original)
        after, migrated = _run(rewritten)
    assert before is None and after is None, (before, after, rewritten)
    assert as_written["result"] == torch.float32  # CUDA's autocast is off without CUDA
    assert migrated["result"] == torch.get_autocast_dtype("cpu"), rewritten


# name -> a library module (it only defines, logs, and tries an optional import) with a
# function `place(x)`: imported, it must ask for no device (a query at import makes forking
# unsafe, pytorch issue 68861); called, `place` moves to the accelerator.
LIBRARY_MODULES: dict[str, str] = {
    "optional_import_and_logging": """
        import logging

        import torch

        try:
            import gpu2tpu_test_boto3_absent
        except ModuleNotFoundError:
            print("For s3 checkpoints, install boto3")

        logger = logging.getLogger(__name__)
        logging.getLogger("urllib3").setLevel(logging.WARNING)

        def place(x):
            logger.debug("placing")
            return x.cuda()
        """,
}


@pytest.mark.parametrize("name", LIBRARY_MODULES)
def test_a_library_module_asks_for_no_device_at_import(name: str) -> None:
    rewritten = rewrite_source(textwrap.dedent(LIBRARY_MODULES[name])).new_text
    asked: list[bool] = []
    namespace: dict[str, object] = {"__name__": "gpu2tpu_test_library"}
    with accelerator_answers(torch.device("meta")):
        answer = torch.accelerator.current_accelerator

        def counted(check_available: bool = False) -> object:
            asked.append(check_available)
            return answer(check_available)

        torch.accelerator.current_accelerator = counted
        try:
            exec(compile(rewritten, "<library>", "exec"), namespace)
            at_import = len(asked)
            placed = namespace["place"](torch.ones(2))  # type: ignore[operator]  # the module's function
        finally:
            torch.accelerator.current_accelerator = answer
    assert at_import == 0, rewritten
    assert placed.device.type == "meta" and asked, rewritten


def test_a_size_scaled_by_the_device_count_counts_the_accelerator_and_is_reported() -> None:
    """`64 * torch.cuda.device_count()` is 0 on any accelerator but CUDA; rewritten, it counts
    the simulated accelerator's one device, and it is still 0 without an accelerator, which
    `check` says of the rewrite as of the original (G2T116)."""
    original = "import torch\n\nresult = 64 * torch.cuda.device_count()\n"
    rewritten = rewrite_source(original).new_text
    with accelerator_answers(torch.device("meta")):
        assert _run(original)[1]["result"] == 0
        assert _run(rewritten)[1]["result"] == 64, rewritten
    assert _run(rewritten)[1]["result"] == 0  # this host: no accelerator
    for text in (original, rewritten):
        codes = [f.code for f in rewrite_source(text, Options(fix=False)).findings]
        assert "G2T116" in codes, text


def test_a_notebook_that_never_imports_torch_is_left_to_its_framework() -> None:
    """A TensorFlow course notebook: `pipeline(..., device=0)` is TensorFlow's GPU there. A fix
    would bring in torch, which the notebook never used (and may not have): nothing is
    rewritten, and the finding says why. The same cell under torch is migrated."""
    cells = [
        "import tensorflow as tf\nfrom transformers import TFGPT2LMHeadModel, pipeline\n",
        'model = TFGPT2LMHeadModel.from_pretrained("gpt2")\n',
        'generator = pipeline("text-generation", model=model, device=0)\n',
    ]
    text = nbf.jupyter_text(nbf.notebook([nbf.code(c) for c in cells]))
    result = rewrite_notebook(text, Options())
    assert result.new_text == text
    assert not result.edits
    (finding,) = [f.finding for f in result.findings]
    assert finding.code == "G2T102" and not finding.fixed
    assert "`tensorflow`, not torch" in finding.hint
    torch_cells = ["import torch\nfrom transformers import pipeline\n", cells[2]]
    text = nbf.jupyter_text(nbf.notebook([nbf.code(c) for c in torch_cells]))
    assert "device=torch.device(" in rewrite_notebook(text, Options()).new_text
