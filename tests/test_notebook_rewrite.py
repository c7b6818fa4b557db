"""Notebook rewriting: code cells rewritten, IPython syntax and everything else kept exactly."""

from __future__ import annotations

import ast
import difflib
import json
import re
from typing import Any

import libcst as cst
import nbformat
import notebooks_factory as nbf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from IPython.core.inputtransformer2 import TransformerManager

from gpu2tpu.rewrite.analysis.lines import python_lines
from gpu2tpu.rewrite.core.model import Options, Safety
from gpu2tpu.rewrite.core.source import SourceError, rewrite_source
from gpu2tpu.rewrite.notebooks.ipython_syntax import mask
from gpu2tpu.rewrite.notebooks.notebook import (
    NotebookResult,
    local_module_findings,
    rewrite_notebook,
)
from gpu2tpu.rewrite.notebooks.notebook_json import NotebookError, notebook_diff
from gpu2tpu.rewrite.rules.base import NotebookRule, all_rules, rules_for

SETUP = "import torch\nt = torch.zeros(2)"
DEVICE_DEF = "torch.accelerator.current_accelerator(check_available=True)"

# -- helpers ---------------------------------------------------------------------------------


def rewrite(text: str, **options: Any) -> NotebookResult:
    return rewrite_notebook(text, Options(**options))


def cells_of(text: str) -> list[dict]:
    return json.loads(text)["cells"]


def source_of(cell: dict) -> str:
    src = cell["source"]
    return src if isinstance(src, str) else "".join(src)


def code_sources(text: str) -> list[str]:
    return [source_of(c) for c in cells_of(text) if c["cell_type"] == "code"]


def without_code_sources(text: str) -> Any:
    """The whole JSON, in file order and with duplicate keys kept, code sources blanked."""
    tree = json.loads(text, object_pairs_hook=lambda pairs: ("obj", pairs))
    for _, (key, cells) in enumerate(tree[1]):
        if key != "cells":
            continue
        for _, pairs in cells:
            if ("cell_type", "code") in pairs:
                pairs[:] = [(k, None if k == "source" else v) for k, v in pairs]
    return tree


_STRING_LINE = re.compile(r'^\s*("source"\s*:\s*)?"(?:[^"\\]|\\.)*"\s*,?\s*$')


def assert_only_code_sources_changed(old: str, new: str) -> None:
    """JSON equal but for code sources, and every changed text line is a source string."""
    assert without_code_sources(old) == without_code_sources(new)
    if "\n" not in old.strip():
        return  # one line of compact JSON: the JSON comparison is all there is
    a, b = old.splitlines(), new.splitlines()
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag != "equal":
            for line in a[i1:i2] + b[j1:j2]:
                assert _STRING_LINE.match(line), f"a line outside a source changed: {line!r}"


def subsequence(needle: list[str], haystack: list[str]) -> bool:
    it = iter(haystack)
    return all(any(x == y for y in it) for x in needle)


def run_cells(text: str) -> dict:
    """Run a pure-Python notebook's code cells in one namespace, as a kernel would.

    The cells run as on a CPU-only machine whatever earlier tests left in this process:
    once torchax has been loaded anywhere in it, torch.accelerator can answer "jax".
    """
    from unittest import mock

    namespace: dict = {}
    with mock.patch("torch.accelerator.current_accelerator", return_value=None):
        for n, src in enumerate(code_sources(text)):
            exec(compile(src, f"<cell {n}>", "exec"), namespace)
    return namespace


def kitchen_sink(as_list: bool = True) -> list[dict]:
    """Cells of every kind: markdown and raw mentioning CUDA, outputs, images, widgets,
    empty cells, IPython syntax, non-ASCII, a string source and CUDA code to rewrite."""
    return [
        nbf.markdown("# Trainer\nMove the model with `model.cuda()`; größe 日本.", as_list=as_list),
        nbf.raw("torch.cuda.synchronize()", as_list=as_list),
        nbf.code(
            "%matplotlib inline\n!nvidia-smi\nimport torch\nimport torch.nn as nn",
            as_list=as_list,
            execution_count=1,
            outputs=[nbf.stream("Tue Jan  1 \u001b[1mNVIDIA\u001b[0m\n")],
        ),
        nbf.code("", as_list=as_list),
        nbf.code(
            "model = nn.Linear(4, 2).cuda()  # größe\nx = torch.randn(8, 4, device='cuda')",
            as_list=as_list,
            execution_count=2,
            outputs=[nbf.image_output(), nbf.widget_output(), nbf.result_output(2, "Linear")],
        ),
        nbf.code("%%time\ny = model(x.cuda())", as_list=not as_list, execution_count=3),
        nbf.code("%%bash\necho model.cuda()", as_list=as_list, outputs=[nbf.error_output()]),
        nbf.code("print('日本', y.shape)\ny.cpu();", as_list=as_list),
    ]


