"""The exact answer, and how far float32 rounding alone can move a graph's outputs from it.

The oracle compares dlcc with onnxruntime under `dlcc verify`'s tolerance. Where a graph amplifies
rounding (a variance taken as E[y²] − E[y]² of nearly equal values, then its reciprocal), two
correct float32 programs that sum in different orders disagree by far more than that tolerance.
To tell that from a bug, the oracle asks two questions of a float64 evaluation (onnx.reference):

- `float64_reference`: what is the exact answer?
- `rounding_spread`: how far can float32 rounding move it? This is a Monte Carlo rounding analysis
  (Parker's Monte Carlo arithmetic; the idea behind Verificarlo and CADNA): the float64 graph is
  run several times with every rounding the float32 program makes replaced by a random relative
  error of its size, and the outputs' largest distance from the exact answer is the spread.

The rounding model is the textbook one (Higham, *Accuracy and Stability of Numerical Algorithms*):
- an elementwise op rounds its result: a relative error up to its accuracy on dlcc's targets
  (ULPS: half an ulp for + − × ÷ and sqrt, 2 for exp);
- a sum of n terms (a reduction, a dot product inside MatMul, Gemm or Conv) is, computed in any
  order, the exact sum of terms each perturbed by up to (n − 1) units (Higham §3.1, §4.2). Each
  term is perturbed independently by up to n/2 units, which stays inside that bound and matches
  the spread of a sequential sum of same-signed terms, the least accurate order a kernel uses;
- ops that do not round (Max, Relu, comparisons, layout) get no error; composite ops (Softmax,
  LayerNormalization, LSTM) only an elementwise one, which errs on the strict side.

At precisions tf32, fp16 and bf16 (GEMMs on tensor cores) every operand of MatMul, Gemm, Conv and
ConvTranspose is first rounded to the precision's type (unit roundoff OPERAND_UNIT: 2**-11 for
TF32 and fp16, 2**-8 for bf16), then summed in float32 as above. At fp16 and bf16 dlcc also
stores activations in that type (ops/narrow.py): every float result that is not a graph output is
rounded once more, by the same unit, as it is stored. That errs on the lenient side where dlcc
keeps a tensor float32 or AStitch keeps it in registers. (fp16's range is not modelled: a value
beyond 65504 is infinite on the GPU and finite here.)

A bug is not rounding: it strikes far outside the spread on a well-conditioned graph, and the
oracle only consults the spread once verify's rule has already failed.
"""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

