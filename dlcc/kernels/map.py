"""Map kernels: out[i] = f(inputs at g(i)) — the index-expression form of memory-bound ops.

Elementwise, broadcast and layout ops all lower to this form (DESIGN.md §2): a lowering supplies
`body(v)`, which returns statements plus the value of one output element, reading inputs through
`v.ld(k, coords)` with coordinates written as C expressions over the output coordinates `v.o`.
That explicit index form is what AStitch later reasons about. One thread per output element,
consecutive threads write consecutive elements (coalesced stores).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .program import ctype, literal, load_float, store_value

BLOCK = 256


def strides_of(shape) -> list[int]:
    s, out = 1, []
    for d in reversed(shape):
        out.append(s)
        s *= d
    return list(reversed(out))


def linear_index(coords: list[str], shape) -> str:
    """C expression for the row-major offset of `coords` in a tensor of `shape`."""
    terms = []
    for c, d, st in zip(coords, shape, strides_of(shape)):
        if d == 1 or c == "0":
            continue
        terms.append(f"({c})" if st == 1 else f"({c})*{st}")
    return " + ".join(terms) or "0"


def unravel(var: str, shape, prefix: str) -> tuple[list[str], list[str]]:
    """Statements decomposing flat index `var` into per-dim coordinates named prefix0.."""
    names, stmts = [], []
    rem = var
    n = len(shape)
    for k in range(n - 1, -1, -1):
        d = shape[k]
        name = f"{prefix}{k}"
        names.insert(0, name)
        if d == 1:
            stmts.append(f"const int {name} = 0;")
            continue
        if k == 0 or all(x == 1 for x in shape[:k]):
            stmts.append(f"const int {name} = {rem};")
            rem = "0"
            continue
        stmts.append(f"const int {name} = {rem} % {d};")
        nxt = f"{prefix}r{k}"
        stmts.append(f"const int {nxt} = {rem} / {d};")
        rem = nxt
    return names, stmts


_DEF = re.compile(r"^const int (\w+) = ")


def prune_defs(defs: list[str], used_by: str) -> list[str]:
    """Drop `const int NAME = ...;` definitions nothing reads (coordinates a flat index made moot)."""
    kept: list[str] = []
    text = used_by
    for d in reversed(defs):
        m = _DEF.match(d)
        if m is None or re.search(rf"\b{m.group(1)}\b", text):
            kept.insert(0, d)
            text += "\n" + d
    return kept


@dataclass
class MapView:
    o: list[str]  # output coordinate variables
    i: str  # flat output index variable
    out_shape: tuple
    in_shapes: list[tuple]
    in_names: list[str | None]  # param name, or None if the input is an inlined scalar literal
    in_literals: list[str | None]
    in_dtypes: list[str] | None = None  # each input's dtype: 16-bit float loads convert to float

    def _load(self, k: int, index: str) -> str:
        return load_float(self.in_dtypes[k] if self.in_dtypes else "float32", self.in_names[k], index)

    def ld(self, k: int, coords: list[str] | None = None) -> str:
        """Load input k at coordinates (default: numpy-broadcast from the output coords)."""
        if self.in_literals[k] is not None:
            return self.in_literals[k]
        if coords is None:
            flat = self._broadcast_flat(k)
            if flat is not None:
                return self._load(k, flat)
            coords = self.bc(k)
        return self._load(k, linear_index(coords, self.in_shapes[k]))

    def _broadcast_flat(self, k: int) -> str | None:
        """Flat index for the common broadcasts, so no coordinates need unravelling: same shape
        (→ i) or a trailing block of the output (a bias, → i % size)."""
        shp = list(self.in_shapes[k])
        while shp and shp[0] == 1:
            shp.pop(0)
        n = 1
        for d in shp:
            n *= d
        if n == 1:
            return "0"
        out = list(self.out_shape)
        if shp == out[len(out) - len(shp):]:
            total = 1
            for d in out:
                total *= d
            return self.i if n == total else f"{self.i} % {n}"
        return None

    def ld_flat(self, k: int, flat: str) -> str:
        if self.in_literals[k] is not None:
            return self.in_literals[k]
        return self._load(k, flat)

    def bc(self, k: int) -> list[str]:
        shp = self.in_shapes[k]
        off = len(self.o) - len(shp)
        return ["0" if d == 1 else self.o[off + j] for j, d in enumerate(shp)]

    def x(self, k: int) -> str:
        return self.ld(k)


def emit_map(ctx, out: str, ins: list[str], body: Callable[[MapView], tuple[list[str], str]], hint: str,
             flops_per_elem: int = 1, inline_scalars: bool = True, sparse_reads: bool = False,
             index_maps: dict | None = None) -> None:
    """Emit and launch one map kernel producing `out` from `ins` (omitted inputs as "").

    `sparse_reads`: each output element reads at most one element of each input (Gather, Slice,
    Split), so the modelled DRAM traffic of an input is capped at one element per output rather
    than the whole tensor (an embedding lookup reads a few rows, not the table).

    `index_maps`: {input k: fn() -> int array} giving, for every output element (flat), the flat
    input element it reads (-1: data-dependent, -2: not read). Inputs read through the default
    numpy broadcast (`v.x(k)`) need none; AStitch uses these maps to classify stitch edges.
    """
    out_shape = ctx.shape(out)
    n = int(np.prod(out_shape)) if out_shape else 1
    if n >= 2**31:
        raise ctx.fail(f"{n} elements exceed the 32-bit index space of map kernels")
    params, args, names, lits, shapes, dtypes = [], [], [], [], [], []
    for k, name in enumerate(ins):
        dtypes.append(ctx.dtype(name) if name else "float32")
        if not name:
            names.append(None), lits.append("0"), shapes.append(())
            continue
        shapes.append(ctx.shape(name))
        val = ctx.const(name)
        if inline_scalars and val is not None and val.size == 1 and ctx.dtype(name) in ("float32", "int64", "int32", "bool"):
            names.append(None)
            lits.append(literal(val.reshape(()).item(), ctx.dtype(name)))
            continue
        pname = f"x{k}"
        names.append(pname)
        lits.append(None)
        params.append(f"GPTR const {ctype(ctx.dtype(name))}* {pname}")
        args.append(name)
    out_t = ctype(ctx.dtype(out))
    params.append(f"GPTR {out_t}* y")
    coords, unr = unravel("i", out_shape, "o")
    v = MapView(coords, "i", tuple(out_shape), shapes, names, lits, dtypes)
    stmts, expr = body(v)
    tail = list(stmts) + [store_value(ctx.dtype(out), "y", "i", expr)]
    lines = prune_defs(unr, "\n".join(tail)) + tail

    def make(kname: str) -> str:
        inner = "\n        ".join(lines)
        return (
            f"KERNEL void {kname}({', '.join(params)}) {{\n"
            f"    const int i = BLOCK_ID * BLOCK_DIM + THREAD_ID;\n"
            f"    if (i < {n}) {{\n        {inner}\n    }}\n}}\n"
        )

    kname = ctx.program.add_kernel(hint, make, BLOCK, kind="map", pass_name=ctx.pass_name)
    reads = list(args)
    dram = None
    if sparse_reads:
        dram = ctx.tensor(out).nbytes + sum(min(ctx.tensor(a).nbytes, n * ctx.tensor(a).itemsize) for a in set(reads))
    ctx.launch(kname, (n + BLOCK - 1) // BLOCK, args + [out], reads=reads, writes=[out],
               flops=n * flops_per_elem, dram_bytes=dram)
    ctx.program.launches[-1].expr = MapExpr(list(ins), out, body, inline_scalars, flops_per_elem, sparse_reads,
                                            dict(index_maps or {}))


@dataclass
class MapExpr:
    """out[o] = body(inputs at index expressions of o): the element-level form AStitch reasons about."""

    inputs: list[str]
    output: str
    body: Callable[[MapView], tuple[list[str], str]]
    inline_scalars: bool = True
    flops_per_elem: int = 1
    sparse_reads: bool = False
    index_maps: dict = None
