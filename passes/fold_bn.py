"""Fold inference BatchNormalization into the Conv (or ConvTranspose) before it, at compile time.

y = (conv(x, W) + b - mean) * s + beta with s = gamma / sqrt(var + eps) per output channel is
conv(x, W * s) + (b - mean) * s + beta: the BN costs nothing at run time. Applies only where the
Conv's output feeds the BN alone and every parameter is a constant.
"""
from __future__ import annotations

import numpy as np

from ..ir import Node, Tensor
from . import CompileState, register_pass


def _fold(g, conv: Node, bn: Node) -> bool:
    w = g.tensors[conv.inputs[1]]
    params = [g.tensors.get(n) for n in bn.inputs[1:5]]
    if w.value is None or any(p is None or p.value is None for p in params) or w.dtype != "float32":
        return False
    if bn.attrs.get("training_mode", 0) or bn.attrs.get("spatial", 1) != 1 or any(o for o in bn.outputs[1:]):
        return False
    gamma, beta, mean, var = (p.value.astype(np.float64).reshape(-1) for p in params)
    s = gamma / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
    transpose = conv.op_type == "ConvTranspose"
    group = int(conv.attrs.get("group", 1))
    W = w.value.astype(np.float64)
    if transpose:  # weight (Cin, Cout/group, k...): output channel c = g * (Cout/group) + j
        cin_g, cout_g = W.shape[0] // group, W.shape[1]
        Wr = W.reshape((group, cin_g, cout_g) + W.shape[2:])
        Wr = Wr * s.reshape(group, 1, cout_g, *([1] * (W.ndim - 2)))
        W2 = Wr.reshape(W.shape)
    else:
        W2 = W * s.reshape((-1,) + (1,) * (W.ndim - 1))
    bias = g.tensors[conv.inputs[2]].value.astype(np.float64) if len(conv.inputs) > 2 and conv.inputs[2] else 0.0
    if len(conv.inputs) > 2 and conv.inputs[2] and g.tensors[conv.inputs[2]].value is None:
        return False
    b2 = (bias - mean) * s + beta
    wn, bname = f"{conv.inputs[1]}@bnfold", f"{conv.name}@bnfold_bias"
    g.tensors[wn] = Tensor(wn, tuple(W2.shape), "float32", W2.astype(np.float32))
    g.tensors[bname] = Tensor(bname, (len(b2),), "float32", b2.astype(np.float32))
    conv.inputs = [conv.inputs[0], wn, bname]
    conv.outputs = [bn.outputs[0]]
    return True


@register_pass("fold-bn", before=("lower",))
def fold_bn(state: CompileState, opts) -> None:
    """Fold inference BatchNormalization into the preceding Conv's weights and bias."""
    g = state.graph
    users: dict[str, int] = {}
    for n in g.nodes:
        for i in n.inputs:
            users[i] = users.get(i, 0) + 1
    producer = {o: n for n in g.nodes for o in n.outputs}
    dead = set()
    for bn in g.nodes:
        if bn.op_type != "BatchNormalization" or not bn.inputs:
            continue
        conv = producer.get(bn.inputs[0])
        if conv is None or conv.op_type not in ("Conv", "ConvTranspose") or users.get(bn.inputs[0], 0) != 1 \
                or bn.inputs[0] in g.outputs or id(conv) in dead:
            continue
        if _fold(g, conv, bn):
            dead.add(id(bn))
    if dead:
        g.nodes = [n for n in g.nodes if id(n) not in dead]
        state.log.append(f"fold-bn: folded {len(dead)} BatchNormalization(s) into convolutions")
