"""The environment doctor: where it runs, whether versions fit, and the command for each fix.

Version sets come from stand-in `*.dist-info` metadata (tests/standins/metadata) read through
the real `importlib.metadata` lookup; machines come from temporary directories laid out like
/dev, /proc and /sys. The real environment of the test run must come out healthy.
"""

from __future__ import annotations

import html
import importlib
import importlib.metadata
import json
import re
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from rich.console import Console
from standins import forget_standins, use_standins
from standins.metadata import STANDIN_SETS, build_site

from gpu2tpu.cli import main
from gpu2tpu.readiness.doctor import DoctorReport, diagnose
from gpu2tpu.readiness.environment import chips_in_slice, detect_environment
from gpu2tpu.readiness.versions import TCMALLOC_INSTALL, check_versions, read_installed

PY311 = (3, 11, 9)
UNTESTED = "not one gpu2tpu has tested"
ROOT = Path(__file__).resolve().parent.parent


# -- machines ----------------------------------------------------------------------------------


def tpu_root(tmp: Path, chips: int = 4) -> Path:
    """A file system with `chips` Google TPU chips on the PCI bus."""
    root = tmp / "tpu-machine"
    for i in range(chips):
        device = root / "sys" / "bus" / "pci" / "devices" / f"0000:00:0{4 + i}.0"
        device.mkdir(parents=True)
        (device / "vendor").write_text("0x1ae0\n")
    other = root / "sys" / "bus" / "pci" / "devices" / "0000:00:01.0"
    other.mkdir(parents=True)
    (other / "vendor").write_text("0x8086\n")
    (root / "dev").mkdir()
    return root


def gpu_root(tmp: Path, models: list[str]) -> Path:
    root = tmp / "gpu-machine"
    for i, model in enumerate(models):
        gpu = root / "proc" / "driver" / "nvidia" / "gpus" / f"0000:00:0{4 + i}.0"
        gpu.mkdir(parents=True)
        (gpu / "information").write_text(f"Model: \t\t {model}\nIRQ:   \t\t 37\n")
        (root / "dev").mkdir(exist_ok=True)
        (root / "dev" / f"nvidia{i}").write_text("")
    return root


def empty_root(tmp: Path) -> Path:
    root = tmp / "cpu-machine"
    (root / "dev").mkdir(parents=True)
    return root


def no_smi(_: str) -> None:
    return None


def stand_in(tmp_path: Path, name: str, **kwargs) -> DoctorReport:
    """Diagnose stand-in metadata set `name` (without starting backends: it is not installed)."""
    site = build_site(tmp_path, name)
    kwargs.setdefault("environ", {})
    kwargs.setdefault("python_version", PY311)
    kwargs.setdefault("root", empty_root(tmp_path))
    kwargs.setdefault("probe_backends", False)
    return diagnose(metadata_paths=[site], **kwargs)


def version_problems(report: DoctorReport) -> list:
    return [p for p in report.problems if p.kind in ("versions", "python")]


def pinned(fix: str) -> tuple[str, str]:
    """'pip install "torch==2.12.1"' -> ('torch', '2.12.1')."""
    match = re.fullmatch(r'pip install "([A-Za-z0-9_.\-\[\]]+)==([0-9.]+)"', fix)
    assert match, f"not a pinned pip install line: {fix}"
    return match.group(1), match.group(2)


# -- where it runs -----------------------------------------------------------------------------


def test_cloud_tpu_vm_with_accelerator_type_and_chips(tmp_path: Path) -> None:
    env = detect_environment({"TPU_ACCELERATOR_TYPE": "v4-8"}, tpu_root(tmp_path), no_smi)
    assert (env.hosting, env.accelerator) == ("cloud-tpu-vm", "tpu")
    assert env.tpu.kind == "v4"
    assert env.tpu.chips_on_host == 4
    assert env.tpu.chips_in_slice == 4
    assert env.label == "Cloud TPU VM v4-8 (v4, 4 chips on this host)"


def test_multi_host_slice_counts_hosts_and_slice_chips(tmp_path: Path) -> None:
    environ = {"TPU_ACCELERATOR_TYPE": "v4-32", "TPU_WORKER_HOSTNAMES": "h0,h1,h2,h3"}
    env = detect_environment(environ, tpu_root(tmp_path), no_smi)
    assert env.tpu.hosts == 4
    assert env.tpu.chips_in_slice == 16
    assert "16 in the slice across 4 hosts" in env.label


