"""The edge of the codemod that touches files.

paths -> discovery (excludes) -> byte prefilter -> `rewrite_source` / `rewrite_notebook` ->
diff, or an atomic write only when the text changed. Files are processed in a process pool;
one bad file becomes one error line and never stops the others.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import functools
import io
import os
import re
import stat
import tempfile
import time
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from .model import CellFinding, Finding, Options

SOURCE_SUFFIXES = (".py", ".pyi", ".ipynb")
CUDA_SOURCE_SUFFIXES = (".cu", ".cuh")  # never rewritten; reported when Python code uses them
DEFAULT_EXCLUDES = (
    ".git",
    ".hg",
    ".svn",
    ".venv",
    "venv",
    ".tox",
    ".nox",
    "__pycache__",
    "build",
    "dist",
    "node_modules",
    "site-packages",
    ".eggs",
    "*.egg-info",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".ipynb_checkpoints",
)
DEFAULT_MAX_BYTES = 8 * 1024 * 1024


class Mode(StrEnum):
    CHECK = "check"  # report findings, write nothing
    WRITE = "write"  # rewrite files in place
    DIFF = "diff"  # print a unified diff, write nothing
    DRY = "dry"  # `rewrite --check`: say what would change, write nothing


class Status(StrEnum):
    UNCHANGED = "unchanged"
    REWRITTEN = "rewritten"
    WOULD_REWRITE = "would-rewrite"
    PREFILTERED = "skipped"  # no CUDA-ish token: never parsed
    EMPTY = "empty"
    ERROR = "error"


@dataclass(frozen=True)
class Config:
    """Engine settings, from the command line and `[tool.gpu2tpu]` in pyproject.toml."""

    options: Options = Options()
    exclude: tuple[str, ...] = ()
    max_bytes: int = DEFAULT_MAX_BYTES
    jobs: int = 0  # 0: all cores
    root: Path | None = None  # where `exclude` patterns are anchored
    # Process files in worker processes (also with one job), so that a crash in native code
    # costs one file, not the run (pool.py). Off only for callers that need one process.
    isolate: bool = True
    # The given paths, resolved (set by `run`): a symbolic link is written through to its
    # target only when the target lies inside one of them.
    roots: tuple[str, ...] = ()


@dataclass
class FileOutcome:
    path: str
    status: Status
    edits: list[CellFinding | Finding] = field(default_factory=list)
    findings: list[CellFinding | Finding] = field(default_factory=list)
    error: str | None = None
    cell_errors: list[str] = field(default_factory=list)
    diff: str = ""
    # Findings (also in `findings`) whose fix the safety net withheld: the text with it did
    # not verify (net.py).
    withheld: list[CellFinding | Finding] = field(default_factory=list)

    @property
    def is_notebook(self) -> bool:
        return self.path.endswith(".ipynb")


@dataclass
class RunReport:
    files: list[FileOutcome]
    discovery_errors: list[str]
    mode: Mode

    @property
    def errors(self) -> list[str]:
        return [*self.discovery_errors, *(f"{o.path}: {o.error}" for o in self.files if o.error)]

    def count(self, status: Status) -> int:
        return sum(1 for o in self.files if o.status is status)


# -- configuration -----------------------------------------------------------------------------


def find_project_root(start: Path) -> Path | None:
    for folder in (start, *start.parents):
        if (folder / "pyproject.toml").is_file():
            return folder
    return None


class ConfigError(ValueError):
    pass


def load_config(start: Path) -> dict:
    """`[tool.gpu2tpu]` of the nearest pyproject.toml above `start`, or {}."""
    import tomllib

    root = find_project_root(start)
    if root is None:
        return {}
    path = root / "pyproject.toml"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise ConfigError(f"{path}: cannot read [tool.gpu2tpu]: {err}") from None
    section = data.get("tool", {}).get("gpu2tpu", {})
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: [tool.gpu2tpu] must be a table")
    known = {"exclude", "select", "ignore", "unsafe-fixes", "max-file-size", "target-torch"}
    unknown = sorted(set(section) - known)
    if unknown:
        raise ConfigError(f"{path}: unknown [tool.gpu2tpu] key(s): {', '.join(unknown)}")
    section = dict(section)
    section["__root__"] = root
    return section


# -- discovery ---------------------------------------------------------------------------------


def _excluded(rel: str, name: str, patterns: Iterable[str]) -> bool:
    return bool(
        _exclude_pattern(tuple(patterns)).match(name)
        or _exclude_pattern(tuple(patterns)).match(rel)
    )


@functools.lru_cache(maxsize=64)
def _exclude_pattern(patterns: tuple[str, ...]) -> re.Pattern[str]:
    """A glob matches a name or a path; a plain path also excludes everything below it."""
    parts = []
    for pattern in patterns:
        parts.append(fnmatch.translate(pattern))
        plain = pattern.rstrip("/")
        parts.append(re.escape(plain) + r"(?:/.*)?\Z")
    return re.compile("|".join(f"(?:{p})" for p in parts) or r"(?!x)x")


def discover(
    paths: Iterable[str], config: Config, stale: list[str] | None = None
) -> tuple[list[str], list[str]]:
    """Source files under `paths` (explicit files are always taken), and one line per problem.

    A symbolic link to a file that is found anyway (its target is under the given paths too)
    is dropped, so that the file is rewritten once. `stale` collects the temporary files an
    interrupted write left beside the files found (`.NAME.PID.XXXXXXXX.gpu2tpu`).
    """
    files: list[str] = []
    errors: list[str] = []
    seen: set[str] = set()
    root = config.root
    patterns = (*DEFAULT_EXCLUDES, *config.exclude)

    resolved_root = root.resolve() if root is not None else None

    def rel_of(p: Path) -> str:
        return rel_from_root(p)[0]

    def rel_from_root(p: Path) -> tuple[str, bool]:
        """`p` relative to the root, and whether that held (else `p` as given)."""
        if resolved_root is None:
            return p.as_posix(), True
        try:
            return p.resolve().relative_to(resolved_root).as_posix(), True
        except (ValueError, OSError):
            return p.as_posix(), False

    def add(p: str) -> None:
        if p not in seen:
            seen.add(p)
            files.append(p)

    for raw in paths:
        if raw == "-":
            add("-")
            continue
        p = Path(raw)
        try:
            st = p.stat()
        except FileNotFoundError:
            reason = "broken symbolic link" if p.is_symlink() else "no such file or directory"
            errors.append(f"{raw}: {reason}")
            continue
        except OSError as err:
            errors.append(f"{raw}: {_os_reason(err)}")
            continue
        if stat.S_ISDIR(st.st_mode):
            # A folder named on the command line is wanted even if a pattern excludes it:
            # the patterns that match it (or a folder above it) do not apply inside it.
            rel = rel_of(p)
            active = tuple(
                pat
                for pat in patterns
                if not any(_excluded(part, Path(part).name, (pat,)) for part in _prefixes(rel))
            )
            for found in _walk(p, active, rel_from_root, errors, stale):
                add(found)
        else:
            add(raw)
            if stale is not None:
                stale.extend(_temporaries_of(p))
    return _without_duplicate_links(files), errors


def _without_duplicate_links(files: list[str]) -> list[str]:
    """Drop a symbolic link whose target is itself among `files` (it is rewritten as itself),
    and all but the first of several links to one target: each file is written once."""
    links = [f for f in files if f != "-" and os.path.islink(f)]
    if not links:
        return files
    seen = {os.path.realpath(f) for f in files if f != "-" and not os.path.islink(f)}
    drop = set()
    for link in links:
        target = os.path.realpath(link)
        if target in seen:
            drop.add(link)
        seen.add(target)
    return [f for f in files if f not in drop]


def inside(path: str, roots: Iterable[str]) -> bool:
    """Whether the resolved `path` is one of `roots` or lies below one of them."""
    return any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


def _prefixes(rel: str) -> list[str]:
    """`a/b/c` -> `a`, `a/b`, `a/b/c`."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def _walk(  # type: ignore[no-untyped-def]
    top: Path, patterns: tuple[str, ...], rel_of, errors: list[str], stale: list[str] | None
) -> Iterator[str]:
    def onerror(err: OSError) -> None:
        errors.append(f"{err.filename}: {_os_reason(err)}")

    # A folder's path relative to the root, by folder: an entry inside it that is not a
    # symbolic link is the folder's plus its name (`Path.resolve` per file costs a system
    # call per path component; on 3,000 files it was the largest part of discovery).
    # Only folders that lie under the root (or all, without one) are in `rels`.
    rels: dict[str, str] = {}

    def rel_in(folder: str, base: Path, name: str) -> tuple[str, bool]:
        path = base / name
        parent = rels.get(folder)
        if parent is None or os.path.islink(path):
            return rel_of(path)
        return (name if parent == "." else f"{parent}/{name}"), True

    for folder, dirnames, filenames in os.walk(top, onerror=onerror):
        base = Path(folder)
        if folder not in rels:
            rel, inside = rel_of(base)
            if inside:
                rels[folder] = rel
        kept = []
        for d in sorted(dirnames):
            rel, inside = rel_in(folder, base, d)
            if not _excluded(rel, d, patterns):
                kept.append(d)
                if inside and not os.path.islink(base / d):
                    rels[os.path.join(folder, d)] = rel
        dirnames[:] = kept
        for name in sorted(filenames):
            if stale is not None and _TEMPORARY.match(name):
                stale.append(str(base / name))
            if not name.endswith(SOURCE_SUFFIXES + CUDA_SOURCE_SUFFIXES):
                continue
            path = base / name
            if _excluded(rel_in(folder, base, name)[0], name, patterns):
                continue
            yield str(path)


