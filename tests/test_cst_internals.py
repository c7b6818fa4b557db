"""libcst's private parts the codemod uses, in one module (gpu2tpu/rewrite/core/cst_internals.py).

A libcst release that drops or changes them must fail here, naming what changed, and not as
wrong lines and columns in every finding.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from gpu2tpu.rewrite.core import cst_internals

ROOT = Path(__file__).resolve().parent.parent

SOURCE = '''\
import torch

@decorator(x)
class Model(torch.nn.Module):
    """Doc."""

    def forward(self, x, *, y=None):
        if x is None:  # a comment
            return torch.zeros(2,
                               device="cuda")
        with torch.no_grad():
            z = [t.cuda() for t in (x, y)]; w = {"a": 1}
        return x.cuda(non_blocking=True) + 1
'''


def test_the_private_names_are_there() -> None:
    assert cst_internals.missing() == [], (
        "libcst changed what gpu2tpu/rewrite/core/cst_internals.py uses; adapt that module "
        "(or pin libcst below the release that changed it)"
    )


def test_libcst_is_bounded_below_the_next_major() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    [libcst] = [d for d in project["dependencies"] if d.startswith("libcst")]
    assert "<2" in libcst.replace(" ", "")


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "libcst-state"])
def test_one_statement_laid_out_alone_matches_the_whole_module(fast: bool) -> None:
    """Each top-level statement laid out alone gives every node the range libcst's own
    `PositionProvider` gives it in the whole module, shifted by the lines before the
    statement."""
    module = cst.parse_module(SOURCE)
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    whole = wrapper.resolve(PositionProvider)
    compared = 0
    for stmt in module.body:
        alone = cst_internals.layout(stmt, module.default_indent, module.default_newline, fast=fast)
        shift = whole[stmt].start.line - alone[stmt].start.line
        assert shift == len(SOURCE[: SOURCE.index(module.code_for_node(stmt))].splitlines())
        for node, expected in whole.items():
            got = alone.get(node)
            if got is None:
                continue
            assert (got.start.line + shift, got.start.column) == (
                expected.start.line,
                expected.start.column,
            )
            assert (got.end.line + shift, got.end.column) == (
                expected.end.line,
                expected.end.column,
            )
            compared += 1
    assert compared > 100


def _own_sources() -> list[Path]:
    """The codemod's own modules: real code of every statement kind, nobody's fixture."""
    return sorted((ROOT / "gpu2tpu" / "rewrite").rglob("*.py"))


@pytest.mark.parametrize("path", _own_sources()[::7], ids=lambda p: p.name)
def test_the_unvalidated_parse_gives_libcsts_module(path: Path) -> None:
    """The parse that skips node validation builds the very module libcst's own parse does
    (the same nodes, fields and code)."""
    text = path.read_text(encoding="utf-8")
    fast = cst_internals.parse_module(text)
    assert fast.deep_equals(cst.parse_module(text))
    assert fast.code == text


def test_nodes_made_outside_the_parse_are_still_validated() -> None:
    """Only the parser's own nodes skip the check: a node a fix builds wrongly still raises,
    after a parse and after a parse that failed."""
    cst_internals.parse_module(SOURCE)
    with pytest.raises(cst.CSTValidationError):
        cst.Name("not a name")
    with pytest.raises(cst.ParserSyntaxError):
        cst_internals.parse_module("def (:\n")
    with pytest.raises(cst.CSTValidationError):
        cst.Name("")
