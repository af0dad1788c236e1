"""The oracle itself (dlcc/verify.py): compare's rule on special values and integer outputs, and
verify_outputs taking the model's graph outputs, not dlcc's, as the list to check."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from dlcc.inputs import padding_mask, sample_inputs
from dlcc.verify import compare, run_onnxruntime, verify_outputs

INF, NAN = np.inf, np.nan


def _cmp(got, ref, rtol=1e-3, atol=1e-4):
    return compare("y", np.asarray(got, np.float32), np.asarray(ref, np.float32), rtol, atol)


def test_equal_infinities_pass():
    r = _cmp([INF, -INF, 1.0], [INF, -INF, 1.0])
    assert r["passed"] and r["max_abs_err"] == 0 and r["max_rel_err"] == 0


@pytest.mark.parametrize("got, ref", [([INF], [1.0]), ([1.0], [INF]), ([3e38], [INF]), ([INF], [-INF]),
                                      ([-INF], [INF]), ([INF, 1.0], [1.0, INF])])
def test_infinity_against_anything_else_fails(got, ref):
    r = _cmp(got, ref, rtol=1.0, atol=1.0)  # however wide the tolerance
    assert not r["passed"] and r["max_abs_err"] == INF and r["max_rel_err"] == INF


def test_nan_positions_must_match():
    assert _cmp([NAN, 1.0], [NAN, 1.0])["passed"]
    for got, ref in (([NAN, 1.0], [1.0, 1.0]), ([1.0, 1.0], [NAN, 1.0]), ([NAN, 1.0], [1.0, NAN])):
        r = _cmp(got, ref, rtol=1.0, atol=1.0)
        assert not r["passed"] and "NaN" in r["note"]


def test_tolerance_rule_and_errors():
    """|d| <= atol + rtol·|ref| everywhere (the bound itself passes); rel error is |d| / max(|ref|, atol)."""
    ref = np.array([4.0, 0.0])
    assert compare("y", np.array([5.5, -0.5]), ref, 0.25, 0.5)["passed"]  # 1.5 = 0.5 + 0.25·4; 0.5 = 0.5
    r = compare("y", np.array([5.5, 0.75]), ref, 0.25, 0.5)
    assert not r["passed"] and r["max_abs_err"] == 1.5 and r["max_rel_err"] == 1.5  # 0.75 / max(0, 0.5)
    assert not compare("y", np.array([5.5 + 1e-9, 0.0]), ref, 0.25, 0.5)["passed"]
    assert not _cmp([1.0], [1.0, 1.0])["passed"]  # shape


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, np.int8])
def test_integer_outputs_must_be_exact(dtype):
    ref = np.array([0, 1, 7], dtype)
    assert compare("i", ref.copy(), ref, 1.0, 1.0)["passed"]
    r = compare("i", ref + np.array([0, 0, 1], dtype), ref, 1.0, 1.0)  # no tolerance for integers
    assert not r["passed"] and r["max_abs_err"] == 1


def test_bool_outputs_must_be_exact():
    ref = np.array([True, False, True])
    assert compare("b", ref.copy(), ref, 1e-3, 1e-4)["passed"]
    assert not compare("b", ~ref, ref, 1.0, 1.0)["passed"]


@pytest.fixture
def two_outputs(tmp_path):
    """y = Relu(x), z = Neg(x): a model with two graph outputs."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("y", "z")]
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["z"])], "g", [x], outs)
    path = tmp_path / "two.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)}
    return path, feeds, dict(zip(("y", "z"), run_onnxruntime(path, feeds, ["y", "z"])))


def test_verify_outputs_checks_the_models_outputs(two_outputs):
    path, feeds, ref = two_outputs
    rows = verify_outputs(path, ref, feeds, 1e-3, 1e-4)
    assert [r["name"] for r in rows] == ["y", "z"] and all(r["passed"] for r in rows)

    rows = verify_outputs(path, {"y": ref["y"]}, feeds, 1e-3, 1e-4)  # z dropped
    assert [(r["name"], r["passed"]) for r in rows] == [("y", True), ("z", False)]
    assert "missing" in rows[1]["note"]

    rows = verify_outputs(path, {"y": ref["y"], "z_renamed": ref["z"]}, feeds, 1e-3, 1e-4)  # z renamed
    assert [(r["name"], r["passed"]) for r in rows] == [("y", True), ("z", False), ("z_renamed", False)]
    assert "not an output of the model" in rows[2]["note"]

    rows = verify_outputs(path, {**ref, "z": -ref["z"]}, feeds, 1e-3, 1e-4)  # a wrong value still fails
    assert [r["passed"] for r in rows] == [True, False]


