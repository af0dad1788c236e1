"""`dlcc estimate --trace`: the Daydream task graph, the Kineto reader, the what-ifs and the CLI.

Every expected time below is worked out by hand from the traces written here (µs, relative to the
trace's first event) and the rules in DESIGN.md §6 and the module docstrings, never taken from the
code's own output.
"""
from __future__ import annotations

import gzip
import json
import os
import statistics
from pathlib import Path

import pytest

from dlcc.errors import TraceError
from dlcc.estimate import whatif as W
from dlcc.estimate.graph import Dep, Iteration, SimulationError, Task, TaskGraph
from dlcc.estimate.kineto import build_graph, load_trace
from dlcc.estimate.trace_mode import edge_counts, estimate_trace
from dlcc.estimate.whatif import WhatIfError, parse

ROOT = Path(__file__).resolve().parents[1]
# DLCC_TRACES, else ../shared/traces beside the checkout, else the two V100 traces kept in the repo
_SHARED = ROOT.parent / "shared" / "traces"
TRACES = Path(os.environ.get("DLCC_TRACES") or (_SHARED if _SHARED.is_dir() else ROOT / "tests" / "data" / "traces"))


def approx(x):
    return pytest.approx(x, abs=1e-6)


# =================================================================================================
# 1. TaskGraph and simulate() on hand-built graphs
# =================================================================================================

def T(name, res, dur, kind=None, **kw):
    kind = kind or ("kernel" if res.startswith("gpu") else "cpu")
    return Task(name, kind, res, dur, **kw)


def times(*tasks):
    return [(t.start, t.end) for t in tasks]


def test_resource_order_gaps_launch_end_deps_and_waits():
    g = TaskGraph()
    a = g.add(T("A", "cpu:0", 10, gap=5))
    b = g.add(T("B", "cpu:0", 20, gap=3))
    # launch: anchored at A's start, 4 µs later; the stream's own gap (2) does not bind
    k = g.add(T("K", "gpu:0", 7, gap=2, deps=[Dep(a, "launch", 4.0, "start")]))
    # an end-anchored edge: after B ends + 1
    k2 = g.add(T("K2", "gpu:0", 5, deps=[Dep(b, "sync", 1.0)]))
    # a blocking call: starts when the thread is free, ends at max(start + dur, K2.end + 3)
    s = g.add(T("S", "cpu:0", 2, kind="sync", waits=[Dep(k2, "sync", 3.0)]))
    # a blocking call whose wait already ended: just its own duration
    s2 = g.add(T("S2", "cpu:0", 2, kind="sync", waits=[Dep(k, "sync", 3.0)]))
    span = g.simulate()
    assert times(a, b) == [(5, 15), (18, 38)]
    assert times(k) == [(9, 16)]           # max(0 + 2, A.start 5 + 4)
    assert times(k2) == [(39, 44)]         # max(16 + 0, B.end 38 + 1)
    assert times(s) == [(38, 47)]          # max(38 + 2, 44 + 3)
    assert times(s2) == [(47, 49)]         # K ended at 16: 16 + 3 < 47 + 2
    assert span == 49 and g.span() == 49


def test_start_anchor_differs_from_end_anchor():
    for anchor, expect in (("start", 3 + 2), ("end", 13 + 2)):
        g = TaskGraph()
        a = g.add(T("A", "cpu:0", 10, gap=3))
        k = g.add(T("K", "gpu:0", 1, deps=[Dep(a, "launch", 2.0, anchor)]))
        g.simulate()
        assert k.start == expect


def test_call_waiting_on_the_copy_it_launched_does_not_deadlock():
    g = TaskGraph()
    c = g.add(T("cudaMemcpyAsync", "cpu:0", 5, kind="launch"))
    m = g.add(T("Memcpy HtoD (Pageable -> Device)", "gpu:0", 10, kind="memcpy",
                deps=[Dep(c, "launch", 2.0, "start")]))
    c.waits.append(Dep(m, "sync", 1.0))
    d = g.add(T("next", "cpu:0", 1))
    assert g.simulate() == 14
    assert times(c, m, d) == [(0, 13), (2, 12), (13, 14)]


def test_cycle_raises_simulation_error():
    g = TaskGraph()
    a = g.add(T("A", "cpu:0", 1))
    b = g.add(T("B", "gpu:0", 1, deps=[Dep(a, "launch")]))
    a.deps.append(Dep(b, "sync"))
    with pytest.raises(SimulationError, match="cycle"):
        g.simulate()
    # a blocking call that waits for work which can only start after the call has ended
    g = TaskGraph()
    s = g.add(T("S", "cpu:0", 1, kind="sync"))
    k = g.add(T("K", "gpu:0", 1, deps=[Dep(s, "launch")]))
    s.waits.append(Dep(k, "sync"))
    with pytest.raises(SimulationError, match="never finished"):
        g.simulate()


def _select_graph():
    g = TaskGraph()
    c0 = g.add(T("cudaLaunchKernel", "cpu:1", 1, kind="launch", ops=("ProfilerStep#1", "aten::mm"), iteration=1))
    c1 = g.add(T("cudaLaunchKernel", "cpu:1", 1, kind="launch",
                 ops=("ProfilerStep#2", "Optimizer.step#SGD.step"), iteration=2))
    k0 = g.add(T("volta_sgemm_128x64_nn", "gpu0:stream 7", 5, ops=c0.ops, iteration=1))
    k1 = g.add(T("multi_tensor_apply_kernel", "gpu0:stream 7", 5, ops=c1.ops, iteration=2))
    m = g.add(T("Memcpy HtoD", "gpu0:stream 7", 3, kind="memcpy", iteration=2))
    n = g.add(T("ncclKernel_AllReduce", "gpu0:stream 20", 3, kind="comm", iteration=2))
    return g, (c0, c1, k0, k1, m, n)


def test_select_filters():
    g, (c0, c1, k0, k1, m, n) = _select_graph()
    assert g.select(kind="kernel") == [k0, k1]
    assert g.select(kind=("kernel", "comm")) == [k0, k1, n]
    assert g.select(name="gemm|nccl") == [k0, n]                 # searched, not anchored
    assert g.select(op=r"Optimizer\.step") == [c1, k1]
    assert g.select(op=r"^aten::mm$") == [c0, k0]
    assert g.select(iteration=2) == [c1, k1, m, n]
    assert g.select(kind="kernel", iteration=1) == [k0]
    assert g.select(resource="stream 20") == [n]
    assert g.select(where=lambda t: t.dur > 4) == [k0, k1]
    assert g.select(kind="memset") == []


def test_scale_and_shrink_with_and_without_gaps():
    for gaps, expect in ((False, [(4, 9), (11, 14)]), (True, [(2, 7), (8, 11)])):
        g = TaskGraph()
        a = g.add(T("A", "cpu:0", 10, gap=4))
        b = g.add(T("B", "cpu:0", 6, gap=2))
        g.scale(g.tasks, 0.5, gaps=gaps)
        g.simulate()
        assert times(a, b) == expect
    g = TaskGraph()
    a = g.add(T("A", "cpu:0", 12, gap=8))
    g.shrink([a], 4)
    assert (a.dur, a.gap) == (3, 8)
    g.shrink([a], 3, gaps=True)
    assert (a.dur, a.gap) == (1, pytest.approx(8 / 3))


def test_insert_after_before_and_errors():
    g = TaskGraph()
    a = g.add(T("A", "cpu:0", 10))
    c = g.add(T("C", "cpu:0", 10))
    k = g.add(T("K", "gpu:0", 1))
    b = g.insert(T("B", "cpu:0", 5, gap=1), after=a)
    x = g.insert(T("X", "cpu:0", 2), before=a)
    z = g.insert(T("Z", "cpu:0", 1))                      # no reference: at the end
    assert g.resources["cpu:0"] == [x, a, b, c, z]
    g.simulate()
    assert times(x, a, b, c, z) == [(0, 2), (2, 12), (13, 18), (18, 28), (28, 29)]
    with pytest.raises(ValueError, match="not on"):
        g.insert(T("bad", "cpu:0", 1), after=k)
    with pytest.raises(ValueError):
        g.insert(T("bad", "gpu:0", 1), before=a)
    n = g.insert(T("N", "net:x", 1, kind="comm"))           # a new resource
    assert g.resources["net:x"] == [n]


def test_remove_rewires_dependencies_through_the_removed_task():
    g = TaskGraph()
    a = g.add(T("A", "cpu:0", 10))
    x = g.add(T("X", "gpu:0", 5, deps=[Dep(a, "launch", 2.0)]))
    y = g.add(T("Y", "gpu:1", 4, deps=[Dep(x, "comm", 1.0)]))
    g.simulate()
    assert times(x, y) == [(12, 17), (18, 22)]
    g.remove([x])
    assert g.resources["gpu:0"] == []
    assert [(d.task, d.lag, d.anchor) for d in y.deps] == [(a, 3.0, "end")]
    g.simulate()
    assert times(y) == [(13, 17)]           # A.end 10 + 2 + 1


