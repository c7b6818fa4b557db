"""The `gpu2tpu` command: argument parsing only; each subcommand calls into the package.

Exit codes, as ruff and black: 0 clean, 1 changes or findings, 2 a usage error or files that
could not be processed (the others are still processed and reported).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path
from typing import Any

from . import __version__

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
        from .rewrite.cli_run import run_rewrite_command

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


class Rules:
    """`gpu2tpu rules [CODE]`: the rules, or one explained."""

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("code", nargs="?", help="a rule code")
        p.add_argument("--format", choices=["text", "json"], default="text")

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        from .rewrite.rules_doc import explain_rules

        return explain_rules(args.code, args.format, sys.stdout, sys.stderr)


# name -> (help, where the command lives: "module" or "module:attribute"). Each command
# exposes `add_arguments(parser)` and `run(args) -> int`; only the one asked for is imported,
# so `gpu2tpu check` does not load the doctor, and `--version` loads none.
COMMANDS: dict[str, tuple[str, str]] = {
    "check": ("list CUDA-specific code and TPU hazards (writes nothing)", "gpu2tpu.cli:Check"),
    "rewrite": (
        "rewrite CUDA-specific code into device-agnostic code",
        "gpu2tpu.cli:Rewrite",
    ),
    "doctor": (
        "check that this environment can run PyTorch on a TPU; says how to fix it",
        "gpu2tpu.readiness.doctor",
    ),
    "new": (
        "create a notebook from a template (`gpu2tpu new demo.ipynb --template migrate`)",
        "gpu2tpu.templates",
    ),
    "rules": ("list the rules, or explain one (`gpu2tpu rules G2T101`)", "gpu2tpu.cli:Rules"),
}


def _command(name: str) -> Any:
    module, _, attribute = COMMANDS[name][1].partition(":")
    found = importlib.import_module(module)
    return getattr(found, attribute) if attribute else found


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The one parser tree. With `command`, only that subcommand's options are added (its
    module imported); without, every subcommand's are."""
    parser = argparse.ArgumentParser(
        prog="gpu2tpu",
        description="Move CUDA-first PyTorch code and notebooks to TPUs.",
    )
    parser.add_argument("--version", action="version", version=f"gpu2tpu {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (text, _where) in COMMANDS.items():
        sub_parser = sub.add_parser(name, help=text, description=text)
        if command in (None, name):
            implementation = _command(name)
            implementation.add_arguments(sub_parser)
            sub_parser.set_defaults(run=implementation.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    from ._extras import MissingExtraError, extra_needed

    try:
        with extra_needed("this command"):
            return _main(argv)
    except MissingExtraError as err:
        print(f"gpu2tpu: error: {err}", file=sys.stderr)
        return 2


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # The top level takes only options (--help, --version): the first other word is the command.
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command if command in COMMANDS else "")
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return int(args.run(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
