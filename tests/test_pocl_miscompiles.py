"""The PoCL 3.1 miscompiles dlcc works around (dlcc/testing/pocl_kernels.py), kept from coming
back: the loop forms dlcc emits must be right under both of PoCL's work-group methods, and no
kernel that PoCL builds optimised may hold the miscompiled shape (a loop whose bounds depend on
the launch grid, around a barrier). Each run is a fresh process, since PoCL reads its work-group
method when it first builds a kernel.

`scripts/pocl_miscompiles.py` shows the other half of the proof: the original forms are wrong
under PoCL's defaults on this driver."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import opencl_device_available
from dlcc.testing.pocl_kernels import run_with_method

pytestmark = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")


@pytest.mark.parametrize("method", ["loopvec", "loops"])
@pytest.mark.parametrize("form", ["ONCE", "GRID_TURNS", "VECTORIZER_ONCE", "VECTORIZER_GRID_TURNS"])
def test_astitch_loop_forms_are_right_under_both_methods(form, method):
    got, want = run_with_method(form, method)
    assert got == want


@pytest.mark.parametrize("name", ["PEELED", "VECTORIZER"])
@pytest.mark.parametrize("method", ["loopvec", "loops"])
def test_unoptimised_builds_are_right(name, method):
    """Built with -cl-opt-disable (what the runtime does for persistent kernels on PoCL), both
    miscompiled kernels are right under both methods."""
    got, want = run_with_method(name, method, ["-cl-opt-disable"])
    assert got == want


def test_dlcc_keeps_pocls_default_method():
    """dlcc leaves PoCL's work-group method alone (its faster default); the guard is the shape test
    below, not a slower method."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "POCL_WORK_GROUP_METHOD"}
    out = subprocess.run([sys.executable, "-c", "import os, dlcc; print(os.environ.get('POCL_WORK_GROUP_METHOD'))"],
                         env=env, capture_output=True, text=True, check=True).stdout.split()
    assert out[-1] == "None"


@pytest.mark.parametrize("name,flagged", [("VECTORIZER", True), ("PEELED", True), ("GRID_TURNS", True),
                                          ("VECTORIZER_GRID_TURNS", True), ("ONCE", False), ("VECTORIZER_ONCE", False)])
def test_shape_finder_flags_the_miscompiled_loops(name, flagged):
    from dlcc.testing.pocl_kernels import KERNELS, grid_dependent_barrier_loops

    assert bool(grid_dependent_barrier_loops(KERNELS[name])) == flagged


def test_shape_finder_follows_declarations_calls_and_macros():
    from dlcc.testing.pocl_kernels import grid_dependent_barrier_loops

    src = """#define SYNC barrier(CLK_LOCAL_MEM_FENCE)
#define KERNEL __kernel
#define DEVICE static inline
DEVICE void stage(int j) { SYNC; }
DEVICE void task(int task_id, int n) {
    const int first = task_id * 4;
    for (int t = first; t < n; ++t) { stage(t); }
    for (int t = 0; t < n; ++t) { stage(t); }
}
KERNEL void LAUNCH_BOUNDS(256) k(__global float* x, const int n) {
    task(BLOCK_ID, n);
    for (int i = 0; i < n; ++i) { x[i] = 0; }
}
KERNEL void plain(__global float* x, const int n) {
    task(3, n);
}
"""
    assert grid_dependent_barrier_loops(src) == [("k", "for (int t = first; t < n; in task")]


def _models():
    from conftest import export_model

    root = Path(__file__).resolve().parents[1]
    yield "resnet-tiny", root / "examples" / "resnet-tiny.onnx"
    for name in ("cnn", "mobilenet", "yolo", "ocr", "lstm", "gru", "bert", "gpt2", "vit"):
        yield name, export_model(name)