@pytest.mark.parametrize("kind,keep_gap,expect_r", [
    ("launch", None, (16, 18)),   # CPU default: Q's gap (7) moves to R: 5 + 7 + 4
    ("launch", False, (9, 11)),
    ("kernel", None, (9, 11)),    # GPU default: the removed kernel's idle slot goes with it
    ("kernel", True, (16, 18)),
])
def test_remove_keep_gap(kind, keep_gap, expect_r):
    res = "gpu:0" if kind == "kernel" else "cpu:0"
    g = TaskGraph()
    p = g.add(T("P", res, 5, kind=kind))
    q = g.add(T("Q", res, 3, kind=kind, gap=7))
    r = g.add(T("R", res, 2, kind=kind, gap=4))
    g.remove([q], keep_gap=keep_gap)
    assert g.resources[res] == [p, r]
    g.simulate()
    assert times(p, r) == [(0, 5), expect_r]


def test_remove_inherits_waits():
    # S waits for K; K is removed: S now waits (through K) for K's end-anchored dependency A
    g = TaskGraph()
    a = g.add(T("A", "gpu:1", 30))
    k = g.add(T("K", "gpu:0", 5, deps=[Dep(a, "comm", 2.0)]))
    s = g.add(T("S", "cpu:0", 1, kind="sync", waits=[Dep(k, "sync", 3.0)]))
    g.remove([k])
    assert [(d.task, d.lag) for d in s.waits] == [(a, 5.0)]
    g.simulate()
    assert times(s) == [(0, 35)]


def test_remove_inherited_start_anchored_wait_uses_the_start():
    g = TaskGraph()
    L = g.add(T("cudaLaunchKernel", "cpu:0", 10, kind="launch"))
    k = g.add(T("K", "gpu:0", 100, deps=[Dep(L, "launch", 5.0, "start")]))
    s = g.add(T("S", "cpu:1", 1, kind="sync", waits=[Dep(k, "sync", 2.0)]))
    g.remove([k])
    assert [(d.task, d.lag, d.anchor) for d in s.waits] == [(L, 7.0, "start")]
    g.simulate()
    # Dep semantics: L must reach its start 7 µs before S may go on -> S ends at max(0 + 1, 0 + 7)
    assert s.end == 7


def test_remove_keeps_stream_order_for_waiters():
    g = TaskGraph()
    k1 = g.add(T("K1", "gpu:0", 100))
    L2 = g.add(T("L2", "cpu:0", 1, kind="launch"))
    k2 = g.add(T("K2", "gpu:0", 10, deps=[Dep(L2, "launch", 0.0, "start")]))
    s = g.add(T("S", "cpu:0", 1, kind="sync", waits=[Dep(k2, "sync", 0.0)]))
    g.simulate()
    assert s.end == 110
    g.remove([k2])
    g.simulate()
    assert s.end >= k1.end == 100     # a synchronize still returns only after the stream drained


def test_remove_of_an_iteration_marker_leaves_graph_unchanged():
    g = TaskGraph()
    b = g.add(T("begin", "cpu:0", 0, kind="marker"))
    x = g.add(T("X", "cpu:0", 5))
    e = g.add(T("end", "cpu:0", 0, kind="marker"))
    g.iterations.append(Iteration("step", 1, b, e, 5.0))
    with pytest.raises(ValueError, match="iteration marker"):
        g.remove([x, e])
    assert g.resources["cpu:0"] == [b, x, e]


def test_remove_of_an_iteration_marker_raises():
    g = TaskGraph()
    b = g.add(T("begin", "cpu:0", 0, kind="marker"))
    e = g.add(T("end", "cpu:0", 0, kind="marker"))
    g.iterations.append(Iteration("step", 1, b, e, 5.0))
    with pytest.raises(ValueError, match="iteration marker"):
        g.remove([e])


def test_schedule_priority_among_ready_tasks():
    def build():
        g = TaskGraph()
        t3 = g.add(T("T3", "net:ar", 10, kind="comm", priority=3))
        t1 = g.add(T("T1", "net:ar", 10, kind="comm", priority=1))
        t2 = g.add(T("T2", "net:ar", 10, kind="comm", priority=2))
        return g, (t1, t2, t3)
    g, (t1, t2, t3) = build()
    g.simulate()                                   # recorded order
    assert times(t3, t1, t2) == [(0, 10), (10, 20), (20, 30)]
    g, (t1, t2, t3) = build()
    g.schedule("net:ar", key=lambda t: t.priority)
    g.simulate()
    assert times(t1, t2, t3) == [(0, 10), (10, 20), (20, 30)]
    with pytest.raises(ValueError, match="no resource"):
        g.schedule("net:nope", key=lambda t: t.priority)


def test_schedule_does_not_wait_for_a_high_priority_task_that_is_not_ready():
    def build():
        g = TaskGraph()
        c = g.add(T("C", "cpu:0", 15))
        hi = g.add(T("hi", "net:ar", 10, kind="comm", priority=0, deps=[Dep(c, "cpu-cpu")]))
        lo = g.add(T("lo", "net:ar", 10, kind="comm", priority=5))
        c2 = g.add(T("C2", "cpu:1", 12))
        mid = g.add(T("mid", "net:ar", 10, kind="comm", priority=1, deps=[Dep(c2, "cpu-cpu")]))
        return g, hi, lo, mid
    g, hi, lo, mid = build()
    g.simulate()                                   # recorded order: hi waits for C, lo and mid queue behind
    assert times(hi, lo, mid) == [(15, 25), (25, 35), (35, 45)]
    g, hi, lo, mid = build()
    g.schedule("net:ar", key=lambda t: t.priority)
    g.simulate()
    # at 0 only lo is ready; at 10 nothing is (C2 ends 12, C 15): mid at 12 (first ready), then hi
    assert times(lo, mid, hi) == [(0, 10), (12, 22), (22, 32)]


def test_copy_is_independent():
    g = TaskGraph(meta={"x": 1})
    L = g.add(T("cudaLaunchKernel", "cpu:0", 10, kind="launch"))
    k = g.add(T("K", "gpu:0", 50, deps=[Dep(L, "launch", 5.0, "start")]))
    L.args["launches"] = [k]
    s = g.add(T("sync", "cpu:0", 1, kind="sync", waits=[Dep(k, "sync", 2.0)]))
    e = g.add(T("end", "cpu:0", 0, kind="marker", gap=3))
    b = g.insert(T("begin", "cpu:0", 0, kind="marker"), before=L)
    g.iterations.append(Iteration("step", 1, b, e, 60.0))
    g.simulate()
    before = [(t.name, t.start, t.end) for t in g.tasks]
    assert g.iterations[0].simulated_us == 60 and s.end == 57     # K 5..55, sync ends 57, end marker 60

    h = g.copy()
    hL = h.resources["cpu:0"][1]
    hk = hL.args["launches"][0]
    assert hL is not L and hk is not k and hk is h.resources["gpu:0"][0]
    assert L.args["launches"] == [k]               # the original keeps its own references
    hk.dur = 10                                    # change the copy through args["launches"]
    h.scale(h.select(kind="launch"), 0.5)
    h.insert(T("extra", "cpu:0", 100), after=h.resources["cpu:0"][-1])
    h.schedule("gpu:0", key=lambda t: 0)
    h.simulate()
    assert h.iterations[0].simulated_us == 20      # K 5..15, sync ends 17, end marker 20
    assert h.iterations[0].begin is h.resources["cpu:0"][0]
    g.simulate()
    assert [(t.name, t.start, t.end) for t in g.tasks] == before
    assert "gpu:0" not in g.policies and g.meta == {"x": 1}
    h.remove([hk])
    g.simulate()
    assert [(t.name, t.start, t.end) for t in g.tasks] == before
    assert L.args["launches"] == [k] and k.dur == 50


# =================================================================================================
# 2. Kineto traces written by hand, in both schemas
# =================================================================================================

BASE = 1_000_000          # absolute µs of time 0 in the hand-made traces
SGEMM = "volta_sgemm_128x64_nn"
SGEMM2 = "volta_sgemm_64x64_nn"
RELU = "void at::native::vectorized_elementwise_kernel<4, at::native::relu_kernel>(int, float*)"
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float> >(int, float*)"
MEAN = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float> > >()"
BF16_GEMM = "ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_tn"
SGD = "void at::native::multi_tensor_apply_kernel<at::native::SGDFunctor<float> >()"
NCCL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"


