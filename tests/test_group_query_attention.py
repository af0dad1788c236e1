"""onnxruntime's GroupQueryAttention (dlcc/fused_ops.py) on PoCL, against onnxruntime's own CPU
kernel: the KV cache as prompt, decode step (ragged batches too) and later prompt chunk; packed
and separate Q/K/V; the rotary embedding (halves, interleaved, partial, given position ids); the
local window, softcap, attention bias, smooth softmax and per-head sinks; non-causal attention;
float16. Then a real model: a random-weight Llama written by onnxruntime-genai's model builder
(GroupQueryAttention, SkipSimplifiedLayerNormalization, MatMulNBits at int4), run through a
prompt and decode steps that feed each present back as the next past, as a generation loop
does. Several nodes share a model where their shapes allow, so one compile checks them all."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

import dlcc
from conftest import opencl_device_available, run_main
from dlcc.errors import DlccError

needs_opencl = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")
MS = "com.microsoft"
rng = np.random.default_rng(7)


def _f(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def _ort(model, feeds) -> list[np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


class _Case:
    """One model of GroupQueryAttention nodes over shared inputs: a batch of B, S new tokens, a
    past of P (0: none), head size H, each node with its own heads, inputs and attributes."""

    def __init__(self, B, S, P, H, seqlens=None, dtype=np.float32, total=None):
        """`total`: total_sequence_length as a constant (so that it folds: a fixed-size cache
        where it is at most P), else P + S fed at run time."""
        self.B, self.S, self.P, self.H, self.dtype = B, S, P, H, dtype
        self.feeds: dict[str, np.ndarray] = {}
        self.inits: dict[str, np.ndarray] = {}
        self.nodes: list = []
        self.outputs: list[str] = []
        self.valid: dict[str, list[int]] = {}  # output -> valid rows per batch entry (a padded prompt)
        self.held: dict[str, list[int]] = {}  # present -> the rows a window-sized cache holds, per entry
        self.feeds["seqlens"] = np.array(seqlens if seqlens is not None else [P + S - 1] * B, np.int32)
        if total is None:
            self.feeds["total"] = np.array(P + S, np.int32)
        else:
            self.inits["total"] = np.array(total, np.int32)
        self.inits["cos"] = np.cos(rng.uniform(0, 6, (32, H // 2))).astype(dtype)
        self.inits["sin"] = np.sin(rng.uniform(0, 6, (32, H // 2))).astype(dtype)

    def node(self, name, N, Nkv, packed=False, rotary=False, pos_ids=False, bias=None, sink=False, valid=None, held=None,
             **attrs):
        B, S, P, H, dt = self.B, self.S, self.P, self.H, self.dtype
        if packed:
            self.feeds[f"{name}_qkv"] = _f(B, S, (N + 2 * Nkv) * H, dtype=dt)
            ins = [f"{name}_qkv", "", ""]
        else:
            self.feeds.update({f"{name}_q": _f(B, S, N * H, dtype=dt), f"{name}_k": _f(B, S, Nkv * H, dtype=dt),
                               f"{name}_v": _f(B, S, Nkv * H, dtype=dt)})
            ins = [f"{name}_q", f"{name}_k", f"{name}_v"]
        if P:
            self.feeds.update({f"{name}_pk": _f(B, Nkv, P, H, dtype=dt), f"{name}_pv": _f(B, Nkv, P, H, dtype=dt)})
            ins += [f"{name}_pk", f"{name}_pv"]
        else:
            ins += ["", ""]
        ins += ["seqlens", "total"]
        extra = []
        if rotary:
            extra += ["cos", "sin"] if rotary is True else [f"{name}_cos", f"{name}_sin"]
            if rotary is not True:  # a partial rotation: a cache narrower than half the head
                for k, fn in (("cos", np.cos), ("sin", np.sin)):
                    self.inits[f"{name}_{k}"] = fn(rng.uniform(0, 6, (32, rotary))).astype(dt)
            attrs.setdefault("do_rotary", 1)
        if pos_ids:
            self.feeds[f"{name}_pos"] = rng.integers(0, 20, (B, S)).astype(np.int64)
            extra += ["", ""] * (not rotary) + [f"{name}_pos"]
        if bias is not None:
            self.feeds[f"{name}_bias"] = _f(*bias, dtype=dt)
            extra += [""] * (3 - len(extra)) + [f"{name}_bias"]
        if sink:
            self.inits[f"{name}_sink"] = _f(N, dtype=dt)
            extra += [""] * (4 - len(extra)) + [f"{name}_sink"]
        outs = [f"{name}_out", f"{name}_present_k", f"{name}_present_v"]
        self.nodes.append(h.make_node("GroupQueryAttention", ins + extra, outs, domain=MS, name=name,
                                      num_heads=N, kv_num_heads=Nkv, **attrs))
        self.outputs += outs
        if valid is not None:
            self.valid[outs[0]] = valid
        if held is not None:
            self.held.update({outs[1]: held, outs[2]: held})

    def check(self, tmp_path, pipeline="astitch", rtol=1e-4, atol=2e-5):
        ins = [h.make_tensor_value_info(n, h.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in self.feeds.items()]
        g = h.make_graph(self.nodes, "gqa", ins, [h.make_empty_tensor_value_info(o) for o in self.outputs],
                         [nh.from_array(v, k) for k, v in self.inits.items()])
        m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(MS, 1)], ir_version=8)
        refs = _ort(m, self.feeds)
        for o, r in zip(m.graph.output, refs):  # onnx cannot infer com.microsoft ops: onnxruntime's shapes
            o.CopyFrom(h.make_tensor_value_info(o.name, h.np_dtype_to_tensor_dtype(r.dtype), r.shape))
        path = tmp_path / "gqa.onnx"
        onnx.save(m, path)
        got = dlcc.compile(path, target="opencl", pipeline=pipeline)(self.feeds)
        for name, r in zip(self.outputs, refs):
            assert got[name].shape == r.shape and got[name].dtype == r.dtype, (name, got[name].shape, r.shape)
            rows, held = self.valid.get(name), self.held.get(name)
            for b in range(self.B):  # (a padded prompt's rows past its length are unspecified in onnxruntime,
                n = rows[b] if rows else r.shape[1]  # and so are a window-sized cache's rows past what it holds)
                g, want = got[name][b, :n].astype(np.float32), r[b, :n].astype(np.float32)
                if held:
                    assert not got[name][b, :, held[b]:].any(), (name, b)  # dlcc writes zeros there
                    g, want = g[:, :held[b]], want[:, :held[b]]
                np.testing.assert_allclose(g, want, rtol=rtol, atol=atol, err_msg=f"{name}, batch entry {b}")


@needs_opencl
def test_decode_step(tmp_path):
    """One new token per entry over a past of 5, one entry shorter (a ragged batch: its past rows
    past its length are dropped, its new row lands at its own position, the rest are zeros):
    separate and packed Q/K/V, the rotary embedding in halves and interleaved, with given
    position ids, the local window, softcap before an attention bias of every head or of one,
    smooth softmax, per-head sinks; 4 query heads on 2 or 1 KV heads, or on 4."""
    c = _Case(B=2, S=1, P=5, H=16, seqlens=[5, 3])
    c.node("plain", 4, 2)
    c.node("mha", 4, 4, scale=0.3)
    c.node("packed_rot", 4, 1, packed=True, rotary=True)
    c.node("interleaved", 4, 2, rotary=True, rotary_interleaved=1)
    c.node("pos_ids", 4, 2, rotary=True, pos_ids=True)
    c.node("window", 4, 2, local_window_size=3)
    c.node("cap_bias", 4, 2, bias=(2, 4, 1, 6), softcap=1.5)
    c.node("bias_one_head", 4, 2, bias=(1, 1, 1, 6))
    c.node("smooth", 4, 2, smooth_softmax=1)
    c.node("sinks", 4, 2, sink=True)
    # 0/1 attributes at 2 are off, as onnxruntime reads them (a mutated model found dlcc rotating)
    c.node("flags_at_2", 4, 2, rotary=True, do_rotary=2, rotary_interleaved=2, smooth_softmax=2)
    c.check(tmp_path)


@needs_opencl
def test_prompt(tmp_path):
    """The first prompt (no past): causal masking, a right-padded entry (whose padded rows
    onnxruntime leaves unspecified; its present keeps them), the window, the rotary embedding
    with position ids (only the first is read, as an offset), non-causal attention over each
    entry's length."""
    c = _Case(B=2, S=6, P=0, H=16, seqlens=[5, 3])
    c.node("plain", 4, 2, valid=[6, 4])
    c.node("packed_rot", 4, 2, packed=True, rotary=True, valid=[6, 4])
    c.node("pos_ids", 4, 1, rotary=True, pos_ids=True, valid=[6, 4])
    c.node("window", 4, 2, local_window_size=2, valid=[6, 4])
    c.node("non_causal", 4, 2, causal=0, valid=[6, 4])
    c.check(tmp_path)


