"""The safety net: `rewrite_source` returns only text that passed `verify`, or the original.

When the rewritten text has a new problem (it does not compile, it names something nothing
defines, it uses a name before the module binds it), the fixes that caused it are found and
the rules run again without them: first those whose lines the problem is on, then, if that
does not tell, halves of the rest. A withheld unit is one rule's fixes in one top-level
statement (a rule's fixes within a statement may depend on each other; the rules themselves
drop what depended on a withheld fix, as they do when a fix is switched off). Each withheld fix
becomes a finding saying why; the rest of the file is still migrated. After `MAX_TRIES`
reruns, or if no rerun verifies, the original text comes back unchanged.

Every caller gets this: files, `--diff`, standard input, notebook cells and the `%%tpu` magic
all go through `rewrite_source`.
"""

from __future__ import annotations

import ast
import bisect
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from ..analysis.lines import python_lines
from .model import Finding, Result
from .verify import Facts, Problem, facts, new_problems, original_lines

MAX_TRIES = 12  # reruns of the rules after a failed check, at most
REFINE_UNITS = 4  # withheld together, each is tried again on its own when there are this few

Span = tuple[int, int]  # first and last line of a top-level statement
Unit = tuple[str, Span]  # one rule's fixes in one top-level statement
Key = tuple[str, int, int]  # one fix: rule code, line, column


@dataclass(frozen=True)
class Attempt:
    """One run of the rules: the text it produced (held statements put back) and its result.

    `device_keys` are the fixes that use the module's device variable. `problem` is what went
    wrong while the text was made (a fix raised; a fix moved a statement kept from the
    parser), and `culprit` the fix it points at, when known.
    """

    text: str
    result: Result
    device_keys: frozenset[Key] = frozenset()
    problem: Problem | None = None
    culprit: Key | None = None


Rerun = Callable[[tuple[tuple[str, int, int], ...]], Attempt]


def verified(
    original: str,
    first: Attempt,
    rerun: Rerun,
    spans: list[Span],
    known: Iterable[str] = (),
    tree: ast.Module | None = None,
) -> Result:
    """`first.result` if its text verifies; else the best verified rerun, or the original
    (`tree`: the original's tree from Python's parser, when the caller has it)."""
    return _Net(original, rerun, spans, frozenset(known), tree).run(first)


