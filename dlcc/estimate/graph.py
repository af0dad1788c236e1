"""The Daydream task graph, its five primitives, and the replay that times it (DESIGN.md §6).

A task is one piece of work on one *resource*: a CPU thread, a GPU stream, or a communication
channel. Each resource runs its tasks one at a time, in its order (or, after `schedule`, by a
priority among the ready ones). A task starts at the later of

- its resource's free time plus its *gap*: untraced work just before it on that resource (Python
  and framework time on a CPU thread; the idle slot between kernels on a stream), and
- each dependency's anchor (the predecessor's end, or for a launch its start) plus the edge's lag.

A *blocking* task (a synchronize call, a pageable copy) also cannot end before the tasks it waits
for have ended (plus a lag): that is how the GPU holds the CPU back.

Builders (``kineto.py`` for profiler traces, ``plan_graph.py`` for dlcc plans) set gaps and lags
so that replaying the unmodified graph reproduces the recording; what-ifs (``whatif.py``) then
change it with the primitives below, and the replay tells what the change buys.

The primitives, on ``TaskGraph``:

    g.select(kind="kernel", name=r"gemm", op=r"Optimizer", iteration=3)   -> [Task]
    g.scale(tasks, 0.5) / g.shrink(tasks, 2)                              durations
    g.insert(Task(...), after=t) / g.insert(task, before=t)               a new task
    g.remove(tasks)                                                       dependencies rewired
    g.schedule("net:allreduce", key=lambda t: t.priority)                 ready-task order
"""
from __future__ import annotations

import heapq
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable

from ..errors import DlccError

#: The six dependency kinds of Daydream. Program order on a CPU thread and order on a GPU stream
#: are implicit in each resource's task order; the other four are explicit edges.
DEP_KINDS = ("cpu-order", "gpu-order", "launch", "sync", "comm", "cpu-cpu")
EDGE_KINDS = ("launch", "sync", "comm", "cpu-cpu", "stream-wait", "data")

#: Task kinds: host work, and device work that sits on a stream or a channel.
CPU_KINDS = ("cpu", "launch", "sync", "marker")
GPU_KINDS = ("kernel", "memcpy", "memset", "comm")


@dataclass(eq=False)
class Dep:
    """`task` must reach its anchor ("end" or "start") `lag` µs before the dependent may go on."""

    task: "Task"
    kind: str
    lag: float = 0.0
    anchor: str = "end"


@dataclass(eq=False)
class Task:
    name: str
    kind: str
    resource: str
    dur: float
    gap: float = 0.0
    deps: list[Dep] = field(default_factory=list)
    waits: list[Dep] = field(default_factory=list)
    ops: tuple[str, ...] = ()
    iteration: int | None = None
    ts: float | None = None        # recorded start (µs from the trace's origin), if recorded
    priority: float = 0.0
    args: dict = field(default_factory=dict)
    start: float = 0.0             # set by simulate()
    end: float = 0.0

    @property
    def is_gpu(self) -> bool:
        return self.kind in GPU_KINDS

    def __repr__(self) -> str:  # keep reprs short: tasks reference each other
        return f"Task({self.name!r}, {self.kind}, {self.resource}, dur={self.dur:g})"


@dataclass
class Iteration:
    """A training/inference step: the span between two marker tasks on the main CPU thread."""

    label: str
    number: int
    begin: Task
    end: Task
    measured_us: float | None = None

    @property
    def simulated_us(self) -> float:
        return self.end.start - self.begin.start


class SimulationError(DlccError, RuntimeError):
    """A task graph the simulator cannot replay (a dependency cycle, a wait on a task that never
    runs): what a malformed trace leads to, reported as one error rather than a traceback."""


