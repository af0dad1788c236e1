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


@pytest.mark.parametrize("name", ["cnn", "lstm", "bert", "vit"])
def test_tensor_core_plans_compile_without_spills(model_path, name):
    """At precision tf32 on an H100's plan (`full`: stitched epilogues on the mma accumulators,
    tensor-core rTasks in persistent kernels), every kernel builds for sm_80 and sm_90 without
    spills."""
    m = dlcc.compile(model_path(name), target="opencl", pipeline="full", device="h100", precision="tf32")
    assert "MMA_TF32(" in m.source("cuda")
    for arch in ("sm_80", "sm_90"):
        usage = compile_cubin(m.source("cuda"), arch)
        spills = {k: (u.spill_stores, u.spill_loads) for k, u in usage.items() if u.spills}
        assert not spills, f"{arch}: register spills in {spills}"
