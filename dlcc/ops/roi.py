"""RoiAlign: each region of interest pooled to a fixed grid of bilinear samples (Mask R-CNN).

The arithmetic is onnxruntime's CPU kernel's (onnxruntime/core/providers/cpu/object_detection/
roialign.cc, which onnx.reference follows too), step for step where the rounding can show:
  - a ROI's corners are scaled by `spatial_scale`, less 0.5 with coordinate_transformation_mode
    half_pixel (opset 16's default; opset 10 has no such attribute and no offset). Without the
    offset a ROI is at least 1 x 1;
  - each of the output_height x output_width bins is sampled on a grid of `sampling_ratio` x
    `sampling_ratio` points, or ceil(bin size) points per axis where sampling_ratio is 0 (so the
    count depends on the ROI, a value known only at run time: the loops' bounds are computed in
    the kernel);
  - a sample at (y, x) outside [-1, H] x [-1, W] contributes 0 (times X's first element, as the
    kernel's zeroed weights at position 0 give), one inside is clamped into the map and
    interpolated from its four neighbours;
  - avg mode sums the samples and divides by their count; max mode takes, per sample, the
    largest of the four weighted neighbours (not the interpolated value: onnxruntime's warning
    calls this a bug it keeps, and the spec's reference does the same), then the largest sample.
    dlcc's max keeps a NaN wherever it comes (numpy's rule, as its reductions do), where
    onnxruntime's std::max keeps one only where it comes first.

The sample coordinates decide a branch (inside or outside the map, and which neighbours), so
their products are never fused into an FMA (F_MUL_RN): a sample exactly on the border lands on
the side onnxruntime's unfused arithmetic puts it.

Bounded work on any input. A sample's position is a linear function of its index, so the kernel
computes the index range whose samples can lie in the map (a superset, widened by the float
rounding's worst case), loops over that range only, and counts the rest as skipped samples: a
ROI a million pixels wide costs about as much as one as wide as the map, and the per-axis count
is capped at 2^31 (onnxruntime refuses such ROIs: its sample table overflows). Corners near
FLT_MAX, whose positions overflow to NaN, give NaN where onnxruntime reads at an undefined index.
Errors, as in
onnxruntime: batch indices outside [0, N) and ROIs holding an inf or a NaN (the index checks'
machinery, kernels/index_check.py: a constant at compile time, a graph input on the host, a
computed operand on the device).
"""
from __future__ import annotations

import numpy as np

from ..kernels.index_check import FINITE
from ..kernels.map import emit_map
from ..kernels.program import ctype, load_float
from .layout import index_check
from .registry import LAYOUT, register

#: The largest sample count per axis of one bin (a float's integers are exact up to 2^24; past
#: 2^31 onnxruntime's int64 sample table overflows, so nothing past it is a result to match).
MAX_GRID = 2 ** 31


def _literal(x: float) -> str:
    """A float32 constant as C source (the attribute's own float32 value, exactly)."""
    return f"{float(np.float32(x))!r}f" if np.isfinite(np.float32(x)) else ("DLCC_INF" if x > 0 else "(-DLCC_INF)")


def _grid_count(name: str, bin_size: str, ratio: int) -> str:
    """The samples per axis of a bin: the ratio, or ceil(bin size), 0 where that is not positive
    (no sample then; NaN included) and MAX_GRID at most."""
    if ratio > 0:
        return f"const i64 {name} = {ratio};"
    return (f"const float {name}f = F_CEIL({bin_size}); "
            f"const i64 {name} = {name}f > 0.0f ? ({name}f < {float(MAX_GRID)!r}f ? (i64){name}f : (i64){MAX_GRID}) : 0;")


