"""Reductions, Softmax and normalizations (row/column templates in dlcc.kernels.reduce)."""
from __future__ import annotations

import numpy as np

from ..ir import INTEGER_DTYPES
from ..kernels.map import emit_map, unravel
from ..kernels.program import ctype, literal, value_ctype
from ..kernels.reduce import ReduceLayout, emit_layernorm, emit_reduce, emit_softmax
from .registry import REDUCTION, register

# op -> (combine, pre(v), post(acc))
REDUCE = {
    "ReduceSum": ("sum", "v", "acc"),
    "ReduceMean": ("sum", "v", "acc / R_F"),
    "ReduceMax": ("max", "v", "acc"),
    "ReduceMin": ("min", "v", "acc"),
    "ReduceProd": ("prod", "v", "acc"),
    "ReduceL1": ("sum", "F_FABS(v)", "acc"),
    "ReduceL2": ("sum", "v * v", "F_SQRT(acc)"),
    "ReduceSumSquare": ("sum", "v * v", "acc"),
    "ReduceLogSum": ("sum", "v", "F_LOG(acc)"),
}


def _reduce_axes(ctx, node):
    rank = len(ctx.shape(node.inputs[0]))
    axes = None
    if len(node.inputs) > 1 and node.inputs[1]:
        val = ctx.const(node.inputs[1])
        if val is None:
            raise ctx.fail("axes must be a constant after folding")
        axes = [int(a) for a in val.reshape(-1)]
    elif "axes" in node.attrs:
        axes = list(node.attrs["axes"])
    if not axes:
        if ctx.attr("noop_with_empty_axes", 0):
            return []
        axes = list(range(rank))
    return [a + rank if a < 0 else a for a in axes]


#: The reductions that also take int32 and int64 (an attention mask's ReduceSum, a length's
#: ReduceMax): (the C step folding element `e` into `acc`, the value of an empty reduction).
INT_REDUCE = {"ReduceSum": ("acc + e", "0"), "ReduceProd": ("acc * e", "1"), "ReduceMax": ("(e > acc ? e : acc)", None),
              "ReduceMin": ("(e < acc ? e : acc)", None), "ReduceL1": ("acc + (e < 0 ? -e : e)", "0"),
              "ReduceSumSquare": ("acc + e * e", "0")}


#: ReduceMax and ReduceMin also take the byte types: over bool they are any and all (opset 20),
#: whose empty reduction is False and True.
BYTE_REDUCE = {"ReduceMax": "0", "ReduceMin": "1"}
_BYTE_TYPES = ("bool", "uint8", "int8")
#: The integer types the reductions in INT_REDUCE take (ONNX lists uint32, uint64, int32 and
#: int64 for them; 16-bit ones as Cast or an exporter's arithmetic makes them are no harder).
WIDE_INTS = ("int64", "int32", "int16", "uint64", "uint32", "uint16")


def _lower_reduce(ctx, node):
    axes = _reduce_axes(ctx, node)
    dt = ctx.value_dtype(node.inputs[0])
    if (dt in WIDE_INTS and node.op_type in INT_REDUCE) or (dt in _BYTE_TYPES and node.op_type in BYTE_REDUCE):
        return _int_reduce(ctx, node, axes) if axes else ctx.alias(node.outputs[0], node.inputs[0])
    if dt != "float32":
        raise ctx.fail(f"{node.op_type} on {ctx.dtype(node.inputs[0])} is not supported (float32 only)")
    if not axes:
        return ctx.alias(node.outputs[0], node.inputs[0])
    op, pre, post = REDUCE[node.op_type]
    shape = ctx.shape(node.inputs[0])
    if post == "acc / R_F" and int(np.prod([shape[a] for a in axes])) == 0:
        post = "acc"  # the mean of nothing: onnxruntime gives 0 (the empty sum), not 0 / 0
    emit_reduce(ctx, node.outputs[0], node.inputs[0], axes, op, node.op_type, pre=pre, post=post)