class _Net:
    def __init__(
        self,
        original: str,
        rerun: Rerun,
        spans: list[Span],
        known: frozenset[str],
        tree: ast.Module | None = None,
    ) -> None:
        self.original = original
        self.tree = tree
        self.rerun = rerun
        self.spans = spans
        self.starts = [a for a, _ in spans]
        self.known = known
        self.before: Facts | None = None
        self.withheld: dict[Unit, Problem] = {}
        self.keys: dict[Key, tuple[Finding, Problem]] = {}
        self.tries = 0

    def problems(self, attempt: Attempt) -> list[Problem]:
        if attempt.problem is not None:
            return [attempt.problem]
        if attempt.text == self.original:
            return []
        if self.before is None:
            self.before = facts(self.original, self.tree)
        return new_problems(self.before, attempt.text, self.known)

    def run(self, first: Attempt) -> Result:
        problems = self.problems(first)
        if not problems:
            return first.result
        current, good = first, None
        # 1. Withhold the fixes the problems point at, until the text verifies.
        while problems and self.tries < MAX_TRIES:
            located = self.locate(current, problems)
            suspects = {u: p for u, p in located.items() if u not in self.withheld}
            if not suspects:
                break
            self.withhold(current, suspects)
            current = self.attempt()
            problems = self.problems(current)
        if not problems:
            good = current
        elif self.tries < MAX_TRIES:
            # 2. The problems point at no fix (a fix elsewhere removed a binding): halves.
            good = self.bisect(current, problems)
        if good is None:
            return self.give_up(first, problems)
        # 3. Give back each withheld unit that is innocent on its own: a few tries, when few
        # were withheld together (many at once share one cause, such as the device line).
        if 1 < len(self.withheld) <= REFINE_UNITS:
            for unit in list(self.withheld)[:REFINE_UNITS]:
                if self.tries >= MAX_TRIES:
                    break
                problem = self.withheld.pop(unit)
                trial = self.attempt()
                if self.problems(trial):
                    self.withheld[unit] = problem
                else:
                    good = trial
                    self.keys = {k: v for k, v in self.keys.items() if self.unit(k) != unit}
        return self.mark(good)

    def attempt(self) -> Attempt:
        self.tries += 1
        withhold = tuple((code, a, b) for code, (a, b) in self.withheld)
        return self.rerun(withhold)

    def unit(self, key: Key | Finding) -> Unit:
        code, line = (key.code, key.line) if isinstance(key, Finding) else (key[0], key[1])
        at = bisect.bisect_right(self.starts, line) - 1
        if at >= 0 and self.spans[at][0] <= line <= self.spans[at][1]:
            return code, self.spans[at]
        return code, (line, line)

    def withhold(self, attempt: Attempt, units: dict[Unit, Problem]) -> None:
        self.withheld.update(units)
        for edit in attempt.result.edits:
            unit = self.unit(edit)
            if unit in units:
                self.keys.setdefault((edit.code, edit.line, edit.col), (edit, self.withheld[unit]))

    def locate(self, attempt: Attempt, problems: list[Problem]) -> dict[Unit, Problem]:
        """The units whose fixes the problems come from, as far as the texts tell."""
        edits = attempt.result.edits
        found: dict[Unit, Problem] = {}
        new_lines = python_lines(attempt.text)
        device = attempt.result.device_name
        for problem in problems:
            if attempt.culprit is not None and problem is attempt.problem:
                found.setdefault(self.unit(attempt.culprit), problem)
                continue
            if problem.kind == "held":  # its line is in the original: the statement's fixes
                span = self.unit(("", problem.line, 0))[1]
                hits = [e for e in edits if span[0] <= e.line <= span[1]]
            else:
                lines = original_lines(self.original, attempt.text, problem.line)
                hits = [e for e in edits if lines and lines[0] <= e.line <= lines[1]]
                text = new_lines[problem.line - 1] if 0 < problem.line <= len(new_lines) else ""
                if not hits and device and re.match(rf"\s*{re.escape(device)}\s*=", text):
                    # the module's device definition, added by the rewrite: its users
                    hits = [e for e in edits if (e.code, e.line, e.col) in attempt.device_keys]
                if not hits and problem.name:
                    word = re.compile(rf"\b{re.escape(problem.name)}\b")
                    hits = [e for e in edits if word.search(e.after)]
            for edit in hits:
                found.setdefault(self.unit(edit), problem)
        return found

    def bisect(self, current: Attempt, problems: list[Problem]) -> Attempt | None:
        """Keep as many of the remaining units as verify together: try to add each half of
        the candidates, and halve a half that fails, until single units are left out."""
        candidates = sorted(
            {self.unit(e) for e in current.result.edits} - self.withheld.keys(),
            key=lambda u: (u[1], u[0]),
        )
        base = dict(self.withheld)
        accepted: list[Unit] = []
        good: Attempt | None = None

        def verifies(on: list[Unit]) -> Attempt | None:
            self.withheld = {**base, **{u: problems[0] for u in candidates if u not in on}}
            trial = self.attempt()
            return None if self.problems(trial) else trial

        middle = len(candidates) // 2
        parts = [p for p in (candidates[:middle], candidates[middle:]) if p]
        while parts and self.tries < MAX_TRIES:
            part = parts.pop(0)
            trial = verifies(accepted + part)
            if trial is not None:
                accepted += part
                good = trial
            elif len(part) > 1:
                half = len(part) // 2
                parts[0:0] = [part[:half], part[half:]]
        if good is None and not accepted and self.tries < MAX_TRIES:
            good = verifies([])
        left_out = {u for u in candidates if u not in accepted}
        self.withheld = {**base, **dict.fromkeys(left_out, problems[0])}
        self.withhold(current, dict.fromkeys(left_out, problems[0]))
        return good

    def give_up(self, first: Attempt, problems: list[Problem]) -> Result:
        """No rerun verified: the original text, every fix withheld."""
        self.keys = {}
        for edit in first.result.edits:
            self.keys[(edit.code, edit.line, edit.col)] = (edit, problems[0])
        base = replace(first.result, new_text=self.original, edits=(), device_defined=False)
        return self.mark_result(base)

    def mark(self, attempt: Attempt) -> Result:
        return self.mark_result(attempt.result)

    def mark_result(self, result: Result) -> Result:
        """Turn the withheld fixes into findings that say why they were withheld."""
        findings = list(result.findings)
        where = {(f.code, f.line, f.col): i for i, f in enumerate(findings)}
        withheld: list[Finding] = []
        for key, (edit, problem) in self.keys.items():
            at = where.get(key)
            base = findings[at] if at is not None else edit
            note = replace(
                base,
                message=f"{base.message} (fix withheld: {problem.reason})",
                fixed=False,
                fixable=False,
                after="",
            )
            if at is None:
                findings.append(note)
            else:
                findings[at] = note
            withheld.append(note)
        order = lambda f: (f.line, f.col, f.code)  # noqa: E731
        return replace(
            result,
            findings=tuple(sorted(findings, key=order)),
            withheld=tuple(sorted(withheld, key=order)),
        )
