"""The plan: the single description of a compiled model that runtimes and the estimator read.

It lists kernels, launches in order (each argument a (storage, offset, bytes) view or an int),
storages and the tensor table. ONNX names appear only here, as JSON data.
"""
from __future__ import annotations

import numpy as np

from .kernels.program import bind_storage_operands, fill_operand_table

PLAN_VERSION = 1


class WeightsBlob:
    """The weights storage, as (offset, array) parts, assembled only when someone needs the bytes.

    Why: BERT-base's blob is 440 MB. `dlcc compile` only writes it to weights.bin, which
    `write_to` streams from the arrays; building it in memory first, then copying it to `bytes`,
    cost 0.6 s of a 3 s compile."""

    def __init__(self, size: int, parts: list[tuple[int, np.ndarray]]):
        self.size = size
        self.parts = sorted(parts, key=lambda p: p[0])

    def __len__(self) -> int:
        return self.size

    def tobytes(self) -> bytes:
        buf = bytearray(self.size)
        for off, arr in self.parts:
            buf[off:off + arr.nbytes] = memoryview(arr).cast("B")
        return bytes(buf)

    def write_to(self, f) -> None:
        pos = 0
        for off, arr in self.parts:
            if off > pos:
                f.write(bytes(off - pos))
            f.write(memoryview(arr).cast("B"))
            pos = off + arr.nbytes
        if self.size > pos:
            f.write(bytes(self.size - pos))


