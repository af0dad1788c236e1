"""Standard ops dlcc writes as other standard ops at import (dlcc/composite.py) and the inverse
trigonometric and hyperbolic functions, each against onnxruntime's CPU kernel."""
from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as h
import onnx.numpy_helper as nh
import pytest

import dlcc
from dlcc.errors import DlccError

from conftest import opencl_device_available

needs_opencl = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")
F, I64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64


def _model(tmp_path, nodes, inputs: dict[str, np.ndarray], outputs: list[str], inits=None, opset=17, name="m"):
    """A model of `nodes` over typed inputs; output types and shapes from onnx's inference."""
    ins = [h.make_tensor_value_info(k, h.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in inputs.items()]
    g = h.make_graph(nodes, name, ins, [], [nh.from_array(v, k) for k, v in (inits or {}).items()])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(m).graph.value_info}
    m.graph.output.extend(inferred[o] for o in outputs)
    path = tmp_path / f"{name}.onnx"
    onnx.save(m, path)
    return path


def _check(path, feeds, pipeline, rtol=1e-5, atol=1e-6):
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    refs = sess.run(None, feeds)
    got = dlcc.compile(path, target="opencl", pipeline=pipeline)(feeds)
    for o, ref in zip(sess.get_outputs(), refs):
        assert got[o.name].shape == ref.shape and got[o.name].dtype == ref.dtype, o.name
        np.testing.assert_allclose(got[o.name], ref, rtol=rtol, atol=atol, err_msg=o.name)
    return got


TRIG = {"Tan": (-1.4, 1.4), "Asin": (-1, 1), "Acos": (-1, 1), "Atan": (-30, 30), "Sinh": (-9, 9),
        "Cosh": (-9, 9), "Asinh": (-1e3, 1e3), "Acosh": (1, 1e3), "Atanh": (-0.999, 0.999)}


@needs_opencl
@pytest.mark.parametrize("pipeline", ["baseline", "astitch"])
def test_trigonometric_and_hyperbolic(tmp_path, pipeline):
    """Each over its domain, its ends included; outside it (asin(2), acosh(0.5)) NaN as
    onnxruntime gives, and NaN in stays NaN."""
    rng = np.random.default_rng(0)
    feeds, nodes = {}, []
    for op, (lo, hi) in TRIG.items():
        x = np.concatenate([rng.uniform(lo, hi, 61), [lo, hi, 0.0 if lo < 0 else lo, np.nan]]).astype(np.float32)
        if op in ("Asin", "Acos", "Acosh", "Atanh"):
            x[-2] = 2.0 if op != "Acosh" else 0.5  # outside the domain
        feeds[f"x_{op}"] = x
        nodes.append(h.make_node(op, [f"x_{op}"], [f"y_{op}"]))
    path = _model(tmp_path, nodes, feeds, [f"y_{op}" for op in TRIG])
    _check(path, feeds, pipeline, rtol=4e-6, atol=1e-6)


@needs_opencl
@pytest.mark.parametrize("pipeline", ["baseline", "astitch"])
def test_one_hot(tmp_path, pipeline):
    """Axis last, first and in the middle; negative indices counting from depth, indices outside
    [-depth, depth) giving rows of off values; int32 and float indices; int64 values."""
    idx = np.array([[0, 3, -1, 5], [-5, 2, 7, -6]], np.int64)  # depth 5: 5, 7 and -6 are outside
    feeds = {"i64": idx, "i32": idx.astype(np.int32), "f": idx.astype(np.float32) + 0.25}
    inits = {"depth": np.array(5, np.int64), "depthf": np.array([5.0], np.float32),
             "depth3": np.array([3.0], np.float32),
             "vals": np.array([-1.5, 2.0], np.float32), "ivals": np.array([0, 7], np.int64)}
    # (the type combinations onnxruntime's CPU kernel has)
    nodes = [h.make_node("OneHot", ["i64", "depth", "vals"], ["last"]),
             h.make_node("OneHot", ["i64", "depth", "ivals"], ["first"], axis=0),
             h.make_node("OneHot", ["i32", "depthf", "vals"], ["middle"], axis=1),
             h.make_node("OneHot", ["f", "depth3", "vals"], ["floats"], axis=-2)]
    path = _model(tmp_path, nodes, feeds, ["last", "first", "middle", "floats"], inits, opset=11)
    _check(path, feeds, pipeline)


