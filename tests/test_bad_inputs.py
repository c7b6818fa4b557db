"""The bad-input matrix: every case is run through the real `gpu2tpu` command line (in this
process, `gpu2tpu.cli.main`, with real worker processes), and each must give its exit status,
exactly its number of one-line errors naming the file or setting and the reason, no
traceback, and every file byte for byte as it was (but the one good file a rewrite may fix).
From standard input, the input comes back unchanged on any failure.

docs/bad-inputs.md lists the cases; `test_the_cases_are_documented` keeps it true.
"""

from __future__ import annotations

import io
import os
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import ROOT

GOOD = "import torch\nx = torch.zeros(1).cuda()\n"
NB_CELL = (
    '{"cells": [{"cell_type": "code", "execution_count": null, "id": "a", "metadata": {}, '
    '"outputs": [], "source": %s}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}\n'
)


@dataclass(frozen=True)
class Case:
    """One bad input: what is on disk, the command, and what must come of it."""

    name: str
    files: dict[str, str | bytes] = field(default_factory=dict)
    args: tuple[str, ...] = ("rewrite", ".")
    stdin: bytes | None = None
    code: int = 2
    errors: int = 1  # stderr lines that are errors, one per problem
    says: str = ""  # in every error line: the file or setting, and the reason
    setup: Callable[[Path], None] | None = None
    rewrites_good: bool = True  # good.py is processed (and may change) despite the bad input
    filter: bool = False  # `rewrite -` alone: on a failure the input must come back unchanged

    def __str__(self) -> str:
        return self.name


def _fifo(root: Path) -> None:
    os.mkfifo(root / "pipe.py")


def _read_only(root: Path) -> None:
    (root / "frozen.py").chmod(0o444)


def _loop(root: Path) -> None:
    os.symlink("loop.py", root / "loop.py")


def _dangling(root: Path) -> None:
    os.symlink("missing-target.py", root / "dangling.py")


def _outside(root: Path) -> None:
    (root.parent / "library").mkdir(exist_ok=True)
    (root.parent / "library" / "shared.py").write_text(GOOD)
    os.symlink(root.parent / "library" / "shared.py", root / "shared.py")


def _users_temporary(root: Path) -> None:
    """A user's file that matches a write's temporary by name, old, its process gone."""
    p = root / ".good.py.999999999.abcdefgh.0123456789abcdef.gpu2tpu"
    p.write_text("mine")
    os.utime(p, (1_000_000, 1_000_000))


def _config(text: str, says: str, errors: int = 1) -> dict:
    """A `[tool.gpu2tpu]` case: exit 2 before anything is read or written."""
    return {
        "files": {"pyproject.toml": text},
        "says": says,
        "errors": errors,
        "rewrites_good": False,
    }


def _shape(text: str) -> dict:
    """A pyproject.toml of an odd shape outside `[tool.gpu2tpu]`: no pin, no error."""
    return {"files": {"pyproject.toml": text}, "code": 0, "errors": 0}


def _pins(name: str, text: str | bytes) -> dict:
    """A project file whose pins cannot be read: no pin, no error, the run goes on."""
    return {"files": {name: text}, "code": 0, "errors": 0}


