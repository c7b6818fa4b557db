"""`make demo` (`python -m gpu2tpu.demo`): the first ten minutes with gpu2tpu, on the examples.

Five stages, each announced by a progress line:
1. set up: versions, and which backend `%%tpu` would pick here and why;
2. migrate the bundled examples (examples/) into a scratch folder with the real codemod, and
   print what was rewritten and what needs a person;
3. run the migrated image-classification notebook in a Jupyter kernel, with a `%%tpu --profile`
   cell appended that times one CUDA-style training step on whatever backend is present;
4. print the cost comparison that profile produced;
5. forecast the small GPT on TPU v5e and v6e when the `forecast` extra is installed.
Everything the demo writes goes to the scratch folder (.gpu2tpu-demo/ by default): the
migrated files, the executed notebook (open it to see the widget), profile.json and
forecast.json. Rerunning replaces that folder, and only a folder the demo made itself.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

__all__ = ["DemoError", "main", "migrate_examples", "profiled_notebook"]

SCRATCH = Path(".gpu2tpu-demo")
MARKER = ".made-by-gpu2tpu-demo"
EXAMPLES = ("image_classification.ipynb", "train_gpt.py", "inference_benchmark.ipynb")
NOTEBOOK = "image_classification.ipynb"
SCRIPT = "train_gpt.py"
FORECAST_TARGETS = ("v5e", "v6e")
STAGES = 5

# Appended to the migrated notebook: one training step, written the CUDA way on purpose, so
# `%%tpu` shows its on-the-fly rewrite as well as the profile.
PROFILE_CELLS = (
    "%load_ext gpu2tpu",
    "batch = next(iter(train_loader))  # one batch, reused by every profiled step",
    """%%tpu --profile --full
images, labels = batch[0].cuda(non_blocking=True), batch[1].cuda(non_blocking=True)
optimizer.zero_grad(set_to_none=True)
with torch.cuda.amp.autocast():
    loss = criterion(model(images), labels)
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()""",
    'from pathlib import Path\n\nPath("profile.json").write_text(_tpu_profile.to_json())',
)


class DemoError(RuntimeError):
    """The demo cannot run here; the message says why and what to do."""


class Progress:
    """Numbered stage lines with the time since the demo started, flushed at once."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.started = time.perf_counter()
        self.stage = 0

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def begin(self, text: str) -> None:
        self.stage += 1
        self.say(f"\n==> [{self.stage}/{STAGES}] {text}  ({self.elapsed():.0f} s)")

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)


# -- stage 1 ------------------------------------------------------------------------------------


def find_examples(given: str | None) -> Path:
    """The examples folder: the one given, else the checkout's (next to the package), else ./examples."""
    candidates = (
        [Path(given)]
        if given
        else [Path(__file__).resolve().parent.parent / "examples", Path("examples")]
    )
    for folder in candidates:
        if all((folder / name).is_file() for name in EXAMPLES):
            return folder
    raise DemoError(
        f"no examples folder with {', '.join(EXAMPLES)} at {candidates[0]}; run `make demo` "
        "from a gpu2tpu checkout, or pass --examples PATH."
    )


def prepare_scratch(folder: Path) -> None:
    """An empty scratch folder; an existing one is replaced only if the demo made it."""
    if folder.exists():
        if not (folder / MARKER).is_file():
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
            else:
                raise DemoError(
                    f"{folder} exists and was not made by the demo; remove it or pass "
                    "--workdir PATH."
                )
        else:
            shutil.rmtree(folder)
    folder.mkdir(parents=True)
    (folder / MARKER).write_text("made by `python -m gpu2tpu.demo`; safe to delete\n")


def describe_setup(progress: Progress) -> bool:
    """Print versions and the backend choice; return whether the forecast extra is present."""
    import torch

    from . import __version__
    from .backends import choose_backend
    from .backends.base import has_module

    progress.say(
        f"gpu2tpu {__version__}, Python {platform.python_version()}, torch {torch.__version__}, "
        f"{platform.machine()} with {os.cpu_count()} CPU cores"
    )
    _, reason = choose_backend("auto")
    progress.say(f"%%tpu would run here on: {reason}")
    forecast_extra = all(has_module(m) for m in ("jax", "torchax", "optax", "libtpu"))
    progress.say(
        "forecast extra: installed"
        if forecast_extra
        else "forecast extra: not installed (pip install 'gpu2tpu[forecast]'); stage 5 is skipped"
    )
    return forecast_extra


# -- stage 2 ------------------------------------------------------------------------------------


def migrate_examples(examples: Path, workdir: Path) -> Any:
    """Copy the examples into workdir/migrated and rewrite the copies; return the engine's report."""
    from .rewrite.files.engine import Config, Mode, run

    target = workdir / "migrated"
    target.mkdir()
    paths = []
    for name in EXAMPLES:
        shutil.copyfile(examples / name, target / name)
        paths.append(str(target / name))
    return run(paths, Config(), Mode.WRITE)


