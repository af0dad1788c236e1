"""The thin PyCUDA runtime, driven by the shared executor against a fake `pycuda` (no GPU here).

It checks what the CUDA path does with a real plan: one allocation per storage, weights uploaded,
every launch with the plan's grid/block and each buffer argument as base pointer + byte offset.
Whether the kernels themselves compile for the GPU is tests/test_nvcc.py's job.
"""
from __future__ import annotations

import sys
import threading
import types

import numpy as np
import pytest

import dlcc

from test_bad_input import EXAMPLE


class FakeDriver:
    """pycuda.driver as the CUDA runtime uses it, keeping each thread's context stack: every
    allocation, copy, launch and synchronize asserts that the device's primary context is
    current on the calling thread, and `pushes`/`pops` count what the runtime did."""

    def __init__(self):
        self.next_ptr = 1 << 20
        self.allocs, self.h2d, self.d2d, self.launches = [], [], [], []
        self.pushes, self.pops, self.retained, self.created = 0, 0, [], 0
        self.stacks = threading.local()
        outer = self

        class Primary:
            def __init__(self, index):
                self.index = index

            def push(self):
                outer.stack().append(self)
                outer.pushes += 1

        class Ctx:
            @staticmethod
            def pop():
                assert outer.stack(), "pop with no context current"
                outer.stack().pop()
                outer.pops += 1

            @staticmethod
            def synchronize():
                outer.current()

        class Device:
            @staticmethod
            def count():
                return 2

            def __init__(self, index):
                assert 0 <= index < 2
                self.index = index

            def name(self):
                return "Fake H100"

            def compute_capability(self):
                return (9, 0)

            def get_attribute(self, which):  # only what a test puts in device_attrs (and device_attribute)
                return outer.device_attrs[which]

            def retain_primary_context(self):
                outer.retained.append(self.index)
                return Primary(self.index)

            def make_context(self):  # what pycuda.autoinit does: a second context, left current
                outer.created += 1
                raise AssertionError("dlcc must use the primary context")

        class Stream:
            def __init__(self, flags=0):
                outer.current()
                assert flags == 1  # non-blocking: no implicit sync with the legacy stream mid-capture
                outer.next_stream += 1
                self.handle = outer.next_stream

        class Event:  # a kernel takes 1 µs here: time_till counts the launches between two records
            def record(self):
                outer.current()
                self.at = len(outer.launches)

            def synchronize(self):
                pass

            def time_till(self, later):
                return (later.at - self.at) * 1e-3  # ms

        self.Context, self.Device, self.Primary, self.Stream, self.Event = Ctx, Device, Primary, Stream, Event
        self.next_stream, self.capturing, self.captured, self.graphs, self.graph_launches = 0x5000, None, [], {}, 0
        self.stream_ops, self.syncs = [], []

        class Fn:
            def __init__(self, name):
                self.name = name

            def prepare(self, sig):
                assert set(sig) <= {"P", "i"}
                self.sig = sig

            def set_attribute(self, attr, value):
                outer.current()
                assert attr == "MAX_DYNAMIC_SHARED_SIZE_BYTES"
                self.max_dynamic = value

            def _shared(self, shared_size):
                """A launch with more than 48 KiB of dynamic shared memory fails unless the kernel
                opted in to at least that much (cuFuncSetAttribute), as the driver's does."""
                assert shared_size <= 48 * 1024 or getattr(self, "max_dynamic", 0) >= shared_size, \
                    f"{self.name}: {shared_size} B of dynamic shared memory without the opt-in"
                if shared_size:
                    outer.shared_launches.append((self.name, shared_size))

            def prepared_async_call(self, grid, block, stream, *args, shared_size=0):
                outer.current()
                assert outer.capturing == stream.handle, "an async launch outside the capture"
                self._shared(shared_size)
                packed = tuple(np.int32(a) if f == "i" else np.uintp(a) for f, a in zip(self.sig, args))
                outer.captured.append((self.name, packed, block, grid))

            def prepared_call(self, grid, block, *args, shared_size=0):
                outer.current()
                self._shared(shared_size)
                assert outer.capturing is None, "a launch on the legacy stream during a capture"
                # Record what PyCUDA would pack: 'i' as a 32-bit int, 'P' as a pointer.
                assert len(args) == len(self.sig) and all(type(a) is int for a in args)
                packed = tuple(np.int32(a) if f == "i" else np.uintp(a) for f, a in zip(self.sig, args))
                outer.launches.append((self.name, packed, block, grid))
                if outer.on_launch is not None:  # what the kernel would do, where a test says
                    outer.on_launch(self.name, packed)

        self.Context = Ctx
        self.Fn = Fn
        self.on_launch, self.dtoh, self.mapped, self.event_ready = None, [], {}, True
        self.device_attrs = {}
        self.shared_launches = []  # (kernel, dynamic shared bytes) of each launch or captured launch that had some
        self.host_alloc_flags = types.SimpleNamespace(DEVICEMAP=2)

    def stack(self) -> list:
        if not hasattr(self.stacks, "s"):
            self.stacks.s = []
        return self.stacks.s

    def current(self):
        assert self.stack() and isinstance(self.stack()[-1], self.Primary), "no primary context current"
        return self.stack()[-1]

    def init(self):
        pass

    def mem_alloc(self, n):
        self.current()
        p = self.next_ptr
        self.next_ptr += (n + 4095) // 4096 * 4096
        self.allocs.append((p, n))
        return p

    def memcpy_htod(self, ptr, arr):
        self.current()
        self.h2d.append((int(ptr), arr.nbytes))

    def memcpy_dtoh(self, out, ptr):
        self.current()
        self.dtoh.append((int(ptr), out.nbytes))
        out[...] = 0

    def pagelocked_zeros(self, shape, dtype, mem_flags=0):
        """Mapped page-locked memory: a numpy array whose base knows its device address (as
        PyCUDA's HostAllocation does); `mapped` maps that address back to the array."""
        self.current()
        assert mem_flags == self.host_alloc_flags.DEVICEMAP
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        dev = self.next_ptr
        self.next_ptr += 4096
        import ctypes

        class HostAllocation(ctypes.c_uint8 * n):
            def get_device_pointer(self):
                return dev

        arr = np.ndarray(shape, dtype, buffer=HostAllocation())  # base: the allocation, as PyCUDA's
        self.mapped[dev] = arr
        return arr

    def memcpy_dtod(self, dst, src, n):
        self.current()
        self.d2d.append((int(dst), int(src), n))

    def memcpy_dtod_async(self, dst, src, n, stream):
        """Only captured here (a bound call's copies): replayed into `d2d` by each graph launch."""
        self.current()
        assert self.capturing == stream.handle, "an async copy outside the capture"
        self.captured.append(FakeCopy(int(dst), int(src), n))