@needs_opencl
def test_later_prompt_chunk(tmp_path):
    """3 new tokens after a past of 4 (a prompt continued in chunks: batch 1): causal masking from
    the past's end, a rotary cache narrower than half the head (a partial rotation), softcap
    with a window; through the `full` pipeline."""
    c = _Case(B=1, S=3, P=4, H=32)
    c.node("plain", 4, 2, rotary=True)
    c.node("partial", 2, 1, rotary=8)
    c.node("cap_window", 4, 2, softcap=2.0, local_window_size=3)
    c.check(tmp_path, pipeline="full")


@needs_opencl
@pytest.mark.parametrize("S, total, seqlens", [(1, 6, [5, 3]), (1, 8, [7, 2]), (4, 4, [3, 2])],
                         ids=["decode", "decode-at-capacity", "first-prompt"])
def test_fixed_size_cache(tmp_path, S, total, seqlens):
    """onnxruntime's fixed-size cache (onnxruntime-genai's shared past/present buffer of
    max_length rows): total_sequence_length at most P, present P rows long. A decode step with a
    ragged batch, one whose total is the whole buffer (one plan for every step, the attention
    mask as long as the buffer), and a first prompt (S = total: no past row read)."""
    c = _Case(B=2, S=S, P=8, H=16, seqlens=seqlens, total=total)
    c.node("plain", 4, 2, valid=[s + 1 for s in seqlens] if S > 1 else None)
    c.node("rot_window", 4, 1, rotary=True, local_window_size=3, valid=[s + 1 for s in seqlens] if S > 1 else None)
    c.check(tmp_path)


