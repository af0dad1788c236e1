"""Export simulated timelines as Chrome-trace JSON (Perfetto and chrome://tracing open it).

Each scenario (the baseline replay, each what-if, each pipeline) is one process; each resource
(CPU thread, GPU stream, network channel) one thread inside it. Zero-length markers are left out;
iterations appear as spans on an "iterations" row.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..artifact import atomic_file
from .graph import TaskGraph


def chrome_events(scenarios: list[tuple[str, TaskGraph]]) -> list[dict]:
    events: list[dict] = []
    persistent = 0  # persistent kernels drawn so far: each gets its own block of vEU track ids
    for pid, (name, g) in enumerate(scenarios, start=1):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        if g.iterations:
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": 0, "args": {"name": "iterations"}})
            for it in g.iterations:
                events.append({"ph": "X", "name": it.label, "cat": "iteration", "pid": pid, "tid": 0,
                               "ts": it.begin.start, "dur": it.simulated_us,
                               "args": {"measured_us": it.measured_us}})
        for tid, (res, tasks) in enumerate(g.resources.items(), start=1):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": res}})
            for t in tasks:
                if t.kind == "marker":
                    continue
                args = {"kind": t.kind}
                if t.iteration is not None:
                    args["iteration"] = t.iteration
                if t.ops:
                    args["op"] = t.ops[-1]
                if "source" in t.args:
                    args["source"] = t.args["source"]
                events.append({"ph": "X", "name": t.name, "cat": t.kind, "pid": pid, "tid": tid,
                               "ts": round(t.start, 3), "dur": round(t.end - t.start, 3), "args": args})
                if "rprogram" in t.args:
                    persistent += 1
                    events += veu_events(t, pid, 1000 * persistent)
    return events


def veu_events(t, pid: int, base: int) -> list[dict]:
    """A persistent kernel (rammer rProgram) drawn as one track per vEU: in each wave, vEU v runs
    the wave's rTasks v, v + G, ... (the round-robin deal of passes/rammer.py), then waits at the
    grid barrier. Wave times are the cost model's, scaled to the kernel's simulated duration (a
    profile database may have measured the whole kernel)."""
    rp = t.args["rprogram"]
    G = max(1, int(rp["veus"]))
    model = rp["fixed_us"] + sum(rp["waves_us"]) + (len(rp["waves_us"]) * rp["barrier_us"] if rp["sync"] else 0)
    scale = (t.end - t.start) / model if model > 0 else 1.0
    ev = [{"ph": "M", "name": "thread_name", "pid": pid, "tid": base + v, "args": {"name": f"{t.name} vEU {v}"}}
          for v in range(G)]
    now = t.start + rp["fixed_us"] * scale
    for w, (entries, wus) in enumerate(zip(rp["waves"], rp["waves_us"])):
        tasks = [(e[0], k) for e in entries for k in range(int(e[1]))]  # entries: [op, rTasks, threads]
        rounds = max(1, -(-len(tasks) // G))
        dur = wus * scale / rounds
        for i, (op, k) in enumerate(tasks):
            ev.append({"ph": "X", "name": op, "cat": "rTask", "pid": pid, "tid": base + i % G,
                       "ts": round(now + (i // G) * dur, 3), "dur": round(dur, 3), "args": {"wave": w, "task": k}})
        now += wus * scale
        if rp["sync"]:
            for v in range(G):
                ev.append({"ph": "X", "name": "grid barrier", "cat": "sync", "pid": pid, "tid": base + v,
                           "ts": round(now, 3), "dur": round(rp["barrier_us"] * scale, 3), "args": {"wave": w}})
            now += rp["barrier_us"] * scale
    return ev


def write_timeline(path: str | Path, scenarios: list[tuple[str, TaskGraph]]) -> None:
    """Write atomically: a reader never sees half a file, and a failure keeps the old one."""
    doc = {"traceEvents": chrome_events(scenarios), "displayTimeUnit": "ms",
           "otherData": {"producer": "dlcc estimate", "time_unit": "us"}}
    with atomic_file(path) as f:
        json.dump(doc, f, separators=(",", ":"))