class KT:
    """A small Kineto trace in the 2021 schema or the current one (../shared/traces/README.md)."""

    def __init__(self, schema: str = "current", pid: int = 100, tid: int = 100):
        self.schema, self.pid, self.tid = schema, pid, tid
        self.events: list[dict] = []
        self.corr = 1000

    @property
    def old(self) -> bool:
        return self.schema == "2021"

    def _tid(self, tid):
        tid = self.tid if tid is None else tid
        return str(tid) if self.old else tid

    def op(self, name, ts, dur, tid=None, **args):
        if self.old:
            cat = "Operator"
        else:
            cat = "user_annotation" if ("#" in name or name.startswith(("[", "## "))) else "cpu_op"
        e = {"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": self._tid(tid), "ts": BASE + ts,
             "dur": dur, "args": {"External id": len(self.events), **args}}
        self.events.append(e)
        return e

    def call(self, name, ts, dur, tid=None, corr=None, cat=None):
        args = {"cbid": 211}
        if corr is not None:
            args["correlation"] = corr
            args["external id" if self.old else "External id"] = corr
        e = {"ph": "X", "cat": cat or ("Runtime" if self.old else "cuda_runtime"), "name": name, "pid": self.pid,
             "tid": self._tid(tid), "ts": BASE + ts, "dur": dur, "args": args}
        self.events.append(e)
        return e

    def gpu(self, name, ts, dur, kind="kernel", stream=7, corr=None, **extra):
        cat = {"kernel": ("Kernel", "kernel"), "memcpy": ("Memcpy", "gpu_memcpy"),
               "memset": ("Memset", "gpu_memset")}[kind][0 if self.old else 1]
        args = {"device": 0, "context": 1, "stream": stream, **extra}
        if corr is not None:
            args["correlation"] = corr
            args["external id" if self.old else "External id"] = corr
        if kind == "kernel":
            args.update({"registers per thread": 32, "shared memory": 0, "grid": [80, 1, 1], "block": [256, 1, 1]})
        e = {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": f"stream {stream}" if self.old else stream,
             "ts": BASE + ts, "dur": dur, "args": args}
        self.events.append(e)
        return e

    def launch(self, ts, dur, kname, kts, kdur, kind="kernel", stream=7, tid=None, call="cudaLaunchKernel",
               corr=True, flow=True, **extra):
        """A runtime call at [ts, ts+dur) whose GPU task runs at [kts, kts+kdur)."""
        self.corr += 1
        c = self.corr
        self.call(call, ts, dur, tid, c if corr else None)
        self.gpu(kname, kts, kdur, kind, stream, c if corr else None, **extra)
        if flow:
            cat, name = ("async", "launch") if self.old else ("ac2g", "ac2g")
            # as in the real files: the 2021 "s" event has an int tid although the Runtime event's is a string
            self.events.append({"ph": "s", "id": c, "pid": self.pid, "tid": int(self.tid if tid is None else tid),
                                "ts": BASE + ts, "cat": cat, "name": name})
            self.events.append({"ph": "f", "id": c, "pid": 0, "tid": f"stream {stream}" if self.old else stream,
                                "ts": BASE + kts, "cat": cat, "name": name, "bp": "e"})

    def data(self) -> dict:
        noise = [
            {"name": "process_name", "ph": "M", "ts": BASE, "pid": self.pid, "tid": 0, "args": {"name": "python"}},
            {"ph": "X", "cat": "Trace", "ts": BASE - 50, "dur": 10 ** 6, "pid": "Traces" if self.old else "Spans",
             "tid": "PyTorch Profiler", "name": "PyTorch Profiler (0)", "args": {"Op count": 0}},
            {"name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g", "pid": "Traces",
             "tid": "Trace PyTorch Profiler", "ts": BASE - 50},
            {"ph": "i", "s": "t", "name": "[memory]", "pid": self.pid, "tid": self.tid, "ts": BASE + 1,
             "args": {"Device Type": 0, "Bytes": 4}},
        ]
        return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "Test GPU"}],
                "traceEvents": noise + list(self.events)}

    def graph(self, iterations=None) -> TaskGraph:
        return build_graph(self.data(), "test", iterations)

    def write(self, path: Path, gz: bool = False) -> Path:
        raw = json.dumps(self.data()).encode()
        path.write_bytes(gzip.compress(raw) if gz else raw)
        return path


def task(g: TaskGraph, name: str, ts: float) -> Task:
    found = [t for t in g.tasks if t.name == name and t.ts == ts]
    assert len(found) == 1, (name, ts, found)
    return found[0]


def assert_exact_replay(g: TaskGraph):
    g.simulate()
    for t in g.tasks:
        assert t.start == approx(t.ts), t
    for it in g.iterations:
        assert it.simulated_us == approx(it.measured_us)


def basic_trace(schema="current", corr=True, flow=True) -> KT:
    """Step 1: a launch-bound GEMM, a queued ReLU, a stream sync that blocks on the ReLU.
    Step 2: one launch-bound GEMM and no sync. Launch lag 15 (the median of the launch-bound
    kernels), stream gap 1 (no queued sample: the default)."""
    k = KT(schema)
    k.op("ProfilerStep#1", 0, 200)
    k.op("aten::conv2d", 10, 30)
    k.launch(20, 10, SGEMM, 35, 50, corr=corr, flow=flow)          # K1 35..85
    k.launch(40, 10, RELU, 87, 20, corr=corr, flow=flow)           # K2 87..107 (queued)
    k.call("cudaStreamSynchronize", 60, 60)                        # 60..120, blocks on K2
    k.op("ProfilerStep#2", 200, 200)
    k.launch(220, 10, SGEMM2, 235, 10, corr=corr, flow=flow)       # K3 235..245
    return k


def _check_basic_edges(g: TaskGraph):
    L1, L2, L3 = (task(g, "cudaLaunchKernel", ts) for ts in (20, 40, 220))
    k1, k2, k3 = task(g, SGEMM, 35), task(g, RELU, 87), task(g, SGEMM2, 235)
    s = task(g, "cudaStreamSynchronize", 60)
    for L, k in ((L1, k1), (L2, k2), (L3, k3)):
        assert L.kind == "launch" and L.args["launches"] == [k]
        assert [(d.task, d.kind, d.anchor) for d in k.deps] == [(L, "launch", "start")]
        assert k.ops == L.ops
    assert s.kind == "sync" and [(d.task, d.kind) for d in s.waits] == [(k2, "sync")]
    assert L1.ops == ("ProfilerStep#1", "aten::conv2d") and L3.ops == ("ProfilerStep#2",)
    assert (k1.iteration, k2.iteration, k3.iteration, s.iteration) == (1, 1, 2, 1)
    assert g.meta["launch_lag_us"] == 15 and g.meta["stream_gap_us"] == 1
    assert k1.args["class"] == "gemm" and k2.args["class"] == "elementwise"
    assert k1.resource == k2.resource == "gpu0:stream 7"


@pytest.mark.parametrize("schema", ["2021", "current"])
def test_kineto_basic_graph_and_exact_replay(schema):
    g = basic_trace(schema).graph()
    assert g.meta["schema"] == schema and g.meta["device"] == "Test GPU"
    assert [(i.label, i.number, i.measured_us) for i in g.iterations] == [
        ("ProfilerStep#1", 1, 200), ("ProfilerStep#2", 2, 200)]
    _check_basic_edges(g)
    cpu = [r for r in g.resources if r.startswith("cpu:")]
    assert cpu == ["cpu:100/100"]
    # leaves: 2 step begins, 2 step ends, 3 launches, 1 sync (aten ops are no leaves)
    assert len(g.resources["cpu:100/100"]) == 8 and len(g.resources["gpu0:stream 7"]) == 3
    counts = edge_counts(g)
    assert (counts["cpu-order"], counts["gpu-order"], counts["launch"], counts["sync"]) == (7, 2, 3, 1)
    assert counts["comm"] == counts["cpu-cpu"] == counts["stream-wait"] == 0
    assert_exact_replay(g)
    assert task(g, "cudaStreamSynchronize", 60).end == 120


@pytest.mark.parametrize("schema", ["2021", "current"])
def test_kineto_launch_by_flow_ids_when_correlation_is_missing(schema):
    g = basic_trace(schema, corr=False).graph()
    _check_basic_edges(g)
    assert_exact_replay(g)


@pytest.mark.parametrize("schema", ["2021", "current"])
def test_kineto_halving_the_kernel_that_binds_a_sync(schema):
    g = basic_trace(schema).graph()
    h = parse("scale:sgemm_128=0.5").apply(g)
    h.simulate()
    # K1 35..60, K2 max(60 + gap 2, 40 + 15) = 62..82, sync ends 82 + 13, then 80 µs to the step end
    assert task(h, RELU, 87).start == 62
    assert task(h, "cudaStreamSynchronize", 60).end == 95
    assert [i.simulated_us for i in h.iterations] == [175, 200]
    g.simulate()
    assert [i.simulated_us for i in g.iterations] == [200, 200]      # the baseline is untouched


@pytest.mark.parametrize("schema", ["2021", "current"])
def test_kineto_launch_bound_kernel_does_not_move_when_gpu_is_faster(schema):
    h = parse("gpu-speed=2").apply(basic_trace(schema).graph())
    h.simulate()
    k1, k2, k3 = task(h, SGEMM, 35), task(h, RELU, 87), task(h, SGEMM2, 235)
    L3 = task(h, "cudaLaunchKernel", 220)
    assert (k1.start, k1.end) == (35, 60)             # bound by its launch: does not move
    assert (k2.start, k2.end) == (62, 72)             # bound by the stream: moves up
    assert task(h, "cudaStreamSynchronize", 60).end == 85
    assert (L3.start, k3.start, k3.end) == (185, 200, 205)   # 15 after its launch, as recorded
    assert [i.simulated_us for i in h.iterations] == [165, 200]


