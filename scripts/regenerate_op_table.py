"""Regenerate gpu2tpu/readiness/xla_ops.json from the installed torchax's operator registry.

The op-coverage check uses the shipped table where importing torchax is not wanted; run this
after upgrading torchax or torch in the development lock, and commit the result.

    python scripts/regenerate_op_table.py            # rewrite the shipped table
    python scripts/regenerate_op_table.py --check    # exit 1 if it differs from the registry
    python scripts/regenerate_op_table.py --output other.json

With --torch-xla it writes gpu2tpu/readiness/torch_xla_ops.json instead: which ATen ops
PyTorch/XLA lowers, read from torch's dispatcher with torch_xla imported. Run it in the XLA
environment (.venv-xla, `make install-xla`):

    .venv-xla/bin/python scripts/regenerate_op_table.py --torch-xla [--check]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=None, help="where to write the table")
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 when the table differs from the live registry",
    )
    parser.add_argument(
        "--torch-xla",
        action="store_true",
        help="the PyTorch/XLA table (torch_xla_ops.json), from torch_xla's dispatcher",
    )
    return parser


def torch_xla_main(args: argparse.Namespace) -> int:
    """Write or check the PyTorch/XLA table from the installed torch_xla."""
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    from gpu2tpu.readiness.op_coverage import TORCH_XLA_TABLE, TorchXLATable

    target = args.output or TORCH_XLA_TABLE
    live = TorchXLATable.from_dispatcher()
    if args.check:
        try:
            shipped = TorchXLATable.from_dict(json.loads(target.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError) as err:
            print(f"{target}: cannot read the table ({err}); regenerate it", file=sys.stderr)
            return 1
        if shipped == live:
            print(f"{target} matches torch_xla {live.torch_xla_version}")
            return 0
        print(
            f"{target} differs from torch_xla {live.torch_xla_version}; run "
            "scripts/regenerate_op_table.py --torch-xla in .venv-xla",
            file=sys.stderr,
        )
        return 1
    target.write_text(json.dumps(live.to_dict(), indent=1) + "\n", encoding="utf-8")
    print(
        f"wrote {target}: {len(live.lowered)} ATen ops lowered, {len(live.not_lowered)} not, "
        f"by torch_xla {live.torch_xla_version} (torch {live.torch_version})"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # libtpu is installed in the development lock: keep JAX on the CPU and quiet (backends.md §5).
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    if args.torch_xla:
        return torch_xla_main(args)
    from gpu2tpu.readiness.op_coverage import (
        SHIPPED_TABLE,
        LoweringTable,
        live_lowering_table,
    )

    target = args.output or SHIPPED_TABLE
    live = live_lowering_table()
    if args.check:
        try:
            shipped = LoweringTable.from_dict(json.loads(target.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError) as err:
            print(f"{target}: cannot read the table ({err}); regenerate it", file=sys.stderr)
            return 1
        same = live.same_registry(shipped) and (
            shipped.torchax_version,
            shipped.torch_version,
        ) == (live.torchax_version, live.torch_version)
        if same:
            print(f"{target} matches the registry of torchax {live.torchax_version}")
            return 0
        print(
            f"{target} differs from the registry of torchax {live.torchax_version} "
            f"(torch {live.torch_version}); run scripts/regenerate_op_table.py",
            file=sys.stderr,
        )
        return 1
    data = live.to_dict()
    data["generated"] = datetime.date.today().isoformat()
    target.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    total = len(live.packets) + len(live.overloads) + len(live.decompositions)
    print(
        f"wrote {target}: {total} ATen entries and {len(live.torch_functions)} torch functions "
        f"from torchax {live.torchax_version} (torch {live.torch_version})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
