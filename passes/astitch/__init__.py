"""The `astitch` pass: stitch memory-bound subgraphs into few kernels (AStitch, DESIGN.md §4),
and fuse elementwise work into the loads and stores of GEMM/Conv rOperators.

It runs after `lower` (which leaves each launch with its element-level expression) and before
`memplan`. nodes.py turns launches into nodes, planner.py decides groups, schemes, phases and
thread mappings, codegen.py writes the kernels; this module swaps them into the program, orders
the launches, and records what it did for `dlcc inspect --stitch`.
"""
from __future__ import annotations

import heapq
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ...errors import ConfigError
from ...ir import Tensor
from ...kernels import splitk
from ...kernels.gemm import kernel_smem
from ...kernels.program import Launch
from ...plan import gemm_problem
from ...random_draws import STATE
from .. import CompileState, register_pass
from .attention import plan_attention
from .codegen import attention_source_fused, gemm_source_fused, stitch_source
from .nodes import NodeGraph
from .planner import BLOCK, Planner, node_flops

SYNC = "%sync"  # the grid barriers' counters: two ints per spin-waiting launch (storage "sync")


class AStitchOptions(BaseModel):
    """Options of the `astitch` pass (pipeline YAML `options:`)."""

    model_config = ConfigDict(extra="forbid")
    schemes: list[Literal["independent", "local", "regional", "global"]] = Field(
        default=["independent", "local", "regional", "global"],
        description="stitch schemes allowed; without regional, row-local intermediates go through "
                    "global memory; without global, a stitch is split where it would need a grid barrier")
    smem_budget: int | None = Field(None, gt=0, description="shared memory per block for Regional buffers, in "
                                    "bytes; default and upper bound: the device's shared_mem_per_block, at most 48 KiB (static), "
                                    "less 1 KiB of reduction scratch")
    gemm_fusion: bool = Field(True, description="fuse elementwise consumers into GEMM/Conv stores (epilogues) "
                              "and cheap per-element producers into their loads (prologues)")
    max_ops: int = Field(64, ge=1, description="cap on ops stitched into one kernel (and one epilogue)")
    task_splitting: bool = Field(True, description="split a long row across blocks when rows cannot fill a wave")
    inline_flops: int = Field(4, ge=-1, description="most FLOPs per element of a node recomputed in "
                              "rOperator loads instead of written once")
    inline_max_nodes: int = Field(32, ge=1, description="most node evaluations one element of an rOperator "
                                  "load may expand to (a value two inlined nodes read is computed twice); "
                                  "past it, nodes are computed once in stitched kernels instead")
    attention: Literal["auto"] | bool = Field(
        "auto", description="fuse Q·Kᵀ, its scale/mask epilogue, Softmax and P·V into one flash-attention rOperator "
        "(passes/astitch/attention.py): auto where the cost model says it is faster than the three kernels on a "
        "calibrated GPU (and always elsewhere), true, or false; needs gemm_fusion")


@register_pass("astitch", AStitchOptions, after=("lower",), before=("memplan", "rammer"))
def astitch(state: CompileState, opts: AStitchOptions) -> None:
    """Stitch memory-bound ops (Local/Regional/Global/Independent) and fuse GEMM epilogues and prologues."""
    if state.ctx is None:
        raise ConfigError("the 'astitch' pass must come after 'lower' in the pipeline")
    if state.memory is not None:
        raise ConfigError("the 'astitch' pass must come before 'memplan' in the pipeline")
    before = len(state.ctx.program.launches)
    ng = NodeGraph(state.graph, state.ctx)
    pl = Planner(ng, state.device, opts)
    pl.plan_epilogues()
    pl.plan_gemm_inline()
    pl.attention = plan_attention(pl, opts.attention == "auto") if opts.attention and opts.gemm_fusion else []
    pl.recompute_ancestors()
    pl.plan_groups()
    pl.plan_stitches()
    report = _rebuild(state, ng, pl)
    state.ctx.stitch_report = report
    ctx = state.ctx
    state.log.append(f"astitch: {before} launch(es) -> {len(ctx.program.launches)}; "
                     f"{len([r for r in report if r['kind'] == 'stitch'])} stitched kernel(s), "
                     f"{len([r for r in report if r['kind'] == 'gemm'])} fused rOperator(s)"
                     + (f", {len(pl.attention)} fused attention(s)" if pl.attention else "")
                     + (f", {len(pl.remaps)} transpose(s) done by the store of the kernel before them"
                        if pl.remaps else ""))


