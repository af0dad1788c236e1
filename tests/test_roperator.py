"""Every kernel dlcc emits, rewritten into Rammer's rOperator form (kernels/roperator.py), computes
exactly what the kernel computed: whole models run on PoCL with every kernel replaced by its
task function behind a thin KERNEL, for both pipelines, and the outputs must match the plain run."""
from __future__ import annotations

import numpy as np
import pytest

import dlcc
from dlcc.backends.source import render
from dlcc.executor import Executor, make_runtime
from dlcc.kernels.roperator import NotAnROperator, plan_roperators, task_form_source, to_roperator

from conftest import export_model


#: Under `-m slow` only: templates the other cases rewrite already (mobilenet's baseline
#: convolutions are cnn's, its depthwise ones run in its astitch case; gpt2's stitched kernels are
#: bert's, and its baseline case keeps the causal mask's).
_SLOW = {("mobilenet", "baseline"), ("gpt2", "astitch")}


@pytest.mark.parametrize("model,pipeline", [
    pytest.param(m, p, marks=pytest.mark.slow) if (m, p) in _SLOW else (m, p)
    for m in ["cnn", "mobilenet", "bert", "gpt2", "lstm", "ocr"] for p in ["baseline", "astitch"]])
def test_task_form_runs_every_model_identically(model, pipeline, tmp_path):
    if pipeline == "astitch" and model == "bert":
        # without the attention fusion, BERT's first Softmax and its mask form a Global-scheme stitch
        p = tmp_path / "astitch-unfused.yaml"
        p.write_text("name: astitch-unfused\npasses:\n  - name: simplify\n  - name: lower\n  - name: astitch\n"
                     "    options: {attention: false}\n  - name: memplan\n")
        pipeline = str(p)
    m = dlcc.compile(export_model(model), target="opencl", pipeline=pipeline)
    rops = plan_roperators(m.plan, m.kernel_codes)
    assert [r.name for r in rops] == [k["name"] for k in m.plan["kernels"]]
    for r, k in zip(rops, m.plan["kernels"]):
        assert f"{r.task_fn}(" in r.code and r.threads == k["block"] and r.smem_bytes >= k.get("smem_bytes", 0)
    feeds = m.sample_inputs(0)
    want = m(feeds)
    ex = Executor(m.plan, m.weights, task_form_source(m.plan, m.kernel_codes, "opencl"), make_runtime("opencl"))
    got = ex.run(feeds)
    for name, ref in want.items():
        np.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=1e-6, err_msg=name)
    # a spin-waiting (Global-scheme) stitch is flagged, not scheduled as a plain rTask; nothing else is
    assert {r.name for r in rops if r.spin} == {L["kernel"] for L in m.plan["launches"] if L.get("grid_sync")}
    if model == "bert" and pipeline.endswith("astitch-unfused.yaml"):
        assert any(r.spin for r in rops)


def test_rewrite_moves_shared_arrays_into_the_task_smem():
    code = ("DEVICE float ef(float x) { return x; }\n"
            "KERNEL void k(GPTR const float* x, GPTR float* y) {\n"
            "    SHARED float red[256];\n    SHARED int idx[3];\n"
            "    red[THREAD_ID] = ef(x[BLOCK_ID * BLOCK_DIM + THREAD_ID]);\n"
            "    BARRIER();\n    if (THREAD_ID == 0) y[BLOCK_ID] = red[0] + GRID_DIM;\n}\n")
    r = to_roperator("k", code, block=256, tasks=7)
    assert r.smem_bytes == 256 * 4 + 16 and not r.spin
    assert "LPTR float* red = (LPTR float*)((LPTR char*)smem + 0);" in r.code
    assert "LPTR int* idx = (LPTR int*)((LPTR char*)smem + 1024);" in r.code
    assert "x[task_id * 256 + thread_id]" in r.code and "red[0] + 7;" in r.code
    assert "DEVICE void k_task(GPTR const float* x, GPTR float* y, const int task_id, const int thread_id, LPTR float* smem)" in r.code
    assert "k_task(x, y, BLOCK_ID, THREAD_ID, smem);" in r.code and "SHARED float smem[260];" in r.code


def test_rewrite_rejects_text_it_does_not_understand():
    with pytest.raises(NotAnROperator):
        to_roperator("missing", "KERNEL void other(GPTR float* y) { y[0] = 1.0f; }", 1, 1)
    with pytest.raises(NotAnROperator):
        to_roperator("k", "KERNEL void k(GPTR float* y) { SHARED float a[4], b[4]; }", 1, 1)


@pytest.mark.skipif(__import__("dlcc.backends.nvcc", fromlist=["find_nvcc"]).find_nvcc() is None,
                    reason="nvcc is not installed on this machine")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_task_form_compiles_under_nvcc_without_spills(arch):
    from dlcc.backends.nvcc import compile_cubin

    codes = []
    for model in ("bert", "cnn"):
        m = dlcc.compile(export_model(model), target="opencl", pipeline="astitch", device="h100")
        codes += [r.code for r in plan_roperators(m.plan, m.kernel_codes)]
    usage = compile_cubin(render(list(dict.fromkeys(codes)), "cuda"), arch)
    assert usage and not [k for k, u in usage.items() if u.spills]