def layouts(nb: dict) -> dict[str, str]:
    return {
        "jupyter": nbf.jupyter_text(nb),
        "jupyter-ascii": nbf.jupyter_text(nb, ensure_ascii=True),
        "hand-edited": nbf.hand_edited(nb),
    }


def relayout_matches(old: str, new: str) -> bool:
    """Whether `new` is laid out exactly like `old` (same indent, escapes, trailing text)."""
    for indent in (1, 2):
        for ensure_ascii in (False, True):
            dumped = json.dumps(json.loads(old), indent=indent, ensure_ascii=ensure_ascii)
            if old.startswith(dumped) and not old[len(dumped) :].strip():
                tail = old[len(dumped) :]
                again = json.dumps(json.loads(new), indent=indent, ensure_ascii=ensure_ascii)
                return again + tail == new
    raise AssertionError("the test notebook is not in a json.dumps layout")


# -- the factory builds what Jupyter itself accepts ------------------------------------------


@pytest.mark.parametrize("minor", range(6))
def test_factory_notebooks_are_valid_nbformat(minor: int) -> None:
    meta = nbf.jupyter_metadata(widgets=nbf.widget_state())
    nb = nbf.notebook(kitchen_sink(), minor=minor, metadata=meta)
    nbformat.validate(nbformat.reads(nbf.jupyter_text(nb), as_version=4))
    colab = nbf.colab_notebook(kitchen_sink())
    nbformat.validate(nbformat.reads(nbf.colab_text(colab), as_version=4))


# -- nothing to do: the very same text -------------------------------------------------------


def clean_cells() -> list[dict]:
    return [
        nbf.markdown(
            "Put the model on the GPU with `model.cuda()` and `torch.cuda.synchronize()`."
        ),
        nbf.raw("x.cuda()"),
        nbf.code(
            "import numpy as np\nnp.zeros(3)", outputs=[nbf.image_output()], execution_count=1
        ),
        nbf.code(""),
        nbf.code("   \n\n"),
        nbf.code("%matplotlib inline\n!ls\nfiles = !ls\nprint('größe 日本')", as_list=False),
        nbf.code("%%writefile train.py\nimport torch\nx = torch.zeros(2).cuda()\n"),
        nbf.code("%%html\n<b>model.cuda()</b>"),
    ]


@pytest.mark.parametrize("minor", [0, 4, 5])
def test_notebook_without_cuda_code_comes_back_as_the_same_string(minor: int) -> None:
    meta = nbf.jupyter_metadata(widgets=nbf.widget_state())
    nb = nbf.notebook(clean_cells(), minor=minor, metadata=meta)
    texts = {
        **layouts(nb),
        "colab": nbf.colab_text(
            nbf.colab_notebook(clean_cells(), accelerator="TPU", gpu_type="V5E1")
        ),
    }
    texts["compact"] = json.dumps(nb)
    for name, text in texts.items():
        result = rewrite(text, unsafe_fixes=True)
        assert result.new_text is text, name
        assert not result.edits and not result.findings and not result.cell_errors, name


# -- a rewrite changes code sources and nothing else ----------------------------------------


@pytest.mark.parametrize("minor", range(6))
@pytest.mark.parametrize("as_list", [True, False])
def test_rewrite_changes_only_code_sources(minor: int, as_list: bool) -> None:
    meta = nbf.jupyter_metadata(widgets=nbf.widget_state())
    nb = nbf.notebook(kitchen_sink(as_list), minor=minor, metadata=meta)
    for name, text in layouts(nb).items():
        result = rewrite(text)
        assert result.new_text != text, name
        assert not result.cell_errors, name
        assert_only_code_sources_changed(text, result.new_text)
        if name != "hand-edited":
            assert relayout_matches(text, result.new_text), name
        assert result.new_text.endswith("\n") and not result.new_text.endswith("\n\n")
        old_cells, new_cells = cells_of(text), cells_of(result.new_text)
        assert [type(c["source"]) for c in old_cells] == [type(c["source"]) for c in new_cells]
        assert [c.get("id") for c in old_cells] == [c.get("id") for c in new_cells]
        assert ("id" in new_cells[0]) is (minor >= 5)
        if name == "jupyter-ascii":
            assert result.new_text.isascii() and "\\u00f6" in result.new_text
        else:
            assert "größe" in result.new_text and "\\u00f6" not in result.new_text
        sources = code_sources(result.new_text)
        assert ".cuda()" not in "".join(sources[:4]) and "device='cuda'" not in sources[2]
        assert sources[4] == "%%bash\necho model.cuda()", "a bash cell body was touched"


