"""What a compiled step does, read from libtpu's optimized HLO: collectives, matmuls, loops.

`cost_analysis()` gives one FLOP and one byte total per device. What the forecast also needs
comes from the program itself, the HLO text libtpu writes after its optimizations (per
device, after SPMD partitioning and scheduling):

- the collectives XLA inserted (FSDP's all-gathers and reduce-scatters, data parallelism's
  all-reduces), with the bytes each device sends over ICI, and whether each one is
  asynchronous (a `-start`/`-done` pair or an `async-start`, which the scheduler overlaps
  with compute) or synchronous (the core waits for it);
- the FLOPs of matrix products (`dot` and `convolution`, the work of the MXUs), so the
  share of matmul FLOPs in the step is known;
- custom calls (Pallas/Mosaic kernels), whose FLOPs the cost analysis may not see.

Loops count as often as they run: a `while` with a `known_trip_count` multiplies everything
in its body. Everything here is pure text processing, testable without JAX
(`Compiled.as_text()` fails on libtpu 0.0.52's training steps with "async-update
instruction should have 1 operands", so `aot.py` has libtpu dump the text instead).
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

# Bytes per element of HLO's primitive types (sub-byte types round to their storage share).
_ELEMENT_BYTES = {
    "pred": 1.0, "s2": 0.25, "u2": 0.25, "s4": 0.5, "u4": 0.5, "s8": 1.0, "u8": 1.0,
    "s16": 2.0, "u16": 2.0, "s32": 4.0, "u32": 4.0, "s64": 8.0, "u64": 8.0,
    "f16": 2.0, "bf16": 2.0, "f32": 4.0, "f64": 8.0, "c64": 8.0, "c128": 16.0,
    "f8e4m3fn": 1.0, "f8e5m2": 1.0, "f8e4m3b11fnuz": 1.0, "f8e4m3fnuz": 1.0,
    "f8e5m2fnuz": 1.0, "f8e4m3": 1.0, "f8e3m4": 1.0, "f4e2m1fn": 0.5, "f8e8m0fnu": 1.0,
    "token": 0.0,
}  # fmt: skip
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_CALLED = re.compile(
    r"\b(calls|to_apply|body|condition|true_computation|false_computation|"
    r"branch_computations)=(\{[^}]*\}|%?[\w.\-]+)"
)
_TRIP_COUNT = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)')
_PARTITIONS = re.compile(r"\bnum_partitions=(\d+)")
_ESTIMATE = re.compile(r'"cost_estimate"\s*:\s*\{[^}]*"flops"\s*:\s*"?([0-9.eE+]+)')
_ATTENTION = re.compile(
    r'op_name="[^"]*(scaled_dot_product_attention|multi_head_attention|dot_product_attention)'
)

# Collective opcodes, by the kind the forecast reports.
COLLECTIVE_KINDS = {
    "all-gather": "all-gather",
    "all-gather-start": "all-gather",
    "reduce-scatter": "reduce-scatter",
    "all-reduce": "all-reduce",
    "all-reduce-start": "all-reduce",
    "collective-permute": "collective-permute",
    "collective-permute-start": "collective-permute",
    "all-to-all": "all-to-all",
    "ragged-all-to-all": "all-to-all",
    "collective-broadcast": "collective-broadcast",
}
_ASYNC_PAIRS = {"all-gather-start", "all-reduce-start", "collective-permute-start"}


@dataclass
class Instruction:
    """One HLO instruction: its name, result shape text, opcode, operand names, attributes."""

    name: str
    shape: str
    opcode: str
    operands: list[str]
    attributes: str
    operand_text: str = ""


@dataclass
class CollectiveTotal:
    """The collectives of one kind in a step, per device: how many ran, and their bytes.

    `payload_bytes` is the data each device contributes (its operand: a shard for an
    all-gather, the whole tensor for an all-reduce); `ici_bytes` what each device sends over
    the interconnect by a ring algorithm over the group of n devices:
    all-gather (n-1) x shard, reduce-scatter and all-to-all (n-1)/n x input, all-reduce
    2(n-1)/n x input, collective-permute the operand. `async_ici_bytes` is the part sent by
    asynchronous collectives, which XLA's scheduler overlaps with compute.
    """

    count: float = 0.0
    payload_bytes: float = 0.0
    ici_bytes: float = 0.0
    async_ici_bytes: float = 0.0


@dataclass
class ProgramSummary:
    """What the compiled program does per device (see the module docstring).

    `attention_flops` are the matmul FLOPs traced from attention (`scaled_dot_product_attention`,
    `multi_head_attention_forward`: the score and context products, forward and backward), read
    from the op names JAX records in each instruction's metadata.
    `kernel_flops` are the matmul FLOPs inside kernels the cost analysis cannot see into:
    libtpu rewrites a softmax followed by a matrix product (attention's probabilities times
    values) into its own Mosaic kernel, custom call "online-softmax", whose product is
    counted here from its operand shapes (and included in `matmul_flops`), less any estimate
    the kernel carries. `estimated_kernel_flops` are the estimates other kernels carry
    (a Pallas kernel's `cost_estimate`, which the cost analysis adds): flash attention's
    forward carries the full-attention formula's FLOPs, its backward none, so the forecast
    replaces them with what the kernels execute (`lowering.py`).
    `loop_flops` and `loop_bytes` are what XLA's cost analysis leaves out: it counts a while
    loop's body once, so the FLOPs of matrix products and the bytes of instructions in
    bodies that run more often are added here (`aot.py` adds them to the compiler's totals).
    `program_bytes` is this module's own count of the bytes the program moves (every
    instruction outside fusions: its operands and its result, loop bodies as often as they
    run), `program_bytes_once` the same with loop bodies once; the forecast uses them only in
    differences between two programs that do the same work per device (`slices.py`).
    """

    matmul_flops: float = 0.0
    attention_flops: float = 0.0
    kernel_flops: float = 0.0
    estimated_kernel_flops: float = 0.0
    loop_flops: float = 0.0
    loop_bytes: float = 0.0
    program_bytes: float = 0.0
    program_bytes_once: float = 0.0
    collectives: dict[str, CollectiveTotal] = field(default_factory=dict)
    custom_calls: dict[str, float] = field(default_factory=dict)
    unknown_loops: int = 0
    devices: int = 1

    @property
    def ici_bytes(self) -> float:
        """Bytes one device sends over ICI in one step, all collectives together."""
        return sum(c.ici_bytes for c in self.collectives.values())

    @property
    def async_ici_bytes(self) -> float:
        return sum(c.async_ici_bytes for c in self.collectives.values())

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ici_bytes"] = self.ici_bytes
        data["async_ici_bytes"] = self.async_ici_bytes
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProgramSummary:
        return cls(
            matmul_flops=float(data.get("matmul_flops", 0.0)),
            attention_flops=float(data.get("attention_flops", 0.0)),
            kernel_flops=float(data.get("kernel_flops", 0.0)),
            estimated_kernel_flops=float(data.get("estimated_kernel_flops", 0.0)),
            loop_flops=float(data.get("loop_flops", 0.0)),
            loop_bytes=float(data.get("loop_bytes", 0.0)),
            program_bytes=float(data.get("program_bytes", 0.0)),
            program_bytes_once=float(data.get("program_bytes_once", 0.0)),
            collectives={k: CollectiveTotal(**v) for k, v in data.get("collectives", {}).items()},
            custom_calls={k: float(v) for k, v in data.get("custom_calls", {}).items()},
            unknown_loops=int(data.get("unknown_loops", 0)),
            devices=int(data.get("devices", 1)),
        )


def shape_bytes(shape: str) -> float:
    """Bytes of an HLO shape text, a tuple's elements summed ("(bf16[8,128]{1,0}, f32[])")."""
    total = 0.0
    for dtype, dims in _ARRAY.findall(_without_layouts(shape)):
        size = _ELEMENT_BYTES.get(dtype)
        if size is None:
            continue
        total += size * math.prod(int(d) for d in dims.split(",") if d)
    return total


def shape_dims(shape: str) -> list[int]:
    """The dimensions of an array shape text ("bf16[8,128]{1,0}" -> [8, 128])."""
    match = _ARRAY.search(_without_layouts(shape))
    if match is None:
        return []
    return [int(d) for d in match.group(2).split(",") if d]


def _without_layouts(shape: str) -> str:
    # Layouts such as {1,0:T(8,128)(2,1)S(1)} hold no array shapes; drop them.
    return re.sub(r"\{[^{}]*\}", "", shape)


def _balanced(text: str, start: int) -> int:
    """The index just past the bracket group that opens at text[start]."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    stack: list[str] = []
    quote = False
    for i in range(start, len(text)):
        ch = text[i]
        if quote:
            if ch == '"' and text[i - 1] != "\\":
                quote = False
            continue
        if ch == '"':
            quote = True
        elif ch in pairs:
            stack.append(pairs[ch])
        elif stack and ch == stack[-1]:
            stack.pop()
            if not stack:
                return i + 1
    return len(text)


def parse_instruction(line: str) -> Instruction | None:
    """An instruction line, or None for anything else (headers, braces, blank lines)."""
    head = _INSTRUCTION.match(line)
    if head is None:
        return None
    rest = line[head.end() :]
    if rest.startswith("("):
        end = _balanced(rest, 0)
    else:
        end = rest.find(" ")
        if end < 0:
            return None
    shape = rest[:end]
    rest = rest[end:].lstrip()
    paren = rest.find("(")
    if paren <= 0:
        return None
    opcode = rest[:paren].strip()
    close = _balanced(rest, paren)
    operand_text = rest[paren + 1 : close - 1]
    operands = re.findall(r"%([\w.\-]+)", operand_text)
    if not operands and operand_text.strip():
        operands = [t.strip().split(" ")[-1] for t in operand_text.split(",") if t.strip()]
    return Instruction(head.group(1), shape, opcode, operands, rest[close:], operand_text)


def parse_computations(text: str) -> tuple[dict[str, list[Instruction]], str | None]:
    """The program's computations by name, and the name of the entry computation."""
    computations: dict[str, list[Instruction]] = {}
    entry = None
    current: list[Instruction] | None = None
    for line in text.splitlines():
        if current is None:
            match = _COMPUTATION.match(line)
            if match and not line.startswith(" ") and not line.startswith("HloModule"):
                current = computations.setdefault(match.group(2), [])
                if match.group(1):
                    entry = match.group(2)
            continue
        if line.startswith("}"):
            current = None
            continue
        instruction = parse_instruction(line)
        if instruction is not None:
            current.append(instruction)
    return computations, entry


def _callees(instruction: Instruction) -> list[tuple[str, str]]:
    """(attribute, computation) pairs this instruction calls."""
    out = []
    for attribute, value in _CALLED.findall(instruction.attributes):
        for name in re.findall(r"%?([\w.\-]+)", value):
            out.append((attribute, name))
    return out


def _multiplicities(
    computations: dict[str, list[Instruction]], entry: str, loops: bool = True
) -> tuple[dict[str, float], int]:
    """How many times each computation runs per step, following calls from the entry.

    A while body runs its trip count times (`loops=False`: once, as XLA's cost analysis
    counts it); one whose count cannot be read is counted once (and reported). Reducers (`to_apply`) are not followed: they run per element and
    hold no matmul or collective. Async-update and async-done repeat their start's call.
    """
    runs: dict[str, float] = defaultdict(float)
    unknown = 0
    order = _topological(computations, entry)
    runs[entry] = 1.0
    for name in order:
        times = runs.get(name, 0.0)
        if not times:
            continue
        for instruction in computations.get(name, []):
            if instruction.opcode in ("async-update", "async-done"):
                continue
            trip = None
            if instruction.opcode == "while" and loops:
                trip = trip_count(instruction, computations, computations.get(name, []))
                if trip is None:
                    unknown += 1
            for attribute, callee in _callees(instruction):
                if attribute == "to_apply" or callee not in computations:
                    continue
                factor = (trip or 1.0) if attribute in ("body", "condition") else 1.0
                runs[callee] += times * factor
    return dict(runs), unknown


def trip_count(
    loop: Instruction, computations: dict[str, list[Instruction]], caller: list[Instruction]
) -> float | None:
    """How many times a `while` runs: its known_trip_count, else read from its counter.

    libtpu's windowed einsums (a matmul whose operand or result is sharded, done as a loop
    of partial products and collective-permutes) carry no known_trip_count, and XLA's cost
    analysis counts their body once. Their loops have the canonical form this reads: the
    condition compares tuple element k with a constant, the body adds a constant to
    element k, and the initial tuple holds a constant there.
    """
    found = _TRIP_COUNT.search(loop.attributes)
    if found:
        return float(found.group(1))
    called = dict(_callees(loop))
    condition = computations.get(called.get("condition", ""), [])
    body = computations.get(called.get("body", ""), [])
    if not condition or not body or not loop.operands:
        return None
    root = condition[-1] if condition else None
    for i in condition:
        if i.attributes and i is not None and i.name and i.opcode == "compare":
            root = i
    if root is None or root.opcode != "compare" or len(root.operands) != 2:
        return None
    direction = re.search(r"direction=(\w+)", root.attributes)
    cond = {i.name: i for i in condition}
    sides = [_follow(cond, n) for n in root.operands]
    index = next((_tuple_index(s) for s in sides if _tuple_index(s) is not None), None)
    limit = next((_constant(s) for s in sides if _constant(s) is not None), None)
    if index is None or limit is None or direction is None:
        return None
    if _constant(sides[0]) is not None:  # constant first: flip the comparison
        direction_text = {"LT": "GT", "GT": "LT", "LE": "GE", "GE": "LE"}.get(
            direction.group(1), direction.group(1)
        )
    else:
        direction_text = direction.group(1)
    start = _tuple_operand_constant(loop.operands[0], caller, index)
    step = _body_step(body, index)
    if start is None or not step:
        return None
    span = limit - start
    trips: float | None
    if direction_text == "LT":
        trips = math.ceil(span / step)
    elif direction_text == "LE":
        trips = math.floor(span / step) + 1
    elif direction_text == "GT":
        trips = math.ceil(-span / -step) if step < 0 else 0
    elif direction_text == "NE":
        trips = span / step if span % step == 0 else None
    else:
        return None
    return None if trips is None else float(max(0, trips))


def _follow(table: dict[str, Instruction], name: str) -> Instruction | None:
    """The instruction named, looking through converts and copies."""
    seen = 0
    instruction = table.get(name)
    while (
        instruction is not None
        and instruction.opcode in ("convert", "copy", "bitcast")
        and seen < 8
    ):
        instruction = table.get(instruction.operands[0]) if instruction.operands else None
        seen += 1
    return instruction


def _tuple_index(instruction: Instruction | None) -> int | None:
    if instruction is None or instruction.opcode != "get-tuple-element":
        return None
    found = re.search(r"index=(\d+)", instruction.attributes)
    return int(found.group(1)) if found else None


def _constant(instruction: Instruction | None) -> float | None:
    if instruction is None or instruction.opcode != "constant":
        return None
    try:
        return float(instruction.operand_text.strip())
    except ValueError:
        return None


def _tuple_operand_constant(name: str, caller: list[Instruction], index: int) -> float | None:
    table = {i.name: i for i in caller}
    init = table.get(name)
    if init is None or init.opcode != "tuple" or index >= len(init.operands):
        return None
    return _constant(_follow(table, init.operands[index]))


def _body_step(body: list[Instruction], index: int) -> float | None:
    """The constant the body adds to tuple element `index` each iteration."""
    table = {i.name: i for i in body}
    root = next((i for i in reversed(body) if i.opcode == "tuple"), None)
    if root is None or index >= len(root.operands):
        return None
    update = _follow(table, root.operands[index])
    if update is None or update.opcode not in ("add", "subtract") or len(update.operands) != 2:
        return None
    a, b = (_follow(table, n) for n in update.operands)
    if _tuple_index(a) == index and _constant(b) is not None:
        step = _constant(b)
    elif _tuple_index(b) == index and _constant(a) is not None and update.opcode == "add":
        step = _constant(a)
    else:
        return None
    assert step is not None
    return -step if update.opcode == "subtract" else step


def _topological(computations: dict[str, list[Instruction]], entry: str) -> list[str]:
    """Computations reachable from the entry, callers before callees."""
    seen: set[str] = set()
    post: list[str] = []
    stack: list[tuple[str, Iterable[str]]] = []

    def children(name: str) -> Iterable[str]:
        return [
            c
            for i in computations.get(name, [])
            for a, c in _callees(i)
            if a != "to_apply" and c in computations
        ]

    seen.add(entry)
    stack.append((entry, iter(children(entry))))
    while stack:
        name, it = stack[-1]
        advanced = False
        for child in it:
            if child not in seen:
                seen.add(child)
                stack.append((child, iter(children(child))))
                advanced = True
                break
        if not advanced:
            post.append(name)
            stack.pop()
    return post[::-1]


def group_size(attributes: str, devices: int) -> int:
    """Devices in each replica group of a collective ("replica_groups=..."), else all."""
    match = re.search(r"replica_groups=", attributes)
    if match is None:
        return devices
    text = attributes[match.end() :]
    if text.startswith("mesh["):
        axes = dict(
            (name, int(size))
            for name, size in re.findall(r"'([^']+)'=(\d+)", text[: _balanced(text, 4)])
        )
        after = text[_balanced(text, 4) :].lstrip()
        if after.startswith("{"):
            chosen = re.findall(r"'([^']+)'", after[: _balanced(after, 0)])
            return math.prod(axes.get(a, 1) for a in chosen) or devices
        return math.prod(axes.values()) or devices
    if text.startswith("["):  # iota form: [groups,size]<=[...]
        dims = [int(d) for d in re.findall(r"\d+", text[: _balanced(text, 0)])]
        return dims[-1] if dims else devices
    if text.startswith("{"):
        body = text[: _balanced(text, 0)]
        first = re.search(r"\{([0-9,\s]+)\}", body)
        if first is None:
            return devices
        return len([d for d in first.group(1).split(",") if d.strip()]) or devices
    return devices


def _ici_bytes(kind: str, operand_bytes: float, n: int) -> float:
    """Bytes one device sends for a collective over n devices (ring algorithms)."""
    if kind == "collective-permute":
        return operand_bytes
    if n <= 1:
        return 0.0
    if kind == "all-gather":
        return (n - 1) * operand_bytes
    if kind == "all-reduce":
        return 2 * (n - 1) / n * operand_bytes
    if kind == "collective-broadcast":
        return operand_bytes
    return (n - 1) / n * operand_bytes  # reduce-scatter, all-to-all


def _matmul_flops(instruction: Instruction, shapes: dict[str, str]) -> float:
    """2 x output elements x contracted size, for a dot or a convolution; 0 otherwise."""
    out = math.prod(shape_dims(instruction.shape)) if shape_dims(instruction.shape) else 1
    if instruction.opcode == "dot":
        lhs = shape_dims(shapes.get(instruction.operands[0], "")) if instruction.operands else []
        found = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", instruction.attributes)
        dims = [int(d) for d in found.group(1).split(",") if d] if found else []
        if not lhs:
            return 0.0
        return 2.0 * out * math.prod(lhs[d] for d in dims if d < len(lhs))
    if instruction.opcode == "convolution":
        if len(instruction.operands) < 2:
            return 0.0
        lhs = shape_dims(shapes.get(instruction.operands[0], ""))
        rhs = shape_dims(shapes.get(instruction.operands[1], ""))
        out_dims = shape_dims(instruction.shape)
        labels = re.search(
            r"dim_labels=([0-9a-z]+)_([0-9a-z]+)->([0-9a-z]+)", instruction.attributes
        )
        if labels is None or not lhs or not rhs:
            return 0.0
        lhs_l, rhs_l, out_l = labels.groups()
        if (len(lhs_l), len(rhs_l), len(out_l)) != (len(lhs), len(rhs), len(out_dims)):
            return 0.0
        macs = out_dims[out_l.index("b")] * out_dims[out_l.index("f")] * rhs[rhs_l.index("i")]
        window = _window(instruction.attributes)
        spatial = sorted(c for c in out_l if c.isdigit())
        for n, digit in enumerate(spatial):
            macs *= _valid_taps(
                lhs[lhs_l.index(digit)],
                rhs[rhs_l.index(digit)],
                out_dims[out_l.index(digit)],
                {k: v[n] if n < len(v) else v[-1] for k, v in window.items()},
            )
        return 2.0 * macs
    return 0.0


def _softmax_product_flops(instruction: Instruction, shapes: dict[str, str]) -> float:
    """libtpu's "online-softmax" kernel: softmax(scores [.., T, S]) @ values [.., S, D]."""
    out = shape_dims(instruction.shape)
    scores = shape_dims(shapes.get(instruction.operands[0], "")) if instruction.operands else []
    if len(out) < 2 or len(scores) != len(out) or scores[:-1] != out[:-1]:
        return 0.0
    return 2.0 * math.prod(out) * scores[-1]


def _window(attributes: str) -> dict[str, list[int]]:
    """A convolution's window settings per spatial dimension (size, stride, pads, dilations)."""
    found = re.search(r"window=\{([^}]*)\}", attributes)
    out: dict[str, list[int]] = {}
    if found is None:
        return out
    for key, value in re.findall(r"(\w+)=([0-9_x]+)", found.group(1)):
        if key == "pad":
            pairs = [p.split("_") for p in value.split("x")]
            out["pad_low"] = [int(p[0]) for p in pairs]
        elif key in ("size", "stride", "lhs_dilate", "rhs_dilate"):
            out[key] = [int(v) for v in value.split("x")]
    return out


def _valid_taps(lhs: int, kernel: int, out: int, window: dict[str, int]) -> int:
    """(output, kernel) position pairs that read a real input element along one dimension.

    As XLA's cost analysis counts them: the input is dilated (lhs_dilate) and padded, and a
    tap that lands on a hole or on padding does no work. Batched matrix products lowered to
    convolutions use this to put the batch in a spatial dimension (size 32, lhs_dilate 32).
    """
    stride = window.get("stride", 1)
    pad = window.get("pad_low", 0)
    base = window.get("lhs_dilate", 1)
    rhs_dilate = window.get("rhs_dilate", 1)
    extent = (lhs - 1) * base + 1
    if out * kernel > 1_000_000:  # a huge spatial convolution: every tap counts
        return out * kernel
    count = 0
    for o in range(out):
        for k in range(kernel):
            pos = o * stride + k * rhs_dilate - pad
            if 0 <= pos < extent and pos % base == 0:
                count += 1
    return count


def summarize(text: str) -> ProgramSummary:
    """Read the collectives, matmul FLOPs and custom calls of one device's program."""
    computations, entry = parse_computations(text)
    partitions = _PARTITIONS.search(text.split("\n", 1)[0])
    summary = ProgramSummary(devices=int(partitions.group(1)) if partitions else 1)
    if entry is None:
        return summary
    runs, summary.unknown_loops = _multiplicities(computations, entry)
    once, _ = _multiplicities(computations, entry, loops=False)
    async_bodies = {
        callee
        for name in runs
        for i in computations.get(name, [])
        if i.opcode == "async-start"
        for _, callee in _callees(i)
    }
    fused = {
        callee
        for name in runs
        for i in computations.get(name, [])
        if i.opcode == "fusion"
        for _, callee in _callees(i)
    }
    for name, times in runs.items():
        instructions = computations.get(name, [])
        shapes = {i.name: i.shape for i in instructions}
        extra = times - once.get(name, 0.0)
        for instruction in instructions:
            opcode = instruction.opcode
            if opcode in ("dot", "convolution"):
                flops = _matmul_flops(instruction, shapes)
                summary.matmul_flops += times * flops
                summary.loop_flops += extra * flops
                if _ATTENTION.search(instruction.attributes):
                    summary.attention_flops += times * flops
            elif opcode == "custom-call":
                target = re.search(r'custom_call_target="([^"]+)"', instruction.attributes)
                key = target.group(1) if target else "custom-call"
                named = re.search(r'op_name="([^"]+)"', instruction.attributes)
                estimate = _ESTIMATE.search(instruction.attributes)
                estimated = float(estimate.group(1)) if estimate else 0.0
                if named is not None and named.group(1) == "online-softmax":
                    key = "online-softmax"
                    flops = _softmax_product_flops(instruction, shapes)
                    summary.matmul_flops += times * flops
                    summary.attention_flops += times * flops
                    summary.kernel_flops += times * (flops - estimated)
                else:
                    summary.estimated_kernel_flops += times * estimated
                summary.custom_calls[key] = summary.custom_calls.get(key, 0.0) + times
            if name not in fused and opcode not in _NO_TRAFFIC:
                moved = shape_bytes(instruction.shape) + sum(
                    shape_bytes(shapes.get(o, "")) for o in instruction.operands
                )
                summary.loop_bytes += extra * moved
                summary.program_bytes += times * moved
                summary.program_bytes_once += once.get(name, 0.0) * moved
            kind = COLLECTIVE_KINDS.get(opcode)
            if kind is None:
                continue
            operand_bytes = sum(shape_bytes(shapes.get(o, "")) for o in instruction.operands)
            n = group_size(instruction.attributes, summary.devices)
            sent = _ici_bytes(kind, operand_bytes, n)
            total = summary.collectives.setdefault(kind, CollectiveTotal())
            total.count += times
            total.payload_bytes += times * operand_bytes
            total.ici_bytes += times * sent
            if opcode in _ASYNC_PAIRS or name in async_bodies or _is_async(instruction):
                total.async_ici_bytes += times * sent
    return summary


# Instructions that move no data of their own (bookkeeping, control flow, async halves).
_NO_TRAFFIC = frozenset(
    {
        "parameter", "get-tuple-element", "tuple", "constant", "bitcast", "while",
        "conditional", "call", "partition-id", "replica-id", "after-all", "async-done",
        "async-update", "all-gather-done", "all-reduce-done", "collective-permute-done",
        "copy-done", "send-done", "recv-done", "opt-barrier",
    }
)  # fmt: skip


def _is_async(instruction: Instruction) -> bool:
    """A collective XLA marked for overlap in its backend config (is_sync false)."""
    found = re.search(r'"is_sync"\s*:\s*(true|false)', instruction.attributes)
    return found is not None and found.group(1) == "false"


def summary_json(summary: ProgramSummary) -> str:
    return json.dumps(summary.to_dict(), sort_keys=True)


# -- memory, from libtpu's buffer assignment ------------------------------------------------

_ALLOCATION = re.compile(r"^allocation \d+: size (\d+), (.*)$", re.MULTILINE)
_COLOR = re.compile(r"\bcolor (\d+)")
# libtpu places the temporaries in one block whose size it rounds up to this many bytes
# (measured: memory_analysis()'s temp size against the dump's, libtpu 0.0.52).
_TEMP_ALIGNMENT = 16384


@dataclass
class BufferMemory:
    """A program's HBM per device, as `Compiled.memory_analysis()` reports it, read from the
    buffer assignment libtpu writes at the end of its HLO passes (before code generation).

    HBM is the default memory space (color 0). `argument` is every parameter's allocation,
    `alias` the parameters the program may write its results into (donated buffers),
    `output` every allocation that may outlive the program (those parameters too, and the
    result tuple), `temp` the temporaries' block.
    """

    argument: int
    output: int
    alias: int
    temp: int


def buffer_memory(text: str) -> BufferMemory | None:
    """The HBM figures of a buffer-assignment dump, or None when it holds no allocation."""
    argument = output = alias = temp = 0
    found = False
    for match in _ALLOCATION.finditer(text):
        found = True
        size, flags = int(match.group(1)), match.group(2)
        color = _COLOR.search(flags)
        if color is not None and color.group(1) != "0":
            continue
        live_out = "maybe-live-out" in flags
        if "parameter" in flags:
            argument += size
            if live_out:
                alias += size
                output += size
        elif live_out or "output shape" in flags:
            output += size
        elif "preallocated-temp" in flags:
            temp += size
    if not found:
        return None
    temp = -(-temp // _TEMP_ALIGNMENT) * _TEMP_ALIGNMENT
    return BufferMemory(argument, output, alias, temp)


# -- the program as XLA's own parser reads it -------------------------------------------------

_ASYNC = re.compile(
    r"^(\s*(?:ROOT\s+)?)%([\w.\-]+)\s*=\s*(.*?)\s(async-(?:start|update|done))\((.*?)\)(.*)$"
)


def standard_hlo(text: str) -> str:
    """The program with libtpu's SparseCore offloads (an `async-start` on the "sparsecore"
    thread, `async-update`s that add operands, an `async-done`) written as one custom call
    of all their operands, which XLA's text parser accepts (it rejects an async-update with
    more than one operand). Everything else is left as it is."""
    starts: dict[str, list[str]] = {}
    updates: dict[str, list[str]] = {}
    out = []
    for line in text.split("\n"):
        found = _ASYNC.match(line)
        if found is None:
            out.append(line)
            continue
        indent, name, shape, opcode, operands, _ = found.groups()
        names = [o.strip() for o in operands.split(",") if o.strip()]
        if opcode == "async-start" and 'async_execution_thread="sparsecore"' in line:
            starts[name] = names
            continue
        if opcode == "async-update" and names and names[0].lstrip("%") in starts:
            updates[name] = starts[names[0].lstrip("%")] + names[1:]
            continue
        source = names[0].lstrip("%") if names else ""
        if opcode == "async-done" and (source in updates or source in starts):
            joined = ", ".join(updates.get(source, starts.get(source, [])))
            out.append(f'{indent}%{name} = {shape} custom-call({joined}), custom_call_target="sc"')
            continue
        out.append(line)
    return "\n".join(out)
