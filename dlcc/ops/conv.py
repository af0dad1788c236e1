"""Conv (implicit GEMM on the tiled template, or a direct kernel for depthwise), ConvTranspose,
MaxPool and AveragePool. Spatial rank is generic (1-D, 2-D, 3-D)."""
from __future__ import annotations

import numpy as np

from ..kernels.gemm import GemmSpec, RawOperand, emit_gemm
from ..kernels.map import emit_map, linear_index, unravel
from ..kernels.program import ctype, load_float, store_float
from ..kernels.scatter import emit_last_write_scatter
from .matmul import operand_param, output_param, transposed_weight
from .layout import index_check
from .registry import COMPUTE, LAYOUT, register


def window_attrs(ctx, in_sp, k_sp, out_sp):
    """strides, dilations and begin pads, resolving auto_pad the way the ONNX spec does."""
    nd = len(k_sp)
    strides = list(ctx.attr("strides", [1] * nd))
    dil = list(ctx.attr("dilations", [1] * nd))
    auto = ctx.attr("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i, k, s, d, o in zip(in_sp, k_sp, strides, dil, out_sp):
            total = max(0, (o - 1) * s + (k - 1) * d + 1 - i)
            begin.append(total // 2 if auto == "SAME_UPPER" else total - total // 2)
            end.append(total - begin[-1])
    elif auto == "VALID":
        begin, end = [0] * nd, [0] * nd
    else:
        pads = list(ctx.attr("pads", [0] * (2 * nd)))
        begin, end = pads[:nd], pads[nd:]
    return strides, dil, begin, end


def _window_coords(nd, od, kd, strides, dil, begin):
    return [f"{od[j]} * {strides[j]} - {begin[j]} + {kd[j]} * {dil[j]}".replace(" * 1 ", " ").replace(" - 0 ", " ")
            for j in range(nd)]


def _window(od, k_sp, in_sp, strides, dil, begin, var="kr"):
    """For window position `var`: statements giving input coords id0.., the in-bounds test, the offset."""
    nd = len(k_sp)
    kd, stmts = unravel(var, k_sp, "kd")
    ids = _window_coords(nd, od, kd, strides, dil, begin)
    stmts = list(stmts) + [f"const int id{j} = {ids[j]};" for j in range(nd)]
    cond = " && ".join(f"id{j} >= 0 && id{j} < {in_sp[j]}" for j in range(nd))
    return stmts, cond, linear_index([f"id{j}" for j in range(nd)], in_sp)


@register("Conv", since=1, category=COMPUTE, float_only=True, half_io=True)
def _conv(ctx, node):
    x, w = node.inputs[:2]
    bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else ""
    out = node.outputs[0]
    xs, ws, ys = ctx.shape(x), ctx.shape(w), ctx.shape(out)
    nd = len(xs) - 2
    B, Cin, in_sp = xs[0], xs[1], list(xs[2:])
    Cout, Cin_g, k_sp = ws[0], ws[1], list(ws[2:])
    out_sp = list(ys[2:])
    G = ctx.attr("group", 1)
    Cout_g = Cout // G
    strides, dil, begin, _ = window_attrs(ctx, in_sp, k_sp, out_sp)
    KS, IS, OS = int(np.prod(k_sp)), int(np.prod(in_sp)), int(np.prod(out_sp))

    if Cin_g == 1 and G > 1:
        return _conv_direct(ctx, node, x, w, bias, out, nd, Cin, Cout_g, k_sp, in_sp, strides, dil, begin)

    K = Cin_g * KS
    pointwise = KS == 1 and all(s == 1 for s in strides) and not any(begin) and in_sp == out_sp

    dx = ctx.dtype(x)

    def load_b(k, n):
        if pointwise:
            return [], load_float(dx, "X", f"xoff + {k} * {IS} + {n}")
        od, s1 = unravel(n, out_sp, "od")
        s2, cond, idx = _window(od, k_sp, in_sp, strides, dil, begin)
        return ([f"const int ci = {k} / {KS}, kr = {k} % {KS};"] + s1 + s2,
                f"({cond}) ? {load_float(dx, 'X', f'xoff + ci * {IS} + {idx}')} : 0.0f")

    raw_w = RawOperand("W", ctx.dtype(w), "woff", K, True)
    w_t = transposed_weight(ctx, w, raw_w, Cout, K) if G == 1 else None
    if w_t:  # stored [K, Cout] (transposed_weight: a first layer's K = 3 x 7 x 7); one group: woff is 0
        w, raw_w = w_t, RawOperand("W", ctx.dtype(w_t), "woff", Cout, False)

    def bias_term(m: str) -> str:
        return f" + {load_float(ctx.dtype(bias), 'Bz', f'g * {Cout_g} + {m}')}" if bias else ""

    params = ([operand_param(ctx, x, "X"), operand_param(ctx, w, "W")] + ([operand_param(ctx, bias, "Bz")] if bias else [])
              + [output_param(ctx, out, "Y")])
    spec = GemmSpec(
        batch=B * G, M=Cout_g, N=OS, K=K, params=params,
        prologue=[f"const int img = bt / {G}, g = bt % {G};",
                  f"const int xoff = (img * {Cin} + g * {Cin_g}) * {IS};",
                  f"const int woff = g * {Cout_g * K};"],
        load_a=lambda m, k: ([], load_float(ctx.dtype(w), "W", f"woff + {k} * {Cout} + {m}" if w_t
                                            else f"woff + {m} * {K} + {k}")),
        load_b=load_b,
        store=lambda m, n, acc: [store_float(ctx.dtype(out), "Y", f"(img * {Cout} + g * {Cout_g} + {m}) * {OS} + {n}",
                                             f"{acc}{bias_term(m)}")],
        store_index=lambda m, n: f"(img * {Cout} + g * {Cout_g} + {m}) * {OS} + {n}",
        store_value=lambda m, n, acc: f"{acc}{bias_term(m)}",
        a_k_contiguous=not w_t,
        raw_a=raw_w,
        raw_b=RawOperand("X", dx, "xoff", IS, False) if pointwise else None,
    )
    ins = [x, w] + ([bias] if bias else [])
    emit_gemm(ctx, "Conv", spec, ins + [out], reads=ins, writes=[out])


def _conv_direct(ctx, node, x, w, bias, out, nd, Cin, Cout_g, k_sp, in_sp, strides, dil, begin):
    """Depthwise (one input channel per group): a thread per output, loop over the window."""
    KS, IS = int(np.prod(k_sp)), int(np.prod(in_sp))

    def body(v):
        s2, cond, idx = _window(v.o[2:], k_sp, in_sp, strides, dil, begin)
        s = [f"const int g = {v.o[1]} / {Cout_g};",
             f"GPTR const {ctype(ctx.dtype(x))}* xp = x0 + ({v.o[0]} * {Cin} + g) * {IS};",
             f"GPTR const {ctype(ctx.dtype(w))}* wp = x1 + {v.o[1]} * {KS};",
             f"float acc = {v.ld(2, [v.o[1]]) if bias else '0.0f'};",
             f"for (int kr = 0; kr < {KS}; ++kr) {{", *["    " + t for t in s2],
             f"    if ({cond}) acc += {load_float(ctx.dtype(w), 'wp', 'kr')} * {load_float(ctx.dtype(x), 'xp', idx)};",
             "}"]
        return s, "acc"

    emit_map(ctx, out, [x, w] + ([bias] if bias else []), body, "ConvDepthwise", flops_per_elem=2 * KS,
             inline_scalars=False)


@register("ConvTranspose", since=1, category=COMPUTE, float_only=True, half_io=True)
def _conv_transpose(ctx, node):
    """Direct gather form: each output sums the inputs whose window covers it (no col2im scatter)."""
    x, w = node.inputs[:2]
    bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else ""
    out = node.outputs[0]
    xs, ws, ys = ctx.shape(x), ctx.shape(w), ctx.shape(out)
    nd = len(xs) - 2
    Cin, in_sp = xs[1], list(xs[2:])
    Cout_g, k_sp = ws[1], list(ws[2:])
    G = ctx.attr("group", 1)
    Cin_g = Cin // G
    strides = list(ctx.attr("strides", [1] * nd))
    dil = list(ctx.attr("dilations", [1] * nd))
    if ctx.attr("auto_pad", "NOTSET") not in ("NOTSET", "VALID") or "output_shape" in node.attrs:
        # Derive the begin pads from the inferred output shape.
        outp = list(ctx.attr("output_padding", [0] * nd))
        begin = []
        for i, k, s, d, o, op in zip(in_sp, k_sp, strides, dil, ys[2:], outp):
            total = s * (i - 1) + op + (k - 1) * d + 1 - o
            # The spec: SAME_UPPER puts the smaller half first; otherwise the larger half goes first.
            upper = ctx.attr("auto_pad", "NOTSET") == "SAME_UPPER"
            begin.append(total // 2 if upper else total - total // 2)
    else:
        begin = list(ctx.attr("pads", [0] * (2 * nd)))[:nd]
    KS, IS = int(np.prod(k_sp)), int(np.prod(in_sp))

    def body(v):
        od = v.o[2:]
        kd, s2 = unravel("kr", k_sp, "kd")
        s = [f"const int g = {v.o[1]} / {Cout_g}, cg = {v.o[1]} % {Cout_g};",
             f"float acc = {v.ld(2, [v.o[1]]) if bias else '0.0f'};",
             f"for (int kr = 0; kr < {KS}; ++kr) {{", *["    " + t for t in s2]]
        conds = []
        for j in range(nd):
            s.append(f"    const int t{j} = {od[j]} + {begin[j]} - kd{j} * {dil[j]};")
            conds.append(f"t{j} >= 0 && t{j} % {strides[j]} == 0 && t{j} / {strides[j]} < {in_sp[j]}")
        idx = linear_index([f"(t{j} / {strides[j]})" for j in range(nd)], in_sp)
        s += [f"    if ({' && '.join(conds)}) {{",
              f"        for (int c = 0; c < {Cin_g}; ++c) {{",
              f"            const int ci = g * {Cin_g} + c;",
              f"            acc += {load_float(ctx.dtype(x), 'x0', f'({v.o[0]} * {Cin} + ci) * {IS} + {idx}')} * "
              f"{load_float(ctx.dtype(w), 'x1', f'(ci * {Cout_g} + cg) * {KS} + kr')};",
              "        }", "    }", "}"]
        return s, "acc"

    emit_map(ctx, out, [x, w] + ([bias] if bias else []), body, "ConvTranspose", flops_per_elem=2 * KS * Cin_g,
             inline_scalars=False)


@register("MaxPool", "AveragePool", since=1, category=LAYOUT, float_only=True, half_io=True)
def _pool(ctx, node):
    x, out = node.inputs[0], node.outputs[0]
    xs, ys = ctx.shape(x), ctx.shape(out)
    nd = len(xs) - 2
    k_sp = list(ctx.attr("kernel_shape"))
    in_sp = list(xs[2:])
    strides, dil, begin, ends = window_attrs(ctx, in_sp, k_sp, list(ys[2:]))
    KS, IS = int(np.prod(k_sp)), int(np.prod(in_sp))
    is_max = node.op_type == "MaxPool"
    include_pad = ctx.attr("count_include_pad", 0)

    def body(v):
        od = v.o[2:]
        s2, cond, idx = _window(od, k_sp, in_sp, strides, dil, begin)
        xv = load_float(ctx.dtype(x), "xp", idx)
        upd = f"acc = F_MAX(acc, {xv});" if is_max else f"acc += {xv};"
        s = [f"GPTR const {ctype(ctx.dtype(x))}* xp = x0 + ({v.o[0]} * {xs[1]} + {v.o[1]}) * {IS};",
             f"float acc = {'(-DLCC_INF)' if is_max else '0.0f'}; int cnt = 0;",
             f"for (int kr = 0; kr < {KS}; ++kr) {{", *["    " + t for t in s2],
             f"    if ({cond}) {{ {upd} ++cnt; }}", "}"]
        if is_max:
            return s, "acc"
        if include_pad:
            # Count window positions inside the padded input (not past the implicit ceil_mode edge).
            s.append("int full = 1;")
            for j in range(nd):
                lo = f"({od[j]} * {strides[j]} - {begin[j]})"
                s.append(f"{{ const int lo = {lo}; int c = 0; for (int q = 0; q < {k_sp[j]}; ++q) "
                         f"if (lo + q * {dil[j]} < {in_sp[j] + ends[j]}) ++c; full *= c; }}")
            return s, "acc / (float)full"
        return s, "acc / (float)(cnt > 0 ? cnt : 1)"

    emit_map(ctx, out, [x], body, node.op_type, flops_per_elem=KS, inline_scalars=False)
    if is_max and len(node.outputs) > 1 and node.outputs[1]:
        _pool_indices(ctx, node, k_sp, in_sp, strides, dil, begin)


@register("MaxUnpool", since=9, category=LAYOUT, half_io=True)
def _max_unpool(ctx, node):
    """MaxPool's inverse for its Indices: zeros, with X's elements written back where the indices
    say (flat indices into the whole output, as MaxPool makes them, in [0, size) as onnxruntime
    checks them). On a position named twice, the later element of X wins, as in onnxruntime's loop.
    The output's shape (given by `output_shape` or the pooling attributes) comes from onnx shape
    inference. A scatter in O(inputs + outputs) (kernels/scatter.py)."""
    x, idx, out = node.inputs[0], node.inputs[1], node.outputs[0]
    if ctx.shape(idx) != ctx.shape(x):
        raise ctx.fail(f"the indices {list(ctx.shape(idx))} must have X's shape {list(ctx.shape(x))}")
    total = int(np.prod(ctx.shape(out)))
    count = int(np.prod(ctx.shape(x)))

    emit_last_write_scatter(ctx, "MaxUnpool", out, "", idx, x, count, 1, lambda u: ([], f"(i64)ix[{u}]"))
    index_check(ctx, node, idx, [total], from_zero=True)


def _pool_indices(ctx, node, k_sp, in_sp, strides, dil, begin):
    """MaxPool's Indices output: where each maximum came from, as a flat index into the whole input
    (batch and channel included; padding never counts), its spatial part row-major, or
    column-major with storage_order=1. A second map kernel repeats the window scan of the values
    kernel and keeps the first position holding the maximum (a strictly greater value replaces
    it), which is onnxruntime's and PyTorch's tie rule; a window with nothing above -inf gives -1.
    Recomputing costs a second read of the window, but keeps the values kernel a plain map that
    AStitch can stitch, and the indices are needed only where a MaxUnpool follows."""
    x, idx_out = node.inputs[0], node.outputs[1]
    order = ctx.attr("storage_order", 0)
    if order not in (0, 1):
        raise ctx.fail(f"storage_order {order} is not 0 (row major) or 1 (column major)")
    if ctx.dtype(idx_out) != "int64":
        raise ctx.fail(f"the Indices output is {ctx.dtype(idx_out)}, not int64")
    nd, xs = len(k_sp), ctx.shape(x)
    KS, IS = int(np.prod(k_sp)), int(np.prod(in_sp))
    ids = [f"id{j}" for j in range(nd)]
    # Column-major spatial index: the first spatial axis varies fastest.
    spatial = linear_index(ids, in_sp) if order == 0 else linear_index(ids[::-1], in_sp[::-1])

    def body(v):
        od = v.o[2:]
        s2, cond, idx = _window(od, k_sp, in_sp, strides, dil, begin)
        s = [f"GPTR const {ctype(ctx.dtype(x))}* xp = x0 + ({v.o[0]} * {xs[1]} + {v.o[1]}) * {IS};",
             "float acc = (-DLCC_INF); i64 best = -1;",
             f"for (int kr = 0; kr < {KS}; ++kr) {{", *["    " + t for t in s2],
             f"    if ({cond}) {{ const float t = {load_float(ctx.dtype(x), 'xp', idx)}; "
             f"if (t > acc) {{ acc = t; best = (i64)({spatial}); }} }}", "}"]
        return s, f"(best < 0 ? (i64)-1 : (i64)({v.o[0]} * {xs[1]} + {v.o[1]}) * {IS} + best)"

    emit_map(ctx, idx_out, [x], body, "MaxPoolIndices", flops_per_elem=KS, inline_scalars=False)
