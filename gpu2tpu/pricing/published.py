"""Published training runs: what tuned public jobs reached, read from `published_runs.toml`.

Each run names its source (a repository path at a commit, or a vendor's recipe), the model's
shape, the chip and slice, the batch and the measured throughput in the source's own unit.
This module loads and checks the table and derives, for every run, tokens per second per
chip and the utilisation the run reached on the catalogue's peak, by one FLOP count for all
sources (`ModelShape.flops_per_token`): sources count MFU differently (full or causal
attention, with or without the output layer), so their published MFUs are kept as data but
never mixed. `utilisation.py` fits the model of achieved utilisation on these figures.

The FLOP count (docs/forecast.md, "FLOPs of a transformer step"): per token of a training
step, 6 x the matmul parameters (every linear layer, the output layer included, the
embedding lookup excluded) plus the attention products QK^T and PV: 12 x layers x sequence x
heads x head_dim with the full score matrix, half that for causal attention.

Activation recomputation (checkpointing, MaxText's remat policies) runs part of each layer's
forward again in the backward pass: FLOPs the chip executes that tokens/s does not show. Each
row says which products its run recomputed (`recompute`, as its source states); the *hardware*
FLOPs are the model's plus those (`PublishedRun.hardware_flops_per_sample`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .toml_table import read_toml

DEFAULT_PATH = Path(__file__).with_name("published_runs.toml")
MEASURES = (
    "tokens_per_s_per_chip",
    "tokens_per_s_total",
    "tflops_per_chip",
    "mfu",
    "step_seconds",
    "samples_per_s_per_chip",
    "samples_per_s_total",
)
# Source FLOP conventions a `tflops_per_chip` or `mfu` figure is converted from: how the source
# counted attention ("full", "causal" or "none": 6 x parameters only).
CONVENTIONS = {
    "maxtext_full_attention": "full",
    "maxtext_causal_attention": "causal",
    "maxtext_params_only": "none",
    "palm_full_attention": "full",
}
# The values a row may carry (docs/forecast.md, "The published runs").
MODEL_CLASSES = ("llm_decoder", "encoder", "cnn", "unet", "small_step")
# What, outside the step's own ops, set a run's rate where its source shows it: "input" (the
# host's data loading: different models ran at one rate). Such a run measures the host, not
# the chip: its rate is a floor on the step's own, never a point to fit.
LIMITS = ("input",)
# How a run laid out its convolutions' tensors: PyTorch's default, or channels-last (NHWC,
# NDHWC: cuDNN's fast path, `memory_format` in DeepLearningExamples' configs, MXNet's
# `--conv-layout NHWC`, timm's `--channels-last`). Runs without convolutions, and TPU runs
# (XLA picks its own), keep the default.
MEMORY_FORMATS = ("channels_first", "channels_last")
PRECISIONS = ("bf16", "fp16", "tf32", "fp32")
FRAMEWORKS = (
    "jax",
    "pytorch_xla",
    "torchax",
    "torchtpu",
    "pytorch",
    "megatron",
    "tensorflow",
    "mxnet",
    "paddle",
)
_SHAPE_FIELDS = (
    "layers",
    "d_model",
    "heads",
    "kv_heads",
    "head_dim",
    "ffn",
    "vocab",
    "mlp",
    "source",
)
_RUN_FIELDS = (
    "id", "model", "chip", "chips", "slice", "global_batch", "per_device_batch", "precision",
    "parallelism", "framework", "software", "source_group", "model_class", "measured", "value",
    "source", "date", "held_out",
)  # fmt: skip
# The products of one decoder layer a run may compute again in its backward pass
# (`recompute`): the projections, the attention products (QK^T and PV, causal) and the MLP's.
# "full" is the whole layer's forward, as PyTorch's checkpoint reruns it and as the sources'
# hardware-FLOPs counts (llm-foundry's HFU) count it.
RECOMPUTE_PARTS = ("q", "k", "v", "attention", "o", "mlp_gate", "mlp_up", "mlp_down")
_DATE = re.compile(r"^\d{4}(-\d{2}(-\d{2})?)?$")


class PublishedRunsError(ValueError):
    """The published-runs table is malformed; the message names the file, the row and field."""


@dataclass(frozen=True)
class ModelShape:
    """A dense decoder's shape: enough to build it on the meta device and count its FLOPs.

    `mlp` is "gated" (SwiGLU: three d_model x ffn matrices) or "plain" (two, with
    `activation`: "gelu" or "relu"); `tied` says the output layer shares the token embedding
    (it is a matmul per token either way).
    """

    key: str
    name: str
    layers: int
    d_model: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    mlp: str
    source: str
    tied: bool = False
    activation: str = "gelu"

    def matmul_parameters(self) -> int:
        """Weights of every linear layer: attention, MLP and the output layer."""
        attention = 2 * self.d_model * self.heads * self.head_dim  # q and o
        attention += 2 * self.d_model * self.kv_heads * self.head_dim  # k and v
        mlp = (3 if self.mlp == "gated" else 2) * self.d_model * self.ffn
        return self.layers * (attention + mlp) + self.vocab * self.d_model

    def parameters(self) -> int:
        """Matmul weights plus the input embedding when it is not tied (norms left out)."""
        return self.matmul_parameters() + (0 if self.tied else self.vocab * self.d_model)

    def attention_flops_per_token(self, sequence: int, causal: bool = True) -> float:
        """QK^T and PV of a training step (forward and backward) per token."""
        full = 12.0 * self.layers * sequence * self.heads * self.head_dim
        return full / 2 if causal else full

    def flops_per_token(self, sequence: int, causal: bool = True) -> float:
        """Training FLOPs per token: 6 x matmul parameters + attention."""
        return 6.0 * self.matmul_parameters() + self.attention_flops_per_token(sequence, causal)

    def forward_flops_per_token(self, parts: tuple[str, ...], sequence: int) -> float:
        """Forward FLOPs per token of the named products of every layer (`RECOMPUTE_PARTS`;
        "full" is all of them); attention causal. The output layer is never among them."""
        d, q, kv = self.d_model, self.heads * self.head_dim, self.kv_heads * self.head_dim
        gated = self.mlp == "gated"
        per_part = {
            "q": 2.0 * d * q,
            "k": 2.0 * d * kv,
            "v": 2.0 * d * kv,
            "attention": 2.0 * sequence * q,  # 4 x s x h x hd, half of it under the causal mask
            "o": 2.0 * q * d,
            "mlp_gate": 2.0 * d * self.ffn if gated else 0.0,
            "mlp_up": 2.0 * d * self.ffn,
            "mlp_down": 2.0 * self.ffn * d,
        }
        names = RECOMPUTE_PARTS if "full" in parts else parts
        return self.layers * sum(per_part[p] for p in names)


@dataclass(frozen=True)
class ModelCard:
    """A model that is not a dense decoder (a CNN, an encoder, a U-Net): its name, where its
    shape is published and its class. Its FLOPs per sample are in each run
    (`flops_per_sample`), counted as the row's `flops_source` says."""

    key: str
    name: str
    source: str
    model_class: str


