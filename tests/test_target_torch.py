"""target-torch: fixes that need a newer torch than the project supports are reported, not
applied; the target comes from the command line, `[tool.gpu2tpu]`, or the project's pins."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest

from conftest import run_cli
from gpu2tpu.rewrite.core import source
from gpu2tpu.rewrite.core.model import CellFinding, Options
from gpu2tpu.rewrite.core.source import rewrite_source
from gpu2tpu.rewrite.core.torch_target import (
    TargetError,
    iter_pins,
    lower_bound,
    normalize,
    project_floor,
    rewrite_for_target,
    rule_min_torch,
)
from gpu2tpu.rewrite.notebooks.notebook import rewrite_notebook

SCRIPT = """import torch

model = torch.nn.Linear(4, 2).cuda()
torch.cuda.empty_cache()
"""


# -- versions and pins -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2.6", "2.6"),
        (2.7, "2.7"),
        ("2.10.1", "2.10"),
        ("v2.8", "2.8"),
        ("2", "2.0"),
        ("0.4.1", "0.4"),
    ],  # fmt: skip
)
def test_normalize(value: object, expected: str) -> None:
    assert normalize(value) == expected


@pytest.mark.parametrize("value", ["latest", "", "0", "0.0.9", "two"])
def test_normalize_rejects_what_is_not_a_torch_version(value: str) -> None:
    with pytest.raises(TargetError):
        normalize(value)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (">=2.4,<3", "2.4"),
        ("==2.5.1+cu121", "2.5"),
        ("==2.7.*", "2.7"),
        ("~=2.6.0", "2.6"),
        (">2.6", "2.6"),
        (">=2.3,>=2.5", "2.5"),  # both must hold: the higher lower bound
        ("<3", None),
        ("!=2.5.0", None),
        ("", None),
    ],
)
def test_lower_bound(spec: str, expected: str | None) -> None:
    assert lower_bound(spec) == expected


def test_pins_from_every_kind_of_project_file(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\ndependencies = ["numpy", "torch>=2.7,<3"]\n'
        '[project.optional-dependencies]\ngpu = ["torch==2.8.*"]\n'
        '[dependency-groups]\ndev = ["torch>=2.9"]\n'
        '[tool.poetry.dependencies]\ntorch = "^2.5"\n'
    )
    (tmp_path / "requirements.txt").write_text(
        "# pinned for CUDA 12.1\n"
        "--extra-index-url https://example.invalid/whl\n"
        "torch==2.6.0+cu121 --hash=sha256:0123 \\\n    --hash=sha256:4567\n"
        "torchvision>=0.1\n"
    )
    (tmp_path / "requirements").mkdir()
    (tmp_path / "requirements" / "ci.txt").write_text("torch>=2.10  # newest\n")
    (tmp_path / "environment.yml").write_text(
        "dependencies:\n  - python=3.11\n  - pytorch-cuda=12.1\n  - pytorch=2.4=py3.11_cuda*\n"
        "  - pip:\n    - torch==2.11.0\n"
    )
    (tmp_path / "setup.cfg").write_text("[options]\ninstall_requires =\n    torch>=2.3\n")
    (tmp_path / "setup.py").write_text(
        "from setuptools import setup\nREQS = ['torch>=2.2', 'numpy']\n"
        "setup(name='x', install_requires=REQS, extras_require={'all': ['torch>=2.1']})\n"
    )
    pins = {(p.version, p.source) for p in iter_pins(tmp_path)}
    assert pins == {
        ("2.7", "pyproject.toml: torch>=2.7,<3"),
        ("2.8", "pyproject.toml: torch==2.8.*"),
        ("2.9", "pyproject.toml: torch>=2.9"),
        ("2.5", "pyproject.toml: torch = '^2.5' (Poetry)"),
        ("2.6", "requirements.txt: torch==2.6.0+cu121"),
        ("2.10", "requirements/ci.txt: torch>=2.10"),
        ("2.4", "environment.yml: pytorch=2.4=py3.11_cuda*"),
        ("2.11", "environment.yml: torch==2.11.0"),
        ("2.3", "setup.cfg: torch>=2.3"),
        ("2.2", "setup.py: torch>=2.2"),
        ("2.1", "setup.py: torch>=2.1"),
    }
    floor = project_floor(tmp_path)
    assert floor is not None and (floor.version, floor.source) == ("2.1", "setup.py: torch>=2.1")


def test_requirements_without_a_lower_bound_pin_nothing(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("torch\ntorch<3\ntorchaudio>=2.6\n")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\ndependencies = []\n")
    assert project_floor(tmp_path) is None


# -- holding fixes back ------------------------------------------------------------------------


def test_rules_declare_the_torch_their_fix_needs() -> None:
    needs = rule_min_torch()
    assert needs["G2T101"] == "2.6"  # `.to(device)` with torch.accelerator
    assert needs["G2T110"] == "2.8"  # torch.accelerator.device_index
    assert needs["G2T301"] == "2.9"  # torch.accelerator.memory


def test_a_fix_that_needs_a_newer_torch_is_reported_not_applied() -> None:
    options = Options(target_torch="2.6")
    result = rewrite_for_target(rewrite_source, SCRIPT, options)
    assert "model = torch.nn.Linear(4, 2).to(device)" in result.new_text
    assert "torch.cuda.empty_cache()" in result.new_text
    assert "torch.accelerator.memory" not in result.new_text
    held = [f for f in result.findings if f.needs_torch]
    assert [(f.code, f.line, f.needs_torch, f.fixable) for f in held] == [
        ("G2T301", 4, "2.9", False)
    ]
    assert "the fix needs torch 2.9, target-torch is 2.6" in held[0].message
    # without a target, or with a new enough one, the same text gets every fix
    for target in (None, "2.9", "2.12"):
        full = rewrite_for_target(rewrite_source, SCRIPT, Options(target_torch=target))
        assert full.new_text == rewrite_source(SCRIPT).new_text
        assert "torch.accelerator.memory.empty_cache()" in full.new_text
        assert not [f for f in full.findings if f.needs_torch]


def test_check_mode_reports_the_same_places() -> None:
    options = Options(target_torch="2.6", fix=False)
    result = rewrite_for_target(rewrite_source, SCRIPT, options)
    assert result.new_text == SCRIPT
    by_code = {f.code: f for f in result.findings}
    assert by_code["G2T101"].fixable and not by_code["G2T101"].needs_torch
    assert by_code["G2T301"].needs_torch == "2.9" and not by_code["G2T301"].fixable


def test_notebook_cells_hold_back_the_same_fixes() -> None:
    cell = ["import torch\n", "with torch.cuda.device(1):\n", "    x = torch.ones(2).cuda()\n"]
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": None,
                "id": "c0",
                "metadata": {},
                "outputs": [],
                "source": cell,
            }
        ],  # fmt: skip
        "metadata": {"language_info": {"name": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    text = json.dumps(nb, indent=1) + "\n"
    result = rewrite_for_target(rewrite_notebook, text, Options(target_torch="2.7"))
    source = "".join(json.loads(result.new_text)["cells"][0]["source"])
    assert "torch.cuda.device(1)" in source and "torch.ones(2).to(device)" in source
    held = [f for f in result.findings if isinstance(f, CellFinding) and f.finding.needs_torch]
    assert [(f.cell_index, f.finding.code, f.finding.line) for f in held] == [(0, "G2T110", 2)]


# -- one parse for both runs -------------------------------------------------------------------


def _count_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts `rewrite_source` parses from now on."""
    parsed: list[str] = []
    real = source.prepare

    def spy(text, *args, **kwargs):  # type: ignore[no-untyped-def]
        parsed.append(text)
        return real(text, *args, **kwargs)

    monkeypatch.setattr(source, "prepare", spy)
    return parsed


