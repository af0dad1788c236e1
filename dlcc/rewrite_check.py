"""verify's check of its own reference for quantized models.

verify's reference for a quantized model is onnxruntime on the model with its integer products,
and onnxruntime's fused ops built on them, rewritten as exact float32 arithmetic
(quantized.exact_products): onnxruntime's own uint8 x int8 kernels saturate on x86 CPUs without
VNNI, so their answer is not the model's there. That rewrite is dlcc's code, the same that dlcc
compiles. A rewrite that computed something other than onnxruntime's op (a DynamicQuantizeLSTM
quantizing h over other rows, say) would be in both the plan and the reference, and verify would
pass it, however far it is from what onnxruntime computes.

So where this CPU's onnxruntime does not saturate (`onnxruntime_saturates`, a probe), verify
also runs the model through onnxruntime's own kernels, and an output on which the two references
differ by more than the tolerance fails: dlcc's rewrite is wrong there, whatever the plan computed.
Where it saturates, the reference stays unchecked, and the first row says so.

onnxruntime's own kernels run as the rewrite is written to match them (`own_kernels`):

- graph optimizations off, as the reference runs;
- MatMulNBits at accuracy_level 4 (an int8 approximation of its float product) at level 0;
- at least as many intra-op threads as a DynamicQuantizeLSTM has sequences. onnxruntime splits
  such a batch across its threads and quantizes each thread's rows of h together; dlcc quantizes
  each sequence's h on its own (quantized_lstm.py), which is onnxruntime's answer with one thread
  per sequence. Where onnxruntime does not split (one sequence, or 2-4 with a hidden size over
  256), the thread count does not matter."""
from __future__ import annotations

import functools

import numpy as np
import onnx

#: Ops that quantized.exact_products rewrites in the reference (the integer products, and the
#: fused ops built on them).
REWRITTEN = {"MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv", "QGemm", "MatMulIntegerToFloat",
             "DynamicQuantizeMatMul", "DynamicQuantizeLSTM", "QAttention"}


def rewritten_ops(model: onnx.ModelProto) -> list[str]:
    """The op types of `model`'s main graph that verify's reference runs as dlcc's rewrite."""
    from .quantized import is_quantized_op

    return sorted({n.op_type for n in model.graph.node if n.op_type in REWRITTEN
                   and (is_quantized_op(n) or (n.op_type == "QAttention" and n.domain == "com.microsoft"))})


@functools.lru_cache(maxsize=1)
def onnxruntime_saturates() -> bool:
    """Whether onnxruntime's uint8 x int8 product saturates on this CPU: a row of 255s times a
    column of 127s, whose pairs of products (64770) pass int16, as AVX2's vpmaddubsw adds them
    without VNNI."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    k = 64
    g = helper.make_graph([helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "probe",
                          [helper.make_tensor_value_info("a", TensorProto.UINT8, [16, k])],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, [16, 16])],
                          [numpy_helper.from_array(np.full((k, 16), 127, np.int8), "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    y = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, {"a": np.full((16, k), 255, np.uint8)})[0]
    return bool(np.any(y != 255 * 127 * k))


def own_kernels(model: onnx.ModelProto, so, feeds: dict) -> onnx.ModelProto:
    """`model` (a copy) and the session options `so` set for onnxruntime's own quantized kernels
    to compute what dlcc's rewrite does (module docstring)."""
    from .quantized import float_nbits, tensor_types

    m = onnx.ModelProto()
    m.CopyFrom(model)
    float_nbits(m)
    xs = [n.input[0] for n in m.graph.node if n.op_type == "DynamicQuantizeLSTM" and n.domain == "com.microsoft"]
    if xs:
        shapes = [shape for _, shape in tensor_types(m, xs, feeds).values()]
        so.intra_op_num_threads = max([2] + [int(s[1]) for s in shapes if len(s) == 3])
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return m


def check_rewrite(model_path, feeds: dict, refs: dict, rows: list[dict]) -> str:
    """Fail the rows whose reference (dlcc's exact rewrite, run by onnxruntime) is further than
    their tolerance from onnxruntime's own kernels (module docstring); changes `rows` in place.
    Returns a note where the check could not run, else "" (the caller adds it after the other
    judges, which leave rows with a note alone)."""
    from .verify import _reference, compare_value

    ops = rewritten_ops(onnx.load(str(model_path), load_external_data=False))
    if not ops or not rows:
        return ""
    what = f"dlcc's exact rewrite of {', '.join(ops)}"
    if onnxruntime_saturates():
        return (f"the reference runs {what}, unchecked: onnxruntime's own uint8 x int8 products saturate on "
                "this CPU (no VNNI)")
    names = [r["name"] for r in rows if r["name"] in refs]
    try:
        own = dict(zip(names, _reference(model_path, feeds, names, exact=False)[1]))
    except Exception as e:  # (onnxruntime's own kernels refuse what the rewrite runs: nothing to check)
        return f"the reference runs {what}, unchecked: onnxruntime's own kernels cannot run it ({str(e).splitlines()[0][:200]})"
    for r in rows:
        if r["name"] not in own:
            continue
        c = compare_value(r["name"], own[r["name"]], refs[r["name"]], r["rtol"], r["atol"])
        if not c["passed"]:
            note = (f"the reference is wrong: {what}, which the reference runs, is {c['max_abs_err']:.3g} away from "
                    f"onnxruntime's own kernels on this output. That is a dlcc bug; please report it")
            r.update(passed=False, note=f"{r['note']}; {note}" if "note" in r else note)
    return ""
