"""The TPU forecast: the training step compiled by libtpu on this CPU, and what it reports.

Tests marked slow compile real training steps for TPU topologies (a few seconds each on an
idle 2-core machine); the rest check the pieces around them (optimizer mapping, topology
names, the batch search, messages) without a TPU compile.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from gpu2tpu.backends.torchax_compat import import_torchax
from gpu2tpu.forecasting import aot
from gpu2tpu.forecasting import forecast as fc
from gpu2tpu.forecasting.optimizers import UnsupportedOptimizer, plan_optimizer, to_optax

# These tests call the compile path in this process too: torchax, once imported, makes
# "jax" torch's accelerator for the rest of the process, so they run last (conftest.py).
# In `make test-all` the torchax tests run on two xdist workers: this module is one unit, sent
# last (conftest.py sorts it last), so that nothing runs after it in its worker.
pytestmark = [pytest.mark.torchax, pytest.mark.xdist_group("forecast")]


def _extra_reason() -> str | None:
    try:
        aot.forecast_versions(import_torchax=False)  # collection must not start JAX (forks later)
    except aot.ForecastUnavailable as exc:
        return str(exc)
    return None


EXTRA_MISSING = _extra_reason()
needs_extra = pytest.mark.skipif(EXTRA_MISSING is not None, reason=EXTRA_MISSING or "")


# -- tiny models ---------------------------------------------------------------------------


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 16)
    )


def cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Two transformer layers with causal attention, as in a GPT."""

    def __init__(
        self, vocab: int = 512, d: int = 128, heads: int = 4, layers: int = 2, seq: int = 64
    ):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf"), device=idx.device), 1)
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln(x))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def torch_step_flops(model: nn.Module, batch: tuple, loss_fn) -> int:
    """FLOPs of forward + backward counted by PyTorch itself, on real CPU tensors."""
    inputs, targets = batch
    with FlopCounterMode(display=False) as counter:
        loss_fn(model(inputs), targets).backward()
    model.zero_grad()
    return counter.get_total_flops()


def run(model: nn.Module, batch: tuple, **kwargs) -> fc.Forecast:
    options = {"targets": ["v5e"], "batch_search": False, "cache": False, "progress": False}
    options.update(kwargs)
    return fc.forecast(model, batch, **options)


@pytest.fixture(scope="module")
def mlp_forecast() -> tuple[nn.Module, tuple, fc.Forecast]:
    """One compiled forecast shared by the rendering tests (one compile, not one per test)."""
    if EXTRA_MISSING:
        pytest.skip(EXTRA_MISSING)
    model = mlp()
    batch = (torch.randn(256, 512), torch.randint(0, 16, (256,)))
    return model, batch, run(model, batch, loss_fn=nn.functional.cross_entropy)


# -- the optimizer mapping -----------------------------------------------------------------


def test_optimizer_plan_reads_hyperparameters_and_groups():
    model = mlp()
    model[4].weight.requires_grad_(False)  # frozen: no gradient, no state
    named = list(model.named_parameters())
    opt = torch.optim.SGD(
        [
            {"params": [model[0].weight, model[0].bias]},
            {"params": [model[2].weight, model[2].bias, model[4].weight, model[4].bias], "lr": 0.5},
        ],
        lr=0.1,
        momentum=0.9,
        nesterov=True,
        weight_decay=1e-4,
    )
    plan = plan_optimizer(opt, named)
    assert [r.options["lr"] for r in plan.rules] == [0.1, 0.5]
    assert all(r.options["momentum"] == 0.9 and r.options["nesterov"] for r in plan.rules)
    assert plan.labels == {"0.weight": 0, "0.bias": 0, "2.weight": 1, "2.bias": 1, "4.bias": 1}
    assert "4.weight" not in plan.trainable

    adamw = plan_optimizer(
        torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.8, 0.95), eps=1e-6), named
    )
    assert adamw.rules[0].kind == "AdamW"
    assert adamw.rules[0].options["betas"] == (0.8, 0.95)
    assert adamw.rules[0].options["weight_decay"] == 0.01  # torch's AdamW default
    assert "betas=(0.8, 0.95)" in adamw.describe()

    by_name = plan_optimizer("ADAM", named)
    assert by_name.rules[0].kind == "Adam" and by_name.rules[0].options["lr"] == 1e-3
    assert plan_optimizer(torch.optim.RMSprop, named).rules[0].options["alpha"] == 0.99


