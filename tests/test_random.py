"""Random draws (dlcc/random_draws.py, dlcc/ops/random.py): Philox4x32-10 streams computed by map
kernels, which the host recomputes exactly.

The draws' values are checked three ways: the generator against Random123's published known
answers; every compiled draw against the host's stream (verify hands onnxruntime dlcc's draws, so
the outputs downstream of a draw compare as any other output); and the distributions against the
operators' definitions (ranges, moments, Bernoulli's probability)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import dlcc
from dlcc.backends.nvcc import compile_cubin, find_nvcc
from dlcc.backends.source import render
from dlcc.random_draws import philox4x32
from dlcc.verify import verify_outputs

PIPELINES = ("baseline", "astitch", "full")


def _model(nodes, inputs, outputs, opset=17, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def _draws_model(path):
    """Every draw form, seeded and not, feeding elementwise chains AStitch stitches, plus raw draws
    as outputs: a float16 *Like draw, a normal draw scaled and shifted."""
    nodes = [
        helper.make_node("RandomUniform", [], ["u"], shape=[4, 33], low=-2.0, high=3.0, seed=7.0),
        helper.make_node("RandomNormal", [], ["n"], shape=[4, 33], mean=1.0, scale=0.5),
        helper.make_node("RandomUniformLike", ["x"], ["ul"], dtype=TensorProto.FLOAT16),
        helper.make_node("RandomNormalLike", ["x"], ["nl"]),
        helper.make_node("Mul", ["x", "u"], ["xu"]),
        helper.make_node("Add", ["xu", "n"], ["y0"]),
        helper.make_node("Relu", ["y0"], ["y"]),
        helper.make_node("Cast", ["ul"], ["ulf"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["ulf", "nl"], ["z0"]),
        helper.make_node("ReduceSum", ["z0"], ["z"], keepdims=0),
    ]
    m = _model(nodes, [_vi("x", [4, 33])], [_vi("y", [4, 33]), _vi("z", []), _vi("n", [4, 33]),
                                              _vi("ul", [4, 33], TensorProto.FLOAT16)])
    onnx.save(m, str(path))
    return path


def test_philox_gives_random123s_known_answers():
    """Random123's kat_vectors for philox4x32-10: counter, key -> output."""
    cases = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
             ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
             ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
              (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
    for ctr, key, want in cases:
        got = philox4x32(*[np.array([c], np.uint64) for c in ctr], *key)
        assert tuple(int(g[0]) for g in got) == want


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_every_draw_is_the_hosts_stream_and_verify_compares_through_it(tmp_path, pipeline):
    """dlcc's outputs against onnxruntime given dlcc's draws (verify): the raw draws and what is
    computed from them match, on the second inference too (the inference number advanced once)."""
    path = _draws_model(tmp_path / "draws.onnx")
    cm = dlcc.compile(path, target="opencl", pipeline=pipeline)
    feeds = {"x": np.random.default_rng(0).standard_normal((4, 33)).astype(np.float32)}
    for call in range(2):
        got = cm(feeds)
        assert cm.executor().random_state()[1] == call + 1
        rows = verify_outputs(path, got, feeds, compiled=cm)
        assert all(r["passed"] for r in rows), rows
        assert "random draw" in rows[0]["note"]


def test_each_inference_draws_anew_and_a_seed_repeats_from_load_to_load(tmp_path):
    path = tmp_path / "two.onnx"
    onnx.save(_model([helper.make_node("RandomUniform", [], ["u"], shape=[64], seed=7.0),
                      helper.make_node("RandomNormal", [], ["n"], shape=[64])], [], [_vi("u", [64]), _vi("n", [64])]),
              str(path))
    a = dlcc.compile(path, target="opencl", pipeline="astitch")
    b = dlcc.load(a.save(tmp_path / "artifact"), target="opencl")  # another load of the same plan
    a1, a2, b1, b2 = a({}), a({}), b({}), b({})
    for k in ("u", "n"):
        assert not np.array_equal(a1[k], a2[k])
    assert np.array_equal(a1["u"], b1["u"]) and np.array_equal(a2["u"], b2["u"])  # seeded: the same sequence
    assert not np.array_equal(a1["n"], b1["n"])  # another load's key draws another sequence
    assert a.executor().random_state()[0] != b.executor().random_state()[0]


def _one_draw(tmp_path, node, out_shape):
    path = tmp_path / f"{node.op_type}.onnx"
    onnx.save(_model([node], [], [_vi(node.output[0], out_shape)]), str(path))
    return dlcc.compile(path, target="opencl", pipeline="astitch")({})[node.output[0]]


def test_uniform_and_normal_draws_have_their_distributions(tmp_path):
    u = _one_draw(tmp_path, helper.make_node("RandomUniform", [], ["u"], shape=[256, 256], low=-2.0, high=3.0),
                  [256, 256])
    assert u.min() >= -2.0 and u.max() < 3.0
    assert abs(u.mean() - 0.5) < 0.05  # (the mean's standard error is 0.0056)
    assert abs((u < 0.5).mean() - 0.5) < 0.01
    n = _one_draw(tmp_path, helper.make_node("RandomNormal", [], ["n"], shape=[256, 256], mean=1.0, scale=2.0),
                  [256, 256])
    assert np.isfinite(n).all()
    assert abs(n.mean() - 1.0) < 0.05 and abs(n.std() - 2.0) < 0.05  # (standard errors 0.008, 0.006)
    assert abs((n < 1.0).mean() - 0.5) < 0.01 and abs((np.abs(n - 1.0) < 2.0).mean() - 0.6827) < 0.01


@pytest.mark.parametrize("p", [0.9, 0.2])
def test_bernoulli_is_one_with_probability_p(tmp_path, p):
    """As the operator's text, torch.bernoulli and onnx.reference have it; onnx's function body for
    Bernoulli (which onnxruntime inlines) is 1 with probability 1 - p. Through verify: dlcc's draws
    given to the reference, which dlcc rewrites as it compiles it."""
    path = tmp_path / "coin.onnx"
    onnx.save(_model([helper.make_node("Bernoulli", ["p"], ["b"], dtype=TensorProto.INT64),
                      helper.make_node("Bernoulli", ["p"], ["c"], seed=3.0)],
                     [_vi("p", [200, 100])], [_vi("b", [200, 100], TensorProto.INT64), _vi("c", [200, 100])], opset=15),
               str(path))
    feeds = {"p": np.full((200, 100), p, np.float32)}
    for pipeline in ("baseline", "astitch"):
        cm = dlcc.compile(path, target="opencl", pipeline=pipeline)
        got = cm(feeds)
        assert got["b"].dtype == np.int64 and set(np.unique(got["b"])) <= {0, 1}
        assert abs(got["b"].mean() - p) < 0.02 and abs(got["c"].mean() - p) < 0.02  # (standard error <= 0.003)
        assert all(r["passed"] for r in verify_outputs(path, got, feeds, compiled=cm))


def test_the_state_advance_is_the_last_launch_to_touch_it_and_draws_stitch(tmp_path):
    path = _draws_model(tmp_path / "draws.onnx")
    for pipeline in ("baseline", "astitch"):
        plan = dlcc.compile(path, target="opencl", pipeline=pipeline).plan
        touch = [k for k, L in enumerate(plan["launches"]) if any(a.get("storage") == "rng" for a in L["args"])]
        advance = [k for k in touch if plan["launches"][k]["kernel"].startswith("random_advance")]
        assert len(advance) == 1 and advance[0] == touch[-1] and len(touch) > 1
        assert plan["storages"]["rng"] == 8
        if pipeline == "astitch":  # draws stitch into the kernels that read them
            assert any(plan["launches"][k]["kernel"].startswith("Stitch") for k in touch)


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not installed")
def test_draw_kernels_compile_for_cuda(tmp_path):
    mn = tmp_path / "mn.onnx"
    onnx.save(_model([helper.make_node("Relu", ["x"], ["l"]), helper.make_node("Multinomial", ["l"], ["s"], sample_size=9)],
                     [_vi("x", [2, 5])], [_vi("s", [2, 9], TensorProto.INT32)]), str(mn))
    codes = {}
    for path in (_draws_model(tmp_path / "draws.onnx"), mn):
        for pipeline in ("baseline", "astitch"):
            m = dlcc.compile(path, target="opencl", pipeline=pipeline)
            codes.update(zip([k["name"] for k in m.plan["kernels"]], m.kernel_codes))
    source = render(list(codes.values()), "cuda")
    for arch in ("sm_80", "sm_90"):
        usage = compile_cubin(source, arch)
        assert set(codes) <= set(usage) and not {k: u for k, u in usage.items() if u.spills}


@pytest.mark.parametrize("dynamo", [False, True])
def test_torch_exports_with_draws_match(tmp_path, dynamo):
    """A VAE-style sampler and a noise mask as torch writes them (rand_like, randn_like, bernoulli,
    rand of a fixed shape), through both exporters and AStitch + Rammer."""
    torch = pytest.importorskip("torch")

    class Sampler(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = torch.nn.Linear(16, 8)

        def forward(self, x):
            mu, logvar = self.enc(x).chunk(2, dim=-1)
            z = mu + torch.exp(0.5 * logvar) * torch.randn_like(mu)
            keep = torch.bernoulli(torch.sigmoid(z))
            noise = torch.rand(x.shape[0], 4)
            return z * keep + noise, torch.rand_like(x).argsort(dim=-1)

    path = tmp_path / "sampler.onnx"
    torch.manual_seed(0)
    x = torch.randn(3, 16)
    torch.onnx.export(Sampler().eval(), (x,), str(path), dynamo=dynamo, opset_version=18 if dynamo else 17,
                      input_names=["x"])
    feeds = {"x": x.numpy()}
    for pipeline in ("astitch", "full"):
        cm = dlcc.compile(path, target="opencl", pipeline=pipeline)
        rows = verify_outputs(path, cm(feeds), feeds, compiled=cm)
        assert all(r["passed"] for r in rows), rows


def test_verify_with_a_fallback_hands_over_each_segments_draws(tmp_path):
    """A draw in a dlcc segment, after a node onnxruntime runs (MaxRoiPool, which dlcc lacks)."""
    path = tmp_path / "split.onnx"
    nodes = [helper.make_node("MaxRoiPool", ["x", "rois"], ["p"], pooled_shape=[2, 2]),
             helper.make_node("RandomNormalLike", ["p"], ["n"], scale=0.1),
             helper.make_node("Add", ["p", "n"], ["y"]),
             helper.make_node("Sigmoid", ["y"], ["s"]),
             helper.make_node("Bernoulli", ["s"], ["b"])]
    onnx.save(_model(nodes, [_vi("x", [1, 2, 6, 6])], [_vi("y", [1, 2, 2, 2]), _vi("b", [1, 2, 2, 2])],
                     inits=[onnx.numpy_helper.from_array(np.array([[0, 0, 0, 4, 4]], np.float32), "rois")]),
              str(path))
    m = dlcc.compile(path, target="opencl", pipeline="astitch", fallback="onnxruntime")
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 2, 6, 6)).astype(np.float32)}
    rows = verify_outputs(path, m(feeds), feeds, compiled=m)
    assert all(r["passed"] for r in rows), rows
    assert "random draw" in rows[0]["note"]


