"""GridSample and AffineGrid written as standard ops at import (composite.py), once every shape is static.

GridSample: every output point reads a few taps of X (1 for nearest, 2 per spatial dim for linear,
4 per dim for cubic), each at an integer position found from the point's grid coordinate. The taps
of all points are gathered at once: a GatherElements on X flattened to [N, C, prod(spatial)], at
flat indices [N, C, taps * points] (the index is the same for every channel: an Expand along C).
The weighted sum then runs one spatial dim at a time, innermost first (ReduceSum over its taps),
which is the order onnxruntime's kernel adds them in.

The formulas follow onnxruntime's CPU kernel (onnxruntime/core/providers/cpu/tensor/grid_sample.cc),
the reference the tests compare with, op for op where the rounding can show:
  - a normalized coordinate g becomes ((g + 1) / 2) * (L - 1) with align_corners, else
    ((g + 1) * L - 1) / 2 (L: the length of the dim it indexes; g's last dim is ordered x, y[, z],
    so component 0 indexes the LAST spatial dim);
  - nearest rounds half to even (nearbyint: ONNX Round); linear and cubic take floor(x) and its
    neighbours;
  - the padding mode is applied to each TAP, not to the coordinate: zeros reads 0 outside the
    input, border clamps the tap's index, reflection folds it about [-0.5, L - 0.5] (about
    [0, L - 1] with align_corners) until it lies inside, with the kernel's own formula. The
    coordinate itself is never clamped or reflected first: for cubic that would pick other taps
    and weights near the borders, and for nearest it would round after folding, not before;
  - cubic uses Keys' kernel with A = -0.75 on 4x4 taps; 5-D inputs have no cubic mode there,
    so none here either.

Every gather index is brought into [0, L - 1] per dim (Max/Min on the integers, after a float
clamp that also maps NaN to 0: converting NaN or a huge float to an integer is undefined in C),
so dlcc's interval analysis (ops/ranges.py) proves the flat index in range and launches no
device-side index check. Out-of-range taps in zeros mode read 0 through a mask (Where) on the
gathered values, so an inf or NaN in X at a clamped position cannot leak into the result.

AffineGrid: constant base coordinates (Eigen's LinSpaced, as onnxruntime builds them, scaled by
(L - 1) / L without align_corners) times theta's columns, summed in the order onnxruntime's Eigen
product sums them, plus theta's last column: a few broadcast Muls and Adds, which AStitch fuses.
(A MatMul against [x, y, 1] would be one op, but its accumulation order differs by an ulp, and a
grid an ulp off moves a GridSample behind it by up to (L / 2) ulp times the image's gradient.)

Inputs are computed in float32; float16 and bfloat16 ones are cast up and the result cast back
(onnxruntime has float and double kernels only, and runs a float16 model through Casts too).
"""
from __future__ import annotations

import numpy as np
import onnx

_F = onnx.TensorProto.FLOAT
_I64 = onnx.TensorProto.INT64
_FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
_CUBIC_A = np.float32(-0.75)

