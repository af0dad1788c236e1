"""The Python API: `dlcc.compile(...)` returns a callable CompiledModel; `dlcc.load(dir)` reopens one."""
from __future__ import annotations

import logging
import os
import tempfile
import threading
import warnings
from pathlib import Path

import numpy as np

from .artifact import read_artifact, read_binaries, write_artifact
from .backends.source import file_name, render
from .errors import DlccError, ShapeError, UnboundDimError, first_line
from .executor import Executor, make_runtime, pick_target
from .inputs import sample_inputs

log = logging.getLogger(__name__)

#: Guards building a model's executor on first use (one per model, however many threads call it).
_BUILD_LOCK = threading.Lock()


class CompiledModel:
    """A compiled plan plus its kernels; runs on `target` (auto|cuda|opencl) when called."""

    def __init__(self, plan: dict, weights: bytes, kernel_codes: list[str] | None = None,
                 sources: dict[str, str] | None = None, target: str = "auto", binaries: dict[str, bytes] | None = None):
        self.plan = plan
        self.binaries = binaries or {}
        self._weights = weights  # bytes, or a function that reads them (an artifact loaded from disk)
        self.kernel_codes = kernel_codes
        self._sources = sources or {}
        self.target = pick_target(target)
        self._exec: Executor | None = None
        self.cache_hit: bool | None = None  # set by a cached compile: was the artifact in the cache?
        self.cache_key: str | None = None

    @property
    def weights(self) -> bytes:
        if hasattr(self._weights, "tobytes"):  # a plan.WeightsBlob, straight from the compiler
            self._weights = self._weights.tobytes()
        elif callable(self._weights):
            self._weights = self._weights()
        return self._weights

    @property
    def inputs(self) -> list[dict]:
        return self.plan["inputs"]

    @property
    def outputs(self) -> list[dict]:
        return self.plan["outputs"]

    @property
    def stats(self) -> dict:
        return self.plan["stats"]

    def source(self, dialect: str) -> str:
        if dialect not in self._sources:
            if self.kernel_codes is None:  # reopened from a directory that lacks this dialect's file
                raise DlccError(f"the artifact has no {file_name(dialect)} for the {dialect} target (it has "
                                f"{', '.join(file_name(d) for d in self._sources) or 'no kernel sources'}); "
                                "compile the model again")
            self._sources[dialect] = render(self.kernel_codes, dialect)
        return self._sources[dialect]

    def executor(self) -> Executor:
        """The model's executor, built on first use (once, even when threads race to it)."""
        if self._exec is None:
            with _BUILD_LOCK:
                if self._exec is None:
                    rt = make_runtime(self.target)
                    self._exec = Executor(self.plan, self.weights, self.source(rt.dialect), rt, self.binaries)
        return self._exec

    def __call__(self, inputs: dict | None = None, **kw) -> dict[str, np.ndarray]:
        feeds = dict(inputs or {}, **kw)
        return self.executor().run(feeds)

    def run(self, inputs: dict, outputs: str = "host", stream=None, out: dict | None = None) -> dict:
        """One inference on `inputs` (name -> array): numpy (or anything numpy converts), a CUDA
        device array (torch, CuPy, JAX, numba: `__cuda_array_interface__` or DLPack) on the CUDA
        target, a pyopencl array of the model's context on OpenCL. `outputs="device"` (CUDA)
        returns interop.DeviceArray objects (`torch.from_dlpack`, `cupy.asarray`), each its own
        allocation; the default returns numpy arrays. `stream` (CUDA: a torch, CuPy or PyCUDA
        stream, or a raw handle; by default torch's current stream when the inputs are torch CUDA
        tensors) orders the inference after the work queued there. `out` (name -> array: numpy,
        or a device array of the model's target) receives those outputs in place of new arrays.
        A call whose outputs all stay on the device returns without waiting for it (synchronize).
        See docs/interop.md."""
        return self.executor().run(dict(inputs), outputs=outputs, stream=stream, out=out)

    def bind(self, inputs: dict, outputs: str = "host", stream=None, out: dict | None = None):
        """The model's call with these arrays bound once, for a loop that runs it again and again
        on the same buffers: `call = model.bind(feeds, outputs="device")`, then `call()` runs one
        inference on what the bound inputs hold now and returns the same output objects each
        time, overwritten by the next call. The checks are made here, once; on CUDA the whole
        inference, the copies of device inputs and outputs included, is one CUDA graph launch
        per call, so the host's time per call does not grow with the launch count. Host inputs
        must be numpy arrays of exactly the signature's dtype and shape (read in place at each
        call). `outputs`, `out` and `stream` are as for run(). See docs/interop.md."""
        return self.executor().bind(dict(inputs), outputs=outputs, out=out, stream=stream)

    def synchronize(self) -> None:
        """Wait for every inference of this model queued so far. `run(..., outputs="device")`
        returns once its work is queued, before the device finished it; what its device index
        checks find (an index outside its table) is raised here, or by the model's next call."""
        if self._exec is not None:
            self._exec.synchronize()

    def random_state(self) -> tuple[int, int] | None:
        """(key, inference number) the next inference's random draws use; None for a model with
        no draw (docs/random.md)."""
        return self.executor().random_state()

    def set_random_state(self, key: int, inference: int = 0) -> None:
        """Draw from here on as a model loaded with `key` after `inference` inferences: the same
        draws again (a state read by random_state), or a reproducible stream for the unseeded
        random nodes (as torch.manual_seed). Seeded nodes keep their own key."""
        self.executor().set_random_state(key, inference)

    def sample_inputs(self, seed: int = 0) -> dict[str, np.ndarray]:
        meta = self.plan.get("meta", {})
        return sample_inputs(self.inputs, seed, meta.get("int_high"), meta.get("bound_values"),
                             full_masks=bool(meta.get("full_masks")))

    def save(self, out_dir: str | os.PathLike) -> Path:
        if self.kernel_codes is None:
            raise ValueError("this model was loaded from an artifact; copy the directory instead")
        w = self._weights if hasattr(self._weights, "write_to") else self.weights  # stream a blob, do not build it
        return write_artifact(out_dir, self.plan, w, self.kernel_codes, self.binaries)


