"""MatMul (batched, broadcasting, 1-D operands) and Gemm on the tiled GEMM template."""
from __future__ import annotations

import numpy as np

from ..ir import Tensor
from ..kernels.gemm import GemmSpec, RawOperand, emit_gemm, gemm_precision
from ..kernels.row_norm import RowNorm
from ..kernels.gemm_mma_async import async_ok
from ..kernels.map import emit_map, strides_of
from ..kernels.program import SAME_WIDTH_UNSIGNED, ctype, literal, load_float, store_float
from .fold_norm import ATTR as FOLD_ATTR
from .registry import COMPUTE, register


def batch_offsets(var: str, bshape, shape_op, prefix: str) -> list[str]:
    """`const int {prefix}off = ...` for an operand whose batch dims broadcast against `bshape`."""
    nb = len(bshape)
    own = list(shape_op[:-2])
    own = [1] * (nb - len(own)) + own
    mat = int(np.prod(shape_op[-2:]))
    st = strides_of(own) if own else []
    terms, rem, stmts = [], var, []
    for k in range(nb - 1, -1, -1):
        d = bshape[k]
        if d == 1:
            continue
        c = f"{prefix}c{k}"
        stmts.append(f"const int {c} = {rem} % {d};")
        stmts.append(f"const int {prefix}q{k} = {rem} / {d};")
        rem = f"{prefix}q{k}"
        if own[k] != 1:
            terms.append(f"{c} * {st[k] * mat}")
    stmts.append(f"const int {prefix}off = {' + '.join(terms) or '0'};")
    return stmts


#: What a GEMM operand may be stored as: float32, or a half type for weights narrowed at
#: precision fp16/bf16 (ops/narrow.py); the loads convert to float (load_float).
FLOAT_OPERANDS = {"float32", "float16", "bfloat16"}


def operand_param(ctx, tensor: str, pname: str) -> str:
    """The parameter declaration of GEMM operand `tensor`, in its storage type."""
    return f"GPTR const {ctype(ctx.dtype(tensor))}* {pname}"


def output_param(ctx, tensor: str, pname: str) -> str:
    """The parameter declaration of a GEMM's output, in its storage type (float32, or a half type
    for an activation ops/narrow.py stores so; the accumulator is float32 either way)."""
    return f"GPTR {ctype(ctx.dtype(tensor))}* {pname}"


def transposed_weight(ctx, name: str, raw: RawOperand, extent: int, K: int) -> str | None:
    """A copy of constant GEMM operand `name`, stored transposed, where the tensor-core pipeline
    cannot copy the operand with cp.async as it is stored but can copy the transpose; None
    otherwise (float32 SIMT GEMMs, activations, weights already aligned, or aligned neither way).

    Why: cp.async moves 16-byte chunks, so an operand's contiguous extent and row stride must be
    whole chunks (kernels/gemm_mma_async.py async_ok). GPT-2's LM head multiplies by a [768, 50257]
    constant: 50257 columns are no whole number of chunks, so every block loaded its B tile two
    bytes at a time through registers, over 77 MB of weights. Stored [50257, 768], k runs along
    rows of 768 and every chunk is aligned. The weight is copied once, here at compile time (as
    ops/narrow.py narrows it), and the original stays for any other reader.

    On a device whose GEMMs take Hopper's wgmma tilings (kernels/gemm_wgmma.py chooses_wgmma), a
    weight stored [K, N] is stored [N, K] too: wgmma reads both operands K-major from shared
    memory, and only a K-major weight goes there by cp.async (the other is loaded element by
    element). The mma.sync tilings read either layout as fast (ldmatrix, with or without .trans).

    `raw` describes the operand as stored: a plain [rows, cols] matrix (no batch offset) of
    `extent` (m or n) by `K`, k along the columns where raw.k_contiguous."""
    from ..kernels.gemm_wgmma import HALF as WGMMA_PRECISIONS, chooses_wgmma

    precision = gemm_precision(ctx)
    t = ctx.tensor(name)
    if (precision == "fp32" or not getattr(ctx, "transpose_weights", True) or raw is None or t.value is None
            or t.value.size != extent * K):
        return None
    flipped = RawOperand(raw.ptr, raw.dtype, raw.base, extent if raw.k_contiguous else K, not raw.k_contiguous)
    k_major = (not raw.k_contiguous and precision in WGMMA_PRECISIONS
               and chooses_wgmma(getattr(ctx, "device", None)))
    if (async_ok(raw, precision, extent, K) and not k_major) or not async_ok(flipped, precision, extent, K):
        return None
    copy = f"%T:{name}"
    if copy not in ctx.graph.tensors:
        rows, cols = (extent, K) if raw.k_contiguous else (K, extent)
        ctx.graph.tensors[copy] = Tensor(copy, (cols, rows), t.dtype,
                                         np.ascontiguousarray(t.value.reshape(rows, cols).T))
        ctx.transposed.append(name.split(":", 1)[1] if name.startswith("%") else name)  # the model's name
    return copy


