"""dlcc.compile(..., fallback="onnxruntime"): the nodes dlcc cannot compile run on onnxruntime, the
rest on dlcc (dlcc/partition.py); every output against onnxruntime running the whole model."""
from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as h
import onnx.numpy_helper as nh
import pytest

import dlcc
from dlcc.errors import DlccError
from dlcc.executor import InputError

from conftest import opencl_device_available

needs_opencl = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")
F, I64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
rng = np.random.default_rng(5)


def _save(tmp_path, nodes, inputs, outputs, inits, name="m", opset=17):
    g = h.make_graph(nodes, name, inputs, outputs, [nh.from_array(v, k) for k, v in inits.items()])
    path = tmp_path / f"{name}.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", opset)]), path)
    return path


def _check(path, m, feeds):
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = m(feeds)
    for o, ref in zip(sess.get_outputs(), sess.run(None, feeds)):
        assert got[o.name].shape == ref.shape and got[o.name].dtype == ref.dtype, o.name
        np.testing.assert_allclose(got[o.name], ref, rtol=1e-5, atol=1e-5, err_msg=o.name)
    return got


def _detector(tmp_path, batch=1):
    """A convolution, box and score heads, NonMaxSuppression, then the kept boxes gathered and
    scaled: what a detector exported with its NMS looks like. The number of boxes kept depends on
    the values, so the part after the NMS gets its shapes only at run time."""
    n = 24
    nodes = [h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c"], ["r"]),
             h.make_node("Flatten", ["r"], ["f"]), h.make_node("MatMul", ["f", "wb"], ["b0"]),
             h.make_node("Reshape", ["b0", "s_boxes"], ["boxes"]), h.make_node("MatMul", ["f", "ws"], ["s0"]),
             h.make_node("Sigmoid", ["s0"], ["s1"]), h.make_node("Unsqueeze", ["s1", "ax1"], ["scores"]),
             h.make_node("NonMaxSuppression", ["boxes", "scores", "maxk", "iou", "thr"], ["sel"]),
             h.make_node("Gather", ["sel", "two"], ["idx"], axis=1),
             h.make_node("Squeeze", ["boxes", "ax0"], ["b2"]), h.make_node("Gather", ["b2", "idx"], ["kept"], axis=0),
             h.make_node("Mul", ["kept", "scale"], ["y"]), h.make_node("ReduceSum", ["kept"], ["total"], keepdims=0)]
    inits = {"w": (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32),
             "wb": (rng.standard_normal((4 * 8 * 8, n * 4)) * 0.05).astype(np.float32),
             "ws": (rng.standard_normal((4 * 8 * 8, n)) * 0.2).astype(np.float32),
             "s_boxes": np.array([1, n, 4], np.int64), "ax1": np.array([1], np.int64), "ax0": np.array([0], np.int64),
             "two": np.array(2, np.int64), "maxk": np.array([12], np.int64), "iou": np.array([0.3], np.float32),
             "thr": np.array([0.5], np.float32), "scale": np.array(2.0, np.float32)}
    return _save(tmp_path, nodes, [h.make_tensor_value_info("x", F, [batch, 3, 8, 8])],
                 [h.make_tensor_value_info("y", F, ["k", 4]), h.make_tensor_value_info("total", F, []),
                  h.make_tensor_value_info("scores", F, [1, 1, n])], inits, "detector")


@needs_opencl
def test_a_detector_runs_its_nms_on_onnxruntime_and_the_rest_on_dlcc(tmp_path):
    path = _detector(tmp_path)
    m = dlcc.compile(path, target="opencl", pipeline="astitch", fallback="onnxruntime")
    assert [(s["engine"], s["nodes"]) for s in m.segments] == [("dlcc", 9), ("onnxruntime", 1), ("dlcc", 4)]
    assert m.segments[1]["ops"] == {"NonMaxSuppression": 1}
    kept = set()
    for seed in range(4):
        x = np.random.default_rng(seed).standard_normal((1, 3, 8, 8)).astype(np.float32)
        kept.add(_check(path, m, {"x": x})["y"].shape[0])
    assert len(kept) > 1  # the NMS kept different numbers of boxes: the last segment compiled per shape
    with pytest.raises(InputError, match="has shape"):  # checked before anything runs
        m({"x": np.zeros((1, 3, 8, 9), np.float32)})


