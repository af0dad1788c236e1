"""The fused-attention template (flash attention), emitted as a Rammer rOperator.

Per batch index bt (heads, or batch x heads) it computes
    O[m, e] = sum_n softmax_n(score(m, n, S[m, n])) * V[n, e],   S[m, n] = sum_d Q[m, d] * K[d, n]
without writing the M x N scores anywhere but shared memory: each rTask owns BQ query rows and
walks the keys in blocks of BK, keeping the softmax online (a running row maximum and sum, the
output accumulators rescaled whenever the maximum grows), as in FlashAttention (Dao et al.,
2022). The unfused graph writes and reads the scores three or four times (MatMul, the scale and
mask, Softmax, MatMul); here they cost shared memory only.

As with the GEMM template (kernels/gemm.py), every element access is a C expression the caller
supplies (`AttentionSpec`), so one template serves any layout, storage type and score function
(a scale, an additive mask, a bias), and the text is a device function
`NAME_task(args..., task, tid, smem)` plus a thin KERNEL that runs task = block id, so Rammer's
persistent kernels can call the same rTask from a vEU loop.

Design choices:
  - 256 threads (ATTN_THREADS, Rammer's vEU size), BQ = 16 query rows per rTask: a row is 16
    consecutive threads, which hold its scores (BK/16 each) and its output columns (Dv/16 each).
    So a thread's row statistics (running max, the rescale factor) are the row's own and are
    kept in registers, computed identically by the row's 16 threads, and the only exchange
    between threads is one partial maximum per thread per key block through shared memory.
  - The running sum l is kept per thread over its own columns (rescaled with the row's factor
    like the accumulators) and summed over the row once, at the end: one barrier per rTask
    instead of a second reduction per key block.
  - The key loop runs over all ceil(N/BK) blocks with a constant trip count, loads guarded by
    n < N (zeros past N, scores -inf): no loop around a barrier depends on the task index, which
    PoCL 3.1 miscompiles (dlcc/testing/pocl_kernels.py), and every barrier is reached by all
    threads. Query rows past M load zeros, score -inf and are never stored; `score` is only
    evaluated inside the M x N problem, so a mask it reads is never read out of bounds.
  - Scores that are -inf (a mask) are safe: exponents are taken against the running maximum, or
    against 0 while that is still -inf, so a row whose scores so far are all -inf contributes
    exp(-inf) = 0 and never exp(-inf - -inf) = NaN. A row with no finite score at all ends as
    0/0 = NaN, as Softmax over it does (onnxruntime's too); NaN scores propagate to their row.
  - Loads go straight from global to shared memory (no register staging of the next block as
    the GEMM does): at up to 45.6 KiB of shared memory an SM holds several rTasks whose loads
    and arithmetic overlap one another, and the registers stay few (no spills at D = Dv = 128).
  - Arithmetic is float32 whatever the storage: the callbacks return floats (load_float), and
    `store` converts (store_float).
  - Shared-memory strides are padded so that the loaders' transposing stores and the two rows a
    warp computes fall in different banks: Q rows of D + 1, K rows (per d) of BK + 1, and the
    probabilities' rows of BK + 16 (a warp's two rows of 16 threads in opposite bank halves).
  - BK is 64 where Q, K, V and the probabilities fit in 47 KiB (static shared memory is 48 KiB),
    else 32, else 16 (D = Dv = 128 takes 32). Wider blocks mean fewer barriers per key.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

from .program import copy_unroll, ctype, literal, load_float, store_float

#: Threads per rTask (block): Rammer's vEU size, as the GEMM tilings.
ATTN_THREADS = 256
#: Query rows per rTask: ATTN_THREADS / BQ = 16 threads per row.
BQ = 16
_LANES = ATTN_THREADS // BQ  # threads per query row
#: Shared memory an rTask may use, in floats: CUDA's 48 KiB of static shared memory, less 1 KiB.
SMEM_LIMIT_FLOATS = 47 * 1024 // 4
#: Key block widths to try, widest first.
_BKS = (64, 32, 16)


@dataclass
class AttentionSpec:
    """What an op supplies to the template. Expressions see ints `bt` (batch index) and the index
    variables they are given; each callback's statements may declare names of their own (every
    use sits in its own scope). The template's own locals are prefixed `at_` (besides `bt`,
    `task`, `tid`, `smem`), so short names stay the caller's.

    The loaders walk K with consecutive threads on consecutive d and Q and V on consecutive d and
    e: coalesced for K stored [N, D] (key rows, as a Linear projection writes them), Q [M, D] and
    V [N, Dv]."""

    batch: int
    M: int
    N: int
    D: int
    Dv: int
    params: list[str]  # kernel parameter declarations (dialect), all tensors
    load_q: Callable[[str, str], tuple[list[str], str]]  # (m, d) -> (stmts, float value)
    load_k: Callable[[str, str], tuple[list[str], str]]  # (d, n) -> ... (K as the B operand of Q.K)
    load_v: Callable[[str, str], tuple[list[str], str]]  # (n, e) -> ...
    score: Callable[[str, str, str], tuple[list[str], str]]  # (m, n, s) -> (stmts, float score of dot product s)
    store: Callable[[str, str, str], list[str]]  # (m, e, value) -> stmts that write O
    prologue: list[str] | None = None  # statements run once per rTask after `bt` is known (batch offsets)


class AttentionShape(NamedTuple):
    """The sizes alone of an attention (what its tiling, task count and cost depend on): an
    AttentionSpec without its text, as the cost model and the plan know it."""

    batch: int
    M: int
    N: int
    D: int
    Dv: int


@dataclass(frozen=True)
class AttentionTiling:
    """The shared-memory layout of one spec's rTask (all strides and offsets in floats)."""

    D: int
    Dv: int
    bk: int

    @property
    def q_stride(self) -> int:
        return self.D + 1

    @property
    def k_stride(self) -> int:
        return self.bk + 1

    @property
    def v_stride(self) -> int:
        """V rows padded to whole 16-column groups, so that a thread's last column group reads
        inside the V tile even where Dv is not a multiple of 16 (those columns are never stored)."""
        return -(-self.Dv // _LANES) * _LANES

    @property
    def p_stride(self) -> int:
        return self.bk + 16

    @property
    def q_off(self) -> int:
        return 0

    @property
    def k_off(self) -> int:
        return self.q_off + BQ * self.q_stride

    @property
    def v_off(self) -> int:
        return self.k_off + self.D * self.k_stride

    @property
    def p_off(self) -> int:
        return self.v_off + self.bk * self.v_stride

    @property
    def red_off(self) -> int:
        return self.p_off + BQ * self.p_stride

    @property
    def smem_floats(self) -> int:
        return self.red_off + ATTN_THREADS


def attention_tiling(spec: AttentionSpec | AttentionShape) -> AttentionTiling:
    """The widest key block whose tiles fit SMEM_LIMIT_FLOATS; ValueError where none does."""
    if min(spec.batch, spec.M, spec.N, spec.D, spec.Dv) < 1:
        raise ValueError(f"attention needs positive sizes, got batch={spec.batch} M={spec.M} N={spec.N} "
                         f"D={spec.D} Dv={spec.Dv}")
    for bk in _BKS:
        t = AttentionTiling(spec.D, spec.Dv, bk)
        if t.smem_floats <= SMEM_LIMIT_FLOATS:
            return t
    raise ValueError(f"attention with D={spec.D}, Dv={spec.Dv} does not fit {4 * SMEM_LIMIT_FLOATS} bytes of "
                     "shared memory at any key block width")


def attention_tasks(spec: AttentionSpec | AttentionShape) -> int:
    """rTasks (blocks) of the rOperator: one per batch index and block of BQ query rows."""
    return spec.batch * -(-spec.M // BQ)


def attention_smem_floats(spec: AttentionSpec | AttentionShape) -> int:
    """Shared memory of one rTask, in floats (the `smem` array the KERNEL declares)."""
    return attention_tiling(spec).smem_floats


def _indent(lines, n):
    return [" " * n + s for s in lines]


def _scoped(stmts: list[str], assign: str) -> list[str]:
    """A callback's statements and the assignment that uses its value, in a scope of their own."""
    return ["{", *_indent(stmts, 4), f"    {assign}", "}"]


def _load_tile(rows: int, cols: int, smem_at: Callable[[str, str], str], guard: Callable[[str, str], str],
               load: Callable[[str, str], tuple[list[str], str]], names: tuple[str, str],
               index: Callable[[str, str], tuple[str, str]], rnd: str = "", unroll: int | None = None) -> list[str]:
    """Copy a rows x cols tile (cols the contiguous dimension) into shared memory, element
    x = tid + r * 256 at (x / cols, x % cols), zero where `guard` fails. `index(row, col)` gives
    the loader's global indices (the names in `names`), `smem_at(row, col)` the shared slot;
    `rnd` a macro the value goes through as it is stored (the tensor-core template's operand
    rounding, kernels/attention_mma.py), none by default; `unroll` a partial unroll of the copy
    loop (fewer loads in flight, fewer registers), full by default."""
    n_el = rows * cols
    per = -(-n_el // ATTN_THREADS)
    a, b = names
    ia, ib = index("at_row", "at_col")
    stmts, val = load(a, b)
    return [
        copy_unroll(stmts, val) if unroll is None else f"#pragma unroll {unroll}",
        f"for (int at_r = 0; at_r < {per}; ++at_r) {{",
        f"    const int at_x = tid + at_r * {ATTN_THREADS};",
        *([f"    if (at_x < {n_el}) {{"] if n_el % ATTN_THREADS else ["    {"]),
        f"        const int at_row = at_x / {cols}, at_col = at_x % {cols};",
        f"        const int {a} = {ia}, {b} = {ib};",
        "        float at_val = 0.0f;",
        f"        if ({guard(a, b)}) {{",
        *_indent(stmts, 12),
        f"            at_val = {val};",
        "        }",
        f"        {smem_at('at_row', 'at_col')} = {f'{rnd}(at_val)' if rnd else 'at_val'};",
        "    }",
        "}",
    ]


def online_max_step(alpha: str) -> list[str]:
    """One key block's step of the online softmax, shared by both templates: each thread has its
    partial maximum `at_mloc` over its scores; through `at_red` (a barrier) it takes its row's
    maximum, the new running maximum `at_mi`, the exponent base `at_ms` (0 while the row has no
    finite score, so that exp(-inf - -inf) never makes a NaN) and the rescale factor `alpha` of
    what came before, applied to its share of the running sum `at_l`."""
    neg_inf = "(-DLCC_INF)"
    return [
        "at_red[tid] = at_mloc;",
        "BARRIER();",
        "float at_mb = at_mloc;",
        "#pragma unroll",
        f"for (int at_u = 0; at_u < {_LANES}; ++at_u) at_mb = F_MAX(at_mb, at_red[at_i * {_LANES} + at_u]);",
        "const float at_mn = F_MAX(at_mi, at_mb);",
        "/* exponents against 0 while the row has no finite score: exp(-inf) = 0, not NaN */",
        f"const float at_ms = at_mn == {neg_inf} ? 0.0f : at_mn;",
        f"const float {alpha} = F_EXP(at_mi - at_ms);",
        "at_mi = at_mn;",
        f"at_l *= {alpha};",
    ]


def attention_source(name: str, spec: AttentionSpec) -> str:
    """The rOperator text: `{name}_task` and its KERNEL `{name}` (ATTN_THREADS threads, one block
    per rTask, attention_tasks(spec) blocks, attention_smem_floats(spec) floats of shared memory).

    Per key block: load K and V (barrier); each thread computes its BK/16 scores from shared
    memory, applies `score` and the bounds, and publishes its partial maximum (barrier); each
    thread takes its row's maximum, rescales its accumulators and partial sum, and writes its
    probabilities (barrier); it adds P.V for its Dv/16 output columns (barrier, before the next
    block overwrites the tiles)."""
    t = attention_tiling(spec)
    M, N, D, Dv, bk = spec.M, spec.N, spec.D, spec.Dv, t.bk
    tiles_m = -(-M // BQ)
    key_blocks = -(-N // bk)
    sc = bk // _LANES  # scores per thread
    oc = -(-Dv // _LANES)  # output columns per thread
    QS, KS, VS, PS = t.q_stride, t.k_stride, t.v_stride, t.p_stride
    arg_names = [p.split()[-1].lstrip("*") for p in spec.params]
    neg_inf = "(-DLCC_INF)"

    load_q = _load_tile(BQ, D, lambda r, c: f"at_qs[{r} * {QS} + {c}]", lambda m, d: f"{m} < {M}",
                        spec.load_q, ("at_m", "at_d"), lambda r, c: (f"at_m0 + {r}", c))
    # K as key rows (n, d), d contiguous: stored k-major (at_ks[d * KS + j]) for the score loop
    load_k = _load_tile(bk, D, lambda r, c: f"at_ks[{c} * {KS} + {r}]", lambda d, n: f"{n} < {N}",
                        spec.load_k, ("at_d", "at_n"), lambda r, c: (c, f"at_n0 + {r}"))
    load_v = _load_tile(bk, Dv, lambda r, c: f"at_vs[{r} * {VS} + {c}]", lambda n, e: f"{n} < {N}",
                        spec.load_v, ("at_n", "at_e"), lambda r, c: (f"at_n0 + {r}", c))
    score_stmts, score_val = spec.score("at_qm", "at_n", "at_s[at_c]")
    store = spec.store("at_qm", "at_e", "at_o[at_c] / at_l")

    dev = [
        f"DEVICE void {name}_task({', '.join(spec.params)}, const int task, const int tid, LPTR float* smem) {{",
        f"    LPTR float* at_qs = smem + {t.q_off};  /* Q block [BQ][D], rows of {QS} */",
        f"    LPTR float* at_ks = smem + {t.k_off};  /* K block [D][BK], rows of {KS} */",
        f"    LPTR float* at_vs = smem + {t.v_off};  /* V block [BK][Dv], rows of {VS} */",
        f"    LPTR float* at_ps = smem + {t.p_off};  /* probabilities [BQ][BK], rows of {PS} */",
        f"    LPTR float* at_red = smem + {t.red_off};  /* one float per thread: partial max, then sum */",
        f"    const int bt = task / {tiles_m};",
        f"    const int at_m0 = (task % {tiles_m}) * {BQ};",
        f"    const int at_i = tid / {_LANES}, at_t = tid % {_LANES};  /* query row, lane in the row */",
        f"    const int at_qm = at_m0 + at_i;",
        *_indent(spec.prologue or [], 4),
        *_indent(load_q, 4),
        f"    float at_o[{oc}];",
        "    #pragma unroll",
        f"    for (int at_c = 0; at_c < {oc}; ++at_c) at_o[at_c] = 0.0f;",
        f"    float at_mi = {neg_inf};  /* the row's running maximum (the same in all its threads) */",
        "    float at_l = 0.0f;  /* this thread's share of the row's running sum */",
        f"    for (int at_kb = 0; at_kb < {key_blocks}; ++at_kb) {{",
        f"        const int at_n0 = at_kb * {bk};",
        *_indent(load_k, 8),
        *_indent(load_v, 8),
        "        BARRIER();",
        f"        float at_s[{sc}];",
        "        #pragma unroll",
        f"        for (int at_c = 0; at_c < {sc}; ++at_c) at_s[at_c] = 0.0f;",
        f"        for (int at_d = 0; at_d < {D}; ++at_d) {{",
        f"            const float at_q = at_qs[at_i * {QS} + at_d];",
        "            #pragma unroll",
        f"            for (int at_c = 0; at_c < {sc}; ++at_c)",
        f"                at_s[at_c] += at_q * at_ks[at_d * {KS} + at_t + at_c * {_LANES}];",
        "        }",
        f"        float at_mloc = {neg_inf};",
        "        #pragma unroll",
        f"        for (int at_c = 0; at_c < {sc}; ++at_c) {{",
        f"            const int at_n = at_n0 + at_t + at_c * {_LANES};",
        f"            float at_v = {neg_inf};",
        f"            if (at_qm < {M} && at_n < {N}) {{",
        *_indent(score_stmts, 16),
        f"                at_v = {score_val};",
        "            }",
        "            at_s[at_c] = at_v;",
        "            at_mloc = F_MAX(at_mloc, at_v);",
        "        }",
        *_indent(online_max_step("at_alpha"), 8),
        "        #pragma unroll",
        f"        for (int at_c = 0; at_c < {sc}; ++at_c) {{",
        "            const float at_p = F_EXP(at_s[at_c] - at_ms);",
        "            at_l += at_p;",
        f"            at_ps[at_i * {PS} + at_t + at_c * {_LANES}] = at_p;",
        "        }",
        "        #pragma unroll",
        f"        for (int at_c = 0; at_c < {oc}; ++at_c) at_o[at_c] *= at_alpha;",
        "        BARRIER();",
        f"        for (int at_j = 0; at_j < {bk}; ++at_j) {{",
        f"            const float at_p = at_ps[at_i * {PS} + at_j];",
        "            #pragma unroll",
        f"            for (int at_c = 0; at_c < {oc}; ++at_c)",
        f"                at_o[at_c] += at_p * at_vs[at_j * {VS} + at_t + at_c * {_LANES}];",
        "        }",
        "        BARRIER();",
        "    }",
        "    at_red[tid] = at_l;",
        "    BARRIER();",
        "    at_l = 0.0f;",
        "    #pragma unroll",
        f"    for (int at_u = 0; at_u < {_LANES}; ++at_u) at_l += at_red[at_i * {_LANES} + at_u];",
        "    #pragma unroll",
        f"    for (int at_c = 0; at_c < {oc}; ++at_c) {{",
        f"        const int at_e = at_t + at_c * {_LANES};",
        f"        if (at_qm < {M} && at_e < {Dv}) {{",
        *_indent(store, 12),
        "        }",
        "    }",
        "}",
        "",
        f"KERNEL void {name}({', '.join(spec.params)}) {{",
        f"    SHARED float smem[{t.smem_floats}];",
        f"    {name}_task({', '.join(arg_names)}, BLOCK_ID, THREAD_ID, smem);",
        "}",
        "",
    ]
    return "\n".join(dev)


def plain_attention_spec(batch: int, M: int, N: int, D: int, Dv: int, dtype: str = "float32", scale: float = 1.0,
                         mask: bool = False) -> AttentionSpec:
    """Attention over plain row-major tensors stored as `dtype` (float32, float16 or bfloat16):
    Q [batch, M, D], K [batch, N, D] (key rows: S = Q.K^T), V [batch, N, Dv], O [batch, M, Dv],
    score = s * scale, plus Mask [batch, M, N] (float32, additive) where `mask`. Parameters in
    that order (Q, K, V, Mask, O). The rOperator on its own, for the tests; its callbacks declare
    short names of their own in their scopes, and the batch offsets come from the prologue, as an
    op's would."""
    ct = ctype(dtype)
    params = [f"GPTR const {ct}* Q", f"GPTR const {ct}* K", f"GPTR const {ct}* V"]
    if mask:
        params.append("GPTR const float* Mask")
    params.append(f"GPTR {ct}* O")

    def score(m, n, s):
        base = f"{s} * {literal(scale)}"
        if not mask:
            return [], base
        return [f"const int mi = mb + {m} * {N} + {n};"], f"{base} + Mask[mi]"

    return AttentionSpec(
        batch=batch, M=M, N=N, D=D, Dv=Dv, params=params,
        load_q=lambda m, d: ([], load_float(dtype, "Q", f"qb + {m} * {D} + {d}")),
        load_k=lambda d, n: ([f"const int ki = kb + {n} * {D} + {d};"], load_float(dtype, "K", "ki")),
        load_v=lambda n, e: ([], load_float(dtype, "V", f"vb + {n} * {Dv} + {e}")),
        score=score,
        store=lambda m, e, v: [f"const int oi = ob + {m} * {Dv} + {e};", store_float(dtype, "O", "oi", v)],
        prologue=[f"const int qb = bt * {M * D}, kb = bt * {N * D}, vb = bt * {N * Dv};",
                  f"const int ob = bt * {M * Dv}, mb = bt * {M * N};"],
    )


def attention_cost(batch: int, M: int, N: int, D: int, Dv: int, device=None) -> float:
    """Modelled cycles of the fused attention on a GPU `device`, in the units of the SIMT GEMM's
    model (kernels/gemm.py tiling_cost: the same issue rate and step latency, so DeviceSpec.
    gemm_cycle_us turns both into µs). rTasks are spread over the SMs; an SM's time is the larger
    of
      - throughput: its rTasks × key blocks × warp instructions per block (the scores' and P·V's
        FMAs, each reading one operand from shared memory besides the register one, the K and V
        tiles' loads and shared stores, the softmax's exponentials, loop and barrier overhead)
        over the issue rate, and
      - latency: its rounds of co-resident rTasks × key blocks × two dependent steps (the K/V
        load, then the scores' max and the probabilities' barriers),
    plus one step for the Q block. Co-residency comes from the shared memory and about 100
    registers a thread (ptxas: 64-108)."""
    from .gemm import ISSUE_PER_CYCLE, STEP_LATENCY

    shape = AttentionShape(batch, M, N, D, Dv)
    t = attention_tiling(shape)
    sms = getattr(device, "sms", 80)
    per_sm = -(-attention_tasks(shape) // sms)
    steps = -(-N // t.bk)
    fma = BQ * t.bk * (D + Dv)
    instr = (2 * fma + 2 * t.bk * (D + Dv) + 4 * BQ * t.bk + 40 * ATTN_THREADS) / 32
    occ = max(1, min(getattr(device, "max_blocks_per_sm", 32), getattr(device, "max_threads_per_sm", 2048) // ATTN_THREADS,
                     getattr(device, "shared_mem_per_sm", 233472) // (4 * t.smem_floats),
                     getattr(device, "registers_per_sm", 65536) // (100 * ATTN_THREADS)))
    return (max(per_sm * steps * instr / ISSUE_PER_CYCLE, -(-per_sm // occ) * steps * 2 * STEP_LATENCY)
            + STEP_LATENCY)
