"""`gpu2tpu check` never calls a file with a `"cuda"` default clean.

The most common CUDA idiom in real scripts is a default: an argparse option, a parameter, an
environment fallback, a config entry. Each line below must be reported by the real command,
and `gpu2tpu rewrite` must leave none of them naming CUDA where the name says it is a device.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli

LINES = [
    'parser.add_argument("--device", default="cuda")',
    'parser.add_argument("-d", "--device", type=str, default="cuda:0", help="device")',
    'def f(x, device="cuda:0"):\n    return x',
    'class M:\n    def __init__(self, device="cuda"):\n        self.device = device',
    'def g(x, *, map_location: str = "cuda"):\n    return x',
    'def h(x, backend="cuda"):\n    return x',
    'DEVICE = os.environ.get("DEVICE", "cuda")',
    'CONFIG = {"device": "cuda", "lr": 1e-3}',
    'class Cfg:\n    device: str = "cuda"',
    'with torch.autocast(device_type="cuda"):\n    pass',
    'scaler = torch.amp.GradScaler("cuda")',
    'DEVICE = "cuda:0"',
]


@pytest.mark.parametrize("line", LINES, ids=range(len(LINES)))
def test_check_reports_the_cuda_default(line: str, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(f"import argparse\nimport os\n\nimport torch\n\nparser = None\n{line}\n")
    proc = run_cli("check", "--format", "json", str(script))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = {f["line"] for f in json.loads(proc.stdout)["findings"]}
    cuda_lines = {7 + i for i, text in enumerate(line.splitlines()) if '"cuda' in text}
    assert cuda_lines <= lines, proc.stdout

    rewritten = run_cli("rewrite", str(script))
    assert rewritten.returncode in (0, 1), rewritten.stderr
    text = script.read_text()
    if "backend" not in line:  # named for a device: fixed, not just reported
        assert '"cuda' not in text, text
