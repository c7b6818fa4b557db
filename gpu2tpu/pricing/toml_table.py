"""Reading one of the shipped TOML data tables (the hardware catalogue, the published runs,
the published setups): one place that turns a missing file or bad TOML into the table's own
one-line error naming the file."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any


def read_toml(path: Path, what: str, error: type[Exception]) -> dict[str, Any]:
    """The table at `path`; `error` ("{path}: the {what} does not exist.", "{path}: not
    valid TOML (...).") where it cannot be read."""
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise error(f"{path}: the {what} does not exist.") from None
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: not valid TOML ({exc}).") from None
