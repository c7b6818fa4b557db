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
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_PATH = Path(__file__).with_name("published_runs.toml")
MEASURES = ("tokens_per_s_per_chip", "tokens_per_s_total", "tflops_per_chip")
# FLOP conventions a `tflops_per_chip` figure can be converted from.
CONVENTIONS = {"maxtext_full_attention": "full"}
_MODEL_FIELDS = (
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
    "id", "model", "chip", "chips", "slice", "sequence", "global_batch", "per_device_batch",
    "precision", "parallelism", "framework", "measured", "value", "source", "date", "held_out",
)  # fmt: skip


class PublishedRunsError(ValueError):
    """The published-runs table is malformed; the message names the file, the row and field."""


@dataclass(frozen=True)
class ModelShape:
    """A dense decoder's shape: enough to build it on the meta device and count its FLOPs.

    `mlp` is "gated" (SwiGLU: three d_model x ffn matrices) or "plain" (two, GELU); `tied`
    says the output layer shares the token embedding (it is a matmul per token either way).
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


@dataclass(frozen=True)
class PublishedRun:
    """One public measurement of a training job (fields as `published_runs.toml` documents)."""

    id: str
    model: ModelShape
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
    config: str = ""
    mfu: float | None = None
    tflops_per_chip: float | None = None
    step_seconds: float | None = None
    flops_convention: str = ""
    notes: str = ""

    @property
    def tokens_per_s_per_chip(self) -> float:
        """Tokens per second per chip, as published or derived from the source's unit."""
        if self.measured == "tokens_per_s_per_chip":
            return self.value
        if self.measured == "tokens_per_s_total":
            return self.value / self.chips
        causal = CONVENTIONS[self.flops_convention] == "causal"
        return self.value * 1e12 / self.model.flops_per_token(self.sequence, causal)

    @property
    def tokens_per_chip(self) -> float:
        """Tokens one chip processes per optimizer step."""
        return self.global_batch * self.sequence / self.chips

    @property
    def flops_per_token(self) -> float:
        """Training FLOPs per token, causal attention (this project's count)."""
        return self.model.flops_per_token(self.sequence, causal=True)

    @property
    def attention_share(self) -> float:
        """The share of the step's FLOPs in attention products (causal count)."""
        return self.model.attention_flops_per_token(self.sequence) / self.flops_per_token

    def utilisation(self, peak_flops: float) -> float:
        """Model FLOPs utilisation on `peak_flops` per chip, by this project's FLOP count."""
        return self.tokens_per_s_per_chip * self.flops_per_token / peak_flops


def load_published_runs(path: str | Path | None = None) -> tuple[PublishedRun, ...]:
    """Read and check the table (the shipped one by default)."""
    data_path = Path(path) if path is not None else DEFAULT_PATH
    try:
        with data_path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise PublishedRunsError(f"{data_path}: the published-runs table does not exist.") from None
    except tomllib.TOMLDecodeError as exc:
        raise PublishedRunsError(f"{data_path}: not valid TOML ({exc}).") from None
    models = {
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


def _model(key: str, table: Mapping[str, Any], path: Path) -> ModelShape:
    where = f"{path}: [models.{key}]"
    _require(table, _MODEL_FIELDS, where)
    if table["mlp"] not in ("gated", "plain"):
        raise PublishedRunsError(f"{where}.mlp: 'gated' or 'plain', not {table['mlp']!r}.")
    sizes = {f: table[f] for f in _MODEL_FIELDS[:7]}
    bad = [f for f, v in sizes.items() if isinstance(v, bool) or not isinstance(v, int) or v < 1]
    if bad:
        raise PublishedRunsError(f"{where}: {', '.join(bad)} must be positive whole numbers.")
    return ModelShape(
        key=key,
        name=str(table.get("name", key)),
        mlp=str(table["mlp"]),
        source=str(table["source"]),
        tied=bool(table.get("tied", False)),
        **sizes,
    )


def _run(
    index: int, table: Mapping[str, Any], models: Mapping[str, ModelShape], path: Path
) -> PublishedRun:
    where = f"{path}: run {table.get('id') or index + 1}"
    _require(table, _RUN_FIELDS, where)
    model = models.get(table["model"])
    if model is None:
        raise PublishedRunsError(f"{where}.model: no [models.{table['model']}] table.")
    if table["measured"] not in MEASURES:
        raise PublishedRunsError(
            f"{where}.measured: one of {', '.join(MEASURES)}, not {table['measured']!r}."
        )
    if table["measured"] == "tflops_per_chip" and table.get("flops_convention") not in CONVENTIONS:
        raise PublishedRunsError(
            f"{where}.flops_convention: a TFLOP/s figure needs one of {', '.join(CONVENTIONS)} "
            "to become tokens/s."
        )
    for name in ("chips", "sequence", "global_batch", "per_device_batch", "value"):
        value = table[name]
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise PublishedRunsError(f"{where}.{name}: a positive number, not {value!r}.")
    if not isinstance(table["held_out"], bool):
        raise PublishedRunsError(f"{where}.held_out: true or false.")
    optional = {
        name: (None if table.get(name) is None else float(table[name]))
        for name in ("mfu", "tflops_per_chip", "step_seconds")
    }
    return PublishedRun(
        id=str(table["id"]),
        model=model,
        chip=str(table["chip"]),
        chips=int(table["chips"]),
        slice=str(table["slice"]),
        sequence=int(table["sequence"]),
        global_batch=float(table["global_batch"]),
        per_device_batch=float(table["per_device_batch"]),
        precision=str(table["precision"]),
        parallelism=str(table["parallelism"]),
        framework=str(table["framework"]),
        measured=str(table["measured"]),
        value=float(table["value"]),
        source=str(table["source"]),
        date=str(table["date"]),
        held_out=table["held_out"],
        config=str(table.get("config", "")),
        flops_convention=str(table.get("flops_convention", "")),
        notes=str(table.get("notes", "")),
        **optional,
    )
