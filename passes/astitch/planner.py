"""Deciding what goes where: GEMM epilogues and prologues, stitch groups, dominants, schemes,
phases and thread mappings. No code is written here (codegen.py does that from these plans).

The order of decisions follows the paper, extended at compute boundaries:

1. **Epilogues.** A GEMM/Conv rOperator absorbs the map nodes that read its output at the same
   flat index (bias, activation, residual add, scale, mask add), transitively.
2. **Inlining into rOperators.** A cheap map node whose every consumer is an rOperator (or is
   itself inlined) is computed inside their loads (transposes, reshapes-with-copies, casts,
   the attention mask) and never written, as long as one loaded element expands to at most
   `inline_max_nodes` evaluations (a value read twice is computed twice).
3. **Groups.** The remaining memory-bound nodes join the group of a producer when that keeps the
   group convex (no path leaves the group and comes back); sibling groups that read a common
   input and do not depend on each other are packed into one kernel (Independent). The groups
   are then checked on the graph of launches, where a path through other groups can still
   close a cycle: a pack that does is undone, and a group left on a cycle is split up.
4. **Dominants and materialization.** Reductions, stitch outputs and map nodes read by more than
   one node in the group are materialized; every other node is recomputed in its consumer's
   thread (Local, registers).
5. **Phases.** Materialized nodes are laid out, in order, in phases: loops over units (rows)
   that every stage of the phase shares. A node joins the current phase when its units line up
   and every read of a node of this phase stays inside the unit (checked on index maps): that
   edge is Regional (shared memory). Otherwise it opens a new phase behind a grid barrier:
   Global. When the shared memory of a phase exceeds the budget, its largest buffer is demoted
   to global memory, one at a time.
6. **Thread mapping.** Per phase: threads per unit (a block, a warp, or one thread: horizontal
   packing), units per block, task splitting of long rows across blocks, and the grid, which
   for a kernel with grid barriers is capped at the proven resident blocks (vertical packing).
   Where residency cannot be proven, the kernel is split at its grid barriers.
"""
from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ...kernels.program import literal
from ...kernels.reduce import ReduceExpr, ReduceLayout
from .indexmap import access_kinds, input_index, is_identity, reads_identity, reduce_index, same_shape_broadcast
from .nodes import FLOATS, SMEM_DTYPES, NodeGraph

BLOCK = 256
STATIC_SMEM_LIMIT = 48 * 1024  # bytes of static shared memory a CUDA block may declare
#: A grid barrier is used only while the work needs at most this many waves of resident blocks
#: (vertical packing); beyond that, splitting keeps the parallelism.
MAX_VERTICAL = 4


@dataclass
class GemmFusion:
    node: int
    epilogue: list[int] = field(default_factory=list)  # absorbed map nodes, in order
    stored: list[str] = field(default_factory=list)  # tensors the kernel writes


@dataclass
class Stage:
    node: int
    per_unit: int  # elements (map) or outputs (reduce) per unit
    smem: bool = False  # kept in shared memory for readers in this phase (Regional)
    glob: bool = False  # written to global memory (stitch output, later phase, or demoted)
    smem_off: int = 0  # floats from the start of the phase's shared buffer, per block
    demoted: bool = False
    barrier: bool = True  # a block barrier follows this stage (Planner._plan_barriers)


@dataclass
class Phase:
    U: int
    chunked: bool  # units are flat chunks of `per_unit` elements (last one ragged)
    stages: list[Stage] = field(default_factory=list)
    grid_barrier: bool = False  # a grid barrier precedes this phase
    tpr: int = BLOCK  # threads per unit
    smem_floats: int = 0
    split: int = 1  # task splitting factor of this phase's reduction (1: none)

    @property
    def per_block(self) -> int:
        return BLOCK // self.tpr


@dataclass
class Stitch:
    """One stitched kernel (or, after a split, one segment of a stitch)."""

    nodes: list[int]
    inlined: set[int]
    phases: list[Phase]
    grid: int = 1
    spin: bool = False
    resident: int = 0
    resident_bound: str = ""
    edges: list[dict] = field(default_factory=list)
    independent: int = 1  # connected components packed together
    split_from: int | None = None
    sync_slot: int = 0
    need: int = 1  # blocks the work would use without vertical packing


# --------------------------------------------------------------------------------------------
def node_size(ng: NodeGraph, n) -> int:
    return ng.size(n.output)


def node_flops(ng: NodeGraph, n) -> int:
    """FLOPs of a map or reduce node (what a stitched launch reports for it)."""
    if n.kind == "map":
        return node_size(ng, n) * max(0, n.flops_per_elem)
    if n.kind == "reduce":
        return int(np.prod(n.red.shape))
    return 0