# `write_atomic`'s temporary files: `.NAME.PID.XXXXXXXX.gpu2tpu` (older runs: no PID).
_TEMPORARY = re.compile(r"^\.(?P<name>.+?)\.(?:(?P<pid>\d+)\.)?[A-Za-z0-9_]{8}\.gpu2tpu$")
STALE_AFTER_S = 60.0  # a write takes milliseconds; a temporary this old was left behind


def _temporaries_of(path: Path) -> list[str]:
    prefix = f".{path.name}."
    try:
        names = os.listdir(path.parent)
    except OSError:
        return []
    return [
        str(path.parent / n)
        for n in names
        if n.startswith(prefix) and (m := _TEMPORARY.match(n)) and m["name"] == path.name
    ]


def remove_stale_temporaries(candidates: Iterable[str]) -> list[str]:
    """Delete the temporary files a killed run left: older than a minute, and written by a
    process that is gone (another run's temporary, in its write window, is left alone)."""
    removed = []
    now = time.time()
    for path in dict.fromkeys(candidates):
        match = _TEMPORARY.match(os.path.basename(path))
        if match is None:
            continue
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or now - st.st_mtime < STALE_AFTER_S:
            continue
        if match["pid"] and _alive(int(match["pid"])):
            continue
        try:
            os.unlink(path)
        except OSError:
            continue
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OverflowError:
        return False
    except PermissionError:
        return True
    return True