@needs_opencl
@pytest.mark.parametrize("pipeline", ["baseline", "astitch"])
def test_hardmax_lp_norms_and_pools(tmp_path, pipeline):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 5, 7)).astype(np.float32)
    x[0, 0, 0, :3] = 4.0  # a tie: the first maximum wins
    x[1, 2, 4, :] = 0.0  # a zero row for the norms
    x[1, 1, 3, :] = 1e-30  # squares that underflow: a norm of 0 too
    feeds = {"x": x}
    nodes = [h.make_node("Hardmax", ["x"], ["hm_last"]),
             h.make_node("Hardmax", ["x"], ["hm_1"], axis=1),
             h.make_node("LpNormalization", ["x"], ["l2"]),
             h.make_node("LpNormalization", ["x"], ["l1"], axis=1, p=1),
             h.make_node("GlobalLpPool", ["x"], ["glp2"]),
             h.make_node("GlobalLpPool", ["x"], ["glp3"], p=3),
             h.make_node("LpPool", ["x"], ["lp"], kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1]),
             h.make_node("LpPool", ["x"], ["lp1"], kernel_shape=[2, 2], p=1, auto_pad="SAME_UPPER")]
    path = _model(tmp_path, nodes, feeds, ["hm_last", "hm_1", "l2", "l1", "glp2", "glp3", "lp", "lp1"])
    got = _check(path, feeds, pipeline, rtol=1e-5, atol=1e-5)
    assert not got["l2"][1, 2, 4].any() and not got["l2"][1, 1, 3].any()  # a norm of 0 gives 0s


@needs_opencl
def test_hardmax_before_opset_13_flattens_from_axis(tmp_path):
    x = np.random.default_rng(2).standard_normal((2, 3, 4)).astype(np.float32)
    nodes = [h.make_node("Hardmax", ["x"], ["a1"]), h.make_node("Hardmax", ["x"], ["a0"], axis=0),
             h.make_node("Hardmax", ["x"], ["a2"], axis=2)]
    _check(_model(tmp_path, nodes, {"x": x}, ["a1", "a0", "a2"], opset=11), {"x": x}, "astitch")


@needs_opencl
@pytest.mark.parametrize("pipeline", ["baseline", "astitch"])
def test_reverse_sequence_and_eye_like(tmp_path, pipeline):
    rng = np.random.default_rng(3)
    feeds = {"tb": rng.standard_normal((6, 3, 2)).astype(np.float32),  # [time, batch, ...]
             "bt": rng.standard_normal((3, 6)).astype(np.float32),  # [batch, time]
             "lens": np.array([6, 1, 4], np.int64), "sq": rng.standard_normal((3, 5)).astype(np.float32)}
    nodes = [h.make_node("ReverseSequence", ["tb", "lens"], ["r_tb"]),
             h.make_node("ReverseSequence", ["bt", "lens"], ["r_bt"], batch_axis=0, time_axis=1),
             h.make_node("EyeLike", ["sq"], ["eye"], k=1),
             h.make_node("EyeLike", ["sq"], ["eye_i"], k=-2, dtype=onnx.TensorProto.INT64)]
    _check(_model(tmp_path, nodes, feeds, ["r_tb", "r_bt", "eye", "eye_i"]), feeds, pipeline)


@needs_opencl
def test_compress_by_a_constant_condition(tmp_path):
    """A Gather of the kept positions: along an axis, with a condition shorter than the axis (the
    rest dropped), without an axis (the flattened input), and tf2onnx's SYMMETRIC MirrorPad, a
    reflect Pad then a Compress by a mask built from the padded shape."""
    rng = np.random.default_rng(4)
    feeds = {"x": rng.standard_normal((2, 5, 4)).astype(np.float32)}
    pad_mask_len = 5 + 3
    inits = {"c1": np.array([1, 0, 1, 1, 0], bool), "c2": np.array([0, 1, 1], bool),
             "cf": np.array([1, 0, 0, 1] * 3, bool), "pads": np.array([0, 2, 0, 0, 1, 0], np.int64),
             "len": np.array([pad_mask_len], np.int64), "drop": np.array([2, -2], np.int64),
             "no": np.zeros(2, bool)}
    nodes = [h.make_node("Compress", ["x", "c1"], ["y1"], axis=1),
             h.make_node("Compress", ["x", "c2"], ["y2"], axis=-1),
             h.make_node("Compress", ["x", "cf"], ["y3"]),
             h.make_node("Pad", ["x", "pads"], ["p"], mode="reflect"),
             h.make_node("ConstantOfShape", ["len"], ["ones"], value=nh.from_array(np.ones(1, bool))),
             h.make_node("ScatterElements", ["ones", "drop", "no"], ["mask"]),
             h.make_node("Compress", ["p", "mask"], ["sym"], axis=1)]
    ins = [h.make_tensor_value_info("x", F, [2, 5, 4])]
    outs = [h.make_tensor_value_info(o, F, [f"{o}_{k}" for k in range(r)])
            for o, r in (("y1", 3), ("y2", 3), ("y3", 1), ("sym", 3))]
    g = h.make_graph(nodes, "compress", ins, outs, [nh.from_array(v, k) for k, v in inits.items()])
    path = tmp_path / "compress.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
    got = _check(path, feeds, "astitch")
    assert got["sym"].shape == (2, 6, 4)