def _notebook(*cells: str) -> str:
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": None,
                "id": f"c{i}",
                "metadata": {},
                "outputs": [],
                "source": cell,
            }
            for i, cell in enumerate(cells)
        ],  # fmt: skip
        "metadata": {"language_info": {"name": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    return json.dumps(nb, indent=1) + "\n"


def test_both_runs_share_each_texts_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed = _count_parses(monkeypatch)
    for fix in (True, False):
        parsed.clear()
        result = rewrite_for_target(rewrite_source, SCRIPT, Options(target_torch="2.6", fix=fix))
        assert [f.code for f in result.findings if f.needs_torch] == ["G2T301"]
        assert parsed == [SCRIPT]  # the held-back rules' run reused the first run's parse
    # a notebook: each cell's Python once, however many runs look at it
    text = _notebook(
        "import torch\ndevice = 'cuda' if torch.cuda.is_available() else 'cpu'\n",
        "x = torch.ones(2).cuda()\ntorch.cuda.empty_cache()\n",
    )
    parsed.clear()
    rewrite_for_target(rewrite_notebook, text, Options(target_torch="2.6"))
    assert parsed and len(parsed) == len(set(parsed))


def _torch_sample() -> list[Path]:
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None
    root = Path(spec.origin).parent
    files = sorted(p for p in root.rglob("*.py") if b"cuda" in p.read_bytes())
    return files[3::40]


FIXTURES = sorted((Path(__file__).parent / "fixtures" / "rules").glob("**/*.py"))


@pytest.mark.parametrize(
    "path", [*FIXTURES, *_torch_sample()], ids=lambda p: "/".join(p.parts[-2:])
)
def test_the_shared_parse_gives_what_two_separate_runs_give(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each run's result is the same whether it parses the text for itself or reuses the parse
    made for every rule of both runs (which keeps more statements than either needs)."""
    text = path.read_text(encoding="utf-8")
    for options in (Options(target_torch="2.6"), Options(target_torch="2.6", fix=False)):
        with_one = rewrite_for_target(rewrite_source, text, options)
        with monkeypatch.context() as m:
            m.setattr(source, "one_parse", lambda rules: contextlib.nullcontext())
            separate = rewrite_for_target(rewrite_source, text, options)
        assert dataclasses.asdict(with_one) == dataclasses.asdict(separate)


# -- the command line --------------------------------------------------------------------------


def project(tmp_path: Path, requirements: str | None = "torch>=2.6\n") -> Path:
    (tmp_path / "train.py").write_text(SCRIPT)
    if requirements is not None:
        (tmp_path / "requirements.txt").write_text(requirements)
    return tmp_path


def test_the_project_pins_set_the_target(tmp_path: Path) -> None:
    root = project(tmp_path)
    proc = run_cli("rewrite", "train.py", cwd=root)
    assert proc.returncode == 1  # a fix was held back: a finding for a person
    text = (root / "train.py").read_text()
    assert ".to(device)" in text and "torch.cuda.empty_cache()" in text
    lines = proc.stdout.splitlines()
    assert (
        "train.py: note: 1 fix not applied: the rewrite would raise the minimum torch to 2.9"
        in (lines)
    )
    assert (
        "Applying them would raise the minimum torch to 2.9 in 1 file; target-torch is 2.6 "
        "(requirements.txt: torch>=2.6)."
    ) in lines


@pytest.mark.parametrize(
    ("args", "config"),
    [(("--target-torch", "2.9"), None), ((), '[tool.gpu2tpu]\ntarget-torch = "2.9"\n')],
)
def test_the_command_line_and_config_override_the_pins(
    tmp_path: Path, args: tuple[str, ...], config: str | None
) -> None:
    root = project(tmp_path)
    if config:
        (root / "pyproject.toml").write_text(config)
    proc = run_cli("rewrite", "train.py", *args, cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "torch.accelerator.memory.empty_cache()" in (root / "train.py").read_text()


def test_json_carries_the_torch_a_fix_needs(tmp_path: Path) -> None:
    root = project(tmp_path)
    doc = json.loads(run_cli("check", "train.py", "--format", "json", cwd=root).stdout)
    held = [f for f in doc["findings"] if f["needs_torch"]]
    assert [(f["code"], f["category"], f["needs_torch"]) for f in held] == [
        ("G2T301", "needs-newer-torch", "2.9")
    ]
    assert doc["summary"]["target_torch"] == "2.6"
    assert doc["summary"]["raises_min_torch"] == {"train.py": "2.9"}
    assert doc["summary"]["findings_by_category"]["needs-newer-torch"] == 1


def test_a_bad_target_is_a_usage_error(tmp_path: Path) -> None:
    root = project(tmp_path, requirements=None)
    proc = run_cli("check", "train.py", "--target-torch", "latest", cwd=root)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "gpu2tpu: error: target-torch must be a torch version such as \"2.6\", not 'latest'"
    )


# -- real projects' pins (issue 26) -------------------------------------------------------------


LEGACY_PINS = {
    "requirements.txt": "torch>=0.3.1\n",
    "setup.py": "from setuptools import setup\nsetup(install_requires=['torch>=0.3.1'])\n",
    "environment.yml": "dependencies:\n  - pytorch=0.3.1\n",
}


def test_a_legacy_pin_reports_every_fix_and_applies_none(tmp_path: Path) -> None:
    """`torch>=0.3.1` in each kind of project file: a target like any other, older than every
    fix, so every fix is reported and none applied; never an error."""
    for name, text in LEGACY_PINS.items():
        (tmp_path / name.split(".")[0]).mkdir()
        project(tmp_path / name.split(".")[0], requirements=None)
        (tmp_path / name.split(".")[0] / name).write_text(text)
    check = run_cli("check", ".", cwd=tmp_path)
    assert check.returncode == 1 and "Traceback" not in check.stderr, check.stderr
    for where in ("requirements/requirements.txt: torch>=0.3.1", "setup/setup.py: torch>=0.3.1",
                  "environment/environment.yml: pytorch=0.3.1"):  # fmt: skip
        assert f"0.3 ({where})" in check.stdout, check.stdout
    assert "every fix is reported, none applied" in check.stdout
    proc = run_cli("rewrite", ".", cwd=tmp_path)
    assert proc.returncode == 1 and not proc.stderr, proc.stderr
    # the three pin files are listed too (G2T520 would raise each)
    assert "0 files rewritten, 7 left unchanged (1 skipped without parsing)" in proc.stdout
    for folder in ("requirements", "setup", "environment"):
        assert (tmp_path / folder / "train.py").read_text() == SCRIPT
    piped = run_cli("rewrite", "-", "--stdin-filename", "setup/x.py", cwd=tmp_path, stdin=SCRIPT)
    assert piped.returncode == 1 and piped.stdout == SCRIPT, piped.stderr
    assert "not fixed: the fix needs torch 2.6, target-torch is 0.3" in piped.stderr


def two_projects(tmp_path: Path) -> Path:
    """`old` pins torch 2.0 (no `torch.accelerator`: the compat forms only), `new` torch 2.9
    (every fix applies)."""
    for name, pin in (("old", "torch==2.0.0\n"), ("new", "torch>=2.9\n")):
        (tmp_path / name / "src").mkdir(parents=True)
        (tmp_path / name / "src" / "train.py").write_text(SCRIPT)
        (tmp_path / name / "requirements.txt").write_text(pin)
    return tmp_path


def test_each_file_takes_the_pins_of_its_own_project(tmp_path: Path) -> None:
    root = two_projects(tmp_path)
    proc = run_cli("rewrite", "old", "new/src/train.py", cwd=root)
    assert proc.returncode == 1, proc.stderr
    old = (root / "old" / "src" / "train.py").read_text()
    assert 'if hasattr(torch, "accelerator") and' in old and ".to(device)" in old
    assert "torch.cuda.empty_cache()" in old  # torch.accelerator.memory needs 2.9: held back
    new = (root / "new" / "src" / "train.py").read_text()
    assert "torch.accelerator.memory.empty_cache()" in new and ".to(device)" in new
    assert "target-torch is 2.0 (old/requirements.txt: torch==2.0.0)" in proc.stdout, proc.stdout
    # run from inside the project, the same file gets the same answer
    (root / "new" / "src" / "train.py").write_text(SCRIPT)
    inside = run_cli("rewrite", "src", cwd=root / "new")
    assert inside.returncode == 0, inside.stdout + inside.stderr
    assert (root / "new" / "src" / "train.py").read_text() == new
    (root / "new" / "src" / "train.py").write_text(SCRIPT)
    doc = json.loads(run_cli("check", ".", "--format", "json", cwd=root).stdout)
    held = {f["path"]: f["needs_torch"] for f in doc["findings"] if f["code"] == "G2T301"}
    assert held == {"old/src/train.py": "2.9", "new/src/train.py": None}
    assert doc["summary"]["target_torch"] == "2.0"  # the lowest of the run's targets


def test_each_file_takes_the_tool_section_of_its_own_project(tmp_path: Path) -> None:
    root = two_projects(tmp_path)
    (root / "old" / "pyproject.toml").write_text('[tool.gpu2tpu]\nignore = ["G2T1"]\n')
    (root / "new" / "pyproject.toml").write_text('[tool.gpu2tpu]\ntarget-torch = "2.6"\n')
    proc = run_cli("check", ".", cwd=root)
    codes = {
        (ln.split(":")[0], ln.split(": ")[1].split()[0])
        for ln in proc.stdout.splitlines()
        if ln.startswith(("old/", "new/")) and ": G2T" in ln
    }
    assert codes == {
        ("old/src/train.py", "G2T301"),  # G2T101 ignored by old's own section
        ("new/src/train.py", "G2T101"),
        ("new/src/train.py", "G2T301"),
        ("old/requirements.txt", "G2T520"),  # old's pin held G2T301 back; new's target is set
    }, proc.stdout
    assert (
        "target-torch is 2.6 ([tool.gpu2tpu] target-torch in new/pyproject.toml), "
        "2.0 (old/requirements.txt: torch==2.0.0)."
    ) in proc.stdout