def _int_reduce(ctx, node, axes) -> None:
    """An integer reduction, exact and wrapping as onnxruntime's: one thread per output walks
    its reduced elements in the integer type (these are small: masks, lengths, counts), so the
    float row and column templates, and AStitch's float arithmetic, never see it."""
    x = node.inputs[0]
    lay = ReduceLayout(ctx.shape(x), axes)
    step, empty = INT_REDUCE[node.op_type]
    if ctx.dtype(x) == "bool":
        empty = BYTE_REDUCE[node.op_type]
    if lay.R == 0 and empty is None:
        raise ctx.fail(f"{node.op_type} over an empty axis has no value")
    T = ctype(ctx.dtype(x))
    bstmts, base = lay.base("o")
    ostmts, off = lay.offset("r")

    def body(v):
        first = 0 if empty is not None else 1  # max and min start from the first element (offset 0)
        init = empty if empty is not None else v.ld_flat(0, "base")
        lines = [f"const int o = {v.i};", *bstmts, f"const int base = {base};", f"{T} acc = {init};",
                 f"for (int r = {first}; r < {lay.R}; ++r) {{", *["    " + s for s in ostmts],
                 f"    const {T} e = {v.ld_flat(0, f'base + {off}')};", f"    acc = {step};", "}"]
        return lines, "acc"

    emit_map(ctx, node.outputs[0], [x], body, node.op_type, flops_per_elem=lay.R, inline_scalars=False)


for _op in REDUCE:
    register(_op, since=1, category=REDUCTION, float_only=True, half_io=True,
             dtypes=("float32",) + WIDE_INTS + (_BYTE_TYPES if _op in BYTE_REDUCE else ())
             if _op in INT_REDUCE else None)(_lower_reduce)


@register("GlobalAveragePool", "GlobalMaxPool", since=1, category=REDUCTION, float_only=True, half_io=True)
def _global_pool(ctx, node):
    rank = len(ctx.shape(node.inputs[0]))
    op, post = ("sum", "acc / R_F") if node.op_type == "GlobalAveragePool" else ("max", "acc")
    emit_reduce(ctx, node.outputs[0], node.inputs[0], list(range(2, rank)), op, node.op_type, post=post)


def _softmax(ctx, node):
    shape = ctx.shape(node.inputs[0])
    rank = len(shape)
    ax = ctx.attr("axis", -1 if ctx.graph.opset >= 13 else 1)
    ax = ax + rank if ax < 0 else ax
    if ctx.graph.opset >= 13:
        rows, length, inner = int(np.prod(shape[:ax])), shape[ax], int(np.prod(shape[ax + 1:]))
    else:  # opset < 13 coerces to 2-D at `axis`
        rows, length, inner = int(np.prod(shape[:ax])), int(np.prod(shape[ax:])), 1
    emit_softmax(ctx, node.outputs[0], node.inputs[0], rows, length, inner, node.op_type == "LogSoftmax",
                 node.op_type)


register("Softmax", "LogSoftmax", since=1, category=REDUCTION, float_only=True, half_io=True)(_softmax)


@register("LayerNormalization", since=17, category=REDUCTION, float_only=True, half_io=True)
def _layernorm(ctx, node):
    x, scale = node.inputs[:2]
    bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else ""
    if any(o for o in node.outputs[1:]):
        raise ctx.fail("the Mean/InvStdDev outputs of LayerNormalization are not supported")
    shape = ctx.shape(x)
    ax = ctx.attr("axis", -1)
    ax = ax + len(shape) if ax < 0 else ax
    length = int(np.prod(shape[ax:]))
    rows = int(np.prod(shape[:ax]))

    def mod(name):
        """The size of `name` where the row template can index it as `j % size` (a suffix of the
        normalised axes, or one value); None where it broadcasts some other way."""
        s = ctx.shape(name)
        try:
            fits = np.broadcast_shapes(tuple(shape), tuple(s)) == tuple(shape)
        except ValueError:
            fits = False
        if not fits:
            raise ctx.fail(f"scale/bias of shape {list(s)} do not broadcast to the input's {list(shape)}")
        n = int(np.prod(s)) if s else 1
        s = list(s)
        while s and s[0] == 1:
            s.pop(0)
        inside = n == 1 or (len(s) <= len(shape) - ax and tuple(shape[len(shape) - len(s):]) == tuple(s))
        return n if inside else None

    eps = ctx.attr("epsilon", 1e-5)
    if mod(scale) is None or (bias and mod(bias) is None):
        # Scale or bias vary across rows too (a [N, L, D] scale on a [N, L, D] input broadcasts
        # in onnxruntime): the row template indexes them within a row only, so normalise with
        # unit scale and apply them as a broadcasting map.
        _normalise_then_affine(ctx, node.outputs[0], x, scale, bias, rows, length, eps)
        return
    emit_layernorm(ctx, node.outputs[0], x, scale, bias, rows, length, eps, mod(scale), mod(bias) if bias else 1)


