"""Random valid ONNX graphs, biased toward what dlcc transforms (issue 17; NNSmith's idea).

`generate(seed)` builds one model op by op. Every op is chosen among those that fit what the graph
already holds (a tensor pool): the generator computes each output's shape itself, and the result is
checked by onnx's strict shape inference and checker, so a generator bug shows as a GeneratorBug,
never as a dlcc failure. NNSmith asks an SMT solver whether an op's shape constraints can be met;
here each pattern builds its operands so that they are met by construction.

What the patterns favour (each is one function below, in `PATTERNS` with its weight):
- chains and diamonds of elementwise ops, with broadcasting operands and several consumers;
- reductions over any axis subset, with and without keepdims, feeding maps (x - mean(x), ...);
- Softmax/LogSoftmax, LayerNormalization, and hand-decomposed LayerNorms (the tf2onnx form with
  E[x²] - mean², as in the model that motivated this module), RMSNorm;
- Reshape, Transpose, Slice, Concat, Split, Gather, Expand, Pad between them;
- MatMul, Gemm and Conv (with BatchNorm and pools) with prologue and epilogue chains, and
  LayerNorms that only GEMMs read (folded into them);
- LSTM and GRU;
- If, with a constant condition or one computed exactly from an input (control_flow.py).
Shapes include odd sizes, 1-sized dims, rows longer than the shared-memory budget, rows shorter
than a warp and grids smaller than a device.

Values: graph inputs and weights are drawn from a separate numpy rng; an interval (lo, hi) is
tracked for each float tensor, and ops with a domain are guarded (Log/Sqrt/Div read |x| + c, Exp
reads a squashed value), so onnxruntime's result is finite. Discontinuous ops (Floor, Sign,
comparisons, Cast to int, ArgMax) only read exact values (graph inputs and constants): on a computed
value a rounding difference at a step would be a legitimate difference, not a bug. A graph whose
reference still has a NaN or Inf is rejected (InvalidCase), as NNSmith treats NaN as undefined.

`generate_unsupported(seed)` builds graphs dlcc must refuse with its one-paragraph error:
unsupported dtypes, value-dependent shapes and ops dlcc does not lower.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .choices import Chooser

INF = float("inf")
#: Dims drawn for shapes, simplest first (shrinking moves toward the front).
DIMS = [1, 2, 3, 4, 5, 8, 7, 16, 17, 6, 32, 33, 31, 64, 12, 65, 100, 128, 257, 96, 512, 300]
#: Elements a tensor may have (keeps PoCL and onnxruntime quick); long rows may use more.
MAX_NUMEL = 1 << 14
LONG_ROW = (12289, 16411)  # past 48 KiB of float32: the Regional budget of a block


class GeneratorBug(AssertionError):
    """The generator built a graph onnx rejects, or computed a shape onnx disagrees with."""


class InvalidCase(ValueError):
    """The graph is valid but its reference output is not finite: no verdict can be drawn."""


@dataclass
class Val:
    name: str
    shape: tuple
    dtype: str = "float32"
    lo: float = -INF
    hi: float = INF
    exact: bool = False  # a graph input or constant: discontinuous ops may read it

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def mag(self) -> float:
        return max(abs(self.lo), abs(self.hi))


@dataclass
class Case:
    """One generated model with its inputs and onnxruntime's outputs."""

    model: onnx.ModelProto
    feeds: dict
    refs: dict  # output name -> onnxruntime's array
    seed: int
    choices: list = field(default_factory=list)
    ops: list = field(default_factory=list)  # op types in node order

    @property
    def outputs(self) -> list[str]:
        return [o.name for o in self.model.graph.output]


_NP = {"float32": np.float32, "int64": np.int64, "int32": np.int32, "bool": np.bool_, "float64": np.float64,
       "int8": np.int8, "uint8": np.uint8, "int16": np.int16, "uint16": np.uint16, "uint32": np.uint32,
       "uint64": np.uint64}
_TP = {"float32": TensorProto.FLOAT, "int64": TensorProto.INT64, "int32": TensorProto.INT32,
       "int8": TensorProto.INT8, "uint8": TensorProto.UINT8, "int16": TensorProto.INT16, "uint16": TensorProto.UINT16,
       "uint32": TensorProto.UINT32, "uint64": TensorProto.UINT64,
       "bool": TensorProto.BOOL, "float64": TensorProto.DOUBLE, "float16": TensorProto.FLOAT16,
       "bfloat16": TensorProto.BFLOAT16}


def _itv(f, lo, hi):
    """Interval image of a monotone function (either direction)."""
    a, b = f(lo), f(hi)
    return (min(a, b), max(a, b))


def _mul_itv(a: Val, b: Val):
    c = [x * y for x in (a.lo, a.hi) for y in (b.lo, b.hi) if not (math.isinf(x) and y == 0) and not (math.isinf(y) and x == 0)]
    return (min(c + [0.0]) if not c else min(c), max(c) if c else 0.0)


