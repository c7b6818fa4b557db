"""The notebook checks on IPython syntax (G2T510-512; rules/notebook_checks.py declares them).

Shell escapes (`!nvidia-smi`), shell cell magics (`%%bash`) and installers (`%pip install
flash-attn`) are what libcst never sees: notebook.py masks them out of each cell's Python and
asks this module what they do on a TPU machine.
"""

from __future__ import annotations

import re
import shlex

from ..analysis.lines import python_lines
from ..core.model import Finding
from ..rules.base import rule_by_code
from .ipython_syntax import Escape

# Packages with no TPU build, by normalised name, and what to use instead.
CUDA_ONLY_PACKAGES: dict[str, str] = {
    "flash-attn": "use `torch.nn.functional.scaled_dot_product_attention` (a Pallas kernel on TPU)",
    "xformers": "use `torch.nn.functional.scaled_dot_product_attention`",
    "bitsandbytes": "no TPU build: train in bf16, or quantise with torchao",
    "apex": "use `torch.amp` and the fused optimizers in `torch.optim`",
    "triton": "Triton kernels do not run on TPUs; Pallas is the TPU kernel language",
    "pynvml": "NVML only sees NVIDIA GPUs; `%tpu_info` shows the TPU",
    "nvidia-ml-py": "NVML only sees NVIDIA GPUs; `%tpu_info` shows the TPU",
    "pycuda": "use PyTorch or jax.numpy operations",
    "cupy": "use NumPy, PyTorch or jax.numpy",
    "onnxruntime-gpu": "use `onnxruntime` (CPU) or export to PyTorch/XLA",
    "tensorrt": "TensorRT is NVIDIA-only; use `torch.compile` or XLA",
    "torch-tensorrt": "TensorRT is NVIDIA-only; use `torch.compile` or XLA",
    "mamba-ssm": "its selective-scan kernels are CUDA-only; use a pure PyTorch scan",
    "causal-conv1d": "CUDA-only kernel; use `torch.nn.Conv1d` with left padding",
    "auto-gptq": "GPTQ kernels are CUDA-only; serve in bf16 on TPU",
    "autoawq": "AWQ kernels are CUDA-only; serve in bf16 on TPU",
    "deepspeed": "DeepSpeed targets CUDA; use FSDP (torch.distributed) or PyTorch/XLA SPMD",
}
_CUDA_NAME = re.compile(r"(^nvidia-|^cupy-cuda|cuda|-cu\d+$)")
_CUDA_INDEX = re.compile(r"/whl/cu\d+|\+cu\d+|/cu\d{2,3}(?:/|$)")
# pip and conda options that take a value (the value is not a package name)
_PIP_VALUE_OPTION_NAMES = (
    "-r --requirement -c --constraint -e --editable -i --index-url --extra-index-url -f "
    "--find-links -t --target --prefix --root --src --upgrade-strategy --progress-bar "
    "--trusted-host --cache-dir --log --proxy --retries --timeout --exists-action --cert "
    "--client-cert --platform --python-version --implementation --abi -C --config-settings "
    "--channel --override --python -p --name -n"
)
_PIP_VALUE_OPTIONS = frozenset(_PIP_VALUE_OPTION_NAMES.split())
_INDEX_OPTIONS = frozenset({"-i", "--index-url", "--extra-index-url", "-f", "--find-links"})
_WRAPPERS = frozenset({"sudo", "time", "watch", "nohup", "exec", "command", "env"})
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=")
_SHELL_MAGICS = frozenset({"system", "sx"})
_INSTALLER_MAGICS = frozenset({"pip", "conda", "mamba", "micromamba", "uv"})
SHELL_CELL_MAGICS = frozenset({"bash", "sh", "system"})

# Byte strings at least one of which a notebook must contain for G2T510-513 to fire; the
# engine's prefilter should let notebooks with any of them through.
NOTEBOOK_TOKENS: tuple[bytes, ...] = (
    b"nvidia",
    b"nvcc",
    b"CUDA_VISIBLE_DEVICES",
    b"GPU",
    b"gpu",
    b"Gpu",
    b"cuda",
    b"/cu1",
    *(name.encode() for name in CUDA_ONLY_PACKAGES),
    b"flash_attn",
    b"mamba_ssm",
)


