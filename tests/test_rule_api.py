"""The rule API's contract: what a rule may define, and what it may change.

The engine walks the tree itself (`source._Dispatch`), not with libcst's visitor, and
`Rule`'s docstring says where it differs. A hook the walk would never honour must fail when
the class is defined, not leave a rule that silently never fires.
"""

from __future__ import annotations

import ast
from pathlib import Path

import libcst as cst
import pytest

from gpu2tpu.rewrite.core.model import Safety
from gpu2tpu.rewrite.rules.base import REGISTRY, Rule, all_rules

RULES = Path(__file__).resolve().parent.parent / "gpu2tpu" / "rewrite" / "rules"


def _define(**hooks: object) -> type[Rule]:
    # no `code`: the class is checked but never registered
    return type("Probe", (Rule,), {"__module__": __name__, **hooks})


def test_an_attribute_hook_is_refused() -> None:
    def visit_Call_func(self: Rule, node: cst.Call) -> None:
        pass

    with pytest.raises(TypeError, match=r"Probe\.visit_Call_func: libcst's attribute hooks"):
        _define(visit_Call_func=visit_Call_func)


def test_a_hook_for_no_libcst_node_is_refused() -> None:
    def visit_Cal(self: Rule, node: cst.Call) -> None:
        pass

    with pytest.raises(TypeError, match="`Cal` is not a libcst node"):
        _define(visit_Cal=visit_Cal)


def test_a_visit_that_returns_false_to_skip_children_is_refused() -> None:
    def visit_FunctionDef(self, node):  # unannotated: the bytecode says it returns False
        if node.name.value.startswith("_"):
            return False
        return None

    with pytest.raises(TypeError, match="returns a value: the rules' walk always visits"):
        _define(visit_FunctionDef=visit_FunctionDef)


def test_a_visit_annotated_to_return_bool_is_refused() -> None:
    def visit_Call(self: Rule, node: cst.Call) -> bool:
        return True

    with pytest.raises(TypeError, match="returns a value"):
        _define(visit_Call=visit_Call, code="G2T998")
    assert "G2T998" not in REGISTRY  # refused before it registered


def test_plain_hooks_are_accepted_and_registered_by_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gpu2tpu.rewrite.rules.base.REGISTRY", dict(REGISTRY))
    from gpu2tpu.rewrite.rules import base

    def visit_Call(self: Rule, node: cst.Call) -> None:
        if not node.args:
            return

    def leave_Module(self: Rule, original_node: cst.Module) -> None:
        pass

    probe = type(
        "Probe",
        (Rule,),
        {
            "__module__": __name__,
            "code": "G2T999",
            "name": "probe",
            "safety": Safety.REPORT,
            "message": "probe",
            "visit_Call": visit_Call,
            "leave_Module": leave_Module,
        },
    )
    assert base.REGISTRY["G2T999"] is probe
    assert "G2T999" not in REGISTRY  # the real registry is untouched


def test_every_registered_rule_passes_the_check() -> None:
    # the rules loaded without a TypeError; a hook the walk would skip would have raised
    assert len([r for r in all_rules() if issubclass(r, Rule)]) > 50


def test_rules_change_the_engine_state_only_through_the_context() -> None:
    """`pending`, `fixes` and `claimed` belong to the engine: rules and the analysis layer
    read and add to them through `RuleContext`'s methods (`report`, `add_fix`,
    `move_last_fix`, `claim`, `claim_node`, `reports`, `last_report`)."""
    engine_state = {"pending", "fixes", "claimed"}
    found: list[str] = []
    for path in [*RULES.glob("*.py"), *(RULES.parent / "analysis").glob("*.py")]:
        if path.name == "base.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in engine_state
                and isinstance(node.value, ast.Name | ast.Attribute)
                and (getattr(node.value, "id", None) or getattr(node.value, "attr", None)) == "ctx"
            ):
                found.append(f"{path.name}:{node.lineno} ctx.{node.attr}")
    assert found == []


def test_a_rule_is_not_a_libcst_visitor_and_the_walk_finds_its_hooks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`Rule` is the project's own class: libcst's visitor semantics (return values,
    attribute hooks) are not inherited to mislead, and the walk finds hooks by name."""
    from gpu2tpu.rewrite.analysis.flow_recorder import FlowRecorder
    from gpu2tpu.rewrite.core.model import Options
    from gpu2tpu.rewrite.core.source import rewrite_source
    from gpu2tpu.rewrite.rules.base import hook_methods

    assert not issubclass(Rule, cst.CSTVisitor | cst.BatchableCSTVisitor | cst.CSTTransformer)
    assert not any(klass.__module__.startswith("libcst") for klass in Rule.__mro__)

    seen: list[str] = []

    class Base(Rule):
        def visit_Call(self, node: cst.Call) -> None:
            seen.append("call")

    class Probe(Base):
        tokens = (b"print",)

        def leave_Module(self, original_node: cst.Module) -> None:
            seen.append("module")

    assert dict(hook_methods(Probe)) == {"leave_Module": "Module", "visit_Call": "Call"}
    assert ("visit_Module", "Module") in hook_methods(FlowRecorder)

    monkeypatch.setattr("gpu2tpu.rewrite.core.source.rules_for", lambda options: [Probe])
    rewrite_source("print(1)\nprint(2)\n", Options())
    assert seen == ["call", "call", "module"]


def test_rules_see_only_the_contexts_public_facade() -> None:
    """The engine's bookkeeping (reports, fixes, claims, statement spans, placeholders,
    positions) lives in `ModuleState` (rewrite/core/module_state.py), which `source.py` makes and
    the context keeps private: rules and the analysis layer use only `RuleContext`'s public
    attributes and methods, and never its private ones."""
    from gpu2tpu.rewrite.core.model import Options
    from gpu2tpu.rewrite.rules.base import RuleContext

    ctx = RuleContext("x = 1\n", Options())
    facade = {n for n in [*dir(RuleContext), *vars(ctx)] if not n.startswith("_")}
    engine_state = {"pending", "fixes", "claimed", "unparsed", "fast_position", "fast_span",
                    "rewritten_statements", "index_statements", "resolve_pending",
                    "adopted_device", "adopted_kind", "required_imports", "needs_torch_import",
                    "device_line_blocked", "device_defined", "device_lazy"}  # fmt: skip
    assert not facade & engine_state
    found: list[str] = []
    for path in [*RULES.glob("*.py"), *(RULES.parent / "analysis").glob("*.py")]:
        if path.name == "base.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name | ast.Attribute)
                and (getattr(node.value, "id", None) or getattr(node.value, "attr", None)) == "ctx"
                and node.attr not in facade
            ):
                found.append(f"{path.name}:{node.lineno} ctx.{node.attr}")
    assert found == []
