"""OpenCL runtime (PyOpenCL): a real product backend for AMD, Intel and CPU devices; in CI it is
PoCL on the CPU, where every numerics test runs the emitted kernels."""
from __future__ import annotations

import collections
import hashlib
import logging
import os
import threading
import warnings

import numpy as np

from ..errors import CompileError, DlccError, RuntimeBackendError

#: PoCL's worker threads, when dlcc could fix them before the OpenCL platform was first touched
#: (claim_pocl_threads); None when it could not know them.
POCL_THREADS: int | None = None


def configure_pocl() -> None:
    """What dlcc asks of PoCL, set in the environment before PoCL reads it (at import of dlcc):
    its worker threads (claim_pocl_threads).

    PoCL's work-group method stays its default ("loopvec": LLVM's loop vectorizer over the
    work-item loops), about 1.7x faster than "loops" on dlcc's kernels. PoCL 3.1 miscompiles one
    loop shape under it, a loop whose bounds read the block index around a barrier
    (dlcc/testing/pocl_kernels.py); dlcc builds every kernel that has that shape with
    -cl-opt-disable (unoptimised_kernels), and tests/test_pocl_miscompiles.py checks that no
    other kernel of the test models has it."""
    claim_pocl_threads()
    claim_thread_stack()


#: The stack (MiB) dlcc asks glibc to give new threads, PoCL's workers among them (claim_thread_stack).
POCL_STACK_MB = 256


def claim_thread_stack() -> None:
    """Raise glibc's default thread stack before PoCL starts its worker threads. PoCL's pthread
    device runs a work-group on a worker thread whose stack is glibc's default (RLIMIT_STACK: 8 MiB
    here), and the work-group function keeps every private value that lives across a barrier in a
    context array of one copy per work-item, on that stack. Built with -cl-opt-disable, nothing is
    promoted or shares a slot: a persistent kernel of many rTasks (ch_ppocr_mobile_v2.0_cls through
    `full` at bf16: a 13.2 MiB frame) ran past the stack, SIGSEGV (or, where the frame lands on
    another mapping, silent corruption). Only address space is reserved; pages are touched as used."""
    import ctypes
    import sys

    if "pyopencl" in sys.modules or not sys.platform.startswith("linux"):
        return
    want = int(os.environ.get("DLCC_THREAD_STACK_MB", POCL_STACK_MB)) << 20
    try:
        libc = ctypes.CDLL(None)
        attr = ctypes.create_string_buffer(128)  # pthread_attr_t: 56 bytes on x86-64 glibc
        if libc.pthread_getattr_default_np(attr) != 0:
            return
        size = ctypes.c_size_t(0)
        if libc.pthread_attr_getstacksize(attr, ctypes.byref(size)) == 0 and size.value < want:
            if libc.pthread_attr_setstacksize(attr, ctypes.c_size_t(want)) == 0:
                libc.pthread_setattr_default_np(attr)
        libc.pthread_attr_destroy(attr)
    except (OSError, AttributeError):  # not glibc: keep the platform's default
        pass


def claim_pocl_threads() -> None:
    """Fix PoCL's worker-thread count before the OpenCL platform is first touched (DESIGN §3).

    A work-group that spins at a grid barrier holds its worker thread until the others arrive, so
    a spinning grid needs a thread per work-group. PoCL's default is one thread per core, and with
    2 threads a 2-group spinning grid hung here: PoCL does not promise that every idle thread takes
    a group. So dlcc asks for one thread more than the cores (unless POCL_MAX_PTHREAD_COUNT is set
    already) and proves at most threads - 1 groups resident. Called when dlcc is imported; if
    pyopencl was imported first, the platform may already be set up, and only one group is proven."""
    global POCL_THREADS
    import sys

    preset = os.environ.get("POCL_MAX_PTHREAD_COUNT")
    if "pyopencl" in sys.modules and not preset:
        POCL_THREADS = None
        return
    if not preset:
        os.environ["POCL_MAX_PTHREAD_COUNT"] = str((os.cpu_count() or 1) + 1)
    value = os.environ["POCL_MAX_PTHREAD_COUNT"]
    POCL_THREADS = int(value) if value.isdigit() else None


def build_options() -> list[str]:
    """Extra OpenCL build options from DLCC_OPENCL_BUILD_OPTIONS (space-separated). Example:
    `-cl-opt-disable` builds about 4x faster and runs several times slower, which suits many short
    runs (scripts/fuzz.py --quick-build)."""
    return os.environ.get("DLCC_OPENCL_BUILD_OPTIONS", "").split()