UNIT = 2.0 ** -24  # float32 unit roundoff: half an ulp of 1.0
TF32_UNIT = 2.0 ** -11  # TF32's (10 explicit mantissa bits), for GEMM operands at precision tf32
#: The unit roundoff of a GEMM operand at each tensor-core precision.
#: tf32x3 keeps what a product loses (its small x small term) below TF32_UNIT**2 of it.
OPERAND_UNIT = {"tf32": TF32_UNIT, "tf32x3": TF32_UNIT ** 2, "fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
GEMMS = {"MatMul", "Gemm", "Conv", "ConvTranspose"}

#: Ops whose float result is rounded once per element, and by how many ulps at most on the
#: targets dlcc runs on. + − × ÷ and sqrt are correctly rounded (half an ulp) there: PoCL compiles
#: them to IEEE instructions, and CUDA does without --use_fast_math, which dlcc never passes. The
#: transcendental builtins follow CUDA's accuracy table (expf 2 ulp, logf 1, tanhf 2, erff 2,
#: powf 4; PoCL's are no looser), and ops dlcc composes from several builtins add theirs up.
ULPS = {
    "Add": 0.5, "Sub": 0.5, "Mul": 0.5, "Div": 0.5, "Reciprocal": 0.5, "Sqrt": 0.5,
    "LeakyRelu": 0.5, "PRelu": 0.5, "Mod": 0.5, "HardSigmoid": 1, "HardSwish": 1.5, "Sum": 1,
    "Mean": 1.5, "BatchNormalization": 2, "Resize": 2, "Upsample": 2, "Exp": 2, "Log": 1,
    "Tanh": 2, "Erf": 2, "Sin": 2, "Cos": 2, "Pow": 4, "Softsign": 1, "Sigmoid": 3, "Softplus": 3,
    "Elu": 3, "Selu": 3, "Celu": 3, "Gelu": 3.5, "Mish": 6,
    # (OpenCL's accuracy table: CUDA's is as tight or tighter for each)
    "Tan": 5, "Asin": 4, "Acos": 4, "Atan": 5, "Sinh": 4, "Cosh": 4, "Asinh": 4, "Acosh": 4, "Atanh": 5,
    # composites: the arithmetic around their sums (whose terms are not perturbed: the strict side)
    "Softmax": 4, "LogSoftmax": 4, "LayerNormalization": 4, "InstanceNormalization": 4, "LRN": 8,
    "ReduceProd": 4, "ReduceLogSumExp": 4, "CumSum": 1, "LSTM": 10, "GRU": 10, "RNN": 6,
}
#: Ops that sum terms: their data input is perturbed term by term (backward error); the result
#: is rounded once more (a mean's division, ReduceL2's square root, Gemm's bias).
SUMS = {"MatMul", "Gemm", "Conv", "ConvTranspose", "ReduceSum", "ReduceMean", "ReduceSumSquare",
        "ReduceL1", "ReduceL2", "ReduceLogSum", "GlobalAveragePool", "AveragePool"}


def tf32_round(x: np.ndarray) -> np.ndarray:
    """x (float32) rounded to TF32 as tensor-core operands are, numpy's twin of the preludes'
    TO_TF32 (cvt.rna: 10 mantissa bits, nearest, ties away from zero; inf and NaN kept)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    finite = (u & 0x7F800000) != 0x7F800000
    return np.where(finite, (u + np.uint32(0x1000)) & np.uint32(0xFFFFE000), u).astype(np.uint32).view(np.float32)


def operand_round(x: np.ndarray, precision: str) -> np.ndarray:
    """x (float32) rounded as a tensor-core operand is at `precision`, still float32: TF32 (tf32_round),
    float16 or bfloat16 (nearest, ties to even: TO_F16 and TO_BF16 in the preludes); fp32 and
    tf32x3 (whose split operands carry float32's value) unchanged."""
    x = np.asarray(x, np.float32)
    if precision == "tf32":
        return tf32_round(x)
    if precision == "fp16":
        return x.astype(np.float16).astype(np.float32)
    if precision == "bf16":
        import ml_dtypes

        return x.astype(ml_dtypes.bfloat16).astype(np.float32)
    return x


def pruned_to(model: onnx.ModelProto, outputs: list[str]) -> onnx.ModelProto:
    """`model` with only the nodes `outputs` depend on, and those outputs: the arbiter judges the
    outputs that failed, and a node onnx.reference cannot run elsewhere in the graph (a grouped
    ConvTranspose it mis-reshapes) must not leave it without an answer. Inputs stay (feeds). A node
    with a subgraph (an If's branches) also needs what they read from the graph around them."""
    from ..control_flow import node_reads

    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    need, keep = set(outputs), []
    for node in reversed(list(g.node)):
        if any(o in need for o in node.output):
            keep.append(node)
            need.update(node_reads(node))
    del g.node[:]
    g.node.extend(reversed(keep))
    outs = [o for o in g.output if o.name in outputs]
    del g.output[:]
    g.output.extend(outs)
    inits = [t for t in g.initializer if t.name in need]
    del g.initializer[:]
    g.initializer.extend(inits)
    return m


#: The float types the float64 model widens: float32, and the 16-bit floats of a float16 or
#: bfloat16 model, whose reference is the model widened (verify's rule), so its exact answer is too.
WIDENED = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)


def float64_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with every float32 (or 16-bit float) tensor, constant and Cast-to-float made double,
    in the graphs nested in it too (an If's branches, a Scan's or Loop's body: a float32 constant
    left there stops onnx.reference with a type mismatch against the double values around it)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    _to_float64(m.graph)
    return m


def _to_float64(g: onnx.GraphProto) -> None:
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        if vi.type.tensor_type.elem_type in WIDENED:
            vi.type.tensor_type.elem_type = TensorProto.DOUBLE
    for k, t in enumerate(g.initializer):
        if t.data_type in WIDENED:
            g.initializer[k].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))
    for n in g.node:
        for a in n.attribute:
            if a.name == "to" and a.i in WIDENED:
                a.i = TensorProto.DOUBLE
            if a.name == "value" and a.t.data_type in WIDENED:  # Constant nodes
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float64), a.t.name))
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                _to_float64(sub)


def _run64(m: onnx.ModelProto, feeds: dict) -> dict:
    from ..reference_ops import evaluator

    f64 = {k: v.astype(np.float64) if v.dtype.kind == "f" or v.dtype.name == "bfloat16" else v
           for k, v in feeds.items()}
    names = [o.name for o in m.graph.output]
    return {n: np.asarray(v, np.float64) if np.asarray(v).dtype.kind == "f" else np.asarray(v)
            for n, v in zip(names, evaluator(m).run(names, f64))}


