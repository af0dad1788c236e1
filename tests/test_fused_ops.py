"""onnxruntime's fused ops (dlcc/fused_ops.py) on PoCL, each checked against onnxruntime's own
CPU kernel (its optimizations off, so that the node runs as written): the activations, the skip,
embedding, simplified and pre-17 layer norms, Attention with every mask form, a past state and
unidirectional masking, MultiHeadAttention, RotaryEmbedding, the fused Conv, Gemm and MatMul, and the quantized
QAttention and QEmbedLayerNormalization. Several nodes share a model where they can, so that one
compile checks them all. Real models come from onnxruntime's transformer optimizer run on a BERT
export (Attention, EmbedLayerNormalization, SkipLayerNormalization, BiasGelu), then from its
quantize_dynamic."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

import dlcc
from conftest import opencl_device_available
from dlcc.errors import DlccError

needs_opencl = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")
MS = "com.microsoft"


def _model(path, nodes, feeds: dict, inits: dict, outputs: list[str], opset=17):
    ins = [h.make_tensor_value_info(n, h.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds.items()]
    outs = [h.make_empty_tensor_value_info(o) for o in outputs]
    g = h.make_graph(nodes, "fused", ins, outs, [nh.from_array(np.asarray(v), k) for k, v in inits.items()])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset), h.make_opsetid(MS, 1)], ir_version=8)
    refs = _ort(m, feeds)
    for o, r in zip(m.graph.output, refs):  # onnx cannot infer com.microsoft ops: onnxruntime's shapes
        o.CopyFrom(h.make_tensor_value_info(o.name, h.np_dtype_to_tensor_dtype(r.dtype), r.shape))
    onnx.save(m, str(path))
    return str(path), refs


def _ort(model, feeds) -> list[np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _check(path, refs, feeds, pipeline="astitch", rtol=1e-4, atol=2e-5):
    got = dlcc.compile(path, target="opencl", pipeline=pipeline)(feeds)
    names = [o.name for o in onnx.load(path).graph.output]
    for n, r in zip(names, refs):
        assert got[n].shape == r.shape and got[n].dtype == r.dtype, (n, got[n].shape, r.shape, got[n].dtype, r.dtype)
        np.testing.assert_allclose(got[n], r, rtol=rtol, atol=atol, err_msg=n)
    return got


rng = np.random.default_rng(0)


def _f(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


@needs_opencl
def test_activations(tmp_path):
    """Gelu, BiasGelu, FastGelu with and without a bias, QuickGelu with its alpha; BiasAdd."""
    x, bias, skip = _f(2, 5, 16, scale=2), _f(16), _f(2, 5, 16)
    nodes = [h.make_node("Gelu", ["x"], ["gelu"], domain=MS),
             h.make_node("BiasGelu", ["x", "bias"], ["bias_gelu"], domain=MS),
             h.make_node("FastGelu", ["x"], ["fast"], domain=MS),
             h.make_node("FastGelu", ["x", "bias"], ["fast_bias"], domain=MS),
             h.make_node("QuickGelu", ["x"], ["quick"], domain=MS, alpha=1.5)]
    feeds = {"x": x}
    path, refs = _model(tmp_path / "act.onnx", nodes, feeds, {"bias": bias}, ["gelu", "bias_gelu", "fast", "fast_bias", "quick"])
    _check(path, refs, feeds)
    # BiasAdd has no CPU kernel in onnxruntime (CUDA only): its sum is checked against numpy
    g = h.make_graph([h.make_node("BiasAdd", ["x", "bias", "skip"], ["y"], domain=MS)], "bias_add",
                     [h.make_tensor_value_info(n, TP.FLOAT, a.shape) for n, a in (("x", x), ("skip", skip))],
                     [h.make_tensor_value_info("y", TP.FLOAT, x.shape)], [nh.from_array(bias, "bias")])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(MS, 1)], ir_version=8),
              str(tmp_path / "bias_add.onnx"))
    got = dlcc.compile(str(tmp_path / "bias_add.onnx"), target="opencl")({"x": x, "skip": skip})["y"]
    np.testing.assert_array_equal(got, (x + bias) + skip)


@needs_opencl
@pytest.mark.parametrize("opset", [14, 17])
def test_layer_norms(tmp_path, opset):
    """SkipLayerNormalization (beta, bias, all four outputs; a 2-D skip broadcast over the batch),
    SkipSimplifiedLayerNormalization, and the ONNX-domain ops onnxruntime adds:
    SimplifiedLayerNormalization over the last axis and over two axes, and LayerNormalization at
    an opset below 17 (where it is onnxruntime's, not the standard's). At opset 17 the norms with
    one output become the standard LayerNormalization, below it they are decomposed."""
    x, skip2, skip3 = _f(2, 6, 32, scale=3), _f(6, 32), _f(2, 6, 32)
    inits = {"gamma": _f(32), "beta": _f(32), "bias": _f(32), "gamma2": _f(6, 32)}
    nodes = [h.make_node("SkipLayerNormalization", ["x", "skip3", "gamma", "beta", "bias"],
                         ["sln", "sln_mean", "sln_inv", "sln_sum"], domain=MS, epsilon=1e-5),
             h.make_node("SkipLayerNormalization", ["x", "skip2", "gamma"], ["sln_plain"], domain=MS),
             h.make_node("SkipSimplifiedLayerNormalization", ["x", "skip3", "gamma", "bias"],
                         ["ssln", "", "ssln_inv", "ssln_sum"], domain=MS, epsilon=1e-6),
             h.make_node("SimplifiedLayerNormalization", ["x", "gamma"], ["rms", "rms_inv"], epsilon=1e-6),
             h.make_node("SimplifiedLayerNormalization", ["x", "gamma2"], ["rms2"], axis=1)]
    outs = ["sln", "sln_mean", "sln_inv", "sln_sum", "sln_plain", "ssln", "ssln_inv", "ssln_sum", "rms", "rms_inv", "rms2"]
    if opset < 17:
        nodes.append(h.make_node("LayerNormalization", ["x", "gamma", "beta"], ["ln", "ln_mean", "ln_inv"], epsilon=1e-5))
        outs += ["ln", "ln_mean", "ln_inv"]
    feeds = {"x": x, "skip2": skip2, "skip3": skip3}
    path, refs = _model(tmp_path / "ln.onnx", nodes, feeds, inits, outs, opset=opset)
    got = _check(path, refs, feeds)
    if opset < 17:
        assert got["ln"].shape == (2, 6, 32)


@needs_opencl
def test_embed_layer_norm(tmp_path):
    """Word, position and segment embeddings added and normalized; a mask with padding (the
    mask index counts its ones), given position ids, the embedding sum; and the form without
    segments, mask or position ids."""
    B, S, H, V = 2, 7, 16, 50
    ids = rng.integers(0, V, (B, S)).astype(np.int32)
    seg = rng.integers(0, 2, (B, S)).astype(np.int32)
    mask = np.array([[1] * 7, [1] * 4 + [0] * 3], np.int32)
    pos_ids = rng.integers(0, 10, (B, S)).astype(np.int32)
    inits = {"word": _f(V, H), "pos": _f(12, H), "segemb": _f(2, H), "gamma": _f(H), "beta": _f(H)}
    nodes = [h.make_node("EmbedLayerNormalization", ["ids", "seg", "word", "pos", "segemb", "gamma", "beta", "mask", "pos_ids"],
                         ["emb", "mask_index", "emb_sum"], domain=MS, epsilon=1e-5),
             h.make_node("EmbedLayerNormalization", ["ids", "", "word", "pos", "", "gamma", "beta"], ["emb_plain", "mi_plain"],
                         domain=MS)]
    feeds = {"ids": ids, "seg": seg, "mask": mask, "pos_ids": pos_ids}
    path, refs = _model(tmp_path / "emb.onnx", nodes, feeds, inits, ["emb", "mask_index", "emb_sum", "emb_plain", "mi_plain"])
    got = _check(path, refs, feeds)
    assert got["mask_index"].tolist() == [7, 4] and got["mi_plain"].tolist() == [0, 0]


def _attention_model(tmp_path, name, mask, extra_nodes=(), **attrs):
    B, S, Hin, N = 2, 6, 32, 4
    x = _f(B, S, Hin)
    inits = {"w": _f(Hin, 3 * Hin, scale=0.3), "b": _f(3 * Hin, scale=0.3)}
    feeds = {"x": x} | ({"mask": mask} if mask is not None else {})
    nodes = [h.make_node("Attention", ["x", "w", "b"] + (["mask"] if mask is not None else []), ["y"], domain=MS,
                         num_heads=N, **attrs), *extra_nodes]
    return _model(tmp_path / f"{name}.onnx", nodes, feeds, inits, ["y"] + [n.output[0] for n in extra_nodes]), feeds


@needs_opencl
@pytest.mark.parametrize("form", ["none", "raw2d", "raw3d", "lengths", "ends_starts", "causal_raw2d"])
def test_attention_masks(tmp_path, form):
    """Attention with no mask, a raw [B, T] and [B, S, T] mask (zeros mask), right-padding
    lengths [B], lengths then starts [2B], and unidirectional (causal) masking merged with a raw
    mask: the scores a mask hides match onnxruntime's, down to rows it hides entirely."""
    B, S = 2, 6
    mask = {"none": None,
            "raw2d": np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], np.int32),
            "raw3d": (rng.random((B, S, S)) > 0.3).astype(np.int32),
            "lengths": np.array([4, 6], np.int32),
            "ends_starts": np.array([5, 6, 1, 2], np.int32),
            "causal_raw2d": np.array([[0, 1, 1, 1, 1, 1], [1, 1, 1, 0, 1, 1]], np.int32)}[form]
    attrs = {"unidirectional": 1} if form.startswith("causal") else {}
    (path, refs), feeds = _attention_model(tmp_path, form, mask, **attrs)
    _check(path, refs, feeds)