CASES = [
    # -- files that cannot be read, decoded or parsed ------------------------------------------
    Case("syntax-error", {"broken.py": "import torch\nx = torch.zeros(1).cuda(\n"},
         says="broken.py: syntax error"),
    Case("python2-print", {"py2.py": "print 'on', x.cuda()\n"}, says="py2.py: syntax error"),
    Case("not-utf8", {"latin.py": b"import torch\n# caf\xe9\nx.cuda()\n"},
         says="latin.py: not valid UTF-8 text"),
    Case("bad-declared-encoding", {"ascii.py": b"# coding: ascii\n# caf\xc3\xa9\nx.cuda()\n"},
         says="ascii.py: not valid declared text (ascii)"),
    Case("unknown-encoding", {"enc.py": "# coding: klingon\nx.cuda()\n"},
         says="enc.py: bad encoding declaration"),
    Case("binary", {"blob.py": b"\x7fELF\x00\x01cuda\x00" * 50}, says="blob.py: binary file"),
    Case("utf16-le", {"u16.py": GOOD.encode("utf-16")}, says="u16.py: UTF-16 text"),
    Case("utf16-be", {"u16be.py": b"\xfe\xff" + GOOD.encode("utf-16-be")},
         says="u16be.py: UTF-16 text"),
    Case("utf32", {"u32.py": GOOD.encode("utf-32")}, says="u32.py: UTF-32 text"),
    Case("over-size-limit",
         {"big.py": GOOD * 20, "pyproject.toml": "[tool.gpu2tpu]\nmax-file-size = 100\n"},
         says="big.py: file is 0.0 MiB, over the"),
    Case("deep-brackets",
         {"deep.py": "import torch\nx = " + "(" * 3000 + "1" + ")" * 3000 + "\ny = x.cuda()\n"},
         says="deep.py: syntax error: too many nested parentheses"),
    Case("long-and-chain",
         {"chain.py": "import torch\nok = " + " and ".join(["a"] * 8000) + " and x.cuda()\n"},
         says="chain.py: a statement nested 8002 levels deep"),
    Case("libcst-rejects", {"ann.py": "import torch\n(y): int = torch.zeros(1).cuda()\n"},
         says="ann.py: a statement that libcst's parser rejects"),
    Case("notebook-bad-json", {"a.ipynb": '{"cells": [x.cuda'}, says="a.ipynb: not valid JSON"),
    Case("notebook-json-list", {"b.ipynb": '["cuda"]'}, says="b.ipynb: not a Jupyter notebook"),
    Case("notebook-no-nbformat", {"c.ipynb": '{"cuda": 1}'}, says="c.ipynb: not a Jupyter"),
    Case("notebook-nbformat-3", {"d.ipynb": '{"nbformat": 3, "worksheets": [], "cuda": 1}'},
         says="d.ipynb: nbformat 3 notebook"),
    Case("notebook-not-utf8", {"e.ipynb": b'{"cells": "caf\xe9 cuda"}'},
         says="e.ipynb: notebook is not valid UTF-8"),
    Case("notebook-utf16", {"f.ipynb": (NB_CELL % '"x.cuda()"').encode("utf-16")},
         says="f.ipynb: UTF-16 text"),
    Case("notebook-cell-syntax-error", {"g.ipynb": NB_CELL % '"x = (\\n.cuda()"'},
         says="g.ipynb: cell 0: syntax error"),
    # -- files that may not or cannot be written, or are no files -----------------------------
    Case("read-only", {"frozen.py": GOOD}, setup=_read_only,
         says="frozen.py: read-only file; left as it is"),
    Case("fifo", setup=_fifo, says="pipe.py: not a regular file"),
    Case("symlink-loop", setup=_loop, args=("rewrite", "loop.py", "good.py"),
         says="loop.py: symbolic link loop"),
    Case("dangling-symlink", setup=_dangling, args=("rewrite", "dangling.py", "good.py"),
         says="dangling.py: broken symbolic link"),
    Case("link-outside", setup=_outside,
         says="shared.py: symbolic link to ", ),
    Case("missing-path", args=("rewrite", "nowhere.py", "good.py"),
         says="nowhere.py: no such file or directory"),
    Case("named-like-a-temporary", setup=_users_temporary, code=0, errors=0),
    # -- [tool.gpu2tpu] values of the wrong type ----------------------------------------------
    Case("unsafe-fixes-string", **_config(
        '[tool.gpu2tpu]\nunsafe-fixes = "false"\n',
        'pyproject.toml: [tool.gpu2tpu] unsafe-fixes = "false": expected true or false')),
    Case("unsafe-fixes-number", **_config(
        "[tool.gpu2tpu]\nunsafe-fixes = 1\n",
        "pyproject.toml: [tool.gpu2tpu] unsafe-fixes = 1: expected true or false")),
    Case("exclude-string", **_config(
        '[tool.gpu2tpu]\nexclude = "third_party"\n',
        'pyproject.toml: [tool.gpu2tpu] exclude = "third_party": expected a list of strings')),
    Case("exclude-number", **_config(
        "[tool.gpu2tpu]\nexclude = 5\n",
        "pyproject.toml: [tool.gpu2tpu] exclude = 5: expected a list of strings")),
    Case("exclude-numbers", **_config(
        "[tool.gpu2tpu]\nexclude = [1, 2]\n",
        "pyproject.toml: [tool.gpu2tpu] exclude = [1, 2]: expected a list of strings")),
    Case("select-string", **_config(
        '[tool.gpu2tpu]\nselect = "G2T1"\n',
        'pyproject.toml: [tool.gpu2tpu] select = "G2T1": expected a list of rule codes')),
    Case("select-unknown", **_config(
        '[tool.gpu2tpu]\nselect = ["G2T999"]\n',
        "pyproject.toml: [tool.gpu2tpu] select = [\"G2T999\"]: unknown rule code or prefix")),
    Case("ignore-numbers", **_config(
        "[tool.gpu2tpu]\nignore = [5]\n",
        "pyproject.toml: [tool.gpu2tpu] ignore = [5]: expected a list of rule codes")),
    Case("max-file-size-true", **_config(
        "[tool.gpu2tpu]\nmax-file-size = true\n",
        "pyproject.toml: [tool.gpu2tpu] max-file-size = true: expected a positive whole")),
    Case("max-file-size-negative", **_config(
        "[tool.gpu2tpu]\nmax-file-size = -1\n",
        "pyproject.toml: [tool.gpu2tpu] max-file-size = -1: expected a positive whole")),
    Case("max-file-size-string", **_config(
        '[tool.gpu2tpu]\nmax-file-size = "8MB"\n',
        'pyproject.toml: [tool.gpu2tpu] max-file-size = "8MB": expected a positive whole')),
    Case("target-torch-float", **_config(
        "[tool.gpu2tpu]\ntarget-torch = 2.10\n",
        "pyproject.toml: [tool.gpu2tpu] target-torch = 2.1: expected a torch version in quotes")),
    Case("target-torch-word", **_config(
        '[tool.gpu2tpu]\ntarget-torch = "latest"\n',
        'pyproject.toml: [tool.gpu2tpu] target-torch = "latest": expected a torch version')),
    Case("respect-gitignore-string", **_config(
        '[tool.gpu2tpu]\nrespect-gitignore = "no"\n',
        'pyproject.toml: [tool.gpu2tpu] respect-gitignore = "no": expected true or false')),
    Case("unknown-key", **_config(
        "[tool.gpu2tpu]\nbogus = 1\n",
        "pyproject.toml: unknown [tool.gpu2tpu] key 'bogus'")),
    Case("two-bad-values", **_config(
        '[tool.gpu2tpu]\nunsafe-fixes = "yes"\nexclude = "x"\n',
        "pyproject.toml: [tool.gpu2tpu] ", errors=2)),
    Case("section-not-a-table", **_config(
        "[tool]\ngpu2tpu = 5\n", "pyproject.toml: [tool.gpu2tpu] = 5: expected a table")),
    Case("tool-not-a-table", **_config(
        "tool = 5\n", "pyproject.toml: tool = 5: expected a table")),
    Case("invalid-toml", **_config(
        "[tool.gpu2tpu\n", "pyproject.toml: cannot read [tool.gpu2tpu]: ")),
    Case("pyproject-not-utf8", **_config(
        b"[tool.gpu2tpu]\n# caf\xe9\n", "pyproject.toml: cannot read [tool.gpu2tpu]: ")),
    Case("nested-project-bad-value",
         {"sub/pyproject.toml": '[tool.gpu2tpu]\nunsafe-fixes = "on"\n', "sub/x.py": GOOD},
         says='sub/pyproject.toml: [tool.gpu2tpu] unsafe-fixes = "on"', rewrites_good=False),
    # -- other shapes of pyproject.toml and pins: no pin, no error ------------------------------
    Case("project-a-string", **_shape('project = "x"\n')),
    Case("dependencies-a-string", **_shape('[project]\ndependencies = "torch>=2"\n')),
    Case("optional-dependencies-a-list",
         **_shape('[project]\noptional-dependencies = ["torch>=2"]\n')),
    Case("dependency-groups-odd",
         **_shape('[dependency-groups]\ndev = [{include-group = "x"}, 5]\nci = "torch"\n')),
    Case("poetry-a-number", **_shape("[tool]\npoetry = 5\n")),
    Case("poetry-odd", **_shape('[tool.poetry]\ndependencies = 5\ngroup = "x"\n')),
    Case("poetry-torch-number", **_shape("[tool.poetry.dependencies]\ntorch = 5\n")),
    Case("pyproject-a-folder", setup=lambda root: (root / "pyproject.toml").mkdir(),
         code=0, errors=0),
    Case("setup-py-syntax-error", **_pins("setup.py", "setup(install_requires=['torch>=2'\n")),
    Case("setup-cfg-malformed", **_pins("setup.cfg", "[options\ninstall_requires = torch\n")),
    Case("requirements-odd-lines",
         **_pins("requirements.txt", "-r other.txt\n--index-url x\ngit+https://x/y\n@@@\n")),
    Case("requirements-not-utf8", **_pins("requirements.txt", b"torch>=2.9 # caf\xe9\n")),
    Case("environment-odd", **_pins("environment.yml", "dependencies:\n  - pytorch=\n  - [\n")),
    Case("pin-below-any-release", **_pins("requirements.txt", "torch>=0.0.1\n")),
    Case("legacy-pin", {"requirements.txt": "torch>=0.3.1\n"}, code=1, errors=0,
         rewrites_good=False),  # every fix reported, none applied
    # -- the command line -------------------------------------------------------------------
    Case("output-file-is-an-input", args=("check", "-o", "good.py", "good.py"),
         says="--output-file good.py is one of the input files", rewrites_good=False),
    Case("output-file-inside-an-input", args=("check", "-o", "src/r.py", "."),
         files={"src/a.py": GOOD}, says="--output-file src/r.py is one of the input files",
         rewrites_good=False),
    Case("report-is-an-input", args=("rewrite", "--report", "good.py", "."),
         says="--report good.py is one of the input files", rewrites_good=False),
    Case("stdin-and-paths", args=("rewrite", "-", "good.py"), stdin=GOOD.encode(),
         says="`-` (standard input) cannot be combined with paths", rewrites_good=False),
    Case("target-torch-option", args=("rewrite", "--target-torch", "soon", "."),
         says="target-torch must be a torch version", rewrites_good=False),
    Case("select-option-unknown", args=("rewrite", "--select", "G2T999", "."),
         says="unknown rule code or prefix: G2T999", rewrites_good=False),
    Case("output-file-folder-missing", args=("check", "-o", "nowhere/r.json", "."),
         code=2, says="cannot write nowhere/r.json", rewrites_good=False),
    # -- standard input: the text comes back unchanged --------------------------------------
    Case("stdin-syntax-error", args=("rewrite", "-"), stdin=b"x = torch.cuda(\n",
         says="error: -: syntax error", rewrites_good=False, filter=True),
    Case("stdin-not-utf8", args=("rewrite", "-"), stdin=b"# caf\xe9\nx.cuda()\n",
         says="error: -: not valid UTF-8", rewrites_good=False, filter=True),
    Case("stdin-utf16", args=("rewrite", "-"), stdin=GOOD.encode("utf-16"),
         says="error: -: UTF-16 text", rewrites_good=False, filter=True),
    Case("stdin-binary", args=("rewrite", "-"), stdin=b"\x00cuda\x00",
         says="error: -: binary file", rewrites_good=False, filter=True),
    Case("stdin-bad-notebook", args=("rewrite", "-", "--stdin-filename", "n.ipynb"),
         stdin=b'{"cells": [x.cuda', says="error: n.ipynb: not valid JSON",
         rewrites_good=False, filter=True),
    Case("stdin-bad-config", args=("rewrite", "-"), stdin=GOOD.encode(),
         files={"pyproject.toml": '[tool.gpu2tpu]\nselect = "G2T1"\n'},
         says='[tool.gpu2tpu] select = "G2T1"', rewrites_good=False, filter=True),
    Case("stdin-legacy-pin", args=("rewrite", "-"), stdin=GOOD.encode(),
         files={"requirements.txt": "torch>=0.3.1\n"}, code=1, errors=0, rewrites_good=False),
]  # fmt: skip


