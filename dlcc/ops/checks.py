"""Attribute checks against the ONNX spec, before any pass runs.

Why here and not in each lowering: an attribute outside the spec reached the lowerings as a raw
Python exception (Conv `group: 0` divided by zero), a kernel that never finished (`group: -1`
made a loop bound negative) or a wrong answer without an error (BatchNormalization with
`var + epsilon` zero: onnxruntime and dlcc disagree on which inf or NaN comes out). Each check
names the node, the attribute and the rule it breaks, and `check_attributes` reports every
problem in the model at once, as the unsupported-ops error does.

A check sees the node and the graph (shapes where import inferred them, constant values); it
returns the problems it found as strings. One function per op type, registered with `@check`.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import ModelError

_CHECKS: dict[str, list[Callable]] = {}


def check(*op_types: str):
    def deco(fn):
        for op in op_types:
            _CHECKS.setdefault(op, []).append(fn)
        return fn
    return deco


def check_attributes(graph, path) -> None:
    """Raise one ModelError listing every attribute of the model that breaks the spec."""
    problems = []
    for n in graph.nodes:
        for fn in _CHECKS.get(n.op_type, ()):
            for why in fn(graph, n):
                problems.append(f"{n.op_type} node {n.name!r}: {why}")
    if problems:
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise ModelError(f"{path}: attributes outside the ONNX spec:\n  " + "\n  ".join(problems[:20]) + more)


def _ints(n, name, default=None):
    v = n.attrs.get(name, default)
    return None if v is None else [int(x) for x in (v if isinstance(v, (list, tuple)) else [v])]


def _shape(graph, name):
    t = graph.tensors.get(name) if name else None
    return None if t is None or t.shape is None else tuple(t.shape)


def _values(graph, name, kinds: str = "iu"):
    """The constant value of input `name` as a flat array, where it is one and of a numpy dtype
    kind in `kinds` (integers by default); None otherwise (a complex K or string sizes are the
    dtype checks' business, not a reason to crash here)."""
    t = graph.tensors.get(name) if name else None
    if t is None or t.value is None or np.asarray(t.value).dtype.kind not in kinds:
        return None
    return np.asarray(t.value).reshape(-1)


def _at_least(n, name, least, default=None) -> list[str]:
    v = _ints(n, name, default)
    if v is not None and any(x < least for x in v):
        shown = n.attrs.get(name, default)
        return [f"{name} {list(shown) if isinstance(shown, (list, tuple)) else shown} must be at least {least}"
                + (" in every entry" if isinstance(shown, (list, tuple)) else "")]
    return []


def _axis(graph, n, name="axis", default=None, rank_of=0, extra=0) -> list[str]:
    """An axis attribute within [-rank, rank) of input `rank_of` (rank + `extra` for ops that
    insert one)."""
    if name not in n.attrs and default is None:
        return []
    s = _shape(graph, n.inputs[rank_of]) if len(n.inputs) > rank_of else None
    if s is None:
        return []
    r = len(s) + extra
    a = int(n.attrs.get(name, default))
    if not -r <= a < max(r, 1):
        return [f"{name} {a} is outside [-{r}, {r}) for a rank-{len(s)} input"]
    return []


def _window_lengths(n, nd: int) -> list[str]:
    """A windowed op's per-axis attributes have one entry per spatial axis (pads two)."""
    out = []
    for name, per in (("kernel_shape", 1), ("strides", 1), ("dilations", 1), ("pads", 2), ("output_padding", 1),
                      ("output_shape", 1)):
        v = _ints(n, name)
        if v is not None and len(v) != per * nd:
            out.append(f"{name} {v} has {len(v)} entries for {nd} spatial axes (expected {per * nd})")
    return out


@check("Conv", "ConvTranspose")
def _conv(graph, n):
    out = _at_least(n, "group", 1, 1) + _at_least(n, "strides", 1) + _at_least(n, "dilations", 1)
    out += _at_least(n, "pads", 0) + _at_least(n, "kernel_shape", 1) + _at_least(n, "output_padding", 0)
    g = _ints(n, "group", 1)[0]
    x, w = _shape(graph, n.inputs[0]), _shape(graph, n.inputs[1] if len(n.inputs) > 1 else "")
    if x is not None and w is not None and len(w) != len(x):
        out.append(f"the weight's rank {len(w)} differs from the input's {len(x)}")
    if x is not None and len(x) >= 3:
        out += _window_lengths(n, len(x) - 2)
    if g >= 1 and x is not None and w is not None and len(x) >= 3 and len(w) == len(x):
        cin = x[1]
        if cin % g:
            out.append(f"group {g} does not divide the input's {cin} channels")
        elif n.op_type == "Conv" and w[1] * g != cin:
            out.append(f"the weight's {w[1]} input channels x group {g} is not the input's {cin} channels")
        elif n.op_type == "Conv" and w[0] % g:
            out.append(f"group {g} does not divide the weight's {w[0]} output channels")
        if any(d < 1 for d in w[2:]):
            out.append(f"the weight's kernel dims {list(w[2:])} must each be at least 1")
        ks = _ints(n, "kernel_shape")
        if ks is not None and tuple(ks) != tuple(w[2:]):
            out.append(f"kernel_shape {ks} differs from the weight's kernel dims {list(w[2:])}")
    return out


@check("MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool", "Conv",
       "ConvTranspose", "BatchNormalization", "InstanceNormalization", "LRN")
def _spatial_rank(graph, n):
    """These ops take N x C x D1 ... Dn: a rank-1 input (onnxruntime refuses it) was folded by
    onnx.reference into a shape nothing downstream expected."""
    x = _shape(graph, n.inputs[0]) if n.inputs else None
    least = 2 if n.op_type == "BatchNormalization" else 3
    return [] if x is None or len(x) >= least else [f"the input has rank {len(x)}; it must be at least {least} "
                                                    "(N x C x D1 ...)"]


@check("MaxPool", "AveragePool", "LpPool")
def _pool(graph, n):
    if "kernel_shape" not in n.attrs:
        return ["kernel_shape is required"]
    out = (_at_least(n, "kernel_shape", 1) + _at_least(n, "strides", 1) + _at_least(n, "dilations", 1)
           + _at_least(n, "pads", 0))
    x = _shape(graph, n.inputs[0]) if n.inputs else None
    nd = len(x) - 2 if x is not None and len(x) >= 3 else len(_ints(n, "kernel_shape"))
    return out + _window_lengths(n, nd)


@check("LSTM", "GRU", "RNN")
def _rnn(graph, n):
    out = []
    if "hidden_size" not in n.attrs:
        out.append("hidden_size is required")
    else:
        out += _at_least(n, "hidden_size", 1)
    d = n.attrs.get("direction", "forward")  # text: frontend.node_attributes decodes strings
    if d not in ("forward", "reverse", "bidirectional"):
        out.append(f"direction {d!r} is not forward, reverse or bidirectional")
    return out


@check("BatchNormalization")
def _batchnorm(graph, n):
    eps = float(n.attrs.get("epsilon", 1e-5))
    if not np.isfinite(eps):
        return [f"epsilon {eps} is not finite"]
    var = _values(graph, n.inputs[4] if len(n.inputs) > 4 else "", "fiu")
    if var is not None:
        bad = np.flatnonzero(~(var.astype(np.float64) + eps > 0))
        if bad.size:
            c = int(bad[0])
            return [f"var + epsilon is not positive for {bad.size} channel(s) (channel {c}: var "
                    f"{float(var[c]):g}, epsilon {eps:g}): the output would be inf or NaN"]
    return []


@check("Softmax", "LogSoftmax", "Hardmax", "Flatten", "Concat", "Gather", "GatherElements", "Split", "CumSum",
       "ArgMax", "ArgMin", "TopK", "LayerNormalization", "Compress", "ScatterElements")
def _axis_attr(graph, n):
    defaults = {"Softmax": -1 if graph.opset >= 13 else 1, "LogSoftmax": -1 if graph.opset >= 13 else 1,
                "Hardmax": -1 if graph.opset >= 13 else 1, "Flatten": 1, "Gather": 0, "GatherElements": 0,
                "Split": 0, "ArgMax": 0, "ArgMin": 0, "TopK": -1, "LayerNormalization": -1}
    return _axis(graph, n, "axis", defaults.get(n.op_type), extra=1 if n.op_type == "Flatten" else 0)


@check("CumSum", "CumProd")
def _cumulative_axis(graph, n):
    """The axis is an input here, not an attribute: one value within [-rank, rank)."""
    v, s = _values(graph, n.inputs[1] if len(n.inputs) > 1 else "", "iu"), _shape(graph, n.inputs[0])
    if v is None or s is None or v.size != 1:  # (more values than one: operand_checks.ONE_VALUE says so)
        return []
    a, r = int(v.reshape(-1)[0]), len(s)
    return [f"axis {a} is outside [-{r}, {r}) for a rank-{r} input"] if not -r <= a < r else []


@check("Split")
def _split(graph, n):
    out = []
    sizes = _ints(n, "split")
    if sizes is None and len(n.inputs) > 1 and n.inputs[1]:
        v = _values(graph, n.inputs[1])
        sizes = None if v is None else [int(x) for x in v]
    if sizes is not None and any(v < 0 for v in sizes):
        out.append(f"split sizes {sizes} must not be negative")
    return out


@check("TopK")
def _topk(graph, n):
    k = _values(graph, n.inputs[1] if len(n.inputs) > 1 else "")
    if k is not None and k.size == 1 and int(k[0]) < 0:
        return [f"K {int(k[0])} must not be negative"]
    return []


@check("Resize", "Upsample")
def _resize(graph, n):
    problems = []
    # scales are input 1 of Upsample and Resize-10, input 2 from Resize-11 on (input 1 is roi)
    k = 2 if n.op_type == "Resize" and graph.opset >= 11 else 1
    v = _values(graph, n.inputs[k] if len(n.inputs) > k else "", "f")
    if v is not None and v.size:
        v = v.astype(np.float64)
        if not np.all(np.isfinite(v) & (v > 0)):
            problems.append(f"scales {v.tolist()} must be finite and positive")
    axes, x = _ints(n, "axes"), _shape(graph, n.inputs[0])
    if axes is not None and x is not None:
        r = len(x)
        norm = [a + r if a < 0 else a for a in axes]
        if any(not 0 <= a < r for a in norm) or len(set(norm)) != len(norm):
            problems.append(f"axes {axes} must be distinct axes of a rank-{r} input")
    return problems


@check("Reshape")
def _reshape(graph, n):
    az = int(n.attrs.get("allowzero", 0))
    return [] if az in (0, 1) else [f"allowzero {az} is not 0 or 1"]


@check("DepthToSpace", "SpaceToDepth")
def _blocksize(graph, n):
    out = _at_least(n, "blocksize", 1, 1)
    b, x = _ints(n, "blocksize", 1)[0], _shape(graph, n.inputs[0])
    if x is not None and len(x) != 4:
        out.append(f"the input has rank {len(x)}, not 4 (N, C, H, W)")
    if not out and x is not None and len(x) == 4:
        if n.op_type == "DepthToSpace" and x[1] % (b * b):
            out.append(f"blocksize {b}: the input's {x[1]} channels are not a multiple of {b * b}")
        if n.op_type == "SpaceToDepth" and (x[2] % b or x[3] % b):
            out.append(f"blocksize {b} does not divide the input's height and width {list(x[2:])}")
    return out


@check("LRN")
def _lrn(graph, n):
    return _at_least(n, "size", 1, 1)


@check("Transpose")
def _transpose(graph, n):
    x = _shape(graph, n.inputs[0]) if n.inputs else None
    perm = _ints(n, "perm")
    if x is None or perm is None or sorted(perm) == list(range(len(x))):
        return []
    return [f"perm {perm} is not a permutation of the input's {len(x)} axes"]


@check("GatherElements", "ScatterElements")
def _same_rank(graph, n):
    """data and indices have the same rank (the spec's rule; the kernel indexes one with the other's
    coordinates)."""
    x, i = (_shape(graph, n.inputs[k]) if len(n.inputs) > k else None for k in (0, 1))
    if x is None or i is None:
        return []
    if len(x) != len(i):
        return [f"indices of rank {len(i)} for data of rank {len(x)}: they must have the same rank"]
    # Along the axis the indices may have any length; across it they must fit inside data (the
    # kernels index one with the other's coordinates there), as onnxruntime checks.
    a = int(n.attrs.get("axis", 0))
    a = a + len(x) if a < 0 else a
    over = [j for j, (d, k) in enumerate(zip(x, i)) if j != a and None not in (d, k) and k > d]
    if over:
        return [f"indices {list(i)} are longer than data {list(x)} along axis {over[0]}, which is not the "
                f"{n.op_type}'s axis {a}"]
    return []


@check("GatherND")
def _gather_nd(graph, n):
    x, i = (_shape(graph, n.inputs[k]) if len(n.inputs) > k else None for k in (0, 1))
    b = int(n.attrs.get("batch_dims", 0))
    if x is None or i is None:
        return []
    if not 0 <= b < min(len(x), len(i)):
        return [f"batch_dims {b} must lie in [0, {min(len(x), len(i))})"]
    if not i or not 1 <= i[-1] <= len(x) - b:
        return [f"index tuples of {i[-1] if i else 0} components for data of rank {len(x)} with batch_dims {b}"]
    return []


from . import operand_checks  # noqa: E402,F401  (registers more checks with @check)
