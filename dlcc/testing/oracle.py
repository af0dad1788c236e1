"""The differential oracle: one model through every pipeline and option set, against onnxruntime.

A verdict per configuration (NNSmith keeps crashes and wrong results apart, and so does this):
- `pass`: every graph output matches onnxruntime under `dlcc verify`'s rule;
- `mismatch`: an output differs, is missing, or has another shape or dtype;
- `crash`: an exception that is not a DlccError (a traceback a user would see), or a DlccError
  that blames dlcc itself (the OpenCL compiler rejecting generated kernels);
- `refused`: a clear DlccError on a graph the generator believes dlcc supports (not a failure,
  but counted: each is a gap to close or a generator rule to fix);
- `unstable`: dlcc and onnxruntime differ, but the graph is ill-conditioned there: computed in
  float64 (onnx.reference), dlcc's answer is as close to the exact one as float32 rounding
  allows, measured by onnxruntime's own error and by a Monte Carlo rounding analysis
  (rounding.py). An E[x²] - mean² variance of nearly equal values, for example. Not a failure,
  and counted, so that a generator rule can avoid such graphs;
- `hang`: set by pool.py when a case runs past its timeout;
- `spill` (the `nvcc` target only, which compiles the CUDA text without running it): nvcc built a
  kernel with register spills.

Configurations that give the same plan (kernels, launches and weights, which hold Rammer's
schedule table) are run once: a graph without reductions, say, has the same plan under many
`schemes` subsets, and the duplicate's verdict is the first one's.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import tempfile
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx

from .rounding import float64_reference, pruned_to, rounding_spread  # noqa: F401  (float64_reference: re-exported)

SCHEMES = ("independent", "local", "regional", "global")
FAILURES = ("mismatch", "crash", "hang", "spill")


@dataclass(frozen=True)
class Config:
    """A built-in pipeline with some pass options changed, at a precision ("NAME@tf32": its GEMMs
    on the tensor-core template, judged at that precision's tolerance and rounding)."""

    name: str
    base: str
    overrides: tuple = ()  # ((pass name, option, value), ...)
    precision: str = "fp32"
    # The DeviceSpec the plan is made for (None: the target's own, pocl-cpu on PoCL). A GPU's plan
    # run on PoCL checks what only GPU plans have: split-K GEMMs, the GPU-only tilings.
    device: str | None = None

    def spec(self):
        from ..config import PassSpec, PipelineSpec, load_pipeline

        p = load_pipeline(self.base)
        passes = []
        for ps in p.passes:
            opts = dict(ps.options)
            for name, key, value in self.overrides:
                if name == ps.name:
                    opts[key] = list(value) if isinstance(value, tuple) else value
            passes.append(PassSpec(name=ps.name, options=opts))
        return PipelineSpec(name=self.name, description=p.description, passes=passes, precision=self.precision)

    def as_dict(self) -> dict:
        return {"name": self.name, "base": self.base, "overrides": [list(o) for o in self.overrides],
                "precision": self.precision, **({"device": self.device} if self.device else {})}

    @staticmethod
    def from_dict(d: dict) -> "Config":
        return Config(d["name"], d["base"], tuple((a, b, tuple(c) if isinstance(c, list) else c)
                                                  for a, b, c in d.get("overrides", [])), d.get("precision", "fp32"),
                      d.get("device"))


def all_configs() -> list[Config]:
    """Every pipeline (Rammer's joins forced too), and astitch with every `schemes` subset and
    without GEMM fusion. Simplest first: shrinking prefers the earliest that still fails."""
    out = [Config("baseline", "baseline"), Config("astitch", "astitch"), Config("rammer", "rammer"),
           Config("full", "full"), Config("rammer-join-always", "rammer", (("rammer", "join", "always"),)),
           Config("full-join-always", "full", (("rammer", "join", "always"),)),
           Config("full-join-always-counters", "full", (("rammer", "join", "always"), ("rammer", "sync", "counters"))),
           Config("astitch-no-gemm-fusion", "astitch", (("astitch", "gemm_fusion", False),)),
           Config("baseline-for-h100", "baseline", device="h100"), Config("astitch-for-h100", "astitch", device="h100"),
           Config("full-for-h100", "full", device="h100")]
    for k in range(1, len(SCHEMES)):
        for sub in itertools.combinations(SCHEMES, k):
            out.append(Config("astitch[" + ",".join(sub) + "]", "astitch", (("astitch", "schemes", sub),)))
    return out


def config_named(name: str) -> Config:
    """A configuration of all_configs() by name, or "NAME@PRECISION" for it at that precision."""
    from ..config import BUILT_PRECISIONS

    base, _, precision = name.partition("@")
    if precision and precision not in BUILT_PRECISIONS:
        raise KeyError(f"fuzz configuration {name!r}: unknown precision {precision!r}; "
                       f"built ones: {', '.join(BUILT_PRECISIONS)}")
    for c in all_configs():
        if c.name == base:
            return replace(c, name=name, precision=precision) if precision else c
    raise KeyError(f"no fuzz configuration {name!r}; known: {', '.join(c.name for c in all_configs())} "
                   f"(each also as NAME@tf32, NAME@fp16, NAME@bf16)")


@dataclass
class Verdict:
    config: str
    status: str  # pass | mismatch | crash | refused | hang
    detail: str = ""
    same_as: str | None = None  # the configuration whose identical plan gave this verdict
    errors: list = field(default_factory=list)  # per output: max abs / rel error

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v not in (None, [], "")}


