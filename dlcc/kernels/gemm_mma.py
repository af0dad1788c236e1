"""The tensor-core GEMM template (precisions tf32, tf32x3, fp16, bf16): the same rOperator contract as
kernels/gemm.py (GemmSpec's element loads, prologue and store; one BMxBN output tile per rTask,
emitted as `NAME_task(args..., task, tid, smem)` plus a thin KERNEL), with the k loop's arithmetic
done by warp-wide mma.sync instructions instead of per-thread FMAs: `m16n8k8` TF32, or `m16n8k16`
with fp16 or bf16 operands; float32 accumulation and output at every precision.

Layouts (PTX ISA "Matrix Fragments for mma.m16n8k8" .tf32 and "... mma.m16n8k16 with floating
point type"; g = lane / 4, t = lane % 4; (row, col) as (m, k) for A, (k, n) for B, (m, n) for C):
  tf32  A (16 x 8):   a0 (g, t)  a1 (g+8, t)  a2 (g, t+4)  a3 (g+8, t+4)
        B (8 x 8):    b0 (t, g)  b1 (t+4, g)
  half  A (16 x 16):  a0,a1 (g, 2t+{0,1})  a2,a3 (g+8, 2t+{0,1})  a4,a5 (g, 2t+8+{0,1})  a6,a7 (g+8, 2t+8+{0,1})
        B (16 x 8):   b0,b1 (2t+{0,1}, g)  b2,b3 (2t+8+{0,1}, g)
  both  C (16 x 8):   c0 (g, 2t) c1 (g, 2t+1) c2 (g+8, 2t) c3 (g+8, 2t+1)
A block of 8 warps splits the tile into WARPS_M x WARPS_N warp tiles, each MI x NI mma tiles of
16x8. A thread's accumulators form a (2*MI) x (2*NI) grid `acc[i][j]`, row i at m = (i/2)*16 +
(i%2)*8 + g and column j at n = (j/2)*8 + 2t + (j%2) of its warp tile, so the store loop has
the SIMT template's shape (`acc[i][j]` at (m, n)) and AStitch's fused epilogues work unchanged.

Shared memory: each operand tile is stored in the order its global loads walk, so that
consecutive threads store to consecutive banks, and padded so that the fragment reads are
conflict-free for TF32: k-contiguous operands as [x][k] rows of BK+4 floats (lanes g*(BK+4)+t hit
32 distinct banks), the others as [k][x] rows of extent+8 floats (t*(extent+8)+g likewise).
Values are rounded to the precision's operand type (TO_TF32, TO_F16, TO_BF16) once, as they are
stored; they stay floats in shared memory (the half-precision fragments read pairs, with 2-way
bank conflicts, and pack them as they go into the mma).

Every tiling has 256 threads, Rammer's vEU size, so Rammer runs these rTasks like the SIMT ones.
On OpenCL the mma is emulated through local memory (backends/prelude_opencl.h), which needs
MMA_EMU_FLOATS (192, m16n8k8) or MMA_EMU_FLOATS_K16 (384, m16n8k16) floats per warp; `smem_floats`
counts them, so the plan's shared memory is the OpenCL figure (6 or 12 KiB above what CUDA uses,
where both are 0).
"""
from __future__ import annotations

from dataclasses import dataclass

from . import splitk as sk
from .gemm import _indent, _k_loop, _per_thread_count, cheapest, tasks_for  # (gemm.py imports this module lazily)
from .program import copy_unroll

WARPS = 8
#: The precisions this template computes at, each with its mma: (k of one mma, operand rounding,
#: mma macro, OpenCL emulation scratch per warp in floats and its macro) (backends/prelude_*.h).
MMA_KINDS = {
    "tf32": (8, "TO_TF32", "MMA_TF32", 192, "MMA_EMU_FLOATS"),
    # float32 operands split into two TF32 values each, three mmas (backends/prelude_common.h)
    "tf32x3": (8, "TO_F32", "MMA_TF32X3", 192, "MMA_EMU_FLOATS"),
    "fp16": (16, "TO_F16", "MMA_F16", 384, "MMA_EMU_FLOATS_K16"),
    "bf16": (16, "TO_BF16", "MMA_BF16", 384, "MMA_EMU_FLOATS_K16"),
}
#: The precisions whose operands are 32 bits wide in shared memory (floats; the async template's
#: padded layout, kernels/gemm_mma_async.py) rather than 16.
WIDE = ("tf32", "tf32x3")
#: mma instructions per m16n8k8/k16 product at each precision (tf32x3: three).
MMAS_PER_PRODUCT = {"tf32x3": 3}


