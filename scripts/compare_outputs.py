"""Record what the codemod makes of real code, to prove a refactoring changed none of it.

    python scripts/compare_outputs.py record OUT.json [--sample N] [--jobs J] [--tree DIR]
        run rewrite_source in check mode (fix=False) and rewrite mode on every .py file of the
        installed torch package and of the corpus sdists (when `make corpus` fetched them),
        and of each DIR given (a source tree such as diffusers', benchmarks/rewrite_speed.py);
        write {path: {"check": ..., "rewrite": ...}} to OUT.json
    python scripts/compare_outputs.py compare BEFORE.json AFTER.json
        print the counts (files, results, differ) and the first differing paths; exit 1 on any

Each result is the new text's diff against the input plus every field of the Result (edits,
findings, device name, skipped, withheld, required imports), so a changed finding, message or
column shows up, not only a changed text. `--sample N` takes every k-th file (the same files on
every run) for a quicker check mid-way; the full set is the proof.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

MODES = {"check": {"fix": False}, "rewrite": {}}


def torch_files() -> Iterator[tuple[str, str]]:
    """(name, text) of every .py file of the torch this interpreter imports."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return
    root = Path(spec.origin).parent
    for path in sorted(root.rglob("*.py")):
        yield f"torch/{path.relative_to(root)}", path.read_text(encoding="utf-8", errors="replace")


def corpus_files() -> Iterator[tuple[str, str]]:
    """(name, text) of every .py member of the corpus sdists, when they were fetched."""
    cache = Path(
        os.environ.get("GPU2TPU_CORPUS_CACHE") or Path.home() / ".cache" / "gpu2tpu-corpus"
    )
    for sdist in sorted((cache / "sdists").glob("*")):
        if sdist.name.endswith((".tar.gz", ".tgz")):
            with tarfile.open(sdist) as tar:
                for member in sorted(tar.getmembers(), key=lambda m: m.name):
                    handle = tar.extractfile(member) if member.name.endswith(".py") else None
                    if handle is not None:
                        text = handle.read().decode("utf-8", errors="replace")
                        yield f"corpus/{member.name}", text
        elif sdist.suffix == ".zip":
            with zipfile.ZipFile(sdist) as archive:
                for name in sorted(n for n in archive.namelist() if n.endswith(".py")):
                    text = archive.read(name).decode("utf-8", errors="replace")
                    yield f"corpus/{name}", text


def tree_files(root: Path) -> Iterator[tuple[str, str]]:
    """(name, text) of every .py file under ROOT, named from ROOT's own name."""
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        yield f"{root.name}/{path.relative_to(root)}", text


def _record_one(item: tuple[str, str]) -> tuple[str, dict[str, object]]:
    from gpu2tpu.rewrite.core.model import Options
    from gpu2tpu.rewrite.core.source import rewrite_source

    name, text = item
    out: dict[str, object] = {}
    for mode, changes in MODES.items():
        try:
            result = rewrite_source(text, Options(**changes))  # type: ignore[arg-type]
        except Exception as err:  # a crash is an output too: it must not change
            out[mode] = f"error: {type(err).__name__}: {err}"
            continue
        fields = dataclasses.asdict(result)
        diff = difflib.unified_diff(
            text.splitlines(keepends=True), result.new_text.splitlines(keepends=True), n=1
        )
        fields["new_text"] = "".join(diff)
        out[mode] = json.loads(json.dumps(fields, default=str))
    return name, out


def record(out: Path, sample: int, jobs: int, trees: list[Path]) -> None:
    items = list(torch_files()) + list(corpus_files())
    items += [item for tree in trees for item in tree_files(tree)]
    if sample:
        step = max(1, len(items) // sample)
        items = items[::step][:sample]
    results: dict[str, object] = {}
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for done, (name, value) in enumerate(pool.map(_record_one, items, chunksize=8), 1):
            results[name] = value
            if done % 250 == 0:
                print(f"{done}/{len(items)}", file=sys.stderr)
    out.write_text(json.dumps(results, sort_keys=True, indent=0))
    print(f"recorded {len(results)} files to {out}")


def compare(before_path: Path, after_path: Path) -> int:
    before = json.loads(before_path.read_text())
    after = json.loads(after_path.read_text())
    common = sorted(before.keys() & after.keys())
    differ = [
        (name, mode)
        for name in common
        for mode in MODES
        if before[name].get(mode) != after[name].get(mode)
    ]
    print(
        f"files: {len(common)} (only before: {len(before.keys() - after.keys())}, "
        f"only after: {len(after.keys() - before.keys())}); "
        f"results: {len(common) * len(MODES)}; differ: {len(differ)}"
    )
    for name, mode in differ[:20]:
        print(f"  {mode}: {name}")
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record the codemod's outputs")
    rec.add_argument("out", type=Path)
    rec.add_argument("--sample", type=int, default=0, help="only about N files (0: all)")
    rec.add_argument("--jobs", type=int, default=2, help="worker processes")
    rec.add_argument("--tree", type=Path, action="append", default=[], help="a source tree too")
    cmp = sub.add_parser("compare", help="compare two recordings")
    cmp.add_argument("before", type=Path)
    cmp.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    if args.command == "record":
        record(args.out, args.sample, args.jobs, args.tree)
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
