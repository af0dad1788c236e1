"""Every kernel emitted for the test models compiles with nvcc for sm_80 and sm_90, without spills."""
from __future__ import annotations

import pytest

import dlcc
from dlcc.backends.nvcc import compile_cubin, find_nvcc

from conftest import SMALL_MODELS

pytestmark = pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed on this machine")


@pytest.mark.parametrize("name", SMALL_MODELS)
def test_cuda_kernels_compile_without_spills(model_path, name):
    m = dlcc.compile(model_path(name), target="opencl")
    kernels = {k["name"] for k in m.plan["kernels"]}
    for arch in ("sm_80", "sm_90"):
        usage = compile_cubin(m.source("cuda"), arch)
        assert kernels <= set(usage), f"{arch}: kernels missing from ptxas output: {kernels - set(usage)}"
        spills = {k: (u.spill_stores, u.spill_loads) for k, u in usage.items() if u.spills}
        assert not spills, f"{arch}: register spills in {spills}"
        for k in m.plan["kernels"]:
            assert usage[k["name"]].registers * k["block"] <= 65536, k


@pytest.mark.parametrize("name,precision", [("cnn", "tf32"), ("lstm", "tf32"), ("bert", "tf32"), ("vit", "tf32"),
                                            ("cnn", "bf16"), ("bert", "bf16"), ("gpt2", "fp16"),
                                            ("hf-convnext", "bf16"), ("cnn", "tf32x3"), ("vit", "tf32x3")])
def test_tensor_core_plans_compile_without_spills(model_path, name, precision):
    """At the tensor-core precisions on an H100's plan (`full` with every run joined, `join:
    always`: stitched epilogues on the mma accumulators, tensor-core rTasks in persistent kernels,
    half weights and activations copied by cp.async), every kernel builds for sm_80 and sm_90
    without spills. hf-convnext's persistent kernel spilled 228 bytes when the cp.async rTasks' k16
    loop was unrolled."""
    if name.startswith("hf-"):
        from test_hf_zoo import _export

        path = _export(name[3:])
    else:
        path = model_path(name)
    from dlcc.config import load_pipeline

    full = load_pipeline("full")
    joined = full.model_copy(update={"passes": [p.model_copy(update={"options": {**p.options, "join": "always"}})
                                                if p.name == "rammer" else p for p in full.passes]})
    m = dlcc.compile(path, target="opencl", pipeline=joined, device="h100", precision=precision)
    assert any(L.get("grid_sync") for L in m.plan["launches"]), "a persistent kernel with grid barriers"
    from dlcc.kernels.gemm_mma import MMA_KINDS

    mma = MMA_KINDS[precision][2] + ("" if precision in ("tf32", "tf32x3") else "_P")  # fp16/bf16: packed
    from dlcc.backends.source import render

    assert m.source("cuda").count(f"{mma}(") > render([], "cuda").count(f"{mma}(")  # in the kernels, not only the prelude
    for arch in ("sm_80", "sm_90"):
        usage = compile_cubin(m.source("cuda"), arch)
        spills = {k: (u.spill_stores, u.spill_loads) for k, u in usage.items() if u.spills}
        assert not spills, f"{arch}: register spills in {spills}"


def test_device_index_checks_compile(tmp_path):
    """The device index check (kernels/index_check.py: atomicCAS on the error words) builds for
    both architectures, in a baseline plan and inside a persistent kernel."""
    from test_hostile_input import _computed_index_model

    for op in ("Gather", "GatherND"):
        for pipeline in ("baseline", "full"):
            m = dlcc.compile(_computed_index_model(tmp_path / f"{op}.onnx", op), target="opencl", pipeline=pipeline,
                             device="h100")
            assert "ATOMIC_CAS_I32" in m.source("cuda")
            for arch in ("sm_80", "sm_90"):
                usage = compile_cubin(m.source("cuda"), arch)
                assert {k["name"] for k in m.plan["kernels"]} <= set(usage)
