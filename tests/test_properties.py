"""Property tests: over generated programs the rewrite always parses, is stable, and leaves
text without CUDA tokens byte-identical."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import self_check
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_rule_fixtures import options_for

from gpu2tpu.rewrite.core.model import Options
from gpu2tpu.rewrite.core.source import rewrite_source

CUDA_STATEMENTS = [
    "{v} = torch.zeros({n}).cuda()",
    "{v} = torch.randn({n}, device='cuda')",
    "{v} = {v}.to('cuda:0', non_blocking=True)",
    "{v} = T.ones({n}).cuda(non_blocking=True)",
    "device = 'cuda' if torch.cuda.is_available() else 'cpu'",
    "{v} = torch.device('cuda' if torch.cuda.is_available() else 'cpu')",
    "torch.cuda.synchronize()",
    "{v} = torch.cuda.device_count() + {n}",
    "if torch.cuda.is_available(): {v} = {n}",
    "{v} = torch.load('w.pt', map_location='cuda')",
    "{v} = x.is_cuda",
    "torch.cuda.set_device({n})",
    "{v} = cuda.is_available()",
    "{v} = torch.cuda.amp.autocast()",
    "{v} = torch.cuda.memory_allocated()",
    "torch.cuda.manual_seed({n})",
    "{v} = [t.cuda() for t in ({v}, {v})]",
]
PLAIN_STATEMENTS = [
    "{v} = {n}",
    "{v} = torch.zeros({n})",
    "{v} = nn.Linear({n}, {n})",
    "print({v!r})",
    "{v} = [{n}, {n} + 1]",
    "pass  # a comment about {v}",
    "{v} = {{'k': {n}}}",
    "{v} = ({n} if {n} > 2 else 0)",
    "assert {n} >= 0, 'message'",
]
WRAPPERS = ["{body}", "def f_{n}(a, b={n}):\n{ibody}\n    return a", "for i in range({n}):\n{ibody}",
            "if {n} > 1:\n{ibody}\nelse:\n    pass", "with open('x') as fh:\n{ibody}",
            "class C{n}:\n    def m(self):\n{iibody}"]  # fmt: skip
HEADERS = ["import torch\nimport torch.nn as nn\nfrom torch import cuda\nimport torch as T\n",
           '"""Docstring."""\nfrom __future__ import annotations\nimport torch\nimport torch.nn as nn\nfrom torch import cuda\nimport torch as T\n']  # fmt: skip

names = st.sampled_from(["a", "x", "model", "batch", "device", "out", "accel_device"])
numbers = st.integers(min_value=0, max_value=9)


@st.composite
def statement(draw: st.DrawFn, pool: list[str]) -> str:
    return draw(st.sampled_from(pool)).format(v=draw(names), n=draw(numbers))


@st.composite
def block(draw: st.DrawFn, pool: list[str]) -> str:
    stmts = draw(st.lists(statement(pool), min_size=1, max_size=4))
    wrapper = draw(st.sampled_from(WRAPPERS))
    body = "\n".join(stmts)
    ibody = "\n".join("    " + s for s in stmts)
    iibody = "\n".join("        " + s for s in stmts)
    return wrapper.format(body=body, ibody=ibody, iibody=iibody, n=draw(numbers))


@st.composite
def program(draw: st.DrawFn, with_cuda: bool = True) -> str:
    pool = PLAIN_STATEMENTS + (CUDA_STATEMENTS if with_cuda else [])
    blocks = draw(st.lists(block(pool), min_size=1, max_size=6))
    sep = draw(st.sampled_from(["\n", "\n\n", "\n\n\n"]))
    header = draw(st.sampled_from(HEADERS))
    if not with_cuda:
        header = header.replace("from torch import cuda\n", "")
    text = header + "\n" + sep.join(blocks) + "\n"
    if draw(st.booleans()):
        text = text.replace("\n", "\r\n")
    return text


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(program())
def test_rewrite_parses_and_is_idempotent(text: str) -> None:
    ast.parse(text)  # the generator makes valid programs
    first = rewrite_source(text)
    ast.parse(first.new_text)
    second = rewrite_source(first.new_text)
    assert second.new_text == first.new_text
    assert not second.edits
    assert "gpu2tpu" not in first.new_text


@SETTINGS
@given(program(with_cuda=False))
def test_text_without_cuda_tokens_is_identical(text: str) -> None:
    assert "cuda" not in text
    ast.parse(text)
    result = rewrite_source(text)
    assert result.new_text is text or result.new_text == text
    assert not result.edits


@SETTINGS
@given(program(), st.sampled_from([(), ("G2T1",), ("G2T101", "G2T102")]))
def test_selection_never_breaks_parsing(text: str, ignore: tuple[str, ...]) -> None:
    result = rewrite_source(text, Options(ignore=ignore, unsafe_fixes=True))
    ast.parse(result.new_text)
    assert (
        rewrite_source(result.new_text, Options(ignore=ignore, unsafe_fixes=True)).new_text
        == result.new_text
    )


FIXTURES = sorted((Path(__file__).parent / "fixtures" / "rules").glob("*.in.py"))


@pytest.mark.parametrize("unsafe", [False, True], ids=["safe", "unsafe"])
@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name.removesuffix(".in.py"))
def test_the_rewrite_passes_its_own_check(path: Path, unsafe: bool) -> None:
    """Issue 27, §3: on every fixture, with its options and with unsafe fixes too, one run
    reaches the fixed point and its output draws no finding the first run did not leave."""
    text = path.read_text()
    options = options_for(text)
    if unsafe:
        options = dataclasses.replace(options, unsafe_fixes=True)
    assert self_check.disagreements(text, options) == []
