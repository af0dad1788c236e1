"""Quantized models: QuantizeLinear, DequantizeLinear, the integer products and onnxruntime's
QOperator ops become float32 arithmetic at import, before anything is lowered.

Three kinds of int8 model come out of the tools people use (onnxruntime.quantization, and the
exporters that follow its formats):

- **QDQ** (quantize_static's default): float ops between DequantizeLinear and QuantizeLinear pairs;
- **dynamic** (quantize_dynamic): DynamicQuantizeLinear on activations, then MatMulInteger or
  ConvInteger, and a float rescale;
- **QOperator**: QLinearConv and QLinearMatMul, and com.microsoft's QGemm, QLinearAdd,
  QLinearMul, QLinearSigmoid, QLinearLeakyRelu, QLinearConcat, QLinearGlobalAveragePool,
  QLinearSoftmax and QLinearAveragePool (the last two in dlcc/quantized_qlinear.py).

dlcc has no int8 kernels. Each op is rewritten into the float arithmetic that onnxruntime's CPU
kernels perform, step for step, so that the result is the same and not merely close:

- quantize: `x / scale`, rounded half to even (Round), plus the zero point, clamped, cast; a
  requantize multiplies an exact int32 accumulator, converted to float, by the float scale
  `a_scale * b_scale / y_scale` computed in that order (MlasRequantizeOutput);
- dequantize: `(float(q) - float(zero_point)) * scale`;
- an integer product is a float32 MatMul or Conv of integer-valued operands (q − zero point, at
  most 255 in magnitude). A float32 sum of integers is exact while every partial sum stays below
  2**24. For a constant weight the bound is known exactly: the largest column sum of |b|, times
  the largest |a| the input's type allows. Where it could pass 2**24 the reduction is split into
  chunks that each stay below it, and the chunks are added in int32 (MAX_EXACT). So MatMulInteger
  and ConvInteger are exact, as onnxruntime's int32 accumulation is;
- a constant DequantizeLinear (a weight) is computed here, in numpy, once.

Where onnxruntime is itself not exact, dlcc does not pretend to be: values a float op computes
before a QuantizeLinear may differ in the last bit from onnxruntime's (another summation order), and
a value within that bit of a rounding tie is quantized one step apart. `dlcc verify` reports such
steps as what they are (verify.py's quantization judge).

Every node made here stays float32 at every precision (Graph.float32_nodes): a 16-bit type holds
neither a quantized value's sum nor `x / scale` exactly enough to round it as the model says.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from .errors import ModelError, UnsupportedDtypesError
from .frontend import HALF_TYPES
from .rewrite import Builder, Later, raise_opset, rewrite_rounds
from .spectral import _shapes_and_types

#: A float32 sum of integers is exact while every partial sum stays below this.
MAX_EXACT = 2 ** 24

#: Standard ops rewritten here.
STANDARD = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger",
            "ConvInteger", "QLinearMatMul", "QLinearConv"}
#: onnxruntime's quantization ops (domain com.microsoft) rewritten here.
MICROSOFT = {"QuantizeLinear", "DequantizeLinear", "QGemm", "QLinearAdd", "QLinearMul",
             "QLinearSigmoid", "QLinearLeakyRelu", "QLinearConcat", "QLinearGlobalAveragePool",
             "QLinearSoftmax", "QLinearAveragePool", "DynamicQuantizeMatMul", "MatMulIntegerToFloat",
             "DynamicQuantizeLSTM", "MatMulNBits", "GatherBlockQuantized"}

_F = onnx.TensorProto.FLOAT
_I32 = onnx.TensorProto.INT32
#: Integer types a quantized tensor may have here, with their ranges.
_RANGE = {onnx.TensorProto.UINT8: (0, 255), onnx.TensorProto.INT8: (-128, 127),
          onnx.TensorProto.INT16: (-2 ** 15, 2 ** 15 - 1), onnx.TensorProto.UINT16: (0, 2 ** 16 - 1),
          onnx.TensorProto.INT32: (-2 ** 31, 2 ** 31 - 1),
          onnx.TensorProto.INT4: (-8, 7), onnx.TensorProto.UINT4: (0, 15),  # (held in 8 bits: held_types.py)
          onnx.TensorProto.INT2: (-2, 1), onnx.TensorProto.UINT2: (0, 3)}
#: The float types QuantizeLinear rounds onto (a Cast with `saturate`, held_types.py), whose
#: zero point DequantizeLinear ignores (onnx.reference's rule: for float8 it must be 0).
_FLOAT_Q = (onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT8E4M3FNUZ, onnx.TensorProto.FLOAT8E5M2,
            onnx.TensorProto.FLOAT8E5M2FNUZ, onnx.TensorProto.FLOAT4E2M1)
_NAMES = {onnx.TensorProto.UINT8: "uint8", onnx.TensorProto.INT8: "int8", onnx.TensorProto.INT16: "int16",
          onnx.TensorProto.UINT16: "uint16", onnx.TensorProto.INT32: "int32"}


def is_quantized_op(node: onnx.NodeProto) -> bool:
    if node.domain in ("", "ai.onnx"):
        return node.op_type in STANDARD
    return node.domain == "com.microsoft" and node.op_type in MICROSOFT


def lower_quantized(model: onnx.ModelProto, infer, weights: dict[str, np.ndarray] | None,
                    path, only: set[str] | None = None,
                    known: dict[str, tuple] | None = None, partial: bool = False) -> tuple[onnx.ModelProto, list[str], set[str]]:
    """Rewrite every quantization op of the main graph (in place) into float32 arithmetic.
    `infer` is a lenient shape inference; `weights` holds the values split_weights took out of
    the graph and receives the dequantized weights (None: they become initializers, for a model
    that onnxruntime runs as it is). `only` limits the rewrite to those op types. Returns (the
    model, notes for the pass log, the names of the nodes made: Graph.float32_nodes). `known`
    gives the shapes and element types of tensors that inference may not find
    ({name: (shape, elem)}: onnxruntime's, quantized.tensor_types). `partial`: rewrite_rounds'.

    Runs in rounds: an op whose input's rank is not known yet (the output of a com.microsoft op,
    which onnx's shape inference does not know) waits for the next round."""
    from .frontend import opset_of

    def chosen(n: onnx.NodeProto) -> bool:
        return is_quantized_op(n) and (only is None or n.op_type in only)

    notes: list[str] = []
    if any(chosen(n) for n in model.graph.node) and opset_of(model) < 11:
        # The arithmetic needs opset 11 (Round, Equal on floats).
        model, note = raise_opset(model, 11, path, "quantized ops are computed with opset 11's Round")
        notes.append(note)
    # Shapes are inferred afresh: a model's own value_info (symbolic dims written by its
    # exporter or quantizer) would otherwise hide what the bound input shapes imply.
    if any(chosen(n) for n in model.graph.node):
        del model.graph.value_info[:]
    made, counts = rewrite_rounds(model, infer, weights, path, chosen, _lower, _Builder, known, partial=partial)
    if counts:
        model = _float_pools(model, infer)
    notes += [f"import: quantized ops computed in float32 ({', '.join(f'{n} {op}' for op, n in sorted(counts.items()))})"] if counts else []
    return model, notes, made


#: The ops with an integer product. onnxruntime's CPU kernels for uint8 x int8 products add pairs
#: of products in int16 with saturation on x86 without VNNI (AVX2's vpmaddubsw): a row of 255s
#: times a column of eight 127s gives 131068, not 259080, in MatMulInteger, QLinearMatMul,
#: QLinearConv, QGemm, MatMulIntegerToFloat, DynamicQuantizeMatMul and DynamicQuantizeLSTM.
#: verify's reference therefore runs them as this module writes them (exact_products);
#: tests/test_quantized.py checks each against onnxruntime's own kernel on data where it does
#: not saturate.
PRODUCTS = {"MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv", "QGemm",
            "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM"}


def float_nbits(m: onnx.ModelProto) -> None:
    """MatMulNBits at its float product in place: accuracy_level 4 is onnxruntime's int8
    approximation of it, which dlcc does not compute (quantized_blocks.py)."""
    for n in m.graph.node:
        if n.op_type == "MatMulNBits" and n.domain == "com.microsoft":
            for a in n.attribute:
                if a.name == "accuracy_level" and a.i == 4:
                    a.i = 0


def exact_products(model: onnx.ModelProto, path="model", feeds: dict | None = None) -> onnx.ModelProto:
    """A copy of `model` whose integer products (PRODUCTS, and QAttention's) are exact float32
    products of their integer operands, every other op as it was: what verify gives onnxruntime
    to run. The `feeds` fix the graph inputs' dims first, so that an LSTM's steps are known; where onnx's
    inference cannot size an LSTM's input (a Reshape to a shape computed after another LSTM),
    onnxruntime's own run of the model on the feeds does."""
    from onnx import shape_inference

    m = onnx.ModelProto()
    m.CopyFrom(model)
    shapes = {k: np.shape(v) for k, v in (feeds or {}).items()}
    for vi in m.graph.input:
        if vi.name in shapes and vi.type.tensor_type.HasField("shape"):
            dims = vi.type.tensor_type.shape.dim
            if len(dims) == len(shapes[vi.name]):
                for dim, n in zip(dims, shapes[vi.name]):
                    dim.Clear()
                    dim.dim_value = int(n)
    float_nbits(m)

    def infer(x: onnx.ModelProto) -> onnx.ModelProto:
        # Ranks are what the rewrite reads (an LSTM's input shape comes from onnxruntime's run,
        # `known`); onnx 1.23's data propagation mis-sizes some computed Reshapes.
        return shape_inference.infer_shapes(x, check_type=False, strict_mode=False)

    # QAttention's product becomes a MatMulInteger (fused_ops.py), made exact below with the rest;
    # the ranks of its inputs that follow other com.microsoft ops come from onnxruntime
    from .fused_ops import lower_fused

    if any(n.op_type == "QAttention" and n.domain == "com.microsoft" for n in m.graph.node):
        unsized = _unsized(infer(m)) if feeds else set()
        wanted = [i for n in m.graph.node if n.op_type == "QAttention" for i in n.input if i in unsized]
        # (where onnxruntime cannot run the model, its error says so: verify reports no reference)
        m = lower_fused(m, infer, None, path, only=("QAttention",), known=_known(m, wanted, feeds, strict=True))[0]
    if not any(is_quantized_op(n) and n.op_type in PRODUCTS for n in m.graph.node):
        return m

    # The shapes onnx's inference cannot give (an LSTM's input; a product's operand after a
    # com.microsoft op such as QLinearSoftmax, which onnx has no schema for) come from onnxruntime.
    wanted = []
    if feeds:  # (without feeds onnxruntime cannot run: no inference here to throw away)
        unsized = _unsized(infer(m))
        wanted = [n.input[0] for n in m.graph.node if n.op_type == "DynamicQuantizeLSTM" and is_quantized_op(n)]
        wanted += [i for n in m.graph.node if is_quantized_op(n) and n.op_type in PRODUCTS for i in n.input
                   if i in unsized]
    return lower_quantized(m, infer, None, path, only=PRODUCTS, known=_known(m, wanted, feeds))[0]


def _known(m: onnx.ModelProto, wanted: list[str], feeds, strict: bool = False) -> dict[str, tuple]:
    """{name: (shape, elem)} of tensors `wanted` in onnxruntime's run of `m` on `feeds`. Where it
    cannot run, `strict` raises its error; otherwise there are none (inference's shapes stand,
    and an unknown one is reported as such)."""
    if not wanted or not feeds:
        return {}
    try:
        return {n: (shape, elem) for n, (elem, shape) in tensor_types(m, wanted, feeds).items()}
    except Exception:
        if strict:
            raise
        return {}


def _unsized(model: onnx.ModelProto) -> set[str]:
    """The tensors made by `model`'s nodes that its value_info (after inference) gives no shape."""
    sized = {vi.name for vi in (*model.graph.value_info, *model.graph.output, *model.graph.input)
             if vi.type.tensor_type.HasField("shape")}
    return {o for n in model.graph.node for o in n.output if o and o not in sized}


def tensor_types(model: onnx.ModelProto, names: list[str], feeds: dict) -> dict[str, tuple[int, list]]:
    """The element type and shape of tensors `names` in onnxruntime's run (optimizations off) of
    `model` on `feeds`: what onnx's inference cannot say of the com.microsoft ops' outputs, or of
    a Reshape to a shape computed after another LSTM. Raises what onnxruntime raises."""
    import onnxruntime as ort

    names = list(dict.fromkeys(names))
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    m.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names if n not in have)
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    ins = {i.name for i in sess.get_inputs()}
    vals = sess.run(names, {k: v for k, v in feeds.items() if k in ins})
    # (the session's own type names: its binding returns float8 as raw uint8 arrays)
    declared = {o.name: _ORT_TYPES.get(o.type) for o in sess.get_outputs()}
    return {n: (declared.get(n) or helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype), list(np.shape(v)))
            for n, v in zip(names, vals)}


