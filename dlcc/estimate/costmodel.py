"""Per-kernel GPU time for dlcc's own plans (DESIGN.md §6, plan mode).

A kernel's time is either measured (a hit in a ProfileDB, dlcc/estimate/profiledb.py) or modelled:

    us = fixed + max(compute, memory)
    compute = flops / (peak_tflops[dtype] * compute_efficiency) * q
    memory  = dram_bytes / (dram_bandwidth_gbps * dram_efficiency) * q

`roofline_us` is the pure lower bound: max(flops / peak, bytes / bandwidth), no efficiencies, no
fixed cost, no quantization (q = 1). Modelled times are never below it.

**Occupancy and waves.** Blocks resident per SM are the least of the device's block limit and of
what the block's threads, shared memory and (when ptxas resources are known) registers allow, with
registers allocated per warp in units of 256 as in backends/nvcc.py. `slots = sms * blocks_per_sm`
blocks run at once; the kernel runs `waves = ceil(blocks / slots)` waves (reported in KernelTime).

**Quantization q.** Each block does 1/blocks of the work, and a resident block can use its
whole SM. A grid smaller than the SM count leaves SMs idle: `q = sms / min(blocks, sms)`, so a
one-block kernel runs at one SM's rate (132x the ideal time on an H100). Beyond one block per SM,
the GPU's block scheduler hands blocks to whichever SM frees a slot, so the tail of a multi-wave
kernel is short: a kernel of `slots + 1` blocks runs two waves (KernelTime.waves = 2), the second
holding one block, and costs one block's share of the work more than `slots` blocks, not twice
as much. On 1,239 real H100 kernels (scripts/calibrate_costmodel.py, each variant refitted) the
median relative error over all kernels was 22% with idle-SM q, 24% pricing the tail at SM
granularity (ceil(blocks / sms) * sms / blocks) and 30% pricing every wave in full (ceil(blocks /
slots) * slots / blocks; reductions 31% -> 53%). No quantization at all scored 20% there (cuBLAS
GEMMs on 80-120 blocks ran faster than the idle-SM factor says), but dlcc plans launch grids of
one to a few blocks, where idle SMs are the dominant effect, so q stays.
Occupancy (blocks_per_sm) therefore sets the reported waves; a block that does not fit at all is
still costed as one block per SM.

**Calibration constants** are DeviceSpec fields (configs/devices/*.yaml):
`kernel_fixed_us` (every kernel), `gemm_fixed_us` (gemm/conv/attention kernels; defaults to
`kernel_fixed_us`), `dram_efficiency`, `compute_efficiency`. For H100 they are fitted on real
kernels from PyTorch profiler traces by scripts/calibrate_costmodel.py; the yaml comments say where
each device's values come from.

**Classes.** A launch is a gemm (fixed cost `gemm_fixed_us`) when its plan category is `compute`
or its kernel kind is gemm/conv; everything else uses `kernel_fixed_us`.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

from ..config import DeviceSpec

if TYPE_CHECKING:  # pragma: no cover
    from .profiledb import ProfileDB

_DTYPE_ALIASES = {
    "float": "float32", "fp32": "float32", "f32": "float32", "float32": "float32",
    "half": "float16", "fp16": "float16", "f16": "float16", "float16": "float16",
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "tf32": "tf32", "int8": "int8", "uint8": "int8",
}
_GEMM_KINDS = ("gemm", "conv")


def peak_tflops(dtype: str, device: DeviceSpec) -> float:
    """The device's peak TFLOP/s for `dtype` (aliases like bf16/fp16/half accepted); dtypes the
    device lists no peak for (int64, bool, ...) fall back to float32, then to the largest peak."""
    d = _DTYPE_ALIASES.get(str(dtype).lower(), str(dtype).lower())
    peaks = device.peak_tflops
    if d == "tf32x3" and "tf32" in peaks:
        return peaks["tf32"] / 3  # three TF32 mmas per product
    if d in peaks:
        return peaks[d]
    if "float32" in peaks:
        return peaks["float32"]
    return max(peaks.values())


def roofline_us(flops: float, dram_bytes: float, dtype: str, device: DeviceSpec) -> float:
    """Pure lower bound in µs: max(FLOPs at the dtype's peak, bytes at DRAM bandwidth)."""
    compute = flops / (peak_tflops(dtype, device) * 1e6)  # TFLOP/s = 1e6 FLOP/µs
    memory = dram_bytes / (device.dram_bandwidth_gbps * 1e3)  # GB/s = 1e3 B/µs
    return max(compute, memory)


@dataclass(frozen=True)
class KernelTime:
    us: float
    source: str  # "roofline" or "profile:<db file name>"
    compute_us: float = 0.0
    memory_us: float = 0.0
    waves: float = 0.0
    fixed_us: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def _threads(block) -> int:
    if isinstance(block, (list, tuple)):
        return max(1, math.prod(int(b) for b in block))
    return max(1, int(block))


def _blocks(grid) -> int:
    return _threads(grid)


def blocks_per_sm(device: DeviceSpec, threads: int, smem_bytes: int = 0, registers: int | None = None) -> int:
    """Resident blocks per SM: the least of the block, thread, shared-memory and register limits
    (at least 1: a block that fits nowhere is still costed, as one block per SM)."""
    threads = max(1, int(threads))
    limits = [device.max_blocks_per_sm, device.max_threads_per_sm // threads]
    if smem_bytes:
        limits.append(device.shared_mem_per_sm // int(smem_bytes))
    if registers:
        warps = -(-threads // device.warp_size)
        regs_per_warp = -(-int(registers) * device.warp_size // 256) * 256
        limits.append(device.registers_per_sm // max(1, regs_per_warp * warps))
    return max(1, min(limits))


def quantization(blocks: int, device: DeviceSpec) -> float:
    """Idle-SM factor q = sms / min(blocks, sms) >= 1 (see the module docstring)."""
    blocks = max(1, int(blocks))
    return device.sms / min(blocks, device.sms)


def kernel_fixed_us(device: DeviceSpec, gemm: bool) -> float:
    """A kernel's fixed cost on `device`: gemm_fixed_us for GEMM-class kernels where set, else kernel_fixed_us."""
    return device.gemm_fixed_us if gemm and device.gemm_fixed_us is not None else device.kernel_fixed_us


def compute_us(flops: float, dtype: str, device: DeviceSpec, math_flops: dict | None = None) -> float:
    """µs of `flops` at peak: those in `math_flops` ({dtype: FLOPs}) at their dtype's peak, the
    rest at `dtype`'s."""
    other = sum((math_flops or {}).values())
    us = max(0.0, flops - other) / (peak_tflops(dtype, device) * 1e6)
    return us + sum(f / (peak_tflops(d, device) * 1e6) for d, f in (math_flops or {}).items())


def kernel_time(flops: float, dram_bytes: float, dtype: str, device: DeviceSpec, *, blocks: int,
                threads: int, smem_bytes: int = 0, registers: int | None = None, gemm: bool = False,
                fixed_us: float | None = None, compute_efficiency: float | None = None,
                dram_efficiency: float | None = None, math_flops: dict | None = None) -> KernelTime:
    """The modelled time of one kernel from its work and launch shape. The calibration constants
    come from `device` unless given (scripts/calibrate_costmodel.py passes trial values).
    `math_flops` ({dtype: FLOPs}) is the part of `flops` run at another dtype's peak (a persistent
    kernel's tensor-core rTasks); the rest runs at `dtype`'s."""
    if fixed_us is None:
        fixed_us = kernel_fixed_us(device, gemm)
    ce = device.compute_efficiency if compute_efficiency is None else compute_efficiency
    de = device.dram_efficiency if dram_efficiency is None else dram_efficiency
    bps = blocks_per_sm(device, threads, smem_bytes, registers)
    slots = device.sms * bps
    waves = float(math.ceil(max(1, blocks) / slots))
    q = quantization(blocks, device)
    compute = compute_us(flops, dtype, device, math_flops) / ce * q
    memory = dram_bytes / (device.dram_bandwidth_gbps * 1e3 * de) * q
    return KernelTime(us=fixed_us + max(compute, memory), source="roofline", compute_us=compute,
                      memory_us=memory, waves=waves, fixed_us=fixed_us)


def gemm_model_us(tiling: str, shape, device: DeviceSpec, blocks_per_sm: int | None = None,
                  sms: int | None = None) -> float | None:
    """µs of a GEMM rOperator from its tiling's cycle model (kernels/gemm.py tiling_cost, gemm_mma.py
    mma_cost: k steps, issue rate, latency over co-resident blocks) times DeviceSpec.gemm_cycle_us,
    which is fitted on dlcc's own GEMMs timed on the device. None where the device has no such
    calibration or the tiling is unknown. `blocks_per_sm` caps its co-resident blocks: rTasks of a
    persistent kernel get that kernel's occupancy, not their own, and that is what joining costs a
    big GEMM (issue 20: 12.5% occupancy against 32-35% alone). `sms`: the SMs it may use (1: its
    SM-time)."""
    if device.gemm_cycle_us is None or device.kind != "gpu" or not tiling:
        return None
    from ..kernels.gemm import tiling_and_cost

    found = tiling_and_cost(tiling, device)
    if found is None:
        return None
    t, cost = found
    update = {**({"max_blocks_per_sm": int(blocks_per_sm)} if blocks_per_sm else {}), **({"sms": int(sms)} if sms else {})}
    d = device.model_copy(update=update) if update else device
    return cost(t, *(int(x) for x in shape), d) * cycle_us(getattr(t, "precision", None), device)


def cycle_us(precision: str | None, device: DeviceSpec) -> float:
    """µs per modelled cycle on `device` of a kernel whose mmas run at `precision`: its
    DeviceSpec.mma_cycle_us where the device has it (the tensor-core models were fitted apart:
    their k loops are other code), else gemm_cycle_us (the SIMT templates: precision None)."""
    from ..kernels.gemm_mma import mma_scale

    scale = mma_scale(precision, device) if precision else None  # tf32x3: its pipeline's (SCALE_FALLBACK)
    return device.gemm_cycle_us if scale is None else scale


def attention_model_us(shape, device: DeviceSpec, sms: int | None = None) -> float | None:
    """µs of a fused attention rOperator ([batch, M, N, D, Dv] or [..., math]) from its template's
    cycle model (kernels/attention_mma.py fused_attention_cost: the SIMT one at float32, the
    tensor-core one at tf32/fp16/bf16; the SIMT GEMM model's units) times DeviceSpec.gemm_cycle_us,
    or, for the tensor-core template, the mma_cycle_us of its precision where the device has it
    (its mma.sync loops are the tensor-core GEMMs' kind, and the fusion decision weighs it against
    those); None where the device has no such calibration. `sms`: the SMs it may use (1: its SM-time)."""
    if device.gemm_cycle_us is None or device.kind != "gpu":
        return None
    from ..kernels.attention_mma import fused_attention_cost

    d = device.model_copy(update={"sms": int(sms)}) if sms else device
    return fused_attention_cost(shape, d) * cycle_us(shape[5] if len(shape) > 5 else None, device)


def wave_attention_us(shapes: list, veus: int, device: DeviceSpec) -> float | None:
    """µs of a wave's fused attention rTasks in a persistent kernel: the longest alone, or their
    summed SM-time over the SMs the wave's vEUs cover, whichever is more (as wave_gemm_us)."""
    alone = [attention_model_us(s, device) for s in shapes]
    one = [attention_model_us(s, device, sms=1) for s in shapes]
    if not alone or None in alone or None in one:
        return None
    return max(max(alone), sum(one) / max(1, min(device.sms, veus)))


def wave_gemm_us(gemms: list, veus: int, device: DeviceSpec, blocks_per_sm: int = 1) -> float | None:
    """µs of a wave's GEMM rTasks in a persistent kernel of `blocks_per_sm` resident blocks per SM
    (gemm_model_us at that occupancy): the longest GEMM alone, or their summed SM-time over the SMs
    the wave's vEUs cover, whichever is more (Rammer's choose_rkernels weighs waves the same way).
    None where the device has no tiling calibration. `gemms`: [tiling, batch, M, N, K] each."""
    alone, sm_time = [], 0.0
    for tiling, *shape in gemms:
        a = gemm_model_us(tiling, shape, device, blocks_per_sm)
        b = gemm_model_us(tiling, shape, device, blocks_per_sm, sms=1)
        if a is None or b is None:
            return None
        alone.append(a)
        sm_time += b
    sms = max(1, min(device.sms, -(-max(1, veus) // max(1, blocks_per_sm))))
    return max(max(alone), sm_time / sms) if alone else None


def rprogram_time(waves: list[dict], veus: int, device: DeviceSpec, sync_points: int,
                  blocks_per_sm: int = 1) -> tuple[float, list[float]]:
    """µs of one persistent kernel (a rammer rProgram), and of each of its waves.

    One kernel's fixed cost, then per wave: its rTasks' summed work at the roofline, quantized
    over the vEUs it can use (q = sms / min(tasks, vEUs, sms): a wave of few rTasks leaves SMs
    idle), plus one grid barrier per sync point (DeviceSpec.grid_barrier_us). No per-op launch,
    ramp or GEMM pipeline-fill cost: those are what co-scheduling removes or overlaps (a vEU
    starts its next rTask while others still run). On PoCL the barrier figure is the measured
    extra cost of a wave in persistent form, which makes joining rarely pay there.
    `waves`: dicts with tasks, flops, dram_bytes and gemm (plan launch["rprogram"]["waves"]).

    A wave whose every rTask launch was measured (`measured`: [busy µs, rTasks] per entry, from
    a profile database: the launch's time less its fixed cost) is priced from those instead: its
    launches overlap on the vEUs, so it takes the longest one, or their summed SM-time spread over
    the vEUs, whichever is more.

    On a device that builds persistent kernels unoptimised (DeviceSpec.unoptimised_slowdown and
    unoptimised_task_us, PoCL), the waves' time is scaled by the slowdown, and each rTask costs
    unoptimised_task_us more, in waves over the SMs (added to the last wave).

    On a device calibrated for it (DeviceSpec.gemm_cycle_us), a wave's GEMM rTasks ("gemms":
    tiling and problem each) take at least what their tilings' cycle model gives at the persistent
    kernel's `blocks_per_sm` (wave_gemm_us), plus what its fused attention rTasks ("attention":
    [batch, M, N, D, Dv] each) take by their cycle model (wave_attention_us)."""
    ce, de = device.compute_efficiency, device.dram_efficiency
    per = []
    for w in waves:
        if w.get("measured"):
            v = max(1, min(veus, device.sms))
            per.append(max(max(b for b, _ in w["measured"]),
                           sum(b * min(int(t), device.sms) for b, t in w["measured"]) / v))
            continue
        q = device.sms / max(1, min(int(w["tasks"]), max(1, veus), device.sms))
        compute = compute_us(float(w["flops"]), "float32", device, w.get("math_flops")) / ce * q
        memory = float(w["dram_bytes"]) / (device.dram_bandwidth_gbps * 1e3 * de) * q
        gemm = wave_gemm_us(w["gemms"], veus, device, blocks_per_sm) if w.get("gemms") else None
        att = wave_attention_us(w["attention"], veus, device) if w.get("attention") else None
        per.append(max(compute, memory, (gemm or 0.0) + (att or 0.0)))
    if device.unoptimised_costs:
        # built unoptimised on this device (PoCL: backends/opencl.py builds_unoptimised): slower
        # work, and a cost per rTask in waves over the SMs
        tasks = sum(max(1, int(w.get("tasks") or 1)) for w in waves)
        per = [u * device.unoptimised_slowdown for u in per]
        per[-1:] = [per[-1] + -(-tasks // max(1, device.sms)) * device.unoptimised_task_us] if per else []
    total = device.kernel_fixed_us + sum(per) + sync_points * device.grid_barrier_us
    return total, per


def cpu_gemm_time(model: KernelTime, launch: dict, kernel: dict, dtype: str, device: DeviceSpec) -> KernelTime:
    """A SIMT GEMM's time on a CPU device from its tiling's cost (kernels/gemm.py cpu_tiling_cost:
    padded tile work, a cost per k step, work-groups in waves over the cores) instead of its
    FLOPs: on PoCL the tiling, not the FLOP count, sets a GEMM's time (the 64x64 tile of
    `large-tiles` runs 1.3-3x slower than the tiling chosen per shape). The cost is in FMAs of
    one core, at the core's share of the peak and the device's compute_efficiency."""
    from ..kernels.gemm import cpu_tiling_cost, tiling_named

    t = tiling_named(kernel["tiling"])
    if t is None:  # a tensor-core tiling (emulated on the CPU): the FLOP model stands
        return model
    batch, M, N, K = (int(x) for x in launch["gemm"]["shape"])
    core_peak = peak_tflops(dtype, device) * 1e6 / max(1, device.sms)  # FLOP/µs of one core
    compute = 2 * cpu_tiling_cost(t, batch, M, N, K, device) / (core_peak * device.compute_efficiency)
    return replace(model, us=model.fixed_us + max(compute, model.memory_us), compute_us=compute)


def gpu_gemm_time(model: KernelTime, launch: dict, kernel: dict, device: DeviceSpec, registers=None) -> KernelTime:
    """A GEMM launch's time on a GPU calibrated for dlcc's GEMMs (DeviceSpec.gemm_cycle_us): the
    kernel's fixed cost plus the larger of its tiling's cycle model (gemm_model_us, at the
    tiling's own occupancy, or the one ptxas' registers allow when the plan has them) and the
    roofline. The FLOP roofline's efficiency and gemm_fixed_us were fitted on cuBLAS, whose
    GEMMs run near peak; dlcc's SIMT GEMMs measured at 6-25 TFLOP/s on an H100, so the roofline
    alone put them 3-5x too fast. Unchanged where the device has no such calibration."""
    bps = None
    if registers:
        bps = blocks_per_sm(device, _threads(launch.get("block") or kernel.get("block") or 1),
                            int(kernel.get("smem_bytes") or 0), registers)
    us = gemm_model_us(kernel["tiling"], launch["gemm"]["shape"], device, bps)
    if us is None:
        return model
    fixed = device.kernel_fixed_us
    return replace(model, us=fixed + max(us, model.compute_us, model.memory_us), compute_us=max(us, model.compute_us),
                   fixed_us=fixed, source=model.source + " + GEMM tiling model")


def is_gemm_launch(launch: dict, kernel: dict | None) -> bool:
    return launch.get("category") == "compute" or (kernel or {}).get("kind") in _GEMM_KINDS


def launch_time(launch: dict, kernel: dict | None, device: DeviceSpec, dtype: str = "float32",
                resources: dict | None = None, db: ProfileDB | None = None) -> KernelTime:
    """Time of one plan launch: the ProfileDB's measurement when it has this (device, kernel, grid,
    block), else the model above. `kernel` is the plan's kernel entry (block, smem_bytes, kind);
    `resources` the ptxas entry from plan["cuda"]["resources"] (registers, smem_bytes). A kernel
    that the device builds unoptimised (PoCL) has its modelled time beyond the fixed cost scaled by
    DeviceSpec.unoptimised_slowdown, plus unoptimised_task_us per block (rTask) in waves over the
    SMs, and a GEMM with AStitch's fused prologue or epilogue by
    DeviceSpec.fused_gemm_slowdown."""
    threads = _threads(launch.get("block") or (kernel or {}).get("block") or 1)
    blocks = _blocks(launch.get("grid") or 1)
    smem = int((kernel or {}).get("smem_bytes") or 0)
    regs = None
    if resources:
        smem = max(smem, int(resources.get("smem_bytes") or 0))
        regs = resources.get("registers") or None
    model = kernel_time(float(launch.get("flops") or 0), float(launch.get("dram_bytes") or 0), dtype, device,
                        blocks=blocks, threads=threads, smem_bytes=smem, registers=regs,
                        gemm=is_gemm_launch(launch, kernel))
    if device.kind == "cpu" and launch.get("gemm") and (kernel or {}).get("tiling"):
        model = cpu_gemm_time(model, launch, kernel, dtype, device)
    rp = launch.get("rprogram")
    if not rp and launch.get("gemm") and (kernel or {}).get("tiling"):
        model = gpu_gemm_time(model, launch, kernel, device, regs)
    if not rp and launch.get("attention"):
        att = attention_model_us(launch["attention"], device)
        if att is not None:  # dlcc's own kernel: its fixed cost, not cuBLAS's (as gpu_gemm_time)
            model = replace(model, us=device.kernel_fixed_us + max(att, model.compute_us, model.memory_us),
                            compute_us=max(att, model.compute_us), fixed_us=device.kernel_fixed_us,
                            source=model.source + " + attention model")
    if rp:  # a persistent kernel: its waves one after another on its vEUs (rprogram_time)
        us, _ = rprogram_time(rp["waves"], min(blocks, int(rp.get("veus") or blocks)), device,
                              int(rp.get("sync_points") or 0), int(rp.get("blocks_per_sm") or 1))
        model = KernelTime(us=us, source="roofline (rProgram)", compute_us=model.compute_us,
                           memory_us=model.memory_us, waves=float(len(rp["waves"])), fixed_us=device.kernel_fixed_us)
    if device.fused_gemm_slowdown != 1.0 and (kernel or {}).get("kind") in _GEMM_KINDS and kernel.get("pass") == "astitch":
        model = replace(model, us=model.fixed_us + (model.us - model.fixed_us) * device.fused_gemm_slowdown)
    if device.unoptimised_slowdown != 1.0:
        from ..backends.opencl import builds_unoptimised

        if not rp and builds_unoptimised(kernel, bool(launch.get("grid_sync"))):  # (rprogram_time prices rProgram's)
            extra = -(-max(1, blocks) // max(1, device.sms)) * device.unoptimised_task_us
            model = replace(model, us=model.fixed_us + (model.us - model.fixed_us) * device.unoptimised_slowdown + extra,
                            source=model.source + ", unoptimised build")
    if db is not None:
        us = db.lookup(device.name, launch, kernel)
        if us is not None:
            return KernelTime(us=us, source=f"profile:{db.name}", compute_us=model.compute_us,
                              memory_us=model.memory_us, waves=model.waves, fixed_us=0.0)
    return model


def plan_kernel_times(plan: dict, device: DeviceSpec, db: ProfileDB | None = None) -> list[KernelTime]:
    """One KernelTime per plan["launches"] entry, in order (dtype float32 unless a launch says)."""
    kernels = {k["name"]: k for k in plan.get("kernels", [])}
    resources = (plan.get("cuda") or {}).get("resources") or {}
    if (plan.get("cuda") or {}).get("arch") not in (None, device.arch):
        resources = {}  # ptxas figures for another architecture do not apply
    out = []
    for L in plan.get("launches", []):
        name = L.get("kernel")
        out.append(launch_time(L, kernels.get(name), device, dtype=L.get("dtype") or "float32",
                               resources=resources.get(name), db=db))
    return out
