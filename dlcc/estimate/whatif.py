"""What-if optimizations: short functions over the task-graph primitives (Daydream, ATC'20).

A what-if takes a copy of the baseline graph and changes it with ``select``, ``scale``/``shrink``,
``insert``, ``remove`` and ``schedule`` (see ``graph.py``); the replay then says what the change
would buy. Built-in ones are written exactly the way a user writes one in their own file::

    # my_opt.py  —  dlcc estimate --trace run.json --what-if-file my_opt.py
    from dlcc.estimate.whatif import whatif

    @whatif("fast-attention", help="attention kernels 2x faster")
    def fast_attention(g, factor: float = 2.0):
        g.shrink(g.select(kind="kernel", name=r"fmha|flash|attention"), factor)

Parameters come from the spec on the command line: ``--what-if fast-attention:factor=3``. A
what-if with one parameter also takes ``NAME=VALUE`` (``gpu-speed=2``).
"""
from __future__ import annotations

import importlib.util
import inspect
import re
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import DlccError
from .graph import CPU_KINDS, Dep, Task, TaskGraph
from .kernelclass import is_half_precision, is_memory_bound_class


class WhatIfError(DlccError):
    """An unknown what-if, a bad parameter, a broken what-if file, or a what-if that failed."""


@dataclass
class WhatIf:
    name: str
    fn: Callable
    help: str
    source: str = "built-in"

    def params(self) -> dict[str, inspect.Parameter]:
        ps = list(inspect.signature(self.fn).parameters.values())[1:]
        return {p.name: p for p in ps}

    def signature(self) -> str:
        """How to write it on the command line, with the defaults."""
        if self.name == "scale":
            return "scale:REGEX=FACTOR"
        ps = self.params()
        if len(ps) == 1 and next(iter(ps.values())).default is inspect.Parameter.empty:
            return f"{self.name}={next(iter(ps)).upper()}"
        parts = []
        for n, p in self.params().items():
            parts.append(n if p.default is inspect.Parameter.empty else f"{n}={p.default}")
        return f"{self.name}:{','.join(parts)}" if parts else self.name


WHATIFS: dict[str, WhatIf] = {}


def whatif(name: str, help: str = "") -> Callable:
    """Register `fn(graph, **params)` under `name`; its keyword defaults are its parameters."""
    def deco(fn):
        src = "built-in" if fn.__module__ == __name__ else getattr(fn, "__module__", "?")
        WHATIFS[name] = WhatIf(name, fn, help or (fn.__doc__ or "").strip().split("\n")[0], src)
        return fn
    return deco


@dataclass
class WhatIfCall:
    """One what-if with its parameters; ``then`` chains more, applied in order (``amp+no-launch-overhead``)."""

    spec: str
    what: WhatIf
    params: dict
    then: list["WhatIfCall"] = field(default_factory=list)

    @property
    def help(self) -> str:
        if not self.then:
            return self.what.help
        return " + ".join(c.what.help.split(":")[0] for c in [self] + self.then) + " (applied in this order)"

    def apply(self, g: TaskGraph) -> TaskGraph:
        h = g.copy()
        for call in [self] + self.then:
            call._run(h)
        return h

    def _run(self, h: TaskGraph) -> None:
        try:
            self.what.fn(h, **self.params)
        except DlccError:
            raise
        except Exception as e:  # a user's what-if: show where in their file it broke
            tb = traceback.extract_tb(e.__traceback__)
            try:
                own = inspect.getsourcefile(self.what.fn)
            except TypeError:
                own = None
            frames = [f for f in tb if f.filename == own] or list(tb)
            where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
            raise WhatIfError(f"what-if {self.spec!r} failed at {where}: {type(e).__name__}: {e}") from None


def _split_combined(spec: str) -> list[str]:
    """``a+b:x=1+c`` → its parts; a ``+`` splits only where a registered what-if's name follows, so
    a regex in ``scale:REGEX=F`` may still contain ``+``."""
    parts, cur = [], ""
    i = 0
    while i < len(spec):
        if spec[i] == "+":
            rest = spec[i + 1:]
            m = re.match(r"[\w.-]+", rest)
            if m and m.group(0) in WHATIFS and (len(rest) == m.end() or rest[m.end()] in ":=+"):
                parts.append(cur)
                cur = ""
                i += 1
                continue
        cur += spec[i]
        i += 1
    parts.append(cur)
    return parts


