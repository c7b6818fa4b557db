"""`%%tpu` and `%tpu_auto`: rewrite a cell on the fly and run it on a TPU backend.

A cell goes through IPython's own input transforms (`shell.transform_cell`), then the codemod
(`rewrite_source`), and is compiled under a name registered in IPython's compile cache, so a
traceback reads `Cell In[n], line k` and shows the cell's line k. The rewrite keeps lines in
place: the device variable is defined in the user namespace beforehand instead of being
written into the cell, an `import torch` the codemod would add is replaced by binding `torch`
in the namespace, and any other added line is folded onto the line it precedes. The code
runs in the user namespace inside the backend's `activate()`; the last expression is the
magic's return value, so it shows as `Out[n]`; errors propagate, so a notebook run stops.
"""

from __future__ import annotations

import ast
import difflib
import functools
import io
import re
import sys
from collections.abc import Callable
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field, replace
from types import CodeType, ModuleType
from typing import TYPE_CHECKING, Any

from IPython.core import magic_arguments
from IPython.core.error import UsageError
from IPython.core.magic import (
    Magics,
    cell_magic,
    line_magic,
    magics_class,
    no_var_expand,
    output_can_be_silenced,
)

from ..backends import (
    BACKEND_NAMES,
    Backend,
    BackendUnavailable,
    UnknownBackend,
    choose_backend,
    get_backend,
)

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from ..profile.dryrun import DryRunReport
    from ..rewrite.model import Result

# The variable rewritten cells use for the device; another name when the user has one of
# their own that is not a device.
DEVICE_VARIABLE = "device"
FALLBACK_DEVICE_VARIABLE = "tpu_device"
# Cell magics whose body is Python run in the user namespace: `%%tpu` over one of them
# rewrites the inner body and hands it on, so `%%tpu` + `%%time` works in either order.
NESTED_PYTHON_MAGICS = frozenset({"time", "timeit", "capture", "prun"})
# How many cells' shape histories the dry run keeps (one per distinct cell text).
_HISTORY_LIMIT = 256


@dataclass
class PreparedCell:
    """A cell ready to run: its code objects and what the rewrite did."""

    filename: str
    body: CodeType | None
    last: CodeType | None
    source: str  # after IPython's transforms
    rewritten: str  # after the codemod (what runs)
    result: Result | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.rewritten != self.source


# -- line-preserving rewrite ---------------------------------------------------------------------


def rewrite_in_place(
    source: str, device_name: str, namespace: dict[str, Any]
) -> tuple[str, Result | None]:
    """The codemod's text for `source`, with every line where it was.

    A cell rarely imports torch itself (an earlier cell did), but the codemod recognises
    `torch.cuda.*` by its import; so the torch modules bound in the namespace are declared
    to it as import lines in front of the cell, and cut off again afterwards. Finding lines
    in the result are the cell's own. Returns the source unchanged (and no result) when it
    does not parse: compiling it then raises Python's own SyntaxError at the user's line.
    """
    prelude = _torch_imports(namespace)
    new, result, needs_torch = _rewrite_cached(source, device_name, prelude)
    if needs_torch:
        import torch

        namespace.setdefault("torch", torch)
    return new, result


@functools.lru_cache(maxsize=256)
def _rewrite_cached(source: str, device_name: str, prelude: str) -> tuple[str, Result | None, bool]:
    """`rewrite_in_place` as a pure function, cached: re-running a cell costs no rewrite.

    Only the top-level statements that hold one of the rules' trigger tokens (and the
    imports) go to the codemod; the others become blank lines, so libcst's cost follows the
    CUDA-specific part of a cell rather than its length, and every line keeps its number.
    Returns (text, result, whether `torch` must be bound in the namespace).
    """
    from ..rewrite.model import Options
    from ..rewrite.source import SourceError, rewrite_source

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return source, None, False  # compiling it raises the user's SyntaxError
    lines = source.splitlines(keepends=True)
    keep = _statement_lines(tree, lines, _trigger_tokens())
    if not keep:
        return source, None, False
    sparse = "".join(line if i in keep else _blank(line) for i, line in enumerate(lines))
    options = Options(device_name=device_name, define_device=False)
    try:
        result = rewrite_source(prelude + sparse, options)
        new = result.new_text
        if prelude and not new.startswith(prelude):  # a rule touched the declared imports
            prelude = ""
            result = rewrite_source(sparse, options)
            new = result.new_text
    except SourceError:
        return source, None, False
    if prelude:
        new = new[len(prelude) :]
        shift = prelude.count("\n")
        result = replace(
            result,
            new_text=new,
            edits=tuple(replace(f, line=f.line - shift) for f in result.edits),
            findings=tuple(replace(f, line=f.line - shift) for f in result.findings),
        )
    if new == sparse:
        return source, result, False
    needs_torch = False
    if new.count("\n") != sparse.count("\n"):
        new, needs_torch = _fold_added_lines(sparse, new)
    new_lines = new.splitlines(keepends=True)
    if len(new_lines) != len(lines):  # could not keep lines in place: run the cell as written
        return source, result, False
    merged = "".join(new_lines[i] if i in keep else line for i, line in enumerate(lines))
    return merged, replace(result, new_text=merged), needs_torch


