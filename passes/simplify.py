"""Graph simplification before lowering: drop nodes nothing needs, and compute each common
subexpression once."""
from __future__ import annotations

import struct

import numpy as np

from . import CompileState, register_pass

#: Constants up to this many elements are compared by value (larger ones by name: hashing every
#: weight would cost more than the rare equal pair saves).
_SMALL_CONSTANT = 4096


@register_pass("simplify", before=("lower",))
def simplify(state: CompileState, opts) -> None:
    """Merge common subexpressions, then remove dead nodes (never fuse or lower what no output
    needs — an NNFusion pitfall)."""
    g = state.graph
    merged = _merge_common(g)
    live = set(g.outputs)
    kept = []
    for node in reversed(g.nodes):
        if any(o in live for o in node.outputs if o):
            kept.append(node)
            live.update(i for i in node.inputs if i)
    removed = len(g.nodes) - len(kept)
    g.nodes = list(reversed(kept))
    if merged:
        state.log.append(f"simplify: {merged} node(s) computed an expression another node computes; merged")
    if removed:
        state.log.append(f"simplify: removed {removed} dead node(s)")


def _merge_common(g) -> int:
    """Common subexpression elimination: a node with the op, attributes and inputs of an earlier
    one (constants compared by value) reads that node's outputs instead, and is dropped. Why:
    rewrites made node by node repeat themselves. Each GroupQueryAttention layer of an LLM
    computes the same positions and run-time checks from the same sequence lengths, and onnx's
    folding leaves each layer its own copies of the constants, so neither onnxruntime's own
    elimination nor anything later sees that they are one computation. A node that writes a
    graph output, or that keeps float32 at a half precision where the other does not, is kept."""
    canon: dict[str, str] = {}  # tensor -> the tensor it equals
    by_value: dict[tuple, str] = {}

    def rep(t: str) -> str:
        if not t:
            return t
        t = canon.get(t, t)
        tt = g.tensors.get(t)
        if tt is not None and tt.value is not None and tt.value.size <= _SMALL_CONSTANT:
            v = np.ascontiguousarray(tt.value)
            return by_value.setdefault((tt.dtype, tuple(tt.shape), v.tobytes()), t)
        return t

    outputs = set(g.outputs) | set(g.output_alias)
    seen: dict[tuple, object] = {}
    kept, merged = [], 0
    for node in g.nodes:
        node.inputs = [rep(i) for i in node.inputs]
        key = None
        if "Random" not in node.op_type and not any(o in outputs for o in node.outputs if o):
            key = (node.domain, node.op_type, tuple(node.inputs), _freeze(node.attrs),
                   tuple(bool(o) for o in node.outputs), node.name in g.float32_nodes)
        first = seen.get(key) if key is not None else None
        if first is not None:
            for mine, theirs in zip(node.outputs, first.outputs):
                if mine:
                    canon[mine] = theirs
            merged += 1
            continue
        if key is not None:
            seen[key] = node
        kept.append(node)
    g.nodes = kept
    return merged


def _freeze(v):
    """A hashable form of an attribute value that two values share only when they are equal
    (floats by their bits: 0.0 and -0.0 differ, NaN equals NaN; arrays by dtype, shape and
    bytes); a value of an unknown kind equals nothing else."""
    if isinstance(v, dict):
        return ("dict", tuple(sorted((k, _freeze(x)) for k, x in v.items())))
    if isinstance(v, (list, tuple)):
        return ("seq", tuple(_freeze(x) for x in v))
    if isinstance(v, np.ndarray):
        return ("nd", v.dtype.str, v.shape, np.ascontiguousarray(v).tobytes())
    if isinstance(v, (float, np.floating)):
        return ("f", struct.pack("<d", float(v)) if v == v else b"nan")
    if isinstance(v, (bool, int, str, bytes, np.integer)):
        return (type(v).__name__, v)
    return ("id", id(v))