def test_colab_notebook_keeps_its_layout_and_key_order() -> None:
    nb = nbf.colab_notebook(kitchen_sink())
    text = nbf.colab_text(nb)
    result = rewrite(text)
    assert result.new_text != text
    assert_only_code_sources_changed(text, result.new_text)
    assert relayout_matches(text, result.new_text)
    assert not result.new_text.endswith("\n"), "Colab writes no trailing newline"
    assert result.new_text.startswith('{\n  "nbformat": 4,\n  "nbformat_minor": 0,\n  "metadata"')
    assert [c["metadata"]["id"] for c in cells_of(result.new_text)] == [
        c["metadata"]["id"] for c in nb["cells"]
    ]


def test_hand_edited_json_is_spliced_not_reformatted() -> None:
    nb = nbf.notebook([nbf.code(SETUP), nbf.code("x = t.cuda()\nz = 1")], minor=4)
    text = nbf.hand_edited(nb)
    result = rewrite(text)
    new_source = code_sources(result.new_text)[1]
    assert new_source.startswith("device = ")  # `import torch` of cell 0 is seen
    # the only lines that changed are the source strings of cell 1, laid out with tabs and CRLF
    assert_only_code_sources_changed(text, result.new_text)
    assert "\r\n" in result.new_text and "\n" not in result.new_text.replace("\r\n", "")
    assert '\t\t\t\t"x = t.to(device)\\n" ,\r\n\t\t\t\t"z = 1"\r\n\t\t\t]' in result.new_text


def test_nan_duplicate_keys_and_one_line_lists_survive() -> None:
    nan_output = {
        "data": {"application/json": {"loss": float("nan")}},
        "metadata": {},
        "output_type": "display_data",
    }
    nb = nbf.notebook([nbf.code(SETUP), nbf.code("x = t.cuda()", outputs=[nan_output])], minor=4)
    text = nbf.jupyter_text(nb)
    assert '"loss": NaN' in text
    result = rewrite(text)
    assert_only_code_sources_changed(text, result.new_text)
    assert '"loss": NaN' in result.new_text
    # duplicate keys and a one-line list, in a layout json.dumps cannot reproduce
    hand = nbf.hand_edited(nb).replace(
        '"metadata" : {} ,', '"metadata" : {"a" : 1} ,\r\n\t\t\t"metadata" : {} ,', 1
    )
    result = rewrite(hand)
    assert_only_code_sources_changed(hand, result.new_text)
    assert '"metadata" : {"a" : 1} ,' in result.new_text
    assert '"source" : [\r\n\t\t\t\t"device = ' in result.new_text
    assert '\\n" ,\r\n\t\t\t\t"x = t.to(device)"\r\n\t\t\t]' in result.new_text


def test_rewrite_is_idempotent() -> None:
    nb = nbf.notebook(kitchen_sink(), metadata=nbf.colab_metadata())
    text = nbf.jupyter_text(nb)
    first = rewrite(text, unsafe_fixes=True)
    second = rewrite(first.new_text, unsafe_fixes=True)
    assert first.edits and second.new_text is first.new_text
    assert not second.edits and not second.cell_errors


def test_crlf_inside_a_source_is_kept_on_every_line() -> None:
    nb = nbf.notebook(
        [nbf.code("import torch\r\nx = torch.zeros(2).cuda()  # größe\r\ny = x.cuda()\r\n")]
    )
    result = rewrite(nbf.jupyter_text(nb))
    (new,) = code_sources(result.new_text)
    assert DEVICE_DEF in new and ".cuda()" not in new
    assert "\n" not in new.replace("\r\n", ""), "a line lost its CRLF"
    assert all(line.endswith("\r\n") for line in cells_of(result.new_text)[0]["source"])


# -- IPython syntax ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(nbf.IPYTHON_SYNTAX))
def test_ipython_syntax_is_kept_and_the_python_around_it_rewritten(case: str) -> None:
    src = nbf.IPYTHON_SYNTAX[case]
    text = nbf.jupyter_text(nbf.notebook([nbf.code(SETUP), nbf.code(src)]))
    result = rewrite(text)
    assert not result.cell_errors
    new = code_sources(result.new_text)[1]
    assert "t.cuda()" not in new and "x.cuda()" not in new
    expected = [line.replace(".cuda()", ".to(device)") for line in python_lines(src)]
    got = python_lines(new)
    assert subsequence(expected, got), f"{case}: IPython lines changed:\n{new}"
    assert len(got) > len(expected), "the device definition is missing"
    ast.parse(TransformerManager().transform_cell(new))  # still valid IPython
    assert rewrite(result.new_text).new_text is result.new_text


@pytest.mark.parametrize("case", sorted(nbf.FOREIGN_CELL_MAGICS))
def test_bodies_of_other_languages_are_left_alone(case: str) -> None:
    text = nbf.jupyter_text(
        nbf.notebook([nbf.code(SETUP), nbf.code(nbf.FOREIGN_CELL_MAGICS[case])])
    )
    result = rewrite(text)
    assert result.new_text is text and not result.edits and not result.cell_errors


