"""Every small test model, compiled and run on OpenCL (PoCL), against onnxruntime on seeded inputs."""
from __future__ import annotations

import numpy as np
import pytest

import dlcc
from dlcc.verify import verify_outputs

from conftest import SMALL_MODELS

RTOL, ATOL = 1e-3, 1e-4


def check_against_onnxruntime(name: str, path, pipeline: str = "baseline", device=None) -> "dlcc.CompiledModel":
    """Compile `path` for OpenCL (planned for `device`, default PoCL's own spec), run it and
    onnxruntime on the model's seeded inputs (attention masks with padding), compare every graph
    output."""
    import models

    m = dlcc.compile(path, target="opencl", pipeline=pipeline, device=device)
    feeds = models.sample_inputs(name, path, seed=0)
    rows = verify_outputs(path, m(feeds), feeds, RTOL, ATOL)
    assert all(r["passed"] for r in rows), rows
    return m


#: Models where astitch has nothing to stitch: their memory-bound launches are the LSTM/GRU's own
#: per-step cell maps, each between two recurrent GEMMs of the same op, and RNN state inits, and
#: the rest is layout (Squeeze, Reshape, Concat) and a Gemm (lstm: 40 launches, 21 memory-bound,
#: in both pipelines). Every other model has elementwise/reduction chains that must stitch.
NOTHING_TO_STITCH = {"lstm", "gru"}


@pytest.mark.parametrize("name", SMALL_MODELS)
def test_astitch_model_matches_onnxruntime(model_path, name):
    """The same models through the astitch pipeline: fewer launches, memory-bound launches and
    DRAM bytes (no more where there is nothing to stitch), same numbers."""
    base = dlcc.compile(model_path(name), target="opencl")
    m = check_against_onnxruntime(name, model_path(name), "astitch")
    s, b = m.stats, base.stats
    for key in ("launches", "memory_bound_launches", "dram_bytes"):
        if name in NOTHING_TO_STITCH:
            assert s[key] <= b[key], key
        else:
            assert s[key] < b[key], key


#: The two slowest cases on PoCL (about 50 and 90 s cold on 2 cores), whose `full` runs cover
#: Rammer's joins as well: in the slow suite (`scripts/test.sh -m slow`).
SLOW_RAMMER = {("yolo", "rammer"), ("mobilenet", "rammer")}


@pytest.mark.parametrize("name,pipeline", [
    pytest.param(n, p, marks=pytest.mark.slow) if (n, p) in SLOW_RAMMER else (n, p)
    for n in SMALL_MODELS + ["lstm-tc"] for p in ("rammer", "full")])
def test_rammer_pipelines_match_onnxruntime(model_path, name, pipeline):
    """The built-in rammer and full pipelines as planned for an H100, where `join: auto` joins
    (a GPU user's plan: persistent kernels, grid barriers and one-wave rPrograms), run on PoCL and
    match, with fewer launches than the same pipeline without rammer. Planned for PoCL's own spec,
    they join nothing there (PoCL builds Rammer's kernels unoptimised, which no join repays:
    test_rammer.py's test_join_auto_prices_the_unoptimised_build) and stay as fast as the plan
    without rammer."""
    m = check_against_onnxruntime(name, model_path(name), pipeline, device="h100")
    plain = dlcc.compile(model_path(name), target="opencl", pipeline="baseline" if pipeline == "rammer" else "astitch",
                         device="h100")
    assert m.stats["launches"] < plain.stats["launches"]


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "yolo" else n for n in SMALL_MODELS])
def test_model_matches_onnxruntime(model_path, name):
    """Every test model through `baseline`. yolo (about 30 s here) runs under `-m slow`: its
    astitch and full runs stay in the default suite, and cnn covers the baseline's convolutions."""
    m = check_against_onnxruntime(name, model_path(name))
    # The baseline is one kernel per op (after folding): launches never fewer than compute ops.
    s = m.stats
    compute = sum(c for op, c in s["op_histogram"].items() if op in ("Conv", "MatMul", "Gemm", "LSTM", "ConvTranspose"))
    assert s["launches"] >= compute
    assert s["arena_bytes"] <= s["naive_bytes"]


