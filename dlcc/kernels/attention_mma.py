"""The fused-attention template (flash attention) on tensor cores: the rOperator of
kernels/attention.py with its two products, S = Q.K^T and O += P.V, done by warp-wide mma.sync
instructions (kernels/gemm_mma.py: m16n8k8 TF32, m16n8k16 fp16 or bf16; float32 accumulation).

The contract is attention.py's unchanged: the same AttentionSpec (load_q, load_k, load_v, score,
store, params, prologue), the same task decomposition (one rTask = one batch index and BQ = 16
query rows, attention_tasks(spec) of them, ATTN_THREADS = 256 threads = 8 warps), the same text
shape (`NAME_task(params..., task, tid, smem)` plus a thin KERNEL), so the compiler can hand one
spec to either template. Softmax and accumulation are float32 at every precision; only the
products' operands are rounded to the precision's type (TO_TF32, TO_F16, TO_BF16), once, as Q, K,
V and the probabilities P are stored to shared memory as floats (K and V: as their fragments are
read, see the pipeline below).

Per key block of BK keys (five barriers), K's block already in its shared tile:
  1. every thread issues the global loads of its share of the V block into registers (at_vr),
     and nothing else: they are in flight through the score step (BARRIER);
  2. scores on tensor cores: the 16 x BK score tile is BK/8 mma n-tiles of 8 keys. With BK = 64
     warp w computes n-tile w over the whole of D; with BK = 32 (16) the 4 (2) n-tiles are split
     further along D over 2 (4) warps each ("ksplit"), each writing a partial tile of its own,
     so all 8 warps issue the same number of mmas. A fragments come from the Q tile, B fragments
     from the K tile, in gemm_mma.py's layouts; D is padded with zeros up to a whole number of
     mma k steps per warp. The accumulators (C layout: c0 (g, 2t) c1 (g, 2t+1) c2 (g+8, 2t)
     c3 (g+8, 2t+1)) go to the shared score tile(s) (BARRIER);
  3. K is dead once the scores are out: the V registers are stored to the same shared memory
     (sharing it is what lets BK = 64 fit beside OpenCL's emulation scratch at D = Dv = 64), and
     the softmax runs as in the SIMT template: a row is 16 consecutive threads, each summing the
     partial tiles at its BK/16 keys, applying `score` (inside M x N only; -inf outside), and
     publishing its partial maximum (BARRIER); each takes its row's maximum and the rescale
     factor alpha = exp(m_old - m_new), issues the global loads of its share of the next K
     block into registers (at_kr; not after the last block), and writes its probabilities
     p = exp(s - m_new), rounded to the operand type, over its scores (thread 0 of the row
     writes alpha) (BARRIER);
  4. P.V on tensor cores: warp w owns the output's 8-column mma tiles w, w + 8, ... (Dv <= 64:
     one; Dv <= 128: two); its accumulators persist in registers across key blocks, are rescaled
     by their rows' alpha (rows g and g+8), then take P (16 x BK, A fragments) . V (BK x 8, B
     fragments) over BK (BARRIER: V and P are dead). A warp whose tile w + 8 i is past the last
     (Dv <= 56, or 64 < Dv <= 120) repeats the last tile's mmas and stores nothing: on OpenCL
     the emulated mma holds barriers, which every warp must reach equally often. The K
     registers go to the shared tile for the next block.
Before the first block, K's first block is loaded the same way (its loads in flight while Q is
loaded straight into shared memory). After the last block each thread's share of its row's
running sum goes through shared memory (BARRIER), and every accumulator inside M x Dv is divided
by its row's sum and stored through `store(m, e, value)`.

The pipeline (register staging, as gemm_mma.py's template overlaps its next k step: OpenCL has
no cp.async). Each global load of K and V is issued before a stretch of tensor-core work and
first used after it: V's block across the score step (the barriers before and after it and the
score mmas), the next K block across the probabilities, P.V and its barriers. One block is in
registers at a time (V's from the top of the key block to its store after the scores, K's from
the row maxima to its store after P.V), so ptxas gives both the same registers: a thread stages
BK x Dp / 256 or BK x Dvp / 256 floats, 16 at D = Dv = 64 (BK = 64) and at D = Dv = 128 (BK =
32), and the kernel takes 56 to 64 registers at sm_90 there (48 to 72 over the tests' shapes,
mma_attention_registers) where loading straight to shared memory took 33 to 44: 4 rTasks an SM
by registers instead of 6. Staging both blocks a whole key block ahead (K's next at the top of
the block, V's next right after V's store) would hide each load behind a whole block, but keeps
both live: 78 to 96 registers at sm_90 at D = Dv = 64 and 128, 2 or 3 rTasks an SM.
For the loads to stay in flight, nothing may use a loaded value before its store to shared
memory, which a barrier orders after the mmas; ptxas (CUDA 13) schedules any arithmetic on a
loaded value early, into the mma section before that barrier, where the warp then waits for the
load: the rounding to the operand type done at the store, the select that zeroes keys past N,
and, with guarded loads, a 16-bit storage's conversion (to free the predicate registers the
guards hold). So the loads are made at their indices clamped into the tensor (no predicate; all
in bounds), the registers are stored as loaded, and the rounding and the zeros are applied as
each warp reads its B fragments (a block's K and V elements are read once each, by one warp,
but for a repeated last output tile: no more rounding than at the store). In the SASS (sm_90,
D = Dv = 64 and 128), the first use of each of a key block's loads (2 x 16 a thread) is then
its shared store after the two barriers and all the mmas between, at float32 and bfloat16
storage, N a multiple of BK or not; at float16 storage ptxas still converts about a third of
them (HADD2.F32) among the mmas. What the clamping puts outside
the problem: K's padding columns d >= D hold K's last column and are read as zeros (they meet
Q's zero padding, and 0 x inf would be NaN); keys past N hold key N - 1 again, their scores are
-inf (the bounds check, before anything reads them) and their V rows are read as zeros (they
meet p = 0); V's padding columns e >= Dv only reach output columns that are never stored.

Kept from the SIMT template (attention.py's notes say why): constant trip counts in every loop
around a barrier (PoCL 3.1; the store of the next K block is under `kb + 1 < key blocks`,
which holds no barrier; its loads are not: in the last block they all read key N - 1 again, in
bounds and never stored, where under the condition ptxas finished their 16-bit conversions
inside the branch, before the mmas, and took 71 to 88 registers), -inf-safe online softmax
(exponents against 0 while the running maximum is -inf; a row without a finite score ends
0/0 = NaN like Softmax; NaN scores propagate), query rows past M loading zeros and never
stored, keys past N -inf as scores, every load in bounds, locals prefixed `at_` (and `mma_`:
the lane, warp and scratch names the mma macros expect in scope, backends/prelude_opencl.h).
Each callback's statements sit in a scope of their own.

Choices of this template:
  - The running sum adds the probabilities as rounded for the mma, so the weights that multiply V
    sum to the divisor exactly (up to float32): the output is a convex combination of V's rows at
    every precision (all-ones V gives ones), with no bias from P's rounding.
  - The softmax runs on the shared score tile, not in the mma's registers as FlashAttention-2
    does: with 16 query rows an rTask, a row's keys are spread over all 8 warps (and the dialect
    has no warp shuffles), so its maximum needs shared memory either way.
  - Shared memory (floats): Q [16][Dp + 4], one K/V block [BK][max(Dp + 4, VS)], ksplit score
    tiles [16][BK + 4] (P over the first), 256 floats for the row maxima and sums, 16 for alpha,
    then WARPS x MMA_EMU_FLOATS(_K16) of OpenCL's emulation scratch (0 on CUDA; counted as
    gemm_mma.py counts it, so the plan's figure is the OpenCL one). Rows read k-contiguous as A
    or B fragments (Q, K, P) have strides = 4 mod 8: lanes g * stride + t fall in 32 distinct
    banks; V, read as [k][n], has a stride VS = 8 mod 16 (Dv padded to 8, + 8 where that is a
    multiple of 16): t * VS + g likewise. Dp is D padded to ksplit mma k steps, Dv to 8.
  - BK is the widest of 64, 32, 16 whose layout fits SMEM_LIMIT_FLOATS with the emulation
    scratch: 64 for D, Dv <= 64 at every precision (D = Dv = 64: 39.6 KiB at fp16/bf16, 33.6 at
    tf32, 27.6 of either on CUDA), 32 for D = Dv = 128 (42.8 KiB at fp16/bf16, 30.8 on CUDA).
    Separate K and V tiles would have forced BK = 32 at D = 64 (half the warps idle in the score
    step, or D split) and eight barriers per 64 keys instead of five; with one tile, V's block
    cannot be stored before the scores are out, and the registers carry it across them.
  - A thread's share of a staged block is walked as _walk says, its addresses one base plus
    constants, and the copy loops unroll in full (the registers are an array indexed by
    constants).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable
from types import SimpleNamespace

from .attention import (ATTN_THREADS, BQ, SMEM_LIMIT_FLOATS, AttentionShape, AttentionSpec, _indent, _load_tile,
                        attention_cost, attention_smem_floats, attention_source, attention_tasks, online_max_step)
from .gemm_mma import MMA_KINDS, MMA_PER_CYCLE, MMAS_PER_PRODUCT, WARPS, _fragment_k, _fragment_rows

_LANES = ATTN_THREADS // BQ  # softmax threads per query row
#: Key block widths to try, widest first (BK / 8 score n-tiles: 8, 4 or 2, over 8 warps).
_BKS = (64, 32, 16)


@dataclass(frozen=True)
class MmaAttentionTiling:
    """The layout of one rTask at one precision (strides and offsets in floats)."""

    D: int
    Dv: int
    bk: int
    precision: str

    def __post_init__(self):
        if self.precision not in MMA_KINDS:
            raise ValueError(f"tensor-core attention computes at {', '.join(MMA_KINDS)}, not {self.precision!r}")
        assert self.bk in _BKS

    @property
    def kstep(self) -> int:
        """k of one mma: 8 (TF32) or 16 (fp16, bf16)."""
        return MMA_KINDS[self.precision][0]

    @property
    def key_tiles(self) -> int:
        """8-key mma n-tiles of the score tile."""
        return self.bk // 8

    @property
    def ksplit(self) -> int:
        """Warps that share one score n-tile, each over its own part of D."""
        return WARPS // self.key_tiles

    @property
    def d_pad(self) -> int:
        """D padded with zeros to ksplit whole mma k steps."""
        step = self.kstep * self.ksplit
        return -(-self.D // step) * step

    @property
    def d_steps(self) -> int:
        """mma k steps of one warp's part of D in the score step."""
        return self.d_pad // self.kstep // self.ksplit

    @property
    def col_tiles(self) -> int:
        """8-column mma n-tiles of the output."""
        return -(-self.Dv // 8)

    @property
    def ni(self) -> int:
        """Output column tiles per warp (tile w + 8 i of warp w)."""
        return -(-self.col_tiles // WARPS)

    @property
    def dv_pad(self) -> int:
        return 8 * self.col_tiles

    @property
    def q_stride(self) -> int:
        return self.d_pad + 4

    @property
    def k_stride(self) -> int:
        return self.d_pad + 4

    @property
    def v_stride(self) -> int:
        return self.dv_pad + 8 if self.dv_pad % 16 == 0 else self.dv_pad

    @property
    def s_stride(self) -> int:
        return self.bk + 4

    @property
    def q_off(self) -> int:
        return 0

    @property
    def kv_off(self) -> int:
        return self.q_off + BQ * self.q_stride

    @property
    def s_off(self) -> int:
        return self.kv_off + self.bk * max(self.k_stride, self.v_stride)

    @property
    def red_off(self) -> int:
        return self.s_off + self.ksplit * BQ * self.s_stride

    @property
    def alpha_off(self) -> int:
        return self.red_off + ATTN_THREADS

    @property
    def staged_floats(self) -> int:
        """Floats a thread stages of a K or a V block, whichever is more (_walk): one is in
        registers at a time."""
        return max(_StagedTile.count(self.bk, self.d_pad), _StagedTile.count(self.bk, self.dv_pad))

    @property
    def tile_floats(self) -> int:
        """Shared floats on CUDA (no emulation scratch)."""
        return self.alpha_off + BQ

    @property
    def emu_floats(self) -> int:
        """OpenCL's mma emulation scratch, all warps."""
        return WARPS * MMA_KINDS[self.precision][3]

    @property
    def smem_floats(self) -> int:
        """The KERNEL's shared array with OpenCL's emulation scratch (the plan's figure)."""
        return self.tile_floats + self.emu_floats


def mma_attention_tiling(spec: AttentionSpec | AttentionShape, precision: str) -> MmaAttentionTiling:
    """The widest key block whose layout fits SMEM_LIMIT_FLOATS (emulation scratch included);
    ValueError where none does, or for sizes below 1 or an unknown precision."""
    if min(spec.batch, spec.M, spec.N, spec.D, spec.Dv) < 1:
        raise ValueError(f"attention needs positive sizes, got batch={spec.batch} M={spec.M} N={spec.N} "
                         f"D={spec.D} Dv={spec.Dv}")
    for bk in _BKS:
        t = MmaAttentionTiling(spec.D, spec.Dv, bk, precision)
        if t.smem_floats <= SMEM_LIMIT_FLOATS:
            return t
    raise ValueError(f"tensor-core attention ({precision}) with D={spec.D}, Dv={spec.Dv} does not fit "
                     f"{4 * SMEM_LIMIT_FLOATS} bytes of shared memory at any key block width")


def mma_attention_tasks(spec: AttentionSpec | AttentionShape) -> int:
    """rTasks (blocks): one per batch index and block of BQ query rows, as attention_tasks."""
    return attention_tasks(spec)


def mma_attention_smem_floats(spec: AttentionSpec | AttentionShape, precision: str) -> int:
    """Shared memory of one rTask in floats, OpenCL's emulation scratch included (on CUDA the
    KERNEL's array is that much smaller: the scratch macros are 0 there)."""
    return mma_attention_tiling(spec, precision).smem_floats


def _fragments(t: MmaAttentionTiling) -> tuple[list[str], list[int], list[str]]:
    """(k offsets of A's elements, their row offsets 0 or 8, k offsets of B's elements), as
    gemm_mma.py's template reads them (lane: mma_g = lane / 4, mma_t = lane % 4)."""
    shim = SimpleNamespace(kstep=t.kstep)
    ks, rows = _fragment_k(shim), _fragment_rows(shim)
    return ks, rows, [k for k, r in zip(ks, rows) if r == 0]


def _walk(rows: int, cols: int) -> tuple[int, int, int]:
    """(W, RP, CP): how a thread's share of a rows x cols tile (cols contiguous; rows a power of
    two) is staged. W (a power of two, at least 256 / rows) consecutive threads share a row, at
    columns tid % W + W h for h < CP = ceil(cols / W); a pass covers 256 / W rows, tid / W +
    (256 / W) r for r < RP = rows W / 256. A thread's rows and columns are its own (tid / W,
    tid % W) plus constants, so its global and shared addresses are one base each plus
    immediates. (Walked as attention.py's _load_tile walks, element tid + 256 r at its quotient
    and remainder by cols, unrolled in full, every element had addresses of its own that ptxas
    kept live across the key loop: 95 to 168 registers at sm_90 with both blocks staged.) W is
    the widest of those that give the fewest elements a thread."""
    best = None
    for W in (256, 128, 64, 32, 16, 8, 4):
        if ATTN_THREADS // W > rows:
            break
        per = -(-cols // W) * (rows * W // ATTN_THREADS)
        if best is None or per < best[0]:
            best = (per, W)
    W = best[1]
    return W, rows * W // ATTN_THREADS, -(-cols // W)


@dataclass(frozen=True)
class _StagedTile:
    """One operand's block (K or V) staged through registers: `stage` issues a thread's share of
    its global loads (_walk) into the register array `reg`, `commit` copies that, as loaded, to
    the shared tile. The tile's rows are keys, its columns features; the loader's two indices
    are `names`, the key first or second (`key`), their extents `limits`. Each element is loaded
    at its indices clamped into the tensor (the key past N, a feature past D or Dv in the tile's
    padding), so the loads are in bounds and take no predicate; the template zeroes what lies
    outside as the warps read their fragments (mma_attention_source)."""

    reg: str
    rows: int
    cols: int
    names: tuple[str, str]
    key: int  # which of `names` is the key index (0 or 1)
    limits: tuple[int, int]
    load: Callable[[str, str], tuple[list[str], str]]
    smem_at: Callable[[str, str], str]

    @staticmethod
    def count(rows: int, cols: int) -> int:
        """Floats a thread stages of a rows x cols block."""
        _, RP, CP = _walk(rows, cols)
        return RP * CP

    @property
    def per_thread(self) -> int:
        return self.count(self.rows, self.cols)

    def _loop(self, body: list[str]) -> list[str]:
        W, RP, CP = _walk(self.rows, self.cols)
        return ["#pragma unroll", f"for (int at_r = 0; at_r < {RP}; ++at_r) {{",
                "    #pragma unroll", f"    for (int at_h = 0; at_h < {CP}; ++at_h) {{",
                f"        const int at_row = tid / {W} + at_r * {ATTN_THREADS // W}, at_col = tid % {W} + at_h * {W};",
                f"        const int at_u = at_r * {CP} + at_h;",
                *_indent(body, 8), "    }", "}"]

    def stage(self, n0: str, beyond: bool = False) -> list[str]:
        """The global loads of the block from key `n0` into `reg`, and nothing else. A key is
        clamped where the last block is partial or `beyond` (the block may be the one after the
        last, staged but never committed), a feature where the walk is wider than the tensor."""
        W, _, CP = _walk(self.rows, self.cols)
        idx = []
        for i, (name, lim) in enumerate(zip(self.names, self.limits)):
            e, past = (f"{n0} + at_row", beyond or lim % self.rows != 0) if i == self.key else ("at_col", CP * W > lim)
            idx.append(f"{name} = ({e} < {lim - 1} ? {e} : {lim - 1})" if past else f"{name} = {e}")
        stmts, val = self.load(*self.names)
        return self._loop([f"const int {', '.join(idx)};  /* in the tensor */",
                           "{", *_indent(stmts, 4), f"    {self.reg}[at_u] = {val};", "}"])

    def commit(self) -> list[str]:
        """`reg` into the shared tile, as loaded (nothing past the tile's columns)."""
        W, _, CP = _walk(self.rows, self.cols)
        store = f"{self.smem_at('at_row', 'at_col')} = {self.reg}[at_u];"
        return self._loop([f"if (at_col < {self.cols}) {store}" if CP * W > self.cols else store])


def mma_attention_source(name: str, spec: AttentionSpec, precision: str) -> str:
    """The rOperator text: `{name}_task` and its KERNEL `{name}` (ATTN_THREADS threads, one block
    per rTask: mma_attention_tasks(spec) blocks; mma_attention_smem_floats(spec, precision) floats
    of shared memory on OpenCL, the tiling's tile_floats on CUDA). The module docstring walks
    through one key block."""
    t = mma_attention_tiling(spec, precision)
    M, N, D, Dv, bk = spec.M, spec.N, spec.D, spec.Dv, t.bk
    kstep, rnd, mma, _, emu_macro = MMA_KINDS[precision]
    tiles_m = -(-M // BQ)
    key_blocks = -(-N // bk)
    sc = bk // _LANES  # scores per softmax thread
    QS, KS, VS, SS = t.q_stride, t.k_stride, t.v_stride, t.s_stride
    Dp, Dvp, NI, CT = t.d_pad, t.dv_pad, t.ni, t.col_tiles
    arg_names = [p.split()[-1].lstrip("*") for p in spec.params]
    neg_inf = "(-DLCC_INF)"
    ks, rows, b_ks = _fragments(t)
    FA, FB = len(ks), len(b_ks)

    def both(a: str, b: str) -> str:
        return f"{a} && {b}"

    load_q = _load_tile(BQ, Dp, lambda r, c: f"at_qs[{r} * {QS} + {c}]",
                        lambda m, d: both(f"{m} < {M}", f"{d} < {D}") if Dp > D else f"{m} < {M}",
                        spec.load_q, ("at_m", "at_d"), lambda r, c: (f"at_m0 + {r}", c), rnd)
    # K as key rows [n][d] (d contiguous, as a [N, D] tensor is walked): the B operand k-contiguous;
    # V as [n][e]. Both staged through registers (the module docstring's pipeline), unrounded.
    k_tile = _StagedTile("at_kr", bk, Dp, ("at_d", "at_n"), 1, (D, N), spec.load_k,
                         lambda r, c: f"at_ks[{r} * {KS} + {c}]")
    v_tile = _StagedTile("at_vr", bk, Dvp, ("at_n", "at_e"), 0, (N, Dv), spec.load_v,
                         lambda r, c: f"at_vs[{r} * {VS} + {c}]")
    score_stmts, score_val = spec.score("at_qm", "at_n", "at_dot")
    store = spec.store("at_om", "at_e", "at_o[at_ni][at_c] / at_lr")

    # score step: A = Q (rows g, g+8 of the 16), B = K^T (key at_sn + g), k from the warp's part of D
    qa = [f"at_qs[(mma_g + {rows[e]}) * {QS} + at_kk + {ks[e]}]" for e in range(FA)]
    kb_ = [f"{rnd}(at_ks[(at_sn + mma_g) * {KS} + at_kk + {b_ks[e]}])" for e in range(FB)]
    if Dp > D:  # K's padding columns hold K's last column (the staged loads are clamped): zeros
        kb_ = [f"(at_kk + {b_ks[e]} < {D} ? {kb_[e]} : 0.0f)" for e in range(FB)]
    # P.V: A = P (rows g, g+8; k = key), B = V (k = key, n = column at_vc + g)
    pa = [f"at_ss[(mma_g + {rows[e]}) * {SS} + at_kk + {ks[e]}]" for e in range(FA)]
    vb = [f"{rnd}(at_vs[(at_kk + {b_ks[e]}) * {VS} + at_vc + mma_g])" for e in range(FB)]
    if N % bk:  # the last block's keys past N hold key N - 1 again: zeros (they meet p = 0; inf V would give NaN)
        vb = [f"(at_n0 + at_kk + {b_ks[e]} < {N} ? {vb[e]} : 0.0f)" for e in range(FB)]
    dot = " + ".join(f"at_ss[{p * BQ * SS} + at_i * {SS} + at_j]" for p in range(t.ksplit))

    dev = [
        f"DEVICE void {name}_task({', '.join(spec.params)}, const int task, const int tid, LPTR float* smem) {{",
        f"    LPTR float* at_qs = smem + {t.q_off};  /* Q block [BQ][{Dp}], rows of {QS}, rounded by {rnd} */",
        f"    LPTR float* at_ks = smem + {t.kv_off};  /* K block [BK][{Dp}], rows of {KS} ... */",
        f"    LPTR float* at_vs = smem + {t.kv_off};  /* ... then V block [BK][{Dvp}] in its place, rows of {VS} */",
        f"    LPTR float* at_ss = smem + {t.s_off};  /* {t.ksplit} score tile(s) [BQ][BK], rows {SS}; P in the 1st */",
        f"    LPTR float* at_red = smem + {t.red_off};  /* one float per thread: partial max, then sum */",
        f"    LPTR float* at_alpha = smem + {t.alpha_off};  /* each row's rescale factor */",
        "    const int mma_lane = tid % 32, mma_warp = tid / 32;",
        f"    LPTR float* mma_scr = smem + {t.tile_floats} + mma_warp * {emu_macro};  /* OpenCL's emulation */",
        "    (void)mma_scr;",
        "    const int mma_g = mma_lane / 4, mma_t = mma_lane % 4;",
        f"    const int bt = task / {tiles_m};",
        f"    const int at_m0 = (task % {tiles_m}) * {BQ};",
        f"    const int at_i = tid / {_LANES}, at_t = tid % {_LANES};  /* softmax: query row, lane in the row */",
        "    const int at_qm = at_m0 + at_i;",
        f"    const int at_sn = (mma_warp % {t.key_tiles}) * 8;  /* score step: the warp's 8 keys of the block */",
        f"    const int at_sk = (mma_warp / {t.key_tiles}) * {t.d_steps * kstep};  /* ... and its part of D */",
        f"    LPTR float* at_sw = at_ss + (mma_warp / {t.key_tiles}) * {BQ * SS};  /* ... and its score tile */",
        *_indent(spec.prologue or [], 4),
        f"    float at_kr[{k_tile.per_thread}], at_vr[{v_tile.per_thread}];  /* a thread's share of a K, V block */",
        "    /* K(0)'s loads in flight while Q goes to shared memory */",
        *_indent(k_tile.stage("0"), 4),
        *_indent(load_q, 4),
        *_indent(k_tile.commit(), 4),
        f"    float at_o[{NI}][4];  /* output tiles mma_warp + 8 ni, C layout */",
        "    #pragma unroll",
        f"    for (int at_ni = 0; at_ni < {NI}; ++at_ni) {{",
        "        #pragma unroll",
        "        for (int at_c = 0; at_c < 4; ++at_c) at_o[at_ni][at_c] = 0.0f;",
        "    }",
        f"    float at_mi = {neg_inf};  /* the row's running maximum (the same in all its threads) */",
        "    float at_l = 0.0f;  /* this thread's share of the row's running sum */",
        f"    for (int at_kb = 0; at_kb < {key_blocks}; ++at_kb) {{",
        f"        const int at_n0 = at_kb * {bk};",
        "        /* V(kb)'s loads in flight across the score mmas */",
        *_indent(v_tile.stage("at_n0"), 8),
        "        BARRIER();",
        "        {",
        "            float at_c0 = 0.0f, at_c1 = 0.0f, at_c2 = 0.0f, at_c3 = 0.0f;",
        "            MMA_UNROLL",
        f"            for (int at_st = 0; at_st < {t.d_steps}; ++at_st) {{",
        f"                const int at_kk = at_sk + at_st * {kstep};",
        *[f"                const float at_a{e} = {qa[e]};" for e in range(FA)],
        *[f"                const float at_b{e} = {kb_[e]};" for e in range(FB)],
        f"                {mma}(at_c0, at_c1, at_c2, at_c3, "
        + ", ".join([f"at_a{e}" for e in range(FA)] + [f"at_b{e}" for e in range(FB)]) + ");",
        "            }",
        f"            at_sw[mma_g * {SS} + at_sn + 2 * mma_t] = at_c0;",
        f"            at_sw[mma_g * {SS} + at_sn + 2 * mma_t + 1] = at_c1;",
        f"            at_sw[(mma_g + 8) * {SS} + at_sn + 2 * mma_t] = at_c2;",
        f"            at_sw[(mma_g + 8) * {SS} + at_sn + 2 * mma_t + 1] = at_c3;",
        "        }",
        "        BARRIER();",
        "        /* K is dead: V(kb) takes its place */",
        *_indent(v_tile.commit(), 8),
        f"        float at_s[{sc}];",
        f"        float at_mloc = {neg_inf};",
        "        #pragma unroll",
        f"        for (int at_c = 0; at_c < {sc}; ++at_c) {{",
        f"            const int at_j = at_t + at_c * {_LANES};",
        "            const int at_n = at_n0 + at_j;",
        f"            const float at_dot = {dot};",
        f"            float at_v = {neg_inf};",
        f"            if (at_qm < {M} && at_n < {N}) {{",
        *_indent(score_stmts, 16),
        f"                at_v = {score_val};",
        "            }",
        "            at_s[at_c] = at_v;",
        "            at_mloc = F_MAX(at_mloc, at_v);",
        "        }",
        *_indent(online_max_step("at_alpha_r"), 8),
        *(["        /* K(kb + 1)'s loads in flight across the probabilities and the P.V mmas */",
           *_indent(k_tile.stage(f"at_n0 + {bk}", beyond=True), 8)] if key_blocks > 1 else []),
        "        #pragma unroll",
        f"        for (int at_c = 0; at_c < {sc}; ++at_c) {{",
        f"            const float at_p = {rnd}(F_EXP(at_s[at_c] - at_ms));  /* as the mma will take it */",
        "            at_l += at_p;",
        f"            at_ss[at_i * {SS} + at_t + at_c * {_LANES}] = at_p;",
        "        }",
        "        if (at_t == 0) at_alpha[at_i] = at_alpha_r;",
        "        BARRIER();",
        "        {",
        "            const float at_a_lo = at_alpha[mma_g], at_a_hi = at_alpha[mma_g + 8];",
        "            #pragma unroll",
        f"            for (int at_ni = 0; at_ni < {NI}; ++at_ni) {{",
        "                at_o[at_ni][0] *= at_a_lo;",
        "                at_o[at_ni][1] *= at_a_lo;",
        "                at_o[at_ni][2] *= at_a_hi;",
        "                at_o[at_ni][3] *= at_a_hi;",
        "            }",
        "            MMA_UNROLL",
        f"            for (int at_kk = 0; at_kk < {bk}; at_kk += {kstep}) {{",
        *[f"                const float at_a{e} = {pa[e]};" for e in range(FA)],
        "                MMA_UNROLL",
        f"                for (int at_ni = 0; at_ni < {NI}; ++at_ni) {{",
        "                    /* a warp past the last column tile repeats it (its results are not stored) */",
        f"                    const int at_ct = mma_warp + {WARPS} * at_ni;",
        f"                    const int at_vc = (at_ct < {CT} ? at_ct : {CT - 1}) * 8;",
        *[f"                    const float at_b{e} = {vb[e]};" for e in range(FB)],
        f"                    {mma}(at_o[at_ni][0], at_o[at_ni][1], at_o[at_ni][2], at_o[at_ni][3], "
        + ", ".join([f"at_a{e}" for e in range(FA)] + [f"at_b{e}" for e in range(FB)]) + ");",
        "                }",
        "            }",
        "        }",
        "        BARRIER();",
        *(["        /* V and P are dead: K(kb + 1) takes the tile (the last block has none) */",
           f"        if (at_kb + 1 < {key_blocks}) {{", *_indent(k_tile.commit(), 12), "        }"]
          if key_blocks > 1 else []),
        "    }",
        "    at_red[tid] = at_l;",
        "    BARRIER();",
        "    float at_l_lo = 0.0f, at_l_hi = 0.0f;",
        "    #pragma unroll",
        f"    for (int at_u = 0; at_u < {_LANES}; ++at_u) {{",
        f"        at_l_lo += at_red[mma_g * {_LANES} + at_u];",
        f"        at_l_hi += at_red[(mma_g + 8) * {_LANES} + at_u];",
        "    }",
        "    #pragma unroll",
        f"    for (int at_ni = 0; at_ni < {NI}; ++at_ni) {{",
        "        #pragma unroll",
        "        for (int at_c = 0; at_c < 4; ++at_c) {",
        "            const int at_om = at_m0 + mma_g + (at_c / 2) * 8;",
        f"            const int at_e = (mma_warp + {WARPS} * at_ni) * 8 + 2 * mma_t + at_c % 2;",
        "            const float at_lr = at_c < 2 ? at_l_lo : at_l_hi;",
        f"            if (at_om < {M} && at_e < {Dv}) {{",
        *_indent(store, 16),
        "            }",
        "        }",
        "    }",
        "}",
        "",
        f"KERNEL void {name}({', '.join(spec.params)}) {{",
        f"    SHARED float smem[{t.tile_floats} + {WARPS} * {emu_macro}];",
        f"    {name}_task({', '.join(arg_names)}, BLOCK_ID, THREAD_ID, smem);",
        "}",
        "",
    ]
    return "\n".join(dev)


#: Cycles of one dependent mma.sync (its accumulator feeds the next): not calibrated on a GPU,
#: like gemm_mma.py's constants (about what m16n8k16 takes on an A100 or H100).
MMA_LATENCY = 32


def mma_attention_registers(t: MmaAttentionTiling) -> int:
    """Registers a thread, for occupancy: max(64, 28 + 10 ni + staged), with ni output tiles a
    warp and `staged` the floats a thread stages of a K or V block (staged_floats), fitted to
    ptxas at sm_90 (CUDA 13) over tests/test_attention_mma.py's NVCC_SHAPES at every precision,
    which holds ptxas to this figure: 48 to 64 with one output tile a warp (16 staged at
    D = Dv = 64), 63 to 64 with two (16 staged at D = Dv = 128), 72 at tf32 with D = Dv = 96 (24
    staged), 64 to 72 with three (Dv = 136). ptxas takes up to 64 where fewer would not raise
    the occupancy (4 rTasks of 256 threads an SM), hence the floor. Loading straight to shared
    memory (no staging), the same shapes took 33 to 48. tf32x3 holds each fragment's split parts
    too: 8 to 24 more (64 to 98 over the same shapes), hence its 24."""
    return max(64, 28 + 10 * t.ni + t.staged_floats + (24 if t.precision == "tf32x3" else 0))


#: Cycles a barrier adds to a warp's dependent chain when the block's warps reach it together
#: (not calibrated on a GPU, like MMA_LATENCY).
BARRIER_LATENCY = 20


def mma_attention_cost(batch: int, M: int, N: int, D: int, Dv: int, precision: str, device=None) -> float:
    """Modelled cycles of the tensor-core attention on a GPU `device`, in the units and form of
    attention.py's attention_cost (the SIMT GEMM model's issue rate and step latency, so
    DeviceSpec.gemm_cycle_us turns both into µs, and the two templates compare directly). rTasks
    are spread over the SMs; with B = ceil(rTasks / SMs) an SM's and steps = ceil(N / BK), the
    time is the larger of
      - throughput: B × steps × (mmas / MMA_PER_CYCLE + other / ISSUE_PER_CYCLE) where, per key
        block, mmas = 8 × (d_steps + ni × BK / k) (the score step's and P.V's, counting the
        repeats of warps without an output tile) and `other` counts warp instructions: the
        fragment reads from shared memory (A's k/2 and B's k/4 elements a lane per mma), the K
        and V tiles' global load, rounding and shared store (3 per element), the softmax (about
        12 per score: the partial tiles' reads, `score`, the maximum, two exponentials' share,
        rounding, sum, store) and 40 a thread of addressing, loop and barrier overhead; and
      - latency: ceil(B / occupancy) rounds × steps × the chain of one key block. Its loads are
        staged through registers (the module docstring's pipeline), each overlapping a stretch
        of work, so a load's latency counts only where it is longer than that stretch:
            max(L, 2 S + MMA_LATENCY × d_steps)        V's loads: the barriers around the score
                                                         step and its mma chain;
          + max(L, 2 S + MMA_LATENCY × ni × BK / k)    the next K block's loads: the barriers
                                                         around P.V and its mma chain;
          + S                                          the row maxima's barrier, between them,
        with L = STEP_LATENCY (a global load) and S = BARRIER_LATENCY. At D = Dv = 64 (and
        128) both stretches are shorter than a load, so a key block costs 2 L + S where loading
        straight to shared memory cost 2 L + MMA_LATENCY × (d_steps + ni × BK / k) (the loads,
        then the mma chains, one after the other): 620 cycles instead of 856 (fp16, bf16) or
        1112 (tf32), with 4 rTasks an SM by registers (mma_attention_registers) instead of 6;
    plus one STEP_LATENCY for the Q block and K's first (their loads overlap). Occupancy: the
    least of the block, thread, shared memory (CUDA's figure, tile_floats: no emulation scratch
    there) and register limits (mma_attention_registers a thread)."""
    from .gemm import ISSUE_PER_CYCLE, STEP_LATENCY

    shape = AttentionShape(batch, M, N, D, Dv)
    t = mma_attention_tiling(shape, precision)
    sms = getattr(device, "sms", 80)
    per_sm = -(-mma_attention_tasks(shape) // sms)
    steps = -(-N // t.bk)
    pv_steps = t.bk // t.kstep
    chain = (t.d_steps + t.ni * pv_steps) * MMAS_PER_PRODUCT.get(precision, 1)  # mmas of one warp per key block
    fa, fb = t.kstep // 2, t.kstep // 4  # A and B elements a lane reads per mma
    frag = WARPS * (t.d_steps * (fa + fb) + pv_steps * (fa + t.ni * fb))
    moves = 3 * t.bk * (t.d_pad + t.dv_pad) / 32
    softmax = 12 * BQ * t.bk / 32
    issue = WARPS * chain / MMA_PER_CYCLE + (frag + moves + softmax + 40 * WARPS) / ISSUE_PER_CYCLE
    occ = max(1, min(getattr(device, "max_blocks_per_sm", 32),
                     getattr(device, "max_threads_per_sm", 2048) // ATTN_THREADS,
                     getattr(device, "shared_mem_per_sm", 233472) // (4 * t.tile_floats),
                     getattr(device, "registers_per_sm", 65536) // (mma_attention_registers(t) * ATTN_THREADS)))
    block = (max(STEP_LATENCY, 2 * BARRIER_LATENCY + MMA_LATENCY * t.d_steps)
             + max(STEP_LATENCY, 2 * BARRIER_LATENCY + MMA_LATENCY * t.ni * pv_steps) + BARRIER_LATENCY)
    return max(per_sm * steps * issue, -(-per_sm // occ) * steps * block) + STEP_LATENCY


# -- either template, by the math the plan computes the attention at -------------------------------
#: The maths of the two templates: "float32" is attention.py's SIMT template, the others this
#: module's tensor-core one at that precision.
ATTENTION_MATHS = ("float32", *MMA_KINDS)


def fused_attention_source(name: str, spec: AttentionSpec, math: str) -> str:
    """The rOperator text of the template for `math` (ATTENTION_MATHS)."""
    return attention_source(name, spec) if math == "float32" else mma_attention_source(name, spec, math)


def fused_attention_smem_floats(shape: AttentionShape, math: str) -> int:
    """Shared memory of one rTask of the template for `math`, in floats (the OpenCL figure)."""
    return attention_smem_floats(shape) if math == "float32" else mma_attention_smem_floats(shape, math)


def fused_attention_cost(problem, device=None) -> float:
    """Modelled cycles of a fused attention launch's problem: [batch, M, N, D, Dv] (the SIMT
    template, as plans before the tensor-core one recorded it) or [batch, M, N, D, Dv, math]."""
    dims = [int(x) for x in problem[:5]]
    math = problem[5] if len(problem) > 5 else "float32"
    return attention_cost(*dims, device) if math == "float32" else mma_attention_cost(*dims, math, device)