def test_kineto_nested_driver_call_is_folded_into_its_runtime_call():
    k = KT("current")
    k.op("ProfilerStep#1", 0, 100)
    k.call("cudaLaunchKernel", 20, 10, corr=1)
    k.call("cuLaunchKernel", 22, 6, corr=2, cat="cuda_driver")
    k.gpu(SGEMM, 35, 10, corr=2)
    g = k.graph()
    L = task(g, "cudaLaunchKernel", 20)
    assert [t.name for t in g.resources["cpu:100/100"] if t.kind != "marker"] == ["cudaLaunchKernel"]
    assert L.args["correlation"] == [1, 2] and L.args["launches"] == [task(g, SGEMM, 35)]
    assert_exact_replay(g)


def multi_stream_trace(schema="current") -> KT:
    k = KT(schema)
    k.op("ProfilerStep#1", 0, 300)
    k.launch(20, 10, SGEMM, 35, 100)                     # stream 7: 35..135
    k.launch(40, 10, SGEMM2, 55, 50, stream=20)          # stream 20: 55..105
    k.call("cudaDeviceSynchronize", 60, 90)              # 60..150: blocks on both streams
    return k


@pytest.mark.parametrize("schema", ["2021", "current"])
def test_kineto_device_synchronize_waits_for_every_stream(schema):
    g = multi_stream_trace(schema).graph()
    s = task(g, "cudaDeviceSynchronize", 60)
    k7, k20 = task(g, SGEMM, 35), task(g, SGEMM2, 55)
    assert (k7.resource, k20.resource) == ("gpu0:stream 7", "gpu0:stream 20")
    assert sorted((d.task.name, d.kind) for d in s.waits) == [(SGEMM, "sync"), (SGEMM2, "sync")]
    assert {id(d.task) for d in s.waits} == {id(k7), id(k20)}
    assert s.dur == 15                                   # its own cost: 150 - 135
    assert_exact_replay(g)
    h = parse("scale:sgemm_128=0.5").apply(g)
    h.simulate()                                         # stream 7: 35..85; stream 20 still ends 105
    assert task(h, "cudaDeviceSynchronize", 60).end == 120
    assert h.iterations[0].simulated_us == 270


def pageable_copy_trace(schema="current") -> KT:
    k = KT(schema)
    k.op("ProfilerStep#1", 0, 1000)
    k.launch(0, 10, SGEMM, 15, 400)                                        # 15..415
    k.launch(20, 500, "Memcpy HtoD (Pageable -> Device)", 416, 100, kind="memcpy",
             call="cudaMemcpyAsync", bytes=1 << 20)                        # call 20..520, copy 416..516
    k.call("cudaLaunchKernel", 600, 10)                                    # CPU work after the copy
    return k


@pytest.mark.parametrize("schema", ["2021", "current"])
def test_kineto_blocking_pageable_copy(schema):
    g = pageable_copy_trace(schema).graph()
    c = task(g, "cudaMemcpyAsync", 20)
    m = task(g, "Memcpy HtoD (Pageable -> Device)", 416)
    assert c.kind == "launch" and c.args["launches"] == [m]
    assert [(d.task, d.kind, d.anchor) for d in m.deps] == [(c, "launch", "start")]
    assert [(d.task, d.kind) for d in c.waits] == [(m, "sync")]          # the call waits for its own copy
    assert_exact_replay(g)
    assert c.end == 520


def test_kineto_blocking_copy_ends_earlier_when_the_copy_does():
    h = parse("scale:sgemm=0.5").apply(pageable_copy_trace().graph())
    h.simulate()
    # GEMM 15..215, copy 216..316 (stream gap 1), the call ends its 4 µs tail after the copy
    assert task(h, "Memcpy HtoD (Pageable -> Device)", 416).start == 216
    assert task(h, "cudaMemcpyAsync", 20).end == 320
    assert h.iterations[0].simulated_us == 800


def stream_wait_trace(kname=NCCL) -> KT:
    k = KT("current")
    k.launch(0, 10, SGEMM, 15, 5)                        # 15..20, launch-bound
    k.launch(20, 10, SGEMM, 35, 100)                     # 35..135, launch-bound
    k.call("cudaEventRecord", 40, 2)
    k.call("cudaStreamWaitEvent", 45, 2)
    k.launch(50, 10, kname, 140, 100, stream=20)         # 140..240: waits for the GEMM (+5)
    k.launch(300, 10, SGEMM2, 315, 10)                   # launch-bound
    return k


@pytest.mark.parametrize("kname,kind", [(NCCL, "comm"), (SGEMM2, "stream-wait")])
def test_kineto_stream_wait_event_edge(kname, kind):
    g = stream_wait_trace(kname).graph()
    gemm = task(g, SGEMM, 35)
    n = task(g, kname, 140)
    assert n.resource == "gpu0:stream 20" and n.kind == ("comm" if kind == "comm" else "kernel")
    assert [(d.task, d.kind) for d in n.deps] == [(task(g, "cudaLaunchKernel", 50), "launch"), (gemm, kind)]
    assert edge_counts(g)[kind] == 1
    assert_exact_replay(g)
    h = parse("gpu-speed=2").apply(g)
    h.simulate()
    # GEMM 35..85; the waiting task follows it (+5), not its launch (50 + 15); a faster GPU does
    # not shorten a collective (the network is not faster)
    n = task(h, kname, 140)
    assert (n.start, n.end) == ((90, 190) if kind == "comm" else (90, 140))


def cpu_cpu_trace() -> KT:
    """Main thread (tid 10) sleeps while the 'autograd' thread (tid 20) runs, and the other way round."""
    k = KT("current", tid=10)
    k.launch(0, 10, SGEMM, 15, 5)                        # a: main
    k.launch(30, 10, SGEMM, 45, 5, tid=20)               # c: wakes after a (lag 20)
    k.launch(100, 10, SGEMM, 115, 5, tid=20)             # d
    k.launch(200, 10, SGEMM, 215, 5)                     # b: main wakes after d (lag 90)
    return k


def test_kineto_cpu_cpu_edges_between_threads():
    g = cpu_cpu_trace().graph()
    a, b = task(g, "cudaLaunchKernel", 0), task(g, "cudaLaunchKernel", 200)
    c, d = task(g, "cudaLaunchKernel", 30), task(g, "cudaLaunchKernel", 100)
    assert a.resource == b.resource == "cpu:100/10" and c.resource == d.resource == "cpu:100/20"
    assert [(x.task, x.kind, x.lag) for x in c.deps] == [(a, "cpu-cpu", 20)]
    assert [(x.task, x.kind, x.lag) for x in b.deps] == [(d, "cpu-cpu", 90)]
    assert a.deps == [] and d.deps == []
    assert edge_counts(g)["cpu-cpu"] == 2
    assert_exact_replay(g)
    h = parse("no-launch-overhead").apply(g)
    h.simulate()
    # a 0..0; c max(0 + 20, 0 + 20) = 20; d 20 + 60 = 80; b max(0 + 90, 80 + 90) = 170
    assert [x.start for x in (task(h, "cudaLaunchKernel", ts) for ts in (0, 30, 100, 200))] == [0, 20, 80, 170]
    assert task(h, SGEMM, 215).start == 170


def test_kineto_cpu_cpu_edge_from_a_blocking_sync_replays_exactly():
    k = KT("current", tid=1)
    k.launch(0, 10, SGEMM, 15, 500)                        # 15..515
    k.call("cudaStreamSynchronize", 20, 510)               # 20..530, blocks (tail 15)
    k.launch(600, 10, SGEMM, 615, 500, tid=2)              # thread 2 wakes after the sync (lag 70)
    k.call("cudaStreamSynchronize", 620, 510, tid=2)       # 620..1130, blocks
    k.launch(1200, 10, SGEMM, 1215, 50)                    # thread 1 wakes after thread 2's sync
    g = k.graph()
    assert [d.task for d in task(g, "cudaLaunchKernel", 600).deps] == [task(g, "cudaStreamSynchronize", 20)]
    assert [d.task for d in task(g, "cudaLaunchKernel", 1200).deps] == [task(g, "cudaStreamSynchronize", 620)]
    assert_exact_replay(g)


def test_kineto_sync_with_gpu_end_just_after_the_call_replays_exactly():
    k = KT("current")
    k.op("ProfilerStep#1", 0, 300)
    k.launch(0, 10, SGEMM, 15, 100.5)                      # ends 115.5
    k.call("cudaStreamSynchronize", 20, 95)                # ends 115.0 (clock skew)
    k.launch(130, 10, SGEMM, 145, 5)
    g = k.graph()
    assert len(task(g, "cudaStreamSynchronize", 20).waits) == 1
    assert_exact_replay(g)