def print_migration_report(report: Any, progress: Progress) -> None:
    """Per file: the fixes made (by rule) and each finding left for a person, with its hint."""
    from .rewrite.core.model import CellFinding
    from .rewrite.reports.report import finding_line, summary_text

    for outcome in report.files:
        progress.say(f"{outcome.path}: {outcome.status}")
        if outcome.error:
            progress.say(f"  error: {outcome.error}")
        rules: Counter[str] = Counter()
        for item in outcome.edits:
            finding = item.finding if isinstance(item, CellFinding) else item
            rules[f"{finding.code} {finding.name}"] += 1
        if rules:
            fixes = ", ".join(
                f"{rule} x{n}" if n > 1 else rule for rule, n in sorted(rules.items())
            )
            progress.say(f"  rewritten ({sum(rules.values())} fixes): {fixes}")
        if outcome.findings:
            progress.say(f"  needs a person ({len(outcome.findings)}):")
        for item in outcome.findings:
            finding = item.finding if isinstance(item, CellFinding) else item
            where = finding_line(outcome.path, item, show_fix=False).removeprefix(
                outcome.path + ":"
            )
            progress.say(f"    {where}")
            if finding.hint:
                progress.say(f"      -> {finding.hint}")
    for line in summary_text(report):
        progress.say(line)


# -- stages 3 and 4 -------------------------------------------------------------------------------


def profiled_notebook(path: Path) -> Any:
    """The migrated notebook with the `%%tpu --profile` cells appended (a nbformat node)."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    for i, source in enumerate(PROFILE_CELLS):
        cell = nbformat.v4.new_code_cell(source)
        cell.id = f"gpu2tpu-demo-{i}"
        nb.cells.append(cell)
    return nb


def _first_line(source: str) -> str:
    line = source.strip().splitlines()[0] if source.strip() else ""
    return line if len(line) <= 60 else line[:57] + "..."


def run_notebook(nb: Any, workdir: Path, progress: Progress) -> BaseException | None:
    """Execute `nb` in a python3 kernel in `workdir`, a progress line per code cell."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    started: dict[int, float] = {}
    code_cells = sum(1 for c in nb.cells if c.cell_type == "code")

    def on_start(cell: Any, cell_index: int, **_: Any) -> None:
        started[cell_index] = time.perf_counter()

    def on_done(cell: Any, cell_index: int, **_: Any) -> None:
        if cell.cell_type != "code":
            return
        seconds = time.perf_counter() - started.get(cell_index, time.perf_counter())
        number = sum(1 for c in nb.cells[: cell_index + 1] if c.cell_type == "code")
        progress.say(
            f"    cell {number:>2}/{code_cells} {_first_line(cell.source):<60} {seconds:5.1f} s"
        )

    client = NotebookClient(
        nb,
        timeout=600,
        startup_timeout=180,
        kernel_name="python3",
        resources={"metadata": {"path": str(workdir)}},
        on_cell_start=on_start,
        on_cell_executed=on_done,
    )
    with open(workdir / "kernel.log", "wb") as log:  # the kernel's own log lines, not the cells'
        try:
            client.execute(env=dict(os.environ), stderr=log)
        except CellExecutionError as err:
            return err
    return None


def _stdout(cell: Any) -> str:
    return "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")


def _result_text(cell: Any) -> str:
    return "".join(
        o.data.get("text/plain", "") for o in cell.outputs if o.output_type == "execute_result"
    )


def print_training(nb: Any, progress: Progress) -> None:
    """The migrated notebook's own results: first and last loss, accuracy, memory."""
    lines = [
        line
        for cell in nb.cells[: -len(PROFILE_CELLS)]
        if cell.cell_type == "code"
        for line in _stdout(cell).splitlines()
    ]
    losses = [line for line in lines if " loss " in line]
    if losses:
        progress.say(f"  training: {losses[0]}  ...  {losses[-1]}")
    for line in lines:
        epoch_time = line.startswith("epoch") and " took " in line
        if epoch_time or line.startswith(("test accuracy", "peak GPU memory")):
            progress.say(f"  {line}")


# -- stage 5 ------------------------------------------------------------------------------------


def forecast_gpt(script: Path, workdir: Path, progress: Progress) -> Any:
    """Forecast one training step of the migrated GPT script's model, as its config sets it."""
    import runpy

    import torch

    from .forecasting.forecast import forecast

    config = runpy.run_path(str(script), run_name="gpu2tpu_demo_gpt")  # defines, never trains
    gpt_config = config["GPTConfig"](
        block_size=config["block_size"],
        vocab_size=config["vocab_size"],
        n_layer=config["n_layer"],
        n_head=config["n_head"],
        n_embd=config["n_embd"],
    )
    torch.manual_seed(0)
    model = config["GPT"](gpt_config)
    optimizer = model.configure_optimizers(
        config["weight_decay"], config["learning_rate"], (config["beta1"], config["beta2"])
    )
    tokens = torch.randint(0, gpt_config.vocab_size, (config["batch_size"], gpt_config.block_size))
    parameters = sum(p.numel() for p in model.parameters())
    progress.say(
        f"  GPT from {script.name}: {parameters / 1e6:.2f}M parameters, batch "
        f"{config['batch_size']} x {gpt_config.block_size} tokens, AdamW, bfloat16; compiling for "
        f"{', '.join(FORECAST_TARGETS)} with libtpu (cached after the first run)"
    )
    result = forecast(
        model,
        (tokens, tokens),
        optimizer=optimizer,
        targets=FORECAST_TARGETS,
        dtype=torch.bfloat16,
        batch_search=False,
    )
    (workdir / "forecast.json").write_text(result.to_json(), encoding="utf-8")
    return result


