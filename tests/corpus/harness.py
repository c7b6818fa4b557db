"""The real-world regression corpus: pinned PyPI sdists, rewritten by the real CLI, then checked.

A fixture written here only shows what its author already thought of; code nobody here wrote
shows the rest. For each package in manifest.toml this module

1. downloads the sdist once into a cache (PyPI's JSON API, sha256 checked against the manifest),
2. unpacks it twice, runs `gpu2tpu rewrite .` in one copy (as a user would, in the project's
   root) and reads the counts from its summary,
3. checks that every file that compiled still compiles, that ruff's F821 (undefined name) finds
   nothing new, that every module that imported still imports, that the package's smoke run
   (smoke_*.py) gives the same numbers, and that a second rewrite changes nothing,
4. names the rules behind each failure (`gpu2tpu check --format json` on the original file) and
   the lines before and after, so a failure can be reproduced from the report alone.

tests/test_corpus.py asserts that no package has a failure; scripts/corpus.py prints the table
for the README and writes the failure list.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tarfile
import time
import tomllib
import urllib.parse
import urllib.request
import warnings
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
MANIFEST = HERE / "manifest.toml"
DEPS_LOCK = REPO / "requirements" / "corpus.lock"
CACHE_ENV = "GPU2TPU_CORPUS_CACHE"
DEFAULT_CACHE = Path.home() / ".cache" / "gpu2tpu-corpus"
PYPI_JSON = "https://pypi.org/pypi/{name}/json"
# Subprocess limits: one CLI run over a whole package, one import probe or smoke run.
CLI_TIMEOUT = 1800
RUN_TIMEOUT = 900


def installed_torch() -> str:
    """The installed torch as MAJOR.MINOR: the rewrite's --target-torch. The smoke runs use
    this torch, and the packages' own pins (torch>=1.8, >=2.0, ...) would hold most fixes
    back (they are reported instead), leaving little of the rewrite to test."""
    major, minor = importlib.metadata.version("torch").split(".")[:2]
    return f"{major}.{minor}"


class CorpusError(Exception):
    """The corpus could not be prepared (download, hash, install): not a finding about gpu2tpu."""


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    sdist: str
    sha256: str
    import_root: str
    import_name: str
    smoke: str


@dataclass
class Failure:
    """One way the rewrite broke a package; `kind` is one of KINDS."""

    package: str
    kind: str
    path: str | None
    line: int | None
    detail: str
    codes: tuple[str, ...] = ()
    before: str = ""  # the original lines the failing edit came from
    after: str = ""  # what the rewrite made of them


KINDS = (
    "tool error",
    "compile error",
    "new undefined name",
    "import failure",
    "smoke crash",
    "smoke mismatch",
    "non-idempotent",
)


@dataclass
class PackageResult:
    package: Package
    files: int = 0
    compiled: int = 0
    rewritten: int = 0
    edits: int = 0
    findings: int = 0
    withheld: int = 0
    check_s: float | None = None
    rewrite_s: float = 0.0
    failures: list[Failure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- manifest, download, install


def load_manifest(path: Path = MANIFEST) -> list[Package]:
    data = tomllib.loads(path.read_text())
    return [Package(**entry) for entry in data["package"]]


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(path: Path, sha256: str) -> None:
    """Raise CorpusError unless PATH's content has this sha256."""
    actual = sha256_of(path)
    if actual != sha256:
        raise CorpusError(f"{path}: sha256 {actual} does not match the manifest's {sha256}")


def sdist_url(pkg: Package) -> str:
    """The sdist's download address, from PyPI's JSON API (checked against the manifest)."""
    api = PYPI_JSON.format(name=pkg.name)
    try:
        with urllib.request.urlopen(api, timeout=120) as response:
            data = json.load(response)
    except OSError as err:
        raise CorpusError(f"{pkg.name}: cannot read {api}: {err}") from None
    for entry in data.get("releases", {}).get(pkg.version, []):
        if entry.get("filename") == pkg.sdist and entry.get("packagetype") == "sdist":
            if entry.get("digests", {}).get("sha256") != pkg.sha256:
                raise CorpusError(f"{pkg.sdist}: PyPI lists another sha256 than the manifest")
            return urllib.parse.urljoin(api, entry["url"])
    raise CorpusError(f"{pkg.name} {pkg.version}: PyPI has no sdist named {pkg.sdist}")


