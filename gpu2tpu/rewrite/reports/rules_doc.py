"""`gpu2tpu rules`: the rule list, and one rule explained from its docstring, like `ruff rule`."""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from typing import TextIO

from ..rules.base import BaseRule, all_rules


def rule_record(rule: type[BaseRule]) -> dict[str, str]:
    return {
        "code": rule.code,
        "name": rule.name,
        "safety": str(rule.safety),
        "severity": str(rule.severity),
        "message": rule.message,
        "hint": rule.hint,
        "min_torch": rule.min_torch,
        "compat_torch": rule.compat_torch or "",  # "": the fix has no form below 2.6
        "explanation": inspect.cleandoc(rule.__doc__ or ""),
    }


def explain_rules(code: str | None, fmt: str, out: TextIO, err: TextIO) -> int:
    rules = all_rules()
    if code is None:
        if fmt == "json":
            out.write(json.dumps([rule_record(r) for r in rules], indent=2) + "\n")
            return 0
        width = max(len(r.name) for r in rules)
        for r in rules:
            out.write(f"{r.code}  {r.name:<{width}}  {str(r.safety):<11}  {_first_line(r)}\n")
        return 0
    matches = [r for r in rules if r.code == code.upper() or r.name == code]
    if not matches:
        err.write(f"gpu2tpu: error: unknown rule {code!r}; `gpu2tpu rules` lists them\n")
        return 2
    rec = rule_record(matches[0])
    if fmt == "json":
        out.write(json.dumps(rec, indent=2) + "\n")
        return 0
    out.write(f"{rec['code']} {rec['name']} ({rec['safety']}, {rec['severity']})\n\n")
    out.write(rec["explanation"] + "\n")
    return 0


def _first_line(rule: type[BaseRule]) -> str:
    doc = inspect.cleandoc(rule.__doc__ or "")
    return doc.splitlines()[0] if doc else rule.message


def rules_markdown() -> str:
    """docs/rules.md, generated from the rules (`python -m gpu2tpu.rewrite.reports.rules_doc`)."""
    lines = [
        "# Rules",
        "",
        "Generated from the rule classes:"
        " `python -m gpu2tpu.rewrite.reports.rules_doc > docs/rules.md`.",
        "",
    ]
    lines += ["| code | name | safety | what |", "|---|---|---|---|"]
    for r in all_rules():
        lines.append(
            f"| [{r.code}](#{r.code.lower()}) | {r.name} | {r.safety} | {_first_line(r)} |"
        )
    for r in all_rules():
        rec = rule_record(r)
        lines += [
            "",
            f"## {r.code}",
            "",
            f"**{r.name}** — {r.safety}, {r.severity}",
            "",
            "```text",
            rec["explanation"],
            "```",
        ]
    return "\n".join(lines) + "\n"


class Rules:
    """`gpu2tpu rules [CODE]`: the rules, or one explained."""

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("code", nargs="?", help="a rule code")
        p.add_argument("--format", choices=["text", "json"], default="text")

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        return explain_rules(args.code, args.format, sys.stdout, sys.stderr)


if __name__ == "__main__":
    sys.stdout.write(rules_markdown())
