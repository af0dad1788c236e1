"""int16, uint16, uint32 and uint64 tensors: held in their own C types, computed as C computes them.

Each case is one small model, compiled for OpenCL (PoCL) through baseline and astitch, and compared
exactly with onnxruntime where onnxruntime has the kernel, or else with numpy's answer written out
from the ONNX spec (onnxruntime has no uint16 TopK, no ReduceSum over uint32, no signed BitShift).
The values are chosen at the edges: wrapping sums and products, divisors that are the type's
largest value (in C, `b == -1` is true of an unsigned b there), shifts by the width and past it.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

import dlcc
from dlcc.backends.nvcc import compile_cubin, find_nvcc
from dlcc.backends.source import render
from dlcc.verify import run_onnxruntime

from conftest import opencl_device_available

pytestmark = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")

TYPES = [np.int16, np.uint16, np.uint32, np.uint64]
rng = np.random.default_rng(16)


def _edges(t, shape=(3, 8)) -> np.ndarray:
    """Values of type `t` with its extremes, 0, 1 and random ones, shaped `shape`."""
    info = np.iinfo(t)
    v = [info.min, info.max, 0, 1, 2, info.max - 1, info.min + 1 if info.min else 7, 3]
    n = int(np.prod(shape))
    r = rng.integers(info.min, info.max, n - len(v), dtype=t, endpoint=True)
    return np.concatenate([np.array(v, t), r]).reshape(shape)


def _divisors(t, shape=(3, 8)) -> np.ndarray:
    """Non-zero divisors: the type's largest value, 1, 2, 3 and (signed) -1 and the smallest."""
    info = np.iinfo(t)
    v = [info.max, 1, 2, 3, info.max - 1] + ([-1, info.min, -3] if info.min else [info.max // 2, 5, 7])
    d = np.resize(np.array(v, t), int(np.prod(shape))).reshape(shape)
    return np.where(d == 0, t(1), d)


def _model(path, nodes, feeds, outputs, inits=None, opset=18):
    ins = [h.make_tensor_value_info(n, h.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds.items()]
    g = h.make_graph(nodes, "ints", ins, [h.make_empty_tensor_value_info(o) for o in outputs],
                     initializer=[nh.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    ops = [h.make_opsetid("", opset)]
    m = h.make_model(g, opset_imports=ops, ir_version=max(9, h.find_min_ir_version_for(ops)))
    onnx.save(onnx.shape_inference.infer_shapes(m, strict_mode=True), str(path))
    return str(path)


#: Set by test_every_kernel_compiles_for_cuda: _check then collects the kernels' source instead.
_SOURCES: dict | None = None


def _check(path, feeds, want: dict | None = None):
    """dlcc's outputs through baseline and astitch equal `want` (default: onnxruntime's), in value
    and dtype."""
    if _SOURCES is not None:
        for pipeline in ("baseline", "astitch"):
            m = dlcc.compile(path, target="opencl", pipeline=pipeline)
            _SOURCES.update(zip([k["name"] for k in m.plan["kernels"]], m.kernel_codes))
        return
    if want is None:
        want = dict(zip([o.name for o in onnx.load(path).graph.output], run_onnxruntime(path, feeds)))
    for pipeline in ("baseline", "astitch"):
        got = dlcc.compile(path, target="opencl", pipeline=pipeline)(feeds)
        for name, ref in want.items():
            ref = np.asarray(ref)
            assert got[name].dtype == ref.dtype, (pipeline, name, got[name].dtype, ref.dtype)
            bad = np.flatnonzero(got[name].ravel() != ref.ravel())
            assert bad.size == 0, (f"{pipeline}: {name} differs at {bad[:5]}: dlcc {got[name].ravel()[bad[:5]]}, "
                                   f"expected {ref.ravel()[bad[:5]]}")


@pytest.mark.parametrize("t", TYPES, ids=lambda t: np.dtype(t).name)
def test_arithmetic_comparisons_and_casts_match_onnxruntime(tmp_path, t):
    """Wrapping +, -, *; truncating / and % by the type's largest value and (signed) -1; ==, <;
    Abs and Sign; Clip; Casts to and from float and int64; all stitched together by astitch."""
    a, b, d = _edges(t), _edges(t)[::-1].copy(), _divisors(t)
    lo, hi = t(2), t(np.iinfo(t).max // 3)
    nodes = [h.make_node("Add", ["a", "b"], ["add"]), h.make_node("Sub", ["a", "b"], ["sub"]),
             h.make_node("Mul", ["add", "b"], ["mul"]), h.make_node("Div", ["a", "d"], ["div"]),
             h.make_node("Mod", ["a", "d"], ["mod"]), h.make_node("Mod", ["a", "d"], ["fmod"], fmod=1),
             h.make_node("Equal", ["a", "b"], ["eq"]), h.make_node("Less", ["a", "b"], ["lt"]),
             h.make_node("Abs", ["sub"], ["abs"]), h.make_node("Sign", ["sub"], ["sign"]),
             h.make_node("Clip", ["mul", "lo", "hi"], ["clip"]),
             h.make_node("Cast", ["a"], ["f"], to=TP.FLOAT), h.make_node("Cast", ["a"], ["i64"], to=TP.INT64),
             h.make_node("Cast", ["f"], ["back"], to=h.np_dtype_to_tensor_dtype(np.dtype(t)))]
    outs = ["add", "sub", "mul", "div", "mod", "fmod", "eq", "lt", "abs", "sign", "clip", "f", "i64"]
    if np.dtype(t).itemsize == 2:  # onnxruntime has no 16-bit Clip with bounds: numpy's test below has it
        outs.remove("clip")
        nodes = [n for n in nodes if n.op_type != "Clip"]
    path = _model(tmp_path / "arith.onnx", nodes, {"a": a, "b": b, "d": d}, outs, {"lo": lo, "hi": hi})
    _check(path, {"a": a, "b": b, "d": d})
    # float -> t of values t holds exactly (C's conversion of an out-of-range float is undefined)
    small = (np.arange(24) * 3).astype(np.float32).reshape(3, 8)
    path = _model(tmp_path / "cast.onnx", nodes[-1:], {"f": small}, ["back"])
    _check(path, {"f": small})


@pytest.mark.parametrize("t", TYPES, ids=lambda t: np.dtype(t).name)
def test_layout_ops_move_the_values_unchanged(tmp_path, t):
    """Transpose, Concat, Gather, Slice, Expand and Tile of t tensors, against onnxruntime."""
    a = _edges(t)
    nodes = [h.make_node("Transpose", ["a"], ["tr"]), h.make_node("Concat", ["a", "a"], ["cat"], axis=1),
             h.make_node("Gather", ["a", "idx"], ["ga"], axis=1), h.make_node("Slice", ["a", "s", "e"], ["sl"]),
             h.make_node("Expand", ["row", "shape"], ["ex"]), h.make_node("Tile", ["a", "reps"], ["ti"])]
    inits = {"idx": np.array([7, 0, 3, 3], np.int64), "s": np.array([1], np.int64), "e": np.array([3], np.int64),
             "shape": np.array([4, 8], np.int64), "reps": np.array([2, 1], np.int64)}
    feeds = {"a": a, "row": a[:1]}
    _check(_model(tmp_path / "layout.onnx", nodes, feeds, ["tr", "cat", "ga", "sl", "ex", "ti"], inits), feeds)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: np.dtype(t).name)
def test_bitwise_ops_match_onnxruntime(tmp_path, t):
    a, b = _edges(t), _edges(t)[:, ::-1].copy()
    nodes = [h.make_node(op, ["a", "b"], [op]) for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor")]
    nodes.append(h.make_node("BitwiseNot", ["a"], ["BitwiseNot"]))
    _check(_model(tmp_path / "bits.onnx", nodes, {"a": a, "b": b}, [n.output[0] for n in nodes]), {"a": a, "b": b})


@pytest.mark.parametrize("t", [np.uint16, np.uint32, np.uint64], ids=lambda t: np.dtype(t).name)
def test_unsigned_shifts_by_up_to_past_the_width_match_onnxruntime(tmp_path, t):
    """Opset 11's BitShift: shifts of 0 to the width + 2, where a C shift past the width is undefined."""
    bits = 8 * np.dtype(t).itemsize
    amounts = np.arange(bits + 3, dtype=t)
    a = np.resize(_edges(t).ravel(), amounts.size).astype(t)
    nodes = [h.make_node("BitShift", ["a", "n"], [d], direction=d) for d in ("LEFT", "RIGHT")]
    _check(_model(tmp_path / "shift.onnx", nodes, {"a": a, "n": amounts}, ["LEFT", "RIGHT"], opset=11),
           {"a": a, "n": amounts})


@pytest.mark.parametrize("t", [np.int8, np.int16, np.int32, np.int64], ids=lambda t: np.dtype(t).name)
def test_signed_shifts_of_opset_28_follow_the_spec(tmp_path, t):
    """Opset 28's BitShift on signed types (onnxruntime has no kernel for it), against the spec
    written out on Python ints: an arithmetic right shift, a left shift that drops the bits past
    the width, and a negative shift or one by the width or more giving the sign bits alone."""
    bits = 8 * np.dtype(t).itemsize
    amounts = np.arange(-2, bits + 2).astype(t)
    a = np.resize(_edges(t).ravel(), amounts.size).astype(t)
    a[:6] = np.array([-1, -5, 5, np.iinfo(t).min, np.iinfo(t).max, -128], t)

    def wrap(v):
        v &= (1 << bits) - 1
        return v - (1 << bits) if v >= 1 << (bits - 1) else v

    def spec(x, n, left):
        if n < 0 or n >= bits:
            return -1 if (x < 0 and not left) else 0
        return wrap(x << n) if left else x >> n

    want = {d: np.array([spec(int(x), int(n), d == "LEFT") for x, n in zip(a, amounts)], t) for d in ("LEFT", "RIGHT")}
    nodes = [h.make_node("BitShift", ["a", "n"], [d], direction=d) for d in ("LEFT", "RIGHT")]
    _check(_model(tmp_path / "shift28.onnx", nodes, {"a": a, "n": amounts}, ["LEFT", "RIGHT"], opset=28),
           {"a": a, "n": amounts}, want)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: np.dtype(t).name)
def test_reductions_top_k_cum_sum_and_where_match_numpy(tmp_path, t):
    """What onnxruntime has no kernel for on these types, against numpy: TopK (ties broken by the
    lower index), Where, Clip, ArgMax and ArgMin (first and last index of ties) on all four; wrapping ReduceSum and ReduceProd, ReduceMax/Min and
    CumSum on the 32- and 64-bit ones (ONNX types them for those only)."""
    a = _edges(t, (4, 6))
    c = rng.random((4, 6)) < 0.5
    b = a[::-1].copy()
    a[2, 3:] = a[2, 1]  # ties, for ArgMax's first and last index
    nodes = [h.make_node("TopK", ["a", "k"], ["vals", "idx"]), h.make_node("Where", ["c", "a", "b"], ["where"]),
             h.make_node("Clip", ["a", "lo", "hi"], ["clip"]), h.make_node("ArgMax", ["a"], ["argmax"], axis=1),
             h.make_node("ArgMin", ["a"], ["argmin_last"], axis=1, select_last_index=1)]
    order = np.argsort(-a.astype(np.float64) if np.dtype(t).kind == "i" else ~a, axis=1, kind="stable")
    lo, hi = t(3), t(np.iinfo(t).max // 2)
    want = {"vals": np.take_along_axis(a, order[:, :3], 1), "idx": order[:, :3].astype(np.int64), "where": np.where(c, a, b),
            "clip": np.clip(a, lo, hi), "argmax": a.argmax(axis=1, keepdims=True),
            "argmin_last": a.shape[1] - 1 - a[:, ::-1].argmin(axis=1, keepdims=True)}
    if np.dtype(t).itemsize >= 4:
        nodes += [h.make_node(op, ["a", "ax"], [op], keepdims=0) for op in ("ReduceSum", "ReduceProd", "ReduceMax", "ReduceMin")]
        nodes.append(h.make_node("CumSum", ["a", "cax"], ["cum"]))
        with np.errstate(over="ignore"):
            want.update({"ReduceSum": a.sum(axis=1, dtype=t), "ReduceProd": a.prod(axis=1, dtype=t),
                         "ReduceMax": a.max(axis=1), "ReduceMin": a.min(axis=1), "cum": a.cumsum(axis=0, dtype=t)})
    inits = {"ax": np.array([1], np.int64), "k": np.array([3], np.int64), "cax": np.array(0, np.int64), "lo": lo, "hi": hi}
    feeds = {"a": a, "c": c, "b": b}
    _check(_model(tmp_path / "red.onnx", nodes, feeds, list(want), inits), feeds, want)


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed")
def test_every_kernel_compiles_for_cuda(tmp_path, monkeypatch):
    """The kernels of every case above, in one translation unit, through nvcc sm_80 and sm_90,
    without spills: CUDA's typedefs of the 16-bit and unsigned types are the ones OpenCL's mean."""
    sources: dict = {}
    monkeypatch.setitem(globals(), "_SOURCES", sources)

    def run(test, t):
        (tmp_path / f"{test.__name__}-{np.dtype(t).name}").mkdir()
        test(tmp_path / f"{test.__name__}-{np.dtype(t).name}", t)

    for t in TYPES:
        for test in (test_arithmetic_comparisons_and_casts_match_onnxruntime, test_layout_ops_move_the_values_unchanged,
                     test_bitwise_ops_match_onnxruntime, test_reductions_top_k_cum_sum_and_where_match_numpy):
            run(test, t)
        if t is not np.int16:
            run(test_unsigned_shifts_by_up_to_past_the_width_match_onnxruntime, t)
    for t in (np.int8, np.int16, np.int32, np.int64):
        run(test_signed_shifts_of_opset_28_follow_the_spec, t)
    for t in (np.int32, np.int64):
        run(test_an_integer_base_to_a_computed_float_power_is_onnxruntimes, t)
    for t in (np.int32, np.uint64):
        run(test_col2im_sums_integers_exactly, t)
        run(test_integer_matmul_is_exact_and_wraps, t)
    source = render(list(sources.values()), "cuda")
    for arch in ("sm_80", "sm_90"):
        usage = compile_cubin(source, arch)
        assert set(sources) <= set(usage)
        assert not {k: u for k, u in usage.items() if u.spills}


def test_an_integer_power_past_2_to_the_53_is_exact(tmp_path):
    """onnxruntime casts std::pow's double, which rounds a power past 2^53: (-7)^21 comes out
    -558545864083284032. dlcc multiplies in the integer type, as numpy does, and gives the power."""
    a, n = np.array([-7, 3, 13], np.int64), np.array([21, 39, 17], np.int64)
    path = _model(tmp_path / "pow.onnx", [h.make_node("Pow", ["a", "n"], ["y"])], {"a": a, "n": n}, ["y"])
    _check(path, {"a": a, "n": n}, {"y": a ** n})
    assert int((a ** n)[0]) == (-7) ** 21


@pytest.mark.parametrize("t", [np.int32, np.int64], ids=lambda t: np.dtype(t).name)
def test_an_integer_base_to_a_computed_float_power_is_onnxruntimes(tmp_path, t):
    """std::pow of both as doubles, truncated toward zero (roots, negative and fractional powers,
    a negative base to a fractional power: NaN); where the double has no value in the type (NaN,
    or past its range), the type's lowest value, as onnxruntime's conversion gives on x86."""
    a = np.array([0, 1, 2, 3, -2, -3, 7, 10, 100, 5, -7, 4, -8], t)
    e = np.array([0.25, 0.5, 0.75, 1.2, 1.5, -0.5, 3, 4.5, 10, -1, 10.5, 20, 1 / 3], np.float32)
    path = _model(tmp_path / "pow.onnx", [h.make_node("Mul", ["e", "two"], ["e2"]), h.make_node("Pow", ["a", "e2"], ["y"]),
                                          h.make_node("Pow", ["a", "half"], ["z"])],
                  {"a": a, "e": e}, ["y", "z"], inits={"two": np.float32(2.0), "half": np.float32(0.5)}, opset=15)
    _check(path, {"a": a, "e": e})


@pytest.mark.parametrize("t", [np.int32, np.uint32, np.int64, np.uint64, np.int16], ids=lambda t: np.dtype(t).name)
def test_col2im_sums_integers_exactly(tmp_path, t):
    """Col2Im's overlapping blocks summed in the integer type, wrapping as numpy does (once summed
    through a float: 2^24 + 1 rounded, and an overflow saturated), against numpy's np.add.at."""
    bh, bw, H, W = 2, 2, 3, 4
    gh, gw = H - bh + 1, W - bw + 1
    x = _edges(t, (1, bh * bw, gh * gw))
    x[0, 0, 1] = t(2 ** 24 + 1) if np.iinfo(t).max > 2 ** 24 else x[0, 0, 1]
    want = np.zeros((1, 1, H, W), t)
    with np.errstate(over="ignore"):
        for k in range(bh * bw):
            for li in range(gh * gw):
                np.add.at(want, (0, 0, li // gw + k // bw, li % gw + k % bw), x[0, k, li])
    inits = {"img": np.array([H, W], np.int64), "blk": np.array([bh, bw], np.int64)}
    path = _model(tmp_path / "col2im.onnx", [h.make_node("Col2Im", ["x", "img", "blk"], ["y"])], {"x": x}, ["y"], inits)
    _check(path, {"x": x}, {"y": want})


@pytest.mark.parametrize("t", [np.int32, np.int64, np.uint32, np.uint64], ids=lambda t: np.dtype(t).name)
def test_integer_matmul_is_exact_and_wraps(tmp_path, t):
    """Integer MatMul, batched with broadcasting and with 1-D operands, against numpy's integer
    products (wrapping past the type: onnxruntime saturates or rounds there instead)."""
    info = np.iinfo(t)
    a = rng.integers(max(info.min, -2 ** 20), 2 ** 20, (2, 1, 3, 5), dtype=t)
    b = rng.integers(max(info.min, -2 ** 20), 2 ** 20, (4, 5, 6), dtype=t)
    v = rng.integers(0, 9, (5,), dtype=t)
    nodes = [h.make_node("MatMul", ["a", "b"], ["ab"]), h.make_node("MatMul", ["a", "v"], ["av"]),
             h.make_node("MatMul", ["v", "b"], ["vb"])]
    with np.errstate(over="ignore"):
        want = {"ab": np.matmul(a, b), "av": np.matmul(a, v), "vb": np.matmul(v, b)}
    assert want["ab"].shape == (2, 4, 3, 6)
    feeds = {"a": a, "b": b, "v": v}
    _check(_model(tmp_path / "mm.onnx", nodes, feeds, list(want)), feeds, want)
