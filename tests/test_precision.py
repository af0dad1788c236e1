"""Precision as a compile option (`--precision`, a pipeline's `precision:`, the API's argument):
tf32, fp16 and bf16 put every GEMM and convolution on the tensor-core template, emulated on PoCL,
and the result is checked against onnxruntime's float32 at verify's tolerance for the precision;
at fp16 and bf16 the GEMM and Conv weights are stored in the half type. Precisions a device
cannot do are one clear error."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import dlcc
from conftest import opencl_device_available, parallel_gemms, run_main, run_ort
from dlcc.errors import ConfigError
from dlcc.verify import DEFAULT_TOLERANCE

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "resnet-tiny.onnx"
needs_opencl = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")


cli = run_main


def _gemm_kernels(plan):
    return [k for k in plan["kernels"] if k["kind"] == "gemm"]


def _max_err(cm, path):
    import onnx

    feeds = cm.sample_inputs(0)
    got = cm.executor().run(feeds)
    names = [o.name for o in onnx.load(str(path), load_external_data=False).graph.output]
    ref = dict(zip(names, run_ort(path, feeds, names)))
    return max(float(np.abs(got[n].astype(np.float64) - ref[n]).max()) for n in ref), got, ref


@needs_opencl
@pytest.mark.parametrize("name,pipeline", [("cnn", "full"), ("bert", "astitch"), ("lstm", "baseline")])
def test_tf32_models_match_onnxruntime(model_path, name, pipeline):
    """Every GEMM/conv runs on the tensor-core template, and the outputs are within the tf32
    tolerance of onnxruntime's float32, while visibly not the fp32 plan's (TF32 is really used)."""
    path = model_path(name)
    tf = dlcc.compile(path, target="opencl", pipeline=pipeline, precision="tf32")
    assert tf.plan["meta"]["precision"] == "tf32" and "emulated" in tf.plan["meta"]["precision_note"]
    gk = _gemm_kernels(tf.plan)
    assert gk and all(k["math"] == "tf32" and k["tiling"].startswith("tc") for k in gk), gk
    err_tf, got, ref = _max_err(tf, path)
    rtol, atol = DEFAULT_TOLERANCE["tf32"]
    for n in ref:
        np.testing.assert_allclose(got[n], ref[n], rtol=rtol, atol=atol, err_msg=n)
    fp = dlcc.compile(path, target="opencl", pipeline=pipeline)
    assert fp.plan["meta"]["precision"] == "fp32" and all(k["math"] == "float32" for k in fp.plan["kernels"])
    err_fp, _, _ = _max_err(fp, path)
    assert err_tf > 4 * err_fp, (err_tf, err_fp)


@needs_opencl
@pytest.mark.parametrize("name,pipeline", [("bert", "astitch"), ("cnn", "full")])
def test_tf32x3_models_match_onnxruntime_at_float32s_tolerance(model_path, name, pipeline):
    """tf32x3 runs every GEMM/conv on the tensor-core template (three TF32 mmas a product, the
    operands kept float32) and lands within fp32's tolerance of onnxruntime, its error within
    twice the fp32 plan's, where plain tf32 is far off (the split really happens)."""
    path = model_path(name)
    x3 = dlcc.compile(path, target="opencl", pipeline=pipeline, precision="tf32x3")
    assert x3.plan["meta"]["precision"] == "tf32x3" and "emulated" in x3.plan["meta"]["precision_note"]
    gk = _gemm_kernels(x3.plan)
    assert gk and all(k["math"] == "tf32x3" and k["tiling"].endswith(("tf32x3", "_sk2", "_sk4", "_sk8")) for k in gk), gk
    assert all(t["dtype"] != "bfloat16" and t["dtype"] != "float16" for t in x3.plan["tensors"].values())
    err_x3, got, ref = _max_err(x3, path)
    rtol, atol = DEFAULT_TOLERANCE["tf32x3"]
    assert (rtol, atol) == DEFAULT_TOLERANCE["fp32"]
    for n in ref:
        np.testing.assert_allclose(got[n], ref[n], rtol=rtol, atol=atol, err_msg=n)
    err_fp, _, _ = _max_err(dlcc.compile(path, target="opencl", pipeline=pipeline), path)
    err_tf, _, _ = _max_err(dlcc.compile(path, target="opencl", pipeline=pipeline, precision="tf32"), path)
    assert err_x3 <= 2 * err_fp and err_tf > 20 * err_x3, (err_x3, err_fp, err_tf)