def test_accelerator_type_suffixes_count_cores_or_chips() -> None:
    assert chips_in_slice("v5p-8") == 4  # TensorCores, two per chip
    assert chips_in_slice("v5litepod-8") == 8  # chips
    assert chips_in_slice("v6e-1") == 1
    assert chips_in_slice("unheard-of-8") is None


def test_colab_tpu_runtime_through_vfio(tmp_path: Path) -> None:
    root = empty_root(tmp_path)
    (root / "dev" / "vfio").mkdir()
    (root / "dev" / "vfio" / "0").write_text("")
    (root / "dev" / "vfio" / "vfio").write_text("")  # the control node is not a chip
    environ = {"COLAB_RELEASE_TAG": "release-colab_20261101", "TPU_ACCELERATOR_TYPE": "v5litepod-1"}
    env = detect_environment(environ, root, no_smi)
    assert env.label == "Colab TPU runtime (v5e, 1 chip on this host)"


def test_vfio_groups_without_a_named_tpu_are_not_a_tpu(tmp_path: Path) -> None:
    root = empty_root(tmp_path)
    (root / "dev" / "vfio").mkdir()
    (root / "dev" / "vfio" / "0").write_text("")
    assert detect_environment({}, root, no_smi).accelerator == "cpu"


def test_kaggle_tpu_runtime_through_accel_nodes(tmp_path: Path) -> None:
    root = empty_root(tmp_path)
    for i in range(4):
        (root / "dev" / f"accel{i}").write_text("")
    environ = {"KAGGLE_KERNEL_RUN_TYPE": "Interactive", "TPU_ACCELERATOR_TYPE": "v3-8"}
    env = detect_environment(environ, root, no_smi)
    assert env.label == "Kaggle TPU runtime (v3, 4 chips on this host)"


def test_kaggle_gpu_runtime_names_the_gpus(tmp_path: Path) -> None:
    root = gpu_root(tmp_path, ["Tesla T4", "Tesla T4"])
    env = detect_environment({"KAGGLE_URL_BASE": "https://www.kaggle.com"}, root, no_smi)
    assert env.label == "Kaggle GPU runtime (2 × Tesla T4)"


def test_gpu_machine_from_driver_and_nvidia_smi(tmp_path: Path) -> None:
    root = gpu_root(tmp_path, ["NVIDIA H100 80GB HBM3"])
    env = detect_environment({}, root, lambda name: f"/usr/bin/{name}")
    assert env.accelerator == "gpu"
    assert env.label == "GPU machine (1 × NVIDIA H100 80GB HBM3)"
    assert any("nvidia-smi at /usr/bin/nvidia-smi" in e for e in env.evidence)


def test_colab_gpu_runtime_from_colab_gpu(tmp_path: Path) -> None:
    env = detect_environment({"COLAB_GPU": "1"}, empty_root(tmp_path), no_smi)
    assert env.label == "Colab GPU runtime (1 NVIDIA GPU)"


def test_cpu_only_machine(tmp_path: Path) -> None:
    env = detect_environment({}, empty_root(tmp_path), no_smi)
    assert (env.hosting, env.accelerator, env.label) == ("machine", "cpu", "CPU-only machine")


def test_named_tpu_without_chips_is_a_cpu_machine_with_a_note(tmp_path: Path) -> None:
    # Users set TPU_ACCELERATOR_TYPE to quiet libtpu when cross-compiling on a CPU host.
    report = stand_in(
        tmp_path, "torchtpu_matching", environ={"TPU_ACCELERATOR_TYPE": "v5litepod-1"}
    )
    assert report.environment.accelerator == "cpu"
    assert any("no TPU chip is visible" in n.message for n in report.notes)


def test_colab_tpu_node_runtime_is_explained(tmp_path: Path) -> None:
    environ = {"COLAB_GPU": "0", "COLAB_TPU_ADDR": "10.0.0.2:8470"}
    report = stand_in(tmp_path, "torchax_matching", environ=environ)
    assert report.environment.label == "Colab TPU-node runtime (remote TPU at 10.0.0.2:8470)"
    assert any("TPU VM runtime" in n.message for n in report.notes)