def row_norm(ctx, node) -> tuple[RowNorm | None, list[str], list[str]]:
    """A LayerNorm folded into this GEMM (ops/fold_norm.py): its RowNorm, the parameter
    declarations of c and b' (before the output's), and their tensors; (None, [], []) otherwise."""
    rn = node.attrs.get(FOLD_ATTR)
    if not rn:
        return None, [], []
    tensors = ([rn["c"]] if rn["c"] else []) + ([rn["b"]] if rn["b"] else [])
    params = (["GPTR const float* RNC"] if rn["c"] else []) + (["GPTR const float* RNB"] if rn["b"] else [])
    return RowNorm("RNC" if rn["c"] else "", "RNB" if rn["b"] else "", float(rn["eps"])), params, tensors


#: The integer types ONNX's MatMul takes (computed by _int_matmul).
INT_MATMUL = ("int32", "int64", "uint32", "uint64")


@register("MatMul", since=1, category=COMPUTE, half_io=True, dtypes=("float32",) + INT_MATMUL)
def _matmul(ctx, node):
    a, b = node.inputs[:2]
    out = node.outputs[0]
    sa, sb = list(ctx.shape(a)), list(ctx.shape(b))
    if ctx.dtype(a) in INT_MATMUL and ctx.dtype(b) == ctx.dtype(a):
        return _int_matmul(ctx, node, sa, sb)
    if not {ctx.dtype(a), ctx.dtype(b)} <= FLOAT_OPERANDS:
        raise ctx.fail("only float32 MatMul is supported")
    if len(sa) == 1:
        sa = [1] + sa
    if len(sb) == 1:
        sb = sb + [1]
    M, K, N = sa[-2], sa[-1], sb[-1]
    if len(sb) == 2 and len(sa) > 2:
        # Weights without batch dims: fold A's batch into M (one big GEMM, better tiles).
        M, sa = int(np.prod(sa[:-1])), [int(np.prod(sa[:-1])), K]
    bshape = list(np.broadcast_shapes(tuple(sa[:-2]), tuple(sb[:-2])))
    batch = int(np.prod(bshape)) if bshape else 1
    prologue = batch_offsets("bt", bshape, sa, "a") + batch_offsets("bt", bshape, sb, "b")
    raw_b = RawOperand("B", ctx.dtype(b), "boff", N, False)
    b_t = transposed_weight(ctx, b, raw_b, N, K) if len(ctx.shape(b)) == 2 else None
    if b_t:  # stored [N, K] (transposed_weight); a 2-D B has no batch offset
        b, raw_b = b_t, RawOperand("B", ctx.dtype(b_t), "boff", K, True)
    rn, rn_params, rn_tensors = row_norm(ctx, node)
    spec = GemmSpec(
        batch=batch, M=M, N=N, K=K,
        params=[operand_param(ctx, a, "A"), operand_param(ctx, b, "B"), *rn_params, output_param(ctx, out, "Y")],
        prologue=prologue,
        load_a=lambda m, k: ([], load_float(ctx.dtype(a), "A", f"aoff + {m} * {K} + {k}")),
        load_b=lambda k, n: ([], load_float(ctx.dtype(b), "B", f"boff + {n} * {K} + {k}" if b_t
                                            else f"boff + {k} * {N} + {n}")),
        store=lambda m, n, acc: [store_float(ctx.dtype(out), "Y", f"bt * {M * N} + {m} * {N} + {n}", acc)],
        store_index=lambda m, n: f"bt * {M * N} + {m} * {N} + {n}",
        store_value=lambda m, n, acc: acc,
        b_n_contiguous=not b_t,
        raw_a=RawOperand("A", ctx.dtype(a), "aoff", K, True),
        raw_b=raw_b,
        row_norm=rn,
    )
    emit_gemm(ctx, "MatMul", spec, [a, b, *rn_tensors, out], reads=[a, b, *rn_tensors], writes=[out])