def _fingerprint(cm) -> str:
    h = hashlib.sha256()
    for code in cm.kernel_codes or []:
        h.update(code.encode())
    h.update(json.dumps(cm.plan["launches"], sort_keys=True, default=str).encode())
    w = cm.weights
    h.update(w if isinstance(w, (bytes, bytearray)) else bytes(w))
    return h.hexdigest()


def compare_outputs(model: onnx.ModelProto, got: dict, refs: dict, precision: str = "fp32") -> tuple[bool, str, list]:
    """Every graph output of `model` (not dlcc's own list), under verify's rule at `precision`'s
    default tolerance (a float16 or bfloat16 output's at least its type's, as verify takes it)."""
    from ..verify import compare, default_tolerance

    names = [o.name for o in model.graph.output]
    ok, notes, errs = True, [], []
    for extra in sorted(set(got) - set(names)):
        ok = False
        notes.append(f"dlcc returned {extra!r}, which is not a graph output")
    for n in names:
        if n not in got:
            ok = False
            notes.append(f"output {n!r} is missing")
            continue
        g, r = np.asarray(got[n]), refs[n]
        if g.dtype != r.dtype:
            ok = False
            notes.append(f"output {n!r}: dtype {g.dtype}, onnxruntime's is {r.dtype}")
            continue
        row = compare(n, g, r, *default_tolerance(precision, str(r.dtype)))
        errs.append({"output": n, "max_abs_err": row["max_abs_err"], "max_rel_err": row["max_rel_err"]})
        if not row["passed"]:
            ok = False
            notes.append(f"output {n!r}: max abs err {row['max_abs_err']:.3g}, max rel err {row['max_rel_err']:.3g}"
                         + (f" ({row['note']})" if row.get("note") else ""))
    return ok, "; ".join(notes), errs