class Gen:
    """The graph under construction and its tensor pool."""

    def __init__(self, ch: Chooser, vals: np.random.Generator, opset: int):
        self.ch, self.rs, self.opset = ch, vals, opset
        self.nodes: list = []
        self.inputs: list = []  # ValueInfoProto
        self.inits: list = []   # TensorProto
        self.feeds: dict = {}
        self.pool: list[Val] = []
        self.n = 0
        self.style = ch.pick(["plain", "tf", "odd"])

    # -- names --------------------------------------------------------------------------------
    def name(self, hint: str) -> str:
        """A fresh tensor name. Real exporters write names such as 'model/dense_1/MatMul:0';
        some styles also carry characters that must never reach generated source unescaped."""
        self.n += 1
        if self.style == "tf":
            return f"model/{hint}_{self.n}/{hint.title()}:0"
        if self.style == "odd":
            return [f"{hint} {self.n}", f"{hint}[{self.n}]", f"*/ {hint}{self.n} /*", f'{hint}"{self.n}\\',
                    f"{hint}.{self.n}-ü"][self.n % 5]
        return f"{hint}{self.n}"

    # -- leaves --------------------------------------------------------------------------------
    def input(self, shape, lo=-2.0, hi=2.0, dtype="float32", hint="x") -> Val:
        name = self.name(hint)
        shape = tuple(int(d) for d in shape)
        if dtype == "float32":
            arr = self.rs.uniform(lo, hi, shape).astype(np.float32)
        elif dtype == "bool":
            arr = self.rs.random(shape) < 0.5
        else:
            arr = self.rs.integers(int(lo), int(hi) + 1, shape).astype(_NP[dtype])
        self.feeds[name] = arr
        self.inputs.append(helper.make_tensor_value_info(name, _TP[dtype], shape))
        v = Val(name, shape, dtype, float(lo), float(hi), exact=True)
        self.pool.append(v)
        return v

    def const(self, arr, hint="c") -> Val:
        arr = np.asarray(arr)
        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(arr, name))
        dt = str(arr.dtype)
        lo, hi = (float(arr.min()), float(arr.max())) if arr.size and dt == "float32" else (-INF, INF)
        return Val(name, tuple(arr.shape), dt, lo, hi, exact=True)

    def ints(self, values, hint="i") -> Val:
        return self.const(np.asarray(values, np.int64), hint)

    def weight(self, shape, scale: float = 1.0, lo: float | None = None, hint="w") -> Val:
        lo = -scale if lo is None else lo
        return self.const(self.rs.uniform(lo, scale, shape).astype(np.float32), hint)

    def scalar(self, v: float) -> Val:
        return self.const(np.array(v, np.float32), "s")

    # -- nodes ---------------------------------------------------------------------------------
    def node(self, op: str, ins: list, outs: list[tuple], **attrs) -> list[Val]:
        """Add one node. `ins`: Vals, names or None (an omitted optional input). `outs`: (shape,
        dtype, lo, hi) per output, or None for an output left unnamed. Outputs join the pool."""
        names = ["" if i is None else (i.name if isinstance(i, Val) else i) for i in ins]
        while names and names[-1] == "":
            names.pop()
        res, onames = [], []
        for o in outs:
            if o is None:
                onames.append("")
                continue
            shape, dtype, lo, hi = o
            v = Val(self.name(op.lower()[:6]), tuple(int(d) for d in shape), dtype, float(lo), float(hi))
            onames.append(v.name)
            res.append(v)
        while onames and onames[-1] == "":
            onames.pop()
        self.nodes.append(helper.make_node(op, names, onames, name=self.name("n"), **attrs))
        self.pool += res
        return res

    def one(self, op, ins, shape, lo=-INF, hi=INF, dtype="float32", **attrs) -> Val:
        return self.node(op, ins, [(shape, dtype, lo, hi)], **attrs)[0]

    # -- picking -------------------------------------------------------------------------------
    def pick(self, pred=lambda v: True, dtype="float32") -> Val | None:
        """A pool value (recent ones first: chains; any with some chance: several consumers)."""
        cands = [v for v in self.pool if v.dtype == dtype and pred(v)]
        if not cands:
            return None
        if self.ch.chance(0.3):
            return self.ch.pick(cands)
        return cands[-1 - self.ch.below(min(3, len(cands)))]

    def pick_or_input(self, pred=lambda v: True, make_shape=None) -> Val:
        v = self.pick(pred)
        if v is None:
            v = self.input(make_shape() if make_shape else self.shape())
        return v

    # -- shapes --------------------------------------------------------------------------------
    def dim(self, hi_index: int | None = None) -> int:
        return self.ch.pick(DIMS[: hi_index or len(DIMS)])

    def shape(self, rank: int | None = None, cap: int = MAX_NUMEL) -> tuple:
        r = rank if rank is not None else self.ch.pick([2, 1, 3, 4, 0])
        if r and self.ch.chance(0.08):  # a row past the shared-memory budget
            rows = [self.ch.pick([1, 2, 3]) for _ in range(r - 1)]
            return tuple(rows + [self.ch.between(*LONG_ROW)])
        dims = [self.dim() for _ in range(r)]
        while int(np.prod(dims, dtype=np.int64)) > cap:
            k = int(np.argmax(dims))
            dims[k] = max(1, dims[k] // 2)
        return tuple(dims)

    def bshape(self, shape: tuple) -> tuple:
        """A shape that broadcasts into `shape`: a suffix of it with some dims set to 1."""
        k = self.ch.between(0, len(shape))
        tail = list(shape[len(shape) - k:])
        return tuple(1 if self.ch.chance(0.3) else d for d in tail)

    # -- guards (keep onnxruntime's result finite and the op inside its domain) ------------------
    def squash(self, v: Val) -> Val:
        op = self.ch.pick(["Tanh", "Sigmoid", "Clip"])
        if op == "Clip":
            return self.one("Clip", [v, self.scalar(-3.0), self.scalar(3.0)], v.shape, min(max(v.lo, -3), 3),
                            max(min(v.hi, 3), -3))
        lo, hi = (-1.0, 1.0) if op == "Tanh" else (0.0, 1.0)
        return self.one(op, [v], v.shape, lo, hi)

    def bounded(self, v: Val, limit: float = 30.0) -> Val:
        return v if v.mag <= limit else self.squash(v)

    def positive(self, v: Val, floor: float = 0.5) -> Val:
        """|v| + c, or sigmoid(v) + c: a value ≥ c, for Log, Sqrt, divisors and Pow bases."""
        if v.lo >= floor:
            return v
        if self.ch.chance(0.5):
            a = self.one("Abs", [v], v.shape, 0.0, v.mag)
        else:
            a = self.one("Sigmoid", [v], v.shape, 0.0, 1.0)
        c = self.ch.pick([0.5, 1.0, 2.0])
        c = max(c, floor)
        return self.one("Add", [a, self.scalar(c)], v.shape, a.lo + c, a.hi + c)


def _bcast(a: tuple, b: tuple) -> tuple:
    out = []
    for k in range(max(len(a), len(b))):
        x = a[len(a) - 1 - k] if k < len(a) else 1
        y = b[len(b) - 1 - k] if k < len(b) else 1
        assert x == y or x == 1 or y == 1, (a, b)
        out.append(max(x, y))
    return tuple(reversed(out))


def _broadcastable(a: tuple, b: tuple) -> bool:
    for k in range(min(len(a), len(b))):
        x, y = a[len(a) - 1 - k], b[len(b) - 1 - k]
        if x != y and x != 1 and y != 1:
            return False
    return True


# ------------------------------------------------------------------------------------------------
# Patterns. Each adds one or a few nodes; the table at the end weights them.
# ------------------------------------------------------------------------------------------------
def _unary_table(g: Gen, v: Val) -> list[str]:
    ops = ["Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Erf", "Softplus",
           "Softsign", "LeakyRelu", "Elu", "Selu", "HardSigmoid", "Sin", "Cos", "Celu", "Clip"]
    ops += ["Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh"]
    if g.opset >= 14:
        ops.append("HardSwish")
    if g.opset >= 18:
        ops.append("Mish")
    if g.opset >= 20:
        ops.append("Gelu")
    if v.exact:
        ops += ["Floor", "Ceil", "Round", "Sign", "ThresholdedRelu", "Shrink"]
    return ops


def p_unary(g: Gen) -> None:
    v = g.pick_or_input()
    op = g.ch.pick(_unary_table(g, v))
    attrs = {}
    if op == "Exp":
        v = g.bounded(v, 10.0)
        lo, hi = math.exp(max(v.lo, -80)), math.exp(v.hi)
    elif op == "Log":
        v = g.positive(v, 0.1)
        lo, hi = math.log(v.lo), math.log(v.hi) if v.hi < INF else INF
    elif op == "Sqrt":
        v = g.positive(v, 0.0) if v.lo < 0 else v
        lo, hi = math.sqrt(max(v.lo, 0)), math.sqrt(v.hi)
    elif op == "Reciprocal":
        v = g.positive(v, 0.25)
        lo, hi = 1 / v.hi if v.hi < INF else 0.0, 1 / v.lo
    elif op in ("Sigmoid", "HardSigmoid"):
        lo, hi = 0.0, 1.0
        if op == "HardSigmoid" and g.ch.chance(0.5):
            attrs = {"alpha": 0.3, "beta": 0.4}
    elif op in ("Tanh", "Erf", "Softsign", "Sin", "Cos"):
        lo, hi = -1.0, 1.0
    elif op in ("Asin", "Acos", "Atanh"):  # defined inside (-1, 1): tanh(v) scaled into [-0.95, 0.95]
        if v.mag > 0.95:
            t = g.one("Tanh", [v], v.shape, -1.0, 1.0)
            v = g.one("Mul", [t, g.scalar(0.95)], v.shape, -0.95, 0.95)
        lo, hi = {"Asin": (-1.6, 1.6), "Acos": (0.0, 3.2), "Atanh": (-1.9, 1.9)}[op]
    elif op == "Acosh":  # defined from 1 on
        v = g.positive(v, 1.0)
        lo, hi = 0.0, math.acosh(v.hi) + 0.1 if v.hi < INF else INF
    elif op == "Tan":  # away from its poles at ±pi/2
        if v.mag > 1.2:
            v = g.one("Tanh", [v], v.shape, -1.0, 1.0)
        lo, hi = -2.6, 2.6
    elif op in ("Sinh", "Cosh"):
        v = g.bounded(v, 5.0)
        m = math.sinh(min(v.mag, 5.0)) + 1.0
        lo, hi = (-m, m) if op == "Sinh" else (1.0, m)
    elif op in ("Atan", "Asinh"):
        lo, hi = (-1.6, 1.6) if op == "Atan" else (-math.asinh(v.mag) - 0.1, math.asinh(v.mag) + 0.1)
    elif op == "Relu":
        lo, hi = max(v.lo, 0.0), max(v.hi, 0.0)
    elif op == "Abs":
        lo, hi = 0.0, v.mag
    elif op == "Neg":
        lo, hi = -v.hi, -v.lo
    elif op == "Softplus":
        v = g.bounded(v, 30.0)
        lo, hi = 0.0, max(v.hi, 0) + 1.0
    elif op == "Clip":
        a, b = sorted([g.ch.pick([-1.0, 0.0, -2.5, 0.5]), g.ch.pick([1.0, 6.0, 0.25, 2.0])])
        b = max(b, a + 0.1)
        ins = [v, g.scalar(a), g.scalar(b)] if g.ch.chance(0.8) else [v, None, g.scalar(b)]
        lo = max(v.lo, a) if len(ins) == 3 and ins[1] is not None else v.lo
        g.one("Clip", ins, v.shape, min(lo, b), min(v.hi, b))
        return
    elif op in ("Floor", "Ceil", "Round", "Sign"):
        lo, hi = math.floor(v.lo) - 1, math.ceil(v.hi) + 1
    elif op == "ThresholdedRelu":
        attrs = {"alpha": g.ch.pick([1.0, 0.5, 0.0])}
        lo, hi = min(v.lo, 0.0), max(v.hi, 0.0)
    elif op == "Shrink":
        attrs = {"lambd": g.ch.pick([0.5, 0.0, 1.2]), "bias": g.ch.pick([0.0, 0.5, 1.5])}
        lo, hi = min(v.lo, 0.0) - attrs["bias"], max(v.hi, 0.0) + attrs["bias"]
    elif op == "Gelu":
        if g.ch.chance(0.5):
            attrs = {"approximate": "tanh"}
        lo, hi = -0.2, max(v.hi, 0.0) + 0.1
    else:  # LeakyRelu, Elu, Selu, HardSwish, Celu, Mish: within a small factor of the input
        if op == "LeakyRelu" and g.ch.chance(0.5):
            attrs = {"alpha": g.ch.pick([0.2, 0.01, 1.5])}
        if op == "Elu" and g.ch.chance(0.5):
            attrs = {"alpha": 0.5}
        if op == "Celu" and g.ch.chance(0.5):
            attrs = {"alpha": 2.0}
        lo, hi = min(v.lo, 0) * 2 - 2, max(v.hi, 0) * 1.1 + 1
    g.one(op, [v], v.shape, lo, hi, **attrs)


def _operand_like(g: Gen, v: Val) -> Val:
    """A second operand for an elementwise op with `v`: another pool value that broadcasts with
    it, a new graph input, or a constant, with a shape that broadcasts into v's."""
    kind = g.ch.weighted([("const", 3), ("input", 3), ("pool", 4)])
    if kind == "pool":
        u = g.pick(lambda u: u.name != v.name and _broadcastable(u.shape, v.shape)
                   and int(np.prod(_bcast(u.shape, v.shape))) <= 2 * MAX_NUMEL)
        if u is not None:
            return u
    s = g.bshape(v.shape)
    if kind == "input":
        return g.input(s)
    return g.weight(s, 1.0) if s else g.scalar(g.ch.pick([0.5, 2.0, -1.0, 3.0]))


def p_binary(g: Gen) -> None:
    a = g.pick_or_input()
    b = _operand_like(g, a)
    if g.ch.chance(0.3):
        a, b = b, a
    out = _bcast(a.shape, b.shape)
    op = g.ch.pick(["Add", "Mul", "Sub", "Div", "Max", "Min", "Pow", "Sum", "Mean", "PRelu"])
    if op == "Add" or op == "Sum":
        lo, hi = a.lo + b.lo, a.hi + b.hi
    elif op == "Sub":
        lo, hi = a.lo - b.hi, a.hi - b.lo
    elif op == "Mul":
        a, b = g.bounded(a, 100.0), g.bounded(b, 100.0)
        lo, hi = _mul_itv(a, b)
    elif op == "Div":
        a = g.bounded(a, 100.0)
        b = g.positive(b, 0.25)
        lo, hi = min(a.lo / b.lo, a.lo / b.hi), max(a.hi / b.lo, a.hi / b.hi)
    elif op == "Pow":
        a = g.positive(g.bounded(a, 10.0), 0.5)
        e = g.ch.pick([2.0, 0.5, 3.0, -1.0, None])
        if e is None:  # a tensor exponent in [-1.5, 1.5]
            b = g.const(g.rs.uniform(-1.5, 1.5, g.bshape(a.shape)).astype(np.float32), "e")
            out = _bcast(a.shape, b.shape)
            hi = max(a.hi ** 1.5, a.lo ** -1.5)
            lo = 0.0
        else:
            b = g.scalar(e)
            out = a.shape
            lo, hi = _itv(lambda x: x ** e, a.lo, a.hi)
    elif op == "PRelu":  # the slope broadcasts into X (unidirectional)
        if tuple(_bcast(a.shape, b.shape)) != tuple(a.shape):
            b = g.weight(g.bshape(a.shape), 1.0, hint="slope")
        out = a.shape
        lo, hi = min(a.lo * b.mag, a.lo, 0), max(a.hi, 0) * max(1, b.mag)
    elif op == "Mean":
        lo, hi = min(a.lo, b.lo), max(a.hi, b.hi)
    else:  # Max, Min
        lo, hi = (max(a.lo, b.lo), max(a.hi, b.hi)) if op == "Max" else (min(a.lo, b.lo), min(a.hi, b.hi))
    g.one(op, [a, b], out, lo, hi)


def _axes(g: Gen, v: Val, at_least=1) -> list[int]:
    axes = g.ch.subset(range(v.rank), at_least=at_least)
    return [a - v.rank if g.ch.chance(0.3) else a for a in axes]


def _reduce_node(g: Gen, op: str, v: Val, axes: list[int], keep: int, lo, hi) -> Val:
    out = [1 if (k in [a % v.rank for a in axes] or not axes) else d for k, d in enumerate(v.shape)] if keep else \
        [d for k, d in enumerate(v.shape) if axes and k not in [a % v.rank for a in axes]]
    as_input = g.opset >= 18 or (op == "ReduceSum" and g.opset >= 13)
    if as_input:
        ins = [v, g.ints(axes)] if axes else [v]
        return g.one(op, ins, tuple(out), lo, hi, keepdims=keep)
    return g.one(op, [v], tuple(out), lo, hi, keepdims=keep, **({"axes": axes} if axes else {}))


def p_reduce(g: Gen) -> None:
    v = g.pick_or_input(lambda u: u.rank >= 1)
    if v.rank == 0:
        v = g.input(g.shape(g.ch.pick([2, 1, 3])))
    axes = _axes(g, v, at_least=0 if g.ch.chance(0.15) else 1)
    keep = 1 if g.ch.chance(0.6) else 0
    n = int(np.prod([v.shape[a % v.rank] for a in axes])) if axes else v.numel
    op = g.ch.pick(["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceSumSquare", "ReduceL2",
                    "ReduceL1", "ReduceLogSum", "ReduceProd"])
    if op == "ReduceProd" and n > 8:
        op = "ReduceMean"
    if op in ("ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceL2", "ReduceL1", "ReduceProd", "ReduceLogSum"):
        v = g.bounded(v, 30.0)
    m = v.mag
    if op == "ReduceLogSum":
        v = g.positive(v, 0.5)
        lo, hi = math.log(n * v.lo), math.log(n * v.hi)
    elif op == "ReduceSum":
        lo, hi = n * v.lo, n * v.hi
    elif op == "ReduceSumSquare":
        lo, hi = 0.0, n * m * m
    elif op == "ReduceL1":
        lo, hi = 0.0, n * m
    elif op == "ReduceL2":
        lo, hi = 0.0, math.sqrt(n) * m
    elif op == "ReduceProd":
        lo, hi = -(max(m, 1) ** n), max(m, 1) ** n
    else:
        lo, hi = v.lo, v.hi
    r = _reduce_node(g, op, v, axes, keep, lo, hi)
    if keep and g.ch.chance(0.6):  # feed a map that broadcasts it back over the rows
        mop = g.ch.pick(["Sub", "Mul", "Div", "Add"])
        if mop == "Div":
            r = g.positive(g.bounded(r, 100.0), 0.25)
            lo, hi = min(v.lo / r.lo, v.lo / r.hi), max(v.hi / r.lo, v.hi / r.hi)
        elif mop == "Mul":
            r = g.bounded(r, 100.0)
            lo, hi = _mul_itv(v, r)
        elif mop == "Sub":
            lo, hi = v.lo - r.hi, v.hi - r.lo
        else:
            lo, hi = v.lo + r.lo, v.hi + r.hi
        g.one(mop, [v, r], v.shape, lo, hi)


def p_softmax(g: Gen) -> None:
    v = g.pick_or_input(lambda u: u.rank >= 1)
    if v.rank == 0:
        v = g.input(g.shape(2))
    axis = g.ch.between(-v.rank, v.rank - 1)
    v = g.bounded(v, 50.0)
    if g.ch.chance(0.7):
        g.one("Softmax", [v], v.shape, 0.0, 1.0, axis=axis)
    else:
        g.one("LogSoftmax", [v], v.shape, -(v.hi - v.lo) - math.log(v.shape[axis] or 1) - 1, 0.0, axis=axis)


def p_layernorm(g: Gen) -> None:
    v = g.pick_or_input(lambda u: u.rank >= 1 and u.numel > 1)
    if v.rank == 0 or v.numel <= 1:
        v = g.input(g.shape(2))
    v = g.bounded(v, 30.0)
    form = g.ch.pick(["op", "decomposed", "tf2onnx", "rms"] if g.opset >= 17 else ["decomposed", "tf2onnx", "rms"])
    eps = g.ch.pick([1e-5, 1e-3, 1e-6])
    if form == "op":
        axis = g.ch.between(-v.rank, v.rank - 1)
        norm = v.shape[axis % v.rank:]
        n = int(np.prod(norm))
        scale = g.weight(norm, 1.0, hint="gamma")
        ins = [v, scale, g.weight(norm, 0.5, hint="beta")] if g.ch.chance(0.7) else [v, scale]
        b = math.sqrt(n) * 1.0 + 0.5
        g.one("LayerNormalization", ins, v.shape, -b, b, axis=axis, epsilon=eps)
        return
    axes = [-1] if g.ch.chance(0.7) else _axes(g, v)
    red = [a % v.rank for a in axes]
    n = int(np.prod([v.shape[a] for a in red]))
    gshape = tuple(v.shape[k] if k in red else 1 for k in range(v.rank))[min(red):]
    gamma, beta = g.weight(gshape, 1.0, hint="gamma"), g.weight(gshape, 0.5, hint="beta")
    m = _reduce_node(g, "ReduceMean", v, axes, 1, v.lo, v.hi)
    b = math.sqrt(n) + 1
    if form == "rms":
        sq = g.one("Mul", [v, v], v.shape, 0.0, v.mag ** 2)
        ms = _reduce_node(g, "ReduceMean", sq, axes, 1, 0.0, v.mag ** 2)
        e = g.one("Add", [ms, g.scalar(eps)], ms.shape, eps, ms.hi + eps)
        s = g.one("Sqrt", [e], e.shape, math.sqrt(eps), math.sqrt(e.hi))
        r = g.one("Reciprocal", [s], s.shape, 1 / s.hi, 1 / s.lo)
        y = g.one("Mul", [v, r], v.shape, -b, b)
        g.one("Mul", [y, gamma], v.shape, -b, b)
        return
    if form == "decomposed":
        d = g.one("Sub", [v, m], v.shape, v.lo - v.hi, v.hi - v.lo)
        if g.ch.chance(0.5):
            sq = g.one("Pow", [d, g.scalar(2.0)], v.shape, 0.0, (v.hi - v.lo) ** 2)
        else:
            sq = g.one("Mul", [d, d], v.shape, 0.0, (v.hi - v.lo) ** 2)
        var = _reduce_node(g, "ReduceMean", sq, axes, 1, 0.0, sq.hi)
        e = g.one("Add", [var, g.scalar(eps)], var.shape, eps, var.hi + eps)
        s = g.one("Sqrt", [e], e.shape, math.sqrt(eps), math.sqrt(e.hi))
        y = g.one("Div", [d, s], v.shape, -b, b)
    else:  # tf2onnx's form: var = max(E[x²] - mean², 0), x·(r·γ) + (β - mean·r·γ)
        sq = g.one("Mul", [v, v], v.shape, 0.0, v.mag ** 2)
        ex2 = _reduce_node(g, "ReduceMean", sq, axes, 1, 0.0, v.mag ** 2)
        m2 = g.one("Mul", [m, m], m.shape, 0.0, v.mag ** 2)
        var = g.one("Sub", [ex2, m2], m.shape, -v.mag ** 2, v.mag ** 2)
        var = g.one("Max", [var, g.scalar(0.0)], m.shape, 0.0, v.mag ** 2)
        e = g.one("Add", [var, g.scalar(eps)], m.shape, eps, v.mag ** 2 + eps)
        s = g.one("Sqrt", [e], m.shape, math.sqrt(eps), math.sqrt(e.hi))
        r = g.one("Reciprocal", [s], m.shape, 1 / s.hi, 1 / s.lo)
        rg = g.one("Mul", [r, gamma], _bcast(m.shape, gamma.shape), -r.hi, r.hi)
        xr = g.one("Mul", [v, rg], v.shape, -INF, INF)
        mr = g.one("Mul", [m, rg], rg.shape, -INF, INF)
        sh = g.one("Sub", [beta, mr], _bcast(beta.shape, mr.shape), -INF, INF)
        g.one("Add", [xr, sh], _bcast(v.shape, sh.shape), -b * 3, b * 3)
        return
    y2 = g.one("Mul", [y, gamma], v.shape, -b, b)
    g.one("Add", [y2, beta], v.shape, -b - 0.5, b + 0.5)


def _factor(g: Gen, n: int, rank: int) -> list[int]:
    """A random factorisation of n into `rank` dims."""
    primes, m, p = [], n, 2
    while m > 1 and p * p <= m:
        while m % p == 0:
            primes.append(p)
            m //= p
        p += 1
    if m > 1:
        primes.append(m)
    dims = [1] * rank
    for q in primes:
        dims[g.ch.below(rank)] *= q
    return dims


def p_reshape(g: Gen) -> None:
    v = g.pick_or_input()
    kind = g.ch.pick(["Reshape", "Flatten", "Unsqueeze", "Squeeze"])
    if kind == "Flatten" and v.rank >= 1:
        axis = g.ch.between(-v.rank, v.rank)
        a = axis + v.rank if axis < 0 else axis
        outer = int(np.prod(v.shape[:a]))
        g.one("Flatten", [v], (outer, v.numel // max(outer, 1) if outer else 0), v.lo, v.hi, axis=axis)
        return
    if kind == "Unsqueeze":
        k = g.ch.between(1, 2)
        r = v.rank + k
        axes = sorted(g.ch.subset(range(r), at_least=k)[:k])
        out = list(v.shape)
        for a in axes:
            out.insert(a, 1)
        axes = [a - r if g.ch.chance(0.3) else a for a in axes]
        g.one("Unsqueeze", [v, g.ints(axes)], tuple(out), v.lo, v.hi)
        return
    if kind == "Squeeze" and 1 in v.shape:
        ones = [k for k, d in enumerate(v.shape) if d == 1]
        axes = g.ch.subset(ones, at_least=1)
        out = tuple(d for k, d in enumerate(v.shape) if k not in axes)
        if g.ch.chance(0.2):
            out, ins = tuple(d for d in v.shape if d != 1), [v]
        else:
            ins = [v, g.ints(axes)]
        g.one("Squeeze", ins, out, v.lo, v.hi)
        return
    rank = g.ch.pick([2, 1, 3, 4])
    dims = _factor(g, v.numel, rank)
    spec = list(dims)
    if g.ch.chance(0.3):
        spec[g.ch.below(rank)] = -1
    if g.ch.chance(0.2):  # 0 copies the input's dim at the same index (allowzero = 0)
        k = g.ch.below(min(rank, v.rank)) if v.rank else None
        if k is not None and v.shape[k] == dims[k] and spec[k] != -1:
            spec[k] = 0
    g.one("Reshape", [v, g.ints(spec)], tuple(dims), v.lo, v.hi)


def p_transpose(g: Gen) -> None:
    v = g.pick_or_input(lambda u: u.rank >= 2, lambda: g.shape(g.ch.pick([2, 3, 4])))
    if v.rank < 2:
        v = g.input(g.shape(g.ch.pick([2, 3])))
    perm = list(range(v.rank))
    for k in range(v.rank - 1, 0, -1):  # Fisher-Yates through the chooser (shrinks to identity)
        j = k - g.ch.below(k + 1)
        perm[k], perm[j] = perm[j], perm[k]
    if perm == list(range(v.rank)) and g.ch.chance(0.8):
        perm = perm[::-1]
    attrs = {} if perm == list(range(v.rank))[::-1] and g.ch.chance(0.3) else {"perm": perm}
    g.one("Transpose", [v], tuple(v.shape[p] for p in perm), v.lo, v.hi, **attrs)


def p_slice(g: Gen) -> None:
    v = g.pick_or_input(lambda u: u.rank >= 1 and max(u.shape) > 1)
    if v.rank == 0:
        v = g.input(g.shape(2))
    axes = g.ch.subset(range(v.rank), at_least=1)
    starts, ends, steps, out = [], [], [], list(v.shape)
    for a in axes:
        d = v.shape[a]
        step = g.ch.pick([1, 2, -1, 3, -2])
        if step > 0:
            s = g.ch.between(0, d - 1)
            e = g.ch.between(s + 1, d)
            n = (e - s + step - 1) // step
            e_spec = e if g.ch.chance(0.7) else (2 ** 62 if e == d else e - d)
        else:
            s = g.ch.between(0, d - 1)
            e = g.ch.between(-1, s - 1)  # -1: through index 0
            n = (s - e + (-step) - 1) // (-step)
            e_spec = -(2 ** 62) if e == -1 else e
        s_spec = s - d if g.ch.chance(0.3) else s
        starts.append(s_spec)
        ends.append(e_spec)
        steps.append(step)
        out[a] = n
    axes_spec = [a - v.rank if g.ch.chance(0.3) else a for a in axes]
    ins = [v, g.ints(starts), g.ints(ends), g.ints(axes_spec)]
    if any(s != 1 for s in steps) or g.ch.chance(0.5):
        ins.append(g.ints(steps))
    g.one("Slice", ins, tuple(out), v.lo, v.hi)


def p_concat(g: Gen) -> None:
    v = g.pick_or_input(lambda u: u.rank >= 1)
    if v.rank == 0:
        v = g.input(g.shape(2))
    axis = g.ch.below(v.rank)
    parts = [v]
    for _ in range(g.ch.between(1, 2)):
        kind = g.ch.pick(["same", "input", "const", "pool"])
        if kind == "same":
            parts.append(v)
            continue
        if kind == "pool":
            u = g.pick(lambda u: u.rank == v.rank and all(x == y for k, (x, y) in enumerate(zip(u.shape, v.shape))
                                                          if k != axis))
            if u is not None:
                parts.append(u)
                continue
        s = list(v.shape)
        s[axis] = g.dim(8)
        parts.append(g.input(s) if kind == "input" else g.weight(s, 1.0))
    out = list(v.shape)
    out[axis] = sum(p.shape[axis] for p in parts)
    if int(np.prod(out)) > 4 * MAX_NUMEL:
        return
    ax = axis - v.rank if g.ch.chance(0.3) else axis
    g.one("Concat", parts, tuple(out), min(p.lo for p in parts), max(p.hi for p in parts), axis=ax)


def p_split(g: Gen) -> None:
    v = g.pick_or_input(lambda u: u.rank >= 1 and max(u.shape) >= 2)
    if v.rank == 0 or max(v.shape) < 2:
        v = g.input(g.shape(2))
        if max(v.shape) < 2:
            return
    axis = g.ch.pick([k for k, d in enumerate(v.shape) if d >= 2])
    d = v.shape[axis]
    k = g.ch.between(2, min(4, d))
    cuts = sorted(g.ch.subset(range(1, d), at_least=k - 1)[: k - 1])
    sizes = [b - a for a, b in zip([0] + cuts, cuts + [d])]
    outs = []
    for s in sizes:
        sh = list(v.shape)
        sh[axis] = s
        outs.append((tuple(sh), "float32", v.lo, v.hi))
    ax = axis - v.rank if g.ch.chance(0.3) else axis
    equal = len(set(sizes)) == 1
    if equal and g.ch.chance(0.4):
        if g.opset >= 18:
            g.node("Split", [v], outs, axis=ax, num_outputs=len(sizes))
        else:
            g.node("Split", [v], outs, axis=ax)
        return
    g.node("Split", [v, g.ints(sizes)], outs, axis=ax)


def p_gather(g: Gen) -> None:
    v = g.pick_or_input(lambda u: u.rank >= 1)
    if v.rank == 0:
        v = g.input(g.shape(2))
    axis = g.ch.below(v.rank)
    d = v.shape[axis]
    ishape = g.ch.pick([(g.ch.between(1, 6),), (), (2, 3), (1,)])
    if g.ch.chance(0.4):  # indices from a graph input (dlcc computes the gather at run time)
        idx = g.input(ishape, 0, d - 1, dtype="int64", hint="idx")
        if g.ch.chance(0.5):  # negative indices count from the end
            idx_arr = g.feeds[idx.name]
            g.feeds[idx.name] = np.where(g.rs.random(idx_arr.shape) < 0.5, idx_arr - d, idx_arr).astype(np.int64)
    else:
        idx = g.const(g.rs.integers(-d, d, ishape).astype(np.int64), "idx")
    out = v.shape[:axis] + tuple(ishape) + v.shape[axis + 1:]
    ax = axis - v.rank if g.ch.chance(0.3) else axis
    g.one("Gather", [v, idx], out, v.lo, v.hi, axis=ax)


def p_expand(g: Gen) -> None:
    v = g.pick_or_input(lambda u: u.numel <= 512)
    if v.numel > 512:
        v = g.input(g.bshape(g.shape(2)) or (3,))
    target = [d if d != 1 else g.dim(10) for d in v.shape]
    target = [g.dim(6) for _ in range(g.ch.below(2))] + target
    spec = [1 if (k >= len(target) - v.rank and v.shape[k - (len(target) - v.rank)] == t and g.ch.chance(0.3)) else t
            for k, t in enumerate(target)]
    if int(np.prod(target)) > MAX_NUMEL:
        return
    g.one("Expand", [v, g.ints(spec)], tuple(target), v.lo, v.hi)


def p_pad(g: Gen) -> None:
    """Pad in each mode (wrap from opset 19), now and then cropping one element off an axis
    first (a negative pad; not with reflect, whose pads onnxruntime bounds by the kept length)."""
    v = g.pick_or_input(lambda u: u.rank >= 1)
    if v.rank == 0:
        v = g.input(g.shape(2))
    mode = g.ch.pick(["constant", "reflect", "edge"] + (["wrap"] if g.opset >= 19 else []))
    pads = []
    for d in v.shape:
        lim = d - 1 if mode == "reflect" else 3
        pads.append(g.ch.between(0, max(0, min(lim, 3))))
    for d in v.shape:
        lim = d - 1 if mode == "reflect" else 3
        pads.append(g.ch.between(0, max(0, min(lim, 3))))
    if mode != "reflect" and g.ch.chance(0.2):
        a = g.ch.between(0, v.rank - 1)
        if v.shape[a] >= 3:
            pads[a] = -1
    out = tuple(d + pads[k] + pads[k + v.rank] for k, d in enumerate(v.shape))
    ins = [v, g.ints(pads)]
    lo, hi = v.lo, v.hi
    if mode == "constant" and g.ch.chance(0.5):
        c = g.ch.pick([1.5, -0.5])
        ins.append(g.scalar(c))
        lo, hi = min(lo, c), max(hi, c)
    elif mode == "constant":
        lo, hi = min(lo, 0.0), max(hi, 0.0)
    g.one("Pad", ins, out, lo, hi, mode=mode)


def p_where(g: Gen) -> None:
    """A condition from exact values (a comparison of a graph input), selecting between operands."""
    x = g.pick(lambda u: u.exact and u.rank >= 1) or g.input(g.shape(2))
    op = g.ch.pick(["Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Equal"])
    thr = g.scalar(0.0 if op != "Equal" else float(np.round(g.feeds.get(x.name, np.zeros(1)).ravel()[0])))
    c = g.one(op, [x, thr], x.shape, 0, 1, dtype="bool")
    if g.ch.chance(0.2):
        c = g.one("Not", [c], c.shape, 0, 1, dtype="bool")
    a = g.pick_or_input()
    if not _broadcastable(a.shape, c.shape):
        a = _operand_like(g, x)
    b = g.scalar(g.ch.pick([-1.0, 0.0, -1e4]))
    out = _bcast(_bcast(c.shape, a.shape), b.shape)
    if int(np.prod(out)) > 2 * MAX_NUMEL:
        return
    ins = [c, a, b] if g.ch.chance(0.5) else [c, b, a]
    g.one("Where", ins, out, min(a.lo, b.lo), max(a.hi, b.hi))


def p_cast(g: Gen) -> None:
    """float → int → float on exact values (the int intermediate is computed by dlcc)."""
    x = g.pick(lambda u: u.exact and u.dtype == "float32") or g.input(g.shape(2), -9, 9)
    to = g.ch.pick([TensorProto.INT64, TensorProto.INT32])
    i = g.one("Cast", [x], x.shape, dtype="int64" if to == TensorProto.INT64 else "int32", to=to)
    k = g.const(np.array(g.ch.pick([2, 3, -1]), np.int64 if to == TensorProto.INT64 else np.int32), "k")
    m = g.one("Mul", [i, k], x.shape, dtype=i.dtype)
    g.one("Cast", [m], x.shape, -30 * max(abs(x.lo), abs(x.hi)), 30 * max(abs(x.lo), abs(x.hi)), to=TensorProto.FLOAT)


#: The float8 formats a Cast rounds onto from opset 19 (held_types.py), with their largest values.
_FLOAT8 = {TensorProto.FLOAT8E4M3FN: ("float8_e4m3fn", 448.0), TensorProto.FLOAT8E4M3FNUZ: ("float8_e4m3fnuz", 240.0),
           TensorProto.FLOAT8E5M2: ("float8_e5m2", 57344.0), TensorProto.FLOAT8E5M2FNUZ: ("float8_e5m2fnuz", 57344.0)}


def p_float8(g: Gen) -> None:
    """float → float8 → float on exact values, with or without saturation, inside every format's
    range (no NaN). The float8 value is exact too (a rounding both sides make alike), and is kept
    from the outputs: onnxruntime's binding returns float8 as raw bytes."""
    if g.opset < 19:
        return
    x = g.pick(lambda u: u.exact and u.mag < 200) or g.input(g.shape(), -20, 20)
    to = g.ch.pick(list(_FLOAT8))
    name, top = _FLOAT8[to]
    lo, hi = max(x.lo - abs(x.lo) / 8, -top), min(x.hi + abs(x.hi) / 8, top)
    h = g.one("Cast", [x], x.shape, lo, hi, dtype=name, to=to, saturate=int(g.ch.chance(0.5)))
    h.exact = True
    g.one("Cast", [h], x.shape, lo, hi, to=TensorProto.FLOAT)


def p_cumsum(g: Gen) -> None:
    v = g.bounded(g.pick_or_input(lambda u: u.rank >= 1))
    if v.rank == 0:
        v = g.input(g.shape(2))
    axis = g.ch.below(v.rank)
    n = v.shape[axis]
    g.one("CumSum", [v, g.ints(axis)], v.shape, n * min(v.lo, 0), n * max(v.hi, 0),
          exclusive=int(g.ch.chance(0.3)), reverse=int(g.ch.chance(0.3)))


def _chain(g: Gen, v: Val, max_len: int = 2) -> Val:
    """A short elementwise chain on v (a prologue or an epilogue)."""
    for _ in range(g.ch.between(0, max_len)):
        if g.ch.chance(0.5):
            op = g.ch.pick(["Relu", "Sigmoid", "Tanh", "Neg", "Abs"])
            lo, hi = {"Relu": (max(v.lo, 0), max(v.hi, 0)), "Sigmoid": (0, 1), "Tanh": (-1, 1),
                      "Neg": (-v.hi, -v.lo), "Abs": (0, v.mag)}[op]
            v = g.one(op, [v], v.shape, lo, hi)
        else:
            c = g.weight(g.bshape(v.shape), 1.0) if g.ch.chance(0.5) else g.scalar(g.ch.pick([0.5, 2.0]))
            op = g.ch.pick(["Add", "Mul"])
            lo, hi = (v.lo + c.lo, v.hi + c.hi) if op == "Add" else _mul_itv(v, c)
            v = g.one(op, [v, c], _bcast(v.shape, c.shape), lo, hi)
    return v


def _epilogue(g: Gen, y: Val) -> Val:
    if g.ch.chance(0.5):  # a residual add of another tensor of the output's shape
        r = g.pick(lambda u: u.shape == y.shape and u.name != y.name)
        if r is None:
            r = g.input(y.shape)
        y = g.one("Add", [y, r], y.shape, y.lo + r.lo, y.hi + r.hi)
    return _chain(g, y)


def p_matmul(g: Gen) -> None:
    a = g.pick_or_input(lambda u: 1 <= u.rank <= 4 and u.shape[-1] <= 512)
    if a.rank == 0 or a.shape[-1] > 512:
        a = g.input(g.shape(g.ch.pick([2, 3])))
    a = _chain(g, g.bounded(a, 10.0))
    K, N = a.shape[-1], g.dim(18)
    kind = g.ch.pick(["weight", "input", "transposed"])
    bshape = (K, N)
    if kind != "weight" and a.rank >= 3 and g.ch.chance(0.5):
        bshape = a.shape[:-2][-1:] + (K, N) if g.ch.chance(0.5) else (1,) + (K, N)
    scale = 1.0 / math.sqrt(K)
    if kind == "weight":
        b = g.weight(bshape, scale)
    elif kind == "input":
        b = g.input(bshape, -scale, scale)
    else:  # stored [N, K] and transposed (a fused-transpose prologue)
        t = g.weight(bshape[:-2] + (N, K), scale)
        perm = list(range(len(bshape) - 2)) + [len(bshape) - 1, len(bshape) - 2]
        b = g.one("Transpose", [t], bshape, -scale, scale, perm=perm)
    if a.rank == 1:
        out = (N,)
    else:
        batch = _bcast(a.shape[:-2], bshape[:-2])
        out = batch + (a.shape[-2], N)
    if int(np.prod(out)) > 2 * MAX_NUMEL:
        return
    bound = K * a.mag * scale
    y = g.one("MatMul", [a, b], out, -bound, bound)
    if g.ch.chance(0.6):
        bias = g.weight((N,), 0.5, hint="bias")
        y = g.one("Add", [y, bias], out, y.lo - 0.5, y.hi + 0.5)
    _epilogue(g, y)


def p_head_merge(g: Gen) -> None:
    """A MatMul whose output is split into heads, transposed with the last axis kept (an
    attention's head split or merge), and multiplied again: AStitch stores the transpose from
    the first GEMM's epilogue (planner.remaps), so the second reads a plain operand. Sometimes
    the transposed tensor has another reader, which keeps the transpose a kernel of its own."""
    S, H, D = g.dim(12), g.ch.pick([1, 2, 3, 4]), g.ch.pick([2, 4, 8, 16, 5])
    a = g.pick_or_input(lambda u: u.rank == 2 and u.shape[1] <= 512)
    if a.rank != 2 or a.shape[1] > 512:
        a = g.input((S, g.dim(12)))
    a = g.bounded(a, 10.0)
    S, K = a.shape
    scale = 1.0 / math.sqrt(K)
    bound = K * a.mag * scale
    y = g.one("MatMul", [a, g.weight((K, H * D), scale)], (S, H * D), -bound, bound)
    if g.ch.chance(0.5):
        y = g.one("Add", [y, g.weight((H * D,), 0.5, hint="bias")], y.shape, y.lo - 0.5, y.hi + 0.5)
    heads = (1, S, H, D)
    r = g.one("Reshape", [y, g.ints(list(heads))], heads, y.lo, y.hi)
    perm = g.ch.pick([[0, 2, 1, 3], [2, 1, 0, 3], [1, 2, 0, 3], [0, 1, 3, 2]])  # the last moves the last axis
    t = g.one("Transpose", [r], tuple(heads[p] for p in perm), r.lo, r.hi, perm=perm)
    if g.ch.chance(0.5):  # merged back to rows of one matrix
        t = g.one("Reshape", [t, g.ints([-1, t.shape[-1]])], (int(np.prod(t.shape[:-1])), t.shape[-1]), t.lo, t.hi)
    N = g.dim(12)
    w2 = 1.0 / math.sqrt(t.shape[-1])
    b2 = t.shape[-1] * max(abs(t.lo), abs(t.hi)) * w2
    g.one("MatMul", [t, g.weight((t.shape[-1], N), w2)], t.shape[:-1] + (N,), -b2, b2)
    if g.ch.chance(0.2):
        g.one("Neg", [t], t.shape, -t.hi, -t.lo)


def p_prenorm(g: Gen) -> None:
    """A LayerNorm (or an RMSNorm) over the last axis that only GEMMs against weights read (a pre-LN
    transformer's ln_1, ln_2, ln_f), which `lower` folds into them (ops/fold_norm.py): a MatMul
    of any rank, or a Gemm (either B layout, a bias, alpha) after a Reshape to rows, one or two of
    them; sometimes another reader too, which keeps the LayerNorm a kernel of its own."""
    if g.opset < 17:  # (LayerNormalization is an op from opset 17 on)
        return
    a = g.pick_or_input(lambda u: 2 <= u.rank <= 3 and 2 <= u.shape[-1] <= 512)
    if not (2 <= a.rank <= 3 and 2 <= a.shape[-1] <= 512):
        a = g.input((g.dim(12), g.dim(12)))
    a = g.bounded(a, 10.0)
    K = a.shape[-1]
    gamma, lim, eps = g.weight((K,), 1.0, hint="gamma"), math.sqrt(K) + 0.5, g.ch.pick([1e-5, 1e-6])
    if g.ch.chance(0.6):
        ins = [a, gamma] + ([g.weight((K,), 0.5, hint="beta")] if g.ch.chance(0.7) else [])
        y = g.one("LayerNormalization", ins, a.shape, -lim, lim, axis=-1, epsilon=eps)
    else:  # an RMSNorm as torch exports LLaMA's: x / sqrt(mean(x²) + eps) · γ
        sq = (g.one("Pow", [a, g.scalar(2.0)], a.shape, 0.0, a.mag ** 2) if g.ch.chance(0.5)
              else g.one("Mul", [a, a], a.shape, 0.0, a.mag ** 2))
        ms = _reduce_node(g, "ReduceMean", sq, [-1], 1, 0.0, a.mag ** 2)
        s = g.one("Sqrt", [g.one("Add", [ms, g.scalar(eps)], ms.shape, eps, ms.hi + eps)], ms.shape,
                  math.sqrt(eps), math.sqrt(ms.hi + eps))
        n = (g.one("Div", [a, s], a.shape, -lim, lim) if g.ch.chance(0.5)
             else g.one("Mul", [a, g.one("Reciprocal", [s], s.shape, 1 / s.hi, 1 / s.lo)], a.shape, -lim, lim))
        y = g.one("Mul", [gamma, n], a.shape, -lim, lim) if g.ch.chance(0.8) else n
    rows, scale = int(np.prod(a.shape[:-1])), 1.0 / math.sqrt(K)
    for _ in range(g.ch.pick([1, 1, 2])):
        N = g.dim(18)
        bound = K * y.mag * scale
        if g.ch.chance(0.5):
            g.one("MatMul", [y, g.weight((K, N), scale)], a.shape[:-1] + (N,), -bound, bound)
            continue
        # (always a Reshape: onnx infers a LayerNormalization's output dims only partly)
        r = g.one("Reshape", [y, g.ints([rows, K])], (rows, K), y.lo, y.hi)
        trans_b, alpha = int(g.ch.chance(0.5)), g.ch.pick([1.0, 0.5])
        gins = [r, g.weight((N, K) if trans_b else (K, N), scale)] + ([g.weight((N,), 0.5, hint="c")] if g.ch.chance(0.6) else [])
        g.one("Gemm", gins, (rows, N), -alpha * bound - 0.5, alpha * bound + 0.5, alpha=alpha, transB=trans_b)
    if g.ch.chance(0.2):
        g.one("Neg", [y], y.shape, -y.hi, -y.lo)


def p_gemm(g: Gen) -> None:
    a = g.pick_or_input(lambda u: u.rank == 2 and u.shape[1] <= 512)
    if a.rank != 2 or a.shape[1] > 512:
        a = g.input(g.shape(2))
    a = _chain(g, g.bounded(a, 10.0))
    M, K = a.shape
    N = g.dim(18)
    trans_a, trans_b = int(g.ch.chance(0.3)), int(g.ch.chance(0.5))
    if trans_a:
        a = g.one("Transpose", [a], (K, M), a.lo, a.hi)
    scale = 1.0 / math.sqrt(K)
    b = g.weight((N, K) if trans_b else (K, N), scale)
    alpha, beta = g.ch.pick([1.0, 0.5, 2.0]), g.ch.pick([1.0, 0.5, 2.0])
    ins = [a, b]
    cshape = g.ch.pick([None, (N,), (1, N), (M, 1), (M, N), ()])
    if cshape is not None:
        ins.append(g.weight(cshape, 0.5, hint="c") if cshape else g.scalar(0.25))
    bound = alpha * K * a.mag * scale + beta * 0.5
    y = g.one("Gemm", ins, (M, N), -bound, bound, alpha=alpha, beta=beta, transA=trans_a, transB=trans_b)
    _epilogue(g, y)


def _spatial_input(g: Gen, d: int) -> Val:
    v = g.pick(lambda u: u.rank == d + 2 and u.shape[1] <= 16 and all(2 <= s <= 40 for s in u.shape[2:]))
    if v is None:
        c = g.ch.pick([1, 3, 2, 4, 8, 16])
        sp = [g.ch.pick([8, 5, 7, 16, 12, 3, 1, 20]) for _ in range(d)]
        v = g.input((g.ch.pick([1, 2]), c) + tuple(sp))
    return g.bounded(v, 10.0)


def p_conv(g: Gen) -> None:
    d = g.ch.pick([2, 1])
    x = _spatial_input(g, d)
    n, c = x.shape[:2]
    sp = x.shape[2:]
    group = g.ch.pick([1, c, 2 if c % 2 == 0 else 1])
    m = group * g.ch.pick([1, 2, 4, 3])
    k = [g.ch.pick([1, 3, 2, 5]) for _ in range(d)]
    stride = [g.ch.pick([1, 2]) for _ in range(d)]
    dil = [g.ch.pick([1, 2]) if g.ch.chance(0.2) else 1 for _ in range(d)]
    pads = [g.ch.between(0, (kk - 1) * dd) for kk, dd in zip(k, dil)] * 2
    out_sp = []
    for i in range(d):
        ek = (k[i] - 1) * dil[i] + 1
        o = (sp[i] + pads[i] + pads[i + d] - ek) // stride[i] + 1
        if o < 1:
            return
        out_sp.append(o)
    fan = (c // group) * int(np.prod(k))
    scale = 1.0 / math.sqrt(fan)
    w = g.weight((m, c // group) + tuple(k), scale)
    ins = [x, w]
    if g.ch.chance(0.6):
        ins.append(g.weight((m,), 0.5, hint="bias"))
    bound = fan * x.mag * scale + 0.5
    attrs = {"kernel_shape": k, "strides": stride, "pads": pads, "dilations": dil, "group": group}
    if g.ch.chance(0.15) and all(s == 1 for s in stride) and all(dd == 1 for dd in dil):
        attrs = {"kernel_shape": k, "auto_pad": g.ch.pick(["SAME_UPPER", "SAME_LOWER"]), "group": group}
        out_sp = list(sp)
    y = g.one("Conv", ins, (n, m) + tuple(out_sp), -bound, bound, **attrs)
    if g.ch.chance(0.3):  # inference BatchNorm (fold-bn folds it into the conv)
        y = g.one("BatchNormalization", [y, g.weight((m,), 1.0, 0.5, hint="scale"), g.weight((m,), 0.5, hint="b"),
                                         g.weight((m,), 0.5, hint="mean"), g.weight((m,), 2.0, 0.5, hint="var")],
                  y.shape, -4 * bound - 2, 4 * bound + 2, epsilon=g.ch.pick([1e-5, 1e-3]))
    y = _epilogue(g, y)
    if g.ch.chance(0.4):
        _pool(g, y)


def _pool(g: Gen, x: Val) -> None:
    d = x.rank - 2
    kind = g.ch.pick(["MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"])
    if kind.startswith("Global"):
        g.one(kind, [x], x.shape[:2] + (1,) * d, x.lo, x.hi)
        return
    k = [min(g.ch.pick([2, 3, 1]), s) for s in x.shape[2:]]
    stride = [g.ch.pick([1, 2]) for _ in range(d)]
    pads = [g.ch.between(0, kk // 2) for kk in k] * 2
    out = []
    for i in range(d):
        o = (x.shape[2 + i] + pads[i] + pads[i + d] - k[i]) // stride[i] + 1
        if o < 1:
            return
        out.append(o)
    attrs = {"kernel_shape": k, "strides": stride, "pads": pads}
    lo, hi = x.lo, x.hi
    if kind == "AveragePool":
        cip = int(g.ch.chance(0.5))
        attrs["count_include_pad"] = cip
        if cip:
            lo, hi = min(lo, 0), max(hi, 0)
    g.one(kind, [x], x.shape[:2] + tuple(out), lo, hi, **attrs)


def p_unpool(g: Gen) -> None:
    """A SegNet decoder's step: MaxPool with its Indices, then MaxUnpool of the pooled values (or of
    a function of them) back to the input's shape. The pooled input is exact, since where a
    maximum sits jumps with the values. Windows may overlap, so a position may be named twice
    (the later element wins); `output_shape` is given where the pooling dropped a row."""
    x = _exact(g, lambda u: 3 <= u.rank <= 4 and all(d >= 2 for d in u.shape[2:]),
               lambda: (g.ch.pick([1, 2]), g.ch.pick([1, 3, 4])) + tuple(g.ch.between(2, 9) for _ in range(2)))
    if not 3 <= x.rank <= 4 or any(d < 2 for d in x.shape[2:]):
        return
    d = x.rank - 2
    k = [g.ch.pick([2, 3]) if s >= 3 else 2 for s in x.shape[2:]]
    stride = [g.ch.pick([kk, 2, 1]) for kk in k]
    pads = [g.ch.between(0, kk // 2) if g.ch.chance(0.3) else 0 for kk in k] * 2
    out = [(x.shape[2 + i] + pads[i] + pads[i + d] - k[i]) // stride[i] + 1 for i in range(d)]
    attrs = {"kernel_shape": k, "strides": stride, "pads": pads}
    v, idx = g.node("MaxPool", [x], [(x.shape[:2] + tuple(out), "float32", x.lo, x.hi),
                                     (x.shape[:2] + tuple(out), "int64", 0, x.numel - 1)], **attrs)
    if g.ch.chance(0.5):
        v = _chain(g, v)
    default = [(o - 1) * s + kk - pads[i] - pads[i + d] for i, (o, s, kk) in enumerate(zip(out, stride, k))]
    ins = [v, idx] + ([] if default == list(x.shape[2:]) else [g.const(np.array(x.shape, np.int64), "oshape")])
    g.one("MaxUnpool", ins, x.shape, min(v.lo, 0.0), max(v.hi, 0.0), **attrs)


def p_roi_align(g: Gen) -> None:
    """RoiAlign over a feature map (any computed value: the output is continuous in X), with
    constant ROIs inside, across and beyond the map, some on half-pixel corners, and constant
    batch indices. Where the sampling grid is adaptive and the half-pixel offset applies, every ROI
    is at least a pixel wide and high (onnxruntime refuses a grid of negative size). Not at opset
    22 on (only `more_ops` graphs have it): onnxruntime has no kernel for RoiAlign-22."""
    if g.opset >= 22:
        return
    x = g.pick_or_input(lambda u: u.rank == 4 and u.shape[0] <= 3 and all(d >= 2 for d in u.shape[2:]),
                        lambda: (g.ch.pick([1, 2]), g.ch.pick([1, 3, 4]), g.ch.between(2, 10), g.ch.between(2, 10)))
    n, _, hh, ww = x.shape
    if x.rank != 4 or min(hh, ww) < 2:
        return
    count, ratio = g.ch.between(1, 5), g.ch.pick([0, 1, 2, 3])
    ctm = g.ch.pick(["half_pixel", "output_half_pixel"]) if g.opset >= 16 else "output_half_pixel"  # (RoiAlign-10)
    scale = g.ch.pick([1.0, 0.5, 2.0, 0.25])
    corner = g.rs.uniform(-2, max(hh, ww) / scale, (count, 2))
    # (ROIs up to 1.5 maps across, or 96 pixels of the map: where the grid is adaptive, onnxruntime
    # samples every pixel an ROI covers, and 5 ROIs across a map 12,666 wide took it 40 s, seed 96)
    size = g.rs.uniform(1.0 if ratio == 0 and ctm == "half_pixel" else -1.0, 1.5 * min(max(hh, ww), 64) / scale,
                        (count, 2))
    rois = np.concatenate([corner, corner + size], 1).astype(np.float32)
    if g.ch.chance(0.5):
        rois = (np.round(rois * 2) / 2).astype(np.float32)
    batch = g.rs.integers(0, n, count).astype(np.int64)
    oh, ow = g.ch.between(1, 4), g.ch.between(1, 4)
    g.one("RoiAlign", [x, g.const(rois, "rois"), g.const(batch, "batch")], (count, x.shape[1], oh, ow),
          min(x.lo, 0.0), max(x.hi, 0.0), mode=g.ch.pick(["avg", "max"]), output_height=oh, output_width=ow,
          sampling_ratio=ratio, spatial_scale=scale, **({"coordinate_transformation_mode": ctm} if g.opset >= 16 else {}))


def p_rnn(g: Gen) -> None:
    """LSTM, GRU and the simple RNN (with each of its activations; a Relu one only where its
    states stay within a bound worked out from the weights' scale)."""
    op = g.ch.pick(["LSTM", "GRU", "RNN"])
    seq, batch, inp = g.ch.pick([3, 1, 5, 8]), g.ch.pick([1, 2, 3]), g.ch.pick([4, 3, 8, 16])
    x = g.pick(lambda u: u.rank == 3 and u.shape[0] <= 8 and u.shape[1] <= 3 and u.shape[2] <= 32)
    if x is None:
        x = g.input((seq, batch, inp))
    seq, batch, inp = x.shape
    x = g.bounded(x, 5.0)
    hid = g.ch.pick([4, 3, 8, 16, 1, 17])
    direction = g.ch.pick(["forward", "reverse", "bidirectional"])
    nd = 2 if direction == "bidirectional" else 1
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    s = 0.5
    ins = [x, g.weight((nd, gates * hid, inp), s), g.weight((nd, gates * hid, hid), s)]
    if g.ch.chance(0.7):
        ins.append(g.weight((nd, 2 * gates * hid), s, hint="b"))
    if g.ch.chance(0.4):
        while len(ins) < 4:
            ins.append(None)
        ins += [None, g.weight((nd, batch, hid), 1.0, hint="h0")]
        if op == "LSTM" and g.ch.chance(0.5):
            ins.append(g.weight((nd, batch, hid), 1.0, hint="c0"))
    attrs = {"hidden_size": hid, "direction": direction}
    if op == "GRU":
        attrs["linear_before_reset"] = int(g.ch.chance(0.5))
    lo, hi = -1.0, 1.0
    if op == "RNN":
        acts = [g.ch.pick(["Tanh", "Sigmoid", "Relu"]) for _ in range(nd)]
        bound = 1.0  # |h| after each step: |x|·inp·s + 2s (the biases) + hid·s·|h|, from |h0| <= 1
        for _ in range(seq):
            bound = 5.0 * inp * s + 2 * s + hid * s * bound
        if "Relu" in acts and bound > 1e3:
            acts = ["Tanh" if a == "Relu" else a for a in acts]
        if g.ch.chance(0.5) or acts != ["Tanh"] * nd:
            attrs["activations"] = acts
        lo, hi = (0.0 if "Tanh" not in acts else -1.0), (bound if "Relu" in acts else 1.0)
    want_y = g.ch.chance(0.7)
    outs = [((seq, nd, batch, hid), "float32", lo, hi) if want_y else None,
            ((nd, batch, hid), "float32", lo, hi)]
    if op == "LSTM" and g.ch.chance(0.3):
        outs.append(((nd, batch, hid), "float32", -seq - 1.0, seq + 1.0))
    g.node(op, ins, outs, **attrs)


def p_misc(g: Gen) -> None:
    """Layout ops real exporters also write: Tile, DepthToSpace, SpaceToDepth, Trilu, GatherElements,
    ArgMax."""
    kind = g.ch.pick(["Tile", "Trilu", "GatherElements", "ArgMax", "DepthToSpace"][: 5 if g.opset >= 14 else 1] +
                     (["GatherElements", "ArgMax", "DepthToSpace"] if g.opset < 14 else []) + ["SpaceToDepth"])
    v = g.pick_or_input(lambda u: u.rank >= 2 and u.numel <= 2048, lambda: g.shape(2, 1024))
    if v.rank < 2:
        v = g.input(g.shape(2, 1024))
    if kind == "Tile":
        reps = [g.ch.pick([1, 2, 3]) for _ in v.shape]
        g.one("Tile", [v, g.ints(reps)], tuple(d * r for d, r in zip(v.shape, reps)), v.lo, v.hi)
    elif kind == "Trilu":
        k = g.ch.pick([0, 1, -1, 2])
        g.one("Trilu", [v, g.ints(k)] if k else [v], v.shape, min(v.lo, 0), max(v.hi, 0), upper=int(g.ch.chance(0.5)))
    elif kind == "GatherElements":
        axis = g.ch.below(v.rank)
        ishape = list(v.shape)
        ishape[axis] = g.ch.between(1, 4)
        idx = g.const(g.rs.integers(-v.shape[axis], v.shape[axis], ishape).astype(np.int64), "idx")
        g.one("GatherElements", [v, idx], tuple(ishape), v.lo, v.hi, axis=axis)
    elif kind == "ArgMax":
        x = g.pick(lambda u: u.exact and u.rank >= 1) or g.input(g.shape(2))
        axis = g.ch.below(x.rank)
        keep = int(g.ch.chance(0.5))
        out = tuple(1 if k == axis else d for k, d in enumerate(x.shape)) if keep else \
            tuple(d for k, d in enumerate(x.shape) if k != axis)
        i = g.one("ArgMax", [x], out, dtype="int64", axis=axis, keepdims=keep)
        g.one("Cast", [i], out, 0, x.shape[axis], to=TensorProto.FLOAT)
    elif kind == "SpaceToDepth":  # on an NCHW tensor whose H and W the block divides (YOLOX's Focus)
        b = g.ch.pick([2, 3])
        x = (g.pick(lambda u: u.rank == 4 and u.shape[2] % b == 0 and u.shape[3] % b == 0)
             or g.input((1, g.ch.pick([1, 3]), 2 * b, 3 * b)))
        n, c, h, w = x.shape
        g.one("SpaceToDepth", [x], (n, c * b * b, h // b, w // b), x.lo, x.hi, blocksize=b)
    else:  # DepthToSpace on an NCHW tensor whose C divides by b²
        b = 2
        x = g.pick(lambda u: u.rank == 4 and u.shape[1] % 4 == 0) or g.input((1, 4 * g.ch.pick([1, 2]), 3, 5))
        n, c, h, w = x.shape
        g.one("DepthToSpace", [x], (n, c // 4, h * b, w * b), x.lo, x.hi, blocksize=b, mode=g.ch.pick(["DCR", "CRD"]))


def _exact(g: Gen, pred=lambda u: True, shape=None) -> Val:
    """A graph input or constant (float32): what a discontinuous op may read, since a computed
    value one rounding away from a threshold could land on either side in dlcc and onnxruntime."""
    return g.pick(lambda u: u.exact and pred(u)) or g.input(shape() if shape else g.shape(2), -3.0, 3.0)


def _to_float(g: Gen, v: Val, lo: float, hi: float) -> Val:
    """A bool or integer value read back as float: a Cast, or (for bool) a Where."""
    if v.dtype == "bool" and g.ch.chance(0.5):
        a = g.pick_or_input(lambda u: _broadcastable(u.shape, v.shape))
        if _broadcastable(a.shape, v.shape):
            out = _bcast(v.shape, a.shape)
            if int(np.prod(out)) <= 2 * MAX_NUMEL:
                return g.one("Where", [v, a, g.scalar(-2.0)], out, min(a.lo, -2.0), max(a.hi, -2.0))
    return g.one("Cast", [v], v.shape, lo, hi, to=TensorProto.FLOAT)


def p_logic(g: Gen) -> None:
    """And / Or / Xor of comparisons of exact values, IsNaN / IsInf of computed ones (false on the
    finite values the generator keeps, so Or-ed into a comparison), read back as float."""
    x = _exact(g, lambda u: u.rank >= 1)
    c1 = g.one(g.ch.pick(["Greater", "Less"]), [x, g.scalar(0.0)], x.shape, 0, 1, dtype="bool")
    op = g.ch.pick(["And", "Or", "Xor", "IsNaN", "IsInf"])
    if op in ("IsNaN", "IsInf"):
        v = g.pick(lambda u: u.shape == x.shape and u.name != x.name) or x
        attrs = {"detect_negative": int(g.ch.chance(0.5))} if op == "IsInf" and g.ch.chance(0.5) else {}
        c2 = g.one(op, [v], v.shape, 0, 1, dtype="bool", **attrs)
        op = "Or"
    else:
        y = _exact(g, lambda u: _broadcastable(u.shape, x.shape) and u.name != x.name, lambda: g.bshape(x.shape))
        c2 = g.one(g.ch.pick(["GreaterOrEqual", "LessOrEqual"]), [y, g.scalar(0.5)], y.shape, 0, 1, dtype="bool")
    out = _bcast(c1.shape, c2.shape)
    ins = [c1, c2] if g.ch.chance(0.5) else [c2, c1]
    _to_float(g, g.one(op, ins, out, 0, 1, dtype="bool"), 0.0, 1.0)


def p_mod(g: Gen) -> None:
    """Mod of exact values: fmod on floats, or Python's sign rule on integers (fmod=0)."""
    x = _exact(g, lambda u: u.rank >= 1 and u.mag <= 1e4)
    d = g.ch.pick([1.5, 0.75, -2.0, 3.0])
    if g.ch.chance(0.5):
        if g.ch.chance(0.5):
            dv = g.scalar(d)
        else:  # a divisor per element, |d| in [0.5, 3], either sign
            ds = g.bshape(x.shape)
            dv = g.const((np.where(g.rs.random(ds) < 0.5, -1, 1) * g.rs.uniform(0.5, 3.0, ds)).astype(np.float32), "m")
        out = _bcast(x.shape, dv.shape)
        g.one("Mod", [x, dv], out, -max(abs(dv.lo), abs(dv.hi)), max(abs(dv.lo), abs(dv.hi)), fmod=1)
        return
    it = g.ch.pick([("int64", TensorProto.INT64), ("int32", TensorProto.INT32)])
    xi = g.one("Cast", [x], x.shape, dtype=it[0], to=it[1])
    k = g.const(np.array(g.ch.pick([3, -2, 5, 7]), _NP[it[0]]), "k")
    m = g.one("Mod", [xi, k], x.shape, dtype=it[0])
    _to_float(g, m, -7.0, 7.0)


def p_bitwise(g: Gen) -> None:
    """BitwiseAnd / Or / Xor / Not (opset 18) on the 8- to 64-bit integers made from exact values
    (cast to int32, times 37; a negative one wraps into an unsigned type, as C and onnxruntime
    convert), or BitShift of their magnitudes as uint8 to uint64 by 0 to the width + 1 bits;
    read back as float."""
    x = _exact(g, lambda u: u.rank >= 1 and u.mag <= 3.0)
    xi = g.one("Cast", [x], x.shape, dtype="int32", to=TensorProto.INT32)
    xm = g.one("Mul", [xi, g.const(np.array(37, np.int32), "k")], x.shape, dtype="int32")
    if g.opset < 18 or g.ch.chance(0.15):
        u = g.one("Abs", [xm], x.shape, dtype="int32")
        ut, utp = g.ch.pick([("uint8", TensorProto.UINT8), ("uint16", TensorProto.UINT16),
                             ("uint32", TensorProto.UINT32), ("uint64", TensorProto.UINT64)])
        bits = 8 * np.dtype(_NP[ut]).itemsize
        un = g.one("Cast", [u], x.shape, dtype=ut, to=utp)
        sh = g.const(g.rs.integers(0, bits + 2, g.bshape(x.shape)).astype(_NP[ut]), "sh")
        y = g.one("BitShift", [un, sh], x.shape, dtype=ut, direction=g.ch.pick(["LEFT", "RIGHT"]))
        _to_float(g, y, 0.0, float(2 ** bits - 1))
        return
    dt, tp = g.ch.pick([("int8", TensorProto.INT8), ("int32", TensorProto.INT32), ("int64", TensorProto.INT64),
                        ("int16", TensorProto.INT16), ("uint16", TensorProto.UINT16), ("uint32", TensorProto.UINT32),
                        ("uint64", TensorProto.UINT64)])
    a = g.one("Cast", [xm], x.shape, dtype=dt, to=tp)
    op = g.ch.pick(["BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot"])
    if op == "BitwiseNot":
        y = g.one(op, [a], x.shape, dtype=dt)
    else:
        b = g.const(g.rs.integers(-128, 128, g.bshape(x.shape)).astype(_NP[dt]), "m")
        y = g.one(op, [a, b] if g.ch.chance(0.5) else [b, a], x.shape, dtype=dt)
    info = np.iinfo(_NP[dt])
    _to_float(g, y, -128.0, 127.0) if dt.startswith("int") else _to_float(g, y, 0.0, float(info.max))


def p_col2im(g: Gen) -> None:
    """Col2Im (opset 18, torch.nn.Fold) of the columns a MatMul makes: blocks of 2 or 3 with
    strides, dilations and pads, overlapping or not."""
    if g.opset < 18:
        return
    kh, kw = g.ch.pick([2, 3]), g.ch.pick([1, 2, 3])
    sh, sw, dh = g.ch.pick([1, 2]), g.ch.pick([1, 2, 3]), g.ch.pick([1, 2])
    pads = [g.ch.pick([0, 1]) for _ in range(4)]
    h, w = g.ch.pick([5, 8, 9]), g.ch.pick([4, 7, 12])
    gh = (h + pads[0] + pads[2] - dh * (kh - 1) - 1) // sh + 1
    gw = (w + pads[1] + pads[3] - (kw - 1) - 1) // sw + 1
    if gh < 1 or gw < 1:
        return
    n, c, f = g.ch.pick([1, 2]), g.ch.pick([1, 3]), g.ch.pick([4, 8])
    x = g.input((n, gh * gw, f))
    cols = g.one("MatMul", [x, g.weight((f, c * kh * kw), 0.5)], (n, gh * gw, c * kh * kw), -f, f)
    cols = g.one("Transpose", [cols], (n, c * kh * kw, gh * gw), cols.lo, cols.hi, perm=[0, 2, 1])
    k = kh * kw
    g.one("Col2Im", [cols, g.ints([h, w]), g.ints([kh, kw])], (n, c, h, w), k * cols.lo, k * cols.hi,
          strides=[sh, sw], dilations=[dh, 1], pads=pads)


def p_topk(g: Gen) -> None:
    """TopK (sorted, on exact values: no ties among uniform draws) and ArgMin."""
    x = _exact(g, lambda u: u.rank >= 1 and max(u.shape) >= 2 and u.numel <= 4096)
    axis = g.ch.below(x.rank)
    n = x.shape[axis]
    if g.ch.chance(0.3):
        keep = int(g.ch.chance(0.5))
        out = tuple(1 if k == axis else d for k, d in enumerate(x.shape)) if keep else \
            tuple(d for k, d in enumerate(x.shape) if k != axis)
        i = g.one("ArgMin", [x], out, dtype="int64", axis=axis, keepdims=keep)
        _to_float(g, i, 0.0, float(n))
        return
    k = g.ch.between(1, min(n, 5))
    out = tuple(k if j == axis else d for j, d in enumerate(x.shape))
    ax = axis - x.rank if g.ch.chance(0.3) else axis
    vals, idx = g.node("TopK", [x, g.ints([k])], [(out, "float32", x.lo, x.hi), (out, "int64", 0, n)],
                       axis=ax, largest=int(g.ch.chance(0.7)), sorted=1)
    if g.ch.chance(0.5):
        _to_float(g, idx, 0.0, float(n))


def p_gathernd(g: Gen) -> None:
    v = g.pick_or_input(lambda u: u.rank >= 1 and u.numel <= 4096)
    if v.rank == 0 or v.numel > 4096:
        v = g.input(g.shape(g.ch.pick([2, 3])))
    last = g.ch.between(1, v.rank)
    lead = [g.ch.between(1, 4) for _ in range(g.ch.pick([1, 0, 2]))]
    cols = [g.rs.integers(-v.shape[j], v.shape[j], lead or [1]) for j in range(last)]
    idx = g.const(np.stack(cols, -1).reshape(tuple(lead) + (last,)).astype(np.int64), "idx")
    out = tuple(lead) + v.shape[last:]
    g.one("GatherND", [v, idx], out, v.lo, v.hi)


def p_convtranspose(g: Gen) -> None:
    d = g.ch.pick([2, 1])
    x = _spatial_input(g, d)
    n, c = x.shape[:2]
    group = g.ch.pick([1, c, 2 if c % 2 == 0 else 1])
    mg = g.ch.pick([1, 2, 3])
    k = [g.ch.pick([1, 2, 3, 4]) for _ in range(d)]
    stride = [g.ch.pick([1, 2]) for _ in range(d)]
    pads = [g.ch.between(0, kk - 1) for kk in k] * 2
    opad = [g.ch.between(0, s - 1) if g.ch.chance(0.3) else 0 for s in stride]
    out_sp = []
    for i in range(d):
        o = (x.shape[2 + i] - 1) * stride[i] - pads[i] - pads[i + d] + k[i] + opad[i]
        if o < 1:
            return
        out_sp.append(o)
    fan = (c // group) * int(np.prod(k))
    scale = 1.0 / math.sqrt(fan)
    w = g.weight((c, mg) + tuple(k), scale)
    ins = [x, w] + ([g.weight((mg * group,), 0.5, hint="bias")] if g.ch.chance(0.5) else [])
    bound = fan * x.mag * scale + 0.5
    attrs = {"kernel_shape": k, "strides": stride, "pads": pads, "group": group}
    if any(opad):
        attrs["output_padding"] = opad
    y = g.one("ConvTranspose", ins, (n, mg * group) + tuple(out_sp), -bound, bound, **attrs)
    _epilogue(g, y)


def p_norm(g: Gen) -> None:
    """InstanceNormalization and LRN on NC... tensors (instance norm on exact values, whose
    spatial variance is not a rounding residue)."""
    if g.ch.chance(0.5):
        x = _exact(g, lambda u: u.rank >= 3 and int(np.prod(u.shape[2:])) >= 2 and u.numel <= 4096,
                   lambda: (g.ch.pick([1, 2]), g.ch.pick([1, 3, 4]), g.ch.pick([5, 8, 17])))
        c, sp = x.shape[1], int(np.prod(x.shape[2:]))
        b = math.sqrt(sp) + 0.5
        g.one("InstanceNormalization", [x, g.weight((c,), 1.0, hint="scale"), g.weight((c,), 0.5, hint="b")],
              x.shape, -b, b, epsilon=g.ch.pick([1e-5, 1e-3]))
        return
    x = _spatial_input(g, 2)
    size = g.ch.pick([1, 3, 5])
    g.one("LRN", [x], x.shape, -x.mag, x.mag, size=size, alpha=g.ch.pick([1e-4, 0.01]),
          beta=g.ch.pick([0.75, 0.5]), bias=g.ch.pick([1.0, 2.0]))


def p_resize(g: Gen) -> None:
    """Resize of an NCHW (or NCW) tensor by whole or half factors: nearest, linear or cubic, with
    the coordinate rules exporters use; from opset 18 also `axes`, the antialias filters and
    keep_aspect_ratio_policy, and tf2onnx's tf_crop_and_resize with its roi and extrapolation
    value. (Within what onnxruntime runs: cubic only on 4-D inputs, and without antialias only
    growing; antialias on linear and cubic only.)"""
    d = g.ch.pick([2, 1])
    x = _spatial_input(g, d)
    scales = [1.0, 1.0] + [g.ch.pick([2.0, 3.0, 0.5]) if s % 2 == 0 else g.ch.pick([2.0, 3.0])
                           for s in x.shape[2:]]
    out = x.shape[:2] + tuple(int(math.floor(s * f)) for s, f in zip(x.shape[2:], scales[2:]))
    if int(np.prod(out)) > 2 * MAX_NUMEL:
        return
    antialias = g.opset >= 18 and g.ch.chance(0.25)
    mode = g.ch.pick(["linear", "cubic"] if antialias and d == 2 else ["linear"] if antialias else ["nearest", "linear"])
    if mode == "linear" and not antialias and d == 2 and min(scales) >= 1 and g.ch.chance(0.4):
        mode = "cubic"
    ctms = ["asymmetric", "half_pixel", "align_corners", "pytorch_half_pixel", "tf_crop_and_resize"]
    ctm = g.ch.pick(ctms[:4] if antialias else ctms + (["half_pixel_symmetric"] if g.opset >= 19 else []))
    attrs = {"mode": mode, "coordinate_transformation_mode": ctm}
    if antialias:
        attrs["antialias"] = 1
    if mode == "cubic" and g.ch.chance(0.5):
        attrs.update(exclude_outside=1, cubic_coeff_a=-0.5)
    elif antialias and g.ch.chance(0.3):
        attrs["exclude_outside"] = 1
    if mode == "nearest":
        attrs["nearest_mode"] = g.ch.pick(["round_prefer_floor", "floor", "round_prefer_ceil", "ceil"])
    spatial = list(range(2, 2 + d))
    axes = spatial if g.opset >= 18 and g.ch.chance(0.3) else list(range(2 + d))
    if axes == spatial:
        attrs["axes"] = [a - 2 - d if g.ch.chance(0.5) else a for a in axes]  # negative now and then
    roi = None
    if ctm == "tf_crop_and_resize":
        starts = [0.0 if a < 2 else g.ch.pick([0.0, 0.1, 0.25, -0.2]) for a in axes]
        ends = [1.0 if a < 2 else g.ch.pick([1.0, 0.9, 0.6, 1.3]) for a in axes]
        roi = g.const(np.array(starts + ends, np.float32), "roi")
        attrs["extrapolation_value"] = g.ch.pick([0.0, -1.5])
    if g.ch.chance(0.5):
        ins = [x, roi, g.const(np.array([scales[a] for a in axes], np.float32), "scales")]
    else:
        ins = [x, roi, None, g.ints([out[a] for a in axes])]
        if len(axes) == d and d == 2 and g.ch.chance(0.3):
            # one scale for both spatial axes: sizes that ask for more along one get the smaller
            # (in float32 and rounding halves up, as onnxruntime sizes the output). onnxruntime 1.32
            # applies the policy to the axes as written, so a negative one escapes it: positive here.
            attrs.update(keep_aspect_ratio_policy="not_larger", axes=spatial)
            sc = min(np.float32(out[a]) / np.float32(x.shape[a]) for a in axes)
            out = x.shape[:2] + tuple(int(math.floor(sc * np.float32(x.shape[a]) + 0.5)) for a in axes)
    lo, hi = x.lo, x.hi
    if "extrapolation_value" in attrs:
        lo, hi = min(lo, attrs["extrapolation_value"]), max(hi, attrs["extrapolation_value"])
    g.one("Resize", ins, out, lo, hi, **attrs)


def p_alias(g: Gen) -> None:
    """Identity, and inference Dropout (with its all-true mask output now and then)."""
    v = g.pick_or_input()
    if g.ch.chance(0.5):
        g.one("Identity", [v], v.shape, v.lo, v.hi, dtype=v.dtype)
        return
    ins = [v] + ([g.scalar(g.ch.pick([0.1, 0.5]))] if g.ch.chance(0.5) else [])
    outs = [(v.shape, "float32", v.lo, v.hi)] + ([(v.shape, "bool", 0, 1)] if g.ch.chance(0.4) else [])
    g.node("Dropout", ins, outs)


#: (pattern, weight): elementwise and reductions most, since they are what AStitch rewrites.
def p_if(g: Gen) -> None:
    """An If whose branches each compute from an outer value with a local constant of the same
    name in both (control_flow.py renames them apart). Its condition is a constant (the taken
    branch is inlined) or compares a ReduceMax of an input, which is exact, with a threshold
    among the input's values (both branches run, Where selects): a rounded condition could
    flip between dlcc and onnxruntime and make a correct program look wrong."""
    a = g.pick_or_input(lambda u: u.rank >= 1)
    if g.ch.chance(0.3):
        cond = g.const(np.array(g.ch.chance(0.5)), "cond")
    else:
        x = g.pick(lambda u: u.exact and u.rank >= 1 and u.name in g.feeds) or g.input(g.shape(2))
        vals = np.sort(g.feeds[x.name].ravel())
        thr = float(vals[g.ch.pick([0, len(vals) // 2, len(vals) - 1])])
        m = g.one("ReduceMax", [x], (), x.lo, x.hi, keepdims=0)
        cond = g.one(g.ch.pick(["Greater", "GreaterOrEqual", "Less"]), [m, g.scalar(thr)], (), 0, 1, dtype="bool")
    local, out = g.name("k"), g.name("br")
    k_then, k_else = g.ch.pick([0.5, 2.0, -1.0]), g.ch.pick([0.25, 3.0])
    first = g.ch.pick(["Tanh", "Neg", "Relu"])
    lo1, hi1 = {"Tanh": (-1.0, 1.0), "Neg": (-a.hi, -a.lo), "Relu": (0.0, max(a.hi, 0.0))}[first]

    def branch(name, op, k, lo, hi):
        nodes = ([helper.make_node(op, [a.name], [local + "_t"])] if op else []) + [
            helper.make_node("Mul", [local + "_t" if op else a.name, local], [out])]
        return (helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, list(a.shape))],
                                  [numpy_helper.from_array(np.array(k, np.float32), local)]),
                sorted((lo * k, hi * k)))

    then, (tlo, thi) = branch("then", first, k_then, lo1, hi1)
    els, (elo, ehi) = branch("else", None, k_else, a.lo, a.hi)
    g.node("If", [cond], [(a.shape, "float32", min(tlo, elo), max(thi, ehi))], then_branch=then, else_branch=els)


def p_scatter(g: Gen) -> None:
    """ScatterElements or ScatterND of a pool value with constant indices (some negative). Without
    a reduction the targets are distinct, since which of two updates of one element lands is the
    spec's to leave open; with add, max or min (opsets 16 and 18) they may repeat."""
    v = g.pick_or_input(lambda u: u.rank >= 1 and u.numel <= 4096)
    if v.rank == 0 or v.numel > 4096:
        v = g.input(g.shape(2))
    reds = ["none"] + (["add"] if g.opset >= 16 else []) + (["max", "min"] if g.opset >= 18 else [])
    red = g.ch.pick(reds)
    attrs = {} if red == "none" else {"reduction": red}
    if g.ch.chance(0.5):
        axis = g.ch.below(v.rank)
        ishape = tuple(g.ch.between(1, d) for d in v.shape)
        n = v.shape[axis]
        if red == "none":  # a random permutation along the axis, cut to the indices' length
            full = ishape[:axis] + (n,) + ishape[axis + 1:]
            idx = np.argsort(g.rs.random(full), axis=axis).take(range(ishape[axis]), axis=axis)
        else:
            idx = g.rs.integers(0, n, ishape)
        idx = np.where(g.rs.random(ishape) < 0.3, idx - n, idx).astype(np.int64)
        count, op = ishape[axis], "ScatterElements"
        attrs["axis"] = axis - v.rank if g.ch.chance(0.3) else axis
    else:
        k = g.ch.between(1, v.rank)
        cells = int(np.prod(v.shape[:k]))
        lead = g.ch.between(1, min(4, cells))
        flat = g.rs.choice(cells, lead, replace=red != "none")
        idx = np.stack(np.unravel_index(flat, v.shape[:k]), -1).astype(np.int64)
        idx = np.where(g.rs.random(idx.shape) < 0.3, idx - np.array(v.shape[:k]), idx)
        ishape, count, op = (lead,) + tuple(v.shape[k:]), lead, "ScatterND"
    u = g.input(ishape, hint="upd") if g.ch.chance(0.5) else g.weight(ishape, 1.0, hint="upd")
    if red == "add":
        lo, hi = v.lo + count * min(u.lo, 0.0), v.hi + count * max(u.hi, 0.0)
    else:
        lo, hi = min(v.lo, u.lo), max(v.hi, u.hi)
    g.one(op, [v, g.const(idx, "idx"), u], v.shape, lo, hi, **attrs)


def p_scan(g: Gen) -> None:
    """A Scan over a pool value's leading axis (at most 6 steps, either direction): a running
    state += tanh(slice), returned after the last step and stacked as the scan output (loops.py
    unrolls it). Its body's names are the graph's style too (escaped when they reach source)."""
    v = g.pick_or_input(lambda u: u.rank >= 2 and u.shape[0] <= 6)
    if v.rank < 2 or v.shape[0] > 6:
        v = g.input((g.ch.between(1, 5),) + g.shape(g.ch.pick([1, 2])))
    steps, inner = v.shape[0], tuple(v.shape[1:])
    s0 = g.pick(lambda u: u.shape == inner) or g.weight(inner, 1.0, hint="s0")
    s, x, t, s2, o = (g.name(h) for h in ("sin", "xt", "th", "sout", "so"))
    f = TensorProto.FLOAT
    body = helper.make_graph(
        [helper.make_node("Tanh", [x], [t]), helper.make_node("Add", [s, t], [s2]), helper.make_node("Identity", [s2], [o])],
        g.name("body"), [helper.make_tensor_value_info(s, f, list(inner)), helper.make_tensor_value_info(x, f, list(inner))],
        [helper.make_tensor_value_info(s2, f, list(inner)), helper.make_tensor_value_info(o, f, list(inner))])
    lo, hi = s0.lo - steps, s0.hi + steps
    g.node("Scan", [s0, v], [(inner, "float32", lo, hi), ((steps,) + inner, "float32", lo, hi)], body=body,
           num_scan_inputs=1, scan_input_directions=[int(g.ch.chance(0.3))], scan_output_directions=[int(g.ch.chance(0.3))])


def p_dft(g: Gen) -> None:
    """A DFT (opset 17 on) along the last axis of a pool value made [..., N, 1]: the full complex
    spectrum or the onesided one (spectral.py makes it a MatMul with a Fourier basis)."""
    if g.opset < 17:
        return
    v = g.bounded(g.pick_or_input(lambda u: 1 <= u.rank <= 3 and 2 <= u.shape[-1] <= 64))
    if v.rank == 0 or not 2 <= v.shape[-1] <= 64:  # (a long row's basis is past spectral.py's limit)
        v = g.input((g.ch.pick([1, 2, 3]), g.ch.pick([8, 17, 32, 64])))
    n = v.shape[-1]
    col = g.one("Unsqueeze", [v, g.ints([-1])], v.shape + (1,), v.lo, v.hi)
    onesided = int(g.ch.chance(0.5))
    bins = n // 2 + 1 if onesided else n
    ins, attrs = [col], {"onesided": onesided}
    if g.opset >= 20:
        ins += [None, g.ints(-2)]
    else:
        attrs["axis"] = col.rank - 2
    g.one("DFT", ins, v.shape[:-1] + (bins, 2), -n * v.mag, n * v.mag, **attrs)


# ------------------------------------------------------------------------------------------------
# Extreme constants (`extremes=True`): the values real exporters write at float32's edges.
# ------------------------------------------------------------------------------------------------
FLT_MAX = float(np.finfo(np.float32).max)
#: Masking constants as exporters write them: torch's SDPA (-inf), Hugging Face's finfo.min, the
#: TF/Keras -1e9, one just past float16's largest, and BERT's classic -1e4.
MASK_FILLS = [-INF, -FLT_MAX, -1e9, -131072.0, -1e4]


def _mask_input(g: Gen, shape: tuple, keep_first: bool) -> tuple[Val, np.ndarray]:
    """An attention-mask graph input (bool, int64 or float 0/1), 1 where a key is kept. With
    `keep_first` every row keeps its first key (a class token), so no row is masked whole."""
    keep = g.rs.random(shape) < 0.6
    if keep_first and shape:
        keep[..., 0] = True
    dtype = g.ch.pick(["bool", "int64", "float32"])
    v = g.input(shape, 0, 1, dtype=dtype, hint="mask")
    g.feeds[v.name] = keep.astype(_NP[dtype])
    return v, keep


def _additive_mask(g: Gen, m: Val, fill: float) -> Val:
    """0 where kept and `fill` where masked, in one of the exporters' forms."""
    if m.dtype == "bool":
        return g.one("Where", [m, g.scalar(0.0), g.scalar(fill)], m.shape, fill, 0.0)
    mf = m if m.dtype == "float32" else g.one("Cast", [m], m.shape, 0, 1, to=TensorProto.FLOAT)
    inv = g.one("Sub", [g.scalar(1.0), mf], m.shape, 0.0, 1.0)
    return g.one("Mul", [inv, g.scalar(fill)], m.shape, fill, 0.0)


def _masked_scores(g: Gen, kind: str) -> None:
    """Scores with a mask added ("mask") or selected with Where ("select"), then what reads them."""
    s = g.pick(lambda u: u.rank >= 2 and u.shape[-1] >= 2) or g.input(g.shape(g.ch.pick([2, 3, 4])))
    if s.rank < 2 or s.shape[-1] < 2:
        return
    s = g.bounded(s, 30.0)
    fill = g.ch.pick(MASK_FILLS if kind == "mask" else [-INF, -FLT_MAX, -1e9])
    keep_first = fill == -INF or g.ch.chance(0.6)  # a row masked whole is finite only for finite fills
    mshape = tuple(1 if (i < s.rank - 1 and g.ch.chance(0.6)) else d for i, d in enumerate(s.shape))
    m, _ = _mask_input(g, mshape, keep_first)
    if kind == "mask":
        if fill == -INF and m.dtype != "bool":  # (1 - m) * -inf is NaN where kept: torch writes Where
            m = g.one("Cast", [m], m.shape, 0, 1, dtype="bool", to=TensorProto.BOOL)
        t = g.one("Add", [s, _additive_mask(g, m, fill)], s.shape, s.lo + fill, s.hi)
    else:
        if m.dtype != "bool":
            m = g.one("Cast", [m], m.shape, 0, 1, dtype="bool", to=TensorProto.BOOL)
        t = g.one("Where", [m, s, g.scalar(fill)], s.shape, fill, s.hi)
    use = g.ch.pick(["Softmax", "Softmax", "LogSoftmax", "ReduceMax", "written-out"])
    if use == "LogSoftmax" and fill == -INF:
        use = "Softmax"
    g.pool.remove(t)
    if use == "Softmax":
        g.one("Softmax", [t], s.shape, 0.0, 1.0, axis=-1)
    elif use == "written-out":  # exp(t - max t) / sum, as older exporters write a Softmax
        mx = _reduce_node(g, "ReduceMax", t, [s.rank - 1], 1, s.lo if keep_first else fill, s.hi)
        d = g.one("Sub", [t, mx], s.shape, fill, s.hi - s.lo)
        g.pool.remove(mx)
        g.pool.remove(d)
        e = g.one("Exp", [d], s.shape, 0.0, 1.0)
        tot = _reduce_node(g, "ReduceSum", e, [s.rank - 1], 1, 1.0, float(s.shape[-1]))  # the max gives exp(0)
        g.one("Div", [e, tot], s.shape, 0.0, 1.0)
    elif use == "LogSoftmax":  # masked keys give about `fill`: kept whole by the next bounded op
        g.one("LogSoftmax", [t], s.shape, fill, 0.0, axis=-1)
    else:
        _reduce_node(g, "ReduceMax", t, [s.rank - 1], 1, s.lo if keep_first else min(s.lo, fill), s.hi)


def _pad_pool(g: Gen) -> None:
    """MaxPool over padding of -inf, float32's lowest or -1e9 (TF's SAME max pooling), every
    window holding at least one real element (pads < kernel), so its output is x's."""
    x = _spatial_input(g, g.ch.pick([2, 1]))
    d = x.rank - 2
    k = [min(g.ch.pick([2, 3]), sz) for sz in x.shape[2:]]
    pads = [0, 0] + [g.ch.between(0, kk - 1) for kk in k] + [0, 0] + [g.ch.between(0, kk - 1) for kk in k]
    fill = g.ch.pick([-INF, -FLT_MAX, -1e9])
    pshape = tuple(sz + pads[i] + pads[i + x.rank] for i, sz in enumerate(x.shape))
    xp = g.one("Pad", [x, g.ints(pads), g.scalar(fill)], pshape, fill, x.hi, mode="constant")
    g.pool.remove(xp)
    out = tuple(pshape[2 + i] - k[i] + 1 for i in range(d))
    g.one("MaxPool", [xp], x.shape[:2] + out, x.lo, x.hi, kernel_shape=k)


def _clamp(g: Gen) -> None:
    """A clamp to float32's limits (or -inf): a no-op a half-precision plan must not take for a bound."""
    s = g.pick_or_input()
    op = g.ch.pick(["Max", "Min", "Clip"])
    if op == "Clip":
        lo_c = g.scalar(g.ch.pick([-FLT_MAX, -INF]))
        g.one("Clip", [s, lo_c, g.scalar(FLT_MAX)], s.shape, s.lo, s.hi)
    else:
        g.one(op, [s, g.scalar(-FLT_MAX if op == "Max" else FLT_MAX)], s.shape, s.lo, s.hi)


def _scale_then_saturate(g: Gen) -> None:
    """A scale past float16's largest, then an op whose output is bounded (Tanh, Sigmoid, a Clip
    to ±3, Softmax): the scaled value stays float32 at fp16 up to that op."""
    s = g.bounded(g.pick_or_input(), 30.0)
    c = g.ch.pick([1e5, -7e4, 2e6])
    big = g.one("Mul", [s, g.scalar(c)], s.shape, *_mul_itv(s, Val("c", (), lo=c, hi=c)))
    g.pool.remove(big)
    sat = g.ch.pick(["Tanh", "Sigmoid", "Clip", "Softmax"])
    if sat == "Clip":
        g.one("Clip", [big, g.scalar(-3.0), g.scalar(3.0)], s.shape, -3.0, 3.0)
    elif sat == "Softmax" and s.rank:
        g.one("Softmax", [big], s.shape, 0.0, 1.0, axis=-1)
    else:
        sat = "Sigmoid" if sat == "Softmax" else sat
        g.one(sat, [big], s.shape, *((-1.0, 1.0) if sat == "Tanh" else (0.0, 1.0)))


def p_extreme(g: Gen) -> None:
    """Constants at float32's edges, used the way models use them: masks of -inf, finfo.min or
    -1e9 added to scores or selected with Where before a Softmax or a max; a MaxPool over padding
    of float32's lowest; clamps to float32's limits (no-ops); and scales past float16's largest
    before a saturating op. The extreme intermediate leaves the pool, as in a model only the
    Softmax or the pool reads it, so later patterns see bounded values."""
    kind = g.ch.weighted([("mask", 5), ("select", 3), ("pad_pool", 2), ("clamp", 2), ("scale", 2)])
    if kind in ("mask", "select"):
        _masked_scores(g, kind)
    elif kind == "pad_pool":
        _pad_pool(g)
    elif kind == "clamp":
        _clamp(g)
    else:
        _scale_then_saturate(g)


PATTERNS = [
    (p_unary, 14), (p_binary, 14), (p_reduce, 10), (p_softmax, 4), (p_layernorm, 5), (p_reshape, 6),
    (p_transpose, 5), (p_slice, 4), (p_concat, 4), (p_split, 3), (p_gather, 3), (p_expand, 2), (p_pad, 2),
    (p_where, 2), (p_cast, 1), (p_cumsum, 1), (p_matmul, 6), (p_gemm, 3), (p_conv, 4), (p_rnn, 2),
    (p_misc, 2), (p_logic, 1), (p_mod, 1), (p_topk, 1), (p_gathernd, 1), (p_convtranspose, 1), (p_norm, 1),
    (p_resize, 1), (p_alias, 1), (p_head_merge, 4), (p_prenorm, 3), (p_if, 1), (p_scatter, 1), (p_scan, 1),
    (p_dft, 1), (p_bitwise, 2), (p_col2im, 1), (p_unpool, 1), (p_roi_align, 1), (p_float8, 3),
]
#: Added to PATTERNS with `extremes=True` (scripts/fuzz.py --extremes); without it the patterns, and so
#: every seed's graph, are what they were.
EXTREME_PATTERNS = [(p_extreme, 20)]


def build(ch: Chooser, seed: int, max_patterns: int = 8, extremes: bool = False,
          more_ops: bool = False) -> tuple[onnx.ModelProto, dict, list[str]]:
    """The model and its feeds, from the chooser's answers (no check, no reference run)."""
    table = PATTERNS + (EXTREME_PATTERNS if extremes else [])
    opsets = [17, 18, 13, 20]
    if more_ops:
        from .graphgen_more import MORE_OPSETS, MORE_PATTERNS

        table, opsets = table + MORE_PATTERNS, MORE_OPSETS
    opset = ch.pick(opsets)
    g = Gen(ch, np.random.default_rng(seed), opset)
    g.input(g.shape(), hint="x")
    if g.ch.chance(0.3):
        g.input(g.shape(), hint="y")
    count = 0
    while count < max_patterns and (count == 0 or g.ch.chance(0.85)):
        pat = g.ch.weighted(table)
        before = len(g.nodes)
        pat(g)
        if len(g.nodes) > before:
            count += 1
    outs = _pick_outputs(g)
    graph = helper.make_graph(g.nodes, "fuzz", g.inputs,
                              [helper.make_tensor_value_info(v.name, _TP[v.dtype], v.shape) for v in outs],
                              initializer=g.inits)
    ops = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=ops, producer_name="dlcc-fuzz",
                              ir_version=max(8, helper.find_min_ir_version_for(ops)))
    _check_shapes(model, {v.name: v.shape for v in g.pool})
    return model, g.feeds, [n.op_type for n in g.nodes]


def _pick_outputs(g: Gen) -> list[Val]:
    """The last value computed, and some earlier ones (an output that is also read later)."""
    computed = [v for v in g.pool if not v.exact]
    if not computed:  # nothing was added: one Identity keeps the graph meaningful
        v = g.pool[0]
        computed = [g.one("Identity", [v], v.shape, v.lo, v.hi, dtype=v.dtype)]
    outs = [computed[-1]]
    for v in computed[:-1]:
        if g.ch.chance(0.15) and v.name not in [o.name for o in outs]:
            outs.append(v)
    return outs


def check_model(model: onnx.ModelProto) -> None:
    """onnx's checker with strict shape inference; raises GeneratorBug with onnx's reason."""
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as e:  # onnx raises several types (ValidationError, InferenceError)
        raise GeneratorBug(f"onnx rejects the generated graph: {e}") from None


def reference(model: onnx.ModelProto, feeds: dict) -> dict:
    """onnxruntime's outputs (CPU, all graph optimisations off: the plain semantics)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    return dict(zip(names, sess.run(names, feeds)))


def generate(seed: int, replay: list[int] | None = None, max_patterns: int = 8, extremes: bool = False,
             half: bool | str = False, more_ops: bool = False) -> Case:
    """One valid model with a finite reference. `replay` rebuilds from recorded choices (shrink.py);
    without it, the choices come from `seed`, which also seeds the values. `extremes` adds
    p_extreme (float32's edges: -inf and finfo.min masks, ...) to the patterns; `half` converts
    the graph into a float16 model (to_float16; True is "fp16"), or with "bf16" into a bfloat16
    one (the same, then to_bfloat16); `more_ops` adds graphgen_more's patterns (quantization,
    Einsum, GridSample, Loop, sequences, opset 23's Attention, ...) and opsets 21 and 23."""
    ch = Chooser(seed, replay)
    model, feeds, ops = build(ch, seed, max_patterns, extremes, more_ops)
    check_model(model)
    if half:
        model, feeds = to_float16(model, feeds, ch, bfloat16=half == "bf16")
        ops = [n.op_type for n in model.graph.node]
        refs = reference_widened(model, feeds)
    else:
        refs = reference(model, feeds)
    for name, r in refs.items():
        if r.dtype.kind == "f" and not np.all(np.isfinite(r)):
            raise InvalidCase(f"onnxruntime's output {name!r} is not finite")
    return Case(model, feeds, refs, seed, ch.record, ops)


def to_float16(model: onnx.ModelProto, feeds: dict, ch: Chooser, bfloat16: bool = False
               ) -> tuple[onnx.ModelProto, dict]:
    """The graph as a float16 model, the way users make one: onnxconverter-common's
    convert_float_to_float16, which stores every float tensor in float16, clamps constants to
    [1e-7, 1e4] in magnitude and keeps the ops of its block list in float32 between Casts. Half
    the graphs keep float32 inputs and outputs (_float32_io); the others take float16 feeds.
    With `bfloat16`, every float16 in the result is then bfloat16 instead (to_bfloat16): no
    converter makes bfloat16 models, but exporters do (torch's, of a model in bfloat16).
    A graph the converter fails on, or whose half model onnx rejects, is an InvalidCase
    (neither dlcc's failure nor the generator's)."""
    import warnings

    from onnxconverter_common import float16

    keep_io = ch.chance(0.5)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "the float32 number ... will be truncated to 1e-07"
            # (with every value's type inferred first, the converter puts its Casts where they belong)
            m = float16.convert_float_to_float16(onnx.shape_inference.infer_shapes(model), keep_io_types=False)
            del m.graph.value_info[:]  # (the converter retypes some Casts' outputs there; the checker infers them)
        if keep_io:
            _float32_io(m)
        if bfloat16:
            _float32_where_no_bfloat16(m)
            to_bfloat16(m.graph)
        onnx.checker.check_model(m, full_check=True)
    except Exception as e:  # the converter's own failures (it raises AttributeError on some graphs)
        raise InvalidCase(f"onnxconverter-common cannot make this a valid {'bfloat16' if bfloat16 else 'float16'} "
                          f"model: {type(e).__name__}: {e}") from None
    # float32 feeds hold half values, so the Cast after them is exact: discontinuous ops (Floor, a
    # Cast to int, comparisons) read exact values only, and a step taken on a rounded value would be
    # the precisions' legitimate difference, not a bug
    half = np.dtype(ml_dtypes.bfloat16) if bfloat16 else np.dtype(np.float16)
    feeds = {k: v.astype(half) if v.dtype == np.float32 else v for k, v in feeds.items()}
    if keep_io:
        feeds = {k: v.astype(np.float32) if v.dtype == half else v for k, v in feeds.items()}
    return m, feeds


def _float32_where_no_bfloat16(m: onnx.ModelProto) -> None:
    """Each node of the float16 model `m` whose schema, at the model's opset, takes float16 but not
    bfloat16 where it reads or writes float16 (Cosh, Selu, MaxPool before opset 22 ...) computes
    in float32 between Casts, in place, as an exporter keeps such an op: to_bfloat16 then leaves
    it float32. Nodes whose attributes carry a type or a value, and subgraphs, are left alone
    (the checker then refuses the model, an InvalidCase)."""
    inferred = onnx.shape_inference.infer_shapes(m)
    g = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in list(g.input) + list(g.output) + list(g.value_info)}
    types.update({t.name: t.data_type for t in g.initializer})
    opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 1)
    nodes = []
    for n in m.graph.node:
        half_in = [i for i, x in enumerate(n.input) if x and types.get(x) == TensorProto.FLOAT16]
        half_out = [i for i, y in enumerate(n.output) if y and types.get(y) == TensorProto.FLOAT16]
        if not (half_in or half_out) or n.domain not in ("", "ai.onnx") or n.op_type == "Cast" or any(
                a.type in (onnx.AttributeProto.TENSOR, onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                or a.name in ("to", "dtype") for a in n.attribute) or _takes_bfloat16(n.op_type, opset):
            nodes.append(n)
            continue
        for i in half_in:
            x = n.input[i]
            nodes.append(helper.make_node("Cast", [x], [f"{x}/float32/{len(nodes)}"], to=TensorProto.FLOAT))
            n.input[i] = nodes[-1].output[0]
        nodes.append(n)
        for i in half_out:
            y = n.output[i]
            n.output[i] = f"{y}/float32"
            nodes.append(helper.make_node("Cast", [n.output[i]], [y], to=TensorProto.FLOAT16))
    del m.graph.node[:]
    m.graph.node.extend(nodes)


def _takes_bfloat16(op_type: str, opset: int) -> bool:
    """Whether every type constraint of the op's schema that allows float16 allows bfloat16 too."""
    try:
        schema = onnx.defs.get_schema(op_type, opset)
    except Exception:  # (no such schema: the checker decides)
        return True
    return all("tensor(bfloat16)" in c.allowed_type_strs for c in schema.type_constraints
               if "tensor(float16)" in c.allowed_type_strs)


def to_bfloat16(g: onnx.GraphProto) -> None:
    """Every float16 in `g` made bfloat16, in place and in its subgraphs: the inputs' and outputs'
    types, initializers and Constant values (each float16 value rounded to bfloat16, nearest even),
    and the element type that Cast, EyeLike or RandomNormal name. The graph's float32 Casts (the
    converter's, around its block list) stay as they are."""
    from ..verify import retype_graph

    retype_graph(g, {TensorProto.FLOAT16}, TensorProto.BFLOAT16)


def _float32_io(m: onnx.ModelProto) -> None:
    """Float32 inputs and outputs around a float16 graph, in place: a Cast after each float16
    input and before each float16 output. (The converter's own keep_io_types casts an output that
    other nodes also read, and they then mix float32 with float16: onnx rejects the model.)"""
    g = m.graph
    rename: dict[str, str] = {}
    head, tail = [], []
    for vi in g.input:
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT16:
            rename[vi.name] = vi.name + "/float16"
            head.append(helper.make_node("Cast", [vi.name], [rename[vi.name]], to=TensorProto.FLOAT16))
            vi.type.tensor_type.elem_type = TensorProto.FLOAT
    for vi in g.output:
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT16:
            rename[vi.name] = vi.name + "/float16"
            tail.append(helper.make_node("Cast", [rename[vi.name]], [vi.name], to=TensorProto.FLOAT))
            vi.type.tensor_type.elem_type = TensorProto.FLOAT
    for n in g.node:
        n.input[:] = [rename.get(i, i) for i in n.input]
        n.output[:] = [rename.get(o, o) for o in n.output]
    nodes = head + list(g.node) + tail
    del g.node[:]
    g.node.extend(nodes)


#: The numpy dtypes of a half model's feeds.
HALF_DTYPES = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def reference_widened(model: onnx.ModelProto, feeds: dict) -> dict:
    """The reference of a float16 model as `dlcc verify` takes it: onnxruntime on the model
    widened exactly to float32 (verify's rule), its float16 outputs rounded back to float16."""
    from ..frontend import HALF_TYPES
    from ..verify import widen_graph

    wide = onnx.ModelProto()
    wide.CopyFrom(model)
    widen_graph(wide.graph)
    out = reference(wide, {k: v.astype(np.float32) if v.dtype in HALF_DTYPES else v for k, v in feeds.items()})
    half = {o.name: helper.tensor_dtype_to_np_dtype(o.type.tensor_type.elem_type) for o in model.graph.output
            if o.type.tensor_type.elem_type in HALF_TYPES}
    return {k: v.astype(half[k]) if k in half else v for k, v in out.items()}


def _check_shapes(model: onnx.ModelProto, mine: dict) -> None:
    """Every shape the generator computed must be what onnx infers: the first that differs names
    the op (a generator bug, found before any dlcc run). Where onnx infers no rank at all (its
    GatherND rule gives up on a rank-0 result, and everything downstream inherits that), there is
    nothing to compare: an absent shape is not the rank-0 shape []; nor is a dim it leaves
    unknown (a Reshape to [1, -1] of such a value: [1, None])."""
    bare = onnx.ModelProto()
    bare.CopyFrom(model)
    for o in bare.graph.output:
        o.type.tensor_type.ClearField("shape")
    try:
        inferred = onnx.shape_inference.infer_shapes(bare, strict_mode=True)
    except Exception as e:
        raise GeneratorBug(f"onnx's shape inference rejects the generated graph: {e}") from None
    got = {vi.name: [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
           for vi in list(inferred.graph.value_info) + list(inferred.graph.output)
           if vi.type.tensor_type.HasField("shape")}
    producer = {o: n for n in model.graph.node for o in n.output}
    for n in model.graph.node:
        for o in n.output:
            if o in mine and o in got and (len(mine[o]) != len(got[o])
                                           or any(g is not None and g != d for d, g in zip(mine[o], got[o]))):
                raise GeneratorBug(f"{n.op_type} output {o!r}: the generator says {list(mine[o])}, onnx infers "
                                   f"{got[o]} (inputs {[producer[i].op_type if i in producer else i for i in n.input]})")


def generate_valid(seed: int, max_patterns: int = 8, tries: int = 20, extremes: bool = False,
                   half: bool | str = False, more_ops: bool = False) -> Case:
    """generate(), retrying with derived seeds when a graph's reference is not finite."""
    last = None
    for k in range(tries):
        try:
            return generate(seed * 7919 + k if k else seed, max_patterns=max_patterns, extremes=extremes, half=half,
                            more_ops=more_ops)
        except InvalidCase as e:
            last = e
    raise last


# ------------------------------------------------------------------------------------------------
# Graphs dlcc must refuse with its one-paragraph error (issue 17's "Bad input").
# ------------------------------------------------------------------------------------------------
UNSUPPORTED_KINDS = ["double", "float8", "nonzero", "value_reshape", "unknown_op", "custom_domain"]


def generate_unsupported(seed: int) -> tuple[onnx.ModelProto, str]:
    """(model, kind): a small model onnx's checker accepts and dlcc cannot compile."""
    ch = Chooser(seed)
    kind = ch.pick(UNSUPPORTED_KINDS)
    rs = np.random.default_rng(seed)
    shape = [ch.pick([2, 3, 4]), ch.pick([5, 8])]
    F = TensorProto.FLOAT
    nodes, inits = [], []
    inputs = [helper.make_tensor_value_info("x", F, shape)]
    out_t, out_shape = F, shape
    if kind == "double":
        inputs = [helper.make_tensor_value_info("x", TensorProto.DOUBLE, shape)]
        nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])]
        out_t = TensorProto.DOUBLE
    elif kind == "float8":  # (E8M0, MX's scale type: the float8 formats dlcc does not hold, held_types.py)
        nodes = [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT8E8M0),
                 helper.make_node("Identity", ["h"], ["r"]), helper.make_node("Cast", ["r"], ["y"], to=F)]
    elif kind == "nonzero":  # the output's shape depends on the values
        nodes = [helper.make_node("NonZero", ["x"], ["y"])]
        out_t, out_shape = TensorProto.INT64, [2, "n"]
    elif kind == "value_reshape":  # a Reshape to a shape read from a graph input
        inputs.append(helper.make_tensor_value_info("s", TensorProto.INT64, [2]))
        nodes = [helper.make_node("Reshape", ["x", "s"], ["y"])]
        out_shape = ["a", "b"]
    elif kind == "unknown_op":
        op = ch.pick(["Det", "Unique", "MaxRoiPool", "NonMaxSuppression"])
        if op == "Det":
            inputs = [helper.make_tensor_value_info("x", F, [3, 5, 5])]  # (dlcc writes Det out up to 4 x 4)
            nodes = [helper.make_node("Det", ["x"], ["y"])]
            out_shape = [3]
        elif op == "MaxRoiPool":
            inputs = [helper.make_tensor_value_info("x", F, [1, shape[1], 4, 4])]
            inits = [numpy_helper.from_array(np.array([[0, 0, 0, 3, 3]], np.float32), "rois")]
            nodes = [helper.make_node("MaxRoiPool", ["x", "rois"], ["y"], pooled_shape=[2, 2])]
            out_shape = [1, shape[1], 2, 2]
        elif op == "Unique":
            nodes = [helper.make_node("Unique", ["x"], ["y"])]
            out_shape = ["n"]
        else:
            inputs = [helper.make_tensor_value_info("x", F, [1, shape[1], 4]),
                      helper.make_tensor_value_info("sc", F, [1, 1, shape[1]])]
            nodes = [helper.make_node("NonMaxSuppression", ["x", "sc"], ["y"])]
            out_t, out_shape = TensorProto.INT64, ["n", 3]
        nodes = [helper.make_node("Relu", [nodes[0].input[0]], ["r"])] + nodes
        nodes[1].input[0] = "r"
    else:  # a node from a domain dlcc does not know
        nodes = [helper.make_node("Relu", ["x"], ["r"]),
                 helper.make_node("FusedGelu", ["r"], ["y"], domain="com.example")]
    outs = [helper.make_tensor_value_info("y", out_t, out_shape)]
    opsets = [helper.make_opsetid("", 24 if kind == "float8" else 17)] + ([helper.make_opsetid("com.example", 1)] if kind == "custom_domain" else [])
    model = helper.make_model(helper.make_graph(nodes, "unsupported", inputs, outs, initializer=inits),
                              opset_imports=opsets, ir_version=11 if kind == "float8" else 8)
    del rs
    check_model(model)
    return model, kind


def unsupported_reason(model: onnx.ModelProto, kind: str) -> list[str]:
    """Words of which dlcc's error must name one: the op type, the dtype, or that a shape depends
    on values."""
    if kind == "double":
        return ["double", "float64"]
    if kind == "float8":
        return ["float8"]
    if kind == "value_reshape":
        return ["depend", "value"]
    return [model.graph.node[-1].op_type]
