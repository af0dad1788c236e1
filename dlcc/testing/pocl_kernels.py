"""Minimal OpenCL kernels that PoCL 3.1 miscompiles, and the forms dlcc emits instead.

Each kernel is valid OpenCL C with one 256-item work-group: every barrier is reached by every
work-item, and nothing races (only work-item 0 stores). Each writes `o[0]`; `expected(x)` is
what it must be. `scripts/pocl_miscompiles.py` runs them all under both of PoCL's work-group
methods and prints which give the wrong answer; tests/test_pocl_miscompiles.py checks that the
forms dlcc emits, under the method dlcc sets, are right.

1. VECTORIZER: a block-strided loop around barrier loops (the shape of a tree reduction) and an
   inner loop that runs at most once per work-item. Under PoCL's default method ("loopvec"),
   the inner loop's store is dropped; under "loops" (no vectorizer) it is kept. First seen as a
   wrong answer from a tf2onnx model (magika) through `astitch` on PoCL. dlcc sets "loops"
   (backends/opencl.py: configure_pocl).
2. PEELED: a block-strided loop whose condition reads the block index, around a Regional stitch
   (values kept in local memory across barriers). PoCL treats the loop's barriers as conditional
   and peels work-item 0 into a copy of its own, which loses its stores under both methods
   (upstream PoCL fixed bugs in that peeling code in 2026 and then removed it). dlcc emits no
   loop where each block takes one turn (ONCE), and elsewhere a turn count that reads only the
   grid size (GRID_TURNS), which PoCL compiles right (passes/astitch/codegen.py: _phase_code).
   Rammer's persistent kernels keep that shape (each block's rTasks in a wave are a loop from
   its own first one), and a Regional stitch rTask inside lost its stores (fuzz graph 300024).

Built with -cl-opt-disable, PoCL gets both kernels right under both methods: the runtime builds
persistent kernels that way on PoCL (backends/opencl.py compile).
"""
from __future__ import annotations

import numpy as np

_B = "#define B barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE)\n"

VECTORIZER = _B + """
kernel void k(global const float* x, global float* o) {
    const int lt = get_local_id(0);
    for (int u0 = (int)get_group_id(0) * 256; u0 < 1; u0 += (int)get_num_groups(0) * 256) {
        for (int s = 0; s < 2; ++s) B;
        B;
        for (int j = lt; j < 1; j += 256) { o[j] = x[0]; }
        B;
        for (int s = 0; s < 2; ++s) B;
        B;
    }
}
"""

_PEELED_BODY = """
        const int u = u0 + tid;
        if (u < 1) { sm[tid] = x[0]; sm[256 + tid] = x[1]; }
        B;
        for (int j = 0; j < 1; j += 1) {
            if (u + j < 1) {
                const float v = sm[256 + tid - u] - sm[tid - u] * sm[tid - u];
                sm[512 + tid + j] = v;
                o[u + j] = v;
            }
        }
        B;
        for (int j = 0; j < 2; j += 1) {
            if (u * 2 + j < 2) o[8 + u * 2 + j] = sm[512 + tid - u] * x[2 + u * 2 + j];
        }
        B;
    }
}
"""
_PEELED_HEAD = _B + """
kernel void k(global const float* x, global float* o) {
    local float sm[1280];
    const int tid = get_local_id(0);
"""
PEELED = _PEELED_HEAD + "    for (int u0 = (int)get_group_id(0) * 256; u0 < 1; u0 += (int)get_num_groups(0) * 256) {" \
    + _PEELED_BODY
#: dlcc's form where every block takes one turn (no grid barrier in the kernel).
ONCE = _PEELED_HEAD + "    { const int u0 = (int)get_group_id(0) * 256;" + _PEELED_BODY
#: dlcc's form in kernels with grid barriers: the turn count reads the grid size only.
GRID_TURNS = _PEELED_HEAD + ("    for (int it = 0; it < (2 + (int)get_num_groups(0) - 1) / (int)get_num_groups(0); ++it) {"
                             " const int u0 = ((int)get_group_id(0) + it * (int)get_num_groups(0)) * 256;") + _PEELED_BODY

KERNELS = {"VECTORIZER": VECTORIZER, "PEELED": PEELED, "ONCE": ONCE, "GRID_TURNS": GRID_TURNS}


def expected(name: str, x: np.ndarray) -> float:
    return float(x[0]) if name == "VECTORIZER" else float(x[1] - x[0] * x[0])


def run(name: str, options: list[str] | None = None) -> tuple[float, float]:
    """(o[0] from the OpenCL device, the expected value), one 256-item work-group. PoCL reads its
    work-group method when it first runs a kernel: run_with_method() sets it in a fresh process."""
    import pyopencl as cl

    from ..backends.opencl import _pick_device

    ctx = cl.Context([_pick_device(cl)])
    q = cl.CommandQueue(ctx)
    prg = cl.Program(ctx, KERNELS[name]).build(options=["-cl-std=CL1.2"] + (options or []))
    x = np.arange(1, 513, dtype=np.float32)
    mf = cl.mem_flags
    bx = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)
    bo = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=np.full(16, -7.0, np.float32))
    prg.k(q, (256,), (256,), bx, bo)
    out = np.empty(16, np.float32)
    cl.enqueue_copy(q, out, bo)
    q.finish()
    return float(out[0]), expected(name, x)


def run_with_method(name: str, method: str | None, options: list[str] | None = None) -> tuple[float, float]:
    """run(name, options) in a fresh Python process with POCL_WORK_GROUP_METHOD=method (None:
    whatever `import dlcc` sets)."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ)
    env.pop("POCL_WORK_GROUP_METHOD", None)
    if method:
        env["POCL_WORK_GROUP_METHOD"] = method
    code = ("import json, dlcc; from dlcc.testing.pocl_kernels import run; "
            f"print(json.dumps(run({name!r}, {options!r})))")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"kernel {name} under {method}: {r.stderr[-2000:]}")
    got, want = json.loads(r.stdout.strip().splitlines()[-1])
    return got, want
