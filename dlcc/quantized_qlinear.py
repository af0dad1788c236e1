"""com.microsoft's QLinearSoftmax and QLinearAveragePool, rewritten into float32 arithmetic at import as
dlcc/quantized.py rewrites the other quantization ops: what onnxruntime's CPU kernels compute
(contrib_ops/cpu/quantization/qlinear_softmax.cc and qlinear_pool.cc, source read), step for step.

QLinearSoftmax (what `quantize_static(quant_format=QOperator)` writes for a transformer's
attention):
  - a 256-entry float table, built once from x_scale and the reduced length D:
    T[i] = float(exp((i − 255 + s) · x_scale)) in double, with s = max(0, log(FLT_MAX / D) − 5) / x_scale,
    so that a sum of D entries cannot overflow;
  - each row's values are looked up at 255 + (x − max(x)) (the int8 kernel's index arithmetic is
    the same lookup), summed, and each becomes round(T · floor(1 / y_scale) / sum) + y_zp.
The sum is the one step dlcc does not take in onnxruntime's order (a sequential float loop there,
dlcc's reduction here), so the two may differ in its last bit and a quotient on a rounding tie
may round the other way: verify's judge accepts exactly that (dlcc/quant_judge.py, with
`softmax_before_rounding` as onnxruntime's float value). Results past the type's range (a
probability of 1 is 256 − 128 steps with the usual int8 y_scale 1/256 and y_zp −128) are clamped,
as onnxruntime 1.32's kernel clamps them.

QLinearAveragePool: every input value dequantized (x_scale · (x − x_zp)), a float AveragePool
(the window summed in row order, then divided by the count, as dlcc's AveragePool does too), and
round(y / y_scale + y_zp) clamped: onnxruntime adds the zero point before rounding, which
differs from QuantizeLinear's order at a tie.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx

if TYPE_CHECKING:  # (dlcc/quantized.py imports this module at its end, for its _LOWER table)
    from .quantized import _Builder

#: onnxruntime's reserve below float's largest exponent for the table's sum (qlinear_softmax.cc).
_RESERVE = 5.0


def softmax_table(x_scale: float, reduce_len: int) -> np.ndarray:
    """QlinearBuildLookupTableUint32 with a float table: entry i is exp((i − 255 + s) · x_scale)."""
    s = np.log(np.float64(np.float32(np.finfo(np.float32).max) / np.float32(reduce_len)))
    s = max(0.0, float(s) - _RESERVE) / np.float64(np.float32(x_scale))
    i = np.arange(256, dtype=np.float64)
    return np.exp((i - 255 + s) * np.float64(np.float32(x_scale))).astype(np.float32)


def softmax_axes(attrs: dict, rank: int) -> list[int]:
    """The axes a QLinearSoftmax reduces: from `axis` on, flattened, under softmax's opset-12
    semantics (`opset` < 13), or `axis` alone. `axis` is -1 where absent whatever the opset: the
    contrib schema's default, which onnxruntime reads before its kernel's own opset-based one.
    Raises ValueError for an axis out of range."""
    axis = int(attrs.get("axis", -1))
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} is out of range for a rank-{rank} input")
    axis %= rank
    return list(range(axis, rank)) if int(attrs["opset"]) < 13 else [axis]


def _reduce(b: _Builder, op: str, x: str, axes: list[int]) -> str:
    """ReduceMax or ReduceSum over `axes`, keeping them, in the form of the model's opset (axes as
    an input from 13 for ReduceSum, from 18 for ReduceMax)."""
    if b.opset >= (13 if op == "ReduceSum" else 18):
        return b.op(op, [x, b.constant(np.array(axes, np.int64), np.int64)], keepdims=1)
    return b.op(op, [x], axes=axes, keepdims=1)


def qlinear_softmax(b: _Builder) -> None:
    from .quantized import _Later

    x, x_s, _x_zp, y_s, y_zp = (b.input(i) for i in range(5))
    if "opset" not in b.attrs:
        raise b.fail("has no `opset` attribute (onnxruntime's kernel requires one)")
    shape = b.info.get(x, (None, None))[0]
    if shape is None or any(d is None for d in shape):
        raise _Later(b.fail("needs its input's shape: the table is built for the reduced length"))
    try:
        axes = softmax_axes(b.attrs, len(shape))
    except ValueError as e:
        raise b.fail(str(e)) from None
    reduce_len = int(np.prod([shape[a] for a in axes]))
    xs = b.const(x_s)
    if xs is None or xs.size != 1:
        raise b.fail("x_scale must be a constant scalar here (the table is built at compile time)")
    qtype = b.int_type(y_zp or x)
    table = b.constant(softmax_table(float(xs.reshape(())), reduce_len))
    xf = b.as_float(x)
    idx = b.op("Cast", [b.op("Add", [b.op("Sub", [xf, _reduce(b, "ReduceMax", xf, axes)]),
                                      b.constant(np.float32(255))])], to=onnx.TensorProto.INT64)
    e = b.op("Gather", [table, idx], axis=0)
    ys = b.const(y_s)
    y_int = (b.constant(np.floor(np.float32(1) / ys.astype(np.float32)).astype(np.float32)) if ys is not None
             else b.op("Floor", [b.op("Div", [b.constant(np.float32(1)), b.as_float(y_s)])]))
    v = b.op("Div", [b.op("Mul", [e, y_int]), _reduce(b, "ReduceSum", e, axes)])
    b.quantize(v, b.as_float(y_zp) if y_zp else "", qtype, b.node.output[0])


def softmax_before_rounding(node: onnx.NodeProto, x: np.ndarray, x_scale: float, y_scale: float) -> np.ndarray:
    """What onnxruntime's QLinearSoftmax rounds, from its quantized input `x` (float64, for
    verify's judge): T · floor(1 / y_scale) / sum, the sum a sequential float32 loop as there."""
    axes = tuple(softmax_axes({a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}, x.ndim))
    moved = np.moveaxis(x.astype(np.int64), axes, range(x.ndim - len(axes), x.ndim))
    rows = moved.reshape(-1, int(np.prod([x.shape[a] for a in axes])))
    t = softmax_table(x_scale, rows.shape[1])[rows - rows.max(axis=1, keepdims=True) + 255]
    total = np.zeros(rows.shape[0], np.float32)
    for k in range(rows.shape[1]):
        total = (total + t[:, k]).astype(np.float32)
    y_int = np.floor(np.float32(1) / np.float32(y_scale)).astype(np.float32)
    v = ((t * y_int).astype(np.float32) / total[:, None]).astype(np.float64)
    return np.moveaxis(v.reshape(moved.shape), range(x.ndim - len(axes), x.ndim), axes)