def _rebuild(state, ng: NodeGraph, pl: Planner) -> list[dict]:
    ctx = state.ctx
    prog = ctx.program
    old = prog.launches
    units: list[dict] = []
    covered: set[int] = set(pl.gemm_inline)
    report: list[dict] = []
    if any(st.spin for st in pl.stitches):
        n = max(st.sync_slot for st in pl.stitches if st.spin) + 1
        state.graph.tensors[SYNC] = Tensor(SYNC, (2 * n,), "int32")
    for af in pl.attention:
        L, rep = _attention_launch(ng, pl, af, old, prog)
        units.append({"nodes": set(af.members), "launch": L})
        covered |= set(af.members)
        report.append(rep)
    for gid, fus in pl.gemms.items():
        g = ng.nodes[gid]
        text, args, reads, writes, (spec, text_for) = gemm_source_fused(ng, pl, fus)
        k = prog.add_kernel(f"{g.gemm.hint}_{g.gemm.tiling.name}_fused", lambda nm, t=text: t.replace("KNAME", nm),
                            g.gemm.tiling.threads, kind="gemm", tiling=g.gemm.tiling.name, pass_name="astitch",
                            math=g.gemm.tiling.math, **kernel_smem(g.gemm.tiling))
        members = [gid] + fus.epilogue
        extra = g.gemm.splitk_args  # a split tiling's workspace and counters (kernels/splitk.py)
        L = Launch(kernel=k, grid=g.launch.grid, block=g.launch.block, args=[("t", a) for a in args] + splitk.typed(extra),
                   reads=reads, writes=writes + splitk.split_tensors(extra)[1], node=g.onnx_node, op_type=g.op_type,
                   flops=g.launch.flops + sum(node_flops(ng, ng.nodes[c]) for c in fus.epilogue),
                   dram_bytes=_dram(ng, pl, reads, writes, members), pass_name="astitch", category="compute",
                   math=g.gemm.tiling.math)
        L.regions.update({t: r for t, r in g.launch.regions.items() if t in splitk.tensors(extra)})
        L.gemm_problem = gemm_problem(g.launch)  # the tiling model prices it (plan mode, Rammer)
        L.deep_tiling, L.fused_gemm = g.launch.deep_tiling, (g.gemm.hint, spec, text_for, extra)
        units.append({"nodes": set(members), "launch": L})
        covered |= set(members)
        base = sum(old[o].dram_bytes for o in {ng.nodes[c].order for c in members}) + sum(
            old[ng.nodes[c].order].dram_bytes for c in pl.gemm_inline if any(
                ng.producer.get(t) == c for t in g.inputs))
        report.append({"kind": "gemm", "kernel": k, "ops": [ng.nodes[c].op_type for c in members],
                       "nodes": [ng.nodes[c].onnx_node for c in members],
                       "prologue": sorted({ng.nodes[ng.producer[t]].op_type for t in g.inputs
                                           if ng.producer.get(t) in pl.gemm_inline}),
                       "epilogue": [ng.nodes[c].op_type for c in fus.epilogue],
                       "dram_bytes": L.dram_bytes, "baseline_dram_bytes": base})
    for st in pl.stitches:
        text, args, smem = stitch_source(ng, pl, st)
        mat = {s.node for ph in st.phases for s in ph.stages}
        hint = "Stitch_" + "_".join(sorted({ng.nodes[i].op_type for i in mat}))[:40]
        k = prog.add_kernel(hint, lambda nm, t=text: t.replace("KNAME", nm), BLOCK, smem_bytes=smem, kind="stitch",
                            pass_name="astitch")
        writes = [t for t in args if t in _written(ng, st)]
        reads = [t for t in args if t not in writes]
        a = [("t", t) for t in args]
        if st.spin:
            a += [("t", SYNC), ("i", 2 * st.sync_slot)]
        members = set(st.nodes) if st.split_from is None else mat | _inlined_used(ng, pl, st)
        cat = "reduction" if any(ng.nodes[i].kind == "reduce" for i in mat) else "elementwise"
        onnx = []
        for i in sorted(members):
            if ng.nodes[i].onnx_node and ng.nodes[i].onnx_node not in onnx:
                onnx.append(ng.nodes[i].onnx_node)
        L = Launch(kernel=k, grid=st.grid, block=BLOCK, args=a, reads=reads, writes=writes + ([SYNC] if st.spin else []),
                   node="+".join(onnx[:4]) + ("+..." if len(onnx) > 4 else ""), op_type="Stitch",
                   flops=sum(node_flops(ng, ng.nodes[i]) for i in members),
                   dram_bytes=_dram(ng, pl, reads, writes, members), pass_name="astitch", category=cat)
        L.grid_sync = st.spin
        units.append({"nodes": members, "launch": L})
        covered |= set(st.nodes)
        report.append(_stitch_report(ng, pl, st, k, L, old, members, smem))
    by_order: dict[int, set[int]] = {}  # the nodes of each launch of the program before the pass
    for n in ng.nodes:
        by_order.setdefault(n.order, set()).add(n.id)
    kept_orders = dict.fromkeys(n.order for n in ng.nodes if n.id not in covered)
    for o in kept_orders:
        units.append({"nodes": by_order[o], "launch": old[o], "orig": o})
    prog.launches = _order(ng, pl, units)
    prog.prune_unlaunched()
    return report


