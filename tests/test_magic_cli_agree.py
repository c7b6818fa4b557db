"""The magics and `gpu2tpu rewrite` give the same rewrite (issue 32 §2).

Every rule fixture goes through the CLI's path (`rewrite_source`, as the engine runs a `.py`
file) and through the magics' path (`execution.rewrite_for_magic` over `rewrite_cell` with the
magics' options, as `%%tpu` and `%tpu_auto` run a cell), with the fixture's own options. The
two must edit and report the same places, and write the same text, except for what the
magics do by design:

- the magics add no line: the device variable is bound in the namespace before the cell runs
  and the imports a cell needs are run beside it, where the CLI writes a device line (or, in
  a library module, a device function) and imports;
- so the magics' fixes name the notebook's device variable (`device`, or `tpu_device` where
  a function of the cell binds `device` itself) where the CLI names the one it defined or
  adopted.

Blank lines are not compared (the CLI's inserted lines bring some). `MAGIC_DIFFERS` lists the
fixtures where the two legitimately decide differently, and why.
"""

from __future__ import annotations

import ast
import difflib
import re
from pathlib import Path

import pytest
from test_rule_fixtures import CASES, options_for

from gpu2tpu.magics.execution import magic_options, rewrite_for_magic
from gpu2tpu.rewrite.core.model import Finding, Options
from gpu2tpu.rewrite.core.source import rewrite_source
from gpu2tpu.rewrite.notebooks.notebook import CellRewrite, rewrite_cell

# Fixture -> why the magic fixes what the CLI must leave: the magic's device exists before
# the cell's first line runs, so a use the CLI's device line could not precede (a default
# evaluated above `import torch`, GPUs chosen in a function before CUDA may start) is fixed.
MAGIC_DIFFERS = {
    "G2T101_cuda_env_in_function": "the CLI's device line would start CUDA before "
    "CUDA_VISIBLE_DEVICES is set in `main`; the magic's device is bound already",
    "G2T113_default_before_torch": "a default evaluated above `import torch` runs before any "
    "device line the CLI may write; the magic's device is bound already",
}


def magic_rewrite(text: str, options: Options) -> CellRewrite:
    """The cell as `CellRunner.rewrite` rewrites it (no earlier cells), with `options`."""
    return rewrite_for_magic(
        text,
        "device",
        lambda cell, name: rewrite_cell(cell, magic_options(options, name, (), frozenset())),
    )


def cli_additions(original: str, new: str) -> tuple[str | None, set[int]]:
    """The CLI's device reference in `new` (`device`, `accelerator_device()`, ...) when it
    defined one, and the lines of the statements it added (device line or function, imports)."""
    old = ast.parse(original)
    lines = new.splitlines()
    old_lines = original.splitlines()
    top = {"\n".join(old_lines[s.lineno - 1 : s.end_lineno]).strip() for s in old.body}
    bound = {
        t.id
        for n in ast.walk(old)
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    } | {n.name for n in ast.walk(old) if isinstance(n, ast.FunctionDef)}
    ref, added = None, set()
    for stmt in ast.parse(new).body:
        text = "\n".join(lines[stmt.lineno - 1 : stmt.end_lineno])
        if text.strip() in top:
            continue
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            pass
        elif isinstance(stmt, ast.FunctionDef) and stmt.name not in bound:
            if "current_accelerator" not in text:
                continue
            ref = f"{stmt.name}()"
        elif isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
            if stmt.targets[0].id in bound or "current_accelerator" not in text:
                continue
            ref = stmt.targets[0].id
        else:
            continue
        added.update(range(stmt.lineno, stmt.end_lineno + 1))
    return ref, added


def places(findings: tuple[Finding, ...]) -> list[tuple[int, int, str]]:
    return sorted((f.line, f.col, f.code) for f in findings)


def text_differences(
    text: str, cli_text: str, cli_device: str | None, magic: CellRewrite
) -> list[str]:
    """The lines where the CLI's text and the magic's differ, beyond the CLI's additions and
    the name of the device each writes."""
    ref, added = cli_additions(text, cli_text)
    ref = ref or cli_device
    cli_lines = [
        ln for i, ln in enumerate(cli_text.splitlines(), 1) if i not in added and ln.strip()
    ]
    magic_lines = [ln for ln in magic.new_source.splitlines() if ln.strip()]
    if len(cli_lines) != len(magic_lines):
        return list(difflib.unified_diff(cli_lines, magic_lines, "cli", "magic", lineterm="", n=0))
    renamed = re.compile(rf"\b{re.escape(ref)}") if ref else None
    return [
        f"cli: {a}\nmagic: {b}"
        for a, b in zip(cli_lines, magic_lines, strict=True)
        if a != b and not (renamed and renamed.sub(magic.device_name or "", a) == b)
    ]


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name.removesuffix(".in.py"))
def test_the_magic_rewrites_every_fixture_as_the_cli_does(case: Path) -> None:
    text = case.read_text()
    options = options_for(text)
    cli = rewrite_source(text, options)
    magic = magic_rewrite(text, options)
    assert not magic.error
    name = case.name.removesuffix(".in.py")
    agree = (
        places(cli.edits) == places(magic.edits)
        and places(cli.findings) == places(magic.findings)
        and not text_differences(text, cli.new_text, cli.device_name, magic)
    )
    if name in MAGIC_DIFFERS:
        assert not agree, f"{name} is listed in MAGIC_DIFFERS but the magic and the CLI agree"
        return
    assert places(magic.edits) == places(cli.edits)
    assert places(magic.findings) == places(cli.findings)
    assert text_differences(text, cli.new_text, cli.device_name, magic) == []


def test_a_function_local_device_variable_is_no_reason_to_leave_a_fix() -> None:
    """Issue 32: a `device` local to a function of the cell. The idiom's fix names no device
    variable, so the magic fixes it as the CLI does; a fix that names the device writes
    `tpu_device` there (a name the cell does not use), which the magic binds."""
    cell = (
        "import torch\n\n"
        "def setup():\n"
        "    device = torch.device('cuda:0' if torch.cuda.is_available() else 'cpu')\n"
        "    return device\n\n"
        "def place(x, device):\n"
        "    return x.cuda(), device\n"
    )
    magic = magic_rewrite(cell, Options())
    assert [f.code for f in magic.findings] == []
    assert [f.code for f in magic.edits] == ["G2T103", "G2T101"]
    assert magic.device_name == "tpu_device"
    assert "return x.to(tpu_device), device" in magic.new_source
    assert "torch.accelerator.is_available()" in magic.new_source
    idiom_only = magic_rewrite(cell.split("\n\ndef place")[0] + "\n", Options())
    assert [f.code for f in idiom_only.edits] == ["G2T103"]
    assert idiom_only.device_name == "device"  # the idiom's fix names no device variable
