"""A LayerNormalization computed inside the GEMMs that read it (`lower`'s `fold_layernorm`,
ops/fold_norm.py and kernels/row_norm.py): which ones fold, the plans that result, and their
results against onnxruntime on PoCL at fp32, fp16 and bf16, in the SIMT and cp.async templates;
nvcc builds the folded kernels without spills."""
from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

import dlcc
from conftest import nvcc_ptx_and_ptxas, opencl_device_available, run_ort
from dlcc.verify import DEFAULT_TOLERANCE

needs_opencl = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")


def _save(path, nodes, name, x_shape, outs, inits, opset):
    """The graph of `nodes` with float input x of `x_shape`, checked and saved at `path`."""
    g = h.make_graph(nodes, name, [h.make_tensor_value_info("x", TP.FLOAT, x_shape)], outs, inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, path)
    return path


def pre_ln_block(path, M=24, K=64, N=40, mean=0.0, extra_reader=False, bias=True):
    """x + offset -> LN -> Reshape -> MatMul -> + b -> Tanh, and LN' of the same x -> Reshape ->
    Gemm(transB) with a bias; the sum. Both LayerNorms fold unless `extra_reader` makes the
    second one's output a graph output's input too. `mean`: the rows' offset (the accuracy of
    a large mean against a spread of about 1)."""
    rng = np.random.default_rng(0)
    inits = [nh.from_array(np.array([M, K], np.int64), "shp")]

    def c(name, arr):
        inits.append(nh.from_array(np.asarray(arr, np.float32), name))
        return name

    ln1 = ["x1", c("g1", rng.uniform(0.5, 1.5, K))] + ([c("b1", rng.standard_normal(K) * 0.1)] if bias else [])
    nodes = [h.make_node("Add", ["x", c("off", np.full((K,), mean))], ["x1"]),
             h.make_node("LayerNormalization", ln1, ["y1"], axis=-1, epsilon=1e-5),
             h.make_node("Reshape", ["y1", "shp"], ["y1r"]),
             h.make_node("MatMul", ["y1r", c("W1", rng.standard_normal((K, N)) * 0.1)], ["z1"]),
             h.make_node("Add", ["z1", c("bb1", rng.standard_normal(N) * 0.1)], ["z1b"]),
             h.make_node("Tanh", ["z1b"], ["z2"]),
             h.make_node("LayerNormalization", ["x1", c("g2", rng.uniform(0.5, 1.5, K)),
                                                c("b2", rng.standard_normal(K) * 0.1)], ["y2"], axis=-1, epsilon=1e-5),
             h.make_node("Reshape", ["y2", "shp"], ["y2r"]),
             h.make_node("Gemm", ["y2r", c("W2", rng.standard_normal((N, K)) * 0.1), c("C2", rng.standard_normal(N) * 0.1)],
                         ["z3"], transB=1),
             h.make_node("Add", ["z2", "z3"], ["out"])]
    outs = [h.make_tensor_value_info("out", TP.FLOAT, [M, N])]
    if extra_reader:
        nodes.append(h.make_node("Mul", ["y2", "y2"], ["sq"]))
        outs.append(h.make_tensor_value_info("sq", TP.FLOAT, [1, M, K]))
    return _save(path, nodes, "pre_ln", [1, M, K], outs, inits, 17)


def _folded(cm) -> list[str]:
    return [x for x in cm.plan["meta"]["pass_log"] if "RMSNorm(s) computed inside" in x]


def _layernorm_launches(cm) -> int:
    return sum(L.get("op_type") == "LayerNormalization" or "LayerNormalization" in L.get("kernel", "")
               for L in cm.plan["launches"])


def _check(cm, path, precision, seed=0):
    feeds = cm.sample_inputs(seed)
    got = cm.executor().run(feeds)
    names = [o.name for o in onnx.load(str(path)).graph.output]
    ref = dict(zip(names, run_ort(path, feeds, names)))
    rtol, atol = DEFAULT_TOLERANCE[precision]
    for n in ref:
        np.testing.assert_allclose(got[n], ref[n], rtol=rtol, atol=atol, err_msg=n)