def notebook_finding(
    code: str,
    line: int,
    col: int,
    message: str,
    hint: str,
    *,
    fixed: bool = False,
    fixable: bool = False,
    before: str = "",
    after: str = "",
) -> Finding:
    """A finding of one of the notebook checks (rules/notebook_checks.py declares them)."""
    rule = rule_by_code(code)
    return Finding(
        code=code,
        name=rule.name,
        line=line,
        col=col,
        message=message,
        hint=hint,
        safety=rule.safety,
        severity=rule.severity,
        fixed=fixed,
        fixable=fixable,
        before=before,
        after=after,
    )


# -- shell commands (G2T510-512) ------------------------------------------------------------


def _words(command: str) -> list[list[str]]:
    """The simple commands of a shell line, each as its words (`a && b | c` -> 3 commands)."""
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        tokens = list(lexer)
    except ValueError:  # unbalanced quotes: IPython passes `{var}` and `$var` through as is
        tokens = command.split()
    commands: list[list[str]] = [[]]
    for token in tokens:
        if token and set(token) <= set(";&|"):
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _cuda_only(spec: str) -> tuple[str, str] | None:
    """(package, hint) when a requirement names a CUDA-only package or a CUDA extra."""
    hit = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?", spec)
    if hit is None:
        return None
    name = _normalise(hit.group(1))
    extras = (hit.group(2) or "").lower()
    if name in CUDA_ONLY_PACKAGES:
        return name, CUDA_ONLY_PACKAGES[name]
    if name.startswith(("cupy-cuda", "cupy-rocm")):
        return name, CUDA_ONLY_PACKAGES["cupy"]
    if name.startswith("nvidia-"):
        return name, "NVIDIA's CUDA libraries; a TPU machine needs none of them"
    if "cuda" in extras:
        return f"{name}{hit.group(2)}", f"install `{name}[tpu]` (or the plain package) instead"
    if _CUDA_NAME.search(name):
        return name, "a CUDA build; install the plain (CPU/TPU) package instead"
    return None


def _install_findings(args: list[str], tool: str) -> list[tuple[str, str, str]]:
    """(needle, message, hint) for each CUDA-only thing in a `pip install ...` argument list."""
    out: list[tuple[str, str, str]] = []
    it = iter(args)
    for arg in it:
        if arg in _INDEX_OPTIONS:
            url = next(it, "")
            if _CUDA_INDEX.search(url):
                out.append(
                    (
                        url,
                        f"`{tool} install` uses a CUDA wheel index ({url})",
                        "install the default wheels; on a TPU add torch_tpu or torch_xla",
                    )
                )
            continue
        if arg.startswith("-"):
            name = arg.split("=", 1)[0]
            if "=" in arg and name in _INDEX_OPTIONS and _CUDA_INDEX.search(arg):
                out.append(
                    (
                        arg,
                        f"`{tool} install` uses a CUDA wheel index",
                        "install the default wheels; on a TPU add torch_tpu or torch_xla",
                    )
                )
            elif name in _PIP_VALUE_OPTIONS and "=" not in arg:
                next(it, None)
            continue
        hit = _cuda_only(arg)
        if hit:
            package, hint = hit
            out.append((arg, f"`{tool} install {package}` installs a CUDA-only package", hint))
    return out


