"""Quantized models (dlcc/quantized.py) on PoCL.

Each op is checked against onnxruntime's own CPU kernel, bit for bit, on data its kernels get
right: activations in [0, 127], where onnxruntime's uint8 x int8 products cannot saturate (on x86
without VNNI they add pairs of products in int16 with saturation; test_verify_reference_is_exact
shows it). Integer products over the whole uint8 range, where float32 sums stop being exact, are
checked against numpy's int64 products. Whole models come from onnxruntime.quantization (dynamic,
static QDQ and static QOperator) applied to a test model from torch's exporter, through
`verify`'s path. The quantization judge (dlcc/quant_judge.py) is checked on both verdicts."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

import dlcc
from conftest import opencl_device_available
from dlcc.errors import DlccError

needs_opencl = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")
U8, I8, I32 = np.uint8, np.int8, np.int32


def _save(path, nodes, feeds: dict, inits: dict, outputs: list[str], opset=17, microsoft=False):
    ins = [h.make_tensor_value_info(n, h.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds.items()]
    outs = [h.make_empty_tensor_value_info(o) for o in outputs]
    g = h.make_graph(nodes, "q", ins, outs, [nh.from_array(np.asarray(v), k) for k, v in inits.items()])
    ops = [h.make_opsetid("", opset)] + ([h.make_opsetid("com.microsoft", 1)] if microsoft else [])
    m = h.make_model(g, opset_imports=ops, ir_version=8 if opset < 20 else 10)
    m = onnx.shape_inference.infer_shapes(m)
    for o in m.graph.output:  # what onnx cannot infer (com.microsoft ops), onnxruntime tells
        if not o.type.tensor_type.HasField("shape"):
            v = _ort(m, feeds)[[x.name for x in m.graph.output].index(o.name)]
            o.CopyFrom(h.make_tensor_value_info(o.name, h.np_dtype_to_tensor_dtype(v.dtype), v.shape))
    onnx.save(m, str(path))
    return str(path)


def _ort(model, feeds) -> list[np.ndarray]:
    """onnxruntime's own kernels, optimizations off."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    m = model if isinstance(model, onnx.ModelProto) else onnx.load(model)
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _same_as_ort(path, feeds, pipelines=("baseline", "astitch")):
    refs = _ort(path, feeds)
    names = [o.name for o in onnx.load(path).graph.output]
    for p in pipelines:
        got = dlcc.compile(path, target="opencl", pipeline=p)(feeds)
        for n, r in zip(names, refs):
            assert got[n].dtype == r.dtype, (p, n, got[n].dtype, r.dtype)
            diff = np.abs(got[n].astype(np.float64) - r.astype(np.float64))
            assert np.array_equal(got[n], r), f"{p}: {n} differs from onnxruntime in {int((diff > 0).sum())} values, by up to {diff.max()}"
    return refs


rng = np.random.default_rng(0)


def _u8(shape, hi=128):
    return rng.integers(0, hi, shape).astype(U8)


def _i8(shape):
    return rng.integers(-128, 128, shape).astype(I8)


@needs_opencl
def test_quantize_linear_rounds_ties_to_even_and_saturates(tmp_path):
    """Values exactly on a tie (k + 0.5 steps) round to the even neighbour, as onnxruntime does;
    values past the range clamp; per-tensor uint8 with a zero point, and per-axis int8."""
    scale = np.float32(0.25)
    ties = (np.arange(-8, 8) + 0.5).astype(np.float32) * scale
    x = np.concatenate([ties, np.float32([-100, 100, 0, 31.9, -32.1]), rng.standard_normal(43).astype(np.float32)])
    x = x.reshape(2, 32)
    path = _save(tmp_path / "q.onnx", [h.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])], {"x": x},
                 {"s": scale, "z": U8(128)}, ["y"])
    y = _same_as_ort(path, {"x": x}, ("baseline", "astitch", "full"))[0]
    assert y.min() == 0 and y.max() == 255  # both ends saturated
    xa = rng.standard_normal((2, 3, 4)).astype(np.float32) * 3
    path = _save(tmp_path / "qa.onnx", [h.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], axis=1)], {"x": xa},
                 {"s": np.float32([0.1, 0.02, 0.5]), "z": I8([0, -5, 3])}, ["y"])
    _same_as_ort(path, {"x": xa})


@needs_opencl
@pytest.mark.parametrize("opset", [19, 21])
def test_quantize_linear_of_a_float16_tensor(tmp_path, opset):
    """QuantizeLinear of a float16 tensor with a float16 scale (opset 19 on), as a float16 QDQ
    model writes it, and DequantizeLinear back to float16: it was refused ("quantizes a float
    tensor, not FLOAT16"; fuzz graph 1400034, `--more-ops --half-models`). The scale is a power of
    two, so x / scale is exact in float16 and float32 alike and the quantized values are equal."""
    x = (rng.standard_normal((3, 16)) * 4).astype(np.float16)
    path = _save(tmp_path / "q16.onnx", [h.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
                                         h.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])],
                 {"x": x}, {"s": np.float16(0.125), "z": U8(128)}, ["q", "y"], opset=opset)
    q, y = _same_as_ort(path, {"x": x})
    assert y.dtype == np.float16 and 0 < q.min() and q.max() < 255


@needs_opencl
@pytest.mark.parametrize("dtype", [U8, I8, I32])
def test_dequantize_linear_of_a_computed_tensor(tmp_path, dtype):
    """DequantizeLinear of a graph input (per-axis for 8-bit types, per-tensor for int32, whose
    zero point must be 0), and of a constant (folded at import, the weight case)."""
    info = np.iinfo(dtype)
    q = rng.integers(max(info.min, -2**20), min(info.max, 2**20), (2, 3, 5)).astype(dtype)
    if dtype == I32:
        nodes, inits = [h.make_node("DequantizeLinear", ["q", "s"], ["y"])], {"s": np.float32(0.003)}
    else:
        nodes = [h.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=1)]
        inits = {"s": np.float32([0.5, 0.01, 2.0]), "z": np.array([1, 2, 3], dtype)}
    nodes.append(h.make_node("DequantizeLinear", ["w", "s"] + (["z"] if dtype != I32 else []), ["yw"], axis=1))
    inits["w"] = q[::-1].copy()
    _same_as_ort(_save(tmp_path / "dq.onnx", nodes, {"q": q}, inits, ["y", "yw"]), {"q": q})


@needs_opencl
@pytest.mark.parametrize("kind", ["normal", "positive", "zeros"])
def test_dynamic_quantize_linear(tmp_path, kind):
    """Scale, zero point and values as onnxruntime computes them, including the range that must
    include 0 (all positive) and the empty range (all zeros: scale 1)."""
    x = {"normal": rng.standard_normal((4, 33)), "positive": rng.uniform(0.5, 2.0, (4, 33)),
         "zeros": np.zeros((4, 33))}[kind].astype(np.float32)
    path = _save(tmp_path / "dql.onnx", [h.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])], {"x": x}, {},
                 ["y", "s", "z"])
    _same_as_ort(path, {"x": x})


@needs_opencl
def test_matmul_integer_with_zero_points(tmp_path):
    """A batched uint8 A with a scalar zero point, a constant int8 B with one zero point per
    column: the int32 product equals onnxruntime's and numpy's."""
    a, b = _u8((3, 16, 32)), _i8((32, 24))
    bz = rng.integers(-3, 4, 24).astype(I8)
    path = _save(tmp_path / "mmi.onnx", [h.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])], {"a": a},
                 {"b": b, "az": U8(7), "bz": bz}, ["y"])
    y = _same_as_ort(path, {"a": a}, ("baseline", "astitch", "full"))[0]
    np.testing.assert_array_equal(y, (a.astype(np.int64) - 7) @ (b.astype(np.int64) - bz))