@needs_opencl
@pytest.mark.parametrize("precision,pipeline", [("fp32", "baseline"), ("fp32", "full"), ("bf16", "baseline"),
                                                ("bf16", "astitch"), ("bf16", "full"), ("fp16", "full")])
def test_layernorms_fold_into_their_gemms_and_match(tmp_path, precision, pipeline):
    """Both LayerNorms fold: no LayerNorm kernel is left, the pass log names them, the GEMMs read
    x itself, and the outputs match onnxruntime at the precision's tolerance."""
    path = pre_ln_block(tmp_path / "m.onnx")
    cm = dlcc.compile(path, target="opencl", pipeline=pipeline, device="h100", precision=precision)
    (log,) = _folded(cm)
    assert log.startswith("lower: 2 LayerNorm/RMSNorm(s)"), log
    assert _layernorm_launches(cm) == 0
    src = cm.source("cuda")
    assert "rn_s1 += rn_d" in src and "RNC[n]" in src
    if precision != "fp32" and pipeline == "baseline":  # x, stored in the half type, is copied by cp.async
        # (AStitch computes x + offset in the GEMMs' loads instead, as both GEMMs read it)
        assert re.search(r"CP_ASYNC16\(As ", src)
    _check(cm, path, precision)


@needs_opencl
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_ragged_shapes_fold(tmp_path, precision):
    """K that no k block divides (72), and M and N that no tile divides: the sums skip the
    padding, the rows past M are never stored."""
    path = pre_ln_block(tmp_path / "m.onnx", M=37, K=72, N=50)
    cm = dlcc.compile(path, target="opencl", pipeline="astitch", device="h100", precision=precision)
    assert _folded(cm) and _layernorm_launches(cm) == 0
    _check(cm, path, precision)


@needs_opencl
@pytest.mark.parametrize("precision,shape,tiling", [
    ("bf16", "1x24x40x64", "tc32x64x64_w2x4_s3_bf16_sk2"),  # the second chunk lies wholly past K
    ("fp16", "1x37x50x72", "tc32x64x32_w2x4_s4_fp16_sk2"),  # a ragged last chunk
    ("fp32", "1x37x50x72", "32x32x16_2x2_sk4"),
    ("fp32", "1x24x40x64", "16x64x64_1x4v_sk2"),
])
def test_split_gemms_carry_the_row_sums(tmp_path, precision, shape, tiling):
    """Split along K, each chunk sums its own columns about the same shift, and the tile's last
    rTask adds the chunks' sums as it adds their accumulators (kernels/splitk.py)."""
    M, N, K = map(int, shape.split("x")[1:])
    path = pre_ln_block(tmp_path / "m.onnx", M=M, K=K, N=N, mean=20.0 if precision == "fp32" else 0.0)
    pipe = tmp_path / "split.yaml"
    pipe.write_text(f"name: split\npasses:\n  - name: lower\n    options:\n      gemm_tilings: {{'{shape}': {tiling}}}\n"
                    "  - name: memplan\n")
    cm = dlcc.compile(path, target="opencl", pipeline=str(pipe), device="h100", precision=precision)
    tilings = {k["name"]: k.get("tiling") for k in cm.plan["kernels"]}
    assert _folded(cm) and sum(tilings.get(L["kernel"]) == tiling for L in cm.plan["launches"]) == 2
    _check(cm, path, precision)