def _normalise_then_affine(ctx, out: str, x: str, scale: str, bias: str, rows: int, length: int, eps: float,
                           scale_of=None) -> None:
    """out = normalise(x over rows of `length`) * scale + bias, the affine as a map kernel whose
    operands broadcast numpy-style, or at `scale_of(v)` coordinates where given."""
    ones = ctx.temp((1,))
    ctx.graph.tensors[ones].value = np.ones(1, np.float32)
    tmp = ctx.temp(ctx.shape(x))
    emit_layernorm(ctx, tmp, x, ones, "", rows, length, eps, 1, 1)
    ins = [tmp, scale] + ([bias] if bias else [])

    def body(v):
        at = scale_of(v) if scale_of else None
        expr = f"{v.x(0)} * {v.ld(1, at)}"
        return [], expr + (f" + {v.ld(2, at)}" if bias else "")

    emit_map(ctx, out, ins, body, "NormAffine", 2)


@register("InstanceNormalization", since=6, category=REDUCTION, float_only=True)
def _instancenorm(ctx, node):
    """Per (n, c) row normalization, then a per-channel affine done by a map kernel."""
    x, scale, bias = node.inputs[:3]
    shape = ctx.shape(x)
    rows, length = shape[0] * shape[1], int(np.prod(shape[2:]))
    _normalise_then_affine(ctx, node.outputs[0], x, scale, bias, rows, length, ctx.attr("epsilon", 1e-5),
                           scale_of=lambda v: [v.o[1]])


@register("ArgMax", "ArgMin", since=1, category=REDUCTION,
          dtypes=("float32",) + INTEGER_DTYPES)
def _argmax(ctx, node):
    """The first (or with select_last_index, last) index of the best value along the axis,
    compared in the input's own type: an int64 beyond float's 24 bits keeps its rank."""
    shape = ctx.shape(node.inputs[0])
    T = value_ctype(ctx.value_dtype(node.inputs[0]))
    rank = len(shape)
    ax = ctx.attr("axis", 0)
    ax = ax + rank if ax < 0 else ax
    last = ctx.attr("select_last_index", 0)
    cmp = (">=" if last else ">") if node.op_type == "ArgMax" else ("<=" if last else "<")
    L, inner = shape[ax], int(np.prod(shape[ax + 1:]))

    def body(v):
        s = [f"const int base = ({v.i} / {inner}) * {L * inner} + ({v.i} % {inner});",
             f"{T} best = {v.ld_flat(0, 'base')}; i64 bi = 0;",
             f"for (int j = 1; j < {L}; ++j) {{ const {T} c = {v.ld_flat(0, f'base + j * {inner}')}; "
             f"if (c {cmp} best) {{ best = c; bi = j; }} }}"]
        return s, "bi"

    emit_map(ctx, node.outputs[0], [node.inputs[0]], body, node.op_type, flops_per_elem=L, inline_scalars=False)


__all__ = ["unravel", "literal"]