def fetch(pkg: Package, cache: Path) -> Path:
    """The verified sdist in the cache, downloaded when missing or damaged."""
    target = cache / "sdists" / pkg.sdist
    if target.exists():
        try:
            verify(target, pkg.sha256)
            return target
        except CorpusError:
            target.unlink()
    target.parent.mkdir(parents=True, exist_ok=True)
    url = sdist_url(pkg)
    part = target.with_name(target.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=300) as response, part.open("wb") as out:
            while block := response.read(1 << 20):
                out.write(block)
    except OSError as err:
        part.unlink(missing_ok=True)
        raise CorpusError(f"{pkg.sdist}: download from {url} failed: {err}") from None
    try:
        verify(part, pkg.sha256)
    except CorpusError:
        part.unlink()
        raise
    part.replace(target)
    return target


# torchvision's release for each torch minor the corpus runs on (torchvision's README,
# "Installation"; 0.29.2 checked here with torch 2.15.0: its C++ ops load and `nms` runs):
# the build for another torch fails to load its ops. requirements/corpus.lock pins the one
# for the development lock's torch; `make test-all` runs the corpus on the others too.
TORCHVISION_FOR_TORCH = {"2.6": "0.21.0", "2.9": "0.24.0", "2.12": "0.27.1", "2.15": "0.29.2"}


def deps_requirements() -> str:
    """requirements/corpus.lock, with the torchvision built for the installed torch."""
    torchvision = TORCHVISION_FOR_TORCH.get(installed_torch())
    lines = DEPS_LOCK.read_text(encoding="utf-8").splitlines()
    if torchvision is not None:
        lines = [f"torchvision=={torchvision}" if ln.startswith("torchvision==") else ln
                 for ln in lines]  # fmt: skip
    return "\n".join(lines) + "\n"


def deps_dir(cache: Path) -> Path:
    """One folder per torch minor (each torch environment of `make test-all` has its own)."""
    key = hashlib.sha256(deps_requirements().encode()).hexdigest()[:16]
    return cache / f"deps-torch{installed_torch()}-{key}"


def install_deps(cache: Path) -> Path:
    """requirements/corpus.lock installed into a folder of its own (for PYTHONPATH), once."""
    target = deps_dir(cache)
    stamp = target / ".complete"
    if stamp.exists():
        return target
    partial = target.with_name(target.name + ".part")
    subprocess.run(["rm", "-rf", str(partial)], check=True)
    partial.mkdir(parents=True)
    requirements = partial / "requirements.txt"
    requirements.write_text(deps_requirements(), encoding="utf-8")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--only-binary", ":all:",
           "--target", str(partial), "-r", str(requirements)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise CorpusError(f"pip could not install {DEPS_LOCK.name}:\n{proc.stderr[-3000:]}")
    subprocess.run(["rm", "-rf", str(target)], check=True)
    partial.rename(target)
    stamp.touch()
    for old in cache.glob(f"deps-torch{installed_torch()}-*"):
        if old != target:
            subprocess.run(["rm", "-rf", str(old)], check=True)
    return target


def prepare(cache: Path | None = None) -> Path:
    """Download every sdist and install the dependencies; return the cache folder."""
    cache = cache or cache_dir()
    for pkg in load_manifest():
        fetch(pkg, cache)
    install_deps(cache)
    return cache


def extract(sdist: Path, dest: Path) -> Path:
    """Unpack SDIST under DEST; return its one top-level folder."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist) as tar:
        tar.extractall(dest, filter="data")
    (root,) = [p for p in dest.iterdir() if p.is_dir()]
    return root


# ---------------------------------------------------------------- checks on a source tree


def python_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.py") if p.is_file())


def compile_error(path: Path) -> tuple[int | None, str] | None:
    """None when the file compiles, else (line, message)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
        except SyntaxError as err:
            return err.lineno, f"{type(err).__name__}: {err.msg}"
        except ValueError as err:  # null bytes
            return None, f"ValueError: {err}"
    return None


