"""What `gpu2tpu check` and `gpu2tpu rewrite` do with their parsed arguments."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from .engine import Config, ConfigError, Mode, decode_source, load_config, run
from .model import Options
from .report import (
    error_lines,
    exit_code,
    finding_line,
    finding_lines,
    print_summary,
    render_csv,
    render_json,
)


def build_config(args: argparse.Namespace, cwd: Path) -> Config:
    """Command-line options over `[tool.gpu2tpu]` over the defaults."""
    section = load_config(cwd)
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
        ),
        exclude=tuple(section.get("exclude", [])) + tuple(args.exclude),
        jobs=args.jobs,
        root=section.get("__root__"),
    )
    if max_bytes is not None:
        if not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ConfigError("[tool.gpu2tpu] max-file-size must be a positive number of bytes")
        config = Config(config.options, config.exclude, max_bytes, config.jobs, config.root)
    return config


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
        config = build_config(args, cwd)
    except ConfigError as err:
        print(f"gpu2tpu: error: {err}", file=stderr)
        return 2
    if "ALL" in config.options.select:
        config = Config(
            Options(select=(), ignore=config.options.ignore, unsafe_fixes=config.options.unsafe_fixes),
            config.exclude, config.max_bytes, config.jobs, config.root,
        )  # fmt: skip
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
    report = run(args.paths, config, mode)
    fmt = getattr(args, "format", "text")
    if mode is Mode.CHECK and fmt == "json":
        stdout.write(render_json(report))
        for line in error_lines(report):
            print(line, file=stderr)
        return exit_code(report)
    if mode is Mode.CHECK and fmt == "csv":
        stdout.write(render_csv(report))
        for line in error_lines(report):
            print(line, file=stderr)
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
    for line in error_lines(report):
        print(line, file=stderr)
    print_summary(report, stderr if mode is Mode.DIFF else stdout)
    return exit_code(report)


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

    name = args.stdin_filename or "-"
    data = stdin.buffer.read() if hasattr(stdin, "buffer") else stdin.read().encode()
    try:
        text = decode_source(data).text
        result = rewrite_source(text, config.options)
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