def test_kineto_profiler_step_numbers_current_schema():
    k = KT("current")
    for n, s in ((5, 0), (6, 120), (7, 250)):
        k.op(f"ProfilerStep#{n}", s, 100 if n != 7 else 90)
        k.launch(s + 10, 5, SGEMM, s + 20, 30)
    g = k.graph()
    assert g.meta["iteration_source"] == "ProfilerStep#N"
    assert [(i.label, i.number, i.measured_us) for i in g.iterations] == [
        ("ProfilerStep#5", 5, 100), ("ProfilerStep#6", 6, 100), ("ProfilerStep#7", 7, 90)]
    assert [t.iteration for t in g.select(kind="kernel")] == [5, 6, 7]
    assert_exact_replay(g)


def zero_grad_trace(schema="current") -> KT:
    k = KT(schema)
    for s in (0, 300, 600):
        k.op("Optimizer.zero_grad#SGD.zero_grad", s, 20)
        k.launch(s + 30, 10, SGEMM, s + 45, 100)
    return k


@pytest.mark.parametrize("schema", ["2021", "current"])
def test_kineto_iterations_regex_fallback(schema):
    k = zero_grad_trace(schema)
    assert k.graph().iterations == []
    g = k.graph(iterations=r"zero_grad")
    assert g.meta["iteration_source"] == "zero_grad"
    assert [(i.label, i.number, i.measured_us) for i in g.iterations] == [("zero_grad#0", 0, 300),
                                                                          ("zero_grad#1", 1, 300)]
    assert [t.iteration for t in g.select(kind="kernel")] == [0, 1, None]
    assert_exact_replay(g)
    h = parse("gpu-speed=2").apply(g)
    h.simulate()            # every kernel is launch-bound and nothing waits: the loop does not speed up
    assert [i.simulated_us for i in h.iterations] == [300, 300]
    with pytest.raises(TraceError, match="no CPU op or annotation matches --iterations"):
        k.graph(iterations=r"Optimizer\.step")
    with pytest.raises(TraceError, match="not a regular expression"):
        k.graph(iterations=r"zero_grad(")


def test_kineto_iterations_regex_single_match_uses_its_span_and_drops_wrappers():
    k = KT("current")
    k.op("[bench|model|measure]", 0, 400)                 # a harness's outer range: dropped
    k.op("[bench|model|measure|forward]", 50, 200)        # the one measured forward: 50..250
    k.launch(60, 10, SGEMM, 75, 100)                      # 75..175
    k.call("cudaDeviceSynchronize", 80, 100)              # 80..180, blocks (tail 5)
    k.launch(300, 10, SGEMM, 315, 10)
    g = k.graph(iterations=r"bench\|model")
    assert [(i.label, i.number, i.measured_us) for i in g.iterations] == [(r"bench\|model#0", 0, 200)]
    assert_exact_replay(g)
    h = parse("gpu-speed=4").apply(g)
    h.simulate()        # GEMM 75..100, the sync returns 5 µs later, the range closes 70 µs after that
    assert h.iterations[0].simulated_us == 200 - 75


def test_load_trace_gzip_and_plain_by_content(tmp_path):
    k = basic_trace("2021")
    for p, gz in ((tmp_path / "a.json", True), (tmp_path / "b.json.gz", False), (tmp_path / "c.json", False)):
        g = load_trace(k.write(p, gz))
        assert g.meta["source"] == str(p) and len(g) == 11
        assert_exact_replay(g)
    p = tmp_path / "bare.json"                       # the bare-array Chrome trace form
    p.write_text(json.dumps(k.data()["traceEvents"]))
    assert len(load_trace(p)) == 11


# =================================================================================================
# 3. Built-in what-ifs on hand-made traces, exact expected iteration times
# =================================================================================================

def train_trace(schema="current") -> KT:
    """One GPU-bound step: the CPU launches everything early, the stream runs it back to back
    (stream gap 1), a device sync blocks until the memset ends and returns 11 µs later; the step
    closes 440 µs after the sync. Step = K1 start 35 + work + 4 gaps + 11 + 440 (while every task
    stays stream-bound)."""
    k = KT(schema)
    k.op("ProfilerStep#1", 0, 1000)
    k.op("aten::mm", 10, 30)
    k.launch(20, 10, SGEMM, 35, 300)                                   # K1 gemm 35..335
    k.op("aten::relu", 50, 30)
    k.launch(60, 10, RELU, 336, 100)                                   # K2 elementwise 336..436
    k.launch(90, 10, BF16_GEMM, 437, 60)                               # K3 gemm, bf16 437..497
    k.launch(110, 10, "Memcpy DtoD (Device -> Device)", 498, 40, kind="memcpy", call="cudaMemcpyAsync")
    k.launch(122, 4, "Memset (Device)", 539, 10, kind="memset", call="cudaMemsetAsync")
    k.call("cudaDeviceSynchronize", 130, 430)                          # 130..560
    return k


@pytest.fixture(scope="module")
def train_graph():
    return train_trace().graph()       # what-ifs work on copies; tests that simulate it copy it first


def predict(g: TaskGraph, spec: str) -> list[float]:
    h = parse(spec).apply(g)
    h.simulate()
    return [it.simulated_us for it in h.iterations]


def test_train_trace_baseline(train_graph):
    g = train_graph.copy()
    assert g.meta["launch_lag_us"] == 15 and g.meta["stream_gap_us"] == 1
    assert task(g, "cudaDeviceSynchronize", 130).dur == 11
    assert_exact_replay(g)
    assert [i.simulated_us for i in g.iterations] == [1000]


@pytest.mark.parametrize("spec,expect", [
    # K1 300/3, K2 100/2, bf16 K3 unchanged, copy and memset unchanged: 35 + 260 + 4 + 11 + 440
    ("amp", 750),
    ("amp:compute=2,memory=4", 35 + 150 + 25 + 60 + 40 + 10 + 4 + 11 + 440),
    # kernels and memsets /2, the copy is not a kernel: 35 + 150 + 50 + 30 + 40 + 5 + 4 + 11 + 440
    ("gpu-speed=2", 765),
    ("gpu-speed:factor=2", 765),
    ("scale:sgemm=0.5", 850),                       # K1 only (the bf16 one is s16816gemm)
    ("scale:gemm=2", 35 + 600 + 100 + 120 + 40 + 10 + 4 + 11 + 440),
    ("scale:elementwise_kernel<4, at::native::relu=0", 900),
    # launches cost 0 and reach the GPU at once: K1 at 20 (not 35), Python gaps kept
    ("no-launch-overhead", 985),
])
def test_whatif_on_gpu_bound_step(train_graph, spec, expect):
    assert predict(train_graph, spec) == [approx(expect)]


def test_whatif_leaves_the_baseline_alone(train_graph):
    for spec in ("amp", "no-launch-overhead", "scale:gemm=2"):
        predict(train_graph, spec)
    g = train_graph.copy()
    g.simulate()
    assert [i.simulated_us for i in g.iterations] == [1000]
    assert task(train_graph, SGEMM, 35).dur == 300


def test_no_launch_overhead_timeline(train_graph):
    h = parse("no-launch-overhead").apply(train_graph)
    h.simulate()
    launches = [t for t in h.resources["cpu:100/100"] if t.kind == "launch"]
    assert [(t.start, t.dur) for t in launches] == [(20, 0), (50, 0), (70, 0), (80, 0), (82, 0)]
    assert [(t.start, t.end) for t in h.resources["gpu0:stream 7"]] == [
        (20, 320), (321, 421), (422, 482), (483, 523), (524, 534)]
    s = task(h, "cudaDeviceSynchronize", 130)
    assert (s.start, s.end) == (86, 545)


def fused_optimizer_trace() -> KT:
    """Two steps; in each, Optimizer.step launches 3 launch-bound per-parameter kernels, 10 µs of
    Python before each launch; a sync after the optimizer does not block."""
    k = KT("current")
    for s in (0, 1000):
        k.op(f"ProfilerStep#{1 + s // 1000}", s, 1000)
        k.launch(s + 20, 10, SGEMM, s + 35, 50)                        # forward: 35..85
        k.op("Optimizer.step#SGD.step", s + 100, 100)
        for j in range(3):
            k.launch(s + 110 + 20 * j, 10, SGD, s + 125 + 20 * j, 5)   # 125..130, 145..150, 165..170
        k.call("cudaDeviceSynchronize", s + 300, 10)
    return k


def test_whatif_fused_optimizer():
    g = fused_optimizer_trace().graph()
    assert_exact_replay(g)
    h = parse("fused-optimizer").apply(g)
    h.simulate()
    ks = h.select(kind="kernel", op=r"Optimizer\.step")
    assert [(k.name, k.dur, k.iteration) for k in ks] == [("fused optimizer (3 kernels)", 15, 1),
                                                          ("fused optimizer (3 kernels)", 15, 2)]
    # 2 launches (10 µs) and the 10 µs of Python before each go: 1000 - 40 per step
    assert [i.simulated_us for i in h.iterations] == [960, 960]
    assert (ks[0].start, ks[0].end) == (125, 140)          # after the one launch left at 110
    assert len(h.select(kind="launch", op="Optimizer")) == 2
    assert len(g.select(kind="launch", op="Optimizer")) == 6    # the baseline keeps its 6
    with pytest.raises(WhatIfError, match="no kernel was launched inside"):
        parse("fused-optimizer").apply(train_trace().graph())