def test_unsupported_optimizers_are_refused_in_one_sentence():
    model = mlp()
    named = list(model.named_parameters())
    with pytest.raises(
        UnsupportedOptimizer, match=r"'Adagrad'.*supported optimizers are SGD, Adam, AdamW, RMSprop"
    ):
        plan_optimizer(torch.optim.Adagrad(model.parameters()), named)
    with pytest.raises(UnsupportedOptimizer, match="dampening"):
        plan_optimizer(
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=0.1), named
        )
    with pytest.raises(UnsupportedOptimizer, match="not parameters of the model"):
        plan_optimizer(torch.optim.Adam(nn.Linear(2, 2).parameters()), named)
    with pytest.raises(UnsupportedOptimizer, match="'lion'"):
        plan_optimizer("lion", named)


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    "sgd-momentum-l2": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01),
    "sgd-nesterov-maximize": lambda p: torch.optim.SGD(
        p, lr=0.1, momentum=0.9, nesterov=True, maximize=True
    ),
    "adam-l2": lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.8, 0.99), weight_decay=0.01),
    "adam-decoupled": lambda p: torch.optim.Adam(
        p, lr=0.01, weight_decay=0.1, decoupled_weight_decay=True
    ),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
    "rmsprop-momentum": lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.9),
    "rmsprop-centered-l2": lambda p: torch.optim.RMSprop(
        p, lr=0.01, centered=True, weight_decay=0.01
    ),
}


@needs_extra
@pytest.mark.parametrize("make", OPTIMIZERS.values(), ids=OPTIMIZERS.keys())
def test_optax_update_matches_the_torch_optimizer(make):
    import jax.numpy as jnp
    import numpy as np
    import optax

    torch.manual_seed(1)
    param = nn.Parameter(torch.randn(5, 3))
    opt = make([param])
    tx = to_optax(plan_optimizer(opt, [("w", param)]))
    params = {"w": jnp.asarray(param.detach().numpy())}
    state = tx.init(params)
    for _ in range(4):
        grad = torch.randn(5, 3)
        param.grad = grad.clone()
        opt.step()
        updates, state = tx.update({"w": jnp.asarray(grad.numpy())}, state, params)
        params = optax.apply_updates(params, updates)
    torch.testing.assert_close(
        torch.tensor(np.asarray(params["w"])), param.detach(), rtol=1e-4, atol=1e-5
    )