@pytest.mark.parametrize("pipeline", ["baseline", "astitch", "rammer", "full", "large-tiles"])
@pytest.mark.parametrize("device", ["pocl-cpu", "h100"])
def test_no_optimised_kernel_has_the_miscompiled_shape(pipeline, device):
    """Every kernel of the test models (at fp32 and bf16, planned for PoCL and for an H100, whose
    plans have grid-barrier stitches) whose loops around barriers depend on the launch grid is
    one that the runtime builds with -cl-opt-disable on PoCL. So PoCL's default work-group
    method is safe for all the others. Source generation only: nothing is built or run."""
    import dlcc
    from dlcc.backends.opencl import unoptimised_kernels
    from dlcc.testing.pocl_kernels import grid_dependent_barrier_loops

    bad, checked, exempt_hits = [], 0, 0
    for name, path in _models():
        for precision in ("fp32", "bf16"):
            m = dlcc.compile(path, target="opencl", pipeline=pipeline, device=device, precision=precision)
            exempt = unoptimised_kernels(m.plan)
            found = grid_dependent_barrier_loops(m.source("opencl"))
            checked += len(m.plan["kernels"])
            bad += [(name, precision, k, loop) for k, loop in found if k not in exempt]
            exempt_hits += sum(k in exempt for k, _ in found)
    assert checked >= 20
    assert not bad, bad
    if pipeline in ("rammer", "full") and device == "h100":
        # the finder sees the persistent kernels' dispatch loops (planned for pocl-cpu, Rammer
        # joins nothing: its kernels would be built unoptimised there)
        assert exempt_hits > 0


def test_rammer_dispatcher_around_a_regional_stitch(tmp_path):
    """Fuzz graph 300024 (found at bf16, wrong at every precision) through `full-join-always`:
    a stitch whose Sqrt and Tanh stores follow Regional (shared-memory) reductions, joined with a
    GEMM rTask into a persistent kernel. Rammer's dispatch loop reads the block index (PEELED's
    shape), and optimised, PoCL 3.1 dropped those stores; the runtime builds persistent kernels
    unoptimised on PoCL (backends/opencl.py compile), and the outputs match onnxruntime's."""
    import onnx

    import dlcc
    from dlcc.testing import graphgen
    from dlcc.testing.oracle import compare_outputs, config_named

    case = graphgen.generate_valid(300024)
    onnx.save(case.model, tmp_path / "g.onnx")
    got = dlcc.compile(tmp_path / "g.onnx", target="opencl", pipeline=config_named("full-join-always").spec())(case.feeds)
    ok, notes, _ = compare_outputs(case.model, got, case.refs)
    assert ok, notes


def test_every_gpu_sized_simt_tiling_builds_unoptimised():
    """LLVM 15 (PoCL 3.1) crashed with SIGSEGV in its inliner at the first launch of a split-K
    `128x128x16_8x8v` rKernel built optimised (PP-OCRv4's text recogniser through `astitch` on the
    h100 spec): the vector twins of the GPU-only tilings need the -cl-opt-disable build as the
    scalar ones do. Every SIMT tiling of 32 or more outputs a thread, split or not, gets it."""
    from dlcc.backends.opencl import builds_unoptimised
    from dlcc.kernels.gemm import ALL_TILINGS
    from dlcc.kernels.splitk import variants

    big = [t for t in variants(ALL_TILINGS) if t.tm * t.tn >= 32]
    assert {t.vec for t in big} == {False, True}
    assert all(builds_unoptimised({"kind": "gemm", "tiling": t.name}) for t in big)
    assert not any(builds_unoptimised({"kind": "gemm", "tiling": t.name}) for t in variants(ALL_TILINGS)
                   if t.tm * t.tn < 32)