def _sample_range(axis: str, base: str, size: str, grid: str, limit: int) -> list[str]:
    """Statements giving [{axis}lo, {axis}hi], the sample indices along one axis whose position
    base + (i + 0.5) * size / grid can lie in [-1, limit]: solved for i in float, widened by 2
    plus the worst rounding of the positions and of the solution (8 ulps of the largest term,
    in samples), clamped to [0, grid - 1]. A NaN bound widens to the whole grid. Empty where no
    sample can be in the map (a non-finite base or bin size: every position is inf or NaN)."""
    lo, hi = f"{axis}lo", f"{axis}hi"
    return [
        f"i64 {lo} = 0, {hi} = -1;",
        f"if ({grid} > 0 && F_ISFINITE({base}) && F_ISFINITE({size})) {{",
        f"    if ({size} == 0.0f) {{ {hi} = {grid} - 1; }} else {{",
        f"        const float g = (float){grid}, per = g / {size};",
        f"        const float t1 = (-1.0f - {base}) * per - 0.5f, t2 = ({limit}.0f - {base}) * per - 0.5f;",
        f"        const float m = 2.0f + 1e-6f * (F_FABS({base}) + {limit + 1}.0f + F_FABS({size})) * F_FABS(per);",
        f"        const float a = F_MIN(t1, t2) - m, z = F_MAX(t1, t2) + m;",
        f"        {lo} = !(a > 0.0f) ? 0 : (a >= g - 1.0f ? {grid} - 1 : (i64)F_FLOOR(a));",
        f"        {hi} = !(z < g - 1.0f) ? {grid} - 1 : (z <= 0.0f ? 0 : (i64)F_CEIL(z));",
        "    }",
        "}",
    ]


def _neighbours(c: str, limit: int) -> list[str]:
    """From the sample's position {c}0 along one axis: the clamped coordinate {c}, its low and high
    neighbours ({c}_lo, {c}_hi) and its weights l_{c} and h_{c}, as the kernel's pre-calculation
    gives them: clamped to 0 from below, pinned to the last row or column from above."""
    return [
        f"float {c} = {c}0 <= 0.0f ? 0.0f : {c}0;",
        f"int {c}_lo = (int){c}, {c}_hi;",
        f"if ({c}_lo >= {limit - 1}) {{ {c}_lo = {c}_hi = {limit - 1}; {c} = (float){c}_lo; }} else {{ {c}_hi = {c}_lo + 1; }}",
        f"const float l_{c} = {c} - (float){c}_lo, h_{c} = 1.0f - l_{c};",
    ]