def check_model(model: onnx.ModelProto, feeds: dict, refs: dict, configs: list[Config], target: str = "opencl",
                workdir: str | None = None) -> list[Verdict]:
    """Compile and run `model` through each configuration on `target`, in this process.

    On OpenCL the distinct plans' kernels are built together, as few programs as their names
    allow (two plans may give different code one name: a persistent kernel bound to another memory
    plan), since a program build costs PoCL about half a second however small it is. The kernel
    text each plan runs is exactly what it would run alone."""
    import dlcc
    from ..errors import CompileError, DlccError

    if target == "nvcc":
        return check_nvcc(model, configs, workdir)
    with tempfile.TemporaryDirectory(dir=workdir) as d:
        path = Path(d) / "model.onnx"
        onnx.save(model, str(path))
        verdicts: dict[str, Verdict] = {}
        plans: list[tuple[Config, object]] = []  # one per distinct plan
        first_of: dict[str, str] = {}  # fingerprint -> the configuration that first gave it
        same: dict[str, str] = {}
        for cfg in configs:
            try:
                cm = dlcc.compile(str(path), target=target, pipeline=cfg.spec(), device=cfg.device)
            except CompileError as e:
                verdicts[cfg.name] = Verdict(cfg.name, "crash", f"CompileError: {e}")
                continue
            except DlccError as e:
                verdicts[cfg.name] = Verdict(cfg.name, "refused", f"{type(e).__name__}: {e}")
                continue
            except Exception:
                verdicts[cfg.name] = Verdict(cfg.name, "crash", "compile: " + traceback.format_exc(limit=8))
                continue
            fp = _fingerprint(cm)
            if fp in first_of:
                same[cfg.name] = first_of[fp]
                continue
            first_of[fp] = cfg.name
            plans.append((cfg, cm))
        for group in (_program_groups(plans) if target == "opencl" else [[p] for p in plans]):
            rt = _shared_runtime(group) if len(group) > 1 else None
            for cfg, cm in group:
                verdicts[cfg.name] = _run(cm, model, feeds, refs, cfg, rt, path=path, target=target)
        out = []
        for cfg in configs:
            if cfg.name in same:
                v = verdicts[same[cfg.name]]
                out.append(Verdict(cfg.name, v.status, v.detail, same_as=v.config, errors=v.errors))
            else:
                out.append(verdicts[cfg.name])
        return out


#: The `nvcc` target: the CUDA text of each plan for these devices, through nvcc for their arch.
NVCC_DEVICES = (("h100", "sm_90"), ("a100", "sm_80"))


def check_nvcc(model: onnx.ModelProto, configs: list[Config], workdir: str | None = None) -> list[Verdict]:
    """The `nvcc` target, for machines without a GPU: each configuration's CUDA plan for an H100
    (sm_90) and an A100 (sm_80), compiled by nvcc. Nothing runs, so the verdict is about the code:
    `pass` when nvcc builds it with no register spills; `spill` when a kernel spills (every kernel
    dlcc emits must fit its registers); `crash` when nvcc rejects it or the compile fails;
    `refused` on a clear DlccError, as on OpenCL. Identical sources are compiled once (the cubin
    cache, dlcc/cache.py)."""
    from ..backends.nvcc import find_nvcc
    from ..cache import Cache
    from ..compiler import compile_model
    from ..errors import CompileError, DlccError

    if not find_nvcc():
        return [Verdict(c.name, "refused", "nvcc is not installed here") for c in configs]
    out = []
    with tempfile.TemporaryDirectory(dir=workdir) as d:
        path = Path(d) / "model.onnx"
        onnx.save(model, str(path))
        cache = Cache(Path(d) / "cache")
        done: dict[tuple, Verdict] = {}
        # a configuration made for a GPU device builds the same plans here as the one without it
        for cfg in sorted(configs, key=lambda c: c.device is not None):
            key = (cfg.base, cfg.overrides, cfg.precision)
            if cfg.device and key in done:
                v = done[key]
                out.append(Verdict(cfg.name, v.status, v.detail, same_as=v.config))
                continue
            v = Verdict(cfg.name, "pass", "")
            for device, arch in NVCC_DEVICES:
                try:
                    cm = compile_model(str(path), target="cuda", pipeline=cfg.spec(), device=device, cache=cache)
                except CompileError as e:
                    v = Verdict(cfg.name, "crash", f"{arch}: CompileError: {e}")
                    break
                except DlccError as e:
                    v = Verdict(cfg.name, "refused", f"{arch}: {type(e).__name__}: {e}")
                    break
                except Exception:
                    v = Verdict(cfg.name, "crash", f"{arch}: compile: " + traceback.format_exc(limit=8))
                    break
                res = cm.plan.get("cuda", {}).get("resources", {})
                spills = {k: r["spill_bytes"] for k, r in res.items() if r.get("spill_bytes")}
                if cm.plan.get("cuda", {}).get("arch") != arch:
                    v = Verdict(cfg.name, "crash", f"{arch}: no cubin was built (the plan says "
                                f"{cm.plan.get('cuda', {}).get('arch')!r})")
                    break
                if spills:
                    v = Verdict(cfg.name, "spill", f"{arch}: register spills (bytes) in {spills}")
                    break
            done.setdefault(key, v)
            out.append(v)
    order = {c.name: i for i, c in enumerate(configs)}
    return sorted(out, key=lambda v: order[v.config])


