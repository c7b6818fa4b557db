"""Which files a run takes: the given paths, the source files found under given folders, less
what the exclude patterns and, inside a git repository, the .gitignore files leave out.

Each folder is walked with its own *scope* (`Scope`): the exclude patterns of the nearest
`[tool.gpu2tpu]` above it, anchored at that pyproject.toml's folder, and whether .gitignore
counts there (`respect-gitignore`, default on), as ruff's hierarchical configuration does.
A file named on the command line is always taken (`--force-exclude` filters those in
cli_run). A folder named on the command line is walked even if a pattern, or a .gitignore,
leaves it out: the patterns that match it (or a folder above it) do not apply inside it.

.gitignore files count as git reads them, as ruff's walker does: only inside a repository
(a folder holding `.git` at or above the walked folder), each for the paths below its own
folder, a deeper file's decision over a shallower one's, with the repository's
`.git/info/exclude`; a folder left out is not entered, so nothing below it can be taken back.
A user's global excludes file (`core.excludesFile`) is not read. An ignore file that is no
regular file (a FIFO would block the read forever) is not opened: one warning. Its lines are
read one by one: a pattern that ends in an unescaped backslash matches nothing, as in git
(wildmatch), and is dropped without a word; one that pathspec cannot compile is one warning,
and the file's other patterns still count.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .atomic_write import TEMPORARY, temporaries_of
from .interrupts import checkpoint

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


@dataclass(frozen=True)
class Scope:
    """What decides, in one folder, which entries a walk takes."""

    root: Path | None = None  # where `exclude` patterns are anchored (else: paths as given)
    exclude: tuple[str, ...] = ()
    respect_gitignore: bool = True

    @property
    def patterns(self) -> tuple[str, ...]:
        return (*DEFAULT_EXCLUDES, *self.exclude)


ScopeOf = Callable[[str], Scope]  # an absolute folder -> its scope


def excluded(rel: str, name: str, patterns: Iterable[str]) -> bool:
    compiled = _exclude_pattern(tuple(patterns))
    return bool(compiled.match(name) or compiled.match(rel))


@functools.lru_cache(maxsize=64)
def _exclude_pattern(patterns: tuple[str, ...]) -> re.Pattern[str]:
    """A glob matches a name or a path; a plain path also excludes everything below it."""
    parts = []
    for pattern in patterns:
        parts.append(fnmatch.translate(pattern))
        plain = pattern.rstrip("/")
        parts.append(re.escape(plain) + r"(?:/.*)?\Z")
    return re.compile("|".join(f"(?:{p})" for p in parts) or r"(?!x)x")


def prefixes(rel: str) -> list[str]:
    """`a/b/c` -> `a`, `a/b`, `a/b/c`."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def relative_to_root(path: Path, root: Path | None) -> tuple[str, bool]:
    """`path` relative to `root` (both resolved), and whether that held (else as given)."""
    if root is None:
        return path.as_posix(), True
    try:
        return path.resolve().relative_to(root.resolve()).as_posix(), True
    except (ValueError, OSError):
        return path.as_posix(), False


def is_force_excluded(raw: str, scope: Scope) -> bool:
    """Whether the exclude patterns of `raw`'s scope leave out a path named on the command
    line (`--force-exclude`, for pre-commit, which names every staged file)."""
    rel = relative_to_root(Path(raw), scope.root)[0]
    return any(excluded(p, Path(p).name, scope.patterns) for p in prefixes(rel))


def discover(
    paths: Iterable[str],
    scope_of: ScopeOf,
    stale: list[str] | None = None,
    warnings: list[str] | None = None,
) -> tuple[list[str], list[str]]:
    """Source files under `paths` (explicit files are always taken), and one line per problem.

    A symbolic link to a file that is found anyway (its target is under the given paths too)
    is dropped, so that the file is rewritten once. `stale` collects the files beside the
    ones found that are named like a write's temporary (`atomic_write.TEMPORARY`);
    `warnings`, one line per ignore file or pattern that could not be read (each once).
    """
    files: list[str] = []
    errors: list[str] = []
    seen: set[str] = set()

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
            errors.append(f"{raw}: {os_reason(err)}")
            continue
        if stat.S_ISDIR(st.st_mode):
            for found in _Walk(p, scope_of, errors, stale, warnings).files():
                add(found)
        else:
            add(raw)
            if stale is not None:
                stale.extend(temporaries_of(p))
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


# -- .gitignore ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Ignore:
    """One .gitignore (or .git/info/exclude): its patterns, for the paths below `base`."""

    base: str  # absolute folder
    spec: Any  # pathspec.GitIgnoreSpec
    # Every pattern in one regular expression: most paths match none, and one C-level search
    # says so (pathspec tries the patterns one by one, in Python).
    any: re.Pattern[str]

    @classmethod
    def of(cls, base: str, patterns: list[Any]) -> _Ignore | None:  # pathspec's pattern objects
        from pathspec import GitIgnoreSpec

        regexes = [
            p.regex.pattern.replace("(?P<ps_d>", "(?:")
            for p in patterns
            if p.include is not None and getattr(p, "regex", None) is not None
        ]
        if not regexes:
            return None
        return cls(base, GitIgnoreSpec(patterns), re.compile("|".join(regexes)))


