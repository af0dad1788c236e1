"""CUDA runtime (PyCUDA), deliberately thin: allocate, copy, get function, launch, time with events.

Everything else (plans, views, argument binding, validation) is shared with OpenCL in
dlcc.executor and tested there, because no machine of this project's CI has a GPU.

The context: dlcc works in the device's *primary* context, the one the CUDA runtime API (and so
PyTorch, CuPy, JAX, Triton) uses, retained from the driver and made current only around dlcc's
own work (`active()`), then popped. `pycuda.autoinit`, which dlcc used before, creates a second
context and leaves it current: a program that had used torch on the GPU, then ran a dlcc model,
then called torch.compile got "invalid resource handle". Being current only while it works also
lets any thread call a model: the context is pushed on the calling thread.
"""
from __future__ import annotations

import contextlib
import functools
import statistics
import threading

import numpy as np

from ..bound import Copy
from ..errors import CompileError, DlccError, RuntimeBackendError


def available() -> bool:
    try:
        import pycuda.driver as drv

        drv.init()
        return drv.Device.count() > 0
    except Exception:
        return False


@functools.lru_cache(maxsize=None)
def _libcuda():
    """The CUDA driver library, for the few calls PyCUDA does not wrap (graphs, events, pointer
    attributes, a foreign stream): loaded once, since several of these run on every inference and
    the host's time per inference is a floor of its own (issue 21: 30 µs)."""
    import ctypes
    import sys

    return ctypes.CDLL("nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1")


class CudaGraph:
    """An instantiated CUDA graph of one inference's launches (CUgraphExec handle), and the
    capture stream, kept alive with it."""

    def __init__(self, exec_handle: int, stream):
        self.exec, self._stream = exec_handle, stream


class MappedBuffer:
    """Mapped page-locked host memory (CudaRuntime.alloc_mapped): `int()` is its device address,
    what kernels are given; `host` the same bytes as a numpy array."""

    def __init__(self, host: np.ndarray, device_ptr: int):
        self.host, self.ptr = host, device_ptr

    def __int__(self) -> int:
        return self.ptr

    def __index__(self) -> int:
        return self.ptr


def _check(err: int, what: str) -> None:
    if err != 0:
        raise RuntimeBackendError(f"{what} failed (CUresult {err})")


def _prepare(kernel, args: list) -> None:
    """PyCUDA's prepared call: the argument layout packed once per kernel (pointers 'P', ints
    'i'), which takes a few µs off every launch against its generic call."""
    sig = "".join("i" if isinstance(a, (int, np.int32)) else "P" for a in args)
    if getattr(kernel, "_dlcc_sig", None) != sig:
        kernel.prepare(sig)
        kernel._dlcc_sig = sig


def _shared(kernel) -> dict:
    """The launch's dynamic shared memory (set_dynamic_smem), as PyCUDA's keyword; none for the
    kernels whose shared arrays are static (all but the DEEP GEMM tilings)."""
    n = getattr(kernel, "_dlcc_shared", 0)
    return {"shared_size": n} if n else {}


def _in_context(method):
    """Run `method` with the runtime's primary context current (CudaRuntime.active)."""
    import functools

    @functools.wraps(method)
    def wrapper(self, *args, **kw):
        if getattr(self._tls, "depth", 0):  # already current (the executor holds it for an inference)
            return method(self, *args, **kw)
        with self.active():
            return method(self, *args, **kw)

    return wrapper


