"""What the codemod keeps of a file once it is done with it: nothing. A worker checks
thousands of files in one process (`check` on a tree), so anything a file leaves behind is
memory for the rest of the run, and more objects for every garbage collection to walk."""

from __future__ import annotations

import ast
import gc
import weakref

from gpu2tpu.rewrite.analysis import values
from gpu2tpu.rewrite.analysis.names import ModuleNames
from gpu2tpu.rewrite.core.model import Options
from gpu2tpu.rewrite.core.source import rewrite_source

SOURCE = """import torch

gpu_ids = [0, 1]
device = "cuda"


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.device = f"cuda:{gpu_ids[0]}"

    def forward(self, x):
        return x.to(self.device)


model = Net().to(device)
"""


def test_the_value_facts_go_with_the_module_they_were_made_for() -> None:
    """The facts are cached by the module's names, weakly: a cached value that held its key
    (a bound method of it) kept every file's names, tree and facts for good."""
    names = ModuleNames(SOURCE, ast.parse(SOURCE))
    assert values.values_of(SOURCE, names) is not None
    held = weakref.ref(names)
    del names
    gc.collect()
    assert held() is None


def _live_trees() -> int:
    gc.collect()
    return sum(type(o) is ast.Module for o in gc.get_objects())


def test_checking_many_files_leaves_their_trees_behind_only_boundedly() -> None:
    """Fifty more files, and not fifty more trees alive (a cache of the last few may hold
    some; the value facts' cache had held every one)."""
    options = Options(fix=False)

    def check(first: int, count: int) -> None:
        for i in range(first, first + count):
            result = rewrite_source(SOURCE.replace("gpu_ids", f"gpu_ids_{i}"), options)
            assert result.findings

    check(0, 10)
    after_ten = _live_trees()
    check(10, 50)
    assert _live_trees() - after_ten < 25
