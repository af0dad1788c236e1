"""Half-precision weights and activations at precision fp16 and bf16.

At those precisions every GEMM and convolution runs on the tensor-core template, which rounds each
operand to the precision's 16-bit type as it stages it (kernels/gemm_mma.py). A constant operand
(a Linear or Conv weight) can therefore be converted once, here at compile time, with no change
to any result: the kernel then reads half the bytes, and at batch 1 reading the weights is most
of a transformer's time.

Activations (narrow_activations) are stored in the half type too, wherever every op that writes
or reads one has a lowering that converts (the registry's `half_io`): kernels load 16-bit values
into float, compute in float (a Softmax's max and sum, a LayerNorm's mean and variance, a GEMM's
accumulator), and round once when they store. That halves the bytes every memory-bound kernel
moves, as in ORT's and TensorRT's mixed precision, where reductions also compute in float32.
Graph inputs and outputs keep their dtype, and an op kept float32 (`fp32_ops`) or without a
converting lowering keeps float32 tensors around it. A tensor that may hold a finite value beyond
the half type's range (made from a wide integer at fp16, or from a constant such as an attention
mask's -3.4e38: `beyond_half`) stays float32 too.

Only the GEMM's own input is rewired: a weight that other nodes also read (GPT-2's tied embedding,
gathered by token and multiplied by the LM head) keeps its float32 tensor for them.
"""
from __future__ import annotations

import numpy as np

from ..ir import Graph, Tensor
from .registry import ALIAS, ELEMENTWISE, REDUCTION, lookup

#: The storage dtype of each half precision.
HALF_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}

#: Integer types holding values beyond float16's largest finite value (65504; from 65520 it rounds
#: to inf): a float made from one (a Cast of ids, positions, a hash, a uint32 that wrapped) may not
#: fit. int8, uint8, int16 and bool always fit.
WIDE_INTS = frozenset({"uint16", "int32", "uint32", "int64", "uint64"})

#: Ops whose float output is bounded whatever their input (|y| <= 1, or a normalised row), or,
#: for Exp, is 0 or inf in float32 too for any input beyond the half range: the hazard stops there.
BOUNDED_OPS = frozenset({"Sigmoid", "Tanh", "Softmax", "HardSigmoid", "Sin", "Cos", "Erf", "Softsign",
                         "Sign", "LayerNormalization", "Exp"})


def kept_float32(node, fp32_ops) -> bool:
    """Whether `node` stays float32 at a half precision: its op type is listed in the pipeline's
    `fp32_ops`, or the node itself is (the import lists the products it makes of a Fourier
    transform, Graph.float32_nodes, as torch.autocast keeps stft and fft in float32: a 16-bit
    basis puts every weak bin of a spectrum under the rounding of the strong ones)."""
    return node.op_type in fp32_ops or node.name in fp32_ops


def gemm_operands(graph: Graph, node) -> list[int]:
    """Input positions of `node` that the GEMM template loads as operands (ops/matmul.py,
    ops/conv.py): MatMul's and Gemm's A and B, Conv's weight unless it is depthwise (a map
    kernel, ops/conv.py _conv_direct)."""
    if node.op_type in ("MatMul", "Gemm"):
        return [0, 1]
    if node.op_type == "Conv" and len(node.inputs) > 1:
        w = graph.tensors[node.inputs[1]]
        if len(w.shape) >= 3 and not (w.shape[1] == 1 and int(node.attrs.get("group", 1)) > 1):
            return [1]
    return []


def narrow_gemm_weights(graph: Graph, precision: str, fp32_ops=frozenset()) -> list[str]:
    """Rewire every constant float32 GEMM operand to a copy in the precision's half type (one copy
    per constant, however many GEMMs read it), except in ops of `fp32_ops` (they stay on the
    float32 template). Returns the names of the constants narrowed."""
    dtype = HALF_DTYPES[precision]
    np_dtype = np.dtype(dtype)  # "bfloat16" is ml_dtypes' (registered by dlcc.ir)
    narrowed: dict[str, str] = {}
    for node in graph.nodes:
        if kept_float32(node, fp32_ops):
            continue
        for k in gemm_operands(graph, node):
            name = node.inputs[k]
            t = graph.tensors.get(name) if name else None
            if t is None or t.value is None or t.dtype != "float32":
                continue
            if name not in narrowed:
                half = f"%{dtype}:{name}"
                graph.tensors[half] = Tensor(half, t.shape, dtype, t.value.astype(np_dtype))
                narrowed[name] = half
            node.inputs[k] = narrowed[name]
    return list(narrowed)


