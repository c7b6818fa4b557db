"""What users import and call stays as it is while the package is laid out anew (issue 17):
the top-level names, the signatures of the measuring and forecasting functions, the result
methods, and the command line's subcommands and options."""

from __future__ import annotations

import argparse
import inspect
import subprocess
import sys

import pytest

import gpu2tpu
from gpu2tpu.cli import build_parser, main


def test_the_top_level_names() -> None:
    assert set(gpu2tpu.__all__) == {
        "__version__",
        "load_ipython_extension",
        "unload_ipython_extension",
        "rewrite_source",
        "Options",
        "rewrite_notebook",
        "profile",
        "Profiler",
        "forecast",
        "dry_run",
    }
    for name in gpu2tpu.__all__:
        assert getattr(gpu2tpu, name) is not None


def test_tab_completion_shows_the_public_names_before_they_load() -> None:
    """IPython completes `gpu2tpu.<tab>` from `dir()`; the lazy names are not in the module's
    namespace until first used, so a fresh interpreter checks it (this one loaded them)."""
    code = "import gpu2tpu, sys; print(' '.join(dir(gpu2tpu))); print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[0].split() == sorted(gpu2tpu.__all__)
    assert out[1] == "False"  # listing the names imports nothing


@pytest.mark.parametrize(
    ("name", "parameters"),
    [
        (
            "profile",
            [
                "step_fn", "args", "steps", "warmup", "backend", "tokens_per_step",
                "samples_per_step", "compare_to", "targets", "baseline", "dataset_size",
                "prices", "price", "chips", "catalogue", "count_flops", "count_syncs",
                "flops_per_step", "bytes_per_step", "progress", "trace",
            ],
        ),
        (
            "forecast",
            [
                "model", "example_batch", "loss_fn", "optimizer", "targets", "chips", "dtype",
                "tokens_per_step", "batch_search", "time_budget_s", "isolate", "options",
            ],
        ),
        ("dry_run", ["fn", "args", "kwargs"]),
        ("Profiler", ["warmup", "steps", "backend", "count_flops", "costing"]),
    ],
)  # fmt: skip
def test_the_measuring_functions_keep_their_signatures(name: str, parameters: list[str]) -> None:
    value = getattr(gpu2tpu, name)
    assert callable(value) and not inspect.ismodule(value)
    assert list(inspect.signature(value).parameters) == parameters


def test_the_results_keep_their_methods() -> None:
    from gpu2tpu.forecasting.forecast import Forecast
    from gpu2tpu.measure.result import ProfileResult
    from gpu2tpu.readiness.dryrun import DryRunReport

    exports = {"to_dict", "to_json", "to_csv", "to_dataframe", "to_html", "widget", "__rich__"}
    assert exports | {"save_baseline", "to_baseline", "row", "series", "details"} <= set(
        dir(ProfileResult)
    )
    assert exports | {"details", "summary_rows"} <= set(dir(Forecast))
    assert {"to_dict", "by_kind", "lines", "_repr_html_"} <= set(dir(DryRunReport))
    assert {"step", "result", "__enter__", "__exit__"} <= set(dir(gpu2tpu.Profiler))


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_one_parser_tree_holds_every_subcommand_and_its_options() -> None:
    options = {
        name: {o for a in sub._actions for o in (a.option_strings or [a.dest])} - {"-h", "--help"}
        for name, sub in _subcommands(build_parser()).items()
    }
    shared = {
        "paths", "--select", "--ignore", "--unsafe-fixes", "--exclude", "-j", "--jobs",
        "--stdin-filename", "--force-exclude", "--target-torch", "-q", "--quiet",
        "--respect-gitignore", "--no-respect-gitignore",
    }  # fmt: skip
    assert options == {
        "check": shared | {"--format", "--output-file", "-o"},
        "rewrite": shared | {"--diff", "--check", "--report"},
        "doctor": {"--format"},
        "new": {"name", "--template", "-t", "--force", "--list"},
        "rules": {"code", "--format"},
    }


def test_subcommand_errors_come_from_the_one_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["check", "--jobs", "-1", "."])
    assert exit_.value.code == 2
    assert "gpu2tpu check: error: argument -j/--jobs: must be 0 (all cores) or more" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        main(["doctor", "--format", "yaml"])
    assert "gpu2tpu doctor: error: argument --format: invalid choice: 'yaml'" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit) as exit_:
        main(["new", "--help"])
    assert exit_.value.code == 0
    assert "usage: gpu2tpu new" in capsys.readouterr().out


def test_a_command_imports_only_its_own_module() -> None:
    code = (
        "import sys; from gpu2tpu.cli import main; main(['rules']); "
        "print(sorted(m for m in ('gpu2tpu.readiness.doctor', 'gpu2tpu.templates') "
        "if m in sys.modules), file=sys.stderr)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "[]"
