"""The `gpu2tpu check` / `gpu2tpu rewrite` command line, run as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_cli

CUDA_SCRIPT = """import torch

model = torch.nn.Linear(4, 2).cuda()
x = torch.randn(8, 4, device="cuda")
if x.device.type == "cuda":
    print("on gpu")
"""
PLAIN = "import torch\n\nmodel = torch.nn.Linear(4, 2)\n"


def make_tree(tmp_path: Path) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text(CUDA_SCRIPT)
    (tmp_path / "pkg" / "plain.py").write_text(PLAIN)
    (tmp_path / ".venv" / "lib").mkdir(parents=True)
    (tmp_path / ".venv" / "lib" / "vendored.py").write_text(CUDA_SCRIPT)
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "gen.py").write_text(CUDA_SCRIPT)
    return tmp_path


def test_check_lists_findings_like_ruff(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    proc = run_cli("check", ".", cwd=root)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert any(
        ln.startswith("pkg/train.py:3:9: G2T101 [*] `")
        and ln.endswith("ties the value to NVIDIA GPUs; use the module's device")
        for ln in lines
    ), lines
    assert any(ln.startswith("pkg/train.py:4:30: G2T102 [*]") for ln in lines)
    # report-only finding: no fix marker
    assert any(ln.startswith("pkg/train.py:5:4: G2T111 comparison") for ln in lines)
    assert (
        "Found 3 findings in 1 file (2 fixable with `gpu2tpu rewrite`, 1 needs a person)." in lines
    )
    assert not any(".venv" in ln or "build/" in ln for ln in lines), "default excludes ignored"
    assert (root / "pkg" / "train.py").read_text() == CUDA_SCRIPT, "check must not write"


def test_check_json_is_the_documented_schema(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    proc = run_cli("check", "pkg", "--format", "json", cwd=root)
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["version"] == 1
    keys = {"code", "name", "severity", "safety", "category", "fixed", "fixable", "needs_torch",
            "path", "cell", "cell_id", "line", "col", "message", "hint", "url"}  # fmt: skip
    assert all(set(f) == keys for f in doc["findings"])
    categories = {f["code"]: f["category"] for f in doc["findings"]}
    assert categories == {"G2T101": "blocks-tpu", "G2T102": "blocks-tpu",
                          "G2T111": "differs-on-tpu"}  # fmt: skip
    assert doc["summary"]["findings_by_category"]["differs-on-tpu"] == 1
    assert doc["findings"][0]["url"].endswith("docs/rules.md#g2t101")
    first = doc["findings"][0]
    assert (first["code"], first["path"], first["line"], first["col"]) == (
        "G2T101",
        "pkg/train.py",
        3,
        9,
    )
    assert first["safety"] == "safe" and first["fixable"] and not first["fixed"]
    assert doc["summary"]["files_scanned"] == 2
    assert doc["summary"]["skipped_by_prefilter"] == 1


def test_rewrite_writes_and_is_idempotent(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    plain = root / "pkg" / "plain.py"
    os.utime(plain, (1_000_000, 1_000_000))
    proc = run_cli("rewrite", ".", cwd=root)
    assert proc.returncode == 1  # one finding is left for a person
    new = (root / "pkg" / "train.py").read_text()
    assert ".cuda()" not in new and '"cuda")' not in new
    assert "device = torch.accelerator.current_accelerator(check_available=True)" in new
    assert "pkg/train.py:5:4: G2T111" in proc.stdout
    assert "1 file rewritten" in proc.stdout
    assert plain.stat().st_mtime == 1_000_000, "an unchanged file was written"
    assert (root / ".venv" / "lib" / "vendored.py").read_text() == CUDA_SCRIPT
    mtime = (root / "pkg" / "train.py").stat().st_mtime
    again = run_cli("rewrite", ".", cwd=root)
    assert "0 files rewritten" in again.stdout
    assert (root / "pkg" / "train.py").stat().st_mtime == mtime
    assert (root / "pkg" / "train.py").read_text() == new


def test_rewrite_diff_and_check_write_nothing(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    diff = run_cli("rewrite", "--diff", "pkg", cwd=root)
    assert diff.returncode == 1
    assert diff.stdout.startswith("--- pkg/train.py\n+++ pkg/train.py\n")
    assert "+model = torch.nn.Linear(4, 2).to(device)" in diff.stdout
    check = run_cli("rewrite", "--check", "pkg", cwd=root)
    assert check.returncode == 1
    assert "would rewrite pkg/train.py" in check.stdout
    assert (root / "pkg" / "train.py").read_text() == CUDA_SCRIPT
    clean = run_cli("rewrite", "--check", "pkg/plain.py", cwd=root)
    assert clean.returncode == 0


def test_select_ignore_and_unknown_codes(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    only = run_cli("check", "pkg", "--select", "G2T102", cwd=root)
    codes = {ln.split(": ")[1].split()[0] for ln in only.stdout.splitlines() if ": G2T" in ln}
    assert codes == {"G2T102"}
    ignored = run_cli("check", "pkg", "--ignore", "G2T1", cwd=root)
    assert ignored.returncode == 0 and "All clear" in ignored.stdout
    bad = run_cli("check", "pkg", "--select", "G2T999", cwd=root)
    assert bad.returncode == 2 and "unknown rule code or prefix: G2T999" in bad.stderr


def test_pyproject_exclude_and_select(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    (root / "pyproject.toml").write_text('[tool.gpu2tpu]\nexclude = ["pkg/train.py"]\n')
    proc = run_cli("check", ".", cwd=root)
    assert proc.returncode == 0, proc.stdout
    (root / "pyproject.toml").write_text("[tool.gpu2tpu]\nbogus = 1\n")
    proc = run_cli("check", ".", cwd=root)
    assert proc.returncode == 2
    assert proc.stderr == (
        "gpu2tpu: error: pyproject.toml: unknown [tool.gpu2tpu] key 'bogus' (the keys are: "
        "exclude, select, ignore, unsafe-fixes, max-file-size, target-torch, respect-gitignore)\n"
    )


def test_stdin_mode() -> None:
    proc = run_cli("rewrite", "-", stdin="import torch\nx = torch.zeros(1).cuda()\n")
    assert proc.returncode == 0
    assert "x = torch.zeros(1).to(device)" in proc.stdout


def test_rules_listing_and_explanation() -> None:
    listing = run_cli("rules")
    assert listing.returncode == 0
    assert any(ln.startswith("G2T101  cuda-method") for ln in listing.stdout.splitlines())
    one = run_cli("rules", "G2T101")
    assert "Why:" in one.stdout and "Example:" in one.stdout
    data = json.loads(run_cli("rules", "--format", "json").stdout)
    assert {"code", "name", "safety", "explanation"} <= set(data[0])
    assert run_cli("rules", "G2T999").returncode == 2


def test_version_does_not_import_torch() -> None:
    code = (
        "import sys; from gpu2tpu.cli import main\n"
        "try:\n    main(['--version'])\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules, 'libcst' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout.strip().endswith("False False"), proc.stdout + proc.stderr
    assert proc.stdout.startswith("gpu2tpu 0.")


def test_no_arguments_prints_help() -> None:
    proc = run_cli()
    assert proc.returncode == 2 and "check" in proc.stdout


def test_cuda_sources_beside_python_are_reported(tmp_path: Path) -> None:
    (tmp_path / "ext").mkdir()
    (tmp_path / "ext" / "kernel.cu").write_text("__global__ void k() {}\n")
    (tmp_path / "build_ext.py").write_text("print('builds the kernel')\n")
    proc = run_cli("check", ".", cwd=tmp_path)
    assert proc.returncode == 1
    assert any(ln.startswith("ext/kernel.cu:1:1: G2T502") for ln in proc.stdout.splitlines())
    assert (tmp_path / "ext" / "kernel.cu").read_text() == "__global__ void k() {}\n"
    lone = tmp_path / "lone"
    (lone / "src").mkdir(parents=True)
    (lone / "src" / "k.cu").write_text("\n")
    assert run_cli("check", ".", cwd=lone).returncode == 0


def test_rules_doc_is_current() -> None:
    from gpu2tpu.rewrite.reports.rules_doc import rules_markdown

    doc = Path(__file__).resolve().parent.parent / "docs" / "rules.md"
    assert doc.read_text() == rules_markdown(), (
        "run: python -m gpu2tpu.rewrite.reports.rules_doc > docs/rules.md"
    )


def test_every_rule_code_and_name_is_taken_once() -> None:
    """A code names one rule: `--ignore`, `noqa` and the docs' anchors depend on it."""
    from collections import Counter

    from gpu2tpu.rewrite.rules.base import all_rules

    rules = all_rules()
    codes = Counter(r.code for r in rules)
    names = Counter(r.name for r in rules)
    assert [c for c, n in codes.items() if n > 1] == []
    assert [c for c, n in names.items() if n > 1] == []


