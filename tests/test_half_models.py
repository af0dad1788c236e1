"""float16 and bfloat16 models: their inputs and outputs keep the model's dtype, they compute in
float32 inside (or at their own precision on tensor cores), and `verify`'s reference is
onnxruntime on the model widened to float32, its outputs rounded to their own type."""
from __future__ import annotations

import json
import subprocess
import sys

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dlcc
from conftest import opencl_device_available
from dlcc.compiler import _model_precision, import_checked
from dlcc.config import load_device, load_pipeline
from dlcc.verify import default_tolerance, run_onnxruntime, verify_outputs

BF16 = np.dtype(ml_dtypes.bfloat16)
needs_opencl = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")


def _export_bf16_encoder(path):
    """A transformer encoder layer between two Linears, exported by torch in bfloat16: Gemm,
    MatMul, Softmax, LayerNormalization, ReduceMean, all typed bfloat16."""
    torch = pytest.importorskip("torch")

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = torch.nn.Linear(8, 16)
            self.enc = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
            self.head = torch.nn.Linear(16, 5)

        def forward(self, x):
            h = self.enc(torch.relu(self.inp(x)))
            return self.head(h.mean(1)), h

    torch.manual_seed(0)
    m = M().to(torch.bfloat16).eval()
    x = torch.randn(2, 12, 8, dtype=torch.bfloat16)
    torch.onnx.export(m, (x,), str(path), dynamo=False, input_names=["x"], output_names=["logits", "h"])
    return path


@pytest.fixture(scope="module")
def bf16_model(tmp_path_factory):
    return _export_bf16_encoder(tmp_path_factory.mktemp("bf16") / "encoder-bf16.onnx")


@needs_opencl
@pytest.mark.parametrize("pipeline,precision", [("baseline", None), ("full", None), ("astitch", "bf16")])
def test_bfloat16_model_matches_the_widened_reference(bf16_model, pipeline, precision):
    m = dlcc.compile(bf16_model, target="opencl", pipeline=pipeline, precision=precision)
    assert [t["dtype"] for t in m.inputs] == ["bfloat16"]
    assert [t["dtype"] for t in m.outputs] == ["bfloat16", "bfloat16"]
    assert m.plan["meta"]["precision"] == (precision or "fp32")  # OpenCL: float32 unless asked
    feeds = m.sample_inputs(0)
    got = m(feeds)
    assert all(g.dtype == BF16 for g in got.values())
    rows = verify_outputs(bf16_model, got, feeds, precision=m.plan["meta"]["precision"])
    assert all(r["passed"] for r in rows), rows
    assert all((r["rtol"], r["atol"]) == (0.05, 0.05) for r in rows)  # bfloat16 outputs: at least bf16's pair
    # and the comparison can fail: one output two units in its last place off in one element
    bad = dict(got)
    h = bad["h"].astype(np.float32)
    h.flat[0] = h.flat[0] * 1.125 + 0.25
    bad["h"] = h.astype(BF16)
    assert not verify_outputs(bf16_model, bad, feeds, precision="fp32")[1]["passed"]


def test_the_reference_widens_casts_constants_and_rounds_outputs(tmp_path):
    """Cast to bfloat16 inside, a bfloat16 Constant and a ConstantOfShape's value: onnxruntime has
    no bfloat16 Add or Mul, so only the widened model runs; its outputs come back in bfloat16."""
    c = np.array([0.3, -1.7, 2.5], dtype=BF16)
    nodes = [
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(c, "c")),
        helper.make_node("Cast", ["x"], ["xb"], to=TensorProto.BFLOAT16),
        helper.make_node("Mul", ["xb", "c"], ["p"]),
        helper.make_node("ConstantOfShape", ["shape"], ["ones"],
                         value=numpy_helper.from_array(np.array([1.5], dtype=BF16), "v")),
        helper.make_node("Add", ["p", "ones"], ["y"]),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                          [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [3])],
                          [numpy_helper.from_array(np.array([3], np.int64), "shape")])
    path = tmp_path / "casts.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]), path)
    x = np.array([1.01, 2.02, -3.03], np.float32)
    (y,) = run_onnxruntime(str(path), {"x": x})
    # the Cast to bfloat16 inside became a Cast to float32, as in dlcc's own import (x is not
    # rounded: that would give -1.9297 for the second element); only the output is rounded
    want = (x * c.astype(np.float32) + 1.5).astype(BF16)
    assert y.dtype == BF16 and np.array_equal(y.view(np.uint16), want.view(np.uint16))


