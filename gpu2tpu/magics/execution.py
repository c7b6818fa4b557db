"""`%%tpu`, `%tpu_auto`, `%tpu_info` and `%tpu_doctor`: argument parsing and dispatch.

A `%%tpu` cell is rewritten by `rewrite_cell`, the same function `gpu2tpu rewrite` applies to
each cell of a notebook, then goes through IPython's input transforms and is compiled by
`cells.compile_cell` under the cell's number, with the cell as written registered for its
traceback. What the rewrite could not migrate is said first, one line per problem. The code
runs in the user namespace inside the backend's `activate()`; the last expression is the
magic's return value (so it shows as `Out[n]`); errors propagate, so a notebook run stops,
with a note saying what a rewritten line really ran.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import sys
from collections import ChainMap
from collections.abc import Callable
from types import FrameType, ModuleType
from typing import TYPE_CHECKING, Any

from IPython.core import magic_arguments
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class, no_var_expand

from ..backends import (
    BACKEND_NAMES,
    Backend,
    BackendUnavailable,
    UnknownBackend,
    choose_backend,
    get_backend,
)
from .arguments import CellPlan, check
from .auto import AutoLog
from .cells import (
    CELL_SYNTAX_ERRORS,
    DEVICE_VARIABLE,
    FALLBACK_DEVICE_VARIABLE,
    PreparedCell,
    add_notes,
    cell_number,
    compile_cell,
    diff_text,
    execute,
    local_module_lines,
    prior_imports,
    problem_lines,
    replace_stale_devices,
    say,
    show_cell_syntax_error,
    show_user_frames,
    zero_count_lines,
)
from .forecasts import (
    ForecastInputError,
    ForecastMemory,
    could_find_a_model,
    find_forecast_inputs,
    model_in,
)

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from ..readiness.dryrun import DryRunReport
    from ..rewrite.core.model import Options
    from ..rewrite.notebooks.notebook import CellRewrite
    from .auto import AutoMode

# Cell magics whose body is Python run in the user namespace: `%%tpu` over one of them
# rewrites the inner body and hands it on, so `%%tpu` + `%%time` works in either order.
NESTED_PYTHON_MAGICS = frozenset({"time", "timeit", "capture", "prun"})
# How many cells' shape histories the dry run keeps (one per distinct cell text), and how
# many rewritten cells are remembered for the notes on errors raised in them later.
_HISTORY_LIMIT = 256


# -- the runner ------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _rewrite(
    text: str, device_name: str, imports: tuple[str, ...], taken: frozenset[str]
) -> CellRewrite:
    """`rewrite_cell` for a cell the magics run, cached: running a cell again costs no rewrite.

    The cell gains no line (`insert_statements=False`): the device variable is bound in the
    namespace beforehand, and the imports the rewrite needs (`required_imports`) are run
    there before the cell, so every line stays where the user wrote it. `taken` are names
    the namespace holds that those imports must not overwrite.
    """
    from ..rewrite.core.model import Options as Defaults
    from ..rewrite.notebooks.notebook import rewrite_cell

    return rewrite_cell(text, magic_options(Defaults(), device_name, imports, taken))


def magic_options(
    base: Options, device_name: str, imports: tuple[str, ...], taken: frozenset[str]
) -> Options:
    """`base` as the magics run a cell: the device variable is theirs, bound before the cell
    runs, and the cell gains no line (the imports it needs are run beside it)."""
    return dataclasses.replace(
        base,
        device_name=device_name,
        define_device=False,
        prior_imports=imports,
        prior_names=taken,
        insert_statements=False,
    )


def rewrite_for_magic(
    text: str,
    device_name: str,
    rewrite: Callable[[str, str], CellRewrite],
) -> CellRewrite:
    """`rewrite(text, name)` with the magic's device variable `device_name`, or, where that
    name means something else at a place a fix writes the device (a parameter or local
    `device` in a function of the cell), with `FALLBACK_DEVICE_VARIABLE`, which the magic
    binds too: `gpu2tpu rewrite` picks a free name there, and the magic must fix as much.
    The result's `device_name` is the variable its text uses."""
    result = rewrite(text, device_name)
    if result.device_shadowed and device_name != FALLBACK_DEVICE_VARIABLE:
        other = rewrite(text, FALLBACK_DEVICE_VARIABLE)
        if not other.device_shadowed:
            return other
    return result