def test_dlcc_verify_fails_a_dropped_output(two_outputs, tmp_path):
    """End to end: dlcc compiles the model, and its result dict loses an output."""
    import dlcc

    path, feeds, _ = two_outputs
    got = dlcc.compile(path, target="opencl")(feeds)
    assert all(r["passed"] for r in verify_outputs(path, got, feeds, 1e-3, 1e-4))
    got.pop("z")
    assert not all(r["passed"] for r in verify_outputs(path, got, feeds, 1e-3, 1e-4))


@pytest.mark.parametrize("shape", [(1, 16), (1, 2), (4, 9), (2, 3, 5), (7,)])
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.bool_])
def test_masks_are_right_padded(shape, dtype):
    """Each row is ones then zeros, never all zeros, and some row is padded, for every seed."""
    sig = [{"name": "attention_mask", "shape": list(shape), "dtype": np.dtype(dtype).name}]
    for seed in range(20):
        m = sample_inputs(sig, seed)["attention_mask"]
        assert m.dtype == dtype and m.shape == shape
        assert np.array_equal(m, sample_inputs(sig, seed)["attention_mask"])  # seeded
        rows = m.astype(np.int64).reshape(-1, shape[-1])
        lens = rows.sum(1)
        assert (lens >= 1).all() and (lens < shape[-1]).any()
        assert (rows == (np.arange(shape[-1]) < lens[:, None])).all()  # a prefix of ones


def test_mask_of_one_column_is_ones():
    assert padding_mask(np.random.default_rng(0), (3, 1), np.int64).tolist() == [[1], [1], [1]]


@pytest.mark.parametrize("got_dtype,ref_dtype", [(np.int32, np.int64), (np.uint8, np.bool_),
                                                 (np.float64, np.float32), (np.float16, np.float32)])
def test_dtype_must_be_onnxruntimes(got_dtype, ref_dtype):
    """Equal values in another dtype fail: the program reading the output gets the wrong type."""
    ref = np.array([0, 1, 1], ref_dtype)
    r = compare("o", ref.astype(got_dtype), ref, 1.0, 1.0)
    assert not r["passed"] and "dtype" in r["note"]
    assert compare("o", ref.copy(), ref, 1e-3, 1e-4)["passed"]


def test_int_inputs_are_drawn_within_their_gather_and_one_hot_bounds(tmp_path):
    """Sample inputs for int inputs: a Gather's indices below the gathered axis; an input compared
    by Equal with a constant (a one-hot encoding, through a Reshape and a Cast, as tf2onnx writes
    Magika's bytes) below one past the constant's largest value; anything else in [0, 2)."""
    from dlcc.frontend import import_model
    from dlcc.inputs import gather_bounds

    nodes = [helper.make_node("Gather", ["table", "ids"], ["emb"]),
             helper.make_node("Reshape", ["bytes", "shp"], ["b3"]),
             helper.make_node("Cast", ["b3"], ["b64"], to=TensorProto.INT64),
             helper.make_node("Equal", ["b64", "range"], ["hot"]),
             helper.make_node("Cast", ["hot"], ["hotf"], to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["hotf"], ["y"], keepdims=0),
             helper.make_node("Cast", ["flag"], ["flagf"], to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["emb"], ["e"], keepdims=0),
             helper.make_node("Add", ["e", "y"], ["ey"]),
             helper.make_node("Mul", ["ey", "flagf"], ["out"])]
    inits = [onnx.numpy_helper.from_array(np.ones((7, 3), np.float32), "table"),
             onnx.numpy_helper.from_array(np.array([4, 8, 1], np.int64), "shp"),
             onnx.numpy_helper.from_array(np.arange(300, dtype=np.int64), "range")]
    g = helper.make_graph(nodes, "ints", [helper.make_tensor_value_info("ids", TensorProto.INT64, [5]),
                                          helper.make_tensor_value_info("bytes", TensorProto.INT32, [32]),
                                          helper.make_tensor_value_info("flag", TensorProto.INT64, [1])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1])], inits)
    path = tmp_path / "ints.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    bounds = gather_bounds(import_model(path))
    assert bounds == {"ids": 7, "bytes": 300}
    feeds = sample_inputs([{"name": "bytes", "shape": [4096], "dtype": "int32"},
                           {"name": "flag", "shape": [64], "dtype": "int64"}], 0, bounds)
    assert feeds["bytes"].max() > 250 and feeds["bytes"].min() >= 0 and set(np.unique(feeds["flag"])) == {0, 1}


