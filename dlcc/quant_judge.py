"""verify's judge for quantized models: a value quantized one step apart at a rounding tie is
not a wrong result, and this proves that is all that happened.

A quantized model rounds float values to integers (QuantizeLinear, DynamicQuantizeLinear, the
requantize inside QLinearConv...). dlcc and onnxruntime compute the floats before each rounding in
different orders, so they may differ in the last bit, and a value that lands on a tie (k + 0.5
steps) is rounded to k by one and to k + 1 by the other. From there on the two runs compute from
different integers, and an output can move by far more than verify's float tolerance.

The judge checks the two things that make such a run correct, with onnxruntime as the reference
(optimizations off, as verify runs quantized models):

1. dlcc's plan is compiled again with every quantized tensor as an extra output (the same
   pipeline, precision, device and shapes), and must give the same outputs, bit for bit, as the
   plan under test; its extra outputs are then the plan's own quantized values;
2. onnxruntime runs the model *forced*: every quantized tensor is fed from dlcc's values instead
   of computed, and what the model would have quantized is an output. Then
   - every quantized value of dlcc's is a correct rounding of onnxruntime's value before
     quantization: |dequantize(q) − clamp(x)| <= step / 2 + atol + rtol·|x| (the tolerance is
     verify's own: how far a float value may be from the reference), and a dynamic scale and
     zero point are within the tolerance and one step of the reference's;
   - given dlcc's quantized values, every output of onnxruntime's is within the tolerance of dlcc's.

A row that passes both says `PASS (quantization)` and how many values were rounded the other way.
Anything else (a quantized value off by more, a segment off between quantizers, an instrumented
plan that computes something else) leaves the row failed."""
from __future__ import annotations

import os
import tempfile

import ml_dtypes
import numpy as np
import onnx
from onnx import helper

from .held_types import FLOAT_GRIDS

#: Ops whose outputs are quantized values, and which of their outputs.
QUANTIZERS = {"QuantizeLinear": (0,), "DynamicQuantizeLinear": (0, 1, 2), "QLinearConv": (0,), "QLinearMatMul": (0,),
              "QGemm": (0,), "QLinearAdd": (0,), "QLinearMul": (0,), "QLinearSigmoid": (0,),
              "QLinearLeakyRelu": (0,), "QLinearConcat": (0,), "QLinearGlobalAveragePool": (0,),
              "QLinearSoftmax": (0,), "QLinearAveragePool": (0,)}


def _points(original: onnx.ModelProto, model: onnx.ModelProto) -> list[int]:
    """Positions in `model` (the original with its integer products written out,
    quantized.exact_products) of the nodes that quantize: its quantizers, and the nodes that now
    write what the original's quantizers did (the Cast that ends a rewritten QLinearConv). A
    rewritten DynamicQuantizeLSTM's per-step DynamicQuantizeLinear nodes are quantizers too."""
    from .quantized import is_quantized_op

    wanted = {n.output[0] for n in original.graph.node if is_quantized_op(n) and n.op_type in QUANTIZERS
              and not (n.op_type == "QGemm" and (len(n.input) < 8 or not n.input[7]))}
    return [k for k, n in enumerate(model.graph.node)
            if (n.op_type in QUANTIZERS and n.op_type != "QGemm" and (n.domain in ("", "ai.onnx") or is_quantized_op(n)))
            or (n.output and n.output[0] in wanted)]


def _outputs_of(n: onnx.NodeProto) -> tuple[int, ...]:
    return QUANTIZERS.get(n.op_type, (0,))


def judge_quantized(model_path, rows: list[dict], got: dict, feeds: dict, compiled, recompile=None) -> None:
    """Re-judge failing rows of a quantized model (module docstring); changes `rows` in place.
    `recompile(path)` compiles the instrumented model as `compiled` was (the fuzz oracle's
    configurations carry pass options a pipeline name does not); by default from its plan's meta."""
    failing = [r for r in rows if not r["passed"] and "note" not in r and r["name"] in got]
    if not failing or compiled is None:
        return
    run = {}

    def prepare():
        from .quantized import exact_products

        original = onnx.load(str(model_path))
        model = exact_products(original, model_path, feeds)
        points = _points(original, model)
        if not points:
            return None
        nodes = model.graph.node
        quantized = [nodes[k].output[i] for k in points for i in _outputs_of(nodes[k])
                     if i < len(nodes[k].output) and nodes[k].output[i]]
        mine = _instrumented_run(model, quantized, feeds, compiled, recompile)
        run.update(model=model, points=points)
        return mine, _forced_run(model, points, quantized, feeds, mine)

    def check(mine, forced):
        flips, total, bad, worst = _check_points(run["model"], run["points"], mine, forced, failing[0]["rtol"],
                                                 failing[0]["atol"])
        return bad, (f"judged with dlcc's quantized values: {flips} of {total} quantized values are rounded "
                     f"apart (each within half a step and the tolerance of onnxruntime's value "
                     f"before quantization; the farthest {worst:.2g} of a step from its tie)")

    judge_rows(failing, got, "quantization", "quantized values", prepare, check)