def test_python_inside_line_magics_is_rewritten_with_columns_in_the_cell() -> None:
    src = "%timeit -n 3 -r 1 t.cuda()\n%time y = t.cuda()"
    text = nbf.jupyter_text(nbf.notebook([nbf.code(SETUP + "\nt.cuda()"), nbf.code(src)]))
    result = rewrite(text)
    assert (
        code_sources(result.new_text)[1] == "%timeit -n 3 -r 1 t.to(device)\n%time y = t.to(device)"
    )
    spots = [
        (e.cell_index, e.finding.line, e.finding.col) for e in result.edits if e.cell_index == 1
    ]
    assert spots == [(1, 1, 19), (1, 2, 11)]
    assert src.splitlines()[0][18:].startswith("t.cuda()") and src.splitlines()[1][10:].startswith(
        "t.cuda()"
    )


def test_magic_with_an_unknown_option_is_masked_whole() -> None:
    src = "%timeit -Z t.cuda()\nx = t.cuda()"
    result = rewrite(nbf.jupyter_text(nbf.notebook([nbf.code(SETUP), nbf.code(src)])))
    assert code_sources(result.new_text)[1].splitlines()[0] == "%timeit -Z t.cuda()"


def test_mask_and_unmask_are_exact_and_line_for_line() -> None:
    src = "\n".join(
        v
        for k, v in sorted(nbf.IPYTHON_SYNTAX.items())
        if not k.startswith(("cell_", "stacked", "leading"))
    )
    src = src.replace("\n", "\r\n", 3)
    masked = mask(src)
    cst.parse_module(masked.text)
    assert len(python_lines(masked.text)) == len(python_lines(src))
    assert masked.unmask(masked.text) == src
    kinds = {e.kind for e in masked.escapes}
    assert kinds == {"line_magic", "shell", "shell_capture", "help", "autocall"}
    assert mask('s = "%time x"\n# !ls\n').escapes == ()


# -- one device per notebook ----------------------------------------------------------------


def definitions(text: str) -> list[tuple[int, str]]:
    found = []
    for n, src in enumerate(code_sources(text)):
        found += [(n, m) for m in re.findall(rf"^(\w+) = {re.escape(DEVICE_DEF)}", src, re.M)]
    return found


def test_device_is_defined_once_after_the_first_cells_imports_and_reused() -> None:
    cells = [
        nbf.code("import torch\nimport torch.nn as nn\nprint('setup')"),
        nbf.code("import math\nmodel = nn.Linear(2, 2).cuda()\nx = torch.ones(3, 2).cuda()"),
        nbf.code("y = model(x.cuda())"),
        nbf.code("z = torch.zeros(2, device='cuda')"),
    ]
    text = nbf.jupyter_text(nbf.notebook(cells))
    result = rewrite(text)
    assert definitions(result.new_text) == [(1, "device")]
    second = code_sources(result.new_text)[1].splitlines()
    assert second[:2] == ["import math", ""] and second[2].startswith("device = ")
    assert code_sources(result.new_text)[2:] == [
        "y = model(x.to(device))",
        "z = torch.zeros(2, device=device)",
    ]
    assert result.device_name == "device"
    assert run_cells(result.new_text)["z"].device.type == "cpu"


def test_a_torch_device_idiom_is_reused_by_later_cells() -> None:
    cells = [
        nbf.code(
            "import torch\ndev = torch.device('cuda' if torch.cuda.is_available() else 'cpu')"
        ),
        nbf.code("x = torch.ones(2).cuda()"),
    ]
    result = rewrite(nbf.jupyter_text(nbf.notebook(cells)))
    assert definitions(result.new_text) == [(0, "dev")]  # the idiom, rewritten in place
    assert code_sources(result.new_text)[1] == "x = torch.ones(2).to(dev)"
    run_cells(result.new_text)


def test_a_string_idiom_is_reused_and_a_device_added_where_a_type_is_needed() -> None:
    cells = [
        nbf.code("import torch\ndevice = 'cuda' if torch.cuda.is_available() else 'cpu'"),
        nbf.code("x = torch.ones(2).cuda()"),
        nbf.code("with torch.autocast('cuda'):\n    y = x * 2"),
        nbf.code("z = y.cuda()"),
    ]
    result = rewrite(nbf.jupyter_text(nbf.notebook(cells)))
    sources = code_sources(result.new_text)
    assert sources[1] == "x = torch.ones(2).to(device)"
    assert definitions(result.new_text) == [(2, "accel_device")]
    assert "torch.autocast(accel_device.type)" in sources[2]
    assert sources[3] == "z = y.to(accel_device)"
    assert isinstance(run_cells(result.new_text)["device"], str)