def _weights(plan) -> dict[str, str]:
    return {n: t["dtype"] for n, t in plan["tensors"].items() if t["storage"] == "weights"}


@needs_opencl
@pytest.mark.parametrize("name,pipeline,precision", [("cnn", "full", "fp16"), ("cnn", "full", "bf16"),
                                                     ("bert", "astitch", "bf16"), ("lstm", "baseline", "fp16")])
def test_half_models_match_onnxruntime(model_path, name, pipeline, precision):
    """At fp16 and bf16 every GEMM/conv runs on the m16n8k16 template with its weights stored in
    the half type (half the bytes), and the outputs are within the precision's tolerance of
    onnxruntime's float32. The LSTM's gate weights are not MatMul/Gemm/Conv inputs: they stay
    float32, and are rounded as the template stages them."""
    path = model_path(name)
    cm = dlcc.compile(path, target="opencl", pipeline=pipeline, precision=precision)
    gk = _gemm_kernels(cm.plan)
    assert gk and all(k["math"] == precision and k["tiling"].endswith(precision) for k in gk), gk
    half = {"fp16": "float16", "bf16": "bfloat16"}[precision]
    w = _weights(cm.plan)
    if name != "lstm":
        fp = dlcc.compile(path, target="opencl", pipeline=pipeline)
        narrowed = [n for n, d in w.items() if d == half]
        # (a first conv's weight, K = 3 x 3 x 3, is also stored transposed: ops/matmul.py transposed_weight)
        assert narrowed and all(n.removeprefix("%T:").startswith(f"%{half}:") for n in narrowed)
        w32 = {n: t["nbytes"] for n, t in fp.plan["tensors"].items() if t["storage"] == "weights"}
        for n in narrowed:  # the same values in half the bytes
            assert cm.plan["tensors"][n]["nbytes"] * 2 == w32[n.removeprefix("%T:").split(":", 1)[1]]
        assert any("stored as " + half in x for x in cm.plan["meta"]["pass_log"])
    _, got, ref = _max_err(cm, path)
    rtol, atol = DEFAULT_TOLERANCE[precision]
    for n in ref:
        np.testing.assert_allclose(got[n], ref[n], rtol=rtol, atol=atol, err_msg=n)