class TaskGraph:
    """Tasks on resources with dependencies; see the module docstring."""

    def __init__(self, meta: dict | None = None):
        self.resources: dict[str, list[Task]] = {}
        self.policies: dict[str, Callable[[Task], object]] = {}
        self.iterations: list[Iteration] = []
        self.meta: dict = dict(meta or {})

    # -- building ----------------------------------------------------------------------------
    def add(self, task: Task) -> Task:
        """Append `task` to the end of its resource's order."""
        self.resources.setdefault(task.resource, []).append(task)
        return task

    @property
    def tasks(self) -> list[Task]:
        return [t for ts in self.resources.values() for t in ts]

    def __len__(self) -> int:
        return sum(len(v) for v in self.resources.values())

    def copy(self) -> "TaskGraph":
        """A deep copy that what-ifs may change freely (tasks and edges are cloned)."""
        new = TaskGraph(self.meta)
        clone: dict[int, Task] = {}
        for r, ts in self.resources.items():
            lst = []
            for t in ts:
                c = Task(t.name, t.kind, t.resource, t.dur, t.gap, [], [], t.ops, t.iteration, t.ts,
                         t.priority, dict(t.args), t.start, t.end)
                clone[id(t)] = c
                lst.append(c)
            new.resources[r] = lst
        for ts in self.resources.values():
            for t in ts:
                c = clone[id(t)]
                for k, v in t.args.items():  # task references kept in args (a launch's GPU tasks)
                    if isinstance(v, list) and v and isinstance(v[0], Task):
                        c.args[k] = [clone[id(x)] for x in v if id(x) in clone]
                c.deps = [Dep(clone[id(d.task)], d.kind, d.lag, d.anchor) for d in t.deps if id(d.task) in clone]
                c.waits = [Dep(clone[id(d.task)], d.kind, d.lag, d.anchor) for d in t.waits if id(d.task) in clone]
        new.policies = dict(self.policies)
        new.iterations = [Iteration(i.label, i.number, clone[id(i.begin)], clone[id(i.end)], i.measured_us)
                          for i in self.iterations]
        return new

    # -- the primitives ----------------------------------------------------------------------
    def select(self, kind: str | Iterable[str] | None = None, name: str | None = None,
               resource: str | None = None, op: str | None = None, iteration: int | None = None,
               where: Callable[[Task], bool] | None = None) -> list[Task]:
        """Tasks matching every given filter, in resource order.

        `name`, `resource` and `op` are regular expressions (searched, not anchored); `op` matches
        any enclosing framework op or annotation, so ``op=r"Optimizer\\.step"`` selects the
        optimizer's work. `kind` is one kind or several.
        """
        kinds = {kind} if isinstance(kind, str) else set(kind) if kind is not None else None
        rn = re.compile(name) if name else None
        rr = re.compile(resource) if resource else None
        ro = re.compile(op) if op else None
        out = []
        for r, ts in self.resources.items():
            if rr and not rr.search(r):
                continue
            for t in ts:
                if kinds is not None and t.kind not in kinds:
                    continue
                if rn and not rn.search(t.name):
                    continue
                if ro and not any(ro.search(o) for o in t.ops):
                    continue
                if iteration is not None and t.iteration != iteration:
                    continue
                if where and not where(t):
                    continue
                out.append(t)
        return out

    @staticmethod
    def scale(tasks: Iterable[Task], factor: float, gaps: bool = False) -> None:
        """Multiply durations (and, with gaps=True, the gaps before them) by `factor`."""
        for t in tasks:
            t.dur *= factor
            if gaps:
                t.gap *= factor

    @classmethod
    def shrink(cls, tasks: Iterable[Task], by: float, gaps: bool = False) -> None:
        """Divide durations by `by` (Daydream's "shrink": AMP's ÷3 is ``shrink(ts, 3)``)."""
        cls.scale(tasks, 1.0 / by, gaps)

    def insert(self, task: Task, after: Task | None = None, before: Task | None = None) -> Task:
        """Put `task` on its resource right after `after` or right before `before` (else at the end).

        `after`/`before` must be on the same resource; dependencies are the caller's to add
        (``task.deps.append(Dep(...))``).
        """
        lst = self.resources.setdefault(task.resource, [])
        ref = after or before
        if ref is None:
            lst.append(task)
            return task
        if ref.resource != task.resource:
            raise ValueError(f"insert: {ref!r} is on {ref.resource}, not on {task.resource}")
        k = _index(lst, ref)
        lst.insert(k + 1 if after is not None else k, task)
        return task

    def remove(self, tasks: Iterable[Task], keep_gap: bool | None = None) -> None:
        """Delete tasks. Whoever depended on a removed task inherits its dependencies (so order
        through it is kept), and with keep_gap (default: on CPU threads only) its gap moves to the
        next task on its resource: removing a launch call does not remove the Python around it."""
        doomed = {id(t): t for t in tasks}
        if not doomed:
            return
        for it in self.iterations:  # checked first: a refused remove changes nothing
            if id(it.begin) in doomed or id(it.end) in doomed:
                raise ValueError("remove: an iteration marker cannot be removed")
        # what held a removed task back through its resource: the last kept task before it there
        before: dict[int, Task] = {}
        for r, lst in list(self.resources.items()):
            if not any(id(t) in doomed for t in lst):
                continue
            kept, carry, last_kept = [], 0.0, None
            for t in lst:
                if id(t) in doomed:
                    if last_kept is not None:
                        before[id(t)] = last_kept
                    keep = keep_gap if keep_gap is not None else t.kind in CPU_KINDS
                    if keep:
                        carry += t.gap
                    continue
                t.gap += carry
                carry = 0.0
                kept.append(t)
                last_kept = t
            self.resources[r] = kept
        for lst in self.resources.values():
            for t in lst:
                if any(id(d.task) in doomed for d in t.deps):
                    t.deps = _inherit(t.deps, doomed, before)
                if any(id(d.task) in doomed for d in t.waits):
                    t.waits = _inherit(t.waits, doomed, before)

    def schedule(self, resource: str, key: Callable[[Task], object]) -> None:
        """From now on `resource` runs, among its ready tasks, the one with the smallest key first
        (instead of the recorded order). Use it for priority orders such as P3's."""
        if resource not in self.resources:
            raise ValueError(f"schedule: no resource {resource!r}")
        self.policies[resource] = key

    # -- replay ------------------------------------------------------------------------------
    def simulate(self) -> float:
        """Time every task (sets .start and .end) and return the span from 0 to the last end."""
        return simulate(self)

    def span(self) -> float:
        ends = [t.end for t in self.tasks]
        return max(ends) if ends else 0.0