class FakeCopy(tuple):
    """A copy node of a captured graph: (dst, src, bytes)."""

    def __new__(cls, dst, src, n):
        return super().__new__(cls, (dst, src, n))


class FakeLibcuda:
    """The driver calls dlcc makes through ctypes (CUDA graphs): a capture collects the async
    launches; a graph launch replays them into the driver's launch log, as the GPU would run them."""

    def __init__(self, drv):
        self.drv = drv

    def cuStreamBeginCapture_v2(self, stream, mode):
        assert self.drv.capturing is None and mode.value == 1  # thread-local
        self.drv.capturing = stream.value
        self.drv.captured = []
        return 0

    def cuStreamEndCapture(self, stream, graph_out):
        assert self.drv.capturing == stream.value
        self.drv.capturing = None
        graph_out._obj.value = 0x6000 + len(self.drv.graphs)
        self.drv.graphs[graph_out._obj.value] = list(self.drv.captured)
        return 0

    def cuGraphInstantiateWithFlags(self, exec_out, graph, flags):
        exec_out._obj.value = graph.value + 0x100
        self.drv.graphs[exec_out._obj.value] = self.drv.graphs[graph.value]
        return 0

    def cuGraphDestroy(self, graph):
        self.drv.graphs.pop(graph.value)
        return 0

    def cuGraphLaunch(self, exe, stream):
        self.drv.current()
        assert stream.value is None  # the legacy default stream
        for node in self.drv.graphs[exe.value]:
            (self.drv.d2d if isinstance(node, FakeCopy) else self.drv.launches).append(tuple(node))
        self.drv.graph_launches += 1
        return 0

    def cuGraphExecDestroy(self, exe):
        self.drv.graphs.pop(exe.value, None)
        return 0

    def cuStreamSynchronize(self, stream):
        self.drv.current()
        self.drv.syncs.append(stream.value)
        return 0

    def cuEventCreate(self, ev_out, flags):
        ev_out._obj.value = 0x7000
        return 0

    def cuEventRecord(self, ev, stream):
        if stream.value == 0xBAD:
            return 400  # CUDA_ERROR_INVALID_HANDLE
        self.drv.stream_ops.append(("record", stream.value, len(self.drv.launches)))
        return 0

    def cuEventQuery(self, ev):
        return 0 if self.drv.event_ready else 600  # CUDA_ERROR_NOT_READY

    def cuStreamWaitEvent(self, stream, ev, flags):
        self.drv.stream_ops.append(("wait", stream.value, len(self.drv.launches)))
        return 0


@pytest.fixture
def fake_pycuda(monkeypatch):
    return install_fake_pycuda(monkeypatch)