@dataclass(frozen=True)
class PublishedRun:
    """One public measurement of a training job (fields as `published_runs.toml` documents).

    `source_group` is the publisher (the unit of leave-one-source-out validation),
    `framework` one of `FRAMEWORKS` (`software` says what the source names), `model_class`
    one of `MODEL_CLASSES`, `precision` one of `PRECISIONS`, `slices` the slices joined over
    the data-centre network (DCN).
    """

    id: str
    model: ModelShape | ModelCard
    chip: str
    chips: int
    slice: str
    sequence: int
    global_batch: float
    per_device_batch: float
    precision: str
    parallelism: str
    framework: str
    measured: str
    value: float
    source: str
    date: str
    held_out: bool
    software: str = ""
    source_group: str = ""
    model_class: str = "llm_decoder"
    slices: int = 1
    config: str = ""
    mfu: float | None = None
    tflops_per_chip: float | None = None
    step_seconds: float | None = None
    source_peak_tflops: float | None = None
    flops_convention: str = ""
    explicit_flops_per_sample: float | None = None
    flops_source: str = ""
    notes: str = ""
    recompute: tuple[str, ...] = ()
    recompute_layers: float = 1.0
    recompute_source: str = ""
    limited_by: str = ""  # one of LIMITS, or "" where the step's own ops set the rate
    memory_format: str = "channels_first"  # one of MEMORY_FORMATS

    @property
    def configuration(self) -> tuple[str | int, ...]:
        """What makes two rows the same experiment at another scale: source, model, chip,
        sequence, precision, framework and memory format (the unit the errors are reported
        on)."""
        return (
            self.source_group,
            self.model.key,
            self.chip,
            self.sequence,
            self.precision,
            self.framework,
            self.memory_format,
        )

    @property
    def shape(self) -> ModelShape | None:
        """The decoder's shape, or None for a model given by its card."""
        return self.model if isinstance(self.model, ModelShape) else None

    def _source_flops_per_token(self) -> float:
        shape = self.shape
        assert shape is not None  # checked on load: a converted figure needs a shape
        counted = CONVENTIONS[self.flops_convention]
        if counted == "none":
            return 6.0 * shape.matmul_parameters()
        return shape.flops_per_token(self.sequence, causal=counted == "causal")

    @property
    def samples_per_s_per_chip(self) -> float:
        """Samples (sequences, images) per second per chip, from the source's unit."""
        if self.measured == "samples_per_s_per_chip":
            return self.value
        if self.measured == "samples_per_s_total":
            return self.value / self.chips
        return self.tokens_per_s_per_chip / self.sequence

    @property
    def tokens_per_s_per_chip(self) -> float:
        """Tokens per second per chip, as published or derived from the source's unit."""
        if self.measured == "tokens_per_s_per_chip":
            return self.value
        if self.measured == "tokens_per_s_total":
            return self.value / self.chips
        if self.measured == "step_seconds":
            return self.global_batch * self.sequence / self.value / self.chips
        if self.measured == "tflops_per_chip":
            return self.value * 1e12 / self._source_flops_per_token()
        if self.measured == "mfu":
            peak = (self.source_peak_tflops or 0.0) * 1e12
            return self.value * peak / self._source_flops_per_token()
        return self.samples_per_s_per_chip * self.sequence

    @property
    def tokens_per_chip(self) -> float:
        """Tokens one chip processes per optimizer step."""
        return self.global_batch * self.sequence / self.chips

    @property
    def flops_per_token(self) -> float:
        """Training FLOPs per token, causal attention (this project's count)."""
        return self.flops_per_sample / self.sequence

    @property
    def flops_per_sample(self) -> float:
        """Training FLOPs per sample (forward and backward), this project's count: a
        decoder's from its shape (causal attention), any other model's as the row gives it."""
        if self.explicit_flops_per_sample is not None:
            return self.explicit_flops_per_sample
        shape = self.shape
        assert shape is not None
        return shape.flops_per_token(self.sequence, causal=True) * self.sequence

    @property
    def attention_share(self) -> float:
        """The share of the step's FLOPs in attention products (causal count; 0 without a
        decoder shape)."""
        shape = self.shape
        if shape is None:
            return 0.0
        return (
            shape.attention_flops_per_token(self.sequence) * self.sequence / self.flops_per_sample
        )

    @property
    def recompute_flops_per_sample(self) -> float:
        """Forward FLOPs per sample the run computes again in its backward pass (its
        `recompute` products on `recompute_layers` of the layers; "full" on a model given by
        its card: a third of its training FLOPs, the forward)."""
        if not self.recompute:
            return 0.0
        shape = self.shape
        if shape is None:
            return self.recompute_layers * self.flops_per_sample / 3
        per_token = shape.forward_flops_per_token(self.recompute, self.sequence)
        return self.recompute_layers * per_token * self.sequence

    @property
    def hardware_flops_per_sample(self) -> float:
        """FLOPs per sample the chip executes: the model's plus the recomputed ones."""
        return self.flops_per_sample + self.recompute_flops_per_sample

    @property
    def hardware_attention_flops_per_sample(self) -> float:
        """Attention-product FLOPs per sample the chip executes (causal), recomputation included."""
        shape = self.shape
        if shape is None:
            return 0.0
        model = shape.attention_flops_per_token(self.sequence) * self.sequence
        again = ("attention" in self.recompute or "full" in self.recompute) * self.recompute_layers
        return model + again * shape.forward_flops_per_token(("attention",), self.sequence) * (
            self.sequence
        )

    @property
    def hardware_attention_share(self) -> float:
        """The share of the executed FLOPs in attention products (0 without a decoder shape)."""
        return self.hardware_attention_flops_per_sample / self.hardware_flops_per_sample

    @property
    def parameters(self) -> float | None:
        """Matmul parameters of a decoder (None for a model given by its card)."""
        shape = self.shape
        return None if shape is None else float(shape.matmul_parameters())

    def utilisation(self, peak_flops: float) -> float:
        """Model FLOPs utilisation on `peak_flops` per chip, by this project's FLOP count."""
        return self.samples_per_s_per_chip * self.flops_per_sample / peak_flops


