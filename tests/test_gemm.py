"""The GEMM rOperator template (dlcc/kernels/gemm.py) on its own: every tiling in TILINGS against
numpy on PoCL, on shapes that leave partial tiles in every dimension, and the tiling choice pinned
to what was measured on an H100 (scripts/gemm_tilings.py)."""
from __future__ import annotations

import numpy as np
import pytest

from dlcc.backends.source import render
from dlcc.config import load_device
from dlcc.kernels.gemm import TILINGS, choose_tiling, gemm_source, plain_spec


@pytest.fixture(scope="module")
def rt():
    from dlcc.executor import make_runtime

    return make_runtime("opencl")


@pytest.mark.parametrize("trans_b", [True, False], ids=["Bt", "B"])
@pytest.mark.parametrize("shape", [(33, 70, 50), (64, 96, 160)], ids=lambda s: "x".join(map(str, s)))
def test_every_tiling_matches_numpy(rt, shape, trans_b):
    M, N, K = shape
    spec = plain_spec(M, N, K, trans_b)
    rt.compile(render([gemm_source(f"g_{t.name}", spec, t) for t in TILINGS], rt.dialect))
    rng = np.random.default_rng(1)
    A = rng.standard_normal((M, K), dtype=np.float32)
    B = rng.standard_normal((N, K) if trans_b else (K, N), dtype=np.float32)
    ref = A.astype(np.float64) @ (B.T if trans_b else B).astype(np.float64)
    sizes = [A.nbytes, B.nbytes, M * N * 4]
    bufs = [rt.alloc(n) for n in sizes]
    rt.write(bufs[0], 0, A)
    rt.write(bufs[1], 0, B)
    args = [rt.view(b, 0, n) for b, n in zip(bufs, sizes)]
    for t in TILINGS:
        rt.write(bufs[2], 0, np.full(M * N, np.nan, np.float32))  # every element must be written
        rt.launch(rt.kernel(f"g_{t.name}"), -(-M // t.bm) * -(-N // t.bn), t.threads, args)
        out = np.empty((M, N), np.float32)
        rt.read(bufs[2], 0, out)
        rt.finish()
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4, err_msg=t.name)


# Measured on an H100 (2026-11-22, scripts/gemm_tilings.py): the fastest tiling in TILINGS per shape.
H100_FASTEST = {
    (128, 768, 768): "32x32x64_2x2",      # BERT-base Q/K/V/O at b1 s128
    (128, 3072, 768): "64x64x32_4x4",     # FFN up
    (128, 768, 3072): "32x32x64_2x2",     # FFN down: 96 tiles over a long k
    (3136, 64, 576): "32x64x32_2x4",      # a ResNet-50 3x3 conv as implicit GEMM
    (128, 50257, 768): "64x64x32_4x4",    # GPT-2's LM head
    (1024, 1024, 1024): "64x64x32_4x4",
}


@pytest.mark.parametrize("shape", list(H100_FASTEST), ids=lambda s: "x".join(map(str, s)))
def test_tiling_choice_follows_h100_measurements(shape):
    assert choose_tiling(1, *shape, load_device("h100")).name == H100_FASTEST[shape]


def test_smem_and_threads_fit_every_device():
    """Every tiling's shared tile (with its padding) fits a block on every built-in device."""
    for name in ("h100", "a100", "v100", "rtx2080ti", "pocl-cpu"):
        dev = load_device(name)
        for t in TILINGS:
            assert 4 * t.smem_floats <= dev.shared_mem_per_block and t.threads <= dev.max_threads_per_block, (name, t)
