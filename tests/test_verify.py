"""The safety net: a rewrite that would break the code is withheld, in every mode.

A test-only rule (tests/broken_rule.py) has a fix that breaks the module on purpose; the file
must keep its other fixes, the broken one must be withheld and reported, and no mode may write,
print or return the broken text.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import broken_rule
import pytest

from gpu2tpu.rewrite.core import net, verify
from gpu2tpu.rewrite.core.model import Options
from gpu2tpu.rewrite.core.source import rewrite_source
from gpu2tpu.rewrite.files.engine import Config, Mode, Status, run
from gpu2tpu.rewrite.notebooks.notebook import rewrite_notebook
from gpu2tpu.rewrite.rules.base import REGISTRY

TESTS = Path(__file__).parent
KINDS = ("syntax", "undefined", "unbound", "raises")
REASONS = {
    "syntax": "the result would not compile: invalid syntax",
    "undefined": "the result would use `name_nobody_defines`, which nothing defines",
    "unbound": "the result would use `late_binding` before the statement that binds it",
    "raises": "the fix failed (ValueError: a fix that fails)",
}


def module(kind: str) -> str:
    return (
        "import torch\n"
        "x = torch.zeros(1).cuda()\n"
        f'y = breakme("{kind}")\n'
        "torch.cuda.synchronize()\n"
        "late_binding = 1\n"
    )


@pytest.fixture
def broken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(REGISTRY, broken_rule.CODE, broken_rule.BrokenRule)


def _compiles(text: str) -> bool:
    try:
        compile(text, "<test>", "exec", dont_inherit=True)
    except SyntaxError:
        return False
    return True


# -- the checks themselves ------------------------------------------------------------------------


def test_only_new_problems_count() -> None:
    before = verify.facts("import torch\nx = y\n")  # `y` is undefined already: not new
    assert verify.new_problems(before, "import torch\nx = y\nz = y\n") == []
    (problem,) = verify.new_problems(before, "import torch\nx = y\nz = w\n")
    assert (problem.kind, problem.name, problem.line) == ("undefined", "w", 3)


def test_device_line_above_its_import_is_caught() -> None:
    before = verify.facts("import torch\nx = torch.zeros(1)\n")
    new = "device = torch.device('cpu')\nimport torch\nx = torch.zeros(1).to(device)\n"
    (problem,) = verify.new_problems(before, new)
    assert (problem.kind, problem.name, problem.line) == ("unbound", "torch", 1)


def test_a_module_level_call_reads_what_the_function_reads() -> None:
    old = "def main():\n    return 1\nresult = main()\n"
    new = "def main():\n    return device\nresult = main()\ndevice = 2\n"
    (problem,) = verify.new_problems(verify.facts(old), new)
    assert (problem.kind, problem.name) == ("unbound", "device")
    # ... but a function that runs later may use what is bound after it
    later = "def main():\n    return device\ndevice = 2\nresult = main()\n"
    assert verify.new_problems(verify.facts(old), later) == []


def test_scopes_are_respected() -> None:
    old = "def f(torch):\n    return torch\n"
    # a parameter, a local import, a comprehension variable and a class attribute are bound
    new = (
        "def f(torch):\n    return torch.zeros(1)\n"
        "def g():\n    import numpy as np\n    return [np.ones(i) for i in range(3)]\n"
        "class A:\n    size = 2\n    twice = size * 2\n"
    )
    assert verify.new_problems(verify.facts(old), new) == []
    (problem,) = verify.new_problems(verify.facts(old), "def f(torch):\n    return np\n")
    assert problem.name == "np"


def test_known_names_and_top_level_await() -> None:
    # a notebook cell's device variable comes from an earlier cell; a cell may `await`
    before = verify.facts("await run(x)\n")
    assert verify.new_problems(before, "await run(x.to(device))\n", known=["device"]) == []
    (problem,) = verify.new_problems(before, "await run(x.to(device))\n")
    assert problem.name == "device"


def test_compile_errors_beyond_the_parser() -> None:
    (problem,) = verify.new_problems(verify.facts("x = 1\n"), "x = 1\nreturn x\n")
    assert problem.kind == "compile" and "'return' outside function" in problem.detail


# -- the net, in the pure core ------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_broken_fix_is_withheld_and_the_rest_is_kept(broken: None, kind: str) -> None:
    result = rewrite_source(module(kind))
    assert _compiles(result.new_text)
    assert f'y = breakme("{kind}")' in result.new_text, "the broken fix was applied"
    assert ".to(device)" in result.new_text and "torch.accelerator.synchronize()" in result.new_text
    assert broken_rule.CODE not in {e.code for e in result.edits} and len(result.edits) >= 2
    (withheld,) = result.withheld
    assert withheld.code == broken_rule.CODE and withheld.line == 3
    assert withheld.message.endswith(f"(fix withheld: {REASONS[kind]})")
    assert not withheld.fixed and not withheld.fixable
    assert withheld in result.findings


def test_withheld_per_statement_and_rule(broken: None) -> None:
    text = (
        "import torch\n\n"
        "def f():\n    return torch.zeros(1).cuda()\n\n"
        'def g():\n    y = breakme("syntax")\n    return torch.zeros(2).cuda()\n\n'
        'def h():\n    z = breakme("syntax")\n    return z\n'
    )
    result = rewrite_source(text)
    assert _compiles(result.new_text)
    # the other rule's fix in the same statement stays; both broken fixes are withheld (a
    # module that only defines is a library: its device is a function)
    assert result.new_text.count(".to(accelerator_device())") == 2
    assert [w.line for w in result.withheld] == [7, 11]


def test_a_device_line_above_its_import_is_withheld(monkeypatch: pytest.MonkeyPatch) -> None:
    # the rewrite used to put the device line above `import torch`; a placement that does so
    # again must cost only the fixes that need the device variable
    from gpu2tpu.rewrite.core import source

    monkeypatch.setattr(source, "device_line_after", lambda tree: 0)
    text = '"""A script."""\nimport torch\nx = torch.zeros(1).cuda()\ntorch.cuda.synchronize()\n'
    result = rewrite_source(text)
    assert _compiles(result.new_text)
    assert "torch.accelerator.synchronize()" in result.new_text  # needs no device: kept
    assert "x = torch.zeros(1).cuda()" in result.new_text and "device =" not in result.new_text
    (withheld,) = result.withheld
    assert withheld.line == 3 and withheld.message.endswith(
        "(fix withheld: the result would use `torch` before the statement that binds it)"
    )


def test_nothing_verifies_gives_the_original_back(
    broken: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = module("syntax")
    full = rewrite_source(text)
    monkeypatch.setattr(net, "MAX_TRIES", 0)
    result = rewrite_source(text)
    assert result.new_text == text and result.edits == ()
    assert {w.code for w in result.withheld} == {broken_rule.CODE} | {e.code for e in full.edits}


def test_verification_runs_only_on_changed_texts(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = verify.facts
    monkeypatch.setattr(net, "facts", lambda text, *rest: calls.append(text) or real(text, *rest))
    rewrite_source("import torch\nprint(torch.cuda.is_available)\n", Options(fix=False))
    rewrite_source("import torch  # nothing to change\n")
    assert calls == []
    rewrite_source("import torch\nx = torch.zeros(1).cuda()\n")
    assert len(calls) == 1


# -- every mode of the command and the notebook --------------------------------------------------


def _cli(*args: str, cwd: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    """The real command in a subprocess, with the broken rule registered."""
    code = "import sys, broken_rule; broken_rule.install(); from gpu2tpu.cli import main; sys.exit(main())"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, input=stdin, capture_output=True, env=env,
        timeout=300,
    )  # fmt: skip


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_files_mode(tmp_path: Path, jobs: str) -> None:
    for i in range(16 if jobs == "2" else 1):  # enough files for two workers
        (tmp_path / f"m{i}.py").write_text(module("syntax"))
    proc = _cli("rewrite", "-j", jobs, ".", cwd=tmp_path)
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 1, err
    for path in tmp_path.glob("m*.py"):
        new = path.read_text()
        assert _compiles(new) and ".to(device)" in new and 'breakme("syntax")' in new
    assert (
        f"m0.py:3:5: {broken_rule.CODE} `breakme()` has a deliberately broken fix (fix withheld"
        in out
    )
    assert "Fixes withheld (the result would not have been valid code)" in out


def test_diff_and_check_modes(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text(module("undefined"))
    diff = _cli("rewrite", "--diff", "m.py", cwd=tmp_path)
    assert diff.returncode == 1
    added = [ln for ln in diff.stdout.decode().splitlines() if ln.startswith("+")]
    assert any(".to(device)" in ln for ln in added)
    assert not any("name_nobody_defines" in ln for ln in added)
    assert "fix withheld" in diff.stderr.decode()
    dry = _cli("rewrite", "--check", "m.py", cwd=tmp_path)
    assert dry.returncode == 1 and "(fix withheld: the result would use" in dry.stdout.decode()
    assert path.read_text() == module("undefined")


def test_stdin_mode(tmp_path: Path) -> None:
    proc = _cli("rewrite", "-", cwd=tmp_path, stdin=module("unbound").encode())
    out = proc.stdout.decode()
    assert proc.returncode == 1
    assert _compiles(out) and ".to(device)" in out and 'breakme("unbound")' in out
    assert "fix withheld" in proc.stderr.decode()


def test_stdin_never_prints_a_broken_text_when_nothing_else_changes(tmp_path: Path) -> None:
    text = 'y = breakme("syntax")\n'
    proc = _cli("rewrite", "-", cwd=tmp_path, stdin=text.encode())
    assert proc.stdout.decode() == text
    assert proc.returncode == 1 and "fix withheld" in proc.stderr.decode()


def _notebook(*cells: str) -> str:
    return json.dumps(
        {
            "cells": [
                {"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {},
                 "outputs": [], "source": src}
                for i, src in enumerate(cells)
            ],
            "metadata": {"kernelspec": {"language": "python", "name": "python3"}},
            "nbformat": 4,
            "nbformat_minor": 5,
        },
        indent=1,
    )  # fmt: skip


def test_notebook_cells(broken: None) -> None:
    text = _notebook(
        "import torch\nmodel = torch.nn.Linear(2, 2)",
        'x = torch.zeros(1).cuda()\ny = breakme("undefined")\nz = model(x)',
        "%time w = breakme('syntax')\nv = torch.ones(1).cuda()",
    )
    result = rewrite_notebook(text, Options())
    cells = ["".join(c["source"]) for c in json.loads(result.new_text)["cells"]]
    assert ".to(device)" in cells[1] and 'breakme("undefined")' in cells[1]
    assert ".to(device)" in cells[2] and "breakme('syntax')" in cells[2]
    assert [(w.cell_index, w.finding.line) for w in result.withheld] == [(1, 2), (2, 1)]
    # `model` comes from the first cell: not a new undefined name, the fix of line 1 stays
    assert "z = model(x)" in cells[1]


def test_notebook_file_mode(tmp_path: Path) -> None:
    path = tmp_path / "nb.ipynb"
    path.write_text(_notebook("import torch", 'x = torch.zeros(1).cuda()\ny = breakme("raises")'))
    proc = _cli("rewrite", "nb.ipynb", cwd=tmp_path)
    assert proc.returncode == 1
    assert "nb.ipynb:cell 1:line 2:col 5: G2T999" in proc.stdout.decode()
    cell = "".join(json.loads(path.read_text())["cells"][1]["source"])
    assert ".to(device)" in cell and 'breakme("raises")' in cell


def test_the_magic_gets_the_net_too(broken: None) -> None:
    # `%%tpu` and `%tpu_auto` run what `rewrite_cell` makes of a cell, with the device variable
    # of the notebook's session and the imports earlier cells ran
    from gpu2tpu.rewrite.notebooks.notebook import rewrite_cell

    source = 'x = torch.zeros(1).cuda()\ny = breakme("syntax")\n%time z = breakme("undefined")\n'
    options = Options(device_name="device", define_device=False)
    cell = rewrite_cell(source, options, prior_imports=("import torch",))
    assert not cell.error
    assert cell.new_source.startswith("x = torch.zeros(1).to(device)\n")
    assert 'y = breakme("syntax")' in cell.new_source
    assert '%time z = breakme("undefined")' in cell.new_source
    assert [(w.code, w.line) for w in cell.withheld] == [
        (broken_rule.CODE, 2),
        (broken_rule.CODE, 3),
    ]


def test_engine_outcome_lists_withheld(broken: None, tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text(module("syntax"))
    report = run([str(path)], Config(jobs=1), Mode.WRITE)
    (outcome,) = report.files
    assert outcome.status is Status.REWRITTEN
    assert [w.code for w in outcome.withheld] == [broken_rule.CODE]
    assert io.StringIO(path.read_text()).read().count(".to(device)") == 1
