"""Real code nobody here wrote: five PyPI packages full of CUDA idioms, rewritten by the real
`gpu2tpu rewrite`, must still compile, define every name they use, import, compute the same
numbers in a smoke run and be left alone by a second rewrite (tests/corpus/harness.py).

The sdists are pinned by sha256 in tests/corpus/manifest.toml and cached by `make corpus`
(outside the checkout); a run without the cache downloads it first.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import device_flow_oracle
import pytest
import self_check
import torch
from corpus import harness

from conftest import run_cli
from gpu2tpu.rewrite.core.model import Options
from gpu2tpu.rewrite.core.source import rewrite_source

PACKAGES = harness.load_manifest()


@pytest.fixture(scope="module")
def corpus_cache() -> Path:
    try:
        return harness.prepare()
    except harness.CorpusError as err:
        pytest.fail(f"the corpus could not be prepared: {err}")


@pytest.fixture(scope="module")
def corpus_table(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """Collects each package's counts; prints the table when the module is done."""
    results: list[harness.PackageResult] = []
    yield results
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if results and reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():  # else fd capture swallows the table
            reporter.write_line("")
            reporter.write_sep("-", f"gpu2tpu rewrite --target-torch {harness.installed_torch()}")
            reporter.write_line(harness.table(results))


@pytest.mark.slow
@pytest.mark.torch_matrix
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("package", PACKAGES, ids=[p.name for p in PACKAGES])
def test_rewritten_package_still_works(
    package: harness.Package, corpus_cache: Path, tmp_path: Path, corpus_table: list
) -> None:
    result = harness.run_package(package, corpus_cache, tmp_path)
    corpus_table.append(result)
    assert result.files > 0 and result.rewritten > 0, "the corpus package was not rewritten"
    assert not result.failures, (
        f"{len(result.failures)} failure(s) after `gpu2tpu rewrite` of {package.name} "
        f"{package.version}:\n\n{harness.failures_markdown([result])}"
    )


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("package", PACKAGES, ids=[p.name for p in PACKAGES])
def test_the_rewrite_agrees_with_itself_and_sees_every_device_flow(
    package: harness.Package, corpus_cache: Path, tmp_path: Path
) -> None:
    """Issue 27 on code nobody here wrote. §3: each file's rewrite reaches the fixed point in
    one run and its output draws no finding the first run did not leave (tests/self_check.py);
    issue 32 §2: `check` of the file leaves to a person what `rewrite` leaves, and `check` of
    the rewrite reports nothing it did not leave.
    §1: no file where a CUDA device string reaches a device argument through a variable (by
    an independent reading, tests/device_flow_oracle.py) is called clean."""
    root = harness.extract(harness.fetch(package, corpus_cache), tmp_path)
    problems = []
    for rel in harness.python_files(root):
        text = (root / rel).read_text(encoding="utf-8", errors="replace")
        if "cuda" not in text:
            continue
        problems += [f"{rel}: {d}" for d in self_check.disagreements(text)]
        problems += [f"{rel}: {d}" for d in self_check.check_disagreements(text)]
        try:
            flows = device_flow_oracle.device_flows(ast.parse(text))
        except (SyntaxError, ValueError, RecursionError):
            continue
        if flows:
            lines = {f.line for f in rewrite_source(text, Options(fix=False)).findings}
            problems += [
                f"{rel}:{a}->{b}: the device string in `{name}` is called clean"
                for a, b, name in flows
                if a not in lines and b not in lines
            ]
    assert problems == []


# The harness's own parts, so that a green corpus run means what it says.


def test_manifest_pins_five_sdists_by_hash() -> None:
    assert len(PACKAGES) >= 5
    for pkg in PACKAGES:
        assert len(pkg.sha256) == 64 and int(pkg.sha256, 16) >= 0, pkg
        assert pkg.sdist.endswith(".tar.gz") and pkg.version in pkg.sdist, pkg
        assert (harness.HERE / pkg.smoke).is_file(), pkg


def test_verify_refuses_a_file_with_another_hash(tmp_path: Path) -> None:
    path = tmp_path / "x.tar.gz"
    path.write_bytes(b"not the release")
    harness.verify(path, harness.sha256_of(path))
    with pytest.raises(harness.CorpusError, match="does not match"):
        harness.verify(path, "0" * 64)


def test_compare_sees_a_changed_number_anywhere() -> None:
    a = {"out": torch.ones(3), "nested": {"tokens": [1, 2, 3], "text": "hi"}}
    assert (
        harness.compare(a, {"out": torch.ones(3), "nested": {"tokens": [1, 2, 3], "text": "hi"}})
        == []
    )
    changed = {
        "out": torch.tensor([1.0, 1.0, 1.001]),
        "nested": {"tokens": [1, 2, 4], "text": "hi"},
    }
    found = harness.compare(a, changed)
    assert [m.split(":")[0] for m in found] == [".out", ".nested.tokens[2]"]


def test_new_undefined_names_are_counted_per_file_and_name() -> None:
    before = [{"path": "a.py", "line": 3, "message": "Undefined name `x`"}]
    after = [
        {"path": "a.py", "line": 4, "message": "Undefined name `x`"},  # moved, or ...
        {"path": "a.py", "line": 9, "message": "Undefined name `x`"},  # ... new: one of the two
        {"path": "b.py", "line": 1, "message": "Undefined name `device`"},
    ]
    new = harness.new_undefined(before, after)
    assert [(d["path"], d["message"]) for d in new] == [
        ("a.py", "Undefined name `x`"),
        ("b.py", "Undefined name `device`"),
    ]


