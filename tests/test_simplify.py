"""The `simplify` pass (passes/simplify.py): common subexpressions computed once, dead nodes
dropped, against onnxruntime on PoCL."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import dlcc
from conftest import opencl_device_available

needs_opencl = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")


def _model(path, nodes, inits, outputs) -> str:
    g = h.make_graph(nodes, "cse", [h.make_tensor_value_info("x", T.FLOAT, [4, 8]), h.make_tensor_value_info("y", T.FLOAT, [4, 8])],
                     [h.make_tensor_value_info(o, T.FLOAT, [4, 8]) for o in outputs],
                     [nh.from_array(np.asarray(v), k) for k, v in inits.items()])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
    return str(path)


@needs_opencl
@pytest.mark.parametrize("pipeline", ["baseline", "astitch"])
def test_common_subexpressions_are_computed_once(tmp_path, pipeline):
    """x + w(x) and x + w(y), where w is a width read from a shape (8, for both): onnxruntime's
    folding at import makes each width a constant of its own, after its own elimination of
    common subexpressions, so the two Adds, and the Exps that read them, are dlcc's to merge.
    x + a third value, an expression with the other sign of zero in its chain, and nodes that
    write graph outputs stay. Every output matches onnxruntime."""
    import onnxruntime as ort

    def width(t: str) -> list:
        return [h.make_node("Shape", [t], [f"{t}_shape"]), h.make_node("Gather", [f"{t}_shape", "one"], [f"{t}_w"]),
                h.make_node("Cast", [f"{t}_w"], [f"{t}_wf"], to=T.FLOAT)]

    inits = {"one": np.int64(1), "c3": np.float32(1.5), "z": np.float32(0.0), "nz": np.float32(-0.0)}
    nodes = [*width("x"), *width("y"),
             h.make_node("Add", ["x", "x_wf"], ["a1"]), h.make_node("Add", ["x", "y_wf"], ["a2"]),
             h.make_node("Add", ["x", "c3"], ["a3"]),
             h.make_node("Exp", ["a1"], ["e1"]), h.make_node("Exp", ["a2"], ["e2"]),
             h.make_node("Sub", ["e1", "e2"], ["m"]),
             h.make_node("Div", ["z", "x"], ["d1"]), h.make_node("Div", ["nz", "x"], ["d2"]),  # +0 / x and -0 / x
             h.make_node("Div", ["c3", "d1"], ["inf1"]), h.make_node("Div", ["c3", "d2"], ["inf2"]),
             h.make_node("Add", ["inf1", "inf2"], ["s"]),  # inf + -inf where x > 0: NaN if kept apart, inf if merged
             h.make_node("Relu", ["a3"], ["r1"]), h.make_node("Relu", ["a3"], ["r2"])]
    path = _model(tmp_path / "cse.onnx", nodes, inits, ["m", "s", "r1", "r2"])
    rng = np.random.default_rng(0)
    feeds = {"x": rng.uniform(0.5, 2, (4, 8)).astype(np.float32), "y": rng.uniform(0.5, 2, (4, 8)).astype(np.float32)}
    ref = ort.InferenceSession(path).run(None, feeds)
    model = dlcc.compile(path, target="opencl", pipeline=pipeline)
    got = model(feeds)
    for name, r in zip(("m", "s", "r1", "r2"), ref):
        np.testing.assert_allclose(got[name], r, rtol=1e-6, err_msg=name)
    assert np.isnan(got["s"]).all() and (got["m"] == 0).all()
    log = "\n".join(model.plan["meta"]["pass_log"])
    assert "simplify: 2 node(s) computed an expression another node computes; merged" in log, log