def compile(model: str | os.PathLike, out: str | os.PathLike | None = None, shapes: dict | None = None,
            target: str = "auto", pipeline: str = "baseline", device: str | None = None, steps=None,
            profile_db: str | os.PathLike | None = None, cache=None, precision: str | None = None,
            tune: bool = False, tune_top: int = 3, tune_repeat: int = 10, dynamic: bool = False,
            max_plans: int = 8, fallback: str | None = None):
    """Compile an ONNX file; writes the artifact directory when `out` is given.

    `dynamic=True` compiles nothing yet: it returns a dlcc.dynamic.DynamicModel, which compiles a
    plan for each distinct set of input shapes it is called with (dims that `shapes` binds stay
    bound) and keeps the `max_plans` most recently used. The other arguments apply to each plan;
    `cache` then keeps the plans in the compile cache, and `out` is refused.

    `fallback="onnxruntime"` returns a dlcc.partition.PartitionedModel instead: the nodes dlcc
    cannot compile (ops it has no lowering for, shapes that depend on values) run on onnxruntime,
    the rest in dlcc segments compiled per shape as with `dynamic=True`; host arrays in and out.
    With `out`, the model is run once on sample inputs (compiling its segments) and saved as an
    artifact that `dlcc.load` reopens (docs/fallback.md).

    `pipeline="auto"` compiles with the built-in pipeline that `dlcc estimate` predicts fastest on
    the target device; the plan's meta records the choice and the reason (``pipeline_choice``).
    `profile_db` (a `dlcc profile` database) gives passes measured kernel times: rammer prices its
    rTasks and its join decisions with them, and the plan records which times were measured.
    `cache` (a dlcc.cache.Cache, a directory, or True for the default one) looks the artifact up
    by content before compiling, and stores it after; it needs `out`. `.cache_hit` says which.
    `precision` ("fp32", "tf32x3", "tf32", "fp16", "bf16"; None: the pipeline's own, fp32 unless it says) is
    what GEMMs and convolutions compute at: the last three run them on tensor cores (emulated on
    OpenCL), and fp16/bf16 store weights and activations in that type (`half_activations: false`
    in a pipeline file keeps activations float32). Any precision asked for (fp32 included) also
    computes a float64 model in float32, its float64 inputs and outputs kept; without one, float64
    is held only where Casts read or write it.
    `tune=True` picks the pipeline by measurement instead (dlcc/tuning.py): each GEMM problem's
    tilings are timed on the target device, then the estimator's `tune_top` best candidates are
    compiled with the fastest tilings and timed (`tune_repeat` runs each), the fastest is
    compiled, and the times are kept in the cache's tuning records, so the same compile does not
    measure again; `pipeline` must then be "auto" (or left at its default).
    """
    from_python = out is None and not isinstance(shapes, (list, tuple))  # (the CLI passes NAME=DIMS strings)
    shapes = _merge_shapes(shapes)
    from .scratch import sweep_once

    sweep_once()  # temporary folders that killed dlcc processes left behind
    if fallback is not None:
        from .partition import PartitionedModel

        if tune:
            raise DlccError("tune=True measures whole-model plans; it does not combine with fallback=")
        kwargs = dict(pipeline=pipeline, device=device, profile_db=profile_db, cache=cache, precision=precision,
                      target=target)
        if out is None:
            return PartitionedModel(model, shapes, kwargs, max_plans, fallback)
        return _save_partitioned(model, Path(out), shapes, kwargs, max_plans, fallback, steps)
    if dynamic:
        from .dynamic import DynamicModel

        if out is not None:
            raise DlccError("dynamic=True compiles a plan per input shape at call time, so there is no one artifact "
                            "to write to out=; give cache= to keep the plans on disk, or bind the shapes and compile "
                            "with out=")
        return DynamicModel(model, shapes, dict(target=target, pipeline=pipeline, device=device, steps=steps,
                                                profile_db=profile_db, cache=cache, precision=precision, tune=tune,
                                                tune_top=tune_top, tune_repeat=tune_repeat), max_plans)
    try:
        return _compile_static(model, out, shapes, target, pipeline, device, steps, profile_db, cache, precision,
                               tune, tune_top, tune_repeat)
    except UnboundDimError as e:
        if not from_python:
            raise
        raise UnboundDimError(f"{e}. In Python, dlcc.compile(..., dynamic=True) instead compiles a plan for each "
                              "input shape at call time") from None