def test_multinomial_samples_the_softmax_and_each_sample_is_the_hosts(tmp_path):
    """Per row: frequencies within 6 standard errors of softmax over the finite logits, as
    onnxruntime's own samples are; a row of no finite logit gives C, as onnxruntime's does. Every
    sample equals the host's (verify: the uniforms dlcc drew, sampled on the logits onnxruntime
    computes), through baseline, astitch and full; a seeded int64 one too."""
    import onnxruntime as ort

    S, inf = 20000, np.float32(np.inf)
    logits = np.array([[0.5, -1.0, 2.0, 0.0, 1.0, -3.0], [-inf, 0.0, 1.0, np.nan, 2.0, -inf],
                       [-inf, -inf, -inf, -inf, -inf, -inf]], np.float32)
    path = tmp_path / "mn.onnx"
    nodes = [helper.make_node("Identity", ["x"], ["l"]),
             helper.make_node("Multinomial", ["l"], ["s"], sample_size=S),
             helper.make_node("Multinomial", ["l"], ["t"], sample_size=7, dtype=TensorProto.INT64, seed=5.0)]
    onnx.save(_model(nodes, [_vi("x", [3, 6])], [_vi("s", [3, S], TensorProto.INT32), _vi("t", [3, 7], TensorProto.INT64)]),
              str(path))
    feeds = {"x": logits}
    finite = np.where(np.isfinite(logits[:2]), logits[:2], -np.inf)
    p = np.exp(finite - finite.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["s"], feeds)[0]
    for pipeline in PIPELINES:
        cm = dlcc.compile(path, target="opencl", pipeline=pipeline)
        got = cm(feeds)
        assert got["s"].dtype == np.int32 and got["t"].dtype == np.int64
        rows = verify_outputs(path, got, feeds, compiled=cm)
        assert all(r["passed"] for r in rows), rows
        for samples in (got["s"], theirs):
            freq = np.stack([np.bincount(samples[b], minlength=6) / S for b in range(2)])
            assert np.abs(freq - p).max() < 6 * np.sqrt(0.25 / S)
            assert (samples[2] == 6).all()