@pytest.mark.parametrize("name", ["device", "torch_device"])
def test_a_later_idiom_names_the_device_defined_earlier(name: str) -> None:
    cells = [
        nbf.code("import torch\nx = torch.zeros(2).cuda()"),
        nbf.code(f"{name} = torch.device('cuda' if torch.cuda.is_available() else 'cpu')"),
        nbf.code("y = x.cuda()"),
    ]
    result = rewrite(nbf.jupyter_text(nbf.notebook(cells)))
    sources = code_sources(result.new_text)
    assert definitions(result.new_text) == [(0, name), (1, name)]
    assert sources[0].endswith(f"x = torch.zeros(2).to({name})")
    assert sources[2] == f"y = x.to({name})"
    run_cells(result.new_text)


def test_a_name_used_in_another_cell_is_not_taken() -> None:
    cells = [
        nbf.code("import torch\nx = torch.zeros(2).cuda()"),
        nbf.code("for device in ['a', 'b']:\n    print(device)"),
        nbf.code("y = x.cuda()"),
    ]
    result = rewrite(nbf.jupyter_text(nbf.notebook(cells)))
    assert definitions(result.new_text) == [(0, "accel_device")]
    assert code_sources(result.new_text)[2] == "y = x.to(accel_device)"
    assert run_cells(result.new_text)["y"].device.type == "cpu"


def test_a_device_defined_inside_timeit_is_defined_again_later() -> None:
    cells = [nbf.code(SETUP), nbf.code("%%timeit\nt.cuda()"), nbf.code("u = t.cuda()")]
    result = rewrite(nbf.jupyter_text(nbf.notebook(cells)))
    assert definitions(result.new_text) == [(1, "device"), (2, "device")]


def test_later_cells_see_the_imports_of_earlier_cells() -> None:
    cells = [
        nbf.code("import torch as th\nx = th.zeros(2).cuda()"),
        nbf.code("th.cuda.synchronize()\ny = x.cuda()"),
        nbf.code("%%time\nn = th.cuda.device_count()"),
    ]
    result = rewrite(nbf.jupyter_text(nbf.notebook(cells)))
    sources = code_sources(result.new_text)
    assert "device = th.accelerator.current_accelerator" in sources[0]
    # the guard's layout is the rule's business; what matters: `th` was recognised
    assert "th.cuda" not in sources[1] and "th.accelerator.synchronize()" in sources[1]
    assert sources[1].endswith("\ny = x.to(device)")
    assert sources[2] == "%%time\nn = th.accelerator.device_count()"
    assert [(e.cell_index, e.finding.line) for e in result.edits] == [
        (0, 2),
        (1, 1),
        (1, 2),
        (2, 2),
    ]
    run_cells(result.new_text.replace("%%time\\n", ""))


# -- findings: cell, id, line, column ---------------------------------------------------------


def spots(result: NotebookResult, code: str) -> list[tuple[int, str | None, int, int]]:
    return [
        (f.cell_index, f.cell_id, f.finding.line, f.finding.col)
        for f in result.findings
        if f.finding.code == code
    ]


def test_nvidia_tools_are_reported_where_they_are() -> None:
    cells = [
        nbf.code("!nvidia-smi\n!!nvidia-smi -L\ngpus = !nvidia-smi --list-gpus"),
        nbf.code("%system nvidia-smi\n!watch -n 1 nvidia-smi\n!nvcc --version"),
        nbf.code("%%bash\necho hi\nnvidia-smi -q | head"),
        nbf.code("print('nvidia-smi')\n# !nvidia-smi"),
    ]
    result = rewrite(nbf.jupyter_text(nbf.notebook(cells)))
    assert spots(result, "G2T510") == [
        (0, "cell-00", 1, 2),
        (0, "cell-00", 2, 3),
        (0, "cell-00", 3, 9),
        (1, "cell-01", 1, 9),
        (1, "cell-01", 2, 13),
        (1, "cell-01", 3, 2),
        (2, "cell-02", 3, 1),
    ]
    first = result.findings[0].finding
    assert first.message == "`!nvidia-smi` has no TPU equivalent; `%tpu_info` shows the TPU"
    assert first.safety is Safety.REPORT and "%tpu_info" in first.hint


def test_cuda_visible_devices_is_reported() -> None:
    cells = [
        nbf.code(
            "%env CUDA_VISIBLE_DEVICES=0\n%set_env CUDA_VISIBLE_DEVICES 1\n%env\n%env OTHER=1"
        ),
        nbf.code("!CUDA_VISIBLE_DEVICES=0 python train.py\n!export CUDA_VISIBLE_DEVICES=1"),
    ]
    result = rewrite(nbf.jupyter_text(nbf.notebook(cells, minor=4)))
    assert spots(result, "G2T511") == [
        (0, None, 1, 6),
        (0, None, 2, 10),
        (1, None, 1, 2),
        (1, None, 2, 9),
    ]
    assert "TPU_VISIBLE_CHIPS" in result.findings[0].finding.hint