#: onnxruntime's names of element types ("tensor(float8e4m3fn)") and ONNX's.
_ORT_TYPES = {f"tensor({k.lower()})": v for k, v in onnx.TensorProto.DataType.items()}


_Later = Later


class _Builder(Builder):
    """A Builder with the quantization arithmetic: scales and zero points placed along their
    axis, quantize and dequantize steps, and exact products' bounds."""

    # -- helpers --------------------------------------------------------------------------
    def trailing(self, axis: int, of: str) -> int:
        """How many size-1 dims follow `axis` in tensor `of`: a negative axis needs no rank, so a
        per-row or per-column vector is placed even where `of`'s rank is not known yet."""
        return -axis - 1 if axis < 0 else self.rank(of) - axis - 1

    def per_axis(self, name: str, axis: int, of: str) -> str:
        """A scale or zero point (a scalar, or 1-D along `axis` of tensor `of`) shaped to broadcast
        against `of`, as float32."""
        if not name:
            return ""
        f = self.as_float(name)
        c = self.const(f)
        if c is not None:
            return self.constant(c.reshape([-1] + [1] * self.trailing(axis, of))) if c.ndim == 1 and c.size > 1 else f
        if self.rank(name) == 1 and self.trailing(axis, of) > 0:
            shape = self.constant(np.array([-1] + [1] * self.trailing(axis, of), np.int64), np.int64)
            return self.op("Reshape", [f, shape])
        return f

    def along(self, v: np.ndarray, axis: int, of: str) -> np.ndarray:
        """A constant scale or zero point shaped as per_axis shapes it."""
        return v.reshape([-1] + [1] * self.trailing(axis, of)) if v.ndim == 1 and v.size > 1 else v

    def int_type(self, name: str, default: int = onnx.TensorProto.UINT8) -> int:
        t = self.elem(name) if name else default
        t = default if t is None else t
        if t not in _RANGE:
            raise self.fail(f"quantized type {onnx.TensorProto.DataType.Name(t)} is not supported "
                            "(dlcc holds uint8, int8, int16, uint16, int32, int4, uint4, int2, uint2 and, in "
                            "QuantizeLinear and DequantizeLinear, the float8 types and float4e2m1)",
                            UnsupportedDtypesError)
        return t

    def quantize(self, scaled: str, zp: str, qtype: int, out: str) -> str:
        """round(scaled) + zp, clamped to qtype's range, cast: the rounding step of QuantizeLinear
        and of every requantize (half to even, as onnxruntime's cvtps and nearbyint do)."""
        lo, hi = _RANGE[qtype]
        r = self.op("Round", [scaled])
        if zp:
            r = self.op("Add", [r, zp])
        r = self.op("Min", [self.op("Max", [r, self.constant(np.float32(lo))]), self.constant(np.float32(hi))])
        return self.op("Cast", [r], out, to=qtype)

    def dequantize(self, q: str, scale: str, zp: str, axis: int = 1) -> str:
        """(float(q) - float(zp)) * scale, as a float32 tensor; a constant q is computed here."""
        cq, cs, cz = self.const(q), self.const(scale), self.const(zp) if zp else np.zeros((), np.float32)
        if cq is not None and cs is not None and cz is not None:
            s, z = self.along(cs, axis, q), self.along(cz, axis, q)
            return self.constant((cq.astype(np.float32) - z.astype(np.float32)) * s.astype(np.float32))
        x = self.as_float(q)
        if zp:
            x = self.op("Sub", [x, self.per_axis(zp, axis, q)])
        return self.op("Mul", [x, self.per_axis(scale, axis, q)])

    def centred(self, q: str, zp: str, axis: int) -> tuple[str, float, np.ndarray | None]:
        """q − zp as float32 (integer values), the largest |q − zp| it can hold, and its value
        when constant."""
        qtype = self.int_type(q)
        lo, hi = _RANGE[qtype]
        cq, cz = self.const(q), (self.const(zp) if zp else np.zeros((), np.int32))
        if cq is not None and cz is not None:
            # (made once, and its largest magnitude found once: an unrolled LSTM centres the same
            # weight at every step)
            key = ("centred", q, zp, axis)
            name = self.shared(key, lambda: cq.astype(np.float32) - self.along(cz, axis, q).astype(np.float32))
            v = self.consts[name]
            most = ("max |centred|",) + key
            if most not in self.cache:
                self.cache[most] = (name, float(np.abs(v).max(initial=0.0)))
            return name, self.cache[most][1], v
        bound = float(max(abs(lo - int(cz.min())), abs(hi - int(cz.max())))) if cz is not None and cz.size else float(hi - lo)
        x = self.as_float(q)
        if zp:
            x = self.op("Sub", [x, self.per_axis(zp, axis, q)])
        return x, bound, None

    def scale_product(self, *names: str, divide: str = "") -> str:
        """The product of scales (scalars or 1-D) in the given order, divided by `divide`
        (ComputeOutputScale's `a_scale * b_scale[i] / y_scale`), in float32 arithmetic: here
        when they are constants, else in the plan."""
        vals = [self.const(n) for n in names + ((divide,) if divide else ())]
        if all(v is not None for v in vals):
            acc = vals[0].astype(np.float32)
            for v in vals[1:len(names)]:
                acc = acc * v.astype(np.float32)
            return self.constant(acc / vals[-1].astype(np.float32) if divide else acc)
        acc = self.as_float(names[0])
        for n in names[1:]:
            acc = self.op("Mul", [acc, self.as_float(n)])
        acc = self.op("Div", [acc, self.as_float(divide)]) if divide else acc
        return self.note(acc, (None,), _F)


