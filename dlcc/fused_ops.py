"""onnxruntime's fused ops (its transformer optimizer's and its saved-optimized models') become
standard ONNX ops at import, before anything else reads the model.

Why: a model that went through `onnxruntime.transformers.optimizer` (or Hugging Face Optimum's
ORTOptimizer, or was saved by an onnxruntime session with `optimized_model_filepath`) holds
com.microsoft ops that no ONNX exporter writes: Attention, MultiHeadAttention,
EmbedLayerNormalization, SkipLayerNormalization, SkipSimplifiedLayerNormalization, Gelu,
BiasGelu, FastGelu, QuickGelu, BiasAdd, RotaryEmbedding, FusedMatMul, FusedGemm, FusedConv, and
two ops onnxruntime registers in the ONNX domain itself (SimplifiedLayerNormalization, and
LayerNormalization below opset 17), which the ONNX checker rejects. Such files are what many
packages ship (`model_optimized.onnx`).

Each is rewritten into the standard ops that compute what onnxruntime's CPU kernel computes
(their schemas and kernels in onnxruntime/contrib_ops/cpu are the reference; the tests check each
against onnxruntime). dlcc then lowers and stitches those ops as it does an exporter's: an
Attention node becomes the MatMul, Softmax, MatMul chain that AStitch's attention fusion and the
GEMM rOperators already handle. Nothing is lost against a kernel per fused op, since the
passes fuse again, across the old op boundaries too.

The rewrites are written to be shape-agnostic (Reshape with 0 and -1, masks built with Shape and
Range), since they run before the model's dims are bound; they need only input ranks, which
shape inference gives, and a node waits a round (rewrite.Later) until it knows them.
Normalizations and activations on float16 or bfloat16 tensors compute in float32 and cast back,
as onnxruntime's kernels do.
"""
from __future__ import annotations

import functools

import numpy as np
import onnx
from onnx import helper

from .rewrite import Builder, Later, rewrite_rounds

_F = onnx.TensorProto.FLOAT
_HALF = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
_I64 = onnx.TensorProto.INT64

#: onnxruntime's default epsilons (its contrib schemas): the skip and embedding layer norms
#: default to 1e-12, the others to 1e-5.
_EPS_SKIP = 1e-12


def is_fused_op(node: onnx.NodeProto, opset: int) -> bool:
    """Whether `node` is one of onnxruntime's fused ops that this module rewrites."""
    if node.domain == "com.microsoft":
        return node.op_type in _LOWER
    if node.domain in ("", "ai.onnx"):
        return node.op_type == "SimplifiedLayerNormalization" or (node.op_type == "LayerNormalization" and opset < 17)
    return False


def lower_fused(model: onnx.ModelProto, infer, weights: dict[str, np.ndarray] | None, path,
                only: tuple[str, ...] | None = None, known: dict[str, tuple] | None = None,
                late: bool = False, partial: bool = False) -> tuple[onnx.ModelProto, list[str]]:
    """Rewrite every fused op of the main graph (in place) into standard ops (`only`: those op
    types; `late`: the LATE ones, else the others; `partial`: rewrite_rounds'). `infer` is a
    lenient shape inference; `weights` holds the values split_weights took
    out of the graph (None: new constants become initializers); `known` gives shapes and types
    inference cannot ({name: (shape, elem)}, as rewrite_rounds takes them). Returns the model
    and notes for the pass log."""
    from .frontend import opset_of

    opset = opset_of(model)

    def chosen(n: onnx.NodeProto) -> bool:
        return is_fused_op(n, opset) and (n.op_type in LATE) == late and (only is None or n.op_type in only)

    if not any(chosen(n) for n in model.graph.node):
        return model, []
    if opset < 11:
        from .rewrite import raise_opset

        model, note = raise_opset(model, 11, path, "onnxruntime's fused ops are written with opset 11's Range and Slice")
        opset, notes = 11, [note]
    else:
        notes = []
    _, counts = rewrite_rounds(model, infer, weights, path, chosen, _lower, _Builder, known, partial=partial)
    if not counts:
        return model, notes
    notes.append("import: onnxruntime's fused ops rewritten into standard ops ("
                 + ", ".join(f"{n} {op}" for op, n in sorted(counts.items())) + ")")
    return model, notes


class _Builder(Builder):
    """A Builder with what the fused rewrites share: the opset-dependent forms of the ops whose
    signature changed (ReduceMean, Unsqueeze, Squeeze), constants typed like a tensor, shape
    pieces (dims, aranges, slices), half-to-float casts, and attributes read with their kind
    checked."""

    def const_of(self, value, like: str | int) -> str:
        """A constant in the element type `like` (an ONNX type, or a tensor's: float32 where it
        is not known)."""
        elem = like if isinstance(like, int) else (self.elem(like) or _F)
        return self.constant(np.asarray(value, helper.tensor_dtype_to_np_dtype(elem)),
                             helper.tensor_dtype_to_np_dtype(elem))

    def ints(self, *values: int) -> str:
        return self.constant(np.array(values, np.int64), np.int64)

    def reduce(self, op: str, x: str, axes: list[int]) -> str:
        """A Reduce* over `axes`, kept: the axes an input from opset 13 for ReduceSum and from 18
        for the others, an attribute before."""
        if self.opset >= (13 if op == "ReduceSum" else 18):
            return self.op(op, [x, self.ints(*axes)], keepdims=1)
        return self.op(op, [x], axes=axes, keepdims=1)

    def reduce_mean(self, x: str, axes: list[int]) -> str:
        return self.reduce("ReduceMean", x, axes)

    def unsqueeze(self, x: str, axes: list[int], out: str | None = None) -> str:
        if self.opset >= 13:
            return self.op("Unsqueeze", [x, self.ints(*axes)], out)
        return self.op("Unsqueeze", [x], out, axes=axes)

    def slice(self, x: str, start, end, axis: int) -> str:
        """x[start:end] along `axis`; start and end are ints or 1-element int64 tensors."""
        s = self.ints(start) if isinstance(start, int) else start
        e = self.ints(end) if isinstance(end, int) else end
        return self.op("Slice", [x, s, e, self.ints(axis)])

    def dim(self, x: str, axis: int) -> str:
        """Dim `axis` (not negative) of x as a 1-element int64 tensor."""
        return self.slice(self.op("Shape", [x]), axis, axis + 1, 0)

    def to_float(self, x: str) -> tuple[str, int]:
        """x as float32 (a half tensor is cast), and its own element type."""
        elem = self.elem(x) or _F
        return (self.op("Cast", [x], to=_F) if elem in _HALF else x), elem

    def output(self, value: str, k: int, elem: int) -> None:
        """Name `value` as the node's output `k` (if the node has it), cast back to `elem`."""
        if k >= len(self.node.output) or not self.node.output[k]:
            return
        out = self.node.output[k]
        if elem in _HALF:
            self.op("Cast", [value], out, to=elem)
        else:
            self.op("Identity", [value], out)

    def wants(self, k: int | None) -> bool:
        """Whether the node has output `k` (None: an output the op does not have)."""
        return k is not None and k < len(self.node.output) and bool(self.node.output[k])

    def attr(self, name: str, default):
        """Attribute `name`, or `default`; one of another kind than the default's (a float
        where an int belongs, an int where a list does) is a clear error."""
        v = self.attrs.get(name, default)
        kinds = {bool: int, int: int, float: (int, float), list: list, bytes: (bytes, str)}
        want = kinds.get(type(default), type(default))
        if not isinstance(v, want) or (isinstance(v, list) and not all(isinstance(x, (int, float)) for x in v)):
            kind = {int: "an int", list: "a list of numbers"}.get(want, "a float" if want == (int, float) else "a string")
            raise self.fail(f"attribute {name!r} must be {kind}, not {v!r}"[:300])
        return v

    def flag(self, name: str) -> bool:
        """A 0/1 attribute as onnxruntime's kernels read it: on only where it is 1 (`do_rotary: 2`
        is off there, not on)."""
        return int(self.attr(name, 0)) == 1

    def unsupported(self, what: str) -> Exception:
        """A node dlcc cannot rewrite: the fallback runs it on onnxruntime (the second line says so)."""
        from .errors import FALLBACK_HINT
        from .ops.context import LoweringError

        return self.fail(f"{what} is not supported\n" + FALLBACK_HINT.format(what="this node"), LoweringError)

    def scalar(self, x: str) -> str:
        """A 1-element tensor as a scalar (Range's bounds are scalars)."""
        return self.op("Squeeze", [x, self.ints(0)]) if self.opset >= 13 else self.op("Squeeze", [x], axes=[0])

    def arange(self, start: str, length: str) -> str:
        """start, start + 1, ... (length values); scalar int64 start, 1-element int64 length."""
        end = self.op("Add", [start, self.scalar(length)])
        return self.op("Range", [start, end, self.constant(np.int64(1), np.int64)])


