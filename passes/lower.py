"""The baseline lowering: every op through its registry entry, one kernel (or a few) per op."""
from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..kernels import splitk
from ..kernels.gemm import ALL_TILINGS, all_tiling_names
from ..ops import registry
from ..ops.context import LowerCtx
from ..ops.fold_norm import fold_layernorms
from ..ops.layout import identity_copy
from ..ops.narrow import HALF_DTYPES, narrow_activations, narrow_gemm_weights
from ..ops.random import advance_state
from . import CompileState, register_pass


def lower_graph(graph, device, pass_name: str = "baseline", gemm_tiling: str = "auto",
                rnn_input: str = "batched", precision: str = "fp32", fp32_ops=(), half_activations: bool = True,
                gemm_tilings: dict | None = None, split_k: bool = True, unjoinable_us: float = 0.0,
                transpose_weights: bool = True, fold_layernorm: bool = True) -> LowerCtx:
    """Lower every node of `graph` for `device` into a LowerCtx (kernels and launches).
    `unjoinable_us`: what a GEMM tiling that no persistent kernel can run (a DEEP one, in dynamic
    shared memory) costs beyond its own time, where a later pass joins launches (kernels/gemm_mma.py
    choose_mma_tiling); 0 where nothing is joined."""
    fp32_ops = set(fp32_ops) | graph.float32_nodes
    narrowed = narrow_gemm_weights(graph, precision, fp32_ops) if precision in HALF_DTYPES else []
    ctx = LowerCtx(graph, device, pass_name=pass_name)
    ctx.narrowed = narrowed
    if precision in HALF_DTYPES and half_activations:
        ctx.half_activations, ctx.float32_activation_ops, ctx.float32_range = narrow_activations(graph, precision, fp32_ops)
    ctx.fp32_ops = fp32_ops
    ctx.folded_norms = fold_layernorms(graph, precision, fp32_ops) if fold_layernorm else []
    ctx.rnn_input = rnn_input
    ctx.precision = precision
    ctx.gemm_tiling = None if gemm_tiling == "auto" else next(t for t in ALL_TILINGS if t.name == gemm_tiling)
    ctx.gemm_tilings = dict(gemm_tilings or {})
    ctx.split_k = split_k
    ctx.transpose_weights = transpose_weights
    ctx.unjoinable_us = unjoinable_us
    for node in graph.nodes:
        entry = registry.lookup(node.op_type, graph.opset, node.domain)
        assert entry is not None, node.op_type  # unsupported ops are rejected before passes run
        if _writes_nothing(graph, node) and entry.category != registry.ALIAS:
            ctx.skipped_empty.append(node.name)
            continue
        ctx.node = node
        entry.lower(ctx, node)
    ctx.node = None
    _materialize_outputs(ctx)
    advance_state(ctx)
    return ctx


def _writes_nothing(graph, node) -> bool:
    """Every output of `node` is empty (a zero-sized dim, as onnxruntime allows): it gets no launch
    at all. Why: a kernel over no elements would at best idle, and the shape arithmetic of several
    templates (a GEMM's tiles per row, a reduction's rows) divides by a zero dim. Readers of an
    empty tensor read nothing, so nothing needs to write it."""
    outs = [graph.tensors[o] for o in node.outputs if o]
    return bool(outs) and all(t.shape is not None and t.size == 0 for t in outs)


def _materialize_outputs(ctx: LowerCtx) -> None:
    """Each graph output gets bytes of its own.

    Where an output is a graph input, a constant, or a view that shares its bytes with an input, a
    constant or another output, a copy into a fresh tensor is added at the end, and the graph
    output is renamed to that tensor (`output_alias` keeps the name the user sees). The original
    tensor is left as it was, so the launches that read it still read it. (Turning the original
    itself into the copy's destination made a kernel that reads it, lowered before the copy was
    appended, read bytes not yet written: a constant output that is also a GEMM operand.)"""
    g = ctx.graph
    claimed: set[str] = set()
    for k, out in enumerate(list(g.outputs)):
        t = g.tensors[out]
        base = ctx.resolve(out)
        shared = (out in g.inputs or t.value is not None or base in g.inputs or g.tensors[base].value is not None
                  or base in claimed or (base != out and base in g.outputs))
        if shared:
            copy = ctx.temp(t.shape, t.dtype)
            identity_copy(ctx, copy, out)
            g.outputs[k] = copy
            g.output_alias[copy] = out
            base = copy
        claimed.add(base)