def test_a_mixed_precision_model_is_widened_too(tmp_path):
    """float32 inputs and outputs around float16 weights and Casts (onnxruntime's float16
    converter with keep_io_types): the reference is the widened model, not onnxruntime rounding
    every intermediate to float16, which a float32 plan is not."""
    w = (np.arange(12, dtype=np.float32).reshape(3, 4) / 7).astype(np.float16)
    nodes = [helper.make_node("Cast", ["x"], ["xh"], to=TensorProto.FLOAT16),
             helper.make_node("MatMul", ["xh", "w"], ["yh"]),
             helper.make_node("Cast", ["yh"], ["y"], to=TensorProto.FLOAT)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [numpy_helper.from_array(w, "w")])
    path = tmp_path / "mixed.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    x = np.array([[1.001, 2.003, -3.007], [0.1, 0.2, 0.3]], np.float32)
    (y,) = run_onnxruntime(str(path), {"x": x})
    want = x.astype(np.float64) @ w.astype(np.float64)  # x not rounded to float16, nor the product
    assert y.dtype == np.float32 and np.allclose(y, want, rtol=1e-6, atol=0)
    rounded = (x.astype(np.float16) @ w).astype(np.float32)  # what float16 intermediates give
    assert not np.allclose(rounded, want, rtol=1e-6, atol=0)


def test_a_half_model_computes_at_its_own_precision_where_tensor_cores_are(bf16_model, tmp_path):
    """No precision asked for: bf16 on an sm_80+ CUDA device, float32 on OpenCL and on an older GPU
    (with a note each time); a precision set in the pipeline file or on the command line wins."""
    graph = import_checked(bf16_model, None)
    pipe = load_pipeline("baseline")
    h100 = load_device("h100")
    assert _model_precision(pipe, None, graph, h100, "cuda")[0].precision == "bf16"
    for dev, target in [(h100, "opencl"), (h100.model_copy(update={"arch": "sm_75"}), "cuda")]:
        kept, note = _model_precision(pipe, None, graph, dev, target)
        assert kept.precision == "fp32" and "computes in float32" in note and "--precision bf16" in note
    explicit = tmp_path / "p.yaml"
    explicit.write_text("name: p\nprecision: fp32\npasses:\n  - name: lower\n  - name: memplan\n")
    own = load_pipeline(str(explicit))
    assert _model_precision(own, None, graph, h100, "cuda") == (own, None)
    assert _model_precision(pipe, "fp32", graph, h100, "cuda") == (pipe, None)


