"""DeformConv (opsets 19, 22) written as standard ops at import (composite.py), once every shape
is static: a deformable im2col, then one batched MatMul per group against the weights.

The im2col gathers, for every output position p, kernel tap k and input channel c, X bilinearly
sampled at (p's window position of tap k) + (the learned offset of c's offset group at k and p),
times the modulation mask where there is one. In standard ops:
  - the positions: a constant [K, P] grid of window positions (h_out * stride - pad + i *
    dilation, exact integers in float32) plus the offsets, read as [N, offset_group, K, 2, P];
  - the four neighbours of each position: one GatherElements on X viewed as [N, offset_group,
    C / offset_group, H * W] at flat indices [N, offset_group, 1 -> C / offset_group, 4 * K * P]
    (the same for every channel of a group: an Expand), each index clamped into the map first so
    no read leaves it (ops/ranges.py proves the range; no device check is launched);
  - the weights, the neighbours' masks and the sum, and the mask, as Mul/Add/Where maps that
    AStitch stitches.
The columns [N, C * K, P] are then grouped as [N, group, C / group * K, P] and multiplied by the
weights [group, M / group, C / group * K] in one MatMul, whose output is Y [N, M, H_out, W_out]
after a reshape; the bias is added last.

The arithmetic is onnxruntime's CPU kernel's (onnxruntime/core/providers/cpu/nn/deform_conv.cc),
op for op where the rounding can show: a position with h <= -1, h >= H, w <= -1 or w >= W reads
0, and so does a NaN position (onnxruntime tests -1 < h < H); otherwise h_low = floor(h), the fractions lh = h - h_low and hh = 1 - lh (and w's), the
weights hh * hw, hh * lw, lh * hw, lh * lw, each neighbour outside the map read as 0, and the sum
((w1 v1 + w2 v2) + w3 v3) + w4 v4, times the mask (so a NaN or inf sample stays NaN under a
mask of 0, as in onnxruntime). The MatMul sums in the GEMM template's order, not MLAS's: the output
differs from onnxruntime's by rounding, as a Conv's does.

float16 and bfloat16 models compute in float32 and round the result back (onnxruntime's CPU
kernel has float only). 2-D only, as the spec's shapes and every kernel that implements it.
"""
from __future__ import annotations

import numpy as np
import onnx

_F = onnx.TensorProto.FLOAT
_I64 = onnx.TensorProto.INT64
_FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


def _f32(b, values, shape=()) -> str:
    return b.constant(np.asarray(values, np.float32).reshape(shape), np.float32)


def _i64(b, value) -> str:
    return b.constant(np.int64(value), np.int64)


def _ints_attr(b, name: str, default: list[int]) -> list[int]:
    return [int(x) for x in b.attr(name, list(default))]