def _index(lst: list[Task], t: Task) -> int:
    for k, x in enumerate(lst):
        if x is t:
            return k
    raise ValueError(f"{t!r} is not on resource {t.resource}")


def _inherit(deps: list[Dep], doomed: dict[int, Task], before: dict[int, Task]) -> list[Dep]:
    """Replace each dependency on a removed task by what that task itself waited for: its own
    dependencies and the task before it on its resource (a sync that waited on a removed kernel
    still waits for the kernels queued ahead of it)."""
    out, seen, stack = [], set(), list(deps)
    while stack:
        d = stack.pop()
        if id(d.task) in doomed:
            for dd in d.task.deps:
                stack.append(Dep(dd.task, dd.kind, d.lag + dd.lag, dd.anchor))
            prev = before.get(id(d.task))
            if prev is not None:
                stack.append(Dep(prev, d.kind, d.lag, "end"))
            continue
        key = (id(d.task), d.anchor)
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def simulate(g: TaskGraph) -> float:
    """Replay `g`: resources in their order (or by policy), tasks as soon as their constraints allow.

    Commits tasks in order of start time across resources (a discrete-event simulation), so a
    priority resource chooses among the tasks that are really ready by the time it is free. A task
    that waits (a synchronize, a blocking copy) starts first and ends once what it waits for has
    ended, so a call may wait for the very copy it launched.
    """
    on_start: dict[int, list[Task]] = {}
    on_end: dict[int, list[Task]] = {}
    on_wait: dict[int, list[Task]] = {}
    unresolved: dict[int, int] = {}
    waits_left: dict[int, int] = {}
    for lst in g.resources.values():
        for t in lst:
            for d in t.deps:
                (on_start if d.anchor == "start" else on_end).setdefault(id(d.task), []).append(t)
            for d in t.waits:
                on_wait.setdefault(id(d.task), []).append(t)
            unresolved[id(t)] = len(t.deps)
            waits_left[id(t)] = len(t.waits)
    free = {r: 0.0 for r in g.resources}
    busy = {r: False for r in g.resources}
    pos = {r: 0 for r in g.resources}          # strict resources: next index
    pending = {r: list(lst) for r, lst in g.resources.items() if r in g.policies}  # priority ones
    version = {r: 0 for r in g.resources}
    heap: list = []
    seq = 0
    ended = 0

    def ready_time(t: Task) -> float:
        m = 0.0
        for d in t.deps:
            a = (d.task.start if d.anchor == "start" else d.task.end) + d.lag
            if a > m:
                m = a
        return m

    def candidate(r: str):
        nonlocal seq
        version[r] += 1
        if busy[r]:
            return
        if r in pending:
            ready = [t for t in pending[r] if unresolved[id(t)] == 0]
            if not ready:
                return
            times = [(max(free[r] + t.gap, ready_time(t)), t) for t in ready]
            t_min = min(s for s, _ in times)
            chosen = min((t for t in ready if ready_time(t) <= t_min), key=g.policies[r], default=None)
            if chosen is None:
                chosen = min(times, key=lambda x: x[0])[1]
        else:
            lst = g.resources[r]
            if pos[r] >= len(lst):
                return
            chosen = lst[pos[r]]
            if unresolved[id(chosen)]:
                return
        s = max(free[r] + chosen.gap, ready_time(chosen))
        seq += 1
        heapq.heappush(heap, (s, seq, r, version[r], chosen))

    def resolve(tasks, touched):
        for u in tasks:
            unresolved[id(u)] -= 1
            if unresolved[id(u)] == 0:
                touched.add(u.resource)

    def finish(t: Task, touched: set):
        nonlocal ended
        end = t.start + t.dur
        for d in t.waits:
            w = (d.task.start if d.anchor == "start" else d.task.end) + d.lag
            if w > end:
                end = w
        t.end = end
        r = t.resource
        free[r] = end
        busy[r] = False
        ended += 1
        touched.add(r)
        resolve(on_end.get(id(t), ()), touched)
        for u in on_wait.get(id(t), ()):
            waits_left[id(u)] -= 1
            if waits_left[id(u)] == 0 and busy[u.resource] and u.start is not None:
                finish(u, touched)

    for t in g.tasks:
        t.start = None
    for r in g.resources:
        candidate(r)
    total = len(unresolved)
    while heap:
        s, _, r, ver, t = heapq.heappop(heap)
        if ver != version[r]:
            continue
        t.start = s
        busy[r] = True
        if r in pending:
            pending[r].remove(t)
        else:
            pos[r] += 1
        touched: set = set()
        resolve(on_start.get(id(t), ()), touched)
        if waits_left[id(t)] == 0:
            finish(t, touched)
        for rr in touched:
            candidate(rr)
    if ended != total:
        stuck = [lst[pos[r] - 1 if busy[r] else pos[r]] for r, lst in g.resources.items()
                 if r not in pending and (busy[r] or pos[r] < len(lst))]
        stuck += [t for r in pending for t in pending[r]]
        raise SimulationError(f"the task graph has a dependency cycle or a task waits on a task that never "
                              f"runs ({total - ended} task(s) never finished; first: {stuck[0]!r})")
    return g.span()