def _tied(path):
    """A weight read both by a Gather (an embedding) and by a Gemm (the LM head), a Gemm whose
    A operand is the constant (transA), and a depthwise Conv (a map kernel, not the template)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(4)
    E = numpy_helper.from_array(rng.standard_normal((40, 24)).astype(np.float32), "E")
    A = numpy_helper.from_array(rng.standard_normal((24, 40)).astype(np.float32), "A")  # Gemm A, transA: 40 x 24
    dw = numpy_helper.from_array(rng.standard_normal((4, 1, 3, 3)).astype(np.float32), "dw")
    nodes = [helper.make_node("Gather", ["E", "ids"], ["emb"]),  # [5, 24]
             helper.make_node("Gemm", ["emb", "E"], ["logits"], transB=1),  # [5, 40]
             helper.make_node("Gemm", ["A", "emb"], ["g"], transA=1, transB=1),  # [40, 5]
             helper.make_node("Conv", ["img", "dw"], ["c"], group=4, pads=[1, 1, 1, 1])]
    g = helper.make_graph(nodes, "tied",
                          [helper.make_tensor_value_info("ids", TensorProto.INT64, [5]),
                           helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 4, 6, 6])],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in
                           (("emb", [5, 24]), ("logits", [5, 40]), ("g", [40, 5]), ("c", [1, 4, 6, 6]))],
                          [E, A, dw])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@needs_opencl
def test_narrowing_keeps_float32_where_another_op_reads_the_weight(tmp_path):
    """A tied embedding stays float32 for its Gather (the embedding output is exact) while the LM
    head reads a bfloat16 copy; a constant Gemm A operand is narrowed; a depthwise Conv's weight
    (read by a map kernel, not the tensor-core template) stays float32."""
    path = _tied(tmp_path / "tied.onnx")
    cm = dlcc.compile(path, target="opencl", pipeline="full", precision="bf16")
    w = _weights(cm.plan)
    assert w.get("%bfloat16:A") == w.get("%bfloat16:E") == "bfloat16" and w.get("E") == "float32"
    assert w.get("dw") == "float32" and "%bfloat16:dw" not in w
    feeds = {"ids": np.array([0, 3, 39, 7, 3], np.int64),
             "img": np.random.default_rng(5).standard_normal((1, 4, 6, 6)).astype(np.float32)}
    got = cm.executor().run(feeds)
    ref = dict(zip(["emb", "logits", "g", "c"], run_ort(path, feeds, ["emb", "logits", "g", "c"])))
    np.testing.assert_array_equal(got["emb"], ref["emb"])  # gathered from the float32 weight
    np.testing.assert_allclose(got["c"], ref["c"], rtol=1e-5, atol=1e-5)  # depthwise: float32 arithmetic
    rtol, atol = DEFAULT_TOLERANCE["bf16"]
    for n in ("logits", "g"):
        np.testing.assert_allclose(got[n], ref[n], rtol=rtol, atol=atol, err_msg=n)


def _misaligned(path):
    """GEMM weights that cp.async cannot copy as stored, and can transposed: a MatMul's B of
    [K, 50] (GPT-2's LM head is [768, 50257]), a Gemm's B with K = 50 (transB), and a first Conv
    over 3 channels (K = 3 x 3 x 3). The MatMul's B is also read by an Add, which keeps it."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    init = [numpy_helper.from_array((0.2 * rng.standard_normal(s)).astype(np.float32), n)
            for n, s in (("W1", (32, 50)), ("W2", (16, 50)), ("W3", (16, 3, 3, 3)))]
    init.append(numpy_helper.from_array(np.array([16, 50], np.int64), "shp"))
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["y1"]),
             helper.make_node("Reshape", ["y1", "shp"], ["y1r"]),
             helper.make_node("Gemm", ["y1r", "W2"], ["y2"], transB=1),
             helper.make_node("Add", ["W1", "z"], ["w2x"]),
             helper.make_node("Conv", ["img", "W3"], ["y3"], pads=[1, 1, 1, 1])]
    outs = (("y1", [1, 16, 50]), ("y2", [16, 16]), ("w2x", [32, 50]), ("y3", [1, 16, 8, 8]))
    g = helper.make_graph(nodes, "misaligned",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32]),
                           helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 3, 8, 8]),
                           helper.make_tensor_value_info("z", TensorProto.FLOAT, [32, 50])],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outs], init)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@needs_opencl
@pytest.mark.parametrize("precision", ["bf16", "fp16", "tf32", "fp32"])
def test_misaligned_weights_are_stored_transposed_for_cp_async(tmp_path, precision):
    """A constant operand whose rows are no whole number of 16-byte chunks is stored transposed
    at every tensor-core precision, so that the cp.async pipeline copies it (it was loaded two
    bytes at a time through registers); the Add still reads the original; the results match
    onnxruntime. At fp32 (the SIMT template) nothing is transposed."""
    path = _misaligned(tmp_path / "m.onnx")
    cm = dlcc.compile(path, target="opencl", pipeline="baseline", device="h100", precision=precision)
    logged = [x for x in cm.plan["meta"]["pass_log"] if "stored transposed" in x]
    w = _weights(cm.plan)
    if precision == "fp32":
        assert not logged and not any(n.startswith("%T:") for n in w)
    else:
        assert len(logged) == 1 and logged[0].endswith(": W1, W2, W3"), logged
        assert sum(n.startswith("%T:") for n in w) == 3 and "W1" in w  # the Add's
        if precision != "tf32":  # (these small GEMMs take the register-staged template at tf32)
            src = cm.source("cuda")
            for ptr in ("B", "W"):
                assert re.search(r"CP_ASYNC16\([^;]*\b%s \+" % ptr, src), ptr
    err, got, ref = _max_err(cm, path)
    rtol, atol = DEFAULT_TOLERANCE[precision]
    for n in ref:
        np.testing.assert_allclose(got[n], ref[n], rtol=rtol, atol=atol, err_msg=n)