def _stft_power_model(path):
    """onnx-asr's GigaAM front end in small: a Hann-windowed STFT of 400-sample frames of a [batch,
    samples] signal, its power spectrum and log. onnxruntime's STFT of such frames is about 1e-3 off
    the exact answer after the log, well outside verify's fp32 tolerance."""
    from onnx import numpy_helper

    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(400) / 400)).astype(np.float32)
    nodes = [helper.make_node("STFT", ["x", "step", "w"], ["s"]),
             helper.make_node("ReduceSumSquare", ["s"], ["p"], axes=[-1], keepdims=0),
             helper.make_node("Log", ["p"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4000])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "f", "k"])],
                          [numpy_helper.from_array(np.array(160, np.int64), "step"), numpy_helper.from_array(window, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


def test_an_output_onnxruntime_gets_wrong_is_judged_against_float64(tmp_path):
    """Where onnxruntime is the one off, verify's second judge (the float64 answer from
    onnx.reference) passes the output and says so; where dlcc is off, it stays failed."""
    path = _stft_power_model(tmp_path / "stft.onnx")
    x = np.random.default_rng(0).standard_normal((2, 4000)).astype(np.float32)
    z = x.astype(np.float64)[:, np.arange((4000 - 400) // 160 + 1)[:, None] * 160 + np.arange(400)] * (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(400) / 400))
    spec = np.fft.rfft(z, axis=-1)
    exact = np.log(spec.real ** 2 + spec.imag ** 2)
    ref = run_onnxruntime(path, {"x": x})[0]
    assert not compare("y", ref.astype(np.float64), exact, 1e-3, 1e-4)["passed"]  # the premise: onnxruntime is off
    good = exact.astype(np.float32)
    row = verify_outputs(path, {"y": good}, {"x": x})[0]
    assert row["passed"] and row["judge"] == "float64" and "onnxruntime" in row["note"], row
    bad = good.copy()
    bad[1, 3, 7] += 0.01
    row = verify_outputs(path, {"y": bad}, {"x": x})[0]
    assert not row["passed"] and "judge" not in row, row


def test_length_inputs_are_drawn_as_valid_lengths():
    """An int [batch] input named as lengths (onnx-asr's `waveforms_lens`) gets lengths of the float
    input it describes: one whole, the others at least half of it. Drawn from [0, 2) they masked
    out every frame but one, and verify compared zeros with zeros."""
    sig = [{"name": "waveforms", "shape": [4, 16000], "dtype": "float32"},
           {"name": "waveforms_lens", "shape": [4], "dtype": "int64"},
           {"name": "x_lengths", "shape": [3], "dtype": "int32"},  # no float input of batch 3: plain ints
           {"name": "lenient", "shape": [4], "dtype": "int64"}]  # ("len" only as a part of a word)
    got = sample_inputs(sig, seed=3)
    lens = got["waveforms_lens"]
    assert lens.dtype == np.int64 and lens[0] == 16000 and (lens >= 8000).all() and (lens <= 16000).all()
    assert set(np.unique(got["x_lengths"])) <= {0, 1} and got["x_lengths"].dtype == np.int32
    assert set(np.unique(got["lenient"])) <= {0, 1}
    # lengths beside int token ids only (piper's diacritizer): the ids' length, a float input first
    got = sample_inputs([{"name": "char_inputs", "shape": [2, 32], "dtype": "int64"},
                         {"name": "input_lengths", "shape": [2], "dtype": "int64"}], seed=3)
    assert got["input_lengths"][0] == 32 and (got["input_lengths"] >= 16).all()
    got = sample_inputs(sig[:2] + [{"name": "ids", "shape": [4, 9], "dtype": "int64"}], seed=3)
    assert got["waveforms_lens"][0] == 16000