def _read_ignore(base: str, file: str, warn: Callable[[str], None]) -> _Ignore | None:
    """The patterns of the ignore file `file` for the paths below `base`; None when it holds
    none or cannot be read. Each problem is said through `warn`."""
    try:
        st = os.stat(file)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        warn(f"{_shown(file)}: not a regular file; its patterns are not read")
        return None
    try:
        # Non-blocking: swapped for a FIFO since the stat, the open still cannot hang.
        fd = os.open(file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        with open(fd, encoding="utf-8", errors="replace") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                warn(f"{_shown(file)}: not a regular file; its patterns are not read")
                return None
            lines = handle.read().splitlines()
    except OSError:
        return None
    return _Ignore.of(base, _patterns(lines, file, warn))


def _patterns(lines: list[str], file: str, warn: Callable[[str], None]) -> list[Any]:
    """pathspec's pattern for each line, in order; a line it cannot compile is left out."""
    from pathspec import GitIgnoreSpec

    numbered = [(n, line) for n, line in enumerate(lines, 1) if not _ends_in_backslash(line)]
    try:
        return list(GitIgnoreSpec.from_lines([line for _, line in numbered]).patterns)
    except Exception:  # pathspec's own error, or `re`'s for a range such as [z-a]
        pass
    patterns: list[Any] = []
    for number, line in numbered:
        try:
            patterns.extend(GitIgnoreSpec.from_lines([line]).patterns)
        except Exception as err:
            warn(f"{_shown(file)}:{number}: pattern `{line}` cannot be read ({err}); left out")
    return patterns


def _ends_in_backslash(line: str) -> bool:
    """Whether the pattern ends in an unescaped backslash once git has trimmed its trailing
    spaces (those not escaped): git's wildmatch then matches nothing."""
    text = line
    while text.endswith(" ") and not text.endswith("\\ "):
        text = text[:-1]
    trailing = len(text) - len(text.rstrip("\\"))
    return trailing % 2 == 1


def _shown(path: str) -> str:
    """`path` relative to the current folder where it lies below it, else as it is."""
    try:
        rel = os.path.relpath(path)
    except (OSError, ValueError):
        return path
    return path if rel.startswith("..") else rel


def _repository_top(folder: str) -> str | None:
    for candidate in (folder, *map(str, Path(folder).parents)):
        if os.path.exists(os.path.join(candidate, ".git")):
            return candidate
    return None


def _ancestor_ignores(top: str, warn: Callable[[str], None]) -> list[_Ignore] | None:
    """The .gitignore files that bear on `top` from above it, shallowest first; None outside
    a git repository (.gitignore does not count there, as in git and ruff)."""
    repo = _repository_top(top)
    if repo is None:
        return None
    found = []
    exclude = _read_ignore(repo, os.path.join(repo, ".git", "info", "exclude"), warn)
    if exclude is not None:
        found.append(exclude)
    folder = Path(top)
    for ancestor in reversed([folder, *folder.parents]):
        if len(str(ancestor)) < len(repo) or str(ancestor) == top:
            continue
        ignore = _read_ignore(str(ancestor), str(ancestor / ".gitignore"), warn)
        if ignore is not None:
            found.append(ignore)
    return found


def _ignored(ignores: list[_Ignore], path: str, is_dir: bool) -> bool:
    """git's answer for `path` (absolute): the deepest file that decides, decides."""
    for ignore in reversed(ignores):
        rel = path[len(ignore.base) :].lstrip(os.sep).replace(os.sep, "/")
        if is_dir:
            rel += "/"
        if not ignore.any.match(rel):
            continue
        result = ignore.spec.check_file(rel)
        if result.include is not None:
            return bool(result.include)
    return False


def _without_matching(ignores: list[_Ignore], top: str) -> list[_Ignore]:
    """`ignores` less the patterns that leave out `top` itself or a folder above it (a folder
    named on the command line is wanted)."""
    kept = []
    for ignore in ignores:
        rel = os.path.relpath(top, ignore.base).replace(os.sep, "/")
        above = prefixes(rel)
        patterns = [
            p
            for p in ignore.spec.patterns
            if not (p.include and any(p.match_file(a + "/") for a in above))
        ]
        narrowed = _Ignore.of(ignore.base, patterns)
        if narrowed is not None:
            kept.append(narrowed)
    return kept


# -- walking a folder ----------------------------------------------------------------------------


class _Walk:
    """One folder named on the command line, walked with each folder's own scope."""

    def __init__(
        self,
        top: Path,
        scope_of: ScopeOf,
        errors: list[str],
        stale: list[str] | None,
        warnings: list[str] | None = None,
    ) -> None:
        self.top = top
        self.scope_of = scope_of
        self.errors = errors
        self.stale = stale
        self.warnings = warnings
        self.top_abs = os.path.abspath(top)
        scope = scope_of(self.top_abs)
        # The patterns of the named folder's scope that match it (or a folder above it).
        rel = relative_to_root(top, scope.root)[0]
        self.dropped = {
            pat
            for pat in scope.patterns
            if any(excluded(part, Path(part).name, (pat,)) for part in prefixes(rel))
        }
        self.top_scope = scope
        self.ignores: dict[str, list[_Ignore] | None] = {}

    def patterns(self, scope: Scope) -> tuple[str, ...]:
        if scope.root == self.top_scope.root:
            return tuple(p for p in scope.patterns if p not in self.dropped)
        return scope.patterns

    def warn(self, line: str) -> None:
        if self.warnings is not None and line not in self.warnings:
            self.warnings.append(line)

    def ignores_of(self, folder_abs: str, parent_abs: str | None) -> list[_Ignore] | None:
        """The .gitignore files that bear on `folder_abs`'s entries (None: not in a repo)."""
        if parent_abs is None:
            above = _ancestor_ignores(self.top_abs, self.warn)
            if above is not None:
                above = _without_matching(above, self.top_abs)
        else:
            above = self.ignores.get(parent_abs)
        if above is None and os.path.exists(os.path.join(folder_abs, ".git")):
            above = []  # a repository starts here (a nested one, or the walked folder)
        if above is None:
            self.ignores[folder_abs] = None
            return None
        own = _read_ignore(folder_abs, os.path.join(folder_abs, ".gitignore"), self.warn)
        found = [*above, own] if own is not None else above
        self.ignores[folder_abs] = found
        return found

    def files(self) -> Iterator[str]:
        def onerror(err: OSError) -> None:
            self.errors.append(f"{err.filename}: {os_reason(err)}")

        # A folder's path relative to its scope's root, by folder: an entry inside it that is
        # not a symbolic link is the folder's plus its name (`Path.resolve` per file costs a
        # system call per path component; on 3,000 files it was the largest part of
        # discovery). Only folders that lie under their root (or all, without one) are in it.
        rels: dict[str, tuple[Path | None, str]] = {}
        absolute: dict[str, str] = {}  # a folder as os.walk names it -> its absolute path
        parent_of: dict[str, str] = {}  # ... -> its parent's absolute path

        for folder, dirnames, filenames in os.walk(self.top, onerror=onerror):
            checkpoint()
            base = Path(folder)
            folder_abs = absolute.get(folder) or os.path.abspath(folder)
            scope = self.scope_of(folder_abs)
            patterns = self.patterns(scope)
            known = rels.get(folder)
            if known is None or known[0] != scope.root:
                rel, under = relative_to_root(base, scope.root)
                known = (scope.root, rel) if under else None
            ignores = (
                self.ignores_of(folder_abs, parent_of.get(folder))
                if scope.respect_gitignore
                else None
            )
            kept = []
            for d in sorted(dirnames):
                rel = _rel_in(known, base, d, scope)
                if excluded(rel, d, patterns):
                    continue
                child_abs = os.path.join(folder_abs, d)
                if ignores and _ignored(ignores, child_abs, True):
                    continue
                kept.append(d)
                child = os.path.join(folder, d)
                absolute[child] = child_abs
                parent_of[child] = folder_abs
                if known is not None and not os.path.islink(child):
                    rels[child] = (scope.root, rel)
            dirnames[:] = kept
            for name in sorted(filenames):
                if self.stale is not None and TEMPORARY.match(name):
                    self.stale.append(str(base / name))
                if not name.endswith(SOURCE_SUFFIXES + CUDA_SOURCE_SUFFIXES):
                    continue
                if excluded(_rel_in(known, base, name, scope), name, patterns):
                    continue
                if ignores and _ignored(ignores, os.path.join(folder_abs, name), False):
                    continue
                yield str(base / name)


def _rel_in(known: tuple[Path | None, str] | None, base: Path, name: str, scope: Scope) -> str:
    """The entry `name` of folder `base` relative to the scope's root; `known` is the folder's
    own (None: not known under that root, or a symbolic link: resolved)."""
    if known is None or os.path.islink(os.path.join(base, name)):
        return relative_to_root(base / name, scope.root)[0]
    return name if known[1] == "." else f"{known[1]}/{name}"


def os_reason(err: OSError) -> str:
    if isinstance(err, PermissionError):
        return "permission denied"
    if err.errno == 40:  # ELOOP
        return "symbolic link loop"
    if isinstance(err, IsADirectoryError):
        return "is a directory"
    return err.strerror or str(err)
