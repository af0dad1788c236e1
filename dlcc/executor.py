"""The launcher logic shared by every backend: storages, views, argument binding, input checks.

A runtime (backends/opencl.py, backends/cuda.py) only provides alloc/view/write/read/launch;
all of the plan interpretation lives here, so it is exercised by every OpenCL test.
"""
from __future__ import annotations

import math
import secrets
import sys
import threading
import time
import warnings
import weakref

import numpy as np

from .errors import DlccError
from .interop import DeviceArray, InteropError, describe
from .kernels.index_check import DIVISOR, FINITE, range_text


class InputError(DlccError):
    """Inputs given to a compiled model do not match its signature."""


class DeviceIndexError(InputError):
    """An index computed inside the model fell outside its tensor (kernels/index_check.py): the
    inputs led the model somewhere onnxruntime refuses to go as well."""


def make_runtime(target: str):
    if target == "cuda":
        from .backends.cuda import CudaRuntime

        return CudaRuntime()
    if target == "opencl":
        from .backends.opencl import OpenCLRuntime

        return OpenCLRuntime()
    raise DlccError(f"unknown target {target!r}; use auto, cuda or opencl")


def use_dynamic_smem(rt, kernels: list[dict]) -> None:
    """Give the kernels that take dynamic shared memory (`dynamic_smem_bytes`: a DEEP GEMM
    tiling's stages, kernels/gemm_mma.py) their size, on a runtime that launches with one (CUDA;
    on OpenCL their arrays are static)."""
    setter = getattr(rt, "set_dynamic_smem", None)
    if setter is None:
        return
    for k in kernels:
        if k.get("dynamic_smem_bytes"):
            setter(rt.kernel(k["name"]), k["dynamic_smem_bytes"])


def check_call_options(rt, outputs: str, stream) -> None:
    """run()'s and bind()'s `outputs` and `stream`: "host" or "device", and the last and a stream
    only on CUDA."""
    if outputs not in ("host", "device"):
        raise DlccError(f"outputs={outputs!r}: use 'host' or 'device'")
    if rt.name != "cuda" and (outputs == "device" or stream is not None):
        what = "outputs='device'" if outputs == "device" else "stream="
        raise InteropError(f"{what} needs the CUDA target; on {rt.name} outputs come back as numpy arrays "
                           "and the queue is dlcc's own")


def torch_cuda_device(inputs: dict, rt):
    """The torch device of the first torch CUDA tensor among the inputs, whose current stream a
    call joins by default, or None (torch not loaded, none such, or not the CUDA target)."""
    torch = sys.modules.get("torch")
    if torch is None or rt.name != "cuda":
        return None
    for v in inputs.values():
        if isinstance(v, torch.Tensor) and v.is_cuda:
            return v.device
    return None


def producer_streams(arrays: list) -> list[int]:
    """The streams that device inputs' `__cuda_array_interface__` say their producers wrote on
    (version 3's `stream`), other than the default streams 1 and 2, which dlcc's own stream
    already follows, in input order and each once."""
    out: list[int] = []
    for a in arrays:
        sid = None if isinstance(a, np.ndarray) else getattr(a, "stream", None)
        if sid not in (None, 0, 1, 2) and int(sid) not in out:
            out.append(int(sid))
    return out


def check_input_names(inputs: dict, names: list[str]) -> None:
    """A call feeds exactly the model's inputs: one error listing what is missing and unknown."""
    if len(inputs) != len(names) or not all(n in inputs for n in names):
        unknown = [k for k in inputs if k not in names]
        missing = [n for n in names if n not in inputs]
        raise InputError(f"inputs do not match the model: missing {missing or 'none'}, unknown {unknown or 'none'}; "
                         f"expected {names}")


#: ml_dtypes' types, which .npz files keep as voids of their size (bfloat16 as V2, float8 as V1).
ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float4_e2m1fn",
              "int4", "uint4", "int2", "uint2")


def _void_of(have: np.dtype, want: np.dtype) -> bool:
    return want.name in ML_DTYPES and have.kind == "V" and have.itemsize == want.itemsize and have.names is None


