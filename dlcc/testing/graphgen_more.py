"""More fuzz patterns: the ops dlcc lowers that graphgen's own patterns never write (`--more-ops`).

graphgen's PATTERNS grew with the bugs they found, and left out ops that real models use and
that dlcc lowers through rewrites of their own: quantization (QDQ weights, fake-quantized
activations, dynamic quantization), Einsum, GridSample and AffineGrid, shape arithmetic (Shape,
Size, Range, ConstantOfShape, EyeLike), OneHot, Compress, ReverseSequence, Hardmax, the Lp norms
and pools, Loop, the sequence ops, DeformConv, and opset 23's Attention, RotaryEmbedding and
RMSNormalization; and LSTM, GRU and RNN over packed sequences (sequence_lens). These patterns
write them in the forms exporters do.

They are a separate table (MORE_PATTERNS), added only with `more_ops=True`, so a seed's graph
without the flag is what it always was. The same value rules hold as in graphgen: a
discontinuous op (a quantizer's rounding, Hardmax, a nearest-pixel lookup) reads exact values
only (graph inputs and constants), and each output carries an interval that bounds it.
"""
from __future__ import annotations

import math
import string

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from .graphgen import INF, MAX_NUMEL, Gen, Val, _chain, _exact, _spatial_input

_F = TensorProto.FLOAT


# ------------------------------------------------------------------------------------------------
# Quantization
# ------------------------------------------------------------------------------------------------
_QTYPES = {"int8": (TensorProto.INT8, np.int8, -128, 127), "uint8": (TensorProto.UINT8, np.uint8, 0, 255)}


