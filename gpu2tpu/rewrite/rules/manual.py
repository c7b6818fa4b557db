"""G2T5xx: what needs a person. CUDA kernels, CUDA-only libraries, NVIDIA tools, CUDA graphs.

No codemod can port a CUDA kernel or pick a replacement for apex's fused optimizer; these rules
say where such code is and what the usual replacement is, in one concrete hint each. They
report only, except `torch.backends.cuda.sdp_kernel`, whose exact modern equivalent is known.

`.cu` files are found per file tree, not per module: `cuda_sources_beside` is the pure
function the engine calls with the paths it discovered. G2T510-513 are the notebook checks
(`!nvidia-smi`, `%env CUDA_VISIBLE_DEVICES`, `!pip install` of CUDA-only packages, GPU runtime
metadata) in `notebook.py`; the rules here see the Python.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import PurePath
from typing import ClassVar

import libcst as cst

from ..analysis.literals import last_segment, short, string_value, strings_in
from ..analysis.names import full_name
from ..core.model import Finding, Options, Safety, Severity
from .base import Rule, RuleContext

CUDA_SOURCE_SUFFIXES = (".cu", ".cuh")
CODE_SUFFIXES = (".py", ".ipynb")
_CUDA_SOURCE = re.compile(r"\.cuh?$", re.IGNORECASE)
_NVIDIA_SMI = re.compile(r"(?:^|[\s;&|/\"'(])nvidia-smi(?:$|[\s;&|)])")
_IMPORT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError", "Exception"})


class _Manual(Rule):
    """A report-only rule: the code must be changed by a person."""

    safety: ClassVar[Safety] = Safety.REPORT


class CudaExtension(_Manual):
    """A custom CUDA extension: `CUDAExtension`, `load` of `.cu` files, `load_inline(cuda_sources)`.

    Why: the extension's kernels are compiled for NVIDIA GPUs and cannot run on a TPU. Keep
    the extension for CUDA, and give other devices a PyTorch version of the op (or, on a TPU,
    a Pallas kernel through TorchTPU's public bridge `torch.tpu.pallas.jax_op`), chosen by
    `device.type`.

    Example:
        fused = load("fused_adam_cuda", sources=["fused_adam.cpp", "fused_adam_kernel.cu"])
        # G2T501: keep for CUDA; a PyTorch fallback (or Pallas kernel) elsewhere
    """

    code = "G2T501"
    name = "cuda-extension"
    message = "custom CUDA extension {what}: TPUs cannot run CUDA kernels"
    hint = "keep it for CUDA; elsewhere use a PyTorch version of the op (or a Pallas kernel)"
    tokens = (b"cpp_extension", b"CUDAExtension")
    whole_module = True  # `load(...)` after `from torch.utils.cpp_extension import load`

    EXTENSION = "torch.utils.cpp_extension.CUDAExtension"
    LOADERS = ("torch.utils.cpp_extension.load", "torch.utils.cpp_extension.load_inline")

    def visit_Call(self, node: cst.Call) -> None:
        qualified = self.matches_name(node, self.EXTENSION, *self.LOADERS)
        if qualified is None or not self._builds_cuda(node, qualified):
            return
        first = node.args[0].value if node.args else None
        for arg in node.args:
            if arg.keyword is not None and arg.keyword.value == "name":
                first = arg.value
        name = string_value(first) if first is not None else None
        self.report(node, self.message.format(what=f"`{name}`" if name else "(unnamed)"))

    def _builds_cuda(self, node: cst.Call, qualified: str) -> bool:
        if qualified == self.EXTENSION:
            return True
        keywords = {a.keyword.value: a.value for a in node.args if a.keyword is not None}
        with_cuda = keywords.get("with_cuda")
        if isinstance(with_cuda, cst.Name) and with_cuda.value == "True":
            return True
        if "extra_cuda_cflags" in keywords:
            return True
        if qualified.endswith("load_inline"):
            positional = [a.value for a in node.args if a.keyword is None]
            sources = keywords.get("cuda_sources", positional[2] if len(positional) > 2 else None)
            return sources is not None and not (
                isinstance(sources, cst.Name) and sources.value == "None"
            )
        return any(_CUDA_SOURCE.search(s) for s in strings_in(node))


class CudaSourceFile(_Manual):
    """A CUDA source file (`.cu`, `.cuh`): beside the code, or named in it.

    Why: a CUDA source builds only for NVIDIA GPUs. When it sits in the tree being checked
    (the engine calls `cuda_sources_beside` with the files it found), or the code names one
    outside `torch.utils.cpp_extension` (which G2T501 reports), its kernels need a PyTorch
    fallback or a Pallas kernel on a TPU.

    Example:
        csrc/fused_softmax.cu                         # G2T502, reported at 1:1
        ext = Extension("fused", ["fused_softmax.cu"])  # G2T502
    """

    code = "G2T502"
    name = "cuda-source-file"
    message = "CUDA source `{path}`: TPUs cannot run its kernels"
    hint = "port its kernels to PyTorch ops (or a Pallas kernel) for devices other than CUDA"
    tokens = (b'.cu"', b".cu'", b".cuh")

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        value = string_value(node)
        if value is None or not _CUDA_SOURCE.search(value.strip()):
            return
        parent = self.parent(node)
        while parent is not None and not isinstance(parent, cst.SimpleStatementLine):
            if isinstance(parent, cst.Call) and self.matches_name(
                parent, CudaExtension.EXTENSION, *CudaExtension.LOADERS
            ):
                return  # G2T501 reports the whole extension
            parent = self.parent(parent)
        self.report(node, self.message.format(path=value.strip()))


def cuda_sources_beside(
    paths: Iterable[str | os.PathLike[str]], options: Options | None = None
) -> list[tuple[PurePath, Finding]]:
    """G2T502 findings for the CUDA sources among `paths` that sit beside Python code.

    Contract (for the engine): `paths` are all the files the discovery found, of any suffix,
    in one form (all relative to the same root, or all absolute); nothing is read from disk.
    A `.cu` or `.cuh` file is reported when a `.py` file or notebook of `paths` lives in its
    folder or in a folder above it (the code that builds or loads it). Each finding is
    `(path of the CUDA source, Finding)` at line 1, column 1, sorted by path; none when
    `options` switch G2T502 off.
    """
    options = options or Options()
    if not options.enabled(CudaSourceFile.code):
        return []
    pure = [PurePath(p) for p in paths]
    code_dirs = {p.parent for p in pure if p.suffix.lower() in CODE_SUFFIXES}
    found: list[tuple[PurePath, Finding]] = []
    for path in sorted(p for p in pure if p.suffix.lower() in CUDA_SOURCE_SUFFIXES):
        if not any(d == path.parent or d in path.parents for d in code_dirs):
            continue
        finding = Finding(
            code=CudaSourceFile.code,
            name=CudaSourceFile.name,
            line=1,
            col=1,
            message=CudaSourceFile.message.format(path=path.name),
            hint=CudaSourceFile.hint,
            safety=CudaSourceFile.safety,
            severity=CudaSourceFile.severity,
        )
        found.append((path, finding))
    return found


class _CudaLibrary(_Manual):
    """A CUDA-only library: its imports are reported, and calls whose hint is specific.

    Calls go through names the imports bound (`amp.initialize`, `FusedAdam(...)`), in
    statements without the library's name: the statement-level path keeps and visits those
    statements too, since a name an import binds from a module holding a rule's token is a
    token itself (`statements.plan`, `source._statements_to_visit`).
    """

    packages: ClassVar[tuple[str, ...]]

    def usage_hint(self, qualified: str) -> str | None:
        """The hint for a call to `qualified`, or None when the import says enough."""
        return None

    def _top(self, dotted: str) -> bool:
        return dotted.split(".")[0] in self.packages

    def _guarded(self, node: cst.CSTNode) -> bool:
        """Whether an import sits in `try:` with an `except ImportError:` (a fallback exists)."""
        parent = self.parent(node)
        while parent is not None and not isinstance(parent, cst.Module):
            if isinstance(parent, cst.Try):
                for handler in parent.handlers:
                    caught = handler.type
                    names = (
                        {last_segment(e.value) for e in caught.elements}
                        if isinstance(caught, cst.Tuple)
                        else {last_segment(caught) if caught is not None else "Exception"}
                    )
                    if names & _IMPORT_ERRORS:
                        return True
            if isinstance(parent, cst.FunctionDef | cst.ClassDef):
                return False
            parent = self.parent(parent)
        return False

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            full = full_name(alias.name)
            if self._top(full) and not self._guarded(node):
                hint = self.usage_hint(full) or self.hint
                self.report(node, self.message.format(what=f"`{short(node, 50)}`"), hint=hint)
                return

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.relative or node.module is None:
            return
        module = full_name(node.module)
        if not self._top(module) or self._guarded(node):
            return
        names = [] if isinstance(node.names, cst.ImportStar) else list(node.names)
        hints = [self.usage_hint(f"{module}.{a.evaluated_name}") for a in names]
        hint = next((h for h in hints if h), None) or self.usage_hint(module) or self.hint
        self.report(node, self.message.format(what=f"`{short(node, 50)}`"), hint=hint)

    def visit_Call(self, node: cst.Call) -> None:
        for qualified in self.qualified_names(node):
            hint = self.usage_hint(qualified)
            if hint is not None:
                self.report(node, self.message.format(what=f"`{qualified}`"), hint=hint)
                return


class TritonKernel(_CudaLibrary):
    """Triton: `import triton`, `@triton.jit` kernels, `torch.utils._triton.has_triton()`.

    Why: Triton compiles kernels for NVIDIA and AMD GPUs only; on a TPU the import fails and
    the kernels have no backend. Keep them for GPUs and give other devices a pure-PyTorch
    version (or a Pallas kernel on a TPU). Imports inside `try: ... except ImportError:` have
    a fallback already and are not reported; the kernels still are.

    Example:
        @triton.jit                   # G2T503: a PyTorch (or Pallas) version for TPUs
        def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr): ...
    """

    code = "G2T503"
    name = "triton-kernel"
    message = "Triton ({what}) compiles for GPUs only"
    hint = "keep it for GPUs; elsewhere run a pure-PyTorch version (or a Pallas kernel on TPU)"
    tokens = (b"triton",)
    packages = ("triton",)

    DECORATORS = ("triton.jit", "triton.autotune", "triton.heuristics")

    def usage_hint(self, qualified: str) -> str | None:
        if qualified == "torch.utils._triton.has_triton":
            return "make sure the branch taken without Triton is pure PyTorch"
        return None

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        for decorator in node.decorators:
            target = decorator.decorator
            if isinstance(target, cst.Call):
                target = target.func
            if self.matches_name(target, *self.DECORATORS):
                message = f"Triton kernel `{node.name.value}` compiles for GPUs only"
                self.report(decorator, message)
                return


class Cupy(_CudaLibrary):
    """CuPy: NVIDIA-GPU arrays and kernels (`import cupy`, `cp.RawKernel`, `cp.ElementwiseKernel`).

    Why: CuPy runs only on CUDA (and ROCm) GPUs. Its arrays become torch tensors (or numpy on
    the host), its custom kernels PyTorch ops or a Pallas kernel.

    Example:
        import cupy as cp             # G2T504: torch tensors instead of cupy arrays
    """

    code = "G2T504"
    name = "cupy"
    message = "CuPy ({what}) runs on CUDA GPUs only"
    hint = "use torch tensors (or numpy on the host) instead of CuPy arrays"
    tokens = (b"cupy",)
    packages = ("cupy", "cupyx")

    KERNELS = frozenset({"RawKernel", "RawModule", "ElementwiseKernel", "ReductionKernel", "fuse"})

    def usage_hint(self, qualified: str) -> str | None:
        if qualified.startswith("cupy.") and qualified.rsplit(".", 1)[-1] in self.KERNELS:
            return "rewrite the kernel as PyTorch ops (or a Pallas kernel on a TPU)"
        return None


APEX_HINTS = {
    "apex.amp": "use `torch.amp.autocast(device.type, dtype=torch.bfloat16)`; TPUs need no "
    "loss scaling",
    "apex.optimizers.FusedAdam": "use `torch.optim.AdamW` (pass `fused=True` only on CUDA)",
    "apex.optimizers.FusedLAMB": "use `torch.optim.AdamW`, or a LAMB written in PyTorch",
    "apex.optimizers.FusedSGD": "use `torch.optim.SGD`",
    "apex.optimizers.FusedNovoGrad": "use `torch.optim.AdamW`, or a NovoGrad written in PyTorch",
    "apex.optimizers": "use the matching `torch.optim` optimizer",
    "apex.normalization.FusedLayerNorm": "use `torch.nn.LayerNorm`",
    "apex.normalization.FusedRMSNorm": "use `torch.nn.RMSNorm`",
    "apex.normalization": "use `torch.nn.LayerNorm` / `torch.nn.RMSNorm`",
    "apex.parallel.DistributedDataParallel": "use `torch.nn.parallel.DistributedDataParallel`",
    "apex.parallel.convert_syncbn_model": "use `torch.nn.SyncBatchNorm.convert_sync_batchnorm`",
    "apex.parallel.SyncBatchNorm": "use `torch.nn.SyncBatchNorm`",
    "apex.multi_tensor_apply": "drop the fused multi-tensor kernels: `torch._foreach_*` ops "
    "or a plain loop do the same",
    "amp_C": "remove `import amp_C`: its fused kernels are CUDA-only; `torch._foreach_*` ops "
    "do the same",
}


class Apex(_CudaLibrary):
    """NVIDIA apex: `amp.initialize`, `FusedAdam`, `FusedLayerNorm`, `apex.parallel.DDP`, `amp_C`.

    Why: apex's fused kernels are built for CUDA only, and each has a PyTorch equivalent:
    `torch.amp` for apex.amp (bf16 needs no loss scaling), `torch.optim.AdamW` for
    FusedAdam, `torch.nn.LayerNorm` for FusedLayerNorm, torch's DDP for apex's.

    Example:
        from apex.optimizers import FusedAdam    # G2T505: torch.optim.AdamW
        model, opt = amp.initialize(model, opt)  # G2T505: torch.amp.autocast
    """

    code = "G2T505"
    name = "apex"
    message = "apex ({what}) is CUDA-only"
    hint = "replace apex with its PyTorch equivalents (torch.amp, torch.optim, torch.nn)"
    tokens = (b"apex", b"amp_C")
    packages = ("apex", "amp_C")

    def usage_hint(self, qualified: str) -> str | None:
        best = max((k for k in APEX_HINTS if _has_prefix(qualified, k)), key=len, default=None)
        return APEX_HINTS[best] if best else None


def _has_prefix(qualified: str, prefix: str) -> bool:
    return qualified == prefix or qualified.startswith(prefix + ".")


class FlashAttn(_CudaLibrary):
    """flash-attn: `flash_attn_func`, `flash_attn_varlen_func` and the rest of `flash_attn`.

    Why: FlashAttention's kernels are CUDA-only. PyTorch's
    `F.scaled_dot_product_attention` does the same work on any device, but takes
    (batch, heads, seq, dim) where flash-attn takes (batch, seq, heads, dim), and variable-
    length batches need padding and a mask instead of `cu_seqlens`.

    Example:
        out = flash_attn_func(q, k, v, causal=True)
        ->  out = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            ).transpose(1, 2)
    """

    code = "G2T506"
    name = "flash-attn"
    message = "flash-attn ({what}) is CUDA-only"
    hint = (
        "use `F.scaled_dot_product_attention`, with q, k, v transposed to (batch, heads, seq, dim)"
    )
    tokens = (b"flash_attn",)
    packages = ("flash_attn",)

    def usage_hint(self, qualified: str) -> str | None:
        if not qualified.startswith("flash_attn."):
            return None
        if "varlen" in qualified:
            return (
                "pad the batch and use `F.scaled_dot_product_attention` with a mask (no "
                "`cu_seqlens` on other devices)"
            )
        if qualified.rsplit(".", 1)[-1].startswith("flash_attn"):
            return self.hint
        return None


class Bitsandbytes(_CudaLibrary):
    """bitsandbytes: 8-bit optimizers, `Linear8bitLt`/`Linear4bit`, `load_in_8bit/4bit=True`.

    Why: bitsandbytes' kernels need CUDA; on a TPU the import or the quantized load fails.
    Full-precision optimizers and layers (or torchao's quantization) run everywhere.

    Example:
        opt = bnb.optim.AdamW8bit(model.parameters())   ->  torch.optim.AdamW(...)
        from_pretrained(name, load_in_8bit=True)         # G2T507: load in bf16 instead
    """

    code = "G2T507"
    name = "bitsandbytes"
    message = "bitsandbytes ({what}) is CUDA-only"
    hint = "use full-precision PyTorch layers and optimizers (or torchao for quantization)"
    tokens = (b"bitsandbytes", b"load_in_8bit", b"load_in_4bit", b"BitsAndBytes")
    packages = ("bitsandbytes",)

    def usage_hint(self, qualified: str) -> str | None:
        if qualified.startswith("bitsandbytes.optim"):
            return "use `torch.optim.AdamW` (or another `torch.optim` optimizer)"
        if qualified.startswith("bitsandbytes.nn"):
            return "use `torch.nn.Linear` (or torchao for quantization)"
        if qualified.endswith(".BitsAndBytesConfig"):
            return "load the model in bfloat16 (`torch_dtype=torch.bfloat16`) instead"
        return None

    def visit_Call(self, node: cst.Call) -> None:
        for arg in node.args:
            keyword = arg.keyword.value if arg.keyword is not None else None
            if keyword in ("load_in_8bit", "load_in_4bit") and not (
                isinstance(arg.value, cst.Name) and arg.value.value == "False"
            ):
                self.report(
                    arg,
                    self.message.format(what=f"`{keyword}=True`"),
                    hint="load the model in bfloat16 (`torch_dtype=torch.bfloat16`) instead",
                )
                return
        super().visit_Call(node)


class Nvml(_CudaLibrary):
    """NVML: `pynvml` / nvidia-ml-py, `nvidia_smi`, `GPUtil`, `gpustat`, `torch.cuda.utilization()`.

    Why: NVML queries NVIDIA drivers; on a TPU machine there are none, so the import or the
    first call fails. Usually it only logs utilisation or memory: drop it, or guard it, and
    use `torch.accelerator` memory calls (or the `tpu-info` tool) on a TPU.

    Example:
        import pynvml                          # G2T508
        util = torch.cuda.utilization()        # G2T508
    """

    code = "G2T508"
    name = "nvml"
    message = "NVIDIA management library ({what}) needs NVIDIA drivers"
    hint = "drop or guard it; `torch.accelerator` memory calls (or `tpu-info`) work on a TPU"
    tokens = (
        b"pynvml",
        b"nvidia_smi",
        b"py3nvml",
        b"gpustat",
        b"GPUtil",
        b"cuda.utilization",
        b"cuda.temperature",
        b"cuda.power_draw",
        b"cuda.clock_rate",
        b"cuda.list_gpu_processes",
        b"cuda.device_memory_used",
    )
    packages = ("pynvml", "nvidia_smi", "py3nvml", "gpustat", "GPUtil")
    whole_module = False  # its calls (`torch.cuda.utilization()`) carry its tokens

    TORCH_NVML = frozenset(
        f"torch.cuda.{n}"
        for n in (
            "utilization",
            "temperature",
            "power_draw",
            "clock_rate",
            "list_gpu_processes",
            "device_memory_used",
        )
    )

    def usage_hint(self, qualified: str) -> str | None:
        return self.hint if qualified in self.TORCH_NVML else None


CUDA_ENV = {
    "CUDA_VISIBLE_DEVICES": "drop it: a TPU process owns its chip (the runtime sets "
    "`TPU_VISIBLE_CHIPS`)",
    "CUDA_LAUNCH_BLOCKING": "for synchronous debugging on a TPU set `TPU_LAUNCH_BLOCKING=1` "
    "(TorchTPU)",
    "CUDA_DEVICE_ORDER": "drop it: it only orders NVIDIA GPUs",
}


class CudaEnvVar(_Manual):
    """`CUDA_VISIBLE_DEVICES`, `CUDA_LAUNCH_BLOCKING`, `CUDA_DEVICE_ORDER` in `os.environ`.

    Why: these variables steer the CUDA driver only; on a TPU they do nothing, so code that
    relies on them (to pick a device, or to make errors synchronous) silently does something
    else. TPUs have their own: `TPU_VISIBLE_CHIPS` (set by the runtime, one chip per process)
    and TorchTPU's `TPU_LAUNCH_BLOCKING`.

    Example:
        os.environ["CUDA_VISIBLE_DEVICES"] = "0"    # G2T509: drop it
    """

    code = "G2T509"
    name = "cuda-env-var"
    severity = Severity.WARNING
    message = "`{name}` steers the CUDA driver only; it does nothing on a TPU"
    hint = "drop it"
    tokens = (b"CUDA_VISIBLE_DEVICES", b"CUDA_LAUNCH_BLOCKING", b"CUDA_DEVICE_ORDER")

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        value = string_value(node)
        if value is None:
            return
        name = value.split("=", 1)[0].strip()
        if name in CUDA_ENV and (value.strip() == name or "=" in value):
            self.report(node, self.message.format(name=name), hint=CUDA_ENV[name])

    def visit_FormattedString(self, node: cst.FormattedString) -> None:
        first = node.parts[0] if node.parts else None
        if isinstance(first, cst.FormattedStringText):
            name = first.value.split("=", 1)[0].strip()
            if name in CUDA_ENV and "=" in first.value:
                self.report(node, self.message.format(name=name), hint=CUDA_ENV[name])


RUNNERS = frozenset(
    {
        "system",
        "popen",
        "run",
        "call",
        "check_call",
        "check_output",
        "Popen",
        "getoutput",
        "getstatusoutput",
        "run_line_magic",
        "run_cell_magic",
        "create_subprocess_exec",
        "create_subprocess_shell",
    }
)


class NvidiaSmi(_Manual):
    """`nvidia-smi` run from Python: `subprocess.run(["nvidia-smi"])`, `os.system("nvidia-smi")`.

    Why: the tool exists only on machines with NVIDIA drivers; on a TPU VM the command is
    missing and the call fails (or prints nothing useful). Drop it, or guard it with
    `shutil.which("nvidia-smi")`; in a notebook `%tpu_info` shows the TPU. (A notebook's own
    `!nvidia-smi` line is the notebook check G2T510.)

    Example:
        subprocess.run(["nvidia-smi"])    # G2T514
        get_ipython().system("nvidia-smi")
    """

    code = "G2T514"
    name = "nvidia-smi-call"
    message = "`nvidia-smi` has no TPU equivalent"
    hint = 'drop it or guard it with `shutil.which("nvidia-smi")`; `%tpu_info` shows the TPU'
    tokens = (b"nvidia-smi",)

    def __init__(self, ctx: RuleContext) -> None:
        super().__init__(ctx)
        self.reported: set[int] = set()

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        value = string_value(node)
        if value is not None and _NVIDIA_SMI.search(value):
            self._report_runner(node)

    def visit_FormattedStringText(self, node: cst.FormattedStringText) -> None:
        if _NVIDIA_SMI.search(node.value):
            self._report_runner(node)

    def _report_runner(self, node: cst.CSTNode) -> None:
        """Report the call that runs the command the string is part of, once."""
        parent = self.parent(node)
        while parent is not None and not isinstance(parent, cst.BaseSmallStatement):
            if isinstance(parent, cst.Call):
                if id(parent) not in self.reported and self._is_runner(parent):
                    self.reported.add(id(parent))
                    self.report(parent)
                return
            parent = self.parent(parent)

    def _is_runner(self, call: cst.Call) -> bool:
        for qualified in self.qualified_names(call):
            if qualified.startswith(("subprocess.", "asyncio.create_subprocess")):
                return True
            if qualified.startswith("os.") and qualified.rsplit(".", 1)[-1] in RUNNERS | {
                "execl",
                "execlp",
                "execv",
                "execvp",
                "spawnl",
                "spawnlp",
            }:
                return True
        return last_segment(call.func) in RUNNERS


CUDA_GRAPH_NAMES = tuple(
    f"torch.cuda.{n}"
    for n in (
        "CUDAGraph",
        "graph",
        "make_graphed_callables",
        "graph_pool_handle",
        "graphs.CUDAGraph",
        "graphs.graph",
        "graphs.make_graphed_callables",
        "graphs.graph_pool_handle",
    )
)


class CudaGraph(_Manual):
    """CUDA graphs: `torch.cuda.CUDAGraph`, `with torch.cuda.graph(g):`, `make_graphed_callables`.

    Why: capture and replay of CUDA kernels with static buffers is CUDA-only. The portable
    way to cut launch overhead is to compile the step: `torch.compile(mode="reduce-overhead")`
    uses CUDA graphs on CUDA, and `torch.compile(backend="tpu")` (or TorchTPU's fused eager
    mode) does the job on a TPU.

    Example:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):       # G2T515: compile the step instead
            out = model(static_x)
    """

    code = "G2T515"
    name = "cuda-graph"
    message = "CUDA graph capture (`{what}`) is CUDA-only"
    hint = 'compile the step instead: `torch.compile(model, mode="reduce-overhead")` on CUDA'
    tokens = (
        b"CUDAGraph",
        b"cuda.graph",
        b"graphed_callables",
        b"graph_pool_handle",
    )

    def visit_Call(self, node: cst.Call) -> None:
        qualified = self.matches_name(node, *CUDA_GRAPH_NAMES)
        if qualified is not None:
            self.report(node, self.message.format(what=qualified))


SDP_FLAGS = ("enable_flash", "enable_math", "enable_mem_efficient", "enable_cudnn")
# The order in which `sdp_kernel` appends the backends it enables.
SDP_BACKENDS = (
    ("enable_flash", "FLASH_ATTENTION"),
    ("enable_mem_efficient", "EFFICIENT_ATTENTION"),
    ("enable_math", "MATH"),
    ("enable_cudnn", "CUDNN_ATTENTION"),
)


class SdpKernel(Rule):
    """`torch.backends.cuda.sdp_kernel(...)`: the old, CUDA-named attention-backend switch.

    Why: it is deprecated, and on a TPU only the math backend may exist. Its replacement,
    `torch.nn.attention.sdpa_kernel([...])`, takes the enabled backends as a list; with literal
    `True`/`False` flags the rewrite is exact (it is how `sdp_kernel` itself is implemented).
    Flags that are not literals are reported instead. On a TPU keep `SDPBackend.MATH` in the
    list.

    Example:
        with torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False,
                                            enable_mem_efficient=False):
        ->  with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.FLASH_ATTENTION,
                                                 torch.nn.attention.SDPBackend.CUDNN_ATTENTION]):
    """

    code = "G2T516"
    name = "sdp-kernel"
    safety = Safety.SAFE
    severity = Severity.WARNING
    message = "`torch.backends.cuda.sdp_kernel` is deprecated; `sdpa_kernel` takes a list"
    hint = "use `torch.nn.attention.sdpa_kernel([SDPBackend...])`; keep MATH on a TPU"
    tokens = (b"sdp_kernel",)
    min_torch = "2.3"

    def visit_Call(self, node: cst.Call) -> None:
        if not self.matches_name(node, "torch.backends.cuda.sdp_kernel"):
            return
        flags = self._literal_flags(node)
        if flags is None:
            self.report(node, hint="flags that are not literals: build the backend list by hand")
            return
        ctx = self.ctx
        enabled = [backend for flag, backend in SDP_BACKENDS if flags[flag]]

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            elements = [
                cst.Element(ctx.torch_attr(f"nn.attention.SDPBackend.{b}")) for b in enabled
            ]
            return cst.Call(
                func=ctx.torch_attr("nn.attention.sdpa_kernel"),
                args=[cst.Arg(cst.List(elements))],
            )

        self.report(node, fix=fix)

    @staticmethod
    def _literal_flags(node: cst.Call) -> dict[str, bool] | None:
        flags = dict.fromkeys(SDP_FLAGS, True)
        for i, arg in enumerate(node.args):
            if arg.star:
                return None
            key = arg.keyword.value if arg.keyword is not None else None
            if key is None:
                if i >= len(SDP_FLAGS):
                    return None
                key = SDP_FLAGS[i]
            value = arg.value
            if key not in flags or not (
                isinstance(value, cst.Name) and value.value in ("True", "False")
            ):
                return None
            flags[key] = value.value == "True"
        return flags


FLASH_IMPLEMENTATIONS = frozenset({"flash_attention_2", "flash_attention_3"})


class FlashAttentionImplementation(_Manual):
    """`attn_implementation="flash_attention_2"`: transformers' FlashAttention kernels.

    Why: the value makes transformers run attention through the flash-attn package, whose
    kernels are CUDA-only (G2T506); loading the model fails where it is not installed or has
    no GPU. `"sdpa"` (PyTorch's `scaled_dot_product_attention`) runs on every device and is
    transformers' default where available. Covered: the keyword of any call (the libraries'
    own: `from_pretrained`, `AutoConfig`), `config.attn_implementation = ...` /
    `_attn_implementation`, and the older `use_flash_attention_2=True`.

    Example:
        model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="flash_attention_2")
        # -> attn_implementation="sdpa"
    """

    code = "G2T517"
    name = "flash-attention-implementation"
    message = "`{what}` runs attention through flash-attn's CUDA kernels"
    hint = 'use `attn_implementation="sdpa"`: PyTorch\'s attention, on every device'
    tokens = (b"flash_attention_", b"use_flash_attention_2")

    KEYWORDS = frozenset({"attn_implementation", "_attn_implementation"})

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is None:
            return
        key = node.keyword.value
        value = node.value
        if key in self.KEYWORDS:
            flash = string_value(value) in FLASH_IMPLEMENTATIONS
        else:
            off = isinstance(value, cst.Name) and value.value in ("False", "None")
            flash = key == "use_flash_attention_2" and not off
        if flash:
            what = f"{key}={self.code_for(value)}"
            self.report(value, self.message.format(what=what))

    def visit_Assign(self, node: cst.Assign) -> None:
        if string_value(node.value) not in FLASH_IMPLEMENTATIONS:
            return
        for target in node.targets:
            if last_segment(target.target) in self.KEYWORDS:
                what = f"{short(target.target, 40)} = {self.code_for(node.value)}"
                self.report(node.value, self.message.format(what=what))
                return


class NumbaCuda(_Manual):
    """Numba's CUDA target: `from numba import cuda`, `import numba.cuda`, `@cuda.jit` kernels.

    Why: `numba.cuda` compiles Python kernels for NVIDIA GPUs and copies arrays to them; a
    TPU has no CUDA driver, so the kernels cannot launch. Numba's CPU `@numba.jit` is fine.
    Rewrite each kernel as PyTorch ops on the module's device (or a Pallas kernel on a TPU).
    Names are resolved through the imports in scope, so `@jit` after `from numba import jit`
    is not reported.

    Example:
        from numba import cuda           # G2T518
        @cuda.jit                        # G2T518: PyTorch ops (or a Pallas kernel) instead
        def add(a, b, out): ...
    """

    code = "G2T518"
    name = "numba-cuda"
    message = "Numba's CUDA target ({what}) runs on NVIDIA GPUs only"
    hint = "rewrite the kernel as PyTorch ops on the module's device (or a Pallas kernel on TPU)"
    tokens = (b"numba",)
    whole_module = True  # `@cuda.jit` after `from numba import cuda` has no `numba` token

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            if full_name(alias.name).startswith("numba.cuda"):
                self.report(node, self.message.format(what=f"`{short(node, 50)}`"))
                return

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.relative or node.module is None:
            return
        module = full_name(node.module)
        cuda = module == "numba" and not isinstance(node.names, cst.ImportStar)
        if module.startswith("numba.cuda") or (
            cuda and any(a.evaluated_name == "cuda" for a in node.names)  # type: ignore[union-attr]  # not ImportStar: `cuda` said so
        ):
            self.report(node, self.message.format(what=f"`{short(node, 50)}`"))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        for decorator in node.decorators:
            target = decorator.decorator
            if isinstance(target, cst.Call):
                target = target.func
            name = self.qualified_names(target)
            if any(n.startswith("numba.cuda.") for n in name):
                message = f"Numba CUDA kernel `{node.name.value}` runs on NVIDIA GPUs only"
                self.report(decorator, message)
                return
