"""The analysis layer and the options for callers that run texts one after another.

Fixtures (tests/fixtures/rules/) show what the rules make of whole files; these tests pin the
layer's own answers (scopes, load/store, placement) and the notebook-caller API of
`Options`: `prior_imports`, `prior_names`, `reserved_names`, `insert_statements` and
`Result.required_imports`.
"""

from __future__ import annotations

import ast

import pytest

from gpu2tpu.rewrite.analysis.placement import (
    device_line_after,
    device_line_blocked,
    setup_block_end,
)
from gpu2tpu.rewrite.core.model import Options
from gpu2tpu.rewrite.core.source import rewrite_source

# -- names and scopes ------------------------------------------------------------------------


def fixed_codes(text: str, options: Options | None = None) -> list[str]:
    return [f.code for f in rewrite_source(text, options).edits]


def test_a_local_import_binds_only_its_function() -> None:
    text = (
        "def a():\n    from torch import cuda\n    return cuda.device_count()\n\n\n"
        "def b(cuda):\n    return cuda.device_count()\n"
    )
    result = rewrite_source(text)
    assert [f.line for f in result.edits] == [3]
    assert "return cuda.device_count()" in result.new_text.split("def b")[1]


def test_a_parameter_named_torch_is_not_torch() -> None:
    text = "import torch\n\n\ndef f(torch):\n    return torch.cuda.is_available()\n"
    assert rewrite_source(text).new_text == text


def test_a_class_body_does_not_enclose_its_methods() -> None:
    text = (
        "import torch\n\n\nclass K:\n    torch = None\n\n    def m(self):\n"
        "        return torch.cuda.is_available()\n"
    )
    assert fixed_codes(text) == ["G2T104"]


def test_global_reaches_the_module_binding() -> None:
    text = "import torch\n\n\ndef f():\n    global torch\n    return torch.cuda.is_available()\n"
    assert fixed_codes(text) == ["G2T104"]


def test_a_fix_inside_a_function_uses_its_local_torch_alias() -> None:
    text = "def f():\n    import torch as th\n\n    return th.cuda.device_count()\n"
    result = rewrite_source(text)
    assert "th.accelerator.device_count()" in result.new_text
    assert "import torch\n" not in result.new_text  # no module-level import was needed


def test_a_lambda_parameter_shadows() -> None:
    text = "import torch\n\nf = lambda torch: torch.cuda.is_available()\n"
    assert rewrite_source(text).new_text == text


def test_calls_in_a_chain_are_not_flattened_into_a_name() -> None:
    """`torch.cuda.get_device_properties(0).total_memory` is an attribute of a call's result,
    not a name `torch.cuda.get_device_properties.total_memory`."""
    text = "import torch\n\nmem = torch.cuda.get_device_properties(0).total_memory\n"
    codes = [f.code for f in rewrite_source(text).all]
    assert codes == ["G2T313"]


# -- placement -------------------------------------------------------------------------------


def test_the_start_up_block_runs_through_environment_and_path_set_up() -> None:
    tree = ast.parse(
        '"""Doc."""\nimport os\nos.environ["A"] = "1"\nimport sys\nsys.path.insert(0, ".")\n'
        "import warnings\nwarnings.simplefilter('ignore')\nimport torch\nx = 1\n"
    )
    assert setup_block_end(tree) == 8


def test_the_device_line_follows_a_late_torch_import_and_cuda_environment() -> None:
    tree = ast.parse(
        "import argparse\nargs = 1\nimport torch\nimport os\n"
        "os.environ['CUDA_VISIBLE_DEVICES'] = '0'\nprint(args)\n"
    )
    assert device_line_after(tree) == 5


