"""Notebook templates shipped with gpu2tpu, and `gpu2tpu new NAME.ipynb --template ...`.

A template is a clean notebook (no outputs) in this package's folder; creating a notebook
copies its bytes to the new path. An existing file is never overwritten unless `--force` is
given, so a second `gpu2tpu new` cannot destroy a notebook someone has worked in.
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path

__all__ = [
    "DEFAULT_TEMPLATE",
    "TEMPLATES",
    "TemplateError",
    "create_notebook",
    "add_arguments",
    "run",
    "template_text",
]

# name -> what the notebook walks a user through (shown by `gpu2tpu new --list`).
TEMPLATES: dict[str, str] = {
    "tpu-quickstart": (
        "install gpu2tpu on a fresh runtime (TorchTPU where a TPU is present), %tpu_info, a "
        "device-agnostic bfloat16 training loop, then profile and forecast a step"
    ),
    "migrate": (
        "check a CUDA notebook or script, rewrite a copy, review the diff, run cells with "
        "%%tpu, compare the cost"
    ),
    "compare-cost": "profile a step here, load a GPU baseline, show the cost table",
}
DEFAULT_TEMPLATE = "tpu-quickstart"


class TemplateError(ValueError):
    """A notebook could not be created; the message names the path or template and why."""


def template_text(name: str) -> str:
    """The template notebook's JSON text; raises TemplateError for an unknown name."""
    if name not in TEMPLATES:
        known = ", ".join(TEMPLATES)
        raise TemplateError(f"unknown template {name!r}; the templates are: {known}.")
    return resources.files(__name__).joinpath(f"{name}.ipynb").read_text(encoding="utf-8")


def create_notebook(
    path: str | Path, template: str = DEFAULT_TEMPLATE, force: bool = False
) -> Path:
    """Write the template `template` to `path` (`.ipynb` is added when the name has no suffix).

    Refuses to replace an existing file unless `force` is true, and never creates folders:
    a missing folder is more often a typo than a wish.
    """
    text = template_text(template)
    target = Path(path)
    if target.suffix == "":
        target = target.with_name(target.name + ".ipynb")
    if target.suffix != ".ipynb":
        raise TemplateError(f"{target}: a notebook's name must end in .ipynb.")
    if target.is_dir():
        raise TemplateError(f"{target} is a folder; give the new notebook's file name.")
    if not target.parent.is_dir():
        raise TemplateError(f"{target}: the folder {target.parent} does not exist.")
    if target.exists() and not force:
        raise TemplateError(f"{target} already exists; pass --force to replace it.")
    try:
        target.write_text(text, encoding="utf-8")
    except OSError as err:
        raise TemplateError(f"{target}: cannot write it ({err.strerror or err}).") from None
    return target


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`gpu2tpu new`'s options (the CLI builds the parser)."""
    parser.epilog = "templates: " + "; ".join(f"{k}: {v}" for k, v in TEMPLATES.items())
    parser.add_argument("name", nargs="?", metavar="NAME.ipynb", help="the notebook to create")
    parser.add_argument(
        "--template",
        "-t",
        default=DEFAULT_TEMPLATE,
        metavar="TEMPLATE",
        help=f"one of {', '.join(TEMPLATES)} (default: {DEFAULT_TEMPLATE})",
    )
    parser.add_argument("--force", action="store_true", help="replace NAME if it exists")
    parser.add_argument("--list", action="store_true", help="list the templates and exit")


def run(args: argparse.Namespace) -> int:
    """`gpu2tpu new`: 0 when the notebook was written (or the list shown), 2 otherwise."""
    if args.list:
        width = max(map(len, TEMPLATES))
        for name, description in TEMPLATES.items():
            print(f"{name:<{width}}  {description}")
        return 0
    if args.name is None:
        print("gpu2tpu new: error: give the notebook to create, e.g. demo.ipynb", file=sys.stderr)
        return 2
    try:
        target = create_notebook(args.name, args.template, args.force)
    except TemplateError as exc:
        print(f"gpu2tpu new: error: {exc}", file=sys.stderr)
        return 2
    print(f"created {target} from the {args.template} template")
    return 0
