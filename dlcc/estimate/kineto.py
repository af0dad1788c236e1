"""Read a PyTorch profiler (Kineto) Chrome trace into a Daydream task graph.

Both schemas seen in the wild are read (see ../shared/traces/README.md):

- 2021: ``Operator`` / ``Runtime`` / ``Kernel`` / ``Memcpy`` / ``Memset``, launch flows ``async``;
- current: ``cpu_op`` / ``user_annotation`` / ``cuda_runtime`` / ``cuda_driver`` / ``kernel`` /
  ``gpu_memcpy`` / ``gpu_memset``, launch flows ``ac2g``.

How the graph is made (and why):

- **CPU threads** become sequences of *leaf* tasks: the CUDA runtime/driver calls (a call nested in
  another is folded into it), plus zero-length markers at the begin and end of every annotation
  (``ProfilerStep#N``, ``enumerate(DataLoader)#...``, ``Optimizer.step#...``, user
  ``record_function`` ranges). Framework and Python time between leaves is each leaf's *gap*, and
  every leaf carries the stack of ops and annotations around it, which is how what-ifs select
  "the data loading" or "the optimizer".
- **GPU streams** hold kernels, memcpys and memsets in recorded order; NCCL kernels are kind "comm".
- **Edges:** launch → GPU task (by ``correlation``, else by flow ids); GPU → CPU for synchronize
  calls and blocking copies (the call's *end* waits); ``cudaStreamWaitEvent`` → the next GPU task
  waits for the other streams' last launched work (kind "comm" when it is a collective, i.e.
  compute → communication); CPU → CPU where one thread sleeps while another runs (autograd's
  backward thread).
- **Gaps and lags are fitted to the recording** so that replaying the unmodified graph gives back
  the measured times; each task's slack goes to the constraint that bound it (the stream for a
  queued kernel, the launch for a starved one), so a what-if moves a task exactly when what held
  it back moves.
"""
from __future__ import annotations

import bisect
import gzip
import json
import re
import statistics
import zlib
from collections import defaultdict
from pathlib import Path

from ..errors import TraceError
from .graph import Dep, Iteration, Task, TaskGraph
from .kernelclass import classify_kernel

CPU_OP_CATS = {"Operator", "cpu_op", "user_annotation"}
RUNTIME_CATS = {"Runtime", "cuda_runtime", "cuda_driver"}
GPU_CATS = {"Kernel": "kernel", "kernel": "kernel", "Memcpy": "memcpy", "gpu_memcpy": "memcpy",
            "Memset": "memset", "gpu_memset": "memset"}
FLOW_CATS = {"async", "ac2g"}
SYNC_CALL = re.compile(r"Synchronize")
STEP = re.compile(r"^ProfilerStep#(\d+)$")
# An annotation (record_function range) rather than an aten op: these get begin/end markers.
ANNOTATION = re.compile(r"#|^\[|^## ")

CPU_CPU_MIN_GAP_US = 20.0   # a thread idle for less than this was not waiting for another thread


