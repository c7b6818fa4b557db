"""A rule whose fix is broken on purpose, to test the safety net (gpu2tpu/rewrite/core/net.py).

`breakme("syntax")` is rewritten to code that does not parse (`return` as a value),
`breakme("undefined")` to a name nothing defines, `breakme("unbound")` to `late_binding`, which
the module binds only further down, and the fix of `breakme("raises")` raises. Every other call
stays. The rule is not registered on import: `install()` adds it (tests
use `monkeypatch.setitem(REGISTRY, ...)` instead, so that it leaves with the test).
"""

from __future__ import annotations

import libcst as cst

from gpu2tpu.rewrite.core.model import Safety
from gpu2tpu.rewrite.rules.base import REGISTRY, Rule

CODE = "G2T999"

REPLACEMENTS = {
    "syntax": "return",  # an identifier to libcst's validation, a keyword to Python
    "undefined": "name_nobody_defines",
    "unbound": "late_binding",
}


class BrokenRule(Rule):
    """`breakme(kind)` -> something that breaks the module in the way `kind` says."""

    name = "broken-on-purpose"
    safety = Safety.SAFE
    message = "`breakme()` has a deliberately broken fix"
    hint = "a test rule"
    tokens = (b"breakme",)

    def visit_Call(self, node: cst.Call) -> None:
        if not (isinstance(node.func, cst.Name) and node.func.value == "breakme"):
            return
        arg = node.args[0].value if node.args else None
        kind = arg.evaluated_value if isinstance(arg, cst.SimpleString) else "syntax"
        if kind == "raises":
            self.report(node, fix=_raise)
            return
        replacement = REPLACEMENTS[kind]
        self.report(node, fix=lambda updated: cst.Name(replacement))


def _raise(updated: cst.CSTNode) -> cst.CSTNode:
    raise ValueError("a fix that fails")


BrokenRule.code = CODE  # set after the class body: a subclass with `code` registers itself


def install() -> None:
    REGISTRY[CODE] = BrokenRule
