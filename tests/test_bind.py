"""A model call with its arrays bound once (`model.bind`, dlcc/bound.py), on OpenCL (PoCL here).

The contract: each call reads what the bound inputs hold now and fills the same output objects,
whose values equal a plain call's on the same inputs; the checks are made at bind time, and a
host input that would be converted (so later changes would be missed) is refused there. The
CUDA side (one graph launch per call, the device copies inside it) is driven against the fake
PyCUDA in tests/test_cuda_runtime.py."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import dlcc
from dlcc import interop
from dlcc.errors import DlccError

from conftest import opencl_device_available
from test_bad_input import EXAMPLE

pytestmark = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")


@pytest.fixture(scope="module")
def model():
    return dlcc.compile(EXAMPLE, target="opencl", pipeline="astitch")


def _same(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(np.array_equal(a[k], b[k]) for k in a)


def test_a_bound_call_reads_the_inputs_as_they_are_now(model):
    feeds = model.sample_inputs(0)
    call = model.bind(feeds)
    first = call()
    assert _same(first, model(feeds))
    outs = {k: v.copy() for k, v in first.items()}
    later = model.sample_inputs(1)
    for k in feeds:  # the caller changes the bound arrays in place
        np.copyto(feeds[k], later[k])
    again = call()
    assert _same(again, model(later)) and not _same(again, outs)
    assert all(again[k] is first[k] for k in first)  # the same objects, overwritten
    call.close()
    with pytest.raises(DlccError, match="closed"):
        call()


def test_bound_outputs_can_be_the_callers_arrays(model):
    pytest.importorskip("pyopencl")
    import pyopencl.array as cla

    feeds = model.sample_inputs(2)
    ref = model(feeds)
    (oname, oref), = ref.items()
    rt = model.executor().rt
    dev = cla.to_device(rt.queue, np.full(oref.shape, np.nan, oref.dtype))
    x = {k: cla.to_device(rt.queue, v) for k, v in feeds.items()}  # device inputs, copied in at each call
    with model.bind(x, out={oname: dev}) as call:
        got = call()
        assert got[oname] is dev and np.array_equal(dev.get(), oref)
        nxt = model.sample_inputs(3)
        for k in x:
            x[k].set(nxt[k])
        call()
        assert np.array_equal(dev.get(), model(nxt)[oname])


def test_a_host_input_that_would_be_copied_is_refused_at_bind_time(model):
    feeds = model.sample_inputs(0)
    (name, x), = feeds.items()
    for bad, what in ((x.astype(np.float64), "float64 array"),
                      (np.asfortranarray(x) if x.ndim > 1 and x.shape[-1] > 1 else x[..., ::-1].copy().T, "array"),
                      (x.tolist(), "list")):
        with pytest.raises(interop.InteropError, match=rf"bound input '{name}' is read in place .*{what}"):
            model.bind({name: bad})
    with pytest.raises(dlcc.executor.InputError, match="has shape"):
        model.bind({name: x[..., :-1]})
    with pytest.raises(interop.InteropError, match="needs the CUDA target"):
        model.bind(feeds, outputs="device")
    with pytest.raises(interop.InteropError, match="needs the CUDA target"):
        model.bind(feeds, stream=0)


def test_a_bfloat16_input_read_from_npz_is_bound_in_place(tmp_path):
    """numpy keeps ml_dtypes' bfloat16 in an .npz as 2-byte voids; run() reads them as bfloat16,
    and so does a bound call, in place: a change to the loaded array shows in the next call."""
    import ml_dtypes
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Cast", ["x"], ["c"], to=TensorProto.FLOAT),
                           helper.make_node("Mul", ["c", "c"], ["y"])], "bf16in",
                          [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [4, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    path = tmp_path / "bf16in.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    m = dlcc.compile(path, target="opencl")
    x = np.arange(32, dtype=np.float32).reshape(4, 8).astype(ml_dtypes.bfloat16)
    np.savez(tmp_path / "in.npz", x=x)
    v = np.load(tmp_path / "in.npz")["x"]
    assert v.dtype == np.dtype("V2")
    call = m.bind({"x": v})
    np.testing.assert_array_equal(call()["y"], x.astype(np.float32) ** 2)
    v.view(ml_dtypes.bfloat16)[:] = 3
    np.testing.assert_array_equal(call()["y"], np.full((4, 8), 9, np.float32))
    call.close()


def test_a_torch_cpu_tensor_is_bound_in_place(model):
    torch = pytest.importorskip("torch")
    feeds = model.sample_inputs(0)
    (name, x), = feeds.items()
    t = torch.from_numpy(x.copy())
    call = model.bind({name: t})
    assert _same(call(), model(feeds))
    nxt = model.sample_inputs(4)[name]
    t.copy_(torch.from_numpy(nxt))
    assert _same(call(), model({name: nxt}))


def test_bound_calls_from_four_threads(model):
    """Each thread its own BoundCall of one model (one arena, serialised): 4 threads x 10 calls,
    each output equal to the plain call on the same inputs."""
    feeds = [model.sample_inputs(s) for s in range(4)]
    expected = [model(f) for f in feeds]
    calls = [model.bind({k: v.copy() for k, v in f.items()}) for f in feeds]
    bad, errors = [], []

    def work(i: int) -> None:
        try:
            for _ in range(10):
                if not _same(calls[i](), expected[i]):
                    bad.append(i)
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and not bad, (errors, sorted(set(bad)))
