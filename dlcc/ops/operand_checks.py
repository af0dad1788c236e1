"""More checks against the ONNX spec (registered with ops/checks.py's `@check`): flags and string
attributes outside their values, operands of the wrong size, and attribute combinations the spec
rules out.

Why: an audit of malformed single-op models against onnxruntime found dlcc running models
onnxruntime refuses, and some of those answers were garbage, not just lenient:
- a Clip bound or a Pad constant_value given as an empty tensor, a PRelu slope or a Gemm C that
  does not broadcast to the output, a Conv bias or an InstanceNormalization scale shorter than
  the channels: the kernels read past the end of the constant;
- a 0/1 flag given as 2 read as true here and as something else there (a Reduce with
  `noop_with_empty_axes: 2` reduced nothing, onnxruntime everything; TopK `largest: 2`);
- a string attribute outside its values (auto_pad "FOO", Gelu approximate "foo") read as the
  default.
Each is now one error naming the node and the rule, before anything is compiled.
"""
from __future__ import annotations

import numpy as np

from .checks import _shape, _values, check

_REDUCES = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
            "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")
_POOLS = ("MaxPool", "AveragePool", "LpPool")

#: Attributes that are flags: 0 or 1 only (onnxruntime refuses other values).
FLAGS = {
    **{op: ("keepdims", "noop_with_empty_axes") for op in _REDUCES},
    "ArgMax": ("keepdims", "select_last_index"), "ArgMin": ("keepdims", "select_last_index"),
    "CumSum": ("exclusive", "reverse"), "CumProd": ("exclusive", "reverse"),
    "TopK": ("largest", "sorted"), "Mod": ("fmod",), "Trilu": ("upper",), "Gemm": ("transA", "transB"),
    "IsInf": ("detect_negative", "detect_positive"), "Resize": ("exclude_outside", "antialias"),
    "MaxPool": ("ceil_mode", "storage_order"), "AveragePool": ("ceil_mode", "count_include_pad"),
    "LpPool": ("ceil_mode",), "LSTM": ("input_forget", "layout"), "GRU": ("linear_before_reset", "layout"),
    "RNN": ("layout",), "DFT": ("inverse", "onesided"), "STFT": ("onesided",), "Unique": ("sorted",),
    "NonMaxSuppression": ("center_point_box",),
}

_AUTO_PAD = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
#: String attributes and the values the spec allows.
CHOICES = {
    **{op: {"auto_pad": _AUTO_PAD} for op in ("Conv", "ConvTranspose", "ConvInteger", "QLinearConv") + _POOLS},
    "Gelu": {"approximate": ("none", "tanh")},
    "Pad": {"mode": ("constant", "reflect", "edge", "wrap")},
    "Resize": {"mode": ("nearest", "linear", "cubic"),
               "coordinate_transformation_mode": ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel",
                                                  "align_corners", "asymmetric", "tf_half_pixel_for_nn",
                                                  "tf_crop_and_resize"),
               "nearest_mode": ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"),
               "keep_aspect_ratio_policy": ("stretch", "not_larger", "not_smaller")},
    "Upsample": {"mode": ("nearest", "linear", "bilinear", "trilinear")},
    "ScatterElements": {"reduction": ("none", "add", "mul", "max", "min")},
    "ScatterND": {"reduction": ("none", "add", "mul", "max", "min")},
    "DepthToSpace": {"mode": ("DCR", "CRD")},
    "GridSample": {"mode": ("bilinear", "nearest", "bicubic", "linear", "cubic"),
                   "padding_mode": ("zeros", "border", "reflection")},
    "BitShift": {"direction": ("LEFT", "RIGHT")},
    "RoiAlign": {"mode": ("avg", "max"), "coordinate_transformation_mode": ("half_pixel", "output_half_pixel")},
}