@needs_extra
def test_compiled_step_is_the_torch_training_step():
    """The JAX step (forward, loss, gradients, optimizer update) equals torch's own step.

    In-place buffer updates flow out of the step (BatchNorm's num_batches_tracked); torchax
    0.0.13 computes but drops BatchNorm's new running mean and variance, which changes no
    figure the forecast reports (a few elementwise ops per channel).
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    model = cnn()
    batch = (torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    plan = plan_optimizer(opt, list(model.named_parameters()))
    tx = to_optax(plan)
    step = aot.TrainingStep(model, nn.functional.cross_entropy, plan, aot.split_batch(batch))
    names = step.state_names
    tensors = dict(model.named_parameters()) | dict(model.named_buffers())

    def arrays(kind: str) -> dict:
        return {n: jnp.asarray(tensors[n].detach().numpy()) for n in names[kind]}

    trainable, frozen, buffers = arrays("trainable"), arrays("frozen"), arrays("buffers")
    opt_state = tx.init(trainable)
    loss, trainable, buffers, opt_state = jax.jit(step.function(tx))(
        trainable, frozen, buffers, opt_state, [jnp.asarray(t.numpy()) for t in batch]
    )

    expected = nn.functional.cross_entropy(model(batch[0]), batch[1])
    expected.backward()
    opt.step()
    assert float(loss) == pytest.approx(expected.item(), rel=1e-5)
    for name, value in trainable.items():
        torch.testing.assert_close(
            torch.tensor(np.asarray(value)), tensors[name].detach(), rtol=1e-4, atol=1e-5
        )
    assert int(buffers["1.num_batches_tracked"]) == 1


def test_a_random_op_in_the_traced_step_leaves_torchaxs_key_alone(monkeypatch):
    """Dropout draws torchax's key inside the trace; the env must keep a concrete key after
    it (in CI a later torchax test in the same process raised UnexpectedTracerError). No env
    yet, as in a fresh process: torchax makes it, and its first key, on first use."""
    import jax
    import jax.numpy as jnp

    torchax = import_torchax()
    monkeypatch.setattr(torchax, "_env", None)

    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 2))
    batch = (torch.randn(4, 8), torch.randint(0, 2, (4,)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    plan = plan_optimizer(opt, list(model.named_parameters()))
    tx = to_optax(plan)
    step = aot.TrainingStep(model, nn.functional.cross_entropy, plan, aot.split_batch(batch))
    trainable = {n: jnp.asarray(p.detach().numpy()) for n, p in model.named_parameters()}
    jax.jit(step.function(tx))(
        trainable, {}, {}, tx.init(trainable), [jnp.asarray(t.numpy()) for t in batch]
    )
    env = torchax.default_env()
    assert not isinstance(env.prng_key, jax.core.Tracer)
    before = env.prng_key
    jax.jit(step.function(tx))(
        trainable, {}, {}, tx.init(trainable), [jnp.asarray(t.numpy()) for t in batch]
    )
    assert env.prng_key is before
    with env:
        assert torch.randn(2, device="jax").shape == (2,)


# -- pieces that need no compile -------------------------------------------------------------


def test_topologies_for_chip_counts_and_names():
    assert aot.topology_for("v5e").name == "v5e:1x1"
    assert aot.topology_for("v5e", 4).name == "v5e:2x2"
    assert aot.topology_for("v6e", 8).name == "v6e:2x4"
    assert aot.topology_for("v5p", 8).name == "v5p:2x2x2"
    assert aot.topology_for("tpu7x").name == "tpu7x:1x1x1"
    assert aot.topology_for("TPU v5 lite").target == "v5e"
    assert aot.topology_for("v7x", 2).name == "tpu7x:2x1x1"
    assert aot.topology_for("v5p", 4).name == "v5p:2x2x1"
    assert aot.topology_for("v5p", 16).name == "v5p:2x2x4"
    explicit = aot.topology_for("v5e:2x4")
    assert explicit.chips == 8 and explicit.host_bounds == (2, 4, 1)
    assert aot.topology_for("v5p", 16).host_bounds == (2, 2, 1)  # four hosts of four chips
    assert aot.topology_for("v4").chip_config == "megacore"
    with pytest.raises(ValueError, match="not a power of two"):
        aot.topology_for("v5e", 3)
    with pytest.raises(ValueError, match="unknown TPU target 'h100'"):
        aot.topology_for("h100")
    with pytest.raises(ValueError, match="needs 3 sizes"):
        aot.topology_for("v5p:2x2")


def test_out_of_memory_message_gives_required_and_available_bytes():
    message = (
        "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on HBM, the total "
        "memory required for HLO temporaries (60.02G) exceeds available HBM (15.75G). HLO module: jit_step."
    )
    required, available = aot.parse_hbm_oom(message)
    assert required == pytest.approx(60.02 * 2**30)
    assert available == pytest.approx(15.75 * 2**30)
    assert aot.parse_hbm_oom("Used 20.5G of 15.75G hbm. Exceeded hbm capacity by 4.75G.") == (
        pytest.approx(20.5 * 2**30),
        pytest.approx(15.75 * 2**30),
    )
    assert aot.parse_hbm_oom("INTERNAL: something else") is None


def test_missing_extra_is_one_sentence_and_the_rest_of_gpu2tpu_works():
    code = textwrap.dedent(
        """
        import sys
        for name in ("jax", "jaxlib", "torchax", "optax", "libtpu"):
            sys.modules[name] = None  # as if not installed
        import torch
        import gpu2tpu
        from gpu2tpu.rewrite.core.model import Options
        from gpu2tpu.rewrite.core.source import rewrite_source
        from gpu2tpu.forecasting.forecast import ForecastUnavailable, forecast
        rewritten = rewrite_source("import torch\\nx = torch.zeros(1).cuda()\\n", Options())
        assert ".to(device)" in rewritten.new_text
        try:
            forecast(torch.nn.Linear(2, 2), (torch.randn(2, 2), torch.randn(2, 2)))
        except ForecastUnavailable as exc:
            print("MESSAGE:", exc)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    message = done.stdout.split("MESSAGE:", 1)[1].strip()
    assert "jax, jaxlib, torchax, optax, libtpu are not installed" in message
    assert "pip install 'gpu2tpu[forecast]'" in message
    assert message.count(". ") == 0  # one sentence


