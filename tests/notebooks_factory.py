"""Notebooks built in code for the notebook tests, laid out as the tools that write them do.

`jupyter` layout: what nbformat/JupyterLab write (indent 1, sorted keys, raw non-ASCII, a
trailing newline). `colab` layout: what Colab writes (indent 2, `nbformat` first, cells last,
cell keys in Colab's order, ids in `metadata.id`, no sorting). Both round-trip through
`json.dumps`, as the real files do; `hand_edited` gives a layout `json.dumps` cannot reproduce.
"""

from __future__ import annotations

import base64
import json
from typing import Any

# A 1x1 PNG, as matplotlib would embed a figure.
PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360f8cfc0f01f0005000201a5f6a3"
        "0b0000000049454e44ae426082"
    )
).decode()

WIDGET_MODEL = "5f0c1e0a2b3c4d5e6f708192a3b4c5d6"

Source = str | list[str]


def lines(text: str) -> list[str]:
    """A source as Jupyter stores it: a list of lines, each but the last ending in a newline."""
    return text.splitlines(keepends=True)


def _source(text: str, as_list: bool) -> Source:
    return lines(text) if as_list else text


def code(
    text: str,
    *,
    as_list: bool = True,
    outputs: list[dict] | None = None,
    execution_count: int | None = None,
    metadata: dict | None = None,
) -> dict[str, Any]:
    return {
        "cell_type": "code",
        "execution_count": execution_count,
        "metadata": metadata if metadata is not None else {},
        "outputs": outputs if outputs is not None else [],
        "source": _source(text, as_list),
    }


def markdown(text: str, *, as_list: bool = True) -> dict[str, Any]:
    return {"cell_type": "markdown", "metadata": {}, "source": _source(text, as_list)}


def raw(text: str, *, as_list: bool = True) -> dict[str, Any]:
    return {"cell_type": "raw", "metadata": {}, "source": _source(text, as_list)}


def stream(text: str) -> dict[str, Any]:
    return {"name": "stdout", "output_type": "stream", "text": lines(text)}


def image_output() -> dict[str, Any]:
    return {
        "data": {"image/png": PNG, "text/plain": ["<Figure size 640x480 with 1 Axes>"]},
        "metadata": {"needs_background": "light"},
        "output_type": "display_data",
    }


def widget_output() -> dict[str, Any]:
    return {
        "data": {
            "application/vnd.jupyter.widget-view+json": {
                "model_id": WIDGET_MODEL,
                "version_major": 2,
                "version_minor": 0,
            },
            "text/plain": ["IntProgress(value=3, max=10)"],
        },
        "metadata": {},
        "output_type": "display_data",
    }


def error_output() -> dict[str, Any]:
    return {
        "ename": "RuntimeError",
        "evalue": "Found no NVIDIA driver on your system.",
        "output_type": "error",
        "traceback": ["\u001b[0;31mRuntimeError\u001b[0m: Found no NVIDIA driver"],
    }


def result_output(count: int, text: str) -> dict[str, Any]:
    return {
        "data": {"text/plain": [text]},
        "execution_count": count,
        "metadata": {},
        "output_type": "execute_result",
    }


def widget_state() -> dict[str, Any]:
    return {
        "application/vnd.jupyter.widget-state+json": {
            "state": {
                WIDGET_MODEL: {
                    "model_module": "@jupyter-widgets/controls",
                    "model_module_version": "2.0.0",
                    "model_name": "IntProgressModel",
                    "state": {"max": 10, "value": 3, "description": "épochs"},
                }
            },
            "version_major": 2,
            "version_minor": 0,
        }
    }


def jupyter_metadata(**extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python", "version": "3.11.9"},
    }
    meta.update(extra)
    return meta


def colab_metadata(accelerator: str = "GPU", gpu_type: str = "T4") -> dict[str, Any]:
    return {
        "colab": {"provenance": [], "gpuType": gpu_type},
        "kernelspec": {"name": "python3", "display_name": "Python 3"},
        "language_info": {"name": "python"},
        "accelerator": accelerator,
    }