def undefined_names(root: Path) -> list[dict]:
    """ruff's F821 diagnostics under ROOT (its own configuration ignored)."""
    ruff = Path(sys.executable).with_name("ruff")
    cmd = [str(ruff) if ruff.exists() else "ruff", "check", "--isolated", "--no-cache",
           "--select", "F821", "--output-format", "json", "--exit-zero", "."]  # fmt: skip
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=CLI_TIMEOUT)
    if proc.returncode:
        raise CorpusError(f"ruff failed in {root}: {proc.stderr[-2000:]}")
    out = []
    for d in json.loads(proc.stdout or "[]"):
        if d.get("code") != "F821":  # ruff also reports syntax errors here (code null)
            continue
        rel = os.path.relpath(d["filename"], root)
        out.append({"path": rel, "line": d["location"]["row"], "message": d["message"]})
    return out


def new_undefined(before: list[dict], after: list[dict]) -> list[dict]:
    """The F821 diagnostics of AFTER that BEFORE did not have (matched by file and message,
    since the rewrite moves lines)."""
    extra = Counter((d["path"], d["message"]) for d in after)
    extra.subtract(Counter((d["path"], d["message"]) for d in before))
    out = []
    for d in after:
        key = (d["path"], d["message"])
        if extra[key] > 0:
            extra[key] -= 1
            out.append(d)
    return out


def compare(expected: object, actual: object, where: str = "") -> list[str]:
    """Differences between two smoke results: tensors with torch.testing.assert_close,
    containers item by item, anything else with ==."""
    import torch

    if isinstance(expected, torch.Tensor) or isinstance(actual, torch.Tensor):
        try:
            torch.testing.assert_close(actual, expected)
        except AssertionError as err:
            return [f"{where}: {' '.join(str(err).split())[:400]}"]
        return []
    if isinstance(expected, dict) and isinstance(actual, dict):
        if expected.keys() != actual.keys():
            return [f"{where}: keys {sorted(expected)} became {sorted(actual)}"]
        return [m for k in expected for m in compare(expected[k], actual[k], f"{where}.{k}")]
    if isinstance(expected, list | tuple) and isinstance(actual, list | tuple):
        if len(expected) != len(actual):
            return [f"{where}: {len(expected)} items became {len(actual)}"]
        found = [m for i, (e, a) in enumerate(zip(expected, actual, strict=True))
                 for m in compare(e, a, f"{where}[{i}]")]  # fmt: skip
        if len(found) > 3:  # a token list that went another way: one line, not hundreds
            return [*found[:2], f"{where}: {len(found)} of {len(expected)} items differ"]
        return found
    if type(expected) is not type(actual) or expected != actual:
        return [f"{where}: {expected!r:.200} became {actual!r:.200}"]
    return []


# ---------------------------------------------------------------- running things


def run_env(pythonpath: Iterable[Path], scratch: Path) -> dict[str, str]:
    """The environment of an import probe or smoke run: the package first on the path, one
    thread (same numbers every run), no network, caches and settings under SCRATCH."""
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join(str(p) for p in pythonpath),
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONHASHSEED="0",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        HF_HOME=str(scratch / "hf"),
        TORCH_HOME=str(scratch / "torch"),
        XDG_CACHE_HOME=str(scratch / "cache"),
        NUMBA_CACHE_DIR=str(scratch / "numba"),
        MPLBACKEND="Agg",
        YOLO_CONFIG_DIR=str(scratch / "yolo"),
        YOLO_AUTOINSTALL="false",
        YOLO_OFFLINE="true",
        TQDM_DISABLE="1",
    )
    return env