def parse(spec: str) -> WhatIfCall:
    """``name``, ``name=value`` or ``name:key=value,key=value`` (``scale:REGEX=FACTOR`` is special:
    the regex may contain anything, the factor follows its last ``=``). ``a+b`` applies a, then b."""
    parts = _split_combined(spec.strip())
    if len(parts) > 1:
        calls = [_parse_one(p) for p in parts]
        return WhatIfCall(spec.strip(), calls[0].what, calls[0].params, calls[1:])
    return _parse_one(spec)


def _parse_one(spec: str) -> WhatIfCall:
    spec = spec.strip()
    name, _, rest = spec.partition(":")
    value = None
    if not rest and "=" in name:
        name, _, value = name.partition("=")
    w = WHATIFS.get(name)
    if w is None:
        raise WhatIfError(f"unknown what-if {name!r}; valid ones are: " + ", ".join(sorted(WHATIFS)) +
                          " (and any defined with --what-if-file)")
    params = w.params()
    kwargs: dict = {}
    if name == "scale" and rest:
        rx, eq, fac = rest.rpartition("=")
        if not eq:
            raise WhatIfError(f"what-if {spec!r}: write scale:REGEX=FACTOR, e.g. scale:gemm=0.5")
        kwargs = {"pattern": rx, "factor": fac}
    elif value is not None:
        if len(params) != 1:
            raise WhatIfError(f"what-if {name!r} takes {', '.join(params) or 'no'} parameters; write "
                              f"{w.signature()}")
        kwargs = {next(iter(params)): value}
    elif rest:
        for item in rest.split(","):
            k, eq, v = item.partition("=")
            if not eq:
                raise WhatIfError(f"what-if {spec!r}: {item!r} is not key=value")
            kwargs[k.strip()] = v.strip()
    out = {}
    for k, v in kwargs.items():
        p = params.get(k)
        if p is None:
            raise WhatIfError(f"what-if {name!r} has no parameter {k!r}; it takes: {w.signature()}")
        out[k] = _convert(name, k, v, p)
    missing = [k for k, p in params.items() if p.default is inspect.Parameter.empty and k not in out]
    if missing:
        raise WhatIfError(f"what-if {name!r} needs {', '.join(missing)}; write {w.signature()}")
    return WhatIfCall(spec, w, out)


def _convert(name, key, value, p: inspect.Parameter):
    typ = p.annotation if p.annotation is not inspect.Parameter.empty else (
        type(p.default) if p.default not in (inspect.Parameter.empty, None) else str)
    if isinstance(typ, str):  # postponed annotations
        typ = {"float": float, "int": int, "str": str, "bool": bool}.get(typ.split("|")[0].strip(), str)
    try:
        if typ is bool:
            return str(value).lower() in ("1", "true", "yes", "on")
        return typ(value)
    except (TypeError, ValueError):
        raise WhatIfError(f"what-if {name!r}: {key}={value!r} is not {'an' if typ is int else 'a'} {typ.__name__}") from None


def load_file(path: str | Path) -> list[str]:
    """Run a user's what-if file; returns the names it registered."""
    path = Path(path)
    if not path.is_file():
        raise WhatIfError(f"{path}: no such what-if file")
    before = set(WHATIFS)
    mod_name = f"dlcc_whatif_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod
    try:
        spec.loader.exec_module(mod)
    except Exception as e:
        tb = traceback.extract_tb(e.__traceback__)
        where = next((f"line {f.lineno}" for f in reversed(tb) if f.filename == str(path)), "")
        raise WhatIfError(f"{path}: {where + ': ' if where else ''}{type(e).__name__}: {e}") from None
    new = sorted(set(WHATIFS) - before) or [w.name for w in WHATIFS.values() if w.source == mod_name]
    if not new:
        raise WhatIfError(f"{path}: defines no what-if; decorate a function with "
                          f"@whatif('name') from dlcc.estimate.whatif")
    return new