def shell_findings(command: str, line: int, col: int, lines: list[str]) -> list[Finding]:
    """G2T510-512 findings for one shell command (`!cmd`, a `%%bash` line, `%pip ...`).

    `lines` are the physical lines the command was written on, the first being `line`; a
    finding points at the word it is about, else at (`line`, `col`).
    """
    found: list[Finding] = []

    def at(needle: str) -> tuple[int, int]:
        for k, text in enumerate(lines):
            pos = text.find(needle)
            if pos >= 0:
                return line + k, pos + 1
        return line, col

    for words in _words(command):
        while words and (hit := _ASSIGNMENT.match(words[0])):
            if hit.group(1) == "CUDA_VISIBLE_DEVICES":
                found.append(_cuda_visible(*at("CUDA_VISIBLE_DEVICES")))
            words = words[1:]
        if words and words[0] in ("export", "set"):
            for w in words[1:]:
                if w.startswith("CUDA_VISIBLE_DEVICES"):
                    found.append(_cuda_visible(*at("CUDA_VISIBLE_DEVICES")))
            continue
        while words and words[0] in _WRAPPERS:
            words = words[1:]
            while words and (
                words[0].startswith("-") or words[0].isdigit() or _ASSIGNMENT.match(words[0])
            ):
                words = words[1:]
        if not words:
            continue
        tool = words[0].rsplit("/", 1)[-1]
        rest = words[1:]
        if tool == "nvidia-smi":
            found.append(
                notebook_finding(
                    "G2T510",
                    *at("nvidia-smi"),
                    "`!nvidia-smi` has no TPU equivalent; `%tpu_info` shows the TPU",
                    "use `%tpu_info` after `%load_ext gpu2tpu`, or drop the line",
                )
            )
            continue
        if tool == "nvcc":
            found.append(
                notebook_finding(
                    "G2T510",
                    *at("nvcc"),
                    "`nvcc` is NVIDIA's CUDA compiler; a TPU machine has none",
                    "drop it: TPU kernels are written in Pallas, not CUDA",
                )
            )
            continue
        if re.fullmatch(r"python[\d.]*", tool) and rest[:2] == ["-m", "pip"]:
            tool, rest = "pip", rest[2:]
        elif tool == "uv" and rest[:1] == ["pip"]:
            tool, rest = "uv pip", rest[1:]
        installer = re.fullmatch(r"pip[\d.]*", tool) or tool in (
            "uv pip",
            "conda",
            "mamba",
            "micromamba",
        )
        if installer and rest[:1] == ["install"]:
            for needle, message, hint in _install_findings(rest[1:], tool):
                found.append(notebook_finding("G2T512", *at(needle), message, hint))
    return found


def _cuda_visible(line: int, col: int) -> Finding:
    return notebook_finding(
        "G2T511",
        line,
        col,
        "`CUDA_VISIBLE_DEVICES` selects NVIDIA GPUs and does nothing on a TPU",
        "drop it; on a TPU VM `TPU_VISIBLE_CHIPS` selects chips",
    )


def escape_findings(escape: Escape, lines: list[str]) -> list[Finding]:
    """G2T510-512 for one piece of IPython syntax (`!cmd`, `%pip ...`, `%env ...`)."""
    written = lines[escape.line - 1 : escape.end_line]
    first = written[0] if written else ""
    if escape.kind in ("shell", "shell_capture"):
        return shell_findings(escape.command, escape.line, escape.col, written)
    if escape.kind != "line_magic":
        return []
    args = escape.command[len(escape.magic) :].strip()
    if escape.magic in _SHELL_MAGICS:
        return shell_findings(args, escape.line, escape.col, written)
    if escape.magic in _INSTALLER_MAGICS:
        return shell_findings(f"{escape.magic} {args}", escape.line, escape.col, written)
    if escape.magic in ("env", "set_env"):
        name = re.split(r"[=\s]", args, maxsplit=1)[0]
        if name == "CUDA_VISIBLE_DEVICES" and args != name:
            pos = first.find(name)
            return [_cuda_visible(escape.line, pos + 1 if pos >= 0 else escape.col)]
    return []


def shell_body_findings(body: str, first_line: int) -> list[Finding]:
    """G2T510-512 for the body of a `%%bash`-style cell; `first_line` is its first line."""
    found: list[Finding] = []
    lines = python_lines(body)
    i = 0
    while i < len(lines):
        start = i
        text = lines[i].rstrip("\r\n")
        while text.endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text[:-1] + " " + lines[i].rstrip("\r\n")
        found += shell_findings(text, first_line + start, 1, lines[start : i + 1])
        i += 1
    return found
