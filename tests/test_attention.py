"""The fused-attention rOperator (dlcc/kernels/attention.py) on its own: run on PoCL against a
float64 numpy reference on shapes with ragged query and key blocks, D != Dv, a single query and
a single key block; with a scale, with additive masks of large negative values and of -inf (rows
whose first key blocks are all -inf included); with float16 and bfloat16 storage. Every output
element must be written and nothing past the output. nvcc builds it for sm_80 and sm_90 without
spills, and no loop around its barriers depends on the task index (the shape PoCL miscompiles)."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import opencl_device_available
from dlcc.backends.nvcc import compile_cubin, find_nvcc
from dlcc.backends.source import render
from dlcc.kernels.attention import (ATTN_THREADS, BQ, SMEM_LIMIT_FLOATS, AttentionSpec, attention_smem_floats,
                                    attention_source, attention_tasks, attention_tiling, plain_attention_spec)
from dlcc.testing.pocl_kernels import grid_dependent_barrier_loops

needs_opencl = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")

_GUARD = 64  # elements past O that must stay untouched


def _np_dtype(name):
    import ml_dtypes

    return {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}[name]


@pytest.fixture(scope="module")
def rt():
    from dlcc.executor import make_runtime

    return make_runtime("opencl")


def _reference(Q, K, V, scale, mask):
    """softmax(Q.K^T * scale + mask) . V in float64, per batch index."""
    S = np.einsum("bmd,bnd->bmn", Q.astype(np.float64), K.astype(np.float64)) * scale
    if mask is not None:
        S = S + mask.astype(np.float64)
    with np.errstate(invalid="ignore"):  # a row of -inf only: NaN, as Softmax gives
        S = S - S.max(axis=-1, keepdims=True)
        P = np.exp(S)
        P /= P.sum(axis=-1, keepdims=True)
    return P @ V.astype(np.float64)


def _run(rt, spec: AttentionSpec, Q, K, V, mask=None, dtype="float32"):
    """Compile the standalone rOperator for OpenCL, run it once and return O (as float32), after
    checking that the elements past O were left alone."""
    name = "attn"
    rt.compile(render([attention_source(name, spec)], rt.dialect),
               {"kernels": [{"name": name, "kind": "attention"}]})
    st = _np_dtype(dtype)
    ins = [np.ascontiguousarray(x.astype(st)).view(np.uint8) for x in (Q, K, V)]
    if mask is not None:
        ins.append(np.ascontiguousarray(mask, np.float32).view(np.uint8))
    n_out = spec.batch * spec.M * spec.Dv
    # NaN everywhere: every output element must be written; the tail past O must stay NaN
    out_init = np.full(n_out + _GUARD, np.nan, np.float32).astype(st).view(np.uint8)
    bufs = [rt.alloc(x.nbytes) for x in ins] + [rt.alloc(out_init.nbytes)]
    for b, x in zip(bufs, ins + [out_init]):
        rt.write(b, 0, x)
    rt.launch(rt.kernel(name), attention_tasks(spec), ATTN_THREADS, bufs)
    out = np.empty(out_init.nbytes, np.uint8)
    rt.read(bufs[-1], 0, out)
    rt.finish()
    o = out.view(st).astype(np.float32)
    assert np.isnan(o[n_out:]).all(), "the kernel wrote past O"
    return o[:n_out].reshape(spec.batch, spec.M, spec.Dv)


def _inputs(batch, M, N, D, Dv, seed, amp=1.0):
    rng = np.random.default_rng(seed)
    return (amp * rng.standard_normal((batch, M, D), dtype=np.float32),
            amp * rng.standard_normal((batch, N, D), dtype=np.float32),
            rng.standard_normal((batch, N, Dv), dtype=np.float32))


#: (batch, M, N, D, Dv): BERT-base's heads; ViT's 197 tokens (ragged query and key blocks); one
#: query; N past a few key blocks with D = 80 (key block 32); one query and one key block at
#: D = Dv = 128; D != Dv both ways; sizes that are no multiple of anything (Dv = 40: a thread's
#: last column group is partial); a tiny odd problem.
SHAPES = [(12, 128, 128, 64, 64), (2, 197, 197, 64, 64), (3, 1, 77, 32, 32), (2, 50, 300, 80, 80),
          (1, 16, 16, 128, 128), (2, 40, 24, 64, 32), (1, 37, 130, 128, 96), (2, 21, 50, 24, 40), (2, 3, 5, 7, 9)]


@needs_opencl
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_numpy(rt, shape):
    Q, K, V = _inputs(*shape, seed=sum(shape))
    spec = plain_attention_spec(*shape)
    np.testing.assert_allclose(_run(rt, spec, Q, K, V), _reference(Q, K, V, 1.0, None), rtol=1e-4, atol=1e-4)


@needs_opencl
@pytest.mark.parametrize("shape", [(2, 197, 197, 64, 64), (1, 33, 100, 128, 128)], ids=lambda s: "x".join(map(str, s)))
def test_scale(rt, shape):
    """1/sqrt(D) on inputs large enough that the row maximum moves between key blocks and the
    online rescaling matters (exp of unscaled differences would overflow)."""
    scale = 1.0 / np.sqrt(shape[3])
    Q, K, V = _inputs(*shape, seed=3, amp=3.0)
    spec = plain_attention_spec(*shape, scale=scale)
    np.testing.assert_allclose(_run(rt, spec, Q, K, V), _reference(Q, K, V, scale, None), rtol=1e-4, atol=1e-4)


def _masks(batch, M, N, seed):
    """Per batch index: batch 0 causal with -1e9 (row m keeps keys 0..m) and random -inf among
    the kept ones but key 0; batch 1 -inf everywhere but the last 5 keys and one key per row in
    a middle key block (rows whose first key blocks are all -inf); further ones causal with -inf."""
    rng = np.random.default_rng(seed)
    m = np.arange(M)[:, None]
    n = np.arange(N)[None, :]
    masks = []
    for b in range(batch):
        if b == 1:
            mk = np.full((M, N), -np.inf, np.float32)
            mk[:, N - 5:] = 0.0
            mk[np.arange(M), np.arange(M) % N // 2 + N // 4] = rng.standard_normal(M)
        else:
            mk = np.where(n > m, np.float32(-1e9 if b == 0 else -np.inf), np.float32(0.0))
            if b == 0:
                mk = np.where((n <= m) & (n > 0) & (rng.random((M, N)) < 0.3), np.float32(-np.inf), mk)
        masks.append(mk)
    return np.stack(masks).astype(np.float32)


@needs_opencl
@pytest.mark.parametrize("shape", [(3, 197, 197, 64, 64), (2, 50, 300, 80, 80), (2, 130, 70, 32, 48)],
                         ids=lambda s: "x".join(map(str, s)))
def test_additive_mask(rt, shape):
    """A mask tensor read in `score` (indexed by bt, m, n; its statements declare a name): -1e9
    and -inf entries, every row keeping at least one finite score."""
    batch, M, N = shape[:3]
    scale = 0.125
    Q, K, V = _inputs(*shape, seed=7)
    mask = _masks(batch, M, N, seed=11)
    assert np.isfinite(mask).any(axis=-1).all()
    spec = plain_attention_spec(*shape, scale=scale, mask=True)
    out = _run(rt, spec, Q, K, V, mask)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, _reference(Q, K, V, scale, mask), rtol=1e-4, atol=1e-4)


@needs_opencl
def test_fully_masked_row_is_nan_like_softmax(rt):
    """A row with no finite score ends as 0/0 = NaN, as Softmax over it is (numpy's, and
    onnxruntime's); the other rows, and the other batch index, are unaffected."""
    shape = (2, 20, 40, 16, 16)
    Q, K, V = _inputs(*shape, seed=17)
    mask = np.zeros((2, 20, 40), np.float32)
    mask[0, 3, :] = -np.inf
    mask[0, 4, :39] = -np.inf  # only the last key left
    out = _run(rt, plain_attention_spec(*shape, mask=True), Q, K, V, mask)
    assert np.isnan(out[0, 3]).all() and np.isfinite(np.delete(out[0], 3, axis=0)).all() and np.isfinite(out[1]).all()
    np.testing.assert_allclose(out, _reference(Q, K, V, 1.0, mask), rtol=1e-4, atol=1e-4)


@needs_opencl
@pytest.mark.parametrize("dtype,tol", [("bfloat16", 1.5e-2), ("float16", 2e-3)])
@pytest.mark.parametrize("shape", [(2, 197, 197, 64, 64), (1, 40, 70, 128, 128)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mask", [False, True], ids=["plain", "mask"])
def test_half_storage(rt, shape, dtype, tol, mask):
    """Q, K, V and O stored as float16 / bfloat16, computed in float32: the reference takes the
    rounded inputs, and the tolerance is about the output's own rounding."""
    batch, M, N, D, _ = shape
    scale = 1.0 / np.sqrt(D)
    Q, K, V = (x.astype(_np_dtype(dtype)).astype(np.float32) for x in _inputs(*shape, seed=5))
    mk = _masks(batch, M, N, seed=13) if mask else None
    spec = plain_attention_spec(*shape, dtype=dtype, scale=scale, mask=mask)
    np.testing.assert_allclose(_run(rt, spec, Q, K, V, mk, dtype), _reference(Q, K, V, scale, mk), rtol=tol, atol=tol)


def test_tiling_fits_shared_memory():
    """Every D, Dv up to 128 gets a key block whose tiles fit 47 KiB; the widest that fits."""
    for D in range(1, 129):
        for Dv in range(1, 129):
            t = attention_tiling(plain_attention_spec(1, 1, 1, D, Dv))
            assert t.smem_floats <= SMEM_LIMIT_FLOATS, (D, Dv)
            assert t.bk == 64 or type(t)(D, Dv, 2 * t.bk).smem_floats > SMEM_LIMIT_FLOATS, (D, Dv)
    assert attention_tiling(plain_attention_spec(1, 1, 1, 64, 64)).bk == 64
    assert attention_tiling(plain_attention_spec(1, 1, 1, 128, 128)).bk == 32
    spec = plain_attention_spec(12, 197, 197, 64, 64)
    assert attention_tasks(spec) == 12 * -(-197 // BQ)
    assert f"SHARED float smem[{attention_smem_floats(spec)}];" in attention_source("a", spec)
    with pytest.raises(ValueError):
        attention_tiling(plain_attention_spec(1, 1, 1, 512, 512))


def test_no_barrier_in_task_dependent_loops():
    """The key loop's trip count is a constant: no loop around a barrier reads the task index
    (dlcc/testing/pocl_kernels.py), so PoCL builds the rOperator optimised."""
    for shape in [(2, 197, 197, 64, 64), (3, 1, 77, 128, 128)]:
        for mask in (False, True):
            src = render([attention_source("a", plain_attention_spec(*shape, dtype="bfloat16", mask=mask))], "opencl")
            assert "BARRIER()" in src.split("/* ---- kernels emitted by dlcc ---- */")[1]
            assert grid_dependent_barrier_loops(src, ["a"]) == []


NVCC_SPECS = {
    "a_f32_64": (64, 64, "float32", False), "a_f32_128": (128, 128, "float32", True),
    "a_bf16_64": (64, 64, "bfloat16", True), "a_bf16_128": (128, 128, "bfloat16", False),
    "a_f16_80": (80, 80, "float16", True),
}


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed on this machine")
def test_nvcc_builds_without_spills():
    specs = {k: plain_attention_spec(8, 197, 197, D, Dv, dtype=dt, scale=0.125, mask=mk)
             for k, (D, Dv, dt, mk) in NVCC_SPECS.items()}
    src = render([attention_source(k, s) for k, s in specs.items()], "cuda")
    for arch in ("sm_80", "sm_90"):
        usage = compile_cubin(src, arch)
        for k, s in specs.items():
            u = usage[k]
            assert not u.spills and u.registers * ATTN_THREADS <= 65536, (arch, k, u)
            assert u.smem_bytes == 4 * attention_smem_floats(s) <= 47 * 1024, (arch, k, u)