@needs_opencl
@pytest.mark.parametrize("op", ["MatMulInteger", "ConvInteger"])
def test_integer_product_past_float32s_exact_range_is_exact(tmp_path, op):
    """A reduction whose float32 sum passes 2**24 (uint8 255s times int8 ±127s, 1024 or 576
    terms): one float32 GEMM would round it; dlcc splits the reduction into exact chunks added in
    int32, and the answer equals numpy's int64 product."""
    if op == "MatMulInteger":
        a = rng.integers(200, 256, (4, 1024)).astype(U8)
        b = rng.choice(np.array([127, 126, 125, -3], I8), (1024, 8))
        nodes, want = [h.make_node(op, ["a", "b"], ["y"])], a.astype(np.int64) @ b.astype(np.int64)
    else:
        a = np.full((1, 64, 5, 5), 255, U8)
        b = np.full((4, 64, 3, 3), 127, I8)
        b[1] = -127
        nodes = [h.make_node(op, ["a", "b"], ["y"])]
        want = np.einsum("nchw,mchw->nm", a[:, :, :3, :3].astype(np.int64), b.astype(np.int64))[:, :, None, None]
        want = np.broadcast_to(want, (1, 4, 3, 3))
    assert np.abs(want).max() > 2 ** 24
    path = _save(tmp_path / "big.onnx", nodes, {"a": a}, {"b": b}, ["y"])
    m = dlcc.compile(path, target="opencl", pipeline="astitch")
    np.testing.assert_array_equal(m({"a": a})["y"], want)


@needs_opencl
def test_conv_integer_with_padding_groups_and_zero_point(tmp_path):
    """Padding takes the zero point's value (it adds 0 once the zero point is subtracted)."""
    x, w = _u8((1, 8, 9, 9)), _i8((6, 4, 3, 3))
    path = _save(tmp_path / "ci.onnx", [h.make_node("ConvInteger", ["x", "w", "xz"], ["y"], pads=[1, 1, 1, 1],
                                                    strides=[2, 2], group=2)], {"x": x}, {"w": w, "xz": U8(5)}, ["y"])
    _same_as_ort(path, {"x": x})


@needs_opencl
def test_qlinear_matmul_and_conv(tmp_path):
    """Requantized products: per-column and per-channel weight scales, an int32 bias."""
    a, b = _u8((2, 5, 16)), _i8((16, 12))
    inits = {"as": np.float32(0.02), "az": U8(3), "b": b, "bs": rng.uniform(0.001, 0.01, 12).astype(np.float32),
             "bz": np.zeros(12, I8), "ys": np.float32(0.05), "yz": U8(100)}
    path = _save(tmp_path / "qmm.onnx", [h.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])],
                 {"a": a}, inits, ["y"])
    _same_as_ort(path, {"a": a}, ("baseline", "astitch", "full"))
    x, w = _u8((1, 4, 7, 7)), _i8((8, 4, 3, 3))
    inits = {"xs": np.float32(0.03), "xz": U8(10), "w": w, "ws": rng.uniform(0.002, 0.02, 8).astype(np.float32),
             "wz": np.zeros(8, I8), "ys": np.float32(0.1), "yz": U8(128), "bias": rng.integers(-500, 500, 8).astype(I32)}
    path = _save(tmp_path / "qc.onnx", [h.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "bias"],
                                                    ["y"], pads=[1, 1, 1, 1])], {"x": x}, inits, ["y"])
    _same_as_ort(path, {"x": x})


def _ms(op, ins, outs, **attrs):
    return h.make_node(op, ins, outs, domain="com.microsoft", **attrs)


