"""The `gpu2tpu` command: the parser tree; each subcommand's module adds its own options and
runs it (`COMMANDS`).

Exit codes, as ruff and black: 0 clean, 1 changes or findings, 2 a usage error or files that
could not be processed (the others are still processed and reported), or a run that could not
go on (a standard stream that is closed or full, a bug: never 1, which reads as "findings").
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import signal
import sys
import traceback
from typing import Any

from . import __version__
from ._extras import MissingExtraError, extra_needed
from .rewrite.files.interrupts import checkpoint, release, watch
from .rewrite.files.streams import OutputError, buffered, closed, reopen_closed, silence

# name -> (help, where the command lives: "module" or "module:attribute"). Each command
# exposes `add_arguments(parser)` and `run(args) -> int`; only the one asked for is imported,
# so `gpu2tpu check` does not load the doctor, and `--version` loads none.
COMMANDS: dict[str, tuple[str, str]] = {
    "check": (
        "list CUDA-specific code and TPU hazards (writes nothing)",
        "gpu2tpu.rewrite.cli_run:Check",
    ),
    "rewrite": (
        "rewrite CUDA-specific code into device-agnostic code",
        "gpu2tpu.rewrite.cli_run:Rewrite",
    ),
    "doctor": (
        "check that this environment can run PyTorch on a TPU; says how to fix it",
        "gpu2tpu.readiness.doctor",
    ),
    "new": (
        "create a notebook from a template (`gpu2tpu new demo.ipynb --template migrate`)",
        "gpu2tpu.templates",
    ),
    "rules": (
        "list the rules, or explain one (`gpu2tpu rules G2T101`)",
        "gpu2tpu.rewrite.reports.rules_doc:Rules",
    ),
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
    if 1 in closed():
        _say("gpu2tpu: error: standard output is closed (>&-); nothing was done (send it to a "
             "file or to /dev/null)")  # fmt: skip
        return 2
    if 2 in closed():
        sys.stderr = sys.stdout  # the errors and the summary are not lost: they join stdout
    try:
        with extra_needed("this command"):
            return _main(argv)
    except MissingExtraError as err:
        print(f"gpu2tpu: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return _interrupted()
    except BrokenPipeError:
        return _closed_pipe()
    except OutputError as err:
        return _output_failed(err)
    except OSError as err:  # the system refused something the run needed: one line
        where = f": {err.filename}" if err.filename else ""
        _say(f"gpu2tpu: error: {err.strerror or err}{where}")
        return 2
    except Exception as err:
        if _from_ctrl_c(err):
            return _interrupted()
        with contextlib.suppress(OSError, ValueError, AttributeError):
            traceback.print_exc()
        _say(f"gpu2tpu: error: internal error ({type(err).__name__}); please report it with "
             "the traceback above")  # fmt: skip
        return 2


def _say(line: str) -> None:
    """One line on standard error, which may itself be full or gone."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        print(line, file=sys.stderr, flush=True)


def _output_failed(err: OutputError) -> int:
    """A standard stream could not be written (full, cut short by `ulimit -f`): one line,
    exit 2. The stream is pointed at /dev/null so that Python's own flush at exit, with the
    text still buffered, does not fail again."""
    silence(1 if err.stream == "standard output" else 2)
    _say(err.line)
    return 2


def _interrupted() -> int:
    """Ctrl-C before a run started, or in a command that writes nothing: one line, no
    traceback (check and rewrite say what they wrote themselves: rewrite/cli_run.py)."""
    print("interrupted: 0 files written, every file untouched", file=sys.stderr)  # engine.py
    return 130


def _from_ctrl_c(err: BaseException) -> bool:
    """Whether `err` stands for a Ctrl-C: Python 3.11 wraps one raised while a class is being
    made (a module loading) in RuntimeError("Error calling __set_name__ ...")."""
    seen = 0
    cause: BaseException | None = err
    while cause is not None and seen < 8:
        if isinstance(cause, KeyboardInterrupt):
            return True
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    return False


def entry() -> None:
    """The `gpu2tpu` command (console script and `python -m gpu2tpu`): `main()`, then exit. A
    Ctrl-C once the run has ended changes nothing, so it is ignored from there on."""
    _standard_streams()
    with contextlib.suppress(OSError):  # no descriptor for its socket: Python's own Ctrl-C
        watch()  # Ctrl-C becomes a flag that check and rewrite read where they can stop cleanly
    status = main()
    with contextlib.suppress(ValueError):  # not the main thread
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(_flushed(status))


def _standard_streams() -> None:
    """A standard descriptor closed at the start (`>&-`) gets /dev/null (the next file opened
    would take its number), and Python's stream for it, None then, an object on it. Output
    streams that are unbuffered get a buffer, so that no short write is lost (`buffered`)."""
    with contextlib.suppress(OSError):
        reopen_closed()
    for name, fd, mode in (("stdin", 0, "r"), ("stdout", 1, "w"), ("stderr", 2, "w")):
        if getattr(sys, name) is None:
            with contextlib.suppress(OSError, ValueError):
                setattr(sys, name, open(fd, mode, closefd=False))  # noqa: SIM115  # lives as long as the process
    sys.stdout, sys.stderr = buffered(sys.stdout), buffered(sys.stderr)


def _flushed(status: int) -> int:
    """`status`, or 2 when what is still buffered for standard output cannot be written."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        return _closed_pipe()
    except OSError as err:
        return _output_failed(OutputError("standard output", err))
    return status


def _closed_pipe() -> int:
    """The reader went away (`gpu2tpu check . | head -1`): stop quietly, as Unix tools do
    (they die of SIGPIPE: 128 + 13). Standard output goes to /dev/null so that Python's own
    flush at exit does not fail again (Python's documentation, "Note on SIGPIPE")."""
    import os

    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return 141


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # The top level takes only options (--help, --version): the first other word is the command.
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command if command in COMMANDS else "")
    args = parser.parse_args(argv)
    if args.command in ("check", "rewrite"):
        checkpoint()
    else:
        release()  # the other commands stop on Ctrl-C as Python stops
    if args.command is None:
        parser.print_help()
        return 2
    return int(args.run(args))


if __name__ == "__main__":  # pragma: no cover
    entry()
