"""`gpu2tpu check` and `gpu2tpu rewrite`: their arguments, and what they do with them."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from .files.config import ConfigError, Overrides, ProjectConfigs, unknown_codes
from .files.discovery import SOURCE_SUFFIXES, inside, is_force_excluded
from .files.engine import (
    Config,
    FileOutcome,
    Interrupted,
    Mode,
    RunReport,
    Status,
    decode_source,
    over_limit,
    run,
)
from .files.interrupts import checkpoint
from .files.streams import (
    OutputError,
    closed,
    copy_rest,
    escape_unencodable,
    guarded,
    read_input,
)
from .reports.report import (
    RunInfo,
    error_lines,
    exit_code,
    finding_line,
    finding_lines,
    print_summary,
)
from .reports.report_output import render_report, write_report

if TYPE_CHECKING:
    from .core.model import Result
    from .notebooks.notebook import NotebookResult


class UsageError(ValueError):
    """Arguments that do not go together: one line, exit 2, nothing read or written."""


def overrides_of(args: argparse.Namespace) -> Overrides:
    """What the command line says over each project's `[tool.gpu2tpu]`."""
    return Overrides(
        select=tuple(args.select) if args.select is not None else None,
        ignore=tuple(args.ignore) if args.ignore is not None else None,
        unsafe_fixes=args.unsafe_fixes,
        exclude=tuple(args.exclude),
        target_torch=getattr(args, "target_torch", None),
        respect_gitignore=getattr(args, "respect_gitignore", None),
        jobs=args.jobs,
    )


def mode_of(args: argparse.Namespace) -> Mode:
    if args.command == "check":
        return Mode.CHECK
    if args.diff:
        return Mode.DIFF
    if args.check:
        return Mode.DRY
    return Mode.WRITE


def existing(cwd: Path | None) -> Path:
    """The current folder, or a `UsageError` when it no longer exists (`os.getcwd` failed)."""
    if cwd is None:
        raise UsageError(
            "the current folder no longer exists (deleted while a shell was in it); "
            "change to a folder that exists and run again"
        )
    return cwd


def check_usage(args: argparse.Namespace, cwd: Path) -> None:
    """Refuse what would read standard input and paths at once, or write a report over a
    file being checked or rewritten (`check -o a.py a.py` would overwrite the source) or over
    a configuration file the run reads (`check -o pyproject.toml .`)."""
    if "-" in args.paths and len(args.paths) > 1:
        raise UsageError(
            "`-` (standard input) cannot be combined with paths; give one or the other"
        )
    for option, given in (("--select", args.select), ("--ignore", args.ignore)):
        if given is not None and not given:  # `--select ""`: ruff refuses it too
            raise UsageError(
                f"{option} names no rule code; give codes or prefixes, or ALL "
                "(`--ignore ALL` checks nothing)"
            )
    codes = (*(args.select or ()), *(args.ignore or ()))
    unknown = unknown_codes(tuple(codes))
    if unknown:
        raise UsageError(f"unknown rule code or prefix: {unknown[0]} (see `gpu2tpu rules`)")
    for option, value in (
        ("--output-file", getattr(args, "output_file", None)),
        ("--report", getattr(args, "report", None)),
    ):
        if value and _is_input(Path(value), args.paths, cwd):
            raise UsageError(
                f"{option} {value} is one of the input files; name another file for the report"
            )
        if value and _is_configuration(Path(value), args.paths, cwd):
            raise UsageError(
                f"{option} {value} is a configuration file this run reads; name another file "
                "for the report"
            )


def _is_input(output: Path, paths: list[str], cwd: Path) -> bool:
    """Whether `output` is a path given, or a source file a given folder would yield."""
    target = os.path.realpath(cwd / output)
    for raw in paths:
        if raw == "-":
            continue
        given = os.path.realpath(cwd / raw)
        if target == given:
            return True
        if os.path.isdir(given) and target.startswith(given.rstrip(os.sep) + os.sep):
            if target.endswith(SOURCE_SUFFIXES):
                return True
    return False


# What the run reads as configuration besides pyproject.toml: torch pins (torch_target.py)
# and ignore files. A report is never written over one of them.
_CONFIGURATION = re.compile(
    r"(pyproject\.toml|setup\.cfg|setup\.py|environment\.ya?ml|requirements.*\.txt|\.gitignore)\Z"
)


