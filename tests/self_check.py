"""The rewrite agrees with itself (issue 27, §3): what `rewrite` writes passes its own `check`.

One run reaches the fixed point: a second run changes nothing and edits nothing, and the
findings it leaves are those the first run left (by rule), so nothing the first run wrote is
reported (a guard it inserted) and nothing it left could have been fixed. Used by the property
tests over the rule fixtures, torch's sources and the corpus.
"""

from __future__ import annotations

from collections import Counter

from gpu2tpu.rewrite.core.model import Options, Result
from gpu2tpu.rewrite.core.source import SourceError, rewrite_source


def disagreements(text: str, options: Options | None = None) -> list[str]:
    """How a rewrite of `text` and a rewrite of its result disagree; [] when they agree."""
    options = options or Options()
    try:
        first = rewrite_source(text, options)
    except SourceError:
        return []
    second = rewrite_source(first.new_text, options)
    return compare(first, second)


def compare(first: Result, second: Result) -> list[str]:
    """The disagreements of a first run's result and of the run over its text."""
    found = []
    if second.new_text != first.new_text:
        found.append("a second run changes the text again")
    found += [f"line {e.line}: the second run edits again ({e.code})" for e in second.edits]
    before = Counter(f.code for f in first.findings)
    after = Counter(f.code for f in second.findings)
    for finding in second.findings:
        if after[finding.code] > before[finding.code]:
            found.append(
                f"line {finding.line}: the second run reports {finding.code} anew: "
                f"{finding.message}"
            )
    for code, count in (before - after).items():
        found.append(f"the second run lost {count} finding(s) of {code}")
    return found
