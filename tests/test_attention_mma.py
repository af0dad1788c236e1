"""The tensor-core fused-attention rOperator (dlcc/kernels/attention_mma.py) without a GPU.

On PoCL the mma instructions are emulated through local memory (backends/prelude_opencl.h), so
every fragment read, accumulator index and store of the template runs as on a GPU. Each precision
(tf32, fp16, bf16) is checked against a float64 numpy model of the same algorithm: Q, K and V
rounded to the operand type, the online softmax walked in the template's key blocks, and each
block's probabilities rounded as the template rounds them (relative to the running maximum).
What remains between the two is float32 arithmetic, and, where a probability lies within
float32's error of a rounding boundary of the operand type, the other rounding: `_reference`
bounds both per output element (see there), so the tolerance is tight. The same comparison
against a model that skips P's rounding fails, so the check sees the rounding.

Shapes: BERT-base's head (D = Dv = 64), ragged query and key blocks with D = 40, Dv = 24 (zero
padding of D to the mma's k, of Dv to 8 columns, warps without an output tile), D = Dv = 128 (key
block 32: the score tile split along D over two warps), one query and one key; float32, float16
and bfloat16 storage; a scale; additive masks with -inf (rows whose first key blocks are all
-inf, which must equal softmax; a fully masked row, NaN as Softmax gives). A mutated template
without the online rescaling fails on scores that grow across key blocks. The K and V loads are
staged through registers: the text issues each block's loads before the mmas they overlap and
stores them to shared memory after; one key block of exactly BK keys, and two with the second
ragged, where the clamped loads put K's last column in D's padding and key N - 1 past N (an inf
there shows whether they are read as zeros); the cost model's latency chain. nvcc builds every
precision for sm_80 and sm_90 without spills, and no loop around a barrier depends on the task
index (the shape PoCL 3.1 miscompiles)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from conftest import opencl_device_available
from dlcc.backends.nvcc import compile_cubin, find_nvcc
from dlcc.backends.source import render
from dlcc.kernels.attention import (ATTN_THREADS, SMEM_LIMIT_FLOATS, AttentionShape, attention_cost, attention_tasks,
                                    plain_attention_spec)
from dlcc.kernels.attention_mma import (MmaAttentionTiling, mma_attention_cost, mma_attention_registers,
                                        mma_attention_smem_floats, mma_attention_source, mma_attention_tasks,
                                        mma_attention_tiling)
from dlcc.kernels.gemm_mma import MMA_KINDS
from dlcc.testing.pocl_kernels import grid_dependent_barrier_loops
from dlcc.testing.rounding import operand_round

PRECISIONS = list(MMA_KINDS)
needs_opencl = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")

_GUARD = 64  # elements past O that must stay untouched
U32 = 2.0 ** -24  # float32's unit roundoff
#: Half an ulp of the output's storage type: the store's own rounding.
_STORE_UNIT = {"float32": 0.0, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}


def _np_dtype(name):
    import ml_dtypes

    return {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}[name]


@pytest.fixture(scope="module")
def rt():
    from dlcc.executor import make_runtime

    return make_runtime("opencl")


def _run(rt, spec, precision, Q, K, V, mask=None, dtype="float32", source=None):
    """Compile the standalone rOperator (or `source`, a mutation of it) for OpenCL, run it once
    and return O as float32, after checking that every element of O was written (it starts NaN,
    as does a guard past it, which must stay NaN)."""
    name = "attn"
    rt.compile(render([source or mma_attention_source(name, spec, precision)], rt.dialect),
               {"kernels": [{"name": name, "kind": "attention"}]})
    st = _np_dtype(dtype)
    ins = [np.ascontiguousarray(x.astype(st)).view(np.uint8) for x in (Q, K, V)]
    if mask is not None:
        ins.append(np.ascontiguousarray(mask, np.float32).view(np.uint8))
    n_out = spec.batch * spec.M * spec.Dv
    out_init = np.full(n_out + _GUARD, np.nan, np.float32).astype(st).view(np.uint8)
    bufs = [rt.alloc(x.nbytes) for x in ins] + [rt.alloc(out_init.nbytes)]
    for b, x in zip(bufs, ins + [out_init]):
        rt.write(b, 0, x)
    rt.launch(rt.kernel(name), mma_attention_tasks(spec), ATTN_THREADS, bufs)
    out = np.empty(out_init.nbytes, np.uint8)
    rt.read(bufs[-1], 0, out)
    rt.finish()
    o = out.view(st).astype(np.float32)
    assert np.isnan(o[n_out:]).all(), "the kernel wrote past O"
    return o[:n_out].reshape(spec.batch, spec.M, spec.Dv)


def _scores32(Q, K, scale, mask, precision):
    """The kernel's float32 scores on PoCL, bit for bit but for a fused multiply-add: the emulated
    mma (backends/prelude_opencl.h) sums each k step's products in k order from 0 and adds that
    to the accumulator, one warp's part of D after the other's k steps; the parts of a split
    score tile are added in order; then `score` scales (and adds the mask) in float32. The
    products of rounded operands are exact in float32, so a fused multiply-add changes none."""
    t = mma_attention_tiling(AttentionShape(Q.shape[0], Q.shape[1], K.shape[1], Q.shape[2], 1), precision)
    pad = [(0, 0), (0, 0), (0, t.d_pad - Q.shape[2])]
    Qr, Kr = (np.pad(operand_round(x, precision), pad) for x in (Q, K))
    dot = None
    for part in range(t.ksplit):
        acc = np.zeros((Q.shape[0], Q.shape[1], K.shape[1]), np.float32)
        for step in range(t.d_steps):
            s = np.zeros_like(acc)
            for d in range((part * t.d_steps + step) * t.kstep, (part * t.d_steps + step + 1) * t.kstep):
                s = s + Qr[:, :, None, d] * Kr[:, None, :, d]
            acc = acc + s
        dot = acc if dot is None else dot + acc
    S = dot * np.float32(scale)
    return S if mask is None else S + mask.astype(np.float32)


def _reference(Q, K, V, scale, mask, precision, round_p=True, store="float32"):
    """(O, bound): the template's algorithm on the kernel's float32 scores (_scores32), the rest
    in float64, and how far the kernel may be from it.

    V is rounded to the operand type; per key block, the probabilities p = exp(s - m) against the
    running maximum m (0 while m is -inf) are rounded to the operand type as the kernel rounds
    them (not where `round_p` is off: the model of a kernel that skipped it), and the running sum
    adds them as rounded. The bound, per output element, is the sum of
      - the probabilities that may round the other way: the kernel's p differs from the model's
        by exp's error (OpenCL allows 3 ulps; 4 here) and a fused multiply-add in `score`
        (an ulp of s); where p(1 +- that) round to values dp apart, the output may move by
        dp |v| / l, and by dp |O| / l through the sum;
      - float32 accumulation of P.V and of the sum over N terms and the rescalings by alpha
        (the products of rounded operands are exact): (N + 16 blocks) u (sum p |v| / l + |O|);
      - the store's rounding to a half type (half an ulp of |O|).
    Elsewhere the kernel's rounded p equals the model's exactly, so the bound is float32 noise
    (about 1e-5 at these sizes) but for the rare probability on a rounding boundary."""
    bk = mma_attention_tiling(AttentionShape(*Q.shape[:2], K.shape[1], Q.shape[2], V.shape[2]), precision).bk
    S = _scores32(Q, K, scale, mask, precision)
    Vr = operand_round(V, precision).astype(np.float64)
    aV = np.abs(Vr)
    b, M, N = S.shape
    mi = np.full((b, M, 1), -np.inf, np.float32)
    l, dl = np.zeros((b, M, 1)), np.zeros((b, M, 1))
    O, A, dO = (np.zeros((b, M, V.shape[-1])) for _ in range(3))
    rnd = (lambda x: operand_round(x.astype(np.float32), precision).astype(np.float64)) if round_p else \
        (lambda x: x)
    blocks = 0
    for n0 in range(0, N, bk):
        blocks += 1
        s = S[..., n0:n0 + bk]
        mn = np.fmax(mi, np.fmax.reduce(s, axis=-1, keepdims=True))  # NaN-ignoring, as F_MAX
        ms = np.where(mn == -np.inf, np.float32(0), mn)
        with np.errstate(invalid="ignore", over="ignore"):
            alpha = np.exp((mi - ms).astype(np.float64))
            x = np.exp((s - ms).astype(np.float64))
            rel = np.where(np.isfinite(s), 8 * U32 + 2 * U32 * np.abs(s), 0.0)
            dp = np.abs(rnd(x * (1 + rel)) - rnd(x * (1 - rel)))
        dp = np.where(np.isfinite(dp), dp, 0.0)
        p = rnd(x)
        l, dl = l * alpha + p.sum(-1, keepdims=True), dl * alpha + dp.sum(-1, keepdims=True)
        vr, av = Vr[:, n0:n0 + bk], aV[:, n0:n0 + bk]
        O, A, dO = O * alpha + p @ vr, A * alpha + p @ av, dO * alpha + dp @ av
        mi = mn
    with np.errstate(invalid="ignore", divide="ignore"):
        out = O / l
        bound = (dO + np.abs(out) * dl) / l + (N + 16 * blocks) * U32 * (A / l + np.abs(out)) \
            + _STORE_UNIT[store] * np.abs(out)
    return out, bound


def _check(out, ref, bound, what=""):
    """NaN exactly where the reference has NaN (a row without a finite score), elsewhere within
    the bound (plus 1e-30: an exact zero where the bound is 0)."""
    nan = np.isnan(ref)
    assert (np.isnan(out) == nan).all(), f"{what}: NaN at {np.argwhere(np.isnan(out) != nan)[:5]}"
    err = np.abs(out - ref)[~nan]
    excess = err - bound[~nan] - 1e-30
    worst = np.argmax(excess)
    assert (excess <= 0).all(), (f"{what}: {int((excess > 0).sum())} elements past the bound, worst error "
                                 f"{err[worst]:.3g} against a bound of {bound[~nan][worst]:.3g}")


def _inputs(batch, M, N, D, Dv, seed, amp=2.0):
    """Q, K, V of standard normals (Q and K times `amp`: scores spread enough that the running
    maximum moves between key blocks)."""
    rng = np.random.default_rng(seed)
    return (amp * rng.standard_normal((batch, M, D), dtype=np.float32),
            amp * rng.standard_normal((batch, N, D), dtype=np.float32),
            rng.standard_normal((batch, N, Dv), dtype=np.float32))


def _grows_across_blocks(Q, K, scale, bk):
    """Whether some row's maximum score grows after its first key block (the rescaling acts)."""
    S = np.einsum("bmd,bnd->bmn", Q.astype(np.float64), K.astype(np.float64)) * scale
    return S.shape[-1] > bk and bool((S[..., bk:].max(-1) > S[..., :bk].max(-1)).any())


