"""Scatter where the last write wins, in O(outputs + updates) work: ScatterND with many updates,
and MaxUnpool.

Why not a map: ops/layout.py lowers ScatterND as a map in which every output element scans all
U updates for the ones naming it. That is one kernel and exact, and cheap for the scatters of a
KV cache (U = a few rows), but it is O(outputs x U). PyTorch's dynamo exporter writes
`MaxUnpool2d` as a ScatterND of every pooled element into the flattened output, so a SegNet
decoder at 64x112x112 would make about 2.6e12 compares.

Here three launches do it instead:
1. fill: a winner table, one int per slot (a slot is the part of the output one update writes:
   one element for MaxUnpool, `inner` elements for ScatterND), set to -1;
2. claim: one thread per update u, which computes its slot and does an atomic max of u into the
   table. The highest u wins whatever the threads' timing, and the highest u is the last in
   onnxruntime's sequential loop. So duplicate slots give onnxruntime's answer, deterministically;
3. gather: a map over the output: w = winner[slot]; out = w >= 0 ? updates[w, rest] : base.

An update whose slot is out of range claims nothing, so it never writes outside the table. The
caller's index check (ops/layout.py index_check) reports it as an error.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .map import BLOCK, emit_map
from .program import ctype, value_ctype


def emit_last_write_scatter(ctx, hint: str, out: str, base: str, idx: str, updates: str, count: int, inner: int,
                            slot_of: Callable[[str], tuple[list[str], str]]) -> None:
    """out = base (zeros when `base` is ""), then out[slot(u) * inner + r] = updates[u * inner + r]
    for every update u < count, the last u winning on a shared slot.

    `slot_of(u)` gives C statements and an i64 expression for update u's slot, read from the
    indices `ix` (the kernel's parameter holding `idx`); -1 or any value outside
    [0, numel(out) / inner) claims nothing."""
    n = int(np.prod(ctx.shape(out))) if ctx.shape(out) else 1
    slots = n // inner
    if count >= 2**31 or n >= 2**31:
        raise ctx.fail(f"{max(count, n)} elements exceed the 32-bit index space of the scatter kernels")
    win = ctx.temp((slots,), "int32")
    emit_map(ctx, win, [], lambda v: ([], "-1"), f"{hint}Init", flops_per_elem=0)

    stmts, expr = slot_of("u")
    body = "\n        ".join(list(stmts) + [f"const i64 s = {expr};",
                                           f"if (s >= 0 && s < {slots}) ATOMIC_MAX_I32(win + s, u);"])

    def make(kname: str) -> str:
        return (f"KERNEL void {kname}(GPTR const {ctype(ctx.dtype(idx))}* ix, GPTR int* win) {{\n"
                f"    const int u = BLOCK_ID * BLOCK_DIM + THREAD_ID;\n"
                f"    if (u < {count}) {{\n        {body}\n    }}\n}}\n")

    kname = ctx.program.add_kernel(f"{hint}Claim", make, BLOCK, kind="map", pass_name=ctx.pass_name)
    ctx.launch(kname, -(-count // BLOCK), [idx, win], reads=[idx, win], writes=[win], flops=count)

    acc_t = value_ctype(ctx.dtype(out))
    ins = ([base] if base else []) + [win, updates]
    w, u = len(ins) - 2, len(ins) - 1

    def gather(v):
        slot, rest = (v.i, "0") if inner == 1 else (f"{v.i} / {inner}", f"{v.i} % {inner}")
        keep = v.ld(0) if base else f"({acc_t})0"
        return ([f"const int w = {v.ld_flat(w, slot)};"],
                f"(w >= 0 ? ({acc_t}){v.ld_flat(u, f'w * {inner} + {rest}' if inner > 1 else 'w')} : {keep})")

    emit_map(ctx, out, ins, gather, hint, flops_per_elem=1, inline_scalars=False, sparse_reads=True,
             index_maps={w: lambda: np.arange(n, dtype=np.int64) // inner, u: lambda: np.full(n, -1, np.int64)})
