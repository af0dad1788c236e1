"""`dlcc estimate MODEL.onnx`: rank pipelines by predicted latency, and estimate the unbuilt passes.

Each pipeline's plan becomes a task graph (``plan_graph.py``) and is replayed; the ranking sorts
by predicted latency (ties by name, so it is deterministic). Two what-ifs on the best plan say
what AStitch and Rammer should buy before they exist, written with the same primitives as the
trace what-ifs:

- ``stitch-memory-bound`` (AStitch): each run of consecutive memory-bound kernels joined by data
  becomes one kernel; tensors produced and consumed only inside the run never reach DRAM, and the
  run costs one fixed overhead and one launch.
- ``co-schedule`` (Rammer): kernels with no data path between them (same BFS level of the data
  flow graph) share the device in one launch: their work is summed and quantized over the SMs
  together, so small kernels fill each other's idle SMs.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

from ..config import (DeviceSpec, PipelineSpec, builtin_dir, check_precision, device_profile_db, load_device,
                      load_pipeline, precision_asked, with_precision)
from ..errors import DlccError
from .costmodel import compute_us, kernel_time, roofline_us
from .graph import Dep, TaskGraph
from .plan_graph import plan_graph
from .profiledb import ProfileDB
from .whatif import whatif


@dataclass
class PipelineEstimate:
    name: str
    graph: TaskGraph
    plan: dict
    predicted_us: float
    lower_bound_us: float
    measured_us: float | None = None  # from a `dlcc compile --tune` record (dlcc/tuning.py), if any

    @property
    def source(self) -> str:
        """How this row's time is known: "tuned" (measured on a device by --tune), "profiled"
        (kernel times from a profile database) or "modelled" (the cost model alone)."""
        if self.measured_us is not None:
            return "tuned"
        kinds = {t.args.get("source", "") for t in self.graph.select(kind="kernel")}
        return "profiled" if any(k.startswith("profile") for k in kinds) else "modelled"

    @property
    def launches(self) -> int:
        return len(self.plan["launches"])

    @property
    def dram_bytes(self) -> int:
        return int(self.plan["stats"]["dram_bytes"])


@dataclass
class PlanEstimate:
    model: str
    device: str
    pipelines: list[PipelineEstimate]
    what_ifs: list[tuple[str, TaskGraph, float, str]] = field(default_factory=list)
    sources: dict = field(default_factory=dict)
    imported: object = None  # the imported Graph (untouched), so `compile --pipeline auto` imports once

    @property
    def best(self) -> PipelineEstimate:
        return self.pipelines[0]

    def why(self) -> str:
        b = self.best
        if len(self.pipelines) == 1:
            return f"the only pipeline given; predicted {b.predicted_us:.1f} µs on {self.device}"
        nxt = self.pipelines[1]
        if nxt.predicted_us <= b.predicted_us * 1.005:
            return (f"predicted {b.predicted_us:.1f} µs on {self.device}, tied with {nxt.name} "
                    f"({nxt.predicted_us:.1f} µs, within 0.5%); ties go to the first name in order")
        return (f"predicted {b.predicted_us:.1f} µs on {self.device}, "
                f"{nxt.predicted_us / b.predicted_us:.2f}x faster than the next, {nxt.name} "
                f"({nxt.predicted_us:.1f} µs); {b.launches} launches, DRAM {b.dram_bytes / 2**20:.1f} MiB")

    def scenarios(self) -> list[tuple[str, TaskGraph]]:
        out = [(f"pipeline {p.name}", p.graph) for p in self.pipelines]
        out += [(f"what-if {n} on {self.best.name}", g) for n, g, _, _ in self.what_ifs]
        return out

    def to_dict(self) -> dict:
        base = self.best.predicted_us
        return {
            "model": self.model, "device": self.device, "time_sources": sorted(self.sources),
            "pipelines": [{"name": p.name, "predicted_ms": p.predicted_us / 1e3, "launches": p.launches,
                           "dram_bytes": p.dram_bytes, "lower_bound_ms": p.lower_bound_us / 1e3, "source": p.source,
                           "measured_ms": p.measured_us / 1e3 if p.measured_us is not None else None}
                          for p in self.pipelines],
            "what_ifs": [{"name": n, "predicted_ms": t / 1e3, "speedup": base / t if t else None,
                          "launches": len(g.select(kind="kernel")), "help": h} for n, g, t, h in self.what_ifs],
            "best": self.best.name, "why": self.why(),
        }


def default_pipelines() -> list[str]:
    return sorted(str(p) for p in builtin_dir("pipelines").glob("*.yaml"))


def flops_by_math(plan: dict) -> dict[str, int]:
    """FLOPs per arithmetic (Kernel.math: float32, or a tensor-core precision): a launch's own, or
    a persistent kernel's per wave."""
    kinfo = {k["name"]: k for k in plan["kernels"]}
    out: dict[str, int] = {}
    for L in plan["launches"]:
        waves = (L.get("rprogram") or {}).get("waves")
        if waves:
            for w in waves:
                other = w.get("math_flops") or {}
                for m, f in other.items():
                    out[m] = out.get(m, 0) + f
                out["float32"] = out.get("float32", 0) + w["flops"] - sum(other.values())
        else:
            m = kinfo.get(L["kernel"], {}).get("math", "float32")
            out[m] = out.get(m, 0) + L["flops"]
    return out