# -- versions that fit -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["torchtpu_matching", "torchax_matching", "xla_matching"])
def test_matching_stand_in_sets_on_a_tpu_have_no_problems(tmp_path: Path, name: str) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    environ = {"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4"}
    report = stand_in(tmp_path, name, environ=environ, root=tpu_root(tmp_path), tcmalloc_dirs=[lib])
    assert report.environment.accelerator == "tpu"
    assert report.ok, str(report)
    # The stand-ins match the packages' declared ranges; the sets the project tests are
    # another matter (their own tests, below).
    assert not [n for n in report.notes if UNTESTED not in n.message], str(report)
    installed = {d.name for d in STANDIN_SETS[name]}
    expected = {
        "torch_tpu": "TorchTPU 0.2.0 on 4 TPU chips",
        "torchax": "torchax 0.0.13 on JAX 0.10.2 (TPU)",
        "torch_xla": "PyTorch/XLA 2.9.0 on the TPU",
    }
    for package, line in expected.items():
        assert (line in report.usable) == (package in installed), report.usable


def test_what_each_extra_would_add_is_said_not_counted_as_a_problem(tmp_path: Path) -> None:
    # torch, torch_xla and libtpu, without IPython, ipywidgets or the forecast's packages.
    report = stand_in(tmp_path, "xla_matching")
    assert report.ok, str(report)
    notebook, forecast = report.missing
    assert notebook.packages == ("IPython", "ipywidgets")
    assert notebook.install == "pip install 'gpu2tpu[notebook]'"
    assert forecast.packages == ("jax", "jaxlib", "torchax", "optax")  # libtpu is there
    assert forecast.install == "pip install 'gpu2tpu[forecast]'"
    assert report.missing_optional == ["torch_tpu"]  # torchax is named with its extra
    text = str(report)
    assert f"  - {notebook.line}" in text and f"  - {forecast.line}" in text
    assert report.to_dict()["missing"][0]["packages"] == ["IPython", "ipywidgets"]
    assert report.versions["torch_xla"] == "2.9.0" and report.versions["ipython"] is None


def test_python_older_than_a_package_requires(tmp_path: Path) -> None:
    report = stand_in(tmp_path, "torchtpu_matching", python_version=(3, 10, 12))
    (problem,) = version_problems(report)
    assert problem.package == "python"
    assert "torch_tpu 0.2.0 and libtpu 0.0.52 need Python >=3.11" in problem.message
    assert "Python 3.10.12" in problem.message
    assert problem.fix.startswith("python3.11 -m venv ")
    # The new environment gets the same packages back, pinned.
    for dist in STANDIN_SETS["torchtpu_matching"]:
        assert f"=={dist.version}" in problem.fix


# -- versions that do not fit ------------------------------------------------------------------


def test_torch_outside_torch_tpu_range(tmp_path: Path) -> None:
    report = stand_in(tmp_path, "torchtpu_torch_too_old")
    (problem,) = version_problems(report)
    assert problem.package == "torch"
    assert "torch_tpu 0.2.0 needs torch" in problem.message
    assert "torch 2.10.0 is installed" in problem.message
    package, version = pinned(problem.fix)
    assert package == "torch"
    assert SpecifierSet("<=2.15,>=2.11").contains(version)
    assert "Requires-Dist of torch_tpu 0.2.0" in problem.source
    assert not report.ok


def test_torch_216_fix_satisfies_torchax_and_torch_tpu_together(tmp_path: Path) -> None:
    report = stand_in(tmp_path, "torchax_torch_216_with_torchtpu", probe_backends=True)
    torch_problems = [p for p in version_problems(report) if p.package == "torch"]
    # torch 2.16 is past both ranges: one problem each, with the same fix.
    (problem,) = [p for p in torch_problems if "torchax" in p.message]
    assert {p.fix for p in torch_problems} == {problem.fix} and len(torch_problems) == 2
    assert "torchax 0.0.13 needs torch<2.16" in problem.message
    assert "dim_Dimname" in problem.message  # the known fact says why
    package, version = pinned(problem.fix)
    assert package == "torch"
    assert SpecifierSet("<2.16").contains(version)
    assert SpecifierSet("<=2.15,>=2.11").contains(version)
    # A torch problem means importing torch could crash: the backends are not started.
    assert report.backends is None
    assert "torch" in report.probe_note


def test_libtpu_pins_that_conflict_on_a_tpu(tmp_path: Path) -> None:
    environ = {"LD_PRELOAD": "libtcmalloc.so.4"}
    report = stand_in(
        tmp_path, "torchax_torch_216_with_torchtpu", environ=environ, root=tpu_root(tmp_path)
    )
    (libtpu,) = [p for p in report.problems if p.package == "libtpu"]
    assert "jax[tpu] 0.10.2 pins libtpu==0.0.42.* for TPUs" in libtpu.message
    assert "TorchTPU (torch_tpu 0.2.0)" in libtpu.message and "libtpu>=0.0.50" in libtpu.message
    # the pin would break TorchTPU: jax[tpu] gets an environment of its own instead
    assert "libtpu==" not in libtpu.fix
    assert libtpu.fix == (
        'python -m venv .venv-jax && .venv-jax/bin/pip install "jax[tpu]==0.10.2"'
    )