def _is_configuration(output: Path, paths: list[str], cwd: Path) -> bool:
    """Whether `output` is a file the run reads as configuration: a pyproject.toml, a file of
    torch pins or a .gitignore in the current folder, a folder a given path lies in, a folder
    above one of those, or a folder below a given one."""
    target = os.path.realpath(cwd / output)
    folder, name = os.path.split(target)
    if os.path.basename(folder) == "requirements" and name.endswith(".txt"):
        folder = os.path.dirname(folder)  # requirements/*.txt pins its parent's project
    elif not _CONFIGURATION.match(name):
        return False
    for raw in [".", *(p for p in paths if p != "-")]:
        given = os.path.realpath(cwd / raw)
        if inside(given, [folder]) or (os.path.isdir(given) and inside(folder, [given])):
            return True
    return False


def run_rewrite_command(
    args: argparse.Namespace,
    cwd: Path | None,
    stdin: TextIO,
    stdout: TextIO,
    stderr: TextIO,
) -> int:
    """`check` or `rewrite` with `args`; `cwd` None: the current folder no longer exists."""
    for stream in (stdout, stderr):
        escape_unencodable(stream)
    mode = mode_of(args)
    if args.paths == ["-"]:
        return _run_stdin(args, cwd, mode, stdin, stdout, stderr)
    try:
        cwd = existing(cwd)
        check_usage(args, cwd)
        configs = ProjectConfigs(overrides_of(args), cwd)
        paths = force_exclude(args.paths, configs) if args.force_exclude else args.paths
        report = run(paths, Config(jobs=args.jobs), mode, configs)
        if configs.selects_nothing():
            report.warnings.append(NOTHING_SELECTED)
    except (ConfigError, UsageError) as err:
        for line in str(err).splitlines():
            print(f"gpu2tpu: error: {line}", file=stderr)
        return 2
    except Interrupted as stop:
        print(stop.line, file=stderr)
        return 130
    try:
        checkpoint()
        return _show(args, report, mode, RunInfo.of(report.targets), stdout, stderr)
    except KeyboardInterrupt:
        written = report.count(Status.REWRITTEN)
        print(Interrupted(written, len(report.files) - written).line, file=stderr)
        return 130


def _show(
    args: argparse.Namespace,
    report: RunReport,
    mode: Mode,
    info: RunInfo,
    stdout: TextIO,
    stderr: TextIO,
    *,
    summary: bool = True,
) -> int:
    """Everything a run prints and the report files it writes; the exit status."""
    fmt = getattr(args, "format", "text")
    output_file = getattr(args, "output_file", None)
    if mode is Mode.CHECK and (fmt != "text" or output_file):
        text = escape_surrogates(render_report(report, fmt, info, quiet=args.quiet), fmt)
        if not output_file:
            stdout.write(text)
            stdout.flush()
        else:
            try:
                write_report(Path(output_file), text)
            except OSError as err:
                print(f"gpu2tpu: error: cannot write {output_file}: {err.strerror or err}",
                      file=stderr)  # fmt: skip
                return 2
        _print_errors(report, stderr)
        return exit_code(report)
    if mode is Mode.DIFF:
        for outcome in report.files:
            if outcome.diff:
                stdout.write(outcome.diff)
        for outcome in report.files:  # the diff shows what changes; say what was held back
            for item in outcome.withheld:
                print(finding_line(outcome.path, item, show_fix=False), file=stderr)
    elif not args.quiet:
        for line in finding_lines(report, include_edits=mode is Mode.CHECK):
            print(line, file=stdout)
        if mode is Mode.DRY:
            for outcome in report.files:
                if outcome.status == "would-rewrite":
                    print(f"would rewrite {outcome.path}", file=stdout)
    stdout.flush()  # the lines above come before the errors and the summary, even on one terminal
    _print_errors(report, stderr)
    report_path = getattr(args, "report", None)
    if report_path:
        try:
            markdown = render_report(report, "markdown", info)
            write_report(Path(report_path), escape_surrogates(markdown, "markdown"))
        except OSError as err:
            print(f"gpu2tpu: error: cannot write {report_path}: {err.strerror or err}", file=stderr)
            return 2
    if summary:
        print_summary(report, stderr if mode is Mode.DIFF else stdout, info)
    if any(o.withheld for o in report.files):  # the summary's "Fixes withheld" line says so
        return max(exit_code(report), 1)
    return exit_code(report)


def withheld_line(count: int) -> str:
    """The closing line of `rewrite -` when the safety net held fixes back (net.py), or ""."""
    if not count:
        return ""
    fixes = f"{count} fix{'es' * (count != 1)}"
    return (
        f"gpu2tpu: {fixes} withheld: with {'them' if count != 1 else 'it'} the code would not "
        "have been valid Python (see `fix withheld` above); the rest was rewritten."
    )


