"""`cuda_sources_beside`: the file-level half of G2T502 (CUDA sources next to the code).

The paths below do not exist: the function is pure and must decide from the paths alone.
"""

from __future__ import annotations

from pathlib import PurePath

from gpu2tpu.rewrite.core.model import Options, Safety
from gpu2tpu.rewrite.rules.manual import CudaSourceFile, cuda_sources_beside

TREE = [
    "proj/setup.py",
    "proj/csrc/fused_adam.cu",
    "proj/csrc/common.cuh",
    "proj/csrc/fused_adam.cpp",
    "proj/model/layers.py",
    "proj/model/attention.CU",
    "vendor/cutlass/gemm.cu",
    "vendor/cutlass/README.md",
    "notebooks/demo.ipynb",
    "notebooks/kernels/softmax.cu",
]


def reported(paths: list[str], options: Options | None = None) -> list[str]:
    return [str(path) for path, _ in cuda_sources_beside(paths, options)]


def test_reports_cuda_sources_under_the_code_only() -> None:
    assert reported(TREE) == [
        "notebooks/kernels/softmax.cu",
        "proj/csrc/common.cuh",
        "proj/csrc/fused_adam.cu",
        "proj/model/attention.CU",
    ]


def test_a_tree_without_python_code_reports_nothing() -> None:
    assert reported(["vendor/cutlass/gemm.cu", "vendor/cutlass/gemm.h", "docs/x.md"]) == []


def test_code_in_a_sibling_folder_does_not_count() -> None:
    assert reported(["src/train.py", "csrc/kernel.cu"]) == []
    assert reported(["train.py", "src/train.py", "csrc/kernel.cu"]) == ["csrc/kernel.cu"]


def test_findings_are_g2t502_records_at_the_top_of_the_file() -> None:
    (path, finding), *_ = cuda_sources_beside(["pkg/ops.cu", "pkg/ops.py"])
    assert path == PurePath("pkg/ops.cu")
    assert (finding.code, finding.name) == (CudaSourceFile.code, CudaSourceFile.name)
    assert (finding.line, finding.col) == (1, 1)
    assert finding.safety is Safety.REPORT and not finding.fixed and not finding.fixable
    assert "ops.cu" in finding.message and finding.hint


def test_options_switch_it_off() -> None:
    assert reported(TREE, Options(ignore=("G2T502",))) == []
    assert reported(TREE, Options(select=("G2T1",))) == []
    assert len(reported(TREE, Options(select=("G2T5",)))) == 4


def test_absolute_paths_and_path_objects() -> None:
    paths = [PurePath("/repo/train.py"), PurePath("/repo/kernels/k.cu")]
    assert reported(paths) == ["/repo/kernels/k.cu"]