_STACK_PROBE = """
import sys
import numpy as np
import dlcc.backends.opencl  # noqa: F401  (configure_pocl: before pyopencl starts PoCL's threads)
import pyopencl as cl
n = int(sys.argv[1])
src = '''
__kernel void __attribute__((reqd_work_group_size(256, 1, 1))) big(__global float* y, __global const float* x) {
    float p[@N@];
    const int t = get_local_id(0);
    for (int i = 0; i < @N@; ++i) p[i] = x[(i + t) % 1024];
    barrier(CLK_LOCAL_MEM_FENCE);
    float s = 0.0f;
    for (int i = 0; i < @N@; ++i) s += p[(@N@ - 1 - i + t) % @N@];
    y[t] = s;
}'''.replace("@N@", str(n))
ctx = cl.Context([cl.get_platforms()[0].get_devices()[0]])
q = cl.CommandQueue(ctx)
prg = cl.Program(ctx, src).build(options=["-cl-std=CL1.2", "-cl-opt-disable"])
x = np.random.default_rng(0).random(1024).astype(np.float32)
mf = cl.mem_flags
xb = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)
yb = cl.Buffer(ctx, mf.READ_WRITE, 1024)
prg.big(q, (256,), (256,), yb, xb)
y = np.empty(256, np.float32)
cl.enqueue_copy(q, y, yb)
q.finish()
want = [x[[((n - 1 - i + t) % n + t) % 1024 for i in range(n)]].astype(np.float64).sum() for t in (0, 255)]
print("ok" if np.allclose(y[[0, 255]], want, rtol=1e-4) else "WRONG")
"""


@pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")
def test_a_work_group_larger_than_the_default_thread_stack_runs(tmp_path):
    """PoCL keeps each private value live across a barrier once per work-item, on its worker
    thread's stack (glibc's default: 8 MiB). Built unoptimised, a persistent kernel of many
    rTasks (the PP-OCR text-direction classifier through `full` at bf16: a 13.2 MiB frame) ran
    past it: SIGSEGV, or corruption where the frame met another mapping. dlcc raises the default
    thread stack before PoCL starts (backends/opencl.py claim_thread_stack): a 9 MiB frame runs,
    in a process of its own so that a crash fails the test and not the run."""
    import subprocess
    import sys

    probe = tmp_path / "probe.py"
    probe.write_text(_STACK_PROBE)
    env = {**__import__("os").environ, "POCL_CACHE_DIR": str(tmp_path / "pocl")}
    r = subprocess.run([sys.executable, str(probe), str(9 * 1024)], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stdout[-500:], r.stderr[-2000:])


def test_tensor_core_emulations_are_right_optimised(monkeypatch):
    """PoCL's optimised build computed every product of a wgmma kernel as 0 while the emulation's
    helpers were called out of line (dlcc_wgmma_run read zeros from the task's __local buffer,
    which the task itself read right); the prelude now always inlines them (EMULATED). A wgmma
    tiling and a multi-stage bf16 mma.sync tiling, each alone in its module as that case was,
    built optimised, against numpy. (The runtime still builds them unoptimised, as they build
    faster so: backends/opencl.py builds_unoptimised.)"""
    import numpy as np

    import dlcc.backends.opencl as ocl
    from conftest import gemm_plan
    from dlcc.backends.source import render
    from dlcc.executor import make_runtime
    from dlcc.kernels.gemm import gemm_source, plain_spec
    from dlcc.kernels.gemm_mma import mma_tilings
    from dlcc.kernels.gemm_wgmma import wgmma_tilings
    from test_gemm_mma_async import _operands, _reference, _run

    monkeypatch.setattr(ocl, "builds_unoptimised", lambda *a, **k: False)
    M, N, K = 70, 72, 200
    spec = plain_spec(M, N, K, True, b_dtype="bfloat16", a_dtype="bfloat16")
    A, B = _operands(M, N, K, False, True)
    ref = _reference(A, B, "bf16", False, True)
    deep = next(t for t in mma_tilings("bf16", deep=True) if t.stages > 1 and not t.wgmma)
    for t in (wgmma_tilings("bf16")[5], deep):
        rt = make_runtime("opencl")
        name = f"g_{t.name}"
        rt.compile(render([gemm_source(name, spec, t)], rt.dialect), gemm_plan([(name, t)]))
        assert not rt.unoptimised, t.name  # (the optimised build ran it)
        out = _run(rt, name, t, spec, A, B, "bfloat16", "bfloat16")
        np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5, err_msg=t.name)
