"""The notebook checks (G2T51x): declared here, in the one registry, run by rewrite/notebooks/.

They read a notebook's IPython syntax (`!nvidia-smi`, `%pip install`, `%env`) and metadata,
which no libcst tree holds, so they have no hooks: rewrite/notebooks/notebook.py finds what
they name and reports it under their codes. Being rules of the registry, they are listed by `gpu2tpu
rules` and docs/rules.md and follow `--select`, `--ignore` and `noqa` like the others.
"""

from __future__ import annotations

from ..core.model import Safety, Severity
from .base import NotebookRule


class NvidiaToolCommand(NotebookRule):
    """`!nvidia-smi` (or `!nvcc`) runs an NVIDIA tool from a notebook.

    Why: a TPU machine has no NVIDIA driver or CUDA toolkit, so the command fails.
    `%tpu_info` (after `%load_ext gpu2tpu`) shows the TPU instead.

    Example:
        !nvidia-smi   ->  %tpu_info
    """

    code = "G2T510"
    name = "nvidia-tool-command"
    safety = Safety.REPORT
    severity = Severity.ERROR


class CudaVisibleDevices(NotebookRule):
    """`%env CUDA_VISIBLE_DEVICES=...` (or `!CUDA_VISIBLE_DEVICES=0 cmd`) picks GPUs.

    Why: the variable only selects NVIDIA GPUs and does nothing on a TPU; on a TPU VM
    `TPU_VISIBLE_CHIPS` (with `TPU_PROCESS_BOUNDS`) selects chips.

    Example:
        %env CUDA_VISIBLE_DEVICES=0  ->  drop it (or %env TPU_VISIBLE_CHIPS=0)
    """

    code = "G2T511"
    name = "cuda-visible-devices"
    safety = Safety.REPORT
    severity = Severity.WARNING


class CudaOnlyPackage(NotebookRule):
    """`!pip install` (or `%pip`, `%conda`) of a package that only works with CUDA.

    Why: the wheel has no TPU build (flash-attn, bitsandbytes, apex, cupy-cuda12x,
    nvidia-*, triton, pynvml, ...): the install fails or the import does nothing useful.
    Each finding names the portable replacement.

    Example:
        !pip install flash-attn  ->  torch.nn.functional.scaled_dot_product_attention
    """

    code = "G2T512"
    name = "cuda-only-package"
    safety = Safety.REPORT
    severity = Severity.ERROR


class GpuRuntimeMetadata(NotebookRule):
    """The notebook's metadata asks Colab or Kaggle for a GPU runtime.

    Why: opened there, the notebook starts on a GPU. The unsafe fix asks for a TPU
    instead: Colab `"accelerator": "TPU"` with `"gpuType": "V5E1"` (v5e-1, what Colab
    itself writes for its TPU runtime), Kaggle `"accelerator": "tpuV5e8"` with
    `"isGpuEnabled": false`. Only those values change in the file.

    Example:
        "accelerator": "GPU", "gpuType": "T4"  ->  "accelerator": "TPU", "gpuType": "V5E1"
    """

    code = "G2T513"
    name = "gpu-runtime-metadata"
    safety = Safety.UNSAFE
    severity = Severity.WARNING


class LocalModuleWithCuda(NotebookRule):
    """The notebook imports a local module (a `.py` file beside it) that holds CUDA code.

    Why: rewriting the notebook does not rewrite the modules it imports, and neither
    do `%%tpu` and `%tpu_auto`: `helper_functions.py` full of `torch.cuda` calls still
    runs them. The finding names the module and the command that migrates it; it is
    not reported when the same run rewrites the module too.

    Example:
        from helper_functions import train  ->  gpu2tpu rewrite helper_functions.py
    """

    code = "G2T519"
    name = "local-module-with-cuda"
    safety = Safety.REPORT
    severity = Severity.ERROR