@needs_extra
def test_a_torch_newer_than_torchax_supports_is_named(monkeypatch):
    monkeypatch.setitem(aot.TORCHAX_MAX_TORCH, aot.forecast_versions()["torchax"], (2, 1))
    with pytest.raises(
        aot.ForecastUnavailable,
        match=r"supports torch up to 2\.1, but torch .*pip install 'torch<=2\.1'",
    ):
        fc.forecast(mlp(), (torch.randn(8, 512), torch.randint(0, 16, (8,))))


def test_forecast_cell_reads_the_cell_namespace(monkeypatch):
    seen = {}

    def fake(model, batch, **kwargs):
        seen.update(model=model, batch=batch, **kwargs)
        return "result"

    monkeypatch.setattr(fc, "forecast", fake)
    model, batch, opt = mlp(), ("x", "y"), "sgd"
    namespace = {"model": model, "batch": batch, "optimizer": opt, "loss_fn": None}
    assert fc.forecast_cell(namespace, "v5e,v6e", chips=2) == "result"
    assert seen == {
        "model": model,
        "batch": batch,
        "optimizer": "sgd",
        "targets": "v5e,v6e",
        "chips": 2,
    }
    # The magic's form: a runner that runs the cell, then the namespace it ran in.
    ran = []
    seen.clear()
    fc.forecast_cell(
        lambda: ran.append(1), targets=["v5e"], namespace=namespace, backend="cpu", source="..."
    )
    assert (
        ran == [1] and seen["targets"] == ["v5e"] and "backend" not in seen and "source" not in seen
    )
    with pytest.raises(aot.ForecastError, match="define `model`"):
        fc.forecast_cell({"batch": batch})
    with pytest.raises(aot.ForecastError, match="`batch` \\(or `example_batch`\\)"):
        fc.forecast_cell({"model": model})


