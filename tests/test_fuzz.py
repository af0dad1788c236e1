"""Differential fuzzing in the default suite (issue 17): a fixed, deterministic batch of generated
graphs through every pipeline and option set on OpenCL, compared with onnxruntime; graphs dlcc
must refuse; and the generator, shrinker and worker pool themselves.

Large runs are `scripts/fuzz.py` (docs/fuzzing.md)."""
from __future__ import annotations

import functools
import os
import time

import numpy as np
import onnx
import pytest

from conftest import opencl_device_available
from dlcc.backends.nvcc import find_nvcc
from dlcc.testing import graphgen
from dlcc.testing.choices import Chooser
from dlcc.testing.oracle import FAILURES, all_configs, check_case_task, unsupported_task

#: The default batch: seeds 0..BATCH-1, in chunks that pytest-xdist spreads over its workers.
BATCH, CHUNK = 15, 3
NVCC_BATCH = 3  # of those, through nvcc too (the CUDA text, for sm_90 and sm_80)
needs_opencl = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")


@needs_opencl
@pytest.mark.parametrize("first", range(0, BATCH, CHUNK))
def test_fuzz_batch(first, monkeypatch):
    """Every configuration of every graph in the chunk passes (or is ill-conditioned: `unstable`,
    which the float64 arbiter decides). A refused graph fails too: the generator only uses what
    dlcc supports. Kernels are built as scripts/fuzz.py --quick-build builds them (-cl-opt-disable:
    about 5x less build time, which dominates here; the rest of the suite builds optimised)."""
    monkeypatch.setenv("DLCC_OPENCL_BUILD_OPTIONS", "-cl-opt-disable")
    problems = []
    for seed in range(first, first + CHUNK):
        rec = check_case_task({"seed": seed, "targets": ["opencl"]})
        assert "generator_bug" not in rec, rec
        for v in rec["verdicts"]["opencl"]:
            if v["status"] in FAILURES + ("refused",):
                problems.append(f"seed {seed} {v['config']}: {v['status']}: {v.get('detail', '')[:500]}")
    assert not problems, "\n".join(problems) + "\nshrink one with: scripts/fuzz.py --seed S --n 1 --shrink"


def _extreme_fills(case) -> set:
    """The float32-edge constants of a generated graph: -inf, float32's lowest and largest, -1e9,
    and the scales and fills past float16's largest (65504)."""
    vals = set()
    for t in case.model.graph.initializer:
        a = onnx.numpy_helper.to_array(t)
        if a.dtype == np.float32 and a.size == 1 and abs(a.item()) > 65504:
            vals.add(a.item())
    return vals


def test_extremes_generate_float32s_edges_as_models_write_them():
    """`extremes=True` adds masks of -inf, finfo.min, -1e9 and past float16's range (as Where or
    (1 - mask) * fill, before Softmax, LogSoftmax or ReduceMax), MaxPool over padding of them,
    clamps to float32's limits and scales past float16's largest; every reference stays finite
    (an -inf mask always keeps a key in each row). Without it a seed's graph has none of them."""
    fmax = float(np.finfo(np.float32).max)
    seen, users = set(), set()
    for seed in range(120):
        case = graphgen.generate_valid(seed, extremes=True)
        for r in case.refs.values():
            assert r.dtype.kind != "f" or np.all(np.isfinite(r))
        fills = _extreme_fills(case)
        seen |= fills
        if fills:
            users |= {op for op in case.ops if op in ("Softmax", "LogSoftmax", "ReduceMax", "MaxPool", "Clip")}
        if seed < 40:
            assert not _extreme_fills(graphgen.generate(seed)), seed
    assert {-np.inf, -fmax, fmax, -1e9, -131072.0, 1e5} <= seen, seen
    assert {"Softmax", "LogSoftmax", "ReduceMax", "MaxPool", "Clip"} <= users


@functools.cache
def _extreme_seeds() -> list[int]:
    """The first three seeds whose extremes=True graph has an -inf or float32's-lowest fill."""
    low = {-np.inf, -float(np.finfo(np.float32).max)}
    return [s for s in range(60) if low & _extreme_fills(graphgen.generate_valid(s, extremes=True))][:3]


#: The configurations the extremes and float16-model batches run: each pipeline, a joined persistent
#: kernel, the GPU plans, and global stitching (scripts/fuzz.py runs all 25).
SUBSET = ["baseline", "astitch", "full", "full-join-always", "astitch-for-h100", "full-for-h100", "astitch[global]"]


def _batch_problems(seeds, **task) -> list[str]:
    """Each seed's graph (`task`: the generator's flags and the configurations) checked on OpenCL:
    a line for every failing or refused configuration."""
    problems = []
    for seed in seeds:
        rec = check_case_task({"seed": seed, "targets": ["opencl"], **task})
        assert "generator_bug" not in rec and "invalid" not in rec, rec
        for v in rec["verdicts"]["opencl"]:
            if v["status"] in FAILURES + ("refused",):
                problems.append(f"seed {seed} {v['config']}: {v['status']}: {v.get('detail', '')[:500]}")
    return problems


@needs_opencl
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_fuzz_extremes_batch(precision, monkeypatch):
    """Three graphs with -inf or finfo.min masks through the main configurations, at fp32 and fp16
    (where those constants are beyond the storage type: what reads them stays float32)."""
    monkeypatch.setenv("DLCC_OPENCL_BUILD_OPTIONS", "-cl-opt-disable")
    configs = [c if precision == "fp32" else f"{c}@{precision}" for c in SUBSET]
    problems = _batch_problems(_extreme_seeds(), extremes=True, configs=configs)
    assert len(_extreme_seeds()) == 3 and not problems, "\n".join(problems)