@needs_opencl
@pytest.mark.parametrize("S, C, seqlens", [(1, 6, [9, 4]), (1, 6, [6, 5]), (3, 8, [2, 2]), (2, 6, [11])],
                         ids=["decode-evicting", "decode-at-capacity", "first-prompt", "chunk-evicting"])
def test_window_sized_cache(tmp_path, S, C, seqlens):
    """onnxruntime's window-sized cache (sliding_window_cache: Gemma 2 and 3's local layers):
    C rows hold the most recent positions, evicted C - W + 1 at a time once full; attention
    reads the past's rows and the new ones by their positions. A ragged batch decoding with and
    without eviction, a first prompt, and a chunk of two tokens that evicts."""
    def held(window: int) -> list[int]:  # onnxruntime's L(T), from its schema's text
        g = C - window + 1
        return [t if t <= C else t - g * -(-(t - C) // g) for t in (s + 1 for s in seqlens)]

    c = _Case(B=len(seqlens), S=S, P=C, H=16, seqlens=seqlens, total=max(seqlens) + 1)
    c.node("window", 4, 2, local_window_size=4, sliding_window_cache=1, held=held(4))
    c.node("rot_cap", 4, 1, rotary=True, local_window_size=3, sliding_window_cache=1, softcap=5.0, held=held(3))
    c.check(tmp_path)


@needs_opencl
def test_float16(tmp_path):
    """A float16 model: the scores and softmax in float32 (as onnxruntime's kernel computes
    them), the presents exact copies."""
    c = _Case(B=2, S=1, P=4, H=16, seqlens=[4, 2], dtype=np.float16)
    c.node("half", 4, 2, rotary=True)
    c.check(tmp_path, rtol=2e-3, atol=2e-3)


def _gqa_model(path, total=None, **attrs) -> str:
    """One GroupQueryAttention over a past of 5 (`total`: total_sequence_length as a constant)."""
    extra = attrs.pop("extra", [])
    ins = ["q", "k", "v", "pk", "pv", "seqlens", "total"] + extra
    g = h.make_graph([h.make_node("GroupQueryAttention", ins, ["o", "prk", "prv"], domain=MS, name="gqa",
                                  **{"num_heads": 4, "kv_num_heads": 2, **attrs})], "g",
                     [h.make_tensor_value_info("q", TP.FLOAT, [1, 1, 64]), h.make_tensor_value_info("k", TP.FLOAT, [1, 1, 32]),
                      h.make_tensor_value_info("v", TP.FLOAT, [1, 1, 32]),
                      h.make_tensor_value_info("pk", TP.FLOAT, [1, 2, 5, 16]), h.make_tensor_value_info("pv", TP.FLOAT, [1, 2, 5, 16]),
                      h.make_tensor_value_info("seqlens", TP.INT32, [1])]
                     + ([h.make_tensor_value_info("total", TP.INT32, [])] if total is None else [])
                     + [h.make_tensor_value_info(n, TP.INT32, [1]) for n in extra if n],
                     [h.make_tensor_value_info(o, TP.FLOAT, shape) for o, shape in
                      (("o", [1, 1, 64]), ("prk", [1, 2, 6, 16]), ("prv", [1, 2, 6, 16]))],
                     [] if total is None else [nh.from_array(np.array(total, np.int32), "total")])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(MS, 1)], ir_version=8), path)
    return str(path)


