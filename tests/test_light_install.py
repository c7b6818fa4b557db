"""`pip install gpu2tpu` is the codemod alone: it runs with torch, IPython and ipywidgets gone.

Each command runs in a subprocess whose `sitecustomize` makes those packages unimportable (a
meta-path finder that refuses them), as on a machine where only the light dependencies are
installed. A missing extra gets one line that names the install command, never a traceback.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from conftest import ROOT

HEAVY = ("torch", "IPython", "ipywidgets")

BLOCKER = '''
import sys

class _Refuse:
    """Make {names} unimportable, and record who asked."""

    BLOCKED = {names!r}

    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top in self.BLOCKED:
            raise ModuleNotFoundError(f"No module named {{top!r}}", name=top)
        return None

sys.meta_path.insert(0, _Refuse())
'''

CUDA_SCRIPT = "import torch\n\nmodel = torch.nn.Linear(4, 2).cuda()\ntorch.cuda.synchronize()\n"


def light_run(
    tmp_path: Path, *args: str, blocked: tuple[str, ...] = HEAVY, stdin: str | None = None
) -> subprocess.CompletedProcess:
    """`python -m gpu2tpu ARGS` (or `python ARGS` after `-c`/`-m`) with `blocked` refused."""
    site = tmp_path / "_site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER.format(names=tuple(blocked)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    command = list(args) if args and args[0] in ("-c", "-m") else ["-m", "gpu2tpu", *args]
    return subprocess.run(
        [sys.executable, *command],
        cwd=tmp_path,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_blocker_really_blocks(tmp_path: Path) -> None:
    proc = light_run(tmp_path, "-c", "import torch")
    assert proc.returncode == 1 and "No module named 'torch'" in proc.stderr


def test_package_metadata_keeps_heavy_packages_in_extras() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {Requirement(r).name.lower() for r in project["dependencies"]}
    assert core == {"libcst", "rich", "packaging", "pathspec"}
    notebook = {Requirement(r).name.lower() for r in project["optional-dependencies"]["notebook"]}
    assert {"torch", "ipython", "ipywidgets"} <= notebook


def test_codemod_commands_run_without_heavy_packages(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(CUDA_SCRIPT)
    version = light_run(tmp_path, "--version")
    assert version.returncode == 0 and version.stdout.startswith("gpu2tpu ")
    rules = light_run(tmp_path, "rules")
    assert rules.returncode == 0 and "G2T101  cuda-method" in rules.stdout, rules.stderr
    one = light_run(tmp_path, "rules", "G2T510")  # a notebook rule: its module loads
    assert one.returncode == 0 and "nvidia-tool-command" in one.stdout, one.stderr
    for fmt in ("text", "json", "github", "sarif", "markdown"):
        check = light_run(tmp_path, "check", "train.py", "--format", fmt)
        assert check.returncode == 1, (fmt, check.stderr)
        assert "G2T101" in check.stdout and "Traceback" not in check.stderr, fmt
    diff = light_run(tmp_path, "rewrite", "--diff", "train.py")
    assert diff.returncode == 1 and "+model = torch.nn.Linear(4, 2).to(device)" in diff.stdout
    piped = light_run(tmp_path, "rewrite", "-", stdin=CUDA_SCRIPT)
    assert piped.returncode == 0 and ".to(device)" in piped.stdout, piped.stderr
    write = light_run(tmp_path, "rewrite", "train.py")
    assert write.returncode == 0, write.stdout + write.stderr
    assert ".cuda()" not in (tmp_path / "train.py").read_text()


def light_environment(where: Path) -> Path:
    """A virtual environment holding what `pip install gpu2tpu` installs and nothing else:
    the core dependencies in pyproject.toml and theirs (taken from this environment, linked,
    metadata included), with this checkout's gpu2tpu on PYTHONPATH. Its Python, returned,
    finds neither torch's modules nor its metadata, as on a machine that never installed it.
    """
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    todo, dists = list(project["dependencies"]), {}
    while todo:
        req = Requirement(todo.pop())
        name = canonicalize_name(req.name)
        if name in dists or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        dists[name] = importlib.metadata.distribution(req.name)
        todo += dists[name].requires or []
    venv.EnvBuilder(with_pip=False).create(where)
    [site] = where.glob("lib/python*/site-packages")
    for dist in dists.values():
        for top in {f.parts[0] for f in dist.files or () if f.parts[0] != ".."}:
            if not (site / top).exists():
                (site / top).symlink_to(Path(dist.locate_file(top)))
    return where / "bin" / "python"


def test_doctor_in_a_light_install_says_what_is_missing(tmp_path: Path) -> None:
    python = light_environment(tmp_path / "light")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [str(python), "-m", "gpu2tpu", "doctor"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # The codemod alone is a complete install: nothing is wrong, and what is not there is said.
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    libcst = importlib.metadata.version("libcst")
    assert lines[1:6] == [
        "No problems found.",
        "Usable here:",
        f"  - Codemod: gpu2tpu check, rewrite and rules (libcst {libcst})",
        "Not installed:",
        "  - torch, IPython, ipywidgets, needed by %%tpu, %tpu_auto, %tpu_info, the profiler, "
        "the dry run and the demo: pip install 'gpu2tpu[notebook]'",
    ], proc.stdout
    assert "pip install 'gpu2tpu[forecast]'" in lines[6]
    from gpu2tpu import __version__

    assert lines[-1] == f"Versions: libcst {libcst}, gpu2tpu {__version__}"
    # What the report says comes from the light environment, not from this one.
    where = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print(u.find_spec('torch'))"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert where.stdout.strip() == "None"


def test_the_light_install_walks_a_repository_as_git_does(tmp_path: Path) -> None:
    """The core dependencies alone read .gitignore files (pathspec is one of them)."""
    python = light_environment(tmp_path / "light")
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "generated").mkdir()
    (repo / ".gitignore").write_text("generated/\n")
    (repo / "train.py").write_text(CUDA_SCRIPT)
    (repo / "generated" / "out.py").write_text(CUDA_SCRIPT)
    proc = subprocess.run(
        [str(python), "-m", "gpu2tpu", "check", "."],
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr
    assert "train.py:3:9: G2T101" in proc.stdout and "generated" not in proc.stdout, proc.stdout


def test_new_runs_without_heavy_packages(tmp_path: Path) -> None:
    new = light_run(tmp_path, "new", "start.ipynb")
    assert new.returncode == 0, new.stderr
    assert (tmp_path / "start.ipynb").is_file()


def test_a_notebook_without_ipython_is_one_error_line(tmp_path: Path) -> None:
    nb = ROOT / "examples" / "image_classification.ipynb"
    (tmp_path / "nb.ipynb").write_bytes(nb.read_bytes())
    proc = light_run(tmp_path, "check", "nb.ipynb")
    assert proc.returncode == 2
    errors = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert errors == [
        "error: nb.ipynb: reading a notebook needs IPython, which is not installed: "
        "pip install ipython (or pip install 'gpu2tpu[notebook]'); file left as it is"
    ]
    assert (tmp_path / "nb.ipynb").read_bytes() == nb.read_bytes()


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (
            "import gpu2tpu; gpu2tpu.profile",
            "gpu2tpu.profile needs torch, which is not installed: pip install 'gpu2tpu[notebook]'",
        ),
        (
            "import gpu2tpu; gpu2tpu.dry_run",
            "gpu2tpu.dry_run needs torch, which is not installed: pip install 'gpu2tpu[notebook]'",
        ),
    ],
)
def test_library_features_name_the_extra(tmp_path: Path, code: str, expected: str) -> None:
    proc = light_run(tmp_path, "-c", code)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == f"gpu2tpu._extras.MissingExtraError: {expected}"


def test_codemod_api_works_without_heavy_packages(tmp_path: Path) -> None:
    code = (
        "import sys, gpu2tpu\n"
        "r = gpu2tpu.rewrite_source('import torch\\nx = torch.zeros(1).cuda()\\n')\n"
        "print(r.new_text.splitlines()[-1])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'IPython')))\n"
    )
    proc = light_run(tmp_path, "-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["x = torch.zeros(1).to(device)", "[]"]


def test_demo_names_the_extra(tmp_path: Path) -> None:
    proc = light_run(tmp_path, "-m", "gpu2tpu.demo", "--workdir", str(tmp_path / "demo"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "gpu2tpu demo: error: the demo needs torch, which is not installed: "
        "pip install 'gpu2tpu[notebook]'"
    )


def test_load_ext_without_torch_is_one_usage_line(tmp_path: Path) -> None:
    code = (
        "from IPython.core.error import UsageError\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "shell = InteractiveShell.instance()\n"
        "try:\n"
        "    shell.run_line_magic('load_ext', 'gpu2tpu')\n"
        "except UsageError as err:\n"
        "    print('UsageError:', err)\n"
        "print(sorted(shell.magics_manager.magics['cell']).count('tpu'))\n"
    )
    proc = light_run(tmp_path, "-c", code, blocked=("torch", "ipywidgets"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "UsageError: %load_ext gpu2tpu needs torch, which is not installed: "
        "%pip install 'gpu2tpu[notebook]'",
        "0",
    ]