@needs_extra
def test_ops_without_a_lowering_are_all_named():
    class Odd(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 16)
            self.pool = nn.FractionalMaxPool2d(2, output_size=(2, 2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.fc(x)
            q, _ = torch.geqrf(h.reshape(-1, 4, 4))
            p = self.pool(h.reshape(-1, 1, 4, 4)).flatten(1)
            return h + q.flatten(1).sum(-1, keepdim=True) + p.sum(-1, keepdim=True)

    result = run(
        Odd(),
        (torch.randn(8, 16), torch.randn(8, 16)),
        loss_fn=nn.functional.mse_loss,
        targets=["v5e", "v6e"],
    )
    for target in result.targets:
        assert target.status == "unsupported"
        assert target.unsupported_ops == ["aten::geqrf", "aten::fractional_max_pool2d"]
        assert target.flops is None and target.fits is None
    assert "no TPU lowering for aten::geqrf, aten::fractional_max_pool2d" in repr(result)


# -- compiled forecasts ---------------------------------------------------------------------


@pytest.mark.slow
def test_mlp_flops_match_pytorchs_count_and_the_result_renders(mlp_forecast, capsys):
    model, batch, result = mlp_forecast
    target = result.target("v5e")
    assert target.status == "compiled" and target.fits
    reference = torch_step_flops(model, batch, nn.functional.cross_entropy)
    assert target.flops == pytest.approx(reference, rel=0.15)
    assert 0 < target.memory_per_chip < target.capacity_per_chip
    assert target.step_seconds == pytest.approx(max(target.compute_seconds, target.memory_seconds))
    # A 1.6M-parameter fp32 step: no published run of its kind calibrates an expected
    # time, so none is made up; the row is priced at the bound and its notes say why.
    assert target.expected_seconds is None and target.expected_low is None
    assert any("shown as a bound" in note for note in target.expected_notes)
    assert target.cost_per_step == pytest.approx(1.20 * shown_seconds(target) / 3600)  # $/h
    assert target.bound_cost_per_step == pytest.approx(1.20 * target.step_seconds / 3600)

    data = json.loads(result.to_json())
    assert data["targets"][0]["flops"] == target.flops
    rows = {r["device_key"]: r for r in data["comparison"]["rows"]}
    assert rows["v5e"]["source"] == "compiled" and rows["h100"]["source"] == "estimated"
    h100 = result.comparison.catalogue.get("h100")
    roofline = max(target.flops / h100.peak_bf16_flops, target.bytes_accessed / h100.hbm_bandwidth)
    # the H100's bound is its roofline on v5e's compiled counts, or the step's floor (the ops
    # eager PyTorch dispatches, the batch over PCIe) where that is longer, saying so
    h100_row = rows["h100"]
    if h100_row["bound_seconds"] != pytest.approx(roofline):
        assert h100_row["bound_seconds"] > roofline and h100_row["note"].startswith("at least")
    assert h100_row["time_kind"] in ("expected", "bound")
    assert h100_row["step_seconds"] >= h100_row["bound_seconds"]
    # the source of the expected times is named where some row shows one, and only there
    shows_expected = any(r["time_kind"] == "expected" for r in rows.values())
    assert data["comparison"]["expected_source"].startswith("Expected = FLOPs") == shows_expected
    text = repr(result)
    assert "v5e" in text and "compiled" in text and "NVIDIA H100" in text

    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(result)
    assert "Forecast: Sequential" in console.export_text()
    import ipywidgets

    assert isinstance(result.widget(), ipywidgets.Widget)
    assert "TPU v5e" in result.to_html() and "gpu2tpu forecast: Sequential" in result.to_html()


@pytest.mark.slow
def test_memory_grows_with_the_batch():
    model = mlp()
    small = run(model, (torch.randn(64, 512), torch.randint(0, 16, (64,)))).target("v5e")
    large = run(model, (torch.randn(1024, 512), torch.randint(0, 16, (1024,)))).target("v5e")
    assert large.memory_per_chip > small.memory_per_chip
    assert large.memory_breakdown["temp"] > small.memory_breakdown["temp"]
    assert (
        large.memory_breakdown["argument"] > small.memory_breakdown["argument"]
    )  # the batch itself
    assert large.flops > 10 * small.flops


@pytest.mark.slow
def test_cnn_with_batchnorm_flops_match_pytorchs_count():
    model = cnn()
    batch = (torch.randn(16, 3, 16, 16), torch.randint(0, 10, (16,)))
    target = run(
        model, batch, optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ).target("v5e")
    assert target.status == "compiled"
    assert target.flops == pytest.approx(
        torch_step_flops(model, batch, nn.functional.cross_entropy), rel=0.15
    )


@pytest.mark.slow
def test_transformer_flops_match_six_n_tokens_and_tokens_are_counted(capsys):
    model = TinyGPT()
    batch = (torch.randint(0, 512, (8, 64)), torch.randint(0, 512, (8, 64)))
    result = run(model, batch, loss_fn=lm_loss, progress=True)
    target = result.target("v5e")
    params = sum(p.numel() for p in model.parameters())
    assert target.flops == pytest.approx(6 * params * 8 * 64, rel=0.15)
    assert result.tokens_per_step == 8 * 64
    assert target.cost_per_1m_tokens == pytest.approx(target.cost_per_step / (8 * 64) * 1e6)
    out = capsys.readouterr()
    assert "forecast v5e: fits at batch 8" in out.out  # one line per target, on stdout
    assert "forecast v5e" not in out.err


@pytest.mark.slow
def test_a_meta_model_too_large_for_v5e_does_not_fit_with_numbers():
    with torch.device("meta"):
        model = nn.Sequential(*[nn.Linear(8192, 8192) for _ in range(24)])  # 1.6B parameters
    batch = (torch.empty(8, 8192, device="meta"), torch.empty(8, 8192, device="meta"))
    target = run(model, batch, loss_fn=nn.functional.mse_loss).target("v5e")
    assert target.status == "does not fit" and target.fits is False
    # fp32 weights + two AdamW moments alone are 19.3 GB; libtpu leaves 15.75 GiB usable.
    assert target.memory_per_chip > target.available_per_chip == pytest.approx(15.75 * 2**30)
    assert target.memory_per_chip >= 3 * 4 * 1_610_000_000
    assert "CompileTimeHbmOom" in target.message
    # The model is the stack itself: its blocks are checkpointed in the re-check, which cannot
    # help here (the state alone is over the HBM).
    assert target.checkpointed is not None and target.checkpointed.fits is False
    assert all(p.device.type == "meta" for p in model.parameters())  # nothing was allocated


@pytest.mark.slow
def test_bf16_halves_the_weights_and_optimizer_state():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 2048))
    batch = (torch.empty(8, 2048, device="meta"), torch.empty(8, 2048, device="meta"))
    fp32 = run(model, batch, loss_fn=nn.functional.mse_loss).target("v5e")
    cast = run(model, batch, loss_fn=nn.functional.mse_loss, dtype="bf16")
    bf16_batch = tuple(t.to(torch.bfloat16) for t in batch)
    native = run(model.to(torch.bfloat16), bf16_batch, loss_fn=nn.functional.mse_loss)
    assert cast.dtype == native.dtype == "bfloat16"
    half = fp32.memory_breakdown["argument"] / 2
    assert cast.target("v5e").memory_breakdown["argument"] == pytest.approx(half, rel=0.05)
    assert native.target("v5e").memory_breakdown["argument"] == pytest.approx(half, rel=0.05)


