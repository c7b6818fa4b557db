"""`check` and `rewrite` tell one story (issue 32 §2), on every rule fixture: `check` says a
person must look at what `rewrite` leaves, and `check` of the rewrite's own output reports
nothing the rewrite did not leave (tests/self_check.py's `check_disagreements`; the corpus
and torch's sources run the same property in tests/test_corpus.py and
tests/test_torch_sources.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from self_check import check_disagreements
from test_rule_fixtures import CASES, options_for

from gpu2tpu.rewrite.core.model import Options


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name.removesuffix(".in.py"))
def test_check_agrees_with_rewrite_on_every_fixture(case: Path) -> None:
    text = case.read_text()
    assert check_disagreements(text, options_for(text)) == []


def test_a_rank_ordinal_passed_on_cuda_only_is_not_reported_after_the_rewrite() -> None:
    """The issue's case: DDP's `output_device=rank if device.type == "cuda" else None` (what
    G2T405 writes) is no CUDA ordinal for G2T102, though an int written elsewhere reaches it."""
    text = (
        "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n\n"
        "rank = 0\nmodel = DDP(torch.nn.Linear(2, 2), device_ids=[rank], output_device=rank)\n"
    )
    assert check_disagreements(text) == []


def test_check_leaves_to_a_person_only_what_rewrite_leaves() -> None:
    """The issue's reverse case: G2T107's guarded fix answers G2T407's question (the rank's
    index is selected on CUDA only), so `check` must not count G2T407 as needing a person."""
    text = (
        "import os\nimport torch\n\n"
        'torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))\n'
        "x = torch.zeros(2).cuda()\n"
    )
    assert check_disagreements(text, Options()) == []