def load_published_runs(path: str | Path | None = None) -> tuple[PublishedRun, ...]:
    """Read and check the table (the shipped one by default)."""
    data_path = Path(path) if path is not None else DEFAULT_PATH
    data = read_toml(data_path, "published-runs table", PublishedRunsError)
    models: dict[str, ModelShape | ModelCard] = {
        key: _model(key, table, data_path) for key, table in (data.get("models") or {}).items()
    }
    raw = data.get("runs")
    if not isinstance(raw, list) or not raw:
        raise PublishedRunsError(f"{data_path}: no [[runs]] entries found.")
    runs = [_run(i, table, models, data_path) for i, table in enumerate(raw)]
    ids = [r.id for r in runs]
    duplicated = sorted({i for i in ids if ids.count(i) > 1})
    if duplicated:
        raise PublishedRunsError(f"{data_path}: run ids used twice: {', '.join(duplicated)}.")
    return tuple(runs)


def _require(table: Mapping[str, Any], fields: tuple[str, ...], where: str) -> None:
    missing = [f for f in fields if table.get(f) in (None, "")]
    if missing:
        raise PublishedRunsError(f"{where}: missing {', '.join(missing)}.")


def _model(key: str, table: Mapping[str, Any], path: Path) -> ModelShape | ModelCard:
    where = f"{path}: [models.{key}]"
    model_class = str(table.get("model_class", "llm_decoder"))
    if model_class not in MODEL_CLASSES:
        raise PublishedRunsError(
            f"{where}.model_class: one of {', '.join(MODEL_CLASSES)}, not {model_class!r}."
        )
    if model_class != "llm_decoder" and "layers" not in table:
        _require(table, ("name", "source"), where)
        return ModelCard(key, str(table["name"]), str(table["source"]), model_class)
    _require(table, _SHAPE_FIELDS, where)
    if table["mlp"] not in ("gated", "plain"):
        raise PublishedRunsError(f"{where}.mlp: 'gated' or 'plain', not {table['mlp']!r}.")
    sizes = {f: table[f] for f in _SHAPE_FIELDS[:7]}
    bad = [f for f, v in sizes.items() if isinstance(v, bool) or not isinstance(v, int) or v < 1]
    if bad:
        raise PublishedRunsError(f"{where}: {', '.join(bad)} must be positive whole numbers.")
    return ModelShape(
        key=key,
        name=str(table.get("name", key)),
        mlp=str(table["mlp"]),
        source=str(table["source"]),
        tied=bool(table.get("tied", False)),
        activation=str(table.get("activation", "gelu")),
        **sizes,
    )


