"""The rewrite agrees with itself (issue 27, §3): what `rewrite` writes passes its own `check`.

One run reaches the fixed point: a second run changes nothing and edits nothing, and the
findings it leaves are those the first run left (by rule), so nothing the first run wrote is
reported (a guard it inserted) and nothing it left could have been fixed. Used by the property
tests over the rule fixtures, torch's sources and the corpus.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from gpu2tpu.rewrite.core.model import Finding, Options, Result, Safety
from gpu2tpu.rewrite.core.source import SourceError, rewrite_source
from gpu2tpu.rewrite.core.torch_target import rewrite_for_target


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


def person_count(findings: tuple[Finding, ...], options: Options) -> Counter[str]:
    """What `check` says needs a person, by rule: every finding but those `rewrite` with
    these options would fix (reports/report.py's `would_fix`, with `--unsafe-fixes`)."""
    return Counter(
        f.code
        for f in findings
        if not (f.fixable and (f.safety == Safety.SAFE or options.unsafe_fixes))
    )


def check_disagreements(text: str, options: Options | None = None) -> list[str]:
    """Issue 32 §2: `check` and `rewrite` tell one story, as the engine runs them
    (`rewrite_for_target`, so target-torch's held-back fixes count). `check` of the text
    says a person must look at exactly what `rewrite` leaves, by rule, apart from the fixes
    the safety net withholds (only the rewrite's text shows they break it, and `check` makes
    none); and `check` of the rewritten text finds nothing beyond what the rewrite left."""
    options = options or Options()
    checking = dataclasses.replace(options, fix=False)
    try:
        rewritten = rewrite_for_target(rewrite_source, text, options)
        checked = rewrite_for_target(rewrite_source, text, checking)
    except SourceError:
        return []
    withheld = Counter(f.code for f in rewritten.withheld)
    left = Counter(f.code for f in rewritten.findings)
    person = person_count(checked.findings, options)
    found = []
    if person != left - withheld:
        found.append(f"`check` says {dict(person)} need a person, `rewrite` leaves {dict(left)}")
    after = rewrite_for_target(rewrite_source, rewritten.new_text, checking).findings
    for finding in after:
        if Counter(f.code for f in after)[finding.code] > left[finding.code]:
            found.append(
                f"line {finding.line}: `check` of the rewrite reports {finding.code}, which the "
                f"rewrite did not leave: {finding.message}"
            )
    return found