@functools.lru_cache(maxsize=1)
def _schemas() -> dict[tuple[str, str], frozenset]:
    """{(domain, op): the attribute names onnxruntime's schema allows}, read once."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as ort_c

        return {(s.domain, s.name): frozenset(s.attributes) for s in ort_c.get_all_operator_schema()}
    except Exception:  # an onnxruntime without the schema API: the attributes go unchecked
        return {}


def _lower(b: _Builder) -> None:
    allowed = _schemas().get(("com.microsoft" if b.node.domain == "com.microsoft" else "", b.node.op_type))
    unknown = sorted(set(b.attrs) - allowed) if allowed is not None else []
    if unknown:  # (onnxruntime refuses such a node too; the ONNX checker cannot see it)
        raise b.fail(f"has attribute(s) {', '.join(map(repr, unknown))}, which its schema does not have "
                     f"(it has {', '.join(sorted(allowed)) or 'none'})")
    lo, hi = _INPUTS.get(b.node.op_type, (1, 1 << 30))
    n = len(b.node.input)
    if not lo <= n <= hi:
        raise b.fail(f"takes {lo} to {hi} inputs, not {n}")
    for i in _REQUIRED.get(b.node.op_type, range(lo)):
        if not b.input(i):
            raise b.fail(f"input {i} is required")
    _LOWER[b.node.op_type](b)


# -- activations ----------------------------------------------------------------------------

def _gelu_of(b: _Builder, x: str) -> str:
    """0.5 x (1 + erf(x / sqrt 2)) in float32 (onnxruntime's Gelu and BiasGelu)."""
    e = b.op("Erf", [b.op("Mul", [x, b.constant(np.float32(1 / np.sqrt(2)))])])
    return b.op("Mul", [b.op("Mul", [x, b.constant(np.float32(0.5))]), b.op("Add", [e, b.constant(np.float32(1))])])


def _biased(b: _Builder, x: str, bias: str) -> tuple[str, int]:
    """x (+ bias), as float32, and x's element type."""
    xf, elem = b.to_float(x)
    if bias:
        xf = b.op("Add", [xf, b.to_float(bias)[0]])
    return xf, elem


def _gelu(b: _Builder) -> None:
    x, elem = _biased(b, b.input(0), b.input(1))
    b.output(_gelu_of(b, x), 0, elem)


def _fast_gelu(b: _Builder) -> None:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), onnxruntime's tanh approximation."""
    x, elem = _biased(b, b.input(0), b.input(1))
    alpha = np.float32(np.sqrt(2 / np.pi))
    inner = b.op("Mul", [x, b.op("Add", [b.constant(alpha), b.op("Mul", [b.op("Mul", [x, x]), b.constant(np.float32(0.044715) * alpha)])])])
    y = b.op("Mul", [b.op("Mul", [x, b.constant(np.float32(0.5))]), b.op("Add", [b.op("Tanh", [inner]), b.constant(np.float32(1))])])
    b.output(y, 0, elem)


def _quick_gelu(b: _Builder) -> None:
    """x sigmoid(alpha x)."""
    x, elem = b.to_float(b.input(0))
    alpha = float(b.attr("alpha", 1.702))
    b.output(b.op("Mul", [x, b.op("Sigmoid", [b.op("Mul", [x, b.constant(np.float32(alpha))])])]), 0, elem)


def _bias_add(b: _Builder) -> None:
    """X + bias + skip."""
    b.op("Add", [b.op("Add", [b.input(0), b.input(1)]), b.input(2)], b.node.output[0])


def _activation(b: _Builder, y: str, out: str) -> None:
    """FusedConv's and FusedGemm's `activation` on y, written to `out`: its parameters come from
    activation_params (FusedConv) or activation_alpha/beta (FusedGemm)."""
    act = b.attr("activation", b"")
    act = act.decode(errors="replace") if isinstance(act, bytes) else act
    params = [float(v) for v in b.attr("activation_params", [])]
    if b.node.op_type == "FusedGemm":
        params = [float(b.attr("activation_alpha", 0.01 if act == "LeakyRelu" else 0.2)),
                  float(b.attr("activation_beta", 0.5))]
    if act in ("", "Identity"):
        b.op("Identity", [y], out)
    elif act in ("Relu", "Tanh", "Sigmoid"):
        b.op(act, [y], out)
    elif act == "LeakyRelu":
        b.op("LeakyRelu", [y], out, alpha=params[0] if params else 0.01)
    elif act == "HardSigmoid":
        b.op("HardSigmoid", [y], out, alpha=params[0] if params else 0.2, beta=params[1] if len(params) > 1 else 0.5)
    elif act == "Clip":
        if len(params) < 2:
            raise b.fail("a Clip activation takes its min and max in activation_params")
        b.op("Clip", [y, b.const_of(np.float32(params[0]), b.input(0)), b.const_of(np.float32(params[1]), b.input(0))], out)
    else:
        raise b.unsupported(f"activation {act!r}")


def _fused_conv(b: _Builder) -> None:
    """Conv, then + Z (a residual), then the activation."""
    keep = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
    attrs = {k: v for k, v in b.attrs.items() if k in keep}  # (Conv's, which the checker sees after the rewrite)
    if isinstance(attrs.get("auto_pad"), bytes):
        attrs["auto_pad"] = attrs["auto_pad"].decode()
    y = b.op("Conv", list(b.node.input[:3]), **attrs)
    if b.input(3):
        y = b.op("Add", [y, b.input(3)])
    _activation(b, y, b.node.output[0])


def _fused_gemm(b: _Builder) -> None:
    keep = ("alpha", "beta", "transA", "transB")
    y = b.op("Gemm", list(b.node.input[:3]), **{k: v for k, v in b.attrs.items() if k in keep})
    _activation(b, y, b.node.output[0])


def _fused_matmul(b: _Builder) -> None:
    """alpha * (A or A^T) x (B or B^T), transposing the last two dims (FusedMatMul, TransposeMatMul)."""
    if int(b.attr("transBatchA", 0)) or int(b.attr("transBatchB", 0)):
        raise b.unsupported("FusedMatMul with transBatchA or transBatchB")

    def operand(i: int, flag: str) -> str:
        x = b.input(i)
        if not int(b.attr(flag, 0)):
            return x
        r = b.rank(x)
        if r < 2:
            raise b.fail(f"input {i} of rank {r} cannot be transposed")
        return b.op("Transpose", [x], perm=list(range(r - 2)) + [r - 1, r - 2])

    y = b.op("MatMul", [operand(0, "transA"), operand(1, "transB")])
    alpha = float(b.attr("alpha", 1.0))
    if alpha != 1.0:
        y = b.op("Mul", [y, b.const_of(np.float32(alpha), b.input(0))])
    b.op("Identity", [y], b.node.output[0])


# -- normalizations -------------------------------------------------------------------------

def _norm_axes(b: _Builder, x: str, axis: int) -> list[int]:
    """The normalized axes [axis, rank), negative (so a -1 needs no rank)."""
    if axis == -1:
        return [-1]
    r = b.rank(x)
    if not -r <= axis < r:
        raise b.fail(f"axis {axis} is outside the input's {r} dims")
    first = axis % r
    return list(range(first - r, 0))