#: (batch, M, N, D, Dv): BERT-base's head; ragged blocks with D and Dv padded (and five warps
#: without an output tile); D = Dv = 128 (key block 32, the score tile split along D); one query
#: and one key.
SHAPES = [(2, 128, 128, 64, 64), (2, 37, 50, 40, 24), (1, 33, 100, 128, 128), (3, 1, 1, 16, 8)]


@needs_opencl
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("precision", PRECISIONS)
def test_matches_reference(rt, precision, shape):
    D = shape[3]
    scale = 1.0 / np.sqrt(D)
    Q, K, V = _inputs(*shape, seed=sum(shape))
    spec = plain_attention_spec(*shape, scale=scale)
    bk = mma_attention_tiling(spec, precision).bk
    out = _run(rt, spec, precision, Q, K, V)
    ref, bound = _reference(Q, K, V, scale, None, precision)
    _check(out, ref, bound, f"{precision} {shape}")
    if shape[2] > 1:
        if precision != "tf32x3":  # which keeps P float32 (split, not rounded): nothing to see
            # the bound sees P's rounding: a model without it is out of bounds
            plain, _ = _reference(Q, K, V, scale, None, precision, round_p=False)
            assert (np.abs(out - plain) > bound).any()
        assert _grows_across_blocks(Q, K, scale, bk) == (shape[2] > bk)