@needs_opencl
def test_attention_variants(tmp_path):
    """Unequal Q/K and V hidden sizes (qkv_hidden_sizes), a custom scale and filter value, an
    attention bias, and a past state with the present output (keys and values stacked)."""
    B, S, P, Hin, N = 2, 5, 3, 24, 4
    x, past = _f(B, S, Hin), _f(2, B, N, P, 8)
    bias_add = _f(1, N, S, S)
    inits = {"w": _f(Hin, 16 + 16 + 32, scale=0.3), "b": _f(64, scale=0.3),
             "w2": _f(Hin, 96, scale=0.3), "b2": _f(96, scale=0.3)}
    mask = np.array([[1] * 8, [1] * 6 + [0] * 2], np.int32)
    nodes = [h.make_node("Attention", ["x", "w", "b", "", "", "attn_bias"], ["y"], domain=MS, num_heads=N,
                         qkv_hidden_sizes=[16, 16, 32], scale=0.3, mask_filter_value=-500.0),
             h.make_node("Attention", ["x", "w2", "b2", "mask", "past"], ["y2", "present"], domain=MS, num_heads=N,
                         unidirectional=1),
             # a 0/1 attribute at 2 is off, as onnxruntime reads it
             h.make_node("Attention", ["x", "w2", "b2"], ["y3"], domain=MS, num_heads=N, unidirectional=2, do_rotary=2)]
    feeds = {"x": x, "attn_bias": bias_add, "mask": mask, "past": past}
    path, refs = _model(tmp_path / "attn.onnx", nodes, feeds, inits, ["y", "y2", "present", "y3"])
    _check(path, refs, feeds)


