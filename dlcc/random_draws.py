"""Random draws: RandomUniform, RandomNormal, their *Like forms and Multinomial as counter-based
streams, and Bernoulli written as a uniform draw plus plain ops.

Why counter-based (Philox4x32-10, Salmon et al., SC'11, as cuRAND and JAX use): element i of a
draw is a pure function of (key, counter), so
  - no generator state moves between threads or kernels: a draw is an ordinary map kernel, which
    AStitch may stitch, inline and even recompute (the same element comes out the same);
  - the host computes exactly the same stream in numpy (`host_draw`). `dlcc verify` hands
    onnxruntime dlcc's own draws in place of its random nodes (`verify.with_draws`), so everything
    downstream of a draw is compared exactly, instead of two independent random outputs that can
    never match.

The stream of one random node at one inference:
  - key = (k0, stream id): k0 is the node's `seed` attribute (its float32 bits) where it has one,
    else a 32-bit key drawn when the compiled model is loaded (so unseeded draws differ from load to
    load, as onnxruntime's do from session to session); the stream id is the CRC-32 of the node's
    output name, so two nodes never share a stream;
  - counter = (element index, inference number, 0, 0): the inference number counts the model's
    inferences since it was loaded, so each call draws anew (as onnxruntime's generators advance
    per run), and a seeded model gives the same sequence of draws on every load.
The key and the inference number live in the plan's own 8-byte storage STATE ("rng"): the key in
the high 32 bits, the number in the low 32, advanced by a one-thread kernel at the end of every
inference (ops/random.py). Reading it back (Executor.random_state) tells verify which draws ran.

Values: uniform u = (r0 >> 8) 2^-24 in [0, 1), scaled to [low, high); normal by Box-Muller on
u1 = ((r0 >> 8) + 1) 2^-24 in (0, 1] and u2 = (r1 >> 8) 2^-24: mean + scale sqrt(-2 ln u1) cos(2 pi u2).

Bernoulli is rewritten at import (`rewrite_compound`), before onnxruntime's folding sees it:
Bernoulli(p) = Cast(Less(U, p)), U = RandomUniformLike(p), 1 with probability p, as the operator's
text, torch.bernoulli and onnx.reference have it. (onnx's function body for it, which onnxruntime
inlines, computes Greater(U, p): 1 with probability 1 - p.)
"""
from __future__ import annotations

import zlib

import numpy as np
import onnx
from onnx import helper

#: The plan's random state: one 64-bit word (key << 32 | inference number), its own storage.
STATE = "%rng"
#: The draws dlcc computes as kernels (ops/random.py).
DRAW_OPS = ("RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike")
#: The random ops written as a draw plus plain ops (rewrite_compound).
COMPOUND_OPS = ("Bernoulli",)

_M0, _M1, _W0, _W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
_MASK = np.uint64(0xFFFFFFFF)
#: 2^-24: a 24-bit integer times this is exactly a float32 in [0, 1).
UNIT = 5.9604644775390625e-08


def source_name(tensor: str) -> str:
    """The model's name of a tensor the import renamed: a 16-bit (or float64) graph output computed
    in float32 is `%f32:NAME` inside (frontend.promote_half)."""
    return tensor[len("%f32:"):] if tensor.startswith("%f32:") else tensor


def stream_id(output_name: str) -> int:
    return zlib.crc32(output_name.encode("utf-8")) & 0xFFFFFFFF


def seed_key(seed: float) -> int:
    """A `seed` attribute as the stream's k0: its float32 bits (1.0 and 1.5 are different seeds)."""
    return int(np.float32(seed).view(np.uint32))


def philox(n: int, call: int, k0: int, k1: int) -> tuple[np.ndarray, ...]:
    """Philox4x32-10 on counters (i, call, 0, 0) for i < n, key (k0, k1): four uint32 arrays.
    The same rounds as the kernel text in ops/random.py."""
    z = np.zeros(n, np.uint64)
    return philox4x32(np.arange(n, dtype=np.uint64), np.full(n, call & 0xFFFFFFFF, np.uint64), z, z, k0, k1)


def philox4x32(c0, c1, c2, c3, k0: int, k1: int) -> tuple[np.ndarray, ...]:
    """Philox4x32-10 of counters (c0, c1, c2, c3) (uint64 arrays of 32-bit values) under key (k0, k1)."""
    a, b = np.uint64(k0 & 0xFFFFFFFF), np.uint64(k1 & 0xFFFFFFFF)
    for _ in range(10):
        p0 = np.uint64(_M0) * c0
        p1 = np.uint64(_M1) * c2
        n0 = (p1 >> np.uint64(32)) ^ c1 ^ a
        n2 = (p0 >> np.uint64(32)) ^ c3 ^ b
        c1, c3, c0, c2 = p1 & _MASK, p0 & _MASK, n0, n2
        a, b = (a + np.uint64(_W0)) & _MASK, (b + np.uint64(_W1)) & _MASK
    return tuple(x.astype(np.uint32) for x in (c0, c1, c2, c3))