#: Inputs each op takes (fewest, most). The standard ops' counts are the ONNX checker's; onnx
#: has no schemas for com.microsoft's, so they are checked here (onnxruntime's contrib schemas).
_INPUTS = {"QGemm": (6, 9), "QLinearAdd": (7, 8), "QLinearMul": (7, 8), "QLinearSigmoid": (4, 5),
           "QLinearLeakyRelu": (4, 5), "QLinearGlobalAveragePool": (4, 5), "DynamicQuantizeMatMul": (3, 5),
           "MatMulIntegerToFloat": (4, 7), "QuantizeLinear": (2, 3), "DequantizeLinear": (2, 3),
           "DynamicQuantizeLSTM": (12, 12), "QLinearSoftmax": (4, 5), "QLinearAveragePool": (4, 5),
           "MatMulNBits": (3, 6), "GatherBlockQuantized": (3, 4)}


def _lower(b: _Builder) -> None:
    _check_inputs(b)
    _LOWER[b.node.op_type](b)


def _check_inputs(b: _Builder) -> None:
    """What the ONNX checker cannot see in a quantized node: com.microsoft input counts, a
    QLinearConcat's (tensor, scale, zero point) triples, float inputs where a float is
    quantized, and a per-axis scale that fits its axis."""
    op, n = b.node.op_type, len(b.node.input)
    lo, hi = _INPUTS.get(op, (0, 1 << 30))
    if not lo <= n <= hi:
        raise b.fail(f"takes {lo} to {hi} inputs, not {n}")
    if op == "QLinearConcat" and (n < 5 or (n - 2) % 3):
        raise b.fail(f"takes the output's scale and zero point, then a (tensor, scale, zero point) triple per input; "
                     f"{n} inputs are not that")
    # (QuantizeLinear takes float16 and bfloat16 too from opset 19, divided by the scale in float32
    # as a half model computes: onnxruntime on the widened model is verify's reference for one)
    floats = (None, _F) + (HALF_TYPES if op == "QuantizeLinear" else ())
    if op in ("QuantizeLinear", "DynamicQuantizeLinear", "DynamicQuantizeMatMul") and b.elem(b.input(0)) not in floats:
        raise b.fail(f"quantizes a float tensor, not {onnx.TensorProto.DataType.Name(b.elem(b.input(0)))}")
    if op == "DequantizeLinear" and n > 2 and b.input(2) and None not in (b.elem(b.input(0)), b.elem(b.input(2))) \
            and b.elem(b.input(0)) != b.elem(b.input(2)):
        raise b.fail("the zero point's type is not the quantized tensor's")
    if op == "QLinearGlobalAveragePool":
        shape = b.info.get(b.input(0), (None, None))[0]
        if shape is not None and len(shape) < 3:
            raise b.fail(f"pools a tensor of rank 3 or more, not {len(shape)}")
    if op in ("QuantizeLinear", "DequantizeLinear") and not int(b.attrs.get("block_size", 0)):
        shape, scale = b.info.get(b.input(0), (None, None))[0], b.const(b.input(1))
        if shape is None or scale is None or scale.size <= 1:
            return
        axis = int(b.attrs.get("axis", 1))
        if not -len(shape) <= axis < len(shape):
            raise b.fail(f"axis {axis} is outside the input's {len(shape)} dims")
        if scale.ndim != 1 or (shape[axis] is not None and scale.size != shape[axis]):
            raise b.fail(f"a scale of shape {list(scale.shape)} does not run along axis {axis} of size {shape[axis]}")