def test_cuda_environment_set_in_a_function_blocks_the_device_line() -> None:
    text = "import os\n\n\ndef main():\n    os.environ['CUDA_VISIBLE_DEVICES'] = '1'\n"
    reason = device_line_blocked(ast.parse(text), text)
    assert reason is not None and "main()" in reason and "CUDA_VISIBLE_DEVICES" in reason
    harmless = "import os\n\n\ndef main():\n    return os.environ.get('CUDA_VISIBLE_DEVICES')\n"
    assert device_line_blocked(ast.parse(harmless), harmless) is None


# -- options for notebook callers ------------------------------------------------------------


def test_prior_imports_resolve_like_the_texts_own() -> None:
    cell = "with amp_autocast():\n    y = model(x)\n"
    options = Options(
        prior_imports=("import torch as T", "from torch.cuda.amp import autocast as amp_autocast"),
        device_name="device",
    )
    result = rewrite_source(cell, options)
    assert result.new_text.startswith("with T.amp.autocast(device_type=device.type):")
    assert "import" not in result.new_text


def test_the_texts_own_binding_wins_over_a_prior_import() -> None:
    cell = "cuda = object()\ncuda.synchronize()\n"
    options = Options(prior_imports=("from torch import cuda",), device_name="device")
    assert rewrite_source(cell, options).new_text == cell


@pytest.mark.parametrize("field", ["prior_names", "reserved_names"])
def test_new_variables_never_take_prior_or_reserved_names(field: str) -> None:
    text = "import torch\n\nx = torch.ones(2).cuda()\n"
    result = rewrite_source(text, Options(**{field: frozenset({"device"})}))
    assert result.device_name == "accel_device"
    assert "accel_device = torch.accelerator" in result.new_text


def test_without_statements_a_device_fix_needs_the_callers_device() -> None:
    text = "y = x.cuda()\n"
    result = rewrite_source(text, Options(insert_statements=False))
    assert result.new_text == text
    (finding,) = result.findings
    assert finding.code == "G2T101" and not finding.fixed
    assert "no statement may be added" in finding.hint
    given = rewrite_source(text, Options(insert_statements=False, device_name="dev"))
    assert given.new_text == "y = x.to(dev)\n"
    assert not given.device_defined


def test_without_statements_imports_come_back_as_required() -> None:
    text = "n = torch.cuda.device_count()\n"
    result = rewrite_source(text, Options(insert_statements=False))
    assert result.new_text == "n = torch.accelerator.device_count()\n"
    assert result.required_imports == ("import torch",)
    inserted = rewrite_source(text)
    assert inserted.new_text.startswith("import torch\n")
    assert inserted.required_imports == ()


def test_without_statements_the_time_import_comes_back_as_required() -> None:
    text = (
        "import torch\n\n\ndef timed(step):\n"
        "    start = torch.cuda.Event(enable_timing=True)\n"
        "    end = torch.cuda.Event(enable_timing=True)\n"
        "    start.record()\n    step()\n    end.record()\n"
        "    return start.elapsed_time(end)\n"
    )
    result = rewrite_source(text, Options(insert_statements=False))
    assert "time.perf_counter()" in result.new_text
    assert "import time" not in result.new_text
    assert result.required_imports == ("import time",)
    prior = rewrite_source(text, Options(insert_statements=False, prior_imports=("import time",)))
    assert prior.required_imports == ()


# -- ranks and processes ---------------------------------------------------------------------


def _context(text: str):  # type: ignore[no-untyped-def]
    from gpu2tpu.rewrite.rules.base import RuleContext

    return RuleContext(text, Options())


def test_device_indices_are_found_by_what_the_module_does_with_them() -> None:
    from gpu2tpu.rewrite.analysis.ranks import device_index_names

    text = (
        "import os\nimport torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
        "class T:\n    def __init__(self, model, gpu_id, device):\n"
        '        self.slot = int(os.environ["LOCAL_RANK"])\n'
        "        torch.cuda.set_device(gpu_id)\n"
        "        self.model = DDP(model, device_ids=[self.which], output_device=device)\n"
    )
    # `device` is a device, never an ordinal, even where DDP takes it as output_device.
    assert device_index_names(_context(text)) == {"slot", "gpu_id", "which"}
    assert device_index_names(_context("import torch\nx = torch.zeros(1).to(gpu_id)\n")) == set()


