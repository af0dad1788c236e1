"""TensorScatter (opset 24): a KV cache's update written into its fixed-size buffer.

present [B, ..., M, ...] is past with update [B, ..., L, ...] written along the sequence axis
(`axis`, default -2) from position write_indices[b] of each batch entry b (0 without the input);
with mode "circular" the positions wrap modulo M. One map kernel over present: each element reads
its batch entry's write index, and takes update's element j = s - w (circular: (s - w) mod M) where
0 <= j < L, past's element otherwise. A gather form, so every element is written once and no
scatter's write order matters.

A write index past what the buffer holds is an error, as in onnxruntime: in linear mode an index
outside [0, M - L], in circular mode a negative one (the index checks' machinery,
kernels/index_check.py: a constant at compile time, a graph input on the host, a computed one on
the device). The kernel clamps the index too, so nothing reads outside update.
"""
from __future__ import annotations

from ..kernels.map import emit_map
from .layout import index_check
from .registry import LAYOUT, register

#: The bound of a circular write index (any non-negative int64 is allowed; the check is for < 0).
_ANY = 2 ** 62


@register("TensorScatter", since=24, category=LAYOUT, half_io=True)
def _tensor_scatter(ctx, node):
    if not 2 <= len(node.inputs) <= 3 or not node.inputs[0] or not node.inputs[1]:
        raise ctx.fail("takes 2 or 3 inputs: past_cache, update and the optional write_indices")
    past, update = node.inputs[:2]
    idx = node.inputs[2] if len(node.inputs) > 2 else ""
    out = node.outputs[0]
    ps, us = list(ctx.shape(past)), list(ctx.shape(update))
    rank = len(ps)
    axis = int(ctx.attr("axis", -2))
    if not -rank <= axis < rank or axis % max(rank, 1) == 0:
        raise ctx.fail(f"axis {axis} must name a dim of rank-{rank} past_cache other than the batch (dim 0)")
    axis %= rank
    mode = ctx.attr("mode", "linear")
    if mode not in ("linear", "circular"):
        raise ctx.fail(f"mode must be linear or circular, not {mode!r}")
    if len(us) != rank or any(u != p for k, (u, p) in enumerate(zip(us, ps)) if k != axis):
        raise ctx.fail(f"update {us} must have past_cache's shape {ps} except along axis {axis}")
    floats = {"float32", "float16", "bfloat16"}
    if ctx.dtype(update) != ctx.dtype(past) and not {ctx.dtype(update), ctx.dtype(past)} <= floats:
        # (float types may differ here: at precision fp16 or bf16 the update may be stored narrowed)
        raise ctx.fail(f"update ({ctx.dtype(update)}) must have past_cache's type ({ctx.dtype(past)})")
    m, n = ps[axis], us[axis]
    if n > m:
        raise ctx.fail(f"update's sequence length {n} exceeds past_cache's {m}")
    if idx:
        if list(ctx.shape(idx)) != [ps[0]] or ctx.dtype(idx) != "int64":
            raise ctx.fail(f"write_indices must be int64 of shape [{ps[0]}] (one per batch entry), not "
                           f"{ctx.dtype(idx)} {list(ctx.shape(idx))}")
        index_check(ctx, node, idx, [m - n + 1 if mode == "linear" else _ANY], from_zero=True)

    def body(v):
        w = f"x2[{v.o[0]}]" if idx else "(i64)0"
        s = v.o[axis]
        if mode == "linear":
            stmts = [f"const i64 j = (i64){s} - {w};"]
        else:  # (s - w) mod M, w taken modulo M first so the difference cannot overflow
            stmts = [f"const i64 j = (((i64){s} - {w} % {m}) % {m} + {m}) % {m};"]
        stmts.append(f"const int jj = j < 0 ? 0 : (j >= {n} ? {max(n - 1, 0)} : (int)j);")
        coords = list(v.o)
        coords[axis] = "jj"
        from_update = v.ld(1, coords) if n else v.ld(0)
        return stmts, f"(j >= 0 && j < {n}) ? {from_update} : {v.ld(0)}"

    ins = [past, update] + ([idx] if idx else [])
    emit_map(ctx, out, ins, body, "TensorScatter", inline_scalars=False)
