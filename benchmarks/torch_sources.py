"""The codemod on torch's own Python sources (the installed torch): a stress test and the cost
of the safety net.

One pass of `rewrite_source` over every `.py` file under torch's package folder, with the
safety net as shipped; the time spent inside the net (`net.verified`: checking each changed
text, and rerunning the rules when a check fails) is measured apart, so the ratio
with/without the net comes from the same run. Then every rewritten text is checked:

- it compiles (every file that compiled before); so is the text the rules made before the net
  looked at it (how many files the net saved);
- no new undefined names, by the project's verifier and, as a second opinion, by
  `ruff check --select F821` on the files before and after;
- rewriting it again changes nothing (idempotent);
- what the net withheld, file by file (rule, line, reason), printed as it happens;

and the peak memory of each worker of a `gpu2tpu rewrite --diff -j 2` run over the same files.

    python benchmarks/torch_sources.py [--limit N] [--jobs 2] [--json out.json] [--root DIR]

`--root DIR` runs the same checks on another tree (a checkout of a project that uses CUDA).

Exit status 1 when any rewritten file fails a check.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def torch_root() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        raise SystemExit("torch is not installed")
    return Path(spec.origin).parent


def sources(root: Path, limit: int | None) -> list[Path]:
    files = sorted(p for p in root.rglob("*.py") if p.is_file())
    return files[:limit] if limit else files


def rewrite_all(files: list[Path], root: Path) -> tuple[dict, float, float, list[str]]:
    """{relative path: (old, new, result)} for the files the rewrite changes or withholds in;
    seconds in `rewrite_source`; seconds of those inside the net; the files whose text before
    the net did not compile."""
    from gpu2tpu.rewrite.core import net
    from gpu2tpu.rewrite.core.source import SourceError, rewrite_source

    real = net.verified
    in_net = [0.0]
    unverified_broken: list[str] = []
    current = [""]

    def timed(original, first, *args, **kwargs):  # type: ignore[no-untyped-def]
        # the net's other arguments pass through as they come (its signature grows)
        start = time.perf_counter()
        try:
            if compiles(original) and not compiles(first.text):
                unverified_broken.append(current[0])
            return real(original, first, *args, **kwargs)
        finally:
            in_net[0] += time.perf_counter() - start

    net.verified = timed  # type: ignore[assignment]
    out: dict = {}
    spent = 0.0
    try:
        for path in files:
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            current[0] = name = str(path.relative_to(root))
            start = time.perf_counter()
            try:
                result = rewrite_source(text)
            except SourceError:
                result = None
            spent += time.perf_counter() - start
            if result is None or (result.new_text == text and not result.withheld):
                continue
            out[name] = (text, result.new_text, result)
            for f in result.withheld:
                print(f"  withheld {name}:{f.line} {f.code} {f.message}", flush=True)
    finally:
        net.verified = real
    return out, spent, in_net[0], unverified_broken


def compiles(text: str) -> bool:
    try:
        compile(text, "<check>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError):
        return False
    return True


def ruff_f821(texts: dict[str, str]) -> dict[str, set[str]]:
    """Undefined names per file, by ruff (names only: lines differ between the versions)."""
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, text in enumerate(texts.values()):
            p = Path(tmp) / f"f{i}.py"
            p.write_text(text, encoding="utf-8")
        proc = subprocess.run(
            [ruff, "check", "--isolated", "--select", "F821", "--output-format", "json",
             "--no-cache", tmp],
            capture_output=True, text=True,
        )  # fmt: skip
        found: dict[str, set[str]] = {name: set() for name in texts}
        names = list(texts)
        for item in json.loads(proc.stdout or "[]"):
            index = int(Path(item["filename"]).stem[1:])
            found[names[index]].add(item["message"].split("`")[1] if "`" in item["message"] else "")
        return found


def peak_memory(files: list[Path], root: Path, jobs: int) -> list[int]:
    """Peak resident memory (KiB) of each worker of a real `gpu2tpu rewrite --diff` run."""
    with tempfile.TemporaryDirectory() as tmp:
        listing = Path(tmp) / "files.txt"
        listing.write_text("\n".join(str(p) for p in files))
        script = (
            "import resource, sys, os\n"
            "from gpu2tpu.rewrite.files import pool\n"
            "serve = pool._serve\n"
            "def measured(*args, **kwargs):\n"
            "    try:\n"
            "        serve(*args, **kwargs)\n"
            "    finally:\n"
            "        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "        with open(os.environ['PEAKS'], 'a') as f:\n"
            "            f.write(f'{kib}\\n')\n"
            "pool._serve = measured\n"
            "from gpu2tpu.cli import main\n"
            "paths = open(sys.argv[1]).read().split('\\n')\n"
            "sys.exit(main(['rewrite', '--diff', '-q', '-j', sys.argv[2], *paths]))\n"
        )
        peaks = Path(tmp) / "peaks.txt"
        env = {**os.environ, "PEAKS": str(peaks)}
        ran = subprocess.run(
            [sys.executable, "-c", script, str(listing), str(jobs)],
            capture_output=True, text=True, env=env, cwd=tmp,
        )  # fmt: skip
        # its exit status tells nothing here (`rewrite --diff` exits 1 when it shows a
        # change); no peak written means the run itself failed
        if not peaks.exists():
            raise RuntimeError(f"the measured rewrite did not run (exit {ran.returncode}):\n"
                               f"{ran.stderr[-2000:]}")  # fmt: skip
        return [int(x) for x in peaks.read_text().split()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="only the first N files")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="write the details here")
    parser.add_argument(
        "--root", type=Path, default=None, help="another tree instead of torch's (a checkout)"
    )
    args = parser.parse_args()
    root = args.root.resolve() if args.root else torch_root()
    files = sources(root, args.limit)
    print(f"{'sources' if args.root else 'torch sources'}: {len(files)} files under {root}",
          flush=True)  # fmt: skip
    netted, spent, in_net, saved = rewrite_all(files, root)
    print(f"rewrite_source over all files: {spent:.1f} s, of which {in_net:.1f} s in the net")
    print(f"ratio with/without the net: {spent / max(spent - in_net, 1e-9):.3f}")
    print(f"texts that did not compile before the net looked at them: {len(saved)}")
    for name in saved:
        print(f"  {name}")
    failures: list[str] = []
    withheld: list[dict] = []
    from gpu2tpu.rewrite.core.source import rewrite_source

    changed = {n: v for n, v in netted.items() if v[1] != v[0]}
    for name, (old, new, result) in netted.items():
        if compiles(old) and not compiles(new):
            failures.append(f"{name}: does not compile after the rewrite")
        if new != old and rewrite_source(new).new_text != new:
            failures.append(f"{name}: a second rewrite changes it again (not idempotent)")
        for f in result.withheld:
            withheld.append({"file": name, "line": f.line, "code": f.code, "message": f.message})
    before = ruff_f821({n: old for n, (old, _, _) in changed.items()})
    after = ruff_f821({n: new for n, (_, new, _) in changed.items()})
    for name in changed:
        new_names = after.get(name, set()) - before.get(name, set())
        if new_names:
            failures.append(f"{name}: ruff F821 finds new undefined names {sorted(new_names)}")
    edits = sum(len(r.edits) for _, _, r in netted.values())
    print(f"{len(changed)} files changed, {edits} edits, {len(withheld)} fixes withheld")
    peaks = peak_memory(files, root, args.jobs)
    if peaks:
        mib = ", ".join(f"{k / 1024:.0f} MiB" for k in peaks)
        print(f"peak memory per worker (-j {args.jobs}): {mib}")
    print(f"failures: {len(failures)}")
    for line in failures:
        print(f"  {line}")
    if args.json:
        args.json.write_text(json.dumps({"withheld": withheld, "failures": failures}, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