def test_libtpu_pin_is_only_a_note_without_a_tpu(tmp_path: Path) -> None:
    report = stand_in(tmp_path, "torchax_torch_216_with_torchtpu")
    assert not [p for p in report.problems if p.package == "libtpu"]
    assert any("matters only on a TPU machine" in n.message for n in report.notes)


def test_the_doctor_and_tpu_info_state_torch_tpus_needs_from_one_place() -> None:
    """%tpu_doctor once said "No problems found" and then suggested libtpu==0.0.42.*, while
    %tpu_info said TorchTPU needs libtpu>=0.0.50: both now read backends/torchtpu.py."""
    from gpu2tpu.backends import torchtpu
    from gpu2tpu.readiness.versions import InstalledDistribution, check_versions

    installed = {
        "jax": InstalledDistribution(
            "jax", "0.10.2", requires=('libtpu==0.0.42.*; extra == "tpu"', "jaxlib<=0.10.2")
        ),
        "jaxlib": InstalledDistribution("jaxlib", "0.10.2"),
        "libtpu": InstalledDistribution("libtpu", "0.0.52"),
    }
    (note,) = [f for f in check_versions(installed, (3, 11, 7)) if f.package == "libtpu"]
    assert note.severity == "note" and "libtpu>=0.0.50" in note.message
    assert "libtpu==" not in note.fix
    assert "libtpu>=0.0.50" in torchtpu.REQUIRES
    assert "libtpu>=0.0.50" in torchtpu.TorchTPUBackend.install_note
    assert "Python>=3.11" in torchtpu.TorchTPUBackend.install_note


def test_torch_xla_with_another_torch_minor(tmp_path: Path) -> None:
    report = stand_in(tmp_path, "xla_torch_minor_mismatch")
    (problem,) = version_problems(report)
    assert "torch_xla 2.9.0 needs torch==2.9.*" in problem.message
    assert problem.fix == 'pip install "torch==2.9.0"'


def test_jaxlib_behind_jax(tmp_path: Path) -> None:
    report = stand_in(tmp_path, "jaxlib_behind_jax")
    (problem,) = version_problems(report)
    assert "jax 0.10.2 needs jaxlib<=0.10.2,>=0.10.1, but jaxlib 0.9.0 is installed" in (
        problem.message
    )
    assert problem.fix == 'pip install "jaxlib==0.10.2"'


def test_required_packages_that_are_missing(tmp_path: Path) -> None:
    report = stand_in(tmp_path, "required_missing")
    by_package = {p.package: p for p in version_problems(report)}
    assert set(by_package) == {"jax", "libtpu"}
    assert "torchax 0.0.13 needs jax>=0.6.2, which is not installed" in by_package["jax"].message
    assert by_package["jax"].fix == 'pip install "jax>=0.6.2"'
    assert by_package["libtpu"].fix == 'pip install "libtpu>=0.0.50"'


def test_check_versions_reads_the_same_metadata_pip_does(tmp_path: Path) -> None:
    site = build_site(tmp_path, "torchtpu_torch_too_old")
    installed = read_installed(paths=[site])
    assert {d.name: d.version for d in installed.values()} == {
        "torch": "2.10.0",
        "torch-tpu": "0.2.0",
        "libtpu": "0.0.52",
    }
    assert [f.package for f in check_versions(installed, PY311)] == ["torch"]


# -- TorchTPU's allocator and settings that keep the TPU idle ----------------------------------


