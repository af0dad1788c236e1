"""float64 models: exact at the boundary, float32 inside when a precision is asked for.

dlcc's kernels compute in float32 at most, so a float64 tensor is held only where a Cast reads or
writes it: a model's float64 inputs and outputs around a float32 body convert exactly as
onnxruntime converts them, with no option. A model that computes in float64 is refused, with the
error naming `--precision fp32`; with a precision asked for (the CLI's, the API's or a pipeline
file's), its float64 tensors are narrowed to float32 inside and its float64 inputs and outputs keep
their type (frontend.promote_half), as OpenVINO runs float64 models.
"""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

import dlcc
from dlcc.errors import UnsupportedOpsError
from dlcc.verify import run_onnxruntime, verify_outputs

from conftest import opencl_device_available

pytestmark = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")
D = TP.DOUBLE


def _save(path, nodes, inputs: dict, outputs: dict, inits=None, opset=17) -> str:
    g = h.make_graph(nodes, "f64", [h.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
                     [h.make_tensor_value_info(n, t, s) for n, (t, s) in outputs.items()],
                     initializer=[nh.from_array(v, k) for k, v in (inits or {}).items()])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", opset)]), str(path))
    return str(path)


def _ort(path, feeds) -> dict:
    return dict(zip([o.name for o in onnx.load(path).graph.output], run_onnxruntime(path, feeds)))


@pytest.mark.parametrize("pipeline", ["baseline", "astitch"])
def test_float64_inputs_and_outputs_through_casts_are_exact_without_an_option(tmp_path, pipeline):
    """Cast double -> float (rounded to nearest; 1e300 is inf), double -> int64 (truncated, exact
    past float's 24 bits), int64 -> double and float -> double, and views of float64 tensors
    (Identity, Flatten, Unsqueeze), each bit for bit onnxruntime's."""
    nodes = [h.make_node("Cast", ["x"], ["f"], to=TP.FLOAT), h.make_node("Relu", ["f"], ["r"]),
             h.make_node("Cast", ["r"], ["y"], to=D), h.make_node("Cast", ["x"], ["i"], to=TP.INT64),
             h.make_node("Cast", ["n"], ["nd"], to=D), h.make_node("Cast", ["x"], ["f32"], to=TP.FLOAT),
             h.make_node("Identity", ["x"], ["same"]), h.make_node("Flatten", ["x"], ["flat"], axis=0),
             h.make_node("Unsqueeze", ["nd", "ax"], ["nd2"])]
    path = _save(tmp_path / "casts.onnx", nodes, {"x": (D, [2, 4]), "n": (TP.INT64, [3])},
                 {"y": (D, [2, 4]), "i": (TP.INT64, [2, 4]), "nd": (D, [3]), "f32": (TP.FLOAT, [2, 4]),
                  "same": (D, [2, 4]), "flat": (D, [1, 8]), "nd2": (D, [1, 3])}, {"ax": np.array([0], np.int64)})
    x = np.array([[1e300, -2.5, 3.3, 0.1], [2.0 ** 40 + 0.5, -(2.0 ** 52) - 1.0, 7.9, 1 + 2.0 ** -30]])
    feeds = {"x": x, "n": np.array([2 ** 53 + 1, -(2 ** 40) - 3, 7], np.int64)}
    got = dlcc.compile(path, target="opencl", pipeline=pipeline)(feeds)
    for name, want in _ort(path, feeds).items():
        assert got[name].dtype == want.dtype and np.array_equal(got[name], want), (name, got[name], want)
    assert got["i"][1, 0] == 2 ** 40 and got["nd"][0] == float(2 ** 53)  # neither went through a float


def _double_mlp(tmp_path) -> str:
    """A double-precision classifier head, as skl2onnx writes one with `dtype=np.float64`."""
    rng = np.random.default_rng(64)
    nodes = [h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Add", ["m", "b"], ["a"]),
             h.make_node("Tanh", ["a"], ["t"]), h.make_node("Softmax", ["t"], ["p"], axis=-1),
             h.make_node("ReduceSum", ["p", "ax"], ["s"], keepdims=0)]
    return _save(tmp_path / "mlp64.onnx", nodes, {"x": (D, [5, 6])}, {"p": (D, [5, 3]), "s": (D, [5])},
                 {"w": rng.standard_normal((6, 3)), "b": rng.standard_normal(3), "ax": np.array([1], np.int64)})


def test_a_model_that_computes_in_float64_is_refused_naming_the_option(tmp_path):
    path = _double_mlp(tmp_path)
    with pytest.raises(UnsupportedOpsError, match=r"dtype float64: .*--precision fp32 computes this model in float32"):
        dlcc.compile(path, target="opencl")


@pytest.mark.parametrize("pipeline", ["baseline", "astitch"])
def test_with_a_precision_asked_for_a_float64_model_computes_in_float32(tmp_path, pipeline):
    """Its inputs and outputs stay float64; the answers are onnxruntime's double ones to float32's
    accuracy (verify's fp32 tolerance), and the pass log says what was narrowed."""
    path = _double_mlp(tmp_path)
    x = np.random.default_rng(1).standard_normal((5, 6))
    cm = dlcc.compile(path, target="opencl", pipeline=pipeline, precision="fp32")
    got = cm({"x": x})
    assert got["p"].dtype == got["s"].dtype == np.float64
    rows = verify_outputs(path, got, {"x": x}, precision="fp32")
    assert all(r["passed"] for r in rows), rows
    want = _ort(path, {"x": x})["p"]
    assert 0 < np.abs(got["p"] - want).max() < 1e-6  # float32 inside: close, and not double's answer
    assert any("float64 computes in float32" in line for line in cm.plan["meta"]["pass_log"]), cm.plan["meta"]


def test_an_input_beyond_float32s_range_is_warned_of(tmp_path):
    """A float64 input computed in float32 becomes ±inf inside where it holds a value past
    float32's range (onnx's own test inputs hold 9e223): the run warns, naming the input and the
    value; in range, it says nothing."""
    path = _double_mlp(tmp_path)
    cm = dlcc.compile(path, target="opencl", precision="fp32")
    assert cm.plan["meta"]["float32_inputs"] == ["x"]
    x = np.random.default_rng(1).standard_normal((5, 6))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cm({"x": x})
    x[2, 3] = 9e223
    with pytest.warns(UserWarning, match=r"input 'x' holds 1 value\(s\) beyond float32's range \(largest 9e\+223\)"):
        cm({"x": x})


def test_a_float32_model_with_a_float64_region_computes_it_in_float32_when_asked(tmp_path):
    """torch's `.double()` in the middle of a float32 model (a norm computed in double): refused
    without an option, and with `precision="fp32"` the Casts to double become Casts to float."""
    nodes = [h.make_node("Cast", ["x"], ["d"], to=D), h.make_node("Mul", ["d", "d"], ["sq"]),
             h.make_node("ReduceSum", ["sq", "ax"], ["ss"]), h.make_node("Sqrt", ["ss"], ["n"]),
             h.make_node("Div", ["d", "n"], ["u"]), h.make_node("Cast", ["u"], ["y"], to=TP.FLOAT)]
    path = _save(tmp_path / "region.onnx", nodes, {"x": (TP.FLOAT, [3, 8])}, {"y": (TP.FLOAT, [3, 8])},
                 {"ax": np.array([1], np.int64)})
    with pytest.raises(UnsupportedOpsError, match="dtype float64"):
        dlcc.compile(path, target="opencl")
    x = np.random.default_rng(2).standard_normal((3, 8)).astype(np.float32)
    got = dlcc.compile(path, target="opencl", pipeline="astitch", precision="fp32")({"x": x})["y"]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, _ort(path, {"x": x})["y"], rtol=1e-6, atol=1e-7)