def kaggle_metadata(accelerator: str = "nvidiaTeslaT4") -> dict[str, Any]:
    return jupyter_metadata(
        kaggle={
            "accelerator": accelerator,
            "dataSources": [],
            "isGpuEnabled": True,
            "isInternetEnabled": True,
            "language": "python",
            "sourceType": "notebook",
        }
    )


def notebook(
    cells: list[dict[str, Any]], *, minor: int = 5, metadata: dict[str, Any] | None = None
) -> dict[str, Any]:
    """An nbformat 4.`minor` notebook; cells get ids from 4.5 on (and only then)."""
    built = []
    for n, cell in enumerate(cells):
        cell = dict(cell)
        if minor >= 5:
            cell["id"] = f"cell-{n:02d}"
        if cell["cell_type"] != "code":
            cell.pop("outputs", None)
            cell.pop("execution_count", None)
        built.append(cell)
    return {
        "cells": built,
        "metadata": metadata if metadata is not None else jupyter_metadata(),
        "nbformat": 4,
        "nbformat_minor": minor,
    }


def colab_notebook(cells: list[dict[str, Any]], **meta: Any) -> dict[str, Any]:
    """A notebook as Colab saves it: nbformat 4.0, ids in cell metadata, Colab's key order."""
    built = []
    for n, cell in enumerate(cells):
        ordered: dict[str, Any] = {"cell_type": cell["cell_type"], "source": cell["source"]}
        ordered["metadata"] = {"id": f"Zx{n:02d}AbCd"}
        if cell["cell_type"] == "code":
            ordered["metadata"]["outputId"] = f"{n:04x}-out"
            ordered["execution_count"] = cell["execution_count"]
            ordered["outputs"] = cell["outputs"]
        built.append(ordered)
    return {
        "nbformat": 4,
        "nbformat_minor": 0,
        "metadata": colab_metadata(**meta),
        "cells": built,
    }


def jupyter_text(nb: dict[str, Any], *, ensure_ascii: bool = False) -> str:
    """The text nbformat writes: indent 1, sorted keys, trailing newline."""
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=ensure_ascii) + "\n"


def colab_text(nb: dict[str, Any]) -> str:
    """The text Colab writes: indent 2, keys as given, no trailing newline."""
    return json.dumps(nb, indent=2, ensure_ascii=False)


def hand_edited(nb: dict[str, Any]) -> str:
    """A layout no `json.dumps` call produces: tabs, spaces before colons, a CRLF file."""
    text = json.dumps(nb, indent="\t", separators=(" ,", " : "), ensure_ascii=False)
    return text.replace("\n", "\r\n") + "\r\n"


# Cells that cover IPython's syntax: each pairs a piece of syntax with CUDA code to rewrite.
IPYTHON_SYNTAX: dict[str, str] = {
    "line_magic": "%matplotlib inline\nx = t.cuda()",
    "line_magic_indented": "for i in range(2):\n    %time y = t.cuda()\n    z = t.cuda()",
    "shell": "!ls -la\nx = t.cuda()",
    "shell_continuation": "!pip install -q numpy \\\n    pandas \\\n  tqdm\nx = t.cuda()",
    "shell_in_loop": "for i in range(3):\n    !echo {i}\n    x = t.cuda()",
    "shell_capture": "!!date\nx = t.cuda()",
    "system_assign": "files = !ls\nx = t.cuda()",
    "magic_assign": "where = %pwd\nx = t.cuda()",
    "help_prefix": "?print\nx = t.cuda()",
    "help_suffix": "t.cuda?\nx = t.cuda()",
    "help_double": "t.cuda??\nx = t.cuda()",
    "magic_help": "%timeit?\nx = t.cuda()",
    "trailing_semicolon": "x = t.cuda()\nx.cuda();",
    "magic_in_string": 's = "%time not a magic"\nx = t.cuda()  # !not a shell\n',
    "time_line": "%time y = t.cuda()",
    "timeit_options": "%timeit -n 3 -r 1 t.cuda()",
    "prun_options": "%prun -q -l 4 t.cuda()",
    "cell_time": "%%time\nx = t.cuda()",
    "cell_timeit": "%%timeit -n 1\nt.cuda()",
    "cell_capture": "%%capture out\nx = t.cuda()\n!echo captured",
    "cell_prun": "%%prun -q\nx = t.cuda()",
    "cell_tpu": "%%tpu\nx = t.cuda()",
    "stacked": "%%time\n%%capture\nx = t.cuda()",
    "leading_blank_lines": "\n\n%%time\nx = t.cuda()",
    "autocall": "/print 1\nx = t.cuda()",
}