@needs_opencl
@pytest.mark.parametrize("case", ["QGemm-requantized", "QGemm-float", "QLinearAdd", "QLinearMul", "QLinearSigmoid",
                                  "QLinearLeakyRelu", "QLinearConcat", "QLinearGlobalAveragePool-nchw",
                                  "QLinearGlobalAveragePool-nhwc", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"])
def test_onnxruntime_qoperator_ops(tmp_path, case):
    """com.microsoft's QOperator ops that onnxruntime.quantization writes, against onnxruntime's
    own kernels (lookup tables for the unary ones, MLAS for the rest), bit for bit."""
    s = {"as": np.float32(0.04), "az": U8(60), "bs": np.float32(0.03), "bz": U8(70), "ys": np.float32(0.05), "yz": U8(120)}
    a = _u8((2, 3, 4, 4))
    if case.startswith("QGemm"):
        a = _u8((5, 16))
        w = _i8((12, 16))
        inits = {"as": s["as"], "az": U8(3), "w": w, "ws": np.float32(0.01), "wz": I8(0), "c": rng.integers(-99, 99, 12).astype(I32)}
        ins = ["a", "as", "az", "w", "ws", "wz", "c"]
        if case == "QGemm-requantized":
            inits.update(ys=s["ys"], yz=s["yz"])
            ins += ["ys", "yz"]
        node = _ms("QGemm", ins, ["y"], transB=1, alpha=0.5)
    elif case in ("QLinearAdd", "QLinearMul"):
        inits = dict(s, b=_u8((1, 3, 1, 4)))
        node = _ms(case, ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    elif case in ("QLinearSigmoid", "QLinearLeakyRelu"):
        inits = s
        node = _ms(case, ["a", "as", "az", "ys", "yz"], ["y"], **({"alpha": 0.1} if "Leaky" in case else {}))
    elif case == "QLinearConcat":
        inits = dict(s, b=_u8((2, 2, 4, 4)), c=_u8((2, 1, 4, 4)))
        node = _ms(case, ["ys", "yz", "a", "as", "az", "b", "bs", "bz", "c", "ys", "yz"], ["y"], axis=1)
    elif case.startswith("QLinearGlobalAveragePool"):
        inits = s
        node = _ms("QLinearGlobalAveragePool", ["a", "as", "az", "ys", "yz"], ["y"], channels_last=int("nhwc" in case))
    elif case == "DynamicQuantizeMatMul":
        a = rng.standard_normal((3, 16)).astype(np.float32)
        inits = {"w": _i8((16, 8)), "ws": rng.uniform(0.01, 0.02, 8).astype(np.float32), "wz": np.zeros(8, I8),
                 "bias": rng.standard_normal(8).astype(np.float32)}
        node = _ms(case, ["a", "w", "ws", "wz", "bias"], ["y"])
    else:
        a = _u8((3, 16))
        inits = {"w": _i8((16, 8)), "as": s["as"], "ws": np.float32(0.02), "az": U8(9), "wz": I8(0),
                 "bias": rng.standard_normal(8).astype(np.float32)}
        node = _ms(case, ["a", "w", "as", "ws", "az", "wz", "bias"], ["y"])
    path = _save(tmp_path / "ms.onnx", [node], {"a": a}, inits, ["y"], microsoft=True)
    if case != "DynamicQuantizeMatMul":
        _same_as_ort(path, {"a": a})
        return
    # A quantizes to the whole uint8 range, where onnxruntime's product saturates: the answer is
    # its own DynamicQuantizeLinear, an int64 product, and its float32 rescale (a_s * b_s) + bias.
    q, sc, z = _ort(_save(tmp_path / "dql.onnx", [h.make_node("DynamicQuantizeLinear", ["a"], ["q", "s", "z"])],
                          {"a": a}, {}, ["q", "s", "z"]), {"a": a})
    acc = (q.astype(np.int64) - z) @ inits["w"].astype(np.int64)
    want = acc.astype(np.float32) * (sc * inits["ws"]) + inits["bias"]
    for p in ("baseline", "astitch"):
        np.testing.assert_array_equal(dlcc.compile(path, target="opencl", pipeline=p)({"a": a})["y"], want)


@needs_opencl
@pytest.mark.parametrize("case", ["softmax-u8-13", "softmax-i8-13-axis1", "softmax-u8-12-axis1", "softmax-i8-11-noaxis",
                                  "avgpool-nchw", "avgpool-nhwc-pads", "avgpool-1d-include-pad"])
def test_onnxruntime_qlinear_softmax_and_average_pool(tmp_path, case):
    """QLinearSoftmax (onnxruntime's float lookup table, opset-13 and opset-12 axis semantics, axis
    -1 where absent whatever the opset) and QLinearAveragePool (NCHW and NHWC, pads, 1-D), against
    onnxruntime's own kernels, bit for bit. (The values come from a generator of the case's own,
    so that they do not depend on the order the tests run in: the softmax's sums, summed in
    another order than onnxruntime's, land on no rounding tie for these.)"""
    gen = np.random.default_rng(sum(map(ord, case)))
    if case.startswith("softmax"):
        _, t, opset, *rest = case.split("-")
        signed = t == "i8"
        shape = (3, 77) if not rest else (2, 5, 7)
        a = gen.integers(-128, 128, shape).astype(I8) if signed else gen.integers(0, 256, shape).astype(U8)
        zp = I8(-128) if signed else U8(0)
        inits = {"xs": np.float32(0.05), "xz": zp * 0, "ys": np.float32(1 / 256), "yz": zp}
        attrs = {"opset": int(opset), **({"axis": 1} if rest == ["axis1"] else {})}
        node = _ms("QLinearSoftmax", ["a", "xs", "xz", "ys", "yz"], ["y"], **attrs)
    else:
        a = gen.integers(0, 256, (2, 6, 9) if "1d" in case else (2, 7, 7, 3) if "nhwc" in case else (2, 3, 7, 7)).astype(U8)
        attrs = ({"kernel_shape": [3], "strides": [2], "pads": [1, 1], "count_include_pad": 1} if "1d" in case
                 else {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "channels_last": 1}
                 if "nhwc" in case else {"kernel_shape": [2, 3], "strides": [1, 2]})
        inits = {"xs": np.float32(0.037), "xz": U8(100), "ys": np.float32(0.011), "yz": U8(131)}
        node = _ms("QLinearAveragePool", ["a", "xs", "xz", "ys", "yz"], ["y"], **attrs)
    _same_as_ort(_save(tmp_path / "q.onnx", [node], {"a": a}, inits, ["y"], microsoft=True), {"a": a})


@needs_opencl
def test_maxpool_of_quantized_values(tmp_path):
    """QOperator models pool uint8 and int8 values: pooled in float32, cast back, exact."""
    x = _i8((1, 3, 8, 8))
    path = _save(tmp_path / "mp.onnx", [h.make_node("QuantizeLinear", ["f", "s", "z"], ["q"]),
                                        h.make_node("MaxPool", ["q"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
                 {"f": x.astype(np.float32)}, {"s": np.float32(0.5), "z": I8(0)}, ["y"])
    _same_as_ort(path, {"f": x.astype(np.float32)})


def test_verify_reference_is_exact_where_onnxruntime_saturates(tmp_path):
    """onnxruntime's own MatMulInteger gives 131068 for a row of 255s times a column of eight
    127s on x86 without VNNI (pairs summed in int16 with saturation; 259080 where it has VNNI).
    verify's reference computes the product exactly on every CPU."""
    from dlcc.verify import run_onnxruntime

    path = _save(tmp_path / "sat.onnx", [h.make_node("MatMulInteger", ["a", "b"], ["y"])], {"a": np.full((1, 8), 255, U8)},
                 {"b": np.full((8, 2), 127, I8)}, ["y"])
    assert run_onnxruntime(path, {"a": np.full((1, 8), 255, U8)})[0].tolist() == [[259080, 259080]]


@pytest.fixture(scope="module")
def quantized_cnn(model_path, tmp_path_factory):
    """cnn-small from torch's exporter, quantized by onnxruntime.quantization three ways."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static

    src = str(model_path("cnn"))
    d = tmp_path_factory.mktemp("quantized")
    shape = [dim.dim_value or 1 for dim in onnx.load(src).graph.input[0].type.tensor_type.shape.dim]
    name = onnx.load(src).graph.input[0].name

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.left = [{name: np.random.default_rng(k).standard_normal(shape).astype(np.float32)} for k in range(4)]

        def get_next(self):
            return self.left.pop() if self.left else None

    out = {"dynamic": str(d / "dyn.onnx")}
    quantize_dynamic(src, out["dynamic"], weight_type=QuantType.QInt8)
    for fmt in ("QDQ", "QOperator"):
        out[fmt] = str(d / f"{fmt}.onnx")
        quantize_static(src, out[fmt], Reader(), quant_format=getattr(QuantFormat, fmt))
    return out


@needs_opencl
@pytest.mark.parametrize("form", ["dynamic", "QDQ", "QOperator"])
def test_quantized_models_verify(quantized_cnn, form):
    """What onnxruntime.quantization writes, compiled and verified as `dlcc verify` does."""
    from dlcc.verify import verify_outputs

    path = quantized_cnn[form]
    for pipeline in ("astitch", "full"):
        cm = dlcc.compile(path, target="opencl", pipeline=pipeline)
        feeds = cm.sample_inputs(0)
        rows = verify_outputs(path, cm(feeds), feeds, compiled=cm)
        assert all(r["passed"] for r in rows), rows
    log = " ".join(cm.plan["meta"]["pass_log"])
    assert "quantized ops computed in float32" in log


@needs_opencl
@pytest.mark.parametrize("pipeline", ["baseline", "astitch"])
def test_what_a_quantizer_reads_stays_float32_at_bf16(tmp_path, pipeline):
    """The activation a DynamicQuantizeLinear reads is not stored in bfloat16 at bf16, nor what it
    is computed from by elementwise ops (narrow.rounded_to_a_grid): an 8-bit step is as fine as
    bfloat16's significand, so the rounding flipped quantized values near their ties (ddddocr's
    `common_old.onnx` was 0.61 off at bf16, 0.0034 at fp16). Here x * 37.5 + 1 is computed in
    float either way, so the bf16 plan quantizes exactly what the fp32 plan does. (The product
    after it, stored in bfloat16 through `baseline`, differs as any bf16 activation does.)"""
    x = rng.uniform(-3, 3, (8, 64)).astype(np.float32)
    nodes = [h.make_node("Mul", ["x", "c"], ["t"]), h.make_node("Add", ["t", "one"], ["u"]),
             h.make_node("DynamicQuantizeLinear", ["u"], ["q", "s", "z"]),
             h.make_node("MatMulInteger", ["q", "w", "z"], ["acc"]),
             h.make_node("Cast", ["acc"], ["accf"], to=TP.FLOAT),
             h.make_node("Mul", ["s", "ws"], ["sc"]),
             h.make_node("Mul", ["accf", "sc"], ["y"])]
    path = _save(tmp_path / "dyn.onnx", nodes, {"x": x},
                 {"c": np.float32(37.5), "one": np.float32(1.0), "w": _i8((64, 32)), "ws": np.float32(0.01)}, ["y", "q"])
    fp32 = dlcc.compile(path, target="opencl", pipeline=pipeline)({"x": x})
    bf16 = dlcc.compile(path, target="opencl", pipeline=pipeline, precision="bf16")({"x": x})
    np.testing.assert_array_equal(bf16["q"], fp32["q"])
    np.testing.assert_array_equal(fp32["q"], _ort(path, {"x": x})[1])


@needs_opencl
def test_integer_products_stay_float32_at_bf16(tmp_path):
    """At bf16 the quantized arithmetic is kept float32 (a 16-bit type holds neither the sums nor
    x / scale): a dynamic-quantized product gives the fp32 plan's answer exactly."""
    x = rng.standard_normal((8, 64)).astype(np.float32)
    nodes = [h.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"]),
             h.make_node("MatMulInteger", ["q", "w", "z"], ["acc"]),
             h.make_node("Cast", ["acc"], ["accf"], to=TP.FLOAT),
             h.make_node("Mul", ["s", "ws"], ["sc"]),
             h.make_node("Mul", ["accf", "sc"], ["y"])]
    path = _save(tmp_path / "dyn.onnx", nodes, {"x": x}, {"w": _i8((64, 32)), "ws": np.float32(0.01)}, ["y"])
    fp32 = dlcc.compile(path, target="opencl", pipeline="astitch")({"x": x})["y"]
    bf16 = dlcc.compile(path, target="opencl", pipeline="astitch", precision="bf16")({"x": x})["y"]
    np.testing.assert_array_equal(bf16, fp32)
    q, sc, z = _ort(_save(tmp_path / "dql.onnx", nodes[:1], {"x": x}, {}, ["q", "s", "z"]), {"x": x})
    acc = (q.astype(np.int64) - z) @ onnx.numpy_helper.to_array(onnx.load(path).graph.initializer[0]).astype(np.int64)
    np.testing.assert_array_equal(fp32, acc.astype(np.float32) * (sc * np.float32(0.01)))


@needs_opencl
@pytest.mark.parametrize("qtype", [np.int16, np.uint16])
def test_16_bit_quantize_dequantize_pairs(tmp_path, qtype):
    """A 16-bit Q -> DQ pair (the quantized values held in their own type): ties round to even,
    both ends of the range saturate, per-tensor and per-axis, each equal to onnxruntime's."""
    info = np.iinfo(qtype)
    scale = np.float32(0.5)
    zp = qtype(3 if qtype == np.uint16 else -7)
    ties = (np.arange(-40, 40) + 0.5).astype(np.float32) * scale
    x = np.concatenate([ties, np.float32([info.min, info.max, 2.0 * info.max, -2.0 * info.max - 10, 0]),
                        rng.standard_normal(35).astype(np.float32) * 1000]).reshape(4, 30)
    nodes = [h.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]), h.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    path = _save(tmp_path / "qdq.onnx", nodes, {"x": x}, {"s": scale, "z": zp}, ["y"], opset=21)
    y = _same_as_ort(path, {"x": x})[0]
    assert y.min() == (info.min - float(zp)) * scale and y.max() == (info.max - float(zp)) * scale  # saturated
    # verify's quantization judge reads the 16-bit values back, typed as the model types them:
    # onnxruntime's own quantized values
    from dlcc.quant_judge import _instrumented_run

    cm = dlcc.compile(path, target="opencl", pipeline="astitch")
    mine = _instrumented_run(onnx.load(path), ["q"], {"x": x}, cm)
    only_q = _save(tmp_path / "q.onnx", nodes[:1], {"x": x}, {"s": scale, "z": zp}, ["q"], opset=21)
    want = _ort(only_q, {"x": x})[0]
    assert mine["q"].dtype == want.dtype == qtype
    np.testing.assert_array_equal(mine["q"], want)
    nodes = [h.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=0),
             h.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=0)]
    path = _save(tmp_path / "axis.onnx", nodes, {"x": x}, {"s": np.float32([0.5, 0.01, 2.0, 7.0]),
                                                           "z": np.array([0, 1, 2, 3], qtype)}, ["y"], opset=21)
    _same_as_ort(path, {"x": x})


@needs_opencl
@pytest.mark.parametrize("act, weight", [("QInt16", "QInt8"), pytest.param("QUInt16", "QUInt8", marks=pytest.mark.slow),
                                         pytest.param("QInt16", "QInt16", marks=pytest.mark.slow), ("QUInt16", "QUInt16")])
def test_16_bit_activation_qdq_models_verify(model_path, tmp_path, act, weight):
    """What onnxruntime.quantization writes for 16-bit activations (A16W8, A16W16: its choice for
    accuracy on NPUs), from the cnn test model, through astitch, verified as `dlcc verify` does. At
    65536 levels a step is small enough that a convolution's last-bit difference from onnxruntime's
    summation lands some values one step apart at a tie. At a tolerance of 1e-6 such a step fails
    the plain comparison, so the quantization judge must prove it (it reads the 16-bit values
    back)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from dlcc.verify import verify_outputs

    src = str(model_path("cnn"))
    first = onnx.load(src).graph.input[0]
    shape = [dim.dim_value or 1 for dim in first.type.tensor_type.shape.dim]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.left = [{first.name: np.random.default_rng(k).standard_normal(shape).astype(np.float32)} for k in range(3)]

        def get_next(self):
            return self.left.pop() if self.left else None

    path = str(tmp_path / "a16.onnx")
    quantize_static(src, path, Reader(), quant_format=QuantFormat.QDQ, activation_type=getattr(QuantType, act),
                    weight_type=getattr(QuantType, weight))
    cm = dlcc.compile(path, target="opencl", pipeline="astitch")
    feeds = cm.sample_inputs(0)
    got = cm(feeds)
    rows = verify_outputs(path, got, feeds, rtol=1e-6, atol=1e-6, compiled=cm)
    assert all(r["passed"] for r in rows), rows


@needs_opencl
@pytest.mark.parametrize("qtype", [np.int16, np.uint16])
def test_16_bit_quantized_values_are_tensors_of_their_own_type(tmp_path, qtype):
    """A 16-bit QuantizeLinear's output is an int16/uint16 tensor like any other: a graph output,
    or read by an integer op (Abs, Add, a Transpose) before a Cast; each equal to onnxruntime's."""
    x = {"x": (rng.standard_normal((2, 4)) * 300).astype(np.float32)}
    zp = qtype(5)
    path = _save(tmp_path / "q.onnx", [h.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])], x,
                 {"s": np.float32(0.1), "z": zp}, ["y"], opset=21)
    assert _same_as_ort(path, x)[0].dtype == qtype
    nodes = [h.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]), h.make_node("Abs", ["q"], ["a"], name="abs"),
             h.make_node("Add", ["a", "z"], ["b"]), h.make_node("Transpose", ["b"], ["t"]),
             h.make_node("Cast", ["t"], ["y"], to=TP.FLOAT)]
    path = _save(tmp_path / "abs.onnx", nodes, x, {"s": np.float32(0.1), "z": zp}, ["y", "q"], opset=21)
    _same_as_ort(path, x)