def _bound_by_import(statement: str) -> list[tuple[str, str]]:
    """(name bound, module or object path) for each name an import statement binds."""
    try:
        tree = ast.parse(statement)
    except SyntaxError:
        return []
    out = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                out.append((bound, alias.name if alias.asname else alias.name.split(".")[0]))
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                out.append((alias.asname or alias.name, f"{node.module}.{alias.name}"))
    return out


def _taken(required: tuple[str, ...], namespace: dict[str, Any]) -> frozenset[str]:
    """Names the required imports would bind that the namespace holds for something else."""
    taken = set()
    for statement in required:
        for name, path in _bound_by_import(statement):
            value = namespace.get(name)
            if value is None:
                continue
            if isinstance(value, ModuleType) and value.__name__ == path:
                continue
            if sys.modules.get(path) is value:
                continue
            taken.add(name)
    return frozenset(taken)


class CellRunner:
    """Prepare and run cells for one shell: what `%%tpu` and auto mode share."""

    def __init__(self, shell: InteractiveShell) -> None:
        self.shell = shell
        self._injected: Any = None  # the device object this runner last put in the namespace
        self.histories: dict[str, Any] = {}
        self.last_report: DryRunReport | None = None
        self.recent: dict[str, PreparedCell] = {}  # traceback name -> cell, newest last
        self.modules_said: set[tuple[str, int]] = set()  # local modules with CUDA, named once

    def device_variable(self, backend: Backend) -> str:
        """Bind the device variable for `backend` in the user namespace; return its name.

        A `device` the user made (a torch.device or a string) is theirs and stays (one that
        names CUDA on a machine without it is replaced when a cell reads it, and said so);
        one this runner put there is refreshed for the current backend.
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

    def rewrite(self, text: str, backend: Backend) -> CellRewrite:
        """The cell rewritten as `gpu2tpu rewrite` rewrites a notebook cell, knowing what the
        cells that ran before imported; the device variable its text uses
        (`CellRewrite.device_name`) is bound for `backend`."""
        device_name = self.device_variable(backend)
        imports = prior_imports(self.shell)

        def rewrite(cell: str, name: str) -> CellRewrite:
            result = _rewrite(cell, name, imports, frozenset())
            taken = _taken(result.required_imports, self.shell.user_ns)
            if taken:  # `import time` would overwrite the user's own `time`: ask again
                result = _rewrite(cell, name, imports, taken)
            return result

        try:
            result = rewrite_for_magic(text, device_name, rewrite)
        except Exception as err:  # a bug in the codemod must not stop the notebook: say it
            from ..rewrite.notebooks.notebook import CellRewrite

            reason = f"the rewrite failed ({type(err).__name__}: {err}); please report it"
            return CellRewrite(text, text, error=reason)
        if result.device_name == FALLBACK_DEVICE_VARIABLE != device_name:
            self.shell.user_ns[FALLBACK_DEVICE_VARIABLE] = backend.device()
        return result

    def run_imports(self, result: CellRewrite | None) -> None:
        """Run the imports the rewritten cell needs (`import time`) in the namespace."""
        for statement in result.required_imports if result is not None else ():
            exec(compile(statement, "<gpu2tpu: an import the rewritten cell needs>", "exec"),
                 self.shell.user_ns)  # fmt: skip

    def prepare(
        self,
        cell: str,
        *,
        backend: Backend,
        number: int,
        header: list[str],
        rewrite: bool = True,
    ) -> PreparedCell:
        """Rewrite, report, transform and compile `cell` (the lines below `header`).

        Raises a `CellSyntaxError` at the cell's own line when it does not parse.
        """
        shell = self.shell
        rewritten = cell
        result = None
        if rewrite:
            result = self.rewrite(cell, backend)
            rewritten = result.new_source
            say(problem_lines(result, len(header)))
            say(zero_count_lines(result, len(header), backend.device().type))
            self.run_imports(result)
        python = shell.transform_cell(rewritten)
        if rewrite:
            say(local_module_lines(python, len(header), self.modules_said))
        prepared = compile_cell(
            shell,
            written=cell,
            rewritten=rewritten,
            python=python,
            number=number,
            header=header,
            rewrite=result,
        )
        say(replace_stale_devices(shell.user_ns, prepared.python, backend))
        self.remember(prepared)
        return prepared

    def remember(self, prepared: PreparedCell) -> None:
        self.recent.pop(prepared.filename, None)
        self.recent[prepared.filename] = prepared
        while len(self.recent) > _HISTORY_LIMIT:
            self.recent.pop(next(iter(self.recent)))

    def dry_run_history(self, key: str) -> Any:
        from ..readiness.dryrun import ShapeHistory

        history = self.histories.pop(key, None) or ShapeHistory()
        self.histories[key] = history  # most recent last
        while len(self.histories) > _HISTORY_LIMIT:
            self.histories.pop(next(iter(self.histories)))
        return history


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


def _number(value: str) -> float:
    return float(value.replace("_", ""))


@magics_class
class TPUMagics(Magics):
    """`%%tpu`, `%tpu_auto`, `%tpu_info` and `%tpu_doctor`."""

    def __init__(self, shell: InteractiveShell) -> None:
        super().__init__(shell)
        self.runner = CellRunner(shell)
        self.forecasts = ForecastMemory()  # a later --profile of a forecast model uses them
        self.auto: AutoMode | None = None
        self.auto_log = AutoLog()  # what auto mode ran, for `%tpu_auto log`
        self._last_reason: str | None = None
        # A syntax error in a %%tpu cell is shown as IPython shows one in a plain cell (no
        # stack), through the shell's custom-exception slot, if no one else uses it.
        self._owns_custom_exc = not shell.custom_exceptions
        if self._owns_custom_exc:
            shell.set_custom_exc(CELL_SYNTAX_ERRORS, show_cell_syntax_error)

    def _say_choice(self, reason: str, how: str = "") -> None:
        """Print `auto`'s choice when it is new for this session (not on every cell), with
        `how` the cell runs there (", as a dry run")."""
        if reason != self._last_reason:
            self._last_reason = reason
            print(f"gpu2tpu: {reason}{how}")

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
        help="run the cell as a training step under the profiler (gpu2tpu.measure.cell_profile)",
    )
    @magic_arguments.argument(
        "--forecast",
        metavar="TARGETS",
        default=None,
        help=(
            "comma-separated TPU targets (e.g. v5e,v6e) to forecast the training step the "
            "cell defines (`model` and `batch`) for (gpu2tpu.forecasting.forecast.forecast_cell)"
        ),
    )
    @magic_arguments.argument(
        "-o",
        "--output",
        nargs="?",
        const=True,
        default=None,
        metavar="NAME",
        help=(
            "return the result (the profile, the forecast, the dry-run report; else the "
            "cell's value) as the cell's value, as %%timeit -o does; with NAME, also bind it "
            "to NAME"
        ),
    )
    @magic_arguments.argument(
        "--steps", type=int, default=None, metavar="N", help="--profile: timed steps (20)"
    )
    @magic_arguments.argument(
        "--warmup", type=int, default=None, metavar="N", help="--profile: warm-up steps (3)"
    )
    @magic_arguments.argument(
        "--tokens-per-step",
        type=_number,
        default=None,
        metavar="N",
        help="--profile/--forecast: tokens one step processes (for $/1M tokens)",
    )
    @magic_arguments.argument(
        "--samples-per-step",
        type=_number,
        default=None,
        metavar="N",
        help="--profile: samples one step processes (for samples/s and $/epoch)",
    )
    @magic_arguments.argument(
        "--chips",
        type=int,
        default=None,
        metavar="N",
        help="--profile/--forecast: chips per target (a power of two for the forecast)",
    )
    @magic_arguments.argument(
        "--full",
        action="store_true",
        help=(
            "--profile: show the full view (the comparison table, bars and details) instead "
            "of one line; the result is also in `_tpu_profile`"
        ),
    )
    @magic_arguments.argument(
        "--trace",
        nargs="?",
        const="",
        default=None,
        metavar="PATH",
        help=(
            "--profile: also time one step op by op with torch.profiler: a per-op table, and "
            "a Chrome trace written to PATH (default: a file in the working directory) to "
            "open in https://ui.perfetto.dev or chrome://tracing"
        ),
    )
    @magic_arguments.argument(
        "--search",
        action="store_true",
        help=(
            "--forecast: also search the largest batch that fits (more compiles; off by "
            "default here)"
        ),
    )
    @no_var_expand
    @cell_magic
    def tpu(self, line: str, cell: str) -> Any:
        """Rewrite this cell's CUDA-specific PyTorch on the fly and run it on a TPU backend.

        The cell runs in the notebook's namespace with the backend's device as the one
        `torch.accelerator` answers and as the `device` variable, restored afterwards even
        when the cell fails. What the rewrite cannot migrate is listed before the cell runs. The last
        expression is shown as in a normal cell; errors show the cell as written, with its
        line numbers. With no TPU backend, `auto` runs a dry run on the CPU.
        """
        __tracebackhide__ = True
        args = magic_arguments.parse_argstring(self.tpu, line)
        plan = check(args)
        if not cell.strip():
            raise UsageError("%%tpu needs code in the cell below the %%tpu line")
        backend, reason, dry = _resolve(plan.backend, plan.dry_run)
        nested = _nested_magic(cell)
        if nested is not None and plan.mode:
            raise UsageError(
                f"%%tpu {plan.mode} cannot wrap %%{nested[0]}; put %%{nested[0]} first"
            )
        if plan.backend == "auto" and not plan.dry_run:
            # Only a plain cell is dry-run on the CPU; --profile and --forecast run as asked.
            plain = dry and not (plan.profile or plan.forecast or nested is not None)
            self._say_choice(reason, ", as a dry run" if plain else "")
        _note_torchax(backend)
        number = cell_number(self.shell)
        depth = _cell_magic_depth()
        header = [""] * (depth - 1) + [f"%%tpu {line}".rstrip()]
        if nested is not None:
            return self._finish(plan, self._run_nested(cell, backend, plan, number, header))
        prepared = self.runner.prepare(
            cell, backend=backend, number=number, header=header, rewrite=plan.rewrite
        )
        label = f"In[{number}]"
        if plan.show_diff:
            sys.stdout.write(diff_text(prepared.written, prepared.rewritten, label, backend.name))
        run = self._runner_for(prepared, backend)
        if plan.profile or plan.forecast:
            return self._finish(plan, self._hooked(plan, run, backend, prepared))
        if dry:
            return self._dry_run(prepared, backend, label, plan)
        return self._finish(plan, run())

    def _finish(self, plan: CellPlan, result: Any) -> Any:
        """Bind the result to `-o NAME` when asked; the value the cell shows."""
        if isinstance(plan.output, str):
            self.shell.user_ns[plan.output] = result
        return result

    def _runner_for(self, prepared: PreparedCell, backend: Backend) -> Callable[[], Any]:
        shell = self.shell
        namespace = shell.user_ns
        runner = self.runner

        def run() -> Any:
            __tracebackhide__ = True
            try:
                with backend.activate():
                    value = execute(prepared, namespace, shell.loop_runner)
                    if backend.sync_after_cell:
                        backend.synchronize()
                    return value
            except Exception as err:
                add_notes(err, runner.recent.values(), backend)
                show_user_frames(err, shell)
                raise

        return run

    def _dry_run(self, prepared: PreparedCell, backend: Backend, label: str, plan: CellPlan) -> Any:
        __tracebackhide__ = True
        from IPython.display import display

        from ..measure.progress import WorkStatus
        from ..readiness.dryrun import DryRunDetector
        from ..readiness.user_code import UserCode, cell_labels

        history = self.runner.dry_run_history(prepared.rewritten)
        # Calls into functions of earlier cells and local modules are followed.
        user_code = UserCode(cell_labels(self.shell))
        detector = DryRunDetector(
            {prepared.filename}, label=label, history=history, user_code=user_code
        )
        ns = self.shell.user_ns
        # A dry run of many seconds says what it has done so far instead of looking hung.
        status = WorkStatus(f"gpu2tpu: dry run of {label}", lambda: f"{detector.calls:,} ATen ops")
        try:
            with status, backend.activate(), detector:
                value = execute(prepared, ns, self.shell.loop_runner)
        except Exception as err:
            add_notes(err, self.runner.recent.values(), backend)
            show_user_frames(err, self.shell)
            self.runner.last_report = detector.report(err)
            ns["_tpu_dry_run"] = self.runner.last_report
            raise
        report = detector.report()
        self.runner.last_report = report
        ns["_tpu_dry_run"] = report
        if plan.output is not None:
            return self._finish(plan, report)
        if not report.empty:  # a cell that only defines functions has nothing to report
            display(report)
        return value

    def _hooked(
        self, plan: CellPlan, run: Callable[[], Any], backend: Backend, prepared: PreparedCell
    ) -> Any:
        """`--profile` / `--forecast`: hand the cell to the profiler or the forecast."""
        if plan.profile:
            from ..measure import cell_profile

            result = cell_profile(run, backend=backend, **plan.profile_options)
            said = self.forecasts.apply(result, model_in(self.shell.user_ns))
            if said:
                print(said)
            self.shell.user_ns["_tpu_profile"] = result
            if plan.full or plan.output is not None:
                return result
            # One line by default, as %%time says its time; the full view on request.
            print(f"gpu2tpu: {result.summary_line()}")
            trace = getattr(result, "trace", None)
            if trace is not None:
                print(trace.summary_line())
            print("gpu2tpu: the table, bars and details: `_tpu_profile`, or %%tpu --profile --full")
            return None
        from ..forecasting.forecast import forecast_cell

        namespace = self.shell.user_ns
        if not could_find_a_model(namespace, prepared.binds):
            raise UsageError(
                "%%tpu --forecast needs the cell to define `model` (a torch.nn.Module); "
                "neither this cell nor an earlier one did"
            )
        run()  # the cell runs once; the forecast reads what it left in the namespace
        try:
            inputs = find_forecast_inputs(namespace, prepared.binds)
        except ForecastInputError as err:
            raise UsageError(str(err)) from None
        for said in inputs.lines:  # said once every input is known good
            print(said)
        predicted = forecast_cell(
            ChainMap(inputs.values, namespace),
            targets=list(plan.forecast),
            backend=backend,
            source=prepared.rewritten,
            **plan.forecast_options,
        )
        model = inputs.values["model"]
        self.forecasts.remember(model, predicted, prepared.number, inputs.names["model"])
        return predicted

    def _run_nested(
        self, cell: str, backend: Backend, plan: CellPlan, number: int, header: list[str]
    ) -> Any:
        """`%%tpu` over `%%time` (or another Python cell magic): rewrite its body, run it."""
        __tracebackhide__ = True
        from ..rewrite.notebooks.ipython_syntax import split_cell_magic

        rewritten = cell
        if plan.rewrite:
            result = self.runner.rewrite(cell, backend)
            rewritten = result.new_source
            say(problem_lines(result, len(header)))
            self.runner.run_imports(result)
        if plan.show_diff:
            label = f"In[{number}]"
            sys.stdout.write(diff_text(cell, rewritten, label, backend.name))
        inner = split_cell_magic(rewritten)
        assert inner is not None
        say(replace_stale_devices(self.shell.user_ns, inner.body, backend))
        try:
            with backend.activate():
                return self.shell.run_cell_magic(inner.name, inner.args, inner.body)
        except Exception as err:
            add_notes(err, (), backend)
            show_user_frames(err, self.shell)
            raise

    @magic_arguments.magic_arguments()
    @magic_arguments.argument(
        "state",
        nargs="?",
        choices=("on", "off", "log"),
        help=(
            "on: rewrite and run every later cell on a TPU backend; off: stop; log: show what "
            "each cell ran, as diffs of the cells auto mode rewrote; none: say whether it is on"
        ),
    )
    @magic_arguments.argument(
        "--backend",
        "-b",
        default=None,
        metavar="NAME",
        help="with on: the backend, as for %%tpu (default auto)",
    )
    @magic_arguments.argument(
        "--show-diff",
        action="store_true",
        help="with on: print each cell's rewrite as a unified diff before the cell runs",
    )
    @line_magic
    def tpu_auto(self, line: str) -> None:
        """`%tpu_auto on [--backend NAME] [--show-diff]` rewrites and runs every later cell on a
        TPU backend; `%tpu_auto off` stops; `%tpu_auto log` shows what each cell ran (the diff
        of every cell it rewrote); `%tpu_auto` says whether it is on.

        Each cell is rewritten as `gpu2tpu rewrite` rewrites a notebook cell; what cannot be
        migrated is listed before the cell runs (`--show-diff` also prints the rewrite). With
        no TPU backend, `auto` runs the cells on the CPU as usual, without a dry run (use
        `%%tpu --dry-run` on a cell to see what would hurt on a TPU).
        """
        args = magic_arguments.parse_argstring(self.tpu_auto, line)
        if args.state != "on" and args.backend is not None:
            raise UsageError("%tpu_auto: --backend goes with on: %tpu_auto on --backend NAME")
        if args.state != "on" and args.show_diff:
            raise UsageError("%tpu_auto: --show-diff goes with on: %tpu_auto on --show-diff")
        if args.state == "log":
            sys.stdout.write(self.auto_log.text())
            return
        if args.state is None:
            state = f"on ({self.auto.backend.name})" if self.auto else "off"
            print(f"gpu2tpu: auto mode is {state}")
            return
        if args.state == "off":
            if self.auto is not None:
                self.auto.stop()
                self.auto = None
            print("gpu2tpu: auto mode off")
            return
        backend, reason, _dry = _resolve(args.backend or "auto", False)
        _note_torchax(backend)
        from .auto import AutoMode

        if self.auto is not None:
            self.auto.stop()
        self.auto = AutoMode(
            self.shell, self.runner, backend, show_diff=args.show_diff, log=self.auto_log
        )
        self.auto.start()
        print(_auto_on_line(backend, reason))

    @line_magic
    def tpu_info(self, line: str) -> None:
        """Backends found and missing (with the install command), chips, memory, versions."""
        from .info import show_info

        show_info(self.shell)

    @line_magic
    def tpu_doctor(self, line: str) -> None:
        """Check that this environment can run PyTorch on a TPU: versions that fit together,
        where the notebook runs (Colab, Kaggle, Cloud TPU VM), and the command that fixes
        each problem. A table in notebooks, text elsewhere (`gpu2tpu doctor` in a shell)."""
        from .info import show_doctor

        show_doctor(self.shell)

    def close(self) -> None:
        """Remove auto mode's hooks and the syntax-error handler (used by `%unload_ext`)."""
        if self.auto is not None:
            self.auto.stop()
            self.auto = None
        if self._owns_custom_exc and self.shell.custom_exceptions == CELL_SYNTAX_ERRORS:
            self.shell.set_custom_exc((), None)