NOTHING_SELECTED = (
    'no rule is selected (`select = []`, or `ignore = ["ALL"]` / `--ignore ALL`): nothing was '
    "checked"
)


_SURROGATE = re.compile("[\ud800-\udfff]")


def escape_surrogates(text: str, fmt: str = "text") -> str:
    """File names that are not UTF-8 reach Python as lone surrogates (`surrogateescape`);
    written out they would make a report invalid UTF-8. Each such byte becomes `\\xNN`
    (Python's `backslashreplace`), as docs/json-schema.md says; inside JSON (json, sarif) the
    backslash itself is escaped."""
    if not _SURROGATE.search(text):
        return text
    byte = "\\\\x%02x" if fmt in ("json", "sarif") else "\\x%02x"
    return _SURROGATE.sub(lambda m: _escaped(m[0], byte), text)


def _escaped(char: str, byte: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:
        return byte % (code - 0xDC00)  # the pattern is chosen above
    return f"\\u{code:04x}"


def force_exclude(paths: list[str], configs: ProjectConfigs) -> list[str]:
    """The paths that the exclude patterns (defaults and `[tool.gpu2tpu] exclude` of each
    path's project) leave: with `--force-exclude` they apply to files named on the command
    line too, as pre-commit names every staged file."""
    return [
        raw
        for raw in paths
        if raw == "-"
        or not is_force_excluded(raw, configs.scope(os.path.dirname(os.path.abspath(raw))))
    ]


def _print_errors(report: RunReport, stderr: TextIO) -> None:
    for line in error_lines(report):
        print(line, file=stderr)
    for line in report.warnings:
        print(f"warning: {line}", file=stderr)
    stderr.flush()


def _run_stdin(
    args: argparse.Namespace,
    cwd: Path | None,
    mode: Mode,
    stdin: TextIO,
    stdout: TextIO,
    stderr: TextIO,
) -> int:
    """`gpu2tpu rewrite -`: text in, rewritten text out (for editors and pipes).

    The output keeps the input's encoding (a PEP 263 declaration such as latin-1) and BOM.
    On any failure (bad configuration, a report that cannot be written, a syntax error, an
    input over max-file-size, a bug, Ctrl-C) the input goes out unchanged, byte for byte,
    with one error line on stderr, and the exit status is 2 (130 for Ctrl-C): an editor
    never gets an empty buffer back. With standard error closed, nothing could say what
    happened: the input goes back unchanged, exit 2. `--stdin-filename` names the text in
    reports, chooses its configuration (the project of that path) and, for a name ending in
    .ipynb, reads it as a notebook.
    """
    name = args.stdin_filename or "-"
    echo = mode is Mode.WRITE
    if 0 in closed():
        print("gpu2tpu: error: standard input is closed (<&-); nothing to read", file=stderr)
        return 2
    data = b""
    read = False  # all of the input is in `data`

    def failed(lines: list[str], status: int = 2) -> int:
        for line in lines:
            print(line, file=stderr)
        if echo:
            _write_bytes(stdout, data)
            if not read and status != 130:  # a Ctrl-C stops reading too
                copy_rest(stdin, stdout)
        return status

    if 2 in closed():
        return failed([])
    try:
        cwd = existing(cwd)
        check_usage(args, cwd)
        named = cwd / args.stdin_filename if args.stdin_filename else None
        folder = os.path.dirname(os.path.abspath(named)) if named else str(cwd)
        configs = ProjectConfigs(overrides_of(args), cwd)
        config = configs(folder)
        data, over = read_input(stdin, config.max_bytes)
        read = not over
        if over:  # given back as it comes, never held whole
            if echo:
                _write_bytes(stdout, data)
            size, data, read = len(data), b"", True
            size += copy_rest(stdin, stdout if echo else None)
            return failed([f"error: {name}: {over_limit('input', size, config.max_bytes)}"])
        if args.force_exclude and args.stdin_filename:
            if is_force_excluded(args.stdin_filename, config.scope):
                return failed([], 0)  # excluded: given back as it came, as ruff does
        checkpoint()
        outcome, new_data = _stdin_outcome(name, data, config, mode)
        checkpoint()
    except (ConfigError, UsageError) as err:
        return failed([f"gpu2tpu: error: {line}" for line in str(err).splitlines()])
    except KeyboardInterrupt:
        return failed([Interrupted(0, None).line], 130)
    except OutputError:  # standard output failed: nothing more can go out (cli.main says so)
        raise
    except Exception as err:  # a bug of ours: the editor still gets its text back
        bug = f"internal error ({type(err).__name__}: {err}); left as it is (please report it)"
        return failed([f"error: {name}: {bug}"])
    if configs.selects_nothing():
        print(f"warning: {NOTHING_SELECTED}", file=stderr)
    if outcome.error or outcome.cell_errors:
        errors = [outcome.error] if outcome.error else outcome.cell_errors
        return failed([f"error: {name}: {e}" for e in errors])
    report = RunReport([outcome], [], mode, ((config.options.target_torch, config.target_source),))
    info = RunInfo.of(report.targets)
    if mode is Mode.CHECK:
        if getattr(args, "format", "text") != "text" or getattr(args, "output_file", None):
            return _show(args, report, mode, info, stdout, stderr)
        for item in outcome.findings:
            print(finding_line(name, item), file=stdout)
        return int(bool(outcome.findings))
    if getattr(args, "report", None):
        try:
            write_report(
                Path(args.report),
                escape_surrogates(render_report(report, "markdown", info), "markdown"),
            )
        except KeyboardInterrupt:  # waiting for a FIFO's reader
            return failed([Interrupted(0, None).line], 130)
        except OSError as err:
            return failed([f"gpu2tpu: error: cannot write {args.report}: {err.strerror or err}"])
    code = int(outcome.status is Status.WOULD_REWRITE)
    if mode is Mode.WRITE:
        _write_bytes(stdout, new_data if new_data is not None else data)
        for item in outcome.findings:
            print(finding_line(name, item, show_fix=False), file=stderr)
        code = int(bool(outcome.findings))
    elif mode is Mode.DIFF:
        _write_bytes(stdout, new_data or b"")
        for item in outcome.withheld:
            print(finding_line(name, item, show_fix=False), file=stderr)
    elif mode is Mode.DRY and outcome.status is Status.WOULD_REWRITE and not args.quiet:
        print(f"would rewrite {name}", file=stdout)
    if outcome.withheld:
        print(withheld_line(len(outcome.withheld)), file=stderr)
        code = max(code, 1)
    return code


def _stdin_outcome(
    name: str, data: bytes, config: Config, mode: Mode
) -> tuple[FileOutcome, bytes | None]:
    """What the engine would say of `data` as a file called `name`, and the bytes to print:
    the new text in the input's encoding (write), the diff (diff), or None."""
    from .core.source import SourceError, rewrite_source
    from .core.torch_target import rewrite_for_target

    options = config.options
    if mode is Mode.CHECK:
        options = dataclasses.replace(options, fix=False)
    notebook = name.endswith(".ipynb")
    result: Result | NotebookResult
    try:
        if notebook:
            from .notebooks.notebook import rewrite_notebook
            from .notebooks.notebook_json import NotebookError, notebook_diff

            try:
                text, encoding = data.decode("utf-8"), "utf-8"
            except UnicodeDecodeError:
                raise ValueError("notebook is not valid UTF-8; left as it is") from None
            try:
                result = rewrite_for_target(rewrite_notebook, text, options)
            except NotebookError as err:
                raise ValueError(f"{err.reason}; left as it is") from None
        else:
            decoded = decode_source(data)
            text, encoding = decoded.text, decoded.encoding
            result = rewrite_for_target(rewrite_source, text, options)
    except (SourceError, ValueError, RecursionError) as err:
        reason = getattr(err, "reason", None) or str(err) or "too deeply nested to parse"
        line = getattr(err, "line", None)
        where = f" (line {line})" if line else ""
        suffix = "" if reason.endswith("left as it is") else "; left as it is"
        return FileOutcome(name, Status.ERROR, error=f"{reason}{where}{suffix}"), None
    outcome = FileOutcome(
        name,
        Status.UNCHANGED,
        edits=list(result.edits),
        findings=list(result.findings),
        withheld=list(result.withheld),
        cell_errors=list(getattr(result, "cell_errors", ())),
    )
    if result.new_text == text:
        return outcome, None
    outcome.status = Status.REWRITTEN if mode is Mode.WRITE else Status.WOULD_REWRITE
    if mode is Mode.WRITE:
        try:
            return outcome, _encode(result.new_text, encoding)
        except UnicodeEncodeError as err:
            return _failed_outcome(name, f"cannot encode the result as {err.encoding}"), None
    if mode is Mode.DIFF:
        if notebook:
            diff = notebook_diff(name, text, result.new_text)
        else:
            from .files.engine import unified_diff

            diff = unified_diff(name, text, result.new_text)
        return outcome, diff.encode(encoding.removesuffix("-sig"), "replace")
    return outcome, None


def _failed_outcome(name: str, reason: str) -> FileOutcome:
    return FileOutcome(name, Status.ERROR, error=f"{reason}; left as it is")


def _encode(text: str, encoding: str) -> bytes:
    """`text` in the input's encoding, with its BOM when the input had one."""
    if encoding == "utf-8-sig":
        return b"\xef\xbb\xbf" + text.encode("utf-8")
    return text.encode(encoding)


def _write_bytes(stdout: TextIO, data: bytes) -> None:
    if hasattr(stdout, "buffer"):
        stdout.flush()
        stdout.buffer.write(data)
        stdout.buffer.flush()
    else:
        stdout.write(data.decode("utf-8", "surrogateescape"))


# -- the arguments ------------------------------------------------------------------------------

FORMATS = ["text", "json", "csv", "github", "sarif", "markdown"]


def _codes(value: str) -> list[str]:
    return [c.strip().upper() for c in value.split(",") if c.strip()]


def _add_rewrite_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", default=["."], help="files or folders (default: .)")
    p.add_argument("--select", type=_codes, action="extend", default=None, metavar="CODES",
                   help="only these rule codes or prefixes, e.g. G2T1,G2T201")  # fmt: skip
    p.add_argument("--ignore", type=_codes, action="extend", default=None, metavar="CODES",
                   help="skip these rule codes or prefixes")  # fmt: skip
    p.add_argument("--unsafe-fixes", action="store_true", default=None,
                   help="also apply fixes that may change behaviour (e.g. fp16 -> bf16)")  # fmt: skip
    p.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                   help="skip paths matching GLOB (added to [tool.gpu2tpu] exclude)")  # fmt: skip
    p.add_argument(
        "-j", "--jobs", type=_jobs, default=0, help="worker processes (default: all cores)"
    )
    p.add_argument("--stdin-filename", default=None, help="name to report for `-` (standard input)")
    p.add_argument("--force-exclude", action="store_true",
                   help="apply the exclude patterns to files named on the command line too "
                   "(for pre-commit, as ruff's --force-exclude)")  # fmt: skip
    p.add_argument("--target-torch", default=None, metavar="VERSION",
                   help="oldest torch the code must run on, e.g. 2.6: fixes that need a newer "
                   "one are reported, not applied (default: [tool.gpu2tpu] target-torch, else "
                   "the lowest torch the project's own pins admit)")  # fmt: skip
    p.add_argument("--respect-gitignore", action=argparse.BooleanOptionalAction, default=None,
                   help="leave out what .gitignore files leave out, inside a git repository "
                   "(default: on, or [tool.gpu2tpu] respect-gitignore)")  # fmt: skip
    p.add_argument("-q", "--quiet", action="store_true", help="print only errors and the summary")


