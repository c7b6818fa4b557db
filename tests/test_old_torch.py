"""A project that pins an old torch still gets a migration (issue 32 §1).

Below torch 2.6 there is no `torch.accelerator`: the fixes that need only the device are
written in their compat form (rewrite/core/torch_compat.py), which asks `hasattr(torch,
"accelerator")` and otherwise does what the code did. These tests hold that form to what a
torch without the module has, run it on such a torch (torch's own `torch.accelerator` taken
away in a fresh process, which is what a torch older than 2.6 looks like to it), and raise a
project's pin (G2T520).
"""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from self_check import check_disagreements
from test_rule_fixtures import CASES, options_for

from conftest import run_cli
from gpu2tpu.rewrite.core.source import rewrite_source
from gpu2tpu.rewrite.core.torch_target import Pin, raised_requirement, rewrite_for_target

OLD = "1.9"
# What the compat forms may write that the code did not have: the device line's classic
# idiom and the torch.cuda counterparts of torch.accelerator's calls. All are in torch 0.4
# (`torch.device` arrived there), the floor `Rule.compat_torch` declares; the dtypes and
# factories are G2T314's (legacy typed tensors), as old.
OLD_TORCH_NAMES = frozenset(
    {
        "device", "cuda.is_available", "cuda.device_count", "cuda.current_device",
        "cuda.set_device", "cuda.synchronize", "tensor", "empty", "float16", "float32",
        "float64", "int64", "uint8",
    }
)  # fmt: skip


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _asks_for_accelerator(test: ast.expr) -> bool:
    first = test.values[0] if isinstance(test, ast.BoolOp) else test
    return (
        isinstance(first, ast.Call)
        and isinstance(first.func, ast.Name)
        and first.func.id == "hasattr"
        and isinstance(first.args[1], ast.Constant)
        and first.args[1].value == "accelerator"
    )


def torch_names(text: str, torch_aliases: set[str]) -> set[str]:
    """The `torch.x.y` names `text` uses where a torch without `torch.accelerator` runs
    them: not in the branch a `hasattr(torch, "accelerator")` test takes."""
    tree = ast.parse(text)
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.IfExp | ast.If) and _asks_for_accelerator(node.test):
            body = node.body if isinstance(node.body, list) else [node.body]
            guarded.update(id(n) for part in [node.test, *body] for n in ast.walk(part))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in guarded:
            name = _dotted(node)
            head, _, rest = (name or "").partition(".")
            if head in torch_aliases and rest:
                found.add(rest)
    return {n for n in found if not any(m.startswith(n + ".") for m in found)}


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name.removesuffix(".in.py"))
def test_a_rewrite_for_an_old_torch_writes_only_what_it_has(case: Path) -> None:
    """Every fixture rewritten for torch 1.9 (fixes held back as the engine holds them):
    what it writes runs on that torch, and the result passes its own check there."""
    text = case.read_text()
    options = dataclasses.replace(options_for(text), target_torch=OLD)
    result = rewrite_for_target(rewrite_source, text, options)
    aliases = {"torch", "T", "th"}
    new = torch_names(result.new_text, aliases) - torch_names(text, aliases)
    assert new <= OLD_TORCH_NAMES, f"names torch {OLD} lacks: {sorted(new - OLD_TORCH_NAMES)}"
    assert check_disagreements(text, options) == []


SCRIPT = textwrap.dedent(
    """\
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = torch.nn.Linear(4, 2).cuda()
    x = torch.ones(3, 4).cuda()
    torch.cuda.synchronize()
    print(model(x).device.type, torch.cuda.device_count())
    """
)


def _run(path: Path, without_accelerator: bool) -> subprocess.CompletedProcess[str]:
    """Run `path` on this machine's torch (no GPU), with `torch.accelerator` taken away when
    asked: the torch a project pinned below 2.6 has."""
    prelude = "import torch\ndel torch.accelerator\n" if without_accelerator else ""
    code = f"{prelude}import runpy\nrunpy.run_path({str(path)!r}, run_name='__main__')\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without a GPU")