# ---------------------------------------------------------------------------------------------
# Built-in what-ifs
# ---------------------------------------------------------------------------------------------

def _kernels(g: TaskGraph) -> list[Task]:
    return g.select(kind="kernel")


@whatif("amp", help="mixed precision (AMP): tensor-core-eligible kernels (GEMM/convolution class) "
                    "run `compute`x faster, every other kernel `memory`x (half the bytes); kernels "
                    "already in half precision, copies and CPU work are unchanged")
def amp(g: TaskGraph, compute: float = 3.0, memory: float = 2.0):
    for t in _kernels(g):
        if is_half_precision(t.name):
            continue
        g.shrink([t], compute if t.args.get("class") == "gemm" else memory)


@whatif("scale", help="kernels by name: multiply the durations of kernels whose name matches "
                      "REGEX by FACTOR (scale:REGEX=FACTOR; 0.5 means twice as fast)")
def scale(g: TaskGraph, pattern: str, factor: float):
    try:
        re.compile(pattern)
    except re.error as e:
        raise WhatIfError(f"what-if scale: {pattern!r} is not a regular expression: {e}") from None
    ts = g.select(kind=("kernel", "comm"), name=pattern)
    if not ts:
        raise WhatIfError(f"what-if scale: no kernel name matches {pattern!r}")
    g.scale(ts, factor)


@whatif("gpu-speed", help="faster GPU: a GPU FACTOR times faster; kernels and memsets shrink; host copies, "
                          "collectives and CPU work do not")
def gpu_speed(g: TaskGraph, factor: float):
    g.shrink(g.select(kind=("kernel", "memset")), factor)


@whatif("no-launch-overhead", help="CUDA graphs: launch calls cost nothing and reach the GPU at once, as when "
                                   "a CUDA graph replays the kernels; Python/framework time between "
                                   "launches is kept")
def no_launch_overhead(g: TaskGraph):
    for t in g.select(kind="launch"):
        if not t.waits:
            t.dur = 0.0
    for t in g.select(kind=("kernel", "memset", "memcpy", "comm")):
        for d in t.deps:
            if d.kind == "launch":
                d.lag = 0.0


# Worker processes share the host's cores, caches and memory bandwidth with the training loop, so
# its CPU work slows down. On the V100 ResNet-50 pair in ../shared/traces (num_workers 0 vs 4, same
# script and machine) cudaLaunchKernel calls took 1.24x and 1.10x as long with workers, and the
# step times imply about 1.3x on the loop's CPU work; 1.3 is chosen from those runs (so the
# accuracy check on them is a consistency check; see scripts/estimate_accuracy.py).
DATALOADER_CPU_SLOWDOWN = 1.3


@whatif("dataloader", help="DataLoader workers: data loading moved to `workers` DataLoader worker processes that "
                           "prefetch 2 batches each: the training loop only takes a ready batch "
                           "(`handoff` µs) unless the workers fall behind; the loop's own CPU work "
                           "runs `slowdown`x slower while workers share the host (1.3, from the "
                           "V100 traces)")