def test_unsupported_quantized_forms_are_clear_errors(tmp_path):
    g = h.make_graph([h.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]), h.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])],
                     "i4", [h.make_tensor_value_info("x", TP.FLOAT, [2, 4])], [h.make_tensor_value_info("y", TP.FLOAT, [2, 4])],
                     [nh.from_array(np.float32(0.1), "s"), h.make_tensor("z", TP.INT4, [], [0])])
    g.node[1].output[0] = "d"  # (int4 compiles, held_types.py: E8M0 stands for a type dlcc lacks)
    g.node.append(h.make_node("Cast", ["d"], ["y"], to=TP.FLOAT8E8M0))
    g.output[0].type.tensor_type.elem_type = TP.FLOAT8E8M0
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 24)], ir_version=11), str(tmp_path / "e8.onnx"))
    with pytest.raises(DlccError, match="float8_e8m0fnu"):
        dlcc.compile(str(tmp_path / "e8.onnx"), target="opencl")
    q = {"q": np.zeros((2, 4), I8)}
    path = _save(tmp_path / "blk.onnx", [h.make_node("DequantizeLinear", ["q", "s"], ["y"], axis=1, block_size=2)], q,
                 {"s": np.ones((2, 2), np.float32)}, ["y"], opset=21)
    with pytest.raises(DlccError, match="blocked quantization"):
        dlcc.compile(path, target="opencl")