def lower_bound_us(plan: dict, device) -> float:
    """Roofline of the whole plan: all FLOPs at the peak of the arithmetic they run at (tensor-core
    FLOPs at their precision's), or the unavoidable bytes (weights + inputs + outputs) at full
    bandwidth, whichever is longer."""
    s = plan["stats"]
    tensor = {m: f for m, f in flops_by_math(plan).items() if m != "float32"}
    compute = compute_us(float(s["flops"]), "float32", device, tensor)
    return max(compute, roofline_us(0.0, float(s["lower_bound_bytes"]), "float32", device))


def estimate_plan(model, shapes=(), device: str = "h100", pipelines: list[str] | None = None,
                  profile_db: str | Path | None = None, steps=None, what_ifs: bool = True,
                  extra_what_ifs: list[str] = (), what_if_files: list[str] = (),
                  precisions: list[str] | None = None) -> PlanEstimate:
    """Rank `pipelines` (default: every built-in one) by predicted latency on `device`, each at
    every one of `precisions` (default: its own; a row is "NAME@PRECISION" where one is given). With
    `what_ifs`, also apply the AStitch and Rammer estimates, plus `extra_what_ifs` (specs, as in
    trace mode; those defined in `what_if_files` too) to the best plan."""
    from ..api import _merge_shapes
    from ..compiler import compile_model, import_checked
    from ..progress import Steps

    from .whatif import load_file, parse

    steps = steps or Steps()
    specs = list(extra_what_ifs)
    for f in what_if_files:
        specs += [n for n in load_file(f) if n not in specs]
    calls = [parse(x) for x in specs]  # bad specs fail before any work
    dev = device if isinstance(device, DeviceSpec) else load_device(device)
    # bad names fail before work; a PipelineSpec is taken as it is
    specs = [p if isinstance(p, PipelineSpec) else load_pipeline(p) for p in (pipelines or default_pipelines())]
    if precisions:
        specs = [with_precision(s, pr).model_copy(update={"name": f"{s.name}@{pr}"}) for s in specs for pr in precisions]
    for s in specs:
        check_precision(s.precision, dev, "cuda")  # one a device cannot do is an error before any work
    names = [s.name for s in specs]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise DlccError(f"pipelines must have distinct names; given twice: {', '.join(sorted(dup))}")
    if profile_db is None:  # the measurements the device spec comes with, if any
        profile_db = device_profile_db(dev)
    db = profile_db if hasattr(profile_db, "lookup") else ProfileDB.load(profile_db) if profile_db else None
    with steps.step("import + fold + infer shapes"):
        shapes = _merge_shapes(shapes)
        graph = import_checked(model, shapes, float64=bool(precisions) or any(precision_asked(s, None) for s in specs))
    results = []
    for spec in specs:
        with steps.step(f"compile + simulate pipeline {spec.name}"):
            # the plan a CUDA compile builds for a GPU device: its launches replayed as one graph
            res = compile_model(model, shapes, target="opencl", pipeline=spec, device=dev,
                                imported=copy.deepcopy(graph), graphs=dev.kind == "gpu", profile_db=db)
            g = plan_graph(res.plan, dev, db, name=spec.name)
            t = g.simulate()
            results.append(PipelineEstimate(spec.name, g, res.plan, t, lower_bound_us(res.plan, dev)))
    results.sort(key=lambda p: (p.predicted_us, p.name))
    from ..tuning import measured_times

    measured = measured_times(model, dev.name, precisions[0] if precisions and len(precisions) == 1 else None)
    for p in results:
        p.measured_us = measured.get(p.name.split("@")[0])
    est = PlanEstimate(Path(str(model)).name, dev.name, results, imported=graph)
    for p in results:
        for t in p.graph.select(kind="kernel"):
            est.sources[t.args["source"]] = est.sources.get(t.args["source"], 0) + 1
    if what_ifs:
        calls = [parse(n) for n in ("stitch-memory-bound", "co-schedule") if n not in specs] + calls
    for call in calls:
        with steps.step(f"what-if {call.spec}"):
            h = call.apply(est.best.graph)
            est.what_ifs.append((call.spec, h, h.simulate(), call.help))
    return est