def _int_matmul(ctx, node, sa: list, sb: list) -> None:
    """An integer MatMul, exact and wrapping as numpy's (and onnxruntime's) integer products: one
    thread per output element walks K, summing in the unsigned type of the width (signed overflow
    is undefined in C). Integer MatMuls are small (index arithmetic, counts), so the float GEMM
    templates and their tilings never see one."""
    a, b = node.inputs[:2]
    sa, sb = ([1] + sa if len(sa) == 1 else sa), (sb + [1] if len(sb) == 1 else sb)
    M, K, N = sa[-2], sa[-1], sb[-1]
    bshape = list(np.broadcast_shapes(tuple(sa[:-2]), tuple(sb[:-2])))
    T, U = ctype(ctx.dtype(a)), SAME_WIDTH_UNSIGNED[ctx.dtype(a)]

    def batch_offset(shape: list, matrix: int) -> str:
        """The element offset of operand `shape`'s matrix for batch index `bt` (numpy's batch
        broadcasting: the operand's batch dims align right, and a dim of 1 repeats)."""
        own = shape[:-2]
        lead = len(bshape) - len(own)
        terms = []
        for i, d in enumerate(own):
            if d != 1:
                j = i + lead
                terms.append(f"((bt / {int(np.prod(bshape[j + 1:]))}) % {d}) * {int(np.prod(own[i + 1:])) * matrix}")
        return " + ".join(terms) or "0"

    def body(v):
        return [f"const int bt = {v.i} / {M * N}, m = ({v.i} / {N}) % {M}, n = {v.i} % {N};",
                f"const int ao = {batch_offset(sa, M * K)} + m * {K}, bo = {batch_offset(sb, K * N)} + n;",
                f"{U} acc = 0;",
                f"for (int k = 0; k < {K}; ++k) acc += ({U}){v.ld_flat(0, 'ao + k')} * ({U}){v.ld_flat(1, f'bo + k * {N}')};"], \
            f"({T})acc"

    emit_map(ctx, node.outputs[0], [a, b], body, "MatMul", flops_per_elem=2 * K, inline_scalars=False)


@register("Gemm", since=7, category=COMPUTE, float_only=True, half_io=True)
def _gemm(ctx, node):
    a, b = node.inputs[:2]
    c = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else ""
    out = node.outputs[0]
    ta, tb = ctx.attr("transA", 0), ctx.attr("transB", 0)
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    sa, sb = ctx.shape(a), ctx.shape(b)
    M, K = (sa[1], sa[0]) if ta else (sa[0], sa[1])
    N = sb[0] if tb else sb[1]
    rn, rn_params, rn_tensors = row_norm(ctx, node)
    params = ([operand_param(ctx, a, "A"), operand_param(ctx, b, "B")] + ([operand_param(ctx, c, "C")] if c else [])
              + rn_params + [output_param(ctx, out, "Y")])

    def cterm(m: str, n: str) -> str:
        """beta * C at output element (m, n), C broadcast as its shape says ("" without C)."""
        if not c or beta == 0.0:
            return ""
        sc = list(ctx.shape(c))
        sc = [1] * (2 - len(sc)) + sc
        idx = " + ".join(([f"{m} * {sc[1]}"] if sc[0] != 1 else []) + ([n] if sc[1] != 1 else [])) or "0"
        cval = load_float(ctx.dtype(c), "C", idx)
        return f" + {literal(beta)} * {cval}" if beta != 1.0 else f" + {cval}"

    scale = f"{literal(alpha)} * " if alpha != 1.0 else ""
    def raw_b():  # B as stored: [N, K] with transB, else [K, N]
        return RawOperand("B", ctx.dtype(b), "0", K if tb else N, bool(tb))

    b_t = transposed_weight(ctx, b, raw_b(), N, K)
    if b_t:  # stored the other way round (transposed_weight)
        b, tb = b_t, not tb
    spec = GemmSpec(
        batch=1, M=M, N=N, K=K, params=params,
        load_a=lambda m, k: ([], load_float(ctx.dtype(a), "A", f"{k} * {M} + {m}" if ta else f"{m} * {K} + {k}")),
        load_b=lambda k, n: ([], load_float(ctx.dtype(b), "B", f"{n} * {K} + {k}" if tb else f"{k} * {N} + {n}")),
        store=lambda m, n, acc: [store_float(ctx.dtype(out), "Y", f"{m} * {N} + {n}", f"{scale}{acc}{cterm(m, n)}")],
        store_index=lambda m, n: f"{m} * {N} + {n}",
        store_value=lambda m, n, acc: f"{scale}{acc}{cterm(m, n)}",
        a_k_contiguous=not ta, b_n_contiguous=not tb,
        raw_a=RawOperand("A", ctx.dtype(a), "0", M if ta else K, not ta),
        raw_b=raw_b(),
        row_norm=rn,
    )
    ins = [a, b] + ([c] if c else []) + rn_tensors
    emit_gemm(ctx, "Gemm", spec, ins + [out], reads=ins, writes=[out])