@needs_opencl
def test_multi_head_attention(tmp_path):
    """Cross attention (query and key lengths differ) with the projections' bias and a key
    padding mask; self attention with past key and value, present outputs, causal masking; and
    keys and values given already split into heads."""
    B, S, L, D, N, P = 2, 4, 6, 32, 4, 3
    q, k, v = _f(B, S, D), _f(B, L, D), _f(B, L, D)
    pk, pv = _f(B, N, P, D // N), _f(B, N, P, D // N)
    kh, vh = _f(B, N, L, D // N), _f(B, N, L, D // N)
    kpm = np.array([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]], np.int32)
    nodes = [h.make_node("MultiHeadAttention", ["q", "k", "v", "bias", "kpm"], ["cross"], domain=MS, num_heads=N),
             h.make_node("MultiHeadAttention", ["q", "q", "q", "", "", "", "pk", "pv"], ["self", "present_k", "present_v"],
                         domain=MS, num_heads=N, unidirectional=1),
             h.make_node("MultiHeadAttention", ["q", "kh", "vh"], ["split"], domain=MS, num_heads=N, scale=0.2),
             h.make_node("MultiHeadAttention", ["q", "q", "q"], ["self2"], domain=MS, num_heads=N, unidirectional=2)]
    feeds = {"q": q, "k": k, "v": v, "kpm": kpm, "pk": pk, "pv": pv, "kh": kh, "vh": vh}
    path, refs = _model(tmp_path / "mha.onnx", nodes, feeds, {"bias": _f(3 * D)},
                        ["cross", "self", "present_k", "present_v", "split", "self2"])
    _check(path, refs, feeds)


@needs_opencl
def test_rotary_embedding(tmp_path):
    """RotaryEmbedding on [B, S, hidden] and [B, N, S, h], in halves and interleaved, with
    position ids per token and with one offset, and rotating only part of each head."""
    B, S, N, Hd, M = 2, 5, 2, 8, 16
    cos, sin = _f(M, Hd // 2), _f(M, Hd // 2)
    cos_part, sin_part = _f(M, 2), _f(M, 2)
    x3, x4 = _f(B, S, N * Hd), _f(B, N, S, Hd)
    pos = rng.integers(0, M, (B, S)).astype(np.int64)
    offset = np.array([3], np.int64)
    nodes = [h.make_node("RotaryEmbedding", ["x3", "pos", "cos", "sin"], ["r3"], domain=MS, num_heads=N),
             h.make_node("RotaryEmbedding", ["x4", "pos", "cos", "sin"], ["r4i"], domain=MS, interleaved=1),
             h.make_node("RotaryEmbedding", ["x4", "pos", "cos", "sin"], ["r4i2"], domain=MS, interleaved=2),
             h.make_node("RotaryEmbedding", ["x4", "offset", "cos", "sin"], ["r4o"], domain=MS),
             h.make_node("RotaryEmbedding", ["x3", "pos", "cos_part", "sin_part"], ["r3p"], domain=MS, num_heads=N,
                         rotary_embedding_dim=4)]
    feeds = {"x3": x3, "x4": x4, "pos": pos, "offset": offset}
    inits = {"cos": cos, "sin": sin, "cos_part": cos_part, "sin_part": sin_part}
    path, refs = _model(tmp_path / "rope.onnx", nodes, feeds, inits, ["r3", "r4i", "r4i2", "r4o", "r3p"])
    _check(path, refs, feeds)


@needs_opencl
def test_fused_conv_gemm_matmul(tmp_path):
    """FusedConv with a residual input and Relu, and with Clip; FusedGemm with LeakyRelu;
    FusedMatMul with both operands transposed and an alpha, on batched operands."""
    x, z = _f(1, 3, 8, 8), _f(1, 4, 8, 8)
    a, bm = _f(3, 16, 5), _f(3, 7, 16)
    g_a = _f(4, 6)
    inits = {"w": _f(4, 3, 3, 3), "cb": _f(4), "gw": _f(5, 6), "gc": _f(5)}
    nodes = [h.make_node("FusedConv", ["x", "w", "cb", "z"], ["conv_relu"], domain=MS, activation="Relu", pads=[1, 1, 1, 1]),
             h.make_node("FusedConv", ["x", "w"], ["conv_clip"], domain=MS, activation="Clip", activation_params=[-0.5, 0.5],
                         pads=[1, 1, 1, 1]),
             h.make_node("FusedGemm", ["g_a", "gw", "gc"], ["gemm"], domain=MS, transB=1, activation="LeakyRelu",
                         activation_alpha=0.1),
             h.make_node("FusedMatMul", ["a", "bm"], ["mm"], domain=MS, transA=1, transB=1, alpha=0.5)]
    feeds = {"x": x, "z": z, "a": a, "bm": bm, "g_a": g_a}
    path, refs = _model(tmp_path / "fused.onnx", nodes, feeds, inits, ["conv_relu", "conv_clip", "gemm", "mm"])
    _check(path, refs, feeds)


def test_bad_fused_nodes_are_clear_errors(tmp_path):
    """A fused op with too few inputs, no num_heads, weights that do not split, a rotary
    Attention, a mask index in the [3B + 2] form, an attribute its schema does not have, or an
    unknown fused activation: one clear error naming the node, never a traceback."""
    def compile_one(node, inits):
        g = h.make_graph([node], "bad", [h.make_tensor_value_info("x", TP.FLOAT, [1, 4, 12])],
                         [h.make_tensor_value_info("y", TP.FLOAT, None)],
                         [nh.from_array(v, k) for k, v in inits.items()])
        m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(MS, 1)], ir_version=8)
        p = tmp_path / "bad.onnx"
        onnx.save(m, str(p))
        with pytest.raises(DlccError) as e:
            dlcc.compile(str(p), target="opencl")
        return str(e.value)

    w = {"w": _f(12, 36), "g": _f(12)}
    assert "takes 3 to 5 inputs" in compile_one(h.make_node("SkipLayerNormalization", ["x", "x"], ["y"], domain=MS), w)
    assert "num_heads must be positive" in compile_one(h.make_node("Attention", ["x", "w"], ["y"], domain=MS), w)
    msg = compile_one(h.make_node("Attention", ["x", "w"], ["y"], domain=MS, num_heads=5), w)
    assert "qkv_hidden_sizes" in msg and "Attention" in msg, msg
    assert "do_rotary is not supported" in compile_one(h.make_node("Attention", ["x", "w"], ["y"], domain=MS, num_heads=4,
                                                                   do_rotary=1), w)
    x2 = h.make_tensor_value_info("m", TP.INT32, [8])  # 3B + 2 values for a batch of 2
    g = h.make_graph([h.make_node("Attention", ["x", "w", "", "m"], ["y"], domain=MS, num_heads=4)], "bad",
                     [h.make_tensor_value_info("x", TP.FLOAT, [2, 4, 12]), x2], [h.make_tensor_value_info("y", TP.FLOAT, None)],
                     [nh.from_array(w["w"], "w")])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(MS, 1)], ir_version=8),
              str(tmp_path / "mask.onnx"))
    with pytest.raises(DlccError, match="only \\[B\\] and \\[2B\\]"):
        dlcc.compile(str(tmp_path / "mask.onnx"), target="opencl")
    assert "'block_size', which its schema does not have" in compile_one(
        h.make_node("SkipLayerNormalization", ["x", "x", "g"], ["y"], domain=MS, block_size=32), w)
    assert "activation 'Elu' is not supported" in compile_one(
        h.make_node("FusedGemm", ["x", "g"], ["y"], domain=MS, activation="Elu"), w)


