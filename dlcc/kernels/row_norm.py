"""A LayerNormalization (or an RMSNorm) computed inside the GEMM that reads it (`lower`'s `fold_layernorm`).

Why: in a pre-LN transformer (GPT-2, ViT, most decoders) every LayerNorm's output is read by one
GEMM only: ln_1 by the QKV projection, ln_2 by the FFN's up-projection, ln_f by the LM head. Run
apart, each LayerNorm is a launch of its own (GPT-2: 25 of its 86 at bf16) that writes a tensor
the next kernel reads straight back, and the GEMM then reads that tensor. Folded, the GEMM reads
the LayerNorm's input instead, and the normalisation moves into its epilogue:

    LN(x) · W = rstd ⊙ (x · W' - mean ⊗ c) + b'      where  W' = diag(γ) W,
                                                        c[n] = Σ_k W'[k, n],  b' = β · W

- W', c and b' are constants, made once at compile time (ops/fold_norm.py). c is summed from W'
  as the kernel reads it (rounded to the half type), so that `x · W' - mean ⊗ c` is exactly
  `(x - mean) · W'` apart from float32 rounding: the rounding of the weights does not grow with
  the rows' mean.
- mean and rstd are each row's statistics over K. The GEMM's rTask streams every element of its
  BM rows through shared memory anyway (the A tiles of its k loop), so its threads add them up
  there as each tile lands: T = THREADS / BM threads a row, each a fixed set of columns, no extra
  global reads. Sums are taken about a shift (the row's first element), which keeps the
  one-pass variance E[(x-s)^2] - E[x-s]^2 accurate where a row's mean is large against its
  spread. After the k loop the T partial sums of each row are added in a fixed order (results
  are the same on every run) into mean and rstd, in shared memory, and the store applies them
  to the accumulators before the op's store and any AStitch epilogue.
- Where A goes through registers on its way to shared memory (the SIMT template, at fp32),
  each staged element is stored as x - s, s its row's first element (loaded once per rTask,
  stage_shifts), and the epilogue subtracts mean - s instead of mean: then the product itself is
  taken about the shift, and `x · W' - mean ⊗ c` never cancels digits of a row with a large
  mean (a row of mean 1000 and spread 1 lost 3x the accuracy of the separate LayerNorm without
  it). At fp16/bf16 x is already rounded to 8 or 11 bits about zero where it is stored, so the
  cancellation costs nothing the separate LayerNorm kept, and cp.async copies x unchanged.
- Split along K (kernels/splitk.py), each chunk's rTask sums its own columns about the same
  shift, and the two sums per thread travel with the partial accumulators through the
  workspace; the tile's last rTask adds them up in k order, as it does the accumulators.
- Where A is k-contiguous, and in the templates that implement it: the cp.async tensor-core
  pipeline (fp16, bf16) and the SIMT one (fp32).

Accuracy: at fp16/bf16 x is already stored in the half type (the fold requires it), so the mma
sees exactly the values the separate LayerNorm read, and LN(x) itself is never rounded to the
half type before the product, as it is when stored between two launches. The reference is still
onnxruntime on the float32 model.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import splitk as sk
from .program import literal


@dataclass(frozen=True)
class RowNorm:
    """The folded norm of a GEMM's A rows: the kernel parameter names of c (float32 [N]; "" for
    an RMSNorm) and b' (float32 [N]; "" without a bias), epsilon, and whether the rows are
    centred (LayerNorm) or only scaled by their root mean square (RMSNorm: x / sqrt(mean(x²) +
    eps), LLaMA's and T5's, where the store is rstd ⊙ (x · W') and needs neither c nor a shift)."""

    c: str
    b: str
    eps: float

    @property
    def center(self) -> bool:
        """A LayerNorm's (its rows centred, with c), not an RMSNorm's."""
        return bool(self.c)


def scratch_floats(threads: int, bm: int) -> int:
    """Shared floats the statistics take after the k loop (in the operand tiles, free by then):
    each thread's two partial sums and shift, then mean and rstd per row."""
    return 3 * threads + 2 * bm


def supported(t, spec) -> bool:
    """Whether tiling `t` can compute `spec`'s row statistics: A is k-contiguous, THREADS / BM
    threads share a row evenly, and the statistics fit in the tiles' shared memory."""
    bm = t.bm
    threads = t.threads
    if not spec.a_k_contiguous or threads % bm:
        return False
    if t.bk % (threads // bm):
        return False
    tile = t.tile_floats if hasattr(t, "tile_floats") else t.smem_floats
    return tile >= scratch_floats(threads, bm)


def declare(t, spec, shifted: bool) -> list[str]:
    """Per-thread state: its row of the tile, its first column, the running sums, and the shift
    they are taken about: the row's first element, read from A itself (so that every k chunk of
    a split tile sums about the same one), or none where the tile already holds x - s
    (`shifted`: stage_shifts)."""
    per_row = t.threads // t.bm
    head = [f"const int rn_r = tid / {per_row}, rn_q = tid % {per_row};",
            "float rn_sh = 0.0f, rn_s1 = 0.0f, rn_s2 = 0.0f;  /* row_norm: shift, sums about it */"]
    if shifted or not spec.row_norm.center:
        return head
    stmts, val = spec.load_a("m", "k")
    return [*head, "{", f"    const int m = m0 + rn_r, k = 0;", f"    if (m < {spec.M}) {{",
            *["        " + x for x in stmts], f"        rn_sh = {val};", "    }", "}"]


def accumulate(t, K: int, tile_at, load, k0: str) -> list[str]:
    """Add a landed k block to the sums. `tile_at(row, col)`: the element offset of A's (row, col)
    within the block's buffer; `load(offset)`: its float value; `k0`: the block's first k."""
    per_row = t.threads // t.bm
    each = t.bk // per_row
    # (k blocks past K hold zeros: a ragged last block, or split chunks that K does not fill)
    walked = sk.steps_per_chunk(t, K) * getattr(t, "splitk", 1) * t.bk
    guard = "" if walked == K else f"if ({k0} + rn_c < {K}) "
    return ["#pragma unroll",
            f"for (int rn_e = 0; rn_e < {each}; ++rn_e) {{",
            f"    const int rn_c = rn_q + rn_e * {per_row};",
            f"    {guard}{{ const float rn_d = {load(tile_at('rn_r', 'rn_c'))} - rn_sh; rn_s1 += rn_d; rn_s2 += rn_d * rn_d; }}",
            "}"]


def finish(t, K: int, rn: RowNorm) -> list[str]:
    """After the k loop (and split-K's read-back, which leaves the sums over every chunk in the
    tile's last rTask), with shared memory free: each row's T partial sums added in order into
    its mean and rstd (`rn_p[3 * THREADS + 2 * row]`, `... + 1`). Barriers at top level only."""
    T, per_row, inv = t.threads, t.threads // t.bm, literal(1.0 / K)
    return ["/* row_norm (kernels/row_norm.py): the rows' mean and rstd from the threads' sums */",
            "BARRIER();  /* (split, every thread has read the last-rTask flag split-K left in smem[0]) */",
            "LPTR float* rn_p = smem;",
            f"rn_p[tid] = rn_s1; rn_p[{T} + tid] = rn_s2; rn_p[{2 * T} + tid] = rn_sh;",
            "BARRIER();",
            f"if (tid < {t.bm}) {{",
            "    float rn_a = 0.0f, rn_b = 0.0f;",
            f"    for (int q = 0; q < {per_row}; ++q) {{ rn_a += rn_p[tid * {per_row} + q]; rn_b += rn_p[{T} + tid * {per_row} + q]; }}",
            f"    const float rn_mu = rn_a * {inv};" if rn.center else "    const float rn_mu = 0.0f; (void)rn_a;",
            f"    const float rn_var = F_MAX(rn_b * {inv} - rn_mu * rn_mu, 0.0f);",
            f"    rn_p[{3 * T} + 2 * tid] = rn_p[{2 * T} + tid * {per_row}] + rn_mu;",
            f"    rn_p[{3 * T} + 2 * tid + 1] = F_RSQRT(rn_var + {literal(rn.eps)});",
            "}",
            "BARRIER();"]


def apply(t, rn: RowNorm, acc: str = "acc[i][j]") -> list[str]:
    """In the store loop, at (m, n) inside the matrix: the accumulator normalised,
    rstd * (acc - mean * c[n]) + b'[n], before the op's store."""
    bias = f" + {rn.b}[n]" if rn.b else ""
    centre = f" - rn_p[rn_i] * {rn.c}[n]" if rn.c else ""
    return [f"{{ const int rn_i = {3 * t.threads} + 2 * (m - m0);",
            f"  {acc} = rn_p[rn_i + 1] * ({acc}{centre}){bias}; }}"]


def stage_shifts(spec, bm: int, bk: int, threads: int, per: int) -> list[str]:
    """Once per rTask: `rn_sa[r]`, the first element of the row of the r-th A element this thread
    stages (its rows are the same at every k step: element l = tid + r * threads of a [bm, bk]
    k-contiguous tile is row l / bk), zero outside the matrix."""
    stmts, val = spec.load_a("m", "k")
    body = [f"    const int m = m0 + l / {bk}, k = 0;", "    float val = 0.0f;", f"    if (l < {bm * bk} && m < {spec.M}) {{",
            *["        " + x for x in stmts], f"        val = {val};", "    }", "    rn_sa[r] = val;"]
    return [f"float rn_sa[{per}];  /* row_norm: each staged row's shift */", "#pragma unroll",
            f"for (int r = 0; r < {per}; ++r) {{", f"    const int l = tid + r * {threads};", *body, "}"]
