"""A Resize by scales is as large as onnxruntime makes it: each dim is int(scale * dim) multiplied
in float32 (frontend._resize_shape), where onnx's shape inference floors the float64 product and
says one less. tf2onnx writes such scales (13 / 7 as 1.8571428f) for Keras resizes, and declares
the outputs at TensorFlow's size, which onnx's strict inference then calls a conflict."""
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


def _model(path, declared, mode="linear", opset=13, scales_as="input"):
    s = np.array([1, 1, 13 / 7, 17 / 9], np.float32)
    assert int(np.floor(float(s[2]) * 7)) == 12 and int(s[2] * np.float32(7)) == 13  # (the case at hand)
    inits = [nh.from_array(s, "scales"), nh.from_array(np.array([0.5], np.float32), "b")]
    if opset >= 11:
        inits.append(nh.from_array(np.zeros(0, np.float32), "roi"))
        resize = h.make_node("Resize", ["x", "roi", "scales"], ["r"], mode=mode)
    elif scales_as == "attr":
        resize = h.make_node("Upsample", ["x"], ["r"], mode=mode, scales=[float(v) for v in s])
    else:
        resize = h.make_node("Resize" if opset == 10 else "Upsample", ["x", "scales"], ["r"], mode=mode)
    nodes = [resize, h.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 3, 1]), h.make_node("Add", ["t", "b"], ["y"])]
    g = h.make_graph(nodes, "resize", [h.make_tensor_value_info("x", TP.FLOAT, [1, 2, 7, 9])],
                     [h.make_tensor_value_info("y", TP.FLOAT, declared)], inits)
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", opset)]), path)
    return str(path)


@needs_opencl
@pytest.mark.parametrize("declared, mode, opset, scales_as", [
    (["n", "h", "w", "c"], "linear", 13, "input"),  # undeclared: onnx infers 12 x 16, onnxruntime makes 13 x 17
    ([1, 13, 17, 2], "linear", 13, "input"),   # declared at the size onnxruntime makes (tf2onnx)
    ([1, 13, 17, 2], "nearest", 19, "input"),
    (["n", "h", "w", "c"], "nearest", 10, "input"),
    (["n", "h", "w", "c"], "linear", 9, "input"),  # Upsample-9, scales an input
    (["n", "h", "w", "c"], "nearest", 7, "attr"),  # Upsample-7, scales an attribute
])
def test_a_resize_by_scales_is_the_size_onnxruntime_makes(tmp_path, declared, mode, opset, scales_as):
    path = _model(tmp_path / "m.onnx", declared, mode, opset, scales_as)
    x = np.random.default_rng(0).standard_normal((1, 2, 7, 9)).astype(np.float32)
    (ref,) = run_ort(path, {"x": x})
    assert ref.shape == (1, 13, 17, 2)
    m = dlcc.compile(path, target="opencl", pipeline="astitch")
    assert [o["shape"] for o in m.outputs] == [[1, 13, 17, 2]]
    np.testing.assert_allclose(m({"x": x})["y"], ref, rtol=1e-5, atol=1e-6)