def judge_rows(failing: list[dict], got: dict, judge: str, what: str, prepare, check) -> None:
    """What verify's judges (this one, selection_judge.py) share, on the rows that failed against
    onnxruntime: `prepare()` gives (dlcc's instrumented run, onnxruntime's forced run), or None
    where there is nothing to judge; the instrumented run must give the plan's outputs bit for
    bit; `check(mine, forced)` gives (the first violation or "", what the judge saw). A row then
    passes where there is no violation and onnxruntime, given dlcc's `what`, computes its output
    within the row's tolerance; the row's note says which."""
    from .verify import compare

    try:
        runs = prepare()
    except Exception as e:  # the judge could not run: onnxruntime's verdict stands
        for r in failing:
            r["note"] = f"not judged for {judge}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        return
    if runs is None:
        return
    mine, forced = runs
    if any(not np.array_equal(np.asarray(mine[r["name"]]), np.asarray(got[r["name"]]), equal_nan=True) for r in failing):
        for r in failing:
            r["note"] = f"not judged for {judge}: the plan with its {what} as outputs computes other outputs"
        return
    bad, saw = check(mine, forced)
    for r in failing:
        if bad:
            r["note"] = f"{judge} judge: {bad}"
            continue
        given = compare(r["name"], np.asarray(got[r["name"]]), np.asarray(forced[r["name"]]), r["rtol"], r["atol"])
        if not given["passed"]:
            r["note"] = f"{judge} judge: given dlcc's {what}, onnxruntime is still {given['max_abs_err']:.3g} away"
            continue
        r.update(passed=True, judge=judge,
                 note=f"{saw}; from them onnxruntime computes this output within {given['max_abs_err']:.3g} of dlcc's")


def _instrumented_run(model: onnx.ModelProto, quantized: list[str], feeds: dict, compiled,
                      recompile=None) -> dict:
    """dlcc's plan, compiled again with the tensors `quantized` (what a judge reads) as extra outputs,
    run on `feeds`."""
    import dlcc

    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    from .quantized import tensor_types

    types = tensor_types(model, quantized, feeds)
    m.graph.output.extend(helper.make_tensor_value_info(q, *types[q]) for q in quantized if q not in have)
    meta = compiled.plan["meta"]
    with tempfile.TemporaryDirectory(prefix="dlcc-qjudge-") as tmp:
        path = os.path.join(tmp, "instrumented.onnx")
        onnx.save(m, path)
        # The inputs' dims are the feeds' already (exact_products); bound values stay bound.
        inputs = {i.name for i in m.graph.input}
        shapes = {k: v for k, v in (meta.get("shapes") or {}).items() if k in inputs}
        cm = recompile(path) if recompile else dlcc.compile(
            path, shapes=shapes, target=meta["target"], pipeline=meta["pipeline"], device=meta.get("device_key"),
            precision=meta.get("precision"))
        got = cm.executor().run(dict(feeds))
    return got


