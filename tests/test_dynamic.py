"""dlcc.compile(..., dynamic=True): a plan compiled for each distinct set of input shapes at call
time (dlcc/dynamic.py), every output against onnxruntime."""
from __future__ import annotations

import threading
import warnings

import numpy as np
import onnx
import onnx.helper as h
import onnx.numpy_helper as nh
import pytest

import dlcc
from dlcc.errors import DlccError, ShapeError, UnboundDimError
from dlcc.executor import InputError

from conftest import opencl_device_available

needs_opencl = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")
rng = np.random.default_rng(3)


def _ort(path, feeds):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.fixture(scope="module")
def masked(tmp_path_factory):
    """x [batch, seq, 8] and mask [batch, seq] (named dims shared by both inputs) through a
    MatMul, a masked softmax over seq and a row sum: y [batch, seq, 4], s [batch, 4]."""
    w = rng.standard_normal((8, 4)).astype(np.float32)
    nodes = [
        h.make_node("MatMul", ["x", "w"], ["xw"]),
        h.make_node("Cast", ["mask"], ["mf"], to=onnx.TensorProto.FLOAT),
        h.make_node("Sub", ["one", "mf"], ["inv"]),
        h.make_node("Mul", ["inv", "big"], ["pen"]),
        h.make_node("Unsqueeze", ["pen", "ax"], ["pen3"]),
        h.make_node("Sub", ["xw", "pen3"], ["z"]),
        h.make_node("Softmax", ["z"], ["y"], axis=1),
        h.make_node("ReduceSum", ["y", "ax1"], ["s"], keepdims=0),
    ]
    g = h.make_graph(nodes, "masked", [
        h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", "seq", 8]),
        h.make_tensor_value_info("mask", onnx.TensorProto.INT64, ["batch", "seq"]),
    ], [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", "seq", 4]),
        h.make_tensor_value_info("s", onnx.TensorProto.FLOAT, ["batch", 4])],
        [nh.from_array(w, "w"), nh.from_array(np.array(1, np.float32), "one"),
         nh.from_array(np.array(1e4, np.float32), "big"), nh.from_array(np.array([2], np.int64), "ax"),
         nh.from_array(np.array([1], np.int64), "ax1")])
    path = tmp_path_factory.mktemp("dyn") / "masked.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
    return path


def _feeds(b, s, seed=0):
    r = np.random.default_rng(seed)
    mask = np.ones((b, s), np.int64)
    mask[0, s // 2:] = 0
    return {"x": r.standard_normal((b, s, 8)).astype(np.float32), "mask": mask}


def _check(path, got, feeds):
    for name, ref in zip(["y", "s"], _ort(path, feeds)):
        assert got[name].shape == ref.shape
        np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-5, err_msg=name)


@needs_opencl
def test_each_shape_gets_its_plan_and_a_seen_shape_reuses_it(masked):
    m = dlcc.compile(masked, target="opencl", pipeline="astitch", dynamic=True)
    assert m.compiles == 0 and m.plans == []  # nothing compiles before the first call
    assert m.inputs[0] == {"name": "x", "dtype": "float32", "shape": ["batch", "seq", 8]}
    for b, s in [(1, 5), (2, 9), (1, 5), (3, 1), (2, 9)]:
        feeds = _feeds(b, s, seed=b * 100 + s)
        _check(masked, m(feeds), feeds)
    assert m.compiles == 3
    assert m.plans == [{"mask": (1, 5), "x": (1, 5, 8)}, {"mask": (3, 1), "x": (3, 1, 8)},
                       {"mask": (2, 9), "x": (2, 9, 8)}]  # least recently used first
    feeds = _feeds(2, 9, seed=1)
    _check(masked, m.run(feeds), feeds)
    assert m.compiles == 3


def test_shapes_are_checked_before_anything_compiles(masked):
    m = dlcc.compile(masked, target="opencl", dynamic=True)
    x = np.zeros((2, 5, 8), np.float32)
    with pytest.raises(InputError, match=r"'mask' has seq=6, and input 'x' has seq=5: a named dim takes one value"):
        m({"x": x, "mask": np.ones((2, 6), np.int64)})
    with pytest.raises(InputError, match=r"'x' has shape \[2, 5, 7\]; the model fixes dim 2 to 8"):
        m({"x": np.zeros((2, 5, 7), np.float32), "mask": np.ones((2, 5), np.int64)})
    with pytest.raises(InputError, match=r"'x' has shape \[2, 5\], of rank 2; the model's is x: float32"):
        m({"x": np.zeros((2, 5), np.float32), "mask": np.ones((2, 5), np.int64)})
    with pytest.raises(InputError, match=r"missing \['mask'\], unknown \['m'\]"):
        m({"x": x, "m": x})
    assert m.compiles == 0


@needs_opencl
def test_dims_bound_at_compile_time_stay_bound(masked):
    m = dlcc.compile(masked, target="opencl", pipeline="astitch", shapes={"batch": 2}, dynamic=True)
    with pytest.raises(InputError, match=r"'x' has batch=3; the model was compiled with shapes=\{'batch': 2\}"):
        m(_feeds(3, 4))
    feeds = _feeds(2, 4)
    _check(masked, m(feeds), feeds)
    with pytest.raises(ShapeError, match="neither an input of .* nor one of its symbolic dims"):
        dlcc.compile(masked, shapes={"heads": 2}, dynamic=True)