def castable(have: np.dtype, want: np.dtype) -> bool:
    """Whether a host array of dtype `have` is taken for an input of dtype `want`: numpy's
    same_kind rule, and voids of an ml_dtypes type's size (.npz files keep ml_dtypes' types so).
    An integer array is not taken for a float8 input: onnxruntime's binding hands float8 out as
    raw uint8 bytes, which numpy's rule would convert as numbers."""
    if want.name.startswith(("float8", "float4")) and have.kind in "biu":
        return False
    return have == want or _void_of(have, want) or np.can_cast(have, want, "same_kind")


def as_input(a: np.ndarray, name: str, dtype) -> np.ndarray:
    """Host array `a` in the input's dtype, converted as `castable` allows, or an InputError."""
    want = np.dtype(dtype)
    if a.dtype == want:
        return a
    if not castable(a.dtype, want):
        hint = (f" (raw bytes, as onnxruntime returns float8: a.view(ml_dtypes.{want.name}))"
                if want.name.startswith("float8") and a.dtype == np.uint8 else "")
        raise InputError(f"input {name!r} has dtype {a.dtype}, expected {want}{hint}")
    return a.view(want) if _void_of(a.dtype, want) else a.astype(want)


def _warn_beyond_float32(name: str, a: np.ndarray) -> None:
    """One warning where a float64 input that the plan computes in float32 holds finite values
    beyond float32's range: they become ±inf inside, and the outputs then say inf with nothing to
    tell why (onnx's own test inputs hold values such as 9e223)."""
    big = np.isfinite(a) & (np.abs(a) > np.finfo(np.float32).max)
    if big.any():
        warnings.warn(f"dlcc: input {name!r} holds {int(big.sum())} value(s) beyond float32's range (largest "
                      f"{float(np.abs(a[big]).max()):.3g}); this plan computes its float64 in float32 "
                      "(--precision), so they become ±inf", stacklevel=4)


def pick_target(target: str = "auto") -> str:
    """auto → CUDA when PyCUDA sees a GPU, else OpenCL (PoCL on the CPU here)."""
    if target not in ("auto", "cuda", "opencl"):
        raise DlccError(f"unknown target {target!r}; use auto, cuda or opencl")
    if target != "auto":
        return target
    from .backends import cuda

    return "cuda" if cuda.available() else "opencl"