def test_torch_tpu_without_tcmalloc_points_at_the_library(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libtcmalloc.so.4").write_text("")
    report = stand_in(tmp_path, "torchtpu_matching", root=tpu_root(tmp_path), tcmalloc_dirs=[lib])
    (problem,) = report.problems
    assert problem.kind == "allocator"
    assert problem.fix == f"export LD_PRELOAD={lib / 'libtcmalloc.so.4'}"


def test_torch_tpu_without_tcmalloc_installed_says_how_to_get_it(tmp_path: Path) -> None:
    root = tpu_root(tmp_path)
    report = stand_in(tmp_path, "torchtpu_matching", root=root, tcmalloc_dirs=[tmp_path / "no"])
    (problem,) = report.problems
    assert problem.fix == TCMALLOC_INSTALL


def test_tcmalloc_is_only_a_note_where_torch_tpu_cannot_run(tmp_path: Path) -> None:
    report = stand_in(tmp_path, "torchtpu_matching", tcmalloc_dirs=[tmp_path / "no"])
    assert report.ok
    assert any(n.fix == TCMALLOC_INSTALL for n in report.notes)


def test_jax_platforms_cpu_on_a_tpu_machine(tmp_path: Path) -> None:
    report = stand_in(
        tmp_path, "torchax_matching", environ={"JAX_PLATFORMS": "cpu"}, root=tpu_root(tmp_path)
    )
    (problem,) = report.problems
    assert problem.kind == "environment"
    assert problem.fix == "unset JAX_PLATFORMS"


def test_pjrt_device_cpu_on_a_tpu_machine(tmp_path: Path) -> None:
    report = stand_in(
        tmp_path, "xla_matching", environ={"PJRT_DEVICE": "CPU"}, root=tpu_root(tmp_path)
    )
    (problem,) = report.problems
    assert problem.fix == "export PJRT_DEVICE=TPU"


def test_tpu_machine_without_any_pytorch_tpu_backend(tmp_path: Path) -> None:
    empty_site = tmp_path / "empty-site"
    empty_site.mkdir()
    report = diagnose(
        environ={},
        metadata_paths=[empty_site],
        root=tpu_root(tmp_path),
        python_version=PY311,
        probe_backends=False,
    )
    (problem,) = report.problems
    assert "no PyTorch TPU backend" in problem.message
    assert problem.fix.startswith("pip install torch-tpu")


def test_torch_tpu_that_raises_when_asked_is_a_note_not_a_failed_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from gpu2tpu.backends.torchtpu import TorchTPUBackend

    def asks_torch_tpu(cls: type) -> None:
        torch.tpu.is_available()  # what the adapter once did; TorchTPU 0.2.0 raises

    use_standins(monkeypatch, "torch_tpu")
    monkeypatch.setattr(TorchTPUBackend, "unavailable_reason", classmethod(asks_torch_tpu))
    try:
        report = stand_in(
            tmp_path,
            "torchtpu_matching",
            root=tpu_root(tmp_path),
            environ={"LD_PRELOAD": "libtcmalloc.so.4"},
            probe_backends=True,
        )
    finally:
        forget_standins()
    assert report.probe_note is None
    (note,) = [
        n for n in report.notes if "torch_tpu 0.2.0" in n.message and UNTESTED not in n.message
    ]
    assert note.message.startswith(
        "torch_tpu 0.2.0 is installed on this TPU machine but cannot run: failed when asked "
        "whether it runs here (RuntimeError: is_available is internal to TorchTPU"
    )
    assert not any(line.startswith("TorchTPU") for line in report.usable)
    assert {b.name: b for b in report.backends}["cpu"].available


# -- the real environment of this test run -----------------------------------------------------


def test_real_environment_is_healthy_for_the_cpu_backend() -> None:
    import torch

    report = diagnose()
    assert report.ok, str(report)
    cpu = {b.name: b for b in report.backends}["cpu"]
    assert cpu.available
    torch_version = importlib.metadata.version("torch")
    assert report.versions["torch"] == torch_version
    cpu_lines = [line for line in report.usable if line.startswith("CPU: PyTorch")]
    assert cpu_lines == [line for line in cpu_lines if torch_version in line] and cpu_lines
    if torch.version.cuda and not torch.cuda.is_available():
        assert "CUDA is not usable" in cpu_lines[0]
    for package in ("torch_tpu", "torch_xla"):
        if report.versions[package] is None:
            assert package in report.missing_optional
    if report.versions["torchax"] and report.versions["jax"]:
        assert any(line.startswith("torchax ") for line in report.usable)


# -- renderings and front ends -----------------------------------------------------------------


def test_renderings_carry_every_problem_and_fix(tmp_path: Path) -> None:
    root = tpu_root(tmp_path)
    report = stand_in(tmp_path, "torchax_torch_216_with_torchtpu", root=root)
    assert len(report.problems) >= 3  # torch, libtpu and tcmalloc
    text = str(report)
    data = json.loads(json.dumps(report.to_dict()))
    console = Console(record=True, width=200)
    console.print(report)
    rich_text = console.export_text()
    view = report.widget()
    widget_html = view.children[0].value
    assert data["ok"] is False
    for problem, as_dict in zip(report.problems, data["problems"], strict=True):
        assert as_dict["fix"] == problem.fix
        assert problem.message in text and problem.fix in text
        assert problem.fix in rich_text
        assert html.escape(problem.fix) in widget_html
    assert report.headline in text


def test_main_exits_0_on_the_healthy_environment(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is True
    assert data["environment"]["label"]


def test_main_exits_1_when_versions_clash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The stand-in site first on sys.path: `importlib.metadata` finds its torch 2.10.0 first.
    site = build_site(tmp_path, "torchtpu_torch_too_old")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "torch_tpu 0.2.0 needs torch" in out
    assert 'fix: pip install "torch==' in out


def test_magic_prints_text_outside_a_notebook(capsys: pytest.CaptureFixture[str]) -> None:
    # In a kernel it is a widget with HTML and text beside it (tests/test_magics.py).
    from gpu2tpu.magics.info import show_doctor

    report = show_doctor(shell=None)
    out = capsys.readouterr().out
    assert out.startswith("gpu2tpu doctor: ") and out.rstrip("\n") == str(report)


def test_unparsable_requirement_lines_are_skipped(tmp_path: Path) -> None:
    site = tmp_path / "site"
    info = site / "torch_tpu-0.2.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torch_tpu\nVersion: 0.2.0\n"
        "Summary: STAND-IN with a broken requirement line\n"
        "Requires-Dist: torch>=2.11,<=2.15\nRequires-Dist: ]]not a requirement[[\n"
    )
    installed = read_installed(paths=[site])
    findings = check_versions(installed, PY311)
    assert [f.message for f in findings] == [
        "torch_tpu 0.2.0 needs torch<=2.15,>=2.11, which is not installed."
    ]


# -- the sets the project tests ----------------------------------------------------------------


def _lock_pins(*names: str) -> dict[str, str]:
    """{canonical name: version} of the `name==version` lines of requirements/<names>."""
    pins: dict[str, str] = {}
    for name in names:
        for line in (ROOT / "requirements" / name).read_text(encoding="utf-8").splitlines():
            match = re.match(r"([A-Za-z0-9_.\-]+)==([^\s;\\]+)", line)
            if match:
                pins[canonicalize_name(match.group(1))] = match.group(2)
    return pins


def test_each_tested_set_is_what_its_lock_pins() -> None:
    """A lock that moves (`make lock`) moves its set in readiness/tested_sets.json too."""
    from gpu2tpu.readiness.versions import tested_sets

    locks = {
        "torchax": ("dev.lock",),
        "torch-tpu": ("dev.lock", "tpu.lock"),
        "torch-xla": ("xla-cpu.lock",),
    }
    sets = tested_sets()
    assert {s.key for s in sets} == set(locks)
    for tested in sets:
        pins = _lock_pins(*locks[tested.key])
        assert tested.versions == {n: pins[n] for n in tested.versions}, tested.source


def test_an_untested_set_is_a_note_that_names_it_and_the_tested_one() -> None:
    from gpu2tpu.readiness.versions import InstalledDistribution, tested_sets, untested_set_findings

    [forecast] = [s for s in tested_sets() if s.key == "torchax"]
    tested = {n: InstalledDistribution(n, v) for n, v in forecast.versions.items()}
    assert untested_set_findings(tested) == []
    # a local build tag names the build (a CUDA build of the same release): still tested
    local = {
        **tested,
        "torch": InstalledDistribution("torch", f"{forecast.versions['torch']}+cu132"),
    }
    assert untested_set_findings(local) == []
    newer = {**tested, "torch": InstalledDistribution("torch", "2.16.0")}
    [finding] = untested_set_findings(newer)
    assert finding.severity == "note" and finding.package == "torchax"
    assert UNTESTED in finding.message and "torch 2.16.0" in finding.message
    assert f"tested: torch {forecast.versions['torch']}" in finding.message
    assert f'"torch=={forecast.versions["torch"]}"' in finding.fix
    # a stack that is not installed is not judged
    assert untested_set_findings({"torch": newer["torch"]}) == []


def test_the_doctor_notes_an_untested_set(tmp_path: Path) -> None:
    report = stand_in(tmp_path, "torchax_torch_216_with_torchtpu")
    notes = [n.message for n in report.notes if UNTESTED in n.message]
    assert any("for the forecast and the jax backend" in n for n in notes), notes
    assert any("for TorchTPU" in n for n in notes), notes