def test_the_cache_tells_an_asked_precision_from_the_default(tmp_path):
    """The same pipeline JSON compiles a float64 model (or a half one on a GPU) differently when
    the precision is asked for: a cached compile at --precision fp32 is not what a later compile
    with no precision gets."""
    path = _double_mlp(tmp_path)
    cache = str(tmp_path / "cache")
    first = dlcc.compile(path, tmp_path / "a", target="opencl", precision="fp32", cache=cache)
    with pytest.raises(UnsupportedOpsError, match="dtype float64"):
        dlcc.compile(path, tmp_path / "b", target="opencl", cache=cache)
    again = dlcc.compile(path, tmp_path / "c", target="opencl", precision="fp32", cache=cache)
    assert first.cache_hit is False and again.cache_hit is True


def test_the_float64_kernels_compile_for_cuda(tmp_path):
    """The boundary Casts' double loads and stores, and the narrowed model's kernels, through nvcc."""
    from dlcc.backends.nvcc import compile_cubin, find_nvcc
    from dlcc.backends.source import render

    if find_nvcc() is None:
        pytest.skip("nvcc is not installed")
    nodes = [h.make_node("Cast", ["x"], ["f"], to=TP.FLOAT), h.make_node("Cast", ["f"], ["y"], to=D),
             h.make_node("Cast", ["x"], ["i"], to=TP.INT64)]
    casts = _save(tmp_path / "casts.onnx", nodes, {"x": (D, [4])}, {"y": (D, [4]), "i": (TP.INT64, [4])})
    codes = {}
    for path, precision in ((casts, None), (_double_mlp(tmp_path), "fp32")):
        m = dlcc.compile(path, target="opencl", pipeline="astitch", precision=precision)
        codes.update(zip([k["name"] for k in m.plan["kernels"]], m.kernel_codes))
    assert any("double" in c for c in codes.values())
    for arch in ("sm_80", "sm_90"):
        usage = compile_cubin(render(list(codes.values()), "cuda"), arch)
        assert set(codes) <= set(usage) and not {k: u for k, u in usage.items() if u.spills}
