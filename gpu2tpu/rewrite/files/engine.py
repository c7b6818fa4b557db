"""The edge of the codemod that touches files.

paths -> discovery (excludes) -> byte prefilter -> `rewrite_source` / `rewrite_notebook` ->
diff, or an atomic write only when the text changed. Files are processed in a process pool;
one bad file becomes one error line and never stops the others.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import io
import os
import stat
import tokenize
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from ..core.model import CellFinding, Finding, Options
from ..core.torch_target import Pin
from .atomic_write import ChangedDuringRun, ReadOnly, Snapshot, remove_stale_temporaries
from .atomic_write import write_atomic as write_atomic
from .collector import fewer_collections
from .discovery import CUDA_SOURCE_SUFFIXES, Scope, discover, inside, os_reason
from .discovery import DEFAULT_EXCLUDES as DEFAULT_EXCLUDES
from .discovery import SOURCE_SUFFIXES as SOURCE_SUFFIXES
from .interrupts import checkpoint
from .pins import PinChange, pin_changes

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
    respect_gitignore: bool = True  # inside a git repository (discovery.py)
    target_source: str = ""  # where options.target_torch came from, for the reports
    target_pin: Pin | None = None  # the project's torch pin, where it set the target (G2T520)

    @property
    def scope(self) -> Scope:
        """What decides which files a walk takes under this configuration."""
        return Scope(self.root, self.exclude, self.respect_gitignore)


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
    # target-torch and where it came from, once per distinct target of the files processed
    # (projects of one run may pin different torch releases).
    targets: tuple[tuple[str | None, str], ...] = ()
    # What the run could not use but went on without (an ignore file that is no file, a
    # pattern that cannot be read, worker processes that could not start): one line each.
    warnings: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[str]:
        return [*self.discovery_errors, *(f"{o.path}: {o.error}" for o in self.files if o.error)]

    def count(self, status: Status) -> int:
        return sum(1 for o in self.files if o.status is status)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run: how many files were written, how many left as they were (None:
    the files were still being found, and none was written). A KeyboardInterrupt still, for
    callers of `run` that stop on one."""

    def __init__(self, written: int, untouched: int | None) -> None:
        self.written = written
        self.untouched = untouched
        super().__init__(self.line)

    @property
    def line(self) -> str:
        left = "every file" if self.untouched is None else str(self.untouched)
        return (
            f"interrupted: {self.written} file{'s' * (self.written != 1)} written, {left} untouched"
        )


# -- one file ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Decoded:
    text: str
    encoding: str


def decode_source(data: bytes) -> _Decoded:
    """Decode Python source the way the interpreter does (BOM, PEP 263 cookie), strictly."""
    foreign = foreign_text(data)
    if foreign:
        raise ValueError(foreign)
    if b"\x00" in data:
        raise ValueError("binary file (contains NUL bytes), not Python source")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as err:
        if err.msg == "invalid or missing encoding declaration":  # a first line not UTF-8
            raise ValueError("not valid UTF-8 text (utf-8); file left as it is") from None
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
    from ..core.source import SourceError

    read = _read_or_outcome(path, config, tokens)
    if isinstance(read, FileOutcome):
        return read
    data, snapshot = read
    try:
        if path.endswith(".ipynb"):
            return _process_notebook(path, data, snapshot, config, mode)
        decoded = decode_source(data)
        from ..core.source import rewrite_source
        from ..core.torch_target import rewrite_for_target

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
    new = _Write(decoded.text, result.new_text, decoded.encoding, snapshot)
    return _finish(outcome, path, new, mode, config)


# Byte-order marks of the encodings Python never reads source in (its tokenizer takes UTF-8,
# with or without a BOM, or a declared 8-bit encoding): such a file is said, not skipped.
_FOREIGN_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe", "UTF-16"),
    (b"\xfe\xff", "UTF-16"),
)


def foreign_text(data: bytes) -> str | None:
    """The error for text in an encoding Python never reads source in (UTF-16, UTF-32: a
    byte-order mark says so), else None. Such a file holds no `cuda` byte string the
    prefilter could see, so it is said, not skipped unseen."""
    for bom, name in _FOREIGN_BOMS:
        if data.startswith(bom):
            return (
                f"{name} text (it starts with a {name} byte-order mark): Python reads source "
                "as UTF-8; file left as it is (save it as UTF-8 to check it)"
            )
    return None


def _read_or_outcome(
    path: str, config: Config, tokens: tuple[bytes, ...]
) -> tuple[bytes, Snapshot] | FileOutcome:
    """The file's bytes (and what it was when read) when a rule may have something to say
    about them; else its outcome (unreadable, empty, UTF-16, or holding no token)."""
    try:
        data, snapshot = _read(path, config)
    except (OSError, ValueError) as err:
        reason = os_reason(err) if isinstance(err, OSError) else str(err)
        return FileOutcome(path, Status.ERROR, error=reason)
    foreign = foreign_text(data)
    if foreign:
        return FileOutcome(path, Status.ERROR, error=foreign)
    if not data.strip():
        return FileOutcome(path, Status.EMPTY)
    if not holds_token(data, tokens) and not _notebook_tokens(path, data):
        return FileOutcome(path, Status.PREFILTERED)
    return data, snapshot


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
    from ..notebooks.notebook_shell import NOTEBOOK_TOKENS

    return any(t in data for t in NOTEBOOK_TOKENS)