def test_spawn_counts_resolve_through_the_imports() -> None:
    from gpu2tpu.rewrite.analysis.ranks import spawn_counts

    text = (
        "import torch\nimport torch.multiprocessing as mp\n"
        "world_size = torch.cuda.device_count()\n"
        "mp.spawn(main, args=(world_size,), nprocs=world_size)\n"
        "pool.spawn(work, (), workers)\n"  # not torch's spawn
        "torch.multiprocessing.spawn(main, (), n)\n"
    )
    assert spawn_counts(_context(text)) == {"world_size", "n"}


def test_a_device_count_only_feeds_spawn_as_at_least_one() -> None:
    text = (
        "import torch\nimport torch.multiprocessing as mp\n"
        "n_gpus = torch.cuda.device_count()\nworld_size = torch.cuda.device_count()\n"
        "mp.spawn(main, nprocs=world_size)\n"
    )
    new = rewrite_source(text).new_text
    assert "n_gpus = torch.accelerator.device_count()\n" in new
    assert "world_size = torch.accelerator.device_count() or 1\n" in new


def test_a_parameter_default_runs_before_the_device_line_is_withheld() -> None:
    """`def f(device="cuda")` above `import torch`: its default would read the device variable
    before the device line binds it, so the safety net withholds that one fix."""
    text = (
        'def f(device="cuda"):\n    return device\n\n\nimport torch\n\nx = torch.zeros(1).cuda()\n'
    )
    result = rewrite_source(text)
    assert 'def f(device="cuda"):' in result.new_text
    assert [f.code for f in result.edits] == ["G2T101"]
    assert any(f.code == "G2T113" and "withheld" in f.message for f in result.findings)


# -- names a new variable must not take --------------------------------------------------------


def test_the_symbol_tables_name_only_names_the_tree_has() -> None:
    """`ModuleNames.symbols` answers "taken" cheaply; it must never name what the tree does
    not (else a free name would be refused and the device variable's name would change)."""
    import importlib.util
    import re
    from pathlib import Path

    from gpu2tpu.rewrite.analysis.names import ModuleNames, variable_names

    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None
    files = sorted(Path(spec.origin).parent.rglob("*.py"))[::20]
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        extra = ModuleNames(text, tree).symbols - variable_names(tree)
        # a class's private names come mangled (`_C__x` for `__x`), and `__class__` implied
        assert all(re.fullmatch(r"_\w+__\w+|__class__|\.\d+", n) for n in extra), (path, extra)


def test_a_name_only_in_a_postponed_annotation_is_taken() -> None:
    """Under `from __future__ import annotations` an annotation's names have no symbol, yet a
    new `device` variable would shadow the `device` type the annotation names."""
    text = (
        "from __future__ import annotations\n\nimport torch\n\n\n"
        "def f(x: device) -> None:\n    pass\n\n\ny = torch.zeros(2).cuda()\n"
    )
    new = rewrite_source(text).new_text
    assert "y = torch.zeros(2).to(accel_device)" in new
    assert "\ndevice =" not in new


def test_a_loop_that_runs_the_model_reads_as_part_of_the_sentence() -> None:
    """A loop with no named role is described in parentheses, so the finding's own verb
    follows it ("... inside the `for` loop at line 4 (it runs the model) copies to ...")."""
    text = (
        "import torch\n\n\nfor x in range(3):\n"
        "    out = model(torch.ones(2))\n    print(out.sum().item())\n"
    )
    messages = [f.message for f in rewrite_source(text, Options(fix=False)).findings]
    assert "`.item()` inside the `for` loop at line 4 (it runs the model) copies to the host" in (
        " ".join(messages)
    ), messages
