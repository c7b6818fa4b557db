"""An independent reading of CUDA device flows, for the real-code tests (issue 27, §1).

Written apart from the codemod (analysis/values.py), and much narrower on purpose: a name
bound to a CUDA device string (`"cuda"`, `"cuda:1"`, `f"cuda:{rank}"`) in a function or at
module level, then passed in the same scope as a device (`device=`, `map_location=`,
`.to(...)`, `torch.device(...)`). A file that holds one is never "All clear": `check` must
report the string or its use.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

_CUDA = re.compile(r"^cuda(:\d+)?$")
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _cuda_value(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and bool(_CUDA.match(node.value))
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        return isinstance(first, ast.Constant) and str(first.value).startswith("cuda:")
    return False


def _own_nodes(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """The nodes of a scope's own code (not of the functions and classes in it)."""
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        yield node
        stack.extend(c for c in ast.iter_child_nodes(node) if not isinstance(c, _SCOPES))


def device_flows(tree: ast.Module) -> list[tuple[int, int, str]]:
    """(line of the string, line of its use as a device, variable) for each flow."""
    bodies = [tree.body]
    bodies += [
        n.body for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    found = []
    for body in bodies:
        nodes = list(_own_nodes(body))
        names: dict[str, int] = {}
        for node in nodes:
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and _cuda_value(node.value)
            ):
                names.setdefault(node.targets[0].id, node.lineno)
        for node in nodes if names else ():
            if not isinstance(node, ast.Call):
                continue
            used = [k.value for k in node.keywords if k.arg in ("device", "map_location")]
            func = node.func
            if isinstance(func, ast.Attribute) and node.args:
                is_torch_device = isinstance(func.value, ast.Name) and func.value.id == "torch"
                if func.attr == "to" or (func.attr == "device" and is_torch_device):
                    used.append(node.args[0])
            found += [
                (names[u.id], node.lineno, u.id)
                for u in used
                if isinstance(u, ast.Name) and u.id in names
            ]
    return found
