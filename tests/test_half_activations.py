"""Activations stored in the half type at precision fp16/bf16 (ops/narrow.py narrow_activations):
which tensors are narrowed (exact expectations on the plan's dtypes), that every kernel around
them converts (outputs against onnxruntime at the precision's documented tolerance, through every
pipeline, on PoCL), that the bytes halve, and the switch that keeps them float32."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import dlcc
from dlcc.backends.nvcc import find_nvcc
from dlcc.verify import DEFAULT_TOLERANCE, verify_outputs

HALF = {"fp16": "float16", "bf16": "bfloat16"}


def _block(path):
    """x -> MatMul -> Add bias -> Softmax -> Reshape -> Transpose -> LayerNorm -> Gelu-ish (Erf)
    -> Conv-free tail: a Reduce and a TopK. The TopK has no converting lowering, so the tensor it
    reads stays float32; `y` (a graph output, reached through a Reshape view) stays float32 with
    its view source; `hidden` is both an output and read by the next op."""
    rng = np.random.default_rng(0)
    inits = {"w": rng.standard_normal((32, 48)).astype(np.float32) / 4, "b": rng.standard_normal(48).astype(np.float32),
             "g": rng.standard_normal(48).astype(np.float32), "beta": rng.standard_normal(48).astype(np.float32),
             "shape": np.array([4, 12, 8, 6], np.int64), "flat": np.array([4, 576], np.int64),
             "half": np.array(0.5, np.float32), "rt2": np.array(0.70710678, np.float32), "one": np.array(1, np.float32),
             "k": np.array([3], np.int64)}
    nodes = [h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Add", ["m", "b"], ["a"]),
             h.make_node("Softmax", ["a"], ["s"], axis=-1),
             h.make_node("Reshape", ["s", "shape"], ["r"]), h.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3]),
             h.make_node("Reshape", ["t", "flat"], ["tf"]),
             h.make_node("Slice", ["tf", "zero", "n48", "ax1"], ["sl"]),
             h.make_node("LayerNormalization", ["sl", "g", "beta"], ["ln"], axis=-1),
             h.make_node("Mul", ["ln", "rt2"], ["u"]), h.make_node("Erf", ["u"], ["e"]),
             h.make_node("Add", ["e", "one"], ["e1"]), h.make_node("Mul", ["ln", "e1"], ["g1"]),
             h.make_node("Mul", ["g1", "half"], ["hidden"]),
             h.make_node("ReduceMean", ["hidden"], ["red"], axes=[1], keepdims=0),
             h.make_node("Neg", ["hidden"], ["nh"]), h.make_node("TopK", ["nh", "k"], ["topv", "topi"], axis=-1),
             h.make_node("Relu", ["hidden"], ["rl"]), h.make_node("Reshape", ["rl", "flat2"], ["y"])]
    inits.update({"zero": np.array([0], np.int64), "n48": np.array([48], np.int64), "ax1": np.array([1], np.int64),
                  "flat2": np.array([4, 6, 8], np.int64)})
    g = h.make_graph(nodes, "block", [h.make_tensor_value_info("x", T.FLOAT, [4, 12, 32])],
                     [h.make_tensor_value_info(n, T.FLOAT, None) for n in ("hidden", "red", "topv", "y")],
                     [nh.from_array(v, k) for k, v in inits.items()])
    m = onnx.shape_inference.infer_shapes(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]))
    onnx.save(m, path)
    return path, {"x": np.random.default_rng(1).standard_normal((4, 12, 32)).astype(np.float32)}


def _dtypes(cm) -> dict[str, str]:
    return {n: t["dtype"] for n, t in cm.plan["tensors"].items()}


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_which_activations_are_half(tmp_path, precision):
    path, _ = _block(tmp_path / "b.onnx")
    cm = dlcc.compile(path, target="opencl", pipeline="baseline", precision=precision)
    dt = _dtypes(cm)
    half = HALF[precision]
    # between converting ops, views included
    for t in ("a", "s", "r", "t", "tf", "sl", "ln", "u", "e", "e1", "g1"):  # (MatMul became Gemm + views)
        assert dt[t] == half, (t, dt[t])
    # graph inputs and outputs keep their dtype; `rl` is the source of the output view `y`
    for t in ("x", "hidden", "red", "topv", "y", "rl"):
        assert dt[t] == "float32", (t, dt[t])
    assert dt["nh"] == "float32"  # read by TopK, which computes only in float32
    assert cm.plan["meta"]["float32_activation_ops"] == {"TopK": 1}
    assert any(f"stored as {half}" in x and "activation" in x for x in cm.plan["meta"]["pass_log"])


def test_inspect_lists_activations_by_dtype(tmp_path):
    from typer.testing import CliRunner

    from dlcc.cli import app

    path, _ = _block(tmp_path / "b.onnx")
    r = CliRunner().invoke(app, ["inspect", str(path), "--precision", "bf16", "-q"], terminal_width=200)
    assert r.exit_code == 0, r.output
    assert "activations stored as bfloat16" in r.output and "activations stored as float32" in r.output
    assert "ops keeping float32 activations" in r.output and "TopK x1" in r.output


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("pipeline", ["baseline", "astitch", "full"])
def test_half_activations_match_onnxruntime(tmp_path, precision, pipeline):
    path, feeds = _block(tmp_path / "b.onnx")
    cm = dlcc.compile(path, target="opencl", pipeline=pipeline, precision=precision, device="h100")
    rows = verify_outputs(path, cm(feeds), feeds, precision=precision)
    assert all(r["passed"] for r in rows), rows
    assert HALF[precision] in {t["dtype"] for t in cm.plan["tensors"].values() if t["storage"] == "arena"}


def _wide_ints(path):
    """Float ids through int32 and uint32 (a negative one wraps to about 4.29e9) back to float,
    then Relu, Mul, a Sigmoid (bounded: the hazard stops) and a Mul after it; and a uint8 branch
    (always fits float16). The fp16 fuzz run found the wrapped uint32 stored as inf."""
    nodes = [h.make_node("Cast", ["x"], ["i32"], to=T.INT32), h.make_node("Cast", ["i32"], ["u32"], to=T.UINT32),
             h.make_node("Cast", ["u32"], ["f"], to=T.FLOAT), h.make_node("Relu", ["f"], ["r"]),
             h.make_node("Mul", ["r", "scale"], ["big"]), h.make_node("Sigmoid", ["big"], ["s"]),
             h.make_node("Mul", ["s", "x"], ["sx"]), h.make_node("Cast", ["i32"], ["u8"], to=T.UINT8),
             h.make_node("Cast", ["u8"], ["f8"], to=T.FLOAT), h.make_node("Add", ["f8", "sx"], ["a"]),
             h.make_node("Neg", ["big"], ["nb"]), h.make_node("Abs", ["a"], ["y"])]
    g = h.make_graph(nodes, "wide", [h.make_tensor_value_info("x", T.FLOAT, [2, 8])],
                     [h.make_tensor_value_info(n, T.FLOAT, None) for n in ("nb", "y")],
                     [nh.from_array(np.array(1e-6, np.float32), "scale")])
    onnx.save(onnx.shape_inference.infer_shapes(h.make_model(g, opset_imports=[h.make_opsetid("", 17)])), path)
    x = np.random.default_rng(2).uniform(-50, 50, (2, 8)).astype(np.float32)
    return path, {"x": x}


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_floats_from_wide_integers_stay_float32_at_fp16(tmp_path, precision):
    """At fp16 a float made from int32/uint32 and what is computed from it, up to a bounded op,
    stay float32 (ops/narrow.py beyond_half); bfloat16 has float32's range and narrows them."""
    path, feeds = _wide_ints(tmp_path / "w.onnx")
    cm = dlcc.compile(path, target="opencl", pipeline="baseline", precision=precision)
    dt, half = _dtypes(cm), HALF[precision]
    for t in ("s", "sx", "f8", "a"):  # after the Sigmoid, and from uint8
        assert dt[t] == half, (t, dt[t])
    wide = ("f", "r", "big")
    for t in wide:
        assert dt[t] == ("float32" if precision == "fp16" else half), (t, dt[t])
    assert cm.plan["meta"].get("float32_range_activations", 0) == (len(wide) if precision == "fp16" else 0)
    rows = verify_outputs(path, cm(feeds), feeds, precision=precision)
    assert all(r["passed"] for r in rows), rows


