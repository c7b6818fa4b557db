"""A string literal's value read without Python's compiler means what Python makes of it.

`analysis.literals.simple_string_value` slices the characters between the quotes where no
escape or carriage return can change them, and evaluates the rest (issue 36: compiling every
literal was about 5% of `check` on diffusers). Hypothesis writes literals of every prefix and
quote, with and without escapes, and libcst's own `evaluated_value` (`ast.literal_eval`) is
the reference.
"""

from __future__ import annotations

import libcst as cst
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu2tpu.rewrite.analysis.literals import simple_string_value, string_value

PREFIXES = ("", "r", "u", "R", "U", "b", "B", "br", "Rb", "rb")
QUOTES = ('"', "'", '"""', "'''")


@st.composite
def literals(draw: st.DrawFn) -> str:
    prefix = draw(st.sampled_from(PREFIXES))
    quote = draw(st.sampled_from(QUOTES))
    alphabet = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
    if "b" in prefix.lower():
        alphabet = st.characters(max_codepoint=127, blacklist_characters="\x00")
    body = draw(st.text(alphabet=st.one_of(alphabet, st.sampled_from("\\\r\n\t'\"")), max_size=30))
    literal = f"{prefix}{quote}{body}{quote}"
    try:
        compile(literal, "<literal>", "eval")
    except (SyntaxError, ValueError):
        return f"{prefix}{quote}plain{quote}"
    return literal


@pytest.mark.filterwarnings("ignore:invalid escape sequence")  # the literals may hold any
@given(literals())
def test_a_literal_means_what_python_makes_of_it(literal: str) -> None:
    node = cst.parse_expression(literal)
    assert isinstance(node, cst.SimpleString)
    expected = node.evaluated_value
    assert simple_string_value(literal) == (expected if isinstance(expected, str) else None)
    assert string_value(node) == simple_string_value(literal)


def test_examples_of_each_path() -> None:
    assert simple_string_value('"cuda:0"') == "cuda:0"
    assert simple_string_value("r'C:\\\\cuda'") == "C:\\\\cuda"  # raw: evaluated, kept as written
    assert simple_string_value('"a\\tb"') == "a\tb"  # an escape: evaluated
    assert simple_string_value('"""x\r\ny"""') == "x\ny"  # Python reads CR LF as LF
    assert simple_string_value("b'cuda'") is None
    assert simple_string_value("'''it's'''") == "it's"
