"""What `gpu2tpu check` and `gpu2tpu rewrite` do with their parsed arguments."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
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
        text = render_report(report, fmt, info, quiet=args.quiet)
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
            write_report(Path(report_path), render_report(report, "markdown", info))
        except OSError as err:
            print(f"gpu2tpu: error: cannot write {report_path}: {err.strerror or err}", file=stderr)
            return 2
    print_summary(report, stderr if mode is Mode.DIFF else stdout, info)
    return exit_code(report)


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
    """`gpu2tpu rewrite -`: text in, rewritten text out (for editors and pipes)."""
    from .source import SourceError, rewrite_source
    from .torch_target import rewrite_for_target

    name = args.stdin_filename or "-"
    data = stdin.buffer.read() if hasattr(stdin, "buffer") else stdin.read().encode()
    try:
        text = decode_source(data).text
        result = rewrite_for_target(rewrite_source, text, config.options)
    except SourceError as err:
        print(f"error: {name}: {err.reason}", file=stderr)
        if mode is Mode.WRITE:
            stdout.write(data.decode("utf-8", "replace"))
        return 2
    except ValueError as err:
        print(f"error: {name}: {err}", file=stderr)
        return 2
    if mode is Mode.CHECK:
        for item in result.all:
            print(finding_line(name, item), file=stdout)
        return int(bool(result.all))
    if mode is Mode.WRITE:
        stdout.write(result.new_text)
        for item in result.findings:
            print(finding_line(name, item, show_fix=False), file=stderr)
        return int(bool(result.findings))
    if mode is Mode.DIFF:
        from .engine import unified_diff

        stdout.write(unified_diff(name, text, result.new_text))
    return int(result.new_text != text)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(2)