class Planner:
    def __init__(self, ng: NodeGraph, device, opts):
        self.ng, self.dev, self.opts = ng, device, opts
        self.nodes = ng.nodes
        multi = {}
        for n in self.nodes:
            for w in n.writes:
                multi[w] = multi.get(w, 0) + 1
        #: tensors written by several launches (RNN state): nodes touching them are never fused
        self.multi = {t for t, c in multi.items() if c > 1}
        kept = {n.id for n in self.nodes if n.kind == "opaque" or any(t in self.multi for t in n.reads + n.writes)}
        # a launch decomposed into several nodes (Softmax, LayerNorm) is kept whole or not at all:
        # the kept original writes only its output, never the temporaries (exp(x - max), the
        # mean) that the stitched rest of it would read
        kept_launches = {self.nodes[i].order for i in kept}
        self.kept = {n.id for n in self.nodes if n.order in kept_launches}
        self.extra: dict[int, set[int]] = {}  # fused rOperators also need what their epilogue reads
        self.anc = self._ancestors()
        self.per_launch: dict[int, int] = {}  # nodes made from each original launch
        for n in self.nodes:
            self.per_launch[n.order] = self.per_launch.get(n.order, 0) + 1
        self.gemms: dict[int, GemmFusion] = {}
        self.attention: list = []  # fused attentions (attention.py plan_attention)
        self.absorbed: dict[int, int] = {}  # map node -> gemm node whose epilogue computes it
        # an epilogue's last node that only moves the value (a Transpose keeping the last axis): its
        # output is stored at this index expression of the epilogue's flat index (codegen.store_index)
        self.remaps: dict[int, Callable[[str], str]] = {}
        self.transposes: dict = {}  # the graph's Transpose nodes by name (the first of a name), for their perm
        for n in ng.graph.nodes:
            if n.op_type == "Transpose":
                self.transposes.setdefault(n.name, n)
        self.gemm_inline: set[int] = set()  # map nodes computed inside rOperator loads
        self.groups: list[list[int]] = []
        self.stitches: list[Stitch] = []

    # -- dependencies ---------------------------------------------------------------------------
    def preds(self, n) -> list[int]:
        out = list(self.extra.get(n.id, ()))
        for t in n.reads:
            p = self.ng.producer.get(t)
            if p is not None and p != n.id and p not in out:
                out.append(p)
        return out

    def consumers(self, t: str) -> list[int]:
        return self.ng.consumers.get(t, [])

    def _ancestors(self) -> list[int]:
        anc = [0] * len(self.nodes)
        for n in self.nodes:
            a = 0
            for p in self.preds(n):
                if p < n.id:
                    a |= anc[p] | (1 << p)
            anc[n.id] = a
        return anc

    def _decomposed(self, n) -> bool:
        """Part of a decomposed op (softmax, LayerNorm): it belongs with its siblings in a stitch."""
        return self.per_launch[n.order] > 1

    def recompute_ancestors(self) -> None:
        """A fused rOperator runs its epilogue and inlined loads too: it depends on everything they read."""
        for gid, fus in self.gemms.items():
            extra = set()
            todo = list(fus.epilogue) + [gid]
            seen = set()
            while todo:
                c = todo.pop()
                if c in seen:
                    continue
                seen.add(c)
                for t in self.nodes[c].reads:
                    p = self.ng.producer.get(t)
                    if p is None or p == gid or p in fus.epilogue:
                        continue
                    if p in self.gemm_inline:
                        todo.append(p)
                    elif p < gid:
                        extra.add(p)
            self.extra[gid] = extra
        self.anc = self._ancestors()

    def is_output(self, t: str) -> bool:
        return t in self.ng.outputs

    # -- 1. epilogues ---------------------------------------------------------------------------
    def plan_epilogues(self) -> None:
        if not self.opts.gemm_fusion:
            return
        for g in self.nodes:
            if g.kind != "gemm" or g.id in self.kept or g.gemm.spec.store_index is None:
                continue
            fus = GemmFusion(g.id)
            size = self.ng.size(g.output)
            known = {g.output}
            # Only a node that reads a value of the epilogue can join it, so the walk visits
            # those, in node order (a heap of their ids: every id pushed is above the one
            # popped, so this is the order a scan of every later node would take). On a graph
            # of 20,000+ nodes the scan was most of the planner's time.
            seen = set(self.consumers(g.output))
            todo = sorted(seen)
            while todo:
                c = self.nodes[heapq.heappop(todo)]
                if len(fus.epilogue) >= self.opts.max_ops:
                    break
                if (c.kind != "map" or c.id in self.kept
                        or c.id in self.absorbed or node_size(self.ng, c) != size
                        or self.ng.tensor(c.output).dtype not in FLOATS):
                    continue
                ok = True
                for k, t in enumerate(c.inputs):
                    if not t:
                        continue
                    if t in known:
                        ok = ok and access_kinds(c).get(k) in (None, "bcast") and reads_identity(c, k, size)
                    else:
                        p = self.ng.producer.get(t)
                        # anything else the epilogue reads must exist before the GEMM runs
                        ok = ok and (p is None or p < g.id)
                if ok:
                    fus.epilogue.append(c.id)
                    known.add(c.output)
                    self.absorbed[c.id] = g.id
                    for x in self.consumers(c.output):
                        if x not in seen:
                            seen.add(x)
                            heapq.heappush(todo, x)
                elif self._stores_permuted(c, known):
                    fus.epilogue.append(c.id)  # the last: what follows reads another layout
                    self.absorbed[c.id] = g.id
                    break
            if fus.epilogue:
                self.gemms[g.id] = fus

    def _stores_permuted(self, c, known: set) -> bool:
        """Whether map node `c` is a Transpose of a value the epilogue computes, keeping the last
        axis, read only by GEMMs: the epilogue then stores that value where the Transpose puts it
        (self.remaps), and the GEMMs read their operand plainly. Why: a transformer's attention
        output is transposed back to [tokens, heads x d] for the output projection; inlined into
        that GEMM's loads, the transpose made its A operand a computed one, loaded two bytes at a
        time at bf16 instead of copied by cp.async (kernels/gemm_mma_async.py async_ok)."""
        perm = self._transpose_perm(c)
        if (perm is None or perm[-1] != len(perm) - 1 or c.inputs[0] not in known or self.is_output(c.output)
                or self.ng.tensor(c.output).dtype not in FLOATS):
            return False
        cons = self.consumers(c.output)
        if not cons or any(self.nodes[x].kind != "gemm" or x in self.kept for x in cons):
            return False
        shape = tuple(c.in_shapes[0])
        stride = [int(np.prod(shape[k + 1:])) for k in range(len(shape))]
        out_shape = [shape[p] for p in perm]
        out_stride = [int(np.prod(out_shape[j + 1:])) for j in range(len(perm))]

        def remap(i: str) -> str:
            terms = [f"(({i}) / {stride[p]} % {shape[p]}) * {out_stride[j]}" for j, p in enumerate(perm) if shape[p] != 1]
            return " + ".join(terms) or "0"

        self.remaps[c.id] = remap
        return True

    def _transpose_perm(self, c) -> list[int] | None:
        """The permutation of map node `c` where it is a lowered Transpose of one input whose index
        map is exactly that permutation (checked), else None."""
        if c.kind != "map" or c.op_type != "Transpose" or len([t for t in c.inputs if t]) != 1 or not c.in_shapes:
            return None
        node = self.transposes.get(c.onnx_node)
        shape = tuple(c.in_shapes[0])
        if node is None:
            return None
        perm = [int(p) for p in node.attrs.get("perm", list(range(len(shape) - 1, -1, -1)))]
        if sorted(perm) != list(range(len(shape))) or 0 not in c.index_maps or int(np.prod(shape)) > 1 << 24:
            return None
        want = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape).transpose(perm).reshape(-1)
        got = np.asarray(c.index_maps[0]()).reshape(-1)
        return perm if got.shape == want.shape and np.array_equal(got, want) else None

    # -- 2. inlining into rOperators -----------------------------------------------------------
    def plan_gemm_inline(self) -> None:
        if not self.opts.gemm_fusion:
            return
        for n in reversed(self.nodes):
            if n.kind != "map" or n.id in self.kept or n.id in self.absorbed or self.is_output(n.output):
                continue
            if n.flops_per_elem > self.opts.inline_flops or self._decomposed(n):
                continue
            if any(self.ng.producer.get(t) is not None and self.nodes[self.ng.producer[t]].kind == "reduce"
                   for t in n.inputs):
                continue  # recomputing it in the loads would force a reduction's row onto global memory
            cons = self.consumers(n.output)
            if not cons:
                continue
            ok = all((self.nodes[c].kind == "gemm" and c not in self.kept) or c in self.absorbed or c in self.gemm_inline
                     for c in cons)
            if ok:
                self.gemm_inline.add(n.id)
        self._cap_inline_expansion()
        for gid in list(self.gemms) + [n.id for n in self.nodes if n.kind == "gemm"]:
            self.gemms.setdefault(gid, GemmFusion(gid))
        for gid, fus in list(self.gemms.items()):
            g = self.nodes[gid]
            if gid in self.kept:
                del self.gemms[gid]
                continue
            uses_inline = any(self.ng.producer.get(t) in self.gemm_inline for t in g.inputs)
            if not fus.epilogue and not uses_inline:
                del self.gemms[gid]
                continue
            made = [g.output] + [self.nodes[c].output for c in fus.epilogue]
            fus.stored = [t for t in made if self.is_output(t) or any(c not in fus.epilogue for c in self.consumers(t))]
            if not fus.stored:  # keep the last value at least (nothing reads it: simplify removed such nodes)
                fus.stored = [made[-1]]

    def _cap_inline_expansion(self) -> None:
        """Bound how many node evaluations one element of an rOperator's load expands to.

        An inlined node is recomputed at every read (codegen writes each as a function its
        consumers call), so a value that two inlined nodes read is computed twice, and a chain
        of such sharing doubles at every step. RWKV's exported time-mix recurrence, a chain of
        Max, Exp, Mul and Add over the sequence where each step reads the last one's result
        several times, expanded to 15,542 evaluations per element of a 38-deep chain: PoCL's
        compiler crashed on the kernel (SIGSEGV) and a GPU would recompute it all per load.
        Walking in graph order, the first inlined node past `inline_max_nodes` is taken out,
        with every inlined node that fed only inlined nodes through it (their consumer is no
        longer inlined); they become ordinary nodes that stitch groups compute once. Repeat
        until every expansion fits."""
        limit = self.opts.inline_max_nodes
        order = sorted(self.gemm_inline)
        size: dict[int, int] = {}
        start = 0
        while True:
            worst = None
            for i in order[start:]:
                if i not in self.gemm_inline:
                    continue
                size[i] = 1 + sum(size.get(self.ng.producer.get(t), 0) for t in self.nodes[i].inputs)
                if size[i] > limit:
                    worst = i
                    break
            if worst is None:
                return
            todo, taken_out = [worst], []
            while todo:
                k = todo.pop()
                if k in self.gemm_inline:
                    self.gemm_inline.discard(k)
                    size.pop(k, None)
                    taken_out.append(k)
                    todo += [p for t in self.nodes[k].inputs if (p := self.ng.producer.get(t)) in self.gemm_inline]
            # The sizes before the first node taken out stay as they were (they all fit), so the
            # next round resumes there; every size after it is recomputed before it is read.
            start = bisect.bisect_left(order, min(taken_out))

    # -- 3. groups --------------------------------------------------------------------------------
    def plan_groups(self) -> None:
        free = [n for n in self.nodes if n.memory_bound and n.id not in self.kept and n.id not in self.absorbed
                and n.id not in self.gemm_inline]
        group_of: dict[int, int] = {}
        masks: list[int] = []
        members: list[list[int]] = []
        for n in free:
            cands = []
            for p in self.preds(n):
                gi = group_of.get(p)
                if gi is not None and gi not in cands and members[gi]:
                    cands.append(gi)
            best = None
            if len(cands) > 1:  # n joins several groups: merge them when the union stays convex
                union = (1 << n.id)
                for gi in cands:
                    union |= masks[gi]
                size = 1 + sum(len(members[gi]) for gi in cands)
                if size <= self.opts.max_ops and self._convex(union):
                    best = cands[0]
                    for gi in cands[1:]:
                        for nid in members[gi]:
                            group_of[nid] = best
                        members[best] += members[gi]
                        masks[best] |= masks[gi]
                        members[gi], masks[gi] = [], 0
            if best is None:
                for gi in cands:
                    if len(members[gi]) >= self.opts.max_ops:
                        continue
                    if self._convex(masks[gi] | (1 << n.id)):
                        if best is None or len(members[gi]) > len(members[best]):
                            best = gi
            if best is None:
                best = len(members)
                members.append([])
                masks.append(0)
            members[best].append(n.id)
            masks[best] |= 1 << n.id
            group_of[n.id] = best
        before = ([list(m) for m in members], list(masks))
        if "independent" in self.opts.schemes:
            self._pack_siblings(members, masks)
        cycle = self._launch_cycle(members)
        if cycle and "independent" in self.opts.schemes:  # rare: pack again, each merge checked
            members[:], masks[:] = before
            self._pack_siblings(members, masks, checked=True)
            cycle = self._launch_cycle(members)
        # (node-level convexity does not see paths through other groups: a group on a cycle of
        # launches is dissolved into single nodes, which always order)
        for gi in cycle:
            members += [[nid] for nid in members[gi]]
            members[gi] = []
        self.groups = [sorted(m) for m in members if m]

    def _launch_cycle(self, members) -> set[int]:
        """The groups (indices into `members`) that lie on a cycle of the launch graph, where a
        group, a fused rOperator (a GEMM with its epilogue; an attention) and any other node are
        one launch each: empty where the launches can be ordered. Why: two groups can each be
        convex and still need each other (a1 -> b1 and b2 -> a2), and packing two independent
        groups into one kernel adds paths between nodes that node-level ancestors do not see
        (GroupQueryAttention's shared position arithmetic packed with one head's softmax, while
        another's rotation read that arithmetic and fed the softmax's GEMM)."""
        unit: dict[int, tuple] = {}
        for gi, mem in enumerate(members):
            for nid in mem:
                unit[nid] = ("G", gi)

        def key(nid: int) -> tuple:
            return unit.get(nid) or ("n", self.absorbed.get(nid, nid))

        inline_preds: dict[int, set] = {}

        def real_preds(n) -> set:
            """n's producers, looking through nodes computed inside rOperator loads."""
            out = set()
            for q in self.preds(n):
                if q not in self.gemm_inline:
                    out.add(q)
                    continue
                if q not in inline_preds:
                    inline_preds[q] = real_preds(self.nodes[q])
                out |= inline_preds[q]
            return out

        succ: dict[tuple, set] = {}
        for n in self.nodes:
            if n.id in self.gemm_inline:
                continue
            b = key(n.id)
            succ.setdefault(b, set())
            for q in real_preds(n):
                a = key(q)
                if a != b:
                    succ.setdefault(a, set()).add(b)
        return {k[1] for comp in _strong_components(succ) if len(comp) > 1 for k in comp if k[0] == "G"}

    def _convex(self, mask: int) -> bool:
        """No path leaves the node set `mask` and comes back into it. The set's members are
        visited by their bits alone (lowest first), not by shifting the mask a position at a time:
        a mask is as wide as the graph, and that walk made the planner quadratic in the node count
        (a stacked DynamicQuantizeLSTM unrolled into 29,000 nodes took minutes here)."""
        m = mask
        while m:
            low = m & -m
            m ^= low
            for q in self.preds(self.nodes[low.bit_length() - 1]):
                if not (mask >> q) & 1 and (self.anc[q] | (1 << q)) & mask:
                    return False
        return True

    def _pack_siblings(self, members, masks, checked: bool = False) -> None:
        """Independent scheme: groups that read a common tensor and do not depend on each other.
        `checked`: each merge is also checked on the graph of launches, and undone where it
        closes a cycle through other groups (_launch_cycle), which node-level ancestors miss."""
        def deps(gi):
            d = 0
            for nid in members[gi]:
                d |= self.anc[nid]
            return d

        by_input: dict[str, list[int]] = {}
        for gi, mem in enumerate(members):
            for nid in mem:
                for t in self.nodes[nid].reads:
                    p = self.ng.producer.get(t)
                    if p is None or (1 << p) & masks[gi] == 0:
                        by_input.setdefault(t, [])
                        if gi not in by_input[t]:
                            by_input[t].append(gi)
        for t, gis in by_input.items():
            gis = [g for g in gis if members[g]]
            while len(gis) > 1:
                a, b = gis[0], gis[1]
                if (deps(a) & masks[b] == 0 and deps(b) & masks[a] == 0
                        and len(members[a]) + len(members[b]) <= self.opts.max_ops
                        and self._external_independent(members, masks, a, b)):
                    kept, kept_mask = members[b], masks[b]
                    members[a] += kept
                    masks[a] |= kept_mask
                    members[b], masks[b] = [], 0
                    if checked and self._launch_cycle(members):  # a path through other groups: undo
                        members[a] = members[a][:-len(kept)]
                        masks[a] &= ~kept_mask
                        members[b], masks[b] = kept, kept_mask
                    gis.pop(1)
                else:
                    gis.pop(0)

    def _external_independent(self, members, masks, a, b) -> bool:
        """No node outside a∪b lies on a path between them (the merged group stays convex)."""
        both = masks[a] | masks[b]
        for nid in members[a] + members[b]:
            for q in self.preds(self.nodes[nid]):
                if not (both >> q) & 1 and (self.anc[q] | (1 << q)) & both:
                    return False
        return True

    # -- 4-6. per group -----------------------------------------------------------------------
    def plan_stitches(self) -> None:
        slot = 0
        for mem in self.groups:
            launches = {self.nodes[i].order for i in mem}
            whole_launch = len(launches) == 1 and all(
                n.id in mem for n in self.nodes if n.order in launches)
            if whole_launch and not any(self.ng.producer.get(t) in self.gemm_inline for i in mem for t in self.nodes[i].inputs):
                continue  # one original kernel, nothing to stitch: keep it
            for st in self._stitch_group(mem):
                if st.spin:
                    st.sync_slot = slot
                    slot += 1
                self.stitches.append(st)

    def _stitch_group(self, mem: list[int]) -> list[Stitch]:
        nodes = self.nodes
        gset = set(mem)
        mat: list[int] = []
        for i in mem:
            n = nodes[i]
            inside = [c for c in self.consumers(n.output) if c in gset]
            outside = [c for c in self.consumers(n.output) if c not in gset]
            if n.kind == "reduce" or outside or self.is_output(n.output) or len(inside) >= 2 or not inside:
                mat.append(i)
        mat = self._split_long_rows(mat, gset)
        mem = sorted(gset)
        inlined = gset - set(mat)
        phases = self._phases(mat, inlined)
        st = Stitch(mem, inlined, phases)
        self._place(st)
        self._map_threads(st)
        self._plan_barriers(st)
        self._residency(st)
        st.edges = self._edges(st)
        st.independent = self._components(mem)
        if any(p.grid_barrier for p in phases) and (not st.resident or "global" not in self.opts.schemes
                                                      or st.need > self._vertical_limit() * st.resident):
            # no proven residency, Global off, or so few resident blocks that vertical packing
            # would serialize the work: kernel boundaries are the cheaper barrier
            return self._split(st)
        return [st]

    def _split_long_rows(self, mat, gset):
        """Task splitting: a long row reduction with too few rows to fill a wave becomes partial
        reductions over row chunks (one unit each) and a combine over the chunks."""
        if not self.opts.task_splitting or "global" not in self.opts.schemes:
            return mat
        wave = self.blocks_per_wave()
        out = []
        for i in mat:
            n = self.nodes[i]
            if n.kind != "reduce":
                out.append(i)
                continue
            lay = ReduceLayout(n.red.shape, n.red.axes)
            O, R = lay.O, lay.R
            if not lay.row or O >= wave or R <= 1024:
                out.append(i)
                continue
            want = min(-(-wave // O), R // 256)
            S = max((d for d in range(2, want + 1) if R % d == 0), default=1)
            if S < 2:
                out.append(i)
                continue
            part = self.ng.temp((O * S,))
            post = n.red.post.replace("R_F", literal(float(R)))
            p = self.ng._new("reduce", n.order, n.launch, inputs=list(n.inputs), output=part,
                             red=ReduceExpr(n.red.x, part, (O * S, R // S), (1,), n.red.op, n.red.pre, "acc"),
                             out_shape=(O * S, 1))
            n.red = ReduceExpr(part, n.output, (O, S), (1,), n.red.op, "v", post)
            n.inputs, n.reads = [part], [part]
            self.ng.consumers[part] = [n.id]
            self.anc.append(self.anc[i])
            self.anc[i] |= 1 << p.id
            gset.add(p.id)
            out += [p.id, i]
            p.split_factor = S  # reported in the thread mapping
        return out

    # -- reading through the Local chain --------------------------------------------------------
    def trace(self, nid: int, idx: np.ndarray, units: np.ndarray, inlined: set[int], found: dict) -> None:
        """Follow node `nid`'s reads (at its flat output elements `idx`, belonging to `units`)
        through inlined nodes; record, per materialized tensor reached, (units, indices) pairs."""
        n = self.nodes[nid]
        if n.kind == "reduce":
            m = reduce_index(n.red)
            pairs = [(n.inputs[0], m)] if m is not None else [(n.inputs[0], None)]
            for t, mm in pairs:
                if mm is None:
                    self._reach(t, None, None, inlined, found)
                    continue
                sub = mm[np.clip(idx, 0, mm.shape[0] - 1)]  # [len(idx), R]
                sub[idx < 0] = -1
                self._reach(t, sub.reshape(-1), np.repeat(units, mm.shape[1]), inlined, found)
            return
        for k, t in enumerate(n.inputs):
            if not t:
                continue
            m = input_index(n, k)
            if m is None or idx is None:
                self._reach(t, None, None, inlined, found)
                continue
            sub = np.where(idx >= 0, m[np.clip(idx, 0, m.size - 1)], -1)
            self._reach(t, sub, units, inlined, found)

    def _reach(self, t, idx, units, inlined, found):
        p = self.ng.producer.get(t)
        if p is not None and p in inlined:
            if idx is None:
                self._unknown_below(p, inlined, found)
                return
            keep = idx != -2
            self.trace(p, idx[keep], units[keep], inlined, found)
            return
        found.setdefault(t, []).append((units, idx))

    def _unknown_below(self, p, inlined, found):
        n = self.nodes[p]
        for t in n.inputs:
            if t:
                self._reach(t, None, None, inlined, found)

    def reads_of_stage(self, nid: int, U: int, per_unit: int, inlined: set[int]) -> dict:
        """Materialized tensors stage `nid` reads, with (unit, element) pairs (None: unknown).
        Memoised per inlined set too: a read through an inlined node is a read of what that node
        reads, so the same stage reads other tensors under another inlining, and a stale entry
        could hide a read of an earlier phase (no grid barrier before the stage: a race)."""
        key = (nid, U, per_unit, frozenset(inlined))
        memo = self.__dict__.setdefault("_reads_memo", {})
        if key in memo:
            return memo[key]
        n = self.nodes[nid]
        size = node_size(self.ng, n)
        found: dict = {}
        memo[key] = found
        if size > (1 << 22):
            self._unknown_below(nid, inlined, found)
            return found
        idx = np.arange(size, dtype=np.int64)
        self.trace(nid, idx, idx // max(1, per_unit), inlined, found)
        return found

    @staticmethod
    def row_local(pairs, per_unit_t: int) -> bool:
        for units, idx in pairs:
            if idx is None:
                return False
            sel = idx != -2
            if np.any(idx[sel] < 0):
                return False
            if not np.array_equal(idx[sel] // per_unit_t, units[sel]):
                return False
        return True

    # -- phases -----------------------------------------------------------------------------------
    def _chases(self, n, inlined: set[int], current: set[str]) -> bool:
        """Whether stage `n` loads at an address computed from a value of the current phase
        (through its inlined nodes): a lookup (a node with sparse reads) reading one input at
        data-dependent elements while another comes from the phase, such as a Gather whose
        indices the phase made, a tree walk's next level.

        On a CPU device such a stage starts a new phase. PoCL runs a block as a loop over its
        work-items per region, so with each level in its own region (its own kernel, once split)
        the work-items' independent loads overlap their cache misses, where one region holding
        every level makes each work-item chase its own chain of dependent loads: a 100-tree
        forest's 26-level walk at 256 rows took 1.6x as long as one phase. A GPU hides that
        latency with other warps, and keeps the walk in one phase."""
        seen: set[int] = set()

        def from_phase(t: str) -> bool:
            if t in current:
                return True
            p = self.ng.producer.get(t)
            return p is not None and p in inlined and any(from_phase(u) for u in self.nodes[p].inputs if u)

        def visit(m) -> bool:
            if m.id in seen or m.kind != "map":
                return False
            seen.add(m.id)
            # only a lookup's -1 reads depend on data; elsewhere -1 can mean an op gave no map
            for k, t in enumerate(m.inputs if m.sparse else ()):
                idx = input_index(m, k) if t else None  # (None: past MAX_TRACE)
                if idx is not None and bool((idx == -1).any()) and any(
                        from_phase(u) for j, u in enumerate(m.inputs) if u and j != k):
                    return True
            return any(visit(self.nodes[p]) for t in m.inputs if t
                       and (p := self.ng.producer.get(t)) is not None and p in inlined)

        return visit(n)

    def _units_for(self, nid: int, later: list[int]) -> tuple[int, bool]:
        n = self.nodes[nid]
        size = node_size(self.ng, n)
        if n.kind == "reduce":
            return size, False
        for j in later:
            m = self.nodes[j]
            if m.kind == "reduce" and size % node_size(self.ng, m) == 0:
                return node_size(self.ng, m), False
        return -(-size // BLOCK), True

    def _phases(self, mat: list[int], inlined: set[int]) -> list[Phase]:
        phases: list[Phase] = []
        phase_of: dict[str, int] = {}
        for pos, nid in enumerate(mat):
            n = self.nodes[nid]
            size = node_size(self.ng, n)
            placed = False
            if phases:
                ph = phases[-1]
                per = BLOCK if ph.chunked else (size // ph.U if size % ph.U == 0 else 0)
                if ph.chunked and -(-size // BLOCK) != ph.U:
                    per = 0
                if per and not (n.kind == "reduce" and ph.chunked):
                    reads = self.reads_of_stage(nid, ph.U, per, inlined)
                    ok = self.dev.kind != "cpu" or not self._chases(
                        n, inlined, {t for t, q in phase_of.items() if q == len(phases) - 1})
                    for t, pairs in reads.items():
                        q = phase_of.get(t)
                        if q is None:
                            continue
                        if q == len(phases) - 1:
                            tsize = self.ng.size(t)
                            tper = BLOCK if ph.chunked else tsize // ph.U
                            ok = ok and "regional" in self.opts.schemes and self.row_local(pairs, tper)
                        else:
                            ok = ok and ph.grid_barrier
                    if ok:
                        ph.stages.append(Stage(nid, per))
                        phase_of[n.output] = len(phases) - 1
                        placed = True
            if placed:
                continue
            U, chunked = self._units_for(nid, mat[pos + 1:])
            per = BLOCK if chunked else size // U
            reads = self.reads_of_stage(nid, U, per, inlined)
            barrier = any(t in phase_of for t in reads)
            phases.append(Phase(U, chunked, [Stage(nid, per)], grid_barrier=barrier))
            phase_of[n.output] = len(phases) - 1
        return phases

    def _place(self, st: Stitch) -> None:
        """Where each materialized node lives: shared memory for readers in its phase (Regional),
        global memory for stitch outputs and later phases; demote Regional to Global when the
        phase's shared memory exceeds the budget, the largest buffer first."""
        gset = set(st.nodes)
        where: dict[str, tuple[int, int]] = {}
        for pi, ph in enumerate(st.phases):
            for si, s in enumerate(ph.stages):
                where[self.nodes[s.node].output] = (pi, si)
        readers: dict[str, set] = {}
        for pi, ph in enumerate(st.phases):
            for s in ph.stages:
                for t in self.reads_of_stage(s.node, ph.U, s.per_unit, st.inlined):
                    readers.setdefault(t, set()).add(pi)
        for pi, ph in enumerate(st.phases):
            for s in ph.stages:
                t = self.nodes[s.node].output
                outside = self.is_output(t) or any(c not in gset for c in self.consumers(t))
                rs = readers.get(t, set())
                s.glob = outside or any(r != pi for r in rs)
                # shared memory is a float array (nodes.SMEM_DTYPES): an int64 value read in its
                # own phase goes through global memory, where it keeps its type
                s.smem = pi in rs and "regional" in self.opts.schemes and self.ng.tensor(t).dtype in SMEM_DTYPES
                if pi in rs and not s.smem:
                    s.glob = s.demoted = True
        budget = self.smem_budget() // 4
        for ph in st.phases:
            while True:
                self._alloc_smem(ph, st)
                if ph.smem_floats <= budget:
                    break
                cand = [s for s in ph.stages if s.smem]
                if not cand:
                    break
                big = max(cand, key=lambda s: s.per_unit)
                big.smem, big.glob, big.demoted = False, True, True

    def smem_budget(self) -> int:
        """Bytes a phase's `sm` buffers may take. A stitch kernel declares its shared memory
        statically, and CUDA caps a block's static shared memory at 48 KiB, whatever the device
        allows with dynamic opt-in; `red`, the scratch of cooperative reductions (BLOCK floats),
        sits beside `sm` inside that cap. The option sets a smaller budget, never a larger one."""
        cap = min(self.dev.shared_mem_per_block, STATIC_SMEM_LIMIT) - BLOCK * 4
        return min(self.opts.smem_budget, cap) if self.opts.smem_budget is not None else cap

    def _alloc_smem(self, ph: Phase, st: Stitch) -> None:
        """Offsets by liveness inside the phase: a buffer is live from its stage to its last reader."""
        last: dict[int, int] = {}
        for si, s in enumerate(ph.stages):
            for t in self.reads_of_stage(s.node, ph.U, s.per_unit, st.inlined):
                for sj, s2 in enumerate(ph.stages[:si]):
                    if self.nodes[s2.node].output == t:
                        last[sj] = si
        # threads per unit is not known yet: size buffers for the most units a block can hold
        P = ph.per_block
        live: list[tuple[int, int, int]] = []  # (start stage, end stage, offset, size)
        top = 0
        for si, s in enumerate(ph.stages):
            if not s.smem:
                continue
            size = s.per_unit * P
            end = last.get(si, si)
            busy = sorted((o, o + z) for (a, b, o, z) in live if not (b < si or end < a))
            off = 0
            for lo, hi in busy:
                if off + size <= lo:
                    break
                off = max(off, hi)
            s.smem_off = off
            live.append((si, end, off, size))
            top = max(top, off + size)
        ph.smem_floats = top

    # -- thread mapping ---------------------------------------------------------------------------
    def _map_threads(self, st: Stitch) -> None:
        dev = self.dev
        warp = dev.warp_size
        W = dev.sms * (dev.max_threads_per_sm // max(1, warp))  # warps per wave
        for ph in st.phases:
            reds = [self.nodes[s.node] for s in ph.stages if self.nodes[s.node].kind == "reduce"]
            if ph.chunked:
                ph.tpr = BLOCK
            elif reds:
                lay = ReduceLayout(reds[0].red.shape, reds[0].red.axes)
                rows, cols = ph.U, max(ReduceLayout(r.red.shape, r.red.axes).R for r in reds)
                if (not lay.row and lay.inner > 1) or (dev.kind == "cpu" and (rows >= 64 or cols <= 256)):
                    # column reduction: a thread per output, loads coalesced across threads; on a
                    # CPU device a work-item per row also spares the work-group barriers of a tree
                    ph.tpr = 1
                elif rows < W / 4 or (rows < W / 2 and cols >= 1024) or (rows >= W / 2 and cols >= 512):
                    ph.tpr = BLOCK  # a block per row
                else:
                    ph.tpr = max(1, min(BLOCK, warp))  # a warp per row
                if cols <= 2 and ph.tpr > 1:
                    ph.tpr = 1
            else:
                per = max(s.per_unit for s in ph.stages)
                t = 1
                while t < per and t < BLOCK:
                    t *= 2
                ph.tpr = t
            if any(s.smem for s in ph.stages):
                self._alloc_smem(ph, st)  # the units per block are known now
                budget = self.smem_budget() // 4
                while ph.smem_floats > budget and ph.tpr < BLOCK:  # fewer units per block
                    ph.tpr *= 2
                    self._alloc_smem(ph, st)
                while ph.smem_floats > budget and any(s.smem for s in ph.stages):
                    big = max((s for s in ph.stages if s.smem), key=lambda s: s.per_unit)
                    big.smem, big.glob, big.demoted = False, True, True
                    self._alloc_smem(ph, st)
            ph.split = max([getattr(self.nodes[s.node], "split_factor", 1) for s in ph.stages] + [1])

    def blocks_per_wave(self) -> int:
        """BLOCK-thread blocks the device runs at once (threads and block slots only)."""
        d = self.dev
        return d.sms * max(1, min(d.max_blocks_per_sm, d.max_threads_per_sm // BLOCK))

    def _vertical_limit(self) -> int:
        """On a CPU device (PoCL) a spinning work-group holds a core the others need: no vertical
        packing there, a grid barrier only when every unit already has its own resident group."""
        return 1 if self.dev.kind == "cpu" else MAX_VERTICAL

    def _plan_barriers(self, st: Stitch) -> None:
        """Which stages can go without the block barrier that follows them. A barrier makes a
        stage's writes visible to the other threads of the block; a stage whose value only the
        thread that wrote it reads back in this phase needs none (one thread sees its own writes
        in program order). So a map stage that writes global memory only (an int64 value, or one
        demoted over the shared-memory budget) defers its barrier, and the barrier is put back
        before the first later stage that:
          - reads a deferred value at an element another thread wrote (traced on index maps,
            through the inlined nodes; unknown counts as another thread);
          - writes shared memory (its offset may reuse one that another thread still reads) or
            is a reduction (its tree of partial sums is block-wide).
        The last stage of a phase always keeps its barrier (the next turn, the next phase).

        A CPU device keeps every barrier. PoCL runs a block as one loop over its work-items per
        region between barriers, so a barrier costs it a loop, not a wait, and dropping them made
        no difference beyond PoCL's run-to-run spread (a 100-tree forest's walk); kept, each
        region stays the shape its loop vectorizer was measured on."""
        if self.dev.kind == "cpu":
            return
        for ph in st.phases:
            pending: dict[str, int] = {}  # deferred value -> its stage's elements per unit
            for k, s in enumerate(ph.stages):
                n = self.nodes[s.node]
                if pending and (n.kind != "map" or s.smem
                                or not self._same_thread_reads(n, s.per_unit, ph.tpr, pending, st.inlined)):
                    ph.stages[k - 1].barrier = True
                    pending = {}
                s.barrier = not (n.kind == "map" and not s.smem and k < len(ph.stages) - 1)
                if s.barrier:
                    pending = {}
                else:
                    pending[n.output] = s.per_unit

    def _same_thread_reads(self, n, per: int, tpr: int, pending: dict[str, int], inlined: set[int]) -> bool:
        """Whether map stage `n` (`per` elements per unit, `tpr` threads per unit) reads each
        `pending` value only at elements its own thread wrote: the writer's element e sits in
        unit e // pw at lane (e % pw) % tpr, the reader's element o in unit o // per at lane
        (o % per) % tpr. Traced with one unit per element, so each read keeps the element that
        made it."""
        reads = self.reads_of_stage(n.id, node_size(self.ng, n), 1, inlined)
        for t, pw in pending.items():
            for origin, idx in reads.get(t, []):
                if idx is None:
                    return False
                sel = idx != -2
                e, o = idx[sel], origin[sel]
                if np.any(e < 0) or not (np.array_equal(e // pw, o // per)
                                         and np.array_equal((e % pw) % tpr, (o % per) % tpr)):
                    return False
        return True

    def _residency(self, st: Stitch) -> None:
        """Blocks needed, and for a kernel with grid barriers the resident blocks proven possible.

        Spin-waiting kernels are emitted with LAUNCH_BOUNDS(BLOCK): nvcc must then fit the
        registers of a full block on one SM, so one block per SM is guaranteed whenever the
        block's threads and shared memory fit an SM. That (and no more) is the bound used.
        """
        dev = self.dev
        need = max(-(-ph.U // ph.per_block) for ph in st.phases)
        st.spin = any(ph.grid_barrier for ph in st.phases)
        smem = 4 * (max(ph.smem_floats for ph in st.phases) + BLOCK)
        fits = BLOCK <= min(dev.max_threads_per_sm, dev.max_threads_per_block) and smem <= dev.shared_mem_per_sm
        per_sm = 0
        if fits:
            per_sm = 1
            st.resident_bound = ("1 block/SM: LAUNCH_BOUNDS caps registers; "
                                 f"{dev.sms} SMs on {dev.name}")
        else:
            st.resident_bound = (f"none: a {BLOCK}-thread block with {smem} B of shared memory does not fit "
                                 f"one SM of {dev.name}")
        st.resident = dev.sms * per_sm
        st.need = need
        st.grid = min(need, st.resident) if st.spin and st.resident else need

    def _split(self, st: Stitch) -> list[Stitch]:
        """No proven co-residency (or Global off): one kernel per run of phases between grid
        barriers; what crosses a cut goes through global memory, and the kernel boundary is the
        barrier."""
        segs: list[list[Phase]] = []
        for ph in st.phases:
            if ph.grid_barrier or not segs:
                segs.append([])
            ph.grid_barrier = False
            segs[-1].append(ph)
        out = []
        for k, phs in enumerate(segs):
            nodes_here = {s.node for ph in phs for s in ph.stages}
            s2 = Stitch(sorted(nodes_here | {i for i in st.inlined}), set(st.inlined), phs, split_from=k,
                        resident=st.resident, resident_bound=st.resident_bound, independent=st.independent)
            # every materialized value another segment reads is in global memory already (_place)
            self._residency(s2)
            s2.edges = [e for e in st.edges if e["consumer_node"] in nodes_here or e["consumer_node"] in st.inlined]
            out.append(s2)
        return out

    # -- reporting --------------------------------------------------------------------------------
    def _edges(self, st: Stitch) -> list[dict]:
        gset = set(st.nodes)
        loc: dict[str, tuple[int, Stage]] = {}
        for pi, ph in enumerate(st.phases):
            for s in ph.stages:
                loc[self.nodes[s.node].output] = (pi, s)
        stage_phase = {s.node: pi for pi, ph in enumerate(st.phases) for s in ph.stages}
        edges = []
        for i in st.nodes:
            n = self.nodes[i]
            for k, t in enumerate(n.inputs):
                p = self.ng.producer.get(t)
                if not t or p is None or p not in gset:
                    continue
                if p in st.inlined:
                    scheme, where = "Local", "registers"
                else:
                    pi, s = loc[t]
                    same = stage_phase.get(i, None)
                    if s.smem and (same == pi or i in st.inlined):
                        scheme, where = "Regional", "shared"
                    else:
                        scheme, where = "Global", "global"
                dep = self._dependency(n, k, t)
                edges.append({"producer": self.nodes[p].op_type, "producer_node": p, "consumer": n.op_type,
                              "consumer_node": i, "tensor": t, "scheme": scheme, "dependency": dep, "where": where})
        return edges

    def _dependency(self, n, k, t) -> str:
        size = self.ng.size(t)
        if n.kind == "reduce":
            return "one-to-many"
        same = same_shape_broadcast(n, k)
        if same is not None:  # from the shapes, at any size (no trace)
            return "one-to-one" if same and size == node_size(self.ng, n) else "one-to-many"
        m = input_index(n, k)
        if m is None or np.any(m == -1):
            return "across blocks"
        if is_identity(m, node_size(self.ng, n)) and size == node_size(self.ng, n):
            return "one-to-one"
        return "one-to-many"

    def _components(self, mem: list[int]) -> int:
        parent = {i: i for i in mem}

        def find(x):
            while parent[x] != x:
                x = parent[x]
            return x

        for i in mem:
            for p in self.preds(self.nodes[i]):
                if p in parent:
                    parent[find(p)] = find(i)
        return len({find(i) for i in mem})


def _strong_components(succ: dict) -> list[list]:
    """Tarjan's strongly connected components of the graph {vertex: successors}, iteratively
    (a deep recursion would overflow on a long chain of launches)."""
    index: dict = {}
    low: dict = {}
    on_stack: set = set()
    stack: list = []
    comps: list[list] = []
    for root in succ:
        if root in index:
            continue
        work = [(root, iter(succ.get(root, ())))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(succ.get(w, ()))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    comps.append(comp)
    return comps
