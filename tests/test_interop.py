"""Arrays in and out beyond numpy (dlcc/interop.py), on the OpenCL target and on CPU tensors.

The CUDA paths (device arrays copied device to device, outputs="device") are driven against the
fake PyCUDA in tests/test_cuda_runtime.py; here: torch CPU tensors and pyopencl arrays in,
every device-array path that needs CUDA refused clearly on OpenCL, and the DLPack and
__cuda_array_interface__ readers and exporter checked against numpy's and torch's own."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import dlcc
from dlcc import interop
from dlcc.errors import DlccError

from conftest import opencl_device_available
from test_bad_input import EXAMPLE

needs_opencl = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")


@pytest.fixture(scope="module")
def model():
    m = dlcc.compile(EXAMPLE, target="opencl")
    feeds = m.sample_inputs(0)
    return m, feeds, m(feeds)


def _same(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(np.array_equal(a[k], b[k]) for k in a)


@needs_opencl
def test_torch_cpu_tensors_go_in_as_host_arrays(model):
    torch = pytest.importorskip("torch")
    m, feeds, ref = model
    name = m.inputs[0]["name"]
    x = feeds[name]
    assert _same(m({name: torch.from_numpy(x)}), ref)
    # strided (a transpose of a transpose's storage): numpy reads the strides, dlcc copies it contiguous
    t = torch.from_numpy(np.ascontiguousarray(np.swapaxes(x, 2, 3))).transpose(2, 3)
    assert not t.is_contiguous()
    assert _same(m({name: t}), ref)


@needs_opencl
def test_pyopencl_arrays_of_the_models_context_go_in_on_the_device(model):
    cl = pytest.importorskip("pyopencl")
    import pyopencl.array as cla

    m, feeds, ref = model
    name = m.inputs[0]["name"]
    rt = m.executor().rt
    x = cla.to_device(rt.queue, feeds[name])
    assert _same(m.run({name: x}), ref)
    other = cl.CommandQueue(cl.Context([rt.device]))
    with pytest.raises(interop.InteropError, match="another OpenCL context"):
        m({name: cla.to_device(other, feeds[name])})
    with pytest.raises(dlcc.executor.InputError, match="dtype float64, the model's is float32; device arrays are not"):
        m({name: cla.to_device(rt.queue, feeds[name].astype(np.float64))})
    with pytest.raises(dlcc.executor.InputError, match="has shape"):
        m({name: cla.to_device(rt.queue, np.ascontiguousarray(feeds[name][:, :, :2]))})
    wide = cla.to_device(rt.queue, np.concatenate([feeds[name]] * 2, axis=3))
    with pytest.raises(interop.InteropError, match="non-contiguous pyopencl array"):
        m({name: wide[:, :, :, ::2]})


class _CudaArray:
    """What torch/CuPy hand over for a CUDA tensor: a __cuda_array_interface__ dict."""

    def __init__(self, shape, typestr="<f4", ptr=0x7f0000000000, strides=None, stream=None):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "data": (ptr, False),
                                         "version": 3, "strides": strides, "stream": stream}


class _CudaDLPack:
    """A CUDA tensor offered through DLPack only (as JAX does)."""

    def __init__(self, shape, dtype="float32", ptr=0x7f0000000000):
        self.shape, self.dtype, self.ptr = shape, dtype, ptr

    def __dlpack_device__(self):
        return (interop.KDL_CUDA, 0)

    def __dlpack__(self, stream=None, **kw):
        assert stream == 1  # dlcc asks for CUDA's legacy default stream, which it launches on
        return interop.dlpack_capsule(self.ptr, self.shape, self.dtype, (interop.KDL_CUDA, 0), self)


@needs_opencl
def test_cuda_device_arrays_and_device_outputs_say_they_need_cuda(model):
    m, feeds, _ = model
    name = m.inputs[0]["name"]
    shape = feeds[name].shape
    with pytest.raises(interop.InteropError, match="CUDA device array, and this model runs on opencl.*-t cuda"):
        m({name: _CudaArray(shape)})
    live = len(interop._LIVE)
    with pytest.raises(interop.InteropError, match="CUDA device array"):
        m({name: _CudaDLPack(shape)})
    gc.collect()
    assert len(interop._LIVE) == live  # the refused tensor's deleter ran: nothing of the producer is held
    with pytest.raises(interop.InteropError, match="outputs='device' needs the CUDA target"):
        m.run(feeds, outputs="device")
    with pytest.raises(interop.InteropError, match="stream= needs the CUDA target"):
        m.run(feeds, stream=0x1234)
    with pytest.raises(DlccError, match="use 'host' or 'device'"):
        m.run(feeds, outputs="gpu")


def test_the_cuda_array_interface_is_read_with_its_strides_and_stream():
    r = interop.describe(_CudaArray((2, 3), "<f2", ptr=4096, strides=(6, 2), stream=7))
    assert (r.where, r.shape, r.dtype, r.ptr, r.stream) == ("cuda", (2, 3), "float16", 4096, 7) and r.contiguous()
    assert not interop.describe(_CudaArray((2, 3), strides=(4, 8))).contiguous()  # a transpose
    assert interop.describe(_CudaArray((1, 3), strides=(999, 4))).contiguous()  # extent 1: any stride
    assert interop.describe(_CudaArray((4,), "<V2")).dtype == "bfloat16"
    bad = _CudaArray((2,))
    del bad.__cuda_array_interface__["data"]
    with pytest.raises(interop.InteropError, match="malformed __cuda_array_interface__"):
        interop.describe(bad)
    with pytest.raises(interop.InteropError, match="typestr"):
        interop.describe(_CudaArray((2,), "<q9"))
    with pytest.raises(interop.InteropError, match="1 strides for 2 dims"):  # not read as contiguous
        interop.describe(_CudaArray((2, 3), strides=(4,)))
    with pytest.raises(interop.InteropError, match="shape"):
        interop.describe(_CudaArray((2, -3)))
    for cai in ({"shape": (2,), "typestr": "<f4", "data": None}, {"shape": 5, "typestr": "<f4", "data": (0, False)},
                {"shape": (2,), "typestr": "<f4", "data": (0, False), "strides": "x"}):
        with pytest.raises(interop.InteropError, match="malformed"):
            interop.describe(type("A", (), {"__cuda_array_interface__": cai})())


def test_a_cuda_dlpack_capsule_is_read_in_place_and_released_after_use():
    live = len(interop._LIVE)
    x = _CudaDLPack((2, 5), "bfloat16", ptr=8192)
    r = interop.describe(x)
    assert (r.where, r.shape, r.dtype, r.ptr, r.device_id, r.strides) == ("cuda", (2, 5), "bfloat16", 8192, 0, None)
    assert len(interop._LIVE) == live + 1  # held while dlcc reads it
    r.done()
    assert len(interop._LIVE) == live


def test_the_dlpack_exporter_is_what_numpy_and_torch_read():
    torch = pytest.importorskip("torch")
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    live = len(interop._LIVE)

    class HostView:  # the exporter over host memory: the same struct a DeviceArray exports, device CPU
        def __dlpack_device__(self):
            return (interop.KDL_CPU, 0)

        def __dlpack__(self, stream=None, **kw):
            return interop.dlpack_capsule(a.ctypes.data, a.shape, "float32", (interop.KDL_CPU, 0), a)

    n, t = np.from_dlpack(HostView()), torch.from_dlpack(HostView())
    a[1, 2] = -7.0
    assert n[1, 2] == -7.0 and t[1, 2].item() == -7.0  # both read dlcc's memory in place
    assert n.shape == (3, 4) and t.dtype == torch.float32
    del n, t
    gc.collect()
    assert len(interop._LIVE) == live  # the consumers' deleters ran
    capsule = HostView().__dlpack__()
    del capsule  # never consumed: the capsule's destructor releases it
    gc.collect()
    assert len(interop._LIVE) == live


def test_dlpack_tensors_of_torch_are_parsed_by_dtype():
    torch = pytest.importorskip("torch")
    r = interop.describe(torch.full((2, 3), 1.5, dtype=torch.bfloat16))  # numpy cannot: dlcc's parser reads it
    assert r.where == "host" and r.dtype == "bfloat16" and r.host.astype(np.float32).tolist() == [[1.5] * 3] * 2
    r = interop.describe(torch.arange(6, dtype=torch.int64).reshape(2, 3))
    assert r.where == "host" and r.host.tolist() == [[0, 1, 2], [3, 4, 5]]


def test_device_array_exports_for_bfloat16():
    d = interop.DeviceArray(1 << 20, (2, 2), "bfloat16", 0, None)
    cai = d.__cuda_array_interface__
    # stream 1 (CUDA's legacy default stream): the model may still be writing it when run() returns
    assert cai["typestr"] == "<V2" and cai["data"] == (1 << 20, False) and cai["stream"] == 1
    assert interop.from_cuda_array_interface(d).dtype == "bfloat16"
    assert d.__dlpack_device__() == (interop.KDL_CUDA, 0)
    with pytest.raises(BufferError):
        d.__dlpack__(dl_device=(interop.KDL_CPU, 0))


@needs_opencl
def test_out_buffers_receive_the_outputs(model):
    """out={name: array}: numpy arrays (any target) and pyopencl arrays (OpenCL) are written in
    place and returned as given; a wrong shape, dtype, a read-only array or an unknown name is one
    clear error before anything runs."""
    pytest.importorskip("pyopencl")
    import pyopencl.array as cla

    m, feeds, ref = model
    (oname, oref), = ref.items()
    host = np.full(oref.shape, np.nan, oref.dtype)
    got = m.run(feeds, out={oname: host})
    assert got[oname] is host and np.array_equal(host, oref)
    rt = m.executor().rt
    dev = cla.to_device(rt.queue, np.full(oref.shape, np.nan, oref.dtype))
    got = m.run(feeds, out={oname: dev})
    assert got[oname] is dev and np.array_equal(dev.get(), oref)
    with pytest.raises(dlcc.executor.InputError, match="not outputs of the model"):
        m.run(feeds, out={"nope": host})
    ro = np.empty_like(oref)
    ro.flags.writeable = False
    for bad in (np.empty(oref.shape, np.float64), np.empty(oref.shape[:-1] + (oref.shape[-1] + 1,), oref.dtype), ro):
        with pytest.raises(interop.InteropError, match=f"out\\['{oname}'\\] must be a writeable C-contiguous"):
            m.run(feeds, out={oname: bad})
    with pytest.raises(interop.InteropError, match=f"out\\['{oname}'\\] is a CUDA device array"):
        m.run(feeds, out={oname: _CudaArray(oref.shape)})


def test_a_producer_that_raises_is_one_clear_error():
    class Broken:
        @property
        def __cuda_array_interface__(self):
            raise RuntimeError("the stream is gone")

    class BadCapsule:
        def __dlpack_device__(self):
            return (interop.KDL_CUDA, 0)

        def __dlpack__(self, stream=None, **kw):
            return "not a capsule"

    with pytest.raises(interop.InteropError, match="reading a Broken as a device array failed: RuntimeError"):
        interop.describe(Broken())
    with pytest.raises(interop.InteropError, match="unused DLPack capsule"):
        interop.describe(BadCapsule())


@needs_opencl
def test_device_token_ids_are_checked_on_the_device(tmp_path):
    """Ids given as a device array (here a pyopencl array; a torch CUDA tensor on CUDA) are not
    read back to the host to be checked: the check kernel the compile registered for that input
    runs on the input buffer before the plan's launches, and an id past the table is the same
    clear error as for a host array, naming the input, the index, its position, the bound and the
    node, raised before any output is returned. Good ids after it match the host path (the report
    and the claim word were cleared)."""
    import pyopencl.array as cla

    from dlcc.executor import DeviceIndexError
    from test_hostile_input import _gather_model

    m = dlcc.compile(_gather_model(tmp_path / "g.onnx"), target="opencl")
    check = m.plan["meta"]["index_checks"][0]
    assert check["kernel"].startswith("check_index_") and check["elements"] == 6
    assert {"errors", "report"} <= set(m.plan["storages"])
    rt = m.executor().rt
    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    ids = np.array([[0, 1, 2], [3, 9, -1]], np.int64)
    np.testing.assert_array_equal(m({"ids": cla.to_device(rt.queue, ids)})["y"], table[ids])
    for bad, at in ((10**9, "[1, 1]"), (-11, "[1, 1]"), (10, "[1, 1]")):
        wild = ids.copy()
        wild[1, 1] = bad
        with pytest.raises(DeviceIndexError, match=(rf"input 'ids': index {bad} at \{at[:-1]}\] is outside "
                                                    r"\[-10, 10\) for Gather node 'g' \(a device array")):
            m({"ids": cla.to_device(rt.queue, wild)})
        np.testing.assert_array_equal(m({"ids": cla.to_device(rt.queue, ids)})["y"], table[ids])
    # the first bad id is the one reported, whichever thread of the check claims it first
    two = ids.copy()
    two[0, 2], two[1, 0] = 12, 13
    with pytest.raises(DeviceIndexError, match=r"index 1[23] at \[(0, 2|1, 0)\]"):
        m({"ids": cla.to_device(rt.queue, two)})
    # host ids: checked on the host, before any launch (no check kernel)
    with pytest.raises(dlcc.executor.InputError, match=r"input 'ids': index 10 at \[1, 1\]"):
        m({"ids": np.where(ids == 9, 10, ids)})