_DEFINES = re.compile(r"^(?:KERNEL|DEVICE|SITE_FN)\b[^(;]*?\b(\w+)\s*\(", re.M)


def _functions(code: str) -> list[str]:
    return _DEFINES.findall(re.sub(r"LAUNCH_BOUNDS\([^)]*\)", "", code))


def _program_groups(plans: list) -> list[list]:
    """Plans whose kernels can share one program: no function (a kernel, or a device function such
    as an rTask that a persistent kernel also defines) defined by two different codes."""
    groups: list[tuple[list, dict, dict]] = []  # (members, kernel name -> code, function -> code)
    for cfg, cm in plans:
        codes = dict(zip((k["name"] for k in cm.plan["kernels"]), cm.kernel_codes))
        new = {c for n, c in codes.items()}
        for members, kcodes, fdefs in groups:
            fresh = [c for c in new if c not in kcodes.values()]
            if all(fdefs.get(f, c) == c for c in fresh for f in _functions(c)):
                members.append((cfg, cm))
                kcodes.update(codes)
                fdefs.update({f: c for c in fresh for f in _functions(c)})
                break
        else:
            groups.append(([(cfg, cm)], dict(codes), {f: c for c in new for f in _functions(c)}))
    return [m for m, _, _ in groups]


class _Prebuilt:
    """One plan's view of a runtime whose program (the kernels of several plans) is built: the
    context, queue and kernels are shared; the sub-buffer views are the plan's own (the runtime
    keys them by buffer id, and a freed buffer's id can come back in the next plan)."""

    def __init__(self, rt):
        self._rt = rt
        self._views = {}

    def compile(self, source, plan=None, binaries=None) -> None:
        pass

    def view(self, buf, offset: int, nbytes: int):
        from ..backends.opencl import OpenCLRuntime

        return OpenCLRuntime.view(self, buf, offset, nbytes)  # its logic, on this plan's own views

    def __getattr__(self, name):
        return getattr(self._rt, name)


def _shared_runtime(group: list):
    """One runtime holding every kernel of the group's plans; None if that build fails (each plan
    is then built alone, so a compile error is blamed on the plan that has it)."""
    from ..backends.opencl import OpenCLRuntime
    from ..backends.source import render
    from ..errors import DlccError

    codes: dict[str, str] = {}
    for _, cm in group:
        codes.update(zip((k["name"] for k in cm.plan["kernels"]), cm.kernel_codes))
    try:
        rt = OpenCLRuntime()
        # which kernels are persistent or spin: the runtime builds those its own way (backends/opencl.py)
        kernels = [k for _, cm in group for k in cm.plan["kernels"]]
        launches = [L for _, cm in group for L in cm.plan["launches"]]
        rt.compile(render(list(codes.values()), "opencl"), {"kernels": kernels, "launches": launches})
        return rt
    except DlccError:
        return None


def _run(cm, model, feeds, refs, cfg, rt=None, path=None, target="opencl") -> Verdict:
    """One plan's verdict; `rt`: a runtime its kernels are already built in (else its own); `path`:
    the model's file, for verify's quantization judge (_quantization_judged)."""
    from ..errors import CompileError, DlccError
    from ..executor import Executor

    try:
        if rt is not None:
            got = Executor(cm.plan, cm.weights, "", _Prebuilt(rt), cm.binaries).run(feeds)
        else:
            got = cm(feeds)
    except CompileError as e:
        return Verdict(cfg.name, "crash", f"CompileError: {e}")
    except DlccError as e:
        return Verdict(cfg.name, "refused", f"run: {type(e).__name__}: {e}")
    except Exception:
        return Verdict(cfg.name, "crash", "run: " + traceback.format_exc(limit=8))
    ok, notes, errs = compare_outputs(model, got, refs, cfg.precision)
    why = "" if ok else conditioning_explains(model, feeds, got, refs, cfg.precision)
    if why:
        return Verdict(cfg.name, "unstable", f"{notes} | explained by rounding: {why}", errors=errs)
    judged = "" if ok or path is None else _quantization_judged(path, model, got, feeds, refs, cm, cfg, target)
    if judged:
        return Verdict(cfg.name, "pass", f"{notes} | {judged}", errors=errs)
    return Verdict(cfg.name, "pass" if ok else "mismatch", notes, errors=errs)


