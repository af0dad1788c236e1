"""Full-size models (slow: `scripts/test.sh -m slow`): BERT-base and ResNet-50 on OpenCL vs onnxruntime,
and their CUDA kernels through nvcc."""
from __future__ import annotations

import pytest

import dlcc
from dlcc.backends.nvcc import compile_cubin, find_nvcc
from dlcc.verify import verify_outputs

from conftest import export_model

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", ["cnn", "bert", "gpt2", "vit", "mobilenet", "yolo", "ocr", "lstm", "gru"])
def test_full_size_matches_onnxruntime(name):
    import models

    path = export_model(name, "full")
    m = dlcc.compile(path, target="opencl")
    feeds = models.sample_inputs(name, path, seed=0)
    rows = verify_outputs(path, m(feeds), feeds, 2e-3, 2e-4)
    assert all(r["passed"] for r in rows), rows
    if find_nvcc():
        for arch in ("sm_80", "sm_90"):
            usage = compile_cubin(m.source("cuda"), arch)
            assert not [k for k, u in usage.items() if u.spills]


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed on this machine")
@pytest.mark.parametrize("pipeline", ["astitch", "full"])
@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
@pytest.mark.parametrize("name", ["cnn", "bert", "gpt2", "vit"])
def test_full_size_gpu_plans_build_without_spills(name, precision, pipeline):
    """The plans a GPU user gets (split-K, the GPU-only tilings, persistent kernels of 100+ waves),
    which the small models do not reach: split-K's sum once spilled 324 B in BERT-base fp32 `full`,
    and the TF32 128x128 tile split spilled in ViT-B/16's patch embedding."""
    path = export_model(name, "full")
    for dev, arch in (("h100", "sm_90"), ("a100", "sm_80")):
        m = dlcc.compile(path, target="opencl", device=dev, pipeline=pipeline, precision=precision)
        usage = compile_cubin(m.source("cuda"), arch)
        assert not {k: (u.spill_stores, u.spill_loads) for k, u in usage.items() if u.spills}, (dev, arch)
