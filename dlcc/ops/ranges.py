"""Value ranges of integer tensors computed inside a model, for the index checks.

Why: every Gather-family index that the model computes is checked on the device
(kernels/index_check.py), one launch per check. Some indices are in range by construction: a
Range over a dim, a Where between two such values, a Min/Max clamp. A GroupQueryAttention's
present is gathered at indices of that kind, in every layer of an LLM, at every decode step.
Where the interval arithmetic below proves every value of an index within its bound, the check
would never fire, and is not launched.

The analysis is conservative: an op it does not know, a graph input, or a value it cannot bound
gives None (unknown), and the check stays.
"""
from __future__ import annotations

import numpy as np

#: Ops whose output values are values of their first input (views, copies, broadcasts).
_PASS = {"Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Expand", "Transpose", "Tile", "Slice",
         "Gather", "GatherElements", "GatherND"}
#: How deep the analysis looks back from an index (a chain of views and arithmetic is short).
_DEPTH = 24


def value_range(ctx, name: str) -> tuple[int, int] | None:
    """(lowest, highest) value integer tensor `name` can hold: its type's whole range where the
    analysis knows nothing better; None for a tensor that is not an integer one."""
    if ctx.dtype(name) not in ("int64", "int32"):
        return None
    if ctx.producers is None:
        ctx.producers = {o: n for n in ctx.graph.nodes for o in n.outputs if o}
    return _range(ctx, ctx.producers, name, _DEPTH, {})


def _full(ctx, name: str) -> tuple[int, int]:
    info = np.iinfo(np.int32 if ctx.dtype(name) == "int32" else np.int64)
    return int(info.min), int(info.max)


def _range(ctx, producers, name: str, depth: int, memo: dict) -> tuple[int, int]:
    """The range of `name`, a tensor of int64, int32 or bool values. A value past the type's
    range would wrap on the device, so a result that leaves it is the whole range."""
    if name in memo:
        return memo[name]
    full = _full(ctx, name) if ctx.dtype(name) in ("int64", "int32") else (0, 1)
    memo[name] = full  # (a DAG has no cycle; this bounds the work)
    value = ctx.const(name)
    node = producers.get(name)
    if value is not None:
        v = np.asarray(value)
        out = (int(v.min()), int(v.max())) if v.size and v.dtype.kind in "iub" else full
    elif node is None or depth <= 0 or ctx.dtype(name) not in ("int64", "int32"):
        out = full
    else:
        out = _of_node(ctx, producers, node, depth, memo) or full
    if out[0] < full[0] or out[1] > full[1]:
        out = full
    memo[name] = out
    return out


def _of_node(ctx, producers, node, depth: int, memo: dict) -> tuple[int, int] | None:
    """The range of the (first) output of `node` from its inputs' ranges; None: not known."""

    def arg(i: int) -> tuple[int, int]:
        return _range(ctx, producers, node.inputs[i], depth - 1, memo)

    op = node.op_type
    if op in _PASS:
        return arg(0)
    if op == "Cast":
        return arg(0) if ctx.dtype(node.inputs[0]) in ("int64", "int32", "bool") else None
    if op == "Range":
        start, limit, delta = (ctx.const(i) for i in node.inputs[:3])
        if start is None or limit is None or delta is None:
            return None
        values = np.arange(int(start), int(limit), int(delta))
        return (int(values.min()), int(values.max())) if values.size else None
    if op in ("Add", "Sub", "Mul", "Min", "Max") and len(node.inputs) >= 2:
        out = arg(0)
        for i in range(1, len(node.inputs)):
            out = _combine(op, out, arg(i))
        return out
    if op == "Where":
        a, b = arg(1), arg(2)
        return min(a[0], b[0]), max(a[1], b[1])
    if op == "Concat":
        ranges = [arg(i) for i in range(len(node.inputs)) if node.inputs[i]]
        return (min(r[0] for r in ranges), max(r[1] for r in ranges)) if ranges else None
    return None


def _combine(op: str, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    if op == "Add":
        return a[0] + b[0], a[1] + b[1]
    if op == "Sub":
        return a[0] - b[1], a[1] - b[0]
    if op == "Min":
        return min(a[0], b[0]), min(a[1], b[1])
    if op == "Max":
        return max(a[0], b[0]), max(a[1], b[1])
    corners = [x * y for x in a for y in b]  # Mul
    return min(corners), max(corners)