@needs_opencl
def test_a_large_mean_keeps_float32_accuracy(tmp_path):
    """Rows of mean 1000 and spread about 1, at fp32 (the SIMT template stores x - s for its
    row's first element s): within fp32's tolerance of onnxruntime. Taken about zero, the
    product x · W' and mean · c cancel three more digits, and the result missed the tolerance."""
    path = pre_ln_block(tmp_path / "m.onnx", mean=1000.0)
    cm = dlcc.compile(path, target="opencl", pipeline="baseline", device="h100", precision="fp32")
    assert _folded(cm)
    _check(cm, path, "fp32")


@needs_opencl
def test_what_does_not_fold(tmp_path):
    """A LayerNorm whose output another op reads too stays a kernel (the first one still folds);
    none folds at tf32 (the mma would round x about zero) or with `fold_layernorm: false`, and
    those plans match onnxruntime as well."""
    path = pre_ln_block(tmp_path / "m.onnx", extra_reader=True)
    cm = dlcc.compile(path, target="opencl", pipeline="baseline", device="h100", precision="bf16")
    (log,) = _folded(cm)
    assert log.startswith("lower: 1 LayerNorm/RMSNorm(s)"), log
    assert _layernorm_launches(cm) == 1
    _check(cm, path, "bf16")

    path = pre_ln_block(tmp_path / "p.onnx")
    cm = dlcc.compile(path, target="opencl", pipeline="baseline", device="h100", precision="tf32")
    assert not _folded(cm) and _layernorm_launches(cm) == 2
    _check(cm, path, "tf32")
    pipe = tmp_path / "nofold.yaml"
    pipe.write_text("name: nofold\npasses:\n  - name: lower\n    options:\n      fold_layernorm: false\n  - name: memplan\n")
    cm = dlcc.compile(path, target="opencl", pipeline=str(pipe), device="h100", precision="bf16")
    assert not _folded(cm) and _layernorm_launches(cm) == 2
    _check(cm, path, "bf16")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvcc_builds_the_folded_gemms_without_spills(tmp_path, arch):
    """Every precision's folded GEMMs (SIMT at fp32, the cp.async pipeline at fp16/bf16; fused
    epilogues) compile for both archs with no register spills."""
    import shutil

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed")
    path = pre_ln_block(tmp_path / "m.onnx", M=128, K=768, N=768)
    srcs = []
    for precision in ("fp32", "bf16", "fp16"):
        cm = dlcc.compile(path, target="opencl", pipeline="astitch", device="h100", precision=precision)
        assert _folded(cm)
        srcs.append(cm.source("cuda"))
    for k, src in enumerate(srcs):
        f = tmp_path / f"k{k}.cu"
        f.write_text(src)
        _, log = nvcc_ptx_and_ptxas(f, arch)
        spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", log)]
        assert spills and not any(spills), log[-3000:]


def rms_block(path, form="div", gamma=True, M=24, K=64, N=40, extra_reader=False):
    """x -> RMSNorm as torch exports LLaMA's and T5's (Pow, ReduceMean over the last axis, Add
    eps, Sqrt, then Div(x, ·), Mul(x, Reciprocal(·)) or Mul(Div(1, ·), x), then Mul by γ) ->
    MatMul. `extra_reader`: the Sqrt is a graph output too (nothing folds)."""
    rng = np.random.default_rng(1)
    inits = [nh.from_array(np.array(2.0, np.float32), "two"), nh.from_array(np.array(1e-6, np.float32), "eps"),
             nh.from_array(np.array(1.0, np.float32), "one"), nh.from_array(np.array([-1], np.int64), "ax"),
             nh.from_array(rng.uniform(0.5, 1.5, K).astype(np.float32), "g"),
             nh.from_array((rng.standard_normal((K, N)) * 0.1).astype(np.float32), "W")]
    inits.append(nh.from_array((rng.standard_normal(K) * 0.1).astype(np.float32), "off"))
    # (x + off: a computed x, which fp16/bf16 store in the half type, as the fold needs)
    nodes = [h.make_node("Add", ["x", "off"], ["x1"]), h.make_node("Pow", ["x1", "two"], ["p"]), h.make_node("ReduceMean", ["p", "ax"], ["ms"], keepdims=1),
             h.make_node("Add", ["ms", "eps"], ["mse"]), h.make_node("Sqrt", ["mse"], ["rms"])]
    if form == "div":
        nodes.append(h.make_node("Div", ["x1", "rms"], ["nx"]))
    elif form == "reciprocal":
        nodes += [h.make_node("Reciprocal", ["rms"], ["r"]), h.make_node("Mul", ["x1", "r"], ["nx"])]
    else:
        nodes += [h.make_node("Div", ["one", "rms"], ["r"]), h.make_node("Mul", ["r", "x1"], ["nx"])]
    nodes += [h.make_node("Mul", ["g", "nx"], ["y"])] if gamma else [h.make_node("Identity", ["nx"], ["y"])]
    nodes.append(h.make_node("MatMul", ["y", "W"], ["out"]))
    outs = [h.make_tensor_value_info("out", TP.FLOAT, [1, M, N])]
    if extra_reader:
        outs.append(h.make_tensor_value_info("rms", TP.FLOAT, [1, M, 1]))
    return _save(path, nodes, "rms", [1, M, K], outs, inits, 18)


