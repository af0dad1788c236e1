"""Resize (nearest, N-linear and cubic) and Upsample as index expressions with interpolation weights."""
from __future__ import annotations

import itertools

import numpy as np

from ..kernels.map import emit_map
from ..kernels.program import literal
from .registry import LAYOUT, register

_COORD = {
    "half_pixel": "(({o} + 0.5f) / {s} - 0.5f)",
    "pytorch_half_pixel": "({olen} > 1 ? ({o} + 0.5f) / {s} - 0.5f : 0.0f)",
    "asymmetric": "({o} / {s})",
    # o * (in - 1) / (out - 1) in that order, as onnxruntime computes it: the product is exact and
    # the one division correctly rounded, so an exact half (23 * 30 / 92 = 7.5) stays a half for
    # nearest_mode to round. Multiplying by a rounded ratio gave 7.5000005, and round_prefer_floor
    # took element 8 where onnxruntime and the ONNX reference take 7 (fuzz seed 991034).
    "align_corners": "({olen} == 1 ? 0.0f : {o} * {num} / {den})",
}
_NEAREST = {
    "round_prefer_floor": "F_CEIL({c} - 0.5f)",
    "round_prefer_ceil": "F_FLOOR({c} + 0.5f)",
    "floor": "F_FLOOR({c})",
    "ceil": "F_CEIL({c})",
}


def _scales(ctx, node, in_shape, out_shape):
    """Per-axis scales: the constant `scales` input (or attribute) when given, else out/in from `sizes`."""
    if node.op_type == "Upsample" and "scales" in node.attrs:
        return [float(s) for s in node.attrs["scales"]]
    idx = 2 if (node.op_type == "Resize" and ctx.graph.opset >= 11) else 1
    for k in (idx, idx + 1) if idx == 2 else (idx,):
        name = node.inputs[k] if len(node.inputs) > k else ""
        if not name:
            continue
        val = ctx.const(name)
        if val is None:
            raise ctx.fail(f"input {k} ({'scales' if k == idx else 'sizes'}) must be a constant after folding")
        if val.size and k == idx:
            return [float(s) for s in val.reshape(-1)]
    # in float32, as onnxruntime divides them (rounding the float64 quotient to float32 can differ)
    return [float(np.float32(o) / np.float32(i)) for o, i in zip(out_shape, in_shape)]


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
    if mode not in ("nearest", "linear", "bilinear", "cubic", "bicubic"):
        raise ctx.fail(f"mode {mode!r} is not supported (nearest, linear and cubic are)")
    if ctm not in _COORD:
        raise ctx.fail(f"coordinate_transformation_mode {ctm!r} is not supported")
    if mode == "nearest" and nmode not in _NEAREST:
        raise ctx.fail(f"nearest_mode {nmode!r} is not supported")
    if ctx.attr("antialias", 0) or ctx.attr("axes", None) is not None:
        raise ctx.fail("antialias and axes are not supported")
    # (Attributes are read here, not in `body`: AStitch calls a body later, with another node current.)
    cubic_a, exclude_outside = float(ctx.attr("cubic_coeff_a", -0.75)), bool(ctx.attr("exclude_outside", 0))
    scales = _scales(ctx, node, ins_, outs_)
    axes = [a for a in range(len(ins_)) if ins_[a] != outs_[a] or scales[a] != 1.0]

    def src(v, a):
        return _COORD[ctm].format(o=f"(float){v.o[a]}", s=literal(scales[a]), olen=outs_[a],
                                  num=literal(float(ins_[a] - 1)), den=literal(float(max(outs_[a] - 1, 1))))

    def body(v):
        s, coords = [], list(v.o)
        if mode == "nearest":
            for a in axes:
                c = f"c{a}"
                nm = "ceil" if legacy and scales[a] < 1 else nmode
                s.append(f"int {c} = (int){_NEAREST[nm].format(c=src(v, a))};")
                s.append(f"{c} = {_clamp(c, ins_[a] - 1)};")
                coords[a] = c
            return s, v.ld(0, coords)
        if mode in ("cubic", "bicubic"):
            return _cubic(v, s, axes, ins_, src, cubic_a, exclude_outside)
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
        return s, " + ".join(terms) or v.ld(0, coords)

    taps = 4 if mode in ("cubic", "bicubic") else 2
    emit_map(ctx, out, [x], body, "Resize", flops_per_elem=3 * (taps ** len(axes)), inline_scalars=False)


def _clamp(e: str, hi: int) -> str:
    """Index expression `e` clamped to [0, hi] (an edge tap reads the edge)."""
    return f"{e} < 0 ? 0 : ({e} > {hi} ? {hi} : {e})"


def _cubic(v, s: list[str], axes: list[int], ins_, src, A: float, exclude_outside: bool) -> tuple[list[str], str]:
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
    return s, " + ".join(terms) or v.ld(0, list(v.o))