@needs_opencl
@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_rammer_runs_tensor_core_rtasks(tmp_path, precision):
    """On an H100 plan, Rammer co-schedules tensor-core rTasks in a persistent kernel (every
    tiling has its 256 threads), re-tiles them only within their template and precision, and its
    waves tell the cost model which FLOPs run at the tensor cores' peak. The persistent kernel
    runs right on PoCL."""
    path = parallel_gemms(tmp_path / "g.onnx", 3, M=64, K=96, N=96)  # small: PoCL builds it fast
    cm = dlcc.compile(path, target="opencl", pipeline="rammer", device="h100", precision=precision)
    (L,) = [L for L in cm.plan["launches"] if L.get("rprogram")]
    (w,) = L["rprogram"]["waves"]
    assert w["math_flops"] == {precision: w["flops"]} and w["flops"] == 3 * 2 * 64 * 96 * 96
    assert all(k["tiling"].startswith("tc") and k["math"] == precision for k in _gemm_kernels(cm.plan))
    err, got, ref = _max_err(cm, path)
    rtol, atol = DEFAULT_TOLERANCE[precision]
    for n in ref:
        np.testing.assert_allclose(got[n], ref[n], rtol=rtol, atol=atol, err_msg=n)


def test_precision_from_the_pipeline_file_and_the_override(tmp_path):
    pipe = tmp_path / "tc.yaml"
    pipe.write_text("name: tc\nprecision: tf32\npasses:\n  - name: lower\n  - name: memplan\n")
    cm = dlcc.compile(EXAMPLE, target="opencl", pipeline=str(pipe))
    assert cm.plan["meta"]["precision"] == "tf32" and all(k["math"] == "tf32" for k in _gemm_kernels(cm.plan))
    cm = dlcc.compile(EXAMPLE, target="opencl", pipeline=str(pipe), precision="fp32")
    assert cm.plan["meta"]["precision"] == "fp32" and all(k["math"] == "float32" for k in _gemm_kernels(cm.plan))


def test_the_cache_tells_precisions_apart(tmp_path):
    """tf32 from fp32; and an asked-for fp32 from the default, which compiles a half model at its
    own precision on a GPU and refuses a float64 one (tests/test_float64.py)."""
    from dlcc.api import cache_key

    k32 = cache_key(EXAMPLE, {}, "opencl", "baseline", None, cache=tmp_path)[1]
    ktf = cache_key(EXAMPLE, {}, "opencl", "baseline", None, cache=tmp_path, precision="tf32")[1]
    assert k32 != ktf
    asked = cache_key(EXAMPLE, {}, "opencl", "baseline", None, cache=tmp_path, precision="fp32")[1]
    assert asked != k32
    assert cache_key(EXAMPLE, {}, "opencl", "baseline", None, cache=tmp_path, precision="fp32")[1] == asked


def test_precisions_a_device_cannot_do_are_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="tf32 needs tensor cores.*sm_80 or newer.*V100.*sm_70"):
        dlcc.compile(EXAMPLE, target="opencl", device="v100", precision="tf32")
    with pytest.raises(ConfigError, match="bf16 needs tensor cores.*sm_80 or newer.*V100.*sm_70"):
        dlcc.compile(EXAMPLE, target="opencl", device="v100", precision="bf16")
    rc, out, err = cli("compile", EXAMPLE, "-o", tmp_path / "a", "--precision", "fp8")
    assert rc == 2 and "unknown precision 'fp8'" in err and "fp32, tf32x3, tf32, fp16, bf16" in err
    assert "Traceback" not in out + err and not (tmp_path / "a").exists()
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nprecision: tf33\npasses:\n  - name: lower\n  - name: memplan\n")
    rc, out, err = cli("compile", EXAMPLE, "-o", tmp_path / "b", "-p", bad)
    assert rc == 2 and "bad.yaml" in err and "precision" in err and "Traceback" not in out + err


def _big_matmul(path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((2048, 2048)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1024, 2048])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1024, 2048])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_estimate_ranks_precisions(tmp_path):
    """`dlcc estimate -p baseline --precision fp32 --precision tf32 --precision bf16` ranks the
    three plans; on an H100 the tensor cores' peaks make tf32 the faster for a model whose time is
    in its GEMMs, and bf16 (twice TF32's peak, half the weight bytes) faster still."""
    rc, out, err = cli("estimate", _big_matmul(tmp_path / "mm.onnx"), "-d", "h100", "-p", "baseline",
                       "--precision", "fp32", "--precision", "tf32", "--precision", "bf16", "--json", "-q")
    assert rc == 0, err
    d = json.loads(out)
    rows = {p["name"]: p["predicted_ms"] for p in d["pipelines"]}
    assert set(rows) == {"baseline@fp32", "baseline@tf32", "baseline@bf16"}
    assert rows["baseline@tf32"] < 0.5 * rows["baseline@fp32"], rows
    assert rows["baseline@bf16"] < rows["baseline@tf32"], rows
    rc, out, err = cli("estimate", EXAMPLE, "-d", "v100", "-p", "baseline", "--precision", "tf32", "-q")
    assert rc == 2 and "sm_70" in err and "Traceback" not in out + err


