"""verify's selection judge (dlcc/selection_judge.py): a TopK or ArgMax that picks another element
at a tie within the tolerance passes, and says so; a selection that does not follow from dlcc's
own values, or ranked values off by more than the tolerance, stays failed."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import dlcc
from dlcc import quant_judge, verify
from dlcc.verify import verify_outputs

from conftest import opencl_device_available

N, K = 2000, 50


def _ranking_model(tmp_path):
    """Sigmoid scores near 1e-5 (a small detector's, on random inputs), their TopK gathering
    boxes, and their ArgMax. The logits lie within 1e-3 of each other, so thousands of scores are
    within a rounding of their neighbours: onnxruntime's sigmoid is 1e-7 off there, dlcc's 1e-12."""
    nodes = [h.make_node("Sigmoid", ["x"], ["s"]),
             h.make_node("TopK", ["s", "k"], ["v", "i"], axis=-1),
             h.make_node("Gather", ["boxes", "i"], ["picked"], axis=0),
             h.make_node("ArgMax", ["s"], ["best"], axis=1, keepdims=0)]
    rng = np.random.default_rng(0)
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [1, N])],
                     [h.make_tensor_value_info("v", T.FLOAT, [1, K]), h.make_tensor_value_info("picked", T.FLOAT, None),
                      h.make_tensor_value_info("best", T.INT64, [1])],
                     [nh.from_array(np.array([K], np.int64), "k"),
                      nh.from_array(rng.standard_normal((N, 4)).astype(np.float32) * 100, "boxes")])
    path = tmp_path / "ranking.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
    return path, {"x": (-11.5 + 1e-3 * rng.standard_normal((1, N))).astype(np.float32)}


@pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")
def test_picks_apart_at_ties_within_the_tolerance_pass(tmp_path, monkeypatch):
    monkeypatch.setattr(verify, "arbitrate", lambda *a: None)  # (the float64 judge would pass `picked` first)
    path, feeds = _ranking_model(tmp_path)
    m = dlcc.compile(path, target="opencl", pipeline="astitch")
    got = m(feeds)
    rows = {r["name"]: r for r in verify_outputs(path, got, feeds, compiled=m)}
    assert rows["v"]["passed"] and "judge" not in rows["v"], rows["v"]
    for name in ("picked", "best"):
        assert rows[name]["passed"] and rows[name]["judge"] == "selection", rows[name]
        assert "picks differ from onnxruntime's" in rows[name]["note"]
    # the premise: onnxruntime picks otherwise, so without the judge these fail
    monkeypatch.setattr("dlcc.selection_judge.judge_selection", lambda *a, **k: None)
    rows = {r["name"]: r for r in verify_outputs(path, got, feeds, compiled=m)}
    assert not rows["picked"]["passed"] and not rows["best"]["passed"]
    # and at a tolerance finer than the two sigmoids' difference, the ranked values are off
    monkeypatch.undo()
    monkeypatch.setattr(verify, "arbitrate", lambda *a: None)
    rows = {r["name"]: r for r in verify_outputs(path, got, feeds, rtol=1e-7, atol=1e-12, compiled=m)}
    assert not rows["best"]["passed"] and "dlcc's ranked values are" in rows["best"]["note"], rows["best"]


def test_a_selection_that_does_not_follow_from_dlccs_values_fails(tmp_path, monkeypatch):
    """dlcc's values as onnxruntime's own, but two picks of TopK swapped (values far apart): the
    outputs differ from onnxruntime's, and the judge refuses them."""
    import onnxruntime as ort

    path, feeds = _ranking_model(tmp_path)
    model = onnx.load(path)
    model.graph.output.extend([h.make_tensor_value_info("s", T.FLOAT, None), h.make_tensor_value_info("i", T.INT64, None)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    mine = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    i = mine["i"].copy()
    i[0, [0, K - 1]] = i[0, [K - 1, 0]]
    boxes = nh.to_array(model.graph.initializer[1])
    mine.update(i=i, v=np.take_along_axis(mine["s"], i, 1), picked=boxes[i])
    got = {k: mine[k] for k in ("v", "picked", "best")}

    class Compiled:
        plan = {"meta": {}}

    monkeypatch.setattr(quant_judge, "_instrumented_run", lambda *a, **k: mine)
    monkeypatch.setattr(verify, "arbitrate", lambda *a: None)
    rows = {r["name"]: r for r in verify_outputs(path, got, feeds, compiled=Compiled())}
    assert not rows["picked"]["passed"], rows["picked"]
    assert "does not follow from its own values" in rows["picked"]["note"], rows["picked"]