def test_installs_of_cuda_only_packages_are_reported() -> None:
    cells = [
        nbf.code(
            "!pip install flash-attn --no-build-isolation\n"
            "%pip install -q bitsandbytes==0.43 transformers\n"
            "!python -m pip install nvidia-cudnn-cu12 cupy-cuda12x\n"
            '!pip install "jax[cuda12]"\n'
            "!pip install torch --index-url https://download.pytorch.org/whl/cu121\n"
            "%conda install -c nvidia cuda-toolkit\n"
            "!pip install numpy \\\n    apex triton pynvml\n"
            "!pip install -r requirements.txt torch numpy"
        )
    ]
    result = rewrite(nbf.jupyter_text(nbf.notebook(cells)))
    found = [(f.finding.line, f.finding.message) for f in result.findings]
    assert found == [
        (1, "`pip install flash-attn` installs a CUDA-only package"),
        (2, "`pip install bitsandbytes` installs a CUDA-only package"),
        (3, "`pip install nvidia-cudnn-cu12` installs a CUDA-only package"),
        (3, "`pip install cupy-cuda12x` installs a CUDA-only package"),
        (4, "`pip install jax[cuda12]` installs a CUDA-only package"),
        (5, "`pip install` uses a CUDA wheel index (https://download.pytorch.org/whl/cu121)"),
        (6, "`conda install cuda-toolkit` installs a CUDA-only package"),
        (8, "`pip install apex` installs a CUDA-only package"),
        (8, "`pip install triton` installs a CUDA-only package"),
        (8, "`pip install pynvml` installs a CUDA-only package"),
    ]
    assert all(f.finding.code == "G2T512" and f.finding.hint for f in result.findings)
    assert "scaled_dot_product_attention" in result.findings[0].finding.hint


def test_notebook_rules_follow_options_and_are_documented() -> None:
    text = nbf.jupyter_text(nbf.notebook([nbf.code("!nvidia-smi\n%env CUDA_VISIBLE_DEVICES=0")]))
    assert {f.finding.code for f in rewrite(text).findings} == {"G2T510", "G2T511"}
    assert rewrite(text, ignore=("G2T51",)).findings == ()
    assert {f.finding.code for f in rewrite(text, select=("G2T511",)).findings} == {"G2T511"}
    checks = [r for r in all_rules() if issubclass(r, NotebookRule)]
    assert [r.code for r in checks] == ["G2T510", "G2T511", "G2T512", "G2T513", "G2T519"]
    assert not any(issubclass(r, NotebookRule) for r in rules_for(Options()))  # no hooks to run
    for rule in checks:
        assert "Why:" in (rule.__doc__ or "") and "Example:" in (rule.__doc__ or "")


# -- runtime metadata -------------------------------------------------------------------------


def test_colab_gpu_runtime_is_reported_and_fixed_only_with_unsafe_fixes() -> None:
    text = nbf.colab_text(nbf.colab_notebook([nbf.code("print(1)")]))
    reported = rewrite(text)
    assert reported.new_text is text
    (finding,) = reported.findings
    assert finding.cell_index == -1 and finding.finding.code == "G2T513"
    assert not finding.finding.fixed and finding.finding.fixable
    assert finding.finding.safety is Safety.UNSAFE
    assert text.splitlines()[finding.finding.line - 1].strip() == '"accelerator": "GPU"'
    fixed = rewrite(text, unsafe_fixes=True)
    expected = text.replace('"accelerator": "GPU"', '"accelerator": "TPU"').replace(
        '"gpuType": "T4"', '"gpuType": "V5E1"'
    )
    assert fixed.new_text == expected
    assert [e.finding.code for e in fixed.edits] == ["G2T513"] and not fixed.findings


def _gpu2tpu(*args: str, cwd: Any, capsys: Any, monkeypatch: Any) -> tuple[int, str]:
    """`gpu2tpu ARGS` run in this process from `cwd`: (exit code, standard output)."""
    from gpu2tpu.cli import main

    monkeypatch.chdir(cwd)
    capsys.readouterr()
    code = main(list(args))
    return code, capsys.readouterr().out


def test_a_colab_gpu_runtime_alone_does_not_fail_a_run(tmp_path, capsys, monkeypatch) -> None:
    """`rewrite` exited 1 on every Colab notebook written for a GPU, nothing else being left."""
    text = nbf.colab_text(nbf.colab_notebook([nbf.code("import torch\nx = torch.ones(2).cuda()")]))
    (tmp_path / "colab.ipynb").write_text(text, encoding="utf-8")
    run = {"cwd": tmp_path, "capsys": capsys, "monkeypatch": monkeypatch}
    code, out = _gpu2tpu("rewrite", "colab.ipynb", **run)
    assert code == 0, out
    assert "G2T513" in out
    assert "Notebook runtime settings, not code (no effect on the exit status" in out
    assert "`--unsafe-fixes` writes them" in out
    code, out = _gpu2tpu("check", "--format", "json", "colab.ipynb", **run)
    assert code == 0, out
    [finding] = json.loads(out)["findings"]
    assert (finding["code"], finding["category"]) == ("G2T513", "runtime-settings")