@pytest.mark.parametrize("half, code", [(True, onnx.TensorProto.FLOAT16), ("bf16", onnx.TensorProto.BFLOAT16)])
def test_half_models_are_half_models_with_a_widened_reference(half, code):
    """`half=True` converts each graph with onnxconverter-common: float16 initializers, float16
    or float32 inputs and outputs (Casts around a float16 graph), and the
    reference is onnxruntime on the model widened to float32, its float16 outputs rounded back
    (what `dlcc verify` compares with). `half="bf16"` makes the same graph a bfloat16 model: no
    float16 is left anywhere, and an op whose schema takes no bfloat16 at the graph's opset
    reads and writes float32 between Casts."""
    from dlcc.verify import widen_graph

    kinds, made, islands = set(), 0, 0
    for seed in range(30):
        try:
            case = graphgen.generate(seed, half=half)
        except graphgen.InvalidCase as e:
            assert "onnxconverter-common" in str(e) or "not finite" in str(e), e
            continue
        made += 1
        g = case.model.graph
        io = {vi.type.tensor_type.elem_type for vi in list(g.input) + list(g.output)} & {1, code}
        assert len(io) == 1, io  # all half or all float32
        # half inside: half feeds, or the Casts after float32 ones (the initializers that ops of
        # the converter's block list read stay float32)
        to16 = [n for n in g.node if n.op_type == "Cast" and n.attribute[0].i == code]
        assert io == {code} or to16
        kinds |= io
        if code == onnx.TensorProto.BFLOAT16:
            assert onnx.TensorProto.FLOAT16 not in {t.data_type for t in g.initializer} | {
                a.i for n in g.node for a in n.attribute if a.name in ("to", "dtype")}
            opset = case.model.opset_import[0].version
            made_f32 = {o for n in g.node if n.op_type == "Cast" and n.attribute[0].i == 1 for o in n.output
                        if "/float32/" in o}
            for n in g.node:
                if set(n.input) & made_f32:
                    islands += 1
                    assert not graphgen._takes_bfloat16(n.op_type, opset), n.op_type
        for vi in g.input:
            assert case.feeds[vi.name].dtype == onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        wide = onnx.ModelProto()
        wide.CopyFrom(case.model)
        widen_graph(wide.graph)
        refs = graphgen.reference(wide, {k: v.astype(np.float32) if v.dtype in graphgen.HALF_DTYPES else v
                                         for k, v in case.feeds.items()})
        for vi in g.output:
            r = case.refs[vi.name]
            assert r.dtype == onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
            np.testing.assert_array_equal(r, refs[vi.name].astype(r.dtype))
    assert made >= 20 and kinds == {1, code}
    assert code == onnx.TensorProto.FLOAT16 or islands >= 3


@needs_opencl
@pytest.mark.parametrize("half, precision", [(True, "fp32"), (True, "fp16"), ("bf16", "bf16")])
def test_fuzz_half_models_batch(half, precision, monkeypatch):
    """Three float16 models through the main configurations, at fp32 (computed in float32 inside,
    rounded at the float16 outputs) and at fp16 (activations stored in float16); three bfloat16
    models at bf16."""
    monkeypatch.setenv("DLCC_OPENCL_BUILD_OPTIONS", "-cl-opt-disable")
    configs = [c if precision == "fp32" else f"{c}@{precision}" for c in SUBSET]
    problems = _batch_problems(range(3), half=half, configs=configs)
    assert not problems, "\n".join(problems)


#: What `more_ops=True` adds (dlcc/testing/graphgen_more.py): ops lowered by rewrites of their own.
MORE_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "Einsum",
            "GridSample", "AffineGrid", "DeformConv", "Shape", "Size", "Range", "ConstantOfShape", "EyeLike", "OneHot",
            "Compress", "ReverseSequence", "Hardmax", "LpNormalization", "LpPool", "GlobalLpPool", "Loop",
            "SplitToSequence", "SequenceConstruct", "SequenceErase", "SequenceAt", "SequenceLength",
            "ConcatFromSequence", "Attention", "RotaryEmbedding", "RMSNormalization"}


def test_more_ops_write_what_only_rewrites_lower():
    """`more_ops=True` writes every op of MORE_OPS within 200 graphs (opsets 21 and 23 among
    them), each valid with a finite reference; without it a seed's graph has none of them."""
    seen, opsets = set(), set()
    for seed in range(200):
        case = graphgen.generate_valid(seed, more_ops=True)
        seen |= set(case.ops) & MORE_OPS
        opsets.add(case.model.opset_import[0].version)
        if seed < 30:
            assert not set(graphgen.generate(seed).ops) & MORE_OPS, seed
        if seen == MORE_OPS and {21, 23} <= opsets:
            break
    assert seen == MORE_OPS and {21, 23} <= opsets, (MORE_OPS - seen, opsets)


@functools.cache
def _more_ops_seeds() -> list[int]:
    """The first `more_ops` graph with a quantizer, one with an Einsum or a GridSample, one with a
    Loop, one with a sequence, and one with opset 23's Attention or RotaryEmbedding."""
    groups = [{"QuantizeLinear", "DynamicQuantizeLinear"}, {"Einsum", "GridSample"}, {"Loop"},
              {"SplitToSequence", "SequenceConstruct"}, {"Attention", "RotaryEmbedding"}]
    seeds: list[int] = []
    for group in groups:
        seeds.append(next(s for s in range(300) if s not in seeds
                          and group & set(graphgen.generate_valid(s, more_ops=True).ops)))
    return seeds


