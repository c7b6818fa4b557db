"""`gpu2tpu check` and `gpu2tpu rewrite`: their arguments, and what they do with them."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import sys
from pathlib import Path
from typing import TextIO

from .engine import Config, ConfigError, Mode, RunReport, decode_source, load_config, run
from .model import Options
from .report import (
    RunInfo,
    error_lines,
    exit_code,
    finding_line,
    finding_lines,
    print_summary,
)
from .report_output import render_report, write_report


def resolve_target(args: argparse.Namespace, section: dict, cwd: Path) -> tuple[str | None, str]:
    """target-torch and where it came from: the command line, `[tool.gpu2tpu]`, or the lowest
    torch the project's own pins admit (the folder of its pyproject.toml, else `cwd`)."""
    from .torch_target import TargetError, normalize, project_floor

    try:
        if getattr(args, "target_torch", None):
            return normalize(args.target_torch), "--target-torch"
        if "target-torch" in section:
            return normalize(section["target-torch"]), "[tool.gpu2tpu] target-torch"
    except TargetError as err:
        raise ConfigError(str(err)) from None
    pin = project_floor(section.get("__root__") or cwd)
    return (pin.version, pin.source) if pin else (None, "")


def build_config(args: argparse.Namespace, cwd: Path) -> Config:
    """Command-line options over `[tool.gpu2tpu]` over the defaults."""
    config, _ = build_config_and_info(args, cwd)
    return config


def build_config_and_info(args: argparse.Namespace, cwd: Path) -> tuple[Config, RunInfo]:
    """The engine's settings, and what the reports say about them (target-torch's source)."""
    section = load_config(cwd)
    target, target_source = resolve_target(args, section, cwd)
    select = args.select if args.select is not None else section.get("select", [])
    ignore = args.ignore if args.ignore is not None else section.get("ignore", [])
    unsafe = (
        args.unsafe_fixes if args.unsafe_fixes is not None else section.get("unsafe-fixes", False)
    )
    for key, value in (("select", select), ("ignore", ignore)):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"[tool.gpu2tpu] {key} must be a list of rule codes")
    max_bytes = section.get("max-file-size", None)
    config = Config(
        options=Options(
            select=tuple(c.upper() for c in select),
            ignore=tuple(c.upper() for c in ignore),
            unsafe_fixes=bool(unsafe),
            target_torch=target,
        ),
        exclude=tuple(section.get("exclude", [])) + tuple(args.exclude),
        jobs=args.jobs,
        root=section.get("__root__"),
    )
    if max_bytes is not None:
        if not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ConfigError("[tool.gpu2tpu] max-file-size must be a positive number of bytes")
        config = Config(config.options, config.exclude, max_bytes, config.jobs, config.root)
    return config, RunInfo(target, target_source)


def _check_codes(config: Config) -> str | None:
    codes = (*config.options.select, *config.options.ignore)
    if not codes:
        return None
    from .rules_doc import documented_rules

    known = [r.code for r in documented_rules()]
    for code in codes:
        if code != "ALL" and not any(k.startswith(code) for k in known):
            return f"unknown rule code or prefix: {code} (see `gpu2tpu rules`)"
    return None


def run_rewrite_command(
    args: argparse.Namespace, cwd: Path, stdin: TextIO, stdout: TextIO, stderr: TextIO
) -> int:
    for stream in (stdout, stderr):
        _pass_file_names_through(stream)
    try:
        config, info = build_config_and_info(args, cwd)
    except ConfigError as err:
        print(f"gpu2tpu: error: {err}", file=stderr)
        return 2
    if "ALL" in config.options.select:
        config = dataclasses.replace(config, options=dataclasses.replace(config.options, select=()))
    problem = _check_codes(config)
    if problem:
        print(f"gpu2tpu: error: {problem}", file=stderr)
        return 2
    if args.command == "check":
        mode = Mode.CHECK
    elif args.diff:
        mode = Mode.DIFF
    elif args.check:
        mode = Mode.DRY
    else:
        mode = Mode.WRITE
    if args.paths == ["-"]:
        return _run_stdin(args, config, mode, stdin, stdout, stderr)
    paths = force_exclude(args.paths, config) if args.force_exclude else args.paths
    report = run(paths, config, mode)
    fmt = getattr(args, "format", "text")
    output_file = getattr(args, "output_file", None)
    if mode is Mode.CHECK and (fmt != "text" or output_file):
        text = escape_surrogates(render_report(report, fmt, info, quiet=args.quiet), fmt)
        try:
            if output_file:
                write_report(Path(output_file), text)
            else:
                stdout.write(text)
                stdout.flush()
        except OSError as err:
            print(f"gpu2tpu: error: cannot write {output_file}: {err.strerror or err}", file=stderr)
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