def _masked_attention(path):
    """HF's attention mask as the exporters write it: 1 - mask, as bool, selects float32's lowest
    (-3.4e38) into the scores, then Softmax and the product with V. Batch row 0 is all padding: its
    every score is -3.4e38, and float32 gives the mean of V there."""
    lowest = np.array(np.finfo(np.float32).min, np.float32)
    nodes = [h.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]), h.make_node("MatMul", ["x", "xt"], ["qk"]),
             h.make_node("Mul", ["qk", "scale"], ["sc"]), h.make_node("Cast", ["mask"], ["mb"], to=T.BOOL),
             h.make_node("Not", ["mb"], ["pad"]), h.make_node("Where", ["pad", "lowest", "zero"], ["bias"]),
             h.make_node("Unsqueeze", ["bias", "ax1"], ["b3"]), h.make_node("Add", ["sc", "b3"], ["scores"]),
             h.make_node("Softmax", ["scores"], ["p"], axis=-1), h.make_node("MatMul", ["p", "x"], ["y"])]
    inits = {"scale": np.array(0.35, np.float32), "lowest": lowest, "zero": np.array(0, np.float32),
             "ax1": np.array([1], np.int64)}
    g = h.make_graph(nodes, "masked", [h.make_tensor_value_info("x", T.FLOAT, [3, 6, 16]),
                                       h.make_tensor_value_info("mask", T.INT64, [3, 6])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], [nh.from_array(v, k) for k, v in inits.items()])
    onnx.save(onnx.shape_inference.infer_shapes(h.make_model(g, opset_imports=[h.make_opsetid("", 17)])), path)
    mask = np.ones((3, 6), np.int64)
    mask[0] = 0
    mask[1, 4:] = 0
    return path, {"x": np.random.default_rng(3).standard_normal((3, 6, 16)).astype(np.float32), "mask": mask}


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("pipeline", ["baseline", "astitch"])
def test_a_mask_of_float32s_lowest_stays_float32(tmp_path, precision, pipeline):
    """-3.4e38 is beyond float16 and bfloat16 alike: stored in either it became -inf, and the
    all-padding row's Softmax NaN (BERT at fp16 and bf16). What reads the constant, up to the
    Softmax, stays float32 (ops/narrow.py beyond_half), and the outputs match onnxruntime."""
    path, feeds = _masked_attention(tmp_path / "m.onnx")
    cm = dlcc.compile(path, target="opencl", pipeline=pipeline, precision=precision)
    rows = verify_outputs(path, cm(feeds), feeds, precision=precision)
    assert all(r["passed"] for r in rows), rows
    if pipeline == "baseline":
        dt = _dtypes(cm)
        assert [dt[t] for t in ("bias", "b3", "scores")] == ["float32"] * 3
        assert dt["sc"] == dt["p"] == HALF[precision]