def install_fake_pycuda(monkeypatch) -> FakeDriver:
    """The fake `pycuda` (and libcuda) in place of the real ones, through `monkeypatch` (a pytest
    MonkeyPatch; scripts/host_time.py uses it outside pytest too)."""
    drv = FakeDriver()
    drv.compiled = []  # (source, nvcc options) of each SourceModule
    pkg = types.ModuleType("pycuda")
    compiler = types.ModuleType("pycuda.compiler")

    class SourceModule:
        def __init__(self, source, no_extern_c, arch, options):
            assert no_extern_c and arch == "sm_90" and "#define KERNEL extern \"C\" __global__" in source
            self.source = source
            drv.compiled.append((source, list(options)))

        def get_function(self, name):
            assert f"KERNEL void {name}(" in self.source
            return drv.Fn(name)

    compiler.SourceModule = SourceModule
    driver = types.ModuleType("pycuda.driver")
    for k in ("Context", "Device", "Stream", "Event", "init", "mem_alloc", "memcpy_htod", "memcpy_dtoh", "memcpy_dtod",
              "memcpy_dtod_async", "pagelocked_zeros", "host_alloc_flags"):
        setattr(driver, k, getattr(drv, k))
    driver.device_attribute = types.SimpleNamespace()  # no attributes: a compile names its device
    driver.function_attribute = types.SimpleNamespace(MAX_DYNAMIC_SHARED_SIZE_BYTES="MAX_DYNAMIC_SHARED_SIZE_BYTES")
    drv.loaded_cubins = []

    class Module:
        def get_function(self, name):
            return drv.Fn(name)

    def module_from_buffer(data):
        drv.current()
        drv.loaded_cubins.append(data)
        return Module()

    driver.module_from_buffer = module_from_buffer
    from dlcc.backends import cuda as cuda_backend

    monkeypatch.setattr(cuda_backend, "_libcuda", lambda: FakeLibcuda(drv))
    monkeypatch.setitem(sys.modules, "pycuda", pkg)
    monkeypatch.setitem(sys.modules, "pycuda.driver", driver)
    monkeypatch.setitem(sys.modules, "pycuda.compiler", compiler)
    tools = types.ModuleType("pycuda.tools")

    class PooledAllocation:
        """PyCUDA's pooled block: freed (explicitly or when dropped) back to its pool. The first
        block the pool holds makes it take the current context, and with none current PyCUDA
        throws from a destructor and aborts the process; here that is recorded as a violation."""

        def __init__(self, pool, ptr):
            self.pool, self.ptr, self.valid = pool, ptr, True

        def __int__(self):
            return self.ptr

        def free(self):
            if self.valid:
                self.valid = False
                if not self.pool.held and not (drv.stack() and isinstance(drv.stack()[-1], drv.Primary)):
                    drv.pool_violations.append(self.ptr)
                self.pool.held.append(self.ptr)

        def __del__(self):
            self.free()

    class DeviceMemoryPool:  # PyCUDA's pool, as far as dlcc uses it
        def __init__(self):
            self.held = []

        def allocate(self, n):
            drv.pooled += 1
            return PooledAllocation(self, self.held.pop() if self.held else drv.mem_alloc(n))

    tools.DeviceMemoryPool = DeviceMemoryPool
    drv.pooled, drv.pool_violations = 0, []
    monkeypatch.setitem(sys.modules, "pycuda.tools", tools)
    pkg.driver, pkg.compiler, pkg.tools = driver, compiler, tools
    return drv


def test_cuda_runtime_binds_the_plan(fake_pycuda):
    # Planned for an A100 (sm_80) but run on the fake H100: the sm_80 cubin does not fit, so the
    # runtime compiles the CUDA text for sm_90 through SourceModule.
    m = dlcc.compile(EXAMPLE, target="cuda", device="a100")
    assert m.target == "cuda"
    outs = m(m.sample_inputs())
    plan = m.plan
    assert list(outs) == [o["name"] for o in plan["outputs"]]
    drv = fake_pycuda
    assert len(drv.launches) == len(plan["launches"])
    ptr_of = {}  # storage -> base pointer, from the executor's allocations
    ex = m.executor()
    for name, base in ex.storages.items():
        ptr_of[name] = int(base)
    for (fname, args, block, grid), L in zip(drv.launches, plan["launches"]):
        assert fname == L["kernel"] and block == (L["block"], 1, 1) and grid == (L["grid"], 1)
        for a, spec in zip(args, L["args"]):
            if "int" in spec:
                assert isinstance(a, np.int32) and int(a) == spec["int"]
            else:
                assert isinstance(a, np.uintp) and int(a) == ptr_of[spec["storage"]] + spec["offset"]
    # Weights uploaded once, inputs per run.
    assert (ptr_of["weights"], plan["storages"]["weights"]) in drv.h2d


@pytest.mark.skipif(__import__("dlcc.backends.nvcc", fromlist=["find_nvcc"]).find_nvcc() is None,
                    reason="nvcc is not installed on this machine")
