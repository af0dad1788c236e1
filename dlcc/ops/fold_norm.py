"""Folding a LayerNormalization, or an RMSNorm, into the GEMMs that read it (`lower`'s option
`fold_layernorm`).

The graph rewrite behind kernels/row_norm.py: a LayerNorm over the last axis whose output only
GEMMs read, as their A operand (directly or through views that keep the last axis), against
constant weights, is removed. Each of those GEMMs then reads the LayerNorm's input, multiplies it
by W' = diag(γ) W, and normalises its accumulators in the store with constants c = Σ_k W' and
b' = β · W made here. What the template does with them, and why it is exact up to float32
rounding, is in kernels/row_norm.py. An RMSNorm (x / sqrt(mean(x²) + eps) · γ: LLaMA, T5, as
exporters write it in six or seven nodes, _rms_norm) folds the same way with no centring: the
GEMM takes diag(γ) W and its store scales each row by its rstd.

Where it applies (anything else keeps its LayerNorm, so the fold never changes what runs):
  - precision fp32, fp16 or bf16 (the SIMT and cp.async templates compute the statistics; at
    tf32 the mma would round x itself, whose error grows with the row's mean, where the
    separate LayerNorm's output is rounded about zero);
  - at fp16/bf16 the input x is stored in the half type, so the GEMM reads exactly the values
    the LayerNorm would have;
  - scale and bias are constants of the normalised length (or one value); neither the
    LayerNorm nor any GEMM is kept float32 (`fp32_ops`); the output is no graph output;
  - every reader is a view that keeps the last axis, or a MatMul with a 2-D constant B, or a
    Gemm with transA = 0 and a constant B, reading it as A only.
"""
from __future__ import annotations

import numpy as np

from ..ir import Graph, Tensor
from .narrow import HALF_DTYPES, kept_float32
from .registry import ALIAS, lookup

#: The node attribute a folded GEMM carries for ops/matmul.py: {"c", "b", "eps"} (c "" for an RMSNorm).
ATTR = "_dlcc_row_norm"


def _consumers(graph: Graph) -> dict[str, list]:
    out: dict[str, list] = {}
    for n in graph.nodes:
        for i in n.inputs:
            if i:
                out.setdefault(i, []).append(n)
    return out


def _vector(t: Tensor | None, length: int) -> np.ndarray | None:
    """A LayerNorm scale or bias as `length` float64 values, where it is a constant of that many
    values (leading ones allowed) or of one."""
    if t is None or t.value is None:
        return None
    v = np.asarray(t.value, dtype=np.float64)
    if v.size == 1:
        return np.full(length, float(v.reshape(())))
    if v.size == length and v.shape[-1] == length:
        return v.reshape(length)
    return None


def _readers(graph: Graph, users: dict, y: str, length: int, fp32_ops) -> list | None:
    """The GEMM nodes that read `y` as their A operand, through views that keep the last axis
    (`length`), or None where anything else reads it (or a view of it)."""
    gemms, todo = [], [y]
    while todo:
        t = todo.pop()
        if t in graph.outputs:
            return None
        for n in users.get(t, []):
            entry = lookup(n.op_type, graph.opset, n.domain)
            if kept_float32(n, fp32_ops) or n.inputs.count(t) != 1:
                return None
            if entry is not None and entry.category == ALIAS and n.inputs[0] == t and len(n.outputs) == 1:
                shape = graph.tensors[n.outputs[0]].shape
                if not shape or shape[-1] != length:
                    return None
                todo.append(n.outputs[0])
                continue
            if n.inputs[0] != t or len(n.inputs) < 2 or not graph.is_const(n.inputs[1]):
                return None
            w = graph.tensors[n.inputs[1]]
            if n.op_type == "MatMul" and len(w.shape) == 2 and w.shape[0] == length and len(graph.tensors[t].shape) >= 2:
                gemms.append(n)
            elif (n.op_type == "Gemm" and not n.attrs.get("transA", 0) and len(w.shape) == 2
                  and w.shape[1 if n.attrs.get("transB", 0) else 0] == length):
                gemms.append(n)
            else:
                return None
    return gemms


def _float_weight(graph: Graph, name: str, half: str | None) -> np.ndarray:
    """The values of GEMM weight `name` as stored (exact in float64): the float32 original where
    ops/narrow.py replaced it by a half-type copy."""
    prefix = f"%{half}:" if half else None
    if prefix and name.startswith(prefix) and name[len(prefix):] in graph.tensors:
        name = name[len(prefix):]
    return np.asarray(graph.tensors[name].value)


