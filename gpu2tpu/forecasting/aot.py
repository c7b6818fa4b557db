"""Compile a PyTorch training step for a TPU topology on a machine without a TPU.

The adapter between gpu2tpu and JAX/torchax/libtpu (docs/forecast.md, "How it works"): the
step is `torch.func.functional_call` inside the torchax environment, differentiated by
`jax.value_and_grad` and updated by optax; it is lowered with `ShapeDtypeStruct`s placed on
devices of a libtpu topology description and compiled by libtpu's compiler, on the CPU.
No weight is ever allocated, so models built on the meta device work.

Everything that imports jax, torchax, optax or libtpu does so inside a function: importing
this module costs nothing, and a missing extra surfaces as one `ForecastUnavailable` sentence.

Two findings shape this module:
- libtpu prints start-up errors when it is loaded on a host without a TPU, and takes a
  process-wide lock file; the environment variables in `_DEVICELESS_TPU_ENV` silence the
  errors and skip the lock, and JAX itself is kept on the CPU platform.
- JAX's persistent compilation cache cannot reload a cross-compiled executable ("PjRtCompiler
  must be constructed with a Client to call DeserializeLoadedExecutable", jax 0.10.2 with
  libtpu 0.0.52), so it is switched off around these compiles and the *figures* are cached
  instead: a JSON file per (lowered program, topology, versions) in the user cache directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ..backends import torchax_compat

if TYPE_CHECKING:
    import torch

    from .lowering import TraceRecord
    from .optimizers import OptimizerPlan

EXTRA_INSTALL = "pip install 'gpu2tpu[forecast]'"
# Newest torch (major, minor) each torchax release is tested with (docs/forecast.md, Install).
TORCHAX_MAX_TORCH: dict[str, tuple[int, int]] = torchax_compat.NEWEST_TORCH
_EXTRA_MODULES = (("jax", "jax"), ("jaxlib", "jaxlib"), ("torchax", "torchax"), ("optax", "optax"))
# Set while libtpu starts on a host without a TPU: no metadata-server query, no host
# discovery errors, and no lock on /tmp/libtpu_lockfile, so two forecasts (two notebooks,
# a script and a test run) can run at once; they drive no chip.
_DEVICELESS_TPU_ENV = {
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_ACCELERATOR_TYPE": "v5litepod-1",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
}
CACHE_ENV = "GPU2TPU_CACHE_DIR"
# 2: FLOPs and bytes include while-loop bodies as often as they run, and the program's
# collectives and matmul FLOPs are read from the optimized HLO (hlo.py). 3: the program's own
# byte counts, and programs read at the end of the HLO passes (`partitioned`). 4: XLA's generic
# count of the program's bytes.
_CACHE_FORMAT = 4
# Cache entries of programs read at the end of libtpu's HLO passes (no cost analysis).
_PARTITIONED = "partitioned-"


class ForecastUnavailable(RuntimeError):
    """The forecast cannot run in this environment; the message says what to install."""


class ForecastError(RuntimeError):
    """The training step could not be traced; the message names the model and the reason."""


# -- the extra ----------------------------------------------------------------------------------


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", text.split("+")[0])[:3])


def forecast_versions(import_torchax: bool = True) -> dict[str, str]:
    """Check the `forecast` extra and return its versions; raise ForecastUnavailable if unusable.

    Checks what is missing before importing anything, then the torch/torchax pairing (each
    torchax release up to the newest torch it is tested with), then imports torchax through
    backends/torchax_compat.py (torch 2.13 and newer need its layer) to be sure (unless
    `import_torchax` is False: the user's process checks without it; the child imports it).
    """
    from ..backends.base import has_module

    missing = [dist for module, dist in _EXTRA_MODULES if not has_module(module)]
    if not has_module("libtpu"):
        missing.append("libtpu")
    if missing:
        raise ForecastUnavailable(
            f"the TPU forecast needs the `forecast` extra, and {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed: run `{EXTRA_INSTALL}` "
            "(Linux x86-64 only, where libtpu has wheels)."
        )
    versions = {dist: importlib.metadata.version(dist) for _, dist in _EXTRA_MODULES}
    versions["libtpu"] = importlib.metadata.version("libtpu")
    import torch

    versions["torch"] = torch.__version__
    limit = TORCHAX_MAX_TORCH.get(versions["torchax"])
    torch_version = _version_tuple(torch.__version__)[:2]
    if limit is not None and torch_version > limit:
        raise ForecastUnavailable(
            f"torchax {versions['torchax']} supports torch up to {limit[0]}.{limit[1]}, but torch "
            f"{torch.__version__} is installed: run `pip install 'torch<={limit[0]}.{limit[1]}'` "
            "or a newer torchax that supports this torch."
        )
    if not import_torchax:
        return versions
    try:
        _prepare_jax()
        torchax_compat.import_torchax()
    except Exception as exc:  # an incompatible pairing fails at import time with odd errors
        raise ForecastUnavailable(
            f"torchax {versions['torchax']} failed to import with torch {torch.__version__} "
            f"({type(exc).__name__}: {exc}); install a torch that this torchax supports, or "
            "upgrade torchax."
        ) from exc
    return versions


def _tpu_present() -> bool:
    """Whether this host has TPU chips (then libtpu starts cleanly and JAX may use them)."""
    from ..backends.base import tpu_chips_on_pci

    return tpu_chips_on_pci() > 0


def _prepare_jax() -> None:
    """Keep JAX on the CPU platform on a host without a TPU, unless the user chose a platform.

    With libtpu installed and no chips, JAX's default platform search loads libtpu and
    prints start-up errors before falling back to the CPU (docs/forecast.md, start-up noise).
    """
    if os.environ.get("JAX_PLATFORMS") or _tpu_present():
        return
    if "jax" not in sys.modules:
        os.environ["JAX_PLATFORMS"] = "cpu"
        return
    import jax
    from jax._src import xla_bridge

    initialised = getattr(xla_bridge, "backends_are_initialized", lambda: True)()
    if not initialised and not jax.config.jax_platforms:
        jax.config.update("jax_platforms", "cpu")


@contextlib.contextmanager
def _captured_stderr() -> Iterator[list[str]]:
    """Hold what native code writes to fd 2 (libtpu's start-up lines); hand it back as text.

    The caller decides whether to show it: kept out of sight when the call succeeds, attached
    to the error when it fails.
    """
    sink: list[str] = []
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        yield sink
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), fd)
        try:
            yield sink
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            tmp.seek(0)
            sink.append(tmp.read().decode("utf-8", "replace"))


@contextlib.contextmanager
def _quiet_tpu_env() -> Iterator[None]:
    """Set libtpu's host-discovery variables for the duration, restoring the user's values."""
    if _tpu_present():
        yield
        return
    saved = {k: os.environ.get(k) for k in _DEVICELESS_TPU_ENV}
    for key, value in _DEVICELESS_TPU_ENV.items():
        os.environ.setdefault(key, value)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


# -- topologies ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TopologyFamily:
    """How libtpu names a TPU generation's topologies (verified with libtpu 0.0.52)."""

    prefix: str
    dims: int
    host_bounds: tuple[int, int, int]  # chips one host holds, as deployed
    chip_config: str = "default"


# v4 runs in megacore mode (one device per chip) as deployed; "default" would split each
# chip into its two TensorCores. TPU7x exposes its two TensorCores as two devices either way.
TOPOLOGY_FAMILIES: dict[str, TopologyFamily] = {
    "v5e": TopologyFamily("v5e", 2, (2, 4, 1)),
    "v6e": TopologyFamily("v6e", 2, (2, 4, 1)),
    "v5p": TopologyFamily("v5p", 3, (2, 2, 1)),
    "v4": TopologyFamily("v4", 3, (2, 2, 1), chip_config="megacore"),
    "tpu7x": TopologyFamily("tpu7x", 3, (2, 2, 1)),
}
_FAMILY_ALIASES = {"v7x": "tpu7x", "7x": "tpu7x", "ironwood": "tpu7x", "trillium": "v6e"}


@dataclass(frozen=True)
class Topology:
    """A TPU slice to compile for: libtpu's topology name and how it is laid out."""

    target: str  # catalogue key: "v5e", "v6e", "v5p", "v4", "tpu7x"
    name: str  # libtpu topology name: "v5e:2x2"
    shape: tuple[int, ...]
    chip_config: str
    host_bounds: tuple[int, int, int]

    @property
    def chips(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def _power_of_two_shape(chips: int, dims: int) -> tuple[int, ...]:
    """1 -> 1x1(x1), 2 -> 2x1(x1), 4 -> 2x2(x1), 8 -> 2x4 or 2x2x2, 16 -> 4x4 or 2x2x4, ...

    The shapes Cloud TPU slices have: small slices fill the leading axes, larger ones grow
    the trailing axis first (v5p 2x2x2 -> 2x2x4 -> 2x4x4 -> 4x4x4).
    """
    shape = [1] * dims
    remaining, axis = chips, 0
    while remaining > 1:
        shape[axis] *= 2
        remaining //= 2
        axis = (axis + 1) % dims
    return tuple(sorted(shape, reverse=min(shape) == 1))


def family_key(target: str) -> str:
    """The generation key of a target such as "v5e", "TPU v5 lite", "tpu7x:2x2x1" or "v7x"."""
    head = target.split(":", 1)[0].strip().lower().replace(" ", "")
    head = head.removeprefix("tpu") if head not in TOPOLOGY_FAMILIES else head
    head = {"v5lite": "v5e", "v5litepod": "v5e", "v6lite": "v6e", "7x": "tpu7x"}.get(head, head)
    head = _FAMILY_ALIASES.get(head, head)
    if head in TOPOLOGY_FAMILIES:
        return head
    raise ValueError(
        f"unknown TPU target {target!r}; the forecast compiles for "
        f"{', '.join(TOPOLOGY_FAMILIES)} (optionally with a topology such as 'v5e:2x4')."
    )


def topology_for(target: str, chips: int = 1) -> Topology:
    """The topology for `chips` chips of a generation, or the one named in `target` ("v5p:2x2x2").

    Chip counts are powers of two here; any other slice shape is named explicitly.
    """
    key = family_key(target)
    family = TOPOLOGY_FAMILIES[key]
    if ":" in target:
        text = target.split(":", 1)[1]
        try:
            shape = tuple(int(n) for n in text.lower().split("x"))
        except ValueError:
            raise ValueError(f"topology {target!r} must look like '{key}:2x2'.") from None
        if len(shape) != family.dims or min(shape) < 1:
            example = "x".join(["2"] * family.dims)
            raise ValueError(
                f"topology {target!r} needs {family.dims} sizes, like '{key}:{example}'."
            )
    else:
        if isinstance(chips, bool) or not isinstance(chips, int) or chips < 1:
            raise ValueError(f"chips must be a whole number of at least 1, not {chips!r}.")
        if chips & (chips - 1):
            raise ValueError(
                f"chips={chips} is not a power of two; name the slice shape instead, "
                f"e.g. targets=['{key}:{'x'.join(['2'] * family.dims)}']."
            )
        shape = _power_of_two_shape(chips, family.dims)
    bounds = tuple(min(s, b) for s, b in zip((*shape, 1, 1)[:3], family.host_bounds, strict=True))
    name = f"{family.prefix}:{'x'.join(str(s) for s in shape)}"
    return Topology(key, name, shape, family.chip_config, bounds)  # type: ignore[arg-type]  # three bounds: zip over three


@cache
def _topology_devices(name: str, chip_config: str, host_bounds: tuple[int, int, int]) -> tuple:
    from jax.experimental import topologies

    error: Exception | None = None
    with _quiet_tpu_env(), _captured_stderr() as noise:
        try:
            desc = topologies.get_topology_desc(
                platform="tpu",
                topology_name=name,
                chip_config_name=chip_config,
                chips_per_host_bounds=host_bounds,
                num_slices=1,
            )
        except Exception as exc:
            error = exc
    if error is not None:
        said = " ".join("".join(noise).split())[:500]
        raise ForecastError(
            f"libtpu could not describe the TPU topology {name!r} ({error})"
            + (f"; libtpu said: {said}" if said else "")
        ) from error
    return tuple(desc.devices)


def topology_devices(topology: Topology) -> tuple:
    """The topology's compile-only devices (created once per process and reused)."""
    return _topology_devices(topology.name, topology.chip_config, topology.host_bounds)


@cache
def _usable_hbm(name: str, chip_config: str, host_bounds: tuple[int, int, int]) -> float | None:
    import jax
    import jax.numpy as jnp

    device = _topology_devices(name, chip_config, host_bounds)[0]
    huge = jax.ShapeDtypeStruct(
        (2**20, 2**20), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(device)
    )
    with _jax_cache_off():
        try:
            jax.jit(lambda x: x[0, 0]).lower(huge).compile()
        except Exception as exc:
            numbers = parse_hbm_oom(str(exc))
            return numbers[1] if numbers else None
    return None


def usable_hbm(topology: Topology, cache: FigureCache | None = None) -> float | None:
    """HBM per device that libtpu lets a program use (e.g. 15.75 GiB of a 16 GiB v5e), or None.

    Read from the out-of-memory message of a deliberately oversized 4 TiB argument, which the
    compiler rejects quickly; None if the message has another form. The figure depends only
    on libtpu and the topology, so `cache` keeps it on disk.
    """
    name = f"hbm-{cache.key('usable-hbm', topology)}" if cache is not None else ""
    if cache is not None:
        stored = cache.get_json(name)
        if isinstance(stored, dict) and "usable" in stored:
            return stored["usable"]
    value = _usable_hbm(topology.name, topology.chip_config, topology.host_bounds)
    if cache is not None and value is not None:
        cache.put_json(name, {"usable": value})
    return value


def devices_per_chip(devices: Sequence[Any]) -> int:
    """TensorCores exposed as devices per chip: 2 on TPU7x (and v4 outside megacore), else 1."""
    chips = {tuple(getattr(d, "coords", (i,))) for i, d in enumerate(devices)}
    return max(1, len(devices) // max(1, len(chips)))


# -- the training step ------------------------------------------------------------------------


@dataclass
class BatchLayout:
    """The example batch split into what is traced and what is fixed.

    Tensor leaves of `(args, kwargs, targets)` are traced (by shape and dtype only); other
    leaves are constants. Leaves whose leading size equals the batch size are scaled and
    sharded when the batch size changes.
    """

    spec: Any  # torch pytree spec of ((args, kwargs), targets)
    leaves: list[Any]
    tensor_positions: list[int]
    batch_size: int
    per_sample_tokens: int | None

    def tensors(self) -> list[torch.Tensor]:
        return [self.leaves[i] for i in self.tensor_positions]


def split_batch(example_batch: Any) -> BatchLayout:
    """`(inputs, targets)` -> layout; inputs are a tensor, a tuple of positional args or a dict."""
    import torch
    from torch.utils import _pytree as pytree

    if not isinstance(example_batch, tuple | list) or len(example_batch) != 2:
        raise ValueError(
            "example_batch must be a pair (inputs, targets): the model is called as "
            "model(inputs) and the loss as loss_fn(output, targets)."
        )
    inputs, targets = example_batch
    args: tuple[Any, ...]
    if isinstance(inputs, Mapping):
        args, kwargs = (), dict(inputs)
    elif isinstance(inputs, tuple | list):
        args, kwargs = tuple(inputs), {}
    else:
        args, kwargs = (inputs,), {}
    leaves, spec = pytree.tree_flatten(((args, kwargs), targets))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    first = next((leaves[i] for i in positions if leaves[i].ndim > 0), None)
    if first is None:
        raise ValueError("example_batch holds no tensor with a batch dimension to forecast.")
    batch = int(first.shape[0])
    input_tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    tokens = None
    if input_tensors and not input_tensors[0].dtype.is_floating_point and batch:
        tokens = input_tensors[0].numel() // batch  # token ids: tokens per sample
    return BatchLayout(spec, leaves, positions, batch, tokens)


@dataclass
class TrainingStep:
    """The model, loss and optimizer as one JAX function, ready to lower for any topology.

    `attention` says how `F.scaled_dot_product_attention` is compiled ("flash": the Pallas
    flash-attention kernel; "full": the reference formula), and activation checkpoints
    become `jax.checkpoint` either way (`lowering.py`); `trace` records what the last
    lowering did.
    """

    model: torch.nn.Module
    loss_fn: Callable[[Any, Any], Any]
    plan: OptimizerPlan
    layout: BatchLayout
    dtype: torch.dtype | None = None
    attention: str = "flash"
    missing_ops: list[str] = field(default_factory=list)
    trace: TraceRecord | None = None  # what the last lowering did (lowering.py)
    _function: Any = None
    _names: dict[str, list[str]] = field(default_factory=dict)

    @property
    def state_names(self) -> dict[str, list[str]]:
        """Parameter and buffer names by role: "trainable", "frozen" and "buffers"."""
        return {k: list(v) for k, v in self._names.items()}

    def __post_init__(self) -> None:
        params = dict(self.model.named_parameters())
        trainable = set(self.plan.labels)
        self._names = {
            "trainable": [n for n in params if n in trainable],
            "frozen": [n for n in params if n not in trainable],
            "buffers": [n for n, _ in self.model.named_buffers()],
        }

    # shapes -------------------------------------------------------------------------------

    def _jax_dtype(self, torch_dtype: torch.dtype) -> Any:
        """The traced dtype: floating tensors take the forecast's `dtype` when one is set."""
        if self.dtype is not None and torch_dtype.is_floating_point:
            torch_dtype = self.dtype
        return _jax_dtype(torch_dtype)

    def state_shapes(self, sharding: Any) -> tuple[dict, dict, dict]:
        """ShapeDtypeStructs of (trainable, frozen, buffers), all on `sharding` (replicated)."""
        import jax

        tensors = dict(self.model.named_parameters())
        tensors.update(dict(self.model.named_buffers()))

        def shapes(kind: str) -> dict:
            return {
                n: jax.ShapeDtypeStruct(
                    tuple(tensors[n].shape),
                    self._jax_dtype(tensors[n].dtype),
                    sharding=sharding,
                )
                for n in self._names[kind]
            }

        return shapes("trainable"), shapes("frozen"), shapes("buffers")

    def batch_shapes(self, batch: int, batch_sharding: Any, replicated: Any) -> list:
        """ShapeDtypeStructs of the batch's tensors at batch size `batch`."""
        import jax

        out = []
        for tensor in self.layout.tensors():
            shape = tuple(tensor.shape)
            scaled = bool(shape) and shape[0] == self.layout.batch_size
            if scaled:
                shape = (batch, *shape[1:])
            out.append(
                jax.ShapeDtypeStruct(
                    shape,
                    self._jax_dtype(tensor.dtype),
                    sharding=batch_sharding if scaled else replicated,
                )
            )
        return out

    # the function -------------------------------------------------------------------------

    def _loss_and_buffers(self, trainable: dict, frozen: dict, buffers: dict, batch: list) -> tuple:
        import torch

        torchax = torchax_compat.import_torchax()
        from torch.utils import _pytree as pytree

        env = torchax.default_env()
        # Traced: a random op (dropout, randn) rotates torchax's key inside the trace, and the
        # env would keep the rotated key, a tracer, for whatever runs in it next (an
        # UnexpectedTracerError there). override_property puts the env's own back afterwards.
        with env, env.override_property(prng=env.prng_key):
            state = env.j2t_iso({**frozen, **buffers, **trainable})
            leaves = list(self.layout.leaves)
            for position, value in zip(
                self.layout.tensor_positions, env.j2t_iso(list(batch)), strict=True
            ):
                leaves[position] = value
            (args, kwargs), targets = pytree.tree_unflatten(leaves, self.layout.spec)
            # Tensors the model creates without a device land on the TPU, as in a TPU run.
            with torch.device("jax"):
                output = torch.func.functional_call(self.model, state, tuple(args), dict(kwargs))
                loss = self.loss_fn(output, targets)
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise ForecastError(
                    f"loss_fn must return a scalar tensor, got "
                    f"{type(loss).__name__}{tuple(getattr(loss, 'shape', ()))}."
                )
            new_buffers = {n: state[n] for n in buffers}  # in-place updates (BatchNorm stats)
            return env.t2j_iso(loss.reshape(())), env.t2j_iso(new_buffers)

    def function(self, tx: Any) -> Callable:
        """The pure step: (trainable, frozen, buffers, opt_state, batch) -> (loss, new state)."""
        import jax
        import optax

        torchax = torchax_compat.import_torchax()

        # torchax makes its default env, and the env its first key, on first use: made while
        # `step` is traced, that key would be a tracer kept for good. Made here, before any trace.
        torchax.default_env()

        def step(
            trainable: dict, frozen: dict, buffers: dict, opt_state: Any, batch: list
        ) -> tuple:
            (loss, new_buffers), grads = jax.value_and_grad(self._loss_and_buffers, has_aux=True)(
                trainable, frozen, buffers, batch
            )
            updates, opt_state = tx.update(grads, opt_state, trainable)
            return loss, optax.apply_updates(trainable, updates), new_buffers, opt_state

        return step

    def lower(self, tx: Any, devices: Sequence[Any], batch: int, sharding: str = "data") -> Any:
        """Trace and lower the step for `devices` at batch size `batch`.

        The batch is split over the devices. `sharding` "data" replicates weights and
        optimizer state on every device (XLA adds the gradient all-reduce); "fsdp" shards
        each weight, its gradient and its optimizer state over the devices along its largest
        evenly divisible axis (XLA gathers the weights where they are used, and
        reduce-scatters the gradients), as PyTorch's FSDP and ZeRO-3 do.
        """
        import jax
        import numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        if sharding not in SHARDINGS:
            raise ValueError(f"sharding must be one of {', '.join(SHARDINGS)}, not {sharding!r}.")
        mesh = Mesh(np.asarray(devices), ("data",))
        replicated = NamedSharding(mesh, PartitionSpec())
        batch_sharding = NamedSharding(mesh, PartitionSpec("data"))

        def state_sharding(shape: tuple[int, ...]) -> Any:
            if sharding == "data":
                return replicated
            return NamedSharding(mesh, fsdp_spec(shape, len(devices)))

        def place(a: Any) -> Any:
            return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=state_sharding(tuple(a.shape)))

        trainable, frozen, buffers = (
            {n: place(a) for n, a in part.items()} for part in self.state_shapes(replicated)
        )
        opt_state = jax.tree.map(place, jax.eval_shape(tx.init, trainable))
        batch_args = self.batch_shapes(batch, batch_sharding, replicated)

        def shardings(tree: Any) -> Any:
            return jax.tree.map(lambda a: a.sharding, tree)

        if self._function is None:
            self._function = self.function(tx)
        # Donate the state as a training loop does, so memory counts updates in place; the
        # new state keeps the old one's layout, so every donated buffer is reused.
        jitted = jax.jit(
            self._function,
            donate_argnums=(0, 2, 3),
            out_shardings=(
                replicated,
                shardings(trainable),
                shardings(buffers),
                shardings(opt_state),
            ),
        )
        torchax = torchax_compat.import_torchax()

        from .lowering import TraceRecord, lowered_calls

        self.trace = TraceRecord()
        with (
            _traced_torch(self.model, self.missing_ops),
            lowered_calls(torchax.default_env(), mesh, self.attention, self.trace),
        ):
            return jitted.lower(trainable, frozen, buffers, opt_state, batch_args)


SHARDINGS = ("data", "fsdp")


def fsdp_spec(shape: tuple[int, ...], devices: int) -> Any:
    """Shard along the largest axis that splits evenly over `devices` (else replicate)."""
    from jax.sharding import PartitionSpec

    candidates = [(size, axis) for axis, size in enumerate(shape) if size % devices == 0]
    if devices == 1 or not candidates:
        return PartitionSpec()
    _, axis = max(candidates, key=lambda c: (c[0], -c[1]))
    return PartitionSpec(*[("data" if a == axis else None) for a in range(len(shape))])


def _jax_dtype(torch_dtype: torch.dtype) -> Any:
    """The JAX dtype for a torch dtype as JAX runs it (int64 is int32 unless x64 is on)."""
    import jax

    torchax_compat.import_torchax()
    from torchax.ops import mappings

    return jax.dtypes.canonicalize_dtype(mappings.t2j_dtype(torch_dtype))


# A missing op without a meta kernel is run on zeros on the CPU to learn its output shapes;
# beyond this many input bytes the trace stops instead of allocating.
_CPU_PROBE_LIMIT = 256 * 2**20


def _output_like(func: Any, args: Any, kwargs: Any, missing: list[str]) -> Any:
    """Run `func` on stand-ins of its arguments (meta, else zeros on the CPU) for its shapes."""
    import torch
    from torch.utils import _pytree as pytree

    def stand_in(device: str) -> Callable[[torch.Tensor], torch.Tensor]:
        return lambda t: torch.zeros(tuple(t.shape), dtype=t.dtype, device=device)

    try:
        meta_args, meta_kwargs = pytree.tree_map_only(
            torch.Tensor, stand_in("meta"), (args, kwargs)
        )
        return func(*meta_args, **meta_kwargs)
    except Exception:
        pass  # no meta kernel (aten::geqrf has none): probe on the CPU if small enough
    tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    size = sum(t.numel() * t.element_size() for t in tensors)
    if size <= _CPU_PROBE_LIMIT:
        cpu_args, cpu_kwargs = pytree.tree_map_only(torch.Tensor, stand_in("cpu"), (args, kwargs))
        try:
            return func(*cpu_args, **cpu_kwargs)
        except Exception:
            pass
    raise ForecastError(
        f"tracing stopped at {func.name()}, which has no torchax lowering and whose output "
        f"shape could not be worked out; unsupported so far: {', '.join(missing)}."
    )


@contextlib.contextmanager
def _traced_torch(model: torch.nn.Module, missing: list[str]) -> Iterator[None]:
    """Trace in training mode with torchax's PRNG key kept concrete, recording missing ops.

    An aten op with no torchax lowering is recorded by name and replaced by zeros of the
    shape its meta kernel gives, so one trace names every missing op instead of the first.
    """
    import torch

    torchax = torchax_compat.import_torchax()
    from torch.utils import _pytree as pytree
    from torch.utils._python_dispatch import _disable_current_modes
    from torchax.ops import ops_registry
    from torchax.tensor import OperatorNotFound
    from torchax.tensor import Tensor as JaxTensor

    env = torchax.default_env()
    modes = {m: m.training for m in model.modules()}
    model.train()
    saved_property = env._property.content
    own_lookup = "_get_op_or_decomp" in vars(env)
    original = env._get_op_or_decomp

    def placeholder(func: Any) -> Callable:
        def run(*args: Any, **kwargs: Any) -> Any:
            import jax.numpy as jnp

            with _disable_current_modes(), torch._C.DisableTorchFunction():
                result = _output_like(func, args, kwargs, missing)
            if func._schema.is_mutable and args:
                return args[0]
            return pytree.tree_map_only(
                torch.Tensor,
                lambda m: JaxTensor(jnp.zeros(tuple(m.shape), _jax_dtype(m.dtype)), env),
                result,
            )

        return run

    def lookup(func: Any) -> Any:
        try:
            return original(func)
        except OperatorNotFound:
            if not isinstance(func, torch._ops.OpOverload):
                raise  # a torch function: torchax falls back to its aten decomposition
            name = func.name()
            if name not in missing:
                missing.append(name)
            return ops_registry.Operator(
                func,
                placeholder(func),
                is_jax_function=False,
                is_user_defined=False,
                needs_env=False,
                is_view_op=False,
            )

    env._get_op_or_decomp = lookup
    try:
        with warnings.catch_warnings():
            # torchax casts int64 to JAX's int32 with a warning per op; TPUs index in int32.
            warnings.filterwarnings("ignore", message="Explicitly requested dtype")
            yield
    finally:
        if own_lookup:
            env._get_op_or_decomp = original
        else:
            del env._get_op_or_decomp
        env._property.content = saved_property
        for module, training in modes.items():
            module.training = training


# -- compiling ----------------------------------------------------------------------------------


@dataclass
class CompileOutcome:
    """What libtpu's compiler said about one step on one topology, per device.

    `status` is "compiled", "oom" (CompileTimeHbmOom: `required_bytes` and `available_bytes`
    come from the message) or "error". Sizes are bytes per device; `optimal_seconds` is the
    compiler's own estimate, kept as reported (it can be negative, i.e. invalid).
    `flops` and `bytes_accessed` are `cost_analysis()`'s totals plus what it leaves out:
    it counts a while loop's body once, and under FSDP libtpu computes the weight gradients
    as windowed einsums (loops of partial matmuls and collective-permutes), so half of their
    FLOPs went missing (docs/forecast.md, "FLOPs you can trust"). The raw totals stay in
    `compiler_flops` and `compiler_bytes`; the HLO's matmul FLOPs, collectives (bytes each
    device sends over ICI) and custom calls come from `hlo.summarize`.

    `partitioned` outcomes come from a compile stopped at the end of libtpu's HLO passes
    (`compile_lowered(..., partitioned=True)`): the partitioned program and its buffer
    assignment give memory and collectives exactly as the whole compile would, but there is
    no cost analysis, so `flops`, `bytes_accessed` and `transcendentals` are None until
    `slices.anchored` takes them from a whole compile of a program with the same work.
    """

    status: str
    batch: int
    compile_seconds: float = 0.0
    lower_seconds: float = 0.0
    cached: bool = False
    flops: float | None = None
    bytes_accessed: float | None = None
    transcendentals: float | None = None
    optimal_seconds: float | None = None
    argument_bytes: int | None = None
    output_bytes: int | None = None
    alias_bytes: int | None = None
    temp_bytes: int | None = None
    code_bytes: int | None = None
    required_bytes: float | None = None
    available_bytes: float | None = None
    message: str = ""
    # What the optimized HLO says (hlo.py), per device; None where it could not be read.
    compiler_flops: float | None = None  # cost_analysis()'s figure: loop bodies counted once
    compiler_bytes: float | None = None
    matmul_flops: float | None = None
    attention_flops: float | None = None
    loop_flops: float | None = None
    estimated_kernel_flops: float | None = None
    ici_bytes: float | None = None
    async_ici_bytes: float | None = None
    collectives: dict[str, dict[str, float]] = field(default_factory=dict)
    custom_calls: dict[str, float] = field(default_factory=dict)
    program_bytes: float | None = None  # hlo.ProgramSummary's own counts (for differences)
    program_bytes_once: float | None = None
    loop_bytes: float | None = None  # the bytes of loop bodies beyond their first run
    # XLA's generic cost analysis of the optimized program (`_generic_cost`): the scale on
    # which a partitioned program's bytes are read against a whole compile's (slices.py).
    generic_bytes: float | None = None
    partitioned: bool = False
    # What the trace did (lowering.TraceRecord): not part of the cached figures.
    attention_kind: str | None = None
    attention_fallbacks: list[str] = field(default_factory=list)
    remat_regions: int = 0

    @property
    def fits(self) -> bool:
        return self.status == "compiled"

    @property
    def memory_bytes(self) -> float | None:
        """HBM the step holds at its peak, per device: arguments + outputs - donated + temporaries."""
        if self.status == "oom":
            return self.required_bytes
        parts = (self.argument_bytes, self.output_bytes, self.alias_bytes, self.temp_bytes)
        if any(p is None for p in parts):
            return None
        arg, out, alias, temp = cast(tuple[int, int, int, int], parts)  # none is None (above)
        return float(arg + out - alias + temp)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_SIZE = r"([0-9.]+)\s*([KMGTP]?)i?B?"
_OOM_PATTERNS = (
    re.compile(rf"required for .*?\({_SIZE}\) exceeds available HBM \({_SIZE}\)"),
    re.compile(rf"Used {_SIZE} of {_SIZE} hbm", re.IGNORECASE),
)
_UNIT = {"": 1.0, "K": 2.0**10, "M": 2.0**20, "G": 2.0**30, "T": 2.0**40, "P": 2.0**50}


def parse_hbm_oom(message: str) -> tuple[float, float] | None:
    """(required, available) bytes from libtpu's out-of-memory message, or None.

    Verified form: "CompileTimeHbmOom: Ran out of memory on HBM, the total memory required
    for HLO temporaries (60.02G) exceeds available HBM (15.75G)", where G is GiB and the
    "temporaries" include the arguments. XLA's older "Used 20.5G of 15.75G hbm" is read too.
    """
    for pattern in _OOM_PATTERNS:
        match = pattern.search(message)
        if match:
            req, req_unit, avail, avail_unit = match.groups()
            return float(req) * _UNIT[req_unit.upper()], float(avail) * _UNIT[avail_unit.upper()]
    return None


def default_cache_dir() -> Path:
    """Where forecast figures are cached: $GPU2TPU_CACHE_DIR, else the user cache directory."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    try:
        from platformdirs import user_cache_dir
    except ImportError:
        if sys.platform == "darwin":
            base = Path.home() / "Library" / "Caches"
        elif os.name == "nt":
            base = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
        else:
            base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        return base / "gpu2tpu" / "forecast"
    return Path(user_cache_dir("gpu2tpu", appauthor=False)) / "forecast"


class FigureCache:
    """Compile figures on disk, one JSON file per (lowered program, topology, versions).

    Keys hash the lowered StableHLO, so any change to the model, batch, dtype or optimizer
    is a new entry; a corrupt or unreadable entry is treated as absent.
    """

    def __init__(self, directory: Path | None, versions: Mapping[str, str]) -> None:
        self.directory = directory
        self.versions = dict(versions)

    def key(self, program_text: str, topology: Topology) -> str:
        digest = hashlib.sha256()
        header = {"format": _CACHE_FORMAT, "versions": self.versions, "topology": asdict(topology)}
        digest.update(json.dumps(header, sort_keys=True).encode())
        digest.update(program_text.encode())
        return digest.hexdigest()

    def get(self, key: str) -> CompileOutcome | None:
        data = self.get_json(key)
        try:
            return None if data is None else CompileOutcome(**data)
        except TypeError:  # written by another format
            return None

    def put(self, key: str, outcome: CompileOutcome) -> None:
        if outcome.status != "error":
            self.put_json(_PARTITIONED + key if outcome.partitioned else key, outcome.to_dict())

    def lookup(self, key: str, partitioned: bool = False) -> CompileOutcome | None:
        """The figures of the program `key` names: a whole compile's, or (`partitioned`)
        those read at the end of its HLO passes when no whole compile is cached."""
        return self.get(key) or (self.get(_PARTITIONED + key) if partitioned else None)

    def get_json(self, name: str) -> Any:
        """A stored JSON value, or None when absent or unreadable."""
        if self.directory is None:
            return None
        try:
            return json.loads((self.directory / f"{name}.json").read_text())
        except (OSError, ValueError):
            return None

    def put_json(self, name: str, data: Any) -> None:
        """Store atomically (a reader never sees half a file; an interrupted write leaves none)."""
        if self.directory is None:
            return
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp = self.directory / f".{name}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(data))
            tmp.replace(self.directory / f"{name}.json")
        except OSError:
            pass  # a read-only cache directory only costs a recompile next time


@contextlib.contextmanager
def _jax_cache_off() -> Iterator[None]:
    """Keep JAX's own persistent cache out of cross-compiles (it cannot reload them)."""
    import jax

    try:
        previous = jax.config.jax_enable_compilation_cache
    except AttributeError:
        yield
        return
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", previous)


def compile_lowered(
    lowered: Any, topology: Topology, batch: int, cache: FigureCache, *, partitioned: bool = False
) -> CompileOutcome:
    """Compile with libtpu (or read the cached figures) and read cost and memory analysis.

    `partitioned=True` stops at the end of libtpu's HLO passes and reads the partitioned
    program and its buffer assignment from the compiler's dump (a tenth of a compile: code
    generation is the rest). The compile goes on in a thread nothing can stop, so only a
    process that ends right after may ask for it (`runaway_compile()` then says so); a
    cached whole compile of the same program answers it too.
    """
    started = time.perf_counter()
    key = cache.key(lowered.as_text(), topology)
    hit = cache.lookup(key, partitioned)
    if hit is not None:
        hit.cached = True
        hit.batch = batch
        hit.compile_seconds = time.perf_counter() - started
        return hit
    if partitioned:
        outcome = _partitioned_compile(lowered, batch)
    else:
        with _jax_cache_off(), tempfile.TemporaryDirectory(prefix="gpu2tpu-hlo-") as dump:
            outcome = _whole_compile(lowered, batch, Path(dump))
    outcome.compile_seconds = time.perf_counter() - started
    cache.put(key, outcome)
    return outcome


def _whole_compile(lowered: Any, batch: int, dump: Path) -> CompileOutcome:
    try:
        compiled = lowered.compile(compiler_options=_dump_options(str(dump)))
    except Exception as exc:
        return _failed_compile(exc, batch)
    outcome = _analysed(compiled, batch)
    _add_program(outcome, _optimized_hlo(dump))
    return outcome


# libtpu writes this after the optimized program, its buffer assignment and live ranges,
# just before code generation (libtpu 0.0.52).
_PASSES_DONE = "*.after_optimizations_after_buffer_assignment.txt"
_OPTIMIZED = "*.after_optimizations.txt"
_BUFFERS = "*.after_optimizations-buffer-assignment.txt"
_runaway: list[Any] = []  # compile threads left running by partitioned compiles


def runaway_compile() -> bool:
    """Whether a partitioned compile left libtpu's code generation running in this process."""
    return any(thread.is_alive() for thread in _runaway)


def _partitioned_compile(lowered: Any, batch: int) -> CompileOutcome:
    """Compile in a thread and read the program once libtpu's HLO passes have written it.

    Falls back on the whole compile's figures when the compile ends first (it failed, or
    this libtpu writes no such file).
    """
    import shutil
    import threading

    dump = Path(tempfile.mkdtemp(prefix="gpu2tpu-hlo-"))
    done: list[CompileOutcome] = []

    def run() -> None:
        with _jax_cache_off():
            done.append(_whole_compile(lowered, batch, dump))

    thread = threading.Thread(target=run, name="gpu2tpu-partitioned-compile", daemon=True)
    thread.start()
    seen: tuple = ()
    try:
        while thread.is_alive():
            thread.join(0.2)
            if not any(dump.glob(_PASSES_DONE)):
                continue
            # The files are written one after the other: read them once both are there and
            # their sizes held still for a poll.
            files = [*dump.glob(_OPTIMIZED), *dump.glob(_BUFFERS)]
            sizes = tuple(sorted((f.name, f.stat().st_size) for f in files))
            if len(files) >= 2 and sizes == seen:
                outcome = _read_partitioned(dump, batch)
                if outcome is not None:
                    _runaway.append(thread)
                    return outcome
            seen = sizes
        return done[0] if done else CompileOutcome("error", batch, message="the compile ended")
    finally:
        shutil.rmtree(dump, ignore_errors=True)


def _read_partitioned(dump: Path, batch: int) -> CompileOutcome | None:
    """The figures of a program whose HLO passes are done, from libtpu's dump."""
    from .hlo import buffer_memory

    found = sorted(dump.glob(_BUFFERS))
    text = _optimized_hlo(dump)
    if not found or text is None:
        return None
    try:
        memory = buffer_memory(found[-1].read_text(errors="replace"))
    except OSError:
        return None
    if memory is None:
        return None
    outcome = CompileOutcome(
        "compiled",
        batch,
        argument_bytes=memory.argument,
        output_bytes=memory.output,
        alias_bytes=memory.alias,
        temp_bytes=memory.temp,
        partitioned=True,
    )
    _add_program(outcome, text)
    return outcome


def _dump_options(directory: str) -> dict[str, Any]:
    """Have libtpu write the optimized HLO as text (`Compiled.as_text()` fails on libtpu
    0.0.52's training steps: "async-update instruction should have 1 operands")."""
    return {"xla_dump_to": directory, "xla_dump_hlo_as_text": True}


def _optimized_hlo(directory: Path) -> str | None:
    """The text of the program after libtpu's optimizations, from its dump, or None."""
    found = sorted(directory.glob(_OPTIMIZED), key=lambda p: p.stat().st_size)
    if not found:
        return None
    try:
        return found[-1].read_text(errors="replace")
    except OSError:
        return None


def _add_program(outcome: CompileOutcome, text: str | None) -> None:
    """Fill what the optimized HLO says, and add the loop bodies the cost analysis missed."""
    from .hlo import summarize

    outcome.compiler_flops, outcome.compiler_bytes = outcome.flops, outcome.bytes_accessed
    if text is None:
        outcome.message = "libtpu wrote no optimized HLO: collectives and loops not read"
        return
    program = summarize(text)
    outcome.matmul_flops = program.matmul_flops
    outcome.attention_flops = program.attention_flops
    outcome.loop_flops = program.loop_flops
    outcome.estimated_kernel_flops = program.estimated_kernel_flops
    outcome.ici_bytes = program.ici_bytes
    outcome.async_ici_bytes = program.async_ici_bytes
    outcome.collectives = {k: asdict(v) for k, v in program.collectives.items()}
    outcome.custom_calls = dict(program.custom_calls)
    outcome.program_bytes = program.program_bytes
    outcome.program_bytes_once = program.program_bytes_once
    outcome.loop_bytes = program.loop_bytes
    outcome.generic_bytes = _generic_bytes(text)
    if outcome.flops is not None:
        outcome.flops += program.loop_flops + program.kernel_flops
    if outcome.bytes_accessed is not None:
        outcome.bytes_accessed += program.loop_bytes


def _generic_bytes(text: str) -> float | None:
    """The bytes XLA's generic cost analysis (jaxlib's, on the CPU client) counts in the
    optimized TPU program, loop bodies once; None when XLA cannot read the program.

    Not libtpu's own figure (which counts TPU layouts: 8-18% more on the programs measured),
    but the same rules for every program, so the ratio of two programs' figures carries
    over (slices.anchored).
    """
    try:
        import jax
        from jax._src.lib import xla_client
        from jaxlib import _hlo

        from .hlo import standard_hlo

        module = _hlo.hlo_module_from_text(standard_hlo(text))
        cost = xla_client._xla.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module)
    except Exception:
        return None
    value = cost.get("bytes accessed")
    return None if value is None else float(value)


def apply_trace(outcome: CompileOutcome, trace: TraceRecord | None) -> None:
    """What the trace did, on the figures: attention kernels count the FLOPs they execute
    (recorded while tracing) in place of the estimates the cost analysis took from them,
    and the result says how attention ran and how many regions were rematerialised."""
    if trace is None:
        return
    outcome.attention_kind = trace.attention_kind
    outcome.attention_fallbacks = list(trace.full_reasons)
    outcome.remat_regions = trace.remat_calls
    if not trace.remat_supported:
        outcome.message = (
            "this torch's torch.utils.checkpoint could not be reached: checkpointed regions "
            "were compiled without rematerialisation"
        )
    if not trace.kernel_flops or outcome.status != "compiled":
        return
    if outcome.flops is not None:
        outcome.flops += trace.kernel_flops - (outcome.estimated_kernel_flops or 0.0)
    for name in ("matmul_flops", "attention_flops"):
        setattr(outcome, name, (getattr(outcome, name) or 0.0) + trace.kernel_flops)


def _failed_compile(exc: Exception, batch: int) -> CompileOutcome:
    message = str(exc)
    numbers = parse_hbm_oom(message)
    if numbers is not None or "RESOURCE_EXHAUSTED" in message:
        required, available = numbers if numbers else (None, None)
        first = message.strip().splitlines()[0] if message.strip() else type(exc).__name__
        return CompileOutcome(
            "oom", batch, required_bytes=required, available_bytes=available, message=first
        )
    return CompileOutcome("error", batch, message=f"{type(exc).__name__}: {message.strip()[:800]}")


def _analysed(compiled: Any, batch: int) -> CompileOutcome:
    cost = compiled.cost_analysis() or {}
    if isinstance(cost, list | tuple):  # jax < 0.4.38 returned a one-element list
        cost = cost[0] if cost else {}
    memory = compiled.memory_analysis()

    def number(name: str) -> float | None:
        value = cost.get(name)
        return None if value is None else float(value)

    def size(name: str) -> int | None:
        value = getattr(memory, name, None)
        return None if value is None else int(value)

    return CompileOutcome(
        "compiled",
        batch,
        flops=number("flops"),
        bytes_accessed=number("bytes accessed"),
        transcendentals=number("transcendentals"),
        optimal_seconds=number("optimal_seconds"),
        argument_bytes=size("argument_size_in_bytes"),
        output_bytes=size("output_size_in_bytes"),
        alias_bytes=size("alias_size_in_bytes"),
        temp_bytes=size("temp_size_in_bytes"),
        code_bytes=size("generated_code_size_in_bytes"),
    )
