"""G2T306-G2T308: seeds and random-number state of the CUDA generators.

`torch.manual_seed(s)` seeds the CPU and every accelerator (CUDA, MPS, XPU and PrivateUse1
backends such as TorchTPU, through `torch.random`). So a `torch.cuda.manual_seed_all(s)`
that follows `torch.manual_seed(s)` adds nothing and can go; elsewhere, turning it into
`torch.manual_seed(s)` also reseeds the CPU generator, which changes what the CPU draws next.
"""

from __future__ import annotations

import libcst as cst

from ..analysis.blocks import statement_index
from ..analysis.edits import (
    report_removal,
    sole_statement,
)
from ..analysis.names import is_reference_end, matches, qualified
from ..core.model import Safety
from .base import Rule

CUDA_SEED = ("torch.cuda.manual_seed", "torch.cuda.manual_seed_all")
CUDA_SEED_RANDOM = ("torch.cuda.seed", "torch.cuda.seed_all")
CUDA_SEED_ALL = tuple(
    q for n in (*CUDA_SEED, *CUDA_SEED_RANDOM) for q in (n, n.replace("cuda.", "cuda.random."))
)

# Calls that may sit between `torch.manual_seed(s)` and the CUDA seed without drawing numbers.
SEEDING_CALLS = frozenset(
    {"seed", "manual_seed", "manual_seed_all", "set_seed", "use_deterministic_algorithms"}
)


def _is_seeding_statement(rule: Rule, stmt: cst.BaseStatement) -> bool:
    """A line that seeds or configures determinism and draws no random numbers."""
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    for small in stmt.body:
        if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
            func = small.value.func
            last = (
                func.attr.value if isinstance(func, cst.Attribute) else getattr(func, "value", "")
            )
            if last in SEEDING_CALLS:
                continue
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            target = small.targets[0].target
            if isinstance(target, cst.Attribute) and (qualified(rule.ctx, target) or "").startswith(
                "torch.backends."
            ):
                continue
            if isinstance(target, cst.Subscript) and matches(rule.ctx, target.value, "os.environ"):
                continue
        return False
    return True


def _seed_call(rule: Rule, stmt: cst.BaseStatement) -> cst.Call | None:
    """The `torch.manual_seed(...)` call that is the whole of `stmt`, if it is one."""
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        small = stmt.body[0]
        if (
            isinstance(small, cst.Expr)
            and isinstance(small.value, cst.Call)
            and matches(rule.ctx, small.value, "torch.manual_seed", "torch.random.manual_seed")
        ):
            return small.value
    return None


def already_seeded(rule: Rule, call: cst.Call) -> cst.SimpleStatementLine | None:
    """The line of a CUDA seed call that `torch.manual_seed(<same seed>)` earlier in its block
    already covers, with only seeding statements between; None otherwise."""
    if len(call.args) != 1 or call.args[0].keyword is not None or call.args[0].star:
        return None
    line = sole_statement(rule, call)
    block = rule.parent(line) if line is not None else None
    if line is None or not isinstance(block, cst.IndentedBlock | cst.Module):
        return None
    index = statement_index(rule.ctx, block, line)
    assert index is not None  # `line` is a statement of its parent block
    seed = rule.code_for(call.args[0].value)
    for stmt in (block.body[i] for i in range(index - 1, -1, -1)):
        earlier = _seed_call(rule, stmt)
        if (
            earlier is not None
            and len(earlier.args) == 1
            and rule.code_for(earlier.args[0].value) == seed
        ):
            return line
        if not _is_seeding_statement(rule, stmt):
            return None
    return None


class CudaSeedAlreadySeeded(Rule):
    """`torch.cuda.manual_seed(_all)(s)` right after `torch.manual_seed(s)`.

    Why: `torch.cuda` is CUDA-only, and the call adds nothing: `torch.manual_seed(s)` already
    seeds every device, CUDA and TPU included. The line is dropped when the same seed went to
    `torch.manual_seed` earlier in the same block with only seeding statements between
    (`random.seed`, `np.random.seed`, cuDNN flags), so nothing can draw numbers in between.

    Example:
        torch.manual_seed(seed)
        torch.cuda.manual_seed_all(seed)  ->  (dropped)
    """

    code = "G2T306"
    compat_torch = "0.4"
    name = "cuda-seed-already-seeded"
    safety = Safety.SAFE
    message = "`{func}` is CUDA-only and repeats `torch.manual_seed`, which seeds every device"
    hint = "drop it: `torch.manual_seed(s)` seeds the CPU and every accelerator"

    def visit_Call(self, node: cst.Call) -> None:
        func = matches(self.ctx, node, *CUDA_SEED, "torch.cuda.random.manual_seed")
        if func is None:
            return
        line = already_seeded(self, node)
        if line is not None:
            message = self.message.format(func=func.replace(".random.", "."))
            report_removal(self, node, line, message)