#: The largest finite value of each half type: a finite float beyond it rounds to inf when stored.
HALF_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38}


def _finite_range(t: Tensor) -> tuple[float, float] | None:
    """(min, max) of the finite values of constant float tensor `t`, or None where it has none.
    Two passes over the stored values; a copy without the infs and NaNs only where there are any
    (this runs over every weight of the model)."""
    v = np.asarray(t.value)
    if not v.size:
        return None
    lo, hi = float(v.min()), float(v.max())
    if np.isfinite(lo) and np.isfinite(hi):
        return lo, hi
    v = v[np.isfinite(v)]
    return (float(v.min()), float(v.max())) if v.size else None


def beyond_half(graph: Graph, dtype: str) -> set[str]:
    """The float tensors that may hold a finite value the half type `dtype` cannot, so that storing
    them would turn it into inf where onnxruntime's float32 holds it:
    - at float16, a Cast (or CastLike) to float of a WIDE_INTS integer (the fp16 fuzz run found a
      uint32 that wrapped, cast to float and stored as inf);
    - the output of an op that reads a constant beyond the type's largest finite value: an
      attention mask of float32's lowest, -3.4e38, through a Where or an Add, is beyond float16
      and bfloat16 alike (BERT with a batch row all padding, whose every score became -inf and
      whose Softmax then NaN, where float32 gives the mean of V);
    - whatever is computed from one of those before a BOUNDED_OPS op.
    Float graph inputs are assumed to be in range, as every mixed-precision runtime assumes; an
    integer's range is known from its type and a constant's from its values, so they are not.
    Nodes are in topological order (the import sorts them)."""
    top = HALF_MAX[dtype]
    wide: set[str] = set()
    ranges = {n: r for n, t in graph.tensors.items() if t.value is not None and t.dtype in ("float32", "float64")
              and (r := _finite_range(t)) is not None}
    big = {n for n, (lo, hi) in ranges.items() if max(-lo, hi) > top}
    for n in graph.nodes:
        ins = [graph.tensors[i] for i in n.inputs if i and i in graph.tensors]
        if n.op_type in ("Cast", "CastLike") and ins:
            made = (dtype == "float16" and ins[0].dtype in WIDE_INTS) or ins[0].name in wide or ins[0].name in big
        elif n.op_type == "Clip" and ins:
            # a bound of float32's lowest (or highest) clips nothing; a minimum above the range, or a
            # maximum below it, puts every value beyond it
            lo_b, hi_b = (n.inputs[1:3] + ["", ""])[:2]
            forced = (lo_b in ranges and ranges[lo_b][1] > top) or (hi_b in ranges and ranges[hi_b][0] < -top)
            made = forced or any(t.name in wide for t in ins)
        elif n.op_type in ("Max", "Min"):
            # Max keeps the larger operand: a constant counts only where it is beyond the range on the
            # side the op keeps (a Max with float32's lowest, RWKV's first state, keeps the other)
            made = any(t.name in wide or (t.name in big and (ranges[t.name][1] > top if n.op_type == "Max"
                                                             else ranges[t.name][0] < -top)) for t in ins)
        else:
            made = n.op_type not in BOUNDED_OPS and any(t.name in wide or t.name in big for t in ins)
        if made:
            wide.update(o for o in n.outputs if o and graph.tensors[o].dtype in ("float32", "float64"))
    return wide


def rounded_to_a_grid(graph: Graph, entries: dict) -> set[str]:
    """The tensors a Round reads, and those its input is computed from by elementwise ops and
    views, back to the first op of another kind: they stay float32. Why: quantized.py lowers
    QuantizeLinear and DynamicQuantizeLinear to round(x / scale), and an 8-bit quantization step
    is as fine as bfloat16's 8-bit significand, so x stored in bfloat16 moved by up to half a step
    and flipped a quantized value wherever it lay near a tie: ddddocr's dynamically quantized
    `common_old.onnx` was 0.61 off at bf16, 180 times its fp16 error, where rounding alone gives 8."""
    producer = {o: n for n in graph.nodes for o in n.outputs if o}
    grid: set[str] = set()
    todo = [n.inputs[0] for n in graph.nodes if n.op_type == "Round" and n.inputs and n.inputs[0]]
    while todo:
        t = todo.pop()
        if t in grid or t not in graph.tensors or graph.tensors[t].value is not None:
            continue
        grid.add(t)
        p = producer.get(t)
        entry = entries.get(id(p)) if p is not None else None
        if entry is not None and entry.category in (ELEMENTWISE, ALIAS):
            todo += [i for i in p.inputs if i]
    return grid