#: Inputs that hold one value (a scalar, or a vector of one element): {op: {input index: name}}.
ONE_VALUE = {
    "Trilu": {1: "k"}, "TopK": {1: "K"}, "Clip": {1: "min", 2: "max"}, "Pad": {2: "constant_value"},
    "Range": {0: "start", 1: "limit", 2: "delta"}, "OneHot": {1: "depth"}, "CumSum": {1: "axis"},
    "CumProd": {1: "axis"},
}
#: Inputs that are 1-D vectors (axes, shapes, sizes, pads, starts...).
VECTOR = {
    "Squeeze": {1: "axes"}, "Unsqueeze": {1: "axes"}, **{op: {1: "axes"} for op in _REDUCES},
    "Slice": {1: "starts", 2: "ends", 3: "axes", 4: "steps"}, "Reshape": {1: "shape"}, "Expand": {1: "shape"},
    "Tile": {1: "repeats"}, "Split": {1: "split"}, "Pad": {1: "pads", 3: "axes"}, "ConstantOfShape": {0: "input"},
}


def _attr(n, name, default=None):
    return n.attrs.get(name, default)


@check(*FLAGS)
def _flags(graph, n):
    return [f"{name} {v} is not 0 or 1" for name in FLAGS[n.op_type]
            if isinstance(v := _attr(n, name), (int, np.integer)) and int(v) not in (0, 1)]


@check(*CHOICES)
def _choices(graph, n):
    return [f"{name} {v!r} is not one of {', '.join(allowed)}" for name, allowed in CHOICES[n.op_type].items()
            if (v := _attr(n, name)) is not None and v not in allowed]


def _operand(graph, n, k):
    return _shape(graph, n.inputs[k]) if len(n.inputs) > k and n.inputs[k] else None


@check(*ONE_VALUE)
def _one_value(graph, n):
    return [f"{name} has shape {list(s)}; it must hold one value (a scalar)" for k, name in ONE_VALUE[n.op_type].items()
            if (s := _operand(graph, n, k)) is not None and (len(s) > 1 or int(np.prod(s)) != 1)]


@check(*VECTOR)
def _vector(graph, n):
    """1-D, or 0-D where the input is `axes`: onnx's own function bodies (AffineGrid's) unsqueeze by
    a scalar axis, and onnxruntime takes it as one axis."""
    return [f"{name} has shape {list(s)}; it must be a 1-D vector" for k, name in VECTOR[n.op_type].items()
            if (s := _operand(graph, n, k)) is not None and len(s) != 1 and not (name == "axes" and len(s) == 0)]


@check("Slice")
def _slice_lengths(graph, n):
    """starts, ends (and axes, steps where given) name the same axes, one entry each."""
    lens = {name: s[0] for k, name in VECTOR["Slice"].items()
            if (s := _operand(graph, n, k)) is not None and len(s) == 1 and s[0] is not None}
    if len(set(lens.values())) > 1:
        return ["starts, ends, axes and steps differ in length: "
                + ", ".join(f"{name} {length}" for name, length in lens.items())]
    return []


def _broadcasts_to(small, big) -> bool:
    """`small` broadcasts to `big` one way (numpy's rule, `big` unchanged)."""
    if len(small) > len(big):
        return False
    return all(s in (1, b) for s, b in zip(small[::-1], big[::-1]) if None not in (s, b))


@check("PRelu")
def _prelu(graph, n):
    """The slope broadcasts numpy's way (an older model's slope along the channels was aligned
    at import: frontend.upgrade_legacy_opset)."""
    x, slope = _operand(graph, n, 0), _operand(graph, n, 1)
    if x is None or slope is None or _broadcasts_to(slope, x):
        return []
    return [f"the slope {list(slope)} does not broadcast to the input {list(x)}"]


@check("Gemm")
def _gemm_c(graph, n):
    a, b, c = (_operand(graph, n, k) for k in (0, 1, 2))
    if a is None or b is None or c is None or len(a) != 2 or len(b) != 2:
        return []
    m = a[1] if int(_attr(n, "transA", 0)) else a[0]
    nn = b[0] if int(_attr(n, "transB", 0)) else b[1]
    return [] if _broadcasts_to(c, (m, nn)) else [f"C {list(c)} does not broadcast to the output [{m}, {nn}]"]


@check("Conv", "ConvTranspose")
def _conv_bias(graph, n):
    w, bias = _operand(graph, n, 1), _operand(graph, n, 2)
    if w is None or bias is None or len(w) < 2:
        return []
    m = w[0] if n.op_type == "Conv" else w[1] * int(_attr(n, "group", 1))
    return [] if tuple(bias) == (m,) else [f"the bias {list(bias)} must hold one value per output channel ({m})"]