class CudaSeed(Rule):
    """`torch.cuda.manual_seed(_all)(s)` and `torch.cuda.seed(_all)()` seed only CUDA.

    Why: on a TPU they do nothing for the TPU's generator (and `torch.cuda` may not even be
    initialised), so runs stop being reproducible. `torch.manual_seed(s)` and `torch.seed()`
    seed the CPU and every accelerator. The fix is unsafe because it also reseeds the CPU
    generator, so what the CPU draws after this point changes; G2T306 drops the call safely
    where `torch.manual_seed(s)` has just run.

    Example:
        torch.cuda.manual_seed(seed)  ->  torch.manual_seed(seed)
        torch.cuda.seed_all()         ->  torch.seed()
    """

    code = "G2T307"
    name = "cuda-seed"
    safety = Safety.UNSAFE
    message = "`{func}` seeds only CUDA's generators"
    hint = "use `torch.manual_seed(s)` (also reseeds the CPU generator)"

    def visit_Call(self, node: cst.Call) -> None:
        func = matches(self.ctx, node, *CUDA_SEED_ALL)
        if func is None or already_seeded(self, node) is not None:
            return
        func = func.replace(".random.", ".")
        target = "manual_seed" if "manual_seed" in func else "seed"
        ctx = self.ctx

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.Call)
            return updated.with_changes(func=ctx.torch_attr(target))

        hint = self.hint if target == "manual_seed" else "use `torch.seed()` (also reseeds the CPU)"
        self.report(node, self.message.format(func=func), fix=fix, hint=hint)


RNG_STATE = {"get_rng_state": "get_rng_state", "set_rng_state": "set_rng_state"}
RNG_REPORT = {
    "get_rng_state_all": "loop over `torch.accelerator.device_count()` devices by hand",
    "set_rng_state_all": "loop over `torch.accelerator.device_count()` devices by hand",
    "initial_seed": "use `torch.initial_seed()` (the CPU's) or the device module's, by hand",
    "default_generators": "use `torch.Generator(device=device)` or the device module, by hand",
}


class CudaRngState(Rule):
    """`torch.cuda.get_rng_state()` / `set_rng_state()` and the other CUDA generator handles.

    Why: they only know CUDA's generators, and raise on a machine without CUDA. No public,
    device-agnostic call is the same on CUDA and safe on a TPU: the device module's own
    `get_rng_state` (`torch.get_device_module(device).get_rng_state()`, TorchTPU's
    `torch.tpu.get_rng_state`) is marked internal by TorchTPU from torch 2.13 on and raises
    when called from user code, and `torch.accelerator` has no generator state in the torch
    this project targets. So each use is reported: keep the CUDA call on CUDA, and to save
    and restore the accelerator's generator around a block use `torch.random.fork_rng(
    device_type=device.type)`, which asks the device module from inside torch. The `_all`
    variants, `initial_seed` and `default_generators` are reported too: TPU processes own one
    chip each. `torch.Generator(device="cuda")` is a device string, rewritten by G2T102.

    Example:
        state = torch.cuda.get_rng_state()
        # -> on CUDA only; elsewhere `with torch.random.fork_rng(device_type=device.type):`
    """

    code = "G2T308"
    name = "cuda-rng-state"
    safety = Safety.REPORT
    message = "`torch.cuda.{func}` only knows CUDA's generators"
    hint = (
        'keep it for CUDA (`if device.type == "cuda":`); to save and restore the '
        "accelerator's generator around a block use `torch.random.fork_rng(device_type="
        "device.type)` (TorchTPU's `get_rng_state` is internal from torch 2.13)"
    )

    def visit_Call(self, node: cst.Call) -> None:
        func = self._func(node)
        if func in RNG_STATE:
            self.report(node, self.message.format(func=func))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._report_other(node)

    def visit_Name(self, node: cst.Name) -> None:
        self._report_other(node)

    def _report_other(self, node: cst.Name | cst.Attribute) -> None:
        func = self._func(node)
        if func in RNG_REPORT and is_reference_end(self.ctx, node):
            self.report(node, self.message.format(func=func), hint=RNG_REPORT[func])

    def _func(self, node: cst.CSTNode) -> str:
        name = qualified(self.ctx, node) or ""
        for prefix in ("torch.cuda.random.", "torch.cuda."):
            if name.startswith(prefix) and "." not in name[len(prefix) :]:
                return name[len(prefix) :]
        return ""
