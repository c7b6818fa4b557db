"""The hooks in .pre-commit-hooks.yaml, run by the real pre-commit as a user's repository runs
them (`pre-commit try-repo`).

pre-commit installs the hook's package into an environment of its own from the package
index, exactly as for a user: the light install (libcst, rich, packaging, pathspec) plus IPython for
notebooks. That takes minutes on a shared 2-core machine, so both hooks run in one
`try-repo` call (one environment), and the test is marked slow.

The hook repository is a copy of this checkout's package files committed into a fresh git
repository, so what is tested is the working tree as it is (pre-commit would otherwise leave
out files that are not committed yet).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow

CUDA_SCRIPT = "import torch\n\nmodel = torch.nn.Linear(4, 2).cuda()\n"
CLEAN = "import torch\n\nmodel = torch.nn.Linear(4, 2)\n"
NOTEBOOK = """{
 "cells": [
  {"cell_type": "code", "execution_count": null, "id": "a1", "metadata": {}, "outputs": [],
   "source": ["!nvidia-smi\\n", "import torch\\n", "x = torch.ones(2).cuda()\\n"]}
 ],
 "metadata": {"language_info": {"name": "python"}},
 "nbformat": 4,
 "nbformat_minor": 5
}
"""


def git(*args: str, cwd: Path) -> None:
    subprocess.run(
        ["git", "-c", "user.name=test", "-c", "user.email=test@example.com", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
    )


def hook_repository(tmp_path: Path) -> Path:
    """This checkout's package, committed into a repository of its own."""
    repo = tmp_path / "hooks"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "gpu2tpu", repo / "gpu2tpu", ignore=ignore)
    for name in ("pyproject.toml", "README.md", ".pre-commit-hooks.yaml"):
        shutil.copy2(ROOT / name, repo / name)
    git("init", "-q", ".", cwd=repo)
    git("add", ".", cwd=repo)
    git("commit", "-q", "-m", "hooks", cwd=repo)
    return repo


def user_repository(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "third_party").mkdir()
    (project / "src" / "train.py").write_text(CUDA_SCRIPT)
    (project / "src" / "clean.py").write_text(CLEAN)
    (project / "src" / "colab.ipynb").write_text(NOTEBOOK)
    (project / "third_party" / "vendored.py").write_text(CUDA_SCRIPT)
    (project / "pyproject.toml").write_text('[tool.gpu2tpu]\nexclude = ["third_party"]\n')
    git("init", "-q", ".", cwd=project)
    git("add", ".", cwd=project)
    git("commit", "-q", "-m", "a CUDA-first project", cwd=project)
    return project


def test_hooks_check_and_rewrite_through_pre_commit(tmp_path: Path) -> None:
    hooks = hook_repository(tmp_path)
    project = user_repository(tmp_path)
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home")}
    env.pop("PYTHONPATH", None)  # the hook must run from its own environment
    proc = subprocess.run(
        [sys.executable, "-m", "pre_commit", "try-repo", str(hooks), "--all-files"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out  # both hooks fail: findings, then modified files
    check_part, _, rewrite_part = out.partition("gpu2tpu rewrite")
    # gpu2tpu-check: reports, writes nothing; IPython reads the notebook's `!nvidia-smi`
    assert "src/train.py:3:9: G2T101 [*]" in check_part, out
    assert "src/colab.ipynb:cell 0:line 1:col 2: G2T510" in check_part, out
    assert "third_party" not in check_part, "[tool.gpu2tpu] exclude applies to hook files"
    # gpu2tpu-rewrite: fixes the files, and pre-commit sees that it did
    assert "files were modified by this hook" in rewrite_part, out
    new = (project / "src" / "train.py").read_text()
    assert "model = torch.nn.Linear(4, 2).to(device)" in new
    assert "torch.ones(2).to(device)" in (project / "src" / "colab.ipynb").read_text()
    assert (project / "src" / "clean.py").read_text() == CLEAN
    assert (project / "third_party" / "vendored.py").read_text() == CUDA_SCRIPT
    assert "ModuleNotFoundError" not in out and "Traceback" not in out