def _save_partitioned(model, out: Path, shapes: dict, kwargs: dict, max_plans: int, fallback: str, steps):
    """compile(..., fallback=, out=): the model split between dlcc and `fallback`, run once on
    sample inputs so that every dlcc segment compiles and every refusal is found, then saved as
    a partition artifact (PartitionedModel.save) and reopened from it. Shapes after a NonZero or
    a NonMaxSuppression depend on values, so a later call may still compile a segment for a shape
    the sample inputs did not give. With a dynamic dim left unbound there are no sample inputs:
    the artifact is saved without plans, and each segment compiles at its first call."""
    from .partition import PartitionedModel
    from .progress import Steps

    steps = steps or Steps()
    with tempfile.TemporaryDirectory(prefix="dlcc-partition-compile-") as scratch:
        # (Through the user's compile cache where there is one, so a second compile finds the plans.)
        cache = kwargs.get("cache") or Path(scratch) / "cache"
        pm = PartitionedModel(model, shapes, dict(kwargs, cache=cache), max_plans, fallback)
        try:
            feeds = pm.sample_inputs(0)
        except ShapeError as e:
            log.info("dlcc: %s; the artifact is saved without plans", e)
            feeds = None
        if feeds is not None:
            try:
                with steps.step(f"compile the dlcc segments and run once (dlcc on {pm.target}, the rest on "
                                f"{fallback})"):
                    pm(feeds)
            except DlccError as e:  # random inputs a model cannot take (a Reshape to fed values)
                warnings.warn(f"dlcc: running {Path(model).name} on the sample inputs failed ({first_line(e)}); the "
                              "artifact keeps what compiled before that, and the rest compiles at its first call",
                              stacklevel=3)
        with steps.step("save the artifact"):
            pm.save(out)
    return PartitionedModel.load(out, target=pm.target)


def _compile_static(model, out, shapes, target, pipeline, device, steps, profile_db, cache, precision, tune, tune_top,
                    tune_repeat) -> CompiledModel:
    tgt = pick_target(target)
    choice = None
    if tune:
        from .tuning import TuningError, tune as measure

        if pipeline not in ("auto", "baseline"):
            raise TuningError(f"--tune chooses the pipeline by measuring the built-in ones; drop --pipeline "
                              f"{pipeline} (or use --pipeline auto)")
        if not Path(model).is_file():
            raise DlccError(f"no such model file: {model}")
        choice = measure(model, shapes, tgt, device, precision, tune_top, tune_repeat, cache, steps)
        from .tuning import pipeline_with

        pipeline = pipeline_with(choice["pipeline"], choice["gemm_tilings"], choice["rammer_options"])
    if cache and out is not None and Path(model).is_file():  # (a missing model: the compile's own error)
        cm = _compile_cached(model, Path(out), shapes, tgt, pipeline, device, steps, profile_db, cache, precision)
    else:
        cm = _compile(model, shapes, tgt, pipeline, device, steps, profile_db, precision=precision)
    if choice is not None:  # (a cached artifact's plan.json keeps the plain pipeline; the result says how)
        cm.plan["meta"]["pipeline_choice"] = choice
    if out is not None and not (cache and Path(model).is_file()):
        cm.save(out)
    return cm