def narrow_activations(graph: Graph, precision: str, fp32_ops=frozenset()) -> tuple[list[str], dict[str, int], list[str]]:
    """Store float32 intermediates in the precision's half type where it is safe (module
    docstring). Returns the tensors narrowed; by op type, the nodes that kept a float activation
    float32 because they do not convert (or are in `fp32_ops`): what `inspect` lists; and the
    tensors kept float32 because they may hold a value the half type cannot (beyond_half).

    A tensor qualifies when it is computed (not a constant), is not a graph input or output, is
    not a statistic (below), may fit the half type, and every node that writes or reads it is
    `half_io` and not in `fp32_ops`. Views (ALIAS ops: Reshape, Squeeze, ...) share their input's bytes, so a view and
    its source form one class that is narrowed whole or not at all."""
    dtype = HALF_DTYPES[precision]
    parent: dict[str, str] = {}

    def find(t: str) -> str:
        while parent.get(t, t) != t:
            t = parent[t]
        return t

    entries = {id(n): lookup(n.op_type, graph.opset, n.domain) for n in graph.nodes}
    users: dict[str, list] = {}
    for n in graph.nodes:
        for t in [i for i in n.inputs if i] + [o for o in n.outputs if o]:
            users.setdefault(t, []).append(n)
        entry = entries[id(n)]
        if entry is not None and entry.category == ALIAS and n.inputs and n.outputs and n.outputs[0]:
            parent[find(n.outputs[0])] = find(n.inputs[0])

    def converts(n) -> bool:
        entry = entries[id(n)]
        return entry is not None and entry.half_io and not kept_float32(n, fp32_ops)

    # Statistics: a reduction's smaller output (a mean, a sum of squares) and what elementwise
    # ops compute from statistics and constants alone (E[x]^2, E[x^2] - E[x]^2, + eps, sqrt).
    # They are a few bytes per row, and the terms a variance cancels, where 16-bit storage would
    # lose every digit: they stay float32, as autocast keeps reductions' results. Softmax and
    # LayerNorm outputs are full-size and do not count.
    stats: set[str] = set()
    for n in graph.nodes:
        entry = entries[id(n)]
        if entry is None or not n.inputs or not n.inputs[0]:
            continue
        computed = [i for i in n.inputs if i and graph.tensors[i].value is None]
        if entry.category == REDUCTION:
            small = all(graph.tensors[o].size < graph.tensors[n.inputs[0]].size for o in n.outputs if o)
        else:
            small = entry.category in (ELEMENTWISE, ALIAS) and bool(computed) and all(i in stats for i in computed)
        if small:
            stats.update(o for o in n.outputs if o)

    grid = rounded_to_a_grid(graph, entries)
    wide = beyond_half(graph, dtype)
    boundary = set(graph.inputs) | set(graph.outputs)
    classes: dict[str, list[str]] = {}
    for name in users:
        classes.setdefault(find(name), []).append(name)
    narrowed, blockers, kept_wide = [], {}, []
    for members in classes.values():
        ts = [graph.tensors.get(m) for m in members]
        if not all(t is not None and t.dtype == "float32" and t.value is None for t in ts):
            continue
        if any(t.name in boundary or t.name in stats or t.name in grid for t in ts):
            continue
        if any(t.name in wide for t in ts):
            kept_wide += members
            continue
        blocking = [n for t in ts for n in users[t.name] if not converts(n)]
        if blocking:
            for n in blocking:
                blockers.setdefault(n.op_type, set()).add(n.name)
            continue
        for t in ts:
            t.dtype = dtype
        narrowed += members
    return narrowed, {op: len(names) for op, names in sorted(blockers.items())}, kept_wide