def test_a_random_state_set_again_draws_the_same_and_bad_states_are_refused(tmp_path):
    from dlcc.errors import DlccError

    path = tmp_path / "n.onnx"
    onnx.save(_model([helper.make_node("RandomNormal", [], ["n"], shape=[16])], [], [_vi("n", [16])]), str(path))
    m = dlcc.compile(path, target="opencl", pipeline="astitch")
    m.set_random_state(1234, 5)
    first = m({})["n"]
    assert m.random_state() == (1234, 6)
    assert not np.array_equal(m({})["n"], first)
    m.set_random_state(1234, 5)
    assert np.array_equal(m({})["n"], first)
    for bad in ((-1, 0), (2 ** 32, 0), (0, 2 ** 32)):
        with pytest.raises(DlccError, match="two 32-bit numbers"):
            m.set_random_state(*bad)
    relu = tmp_path / "relu.onnx"
    onnx.save(_model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [4])], [_vi("y", [4])]), str(relu))
    plain = dlcc.compile(relu, target="opencl")
    assert plain.random_state() is None
    with pytest.raises(DlccError, match="no random draws"):
        plain.set_random_state(1)


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_scalar_draw_stitches(tmp_path, pipeline):
    """A draw of a rank-0 tensor (noise on a full reduction): the state broadcasts to it (AStitch's
    index maps once failed to broadcast a one-element state to a scalar)."""
    path = tmp_path / "scalar.onnx"
    onnx.save(_model([helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                      helper.make_node("RandomNormalLike", ["s"], ["n"], scale=0.01),
                      helper.make_node("Add", ["s", "n"], ["y"]), helper.make_node("Mul", ["y", "x"], ["z"])],
                     [_vi("x", [3, 5])], [_vi("z", [3, 5])]), str(path))
    cm = dlcc.compile(path, target="opencl", pipeline=pipeline)
    feeds = {"x": np.random.default_rng(2).standard_normal((3, 5)).astype(np.float32)}
    rows = verify_outputs(path, cm(feeds), feeds, compiled=cm)
    assert all(r["passed"] for r in rows), rows
