"""Hopper's warpgroup MMA (`wgmma.mma_async`, sm_90a) as a GEMM rOperator, fp16 and bf16: the rOperator
contract of kernels/gemm.py (one BMxBN output tile per rTask, GemmSpec's loads and store,
`NAME_task(args..., task, tid, smem)` plus a thin KERNEL), fed by the cp.async pipeline of
kernels/gemm_mma_async.py.

Why a second tensor-core rKernel: on an H100, `mma.sync` issues one 16x8x16 product per warp
instruction and needs its operands in registers (ldmatrix first); `wgmma` has a warpgroup (four
warps, 128 threads) multiply a 64xNx16 block straight out of shared memory, asynchronously, at
the rate the SM's tensor cores were built for. cuBLAS's and CUTLASS's Hopper kernels are wgmma
kernels; the mma.sync tilings measured 0.41-0.78x of cuBLAS's bf16 rate on an H200
(docs/gemm.md).

How (PTX ISA "Asynchronous Warpgroup Level Matrix Multiply-Accumulate", and the matrix
descriptor format):
  - A block is 256 threads (Rammer's vEU size), two warpgroups. A 128-row tile gives each
    warpgroup 64 rows of all BN columns; a 64-row tile gives each 64 rows of BN/2 columns. Every
    wgmma is then m64nNk16 with N = BN or BN/2.
  - Both operands sit in shared memory K-major (rows of m or n, 64 k values = 128 bytes each),
    in the 128-byte swizzle: 16-byte chunk c of row r at chunk c ^ (r % 8), eight rows to a 1 KiB
    atom. That is gemm_mma_async's `swizzle` for rows of eight chunks, so cp.async fills the
    buffers with the same code, and an operand that cannot be copied raw (an im2col window, a
    prologue, a float32 input, B stored [K, N]) is loaded element by element into the same
    layout. The buffers start on a 1 KiB boundary (the swizzle is a function of the address).
  - A descriptor names each operand: start address, stride byte offset 1024 (the next 8 rows),
    swizzle mode 128B. Each k16 step adds 32 bytes to the start; each warpgroup's 64-row (or
    N-column) share adds whole atoms.
  - Per k block: wait for its copies, `fence.proxy.async` (cp.async writes through the generic
    proxy, wgmma reads through the async one), barrier, refill the buffer no wgmma reads any more,
    then `wgmma.fence`, four wgmmas, `commit_group`, and `wait_group 1` (from three stages on:
    the previous block's wgmmas done, this block's left running under the next block's wait and
    barrier, as CUTLASS's sm90 cp.async mainloop does; the copies then run STAGES - 2 blocks
    ahead) or `wait_group 0` (two stages).
  - The accumulators are the `acc[i][j]` grid of kernels/gemm_mma.py with one 16-row mma tile per
    warp (wgmma's D fragment is mma.m16n8's, four warps stacked), so its store loop, split-K's
    reduction, AStitch's epilogues and the folded LayerNorm apply unchanged.

On OpenCL (PoCL) there is no wgmma: backends/prelude_opencl.h queues each one at issue and runs it
at the `wait_group` that covers it, the latest moment the hardware may read its operands. It reads
both operands through the descriptors as the hardware would (start address, stride byte offset,
128B swizzle on the address bits) and adds each thread's D fragment elements. A descriptor with
another swizzle mode, or a buffer off its 1 KiB atom, reads NaN. So the same tile code, swizzle,
descriptors and group accounting run in the default suite.

wgmma exists on sm_90 alone (not sm_80, not sm_100): these tilings are candidates where the device
spec's arch is sm_90 (`wgmma_fits`), and the cost model and `--tune` pick among them only where the
spec says they were measured faster (`gemm_wgmma`); scripts/gemm_tilings.py times them on any sm_90
GPU. nvcc builds a module holding them for sm_90a (backends/nvcc.py).
"""
from __future__ import annotations

