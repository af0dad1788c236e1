"""Device-side index checks: an out-of-range index computed inside the model is an error, not a
silently clamped read.

Gather-family kernels clamp every index (ops/layout.py `_index`), so no kernel ever reads outside
its tensor. Clamping alone would turn a bad index into a wrong answer, though, so every index is
also checked, where it is known first:
- a constant index: at compile time (ops/layout.py `index_check`);
- a graph input (an embedding's token ids) given as a host array: on the host before the launch
  (Executor.check_indices), so the error comes before any work;
- the same input given as a device array (a torch CUDA tensor, a pyopencl array): by the check
  kernel below, which the compile registers for every such input (`input_check_kernel`, not a
  launch of the plan) and the executor launches on the input buffer before the plan's launches,
  so a device input is never read back to the host to be checked;
- an index computed on the device (ArgMax, Cast of arithmetic, a Range): by the same kernel,
  launched after the Gather (`emit_index_check`).

At the first index outside [-bound, bound) the kernel claims the plan's error word (the tensor
ERRORS, storage "errors", device memory) with an atomic compare-and-swap, and the claiming thread
writes the report (REPORT, storage "report"): the site, the index's low and high 32 bits and its
flat position. Sites are positive for computed checks (meta.device_index_checks, 1-based) and
negative for input checks (meta.index_checks, -1-based). The report lives apart from the claim
word because on CUDA it is mapped host memory (the executor allocates it so): the host reads it
without a device-to-host copy, and the kernel never makes an atomic on host memory. The executor
reads the report once an inference is known finished, clears it, and raises an error naming the
node, the index and the bound, as onnxruntime does.

Cost: one launch per such Gather that reads only its indices (a few KB); `dlcc inspect` lists
every check.
"""
from __future__ import annotations

import numpy as np

from ..ir import Tensor
from .program import ctype, load_float

ERRORS = "%errors"
REPORT = "%report"
#: The claim word (device memory; 0 until a check fires).
CLAIM_WORDS = 1
#: The report: site (0 = no error), the index's low and high 32 bits, its flat position.
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


def _ensure_error_tensors(ctx) -> None:
    """The claim word and the report, as tensors of their own storages (passes/memplan.py
    OWN_STORAGES), placed whether or not a launch of the plan touches them."""
    for name, words in ((ERRORS, CLAIM_WORDS), (REPORT, ERROR_WORDS)):
        if name not in ctx.graph.tensors:
            ctx.graph.tensors[name] = Tensor(name, (words,), "int32")


def range_text(bound: int, from_zero: bool = False) -> str:
    """The range an index must lie in, as the error messages print it (a bound of 2^62 or more
    stands for none: an index that must only not be negative)."""
    if from_zero and bound >= 2 ** 62:
        return "[0, inf)"
    return f"[0, {bound})" if from_zero else f"[-{bound}, {bound})"


#: The kinds of check: an index in a range; an integer divisor, which must not be 0; a float
#: operand that must be finite (RoiAlign's rois, as onnxruntime checks them).
INDEX, DIVISOR, FINITE = "index", "divisor", "finite"
_KERNEL_NAMES = {INDEX: "check_index", DIVISOR: "check_divisor", FINITE: "check_finite"}


def kind_meta(kind: str) -> dict:
    """The plan's record of a check's kind: nothing for an index check (plans from before the
    other kinds say nothing either)."""
    return {} if kind == INDEX else {"kind": kind}


def _check_kernel(ctx, idx: str, bounds: list[int], per_last_axis: bool, pinned: bool = False,
                  from_zero: bool = False, kind: str = INDEX) -> tuple[str, int]:
    """The check kernel of indices `idx` (name, element count): arguments (indices, claim word,
    report, site), one thread per index. An index lies in [-bound, bound) (counted from the end
    when negative), or with `from_zero` in [0, bound) (MaxUnpool, as onnxruntime checks it). A
    DIVISOR check's values are an integer Div's or Mod's divisors instead, and 0 is the error; a
    FINITE check's are floats, and inf or NaN is (the report holds the float's bits)."""
    shape = ctx.shape(idx)
    n = int(np.prod(shape)) if shape else 1
    t = ctype(ctx.dtype(idx))
    if kind == FINITE:
        value = (f"        const float v = {load_float(ctx.dtype(idx), 'x0', 'i')};\n"
                 "        const i64 bits = (i64)AS_UINT(v);\n")
        bad, low, high = "!F_ISFINITE(v)", "(int)bits", "0"
    else:
        value = (f"        const i64 v = (i64)x0[i];\n"
                 f"        const i64 b = {_bound_expr(bounds, per_last_axis)};\n")
        bad = "(v == 0)" if kind == DIVISOR else f"(v < {'0' if from_zero else '-b'} || v >= b)"
        low, high = "(int)v", "(int)(v >> 32)"

    def make(kname: str) -> str:
        return (
            f"KERNEL void {kname}(GPTR const {t}* x0, GPTR int* err, GPTR int* rep, const int site) {{\n"
            f"    const int i = BLOCK_ID * BLOCK_DIM + THREAD_ID;\n"
            f"    if (i < {n}) {{\n"
            f"{value}"
            f"        if ({bad} && ATOMIC_CAS_I32(err, 0, 1) == 0) {{\n"
            f"            rep[1] = {low};\n"
            f"            rep[2] = {high};\n"
            f"            rep[3] = i;\n"
            f"            rep[0] = site;\n"
            f"        }}\n"
            f"    }}\n}}\n"
        )

    _ensure_error_tensors(ctx)
    return ctx.program.add_kernel(_KERNEL_NAMES[kind], make, BLOCK, kind="check",
                                  pass_name=ctx.pass_name, pinned=pinned), n