class LowerOptions(BaseModel):
    """`gemm_tiling`: "auto" picks each GEMM's tiling by wave-quantized cost on the target device;
    a tiling name (e.g. 64x64x16_4x4) forces that one everywhere (a pipeline to rank against).
    Both are SIMT tilings: at precision tf32 every GEMM takes a tensor-core tiling instead
    (kernels/gemm_mma.py choose_mma_tiling), and a forced one is not used.

    `rnn_input`: "batched" computes an LSTM's input projection for all steps in one GEMM (best
    when every launch is a kernel of its own); "per-step" folds it into each step's GEMM, so that
    layer l's step t waits only for layer l-1's step t (the layers x time wavefront rammer
    schedules; ops/rnn.py); "auto" picks per-step for one-direction LSTMs on a GPU device, where
    rammer joins the steps into one persistent kernel, and batched elsewhere (on PoCL, per-step
    steps run as separate launches and the batched projection is faster).

    `gemm_tilings`: {"BATCHxMxNxK": tiling name} for GEMM problems whose tiling was measured
    (`dlcc compile --tune` writes it, dlcc/tuning.py); a GEMM of that problem takes that tiling
    where it is of its precision's family (SIMT at fp32, tensor-core otherwise), over the cost
    model's pick (a forced `gemm_tiling` still wins at fp32)."""

    model_config = ConfigDict(extra="forbid")
    gemm_tiling: Literal[("auto",) + tuple(t.name for t in ALL_TILINGS)] = Field(
        "auto", description="auto: each GEMM's SIMT tiling by its cost on the device; a tiling name (e.g. "
        "64x64x16_4x4) forces that one at fp32 (tf32/fp16/bf16 take tensor-core tilings)")
    rnn_input: Literal["batched", "per-step", "auto"] = Field(
        "batched", description="an LSTM's input projection: batched (one GEMM for all steps), per-step (in each "
        "step's GEMM: the layers x time wavefront rammer schedules), auto (per-step for one-direction LSTMs on a GPU)")
    gemm_tilings: dict[str, str] = Field(default_factory=dict, description="{BATCHxMxNxK: tiling} measured by "
                                         "`dlcc compile --tune`, over the cost model's pick")
    split_k: bool = Field(True, description="on GPU devices, GEMM tilings split along K where the cost model says it "
                          "pays: each k chunk its own rTask, the tile's last one adding the partial sums in k order "
                          "(kernels/splitk.py); false: every GEMM walks all of K per tile")

    transpose_weights: bool = Field(True, description="at the tensor-core precisions, a GEMM/Conv weight whose rows are "
                                    "no whole number of 16-byte chunks (GPT-2's LM head, [768, 50257]) is stored "
                                    "transposed where that makes them whole, so that cp.async copies it "
                                    "(ops/matmul.py transposed_weight); false: as the model stores it")

    fold_layernorm: bool = Field(True, description="at fp32, fp16 and bf16, a LayerNormalization (or an RMSNorm "
                                 "as torch exports LLaMA's and T5's) whose output only "
                                 "GEMMs read (as A, against constant weights) is computed inside them: they read its "
                                 "input, its scale is folded into their weights, and their store normalises with each "
                                 "row's mean and variance, summed as the k loop streams the rows (kernels/row_norm.py); "
                                 "false: every LayerNorm is a kernel of its own")

    @field_validator("gemm_tilings")
    @classmethod
    def _known_tilings(cls, v: dict) -> dict:
        names = set(all_tiling_names())
        bad = [f"{k}: {t}" for k, t in v.items() if t not in names or not re.fullmatch(r"\d+x\d+x\d+x\d+", k)]
        if bad:
            raise ValueError(f"each entry is BATCHxMxNxK: TILING with a known tiling; not {', '.join(bad)}")
        return v


def _unjoinable_us(state: CompileState) -> float:
    """What a GEMM that cannot be an rTask costs a pipeline with `rammer` on a GPU beyond its own
    time: the separate launch it keeps, priced as rammer prices one (launch_floor_us, plus the
    device's gap between kernels). Why: on BERT-base at bf16 the DEEP tilings won each GEMM by
    1-2 µs alone, and taking all of them left `full` with no persistent kernel at all."""
    from .rammer import joins_dynamic_smem, launch_floor_us

    if not state.joins or getattr(state.device, "kind", "gpu") == "cpu" or joins_dynamic_smem(state.device):
        return 0.0  # (a spec whose persistent kernels take dynamic shared memory runs DEEP rTasks too)

    return launch_floor_us(state.device, state.graphs) + state.device.kernel_gap_us