def builds_unoptimised(kernel: dict | None, grid_sync: bool = False) -> bool:
    """Whether PoCL gets `kernel` (a plan's kernel entry; `grid_sync`: a launch of it spins at grid
    barriers) from the -cl-opt-disable build (OpenCLRuntime.compile says why for each kind):
    Rammer's persistent kernels and AStitch's grid-barrier kernels (loops whose bounds depend on
    the launch grid, around barriers: the shape PoCL 3.1 miscompiles optimised), the GPU-only
    SIMT tilings, and the multi-stage fp16/bf16 tensor-core rKernels (they build faster so). The
    cost model prices them with DeviceSpec.unoptimised_slowdown."""
    from ..kernels.gemm import GPU_TILINGS, VECTOR_TILINGS
    from ..kernels.gemm_mma import mma_family
    from ..kernels.splitk import base_name

    k = kernel or {}
    if grid_sync or k.get("kind") == "persistent":
        return True
    # the GPU-only SIMT tilings in both templates: 8x4 and 8x8 outputs a thread (GPU_TILINGS and
    # their vector twins); LLVM 15 crashed optimising a split-K 8x8v rKernel (ch_PP-OCRv4_rec)
    gpu_only = {t.name for t in GPU_TILINGS + VECTOR_TILINGS if t.tm * t.tn >= 32}
    # (the multi-stage fp16/bf16 tensor-core ones, wgmma's too, for their build time: optimised
    # they took 25% longer to build and test in tests/test_gemm_*; they build right optimised
    # since the prelude always inlines their emulation, test_pocl_miscompiles.py)
    slow_to_build = gpu_only | {t.name for p in ("fp16", "bf16")
                                for t in mma_family(p, deep=True, wgmma=True) if t.stages > 1}
    return base_name(k.get("tiling") or "") in slow_to_build


def unoptimised_kernels(plan: dict | None) -> set[str]:
    """The names of `plan`'s kernels that PoCL builds with -cl-opt-disable (builds_unoptimised)."""
    spins = {L["kernel"] for L in (plan or {}).get("launches", []) if L.get("grid_sync")}
    return {k["name"] for k in (plan or {}).get("kernels", []) if builds_unoptimised(k, k["name"] in spins)}


def available() -> bool:
    try:
        import pyopencl as cl

        return any(p.get_devices() for p in cl.get_platforms())
    except Exception:
        return False


_CONTEXTS: dict = {}
_CONTEXTS_LOCK = threading.Lock()


def _shared_context(cl, device):
    """One OpenCL context per device for the whole process, which every model's runtime shares
    (each with its own command queue). When a process's last PoCL context is released, PoCL tears
    its device down, and the next context's first build pays about 0.8 s to set it up again: a
    program that compiled and dropped models one after another (the test suite does, 2,000
    times) paid it for every model. Models of one context run independently; their buffers and
    programs are their own."""
    key = device.int_ptr
    with _CONTEXTS_LOCK:
        if key not in _CONTEXTS:
            _CONTEXTS[key] = cl.Context([device])
        return _CONTEXTS[key]


_PROGRAMS: "collections.OrderedDict[tuple, tuple]" = collections.OrderedDict()
_PROGRAMS_LOCK = threading.Lock()
#: Built programs a process keeps (least recently used dropped first). A process that compiles
#: the same kernel text again (a model compiled under pipelines that plan it alike, a model loaded
#: twice) reuses the build: PoCL takes 0.06 s to build even a text it has cached on disk, and
#: builds each kernel's work-group function again at the new program's first launch.
PROGRAM_CACHE_SIZE = 32


def _build_program(cl, ctx, source: str, options: list[str]):
    """(the built program, its build log) for `source` under `options` in `ctx`, from this
    process's program cache where the same text was built before. A built program only hands out
    kernels (each runtime creates its own, whose arguments are its own), so models and threads
    can share it. A build that fails raises and is not kept."""
    key = (ctx.int_ptr, tuple(options), hashlib.sha256(source.encode()).digest())
    with _PROGRAMS_LOCK:
        if key in _PROGRAMS:
            _PROGRAMS.move_to_end(key)
            return _PROGRAMS[key]
    # PyOpenCL turns any compiler output (PoCL's remarks on real models) into a Python
    # CompilerWarning on the user's terminal. It is not the user's to act on: keep it as the
    # runtime's build log (dlcc batch writes it to the job's log).
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        built = cl.Program(ctx, source).build(options=options), "\n".join(str(w.message) for w in caught)
    with _PROGRAMS_LOCK:
        _PROGRAMS[key] = built
        while len(_PROGRAMS) > PROGRAM_CACHE_SIZE:
            _PROGRAMS.popitem(last=False)
    return built