@dataclass(frozen=True)
class MmaTiling:
    bm: int
    bn: int
    bk: int
    warps_m: int
    warps_n: int
    precision: str = "tf32"
    #: 1: this module's template (operands staged through registers, float shared memory); 2 or
    #: more (fp16, bf16): kernels/gemm_mma_async.py's cp.async pipeline with that many buffers.
    stages: int = 1
    splitk: int = 1  # k chunks per output tile, each its own rTask (kernels/splitk.py)
    #: Hopper's warpgroup MMA from shared memory (kernels/gemm_wgmma.py; sm_90 only) instead of
    #: ldmatrix and mma.sync, on the same cp.async pipeline.
    wgmma: bool = False

    def __post_init__(self):
        assert self.warps_m * self.warps_n == WARPS and self.precision in MMA_KINDS
        assert self.bm % (16 * self.warps_m) == 0 and self.bn % (8 * self.warps_n) == 0 and self.bk % self.kstep == 0
        assert self.stages == 1 or (self.bk % 16 == 0 or self.precision in WIDE) and self.bm % 8 == 0
        if self.wgmma:
            from .gemm_wgmma import check_tiling

            check_tiling(self)

    @property
    def kstep(self) -> int:
        """k of one mma: 8 (TF32) or 16 (fp16, bf16)."""
        return MMA_KINDS[self.precision][0]

    @property
    def wide(self) -> bool:
        """Whether its operands are floats in shared memory (tf32, tf32x3), not 16-bit values."""
        return self.precision in WIDE

    @property
    def a_frag(self) -> int:
        """A elements a lane holds per mma (B holds half as many)."""
        return self.kstep // 2

    @property
    def threads(self) -> int:
        return 32 * WARPS

    @property
    def mi(self) -> int:
        """16-row mma tiles per warp."""
        return self.bm // self.warps_m // 16

    @property
    def ni(self) -> int:
        """8-column mma tiles per warp."""
        return self.bn // self.warps_n // 8

    def operand_floats(self, which: str) -> int:
        """Shared floats of operand `which`'s tile: the more of its two layouts (module docstring)."""
        ext = self.bm if which == "a" else self.bn
        return max(ext * (self.bk + 4), self.bk * (ext + 8))

    @property
    def tile_floats(self) -> int:
        """Both operand tiles, every stage's: 16-bit values two to a float in the async
        template at fp16/bf16; floats in padded rows otherwise (operand_floats)."""
        if self.wgmma:
            from .gemm_wgmma import tile_floats

            return tile_floats(self)
        if self.stages > 1 and not self.wide:
            return self.stages * (self.bm + self.bn) * self.bk // 2
        return self.stages * (self.operand_floats("a") + self.operand_floats("b"))

    @property
    def smem_floats(self) -> int:
        """The operand tiles, plus the OpenCL emulation's scratch (none for wgmma, whose emulation
        reads the operands through the descriptors)."""
        return self.tile_floats + (0 if self.wgmma else WARPS * MMA_KINDS[self.precision][3])

    @property
    def cuda_smem_bytes(self) -> int:
        """Shared memory one block takes on CUDA, where the mma needs no emulation scratch."""
        return 4 * self.tile_floats

    @property
    def dynamic(self) -> bool:
        """Whether its shared memory is over CUDA's 48 KiB of static shared memory, so that its
        kernel declares it dynamic and is launched with the size, after opting in to it
        (DEEP_TILINGS; CudaRuntime.set_dynamic_smem)."""
        return self.cuda_smem_bytes > STATIC_SMEM_BYTES

    @property
    def math(self) -> str:
        return self.precision

    @property
    def name(self) -> str:
        base = f"tc{self.bm}x{self.bn}x{self.bk}_w{self.warps_m}x{self.warps_n}"
        base = base if self.stages == 1 else f"{base}_s{self.stages}"
        base = base if self.precision == "tf32" else f"{base}_{self.precision}"
        return base + ("_wg" if self.wgmma else "") + sk.suffix(self.splitk)

    def source(self, name: str, spec) -> str:
        if self.wgmma:
            from .gemm_wgmma import wgmma_source

            return wgmma_source(name, spec, self)
        if self.stages > 1:
            from .gemm_mma_async import async_mma_source

            return async_mma_source(name, spec, self)
        return mma_gemm_source(name, spec, self)


#: The tensor-core rKernels (TF32; mma_tilings() gives them at each precision): large tiles for
#: large GEMMs, then smaller ones that fill an H100's 132 SMs on batch-1 shapes (BERT's 128 x 768
#: GEMMs are 12 tiles of 128x64 but 48 of 32x64).
MMA_TILINGS = (
    MmaTiling(128, 128, 32, 2, 4),
    MmaTiling(128, 64, 32, 4, 2),
    MmaTiling(64, 128, 32, 2, 4),
    MmaTiling(64, 64, 32, 2, 4),
    MmaTiling(32, 64, 32, 2, 4),
    MmaTiling(32, 64, 64, 2, 4),
    MmaTiling(16, 64, 64, 1, 8),
)