def _os_reason(err: OSError) -> str:
    if isinstance(err, PermissionError):
        return "permission denied"
    if err.errno == 40:  # ELOOP
        return "symbolic link loop"
    if isinstance(err, IsADirectoryError):
        return "is a directory"
    return err.strerror or str(err)


# -- one file ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Decoded:
    text: str
    encoding: str


def decode_source(data: bytes) -> _Decoded:
    """Decode Python source the way the interpreter does (BOM, PEP 263 cookie), strictly."""
    if b"\x00" in data:
        raise ValueError("binary file (contains NUL bytes), not Python source")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as err:
        raise ValueError(f"bad encoding declaration: {err.msg}") from None
    try:
        text = data.decode(encoding)
    except (UnicodeDecodeError, LookupError):
        declared = "declared" if encoding not in ("utf-8", "utf-8-sig") else "UTF-8"
        raise ValueError(f"not valid {declared} text ({encoding}); file left as it is") from None
    if encoding == "utf-8-sig":
        text = text.removeprefix("\ufeff")
    return _Decoded(text, encoding)


def process_file(path: str, config: Config, mode: Mode, tokens: tuple[bytes, ...]) -> FileOutcome:
    """Rewrite or check one file; every problem becomes `FileOutcome.error`."""
    try:
        return _process_file(path, config, mode, tokens)
    except RecursionError:
        return FileOutcome(
            path, Status.ERROR, error="too deeply nested to parse; file left as it is"
        )
    except Exception as err:  # a bug of ours must cost one file, not the run
        return FileOutcome(
            path,
            Status.ERROR,
            error=f"internal error ({type(err).__name__}: {err}); file left as it is "
            "(please report it)",
        )


def _process_file(path: str, config: Config, mode: Mode, tokens: tuple[bytes, ...]) -> FileOutcome:
    from .source import SourceError

    data = _read_or_outcome(path, config, tokens)
    if isinstance(data, FileOutcome):
        return data
    try:
        if path.endswith(".ipynb"):
            return _process_notebook(path, data, config, mode)
        decoded = decode_source(data)
        from .source import rewrite_source
        from .torch_target import rewrite_for_target

        result = rewrite_for_target(rewrite_source, decoded.text, config.options)
    except SourceError as err:
        where = f" (line {err.line}, col {err.col})" if err.line and err.col else ""
        where = where or (f" (line {err.line})" if err.line else "")
        return FileOutcome(path, Status.ERROR, error=f"{err.reason}{where}; file left as it is")
    except ValueError as err:
        return FileOutcome(path, Status.ERROR, error=str(err))
    outcome = FileOutcome(
        path,
        Status.UNCHANGED,
        edits=list(result.edits),
        findings=list(result.findings),
        withheld=list(result.withheld),
    )
    if result.new_text == decoded.text:
        return outcome
    return _finish(outcome, path, decoded.text, result.new_text, decoded.encoding, mode, config)


