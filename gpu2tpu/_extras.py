"""Which optional extra provides which import, and the one line said when one is missing.

`pip install gpu2tpu` installs the codemod alone (libcst, rich, packaging, pathspec): `gpu2tpu
check`, `rewrite`, `rules`, `doctor` and `--version` never import torch, IPython or ipywidgets, so
pre-commit and CI can install it in seconds. The notebook magics, the profiler, the dry run
and the demo need torch, IPython and ipywidgets (`gpu2tpu[notebook]`); the forecast needs
JAX, torchax, optax and libtpu (`gpu2tpu[forecast]`). Reading notebooks in the codemod needs
IPython alone: its own tokenizer decides what a `%magic` or `!cmd` line is.

A feature that needs a missing package raises `MissingExtraError`, an ImportError whose
message is one line naming the install command.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager

# top-level import name -> the extra that installs it
EXTRA_OF: dict[str, str] = {
    "torch": "notebook",
    "IPython": "notebook",
    "ipywidgets": "notebook",
    "jax": "forecast",
    "jaxlib": "forecast",
    "torchax": "forecast",
    "optax": "forecast",
    "libtpu": "forecast",
}


class MissingExtraError(ModuleNotFoundError):
    """An optional dependency is not installed; the message says what to install."""


def install_command(module: str) -> str:
    """The pip command that brings `module` (an import name) with gpu2tpu."""
    top = module.split(".")[0]
    extra = EXTRA_OF.get(top)
    return f"pip install 'gpu2tpu[{extra}]'" if extra else f"pip install {top}"


def missing_extra(feature: str, module: str) -> MissingExtraError:
    top = module.split(".")[0]
    return MissingExtraError(
        f"{feature} needs {top}, which is not installed: {install_command(top)}", name=top
    )


def is_installed(module: str) -> bool:
    """Whether `module` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a finder that refuses it, or a broken `__spec__`
        return False


def require(feature: str, *modules: str) -> None:
    """Raise `MissingExtraError` for the first of `modules` that is not installed."""
    for module in modules:
        if not is_installed(module):
            raise missing_extra(feature, module)


@contextmanager
def extra_needed(feature: str) -> Iterator[None]:
    """Turn a failed import of an optional package inside the block into `MissingExtraError`.

    Only a package that is missing itself is translated; an ImportError raised inside an
    installed package (a broken install, a version clash) passes through unchanged.
    """
    try:
        yield
    except MissingExtraError:
        raise
    except ModuleNotFoundError as err:
        top = (err.name or "").split(".")[0]
        if top not in EXTRA_OF or is_installed(top):
            raise
        raise missing_extra(feature, top) from None