def build_plan(state, meta: dict) -> tuple[dict, "WeightsBlob"]:
    """(plan dict, weights blob) from a finished CompileState."""
    g, ctx, mem = state.graph, state.ctx, state.memory
    prog = ctx.program
    res = ctx.resolve

    def view(name):
        b = res(name)
        p = mem.placements[b]
        return {"storage": p.storage, "offset": p.offset, "nbytes": g.tensors[name].nbytes}

    storage_bytes = {"arena": mem.arena_bytes, "weights": mem.weights_bytes, **mem.own_bytes}
    for p in mem.placements.values():
        storage_bytes[p.storage] = max(storage_bytes.get(p.storage, 0), p.offset + p.nbytes)

    launches = []
    for L in prog.launches:
        if L.storage_operands:  # one whole-storage argument per storage; offsets go into the text and table
            k = prog.kernels[L.kernel]
            ot = L.operand_table
            more = [t for entry in ot["slots"] for t in entry] if ot else []
            k.code, used = bind_storage_operands(k.code, [v for kind, v in L.args if kind == "t"], view, more)
            if ot:
                fill_operand_table(g.tensors[ot["table"]].value, ot, used, view,
                                   lambda t: np.dtype(g.tensors[t].dtype).itemsize)
            args = ([{"storage": s, "offset": 0, "nbytes": storage_bytes[s]} for s in used]
                    + [{"int": v} for kind, v in L.args if kind == "i"])
        else:
            args = [{"int": v} if kind == "i" else view(v) for kind, v in L.args]
        launches.append({
            "kernel": L.kernel, "grid": L.grid, "block": L.block, "args": args,
            "node": L.node, "op_type": L.op_type, "category": L.category, "pass": L.pass_name,
            "flops": L.flops, "dram_bytes": L.dram_bytes, "reads": list(L.reads), "writes": list(L.writes),
            **({"grid_sync": True} if L.grid_sync else {}),
            **({"dtype": L.math} if L.math != "float32" else {}),  # the cost model's FLOP dtype
            **({"rprogram": L.rprogram} if L.rprogram else {}),
            **({"gemm": gemm_problem(L)} if gemm_problem(L) else {}),  # the cost model's tiling cost
            **({"attention": list(L.attention)} if L.attention else {}),  # its cycle model's problem
        })
    weights = WeightsBlob(mem.weights_bytes, [
        (p.offset, np.ascontiguousarray(g.tensors[b].value.astype(g.tensors[b].dtype, copy=False)).reshape(-1)
         .view(np.uint8))  # bytes: memoryview cannot take ml_dtypes' bfloat16
        for b, p in mem.placements.items() if p.storage == "weights"])
    def io(names):
        # (model_dtype: a type the buffer holds in a wider dtype, held_types.py; converted on the host)
        # (an output a pass renamed, such as a constant's copy, is held under the model's name)
        held = {n: g.held.get(n) or g.held.get(g.output_name(n)) for n in names}
        return [{"name": g.output_name(n), "shape": list(g.tensors[n].shape), "dtype": g.tensors[n].dtype,
                 **({"model_dtype": held[n]} if held[n] else {})} for n in names]

    tensors = {}
    for name, t in g.tensors.items():
        b = res(name)
        if b in mem.placements and t.shape is not None:
            p = mem.placements[b]
            tensors[name] = {"shape": list(t.shape), "dtype": t.dtype, "storage": p.storage, "offset": p.offset,
                             "nbytes": t.nbytes, "view_of": b if b != name else None}
    kernels = [{"name": k.name, "block": k.block, "smem_bytes": k.smem_bytes, "kind": k.kind, "tiling": k.tiling,
                "pass": k.pass_name, "math": k.math, **({"dynamic_smem_bytes": k.dynamic_smem} if k.dynamic_smem else {})}
               for k in prog.kernels.values()]
    weight_bytes = sum(g.tensors[b].nbytes for b, p in mem.placements.items() if p.storage == "weights")
    io_bytes = sum(g.tensors[n].nbytes for n in g.inputs) + sum(g.tensors[n].nbytes for n in g.outputs)
    plan = {
        "version": PLAN_VERSION,
        "meta": meta,
        "inputs": io(g.inputs),
        "outputs": io(g.outputs),
        "storages": {"arena": mem.arena_bytes, "weights": mem.weights_bytes,
                     **{k: v for k, v in mem.own_bytes.items() if v}},
        "kernels": kernels,
        "launches": launches,
        "tensors": tensors,
        "stats": {
            "onnx_nodes": g.source_node_count,
            "nodes_after_folding": len(g.nodes),
            "op_histogram": g.op_histogram(),
            "kernels": len(kernels),
            "launches": len(launches),
            "memory_bound_launches": sum(1 for L in prog.launches if L.category != "compute"),
            "dram_bytes": sum(L.dram_bytes for L in prog.launches),
            "flops": sum(L.flops for L in prog.launches),
            "lower_bound_bytes": weight_bytes + io_bytes,
            "arena_bytes": mem.arena_bytes,
            "naive_bytes": mem.naive_bytes,
            "weights_bytes": weight_bytes,
            "inplace_pairs": mem.inplace_pairs,
        },
    }
    report = getattr(ctx, "stitch_report", None)
    if report is not None:
        plan["stitch"] = report
    rprog = getattr(ctx, "rammer_report", None)
    if rprog is not None:
        plan["rprogram"] = rprog
    runs = getattr(ctx, "rammer_runs", None)
    if runs is not None:
        plan["rammer_runs"] = runs
    return plan, weights


def kernel_sources(state) -> list[str]:
    return [k.code for k in state.ctx.program.kernels.values()]


def gemm_problem(L) -> dict | None:
    """A GEMM launch's problem: its GemmExpr's, or the one AStitch kept on a fused rOperator."""
    return _gemm_shape(L.expr) or L.gemm_problem


def _gemm_shape(expr) -> dict | None:
    """A GEMM launch's problem (its GemmExpr): {"shape": [batch, M, N, K], "a_k_contiguous",
    "b_n_contiguous"}, for the cost model's tiling cost and for `--tune`'s tiling measurements
    (dlcc/tuning.py); None for other launches."""
    spec = getattr(expr, "spec", None)
    if spec is None or not all(hasattr(spec, a) for a in ("batch", "M", "N", "K")):
        return None
    return {"shape": [int(spec.batch), int(spec.M), int(spec.N), int(spec.K)],
            "a_k_contiguous": bool(spec.a_k_contiguous), "b_n_contiguous": bool(spec.b_n_contiguous)}
