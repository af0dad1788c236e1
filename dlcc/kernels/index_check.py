"""Device-side index checks: an out-of-range index computed inside the model is an error, not a
silently clamped read.

Gather-family kernels clamp every index (ops/layout.py `_index`), so no kernel ever reads outside
its tensor. Clamping alone would turn a bad index into a wrong answer, though, so every index is
also checked, where it is known first:
- a constant index: at compile time (ops/layout.py `index_check`);
- a graph input (an embedding's token ids): on the host before the launch
  (Executor.check_indices), so the error comes before any work;
- an index computed on the device (ArgMax, Cast of arithmetic, a Range): by the small kernel
  below, launched after the Gather. At the first index outside [-bound, bound) it claims the
  plan's error words (the tensor ERRORS, in its own storage "errors") with an atomic
  compare-and-swap and records the site, the index and its flat position. The executor reads the
  four words after every inference, clears them, and raises an error naming the node, the index
  and the bound, as onnxruntime does.

Cost: one launch per such Gather that reads only its indices (a few KB), and one 16-byte read per
inference on the few models that compute indices; `dlcc inspect` lists every check.
"""
from __future__ import annotations

import numpy as np

from ..ir import Tensor
from .program import ctype

ERRORS = "%errors"
#: The error words: site (1-based; 0 = no error), the index's low and high 32 bits, its position.
ERROR_WORDS = 4
BLOCK = 256


def _bound_expr(bounds: list[int], per_last_axis: bool) -> str:
    """The bound of element i as a C expression: one bound, or one per component of the last axis
    (GatherND's index tuples)."""
    if not per_last_axis or len(set(bounds)) == 1:
        return f"(i64){bounds[0]}"
    k = len(bounds)
    expr = f"(i64){bounds[-1]}"
    for j in range(k - 2, -1, -1):
        expr = f"(i % {k} == {j} ? (i64){bounds[j]} : {expr})"
    return expr


def emit_index_check(ctx, node, idx: str, bounds: list[int], per_last_axis: bool) -> None:
    """Launch the check of computed indices `idx` of `node` against `bounds` and record the site
    in ctx.device_index_checks (the plan's meta), whose position + 1 the kernel reports."""
    shape = ctx.shape(idx)
    n = int(np.prod(shape)) if shape else 1
    if n == 0:
        return
    if ERRORS not in ctx.graph.tensors:
        ctx.graph.tensors[ERRORS] = Tensor(ERRORS, (ERROR_WORDS,), "int32")
    site = len(ctx.device_index_checks) + 1
    t = ctype(ctx.dtype(idx))
    bound = _bound_expr(bounds, per_last_axis)

    def make(kname: str) -> str:
        return (
            f"KERNEL void {kname}(GPTR const {t}* x0, GPTR int* err, const int site) {{\n"
            f"    const int i = BLOCK_ID * BLOCK_DIM + THREAD_ID;\n"
            f"    if (i < {n}) {{\n"
            f"        const i64 v = (i64)x0[i];\n"
            f"        const i64 b = {bound};\n"
            f"        if ((v < -b || v >= b) && ATOMIC_CAS_I32(err, 0, site) == 0) {{\n"
            f"            err[1] = (int)v;\n"
            f"            err[2] = (int)(v >> 32);\n"
            f"            err[3] = i;\n"
            f"        }}\n"
            f"    }}\n}}\n"
        )

    kname = ctx.program.add_kernel("check_index", make, BLOCK, kind="check", pass_name=ctx.pass_name)
    ctx.launch(kname, (n + BLOCK - 1) // BLOCK, [idx, ERRORS, site], reads=[idx], writes=[ERRORS],
               dram_bytes=ctx.tensor(idx).nbytes)
    ctx.device_index_checks.append({"node": node.name, "op": node.op_type, "bounds": [int(b) for b in bounds],
                                    "per_last_axis": per_last_axis, "shape": [int(d) for d in shape],
                                    "kernel": kname})


def decode_error(words, checks: list[dict]) -> str | None:
    """The message for the error words read back from the device (None when no check fired):
    which node, which index at which position, and the range it must lie in."""
    site = int(words[0])
    if site == 0:
        return None
    if not 1 <= site <= len(checks):
        return f"a device index check reported an unknown site {site} (a damaged plan)"
    c = checks[site - 1]
    value = (int(words[2]) << 32) | (int(words[1]) & 0xFFFFFFFF)
    flat = int(words[3])
    shape = c["shape"]
    pos = [int(x) for x in np.unravel_index(flat, shape)] if shape and 0 <= flat < int(np.prod(shape)) else [flat]
    bounds = c["bounds"]
    b = bounds[pos[-1] % len(bounds)] if c.get("per_last_axis") and len(bounds) > 1 else bounds[0]
    return (f"{c['op']} node {c['node']!r}: a computed index {value} at {pos} is outside [-{b}, {b}) "
            f"(found on the device; its read was clamped, and the outputs are not returned)")