def _qweight(g: Gen, shape: tuple, axis: int) -> tuple[Val, float]:
    """A DequantizeLinear of a constant int8 or uint8 weight (per tensor, per `axis`, or from
    opset 21 per block along the other axis), as a QDQ model stores its weights. Returns the float
    weight and a bound on its magnitude."""
    qt = g.ch.pick(["int8", "uint8"])
    tp, npt, lo, hi = _QTYPES[qt]
    q = g.const(g.rs.integers(lo, hi + 1, shape).astype(npt), "wq")
    mid = 0 if qt == "int8" else 128
    kind = g.ch.pick(["tensor", "axis"] + (["block"] if g.opset >= 21 and len(shape) == 2 else []))
    attrs: dict = {}
    if kind == "tensor":
        sshape: tuple = ()
    elif kind == "axis":
        sshape, attrs["axis"] = (shape[axis],), axis
    else:  # blocks along the axis other than `axis` (MatMulNBits's layout: blocks of K per column)
        other = 1 - axis
        bs = g.ch.pick([b for b in (2, 3, 4, 8) if b <= shape[other]] or [1])
        sshape = tuple(-(-d // bs) if k == other else d for k, d in enumerate(shape))
        attrs.update(axis=other, block_size=bs)
    fan = shape[0] if axis == 1 else int(np.prod(shape[1:]))
    top = 1.0 / math.sqrt(max(fan, 1)) / 128
    scale = g.const(g.rs.uniform(0.25 * top, top, sshape).astype(np.float32), "ws")
    ins = [q, scale]
    if g.ch.chance(0.7) or qt == "uint8":
        zp = g.rs.integers(mid - 8, mid + 9, sshape) if g.ch.chance(0.5) else np.full(sshape, mid)
        ins.append(g.const(zp.astype(npt), "wz"))
    bound = (hi - lo) * top
    w = g.one("DequantizeLinear", ins, shape, -bound, bound, **attrs)
    w.exact = True  # a constant's function: its value is the same in dlcc and onnxruntime
    return w, bound


def _fake_quant(g: Gen, x: Val) -> Val:
    """QuantizeLinear then DequantizeLinear of an activation, per tensor (a QDQ model's), sometimes
    with a scale too small for the values, so that the quantizer saturates. Of an exact value the
    result is exact; of a computed one, a value one rounding from a tie may quantize a step apart
    in dlcc and onnxruntime, which the float64 arbiter's rounding spread explains (`unstable`)."""
    qt = g.ch.pick(["uint8", "int8"])
    tp, npt, lo, hi = _QTYPES[qt]
    mag = max(x.mag, 1e-3) if math.isfinite(x.mag) else 4.0
    scale = np.float32(mag / (hi - lo) * g.ch.pick([2.0, 1.0, 0.5]))
    zp = npt((lo + hi + 1) // 2) if qt == "uint8" else npt(0)
    s, z = g.const(np.array(scale, np.float32), "as"), g.const(np.array(zp, npt), "az")
    q = g.one("QuantizeLinear", [x, s, z], x.shape, lo, hi, dtype=qt)
    q.exact = x.exact
    top = float(scale) * (hi - lo)
    y = g.one("DequantizeLinear", [q, s, z], x.shape, -top, top)
    y.exact = x.exact
    return y


def p_qdq(g: Gen) -> None:
    """A QDQ model's layer: a MatMul, a Gemm or a Conv whose weight is a dequantized constant and
    whose activation is an exact value, fake-quantized or not, then a chain, and now and then the
    output quantized and dequantized again (what the next layer of a QDQ model reads)."""
    kind = g.ch.pick(["matmul", "gemm", "conv"])
    if kind == "conv":
        x = _exact(g, lambda u: u.rank == 4 and u.shape[1] <= 16 and all(2 <= s <= 24 for s in u.shape[2:]),
                   lambda: (g.ch.pick([1, 2]), g.ch.pick([1, 3, 4, 8]), g.ch.pick([5, 8, 12]), g.ch.pick([5, 7, 16])))
        if x.rank != 4:
            return
        if g.ch.chance(0.6):
            x = _fake_quant(g, x)
        n, c, h, w = x.shape
        m, k = g.ch.pick([2, 4, 8, 3]), g.ch.pick([1, 3])
        wt, wb = _qweight(g, (m, c, k, k), 0)
        y = g.one("Conv", [x, wt], (n, m, h, w), -INF, INF, kernel_shape=[k, k], pads=[k // 2] * 4)
        y.lo, y.hi = -c * k * k * x.mag * wb, c * k * k * x.mag * wb
    else:
        x = _exact(g, lambda u: u.rank == 2 and u.shape[1] <= 256, lambda: (g.dim(12), g.dim(14)))
        if x.rank != 2:
            return
        if g.ch.chance(0.6):
            x = _fake_quant(g, x)
        M, K = x.shape
        N = g.dim(14)
        trans = kind == "gemm" and g.ch.chance(0.5)
        wt, wb = _qweight(g, (N, K) if trans else (K, N), 0 if trans else 1)
        bound = K * x.mag * wb
        if kind == "gemm":
            y = g.one("Gemm", [x, wt, g.weight((N,), 0.5, hint="bias")], (M, N), -bound - 0.5, bound + 0.5,
                      transB=int(trans))
        else:
            y = g.one("MatMul", [x, wt], (M, N), -bound, bound)
    y = _chain(g, y)
    if g.ch.chance(0.35):
        _fake_quant(g, y)


def p_dynamic_quant(g: Gen) -> None:
    """onnxruntime's dynamic quantization: DynamicQuantizeLinear of an exact activation, then
    MatMulInteger (or ConvInteger) with a constant int8/uint8 weight and zero points, a Cast to
    float and the rescale by both scales."""
    conv = g.ch.chance(0.3)
    if conv:
        x = _exact(g, lambda u: u.rank == 4 and u.shape[1] <= 8 and all(2 <= s <= 16 for s in u.shape[2:]),
                   lambda: (1, g.ch.pick([1, 3, 4]), g.ch.pick([5, 8]), g.ch.pick([6, 9])))
        if x.rank != 4:
            return
    else:
        x = _exact(g, lambda u: 2 <= u.rank <= 3 and u.shape[-1] <= 256, lambda: (g.dim(12), g.dim(14)))
        if not 2 <= x.rank <= 3:
            return
    xq, xs, xz = g.node("DynamicQuantizeLinear", [x], [(x.shape, "uint8", 0, 255), ((), "float32", 0, 2 * x.mag / 255),
                                                      ((), "uint8", 0, 255)])
    for v in (xq, xs, xz):
        v.exact = True
    qt = g.ch.pick(["int8", "uint8"])
    tp, npt, lo, hi = _QTYPES[qt]
    if conv:
        n, c, h, w = x.shape
        m, k = g.ch.pick([2, 4]), g.ch.pick([1, 3])
        wshape, fan = (m, c, k, k), c * k * k
    else:
        K, N = x.shape[-1], g.dim(14)
        wshape, fan = (K, N), K
    wq = g.const(g.rs.integers(lo, hi + 1, wshape).astype(npt), "wq")
    ins = [xq, wq, xz]
    if g.ch.chance(0.6):
        ins.append(g.const(np.array(npt(0 if qt == "int8" else 128)), "wz"))
    ibound = fan * 255 * 255
    if conv:
        out = (n, m, h, w)
        acc = g.one("ConvInteger", ins, out, -ibound, ibound, dtype="int32", kernel_shape=[k, k], pads=[k // 2] * 4)
    else:
        out = x.shape[:-1] + (wshape[1],)
        acc = g.one("MatMulInteger", ins, out, -ibound, ibound, dtype="int32")
    f = g.one("Cast", [acc], out, -ibound, ibound, to=_F)
    ws = g.scalar(float(1.0 / math.sqrt(fan) / 128))
    scale = g.one("Mul", [xs, ws], (), 0, xs.hi * ws.hi)
    bound = fan * 2 * x.mag * 255 / math.sqrt(fan) / 128 + 1
    _chain(g, g.one("Mul", [f, scale], out, -bound, bound))


# ------------------------------------------------------------------------------------------------
# Einsum
# ------------------------------------------------------------------------------------------------
def p_einsum(g: Gen) -> None:
    """A random Einsum: two operands with batch, contracted and free letters in any order (a
    letter summed away too), or one operand transposed, reduced or read along a diagonal; now and
    then `...` for leading dims."""
    letters = list(string.ascii_lowercase[:8])
    size = {c: g.ch.pick([1, 2, 3, 4, 5, 7, 8]) for c in letters}
    if g.ch.chance(0.3):  # one operand
        a = g.bounded(g.pick_or_input(lambda u: 1 <= u.rank <= 4 and u.numel <= 4096))
        if not 1 <= a.rank <= 4 or a.numel > 4096:
            return
        la = letters[: a.rank]
        if a.rank >= 2 and a.shape[0] == a.shape[1] and g.ch.chance(0.4):
            la[1] = la[0]  # the diagonal of the first two dims
        uniq = list(dict.fromkeys(la))
        keep = [c for c in uniq if g.ch.chance(0.7)]
        keep = [keep[i] for i in np.argsort([g.ch.below(8) for _ in keep], kind="stable")] if keep else []
        eq = "".join(la) + "->" + "".join(keep)
        dims = dict(zip(la, a.shape))
        summed = int(np.prod([dims[c] for c in uniq if c not in keep]))
        g.one("Einsum", [a], tuple(dims[c] for c in keep), -summed * a.mag, summed * a.mag, equation=eq)
        return
    nb, nk, nfa, nfb = g.ch.pick([0, 1, 1, 2]), g.ch.pick([1, 1, 2, 0]), g.ch.pick([1, 0, 2]), g.ch.pick([1, 0, 2])
    pool = iter(letters)
    batch, contract = [next(pool) for _ in range(nb)], [next(pool) for _ in range(nk)]
    fa, fb = [next(pool) for _ in range(nfa)], [next(pool) for _ in range(nfb)]

    def order(ls):
        return [ls[i] for i in np.argsort([g.ch.below(16) for _ in ls], kind="stable")]

    la, lb = order(batch + contract + fa), order(batch + contract + fb)
    if not la or not lb:
        return
    out = [c for c in batch if g.ch.chance(0.85)] + fa + fb
    out = order(out)
    ell = g.ch.chance(0.2)
    lead = (g.ch.pick([1, 2, 3]),) if ell else ()
    ashape, bshape = lead + tuple(size[c] for c in la), tuple(size[c] for c in lb)
    oshape = lead + tuple(size[c] for c in out)
    if max(int(np.prod(s)) for s in (ashape, bshape, oshape)) > MAX_NUMEL:
        return
    a = g.pick(lambda u: u.shape == ashape) or g.input(ashape)
    a = g.bounded(a, 10.0)
    b = g.weight(bshape, 1.0) if g.ch.chance(0.5) else g.input(bshape)
    summed = int(np.prod([size[c] for c in contract + [c for c in batch if c not in out]]))
    eq = ("..." if ell else "") + "".join(la) + "," + "".join(lb) + "->" + ("..." if ell else "") + "".join(out)
    bound = summed * a.mag * b.mag
    g.one("Einsum", [a, b], oshape, -bound, bound, equation=eq)


# ------------------------------------------------------------------------------------------------
# Sampling
# ------------------------------------------------------------------------------------------------
def p_grid_sample(g: Gen) -> None:
    """GridSample of a feature map at a constant grid (inside and beyond [-1, 1]), or at one
    AffineGrid makes from constant thetas (opset 20), in every mode and padding mode."""
    if g.opset < 16:
        return
    x = g.pick_or_input(lambda u: u.rank == 4 and u.shape[0] <= 2 and u.numel <= 4096,
                        lambda: (g.ch.pick([1, 2]), g.ch.pick([1, 3, 4]), g.ch.between(1, 9), g.ch.between(1, 9)))
    if x.rank != 4 or x.shape[0] > 2 or x.numel > 4096:
        return
    x = g.bounded(x, 10.0)
    n, c = x.shape[:2]
    ho, wo = g.ch.between(1, 7), g.ch.between(1, 7)
    align = int(g.ch.chance(0.5))
    modes = ["linear", "nearest", "cubic"] if g.opset >= 20 else ["bilinear", "nearest", "bicubic"]
    mode = g.ch.pick(modes)
    if g.opset >= 20 and g.ch.chance(0.4):
        theta = g.const(g.rs.uniform(-1.2, 1.2, (n, 2, 3)).astype(np.float32), "theta")
        grid = g.one("AffineGrid", [theta, g.ints([n, c, ho, wo])], (n, ho, wo, 2), -4.0, 4.0, align_corners=align)
        if mode == "nearest":
            return  # (a computed grid's nearest pixel may flip at a half: not an exact value)
    else:
        grid = g.const(g.rs.uniform(-1.2, 1.2, (n, ho, wo, 2)).astype(np.float32), "grid")
    pad = g.ch.pick(["zeros", "border", "reflection"])
    k = 1.8 if "cubic" in mode else 1.0
    g.one("GridSample", [x, grid], (n, c, ho, wo), -k * x.mag, k * x.mag, mode=mode, padding_mode=pad,
          align_corners=align)


def p_deform_conv(g: Gen) -> None:
    """DeformConv (opset 19) with constant offsets of a few pixels, with and without a mask and a
    bias, groups and offset groups."""
    if g.opset < 19:
        return
    x = _spatial_input(g, 2)
    n, c, h, w = x.shape
    og = g.ch.pick([1, 2]) if c % 2 == 0 else 1
    group = g.ch.pick([1, 2]) if c % 2 == 0 else 1
    m, k = group * g.ch.pick([1, 2, 3]), g.ch.pick([1, 2, 3])
    stride, pad = g.ch.pick([1, 2]), g.ch.between(0, k // 2 + 1)
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    if oh < 1 or ow < 1:
        return
    fan = (c // group) * k * k
    scale = 1.0 / math.sqrt(fan)
    off = g.const(g.rs.uniform(-2.5, 2.5, (n, 2 * og * k * k, oh, ow)).astype(np.float32), "off")
    ins = [x, g.weight((m, c // group, k, k), scale), off]
    ins.append(g.weight((m,), 0.5, hint="bias") if g.ch.chance(0.5) else None)
    if g.ch.chance(0.5):
        ins.append(g.weight((n, og * k * k, oh, ow), 1.0, 0.0, hint="mask"))
    bound = fan * x.mag * scale + 0.5
    y = g.one("DeformConv", ins, (n, m, oh, ow), -bound, bound, kernel_shape=[k, k], strides=[stride] * 2,
              pads=[pad] * 4, group=group, offset_group=og)
    _chain(g, y)


# ------------------------------------------------------------------------------------------------
# Shape arithmetic, as exporters write it around Reshape, Expand and position ids
# ------------------------------------------------------------------------------------------------
def p_shape_math(g: Gen) -> None:
    """Shape, Size, Range, ConstantOfShape and EyeLike the way exporters use them: a Reshape to
    (Shape(x)[0], -1), a fill of x's shape, position ids from Range over a dim, a scale by 1/Size,
    an identity-matrix add."""
    x = g.pick_or_input(lambda u: u.rank >= 1)
    if x.rank == 0:
        x = g.input(g.shape(2))
    kind = g.ch.pick(["reshape", "fill", "range", "size", "eye"])
    if kind == "reshape" and x.rank >= 2:
        attrs = {"start": 0, "end": 1} if g.opset >= 15 and g.ch.chance(0.5) else {}
        s = g.one("Shape", [x], (1 if attrs else x.rank,), 0, INF, dtype="int64", **attrs)
        first = g.one("Slice", [s, g.ints([0]), g.ints([1])], (1,), 0, INF, dtype="int64") if not attrs else s
        new = g.one("Concat", [first, g.ints([-1])], (2,), -1, INF, dtype="int64", axis=0)
        g.one("Reshape", [x, new], (x.shape[0], int(np.prod(x.shape[1:]))), x.lo, x.hi)
    elif kind == "fill":
        s = g.one("Shape", [x], (x.rank,), 0, INF, dtype="int64")
        v = g.ch.pick([0.5, -1.0, 2.0])
        f = g.one("ConstantOfShape", [s], x.shape, v, v, value=numpy_helper.from_array(np.array([v], np.float32)))
        g.one("Add", [x, f], x.shape, x.lo + v, x.hi + v)
    elif kind == "range":
        s = g.one("Shape", [x], (x.rank,), 0, INF, dtype="int64")
        last = g.one("Gather", [s, g.ints(-1)], (), 0, INF, dtype="int64", axis=0)
        if g.ch.chance(0.5):  # int64 positions, cast (position ids)
            r = g.one("Range", [g.ints(0), last, g.ints(1)], (x.shape[-1],), 0, x.shape[-1], dtype="int64")
            r = g.one("Cast", [r], r.shape, 0, x.shape[-1], to=_F)
        else:
            lf = g.one("Cast", [last], (), x.shape[-1], x.shape[-1], to=_F)
            r = g.one("Range", [g.scalar(0.0), lf, g.scalar(1.0)], (x.shape[-1],), 0, x.shape[-1])
        w = g.one("Mul", [r, g.scalar(0.125)], r.shape, 0, x.shape[-1] / 8)
        g.one("Add", [x, w], x.shape, x.lo, x.hi + x.shape[-1] / 8)
    elif kind == "size":
        n = g.one("Size", [x], (), 0, INF, dtype="int64")
        nf = g.one("Cast", [n], (), x.numel, x.numel, to=_F)
        g.one("Div", [x, nf], x.shape, min(x.lo, 0), max(x.hi, 0))
    else:
        y = g.pick(lambda u: u.rank == 2) or g.input(g.shape(2))
        k = g.ch.pick([0, 1, -1, 2])
        e = g.one("EyeLike", [y], y.shape, 0, 1, k=k)
        g.one("Add", [y, e], y.shape, y.lo, y.hi + 1)


# ------------------------------------------------------------------------------------------------
# Selections and layouts
# ------------------------------------------------------------------------------------------------
def p_select(g: Gen) -> None:
    """OneHot of constant indices (negative ones too), Compress by a constant condition, and
    ReverseSequence with constant lengths, each read back as float."""
    kind = g.ch.pick(["onehot", "compress", "reverse"])
    if kind == "onehot":
        ishape = g.shape(g.ch.pick([1, 2]), 256)
        depth = g.ch.pick([2, 3, 5, 8])
        # (the index and depth types onnxruntime's OneHot has a kernel for, with a float output)
        itype, dtype = g.ch.pick([(np.int64, np.int64), (np.int64, np.float32), (np.int64, np.int32),
                                  (np.int32, np.int32), (np.int32, np.float32)])
        idx = g.const(g.rs.integers(-depth, depth, ishape).astype(itype), "idx")
        off, on = g.ch.pick([(0.0, 1.0), (-1.0, 2.0), (0.25, -0.5)])
        axis = g.ch.between(-len(ishape) - 1, len(ishape))
        out = list(ishape)
        out.insert(axis % (len(ishape) + 1), depth)
        d = g.const(np.array(depth, dtype), "depth")
        y = g.one("OneHot", [idx, d, g.const(np.array([off, on], np.float32), "vals")], tuple(out),
                  min(off, on), max(off, on), axis=axis)
        _chain(g, y)
    elif kind == "compress":
        x = g.pick_or_input(lambda u: u.rank >= 1 and u.numel >= 2)
        if x.rank == 0:
            return
        if g.ch.chance(0.7):
            axis = g.ch.below(x.rank)
            n = g.ch.between(1, x.shape[axis])  # a condition shorter than the axis keeps a prefix
            cond = g.rs.random(n) < 0.6
            cond[g.ch.below(n)] = True
            out = list(x.shape)
            out[axis] = int(cond.sum())
            attrs = {"axis": axis - x.rank if g.ch.chance(0.3) else axis}
        else:
            n = g.ch.between(1, x.numel)
            cond = g.rs.random(n) < 0.5
            cond[g.ch.below(n)] = True
            out, attrs = [int(cond.sum())], {}
        g.one("Compress", [x, g.const(cond, "cond")], tuple(out), x.lo, x.hi, **attrs)
    else:
        x = g.pick_or_input(lambda u: u.rank >= 2 and u.numel <= 4096,
                            lambda: (g.ch.pick([1, 3, 5]), g.ch.pick([1, 2, 4])) + g.shape(g.ch.pick([0, 1]), 64))
        if x.rank < 2:
            return
        batch_axis = g.ch.pick([0, 1])
        time_axis = 1 - batch_axis
        lens = g.rs.integers(1, x.shape[time_axis] + 1, x.shape[batch_axis]).astype(np.int64)
        g.one("ReverseSequence", [x, g.const(lens, "lens")], x.shape, x.lo, x.hi, batch_axis=batch_axis,
              time_axis=time_axis)


def p_lp(g: Gen) -> None:
    """LpNormalization, LpPool and GlobalLpPool (p of 1, 2 or 3), and Hardmax of an exact value."""
    kind = g.ch.pick(["norm", "pool", "global", "hardmax"])
    if kind == "hardmax":
        x = _exact(g, lambda u: u.rank >= 1)
        axis = g.ch.between(-x.rank, x.rank - 1)
        y = g.one("Hardmax", [x], x.shape, 0, 1, axis=axis)
        _chain(g, y)
        return
    if kind == "norm":
        x = g.pick_or_input(lambda u: u.rank >= 1)
        if x.rank == 0:
            return
        x = g.bounded(x, 30.0)
        # (a row of zeros would be NaN in onnxruntime: rejected as an invalid case)
        g.one("LpNormalization", [x], x.shape, -1.0, 1.0, axis=g.ch.between(-x.rank, x.rank - 1), p=g.ch.pick([1, 2]))
        return
    x = g.bounded(_spatial_input(g, g.ch.pick([2, 1])), 10.0)
    p = g.ch.pick([1, 2, 3])
    if kind == "global":
        if g.opset >= 22:
            return  # (onnxruntime has no kernel for GlobalLpPool-22)
        sp = int(np.prod(x.shape[2:]))
        g.one("GlobalLpPool", [x], x.shape[:2] + (1,) * (x.rank - 2), 0, sp * x.mag, p=p)
        return
    d = x.rank - 2
    k = [g.ch.pick([1, 2, 3]) for _ in range(d)]
    stride = [g.ch.pick([1, 2]) for _ in range(d)]
    pads = [g.ch.between(0, kk - 1) for kk in k] * 2
    out = [(x.shape[2 + i] + pads[i] + pads[i + d] - k[i]) // stride[i] + 1 for i in range(d)]
    if min(out) < 1:
        return
    g.one("LpPool", [x], x.shape[:2] + tuple(out), 0, int(np.prod(k)) * x.mag, kernel_shape=k, strides=stride,
          pads=pads, p=p)


def p_packed_rnn(g: Gen) -> None:
    """An LSTM, GRU or RNN over a padded batch (torch's packed sequences): sequence_lens from 1 to
    the sequence's length, a graph input (known at run time only) or a constant."""
    op = g.ch.pick(["LSTM", "GRU", "RNN"])
    seq, batch, inp = g.ch.pick([3, 5, 8]), g.ch.pick([2, 3, 4]), g.ch.pick([4, 3, 8])
    x = g.pick(lambda u: u.rank == 3 and 2 <= u.shape[0] <= 8 and 2 <= u.shape[1] <= 4 and u.shape[2] <= 16)
    x = g.bounded(x or g.input((seq, batch, inp)), 5.0)
    seq, batch, inp = x.shape
    hid = g.ch.pick([4, 3, 8])
    direction = g.ch.pick(["forward", "reverse", "bidirectional"])
    nd = 2 if direction == "bidirectional" else 1
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    lens = g.rs.integers(1, seq + 1, batch).astype(np.int32)
    if g.ch.chance(0.6):
        sl = g.input((batch,), 1, seq, dtype="int32", hint="lens")
        g.feeds[sl.name] = lens
    else:
        sl = g.const(lens, "lens")
    ins = [x, g.weight((nd, gates * hid, inp), 0.5), g.weight((nd, gates * hid, hid), 0.5),
           g.weight((nd, 2 * gates * hid), 0.5, hint="b"), sl]
    if g.ch.chance(0.4):
        ins.append(g.weight((nd, batch, hid), 1.0, hint="h0"))
    attrs = {"hidden_size": hid, "direction": direction}
    if op == "GRU":
        attrs["linear_before_reset"] = int(g.ch.chance(0.5))
    outs = [((seq, nd, batch, hid), "float32", -1.0, 1.0), ((nd, batch, hid), "float32", -1.0, 1.0)]
    if op == "LSTM" and g.ch.chance(0.4):
        outs.append(((nd, batch, hid), "float32", -seq - 1.0, seq + 1.0))
    g.node(op, ins, outs, **attrs)


# ------------------------------------------------------------------------------------------------
# Loops and sequences
# ------------------------------------------------------------------------------------------------
def p_loop(g: Gen) -> None:
    """A Loop with a constant trip count, or one that counts itself out with its condition (Keras's
    `t < steps`), carrying a state s <- s * a + tanh(x[t]) (or + tanh(x)) and stacking it per step."""
    x = g.pick_or_input(lambda u: u.rank >= 1 and u.numel <= 2048)
    if x.rank == 0 or x.numel > 2048:
        return
    x = g.bounded(x, 10.0)
    per_step = x.rank >= 2 and x.shape[0] <= 6 and g.ch.chance(0.5)
    steps = x.shape[0] if per_step else g.ch.between(1, 5)
    inner = x.shape[1:] if per_step else x.shape
    i, cin, s, cout, s2, o = (g.name(h) for h in ("iter", "cond", "s", "cond_out", "s_next", "scan"))
    a = g.ch.pick([0.5, -0.75, 1.0])
    body = []
    xt = g.name("xt")
    if per_step:
        body.append(helper.make_node("Gather", [x.name, i], [xt], axis=0))
    else:
        body.append(helper.make_node("Identity", [x.name], [xt]))
    th, sa, ka = g.name("th"), g.name("sa"), g.name("ka")
    body += [helper.make_node("Tanh", [xt], [th]),
             helper.make_node("Constant", [], [ka], value=numpy_helper.from_array(np.array(a, np.float32))),
             helper.make_node("Mul", [s, ka], [sa]), helper.make_node("Add", [sa, th], [s2]),
             helper.make_node("Identity", [s2], [o])]
    counted = g.ch.chance(0.4)
    if counted:  # cond_out = (i + 1) < steps; the trip count input is left out
        one, nxt, lim = g.name("one"), g.name("next"), g.name("lim")
        body += [helper.make_node("Constant", [], [one], value=numpy_helper.from_array(np.array(1, np.int64))),
                 helper.make_node("Add", [i, one], [nxt]),
                 helper.make_node("Constant", [], [lim], value=numpy_helper.from_array(np.array(steps, np.int64))),
                 helper.make_node("Less", [nxt, lim], [cout])]
    else:
        body.append(helper.make_node("Identity", [cin], [cout]))
    graph = helper.make_graph(
        body, g.name("body"),
        [helper.make_tensor_value_info(i, TensorProto.INT64, []), helper.make_tensor_value_info(cin, TensorProto.BOOL, []),
         helper.make_tensor_value_info(s, _F, list(inner))],
        [helper.make_tensor_value_info(cout, TensorProto.BOOL, []), helper.make_tensor_value_info(s2, _F, list(inner)),
         helper.make_tensor_value_info(o, _F, list(inner))])
    s0 = g.pick(lambda u: u.shape == tuple(inner) and u.mag <= 4) or g.weight(inner, 1.0, hint="s0")
    bound = s0.mag * max(1.0, abs(a)) ** steps + steps * 1.0 + 1
    trip = None if counted else g.ints(steps)
    cond = g.const(np.array(True), "c0")
    g.node("Loop", [trip, cond, s0], [(tuple(inner), "float32", -bound, bound),
                                      ((steps,) + tuple(inner), "float32", -bound, bound)], body=graph)


def p_sequence(g: Gen) -> None:
    """The sequence ops between tensors: SplitToSequence then ConcatFromSequence (with or without a
    new axis) or SequenceAt; SequenceConstruct, SequenceInsert and SequenceErase then a concat;
    SequenceLength read back as float. The sequences never leave the graph."""
    x = g.pick_or_input(lambda u: u.rank >= 1 and u.shape[0] >= 1 and u.numel <= 4096)
    if x.rank == 0 or x.numel > 4096:
        return
    axis = g.ch.below(x.rank)
    n = x.shape[axis]
    seq = g.name("seq")
    kind = g.ch.pick(["split", "construct"])
    lo, hi = x.lo, x.hi
    if kind == "split":
        if g.ch.chance(0.5) and n >= 2:
            cut = g.ch.between(1, n - 1)
            sizes = [cut, n - cut]
            split = [g.ints(sizes)]
        elif g.ch.chance(0.5):
            sizes, split = [1] * n, []
        else:
            step = g.ch.between(1, n)
            sizes, split = [step] * (n // step) + ([n % step] if n % step else []), [g.ints(step)]
        keep = int(g.ch.chance(0.5)) if not split else 1
        g.nodes.append(helper.make_node("SplitToSequence", [x.name] + [s.name for s in split], [seq], axis=axis,
                                        **({} if keep else {"keepdims": 0})))
        pieces = [tuple(s if k == axis else d for k, d in enumerate(x.shape)) for s in sizes]
        if not keep:
            pieces = [p[:axis] + p[axis + 1:] for p in pieces]
    else:
        pieces = [x.shape]
        names, lo, hi = [x.name], x.lo, x.hi
        for _ in range(g.ch.between(1, 2)):
            m = g.ch.pick([1, 2, 3])
            shp = tuple(m if k == axis else d for k, d in enumerate(x.shape))
            if int(np.prod(shp)) > MAX_NUMEL:
                return
            v = g.pick(lambda u: u.shape == shp and u.name not in names) or g.input(shp)
            names.append(v.name)
            pieces.append(shp)
            lo, hi = min(lo, v.lo), max(hi, v.hi)
        g.nodes.append(helper.make_node("SequenceConstruct", names, [seq]))
        if g.ch.chance(0.4) and len(pieces) > 1:
            pos = g.ch.below(len(pieces))
            seq2 = g.name("seq")
            g.nodes.append(helper.make_node("SequenceErase", [seq, g.ints(pos).name], [seq2]))
            del pieces[pos]
            seq = seq2
        keep = 1
    end = g.ch.pick(["concat", "at", "length"])
    if end == "at":
        pos = g.ch.between(-len(pieces), len(pieces) - 1)
        g.one("SequenceAt", [seq, g.ints(pos)], pieces[pos], lo, hi)
    elif end == "length":
        ln = g.one("SequenceLength", [seq], (), len(pieces), len(pieces), dtype="int64")
        lf = g.one("Cast", [ln], (), len(pieces), len(pieces), to=_F)
        g.one("Mul", [x, lf], x.shape, *sorted((x.lo * len(pieces), x.hi * len(pieces))))
    else:
        new_axis = int(len({p for p in pieces}) == 1 and g.ch.chance(0.4))
        rank = len(pieces[0])
        if new_axis:
            ax = g.ch.between(0, rank)
            out = pieces[0][:ax] + (len(pieces),) + pieces[0][ax:]
        else:
            if not keep or rank == 0:
                return
            ax = axis
            out = tuple(sum(p[ax] for p in pieces) if k == ax else d for k, d in enumerate(pieces[0]))
        g.one("ConcatFromSequence", [seq], out, lo, hi, axis=ax, **({"new_axis": 1} if new_axis else {}))


# ------------------------------------------------------------------------------------------------
# Opset 23's transformer ops
# ------------------------------------------------------------------------------------------------
def p_attention(g: Gen) -> None:
    """Opset 23's Attention: 4-D (batch, heads, seq, dim) or 3-D (batch, seq, heads·dim) inputs,
    grouped-query heads, a bool or additive mask, causal or not, a scale and a softcap, and a KV
    cache (past keys and values in, the present ones out) in place of the causal mask."""
    if g.opset < 23:
        return
    b, sq, skv = g.ch.pick([1, 2]), g.ch.pick([1, 3, 4, 7]), g.ch.pick([1, 3, 5, 8])
    kvh = g.ch.pick([1, 2])
    qh, d, dv = kvh * g.ch.pick([1, 2]), g.ch.pick([2, 4, 8]), g.ch.pick([2, 4, 8])
    three = g.ch.chance(0.4)
    if three:
        shapes = [(b, sq, qh * d), (b, skv, kvh * d), (b, skv, kvh * dv)]
        out = (b, sq, qh * dv)
        attrs = {"q_num_heads": qh, "kv_num_heads": kvh}
    else:
        shapes = [(b, qh, sq, d), (b, kvh, skv, d), (b, kvh, skv, dv)]
        out = (b, qh, sq, dv)
        attrs = {}
    q, k, v = (g.bounded(g.pick(lambda u, s=s: u.shape == s) or g.input(s), 5.0) for s in shapes)
    ins: list = [q, k, v]
    past = g.ch.pick([0, 0, 2, 4])
    total = past + skv
    causal = not past and sq <= skv and g.ch.chance(0.3)
    if causal:
        attrs["is_causal"] = 1
    elif g.ch.chance(0.5):
        mshape = g.ch.pick([(sq, total), (1, 1, sq, total), (b, 1, sq, total)])
        if g.ch.chance(0.5):
            m = g.rs.random(mshape) < 0.7
            m[..., 0] = True  # every query keeps a key: a row masked whole is NaN
            ins.append(g.const(m, "mask"))
        else:
            ins.append(g.weight(mshape, 2.0, hint="mask"))
    if g.ch.chance(0.3):
        attrs["scale"] = g.ch.pick([0.125, 0.5, 1.0])
    if g.ch.chance(0.2):
        attrs["softcap"] = g.ch.pick([5.0, 30.0])
    if not past:
        g.one("Attention", ins, out, -v.mag, v.mag, **attrs)
        return
    while len(ins) < 4:
        ins.append(None)
    pk, pv = g.input((b, kvh, past, d), hint="past_k"), g.input((b, kvh, past, dv), hint="past_v")
    mag = max(v.mag, pv.mag)
    g.node("Attention", ins + [pk, pv], [(out, "float32", -mag, mag),
                                         ((b, kvh, total, d), "float32", -max(k.mag, pk.mag), max(k.mag, pk.mag)),
                                         ((b, kvh, total, dv), "float32", -mag, mag)], **attrs)


def p_rotary(g: Gen) -> None:
    """Opset 23's RotaryEmbedding on 4-D or 3-D input, with position ids into a cos/sin cache or
    caches per position, interleaved or not, over the whole head or a part of it."""
    if g.opset < 23:
        return
    b, s, h, d = g.ch.pick([1, 2]), g.ch.pick([1, 3, 5]), g.ch.pick([1, 2]), g.ch.pick([4, 8])
    rot = g.ch.pick([d, d // 2]) if d >= 4 else d
    four = g.ch.chance(0.5)
    shape = (b, h, s, d) if four else (b, s, h * d)
    x = g.bounded(g.pick(lambda u: u.shape == shape) or g.input(shape), 10.0)
    attrs = {"interleaved": int(g.ch.chance(0.5))}
    if rot != d:
        attrs["rotary_embedding_dim"] = rot
    if not four:
        attrs["num_heads"] = h
    if g.ch.chance(0.6):
        maxpos = s + g.ch.between(0, 4)
        theta = np.arange(maxpos)[:, None] / (10000 ** (np.arange(rot // 2) / (rot // 2)))[None, :]
        cos, sin = np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)
        pos = g.const(g.rs.integers(0, maxpos, (b, s)).astype(np.int64), "pos")
        ins = [x, g.const(cos, "cos"), g.const(sin, "sin"), pos]
    else:
        theta = g.rs.uniform(0, 6.3, (b, s, rot // 2))
        ins = [x, g.const(np.cos(theta).astype(np.float32), "cos"), g.const(np.sin(theta).astype(np.float32), "sin")]
    g.one("RotaryEmbedding", ins, shape, -2 * x.mag, 2 * x.mag, **attrs)


def p_rms_norm(g: Gen) -> None:
    """Opset 23's RMSNormalization over the trailing axes from `axis`, with a scale."""
    if g.opset < 23:
        return
    x = g.pick_or_input(lambda u: u.rank >= 1)
    if x.rank == 0:
        return
    axis = g.ch.between(-x.rank, x.rank - 1)
    tail = x.shape[axis % x.rank:]
    lim = math.sqrt(int(np.prod(tail))) + 0.5
    sshape = tail[g.ch.between(0, len(tail) - 1):] if tail else ()
    g.one("RMSNormalization", [x, g.weight(sshape, 1.0, hint="gamma")], x.shape, -lim, lim, axis=axis,
          epsilon=g.ch.pick([1e-5, 1e-6]))


#: (pattern, weight), added to graphgen's with `more_ops=True`.
MORE_PATTERNS = [
    (p_qdq, 6), (p_dynamic_quant, 3), (p_einsum, 5), (p_grid_sample, 3), (p_deform_conv, 2), (p_shape_math, 4),
    (p_select, 4), (p_lp, 3), (p_packed_rnn, 3), (p_loop, 3), (p_sequence, 3), (p_attention, 10), (p_rotary, 5),
    (p_rms_norm, 4),
]
#: The opsets a `more_ops` graph may have: graphgen's, and 21 (blocked quantization) and 23
#: (Attention, RotaryEmbedding, RMSNormalization).
MORE_OPSETS = [17, 18, 13, 20, 21, 23]