class CudaRuntime:
    name = "cuda"
    dialect = "cuda"

    def __init__(self, index: int | None = None):
        from ..devices import CUDA_DEVICE_ENV, cuda_device_index

        try:
            import pycuda.driver as drv
        except ImportError:
            raise RuntimeBackendError("the CUDA target needs pycuda and an NVIDIA driver: pip install 'dlcc[cuda]'") from None
        index = cuda_device_index() if index is None else index
        try:
            drv.init()
            count = drv.Device.count()
            if index >= count:
                raise RuntimeBackendError(f"CUDA device {index} does not exist: this machine has {count} "
                                          f"({CUDA_DEVICE_ENV} or --device-index picks one)")
            self.dev = drv.Device(index)
            self.ctx = self.dev.retain_primary_context()
        except RuntimeBackendError:
            raise
        except Exception as e:
            raise RuntimeBackendError(f"no usable CUDA device: {e}") from None
        self.drv = drv
        self.index = index
        self.module = None
        self._fns = {}
        self._tls = threading.local()  # per thread: how deep inside active() it is

    @contextlib.contextmanager
    def active(self):
        """The device's primary context, current on this thread for the duration (pushed on entry
        and popped on exit, unless an enclosing active() already did): what every call below runs
        in. The executor holds it around a whole inference, so a launch pays no push of its own."""
        depth = getattr(self._tls, "depth", 0)
        if depth == 0:
            self.ctx.push()
        self._tls.depth = depth + 1
        try:
            yield self
        finally:
            self._tls.depth -= 1
            if self._tls.depth == 0:
                self.drv.Context.pop()

    @property
    def device_name(self) -> str:
        return self.dev.name()

    def compute_capability(self) -> tuple[int, int]:
        return self.dev.compute_capability()

    def is_cpu(self) -> bool:
        return False

    @_in_context
    def compile(self, source: str, plan: dict | None = None, binaries: dict | None = None) -> None:
        """Load the artifact's cubin when it was built for this GPU's arch; otherwise compile now."""
        from pycuda.compiler import SourceModule

        self._fns = {}  # functions of a previous module must not be reused
        major, minor = self.compute_capability()
        cuda = (plan or {}).get("cuda", {})
        cubin = (binaries or {}).get(cuda.get("cubin", ""))
        if cubin and cuda.get("arch") == f"sm_{major}{minor}":
            self.module = self.drv.module_from_buffer(cubin)
            return
        from ..kernels.gemm_wgmma import uses_wgmma
        from .nvcc import arch_for, runtime_flags

        if uses_wgmma(source) and (major, minor) != (9, 0):
            raise CompileError(f"this plan's GEMMs use Hopper's warpgroup MMA (wgmma: sm_90 only), planned for an "
                               f"sm_90 device spec, and this GPU is sm_{major}{minor}: compile it for this GPU "
                               "(leave --device out to plan for the GPU present)")
        try:
            self.module = SourceModule(source, no_extern_c=True, arch=arch_for(source, f"sm_{major}{minor}"),
                                       options=runtime_flags())
        except Exception as e:
            raise CompileError(f"nvcc rejected the generated kernels (a dlcc bug):\n{e}") from None

    @_in_context
    def kernel(self, name: str):
        if name not in self._fns:
            try:
                self._fns[name] = self.module.get_function(name)
            except self.drv.LogicError:
                raise DlccError(f"kernel {name} is not in the kernel source (a damaged artifact, or one edited by "
                                "hand); compile the model again") from None
        return self._fns[name]

    @_in_context
    def alloc(self, nbytes: int):
        return self.drv.mem_alloc(max(int(nbytes), 4))

    def view(self, buf, offset: int, nbytes: int):
        return np.uintp(int(buf) + offset)

    @_in_context
    def write(self, buf, offset: int, data) -> None:
        arr = np.frombuffer(data, np.uint8) if isinstance(data, (bytes, bytearray)) else np.ascontiguousarray(data)
        if arr.nbytes:
            self.drv.memcpy_htod(int(buf) + offset, arr)

    @_in_context
    def read(self, buf, offset: int, out: np.ndarray) -> None:
        if out.nbytes:
            self.drv.memcpy_dtoh(out, int(buf) + offset)

    # -- device arrays (dlcc/interop.py) ---------------------------------------------------------
    @_in_context
    def copy_in(self, buf, ref) -> None:
        """A device input (interop.ArrayRef) into `buf`, device to device, on dlcc's stream (which
        the executor has joined with the stream a __cuda_array_interface__ names, if any)."""
        if ref.nbytes:
            self.drv.memcpy_dtod(int(buf), ref.ptr, ref.nbytes)

    @_in_context
    def alloc_output(self, nbytes: int):
        """Memory for one device output (interop.DeviceArray), from a pool: PyCUDA's
        DeviceMemoryPool hands back blocks that earlier outputs released, so a steady stream of
        inferences pays no cuMemAlloc (tens of µs) per output, and a block is reused only after
        everything holding the output (a DeviceArray, a torch tensor made from it) let go."""
        if getattr(self, "_pool", None) is None:
            try:
                from pycuda.tools import DeviceMemoryPool

                self._pool = DeviceMemoryPool()
            except ImportError:  # a PyCUDA without pycuda.tools: plain allocations
                self._pool = False
        return self._pool.allocate(max(int(nbytes), 4)) if self._pool else self.alloc(nbytes)

    @_in_context
    def free_output(self, alloc) -> None:
        """Give a device output's block back to the pool, with the context current. PyCUDA's
        pool takes the current context when it starts holding freed blocks, and throws a C++
        exception if none is; dropped outside dlcc's context (a torch tensor made from the output
        going out of scope), that exception ran through a destructor and aborted the process."""
        alloc.free()

    @_in_context
    def alloc_mapped(self, nbytes: int) -> "MappedBuffer":
        """Page-locked host memory mapped into the device's address space: kernels write it, and
        the host reads it once they finished, with no copy in between (the index checks' report,
        so that an inference on device arrays shows no device-to-host copy)."""
        host = self.drv.pagelocked_zeros((max(int(nbytes), 4),), np.uint8,
                                         mem_flags=self.drv.host_alloc_flags.DEVICEMAP)
        return MappedBuffer(host, int(host.base.get_device_pointer()))

    def copy_out(self, ref, src, nbytes: int) -> None:
        """An output buffer into a caller's device array (`out=`), device to device."""
        self.copy_device(ref.ptr, src, nbytes)

    @_in_context
    def copy_device(self, dst, src, nbytes: int) -> None:
        if nbytes:
            self.drv.memcpy_dtod(int(dst), int(src), nbytes)

    @_in_context
    def read_ref(self, ref, out: np.ndarray) -> None:
        """A device input's bytes on the host (to check the token ids of an embedding)."""
        self._after_producer(ref)
        if out.nbytes:
            self.drv.memcpy_dtoh(out, ref.ptr)

    def _after_producer(self, ref) -> None:
        """Wait for the stream a __cuda_array_interface__ says its producer wrote on, unless it is
        one of the default streams (1: legacy, 2: per-thread) that dlcc's copies already follow."""
        if ref.stream not in (None, 1, 2):
            self.sync_stream(int(ref.stream))

    def pointer_device(self, ptr: int) -> int | None:
        """The CUDA ordinal of the device memory at `ptr`, or None when it is not device memory
        (cuPointerGetAttribute: CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)."""
        import ctypes

        ordinal = ctypes.c_int(-1)
        err = _libcuda().cuPointerGetAttribute(ctypes.byref(ordinal), 9, ctypes.c_uint64(ptr))
        return ordinal.value if err == 0 else None

    def sync_stream(self, handle: int) -> None:
        """Wait for a foreign stream (a raw CUstream handle) to drain."""
        import ctypes

        err = _libcuda().cuStreamSynchronize(ctypes.c_void_p(handle))
        if err != 0:
            raise RuntimeBackendError(f"cuStreamSynchronize on the input's stream {handle:#x} failed (CUresult "
                                      f"{err}): a stream of another context or process?")

    @_in_context
    def set_dynamic_smem(self, kernel, nbytes: int) -> None:
        """Launch `kernel` with `nbytes` of dynamic shared memory from now on (a DEEP GEMM tiling's
        stages, kernels/gemm_mma.py): more than 48 KiB needs the kernel's opt-in first
        (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES), or the launch fails."""
        nbytes = int(nbytes)
        if nbytes > 48 * 1024:
            limit = self.dev.get_attribute(self.drv.device_attribute.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            if nbytes > limit:
                raise DlccError(f"kernel needs {nbytes} B of shared memory a block, and this GPU allows {limit} "
                                "(compile for this device: --device auto, or a spec with its shared_mem_per_block)")
            kernel.set_attribute(self.drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes)
        kernel._dlcc_shared = nbytes

    @_in_context
    def launch(self, kernel, grid: int, block: int, args: list) -> None:
        """A prepared call (_prepare); for the small models the host's launch loop, not the GPU,
        sets the time of an inference."""
        _prepare(kernel, args)
        kernel.prepared_call((grid, 1), (block, 1, 1), *[int(a) for a in args], **_shared(kernel))

    # -- CUDA graphs (ctypes on the driver: no PyCUDA release wraps the graph API) ----------------
    @_in_context
    def capture(self, calls: list) -> "CudaGraph":
        """The launch sequence `calls` ((kernel, grid, block, args), as the executor holds them, or
        a bound call's device-to-device `Copy` steps) captured once into an instantiated CUDA
        graph, which launch_graph replays: one host call per inference instead of one per kernel. Captured on a private non-blocking stream in
        thread-local mode, so that no other thread's work (PyTorch's on the legacy stream) is
        caught in it or refused by it. The kernels' pointers are fixed: the executor's buffers,
        the weights and the arena never move while it lives, and a reloaded artifact builds a new
        executor, and with it a new graph."""
        import ctypes

        cu = _libcuda()
        stream = self.drv.Stream(flags=1)  # CU_STREAM_NON_BLOCKING
        h = ctypes.c_void_p(stream.handle)
        _check(cu.cuStreamBeginCapture_v2(h, ctypes.c_int(1)), "cuStreamBeginCapture")  # THREAD_LOCAL
        graph = ctypes.c_void_p()
        try:
            for step in calls:
                if isinstance(step, Copy):  # a bound call's input or output copy (dlcc/bound.py)
                    if step.nbytes:
                        self.drv.memcpy_dtod_async(step.dst, step.src, step.nbytes, stream)
                    continue
                kernel, grid, block, args = step
                _prepare(kernel, args)
                kernel.prepared_async_call((grid, 1), (block, 1, 1), stream, *[int(a) for a in args],
                                           **_shared(kernel))
        finally:
            ended = cu.cuStreamEndCapture(h, ctypes.byref(graph))
        _check(ended, "cuStreamEndCapture")
        exe = ctypes.c_void_p()
        try:
            _check(cu.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, ctypes.c_ulonglong(0)),
                   "cuGraphInstantiateWithFlags")
        finally:
            cu.cuGraphDestroy(graph)  # the instantiated graph keeps what it needs
        return CudaGraph(exe.value, stream)

    @_in_context
    def launch_graph(self, graph: "CudaGraph") -> None:
        """One replay of a captured inference, on the legacy default stream (where the input and
        output copies run, so they order around it as the kernels' own launches did)."""
        import ctypes

        _check(_libcuda().cuGraphLaunch(ctypes.c_void_p(graph.exec), ctypes.c_void_p(0)), "cuGraphLaunch")

    # -- a caller's stream -------------------------------------------------------------------------
    @staticmethod
    def stream_handle(stream) -> int:
        """The CUstream handle of `stream`: a PyCUDA Stream (.handle), a torch.cuda.Stream
        (.cuda_stream), a CuPy stream (.ptr) or a raw handle (int)."""
        for attr in ("handle", "cuda_stream", "ptr"):
            if hasattr(stream, attr) and not callable(getattr(stream, attr)):
                return int(getattr(stream, attr))
        if isinstance(stream, (int, np.integer)) and int(stream) >= 0:
            return int(stream)
        raise DlccError(f"stream={stream!r}: pass a PyCUDA, torch or CuPy stream, or a raw CUstream handle")

    @_in_context
    def join(self, handle: int, into_ours: bool) -> None:
        """Order two streams with an event: dlcc's (the legacy default stream) after the work
        already queued on `handle` (into_ours), or `handle` after dlcc's work so far."""
        import ctypes

        cu = _libcuda()
        event = self._event("_join_event")
        theirs, ours = ctypes.c_void_p(handle or None), ctypes.c_void_p(None)
        src, dst = (theirs, ours) if into_ours else (ours, theirs)
        err = cu.cuEventRecord(event, src)
        if err == 0:
            err = cu.cuStreamWaitEvent(dst, event, ctypes.c_uint(0))
        if err != 0:
            raise RuntimeBackendError(f"stream {handle:#x} cannot be joined with dlcc's work (CUresult {err}): a "
                                      f"stream of another device or context?")

    # -- completion of work that was not waited for ---------------------------------------------
    @_in_context
    def record(self) -> int:
        """An event recorded on dlcc's stream after the work queued so far (an inference that
        returned without waiting); `done` asks whether it completed. One event per runtime,
        recorded again each time: only the last inference's completion is ever asked."""
        import ctypes

        event = self._event("_done_event")
        _check(_libcuda().cuEventRecord(event, ctypes.c_void_p(None)), "cuEventRecord")
        return event.value

    def _event(self, attr: str):
        """The runtime's event kept as `attr` (created on first use, without timing): one for
        joining streams, one for the last inference's completion."""
        import ctypes

        if getattr(self, attr, None) is None:
            ev = ctypes.c_void_p()
            _check(_libcuda().cuEventCreate(ctypes.byref(ev), ctypes.c_uint(2)), "cuEventCreate")  # DISABLE_TIMING
            setattr(self, attr, ev)
        return getattr(self, attr)

    @_in_context
    def done(self, event: int) -> bool:
        """Whether the work before `event` finished (cuEventQuery: no wait)."""
        import ctypes

        err = _libcuda().cuEventQuery(ctypes.c_void_p(event))
        if err == 600:  # CUDA_ERROR_NOT_READY
            return False
        _check(err, "cuEventQuery")
        return True

    def destroy_graph(self, graph: "CudaGraph") -> None:
        import ctypes

        if graph.exec:
            try:
                with self.active():
                    _libcuda().cuGraphExecDestroy(ctypes.c_void_p(graph.exec))
            except Exception:  # at interpreter exit the driver may already be gone: nothing to free
                pass
            graph.exec = None

    @_in_context
    def finish(self) -> None:
        """Wait for dlcc's own work: the legacy default stream, where every copy, launch and graph
        replay of dlcc's runs. Not the whole context (Context.synchronize), which would also wait
        for work other libraries queued on their own streams of the shared primary context."""
        import ctypes

        _check(_libcuda().cuStreamSynchronize(ctypes.c_void_p(None)), "cuStreamSynchronize")

    @_in_context
    def resident_blocks(self, kernel, block: int, smem_bytes: int = 0) -> int:
        """Blocks of `kernel` the GPU holds at once: SMs × the occupancy from the compiled
        function's own registers and shared memory (what a cooperative launch would check)."""
        a = self.drv.function_attribute
        d = self.drv.device_attribute
        regs = kernel.get_attribute(a.NUM_REGS)
        smem = kernel.get_attribute(a.SHARED_SIZE_BYTES) + getattr(kernel, "_dlcc_shared", 0)
        if block > kernel.get_attribute(a.MAX_THREADS_PER_BLOCK):
            return 0
        sms = self.dev.get_attribute(d.MULTIPROCESSOR_COUNT)
        warps = -(-block // 32)
        by_regs = self.dev.get_attribute(d.MAX_REGISTERS_PER_MULTIPROCESSOR) // max(1, -(-max(regs, 1) * 32 // 256) * 256 * warps)
        by_threads = self.dev.get_attribute(d.MAX_THREADS_PER_MULTIPROCESSOR) // block
        by_smem = self.dev.get_attribute(d.MAX_SHARED_MEMORY_PER_MULTIPROCESSOR) // smem if smem else by_threads
        return sms * max(0, min(by_regs, by_threads, by_smem, 32))

    @_in_context
    def time_launch(self, kernel, grid: int, block: int, args: list, batch: int = 8) -> float:
        """Device time of one launch in µs (CUDA events), used by `dlcc profile`: the mean of
        `batch` launches queued back to back, so that the host's launch overhead, which an event
        pair around a single launch would include, overlaps the kernels. A kernel shorter than
        that overhead still reads as the overhead (an upper bound)."""
        start, stop = self.drv.Event(), self.drv.Event()
        start.record()
        for _ in range(batch):
            self.launch(kernel, grid, block, args)
        stop.record()
        stop.synchronize()
        return start.time_till(stop) * 1e3 / batch

    @_in_context
    def time_graph(self, kernel, grid: int, block: int, args: list, count: int = 20, repeat: int = 5) -> float:
        """Device time of one launch in µs, measured as scripts/gemm_tilings.py times cuBLAS:
        `count` launches captured in one CUDA graph and replayed (one warm-up, then the median of
        `repeat` replays, over `count`). No host launch cost is in it, and a kernel pays what it
        pays inside a graphed plan; time_launch's queued launches added up to a microsecond or
        two to a short kernel."""
        graph = self.capture([(kernel, grid, block, args)] * count)
        try:
            self.launch_graph(graph)
            start, stop = self.drv.Event(), self.drv.Event()
            samples = []
            for _ in range(max(1, repeat)):
                start.record()
                self.launch_graph(graph)
                stop.record()
                stop.synchronize()
                samples.append(start.time_till(stop) * 1e3 / count)
        finally:
            self.destroy_graph(graph)
        return statistics.median(samples)

    @_in_context
    def timer(self):
        """(start, stop) CUDA events for timing a run on the device."""
        return self.drv.Event(), self.drv.Event()