def _forced_run(model: onnx.ModelProto, points, quantized: list[str], feeds: dict, mine: dict) -> dict:
    """onnxruntime (optimizations off) on `model` (its integer products already exact) with every
    quantized tensor fed from dlcc's values; the reference's own quantized values come out as
    `NAME#ref`, each quantizer's float input as `NAME#x`, and the model's outputs as themselves."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    extra = []
    for k in points:
        n = g.node[k]
        for i in _outputs_of(n):
            if i < len(n.output) and n.output[i]:
                v = np.asarray(mine[n.output[i]])
                extra.append((n.output[i] + "#ref", (helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))))
                n.output[i] = n.output[i] + "#ref"
        if n.op_type in ("QuantizeLinear", "DynamicQuantizeLinear") and f"{n.input[0]}#x" not in {e for e, _ in extra}:
            x = f"{n.input[0]}#x"
            g.node.append(helper.make_node("Identity", [n.input[0]], [x], name=f"{x}/identity"))
            extra.append((x, (onnx.TensorProto.FLOAT, None)))
    for q in quantized:
        v = np.asarray(mine[q])
        g.input.append(helper.make_tensor_value_info(q, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape)))
    g.output.extend(helper.make_tensor_value_info(e, *t) for e, t in extra)
    return run_forced(m, quantized, feeds, mine)


def run_forced(m: onnx.ModelProto, fed: list[str], feeds: dict, mine: dict) -> dict:
    """onnxruntime (optimizations off) on `m` (changed in place), whose inputs `fed` take dlcc's
    values from `mine` and the others `feeds`: every output by name."""
    import onnxruntime as ort

    del m.graph.value_info[:]
    from .held_types import float_boundary, held_io

    held_in, held_out = held_io(m.graph)  # (float8 and int4 through onnxruntime's binding as float32)
    m = float_boundary(m, held_in, held_out) if held_in or held_out else m
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    given = {i.name: (np.asarray(mine[i.name]) if i.name in fed else feeds[i.name]) for i in sess.get_inputs()}
    given = {k: (v.astype(np.float32) if k in held_in else v) for k, v in given.items()}
    return {n: (v.astype(helper.tensor_dtype_to_np_dtype(held_out[n])) if n in held_out else v)
            for n, v in zip(names, sess.run(names, given))}


def _check_points(model, points, mine: dict, forced: dict, rtol: float, atol: float) -> tuple[int, int, str, float]:
    """(values rounded the other way, quantized values in all, the first violation or "", the
    largest distance of a value rounded the other way from its tie, in steps)."""
    from .spectral import _constants

    consts = _constants(model.graph, {})
    flips = total = 0
    worst = 0.0
    for n in (model.graph.node[k] for k in points):
        q = n.output[0]
        a, ref = np.asarray(mine[q]), np.asarray(forced[q + "#ref"])
        total += a.size
        # Values are compared centred on their zero points: a dynamic zero point is itself rounded
        # (0 − min / scale is 127.5 for a tanh's [-1, 1]), and one a step apart shifts them all.
        shift = 0
        if n.op_type == "DynamicQuantizeLinear":
            s_mine, s_ref = float(mine[n.output[1]]), float(forced[n.output[1] + "#ref"])
            z_mine, z_ref = int(mine[n.output[2]]), int(forced[n.output[2] + "#ref"])
            if abs(s_mine - s_ref) > atol + rtol * abs(s_ref) or abs(z_mine - z_ref) > 1:
                return flips, total, (f"{q!r}: dynamic scale {s_mine:.6g} and zero point {z_mine} against "
                                      f"onnxruntime's {s_ref:.6g} and {z_ref}"), worst
            scale, zp, shift = np.float64(s_mine), np.float64(z_mine), z_mine - z_ref
        x = None
        if n.op_type == "QLinearSoftmax":
            # its sum is not summed in onnxruntime's order (dlcc/quantized_qlinear.py): the value
            # onnxruntime rounds, from the input it was given (dlcc's), in steps of y_scale, and
            # that value rounded and clamped as onnxruntime's kernel does
            x, scale, zp, ref = _softmax_point(n, consts, mine, a.dtype)
        if a.dtype.name in FLOAT_GRIDS:  # (a float8 or float4 QuantizeLinear: rounding onto its grid)
            verdict = _float_point(n, consts, a, ref, forced, rtol, atol)
            if isinstance(verdict, str):
                return flips, total, verdict, worst
            flips, worst = flips + verdict[0], max(worst, verdict[1])
            continue
        apart = a.astype(np.int64) - ref.astype(np.int64) - shift
        differ = apart != 0
        if not differ.any():
            continue
        if n.op_type == "QLinearSoftmax":
            if x is None:
                return flips, total, f"{q!r}: {int(differ.sum())} values differ and its scales are computed", worst
        elif n.op_type == "QuantizeLinear":
            scale, zp = consts.get(n.input[1]), consts.get(n.input[2]) if len(n.input) > 2 and n.input[2] else 0
            if scale is None or zp is None:
                return flips, total, f"{q!r}: {int(differ.sum())} values differ and its scale is computed", worst
            axis = _attr(n, "axis", 1)
            scale, zp = _along(np.asarray(scale, np.float64), a.ndim, axis), _along(np.asarray(zp, np.float64), a.ndim, axis)
        elif n.op_type != "DynamicQuantizeLinear":
            return flips, total, f"{q!r} ({n.op_type}): {int(differ.sum())} quantized values differ from onnxruntime's", worst
        if x is None:
            x = np.asarray(forced[n.input[0] + "#x"], np.float64)
        info = ml_dtypes.iinfo(a.dtype)  # (int4 and int2 too)
        lo, hi = (info.min - zp) * scale, (info.max - zp) * scale
        xc = np.clip(x, np.minimum(lo, hi), np.maximum(lo, hi))
        err = np.abs((a.astype(np.float64) - zp) * scale - xc)
        allowed = np.abs(scale) / 2 + atol + rtol * np.abs(x)
        if np.any(err > allowed) or np.any(np.abs(apart) > 1):
            k = int(np.argmax(err - allowed))
            return flips, total, (f"{q!r}: dlcc's value {a.flat[k]} does not round onnxruntime's {x.flat[k]:.6g} "
                                  f"(scale {np.broadcast_to(scale, a.shape).flat[k]:.6g})"), worst
        steps = np.broadcast_to(x / scale, a.shape)[differ]
        worst = max(worst, float(np.abs(steps - np.floor(steps) - 0.5).max(initial=0.0)))
        flips += int(differ.sum())
    return flips, total, "", worst


def _float_point(n: onnx.NodeProto, consts: dict, a: np.ndarray, ref: np.ndarray, forced: dict, rtol: float,
                 atol: float) -> tuple[int, float] | str:
    """A QuantizeLinear onto a float grid (held_types.FLOAT_GRIDS): dlcc's values `a` against
    onnxruntime's `ref`, each a correct rounding of x / scale, where x is onnxruntime's value
    before quantization. (values rounded the other way, the farthest of them from its tie in
    steps), or the first violation. A value apart must be within half a step of x / scale, plus
    verify's tolerance on x: near zero a float grid's steps are finer than that tolerance (at
    bf16 a GEMM's output may be several float8 steps from onnxruntime's and still within it),
    so unlike an integer grid it is not held to one step from onnxruntime's value."""
    q = n.output[0]
    g = FLOAT_GRIDS[a.dtype.name]
    av, rv = a.astype(np.float64), ref.astype(np.float64)
    differ = ~((av == rv) | (np.isnan(av) & np.isnan(rv)))
    if not differ.any():
        return 0, 0.0
    scale = consts.get(n.input[1])
    if scale is None:
        return f"{q!r}: {int(differ.sum())} values differ and its scale is computed"
    scale = np.broadcast_to(_along(np.asarray(scale, np.float64), a.ndim, _attr(n, "axis", 1)), a.shape)[differ]
    x = np.asarray(forced[n.input[0] + "#x"], np.float64)
    x = np.broadcast_to(x, a.shape)[differ]
    v = np.clip(x / scale, -g.max, g.max)

    def spacing(t):  # the grid's step at |t| (the subnormals share the first binade's)
        e = np.floor(np.log2(np.maximum(np.abs(t), 2.0 ** g.emin)))
        return 2.0 ** (np.maximum(e, g.emin) - g.mant)

    step = spacing(np.maximum(np.abs(av[differ]), np.abs(v)))
    err = np.abs(av[differ] - v) * np.abs(scale)
    allowed = step * np.abs(scale) / 2 + atol + rtol * np.abs(x)
    if np.any(~np.isfinite(av[differ])) or np.any(err > allowed):
        k = int(np.argmax(np.where(np.isfinite(err), err - allowed, np.inf)))
        return (f"{q!r}: dlcc's value {av[differ][k]} does not round onnxruntime's {x[k]:.6g} "
                f"(scale {scale[k]:.6g}) onto {a.dtype.name}")
    steps = v / spacing(v)
    return int(differ.sum()), float(np.abs(steps - np.floor(steps) - 0.5).max(initial=0.0))