@pytest.mark.slow
def test_data_parallel_over_four_chips_reports_the_whole_slice():
    model = mlp()
    batch = (torch.randn(256, 512), torch.randint(0, 16, (256,)))
    one = run(model, batch).target("v5e")
    four = run(model, batch, chips=4).target("v5e")
    assert four.topology == "v5e:2x2" and four.chips == 4
    assert four.flops == pytest.approx(one.flops, rel=0.15)  # the same step, split four ways
    batch_bytes = 256 * 512 * 4 + 256 * 4  # float inputs and int32 targets
    # Each chip holds all weights but a quarter of the batch.
    per_chip_drop = one.memory_breakdown["argument"] - four.memory_breakdown["argument"]
    assert per_chip_drop == pytest.approx(batch_bytes * 3 / 4, rel=0.05)
    assert four.compute_seconds == pytest.approx(one.compute_seconds / 4, rel=0.15)
    assert four.cost_per_step == pytest.approx(4 * 1.20 * shown_seconds(four) / 3600)


def shown_seconds(target) -> float:
    """The time a row prices: the expected step, or where none is made (a floor or the
    compiler's estimate is longer) the larger of the roofline bound and that floor."""
    if target.expected_seconds is not None:
        return target.expected_seconds
    return max(target.step_seconds, target.floor_seconds or 0.0)


@pytest.mark.slow
def test_the_same_forecast_again_is_read_from_the_cache(tmp_path):
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    batch = (torch.randn(32, 64), torch.randint(0, 4, (32,)))
    first = run(model, batch, cache=tmp_path).target("v5e")
    again = run(model, batch, cache=tmp_path)
    assert not first.cached and again.target("v5e").cached
    assert again.target("v5e").to_dict() | {"cached": False, "phases": first.phases} == (
        first.to_dict()
    )
    assert "imports" not in again.phases  # answered by the quick key: no child, no JAX
    kinds = sorted(
        p.name.split("-")[0] if "-" in p.name else "compile" for p in tmp_path.glob("*.json")
    )
    assert kinds == ["compile", "hbm", "target"]  # one compile's figures, usable HBM, target
    # The quick key missed (cache entries for it removed): the exact key still answers.
    for entry in tmp_path.glob("target-*.json"):
        entry.unlink()
    third = run(model, batch, cache=tmp_path)
    assert third.target("v5e").cached and "imports" in third.phases