def _attention_launch(ng, pl, af, old, prog) -> tuple[Launch, dict]:
    """The launch of one fused attention (passes/astitch/attention.py) and its report row: one
    rTask per head and block of query rows; the FLOPs of both products, the Softmax and the
    epilogues; DRAM bytes of Q, K, V, the mask and the output, the scores no longer among them."""
    from ...kernels.attention import ATTN_THREADS, AttentionShape, attention_tasks
    from ...kernels.attention_mma import fused_attention_smem_floats
    from .attention import attention_problem

    problem = attention_problem(pl, af)
    math = problem[5]
    text, args, reads, writes = attention_source_fused(ng, pl, af, math)
    g1, g2 = ng.nodes[af.qk], ng.nodes[af.pv]
    s1, s2 = g1.gemm.spec, g2.gemm.spec
    shape = AttentionShape(*problem[:5])
    k = prog.add_kernel("Attention", lambda nm, t=text: t.replace("KNAME", nm), ATTN_THREADS,
                        smem_bytes=4 * fused_attention_smem_floats(shape, math), kind="attention", pass_name="astitch",
                        math=math)
    members = af.members
    flops = (2 * s1.batch * s1.M * s1.N * (s1.K + s2.N) + 5 * s1.batch * s1.M * s1.N
             + sum(node_flops(ng, ng.nodes[c]) for c in af.score + af.epilogue))
    L = Launch(kernel=k, grid=attention_tasks(shape), block=ATTN_THREADS, args=[("t", a) for a in args], reads=reads,
               writes=writes, node="+".join(dict.fromkeys(ng.nodes[c].onnx_node for c in (af.qk, af.pv))),
               op_type="Attention", flops=flops, dram_bytes=_dram(ng, pl, reads, writes, members), pass_name="astitch",
               category="compute", math=math)
    L.attention = problem
    base = sum(old[o].dram_bytes for o in {ng.nodes[c].order for c in members})
    ops = [ng.nodes[c].op_type for c in members]
    rep = {"kind": "gemm", "kernel": k, "math": math,
           "ops": ["Attention"] + [o for i, o in enumerate(ops) if i == 0 or o != ops[i - 1]],
           "nodes": list(dict.fromkeys(ng.nodes[c].onnx_node for c in members)),
           "prologue": sorted({ng.nodes[ng.producer[t]].op_type for c in (af.qk, af.pv) for t in ng.nodes[c].inputs
                               if ng.producer.get(t) in pl.gemm_inline}),
           "epilogue": [ng.nodes[c].op_type for c in af.epilogue],
           "dram_bytes": L.dram_bytes, "baseline_dram_bytes": base}
    return L, rep