@needs_opencl
def test_fuzz_more_ops_batch(monkeypatch):
    """Five `more_ops` graphs (quantization, Einsum or GridSample, Loop, sequences, Attention)
    through the main configurations."""
    monkeypatch.setenv("DLCC_OPENCL_BUILD_OPTIONS", "-cl-opt-disable")
    problems = _batch_problems(_more_ops_seeds(), more_ops=True, configs=SUBSET)
    assert not problems, "\n".join(problems)


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed on this machine")
@pytest.mark.parametrize("first", range(0, NVCC_BATCH, CHUNK))
def test_fuzz_batch_nvcc(first):
    """The first graphs of the batch through the `nvcc` target: every configuration's CUDA text
    builds for sm_90 and sm_80 with no register spills."""
    problems = []
    for seed in range(first, first + CHUNK):
        rec = check_case_task({"seed": seed, "targets": ["nvcc"]})
        for v in rec["verdicts"]["nvcc"]:
            if v["status"] != "pass":
                problems.append(f"seed {seed} {v['config']}: {v['status']}: {v.get('detail', '')[:500]}")
    assert not problems, "\n".join(problems)


def _first_seed_of_each_unsupported_kind() -> dict[str, int]:
    first: dict[str, int] = {}
    for s in range(200):
        first.setdefault(graphgen.generate_unsupported(s)[1], s)
    return first


UNSUPPORTED_SEEDS = _first_seed_of_each_unsupported_kind()


def test_every_unsupported_kind_is_generated():
    assert set(UNSUPPORTED_SEEDS) == set(graphgen.UNSUPPORTED_KINDS)


@needs_opencl
@pytest.mark.parametrize("kind", graphgen.UNSUPPORTED_KINDS)
def test_unsupported_graphs_get_the_clear_error(kind):
    rec = unsupported_task({"seed": UNSUPPORTED_SEEDS[kind]})
    assert rec["unsupported_kind"] == kind and rec["status"] == "pass", rec


def test_generator_is_deterministic_and_replayable():
    a, b = graphgen.generate(7), graphgen.generate(7)
    assert a.model.SerializeToString() == b.model.SerializeToString()
    assert all(np.array_equal(a.feeds[k], b.feeds[k]) for k in a.feeds)
    c = graphgen.generate(7, replay=a.choices)  # rebuilt from its recorded choices
    assert c.model.SerializeToString() == a.model.SerializeToString() and c.choices == a.choices
    assert graphgen.generate(8).model.SerializeToString() != a.model.SerializeToString()


#: Ops dlcc lowers that the generator never writes, and why.
NOT_GENERATED = {"Upsample": "removed in opset 10; the generator writes opsets 13, 17, 18 and 20",
                 "Scatter": "removed in opset 11 (ScatterElements is generated)",
                 "CumProd": "new in opset 26; the generator writes opsets 13, 17, 18 and 20 (test_ops.py has cases)",
                 "TensorScatter": "new in opset 24; the generator writes opsets 13, 17, 18 and 20 (test_ops.py has cases)",
                 **{op: "a random draw: the oracle compares every configuration with one onnxruntime run, which "
                        "cannot hold each run's draws (test_random.py checks them through verify)"
                    for op in ("RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Multinomial")}}


def test_generated_graphs_are_valid_and_diverse():
    """600 graphs: onnx's strict checker accepts each (generate raises otherwise), onnxruntime's
    outputs are finite, the patterns the issue asks for all occur, and so does every op dlcc
    supports (NNSmith's aim: the fuzzer reaches all of the compiler's ops)."""
    from dlcc.ops.registry import supported_ops

    ops, shapes = set(), set()
    for seed in range(600):
        try:
            case = graphgen.generate(seed)
        except graphgen.InvalidCase:
            continue
        for r in case.refs.values():
            assert r.dtype.kind != "f" or np.all(np.isfinite(r))
        ops |= set(case.ops)
        for i in case.model.graph.input:
            shapes.add(tuple(d.dim_value for d in i.type.tensor_type.shape.dim))
    wanted = {"Add", "Mul", "ReduceMean", "ReduceSum", "Softmax", "LayerNormalization", "Reshape", "Transpose",
              "Slice", "Concat", "Split", "Gather", "MatMul", "Gemm", "Conv", "LSTM", "GRU", "Sqrt", "Reciprocal",
              "Where", "Expand"}
    assert wanted <= ops, wanted - ops
    assert {"Scan", "DFT"} <= ops  # (rewritten at import, so not in the op registry)
    assert set(supported_ops()) - set(NOT_GENERATED) <= ops, set(supported_ops()) - set(NOT_GENERATED) - ops
    dims = {d for s in shapes for d in s}
    assert 1 in dims and any(d > graphgen.LONG_ROW[0] for d in dims) and any(d % 2 for d in dims if d > 1)