@functools.cache
def _trigger_tokens() -> re.Pattern[bytes]:
    """One pattern for every rule's trigger tokens: a single scan per statement."""
    from ..rewrite.model import Options
    from ..rewrite.source import prefilter_tokens

    return re.compile(b"|".join(re.escape(t) for t in prefilter_tokens(Options())))


def _statement_lines(tree: ast.Module, lines: list[str], tokens: re.Pattern[bytes]) -> set[int]:
    """0-based lines of the top-level statements the codemod must see: those holding a
    trigger token, plus every import (rules resolve names through them); none if no trigger."""
    triggered: set[int] = set()
    imports: set[int] = set()
    for stmt in tree.body:
        first = min([stmt.lineno, *(d.lineno for d in getattr(stmt, "decorator_list", ()))]) - 1
        span = range(first, stmt.end_lineno or stmt.lineno)
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            imports.update(span)
        text = "".join(lines[i] for i in span).encode("utf-8", "surrogatepass")
        if tokens.search(text):
            triggered.update(span)
    return triggered | imports if triggered else set()


def _blank(line: str) -> str:
    """An empty line with the same line ending."""
    return line[len(line.rstrip("\r\n")) :] or ""


def _torch_imports(namespace: dict[str, Any]) -> str:
    """`import torch` (and `import torch.nn as nn`, ...) for torch modules the namespace binds."""
    lines = []
    for name, value in list(namespace.items()):
        module = getattr(value, "__name__", None)
        if not isinstance(value, ModuleType) or not isinstance(module, str):
            continue
        torch_module = (module == "torch" or module.startswith("torch.")) and "cuda" not in module
        if torch_module and name.isidentifier() and not name.startswith("_"):
            lines.append(f"import {module}\n" if name == module else f"import {module} as {name}\n")
    return "".join(sorted(lines))


