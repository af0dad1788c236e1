"""Resize (nearest, N-linear, cubic, and the antialiased linear and cubic filters) and Upsample as
index expressions with interpolation weights.

onnxruntime is the reference: where the ONNX reference and onnxruntime part ways (the antialias
filter's borders, float rounding of source coordinates), the arithmetic here follows onnxruntime's
CPU kernels, in the same float operations and order, so that a nearest tap on an exact half and a
weight at a border come out the same. Where onnxruntime 1.32 departs from the spec, dlcc follows the
spec and the ONNX reference: onnxruntime ignores tf_crop_and_resize's roi along an axis whose length
does not change, and keep_aspect_ratio_policy skips an axis given as negative.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from ..kernels.map import emit_map
from ..kernels.program import literal
from .registry import LAYOUT, register

_F = np.float32
# Source coordinate of output coordinate {o} along one axis. {s}: the axis's scale; the others
# are per-axis constants computed on the host in float32 (`_coord`).
_COORD = {
    "half_pixel": "(({o} + 0.5f) / {s} - 0.5f)",
    "pytorch_half_pixel": "(({o} + 0.5f) / {s} - 0.5f)",  # 0 where the output is one pixel
    "asymmetric": "({o} / {s})",
    # o * (in - 1) / (out - 1) in that order, as onnxruntime computes it: the product is exact and
    # the one division correctly rounded, so an exact half (23 * 30 / 92 = 7.5) stays a half for
    # nearest_mode to round. Multiplying by a rounded ratio gave 7.5000005, and round_prefer_floor
    # took element 8 where onnxruntime and the ONNX reference take 7 (fuzz seed 991034).
    "align_corners": "({o} * {num} / {den})",  # 0 where the output is one pixel
    "tf_half_pixel_for_nn": "(({o} + 0.5f) / {s})",
    # The offset centres the resized grid when in * scale is not a whole number of pixels.
    "half_pixel_symmetric": "({offset} + (({o} + 0.5f) / {s} - 0.5f))",
    # roi (start, end) in normalised input coordinates
    "tf_crop_and_resize": "({start} + {o} * {span} * {num} / {den})",
}
_NEAREST = {
    "round_prefer_floor": "F_CEIL({c} - 0.5f)",
    "round_prefer_ceil": "F_FLOOR({c} + 0.5f)",
    "floor": "F_FLOOR({c})",
    "ceil": "F_CEIL({c})",
}
# The antialias filters (Pillow's, as onnxruntime uses them) over |x|, and their support in input
# pixels at scale 1; downscaling by f widens both by f.
_AA_FILTER = {
    "linear": ("({x} < 1.0f ? 1.0f - {x} : 0.0f)", 2.0),
    "cubic": ("({x} < 1.0f ? (({A} + 2.0f) * {x} - ({A} + 3.0f)) * {x} * {x} + 1.0f"
              " : ({x} < 2.0f ? ((({x} - 5.0f) * {x} + 8.0f) * {x} - 4.0f) * {A} : 0.0f))", 4.0),
}


class _Geometry:
    """Per-axis scales and, for tf_crop_and_resize, regions of interest, over every axis of the
    input: `axes` (opset 18) lists the axes the scales, sizes and roi inputs speak of, and the
    others keep scale 1 and roi [0, 1]."""

    def __init__(self, ctx, node, ins_, outs_, ctm: str):
        r = len(ins_)
        axes = ctx.attr("axes", None)
        axes = list(range(r)) if axes is None else [int(a) + r if int(a) < 0 else int(a) for a in axes]
        self.scales = [1.0] * r
        self.roi = [(0.0, 1.0)] * r
        if node.op_type == "Upsample" and "scales" in node.attrs:
            self.scales = [float(s) for s in node.attrs["scales"]]
            return
        opset11 = node.op_type == "Resize" and ctx.graph.opset >= 11
        scales, sizes = self._input(ctx, node, 2 if opset11 else 1), self._input(ctx, node, 3 if opset11 else -1)
        if scales is not None and scales.size:
            for a, s in zip(axes, scales.reshape(-1)):
                self.scales[a] = float(s)
        else:
            # in float32, as onnxruntime divides them (rounding the float64 quotient to float32 can differ)
            given = dict(zip(axes, sizes.reshape(-1))) if sizes is not None and sizes.size else \
                {a: outs_[a] for a in axes}
            per = {a: float(_F(given[a]) / _F(ins_[a])) for a in axes}
            policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
            if policy not in ("stretch", "not_larger", "not_smaller"):
                raise ctx.fail(f"keep_aspect_ratio_policy {policy!r} is not one of stretch, not_larger, not_smaller")
            if policy != "stretch":  # one scale for every listed axis: the smallest or the largest
                common = (min if policy == "not_larger" else max)(per.values())
                per = {a: common for a in axes}
            for a, s in per.items():
                self.scales[a] = s
        if ctm == "tf_crop_and_resize":
            roi = self._input(ctx, node, 1)
            if roi is None or roi.size != 2 * len(axes):
                raise ctx.fail(f"tf_crop_and_resize needs a constant roi of {2 * len(axes)} values "
                               f"(a start and an end per axis), got {None if roi is None else roi.size}")
            roi = roi.reshape(-1).astype(np.float32)
            for j, a in enumerate(axes):
                self.roi[a] = (float(roi[j]), float(roi[len(axes) + j]))

    @staticmethod
    def _input(ctx, node, k):
        if k < 0 or len(node.inputs) <= k or not node.inputs[k]:
            return None
        val = ctx.const(node.inputs[k])
        if val is None:
            what = ("X", "roi", "scales", "sizes")[k] if node.op_type == "Resize" and ctx.graph.opset >= 11 else "scales"
            raise ctx.fail(f"input {k} ({what}) must be a constant after folding")
        return val


def _fixed_coord(ctm: str, a: int, ins_, outs_, geo: _Geometry) -> float | None:
    """The source coordinate along axis `a` where it does not depend on the output coordinate (a
    one-pixel output in the modes that special-case it), else None."""
    if outs_[a] != 1 or ctm not in ("pytorch_half_pixel", "align_corners", "tf_crop_and_resize"):
        return None
    if ctm != "tf_crop_and_resize":
        return 0.0
    start, end = geo.roi[a]  # the middle of the region, in double as onnxruntime computes it
    return float(_F(0.5 * (float(_F(start)) + float(_F(end))) * (ins_[a] - 1)))


def _coord(ctm: str, o: str, a: int, ins_, outs_, geo: _Geometry) -> str:
    """The source coordinate expression of output coordinate `o` along axis `a` (float)."""
    n, olen, s = ins_[a], outs_[a], geo.scales[a]
    fixed = _fixed_coord(ctm, a, ins_, outs_, geo)
    if fixed is not None:
        return literal(fixed)
    k = dict(o=f"(float){o}", s=literal(s), num=literal(float(n - 1)), den=literal(float(max(olen - 1, 1))))
    if ctm == "half_pixel_symmetric":
        adjustment = _F(olen) / (_F(s) * _F(n))
        k["offset"] = literal(_F(n) / _F(2) * (_F(1) - adjustment))
    if ctm == "tf_crop_and_resize":
        start, end = (_F(v) for v in geo.roi[a])
        k.update(start=literal(start * _F(n - 1)), span=literal(end - start))
    return _COORD[ctm].format(**k)


@register("Resize", "Upsample", since=7, category=LAYOUT, half_io=True)
def _resize(ctx, node):
    x, out = node.inputs[0], node.outputs[0]
    ins_, outs_ = ctx.shape(x), ctx.shape(out)
    mode = ctx.attr("mode", "nearest")
    ctm = ctx.attr("coordinate_transformation_mode", "half_pixel" if ctx.graph.opset >= 11 else "asymmetric")
    nmode = ctx.attr("nearest_mode", "round_prefer_floor")
    legacy = node.op_type == "Upsample" or ctx.graph.opset < 11
    if legacy:
        # Upsample and Resize-10 are asymmetric; nearest floors when enlarging and rounds up when
        # shrinking (onnxruntime's "simple" mode).
        ctm, nmode = "asymmetric", "floor"
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    if mode not in ("nearest", "linear", "cubic"):
        raise ctx.fail(f"mode {mode!r} is not supported (nearest, linear and cubic are)")
    if ctm not in _COORD:
        raise ctx.fail(f"coordinate_transformation_mode {ctm!r} is not supported")
    if mode == "nearest" and nmode not in _NEAREST:
        raise ctx.fail(f"nearest_mode {nmode!r} is not supported")
    antialias = bool(ctx.attr("antialias", 0)) and mode != "nearest"
    if antialias and ctm == "tf_crop_and_resize":
        raise ctx.fail("antialias with tf_crop_and_resize is not supported")
    if antialias and ctx.value_dtype(x) != "float32":
        raise ctx.fail(f"antialias on {ctx.dtype(x)} is not supported (float inputs are)")
    # (Attributes are read here, not in `body`: AStitch calls a body later, with another node current.)
    cubic_a, exclude_outside = float(ctx.attr("cubic_coeff_a", -0.75)), bool(ctx.attr("exclude_outside", 0))
    extrapolate = ctm == "tf_crop_and_resize"
    extrapolation = literal(float(ctx.attr("extrapolation_value", 0.0)))
    geo = _Geometry(ctx, node, ins_, outs_, ctm)
    if antialias:  # onnxruntime copies an axis whose length does not change
        axes = [a for a in range(len(ins_)) if ins_[a] != outs_[a]]
    else:
        axes = [a for a in range(len(ins_))
                if ins_[a] != outs_[a] or geo.scales[a] != 1.0 or (extrapolate and geo.roi[a] != (0.0, 1.0))]

    def src(v, a):
        return _coord(ctm, v.o[a], a, ins_, outs_, geo)

    def body(v):
        s, coords = [], list(v.o)
        if antialias:
            s, value = _antialias(v, axes, ins_, src, geo, mode, cubic_a, exclude_outside)
        elif mode == "nearest":
            for a in axes:
                c = f"c{a}"
                s.append(f"const float f{a} = {src(v, a)};")
                nm = "ceil" if legacy and geo.scales[a] < 1 else nmode
                s.append(f"int {c} = (int){_NEAREST[nm].format(c=f'f{a}')};")
                s.append(f"{c} = {_clamp(c, ins_[a] - 1)};")
                coords[a] = c
            value = v.ld(0, coords)
        elif mode == "cubic":
            value = _cubic(v, s, axes, ins_, src, cubic_a, exclude_outside)
        else:
            value = _linear(v, s, axes, ins_, src)
        if extrapolate:  # a source coordinate outside the input takes extrapolation_value
            value = _extrapolated(value, extrapolation, axes, ins_, lambda a: _fixed_coord(ctm, a, ins_, outs_, geo))
        return s, value

    taps = [_aa_window(geo.scales[a], mode)[1] if antialias else 4 if mode == "cubic" else 2 for a in axes]
    emit_map(ctx, out, [x], body, "Resize", flops_per_elem=3 * math.prod(taps), inline_scalars=False)


def _extrapolated(value: str, extrapolation: str, axes: list[int], ins_, fixed) -> str:
    """`value` where every resized axis's source coordinate `f{a}` lies within the input, else
    `extrapolation` (tf_crop_and_resize). Coordinates known on the host are decided here."""
    outside = []
    for a in axes:
        c = fixed(a)
        if c is None:
            outside.append(f"f{a} < 0.0f || f{a} > {literal(float(ins_[a] - 1))}")
        elif not 0.0 <= c <= ins_[a] - 1:
            return extrapolation
    return f"(({' || '.join(outside)}) ? {extrapolation} : ({value}))" if outside else value


def _clamp(e: str, hi: int) -> str:
    """Index expression `e` clamped to [0, hi] (an edge tap reads the edge)."""
    return f"{e} < 0 ? 0 : ({e} > {hi} ? {hi} : {e})"


def _linear(v, s: list[str], axes: list[int], ins_, src) -> str:
    """N-linear interpolation: the 2^len(axes) corners around the source point, edge taps clamped."""
    for a in axes:
        s += [f"const float f{a} = {src(v, a)};",
              f"const int l{a} = (int)F_FLOOR(f{a});",
              f"const float w{a} = f{a} - (float)l{a};",
              f"const int a{a} = {_clamp(f'l{a}', ins_[a] - 1)};",
              f"const int b{a} = {_clamp(f'l{a} + 1', ins_[a] - 1)};"]
    terms = []
    for corner in itertools.product((0, 1), repeat=len(axes)):
        cs, ws = list(v.o), []
        for a, bit in zip(axes, corner):
            cs[a] = f"b{a}" if bit else f"a{a}"
            ws.append(f"w{a}" if bit else f"(1.0f - w{a})")
        terms.append(f"{' * '.join(ws) or '1.0f'} * {v.ld(0, cs)}")
    return " + ".join(terms) or v.ld(0, list(v.o))


def _cubic(v, s: list[str], axes: list[int], ins_, src, A: float, exclude_outside: bool) -> str:
    """Cubic convolution (Keys) over 4 taps per resized axis, as the ONNX reference and
    onnxruntime compute it: tap k at floor(x) - 1 + k, weighted by the kernel at its distance
    (coefficient A = cubic_coeff_a, -0.75 as PyTorch's bicubic). Taps outside the input take the
    edge value, or with exclude_outside get weight 0, the others renormalised to sum to 1."""
    a_ = literal(A)
    for a in axes:
        n = ins_[a]
        s += [f"const float f{a} = {src(v, a)};",
              f"const int l{a} = (int)F_FLOOR(f{a});",
              f"const float t{a} = f{a} - (float)l{a};",
              f"const float u{a} = 1.0f - t{a};",
              # |d| in (1, 2) for taps 0 and 3, [0, 1] for taps 1 and 2
              f"float w{a}_0 = (({a_} * (t{a} + 1.0f) - 5.0f * {a_}) * (t{a} + 1.0f) + 8.0f * {a_}) * (t{a} + 1.0f)"
              f" - 4.0f * {a_};",
              f"float w{a}_1 = (({a_} + 2.0f) * t{a} - ({a_} + 3.0f)) * t{a} * t{a} + 1.0f;",
              f"float w{a}_2 = (({a_} + 2.0f) * u{a} - ({a_} + 3.0f)) * u{a} * u{a} + 1.0f;",
              f"float w{a}_3 = (({a_} * (u{a} + 1.0f) - 5.0f * {a_}) * (u{a} + 1.0f) + 8.0f * {a_}) * (u{a} + 1.0f)"
              f" - 4.0f * {a_};"]
        tap_at = [f"l{a} + {k - 1}" if k != 1 else f"l{a}" for k in range(4)]
        s += [f"const int i{a}_{k} = {_clamp(i, n - 1)};" for k, i in enumerate(tap_at)]
        if exclude_outside:
            s += [f"if ({i} < 0 || {i} > {n - 1}) w{a}_{k} = 0.0f;" for k, i in enumerate(tap_at)]
            s.append(f"{{ const float z = w{a}_0 + w{a}_1 + w{a}_2 + w{a}_3; "
                     + " ".join(f"w{a}_{k} /= z;" for k in range(4)) + " }")
    terms = []
    for taps in itertools.product(range(4), repeat=len(axes)):
        cs = list(v.o)
        for a, k in zip(axes, taps):
            cs[a] = f"i{a}_{k}"
        terms.append(f"{' * '.join(f'w{a}_{k}' for a, k in zip(axes, taps)) or '1.0f'} * {v.ld(0, cs)}")
    return " + ".join(terms) or v.ld(0, list(v.o))


def _aa_window(scale: float, mode: str) -> tuple[np.float32, int, np.float32]:
    """(support, window, shrink) of the antialias filter along an axis of `scale`, in float32 as
    onnxruntime computes them: the filter reaches `support` input pixels each side of a source
    centre, so at most `window` taps; distances are multiplied by `shrink` (1 / the downscale)."""
    inv_scale = _F(1) / _F(scale)  # input pixels per output pixel
    support = _F(_AA_FILTER[mode][1] * 0.5) * (inv_scale if inv_scale >= 1 else _F(1))
    return support, int(math.ceil(support)) * 2 + 1, (_F(1) / inv_scale if inv_scale >= 1 else _F(1))


def _antialias(v, axes: list[int], ins_, src, geo: _Geometry, mode: str, A: float,
               exclude_outside: bool) -> tuple[list[str], str]:
    """The antialiased filter (antialias=1), as onnxruntime computes it after Pillow: along each
    resized axis, output pixel o averages the input pixels within `support` of its source centre,
    weighted by the filter at their distance scaled down by the shrink factor and normalised to
    sum 1. Taps past an edge read the edge pixel (onnxruntime folds their weights onto it), or
    with exclude_outside are dropped before normalising. The axes are separable, so the value is
    the sum over the window's product of per-axis weights. Each axis's weights are computed once
    per output element, into a private array as long as its window."""
    filt = _AA_FILTER[mode][0]
    s: list[str] = []
    for a in axes:
        n = ins_[a]
        support, window, shrink = _aa_window(geo.scales[a], mode)
        centre = f"(float){v.o[a]}" if _F(1) / _F(geo.scales[a]) == 1 else src(v, a)  # (as onnxruntime tests it)
        first, end = (f"lo{a}", f"hi{a}") if exclude_outside else (f"mn{a}", f"mx{a}")
        dist = f"F_FABS(((float)(k + {first}) - c{a} + 0.5f) * {literal(shrink)})"
        s += [f"const float c{a} = 0.5f + {centre};",
              f"const int mn{a} = (int)F_FLOOR(c{a} - {literal(support)} + 0.5f);",
              f"int mx{a} = (int)F_FLOOR(c{a} + {literal(support)} + 0.5f);",
              f"mx{a} = mn{a} + (mx{a} < mn{a} ? 0 : (mx{a} - mn{a} > {window} ? {window} : mx{a} - mn{a}));",
              f"const int lo{a} = mn{a} < 0 ? 0 : (mn{a} > {n} ? {n} : mn{a});",
              f"const int hi{a} = mx{a} < 0 ? 0 : (mx{a} > {n} ? {n} : mx{a});",
              # a window wholly outside the input contributes nothing (onnxruntime's output is 0)
              f"const int nt{a} = lo{a} < hi{a} ? {end} - {first} : 0;",
              f"float w{a}[{window}];",
              f"float z{a} = 0.0f;",
              f"for (int k = 0; k < {window}; ++k) {{",
              f"    const float d = {dist};",
              f"    w{a}[k] = k < nt{a} ? {filt.format(x='d', A=literal(A))} : 0.0f;",
              f"    z{a} += w{a}[k];",
              "}",
              f"z{a} = z{a} == 0.0f ? 1.0f : 1.0f / z{a};",
              f"for (int k = 0; k < {window}; ++k) w{a}[k] *= z{a};"]
    if not axes:
        return s, v.ld(0, list(v.o))
    s.append("float acc = 0.0f;")
    coords, indent = list(v.o), ""
    for a in axes:
        first = f"lo{a}" if exclude_outside else f"mn{a}"
        s += [f"{indent}for (int k{a} = 0; k{a} < nt{a}; ++k{a}) {{",
              f"{indent}    const int j{a} = {_clamp(f'{first} + k{a}', ins_[a] - 1)};"]
        coords[a] = f"j{a}"
        indent += "    "
    weight = " * ".join(f"w{a}[k{a}]" for a in axes)
    s.append(f"{indent}acc += {weight} * {v.ld(0, coords)};")
    s += ["    " * (len(axes) - 1 - d) + "}" for d in range(len(axes))]
    return s, "acc"