def choose_pipeline(model, shapes, device, steps=None, precision: str | None = None,
                    profile_db=None) -> tuple[str, PlanEstimate]:
    """`--pipeline auto`: the built-in pipeline the estimator ranks best for `device`, each ranked
    at `precision` where one is given (the compile's), with the compile's profile database (None:
    the one the device spec comes with, if any)."""
    est = estimate_plan(model, shapes, device, None, profile_db=profile_db, steps=steps, what_ifs=False,
                        precisions=[precision] if precision else None)
    return est.best.name.split("@")[0], est


# ---------------------------------------------------------------------------------------------
# What-ifs over plan graphs (they need the device and the plan's bytes, kept in graph.meta)
# ---------------------------------------------------------------------------------------------

def _plan_meta(g: TaskGraph, what: str):
    dev = g.meta.get("device_spec")
    if dev is None:
        raise DlccError(f"what-if {what} works on dlcc plans (dlcc estimate MODEL.onnx), not on traces")
    return dev


def _merge(g: TaskGraph, group: list, us: float, name: str) -> None:
    """Replace `group` (kernels) by its first member with time `us`: the others' launches go, their
    dependents depend on the survivor, and the survivor inherits their dependencies."""
    keep, rest = group[0], group[1:]
    doomed = {id(t) for t in rest}
    for t in rest:
        for d in t.deps:
            if d.kind != "launch" and id(d.task) not in doomed and d.task is not keep:
                keep.deps.append(Dep(d.task, d.kind, d.lag, d.anchor))
    for lst in g.resources.values():
        for u in lst:
            if u is keep or id(u) in doomed:
                continue
            for d in u.deps + u.waits:
                if id(d.task) in doomed:
                    d.task = keep
    keep.deps = [d for d in keep.deps if id(d.task) not in doomed and d.task is not keep]
    keep.dur = us
    keep.name = name
    launches = [d.task for t in rest for d in t.deps if d.kind == "launch"]
    g.remove(rest, keep_gap=False)
    g.remove(launches, keep_gap=False)


def _is_memory_bound(t) -> bool:
    return t.args.get("category") != "compute"


