"""The fp16/bf16 cp.async + ldmatrix GEMM template (dlcc/kernels/gemm_mma_async.py) without a GPU.

On PoCL, a cp.async lands only at the wait that covers its group (a misaligned chunk as NaN),
and ldmatrix and the mma exchange lanes through local memory (backends/prelude_opencl.h), so the
template's swizzled addresses, group accounting, lanes' row addresses and packed fragments run
as they would on a GPU: every
tiling is checked against numpy with operands copied raw (cp.async) and through the element
loads, in both layouts of each operand, on shapes with partial tiles. The swizzle's bank pattern
is checked by evaluating the template's own address expressions, and nvcc builds the text for
sm_80 and sm_90 with ptxas's spill report read."""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from conftest import gemm_plan, nvcc_ptx_and_ptxas, opencl_device_available
from dlcc.backends.nvcc import find_nvcc
from dlcc.backends.source import render
from dlcc.kernels.gemm import gemm_source, plain_spec
from dlcc.kernels.gemm_mma import ASYNC_TILINGS, DEEP_TILINGS, mma_tilings
from dlcc.kernels.gemm_mma_async import (CHUNK, THREADS, OperandTile, a_lane_address, async_ok, b_lane_address, swizzle,
                                         swizzle_expr)
from dlcc.testing.rounding import operand_round

needs_opencl = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")
HALF = {"fp16": "float16", "bf16": "bfloat16"}


def _np_dtype(name):
    import ml_dtypes

    return {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}[name]


@pytest.fixture(scope="module")
def rt():
    from dlcc.executor import make_runtime

    return make_runtime("opencl")


def _operands(M, N, K, trans_a, trans_b, seed=2):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((K, M) if trans_a else (M, K), dtype=np.float32)
    B = rng.standard_normal((N, K) if trans_b else (K, N), dtype=np.float32)
    return A, B


def _reference(A, B, precision, trans_a, trans_b):
    rA, rB = (operand_round(x, precision).astype(np.float64) for x in (A, B))
    return (rA.T if trans_a else rA) @ (rB.T if trans_b else rB)