@needs_opencl
def test_beyond_128(rt):
    """D = 160, Dv = 136 at fp16: key blocks of 16 (the score tile split along D over four
    warps), three output tiles a warp (the last warps' third a repeat, not stored)."""
    shape, precision, scale = (1, 20, 45, 160, 136), "fp16", 0.1
    spec = plain_attention_spec(*shape, scale=scale)
    t = mma_attention_tiling(spec, precision)
    assert (t.bk, t.ksplit, t.ni) == (16, 4, 3)
    Q, K, V = _inputs(*shape, seed=1)
    _check(_run(rt, spec, precision, Q, K, V), *_reference(Q, K, V, scale, None, precision), "D = 160")


def _masks(batch, M, N, seed):
    """Per batch index: 0 causal with -1e9 (row m keeps keys 0..m) and random -inf among the
    kept keys but key 0; 1 -inf everywhere but the last 5 keys and one key per row in the middle
    (rows whose first key blocks are all -inf; row 0 keeps the last 5 keys only); 2 and on,
    causal with -inf and a random finite bias."""
    rng = np.random.default_rng(seed)
    m = np.arange(M)[:, None]
    n = np.arange(N)[None, :]
    masks = []
    for b in range(batch):
        if b == 1:
            mk = np.full((M, N), -np.inf, np.float32)
            mk[:, N - 5:] = 0.0
            mk[np.arange(1, M), np.arange(1, M) % N // 2 + N // 4] = rng.standard_normal(M - 1)
        else:
            mk = np.where(n > m, np.float32(-1e9 if b == 0 else -np.inf), np.float32(0.0))
            if b == 0:
                mk = np.where((n <= m) & (n > 0) & (rng.random((M, N)) < 0.3), np.float32(-np.inf), mk)
            else:
                mk = mk + rng.standard_normal((M, N)).astype(np.float32)
        masks.append(mk)
    return np.stack(masks).astype(np.float32)


@needs_opencl
@pytest.mark.parametrize("precision", PRECISIONS)
def test_additive_mask(rt, precision):
    """A mask read in `score` (its statements declare a name), with -1e9 and -inf; rows whose
    first two key blocks are all -inf come out as softmax over their finite scores."""
    shape = (3, 70, 150, 64, 64)
    batch, M, N = shape[:3]
    scale = 0.125
    Q, K, V = _inputs(*shape, seed=7)
    mask = _masks(batch, M, N, seed=11)
    spec = plain_attention_spec(*shape, scale=scale, mask=True)
    bk = mma_attention_tiling(spec, precision).bk
    assert np.isfinite(mask).any(axis=-1).all() and not np.isfinite(mask[1, :, :2 * bk]).any(axis=-1).all()
    out = _run(rt, spec, precision, Q, K, V, mask)
    assert np.isfinite(out).all()
    _check(out, *_reference(Q, K, V, scale, mask, precision), f"{precision} mask")


@needs_opencl
@pytest.mark.parametrize("precision", PRECISIONS)
def test_fully_masked_row_is_nan_like_softmax(rt, precision):
    """A row with no finite score ends 0/0 = NaN, as Softmax over it; the others are unaffected."""
    shape = (2, 20, 40, 16, 16)
    Q, K, V = _inputs(*shape, seed=17)
    mask = np.zeros((2, 20, 40), np.float32)
    mask[0, 3, :] = -np.inf
    mask[0, 4, :39] = -np.inf  # only the last key left
    out = _run(rt, plain_attention_spec(*shape, mask=True), precision, Q, K, V, mask)
    assert np.isnan(out[0, 3]).all() and np.isfinite(np.delete(out[0], 3, axis=0)).all() and np.isfinite(out[1]).all()
    _check(out, *_reference(Q, K, V, 1.0, mask, precision), f"{precision} fully masked")


@needs_opencl
@pytest.mark.parametrize("precision,dtype", [("fp16", "float16"), ("bf16", "bfloat16"), ("tf32", "float16")])
def test_half_storage(rt, precision, dtype):
    """Q, K, V and O stored as float16 / bfloat16 (plain_attention_spec's dtype), with a mask:
    the operands are the stored values, rounded to the precision's type; the bound adds the
    output store's rounding."""
    shape = (3, 40, 130, 64, 64)
    batch, M, N, D, _ = shape
    scale = 1.0 / np.sqrt(D)
    Q, K, V = (x.astype(_np_dtype(dtype)).astype(np.float32) for x in _inputs(*shape, seed=5))
    mask = _masks(batch, M, N, seed=13)
    spec = plain_attention_spec(*shape, dtype=dtype, scale=scale, mask=True)
    out = _run(rt, spec, precision, Q, K, V, mask, dtype)
    _check(out, *_reference(Q, K, V, scale, mask, precision, store=dtype), f"{precision} {dtype}")


@needs_opencl
def test_online_rescaling_is_needed(rt):
    """Scores that grow along the keys (each key block's maximum above the last): the template
    matches; mutated to skip the accumulators' rescaling by alpha, or the running sum's, it
    does not."""
    precision, shape = "fp16", (1, 32, 192, 64, 64)
    rng = np.random.default_rng(23)
    Q = rng.standard_normal((1, 32, 64), dtype=np.float32)
    K = (rng.standard_normal((1, 192, 64)) * np.linspace(0.2, 2.0, 192)[None, :, None]).astype(np.float32)
    V = rng.standard_normal((1, 192, 64), dtype=np.float32)
    scale = 0.25
    spec = plain_attention_spec(*shape, scale=scale)
    bk = mma_attention_tiling(spec, precision).bk
    S = np.einsum("bmd,bnd->bmn", Q, K) * scale
    assert (np.diff(S.reshape(1, 32, -1, bk).max(-1), axis=-1) > 0).mean() > 0.5
    ref, bound = _reference(Q, K, V, scale, None, precision)
    good = mma_attention_source("attn", spec, precision)
    _check(_run(rt, spec, precision, Q, K, V, source=good), ref, bound, "unmutated")
    no_acc = good.replace("*= at_a_lo;", "*= 1.0f;").replace("*= at_a_hi;", "*= 1.0f;")
    no_sum = good.replace("at_l *= at_alpha_r;", "")
    for bad in (no_acc, no_sum):
        assert bad != good
        with pytest.raises(AssertionError, match="past the bound"):
            _check(_run(rt, spec, precision, Q, K, V, source=bad), ref, bound)


@needs_opencl
@pytest.mark.parametrize("precision", PRECISIONS)
def test_one_full_key_block(rt, precision):
    """N = BK: one key block, none staged after it (no next K in the loop), no partial block."""
    shape = (2, 20, 64, 64, 64)
    spec = plain_attention_spec(*shape, scale=0.125)
    assert mma_attention_tiling(spec, precision).bk == 64
    src = mma_attention_source("attn", spec, precision)
    assert src.count("at_kr[at_u] = ") == 1 and "at_kb + 1 <" not in src
    Q, K, V = _inputs(*shape, seed=3)
    _check(_run(rt, spec, precision, Q, K, V), *_reference(Q, K, V, 0.125, None, precision), f"{precision} N = BK")


@needs_opencl
@pytest.mark.parametrize("precision", PRECISIONS)
def test_two_key_blocks_ragged_with_inf_past_the_problem(rt, precision):
    """Two key blocks, the second of 7 keys, D = 36 padded to whole mma k steps (40 at tf32, 48
    at fp16/bf16). The staged loads are clamped into the tensors, so D's padding columns of the
    K tile hold K's last column and the keys past N hold key N - 1 again; the template reads both
    as zeros. K's last column holds +inf at key 5 and Q's is negative: key 5 scores -inf for every
    row and drops out (read unzeroed, the padding's 0 x inf would make the rows NaN). V's last
    key holds +inf in column 0: every row's column 0 is +inf (read unzeroed, the 57 padding
    keys' p = 0 times inf would make it NaN); the other columns match the reference."""
    shape = (2, 17, 71, 36, 40)
    scale = 1.0 / 6.0
    spec = plain_attention_spec(*shape, scale=scale)
    t = mma_attention_tiling(spec, precision)
    assert t.bk == 64 and t.d_pad > 36
    Q, K, V = _inputs(*shape, seed=29, amp=0.5)
    Q[..., -1] = -np.abs(Q[..., -1]) - 0.5
    K[:, 5, -1] = np.inf
    V[:, -1, 0] = np.inf
    out = _run(rt, spec, precision, Q, K, V)
    assert np.isposinf(out[..., 0]).all(), out[..., 0]
    with np.errstate(invalid="ignore"):  # the bound's 0 x inf in column 0
        ref, bound = _reference(Q, K, V, scale, None, precision)
    assert np.isfinite(ref[..., 1:]).all()
    _check(out[..., 1:], ref[..., 1:], bound[..., 1:], f"{precision} ragged")


def _key_loop(src: str) -> str:
    """The key loop's body in the rOperator text (up to the store of the running sums)."""
    return src[src.index("for (int at_kb = 0;"):src.index("at_red[tid] = at_l;")]


def test_next_blocks_loads_issued_before_the_mmas():
    """The pipeline in the text, at every precision, for a ragged N with D padded and for BERT's
    head: in a key block, V's global loads (into registers) come before the first barrier and
    the score mmas, and their store to the shared tile only after the scores are out; the next K
    block's loads come after the row maxima's barrier and before the P.V mmas, their store after
    P.V's barrier, under kb + 1 < key blocks. Loading straight to shared memory, as the template
    did before, fails: its K load came first and V's after the scores."""
    for precision in PRECISIONS:
        mma = MMA_KINDS[precision][2] + "("
        for shape in [(2, 37, 150, 40, 24), (12, 197, 384, 64, 64)]:
            spec = plain_attention_spec(*shape)
            loop = _key_loop(mma_attention_source("a", spec, precision))
            bars = [i for i in range(len(loop)) if loop.startswith("BARRIER();", i)]
            mmas = [i for i in range(len(loop)) if loop.startswith(mma, i)]
            assert len(bars) == 5 and len(mmas) == 2, (bars, mmas)
            v_load, v_store = loop.index("at_vr[at_u] = V["), loop.index("] = at_vr[at_u];")
            k_load, k_store = loop.index("at_kr[at_u] = K["), loop.index("] = at_kr[at_u];")
            assert loop.count("= V[") == loop.count("= K[") == 1, "one load of each a key block"
            # V(kb): loaded before the first barrier and the score mmas, stored after the second
            assert v_load < bars[0] < mmas[0] < bars[1] < v_store < bars[2]
            # K(kb + 1): loaded after the row maxima's barrier, before the P.V mmas; stored after
            assert bars[2] < k_load < bars[3] < mmas[1] < bars[4] < k_store
            assert f"if (at_kb + 1 < {-(-shape[2] // 64)})" in loop[bars[4]:k_store]
            # nothing of the loaded values is used in between: the stores copy them as loaded
            for reg in ("at_vr", "at_kr"):
                assert loop.count(reg) == 2, reg


def test_latency_chain_overlaps_the_loads():
    """With issue costs taken away (so the latency chain is the cost), one rTask on one SM costs
    STEP_LATENCY for the first loads plus, per key block, two load latencies and the row maxima's
    barrier: the score step's and P.V's mma chains at D = 64 (and 128) are shorter than a load
    and hidden behind V's and the next K's loads. Loading straight to shared memory, the chains
    came on top (2 L + MMA_LATENCY x the warp's mmas a block)."""
    import dlcc.kernels.attention_mma as am
    import dlcc.kernels.gemm as gemm

    L, S = gemm.STEP_LATENCY, am.BARRIER_LATENCY
    one_sm = SimpleNamespace(sms=1)
    orig = gemm.ISSUE_PER_CYCLE, am.MMA_PER_CYCLE
    try:
        gemm.ISSUE_PER_CYCLE, am.MMA_PER_CYCLE = 1e12, 1e12
        for precision in PRECISIONS:
            for D, N in [(64, 64 * 7), (128, 32 * 5), (64, 100)]:
                t = mma_attention_tiling(AttentionShape(1, 16, N, D, D), precision)
                assert am.MMA_LATENCY * max(t.d_steps, t.ni * t.bk // t.kstep) + 2 * S < L
                cost = mma_attention_cost(1, 16, N, D, D, precision, one_sm)
                assert cost == pytest.approx(L + -(-N // t.bk) * (2 * L + S), rel=1e-9), (precision, D, N)
    finally:
        gemm.ISSUE_PER_CYCLE, am.MMA_PER_CYCLE = orig


def test_no_barrier_in_task_dependent_loops():
    """Every loop around a barrier (the key loop, the emulated mmas' loops) has a constant trip
    count, so PoCL builds the rOperator optimised (dlcc/testing/pocl_kernels.py)."""
    for precision in PRECISIONS:
        for shape in [(2, 197, 197, 64, 64), (3, 1, 77, 128, 128), (2, 37, 50, 40, 24)]:
            spec = plain_attention_spec(*shape, dtype="bfloat16", mask=True)
            src = render([mma_attention_source("a", spec, precision)], "opencl")
            body = src.split("/* ---- kernels emitted by dlcc ---- */")[1]
            assert "BARRIER()" in body and MMA_KINDS[precision][2] in body
            assert grid_dependent_barrier_loops(src, ["a"]) == []


def test_tiling_fits_shared_memory():
    """Every D, Dv up to 128 gets a key block whose layout fits 47 KiB with OpenCL's emulation
    scratch, the widest that fits; BERT's D = 64 takes 64 at every precision, D = 128 takes 32;
    larger sizes, unknown precisions and empty problems are refused."""
    for precision in PRECISIONS:
        for D in range(1, 129):
            for Dv in range(1, 129, 3):
                t = mma_attention_tiling(AttentionShape(1, 1, 1, D, Dv), precision)
                assert t.smem_floats <= SMEM_LIMIT_FLOATS and t.d_pad >= D and t.dv_pad >= Dv, (precision, D, Dv)
                assert t.bk == 64 or MmaAttentionTiling(D, Dv, 2 * t.bk, precision).smem_floats > SMEM_LIMIT_FLOATS
                assert t.d_pad % (t.kstep * t.ksplit) == 0 and t.d_steps * t.kstep * t.ksplit == t.d_pad
        assert mma_attention_tiling(AttentionShape(1, 1, 1, 64, 64), precision).bk == 64
        assert mma_attention_tiling(AttentionShape(1, 1, 1, 128, 128), precision).bk == 32
        spec = plain_attention_spec(12, 197, 197, 64, 64)
        shape = AttentionShape(12, 197, 197, 64, 64)
        assert mma_attention_tasks(spec) == attention_tasks(spec) == mma_attention_tasks(shape) == 12 * 13
        t = mma_attention_tiling(spec, precision)
        assert mma_attention_smem_floats(spec, precision) == t.tile_floats + t.emu_floats == t.smem_floats
        emu = MMA_KINDS[precision][4]
        assert f"SHARED float smem[{t.tile_floats} + 8 * {emu}];" in mma_attention_source("a", spec, precision)
        for bad in [AttentionShape(1, 1, 1, 512, 512), AttentionShape(1, 1, 1, 64, 1024),
                    AttentionShape(0, 1, 1, 64, 64), AttentionShape(1, 0, 1, 64, 64)]:
            with pytest.raises(ValueError):
                mma_attention_tiling(bad, precision)
    with pytest.raises(ValueError):
        mma_attention_tiling(AttentionShape(1, 1, 1, 64, 64), "fp32")


def test_cost_model():
    """On an H100 the tensor-core template is modelled well below the SIMT one at BERT-base's and
    ViT-B/16's attention; more keys cost more; sizes that do not fit are refused."""
    from dlcc.config import load_device

    h100 = load_device("h100")
    for precision in PRECISIONS:
        for shape in [(12, 128, 128, 64, 64), (12, 197, 197, 64, 64), (16, 512, 512, 128, 128)]:
            tc = mma_attention_cost(*shape, precision, h100)
            assert 0 < tc < attention_cost(*shape, h100) / 2, (precision, shape)
        longer = mma_attention_cost(12, 128, 256, 64, 64, precision, h100)
        assert longer > mma_attention_cost(12, 128, 128, 64, 64, precision, h100)
        with pytest.raises(ValueError):
            mma_attention_cost(1, 16, 16, 512, 512, precision, h100)


NVCC_SHAPES = {  # name: (D, Dv, storage, mask)
    "64": (64, 64, "float32", False), "128": (128, 128, "float32", True), "64_bf16": (64, 64, "bfloat16", True),
    "128_f16": (128, 128, "float16", False), "40x24": (40, 24, "float32", True), "96": (96, 96, "float32", False),
    "64x128": (64, 128, "float32", False), "160x136": (160, 136, "float16", True),
}


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed on this machine")
def test_nvcc_builds_without_spills():
    """Every precision at sm_80 and sm_90: no spills and no stack frame (the staged K and V blocks
    stay registers), the registers the cost model assumes at sm_90 (mma_attention_registers) or
    fewer (at sm_80, at most 8 more), and CUDA's shared memory the tiles alone (no emulation
    scratch)."""
    specs = {f"a_{p}_{k}": (plain_attention_spec(8, 197, 197, D, Dv, dtype=dt, scale=0.125, mask=mk), p)
             for p in PRECISIONS for k, (D, Dv, dt, mk) in NVCC_SHAPES.items()}
    src = render([mma_attention_source(k, s, p) for k, (s, p) in specs.items()], "cuda")
    assert src.count("MMA_TF32(") and src.count("MMA_F16(") and src.count("MMA_BF16(")
    for arch in ("sm_80", "sm_90"):
        usage = compile_cubin(src, arch)
        for k, (s, p) in specs.items():
            u = usage[k]
            assert not u.spills and u.stack_bytes == 0, (arch, k, u)  # the accumulators stay registers
            t = mma_attention_tiling(s, p)
            assert 0 < u.registers <= mma_attention_registers(t) + (0 if arch == "sm_90" else 8), (arch, k, u)
            assert u.smem_bytes == 4 * mma_attention_tiling(s, p).tile_floats <= 47 * 1024, (arch, k, u)