@needs_opencl
def test_what_dlcc_refuses_when_it_compiles_moves_to_onnxruntime(tmp_path):
    """A Reshape to a shape the model computes from input values, and a Range up to a maximum of
    values: dlcc knows both ops, but not these forms; its compile refuses them (a data-dependent
    shape, an op it cannot lower there), so those nodes move to onnxruntime on the first call and
    the nodes around them stay on dlcc, one refinement each."""
    nodes = [h.make_node("Abs", ["s"], ["s2"]), h.make_node("Reshape", ["x6", "s2"], ["rs"]),
             h.make_node("Relu", ["rs"], ["z"]),
             h.make_node("ReduceMax", ["n"], ["top"], keepdims=0), h.make_node("Range", ["zero", "top", "one"], ["r"]),
             h.make_node("Cast", ["r"], ["rf"], to=F), h.make_node("Mul", ["rf", "x"], ["y"]),
             h.make_node("Tanh", ["x"], ["t"])]
    inits = {"zero": np.array(0, np.int64), "one": np.array(1, np.int64)}
    path = _save(tmp_path, nodes, [h.make_tensor_value_info("s", I64, [2]), h.make_tensor_value_info("x6", F, [6]),
                                   h.make_tensor_value_info("n", I64, [3]), h.make_tensor_value_info("x", F, [1])],
                 [h.make_tensor_value_info("z", F, ["a", "b"]), h.make_tensor_value_info("y", F, ["k"]),
                  h.make_tensor_value_info("t", F, [1])], inits, "refused")
    m = dlcc.compile(path, target="opencl", fallback="onnxruntime")
    x6 = rng.standard_normal(6).astype(np.float32)
    for shape, top in (((2, 3), 3), ((-3, 2), 7)):
        _check(path, m, {"s": np.array(shape, np.int64), "x6": x6, "n": np.array([1, top, 2], np.int64),
                         "x": np.array([0.5], np.float32)})
    engines = {op: s["engine"] for s in m.segments for op in s["ops"]}
    assert {op for op, e in engines.items() if e == "onnxruntime"} == {"Reshape", "Range"}
    why = " ".join(w for s in m.segments for w in s.get("why", []))
    assert "DynamicShapeError" in why and "UnsupportedOpsError" in why


@needs_opencl
def test_a_float64_stretch_whose_node_reads_one_tensor_twice(tmp_path):
    """dlcc holds no float64, so the stretch moves to onnxruntime at the first call. Its Mul reads
    `d` twice, and the segment's inputs name `d` once (they named it twice, and every call failed
    with "inputs do not match the model"). The reason names the dtype."""
    D = onnx.TensorProto.DOUBLE
    nodes = [h.make_node("Relu", ["x"], ["r"]), h.make_node("Cast", ["r"], ["d"], to=D),
             h.make_node("Mul", ["d", "d"], ["e"]), h.make_node("Cast", ["e"], ["f"], to=F),
             h.make_node("Neg", ["f"], ["y"])]
    path = _save(tmp_path, nodes, [h.make_tensor_value_info("x", F, [5])], [h.make_tensor_value_info("y", F, [5])],
                 {}, "float64")
    m = dlcc.compile(path, target="opencl", fallback="onnxruntime")
    _check(path, m, {"x": rng.standard_normal(5).astype(np.float32)})
    host = [s for s in m.segments if s["engine"] == "onnxruntime"]
    assert host and {"Cast", "Mul"} <= set().union(*(s["ops"] for s in host))
    assert any("float64" in w for s in host for w in s["why"])


