"""float8, float4e2m1 and the sub-byte integers (dlcc/held_types.py): held in a wider type, with
the Cast into each rounding onto its values.

The Casts are checked exactly (the sign of zero included) against onnx.reference, which is
ml_dtypes, on every float16 value, a sweep of float32s and the edge cases of each format's
rounding and overflow; the quantized models against onnxruntime, through verify."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import dlcc
from dlcc.backends.nvcc import compile_cubin, find_nvcc
from dlcc.backends.source import render
from dlcc.errors import UnsupportedDtypesError
from dlcc.executor import InputError
from dlcc.verify import verify_outputs

FLOAT8 = (TP.FLOAT8E4M3FN, TP.FLOAT8E4M3FNUZ, TP.FLOAT8E5M2, TP.FLOAT8E5M2FNUZ)
INTS = (TP.INT4, TP.UINT4, TP.INT2, TP.UINT2)


def _vi(name, t, shape):
    return helper.make_tensor_value_info(name, t, shape)


def _values() -> np.ndarray:
    """Every float16, a sweep of float32s across float8's range, and each format's edges: ties
    at the top (464 for E4M3FN, 61440 for E5M2), subnormal ties, infinities, NaNs, -0."""
    halves = np.frombuffer(np.arange(65536, dtype=np.uint16).tobytes(), np.float16).astype(np.float32)
    sweep = np.linspace(-70000, 70000, 40001, dtype=np.float32)
    edges = np.array([464, 465, 479, 61440, 61439, 57344, 240, 248, 6.0, 5.0, 7.0, 0.25, 0.75, 2 ** -10, 3 * 2 ** -11,
                      2 ** -17, 1e-9, -1e-9, -0.0, np.inf, -np.inf, np.nan, -np.nan, 7.9, -8.6, 8.5, 15.5, -1.5],
                     np.float32)
    return np.concatenate([halves, sweep, edges, -edges])


def _cast_model(path, src: int, n: int) -> tuple[onnx.ModelProto, list[str]]:
    """One Cast of input x (type `src`) onto every held type it may go to, with and without
    saturation, each output both in that type and cast back to float32."""
    nodes, outs = [], []
    for to in (FLOAT8 + (TP.FLOAT4E2M1,) + INTS) if src in (TP.FLOAT, TP.FLOAT16) else INTS:
        for sat in ((1, 0) if to in FLOAT8 else (1,)):
            name = f"{TP.DataType.Name(to).lower()}_{sat}"
            nodes += [helper.make_node("Cast", ["x"], [name], to=to, **({"saturate": 0} if not sat else {})),
                      helper.make_node("Cast", [name], [f"{name}_f"], to=TP.FLOAT)]
            outs += [_vi(name, to, [n]), _vi(f"{name}_f", TP.FLOAT, [n])]
    g = helper.make_graph(nodes, "g", [_vi("x", src, [n])], outs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 25)])
    m.ir_version = 11
    onnx.save(m, str(path))
    return m, [o.name for o in outs]


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    g, w = got.astype(np.float64), want.astype(np.float64)
    nan = np.isnan(w)
    return (got.dtype == want.dtype and np.array_equal(np.isnan(g), nan)
            and np.array_equal(g[~nan], w[~nan]) and np.array_equal(np.signbit(g[~nan]), np.signbit(w[~nan])))


@pytest.mark.parametrize("src", [TP.FLOAT, TP.FLOAT16, TP.INT32, TP.INT8])
def test_casts_onto_held_types_match_the_reference(tmp_path, src):
    x = _values()
    if src not in (TP.FLOAT, TP.FLOAT16):  # integers: wrap by discarding the high bits
        x = np.nan_to_num(x, nan=0, posinf=0, neginf=0).clip(-2 ** 31, 2 ** 31 - 1).astype(np.int64)
    x = x.astype(helper.tensor_dtype_to_np_dtype(src))
    m, names = _cast_model(tmp_path / "cast.onnx", src, x.size)
    want = dict(zip(names, ReferenceEvaluator(m).run(None, {"x": x})))
    for pipeline in ("baseline", "astitch"):
        got = dlcc.compile(tmp_path / "cast.onnx", target="opencl", pipeline=pipeline)({"x": x})
        bad = [n for n in names if not _same(got[n], want[n])]
        assert not bad, (pipeline, bad)


def test_held_inputs_and_outputs_keep_the_models_type(tmp_path):
    """A float8 input and an int4 input, through DequantizeLinear, a Cast (int4 to uint4 wraps)
    and a view, to float8, int4 and uint4 outputs: fed and returned in the model's types, through a saved artifact too. A
    float32 array given for the float8 input is taken onto its values first."""
    nodes = [helper.make_node("DequantizeLinear", ["a", "s"], ["ad"]),
             helper.make_node("DequantizeLinear", ["q", "s", "qz"], ["qd"]),
             helper.make_node("Add", ["ad", "qd"], ["sum"]),
             helper.make_node("QuantizeLinear", ["sum", "s", "yz"], ["y"], saturate=0),
             helper.make_node("Transpose", ["q"], ["qt"], perm=[1, 0]),
             helper.make_node("Cast", ["q"], ["u"], to=TP.UINT4)]
    inits = [numpy_helper.from_array(np.array(0.5, np.float32), "s"),
             helper.make_tensor("qz", TP.INT4, [], [-2]), helper.make_tensor("yz", TP.FLOAT8E5M2, [], [0])]
    g = helper.make_graph(nodes, "g", [_vi("a", TP.FLOAT8E4M3FN, [3, 5]), _vi("q", TP.INT4, [3, 5])],
                          [_vi("y", TP.FLOAT8E5M2, [3, 5]), _vi("qt", TP.INT4, [5, 3]), _vi("u", TP.UINT4, [3, 5])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    onnx.save(m, str(tmp_path / "io.onnx"))
    rng = np.random.default_rng(0)
    a32 = (rng.standard_normal((3, 5)) * 40).astype(np.float32)
    a = a32.astype(ml_dtypes.float8_e4m3fn)
    q = rng.integers(-8, 8, (3, 5)).astype(ml_dtypes.int4)
    cm = dlcc.compile(tmp_path / "io.onnx", target="opencl", pipeline="astitch")
    assert [t.get("model_dtype") for t in cm.inputs] == ["float8_e4m3fn", "int4"]
    want = dict(zip(["y", "qt", "u"], ReferenceEvaluator(m).run(None, {"a": a, "q": q})))
    got = cm({"a": a, "q": q})
    assert all(_same(got[n], want[n]) for n in want), {n: (got[n], want[n]) for n in want}
    assert all(_same(v, want[n]) for n, v in cm({"a": a32, "q": q.astype(np.int8)}).items())
    cm.save(tmp_path / "art")
    again = dlcc.load(tmp_path / "art", target="opencl")({"a": a, "q": q})
    assert all(_same(again[n], want[n]) for n in want)
    rows = verify_outputs(tmp_path / "io.onnx", got, {"a": a, "q": q}, compiled=cm)
    assert [r["name"] for r in rows] == ["y", "qt", "u"] and all(r["passed"] and r["max_abs_err"] == 0 for r in rows)


def _qdq_model(path, qt: int, blocked: bool = False):
    """x quantized to `qt` and back, times a weight stored in `qt` (per column, or per block of
    32 rows), then Relu, and the result quantized again as a second output: what onnxruntime's
    quantize_static writes for FP8 or int4 QDQ, by hand."""
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((64, 48)) * 0.2).astype(np.float32)
    if qt in FLOAT8:
        s = np.array(0.01, np.float32)
        wq = onnx.numpy_helper.saturate_cast(w / s, helper.tensor_dtype_to_np_dtype(qt))
        wdq, zt = helper.make_node("DequantizeLinear", ["wq", "ws"], ["wd"]), qt
    elif blocked:
        s = (np.abs(w).reshape(2, 32, 48).max(1) / 7).astype(np.float32)
        wq = np.clip(np.rint(w / np.repeat(s, 32, 0)), -8, 7).astype(ml_dtypes.int4)
        wdq, zt = helper.make_node("DequantizeLinear", ["wq", "ws"], ["wd"], axis=0, block_size=32), TP.UINT4
    else:
        s = (np.abs(w).max(0) / 7).astype(np.float32)
        wq = np.clip(np.rint(w / s), -8, 7).astype(ml_dtypes.int4)
        wdq, zt = helper.make_node("DequantizeLinear", ["wq", "ws"], ["wd"], axis=1), TP.UINT4
    inits = [numpy_helper.from_array(wq, "wq"), numpy_helper.from_array(s, "ws"),
             numpy_helper.from_array(np.array(0.05, np.float32), "xs"),
             helper.make_tensor("xz", zt, [], [0 if qt in FLOAT8 else 8])]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]), wdq,
             helper.make_node("MatMul", ["xd", "wd"], ["y0"]), helper.make_node("Relu", ["y0"], ["y"]),
             helper.make_node("QuantizeLinear", ["y", "xs", "xz"], ["yq"])]
    g = helper.make_graph(nodes, "g", [_vi("x", TP.FLOAT, [8, 64])], [_vi("y", TP.FLOAT, [8, 48]), _vi("yq", zt, [8, 48])],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    onnx.save(m, str(path))
    return path


@pytest.mark.parametrize("qt,blocked", [(TP.FLOAT8E4M3FN, False), (TP.FLOAT8E5M2, False), (TP.INT4, False),
                                        (TP.INT4, True)])
def test_quantized_models_match_onnxruntime(tmp_path, qt, blocked):
    path = _qdq_model(tmp_path / "q.onnx", qt, blocked)
    feeds = {"x": (np.random.default_rng(2).standard_normal((8, 64)) * 2).astype(np.float32)}
    for pipeline in ("baseline", "full"):
        cm = dlcc.compile(path, target="opencl", pipeline=pipeline)
        got = cm(feeds)
        rows = verify_outputs(path, got, feeds, compiled=cm)
        assert all(r["passed"] for r in rows), rows
        assert got["yq"].dtype == helper.tensor_dtype_to_np_dtype(qt if qt in FLOAT8 else TP.UINT4)
        # (the quantized output is exact: the same rounding of the same float32 products)
        assert rows[1]["name"] == "yq" and rows[1]["max_abs_err"] == 0


def test_onnxruntime_fp8_quantizer_output_matches(tmp_path):
    """A small CNN quantized to FP8 QDQ by onnxruntime.quantization itself (activations and
    weights float8e4m3fn, Distribution calibration), as a user would make one."""
    q = pytest.importorskip("onnxruntime.quantization")
    rng = np.random.default_rng(3)
    w1 = numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((16, 8 * 8 * 8)) * 0.05).astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]), helper.make_node("Gemm", ["f", "w2"], ["y"], transB=1)]
    g = helper.make_graph(nodes, "g", [_vi("x", TP.FLOAT, [1, 3, 8, 8])], [_vi("y", TP.FLOAT, [1, 16])], [w1, w2])
    src = tmp_path / "cnn.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)]), str(src))

    class Reader(q.CalibrationDataReader):
        def __init__(self):
            self.k = 0

        def get_next(self):
            self.k += 1
            return {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} if self.k <= 3 else None

    out = tmp_path / "cnn-fp8.onnx"
    q.quantize_static(str(src), str(out), Reader(), quant_format=q.QuantFormat.QDQ,
                      activation_type=q.QuantType.QFLOAT8E4M3FN, weight_type=q.QuantType.QFLOAT8E4M3FN,
                      calibrate_method=q.CalibrationMethod.Distribution)
    assert any(t.data_type == TP.FLOAT8E4M3FN for t in onnx.load(str(out)).graph.initializer)
    feeds = {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)}
    cm = dlcc.compile(out, target="opencl", pipeline="astitch")
    assert all(r["passed"] for r in verify_outputs(out, cm(feeds), feeds, compiled=cm))


def test_e8m0_is_refused_by_name(tmp_path):
    g = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=TP.FLOAT8E8M0)], "g", [_vi("x", TP.FLOAT, [4])],
                          [_vi("y", TP.FLOAT8E8M0, [4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 24)])
    m.ir_version = 11
    onnx.save(m, str(tmp_path / "e8m0.onnx"))
    with pytest.raises(UnsupportedDtypesError, match="float8_e8m0fnu"):
        dlcc.compile(tmp_path / "e8m0.onnx", target="opencl")


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not installed")
def test_held_casts_compile_for_cuda(tmp_path):
    codes = {}
    for src in (TP.FLOAT, TP.INT32):
        _cast_model(tmp_path / "c.onnx", src, 64)
        m = dlcc.compile(tmp_path / "c.onnx", target="opencl", pipeline="astitch")
        codes.update(zip([k["name"] for k in m.plan["kernels"]], m.kernel_codes))
    source = render(list(codes.values()), "cuda")
    for arch in ("sm_80", "sm_90"):
        usage = compile_cubin(source, arch)
        assert set(codes) <= set(usage) and not {k: u for k, u in usage.items() if u.spills}


@pytest.mark.parametrize("qt", [TP.FLOAT8E4M3FN, TP.FLOAT8E5M2])
def test_float8_crosses_a_fallback_segment(tmp_path, qt):
    """A Reshape to a shape read from an input runs on onnxruntime (--fallback): the float8 tensor
    goes to it from dlcc's QuantizeLinear and back to dlcc's DequantizeLinear, and out as an
    output, where onnxruntime's binding would give raw bytes (E4M3FN) or nothing (E5M2)."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "sc", "z"], ["q"]), helper.make_node("Reshape", ["q", "s"], ["qr"]),
             helper.make_node("DequantizeLinear", ["qr", "sc", "z"], ["y"])]
    g = helper.make_graph(nodes, "g", [_vi("x", TP.FLOAT, [4, 6]), _vi("s", TP.INT64, [2])],
                          [_vi("y", TP.FLOAT, ["a", "b"]), _vi("qr", qt, ["a", "b"])],
                          [numpy_helper.from_array(np.array(0.25, np.float32), "sc"), helper.make_tensor("z", qt, [], [0])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    onnx.save(m, str(tmp_path / "fb.onnx"))
    cm = dlcc.compile(tmp_path / "fb.onnx", target="opencl", fallback="onnxruntime")
    feeds = {"x": (np.random.default_rng(0).standard_normal((4, 6)) * 30).astype(np.float32), "s": np.array([3, 8], np.int64)}
    got = cm(feeds)
    assert got["qr"].dtype == helper.tensor_dtype_to_np_dtype(qt) and got["qr"].shape == (3, 8)
    rows = verify_outputs(tmp_path / "fb.onnx", got, feeds, compiled=cm)
    assert all(r["passed"] and r["max_abs_err"] == 0 for r in rows), rows


def test_float8_inputs_refuse_raw_bytes_and_take_npz_voids(tmp_path):
    """onnxruntime hands float8 out as raw uint8: such an array is refused with the view to use,
    not converted as numbers; an .npz file's 1-byte voids (how numpy saves ml_dtypes' float8) are
    read as the bytes they are."""
    g = helper.make_graph([helper.make_node("Cast", ["a"], ["y"], to=TP.FLOAT)], "g", [_vi("a", TP.FLOAT8E4M3FN, [4])],
                          [_vi("y", TP.FLOAT, [4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    onnx.save(m, str(tmp_path / "a.onnx"))
    cm = dlcc.compile(tmp_path / "a.onnx", target="opencl")
    a = np.array([1.5, -448, 0.0078125, 3], ml_dtypes.float8_e4m3fn)
    with pytest.raises(InputError, match=r"a.view\(ml_dtypes.float8_e4m3fn\)"):
        cm({"a": a.view(np.uint8)})
    np.savez(tmp_path / "a.npz", a=a)
    assert np.array_equal(cm({"a": np.load(tmp_path / "a.npz")["a"]})["y"], a.astype(np.float32))


def test_cli_run_writes_float8_outputs_numpy_reads_back(tmp_path):
    """`dlcc run -o`: an E5M2 output as its bytes (numpy writes float8_e5m2 as "<f1", which it cannot
    read back), whose statistics are computed in float64, not in float8 (where they overflow)."""
    import json
    import subprocess
    import sys

    path = _qdq_model(tmp_path / "q.onnx", TP.FLOAT8E5M2)
    x = (np.random.default_rng(4).standard_normal((8, 64)) * 2).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    cm = dlcc.compile(path, target="opencl")
    cm.save(tmp_path / "art")
    p = subprocess.run([sys.executable, "-m", "dlcc.cli", "run", str(tmp_path / "art"), "-t", "opencl", "-i", str(tmp_path / "in.npz"),
                        "-o", str(tmp_path / "out.npz"), "--json", "-q"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    yq = np.load(tmp_path / "out.npz")["yq"].view(ml_dtypes.float8_e5m2)
    want = cm({"x": x})["yq"]
    assert np.array_equal(yq.astype(np.float32), want.astype(np.float32))
    row = [r for r in json.loads(p.stdout)["outputs"] if r["name"] == "yq"][0]
    assert row["dtype"] == "float8_e5m2" and np.isclose(row["std"], want.astype(np.float64).std())


def test_quantization_judge_takes_float8_grids(tmp_path):
    """At bf16 an FP8 QDQ MLP's activations land on other float8 values than onnxruntime's float32
    ones, and the output moves past bf16's tolerance: verify's quantization judge proves each
    float8 value a rounding of onnxruntime's value within the tolerance (on the grid's own spacing)
    and the output, given dlcc's float8 values, onnxruntime's. A plan whose result is tampered
    with is not judged so."""
    rng = np.random.default_rng(0)
    k = 256
    f8 = ml_dtypes.float8_e4m3fn
    inits = [numpy_helper.from_array(onnx.numpy_helper.saturate_cast((rng.standard_normal((k, k)) * 50).astype(np.float32), f8), "w1"),
             numpy_helper.from_array(onnx.numpy_helper.saturate_cast((rng.standard_normal((k, 8)) * 50).astype(np.float32), f8), "w2"),
             numpy_helper.from_array(np.array(0.002, np.float32), "ws"), numpy_helper.from_array(np.array(0.01, np.float32), "xs"),
             helper.make_tensor("xz", TP.FLOAT8E4M3FN, [], [0])]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w1", "ws"], ["w1d"]), helper.make_node("MatMul", ["xd", "w1d"], ["h"]),
             helper.make_node("QuantizeLinear", ["h", "xs", "xz"], ["hq"]),
             helper.make_node("DequantizeLinear", ["hq", "xs", "xz"], ["hd"]),
             helper.make_node("DequantizeLinear", ["w2", "ws"], ["w2d"]), helper.make_node("MatMul", ["hd", "w2d"], ["y"])]
    g = helper.make_graph(nodes, "g", [_vi("x", TP.FLOAT, [16, k])], [_vi("y", TP.FLOAT, [16, 8])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    path = tmp_path / "mlp.onnx"
    onnx.save(m, str(path))
    feeds = {"x": rng.standard_normal((16, k)).astype(np.float32)}
    cm = dlcc.compile(path, target="opencl", pipeline="astitch", precision="bf16")
    got = cm(feeds)
    rows = verify_outputs(path, got, feeds, precision="bf16", compiled=cm)
    assert rows[0]["passed"], rows  # (plainly where no float8 value was rounded apart, else judged)
    assert rows[0].get("judge") != "quantization" or "quantized values are rounded apart" in rows[0]["note"]
    got["y"][0, 0] += 1.0
    assert not verify_outputs(path, got, feeds, precision="bf16", compiled=cm)[0]["passed"]