def _written(ng, st) -> set[str]:
    out = set()
    for ph in st.phases:
        for s in ph.stages:
            if s.glob:
                out.add(ng.nodes[s.node].output)
    return out


def _inlined_reads(ng, start, inlined: set[int]) -> set[int]:
    """The nodes of `inlined` that nodes `start` read, transitively (computed in their threads)."""
    used: set[int] = set()
    todo = list(start)
    while todo:
        for t in ng.nodes[todo.pop()].inputs:
            p = ng.producer.get(t)
            if p is not None and p in inlined and p not in used:
                used.add(p)
                todo.append(p)
    return used


def _inlined_used(ng, pl, st) -> set[int]:
    return _inlined_reads(ng, [s.node for ph in st.phases for s in ph.stages], st.inlined)


def _with_loads(ng, pl, members) -> set[int]:
    """`members` of a fused rOperator and the nodes computed inside its loads (planner.gemm_inline)
    that they read, transitively: the readers _dram looks at. Why: an embedding lookup inlined
    into GPT-2's first QKV projection reads 128 rows of a 77 MB table, not the table."""
    return set(members) | _inlined_reads(ng, members, pl.gemm_inline)


def _dram(ng, pl, reads, writes, members) -> int:
    """Modelled DRAM bytes: each tensor read once (a table read through a gather: the rows it
    reads), each written once; a global intermediate both written and read back."""
    total = 0
    members = _with_loads(ng, pl, members)
    for t in reads:
        nb = ng.tensor(t).nbytes
        readers = [ng.nodes[c] for c in pl.consumers(t) if c in members]
        if readers and all(r.kind == "map" and r.sparse for r in readers):
            nb = min(nb, sum(ng.size(r.output) for r in readers) * ng.tensor(t).itemsize)
        total += nb
    for t in writes:
        nb = ng.tensor(t).nbytes
        outside = pl.is_output(t) or any(c not in members for c in pl.consumers(t))
        total += nb if outside else 2 * nb
    return total