#: The fp16/bf16 rKernels (kernels/gemm_mma_async.py): the same range of tile shapes, each with
#: as many stages as fit CUDA's 48 KiB of static shared memory beside OpenCL's emulation scratch
#: (12 KiB), so a plan's shared memory is the same figure on both targets.
ASYNC_TILINGS = (
    MmaTiling(128, 128, 32, 2, 4, "fp16", 2),
    MmaTiling(128, 64, 32, 4, 2, "fp16", 3),
    MmaTiling(64, 128, 32, 2, 4, "fp16", 3),
    MmaTiling(64, 64, 32, 2, 4, "fp16", 4),
    MmaTiling(32, 64, 32, 2, 4, "fp16", 4),
    MmaTiling(32, 64, 64, 2, 4, "fp16", 3),
    MmaTiling(16, 64, 64, 1, 8, "fp16", 3),
)


#: The tf32 and tf32x3 rKernels of the async template (kernels/gemm_mma_async.py: cp.async of
#: float32 operands in 16-byte chunks of four, ldmatrix of k-contiguous ones), each with as many
#: stages as fit 48 KiB beside OpenCL's emulation scratch (6 KiB). Floats take twice the bytes of
#: the fp16/bf16 buffers, so the k blocks are half as deep for as many stages. On the H200 the
#: register-staged template above ran 1.4-2.2x slower at tf32 than this pipeline at bf16 on the
#: same shapes (docs/gemm.md), which is why tf32 has these too; the cost model chooses.
TF32_ASYNC_TILINGS = (
    MmaTiling(128, 128, 16, 2, 4, "tf32", 2),
    MmaTiling(128, 64, 16, 4, 2, "tf32", 2),
    MmaTiling(64, 128, 16, 2, 4, "tf32", 2),
    MmaTiling(64, 64, 32, 2, 4, "tf32", 2),
    MmaTiling(64, 64, 16, 2, 4, "tf32", 4),
    MmaTiling(32, 64, 32, 2, 4, "tf32", 3),
    MmaTiling(32, 64, 16, 2, 4, "tf32", 5),
    MmaTiling(16, 64, 32, 1, 8, "tf32", 3),
)


#: CUDA's static shared memory per block; more is dynamic, opted in per kernel.
STATIC_SMEM_BYTES = 48 * 1024

#: Deeper fp16/bf16 pipelines in dynamic shared memory (sm_80 and later hold up to 163-227 KiB a
#: block): 4 to 8 stages of 64-wide k blocks, so that more of a batch-1 GEMM's loads are in
#: flight at once. The H200 measured the 48 KiB tilings latency-bound (docs/gemm.md: about 0.9 µs
#: per k step on 128x3072x768, where DRAM and L2 bandwidth allow a fraction of it), and more loads
#: in flight per step is what shortens that chain. They are kept out of persistent kernels, whose
#: shared array is static (passes/rammer.py), unless the device spec lets persistent kernels take
#: dynamic shared memory (`persistent_dynamic_smem`), and are chosen by the cost model only on a device
#: spec that says they were measured faster there (`gemm_deep_pipelines`: the h100 spec, after an
#: H200 ran them fastest on every shape timed); `--tune` and scripts/gemm_tilings.py time
#: them wherever the device's shared memory holds them.
DEEP_TILINGS = (
    MmaTiling(128, 128, 64, 2, 4, "fp16", 4),
    MmaTiling(128, 64, 64, 4, 2, "fp16", 4),
    MmaTiling(64, 128, 64, 2, 4, "fp16", 4),
    MmaTiling(64, 64, 64, 2, 4, "fp16", 4),
    MmaTiling(32, 64, 64, 2, 4, "fp16", 6),
    MmaTiling(16, 64, 64, 1, 8, "fp16", 8),
)


#: The same for tf32 and tf32x3 (floats: 32-wide k blocks): 3 to 8 stages, 72-108 KiB a block.
TF32_DEEP_TILINGS = (
    MmaTiling(128, 128, 32, 2, 4, "tf32", 3),
    MmaTiling(128, 64, 32, 4, 2, "tf32", 4),
    MmaTiling(64, 128, 32, 2, 4, "tf32", 4),
    MmaTiling(64, 64, 32, 2, 4, "tf32", 4),
    MmaTiling(32, 64, 32, 2, 4, "tf32", 6),
    MmaTiling(16, 64, 32, 1, 8, "tf32", 8),
)


