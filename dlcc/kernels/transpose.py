"""Tiled transpose through shared memory, for permutations that move the innermost axis.

A plain map kernel writes the output contiguously but then reads the input with a large stride
when the output's innermost axis is not the input's (e.g. attention's K^T, perm (0,2,3,1)).
Here each block stages a 32x32 tile: it reads rows along the input's innermost axis (coalesced),
and writes rows along the output's innermost axis (coalesced); the +1 padding avoids shared
memory bank conflicts on the transposed read.
"""
from __future__ import annotations

import numpy as np

from ..ir import HALF_FLOATS
from .map import strides_of, unravel
from .program import ctype, load_float, store_float

TILE, ROWS = 32, 8  # 32x8 threads, each moving 4 elements of a 32x32 tile


def wants_tiled(in_shape, perm) -> bool:
    n = len(perm)
    if n < 2 or perm[-1] == n - 1:
        return False
    return in_shape[n - 1] >= 8 and in_shape[perm[-1]] >= 8


def emit_tiled_transpose(ctx, out: str, x: str, perm) -> None:
    S = ctx.shape(x)
    n = len(S)
    O = [S[p] for p in perm]
    u, a, p = n - 1, perm[n - 1], list(perm).index(n - 1)
    P, U = S[n - 1], S[a]
    others = [q for q in range(n) if q not in (u, p)]
    ist, ost = strides_of(S), strides_of(O)
    TP, TU = -(-P // TILE), -(-U // TILE)
    B = int(np.prod([O[q] for q in others])) if others else 1
    names, unr = unravel("b", [O[q] for q in others], "c")
    in_base = " + ".join(f"{c}*{ist[perm[q]]}" for c, q in zip(names, others) if O[q] != 1) or "0"
    out_base = " + ".join(f"{c}*{ost[q]}" for c, q in zip(names, others) if O[q] != 1) or "0"
    dx, dy = ctx.dtype(x), ctx.dtype(out)
    # The tile holds the input's storage type, copied bit for bit, unless a side is a 16-bit float
    # (ops/narrow.py): OpenCL has no `half` variables without cl_khr_fp16, and the output may be
    # stored in another type, so those go through float (load_float / store_float).
    bits = dx == dy and dx not in HALF_FLOATS
    T = ctype(dx) if bits else "float"
    load = f"x[ib + ua * {ist[a]} + pr]" if bits else load_float(dx, "x", f"ib + ua * {ist[a]} + pr")
    store = (f"y[ob + po * {ost[p]} + uo] = tile[tx * {TILE + 1} + r];" if bits
             else store_float(dy, "y", f"ob + po * {ost[p]} + uo", f"tile[tx * {TILE + 1} + r]"))
    lines = [
        f"SHARED {T} tile[{TILE * (TILE + 1)}];",
        f"const int tx = THREAD_ID % {TILE}, ty = THREAD_ID / {TILE};",
        f"const int tu = BLOCK_ID % {TU};",
        f"const int tp = (BLOCK_ID / {TU}) % {TP};",
        f"const int b = BLOCK_ID / {TU * TP};",
        *unr,
        f"const int ib = {in_base};",
        f"const int ob = {out_base};",
        f"for (int r = ty; r < {TILE}; r += {ROWS}) {{",
        f"    const int ua = tu * {TILE} + r, pr = tp * {TILE} + tx;",
        f"    if (ua < {U} && pr < {P}) tile[r * {TILE + 1} + tx] = {load};",
        "}",
        "BARRIER();",
        f"for (int r = ty; r < {TILE}; r += {ROWS}) {{",
        f"    const int uo = tu * {TILE} + tx, po = tp * {TILE} + r;",
        f"    if (uo < {U} && po < {P}) {{ {store} }}",
        "}",
    ]

    def make(name):
        return (f"KERNEL void {name}(GPTR const {ctype(dx)}* x, GPTR {ctype(dy)}* y) {{\n    " + "\n    ".join(lines)
                + "\n}\n")

    item = np.dtype(dx).itemsize if bits else 4
    k = ctx.program.add_kernel("TransposeTiled", make, TILE * ROWS, smem_bytes=TILE * (TILE + 1) * item,
                               kind="transpose_tiled", pass_name=ctx.pass_name)
    ctx.launch(k, B * TP * TU, [x, out], reads=[x], writes=[out])