def gpu2tpu(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    """The real command line, timed."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "gpu2tpu", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=CLI_TIMEOUT)  # fmt: skip
    return proc, time.perf_counter() - start


def run_pair(commands: list[tuple[list[str], dict[str, str], Path]]) -> list[tuple[int, str]]:
    """Run commands side by side (original and rewritten); (exit code, output tail) each."""
    procs = []
    for cmd, env, cwd in commands:
        log = (cwd / f"log-{len(procs)}.txt").open("w+")
        procs.append((subprocess.Popen(cmd, env=env, cwd=cwd, stdout=log, stderr=log), log))
    out = []
    for proc, log in procs:
        try:
            code = proc.wait(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        log.seek(0)
        out.append((code, log.read()[-4000:]))
        log.close()
    return out


SUMMARY = re.compile(
    r"(\d+) files? (?:would be )?rewritten.*?(\d+) edits?, (\d+) findings? left", re.S
)
WITHHELD_SUMMARY = re.compile(r"^Fixes withheld[^:\n]*: (\d+)", re.M)
ERROR_LINE = re.compile(r"^error: (.+?): (.*)$", re.M)


def read_summary(output: str) -> tuple[int, int, int]:
    """(files rewritten, edits, findings left) from the rewrite's closing lines."""
    match = SUMMARY.search(output)
    if not match:
        raise CorpusError(f"no summary in the rewrite's output:\n{output[-2000:]}")
    return int(match[1]), int(match[2]), int(match[3])


def read_withheld(output: str) -> int:
    match = WITHHELD_SUMMARY.search(output)
    if match:
        return int(match[1])
    return sum(1 for line in output.splitlines() if re.search(r"\bwithheld\b", line, re.I)
               and re.match(r"\S+:\d+:\d+: G2T", line))  # fmt: skip


# ---------------------------------------------------------------- attribution


def hunk_at(before: str, after: str, line: int | None) -> tuple[str, str, int, int]:
    """The changed lines around LINE of AFTER: (original text, rewritten text, first and last
    original line, 1-based). With no line, the first change."""
    a, b = before.splitlines(), after.splitlines()
    ops = [op for op in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
           if op[0] != "equal"]  # fmt: skip
    if not ops:
        return "", "", 0, 0
    if line is None:
        op = ops[0]
    else:
        op = min(ops, key=lambda o: 0 if o[3] < line <= max(o[4], o[3] + 1) else
                 min(abs(line - o[3] - 1), abs(line - o[4])))  # fmt: skip
    _, i1, i2, j1, j2 = op
    lo, hi = max(i1 - 1, 0), min(i2 + 1, len(a))  # one line of context each side
    return "\n".join(a[lo:hi]), "\n".join(b[max(j1 - 1, 0) : min(j2 + 1, len(b))]), i1 + 1, i2


@functools.cache
def check_records(orig_root: Path, rel: str) -> tuple[dict, ...]:
    """`gpu2tpu check --format json` on one original file (once per file)."""
    args = ["check", "--format", "json", "-j", "1", "--target-torch", installed_torch(), rel]
    proc, _ = gpu2tpu(args, orig_root)
    try:
        return tuple(json.loads(proc.stdout)["findings"])
    except (ValueError, KeyError):
        return ()


def rules_between(orig_root: Path, rel: str, first: int, last: int) -> tuple[str, ...]:
    """The fixes `gpu2tpu check` lists on original lines FIRST..LAST of REL (a line or two of
    slack: a fix may span the statement)."""
    records = check_records(orig_root, rel)
    codes = sorted({r["code"] for r in records
                    if r.get("fixable") and first - 2 <= r["line"] <= last + 2})  # fmt: skip
    return tuple(codes)


def attribute(failure: Failure, orig_root: Path, new_root: Path) -> Failure:
    """Fill in the original and rewritten lines and the rules that made the change."""
    if not failure.path:
        return failure
    old, new = orig_root / failure.path, new_root / failure.path
    if not (old.exists() and new.exists()):
        return failure
    before, after = old.read_text(errors="replace"), new.read_text(errors="replace")
    if before == after:
        return failure
    failure.before, failure.after, first, last = hunk_at(before, after, failure.line)
    failure.codes = rules_between(orig_root, failure.path, first, last)
    return failure


# ---------------------------------------------------------------- one package


def run_package(
    pkg: Package, cache: Path, work: Path, *, time_check: bool = False
) -> PackageResult:
    """Rewrite one package in WORK and check it; the failures are in the result."""
    result = PackageResult(pkg)
    sdist = fetch(pkg, cache)
    deps = install_deps(cache)
    orig = extract(sdist, work / "orig")
    new = extract(sdist, work / "new")
    scratch = work / "scratch"
    scratch.mkdir()
    files = python_files(orig)
    result.files = len(files)
    broken_before = {f for f in files if compile_error(orig / f)}
    result.compiled = len(files) - len(broken_before)
    f821_before = undefined_names(orig)

    def fail(kind: str, path: str | None, line: int | None, detail: str) -> None:
        result.failures.append(attribute(Failure(pkg.name, kind, path, line, detail), orig, new))

    target = ["--target-torch", installed_torch()]
    if time_check:
        proc, result.check_s = gpu2tpu(["check", "--format", "json", *target, "."], new)
        if proc.returncode == 2:
            result.notes.append(f"check exited 2: {proc.stderr.strip()[-500:]}")

    proc, result.rewrite_s = gpu2tpu(["rewrite", *target, "."], new)
    output = proc.stdout + proc.stderr
    if proc.returncode not in (0, 1) and not ERROR_LINE.search(output):
        raise CorpusError(f"gpu2tpu rewrite exited {proc.returncode}:\n{output[-3000:]}")
    _, result.edits, result.findings = read_summary(output)
    result.withheld = read_withheld(output)
    for path, reason in ERROR_LINE.findall(output):
        rel = os.path.relpath(os.path.join(new, path), new)  # the path as printed, from `new`
        if rel not in broken_before:
            fail("tool error", rel, None, reason)

    changed = [f for f in files if (orig / f).read_bytes() != (new / f).read_bytes()]
    result.rewritten = len(changed)
    broken_after = set()
    for rel in changed:
        if rel in broken_before:
            continue
        error = compile_error(new / rel)
        if error:
            broken_after.add(rel)
            fail("compile error", rel, error[0], error[1])
    for d in new_undefined(f821_before, undefined_names(new)):
        if d["path"] not in broken_after:  # ruff guesses names in a file it cannot parse
            fail("new undefined name", d["path"], d["line"], d["message"])

    # Imports: every module that imports from the original imports from the rewrite.
    probe = str(HERE / "probe_imports.py")
    sides = []
    for side, root in (("orig", orig), ("new", new)):
        where = scratch / side
        where.mkdir()
        src = root / pkg.import_root
        sides.append(([sys.executable, probe, str(src), pkg.import_name, str(where / "imports.json")],
                      run_env([src, deps], where), where))  # fmt: skip
    for (code, log), (_, _, where) in zip(run_pair(sides), sides, strict=True):
        if code or not (where / "imports.json").exists():
            raise CorpusError(f"{pkg.name}: import probe died in {where.name}:\n{log}")
    imports = [json.loads((scratch / s / "imports.json").read_text()) for s in ("orig", "new")]
    src_prefix = pkg.import_root.rstrip("/") + "/" if pkg.import_root not in ("", ".") else ""
    broken: dict[tuple, list[str]] = {}  # one failure per cause, not per module it takes down
    for module, err in sorted(imports[1].items()):
        if imports[0].get(module, "missing") is None and err is not None:
            path = src_prefix + err["file"] if err["file"] else None
            broken.setdefault((path, err["line"], err["error"]), []).append(module)
    for (path, line, error), modules in broken.items():
        more = f" (and {len(modules) - 1} more modules)" if len(modules) > 1 else ""
        fail("import failure", path, line, f"import {modules[0]}{more}: {error}")

    # Smoke run: the same numbers from the original and the rewritten package.
    smoke = str(HERE / pkg.smoke)
    runs = []
    for side, root in (("orig", orig), ("new", new)):
        where = scratch / side
        src = root / pkg.import_root
        runs.append(([sys.executable, smoke, str(where / "smoke.pt"), str(where)],
                     run_env([src, deps], where), where))  # fmt: skip
    (code0, log0), (code1, log1) = run_pair(runs)
    if code0:
        raise CorpusError(f"{pkg.name}: the smoke run fails on the original sources:\n{log0}")
    if code1:
        path, line = last_frame(log1, new)
        fail("smoke crash", path, line, tail(log1))
    else:
        import torch

        expected = torch.load(scratch / "orig" / "smoke.pt", weights_only=False)
        actual = torch.load(scratch / "new" / "smoke.pt", weights_only=False)
        differences = compare(expected, actual, Path(pkg.smoke).name)
        if differences:
            more = f"\n({len(differences) - 12} more)" if len(differences) > 12 else ""
            fail("smoke mismatch", None, None, "\n".join(differences[:12]) + more)

    # Idempotent: a second rewrite of the rewritten files changes nothing.
    if changed:
        snapshot = {f: (new / f).read_bytes() for f in changed}
        gpu2tpu(["rewrite", *target, *changed], new)
        for rel, text in snapshot.items():
            again = (new / rel).read_bytes()
            if again != text:
                before, after, first, _ = hunk_at(text.decode(errors="replace"),
                                                  again.decode(errors="replace"), None)  # fmt: skip
                result.failures.append(Failure(
                    pkg.name, "non-idempotent", rel, first,
                    "a second rewrite changed the file again", (), before, after,
                ))  # fmt: skip
    return result


HELD_BACK = re.compile(r"^Fixes that need a newer torch than target-torch ([^:]+): (\d+)", re.M)


@dataclass
class OwnPins:
    """A dry run (`rewrite --check`) with target-torch read from the package's own pins."""

    package: Package
    target: str
    would_rewrite: int
    edits: int
    findings: int
    held_back: int


def own_pins_counts(pkg: Package, cache: Path, work: Path) -> OwnPins:
    root = extract(fetch(pkg, cache), work / "pins")
    proc, _ = gpu2tpu(["rewrite", "--check", "-q", "."], root)
    output = proc.stdout + proc.stderr
    rewritten, edits, findings = read_summary(output)
    held = HELD_BACK.search(output)
    target = held[1] if held else "(none)"
    return OwnPins(pkg, target, rewritten, edits, findings, int(held[2]) if held else 0)


def own_pins_table(rows: list[OwnPins]) -> str:
    out = ["| package | target-torch from its pins | would rewrite | edits | findings "
           "| fixes held back |", "|---|---|--:|--:|--:|--:|"]  # fmt: skip
    for r in rows:
        out.append(f"| {r.package.name} {r.package.version} | {r.target} | {r.would_rewrite} "
                   f"| {r.edits} | {r.findings} | {r.held_back} |")  # fmt: skip
    return "\n".join(out)


def tail(log: str, lines: int = 6) -> str:
    return "\n".join(log.strip().splitlines()[-lines:])


def last_frame(log: str, root: Path) -> tuple[str | None, int | None]:
    """The innermost traceback frame inside ROOT, as (relative path, line)."""
    frames = re.findall(r'File "([^"]+)", line (\d+)', log)
    inside = [(p, n) for p, n in frames if p.startswith(str(root))]
    if not inside:
        return None, None
    path, line = inside[-1]
    return os.path.relpath(path, root), int(line)


# ---------------------------------------------------------------- renderings


def table(results: list[PackageResult]) -> str:
    """The per-package table (Markdown), with a total row."""
    rows = ["| package | files | rewritten | edits | findings | withheld | failures "
            "| check | rewrite |", "|---|--:|--:|--:|--:|--:|--:|--:|--:|"]  # fmt: skip

    def secs(v: float | None) -> str:
        return "" if v is None else f"{v:.0f} s"

    for r in results:
        rows.append(
            f"| {r.package.name} {r.package.version} | {r.files} | {r.rewritten} | {r.edits} "
            f"| {r.findings} | {r.withheld} | {len(r.failures)} | {secs(r.check_s)} "
            f"| {secs(r.rewrite_s)} |"
        )

    def total(attr: str) -> int:
        return sum(getattr(r, attr) for r in results)

    checks = [r.check_s for r in results if r.check_s is not None]
    rows.append(
        f"| **total** | {total('files')} | {total('rewritten')} | {total('edits')} "
        f"| {total('findings')} | {total('withheld')} "
        f"| {sum(len(r.failures) for r in results)} "
        f"| {secs(sum(checks)) if checks else ''} | {secs(total('rewrite_s'))} |"
    )
    return "\n".join(rows)


def failure_text(f: Failure) -> str:
    where = f.path or "(whole package)"
    if f.line:
        where += f":{f.line}"
    codes = ", ".join(f.codes) if f.codes else "no fix listed by check on these lines"
    parts = [f"- **{f.kind}** in {f.package}, `{where}` (rules: {codes})", "", "  ```text"]
    parts += ["  " + line for line in f.detail.splitlines()] + ["  ```"]
    if f.before or f.after:
        parts += ["", "  The original lines and what the rewrite made of them (in the file's context):",
                  "", "  ```python", "  # original"]  # fmt: skip
        parts += ["  " + line for line in f.before.splitlines()]
        parts += ["  # rewritten"] + ["  " + line for line in f.after.splitlines()] + ["  ```"]
    return "\n".join(parts)


def failures_markdown(results: list[PackageResult]) -> str:
    lines = []
    for r in results:
        for f in r.failures:
            lines += [failure_text(f), ""]
    return "\n".join(lines) if lines else "No failures.\n"
