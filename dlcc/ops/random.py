"""RandomUniform, RandomNormal, RandomUniformLike and RandomNormalLike: Philox4x32-10 draws as
map kernels (random_draws.py says why counter-based, and defines the stream).

Each draw reads the plan's random state STATE (one 64-bit word: the load's key << 32 | the inference
number), broadcast to every element, so AStitch stitches a draw like any elementwise op, and may
recompute it (the same element gives the same value). `advance_state` adds the one-thread launch
that counts the inference, after every launch that reads the state (it writes STATE, so every
pass orders it after them: a write after reads).
"""
from __future__ import annotations

from ..ir import Tensor
from ..kernels.map import emit_map
from ..kernels.program import literal
from ..random_draws import STATE, UNIT, draw_params, source_name, stream_id
from .registry import ELEMENTWISE, register

#: The output dtypes a draw writes (float64: with a precision asked for, the import narrows it).
DRAW_DTYPES = ("float32", "float16", "bfloat16")


def ensure_state(ctx) -> None:
    """The state tensor, placed in its own storage (passes/memplan.py OWN_STORAGES)."""
    if STATE not in ctx.graph.tensors:
        # (its bits: int64 is a type AStitch stitches; rank 0 broadcasts to any draw, a scalar one too)
        ctx.graph.tensors[STATE] = Tensor(STATE, (), "int64")


def philox_lines(state: str, key0: str, stream: int) -> list[str]:
    """Statements leaving Philox4x32-10 of counter (i, inference number, 0, 0) and key (key0,
    stream) in c0..c3: the rounds of random_draws.philox, with 32 x 32 -> 64-bit products (the
    same text in CUDA and OpenCL C)."""
    return [f"const u64 st = {state};",
            "u32 c0 = (u32)i, c1 = (u32)st, c2 = 0u, c3 = 0u;",
            f"u32 k0 = {key0}, k1 = {stream}u;",
            "for (int r = 0; r < 10; ++r) {",
            "    const u64 p0 = (u64)0xD2511F53u * c0, p1 = (u64)0xCD9E8D57u * c2;",
            "    const u32 n0 = (u32)(p1 >> 32) ^ c1 ^ k0, n2 = (u32)(p0 >> 32) ^ c3 ^ k1;",
            "    c1 = (u32)p1; c3 = (u32)p0; c0 = n0; c2 = n2;",
            "    k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;",
            "}"]


def _stream(ctx, node, params: dict, **extra) -> tuple[str, str]:
    """A draw node's stream: the state in the graph, its record for verify (ctx.draws), and (the
    model's name of its output, which names the stream; the C expression of its key's k0)."""
    out = node.outputs[0]
    ensure_state(ctx)
    name = source_name(out)  # (the model's: verify replaces the node that makes it)
    ctx.draws.append({"output": name, "op": node.op_type, "shape": list(ctx.shape(out)), "dtype": ctx.dtype(out),
                      "stream": stream_id(name), **extra, **params})
    return name, "(u32)(st >> 32)" if params["seed"] is None else f"{params['seed']}u"


@register("RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", since=1, category=ELEMENTWISE)
def _draw(ctx, node):
    out = node.outputs[0]
    dt = ctx.dtype(out)
    if dt not in DRAW_DTYPES:
        raise ctx.fail(f"draws of {dt} are not supported (float32, float16 and bfloat16 are)")
    p = draw_params(node.op_type, node.attrs)
    name, key0 = _stream(ctx, node, p)
    a, b, unit = literal(p["a"]), literal(p["b"]), literal(UNIT)

    def body(v):
        s = philox_lines(v.x(0), key0, stream_id(name))
        if p["normal"]:
            s += [f"const float u1 = (float)((c0 >> 8) + 1u) * {unit};",
                  f"const float u2 = (float)(c1 >> 8) * {unit};",
                  "const float z = F_SQRT(-2.0f * F_LOG(u1)) * F_COS(6.2831855f * u2);"]
            return s, f"{a} + {b} * z"
        return s, f"{a} + (float)(c0 >> 8) * {unit} * {b}"

    emit_map(ctx, out, [STATE], body, node.op_type, flops_per_elem=60)


@register("Multinomial", since=7)
def _multinomial(ctx, node):
    """Per output [b, s] (a thread each): a uniform draw u of the sample's own stream element, and
    the first class j whose running sum of exp(logit - max) passes u times the row's total, in
    double, skipping non-finite logits: onnxruntime's rule (the upper bound in its running sums).
    C if none does (a row with no finite logit)."""
    x, out = node.inputs[0], node.outputs[0]
    shape = ctx.shape(x)
    if len(shape) != 2:
        raise ctx.fail(f"the input must be 2-D [batch, classes], not of shape {list(shape)}")
    if ctx.value_dtype(x) != "float32":
        raise ctx.fail(f"logits of {ctx.dtype(x)} are not supported (float32, float16 and bfloat16 are)")
    C = shape[1]
    S = ctx.shape(out)[1]
    name, key0 = _stream(ctx, node, draw_params("RandomUniform", node.attrs), logits=source_name(x))
    unit = literal(UNIT)

    def body(v):
        row = f"({v.o[0]}) * {C}"
        s = philox_lines(v.x(1), key0, stream_id(name))
        s += [f"const double t0 = (double)(c0 >> 8) * {unit};",
              "float mx = -3.4028234663852886e+38f;",
              f"for (int j = 0; j < {C}; ++j) {{ const float l = {v.ld_flat(0, f'{row} + j')}; "
              "if (F_ISFINITE(l) && l > mx) mx = l; }",
              "double tot = 0.0;",
              f"for (int j = 0; j < {C}; ++j) {{ const float l = {v.ld_flat(0, f'{row} + j')}; "
              "if (F_ISFINITE(l)) tot += exp((double)l - (double)mx); }",
              "const double t = t0 * tot;",
              f"int r = {C};",
              "double run = 0.0;",
              f"for (int j = 0; j < {C}; ++j) {{ const float l = {v.ld_flat(0, f'{row} + j')}; "
              "if (F_ISFINITE(l)) run += exp((double)l - (double)mx); if (run > t) { r = j; break; } }"]
        return s, "r"

    emit_map(ctx, out, [x, STATE], body, node.op_type, flops_per_elem=60 + 6 * C, inline_scalars=False)


def advance_state(ctx) -> None:
    """After every launch: add 1 to the inference number (its low 32 bits, wrapping there), so the
    next inference draws anew. Only plans with a draw have it."""
    if STATE not in ctx.graph.tensors:
        return

    def make(name: str) -> str:
        return (f"KERNEL void {name}(GPTR i64* st) {{\n"
                "    if (BLOCK_ID * BLOCK_DIM + THREAD_ID == 0) st[0] = (i64)(((u64)st[0] & 0xFFFFFFFF00000000ULL) | "
                "(u64)(u32)((u32)st[0] + 1u));\n}\n")

    prev = ctx.node
    ctx.node = None
    kname = ctx.program.add_kernel("random_advance", make, 32, kind="map", pass_name=ctx.pass_name)
    ctx.launch(kname, 1, [STATE], reads=[STATE], writes=[STATE], dram_bytes=16, category="elementwise")
    ctx.node = prev

