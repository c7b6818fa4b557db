"""The codemod on torch's own Python sources (the installed torch): a stress test and the cost
of the safety net.

For every `.py` file under torch's package folder it runs `rewrite_source` twice, side by
side in one process: with the safety net (as shipped) and without it (`net.verified` and
`verify.new_problems` replaced by pass-throughs). It then checks every rewritten text:

- it compiles (every file that compiled before);
- it has no new undefined names, by the project's own verifier and, as a second opinion, by
  `ruff check --select F821` on the files before and after;
- rewriting it again changes nothing (idempotent);
- what the net withheld, file by file (rule, line, reason);

and prints the time ratio with/without the net and the peak memory of each worker of a
`gpu2tpu rewrite --diff -j 2` run over the same files.

    python benchmarks/torch_sources.py [--limit N] [--jobs 2] [--json out.json]

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


def rewrite_all(files: list[Path], root: Path, net_on: bool) -> tuple[dict, float]:
    """{relative path: (old, new, result)} for the files the rewrite changes; seconds spent."""
    from gpu2tpu.rewrite import net, source
    from gpu2tpu.rewrite.source import SourceError, rewrite_source

    real = net.verified
    if not net_on:
        net.verified = lambda original, first, rerun, spans, known=(): first.result  # type: ignore[assignment]
    out: dict = {}
    spent = 0.0
    try:
        for path in files:
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            start = time.perf_counter()
            try:
                result = rewrite_source(text)
            except SourceError:
                result = None
            spent += time.perf_counter() - start
            if result is not None and (result.new_text != text or result.withheld):
                out[str(path.relative_to(root))] = (text, result.new_text, result)
    finally:
        net.verified = real
        assert source.net.verified is real
    return out, spent


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
            "from gpu2tpu.rewrite import pool\n"
            "serve = pool._serve\n"
            "def measured(conn, work, parent):\n"
            "    try:\n"
            "        serve(conn, work, parent)\n"
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
        subprocess.run(
            [sys.executable, "-c", script, str(listing), str(jobs)],
            capture_output=True, text=True, env=env, cwd=root,
        )  # fmt: skip
        return [int(x) for x in peaks.read_text().split()] if peaks.exists() else []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="only the first N files")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="write the details here")
    args = parser.parse_args()
    root = torch_root()
    files = sources(root, args.limit)
    print(f"torch sources: {len(files)} files under {root}")
    plain, t_plain = rewrite_all(files, root, net_on=False)
    netted, t_net = rewrite_all(files, root, net_on=True)
    print(f"rewrite_source over all files: {t_plain:.1f} s without the net, {t_net:.1f} s with it")
    print(f"ratio with/without the net: {t_net / t_plain:.3f}")
    broken_plain = [n for n, (old, new, _) in plain.items() if compiles(old) and not compiles(new)]
    print(f"without the net: {len(plain)} files changed, {len(broken_plain)} no longer compile")
    failures: list[str] = []
    withheld: list[dict] = []
    again_changed = []
    from gpu2tpu.rewrite.source import rewrite_source

    for name, (old, new, result) in netted.items():
        if compiles(old) and not compiles(new):
            failures.append(f"{name}: does not compile after the rewrite")
        if new != old and rewrite_source(new).new_text != new:
            again_changed.append(name)
        for f in result.withheld:
            withheld.append({"file": name, "line": f.line, "code": f.code, "message": f.message})
    changed = {n: v for n, v in netted.items() if v[1] != v[0]}
    before = ruff_f821({n: old for n, (old, _, _) in changed.items()})
    after = ruff_f821({n: new for n, (_, new, _) in changed.items()})
    for name in changed:
        new_names = after.get(name, set()) - before.get(name, set())
        if new_names:
            failures.append(f"{name}: ruff F821 finds new undefined names {sorted(new_names)}")
    failures += [f"{n}: a second rewrite changes it again (not idempotent)" for n in again_changed]
    edits = sum(len(r.edits) for _, _, r in netted.values())
    print(
        f"with the net: {len(changed)} files changed, {edits} edits, {len(withheld)} fixes withheld"
    )
    for w in withheld:
        print(f"  withheld {w['file']}:{w['line']} {w['code']} {w['message']}")
    peaks = peak_memory(files, root, args.jobs)
    if peaks:
        print(
            f"peak memory per worker (-j {args.jobs}): "
            + ", ".join(f"{k / 1024:.0f} MiB" for k in peaks)
        )
    print(f"failures: {len(failures)}")
    for line in failures:
        print(f"  {line}")
    if args.json:
        args.json.write_text(json.dumps({"withheld": withheld, "failures": failures}, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