@register_pass("lower", LowerOptions, before=("memplan",))
def lower(state: CompileState, opts) -> None:
    """Lower every node with its registry entry (baseline: one kernel per op)."""
    state.ctx = lower_graph(state.graph, state.device, gemm_tiling=opts.gemm_tiling, rnn_input=opts.rnn_input,
                            gemm_tilings=opts.gemm_tilings, split_k=opts.split_k,
                            precision=state.precision, fp32_ops=state.fp32_ops,
                            half_activations=state.half_activations, unjoinable_us=_unjoinable_us(state),
                            transpose_weights=opts.transpose_weights, fold_layernorm=opts.fold_layernorm)
    n = len(state.ctx.program.launches)
    state.log.append(f"lower: {len(state.ctx.program.kernels)} kernel(s), {n} launch(es)")
    split = splitk.count(state.ctx.program)
    if split:
        state.log.append(f"lower: {sum(split.values())} GEMM launch(es) split along K: "
                         + ", ".join(f"{n} x{c}" for n, c in sorted(split.items())))
    if state.ctx.deep_declined:
        problems = sorted(set(state.ctx.deep_declined))
        state.log.append(f"lower: {len(state.ctx.deep_declined)} GEMM(s) take a tiling a persistent kernel can run "
                         f"over a DEEP one that is faster alone by less than the launch it would keep "
                         f"({state.ctx.unjoinable_us:.1f} µs): " + ", ".join(problems[:6])
                         + (" ..." if len(problems) > 6 else ""))
    if state.ctx.skipped_empty:
        state.log.append(f"lower: {len(state.ctx.skipped_empty)} node(s) with only empty outputs get no launch: "
                         + ", ".join(state.ctx.skipped_empty[:8]) + (" ..." if len(state.ctx.skipped_empty) > 8 else ""))
    if state.precision != "fp32":
        state.ctx.kept_float32 = kept = state.ctx.float32_compute()
        if kept:
            state.log.append(f"lower: computed in float32 at {state.precision}: "
                             + ", ".join(f"{op} x{n}" for op, n in sorted(kept.items())))
    if state.ctx.narrowed:
        mb = sum(state.graph.tensors[w].nbytes for w in state.ctx.narrowed) / 1e6
        state.log.append(f"lower: {len(state.ctx.narrowed)} GEMM/Conv weight(s) stored as "
                         f"{HALF_DTYPES[state.precision]} ({mb:.1f} MB of float32 read as {mb / 2:.1f} MB)")
    if state.ctx.folded_norms:
        names = state.ctx.folded_norms
        state.log.append(f"lower: {len(names)} LayerNorm/RMSNorm(s) computed inside the GEMM(s) that read them "
                         "(kernels/row_norm.py): " + ", ".join(names[:6]) + (" ..." if len(names) > 6 else ""))
    if state.ctx.transposed:
        state.log.append(f"lower: {len(state.ctx.transposed)} GEMM/Conv weight(s) stored transposed, so that "
                         "cp.async copies them in whole 16-byte chunks (and K-major, for wgmma): " + ", ".join(state.ctx.transposed[:6])
                         + (" ..." if len(state.ctx.transposed) > 6 else ""))
    acts = state.ctx.half_activations
    if state.precision in HALF_DTYPES and state.half_activations:
        floats = [t for t in state.graph.tensors.values() if t.value is None and t.dtype in ("float32", "float16", "bfloat16")]
        state.log.append(f"lower: {len(acts)} of {len(floats)} float activation(s) stored as "
                         f"{HALF_DTYPES[state.precision]} (the rest: graph inputs and outputs, statistics, "
                         "and tensors an op without a converting kernel reads or writes)")
        if state.ctx.float32_activation_ops:
            state.log.append("lower: float32 activations kept for ops without a half-precision kernel: "
                             + ", ".join(f"{op} x{n}" for op, n in state.ctx.float32_activation_ops.items()))
        if state.ctx.float32_range:
            kept = state.ctx.float32_range
            state.log.append(f"lower: {len(kept)} float activation(s) kept float32: they may hold a value beyond "
                             f"{HALF_DTYPES[state.precision]}'s range, from a wide integer or a constant beyond it ("
                             + ", ".join(kept[:4]) + (" ..." if len(kept) > 4 else "") + ")")