@needs_opencl
@pytest.mark.parametrize("form,gamma,precision", [("div", True, "fp32"), ("div", True, "bf16"),
                                                  ("reciprocal", True, "fp16"), ("div-one", False, "fp32"),
                                                  ("reciprocal", False, "bf16")])
def test_rmsnorms_fold(tmp_path, form, gamma, precision):
    """LLaMA's and T5's RMSNorm, in the forms exporters write it, folds into the MatMul after it:
    its six or seven nodes are gone, and the output matches onnxruntime."""
    path = rms_block(tmp_path / "m.onnx", form, gamma)
    cm = dlcc.compile(path, target="opencl", pipeline="baseline", device="h100", precision=precision)
    (log,) = _folded(cm)
    assert log.startswith("lower: 1 LayerNorm/RMSNorm(s)"), log
    assert [L["op_type"] for L in cm.plan["launches"]] == ["Add", "MatMul"]
    _check(cm, path, precision)


@needs_opencl
def test_an_rmsnorm_with_another_reader_stays(tmp_path):
    path = rms_block(tmp_path / "m.onnx", extra_reader=True)
    cm = dlcc.compile(path, target="opencl", pipeline="baseline", device="h100", precision="fp32")
    assert not _folded(cm) and "Sqrt" in [L["op_type"] for L in cm.plan["launches"]]
    _check(cm, path, "fp32")


@pytest.mark.parametrize("k_axis", [0, 1])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_folded_weight_is_made_slice_by_slice_as_the_whole(k_axis, dtype):
    """_scaled_weight makes W' = diag(γ) W, c and b' a slice of columns at a time (the LM head's
    38.6M weights were five float64 copies); every value is the one the whole-array formula
    gives, bit for bit, across slice edges (1,100 columns of K = 300: four slices)."""
    import ml_dtypes

    from dlcc.ops.fold_norm import _scaled_weight

    rng = np.random.default_rng(7)
    K, n = 300, 1100
    w = rng.standard_normal((n, K) if k_axis else (K, n)).astype(np.float32)
    gamma, beta = (rng.standard_normal(K).astype(np.float32).astype(np.float64) for _ in range(2))
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    wf = w.astype(np.float64)
    want = (wf * (gamma[None, :] if k_axis else gamma[:, None])).astype(dt)
    stored, c, b = _scaled_weight(w, gamma, beta, k_axis, dt)
    assert stored.dtype == dt and np.array_equal(stored.astype(np.float64), want.astype(np.float64))
    assert np.array_equal(c, want.astype(np.float64).sum(axis=k_axis))
    assert np.array_equal(b, (wf * (beta[None, :] if k_axis else beta[:, None])).sum(axis=k_axis))