def test_kaggle_gpu_runtime_is_fixed_in_place() -> None:
    nb = nbf.notebook([nbf.code("print(1)")], metadata=nbf.kaggle_metadata())
    for text in (nbf.jupyter_text(nb), nbf.hand_edited(nb)):
        fixed = rewrite(text, unsafe_fixes=True)
        expected = re.sub(r'("accelerator"\s*:\s*)"nvidiaTeslaT4"', r'\1"tpuV5e8"', text)
        expected = re.sub(r'("isGpuEnabled"\s*:\s*)true', r"\1false", expected)
        assert fixed.new_text == expected != text


def test_tpu_runtimes_are_not_reported() -> None:
    colab = nbf.colab_text(
        nbf.colab_notebook([nbf.code("print(1)")], accelerator="TPU", gpu_type="V28")
    )
    kaggle = nbf.notebook([nbf.code("print(1)")], metadata=nbf.kaggle_metadata("tpuV5e8"))
    kaggle["metadata"]["kaggle"]["isGpuEnabled"] = False
    for text in (colab, nbf.jupyter_text(kaggle)):
        assert rewrite(text, unsafe_fixes=True).findings == ()


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"cells": [', "not valid JSON"),
        ("[1, 2]", "the JSON is not an object"),
        (
            json.dumps(
                {"nbformat": 3, "nbformat_minor": 0, "metadata": {}, "worksheets": [{"cells": []}]}
            ),
            "nbformat 3",
        ),
        (json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}}), "no `cells`"),
        (json.dumps({"cells": []}), "no `nbformat`"),
    ],
)
def test_whole_file_problems_raise_a_clear_error(text: str, reason: str) -> None:
    with pytest.raises(NotebookError) as info:
        rewrite(text)
    assert reason in info.value.reason


def test_a_cell_that_does_not_parse_is_skipped_and_the_rest_rewritten() -> None:
    broken = "x = t.cuda()\ny = = 2"
    cells = [
        nbf.code(SETUP),
        nbf.code(broken),
        nbf.code("%%time\n" + broken),
        nbf.code("cd ~/data\ny = t.cuda()"),
        {**nbf.code("ignored"), "source": 3},
        nbf.code("z = t.cuda()"),
    ]
    text = nbf.jupyter_text(nbf.notebook(cells, minor=4))
    result = rewrite(text)
    with pytest.raises(SourceError) as info:
        rewrite_source(broken)
    line = info.value.line
    assert result.cell_errors == (
        f"cell 1: {info.value.reason} (line {line})",
        f"cell 2: {info.value.reason} (line {line + 1})",
        result.cell_errors[2],
        "cell 4: `source` is neither text nor a list of lines",
    )
    assert result.cell_errors[2].startswith("cell 3: syntax error")
    sources = code_sources(result.new_text.replace('"source": 3', '"source": "3"'))
    assert sources[1:4] == [broken, "%%time\n" + broken, "cd ~/data\ny = t.cuda()"]
    assert sources[5].endswith("z = t.to(device)") and DEVICE_DEF in sources[5]
    assert all(e.cell_index == 5 for e in result.edits)


def test_a_notebook_in_another_language_is_left_alone() -> None:
    meta = {"kernelspec": {"name": "ir", "language": "R"}, "language_info": {"name": "R"}}
    text = nbf.jupyter_text(nbf.notebook([nbf.code("x <- y.cuda()")], metadata=meta))
    result = rewrite(text)
    assert result.new_text is text and "R" in result.skipped


# -- diff -------------------------------------------------------------------------------------


def test_notebook_diff_names_the_path_and_cell() -> None:
    nb = nbf.notebook(
        [nbf.markdown("x.cuda()"), nbf.code(SETUP), nbf.code("x = t.cuda()")],
        metadata=nbf.colab_metadata(),
    )
    text = nbf.jupyter_text(nb)
    result = rewrite(text, unsafe_fixes=True)
    diff = notebook_diff("nb.ipynb", text, result.new_text)
    assert "--- nb.ipynb:cell 2\n+++ nb.ipynb:cell 2\n" in diff
    assert "-x = t.cuda()\n" in diff and "+x = t.to(device)\n" in diff
    assert "--- nb.ipynb:metadata\n" in diff and '+ "accelerator": "TPU",\n' in diff
    assert "cell 0" not in diff and "cell 1" not in diff
    assert notebook_diff("nb.ipynb", text, text) == ""


# -- property: any notebook --------------------------------------------------------------------

