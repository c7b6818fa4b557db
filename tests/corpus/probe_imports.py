"""Import every module of one package and say which import and which fail, and where.

Run as `python probe_imports.py ROOT PACKAGE OUT` with ROOT on PYTHONPATH; writes a JSON object
{module: null | {"error": "...", "file": path or null, "line": n or null}} to OUT. The corpus
test runs it on the original and on the rewritten sources: every module that imported before
must import after. `__main__` modules are not imported (they run a program).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
import warnings
from pathlib import Path


def module_names(root: Path, package: str) -> list[str]:
    names = []
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__main__":
            continue
        if parts[-1] == "__init__":
            parts.pop()
        if all(p.isidentifier() for p in parts):
            names.append(".".join(parts))
    return names


def where(err: BaseException, root: Path) -> tuple[str | None, int | None]:
    """The innermost frame inside ROOT, or the syntax error's own position."""
    if isinstance(err, SyntaxError) and err.filename:
        return err.filename, err.lineno
    inside = [
        f for f in traceback.extract_tb(err.__traceback__) if f.filename.startswith(str(root))
    ]
    return (inside[-1].filename, inside[-1].lineno) if inside else (None, None)


def main(root: str, package: str, out: str) -> None:
    base = Path(root).resolve()
    warnings.simplefilter("ignore")
    results: dict[str, object] = {}
    for name in module_names(base, package):
        try:
            importlib.import_module(name)
        except BaseException as err:  # SystemExit too: a module may call exit()
            path, line = where(err, base)
            text = f"{type(err).__name__}: {err}".splitlines()[0][:300]
            if path:
                path = os.path.relpath(path, base)
            results[name] = {"error": text, "file": path, "line": line}
        else:
            results[name] = None
    Path(out).write_text(json.dumps(results, indent=1, sort_keys=True))
    sys.stdout.flush()
    os._exit(0)  # some packages start threads at import; do not wait for them


if __name__ == "__main__":
    main(*sys.argv[1:4])