@needs_opencl
def test_an_op_dlcc_lacks_in_the_middle_and_a_while_loop(tmp_path):
    """Det between dlcc ops, and a while loop (its condition computed from the data) that dlcc
    cannot unroll: each runs on onnxruntime, between dlcc segments."""
    body = h.make_graph(
        [h.make_node("Mul", ["v", "two"], ["v2"]), h.make_node("ReduceSum", ["v2"], ["s"], keepdims=0),
         h.make_node("Less", ["s", "limit"], ["go"])], "body",
        [h.make_tensor_value_info("i", I64, []), h.make_tensor_value_info("c", onnx.TensorProto.BOOL, []),
         h.make_tensor_value_info("v", F, [2])],
        [h.make_tensor_value_info("go", onnx.TensorProto.BOOL, []), h.make_tensor_value_info("v2", F, [2])],
        [nh.from_array(np.array(2.0, np.float32), "two"), nh.from_array(np.array(50.0, np.float32), "limit")])
    nodes = [h.make_node("Relu", ["a"], ["ra"]), h.make_node("Det", ["ra"], ["d"]),
             h.make_node("Exp", ["d"], ["e"]),
             h.make_node("Abs", ["v0"], ["av"]),
             h.make_node("Loop", ["", "yes", "av"], ["vend"], body=body), h.make_node("Neg", ["vend"], ["out"])]
    path = _save(tmp_path, nodes, [h.make_tensor_value_info("a", F, [2, 5, 5]), h.make_tensor_value_info("v0", F, [2])],
                 [h.make_tensor_value_info("e", F, [2]), h.make_tensor_value_info("out", F, [2])],
                 {"yes": np.array(True)}, "middle")
    m = dlcc.compile(path, target="opencl", pipeline="astitch", fallback="onnxruntime")
    feeds = {"a": rng.uniform(0, 1, (2, 5, 5)).astype(np.float32), "v0": np.array([0.5, -1.5], np.float32)}
    _check(path, m, feeds)
    engines = {op: s["engine"] for s in m.segments for op in s["ops"]}
    assert engines == {"Relu": "dlcc", "Abs": "dlcc", "Det": "onnxruntime", "Loop": "onnxruntime", "Exp": "dlcc",
                       "Neg": "dlcc"}


def test_a_segment_that_computes_a_shape_again_gets_the_tensor_it_reads(tmp_path):
    """A dlcc segment computes again the Shape of a tensor that an earlier segment made and read
    only for that Shape (partition._with_shape_math), so the earlier segment must hand the tensor
    over too. It did not, and the call failed with a KeyError (piper-tts's nakdimon.onnx, a
    tf2onnx model whose second LSTM loop counts the first one's output)."""
    nodes = [h.make_node("Relu", ["x"], ["a"]), h.make_node("Shape", ["a"], ["s"]), h.make_node("Det", ["m"], ["d"]),
             h.make_node("Expand", ["d", "s"], ["y"])]
    path = _save(tmp_path, nodes, [h.make_tensor_value_info("x", F, [2, 3, 4]), h.make_tensor_value_info("m", F, [5, 5])],
                 [h.make_tensor_value_info("y", F, [2, 3, 4])], {}, "shape_again")
    m = dlcc.compile(path, target="opencl", pipeline="astitch", fallback="onnxruntime")
    _check(path, m, {"x": rng.standard_normal((2, 3, 4)).astype(np.float32),
                     "m": rng.standard_normal((5, 5)).astype(np.float32)})
    assert [s["engine"] for s in m.segments] == ["dlcc", "onnxruntime", "dlcc"]


def test_bad_fallback_arguments(tmp_path):
    path = _save(tmp_path, [h.make_node("Relu", ["x"], ["y"])], [h.make_tensor_value_info("x", F, [2])],
                 [h.make_tensor_value_info("y", F, [2])], {})
    with pytest.raises(DlccError, match="falls back to onnxruntime"):
        dlcc.compile(path, fallback="tvm")
    with pytest.raises(DlccError, match="does not combine with fallback"):
        dlcc.compile(path, fallback="onnxruntime", out=tmp_path / "a", tune=True)
    m = dlcc.compile(path, target="opencl", fallback="onnxruntime")
    with pytest.raises(InputError, match=r"missing \['x'\]"):
        m({"z": np.zeros(2, np.float32)})
    with pytest.raises(DlccError, match="host arrays"):
        m.run({"x": np.zeros(2, np.float32)}, outputs="device")