def _read(path: str, config: Config) -> tuple[bytes, Snapshot]:
    if path == "-":
        raise ValueError("standard input is handled by the caller")
    p = Path(path)
    st = p.stat()
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(21, "is a directory", path)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError("not a regular file")
    if st.st_size > config.max_bytes:
        raise ValueError(over_limit("file", st.st_size, config.max_bytes))
    data = p.read_bytes()
    return data, Snapshot.of(st, data)


def over_limit(what: str, size: int, limit: int) -> str:
    """The error for a file (or standard input) larger than max-file-size."""
    mib = 1024 * 1024
    return (
        f"{what} is {size / mib:.1f} MiB, over the {limit / mib:g} MiB limit "
        f"(max-file-size in [tool.gpu2tpu]); {what} left as it is"
    )


def _process_notebook(
    path: str, data: bytes, snapshot: Snapshot, config: Config, mode: Mode
) -> FileOutcome:
    from ..core.torch_target import rewrite_for_target
    from ..notebooks.notebook import local_module_findings, rewrite_notebook
    from ..notebooks.notebook_json import NotebookError, notebook_diff

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
    new = _Write(text, result.new_text, "utf-8", snapshot)
    return _finish(outcome, path, new, mode, config, diff_done=True)


@dataclass(frozen=True)
class _Write:
    """A file's new text, with what the file was when it was read."""

    old: str
    new: str
    encoding: str
    snapshot: Snapshot


def _finish(
    outcome: FileOutcome,
    path: str,
    write: _Write,
    mode: Mode,
    config: Config,
    diff_done: bool = False,
) -> FileOutcome:
    if mode is not Mode.CHECK and os.path.islink(path) and config.roots:
        target = os.path.realpath(path)
        if not inside(target, config.roots):
            return _failed(
                outcome,
                f"symbolic link to {target}, outside the given paths; left as it is "
                "(name the target to rewrite it)",
            )
    if mode is Mode.WRITE:
        try:
            write_atomic(path, write.new, write.encoding, write.snapshot)
        except ChangedDuringRun:
            return _failed(outcome, "changed during the run; left as it is")
        except ReadOnly:
            return _failed(
                outcome, "read-only file; left as it is (make it writable to rewrite it)"
            )
        except OSError as err:
            return _failed(outcome, f"cannot write: {os_reason(err)}; file left as it is")
        outcome.status = Status.REWRITTEN
        return outcome
    outcome.status = Status.WOULD_REWRITE
    if mode is Mode.DIFF and not diff_done:
        outcome.diff = unified_diff(path, write.old, write.new)
    return outcome


def _failed(outcome: FileOutcome, reason: str) -> FileOutcome:
    """The file was not written: an error, and none of its edits counts as made."""
    outcome.status = Status.ERROR
    outcome.error = reason
    outcome.diff = ""
    outcome.edits = []
    return outcome


def unified_diff(path: str, old: str, new: str) -> str:
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), path, path
    )
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


# -- many files --------------------------------------------------------------------------------


class FolderConfigs(Protocol):
    """Each folder's configuration (config.ProjectConfigs): `scope` is what a walk of the
    folder needs, cheaper than the whole (no torch pins)."""

    def __call__(self, folder: str) -> Config: ...

    def scope(self, folder: str) -> Scope: ...


def run(
    paths: Iterable[str], config: Config, mode: Mode, config_of: FolderConfigs | None = None
) -> RunReport:
    """Discover and process files, in worker processes (pool.py).

    `config_of` gives each folder's configuration (its project's `[tool.gpu2tpu]` and torch
    pins: config.py); without it, `config` holds for every file. `config` gives the run's
    own settings (jobs, isolation). Ctrl-C raises `Interrupted`, with what was written.
    """
    paths = list(paths)
    roots = tuple(os.path.realpath(p) for p in paths if p != "-")
    base = _for_mode(dataclasses.replace(config, roots=roots), mode)
    configs: dict[Config, Config] = {}

    def adjusted(folder_config: Config) -> Config:
        if folder_config not in configs:
            configs[folder_config] = _for_mode(
                dataclasses.replace(
                    folder_config, roots=roots, jobs=config.jobs, isolate=config.isolate
                ),
                mode,
            )
        return configs[folder_config]

    def config_for(folder: str) -> Config:
        return adjusted(config_of(folder)) if config_of is not None else base

    warnings: list[str] = []
    try:
        stale: list[str] = []
        found, discovery_errors = discover(
            paths,
            config_of.scope if config_of is not None else lambda folder: base.scope,
            stale if mode is Mode.WRITE else None,
            warnings,
        )
        if stale:
            remove_stale_temporaries(stale)
        found = [f for f in found if f != "-"]
        files = [f for f in found if not f.endswith(CUDA_SOURCE_SUFFIXES)]
        file_configs = [config_for(os.path.dirname(os.path.abspath(f))) for f in files]
        checkpoint()
    except KeyboardInterrupt:
        raise Interrupted(0, None) from None
    with fewer_collections():  # docs/architecture.md, "Garbage collection"
        outcomes = _process_all(files, file_configs, config, mode, warnings.append)
    # G2T520: after the files, which say what each project's pin held back
    changes = pin_changes(
        (c.target_pin, c.options, o.findings) for o, c in zip(outcomes, file_configs, strict=False)
    )
    outcomes.extend(_cuda_source_outcomes(found, base))
    outcomes.extend(_pin_outcome(change, mode) for change in changes)
    targets = {(c.options.target_torch, c.target_source): None for c in file_configs}
    return RunReport(outcomes, discovery_errors, mode, tuple(targets) or ((None, ""),), warnings)