def test_compress_by_a_condition_computed_at_run_time_is_data_dependent(tmp_path):
    from dlcc.errors import DynamicShapeError

    feeds = {"x": np.zeros((3, 4), np.float32), "c": np.zeros(3, bool)}
    path = _model(tmp_path, [h.make_node("Compress", ["x", "c"], ["y"], axis=0)], feeds, ["y"])
    with pytest.raises(DynamicShapeError, match="Compress .*condition is computed at run time"):
        dlcc.compile(path, target="opencl")
    if opencl_device_available():  # (the fallback runs it on onnxruntime)
        m = dlcc.compile(path, target="opencl", fallback="onnxruntime")
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        np.testing.assert_array_equal(m({"x": x, "c": np.array([1, 0, 1], bool)})["y"], x[[0, 2]])


def test_malformed_nodes_are_clear_errors(tmp_path):
    idx = {"i": np.zeros((2,), np.int64), "d": np.zeros((), np.int64)}
    cases = [
        ([h.make_node("OneHot", ["i", "d", "v"], ["y"])], {"i": idx["i"], "d": idx["d"]}, {"v": np.zeros(2, np.float32)},
         "depth computed at run time"),
        ([h.make_node("OneHot", ["i", "d", "v"], ["y"])], {"i": idx["i"]},
         {"d": np.array(0, np.int64), "v": np.zeros(2, np.float32)}, "depth must be at least 1"),
        ([h.make_node("LpNormalization", ["x"], ["y"], p=3)], {"x": np.zeros((2, 2), np.float32)}, {},
         "p must be 1 or 2"),
    ]
    for k, (nodes, inputs, inits, message) in enumerate(cases):
        ins = [h.make_tensor_value_info(n, h.np_dtype_to_tensor_dtype(v.dtype), v.shape) for n, v in inputs.items()]
        g = h.make_graph(nodes, "bad", ins, [h.make_tensor_value_info("y", F, [None, None])],
                         [nh.from_array(v, n) for n, v in inits.items()])
        path = tmp_path / f"bad{k}.onnx"
        onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
        with pytest.raises(DlccError, match=message):
            dlcc.compile(path, target="opencl")


def test_listed():
    from typer.testing import CliRunner

    from dlcc.cli import app

    res = CliRunner().invoke(app, ["list", "ops", "--json"])
    rows = {r["op"]: r for r in __import__("json").loads(res.output)}
    for op in ("OneHot", "Hardmax", "Einsum", "GridSample", "DeformConv", "RoiAlign", "Atan", "Acosh"):
        assert op in rows, op
    assert rows["OneHot"]["since opsets"].startswith("9, 11")


