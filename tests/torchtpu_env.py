"""The released TorchTPU in a folder of its own, for the contract tests.

`import torch` loads an installed torch_tpu through torch's device-backend entry point, so
installing it into the development environment would change what every other test sees.
Instead requirements/tpu.lock is installed with `pip --no-deps --target` into one folder
(default `.venv-tpu`, or `$GPU2TPU_TPU_SITE`), and only the processes that put that folder on
PYTHONPATH see it; they use the development environment's torch and libtpu. A stamp named
after the lock's hash makes a second run free and a changed lock rebuild the folder.

`python tests/torchtpu_env.py [FOLDER]` builds it (the Makefile's `tpu-env` target).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements" / "tpu.lock"
SITE_ENV = "GPU2TPU_TPU_SITE"


def site_path() -> Path:
    """Where the folder is: `$GPU2TPU_TPU_SITE` (the Makefile sets it), else `.venv-tpu`."""
    return Path(os.environ.get(SITE_ENV) or ROOT / ".venv-tpu").resolve()


def _stamp(site: Path) -> Path:
    digest = hashlib.sha256(LOCK.read_bytes()).hexdigest()[:16]
    return site / f".lock-{digest}"


def ensure_site(site: Path | None = None, python: str = sys.executable) -> Path:
    """Install the lock into `site` unless it already holds this lock; return the folder."""
    site = site_path() if site is None else site.resolve()
    stamp = _stamp(site)
    if stamp.exists():
        return site
    if site.exists():
        shutil.rmtree(site)
    command = [
        python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
        "--no-deps", "--require-hashes", "--only-binary=:all:",
        "--target", str(site), "-r", str(LOCK),
    ]  # fmt: skip
    subprocess.run(command, check=True)
    stamp.touch()
    return site


def environ(site: Path) -> dict[str, str]:
    """This process's environment with `site` first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)
    return env


if __name__ == "__main__":
    print(ensure_site(Path(sys.argv[1]) if len(sys.argv) > 1 else None))