@pytest.mark.parametrize("attrs, message", [
    ({"num_heads": 3}, "num_heads 3 must be a positive multiple of kv_num_heads 2"),
    ({"local_window_size": 0}, "local_window_size 0 leaves every query no key"),
    ({"causal": 0, "local_window_size": 2}, "local_window_size -1 without it"),
    ({"sliding_window_cache": 1}, r"a window-sized cache \(sliding_window_cache\) needs local_window_size"),
    ({"sliding_window_cache": 1, "local_window_size": 8}, r"a window-sized cache of 5 rows is smaller than the window of 8"),
    ({"k_quant_type": "PER_TENSOR"}, r"quantized KV cache\) is not supported"),
    ({"qk_output": 1}, "output_qk is not supported"),
    ({"do_rotary": 1}, "do_rotary needs cos_cache and sin_cache"),
    ({"extra": ["", "", "", "", "", "", "", "", "", "qs"]}, "query_seqlens is not supported"),
])
def test_forms_dlcc_refuses_are_named(tmp_path, attrs, message):
    with pytest.raises(DlccError, match=r"GroupQueryAttention 'gqa': .*" + message):
        dlcc.compile(_gqa_model(tmp_path / "g.onnx", **attrs), target="opencl")


def test_a_total_length_that_is_neither_form_of_cache_is_named(tmp_path):
    with pytest.raises(DlccError, match=r"GroupQueryAttention 'gqa': total_sequence_length 9 must be the past's 5 rows "
                                        r"plus the 1 new ones \(a growing cache\), or between 1 and 5 \(a fixed-size one\)"):
        dlcc.compile(_gqa_model(tmp_path / "g.onnx", total=9), target="opencl")