@whatif("stitch-memory-bound", help="AStitch estimate (plan mode): each run of consecutive "
                                    "memory-bound kernels joined by data becomes one kernel whose "
                                    "intermediates stay on chip; one launch and one fixed cost per run")
def stitch_memory_bound(g: TaskGraph):
    dev = _plan_meta(g, "stitch-memory-bound")
    stream = next(r for r in g.resources if r.startswith("gpu"))
    runs, cur = [], []
    for t in list(g.resources[stream]):
        joined = cur and any(d.kind == "data" and d.task in cur for d in t.deps)
        if _is_memory_bound(t) and (not cur or joined):
            cur.append(t)
            continue
        if len(cur) > 1:
            runs.append(cur)
        cur = [t] if _is_memory_bound(t) else []
    if len(cur) > 1:
        runs.append(cur)
    plan = g.meta["plan"]
    tensors = plan.get("tensors", {})
    consumers: dict[str, set] = {}
    for t in g.select(kind="kernel"):
        for r in t.args.get("reads", []):
            consumers.setdefault(r, set()).add(id(t))
    outputs = {o["name"] for o in plan.get("outputs", [])}
    for run in runs:
        ids = {id(t) for t in run}
        saved = 0
        for t in run:
            for w in t.args.get("writes", []):
                if w not in outputs and consumers.get(w) and consumers[w] <= ids:
                    nb = int((tensors.get(w) or {}).get("nbytes") or 0)
                    saved += nb * (1 + len(consumers[w]))  # its write and every read of it
        flops, dram, blocks, threads = _work(run)
        # stitched kernels keep the widest member's grid (they run its thread mapping)
        us = kernel_time(flops, max(0, dram - saved), "float32", dev, blocks=max(_n(t.args.get("grid")) for t in run),
                         threads=threads).us
        run.sort(key=lambda t: t.args["index"])
        last = run[-1]
        run = [last] + run[:-1]  # the survivor sits where the run ends, after every producer
        _merge(g, run, us, f"stitched {len(run)} kernels")


@whatif("co-schedule", help="Rammer estimate (plan mode): kernels with no data path between them "
                            "(one BFS wave of the data-flow graph) run as one launch whose work "
                            "is quantized over the SMs together")
def co_schedule(g: TaskGraph):
    dev = _plan_meta(g, "co-schedule")
    stream = next(r for r in g.resources if r.startswith("gpu"))
    level: dict[int, int] = {}
    for t in g.resources[stream]:
        level[id(t)] = 1 + max((level.get(id(d.task), -1) for d in t.deps if d.kind == "data"), default=-1)
        t.priority = level[id(t)]
    waves: dict[int, list] = {}
    for t in g.resources[stream]:
        waves.setdefault(level[id(t)], []).append(t)
    for lv, ks in sorted(waves.items()):
        if len(ks) < 2:
            continue
        flops, dram, blocks, threads = _work(ks)
        merged = kernel_time(flops, dram, "float32", dev, blocks=blocks, threads=threads,
                             gemm=any(not _is_memory_bound(t) for t in ks)).us
        # never slower than running them one after another
        us = min(merged, sum(t.dur for t in ks))
        _merge(g, ks, us, f"co-scheduled wave {lv} ({len(ks)} kernels)")
    # run the stream wave by wave (a topological order of the data edges)
    g.schedule(stream, key=lambda t: t.priority)


def _work(ks) -> tuple[float, float, int, int]:
    """Summed FLOPs, DRAM bytes and blocks of a group of kernels, and its widest block."""
    return (sum(t.args["flops"] for t in ks), sum(t.args["dram_bytes"] for t in ks),
            sum(_n(t.args.get("grid")) for t in ks), max(_n(t.args.get("block")) for t in ks))


def _n(v) -> int:
    if isinstance(v, (list, tuple)):
        n = 1
        for x in v:
            n *= int(x)
        return n
    return int(v or 1)
