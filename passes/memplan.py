"""Memory planning: one arena for every intermediate buffer, offsets from tensor lifetimes.

Static planning in the manner of register allocation (CSE 599W): each buffer lives from the
launch that first writes it to the launch that last touches it; buffers whose lifetimes do not
overlap may share bytes. An elementwise kernel whose input dies at that kernel writes its output
in place. Offsets are placed greedily, largest buffer first, into the lowest gap that fits among
the buffers it overlaps in time (the TFLite "greedy by size" heuristic). Views (Reshape etc.)
share their base's bytes. Graph inputs, outputs and weights have their own storages.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from ..kernels.index_check import ERRORS, REPORT
from ..kernels.splitk import COUNTERS
from ..random_draws import STATE

from . import CompileState, register_pass

#: Tensors with a storage of their own: the grid barriers' counters (astitch, rammer), the
#: device index checks' claim word and report (kernels/index_check.py, read and cleared after a
#: check fired; the report is mapped host memory on CUDA) and split-K's tile counters
#: (kernels/splitk.py: each tile's last rTask sets its counter back to 0), and the random draws'
#: state (random_draws.py: written when the plan is loaded, advanced once per inference). Each is placed whenever
#: the graph has it, launched or not: the input index checks' kernels are launched by the
#: executor, not the plan.
OWN_STORAGES = {"%sync": "sync", ERRORS: "errors", REPORT: "report", COUNTERS: "splitk", STATE: "rng"}

ALIGN = 256  # bytes; ≥ OpenCL's CL_DEVICE_MEM_BASE_ADDR_ALIGN on PoCL (128) and CUDA's 256


class MemplanOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    inplace: bool = Field(True, description="let an elementwise kernel overwrite its dying input")
    share: bool = Field(True, description="let buffers with disjoint lifetimes share bytes")


@dataclass
class Placement:
    storage: str  # "arena" | "weights" | "input:K" | "output:K"
    offset: int
    nbytes: int


@dataclass
class MemoryPlan:
    placements: dict[str, Placement] = field(default_factory=dict)  # base tensor -> placement
    arena_bytes: int = 0
    naive_bytes: int = 0
    weights_bytes: int = 0
    inplace_pairs: int = 0
    # Storages of one tensor each, zeroed once and kept across runs: storage name -> bytes
    own_bytes: dict[str, int] = field(default_factory=dict)


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan_memory(graph, ctx, inplace: bool = True, share: bool = True) -> MemoryPlan:
    plan = MemoryPlan()
    launches = ctx.program.launches
    res = ctx.resolve
    for k, name in enumerate(graph.inputs):
        plan.placements[name] = Placement(f"input:{k}", 0, graph.tensors[name].nbytes)
    for k, name in enumerate(graph.outputs):
        base = res(name)
        plan.placements.setdefault(base, Placement(f"output:{k}", 0, graph.tensors[base].nbytes))
    for b, storage in OWN_STORAGES.items():
        if b in graph.tensors:
            plan.placements[b] = Placement(storage, 0, graph.tensors[b].nbytes)
            plan.own_bytes[storage] = graph.tensors[b].nbytes
    # Weights: every constant a launch touches, packed in first-use order.
    woff = 0
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, L in enumerate(launches):
        for t in L.reads + L.writes:
            b = res(t)
            if b in plan.placements:  # (the own storages among them, placed above)
                continue
            if graph.tensors[b].value is not None:
                plan.placements[b] = Placement("weights", woff, graph.tensors[b].nbytes)
                woff = _align(woff + graph.tensors[b].nbytes)
                continue
            first.setdefault(b, i)
            last[b] = i
    plan.weights_bytes = woff
    plan.naive_bytes = sum(_align(graph.tensors[b].nbytes) for b in first)

    # In-place groups: union an elementwise kernel's output with a same-size input dying there.
    group = {b: b for b in first}

    def find(x):
        while group[x] != x:
            group[x] = group[group[x]]
            x = group[x]
        return x

    if inplace:
        for i, L in enumerate(launches):
            if L.category != "elementwise" or len(L.writes) != 1 or ctx.program.kernels[L.kernel].kind != "map":
                continue
            out = res(L.writes[0])
            if out not in first or first[out] != i:
                continue
            for t in L.reads:
                b = res(t)
                if (b in first and last[b] == i and b != out and graph.tensors[b].nbytes == graph.tensors[out].nbytes
                        and tuple(graph.tensors[t].shape) == tuple(graph.tensors[L.writes[0]].shape)
                        and find(b) != find(out)):
                    group[find(out)] = find(b)
                    plan.inplace_pairs += 1
                    break
    lifetimes: dict[str, list[int]] = {}
    size: dict[str, int] = {}
    for b in first:
        r = find(b)
        lo, hi = lifetimes.get(r, [first[b], last[b]])
        lifetimes[r] = [min(lo, first[b]), max(hi, last[b])]
        size[r] = max(size.get(r, 0), _align(graph.tensors[b].nbytes))

    offsets: dict[str, int] = {}
    order = sorted(lifetimes, key=lambda r: (-size[r], lifetimes[r][0]))
    top = 0
    for r in order:
        lo, hi = lifetimes[r]
        if share:
            busy = sorted((offsets[o], offsets[o] + size[o]) for o in offsets
                          if not (lifetimes[o][1] < lo or hi < lifetimes[o][0]))
        else:
            busy = sorted((offsets[o], offsets[o] + size[o]) for o in offsets)
        best, cursor, best_gap = None, 0, None
        for s, e in busy:
            gap = s - cursor
            if gap >= size[r] and (best_gap is None or gap < best_gap):
                best, best_gap = cursor, gap
            cursor = max(cursor, e)
        if best is None:
            best = cursor
        offsets[r] = best
        top = max(top, best + size[r])
    for b in first:
        plan.placements[b] = Placement("arena", offsets[find(b)], graph.tensors[b].nbytes)
    plan.arena_bytes = top
    return plan


@register_pass("memplan", MemplanOptions, after=("lower",))
def memplan(state: CompileState, opts: MemplanOptions) -> None:
    """Place intermediates in one arena by lifetime, in place where the consumer is the last reader."""
    state.memory = plan_memory(state.graph, state.ctx, inplace=opts.inplace, share=opts.share)
    m = state.memory
    state.log.append(f"memplan: arena {m.arena_bytes} B vs naive {m.naive_bytes} B, {m.inplace_pairs} in-place")