def float64_reference(model: onnx.ModelProto, feeds: dict) -> dict:
    """The model's outputs computed in float64 by onnx.reference."""
    return _run64(float64_model(model), feeds)


def _types(m: onnx.ModelProto) -> dict:
    """name -> (elem_type, shape or None) for every value shape inference can type."""
    inferred = onnx.shape_inference.infer_shapes(m)
    out = {}
    for vi in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
        tt = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        out[vi.name] = (tt.elem_type, dims if tt.HasField("shape") and None not in dims else None)
    for t in m.graph.initializer:
        out[t.name] = (t.data_type, list(t.dims))
    return out


def _terms(node, types: dict) -> int:
    """How many terms one output element of a summing node adds up (1 where shapes are unknown)."""
    def shape(i):
        return types.get(node.input[i], (0, None))[1] if len(node.input) > i else None

    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    a, out = shape(0), types.get(node.output[0], (0, None))[1]
    if node.op_type == "MatMul" and a:
        return a[-1]
    if node.op_type == "Gemm" and a:
        return a[0] if attrs.get("transA", 0) else a[-1]
    if node.op_type in ("Conv", "ConvTranspose") and shape(1):
        w = shape(1)
        per_group = w[0] // max(1, attrs.get("group", 1)) if node.op_type == "ConvTranspose" else w[1]
        return per_group * math.prod(w[2:])
    if node.op_type == "AveragePool":
        return math.prod(attrs.get("kernel_shape", [1]))
    if a is not None and out is not None and math.prod(out) > 0:
        return max(1, math.prod(a) // math.prod(out))
    return 1


def perturbed_model(m64: onnx.ModelProto, seed: int, precision: str = "fp32") -> onnx.ModelProto:
    """The float64 model with the float32 rounding model above applied at random (`seed`), and
    at a tensor-core precision the rounding of every GEMM operand to its type (OPERAND_UNIT)."""
    types = _types(m64)
    g = m64.graph
    nodes, fresh, rng = [], iter(range(1 << 30)), np.random.default_rng(seed)
    outputs = {o.name for o in g.output}
    stored = OPERAND_UNIT[precision] / UNIT if precision in ("fp16", "bf16") else 0.0  # activations in half

    def noisy(src: str, dst: str, units: float) -> list:
        """dst = src * (1 + e), e uniform in ±units·UNIT, drawn per element."""
        f = f"__mc_f{next(fresh)}"
        e = rng.uniform(-units * UNIT, units * UNIT, size=types[src][1])
        g.initializer.append(numpy_helper.from_array(np.asarray(1.0 + e, np.float64), f))
        return [helper.make_node("Mul", [src, f], [dst])]

    def is_double(name: str) -> bool:  # and of a known shape (else left exact: the strict side)
        return bool(name) and types.get(name, (0, None))[0] == TensorProto.DOUBLE and types[name][1] is not None

    # Values computed from constants and shapes alone (a Range's limit from a feature map's width,
    # YOLO's anchor grid) are folded at compile time, and are never rounded as activations are:
    # perturbed, a limit of 40 became 40.0000001 and its Range one element longer (nudenet's
    # YOLOv8n). Only what the inputs' values reach is rounded here.
    data = {i.name for i in g.input}
    for node in g.node:
        if node.op_type not in ("Shape", "Size") and (
                any(i in data for i in node.input if i)
                or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)):
            data.update(o for o in node.output if o)

    for node in g.node:
        if precision in OPERAND_UNIT and node.op_type in GEMMS:
            for k in (0, 1):
                if len(node.input) > k and is_double(node.input[k]):
                    src = node.input[k]
                    node.input[k] = f"{src}__mc_op{next(fresh)}"
                    types[node.input[k]] = types[src]
                    nodes += noisy(src, node.input[k], OPERAND_UNIT[precision] / UNIT)
        if node.op_type in SUMS and is_double(node.input[0]) and node.input[0] in data:
            src = node.input[0]
            node.input[0] = f"{src}__mc_in{next(fresh)}"
            types[node.input[0]] = types[src]
            nodes += noisy(src, node.input[0], max(1.0, _terms(node, types) / 2))
        rounded = []
        ulps = 1 if node.op_type in SUMS else ULPS.get(node.op_type)
        for i, o in enumerate(node.output):
            units = (2 * ulps if ulps else 0.0) + (stored if o not in outputs else 0.0)
            if units and is_double(o) and o in data:
                node.output[i] = f"{o}__mc_out{next(fresh)}"
                types[node.output[i]] = types[o]
                rounded += noisy(node.output[i], o, units)
        nodes.append(node)
        nodes += rounded
    del g.node[:]
    g.node.extend(nodes)
    return m64