def _pick_device(cl):
    want = os.environ.get("DLCC_OPENCL_DEVICE", "").lower()
    devices = []
    for p in cl.get_platforms():
        try:
            devices += p.get_devices()
        except Exception:
            continue
    if not devices:
        raise RuntimeBackendError("no OpenCL device found; install an ICD (e.g. `apt-get install pocl-opencl-icd`)")
    if want:
        for d in devices:
            if want in d.name.lower() or want in d.platform.name.lower():
                return d
    gpus = [d for d in devices if d.type & cl.device_type.GPU]
    return (gpus or devices)[0]


class OpenCLRuntime:
    name = "opencl"
    dialect = "opencl"

    def __init__(self):
        try:
            import pyopencl as cl
        except ImportError:
            raise RuntimeBackendError("the OpenCL target needs pyopencl: pip install 'dlcc[opencl]'") from None
        self.cl = cl
        try:
            self.device = _pick_device(cl)
        except cl.Error as e:
            raise RuntimeBackendError(
                f"no usable OpenCL platform ({e}); install an OpenCL driver, for example PoCL for the CPU: "
                "`apt-get install pocl-opencl-icd` (scripts/setup.sh does this where apt exists)") from None
        self.ctx = _shared_context(cl, self.device)
        self.queue = cl.CommandQueue(self.ctx)
        self.program = None
        self.unoptimised = None  # the program again, without optimisation: PoCL's persistent kernels
        self._unoptimised_names: set[str] = set()
        self._kernels = {}
        self._views = {}

    @property
    def device_name(self) -> str:
        return f"{self.device.name.strip()} ({self.device.platform.name.strip()})"

    def is_cpu(self) -> bool:
        return bool(self.device.type & self.cl.device_type.CPU)

    index = None  # CUDA's device ordinal; an OpenCL runtime has none

    def copy_in(self, buf, ref) -> None:
        """A pyopencl array (interop.ArrayRef of the same context) into `buf`, on the device,
        after whatever its own queue still has to do."""
        ref.cl_queue.finish()
        if ref.nbytes:
            self.cl.enqueue_copy(self.queue, buf, ref.cl_buffer, src_offset=ref.ptr, byte_count=ref.nbytes)

    def copy_out(self, ref, src, nbytes: int) -> None:
        """An output buffer into a caller's pyopencl array (`out=`), buffer to buffer."""
        ref.cl_queue.finish()
        if nbytes:
            self.cl.enqueue_copy(self.queue, ref.cl_buffer, src, dst_offset=ref.ptr, byte_count=nbytes)

    def read_ref(self, ref, out: np.ndarray) -> None:
        ref.cl_queue.finish()
        if out.nbytes:
            self.cl.enqueue_copy(self.queue, out, ref.cl_buffer, src_offset=ref.ptr)
            self.queue.finish()

    def active(self):
        """Nothing to make current on OpenCL (the queue carries the context); the CUDA runtime's
        active() pushes its primary context."""
        import contextlib

        return contextlib.nullcontext(self)

    def is_pocl(self) -> bool:
        return "portable computing language" in self.device.platform.name.lower()

    def compile(self, source: str, plan: dict | None = None, binaries: dict | None = None) -> None:
        """Build the plan's kernels. On PoCL, the kernels `unoptimised_kernels` names come from a
        second build of the same text with -cl-opt-disable. Rammer's persistent kernels: their dispatch loop (`for (t = first; t < hi; t +=
        GRID_DIM)`, `first` from the block index) around rTasks with barriers is the shape PoCL
        3.1 miscompiles once LLVM has optimised it (dlcc/testing/pocl_kernels.py: PEELED; fuzz
        graph 300024 lost a stitch's stores through `full-join-always`). Unoptimised, PoCL builds
        every known case right (tests/test_pocl_miscompiles.py), and builds them faster; they run
        slower, which only matters on the CPU, where persistent kernels are for testing.
        AStitch's kernels with grid barriers come from it too: each block loops over its turns of
        a phase (`for (it = 0; it < (U + GRID_DIM - 1) / GRID_DIM; ++it)`) around stages with
        barriers, and optimised, PoCL lost a turn's shared-memory stores after the first (a Softmax
        then Transpose stitch of an H100 plan, run with a clamped grid of 2: every row but each
        block's first summed wrong; tests/test_half_activations.py's graph). Kernels on the
        GPU-only SIMT tilings (kernels/gemm.py GPU_TILINGS, in a plan compiled for a GPU device
        spec) come from that build too: PoCL's LLVM crashes optimising them. So do the fp16/bf16
        tensor-core rKernels (kernels/gemm_mma_async.py and gemm_wgmma.py, with their emulated
        cp.async queue, ldmatrix and wgmma), for their build time. Their emulation's helpers used
        to be called out of line, and then LLVM 15 crashed optimising AStitch-fused ones (SIGSEGV
        in the inliner on a bf16 encoder, in InstCombine on mobilenet-small at bf16), and a lone
        wgmma kernel computed every product as 0; the prelude now always inlines them
        (prelude_opencl.h EMULATED), and optimised, all of those build and compute right."""
        self._kernels = {}  # kernels of a previous program must not be reused
        self._unoptimised_names = unoptimised_kernels(plan) if self.is_pocl() else set()
        options = ["-cl-std=CL1.2"] + build_options()
        try:
            self.program, log = _build_program(self.cl, self.ctx, source, options)
            self.unoptimised, log2 = (_build_program(self.cl, self.ctx, source, options + ["-cl-opt-disable"])
                                      if self._unoptimised_names else (None, ""))
        except self.cl.RuntimeError as e:
            raise CompileError(f"the OpenCL compiler rejected the generated kernels (a dlcc bug):\n{e}") from None
        self.build_log = "\n".join(x for x in (log, log2) if x)
        if self.build_log:
            logging.getLogger("dlcc.opencl").debug("OpenCL compiler output:\n%s", self.build_log)

    def kernel(self, name: str):
        if name not in self._kernels:
            prog = self.unoptimised if name in self._unoptimised_names else self.program
            try:
                # cl.Kernel, not getattr: the program may be shared (_build_program), and each
                # runtime's kernels carry its own arguments
                self._kernels[name] = self.cl.Kernel(prog, name)
            except (AttributeError, self.cl.LogicError):
                raise DlccError(f"kernel {name} is not in the kernel source (a damaged artifact, or one edited by "
                                "hand); compile the model again") from None
        return self._kernels[name]

    def alloc(self, nbytes: int):
        return self.cl.Buffer(self.ctx, self.cl.mem_flags.READ_WRITE, size=max(int(nbytes), 4))

    def view(self, buf, offset: int, nbytes: int):
        if nbytes <= 0 or offset == 0 and nbytes >= buf.size:
            return buf  # (an empty tensor may sit at the storage's end, where no sub-buffer can start)
        key = (id(buf), offset, nbytes)
        if key not in self._views:
            self._views[key] = buf.get_sub_region(offset, max(nbytes, 1))
        return self._views[key]

    def write(self, buf, offset: int, data: np.ndarray | bytes) -> None:
        arr = np.frombuffer(data, np.uint8) if isinstance(data, (bytes, bytearray)) else np.ascontiguousarray(data)
        if arr.nbytes:
            self.cl.enqueue_copy(self.queue, buf, arr, dst_offset=offset)

    def read(self, buf, offset: int, out: np.ndarray) -> None:
        if out.nbytes:
            self.cl.enqueue_copy(self.queue, out, buf, src_offset=offset)

    def launch(self, kernel, grid: int, block: int, args: list) -> None:
        kernel.set_args(*[np.int32(a) if isinstance(a, int) else a for a in args])
        self.cl.enqueue_nd_range_kernel(self.queue, kernel, (grid * block,), (block,))

    def finish(self) -> None:
        self.queue.finish()

    def resident_blocks(self, kernel, block: int, smem_bytes: int = 0) -> int:
        """Work-groups proven to run at the same time. PoCL's CPU device runs a work-group on one
        of its worker threads, and a spinning grid needs one thread per group with one to spare
        (claim_pocl_threads); where dlcc could not fix the thread count, one group (a grid of one
        never waits on another). Other OpenCL devices: one work-group per compute unit."""
        cl = self.cl
        if block > kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, self.device):
            return 0
        cus = int(self.device.max_compute_units)
        if self.is_pocl():
            return 1 if POCL_THREADS is None else max(1, min(cus, POCL_THREADS - 1))
        return max(1, cus)

    def time_launch(self, kernel, grid: int, block: int, args: list) -> float:
        """One launch timed on the device (OpenCL profiling events), in µs; used by `dlcc profile`."""
        if getattr(self, "_prof_queue", None) is None:
            self._prof_queue = self.cl.CommandQueue(
                self.ctx, properties=self.cl.command_queue_properties.PROFILING_ENABLE)
        self.queue.finish()
        kernel.set_args(*[np.int32(a) if isinstance(a, int) else a for a in args])
        ev = self.cl.enqueue_nd_range_kernel(self._prof_queue, kernel, (grid * block,), (block,))
        ev.wait()
        return (ev.profile.end - ev.profile.start) / 1e3