def test_an_op_neither_engine_has_is_one_clear_error(tmp_path):
    g = h.make_graph([h.make_node("Relu", ["x"], ["r"]), h.make_node("Frobnicate", ["r"], ["y"], domain="com.example")],
                     "g", [h.make_tensor_value_info("x", F, [2])], [h.make_tensor_value_info("y", F, [2])])
    path = tmp_path / "custom.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.example", 1)]), path)
    m = dlcc.compile(path, target="opencl", fallback="onnxruntime")
    with pytest.raises(DlccError, match=r"onnxruntime cannot run the part of the model dlcc falls back on \(Frobnicate\)"):
        m({"x": np.ones(2, np.float32)})


@needs_opencl
def test_a_torch_export_with_boolean_indexing(tmp_path):
    """torch.onnx's export of `boxes[scores > t]` (NonZero, then a gather of what it found) after
    a convolution head: NonZero runs on onnxruntime, and the rows it selects feed a dlcc segment
    whose shapes change from call to call."""
    torch = pytest.importorskip("torch")

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 5, 3, padding=1)

        def forward(self, x):
            y = self.conv(x).flatten(2).transpose(1, 2)[0]  # [HW, 5]: 4 box values and a score
            keep = torch.sigmoid(y[:, 4]) > 0.5
            boxes = y[keep][:, :4]
            return boxes * 2.0 + 1.0, boxes.sum(0)

    torch.manual_seed(0)
    path = tmp_path / "head.onnx"
    torch.onnx.export(Head().eval(), (torch.randn(1, 3, 6, 6),), str(path), input_names=["x"],
                      output_names=["boxes", "sums"], opset_version=17, dynamo=False)
    m = dlcc.compile(path, target="opencl", pipeline="astitch", fallback="onnxruntime")
    counts = set()
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal((1, 3, 6, 6)).astype(np.float32)
        counts.add(_check(path, m, {"x": x})["boxes"].shape[0])
    assert len(counts) > 1
    assert "NonZero" in next(s for s in m.segments if s["engine"] == "onnxruntime")["ops"]
    assert m.segments[0]["engine"] == "dlcc" and m.segments[-1]["engine"] == "dlcc"


def test_verify_fallback_from_the_cli(tmp_path):
    from typer.testing import CliRunner

    from dlcc.cli import app

    if not opencl_device_available():
        pytest.skip("no OpenCL device here")
    path = _detector(tmp_path)
    res = CliRunner().invoke(app, ["verify", str(path), "-t", "opencl", "--fallback", "onnxruntime", "--json", "-q"])
    assert res.exit_code == 0, res.output
    d = __import__("json").loads(res.output)
    assert d["passed"] and [s["engine"] for s in d["segments"]] == ["dlcc", "onnxruntime", "dlcc"]
    res = CliRunner().invoke(app, ["verify", str(path), "-t", "opencl", "--fallback", "tvm"])
    assert res.exit_code != 0 and "falls back to onnxruntime" in str(res.exception)