from . import splitk as sk
from .gemm import _indent
from .gemm_mma_async import (CHUNK, HALF, THREADS, OperandTile, async_ok, operand_copies, pipeline_end, pipeline_fill,
                             pipeline_step, row_norm_stats)
from .gemm_mma import task_head, thin_kernel, zero_accumulators

#: k of one wgmma (fp16, bf16) and of a shared k block (one 128-byte swizzle row of 16-bit values).
K16, BK = 16, 64
#: Floats of shared memory kept free to move the buffers onto a 1 KiB boundary.
ALIGN_FLOATS = 256
#: wgmma widths the preludes define (m64nNk16 with N of these).
WIDTHS = (16, 32, 64, 128)


def uses_wgmma(source: str) -> bool:
    """Whether kernel text `source` calls the warpgroup MMA, not merely holds the prelude's macros
    (which every CUDA module defines): a wgmma rKernel commits its groups with `WGMMA_COMMIT();`."""
    return "WGMMA_COMMIT();" in source


def wg_split_m(t) -> bool:
    """Whether the two warpgroups split the tile's rows (BM = 128) rather than its columns (BM = 64)."""
    return t.bm == 128


def wg_n(t) -> int:
    """N of each warpgroup's wgmma."""
    return t.bn if wg_split_m(t) else t.bn // 2


def check_tiling(t) -> None:
    """The shapes the template is written for (MmaTiling.__post_init__ calls this for wgmma ones)."""
    assert t.precision in HALF and t.bk == BK and t.stages >= 2, t
    assert (t.bm, t.warps_m, t.warps_n) in ((128, 8, 1), (64, 4, 2)), t
    assert wg_n(t) in WIDTHS, t


def wgmma_fits(device) -> bool:
    """Whether `device` runs wgmma: an sm_90 GPU (Hopper; sm_100 has tcgen05 instead), whose
    shared memory per block holds the largest tiling."""
    return (getattr(device, "kind", "gpu") == "gpu" and getattr(device, "arch", None) == "sm_90"
            and getattr(device, "shared_mem_per_block", 0) >= max(t.cuda_smem_bytes for t in wgmma_tilings("bf16")))


def chooses_wgmma(device) -> bool:
    """Whether the cost model picks among the wgmma tilings on `device`: where they fit and the
    device spec says they were measured faster there (`gemm_wgmma`)."""
    return wgmma_fits(device) and bool(getattr(device, "gemm_wgmma", False))


def wgmma_tilings(precision: str) -> tuple:
    """The wgmma tilings at `precision` (fp16, bf16; none at the float precisions: tf32 wgmma would
    need both operands K-major as floats, which this template does not build)."""
    from .gemm_mma import MmaTiling

    if precision not in HALF:
        return ()
    return tuple(MmaTiling(bm, bn, BK, wm, wn, precision, stages, wgmma=True) for bm, bn, wm, wn, stages in TILINGS)


#: (BM, BN, warps_m, warps_n, stages). The 64-row tiles split the columns between the warpgroups,
#: so that a batch-1 GEMM (M = 128 at BERT's sequence length) has more than two row tiles' worth
#: of blocks; split-K (kernels/splitk.py) adds more. Up to 129 KiB of dynamic shared memory a
#: block (sm_90 holds 227 KiB); the last two fit 48 KiB of static shared memory, so Rammer may
#: run them as rTasks of a persistent kernel.
TILINGS = (
    (128, 128, 8, 1, 4),
    (128, 64, 8, 1, 4),
    (64, 128, 4, 2, 4),
    (64, 64, 4, 2, 6),
    (64, 32, 4, 2, 8),
    (64, 64, 4, 2, 2),
    (64, 32, 4, 2, 3),
)


def wgmmas_in_flight(t) -> int:
    """k blocks whose wgmmas stay in flight while the next block's are issued (CUTLASS's sm90
    cp.async mainloop keeps one): 1 from three stages on, at the price of one block fewer copied
    ahead; 0 with two stages, where that would leave no copy in flight."""
    return 1 if t.stages >= 3 else 0