def _auto_on_line(backend: Backend, reason: str) -> str:
    """What `%tpu_auto on` says it will do: where cells run, and, on the CPU, that no dry run
    happens (auto's choice for `%%tpu` cells is a dry run; auto mode runs cells as usual)."""
    if backend.name != "cpu" or not reason.startswith("auto: "):
        return (
            f"gpu2tpu: auto mode on: every cell is rewritten and run on {backend.name} ({reason})"
        )
    why = reason.removeprefix("auto: ").split("; ")[0]
    return (
        f"gpu2tpu: auto mode on: {why}, so every cell is rewritten and run on the CPU as "
        "usual, without a dry run (`%%tpu --dry-run` on a cell reports what would hurt on a TPU)"
    )


def _cell_magic_depth() -> int:
    """How many cell-magic lines precede this body in the cell: 1 for `%%tpu` itself, one
    more for each cell magic above it (`%%time` then `%%tpu` puts the body at line 3)."""
    from IPython.core.interactiveshell import InteractiveShell

    target = InteractiveShell.run_cell_magic.__code__
    depth = 0
    frame: FrameType | None = sys._getframe(1)
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


__all__ = [
    "BACKEND_NAMES",
    "CellRunner",
    "PreparedCell",
    "TPUMagics",
    "diff_text",
]