@needs_opencl
def test_opset_10_models_are_converted(tmp_path):
    """Quantized ops at opset 10 (onnxruntime's quantizer once wrote them): the model is converted
    to opset 11, Clip's attributes to inputs included, and computes what onnxruntime does."""
    x = (rng.standard_normal((2, 16)) * 4).astype(np.float32)
    nodes = [h.make_node("Clip", ["x"], ["c"], min=-3.0, max=3.0), h.make_node("QuantizeLinear", ["c", "s", "z"], ["q"]),
             h.make_node("MatMulInteger", ["q", "w", "z"], ["y"])]
    path = _save(tmp_path / "o10.onnx", nodes, {"x": x}, {"s": np.float32(0.05), "z": U8(64), "w": _u8((16, 4), 8)},
                 ["y"], opset=10)
    _same_as_ort(path, {"x": x})
    assert any("converted from opset 10 to 11" in n for n in dlcc.compile(path, target="opencl").plan["meta"]["pass_log"])


@needs_opencl
def test_blocked_dequantize_of_a_constant(tmp_path):
    """Opset 21's blocked weights (block_size along an axis) are dequantized at import."""
    w = _i8((6, 4))
    x = rng.standard_normal((3, 6)).astype(np.float32)
    nodes = [h.make_node("DequantizeLinear", ["w", "s", "z"], ["wf"], axis=0, block_size=4),
             h.make_node("MatMul", ["x", "wf"], ["y"])]
    inits = {"w": w, "s": rng.uniform(0.01, 0.1, (2, 4)).astype(np.float32), "z": _i8((2, 4))}
    path = _save(tmp_path / "b.onnx", nodes, {"x": x}, inits, ["y"], opset=21)
    got = dlcc.compile(path, target="opencl")({"x": x})["y"]
    np.testing.assert_allclose(got, _ort(path, {"x": x})[0], rtol=1e-6, atol=1e-6)


# -- the quantization judge ----------------------------------------------------------------------

def _judge_model(tmp_path):
    nodes = [h.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]), h.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    return _save(tmp_path / "j.onnx", nodes, {"x": np.zeros(6, np.float32)}, {"s": np.float32(0.5), "z": U8(10)}, ["y"])


@pytest.mark.parametrize("mine, verdict", [([10, 12, 12, 13, 14, 15], ""),   # all as onnxruntime
                                           ([10, 11, 12, 13, 14, 15], ""),   # x = 0.75: a tie, either way
                                           ([10, 12, 12, 14, 14, 15], "does not round"),  # 1.5 → 13, not 14
                                           ([10, 12, 12, 13, 14, 17], "does not round")])  # two steps off
def test_judge_accepts_a_tie_and_nothing_else(tmp_path, mine, verdict):
    from dlcc.quant_judge import _check_points

    m = onnx.load(_judge_model(tmp_path))
    x = np.float32([0.0, 0.75, 1.0, 1.5, 2.0, 2.5])  # onnxruntime's values before quantization
    ref = np.array([10, 12, 12, 13, 14, 15], U8)  # round(x / 0.5) + 10, ties to even
    flips, total, bad, worst = _check_points(m, [0], {"q": np.array(mine, U8)}, {"q#ref": ref, "x#x": x}, 1e-3, 1e-4)
    assert total == 6 and flips == (mine != [10, 12, 12, 13, 14, 15] and not verdict)
    assert worst == 0.0  # the one value rounded the other way (x = 0.75) sits on its tie
    assert (verdict in bad) if verdict else bad == ""


@needs_opencl
def test_judge_passes_a_plan_that_rounds_a_tie_the_other_way(tmp_path):
    """A Sigmoid, quantized to 1/255 steps: PoCL's and onnxruntime's sigmoids differ in the last
    bits, so a value within them of a tie is rounded apart, and the scale-by-1000 after
    dequantization turns that step into 3.9 units, far past the fp32 tolerance. The judge proves
    the difference is such a tie. The same plan with one output value changed stays failed."""
    from dlcc.verify import verify_outputs

    x = np.random.default_rng(0).uniform(-3, 1.5, (512, 1024)).astype(np.float32)
    nodes = [h.make_node("Sigmoid", ["x"], ["m"]), h.make_node("QuantizeLinear", ["m", "s", "z"], ["q"]),
             h.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]), h.make_node("Mul", ["d", "k"], ["y"])]
    path = _save(tmp_path / "flip.onnx", nodes, {"x": x}, {"s": np.float32(1 / 255), "z": U8(0), "k": np.float32(1000)}, ["y"])
    cm = dlcc.compile(path, target="opencl", pipeline="astitch")
    feeds = {"x": x}
    got = cm(feeds)
    rows = verify_outputs(path, got, feeds, compiled=cm)
    assert rows[0]["passed"], rows
    if rows[0].get("judge") != "quantization":
        pytest.skip("no value fell within the sigmoids' difference of a tie on this machine")
    assert "quantized values are rounded apart" in rows[0]["note"]
    got["y"].flat[7] += 3.92
    rows = verify_outputs(path, got, feeds, compiled=cm)
    assert not rows[0]["passed"] and "computes other outputs" in rows[0]["note"]


@needs_opencl
def test_verify_refuses_a_rewrite_that_computes_something_else(tmp_path, monkeypatch):
    """verify's reference for a quantized model runs dlcc's own exact rewrite of the fused
    quantized ops (a DynamicQuantizeLSTM unrolled into per-step DynamicQuantizeLinear nodes), the
    code that dlcc compiles, so a wrong rewrite is in both and would pass. verify checks the
    rewrite against onnxruntime's own kernels (dlcc/rewrite_check.py). Here the rewrite's rescale
    is 1% off: verify must fail the output and say that the reference is wrong."""
    from dlcc import quantized, quantized_lstm  # (quantized_lstm builds on quantized: that one first)
    from dlcc.rewrite_check import onnxruntime_saturates
    from dlcc.verify import verify_outputs

    if onnxruntime_saturates():
        pytest.skip("onnxruntime's own uint8 x int8 products saturate on this CPU: the reference is not checked")
    seq, width, hidden = 5, 8, 4
    r = np.random.default_rng(4)
    inits = {"W": r.integers(-64, 65, (1, width, 4 * hidden)).astype(I8), "R": r.integers(-64, 65, (1, hidden, 4 * hidden)).astype(I8),
             "ws": np.float32([0.01]), "wz": np.zeros(1, I8), "rs": np.float32([0.02]), "rz": np.zeros(1, I8)}
    feeds = {"x": r.standard_normal((seq, 2, width)).astype(np.float32)}
    node = _ms("DynamicQuantizeLSTM", ["x", "W", "R", "", "", "", "", "", "ws", "wz", "rs", "rz"], ["y"], hidden_size=hidden)
    path = _save(tmp_path / "lstm.onnx", [node], feeds, inits, ["y"], microsoft=True)
    cm = dlcc.compile(path, target="opencl", pipeline="astitch")
    rows = verify_outputs(path, cm(feeds), feeds, compiled=cm)
    assert rows[0]["passed"] and "note" not in rows[0], rows  # (the real rewrite is onnxruntime's op, checked)
    scaled = quantized_lstm._scaled_product
    monkeypatch.setattr(quantized_lstm, "_scaled_product",
                        lambda b, *a: b.op("Mul", [scaled(b, *a), b.constant(np.float32(1.01))]))
    cm = dlcc.compile(path, target="opencl", pipeline="astitch")
    rows = verify_outputs(path, cm(feeds), feeds, compiled=cm)
    assert not rows[0]["passed"] and "the reference is wrong" in rows[0]["note"], rows