def tile_floats(t) -> int:
    """Both operand tiles, every stage's (16-bit values, two to a float), and the alignment slack."""
    return t.stages * (t.bm + t.bn) * t.bk // 2 + ALIGN_FLOATS


def _descriptors(t, a: OperandTile, b: OperandTile) -> list[str]:
    """This warpgroup's descriptors of k block `kb`'s A and B buffers (wg_desc_t): the 14-bit start
    address in 16-byte units, stride byte offset 1024 (the next eight rows), swizzle 128B. (The
    leading byte offset is unused by K-major swizzled layouts; 1, as CUTLASS sets it.)"""
    a_row = "wg * 64" if wg_split_m(t) else "0"
    b_row = "0" if wg_split_m(t) else f"wg * {wg_n(t)}"
    row = CHUNK * a.per_row  # elements of a 128-byte row
    return [f"const wg_desc_t da = wg_desc | (wg_desc_t)((WG_SMEM_ADDR(As + (kb % {t.stages}) * {a.size} + ({a_row}) * {row}) & 0x3FFFFu) >> 4);",
            f"const wg_desc_t db = wg_desc | (wg_desc_t)((WG_SMEM_ADDR(Bs + (kb % {t.stages}) * {b.size} + ({b_row}) * {row}) & 0x3FFFFu) >> 4);"]


