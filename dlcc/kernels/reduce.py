"""Reduction templates: row (a block per output, shared-memory tree) and column (a thread per
output, loads coalesced across threads), plus the row-structured Softmax and LayerNorm kernels.

A reduction is described by the input shape and the reduced axes; the kept coordinates of an
output element and the reduced coordinates of step r are both unravelled into an input offset,
so any axis set works, and the common cases (contiguous suffix) collapse to `row*R + r`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .map import strides_of, unravel
from .program import ctype, literal, load_float, store_float

@dataclass
class ReduceExpr:
    """out[o] = post(op over r of pre(x[o, r])) with x of `shape` reduced over `axes` (AStitch's form)."""

    x: str
    out: str
    shape: tuple
    axes: tuple
    op: str
    pre: str
    post: str


@dataclass
class SoftmaxExpr:
    """(Log)Softmax over `length` elements of stride `inner`; AStitch decomposes it (max, exp, sum, div)."""

    x: str
    out: str
    rows: int
    length: int
    inner: int
    log: bool


@dataclass
class LayerNormExpr:
    """LayerNorm over rows of `length`; AStitch decomposes it (mean, centre, variance, scale)."""

    x: str
    scale: str
    bias: str
    out: str
    rows: int
    length: int
    eps: float
    scale_mod: int
    bias_mod: int


#: Rows up to this many floats are read from DRAM once and kept in shared memory (16 KiB).
ROW_CACHE = 4096

INIT = {"sum": "0.0f", "max": "(-DLCC_INF)", "min": "DLCC_INF", "prod": "1.0f"}
#: max and min keep a NaN (F_NMAX, F_NMIN), as numpy and onnxruntime's ReduceMax do: fmax drops it,
#: so a row holding a NaN reduced to its largest number instead.
COMBINE = {"sum": "({a} + {b})", "max": "F_NMAX({a}, {b})", "min": "F_NMIN({a}, {b})", "prod": "({a} * {b})"}


def accumulate_init(op: str, acc: str = "acc") -> list[str]:
    """Declarations of a thread's accumulator for `op` (accumulate_step's state)."""
    return [f"float {acc} = {INIT[op]};"] + ([f"float {acc}_c = 0.0f;"] if op == "sum" else [])


def accumulate_step(op: str, value: str, acc: str = "acc") -> list[str]:
    """One term into a thread's accumulator. A sum is compensated (Kahan): the low bits each
    addition loses are carried into the next term, so a thread's sum of n terms is within a few
    units of the exact sum instead of up to n. Why: a variance written as E[x²] − E[x]² (flax's
    LayerNorm, as tf2onnx exports Magika's) cancels the two sums, and a column reduction adds a
    thread's 512 terms one after another; plain addition there was 4x less accurate than
    onnxruntime's, and the cancellation carried it to the output. The reduction is memory-bound,
    so the three extra additions are free on a GPU. Once the sum is infinite the compensation
    stays 0 (inf − inf would make it NaN), so an overflowing or infinite term gives ±inf as
    plain addition does."""
    if op != "sum":
        return [f"{acc} = {COMBINE[op].format(a=acc, b=f'({value})')};"]
    return [f"{{ const float ky = ({value}) - {acc}_c; const float kt = {acc} + ky;",
            f"  {acc}_c = F_ISFINITE(kt) ? (kt - {acc}) - ky : 0.0f; {acc} = kt; }}"]


def pick_block(n: int, cap: int = 256) -> int:
    b = 32
    while b < cap and b < n:
        b *= 2
    return b


def lanes(var: str, n: int, block: int) -> str:
    """`for` header striding `var` over [0, n) by the block's own `block` threads.

    Why the `tid < block` guard: these row kernels are *block-normalisable* (Kernel.normalisable).
    A Rammer persistent kernel runs every rTask with its own 256 threads, so a 32-thread rTask sees
    threads 32..255 too; those must skip its work but still reach each of its barriers, which is
    exactly what a guard on the work (and none on the barriers) gives. Alone, the guard is always true.
    """
    return f"for (int {var} = tid; tid < {block} && {var} < {n}; {var} += {block})"


def block_reduce(var: str, op: str, block: int, buf: str = "red") -> list[str]:
    """Tree-reduce `var` across the block through shared buffer `buf`; every thread gets the result
    (threads past `block`, in a normalised rTask, take part in the barriers only)."""
    c = COMBINE[op].format(a=f"{buf}[tid]", b=f"{buf}[tid + s]")
    return [
        f"if (tid < {block}) {buf}[tid] = {var};",
        "BARRIER();",
        f"for (int s = {block // 2}; s > 0; s >>= 1) {{",
        f"    if (tid < s) {buf}[tid] = {c};",
        "    BARRIER();",
        "}",
        f"{var} = {buf}[0];",
        "BARRIER();",
    ]


class ReduceLayout:
    """Offsets of kept (output) and reduced coordinates of an input tensor."""

    def __init__(self, shape, axes):
        self.shape = tuple(shape)
        self.axes = sorted(set(axes))
        self.kept = [a for a in range(len(shape)) if a not in self.axes]
        self.R = int(np.prod([shape[a] for a in self.axes])) if self.axes else 1
        self.O = int(np.prod([shape[a] for a in self.kept])) if self.kept else 1
        st = strides_of(shape)
        self.st = st
        nz = [a for a in range(len(shape)) if shape[a] != 1]
        # Row form: the reduced axes (ignoring size-1 dims) are exactly the innermost ones.
        red_nz = [a for a in self.axes if shape[a] != 1]
        self.row = bool(red_nz) and red_nz == nz[len(nz) - len(red_nz):]
        # Column form with a single contiguous reduced block followed by kept inner dims.
        inner = [a for a in nz if a > (max(red_nz) if red_nz else -1)]
        self.inner = int(np.prod([shape[a] for a in inner])) if inner else 1
        self.contiguous_block = bool(red_nz) and red_nz == list(range(red_nz[0], red_nz[-1] + 1))

    def base(self, o: str) -> tuple[list[str], str]:
        if self.row:
            return [], f"{o} * {self.R}"
        if self.contiguous_block:
            return [], f"({o} / {self.inner}) * {self.R * self.inner} + ({o} % {self.inner})" if self.inner > 1 else f"{o} * {self.R}"
        names, stmts = unravel(o, [self.shape[a] for a in self.kept], "k")
        terms = [f"{n}*{self.st[a]}" for n, a in zip(names, self.kept) if self.shape[a] != 1]
        return stmts, " + ".join(terms) or "0"

    def offset(self, r: str) -> tuple[list[str], str]:
        if self.row:
            return [], r
        if self.contiguous_block:
            return [], f"{r} * {self.inner}" if self.inner > 1 else r
        names, stmts = unravel(r, [self.shape[a] for a in self.axes], "q")
        terms = [f"{n}*{self.st[a]}" for n, a in zip(names, self.axes) if self.shape[a] != 1]
        return stmts, " + ".join(terms) or "0"


def emit_reduce(ctx, out: str, x: str, axes, op: str, hint: str, pre: str = "v", post: str = "acc") -> None:
    """out[o] = post(reduce_op over r of pre(x[o, r])) — `pre` uses `v`, `post` uses `acc` and `R`."""
    lay = ReduceLayout(ctx.shape(x), axes)
    R, O = lay.R, lay.O
    post = post.replace("R_F", literal(float(R)))
    bstmts, base = lay.base("o")
    ostmts, off = lay.offset("r")
    dx, dy = ctx.dtype(x), ctx.dtype(out)  # storage: 16-bit floats load as float and store rounded
    load = load_float(dx, "x", f"base + {off}")
    if lay.row or (lay.inner == 1):
        block = pick_block(R)
        body = [
            "SHARED float red[%d];" % block,
            "const int o = BLOCK_ID;",
            "const int tid = THREAD_ID;",
            *bstmts,
            f"const int base = {base};",
            *accumulate_init(op),
            f"{lanes('r', R, block)} {{",
            *["    " + s for s in ostmts],
            f"    const float v = {load};",
            *["    " + s for s in accumulate_step(op, pre)],
            "}",
            *block_reduce("acc", op, block),
            f"if (tid == 0) {{ {store_float(dy, 'y', 'o', post)} }}",
        ]
        grid, kind = O, "reduce_row"
    else:
        block = 256
        body = [
            "const int o = BLOCK_ID * BLOCK_DIM + THREAD_ID;",
            f"if (o < {O}) {{",
            *bstmts,
            f"const int base = {base};",
            *accumulate_init(op),
            f"for (int r = 0; r < {R}; ++r) {{",
            *["    " + s for s in ostmts],
            f"    const float v = {load};",
            *["    " + s for s in accumulate_step(op, pre)],
            "}",
            store_float(dy, "y", "o", post),
            "}",
        ]
        grid, kind = (O + block - 1) // block, "reduce_col"

    def make(name):
        return (f"KERNEL void {name}(GPTR const {ctype(dx)}* x, GPTR {ctype(dy)}* y) {{\n    "
                + "\n    ".join(body) + "\n}\n")

    k = ctx.program.add_kernel(hint, make, block, smem_bytes=4 * block if kind == "reduce_row" else 0, kind=kind,
                               pass_name=ctx.pass_name, normalisable=kind == "reduce_row")
    ctx.launch(k, grid, [x, out], reads=[x], writes=[out], flops=R * O)
    ctx.program.launches[-1].expr = ReduceExpr(x, out, tuple(ctx.shape(x)), tuple(lay.axes), op, pre, post)


def row_pass(length: int, block: int, acc: str, update: str, dx: str = "float32",
             dy: str = "float32") -> tuple[list[str], str, int]:
    """Preamble of a block-per-row kernel plus its first pass over the row.

    The first pass reads each element from DRAM once (into `v`), keeps it in shared memory when
    the row fits (so later passes never go back to DRAM), and folds it into `acc` with `update`.
    `dx`, `dy`: the storage dtypes of x and y (row pointers `xr`, `yr`; 16-bit floats load
    through load_float). Returns (lines, expression reading element j in later passes, shared
    bytes used).
    """
    cache = length <= ROW_CACHE
    lines = [
        f"SHARED float red[{block}];",
        *([f"SHARED float row[{length}];"] if cache else []),
        "const int tid = THREAD_ID;",
        f"GPTR const {ctype(dx)}* xr = x + BLOCK_ID * {length};",
        f"GPTR {ctype(dy)}* yr = y + BLOCK_ID * {length};",
        f"{lanes('j', length, block)} {{ const float v = {load_float(dx, 'xr', 'j')}; "
        + ("row[j] = v; " if cache else "") + f"{acc} = {update}; }}",
    ]
    return lines, "row[j]" if cache else load_float(dx, "xr", "j"), 4 * (block + (length if cache else 0))


def emit_softmax(ctx, out: str, x: str, rows: int, length: int, inner: int, log: bool, hint: str) -> None:
    """Softmax over `length` elements of stride `inner`, for rows*inner independent vectors."""
    final = "(v - m) - F_LOG(s)" if log else "F_EXP(v - m) / s"
    dx, dy = ctx.dtype(x), ctx.dtype(out)
    if inner == 1:
        block = pick_block(length)
        first, rd, smem = row_pass(length, block, "m", "F_MAX(m, v)", dx, dy)
        body = [
            "float m = (-DLCC_INF);",
            *first,
            *block_reduce("m", "max", block),
            "float s = 0.0f;",
            f"{lanes('j', length, block)} s += F_EXP({rd} - m);",
            *block_reduce("s", "sum", block),
            f"{lanes('j', length, block)} {{ const float v = {rd}; {store_float(dy, 'yr', 'j', final)} }}",
        ]
        grid, kind = rows, "softmax_row"
    else:
        block = 256
        xj = load_float(dx, "x", f"base + j * {inner}")
        body = [
            "const int o = BLOCK_ID * BLOCK_DIM + THREAD_ID;",
            f"if (o < {rows * inner}) {{",
            f"const int base = (o / {inner}) * {length * inner} + (o % {inner});",
            "float m = (-DLCC_INF);",
            f"for (int j = 0; j < {length}; ++j) m = F_MAX(m, {xj});",
            "float s = 0.0f;",
            f"for (int j = 0; j < {length}; ++j) s += F_EXP({xj} - m);",
            f"for (int j = 0; j < {length}; ++j) {{ const float v = {xj}; "
            f"{store_float(dy, 'y', f'base + j * {inner}', final)} }}",
            "}",
        ]
        grid, kind, smem = (rows * inner + block - 1) // block, "softmax_col", 0

    def make(name):
        return (f"KERNEL void {name}(GPTR const {ctype(dx)}* x, GPTR {ctype(dy)}* y) {{\n    "
                + "\n    ".join(body) + "\n}\n")

    k = ctx.program.add_kernel(hint, make, block, smem_bytes=smem, kind=kind, pass_name=ctx.pass_name,
                               normalisable=kind == "softmax_row")
    ctx.launch(k, grid, [x, out], reads=[x], writes=[out], flops=5 * rows * length * inner)
    ctx.program.launches[-1].expr = SoftmaxExpr(x, out, rows, length, inner, log)


def emit_layernorm(ctx, out: str, x: str, scale: str, bias: str, rows: int, length: int, eps: float,
                   scale_mod: int, bias_mod: int, hint: str = "LayerNormalization") -> None:
    """y = (x - mean) / sqrt(var + eps) * scale + bias over rows of `length` (two-pass variance)."""
    block = pick_block(length)
    sidx = "j" if scale_mod == length else ("0" if scale_mod == 1 else f"j % {scale_mod}")
    bidx = "j" if bias_mod == length else ("0" if bias_mod == 1 else f"j % {bias_mod}")
    dx, dy = ctx.dtype(x), ctx.dtype(out)
    bias_term = f" + {load_float(ctx.dtype(bias), 'b', bidx)}" if bias else ""
    params = (f"GPTR const {ctype(dx)}* x, GPTR const {ctype(ctx.dtype(scale))}* g, "
              + (f"GPTR const {ctype(ctx.dtype(bias))}* b, " if bias else "") + f"GPTR {ctype(dy)}* y")
    first, rd, smem = row_pass(length, block, "s", "s + v", dx, dy)
    normed = f"({rd} - mean) * rstd * {load_float(ctx.dtype(scale), 'g', sidx)}{bias_term}"
    body = [
        "float s = 0.0f;",
        *first,
        *block_reduce("s", "sum", block),
        f"const float mean = s * {literal(1.0 / length)};",
        "float q = 0.0f;",
        f"{lanes('j', length, block)} {{ const float d = {rd} - mean; q += d * d; }}",
        *block_reduce("q", "sum", block),
        f"const float rstd = F_RSQRT(q * {literal(1.0 / length)} + {literal(eps)});",
        f"{lanes('j', length, block)} {{ {store_float(dy, 'yr', 'j', normed)} }}",
    ]

    def make(name):
        return f"KERNEL void {name}({params}) {{\n    " + "\n    ".join(body) + "\n}\n"

    k = ctx.program.add_kernel(hint, make, block, smem_bytes=smem, kind="layernorm_row", pass_name=ctx.pass_name,
                               normalisable=True)
    args = [x, scale] + ([bias] if bias else []) + [out]
    ctx.launch(k, rows, args, reads=args[:-1], writes=[out], flops=8 * rows * length)
    ctx.program.launches[-1].expr = LayerNormExpr(x, scale, bias, out, rows, length, float(eps), scale_mod, bias_mod)