def _jobs(value: str) -> int:
    jobs = int(value)
    if jobs < 0:
        raise argparse.ArgumentTypeError("must be 0 (all cores) or more")
    return jobs


class Check:
    """`gpu2tpu check`: the findings, in any report format; writes nothing."""

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        _add_rewrite_options(p)
        p.add_argument("--format", choices=FORMATS, default="text",
                       help="text (default), json, csv, github (workflow annotations), sarif "
                       "(SARIF 2.1.0), markdown (a migration report for a pull request)")  # fmt: skip
        p.add_argument("--output-file", "-o", default=None, metavar="PATH",
                       help="write the report to PATH instead of standard output")  # fmt: skip

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        try:
            cwd: Path | None = Path(os.getcwd())
        except OSError:  # the folder was deleted under the shell
            cwd = None
        stdout = guarded(sys.stdout, "standard output")  # a failed write says which stream
        stderr = guarded(sys.stderr, "standard error")
        return run_rewrite_command(args, cwd, sys.stdin, stdout, stderr)


class Rewrite:
    """`gpu2tpu rewrite`: the fixes, written, shown as a diff, or only checked."""

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        _add_rewrite_options(p)
        modes = p.add_mutually_exclusive_group()
        modes.add_argument(
            "--diff", action="store_true", help="print a unified diff; write nothing"
        )
        modes.add_argument("--check", action="store_true",
                           help="write nothing; exit 1 when anything would change")  # fmt: skip
        p.add_argument("--report", default=None, metavar="PATH",
                       help="also write the migration report (Markdown) to PATH")  # fmt: skip

    run = Check.run


if __name__ == "__main__":  # pragma: no cover
    sys.exit(2)