def _layer_norm(b: _Builder, x: str, gamma: str, beta: str, eps: float, axes: list[int], elem: int,
                outs: tuple[int, int, int], rms: bool = False) -> None:
    """y = (x - mean) / sqrt(var + eps) * gamma + beta over `axes` (rms: x / sqrt(mean(x^2) + eps)
    * gamma), x float32; the outputs at indices `outs` = (y, mean, inverse std) where the node has
    them. Two passes, as onnxruntime's LayerNormalization does (its skip variants take E[x^2] -
    mean^2; the two differ in the last bits)."""
    y_k, mean_k, inv_k = outs
    if not rms and b.opset >= 17 and len(axes) == 1 and not b.wants(mean_k) and not b.wants(inv_k):
        g = b.to_float(gamma)[0]
        ins = [x, g] + ([b.to_float(beta)[0]] if beta else [])
        b.output(b.op("LayerNormalization", ins, axis=axes[0], epsilon=eps), y_k, elem)
        return
    if rms:
        d, mean = x, None
    else:
        mean = b.reduce_mean(x, axes)
        d = b.op("Sub", [x, mean])
    var = b.reduce_mean(b.op("Mul", [d, d]), axes)
    inv = b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [var, b.constant(np.float32(eps))])])])
    y = b.op("Mul", [b.op("Mul", [d, inv]), b.to_float(gamma)[0]])
    if beta:
        y = b.op("Add", [y, b.to_float(beta)[0]])
    b.output(y, y_k, elem)
    if mean is not None and b.wants(mean_k):
        b.op("Identity", [mean], b.node.output[mean_k])
    if b.wants(inv_k):
        b.op("Identity", [inv], b.node.output[inv_k])


def _skip_layer_norm(b: _Builder) -> None:
    """input + skip (+ bias), then a layer norm over the last axis; outputs (y, mean, inverse std,
    the sum). SkipSimplifiedLayerNormalization: the same with an RMS norm, and no beta input."""
    rms = b.node.op_type == "SkipSimplifiedLayerNormalization"
    x, elem = b.to_float(b.input(0))
    s = b.op("Add", [x, b.to_float(b.input(1))[0]])
    bias = b.input(3) if rms else b.input(4)
    if bias:
        s = b.op("Add", [s, b.to_float(bias)[0]])
    b.output(s, 3, elem)
    beta = "" if rms else b.input(3)
    _layer_norm(b, s, b.input(2), beta, float(b.attr("epsilon", _EPS_SKIP)), [-1], elem, (0, 1, 2), rms=rms)


def _contrib_layer_norm(b: _Builder) -> None:
    """onnxruntime's LayerNormalization (ONNX domain, before opset 17 made it standard) and
    SimplifiedLayerNormalization (an RMS norm): outputs (Y, Mean, InvStdDev) and (Y, inv_std_var)."""
    rms = b.node.op_type == "SimplifiedLayerNormalization"
    x, elem = b.to_float(b.input(0))
    axes = _norm_axes(b, b.input(0), int(b.attr("axis", -1)))
    eps = float(b.attr("epsilon", 1e-5))
    if rms:
        _layer_norm(b, x, b.input(1), "", eps, axes, elem, (0, None, 1), rms=True)
    else:
        _layer_norm(b, x, b.input(1), b.input(2), eps, axes, elem, (0, 1, 2))


def _embed_layer_norm(b: _Builder) -> None:
    _embed(b, *(b.input(i) for i in range(9)))


def _embed(b: _Builder, ids: str, seg_ids: str, word: str, pos: str, seg_emb: str, gamma: str, beta: str, mask: str,
           pos_ids: str) -> None:
    """word_embedding[input_ids] + position_embedding[position_ids or 0..S-1]
    (+ segment_embedding[segment_ids]), then a layer norm; mask_index is the count of ones in
    each row of the mask (zeros without one); embedding_sum is the sum before the norm."""
    if bool(seg_ids) != bool(seg_emb):
        raise b.fail("segment_ids and segment_embedding come together")

    def rows(table: str, index: str) -> str:  # (typed as the table, for to_float)
        return b.note(b.op("Gather", [table, index], axis=0), None, b.elem(table))

    w, elem = b.to_float(rows(word, ids))
    if pos_ids:
        p = rows(pos, pos_ids)
    else:
        p = b.note(b.slice(pos, 0, b.dim(ids, 1), 0), None, b.elem(pos))  # [S, hidden], broadcast over the batch
    s = b.op("Add", [w, b.to_float(p)[0]])
    if seg_ids:
        s = b.op("Add", [s, b.to_float(rows(seg_emb, seg_ids))[0]])
    _layer_norm(b, s, gamma, beta, float(b.attr("epsilon", _EPS_SKIP)), [-1], elem, (0, None, None))
    if b.wants(1):
        if mask:
            # (counted in float32, exact to 2**24 tokens, and cast: dlcc reduces floats)
            ones = b.op("Cast", [b.op("Equal", [mask, b.const_of(1, mask)])], to=_F)
            total = b.op("ReduceSum", [ones, b.ints(1)], keepdims=0) if b.opset >= 13 else \
                b.op("ReduceSum", [ones], axes=[1], keepdims=0)
            count = b.op("Cast", [total], to=onnx.TensorProto.INT32)
        else:
            zero = b.op("Mul", [b.op("Cast", [b.dim(ids, 0)], to=onnx.TensorProto.INT32), b.constant(np.int32(0), np.int32)])
            count = b.op("Expand", [zero, b.dim(ids, 0)])
        b.op("Identity", [count], b.node.output[1])
    b.output(s, 2, elem)


def _q_embed_layer_norm(b: _Builder) -> None:
    """onnxruntime's QEmbedLayerNormalization: EmbedLayerNormalization with its embeddings, gamma
    and beta quantized (all constants): each is dequantized here, once, as (q - zero_point) *
    scale, and the float op follows."""
    ids, seg_ids, word, pos, seg_emb, gamma, beta, mask = (b.input(i) for i in range(8))
    scales = [b.input(i) for i in range(8, 13)]
    zps = [b.input(i) for i in range(13, 18)]
    tables = []
    for q, sc, zp in zip((word, pos, seg_emb, gamma, beta), scales, zps):
        if not q:
            tables.append("")
            continue
        vals = [b.const(v) for v in (q, sc, zp)]
        if any(v is None for v in vals) or vals[0].dtype not in (np.int8, np.uint8):
            raise b.fail("its embeddings, gamma and beta, their scales and zero points must be int8 or uint8 "
                         "constants with their scales and zero points")
        qv, sv, zv = vals
        tables.append(b.constant((qv.astype(np.float32) - zv.astype(np.float32)) * sv.astype(np.float32)))
    word, pos, seg_emb, gamma, beta = tables
    _embed(b, ids, seg_ids, word, pos, seg_emb, gamma, beta, mask, "")


# -- attention ------------------------------------------------------------------------------

def _heads(b: _Builder, x: str, n: int) -> str:
    """[B, L, n * h] -> [B, n, L, h]."""
    return b.op("Transpose", [b.op("Reshape", [x, b.ints(0, 0, n, -1)])], perm=[0, 2, 1, 3])


