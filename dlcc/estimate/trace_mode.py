"""`dlcc estimate --trace`: replay a real profiler trace and predict what-ifs on it."""
from __future__ import annotations

import bisect

import re
import statistics
from dataclasses import dataclass, field

from ..errors import TraceError
from .graph import EDGE_KINDS, TaskGraph
from .kineto import load_trace
from .whatif import WhatIfCall, load_file, parse


def parse_steps(spec: str | None) -> tuple[int, int] | None:
    """``N``, ``N..M`` (inclusive) or None for every iteration."""
    if not spec:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*(?:\.\.\s*(\d+)\s*)?", spec)
    if not m:
        raise TraceError(f"--steps {spec!r}: write N or N..M, e.g. --steps 6..9")
    a = int(m.group(1))
    b = int(m.group(2)) if m.group(2) else a
    if b < a:
        raise TraceError(f"--steps {spec!r}: the range is empty ({b} < {a})")
    return a, b


def edge_counts(g: TaskGraph) -> dict[str, int]:
    """How many dependencies of each Daydream kind the graph holds."""
    counts = {k: 0 for k in ("cpu-order", "gpu-order") + EDGE_KINDS}
    for r, ts in g.resources.items():
        counts["gpu-order" if r.startswith("gpu") else "cpu-order"] += max(0, len(ts) - 1)
        for t in ts:
            for d in t.deps + t.waits:
                counts[d.kind] = counts.get(d.kind, 0) + 1
    return counts


def gpu_busy(g: TaskGraph, its) -> float:
    """Fraction of the iterations' time in which some GPU task ran (the union over streams): low
    means the step is bound by the CPU, and a faster GPU buys little. The union is merged once and
    each iteration bisects into it, so a trace of a million kernels over thousands of iterations
    stays O(n log n) (scanning every span per iteration took minutes there)."""
    spans = sorted((t.start, t.end) for r, ts in g.resources.items() if r.startswith("gpu") for t in ts)
    merged: list[list[float]] = []
    for s, e in spans:
        if e <= s:
            continue
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    ends = [m[1] for m in merged]
    total = busy = 0.0
    for it in its:
        a, b = it.begin.start, it.end.start
        total += b - a
        j = bisect.bisect_right(ends, a)  # the first merged span that ends after a
        while j < len(merged) and merged[j][0] < b:
            busy += max(0.0, min(merged[j][1], b) - max(merged[j][0], a))
            j += 1
    return busy / total if total else 0.0


@dataclass
class TraceEstimate:
    trace: str
    graph: TaskGraph
    what_ifs: list[tuple[WhatIfCall, TaskGraph]] = field(default_factory=list)
    steps: tuple[int, int] | None = None

    def iterations(self, g: TaskGraph):
        its = g.iterations
        if self.steps:
            its = [i for i in its if self.steps[0] <= i.number <= self.steps[1]]
        return its

    def to_dict(self) -> dict:
        base = self.iterations(self.graph)
        rows = []
        for k, it in enumerate(base):
            row = {"iteration": it.label, "number": it.number, "measured_ms": it.measured_us / 1e3,
                   "baseline_ms": it.simulated_us / 1e3,
                   "diff_pct": 100.0 * (it.simulated_us - it.measured_us) / it.measured_us if it.measured_us else None,
                   "what_ifs": {}}
            for call, h in self.what_ifs:
                row["what_ifs"][call.spec] = self.iterations(h)[k].simulated_us / 1e3
            rows.append(row)
        measured = statistics.mean(r["measured_ms"] for r in rows)
        baseline = statistics.mean(r["baseline_ms"] for r in rows)
        wis = []
        for call, h in self.what_ifs:
            p = statistics.mean(r["what_ifs"][call.spec] for r in rows)
            wis.append({"name": call.spec, "predicted_ms": p, "speedup": baseline / p if p else None,
                        "gpu_busy": gpu_busy(h, self.iterations(h)), "help": call.help})
        g = self.graph
        return {"trace": self.trace, "device": g.meta.get("device"), "schema": g.meta.get("schema"),
                "tasks": len(g), "resources": sorted(g.resources), "dependencies": edge_counts(g),
                "iteration_source": g.meta.get("iteration_source"),
                "measured_ms": measured, "baseline_ms": baseline, "gpu_busy": gpu_busy(g, base),
                "replay_error_pct": 100.0 * (baseline - measured) / measured,
                "iterations": rows, "what_ifs": wis}


def estimate_trace(path, what_ifs: list[str] = (), what_if_files: list[str] = (), steps: str | None = None,
                   iterations: str | None = None, steps_log=None) -> TraceEstimate:
    """Load, replay, and apply each what-if (file-defined ones too) to a copy of the graph."""
    from ..progress import Steps

    steps_log = steps_log or Steps()
    rng = parse_steps(steps)
    specs = list(what_ifs)
    for f in what_if_files:
        for name in load_file(f):
            if not any(s.split(":")[0].split("=")[0] == name for s in specs):
                specs.append(name)
    calls = [parse(s) for s in specs]  # all names checked before the (slow) load
    with steps_log.step(f"read {path}"):
        g = load_trace(path, iterations)
    if not g.iterations:
        raise TraceError(f"{path}: no iterations: the trace has no ProfilerStep#N annotations (record "
                         f"with torch.profiler.profile(schedule=...) and call prof.step() each "
                         f"iteration), or pass --iterations REGEX to use the starts of another "
                         f"annotation as iteration boundaries, e.g. --iterations 'Optimizer.zero_grad'")
    est = TraceEstimate(str(path), g, steps=rng)
    if rng and not est.iterations(g):
        have = ", ".join(str(i.number) for i in g.iterations)
        raise TraceError(f"--steps {steps}: no such iterations in {path} (it has {have})")
    with steps_log.step(f"replay {len(g)} tasks"):
        g.simulate()
    for call in calls:
        with steps_log.step(f"what-if {call.spec}"):
            h = call.apply(g)
            h.simulate()
        est.what_ifs.append((call, h))
    return est