def read_trace_json(path: str | Path) -> dict:
    """The trace as a dict; gzip or plain (by content, not by suffix). Clear errors when broken."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror or e}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as e:
            raise TraceError(f"{path}: the gzip stream is truncated or corrupt ({e})") from None
    try:
        data = json.loads(raw)
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a text JSON file (or a gzip of one)") from None
    except RecursionError:
        raise TraceError(f"{path}: JSON nested too deeply to be a profiler trace") from None
    except json.JSONDecodeError as e:
        hint = " (the file looks truncated)" if e.pos >= len(raw) - 2 or "Unterminated" in e.msg else ""
        raise TraceError(f"{path}: not valid JSON at line {e.lineno} column {e.colno}: {e.msg}{hint}") from None
    if isinstance(data, list):  # the bare-array Chrome trace form
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(f"{path}: not a Chrome trace: expected an object with a 'traceEvents' list")
    return data


class _Leaf:
    """A CPU leaf under construction: one or more nested runtime calls folded together."""

    __slots__ = ("ts", "end", "name", "corrs", "kind", "rank")

    def __init__(self, ts, end, name, corr, kind, rank=1):
        self.ts, self.end, self.name, self.kind, self.rank = ts, end, name, kind, rank
        self.corrs = [corr] if corr is not None else []


def _num(e, key, where):
    v = e.get(key)
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise TraceError(f"{where}: event {e.get('name')!r} (cat {e.get('cat')!r}) has no numeric {key!r}")
    return float(v)


def load_trace(path: str | Path, iterations: str | None = None) -> TaskGraph:
    """The task graph of a Kineto trace file.

    `iterations` is a regex for the annotation whose starts delimit iterations; the default uses
    ``ProfilerStep#N`` spans. A trace with neither yields a graph without iterations (replayable,
    but `estimate` needs iterations and says so).
    """
    data = read_trace_json(path)
    return build_graph(data, str(path), iterations)


#: The fields the reader uses, and the JSON types a profiler writes for them.
_FIELD_TYPES = {"name": (str,), "cat": (str,), "ph": (str,), "pid": (int, str), "tid": (int, str),
                "id": (int, str), "args": (dict,)}
_ARG_TYPES = {"correlation": (int,), "External id": (int,), "stream": (int,), "device": (int,)}


def _check_event(e: dict, k: int, where: str) -> None:
    """A field of the wrong JSON type (a name that is a number, args that are a list, a list as a
    correlation id) is one TraceError naming the event, instead of a TypeError deep in the
    simulator. Absent fields stay absent; the reader treats them as before."""
    def bad(field, v, types):
        want = " or ".join("an integer" if t is int else {str: "a string", dict: "an object"}[t] for t in types)
        raise TraceError(f"{where}: traceEvents[{k}]: {field} is {type(v).__name__} {str(v)[:40]!r}, expected {want}")

    for f, types in _FIELD_TYPES.items():
        v = e.get(f)
        if v is None:
            e.pop(f, None)  # JSON null is an absent field (the reader's defaults apply)
        elif not isinstance(v, types) or isinstance(v, bool):
            bad(repr(f), v, types)
    args = e.get("args")
    if args:
        for f, types in _ARG_TYPES.items():
            v = args.get(f)
            if v is None:
                args.pop(f, None)
            elif not isinstance(v, types) or isinstance(v, bool):
                bad(f"args[{f!r}]", v, types)


def build_graph(data: dict, where: str = "trace", iterations: str | None = None) -> TaskGraph:
    events = data["traceEvents"]
    for k, e in enumerate(events):
        if isinstance(e, dict):
            _check_event(e, k, where)
    cpu_ops: dict[tuple, list] = defaultdict(list)
    runtime: dict[tuple, list] = defaultdict(list)
    gpu: list[dict] = []
    flows_s: dict = {}
    flows_f: dict = {}
    schema = None
    for e in events:
        if not isinstance(e, dict):
            continue
        ph, cat = e.get("ph"), e.get("cat")
        if ph == "X":
            if cat in CPU_OP_CATS:
                cpu_ops[(e.get("pid"), e.get("tid"))].append(e)
                schema = schema or ("2021" if cat == "Operator" else None)
            elif cat in RUNTIME_CATS:
                runtime[(e.get("pid"), e.get("tid"))].append(e)
                schema = "2021" if cat == "Runtime" else "current"
            elif cat in GPU_CATS:
                gpu.append(e)
        elif ph in ("s", "f") and cat in FLOW_CATS:
            (flows_s if ph == "s" else flows_f)[e.get("id")] = e
    if not gpu:
        raise TraceError(f"{where}: no GPU activity (kernel, memcpy or memset events) in the trace; "
                         f"was it recorded with ProfilerActivity.CUDA?")
    for e in gpu:
        _num(e, "ts", where), _num(e, "dur", where)
    for lst in list(cpu_ops.values()) + list(runtime.values()):
        for e in lst:
            _num(e, "ts", where), _num(e, "dur", where)

    t0 = min([float(e["ts"]) for e in gpu] + [float(e["ts"]) for lst in runtime.values() for e in lst]
             + [float(e["ts"]) for lst in cpu_ops.values() for e in lst])
    g = TaskGraph(meta={"source": where, "schema": schema or "current", "origin_us": t0,
                        "device": _device_name(data)})

    # ---- iterations: ProfilerStep#N spans, or starts of a user-chosen annotation -------------
    step_spans = []
    if iterations:
        try:
            rx = re.compile(iterations)
        except re.error as e:
            raise TraceError(f"--iterations {iterations!r} is not a regular expression: {e}") from None
        # a thread key (pid, tid) may mix ints, strings and absent ids: order by time, then its text
        found = sorted({(float(e["ts"]), float(e["dur"]), k) for k, lst in cpu_ops.items() for e in lst
                        if rx.search(e.get("name", ""))}, key=lambda f: (f[0], f[1], str(f[2])))
        if not found:
            raise TraceError(f"{where}: no CPU op or annotation matches --iterations {iterations!r}")
        # a match that encloses another match is a wrapper (a harness's outer range): keep the inner
        found = [f for f in found if not any(o is not f and f[0] <= o[0] and o[0] + o[1] <= f[0] + f[1]
                                             and (o[0], o[1]) != (f[0], f[1]) for o in found)]
        if len(found) == 1:  # one match: its own span is the iteration (e.g. one measured forward)
            a, d, k = found[0]
            step_spans.append((a - t0, a + d - t0, k, f"{iterations}#0", 0))
        for n, ((a, _, k), (b, _, _)) in enumerate(zip(found, found[1:])):  # else start to next start
            step_spans.append((a - t0, b - t0, k, f"{iterations}#{n}", n))
    else:
        for k, lst in cpu_ops.items():
            for e in lst:
                m = STEP.match(e.get("name", ""))
                if m:
                    a = float(e["ts"]) - t0
                    step_spans.append((a, a + float(e["dur"]), k, e["name"], int(m.group(1))))
        step_spans.sort(key=lambda s: (s[0], s[1], str(s[2]), s[3], s[4]))  # thread keys as above

    # ---- CPU leaves per thread ------------------------------------------------------------
    corr_owner: dict = {}
    cpu_tasks_by_thread: dict[tuple, list[Task]] = {}
    marker_points: dict[tuple, list] = defaultdict(list)
    for k, lst in cpu_ops.items():
        for e in lst:
            name = e.get("name", "")
            if ANNOTATION.search(name) and not STEP.match(name):
                a = float(e["ts"]) - t0
                marker_points[k].append((a, 0, f"begin {name}"))
                marker_points[k].append((a + float(e["dur"]), 2, f"end {name}"))
    for a, b, k, label, n in step_spans:
        marker_points[k].append((a, -1, f"begin {label}"))
        marker_points[k].append((b, 3, f"end {label}"))
    threads = set(runtime) | set(marker_points)
    step_marker: dict[str, Task] = {}
    for k in threads:
        leaves: list[_Leaf] = []
        for e in sorted(runtime.get(k, ()), key=lambda e: (float(e["ts"]), -float(e["dur"]))):
            a = float(e["ts"]) - t0
            b = a + float(e["dur"])
            corr = (e.get("args") or {}).get("correlation")
            if leaves and a < leaves[-1].end:        # nested (driver call inside a runtime call)
                if corr is not None:
                    leaves[-1].corrs.append(corr)
                leaves[-1].end = max(leaves[-1].end, b)
                continue
            leaves.append(_Leaf(a, b, e.get("name", "?"), corr, "cpu"))
        for (a, pri, name) in marker_points.get(k, ()):
            leaves.append(_Leaf(a, a, name, None, "marker", pri))
        # markers sort around calls at the same instant: step begin, begins, calls, ends, step end
        leaves.sort(key=lambda L: (L.ts, L.rank))
        res = f"cpu:{k[0]}/{k[1]}"
        # a call's ops: those open at its middle; a marker's: those open just before its instant,
        # so a span's begin marker is outside it and its end marker inside it
        stacks = _op_stacks(cpu_ops.get(k, []), [L.ts - 1e-6 if L.kind == "marker" else (L.ts + L.end) / 2
                                                 for L in leaves], t0)
        tasks = []
        for L, ops in zip(leaves, stacks):
            kind = L.kind
            if kind != "marker":
                kind = "sync" if SYNC_CALL.search(L.name) else "cpu"
            t = Task(L.name, kind, res, L.end - L.ts, ops=ops, ts=L.ts,
                     args={"correlation": L.corrs} if L.corrs else {})
            for c in L.corrs:
                corr_owner[c] = t
            if kind == "marker":
                step_marker[L.name] = t
            tasks.append(t)
        cpu_tasks_by_thread[k] = tasks

    # ---- GPU tasks per stream -------------------------------------------------------------
    flow_owner = _flow_links(flows_s, flows_f, cpu_tasks_by_thread, t0)
    streams: dict[str, list[Task]] = defaultdict(list)
    for e in sorted(gpu, key=lambda e: float(e["ts"])):
        args = e.get("args") or {}
        kind = GPU_CATS[e["cat"]]
        name = e.get("name", "?")
        cls = classify_kernel(name) if kind == "kernel" else kind
        if cls == "comm":
            kind = "comm"
        dev = args.get("device", e.get("pid"))
        stream = args.get("stream", e.get("tid"))
        res = f"gpu{dev}:stream {str(stream).replace('stream ', '')}"
        t = Task(name, kind, res, float(e["dur"]), ts=float(e["ts"]) - t0,
                 args={"class": cls, **{x: args[x] for x in ("grid", "block", "bytes", "correlation") if x in args}})
        corr = args.get("correlation")
        launcher = corr_owner.get(corr) if corr is not None else None
        if launcher is None:
            launcher = flow_owner.get(_flow_key(e))
        if launcher is not None:
            t.deps.append(Dep(launcher, "launch", 0.0, "start"))
            t.ops = launcher.ops
            launcher.kind = "launch" if launcher.kind == "cpu" else launcher.kind
            launcher.args.setdefault("launches", []).append(t)
        streams[res].append(t)

    for k, tasks in cpu_tasks_by_thread.items():
        for t in tasks:
            g.add(t)
    for res, tasks in streams.items():
        for t in tasks:
            g.add(t)

    _mark_gradients(cpu_ops, cpu_tasks_by_thread, t0)
    _add_syncs(g, cpu_tasks_by_thread, streams)
    _add_stream_waits(cpu_tasks_by_thread)
    _add_cpu_cpu(cpu_tasks_by_thread)
    _fit_gaps_and_lags(g, streams, cpu_tasks_by_thread)

    # ---- iterations -------------------------------------------------------------------------
    for a, b, k, label, n in step_spans:
        bm, em = step_marker.get(f"begin {label}"), step_marker.get(f"end {label}")
        if bm is not None and em is not None:
            g.iterations.append(Iteration(label, n, bm, em, b - a))
    _assign_iterations(g, step_spans)
    g.meta["iteration_source"] = iterations or "ProfilerStep#N"
    return g


def _op_stacks(ops: list[dict], points: list[float], t0: float) -> list[tuple[str, ...]]:
    """For each time point, the names of the ops/annotations open at that time (outermost first)."""
    spans = sorted(((float(e["ts"]) - t0, float(e["ts"]) - t0 + float(e["dur"]), e.get("name", "?")) for e in ops),
                   key=lambda s: (s[0], -s[1]))
    stack: list[tuple[float, str]] = []
    cache: dict = {}
    j = 0
    order = sorted(range(len(points)), key=lambda i: points[i])
    res: list = [()] * len(points)
    for i in order:
        p = points[i]
        while j < len(spans) and spans[j][0] <= p:
            a, b, name = spans[j]
            while stack and stack[-1][0] <= a:
                stack.pop()
            stack.append((b, name))
            j += 1
        while stack and stack[-1][0] < p:
            stack.pop()
        # spans that closed below the top (not properly nested) are dropped lazily
        names = tuple(n for b, n in stack if b >= p)
        res[i] = cache.setdefault(names, names)
    return res


def _flow_key(e: dict):
    """A GPU event's identity as flow ends name it (a stream's tid as "stream 7" or 7)."""
    return (str(e.get("pid")), str(e.get("tid")).replace("stream ", ""), e.get("ts"))


def _flow_links(flows_s, flows_f, cpu_tasks_by_thread, t0) -> dict:
    """GPU event (pid, tid, ts) → launching CPU task, from flow start/finish pairs."""
    out = {}
    # the 2021 schema writes a flow's tid as an int and the runtime event's as a string
    norm = {(str(k[0]), str(k[1])): k for k in cpu_tasks_by_thread}
    starts_by_thread = {k: [t.ts for t in v] for k, v in cpu_tasks_by_thread.items()}
    for fid, f in flows_f.items():
        s = flows_s.get(fid)
        if s is None:
            continue
        k = norm.get((str(s.get("pid")), str(s.get("tid"))))
        tasks = cpu_tasks_by_thread.get(k)
        if not tasks or not isinstance(s.get("ts"), (int, float)):
            continue
        a = float(s["ts"]) - t0
        i = bisect.bisect_right(starts_by_thread[k], a) - 1
        if i >= 0 and tasks[i].ts <= a <= tasks[i].ts + tasks[i].dur + 1e-6:
            out[_flow_key(f)] = tasks[i]
    return out


DTYPE_BYTES = {"float": 4, "c10::Half": 2, "c10::BFloat16": 2, "double": 8, "half": 2, "bfloat16": 2,
               "float16": 2, "float32": 4, "int": 4, "long int": 8}


def _mark_gradients(cpu_ops, cpu_threads, t0) -> None:
    """Each ``torch::autograd::AccumulateGrad`` is a gradient becoming ready (what DDP hooks on).
    Its bytes (from ``Input Dims``/``Input type`` when shapes were recorded, else None) are noted
    on the last CPU task of that thread that started by then, the point a what-if anchors to."""
    for k, lst in cpu_ops.items():
        tasks = cpu_threads.get(k)
        if not tasks:
            continue
        starts = [t.ts for t in tasks]
        for e in lst:
            if e.get("name") != "torch::autograd::AccumulateGrad":
                continue
            end = float(e["ts"]) - t0 + float(e["dur"])
            i = bisect.bisect_right(starts, end) - 1
            if i < 0:
                continue
            args = e.get("args") or {}
            dims, types = args.get("Input Dims"), args.get("Input type")
            nbytes = None
            if isinstance(dims, list) and dims and isinstance(dims[0], list):
                n = 1
                for d in dims[0]:
                    n *= int(d)
                elem = DTYPE_BYTES.get(types[0], 4) if isinstance(types, list) and types else 4
                nbytes = n * elem
            tasks[i].args.setdefault("gradients", []).append(nbytes)


def _add_syncs(g, cpu_threads, streams) -> None:
    """GPU → CPU: a synchronize call ends after the work launched before it; a call whose own GPU
    copy finished inside it (a pageable or synchronous memcpy) ends after that copy."""
    launched = sorted(((d.task.ts, t) for ts in streams.values() for t in ts for d in t.deps if d.kind == "launch"),
                      key=lambda x: x[0])
    syncs = sorted((t for tasks in cpu_threads.values() for t in tasks if t.kind == "sync"), key=lambda t: t.ts)
    # one sweep in time: the last GPU task per stream launched before each synchronize call
    last: dict[str, Task] = {}
    k = 0
    for t in syncs:
        while k < len(launched) and launched[k][0] < t.ts:
            last[launched[k][1].resource] = launched[k][1]
            k += 1
        for x in last.values():  # only what had ended by the call's end can have held it
            if x.ts + x.dur <= t.ts + t.dur + 1.0:
                t.waits.append(Dep(x, "sync", 0.0))
    for tasks in cpu_threads.values():
        for t in tasks:
            end = t.ts + t.dur
            for x in t.args.get("launches", ()):
                if x.kind == "memcpy" and x.ts + x.dur <= end + 1.0 and x.ts + x.dur > t.ts:
                    t.waits.append(Dep(x, "sync", 0.0))


def _add_stream_waits(cpu_threads) -> None:
    """cudaStreamWaitEvent: the next GPU task this thread launches waits for what other streams
    had been given before the call (the event was recorded there). Collectives waiting on compute
    are the compute → communication edges of data parallelism."""
    for tasks in cpu_threads.values():
        last_on: dict[str, Task] = {}
        waiting = None
        for t in tasks:
            if "StreamWaitEvent" in t.name:
                waiting = dict(last_on)
                continue
            for x in t.args.get("launches", ()):
                if waiting:
                    for res, y in waiting.items():
                        if res != x.resource and y.ts + y.dur <= x.ts + 1e-6:
                            x.deps.append(Dep(y, "comm" if x.kind == "comm" else "stream-wait", 0.0))
                    waiting = None
                last_on[x.resource] = x
        # launches from other threads also count as "what the stream had been given"; the
        # per-thread view is enough for PyTorch, which records and waits on one thread.


def _add_cpu_cpu(cpu_threads) -> None:
    """A thread that wakes after a long idle while another thread ran, and that other thread went
    idle, was waiting for it (autograd: the main thread sleeps in backward() while the engine's
    thread runs; the engine's thread wakes when backward() is called)."""
    keys = list(cpu_threads)
    if len(keys) < 2:
        return
    ends = {k: [t.ts + t.dur for t in cpu_threads[k]] for k in keys}
    starts = {k: [t.ts for t in cpu_threads[k]] for k in keys}
    for k in keys:
        tasks = cpu_threads[k]
        for i in range(len(tasks)):
            t = tasks[i]
            lo, hi = (tasks[i - 1].ts + tasks[i - 1].dur if i else 0.0), t.ts
            if hi - lo < CPU_CPU_MIN_GAP_US:
                continue
            best = None
            for o in keys:
                if o == k:
                    continue
                j = bisect.bisect_right(ends[o], hi) - 1  # last task on o that ended by hi
                if j < 0 or ends[o][j] <= lo:
                    continue
                # o must have gone idle: its next task starts after t started
                nxt = starts[o][j + 1] if j + 1 < len(starts[o]) else float("inf")
                if nxt <= hi:
                    continue
                cand = cpu_threads[o][j]
                if best is None or ends[o][j] > best.ts + best.dur:
                    best = cand
            if best is not None:
                t.deps.append(Dep(best, "cpu-cpu", 0.0))


def _fit_gaps_and_lags(g, streams, cpu_threads) -> None:
    """Set gaps and lags so the unmodified replay reproduces the recording, with each task's slack
    on the constraint that bound it. Nominal values: a GPU task starts `launch_lag` after its
    launch call begins and `stream_gap` after the previous task on its stream, the medians seen
    where that constraint clearly bound."""
    lag_samples, gap_samples = [], []
    for tasks in streams.values():
        prev_end = None
        for t in tasks:
            L = next((d.task for d in t.deps if d.kind == "launch"), None)
            if L is not None and (prev_end is None or prev_end < L.ts):
                lag_samples.append(t.ts - L.ts)               # stream idle at launch: launch-bound
            elif prev_end is not None and L is not None and t.ts - L.ts > 50.0:
                gap_samples.append(max(0.0, t.ts - prev_end))  # queued long before: stream-bound
            prev_end = t.ts + t.dur
    launch_lag = statistics.median(lag_samples) if lag_samples else 5.0
    stream_gap = statistics.median(gap_samples) if gap_samples else 1.0
    g.meta["launch_lag_us"] = launch_lag
    g.meta["stream_gap_us"] = stream_gap
    for tasks in streams.values():
        prev = None
        for t in tasks:
            s = t.ts
            cands = []
            if prev is not None:
                t.gap = min(stream_gap, max(0.0, s - (prev.ts + prev.dur)))
                cands.append((prev.ts + prev.dur + t.gap, "gap", None))
            else:  # the stream's first task: idle before it, so only its launch (if any) binds
                t.gap = 0.0 if t.deps else max(0.0, s)
                cands.append((t.gap, "gap", None))
            for d in t.deps:
                anchor = d.task.ts if d.anchor == "start" else d.task.ts + d.task.dur
                nominal = launch_lag if d.kind == "launch" else 0.0
                d.lag = min(nominal, s - anchor)
                cands.append((anchor + d.lag, "dep", d))
            m, how, d = max(cands, key=lambda c: c[0])
            if m < s:
                if how == "gap":
                    t.gap += s - m
                else:
                    d.lag += s - m
            prev = t
    # CPU threads. Recorded ends are taken before any call is cut down below, so a cpu-cpu lag
    # does not depend on which thread is fitted first.
    rec_end = {id(t): t.ts + t.dur for tasks in cpu_threads.values() for t in tasks}
    for tasks in cpu_threads.values():
        prev_end = 0.0
        for t in tasks:
            s, end = t.ts, rec_end[id(t)]
            t.gap = max(0.0, s - prev_end)
            for d in t.deps:  # cpu-cpu: the wake-up binds; own work after it is at most that lag
                d.lag = max(0.0, s - rec_end[id(d.task)])
                t.gap = min(t.gap, d.lag)
            if t.waits:
                w = max(d.task.ts + d.task.dur for d in t.waits)
                for d in t.waits:
                    d.lag = 0.0
                if w > s:
                    # It blocked (a synchronize, a pageable copy): its own cost is what is left after
                    # the GPU finished. GPU clocks may put that end a hair after the call's end, so
                    # the lag may be slightly negative: the replay still ends the call when recorded.
                    tail = end - w
                    for d in t.waits:
                        d.lag = tail
                    t.dur = min(t.dur, max(0.0, tail))
            prev_end = end


def _assign_iterations(g: TaskGraph, step_spans) -> None:
    """CPU tasks by the step window they start in; GPU tasks by their launch's iteration."""
    if not step_spans:
        return
    starts = [s[0] for s in step_spans]
    for t in g.tasks:
        if t.is_gpu:
            continue
        i = bisect.bisect_right(starts, t.ts + 1e-9) - 1
        if i >= 0 and t.ts <= step_spans[i][1] + 1e-9:
            t.iteration = step_spans[i][4]
    for t in g.tasks:
        if t.is_gpu:
            L = next((d.task for d in t.deps if d.kind == "launch"), None)
            if L is not None:
                t.iteration = L.iteration
            else:
                i = bisect.bisect_right(starts, t.ts) - 1
                if i >= 0 and t.ts <= step_spans[i][1]:
                    t.iteration = step_spans[i][4]
    for it in g.iterations:
        it.begin.iteration = it.end.iteration = it.number


def _device_name(data: dict) -> str | None:
    props = data.get("deviceProperties")
    if isinstance(props, list) and props and isinstance(props[0], dict):
        return props[0].get("name")
    return None
