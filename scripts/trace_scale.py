#!/usr/bin/env python3
"""How `dlcc estimate --trace` scales: a synthetic Kineto trace of N regular events (CPU ops,
runtime launches with their flows, kernels on S streams, a ProfilerStep every K kernels), loaded
and replayed with every what-if, timed, with the process's peak memory.

Issue 19's target: 1,000,000 events load and replay in <= 20 s and <= 2 GB.

    python scripts/trace_scale.py --events 1000000
    python scripts/trace_scale.py --events 200000 --streams 20000   # many streams
"""
from __future__ import annotations

import argparse
import gzip
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def synth(events: int, streams: int, per_step: int) -> dict:
    """About `events` events: per kernel a CPU op, a cudaLaunchKernel, a flow pair and the kernel."""
    ev, ts, corr = [], 0, 0
    n = max(1, events // 5)
    step_start = 0
    for k in range(n):
        if k % per_step == 0:
            if k:
                ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k // per_step}",
                           "pid": 1, "tid": 1, "ts": step_start, "dur": ts - step_start})
            step_start = ts
        corr += 1
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": ts, "dur": 8})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts + 1,
                   "dur": 5, "args": {"correlation": corr}})
        ev.append({"ph": "s", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": 1, "tid": 1, "ts": ts + 1})
        s = 7 + k % streams
        ev.append({"ph": "f", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": 0, "tid": s, "ts": ts + 10, "bp": "e"})
        ev.append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": s, "ts": ts + 10, "dur": 6,
                   "args": {"correlation": corr, "stream": s, "device": 0}})
        ts += 10
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100"}], "traceEvents": ev}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--per-step", type=int, default=500, help="kernels per ProfilerStep")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.json.gz"
        data = synth(a.events, a.streams, a.per_step)
        with gzip.open(path, "wt") as f:
            json.dump(data, f)
        n = len(data["traceEvents"])
        del data
        # the command a user runs, in its own process: its time and its peak memory alone
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "dlcc.cli", "estimate", "--trace", str(path), "--json"],
                           capture_output=True, text=True)
        dt = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
    if p.returncode:
        print(p.stderr[-2000:], file=sys.stderr)
        return 1
    print(f"{n} events, {a.streams} streams: `dlcc estimate --trace` {dt:.1f} s, peak memory {peak:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