def _read_or_outcome(path: str, config: Config, tokens: tuple[bytes, ...]) -> bytes | FileOutcome:
    """The file's bytes when a rule may have something to say about them; else its outcome
    (unreadable, empty, or holding no token)."""
    try:
        data = _read(path, config)
    except (OSError, ValueError) as err:
        reason = _os_reason(err) if isinstance(err, OSError) else str(err)
        return FileOutcome(path, Status.ERROR, error=reason)
    if not data.strip():
        return FileOutcome(path, Status.EMPTY)
    if not holds_token(data, tokens) and not _notebook_tokens(path, data):
        return FileOutcome(path, Status.PREFILTERED)
    return data


def _settled(path: str, config: Config, tokens: tuple[bytes, ...]) -> FileOutcome | None:
    """The outcome of a file that holds no token or is empty; None for the others (`work`
    reads them again and reports what reading them says)."""
    try:
        outcome = _read_or_outcome(path, config, tokens)
    except Exception:  # reading is all this does; whatever it was, a worker meets it too
        return None
    if isinstance(outcome, FileOutcome) and outcome.status in (Status.EMPTY, Status.PREFILTERED):
        return outcome
    return None


def holds_token(data: bytes, tokens: tuple[bytes, ...]) -> bool:
    """Whether `data` holds one of the prefilter `tokens` (`source.prefilter_tokens`)."""
    return any(t in data for t in _fewest(tokens))


@functools.lru_cache(maxsize=8)
def _fewest(tokens: tuple[bytes, ...]) -> tuple[bytes, ...]:
    """The prefilter tokens that hold no other one (`cuda` stands for `cuda.amp`, `is_cuda`):
    a text holds one of these exactly when it holds one of all. Searched one by one: bytes'
    own search is about 1.5x faster than one regular expression of ~100 alternatives
    (Python's `re` tries each alternative at each position)."""
    return tuple(t for t in tokens if not any(o != t and o in t for o in tokens))


def _notebook_tokens(path: str, data: bytes) -> bool:
    """Notebooks have checks of their own (GPU runtime metadata, `!nvidia-smi`)."""
    if not path.endswith(".ipynb"):
        return False
    from .notebook import NOTEBOOK_TOKENS

    return any(t in data for t in NOTEBOOK_TOKENS)


def _read(path: str, config: Config) -> bytes:
    if path == "-":
        raise ValueError("standard input is handled by the caller")
    p = Path(path)
    st = p.stat()
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(21, "is a directory", path)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError("not a regular file")
    if st.st_size > config.max_bytes:
        mib = config.max_bytes / (1024 * 1024)
        raise ValueError(
            f"file is {st.st_size / (1024 * 1024):.1f} MiB, over the {mib:g} MiB limit "
            "(max-file-size in [tool.gpu2tpu]); file left as it is"
        )
    return p.read_bytes()


def _process_notebook(path: str, data: bytes, config: Config, mode: Mode) -> FileOutcome:
    from .notebook import NotebookError, local_module_findings, notebook_diff, rewrite_notebook
    from .torch_target import rewrite_for_target

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return FileOutcome(
            path, Status.ERROR, error="notebook is not valid UTF-8; file left as it is"
        )
    try:
        result = rewrite_for_target(rewrite_notebook, text, config.options)
    except NotebookError as err:
        return FileOutcome(path, Status.ERROR, error=f"{err.reason}; file left as it is")
    # The local modules it imports that hold CUDA code, unless this run rewrites them too.
    modules = local_module_findings(path, text, config.options, covered=config.roots)
    outcome = FileOutcome(
        path,
        Status.UNCHANGED,
        edits=list(result.edits),
        findings=[*result.findings, *modules],
        withheld=list(result.withheld),
        cell_errors=list(result.cell_errors),
    )
    if result.new_text == text:
        return outcome
    if mode is Mode.DIFF:
        outcome.diff = notebook_diff(path, text, result.new_text)
    return _finish(outcome, path, text, result.new_text, "utf-8", mode, config, diff_done=True)


