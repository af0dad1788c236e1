"""Half-precision weights at precision fp16 and bf16.

At those precisions every GEMM and convolution runs on the tensor-core template, which rounds each
operand to the precision's 16-bit type as it stages it (kernels/gemm_mma.py). A constant operand
(a Linear or Conv weight) can therefore be converted once, here at compile time, with no change
to any result: the kernel then reads half the bytes, and at batch 1 reading the weights is most
of a transformer's time. Activations stay float32 (the template rounds them as it loads), so
every other op still computes and stores in float32.

Only the GEMM's own input is rewired: a weight that other nodes also read (GPT-2's tied embedding,
gathered by token and multiplied by the LM head) keeps its float32 tensor for them.
"""
from __future__ import annotations

import numpy as np

from ..ir import Graph, Tensor

#: The storage dtype of each half precision.
HALF_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


def gemm_operands(graph: Graph, node) -> list[int]:
    """Input positions of `node` that the GEMM template loads as operands (ops/matmul.py,
    ops/conv.py): MatMul's and Gemm's A and B, Conv's weight unless it is depthwise (a map
    kernel, ops/conv.py _conv_direct)."""
    if node.op_type in ("MatMul", "Gemm"):
        return [0, 1]
    if node.op_type == "Conv" and len(node.inputs) > 1:
        w = graph.tensors[node.inputs[1]]
        if len(w.shape) >= 3 and not (w.shape[1] == 1 and int(node.attrs.get("group", 1)) > 1):
            return [1]
    return []


def narrow_gemm_weights(graph: Graph, precision: str, fp32_ops=frozenset()) -> list[str]:
    """Rewire every constant float32 GEMM operand to a copy in the precision's half type (one copy
    per constant, however many GEMMs read it), except in ops of `fp32_ops` (they stay on the
    float32 template). Returns the names of the constants narrowed."""
    dtype = HALF_DTYPES[precision]
    np_dtype = np.dtype(dtype)  # "bfloat16" is ml_dtypes' (registered by dlcc.ir)
    narrowed: dict[str, str] = {}
    for node in graph.nodes:
        if node.op_type in fp32_ops:
            continue
        for k in gemm_operands(graph, node):
            name = node.inputs[k]
            t = graph.tensors.get(name) if name else None
            if t is None or t.value is None or t.dtype != "float32":
                continue
            if name not in narrowed:
                half = f"%{dtype}:{name}"
                graph.tensors[half] = Tensor(half, t.shape, dtype, t.value.astype(np_dtype))
                narrowed[name] = half
            node.inputs[k] = narrowed[name]
    return list(narrowed)