PY_LINES = [
    "x = t.cuda()",
    "y = torch.zeros(2, device='cuda')",
    "print('größe ✓')",
    "z = 1",
    "import torch",
    "torch.cuda.synchronize()",
    "for i in range(2):\n    w = t.cuda()",
    "%time a = t.cuda()",
    "%matplotlib inline",
    "!ls -la",
    "files = !ls",
    "t?",
    "!pip install numpy \\\n  pandas",
    "b = t.cpu();",
]


def compact(nb: dict) -> str:
    return json.dumps(nb, separators=(",", ":"), ensure_ascii=False)


@st.composite
def notebooks(draw: st.DrawFn) -> str:
    cells = []
    for _ in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(["code", "code", "markdown", "raw"]))
        body = "\n".join(draw(st.lists(st.sampled_from(PY_LINES), max_size=4)))
        if draw(st.booleans()):
            body += "\n"
        if draw(st.booleans()):
            body = body.replace("\n", "\r\n")
        as_list = draw(st.booleans())
        maker = {"code": nbf.code, "markdown": nbf.markdown, "raw": nbf.raw}[kind]
        cells.append(maker(body, as_list=as_list))
    meta = draw(
        st.sampled_from([nbf.jupyter_metadata(), nbf.colab_metadata(), nbf.kaggle_metadata()])
    )
    setup = nbf.code(SETUP, as_list=draw(st.booleans()))
    nb = nbf.notebook([setup, *cells], minor=draw(st.integers(0, 5)), metadata=meta)
    writer = draw(st.sampled_from([nbf.jupyter_text, nbf.colab_text, nbf.hand_edited, compact]))
    return writer(nb)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=notebooks(), unsafe=st.booleans())
def test_any_notebook_stays_valid_changes_only_sources_and_is_stable(
    text: str, unsafe: bool
) -> None:
    result = rewrite(text, unsafe_fixes=unsafe)
    json.loads(result.new_text)
    if not unsafe:
        assert_only_code_sources_changed(text, result.new_text)
    again = rewrite(result.new_text, unsafe_fixes=unsafe)
    assert again.new_text is result.new_text and not again.edits
    if "cuda" not in "".join(code_sources(text)) and not unsafe:
        assert result.new_text is text


# -- local modules the notebook imports (G2T519) ---------------------------------------------------


def test_a_local_module_with_cuda_code_is_named_with_the_command_that_migrates_it(
    tmp_path, capsys, monkeypatch
) -> None:
    """helper_functions.py beside the notebook, full of torch.cuda calls, was neither
    rewritten nor mentioned by `gpu2tpu rewrite nb.ipynb`."""
    (tmp_path / "helper_functions.py").write_text(
        "import torch\n\ndef to_gpu(model):\n    return model.cuda()\n\n"
        "def sync():\n    torch.cuda.synchronize()\n",
        encoding="utf-8",
    )
    (tmp_path / "plots.py").write_text("def show(x):\n    return x\n", encoding="utf-8")
    (tmp_path / "chapters").mkdir()
    (tmp_path / "chapters" / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "chapters" / "ch4.py").write_text("import torch\ndev = torch.zeros(1).cuda()\n")
    cells = [
        nbf.code("import torch\nimport plots\nfrom helper_functions import to_gpu"),
        nbf.code("from chapters.ch4 import dev\nx = torch.ones(2).cuda()"),
    ]
    text = nbf.jupyter_text(nbf.notebook(cells))
    (tmp_path / "nb.ipynb").write_text(text, encoding="utf-8")
    found = local_module_findings(str(tmp_path / "nb.ipynb"), text, Options())
    assert [(f.cell_index, f.finding.line, f.finding.code) for f in found] == [
        (0, 3, "G2T519"),
        (1, 1, "G2T519"),
    ]
    first = found[0].finding
    assert first.message == (
        "`helper_functions.py` holds CUDA code (2 fixable), which rewriting the notebook "
        "leaves as it is: `gpu2tpu rewrite helper_functions.py` migrates it"
    )
    assert first.hint == "gpu2tpu rewrite helper_functions.py"
    assert "`chapters/ch4.py` holds CUDA code" in found[1].finding.message
    assert (
        local_module_findings(str(tmp_path / "nb.ipynb"), text, Options(ignore=("G2T519",))) == []
    )
    # the CLI says it, and not when the same run rewrites the modules too
    run = {"cwd": tmp_path, "capsys": capsys, "monkeypatch": monkeypatch}
    code, alone = _gpu2tpu("check", "nb.ipynb", **run)
    assert code == 1 and "nb.ipynb:cell 0:line 3:col 1: G2T519 `helper_functions.py` holds" in alone
    code, together = _gpu2tpu("check", ".", **run)
    assert "G2T519" not in together
    assert "helper_functions.py:4:12: G2T101" in together  # checked in the same run