def mma_tilings(precision: str = "tf32", deep: bool = False) -> tuple[MmaTiling, ...]:
    """The tensor-core tilings at `precision`: MMA_TILINGS and TF32_ASYNC_TILINGS for tf32, the
    latter but 128x128 for tf32x3, ASYNC_TILINGS for fp16 and bf16 (each k step a whole number of the
    precision's mmas), and with `deep` DEEP_TILINGS (fp16 and bf16) or TF32_DEEP_TILINGS too."""
    if precision == "tf32x3":
        # Not the register-staged template (it spilled at 128x64 and up with the split fragments),
        # nor the 128x128 tile (its 64 accumulators beside the split A and B fragments spilled as
        # a persistent kernel's call site on sm_80: a convolution of the cnn test model).
        base = tuple(t for t in TF32_ASYNC_TILINGS + (TF32_DEEP_TILINGS if deep else ()) if t.bm * t.bn < 128 * 128)
    elif precision == "tf32":
        base = MMA_TILINGS + TF32_ASYNC_TILINGS + (TF32_DEEP_TILINGS if deep else ())
    else:
        base = ASYNC_TILINGS + (DEEP_TILINGS if deep else ())
    return tuple(MmaTiling(t.bm, t.bn, t.bk, t.warps_m, t.warps_n, precision, t.stages) for t in base)


def deep_tilings_fit(device) -> bool:
    """Whether `device` can hold DEEP_TILINGS' and TF32_DEEP_TILINGS' dynamic shared memory: a GPU whose per-block
    shared memory (with the opt-in carve-out) holds the largest of them. A CPU device (PoCL) runs
    them too, but nothing is gained there."""
    return (getattr(device, "kind", "gpu") == "gpu"
            and getattr(device, "shared_mem_per_block", 0) >= max(t.cuda_smem_bytes
                                                                  for t in DEEP_TILINGS + TF32_DEEP_TILINGS))


def chooses_deep(device) -> bool:
    """Whether the cost model picks among DEEP_TILINGS on `device`: where they fit and the device
    spec says they were measured faster there (`gemm_deep_pipelines`)."""
    return deep_tilings_fit(device) and bool(getattr(device, "gemm_deep_pipelines", False))


#: Cost-model constants, fitted to the ranking of 318 tensor-core GEMMs timed on an H200 (sm_90,
#: 132 SMs; scripts/data/h200_gemm_bf16.json and h200_gemm_tf32.json: every tiling, split and
#: unsplit, on BERT-base's linear layers, a ResNet-50 convolution, GPT-2's LM head and 1024^3).
#: Those GEMMs are latency-bound at batch 1: the time follows the k loop's chain of dependent
#: steps, not the mma issue rate. So the step latency sets the ranking; the register-staged
#: template (tf32) also pays, per step, for each operand element a thread moves through its
#: registers (STAGE_CYCLES); and a split tile's last rTask reads the partial sums back one chunk
#: at a time (SPLIT_READ_CYCLES per accumulator and chunk). Before this fit the model picked
#: large split tiles (128x64, 8 chunks) that ran 1.56x (bf16) and 1.36x (tf32) slower than the
#: fastest tiling; now the pick is within 1.07x (bf16) and 1.20x (tf32) on every recorded shape.
#: The second H200 record (2026-11-27: the DEEP tilings and tf32 on cp.async, 208 bf16 and 224
#: tf32 GEMMs) refitted ASYNC_STEP_LATENCY, SPLIT_READ_CYCLES and FILL_STEPS: the picks there are
#: within 1.13x (bf16) and 1.08x (tf32), and the first record's still within 1.07x and 1.22x
#: (tests/test_gemm_mma.py holds both). Their µs per cycle is fitted apart, on the same rows: the
#: device's mma_cycle_us (estimate/costmodel.py cycle_us).
MMA_PER_CYCLE = 4.0
STEP_LATENCY = 400
ASYNC_STEP_LATENCY = 350
STAGE_CYCLES = 64
SPLIT_READ_CYCLES = 30
#: The cp.async pipeline's fill, in step latencies, whatever its depth: the prologue issues every
#: stage's copies back to back, so they wait out their latency together, not one after another.
#: Refitted (with ASYNC_STEP_LATENCY and SPLIT_READ_CYCLES) once the DEEP tilings (4-8 stages)
#: were timed on an H200 (2026-11-27, scripts/data/h200-2026-11-27/gemm_bf16.json): priced at one
#: latency per stage, the model never picked 6 or 8 stages, and its pick for BERT's 128x768x768
#: ran 1.41x slower than the 8-stage 16x64 tiling; now it picks that one, except where a later
#: pass would join the GEMM into a persistent kernel and the saving is under a launch's cost
#: (choose_mma_tiling's unjoinable_us).
FILL_STEPS = 2.0


#: Which of DeviceSpec.mma_cycle_us's fitted µs-per-cycle scales prices a tiling (scale_key), and
#: what stands in where the device has none: tf32 on the cp.async pipeline is that pipeline's
#: code (fitted at bf16), not the register-staged tf32 template's, and tf32x3 is the same again.
SCALE_FALLBACK = {"tf32_async": ("tf32_async", "bf16"), "tf32x3": ("tf32x3", "tf32_async", "bf16")}