@needs_opencl
def test_cli_run_and_verify_take_bfloat16(bf16_model, tmp_path):
    """`dlcc run -i` reads bfloat16 inputs from an .npz (numpy keeps them as 2-byte voids), and
    `dlcc verify` says which tolerance it used for bfloat16 outputs."""
    x = np.random.default_rng(1).standard_normal((2, 12, 8)).astype(BF16)
    np.savez(tmp_path / "in.npz", x=x)
    art = tmp_path / "art"
    cmd = [sys.executable, "-m", "dlcc.cli"]
    assert subprocess.run(cmd + ["compile", str(bf16_model), "-o", str(art), "-q"], capture_output=True).returncode == 0
    p = subprocess.run(cmd + ["run", str(art), "-i", str(tmp_path / "in.npz")], capture_output=True, text=True)
    assert p.returncode == 0 and "bfloat16" in p.stdout, p.stdout + p.stderr
    p = subprocess.run(cmd + ["verify", str(bf16_model), "--json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    d = json.loads(p.stdout.strip().splitlines()[-1])
    assert d["passed"] and "bfloat16 outputs: at least their type's" in d["tolerance_from"]


def test_default_tolerance_is_the_looser_of_precision_and_output_type():
    assert default_tolerance("fp32", "float32") == (1e-3, 1e-4)
    assert default_tolerance("fp32", "float16") == (1e-2, 1e-2)
    assert default_tolerance("tf32", "bfloat16") == (5e-2, 5e-2)
    assert default_tolerance("bf16", "float16") == (5e-2, 5e-2)


@needs_opencl
def test_batch_verify_judges_half_outputs_at_their_type(bf16_model, tmp_path, capsys):
    """In `dlcc batch`, a verify with `half_output_floor` (what default tolerances imply) judges a
    bfloat16 output at least at bf16's pair, as `dlcc verify` does; tolerances the manifest gives
    without it are kept as they are (fp32's pair is tighter than what computing at bf16 changes,
    so that job fails). At fp32 the model matches its widened reference exactly, its folded
    constants included, so both jobs compute at bf16."""
    import shutil

    from dlcc.cli import main

    shutil.copy(bf16_model, tmp_path / "enc.onnx")
    m = tmp_path / "m.yaml"
    m.write_text("defaults: {target: opencl, precision: bf16}\njobs:\n  - model: enc.onnx\n    name: floor\n"
                 "    verify: {rtol: 1e-3, atol: 1e-4, half_output_floor: true}\n"
                 "  - model: enc.onnx\n    name: given\n    verify: {rtol: 1e-3, atol: 1e-4}\n")
    with pytest.raises(SystemExit):
        main(["batch", str(m), "-j", "1", "--no-cache", "--out", str(tmp_path / "out"), "--json"])
    rows = {r["name"].split("-")[0]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["floor"]["outcome"] == "passed" and rows["given"]["outcome"] == "failed", rows


@needs_opencl
@pytest.mark.parametrize("half", [TensorProto.BFLOAT16, TensorProto.FLOAT16])
def test_folded_constants_of_a_half_model_compute_in_float32_as_the_run_does(half, tmp_path):
    """A node of a float16 or bfloat16 model whose inputs are all constants is folded at compile
    time in float32, as the same node computes at run time and as verify's widened reference
    has it: a PRelu of two bfloat16 weights, and a Cast of a float32 constant to the half type,
    are not rounded to the half type before a float32 output reads them. (Folded in the model's
    own type, they were half an ulp of bfloat16 off: the bf16-model fuzz run, graph 900023.)
    A folded constant that is itself a graph output is rounded once to its type, however many
    folds made it. (onnxruntime's folder, which would fold in float16, does not see half models.)"""
    dt = BF16 if half == TensorProto.BFLOAT16 else np.dtype(np.float16)
    w = np.array([-0.8203125, 0.24511719, -0.62890625], dtype=dt)
    s = np.array([-0.40625], dtype=dt)
    c = np.array([0.1234567, -3.3333333, 7.7777777], np.float32)
    nodes = [
        helper.make_node("PRelu", ["w", "s"], ["p"]),
        helper.make_node("Cast", ["x"], ["xh"], to=half),
        helper.make_node("Add", ["xh", "p"], ["yh"]),
        helper.make_node("Cast", ["yh"], ["y"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["c"], ["ch"], to=half),
        helper.make_node("Cast", ["ch"], ["cf"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["x", "cf"], ["u"]),
        helper.make_node("Mul", ["w", "s"], ["z"]),
        helper.make_node("Neg", ["w"], ["nw"]),
        helper.make_node("Softmax", ["nw"], ["sm"], axis=0),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3]),
                           helper.make_tensor_value_info("u", TensorProto.FLOAT, [3]),
                           helper.make_tensor_value_info("z", half, [3]),
                           helper.make_tensor_value_info("sm", half, [3])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(s, "s"),
                           numpy_helper.from_array(c, "c")])
    path = tmp_path / "folded.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]), path)
    x = np.array([0.5, -0.25, 1.0], np.float32)
    m = dlcc.compile(str(path), target="opencl", pipeline="baseline")
    got = m({"x": x})
    w32, s32 = w.astype(np.float32), s.astype(np.float32)
    p = np.where(w32 > 0, w32, w32 * s32)  # exact in float32: two 8- or 11-bit significands
    np.testing.assert_array_equal(got["y"], x + p)
    np.testing.assert_array_equal(got["u"], x + c)
    assert got["z"].dtype == dt and np.array_equal(got["z"].view(np.uint16), (w32 * s32).astype(dt).view(np.uint16))
    # two folds in a row: the second reads the first's float32 value, and the output keeps its type
    # (it came out float32: the bf16-model fuzz run at bf16, graph 910148)
    e = np.exp(-w32 - (-w32).max())
    assert got["sm"].dtype == dt and np.array_equal(got["sm"].view(np.uint16), (e / e.sum()).astype(dt).view(np.uint16))
    rows = verify_outputs(str(path), got, {"x": x})
    assert all(r["passed"] for r in rows) and rows[0]["max_abs_err"] == 0.0, rows


@needs_opencl
def test_a_half_models_batchnorm_is_not_fused_in_float16(tmp_path):
    """onnxruntime's folding fuses a BatchNormalization into the Conv before it, in the model's
    float16: the fused weights, rounded to float16, put a float16 model at fp32 3.5% off on its
    small outputs (fuzz graph 950025, `--half-models`). A half model is folded by dlcc alone, in
    float32, and matches its widened reference at fp32's tolerance."""
    r = np.random.default_rng(5)
    h16 = lambda a: numpy_helper.from_array(np.asarray(a, np.float16), None)  # noqa: E731
    inits = {"w": r.standard_normal((16, 1, 5)), "b": r.standard_normal(16), "scale": r.uniform(0.5, 2, 16),
             "beta": r.standard_normal(16), "mean": r.standard_normal(16), "var": r.uniform(0.01, 0.3, 16)}
    tensors = []
    for k, v in inits.items():
        t = h16(v)
        t.name = k
        tensors.append(t)
    nodes = [helper.make_node("Cast", ["x"], ["xh"], to=TensorProto.FLOAT16),
             helper.make_node("Conv", ["xh", "w", "b"], ["c"], group=16, dilations=[2], pads=[5, 5], kernel_shape=[5]),
             helper.make_node("BatchNormalization", ["c", "scale", "beta", "mean", "var"], ["bh"]),
             helper.make_node("Cast", ["bh"], ["y"], to=TensorProto.FLOAT)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 12])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 14])], tensors)
    path = tmp_path / "conv_bn.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    x = r.standard_normal((1, 16, 12)).astype(np.float16).astype(np.float32)
    for pipeline in ("baseline", "astitch"):
        got = dlcc.compile(str(path), target="opencl", pipeline=pipeline)({"x": x})
        rows = verify_outputs(str(path), got, {"x": x})
        assert rows[0]["passed"] and rows[0]["max_rel_err"] < 1e-4, (pipeline, rows)


