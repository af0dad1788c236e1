"""Minimal OpenCL kernels that PoCL 3.1 miscompiles, and the forms dlcc emits instead.

Each kernel is valid OpenCL C with one 256-item work-group: every barrier is reached by every
work-item, and nothing races (only work-item 0 stores). Each writes `o[0]`; `expected(x)` is
what it must be. `scripts/pocl_miscompiles.py` runs them all under both of PoCL's work-group
methods and prints which give the wrong answer; tests/test_pocl_miscompiles.py checks that the
forms dlcc emits are right under both.

1. VECTORIZER: a block-strided loop around barrier loops (the shape of a tree reduction) and an
   inner loop that runs at most once per work-item. Under PoCL's default method ("loopvec"),
   the inner loop's store is dropped; under "loops" (no vectorizer) it is kept. First seen as a
   wrong answer from a tf2onnx model (magika) through `astitch` on PoCL. The same body in
   dlcc's ONCE and GRID_TURNS forms (VECTORIZER_ONCE, VECTORIZER_GRID_TURNS) is right under
   both methods: the miscompile needs a loop whose bounds read the block index.
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

Both miscompiles, and a third seen in an AStitch grid-barrier kernel (its GRID_TURNS loop lost
a turn's shared-memory stores after the first; backends/opencl.py compile), need one shape: a
loop whose start or bound depends on the launch grid (the block index or the grid size) with a
barrier inside. `grid_dependent_barrier_loops` finds that shape in generated source, and the
tests prove that every kernel of the test models that has it is among those the runtime builds
unoptimised (backends/opencl.py unoptimised_kernels). That is what lets dlcc leave PoCL's faster
default work-group method ("loopvec") in place: under "loops", dlcc's kernels ran about 1.7x
slower.
"""
from __future__ import annotations

import re

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

_VEC_HEAD, _VEC_BODY = VECTORIZER.split("    for (int u0", 1)
_VEC_BODY = _VEC_BODY.split("{", 1)[1]
#: VECTORIZER's body in dlcc's two loop forms.
VECTORIZER_ONCE = _VEC_HEAD + "    { const int u0 = (int)get_group_id(0) * 256;" + _VEC_BODY
VECTORIZER_GRID_TURNS = _VEC_HEAD + ("    for (int it = 0; it < (1 + (int)get_num_groups(0) - 1) / (int)get_num_groups(0); ++it) {"
                                     " const int u0 = ((int)get_group_id(0) + it * (int)get_num_groups(0)) * 256;") + _VEC_BODY

KERNELS = {"VECTORIZER": VECTORIZER, "PEELED": PEELED, "ONCE": ONCE, "GRID_TURNS": GRID_TURNS,
           "VECTORIZER_ONCE": VECTORIZER_ONCE, "VECTORIZER_GRID_TURNS": VECTORIZER_GRID_TURNS}


def expected(name: str, x: np.ndarray) -> float:
    return float(x[0]) if name.startswith("VECTORIZER") else float(x[1] - x[0] * x[0])


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


#: A function definition's head: qualifiers and attribute macros (`LAUNCH_BOUNDS(256)`), its name
#: and its parameters.
_FUNC = re.compile(r"(?:^|\n)[ \t]*(?:__kernel|kernel|KERNEL|DEVICE|SITE_FN|static|inline)\b"
                   r"(?:[^;{}()]|\([^()]*\))*?\b(\w+)\s*\(([^()]*)\)\s*\{")
_DECL = re.compile(r"\b(?:const\s+)?(?:int|uint|long|i64|size_t)\s+(\w+)\s*=\s*([^;]*);")
_FOR = re.compile(r"\bfor\s*\(([^;]*);([^;]*);")
_CALL = re.compile(r"\b(\w+)\s*\(([^;{}]*)\)\s*;")
_GRID = ("BLOCK_ID", "get_group_id", "GRID_DIM", "get_num_groups")


def _close(text: str, i: int) -> int:
    """Index of the brace matching the one at text[i]."""
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return j
    return len(text)


def _mentions(text: str, names) -> bool:
    return any(re.search(rf"\b{re.escape(n)}\b", text) for n in names)


def grid_dependent_barrier_loops(source: str, kernels=None) -> list[tuple[str, str]]:
    """(kernel, loop header) for each loop in `source` (OpenCL C, dlcc's dialect or plain) whose
    start or bound depends on the launch grid (block index or grid size) and whose body reaches a
    barrier: the shape PoCL 3.1 miscompiles (module docstring). `kernels`: the kernel names to
    check (default: all).

    The dependence is followed through integer declarations (`const int first = BLOCK_ID * 4;`)
    and into called functions (a task function's `task_id` parameter given BLOCK_ID), and
    barriers through calls and through macros defined as a barrier. A textual analysis, made for
    the C that dlcc emits; the tests run it on PEELED and VECTORIZER, which it must flag."""
    barrier_words = {"barrier", "BARRIER"} | set(re.findall(r"#define\s+(\w+)\b[^\n]*\bbarrier\s*\(", source))
    funcs = {}
    for m in _FUNC.finditer(source):
        start = m.end() - 1
        funcs[m.group(1)] = ([p.split()[-1].strip("*") for p in m.group(2).split(",") if p.strip()],
                             source[start:_close(source, start) + 1], "kernel" in m.group(0).lower())
    seen: dict[str, bool] = {}

    def reaches_barrier(body: str, depth: int = 0) -> bool:
        if re.search(r"\b(?:%s)\b" % "|".join(map(re.escape, barrier_words)), body):
            return True
        for f in set(re.findall(r"\b(\w+)\s*\(", body)):
            if f in funcs and depth < 8:
                if f not in seen:
                    seen[f] = False
                    seen[f] = reaches_barrier(funcs[f][1], depth + 1)
                if seen[f]:
                    return True
        return False

    def loops(name: str, tainted: set, depth: int) -> list[str]:
        params, body, _ = funcs[name]
        tainted = set(tainted)
        decls = _FOR.sub("for (", body)  # a loop's own counter is not a declaration of the body
        for _ in range(6):  # declarations that read tainted values, to a fixed point
            grew = {m.group(1) for m in _DECL.finditer(decls) if _mentions(m.group(2), tainted)} - tainted
            if not grew:
                break
            tainted |= grew
        out = []
        for m in _FOR.finditer(body):
            if _mentions(m.group(1) + m.group(2), tainted):
                open_ = body.find("{", m.end())
                if open_ >= 0 and reaches_barrier(body[open_:_close(body, open_) + 1]):
                    out.append(f"for ({m.group(1).strip()}; {m.group(2).strip()};" + (f" in {name}" if depth else ""))
        for m in _CALL.finditer(body):
            f = m.group(1)
            if f in funcs and f != name and depth < 8:
                args = m.group(2).split(",")
                hit = {p for p, a in zip(funcs[f][0], args) if _mentions(a, tainted)}
                if hit:
                    out += loops(f, set(_GRID) | hit, depth + 1)
        return out

    names = [n for n, (_, _, is_kernel) in funcs.items() if is_kernel and (kernels is None or n in kernels)]
    return [(n, loop) for n in names for loop in loops(n, set(_GRID), 0)]