def test_ruff_finds_a_name_used_before_its_module_level_binding(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("device = torch.device('cpu')\nimport torch\n")
    assert [d["message"] for d in harness.undefined_names(tmp_path)] == ["Undefined name `torch`"]


def test_the_summary_reader_reads_the_real_command(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(
        "import torch\n\nmodel = torch.nn.Linear(2, 2).cuda()\ntorch.cuda.synchronize()\n"
    )
    proc = run_cli("rewrite", ".", cwd=tmp_path)
    rewritten, edits, _ = harness.read_summary(proc.stdout + proc.stderr)
    assert (rewritten, edits > 0) == (1, True), proc.stdout + proc.stderr


def test_hunk_at_gives_the_lines_around_a_change() -> None:
    before = "a\nb\nc\nd\n"
    after = "a\nb\nX\nY\nd\n"
    old, new, first, last = harness.hunk_at(before, after, 4)
    assert (old, new, first, last) == ("b\nc\nd", "b\nX\nY\nd", 3, 3)


def test_probe_imports_names_the_failing_module_and_line(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "ok.py").write_text("X = 1\n")
    (pkg / "sub" / "__init__.py").write_text("\n\nraise RuntimeError('boom')\n")
    out = tmp_path / "imports.json"
    env = harness.run_env([tmp_path], tmp_path)
    probe = harness.HERE / "probe_imports.py"
    subprocess.run(
        [sys.executable, str(probe), str(tmp_path), "pkg", str(out)], env=env, check=True
    )
    result = json.loads(out.read_text())
    assert result["pkg"] is None and result["pkg.ok"] is None
    assert result["pkg.sub"] == {
        "error": "RuntimeError: boom",
        "file": "pkg/sub/__init__.py",
        "line": 3,
    }


@pytest.mark.slow
def test_run_package_reports_a_changed_smoke_result_and_ignores_old_breakage(
    tmp_path: Path,
) -> None:
    """The whole pipeline on a tiny sdist (no network: the cache is laid out by hand). Its
    smoke run records the module's source, so the rewrite must show as a smoke mismatch; a
    file that never compiled is not blamed on the rewrite."""
    src = tmp_path / "src" / "tinypkg-1.0"
    (src / "tinypkg").mkdir(parents=True)
    (src / "tinypkg" / "__init__.py").write_text(
        "import torch\n\n"
        'DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")\n\n\n'
        "def total():\n    return torch.ones(3, device=DEVICE).sum()\n"
    )
    (src / "legacy.py").write_text("print 'python 2'\n")
    cache = tmp_path / "cache"
    (cache / "sdists").mkdir(parents=True)
    sdist = cache / "sdists" / "tinypkg-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(src, arcname="tinypkg-1.0")
    harness.deps_dir(cache).mkdir()
    (harness.deps_dir(cache) / ".complete").touch()
    smoke = tmp_path / "smoke_tiny.py"
    smoke.write_text(
        "import inspect, sys, torch, tinypkg\n"
        "torch.save({'total': tinypkg.total(), 'source': inspect.getsource(tinypkg)}, sys.argv[1])\n"
    )
    pkg = harness.Package(
        "tinypkg", "1.0", sdist.name, harness.sha256_of(sdist), ".", "tinypkg", str(smoke)
    )
    result = harness.run_package(pkg, cache, tmp_path / "work")
    assert (result.files, result.compiled, result.rewritten) == (2, 1, 1)
    assert result.edits > 0
    assert [(f.kind, f.detail.split(":")[0]) for f in result.failures] == [
        ("smoke mismatch", "smoke_tiny.py.source")
    ]


# Issue 32 §1: ultralytics pins `torch>=1.8.0` (its pyproject.toml). A default rewrite read
# that pin as the target and held every fix back; `BaseTensor.cuda()` crashed on the CPU
# before and after. The probe is the package's own documented use of it.
OLD_PIN_PROBE = (
    "import torch\n"
    "{prelude}"
    "from ultralytics.engine.results import BaseTensor\n"
    "print(BaseTensor(torch.zeros(2, 3), (4, 4)).cuda().data.device.type)\n"
)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_a_package_pinned_to_an_old_torch_runs_on_the_cpu_after_a_default_rewrite(
    corpus_cache: Path, tmp_path: Path
) -> None:
    (package,) = [p for p in PACKAGES if p.name == "ultralytics"]
    root = harness.extract(harness.fetch(package, corpus_cache), tmp_path / "src")
    env = harness.run_env(
        [root / package.import_root, harness.install_deps(corpus_cache)], tmp_path
    )

    def probe(without_accelerator: bool = False) -> subprocess.CompletedProcess[str]:
        # a torch older than 2.6 has no torch.accelerator: this one, with it taken away
        prelude = "del torch.accelerator\n" if without_accelerator else ""
        code = OLD_PIN_PROBE.format(prelude=prelude)
        return subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=600)  # fmt: skip

    before = probe()
    assert before.returncode != 0 and "NVIDIA" in before.stderr, before.stderr[-2000:]
    proc, _ = harness.gpu2tpu(["rewrite", "."], root)  # no option: the target is the pin
    output = proc.stdout + proc.stderr
    assert "target-torch is 1.8 (pyproject.toml: torch>=1.8.0)" in output, output[-3000:]
    rewritten, edits, _ = harness.read_summary(output)
    assert rewritten > 0 and edits > 0, output[-3000:]
    for without in (False, True):
        after = probe(without)
        assert after.returncode == 0, after.stderr[-2000:]
        assert after.stdout.split() == ["cpu"]