def _quantization_judged(path, model, got, feeds, refs, cm, cfg, target) -> str:
    """verify's judge for quantized models (dlcc/quant_judge.py), on a graph with quantizers whose
    outputs missed: a value quantized one step apart at a rounding tie is no wrong result, and the
    judge proves that is all that happened (each of dlcc's quantized values a correct rounding of
    onnxruntime's value before quantization, and the outputs onnxruntime computes from them within
    the tolerance). Its note where every output passes so, else ""."""
    import dlcc
    from ..quant_judge import judge_quantized
    from ..verify import compare, default_tolerance, is_quantized

    if any(o.name not in got for o in model.graph.output) or not is_quantized(path):
        return ""  # (an output dlcc did not return stays the mismatch compare_outputs says it is)
    rows = []
    for o in model.graph.output:
        r = refs[o.name]
        rtol, atol = default_tolerance(cfg.precision, str(r.dtype))
        rows.append({**compare(o.name, np.asarray(got[o.name]), r, rtol, atol), "rtol": rtol, "atol": atol})
    judge_quantized(path, rows, got, feeds, cm,
                    recompile=lambda p: dlcc.compile(p, target=target, pipeline=cfg.spec(), device=cfg.device))
    if not all(r["passed"] for r in rows):
        return ""
    return "quantization judge: " + "; ".join(f"{r['name']!r}: {r['note']}" for r in rows if r.get("judge"))


#: How many times onnxruntime's own float32 error dlcc's may be, where the exact answer decides.
CONDITIONING_FACTOR = 4.0
#: How many times the Monte Carlo rounding spread (rounding.py) dlcc's error may be: a few samples
#: under-sample the tails of the rounding distribution.
SPREAD_FACTOR = 2.0


def conditioning_explains(model: onnx.ModelProto, feeds: dict, got: dict, refs: dict, precision: str = "fp32") -> str:
    """True when every element of every output is, against the float64 answer, within what
    float32 rounding explains (or within verify's tolerance of it): then the disagreement is the
    graph's conditioning, not a dlcc bug. Rounding explains an error up to the larger of
    - CONDITIONING_FACTOR times onnxruntime's largest float32 error on that output, and
    - SPREAD_FACTOR times the output's rounding spread (rounding.rounding_spread): how far a
      float32 program summing in another order may land. This one decides on a one-element
      output where onnxruntime happens to land on the exact answer.

    Both floors are taken over the whole output, not at the same element: where rounding is
    amplified (a variance taken as E[x^2] - E[x]^2 of nearly equal values), either side may land
    on the exact answer at one element by luck, and a bug lands far from it everywhere it strikes.
    The answer is a note saying, per float output, dlcc's largest error against the bound (what
    an `unstable` verdict records, for a reader to judge), or "" (false) when rounding does not
    explain it, the float64 answer cannot be computed, or a shape or dtype differs. At a tensor-core
    precision the spread includes the rounding of every GEMM operand to its type, and verify's
    tolerance for that precision is the last floor."""
    from ..verify import DEFAULT_TOLERANCE, compare

    rtol, atol = DEFAULT_TOLERANCE[precision]
    failing = []
    for name, r in refs.items():
        g = got.get(name)
        if g is None or g.shape != r.shape or g.dtype != r.dtype:
            return ""
        if r.dtype.kind != "f" and r.dtype.name != "bfloat16":  # (ml_dtypes' bfloat16 is of kind "V")
            if not np.array_equal(g, r):
                return ""
            continue
        if not compare(name, g, r, rtol, atol)["passed"]:
            failing.append(name)
    if not failing:
        return "conditioning"
    try:  # judged on the part of the graph the failing outputs depend on (rounding.pruned_to)
        judged = rounding_spread(pruned_to(model, failing), feeds, precision=precision)
    except Exception:  # an op onnx.reference cannot run: no arbiter, so the mismatch stands
        return ""
    notes = []
    for name in failing:
        g, r = got[name], refs[name]
        t, spread = judged[name]
        if np.any(np.isnan(g) != np.isnan(r)) or not np.all(np.isfinite(t[~np.isnan(r)])):
            return ""
        m = ~np.isnan(r)
        err_dlcc = np.abs(g[m].astype(np.float64) - t[m])
        err_ort = np.abs(r[m].astype(np.float64) - t[m])
        if not err_ort.size:
            continue
        worst_ort, worst_spread = float(err_ort.max()), float(np.nanmax(spread[m]))
        if worst_spread == np.inf:
            notes.append(f"{name!r}: rounding at this precision changes its shape (a decision in the graph "
                         f"flips), so any value is within it; dlcc's error against float64 {err_dlcc.max():.3g}")
            continue
        floor = max(CONDITIONING_FACTOR * worst_ort, SPREAD_FACTOR * worst_spread)
        if not np.all(err_dlcc <= np.maximum(floor, atol + rtol * np.abs(t[m]))):
            return ""
        notes.append(f"{name!r}: dlcc's error against float64 {err_dlcc.max():.3g} <= {floor:.3g} "
                     f"(onnxruntime's {worst_ort:.3g}, rounding spread {worst_spread:.3g})")
    return "; ".join(notes) or "conditioning"