def test_dynamic_batch_binding(model_path):
    """A symbolic batch dim bound with --shape compiles and matches for two different batches."""
    path = model_path("cnn-dynamic")
    for batch in (1, 3):
        m = dlcc.compile(path, target="opencl", shapes=[f"input={batch}x3x32x32"])
        x = np.random.default_rng(batch).standard_normal((batch, 3, 32, 32)).astype(np.float32)
        got = m({"input": x})
        assert got["logits"].shape == (batch, 10)
        rows = verify_outputs(path, got, {"input": x}, RTOL, ATOL)
        assert all(r["passed"] for r in rows), rows


def test_symbolic_dim_binding_by_name(model_path):
    m = dlcc.compile(model_path("cnn-dynamic"), target="opencl", shapes=["batch=2"])
    assert m.inputs[0]["shape"] == [2, 3, 32, 32]


def test_artifact_roundtrip_gives_same_outputs(model_path, tmp_path):
    path = model_path("bert")
    m = dlcc.compile(path, out=tmp_path / "bert.dlcc", target="opencl")
    feeds = m.sample_inputs()
    a = m(feeds)
    b = dlcc.load(tmp_path / "bert.dlcc", target="opencl")(feeds)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


#: yolo (about 30 s a case here) runs these two exporter/dtype variants under `-m slow` only: cnn
#: covers the same convolution paths, and yolo itself runs in every pipeline above.
_YOLO_SLOW = pytest.param("yolo", marks=pytest.mark.slow)
#: The exporter and dtype variants below run through `astitch` (whose compute ops are the
#: baseline's kernels) by default, and through `baseline` too under `-m slow`.
_PIPELINES = [pytest.param("baseline", marks=pytest.mark.slow), "astitch"]


@pytest.mark.parametrize("pipeline", _PIPELINES)
@pytest.mark.parametrize("name", ["cnn", _YOLO_SLOW, "ocr", "bert", "vit"])
def test_dynamo_exporter_models(name, pipeline):
    """The same architectures through torch.onnx's dynamo exporter (opset 18), which emits other patterns
    (e.g. GatherND for BERT's token-type lookup). GPT-2 is left out: its dynamo export fails upstream."""
    torch = pytest.importorskip("torch")
    import models
    from conftest import MODEL_DIR

    path = MODEL_DIR / f"{name}-dynamo.onnx"
    if not path.exists():
        import os
        import tempfile
        import warnings

        import onnx

        MODEL_DIR.mkdir(parents=True, exist_ok=True)
        # Seeded (and in eval mode): two xdist workers that export at once write the same weights,
        # so neither compares the model it compiled with the other's (unseeded, they differed).
        b = models.build(name, "small")
        fd, tmp = tempfile.mkstemp(suffix=".onnx", dir=MODEL_DIR)
        os.close(fd)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(b.module, tuple(b.inputs.values()), tmp, input_names=list(b.inputs),
                              output_names=b.output_names, dynamo=True, opset_version=18, verbose=False)
        onnx.save(onnx.load(tmp), tmp)  # the weights inline: the exporter wrote them to TMP.data
        if os.path.exists(tmp + ".data"):
            os.unlink(tmp + ".data")
        os.replace(tmp, path)
    check_against_onnxruntime(name, path, pipeline)


@pytest.mark.parametrize("pipeline", _PIPELINES)
@pytest.mark.parametrize("name", ["cnn", _YOLO_SLOW, "lstm", "bert"])
def test_float16_models(model_path, name, tmp_path, pipeline):
    """float16 models (converted with onnxconverter-common): float16 at the boundary, float inside.
    onnxruntime computes some ops in float16, so the tolerance is float16's (about 1e-3 relative)."""
    import onnx

    float16 = pytest.importorskip("onnxconverter_common.float16")
    import models

    path = tmp_path / f"{name}-fp16.onnx"
    onnx.save(float16.convert_float_to_float16(onnx.load(model_path(name))), path)
    m = dlcc.compile(path, target="opencl", pipeline=pipeline)
    assert all(t["dtype"] == "float16" for t in m.outputs)
    feeds = {k: (v.astype(np.float16) if v.dtype == np.float32 else v)
             for k, v in models.sample_inputs(name, model_path(name), seed=0).items()}
    got = m(feeds)
    rows = verify_outputs(path, got, feeds, 1e-2, 1e-2)
    assert all(r["passed"] for r in rows), rows
    assert all(g.dtype == np.float16 for g in got.values())
    from dlcc.backends.nvcc import compile_cubin, find_nvcc

    if find_nvcc():  # the half loads/stores (cuda_fp16.h) compile for the GPU too
        usage = compile_cubin(m.source("cuda"), "sm_80")
        assert not [k for k, u in usage.items() if u.spills]
