"""`%%tpu`'s options, checked before anything runs.

argparse (through IPython's `magic_arguments`) catches unknown options and malformed numbers;
`check` catches what argparse cannot: contradictory flags, options that belong to a mode
that is off, empty or unknown forecast targets, chip counts the forecast cannot compile.
Each problem is one `UsageError` line, raised before the cell, the rewrite or any child
process runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from IPython.core.error import UsageError

# Backends a dry run may name: it always runs on the CPU.
DRY_RUN_BACKENDS = ("auto", "cpu")


@dataclass(frozen=True)
class CellPlan:
    """What one `%%tpu` line asks for, checked.

    `output` is None (show the usual output), True (`-o`: return the result object) or the
    variable name to bind it to (`-o NAME`). `profile_options` and `forecast_options` are
    the keywords for `cell_profile` and `forecast_cell`.
    """

    backend: str = "auto"
    rewrite: bool = True
    show_diff: bool = False
    dry_run: bool = False
    profile: bool = False
    forecast: tuple[str, ...] = ()
    full: bool = False
    output: bool | str | None = None
    profile_options: dict[str, Any] = field(default_factory=dict)
    forecast_options: dict[str, Any] = field(default_factory=dict)

    @property
    def mode(self) -> str:
        if self.dry_run:
            return "--dry-run"
        if self.profile:
            return "--profile"
        if self.forecast:
            return "--forecast"
        return ""


def _positive(value: Any, option: str, *, zero: bool = False) -> None:
    least = 0 if zero else 1
    if value is not None and value < least:
        what = "0 or more" if zero else "at least 1"
        raise UsageError(f"%%tpu {option} must be {what}, not {value:g}")


def check(args: Any) -> CellPlan:
    """The plan for parsed `%%tpu` arguments; `UsageError` for anything contradictory."""
    modes = [m for m, on in (("--dry-run", args.dry_run), ("--profile", args.profile),
                             ("--forecast", args.forecast is not None)) if on]  # fmt: skip
    if len(modes) > 1:
        raise UsageError(
            f"%%tpu {' and '.join(modes)} cannot be combined: run the cell once with each"
        )
    if args.dry_run and args.backend not in DRY_RUN_BACKENDS:
        raise UsageError(
            f"%%tpu --dry-run runs on the CPU; it cannot run on --backend {args.backend} "
            "(drop one of the two)"
        )
    if args.show_diff and args.no_rewrite:
        raise UsageError("%%tpu --show-diff with --no-rewrite has no rewrite to show")
    belongs = {
        "--steps": (args.steps, ("--profile",)),
        "--warmup": (args.warmup, ("--profile",)),
        "--samples-per-step": (args.samples_per_step, ("--profile",)),
        "--tokens-per-step": (args.tokens_per_step, ("--profile", "--forecast")),
        "--chips": (args.chips, ("--profile", "--forecast")),
        "--search": (args.search or None, ("--forecast",)),
        "--full": (args.full or None, ("--profile",)),
        "--trace": (args.trace, ("--profile",)),
    }
    for option, (value, modes_ok) in belongs.items():
        if value is not None and not set(modes) & set(modes_ok):
            raise UsageError(f"%%tpu {option} goes with {' or '.join(modes_ok)}")
    _positive(args.steps, "--steps")
    _positive(args.warmup, "--warmup", zero=True)
    _positive(args.chips, "--chips")
    for option, value in (
        ("--samples-per-step", args.samples_per_step),
        ("--tokens-per-step", args.tokens_per_step),
    ):
        if value is not None and not value > 0:
            raise UsageError(f"%%tpu {option} must be a positive number, not {value:g}")
    output = args.output
    if isinstance(output, str) and not output.isidentifier():
        raise UsageError(f"%%tpu -o takes a variable name, not {output!r}")
    targets: tuple[str, ...] = ()
    if args.forecast is not None:
        targets = forecast_targets(args.forecast, args.chips or 1)
    profile_options = {
        key: value
        for key, value in (
            ("steps", args.steps),
            ("warmup", args.warmup),
            ("tokens_per_step", args.tokens_per_step),
            ("samples_per_step", args.samples_per_step),
            ("chips", args.chips),
            ("trace", args.trace),
        )
        if value is not None
    }
    forecast_options: dict[str, Any] = {"batch_search": bool(args.search)}
    if args.chips is not None:
        forecast_options["chips"] = args.chips
    if args.tokens_per_step is not None:
        forecast_options["tokens_per_step"] = args.tokens_per_step
    return CellPlan(
        backend=args.backend,
        rewrite=not args.no_rewrite,
        show_diff=args.show_diff,
        dry_run=args.dry_run,
        profile=args.profile,
        forecast=targets,
        full=args.full,
        output=output,
        profile_options=profile_options,
        forecast_options=forecast_options,
    )


def forecast_targets(text: str, chips: int) -> tuple[str, ...]:
    """The targets of `--forecast v5e,v6e`, each known to the catalogue and compilable.

    TPU generations become compile targets (`v5e`, `v5p:2x2x1`); GPU names are allowed
    beside them (roofline rows), as `forecast()` takes them; at least one TPU is needed.
    """
    from ..forecasting.aot import topology_for
    from ..pricing.catalogue import HardwareCatalogue

    targets = tuple(t for t in (part.strip() for part in text.replace(" ", ",").split(",")) if t)
    if not targets:
        raise UsageError("%%tpu --forecast needs TPU targets, such as --forecast v5e,v6e")
    catalogue = HardwareCatalogue.load()
    tpus = 0
    for target in targets:
        chip = catalogue.find(target.split(":", 1)[0])
        if chip is not None and chip.kind != "tpu":
            continue
        try:
            topology_for(target, chips)
        except ValueError as err:
            raise UsageError(f"%%tpu --forecast: {err}") from None
        tpus += 1
    if not tpus:
        raise UsageError(
            f"%%tpu --forecast {text.strip()} names no TPU; add one, such as --forecast v5e,"
            f"{targets[0]}"
        )
    return targets