def _float_pools(model: onnx.ModelProto, infer) -> onnx.ModelProto:
    """MaxPool on int8 or uint8 (QOperator models pool quantized values) as MaxPool on their
    float32 values, cast back: a maximum of integers is exact in float32, and dlcc's MaxPool
    kernels are float."""
    types = _shapes_and_types(infer(model).graph)
    g = model.graph
    if not any(n.op_type == "MaxPool" and types.get(n.input[0], (None, 0))[1] in _NAMES for n in g.node):
        return model
    out = []
    for n in g.node:
        t = types.get(n.input[0], (None, 0))[1] if n.op_type == "MaxPool" and n.domain in ("", "ai.onnx") else 0
        if t not in (onnx.TensorProto.UINT8, onnx.TensorProto.INT8):
            out.append(n)
            continue
        label = n.name or n.output[0]
        wide_in, wide_out = f"{n.output[0]}/float_in", f"{n.output[0]}/float_out"
        pool = onnx.NodeProto()
        pool.CopyFrom(n)
        pool.input[0], pool.output[0] = wide_in, wide_out
        out += [helper.make_node("Cast", [n.input[0]], [wide_in], name=f"{label}/to_float", to=_F), pool,
                helper.make_node("Cast", [wide_out], [n.output[0]], name=f"{label}/from_float", to=t)]
    del g.node[:]
    g.node.extend(out)
    del g.value_info[:]
    return model


