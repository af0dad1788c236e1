"""Sums are compensated (kernels/reduce.py accumulate_step): a ReduceSum is within a few units of
the exact (float64) sum in every reduction kernel (a column per thread, a row per block, and
AStitch's stitched stage), where float32 added one term after another is off by many; infinite
terms and overflow still give inf, not NaN. Magika's flax LayerNorm (E[x²] − E[x]² of 512
terms) missed onnxruntime by 4x its own error before."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

import dlcc
from conftest import opencl_device_available, run_ort

needs_opencl = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")


def _reduce_model(path, shape, axis, square=False):
    """y = ReduceSum(x [* x], axis) (+ 0 so that AStitch has an elementwise op to stitch)."""
    nodes = ([h.make_node("Mul", ["x", "x"], ["sq"])] if square else []) + [
        h.make_node("ReduceSum", ["sq" if square else "x", "ax"], ["s"], keepdims=0),
        h.make_node("Add", ["s", "zero"], ["y"])]
    out = [d for i, d in enumerate(shape) if i != axis]
    g = h.make_graph(nodes, "sum", [h.make_tensor_value_info("x", TP.FLOAT, list(shape))],
                     [h.make_tensor_value_info("y", TP.FLOAT, out)],
                     [nh.from_array(np.array([axis], np.int64), "ax"), nh.from_array(np.zeros((1,), np.float32), "zero")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return str(path)


def _ulps(got, exact):
    return np.abs(got.astype(np.float64) - exact) / np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)


def _terms(shape, axis, seed=0):
    """Terms near 1 with a small spread: their float32 running sum loses low bits at every step."""
    rng = np.random.default_rng(seed)
    return (1.0 + rng.uniform(0, 1e-3, shape)).astype(np.float32)


@needs_opencl
@pytest.mark.parametrize("pipeline", ["baseline", "astitch"])
@pytest.mark.parametrize("shape,axis", [((4096, 8), 0),     # a column per thread
                                        ((2, 262144), 1)])   # a row per block: 1024 terms a thread
def test_sums_are_within_a_few_units_of_the_exact_sum(tmp_path, pipeline, shape, axis):
    x = _terms(shape, axis)
    exact = x.astype(np.float64).sum(axis=axis)
    sequential = np.cumsum(x, axis=axis, dtype=np.float32).take(-1, axis=axis)
    assert _ulps(sequential, exact).max() > 8  # the test can fail: plain float32 addition is off
    path = _reduce_model(tmp_path / "m.onnx", shape, axis)
    got = dlcc.compile(path, target="opencl", pipeline=pipeline)({"x": x})["y"]
    assert _ulps(got, exact).max() <= 2


@needs_opencl
def test_a_sum_of_squares_cancelling_against_the_squared_mean(tmp_path):
    """var = E[x²] − E[x]² over 512 terms of nearly equal values (a badly conditioned variance):
    dlcc's error against float64 is no larger than onnxruntime's."""
    rng = np.random.default_rng(1)
    x = (5.0 + rng.standard_normal((512, 16)) * 0.02).astype(np.float32)
    path = _reduce_model(tmp_path / "sq.onnx", x.shape, 0, square=True)
    got = dlcc.compile(path, target="opencl", pipeline="astitch")({"x": x})["y"]
    exact = (x.astype(np.float64) ** 2).sum(axis=0)
    ref = run_ort(path, {"x": x})[0]
    assert np.abs(got - exact).max() <= np.abs(ref - exact).max()
    assert _ulps(got, exact).max() <= 2


@needs_opencl
@pytest.mark.parametrize("pipeline", ["baseline", "astitch"])
def test_infinite_terms_and_overflow_still_sum_to_inf(tmp_path, pipeline):
    x = np.ones((64, 3), np.float32)
    x[5, 0] = np.inf            # an infinite term
    x[:, 1] = 3e38              # overflow on the way
    x[7, 2], x[9, 2] = np.inf, -np.inf  # inf - inf is NaN, as onnxruntime gives
    path = _reduce_model(tmp_path / "inf.onnx", x.shape, 0)
    got = dlcc.compile(path, target="opencl", pipeline=pipeline)({"x": x})["y"]
    ref = run_ort(path, {"x": x})[0]
    assert got[0] == np.inf and got[1] == np.inf and np.isnan(got[2])
    np.testing.assert_array_equal(got, ref)