def scale_key(t: MmaTiling) -> str:
    """The mma_cycle_us key whose scale turns tiling `t`'s modelled cycles into µs."""
    return "tf32_async" if t.precision == "tf32" and t.stages > 1 else t.precision


def mma_scale(key: str, device) -> float | None:
    """`device`'s µs per modelled cycle for scale `key` (SCALE_FALLBACK), None where it has none."""
    scales = getattr(device, "mma_cycle_us", None) or {}
    return next((scales[k] for k in SCALE_FALLBACK.get(key, (key,)) if k in scales), None)


def _template_weight(t: MmaTiling, device) -> float:
    """tf32's two templates were fitted apart, so their cycles are not alike: an async tiling's
    are weighed in the register-staged template's units (its scale over tf32's), so that the
    tiling choice, Rammer's and the estimate compare them as µs. 1 elsewhere, or uncalibrated."""
    if scale_key(t) != "tf32_async":
        return 1.0
    mine, staged = mma_scale("tf32_async", device), mma_scale("tf32", device)
    return mine / staged if mine and staged else 1.0


def mma_cost(t: MmaTiling, batch: int, M: int, N: int, K: int, device=None) -> float:
    """Modelled cycles, in the form of kernels/gemm.py tiling_cost: the larger of an SM's issue
    time (mma instructions, fragment and operand traffic, loop overhead) and its latency chain
    (rounds of co-resident blocks x k steps x one step's latency)."""
    if t.wgmma:
        from .gemm_wgmma import wgmma_cost

        return wgmma_cost(t, batch, M, N, K, device)
    if t.stages > 1:
        return _async_cost(t, batch, M, N, K, device) * _template_weight(t, device)
    sms = getattr(device, "sms", 80)
    per_sm = -(-tasks_for(t, batch, M, N) // sms)
    steps = sk.steps_per_chunk(t, K)
    mmas = (t.bm // 16) * (t.bn // 8) * (t.bk // t.kstep) * MMAS_PER_PRODUCT.get(t.precision, 1)
    # fragment loads from shared memory (warp instructions)
    frag = WARPS * (t.bk // t.kstep) * (t.a_frag * t.mi + t.a_frag // 2 * t.ni)
    moves = 3 * (t.bm + t.bn) * t.bk / 32  # global load, operand rounding, shared store (warp instructions)
    issue = mmas / MMA_PER_CYCLE + (frag + moves + 20 * WARPS) / 2.0
    # registers per thread, fitted to ptxas on sm_90 (113 to 240 over MMA_TILINGS): accumulators,
    # fragments and the staged next k step, which the register pipeline keeps live twice over
    staged = (t.bm + t.bn) * t.bk // t.threads  # operand elements a thread moves per k step
    regs = 48 + 6 * t.mi * t.ni + 4 * t.mi + 2 * t.ni + 2 * staged
    chain = steps * (STEP_LATENCY + STAGE_CYCLES * staged)
    return max(per_sm * steps * issue, -(-per_sm // _occupancy(t, regs, device)) * chain) + _split_read(t, per_sm)


def _split_read(t: MmaTiling, per_sm: int) -> float:
    """Cycles of split-K's reduction on an SM (kernels/splitk.py): the tile's last rTask reads the
    S partial sums back one chunk at a time, each thread its accumulators. Zero unsplit.
    (Charging only one rTask in S for the reads fits the big shapes' absolute times better, 2.4x
    against 4x at worst, but prices a split GEMM's SM time so low that Rammer stopped joining
    BERT-base's waves at bf16: 13 persistent kernels became 1, against the measured plan.)"""
    return per_sm * SPLIT_READ_CYCLES * t.splitk * (t.bm * t.bn // t.threads) if t.splitk > 1 else 0.0


def _occupancy(t: MmaTiling, regs: int, device) -> int:
    """Co-resident blocks of tiling `t` per SM at `regs` registers per thread."""
    return max(1, min(getattr(device, "max_blocks_per_sm", 32), getattr(device, "max_threads_per_sm", 2048) // t.threads,
                      getattr(device, "registers_per_sm", 65536) // (regs * t.threads),
                      getattr(device, "shared_mem_per_sm", 233472) // (4 * t.smem_floats)))


def _async_cost(t: MmaTiling, batch: int, M: int, N: int, K: int, device=None) -> float:
    """mma_cost of an async tiling: the issue time counts ldmatrix and cp.async instructions in
    place of scalar fragment reads and register staging, and the k loop's latency is paid once
    per round of resident blocks plus a share per step that the stages in flight hide."""
    sms = getattr(device, "sms", 80)
    per_sm = -(-tasks_for(t, batch, M, N) // sms)
    steps = sk.steps_per_chunk(t, K)
    ksteps = t.bk // t.kstep
    mmas = (t.bm // 16) * (t.bn // 8) * ksteps * MMAS_PER_PRODUCT.get(t.precision, 1)
    ldsm = WARPS * ksteps * (t.mi + -(-t.ni // 2))
    copies = (t.bm + t.bn) * t.bk / (4 if t.wide else 8) / 32  # 16-byte chunks, a warp's 32 at a time
    issue = mmas / MMA_PER_CYCLE + (ldsm + copies + 20 * WARPS) / 2.0
    regs = 48 + 4 * t.mi * t.ni + 4 * t.mi + 2 * t.ni
    rounds = -(-per_sm // _occupancy(t, regs, device))
    return (max(per_sm * steps * issue, rounds * (steps / (t.stages - 1) + FILL_STEPS) * ASYNC_STEP_LATENCY)
            + _split_read(t, per_sm))


def choose_mma_tiling(batch: int, M: int, N: int, K: int, device=None, precision: str = "tf32",
                      split: bool = True, unjoinable_us: float = 0.0) -> MmaTiling:
    """The tensor-core tiling at `precision` with the lowest modelled time (mma_cost), split along K
    where that pays on a GPU (kernels/splitk.py) unless `split` is off. `unjoinable_us` is added to
    the DEEP tilings' time (dynamic shared memory, which a persistent kernel gives an rTask only on
    a spec with `persistent_dynamic_smem`): the launch they keep to themselves where the pipeline
    joins launches (passes/lower.py _unjoinable_us, 0 on such a spec)."""

    def cost(t, *a):
        c = mma_cost(t, *a)
        if unjoinable_us and t.dynamic:
            scale = mma_scale(scale_key(t), device)
            c += unjoinable_us / scale if scale else 0.0
        return c

    return cheapest(sk.variants(mma_family(precision, device, chooses_deep(device), chooses_wgmma(device)),
                                device, split), cost, batch, M, N, K, device)


def mma_family(precision: str, device=None, deep: bool = False, wgmma: bool | None = None) -> tuple[MmaTiling, ...]:
    """mma_tilings(precision, deep), followed by the wgmma tilings (kernels/gemm_wgmma.py) where
    `wgmma` says so (None: wherever `device` can run them, an sm_90 GPU)."""
    from .gemm_wgmma import wgmma_fits, wgmma_tilings

    wgmma = wgmma_fits(device) if wgmma is None else wgmma
    return mma_tilings(precision, deep) + (wgmma_tilings(precision) if wgmma else ())


def chooses_wgmma(device) -> bool:
    """Whether the cost model picks among the wgmma tilings on `device` (kernels/gemm_wgmma.py)."""
    from .gemm_wgmma import chooses_wgmma as chooses

    return chooses(device)


def _addr(t: MmaTiling, which: str, k_contiguous: bool, x: str, k: str) -> str:
    """Where operand element (x, k) of the tile (x: m for A, n for B) lives in its shared array."""
    ext = t.bm if which == "a" else t.bn
    return f"({x}) * {t.bk + 4} + ({k})" if k_contiguous else f"({k}) * {ext + 8} + ({x})"


def _walk(t: MmaTiling, which: str, k_contiguous: bool, pragma: str = "#pragma unroll") -> list[str]:
    """A thread's share of one k step's A (or B) tile, split along the contiguous dimension so that
    consecutive threads load consecutive addresses (`xx` the tile row, `kk` the k offset)."""
    ext = t.bm if which == "a" else t.bn
    n_el = ext * t.bk
    per = _per_thread_count(n_el, t.threads)
    split = (f"const int xx = l / {t.bk}, kk = l % {t.bk};" if k_contiguous
             else f"const int kk = l / {ext}, xx = l % {ext};")
    guard = [] if n_el % t.threads == 0 else [f"    if (l >= {n_el}) continue;"]
    return [pragma, f"for (int r = 0; r < {per}; ++r) {{", f"    const int l = tid + r * {t.threads};",
            *guard, f"    {split}"]


def _stage(t: MmaTiling, which: str, k0: str, spec, kc: bool) -> list[str]:
    if which == "a":
        stmts, val = spec.load_a("m", "k")
        where = [f"const int m = m0 + xx, k = {k0} + kk;", f"if (m < {spec.M} && k < {spec.K}) {{"]
    else:
        stmts, val = spec.load_b("k", "n")
        where = [f"const int k = {k0} + kk, n = n0 + xx;", f"if (k < {spec.K} && n < {spec.N}) {{"]
    return [*_walk(t, which, kc, copy_unroll(stmts, val)), f"    {where[0]}", "    float val = 0.0f;",
            f"    {where[1]}", *_indent(stmts, 8), f"        val = {val};", "    }", f"    r{which}[r] = val;", "}"]


def _commit(t: MmaTiling, which: str, kc: bool) -> list[str]:
    arr = "As" if which == "a" else "Bs"
    rnd = MMA_KINDS[t.precision][1]
    return [*_walk(t, which, kc), f"    {arr}[{_addr(t, which, kc, 'xx', 'kk')}] = {rnd}(r{which}[r]);", "}"]


def _fragment_k(t: MmaTiling) -> list[str]:
    """The k offset (from `kk`) of each A fragment element of a lane (module docstring); B's
    elements take the same k offsets as A's first row, in order."""
    if t.kstep == 8:
        return ["mma_t", "mma_t", "mma_t + 4", "mma_t + 4"]
    return [f"2 * mma_t + {d}" for d in (0, 1, 0, 1, 8, 9, 8, 9)]


def _fragment_rows(t: MmaTiling) -> list[int]:
    """The row offset (0 or 8, from the mma tile's first row) of each A fragment element."""
    return [0, 8, 0, 8] if t.kstep == 8 else [0, 0, 8, 8, 0, 0, 8, 8]


def zero_accumulators(MI: int, NI: int) -> list[str]:
    """A thread's accumulator grid `acc[2MI][2NI]` (module docstring), zeroed."""
    return [f"    float acc[{2 * MI}][{2 * NI}];", "    #pragma unroll", f"    for (int i = 0; i < {2 * MI}; ++i) {{",
            "        #pragma unroll", f"        for (int j = 0; j < {2 * NI}; ++j) acc[i][j] = 0.0f;", "    }"]


def store_accumulators(spec, t: "MmaTiling") -> list[str]:
    """Each accumulator through the op's store (and AStitch's epilogue) at its (m, n), inside
    the matrix: the mma C fragment layout, c0..c3 at (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)
    (`mma_g`, `mma_t` are the caller's: g = lane / 4, t = lane % 4). Split along K, the partial
    sums are added up first and the tile's last rTask alone stores (kernels/splitk.py)."""
    MI, NI = t.mi, t.ni
    rn = getattr(spec, "row_norm", None)  # a folded LayerNorm: its statistics once the sums are whole
    if rn is not None:
        from .row_norm import finish
    return [*_indent(sk.reduce_partials(t, 2 * MI, 2 * NI, t.threads, stats=rn is not None), 4),
            *_indent(finish(t, spec.K, rn) if rn is not None else [], 4),
            *_indent(sk.guard_store(t, [line[4:] for line in _store_loop(spec, t, MI, NI)]), 4)]


def _row_norm(spec, t) -> list[str]:
    """A folded LayerNorm's normalisation of the accumulator at (m, n) (kernels/row_norm.py)."""
    if getattr(spec, "row_norm", None) is None:
        return []
    from .row_norm import apply

    return apply(t, spec.row_norm)


def _store_loop(spec, t, MI: int, NI: int) -> list[str]:
    return ["    #pragma unroll",
            f"    for (int i = 0; i < {2 * MI}; ++i) {{",
            "        const int m = m0 + mma_wm0 + (i / 2) * 16 + (i % 2) * 8 + mma_g;",
            "        #pragma unroll", f"        for (int j = 0; j < {2 * NI}; ++j) {{",
            "            const int n = n0 + mma_wn0 + (j / 2) * 8 + 2 * mma_t + (j % 2);",
            f"            if (m < {spec.M} && n < {spec.N}) {{", *_indent(_row_norm(spec, t), 16),
            *_indent(spec.store("m", "n", "acc[i][j]"), 16),
            "            }", "        }", "    }"]


def mma_loops(mma: str, MI: int, NI: int, frag_args: str) -> list[str]:
    """One k step's mmas over the warp's MI x NI tiles, each into its four accumulators."""
    return ["MMA_UNROLL", f"for (int mi = 0; mi < {MI}; ++mi) {{", "    MMA_UNROLL",
            f"    for (int ni = 0; ni < {NI}; ++ni) {{",
            f"        {mma}(acc[2 * mi][2 * ni], acc[2 * mi][2 * ni + 1], acc[2 * mi + 1][2 * ni],",
            f"              acc[2 * mi + 1][2 * ni + 1], {frag_args});", "    }", "}"]


def thin_kernel(name: str, spec, smem_floats: str, t: "MmaTiling") -> list[str]:
    """The KERNEL that runs one rTask per block on `smem_floats` floats of shared memory (dynamic
    on CUDA for a DEEP tiling: launched with its size, CudaRuntime.set_dynamic_smem)."""
    arg_names = [p.split()[-1].lstrip("*") for p in spec.params] + sk.arg_names(t)
    smem = f"DYNAMIC_SHARED(float, smem, {smem_floats});" if t.dynamic else f"SHARED float smem[{smem_floats}];"
    return [f"KERNEL void {name}({', '.join(spec.params + sk.params(t))}) {{", f"    {smem}",
            f"    {name}_task({', '.join(arg_names)}, BLOCK_ID, THREAD_ID, smem);", "}", ""]


def task_head(name: str, spec, t: "MmaTiling") -> str:
    """The rTask's device function head: the op's parameters, split-K's, then the rTask's."""
    return f"DEVICE void {name}_task({', '.join(spec.params + sk.params(t))}, const int task, const int tid, LPTR float* smem) {{"


def mma_gemm_source(name: str, spec, t: MmaTiling) -> str:
    """The rOperator text; its k loop is software-pipelined through registers as the SIMT
    template's is (step k+1's global loads issued before step k's mma)."""
    assert getattr(spec, "row_norm", None) is None, "the register-staged template has no row_norm (kernels/row_norm.py)"
    tiles_m, tiles_n = -(-spec.M // t.bm), -(-spec.N // t.bn)
    akc, bkc = spec.a_k_contiguous, not spec.b_n_contiguous
    per_a, per_b = _per_thread_count(t.bm * t.bk, t.threads), _per_thread_count(t.bn * t.bk, t.threads)
    a_floats, b_floats = t.operand_floats("a"), t.operand_floats("b")
    wtm, wtn = t.bm // t.warps_m, t.bn // t.warps_n
    MI, NI = t.mi, t.ni
    fa = lambda dm, dk: f"As[{_addr(t, 'a', akc, f'mma_wm0 + mi * 16 + mma_g + {dm}', f'kk + {dk}')}]"  # noqa: E731
    fb = lambda dk: f"Bs[{_addr(t, 'b', bkc, 'mma_wn0 + ni * 8 + mma_g', f'kk + {dk}')}]"  # noqa: E731
    FA, FB = t.a_frag, t.a_frag // 2
    ks, rows = _fragment_k(t), _fragment_rows(t)
    b_ks = [k for k, r in zip(ks, rows) if r == 0]  # B's k offsets: A's along its first row
    _, _, mma, _, emu_macro = MMA_KINDS[t.precision]
    frag_args = ", ".join([f"mma_af[mi][{e}]" for e in range(FA)] + [f"mma_bf[ni][{e}]" for e in range(FB)])
    k_loop, next_step = _k_loop(t, spec.K)
    src = [
        task_head(name, spec, t),
        "    LPTR float* As = smem;",
        f"    LPTR float* Bs = smem + {a_floats};",
        "    const int mma_lane = tid % 32, mma_warp = tid / 32;",
        f"    LPTR float* mma_scr = smem + {a_floats + b_floats} + mma_warp * {emu_macro};  /* OpenCL's emulation */",
        "    (void)mma_scr;",
        *_indent(sk.tile_decode(t, tiles_m, tiles_n), 4),
        f"    const int m0 = (tile / {tiles_n}) * {t.bm};",
        f"    const int n0 = (tile % {tiles_n}) * {t.bn};",
        f"    const int mma_wm0 = (mma_warp / {t.warps_n}) * {wtm}, mma_wn0 = (mma_warp % {t.warps_n}) * {wtn};",
        "    const int mma_g = mma_lane / 4, mma_t = mma_lane % 4;",
        *_indent(spec.prologue or [], 4),
        *zero_accumulators(MI, NI),
        f"    float ra[{per_a}], rb[{per_b}];",
        *_indent(_stage(t, "a", sk.chunk_start(t, spec.K), spec, akc), 4),
        *_indent(_stage(t, "b", sk.chunk_start(t, spec.K), spec, bkc), 4),
        *_indent(k_loop, 4),
        *_indent(_commit(t, "a", akc), 8),
        *_indent(_commit(t, "b", bkc), 8),
        "        BARRIER();",
        f"        if ({next_step}) {{",
        *_indent(_stage(t, "a", f"(k0 + {t.bk})", spec, akc), 12),
        *_indent(_stage(t, "b", f"(k0 + {t.bk})", spec, bkc), 12),
        "        }",
        "        MMA_UNROLL",
        f"        for (int kk = 0; kk < {t.bk}; kk += {t.kstep}) {{",
        f"            float mma_af[{MI}][{FA}], mma_bf[{NI}][{FB}];",
        "            #pragma unroll",
        f"            for (int mi = 0; mi < {MI}; ++mi) {{",
        *[f"                mma_af[mi][{e}] = {fa(rows[e], ks[e])};" for e in range(FA)],
        "            }",
        "            #pragma unroll",
        f"            for (int ni = 0; ni < {NI}; ++ni) {{",
        *[f"                mma_bf[ni][{e}] = {fb(b_ks[e])};" for e in range(FB)],
        "            }",
        *_indent(mma_loops(mma, MI, NI, frag_args), 12),
        "        }",
        "        BARRIER();",
        "    }",
        *store_accumulators(spec, t),
        "}",
        "",
        *thin_kernel(name, spec, f"{a_floats + b_floats} + {WARPS} * {emu_macro}", t),
    ]
    return "\n".join(src)