def dataloader(g: TaskGraph, workers: int = 4, slowdown: float = DATALOADER_CPU_SLOWDOWN,
               handoff: float = 500.0, pattern: str = r"DataLoader"):
    if workers < 1:
        raise WhatIfError("what-if dataloader: workers must be at least 1")
    rx = re.compile(pattern)
    begins = [t for t in g.select(kind="marker", name=r"^begin ") if rx.search(t.name)]
    if not begins:
        raise WhatIfError(f"what-if dataloader: no annotation matching {pattern!r} (such as "
                          f"enumerate(DataLoader)#...__next__) in the trace")
    inside = g.select(where=lambda t: t.kind in CPU_KINDS and any(rx.search(o) for o in t.ops))
    proc = {t.resource.split("/")[0] for t in inside}
    # the loop's CPU work slows down while workers run beside it
    g.scale(g.select(where=lambda t: t.kind in CPU_KINDS and t.resource.split("/")[0] in proc
                     and not any(rx.search(o) for o in t.ops)), slowdown, gaps=True)
    # one batch = everything the main thread did inside one DataLoader span
    batches = []
    for b in begins:
        lst = g.resources[b.resource]
        k = next(i for i, x in enumerate(lst) if x is b)
        work, members = 0.0, []
        for x in lst[k + 1:]:
            work += x.gap + (x.dur if x.kind != "launch" else 0.0)
            members.append(x)
            if x.kind == "marker" and x.name == "end " + b.name[len("begin "):]:
                break
        batches.append((b, members, work))
    for n, (b, members, work) in enumerate(batches):
        for x in members:
            x.gap = 0.0
            if x.kind not in ("launch", "sync"):
                x.dur = 0.0
        end_marker = members[-1]
        end_marker.gap = handoff
        # the window starts in steady state: the first 2 x workers batches were prefetched before
        # it; after that a worker refills a slot once its batch has been taken
        w = Task(f"load batch {n}", "cpu", f"cpu:dataloader worker {n % workers}",
                 work if n >= 2 * workers else 0.0, ops=("DataLoader worker",), iteration=b.iteration)
        if n >= 2 * workers:
            w.deps.append(Dep(batches[n - 2 * workers][1][-1], "cpu-cpu", 0.0))
        g.add(w)
        end_marker.deps.append(Dep(w, "cpu-cpu", 0.0))


@whatif("fused-optimizer", help="fused optimizer: the optimizer's per-parameter kernels (inside Optimizer.step) "
                                "become one fused kernel per step, with their summed time; their "
                                "launches and the per-parameter Python go away")
def fused_optimizer(g: TaskGraph, pattern: str = r"Optimizer\.step"):
    ks = g.select(kind="kernel", op=pattern)
    if not ks:
        raise WhatIfError(f"what-if fused-optimizer: no kernel was launched inside an annotation "
                          f"matching {pattern!r} (Optimizer.step#...); is this a training trace?")
    groups: dict = {}
    for t in ks:
        groups.setdefault((t.iteration, t.resource), []).append(t)
    for (it, res), lst in groups.items():
        keep, drop = lst[-1], lst[:-1]
        keep.dur = sum(t.dur for t in lst)
        keep.name = f"fused optimizer ({len(lst)} kernels)"
        launches = [d.task for t in drop for d in t.deps if d.kind == "launch"]
        g.remove(drop)
        # the per-parameter loop on the CPU: launches and the Python time before them
        g.remove([L for L in launches if not L.waits], keep_gap=False)


def _chain_breaker(t: Task) -> bool:
    """Only memory-bound kernels (elementwise, reductions) chain; compute, collectives, copies and
    unclassified kernels (cuDNN helpers) end a chain."""
    return t.kind != "kernel" or not is_memory_bound_class(t.args.get("class"))


@whatif("fuse-elementwise", help="elementwise fusion: each chain of memory-bound kernels between compute kernels on a "
                                 "stream becomes one kernel: k kernels that each read and write a "
                                 "tensor take their summed time x 2/(k+1) (only the first read and "
                                 "last write stay), never less than the longest; the fused-away "
                                 "launches go")
def fuse_elementwise(g: TaskGraph, min_chain: int = 2):
    for res in [r for r in g.resources if r.startswith("gpu")]:
        chains, cur = [], []
        for t in g.resources[res]:
            if _chain_breaker(t) or (cur and t.iteration != cur[-1].iteration):
                if len(cur) >= min_chain:
                    chains.append(cur)
                cur = [] if _chain_breaker(t) else [t]
                continue
            cur.append(t)
        if len(cur) >= min_chain:
            chains.append(cur)
        doomed = []
        for ch in chains:
            total = sum(t.dur for t in ch)
            keep = ch[-1]
            keep.dur = max(max(t.dur for t in ch), total * 2.0 / (len(ch) + 1))
            keep.name = f"fused {len(ch)} memory-bound kernels"
            for t in ch[:-1]:
                for d in t.deps:
                    if d.kind == "launch" and not d.task.waits:
                        d.task.dur = 0.0
            doomed += ch[:-1]
        g.remove(doomed, keep_gap=False)