# Cell magics whose bodies are not Python: left exactly as they are, even with `.cuda()`.
FOREIGN_CELL_MAGICS: dict[str, str] = {
    "bash": "%%bash\necho t.cuda()",
    "writefile": "%%writefile train.py\nimport torch\nx = torch.zeros(2).cuda()\n",
    "html": "%%html\n<b>model.cuda()</b>",
    "javascript": "%%javascript\nconsole.log('x.cuda()')",
    "script_python": "%%script python\nprint(x.cuda())",
}


# A realistic Colab notebook as people bring it: written for a T4 runtime, every CUDA idiom of
# a small training notebook in the cells people put them in (the magic tests run it as is).
COLAB_TRAINING_CELLS: list[tuple[str, str]] = [
    ("markdown", "# Train a small classifier on a Colab GPU\nRuntime → Change runtime type → T4."),
    ("code", "!nvidia-smi"),
    (
        "code",
        "import time\n"
        "\n"
        "import torch\n"
        "import torch.nn as nn\n"
        "import torch.nn.functional as F\n"
        "\n"
        "torch.manual_seed(0)\n"
        "torch.backends.cudnn.benchmark = True\n"
        "torch.backends.cudnn.deterministic = False\n"
        'print("GPU:", torch.cuda.get_device_name(0))',
    ),
    ("code", 'device = torch.device("cuda")'),
    (
        "code",
        "model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "scaler = torch.cuda.amp.GradScaler()\n"
        "x = torch.randn(256, 32, device=device)\n"
        "y = (x[:, :4] * 2).argmax(dim=1).cuda()\n"
        'print(f"{sum(p.numel() for p in model.parameters()):,} parameters")',
    ),
    (
        "code",
        "start = torch.cuda.Event(enable_timing=True)\n"
        "end = torch.cuda.Event(enable_timing=True)\n"
        "start.record()\n"
        "for step in range(8):\n"
        "    optimizer.zero_grad(set_to_none=True)\n"
        "    with torch.cuda.amp.autocast():\n"
        "        loss = F.cross_entropy(model(x), y)\n"
        "    scaler.scale(loss).backward()\n"
        "    scaler.step(optimizer)\n"
        "    scaler.update()\n"
        '    print(f"step {step} loss {loss.item():.5f}")\n'
        "end.record()\n"
        "torch.cuda.synchronize()\n"
        'print(f"8 steps in {start.elapsed_time(end):.1f} ms")',
    ),
    ("code", "%time logits = model(x.cuda())"),
    (
        "code",
        "accuracy = (logits.argmax(dim=1) == y).float().mean().item()\n"
        'print(f"train accuracy {accuracy:.3f}")\n'
        'print(f"peak memory {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB")',
    ),
]


def colab_training_notebook() -> dict[str, Any]:
    """`COLAB_TRAINING_CELLS` as Colab saves a notebook (GPU runtime metadata included)."""
    cells = [code(t) if kind == "code" else markdown(t) for kind, t in COLAB_TRAINING_CELLS]
    return colab_notebook(cells)