class Executor:
    """One compiled plan bound to a runtime: its buffers, kernels and launch list.

    Calls are serialised (a lock around each `run` and `profile`): a plan owns one arena, one set
    of input and output buffers and one set of grid-barrier counters, so two inferences at once
    would overwrite each other's intermediates (a model called from two threads returned wrong
    outputs, silently). Several models in one process run concurrently; one model shared by
    threads runs one call at a time."""

    def __init__(self, plan: dict, weights: bytes, source: str, runtime, binaries: dict[str, bytes] | None = None):
        self._lock = threading.Lock()
        self.plan = plan
        self.rt = runtime
        self.graph, self.graph_error = None, None
        self._graph_wanted = bool((plan.get("meta") or {}).get("graphs")) and hasattr(runtime, "capture")
        with runtime.active():  # CUDA: the primary context current while we work (backends/cuda.py)
            self._build(weights, source, binaries)

    def _build(self, weights: bytes, source: str, binaries: dict[str, bytes] | None) -> None:
        plan, rt = self.plan, self.rt
        rt.compile(source, plan, binaries or {})
        use_dynamic_smem(rt, plan["kernels"])
        st = plan["storages"]
        self.storages = {"arena": rt.alloc(st["arena"]), "weights": rt.alloc(st["weights"])}
        rt.write(self.storages["weights"], 0, weights)
        for own in ("sync", "errors", "splitk"):
            # Grid-barrier counters start at zero once; every barrier leaves them balanced, so runs
            # back to back (and after an interrupted one) need no reset. The index checks' claim
            # word starts at zero too, and raise_device_errors clears it after reporting. So do
            # split-K's tile counters, which each tile's last rTask sets back to zero.
            if st.get(own):
                self.storages[own] = rt.alloc(st[own])
                rt.write(self.storages[own], 0, bytes(st[own]))
        if st.get("rng"):  # the random draws' state: a fresh key, inference 0 (random_draws.py)
            self.storages["rng"] = rt.alloc(st["rng"])
            rt.write(self.storages["rng"], 0, np.array([secrets.randbits(32) << 32], np.uint64))
        self._report = None  # the index checks' report, as host memory where the runtime maps it
        if st.get("report"):
            mapped = getattr(rt, "alloc_mapped", None)
            if mapped is not None:  # CUDA: read on the host with no device-to-host copy
                self.storages["report"] = mapped(st["report"])
                self._report = self.storages["report"].host
                self._report[:] = 0
                self._report_flag = self._report.view(np.int32)  # word 0: whether anything was reported
            else:
                self.storages["report"] = rt.alloc(st["report"])
                rt.write(self.storages["report"], 0, bytes(st["report"]))
        for k, t in enumerate(plan["inputs"]):
            self.storages[f"input:{k}"] = rt.alloc(_nbytes(t))
        for k, t in enumerate(plan["outputs"]):
            self.storages[f"output:{k}"] = rt.alloc(_nbytes(t))
        #: per output: (position, name, shape, dtype, bytes), read on every call
        self._outs = [(k, t["name"], tuple(t["shape"]), t["dtype"], _nbytes(t)) for k, t in enumerate(plan["outputs"])]
        self._held_outs = [(k, t) for k, t in enumerate(plan["outputs"]) if t.get("model_dtype")]
        #: float64 inputs the plan computes in float32 (a precision asked for: frontend.promote_half)
        self._narrowed = set(plan["meta"].get("float32_inputs", ()))
        self.calls = []
        for L in plan["launches"]:
            args = [a["int"] if "int" in a else rt.view(self.storages[a["storage"]], a["offset"], a["nbytes"])
                    for a in L["args"]]
            grid = L["grid"]
            if L.get("grid_sync"):
                grid = self.resident_grid(L, grid)
            self.calls.append((rt.kernel(L["kernel"]), grid, L["block"], args))
        # Index checks of inputs given as device arrays: (input position, kernel, grid, arguments)
        self.input_checks = []
        for p, c in enumerate((plan.get("meta") or {}).get("index_checks", [])):
            if c.get("kernel"):
                k = c["input"]
                args = [rt.view(self.storages[f"input:{k}"], 0, _nbytes(plan["inputs"][k])),
                        rt.view(self.storages["errors"], 0, st["errors"]),
                        rt.view(self.storages["report"], 0, st["report"]), -(p + 1)]
                self.input_checks.append((k, rt.kernel(c["kernel"]), -(-c["elements"] // 256), args))
        self._pending = None  # the last inference that returned before the device finished it
        self._unchecked = 0  # inferences since the index checks' report was last read
        self._to_release: list = []  # DLPack inputs of those inferences, released once they finish
        # A model dropped with inferences still queued hands their DLPack inputs back too, once the
        # device finished them (the finalizer holds the list and the runtime, never the executor).
        weakref.finalize(self, _release_when_finished, rt, self._to_release)
        rt.finish()

    def random_state(self) -> tuple[int, int] | None:
        """(key, inference number) of the random draws' state, which the next inference draws with
        (random_draws.py); None for a plan with no draw. Waits for the inferences queued so far."""
        if "rng" not in self.storages:
            return None
        with self.rt.active(), self._lock:
            self.rt.finish()
            word = np.zeros(1, np.uint64)
            self.rt.read(self.storages["rng"], 0, word)
        v = int(word[0])
        return v >> 32, v & 0xFFFFFFFF

    def set_random_state(self, key: int, inference: int = 0) -> None:
        """Write the random draws' state (random_state), after the inferences queued so far."""
        if "rng" not in self.storages:
            raise DlccError("this model has no random draws, so it has no random state to set")
        if not (0 <= int(key) < 2 ** 32 and 0 <= int(inference) < 2 ** 32):
            raise DlccError(f"a random state is two 32-bit numbers, not key={key}, inference={inference}")
        with self.rt.active(), self._lock:
            self.rt.finish()
            self.rt.write(self.storages["rng"], 0, np.array([(int(key) << 32) | int(inference)], np.uint64))
            self.rt.finish()

    def resident_grid(self, L: dict, grid: int) -> int:
        """The grid of a spin-waiting kernel on this device: at most the blocks the runtime can
        prove resident at once (its loops are grid-stride, so any grid ≥ 1 is correct). None
        resident means it must never be launched here."""
        kinfo = next(k for k in self.plan["kernels"] if k["name"] == L["kernel"])
        resident = self.rt.resident_blocks(self.rt.kernel(L["kernel"]), L["block"], kinfo.get("smem_bytes", 0))
        if resident < 1:
            raise DlccError(f"kernel {L['kernel']} waits on other blocks, and this device cannot keep even one "
                            f"{L['block']}-thread block of it resident; recompile without the Global scheme "
                            f"(astitch option schemes) to split it")
        return max(1, min(grid, resident))

    def check_inputs(self, inputs: dict) -> list:
        """Each input as the run takes it: a C-contiguous numpy array of the signature's dtype
        (host values are converted as numpy converts them), or an interop.ArrayRef to a device
        array of exactly the signature's shape and dtype on this runtime's device (copied device
        to device into the plan's input buffer; never converted or silently misread)."""
        sig = self.plan["inputs"]
        check_input_names(inputs, [t["name"] for t in sig])
        arrays = []
        try:
            self._convert_inputs(sig, inputs, arrays, describe)
            self.check_bound_values(arrays)
            self.check_indices(arrays)
        except BaseException:
            _release(arrays)  # a DLPack producer's memory is released even when an input is refused
            raise
        return arrays

    def _convert_inputs(self, sig: list, inputs: dict, arrays: list, describe) -> None:
        for t in sig:
            ref = describe(inputs[t["name"]])
            if ref.where != "host":
                arrays.append(ref)
                self._check_device_input(t, ref)
                continue
            a = np.asarray(inputs[t["name"]] if ref.host is None else ref.host)
            if tuple(a.shape) != tuple(t["shape"]):
                raise InputError(f"input {t['name']!r} has shape {list(a.shape)}, the model was compiled for "
                                 f"{t['shape']} (recompile with --shape {t['name']}=...)")
            if t.get("model_dtype"):  # (onto the model's type's values first, then its holder: held_types.py)
                a = as_input(a, t["name"], t["model_dtype"]).astype(t["dtype"])
            arrays.append(np.ascontiguousarray(as_input(a, t["name"], t["dtype"])))
            if t["name"] in self._narrowed:
                _warn_beyond_float32(t["name"], arrays[-1])

    def _check_device_input(self, t: dict, ref, role: str = "input") -> None:
        """A device array for input `t` (or for output `t`'s `out=` destination, role "out"): on
        this runtime's device, contiguous, and of exactly the signature's shape and dtype (a
        device array is not converted: that would be a kernel of its own, or a silent round trip
        through the host)."""
        rt = self.rt
        name = _role_name(role, t["name"])
        if role == "out" and ref.readonly:
            raise InteropError(f"{name} is a read-only device array")
        if ref.where != rt.name:
            if ref.where == "cuda":
                raise InteropError(f"{name} is a CUDA device array, and this model runs on {rt.name}: "
                                   "device arrays need the CUDA target (compile with -t cuda), or pass a host "
                                   "(numpy) array")
            raise InteropError(f"{name} is an OpenCL (pyopencl) array, and this model runs on {rt.name}: "
                               "pass a host (numpy) array or a CUDA device array")
        if tuple(ref.shape) != tuple(t["shape"]):
            hint = f" (recompile with --shape {t['name']}=...)" if role == "input" else ""
            raise InputError(f"{name} has shape {list(ref.shape)}, the model's is {t['shape']}{hint}")
        if ref.dtype != t["dtype"]:
            raise InputError(f"{name} is a device array of dtype {ref.dtype}, the model's is {t['dtype']}; "
                             "device arrays are not converted: convert it first, or pass a host array")
        if not ref.contiguous():
            raise InteropError(f"{name} is a non-contiguous device array (strides {list(ref.strides)} bytes "
                               f"for shape {list(ref.shape)}): make it contiguous first (.contiguous(), "
                               "cupy.ascontiguousarray)")
        if ref.where == "cuda":
            where = ref.device_id if ref.device_id is not None else rt.pointer_device(ref.ptr)
            if where is None:
                raise InteropError(f"{name}: its __cuda_array_interface__ pointer is not device memory "
                                   "(a host pointer?); pass host arrays as numpy")
            if where != rt.index:
                raise InteropError(f"{name} is on CUDA device {where}, and this model runs on device "
                                   f"{rt.index} (DLCC_CUDA_DEVICE / --device-index pick the device)")
        elif ref.cl_queue.context != rt.ctx:
            raise InteropError(f"{name} is a pyopencl array of another OpenCL context than the model's; "
                               "create it with the model's runtime context (model.executor().rt.ctx), or pass "
                               "a numpy array")

    def check_bound_values(self, arrays: list) -> None:
        """A scalar input whose value the compile bound (`--shape sr=16000`) must be fed that value:
        the plan was built for it (its Ifs and shape math folded), so another value would be
        silently computed as if it were the bound one."""
        bound = (self.plan.get("meta") or {}).get("bound_values") or {}
        for k, t in enumerate(self.plan["inputs"]):
            if t["name"] not in bound:
                continue
            a = arrays[k]
            if not isinstance(a, np.ndarray):
                host = np.empty(a.shape, a.dtype)
                self.rt.read_ref(a, host)
                a = host
            if not np.all(a == bound[t["name"]]):
                raise InputError(f"input {t['name']!r} is {a.ravel()[:1].tolist()[0]}, and the model was compiled for "
                                 f"{t['name']}={bound[t['name']]} (--shape {t['name']}={bound[t['name']]}); compile it "
                                 "again for this value")

    def check_indices(self, arrays: list[np.ndarray]) -> None:
        """Gather indices fed by the user (an embedding's token ids) lie inside their tensor, as
        onnxruntime checks: an id past the vocabulary is an error naming the node, the index and
        its position. (The kernels clamp every index too, so nothing reads outside a tensor.)"""
        for c in (self.plan.get("meta") or {}).get("index_checks", []):
            a = arrays[c["input"]]
            if not isinstance(a, np.ndarray):
                if c.get("kernel"):
                    continue  # a device array: checked on the device (_launch_input_checks)
                host = np.empty(a.shape, a.dtype)  # (a plan without the check kernel: read back)
                self.rt.read_ref(a, host)
                a = host
            if c.get("kind") == FINITE:
                bad = ~np.isfinite(a)
                if bad.any():
                    pos = [int(x) for x in np.argwhere(bad)[0]]
                    raise InputError(f"input {c['name']!r}: {a[tuple(pos)].item()} at {pos} for {c['op']} node {c['node']!r}, "
                                     f"whose values must be finite ({int(bad.sum())} such)")
                continue
            if a.dtype.kind not in "iu":
                continue
            comps = ([(a[..., j], b, [j]) for j, b in enumerate(c["bounds"])] if c.get("per_last_axis")
                     else [(a, c["bounds"][0], [])])
            lo = 0 if c.get("from_zero") else None
            for comp, b, extra in comps:
                if c.get("kind") == DIVISOR:
                    bad = comp == 0
                    if bad.any():
                        pos = [int(x) for x in np.argwhere(bad)[0]]
                        raise InputError(f"input {c['name']!r}: divisor 0 at {pos} for {c['op']} node {c['node']!r} "
                                         f"(integer division by zero; {int(bad.sum())} such)")
                    continue
                bad = (comp < (-b if lo is None else lo)) | (comp >= b)
                if bad.any():
                    pos = [int(x) for x in np.argwhere(bad)[0]]
                    raise InputError(f"input {c['name']!r}: index {int(comp[tuple(pos)])} at {pos + extra} is outside "
                                     f"{range_text(b, lo == 0)} for {c['op']} node {c['node']!r} ({int(bad.sum())} such)")

    def launch_all(self) -> None:
        """Queue every launch of one inference, inputs already on the device (no synchronize): on
        CUDA, unless the pipeline said `graphs: false`, as one replay of a CUDA graph captured at
        the first inference (backends/cuda.py capture); otherwise kernel by kernel. A capture the
        driver refuses falls back to kernel-by-kernel launches, with a warning, once."""
        if self.graph is None and self._graph_wanted:
            self._graph_wanted = False
            try:
                self.graph = self.rt.capture(self.calls)
                weakref.finalize(self, self.rt.destroy_graph, self.graph)
            except Exception as e:
                self.graph_error = str(e)
                warnings.warn(f"dlcc: no CUDA graph for this model ({e}); launching kernel by kernel",
                              RuntimeWarning, stacklevel=2)
        if self.graph is not None:
            self.rt.launch_graph(self.graph)
            return
        for kernel, grid, block, args in self.calls:
            self.rt.launch(kernel, grid, block, args)

    def run(self, inputs: dict, timing: dict | None = None, outputs: str = "host", stream=None,
            out: dict | None = None) -> dict:
        """One inference. `outputs`: "host" (numpy arrays) or "device" (interop.DeviceArray, CUDA
        only: each its own allocation, which the next inference does not touch). `out`: arrays
        (numpy, or device arrays of this runtime) to write outputs into, by name; those outputs
        come back as the objects given. `stream` (CUDA): the caller's stream; dlcc's work is
        ordered after what is queued there, and what is queued there next after dlcc's work. By
        default, the current torch stream when an input is a torch CUDA tensor.

        A call whose outputs all stay on the device (outputs="device", and any `out=` a device
        array) returns once its work is queued, without waiting for the GPU, as a torch op does.
        What a device index check found in such an inference is raised by a later call of this
        model, or by synchronize() (_reap)."""
        check_call_options(self.rt, outputs, stream)
        with self.rt.active():
            dests = {}
            deferred = False  # whether the DLPack destinations wait for the inference to finish (_reap)
            try:
                self._check_out(out or {}, dests)
                arrays = self.check_inputs(inputs)
                with self._lock:
                    try:
                        handles = self._streams_of(inputs, stream, arrays)
                        stay = hasattr(self.rt, "record") and all(
                            dests[k][0] == "device" if k in dests else outputs == "device" for k, *_ in self._outs)
                        for h in handles:  # inputs the caller queued there are written first
                            self.rt.join(h, into_ours=True)
                    except BaseException:  # nothing was queued: a DLPack input's memory goes back now
                        _release(arrays)
                        raise
                    # _run owns the inputs from here: it releases them, at once or once finished
                    outs = self._run(arrays, timing, outputs, dests, wait=not stay)
                    if stay:  # the copies into them may still run
                        self._to_release += [d[1] for d in dests.values() if d[0] == "device"]
                        deferred = True
                    for h in handles:  # the caller's next work there sees our outputs
                        self.rt.join(h, into_ours=False)
                return outs
            finally:  # DLPack destinations: released however the call ends (after its finish)
                if not deferred:
                    _release([d[1] for d in dests.values() if d[0] == "device"])

    def bind(self, inputs: dict, outputs: str = "host", out: dict | None = None, stream=None):
        """A BoundCall (dlcc/bound.py): these arrays checked once, and on CUDA the whole inference,
        their copies included, captured as one graph that each call replays."""
        from .bound import BoundCall

        return BoundCall(self, inputs, outputs=outputs, out=out, stream=stream)

    def synchronize(self) -> None:
        """Wait for every inference of this model queued so far, and raise what their device index
        checks found (an inference that returned before the device finished it cannot)."""
        with self.rt.active(), self._lock:
            self.rt.finish()
            self._reap(finished=True)

    def _reap(self, finished: bool = False) -> None:
        """The inferences that returned before the device finished them (outputs on the device),
        once they have finished (`finished`, or their last one's event says so, which does not
        wait): their DLPack inputs released, and the index checks' report read, raising what it
        holds. Only once the last of them finished, so that nothing still running can write the
        report while it is read and cleared."""
        if self._pending is None:
            return
        if not finished and not self.rt.done(self._pending):
            return
        self._drained()
        self.raise_device_errors()

    def _drained(self) -> None:
        """Every queued inference finished: nothing is pending, and the DLPack arrays they used go
        back to their producers."""
        self._pending = None
        refs = self._to_release[:]
        self._to_release.clear()  # the same list: the finalizer holds it
        _release(refs)

    def _streams_of(self, inputs: dict, stream, arrays: list) -> list[int]:
        """The CUstreams to join around the inference (_stream_of), with the streams that device
        inputs' `__cuda_array_interface__` say their producers wrote on (version 3's `stream`, as
        check_inputs read it; other than the default streams 1 and 2, which dlcc's own stream
        already follows): joined with events, so no call waits on the host for another library's
        stream."""
        first = self._stream_of(inputs, stream)
        handles = [first] if first else []  # (0, the legacy default stream, is dlcc's own)
        return handles + [h for h in producer_streams(arrays) if h not in handles]

    def _stream_of(self, inputs: dict, stream) -> int | None:
        """The CUstream to join: `stream` as given, else torch's current stream when torch is
        loaded and an input is a torch CUDA tensor, else None (dlcc's own ordering only)."""
        if stream is not None:
            return self.rt.stream_handle(stream)
        dev = torch_cuda_device(inputs, self.rt)
        return None if dev is None else int(sys.modules["torch"].cuda.current_stream(dev).cuda_stream)

    def _check_out(self, out: dict, dests: dict) -> None:
        """`out=` destinations into `dests`, by output position: ("host", ndarray) or ("device",
        ArrayRef, the object given), each of exactly the output's shape and dtype, contiguous and
        writeable (filled as they are checked, so the caller releases those read before a refusal)."""
        if not out:
            return
        sig = {t["name"]: (k, t) for k, t in enumerate(self.plan["outputs"])}
        unknown = [n for n in out if n not in sig]
        if unknown:
            raise InputError(f"out= names {unknown}, which are not outputs of the model {list(sig)}")
        for name, dest in out.items():
            k, t = sig[name]
            ref = describe(dest)
            if ref.where == "host":
                if ref.host is None or not isinstance(dest, np.ndarray):
                    raise InteropError(f"out[{name!r}] must be an array to write into (numpy, or a device array)")
                if (tuple(dest.shape) != tuple(t["shape"]) or dest.dtype != np.dtype(t["dtype"])
                        or not dest.flags.c_contiguous or not dest.flags.writeable):
                    raise InteropError(f"out[{name!r}] must be a writeable C-contiguous {t['dtype']} array of shape "
                                       f"{t['shape']}; it is {dest.dtype} {list(dest.shape)}")
                dests[k] = ("host", dest)
                continue
            dests[k] = ("device", ref, dest)
            self._check_device_input(t, ref, role="out")

    def _upload(self, arrays: list) -> None:
        """The checked inputs into the plan's input buffers: host arrays copied in, device arrays
        device to device (after the producer's stream, CAI v3). The copies may still be queued:
        release the device arrays (_release) only after a finish."""
        for k, a in enumerate(arrays):
            if isinstance(a, np.ndarray):
                self.rt.write(self.storages[f"input:{k}"], 0, a)
            else:
                self.rt.copy_in(self.storages[f"input:{k}"], a)

    def _launch_input_checks(self, arrays: list) -> None:
        """The index checks of inputs given as device arrays, on the device (kernels/index_check.py):
        after the upload, before the plan's launches, so no device input is read back to check it."""
        for k, kernel, grid, args in self.input_checks:
            if not isinstance(arrays[k], np.ndarray):
                self.rt.launch(kernel, grid, 256, args)

    def _run(self, arrays: list, timing: dict | None, outputs: str = "host", dests: dict | None = None,
             wait: bool = True) -> dict:
        rt = self.rt
        try:
            self._reap()  # an earlier inference's device error is raised before this one runs
        except BaseException:
            _release(arrays)
            raise
        try:
            self._upload(arrays)
            t0 = time.perf_counter()
            self._launch_input_checks(arrays)
            self.launch_all()
            if wait:
                rt.finish()
        finally:
            if wait:
                _release(arrays)
            else:  # released once the queued copies are known done (_reap)
                self._to_release += [a for a in arrays if not isinstance(a, np.ndarray)]
        if timing is not None:
            timing["run_s"] = time.perf_counter() - t0
        if wait:
            self._drained()
            self.raise_device_errors(current=True)
        outs = {}
        for k, name, shape, dtype, n in self._outs:
            src = self.storages[f"output:{k}"]
            dest = dests.get(k) if dests else None
            if dest is not None and dest[0] == "host":
                rt.read(src, 0, dest[1])
                arr = dest[1]
            elif dest is not None:  # a device array of the caller's: device to device
                rt.copy_out(dest[1], src, n)
                arr = dest[2]
            elif outputs == "device":
                arr = DeviceArray(rt.alloc_output(n), shape, dtype, rt.index, rt)
                rt.copy_device(arr._alloc, src, n)
            else:
                arr = np.empty(shape, dtype=dtype)
                rt.read(src, 0, arr)
            outs[name] = arr
        if wait:
            rt.finish()
        else:
            self._unchecked += 1
            self._pending = rt.record()
        for k, t in self._held_outs:  # (host outputs of a held type: the model's type, exactly)
            if isinstance(outs[t["name"]], np.ndarray) and not (dests and k in dests):
                outs[t["name"]] = outs[t["name"]].astype(t["model_dtype"])
        return outs

    def raise_device_errors(self, current: bool = False) -> None:
        """After finished inferences: raise what a device index check recorded (the report,
        kernels/index_check.py), clearing it and the claim word so the next inference starts
        clean. Where the report is mapped host memory (CUDA) it is read in place, with no copy.
        `current`: the call reading it ran an inference of its own (else only earlier ones)."""
        unchecked, self._unchecked = self._unchecked, 0
        if "report" not in self.storages:
            return
        if self._report is not None and not self._report_flag[0]:
            return  # mapped, and nothing reported (every call of a bound model reads it: kept cheap)
        from .kernels.index_check import CLAIM_WORDS, ERROR_WORDS, decode_error

        if self._report is not None:
            words = self._report.view(np.int32)[:ERROR_WORDS].copy()
        else:
            words = np.zeros(ERROR_WORDS, np.int32)
            self.rt.read(self.storages["report"], 0, words)
            self.rt.finish()
        if words[0] == 0:
            return
        if self._report is not None:
            self._report[:] = 0
        else:
            self.rt.write(self.storages["report"], 0, bytes(words.nbytes))
        self.rt.write(self.storages["errors"], 0, bytes(4 * CLAIM_WORDS))
        meta = self.plan.get("meta") or {}
        msg = decode_error(words, meta.get("device_index_checks", []), meta.get("index_checks", []))
        if unchecked:
            which = (f"this inference, or one of the {unchecked} before it that returned before the device "
                     "finished them (outputs='device'),") if current else (
                     f"one of the last {unchecked} inferences that returned before the device finished them "
                     "(outputs='device')")
            msg = f"{which} went wrong, so their outputs are not to be trusted: {msg}"
        raise DeviceIndexError(msg)

    def profile(self, inputs: dict, repeat: int = 5) -> tuple[list[float], str]:
        """Per-launch kernel time in µs, the median of `repeat` runs after a warm-up run, and how it
        was measured: on the device (CUDA events, OpenCL profiling events) when the runtime can,
        else the wall time of launch + synchronize minus a bare synchronize."""
        arrays = self.check_inputs(inputs)
        with self._lock, self.rt.active():
            return self._profile(arrays, repeat)

    def _profile(self, arrays: list, repeat: int) -> tuple[list[float], str]:
        import statistics

        rt = self.rt
        try:
            self._upload(arrays)
            self._launch_input_checks(arrays)
            self.launch_all()  # warm-up: first-use compilation, page faults
            rt.finish()
        finally:
            _release(arrays)
        self.raise_device_errors()
        timed = getattr(rt, "time_launch", None)
        samples: list[list[float]] = [[] for _ in self.calls]
        for _ in range(max(1, repeat)):
            for i, (kernel, grid, block, args) in enumerate(self.calls):
                if timed is not None:
                    samples[i].append(timed(kernel, grid, block, args))
                    continue
                t0 = time.perf_counter()
                rt.finish()
                t1 = time.perf_counter()
                rt.launch(kernel, grid, block, args)
                rt.finish()
                t2 = time.perf_counter()
                samples[i].append(max(0.0, (t2 - t1) - (t1 - t0)) * 1e6)
        how = "device events" if timed is not None else "wall time minus a bare synchronize"
        return [statistics.median(s) for s in samples], how


def _release_when_finished(rt, refs: list) -> None:
    """An executor's finalizer: the DLPack inputs of inferences still queued when it was dropped
    go back to their producers once the device finished them. Best effort: at interpreter exit the
    context may be gone already, and then there is nothing left to wait for."""
    if not refs:
        return
    try:
        with rt.active():
            rt.finish()
    except Exception:  # noqa: BLE001 (a finalizer must not raise; the memory is released anyway)
        pass
    _release(refs)


def _release(refs: list) -> None:
    """Run the DLPack deleters of the device arrays among `refs` (numpy arrays are skipped; a
    second call does nothing)."""
    for a in refs:
        if not isinstance(a, np.ndarray):
            a.done()


def _role_name(role: str, name: str) -> str:
    """How an error names the array: `input 'x'` or `out['y']`."""
    return f"input {name!r}" if role == "input" else f"out[{name!r}]"


def _nbytes(t: dict) -> int:
    return math.prod(t["shape"]) * np.dtype(t["dtype"]).itemsize
