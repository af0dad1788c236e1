"""The compile driver: import → supported-op check → passes from the pipeline YAML → plan + sources."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import threading
from pathlib import Path
from dataclasses import dataclass

from . import __version__
from . import ops as _ops  # noqa: F401  (registers every op)
from .config import DeviceSpec, PipelineSpec, check_precision, load_pipeline, precision_asked, with_precision
from .errors import CompileError, ConfigError, UnsupportedOpsError
from .frontend import ShapeBindings, check_static, dtype_problems, import_model
from .ir import Graph
from .ops.registry import lookup
from .passes import PASSES, CompileState, check_order
from .kernels.program import MAX_KERNEL_ARGS, address_wide_launches
from .plan import build_plan, kernel_sources
from .progress import Steps
from .random_draws import STATE


def check_supported(graph: Graph) -> None:
    """One error listing every unsupported op type (count and first node) and unsupported dtype."""
    bad: dict[str, tuple[int, str]] = {}
    for n in graph.nodes:
        if n.op_type in ("Shape", "Size") and n.domain in ("", "ai.onnx"):
            continue  # left unfolded only where its input's shape is unknown: check_static says why
        entry = lookup(n.op_type, graph.opset, n.domain)
        key = None
        if entry is None:
            key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}"
        elif n.inputs and (entry.dtypes or entry.float_only) \
                and graph.tensors[n.inputs[0]].dtype not in (entry.dtypes or ("float32",)):
            key = f"{n.op_type}({graph.tensors[n.inputs[0]].dtype})"
        if key is not None:
            c, first = bad.get(key, (0, n.name))
            bad[key] = (c + 1, first)
    dt = dtype_problems(graph)
    if bad or dt:
        if not bad:
            from .errors import UnsupportedDtypesError

            raise UnsupportedDtypesError("the model uses tensor dtypes dlcc cannot compile yet:\n" + "\n".join(dt))
        raise UnsupportedOpsError(bad, dt)


def _file_digest(path) -> str:
    """sha256[:16] of the model file, memoized by (path, size, mtime): `dlcc estimate` and
    `--pipeline auto` compile one model several times, and BERT-base is 440 MB to hash."""
    st = os.stat(path)
    return _digest_of(os.path.abspath(path), st.st_size, st.st_mtime_ns)


class _Digest(threading.Thread):
    def __init__(self, path):
        super().__init__(daemon=True)
        self.path, self.value, self.error = path, None, None
        self.start()

    def run(self):
        try:
            self.value = _file_digest(self.path)
        except Exception as e:  # a missing file: the import reports it; result() raises it otherwise
            self.error = e

    def result(self) -> str:
        self.join()
        if self.error is not None:
            raise self.error
        return self.value


@functools.lru_cache(maxsize=32)
def _digest_of(path: str, size: int, mtime_ns: int) -> str:
    from .cache import sha256_file

    return sha256_file(path)[:16]


@dataclass
class CompileResult:
    plan: dict
    weights: "WeightsBlob"  # plan.WeightsBlob: .tobytes() or .write_to(file)
    kernel_codes: list[str]
    state: CompileState
    binaries: dict[str, bytes] | None = None  # extra artifact files: cubin, nvcc log


def build_cuda_binary(plan: dict, kernel_codes: list[str], dev: DeviceSpec, cache=None) -> dict[str, bytes]:
    """Compile the CUDA text for the device's arch with nvcc, when nvcc is here: the cubin goes into
    the artifact (PyCUDA loads it instead of compiling at start-up), and ptxas' registers, shared
    memory and spills per kernel, with the resulting blocks per SM, go into the plan."""
    from .backends.nvcc import blocks_per_sm, build_cubin, find_nvcc
    from .backends.source import render

    if not dev.arch or not find_nvcc():
        return {}
    source = render(kernel_codes, "cuda")
    usage, cubin, log = cached_cubin(source, dev.arch, cache) if cache else build_cubin(source, dev.arch)
    blocks = {k["name"]: k["block"] for k in plan["kernels"]}
    spills = kernel_spills(usage, blocks)
    plan["cuda"] = {
        "arch": dev.arch,
        "cubin": f"kernels.{dev.arch}.cubin",
        "resources": {name: {"registers": u.registers, "smem_bytes": u.smem_bytes, "spill_bytes": spills.get(name, 0),
                             "blocks_per_sm": blocks_per_sm(u, blocks[name], dev)}
                      for name, u in usage.items() if name in blocks},
    }
    serialized = wgmma_serialized(log)
    if serialized:
        plan["cuda"]["wgmma_serialized"] = serialized
    return {plan["cuda"]["cubin"]: cubin, "nvcc.log": log.encode()}


def wgmma_serialized(log: str) -> dict[str, str]:
    """{kernel: why} for the kernels in which ptxas serialized the wgmma instructions (its
    performance warning C7510: each then waits for the one before, and Hopper's warpgroup MMA
    loses its overlap; kernels/gemm_wgmma.py). dlcc's kernels are written not to trigger it."""
    return {fn: why.strip() for why, fn in
            re.findall(r"C7510\)[^\n]*?serialized due to ([^\n]*?) in the function '(\w+)'", log)}