def test_shape_check_catches_disagreements_and_skips_unknown_ranks():
    """The generator's own shapes are checked against onnx's inference. A wrong one is a
    GeneratorBug; a value whose rank onnx cannot infer (seed 106511: onnx's GatherND rule gives up on
    a rank-0 result, and the Where after it inherits that) is not compared with the rank-0 shape."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])],
                          "g", [x], [y])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    graphgen._check_shapes(model, {"r": (6,), "y": (6,)})
    with pytest.raises(graphgen.GeneratorBug, match="Relu output 'r'.*says \\[3\\], onnx infers \\[6\\]"):
        graphgen._check_shapes(model, {"r": (3,), "y": (6,)})
    case = graphgen.generate(106511)  # a rank-0 GatherND into a Where: generated, not a GeneratorBug
    assert "GatherND" in case.ops and "Where" in case.ops


def test_chooser_answers_zero_when_a_replay_runs_out():
    ch = Chooser(replay=[3, 1])
    assert [ch.below(10), ch.below(10), ch.below(10), ch.chance(0.9)] == [3, 1, 0, False]


def test_shrinker_reduces_to_the_failing_op(monkeypatch):
    """With a stand-in oracle that fails any graph holding a Softmax, the shrinker must end with a
    graph of a few nodes that still holds one, under the simplest configuration."""
    from dlcc.testing import shrink as sh
    from dlcc.testing.oracle import Verdict

    def verdict(model, feeds, refs, cfg, target):
        bad = any(n.op_type == "Softmax" for n in model.graph.node)
        return Verdict(cfg.name, "mismatch" if bad else "pass")

    monkeypatch.setattr(sh, "_verdict", verdict)
    seed = next(s for s in range(500) if "Softmax" in graphgen.generate(s).ops and len(graphgen.generate(s).ops) > 8)
    before = len(graphgen.generate(seed).model.graph.node)
    res = sh.shrink(seed, all_configs()[-1], max_tries=400)
    ops = [n.op_type for n in res.model.graph.node]
    # (a few: the first such seed's Softmax reads a MatMul of a Reshape, which 400 tries leave)
    assert "Softmax" in ops and len(ops) <= 3 < before, (before, ops)
    assert res.config.name == all_configs()[0].name  # the simplest configuration that still fails
    onnx.checker.check_model(res.model, full_check=True)


def _sleep_forever(task):
    time.sleep(3600)


def _die(task):
    os._exit(3)


def _segfault(task):
    """A crash in native code (a driver or compiler), not a Python exception."""
    import ctypes
    import faulthandler

    faulthandler.disable()
    ctypes.string_at(0)


def _echo(task):
    return {"echo": task}


def _pid(task):
    return os.getpid()


def test_pool_reports_hangs_and_dead_workers_and_goes_on():
    from dlcc.testing.pool import run_tasks

    tasks = [("a", 1), ("b", 2)]
    res = run_tasks(tasks, "test_fuzz:_echo", workers=2, timeout=60)
    assert res == {"a": {"echo": 1}, "b": {"echo": 2}}
    # workers are replaced after max_cases (PoCL never unmaps the kernels it loaded)
    res = run_tasks([(k, k) for k in range(5)], "test_fuzz:_pid", workers=1, timeout=60, max_cases=2)
    assert sorted(res) == list(range(5))
    assert res[0] == res[1] != res[2] == res[3] != res[4]
    res = run_tasks([("x", 0)], "test_fuzz:_sleep_forever", workers=1, timeout=2)
    assert "hang" in res["x"]
    res = run_tasks([("y", 0)], "test_fuzz:_die", workers=1, timeout=60)
    assert res["y"]["died"] == "the worker process died (exit code 3)"
    res = run_tasks([("z", 0)], "test_fuzz:_segfault", workers=1, timeout=60)
    assert res["z"]["died"] == "the worker process died (SIGSEGV)"


def _variance_model():
    """sqrt(E[x^2] - E[x]^2 + eps) per row: cancellation amplifies float32 rounding ~10^4x."""
    from onnx import TensorProto as T, helper as h
    nodes = [h.make_node("Mul", ["x", "x"], ["x2"]),
             h.make_node("ReduceMean", ["x2"], ["m2"], axes=[-1]),
             h.make_node("ReduceMean", ["x"], ["m"], axes=[-1]),
             h.make_node("Mul", ["m", "m"], ["mm"]),
             h.make_node("Sub", ["m2", "mm"], ["v"]),
             h.make_node("Add", ["v", "eps"], ["ve"]),
             h.make_node("Sqrt", ["ve"], ["y"])]
    g = h.make_graph(nodes, "var", [h.make_tensor_value_info("x", T.FLOAT, [16, 8])],
                     [h.make_tensor_value_info("y", T.FLOAT, [16, 1])],
                     [h.make_tensor("eps", T.FLOAT, [], [1e-6])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_float64_arbiter_tells_conditioning_from_bugs():
    """An answer computed in another float32 order is `unstable` (conditioning) even where
    onnxruntime hits the exact value at that element by luck; an answer wrong at one element by
    more than float32 rounding can explain is not."""
    from dlcc.testing.oracle import conditioning_explains, float64_reference

    m = _variance_model()
    rng = np.random.default_rng(0)
    x = (30.0 + 0.05 * rng.standard_normal((16, 8))).astype(np.float32)
    refs = graphgen.reference(m, {"x": x})
    exact = float64_reference(m, {"x": x})["y"]
    err_ort = np.abs(refs["y"].astype(np.float64) - exact)
    # another float32 order: off by onnxruntime's own worst error, at the row where onnxruntime
    # happens to be closest to the exact answer
    lucky = np.unravel_index(np.argmin(err_ort), err_ort.shape)
    other = refs["y"].copy()
    other[lucky] = np.float32(exact[lucky] + 0.9 * err_ort.max())
    assert np.abs(refs["y"] - exact).max() > 1e-4 * np.abs(exact).max()  # the graph is ill-conditioned
    assert not np.allclose(other, refs["y"], rtol=1e-3, atol=1e-4)  # verify's rule says mismatch
    assert conditioning_explains(m, {"x": x}, {"y": other}, refs)
    wrong = refs["y"].copy()
    wrong[5, 0] = exact[5, 0] * 1.5  # a bug at one row: far from the exact answer
    assert not conditioning_explains(m, {"x": x}, {"y": wrong}, refs)


def _one_element_model(op: str, n: int):
    """A one-element output: 1 / (E[x^2] - E[x]^2) ("Sub": cancellation) or 1 / E[x^2]."""
    from onnx import TensorProto as T, helper as h
    nodes = [h.make_node("Mul", ["x", "x"], ["x2"]),
             h.make_node("ReduceMean", ["x2"], ["m2"], axes=[-1]),
             h.make_node("ReduceMean", ["x"], ["m"], axes=[-1]),
             h.make_node("Mul", ["m", "m"], ["mm"]),
             h.make_node(op, ["m2", "mm"] if op == "Sub" else ["m2"], ["v"]),
             h.make_node("Reciprocal", ["v"], ["y"])]
    g = h.make_graph(nodes, "one", [h.make_tensor_value_info("x", T.FLOAT, [1, n])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 1])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _sequential_f32(op: str, x):
    """The model above computed in float32 with sequential sums: the order of a one-thread-per-row
    kernel (fuzz seed 51428's astitch[independent] plan gave exactly this answer)."""
    s2, s1 = np.float32(0), np.float32(0)
    for v in x.ravel():
        s2, s1 = np.float32(s2 + np.float32(v * v)), np.float32(s1 + v)
    m2, m = np.float32(s2 / np.float32(x.size)), np.float32(s1 / np.float32(x.size))
    v = np.float32(m2 - np.float32(m * m)) if op == "Sub" else m2
    return np.full((1, 1), np.float32(1) / v, np.float32)


def test_rounding_spread_judges_one_element_outputs():
    """Where onnxruntime lands on the exact answer by luck, its error is no floor; the Monte Carlo
    rounding spread (dlcc/testing/rounding.py) judges instead. A sequential float32 sum of a
    cancelling variance is `unstable`; a 50% error there, or a 1% error on a well-conditioned
    output, is not."""
    from dlcc.testing.oracle import conditioning_explains, float64_reference

    x = (1.2 + 0.01 * np.random.default_rng(3).standard_normal((1, 65))).astype(np.float32)
    m = _one_element_model("Sub", 65)
    refs = graphgen.reference(m, {"x": x})
    exact = float64_reference(m, {"x": x})["y"]
    seq = _sequential_f32("Sub", x)
    assert not np.allclose(seq, refs["y"], rtol=1e-3, atol=1e-4)  # verify's rule says mismatch
    assert np.abs(seq - exact).max() > 4 * np.abs(refs["y"] - exact).max()  # onnxruntime's floor is no help
    assert conditioning_explains(m, {"x": x}, {"y": seq}, refs)
    assert not conditioning_explains(m, {"x": x}, {"y": (exact * 1.5).astype(np.float32)}, refs)
    well = _one_element_model("Identity", 65)
    refs = graphgen.reference(well, {"x": x})
    assert conditioning_explains(well, {"x": x}, {"y": _sequential_f32("Identity", x)}, refs)
    assert not conditioning_explains(well, {"x": x}, {"y": refs["y"] * np.float32(1.01)}, refs)


def test_the_arbiter_widens_a_float16_model_as_verify_does():
    """The same cancelling variance as a float16 model (float16 input, output and values): the
    exact answer is the widened model's in float64, and the rounding spread perturbs its float16
    values as it does float32 ones. Before, both left float16 tensors alone: onnx.reference
    computed the "exact" answer in float16, the spread was 0, and fuzz graph 740044 (a variance
    over one element, through astitch@fp16) was called a mismatch where its float32 twin is
    `unstable`."""
    from dlcc.testing.oracle import conditioning_explains, float64_reference
    from dlcc.testing.rounding import rounding_spread

    x = (1.2 + 0.01 * np.random.default_rng(3).standard_normal((1, 65))).astype(np.float16)
    m32 = _one_element_model("Sub", 65)
    m16 = onnx.ModelProto()
    m16.CopyFrom(m32)
    for vi in list(m16.graph.input) + list(m16.graph.output):
        vi.type.tensor_type.elem_type = onnx.TensorProto.FLOAT16
    exact32 = float64_reference(m32, {"x": x.astype(np.float32)})["y"]
    np.testing.assert_array_equal(float64_reference(m16, {"x": x})["y"], exact32)
    t, spread = rounding_spread(m16, {"x": x})["y"]
    assert t.dtype == np.float64 and spread.max() > 1e-3 * np.abs(t).max()
    refs = {"y": graphgen.reference(m32, {"x": x.astype(np.float32)})["y"].astype(np.float16)}
    got = {"y": _sequential_f32("Sub", x.astype(np.float32)).astype(np.float16)}
    assert conditioning_explains(m16, {"x": x}, got, refs)
    assert not conditioning_explains(m16, {"x": x}, {"y": (exact32 * 1.5).astype(np.float16)}, refs)


def test_the_arbiter_unrolls_a_loop_to_reach_its_body():
    """rounding._flattened unrolls a Loop with dlcc's own import step, so the rounding model
    perturbs what its body computes. (When unroll_loops began to return a third value, the
    flattening failed silently into the body-blind spread; this holds it.)"""
    from onnx import TensorProto as T, helper as h

    from dlcc.testing.rounding import _flattened

    body = h.make_graph([h.make_node("Add", ["s", "x"], ["s2"])], "body",
                        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("c", T.BOOL, []),
                         h.make_tensor_value_info("s", T.FLOAT, [3])],
                        [h.make_tensor_value_info("c", T.BOOL, []), h.make_tensor_value_info("s2", T.FLOAT, [3])])
    g = h.make_graph([h.make_node("Loop", ["n", "", "x"], ["y"], body=body)], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, [3])], [h.make_tensor_value_info("y", T.FLOAT, [3])],
                     [onnx.numpy_helper.from_array(np.array(4, np.int64), "n")])
    flat = _flattened(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]))
    assert {n.op_type for n in flat.graph.node} & {"Loop", "Scan"} == set()
    assert sum(n.op_type == "Add" for n in flat.graph.node) == 4