def _padding_mask(b: _Builder, mask: str, query: str, keys: str, filter_value: float, like: str | int) -> str:
    """The additive mask of onnxruntime's key padding forms, broadcastable to [B, N, S, T]:
    raw [B, T] or [B, S, T] (1 keeps, 0 masks), or 1-D [B] end positions (right padding) or [2B]
    ends then starts (left padding too). `keys` is the [B, N, T, h] key tensor (T from it)."""
    r = b.rank(mask)
    zero, fill = b.const_of(np.float32(0), like), b.const_of(np.float32(filter_value), like)
    if r in (2, 3):
        keep = b.op("Greater", [mask, b.const_of(0, mask)])
        add = b.op("Where", [keep, zero, fill])
        return b.op("Reshape", [add, b.op("Concat", [b.dim(mask, 0), b.ints(1), b.ints(1) if r == 2 else b.dim(mask, 1),
                                                     b.ints(-1)], axis=0)])
    if r == 4:
        raise b.unsupported("a 4-D mask_index (Megatron's)")
    if r != 1:
        raise b.unsupported(f"a mask_index of rank {r}")
    # The form is told apart at run time below ([B] or [2B]); a length known now to be neither
    # (the [3B + 2] cumulative form of onnxruntime's CUDA kernels) is refused here.
    length, qshape = b.info.get(mask, ((None,), None))[0], b.info.get(query, (None, None))[0]
    if length and qshape and isinstance(length[0], int) and isinstance(qshape[0], int) and length[0] \
            and qshape[0] and length[0] not in (qshape[0], 2 * qshape[0]):
        raise b.unsupported(f"a 1-D mask_index of {length[0]} values for a batch of {qshape[0]} (only [B] and [2B] are)")
    batch = b.dim(query, 0)
    pos = b.arange(b.constant(np.int64(0), np.int64), b.dim(keys, 2))  # [T]
    m64 = b.op("Cast", [mask], to=_I64)
    end = b.unsqueeze(b.slice(m64, 0, batch, 0), [1])  # [B, 1]
    # [2B] holds the starts after the ends; [B] has none (the zeros appended stand for them)
    padded = b.op("Concat", [m64, b.op("Mul", [b.slice(m64, 0, batch, 0), b.constant(np.int64(0), np.int64)])], axis=0)
    start = b.unsqueeze(b.slice(padded, batch, b.op("Add", [batch, batch]), 0), [1])
    keep = b.op("And", [b.op("Less", [pos, end]), b.op("Not", [b.op("Less", [pos, start])])])  # [B, T]
    add = b.op("Where", [keep, zero, fill])
    return b.unsqueeze(add, [1, 2])


def _causal(b: _Builder, query: str, keys: str) -> str:
    """[S, T] booleans: key j is hidden from query i where j > (T - S) + i (the past precedes)."""
    s, t = b.dim(query, 2), b.dim(keys, 2)
    zero = b.constant(np.int64(0), np.int64)
    i, j = b.arange(zero, s), b.arange(zero, t)
    limit = b.op("Add", [b.unsqueeze(i, [1]), b.op("Sub", [t, s])])  # [S, 1]
    return b.op("Greater", [b.unsqueeze(j, [0]), limit])