def test_the_runtimes_own_compile_prints_no_warnings(fake_pycuda, tmp_path):
    """What the runtime hands PyCUDA, built with the real nvcc and those options, prints no
    warning: on an H200 PyCUDA turned each "declared but never referenced" (the prelude's unused
    helpers, a tiling's unused index) into a UserWarning at every compile, 279 lines in one
    `dlcc compile --tune`."""
    import subprocess

    from dlcc.backends.nvcc import find_nvcc

    m = dlcc.compile(EXAMPLE, target="cuda", device="a100", precision="bf16")  # sm_80's plan: built at the start
    m(m.sample_inputs())
    (source, options), = fake_pycuda.compiled
    assert "--diag-suppress=177,550" in options
    src = tmp_path / "kernel.cu"
    src.write_text(source)
    p = subprocess.run([find_nvcc(), "--cubin", "-arch", "sm_90", *options, str(src), "-o", str(tmp_path / "k.cubin")],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and "warning" not in (p.stdout + p.stderr).lower(), p.stdout + p.stderr


@pytest.mark.skipif(__import__("dlcc.backends.nvcc", fromlist=["find_nvcc"]).find_nvcc() is None,
                    reason="nvcc is not installed on this machine")
def test_cuda_artifact_carries_cubin_and_resources(fake_pycuda, tmp_path):
    """Compiling for CUDA runs nvcc for the device's arch: the cubin and ptxas' figures go into the
    artifact, and the runtime loads that cubin instead of compiling at start-up."""
    out = tmp_path / "c.dlcc"
    m = dlcc.compile(EXAMPLE, out=out, target="cuda", device="h100")
    plan = m.plan
    assert plan["cuda"]["arch"] == "sm_90" and (out / "kernels.sm_90.cubin").stat().st_size > 0
    res = plan["cuda"]["resources"]
    assert set(res) == {k["name"] for k in plan["kernels"]}
    for k in plan["kernels"]:
        r = res[k["name"]]
        assert r["registers"] > 0 and r["spill_bytes"] == 0 and 1 <= r["blocks_per_sm"] <= 32
    loaded = dlcc.load(out, target="cuda")
    loaded(loaded.sample_inputs())
    assert fake_pycuda.loaded_cubins == [(out / "kernels.sm_90.cubin").read_bytes()]
    assert len(fake_pycuda.launches) == len(plan["launches"])


def test_the_runtime_works_in_the_primary_context_and_leaves_none_current(fake_pycuda, monkeypatch):
    """No context of dlcc's own (pycuda.autoinit made one and left it current, which broke
    torch.compile later in the process): the device's primary context, pushed around each
    inference and popped after, on whichever thread calls; DLCC_CUDA_DEVICE picks the device."""
    drv = fake_pycuda
    monkeypatch.setenv("DLCC_CUDA_DEVICE", "1")
    m = dlcc.compile(EXAMPLE, target="cuda", device="h100")
    feeds = m.sample_inputs()
    m(feeds)
    assert drv.retained == [1] and drv.created == 0 and "pycuda.autoinit" not in sys.modules
    assert drv.pushes == drv.pops and not drv.stack()  # balanced, nothing left current
    assert drv.syncs and set(drv.syncs) == {None}  # dlcc waits for its own (legacy) stream, not the context
    before = drv.pushes
    m(feeds)
    assert drv.pushes == before + 1  # one push for a whole inference, not one per launch
    errors = []

    def call():
        try:
            m(feeds)
            assert not drv.stack()
        except Exception as e:  # pragma: no cover (reported below)
            errors.append(e)

    t = threading.Thread(target=call)
    t.start()
    t.join()
    assert not errors and drv.pushes == drv.pops


def test_a_device_index_past_the_last_gpu_is_one_clear_error(fake_pycuda, monkeypatch):
    from dlcc.errors import RuntimeBackendError

    monkeypatch.setenv("DLCC_CUDA_DEVICE", "5")
    m = dlcc.compile(EXAMPLE, target="cuda", device="h100")
    with pytest.raises(RuntimeBackendError, match="CUDA device 5 does not exist: this machine has 2"):
        m(m.sample_inputs())


def test_device_arrays_in_and_out_without_a_host_copy(fake_pycuda, monkeypatch):
    """A CUDA device input (__cuda_array_interface__ or DLPack) is copied device to device into
    the plan's input buffer, with no host copy of it; outputs="device" come back as DeviceArrays,
    each a new allocation filled device to device from the output buffer (the next inference
    cannot overwrite them). Wrong device, dtype, strides or shape: one clear error each."""
    from dlcc import interop
    from dlcc.backends.cuda import CudaRuntime
    from dlcc.executor import InputError

    drv = fake_pycuda
    monkeypatch.setattr(CudaRuntime, "pointer_device", lambda self, ptr: 0 if ptr >= 0x7f0000000000 else None)
    m = dlcc.compile(EXAMPLE, target="cuda", device="h100")
    sig = m.inputs[0]
    name, shape, nbytes = sig["name"], tuple(sig["shape"]), int(np.prod(sig["shape"])) * 4
    ex = m.executor()
    in_buf = int(ex.storages["input:0"])
    cai = {"shape": shape, "typestr": "<f4", "data": (0x7f0000001000, False), "version": 3, "strides": None}
    x = types.SimpleNamespace(__cuda_array_interface__=cai)
    h2d_before = len(drv.h2d)
    outs = m.run({name: x}, outputs="device")
    assert (in_buf, 0x7f0000001000, nbytes) in drv.d2d and len(drv.h2d) == h2d_before  # no host copy in
    assert drv.pooled == len(outs)  # device outputs come from the memory pool
    for k, (oname, arr) in enumerate(outs.items()):
        t = m.outputs[k]
        assert isinstance(arr, interop.DeviceArray) and arr.shape == tuple(t["shape"])
        assert arr.ptr != int(ex.storages[f"output:{k}"])  # its own allocation
        assert (arr.ptr, int(ex.storages[f"output:{k}"]), int(np.prod(t["shape"])) * 4) in drv.d2d
        assert arr.__cuda_array_interface__["data"] == (arr.ptr, False)
    # through DLPack (JAX's way): read in place, the producer's deleter run after the copy
    live = len(interop._LIVE)

    class Jax:
        def __dlpack_device__(self):
            return (interop.KDL_CUDA, 0)

        def __dlpack__(self, stream=None, **kw):
            return interop.dlpack_capsule(0x7f0000002000, shape, "float32", (interop.KDL_CUDA, 0), self)

    m.run({name: Jax()})
    assert (in_buf, 0x7f0000002000, nbytes) in drv.d2d and len(interop._LIVE) == live
    bad = {"another GPU": ({"data": (0x7f0000003000, False)}, "on CUDA device 1"),
           "a host pointer": ({"data": (4096, False)}, "not device memory"),
           "a transpose": ({"strides": tuple(reversed([4 * int(np.prod(shape[i + 1:])) for i in range(len(shape))]))},
                           "non-contiguous device array"),
           "float16": ({"typestr": "<f2"}, "dtype float16, the model's is float32"),
           "a shape": ({"shape": shape[:-1] + (shape[-1] + 1,)}, "has shape")}
    monkeypatch.setattr(CudaRuntime, "pointer_device",
                        lambda self, ptr: None if ptr < 0x7f0000000000 else (1 if ptr == 0x7f0000003000 else 0))
    for what, (change, msg) in bad.items():
        y = types.SimpleNamespace(__cuda_array_interface__={**cai, **change})
        with pytest.raises((interop.InteropError, InputError), match=msg):
            m({name: y})
    # out=: the caller's device array receives the output, device to device, and comes back as given
    t0 = m.outputs[0]
    dest = types.SimpleNamespace(__cuda_array_interface__={"shape": tuple(t0["shape"]), "typestr": "<f4",
                                                          "data": (0x7f0000009000, False), "version": 3})
    got = m.run({name: x}, out={t0["name"]: dest})
    assert got[t0["name"]] is dest
    assert (0x7f0000009000, int(ex.storages["output:0"]), int(np.prod(t0["shape"])) * 4) == drv.d2d[-1]
    ro = types.SimpleNamespace(__cuda_array_interface__={**dest.__cuda_array_interface__, "data": (0x7f0000009000, True)})
    with pytest.raises(interop.InteropError, match="read-only device array"):
        m.run({name: x}, out={t0["name"]: ro})


def test_device_outputs_dropped_anywhere_go_back_to_the_pool_in_the_context(fake_pycuda):
    """A device output's block goes back to PyCUDA's pool with the primary context current,
    wherever its last reference goes: on the caller's thread between calls, or on another thread
    (a DLPack deleter that torch runs). On an H200, a torch tensor made from an output going out of
    scope aborted the process (PyCUDA's pool threw from a destructor: no current context)."""
    import gc

    drv = fake_pycuda
    m = dlcc.compile(EXAMPLE, target="cuda", device="h100")
    feeds = m.sample_inputs()
    outs = m.run(feeds, outputs="device")
    assert not drv.stack()  # nothing current between calls
    del outs
    gc.collect()
    held = [m.run(feeds, outputs="device")]
    allocs = len(drv.allocs)
    t = threading.Thread(target=held.clear)  # the last reference goes on a thread with no context
    t.start()
    t.join()
    gc.collect()
    assert drv.pool_violations == []
    m.run(feeds, outputs="device")
    assert len(drv.allocs) == allocs  # the blocks came back, and the next outputs reuse them


def test_an_inference_is_one_cuda_graph_launch(fake_pycuda):
    """The plan's launches are captured once, at the first inference, into a CUDA graph (no
    kernel runs during the capture), and every inference after that is one graph launch
    replaying them all in plan order; `graphs: false` launches kernel by kernel."""
    drv = fake_pycuda
    m = dlcc.compile(EXAMPLE, target="cuda", device="h100")
    feeds = m.sample_inputs()
    n = len(m.plan["launches"])
    assert m.plan["meta"]["graphs"] is True
    m(feeds)
    m(feeds)
    assert drv.graph_launches == 2 and len(drv.captured) == n and len(drv.launches) == 2 * n
    assert [x[0] for x in drv.launches[:n]] == [L["kernel"] for L in m.plan["launches"]]
    ex = m.executor()
    assert ex.graph is not None and ex.graph_error is None
    from dlcc.config import load_pipeline

    plain = load_pipeline("baseline").model_copy(update={"graphs": False})
    m2 = dlcc.compile(EXAMPLE, target="cuda", device="h100", pipeline=plain)
    before = (drv.graph_launches, len(drv.launches))
    m2(feeds)
    assert drv.graph_launches == before[0] and len(drv.launches) == before[1] + n


def test_a_refused_capture_falls_back_to_kernel_launches(fake_pycuda, monkeypatch):
    drv = fake_pycuda
    monkeypatch.setattr(FakeLibcuda, "cuGraphInstantiateWithFlags", lambda self, e, g, f: 801)  # not supported
    m = dlcc.compile(EXAMPLE, target="cuda", device="h100")
    with pytest.warns(RuntimeWarning, match="no CUDA graph for this model.*CUresult 801"):
        m(m.sample_inputs())
    assert drv.graph_launches == 0 and len(drv.launches) == len(m.plan["launches"]) and not drv.stack()


def test_the_callers_stream_is_joined_before_and_after(fake_pycuda):
    """m.run(feeds, stream=s): dlcc's work waits for what is queued on s (an event recorded there,
    waited for on dlcc's stream) and s waits for dlcc's (the reverse), around the inference; a
    stream the driver cannot join, or an object that is no stream, is one clear error."""
    from dlcc.errors import DlccError, RuntimeBackendError

    drv = fake_pycuda
    m = dlcc.compile(EXAMPLE, target="cuda", device="h100")
    feeds = m.sample_inputs()
    m.run(feeds, stream=types.SimpleNamespace(cuda_stream=0x1234))  # a torch stream
    n = len(m.plan["launches"])
    assert drv.stream_ops == [("record", 0x1234, 0), ("wait", None, 0), ("record", None, n), ("wait", 0x1234, n)]
    drv.stream_ops.clear()
    m.run(feeds, stream=0)  # the legacy default stream is dlcc's own: nothing to join
    assert drv.stream_ops == []
    with pytest.raises(RuntimeBackendError, match="cannot be joined"):
        m.run(feeds, stream=0xBAD)
    with pytest.raises(DlccError, match="pass a PyCUDA, torch or CuPy stream"):
        m.run(feeds, stream="default")


def _device_ids(ptr: int, shape=(2, 3)):
    """A CUDA int64 array by its __cuda_array_interface__ (what a torch or CuPy tensor exports)."""
    return types.SimpleNamespace(__cuda_array_interface__={"shape": shape, "typestr": "<i8", "data": (ptr, False),
                                                           "version": 3, "strides": None})


def test_device_outputs_return_before_the_device_finishes(fake_pycuda, monkeypatch):
    """A call whose outputs stay on the device is queued and returns, as a torch op does: no
    synchronize and no device-to-host copy in it, an event recorded after its work instead;
    synchronize() waits for it. A call with host outputs still waits (it must read them)."""
    from dlcc.backends.cuda import CudaRuntime

    drv = fake_pycuda
    monkeypatch.setattr(CudaRuntime, "pointer_device", lambda self, ptr: 0)
    m = dlcc.compile(EXAMPLE, target="cuda", device="h100")
    sig = m.inputs[0]
    x = types.SimpleNamespace(__cuda_array_interface__={"shape": tuple(sig["shape"]), "typestr": "<f4",
                                                        "data": (0x7f0000001000, False), "version": 3})
    m.run({sig["name"]: x}, outputs="device")  # the first call captures the graph
    syncs, dtoh, h2d, graphs = len(drv.syncs), len(drv.dtoh), len(drv.h2d), drv.graph_launches
    drv.stream_ops.clear()
    outs = m.run({sig["name"]: x}, outputs="device")
    assert len(drv.syncs) == syncs and len(drv.dtoh) == dtoh and len(drv.h2d) == h2d  # nothing waited for or copied
    assert drv.graph_launches == graphs + 1 and drv.stream_ops == [("record", None, len(drv.launches))]
    assert all(a.__cuda_array_interface__["stream"] == 1 for a in outs.values())  # written on the legacy stream
    m.synchronize()
    assert len(drv.syncs) == syncs + 1
    m.run(m.sample_inputs())  # host outputs: waited for
    assert len(drv.syncs) > syncs + 1
    # a CAI v3 producer stream is joined with events (no host wait), before and after the inference
    drv.stream_ops.clear()
    y = types.SimpleNamespace(__cuda_array_interface__={**x.__cuda_array_interface__, "stream": 0x4321})
    syncs = len(drv.syncs)
    m.run({sig["name"]: y}, outputs="device")
    assert len(drv.syncs) == syncs
    assert [op[:2] for op in drv.stream_ops] == [("record", 0x4321), ("wait", None), ("record", None),
                                                 ("record", None), ("wait", 0x4321)]


def test_device_token_ids_are_checked_on_the_device_without_a_copy(fake_pycuda, monkeypatch, tmp_path):
    """Token ids as a CUDA tensor: the input's check kernel runs on the input buffer, before the
    plan's graph, writing its report into mapped host memory, so the inference has no
    device-to-host copy at all. A report (what the kernel writes for an id past the table) is
    raised by the same call when it waits (host outputs), else by the next call once the device
    finished, or by synchronize(); then it is cleared, and the claim word zeroed on the device."""
    from dlcc.backends.cuda import CudaRuntime
    from dlcc.executor import DeviceIndexError

    from test_hostile_input import _gather_model

    drv = fake_pycuda
    monkeypatch.setattr(CudaRuntime, "pointer_device", lambda self, ptr: 0)
    m = dlcc.compile(_gather_model(tmp_path / "g.onnx"), target="cuda", device="h100")
    check = m.plan["meta"]["index_checks"][0]
    ex = m.executor()
    report_ptr = int(ex.storages["report"])
    report = drv.mapped[report_ptr].view(np.int32)
    ids = _device_ids(0x7f0000001000)
    m.run({"ids": ids}, outputs="device")
    L = [x for x in drv.launches if x[0] == check["kernel"]]
    assert len(L) == 1 and L[0][3] == (1, 1) and L[0][2] == (256, 1, 1)
    args = [int(a) for a in L[0][1]]
    assert args == [int(ex.storages["input:0"]), int(ex.storages["errors"]), report_ptr, -1]
    first_graph = next(i for i, x in enumerate(drv.launches) if x[0] != check["kernel"])
    assert drv.launches.index(L[0]) < first_graph  # before the plan's launches
    assert not drv.dtoh
    m.run({"ids": np.zeros((2, 3), np.int64)}, outputs="device")  # host ids: no check kernel
    assert len([x for x in drv.launches if x[0] == check["kernel"]]) == 1

    def fire(name, args):  # the kernel finding id 10**9 at flat position 4
        if name == check["kernel"]:
            report[:4] = [-1, 10**9, 0, 4]

    drv.on_launch = fire
    with pytest.raises(DeviceIndexError, match=r"^input 'ids': index 1000000000 at \[1, 1\] is outside \[-10, 10\) "
                                               r"for Gather node 'g' \(a device array"):
        m({"ids": ids})  # host outputs: this call waited, and raises
    assert not report.any() and (int(ex.storages["errors"]), 4) in drv.h2d  # report and claim word cleared
    m.run({"ids": ids}, outputs="device")  # returns before the device finished: nothing raised yet
    drv.on_launch, drv.event_ready = None, False
    m.run({"ids": ids}, outputs="device")  # the device has not finished: the report is not read yet
    drv.event_ready = True
    with pytest.raises(DeviceIndexError, match=r"one of the last 2 inferences that returned before the device "
                                               r"finished them .* input 'ids': index 1000000000 at \[1, 1\]"):
        m.run({"ids": ids}, outputs="device")
    m.run({"ids": ids}, outputs="device")  # cleared: the next calls run
    report[:4] = [-1, 11, 0, 0]
    with pytest.raises(DeviceIndexError, match=r"index 11 at \[0, 0\]"):
        m.synchronize()
    m.synchronize()  # nothing left to report
    assert not drv.dtoh and not drv.stack()


def _jax_array_class(sig):
    """A producer that hands its CUDA memory over through DLPack only (as JAX does), shaped as `sig`."""
    from dlcc import interop

    class Jax:
        def __dlpack_device__(self):
            return (interop.KDL_CUDA, 0)

        def __dlpack__(self, stream=None, **kw):
            return interop.dlpack_capsule(0x7f0000002000, tuple(sig["shape"]), "float32", (interop.KDL_CUDA, 0), self)

    return Jax


def test_a_refused_stream_still_releases_a_dlpack_input(fake_pycuda, monkeypatch):
    """A DLPack input read in place is handed back (its deleter run) however the call ends: here a
    stream the driver cannot join, refused after the inputs were read."""
    from dlcc import interop
    from dlcc.backends.cuda import CudaRuntime
    from dlcc.errors import RuntimeBackendError

    monkeypatch.setattr(CudaRuntime, "pointer_device", lambda self, ptr: 0)
    m = dlcc.compile(EXAMPLE, target="cuda", device="h100")
    sig = m.inputs[0]

    Jax = _jax_array_class(sig)

    live = len(interop._LIVE)
    with pytest.raises(RuntimeBackendError, match="cannot be joined"):
        m.run({sig["name"]: Jax()}, stream=0xBAD)
    assert len(interop._LIVE) == live
    m.run({sig["name"]: Jax()}, outputs="device")  # queued: released once the inference is known done
    m.synchronize()
    assert len(interop._LIVE) == live


def test_a_model_dropped_with_queued_inferences_releases_their_dlpack_inputs(fake_pycuda, monkeypatch):
    """DLPack inputs of inferences that returned before the device finished them go back to their
    producers when the model is dropped, after the device finished (no synchronize() needed)."""
    import gc

    from dlcc import interop
    from dlcc.backends.cuda import CudaRuntime

    monkeypatch.setattr(CudaRuntime, "pointer_device", lambda self, ptr: 0)
    m = dlcc.compile(EXAMPLE, target="cuda", device="h100")
    sig = m.inputs[0]

    Jax = _jax_array_class(sig)

    live = len(interop._LIVE)
    fake_pycuda.event_ready = False  # the device is still busy with them
    m.run({sig["name"]: Jax()}, outputs="device")
    m.run({sig["name"]: Jax()}, outputs="device")
    assert len(interop._LIVE) == live + 2  # queued, not known finished: still held
    syncs = len(fake_pycuda.syncs)
    del m
    gc.collect()
    assert len(interop._LIVE) == live and len(fake_pycuda.syncs) == syncs + 1  # waited for, then released


def test_a_kernel_is_timed_inside_a_cuda_graph(fake_pycuda):
    """time_graph (what scripts/gemm_tilings.py and --tune time a tiling with on CUDA) captures
    `count` launches in one graph, replays it once to warm up and `repeat` times timed, gives the
    time per launch, and frees the graph; cuBLAS is timed the same way there."""
    from dlcc.backends.cuda import CudaRuntime

    drv = fake_pycuda
    rt = CudaRuntime()
    fn = drv.Fn("k")
    before = len(drv.launches)
    us = rt.time_graph(fn, 4, 256, [np.uintp(4096), 7], count=20, repeat=3)
    assert us == pytest.approx(1.0)  # the fake's 1 µs a kernel
    assert len(drv.launches) == before + 20 * 4 and drv.graph_launches == 4
    assert all(L[1] == (np.uintp(4096), np.int32(7)) and L[3] == (4, 1) for L in drv.launches[before:])
    assert not drv.graphs  # the graph and its instantiation are gone
    assert not drv.stack()  # and no context is left current


def test_a_torch_like_input_is_read_once_and_its_device_asked_of_it(fake_pycuda, monkeypatch):
    """An input with `__cuda_array_interface__` and `__dlpack_device__` (torch, CuPy) has its CAI
    read once per call (torch builds the dict on every read) and its CUDA ordinal taken from
    `__dlpack_device__`, not from a driver call about the pointer: the host's time per inference
    has a floor (issue 21). Another ordinal there is still refused."""
    from dlcc import interop
    from dlcc.backends.cuda import CudaRuntime

    def no_driver(self, ptr):
        raise AssertionError("the pointer's device was asked of the driver")

    monkeypatch.setattr(CudaRuntime, "pointer_device", no_driver)
    m = dlcc.compile(EXAMPLE, target="cuda", device="h100")
    sig = m.inputs[0]
    reads = []

    class TorchLike:
        def __init__(self, ordinal):
            self.ordinal = ordinal

        @property
        def __cuda_array_interface__(self):
            reads.append(1)
            return {"shape": tuple(sig["shape"]), "typestr": "<f4", "data": (0x7f0000001000, False), "version": 3}

        def __dlpack_device__(self):
            return (interop.KDL_CUDA, self.ordinal)

    m.run({sig["name"]: TorchLike(0)}, outputs="device")
    assert len(reads) == 1
    with pytest.raises(interop.InteropError, match="on CUDA device 1"):
        m.run({sig["name"]: TorchLike(1)}, outputs="device")


def test_a_bound_call_is_one_graph_launch_with_its_copies(fake_pycuda, monkeypatch):
    """model.bind (dlcc/bound.py) on device arrays: the copy of the bound input into the plan's
    input buffer, the plan's launches and the copy into the bound device output are captured
    once as one graph; each call is one graph launch, with no host copy, no wait, and the same
    output object; a given stream is joined before and after; close() waits, hands the DLPack
    input back and destroys the graph. Without graphs the same copies run call by call."""
    from dlcc import interop
    from dlcc.backends.cuda import CudaRuntime
    from dlcc.errors import DlccError

    drv = fake_pycuda
    monkeypatch.setattr(CudaRuntime, "pointer_device", lambda self, ptr: 0)
    for graphs in (True, False):
        m = dlcc.compile(EXAMPLE, target="cuda", device="h100")
        m.plan["meta"]["graphs"] = graphs
        sig, osig = m.inputs[0], m.outputs[0]
        nin = int(np.prod(sig["shape"])) * 4
        nout = int(np.prod(osig["shape"])) * np.dtype(osig["dtype"]).itemsize
        live = len(interop._LIVE)
        call = m.bind({sig["name"]: _jax_array_class(sig)()}, outputs="device")
        assert len(interop._LIVE) == live + 1  # held while bound
        ex = m.executor()
        inbuf, outbuf = int(ex.storages["input:0"]), int(ex.storages["output:0"])
        n = len(m.plan["launches"])
        for _ in range(2):
            before = (drv.graph_launches, len(drv.launches), len(drv.syncs), len(drv.h2d), len(drv.dtoh))
            drv.d2d.clear()
            drv.stream_ops.clear()
            outs = call(stream=types.SimpleNamespace(cuda_stream=0x1234))
            dev = outs[osig["name"]]
            assert isinstance(dev, interop.DeviceArray)
            assert drv.graph_launches == before[0] + graphs
            assert [x[0] for x in drv.launches[before[1]:]] == [L["kernel"] for L in m.plan["launches"]]
            assert drv.d2d == [(inbuf, 0x7f0000002000, nin), (dev.ptr, outbuf, nout)]
            assert (len(drv.syncs), len(drv.h2d), len(drv.dtoh)) == before[2:]  # nothing waited for or copied
            assert [op[:2] for op in drv.stream_ops] == [("record", 0x1234), ("wait", None), ("record", None),
                                                         ("record", None), ("wait", 0x1234)]
            assert call()[osig["name"]] is dev
        if graphs:
            assert len(drv.graphs[call._graph.exec]) == n + 2
        exe = call._graph.exec if graphs else None
        call.close()
        assert len(interop._LIVE) == live and not drv.stack()
        assert exe is None or exe not in drv.graphs
        with pytest.raises(DlccError, match="closed"):
            call()


def test_deep_gemm_tilings_launch_with_dynamic_shared_memory(fake_pycuda, monkeypatch, tmp_path):
    """A bf16 plan for a device spec that picks the DEEP tilings (kernels/gemm_mma.py: 4-8 stages
    in more than 48 KiB of shared memory): their kernels record their dynamic shared memory in the
    plan, the runtime opts each in once (the fake driver refuses a launch over 48 KiB without it),
    and every launch of them, captured in the graph or kernel by kernel, carries the size. A GPU
    that holds less is one clear error naming both figures."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from dlcc.config import load_device
    from dlcc.errors import DlccError

    drv = fake_pycuda
    h100 = load_device("h100").model_copy(update={"gemm_deep_pipelines": True})
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((768, 3072)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                          "ffn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [128, 768])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [128, 3072])], [w])
    path = tmp_path / "ffn.onnx"  # BERT's FFN up: a DEEP tiling is the model's pick there
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    m = dlcc.compile(path, target="cuda", device=h100, precision="bf16")
    deep = {k["name"]: k["dynamic_smem_bytes"] for k in m.plan["kernels"] if k.get("dynamic_smem_bytes")}
    assert deep and all(n > 48 * 1024 for n in deep.values())
    drv.device_attrs["MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"] = 232448
    monkeypatch.setattr(sys.modules["pycuda.driver"].device_attribute, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN",
                        "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", raising=False)
    feeds = m.sample_inputs()
    m(feeds)
    m(feeds)  # the graph's replay: the sizes were captured
    launched = [L["kernel"] for L in m.plan["launches"] if L["kernel"] in deep]
    assert sorted(drv.shared_launches) == sorted((k, deep[k]) for k in launched)
    m2 = dlcc.compile(path, target="cuda", device=h100, precision="bf16")
    m2.plan["meta"]["graphs"] = False
    drv.shared_launches.clear()
    m2(feeds)
    assert sorted(drv.shared_launches) == sorted((k, deep[k]) for k in launched)
    drv.device_attrs["MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"] = 60 * 1024  # less than the pick takes
    with pytest.raises(DlccError, match=r"needs \d+ B of shared memory a block, and this GPU allows 61440"):
        dlcc.compile(path, target="cuda", device=h100, precision="bf16")(feeds)