def _order(ng, pl, units) -> list:
    """Launches in a topological order of their data dependencies, closest to the original."""
    writer: dict[str, int] = {}
    prio = []
    for ui, u in enumerate(units):
        prio.append(min(ng.nodes[i].order for i in u["nodes"]) if u["nodes"] else u.get("orig", 0))
    deps = [set() for _ in units]
    multi_access: dict[str, list[tuple[int, int]]] = {}
    for ui, u in enumerate(units):
        L = u["launch"]
        for t in L.writes:
            t = ng.res(t)
            if t in pl.multi or t == STATE:  # (the state's draws read it as it was before: below)
                continue
            writer[t] = ui
    for ui, u in enumerate(units):
        L = u["launch"]
        for t in set(ng.res(x) for x in L.reads + L.writes):
            if t in pl.multi:
                multi_access.setdefault(t, []).append((u.get("orig", prio[ui]), ui))
                continue
            w = writer.get(t)
            if w is not None and w != ui and t in {ng.res(x) for x in L.reads}:
                deps[ui].add(w)
    for ui, u in enumerate(units):  # the random state's advance (ops/random.py) after every draw: the
        if STATE in u["launch"].writes:  # one tensor the plan reads before it writes it
            deps[ui] |= {vi for vi, v in enumerate(units) if vi != ui and STATE in v["launch"].reads}
    for t, acc in multi_access.items():  # tensors written by several launches keep their order
        acc.sort()
        for (_, a), (_, b) in zip(acc, acc[1:]):
            if a != b:
                deps[b].add(a)
    users = [[] for _ in units]
    indeg = [len(d) for d in deps]
    for ui, d in enumerate(deps):
        for w in d:
            users[w].append(ui)
    heap = [(prio[ui], ui) for ui in range(len(units)) if indeg[ui] == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        _, ui = heapq.heappop(heap)
        out.append(units[ui]["launch"])
        for v in users[ui]:
            indeg[v] -= 1
            if indeg[v] == 0:
                heapq.heappush(heap, (prio[v], v))
    if len(out) != len(units):
        raise RuntimeError("astitch: the fused launches have a dependency cycle (a dlcc bug)")
    return out


def _stitch_report(ng, pl, st, kernel, L, old, members, smem) -> dict:
    mat = [s for ph in st.phases for s in ph.stages]
    dominants = [ng.nodes[s.node].op_type + f"#{s.node}" for s in mat if ng.nodes[s.node].kind == "reduce"]
    inter = []
    for pi, ph in enumerate(st.phases):
        for s in ph.stages:
            n = ng.nodes[s.node]
            t = ng.tensor(n.output)
            where = []
            if s.smem:
                where.append(f"shared ({4 * s.per_unit * ph.per_block} B)")
            if s.glob:
                outside = pl.is_output(n.output) or any(c not in set(st.nodes) for c in pl.consumers(n.output))
                where.append(("output" if outside else "global") + f" ({t.nbytes} B)")
            inter.append({"node": s.node, "op": n.op_type, "phase": pi, "where": ", ".join(where) or "registers",
                          "demoted": s.demoted})
    for i in sorted(st.inlined & members):
        inter.append({"node": i, "op": ng.nodes[i].op_type, "phase": None, "where": "registers", "demoted": False})
    phases = []
    for ph in st.phases:
        blocks = -(-ph.U // ph.per_block)
        phases.append({"units": ph.U, "threads_per_unit": ph.tpr, "units_per_block": ph.per_block,
                       "horizontal_packing": ph.per_block, "vertical_packing": -(-blocks // max(1, L.grid)),
                       "split": ph.split, "grid_barrier_before": ph.grid_barrier,
                       "smem_bytes": 4 * ph.smem_floats, "stages": [ng.nodes[s.node].op_type for s in ph.stages],
                       "block_barriers": sum(s.barrier for s in ph.stages)})
    base = sum(old[o].dram_bytes for o in {ng.nodes[i].order for i in members})
    waves = -(-L.grid // pl.blocks_per_wave())
    return {"kind": "stitch", "kernel": kernel, "ops": [ng.nodes[i].op_type for i in sorted(members)],
            "nodes": sorted({ng.nodes[i].onnx_node for i in members if ng.nodes[i].onnx_node}),
            "dominants": dominants, "edges": [{k: v for k, v in e.items() if k in ("producer", "consumer", "scheme",
                                                                                     "dependency", "where")}
                                              for e in st.edges],
            "independent_components": st.independent, "intermediates": inter,
            "mapping": {"block": BLOCK, "grid": L.grid, "waves": waves, "phases": phases, "grid_sync": st.spin,
                        "resident_blocks": st.resident if st.spin else None,
                        "residency": st.resident_bound if st.spin else None, "split_segment": st.split_from},
            "smem_bytes": smem, "dram_bytes": L.dram_bytes, "baseline_dram_bytes": base,
            "saved_bytes": base - L.dram_bytes}