def _pass_file_names_through(stream: TextIO) -> None:
    """A file name that is not UTF-8 is printed as its own bytes, as `ls` does, instead of
    raising UnicodeEncodeError on a terminal whose encoding is strict (the reports, which must
    be UTF-8, escape it instead: `escape_surrogates`)."""
    if getattr(stream, "errors", None) != "strict":
        return
    with contextlib.suppress(AttributeError, ValueError, OSError):
        stream.reconfigure(errors="surrogateescape")  # type: ignore[attr-defined]


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
        return byte % (code - 0xDC00)  # noqa: UP031 (the pattern is chosen above)
    return f"\\u{code:04x}"


def force_exclude(paths: list[str], config: Config) -> list[str]:
    """The paths that the exclude patterns (defaults and `[tool.gpu2tpu] exclude`) leave: with
    `--force-exclude` they apply to files named on the command line too, as pre-commit names
    every staged file."""
    from .engine import DEFAULT_EXCLUDES, _excluded, _prefixes

    patterns = (*DEFAULT_EXCLUDES, *config.exclude)
    kept = []
    for raw in paths:
        rel = Path(raw).as_posix()
        if config.root is not None:
            with contextlib.suppress(ValueError, OSError):
                rel = Path(raw).resolve().relative_to(config.root.resolve()).as_posix()
        if raw == "-" or not any(_excluded(p, Path(p).name, patterns) for p in _prefixes(rel)):
            kept.append(raw)
    return kept


def _print_errors(report: RunReport, stderr: TextIO) -> None:
    for line in error_lines(report):
        print(line, file=stderr)
    stderr.flush()


def _run_stdin(
    args: argparse.Namespace,
    config: Config,
    mode: Mode,
    stdin: TextIO,
    stdout: TextIO,
    stderr: TextIO,
) -> int:
    """`gpu2tpu rewrite -`: text in, rewritten text out (for editors and pipes).

    The output keeps the input's encoding (a PEP 263 declaration such as latin-1) and BOM. On
    an error the input goes out unchanged, byte for byte, with one error line on stderr.
    """
    from .source import SourceError, rewrite_source
    from .torch_target import rewrite_for_target

    name = args.stdin_filename or "-"
    data = stdin.buffer.read() if hasattr(stdin, "buffer") else stdin.read().encode()
    try:
        decoded = decode_source(data)
        result = rewrite_for_target(rewrite_source, decoded.text, config.options)
    except (SourceError, ValueError, RecursionError) as err:
        reason = getattr(err, "reason", None) or str(err) or "too deeply nested to parse"
        line = getattr(err, "line", None)
        where = f" (line {line})" if line else ""
        print(f"error: {name}: {reason}{where}; left as it is", file=stderr)
        if mode is Mode.WRITE:
            _write_bytes(stdout, data)
        return 2
    text = decoded.text
    if mode is Mode.CHECK:
        for item in result.all:
            print(finding_line(name, item), file=stdout)
        return int(bool(result.all))
    code = int(result.new_text != text)
    if mode is Mode.WRITE:
        try:
            out = _encode(result.new_text, decoded.encoding)
        except UnicodeEncodeError as err:
            print(f"error: {name}: cannot encode the result as {err.encoding}", file=stderr)
            _write_bytes(stdout, data)
            return 2
        _write_bytes(stdout, out)
        for item in result.findings:
            print(finding_line(name, item, show_fix=False), file=stderr)
        code = int(bool(result.findings))
    elif mode is Mode.DIFF:
        from .engine import unified_diff

        diff = unified_diff(name, text, result.new_text)
        _write_bytes(stdout, diff.encode(decoded.encoding.removesuffix("-sig"), "replace"))
        for item in result.withheld:
            print(finding_line(name, item, show_fix=False), file=stderr)
    if result.withheld:
        print(withheld_line(len(result.withheld)), file=stderr)
        code = max(code, 1)
    return code


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
        return run_rewrite_command(args, Path(os.getcwd()), sys.stdin, sys.stdout, sys.stderr)


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