def _one_of(table: Mapping[str, Any], name: str, allowed: tuple[str, ...], where: str) -> str:
    value = table[name]
    if value not in allowed:
        raise PublishedRunsError(f"{where}.{name}: one of {', '.join(allowed)}, not {value!r}.")
    return str(value)


def _positive(table: Mapping[str, Any], name: str, where: str) -> float:
    value = table[name]
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise PublishedRunsError(f"{where}.{name}: a positive number, not {value!r}.")
    return float(value)


def _run(
    index: int,
    table: Mapping[str, Any],
    models: Mapping[str, ModelShape | ModelCard],
    path: Path,
) -> PublishedRun:
    where = f"{path}: run {table.get('id') or index + 1}"
    _require(table, _RUN_FIELDS, where)
    model = models.get(table["model"])
    if model is None:
        raise PublishedRunsError(f"{where}.model: no [models.{table['model']}] table.")
    measured = _one_of(table, "measured", MEASURES, where)
    for name in ("precision", "framework", "model_class"):
        _one_of(table, name, {"precision": PRECISIONS, "framework": FRAMEWORKS,
                              "model_class": MODEL_CLASSES}[name], where)  # fmt: skip
    if measured in ("tflops_per_chip", "mfu"):
        if table.get("flops_convention") not in CONVENTIONS:
            raise PublishedRunsError(
                f"{where}.flops_convention: a {measured} figure needs one of "
                f"{', '.join(CONVENTIONS)} to become tokens/s."
            )
        if not isinstance(model, ModelShape):
            raise PublishedRunsError(f"{where}: a {measured} figure needs a decoder's shape.")
    if measured == "mfu" and not table.get("source_peak_tflops"):
        raise PublishedRunsError(f"{where}.source_peak_tflops: an MFU needs the source's peak.")
    if not isinstance(model, ModelShape) and table.get("flops_per_sample") is None:
        raise PublishedRunsError(
            f"{where}.flops_per_sample: a model without a decoder shape needs its FLOPs per sample."
        )
    if "sequence" not in table and (isinstance(model, ModelShape) or measured.startswith("tok")):
        raise PublishedRunsError(f"{where}: missing sequence.")
    numbers = {
        name: _positive(table, name, where)
        for name in ("chips", "global_batch", "per_device_batch", "value")
    }
    sequence = int(_positive(table, "sequence", where)) if "sequence" in table else 1
    if not isinstance(table["held_out"], bool):
        raise PublishedRunsError(f"{where}.held_out: true or false.")
    if "memory_format" in table:
        _one_of(table, "memory_format", MEMORY_FORMATS, where)
    if "limited_by" in table:
        _one_of(table, "limited_by", LIMITS, where)
        if not table.get("notes"):
            raise PublishedRunsError(f"{where}.notes: what shows the run was limited by it.")
    if not _DATE.match(str(table["date"])):
        raise PublishedRunsError(
            f"{where}.date: YYYY, YYYY-MM or YYYY-MM-DD, not {table['date']!r}."
        )
    optional = {
        name: (None if table.get(name) is None else float(table[name]))
        for name in ("mfu", "tflops_per_chip", "step_seconds", "source_peak_tflops")
    }
    flops = table.get("flops_per_sample")
    recompute = _recompute(table, model, where)
    layers_share = table.get("recompute_layers", 1.0)
    if isinstance(layers_share, bool) or not isinstance(layers_share, int | float):
        raise PublishedRunsError(f"{where}.recompute_layers: a share of the layers, 0 to 1.")
    if not 0 < layers_share <= 1:
        raise PublishedRunsError(f"{where}.recompute_layers: a share of the layers, 0 to 1.")
    return PublishedRun(
        id=str(table["id"]),
        model=model,
        chip=str(table["chip"]),
        chips=int(numbers["chips"]),
        slice=str(table["slice"]),
        sequence=sequence,
        global_batch=numbers["global_batch"],
        per_device_batch=numbers["per_device_batch"],
        precision=str(table["precision"]),
        parallelism=str(table["parallelism"]),
        framework=str(table["framework"]),
        measured=measured,
        value=numbers["value"],
        source=str(table["source"]),
        date=str(table["date"]),
        held_out=table["held_out"],
        software=str(table["software"]),
        source_group=str(table["source_group"]),
        model_class=str(table["model_class"]),
        slices=int(table.get("slices", 1)),
        config=str(table.get("config", "")),
        flops_convention=str(table.get("flops_convention", "")),
        explicit_flops_per_sample=None if flops is None else float(flops),
        flops_source=str(table.get("flops_source", "")),
        notes=str(table.get("notes", "")),
        recompute=recompute,
        recompute_layers=float(layers_share),
        recompute_source=str(table.get("recompute_source", "")),
        limited_by=str(table.get("limited_by", "")),
        memory_format=str(table.get("memory_format", "channels_first")),
        **optional,
    )


def _recompute(
    table: Mapping[str, Any], model: ModelShape | ModelCard, where: str
) -> tuple[str, ...]:
    """The row's recomputed products: required (with where the source says so) for a decoder,
    whose hardware FLOPs depend on it; a model given by its card may say ["full"] or nothing."""
    if "recompute" not in table:
        if isinstance(model, ModelShape):
            raise PublishedRunsError(
                f"{where}: missing recompute (the products its run computes again in the "
                'backward pass: [] for none, ["full"], or some of '
                + ", ".join(RECOMPUTE_PARTS)
                + ")."
            )
        return ()
    value = table["recompute"]
    allowed = (*RECOMPUTE_PARTS, "full") if isinstance(model, ModelShape) else ("full",)
    if not isinstance(value, list) or any(p not in allowed for p in value):
        raise PublishedRunsError(
            f"{where}.recompute: a list of {', '.join(allowed)}, not {value!r}."
        )
    if value and not table.get("recompute_source"):
        raise PublishedRunsError(f"{where}.recompute_source: where the source states it.")
    return tuple(str(p) for p in value)