def test_judge_holds_a_qlinear_softmax_to_onnxruntimes_value_before_rounding(tmp_path):
    """QLinearSoftmax's sum is dlcc's reduction, not onnxruntime's loop (dlcc/quantized_qlinear.py):
    the judge computes onnxruntime's value before rounding from the quantized input and accepts a
    value rounded the other way at a tie, and nothing else."""
    from dlcc.quant_judge import _check_points
    from dlcc.quantized_qlinear import softmax_before_rounding

    x = np.random.default_rng(3).integers(0, 256, (2, 40)).astype(U8)  # (its own generator: order-independent)
    inits = {"xs": np.float32(0.05), "xz": U8(0), "ys": np.float32(1 / 256), "yz": U8(0)}
    node = _ms("QLinearSoftmax", ["x", "xs", "xz", "ys", "yz"], ["q"], opset=13)
    m = onnx.load(_save(tmp_path / "s.onnx", [node], {"x": x}, inits, ["q"], microsoft=True))
    v = softmax_before_rounding(node, x, 0.05, 1 / 256)
    ref = np.clip(np.rint(v), 0, 255).astype(U8)
    assert np.array_equal(ref, _ort(m, {"x": x})[0])  # the judge's onnxruntime value is onnxruntime's
    inner = (ref > 0) & (ref < 255)  # (where a step either way stays in uint8)
    k = int(np.argmin(np.where(inner, np.abs(v - np.floor(v) - 0.5), np.inf)))  # the value nearest a tie
    off = abs(v.flat[k] - np.floor(v.flat[k]) - 0.5)  # its distance from the tie, in steps
    near, far = ref.copy(), ref.copy()
    near.flat[k] += 1 if np.rint(v.flat[k]) < v.flat[k] else -1
    far.flat[k] += 2
    covers, short = (off + 1e-3) / 256, (off / 2) / 256  # atol just past the distance, and short of it
    for mine, atol, ok in ((ref, short, True), (near, covers, True), (near, short, False), (far, covers, False)):
        flips, total, bad, _ = _check_points(m, [0], {"q": mine, "x": x}, {"q#ref": ref}, 0.0, atol)
        assert (bad == "") == ok and total == 80 and flips == (ok and mine is near), (bad, off)


@needs_opencl
def test_qlinear_softmax_saturates_a_probability_of_one(tmp_path):
    """int8 QLinearSoftmax with y_scale 1/256 and y_zp −128: a probability of 1 is 256 − 128 = 128
    steps, past 127, and is clamped to 127, as onnxruntime's kernel does."""
    x = np.zeros((2, 8), I8)
    x[:, 3] = 127  # exp(127 · 0.5) dwarfs the rest: a probability of 1 to float precision
    inits = {"xs": np.float32(0.5), "xz": I8(0), "ys": np.float32(1 / 256), "yz": I8(-128)}
    node = _ms("QLinearSoftmax", ["x", "xs", "xz", "ys", "yz"], ["q"], opset=13)
    ref = _same_as_ort(_save(tmp_path / "one.onnx", [node], {"x": x}, inits, ["q"], microsoft=True), {"x": x})[0]
    assert (ref[:, 3] == 127).all() and (ref[:, :3] == -128).all()


@pytest.mark.slow
@needs_opencl
def test_qoperator_transformer_verifies(model_path, tmp_path):
    """bert-small from torch's exporter, quantized by onnxruntime.quantization to QOperator form
    with int8 activations: its attention's QLinearSoftmax and the QLinearMatMuls around it,
    compiled and verified as `dlcc verify` does. (slow: PoCL builds its kernels cold in one to
    three minutes on 2 cores; the ops themselves are checked against onnxruntime above.)"""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from dlcc.verify import verify_outputs

    src = str(model_path("bert"))
    ins = [(i.name, [d.dim_value or 1 for d in i.type.tensor_type.shape.dim]) for i in onnx.load(src).graph.input]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.left = [{n: np.random.default_rng(k).integers(0, 50, shape).astype(np.int64) for n, shape in ins}
                         for k in range(2)]

        def get_next(self):
            return self.left.pop() if self.left else None

    path = str(tmp_path / "bert-qop.onnx")
    quantize_static(src, path, Reader(), quant_format=QuantFormat.QOperator, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8)
    assert "QLinearSoftmax" in {n.op_type for n in onnx.load(path).graph.node}
    cm = dlcc.compile(path, target="opencl", pipeline="astitch")
    feeds = cm.sample_inputs(0)
    rows = verify_outputs(path, cm(feeds), feeds, compiled=cm)
    assert all(r["passed"] for r in rows), rows


@pytest.mark.skipif(__import__("dlcc.backends.nvcc", fromlist=["find_nvcc"]).find_nvcc() is None,
                    reason="nvcc is not installed on this machine")
def test_quantized_kernels_compile_for_cuda(quantized_cnn):
    """The kernels of the three quantized forms, at fp32 and bf16 (quantized arithmetic kept
    float32 beside the tensor-core GEMMs), through nvcc for sm_80 and sm_90 without spills."""
    from dlcc.backends.nvcc import compile_cubin
    from dlcc.backends.source import render

    codes: dict[str, str] = {}
    for path in quantized_cnn.values():
        for pipeline, precision in (("astitch", "fp32"), ("astitch", "bf16")):
            m = dlcc.compile(path, target="opencl", pipeline=pipeline, precision=precision)
            codes.update(zip([k["name"] for k in m.plan["kernels"]], m.kernel_codes))
    source = render(list(codes.values()), "cuda")
    for arch in ("sm_80", "sm_90"):
        usage = compile_cubin(source, arch)
        assert set(codes) <= set(usage)
        assert not {k: u for k, u in usage.items() if u.spills}


def _ort_threads(path, feeds, threads):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = threads
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(None, feeds)


@needs_opencl
@pytest.mark.parametrize("direction, batch, extras", [("forward", 1, ("baseline",)), ("reverse", 1, ("h0",)),
                                                      ("bidirectional", 1, ("h0", "per-channel")),
                                                      ("forward", 1, ("peepholes", "clip")),
                                                      ("bidirectional", 2, ("h0", "peepholes", "clip")),
                                                      ("bidirectional", 2, ("h0", "lens-input", "baseline")),
                                                      ("reverse", 3, ("lens-input", "peepholes")),
                                                      ("forward", 3, ("lens-const", "h0")),
                                                      ("bidirectional", 1, ("lens-const",)),
                                                      ("bidirectional", 2, ("lens-input", "short")),
                                                      ("reverse", 1, ("lens-const", "short")),
                                                      ("bidirectional", 2, ("wide", "lens-input", "short")),
                                                      ("forward", 3, ("wide", "lens-const", "no-y")),
                                                      ("reverse", 4, ("wide", "h0"))])
