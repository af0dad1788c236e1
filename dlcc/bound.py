"""A model call with its arrays bound once: `model.bind(inputs, ...)` returns a BoundCall, and
each `call()` runs one inference on what the bound arrays hold at that moment.

Why: `run()` reads and checks every input, allocates the outputs and joins streams on every
call. On CUDA that is tens of µs of Python and driver calls per inference, more than a small
model's GPU time (issue 21's floor: the host's time per inference ≤ 30 µs, whatever the launch
count). A serving loop or a decoder step calls one model on the same buffers again and again, as
torch.compile's CUDA graphs do with their static inputs. Binding does the checks once. On CUDA it
also captures the whole inference as one graph: the copies of the bound device inputs into the
plan's buffers, their index checks, the plan's launches, and the copies into the bound device
outputs. A call is then one graph launch, between the joins with the caller's stream.

The contract (docs/interop.md):
  - a call reads the bound inputs and writes the bound outputs. Change an input's values in
    place between calls (`x.copy_(new)`), never its storage;
  - the next call overwrites the outputs: copy what you keep;
  - a bound host input is read in place at every call, so it must be a numpy array of exactly the
    signature's dtype and shape, C-contiguous (a converted copy would miss later changes);
  - the BoundCall holds the arrays it was given; `close()` (or dropping it) lets them go once
    the device finished with them.
"""
from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass

import numpy as np

from .errors import DlccError
from .executor import _release, _release_when_finished, check_call_options, producer_streams, torch_cuda_device
from .interop import DeviceArray, InteropError


@dataclass(frozen=True)
class Copy:
    """A device-to-device copy inside a captured inference (CudaRuntime.capture): `nbytes` from
    address `src` to address `dst`."""

    dst: int
    src: int
    nbytes: int