def kernel_spills(usage: dict, kernels) -> dict[str, int]:
    """{kernel: bytes of register spill stores and loads} for the kernels that spill, counting the
    out-of-line call sites of a persistent kernel (ptxas lists each under a mangled name holding
    the kernel's, `..._site3...`) with their kernel: BERT-base's persistent kernel once spilled
    only inside three call sites, which a per-entry count showed as none."""
    out: dict[str, int] = {}
    names = sorted(kernels, key=len, reverse=True)  # the longest name a mangled one holds is its kernel
    for fn, u in usage.items():
        n = u.spill_stores + u.spill_loads
        if not n:
            continue
        owner = fn if fn in kernels else next((k for k in names if f"{k}_site" in fn), None)
        if owner is not None:
            out[owner] = out.get(owner, 0) + n
    return out


def cached_cubin(source: str, arch: str, cache):
    """build_cubin through the kernel-binary cache (dlcc/cache.py `cubins/`): keyed by the source,
    the arch and nvcc's version; the source and nvcc's log are kept beside each cubin."""
    import dataclasses

    from .backends.nvcc import Usage, build_cubin, nvcc_version

    key = hashlib.sha256(f"{arch}\n{nvcc_version()}\n{source}".encode()).hexdigest()
    with cache.lock(key):
        hit = cache.lookup("cubins", key)
        if hit is None:
            usage, cubin, log = build_cubin(source, arch)

            def write(d: Path) -> None:
                d.mkdir()
                (d / "kernels.cubin").write_bytes(cubin)
                (d / "kernels.cu").write_text(source)
                (d / "nvcc.log").write_text(log)
                (d / "usage.json").write_text(json.dumps({k: dataclasses.asdict(u) for k, u in usage.items()}))

            cache.store("cubins", key, {"arch": arch, "nvcc": nvcc_version()}, write)
            return usage, cubin, log
    usage = {k: Usage(**u) for k, u in json.loads((hit / "usage.json").read_text()).items()}
    return usage, (hit / "kernels.cubin").read_bytes(), (hit / "nvcc.log").read_text()


def _input_index_checks(checks: list[dict], graph) -> list[dict]:
    """The lowering's index checks with each input given by its position in the plan's inputs
    (how the executor finds the array) and by its name (for the error)."""
    order = {n: k for k, n in enumerate(graph.inputs)}
    return [{**c, "input": order[c["input"]], "name": c["input"]} for c in checks if c["input"] in order]


def _split_gemms(state) -> dict[str, int]:
    """{tiling: launches} of the plan's GEMMs split along K (kernels/splitk.py), persistent kernels'
    rTasks included: what `inspect` lists."""
    from .kernels.splitk import count

    return count(state.ctx.program) if state.ctx is not None else {}