@pytest.fixture(scope="module")
def optimized_bert(tmp_path_factory):
    """A BERT export (TorchScript, with token types) put through onnxruntime's transformer
    optimizer, as Optimum's optimized models are."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import warnings

    from onnxruntime.transformers.optimizer import optimize_model

    torch.manual_seed(0)
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                  vocab_size=100, max_position_embeddings=32, attn_implementation="eager")
    model = transformers.BertModel(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p), alpha=0.02)

    class Wrapper(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids, mask, types):
            return self.m(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state

    d = tmp_path_factory.mktemp("optimized")
    ids, mask, types = torch.randint(0, 100, (2, 8)), torch.ones(2, 8, dtype=torch.int64), torch.zeros(2, 8, dtype=torch.int64)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(Wrapper(model), (ids, mask, types), str(d / "bert.onnx"), input_names=names,
                          output_names=["last_hidden_state"], opset_version=17, dynamo=False,
                          dynamic_axes={k: {0: "batch", 1: "seq"} for k in names})
    opt = optimize_model(str(d / "bert.onnx"), model_type="bert", num_heads=4, hidden_size=32)
    fused = {n.op_type for n in opt.model.graph.node if n.domain == MS}
    assert {"Attention", "EmbedLayerNormalization", "SkipLayerNormalization"} <= fused, fused
    opt.save_model_to_file(str(d / "bert-optimized.onnx"))
    return d / "bert-optimized.onnx"


def _bert_feeds():
    ids = rng.integers(0, 100, (2, 8)).astype(np.int64)
    mask = np.array([[1] * 8, [1] * 5 + [0] * 3], np.int64)  # a padded row
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros((2, 8), np.int64)}


@needs_opencl
def test_onnxruntime_optimized_bert(optimized_bert):
    """The optimized BERT (EmbedLayerNormalization, Attention with its mask index from the
    embedding, SkipLayerNormalization, BiasGelu) through every pipeline, against onnxruntime on
    the optimized file, with a padded batch row."""
    feeds = _bert_feeds()
    ref = _ort(onnx.load(str(optimized_bert)), feeds)[0]
    for p in ("baseline", "astitch", "full"):
        got = dlcc.compile(str(optimized_bert), target="opencl", pipeline=p,
                           shapes={"batch": 2, "seq": 8})(feeds)["last_hidden_state"]
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=2e-5, err_msg=p)


@needs_opencl
def test_optimized_and_quantized_bert_verifies(optimized_bert, tmp_path):
    """The optimized BERT quantized by onnxruntime's quantize_dynamic, the classic int8 BERT:
    QAttention and QEmbedLayerNormalization beside MatMulInteger, through astitch and full, as
    `dlcc verify` judges it (its reference computes the integer products exactly)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from dlcc.verify import verify_outputs

    path = str(tmp_path / "bert-int8.onnx")
    quantize_dynamic(str(optimized_bert), path, weight_type=QuantType.QInt8,
                     extra_options={"DefaultTensorType": TP.FLOAT})
    ops = {n.op_type for n in onnx.load(path).graph.node}
    assert {"QAttention", "QEmbedLayerNormalization", "MatMulInteger"} <= ops, ops
    feeds = _bert_feeds()
    for p in ("astitch", "full"):
        cm = dlcc.compile(path, target="opencl", pipeline=p, shapes={"batch": 2, "seq": 8})
        rows = verify_outputs(path, cm(feeds), feeds, compiled=cm)
        assert all(r["passed"] for r in rows), rows