# -- the whole demo -------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gpu2tpu.demo",
        description="Migrate the bundled CUDA examples, run one on this machine's backend with "
        "%%tpu --profile, show the cost comparison and a TPU forecast.",
    )
    parser.add_argument(
        "--examples", default=None, help="the examples folder (default: the checkout's)"
    )
    parser.add_argument(
        "--workdir", default=str(SCRATCH), help=f"scratch folder (default: {SCRATCH})"
    )
    parser.add_argument("--no-forecast", action="store_true", help="skip stage 5")
    return parser


def _have_jupyter() -> str | None:
    """None when a notebook can be executed here, else what to install."""
    from .backends.base import has_module

    missing = [m for m in ("nbformat", "nbclient", "ipykernel") if not has_module(m)]
    return f"pip install {' '.join(missing)}" if missing else None


def run_demo(args: argparse.Namespace, out: TextIO) -> int:
    """The five stages in order; a stage that fails is reported and the later ones still run
    where they can, so one broken piece never hides what the others show."""
    progress = Progress(out)
    progress.say("gpu2tpu demo: migrate CUDA-first examples, run one here, price it, forecast TPUs")
    examples = find_examples(args.examples)
    workdir = Path(args.workdir)
    prepare_scratch(workdir)
    failed = False

    progress.begin("Setting up")
    forecast_extra = describe_setup(progress) and not args.no_forecast

    progress.begin(f"Migrating the examples from {examples} into {workdir / 'migrated'}")
    report = migrate_examples(examples, workdir)
    print_migration_report(report, progress)
    if report.errors:
        return 1

    missing = _have_jupyter()
    progress.begin(
        f"Running the migrated {NOTEBOOK} in a Jupyter kernel, then one step under %%tpu --profile"
    )
    nb = None
    if missing:
        progress.say(f"  skipped: running notebooks needs {missing}")
        failed = True
    else:
        import nbformat

        nb = profiled_notebook(workdir / "migrated" / NOTEBOOK)
        error = run_notebook(nb, workdir, progress)
        executed = workdir / NOTEBOOK.replace(".ipynb", ".run.ipynb")
        nbformat.write(nb, executed)
        if error is not None:
            progress.say(f"  the notebook stopped: {str(error).strip().splitlines()[-1]}")
            progress.say(f"  see {executed}")
            failed = True
        else:
            print_training(nb, progress)
            progress.say(f"  executed notebook (with the profile widget): {executed}")

    progress.begin("Cost comparison of the profiled step (measured here, estimated elsewhere)")
    if nb is None or failed:
        progress.say("  skipped: the notebook did not run")
    else:
        profile_cell = nb.cells[-2]
        progress.say("  the profiled cell, written the CUDA way (%%tpu rewrote it on the fly):")
        for line in profile_cell.source.splitlines():
            progress.say(f"    | {line}")
        for line in _stdout(profile_cell).splitlines():
            progress.say(f"  {line}")
        progress.say(_result_text(profile_cell))
        progress.say(f"  as JSON: {workdir / 'profile.json'}")

    progress.begin(f"Forecast of the small GPT on TPU {' and '.join(FORECAST_TARGETS)}")
    if not forecast_extra:
        why = "--no-forecast" if args.no_forecast else "pip install 'gpu2tpu[forecast]'"
        progress.say(f"  skipped ({why})")
    else:
        from .forecasting.forecast import ForecastError, ForecastUnavailable

        try:
            result = forecast_gpt(workdir / "migrated" / SCRIPT, workdir, progress)
        except ForecastUnavailable as err:
            progress.say(f"  skipped: {err}")
        except ForecastError as err:
            progress.say(f"  the forecast failed: {err}")
            failed = True
        else:
            progress.say(repr(result))
            progress.say(f"  as JSON: {workdir / 'forecast.json'}")

    progress.say(
        f"\nDemo {'finished with problems (see above)' if failed else 'done'} in "
        f"{progress.elapsed():.0f} s. Next: open {workdir / NOTEBOOK.replace('.ipynb', '.run.ipynb')} "
        "in Jupyter, or start your own with `gpu2tpu new mine.ipynb --template migrate`."
    )
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the demo; 0 when every stage worked, 1 when one failed, 2 when it cannot start."""
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    stream = out or sys.stdout
    from ._extras import MissingExtraError, require

    try:
        require("the demo", "torch", "IPython", "ipywidgets")
        return run_demo(args, stream)
    except (DemoError, MissingExtraError) as err:
        print(f"gpu2tpu demo: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
