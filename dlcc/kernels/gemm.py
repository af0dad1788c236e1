"""The tiled shared-memory GEMM template, emitted as a Rammer rOperator.

Every compute op (MatMul, Gemm, Conv as implicit GEMM, the LSTM's projections) is a batch of
C[b] = A[b] (MxK) · B[b] (KxN) whose element loads are C expressions supplied by the op, so one
template serves transposed operands, broadcast batches and im2col-free convolution. Each
BMxBN output tile is one rTask, emitted as a device function
`NAME_task(args..., task_id, thread_id, smem)` plus a thin KERNEL that runs task = block id;
Rammer's persistent kernels later call the same device function from a vEU loop.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

from . import row_norm
from . import splitk as sk
from .program import copy_unroll
from .row_norm import RowNorm


@dataclass(frozen=True)
class Tiling:
    bm: int
    bn: int
    bk: int
    tm: int
    tn: int
    splitk: int = 1  # k chunks per output tile, each its own rTask (kernels/splitk.py)
    # The vector template (VECTOR_TILINGS): two shared stages, one barrier per k step, and
    # each thread's outputs in runs of four, read from shared memory as float4.
    vec: bool = False

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)

    @property
    def pad(self) -> int:
        """Floats added to each k row of a shared tile, so that the loaders' transposing stores
        (consecutive threads walk k) spread over the banks: one for the scalar template; four for
        the vector one, which keeps every row 16-byte aligned for its float4 reads (the stores
        are then 2-way conflicted at worst, once per k step, against conflict-free reads)."""
        return 4 if self.vec else 1

    @property
    def a_stride(self) -> int:
        """Row stride of the k-major A tile in shared memory."""
        return self.bm + self.pad

    @property
    def b_stride(self) -> int:
        return self.bn + self.pad

    @property
    def stages(self) -> int:
        return 2 if self.vec else 1

    @property
    def smem_floats(self) -> int:
        return self.stages * self.bk * (self.a_stride + self.b_stride)

    @property
    def name(self) -> str:
        return f"{self.bm}x{self.bn}x{self.bk}_{self.tm}x{self.tn}{'v' if self.vec else ''}{sk.suffix(self.splitk)}"

    @property
    def math(self) -> str:
        return "float32"

    def source(self, name: str, spec: "GemmSpec") -> str:
        return simt_gemm_source(name, spec, self)


#: Several rKernels per rOperator: big tiles for big GEMMs, small and skinny ones to fill the device,
#: and deep-k variants for long reductions over few tiles (BERT's FFN down-projection: 96 tiles of
#: K=3072), where the k loop's memory latency, not arithmetic, sets the time.
TILINGS = (
    Tiling(64, 64, 16, 4, 4),
    Tiling(64, 64, 32, 4, 4),
    Tiling(32, 64, 16, 2, 4),
    Tiling(32, 64, 32, 2, 4),
    Tiling(16, 64, 16, 1, 4),
    Tiling(16, 64, 64, 1, 4),
    Tiling(32, 32, 16, 2, 2),
    Tiling(32, 32, 64, 2, 2),
)

#: Larger per-thread tiles, for GPU devices only (DeviceSpec.kind "gpu"): 8x4 and 8x8 outputs per
#: thread read shared memory once per 2.7 and 4 FMAs against 2 for TILINGS' 4x4, and on an H100
#: they measured 1.2-2x faster on the LM head and the square shape (scripts/gemm_tilings.py). They
#: keep 256 threads, Rammer's vEU size, so they stay rTasks. A CPU device does not get them: PoCL
#: 3.1's LLVM crashes (SIGSEGV in instruction selection) building their unrolled work-item loops
#: optimised, so on PoCL they build with -cl-opt-disable (backends/opencl.py compile),
#: which is how the tests still run their index arithmetic there.
GPU_TILINGS = (
    Tiling(128, 64, 32, 8, 4),
    Tiling(128, 128, 16, 8, 8),
)
#: The vector template's tilings (Tiling.vec; CPU_TILINGS takes some of them): two shared stages, so one barrier
#: per k step and the next step's stores off the critical path, and each thread's outputs in runs of
#: four, read from shared memory as one float4 where the per-thread count is a multiple of four (a
#: 4x4 tile reads 2 words a kk instead of 8; 8x8, 4 instead of 16). The usual next steps of a SIMT
#: SGEMM after register blocking (CUTLASS's SIMT mainloop; Boehm's "How to optimize a CUDA matmul").
#: Twins of the scalar tilings, at most 16 deep where the rows are 128 so that both stages stay
#: within 48 KiB of static shared memory. The cost model picks them only on a device spec that says
#: they were measured faster there (`simt_vector_tilings`: the h100 spec, where an H200 ran the
#: fastest fp32 tiling in this form on every shape timed, docs/gemm.md); --tune times them.
VECTOR_TILINGS = (
    Tiling(64, 64, 16, 4, 4, vec=True),
    Tiling(64, 64, 32, 4, 4, vec=True),
    Tiling(32, 64, 32, 2, 4, vec=True),
    Tiling(16, 64, 16, 1, 4, vec=True),
    Tiling(16, 64, 32, 1, 4, vec=True),
    Tiling(16, 64, 64, 1, 4, vec=True),
    Tiling(32, 32, 32, 2, 2, vec=True),
    Tiling(32, 32, 64, 2, 2, vec=True),
    Tiling(128, 64, 16, 8, 4, vec=True),
    Tiling(128, 128, 16, 8, 8, vec=True),
)
ALL_TILINGS = TILINGS + GPU_TILINGS + VECTOR_TILINGS
#: A CPU device's tilings (PoCL): TILINGS with the 4x4 and 1x4 ones in the vector template. In
#: three interleaved runs over nine GEMM shapes of the test models (108 pairs, medians of 5;
#: scripts/gemm_tilings.py --target opencl --tilings vector) those vector twins ran a median 1.13x
#: faster than their scalar ones: PoCL vectorises the float4 reads. 7 pairs were slower (down to
#: 0.79x), all on GEMMs under 3.5 ms, none on the four larger shapes. The 2x2 and 2x4 twins gained
#: nothing clear. Same tile shapes, so cpu_tiling_cost ranks them alike; the sums run in the same
#: order, so results are bitwise the same.
CPU_TILINGS = tuple(dataclasses.replace(t, vec=True) if t.tn == 4 and t.tm in (1, 4) else t for t in TILINGS)


def tilings_for(device=None, split: bool = True, vector: bool | None = None) -> tuple:
    """The SIMT tilings `device` chooses among: CPU_TILINGS on a CPU; on a GPU (None: a generic
    one, as tiling_cost assumes) TILINGS and GPU_TILINGS, with VECTOR_TILINGS where `vector`
    (default: the device spec's `simt_vector_tilings`), and each also split along K
    (kernels/splitk.py)."""
    if getattr(device, "kind", "gpu") == "cpu":
        return CPU_TILINGS
    if vector is None:
        vector = bool(getattr(device, "simt_vector_tilings", False))
    return sk.variants(ALL_TILINGS if vector else TILINGS + GPU_TILINGS, device, split)

#: The cost model's two constants, calibrated on an H100 with scripts/gemm_tilings.py (every tiling
#: timed on BERT-base's, a ResNet-50 conv's, GPT-2's LM-head and a square shape): with them the
#: model picks the measured-fastest tiling in TILINGS on all six shapes. Their absolute time is
#: about 2x too high, but only the ranking matters here, and it held for most constants tried
#: (an issue rate of 0.5 to 4 and a step latency of 100 to 3000 cycles).
ISSUE_PER_CYCLE = 2.0  # warp instructions an SM retires per cycle in the k loop
STEP_LATENCY = 300  # cycles of a k step's load -> shared store -> barrier chain; co-resident blocks overlap it


def tasks_for(t, batch: int, M: int, N: int) -> int:
    """rTasks of tiling `t` (any template's): one per output tile and k chunk."""
    return batch * -(-M // t.bm) * -(-N // t.bn) * t.splitk


def tiling_cost(t: Tiling, batch: int, M: int, N: int, K: int, device=None) -> float:
    """Modelled cycles of the GEMM on `device` (a DeviceSpec; None: a generic 80-SM GPU).

    Tasks (tiles, times the k chunks of a split tiling, each 1/S of the k steps) are spread over
    the SMs. An SM's time is the larger of
      - throughput: its tasks × k steps × warp instructions per step (FMAs, shared-memory reads of
        the per-thread tiles, global loads and shared stores, loop overhead) / issue rate, and
      - latency: its rounds of co-resident blocks × k steps × one step's latency,
    where co-residency comes from threads, blocks, shared memory and an estimate of registers
    per thread. The vector form (Tiling.vec) counts a float4 shared read as one instruction; its
    one barrier a step instead of two is not priced (at these constants the issue term binds for
    every 256-thread tiling, so the step latency seldom decides).
    Small per-thread tiles read shared memory once per FMA and lose on the first term; few, long
    tasks lose on the second (BERT's FFN down-projection: 96 tiles over K=3072). A split tiling
    adds its partial sums' round trip (kernels/splitk.py workspace_cycles)."""
    sms = getattr(device, "sms", 80)
    T = t.threads
    per_sm = -(-tasks_for(t, batch, M, N) // sms)
    steps = sk.steps_per_chunk(t, K)
    stage = _per_thread(t, "a")[1] + _per_thread(t, "b")[1]
    reads = sum(n // 4 if _runs_of_four(t, w) else n for w, n in (("a", t.tm), ("b", t.tn)))
    instr = (t.bm * t.bn * t.bk + t.bk * T * reads + 2 * (t.bm + t.bn) * t.bk + 30 * T) / 32
    regs = 32 + t.tm * t.tn + stage + t.tm + t.tn
    occ = max(1, min(getattr(device, "max_blocks_per_sm", 32), getattr(device, "max_threads_per_sm", 2048) // T,
                     getattr(device, "registers_per_sm", 65536) // (regs * T),
                     getattr(device, "shared_mem_per_sm", 1 << 30) // (4 * t.smem_floats)))
    return (max(per_sm * steps * instr / ISSUE_PER_CYCLE, -(-per_sm // occ) * steps * STEP_LATENCY)
            + sk.workspace_cycles(t, per_sm, ISSUE_PER_CYCLE, STEP_LATENCY))


#: The CPU cost model's constants (cpu_tiling_cost), fitted on PoCL (2-core x86-64, LLVM 15) with
#: `scripts/gemm_tilings.py --target opencl --device pocl-cpu` over nine small-model shapes, two
#: runs: its pick was within a geometric mean of 1.14x of the fastest tiling (worst 1.56x), where
#: the GPU model (tiling_cost) picked 2.4x slower ones (worst 6.8x).
CPU_STEP_OVERHEAD = 2000  # FMA-equivalents per k step: the work-item loops restarted at each barrier
CPU_DEEP_K_EFFICIENCY = {16: 1.0, 32: 0.7, 64: 0.5}  # per bk, when the GEMM takes more than one k step
CPU_ONE_ROW_EFFICIENCY = 0.7  # tm = 1 tilings: a quarter of the per-item reuse of 4x4


def cpu_tiling_cost(t: Tiling, batch: int, M: int, N: int, K: int, device=None) -> float:
    """Modelled cost of the GEMM on a CPU OpenCL device (PoCL), in FMA-equivalents.

    A CPU runs one work-group per core at a time, and runs a work-group as loops over its work-items
    between barriers (vectorized across work-items). So there is no latency to hide, and what
    GPU tilings buy with deep k (fewer barriers per FMA) costs more than it saves: the wide k
    loop vectorizes worse. The cost is the padded tile's FMAs per k step at the tiling's
    efficiency plus a fixed cost per step, times the steps, times the waves of work-groups over
    the cores. A deep-k tiling that covers K in one step pays no deep-k penalty (a 64-deep
    reduction in one step beats four 16-deep ones)."""
    cores = getattr(device, "sms", 2) * max(1, getattr(device, "max_blocks_per_sm", 1))
    waves = -(-tasks_for(t, batch, M, N) // max(1, cores))
    steps = sk.steps_per_chunk(t, K)
    eff = CPU_DEEP_K_EFFICIENCY.get(t.bk, 0.5) if steps > 1 else 1.0
    if t.tm == 1:
        eff *= CPU_ONE_ROW_EFFICIENCY
    return waves * steps * (t.bm * t.bn * t.bk / eff + CPU_STEP_OVERHEAD)


def tiling_named(name: str) -> Tiling | None:
    """The SIMT tiling called `name` (Tiling.name, split variants included), or None."""
    return next((t for t in sk.variants(ALL_TILINGS) if t.name == name), None)


def tiling_and_cost(name: str, device=None) -> tuple[object, Callable] | None:
    """Any template's tiling called `name` (SIMT or tensor-core, split variants included) with
    its template's cost model for `device`, or None."""
    t = tiling_named(name)
    if t is not None:
        return t, simt_cost(device)
    from .gemm_mma import MMA_KINDS, mma_cost, mma_family

    for p in MMA_KINDS:
        for m in sk.variants(mma_family(p, deep=True, wgmma=True)):
            if m.name == name:
                return m, mma_cost
    return None


def tiling_family_for(precision: str, device=None, split: bool = True) -> tuple:
    """The tilings a GEMM at `precision` may run as on `device` (what `--tune` times): the SIMT
    ones at fp32, the tensor-core ones of that precision otherwise, with the DEEP ones where the
    device's shared memory holds them and the wgmma ones where the device spec has them on
    (`gemm_wgmma`: until a GPU has run them, --tune does not put a user's compile on them; the
    measurement is scripts/gemm_tilings.py's); on a GPU each also split along K unless `split` is
    off."""
    if precision == "fp32":
        return tilings_for(device, split, vector=True)
    from .gemm_mma import chooses_wgmma, deep_tilings_fit, mma_family

    return sk.variants(mma_family(precision, device, deep_tilings_fit(device), chooses_wgmma(device)), device, split)


def all_tiling_names() -> list[str]:
    """Every tiling name a pipeline may give (`lower`'s gemm_tilings): SIMT and tensor-core."""
    from .gemm_mma import MMA_KINDS, mma_family

    return [t.name for t in sk.variants(ALL_TILINGS)] + [t.name for p in MMA_KINDS
                                                        for t in sk.variants(mma_family(p, deep=True, wgmma=True))]


def shape_key(batch: int, M: int, N: int, K: int) -> str:
    """How `lower`'s gemm_tilings names a GEMM problem: "BATCHxMxNxK"."""
    return f"{batch}x{M}x{N}x{K}"


def simt_cost(device=None) -> Callable:
    """The SIMT tiling cost model for `device`: cpu_tiling_cost on a CPU, tiling_cost elsewhere."""
    return cpu_tiling_cost if getattr(device, "kind", "gpu") == "cpu" else tiling_cost


def kernel_smem(tiling) -> dict:
    """add_kernel's shared-memory arguments for a GEMM kernel of `tiling`: the plan's figure (the
    OpenCL one, emulation scratch included), and the CUDA dynamic shared memory a DEEP tiling
    takes at each launch (kernels/gemm_mma.py)."""
    return {"smem_bytes": 4 * tiling.smem_floats,
            "dynamic_smem": tiling.cuda_smem_bytes if getattr(tiling, "dynamic", False) else 0}


def cheapest(tilings, cost, batch: int, M: int, N: int, K: int, device=None):
    """The tiling of `tilings` with the lowest `cost(t, batch, M, N, K, device)`; ties go to the
    earlier, larger tile."""
    best, best_cost = None, None
    for t in tilings:
        c = cost(t, batch, M, N, K, device)
        if best_cost is None or c < best_cost * (1 - 1e-9):
            best, best_cost = t, c
    return best


def choose_tiling(batch: int, M: int, N: int, K: int, device=None, split: bool = True) -> Tiling:
    """The SIMT tiling for `device` with the lowest modelled time (simt_cost)."""
    return cheapest(tilings_for(device, split), simt_cost(device), batch, M, N, K, device)


def tiling_family(t, device=None, split: bool = True) -> tuple[tuple, Callable]:
    """The tilings a GEMM's rKernel may be swapped for on `device` (Rammer re-tiles per wave), with
    their cost function: those of its own template, so a tensor-core GEMM stays on tensor cores."""
    from .gemm_mma import MmaTiling, chooses_wgmma, mma_cost, mma_family

    if isinstance(t, MmaTiling):
        # (not the tilings in dynamic shared memory, which a persistent kernel's rTask takes only
        # on some specs: the DEEP ones are left out by mma_family's deep=False, the wgmma ones here)
        family = [m for m in mma_family(t.precision, device, False, t.wgmma or chooses_wgmma(device)) if not m.dynamic]
        return sk.variants(family, device, split), mma_cost
    return tilings_for(device, split), simt_cost(device)


@dataclass(frozen=True)
class RawOperand:
    """A GEMM operand that is a plain tensor read: element (x, k) (x is m for A, n for B) at
    `ptr[base + x * stride + k]` (k_contiguous) or `ptr[base + k * stride + x]`, stored as `dtype`.
    Set by the ops whose loads are exactly that; the tensor-core template copies such an operand
    into shared memory as it is stored (cp.async, kernels/gemm_mma_async.py) instead of converting
    it element by element through load_a/load_b."""

    ptr: str
    dtype: str
    base: str
    stride: int
    k_contiguous: bool


@dataclass
class GemmSpec:
    """What an op supplies to the template; expressions see ints `bt` (batch), `m`, `n`, `k`."""

    batch: int
    M: int
    N: int
    K: int
    params: list[str]  # kernel parameter declarations (dialect), inputs then output
    load_a: Callable[[str, str], tuple[list[str], str]]  # (m, k) -> (stmts, value)
    load_b: Callable[[str, str], tuple[list[str], str]]  # (k, n) -> (stmts, value)
    store: Callable[[str, str, str], list[str]]  # (m, n, acc) -> stmts that write the result
    prologue: list[str] = None  # statements run once per task after `bt` is known (batch offsets)
    a_k_contiguous: bool = True  # A's k stride is 1: consecutive threads walk k when loading
    b_n_contiguous: bool = True  # B's n stride is 1: consecutive threads walk n when loading
    # Set where the store is exactly `OUT[store_index(m, n)] = store_value(m, n, acc)` on the last param:
    # AStitch then fuses elementwise consumers of the output into the store (a GEMM epilogue). Both
    # take the index names, since a caller may name them otherwise (the fused attention's at_om, at_e).
    store_index: Callable[[str, str], str] | None = None
    store_value: Callable[[str, str, str], str] | None = None
    # Where load_a / load_b is a plain read of a tensor (RawOperand); None where it computes
    # (im2col windows, fused prologues, the LSTM's concatenated operands).
    raw_a: RawOperand | None = None
    raw_b: RawOperand | None = None
    # A LayerNormalization folded into this GEMM (kernels/row_norm.py): A is its input, B its
    # scaled weights, and the store normalises the accumulators first (the SIMT and cp.async
    # templates; at fp32, fp16 and bf16, where ops/fold_norm.py folds).
    row_norm: "RowNorm | None" = None


def plain_spec(M: int, N: int, K: int, trans_b: bool = True, b_dtype: str = "float32",
               a_dtype: str = "float32", trans_a: bool = False, batch: int = 1) -> GemmSpec:
    """C = A·B for row-major tensors A, stored [M, K] (or [K, M] with trans_a) as `a_dtype`, and
    B, stored [N, K] (a Linear weight, transB=1) or [K, N] as `b_dtype` (float32, or float16 /
    bfloat16 as a compiled model stores half weights and activations): the rOperator on its own,
    for scripts/gemm_tilings.py, --tune and the tests. With `batch` > 1, `batch` such products of
    contiguous matrices one after another in A, B and C (attention's Q·Kᵀ and P·V)."""
    from .program import ctype, load_float

    a0, b0 = ("aoff", "boff") if batch > 1 else ("0", "0")
    pre = lambda x: "" if batch == 1 else f"{x} + "  # noqa: E731
    return GemmSpec(
        batch=batch, M=M, N=N, K=K,
        params=[f"GPTR const {ctype(a_dtype)}* A", f"GPTR const {ctype(b_dtype)}* B", "GPTR float* C"],
        prologue=[f"const int aoff = bt * {M * K}, boff = bt * {N * K};"] if batch > 1 else None,
        load_a=lambda m, k: ([], load_float(a_dtype, "A", pre(a0) + (f"{k} * {M} + {m}" if trans_a else f"{m} * {K} + {k}"))),
        load_b=lambda k, n: ([], load_float(b_dtype, "B", pre(b0) + (f"{n} * {K} + {k}" if trans_b else f"{k} * {N} + {n}"))),
        store=lambda m, n, acc: [f"C[{pre(f'bt * {M * N}')}{m} * {N} + {n}] = {acc};"],
        a_k_contiguous=not trans_a, b_n_contiguous=not trans_b,
        raw_a=RawOperand("A", a_dtype, a0, M if trans_a else K, not trans_a),
        raw_b=RawOperand("B", b_dtype, b0, K if trans_b else N, trans_b),
    )


@dataclass
class GemmExpr:
    """What emit_gemm was given, kept on the launch so AStitch can re-emit the rOperator with a
    fused prologue (operand loads through element functions) and epilogue (consumers in the store)."""

    hint: str
    spec: GemmSpec
    tiling: Tiling
    args: list
    reads: list
    writes: list
    # A split tiling's launch arguments after the op's (kernels/splitk.py launch_args): workspace,
    # counters, first counter. AStitch and Rammer carry them to the launches they re-emit.
    splitk_args: list = field(default_factory=list)


def _indent(lines, n):
    return [" " * n + s for s in lines]


def _per_thread_count(n_el: int, threads: int) -> int:
    """Elements each of `threads` stages when they share `n_el` loads."""
    return -(-n_el // threads)


def _per_thread(t: Tiling, which: str) -> tuple[int, int]:
    """(elements of one k step's A or B tile, elements each thread stages)."""
    n_el = (t.bm if which == "a" else t.bn) * t.bk
    return n_el, _per_thread_count(n_el, t.threads)


def _walk(t: Tiling, which: str, spec: GemmSpec, pragma: str = "#pragma unroll") -> list[str]:
    """The loop over a thread's share of one k step's A (or B) tile, opened up to its index split:
    element l = tid + r*T, split along the operand's contiguous dimension so that consecutive
    threads touch consecutive addresses. The caller adds the body and closes the loop."""
    n_el, per = _per_thread(t, which)
    if which == "a":
        split = (f"const int mm = l / {t.bk}, kk = l % {t.bk};" if spec.a_k_contiguous
                 else f"const int kk = l / {t.bm}, mm = l % {t.bm};")
    else:
        split = (f"const int kk = l / {t.bn}, nn = l % {t.bn};" if spec.b_n_contiguous
                 else f"const int nn = l / {t.bk}, kk = l % {t.bk};")
    guard = [] if n_el % t.threads == 0 else [f"    if (l >= {n_el}) continue;"]
    return [pragma, f"for (int r = 0; r < {per}; ++r) {{", f"    const int l = tid + r * {t.threads};",
            *guard, f"    {split}"]


def _stage(t: Tiling, which: str, k0: str, spec: GemmSpec) -> list[str]:
    """Global loads of one k step's A (or B) tile into the thread's staging registers `ra`/`rb`."""
    if which == "a":
        stmts, val = spec.load_a("m", "k")
        where = [f"const int m = m0 + mm, k = {k0} + kk;", f"if (m < {spec.M} && k < {spec.K}) {{"]
    else:
        stmts, val = spec.load_b("k", "n")
        where = [f"const int k = {k0} + kk, n = n0 + nn;", f"if (k < {spec.K} && n < {spec.N}) {{"]
    return [*_walk(t, which, spec, copy_unroll(stmts, val)), f"    {where[0]}", "    float val = 0.0f;",
            f"    {where[1]}", *_indent(stmts, 8), f"        val = {val};", "    }", f"    r{which}[r] = val;", "}"]


def _commit(t: Tiling, which: str, spec: GemmSpec, stage: str = "") -> list[str]:
    """The staging registers into the shared tiles (k-major, padded rows); `stage`: the vector
    template's offset of the stage written (a C expression of floats). A folded LayerNorm's A
    goes in less its row's shift (kernels/row_norm.py stage_shifts)."""
    at = f"{stage} + " if stage else ""
    shift = " - rn_sa[r]" if spec.row_norm is not None and spec.row_norm.center else ""
    dst = (f"As[{at}kk * {t.a_stride} + mm] = ra[r]{shift};" if which == "a"
           else f"Bs[{at}kk * {t.b_stride} + nn] = rb[r];")
    return [*_walk(t, which, spec), f"    {dst}", "}"]


def _runs_of_four(t: Tiling, which: str) -> bool:
    """Whether the vector template gives a thread its A rows (B columns) in runs of four."""
    return t.vec and (t.tm if which == "a" else t.tn) % 4 == 0


def _thread_axis(t: Tiling, which: str) -> tuple[int, str, int]:
    """(outputs a thread has along A's rows or B's columns, its index variable there, threads
    along it)."""
    n = t.tm if which == "a" else t.tn
    return n, ("ty" if which == "a" else "tx"), (t.bm if which == "a" else t.bn) // n


def _owned(t: Tiling, which: str, i: str) -> str:
    """The tile row (A) or column (B) of a thread's i-th output (a C expression of `i` and the
    thread's `ty` / `tx`). The scalar template strides them by the thread grid (ty + i·rows: a
    warp's reads are broadcasts or consecutive); the vector one, where the count is a multiple of
    four, takes runs of four (run i/4 at i/4·4·rows + ty·4), so that one float4 read fetches four."""
    _, r, grid = _thread_axis(t, which)
    if not _runs_of_four(t, which):
        return f"{r} + {i} * {grid}"
    return f"({i} / 4) * {4 * grid} + {r} * 4 + {i} % 4"


def _fragment(t: Tiling, which: str, tile: str) -> list[str]:
    """A thread's operands of one kk from shared tile `tile` into `a[]` (`b[]`): float4 reads
    in the vector template (LOAD4_LOCAL), scalar ones otherwise."""
    n, r, grid = _thread_axis(t, which)
    reg, stride = which, (t.a_stride if which == "a" else t.b_stride)
    if not _runs_of_four(t, which):
        return ["#pragma unroll",
                f"for (int i = 0; i < {n}; ++i) {reg}[i] = {tile}[kk * {stride} + {_owned(t, which, 'i')}];"]
    out = []
    for g in range(n // 4):
        out.append(f"{{ const float4 v = LOAD4_LOCAL({tile} + kk * {stride} + {g * 4 * grid} + {r} * 4); "
                   + " ".join(f"{reg}[{4 * g + q}] = v.{c};" for q, c in enumerate("xyzw")) + " }")
    return out


def gemm_source(name: str, spec: GemmSpec, t) -> str:
    """The rOperator text of tiling `t`: a SIMT Tiling here, or a tensor-core MmaTiling
    (kernels/gemm_mma.py); each tiling knows its template."""
    return t.source(name, spec)


def _k_loop(t, K: int) -> tuple[list[str], str]:
    """The k loop's head (opening its body) and the condition for staging the next step: over all
    of K unsplit; over this rTask's chunk when split, a constant trip count from the chunk's first
    k (kernels/splitk.py), so that no loop bound reads the block index."""
    if t.splitk == 1:
        return [f"for (int k0 = 0; k0 < {K}; k0 += {t.bk}) {{"], f"k0 + {t.bk} < {K}"
    steps = sk.steps_per_chunk(t, K)
    return ([f"for (int ks = 0; ks < {steps}; ++ks) {{",
             f"    const int k0 = {sk.chunk_start(t, K)} + ks * {t.bk};"],
            f"ks + 1 < {steps}")  # (past K, the guarded loads stage zeros: the last chunk may be ragged)


def _products(t: Tiling, a_tile: str, b_tile: str) -> list[str]:
    """One k step's arithmetic over the shared tiles: per kk, the thread's fragments, then its
    tm x tn FMAs."""
    return [
        "K_UNROLL",
        f"for (int kk = 0; kk < {t.bk}; ++kk) {{",
        f"    float a[{t.tm}], b[{t.tn}];",
        *_indent(_fragment(t, "a", a_tile), 4),
        *_indent(_fragment(t, "b", b_tile), 4),
        "    #pragma unroll",
        f"    for (int i = 0; i < {t.tm}; ++i) {{",
        "        #pragma unroll",
        f"        for (int j = 0; j < {t.tn}; ++j) acc[i][j] += a[i] * b[j];",
        "    }",
        "}",
    ]


def _k_steps(t: Tiling, spec: GemmSpec) -> list[str]:
    """The k loop, software-pipelined through registers so that step k+1's global loads are in
    flight during step k's arithmetic.

    The scalar template has one shared stage: commit the staged step, barrier, stage the next,
    compute, barrier (two barriers a step). The vector template has two: the first step is
    committed before the loop, and each step stages the next, computes on its stage, commits the
    next into the other stage and passes one barrier. That is safe because the other stage was
    last read in the previous step, before that step's barrier."""
    k_loop, next_step = _k_loop(t, spec.K)
    nxt = [*_stage(t, "a", f"(k0 + {t.bk})", spec), *_stage(t, "b", f"(k0 + {t.bk})", spec)]

    def stats(tile: str) -> list[str]:  # a folded LayerNorm's row sums over the landed A tile
        if spec.row_norm is None:
            return []
        return _indent(row_norm.accumulate(t, spec.K, lambda r, c: f"({c}) * {t.a_stride} + ({r})",
                                           lambda off: f"{tile}[{off}]", "k0"), 4)
    if not t.vec:
        return [*k_loop, *_indent(_commit(t, "a", spec), 4), *_indent(_commit(t, "b", spec), 4), "    BARRIER();",
                f"    if ({next_step}) {{", *_indent(nxt, 8), "    }", *stats("As"),
                *_indent(_products(t, "As", "Bs"), 4), "    BARRIER();", "}"]
    a_size, b_size = t.bk * t.a_stride, t.bk * t.b_stride
    return [*_commit(t, "a", spec), *_commit(t, "b", spec), "BARRIER();", "int stg = 0;", *k_loop,
            f"    if ({next_step}) {{", *_indent(nxt, 8), "    }",
            f"    LPTR const float* Ac = As + stg * {a_size};",
            f"    LPTR const float* Bc = Bs + stg * {b_size};", *stats("Ac"),
            *_indent(_products(t, "Ac", "Bc"), 4),
            f"    if ({next_step}) {{",
            *_indent(_commit(t, "a", spec, f"(stg ^ 1) * {a_size}"), 8),
            *_indent(_commit(t, "b", spec, f"(stg ^ 1) * {b_size}"), 8),
            "    }", "    BARRIER();", "    stg ^= 1;", "}"]


def simt_gemm_source(name: str, spec: GemmSpec, t: Tiling) -> str:
    """The SIMT rOperator text (the scalar or the vector template, by t.vec; _k_steps)."""
    tiles_m, tiles_n = -(-spec.M // t.bm), -(-spec.N // t.bn)
    T = t.threads
    cols = t.bn // t.tn
    arg_names = [p.split()[-1].lstrip("*") for p in spec.params]
    per_a, per_b = _per_thread(t, "a")[1], _per_thread(t, "b")[1]
    store = spec.store("m", "n", "acc[i][j]")
    rn = spec.row_norm  # a LayerNorm folded into this GEMM (kernels/row_norm.py)
    assert rn is None or row_norm.supported(t, spec), (t.name, "row_norm")
    dev = [
        f"DEVICE void {name}_task({', '.join(spec.params + sk.params(t))}, const int task, const int tid, LPTR float* smem) {{",
        f"    LPTR float* As = smem;",
        f"    LPTR float* Bs = smem + {t.stages * t.bk * t.a_stride};",
        *_indent(sk.tile_decode(t, tiles_m, tiles_n), 4),
        f"    const int m0 = (tile / {tiles_n}) * {t.bm};",
        f"    const int n0 = (tile % {tiles_n}) * {t.bn};",
        f"    const int tx = tid % {cols}, ty = tid / {cols};",
        *_indent(spec.prologue or [], 4),
        f"    float acc[{t.tm}][{t.tn}];",
        f"    for (int i = 0; i < {t.tm}; ++i) for (int j = 0; j < {t.tn}; ++j) acc[i][j] = 0.0f;",
        f"    float ra[{per_a}], rb[{per_b}];",
        *_indent(_stage(t, "a", sk.chunk_start(t, spec.K), spec), 4),
        *_indent(_stage(t, "b", sk.chunk_start(t, spec.K), spec), 4),
        *_indent([*row_norm.declare(t, spec, shifted=True),
                  *(row_norm.stage_shifts(spec, t.bm, t.bk, T, per_a) if rn.center else [])] if rn else [], 4),
        *_indent(_k_steps(t, spec), 4),
        *_indent(sk.reduce_partials(t, t.tm, t.tn, T, stats=rn is not None), 4),
        *_indent(row_norm.finish(t, spec.K, rn) if rn else [], 4),
        *_indent(sk.guard_store(t, [
            f"#pragma unroll",
            f"for (int i = 0; i < {t.tm}; ++i) {{",
            f"    const int m = m0 + {_owned(t, 'a', 'i')};",
            f"    #pragma unroll",
            f"    for (int j = 0; j < {t.tn}; ++j) {{",
            f"        const int n = n0 + {_owned(t, 'b', 'j')};",
            f"        if (m < {spec.M} && n < {spec.N}) {{",
            *_indent(row_norm.apply(t, rn) if rn else [], 12),
            *_indent(store, 12),
            f"        }}",
            f"    }}",
            f"}}"]), 4),
        *(["    BARRIER();  /* the statistics are read before the next rTask reuses shared memory */"] if rn else []),
        f"}}",
        "",
        f"KERNEL void {name}({', '.join(spec.params + sk.params(t))}) {{",
        f"    SHARED float smem[{t.smem_floats}];",
        f"    {name}_task({', '.join(arg_names + sk.arg_names(t))}, BLOCK_ID, THREAD_ID, smem);",
        f"}}",
        "",
    ]
    return "\n".join(dev)


def gemm_precision(ctx) -> str:
    """The precision the current node's GEMM computes at: the compile's, or fp32 for an op type
    kept float32 (PipelineSpec.fp32_ops) or a node the import keeps float32 (Graph.float32_nodes)."""
    from ..ops.narrow import kept_float32

    if getattr(ctx, "node", None) is not None and kept_float32(ctx.node, getattr(ctx, "fp32_ops", ())):
        return "fp32"
    return getattr(ctx, "precision", "fp32")


def emit_gemm(ctx, hint: str, spec: GemmSpec, args: list[str], reads: list[str], writes: list[str],
              tiling: Tiling | None = None) -> str:
    """Pick a tiling for the target device, emit the rOperator and launch one block per rTask.
    At precisions tf32x3, tf32, fp16 and bf16 the tiling is a tensor-core one (kernels/gemm_mma.py)."""
    precision = gemm_precision(ctx)
    tuned = getattr(ctx, "gemm_tilings", None) or {}
    forced = getattr(ctx, "gemm_tiling", None) is not None and precision == "fp32"
    split = getattr(ctx, "split_k", True)  # `lower`'s option split_k
    if tiling is None and not forced and shape_key(spec.batch, spec.M, spec.N, spec.K) in tuned:
        # a tiling measured fastest for this problem (`--tune`), where it is of this precision's family
        want = tuned[shape_key(spec.batch, spec.M, spec.N, spec.K)]
        tiling = next((t for t in tiling_family_for(precision, ctx.device, split) if t.name == want), None)
    deep = None  # a DEEP tiling given up for a joinable one
    if tiling is None and precision != "fp32":
        from .gemm_mma import choose_mma_tiling

        problem = (spec.batch, spec.M, spec.N, spec.K)
        tiling = choose_mma_tiling(*problem, ctx.device, precision, split)
        unjoinable = getattr(ctx, "unjoinable_us", 0.0)
        if unjoinable and tiling.dynamic:  # a DEEP pick, where a later pass joins launches: price its own launch
            deep, tiling = tiling, choose_mma_tiling(*problem, ctx.device, precision, split, unjoinable)
            if tiling.dynamic:
                deep = None
            else:
                ctx.deep_declined.append(f"{shape_key(*problem)} {tiling.name}")
    if tiling is None:
        tiling = getattr(ctx, "gemm_tiling", None)
    if tiling is None:
        tiling = choose_tiling(spec.batch, spec.M, spec.N, spec.K, ctx.device, split)
    name = ctx.program.add_kernel(f"{hint}_{tiling.name}", lambda n: gemm_source(n, spec, tiling), tiling.threads,
                                  kind="gemm", tiling=tiling.name, pass_name=ctx.pass_name, math=tiling.math,
                                  **kernel_smem(tiling))
    extra = sk.launch_args(ctx, tiling, spec.batch, spec.M, spec.N, stats=spec.row_norm is not None)
    ctx.launch(name, tasks_for(tiling, spec.batch, spec.M, spec.N), list(args) + extra,
               reads=reads + sk.split_tensors(extra)[0], writes=writes + sk.split_tensors(extra)[1],
               flops=2 * spec.batch * spec.M * spec.N * spec.K,
               dram_bytes=sum(ctx.tensor(t).nbytes for t in set(reads) | set(writes)))
    L = ctx.program.launches[-1]
    sk.mark(L, extra, tiling, spec.batch, spec.M, spec.N)
    L.expr = GemmExpr(hint, spec, tiling, list(args), list(reads), list(writes), extra)
    L.deep_tiling = deep
    return name


def retile(ctx, L, t, kname: str, spec: GemmSpec, text, old_extra: list, pass_name: str) -> list:
    """Re-emit GEMM launch `L` with tiling `t` of its family: its kernel (named from `kname`;
    `text(name)` is the source), grid, and split-K workspace and counters in place of `old_extra`.
    Returns the new split-K arguments. (Rammer's per-wave tilings, and the DEEP ones it gives back.)"""
    name = ctx.program.add_kernel(kname, text, t.threads, kind="gemm", tiling=t.name,
                                  pass_name=pass_name, math=t.math, **kernel_smem(t))
    L.kernel, L.grid, L.block = name, tasks_for(t, spec.batch, spec.M, spec.N), t.threads
    old, extra = sk.tensors(old_extra), sk.launch_args(ctx, t, spec.batch, spec.M, spec.N, stats=spec.row_norm is not None)
    L.args = L.args[:len(L.args) - len(old_extra)] + sk.typed(extra)
    L.writes = [w for w in L.writes if w not in old] + sk.split_tensors(extra)[1]
    L.regions.pop(sk.COUNTERS, None)
    sk.mark(L, extra, t, spec.batch, spec.M, spec.N)
    return extra