@needs_opencl
def test_a_graph_output_folded_to_a_dtype_dlcc_lacks_is_named(tmp_path):
    """A Cast of a constant to float8e8m0 folds to a constant that is a graph output, with no node
    left to carry it: the dtype check names the output (an EyeLike of dtype double once reached
    the emitter, a KeyError; float64 constants are held now, and it returns the matrix; so are
    float8 E4M3FN ones, held_types.py)."""
    from dlcc.errors import UnsupportedDtypesError

    g = h.make_graph([h.make_node("EyeLike", ["x"], ["y"], dtype=onnx.TensorProto.DOUBLE, k=1)], "g",
                     [h.make_tensor_value_info("x", onnx.TensorProto.INT32, [4, 5])],
                     [h.make_tensor_value_info("y", onnx.TensorProto.DOUBLE, [4, 5])])
    path = tmp_path / "eye.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
    y = dlcc.compile(path, target="opencl")({"x": np.zeros((4, 5), np.int32)})["y"]
    assert y.dtype == np.float64 and np.array_equal(y, np.eye(4, 5, k=1))
    g = h.make_graph([h.make_node("Cast", ["c"], ["y"], to=onnx.TensorProto.FLOAT8E4M3FN)], "g", [],
                     [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT8E4M3FN, [3])],
                     [nh.from_array(np.float32([1, 2, 3]), "c")])
    path = tmp_path / "f8.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 19)], ir_version=9), path)
    y = dlcc.compile(path, target="opencl")({})["y"]
    assert y.dtype.name == "float8_e4m3fn" and np.array_equal(y.astype(np.float32), [1, 2, 3])
    g.node[0].attribute[0].i = onnx.TensorProto.FLOAT8E8M0
    g.output[0].type.tensor_type.elem_type = onnx.TensorProto.FLOAT8E8M0
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 24)], ir_version=11), path)
    with pytest.raises(UnsupportedDtypesError, match="dtype float8_e8m0fnu: graph output 'y'"):
        dlcc.compile(path, target="opencl")


@needs_opencl
@pytest.mark.parametrize("op_type", ["LSTM", "GRU", "RNN"])
def test_a_batch_major_recurrent_layer_is_the_time_major_one_transposed(tmp_path, op_type):
    """layout=1 (X [batch, seq, input], states [batch, directions, hidden], Y [batch, seq,
    directions, hidden]), which onnxruntime refuses, against onnxruntime's time-major layer on the
    inputs transposed by numpy: the ONNX spec's definition of the layout."""
    rng = np.random.default_rng(3)
    S, B, I, H, D = 5, 3, 4, 6, 2
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op_type]
    w = {"W": rng.uniform(-0.5, 0.5, (D, gates * H, I)).astype(np.float32),
         "R": rng.uniform(-0.5, 0.5, (D, gates * H, H)).astype(np.float32),
         "B": rng.uniform(-0.5, 0.5, (D, 2 * gates * H)).astype(np.float32)}
    x = rng.standard_normal((B, S, I)).astype(np.float32)
    states = {"h0": rng.standard_normal((B, D, H)).astype(np.float32)}
    if op_type == "LSTM":
        states["c0"] = rng.standard_normal((B, D, H)).astype(np.float32)
    outs = ["y", "yh"] + (["yc"] if op_type == "LSTM" else [])
    ins = ["x", "W", "R", "B", "", *states]
    attrs = dict(hidden_size=H, direction="bidirectional")

    def model(name, layout, feeds):
        node = h.make_node(op_type, ins, outs, **attrs, **({"layout": 1} if layout else {}))
        return _model(tmp_path, [node], feeds, outs, inits=w, name=name)

    batch_major = model("batch_major", 1, {"x": x, **states})
    time_major = model("time_major", 0, {"x": x.transpose(1, 0, 2), **{k: v.transpose(1, 0, 2) for k, v in states.items()}})
    import onnxruntime as ort

    sess = ort.InferenceSession(str(time_major), providers=["CPUExecutionProvider"])
    ref = dict(zip(outs, sess.run(outs, {"x": x.transpose(1, 0, 2), **{k: v.transpose(1, 0, 2) for k, v in states.items()}})))
    for pipeline in ("baseline", "astitch"):
        got = dlcc.compile(batch_major, target="opencl", pipeline=pipeline)({"x": x, **states})
        np.testing.assert_allclose(got["y"], ref["y"].transpose(2, 0, 1, 3), rtol=1e-5, atol=1e-6)
        for o in outs[1:]:
            np.testing.assert_allclose(got[o], ref[o].transpose(1, 0, 2), rtol=1e-5, atol=1e-6, err_msg=o)