def _scaled_weight(w: np.ndarray, gamma: np.ndarray, beta: np.ndarray, k_axis: int, dtype: np.dtype):
    """W' = diag(γ) W along the reduction axis `k_axis`, rounded once to `dtype`; c = the sums of
    W' (in float64) and b' = the sums of diag(β) W, one per output column. Done a slice of
    columns at a time, each in float64 exactly as the whole would be (every sum runs along
    k_axis, within a slice), so that a GPT-2 LM head (38.6M weights) does not make five
    float64 copies of itself: that was 40% of GPT-2's compile."""
    n = w.shape[1 - k_axis]
    stored, c, b = np.empty(w.shape, dtype), np.empty(n), np.empty(n)
    g = gamma[None, :] if k_axis else gamma[:, None]
    bb = beta[None, :] if k_axis else beta[:, None]
    step = max(1, (1 << 18) // max(1, w.shape[k_axis]))
    for lo in range(0, n, step):
        cols = (slice(lo, lo + step), slice(None)) if k_axis else (slice(None), slice(lo, lo + step))
        part = np.asarray(w[cols], dtype=np.float64)
        out = (part * g).astype(dtype)
        stored[cols] = out
        c[lo:lo + step] = out.astype(np.float64).sum(axis=k_axis)
        b[lo:lo + step] = (part * bb).sum(axis=k_axis)
    return stored, c, b


def _const_scalar(graph: Graph, name: str) -> float | None:
    t = graph.tensors.get(name)
    if t is None or t.value is None or t.value.size != 1:
        return None
    return float(np.asarray(t.value).reshape(()))


def _rms_norm(graph: Graph, users: dict, by_out: dict, out_node, fp32_ops) -> tuple | None:
    """The RMSNorm that ends in `out_node`, as torch exports LLaMA's and T5's (after simplify):
    Pow(x, 2) (or Mul(x, x)) -> ReduceMean(last axis, keepdims) -> Add(eps) -> Sqrt -> Div(x, ·)
    (or Mul by its Reciprocal, or by Div(1, ·)), then optionally Mul by a constant γ. Returns
    (x, γ or None, eps, the nodes it removes), or None where it is not that, or where an intermediate has another reader.
    `by_out`: each tensor's producing node."""

    def only(t: str, reader) -> bool:
        return t not in graph.outputs and [id(n) for n in users.get(t, [])] == [id(reader)]

    def producer(t: str, op: str):
        n = by_out.get(t)
        return n if n is not None and n.op_type == op and not kept_float32(n, fp32_ops) else None

    gamma, n = None, out_node
    consts = [i for i in n.inputs if i and graph.is_const(i)]
    if n.op_type == "Mul" and len(n.inputs) == 2 and len(consts) == 1:  # the scale: Mul(γ, h) or Mul(h, γ)
        h = n.inputs[1 - n.inputs.index(consts[0])]
        gamma, scale_node = consts[0], n
        n = by_out.get(h)
        if n is None or not only(h, scale_node):
            return None
    removed = [out_node] if gamma else []

    def reciprocal(t: str) -> str | None:  # s where t = Reciprocal(s) or Div(1, s)
        r = by_out.get(t)
        if r is None or kept_float32(r, fp32_ops):
            return None
        if r.op_type == "Reciprocal":
            return r.inputs[0]
        if r.op_type == "Div" and len(r.inputs) == 2 and _const_scalar(graph, r.inputs[0]) == 1.0:
            return r.inputs[1]
        return None

    if n.op_type == "Div" and len(n.inputs) == 2 and not graph.is_const(n.inputs[0]):
        (x, s), reader = n.inputs, n
    elif n.op_type == "Mul" and len(n.inputs) == 2 and sum(reciprocal(i) is not None for i in n.inputs) == 1:
        r = next(i for i in n.inputs if reciprocal(i) is not None)
        x, s, reader = n.inputs[1 - n.inputs.index(r)], reciprocal(r), by_out[r]
        if not only(r, n):
            return None
        removed.append(reader)
    else:
        return None
    removed.append(n)
    sq = producer(s, "Sqrt")
    if sq is None or not only(s, reader):
        return None
    add = producer(sq.inputs[0], "Add")
    if add is None or not only(sq.inputs[0], sq):
        return None
    eps_in = [i for i in add.inputs if _const_scalar(graph, i) is not None]
    if len(eps_in) != 1:
        return None
    mean_t = add.inputs[1 - add.inputs.index(eps_in[0])]
    rm = producer(mean_t, "ReduceMean")
    if rm is None or not only(mean_t, add) or int(rm.attrs.get("keepdims", 1)) != 1:
        return None
    rank = len(graph.tensors[x].shape or ())
    axes = rm.attrs.get("axes")
    if axes is None and len(rm.inputs) > 1 and graph.is_const(rm.inputs[1]):
        axes = [int(a) for a in np.asarray(graph.tensors[rm.inputs[1]].value).reshape(-1)]
    if axes is None or [a % rank for a in axes] != [rank - 1]:
        return None
    pw = producer(rm.inputs[0], "Pow") or producer(rm.inputs[0], "Mul")  # x², as Pow(x, 2) or Mul(x, x)
    square = pw is not None and (pw.inputs == [x, x] if pw.op_type == "Mul"
                                 else pw.inputs[0] == x and _const_scalar(graph, pw.inputs[1]) == 2.0)
    if not square or not only(rm.inputs[0], rm):
        return None
    return x, gamma, _const_scalar(graph, eps_in[0]), removed + [sq, add, rm, pw]


def fold_layernorms(graph: Graph, precision: str, fp32_ops=frozenset()) -> list[str]:
    """Fold every LayerNorm and RMSNorm that qualifies (module docstring) into its GEMMs;
    returns the names of the nodes folded (a LayerNormalization, or an RMSNorm's last node).
    Runs after ops/narrow.py, so that activations' storage types are known and the new weights
    are made in the half type directly."""
    if precision not in ("fp32",) + tuple(HALF_DTYPES):
        return []
    half, fp32_ops = HALF_DTYPES.get(precision), set(fp32_ops)
    users = _consumers(graph)
    by_out = {o: n for n in graph.nodes for o in n.outputs if o}
    folded, drop = [], set()
    for node in list(graph.nodes):
        if node.op_type in ("Mul", "Div") and id(node) not in drop:
            rms = _rms_norm(graph, users, by_out, node, fp32_ops)
            if rms is None:
                continue
            x, gamma, eps, removed = rms
            norm = (x, node.outputs[0], gamma, "", eps, False)
        elif node.op_type == "LayerNormalization" and not kept_float32(node, fp32_ops) and not any(node.outputs[1:]):
            x = node.inputs[0]
            if int(node.attrs.get("axis", -1)) not in (-1, len(graph.tensors[x].shape or ()) - 1):
                continue
            beta = node.inputs[2] if len(node.inputs) > 2 else ""
            norm, removed = (x, node.outputs[0], node.inputs[1], beta, float(node.attrs.get("epsilon", 1e-5)), True), [node]
        else:
            continue
        if _fold(graph, users, *norm, half, fp32_ops, len(folded)):
            drop.update(id(n) for n in removed)
            folded.append(node.name or node.outputs[0])
    graph.nodes = [n for n in graph.nodes if id(n) not in drop]
    return folded


def _fold(graph: Graph, users: dict, x: str, y: str, gamma_name: str | None, beta_name: str, eps: float,
          center: bool, half: str | None, fp32_ops, k: int) -> bool:
    """Fold the norm of x into y (scale `gamma_name`, bias `beta_name`, either "" or None for
    none; `center`: a LayerNorm, else an RMSNorm) into the GEMMs that read y, where they are all
    it has, and rewire them to x; False, with nothing changed, where it does not qualify."""
    xt = graph.tensors[x]
    if not xt.shape or xt.value is not None or xt.dtype != (half or "float32"):
        return False
    length = int(xt.shape[-1])
    gamma = _vector(graph.tensors.get(gamma_name), length) if gamma_name else np.ones(length)
    beta = _vector(graph.tensors.get(beta_name), length) if beta_name else np.zeros(length)
    gemms = _readers(graph, users, y, length, fp32_ops) if gamma is not None and beta is not None else None
    if not gemms:
        return False
    for g in gemms:
        _fold_into(graph, g, gamma, beta, eps, half, k, center)
    for n in users.get(y, []):
        n.inputs[0] = x  # the views and GEMMs read x, of the same shape and storage
    return True


def _fold_into(graph: Graph, g, gamma: np.ndarray, beta: np.ndarray, eps: float, half: str | None, k: int,
               center: bool) -> None:
    """GEMM node `g` takes W' = diag(γ) W (in the storage type its weight had), and the
    constants c and b' for its store (kernels/row_norm.py)."""
    wname = g.inputs[1]
    wt = graph.tensors[wname]
    trans_b = g.op_type == "Gemm" and bool(g.attrs.get("transB", 0))
    stored, c, b = _scaled_weight(_float_weight(graph, wname, half), gamma, beta, 1 if trans_b else 0,
                                  np.dtype(wt.dtype))
    tag = f"%lnfold{k}:{g.name or g.outputs[0]}"
    graph.tensors[f"{tag}:W"] = Tensor(f"{tag}:W", tuple(wt.shape), wt.dtype, stored)
    if center:
        graph.tensors[f"{tag}:c"] = Tensor(f"{tag}:c", (c.size,), "float32", c.astype(np.float32))
    has_b = bool(np.any(beta))
    if has_b:
        graph.tensors[f"{tag}:b"] = Tensor(f"{tag}:b", (b.size,), "float32", b.astype(np.float32))
    g.inputs[1] = f"{tag}:W"
    g.attrs[ATTR] = {"c": f"{tag}:c" if center else "", "b": f"{tag}:b" if has_b else "", "eps": eps}