def _check_reads(state, after: str) -> None:
    """After every pass: no launch reads a tensor before a launch wrote it (KernelProgram.
    unwritten_read). A pass that breaks this is a dlcc bug; it fails the compile, naming the pass,
    instead of running a kernel on bytes nothing wrote."""
    if state.ctx is None:
        return
    g = state.graph
    ready = set(g.inputs) | {name for name, t in g.tensors.items()
                             if t.value is not None or (t.shape is not None and t.size == 0)}  # empty: nothing to read
    ready.add(STATE)  # (the random state: set when the plan is loaded, random_draws.py)
    bad = state.ctx.program.unwritten_read(ready, state.ctx.resolve)
    if bad is not None:
        L, t = bad
        raise CompileError(f"after the {after!r} pass, launch {L.kernel} ({L.op_type} node {L.node!r}) reads "
                            f"tensor {t!r} before any launch writes it (a dlcc bug)")


def import_checked(model, shapes, float64: bool = False):
    """The imported Graph, after the checks every compile makes: supported ops, static shapes, and
    the attribute checks (ops/checks.py) once more on the final graph. import_model ran them on
    the model as written, where some shapes may still be unknown (the output of an Expand whose
    shape only folding finds); a check that needs a shape it did not have then passed silently,
    and an axis of 2^32 reached a lowering as an IndexError."""
    from .ops.checks import check_attributes

    graph = import_model(model, shapes, float64=float64)
    check_supported(graph)
    check_static(graph, model)
    check_attributes(graph, model)
    return graph


def _model_precision(pipe: PipelineSpec, asked: str | None, graph, dev: DeviceSpec,
                     target: str) -> tuple[PipelineSpec, str | None]:
    """A float16 or bfloat16 model computes at its own precision where no precision was asked for
    (`asked`, nor `precision:` in the pipeline file), as TensorRT's strongly typed networks and
    torch.compile on a half model do: fp16 or bf16 tensor cores on a CUDA device that has them.
    Elsewhere (OpenCL, where the mma instructions are only emulated, or an older GPU) it computes
    in float32, and the returned note says so."""
    from .ops.narrow import HALF_DTYPES

    if precision_asked(pipe, asked):
        return pipe, None
    halves = {graph.tensors[n].dtype for n in graph.inputs + graph.outputs} & set(HALF_DTYPES.values())
    if len(halves) != 1:
        return pipe, None
    half = halves.pop()
    own = next(p for p, d in HALF_DTYPES.items() if d == half)
    try:
        if check_precision(own, dev, target) is None:
            return with_precision(pipe, own), (f"precision {own}: the model's own ({half}); "
                                               "--precision fp32 computes it in float32")
    except ConfigError:
        pass
    return pipe, (f"a {half} model computes in float32 on {target} ({dev.name}), which has no {own.upper()} "
                  f"tensor cores; --precision {own} asks for them (emulated on OpenCL)")