def _with_input_shapes(model: onnx.ModelProto, feeds: dict) -> onnx.ModelProto:
    """`model` with its graph inputs' dims fixed to the feeds' (a copy; `model` itself where
    nothing changes), so that flattening infers the shapes it converts Ifs and unrolls Loops by."""
    ins = [vi for vi in model.graph.input if vi.name in feeds and vi.type.HasField("tensor_type")]
    if all(vi.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim)
           for vi in ins):
        return model
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in m.graph.input:
        if vi.name in feeds and vi.type.HasField("tensor_type"):
            shape = vi.type.tensor_type.shape
            shape.ClearField("dim")
            for d in np.shape(feeds[vi.name]):
                shape.dim.add().dim_value = int(d)
    return m


def _flattened(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with its Loops and Scans unrolled and its Ifs inlined or if-converted (dlcc's own
    import steps, loops.py and control_flow.py), so that the rounding model reaches the ops in
    their bodies, which perturbed_model does not enter (a Scan's running tanh sum, feeding a
    variance that cancels, had a spread 1e4 times too small); the model as it is where a step
    refuses it. The unrolled graph computes what the loop does (tests/test_loops.py holds it to
    onnxruntime), and the spread is a tolerance, never the answer."""
    from ..control_flow import has_if, inline_ifs
    from ..loops import has_loop, unroll_loops

    if not (has_if(model) or has_loop(model)):
        return model

    def lenient(m):
        return onnx.shape_inference.infer_shapes(m, check_type=False, strict_mode=False, data_prop=True)

    m = onnx.ModelProto()
    m.CopyFrom(model)
    try:
        for _ in range(8):
            m, _notes, _left = unroll_loops(m, "model", lenient)
            m, _notes, _selects = inline_ifs(m, "model", lenient)
            if not (has_if(m) or has_loop(m)):
                return m
    except Exception:  # noqa: BLE001 (a loop dlcc does not unroll: the spread stays the body-blind one)
        pass
    return model


def rounding_spread(model: onnx.ModelProto, feeds: dict, samples: int = 8, precision: str = "fp32") -> dict:
    """Per float output, the largest distance (elementwise) from the exact answer over `samples`
    runs under the rounding model, with the exact answer itself: `(exact, spread)` by name; an
    infinite spread where a sample's output has another shape. The
    exact answer is the graph's as written; the spread is measured on its flattened form
    (_flattened), against that form's own unperturbed answer. Only where onnx.reference cannot
    run the graph as written (a Scan in reverse) does the exact answer come from the flattened
    form too."""
    model = _with_input_shapes(model, feeds)  # (shapes the rounding model sizes its noise by, and flattening uses)
    flattened = _flattened(model)
    flat = float64_model(flattened)
    base = _run64(flat, feeds)
    try:
        exact = base if flattened is model else _run64(float64_model(model), feeds)
    except Exception:  # noqa: BLE001
        exact = base
    if any(n in base and np.shape(base[n]) != np.shape(v) for n, v in exact.items()):
        # The flattened form computes another shape: an If whose branches differ in shape was
        # converted to a select that broadcasts them (silero_vad_half's state, with its sr
        # branches). Its spread would be of another value: take the body-blind one instead.
        flat, base = float64_model(model), exact
    spread = {n: np.zeros(v.shape) for n, v in base.items() if v.dtype.kind == "f"}
    for s in range(samples):
        m = onnx.ModelProto()
        m.CopyFrom(flat)
        got = _run64(perturbed_model(m, s, precision), feeds)
        for n in spread:
            if np.shape(got[n]) != np.shape(base[n]):
                # Rounding alone changed how long the output is: a decision inside the graph (a
                # decoder's end token, chosen by an argmax) flipped, so nothing about the output
                # is stable under rounding (SLANet's table decoder at bf16).
                spread[n] = np.full(np.shape(base[n]), np.inf)
                continue
            with np.errstate(invalid="ignore"):
                spread[n] = np.fmax(spread[n], np.abs(got[n] - base[n]))
    return {n: (exact[n], spread.get(n)) for n in exact}