def _no_blocks(b: _Builder) -> None:
    """Blocked quantization (opset 21's block_size) is computed only for constants."""
    if int(b.attrs.get("block_size", 0)):
        from .ops.context import LoweringError

        raise b.fail("blocked quantization (block_size) of a computed tensor is not supported", LoweringError)


# -- the standard ops ----------------------------------------------------------------------

def _dequantize_linear(b: _Builder) -> None:
    x, scale, zp = b.input(0), b.input(1), b.input(2)
    axis = int(b.attrs.get("axis", 1))
    block = int(b.attrs.get("block_size", 0))
    cq, cs = b.const(x), b.const(scale)
    if block and cq is not None and cs is not None:
        cz = b.const(zp) if zp and b.elem(x) not in _FLOAT_Q else np.zeros_like(cs)
        ax = axis % cq.ndim
        s = np.repeat(cs, block, axis=ax).take(range(cq.shape[ax]), axis=ax)
        z = np.repeat(cz, block, axis=ax).take(range(cq.shape[ax]), axis=ax)
        y = b.constant((cq.astype(np.float32) - z.astype(np.float32)) * s.astype(np.float32))
    elif b.elem(x) in _FLOAT_Q:
        _no_blocks(b)
        y = b.dequantize(x, scale, "", axis)
    else:
        _no_blocks(b)
        b.int_type(x)
        y = b.dequantize(x, scale, zp, axis)
    out_type = b.elem(scale) or _F
    b.op("Cast" if out_type != _F else "Identity", [y], b.node.output[0], **({"to": out_type} if out_type != _F else {}))


def _quantize_linear(b: _Builder) -> None:
    x, scale, zp = b.input(0), b.input(1), b.input(2)
    axis = int(b.attrs.get("axis", 1))
    _no_blocks(b)
    default = int(b.attrs.get("output_dtype", 0)) or onnx.TensorProto.UINT8
    v = b.op("Div", [b.as_float(x), b.per_axis(scale, axis, x)])
    if (b.elem(zp) if zp else default) in _FLOAT_Q:  # x / scale onto the float type's values
        qtype = b.elem(zp) if zp else default
        if zp and qtype == onnx.TensorProto.FLOAT4E2M1:  # (float8's zero point is 0; float4's is added)
            v = b.op("Add", [v, b.per_axis(zp, axis, x)])
        b.op("Cast", [v], b.node.output[0], to=qtype, saturate=int(b.attrs.get("saturate", 1)))
        return
    qtype = b.int_type(zp, default=default)
    b.quantize(v, b.per_axis(zp, axis, x), qtype, b.node.output[0])


def _dynamic_quantize_linear(b: _Builder) -> None:
    """onnxruntime's GetQuantizationParameter: the range widened to include 0, scale
    (max − min) / 255 (1 where the range is empty), zero point round(clamp(0 − min / scale))
    with std::round (half away from zero; the value is never negative), then QuantizeLinear."""
    x = b.as_float(b.input(0))
    y, y_scale, y_zp = (list(b.node.output) + ["", ""])[:3]
    zero = b.constant(np.float32(0))
    hi = b.op("Max", [b.op("ReduceMax", [x], keepdims=0), zero])
    lo = b.op("Min", [b.op("ReduceMin", [x], keepdims=0), zero])
    span = b.op("Sub", [hi, lo])
    scale = b.op("Where", [b.op("Equal", [hi, lo]), b.constant(np.float32(1)),
                          b.op("Div", [span, b.constant(np.float32(255))])], y_scale or None)
    z = b.op("Min", [b.op("Max", [b.op("Sub", [zero, b.op("Div", [lo, scale])]), zero]), b.constant(np.float32(255))])
    down = b.op("Floor", [z])
    tie = b.op("Equal", [b.op("Sub", [z, down]), b.constant(np.float32(0.5))])
    zf = b.op("Where", [tie, b.op("Ceil", [z]), b.op("Round", [z])])
    if y_zp:
        b.op("Cast", [zf], y_zp, to=onnx.TensorProto.UINT8)
    b.quantize(b.op("Div", [x, scale]), zf, onnx.TensorProto.UINT8, y or b.fresh("y"))