#: The interpolation modes' names at opset 16 and from opset 20 on (onnxruntime accepts each
#: opset's own names only).
_MODES = {16: {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"},
          20: {"linear": "linear", "nearest": "nearest", "cubic": "cubic"}}
#: The taps read along each dim, relative to floor(x) (round(x) for nearest).
_TAPS = {"nearest": [0], "linear": [0, 1], "cubic": [-1, 0, 1, 2]}


def _string(b, name: str, default: str) -> str:
    v = b.attr(name, default.encode())
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _f32(b, values, shape) -> str:
    return b.constant(np.asarray(values, np.float32).reshape(shape), np.float32)


# -- GridSample -----------------------------------------------------------------------------------
def lower_grid_sample(b) -> None:
    """Y [N, C, out...] = X sampled at grid [N, out..., r] (see the module's docstring)."""
    if len(b.node.input) != 2 or not all(b.node.input):
        raise b.fail("takes 2 inputs: X and grid")
    x, grid = b.node.input
    names = _MODES[20 if b.opset >= 20 else 16]
    default = "linear" if b.opset >= 20 else "bilinear"
    mode_name = _string(b, "mode", default)
    if mode_name not in names:
        raise b.fail(f"mode must be one of {', '.join(names)} at opset {b.opset}, not {mode_name!r}")
    mode = names[mode_name]
    padding = _string(b, "padding_mode", "zeros")
    if padding not in ("zeros", "border", "reflection"):
        raise b.fail(f"padding_mode must be zeros, border or reflection, not {padding!r}")
    align = int(b.attr("align_corners", 0)) != 0  # (onnxruntime reads it as a bool: any non-zero is on)

    xs, gs = b.shape(x), b.shape(grid)
    r = len(xs) - 2  # (onnx defines GridSample-16 on 4-D inputs; onnxruntime's kernel takes 5-D there too)
    if r not in (2, 3):
        raise b.unsupported(f"a {len(xs)}-D input (4-D and 5-D are; onnxruntime has no other kernel)")
    if r == 3 and mode == "cubic":
        raise b.unsupported("cubic mode on a 5-D input (onnxruntime has no kernel for it either)")
    if len(gs) != r + 2 or gs[0] != xs[0] or gs[-1] != r:
        raise b.fail(f"grid must have shape [{xs[0]}, {', '.join(['out'] * r)}, {r}] for an input of shape "
                     f"{list(xs)}, not {list(gs)}")
    x_elem, g_elem = b.elem(x) or _F, b.elem(grid) or _F
    if x_elem not in _FLOATS or g_elem not in _FLOATS:
        raise b.unsupported("a GridSample on other than float32, float16 or bfloat16 tensors")

    n, c, spatial, out_spatial = xs[0], xs[1], list(xs[2:]), list(gs[1:-1])
    size, points = int(np.prod(spatial)), int(np.prod(out_spatial))
    out_shape = [n, c, *out_spatial]
    if n * c * points == 0:  # nothing to read: an empty output of the right shape
        zero = b.constant(np.zeros(out_shape, onnx.helper.tensor_dtype_to_np_dtype(x_elem)),
                          onnx.helper.tensor_dtype_to_np_dtype(x_elem))
        b.op("Identity", [zero], b.node.output[0])
        return
    if size == 0:
        raise b.unsupported("sampling an input with an empty spatial dim")

    xf, _ = b.to_float(x)
    gf, _ = b.to_float(grid)
    # lengths per grid component k (component k indexes spatial dim r - 1 - k)
    lengths = [spatial[r - 1 - k] for k in range(r)]
    coord = _denormalize(b, b.op("Reshape", [gf, b.ints(n, points, r)]), lengths, align)  # [N, P, r]
    coord = b.unsqueeze(b.op("Transpose", [coord], perm=[0, 2, 1]), [2])  # [N, r, 1, P]

    offsets = _TAPS[mode]
    k = len(offsets)
    base = b.op("Round" if mode == "nearest" else "Floor", [coord])
    taps = b.op("Add", [base, _f32(b, offsets, [1, 1, k, 1])]) if offsets != [0] else base  # [N, r, K, P]
    weights = None if mode == "nearest" else _weights(b, coord, base, mode)  # [N, r, K, P]

    mapped = _reflect(b, taps, lengths, align) if padding == "reflection" else taps
    last = _f32(b, [L - 1 for L in lengths], [1, r, 1, 1])
    # NaN and anything outside [0, L - 1] to a finite value inside, before the conversion to int
    safe = b.op("Where", [b.op("GreaterOrEqual", [mapped, _f32(b, 0, [])]), mapped, _f32(b, 0, [])])
    safe = b.op("Where", [b.op("LessOrEqual", [safe, last]), safe, last])
    inside = None
    if padding == "zeros":
        inside = b.op("And", [b.op("GreaterOrEqual", [taps, _f32(b, 0, [])]), b.op("LessOrEqual", [taps, last])])

    # the flat index, and the zeros mode's mask, over all taps: [N, 1, K(dim 0), ..., K(dim r-1), P]
    strides = [int(np.prod(spatial[s + 1:])) for s in range(r)]
    flat = mask = None
    for s in range(r):
        comp = r - 1 - s
        at = [n, 1] + [k if j == s else 1 for j in range(r)] + [points]  # taps along axis 2 + s
        i = b.op("Cast", [b.slice(safe, comp, comp + 1, 1)], to=_I64)
        i = b.op("Max", [b.op("Min", [i, b.constant(np.int64(spatial[s] - 1), np.int64)]),
                         b.constant(np.int64(0), np.int64)])
        i = b.op("Reshape", [i, b.ints(*at)])
        if strides[s] != 1:
            i = b.op("Mul", [i, b.constant(np.int64(strides[s]), np.int64)])
        flat = i if flat is None else b.op("Add", [flat, i])
        if inside is not None:
            m = b.op("Reshape", [b.slice(inside, comp, comp + 1, 1), b.ints(*at)])
            mask = m if mask is None else b.op("And", [mask, m])

    taps_total = k ** r
    flat = b.op("Reshape", [flat, b.ints(n, 1, taps_total * points)])
    if c != 1:
        flat = b.op("Expand", [flat, b.ints(n, c, taps_total * points)])
    values = b.op("GatherElements", [b.op("Reshape", [xf, b.ints(n, c, size)]), flat], axis=2)
    values = b.op("Reshape", [values, b.ints(n, c, *([k] * r), points)])  # [N, C, K, ..., K, P]
    if mask is not None:
        values = b.op("Where", [mask, values, _f32(b, 0, [])])
    # the weighted sums, the innermost spatial dim (grid component 0) first
    for s in reversed(range(r) if weights is not None else []):
        comp = r - 1 - s
        w = b.op("Reshape", [b.slice(weights, comp, comp + 1, 1), b.ints(n, 1, *([1] * s), k, points)])
        values = b.op("ReduceSum", [b.op("Mul", [values, w]), b.ints(2 + s)], keepdims=0)
    b.output(b.op("Reshape", [values, b.ints(*out_shape)]), 0, x_elem)


def _denormalize(b, g: str, lengths: list[int], align: bool) -> str:
    """Normalized coordinates (last dim: one per component) to positions in pixels, in the
    kernel's order of operations: ((g + 1) / 2) * (L - 1), or ((g + 1) * L - 1) / 2."""
    r = len(lengths)
    one, two = _f32(b, 1, []), _f32(b, 2, [])
    g1 = b.op("Add", [g, one])
    if align:
        return b.op("Mul", [b.op("Div", [g1, two]), _f32(b, [L - 1 for L in lengths], [r])])
    return b.op("Div", [b.op("Sub", [b.op("Mul", [g1, _f32(b, lengths, [r])]), one]), two])


def _weights(b, coord: str, base: str, mode: str) -> str:
    """Each tap's weight along each dim, [N, r, K, P]: linear (x1 + 1 - x, x - x1); cubic, Keys'
    coefficients of t = x - floor(x), the kernel's polynomials term for term."""
    if mode == "linear":
        right = b.op("Sub", [coord, base])  # dx1: the weight of tap x1 + 1
        left = b.op("Sub", [b.op("Add", [base, _f32(b, 1, [])]), coord])  # dx2: the weight of tap x1
        return b.op("Concat", [left, right], axis=2)
    t = b.op("Sub", [coord, base])
    # distance of each tap from x: t + 1, t, 1 - t, 2 - t (|t - offset| is the same float)
    d = b.op("Abs", [b.op("Sub", [t, _f32(b, [-1, 0, 1, 2], [1, 1, 4, 1])])])
    a = _CUBIC_A
    # |d| <= 1: ((A + 2) d - (A + 3)) d d + 1
    near = b.op("Mul", [b.op("Sub", [b.op("Mul", [_f32(b, a + 2, []), d]), _f32(b, a + 3, [])]), d])
    near = b.op("Add", [b.op("Mul", [near, d]), _f32(b, 1, [])])
    # 1 < |d| < 2: ((A d - 5A) d + 8A) d - 4A
    far = b.op("Sub", [b.op("Mul", [_f32(b, a, []), d]), _f32(b, 5 * a, [])])
    far = b.op("Add", [b.op("Mul", [far, d]), _f32(b, 8 * a, [])])
    far = b.op("Sub", [b.op("Mul", [far, d]), _f32(b, 4 * a, [])])
    inner = b.constant(np.array([False, True, True, False]).reshape(1, 1, 4, 1), np.bool_)
    return b.op("Where", [inner, near, far])


def _reflect(b, c: str, lengths: list[int], align: bool) -> str:
    """Tap positions folded into [lo, hi] = [-0.5, L - 0.5] ([0, L - 1] with align_corners) as
    the kernel's GsReflect does: past a border by dx, n = trunc(dx / range) whole ranges and a
    rest r = dx - n range; an even n lands at (that border -+ r), an odd one at (the other +- r).
    A tap is an integer and the borders are integers or halves, so the result is an integer."""
    r = len(lengths)
    lo = [0.0 if align else -0.5] * r
    hi = [L - 1.0 if align else L - 0.5 for L in lengths]
    # (a range of 0 -- L = 1 with align_corners -- has one place to land; the clamp that follows
    # puts every tap there, so the division uses 1 instead of 0)
    span = [h - low or 1.0 for low, h in zip(lo, hi)]
    lo_c, hi_c, span_c = (_f32(b, v, [1, r, 1, 1]) for v in (lo, hi, span))
    below, above = b.op("Less", [c, lo_c]), b.op("Greater", [c, hi_c])
    dx = b.op("Where", [below, b.op("Sub", [lo_c, c]), b.op("Sub", [c, hi_c])])
    whole = b.op("Floor", [b.op("Div", [dx, span_c])])  # (dx >= 0 where it is used: floor is trunc)
    rest = b.op("Sub", [dx, b.op("Mul", [whole, span_c])])
    half = b.op("Floor", [b.op("Mul", [whole, _f32(b, 0.5, [])])])
    odd = b.op("Greater", [b.op("Sub", [whole, b.op("Mul", [half, _f32(b, 2, [])])]), _f32(b, 0.5, [])])
    from_lo = b.op("Xor", [below, odd])  # below and even, or above and odd: lo + r; else hi - r
    folded = b.op("Where", [from_lo, b.op("Add", [lo_c, rest]), b.op("Sub", [hi_c, rest])])
    return b.op("Where", [b.op("Or", [below, above]), folded, c])


# -- AffineGrid -----------------------------------------------------------------------------------
def lower_affine_grid(b) -> None:
    """grid [N, (D,) H, W, r] = [x, y(, z), 1] @ theta^T at every point of a base grid of
    normalized coordinates (x along W)."""
    if len(b.node.input) != 2 or not all(b.node.input):
        raise b.fail("takes 2 inputs: theta and size")
    theta, size_name = b.node.input
    size = b.const(size_name)
    if size is None:
        raise b.unsupported("a size computed at run time (the grid's shape would depend on it)")
    size = [int(v) for v in np.asarray(size).reshape(-1)]
    if len(size) not in (4, 5) or any(v < 0 for v in size):
        raise b.fail(f"size must be [N, C, H, W] or [N, C, D, H, W] of lengths of 0 or more, not {size}")
    align = int(b.attr("align_corners", 0)) != 0
    r = len(size) - 2
    n, spatial = size[0], size[2:]
    ts = b.shape(theta)
    if ts != (n, r, r + 1):
        raise b.fail(f"theta must have shape [{n}, {r}, {r + 1}] for size {size}, not {list(ts)}")
    elem = b.elem(theta) or _F
    if elem not in _FLOATS:
        raise b.unsupported("an AffineGrid on other than float32, float16 or bfloat16 tensors")
    out_shape = [n, *spatial, r]
    points = int(np.prod(spatial))
    if n * points == 0:
        dt = onnx.helper.tensor_dtype_to_np_dtype(elem)
        b.op("Identity", [b.constant(np.zeros(out_shape, dt), dt)], b.node.output[0])
        return
    axes = [_base_axis(L, align) for L in reversed(spatial)]  # x (along W) first
    mesh = np.meshgrid(*[axes[k] for k in reversed(range(r))], indexing="ij")  # spatial order, as the output
    tf, _ = b.to_float(theta)
    cols = b.op("Transpose", [tf], perm=[0, 2, 1])  # [N, r + 1, r]: row k holds theta[:, :, k]
    # onnxruntime's Eigen product adds the terms as x R0 + (y R1 + z R2), then the translation
    terms = [b.op("Mul", [b.constant(mesh[r - 1 - k].reshape(points, 1), np.float32), b.slice(cols, k, k + 1, 1)])
             for k in range(r)]  # [P, 1] * [N, 1, r] = [N, P, r]
    grid = terms[-1]
    for t in reversed(terms[:-1]):
        grid = b.op("Add", [t, grid])
    grid = b.op("Add", [grid, b.slice(cols, r, r + 1, 1)])
    b.output(b.op("Reshape", [grid, b.ints(*out_shape)]), 0, elem)


def _base_axis(length: int, align: bool) -> np.ndarray:
    """onnxruntime's base coordinates along one dim: Eigen's LinSpaced(length, -1, 1) in float
    (-1 + i * step, the last one exactly 1, a single point at 1), times (L - 1) / L without
    align_corners."""
    f = np.float32
    if length == 1:
        v = np.array([1.0], f)
    else:
        step = f(f(2) / f(length - 1))
        v = (f(-1) + np.arange(length, dtype=f) * step).astype(f)
        v[-1] = f(1)
    if not align:
        v = (v * f(length - 1) / f(length)).astype(f)
    return v