@register("RoiAlign", since=10, category=LAYOUT, float_only=True, half_io=True)
def _roi_align(ctx, node):
    """Y [R, C, output_height, output_width] from X [N, C, H, W], rois [R, 4] (x1, y1, x2, y2) and
    batch_indices [R] (see the module's docstring). One thread per output element; its loops
    over the bin's samples have bounds computed from the ROI."""
    if len(node.inputs) != 3 or not all(node.inputs):
        raise ctx.fail("takes 3 inputs: X, rois and batch_indices")
    x, rois, bidx = node.inputs
    out = node.outputs[0]
    xs, rs, bs = ctx.shape(x), ctx.shape(rois), ctx.shape(bidx)
    if len(xs) != 4:
        raise ctx.fail(f"X must be 4-D [N, C, H, W], not {list(xs)}")
    if len(rs) != 2 or rs[1] != 4:
        raise ctx.fail(f"rois must have shape [num_rois, 4], not {list(rs)}")
    if len(bs) != 1 or bs[0] != rs[0]:
        raise ctx.fail(f"batch_indices must have shape [{rs[0]}] (one per ROI), not {list(bs)}")
    if ctx.dtype(bidx) != "int64":
        raise ctx.fail(f"batch_indices must be int64, not {ctx.dtype(bidx)}")
    mode = ctx.attr("mode", "avg")
    ratio = int(ctx.attr("sampling_ratio", 0))
    if ratio < 0:
        raise ctx.fail(f"sampling_ratio must be 0 (adaptive) or more, not {ratio}")
    half_pixel = ctx.graph.opset >= 16 and ctx.attr("coordinate_transformation_mode", "half_pixel") == "half_pixel"
    scale = float(ctx.attr("spatial_scale", 1.0))
    n, c, h, w = xs
    r, _, oh, ow = ctx.shape(out)
    if r * c * oh * ow == 0:
        return  # nothing to compute (the checks below still hold for a later shape: none here)
    if h * w == 0:
        raise ctx.unsupported("pooling from an empty feature map")

    index_check(ctx, node, bidx, [n], from_zero=True)
    index_check(ctx, node, rois, [1], kind=FINITE)
    xt, rt = ctx.dtype(x), ctx.dtype(rois)
    off = "0.5f" if half_pixel else "0.0f"

    def body(v):
        ri, ci, ph, pw = v.o
        corner = [f"F_MUL_RN({load_float(rt, 'x1', f'{ri} * 4 + {j}')}, {_literal(scale)}) - {off}" for j in range(4)]
        s = [f"const float sw = {corner[0]}, sh = {corner[1]}, ew = {corner[2]}, eh = {corner[3]};",
             "float rw = ew - sw, rh = eh - sh;"]
        if not half_pixel:  # std::max(size, 1): a NaN size stays NaN
            s.append("rw = rw < 1.0f ? 1.0f : rw; rh = rh < 1.0f ? 1.0f : rh;")
        s += [f"const float bh = rh / {oh}.0f, bw = rw / {ow}.0f;",
              _grid_count("gh", "bh", ratio), _grid_count("gw", "bw", ratio),
              f"const i64 b = x2[{ri}] < 0 ? 0 : (x2[{ri}] >= {n} ? {n - 1} : x2[{ri}]);  /* checked: see index_check */",
              f"GPTR const {ctype(xt)}* xp = x0 + (b * {c} + {ci}) * {h * w};",
              f"const float yb = sh + F_MUL_RN((float){ph}, bh), xb = sw + F_MUL_RN((float){pw}, bw);",
              *_sample_range("y", "yb", "bh", "gh", h), *_sample_range("x", "xb", "bw", "gw", w),
              "float acc = 0.0f; i64 taken = 0;",
              "for (i64 iy = ylo; iy <= yhi; ++iy) {",
              "    const float sy0 = yb + F_MUL_RN((float)iy + 0.5f, bh) / (float)gh;",
              "    for (i64 ix = xlo; ix <= xhi; ++ix) {",
              "        const float sx0 = xb + F_MUL_RN((float)ix + 0.5f, bw) / (float)gw;",
              f"        if (!(sy0 >= -1.0f && sy0 <= {h}.0f && sx0 >= -1.0f && sx0 <= {w}.0f)) continue;",
              *["        " + t for t in _neighbours("sy", h) + _neighbours("sx", w)],
              f"        const float v1 = h_sy * h_sx * {load_float(xt, 'xp', f'sy_lo * {w} + sx_lo')};",
              f"        const float v2 = h_sy * l_sx * {load_float(xt, 'xp', f'sy_lo * {w} + sx_hi')};",
              f"        const float v3 = l_sy * h_sx * {load_float(xt, 'xp', f'sy_hi * {w} + sx_lo')};",
              f"        const float v4 = l_sy * l_sx * {load_float(xt, 'xp', f'sy_hi * {w} + sx_hi')};"]
        if mode == "avg":
            s += ["        acc += v1 + v2 + v3 + v4;", "        ++taken;", "    }", "}",
                  "const i64 total = gh * gw;",
                  f"if (taken < total) acc += 0.0f * {load_float(xt, 'xp', '0')};  /* the skipped samples' zero weights */",
                  "acc = acc / (float)(total > 1 ? total : 1);"]
        else:
            s += ["        const float val = F_NMAX(F_NMAX(F_NMAX(v1, v2), v3), v4);",
                  "        acc = taken == 0 ? val : F_NMAX(acc, val);", "        ++taken;", "    }", "}",
                  f"if (taken < gh * gw) {{ const float z = 0.0f * {load_float(xt, 'xp', '0')}; "
                  "acc = taken == 0 ? z : F_NMAX(acc, z); }"]
        # Positions that overflow to NaN along an axis (a corner near FLT_MAX: a bin size of inf
        # times 0, or inf - inf) make the bin NaN, unless the other axis lies wholly outside the
        # map (every position there +-inf), which skips every sample as onnxruntime's test does.
        s += ["const int ynan = F_ISNAN(yb + bh), xnan = F_ISNAN(xb + bw);",
              "const int yout = !ynan && !(F_ISFINITE(yb) && F_ISFINITE(bh)), "
              "xout = !xnan && !(F_ISFINITE(xb) && F_ISFINITE(bw));",
              # (with a sampling_ratio the grid is a positive constant: no test, which clang
              # would warn about on every PoCL build, "use of logical '&&' with constant operand")
              f"if ({'' if ratio > 0 else 'gh > 0 && gw > 0 && '}(ynan || xnan) && !yout && !xout) acc = DLCC_NAN;"]
        return s, "acc"

    samples = ratio * ratio if ratio else 4
    emit_map(ctx, out, [x, rois, bidx], body, "RoiAlign", flops_per_elem=12 * samples, inline_scalars=False)