def _pin_outcome(change: PinChange, mode: Mode) -> FileOutcome:
    """G2T520's finding on a pin file, the raised pin written (`rewrite --unsafe-fixes`) or
    shown (`--diff`) like any other fix."""
    if change.finding is None:
        return FileOutcome(change.path, Status.ERROR, error=change.error)
    if change.new_text is None:
        return FileOutcome(change.path, Status.UNCHANGED, findings=[change.finding])
    if mode is Mode.WRITE:
        try:
            write_atomic(change.real_path, change.new_text, "utf-8", change.snapshot)
        except (ChangedDuringRun, ReadOnly, OSError) as err:
            return FileOutcome(change.path, Status.ERROR, error=f"torch pin not raised: {err}")
        return FileOutcome(change.path, Status.REWRITTEN, edits=[change.finding])
    diff = unified_diff(change.path, change.old_text, change.new_text) if mode is Mode.DIFF else ""
    return FileOutcome(change.path, Status.WOULD_REWRITE, edits=[change.finding], diff=diff)


def _for_mode(config: Config, mode: Mode) -> Config:
    if mode is Mode.CHECK and config.options.fix:
        # `check` only decides: the rules still say what is fixable, nothing is transformed.
        return dataclasses.replace(config, options=dataclasses.replace(config.options, fix=False))
    return config


def _process_all(
    files: list[str],
    file_configs: list[Config],
    config: Config,
    mode: Mode,
    notice: Callable[[str], None],
) -> list[FileOutcome]:
    try:
        from ..core.source import prefilter_tokens  # loads libcst and the rules: a while

        plans: dict[Config, tuple[int, Config, tuple[bytes, ...]]] = {}
        for c in file_configs:
            if c not in plans:
                plans[c] = (len(plans), c, prefilter_tokens(c.options))
        checkpoint()
    except KeyboardInterrupt:
        raise Interrupted(0, len(files)) from None
    table = tuple((c, tokens) for _, c, tokens in plans.values())
    items = [(path, plans[c][0]) for path, c in zip(files, file_configs, strict=True)]
    jobs = config.jobs or os.cpu_count() or 1
    jobs = max(1, min(jobs, len(files) // 8 or 1))
    if not files:
        return []
    if not config.isolate:
        outcomes: list[FileOutcome] = []
        try:
            for item in items:
                outcomes.append(_work(item, table, mode))
                checkpoint()
        except KeyboardInterrupt:
            written = sum(o.status is Status.REWRITTEN for o in outcomes)
            raise Interrupted(written, len(files) - written) from None
        return outcomes
    from .pool import Interrupted as PoolInterrupted
    from .pool import run_isolated

    work = functools.partial(_work, table=table, mode=mode)
    # Most files of a tree hold no token: a worker answers those of a batch in one
    # message (one message each was 15% of a `check` of 3,000 small files).
    quick = functools.partial(_quick, table=table)
    try:
        return run_isolated(items, work, jobs, _crashed, quick, notice)
    except PoolInterrupted as stop:
        written = sum(1 for o in stop.results if o is not None and o.status is Status.REWRITTEN)
        raise Interrupted(written, len(files) - written) from None


def _work(
    item: tuple[str, int], table: tuple[tuple[Config, tuple[bytes, ...]], ...], mode: Mode
) -> FileOutcome:
    config, tokens = table[item[1]]
    return process_file(item[0], config, mode, tokens)


def _quick(
    item: tuple[str, int], table: tuple[tuple[Config, tuple[bytes, ...]], ...]
) -> FileOutcome | None:
    config, tokens = table[item[1]]
    return _settled(item[0], config, tokens)


def _crashed(item: tuple[str, int], reason: str) -> FileOutcome:
    return FileOutcome(item[0], Status.ERROR, error=f"{reason}; file left as it is")


def _cuda_source_outcomes(found: list[str], config: Config) -> list[FileOutcome]:
    """`.cu`/`.cuh` files beside Python code: each one a finding for a person (G2T502)."""
    if not any(f.endswith(CUDA_SOURCE_SUFFIXES) for f in found):
        return []
    from ..rules.manual import cuda_sources_beside

    return [
        FileOutcome(str(path), Status.UNCHANGED, findings=[finding])
        for path, finding in cuda_sources_beside(found, config.options)
    ]