def compile_model(model: str | os.PathLike, shapes: ShapeBindings | None = None, target: str = "opencl",
                  pipeline: str | PipelineSpec = "baseline", device: str | DeviceSpec | None = None,
                  steps: Steps | None = None, imported=None, profile_db=None, cache=None,
                  precision: str | None = None, graphs: bool | None = None) -> CompileResult:
    """Import (unless `imported`, a Graph from `import_checked`, is given: the estimator imports once
    and compiles a copy per pipeline), run the pipeline's passes, and build the plan. `profile_db`
    (a path or ProfileDB) gives passes measured launch times: rammer prices its rTasks with them.
    `precision` (config.PRECISIONS) overrides the pipeline's own. `graphs`: whether passes plan for
    the launches replayed as one CUDA graph (None: the pipeline's `graphs` on the CUDA target; the
    estimator, which builds its plans for OpenCL, says so for a GPU device)."""
    steps = steps or Steps()
    pipe = with_precision(pipeline if isinstance(pipeline, PipelineSpec) else load_pipeline(pipeline), precision)
    from .devices import resolve_device

    dev, device_key, device_from = resolve_device(device, target)
    precision_note = check_precision(pipe.precision, dev, target)
    if profile_db is None:  # the measurements the device spec comes with, if any
        from .config import device_profile_db

        profile_db = device_profile_db(dev)
    if profile_db is not None and not hasattr(profile_db, "lookup"):
        from .estimate.profiledb import ProfileDB

        profile_db = ProfileDB.load(profile_db)
    # The model's sha256 (in the plan's meta) is 0.25 s for BERT-base: hash it on a thread while
    # the import runs (hashlib releases the GIL on large buffers).
    digest_thread = _Digest(model)
    if imported is not None:
        graph = imported
    else:
        with steps.step("import + fold + infer shapes"):
            graph = import_checked(model, shapes, float64=precision_asked(pipe, precision))
    pipe, note = _model_precision(pipe, precision, graph, dev, target)
    precision_note = note or precision_note
    state = CompileState(graph=graph, device=dev, profile_db=profile_db, precision=pipe.precision,
                         fp32_ops=tuple(pipe.fp32_ops), half_activations=pipe.half_activations,
                         graphs=pipe.graphs and (target == "cuda" if graphs is None else graphs),
                         joins=any(p.name == "rammer" for p in pipe.passes))
    state.log.extend(graph.notes)
    if precision_note:
        state.log.append(precision_note)
    check_order([p.name for p in pipe.passes], f"pipeline {pipe.name!r}")  # also for specs built in code
    for p in pipe.passes:
        entry = PASSES[p.name]
        opts = entry.check_options(p.options, f"pipeline {pipe.name}: pass {p.name}")
        with steps.step(f"pass {p.name}"):
            entry.run(state, opts)
        _check_reads(state, p.name)
    if state.ctx is None or state.memory is None:
        raise ConfigError(f"pipeline {pipe.name!r} must include the 'lower' and 'memplan' passes")
    wide, unread = address_wide_launches(state.ctx.program)
    if wide:
        state.log.append(f"plan: {wide} launch(es) of more than {MAX_KERNEL_ARGS} tensors address them by storage")
    if unread:
        state.log.append(f"plan: kernel(s) {', '.join(unread)} keep more than {MAX_KERNEL_ARGS} tensor parameters: "
                         "their signature was not understood (a dlcc bug; a device with room for them runs them)")
    digest = digest_thread.result()
    # float64 inputs the plan computes in float32 (the run warns of values beyond its range)
    narrowed = [n for n in graph.inputs if graph.tensors[n].dtype == "float64"] if precision_asked(pipe, precision) else []
    meta = {
        "dlcc_version": __version__,
        "model": os.path.basename(str(model)),
        "model_sha256_16": digest,
        "pipeline": pipe.name,
        "precision": pipe.precision,
        "graphs": pipe.graphs,  # the CUDA runtime replays the launches as one CUDA graph
        **({"precision_note": precision_note} if precision_note else {}),
        "device": dev.name,
        "device_key": device_key,
        "device_from": device_from,
        "target": target,
        "shapes": {k: list(v) for k, v in (shapes or {}).items()},
        **({"bound_values": graph.bound_values} if graph.bound_values else {}),
        "opset": graph.opset,
        "pass_log": state.log,
        **({"float32_compute": state.ctx.kept_float32} if pipe.precision != "fp32" else {}),
        **({"split_k": split} if (split := _split_gemms(state)) else {}),
        **({"float32_activation_ops": state.ctx.float32_activation_ops}
           if state.ctx is not None and state.ctx.float32_activation_ops else {}),
        **({"float32_inputs": narrowed} if narrowed else {}),
        **({"float32_range_activations": len(state.ctx.float32_range)}
           if state.ctx is not None and state.ctx.float32_range else {}),
        **({"index_checks": _input_index_checks(state.ctx.index_checks, graph)} if state.ctx.index_checks else {}),
        **({"device_index_checks": state.ctx.device_index_checks} if state.ctx.device_index_checks else {}),
        **({"random_draws": state.ctx.draws} if state.ctx.draws else {}),
        **({"profile_db": profile_db.name} if profile_db is not None else {}),
        "compile_s": {k: round(v, 4) for k, v in steps.times.items()},
    }
    with steps.step("build plan"):
        plan, weights = build_plan(state, meta)
    codes = kernel_sources(state)
    binaries = {}
    if target == "cuda" and dev.arch:
        with steps.step(f"nvcc {dev.arch} (cubin + resource usage)"):
            binaries = build_cuda_binary(plan, codes, dev, cache)
    plan["meta"]["compile_s"] = {k: round(v, 4) for k, v in steps.times.items()}
    return CompileResult(plan, weights, codes, state, binaries)