@needs_opencl
def test_verify_uses_the_precisions_tolerance():
    rc, out, err = cli("verify", EXAMPLE, "-t", "opencl", "--precision", "tf32", "--json", "-q")
    d = json.loads(out)
    assert rc == 0 and d["passed"] and d["precision"] == "tf32"
    assert (d["rtol"], d["atol"]) == DEFAULT_TOLERANCE["tf32"] and d["tolerance_from"] == "tf32 default"


@needs_opencl
def test_batch_precision_axis(tmp_path, capsys):
    """A manifest's `precisions:` list is a matrix axis: a job per precision, named for it, each
    compiled at it and verified at its default tolerance."""
    import shutil

    from dlcc.batch import load_manifest
    from dlcc.cli import main

    shutil.copy(EXAMPLE, tmp_path / "resnet.onnx")
    m = tmp_path / "m.yaml"
    m.write_text("defaults: {target: opencl}\njobs:\n  - model: resnet.onnx\n    precisions: [fp32, tf32]\n"
                 "    verify: true\n")
    jobs = {j.name: j for j in load_manifest(m)}
    assert set(jobs) == {"resnet-baseline-fp32-default-opencl", "resnet-baseline-tf32-default-opencl"}
    tf = jobs["resnet-baseline-tf32-default-opencl"]
    assert tf.precision == "tf32" and (tf.verify.rtol, tf.verify.atol) == DEFAULT_TOLERANCE["tf32"]
    with pytest.raises(SystemExit) as e:
        main(["batch", str(m), "-j", "1", "--out", str(tmp_path / "out"), "--json"])
    assert e.value.code == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert all(r["outcome"] == "passed" for r in rows.values()), rows
    plan = json.loads((tmp_path / "out" / "resnet-baseline-tf32-default-opencl" / "plan.json").read_text())
    assert plan["meta"]["precision"] == "tf32"
    bad = tmp_path / "bad.yaml"
    bad.write_text("jobs:\n  - model: resnet.onnx\n    precision: fp8\n")
    with pytest.raises(Exception, match="bad.yaml.*precision"):
        load_manifest(bad)


def test_auto_ranks_the_pipelines_at_the_compiles_precision():
    cm = dlcc.compile(EXAMPLE, target="opencl", pipeline="auto", precision="tf32")
    choice = cm.plan["meta"]["pipeline_choice"]
    assert cm.plan["meta"]["precision"] == "tf32" and "@" not in cm.plan["meta"]["pipeline"]
    assert all(r["name"].endswith("@tf32") for r in choice["ranking"]) and choice["chosen"] == cm.plan["meta"]["pipeline"]


def _generated_gemm_seeds(k: int) -> list[int]:
    """The first k fuzzer seeds whose graph has a GEMM, convolution or RNN (dlcc/testing/graphgen)."""
    from dlcc.testing import graphgen

    gemm = {"MatMul", "Gemm", "Conv", "ConvTranspose", "LSTM", "GRU", "RNN"}
    out, seed = [], 0
    while len(out) < k:
        try:
            if set(graphgen.generate_valid(seed).ops) & gemm:
                out.append(seed)
        except graphgen.InvalidCase:
            pass
        seed += 1
    return out


@needs_opencl
@pytest.mark.parametrize("precision,count", [("tf32", 6), ("bf16", 3)])
def test_generated_graphs_at_tensor_core_precisions(tmp_path, precision, count):
    """The fuzzer's odd shapes (broadcast batches, transposed operands, grouped and strided
    convolutions, fused prologues and epilogues, half weights beside float32 ones) through `full`
    at tf32 and bf16, against onnxruntime at the precision's tolerance."""
    import onnx

    from dlcc.testing import graphgen

    rtol, atol = DEFAULT_TOLERANCE[precision]
    for seed in _generated_gemm_seeds(count):
        case = graphgen.generate_valid(seed)
        path = tmp_path / f"g{seed}.onnx"
        onnx.save(case.model, path)
        got = dlcc.compile(path, target="opencl", pipeline="full", precision=precision)(case.feeds)
        for name, ref in case.refs.items():
            if ref.dtype.kind == "f":
                np.testing.assert_allclose(got[name], ref, rtol=rtol, atol=atol, err_msg=f"seed {seed}: {name}")
            else:
                np.testing.assert_array_equal(got[name], ref, err_msg=f"seed {seed}: {name}")