@needs_opencl
@pytest.mark.parametrize("half", [TensorProto.BFLOAT16, TensorProto.FLOAT16])
def test_a_half_models_constants_reach_the_rewrites_that_read_them(half, tmp_path):
    """A rewrite that needs a constant (OneHot's depth, which decides its output's shape) gets one
    in a half model too, where onnxruntime's folding is skipped: the depth a Cast of a half
    constant to float32 (as the bfloat16 retyping keeps an op float32 between Casts), the values
    a Concat of two. dlcc folds what no precision changes (frontend.fold_exact_constants). It was
    refused as "a depth computed at run time" (fuzz graph 1900099, `--more-ops --half-models bf16`)."""
    dt = BF16 if half == TensorProto.BFLOAT16 else np.dtype(np.float16)
    nodes = [helper.make_node("Cast", ["depth_h"], ["depth"], to=TensorProto.FLOAT),
             helper.make_node("Concat", ["off", "on"], ["vals_h"], axis=0),
             helper.make_node("Cast", ["vals_h"], ["vals"], to=TensorProto.FLOAT),
             helper.make_node("OneHot", ["idx", "depth", "vals"], ["oh"], axis=-1),
             helper.make_node("Add", ["x", "oh"], ["y"])]
    inits = [numpy_helper.from_array(np.array(4, dt), "depth_h"), numpy_helper.from_array(np.array([-0.5], dt), "off"),
             numpy_helper.from_array(np.array([2.0], dt), "on")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4]),
                                       helper.make_tensor_value_info("idx", TensorProto.INT64, [3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])], inits)
    path = tmp_path / "onehot.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    feeds = {"x": np.arange(12, dtype=np.float32).reshape(3, 4), "idx": np.array([2, -1, 0], np.int64)}
    for pipeline in ("baseline", "astitch"):
        got = dlcc.compile(str(path), target="opencl", pipeline=pipeline)(feeds)
        want = feeds["x"] + np.where(np.arange(4) == np.array([[2], [3], [0]]), 2.0, -0.5).astype(np.float32)
        np.testing.assert_array_equal(got["y"], want)
        rows = verify_outputs(str(path), got, feeds)
        assert all(r["passed"] for r in rows), rows