def _integer_product(b: _Builder, op: str, a: str, a_zp: str, w: str, w_zp: str, attrs: dict | None = None) -> str:
    """MatMul or Conv of (a − a_zp) and (w − w_zp) as an exact int32 tensor (module docstring:
    chunks of the reduction that each stay below MAX_EXACT, added in int32)."""
    if op == "MatMul":
        # a_zero_point is a scalar or one per row of A (axis -2); b_zero_point one per column.
        af, a_max, _ = b.centred(a, a_zp, axis=-2)
        wf, w_max, wv = b.centred(w, w_zp, axis=-1)
        k_axis = -2 if b.rank(w) > 1 else -1
        k = (wv.shape[k_axis] if wv is not None else None)
    else:
        af, a_max, _ = b.centred(a, a_zp, axis=1)
        wf, w_max, wv = b.centred(w, w_zp, axis=0)
        k = None
    if wv is not None:
        # The exact bound: the largest sum of |w| that one output element reduces over.
        if op == "MatMul":
            sums = np.abs(wv).sum(axis=k_axis) if wv.ndim > 1 else np.abs(wv).sum(keepdims=True)
        else:
            sums = np.abs(wv).reshape(wv.shape[0], -1).sum(axis=1)
        exact = a_max * float(sums.max(initial=0.0)) < MAX_EXACT
    else:
        k = _reduced_length(b, w, op)
        exact = a_max * w_max * k < MAX_EXACT
    attrs = attrs or {}
    if exact:
        return b.op("Cast", [b.op(op, [af, wf], **attrs)], to=_I32)
    if wv is None:
        raise b.fail("an integer product of two computed operands whose float32 sum could be inexact "
                     f"(a reduction of {k} terms) is not supported")
    total = None
    for k, mask in enumerate(_chunks(b, wv, a_max, op)):
        chunk = b.shared(("chunk", af if wv is None else wf, k), lambda: wv * mask)
        part = b.op("Cast", [b.op(op, [af, chunk], **attrs)], to=_I32)
        total = part if total is None else b.op("Add", [total, part])
    return total


def _reduced_length(b: _Builder, w: str, op: str) -> int:
    shape = b.info.get(w, (None, None))[0]
    if shape is None or any(d is None for d in shape):  # (known once what computes it is rewritten)
        raise _Later(b.fail("the reduction length of an integer product with a computed operand is not known"))
    if op == "MatMul":
        return int(shape[-2] if len(shape) > 1 else shape[0])
    return int(np.prod(shape[1:]))


def _chunks(b: _Builder, wv: np.ndarray, a_max: float, op: str):
    """0/1 masks over the weight that split its reduction into consecutive runs whose partial
    sums of |w| times a_max stay below MAX_EXACT, for every output element at once."""
    if op == "MatMul":
        w2 = np.abs(wv if wv.ndim > 1 else wv[:, None])
        w2 = np.moveaxis(w2, -2, 0).reshape(w2.shape[-2], -1)  # [K, everything else]
    else:
        w2 = np.abs(wv).reshape(wv.shape[0], -1).T  # [C/g*kh*kw, M]
    limit = MAX_EXACT / max(a_max, 1.0)
    runs, start, acc = [], 0, np.zeros(w2.shape[1], np.float64)
    for i in range(w2.shape[0]):
        if (acc + w2[i]).max(initial=0.0) >= limit:
            runs.append((start, i))
            start, acc = i, np.zeros_like(acc)
        acc += w2[i]
    runs.append((start, w2.shape[0]))
    for s, e in runs:
        m = np.zeros(w2.shape[0], np.float32)
        m[s:e] = 1
        if op == "MatMul":
            shape = [1] * wv.ndim
            shape[-2 if wv.ndim > 1 else 0] = -1
            yield m.reshape(shape)
        else:
            yield m.reshape((1,) + wv.shape[1:])


