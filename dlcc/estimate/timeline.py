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
    return events


def write_timeline(path: str | Path, scenarios: list[tuple[str, TaskGraph]]) -> None:
    """Write atomically: a reader never sees half a file, and a failure keeps the old one."""
    doc = {"traceEvents": chrome_events(scenarios), "displayTimeUnit": "ms",
           "otherData": {"producer": "dlcc estimate", "time_unit": "us"}}
    with atomic_file(path) as f:
        json.dump(doc, f, separators=(",", ":"))