@needs_opencl
@pytest.mark.parametrize("shape", [(1, 1), (3, 2, 2), (2, 3, 3, 3), (5, 4, 4), (4, 4)])
def test_det_of_small_matrices_matches_onnxruntime(tmp_path, shape):
    """Det written out by cofactors (composite._det) against onnxruntime's LU, batched and not;
    one matrix is singular (a repeated row), whose determinant both give as 0 up to rounding."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal(shape).astype(np.float32)
    if shape[-1] > 1:
        x.reshape(-1, *shape[-2:])[0, -1] = x.reshape(-1, *shape[-2:])[0, 0]
    path = _model(tmp_path, [h.make_node("Det", ["x"], ["y"])], {"x": x}, ["y"])
    for pipeline in ("baseline", "astitch"):
        got = _check(path, {"x": x}, pipeline, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got["y"], np.linalg.det(x.astype(np.float64)), rtol=1e-4, atol=1e-5)


def test_det_of_a_large_matrix_is_refused_by_name(tmp_path):
    x = np.zeros((5, 5), np.float32)
    path = _model(tmp_path, [h.make_node("Det", ["x"], ["y"])], {"x": x}, ["y"])
    with pytest.raises(DlccError, match=r"Det of 5 x 5 matrices \(dlcc writes out up to 4 x 4\) is not supported"):
        dlcc.compile(path, target="opencl")


@needs_opencl
def test_isinf_and_isnan_of_a_widened_float_read_the_float(tmp_path):
    """torch's TorchScript export of nan_to_num tests IsInf on the input cast to float64; the
    widening is exact, so the test reads the float32 tensor (frontend.skip_exact_widenings) and
    the float64 Cast, which nothing else reads, goes. A float64 value anything else reads is
    still refused by its dtype."""
    x = np.array([[1.0, np.inf, -np.inf, np.nan], [-2.5, 3e38, np.nan, 0.0]], np.float32)
    D = onnx.TensorProto.DOUBLE
    nodes = [h.make_node("Cast", ["x"], ["wide"], to=D), h.make_node("IsInf", ["wide"], ["inf"]),
             h.make_node("IsNaN", ["wide"], ["nan"]), h.make_node("Or", ["inf", "nan"], ["bad"]),
             h.make_node("Where", ["bad", "zero", "x"], ["y"])]
    path = _model(tmp_path, nodes, {"x": x}, ["y", "inf"], inits={"zero": np.zeros((), np.float32)})
    got = _check(path, {"x": x}, "astitch", rtol=0, atol=0)
    np.testing.assert_array_equal(got["y"], np.where(np.isfinite(x), x, 0))
    nodes = [h.make_node("Cast", ["x"], ["wide"], to=D), h.make_node("Abs", ["wide"], ["a"]),
             h.make_node("Cast", ["a"], ["y"], to=onnx.TensorProto.FLOAT)]
    with pytest.raises(DlccError, match="float64"):
        dlcc.compile(_model(tmp_path, nodes, {"x": x}, ["y"], name="abs64"), target="opencl")


@needs_opencl
@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
def test_torch_packed_sequences(tmp_path, cell):
    """torch.nn.utils.rnn.pack_padded_sequence through a two-layer bidirectional LSTM or GRU, as
    TorchScript's exporter writes it: sequence_lens computed from a `lengths` input, so known only
    at run time (dlcc/ops/rnn.py reads them in every step kernel). Other lengths at the second call."""
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(30, 16)
            self.rnn = getattr(nn, cell)(16, 12, num_layers=2, bidirectional=True, batch_first=True)
            self.out = nn.Linear(24, 5)

        def forward(self, ids, lengths):
            p = nn.utils.rnn.pack_padded_sequence(self.emb(ids), lengths, batch_first=True, enforce_sorted=False)
            y, _ = self.rnn(p)
            y, _ = nn.utils.rnn.pad_packed_sequence(y, batch_first=True, total_length=ids.shape[1])
            return self.out(y)

    torch.manual_seed(0)
    m = Tagger().eval()
    ids = torch.randint(0, 30, (3, 9))
    path = tmp_path / "tagger.onnx"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (ids, torch.tensor([9, 4, 6])), str(path), dynamo=False, opset_version=17,
                          input_names=["ids", "lengths"], output_names=["y"])
    graph = onnx.load(str(path)).graph
    consts = {t.name for t in graph.initializer}
    rnns = [n for n in graph.node if n.op_type == cell]
    assert rnns and all(len(n.input) > 4 and n.input[4] and n.input[4] not in consts for n in rnns)
    cm = dlcc.compile(str(path), target="opencl", pipeline="astitch")
    for lengths in ([9, 4, 6], [2, 9, 1]):
        with torch.no_grad():
            ref = m(ids, torch.tensor(lengths)).numpy()
        got = cm({"ids": ids.numpy(), "lengths": np.array(lengths, np.int64)})["y"]
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