class BoundCall:
    """One model's inference with its inputs and outputs bound (CompiledModel.bind). Calling it
    runs one inference and returns `outputs`: the same objects on every call."""

    def __init__(self, executor, inputs: dict, outputs: str = "host", out: dict | None = None, stream=None):
        ex = self._ex = executor
        rt = self._rt = executor.rt
        check_call_options(rt, outputs, stream)
        self._graph = None
        self._held: list = []  # the device arrays given (ArrayRefs): released once the device is done with them
        with rt.active():
            dests: dict = {}
            try:
                ex._check_out(out or {}, dests)
                self._held += [d[1] for d in dests.values() if d[0] == "device"]
                arrays = ex.check_inputs(dict(inputs))
                self._held += [a for a in arrays if not isinstance(a, np.ndarray)]
                self._bind_inputs(inputs, arrays)
                self._bind_outputs(outputs, dests)
                self._stream = rt.stream_handle(stream) if stream is not None else None
                self._torch_device = None if stream is not None else torch_cuda_device(inputs, rt)
                self._producers = producer_streams(arrays)  # joined at every call
                self._capture()
            except BaseException:
                _release(self._held)
                raise
        self._wait = bool(self._host_reads) or not hasattr(rt, "record")
        self._finalizer = weakref.finalize(self, _close, rt, self._graph, self._held)

    # -- binding -----------------------------------------------------------------------------------
    def _bind_inputs(self, inputs: dict, arrays: list) -> None:
        """The host inputs as written at each call (each must be the caller's own array, read in
        place), and the device ones as copied into the plan's input buffers."""
        ex = self._ex
        self._host_writes, self._copies_in = [], []
        for k, (t, a) in enumerate(zip(ex.plan["inputs"], arrays)):
            storage = ex.storages[f"input:{k}"]
            if not isinstance(a, np.ndarray):
                self._copies_in.append((storage, a))
                continue
            given = inputs[t["name"]]
            # read in place: the array itself, or a view of its memory (a torch CPU tensor through
            # DLPack; an .npz file's 2-byte voids viewed as bfloat16), never a converted copy
            if a is not given and not _same_memory(a, given):
                raise InteropError(f"bound input {t['name']!r} is read in place at every call, so it must be a "
                                   f"C-contiguous numpy array of dtype {t['dtype']} and shape {t['shape']}; this "
                                   f"{_what(given)} would be converted to a copy, which later changes would miss")
            self._host_writes.append((storage, a))
        sig = {c["input"] for c in (ex.plan.get("meta") or {}).get("index_checks", [])}
        # host inputs with gathered indices: checked on the host at every call (their values change)
        self._check_host = any(isinstance(arrays[k], np.ndarray) for k in sig)
        self._arrays = arrays

    def _bind_outputs(self, outputs: str, dests: dict) -> None:
        """Each output's object, made once: a caller's `out=` array, else a DeviceArray of its own
        (outputs="device") or a numpy array; with what fills it at each call."""
        ex, rt = self._ex, self._rt
        self.outputs: dict = {}
        self._host_reads, self._copies_out = [], []  # (storage, ndarray); (destination, storage, bytes)
        for k, name, shape, dtype, n in ex._outs:
            src = ex.storages[f"output:{k}"]
            d = dests.get(k)
            if d is not None and d[0] == "host":
                self._host_reads.append((src, d[1]))
                self.outputs[name] = d[1]
            elif d is not None:
                self._copies_out.append((d[1], src, n))
                self.outputs[name] = d[2]
            elif outputs == "device":
                arr = DeviceArray(rt.alloc_output(n), shape, dtype, rt.index, rt)
                self._copies_out.append((arr, src, n))
                self.outputs[name] = arr
            else:
                arr = np.empty(shape, dtype=dtype)
                self._host_reads.append((src, arr))
                self.outputs[name] = arr

    def _capture(self) -> None:
        """On CUDA (graphs on, as the plan says): the device part of the inference as one graph.
        The addresses in it are fixed for the BoundCall's life: the plan's buffers never move, and
        the bound arrays are held."""
        ex, rt = self._ex, self._rt
        if not (ex._graph_wanted or ex.graph is not None) or not hasattr(rt, "capture"):
            return
        steps = [Copy(int(buf), ref.ptr, ref.nbytes) for buf, ref in self._copies_in]
        steps += [(kernel, grid, 256, args) for k, kernel, grid, args in ex.input_checks
                  if not isinstance(self._arrays[k], np.ndarray)]
        steps += ex.calls
        steps += [Copy(dst.ptr, int(src), n) for dst, src, n in self._copies_out]
        try:
            with ex._lock:  # (as run()'s own capture: never beside another call of this model)
                self._graph = rt.capture(steps)
        except Exception as e:  # noqa: BLE001 (as run(): a refused capture launches kernel by kernel)
            import warnings

            warnings.warn(f"dlcc: no CUDA graph for this bound call ({e}); launching kernel by kernel",
                          RuntimeWarning, stacklevel=3)

    # -- a call ------------------------------------------------------------------------------------
    def __call__(self, stream=None) -> dict:
        """One inference on what the bound inputs hold now; returns `outputs`. `stream` (CUDA)
        overrides the stream given to bind() for this call. Returns once the work is queued when
        every output stays on the device (the outputs are then written on the legacy default
        stream, which a torch or CuPy consumer's default stream follows), else once the host
        outputs are filled."""
        if not self._finalizer.alive:
            raise DlccError("this bound call was closed; bind the model again")
        ex, rt = self._ex, self._rt
        with rt.active(), ex._lock:
            handles = self._handles(stream)
            for h in handles:  # inputs the caller queued there are written first
                rt.join(h, into_ours=True)
            ex._reap()  # an earlier inference's device error is raised before this one runs
            if self._check_host:
                ex.check_indices(self._arrays)
            for buf, a in self._host_writes:
                rt.write(buf, 0, a)
            if self._graph is not None:
                rt.launch_graph(self._graph)
            else:
                self._launch()
            if self._wait:
                rt.finish()
                ex._drained()
                ex.raise_device_errors(current=True)
                for src, arr in self._host_reads:
                    rt.read(src, 0, arr)
            else:
                ex._unchecked += 1
                ex._pending = rt.record()
            for h in handles:  # the caller's next work there sees our outputs
                rt.join(h, into_ours=False)
        return self.outputs

    def _launch(self) -> None:
        """The device part kernel by kernel (OpenCL, or CUDA without a graph)."""
        ex, rt = self._ex, self._rt
        for buf, ref in self._copies_in:
            rt.copy_in(buf, ref)
        ex._launch_input_checks(self._arrays)
        ex.launch_all()
        for dst, src, n in self._copies_out:
            if isinstance(dst, DeviceArray):
                rt.copy_device(dst.ptr, src, n)
            else:
                rt.copy_out(dst, src, n)

    def _handles(self, stream) -> list[int]:
        """The CUstreams joined around this call: the one given (to the call, else to bind()),
        else the caller's current torch stream where the bound inputs are torch CUDA tensors;
        and the streams the inputs' producers named."""
        if stream is not None:
            first = self._rt.stream_handle(stream)
        elif self._stream is not None:
            first = self._stream
        elif self._torch_device is not None:
            first = int(sys.modules["torch"].cuda.current_stream(self._torch_device).cuda_stream)
        else:
            first = 0
        return ([first] if first else []) + [h for h in self._producers if h != first]

    def close(self) -> None:
        """Wait for this call's queued work, then hand the bound device arrays back to their
        producers and free the graph. Calling it again does nothing."""
        self._finalizer()

    def __enter__(self) -> "BoundCall":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _close(rt, graph, held: list) -> None:
    """A BoundCall's finalizer (never holding the BoundCall): once the device finished its work,
    release the DLPack arrays it held; destroy its graph (a replay still queued completes first)."""
    _release_when_finished(rt, held)
    if graph is not None:
        rt.destroy_graph(graph)


def _same_memory(a: np.ndarray, given) -> bool:
    """Whether the host array dlcc read `given` as is `given`'s own memory (a torch CPU tensor
    read through DLPack without a copy)."""
    try:
        return np.shares_memory(a, np.asarray(given)) and a.flags.c_contiguous
    except Exception:  # noqa: BLE001 (anything numpy cannot view is not shared memory)
        return False


def _what(x) -> str:
    if isinstance(x, np.ndarray):
        layout = "" if x.flags.c_contiguous else "non-contiguous "
        return f"{layout}{x.dtype} array of shape {list(x.shape)}"
    return type(x).__name__
