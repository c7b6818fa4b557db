"""The fast paths change nothing: the same `Result` with them on and off.

`rewrite_source` takes two shortcuts a rule author can break without noticing: the byte
prefilter (a rule runs only on a text that holds one of its `tokens`, and visits only the
top-level statements that hold one) and the statement-level parse (libcst parses only those
statements; gpu2tpu/rewrite/core/statements.py). A rule that fires on code without its tokens, or
reads a statement it was not given, would silently lose findings on real files. This test runs
every rule fixture and a fixed sample of torch's own CUDA-heavy sources with both shortcuts on
(what users get) and both off (`prefilter=False, statement_level=False`: every rule over every
statement of a whole-module parse), and asserts the same text, edits and findings.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from test_rule_fixtures import CASES, options_for

from gpu2tpu.rewrite.core.model import Options
from gpu2tpu.rewrite.core.source import SourceError, rewrite_source

# torch's packages where CUDA is named most; the sample takes from each the files with the
# most occurrences of "cuda" (ties in path order), up to ten, and fills up to SAMPLE from the
# rest the same way: deterministic for one installed torch
TORCH_PACKAGES = ("cuda", "amp", "distributed", "utils")
SAMPLE_PER_PACKAGE = 10
SAMPLE = 40
MAX_BYTES = 60_000  # keeps the fast tier fast: the largest files add time, not new rule paths


def _torch_sample() -> list[Path]:
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return []
    root = Path(spec.origin).parent
    chosen: list[Path] = []
    rest: list[Path] = []
    for package in TORCH_PACKAGES:
        files = [p for p in (root / package).rglob("*.py") if p.stat().st_size <= MAX_BYTES]
        files.sort(key=lambda p: (-p.read_bytes().count(b"cuda"), str(p)))
        chosen += files[:SAMPLE_PER_PACKAGE]
        rest += files[SAMPLE_PER_PACKAGE:]
    rest.sort(key=lambda p: (-p.read_bytes().count(b"cuda"), str(p)))
    return chosen + rest[: SAMPLE - len(chosen)]


TORCH_FILES = _torch_sample()
MODES = (Options(fix=False), Options(unsafe_fixes=True))


def assert_same_without_fast_paths(text: str, options: Options) -> None:
    try:
        reference = rewrite_source(text, options, statement_level=False, prefilter=False)
    except SourceError as err:
        with pytest.raises(SourceError) as again:
            rewrite_source(text, options)
        assert (again.value.reason, again.value.line) == (err.reason, err.line)
        return
    fast = rewrite_source(text, options)
    assert fast.new_text == reference.new_text
    assert fast.edits == reference.edits  # lines, columns, before and after included
    assert fast.findings == reference.findings
    assert fast == reference


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name.removesuffix(".in.py"))
def test_rule_fixtures_without_fast_paths(case: Path) -> None:
    text = case.read_text()
    assert_same_without_fast_paths(text, options_for(text))


def test_the_torch_sample_is_cuda_heavy() -> None:
    # a sample that found nothing, or no CUDA, would make the test below pass vacuously
    assert len(TORCH_FILES) == SAMPLE
    assert sum(b"cuda" in p.read_bytes() for p in TORCH_FILES) >= SAMPLE * 3 // 4


@pytest.mark.parametrize("options", MODES, ids=("check", "rewrite"))
@pytest.mark.parametrize(
    "path", TORCH_FILES, ids=lambda p: "/".join(p.parts[-2:]) if isinstance(p, Path) else ""
)
def test_torch_sources_without_fast_paths(path: Path, options: Options) -> None:
    assert_same_without_fast_paths(path.read_text(encoding="utf-8"), options)


def test_the_switches_take_the_slow_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the prefilter a rule runs on a text that lacks its tokens: the reference is
    not the fast path under another name."""
    import gpu2tpu.rewrite.core.source as source

    seen: list[int] = []
    real = source._run_rules

    def spy(prepared, selected, options, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(len(selected))
        return real(prepared, selected, options, **kwargs)

    monkeypatch.setattr(source, "_run_rules", spy)
    text = "x = 1\n"
    rewrite_source(text, Options())
    rewrite_source(text, Options(), statement_level=False, prefilter=False)
    assert seen == [len(source.rules_for(Options()))], "no rule holds a token of `x = 1`"