def test_a_folder_named_explicitly_is_processed_even_if_excluded(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    (root / "pyproject.toml").write_text('[tool.gpu2tpu]\nexclude = ["pkg"]\n')
    assert run_cli("check", ".", cwd=root).returncode == 0  # excluded when walking from the top
    named = run_cli("check", "pkg", cwd=root)
    assert named.returncode == 1 and "pkg/train.py:3:9: G2T101" in named.stdout


def test_the_prefilter_answers_as_every_token_would() -> None:
    """The prefilter searches only the tokens that hold no other one: on any text it must say
    what searching all of them says."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from gpu2tpu.rewrite.core.model import Options
    from gpu2tpu.rewrite.core.source import prefilter_tokens
    from gpu2tpu.rewrite.files.engine import holds_token

    tokens = prefilter_tokens(Options())
    pieces = st.sampled_from([*tokens, b"x", b" ", b".", b"(", b"\n", b"_", b"c", b"da"])

    @settings(max_examples=400, deadline=None)
    @given(st.lists(pieces, max_size=8).map(b"".join))
    def agree(data: bytes) -> None:
        assert holds_token(data, tokens) == any(t in data for t in tokens)

    agree()
    assert holds_token(b"x = y.is_cuda\n", tokens)  # through `cuda`, which `is_cuda` holds
    assert not holds_token(b"import os\nprint(os.getcwd())\n", tokens)


def test_a_report_file_that_names_an_input_is_a_usage_error(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    train = root / "pkg" / "train.py"
    for args in (
        ("check", "-o", "pkg/train.py", "pkg/train.py"),
        ("check", "--output-file", "pkg/train.py", "pkg"),
        ("check", "-o", "./pkg/../pkg/train.py", "."),
        ("rewrite", "--report", "pkg/train.py", "pkg"),
        ("rewrite", "--report", "pkg/train.py", "pkg/train.py", "pkg/plain.py"),
    ):
        proc = run_cli(*args, cwd=root)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert (
            proc.stderr.strip()
            .splitlines()[-1]
            .endswith("is one of the input files; name another file for the report")
        ), proc.stderr
        assert "Traceback" not in proc.stderr
        assert train.read_text() == CUDA_SCRIPT, args
    # a report beside the sources, not among them, is fine
    proc = run_cli("check", "-o", "pkg/report.md", "--format", "markdown", "pkg", cwd=root)
    assert proc.returncode == 1 and (root / "pkg" / "report.md").is_file()


def test_a_closed_pipe_ends_the_run_quietly(tmp_path: Path) -> None:
    """`gpu2tpu check . | head -1`: the reader goes away after one line."""
    # more output than a pipe holds (64 KiB), so that writing it must meet the closed end
    body = "import torch\n" + "".join(f"x{i} = torch.zeros(1).cuda()\n" for i in range(900))
    (tmp_path / "many.py").write_text(body)
    proc = subprocess.run(
        f"{sys.executable} -m gpu2tpu check many.py | head -1; echo \"status ${{PIPESTATUS[0]}}\"",
        shell=True, executable="/bin/bash", cwd=tmp_path, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("many.py:2:6: G2T101") and lines[1] == "status 141", proc.stdout
    assert proc.stderr == "", proc.stderr


def test_sarif_names_a_file_whose_name_is_not_utf8(tmp_path: Path) -> None:
    with open(os.path.join(os.fsencode(tmp_path), b"caf\xe9.py"), "wb") as handle:
        handle.write(b"import torch\nx = torch.zeros(1).cuda()\n")
    proc = subprocess.run(
        [sys.executable, "-m", "gpu2tpu", "check", "--format", "sarif", "-o", "out.sarif", "."],
        cwd=tmp_path, capture_output=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1 and b"Traceback" not in proc.stderr, proc.stderr
    doc = json.loads((tmp_path / "out.sarif").read_text(encoding="utf-8"))
    (result,) = doc["runs"][0]["results"]
    location = result["locations"][0]["physicalLocation"]["artifactLocation"]
    assert location == {"uri": "caf%E9.py", "uriBaseId": "%SRCROOT%"}  # the name's own bytes


def test_the_summary_counts_files_not_errors(tmp_path: Path) -> None:
    """A path that does not exist is an error, not a file: nothing is "-1 left unchanged"."""
    (tmp_path / "good.py").write_text(CUDA_SCRIPT)
    proc = run_cli("rewrite", "good.py", "missing.py", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stdout.splitlines()[-4].startswith(
        "1 file rewritten, 0 left unchanged (0 skipped without parsing); 2 edits"
    ), proc.stdout
    assert "1 file could not be processed" in proc.stdout


def test_a_file_that_could_not_be_written_counts_no_edit(tmp_path: Path) -> None:
    (tmp_path / "ro.py").write_text(CUDA_SCRIPT)
    (tmp_path / "ro.py").chmod(0o444)
    doc_proc = run_cli("rewrite", "ro.py", cwd=tmp_path)
    assert doc_proc.returncode == 2
    assert "error: ro.py: read-only file; left as it is" in doc_proc.stderr
    summary = doc_proc.stdout.splitlines()
    assert any(
        ln.startswith("0 files rewritten, 0 left unchanged (0 skipped without parsing); 0 edits")
        for ln in summary
    ), summary
    assert not any(ln.startswith("Edits by rule") for ln in summary)
    assert (tmp_path / "ro.py").read_text() == CUDA_SCRIPT


def test_utf16_files_are_said_not_skipped(tmp_path: Path) -> None:
    for name, encoding in (("le.py", "utf-16"), ("be.py", "utf-16-be"), ("w.py", "utf-32")):
        data = CUDA_SCRIPT.encode(encoding)
        if encoding == "utf-16-be":
            data = b"\xfe\xff" + data
        (tmp_path / name).write_bytes(data)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    proc = run_cli("rewrite", ".", cwd=tmp_path)
    assert proc.returncode == 2
    errors = sorted(ln for ln in proc.stderr.splitlines() if ln.startswith("error:"))
    assert errors == [
        "error: be.py: UTF-16 text (it starts with a UTF-16 byte-order mark): Python reads "
        "source as UTF-8; file left as it is (save it as UTF-8 to check it)",
        "error: le.py: UTF-16 text (it starts with a UTF-16 byte-order mark): Python reads "
        "source as UTF-8; file left as it is (save it as UTF-8 to check it)",
        "error: w.py: UTF-32 text (it starts with a UTF-32 byte-order mark): Python reads "
        "source as UTF-8; file left as it is (save it as UTF-8 to check it)",
    ], proc.stderr
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


# -- standard input (issue 26) -----------------------------------------------------------------

NOTEBOOK = (
    json.dumps(
        {
            "cells": [
                {
                    "cell_type": "code",
                    "execution_count": None,
                    "id": "a1",
                    "metadata": {},
                    "outputs": [],
                    "source": ["import torch\n", "x = torch.ones(2).cuda()\n"],
                }
            ],  # fmt: skip
            "metadata": {"language_info": {"name": "python"}},
            "nbformat": 4,
            "nbformat_minor": 5,
        },
        indent=1,
    )
    + "\n"
)


def test_stdin_with_paths_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text(CUDA_SCRIPT)
    for command in ("check", "rewrite"):
        proc = run_cli(command, "-", "a.py", cwd=tmp_path, stdin=CUDA_SCRIPT)
        assert proc.returncode == 2
        assert proc.stderr == (
            "gpu2tpu: error: `-` (standard input) cannot be combined with paths; "
            "give one or the other\n"
        )
        assert (tmp_path / "a.py").read_text() == CUDA_SCRIPT


def test_stdin_honours_the_format_and_the_output_file(tmp_path: Path) -> None:
    proc = run_cli("check", "-", "--format", "json", "--stdin-filename", "t.py", stdin=CUDA_SCRIPT)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert {(f["path"], f["code"]) for f in doc["findings"]} == {
        ("t.py", "G2T101"), ("t.py", "G2T102"), ("t.py", "G2T111")
    }  # fmt: skip
    proc = run_cli("check", "-", "--format", "sarif", "-o", "out.sarif", cwd=tmp_path,
                   stdin=CUDA_SCRIPT)  # fmt: skip
    assert proc.returncode == 1 and proc.stdout == "", proc.stderr
    assert json.loads((tmp_path / "out.sarif").read_text())["runs"][0]["results"]
    proc = run_cli("rewrite", "-", "--report", "report.md", cwd=tmp_path, stdin=CUDA_SCRIPT)
    assert ".to(device)" in proc.stdout
    assert "# gpu2tpu migration report" in (tmp_path / "report.md").read_text()


def test_a_notebook_on_stdin_is_read_as_a_notebook() -> None:
    proc = run_cli("rewrite", "-", "--stdin-filename", "nb.ipynb", stdin=NOTEBOOK)
    assert proc.returncode == 0, proc.stderr
    new = json.loads(proc.stdout)
    assert new["cells"][0]["source"] == ["import torch\n", "x = torch.ones(2).to(device)\n"] or (
        "x = torch.ones(2).to(device)\n" in new["cells"][0]["source"]
    )
    check = run_cli("check", "-", "--stdin-filename", "nb.ipynb", stdin=NOTEBOOK)
    assert check.stdout.startswith("nb.ipynb:cell 0:line 2:col 5: G2T101"), check.stdout
    diff = run_cli("rewrite", "--diff", "-", "--stdin-filename", "nb.ipynb", stdin=NOTEBOOK)
    assert diff.returncode == 1 and "+x = torch.ones(2).to(device)" in diff.stdout


@pytest.mark.parametrize(
    ("config", "args", "stdin", "expected"),
    [
        ("[tool.gpu2tpu]\nunsafe-fixes = 'yes'\n", (), CUDA_SCRIPT,
         "gpu2tpu: error: pyproject.toml: [tool.gpu2tpu] unsafe-fixes = \"yes\": expected "
         "true or false (a TOML boolean, without quotes)"),
        ("tool = 5\n", (), CUDA_SCRIPT,
         "gpu2tpu: error: pyproject.toml: tool = 5: expected a table ([tool.NAME] ...)"),
        ("[tool.gpu2tpu\n", (), CUDA_SCRIPT, "gpu2tpu: error: pyproject.toml: cannot read"),
        (None, ("--target-torch", "soon"), CUDA_SCRIPT,
         "gpu2tpu: error: target-torch must be a torch version"),
        (None, ("--select", "G2T999"), CUDA_SCRIPT,
         "gpu2tpu: error: unknown rule code or prefix: G2T999"),
        (None, ("--report", "nowhere/r.md"), CUDA_SCRIPT, "gpu2tpu: error: cannot write"),
        (None, (), "import torch\nx = torch.cuda(\n", "error: -: syntax error"),
        (None, ("--stdin-filename", "nb.ipynb"), '{"cells": [torch.cuda]', "error: nb.ipynb: "),
        (None, (), "import torch\nx = 'caf\udce9'.cuda()\n", "error: -: not valid UTF-8"),
    ],
)  # fmt: skip
def test_stdin_gives_the_input_back_on_any_failure(
    tmp_path: Path, config: str | None, args: tuple[str, ...], stdin: str, expected: str
) -> None:
    if config is not None:
        (tmp_path / "pyproject.toml").write_text(config)
    data = stdin.encode("utf-8", "surrogateescape")
    proc = subprocess.run(
        [sys.executable, "-m", "gpu2tpu", "rewrite", "-", *args], cwd=tmp_path, input=data,
        capture_output=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stdout == data
    (line,) = proc.stderr.decode().splitlines()
    assert line.startswith(expected), line


# -- .gitignore (issue 26) ---------------------------------------------------------------------


def git_tree(tmp_path: Path, *, repository: bool = True) -> Path:
    root = tmp_path / "repo"
    for rel in ("src/train.py", "src/a_gen.py", "src/keep_gen.py", "generated/out.py",
                "src/local/secret.py", "notes/draft.py"):  # fmt: skip
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(CUDA_SCRIPT)
    (root / ".gitignore").write_text("# build output\ngenerated/\n*_gen.py\n")
    (root / "src" / ".gitignore").write_text("!keep_gen.py\nlocal\n")
    if repository:
        (root / ".git" / "info").mkdir(parents=True)
        (root / ".git" / "info" / "exclude").write_text("notes/\n")
    return root


def found(root: Path, *paths: str, respect_gitignore: bool | None = None) -> set[str]:
    """The files a run from `root` takes (discovery with each folder's configuration)."""
    from gpu2tpu.rewrite.files.config import Overrides, ProjectConfigs
    from gpu2tpu.rewrite.files.discovery import discover

    configs = ProjectConfigs(Overrides(respect_gitignore=respect_gitignore), root)
    files, errors = discover(paths, configs.scope)
    assert not errors
    return {os.path.relpath(f, root) for f in files}


EVERYTHING = {"src/train.py", "src/a_gen.py", "src/keep_gen.py", "generated/out.py",
              "src/local/secret.py", "notes/draft.py"}  # fmt: skip


def test_gitignore_is_respected_inside_a_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = git_tree(tmp_path)
    monkeypatch.chdir(root)
    assert found(root, ".") == {"src/train.py", "src/keep_gen.py"}
    assert found(root, ".", respect_gitignore=False) == EVERYTHING
    (root / "pyproject.toml").write_text("[tool.gpu2tpu]\nrespect-gitignore = false\n")
    assert found(root, ".") == EVERYTHING
    assert found(root, ".", respect_gitignore=True) == {"src/train.py", "src/keep_gen.py"}
    (root / "pyproject.toml").unlink()
    # a folder or a file named on the command line is wanted, as with exclude
    assert found(root, "generated") == {"generated/out.py"}
    assert found(root, "src/a_gen.py") == {"src/a_gen.py"}
    # walked from inside, the repository's .gitignore files above still count
    assert found(root, str(root / "src")) == {"src/train.py", "src/keep_gen.py"}
    # the command line's switch
    proc = run_cli("check", ".", "--no-respect-gitignore", "--select", "G2T101", cwd=root)
    assert {ln.split(":")[0] for ln in proc.stdout.splitlines()[:6]} == EVERYTHING


def test_gitignore_outside_a_repository_does_not_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As in git and ruff: a .gitignore means something only in a repository."""
    root = git_tree(tmp_path, repository=False)
    monkeypatch.chdir(root)
    assert found(root, ".") == EVERYTHING