@needs_opencl
def test_a_total_length_known_only_at_run_time_must_be_past_plus_new(tmp_path):
    """Fed at run time, total_sequence_length cannot choose the present's length (dlcc compiles
    static shapes): the cache grows (P + S rows), and any other total is an error after the run
    instead of another cache. So is a seqlens_k past it, as in onnxruntime."""
    m = dlcc.compile(_gqa_model(tmp_path / "g.onnx"), target="opencl")
    feeds = {"q": _f(1, 1, 64), "k": _f(1, 1, 32), "v": _f(1, 1, 32), "pk": _f(1, 2, 5, 16), "pv": _f(1, 2, 5, 16),
             "seqlens": np.array([4], np.int32), "total": np.array(6, np.int32)}
    m(feeds)
    with pytest.raises(DlccError, match="total_sequence_length_must_be_past_plus_new"):
        m({**feeds, "total": np.array(5, np.int32)})
    with pytest.raises(DlccError, match=r"Gather node 'gqa/seqlens_k_must_lie_in_0_to_total_sequence_length\d+'"):
        m({**feeds, "seqlens": np.array([6], np.int32)})


# -- a real model: onnxruntime-genai's builder -------------------------------------------------

def _genai_llama(tmp_path, precision: str, family: str = "llama") -> str:
    """A random-weight Llama (2 layers, 4 query and 2 KV heads; or a Gemma 2, whose first layer
    attends through a window of 8) written by onnxruntime-genai's model builder for its CPU
    provider, as `python -m onnxruntime_genai.models.builder` writes it."""
    pytest.importorskip("onnxruntime_genai")
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from tokenizers import Tokenizer, models, pre_tokenizers

    src, out = tmp_path / "hf", tmp_path / f"onnx-{precision}"
    common = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    if family == "gemma2":
        cfg = transformers.Gemma2Config(**common, head_dim=16, sliding_window=8, attn_logit_softcapping=50.0,
                                        final_logit_softcapping=30.0, query_pre_attn_scalar=16)
        transformers.Gemma2ForCausalLM(cfg).save_pretrained(src)
    else:
        transformers.LlamaForCausalLM(transformers.LlamaConfig(**common)).save_pretrained(src)
    tok = Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(256)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0").save_pretrained(src)
    run = subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(src), "-o", str(out),
                          "-p", precision, "-e", "cpu"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    return str(out / "model.onnx")