def cache_key(model, shapes: dict, tgt: str, pipeline, device, profile_db=None, cache=True, precision=None):
    """(Cache, key, key parts) of one compile: what `_compile_cached` and `dlcc batch`'s pre-check
    (dlcc.batch.runner.try_hit, which answers warm jobs without a worker) both look up.
    `tgt` is already resolved (pick_target)."""
    from .cache import Cache
    from .config import builtin_names, load_pipeline, precision_asked, with_precision
    from .devices import resolve_device

    c = Cache.of(cache)
    names = builtin_names("pipelines") if pipeline == "auto" else [pipeline]
    pipes = [n if hasattr(n, "model_dump_json") else load_pipeline(n) for n in names]
    pipe_text = "\n".join(with_precision(p, precision).model_dump_json()
                          + ("\nprecision asked" if precision_asked(p, precision) else "") for p in pipes)
    dev = resolve_device(device, tgt)[0]
    if profile_db is None:  # the measurements the device spec comes with change the plan as a given one does
        from .config import device_profile_db

        profile_db = device_profile_db(dev)
    nvcc = None
    if tgt == "cuda":
        from .backends.nvcc import nvcc_version

        nvcc = nvcc_version()
    key, parts = c.artifact_key(model, shapes, pipe_text, dev.model_dump_json(), tgt, profile_db, nvcc)
    return c, key, parts


def _compile_cached(model, out: Path, shapes, tgt, pipeline, device, steps, profile_db, cache,
                    precision=None) -> CompiledModel:
    """Content-addressed compile (dlcc/cache.py): a hit hard-links the cached artifact to `out`; a
    miss compiles into the cache (under the key's lock, so concurrent compiles of one key run
    once) and then links it out. The cubins below it are cached by build_cuda_binary."""
    from .cache import materialise
    from .progress import Steps

    steps = steps or Steps()
    with steps.step("cache lookup"):
        c, key, parts = cache_key(model, shapes, tgt, pipeline, device, profile_db, cache, precision)
    with c.lock(key):
        hit = c.lookup("artifacts", key)
        if hit is None:
            cm = _compile(model, shapes, tgt, pipeline, device, steps, profile_db, cache=c, precision=precision)
            with steps.step("cache store"):
                entry = c.store("artifacts", key, parts, cm.save)
        else:
            entry = hit
        with steps.step("materialise artifact" if hit else "link artifact"):
            materialise(entry, out)
    res = load(out, target=tgt)
    res.cache_hit, res.cache_key = hit is not None, key
    return res


def _compile(model, shapes, tgt, pipeline, device, steps, profile_db, cache=None, precision=None) -> CompiledModel:
    from .compiler import compile_model
    from .devices import resolve_device

    choice, imported = None, None
    if pipeline == "auto":
        from .estimate.plan_mode import choose_pipeline

        dev = resolve_device(device, tgt)[0]
        pipeline, est = choose_pipeline(model, shapes, dev, steps=steps, precision=precision, profile_db=profile_db)
        choice = {"chosen": pipeline, "why": est.why(), "device": est.device,
                  "ranking": [{"name": p.name, "predicted_ms": p.predicted_us / 1e3} for p in est.pipelines]}
        imported = est.imported
    res = compile_model(model, shapes, target=tgt, pipeline=pipeline, device=device, steps=steps, imported=imported,
                        profile_db=profile_db, cache=cache, precision=precision)
    if choice:
        res.plan["meta"]["pipeline_choice"] = choice
    from .inputs import gather_bounds

    res.plan["meta"]["int_high"] = gather_bounds(res.state.graph)
    if res.state.graph.full_masks:
        res.plan["meta"]["full_masks"] = True
    return CompiledModel(res.plan, res.weights, res.kernel_codes, target=tgt, binaries=res.binaries)


def _merge_shapes(shapes) -> dict:
    """Bindings from a dict, or from a list of NAME=DIMS strings and YAML files of bindings."""
    from .frontend import parse_shape_binding

    if isinstance(shapes, (list, tuple)):
        from .config import load_shape_bindings

        merged: dict = {}
        for s in shapes:
            # A binding is NAME=DIMS, or a YAML file of bindings (`shapes: {name: [dims]}`).
            if str(s).endswith((".yaml", ".yml")):
                merged.update(load_shape_bindings(s))
            else:
                merged.update([parse_shape_binding(s)])
        shapes = merged
    return {k: tuple(int(d) for d in (v if isinstance(v, (list, tuple)) else (v,))) for k, v in (shapes or {}).items()}


def load(path: str | os.PathLike, target: str = "auto"):
    """Reopen an artifact directory written by `dlcc compile` or `CompiledModel.save` (a
    CompiledModel), or by `dlcc compile --fallback` (a dlcc.partition.PartitionedModel)."""
    from .partition import MANIFEST, PartitionedModel

    if (Path(path) / MANIFEST).is_file():
        return PartitionedModel.load(path, target=target)
    plan, weights, sources = read_artifact(path)
    return CompiledModel(plan, weights, None, sources, target=target, binaries=read_binaries(path, plan))