def fuse_trace() -> KT:
    """GEMM, a chain of 3 memory-bound kernels (40 µs each), GEMM, a chain of 2 (30 + 10 µs); the
    stream is busy throughout (gap 1); a device sync blocks on the last one."""
    k = KT("current")
    k.op("ProfilerStep#1", 0, 1000)
    k.launch(20, 10, SGEMM, 35, 100)          # 35..135
    k.launch(40, 10, ADD, 136, 40)            # 136..176
    k.launch(60, 10, MEAN, 177, 40)           # 177..217 (a reduction)
    k.launch(80, 10, RELU, 218, 40)           # 218..258
    k.launch(100, 10, SGEMM, 259, 100)        # 259..359
    k.launch(120, 10, ADD, 360, 30)           # 360..390
    k.launch(140, 10, RELU, 391, 10)          # 391..401
    k.call("cudaDeviceSynchronize", 160, 260)  # 160..420
    return k


def test_whatif_fuse_elementwise_two_over_k_plus_one():
    g = fuse_trace().graph()
    assert_exact_replay(g)
    h = parse("fuse-elementwise").apply(g)
    h.simulate()
    stream = h.resources["gpu0:stream 7"]
    # chain of 3: 120 x 2/4 = 60 (> the longest, 40); chain of 2: 40 x 2/3 = 26.7 < 30, so 30
    assert [(t.name, t.dur) for t in stream] == [
        (SGEMM, 100), ("fused 3 memory-bound kernels", 60), (SGEMM, 100), ("fused 2 memory-bound kernels", 30)]
    assert [t.start for t in stream] == [35, 136, 197, 298]
    fused_away = [task(h, "cudaLaunchKernel", ts) for ts in (40, 60, 120)]
    assert [t.dur for t in fused_away] == [0, 0, 0]
    assert task(h, "cudaDeviceSynchronize", 160).end == 347
    assert [i.simulated_us for i in h.iterations] == [927]       # 347 + 580
    assert predict(g, "fuse-elementwise:min_chain=3") == [approx(1000 - 60 - 2)]   # chain of 3 only
    assert predict(g, "fuse-elementwise:min_chain=4") == [1000]


def ddp_trace(shapes=True) -> KT:
    """Backward with 3 gradients (AccumulateGrad: 0.5, 0.5, 0.25 MiB of fp32), then the optimizer
    kernel, then a sync that does not block (lag 0). Everything is launch-bound."""
    k = KT("current")
    k.op("ProfilerStep#1", 0, 2000)
    for s, dims in ((100, [256, 512]), (200, [256, 512]), (300, [128, 512])):
        args = {"Input Dims": [dims], "Input type": ["float"]} if shapes else {}
        k.op("torch::autograd::AccumulateGrad", s, 30, **args)
        k.launch(s + 10, 10, ADD, s + 25, 50)          # G1 125..175, G2 225..275, G3 325..375
    k.op("Optimizer.step#SGD.step", 400, 30)
    k.launch(410, 10, SGD, 425, 10)                    # 425..435
    k.call("cudaDeviceSynchronize", 440, 10)
    return k


def test_whatif_ddp_buckets_and_allreduce_times():
    g = ddp_trace().graph()
    assert_exact_replay(g)
    L1, L2, L3 = (task(g, "cudaLaunchKernel", ts) for ts in (110, 210, 310))
    assert [L1.args["gradients"], L2.args["gradients"], L3.args["gradients"]] == [[524288], [524288], [262144]]
    h = parse("ddp:gpus=2,bandwidth=1,bucket=1,latency=20").apply(g)
    h.simulate()
    net = h.resources["net:allreduce"]
    assert [t.name for t in net] == ["all-reduce bucket 0 (1.0 MiB)", "all-reduce bucket 1 (0.2 MiB)"]
    # ring all-reduce: 20 + 2(2-1)/2 x S / (1 GB/s = 1e3 B/µs)
    assert [t.dur for t in net] == [approx(20 + 1048.576), approx(20 + 262.144)]
    hL2, hL3 = task(h, "cudaLaunchKernel", 210), task(h, "cudaLaunchKernel", 310)
    hG2, hG3 = task(h, ADD, 225), task(h, ADD, 325)
    # compute -> communication: each bucket waits for its last gradient's CPU call and GPU kernel
    assert [(d.task, d.kind) for d in net[0].deps] == [(hL2, "cpu-cpu"), (hG2, "comm")]
    assert [(d.task, d.kind) for d in net[1].deps] == [(hL3, "cpu-cpu"), (hG3, "comm")]
    opt = task(h, SGD, 425)
    assert [(d.task, d.kind) for d in opt.deps if d.kind == "comm"] == [(net[0], "comm"), (net[1], "comm")]
    assert (net[0].start, net[0].end) == (275, approx(1343.576))
    assert (net[1].start, net[1].end) == (approx(1343.576), approx(1625.72))
    assert opt.start == approx(1625.72)
    # the sync returns when the optimizer kernel ends; the step closes 1550 µs after it
    assert [i.simulated_us for i in h.iterations] == [approx(1635.72 + 1550)]
    # one 25 MiB bucket: 1.25 MiB all-reduced from 375 (G3's end)
    h = parse("ddp:bandwidth=1").apply(g)
    h.simulate()
    assert [(t.start, t.dur) for t in h.resources["net:allreduce"]] == [(375, approx(20 + 1310.72))]
    assert [i.simulated_us for i in h.iterations] == [approx(375 + 1330.72 + 10 + 1550)]
    assert predict(g, "ddp:gpus=1") == [2000]


def test_whatif_ddp_without_shapes_needs_params():
    g = ddp_trace(shapes=False).graph()
    with pytest.raises(WhatIfError, match="params="):
        parse("ddp").apply(g)
    h = parse("ddp:bandwidth=1,bucket=1,params=0.786432").apply(g)   # 3 MiB of fp32: 1 MiB each
    assert [t.dur for t in h.resources["net:allreduce"]] == [approx(20 + 1048.576)] * 3
    with pytest.raises(WhatIfError, match="AccumulateGrad"):
        parse("ddp").apply(train_trace().graph())


def dataloader_trace(steps: int, dl: int, kdur: int) -> KT:
    """Each 1000 µs step: the DataLoader runs [0, dl) (a 10 µs call at 100 inside), then a launch
    at dl+10, a kernel of `kdur` 25 µs after it, and a stream sync that returns 15 µs after it."""
    k = KT("current")
    for n in range(steps):
        s = 1000 * n
        k.op(f"ProfilerStep#{n + 1}", s, 1000)
        k.op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", s, dl)
        k.call("cudaEventQuery", s + 100, 10)
        k.launch(s + dl + 10, 10, SGEMM, s + dl + 35, kdur)
        k.call("cudaStreamSynchronize", s + dl + 30, kdur + 20)
    return k


def test_whatif_dataloader_workers_keep_up():
    g = dataloader_trace(3, 300, 500).graph()
    assert_exact_replay(g)
    h = parse("dataloader:workers=1,slowdown=1,handoff=50").apply(g)
    h.simulate()
    # handoff 50, launch gap 10, lag 25, kernel 500, sync tail 15, 150 to the step's end
    assert [i.simulated_us for i in h.iterations] == [750, 750, 750]
    workers = h.resources["cpu:dataloader worker 0"]
    assert [(t.name, t.dur) for t in workers] == [("load batch 0", 0), ("load batch 1", 0), ("load batch 2", 300)]
    assert (workers[2].start, workers[2].end) == (50, 350)     # refills the slot batch 0 freed
    assert predict(g, "dataloader:workers=1,slowdown=1,handoff=200") == [900, 900, 900]


def test_whatif_dataloader_workers_fall_behind():
    g = dataloader_trace(4, 800, 100).graph()
    assert_exact_replay(g)
    # 50 + 10 + 25 + 100 + 15 + 50 = 250 while prefetched batches last; one worker then needs
    # 800 µs per batch: batch 2 is ready at 50 + 800 (step 3 began at 500), batch 3 at 850 + 800
    # (step 4 began at 1050): 850 - 500 + 200 and 1650 - 1050 + 200
    assert predict(g, "dataloader:workers=1,slowdown=1,handoff=50") == [250, 250, 550, 800]
    assert predict(g, "dataloader:workers=2,slowdown=1,handoff=50") == [250, 250, 250, 250]
    h = parse("dataloader:workers=1,slowdown=2,handoff=50").apply(g)
    assert task(h, "cudaLaunchKernel", 810).dur == 20            # the loop's own calls slow down
    assert task(h, "cudaEventQuery", 100).dur == 0               # the loading itself moved to workers
    with pytest.raises(WhatIfError, match="workers must be at least 1"):
        parse("dataloader:workers=0").apply(g)
    with pytest.raises(WhatIfError, match="no annotation matching"):
        parse("dataloader").apply(train_trace().graph())