def _finish(
    outcome: FileOutcome,
    path: str,
    old: str,
    new: str,
    encoding: str,
    mode: Mode,
    config: Config,
    diff_done: bool = False,
) -> FileOutcome:
    if mode is not Mode.CHECK and os.path.islink(path) and config.roots:
        target = os.path.realpath(path)
        if not inside(target, config.roots):
            outcome.status = Status.ERROR
            outcome.diff = ""
            outcome.error = (
                f"symbolic link to {target}, outside the given paths; left as it is "
                "(name the target to rewrite it)"
            )
            return outcome
    if mode is Mode.WRITE:
        try:
            write_atomic(path, new, encoding)
        except OSError as err:
            outcome.status = Status.ERROR
            outcome.error = f"cannot write: {_os_reason(err)}; file left as it is"
            return outcome
        outcome.status = Status.REWRITTEN
        return outcome
    outcome.status = Status.WOULD_REWRITE
    if mode is Mode.DIFF and not diff_done:
        outcome.diff = unified_diff(path, old, new)
    return outcome


def unified_diff(path: str, old: str, new: str) -> str:
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), path, path
    )
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def write_atomic(path: str, text: str, encoding: str) -> None:
    """Replace `path` with `text` in one step, keeping encoding, BOM, newlines, mode and owner.

    A symbolic link is written through: its target is replaced, the link stays. The temporary
    file is named `.NAME.PID.XXXXXXXX.gpu2tpu`, so that a later run can tell one a killed
    run left behind (`remove_stale_temporaries`).
    """
    target = Path(os.path.realpath(path))
    data = text.encode(encoding)
    if encoding == "utf-8-sig" and not data.startswith(b"\xef\xbb\xbf"):
        data = b"\xef\xbb\xbf" + data
    st = target.stat()
    fd, tmp = tempfile.mkstemp(
        prefix=f".{target.name}.{os.getpid()}.", suffix=".gpu2tpu", dir=target.parent
    )
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, stat.S_IMODE(st.st_mode))
        _keep_owner(tmp, st)
        os.replace(tmp, target)
    except BaseException:
        with _suppress():
            os.unlink(tmp)
        raise


def _keep_owner(tmp: str, st: os.stat_result) -> None:
    """Give the new file the old one's owner and group, as far as this process may (root may
    set both; others may set a group they belong to; else the file is theirs, as with an
    editor's save)."""
    if not hasattr(os, "chown"):
        return
    for uid, gid in ((st.st_uid, st.st_gid), (-1, st.st_gid)):
        try:
            os.chown(tmp, uid, gid)
            return
        except OSError:
            continue


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True


# -- many files --------------------------------------------------------------------------------


def run(paths: Iterable[str], config: Config, mode: Mode) -> RunReport:
    """Discover and process files, in worker processes (pool.py)."""
    from .source import prefilter_tokens

    if mode is Mode.CHECK and config.options.fix:
        # `check` only decides: the rules still say what is fixable, nothing is transformed.
        config = dataclasses.replace(config, options=dataclasses.replace(config.options, fix=False))
    paths = list(paths)
    roots = tuple(os.path.realpath(p) for p in paths if p != "-")
    config = dataclasses.replace(config, roots=roots)
    stale: list[str] = []
    found, discovery_errors = discover(paths, config, stale if mode is Mode.WRITE else None)
    if stale:
        remove_stale_temporaries(stale)
    found = [f for f in found if f != "-"]
    files = [f for f in found if not f.endswith(CUDA_SOURCE_SUFFIXES)]
    tokens = prefilter_tokens(config.options)
    jobs = config.jobs or os.cpu_count() or 1
    jobs = max(1, min(jobs, len(files) // 8 or 1))
    outcomes: list[FileOutcome]
    if not files:
        outcomes = []
    elif not config.isolate:
        outcomes = [process_file(p, config, mode, tokens) for p in files]
    else:
        from .pool import run_isolated

        work = functools.partial(process_file, config=config, mode=mode, tokens=tokens)
        # Most files of a tree hold no token: a worker answers those of a batch in one
        # message (one message each was 15% of a `check` of 3,000 small files).
        quick = functools.partial(_settled, config=config, tokens=tokens)
        outcomes = run_isolated(files, work, jobs, _crashed, quick)
    outcomes.extend(_cuda_source_outcomes(found, config))
    return RunReport(outcomes, discovery_errors, mode)


def _crashed(path: str, reason: str) -> FileOutcome:
    return FileOutcome(path, Status.ERROR, error=f"{reason}; file left as it is")


def _cuda_source_outcomes(found: list[str], config: Config) -> list[FileOutcome]:
    """`.cu`/`.cuh` files beside Python code: each one a finding for a person (G2T502)."""
    if not any(f.endswith(CUDA_SOURCE_SUFFIXES) for f in found):
        return []
    from .rules.manual import cuda_sources_beside

    return [
        FileOutcome(str(path), Status.UNCHANGED, findings=[finding])
        for path, finding in cuda_sources_beside(found, config.options)
    ]