def _fold_added_lines(old: str, new: str) -> tuple[str, bool]:
    """Remove the lines the codemod added, keeping their effect without moving any line.

    An added `import torch` is dropped and reported (the caller binds `torch` in the
    namespace); another added statement is joined onto the next non-blank line with `;`.
    """
    old_lines = old.splitlines(keepends=True)
    new_lines = new.splitlines(keepends=True)
    out: list[str] = []
    carry: list[str] = []
    needs_torch = False
    matcher = difflib.SequenceMatcher(a=old_lines, b=new_lines, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        block = new_lines[j1:j2]
        if tag == "insert" or (tag == "replace" and j2 - j1 > i2 - i1):
            extra = (j2 - j1) - (i2 - i1)
            added, block = block[:extra], block[extra:]
            for line in added:
                text = line.strip()
                if text == "import torch":
                    needs_torch = True
                elif text:
                    carry.append(text)
        for line in block:
            if carry and line.strip():
                indent = line[: len(line) - len(line.lstrip())]
                line = f"{indent}{'; '.join(carry)}; {line.lstrip()}"
                carry = []
            out.append(line)
    return "".join(out), needs_torch


def _leading_blank_lines(cell: str, transformed: str) -> int:
    """Blank lines IPython's transforms dropped from the top of the cell (they shift lines)."""
    raw = cell.splitlines()
    blank = 0
    for line in raw:
        if line.strip():
            break
        blank += 1
    if blank and len(transformed.splitlines()) + blank <= len(raw):
        return blank
    return 0


# -- the runner ------------------------------------------------------------------------------------


class CellRunner:
    """Prepare and run cells for one shell: the part of `%%tpu` that is not argument parsing."""

    def __init__(self, shell: InteractiveShell) -> None:
        self.shell = shell
        self._injected: Any = None  # the device object this runner last put in the namespace
        self.histories: dict[str, Any] = {}
        self.last_report: DryRunReport | None = None

    def device_variable(self, backend: Backend) -> str:
        """Bind the device variable for `backend` in the user namespace; return its name.

        A `device` the user made (a torch.device or a string, e.g. from a rewritten
        `device = torch.device("cuda" if ...)` line) is theirs and stays; one this runner put
        there is refreshed for the current backend.
        """
        import torch

        ns = self.shell.user_ns
        current = ns.get(DEVICE_VARIABLE)
        if current is None or current is self._injected:
            self._injected = backend.device()
            ns[DEVICE_VARIABLE] = self._injected
            return DEVICE_VARIABLE
        if isinstance(current, torch.device | str):
            return DEVICE_VARIABLE
        ns[FALLBACK_DEVICE_VARIABLE] = backend.device()
        return FALLBACK_DEVICE_VARIABLE

    def prepare(
        self,
        cell: str,
        *,
        header_lines: int = 1,
        rewrite: bool = True,
        device_name: str = DEVICE_VARIABLE,
        header: str = "",
    ) -> PreparedCell:
        """Transform, rewrite and compile `cell`; raise SyntaxError at the user's line.

        `header_lines` lines precede the body in the notebook cell (the `%%tpu` line), so the
        registered text starts with them and line k of the traceback is line k of the cell.
        """
        shell = self.shell
        source = shell.transform_cell(cell)
        result = None
        rewritten = source
        if rewrite:
            rewritten, result = rewrite_in_place(source, device_name, shell.user_ns)
        pad = header_lines + _leading_blank_lines(cell, source)
        head = [header] + [""] * (pad - 1) if pad else []
        text = "".join(line + "\n" for line in head) + rewritten
        filename = shell.compile.cache(text, shell.execution_count, raw_code=cell)
        code_text = "\n" * pad + rewritten
        tree = shell.compile.ast_parse(code_text, filename=filename)
        tree = shell.transform_ast(tree)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            expr = ast.Expression(tree.body.pop().value)
            last = shell.compile(expr, filename, "eval")
        body = shell.compile(tree, filename, "exec") if tree.body else None
        return PreparedCell(filename, body, last, source, rewritten, result)

    def execute(self, prepared: PreparedCell, namespace: dict[str, Any]) -> Any:
        """Run the prepared code once in `namespace`; the last expression's value."""
        __tracebackhide__ = True  # noqa: F841  (IPython hides this frame in tracebacks)
        if prepared.body is not None:
            exec(prepared.body, namespace)
        if prepared.last is not None:
            return eval(prepared.last, namespace)
        return None

    def dry_run_history(self, key: str) -> Any:
        from ..profile.dryrun import ShapeHistory

        history = self.histories.pop(key, None) or ShapeHistory()
        self.histories[key] = history  # most recent last
        while len(self.histories) > _HISTORY_LIMIT:
            self.histories.pop(next(iter(self.histories)))
        return history


def diff_text(prepared: PreparedCell, label: str, backend: Backend) -> str:
    """A unified diff of the cell as written and as it runs."""
    lines = difflib.unified_diff(
        prepared.source.splitlines(keepends=True),
        prepared.rewritten.splitlines(keepends=True),
        fromfile=f"{label} (as written)",
        tofile=f"{label} (as run on {backend.name})",
    )
    text = "".join(line if line.endswith("\n") else line + "\n" for line in lines)
    return text or f"{label}: nothing to rewrite\n"


def _findings_text(prepared: PreparedCell, header_lines: int) -> str:
    """Report-only findings (what the codemod could not fix), one line each."""
    if prepared.result is None:
        return ""
    out = io.StringIO()
    for f in prepared.result.findings:
        hint = f" ({f.hint})" if f.hint else ""
        out.write(f"gpu2tpu: line {f.line + header_lines}: {f.code} {f.message}{hint}\n")
    return out.getvalue()


def _add_note(error: BaseException, backend: Backend, source: str) -> None:
    note = backend.explain_failure(error, source)
    if note and note not in getattr(error, "__notes__", ()):
        error.add_note(note)


# -- the magics --------------------------------------------------------------------------------


def _note_torchax(backend: Backend) -> None:
    """Say once, before torchax loads, that it changes torch for the rest of the session."""
    if backend.name == "jax" and "torchax" not in sys.modules:
        print(
            "gpu2tpu: loading torchax, which makes 'jax' torch's accelerator for the rest of "
            "this session (cells outside %%tpu that ask torch.accelerator will see 'jax')"
        )


def _resolve(name: str, dry_run: bool) -> tuple[Backend, str, bool]:
    """The backend for `--backend name`, the line that says why, and whether to dry-run."""
    try:
        if dry_run:
            return get_backend("cpu"), "dry run on the CPU (--dry-run)", True
        backend, reason = choose_backend(name)
    except (UnknownBackend, BackendUnavailable) as err:
        raise UsageError(str(err)) from None
    return backend, reason, name == "auto" and backend.name == "cpu"


@magics_class
class TPUMagics(Magics):
    """`%%tpu`, `%tpu_auto` and `%tpu_info`."""

    def __init__(self, shell: InteractiveShell) -> None:
        super().__init__(shell)
        self.runner = CellRunner(shell)
        self.auto: AutoMode | None = None
        self._last_reason: str | None = None

    def _say_choice(self, reason: str) -> None:
        """Print `auto`'s choice when it is new for this session (not on every cell)."""
        if reason != self._last_reason:
            self._last_reason = reason
            print(f"gpu2tpu: {reason}")

    @magic_arguments.magic_arguments()
    @magic_arguments.argument(
        "--backend",
        "-b",
        default="auto",
        metavar="NAME",
        help=(
            "where to run: auto (TorchTPU, then PyTorch/XLA, else the CPU dry run), tpu "
            "(TorchTPU), xla (PyTorch/XLA), jax (torchax on JAX), cuda, cpu. A named backend "
            "that is not available is an error, never a silent fallback."
        ),
    )
    @magic_arguments.argument(
        "--no-rewrite",
        action="store_true",
        help="run the cell as written, without the CUDA-to-device rewrite",
    )
    @magic_arguments.argument(
        "--show-diff",
        action="store_true",
        help="print the rewrite as a unified diff before running the cell",
    )
    @magic_arguments.argument(
        "--dry-run",
        action="store_true",
        help=(
            "run on the CPU and report what would hurt on a TPU (host syncs, float64, "
            "data-dependent shapes, shape changes between runs), with the cell's lines"
        ),
    )
    @magic_arguments.argument(
        "--profile",
        action="store_true",
        help="run the cell as a training step under the profiler (gpu2tpu.profile.cell_profile)",
    )
    @magic_arguments.argument(
        "--forecast",
        metavar="TARGETS",
        default=None,
        help=(
            "comma-separated TPU targets (e.g. v5e,v6e) to forecast the cell's step for "
            "(gpu2tpu.profile.forecast_cell)"
        ),
    )
    @no_var_expand
    @output_can_be_silenced
    @cell_magic
    def tpu(self, line: str, cell: str) -> Any:
        """Rewrite this cell's CUDA-specific PyTorch on the fly and run it on a TPU backend.

        The cell runs in the notebook's namespace with the backend's device as torch's
        default device and as the `device` variable, restored afterwards even when the cell
        fails. The last expression is shown as in a normal cell; errors show the cell's own
        line numbers. With no TPU backend, `auto` runs a dry run on the CPU.
        """
        __tracebackhide__ = True  # noqa: F841
        args = magic_arguments.parse_argstring(self.tpu, line)
        if not cell.strip():
            raise UsageError("%%tpu needs code in the cell below the %%tpu line")
        backend, reason, dry = _resolve(args.backend, args.dry_run)
        if args.backend == "auto" and not args.dry_run:
            self._say_choice(reason)
        _note_torchax(backend)
        header = f"%%tpu {line}".rstrip()
        namespace = self.shell.user_ns
        nested = _nested_magic(cell)
        if nested is not None:
            return self._run_nested(nested, backend, args)
        device_name = self.runner.device_variable(backend)
        try:
            prepared = self.runner.prepare(
                cell,
                header_lines=_cell_magic_depth(),
                rewrite=not args.no_rewrite,
                device_name=device_name,
                header=header,
            )
        except SyntaxError as err:
            # The user's line is in the error itself; the frames that compiled it are noise.
            raise err.with_traceback(None) from None
        label = f"In[{self.shell.execution_count}]"
        if args.show_diff:
            sys.stdout.write(diff_text(prepared, label, backend))
        findings = _findings_text(prepared, 1)
        if findings:
            sys.stderr.write(findings)
        run = self._runner_for(prepared, namespace, backend)
        if args.profile or args.forecast:
            return self._hooked(args, run, backend, prepared)
        if dry:
            return self._dry_run(prepared, namespace, backend, label)
        return run()

    def _runner_for(
        self, prepared: PreparedCell, namespace: dict[str, Any], backend: Backend
    ) -> Callable[[], Any]:
        runner = self.runner

        def run() -> Any:
            __tracebackhide__ = True  # noqa: F841
            try:
                with backend.activate():
                    value = runner.execute(prepared, namespace)
                    if backend.sync_after_cell:
                        backend.synchronize()
                    return value
            except Exception as err:
                _add_note(err, backend, prepared.rewritten)
                raise

        return run

    def _dry_run(
        self, prepared: PreparedCell, namespace: dict[str, Any], backend: Backend, label: str
    ) -> Any:
        __tracebackhide__ = True  # noqa: F841
        from IPython.display import display

        from ..profile.dryrun import DryRunDetector

        history = self.runner.dry_run_history(prepared.rewritten)
        detector = DryRunDetector({prepared.filename}, label=label, history=history)
        try:
            with backend.activate(), detector:
                value = self.runner.execute(prepared, namespace)
        except Exception as err:
            _add_note(err, backend, prepared.rewritten)
            self.runner.last_report = detector.report(err)
            self.shell.user_ns["_tpu_dry_run"] = self.runner.last_report
            raise
        report = detector.report()
        self.runner.last_report = report
        self.shell.user_ns["_tpu_dry_run"] = report
        display(report)
        return value

    def _hooked(self, args: Any, run: Callable[[], Any], backend: Backend, prepared: Any) -> Any:
        """`--profile` / `--forecast`: hand the cell to the profiler or the forecast."""
        import importlib

        profile = importlib.import_module("gpu2tpu.profile")
        if args.profile:
            cell_profile = getattr(profile, "cell_profile", None)
            if cell_profile is None:
                raise UsageError(
                    "%%tpu --profile needs gpu2tpu.profile.cell_profile, which this install lacks"
                )
            return cell_profile(run, backend=backend)
        forecast_cell = getattr(profile, "forecast_cell", None)
        if forecast_cell is None:
            raise UsageError(
                "%%tpu --forecast needs gpu2tpu.profile.forecast_cell, which this install lacks"
            )
        targets = [t.strip() for t in args.forecast.split(",") if t.strip()]
        return forecast_cell(run, targets=targets, backend=backend, source=prepared.rewritten)

    def _run_nested(self, nested: tuple[str, str, str], backend: Backend, args: Any) -> Any:
        """`%%tpu` over `%%time` (or another Python cell magic): rewrite its body, run it."""
        __tracebackhide__ = True  # noqa: F841
        name, inner_line, body = nested
        if args.dry_run or args.profile or args.forecast:
            raise UsageError(
                f"%%tpu --dry-run/--profile/--forecast cannot wrap %%{name}; put %%{name} first"
            )
        device_name = self.runner.device_variable(backend)
        source = self.shell.transform_cell(body)
        rewritten = source
        if not args.no_rewrite:
            rewritten, _ = rewrite_in_place(source, device_name, self.shell.user_ns)
        if args.show_diff:
            diff = difflib.unified_diff(
                source.splitlines(keepends=True),
                rewritten.splitlines(keepends=True),
                fromfile=f"%%{name} body (as written)",
                tofile=f"%%{name} body (as run on {backend.name})",
            )
            sys.stdout.write("".join(diff))
        try:
            with backend.activate():
                return self.shell.run_cell_magic(name, inner_line, rewritten)
        except Exception as err:
            _add_note(err, backend, rewritten)
            raise

    @line_magic
    def tpu_auto(self, line: str) -> None:
        """`%tpu_auto on [--backend NAME]` rewrites and runs every later cell on a TPU backend;
        `%tpu_auto off` stops; `%tpu_auto` says whether it is on.

        With no TPU backend, `auto` runs the cells on the CPU (use `%%tpu --dry-run` on a
        cell to see what would hurt on a TPU).
        """
        words = line.split()
        if not words:
            state = f"on ({self.auto.backend.name})" if self.auto else "off"
            print(f"gpu2tpu: auto mode is {state}")
            return
        if words[0] == "off" and len(words) == 1:
            if self.auto is not None:
                self.auto.stop()
                self.auto = None
            print("gpu2tpu: auto mode off")
            return
        if words[0] != "on":
            raise UsageError("usage: %tpu_auto on [--backend NAME] | %tpu_auto off")
        name = "auto"
        rest = words[1:]
        if rest:
            if rest[0] in ("--backend", "-b") and len(rest) == 2:
                name = rest[1]
            elif rest[0].startswith("--backend=") and len(rest) == 1:
                name = rest[0].split("=", 1)[1]
            else:
                raise UsageError(f"%tpu_auto: unrecognized arguments: {' '.join(rest)}")
        backend, reason, _dry = _resolve(name, False)
        _note_torchax(backend)
        if self.auto is not None:
            self.auto.stop()
        self.auto = AutoMode(self.shell, self.runner, backend)
        self.auto.start()
        print(
            f"gpu2tpu: auto mode on: every cell is rewritten and run on {backend.name} ({reason})"
        )

    @line_magic
    def tpu_info(self, line: str) -> Any:
        """Backends found and missing (with the install command), chips, memory, versions."""
        from .info import show_info

        return show_info(self.shell)

    @line_magic
    def tpu_doctor(self, line: str) -> None:
        """Check that this environment can run PyTorch on a TPU: versions that fit together,
        where the notebook runs (Colab, Kaggle, Cloud TPU VM), and the command that fixes
        each problem. A widget in notebooks, text elsewhere (`gpu2tpu doctor` in a shell)."""
        from ..readiness.doctor import doctor_magic_output

        doctor_magic_output(self.shell)

    def close(self) -> None:
        """Remove auto mode's hooks (used by `%unload_ext`)."""
        if self.auto is not None:
            self.auto.stop()
            self.auto = None


def _cell_magic_depth() -> int:
    """How many cell-magic lines precede this body in the cell: 1 for `%%tpu` itself, one
    more for each cell magic above it (`%%time` then `%%tpu` puts the body at line 3)."""
    from IPython.core.interactiveshell import InteractiveShell

    target = InteractiveShell.run_cell_magic.__code__
    depth = 0
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is target:
            depth += 1
        frame = frame.f_back
    return max(depth, 1)


def _nested_magic(cell: str) -> tuple[str, str, str] | None:
    """(`time`, its line, its body) when the cell starts with a Python cell magic."""
    stripped = cell.lstrip("\n")
    if not stripped.startswith("%%"):
        return None
    first, _, body = stripped.partition("\n")
    name, _, inner_line = first[2:].partition(" ")
    if name in NESTED_PYTHON_MAGICS:
        return name, inner_line, body
    return None


class AutoMode:
    """`%tpu_auto on`: an input transformer that rewrites each cell, and run events that set
    the backend's device around it. `stop()` removes both."""

    def __init__(self, shell: InteractiveShell, runner: CellRunner, backend: Backend) -> None:
        self.shell = shell
        self.runner = runner
        self.backend = backend
        self._stack: ExitStack | None = None
        self._device_name = DEVICE_VARIABLE

    def transform(self, lines: list[str]) -> list[str]:
        """IPython post-input transformer: the rewritten cell, line for line."""
        text = "".join(lines)
        if not text.strip():
            return lines
        new, _result = rewrite_in_place(text, self._device_name, self.shell.user_ns)
        return new.splitlines(keepends=True)

    def pre_run_cell(self, info: Any) -> None:
        self._device_name = self.runner.device_variable(self.backend)
        self._close()
        stack = ExitStack()
        stack.enter_context(self.backend.activate())
        self._stack = stack

    def post_run_cell(self, result: Any) -> None:
        self._close()

    def _close(self) -> None:
        if self._stack is not None:
            stack, self._stack = self._stack, None
            stack.close()

    def start(self) -> None:
        self.shell.input_transformers_post.append(self.transform)
        self.shell.events.register("pre_run_cell", self.pre_run_cell)
        self.shell.events.register("post_run_cell", self.post_run_cell)

    def stop(self) -> None:
        if self.transform in self.shell.input_transformers_post:
            self.shell.input_transformers_post.remove(self.transform)
        for event, hook in (
            ("pre_run_cell", self.pre_run_cell),
            ("post_run_cell", self.post_run_cell),
        ):
            with suppress(ValueError):
                self.shell.events.unregister(event, hook)
        self._close()


__all__ = [
    "BACKEND_NAMES",
    "AutoMode",
    "CellRunner",
    "PreparedCell",
    "TPUMagics",
    "diff_text",
    "rewrite_in_place",
]