def _attend(b: _Builder, q: str, k: str, v: str, head: int, mask: str, batch_of: str, bias: str, elem: int) -> str:
    """softmax(scale * q k^T + padding mask + bias) v for q, k, v as [B, N, L, h] (the node's
    `scale`, or 1/sqrt(head)), written as the node's output [B, S, N * h_v]. The padding mask is
    built from `mask` (the batch read from `batch_of`). The causal mask (`unidirectional`) is not
    added: a hidden score is set to float's lowest value, as onnxruntime's PrepareMask sets it over
    any padding value (so a row whose only visible keys are padding still attends to them, as
    onnxruntime's does). `elem` is the element type of q, k and v."""
    scale = float(b.attr("scale", 0.0)) or 1.0 / np.sqrt(head)
    pad = _padding_mask(b, mask, batch_of, k, float(b.attr("mask_filter_value", -10000.0)), elem) if mask else ""
    causal = _causal(b, q, k) if b.flag("unidirectional") else ""
    k_t = b.op("Transpose", [k], perm=[0, 1, 3, 2])
    scores = b.op("Mul", [b.op("MatMul", [q, k_t]), b.const_of(np.float32(scale), elem)])
    if pad:
        scores = b.op("Add", [scores, pad])
    if bias:
        scores = b.op("Add", [scores, bias])
    if causal:
        lowest = np.finfo(helper.tensor_dtype_to_np_dtype(elem)).min
        scores = b.op("Where", [b.unsqueeze(causal, [0, 1]), b.const_of(lowest, elem), scores])
    probs = b.op("Softmax", [scores], axis=-1) if b.opset >= 13 else b.op("Softmax", [scores], axis=3)
    out = b.op("Transpose", [b.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
    return b.op("Reshape", [out, b.ints(0, 0, -1)], b.node.output[0])


def _attention(b: _Builder) -> None:
    """onnxruntime's Attention: one input projected by merged Q/K/V weights, heads split, an
    optional past concatenated before the keys and values (present = both, stacked), the padding
    and causal masks and an attention bias added to the scaled scores."""
    if b.flag("do_rotary"):
        raise b.unsupported("Attention with do_rotary")
    if int(b.attr("past_present_share_buffer", 0)) or b.input(6):
        raise b.unsupported("Attention with past_present_share_buffer")
    x, w, bias, mask, past, attn_bias = (b.input(i) for i in range(6))
    n = int(b.attr("num_heads", 0))
    if n <= 0:
        raise b.fail("num_heads must be positive")
    wv = b.const(w)
    width = wv.shape[1] if wv is not None and wv.ndim == 2 else None
    if width is None:
        shape = b.info.get(w, (None, None))[0]
        width = shape[1] if shape is not None and len(shape) == 2 and shape[1] else None
    sizes = [int(s) for s in b.attr("qkv_hidden_sizes", [])]
    if not sizes:
        if width is None:
            raise Later(b.fail("the width of its weights is not known"))
        if width % 3:
            raise b.fail(f"weights of width {width} do not split into three equal Q, K and V parts; give qkv_hidden_sizes")
        sizes = [width // 3] * 3
    if len(sizes) != 3 or any(s <= 0 or s % n for s in sizes) or (width is not None and sum(sizes) != width):
        raise b.fail(f"qkv_hidden_sizes {sizes} must be three positive multiples of num_heads {n} adding up to the weights' width {width}")
    if past and not (sizes[0] == sizes[1] == sizes[2]):
        raise b.fail("with a past state, Q, K and V have one hidden size")
    edges = np.cumsum([0] + sizes)
    parts = []
    for k in range(3):
        if wv is not None:
            wk = b.constant(np.ascontiguousarray(wv[:, edges[k]:edges[k + 1]]), wv.dtype)
        else:
            wk = b.slice(w, int(edges[k]), int(edges[k + 1]), 1)
        y = b.op("MatMul", [x, wk])
        if bias:
            bv = b.const(bias)
            bk = b.constant(bv[edges[k]:edges[k + 1]], bv.dtype) if bv is not None else b.slice(bias, int(edges[k]), int(edges[k + 1]), 0)
            y = b.op("Add", [y, bk])
        parts.append(y)
    _attention_core(b, x, parts, sizes[0] // n, n, mask, past, attn_bias, b.elem(x) or _F)


def _attention_core(b: _Builder, x: str, parts: list[str], head: int, n: int, mask: str, past: str,
                    attn_bias: str, elem: int) -> None:
    """Attention and QAttention after their projection: `parts` are Q, K and V as [B, S, n * h]
    (`head` the Q/K head size), x the node's input (the batch is read from it); the past
    concatenated before the keys and values, the present output, the masks, the scores, the
    output. `elem` is the element type of Q, K and V."""
    q, k, v = _heads(b, parts[0], n), _heads(b, parts[1], n), _heads(b, parts[2], n)  # [B, N, L, h]
    if past:
        k = b.op("Concat", [b.op("Gather", [past, b.constant(np.int64(0), np.int64)], axis=0), k], axis=2)
        v = b.op("Concat", [b.op("Gather", [past, b.constant(np.int64(1), np.int64)], axis=0), v], axis=2)
    if b.wants(1):
        b.op("Concat", [b.unsqueeze(k, [0]), b.unsqueeze(v, [0])], b.node.output[1], axis=0)
    _attend(b, q, k, v, head, mask, x, attn_bias, elem)


def _q_attention(b: _Builder) -> None:
    """onnxruntime's QAttention (what quantize_dynamic makes of an Attention): the projection is
    an integer product of the quantized input and weight (a MatMulInteger, which quantized.py then
    computes exactly), times input_scale x weight_scale (per tensor or per column), plus the
    bias; then Attention's computation in float."""
    if b.flag("do_rotary") or int(b.attr("past_present_share_buffer", 0)):
        raise b.unsupported("QAttention with do_rotary or past_present_share_buffer")
    x, w, bias, x_s, w_s, mask, x_zp, w_zp, past = (b.input(i) for i in range(9))
    n = int(b.attr("num_heads", 0))
    if n <= 0:
        raise b.fail("num_heads must be positive")
    shape = b.const(w).shape if b.const(w) is not None else b.info.get(w, (None, None))[0]
    width = shape[1] if shape is not None and len(shape) == 2 and shape[1] else None
    if width is None:
        raise Later(b.fail("the width of its weights is not known"))
    if width % (3 * n):
        raise b.fail(f"weights of width {width} do not split into Q, K and V of num_heads {n} heads each")
    acc = b.op("Cast", [b.op("MatMulInteger", [x, w, x_zp, w_zp] if w_zp else [x, w] + ([x_zp] if x_zp else []))], to=_F)
    qkv = b.op("Add", [b.op("Mul", [acc, b.op("Mul", [x_s, w_s])]), bias])
    h = width // 3
    parts = [b.slice(qkv, k * h, (k + 1) * h, -1) for k in range(3)]
    _attention_core(b, x, parts, h // n, n, mask, past, "", _F)


def _multi_head_attention(b: _Builder) -> None:
    """onnxruntime's MultiHeadAttention: separate query, key and value ([B, L, hidden], or key
    and value already [B, N, L, h]), an optional bias for the three projections, a key padding
    mask, an attention bias, and past key and value concatenated before them."""
    q, k, v, bias, mask, attn_bias, past_k, past_v = (b.input(i) for i in range(8))
    if any(b.input(i) for i in (8, 9)):
        raise b.unsupported("MultiHeadAttention with past_sequence_length or cache_indirection")
    if b.wants(3):
        raise b.unsupported("MultiHeadAttention's qk output")
    n = int(b.attr("num_heads", 0))
    if n <= 0:
        raise b.fail("num_heads must be positive")
    if b.rank(q) != 3:
        raise b.unsupported(f"a query of rank {b.rank(q)} (packed Q, K and V)")
    if not k or not v:
        raise b.unsupported("MultiHeadAttention without separate key and value (packed forms)")
    shape = b.info.get(q, (None, None))[0]
    hq = shape[-1] if shape and shape[-1] else None  # the query's (and key's) hidden size
    if hq is None and (bias or not float(b.attr("scale", 0.0))):
        raise Later(b.fail("the query's hidden size is not known"))
    if bias:
        bv = b.const(bias)
        if bv is None:
            raise b.unsupported("a bias that is not a constant")
        b_q, b_k, b_v = bv[:hq], bv[hq:2 * hq], bv[2 * hq:]
        q = b.op("Add", [q, b.constant(b_q, bv.dtype)])
    qh = _heads(b, q, n)

    def project(t: str, bt) -> str:
        if b.rank(t) == 4:  # already [B, N, L, h]
            return t
        if bt is not None:
            t = b.op("Add", [t, b.constant(bt, bt.dtype)])
        return _heads(b, t, n)

    key, value = project(k, b_k if bias else None), project(v, b_v if bias else None)
    if past_k:
        key = b.op("Concat", [past_k, key], axis=2)
        value = b.op("Concat", [past_v, value], axis=2)
    if b.wants(1):
        b.op("Identity", [key], b.node.output[1])
    if b.wants(2):
        b.op("Identity", [value], b.node.output[2])
    _attend(b, qh, key, value, hq // n if hq else 0, mask, q, attn_bias, b.elem(b.input(0)) or _F)


def _rotary_embedding(b: _Builder) -> None:
    """onnxruntime's RotaryEmbedding: the first rotary_embedding_dim values of each head rotated
    by the cached cos and sin at each token's position (halves, or interleaved pairs)."""
    x, pos_ids, cos, sin = (b.input(i) for i in range(4))
    if int(b.attr("is_packed_batching", 0)):
        raise b.unsupported("RotaryEmbedding with is_packed_batching")
    r = b.rank(x)
    if r not in (3, 4):
        raise b.fail(f"rotates a tensor of rank 3 or 4, not {r}")
    n, rd = int(b.attr("num_heads", 0)), int(b.attr("rotary_embedding_dim", 0))
    interleaved = b.flag("interleaved")
    cv = b.const(cos)
    if cv is None:
        shape = b.info.get(cos, (None, None))[0]
        half = shape[1] if shape and len(shape) == 2 and shape[1] else None
    else:
        half = cv.shape[1]
    if half is None:
        raise Later(b.fail("the width of cos_cache is not known"))
    rd = rd or 2 * half
    if r == 3:
        if n <= 0:
            shape = b.info.get(x, (None, None))[0]
            if rd != 2 * half or not shape or not shape[-1]:
                raise b.fail("a 3-D input needs num_heads (or its hidden size known, with head size = 2 x the cache's width)")
            n = shape[-1] // rd
        xh = b.op("Transpose", [b.op("Reshape", [x, b.ints(0, 0, n, -1)])], perm=[0, 2, 1, 3])  # [B, N, S, h]
    else:
        xh = x
    # positions: [B, S] ids, or one offset for every batch: offset + 0..S-1
    if b.rank(pos_ids) == 2:
        pos = pos_ids
    else:
        # (the offset is added to 0..S-1, which folds: a Range over a computed start would not)
        p0 = b.op("Cast", [b.op("Reshape", [pos_ids, b.ints(1)])], to=_I64)
        pos = b.unsqueeze(b.op("Add", [b.arange(b.constant(np.int64(0), np.int64), b.dim(xh, 2)), p0]), [0])
    y = _rotate(b, xh, pos, cos, sin, rd, interleaved)
    if r == 3:
        y = b.op("Reshape", [b.op("Transpose", [y], perm=[0, 2, 1, 3]), b.ints(0, 0, -1)])
    b.op("Identity", [y], b.node.output[0])


def _rotate(b: _Builder, xh: str, pos: str, cos: str, sin: str, rd: int, interleaved: bool) -> str:
    """xh ([B, N, S, h]) with its first `rd` values of each head rotated by the cached cos and sin
    (rows picked by `pos`, int64 [B or 1, S]): halves, or interleaved pairs; the rest unchanged."""
    c = b.unsqueeze(b.op("Gather", [cos, pos], axis=0), [1])  # [B or 1, 1, S, rd/2]
    sn = b.unsqueeze(b.op("Gather", [sin, pos], axis=0), [1])
    rot = b.slice(xh, 0, rd, 3)
    rest = b.slice(xh, rd, 1 << 62, 3)
    if interleaved:
        pairs = b.op("Reshape", [rot, b.ints(0, 0, 0, -1, 2)])
        x1, x2 = b.slice(pairs, 0, 1, 4), b.slice(pairs, 1, 2, 4)
        c5, s5 = b.unsqueeze(c, [4]), b.unsqueeze(sn, [4])
        y1 = b.op("Sub", [b.op("Mul", [x1, c5]), b.op("Mul", [x2, s5])])
        y2 = b.op("Add", [b.op("Mul", [x2, c5]), b.op("Mul", [x1, s5])])
        y = b.op("Reshape", [b.op("Concat", [y1, y2], axis=4), b.ints(0, 0, 0, -1)])
    else:
        x1, x2 = b.slice(rot, 0, rd // 2, 3), b.slice(rot, rd // 2, rd, 3)
        y1 = b.op("Sub", [b.op("Mul", [x1, c]), b.op("Mul", [x2, sn])])
        y2 = b.op("Add", [b.op("Mul", [x2, c]), b.op("Mul", [x1, sn])])
        y = b.op("Concat", [y1, y2], axis=3)
    return b.op("Concat", [y, rest], axis=3)


#: The name of the Gather that checks GroupQueryAttention's seqlens_k (what its error names).
_SEQLENS_CHECK = "seqlens_k_must_lie_in_0_to_total_sequence_length"


def _group_query_attention(b: _Builder) -> None:
    """onnxruntime's GroupQueryAttention (what onnxruntime-genai's model builder emits for Llama,
    Mistral, Phi-3, Qwen, Gemma): Q with `num_heads` heads attending to K and V with fewer
    (`kv_num_heads`, each shared by a group of query heads), a KV cache in BNSH layout, the
    rotary embedding applied inside (`do_rotary`), causal masking with an optional local window,
    softcap and a smooth softmax or per-head sinks.

    The KV cache takes onnxruntime's three forms:
    - growing (total_sequence_length T = P + S): present is [B, Nkv, P + S, h];
    - fixed-size (T <= P, onnxruntime-genai's shared past/present buffer of max_length rows):
      present is [B, Nkv, P, h], so one plan serves every decode step;
    - window-sized (sliding_window_cache: Gemma 2 and 3's local layers): _window_cache.
    For batch entry b, present holds the past's first past_b = seqlens_k[b] + 1 - S rows (none on
    the first prompt, S = T), then its S new rows, then zeros. T is read at compile time where it
    folds (onnxruntime-genai computes it from the attention mask's shape); a T left to run time
    must be P + S, and a seqlens_k outside [0, T) is an error, as in onnxruntime (index checks:
    _check_in). Query heads n = kv * G + g read kv head kv, so Q is reshaped to
    [B, Nkv, G * S, h] and multiplied by K as it is: the KV heads are never copied G times.

    It is rewritten after the dims are bound and the constants folded (LATE), so that T is known.
    """
    for i, what in ((12, "a quantized KV cache (k_scale)"), (13, "a quantized KV cache (v_scale)"),
                    (14, "q_norm_weight"), (15, "k_norm_weight"), (16, "query_seqlens")):
        if b.input(i):
            raise b.unsupported(f"GroupQueryAttention with {what}")
    sliding = int(b.attr("sliding_window_cache", 0))
    if sliding not in (0, 1):
        raise b.fail(f"sliding_window_cache must be 0 or 1, not {sliding}")
    if int(b.attr("qk_output", 0)) or b.wants(3):
        raise b.unsupported("GroupQueryAttention's output_qk")
    for name in ("k_quant_type", "v_quant_type"):
        quant = b.attr(name, b"NONE")
        if (quant.decode() if isinstance(quant, bytes) else quant) != "NONE":
            raise b.unsupported(f"GroupQueryAttention with {name} {quant!r} (a quantized KV cache)")
    q, k, v, past_k, past_v, seqlens, total = (b.input(i) for i in range(7))
    cos, sin, pos_ids, attn_bias, sink = (b.input(i) for i in range(7, 12))
    n, nkv = int(b.attr("num_heads", 0)), int(b.attr("kv_num_heads", 0))
    if n <= 0 or nkv <= 0 or n % nkv:
        raise b.fail(f"num_heads {n} must be a positive multiple of kv_num_heads {nkv}")
    if bool(k) != bool(v) or bool(past_k) != bool(past_v) or bool(cos) != bool(sin):
        raise b.fail("key and value, past_key and past_value, and cos_cache and sin_cache come in pairs")
    causal, window = int(b.attr("causal", 1)), int(b.attr("local_window_size", -1))
    if causal not in (0, 1) or (not causal and window >= 0):
        raise b.fail(f"causal must be 0 or 1 (not {causal}), and local_window_size -1 without it")
    if window == 0:  # (onnxruntime returns zeros: no key in the window)
        raise b.fail("local_window_size 0 leaves every query no key to attend to")
    if sliding and (window < 0 or not past_k):
        raise b.fail("a window-sized cache (sliding_window_cache) needs local_window_size and a past")
    if sliding and attn_bias:
        raise b.unsupported("an attention bias with a window-sized cache (sliding_window_cache)")
    elem = b.elem(q) or _F
    if elem not in (_F, *_HALF) or any(t and b.elem(t) not in (None, elem) for t in (past_k, past_v)):
        raise b.unsupported("a KV cache in another type than the query's (a quantized cache)")
    if b.rank(q) != 3:
        raise b.fail(f"the query has rank {b.rank(q)}, not 3")
    width = (b.info.get(q, (None, None))[0] or (None,))[-1]
    if not width:
        raise Later(b.fail("the query's hidden size is not known"))
    packed = not k
    head, rem = divmod(width, n + 2 * nkv if packed else n)
    if rem or head <= 0:
        raise b.fail(f"a query of width {width} does not split into {n} heads"
                     + (f" and {2 * nkv} key and value heads (packed Q, K and V)" if packed else ""))
    if packed:
        q, k, v = (b.slice(q, lo * head, hi * head, 2) for lo, hi in ((0, n), (n, n + nkv), (n + nkv, n + 2 * nkv)))
    qh, kh, vh = _heads(b, q, n), _heads(b, k, nkv), _heads(b, v, nkv)  # [B, heads, S, h]
    zero = b.constant(np.int64(0), np.int64)
    s_len = b.dim(qh, 2)
    p_len = b.dim(past_k, 2) if past_k else b.ints(0)
    t_val = b.const(total)
    shape_p = (b.info.get(past_k, (None, None))[0] or (None,) * 4)[2] if past_k else 0
    shape_s = (b.info.get(b.input(0), (None, None))[0] or (None,) * 3)[1]  # (q may be a slice of it by now)
    ends = b.op("Cast", [seqlens], to=_I64)
    t_in = b.op("Reshape", [b.op("Cast", [total], to=_I64), b.ints(1)])
    # (onnxruntime's checks where they cannot be made now: zeros added where they are used, _check_in)
    if sliding:  # the past's rows are the capacity C; T only bounds the entries' lengths
        if isinstance(shape_p, int) and shape_p < window:
            raise b.fail(f"a window-sized cache of {shape_p} rows is smaller than the window of {window}")
        length = p_len
        checks = _check_in(b, ends, b.ints(int(t_val.reshape(()))) if t_val is not None and t_val.size == 1 else
                           b.op("Add", [p_len, s_len]), _SEQLENS_CHECK)
    elif t_val is not None and t_val.size == 1:
        if not isinstance(shape_p, int) or not isinstance(shape_s, int):
            raise Later(b.fail("the lengths of the past and of the query are not known"))
        t_now = int(t_val.reshape(()))
        if t_now == shape_p + shape_s:  # growing
            length = b.op("Add", [p_len, s_len])
        elif 1 <= t_now <= shape_p:  # fixed-size
            length = p_len
        else:
            raise b.fail(f"total_sequence_length {t_now} must be the past's {shape_p} rows plus the {shape_s} new ones "
                         f"(a growing cache), or between 1 and {shape_p} (a fixed-size one)")
        checks = _check_in(b, ends, b.ints(t_now), _SEQLENS_CHECK)
    else:  # a growing cache, checked at run time (T = P + S, so P + S bounds seqlens_k)
        length = b.op("Add", [p_len, s_len])
        checks = b.op("Add", [_check_in(b, b.op("Sub", [t_in, length]), b.ints(1), "total_sequence_length_must_be_past_plus_new"),
                              _check_in(b, ends, length, _SEQLENS_CHECK)])
    first = b.op("Equal", [s_len, t_in])  # onnxruntime's first prompt: S = T, no past read
    lengths = b.op("Add", [b.op("Add", [ends, b.ints(1)]), checks])  # [B]: each entry's total length
    if sliding:  # the tokens before this step: T less the valid new rows, min(S, T)
        past_b = b.op("Sub", [lengths, b.op("Min", [lengths, s_len])])
    else:
        past_b = b.op("Where", [first, zero, b.op("Sub", [lengths, s_len])])
    step = b.arange(zero, s_len)  # [S]
    query_at = b.op("Add", [b.unsqueeze(past_b, [1]), b.unsqueeze(step, [0])])  # [B, S]: each query's position
    if b.flag("do_rotary"):
        if not cos:
            raise b.fail("do_rotary needs cos_cache and sin_cache")
        half = (b.const(cos).shape if b.const(cos) is not None else b.info.get(cos, (None, None))[0] or (None, None))[1]
        if not half:
            raise Later(b.fail("the width of cos_cache is not known"))
        if 2 * half > head:
            raise b.fail(f"cos_cache's width {half} is more than half the head size {head}")
        pos = query_at
        if pos_ids:  # the first prompt reads only the first id, as an offset for every entry
            ids = b.op("Cast", [pos_ids], to=_I64)
            first_ids = b.op("Add", [b.op("Reshape", [b.slice(b.slice(ids, 0, 1, 0), 0, 1, 1), b.ints(1, 1)]),
                                     b.unsqueeze(step, [0])])
            pos = b.op("Where", [first, first_ids, ids])
        interleaved = b.flag("rotary_interleaved")
        qh = _rotate(b, qh, pos, cos, sin, 2 * half, interleaved)
        kh = _rotate(b, kh, pos, cos, sin, 2 * half, interleaved)
    if sliding:
        present_k, present_v, key_k, key_v, key_pos, key_ok = _window_cache(b, past_k, past_v, kh, vh, past_b, lengths,
                                                                           window, elem)
    else:
        present_k = _present(b, past_k, kh, past_b, length, elem)
        present_v = _present(b, past_v, vh, past_b, length, elem)
        key_k, key_v, key_ok = present_k, present_v, None
        key_pos = b.unsqueeze(b.arange(zero, length), [0])  # [1, L]: the present's rows are positions
    for out, value in ((1, present_k), (2, present_v)):
        if b.wants(out):
            b.op("Identity", [value], b.node.output[out])
    seen = _keys_seen(b, key_pos, key_ok, query_at, lengths, causal, window)
    b.output(_grouped_attention(b, qh, key_k, key_v, seen, n, nkv, head, elem, attn_bias, sink, s_len), 0, elem)


def _keys_seen(b: _Builder, key_pos: str, key_ok: str | None, query_at: str, lengths: str, causal: int,
               window: int) -> str:
    """Which keys each query sees ([B, 1, S, K] booleans): keys at `key_pos` ([B or 1, K]
    positions; `key_ok`, [B, K], whether each holds a token), queries at `query_at` ([B, S]);
    causal with an optional window of `window` keys, or every key of the entry (`lengths`)."""
    key_at = b.unsqueeze(key_pos, [1])  # [B or 1, 1, K]
    at = b.unsqueeze(query_at, [2])  # [B, S, 1]
    if causal:
        seen = b.op("Not", [b.op("Greater", [key_at, at])])
        if window > 0:  # the query and the window - 1 keys before it
            seen = b.op("And", [seen, b.op("Greater", [key_at, b.op("Sub", [at, b.ints(window)])])])
    else:  # every key of the entry (the query's position only gives the shape)
        seen = b.op("And", [b.op("Less", [key_at, b.unsqueeze(lengths, [1, 2])]), b.op("Equal", [at, at])])
    if key_ok is not None:
        seen = b.op("And", [seen, b.unsqueeze(key_ok, [1])])
    return seen


def _grouped_attention(b: _Builder, qh: str, key_k: str, key_v: str, seen: str, n: int, nkv: int, head: int,
                       elem: int, attn_bias: str, sink: str, s_len: str) -> str:
    """GroupQueryAttention's scores to output ([B, S, n * head], float32): Q ([B, n, S, h]) as
    [B, Nkv, G * S, h] against the keys and values ([B, Nkv, K, h]) as they are, the scale,
    softcap, attention bias, the `seen` mask, a sink column (head_sink or smooth_softmax), the
    softmax and the product with V."""
    groups = n // nkv
    seen = b.op("Tile", [b.unsqueeze(seen, [1]), b.ints(1, 1, groups, 1)])  # [B, 1, G * S, T], rows (g, s)
    qf, kf, vf = (b.op("Cast", [t], to=_F) if elem in _HALF else t for t in (qh, key_k, key_v))
    scale = float(b.attr("scale", 0.0)) or 1.0 / np.sqrt(head)
    qg = b.op("Reshape", [qf, b.ints(0, nkv, -1, head)])  # [B, Nkv, G * S, h]
    scores = b.op("Mul", [b.op("MatMul", [qg, b.op("Transpose", [kf], perm=[0, 1, 3, 2])]),
                          b.constant(np.float32(scale))])
    softcap = float(b.attr("softcap", 0.0))
    if softcap > 0:
        cap = b.constant(np.float32(softcap))
        scores = b.op("Mul", [b.op("Tanh", [b.op("Div", [scores, cap])]), cap])
    if attn_bias:
        bias = b.to_float(attn_bias)[0]
        if b.rank(bias) != 4:
            raise b.fail(f"attention_bias has rank {b.rank(bias)}, not 4")
        heads_dim = (b.info.get(attn_bias, (None, None))[0] or (None,) * 4)[1]
        if heads_dim == n:
            bias = b.op("Reshape", [bias, b.ints(0, nkv, -1, 0)])
        elif heads_dim == 1:
            bias = b.op("Tile", [bias, b.ints(1, 1, groups, 1)])
        else:
            raise Later(b.fail("the number of heads of attention_bias is not known"))
        scores = b.op("Add", [scores, bias])
    scores = b.op("Where", [seen, scores, b.constant(np.finfo(np.float32).min)])
    if sink or b.flag("smooth_softmax"):
        # a sink adds exp(sink) to the softmax's denominator: a column of it, dropped after
        col = b.to_float(sink)[0] if sink else b.constant(np.zeros(n, np.float32))
        rows = b.op("Concat", [b.ints(nkv, groups), s_len], axis=0)
        col = b.op("Reshape", [b.op("Expand", [b.op("Reshape", [col, b.ints(nkv, groups, 1)]), rows]), b.ints(1, nkv, -1, 1)])
        col = b.op("Expand", [col, b.op("Concat", [b.dim(scores, 0), b.ints(nkv), b.dim(scores, 2), b.ints(1)], axis=0)])
        probs = b.slice(b.op("Softmax", [b.op("Concat", [scores, col], axis=3)], axis=-1), 0, -1, 3)
    else:
        probs = b.op("Softmax", [scores], axis=-1)
    out = b.op("Reshape", [b.op("MatMul", [probs, vf]), b.ints(0, n, -1, head)])  # [B, N, S, h]
    out = b.op("Reshape", [b.op("Transpose", [out], perm=[0, 2, 1, 3]), b.ints(0, 0, -1)])
    return out


def _present(b: _Builder, past: str, new: str, past_b: str, length: str, elem: int) -> str:
    """The present ([B, Nkv, L, h], of element type `elem`; L = `length`, P + S or P): for batch
    entry b, rows below past_b ([B]) from the past, then the S new rows, then zeros (onnxruntime
    clears the rest). Without a past, the new rows."""
    if not past:
        return new
    s_len, p_len = b.dim(new, 2), b.dim(past, 2)
    t = b.unsqueeze(b.arange(b.constant(np.int64(0), np.int64), length), [0])  # [1, L]
    start = b.unsqueeze(past_b, [1])  # [B, 1]
    # P + t - past_b, clamped into the new rows' [P, P + S): a no-op where it is read (past_b <= t
    # < past_b + S), which proves every index in range (ops/ranges.py), so no check runs
    from_new = b.op("Sub", [b.op("Add", [t, p_len]), start])
    last_new = b.op("Sub", [b.op("Add", [p_len, s_len]), b.ints(1)])
    from_new = b.op("Min", [b.op("Max", [from_new, p_len]), last_new])
    blank_row = b.op("Add", [last_new, b.ints(1)])
    src = b.op("Where", [b.op("Less", [t, start]), t,
                         b.op("Where", [b.op("Less", [t, b.op("Add", [start, s_len])]), from_new, blank_row])])  # [B, L]
    return _rows_at(b, past, new, src, length, elem)


def _rows_at(b: _Builder, past: str, new: str, src: str, length: str, elem: int) -> str:
    """[B, Nkv, L, h] (L = `length`): row i of entry b is row src[b, i] ([B, L]) of the past's
    rows, then the new ones, then one blank (zero) row: a present, gathered."""
    blank = b.op("Expand", [b.const_of(0, elem), b.op("Concat", [b.dim(new, 0), b.dim(new, 1), b.ints(1), b.dim(new, 3)],
                                                              axis=0)])
    rows = b.op("Concat", [past, new, blank], axis=2)
    index = b.op("Expand", [b.unsqueeze(src, [1, 3]), b.op("Concat", [b.dim(new, 0), b.dim(new, 1), length, b.dim(new, 3)],
                                                            axis=0)])
    return b.op("GatherElements", [rows, index], axis=2)


def _window_cache(b: _Builder, past_k: str, past_v: str, kh: str, vh: str, before: str, lengths: str, window: int,
                  elem: int) -> tuple[str, str, str, str, str, str]:
    """onnxruntime's window-sized cache (sliding_window_cache): the past's C rows hold, in
    order, the most recent L(Tp) of the Tp tokens before this step, and the present the most
    recent L(T) of the T after it, the rest zeros, where L(T) = T up to C, and past it
    T - G * ceil((T - C) / G) with G = C - W + 1 (eviction frees G rows at once). `before` ([B])
    is Tp, `lengths` ([B]) is T; the new rows are the first min(S, T). Returns the presents, the
    keys and values attention reads (the past's rows, then the new ones: [B, Nkv, C + S, h]),
    each key's absolute position ([B, C + S]) and whether it holds a token ([B, C + S])."""
    zero = b.constant(np.int64(0), np.int64)
    c_len, s_len = b.dim(past_k, 2), b.dim(kh, 2)
    g = b.op("Add", [b.op("Sub", [c_len, b.ints(window)]), b.ints(1)])

    def resident(t: str) -> str:  # L(t), for t >= 0
        over = b.op("Sub", [t, c_len])
        evicted = b.op("Mul", [g, b.op("Div", [b.op("Add", [over, b.op("Sub", [g, b.ints(1)])]), g])])
        return b.op("Where", [b.op("Greater", [t, c_len]), b.op("Sub", [t, evicted]), t])

    new_rows = b.op("Sub", [lengths, before])  # min(S, T)
    kept_before, kept_after = resident(before), resident(lengths)
    first_kept = b.op("Sub", [before, kept_before])  # the position of the past's row 0
    rows_c, rows_s = b.arange(zero, c_len), b.arange(zero, s_len)
    key_pos = b.op("Concat", [b.op("Add", [b.unsqueeze(first_kept, [1]), b.unsqueeze(rows_c, [0])]),
                              b.op("Add", [b.unsqueeze(before, [1]), b.unsqueeze(rows_s, [0])])], axis=1)  # [B, C + S]
    key_ok = b.op("Concat", [b.op("Less", [b.unsqueeze(rows_c, [0]), b.unsqueeze(kept_before, [1])]),
                             b.op("Less", [b.unsqueeze(rows_s, [0]), b.unsqueeze(new_rows, [1])])], axis=1)
    # present row i holds position a = T - L(T) + i: the past's row a - first_kept before Tp, the
    # new row a - Tp from it, nothing from L(T) on (each clamped into its part: ops/ranges.py)
    at = b.op("Add", [b.unsqueeze(b.op("Sub", [lengths, kept_after]), [1]), b.unsqueeze(rows_c, [0])])  # [B, C]
    from_past = b.op("Min", [b.op("Max", [b.op("Sub", [at, b.unsqueeze(first_kept, [1])]), zero]),
                             b.op("Sub", [c_len, b.ints(1)])])
    last_new = b.op("Sub", [b.op("Add", [c_len, s_len]), b.ints(1)])
    from_new = b.op("Min", [b.op("Max", [b.op("Add", [b.op("Sub", [at, b.unsqueeze(before, [1])]), c_len]), c_len]), last_new])
    src = b.op("Where", [b.op("Less", [at, b.unsqueeze(before, [1])]), from_past, from_new])
    src = b.op("Where", [b.op("Less", [b.unsqueeze(rows_c, [0]), b.unsqueeze(kept_after, [1])]), src,
                         b.op("Add", [last_new, b.ints(1)])])  # the blank row

    present_k, present_v = _rows_at(b, past_k, kh, src, c_len, elem), _rows_at(b, past_v, vh, src, c_len, elem)
    key_k, key_v = b.op("Concat", [past_k, kh], axis=2), b.op("Concat", [past_v, vh], axis=2)  # [B, Nkv, C + S, h]
    return present_k, present_v, key_k, key_v, key_pos, key_ok


def window_rows(t: np.ndarray, capacity: int, window: int) -> np.ndarray:
    """L(T): the rows a window-sized cache of `capacity` rows holds after T tokens (onnxruntime's
    rule; _window_cache builds the same in the graph). verify reads it to know which rows
    onnxruntime leaves unwritten."""
    g = max(capacity - window + 1, 1)
    t = np.asarray(t, np.int64)
    return np.where(t > capacity, t - g * ((t - capacity + g - 1) // g), t)


def _check_in(b: _Builder, x: str, n: str, hint: str) -> str:
    """A run-time check that every value of int64 `x` lies in [0, n) (`n` a 1-element int64
    tensor), as zeros shaped like x for the caller to add into a value it uses (so that the
    check is not pruned as dead). 2x - n + 1 indexes an n-element tensor: it lies in [-n, n),
    the range a Gather accepts, exactly where x lies in [0, n), so dlcc's index checks report any
    other value (at compile time where the values fold, else after the inference) under the
    Gather named `.../{hint}N`."""
    index = b.op("Add", [b.op("Sub", [b.op("Mul", [x, b.ints(2)]), n]), b.ints(1)])
    return b.op("Gather", [b.op("Expand", [b.ints(0), n]), index], b.fresh(hint), axis=0)


#: Inputs each op takes (fewest, most), from onnxruntime's contrib schemas (onnx has none).
_INPUTS = {"Gelu": (1, 1), "BiasGelu": (2, 2), "FastGelu": (1, 2), "QuickGelu": (1, 1), "BiasAdd": (3, 3),
           "SkipLayerNormalization": (3, 5), "SkipSimplifiedLayerNormalization": (3, 4),
           "SimplifiedLayerNormalization": (2, 2), "LayerNormalization": (2, 3),
           "EmbedLayerNormalization": (7, 9), "Attention": (2, 7), "MultiHeadAttention": (1, 10),
           "QAttention": (5, 9), "QEmbedLayerNormalization": (18, 18),
           "RotaryEmbedding": (4, 4), "GroupQueryAttention": (7, 17), "FusedMatMul": (2, 2), "TransposeMatMul": (2, 2), "FusedGemm": (2, 3),
           "FusedConv": (2, 4)}

#: Inputs that must be given where an op's schema has optional ones before its last required one.
_REQUIRED = {"EmbedLayerNormalization": (0, 2, 3, 5, 6), "GroupQueryAttention": (0, 5, 6),
             "QEmbedLayerNormalization": (0, 2, 3, 5, 6, 8, 9, 11, 12, 13, 14, 16, 17)}

_LOWER = {
    "Gelu": _gelu, "BiasGelu": _gelu, "FastGelu": _fast_gelu, "QuickGelu": _quick_gelu, "BiasAdd": _bias_add,
    "SkipLayerNormalization": _skip_layer_norm, "SkipSimplifiedLayerNormalization": _skip_layer_norm,
    "SimplifiedLayerNormalization": _contrib_layer_norm, "LayerNormalization": _contrib_layer_norm,
    "EmbedLayerNormalization": _embed_layer_norm, "Attention": _attention, "MultiHeadAttention": _multi_head_attention,
    "RotaryEmbedding": _rotary_embedding, "GroupQueryAttention": _group_query_attention, "FusedMatMul": _fused_matmul, "TransposeMatMul": _fused_matmul,
    "FusedGemm": _fused_gemm, "FusedConv": _fused_conv,
    "QAttention": _q_attention, "QEmbedLayerNormalization": _q_embed_layer_norm,
}

#: The ops whose padded query rows onnxruntime leaves unspecified (GroupQueryAttention's rows
#: past an entry's length in a right-padded prompt read scores its kernel never wrote): sample
#: inputs give models with them masks without padding (Graph.full_masks).
PADDED_QUERIES_UNSPECIFIED = ("GroupQueryAttention",)

#: The ops rewritten after the dims are bound and the constants folded (frontend.import_model):
#: GroupQueryAttention's form of cache depends on total_sequence_length's value, which onnxruntime-
#: genai computes from the attention mask's shape.
LATE = ("GroupQueryAttention",)

#: The quantized ones: verify runs its reference with their integer products exact
#: (quantized.exact_products), as for the other quantization ops.
QUANTIZED = ("QAttention", "QEmbedLayerNormalization")

#: What `dlcc list ops` shows: the com.microsoft ops, and the ONNX-domain ones onnxruntime adds.
MICROSOFT = sorted(k for k in _LOWER if k not in ("SimplifiedLayerNormalization", "LayerNormalization"))

ONNX_DOMAIN = ("SimplifiedLayerNormalization", "LayerNormalization")