def test_whatif_fuse_elementwise_leaves_non_memory_bound_kernels_alone():
    other = "cask_cudnn::computeOffsetsKernel(cask_cudnn::ComputeOffsetsParams)"
    k = KT("current")
    k.op("ProfilerStep#1", 0, 1000)
    k.launch(20, 10, SGEMM, 35, 100)          # 35..135
    k.launch(40, 10, ADD, 136, 40)            # 136..176
    k.launch(60, 10, other, 177, 40)          # 177..217
    k.launch(80, 10, RELU, 218, 40)           # 218..258
    k.launch(100, 10, SGEMM, 259, 100)        # 259..359
    k.call("cudaDeviceSynchronize", 160, 220)  # 160..380
    g = k.graph()
    assert task(g, other, 177).args["class"] == "other"
    # no two memory-bound kernels are adjacent: nothing to fuse
    assert predict(g, "fuse-elementwise") == [1000]


# =================================================================================================
# 4. What-if specs and user what-if files
# =================================================================================================

BUILTINS = ("amp", "ddp", "dataloader", "fuse-elementwise", "fused-optimizer", "gpu-speed", "no-launch-overhead",
            "scale")


def test_parse_specs():
    c = parse("gpu-speed=2")
    assert c.what.name == "gpu-speed" and c.params == {"factor": 2.0}
    assert parse(" amp ").params == {}
    assert parse("amp:compute=4").params == {"compute": 4.0}
    assert parse("dataloader:workers=2,slowdown=1,handoff=50").params == {"workers": 2, "slowdown": 1.0,
                                                                         "handoff": 50.0}
    assert isinstance(parse("dataloader:workers=2").params["workers"], int)
    # scale: the regex may hold ':' and '='; the factor follows the last '='
    assert parse("scale:at::native.*a=b=0.25").params == {"pattern": "at::native.*a=b", "factor": 0.25}


def test_parse_errors():
    with pytest.raises(WhatIfError) as e:
        parse("warp-speed")
    msg = str(e.value)
    assert "unknown what-if 'warp-speed'" in msg and all(n in msg for n in BUILTINS)
    with pytest.raises(WhatIfError, match=r"factor='fast' is not a float"):
        parse("gpu-speed=fast")
    with pytest.raises(WhatIfError, match=r"workers='2.5' is not an int"):
        parse("dataloader:workers=2.5")
    with pytest.raises(WhatIfError, match=r"has no parameter 'turbo'; it takes: amp:compute=3.0,memory=2.0"):
        parse("amp:turbo=1")
    with pytest.raises(WhatIfError, match=r"'gpu-speed' needs factor; write gpu-speed=FACTOR"):
        parse("gpu-speed")
    with pytest.raises(WhatIfError, match=r"'scale' needs pattern, factor"):
        parse("scale")
    with pytest.raises(WhatIfError, match=r"write scale:REGEX=FACTOR"):
        parse("scale:gemm")
    with pytest.raises(WhatIfError, match=r"takes compute, memory parameters"):
        parse("amp=2")
    with pytest.raises(WhatIfError, match=r"'workers' is not key=value"):
        parse("dataloader:workers")
    g = basic_trace().graph()
    with pytest.raises(WhatIfError, match=r"no kernel name matches 'tensorcore_nothing'"):
        parse("scale:tensorcore_nothing=0.5").apply(g)
    with pytest.raises(WhatIfError, match=r"not a regular expression"):
        parse("scale:gemm(=0.5").apply(g)


@pytest.fixture
def user_whatifs():
    before = dict(W.WHATIFS)
    yield
    W.WHATIFS.clear()
    W.WHATIFS.update(before)


def test_user_whatif_file_is_loaded_and_applied(tmp_path, user_whatifs):
    f = tmp_path / "my_opt.py"
    f.write_text(
        "from dlcc.estimate.whatif import whatif\n"
        "\n"
        "@whatif('test-fast-gemm', help='GEMMs faster')\n"
        "def fast_gemm(g, factor: float = 2.0):\n"
        "    g.shrink(g.select(kind='kernel', name='sgemm'), factor)\n")
    assert W.load_file(f) == ["test-fast-gemm"]
    w = W.WHATIFS["test-fast-gemm"]
    assert w.help == "GEMMs faster" and w.source != "built-in" and w.signature() == "test-fast-gemm:factor=2.0"
    g = basic_trace().graph()
    assert predict(g, "test-fast-gemm") == [175, 200]                 # same as scale:sgemm_128=0.5
    assert predict(g, "test-fast-gemm:factor=1") == [200, 200]
    # through trace mode: every what-if of the file is predicted
    p = basic_trace().write(tmp_path / "t.json")
    est = estimate_trace(p, [], [str(f)])
    assert [c.spec for c, _ in est.what_ifs] == ["test-fast-gemm"]
    d = est.to_dict()
    assert (d["measured_ms"], d["baseline_ms"]) == (approx(0.2), approx(0.2))
    assert d["what_ifs"][0]["name"] == "test-fast-gemm"
    assert d["what_ifs"][0]["predicted_ms"] == approx((0.175 + 0.2) / 2)
    est = estimate_trace(p, ["test-fast-gemm:factor=4"], [str(f)])   # given on the command line too
    assert [c.spec for c, _ in est.what_ifs] == ["test-fast-gemm:factor=4"]


def test_user_whatif_file_errors(tmp_path, user_whatifs):
    bad = tmp_path / "bad.py"
    bad.write_text("from dlcc.estimate.whatif import whatif\n\n@whatif('x')\ndef f(g):\n    return (\n")
    with pytest.raises(WhatIfError) as e:
        W.load_file(bad)
    assert str(bad) in str(e.value) and "SyntaxError" in str(e.value) and "line 5" in str(e.value)
    boom = tmp_path / "boom.py"
    boom.write_text("import os\n\nx = 1 / 0\n")
    with pytest.raises(WhatIfError, match=r"boom\.py: line 3: ZeroDivisionError"):
        W.load_file(boom)
    empty = tmp_path / "empty.py"
    empty.write_text("X = 1\n")
    with pytest.raises(WhatIfError, match="defines no what-if"):
        W.load_file(empty)
    with pytest.raises(WhatIfError, match="no such what-if file"):
        W.load_file(tmp_path / "missing.py")
    raises = tmp_path / "raises.py"
    raises.write_text(
        "from dlcc.estimate.whatif import whatif\n"
        "\n"
        "@whatif('test-raises')\n"
        "def f(g):\n"
        "    ks = g.select(kind='kernel')\n"
        "    return ks[1000]\n")
    W.load_file(raises)
    with pytest.raises(WhatIfError) as e:
        parse("test-raises").apply(basic_trace().graph())
    assert f"{raises}:6" in str(e.value) and "IndexError" in str(e.value) and "'test-raises' failed" in str(e.value)


def test_user_whatif_error_inside_a_primitive_names_the_users_line(tmp_path, user_whatifs):
    f = tmp_path / "sched.py"
    f.write_text(
        "from dlcc.estimate.whatif import whatif\n"
        "\n"
        "@whatif('test-sched')\n"
        "def f(g):\n"
        "    g.schedule('net:nothing', key=lambda t: t.priority)\n")
    W.load_file(f)
    with pytest.raises(WhatIfError) as e:
        parse("test-sched").apply(basic_trace().graph())
    assert f"{f}:5" in str(e.value)


# =================================================================================================
# 5. Bad traces
# =================================================================================================

def _load_error(tmp_path, raw: bytes, name="t.json") -> str:
    p = tmp_path / name
    p.write_bytes(raw)
    with pytest.raises(TraceError) as e:
        load_trace(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}: ")
    return msg[len(str(p)):]          # without the path (pytest's tmp_path holds the test's name)


