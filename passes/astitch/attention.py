"""Attention as one rOperator: Q·Kᵀ, its elementwise score chain, Softmax and P·V fused into a
flash-attention kernel (kernels/attention.py), so the scores never reach global memory.

Why: every transformer layer lowers attention to three launches, and in a persistent kernel to
three waves: the batched Q·Kᵀ GEMM (with the scale and mask AStitch fuses into its store), a
Softmax over the keys, and the batched P·V GEMM. BERT-base's `full` plan is 110 waves, and its
grid barriers are half its modelled time at bf16; these three waves per layer are 36 of them, and
the scores go to memory and back twice. Fused, they are one wave: each rTask takes a block of
query rows of one head through every key block with an online softmax (FlashAttention's
recurrence) and writes only the output. torch.compile does the same through
scaled_dot_product_attention; TensorRT through its MHA fusion.

What is matched, on the stitcher's nodes (nodes.py), after the epilogue and inlining plans:

  g1: a GEMM node, batch x M x N over k = D, storing at the identity flat index (MatMul's
      `bt * M * N + m * N + n`); its planned epilogue (the scale, the mask add: planner
      plan_epilogues) becomes the score function;
  a Softmax over the last axis of that epilogue's value, N long, rows = batch x M, not log;
  map nodes between the Softmax and g2 that are computed in g2's loads (planner gemm_inline),
  element for element, and keep the value (a Cast or an Identity: VALUE_PRESERVING);
  g2: a GEMM node reading that value as its A operand, plainly (raw_a: the tensor read at
      `aoff + m * K + k`, whole, not broadcast), with M, batch and output batch dims equal to
      g1's and K = N; its planned epilogue, if any, is applied to the output.

Every intermediate (g1's output, the epilogue's values, the Softmax's, the casts') must be read by
nothing else and be no graph output, since nothing of them is written any more. Q, K and V keep
whatever AStitch computes in g1's and g2's loads (the head transposes), so no transpose returns.

The match is structural, not by op names, so exporters that scale Q·Kᵀ by a Mul or a Div, add a
mask or not, or cast the probabilities around the Softmax (dynamo's float32 casts) all fuse.
Head dims up to MAX_HEAD_DIM (what kernels/attention.py's shared memory holds); larger ones keep
the three launches.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...kernels.reduce import SoftmaxExpr
from .indexmap import access_kinds, reads_identity
from .nodes import FLOATS


MAX_HEAD_DIM = 128
#: The maps that may stand between the Softmax and P·V: they keep each probability's value (up to a
#: rounding, which the kernel makes anyway as the mma takes P). The kernel multiplies V by the
#: unnormalised exp(s - max) and divides by the row's sum at the end, so it computes f(P) only for
#: an f that commutes with that scaling; an Add of a constant (fuzz graph 760038) does not, and
#: neither do most maps: they keep the three launches.
VALUE_PRESERVING = ("Cast", "CastLike", "Identity")


@dataclass
class AttentionFusion:
    qk: int  # g1: Q·Kᵀ
    pv: int  # g2: P·V
    score: list[int]  # g1's epilogue nodes: the score function, in order
    softmax: list[int]  # the Softmax's decomposed nodes
    between: list[int]  # map nodes between the Softmax and g2's A operand (computed in g2's loads)
    epilogue: list[int] = field(default_factory=list)  # g2's epilogue nodes
    stored: list[str] = field(default_factory=list)  # tensors the kernel writes

    @property
    def members(self) -> list[int]:
        return [self.qk, *self.score, *self.softmax, *self.between, self.pv, *self.epilogue]


def plan_attention(pl, by_cost: bool = True) -> list[AttentionFusion]:
    """Find every fusable attention (module docstring) in planner `pl`, and take its nodes out of
    the other plans: g1's and g2's GEMM fusions, and the Softmax's nodes from stitching (they are
    marked absorbed). Runs after plan_epilogues and plan_gemm_inline, before the groups.
    `by_cost`: keep only those the cost model prices below their three kernels (fused_pays)."""
    ng = pl.ng
    found: list[AttentionFusion] = []
    taken: set[int] = set()
    for sm in ng.nodes:
        e = sm.launch.expr if sm.launch is not None else None
        if not isinstance(e, SoftmaxExpr) or sm.kind != "reduce" or sm.id in taken:
            continue
        af = _match(pl, sm, e)
        if af is None or taken & set(af.members) or (by_cost and not fused_pays(pl, af, sm)):
            continue
        found.append(af)
        taken |= set(af.members)
        for gid in (af.qk, af.pv):
            pl.gemms.pop(gid, None)
        for nid in af.members:
            if nid not in pl.gemm_inline:
                pl.absorbed[nid] = af.qk
    return found


def attention_math(pl, af: AttentionFusion) -> str:
    """What the fused kernel computes at: the two GEMMs' tensor-core precision where both run on
    tensor cores at the same one (a tf32/fp16/bf16 plan on a GPU: kernels/attention_mma.py, the
    products' operands rounded as the unfused GEMMs round them), else float32 (the SIMT template,
    kernels/attention.py)."""
    from ...kernels.attention_mma import ATTENTION_MATHS

    m1, m2 = (getattr(pl.ng.nodes[c].gemm.tiling, "math", "float32") for c in (af.qk, af.pv))
    return m1 if m1 == m2 and m1 in ATTENTION_MATHS else "float32"


def attention_problem(pl, af: AttentionFusion) -> list:
    """[batch, M, N, D, Dv, math]: the fused launch's problem, as the plan and the cost model
    know it (kernels/attention_mma.py fused_attention_cost)."""
    s1, s2 = pl.ng.nodes[af.qk].gemm.spec, pl.ng.nodes[af.pv].gemm.spec
    return [s1.batch, s1.M, s1.N, s1.K, s2.N, attention_math(pl, af)]


def fused_pays(pl, af: AttentionFusion, sm) -> bool:
    """Whether the fused kernel is modelled faster than what it replaces, on a GPU calibrated for
    dlcc's kernels (DeviceSpec.gemm_cycle_us): its cycle model (kernels/attention.py
    attention_cost) against Q·Kᵀ's and P·V's tiling models, the Softmax at the roofline and the
    two kernel boundaries it removes (a grid barrier or a kernel's fixed cost, whichever is more).
    The SIMT flash kernel (an fp32 plan) wins where the three are small (BERT-base's 128 tokens);
    in a tf32/fp16/bf16 plan the tensor-core one (kernels/attention_mma.py) is priced against the
    tensor-core GEMMs. Elsewhere (PoCL, an uncalibrated GPU) it is fused: one kernel instead of three, and no
    scores in memory."""
    from ...estimate.costmodel import attention_model_us, gemm_model_us, kernel_time

    dev = pl.dev
    g1, g2 = pl.ng.nodes[af.qk], pl.ng.nodes[af.pv]
    s1, s2 = g1.gemm.spec, g2.gemm.spec
    fused = attention_model_us(attention_problem(pl, af), dev)
    a = gemm_model_us(g1.gemm.tiling.name, [s1.batch, s1.M, s1.N, s1.K], dev)
    b = gemm_model_us(g2.gemm.tiling.name, [s2.batch, s2.M, s2.N, s2.K], dev)
    if fused is None or a is None or b is None:
        return True
    L = sm.launch
    soft = kernel_time(L.flops, L.dram_bytes, "float32", dev, blocks=L.grid, threads=L.block).us - dev.kernel_fixed_us
    boundary = max(dev.kernel_fixed_us, dev.grid_barrier_us)
    return fused < a + b + soft + 2 * boundary


def _score_chain(pl, last: int):
    """(g1, its score nodes) for the Softmax input made by node `last`: g1 itself with no score
    nodes; g1's planned epilogue where it ends at `last`; or that epilogue (if any) followed by
    the elementwise map nodes up to `last`, each reading the one before at its own flat index.
    (An epilogue absorbs only what reads tensors written before the GEMM; the first layer of a
    torch export computes its mask after the Q·Kᵀ GEMM, so there the mask add stayed out of the
    epilogue that took the scale.) The maps' other inputs (the mask) may come from anywhere that
    does not depend on the chain: the fused launch is ordered after their producers. None where
    the nodes are not such a chain."""
    ng = pl.ng
    chain, cur = [], ng.nodes[last]
    while cur.kind == "map":
        fus = pl.gemms.get(pl.absorbed.get(cur.id, -1))
        if fus is not None and fus.epilogue and fus.epilogue[-1] == cur.id:  # the GEMM's epilogue ends here
            return ng.nodes[fus.node], fus.epilogue + chain[::-1]
        if (cur.id in pl.kept or cur.id in pl.absorbed or cur.id in pl.gemm_inline or len(chain) >= pl.opts.max_ops
                or ng.tensor(cur.output).dtype not in FLOATS):
            return None
        chain.append(cur.id)
        prev = [(k, t) for k, t in enumerate(cur.inputs) if t and ng.producer.get(t) is not None
                and ng.nodes[ng.producer[t]].kind in ("gemm", "map")
                and ng.size(t) == ng.size(cur.output)
                and access_kinds(cur).get(k) in (None, "bcast") and reads_identity(cur, k, ng.size(t))]
        if len(prev) != 1:
            return None
        cur = ng.nodes[ng.producer[prev[0][1]]]
    if cur.kind != "gemm":
        return None
    return cur, chain[::-1]


def _match(pl, sm, e: SoftmaxExpr) -> AttentionFusion | None:
    ng = pl.ng
    if e.log or e.inner != 1 or sm.id in pl.kept:
        return None
    softmax = [n.id for n in ng.nodes if n.order == sm.order]
    x, out = ng.res(e.x), ng.res(e.out)
    # back from the Softmax's input to g1, through g1's planned epilogue and any maps after it
    p = ng.producer.get(x)
    found = _score_chain(pl, p) if p is not None else None
    if found is None:
        return None
    g1, score = found
    s1 = g1.gemm.spec
    if (g1.id in pl.kept or s1.store_index is None or s1.store_index("m", "n") != f"bt * {s1.M * s1.N} + m * {s1.N} + n"
            or e.length != s1.N or e.rows != s1.batch * s1.M or ng.size(g1.output) != s1.batch * s1.M * s1.N):
        return None
    # forward from the Softmax's output to g2's A operand, through maps computed in g2's loads
    between, t = [], out
    while True:
        cons = pl.consumers(t)
        if len(cons) != 1 or pl.is_output(t):
            return None
        c = ng.nodes[cons[0]]
        if c.kind == "gemm":
            g2 = c
            break
        if (c.kind != "map" or c.op_type not in VALUE_PRESERVING or c.id not in pl.gemm_inline
                or len([i for i in c.inputs if i]) != 1 or ng.tensor(c.output).dtype not in FLOATS
                or ng.size(c.output) != ng.size(t) or not reads_identity(c, c.inputs.index(t), ng.size(t))):
            return None
        between.append(c.id)
        t = c.output
    s2 = g2.gemm.spec
    a_tensor = ng.res(g2.gemm.args[0])
    if (g2.id in pl.kept or a_tensor != t or s2.raw_a is None or not s2.a_k_contiguous or s2.store_index is None
            or (s2.batch, s2.M, s2.K) != (s1.batch, s1.M, s1.N) or ng.size(t) != s2.batch * s2.M * s2.K
            or tuple(ng.tensor(g1.output).shape[:-2]) != tuple(ng.tensor(g2.output).shape[:-2])
            or max(s1.K, s2.N) > MAX_HEAD_DIM):
        return None
    # every intermediate is read only inside the fusion, and none is a graph output
    inner = [g1.id, *score, *softmax, *between]
    members = set(inner) | {g2.id}
    for nid in inner:
        for w in ng.nodes[nid].writes:
            if pl.is_output(w) or any(c not in members for c in pl.consumers(w)):
                return None
    fus2 = pl.gemms.get(g2.id)
    epilogue = list(fus2.epilogue) if fus2 is not None else []
    stored = list(fus2.stored) if fus2 is not None and fus2.stored else [g2.output]
    return AttentionFusion(g1.id, g2.id, score, softmax, between, epilogue, stored)