def test_a_script_pinned_to_an_old_torch_runs_on_the_cpu_after_a_default_rewrite(
    tmp_path: Path,
) -> None:
    """`torch==1.9.1` in requirements.txt, `gpu2tpu rewrite` with no option: the script that
    crashed without CUDA runs, on a torch without `torch.accelerator` and on this one."""
    (tmp_path / "requirements.txt").write_text("torch==1.9.1\n")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    before = _run(script, without_accelerator=True)
    assert before.returncode != 0  # `.cuda()` without CUDA
    proc = run_cli("rewrite", ".", cwd=tmp_path)
    assert "1 file rewritten" in proc.stdout, proc.stdout + proc.stderr
    assert "To raise the floor: `--target-torch 2.6`" not in proc.stdout  # nothing held back
    for without in (True, False):
        after = _run(script, without_accelerator=without)
        assert after.returncode == 0, after.stderr
        assert after.stdout.split() == ["cpu", "0"]
    assert (tmp_path / "requirements.txt").read_text() == "torch==1.9.1\n"  # not unsafe


# -- G2T520: the pin raised -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "raised"),
    [
        ("torch==1.9.1", "torch>=2.9"),
        ("torch>=1.8.0,<3", "torch>=2.9,<3"),
        ("torch~=2.0", "torch>=2.9,<3"),
        ('torch[opt]>=1.8; python_version < "3.12"', 'torch[opt]>=2.9; python_version < "3.12"'),
        ("torch>=1.8,<2", None),  # the upper bound stops it: a person's call
        ("torch~=1.9", None),
    ],
)
def test_a_requirement_is_raised_keeping_its_upper_bounds(written: str, raised: str | None) -> None:
    assert raised_requirement(Pin("1.9", "x", None, written), "2.9") == raised


PIN_FILES = {
    "requirements.txt": ("numpy\ntorch==1.9.1  # the paper's\n", "torch>=2.9  # the paper's"),
    "environment.yml": ("dependencies:\n  - python=3.9\n  - pytorch=1.9.1\n", "  - pytorch>=2.9"),
    "pyproject.toml": (
        '[project]\nname = "x"\ndependencies = ["numpy", "torch>=1.9"]\n',
        'dependencies = ["numpy", "torch>=2.9"]',
    ),
    "setup.cfg": ("[options]\ninstall_requires =\n    torch>=1.9\n", "    torch>=2.9"),
    "setup.py": (
        "from setuptools import setup\nsetup(install_requires=['torch>=1.9'])\n",
        "setup(install_requires=['torch>=2.9'])",
    ),
}


@pytest.mark.parametrize("name", PIN_FILES)
def test_the_pin_is_raised_only_with_unsafe_fixes(tmp_path: Path, name: str) -> None:
    text, line = PIN_FILES[name]
    (tmp_path / name).write_text(text)
    (tmp_path / "train.py").write_text("import torch\n\ntorch.cuda.empty_cache()\n")
    safe = run_cli("rewrite", ".", cwd=tmp_path)
    assert (tmp_path / name).read_text() == text, safe.stdout
    assert "G2T520" in safe.stdout and "holds back 1 fix (they need torch 2.9)" in safe.stdout
    unsafe = run_cli("rewrite", "--unsafe-fixes", ".", cwd=tmp_path)
    assert line in (tmp_path / name).read_text().splitlines(), unsafe.stdout
    assert not list(tmp_path.glob(f".{name}.*")), "no temporary is left"
    again = run_cli("rewrite", ".", cwd=tmp_path)  # the next run reads the raised pin
    assert "torch.accelerator.memory.empty_cache()" in (tmp_path / "train.py").read_text()
    assert "G2T520" not in again.stdout


def test_a_pin_its_upper_bound_stops_is_reported_not_changed(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("torch>=1.9,<2\n")
    (tmp_path / "train.py").write_text("import torch\n\ntorch.cuda.empty_cache()\n")
    proc = run_cli("rewrite", "--unsafe-fixes", ".", cwd=tmp_path)
    assert (tmp_path / "requirements.txt").read_text() == "torch>=1.9,<2\n"
    assert "requirements.txt:1:1: G2T520" in proc.stdout