def test_an_output_whose_shape_rounding_changes_is_explained():
    """A Compress by x > 1 of an x one bfloat16 rounding above 1: the perturbed runs keep another
    number of elements, so the output is no continuous function of the rounding and its spread is
    infinite (a decoder's end token chosen by an argmax: SLANet's table decoder at bf16, through
    --fallback onnxruntime). Where the shapes stay, the spread is finite."""
    from onnx import TensorProto as T, helper as h

    from dlcc.testing.oracle import conditioning_explains
    from dlcc.testing.rounding import rounding_spread

    nodes = [h.make_node("Mul", ["x", "one"], ["a"]), h.make_node("Greater", ["a", "one"], ["keep"]),
             h.make_node("Compress", ["x", "keep"], ["y"]), h.make_node("Mul", ["x", "two"], ["z"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [6])],
                     [h.make_tensor_value_info("y", T.FLOAT, None), h.make_tensor_value_info("z", T.FLOAT, [6])],
                     [onnx.numpy_helper.from_array(np.array(1.0, np.float32), "one"),
                      onnx.numpy_helper.from_array(np.array(2.0, np.float32), "two")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    x = np.array([1.001, 1.0005, 0.5, 2.0, 1.002, 0.999], np.float32)
    judged = rounding_spread(m, {"x": x}, precision="bf16")
    assert np.all(np.isinf(judged["y"][1])) and np.all(np.isfinite(judged["z"][1]))
    refs = graphgen.reference(m, {"x": x})
    got = {"y": refs["y"] * 1.5, "z": refs["z"]}  # (past bf16's tolerance: judged by the spread)
    assert "changes its shape" in conditioning_explains(m, {"x": x}, got, refs, "bf16")


def test_the_quantization_judge_leaves_a_missing_output_a_mismatch(tmp_path):
    """Where dlcc returns no value for an output of a quantizing graph, the oracle's quantization
    judge declines (the verdict stays `mismatch`) instead of failing on the missing name."""
    from onnx import TensorProto as T, helper as h

    from dlcc.testing.oracle import _quantization_judged

    g = h.make_graph([h.make_node("QuantizeLinear", ["x", "s"], ["q"])], "g", [h.make_tensor_value_info("x", T.FLOAT, [4])],
                     [h.make_tensor_value_info("q", T.UINT8, [4])], [onnx.numpy_helper.from_array(np.float32(0.5), "s")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    onnx.save(m, tmp_path / "q.onnx")
    x = np.arange(4, dtype=np.float32)
    assert _quantization_judged(tmp_path / "q.onnx", m, {}, {"x": x}, graphgen.reference(m, {"x": x}), None,
                                None, "opencl") == ""


def test_the_arbiter_keeps_what_an_ifs_branches_read():
    """pruned_to keeps the nodes an If's branches read from the graph around them, not only its
    condition's: without them onnx.reference could not run the pruned graph, the arbiter had no
    answer, and fuzz graph 760182 (a variance over one element inside an If's branch, at fp16)
    stayed a mismatch where it is `unstable`."""
    from onnx import TensorProto as T, helper as h

    from dlcc.testing.rounding import float64_reference, pruned_to

    def branch(name, src):
        return h.make_graph([h.make_node("Identity", [src], [name + "_o"])], name, [],
                            [h.make_tensor_value_info(name + "_o", T.FLOAT, [3])])

    nodes = [h.make_node("Neg", ["x"], ["a"]), h.make_node("Relu", ["x"], ["unused"]),
             h.make_node("Greater", ["x0", "zero"], ["c"]),
             h.make_node("If", ["c"], ["y"], then_branch=branch("t", "a"), else_branch=branch("e", "x"))]
    ins = [h.make_tensor_value_info("x", T.FLOAT, [3]), h.make_tensor_value_info("x0", T.FLOAT, [])]
    g = h.make_graph(nodes, "g", ins,
                     [h.make_tensor_value_info("y", T.FLOAT, [3]), h.make_tensor_value_info("unused", T.FLOAT, [3])],
                     [onnx.numpy_helper.from_array(np.array(0.0, np.float32), "zero")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    pruned = pruned_to(m, ["y"])
    assert [n.op_type for n in pruned.graph.node] == ["Neg", "Greater", "If"]
    x = np.array([1.0, -2.0, 3.0], np.float32)
    np.testing.assert_array_equal(float64_reference(pruned, {"x": x, "x0": np.float32(1.0)})["y"], -x)


def test_the_spread_is_of_the_value_the_model_computes():
    """An If whose branches make different shapes (silero_vad_half's state) was flattened by
    if-conversion into a select that broadcasts both, so the rounding spread came out in another
    shape than the exact answer, and the arbiter raised IndexError on the pip-shipped model. The
    spread is now taken on the model as written where the flattened form computes another shape."""
    from onnx import TensorProto as T, helper as h

    from dlcc.testing.rounding import rounding_spread

    def branch(name, node):
        return h.make_graph([node], name, [], [h.make_tensor_value_info(name + "_o", T.FLOAT, None)])

    nodes = [h.make_node("ReduceSum", ["x"], ["s"], keepdims=0), h.make_node("Greater", ["s", "zero"], ["c"]),
             h.make_node("If", ["c"], ["y"], then_branch=branch("t", h.make_node("Exp", ["x"], ["t_o"])),
                         else_branch=branch("e", h.make_node("Unsqueeze", ["x", "ax"], ["e_o"])))]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [3])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)],
                     [onnx.numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
                      onnx.numpy_helper.from_array(np.array([0], np.int64), "ax")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    x = np.array([1.0, -0.5, 2.0], np.float32)
    exact, spread = rounding_spread(m, {"x": x}, samples=2)["y"]
    np.testing.assert_allclose(exact, np.exp(x.astype(np.float64)))
    assert spread.shape == exact.shape == (3,)


def test_the_rounding_model_leaves_shape_computations_exact():
    """Values computed from shapes and constants alone are folded at compile time, not rounded as
    activations: perturbed at fp16, a Range's limit of 40 taken from a width became 40.02 and the
    Range one element longer (nudenet's YOLOv8n anchors), and onnx.reference stopped on the
    mismatched shapes. The spread is taken, and is the activations' alone."""
    from onnx import TensorProto as T, helper as h

    from dlcc.testing.rounding import rounding_spread

    nodes = [h.make_node("Shape", ["x"], ["s"]), h.make_node("Gather", ["s", "two"], ["w"], axis=0),
             h.make_node("Cast", ["w"], ["wf"], to=T.FLOAT), h.make_node("Range", ["zero", "wf", "one"], ["r"]),
             h.make_node("Add", ["x", "r"], ["y"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 40])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 4, 40])],
                     [onnx.numpy_helper.from_array(np.array(2, np.int64), "two"),
                      onnx.numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
                      onnx.numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    x = np.random.default_rng(0).standard_normal((1, 4, 40)).astype(np.float32)
    exact, spread = rounding_spread(m, {"x": x}, samples=8, precision="fp16")["y"]
    np.testing.assert_allclose(exact, x.astype(np.float64) + np.arange(40))
    assert spread.shape == (1, 4, 40) and 0 < spread.max() <= 2 ** -10 * np.abs(exact).max()


def test_an_interrupted_run_resumes_where_it_stopped(tmp_path):
    """scripts/fuzz.py --resume: a run stopped before its end (here by --minutes 0, the way an
    interrupted one is, with its report checkpointed) goes on with the same parameters, runs only
    the cases it had not, and its report counts every case once."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "fuzz.py"
    report = tmp_path / "fuzz.json"
    run = [sys.executable, str(script), "--quick-build", "-j", "1", "--targets", "opencl"]
    first = subprocess.run(run + ["--n", "3", "--seed", "7", "--unsupported", "1", "--configs", "baseline",
                                  "--nvcc-every", "0", "--minutes", "0", "--json", str(report)],
                           capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert json.loads(report.read_text())["cases"] == []  # nothing handed out: all of it is left
    second = subprocess.run(run + ["--resume", str(report), "--n", "99", "--configs", "full", "--nvcc-every", "1"],
                            capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    assert "resuming" in second.stderr and "4 to go" in second.stderr
    r = json.loads(report.read_text())
    assert sorted(c["case"] for c in r["cases"]) == ["graph-7", "graph-8", "graph-9", "unsupported-7"]
    # baseline on OpenCL only: the report's parameters, not --n 99, full or --nvcc-every 1
    assert r["summary"]["graphs"] == 3 and r["summary"]["configurations_run"] == 3
    assert len(r["meta"]["segments"]) == 2
    third = subprocess.run(run + ["--resume", str(report)], capture_output=True, text=True)
    assert third.returncode == 0 and "0 to go" in third.stderr
    assert json.loads(report.read_text())["summary"]["graphs"] == 3
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    refused = subprocess.run(run + ["--resume", str(bad)], capture_output=True, text=True)
    assert refused.returncode == 2 and "cannot resume" in refused.stderr and "Traceback" not in refused.stderr


def test_a_resumed_run_retries_what_the_harness_failed_on():
    """A generator bug or harness error never reached dlcc: resuming drops it, so the fixed
    harness runs that case again, while every case that did reach dlcc is kept as it was."""
    from dlcc.testing.campaign import Campaign

    report = {"summary": {"seconds": 5.0}, "cases": [
        {"case": "graph-1", "seed": 1, "nodes": 4, "ops": ["Add"], "verdicts": {"opencl": [
            {"config": "baseline", "status": "pass"}, {"config": "full", "status": "mismatch", "detail": "d"}]}},
        {"case": "graph-2", "seed": 2, "generator_bug": "Where output 'w': the generator says [6]"},
        {"case": "graph-3", "seed": 3, "harness_error": "boom"},
        {"case": "graph-4", "seed": 4, "invalid": "not finite"}]}
    camp = Campaign.resumed(report)
    assert camp.done() == {"graph-1", "graph-4"}
    assert camp.graphs == 1 and camp.invalid == 1 and camp.count("pass") == 1
    assert [f.config for f in camp.failures] == ["full"] and camp.failed
    assert not camp.generator_bugs and not camp.harness_errors


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed on this machine")
def test_nvcc_target_builds_the_cuda_text_and_reports_spills(monkeypatch):
    """The `nvcc` target (a machine without a GPU): every configuration's CUDA plan through nvcc for
    sm_90 and sm_80. A graph builds with no spills; a kernel that spilled is a `spill` failure."""
    from dlcc.backends import nvcc
    from dlcc.testing.oracle import check_model, config_named

    case = graphgen.generate_valid(3)
    configs = [config_named("baseline"), config_named("full")]
    assert [v.status for v in check_model(case.model, case.feeds, case.refs, configs, "nvcc")] == ["pass", "pass"]

    real = nvcc.build_cubin

    def spilling(source, arch="sm_80", **kw):
        usage, cubin, log = real(source, arch, **kw)
        first = next(iter(usage.values()))
        first.spill_stores = 8
        return usage, cubin, log

    monkeypatch.setattr(nvcc, "build_cubin", spilling)
    v = check_model(case.model, case.feeds, case.refs, configs[:1], "nvcc")[0]
    assert v.status == "spill" and "sm_90" in v.detail, v
    assert "spill" in FAILURES



def test_tf32_configurations_are_judged_at_tf32():
    """"NAME@tf32" configurations: judged at verify's tf32 tolerance, and the arbiter's rounding
    spread adds the TF32 rounding of every GEMM operand. Two MatMuls with nearly equal weights,
    subtracted, cancel: a tensor-core answer (operands rounded to TF32, as the hardware does)
    is far from the exact one, explained at tf32 but not at fp32; an answer further off than
    TF32 rounding can move it is not explained."""
    from onnx import TensorProto, helper, numpy_helper

    from dlcc.testing.oracle import compare_outputs, conditioning_explains, config_named
    from dlcc.testing.rounding import tf32_round

    cfg = config_named("full@tf32")
    assert cfg.precision == "tf32" and cfg.spec().precision == "tf32" and config_named("full").precision == "fp32"
    with pytest.raises(KeyError, match="unknown precision"):
        config_named("full@fp8")
    rng = np.random.default_rng(5)
    w = rng.standard_normal((64, 8)).astype(np.float32)
    w2 = (w * (1 + 1e-3 * rng.standard_normal(w.shape))).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("MatMul", ["x", "w2"], ["b"]),
                           helper.make_node("Sub", ["a", "b"], ["y"])], "cancel",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(w2, "w2")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = (100 * rng.standard_normal((4, 64))).astype(np.float32)  # a, b ~ 800, y ~ 1: cancellation
    refs = graphgen.reference(m, {"x": x})

    def tf32(a):
        return tf32_round(a).astype(np.float64)

    tc = (tf32(x) @ tf32(w) - tf32(x) @ tf32(w2)).astype(np.float32)
    assert not compare_outputs(m, {"y": tc}, refs, "tf32")[0]  # beyond even the tf32 tolerance
    assert conditioning_explains(m, {"x": x}, {"y": tc}, refs, "tf32")
    assert not conditioning_explains(m, {"x": x}, {"y": tc}, refs, "fp32")
    # here TF32 rounding alone moves y by about 1 (y itself is about 1): a bug lands further
    assert not conditioning_explains(m, {"x": x}, {"y": (refs["y"] + 20).astype(np.float32)}, refs, "tf32")


def test_the_arbiter_judges_only_what_failed():
    """Graph 108185: a cancelling variance (dlcc's answer 5% off, rounding-explained) beside a node
    onnx.reference cannot run (there a grouped ConvTranspose; here an op of an unknown domain).
    The arbiter runs only the part the failing output depends on (rounding.pruned_to), so the
    verdict is still `unstable`, not a mismatch for want of an answer."""
    from onnx import TensorProto as T, helper as h

    from dlcc.testing.oracle import conditioning_explains
    from dlcc.testing.rounding import pruned_to

    m = _one_element_model("Sub", 65)
    m.graph.node.append(h.make_node("Nothing", ["x"], ["z"], domain="test.unrunnable"))
    m.graph.output.append(h.make_tensor_value_info("z", T.FLOAT, [1, 65]))
    m.opset_import.append(h.make_opsetid("test.unrunnable", 1))
    x = (1.2 + 0.01 * np.random.default_rng(3).standard_normal((1, 65))).astype(np.float32)
    p = pruned_to(m, ["y"])
    assert [o.name for o in p.graph.output] == ["y"] and all(n.op_type != "Nothing" for n in p.graph.node)
    refs = {"y": graphgen.reference(_one_element_model("Sub", 65), {"x": x})["y"], "z": x.copy()}
    got = {"y": _sequential_f32("Sub", x), "z": x.copy()}
    assert conditioning_explains(m, {"x": x}, got, refs)
    assert not conditioning_explains(m, {"x": x}, {"y": refs["y"] * np.float32(1.5), "z": x.copy()}, refs)