@register("LRN", since=1, category=REDUCTION, float_only=True)
def _lrn(ctx, node):
    """Local response normalization across channels: a short loop over the channel window per element."""
    shape = ctx.shape(node.inputs[0])
    size = ctx.attr("size")
    alpha, beta, bias = ctx.attr("alpha", 1e-4), ctx.attr("beta", 0.75), ctx.attr("bias", 1.0)
    C = shape[1]
    # The window past the channels adds nothing: clamp it to C, so a huge `size` (2**63 - 1 ran a
    # loop that never finished) is the same short loop; alpha / size keeps the model's size.
    lo, hi = min((size - 1) // 2, C - 1), min(size - 1 - (size - 1) // 2, C - 1)

    def body(v):
        c = v.o[1]
        s = ["float sq = 0.0f;",
             f"for (int q = {c} - {lo}; q <= {c} + {hi}; ++q) {{",
             f"    if (q >= 0 && q < {C}) {{ const float t = {v.ld(0, [v.o[0], 'q'] + v.o[2:])}; sq += t * t; }}",
             "}"]
        return s, f"{v.x(0)} / F_POW({literal(bias)} + {literal(alpha / size)} * sq, {literal(beta)})"

    emit_map(ctx, node.outputs[0], [node.inputs[0]], body, "LRN", flops_per_elem=2 * (lo + hi + 1) + 4,
             inline_scalars=False)


@register("CumSum", since=11, category=REDUCTION)
@register("CumProd", since=26, category=REDUCTION)
def _cumsum(ctx, node):
    """Prefix sums (CumSum) or products (CumProd) along one axis, exclusive/reverse per the
    attributes: each output combines its own prefix (a thread per output, no scan between
    threads); an empty prefix gives 0 or 1."""
    x = node.inputs[0]
    shape = ctx.shape(x)
    axv = ctx.const(node.inputs[1])
    if axv is None:
        raise ctx.fail("axis must be a constant after folding")
    ax = int(axv.reshape(()))
    ax = ax + len(shape) if ax < 0 else ax
    L, inner = shape[ax], int(np.prod(shape[ax + 1:]))
    excl, rev = ctx.attr("exclusive", 0), ctx.attr("reverse", 0)
    prod = node.op_type == "CumProd"
    if ctx.dtype(x) not in ("float32",) + WIDE_INTS:
        raise ctx.fail(f"{node.op_type} on {ctx.dtype(x)} is not supported")
    T = ctype(ctx.dtype(x))
    lo, hi = ("p + 1" if excl else "p", L) if rev else (0, "p" if excl else "p + 1")

    def body(v):
        s = [f"const int p = {v.o[ax]};",
             f"const int base = {v.i} - p * {inner};",
             f"{T} acc = {'1' if prod else '0'};",
             f"for (int q = {lo}; q < {hi}; ++q) acc {'*' if prod else '+'}= {v.ld_flat(0, f'base + q * {inner}')};"]
        return s, "acc"

    emit_map(ctx, node.outputs[0], [x], body, node.op_type, flops_per_elem=L, inline_scalars=False)


@register("TopK", since=10, category=REDUCTION, dtypes=("float32",) + INTEGER_DTYPES)
def _topk(ctx, node):
    """A thread per row picks the k best by repeated selection: the j-th result is the best element
    ranked after the (j-1)-th under (value, then lower index first) — O(k·L), no scratch memory.
    The results are always sorted, which also satisfies sorted=0."""
    x = node.inputs[0]
    T = ctype(ctx.dtype(x))
    kv = ctx.const(node.inputs[1])
    if kv is None:
        raise ctx.fail("K must be a constant after folding")
    k = int(kv.reshape(-1)[0])
    shape = ctx.shape(x)
    ax = ctx.attr("axis", -1)
    ax = ax + len(shape) if ax < 0 else ax
    L, inner = shape[ax], int(np.prod(shape[ax + 1:]))
    rows = int(np.prod(shape[:ax])) * inner
    vals, idxs = node.outputs[0], node.outputs[1] if len(node.outputs) > 1 else ""
    largest = bool(ctx.attr("largest", 1))
    if T == "float":
        # NaN ranks above every number (torch.topk's and numpy's sort order; fmax-style compares
        # would never pick it), and two NaNs tie.
        def gt(a, b):
            return f"({a} > {b} || ({a} != {a} && {b} == {b}))"

        def eq(a, b):
            return f"({a} == {b} || ({a} != {a} && {b} != {b}))"
    else:
        def gt(a, b):
            return f"({a} > {b})"

        def eq(a, b):
            return f"({a} == {b})"

    def better(a, b):
        return gt(a, b) if largest else gt(b, a)

    lines = [
        "const int r = BLOCK_ID * BLOCK_DIM + THREAD_ID;",
        f"if (r < {rows}) {{",
        f"    const int xb = (r / {inner}) * {L * inner} + (r % {inner});",
        f"    const int yb = (r / {inner}) * {k * inner} + (r % {inner});",
        f"    {T} pv = 0; int pi = -1;",
        f"    for (int j = 0; j < {k}; ++j) {{",
        f"        {T} bv = 0; int bi = -1;",
        f"        for (int q = 0; q < {L}; ++q) {{",
        f"            const {T} v = x[xb + q * {inner}];",
        f"            const int after = pi < 0 || {better('pv', 'v')} || ({eq('v', 'pv')} && q > pi);",
        f"            if (after && (bi < 0 || {better('v', 'bv')} || ({eq('v', 'bv')} && q < bi))) {{ bv = v; bi = q; }}",
        "        }",
        f"        vals[yb + j * {inner}] = bv;",
        *([f"        idxs[yb + j * {inner}] = (i64)bi;"] if idxs else []),
        "        pv = bv; pi = bi;",
        "    }",
        "}",
    ]
    params = f"GPTR const {T}* x, GPTR {T}* vals" + (", GPTR i64* idxs" if idxs else "")

    def make(name):
        return f"KERNEL void {name}({params}) {{\n    " + "\n    ".join(lines) + "\n}\n"

    from ..kernels.map import BLOCK

    kern = ctx.program.add_kernel("TopK", make, BLOCK, kind="map", pass_name=ctx.pass_name)
    outs = [vals] + ([idxs] if idxs else [])
    ctx.launch(kern, -(-rows // BLOCK), [x] + outs, reads=[x], writes=outs, flops=rows * L * k)
