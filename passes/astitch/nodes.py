"""The stitcher's view of a lowered program: one node per launch, in element-level form.

`lower` leaves every launch with the expression it was generated from (kernels/map.py MapExpr,
kernels/reduce.py ReduceExpr/SoftmaxExpr/LayerNormExpr, kernels/gemm.py GemmExpr). Here each
becomes a node the stitcher can reason about without knowing op names:

- map:    out[i] = body(inputs at index expressions of i)            (elementwise, broadcast, layout)
- reduce: out[o] = post(op over r of pre(x[base(o) + off(r)]))        (row or column, any axes)
- gemm:   a tiled rOperator whose loads and store can absorb map nodes
- opaque: anything else (RNN step kernels, TopK, float16 kernels): kept as it is

Softmax and LayerNorm are decomposed into reduce and map nodes (max, exp, sum, divide; mean,
centre, variance, scale), so the same scheme choice (Local / Regional / Global) that stitches a
hand-decomposed LayerNorm also stitches the fused op, and its producers and consumers with it.
Nodes name tensors by their *base* (views resolved), since a view shares its base's flat layout.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ...ir import Tensor
from ...kernels import splitk
from ...kernels.gemm import GemmExpr
from ...kernels.map import MapExpr
from ...random_draws import STATE
from ...kernels.program import literal
from ...kernels.reduce import LayerNormExpr, ReduceExpr, SoftmaxExpr

#: Tensor dtypes a stitched kernel reads and writes. 16-bit floats are storage: element functions
#: load them into float (load_float) and stores round (store_float), so stitching never sees them
#: as values (ops/narrow.py stores weights and activations so at precision fp16/bf16).
STITCHABLE_DTYPES = ("float32", "float16", "bfloat16", "int64", "int32", "bool", "uint8", "int8")
FLOATS = ("float32", "float16", "bfloat16")
#: Dtypes a stitched kernel keeps in its shared memory, a float array: floats as they are (a 16-bit
#: float keeps its unrounded value), an int32 as its bits (AS_FLOAT / AS_UINT), and bool, uint8
#: and int8, whose values a float holds exactly, converted. An int64 does not fit a slot.
SMEM_DTYPES = FLOATS + ("int32", "bool", "uint8", "int8")


@dataclass
class Node:
    id: int
    kind: str  # map | reduce | gemm | opaque
    inputs: list[str]  # base tensors read ("" for an omitted input)
    output: str  # base tensor written (opaque nodes may write several: `writes`)
    order: int  # index of the launch it came from (ties keep the original order)
    launch: Any = None  # the original Launch (kept as-is when the node is not stitched)
    op_type: str = ""
    onnx_node: str = ""
    # map
    body: Callable | None = None
    in_shapes: list[tuple] = field(default_factory=list)  # shapes the body indexes its inputs with
    out_shape: tuple = ()
    in_literals: list[str | None] = field(default_factory=list)
    flops_per_elem: int = 1
    index_maps: dict = field(default_factory=dict)
    sparse: bool = False
    # reduce
    red: ReduceExpr | None = None
    # gemm
    gemm: GemmExpr | None = None
    writes: list[str] = field(default_factory=list)
    reads: list[str] = field(default_factory=list)

    @property
    def memory_bound(self) -> bool:
        return self.kind in ("map", "reduce")


class NodeGraph:
    """Nodes plus who produces and who consumes each base tensor."""

    def __init__(self, graph, ctx):
        self.graph, self.ctx = graph, ctx
        self.nodes: list[Node] = []
        self.producer: dict[str, int] = {}
        self._ntmp = 0
        for k, L in enumerate(ctx.program.launches):
            self._add_launch(k, L)
        self.outputs = {ctx.resolve(o) for o in graph.outputs}
        self.consumers: dict[str, list[int]] = {}
        for n in self.nodes:
            for t in n.reads:
                self.consumers.setdefault(t, [])
                if n.id not in self.consumers[t]:
                    self.consumers[t].append(n.id)

    # -- helpers -----------------------------------------------------------------------------
    def res(self, name: str) -> str:
        return self.ctx.resolve(name) if name else ""

    def tensor(self, name: str) -> Tensor:
        return self.graph.tensors[name]

    def size(self, name: str) -> int:
        return self.tensor(name).size

    def is_const(self, name: str) -> bool:
        return bool(name) and self.graph.tensors[name].value is not None

    def temp(self, shape, dtype="float32") -> str:
        self._ntmp += 1
        name = f"%stitch{self._ntmp}"
        while name in self.graph.tensors:
            self._ntmp += 1
            name = f"%stitch{self._ntmp}"
        self.graph.tensors[name] = Tensor(name, tuple(int(d) for d in shape), dtype)
        return name

    def _new(self, kind, order, L, **kw) -> Node:
        n = Node(len(self.nodes), kind, order=order, launch=L, op_type=L.op_type if L else "",
                 onnx_node=L.node if L else "", **kw)
        if not n.reads:
            n.reads = sorted({t for t in n.inputs if t})
        if not n.writes:
            n.writes = [n.output]
        self.nodes.append(n)
        for w in n.writes:
            if w != STATE:  # (the random state's advance writes it after every draw read it: no producer)
                self.producer[w] = n.id
        return n

    def _opaque(self, k, L):
        reads = sorted({self.res(t) for t in L.reads})
        writes = [self.res(t) for t in L.writes]
        return self._new("opaque", k, L, inputs=reads, output=writes[0] if writes else "", reads=reads, writes=writes)

    # -- launches -> nodes --------------------------------------------------------------------
    def _add_launch(self, k, L):
        e = L.expr
        # a split GEMM's workspace and counters are its own business (kernels/splitk.py), not data
        own = splitk.tensors(e.splitk_args) if isinstance(e, GemmExpr) else set()
        reads, writes = [t for t in L.reads if t not in own], [t for t in L.writes if t not in own]
        dts = {self.tensor(t).dtype for t in reads + writes}
        if e is None or not dts <= set(STITCHABLE_DTYPES) or len(writes) != 1:
            return self._opaque(k, L)
        if isinstance(e, MapExpr):
            return self._map_from_expr(k, L, e)
        if isinstance(e, ReduceExpr):
            return self._new("reduce", k, L, inputs=[self.res(e.x)], output=self.res(e.out), red=e,
                             out_shape=tuple(self.tensor(e.out).shape))
        if isinstance(e, SoftmaxExpr):
            return self._softmax(k, L, e)
        if isinstance(e, LayerNormExpr):
            return self._layernorm(k, L, e)
        if isinstance(e, GemmExpr):
            if any(self.tensor(t).dtype not in FLOATS for t in e.reads + e.writes):
                return self._opaque(k, L)
            return self._new("gemm", k, L, inputs=[self.res(t) for t in e.reads], output=self.res(e.writes[0]),
                             gemm=e)
        return self._opaque(k, L)

    def _map_from_expr(self, k, L, e: MapExpr):
        g = self.graph
        if _uses_raw_params(e, g):
            return self._opaque(k, L)
        lits, shapes = [], []
        for name in e.inputs:
            if not name:
                lits.append("0"), shapes.append(())
                continue
            shapes.append(tuple(g.tensors[name].shape))
            val = g.tensors[name].value
            if e.inline_scalars and val is not None and val.size == 1 and g.tensors[name].dtype in ("float32", "int64", "int32", "bool"):
                lits.append(literal(val.reshape(()).item(), g.tensors[name].dtype))
            else:
                lits.append(None)
        ins = [self.res(n) if lit is None else "" for n, lit in zip(e.inputs, lits)]
        return self._new("map", k, L, inputs=ins, output=self.res(e.output), body=e.body, in_shapes=shapes,
                         out_shape=tuple(g.tensors[e.output].shape), in_literals=lits,
                         flops_per_elem=e.flops_per_elem, index_maps=dict(e.index_maps or {}), sparse=e.sparse_reads)

    def _synthetic_map(self, k, L, ins, shapes, out, out_shape, body, flops=1):
        return self._new("map", k, L, inputs=list(ins), output=out, body=body, in_shapes=list(shapes),
                         out_shape=tuple(out_shape), in_literals=[None] * len(ins), flops_per_elem=flops)

    def _synthetic_reduce(self, k, L, x, shape, axes, op, out, pre="v", post="acc"):
        red = ReduceExpr(x, out, tuple(shape), tuple(axes), op, pre, post)
        return self._new("reduce", k, L, inputs=[x], output=out, red=red,
                         out_shape=tuple(1 if a in axes else d for a, d in enumerate(shape)))

    def _softmax(self, k, L, e: SoftmaxExpr):
        """max m, e = exp(x - m), sum s, y = e / s   (log: y = x - m - log(s))."""
        x, out = self.res(e.x), self.res(e.out)
        full, red = (e.rows, e.length, e.inner), (e.rows, 1, e.inner)
        m = self.temp(red)
        s = self.temp(red)
        self._synthetic_reduce(k, L, x, full, (1,), "max", m)
        ex = self.temp(full)
        self._synthetic_map(k, L, [x, m], [full, red], ex, full,
                            lambda v: ([], f"F_EXP({v.x(0)} - {v.x(1)})"), flops=3)
        self._synthetic_reduce(k, L, ex, full, (1,), "sum", s)
        if e.log:
            self._synthetic_map(k, L, [x, m, s], [full, red, red], out, full,
                                lambda v: ([], f"({v.x(0)} - {v.x(1)}) - F_LOG({v.x(2)})"), flops=3)
        else:
            self._synthetic_map(k, L, [ex, s], [full, red], out, full, lambda v: ([], f"{v.x(0)} / {v.x(1)}"))

    def _layernorm(self, k, L, e: LayerNormExpr):
        """mean m, d = x - m, variance q = mean(d*d), y = d * rsqrt(q + eps) * g + b (two-pass, as lower)."""
        x, out = self.res(e.x), self.res(e.out)
        full, red = (e.rows, e.length), (e.rows, 1)
        inv = literal(1.0 / e.length)
        m, q = self.temp(red), self.temp(red)
        self._synthetic_reduce(k, L, x, full, (1,), "sum", m, post=f"acc * {inv}")
        d = self.temp(full)
        self._synthetic_map(k, L, [x, m], [full, red], d, full, lambda v: ([], f"{v.x(0)} - {v.x(1)}"))
        self._synthetic_reduce(k, L, d, full, (1,), "sum", q, pre="v * v", post=f"acc * {inv}")
        g, b = self.res(e.scale), self.res(e.bias) if e.bias else ""
        eps = literal(e.eps)

        def idx(v, mod):
            return v.o[1] if mod == e.length else ("0" if mod == 1 else f"{v.o[1]} % {mod}")

        def body(v):
            expr = f"{v.x(0)} * F_RSQRT({v.x(1)} + {eps}) * {v.ld_flat(2, idx(v, e.scale_mod))}"
            if b:
                expr += f" + {v.ld_flat(3, idx(v, e.bias_mod))}"
            return [], expr

        ins = [d, q, g] + ([b] if b else [])
        shapes = [full, red, (e.scale_mod,)] + ([(e.bias_mod,)] if b else [])
        n = self._synthetic_map(k, L, ins, shapes, out, full, body, flops=4)
        n.index_maps = {2: None, 3: None}  # weights, read by position modulo their size


_RAW = __import__("re").compile(r"\bx\d+\b")


def _uses_raw_params(e: MapExpr, g) -> bool:
    """Bodies that use the baseline kernel's parameter names directly (pointer arithmetic on `x0`
    in pooling and direct convolutions) cannot become element functions: keep those kernels."""
    from ...kernels.map import MapView

    shapes = [tuple(g.tensors[n].shape) if n else () for n in e.inputs]
    v = MapView([f"o{j}" for j in range(len(g.tensors[e.output].shape))], "i", tuple(g.tensors[e.output].shape),
                shapes, ["@in" for _ in e.inputs], [None] * len(e.inputs))
    stmts, expr = e.body(v)
    return bool(_RAW.search("\n".join(stmts) + expr))
