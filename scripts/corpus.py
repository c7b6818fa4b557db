"""The real-world regression corpus from the command line (tests/corpus/harness.py does the work).

    python scripts/corpus.py fetch                 download the pinned sdists, install their deps
    python scripts/corpus.py report [PACKAGE ...]  rewrite and check each package; print the
        README table (with `check` and `rewrite` times) and the failures;
        --failures PATH also writes the failure list (Markdown) to PATH

The cache is $GPU2TPU_CORPUS_CACHE (default ~/.cache/gpu2tpu-corpus).
"""

from __future__ import annotations

import argparse
import datetime
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from corpus import harness


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help="download the sdists and install the corpus dependencies")
    report = sub.add_parser("report", help="rewrite and check each package; print the table")
    report.add_argument("packages", nargs="*", help="names from the manifest (default: all)")
    report.add_argument("--failures", type=Path, help="write the failure list (Markdown) here")
    report.add_argument("--no-check", action="store_true", help="do not time `gpu2tpu check`")
    report.add_argument(
        "--own-pins", action="store_true",
        help="also dry-run each package with target-torch read from its own pins",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        start = time.perf_counter()
        cache = harness.prepare()
        prepared = time.perf_counter() - start
    except harness.CorpusError as err:
        print(f"corpus: error: {err}", file=sys.stderr)
        return 2
    if args.command == "fetch":
        print(f"corpus ready in {cache} ({prepared:.0f} s)")
        return 0
    packages = harness.load_manifest()
    if args.packages:
        unknown = set(args.packages) - {p.name for p in packages}
        if unknown:
            print(
                f"corpus: error: not in the manifest: {', '.join(sorted(unknown))}", file=sys.stderr
            )
            return 2
        packages = [p for p in packages if p.name in args.packages]
    results, pins = [], []
    for pkg in packages:
        work = Path(tempfile.mkdtemp(prefix=f"corpus-{pkg.name}-"))
        try:
            start = time.perf_counter()
            result = harness.run_package(pkg, cache, work, time_check=not args.no_check)
            result.notes.append(f"whole run {time.perf_counter() - start:.0f} s")
            if args.own_pins:
                pins.append(harness.own_pins_counts(pkg, cache, work))
        except harness.CorpusError as err:
            print(f"corpus: error: {err}", file=sys.stderr)
            return 2
        finally:
            shutil.rmtree(work, ignore_errors=True)
        results.append(result)
        print(f"{pkg.name}: {len(result.failures)} failures; {'; '.join(result.notes)}",
              file=sys.stderr)  # fmt: skip
    print(f"Measured {datetime.date.today().isoformat()} (corpus prepared in {prepared:.0f} s):\n")
    print(f"`gpu2tpu rewrite --target-torch {harness.installed_torch()}`:\n")
    print(harness.table(results))
    if pins:
        print("\nWith target-torch from each package's own pins (`gpu2tpu rewrite --check`):\n")
        print(harness.own_pins_table(pins))
    failures = harness.failures_markdown(results)
    print("\n" + failures)
    if args.failures:
        args.failures.write_text(
            f"# Corpus failures ({datetime.date.today().isoformat()})\n\n"
            f"{harness.table(results)}\n\n{failures}"
        )
    return int(any(r.failures for r in results))


if __name__ == "__main__":
    sys.exit(main())
