"""Fixes written for a torch without `torch.accelerator` (a target-torch older than 2.6).

Most projects pin a torch older than the one `torch.accelerator` arrived in (2.6), and the
migration must still run there. Where a fix writes a call of `torch.accelerator` that has a
CUDA counterpart in every torch, the call becomes

    torch.accelerator.synchronize() if hasattr(torch, "accelerator") else torch.cuda.synchronize()

which is the fix on a torch that has the module (so a TPU is used once the project moves up)
and, on the pinned torch, exactly what the code did before, on CUDA as elsewhere. The device
line has its own such form (`rules/base.py`, `DEVICE_EXPR_COMPAT`), and code under a test of
`hasattr(torch, "accelerator")` is left as it is. Only the calls a fix wrote are changed: the
user's own `torch.accelerator` calls are the same objects in the fix's input (libcst nodes are
immutable and shared), which is how they are told apart. docs/torch-versions.md lists the
calls and the torch each needs.
"""

from __future__ import annotations

import libcst as cst

# A `torch.accelerator` function -> its counterpart in `torch.cuda` (same arguments, same
# answer on CUDA); None: `torch.device("cuda")`, which `current_accelerator()` is on CUDA.
CUDA_COUNTERPART: dict[str, str | None] = {
    "is_available": "is_available",
    "device_count": "device_count",
    "current_device_index": "current_device",
    "set_device_index": "set_device",
    "synchronize": "synchronize",
    "current_accelerator": None,
}


def _all_ids(node: cst.CSTNode) -> set[int]:
    seen: set[int] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        seen.add(id(current))
        stack.extend(current.children)
    return seen


def asks_for_accelerator(test: cst.BaseExpression, torch: str) -> bool:
    """Whether `test` holds `hasattr(<torch>, "accelerator")`."""
    stack: list[cst.CSTNode] = [test]
    while stack:
        node = stack.pop()
        if (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Name)
            and node.func.value == "hasattr"
            and len(node.args) == 2
            and isinstance(node.args[0].value, cst.Name)
            and node.args[0].value.value == torch
            and isinstance(node.args[1].value, cst.SimpleString)
            and node.args[1].value.evaluated_value == "accelerator"
        ):
            return True
        stack.extend(node.children)
    return False


class _Compat(cst.CSTTransformer):
    def __init__(self, kept: set[int], torch: str, quote: str) -> None:
        super().__init__()
        self.kept = kept
        self.torch = torch
        self.quote = quote  # inside an f-string, the other quote than the f-string's

    def visit_IfExp(self, node: cst.IfExp) -> bool:
        return not asks_for_accelerator(node.test, self.torch)

    def visit_If(self, node: cst.If) -> bool:
        return not asks_for_accelerator(node.test, self.torch)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if id(original_node) in self.kept:
            return updated_node
        name = self._accelerator_function(updated_node.func)
        if name is None or name not in CUDA_COUNTERPART:
            return updated_node
        counterpart = CUDA_COUNTERPART[name]
        cuda = cst.Attribute(value=cst.Name(self.torch), attr=cst.Name("cuda"))
        fallback: cst.BaseExpression
        if counterpart is None:
            if updated_node.args:
                return updated_node  # `check_available=True`: the device line's, compat already
            fallback = cst.parse_expression(f"{self.torch}.device({self.quote}cuda{self.quote})")
        else:
            fallback = updated_node.with_changes(
                func=cst.Attribute(value=cuda, attr=cst.Name(counterpart))
            )
        test = cst.parse_expression(f"hasattr({self.torch}, {self.quote}accelerator{self.quote})")
        choice = cst.IfExp(
            test=test, body=updated_node.with_changes(lpar=[], rpar=[]), orelse=fallback
        )
        return choice.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])

    def _accelerator_function(self, func: cst.BaseExpression) -> str | None:
        """`f` for `<torch>.accelerator.f`."""
        if not isinstance(func, cst.Attribute):
            return None
        owner = func.value
        if (
            isinstance(owner, cst.Attribute)
            and owner.attr.value == "accelerator"
            and isinstance(owner.value, cst.Name)
            and owner.value.value == self.torch
        ):
            return func.attr.value
        return None


Fixed = cst.CSTNode | cst.FlattenSentinel[cst.CSTNode] | cst.RemovalSentinel


def compat_calls(new: Fixed, before: cst.CSTNode, torch: str, quote: str = '"') -> Fixed:
    """`new` (what a fix made of `before`: a node, or the statements it became) with each
    `torch.accelerator` call it wrote that has a CUDA counterpart asked for only where torch
    has the module (`torch` is the name the module uses for torch)."""
    if isinstance(new, cst.RemovalSentinel):
        return new
    if isinstance(new, cst.FlattenSentinel):
        return cst.FlattenSentinel([_compat_node(n, before, torch, quote) for n in new.nodes])
    return _compat_node(new, before, torch, quote)


def _compat_node(new: cst.CSTNode, before: cst.CSTNode, torch: str, quote: str) -> cst.CSTNode:
    if "accelerator" not in cst.Module(body=[]).code_for_node(new):
        return new
    result = new.visit(_Compat(_all_ids(before), torch, quote))
    assert isinstance(result, cst.CSTNode)  # a call becomes an expression, never a removal
    return result