def _classifier(tmp_path):
    """What skl2onnx writes for a classifier with its default options: a label, and the class
    probabilities as ZipMap's sequence of {label: probability} maps (ai.onnx.ml)."""
    ml = onnx.helper.make_opsetid("ai.onnx.ml", 1)
    nodes = [h.make_node("MatMul", ["x", "w"], ["z"]), h.make_node("Softmax", ["z"], ["p"], axis=1),
             h.make_node("ArgMax", ["p"], ["label"], axis=1, keepdims=0),
             h.make_node("ZipMap", ["p"], ["probs"], domain="ai.onnx.ml", classlabels_int64s=[3, 5, 7])]
    seq = h.make_value_info("probs", h.make_sequence_type_proto(h.make_map_type_proto(I64, h.make_tensor_type_proto(F, None))))
    g = h.make_graph(nodes, "clf", [h.make_tensor_value_info("x", F, ["n", 4])],
                     [h.make_tensor_value_info("label", I64, ["n"]), seq],
                     [nh.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w")])
    path = tmp_path / "clf.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17), ml]), path)
    return path


@needs_opencl
def test_a_zipmap_output_comes_back_as_onnxruntime_gives_it(tmp_path):
    """dlcc compiles the tensors and onnxruntime makes the sequence of maps, which the call returns
    as onnxruntime does (a list of dicts); `verify` compares it element by element, and `run -o`
    stores it as JSON text in the .npz. Without the fallback, the error says the fallback helps."""
    import json

    import onnxruntime as ort
    from typer.testing import CliRunner

    from dlcc.cli import app
    from dlcc.errors import UnsupportedDtypesError
    from dlcc.verify import compare_value, verify_outputs

    path = _classifier(tmp_path)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    with pytest.raises(UnsupportedDtypesError, match="--fallback onnxruntime"):
        dlcc.compile(path, target="opencl", shapes={"n": 5})
    m = dlcc.compile(path, target="opencl", fallback="onnxruntime")
    got = m({"x": x})
    label, probs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(got["label"], label)
    assert isinstance(got["probs"], list) and len(got["probs"]) == 5
    assert all(g.keys() == r.keys() == {3, 5, 7} for g, r in zip(got["probs"], probs))
    np.testing.assert_allclose([list(g.values()) for g in got["probs"]], [list(r.values()) for r in probs], rtol=1e-6)
    rows = verify_outputs(path, got, {"x": x})
    assert [(r["name"], r["passed"]) for r in rows] == [("label", True), ("probs", True)]
    assert rows[1]["dtype"] == "sequence(map(int, float))" and rows[1]["shape"] == [5]
    wrong = [dict(g) for g in got["probs"]]
    wrong[2][5] += 0.01
    assert not compare_value("probs", wrong, probs, 1e-3, 1e-4)["passed"]
    assert not compare_value("probs", got["probs"][:4], probs, 1e-3, 1e-4)["passed"]
    assert not compare_value("probs", [{3: 0.0}] * 5, probs, 1e-3, 1e-4)["passed"]
    art, npz = tmp_path / "art", tmp_path / "out.npz"
    runner = CliRunner()
    res = runner.invoke(app, ["compile", str(path), "-s", "n=5", "--fallback", "onnxruntime", "-o", str(art), "-q"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["run", str(art), "-o", str(npz), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["outputs"][1]["dtype"] == "sequence(map(int, float))"
    with np.load(npz) as z:
        stored = json.loads(str(z["probs"]))
    assert len(stored) == 5 and set(stored[0]) == {"3", "5", "7"}


@needs_opencl
def test_a_call_that_fails_on_onnxruntime_too_moves_nothing(tmp_path):
    """An input the model cannot take (a batch of 0 into a Reshape to [1, 24, 4]): dlcc's compile
    refuses the segment, onnxruntime then fails on it too, and the call's error is onnxruntime's.
    The nodes it moved go back: bad input must not leave the model running on onnxruntime."""
    path = _detector(tmp_path, batch="batch")
    m = dlcc.compile(path, target="opencl", pipeline="astitch", fallback="onnxruntime")
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    _check(path, m, {"x": x})
    before = m.segments
    with pytest.raises(DlccError, match="onnxruntime failed on its part of the model"):
        m({"x": np.zeros((0, 3, 8, 8), np.float32)})
    assert m.segments == before
    with pytest.raises(InputError, match="has dtype complex64, expected float32"):
        m({"x": x.astype(np.complex64)})
    _check(path, m, {"x": x})


@needs_opencl
def test_an_onnxruntime_segment_whose_inputs_differ_in_size(tmp_path):
    """Two inputs of different sizes into one onnxruntime segment, each through an op dlcc lacks
    (Det of 5 x 5 matrices, then Unique). The segment's inputs must not share a symbolic dim name: onnxruntime takes
    dims with one dim_param to be equal and reuses the first Det's buffer for the second ("Shape
    mismatch attempting to re-use buffer"), which is how Longformer's split failed."""
    nodes = [h.make_node("Relu", ["a"], ["ra"]), h.make_node("Relu", ["b"], ["rb"]),
             h.make_node("Det", ["ra"], ["da"]), h.make_node("Unique", ["da"], ["ua"]),
             h.make_node("Det", ["rb"], ["db"]), h.make_node("Unique", ["db"], ["ub"]),
             h.make_node("Neg", ["ua"], ["ya"]), h.make_node("Neg", ["ub"], ["yb"])]
    path = _save(tmp_path, nodes, [h.make_tensor_value_info("a", F, [4, 5, 5]), h.make_tensor_value_info("b", F, [1, 5, 5])],
                 [h.make_tensor_value_info("ya", F, ["n"]), h.make_tensor_value_info("yb", F, ["k"])], {})
    m = dlcc.compile(path, target="opencl", pipeline="astitch", fallback="onnxruntime")
    r = np.random.default_rng(2)
    _check(path, m, {"a": r.random((4, 5, 5)).astype(np.float32), "b": r.random((1, 5, 5)).astype(np.float32)})
    assert [s["engine"] for s in m.segments] == ["dlcc", "onnxruntime", "dlcc"]


@needs_opencl
def test_a_segment_with_large_weights_is_saved_with_external_data(tmp_path, monkeypatch):
    """A segment past protobuf's 2 GB is written with its weights beside it (the threshold is
    lowered here so that the detector's weights pass it)."""
    import dlcc.partition as partition

    monkeypatch.setattr(partition, "EXTERNAL_DATA_BYTES", 1000)
    path = _detector(tmp_path)
    m = dlcc.compile(path, target="opencl", pipeline="astitch", fallback="onnxruntime")
    _check(path, m, {"x": np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)})
    assert list(m._dir.glob("seg-*/part.data"))


@needs_opencl
def test_a_fallback_artifact_runs_without_compiling_again(tmp_path):
    """compile(..., fallback=, out=) runs the model once on sample inputs, so each dlcc segment
    compiles, and saves the split: the model, where each node runs, and the plans. Reopened with
    dlcc.load, it finds those plans (cache hits) and matches onnxruntime; a shape the sample
    inputs did not give (another number of kept boxes) compiles at its first call."""
    path = _detector(tmp_path)
    out = tmp_path / "det.dlcc"
    m = dlcc.compile(path, out=out, target="opencl", pipeline="astitch", fallback="onnxruntime")
    assert {p.name for p in out.iterdir()} == {"partition.json", "model.onnx", "cache"}
    assert m.saved_plans == 2 and [s["engine"] for s in m.segments] == ["dlcc", "onnxruntime", "dlcc"]
    back = dlcc.load(out, target="opencl")
    feeds = back.sample_inputs(0)
    _check(path, back, feeds)
    held = [cm for r in back._runners.values() if hasattr(r, "model") for _, cm in r.model.held()]
    assert len(held) == 2 and all(cm.cache_hit for cm in held)
    for seed in range(1, 4):
        _check(path, back, {"x": np.random.default_rng(seed).standard_normal((1, 3, 8, 8)).astype(np.float32)})
    # Compiled again over it, with a pipeline file: the older artifact is replaced whole, and the
    # file goes along (the artifact is opened from anywhere).
    from dlcc.config import load_pipeline

    spec = tmp_path / "mine.yaml"
    spec.write_text(__import__("yaml").safe_dump(load_pipeline("astitch").model_dump(mode="json")))
    again = dlcc.compile(path, out=out, target="opencl", pipeline=str(spec), fallback="onnxruntime")
    assert again.saved_plans == 2 and (out / "pipeline.yaml").is_file()
    spec.unlink()
    back = dlcc.load(out, target="opencl")
    _check(path, back, feeds)
    assert all(cm.cache_hit for r in back._runners.values() if hasattr(r, "model") for _, cm in r.model.held())


@needs_opencl
def test_a_fallback_artifact_keeps_the_nodes_moved_at_run_time(tmp_path):
    """A Range up to a maximum of input values is refused when its segment compiles, and moves
    to onnxruntime during the compile's sample run: the artifact records that, so a loaded model
    does not try the refused compile again. A Reshape to fed values fails on the random sample
    inputs themselves: the artifact is still written, and its segments compile at the first call."""
    nodes = [h.make_node("ReduceMax", ["n"], ["top"], keepdims=0), h.make_node("Range", ["zero", "top", "one"], ["r"]),
             h.make_node("Cast", ["r"], ["rf"], to=F), h.make_node("Mul", ["rf", "x"], ["y"]),
             h.make_node("Tanh", ["x"], ["t"])]
    inits = {"zero": np.array(0, np.int64), "one": np.array(1, np.int64)}
    path = _save(tmp_path, nodes, [h.make_tensor_value_info("n", I64, [3]), h.make_tensor_value_info("x", F, [1])],
                 [h.make_tensor_value_info("y", F, ["k"]), h.make_tensor_value_info("t", F, [1])], inits, "ranged")
    out = tmp_path / "ranged.dlcc"
    m = dlcc.compile(path, out=out, target="opencl", fallback="onnxruntime")
    assert any(s["engine"] == "onnxruntime" and "Range" in s["ops"] for s in m.segments), m.segments
    back = dlcc.load(out)
    assert back.segments == m.segments
    _check(path, back, {"n": np.array([1, 5, 2], np.int64), "x": np.array([0.5], np.float32)})

    nodes = [h.make_node("Relu", ["x6"], ["r"]), h.make_node("Reshape", ["r", "s"], ["z"])]
    path = _save(tmp_path, nodes, [h.make_tensor_value_info("x6", F, [6]), h.make_tensor_value_info("s", I64, [2])],
                 [h.make_tensor_value_info("z", F, ["a", "b"])], {}, "fed")
    with pytest.warns(UserWarning, match="the sample inputs"):
        m = dlcc.compile(path, out=tmp_path / "fed.dlcc", target="opencl", fallback="onnxruntime")
    _check(path, dlcc.load(tmp_path / "fed.dlcc"), {"x6": rng.standard_normal(6).astype(np.float32),
                                                    "s": np.array([3, 2], np.int64)})


@needs_opencl
def test_a_fallback_artifact_with_an_unbound_dim_compiles_at_its_first_call(tmp_path):
    path = _detector(tmp_path, batch="batch")
    out = tmp_path / "lazy.dlcc"
    m = dlcc.compile(path, out=out, target="opencl", pipeline="astitch", fallback="onnxruntime")
    assert m.saved_plans == 0
    x = {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)}
    _check(path, dlcc.load(out), x)
    # In Python, a split model called on real inputs (no cache) saves the plans those calls made.
    m = dlcc.compile(path, target="opencl", pipeline="astitch", fallback="onnxruntime")
    _check(path, m, x)
    back = dlcc.load(m.save(tmp_path / "warm.dlcc"))
    assert back.saved_plans == 2
    _check(path, back, x)
    assert all(cm.cache_hit for r in back._runners.values() if hasattr(r, "model") for _, cm in r.model.held())


def test_fallback_artifacts_from_the_cli(tmp_path):
    """`dlcc compile --fallback`, `dlcc run` and `dlcc inspect` on the artifact, and what each
    refuses: a damaged manifest, a plan view of a split model, --tune."""
    import json

    from typer.testing import CliRunner

    from dlcc.cli import app

    if not opencl_device_available():
        pytest.skip("no OpenCL device here")
    import onnxruntime as ort

    path = _detector(tmp_path)
    art = tmp_path / "det.dlcc"
    run = CliRunner().invoke
    res = run(app, ["compile", str(path), "-o", str(art), "-t", "opencl", "-p", "astitch", "--fallback", "onnxruntime",
                    "--json", "-q", "--no-cache"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["plans"] == 2 and [s["engine"] for s in d["segments"]] == ["dlcc", "onnxruntime", "dlcc"]
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    res = run(app, ["run", str(art), "-i", str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz"), "-q"])
    assert res.exit_code == 0, res.output
    got = np.load(tmp_path / "out.npz")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for o, ref in zip(sess.get_outputs(), sess.run(None, {"x": x})):
        np.testing.assert_allclose(got[o.name], ref, rtol=1e-5, atol=1e-5, err_msg=o.name)
    res = run(app, ["inspect", str(art), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["fallback"] == "onnxruntime" and d["pipeline"] == "astitch" and len(d["segments"]) == 3
    res = run(app, ["inspect", str(art), "--launches"])
    assert res.exit_code != 0 and "--fallback artifact" in str(res.exception)
    res = run(app, ["compile", str(path), "-o", str(art), "--fallback", "onnxruntime", "--tune"])
    assert res.exit_code != 0 and "does not combine with --fallback" in str(res.exception)
    manifest = art / "partition.json"
    manifest.write_text(manifest.read_text()[:40])
    res = run(app, ["run", str(art)])
    assert res.exit_code != 0 and "partition.json cannot be read" in str(res.exception)
    manifest.write_text(json.dumps({"format": "dlcc-partition", "version": 1, "compile": {}}))
    res = run(app, ["run", str(art)])
    assert res.exit_code != 0 and "is damaged" in str(res.exception)


@needs_opencl
@pytest.mark.parametrize("named", [True, False])
def test_an_unnamed_node_of_strings_alone_moves_to_onnxruntime(tmp_path, named):
    """A classifier's label lookup: a Gather from a constant of strings, after a MatMul, Relu and
    ArgMax dlcc computes. The error names the node and what it computes; an unnamed node's name
    there is one the import made up, which the partition could not match, so every node of the
    segment went to onnxruntime. Now only the Gather does, named or not."""
    nodes = [h.make_node("MatMul", ["x", "W"], ["m"]), h.make_node("Relu", ["m"], ["r"]),
             h.make_node("ArgMax", ["r"], ["i"], axis=1, keepdims=0),
             h.make_node("Gather", ["S", "i"], ["y"], name="lookup" if named else "")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", F, [3, 8])],
                     [h.make_tensor_value_info("y", onnx.TensorProto.STRING, [3])],
                     [nh.from_array(rng.standard_normal((8, 4)).astype(np.float32), "W"),
                      nh.from_array(np.array([b"a", b"b", b"c", b"d"], dtype=object), "S")])
    path = tmp_path / "labels.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
    m = dlcc.compile(path, target="opencl", fallback="onnxruntime")
    import onnxruntime as ort

    feeds = {"x": rng.standard_normal((3, 8)).astype(np.float32)}
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert list(m(feeds)["y"]) == list(ref)
    assert [(s["engine"], s["ops"]) for s in m.segments] == [("dlcc", {"MatMul": 1, "Relu": 1, "ArgMax": 1}),
                                                              ("onnxruntime", {"Gather": 1})]


def test_an_error_in_the_part_dlcc_compiles_names_the_users_file(tmp_path):
    """A LinearClassifier with 12 coefficients for 3 classes of 2 features (onnxruntime reads the
    first 6; dlcc refuses the malformed node). With --fallback, the error came from the segment's
    temporary model, and named that file; it names the user's model now."""
    node = h.make_node("LinearClassifier", ["x"], ["label", "scores"], domain="ai.onnx.ml", classlabels_ints=[0, 1, 2],
                       coefficients=[0.1] * 12, intercepts=[0.0, 0.1, 0.2])
    g = h.make_graph([h.make_node("Relu", ["x0"], ["x"]), node], "g", [h.make_tensor_value_info("x0", F, [3, 2])],
                     [h.make_tensor_value_info("label", I64, [3]), h.make_tensor_value_info("scores", F, [3, 3])])
    path = tmp_path / "logreg.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("ai.onnx.ml", 1)]), path)
    m = dlcc.compile(path, target="opencl", fallback="onnxruntime")
    with pytest.raises(DlccError, match="coefficients hold 12 values") as e:
        m({"x0": np.ones((3, 2), np.float32)})
    assert str(path) in str(e.value) and "part.onnx" not in str(e.value), str(e.value)