def test_dynamic_quantize_lstm(tmp_path, direction, batch, extras):
    """com.microsoft's DynamicQuantizeLSTM (quantize_dynamic's LSTM), unrolled with X and each
    step's h quantized dynamically, against onnxruntime's own kernel. Weights stay within ±64,
    where onnxruntime's uint8 x int8 product does not saturate; at batch 2 onnxruntime runs one
    thread per sequence (intra_op_num_threads=2; 3 at batch 3), each quantizing its own h, as dlcc
    does. Packed sequences: sequence_lens as an input or a constant, with entries shorter than the
    sequence (a step past an entry's length keeps its state and writes 0). `short`: every entry
    ends before the sequence does, and X is largest past the longest entry, where onnxruntime
    neither reads nor quantizes it (its X·W covers max(sequence_lens) steps). `wide`: a hidden
    size over 256 at batch 2 to 4, where onnxruntime does not split the batch and quantizes all of
    h with one scale, reading a stopped entry's row as 0 where Y is an output (`no-y`: its h).
    Through astitch; `baseline` also through baseline (the rewrite is the same for every pipeline,
    and each PoCL build of the unrolled steps takes seconds)."""
    seq, width, hidden = 6, 8, (260 if "wide" in extras else 4)
    nd = 2 if direction == "bidirectional" else 1
    r = np.random.default_rng(1)
    cols = (nd, 4 * hidden) if "per-channel" in extras else (nd,)
    inits = {"W": r.integers(-64, 65, (nd, width, 4 * hidden)).astype(I8), "R": r.integers(-64, 65, (nd, hidden, 4 * hidden)).astype(I8),
             "B": r.standard_normal((nd, 8 * hidden)).astype(np.float32),
             "ws": r.uniform(0.005, 0.02, cols).astype(np.float32), "wz": np.zeros(cols, I8),
             "rs": r.uniform(0.01, 0.03, cols).astype(np.float32), "rz": np.zeros(cols, I8)}
    feeds = {"x": r.standard_normal((seq, batch, width)).astype(np.float32)}
    ins = ["x", "W", "R", "B", "", "", "", "", "ws", "wz", "rs", "rz"]
    if "h0" in extras:
        feeds.update(h0=r.standard_normal((nd, batch, hidden)).astype(np.float32),
                     c0=r.standard_normal((nd, batch, hidden)).astype(np.float32))
        ins[5:7] = ["h0", "c0"]
    if "peepholes" in extras:
        inits["P"] = r.standard_normal((nd, 3 * hidden)).astype(np.float32)
        ins[7] = "P"
    lens = np.array([seq, 2, 5][:batch] if batch > 1 else [4], I32)
    if "short" in extras:
        lens = np.array([4, 2][:batch], I32)
        feeds["x"][4:] *= 8
    if "lens-input" in extras:
        feeds["lens"], ins[4] = lens, "lens"
    if "lens-const" in extras:
        inits["lens"], ins[4] = lens, "lens"
    attrs = {"direction": direction, "hidden_size": hidden, **({"clip": 1.5} if "clip" in extras else {})}
    outs = ["", "yh", "yc"] if "no-y" in extras else ["y", "yh", "yc"]
    path = _save(tmp_path / "lstm.onnx", [_ms("DynamicQuantizeLSTM", ins, outs, **attrs)], feeds, inits,
                 [o for o in outs if o], microsoft=True)
    refs = _ort_threads(path, feeds, max(batch, 2))
    for pipeline in ("baseline", "astitch") if "baseline" in extras else ("astitch",):
        got = dlcc.compile(path, target="opencl", pipeline=pipeline)(feeds)
        for name, ref in zip([o for o in outs if o], refs):
            np.testing.assert_allclose(got[name], ref, rtol=1e-6, atol=1e-6, err_msg=f"{pipeline} {name}")


def test_dynamic_quantize_lstm_refusals(tmp_path):
    """What the unrolling cannot do is one clear error naming the node."""
    hidden, width = 4, 8
    inits = {"W": np.zeros((1, width, 16), I8), "R": np.zeros((1, hidden, 16), I8), "ws": np.float32([0.1]),
             "wz": I8([0]), "rs": np.float32([0.1]), "rz": I8([0]), "lens": np.array([3], I32)}
    feeds = {"x": np.zeros((5, 1, width), np.float32)}
    ins = ["x", "W", "R", "", "lens", "", "", "", "ws", "wz", "rs", "rz"]
    path = _save(tmp_path / "l.onnx", [_ms("DynamicQuantizeLSTM", ins, ["y"], hidden_size=hidden)], feeds, inits, ["y"],
                 microsoft=True)
    # a length past the sequence, and two lengths for one entry (which onnxruntime refuses to run)
    for lens, why in (([7], r"sequence_lens \[7\] outside 1..5 \(the sequence's length\)"),
                      ([3, 3], r"sequence_lens of shape \[2\], not \[1\]")):
        m = onnx.load(path)
        m.graph.initializer[[i.name for i in m.graph.initializer].index("lens")].CopyFrom(nh.from_array(np.array(lens, I32), "lens"))
        onnx.save(m, tmp_path / "bad.onnx")
        with pytest.raises(DlccError, match=why + " is not supported"):
            dlcc.compile(str(tmp_path / "bad.onnx"), target="opencl")


@needs_opencl
def test_double_quantization_is_kept(tmp_path):
    """Q(s1) → DQ(s1) → Q(s2) → DQ(s2) rounds twice, and means it. onnxruntime's basic optimizer
    (which dlcc's import folds with) merges such pairs into one (DoubleQDQPairsRemover), which gave
    a quantized ViT's outputs 0.24 off the model; the import turns its QDQ rewrites off."""
    x = np.random.default_rng(3).uniform(0, 1, (4, 64)).astype(np.float32)
    nodes = [h.make_node("Softmax", ["x"], ["p"], axis=-1), h.make_node("QuantizeLinear", ["p", "s1", "z"], ["q1"]),
             h.make_node("DequantizeLinear", ["q1", "s1", "z"], ["d1"]), h.make_node("QuantizeLinear", ["d1", "s2", "z"], ["q2"]),
             h.make_node("DequantizeLinear", ["q2", "s2", "z"], ["d2"]), h.make_node("Mul", ["d2", "k"], ["y"])]
    path = _save(tmp_path / "qq.onnx", nodes, {"x": x}, {"s1": np.float32(1 / 1024), "s2": np.float32(1 / 300),
                                                         "z": U8(0), "k": np.float32(1000)}, ["y"])
    _same_as_ort(path, {"x": x})
    log = dlcc.compile(path, target="opencl").plan["meta"]["pass_log"]
    assert any("2 QuantizeLinear" in line for line in log), log