def test_bert_with_a_sequence_of_padding_matches_onnxruntime_at_fp16(model_path):
    """The exported BERT's own mask (float32's lowest through a Where, stitched apart from the
    attention by astitch): a sequence all padding gave NaN at fp16 and bf16."""
    path = model_path("bert")
    cm = dlcc.compile(path, target="opencl", pipeline="astitch", precision="fp16")
    feeds = cm.sample_inputs(0)
    feeds["attention_mask"][0] = 0  # (batch row 0: the test model's only one)
    rows = verify_outputs(path, cm(feeds), feeds, precision="fp16")
    assert all(r["passed"] for r in rows), rows
    assert cm.plan["meta"]["float32_range_activations"] > 0


def test_which_tensors_may_exceed_the_half_range(tmp_path):
    """beyond_half on exact expectations: a Clip to float32's own limits clips nothing, one with a
    minimum beyond float16's range forces its values there; a Where of float32's lowest is beyond
    both half types, 1e5 only float16's; a Sigmoid bounds what it reads, and so does an Exp
    (RWKV's exp(-1e38 - p) is 0 in float32 too); a Max with float32's lowest keeps the other
    operand, a Max with 1e5 does not."""
    from dlcc.frontend import import_model
    from dlcc.ops.narrow import beyond_half

    f32 = np.finfo(np.float32)
    nodes = [h.make_node("Clip", ["x", "lo", "hi"], ["c"]), h.make_node("Clip", ["x", "big", ""], ["cb"]),
             h.make_node("Greater", ["x", "zero"], ["pos"]), h.make_node("Where", ["pos", "x", "lo"], ["w"]),
             h.make_node("Where", ["pos", "x", "big"], ["wb"]), h.make_node("Sigmoid", ["w"], ["s"]),
             h.make_node("Add", ["s", "c"], ["y0"]), h.make_node("Add", ["w", "wb"], ["y1"]),
             h.make_node("Add", ["cb", "y0"], ["y2"]), h.make_node("Exp", ["wb"], ["e"]),
             h.make_node("Max", ["x", "lo"], ["ml"]), h.make_node("Max", ["x", "big"], ["mb"]),
             h.make_node("Min", ["x", "lo"], ["nl"]), h.make_node("Add", ["e", "ml"], ["y3"]),
             h.make_node("Add", ["mb", "nl"], ["y4"])]
    inits = {"lo": np.array(f32.min, np.float32), "hi": np.array(f32.max, np.float32),
             "big": np.array(1e5, np.float32), "zero": np.array(0, np.float32)}
    g = h.make_graph(nodes, "r", [h.make_tensor_value_info("x", T.FLOAT, [4])],
                     [h.make_tensor_value_info(n, T.FLOAT, [4]) for n in ("y1", "y2", "y3", "y4")],
                     [nh.from_array(v, k) for k, v in inits.items()])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "r.onnx")
    graph = import_model(tmp_path / "r.onnx")
    assert beyond_half(graph, "float16") == {"cb", "w", "wb", "y1", "y2", "mb", "nl", "y4"}
    assert beyond_half(graph, "bfloat16") == {"w", "y1", "nl", "y4"}