@pytest.mark.slow
def test_a_ctrl_c_after_the_last_compile_keeps_every_target_in_one_line(
    tmp_path, monkeypatch, capsys
):
    """A terminal's Ctrl-C can land after the compiles ended, while the result is put
    together: the result is still returned, interrupted, with what was compiled, and one
    line says so (no traceback)."""
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    batch = (torch.randn(32, 64), torch.randint(0, 4, (32,)))
    first = run(model, batch, cache=tmp_path).target("v5e")
    assemble, calls = fc._assemble, []

    def interrupted_once(*args, **kwargs):
        calls.append(args[-1])  # `interrupted`, as _run passes it
        if len(calls) == 1:
            raise KeyboardInterrupt
        return assemble(*args, **kwargs)

    monkeypatch.setattr(fc, "_assemble", interrupted_once)
    capsys.readouterr()
    again = run(model, batch, cache=tmp_path, progress=True)
    assert calls == [False, True] and again.interrupted
    assert again.target("v5e").status == first.status == "compiled"
    out = capsys.readouterr().out
    assert out.count("gpu2tpu: forecast interrupted") == 1
    assert "gpu2tpu: forecast interrupted; kept v5e." in out


@pytest.mark.slow
@pytest.mark.timeout(3600)  # a dozen real compiles: minutes on a busy 2-core machine
def test_batch_search_finds_what_bisection_finds(tmp_path):
    """The line and its check against a plain bisection of real compiles on the same model
    (the figure cache makes the batches both try compile once)."""
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 2048))
    # 8192 positions of 2048 features per sample: activations, not weights, fill the chip,
    # and the largest batch is small enough (under 64) to be found to one sample.
    batch = (torch.empty(8, 8192, 2048, device="meta"), torch.empty(8, 8192, 2048, device="meta"))
    target = run(
        model, batch, loss_fn=nn.functional.mse_loss, batch_search=True, time_budget_s=3600,
        cache=tmp_path,
    ).target("v5e")  # fmt: skip
    assert target.status == "compiled" and target.max_batch is not None and target.max_batch > 8
    statuses = {p["batch"]: p["status"] for p in target.search}
    print("search:", target.search_method, target.search_compiles, statuses)
    assert statuses[target.max_batch] == "compiled" and statuses[target.first_oom_batch] == "oom"
    assert target.search_compiles == len(statuses) - 1  # every point but the first was compiled
    if target.search_method == "line":
        assert target.search_compiles <= 3

    plan = plan_optimizer("adamw", list(model.named_parameters()))
    step = aot.TrainingStep(model, nn.functional.mse_loss, plan, aot.split_batch(batch))
    tx = to_optax(plan)
    topology = aot.topology_for("v5e")
    devices = aot.topology_devices(topology)
    cache = aot.FigureCache(tmp_path, aot.forecast_versions())

    def fits(size: int) -> bool:
        lowered = step.lower(tx, devices, size)
        return aot.compile_lowered(lowered, topology, size, cache).status == "compiled"

    lo, hi = 8, 16
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    assert (target.max_batch, target.first_oom_batch) == (lo, hi)
    assert target.max_batch_exact


@pytest.mark.slow
def test_fsdp_shards_weights_and_optimizer_state_over_the_chips():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024))
    batch = (torch.empty(64, 1024, device="meta"), torch.empty(64, 1024, device="meta"))
    data = run(model, batch, loss_fn=nn.functional.mse_loss, chips=4).target("v5e")
    fsdp = run(model, batch, loss_fn=nn.functional.mse_loss, chips=4, sharding="fsdp")
    sharded = fsdp.target("v5e")
    assert fsdp.sharding == sharded.sharding == "fsdp" and data.sharding == "data"
    state = sum(p.numel() for p in model.parameters()) * 4 * 3  # fp32 weights, two moments
    batch_bytes = 64 * 1024 * 4 * 2 / 4  # inputs and targets, a quarter per chip
    assert data.memory_breakdown["argument"] == pytest.approx(state + batch_bytes, rel=0.01)
    assert sharded.memory_breakdown["argument"] == pytest.approx(state / 4 + batch_bytes, rel=0.01)
    assert sharded.memory_per_chip < data.memory_per_chip / 3
    # The update runs on a quarter of each tensor per chip instead of all of it.
    assert sharded.flops < data.flops