@needs_opencl
@pytest.mark.parametrize("precision, pipeline", [("fp32", "full"), ("int4", "astitch")])
def test_genai_llama_generates_as_onnxruntime_does(tmp_path, precision, pipeline):
    """A prompt of 5 tokens for 2 sequences, then 2 decode steps, each feeding the presents back
    as the next past and the argmax of the logits as the next token, as onnxruntime-genai's loop
    does: every step's logits and presents match onnxruntime's, and so do the tokens chosen.
    One dynamic model compiles a plan for each step's shapes; the prompt's past has 0 rows (an
    empty input)."""
    import onnxruntime as ort

    path = _genai_llama(tmp_path, precision)
    ref_model = onnx.load(path)
    for n in ref_model.graph.node:  # the builder's int4 products quantize activations to int8 (accuracy_level
        for a in n.attribute:       # 4); dlcc's are float products, onnxruntime's at level 0 (as verify runs it)
            if n.op_type == "MatMulNBits" and a.name == "accuracy_level":
                a.i = 0
    sess = ort.InferenceSession(ref_model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    B, S, L, kv, hd = 2, 5, 2, 2, 16
    ids = rng.integers(0, 256, (B, S)).astype(np.int64)
    past = {f"past_key_values.{i}.{t}": np.zeros((B, kv, 0, hd), np.float32) for i in range(L) for t in ("key", "value")}
    P = 0
    m = dlcc.compile(path, target="opencl", pipeline=pipeline, dynamic=True)  # a plan for each step's shapes
    for step in range(3):
        s = ids.shape[1]
        feeds = {"input_ids": ids, "attention_mask": np.ones((B, P + s), np.int64), **past}
        ref = dict(zip(names, sess.run(None, feeds)))
        got = m(feeds)
        assert m.plans[-1]["attention_mask"] == (B, P + s)
        for n in names:
            np.testing.assert_allclose(got[n], ref[n], rtol=1e-3, atol=1e-4, err_msg=f"step {step}: {n}")
        assert (got["logits"][:, -1].argmax(-1) == ref["logits"][:, -1].argmax(-1)).all()
        ids = ref["logits"][:, -1].argmax(-1)[:, None].astype(np.int64)
        past = {f"past_key_values.{i}.{t}": ref[f"present.{i}.{t}"] for i in range(L) for t in ("key", "value")}
        P += s


@needs_opencl
def test_genai_llama_decodes_every_step_with_one_plan(tmp_path):
    """onnxruntime-genai's way to keep shapes fixed (its CUDA graphs): a past of max_length rows
    and an attention mask as long, its ones the tokens so far. Then one compiled plan serves every
    decode step, each present fed back as the next past; logits, presents and tokens match
    onnxruntime's at every step."""
    import onnxruntime as ort

    path = _genai_llama(tmp_path, "fp32")
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    B, S, L, kv, hd, M = 2, 4, 2, 2, 16, 12
    keys = [f"past_key_values.{i}.{t}" for i in range(L) for t in ("key", "value")]
    ids = rng.integers(0, 256, (B, S)).astype(np.int64)
    prompt = {"input_ids": ids, "attention_mask": np.ones((B, S), np.int64),
              **{k: np.zeros((B, kv, 0, hd), np.float32) for k in keys}}
    out = dict(zip(names, sess.run(None, prompt)))
    step = dlcc.compile(path, target="opencl", pipeline="full",
                        shapes={"batch_size": (B,), "sequence_length": (1,), "past_sequence_length": (M,),
                                "total_sequence_length": (M,), "kv_cache_dim": (hd,)})
    past = {k: np.pad(out[k.replace("past_key_values", "present")], ((0, 0), (0, 0), (0, M - S), (0, 0))) for k in keys}
    token = out["logits"][:, -1].argmax(-1)[:, None].astype(np.int64)
    for n in range(S, S + 3):  # n tokens in the cache before this step
        feeds = {"input_ids": token, "attention_mask": (np.arange(M) <= n).astype(np.int64)[None].repeat(B, 0), **past}
        ref = dict(zip(names, sess.run(None, feeds)))
        got = step(feeds)
        for name in names:
            assert got[name].shape == ref[name].shape, name
            np.testing.assert_allclose(got[name], ref[name], rtol=1e-3, atol=1e-4, err_msg=f"{n} tokens: {name}")
        token = ref["logits"][:, -1].argmax(-1)[:, None].astype(np.int64)
        assert (got["logits"][:, -1].argmax(-1) == token[:, 0]).all()
        past = {k: ref[k.replace("past_key_values", "present")] for k in keys}


@needs_opencl
def test_genai_gemma2_window_cache_verifies(tmp_path):
    """A Gemma 2 from the builder: its first layer's cache is window-sized (sliding_window_cache),
    its second grows. `dlcc verify` passes on a prompt and on a decode step before the window
    fills, where onnxruntime leaves the window cache's rows past the tokens unwritten: verify
    says it does not compare those, and compares everything else."""
    path = _genai_llama(tmp_path, "fp32", family="gemma2")
    base = ["verify", path, "-t", "opencl", "-p", "astitch", "-s", "batch_size=2", "-s", "kv_cache_dim=16",
            "-s", "past_sliding_length=8"]
    for dims in (["sequence_length=5", "past_sequence_length=0", "total_sequence_length=5"],
                 ["sequence_length=1", "past_sequence_length=5", "total_sequence_length=6"]):
        code, out, err = run_main(*base, *[x for d in dims for x in ("-s", d)])
        assert code == 0 and "all outputs match" in out, out[-3000:] + err[-2000:]
        assert "values onnxruntime leaves unspecified" in out, out[-3000:]
