"""`make demo` (`python -m gpu2tpu.demo`): each stage runs and says what it found.

The slow test runs the real demo in a subprocess, as `make demo` does, and checks every
stage's output and files; the fast tests cover the scratch folder's safety, the examples
lookup and the migration report without a kernel.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpu2tpu.backends.base import has_module
from gpu2tpu.demo import (
    EXAMPLES,
    MARKER,
    DemoError,
    Progress,
    find_examples,
    migrate_examples,
    prepare_scratch,
    print_migration_report,
)

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "examples" / "migrated"


# -- the scratch folder and the examples ------------------------------------------------------


def test_scratch_folder_of_someone_else_is_never_deleted(tmp_path: Path) -> None:
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(DemoError, match="not made by the demo"):
        prepare_scratch(folder)
    assert (folder / "notes.txt").read_text() == "mine"


def test_scratch_folder_of_an_earlier_demo_is_replaced(tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    prepare_scratch(folder)
    (folder / "old.txt").write_text("from the last run")
    prepare_scratch(folder)
    assert sorted(p.name for p in folder.iterdir()) == [MARKER]


def test_missing_examples_are_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DemoError, match="--examples PATH"):
        find_examples(str(tmp_path))
    assert find_examples(None) == ROOT / "examples"


def test_migration_report_says_what_was_rewritten_and_what_needs_a_person(tmp_path: Path) -> None:
    report = migrate_examples(ROOT / "examples", tmp_path)
    out = io.StringIO()
    print_migration_report(report, Progress(out))
    text = out.getvalue()
    for name in EXAMPLES:
        assert (tmp_path / "migrated" / name).read_bytes() == (GOLDEN / name).read_bytes()
        assert f"{tmp_path / 'migrated' / name}: rewritten" in text
    assert text.count("rewritten (") == len(EXAMPLES)
    assert text.count("needs a person (") == len(EXAMPLES)
    assert "G2T101 cuda-method x" in text  # fixes, grouped by rule
    assert "cell 1:line 1:col 2: G2T510" in text  # `!nvidia-smi`, for a person, with its place
    assert "-> " in text  # each finding left for a person comes with its hint
    assert "3 files rewritten" in text


# -- the whole demo ---------------------------------------------------------------------------

STAGES = re.compile(r"^==> \[(\d)/5\] (.*)  \(\d+ s\)$", re.MULTILINE)


@pytest.mark.slow
def test_demo_runs_every_stage(tmp_path: Path) -> None:
    env = dict(os.environ)
    env.pop("PJRT_DEVICE", None)
    # Two shared cores: one thread per process. Other test processes may hold libtpu's lock.
    env.update(OMP_NUM_THREADS="1", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    workdir = tmp_path / "scratch"
    proc = subprocess.run(
        [sys.executable, "-m", "gpu2tpu.demo", "--workdir", str(workdir)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout
    assert proc.returncode == 0, f"{out[-4000:]}\n{proc.stderr[-4000:]}"

    stages = STAGES.findall(out)
    assert [int(n) for n, _ in stages] == [1, 2, 3, 4, 5], out
    text = {int(n): part for n, part in zip(range(1, 6), STAGES.split(out)[3::3], strict=True)}

    assert "%%tpu would run here on: auto:" in text[1]
    assert "needs a person (" in text[2] and "G2T510" in text[2] and "3 files rewritten" in text[2]
    for name in EXAMPLES:
        assert (workdir / "migrated" / name).read_bytes() == (GOLDEN / name).read_bytes()

    assert re.search(r"cell +\d+/\d+ %%tpu --profile --full +\d+\.\d s", text[3]), text[3]
    assert "test accuracy" in text[3]
    executed = workdir / "image_classification.run.ipynb"
    nb = json.loads(executed.read_text(encoding="utf-8"))
    assert not [o for c in nb["cells"] for o in c.get("outputs", []) if o["output_type"] == "error"]

    assert "    | with torch.cuda.amp.autocast():" in text[4]
    for row in ("measured", "TPU v5e", "NVIDIA H100 80GB", "Prices: on-demand"):
        assert row in text[4], text[4]
    profile = json.loads((workdir / "profile.json").read_text(encoding="utf-8"))
    assert profile["stats"]["median"] > 0 and profile["comparison"]["rows"]

    if has_module("jax") and has_module("torchax") and has_module("libtpu"):
        # Not a terminal: one plain progress line per finished target, on stdout (never pink).
        progress = text[5]
        assert "forecast v5e:" in progress and "forecast v6e:" in progress, progress[-3000:]
        assert "forecast v5e:" not in proc.stderr
        assert re.search(r"^v5e +compiled", text[5], re.MULTILINE), text[5]
        assert re.search(r"^v6e +compiled", text[5], re.MULTILINE), text[5]
        forecast = json.loads((workdir / "forecast.json").read_text(encoding="utf-8"))
        assert [t["target"] for t in forecast["targets"]] == ["v5e", "v6e"]
    else:
        assert "skipped (pip install 'gpu2tpu[forecast]')" in text[5]
    assert "Demo done in" in out