def _conv_attrs(b: _Builder) -> dict:
    return {k: v for k, v in b.attrs.items() if k in ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")}


def _matmul_integer(b: _Builder) -> None:
    acc = _integer_product(b, "MatMul", b.input(0), b.input(2), b.input(1), b.input(3))
    b.op("Identity", [acc], b.node.output[0])


def _conv_integer(b: _Builder) -> None:
    acc = _integer_product(b, "Conv", b.input(0), b.input(2), b.input(1), b.input(3), _conv_attrs(b))
    b.op("Identity", [acc], b.node.output[0])


def _requantize(b: _Builder, acc: str, scale: str, y_zp: str, axis: int, of: str, qtype: int) -> None:
    """MlasRequantizeOutput: float(acc) * scale, rounded, plus the zero point, clamped. A 1-D
    scale runs along `axis` of tensor `of` (the weight, whose rank the output has)."""
    v = b.op("Mul", [b.op("Cast", [acc], to=_F), b.per_axis(scale, axis, of)])
    b.quantize(v, b.per_axis(y_zp, axis, of), qtype, b.node.output[0])


def _qlinear_matmul(b: _Builder) -> None:
    a, a_s, a_zp, w, w_s, w_zp, y_s, y_zp = (b.input(i) for i in range(8))
    acc = _integer_product(b, "MatMul", a, a_zp, w, w_zp)
    _requantize(b, acc, b.scale_product(a_s, w_s, divide=y_s), y_zp, -1, w, b.int_type(y_zp))


def _qlinear_conv(b: _Builder) -> None:
    x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp, bias = (b.input(i) for i in range(9))
    acc = _integer_product(b, "Conv", x, x_zp, w, w_zp, _conv_attrs(b))
    rank = b.rank(w)  # the output's, as the input's
    if bias:
        acc = b.op("Add", [acc, _channel_int32(b, bias, rank)])
    _requantize(b, acc, b.scale_product(x_s, w_s, divide=y_s), y_zp, 1, w, b.int_type(y_zp))


def _channel_int32(b: _Builder, bias: str, rank: int) -> str:
    c = b.const(bias)
    if c is not None:
        return b.constant(c.astype(np.int32).reshape([-1] + [1] * (rank - 2)), np.int32)
    shape = b.constant(np.array([-1] + [1] * (rank - 2), np.int64), np.int64)
    return b.op("Reshape", [b.op("Cast", [bias], to=_I32) if b.elem(bias) != _I32 else bias, shape])


# -- onnxruntime's QOperator ops (com.microsoft) --------------------------------------------

def _qgemm(b: _Builder) -> None:
    """QGemm(A, a_s, a_zp, B, b_s, b_zp, C?, y_s?, y_zp?): an int32 product plus the int32 bias C,
    then scaled by alpha·a_s·b_s: requantized with y_s when it is given, else float32 out."""
    a, a_s, a_zp, w, w_s, w_zp, c, y_s, y_zp = (b.input(i) for i in range(9))
    if int(b.attrs.get("transA", 0)):
        a = b.op("Transpose", [a], perm=[1, 0])
    if int(b.attrs.get("transB", 0)):
        cw = b.const(w)
        w = b.constant(cw.T, cw.dtype) if cw is not None else b.op("Transpose", [w], perm=[1, 0])
        cz = b.const(w_zp) if w_zp else None
        if cz is not None:
            w_zp = b.constant(cz, cz.dtype)
        b.info[w] = ((None, None), b.elem(b.input(3)))
        b.info[w] = (b.info[w][0], b.elem(b.input(3)))
    acc = _integer_product(b, "MatMul", a, a_zp, w, w_zp)
    if c:
        cc = b.const(c)
        acc = b.op("Add", [acc, b.constant(cc.astype(np.int32), np.int32) if cc is not None else c])
    alpha = float(b.attrs.get("alpha", 1.0))
    names = ([b.constant(np.float32(alpha))] if alpha != 1.0 else []) + [a_s, w_s]
    if y_s:
        _requantize(b, acc, b.scale_product(*names, divide=y_s), y_zp, -1, w, b.int_type(y_zp))
    else:
        b.op("Mul", [b.op("Cast", [acc], to=_F), b.scale_product(*names)], b.node.output[0])


def _qlinear_binary(b: _Builder) -> None:
    """QLinearAdd: a_s/c_s·(a − a_zp) + b_s/c_s·(b − b_zp), rounded, plus c_zp (MlasQLinearAdd);
    QLinearMul: a_s·b_s/c_s·(a − a_zp)·(b − b_zp), rounded, plus c_zp."""
    a, a_s, a_zp, x, x_s, x_zp, c_s, c_zp = (b.input(i) for i in range(8))
    af, _, _ = b.centred(a, a_zp, 1)
    xf, _, _ = b.centred(x, x_zp, 1)
    if b.node.op_type == "QLinearAdd":
        v = b.op("Add", [b.op("Mul", [b.scale_product(a_s, divide=c_s), af]),
                         b.op("Mul", [b.scale_product(x_s, divide=c_s), xf])])
    else:
        v = b.op("Mul", [b.scale_product(a_s, x_s, divide=c_s), b.op("Mul", [af, xf])])
    b.quantize(v, b.as_float(c_zp) if c_zp else "", b.int_type(c_zp or a), b.node.output[0])


def _qlinear_unary(b: _Builder) -> None:
    """QLinearSigmoid, QLinearLeakyRelu: onnxruntime builds a 256-entry table as dequantize, the
    float function, quantize; the same three steps per element give the same values."""
    x, x_s, x_zp, y_s, y_zp = (b.input(i) for i in range(5))
    v = b.dequantize(x, x_s, x_zp)
    if b.node.op_type == "QLinearSigmoid":
        v = b.op("Sigmoid", [v])
    else:
        v = b.op("LeakyRelu", [v], alpha=float(b.attrs.get("alpha", 0.01)))
    b.quantize(b.op("Div", [v, b.as_float(y_s)]), b.as_float(y_zp) if y_zp else "", b.int_type(y_zp or x), b.node.output[0])


def _qlinear_concat(b: _Builder) -> None:
    """QLinearConcat(y_s, y_zp, (x, x_s, x_zp)...): each input requantized to the output's scale
    (dequantize, then quantize, as onnxruntime's table does), then concatenated. An input already
    in the output's scale and zero point is taken as it is."""
    y_s, y_zp = b.input(0), b.input(1)
    qtype = b.int_type(y_zp)
    parts = []
    ins = list(b.node.input[2:])
    for i in range(0, len(ins), 3):
        x, x_s, x_zp = ins[i:i + 3]
        same = all(b.const(p) is not None and b.const(q) is not None and np.array_equal(b.const(p), b.const(q))
                   for p, q in ((x_s, y_s), (x_zp, y_zp)))
        if same:
            parts.append(x)
            continue
        v = b.op("Div", [b.dequantize(x, x_s, x_zp), b.as_float(y_s)])
        parts.append(b.quantize(v, b.as_float(y_zp), qtype, b.fresh("q")))
    b.op("Concat", parts, b.node.output[0], axis=int(b.attrs["axis"]))


def _qlinear_global_average_pool(b: _Builder) -> None:
    """MlasQLinearGlobalAveragePool: the int32 sum of (x − x_zp) over the image, times
    x_s / (y_s · pixels), rounded, plus y_zp."""
    x, x_s, x_zp, y_s, y_zp = (b.input(i) for i in range(5))
    shape = b.info.get(x, (None, None))[0]
    if shape is None or any(d is None for d in shape):
        raise _Later()
    last = bool(int(b.attrs.get("channels_last", 0)))
    axes = list(range(1, len(shape) - 1)) if last else list(range(2, len(shape)))
    pixels = int(np.prod([shape[a] for a in axes]))
    xf, _, _ = b.centred(x, x_zp, 1)
    total = (b.op("ReduceSum", [xf, b.constant(np.array(axes, np.int64), np.int64)], keepdims=1) if b.opset >= 13
             else b.op("ReduceSum", [xf], axes=axes, keepdims=1))
    scale = b.op("Div", [b.as_float(x_s), b.op("Mul", [b.as_float(y_s), b.constant(np.float32(pixels))])])
    b.quantize(b.op("Mul", [total, scale]), b.as_float(y_zp) if y_zp else "", b.int_type(y_zp or x), b.node.output[0])


def _dynamic_quantize_matmul(b: _Builder) -> None:
    """DynamicQuantizeMatMul(A float, B, b_scale, b_zp?, bias?): A quantized as
    DynamicQuantizeLinear does, an exact int32 product, scaled by a_s·b_s, plus the bias."""
    a, w, w_s, w_zp, bias = (b.input(i) for i in range(5))
    q, a_s, a_zp = b.fresh("aq"), b.fresh("as"), b.fresh("azp")
    sub = _Builder(helper.make_node("DynamicQuantizeLinear", [a], [q, a_s, a_zp], name=f"{b.label}/quantize"),
                   b.prefix + "d_", b.info, b.consts, b.weights, b.graph, b.path, b.cache, b.opset)
    _dynamic_quantize_linear(sub)
    b.nodes += sub.nodes
    b.pending += sub.pending
    b.info[q] = (b.info.get(a, (None, None))[0], onnx.TensorProto.UINT8)
    b.info[a_zp] = ((), onnx.TensorProto.UINT8)
    _float_product(b, q, w, a_s, w_s, a_zp, w_zp, bias)


def _matmul_integer_to_float(b: _Builder) -> None:
    """MatMulIntegerToFloat(A, B, a_scale, b_scale, a_zp?, b_zp?, bias?)."""
    a, w, a_s, w_s, a_zp, w_zp, bias = (b.input(i) for i in range(7))
    _float_product(b, a, w, a_s, w_s, a_zp, w_zp, bias)


def _float_product(b, a, w, a_s, w_s, a_zp, w_zp, bias) -> None:
    acc = _integer_product(b, "MatMul", a, a_zp, w, w_zp)
    y = b.op("Mul", [b.op("Cast", [acc], to=_F), b.scale_product(a_s, w_s)])
    b.op("Add" if bias else "Identity", [y, b.as_float(bias)] if bias else [y], b.node.output[0])


_LOWER = {
    "QuantizeLinear": _quantize_linear, "DequantizeLinear": _dequantize_linear,
    "DynamicQuantizeLinear": _dynamic_quantize_linear, "MatMulInteger": _matmul_integer,
    "ConvInteger": _conv_integer, "QLinearMatMul": _qlinear_matmul, "QLinearConv": _qlinear_conv,
    "QGemm": _qgemm, "QLinearAdd": _qlinear_binary, "QLinearMul": _qlinear_binary,
    "QLinearSigmoid": _qlinear_unary, "QLinearLeakyRelu": _qlinear_unary, "QLinearConcat": _qlinear_concat,
    "QLinearGlobalAveragePool": _qlinear_global_average_pool,
    "DynamicQuantizeMatMul": _dynamic_quantize_matmul, "MatMulIntegerToFloat": _matmul_integer_to_float,
}

from .quantized_lstm import dynamic_quantize_lstm  # noqa: E402 (they build on _Builder above)
from .quantized_qlinear import qlinear_average_pool, qlinear_softmax  # noqa: E402
from .quantized_blocks import gather_block_quantized, matmul_nbits  # noqa: E402

_LOWER.update(DynamicQuantizeLSTM=dynamic_quantize_lstm, QLinearSoftmax=qlinear_softmax,
              QLinearAveragePool=qlinear_average_pool, MatMulNBits=matmul_nbits,
              GatherBlockQuantized=gather_block_quantized)