def wgmma_source(name: str, spec, t) -> str:
    """The rOperator text of wgmma tiling `t` for `spec`."""
    check_tiling(t)
    _, stype, _, store_macro = HALF[t.precision]
    kind = "BF16" if t.precision == "bf16" else "F16"
    N = wg_n(t)
    tiles_m, tiles_n = -(-spec.M // t.bm), -(-spec.N // t.bn)
    a, b = OperandTile("a", t, True), OperandTile("b", t, True)  # both K-major, whatever the tensors' layout
    assert a.per_row == 8 and b.per_row == 8  # one 128-byte swizzle row per m or n
    S, KB = t.stages, sk.steps_per_chunk(t, spec.K)
    k_first = "" if t.splitk == 1 else f"{sk.chunk_start(t, spec.K)} + "
    in_flight = wgmmas_in_flight(t)
    ahead = S - 1 - in_flight  # k blocks copied ahead: a buffer is refilled once no wgmma reads it

    a_raw = async_ok(spec.raw_a, t.precision, spec.M, spec.K) and spec.raw_a.k_contiguous
    b_raw = async_ok(spec.raw_b, t.precision, spec.N, spec.K) and spec.raw_b.k_contiguous
    issue, land, staging = operand_copies(t, spec, a, b, a_raw, b_raw, store_macro)
    stats, rn_decl = row_norm_stats(t, spec, a, stype, k_first)
    wm0 = "wg * 64 + (mma_warp % 4) * 16" if wg_split_m(t) else "(mma_warp % 4) * 16"
    wn0 = "0" if wg_split_m(t) else f"wg * {N}"
    mmas = [f"WGMMA_{kind}_N{N}(acc, da + {2 * s}, db + {2 * s});  /* k {K16 * s}..{K16 * s + 15}: +32 bytes a step */"
            for s in range(t.bk // K16)]
    src = [
        task_head(name, spec, t),
        "    /* the buffers on a 1 KiB boundary: the 128B swizzle is a function of the address */",
        f"    LPTR {stype}* As = (LPTR {stype}*)((LPTR char*)smem + ((1024u - (WG_SMEM_ADDR(smem) & 1023u)) & 1023u));",
        f"    LPTR {stype}* Bs = As + {S * a.size};  /* {S} stages of {t.bm}x{t.bk}, then of {t.bn}x{t.bk} */",
        "    const int mma_lane = tid % 32, mma_warp = tid / 32, wg = mma_warp / 4;",
        "    const int mma_g = mma_lane / 4, mma_t = mma_lane % 4;",
        "    const wg_desc_t wg_desc = ((wg_desc_t)1 << 62) | ((wg_desc_t)(1024 >> 4) << 32) | ((wg_desc_t)1 << 16);",
        "    CP_ASYNC_STATE",
        "    WGMMA_STATE",
        *_indent(sk.tile_decode(t, tiles_m, tiles_n), 4),
        f"    const int m0 = (tile / {tiles_n}) * {t.bm};",
        f"    const int n0 = (tile % {tiles_n}) * {t.bn};",
        f"    const int mma_wm0 = {wm0}, mma_wn0 = {wn0};  /* this warp's 16 rows of its warpgroup's 64 */",
        *_indent(spec.prologue or [], 4),
        *zero_accumulators(t.mi, t.ni),
        *_indent(staging, 4),
        *_indent(rn_decl, 4),
        *pipeline_fill(t, KB, k_first, issue, land, ahead),
        f"    for (int kb = 0; kb < {KB}; ++kb) {{",
        # (the barrier also follows every thread's wait for the wgmmas of block kb - 1 - in_flight,
        # the last to read the buffer refilled)
        *pipeline_step(t, KB, k_first, issue,
                       ["        WGMMA_PROXY_FENCE();  /* ... visible to the async proxy wgmma reads through */"], ahead),
        *_indent(stats, 8),
        *_indent(_descriptors(t, a, b), 8),
        f"        WGMMA_ARRIVE_N{N}(acc);",
        *_indent(mmas, 8),
        "        WGMMA_COMMIT();",
        f"        WGMMA_WAIT_N{N}({in_flight}, acc);  /* block kb - {in_flight}'s wgmmas have finished */",
        *pipeline_end(t, spec, KB, land, (f"    WGMMA_WAIT_N{N}(0, acc);",) if in_flight else ()),
        *thin_kernel(name, spec, str(tile_floats(t)), t),
    ]
    return "\n".join(src)


#: Cost-model constants: unfitted. wgmma is priced as the cp.async pipeline (kernels/gemm_mma.py
#: _async_cost) without its ldmatrix instructions, at WGMMA_RATE times mma.sync's product rate
#: (NVIDIA's figure for the H100's dense tensor cores through wgmma against mma.sync). The cost
#: model picks these tilings only on a spec with `gemm_wgmma` on, which waits for a GPU to time
#: them (scripts/gpu_session.sh 17; gemm_tilings.py --fit then fits them).
WGMMA_RATE = 2.0


def wgmma_cost(t, batch: int, M: int, N: int, K: int, device=None) -> float:
    """Modelled cycles in the form of gemm_mma._async_cost: the larger of an SM's issue time and
    its latency chain (rounds of co-resident blocks x k steps over the stages in flight)."""
    from .gemm import tasks_for
    from .gemm_mma import ASYNC_STEP_LATENCY, FILL_STEPS, MMA_PER_CYCLE, _occupancy, _split_read

    sms = getattr(device, "sms", 80)
    per_sm = -(-tasks_for(t, batch, M, N) // sms)
    steps = sk.steps_per_chunk(t, K)
    products = (t.bm // 16) * (t.bn // 8) * (t.bk // K16)  # m16n8k16 products a block computes a step
    copies = (t.bm + t.bn) * t.bk / CHUNK / 32
    issue = products / (MMA_PER_CYCLE * WGMMA_RATE) + (copies + 2 * (t.bk // K16) + 24 * THREADS // 32) / 2.0
    regs = 48 + wg_n(t) // 2
    rounds = -(-per_sm // _occupancy(t, regs, device))
    return (max(per_sm * steps * issue, rounds * (steps / (t.stages - 1) + FILL_STEPS) * ASYNC_STEP_LATENCY)
            + _split_read(t, per_sm))