@dataclass
class Ran:
    code: int | None
    out: bytes
    err: str
    raised: BaseException | None


def run_main(args: tuple[str, ...], stdin: bytes | None, monkeypatch: pytest.MonkeyPatch) -> Ran:
    """`gpu2tpu ARGS` in this process, its streams captured as bytes."""
    from gpu2tpu.cli import main

    out, err = io.BytesIO(), io.BytesIO()
    streams = {
        "stdin": io.TextIOWrapper(io.BytesIO(stdin or b""), encoding="utf-8"),
        "stdout": io.TextIOWrapper(out, encoding="utf-8", write_through=True),
        "stderr": io.TextIOWrapper(err, encoding="utf-8", write_through=True),
    }
    for name, stream in streams.items():
        monkeypatch.setattr(sys, name, stream)
    code, raised = None, None
    try:
        code = main(list(args))
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 2
    except BaseException as err_:  # a traceback: counted, never let through
        raised = err_
    finally:
        for stream in streams.values():
            stream.flush()
    return Ran(code, out.getvalue(), err.getvalue().decode("utf-8", "replace"), raised)


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under `root`: its bytes and mode (a link: its target)."""
    found: dict[str, tuple] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder, name)
            rel = path.relative_to(root).as_posix()
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                found[rel] = ("link", os.readlink(path))
            elif stat.S_ISREG(st.st_mode):
                found[rel] = ("file", path.read_bytes(), stat.S_IMODE(st.st_mode))
            else:
                found[rel] = ("other", stat.S_IFMT(st.st_mode))
    return found


def _error_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith(("error:", "gpu2tpu: error:"))]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bad_input(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "project"
    root.mkdir()
    (root / "good.py").write_text(GOOD)
    for rel, content in case.files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            (root / rel).write_bytes(content)
        else:
            (root / rel).write_text(content)
    if case.setup:
        case.setup(root)
    before = snapshot(root)
    monkeypatch.chdir(root)
    ran = run_main(case.args, case.stdin, monkeypatch)
    assert ran.raised is None, f"a traceback: {ran.raised!r}"
    assert "Traceback" not in ran.err, ran.err
    errors = _error_lines(ran.err)
    assert len(errors) == case.errors, ran.err
    for line in errors:
        assert case.says in line, (line, case.says)
    assert ran.code == case.code, (ran.code, ran.err, ran.out[-400:])
    after = snapshot(root)
    good = after.pop("good.py")
    before.pop("good.py")
    for rel in set(after) - set(before):  # what a run may add: a report it was asked for
        assert rel.endswith((".md", ".json", ".sarif")), rel
        after.pop(rel)
    assert after == before, "a file was changed"
    rewritten = b".to(device)" in good[1]
    assert rewritten == (case.rewrites_good and "rewrite" in case.args), (good, ran.err)
    if case.filter and case.code == 2:
        assert ran.out == case.stdin, "standard input did not come back unchanged"


def test_the_cases_are_documented() -> None:
    doc = (ROOT / "docs" / "bad-inputs.md").read_text()
    doc = doc.split("# At the edges of the operating system")[0]  # test_bad_inputs_os.py's
    listed = [ln.split("`")[1] for ln in doc.splitlines() if ln.startswith("| `")]
    assert listed == [c.name for c in CASES]
    assert f"{len(CASES)} cases" in doc