def default_targets() -> list[str]:
    """OpenCL always (PoCL here); CUDA too where PyCUDA sees a GPU."""
    from ..backends import cuda

    return ["opencl"] + (["cuda"] if cuda.available() else [])


def check_case_task(task: dict) -> dict:
    """A pool task (pool.py): generate graph `seed` and check it. Returns a JSON-able record."""
    from .graphgen import GeneratorBug, InvalidCase, generate_valid

    seed = task["seed"]
    configs = [config_named(n) for n in task["configs"]] if task.get("configs") else all_configs()
    rec = {"seed": seed, "verdicts": {}}
    try:
        case = generate_valid(seed, max_patterns=task.get("max_patterns", 8), extremes=task.get("extremes", False),
                              half=task.get("half", False), more_ops=task.get("more_ops", False))
    except InvalidCase as e:
        rec["invalid"] = str(e)
        return rec
    except GeneratorBug as e:
        rec["generator_bug"] = str(e)
        return rec
    rec["ops"] = case.ops
    rec["nodes"] = len(case.model.graph.node)
    rec["case_seed"] = case.seed
    for target in task.get("targets") or default_targets():
        rec["verdicts"][target] = [v.as_dict() for v in check_model(case.model, case.feeds, case.refs, configs, target)]
    return rec


def unsupported_task(task: dict) -> dict:
    """A pool task: a graph dlcc must refuse. The verdict is `pass` only for a DlccError whose
    message names what is unsupported (graphgen.unsupported_reason); a compile that succeeds is a
    `mismatch`, anything else a `crash`."""
    import dlcc
    from ..errors import DlccError
    from .graphgen import generate_unsupported, unsupported_reason

    model, kind = generate_unsupported(task["seed"])
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.onnx")
        onnx.save(model, path)
        try:
            dlcc.compile(path, target="opencl", pipeline="baseline")
            return {"unsupported_kind": kind, "status": "mismatch", "detail": "compiled without an error"}
        except DlccError as e:
            msg = str(e)
            named = any(w.lower() in msg.lower() for w in unsupported_reason(model, kind))
            return {"unsupported_kind": kind, "status": "pass" if named else "crash",
                    "detail": msg if named else f"the error does not say what is unsupported: {msg}"}
        except Exception:
            return {"unsupported_kind": kind, "status": "crash", "detail": traceback.format_exc(limit=6)}


def fuzz_task(task: dict) -> dict:
    """The pool's entry point (pool.py): a generated graph, or a graph dlcc must refuse."""
    return unsupported_task(task) if task.get("kind") == "unsupported" else check_case_task(task)
