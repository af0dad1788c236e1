"""float8, float4 and the sub-byte integers, held in a wider type.

ONNX has nine types narrower than a byte's worth of precision: the float8 formats (E4M3FN,
E4M3FNUZ, E5M2, E5M2FNUZ: what NVIDIA's ModelOpt writes for an FP8 TensorRT engine), FLOAT4E2M1,
and INT4, UINT4, INT2 and UINT2 (onnxruntime's QDQ int4 weights). ONNX computes nothing in them:
only Cast, QuantizeLinear and DequantizeLinear convert to and from them, and the view ops move
them. So dlcc holds each in the narrowest type its kernels have that holds every value exactly
(HELD: float32 for the float formats, whose values are all float32s; int8 or uint8 for the
integers), and the only arithmetic that knows the type is the Cast into it, which rounds onto its
grid (cast_lines). Everything else (a Reshape, a Transpose, a DequantizeLinear's `(q - zp) *
scale`) computes on the held values as they are, and gets the same answer.

The model's inputs and outputs of these types keep their type: the plan records it
(`model_dtype`) and the executor converts at the boundary on the host, exactly both ways (a value
on the grid is a float32, and back). Constants are widened once at import. The memory saving of
the narrow type is not kept: a float8 weight is stored as float32 (a DequantizeLinear of a
constant is computed at import anyway, as for int8).

The Cast's rules are ONNX's (Cast-19's tables, with `saturate`), which onnx.reference and
ml_dtypes implement; onnxruntime agrees on every float8 case but one (E5M2 without saturation at
the tie just above 57344, where it gives NaN and the spec's round-to-nearest-even gives inf).
A float to a sub-byte integer truncates toward zero and gives 0 out of range (ONNX leaves it
undefined; this is ml_dtypes' and the reference's answer, where C's conversion would differ by
backend); an integer wraps (two's complement, as ONNX says for integers); onnxruntime rounds
instead of truncating, which only matters for a value that is not already an integer.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import onnx

#: Each held dtype (numpy's name, as ml_dtypes spells it) and the dtype that holds it.
HELD = {
    "float8_e4m3fn": "float32", "float8_e4m3fnuz": "float32", "float8_e5m2": "float32",
    "float8_e5m2fnuz": "float32", "float4_e2m1fn": "float32",
    "int4": "int8", "int2": "int8", "uint4": "uint8", "uint2": "uint8",
}


class FloatGrid(NamedTuple):
    """A small float format: `mant` mantissa bits, smallest normal exponent `emin`, largest
    exponent `emax`, largest finite value `max`; `inf`: overflow without saturation gives inf
    (else NaN); `uz`: no negative zero (the FNUZ formats); `nan`: NaN is a value (float4 has none)."""
    mant: int
    emin: int
    emax: int
    max: float
    inf: bool
    uz: bool
    nan: bool = True


FLOAT_GRIDS = {
    "float8_e4m3fn": FloatGrid(3, -6, 8, 448.0, False, False),
    "float8_e4m3fnuz": FloatGrid(3, -7, 7, 240.0, False, True),
    "float8_e5m2": FloatGrid(2, -14, 15, 57344.0, True, False),
    "float8_e5m2fnuz": FloatGrid(2, -15, 15, 57344.0, False, True),
    "float4_e2m1fn": FloatGrid(1, 0, 2, 6.0, False, False, nan=False),
}
#: The sub-byte integers: (bits, signed).
INT_GRIDS = {"int4": (4, True), "uint4": (4, False), "int2": (2, True), "uint2": (2, False)}


def held_onnx_type(dtype: str) -> int:
    """The ONNX type of the tensor holding `dtype`."""
    return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(HELD[dtype]))


def onnx_type_name(t) -> str | None:
    """numpy's name of ONNX type `t`, or None for one numpy lacks."""
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(int(t)).name
    except (KeyError, TypeError, ValueError):
        return None


def hold(graph) -> None:
    """Give every tensor of a HELD type its holder's type (a constant's values widened, exactly),
    and mark each Cast into one with the grid it rounds onto (the `%grid` attribute, which the
    Cast's lowering reads). The model's inputs and outputs of those types are recorded in
    `graph.held`, so the plan keeps their type at the boundary."""
    boundary = set(graph.inputs) | set(graph.outputs)
    count: dict[str, int] = {}
    for name, t in graph.tensors.items():
        if t.dtype in HELD:
            count[t.dtype] = count.get(t.dtype, 0) + 1
            if name in boundary:
                graph.held[name] = t.dtype
            if t.value is not None:
                t.value = t.value.astype(HELD[t.dtype])
            t.dtype = HELD[t.dtype]
    for n in graph.nodes:
        if n.op_type == "Cast" and n.domain in ("", "ai.onnx"):
            grid = onnx_type_name(n.attrs.get("to"))
            if grid in HELD:
                n.attrs["to"], n.attrs["%grid"] = held_onnx_type(grid), grid
    if count:
        graph.notes.append("import: " + ", ".join(f"{k} held in {HELD[k]} ({v} tensor(s))" for k, v in sorted(count.items()))
                           + "; Casts round onto their values, and inputs and outputs keep their type (held_types.py)")