def emit_index_check(ctx, node, idx: str, bounds: list[int], per_last_axis: bool, from_zero: bool = False,
                     kind: str = INDEX) -> None:
    """Launch the check of computed indices `idx` of `node` against `bounds` and record the site
    in ctx.device_index_checks (the plan's meta), whose position + 1 the kernel reports."""
    shape = ctx.shape(idx)
    if shape and int(np.prod(shape)) == 0:
        return
    key = (ctx.resolve(idx), tuple(int(b) for b in bounds), per_last_axis, from_zero, kind)
    if key in ctx.checked_indices:  # the same indices against the same bounds (a present's K and V): once
        return
    ctx.checked_indices.add(key)
    site = len(ctx.device_index_checks) + 1
    kname, n = _check_kernel(ctx, idx, bounds, per_last_axis, from_zero=from_zero, kind=kind)
    ctx.launch(kname, (n + BLOCK - 1) // BLOCK, [idx, ERRORS, REPORT, site], reads=[idx], writes=[ERRORS, REPORT],
               dram_bytes=ctx.tensor(idx).nbytes)
    ctx.device_index_checks.append({"node": node.name, "op": node.op_type, "bounds": [int(b) for b in bounds],
                                    "per_last_axis": per_last_axis, "shape": [int(d) for d in shape],
                                    "kernel": kname, "from_zero": from_zero, **kind_meta(kind)})


def input_check_kernel(ctx, idx: str, bounds: list[int], per_last_axis: bool, from_zero: bool = False,
                       kind: str = INDEX) -> dict:
    """The check kernel for a graph input's indices, registered but not launched: the executor
    launches it when that input comes as a device array (Executor._launch_input_checks), with
    the input buffer, the error storages and site -(position in meta.index_checks + 1). Its
    fields for the plan's index check: the kernel and its element count."""
    kname, n = _check_kernel(ctx, idx, bounds, per_last_axis, pinned=True, from_zero=from_zero, kind=kind)
    return {"kernel": kname, "elements": n}


def decode_error(words, checks: list[dict], inputs: list[dict] | None = None) -> str | None:
    """The message for a report read back from the device (None when no check fired): which node,
    which index at which position, and the range it must lie in. Positive sites index `checks`
    (meta.device_index_checks), negative ones `inputs` (meta.index_checks)."""
    site = int(words[0])
    if site == 0:
        return None
    table = checks if site > 0 else (inputs or [])
    if not 1 <= abs(site) <= len(table):
        return f"a device index check reported an unknown site {site} (a damaged plan)"
    c = table[abs(site) - 1]
    value = (int(words[2]) << 32) | (int(words[1]) & 0xFFFFFFFF)
    flat = int(words[3])
    shape = c.get("shape") or []
    pos = [int(x) for x in np.unravel_index(flat, shape)] if shape and 0 <= flat < int(np.prod(shape)) else [flat]
    bounds = c["bounds"]
    b = bounds[pos[-1] % len(bounds)] if c.get("per_last_axis") and len(bounds) > 1 else bounds[0]
    if c.get("kind") == DIVISOR:
        source = f"input {c['name']!r} (a device array)" if site < 0 else "a computed divisor"
        return (f"{c['op']} node {c['node']!r}: integer division by zero: {source} holds 0 at {pos} (found on the "
                "device; the outputs are not returned)")
    if c.get("kind") == FINITE:
        source = f"input {c['name']!r} (a device array)" if site < 0 else "a computed operand"
        number = float(np.array([value & 0xFFFFFFFF], np.uint32).view(np.float32)[0])
        return (f"{c['op']} node {c['node']!r}: {source} holds {number} at {pos}, and its values "
                "must be finite (found on the device; the outputs are not returned)")
    if site < 0:
        return (f"input {c['name']!r}: index {value} at {pos} is outside {range_text(b, c.get('from_zero'))} for {c['op']} node "
                f"{c['node']!r} (a device array, checked on the device; nothing was read or written outside a tensor, and the outputs "
                "are not returned)")
    return (f"{c['op']} node {c['node']!r}: a computed index {value} at {pos} is outside {range_text(b, c.get('from_zero'))} "
            f"(found on the device; nothing was read or written outside a tensor, and the outputs are not returned)")
