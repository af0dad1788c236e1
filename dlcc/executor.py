"""The launcher logic shared by every backend: storages, views, argument binding, input checks.

A runtime (backends/opencl.py, backends/cuda.py) only provides alloc/view/write/read/launch;
all of the plan interpretation lives here, so it is exercised by every OpenCL test.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from .errors import DlccError


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
        with runtime.active():  # CUDA: the primary context current while we work (backends/cuda.py)
            self._build(weights, source, binaries)

    def _build(self, weights: bytes, source: str, binaries: dict[str, bytes] | None) -> None:
        plan, rt = self.plan, self.rt
        rt.compile(source, plan, binaries or {})
        st = plan["storages"]
        self.storages = {"arena": rt.alloc(st["arena"]), "weights": rt.alloc(st["weights"])}
        rt.write(self.storages["weights"], 0, weights)
        for own in ("sync", "errors"):
            # Grid-barrier counters start at zero once; every barrier leaves them balanced, so runs
            # back to back (and after an interrupted one) need no reset. The index checks' error
            # words start at zero too, and raise_device_errors clears them after reporting.
            if st.get(own):
                self.storages[own] = rt.alloc(st[own])
                rt.write(self.storages[own], 0, bytes(st[own]))
        for k, t in enumerate(plan["inputs"]):
            self.storages[f"input:{k}"] = rt.alloc(_nbytes(t))
        for k, t in enumerate(plan["outputs"]):
            self.storages[f"output:{k}"] = rt.alloc(_nbytes(t))
        self.calls = []
        for L in plan["launches"]:
            args = [a["int"] if "int" in a else rt.view(self.storages[a["storage"]], a["offset"], a["nbytes"])
                    for a in L["args"]]
            grid = L["grid"]
            if L.get("grid_sync"):
                grid = self.resident_grid(L, grid)
            self.calls.append((rt.kernel(L["kernel"]), grid, L["block"], args))
        rt.finish()

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

    def check_inputs(self, inputs: dict) -> list[np.ndarray]:
        sig = self.plan["inputs"]
        names = [t["name"] for t in sig]
        unknown = [k for k in inputs if k not in names]
        missing = [n for n in names if n not in inputs]
        if unknown or missing:
            raise InputError(f"inputs do not match the model: missing {missing or 'none'}, unknown {unknown or 'none'}; "
                             f"expected {names}")
        arrays = []
        for t in sig:
            a = np.asarray(inputs[t["name"]])
            if tuple(a.shape) != tuple(t["shape"]):
                raise InputError(f"input {t['name']!r} has shape {list(a.shape)}, the model was compiled for "
                                 f"{t['shape']} (recompile with --shape {t['name']}=...)")
            if t["dtype"] == "bfloat16" and a.dtype == np.dtype("V2"):
                a = a.view(t["dtype"])  # .npz files keep ml_dtypes' bfloat16 as 2-byte voids
            if a.dtype != np.dtype(t["dtype"]):
                if not np.can_cast(a.dtype, t["dtype"], casting="same_kind"):
                    raise InputError(f"input {t['name']!r} has dtype {a.dtype}, expected {t['dtype']}")
                a = a.astype(t["dtype"])
            arrays.append(np.ascontiguousarray(a))
        self.check_indices(arrays)
        return arrays

    def check_indices(self, arrays: list[np.ndarray]) -> None:
        """Gather indices fed by the user (an embedding's token ids) lie inside their tensor, as
        onnxruntime checks: an id past the vocabulary is an error naming the node, the index and
        its position. (The kernels clamp every index too, so nothing reads outside a tensor.)"""
        for c in (self.plan.get("meta") or {}).get("index_checks", []):
            a = arrays[c["input"]]
            if a.dtype.kind not in "iu":
                continue
            comps = ([(a[..., j], b, [j]) for j, b in enumerate(c["bounds"])] if c.get("per_last_axis")
                     else [(a, c["bounds"][0], [])])
            for comp, b, extra in comps:
                bad = (comp < -b) | (comp >= b)
                if bad.any():
                    pos = [int(x) for x in np.argwhere(bad)[0]]
                    raise InputError(f"input {c['name']!r}: index {int(comp[tuple(pos)])} at {pos + extra} is outside "
                                     f"[-{b}, {b}) for {c['op']} node {c['node']!r} ({int(bad.sum())} such)")

    def launch_all(self) -> None:
        """Queue every launch of one inference, inputs already on the device (no synchronize)."""
        for kernel, grid, block, args in self.calls:
            self.rt.launch(kernel, grid, block, args)

    def run(self, inputs: dict, timing: dict | None = None) -> dict[str, np.ndarray]:
        arrays = self.check_inputs(inputs)
        with self._lock, self.rt.active():
            return self._run(arrays, timing)

    def _run(self, arrays: list[np.ndarray], timing: dict | None) -> dict[str, np.ndarray]:
        rt = self.rt
        for k, a in enumerate(arrays):
            rt.write(self.storages[f"input:{k}"], 0, a)
        t0 = time.perf_counter()
        self.launch_all()
        rt.finish()
        if timing is not None:
            timing["run_s"] = time.perf_counter() - t0
        self.raise_device_errors()
        outs = {}
        for k, t in enumerate(self.plan["outputs"]):
            arr = np.empty(t["shape"], dtype=t["dtype"])
            rt.read(self.storages[f"output:{k}"], 0, arr)
            outs[t["name"]] = arr
        rt.finish()
        return outs


    def raise_device_errors(self) -> None:
        """After a finished inference: raise what a device index check recorded (the error words,
        kernels/index_check.py), clearing them so the next inference starts clean."""
        if "errors" not in self.storages:
            return
        from .kernels.index_check import ERROR_WORDS, decode_error

        words = np.zeros(ERROR_WORDS, np.int32)
        self.rt.read(self.storages["errors"], 0, words)
        self.rt.finish()
        if words[0] == 0:
            return
        self.rt.write(self.storages["errors"], 0, bytes(words.nbytes))
        raise DeviceIndexError(decode_error(words, (self.plan.get("meta") or {}).get("device_index_checks", [])))

    def profile(self, inputs: dict, repeat: int = 5) -> tuple[list[float], str]:
        """Per-launch kernel time in µs, the median of `repeat` runs after a warm-up run, and how it
        was measured: on the device (CUDA events, OpenCL profiling events) when the runtime can,
        else the wall time of launch + synchronize minus a bare synchronize."""
        arrays = self.check_inputs(inputs)
        with self._lock, self.rt.active():
            return self._profile(arrays, repeat)

    def _profile(self, arrays: list[np.ndarray], repeat: int) -> tuple[list[float], str]:
        import statistics

        rt = self.rt
        for k, a in enumerate(arrays):
            rt.write(self.storages[f"input:{k}"], 0, a)
        self.launch_all()  # warm-up: first-use compilation, page faults
        rt.finish()
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


def _nbytes(t: dict) -> int:
    return int(np.prod(t["shape"], dtype=np.int64)) * np.dtype(t["dtype"]).itemsize