def _pack(values: np.ndarray, bits: int) -> np.ndarray:
    """values (ints below 2**bits) along the last axis packed least significant bits first, one
    byte stream per row (MatMulNBits' layout), written bit by bit (not quantized_blocks' code)."""
    rows = values.reshape(-1, values.shape[-1])
    out = np.zeros((rows.shape[0], -(-rows.shape[1] * bits // 8)), np.uint8)
    for r, row in enumerate(rows):
        for j, v in enumerate(row):
            for t in range(bits):
                if (int(v) >> t) & 1:
                    pos = j * bits + t
                    out[r, pos // 8] |= np.uint8(1 << (pos % 8))
    return out.reshape(*values.shape[:-1], -1)


@needs_opencl
@pytest.mark.parametrize("bits,block,K,zp_kind", [(4, 32, 80, "uint8"), (4, 16, 64, None), (4, 16, 48, "float"),
                                              (8, 16, 48, "uint8"), (2, 32, 64, "uint8"), (2, 16, 64, None)])
def test_matmul_nbits_matches_onnxruntime(tmp_path, bits, block, K, zp_kind):
    """MatMulNBits (int2/4/8 weights in blocks along K, a last block past K, packed uint8 or
    float zero points or the default 2^(bits-1), a bias) against
    onnxruntime's own kernel; its weights are dequantized at import into a float MatMul, which
    then follows the plan's precision (not kept float32 like the exact quantized rewrites)."""
    N = 24
    kb = -(-K // block)
    q = rng.integers(0, 2 ** bits, (N, kb * block))
    w = _pack(q.reshape(N, kb, block), bits)
    scales = (rng.random((N, kb)) * 0.1 + 0.01).astype(np.float32)
    inits = {"w": w, "scales": scales.reshape(-1), "bias": rng.standard_normal(N).astype(np.float32)}
    ins = ["a", "w", "scales"]
    if zp_kind == "uint8":
        inits["zp"] = _pack(rng.integers(0, 2 ** bits, (N, kb)), bits).reshape(-1)
    elif zp_kind == "float":
        inits["zp"] = (rng.random((N, kb)) * 2 ** bits).astype(np.float32)
    ins += ["zp" if zp_kind else "", "", "bias"]
    node = h.make_node("MatMulNBits", ins, ["y"], domain="com.microsoft", K=K, N=N, bits=bits, block_size=block)
    a = rng.standard_normal((2, 3, K)).astype(np.float32)
    path = _save(tmp_path / "nbits.onnx", [node], {"a": a}, inits, ["y"], microsoft=True)
    ref = _ort(onnx.load(path), {"a": a})[0]
    m = dlcc.compile(path, target="opencl", pipeline="astitch")
    np.testing.assert_allclose(m({"a": a})["y"], ref, rtol=1e-5, atol=1e-5)
    from dlcc.frontend import import_model

    assert not import_model(path).float32_nodes


@needs_opencl
def test_matmul_nbits_int8_accuracy_level_is_judged_on_the_float_product(tmp_path):
    """accuracy_level 4 lets onnxruntime quantize A to int8: dlcc computes the float product, and
    verify's reference is the model at level 0, which describes that product."""
    N, K, block = 16, 64, 32
    q = rng.integers(0, 16, (N, K))
    inits = {"w": _pack(q.reshape(N, 2, block), 4), "scales": (rng.random(N * 2) * 0.1 + 0.01).astype(np.float32)}
    node = h.make_node("MatMulNBits", ["a", "w", "scales"], ["y"], domain="com.microsoft", K=K, N=N, bits=4,
                       block_size=block, accuracy_level=4)
    a = rng.standard_normal((4, K)).astype(np.float32)
    path = _save(tmp_path / "nbits_int8.onnx", [node], {"a": a}, inits, ["y"], microsoft=True)
    from dlcc.verify import verify_outputs

    cm = dlcc.compile(path, target="opencl", pipeline="astitch")
    got = cm({"a": a})
    want = a @ ((q.astype(np.float32) - 8) * np.repeat(inits["scales"].reshape(N, 2), block, axis=1)).T
    np.testing.assert_allclose(got["y"], want, rtol=1e-5, atol=1e-5)
    rows = verify_outputs(path, got, {"a": a}, compiled=cm)
    assert all(r["passed"] for r in rows), rows
    approx = _ort(onnx.load(path), {"a": a})[0]  # onnxruntime's own int8 path is further off
    assert not np.allclose(approx, want, rtol=1e-5, atol=1e-5)


def test_bad_matmul_nbits_is_a_clear_error(tmp_path):
    """A B of the wrong size, a computed B, a block size that is not a power of two, 3-bit weights,
    the deprecated g_idx: one error each."""
    w = _pack(rng.integers(0, 16, (8, 2, 16)), 4)
    scales = np.ones(16, np.float32)

    def compile_with(inits, ins=("a", "w", "scales"), **attrs):
        attrs = {"K": 32, "N": 8, "bits": 4, "block_size": 16} | attrs
        node = h.make_node("MatMulNBits", list(ins), ["y"], domain="com.microsoft", **attrs)
        g = h.make_graph([node], "bad", [h.make_tensor_value_info("a", TP.FLOAT, [2, 32])] +
                         ([h.make_tensor_value_info("wi", TP.UINT8, [8, 2, 8])] if "wi" in ins else []),
                         [h.make_tensor_value_info("y", TP.FLOAT, [2, 8])], [nh.from_array(v, k) for k, v in inits.items()])
        p = tmp_path / "bad.onnx"
        onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)]), str(p))
        with pytest.raises(DlccError) as e:
            dlcc.compile(str(p), target="opencl")
        return str(e.value)

    assert "B must be uint8 of shape" in compile_with({"w": w[:, :1], "scales": scales})
    assert "must be constants" in compile_with({"scales": scales}, ins=("a", "wi", "scales"))
    assert "power of two" in compile_with({"w": w, "scales": scales}, block_size=24)
    assert "3-bit weights are not supported" in compile_with({"w": w, "scales": scales}, bits=3)
    g_idx = np.arange(32, dtype=np.int32) // 16
    assert "g_idx input is not supported" in compile_with({"w": w, "scales": scales, "g": g_idx}, ins=("a", "w", "scales", "", "g"))


@needs_opencl
def test_int4_weight_only_bert_verifies(model_path, tmp_path):
    """bert-small with its MatMul weights and embedding tables quantized to 4 bits by
    onnxruntime's MatMulNBitsQuantizer (blocks of 32, asymmetric: packed zero points;
    GatherBlockQuantized on uint4 tables), as int4 LLM exports are,
    through astitch and full against onnxruntime's own MatMulNBits kernel."""
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    from dlcc.verify import verify_outputs

    cfg = DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=False, op_types_to_quantize=("MatMul", "Gather"))
    q = MatMulNBitsQuantizer(onnx.load(str(model_path("bert"))), block_size=32, is_symmetric=False, algo_config=cfg)
    q.process()
    path = str(tmp_path / "bert-int4.onnx")
    q.model.save_model_to_file(path)
    ops = [n.op_type for n in onnx.load(path).graph.node]
    assert ops.count("MatMulNBits") >= 8 and "GatherBlockQuantized" in ops, ops
    for pipeline in ("astitch", "full"):
        cm = dlcc.compile(path, target="opencl", pipeline=pipeline)
        feeds = cm.sample_inputs(0)
        rows = verify_outputs(path, cm(feeds), feeds, compiled=cm)
        assert all(r["passed"] for r in rows), rows
    assert any("MatMulNBits" in n for n in cm.plan["meta"]["pass_log"])


@needs_opencl
@pytest.mark.parametrize("kind", ["uint8-packed", "uint4", "int4-symmetric"])
def test_gather_block_quantized_matches_onnxruntime(tmp_path, kind):
    """GatherBlockQuantized (an embedding table quantized in blocks along its last axis: uint8
    with two 4-bit values to a byte, or int4/uint4 tensors; with zero points, or int4's default
    0) against onnxruntime's kernel, negative indices included; the table is dequantized at
    import and the node becomes a Gather."""
    import ml_dtypes

    V, H, block = 12, 40, 16
    nb = -(-H // block)
    scales = (rng.random((V, nb)) * 0.1 + 0.01).astype(np.float32)
    if kind == "uint8-packed":
        q = rng.integers(0, 16, (V, H))
        data = _pack(q, 4)
        zp = _pack(rng.integers(0, 16, (V, nb)), 4)
        inits = {"data": data, "scales": scales, "zp": zp}
    else:
        lo, hi, dt = (0, 16, ml_dtypes.uint4) if kind == "uint4" else (-8, 8, ml_dtypes.int4)
        inits = {"data": rng.integers(lo, hi, (V, H)).astype(dt), "scales": scales}
        if kind == "uint4":
            inits["zp"] = rng.integers(lo, hi, (V, nb)).astype(dt)
    ins = ["data", "idx", "scales"] + (["zp"] if "zp" in inits else [])
    node = h.make_node("GatherBlockQuantized", ins, ["y"], domain="com.microsoft", block_size=block, quantize_axis=1,
                       gather_axis=0, bits=4)
    idx = np.array([[0, 3, -1], [11, 5, 5]], np.int64)
    path = _save(tmp_path / "gbq.onnx", [node], {"idx": idx}, inits, ["y"], opset=21, microsoft=True)
    ref = _ort(onnx.load(path), {"idx": idx})[0]
    got = dlcc.compile(path, target="opencl")({"idx": idx})["y"]
    np.testing.assert_array_equal(got, ref)