#: AveragePool's attributes that QLinearAveragePool shares (channels_last is its own).
_POOL_ATTRS = ("auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides")


def qlinear_average_pool(b: _Builder) -> None:
    from .quantized import _RANGE

    x, x_s, x_zp, y_s, y_zp = (b.input(i) for i in range(5))
    if "kernel_shape" not in b.attrs:
        raise b.fail("has no kernel_shape")
    rank = b.rank(x)
    if rank < 3 or len(b.attrs["kernel_shape"]) != rank - 2:
        raise b.fail(f"kernel_shape {list(b.attrs['kernel_shape'])} does not fit a rank-{rank} input")
    qtype = b.int_type(y_zp or x)
    v = b.dequantize(x, x_s, x_zp)
    last = bool(int(b.attrs.get("channels_last", 0)))
    if last:  # NHWC: pooled as NCHW between two transposes (the values, and so the sums, are the same)
        v = b.op("Transpose", [v], perm=[0, rank - 1, *range(1, rank - 1)])
    attrs = {k: b.attrs[k] for k in _POOL_ATTRS if k in b.attrs}
    if isinstance(attrs.get("auto_pad"), bytes):
        attrs["auto_pad"] = attrs["auto_pad"].decode()
    v = b.op("AveragePool", [v], **attrs)
    if last:
        v = b.op("Transpose", [v], perm=[0, *range(2, rank), 1])
    # round(y / y_scale + y_zp): the zero point before the rounding, as quantize_value does
    v = b.op("Div", [v, b.as_float(y_s)])
    if y_zp:
        v = b.op("Add", [v, b.as_float(y_zp)])
    lo, hi = _RANGE[qtype]
    r = b.op("Min", [b.op("Max", [b.op("Round", [v]), b.constant(np.float32(lo))]), b.constant(np.float32(hi))])
    b.op("Cast", [r], b.node.output[0], to=qtype)
