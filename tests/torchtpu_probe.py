"""Run in a subprocess that sees the released torch_tpu (tests/torchtpu_env.py): print facts.

`python tests/torchtpu_probe.py api` asks gpu2tpu's backends first (so gpu2tpu is the first
to import torch, as in a fresh kernel), then reads the installed torch_tpu and `torch.tpu`,
runs the adapter's calls against them, and compares the stand-in (tests/standins/torch_tpu)
with the real package. `python tests/torchtpu_probe.py shell` runs `%tpu_info` and `%%tpu`
cells in IPython's shell. Each prints one JSON object as its last stdout line; the tests in
tests/test_torchtpu_contract.py assert on it. Nothing here decides pass or fail.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import inspect
import json
import sys
import typing
import warnings
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
STANDIN = TESTS / "standins" / "torch_tpu"
ADAPTER = ROOT / "gpu2tpu" / "backends" / "torchtpu.py"
# Marks where gpu2tpu's own start-up ends on stderr (what the noise check reads).
STARTUP_DONE = "--- gpu2tpu asked the backends ---"


def _error(call: Any) -> str | None:
    """'Type: message' of what `call()` raises, None if it returns."""
    try:
        call()
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    return None


def adapter_names() -> dict[str, list[str]]:
    """Every name the adapter reads from `torch.tpu` and from `torch.accelerator`.

    Read from the adapter's source: `getattr(tpu, "name")`, `getattr(_tpu_module(), "name")`,
    `tpu.name`, `<...>.accelerator.name`, and the `EagerMode` members named in EAGER_MODES.
    """
    tree = ast.parse(ADAPTER.read_text(encoding="utf-8"))
    tpu: set[str] = set()
    accelerator: set[str] = set()

    def is_tpu(node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id == "tpu") or (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "_tpu_module"
        )

    eager: list[str] = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
        ):
            target = node.args[0]
            if is_tpu(target):
                tpu.add(node.args[1].value)
            elif isinstance(target, ast.Attribute) and target.attr == "accelerator":
                accelerator.add(node.args[1].value)
        elif isinstance(node, ast.Attribute):
            if is_tpu(node.value):
                tpu.add(node.attr)
            elif isinstance(node.value, ast.Attribute) and node.value.attr == "accelerator":
                accelerator.add(node.attr)
        elif (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == "EAGER_MODES"
        ):
            eager = [v.value for v in node.value.values]  # type: ignore[union-attr]
    return {"tpu": sorted(tpu), "accelerator": sorted(accelerator), "eager_members": eager}


def _params(fn: Any) -> list[str] | None:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


def _public(module: Any) -> list[str]:
    return sorted(n for n in vars(module) if not n.startswith("__"))


def _standin_module() -> Any:
    """The stand-in's `torch.tpu`, built by its own `install()`, then the real one put back."""
    import torch

    spec = importlib.util.spec_from_file_location(
        "standin_public_api", STANDIN / "_internal" / "public_api.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    real = sys.modules["torch.tpu"]
    try:
        module.install()
        return torch.tpu
    finally:
        sys.modules["torch.tpu"] = real
        torch.tpu = real


def _top_level_names(path: Path) -> list[str]:
    """Names a module binds at its top level (imports and assignments)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
    return sorted(n for n in names if not n.startswith("__"))


def standin_facts(real: Any) -> dict[str, Any]:
    """How the stand-in's `torch.tpu` and package compare with the real ones."""
    import torch_tpu

    standin = _standin_module()
    names = _public(standin)
    real_package = Path(torch_tpu.__file__).parent
    standin_files = sorted(str(p.relative_to(STANDIN)) for p in STANDIN.rglob("*.py"))
    real_files = {str(p.relative_to(real_package)) for p in real_package.rglob("*.py")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        signatures = {
            n: {"standin": _params(getattr(standin, n)), "real": _params(getattr(real, n, None))}
            for n in names
            if callable(getattr(standin, n)) and not isinstance(getattr(standin, n), type)
        }
        internal = {
            n: {"standin": _error(getattr(standin, n)), "real": _error(getattr(real, n))}
            for n in ("is_available", "device_count", "synchronize")
        }
        properties = typing.get_type_hints(real.get_device_properties)["return"]
        standin_properties = typing.get_type_hints(standin.get_device_properties)["return"]
        return {
            "names": names,
            "missing_from_real": [n for n in names if not hasattr(real, n)],
            "signatures": signatures,
            "internal_errors": internal,
            "eager_members": {
                "standin": list(standin.EagerMode.__members__),
                "real": [m for m in real.EagerMode.__members__ if not m.startswith("_")],
            },
            "properties_fields": {
                "standin": [f.name for f in dataclasses.fields(standin_properties)],
                "real": [f.name for f in dataclasses.fields(properties)],
            },
            "files": standin_files,
            "files_missing_from_real": [f for f in standin_files if f not in real_files],
            "package_names": _top_level_names(STANDIN / "__init__.py"),
            "package_names_missing_from_real": [
                n for n in _top_level_names(STANDIN / "__init__.py") if not hasattr(torch_tpu, n)
            ],
            "loader_load": callable(getattr(sys.modules["torch_tpu._loader"], "load", None)),
        }


def api_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        from gpu2tpu.backends import ask_backends, choose_backend

        reports = ask_backends(describe=lambda name: name != "jax")
        facts["statuses"] = {r.status.name: r.to_dict() for r in reports}
        facts["auto"] = choose_backend("auto")[1]
    facts["adapter_warnings"] = [str(w.message) for w in seen if "TorchTpu" in str(w.message)]
    print(STARTUP_DONE, file=sys.stderr, flush=True)
    warnings.simplefilter("ignore")  # from here on the probe reads experimental APIs itself

    import torch

    from gpu2tpu.backends.torchtpu import TorchTPUBackend

    tpu = sys.modules["torch.tpu"]
    facts["torch_version"] = torch.__version__
    facts["loaded_by_torch"] = "torch_tpu" in sys.modules
    facts["version"] = importlib.metadata.version("torch_tpu")
    meta = importlib.metadata.metadata("torch_tpu")
    facts["requires"] = meta.get_all("Requires-Dist") or []
    facts["requires_python"] = meta["Requires-Python"]
    facts["entry_points"] = [
        f"{ep.name} = {ep.value}"
        for ep in importlib.metadata.entry_points(group="torch.backends")
        if ep.value.startswith("torch_tpu")
    ]
    facts["public"] = sorted(n for n in dir(tpu) if not n.startswith("_"))
    facts["internal_errors"] = {
        n: _error(getattr(tpu, n))
        for n in ("is_available", "device_count", "synchronize", "current_device")
    }
    facts["tpu_device_error"] = _error(lambda: torch.device("tpu"))
    facts["privateuse1"] = torch._C._get_privateuse1_backend_name()
    facts["current_accelerator"] = str(torch.accelerator.current_accelerator())
    facts["checked_accelerator"] = str(torch.accelerator.current_accelerator(check_available=True))
    facts["api_module_error"] = _error(lambda: importlib.import_module("torch_tpu.api"))
    facts["memory_api"] = [
        n for n in ("memory_stats", "mem_get_info", "reset_peak_memory_stats") if hasattr(tpu, n)
    ]
    facts["dynamo_tpu_backend"] = "tpu" in torch._dynamo.list_backends(exclude_tags=())
    facts["device_name"] = tpu.get_device_name()
    facts["properties_error"] = _error(tpu.get_device_properties)
    facts["eager_default"] = tpu.eager_mode.name

    used = adapter_names()
    facts["adapter_names"] = used
    facts["adapter_tpu_missing"] = [n for n in used["tpu"] if not hasattr(tpu, n)]
    facts["adapter_accelerator_missing"] = [
        n for n in used["accelerator"] if not hasattr(torch.accelerator, n)
    ]
    facts["adapter_eager_missing"] = [
        m for m in used["eager_members"] if m not in tpu.EagerMode.__members__
    ]
    # The adapter's own calls, as far as they go without a TPU.
    backend = TorchTPUBackend()
    facts["adapter_chip"] = backend.chip().to_dict()
    facts["adapter_memory"] = backend.memory()
    facts["adapter_compilations"] = backend.compilation_count()
    facts["adapter_device_error"] = _error(backend.device)
    roundtrip = {}
    for mode in TorchTPUBackend.eager_modes:
        with TorchTPUBackend(eager_mode=mode)._eager_mode():
            inside = tpu.eager_mode.name
        roundtrip[mode] = [inside, tpu.eager_mode.name]
    facts["eager_roundtrip"] = roundtrip
    facts["standin"] = standin_facts(tpu)
    return facts


SHELL_CELLS = {
    "info": "%tpu_info",
    "plain": "%%tpu\nx = torch.ones(3).cuda() * 2\n",
    "explicit": "%%tpu --backend tpu\ny = torch.ones(3)\n",
}


def shell_facts() -> dict[str, Any]:
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.enabled = False
    ip = InteractiveShell.instance(config=config)
    ip.run_line_magic("colors", "nocolor")
    facts: dict[str, Any] = {}
    with capture_output() as cap:
        ip.run_line_magic("load_ext", "gpu2tpu")
        ip.run_cell("import torch")
    facts["load"] = {"stdout": cap.stdout, "stderr": cap.stderr}
    for key, cell in SHELL_CELLS.items():
        with capture_output() as cap:
            result = ip.run_cell(cell, store_history=True)
        error = result.error_in_exec or result.error_before_exec
        facts[key] = {
            "success": result.success,
            "error": f"{type(error).__name__}: {error}" if error else None,
            "stdout": cap.stdout,
            "stderr": cap.stderr,
        }
    x = ip.user_ns.get("x")
    facts["x"] = {"device": str(x.device), "values": x.tolist()} if x is not None else None
    facts["y_defined"] = "y" in ip.user_ns
    facts["torch_tpu_loaded"] = "torch_tpu" in sys.modules
    return facts


def main(argv: list[str]) -> int:
    what = argv[1] if len(argv) > 1 else "api"
    facts = api_facts() if what == "api" else shell_facts()
    with contextlib.suppress(BrokenPipeError):
        print(json.dumps(facts, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
