"""What the parse guard and the safety net cost, side by side in one process.

For each file of a tree it times `rewrite_source` in three set-ups, interleaved file by file
(so that a busy machine slows all three alike):

  bare    libcst parses the text directly and nothing is verified (the codemod before
          parsing.py and net.py);
  guard   Python's parser first, deep statements held aside (parsing.py), no verification;
          Python's tree also plans which top-level statements libcst parses at all (the
          statement-level path, docs/architecture.md), so on files where most statements
          hold no token the guard is faster than bare;
  net     as shipped: the guard, and every changed text verified (net.py, verify.py).

once as `check` (nothing is transformed, so nothing is verified: the guard's cost) and once as
`rewrite` (the net's cost, paid only by files whose text changes). Trees: the generated tree
of benchmarks/rewrite_speed.py (3,000 files, 10% with CUDA idioms) and torch's own sources.

    python benchmarks/safety_net_cost.py [--tree generated|torch|both] [--files 3000]
"""

from __future__ import annotations

import argparse
import ast
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from rewrite_speed import build_tree


@contextmanager
def setup(name: str) -> Iterator[None]:
    """Switch the guard and the net off as `name` says, for the duration."""
    from gpu2tpu.rewrite.core import net, parsing, source

    real_prepare, real_verified = source.prepare, net.verified
    if name in ("bare", "guard"):
        net.verified = lambda original, first, *rest, **kw: first.result  # type: ignore[assignment]
    if name == "bare":

        def prepare(text: str, tokens: object, planner: object = None) -> parsing.Prepared:
            # no plan either: the codemod before parsing.py parsed every statement
            prepared = parsing.Prepared(text, ast.Module(body=[], type_ignores=[]), text)
            prepared.module = parsing.parse_module(text)
            return prepared

        source.prepare = prepare  # type: ignore[assignment]
    try:
        yield
    finally:
        source.prepare, net.verified = real_prepare, real_verified


def measure(texts: list[str], fix: bool) -> dict[str, float]:
    from gpu2tpu.rewrite.core.model import Options
    from gpu2tpu.rewrite.core.source import SourceError, rewrite_source

    options = Options(fix=fix)
    spent = {"bare": 0.0, "guard": 0.0, "net": 0.0}

    def once(text: str) -> None:
        with suppress(SourceError, RecursionError):
            rewrite_source(text, options)

    for text in texts:
        for name in spent:
            with setup(name):
                start = time.perf_counter()
                once(text)
                spent[name] += time.perf_counter() - start
    return spent


def report(label: str, texts: list[str], changed: Callable[[], int]) -> None:
    check = measure(texts, fix=False)
    rewrite = measure(texts, fix=True)
    print(f"{label}: {len(texts)} files, {changed()} changed by the rewrite")
    print(
        f"  check:   bare {check['bare']:.2f} s, with the guard {check['guard']:.2f} s  "
        f"(ratio {check['guard'] / check['bare']:.3f})"
    )
    print(
        f"  rewrite: bare {rewrite['bare']:.2f} s, guard {rewrite['guard']:.2f} s, "
        f"guard and net {rewrite['net']:.2f} s  (net/guard {rewrite['net'] / rewrite['guard']:.3f}, "
        f"net/bare {rewrite['net'] / rewrite['bare']:.3f})"
    )


def read_all(paths: list[Path]) -> list[str]:
    texts = []
    for p in paths:
        try:
            texts.append(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            continue
    return texts


def count_changed(texts: list[str]) -> int:
    from gpu2tpu.rewrite.core.source import SourceError, rewrite_source

    n = 0
    for text in texts:
        with suppress(SourceError, RecursionError):
            n += rewrite_source(text).new_text != text
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", choices=["generated", "torch", "both"], default="generated")
    parser.add_argument("--files", type=int, default=3000, help="size of the generated tree")
    parser.add_argument("--limit", type=int, default=None, help="only the first N torch files")
    args = parser.parse_args()
    if args.tree in ("generated", "both"):
        with tempfile.TemporaryDirectory() as tmp:
            build_tree(Path(tmp), args.files)
            texts = read_all(sorted(Path(tmp).rglob("*.py")))
        report("generated tree (benchmarks/rewrite_speed.py)", texts, lambda: count_changed(texts))
    if args.tree in ("torch", "both"):
        import importlib.util

        spec = importlib.util.find_spec("torch")
        assert spec is not None and spec.origin is not None
        files = sorted(Path(spec.origin).parent.rglob("*.py"))[: args.limit]
        texts = read_all(files)
        report("torch's sources", texts, lambda: count_changed(texts))


if __name__ == "__main__":
    main()