@check("InstanceNormalization")
def _instance_norm(graph, n):
    x = _operand(graph, n, 0)
    if x is None or len(x) < 2:
        return []
    return [f"{name} {list(s)} must hold one value per channel ({x[1]})"
            for k, name in ((1, "scale"), (2, "B")) if (s := _operand(graph, n, k)) is not None and tuple(s) != (x[1],)]


@check("Conv", "ConvTranspose", *_POOLS)
def _auto_pad_with_pads(graph, n):
    auto = _attr(n, "auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER", "VALID") and any(int(p) for p in _attr(n, "pads", ()) or ()):
        return [f"pads {list(_attr(n, 'pads'))} are given with auto_pad {auto!r}; the spec allows one or the other"]
    return []


@check(*_POOLS)
def _pads_below_kernel(graph, n):
    """A pad as long as the window would make a window of padding alone (onnxruntime refuses it)."""
    k, pads = _attr(n, "kernel_shape"), _attr(n, "pads")
    if not k or not pads or len(pads) != 2 * len(k):
        return []
    if any(int(p) >= int(kk) for p, kk in zip(pads, list(k) * 2)):
        return [f"pads {list(pads)} must each be smaller than the kernel_shape {list(k)} along their axis"]
    return []


@check("ConvTranspose")
def _output_padding(graph, n):
    op, strides = _attr(n, "output_padding"), _attr(n, "strides")
    dil = _attr(n, "dilations") or [1] * len(op or ())
    if not op:
        return []
    strides = strides or [1] * len(op)
    if len(strides) != len(op) or len(dil) != len(op):
        return []
    bad = [j for j, (p, s, d) in enumerate(zip(op, strides, dil)) if int(p) >= max(int(s), int(d))]
    return [f"output_padding {list(op)} must be smaller than max(stride, dilation) along axis {bad[0]}"] if bad else []


@check("Mod")
def _mod(graph, n):
    x = graph.tensors.get(n.inputs[0]) if n.inputs else None
    out = []
    if (graph.opset < 28 and x is not None and x.dtype in ("float32", "float16", "bfloat16", "float64")
            and int(_attr(n, "fmod", 0)) == 0):  # (Mod-28 defines fmod 0 on floats: A - floor(A / B) * B)
        out.append("fmod 0 on floating-point inputs: the spec requires fmod 1 for them before opset 28")
    return out + _zero_divisor(graph, n)


@check("Div")
def _zero_divisor(graph, n):
    """An integer divisor known to hold 0 (onnxruntime refuses the model: C leaves it undefined)."""
    d = _values(graph, n.inputs[1] if len(n.inputs) > 1 else "", "iu")
    if d is not None and d.size and not d.all():
        return [f"the integer divisor holds 0 (at flat position {int(np.flatnonzero(d == 0)[0])})"]
    return []


@check("Dropout")
def _dropout_ratio(graph, n):
    r = _attr(n, "ratio")
    if r is None and len(n.inputs) > 1 and n.inputs[1]:
        v = _values(graph, n.inputs[1], "f")
        r = float(v[0]) if v is not None and v.size == 1 else None
    return [f"ratio {r:g} is outside [0, 1)"] if r is not None and not 0.0 <= float(r) < 1.0 else []


@check("Split")
def _num_outputs(graph, n):
    k = _attr(n, "num_outputs")
    if k is not None and int(k) != len(n.outputs):
        return [f"num_outputs {k} differs from the node's {len(n.outputs)} outputs"]
    return []


@check("Squeeze", "Unsqueeze")
def _squeeze_axes_attr(graph, n):
    """Before opset 13 the axes are an attribute: within the rank (the output's, for Unsqueeze)."""
    axes, x = _attr(n, "axes"), _operand(graph, n, 0)
    if axes is None or x is None or isinstance(axes, (str, bytes)):
        return []
    r = len(x) + (len(axes) if n.op_type == "Unsqueeze" else 0)
    bad = [int(a) for a in axes if not -r <= int(a) < r]
    return [f"axes {list(axes)}: {bad[0]} is outside [-{r}, {r})"] if bad else []