def test_bad_trace_files(tmp_path):
    good = json.dumps(basic_trace().data()).encode()
    assert "not valid JSON at line 1 column 1" in _load_error(tmp_path, b"hello, world")
    assert "not a text JSON file" in _load_error(tmp_path, b"\x80\x81 binary")
    assert "gzip stream is truncated or corrupt" in _load_error(tmp_path, gzip.compress(good)[: len(gzip.compress(good)) // 2])
    msg = _load_error(tmp_path, good[: good.rfind(b",") + 1])          # cut after a comma
    assert "not valid JSON" in msg and "truncated" in msg
    msg = _load_error(tmp_path, b'{"foo": 1}')
    assert "not a Chrome trace" in msg and "traceEvents" in msg
    assert "traceEvents" in _load_error(tmp_path, b'{"traceEvents": {"a": 1}}')
    assert "traceEvents" in _load_error(tmp_path, b'"just a string"')
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(tmp_path / "missing.json")


def test_truncated_json_inside_a_string_says_truncated(tmp_path):
    good = json.dumps(basic_trace().data()).encode()
    cut = good[: good.index(b"volta_sgemm") + 5]
    assert "truncated" in _load_error(tmp_path, cut)


def test_bad_trace_contents():
    k = KT("current")
    k.op("ProfilerStep#1", 0, 100)
    k.call("cudaLaunchKernel", 10, 5)
    with pytest.raises(TraceError, match="no GPU activity"):
        k.graph()
    k = basic_trace()
    k.events[3]["ts"] = "soon"                       # the first kernel
    assert k.events[3]["cat"] == "kernel"
    with pytest.raises(TraceError, match=r"test: event .*volta_sgemm.* \(cat 'kernel'\) has no numeric 'ts'"):
        k.graph()
    k = basic_trace()
    del k.events[1]["dur"]                           # aten::conv2d
    with pytest.raises(TraceError, match=r"'aten::conv2d' \(cat 'cpu_op'\) has no numeric 'dur'"):
        k.graph()


def test_trace_mode_errors(tmp_path):
    p = zero_grad_trace().write(tmp_path / "no_steps.json")
    with pytest.raises(TraceError, match="no iterations") as e:
        estimate_trace(p)
    assert "--iterations" in str(e.value)
    est = estimate_trace(p, ["gpu-speed=2"], iterations="zero_grad")
    assert [r["measured_ms"] for r in est.to_dict()["iterations"]] == [0.3, 0.3]
    p = basic_trace().write(tmp_path / "t.json")
    with pytest.raises(TraceError, match=r"--steps 7: no such iterations in .* \(it has 1, 2\)"):
        estimate_trace(p, steps="7")
    with pytest.raises(TraceError, match=r"write N or N\.\.M"):
        estimate_trace(p, steps="one")
    with pytest.raises(TraceError, match=r"the range is empty"):
        estimate_trace(p, steps="2..1")
    with pytest.raises(WhatIfError, match="unknown what-if"):    # checked before the trace is read
        estimate_trace(tmp_path / "missing.json", ["nope"])
    est = estimate_trace(p, ["scale:sgemm_128=0.5"], steps="1")
    d = est.to_dict()
    assert [r["iteration"] for r in d["iterations"]] == ["ProfilerStep#1"]
    assert d["what_ifs"][0]["predicted_ms"] == approx(0.175)
    assert d["iterations"][0]["what_ifs"] == {"scale:sgemm_128=0.5": approx(0.175)}
    d = estimate_trace(p, ["scale:sgemm_128=0.5"], steps="1..2").to_dict()
    assert [r["number"] for r in d["iterations"]] == [1, 2]
    assert d["what_ifs"][0]["speedup"] == approx(0.2 / 0.1875)


# =================================================================================================
# 6. Real traces (../shared/traces): the acceptance thresholds
# =================================================================================================

NW0 = "v100_resnet50_train_bs32_nw0_steps05-10.json.gz"
NW4 = "v100_resnet50_train_bs32_nw4_steps05-10.json.gz"


@pytest.fixture(scope="module")
def v100():
    missing = [n for n in (NW0, NW4) if not (TRACES / n).is_file()]
    if missing:
        pytest.skip(f"real traces not found: {', '.join(missing)} in {TRACES} (set DLCC_TRACES to the "
                    f"directory holding ../shared/traces)")
    out = {}
    for n in (NW0, NW4):
        g = load_trace(TRACES / n)
        g.simulate()
        out[n] = g
    return out


def _mean(its, attr):
    return statistics.mean(getattr(i, attr) for i in its)


@pytest.mark.parametrize("name,measured_ms", [(NW0, 174.829), (NW4, 139.692)])
def test_real_v100_baseline_within_3pct(v100, name, measured_ms):
    g = v100[name]
    assert g.meta["schema"] == "2021" and g.meta["device"] == "Tesla V100-DGXS-32GB"
    assert [i.label for i in g.iterations] == [f"ProfilerStep#{n}" for n in range(5, 11)]
    measured = _mean(g.iterations, "measured_us")
    assert measured / 1e3 == pytest.approx(measured_ms, abs=0.0005)      # the README's mean step
    assert abs(_mean(g.iterations, "simulated_us") - measured) <= 0.03 * measured
    off = [t for t in g.tasks if t.ts is not None and abs(t.start - t.ts) > 1e-6]
    assert off == []                                                   # in fact an exact replay


def test_real_v100_dataloader_predicts_num_workers_4(v100):
    h = parse("dataloader").apply(v100[NW0])
    h.simulate()
    predicted = _mean(h.iterations, "simulated_us")
    measured_nw4 = _mean(v100[NW4].iterations, "measured_us")
    assert abs(predicted - measured_nw4) <= 0.08 * measured_nw4, (predicted, measured_nw4)
    assert predicted < 0.9 * _mean(v100[NW0].iterations, "measured_us")     # it is a real speed-up


# =================================================================================================
# 7. The CLI
# =================================================================================================

def run_cli(argv, capsys):
    from dlcc.cli import main

    code = 0
    try:
        main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_estimate_trace_json_and_timeline(tmp_path, capsys):
    p = basic_trace("2021").write(tmp_path / "run.json.gz", gz=True)
    tl = tmp_path / "t.json"
    code, out, err = run_cli(["estimate", "--trace", str(p), "-w", "gpu-speed=2", "-w", "scale:sgemm_128=0.5",
                              "--json", "--timeline", str(tl)], capsys)
    assert code == 0, err
    d = json.loads(out)
    assert d["measured_ms"] == approx(0.2) and d["baseline_ms"] == approx(0.2)
    assert d["schema"] == "2021" and d["device"] == "Test GPU"
    assert [(w["name"], w["predicted_ms"]) for w in d["what_ifs"]] == [
        ("gpu-speed=2", approx((0.165 + 0.2) / 2)), ("scale:sgemm_128=0.5", approx((0.175 + 0.2) / 2))]
    assert [r["what_ifs"]["gpu-speed=2"] for r in d["iterations"]] == [approx(0.165), approx(0.2)]
    assert d["dependencies"]["launch"] == 3 and d["dependencies"]["sync"] == 1
    doc = json.loads(tl.read_text())
    ev = doc["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e["name"] == "process_name"}
    assert sorted(procs.values()) == ["baseline (replay)", "what-if gpu-speed=2", "what-if scale:sgemm_128=0.5"]
    for e in ev:
        assert e["ph"] in ("M", "X") and e["pid"] in procs
        if e["ph"] == "X":
            assert isinstance(e["ts"], (int, float)) and e["dur"] >= 0
    by = {name: pid for pid, name in procs.items()}
    its = [(e["name"], e["dur"]) for e in ev if e["ph"] == "X" and e["cat"] == "iteration"
           and e["pid"] == by["what-if gpu-speed=2"]]
    assert its == [("ProfilerStep#1", 165), ("ProfilerStep#2", 200)]
    k1 = [e for e in ev if e["ph"] == "X" and e["name"] == SGEMM and e["pid"] == by["what-if gpu-speed=2"]]
    assert [(e["ts"], e["dur"]) for e in k1] == [(35, 25)]
    assert not [e for e in ev if e["ph"] == "X" and e["cat"] == "marker"]
    # without --json: a table on stdout
    code, out, err = run_cli(["estimate", "--trace", str(p), "-w", "amp", "-q"], capsys)
    assert code == 0 and "measured" in out and "amp" in out


@pytest.mark.parametrize("argv,msg", [
    (["-w", "warp-speed"], "unknown what-if 'warp-speed'"),
    (["-w", "gpu-speed=fast"], "is not a float"),
    (["--steps", "9"], "no such iterations"),
    (["MODEL"], "give either an ONNX MODEL"),
    (["MISSING"], "cannot read"),
])
def test_cli_estimate_bad_input(tmp_path, capsys, argv, msg):
    p = basic_trace().write(tmp_path / "run.json")
    if argv == ["MODEL"]:
        argv = [str(tmp_path / "model.onnx")]
    if argv == ["MISSING"]:
        p, argv = tmp_path / "missing.json", []
    code, out, err = run_cli(["estimate", *argv, "--trace", str(p), "--json"], capsys)
    assert code == 2
    assert out == ""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and msg in lines[0], err
    assert "Traceback" not in err


# ---------------------------------------------------------------------------------------------
# 8. Combined what-ifs and the GPU-busy share
# ---------------------------------------------------------------------------------------------

def test_combined_what_if_is_the_sequence():
    g = basic_trace().graph()
    both = parse("gpu-speed=2+no-launch-overhead").apply(g)
    seq = parse("no-launch-overhead").apply(parse("gpu-speed=2").apply(g))
    both.simulate()
    seq.simulate()
    assert [i.simulated_us for i in both.iterations] == [i.simulated_us for i in seq.iterations]
    assert parse("gpu-speed=2+no-launch-overhead").help.endswith("(applied in this order)")
    # a '+' inside scale's regex does not split
    c = parse("scale:GEMM+x=0.5")
    assert not c.then and c.params == {"pattern": "GEMM+x", "factor": 0.5}
    with pytest.raises(WhatIfError, match=r"unknown what-if 'amp\+nope'"):
        parse("amp+nope")


def test_gpu_busy_share_by_hand():
    """Step 1 (0..200): K1 35..85 and K2 87..107 run: 70 µs busy; step 2 (200..400): K3 10 µs.
    Busy share = 80 / 400."""
    from dlcc.estimate.trace_mode import gpu_busy

    g = basic_trace().graph()
    g.simulate()
    assert gpu_busy(g, g.iterations) == pytest.approx(80 / 400)
