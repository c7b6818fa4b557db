"""Run a function in a forked child process and bring its result (or its error) back.

The forecast needs torchax, and importing torchax changes the process for good: it renames
PyTorch's PrivateUse1 backend to "jax", so `torch.accelerator.current_accelerator()` answers
"jax" from then on and device-agnostic code would put the user's tensors on torchax. A forked
child does the compiling instead; the user's session never imports torchax. Fork (not spawn)
because the child must see the user's model as it is, including classes defined in a
notebook, without pickling it. The result must pickle.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class ChildDied(RuntimeError):
    """The child died without a word (killed, out of memory)."""


def can_fork() -> bool:
    return hasattr(os, "fork") and "fork" in multiprocessing.get_all_start_methods()


def _child(conn: Any, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:  # the parent re-raises it
        try:
            conn.send(("error", exc, traceback.format_exc()))
        except Exception:  # an error that does not pickle: send its text
            conn.send(
                ("error", RuntimeError(f"{type(exc).__name__}: {exc}"), traceback.format_exc())
            )
    else:
        conn.send(("ok", result, ""))
    finally:
        conn.close()
        sys.stdout.flush()
        sys.stderr.flush()


def run_in_child(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` in a forked child; its exception is re-raised here."""
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(send, fn, args, kwargs), daemon=True)
    process.start()
    send.close()
    try:
        status, value, text = receive.recv()
    except EOFError:
        process.join()
        raise ChildDied(
            f"the forecast's child process ended without a result (exit code {process.exitcode}); "
            "it may have run out of memory"
        ) from None
    except BaseException:  # KeyboardInterrupt: stop the child too
        process.terminate()
        process.join()
        raise
    finally:
        receive.close()
    process.join()
    if status == "error":
        # gpu2tpu's own errors are sentences for the user; anything else keeps its traceback.
        ours = type(value).__module__.startswith("gpu2tpu")
        if text and not ours and not getattr(value, "__notes__", None):
            value.add_note("in the forecast's child process:\n" + text.rstrip())
        raise value
    return value