@needs_opencl
def test_specialize_compiles_ahead_and_the_call_finds_it(masked):
    m = dlcc.compile(masked, target="opencl", pipeline="astitch", dynamic=True)
    plan = m.specialize({"batch": 2, "seq": 3})
    assert plan.inputs[0]["shape"] == [2, 3, 8] and m.compiles == 1
    assert m.specialize({"x": (2, 3, 8), "mask": (2, 3)}) is plan  # the same plan, however it is named
    feeds = m.sample_inputs({"batch": 2, "seq": 3}, seed=4)
    _check(masked, m(feeds), feeds)
    assert m.compiles == 1
    assert m.specialize({"x": (1, 2, 8)}).inputs[1]["shape"] == [1, 2]  # mask's dims named by x's
    with pytest.raises(ShapeError, match=r"x: float32\[batch, seq, 8\] is not bound; mask: int64\[batch, seq\] is not"):
        m.specialize({"batch": 1})
    with pytest.raises(ShapeError, match="'heads': neither an input nor a named dim"):
        m.specialize({"heads": 4})


@needs_opencl
def test_past_max_plans_the_oldest_plan_goes_with_one_warning(masked):
    m = dlcc.compile(masked, target="opencl", pipeline="astitch", dynamic=True, max_plans=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for s in (2, 3, 4, 5, 2):
            feeds = _feeds(1, s, seed=s)
            _check(masked, m(feeds), feeds)
    assert [d["x"][1] for d in m.plans] == [5, 2]
    assert m.compiles == 5  # seq 2 was dropped, so it compiled again
    assert sum("max_plans=2" in str(w.message) for w in caught) == 1
    with pytest.raises(DlccError, match="max_plans=0"):
        dlcc.compile(masked, dynamic=True, max_plans=0)


@needs_opencl
def test_threads_with_different_shapes_get_correct_outputs_and_one_compile_per_shape(masked):
    m = dlcc.compile(masked, target="opencl", pipeline="astitch", dynamic=True)
    shapes = [(1, 4), (2, 6), (1, 4), (2, 6)]
    errors: list = []

    def worker(k):
        try:
            for i in range(4):
                b, s = shapes[(k + i) % len(shapes)]
                feeds = _feeds(b, s, seed=1000 * k + i)
                _check(masked, m(feeds), feeds)
        except BaseException as e:  # noqa: BLE001 (reported by the main thread)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert m.compiles == 2


@needs_opencl
def test_plans_go_through_the_compile_cache(masked, tmp_path):
    feeds = _feeds(2, 3)
    first = dlcc.compile(masked, target="opencl", pipeline="astitch", dynamic=True, cache=tmp_path / "cache")
    _check(masked, first(feeds), feeds)
    assert first.specialize({"batch": 2, "seq": 3}).cache_hit is False
    second = dlcc.compile(masked, target="opencl", pipeline="astitch", dynamic=True, cache=tmp_path / "cache")
    _check(masked, second(feeds), feeds)
    assert second.specialize({"batch": 2, "seq": 3}).cache_hit is True


def test_unbound_dims_suggest_dynamic_in_python_only(masked, tmp_path):
    with pytest.raises(UnboundDimError, match=r"dynamic=True"):
        dlcc.compile(masked, target="opencl")
    with pytest.raises(UnboundDimError) as e:  # (the CLI's form: NAME=DIMS strings)
        dlcc.compile(masked, target="opencl", shapes=["batch=1"])
    assert "dynamic=True" not in str(e.value) and "--shape x=1xNx8" in str(e.value)
    with pytest.raises(DlccError, match="no one artifact to write to out="):
        dlcc.compile(masked, out=tmp_path / "a", dynamic=True)


def test_a_bad_model_file_is_refused_at_compile(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage")
    with pytest.raises(DlccError):
        dlcc.compile(bad, dynamic=True)
    with pytest.raises(DlccError, match="no such file"):
        dlcc.compile(tmp_path / "missing.onnx", dynamic=True)


@needs_opencl
def test_a_torch_export_with_dynamic_batch_and_sequence(tmp_path):
    """A tiny BERT exported by torch.onnx with dynamic batch and sequence axes, called with three
    shapes, each against onnxruntime."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                  vocab_size=100, max_position_embeddings=32, attn_implementation="eager")
    bert = transformers.BertModel(cfg).eval()

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, ids, mask):
            return self.bert(input_ids=ids, attention_mask=mask).last_hidden_state

    path = tmp_path / "bert.onnx"
    ids = torch.randint(0, 100, (1, 8))
    torch.onnx.export(Wrap().eval(), (ids, torch.ones_like(ids)), str(path), input_names=["ids", "mask"],
                      output_names=["hidden"], opset_version=17, dynamo=False,
                      dynamic_axes={"ids": {0: "batch", 1: "seq"}, "mask": {0: "batch", 1: "seq"}})
    m = dlcc.compile(path, target="opencl", pipeline="astitch", dynamic=True)
    for b, s in [(1, 8), (2, 5), (1, 17)]:
        r = np.random.default_rng(s)
        mask = np.ones((b, s), np.int64)
        mask[-1, s - 2:] = 0
        feeds = {"ids": r.integers(0, 100, (b, s)).astype(np.int64), "mask": mask}
        ref = _ort(path, feeds)[0]
        np.testing.assert_allclose(m(feeds)["hidden"], ref, rtol=1e-4, atol=1e-4)
    assert m.compiles == 3


def test_a_dtype_numpy_cannot_convert_is_refused_before_compiling(masked):
    m = dlcc.compile(masked, target="opencl", dynamic=True)
    with pytest.raises(InputError, match="'x' has dtype complex64, expected float32"):
        m({"x": np.zeros((1, 2, 8), np.complex64), "mask": np.ones((1, 2), np.int64)})
    with pytest.raises(InputError, match="'mask' has dtype object, expected int64"):
        m({"x": np.zeros((1, 2, 8), np.float32), "mask": np.array([[None, None]])})
    assert m.compiles == 0