def lower_deform_conv(b) -> None:
    """Y [N, M, H_out, W_out] from X [N, C, H, W], W [M, C / group, kH, kW], offset [N,
    offset_group * 2 * kH * kW, H_out, W_out], B [M] and mask [N, offset_group * kH * kW, H_out,
    W_out] (see the module's docstring)."""
    ins = list(b.node.input) + [""] * (5 - len(b.node.input))
    x, w, offset, bias, mask = ins[:5]
    if not (x and w and offset) or len(b.node.input) > 5:
        raise b.fail("takes 3 to 5 inputs: X, W, offset, and the optional B and mask")
    xs, ws, os_ = b.shape(x), b.shape(w), b.shape(offset)
    if len(xs) != 4:
        raise b.unsupported(f"a {len(xs)}-D input (DeformConv is 2-D: X [N, C, H, W])")
    if len(ws) != 4:
        raise b.fail(f"W must be 4-D [M, C / group, kH, kW], not {list(ws)}")
    elems = {b.elem(t) or _F for t in (x, w, offset, bias, mask) if t}
    if not elems <= set(_FLOATS) or len({b.elem(x) or _F, b.elem(w) or _F}) != 1:
        raise b.unsupported("a DeformConv on other than float32, float16 or bfloat16 tensors of one type")
    n, c, hh, ww = xs
    m, cg, kh, kw = ws
    group, ogroup = int(b.attr("group", 1)), int(b.attr("offset_group", 1))
    kernel = _ints_attr(b, "kernel_shape", [kh, kw])
    strides, dil = _ints_attr(b, "strides", [1, 1]), _ints_attr(b, "dilations", [1, 1])
    pads = _ints_attr(b, "pads", [0, 0, 0, 0])
    if len(kernel) != 2 or kernel != [kh, kw]:
        raise b.fail(f"kernel_shape {kernel} does not match W's spatial dims {[kh, kw]}")
    if len(strides) != 2 or len(dil) != 2 or len(pads) != 4:
        raise b.fail(f"strides {strides} and dilations {dil} need 2 values and pads {pads} 4")
    if min(strides + dil) < 1 or min(pads) < 0 or kh < 1 or kw < 1:
        raise b.fail(f"strides {strides}, dilations {dil} and the kernel must be positive, pads {pads} not negative")
    if group < 1 or ogroup < 1:
        raise b.fail(f"group ({group}) and offset_group ({ogroup}) must be positive")
    if c != cg * group or m % group or c % ogroup:
        raise b.fail(f"X's {c} channels must be W's {cg} times group {group}, and divide by offset_group "
                     f"{ogroup}; W's {m} output channels must divide by group")
    oh = (hh + pads[0] + pads[2] - dil[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (ww + pads[1] + pads[3] - dil[1] * (kw - 1) - 1) // strides[1] + 1
    k, p = kh * kw, max(oh, 0) * max(ow, 0)
    if list(os_) != [n, ogroup * 2 * k, oh, ow]:
        raise b.fail(f"offset must have shape {[n, ogroup * 2 * k, oh, ow]}, not {list(os_)}")
    if mask and list(b.shape(mask)) != [n, ogroup * k, oh, ow]:
        raise b.fail(f"mask must have shape {[n, ogroup * k, oh, ow]}, not {list(b.shape(mask))}")
    if bias and list(b.shape(bias)) != [m]:
        raise b.fail(f"B must have shape [{m}], not {list(b.shape(bias))}")
    elem = b.elem(x) or _F
    out_shape = [n, m, oh, ow]
    if n * m * p == 0 or c == 0:  # nothing to sum over or nothing to write: zeros (plus the bias)
        zero = _f32(b, np.zeros(out_shape, np.float32), out_shape)
        y = b.op("Add", [zero, b.op("Reshape", [b.to_float(bias)[0], b.ints(1, m, 1, 1)])]) if bias and c == 0 else zero
        b.output(y, 0, elem)
        return
    if hh * ww == 0:
        raise b.unsupported("sampling an input with an empty spatial dim")

    xf, offf = b.to_float(x)[0], b.to_float(offset)[0]
    # window positions of every tap at every output position, [2, K, P] (h, w)
    ih, iw = np.meshgrid(np.arange(kh), np.arange(kw), indexing="ij")
    ph, pw = np.meshgrid(np.arange(oh), np.arange(ow), indexing="ij")
    base_h = (ph.reshape(1, -1) * strides[0] - pads[0] + ih.reshape(-1, 1) * dil[0]).astype(np.float32)
    base_w = (pw.reshape(1, -1) * strides[1] - pads[1] + iw.reshape(-1, 1) * dil[1]).astype(np.float32)
    off = b.op("Reshape", [offf, b.ints(n, ogroup, k, 2, p)])
    h = b.op("Add", [_f32(b, base_h, [1, 1, k, p]), b.op("Reshape", [b.slice(off, 0, 1, 3), b.ints(n, ogroup, k, p)])])
    w_ = b.op("Add", [_f32(b, base_w, [1, 1, k, p]), b.op("Reshape", [b.slice(off, 1, 2, 3), b.ints(n, ogroup, k, p)])])

    def between(v, lo, hi):  # lo < v < hi (False for NaN: a NaN position reads 0, as in onnxruntime)
        return b.op("And", [b.op("Greater", [v, _f32(b, lo)]), b.op("Less", [v, _f32(b, hi)])])

    inside = b.op("And", [between(h, -1, hh), between(w_, -1, ww)])  # [N, OG, K, P]
    h_low, w_low = b.op("Floor", [h]), b.op("Floor", [w_])
    lh, lw = b.op("Sub", [h, h_low]), b.op("Sub", [w_, w_low])
    one = _f32(b, 1)
    fh, fw = b.op("Sub", [one, lh]), b.op("Sub", [one, lw])

    def index(v, dv, size):
        """The neighbour's coordinate as int64 clamped into [0, size - 1] (a NaN to 0, before the
        conversion), and whether the unclamped one lies in the map."""
        t = b.op("Add", [v, _f32(b, dv)]) if dv else v
        ok = b.op("And", [b.op("GreaterOrEqual", [t, _f32(b, 0)]), b.op("Less", [t, _f32(b, size)])])
        safe = b.op("Where", [ok, t, _f32(b, 0)])
        i = b.op("Cast", [safe], to=_I64)
        return b.op("Max", [b.op("Min", [i, _i64(b, size - 1)]), _i64(b, 0)]), ok

    rows = [index(h_low, d, hh) for d in (0, 1)]
    cols = [index(w_low, d, ww) for d in (0, 1)]
    corners = [(0, 0), (0, 1), (1, 0), (1, 1)]  # v1..v4: (low, low), (low, high), (high, low), (high, high)
    flat = [b.op("Add", [b.op("Mul", [rows[dy][0], _i64(b, ww)]), cols[dx][0]]) for dy, dx in corners]
    stacked = b.op("Concat", [b.unsqueeze(f, [2]) for f in flat], axis=2)  # [N, OG, 4, K, P]
    cpg = c // ogroup
    idx = b.op("Reshape", [stacked, b.ints(n, ogroup, 1, 4 * k * p)])
    if cpg != 1:
        idx = b.op("Expand", [idx, b.ints(n, ogroup, cpg, 4 * k * p)])
    got = b.op("GatherElements", [b.op("Reshape", [xf, b.ints(n, ogroup, cpg, hh * ww)]), idx], axis=3)
    got = b.op("Reshape", [got, b.ints(n, ogroup, cpg, 4, k, p)])

    weights = [b.op("Mul", [fh, fw]), b.op("Mul", [fh, lw]), b.op("Mul", [lh, fw]), b.op("Mul", [lh, lw])]
    val = None
    for j, (dy, dx) in enumerate(corners):
        ok = b.unsqueeze(b.op("And", [rows[dy][1], cols[dx][1]]), [2])  # [N, OG, 1, K, P]
        v = b.op("Reshape", [b.slice(got, j, j + 1, 3), b.ints(n, ogroup, cpg, k, p)])
        term = b.op("Mul", [b.unsqueeze(weights[j], [2]), b.op("Where", [ok, v, _f32(b, 0)])])
        val = term if val is None else b.op("Add", [val, term])
    val = b.op("Where", [b.unsqueeze(inside, [2]), val, _f32(b, 0)])  # [N, OG, CPG, K, P]
    if mask:
        mk = b.op("Reshape", [b.to_float(mask)[0], b.ints(n, ogroup, k, p)])
        val = b.op("Mul", [val, b.unsqueeze(mk, [2])])

    columns = b.op("Reshape", [val, b.ints(n, group, cg * k, p)])
    wf = b.op("Reshape", [b.to_float(w)[0], b.ints(group, m // group, cg * k)])
    y = b.op("Reshape", [b.op("MatMul", [wf, columns]), b.ints(*out_shape)])
    if bias:
        y = b.op("Add", [y, b.op("Reshape", [b.to_float(bias)[0], b.ints(1, m, 1, 1)])])
    b.output(y, 0, elem)