def cast_lines(grid: str, src_is_float: bool, saturate: bool) -> tuple[list[str], str]:
    """Statements and the result expression of a Cast of `a` (float when `src_is_float`, else an
    integer or bool) onto `grid`'s values, in the held type.

    A float grid rounds to nearest even with one loop over the binades: q is the spacing of the
    values in a's binade (the subnormals share the first normal binade's), so rint(a / q) * q
    is a's rounding, computed exactly (q and 1 / q are powers of two, and rint rounds half to
    even in both dialects). No bit casts, so the text is the same in CUDA and OpenCL C."""
    from .kernels.program import literal

    if grid in INT_GRIDS:
        bits, signed = INT_GRIDS[grid]
        lo, hi = (-(1 << (bits - 1)), 1 << (bits - 1)) if signed else (0, 1 << bits)
        if src_is_float:  # truncation toward zero is in range exactly when lo - 1 < a < hi
            return [], f"((a > {lo - 1}.0f && a < {hi}.0f) ? (int)a : 0)"
        mask = (1 << bits) - 1
        return [], (f"((((int)(a & {mask})) ^ {1 << (bits - 1)}) - {1 << (bits - 1)})" if signed
                    else f"((int)(a & {mask}))")
    g = FLOAT_GRIDS[grid]
    q0, top = 2.0 ** (g.emin - g.mant), 2.0 ** (g.emax + 1)
    big = literal(g.max)
    over = big if saturate or not g.nan else ("DLCC_INF" if g.inf else "DLCC_NAN")
    lines = [f"const float x = {'a' if src_is_float else '(float)a'};",
             "const float ax = F_FABS(x);",
             f"float q = {literal(q0)}, iq = {literal(1.0 / q0)}, lim = {literal(2.0 * 2.0 ** g.emin)};",
             f"while (ax >= lim && lim < {literal(top)}) {{ q *= 2.0f; iq *= 0.5f; lim *= 2.0f; }}",
             "float r = F_RINT(ax * iq) * q;",
             f"if (r > {big}) r = {over};",
             "r = x < 0.0f ? -r : r;",
             f"if (r == 0.0f) r = {'0.0f' if g.uz else 'x * 0.0f'};",
             # (float4 has no NaN: ml_dtypes gives a zero of the NaN's opposite sign)
             f"if (x != x) r = {'DLCC_NAN' if g.nan else '(signbit(x) ? 0.0f : -0.0f)'};"]
    return lines, "r"


def held_io(g: onnx.GraphProto) -> tuple[dict[str, int], dict[str, int]]:
    """({input: its ONNX type}, {output: its ONNX type}) for `g`'s inputs and outputs of a HELD
    type. onnxruntime's Python binding returns float8 outputs as raw uint8 bytes and has no numpy
    type at all for E5M2, so where dlcc hands such a model to onnxruntime (verify's reference, a
    fallback segment) it runs float_boundary's model instead."""
    def pick(vis):
        return {vi.name: vi.type.tensor_type.elem_type for vi in vis if onnx_type_name(vi.type.tensor_type.elem_type) in HELD}

    return pick(g.input), pick(g.output)


def float_boundary(m: onnx.ModelProto, ins: dict[str, int], outs: dict[str, int]) -> onnx.ModelProto:
    """`m` (changed in place) with the given inputs and outputs as float32, each converted by a
    Cast inside to or from its own type, exact both ways; names unchanged. Feed it float32
    arrays, and take its outputs back with `.astype` to their types."""
    g = m.graph
    inner = {n: f"{n}%held" for n in [*ins, *outs]}
    for node in g.node:
        node.input[:] = [inner.get(i, i) for i in node.input]
        node.output[:] = [inner.get(o, o) for o in node.output]
    head = [onnx.helper.make_node("Cast", [n], [inner[n]], to=t) for n, t in ins.items()]
    tail = [onnx.helper.make_node("Cast", [inner[n]], [n], to=onnx.TensorProto.FLOAT) for n in outs]
    nodes = head + list(g.node) + tail
    del g.node[:]
    g.node.extend(nodes)
    for vi in [*g.input, *g.output]:
        if vi.name in inner:
            vi.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    return m