def draw_params(op: str, attrs: dict) -> dict:
    """What a draw node's values depend on besides its key and counter: its distribution's two
    numbers as float32 (uniform: low and high - low; normal: mean and scale), and its seed."""
    if op in ("RandomUniform", "RandomUniformLike"):
        low, high = np.float32(attrs.get("low", 0.0)), np.float32(attrs.get("high", 1.0))
        a, b = float(low), float(np.float32(high - low))
    else:
        a, b = float(np.float32(attrs.get("mean", 0.0))), float(np.float32(attrs.get("scale", 1.0)))
    seed = attrs.get("seed")
    return {"normal": op in ("RandomNormal", "RandomNormalLike"), "a": a, "b": b,
            "seed": None if seed is None else seed_key(float(seed))}


def host_draw(params: dict, stream: int, shape, state_key: int, call: int) -> np.ndarray:
    """The float32 values a draw node computes at inference `call` of a model loaded with
    `state_key` (Executor.random_state): what its kernel writes, up to the last bits of the
    device's log/cos for a normal draw."""
    n = int(np.prod(shape)) if len(shape) else 1
    k0 = state_key if params["seed"] is None else params["seed"]
    r0, r1, _, _ = philox(n, call, k0, stream)
    a, b = np.float32(params["a"]), np.float32(params["b"])
    if params["normal"]:
        u1 = ((r0 >> np.uint32(8)) + np.uint32(1)).astype(np.float32) * np.float32(UNIT)
        u2 = (r1 >> np.uint32(8)).astype(np.float32) * np.float32(UNIT)
        z = np.sqrt(np.float32(-2.0) * np.log(u1)) * np.cos(np.float32(6.2831855) * u2)
        v = a + b * z
    else:
        v = a + (r0 >> np.uint32(8)).astype(np.float32) * np.float32(UNIT) * b
    return np.asarray(v, np.float32).reshape(tuple(shape))


# -- import: Bernoulli as a draw plus plain ops ----------------------------------------------------
def _attrs(n: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in n.attribute}


def rewrite_compound(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """Bernoulli nodes of the main graph as RandomUniformLike plus plain ops (module doc), named
    after the node's output so that verify's reference rewrites them identically."""
    g = model.graph
    if not any(n.op_type in COMPOUND_OPS and n.domain in ("", "ai.onnx") for n in g.node):
        return model, []
    taken = {o for n in g.node for o in n.output} | {i.name for i in g.input} | {t.name for t in g.initializer}
    out: list[onnx.NodeProto] = []
    counts: dict[str, int] = {}

    def fresh(base: str) -> str:
        name, k = base, 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        taken.add(name)
        return name

    for n in g.node:
        if n.op_type not in COMPOUND_OPS or n.domain not in ("", "ai.onnx"):
            out.append(n)
            continue
        counts[n.op_type] = counts.get(n.op_type, 0) + 1
        a, y = _attrs(n), n.output[0]
        seed = {"seed": float(a["seed"])} if "seed" in a else {}
        u, p, less = fresh(f"{y}/uniform"), fresh(f"{y}/p"), fresh(f"{y}/less")
        to = a.get("dtype")
        out += [helper.make_node("RandomUniformLike", [n.input[0]], [u], dtype=onnx.TensorProto.FLOAT, **seed),
                helper.make_node("Cast", [n.input[0]], [p], to=onnx.TensorProto.FLOAT),
                helper.make_node("Less", [u, p], [less]),
                helper.make_node("Cast", [less], [y], to=int(to) if to is not None else _elem_of(model, n.input[0]))]
    del g.node[:]
    g.node.extend(out)
    notes = [f"import: {k} {op} node(s) drawn as a uniform draw and plain ops (random_draws.py)"
             for op, k in sorted(counts.items())]
    return model, notes


def _elem_of(model: onnx.ModelProto, name: str) -> int:
    """The element type of `name` where the model says it (Bernoulli's output defaults to its
    input's type), else float."""
    for vi in list(model.graph.input) + list(model.graph.value_info):
        if vi.name == name and vi.type.tensor_type.elem_type:
            return vi.type.tensor_type.elem_type
    for t in model.graph.initializer:
        if t.name == name:
            return t.data_type
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    for vi in inferred.graph.value_info:
        if vi.name == name and vi.type.tensor_type.elem_type:
            return vi.type.tensor_type.elem_type
    return onnx.TensorProto.FLOAT


def host_multinomial(logits: np.ndarray, uniform: np.ndarray) -> np.ndarray:
    """Multinomial's samples [B, S] from `logits` [B, C] and the uniforms the kernel drew for
    them [B, S], as ops/random.py's kernel and onnxruntime compute them: in double, the first class
    whose running sum of exp(logit - max) over the finite logits passes u times the total (C
    where none does)."""
    x = np.asarray(logits, np.float32)
    fin = np.isfinite(x)
    mx = np.where(fin, x, np.float32(-3.4028234663852886e38)).max(axis=1, keepdims=True).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.where(fin, np.exp(x.astype(np.float64) - mx), 0.0)
    run = np.cumsum(e, axis=1)
    t = np.asarray(uniform, np.float64) * run[:, -1:]
    return np.stack([np.searchsorted(run[b], t[b], side="right") for b in range(x.shape[0])]).astype(np.int64)