def _softmax_point(n: onnx.NodeProto, consts: dict, mine: dict, dtype) -> tuple:
    """(the float value onnxruntime's QLinearSoftmax rounds, times y_scale; y_scale; y_zp; that value
    rounded and saturated) from dlcc's quantized input, or Nones where the scales are computed."""
    from .quantized_qlinear import softmax_before_rounding

    xs, ys = consts.get(n.input[1]), consts.get(n.input[3])
    if xs is None or ys is None or n.input[0] not in mine:
        return None, None, None, np.zeros((), np.int64)
    zp = float(consts.get(n.input[4], 0)) if len(n.input) > 4 and n.input[4] else 0.0
    v = softmax_before_rounding(n, np.asarray(mine[n.input[0]]), float(xs), float(ys))
    info = np.iinfo(dtype)
    ref = np.clip(np.rint(v) + zp, info.min, info.max).astype(np.int64)
    return v * float(ys), np.float64(ys), np.float64(zp), ref


def _along(v: np.ndarray, rank: int, axis: int) -> np.ndarray:
    if v.ndim == 1 and v.size > 1 and rank > 1:
        return v.reshape([-1] + [1] * (rank - axis % rank - 1))
    return v


def _attr(n: onnx.NodeProto, name: str, default: int) -> int:
    return next((int(helper.get_attribute_value(a)) for a in n.attribute if a.name == name), default)