def test_half_activations_halve_the_bytes(model_path):
    """BERT (small) at bf16 against fp32 through astitch: the same kernels and launches, every
    narrowed activation in half its bytes, the arena half."""
    path = model_path("bert")
    fp = dlcc.compile(path, target="opencl", pipeline="astitch")
    bf = dlcc.compile(path, target="opencl", pipeline="astitch", precision="bf16")
    assert bf.stats["launches"] == fp.stats["launches"]
    narrowed = [n for n, t in bf.plan["tensors"].items() if t["dtype"] == "bfloat16" and t["storage"] == "arena"]
    assert narrowed
    for n in narrowed:
        assert bf.plan["tensors"][n]["nbytes"] * 2 == fp.plan["tensors"][n]["nbytes"], n
    assert bf.stats["arena_bytes"] * 2 <= fp.stats["arena_bytes"] + 1024


def test_the_pipeline_switch_keeps_activations_float32(tmp_path, model_path):
    pipe = tmp_path / "p.yaml"
    pipe.write_text("name: p\nprecision: bf16\nhalf_activations: false\npasses:\n  - name: lower\n"
                    "  - name: astitch\n  - name: memplan\n")
    cm = dlcc.compile(model_path("bert"), target="opencl", pipeline=str(pipe))
    arena = {t["dtype"] for t in cm.plan["tensors"].values() if t["storage"] == "arena"}
    assert "bfloat16" not in arena
    assert "bfloat16" in {t["dtype"] for t in cm.plan["tensors"].values() if t["storage"] == "weights"}


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed on this machine")
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_half_activation_kernels_compile_for_cuda(tmp_path, precision):
    """The CUDA text of every pipeline at half precision (16-bit loads and rounding stores in map,
    reduction, transpose, GEMM and stitched kernels) compiles for sm_80 and sm_90 with no spills."""
    path, _ = _block(tmp_path / "b.onnx")
    for pipeline in ("baseline", "astitch", "full"):
        for dev in ("a100", "h100"):
            cm = dlcc.compile(path, target="cuda", pipeline=pipeline, precision=precision, device=dev)
            res = cm.plan["cuda"]["resources"]
            assert res and not [k for k, v in res.items() if v["spill_bytes"]], (pipeline, dev)