@whatif("ddp", help="data-parallel training: on `gpus` GPUs each gradient bucket (`bucket` MB, "
                    "filled in the order backward produces gradients) is all-reduced on a network "
                    "channel as soon as it is full, overlapping backward; a ring all-reduce of S "
                    "bytes takes latency + 2(gpus-1)/gpus x S / bandwidth; the optimizer's first "
                    "kernel waits for every bucket. Without recorded shapes, give `params` "
                    "(millions of fp32 parameters)")
def ddp(g: TaskGraph, gpus: int = 2, bandwidth: float = 10.0, bucket: float = 25.0,
        latency: float = 20.0, params: float = 0.0):
    if gpus < 2:
        return
    anchors = g.select(where=lambda t: "gradients" in t.args)
    if not anchors:
        raise WhatIfError("what-if ddp: no torch::autograd::AccumulateGrad ops in the trace, so no "
                          "gradient to all-reduce; is it a training trace?")
    grads = [(t, b) for t in anchors for b in t.args["gradients"]]
    if any(b is None for _, b in grads):
        if params <= 0:
            raise WhatIfError("what-if ddp: the trace has no recorded shapes (record_shapes=False), "
                              "so gradient sizes are unknown; pass params=MILLIONS, e.g. "
                              "ddp:gpus=2,bandwidth=10,params=25.6")
        per_iter: dict = {}
        for t, _ in grads:
            per_iter[t.iteration] = per_iter.get(t.iteration, 0) + 1
        grads = [(t, params * 1e6 * 4 / per_iter[t.iteration]) for t, _ in grads]
    grads.sort(key=lambda x: (x[0].iteration if x[0].iteration is not None else -1, x[0].ts or 0.0))
    cap = bucket * 1024 * 1024
    by_iter: dict = {}
    for t, b in grads:
        by_iter.setdefault(t.iteration, []).append((t, b))
    net = "net:allreduce"
    for it, lst in by_iter.items():
        buckets, cur, size = [], [], 0.0
        for t, b in lst:
            cur.append(t)
            size += b
            if size >= cap:
                buckets.append((cur[-1], size))
                cur, size = [], 0.0
        if cur:
            buckets.append((cur[-1], size))
        reduces = []
        for k, (anchor, size) in enumerate(buckets):
            dur = latency + 2.0 * (gpus - 1) / gpus * size / (bandwidth * 1e3)  # GB/s = 1e3 bytes/µs
            task = Task(f"all-reduce bucket {k} ({size / 2**20:.1f} MiB)", "comm", net, dur,
                        ops=("DDP all-reduce",), iteration=it)
            task.deps.append(Dep(anchor, "cpu-cpu", 0.0))
            ready = _last_launched_before(g, anchor)
            if ready is not None:
                task.deps.append(Dep(ready, "comm", 0.0))
            g.add(task)
            reduces.append(task)
        last_anchor = max((a for a, _ in buckets), key=lambda a: a.ts or 0.0)
        first = _first_launched_after(g, last_anchor, it)
        if first is not None:
            for r in reduces:
                first.deps.append(Dep(r, "comm", 0.0))


def _last_launched_before(g: TaskGraph, cpu_task: Task) -> Task | None:
    lst = g.resources[cpu_task.resource]
    k = next(i for i, x in enumerate(lst) if x is cpu_task)
    for x in reversed(lst[:k + 1]):
        ls = x.args.get("launches")
        if ls:
            return ls[-1]
    return None


def _first_launched_after(g: TaskGraph, cpu_task: Task, iteration) -> Task | None:
    best = None
    for res, lst in g.resources.items():
        if not res.startswith("cpu:") or "worker" in res:
            continue
        for x in lst:
            if (x.ts or 0.0) > (cpu_task.ts or 0.0) and x.iteration == iteration and x.args.get("launches"):
                if best is None or x.ts < best.ts:
                    best = x
                break
    return best.args["launches"][0] if best is not None else None


from . import plan_mode  # noqa: E402,F401  (registers the plan-mode what-ifs)