@needs_opencl
def test_quantized_attention_and_embedding(tmp_path):
    """QAttention (uint8 input, int8 weights with per-column scales and zero points, a mask
    index, unidirectional, a past) and QEmbedLayerNormalization (uint8 tables) against
    onnxruntime's own kernels, on inputs below 128, where its uint8 x int8 products cannot
    saturate (test_quantized.py says why)."""
    B, S, Hin, N, P, V = 2, 5, 16, 4, 2, 30
    x = rng.integers(0, 128, (B, S, Hin)).astype(np.uint8)
    inits = {"w": rng.integers(-128, 128, (Hin, 3 * Hin)).astype(np.int8), "bias": _f(3 * Hin),
             "x_s": np.float32(0.02), "w_s": (rng.random(3 * Hin) * 0.02 + 0.001).astype(np.float32),
             "x_zp": np.uint8(60), "w_zp": rng.integers(-3, 4, 3 * Hin).astype(np.int8), "w_s1": np.float32(0.01),
             "w_zp1": np.int8(1)}
    for k, shape in (("word", (V, Hin)), ("pos", (12, Hin)), ("seg", (2, Hin)), ("gamma", (Hin,)), ("beta", (Hin,))):
        inits[f"{k}_q"] = rng.integers(0, 256, shape).astype(np.uint8)
        inits[f"{k}_s"] = np.float32(rng.random() * 0.02 + 0.005)
        inits[f"{k}_zp"] = np.uint8(rng.integers(100, 150))
    lengths = np.array([3, 5], np.int32)
    past = _f(2, B, N, P, Hin // N)
    ids = rng.integers(0, V, (B, S)).astype(np.int32)
    seg = rng.integers(0, 2, (B, S)).astype(np.int32)
    mask = np.array([[1] * 5, [1] * 2 + [0] * 3], np.int32)
    nodes = [h.make_node("QAttention", ["x", "w", "bias", "x_s", "w_s", "lengths", "x_zp", "w_zp"], ["y"], domain=MS,
                         num_heads=N),
             h.make_node("QAttention", ["x", "w", "bias", "x_s", "w_s1", "", "x_zp", "w_zp1", "past"], ["y2", "present"],
                         domain=MS, num_heads=N, unidirectional=1),
             h.make_node("QEmbedLayerNormalization", ["ids", "seg", "word_q", "pos_q", "seg_q", "gamma_q", "beta_q", "mask",
                                                      "word_s", "pos_s", "seg_s", "gamma_s", "beta_s",
                                                      "word_zp", "pos_zp", "seg_zp", "gamma_zp", "beta_zp"],
                         ["emb", "mask_index"], domain=MS, epsilon=1e-5)]
    feeds = {"x": x, "lengths": lengths, "past": past, "ids": ids, "seg": seg, "mask": mask}
    path, refs = _model(tmp_path / "qattn.onnx", nodes, feeds, inits, ["y", "y2", "present", "emb", "mask_index"])
    _check(path, refs, feeds)