def _run(rt, kname, t, spec, A, B, a_dtype, b_dtype):
    M, N = spec.M, spec.N
    As = A.astype(_np_dtype(a_dtype)).view(np.uint8)
    Bs = B.astype(_np_dtype(b_dtype)).view(np.uint8)
    sizes = [As.nbytes, Bs.nbytes, M * N * 4]
    bufs = [rt.alloc(n) for n in sizes]
    rt.write(bufs[0], 0, As)
    rt.write(bufs[1], 0, Bs)
    rt.write(bufs[2], 0, np.full(M * N, np.nan, np.float32))  # every element must be written
    rt.launch(rt.kernel(kname), -(-M // t.bm) * -(-N // t.bn), t.threads, [rt.view(b, 0, n) for b, n in zip(bufs, sizes)])
    out = np.empty((M, N), np.float32)
    rt.read(bufs[2], 0, out)
    rt.finish()
    return out


#: (precision, M, N, K, trans_a, trans_b, A stored in the half type, copies expected per fill)
CASES = [  # K spans more k blocks than stages, so every buffer is refilled inside the loop
    ("fp16", 37, 70, 200, False, True, True, 2),    # A and B k-contiguous, both by cp.async
    ("bf16", 37, 72, 136, False, False, True, 2),   # B [K, N]: ldmatrix.trans
    ("bf16", 40, 72, 48, True, False, True, 2),     # A [K, M] too: both .trans
    ("fp16", 37, 70, 200, False, False, True, 1),   # N = 70: B's rows are not 16-byte chunks, loaded per element
    ("bf16", 37, 70, 260, False, True, False, 0),   # float32 A (a graph input), K = 260: everything per element
]


@needs_opencl
@pytest.mark.parametrize("precision,M,N,K,trans_a,trans_b,a_half,raw", CASES,
                         ids=[f"{c[0]}-{c[1]}x{c[2]}x{c[3]}-{'At' if c[4] else 'A'}{'Bt' if c[5] else 'B'}-{c[7]}raw"
                              for c in CASES])
def test_every_async_tiling_matches_numpy(rt, precision, M, N, K, trans_a, trans_b, a_half, raw):
    _check_tilings(rt, mma_tilings(precision), precision, M, N, K, trans_a, trans_b, a_half, raw)


#: The DEEP tilings (4-8 stages, 64-wide k blocks; dynamic shared memory on CUDA): K of 10 k
#: blocks, more than any tiling's stages, and K of one k block (fewer than the stages: the first
#: fills are partly empty) with both operands transposed. An operand loaded per element through
#: the deep stages: test_every_deep_float_tiling_matches_numpy (the same landing code).
DEEP_CASES = [("fp16", 37, 70, 600, False, True, True, 2), ("bf16", 40, 72, 48, True, False, True, 2)]


@needs_opencl
@pytest.mark.parametrize("precision,M,N,K,trans_a,trans_b,a_half,raw", DEEP_CASES,
                         ids=[f"{c[0]}-{c[1]}x{c[2]}x{c[3]}-{c[7]}raw" for c in DEEP_CASES])
def test_every_deep_tiling_matches_numpy(rt, precision, M, N, K, trans_a, trans_b, a_half, raw):
    deep = [t for t in mma_tilings(precision, deep=True) if t.dynamic]
    assert len(deep) == len(DEEP_TILINGS)
    _check_tilings(rt, deep, precision, M, N, K, trans_a, trans_b, a_half, raw)


def _check_tilings(rt, tilings, precision, M, N, K, trans_a, trans_b, a_half, raw):
    a_dtype, b_dtype = (HALF[precision] if a_half else "float32"), HALF[precision]
    spec = plain_spec(M, N, K, trans_b, b_dtype=b_dtype, a_dtype=a_dtype, trans_a=trans_a)
    assert all(t.stages > 1 for t in tilings)
    sources = [gemm_source(f"g_{t.name}", spec, t) for t in tilings]
    for src in sources:  # the operands that can go by cp.async do, and only those
        copies = src.count("CP_ASYNC16(")
        assert copies == 2 * raw, (copies, raw)  # each fill is written twice: the first stages, the loop
        assert "LDSM_X4" in src
    rt.compile(render(sources, rt.dialect), gemm_plan((f"g_{t.name}", t) for t in tilings))
    A, B = _operands(M, N, K, trans_a, trans_b)
    ref = _reference(A, B, precision, trans_a, trans_b)
    for t in tilings:
        out = _run(rt, f"g_{t.name}", t, spec, A, B, a_dtype, b_dtype)
        np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5, err_msg=t.name)


@needs_opencl
def test_waiting_for_too_few_copies_is_caught(rt):
    """The emulated copies land at the latest wait the PTX ISA allows, so a pipeline that waits
    for one group too few (it reads block kb while its copies may still be in flight) reads a
    stale buffer on PoCL, as it might on a GPU."""
    t = mma_tilings("bf16")[4]
    spec = plain_spec(32, 64, 256, True, b_dtype="bfloat16", a_dtype="bfloat16")
    good = gemm_source("g_wait", spec, t)
    bad = good.replace(f"CP_ASYNC_WAIT({t.stages - 2});", f"CP_ASYNC_WAIT({t.stages - 1});")
    assert bad != good
    rt.compile(render([bad], rt.dialect), gemm_plan([("g_wait", t)]))
    A, B = _operands(32, 64, 256, False, True, seed=4)
    out = _run(rt, "g_wait", t, spec, A, B, "bfloat16", "bfloat16")
    assert not np.allclose(out, _reference(A, B, "bf16", False, True), rtol=1e-2, atol=1e-2)


@needs_opencl
def test_a_misaligned_copy_is_poisoned(rt):
    """The emulated cp.async fills a chunk whose address is not 16-byte aligned with NaN, so the
    passing tests above also prove every copy they made was aligned, as the hardware requires."""
    t = mma_tilings("fp16")[3]
    spec = plain_spec(64, 64, 64, True, b_dtype="float16", a_dtype="float16")
    bad = dataclasses.replace(spec, raw_a=dataclasses.replace(spec.raw_a, base="1"))  # one element off
    rt.compile(render([gemm_source("g_mis", bad, t), gemm_source("g_ok", spec, t)], rt.dialect),
               gemm_plan([("g_mis", t), ("g_ok", t)]))
    A, B = _operands(64, 64, 64, False, True)
    assert np.isnan(_run(rt, "g_mis", t, bad, A, B, "float16", "float16")).any()
    assert not np.isnan(_run(rt, "g_ok", t, spec, A, B, "float16", "float16")).any()


@needs_opencl
@pytest.mark.parametrize("slip", ["chunk", "trans"])
def test_a_wrong_ldmatrix_is_caught(rt, slip):
    """Plausible slips in the ldmatrix addressing give wrong numbers on PoCL, as on a GPU: A's
    lanes 16-31 addressing the first k half instead of the second, or B [K, N] read without
    .trans."""
    t = mma_tilings("bf16")[4]
    spec = plain_spec(32, 64, 64, False, b_dtype="bfloat16", a_dtype="bfloat16")
    good = gemm_source("g_slip", spec, t)
    bad = (good.replace(f"kk / {CHUNK} + mma_lane / 16", f"kk / {CHUNK} + 0") if slip == "chunk"
           else good.replace("LDSM_X4_T(", "LDSM_X4("))
    assert bad != good
    rt.compile(render([bad], rt.dialect), gemm_plan([("g_slip", t)]))
    A, B = _operands(32, 64, 64, False, False, seed=3)
    out = _run(rt, "g_slip", t, spec, A, B, "bfloat16", "bfloat16")
    assert not np.allclose(out, _reference(A, B, "bf16", False, False), rtol=1e-2, atol=1e-2)


def _ceval(expr: str, **env) -> int:
    """A template index expression (ints, + - * / % ^ &, all non-negative) evaluated as C does."""
    return eval(expr.replace("/", "//"), {}, env)  # noqa: S307 (our own generated text)


def _banks(elem_offsets) -> list[int]:
    """The 32-bit banks that 16-byte reads or writes at these 16-bit element offsets touch."""
    return [(o * 2 // 4 + w) % 32 for o in elem_offsets for w in range(4)]


def test_swizzle_expression_is_the_function():
    for per_row in (2, 4, 8, 16):
        for chunk in range(512):
            assert _ceval(swizzle_expr("c", per_row), c=chunk) == swizzle(chunk, per_row)


@pytest.mark.parametrize("t", ASYNC_TILINGS + DEEP_TILINGS, ids=lambda t: t.name)
def test_the_swizzle_has_no_bank_conflicts(t):
    """For every tiling and both layouts of each operand: each buffer's chunks map one to one,
    the eight chunks one cp.async phase (8 consecutive threads) writes cover the 32 banks, and
    so do the eight rows each ldmatrix matrix reads, for every warp, mma tile and k offset."""
    for which in ("a", "b"):
        for kc in (True, False):
            op = OperandTile(which, t, kc)
            phys = [swizzle(c, op.per_row) for c in range(op.chunks)]
            assert sorted(phys) == list(range(op.chunks)), (which, kc)
            for base in range(0, op.chunks, 8):  # cp.async: thread l copies chunk l
                assert len(set(_banks([p * CHUNK for p in phys[base:base + 8]]))) == 32, (which, kc, base)
            for warp in range(8):
                wm0 = (warp // t.warps_n) * (t.bm // t.warps_m)
                wn0 = (warp % t.warps_n) * (t.bn // t.warps_n)
                for kk in range(0, t.bk, 16):
                    if which == "a":
                        reads = [{L: _ceval(a_lane_address(op), mma_lane=L, mma_wm0=wm0, mi=mi, kk=kk) for L in range(32)}
                                 for mi in range(t.mi)]
                        mats = 4
                    else:
                        pair = t.ni > 1
                        reads = [{L: _ceval(b_lane_address(op, pair), mma_lane=L, mma_wn0=wn0, ni=ni, kk=kk)
                                  for L in range(32)} for ni in range(0, t.ni, 2 if pair else 1)]
                        mats = 4 if pair else 2
                    for addr in reads:
                        for m in range(mats):
                            rows = [addr[L] for L in range(8 * m, 8 * m + 8)]
                            assert len(set(_banks(rows))) == 32, (which, kc, warp, kk, m)


def test_raw_operands_need_the_half_type_and_whole_chunks():
    spec = plain_spec(64, 72, 48, False, b_dtype="bfloat16", a_dtype="bfloat16")
    assert async_ok(spec.raw_a, "bf16", 64, 48) and async_ok(spec.raw_b, "bf16", 72, 48)
    assert not async_ok(spec.raw_a, "fp16", 64, 48)  # a bf16 tensor is not copied into an fp16 tile
    assert not async_ok(plain_spec(64, 70, 48, False, b_dtype="bfloat16").raw_b, "bf16", 70, 48)  # rows of 70
    assert not async_ok(plain_spec(64, 72, 44, True, b_dtype="bfloat16").raw_b, "bf16", 72, 44)  # k rows of 44
    assert not async_ok(None, "bf16", 64, 48)


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed on this machine")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvcc_builds_the_async_pipeline_without_spills(tmp_path, arch):
    """Every tiling at both precisions, the DEEP ones included, with operands copied raw in both
    layouts, builds; the PTX holds the cp.async, ldmatrix (plain and .trans) and mma instructions;
    nothing spills; and the DEEP ones hold no static shared memory (theirs is dynamic: a static
    array over 48 KiB is a ptxas error)."""
    sources = []
    for precision, half in HALF.items():
        for tb in (True, False):
            spec = plain_spec(128, 768, 768, tb, b_dtype=half, a_dtype=half)
            sources += [gemm_source(f"g_{t.name}_{int(tb)}", spec, t) for t in mma_tilings(precision, deep=True)]
    # the float ones in dynamic shared memory, float32 operands copied raw: tf32x3's (the split
    # fragments: the most registers) and tf32's 128x128, which tf32x3 has not
    wide_deep = _wide_deep()
    for tb in (True, False):
        sources += [gemm_source(f"g_{t.name}_{int(tb)}", plain_spec(128, 768, 768, tb), t) for t in wide_deep]
    src = tmp_path / "k.cu"
    src.write_text(render(sources, "cuda"))
    ptx, log = nvcc_ptx_and_ptxas(src, arch)
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", log)]
    assert len(spills) == len(sources) and not any(spills), log[-3000:]
    used = dict(re.findall(r"Function properties for (\w+)\n.*\n.*Used \d+ registers([^\n]*)", log))
    deep = [f"g_{t.name}_{int(tb)}" for tb in (True, False)
            for t in [t for p in HALF for t in mma_tilings(p, deep=True) if t.dynamic] + wide_deep]
    assert len(deep) == 2 * (2 * len(DEEP_TILINGS) + 6)
    assert deep and all(n in used and "bytes smem" not in used[n] for n in deep), {n: used.get(n) for n in deep}
    n = len(sources)
    assert ptx.count("cp.async.cg.shared.global") >= 2 * n and ptx.count("cp.async.wait_group") >= n
    assert ptx.count("ldmatrix.sync.aligned.m8n8.x4.shared.b16") >= n
    assert ptx.count("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16") >= n // 2
    for ty in ("f16", "bf16"):
        assert ptx.count(f"mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32") >= n // 4, ty
    assert THREADS == 256  # Rammer's vEU size: these stay rTasks


# -- tf32 and tf32x3: float32 operands, cp.async in chunks of four, padded rows ------------------
def _wide_deep():
    """The float DEEP tilings worth building: tf32x3's, and tf32's 128x128, which tf32x3 has not
    (tf32's others are the same code with one mma and a rounding in place of the split)."""
    return [t for t in mma_tilings("tf32x3", deep=True) if t.dynamic] + \
        [t for t in mma_tilings("tf32", deep=True) if t.dynamic and t.bm * t.bn == 128 * 128]


@needs_opencl
def test_every_deep_float_tiling_matches_numpy(rt):
    """tf32x3's DEEP tilings and tf32's 128x128 one (3-8 stages of 32-wide float k blocks;
    dynamic shared memory on CUDA; _wide_deep): K of 10 k blocks, more than any tiling's stages; A [K, M] in rows of 37,
    loaded per element and landed after each block's mmas into the stage it refills; B [K, N]
    copied raw and read by scalar fragment loads. tf32 against numpy on rounded operands, tf32x3
    within float32's bound."""
    M, N, K = 37, 72, 300
    spec = plain_spec(M, N, K, False, trans_a=True)
    tilings = _wide_deep()
    sources = [gemm_source(f"g_{t.name}", spec, t) for t in tilings]
    assert all(src.count("CP_ASYNC16(") == 2 and "stage_a[" in src for src in sources)
    rt.compile(render(sources, rt.dialect), gemm_plan((f"g_{t.name}", t) for t in tilings))
    A, B = _operands(M, N, K, True, False, seed=6)
    exact = A.T.astype(np.float64) @ B.astype(np.float64)
    bound = _f32_bound(A, B, True, False, 2.0 ** -21)
    tf32 = _reference(A, B, "tf32", True, False)
    for t in tilings:
        out = _run(rt, f"g_{t.name}", t, spec, A, B, "float32", "float32")
        if t.precision == "tf32":
            np.testing.assert_allclose(out, tf32, rtol=2e-5, atol=2e-5, err_msg=t.name)
        else:
            assert (np.abs(out - exact) <= bound).all(), (t.name, np.abs(out - exact).max())


#: (M, N, K, trans_a, trans_b, copies expected per fill): A and B k-contiguous (ldmatrix of
#: floats); B [K, N] (scalar fragment reads); A [K, M] in rows of 37 (per element), K = 52 (a
#: ragged last k block).
WIDE_CASES = [(37, 70, 200, False, True, 2), (37, 72, 136, False, False, 2), (37, 72, 52, True, False, 1)]


def _f32_bound(A, B, trans_a, trans_b, unit):
    """A rigorous bound on |computed - exact| for a float32-accumulated product whose terms each
    carry a relative error of at most `unit`: gamma_K = K u32 / (1 - K u32) of the sum of |a||b|
    for the accumulation, plus `unit` of it for the terms."""
    a, b = (np.abs(x.astype(np.float64)) for x in (A.T if trans_a else A, B.T if trans_b else B))
    K, u32 = a.shape[1], 2.0 ** -24
    return (K * u32 / (1 - K * u32) + unit) * (a @ b)


@needs_opencl
@pytest.mark.parametrize("precision", ["tf32", "tf32x3"])
@pytest.mark.parametrize("M,N,K,trans_a,trans_b,raw", WIDE_CASES,
                         ids=[f"{c[0]}x{c[1]}x{c[2]}-{'At' if c[3] else 'A'}{'Bt' if c[4] else 'B'}-{c[5]}raw"
                              for c in WIDE_CASES])
def test_every_float_async_tiling_matches_numpy(rt, precision, M, N, K, trans_a, trans_b, raw):
    """Each cp.async tiling at tf32 equals numpy on TF32-rounded operands (products exact, sums
    float32); at tf32x3 it is within float32's own error bound of the exact product, a bound that
    plain TF32 rounding misses by far (so the split is really done)."""
    from dlcc.kernels.gemm_mma import TF32_ASYNC_TILINGS

    tilings = [t for t in mma_tilings(precision) if t.stages > 1]
    assert len(tilings) == len(TF32_ASYNC_TILINGS) - (precision == "tf32x3")  # no 128x128 at tf32x3
    spec = plain_spec(M, N, K, trans_b, trans_a=trans_a)
    sources = [gemm_source(f"g_{t.name}", spec, t) for t in tilings]
    for src in sources:
        assert src.count("CP_ASYNC16(") == 2 * raw
        assert ("LDSM_X4" in src) == (not trans_a or trans_b) and "LDSM_X4_T" not in src
    rt.compile(render(sources, rt.dialect), gemm_plan((f"g_{t.name}", t) for t in tilings))
    A, B = _operands(M, N, K, trans_a, trans_b)
    exact = (A.T if trans_a else A).astype(np.float64) @ (B.T if trans_b else B).astype(np.float64)
    bound = _f32_bound(A, B, trans_a, trans_b, 2.0 ** -21)
    tf32 = _reference(A, B, "tf32", trans_a, trans_b)
    assert (np.abs(tf32 - exact) > bound).any()
    for t in tilings:
        out = _run(rt, f"g_{t.name}", t, spec, A, B, "float32", "float32")
        if precision == "tf32":
            np.testing.assert_allclose(out, tf32, rtol=2e-5, atol=2e-5, err_msg=t.name)
        else:
            assert (np.abs(out - exact) <= bound).all(), (t.name, np.abs(out - exact).max())


@needs_opencl
def test_tf32x3_keeps_infinities_and_nans(rt):
    """An infinite operand gives the infinite result float32 gives (its split parts must not
    make 0 x inf or inf - inf), and a NaN operand a NaN; the rest of the output stays exact."""
    from dlcc.kernels.gemm_mma import mma_tilings as tilings_at

    t = next(t for t in tilings_at("tf32x3") if t.bm == 32 and t.bk == 32)
    M, N, K = 32, 64, 64
    spec = plain_spec(M, N, K, True)
    rt.compile(render([gemm_source("g_inf", spec, t)], rt.dialect), gemm_plan([("g_inf", t)]))
    A, B = _operands(M, N, K, False, True, seed=5)
    B = np.abs(B) + 0.5
    A[3, 7], A[5, 0], A[9, 9] = np.inf, -np.inf, np.nan
    B[11, 2] = np.inf
    A[3, 2] = 0.25  # row 3 meets B's inf in column 11 with the same sign
    out = _run(rt, "g_inf", t, spec, A, B, "float32", "float32")
    with np.errstate(invalid="ignore"):
        exact = A.astype(np.float64) @ B.T.astype(np.float64)
    assert np.isposinf(exact[3]).all() and np.isneginf(exact[5, :11]).all() and np.isnan(exact[9]).all()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(exact))
    np.testing.assert_array_equal(np.isinf(out) & (out > 0), np.isposinf(exact))
    np.testing.assert_array_equal(np.isinf(out) & (out < 0), np.isneginf(exact))
    finite = np.isfinite(exact)
    assert finite.sum() > M * N // 2
    with np.errstate(invalid="ignore"):
        bound = _f32_bound(A, B, False, True, 2.0 ** -21)
    assert (np.abs(out[finite] - exact[finite]) <= bound[finite]).all()


@pytest.mark.parametrize("precision", ["tf32", "tf32x3"])
def test_the_padded_float_layout_has_no_bank_conflicts(precision):
    """tf32's buffers are padded rows of floats: the eight rows each ldmatrix matrix reads of a
    k-contiguous operand, and the 32 lanes' scalar fragment reads of the other layout (lane
    (g, t) at row k + t, column x + g), each fall in 32 distinct banks, for every tiling, warp,
    mma tile and k offset."""
    for t in (t for t in mma_tilings(precision) if t.stages > 1):
        for which in ("a", "b"):
            x0 = "mma_wm0" if which == "a" else "mma_wn0"
            for kc in (True, False):
                op = OperandTile(which, t, kc)
                for warp in range(8):
                    w0 = (warp // t.warps_n) * (t.bm // t.warps_m) if which == "a" else \
                        (warp % t.warps_n) * (t.bn // t.warps_n)
                    tiles = t.mi if which == "a" else t.ni
                    for kk in range(0, t.bk, 8):
                        for i in range(tiles):
                            if kc and which == "a":
                                addr = [_ceval(a_lane_address(op), mma_lane=L, mma_wm0=w0, mi=i, kk=kk) for L in range(32)]
                            elif kc:
                                addr = [_ceval(b_lane_address(op, False), mma_lane=L, mma_wn0=w0, ni=i, kk=kk)
                                        for L in range(16)]
                            if kc:
                                for m in range(len(addr) // 8):  # each matrix: 8 rows of 4 floats
                                    banks = [(a + w) % 32 for a in addr[8 * m:8 * m + 8] for w in range(4)]
                                    assert len(set(banks)) == 32, (t.name, which, kc, warp, kk, i, m)
                            else:
                                for dk in (0, 4):
                                    offs = [_ceval(op.at(f"{kk} + {L % 4} + {dk}", f"{x0} + {i * (16 if which == 'a' else 8)} + {L // 4}"),
                                                   mma_wm0=w0, mma_wn0=w0) for L in range(32)]
                                    assert len({o % 32 for o in offs}) == 32, (t.name, which, kc, warp, kk, i, dk)
