"""The TorchTPU adapter, the doctor and the magics against the released torch_tpu 0.2.0.

The wheel is installed into a folder of its own (tests/torchtpu_env.py, `make tpu-env`) and
seen only by the subprocesses started here, through PYTHONPATH: `import torch` loads an
installed torch_tpu, which must not change what the rest of the suite sees. This machine has
no TPU, so what runs is the package as a user without a TPU gets it; the TPU-present paths are
driven through the stand-in (tests/standins/torch_tpu), which these tests hold to the real
package. Facts come from tests/torchtpu_probe.py; the expectations are docs/backends.md's.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import torch
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from standins.metadata import TORCH_TPU_020
from torchtpu_env import LOCK, ROOT, ensure_site, environ
from torchtpu_probe import STARTUP_DONE

# One xdist worker runs the module: its TorchTPU processes are started once, in module fixtures.
pytestmark = [pytest.mark.torchtpu, pytest.mark.slow, pytest.mark.xdist_group("torchtpu")]

PROBE = Path(__file__).resolve().parent / "torchtpu_probe.py"
NO_CHIP = "torch_tpu is installed but found no TPU chip on this machine"
# Requirements of torch_tpu 0.2.0 that the contract environment leaves out on purpose.
NOT_INSTALLED = {"tensorboard"}


@pytest.fixture(scope="module")
def site() -> Path:
    return ensure_site()


def run_in_site(site: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        env=environ(site),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


def probe(site: Path, what: str) -> tuple[dict[str, Any], str]:
    done = run_in_site(site, str(PROBE), what)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.fixture(scope="module")
def api(site: Path) -> tuple[dict[str, Any], str]:
    return probe(site, "api")


@pytest.fixture(scope="module")
def shell(site: Path) -> dict[str, Any]:
    return probe(site, "shell")[0]


@pytest.fixture(scope="module")
def doctor(site: Path) -> subprocess.CompletedProcess:
    return run_in_site(site, "-m", "gpu2tpu", "doctor")


def pinned_version() -> str:
    match = re.search(r"^torch-tpu==(\S+)", LOCK.read_text(encoding="utf-8"), re.MULTILINE)
    assert match, "requirements/tpu.lock pins no torch-tpu"
    return match.group(1)


def documented_public_names() -> set[str]:
    text = (ROOT / "docs" / "backends.md").read_text(encoding="utf-8")
    block = text.split("<!-- torch.tpu public names")[1].split("<!-- end of list -->")[0]
    return set(re.findall(r"`(\w+)`", block.split("-->", 1)[1]))


# -- the package as installed ------------------------------------------------------------------


def test_the_pinned_release_is_the_one_checked_and_the_extra_allows_it(api) -> None:
    facts, _ = api
    assert facts["version"] == pinned_version()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (extra,) = pyproject["project"]["optional-dependencies"]["tpu"]
    requirement = Requirement(extra)
    assert requirement.name == "torch_tpu" and facts["version"] in requirement.specifier
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"torch_tpu {facts['version']}" in readme  # the README names the tested release
    # The torch it runs with here is in the range the wheel declares.
    (torch_range,) = [r for r in map(Requirement, facts["requires"]) if r.name == "torch"]
    assert torch_range.specifier.contains(facts["torch_version"].split("+")[0])


def test_requirements_are_met_except_tensorboard_which_it_never_imports(site: Path, api) -> None:
    facts, _ = api
    found = {
        dist.metadata["Name"].lower().replace("_", "-"): dist.version
        for dist in importlib.metadata.distributions(path=[str(site), *sys.path])
    }
    unmet = []
    for line in facts["requires"]:
        requirement = Requirement(line)
        version = found.get(requirement.name.lower().replace("_", "-"))
        if version is None or not requirement.specifier.contains(version, prereleases=True):
            unmet.append(requirement.name)
    assert sorted(unmet) == sorted(NOT_INSTALLED)
    sources = (site / "torch_tpu").rglob("*.py")
    importers = [p for p in sources if re.search(r"^\s*(import|from) tensorboard\b", p.read_text(encoding="utf-8", errors="replace"), re.MULTILINE)]  # fmt: skip
    assert importers == []


def test_metadata_standin_is_the_wheels_own(api) -> None:
    facts, _ = api
    assert list(TORCH_TPU_020.requires) == facts["requires"]
    assert TORCH_TPU_020.requires_python == facts["requires_python"]
    assert TORCH_TPU_020.version == facts["version"]


def test_import_torch_loads_it_through_the_entry_point(api) -> None:
    facts, _ = api
    assert facts["entry_points"] == ["torch_tpu = torch_tpu._loader:load"]
    assert facts["loaded_by_torch"]


def test_public_module_is_what_the_docs_list(api) -> None:
    facts, _ = api
    assert set(facts["public"]) == documented_public_names()
    assert facts["memory_api"] == []
    assert facts["api_module_error"].startswith("ModuleNotFoundError")


def test_availability_and_counts_are_internal_to_torchtpu(api) -> None:
    facts, _ = api
    for name, error in facts["internal_errors"].items():
        assert error.startswith(f"RuntimeError: {name} is internal to TorchTPU"), error
        assert "Use torch.accelerator." in error


def test_without_a_tpu_no_tpu_device_is_registered(api) -> None:
    facts, _ = api
    assert facts["tpu_device_error"].endswith("device type at start of device string: tpu")
    assert facts["privateuse1"] == "privateuseone"
    assert facts["checked_accelerator"] == "None"
    if torch.version.cuda:  # this machine's wheel is a CUDA build
        assert facts["current_accelerator"] == "cuda"
    assert facts["device_name"] == "TPU"
    assert facts["properties_error"] == (
        "RuntimeError: unrecognized TPU 'TPU'; cannot determine device memory"
    )
    assert facts["dynamo_tpu_backend"]  # what the adapter's compile() names
    assert facts["eager_default"] == "DEFER_NEVER"


# -- the adapter against it --------------------------------------------------------------------


def test_every_name_the_adapter_uses_exists(api) -> None:
    facts, _ = api
    used = facts["adapter_names"]
    assert {"get_device_name", "set_eager_mode", "EagerMode"} <= set(used["tpu"])
    assert {"current_accelerator", "device_count", "synchronize"} <= set(used["accelerator"])
    assert len(used["eager_members"]) == 3
    assert facts["adapter_tpu_missing"] == []
    assert facts["adapter_accelerator_missing"] == []
    assert facts["adapter_eager_missing"] == []


def test_adapter_calls_run_against_the_real_package(api) -> None:
    facts, _ = api
    assert facts["adapter_chip"] == {"name": "TPU", "kind": "tpu", "count": 0}
    assert facts["adapter_memory"] is None  # no known chip, so no HBM figure
    assert facts["adapter_compilations"] == 0
    assert facts["adapter_device_error"] == f"RuntimeError: TorchTPU cannot run here: {NO_CHIP}"
    for mode, (inside, after) in facts["eager_roundtrip"].items():
        assert (inside, after) == (mode.upper(), facts["eager_default"])


def test_asking_the_backends_reports_torchtpu_installed_without_a_tpu(api) -> None:
    facts, _ = api
    tpu = facts["statuses"]["tpu"]
    assert (tpu["available"], tpu["reason"], tpu["version"]) == (False, NO_CHIP, "0.2.0")
    assert facts["statuses"]["cpu"]["available"]
    assert facts["auto"].startswith(f"auto: no TPU backend found ({NO_CHIP};")
    assert facts["auto"].endswith("falling back to the CPU")
    assert facts["adapter_warnings"] == []


def test_torchtpu_start_up_noise_is_kept_out_when_gpu2tpu_imports_torch(api, shell) -> None:
    _, stderr = api
    startup = stderr.split(STARTUP_DONE)[0]
    assert "TcMalloc" not in startup and "GetPjrtApi" not in startup, startup
    # The same import done by the user prints both: what the check above would catch.
    user_import = shell["load"]["stderr"]
    assert "<TorchTpu/Performance/TcMalloc/>" in user_import


# -- the stand-in the other tests use ----------------------------------------------------------


def test_standin_has_nothing_the_real_package_lacks(api) -> None:
    facts, _ = api
    standin = facts["standin"]
    assert standin["names"] and standin["missing_from_real"] == []
    for name, params in standin["signatures"].items():
        assert params["standin"] == params["real"], name
    for name, errors in standin["internal_errors"].items():
        assert errors["standin"] == errors["real"], name
    assert standin["eager_members"]["standin"] == standin["eager_members"]["real"]
    assert standin["properties_fields"]["standin"] == standin["properties_fields"]["real"]
    assert standin["files_missing_from_real"] == []
    assert standin["package_names_missing_from_real"] == []
    assert standin["loader_load"]
    # The stand-in offers every name the adapter uses, so the in-process tests reach them all.
    assert set(facts["adapter_names"]["tpu"]) <= set(standin["names"])


# -- a real IPython shell and the doctor command -----------------------------------------------


def test_tpu_info_shows_its_table(shell) -> None:
    info = shell["info"]
    assert info["success"] and info["error"] is None
    assert f"[missing] tpu   TorchTPU: {NO_CHIP}" in info["stdout"]
    assert "[found]   cpu   CPU" in info["stdout"]
    assert "torch_tpu 0.2.0" in info["stdout"]
    assert "Traceback" not in info["stdout"] + info["stderr"]


def test_plain_tpu_cell_runs_on_the_cpu(shell) -> None:
    plain = shell["plain"]
    assert plain["success"], plain
    assert shell["x"] == {"device": "cpu", "values": [2.0, 2.0, 2.0]}
    assert "falling back to the CPU, as a dry run" in plain["stdout"]


def test_explicit_tpu_backend_says_in_one_line_that_no_tpu_is_present(shell) -> None:
    explicit = shell["explicit"]
    assert not explicit["success"] and not shell["y_defined"]
    assert explicit["error"].startswith("UsageError: ")
    (line,) = explicit["stderr"].strip().splitlines()
    assert line == f"UsageError: the 'tpu' backend (TorchTPU) cannot run here: {NO_CHIP}"
    assert "Traceback" not in explicit["stdout"]


def test_doctor_reports_torchtpu_installed_with_no_tpu(doctor) -> None:
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    out = doctor.stdout
    assert "torch_tpu 0.2.0 is installed but sees no TPU here" in out
    assert "Asking the backends failed" not in out
    assert "torch_tpu 0.2.0" in out.splitlines()[-1]  # the versions line
    optional = [line for line in out.splitlines() if line.startswith("Not installed")]
    assert all("torch_tpu" not in line for line in optional)


def test_extra_bounds_match_the_wheels_torch_range(api) -> None:
    facts, _ = api
    (torch_range,) = [r for r in map(Requirement, facts["requires"]) if r.name == "torch"]
    assert torch_range.specifier == SpecifierSet(">=2.11.0,<=2.15.0")
    assert "torch>=2.11,<=2.15" in (ROOT / "gpu2tpu" / "backends" / "torchtpu.py").read_text()