@needs_opencl
@pytest.mark.parametrize("name", ["cnn", "bert"])
def test_float16_model_at_fp16(model_path, name, tmp_path):
    """A float16 model (onnxconverter-common) at precision fp16: its inputs and outputs stay
    float16, its GEMM weights go back to float16 storage (widened at import, narrowed at
    lowering: the same values where no pass changed them), and its outputs are within the fp16
    tolerance of onnxruntime running the float16 model."""
    import onnx

    float16 = pytest.importorskip("onnxconverter_common.float16")
    import models

    from dlcc.verify import verify_outputs

    path = tmp_path / f"{name}-fp16.onnx"
    model16 = float16.convert_float_to_float16(onnx.load(model_path(name)))
    onnx.save(model16, path)
    m = dlcc.compile(path, target="opencl", pipeline="full", precision="fp16")
    assert all(t["dtype"] == "float16" for t in m.outputs)
    assert [d for d in _weights(m.plan).values() if d == "float16"]
    feeds = {k: (v.astype(np.float16) if v.dtype == np.float32 else v)
             for k, v in models.sample_inputs(name, model_path(name), seed=0).items()}
    got = m(feeds)
    assert all(g.dtype == np.float16 for g in got.values())
    rows = verify_outputs(path, got, feeds, *DEFAULT_TOLERANCE["fp16"])
    assert all(r["passed"] for r in rows), rows


@needs_opencl
def test_fp32_ops_keep_op_types_on_the_float32_template(model_path, tmp_path):
    """A pipeline's `fp32_ops:` keeps those op types' GEMMs in float32 at a tensor-core precision
    (their weights too); the plan's meta, the pass log and `inspect` list every compute op kept
    float32, whether by the list or for want of a tensor-core kernel; an unknown op type is an
    error naming the file and the field."""
    pipe = tmp_path / "keep.yaml"
    pipe.write_text("name: keep\nprecision: bf16\nfp32_ops: [MatMul]\npasses:\n  - name: lower\n  - name: memplan\n")
    path = model_path("bert")
    cm = dlcc.compile(path, target="opencl", pipeline=str(pipe))
    maths = {L["op_type"]: cm.plan["kernels"][[k["name"] for k in cm.plan["kernels"]].index(L["kernel"])]["math"]
             for L in cm.plan["launches"] if L["op_type"] in ("MatMul", "Gemm")}
    assert maths == {"MatMul": "float32", "Gemm": "bf16"}, maths
    kept = cm.plan["meta"]["float32_compute"]
    assert set(kept) == {"MatMul"} and kept["MatMul"] > 0
    _, got, ref = _max_err(cm, path)
    for n in ref:
        np.testing.assert_allclose(got[n], ref[n], *DEFAULT_TOLERANCE["bf16"], err_msg=n)
    rc, out, err = cli("inspect", path, "-p", pipe, "-q")
    assert rc == 0 and "compute ops kept float32 at bf16" in out and "MatMul x" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nprecision: bf16\nfp32_ops: [Gemm, MatMull]\npasses:\n  - name: lower\n  - name: memplan\n")
    rc, out, err = cli("compile", path, "-o", tmp_path / "o", "-p", bad)
    assert rc == 2 and "bad.yaml: fp32_ops.1: 'MatMull'" in err and "Traceback" not in out + err


def test_the_emulation_note_names_the_gpu_a_plan_is_for():
    """A GPU spec's plan built for OpenCL (`dlcc inspect --device h100` on a machine without a GPU)
    says which GPU it is planned for, beside the note that OpenCL emulates its mma instructions;
    PoCL's own plan says only the latter."""
    from dlcc.config import check_precision, load_device

    assert check_precision("bf16", load_device("h100"), "opencl").startswith(
        "precision bf16 planned for NVIDIA H100 SXM; on opencl: no tensor cores there")
    assert check_precision("bf16", load_device("pocl-cpu"), "opencl").startswith("precision bf16 on opencl: no tensor")
    assert check_precision("bf16", load_device("h100"), "cuda") is None
