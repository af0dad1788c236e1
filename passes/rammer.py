"""rammer (DESIGN.md §5): runs of launches become rPrograms, persistent kernels whose rTasks are
co-scheduled wave by wave on a virtual device.

  - **rOperators.** Every eligible launch is an rOperator (kernels/roperator.py: `NAME_task(args,
    task_id, thread_id, smem)`): GEMM/Conv tiles, maps, reductions and AStitch's stitched kernels.
    Eligible means: not spin-waiting itself, 256 threads per task or a block-normalisable kernel
    of fewer on a GPU (the row reductions: threads past its own block skip its work and join its
    barriers, so 32..128-thread rTasks share a kernel with 256-thread tiles; on a CPU device PoCL
    runs work-items one by one, so idle threads would cost time), and shared memory within a
    block. Block barriers are fine in any rTask: each is reached by all 256 threads, since the
    call sites sit under uniform loops. (Stitched kernels with barriers once gave NaN here on
    PoCL, for hf llama and t5-encoder, while one rOperator could have several call sites in a
    kernel; since there is one call site per rOperator, none does: tests/test_hf_zoo.py.)
  - **Waves.** A maximal run of eligible launches is split into BFS waves from what each launch
    reads and writes (RAW, WAR, WAW), down to the byte ranges a launch declares (Launch.regions):
    an LSTM step touches one time step of its sequence buffers, so cell (l, t) waits only for
    (l, t-1) and (l-1, t), and a stack of layers runs as a wavefront over layers x time.
  - **vDevice.** vEUs = SMs x resident blocks per SM of the persistent kernel itself: it is
    emitted with LAUNCH_BOUNDS(256), so nvcc must fit a whole block's registers on one SM, and one
    block per SM is proven whenever its threads and shared memory (the max over its rTasks, not
    the sum) fit one SM. On PoCL an SM is a worker thread (the pocl-cpu DeviceSpec, and at run
    time the executor clamps the grid to POCL_MAX_PTHREAD_COUNT). Nothing is hard-coded.
  - **rProgram = a schedule table in device memory.** `prog[vEU][order]` is not unrolled into
    code: a constant int table (placed with the weights) lists, per wave, its entries (call site,
    first rTask, rTask count, int arguments such as an RNN step, operands). The kernel holds one
    call site per distinct rOperator, and loops over the table; each call site is a loop whose
    bounds come from the table (empty unless the entry is its own), so every barrier sits in
    straight-line code under a uniform loop, which PoCL needs. (Each block's rTask loop still starts
    from the block index, a shape PoCL 3.1 miscompiles once optimised: on PoCL the runtime builds
    persistent kernels with -cl-opt-disable, backends/opencl.py compile.) A wave's rTasks are numbered across
    its entries and dealt round-robin to the vEUs; a block barrier follows each rTask (the next
    one reuses `smem`), and a grid barrier each wave. Code size grows with the distinct kernels,
    not with the program's length: LSTM-TC's 2,032 launches are 5 call sites.
  - **Operands = storage base + offset.** A persistent kernel takes one pointer per storage it
    touches (arena, weights, each graph input and output, the sync counters); each table entry
    holds its operands as (storage index, element offset), written after memplan (plan.py,
    kernels/program.py fill_operand_table). Hundreds of operands cost no more of CUDA's 4 KB
    parameter space than three, and one GEMM call site serves every GEMM of its shape (two call
    sites of one task function in a kernel crashed PoCL's LLVM).
  - **Synchronisation.** One grid barrier per wave (prelude `dlcc_grid_sync`: block barrier,
    fence, atomic arrive; generation counter, so no reset between runs; acquire-side fence).
  - **Co-residency.** A kernel with more than one wave spin-waits, so it is emitted only where
    its vEUs are proven resident. Where none is (a block's shared memory does not fit an SM), the
    pass refuses with a log line and falls back to one launch per wave (NNFusion's level 1). The
    executor clamps the grid again at run time to what the runtime proves.
  - **Joining waves by estimate.** With `join: auto`, a run becomes one persistent kernel only
    where the cost model (estimate/costmodel.py `rprogram_time`) predicts it beats one launch per
    wave on the device; `always` and `never` force it. rTask times come from the cost model, or
    from a profile database (`--profile-db`) for waves whose launches were all measured.
  - **rKernel choice per wave** (choose_rkernels): the fastest GEMM tiling where a wave leaves
    vEUs idle; where its rTasks fill them, the tilings that minimise the wave's time, counting
    time x threads (the resource-efficient choice when many GEMMs share the wave).

Not yet: packing several small rTasks into one vEU (a 32-thread rTask leaves 224 threads idle) and
fine-grained dependency counters.
"""
from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..estimate.costmodel import (gemm_model_us, kernel_fixed_us, kernel_time, rprogram_time, wave_attention_us,
                                  wave_gemm_us)
from ..ir import Tensor
from ..kernels import splitk
from ..kernels.gemm import GemmExpr, gemm_source, retile, tiling_family
from ..kernels.gemm_mma import STATIC_SMEM_BYTES
from ..kernels.gemm_wgmma import uses_wgmma
from ..kernels.program import STORAGE_ARRAY, STORAGE_PARAMS, Launch, ctype
from ..plan import gemm_problem
from ..kernels.roperator import NotAnROperator, to_roperator
from . import CompileState, register_pass

from .astitch import SYNC  # noqa: E402  (two ints per spin-waiting launch, shared with astitch)
BLOCK = 256
#: Call sites (distinct rOperators) per persistent kernel on a CPU device. PoCL keeps
#: every work-item's values that live across a barrier on its worker thread's stack, for every
#: inlined call site: at 6 GEMM call sites that overflowed (segfault); at 4 every test model runs.
#: Very large kernels also take PoCL minutes to compile.
CPU_CALL_SITES = 4
#: The same on a GPU: bounds nvcc's time on one kernel (each call site inlines an rTask body).
GPU_CALL_SITES = 64


class RammerOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sync: Literal["grid-barrier", "counters"] = Field(
        "grid-barrier", description="how a persistent kernel's waves wait for each other: one grid barrier per "
        "wave, or dependency counters (a block waits before an entry only for the entries it conflicts with, so "
        "blocks run ahead into later waves; not yet timed on a GPU)")
    veus: int | None = Field(None, ge=1, description="vEU count override: at most the proven resident blocks "
                             "(a larger value is clamped, with a log line); default: SMs x resident blocks per SM")
    join: Literal["auto", "always", "never"] = Field(
        "auto", description="waves of a run in one persistent kernel: where the cost model says it pays (auto), "
        "always, or never (one launch per wave, NNFusion's level 1)")
    call_sites: int | None = Field(None, ge=1, description="distinct rOperators (kernels) per persistent kernel; "
                                   f"default {CPU_CALL_SITES} on CPU devices (PoCL's stack), {GPU_CALL_SITES} on GPUs")
    min_launches: int = Field(2, ge=2, description="runs shorter than this stay plain launches")
    blocks_per_sm: int = Field(1, ge=1, le=8, description="resident blocks per SM a persistent kernel counts "
                               "on (GPU devices): vEUs = SMs x this, and nvcc caps the kernel's registers so that "
                               "they fit (__launch_bounds__(256, this)); where threads, shared memory or the "
                               "registers' floor do not allow it, fewer, with a log line; CPU devices: 1")
    run_join: dict[int, bool] = Field(
        default_factory=dict, description="per run of co-schedulable launches (its index in `dlcc inspect "
        "--rprogram`'s runs table): joined into one persistent kernel (true) or kept to one launch per wave (false), "
        "overriding `join` for that run; `dlcc compile --tune` sets it where a measured flip of the estimate's "
        "decision was faster. A run that needs co-residency it cannot prove stays apart whatever this says")
    kernels: Literal["wavefront", "fastest", "efficient"] = Field(
        "wavefront", description="rKernel (GEMM tiling) choice: per wave, the fastest where the wave leaves vEUs "
        "idle and the least time x threads where it fills them (wavefront, Rammer's policy); always the "
        "fastest (the lowering's choice); or always the least SM-time (efficient)")


#: The most arguments a launch may have to run as an rTask (see run_rammer's `eligible`).
MAX_SITE_ARGS = 64


def conflicts(launches: list[Launch], res) -> list[list[int]]:
    """For each launch of a run, the earlier launches it must wait for: read-after-write,
    write-after-read and write-after-write on resolved buffers, narrowed to the byte ranges in
    Launch.regions where a launch declares them. What orders waves (wave_levels), and what
    `sync: counters` waits on entry by entry."""
    seen: dict[str, list[tuple[int, bool, int, int]]] = {}  # buffer -> (launch, is_write, lo, hi)
    out = []
    for i, L in enumerate(launches):
        acc: dict[str, list] = {}
        for names, w in ((L.reads, False), (L.writes, True)):
            for t in names:
                lo, hi = L.regions.get(t, (0, 1 << 62))
                acc.setdefault(res(t), []).append((w, lo, hi))
        deps = set()
        for b, uses in acc.items():
            for j, pw, plo, phi in seen.get(b, ()):
                if j not in deps and any((w or pw) and lo < phi and plo < hi for w, lo, hi in uses):
                    deps.add(j)
        out.append(sorted(deps))
        for b, uses in acc.items():
            seen.setdefault(b, []).extend((i, w, lo, hi) for w, lo, hi in uses)
    return out


def wave_levels(launches: list[Launch], res) -> list[int]:
    """BFS wave (0-based) of each launch in a run: one more than the latest earlier launch it
    conflicts with (conflicts)."""
    level: list[int] = []
    for deps in conflicts(launches, res):
        level.append(1 + max((level[j] for j in deps), default=-1))
    return level


#: The fewest registers a thread a persistent kernel is capped to (blocks_per_sm): below it nvcc
#: spills even the simplest GEMM rTasks' accumulators.
MIN_REGISTERS = 64


def resident_per_sm(dev, smem_bytes: int, wanted: int) -> int:
    """How many of `wanted` blocks per SM a persistent kernel may count on: 1 on a CPU device (an
    SM is a PoCL worker thread), else as many as the SM's threads, blocks and shared memory hold
    and as leave each thread MIN_REGISTERS (nvcc is told to fit them: LAUNCH_BOUNDS_SM)."""
    if dev.kind == "cpu" or wanted <= 1:
        return 1
    limits = [wanted, dev.max_blocks_per_sm, dev.max_threads_per_sm // BLOCK,
              dev.registers_per_sm // (MIN_REGISTERS * BLOCK)]
    if smem_bytes:
        limits.append(dev.shared_mem_per_sm // smem_bytes)
    return max(1, min(limits))


def launch_bounds(per_sm: int) -> str:
    """The persistent kernel's bounds: one resident block per SM (ptxas may use 255 registers),
    or `per_sm` (ptxas caps them at registers_per_sm / (256 x per_sm))."""
    return f"LAUNCH_BOUNDS({BLOCK}) " if per_sm == 1 else f"LAUNCH_BOUNDS_SM({BLOCK}, {per_sm}) "


def proven_veus(dev, smem_bytes: int, per_sm: int = 1) -> tuple[int, str]:
    """vEUs of a persistent kernel on `dev`, and why: SMs x resident blocks per SM (`per_sm`, as
    resident_per_sm allows). It is emitted with launch_bounds(per_sm), so those blocks are proven
    whenever their threads and shared memory fit one SM (nvcc then fits their registers, capping
    them where per_sm > 1); 0 where one block does not fit."""
    if BLOCK > min(dev.max_threads_per_sm, dev.max_threads_per_block):
        return 0, f"none: a {BLOCK}-thread block does not fit one SM of {dev.name}"
    if smem_bytes > min(dev.shared_mem_per_sm, dev.shared_mem_per_block):
        return 0, (f"none: {smem_bytes} B of shared memory per block (the largest rTask's) does not fit one SM "
                   f"of {dev.name} ({min(dev.shared_mem_per_sm, dev.shared_mem_per_block)} B)")
    unit = "PoCL worker thread" if dev.kind == "cpu" else "SM"
    if per_sm > 1:
        return dev.sms * per_sm, (
            f"{dev.sms * per_sm} = {dev.sms} {unit}s x {per_sm} blocks: {launch_bounds(per_sm).strip()} makes nvcc "
            f"fit {per_sm} blocks' registers on one SM ({dev.registers_per_sm // (BLOCK * per_sm)} a thread at most), "
            f"and {per_sm} x {smem_bytes} B of shared memory (max over the rTasks) fits one; the runtime clamps "
            "the grid to the blocks it proves resident")
    return dev.sms, (f"{dev.sms} = {dev.sms} {unit}s x 1 block: LAUNCH_BOUNDS({BLOCK}) makes nvcc fit a block's "
                     f"registers on one SM, and {smem_bytes} B of shared memory (max over the rTasks) fits one; "
                     "the runtime clamps the grid to the blocks it proves resident")


def wave_info(w: list[Launch], measured: dict, prog=None) -> dict:
    """One wave's work for the cost model (costmodel.rprogram_time) and the plan: rTasks, flops,
    bytes, its GEMMs' tilings and problems [tiling, batch, M, N, K] (the tiling model prices them
    where the device is calibrated for it), and, where every launch in it has a profile-database
    time, [busy µs, rTasks] of each."""
    d = {"tasks": sum(L.grid for L in w), "flops": sum(L.flops for L in w),
         "dram_bytes": sum(L.dram_bytes for L in w), "gemm": any(L.category == "compute" for L in w),
         "ops": len(w), "entries": [[L.op_type or "op", L.grid, L.block] for L in w]}
    gemms = [[prog.kernels[L.kernel].tiling, *gemm_problem(L)["shape"]] for L in w
             if prog is not None and prog.kernels[L.kernel].tiling and gemm_problem(L)]
    if gemms:
        d["gemms"] = gemms
    attention = [list(L.attention) for L in w if L.attention]
    if attention:
        d["attention"] = attention
    math = {}
    for L in w:
        if L.math != "float32":
            math[L.math] = math.get(L.math, 0) + L.flops
    if math:
        d["math_flops"] = math  # FLOPs not at float32 (tensor cores), by dtype
    if w and all(id(L) in measured for L in w):
        d["measured"] = [[round(measured[id(L)], 4), L.grid] for L in w]
    return d


def measured_busy(launches: list[Launch], db, dev) -> dict:
    """id(launch) -> its measured µs less the kernel's fixed cost, for launches the profile
    database has on this device (key: device name, kernel, grid, block)."""
    out = {}
    if db is None:
        return out
    for L in launches:
        us = db.lookup(dev.name, {"kernel": L.kernel, "grid": L.grid, "block": L.block})
        if us is not None:
            out[id(L)] = max(0.0, us - kernel_fixed_us(dev, L.category == "compute"))
    return out


class _Run:
    """One run of launches on its way to becoming persistent kernels."""

    def __init__(self, idx: list[int], launches: list[Launch], rops: dict, res, measured: dict, prog=None):
        self.prog = prog
        self.idx = idx
        self.Ls = launches
        self.rops = rops
        self.measured = measured
        level = wave_levels(launches, res)
        self.waves = [[L for L, lv in zip(launches, level) if lv == w] for w in range(max(level) + 1)]
        self.smem = max([rops[L.kernel].smem_bytes for L in launches] + [4])

    def wave_work(self) -> list[dict]:
        return [wave_info(w, self.measured, self.prog) for w in self.waves]


def _split_runs(prog, eligible, sites_cap: int, min_launches: int) -> list[list[int]]:
    """Maximal runs of consecutive eligible launches, cut where a run would pass the call-site cap
    (a call site per rOperator: launches of one kernel share it, their operands come from the table).
    (Operands do not cap a run: they are addressed as storage base + offset, so a persistent
    kernel has one parameter per storage whatever its operand count.)"""
    runs: list[list[int]] = []
    cur: list[int] = []
    sites: set[str] = set()
    for i, L in enumerate(prog.launches):
        ok = eligible(L) is not None
        if not ok:
            if cur:
                runs.append(cur)
            cur, sites = [], set()
            continue
        if cur and len(sites | {L.kernel}) > sites_cap:
            runs.append(cur)
            cur, sites = [], set()
        cur.append(i)
        sites.add(L.kernel)
    if cur:
        runs.append(cur)
    return [r for r in runs if len(r) >= min_launches]


def _emit(state: CompileState, waves: list[list[Launch]], rops: dict, spin: bool, veus: int, per_sm: int, sync_slot: int,
          included: set[str], tab_no: int, measured: dict, sync: str = "grid-barrier") -> Launch:
    """One persistent kernel for `waves` (a table-driven rProgram; module docstring) and its launch.

    Table layout (int32): wave starts [nw + 1], then per entry: call site, first rTask of the wave,
    rTask count, int arguments (padded to the widest), with `sync: counters` the start and length
    of its dependency list, and per tensor operand (storage index, element offset), filled in
    after memplan (kernels/program.py fill_operand_table); with counters, the dependency lists
    follow the entries, as (entry, rTask count) pairs. A call site is one rOperator, whatever its
    operands: its tensor arguments are read from the entry.

    `sync: counters` (spinning kernels): instead of a grid barrier after each wave, a block waits,
    before its first rTask of an entry, for the entries that entry conflicts with (conflicts: the
    same relation that orders the waves) to have finished all their rTasks. Each rTask counts
    itself done (block barrier, fence, atomic add on its entry's counter: the grid barrier's
    writer side); the waiter spins on the counters, fences and meets its block at a barrier. The
    last block to leave resets the counters (one more counter counts the blocks that left), so
    every launch starts from zeros. Deadlock-free for the grid barrier's reason: every block is
    resident, takes the entries in wave order, and waits only on earlier waves. Its counters take
    (entries + 2) // 2 of the %sync slots (two ints each) from `sync_slot` on (run_rammer)."""
    counters = spin and sync == "counters"
    g = state.graph
    prog = state.ctx.program
    Ls = [L for w in waves for L in w]
    tab = f"%rtab{tab_no}"
    sites: dict[str, int] = {}
    site_launch: list[Launch] = []
    for L in Ls:
        if L.kernel not in sites:
            sites[L.kernel] = len(sites)
            site_launch.append(L)
    nints = max(sum(1 for kind, _ in L.args if kind == "i") for L in Ls)
    nslots = max(sum(1 for kind, _ in L.args if kind == "t") for L in Ls)
    dl = 3 + nints  # (counters: the entry's dependency list, start and length)
    base = dl + (2 if counters else 0)
    es = base + 2 * nslots
    deps = conflicts(Ls, state.ctx.resolve) if counters else [[] for _ in Ls]
    dep_list: list[int] = []
    starts, entries, slots = [0], [], []
    k = 0
    for w in waves:
        off = 0
        for L in w:
            ints = [int(a) for kind, a in L.args if kind == "i"]
            dep = ([len(dep_list), len(deps[k])] if counters else [])
            dep_list += [x for j in deps[k] for x in (j, Ls[j].grid)]
            entries += [sites[L.kernel], off, L.grid] + ints + [0] * (nints - len(ints)) + dep + [0, 0] * nslots
            slots.append([a for kind, a in L.args if kind == "t"])
            off += L.grid
            k += 1
        starts.append(len(entries) // es)
    nw = len(waves)
    table = np.array(starts + entries + dep_list, dtype=np.int32)
    dep_base = len(starts) + len(entries)
    g.tensors[tab] = Tensor(tab, (len(table),), "int32", value=table)
    smem = max([rops[L.kernel].smem_bytes for L in Ls] + [4])

    dev_code, site_code = [], []
    # Storages, the table and the sync counters are bound after memplan (STORAGE_ARRAY,
    # @OPERANDj@: kernels/program.py bind_storage_operands), so the parameter list stays small.
    body = [STORAGE_ARRAY, "GPTR const int* rtab = (GPTR const int*)(@OPERAND0@);"]
    if spin:
        body += ["GPTR int* rsync = (GPTR int*)(@OPERAND1@);"]
    # Beyond CUDA's static 48 KiB (a DEEP GEMM tiling among the rTasks: joins_dynamic_smem) the
    # array is dynamic: sized at each launch, as those GEMMs' own kernels are (the OpenCL figure,
    # which holds every rTask's, emulation scratch included).
    floats = -(-smem // 4)
    dynamic = 4 * floats if smem > STATIC_SMEM_BYTES else 0
    body += [f"DYNAMIC_SHARED(float, smem, {floats});" if dynamic else f"SHARED float smem[{floats}];",
             "const int tid = THREAD_ID;",
             f"for (int w = 0; w < {nw}; w++) {{",
             "    const int e1 = rtab[w + 1];",
             "    for (int e = rtab[w]; e < e1; e++) {",
             f"        GPTR const int* E = rtab + {nw + 1} + e * {es};",
             "        const int site = E[0], lo = E[1], hi = E[1] + E[2];",
             "        const int first = lo <= BLOCK_ID ? BLOCK_ID : BLOCK_ID + (lo - BLOCK_ID + GRID_DIM - 1) / GRID_DIM * GRID_DIM;"]
    if counters:  # a block with an rTask here first waits for the entries this one depends on (thread 0; all meet after)
        body += [f"        if (tid == 0 && first < hi) dlcc_wait_counts(rsync + rslot, rtab + {dep_base} + E[{dl}], E[{dl + 1}]);",
                 "        BARRIER();"]
    done = ["            if (tid == 0) { FENCE(); ATOMIC_ADD_I32(rsync + rslot + e, 1); }"] if counters else []
    for s, L in enumerate(site_launch):
        r = rops[L.kernel]
        if L.kernel not in included:
            included.add(L.kernel)
            dev_code.append(r.device_code)
        call_args, params, ji, jt = [], [], 0, 0
        for kind, a in L.args:
            if kind == "t":
                ct = ctype(g.tensors[a].dtype)
                o = base + 2 * jt
                call_args.append(f"(GPTR {ct}*)(S[E[{o}]]) + E[{o + 1}]")
                params.append(f"GPTR {ct}* a{len(params)}")
                jt += 1
            else:
                call_args.append(f"E[{3 + ji}]")
                params.append(f"const int a{len(params)}")
                ji += 1
        # One out-of-line function per call site (SITE_FN: __noinline__ on CUDA), so nvcc sizes
        # the kernel's registers as the max over its rTasks. Not a wgmma GEMM's
        # (kernels/gemm_wgmma.py): across a call, ptxas serializes every wgmma of the kernel
        # (warning C7510, "wgmma pipeline crossing function boundary"), so those are inlined.
        wgmma = uses_wgmma(r.device_code)
        names = [f"a{j}" for j in range(len(params))] + ["task_id", "thread_id", "smem"]
        params += ["const int task_id", "const int thread_id", "LPTR float* smem"]
        site_code.append(f"{'DEVICE' if wgmma else 'SITE_FN'} void KNAME_site{s}({', '.join(params)}) {{\n"
                         f"    {r.task_fn}({', '.join(names)});\n}}\n")
        call = f"KNAME_site{s}({', '.join(call_args + ['t - lo', 'tid', 'smem'])});"
        # The loop is empty unless this entry is call site s: no barrier ever sits under an `if`.
        body += [f"        /* call site {s}: {L.op_type or 'op'} */",
                 f"        for (int t = site == {s} ? first : hi; t < hi; t += GRID_DIM) {{",
                 f"            {call}", "            BARRIER();", *done, "        }"]
    body.append("    }")
    if counters:
        body.append("}")
        body.append(f"dlcc_counters_leave(rsync + rslot, {len(Ls)});")
    elif spin:
        body.append("    dlcc_grid_sync(rsync + rslot);")
        body.append("}")
    else:
        body.append("}")
    decls = [STORAGE_PARAMS] + (["const int rslot"] if spin else [])
    bounds = launch_bounds(per_sm)  # the resident blocks per SM the kernel counts on
    # The rProgram number keeps two persistent kernels of the same text apart: their storages may
    # be bound in another order.
    text = "".join(dev_code) + f"/* rProgram {tab_no} */\n" + "".join(site_code) + (f"KERNEL void {bounds}KNAME({', '.join(decls)}) {{\n    "
                                + "\n    ".join(body) + "\n}\n")
    hint = "Rammer_" + "_".join(dict.fromkeys(L.op_type or "op" for L in Ls))[:40]
    kname = prog.add_kernel(hint, lambda nm, t=text: t.replace("KNAME", nm), BLOCK, smem_bytes=smem,
                            kind="persistent", pass_name="rammer", dynamic_smem=dynamic)
    args = [("t", tab)] + ([("t", SYNC), ("i", 2 * sync_slot)] if spin else [])
    reads = list(dict.fromkeys([t for L in Ls for t in L.reads] + [tab]))
    writes = list(dict.fromkeys(t for L in Ls for t in L.writes))
    if spin:
        writes.append(SYNC)
    widest = max(sum(L.grid for L in w) for w in waves)
    grid = min(widest, veus) if spin else widest
    P = Launch(kernel=kname, grid=grid, block=BLOCK, args=args, reads=reads, writes=writes,
               node="+".join(L.node for L in Ls[:3]) + ("+..." if len(Ls) > 3 else ""), op_type="Rammer",
               flops=sum(L.flops for L in Ls), dram_bytes=sum(L.dram_bytes for L in Ls), pass_name="rammer",
               category="compute" if any(L.category == "compute" for L in Ls) else "elementwise")
    P.grid_sync = spin
    P.storage_operands = True
    P.operand_table = {"table": tab, "first_entry": nw + 1, "entry_size": es, "slot_base": base, "slots": slots}
    split = splitk.count(prog, Ls)  # its GEMM rTasks split along K, by tiling (inspect, meta.split_k)
    P.rprogram = {"veus": grid, "sync_points": nw if spin else 0, "call_sites": len(sites), "entries": len(Ls),
                  **({"sync": "counters", "dependencies": len(dep_list) // 2} if counters else {}),
                  **({"blocks_per_sm": per_sm} if per_sm > 1 else {}),
                  "waves": [wave_info(w, measured, prog) for w in waves], **({"split_k": split} if split else {})}
    return P


def choose_rkernels(run: _Run, veus: int, dev, ctx, policy: str = "wavefront") -> dict[int, str]:
    """Rammer's kernel policy (`policy` "wavefront"; "efficient" takes the least SM-time for every
    GEMM of every wave instead), per wave. Where a wave's rTasks do not fill the vEUs, each GEMM keeps
    its fastest rKernel (the lowering's choice). Where they do, time x threads matters as much as
    time alone: the wave takes its longest GEMM alone or its GEMMs' summed SM-time over the vEUs,
    whichever is more (the template's cost model for both: kernels/gemm.py tiling_family), and its GEMMs get the tilings that
    minimise that, found by coordinate descent from the fastest ones. With many GEMMs in a wave
    this lands on the resource-efficient tilings (least SM-time; every tiling has 256 threads).
    Only plain GEMM rOperators are re-tiled (not AStitch's fused ones).
    Returns id(launch) -> why, for the launches whose rKernel changed. A tiling split along K
    (kernels/splitk.py) brings its own workspace and counters."""
    prog = ctx.program
    one_sm = dev.model_copy(update={"sms": 1})
    why: dict[int, str] = {}
    for w in run.waves:
        tasks = sum(L.grid for L in w)
        if policy == "wavefront" and (len(w) < 2 or tasks < veus):
            continue
        gemms = [L for L in w if _plain_gemm(prog, L)]
        if not gemms:
            continue
        family = {id(L): tiling_family(L.expr.tiling, dev, getattr(ctx, "split_k", True)) for L in gemms}
        cost = {(id(L), t): (family[id(L)][1](t, *_mnk(L), dev), family[id(L)][1](t, *_mnk(L), one_sm))
                for L in gemms for t in family[id(L)][0]}

        def wave_cycles(pick: dict) -> float:
            c = [cost[(id(L), pick[id(L)])] for L in gemms]
            if policy == "efficient":
                return sum(b for _, b in c) / veus
            return max(max(a for a, _ in c), sum(b for _, b in c) / veus)

        pick = {id(L): L.expr.tiling for L in gemms}
        start = best = wave_cycles(pick)
        for _ in range(3):
            improved = False
            for L in gemms:
                for t in family[id(L)][0]:
                    old, pick[id(L)] = pick[id(L)], t
                    c = wave_cycles(pick)
                    if c < best * (1 - 1e-9):
                        best, improved = c, True
                    else:
                        pick[id(L)] = old
            if not improved:
                break
        for L in gemms:
            e, t = L.expr, pick[id(L)]
            if t == e.tiling:
                continue
            sp = e.spec
            extra = retile(ctx, L, t, f"{e.hint}_{t.name}", sp, lambda n, t=t, sp=sp: gemm_source(n, sp, t),
                           e.splitk_args, "rammer")
            L.expr = GemmExpr(e.hint, sp, t, e.args, e.reads, e.writes, extra)
            L.deep_tiling = None
            if policy == "efficient":
                why[id(L)] = (f"tiling {t.name}: the least time x threads (kernels: efficient); its wave's summed "
                              f"SM-time over the {veus} vEUs drops from {start:.0f} to {best:.0f} modelled cycles; "
                              f"{e.tiling.name} is the fastest alone")
            else:
                why[id(L)] = (f"tiling {t.name}: chosen for its wave, whose {tasks} rTasks fill the {veus} vEUs: the "
                              f"wave's modelled cycles drop from {start:.0f} to {best:.0f} (time alone, and time x "
                              f"threads over the vEUs); {e.tiling.name} is the fastest alone")
    return why


def _plain_gemm(prog, L: Launch) -> bool:
    """Whether launch `L` runs the GEMM rOperator its GemmExpr describes, as emitted (not one that
    AStitch re-emitted with fused loads or stores): what Rammer may re-tile from the expression."""
    e = L.expr
    return isinstance(e, GemmExpr) and prog.kernels[L.kernel].code == gemm_source(L.kernel, e.spec, e.tiling)


def retile_standalone(state: CompileState, grouped: set[int]) -> None:
    """Give each GEMM launch that no persistent kernel took the DEEP tiling `lower` gave up for it.
    Why: `lower` prices a DEEP tiling (dynamic shared memory, which a persistent kernel cannot
    give an rTask on most specs) with the launch it keeps to itself, so that Rammer can join the
    GEMM (passes/lower.py _unjoinable_us). Where Rammer then joins nothing around it (GPT-2 at
    bf16: no wave holds two launches), that launch is paid anyway, and the faster tiling is free.
    Plain GEMM rOperators and AStitch's fused ones are re-emitted alike (kernels/gemm.py retile)."""
    ctx = state.ctx
    prog = ctx.program
    back = []
    for L in prog.launches:
        t = L.deep_tiling
        if t is None or id(L) in grouped:
            continue
        e = L.expr
        if _plain_gemm(prog, L):
            extra = retile(ctx, L, t, f"{e.hint}_{t.name}", e.spec, lambda n, t=t, sp=e.spec: gemm_source(n, sp, t),
                           e.splitk_args, "rammer")
            L.expr = GemmExpr(e.hint, e.spec, t, e.args, e.reads, e.writes, extra)
        elif L.fused_gemm is not None:
            hint, spec, text_for, old = L.fused_gemm
            extra = retile(ctx, L, t, f"{hint}_{t.name}_fused", spec,
                           lambda n, t=t, f=text_for: f(t).replace("KNAME", n), old, "rammer")
            L.fused_gemm = (hint, spec, text_for, extra)
        else:
            continue
        L.deep_tiling = None
        back.append(t.name)
    if back:
        names = sorted(set(back))
        state.log.append(f"rammer: {len(back)} GEMM launch(es) that stay on their own take back the DEEP tiling "
                         f"lower gave up for a joinable one: " + ", ".join(f"{n} x{back.count(n)}" for n in names))


def _mnk(L: Launch) -> tuple[int, int, int, int]:
    sp = L.expr.spec
    return sp.batch, sp.M, sp.N, sp.K


def joins_dynamic_smem(dev) -> bool:
    """Whether a persistent kernel on `dev` may take its shared memory dynamically, and so run a
    DEEP GEMM tiling's rTasks (DeviceSpec.persistent_dynamic_smem, on a GPU spec)."""
    return getattr(dev, "kind", "gpu") == "gpu" and bool(getattr(dev, "persistent_dynamic_smem", False))


def launch_floor_us(dev, graphs: bool) -> float:
    """The least a separate launch costs: the host's launch overhead, or, where the plan is
    replayed as one CUDA graph, only the device's own fixed cost per kernel (the host launches the
    graph once). Priced with the host's 4 µs under a graph, joining looked cheaper than it is: on
    an H200, BERT-base's one persistent kernel ran 1.22-1.36x slower than its 111 graphed launches
    at fp32, tf32 and bf16, which Rammer had predicted 8% faster."""
    return dev.kernel_fixed_us if graphs else dev.launch_overhead_us


def _wave_kernel_us(w: list[Launch], info: dict, dev, veus: int, graphs: bool = False) -> float:
    """µs of wave `w` (`info`: its wave_info) as one non-spinning kernel on `dev`: a wave whose
    launches were all measured costs one kernel's fixed cost plus its rprogram_time wave time.
    On a device calibrated for dlcc's GEMMs (DeviceSpec.gemm_cycle_us) a wave's GEMMs are priced
    from their tilings: at their own occupancy where the wave is one launch, at a persistent
    kernel's where several ops share it (one kernel of one wave). Each launch costs at least the
    host's launch overhead, and every kernel the device's gap between two kernels (kernel_gap_us)."""
    if info.get("measured"):
        kt = dev.kernel_fixed_us + rprogram_time([info], dev.sms, dev, 0)[1][0]
    else:
        k = kernel_time(info["flops"], info["dram_bytes"], "float32", dev, blocks=info["tasks"], threads=BLOCK,
                        smem_bytes=info.get("smem", 0), gemm=info["gemm"], math_flops=info.get("math_flops"))
        kt = k.us
        if (info.get("gemms") or info.get("attention")) and dev.gemm_cycle_us:
            gemm = None
            if info.get("gemms"):
                gemm = (gemm_model_us(info["gemms"][0][0], info["gemms"][0][1:], dev) if len(w) == 1
                        else wave_gemm_us(info["gemms"], veus, dev))
            att = wave_attention_us(info["attention"], veus, dev) if info.get("attention") else None
            if gemm is not None or att is not None:
                kt = dev.kernel_fixed_us + max((gemm or 0.0) + (att or 0.0), k.compute_us, k.memory_us)
    return max(kt, launch_floor_us(dev, graphs)) + dev.kernel_gap_us


def _split_waves(run: _Run, dev, veus: int, graphs: bool = False) -> list[tuple[float, bool]]:
    """Each wave of the run without a persistent kernel: (µs, combined), the cheaper of its
    launches combined into one non-spinning kernel (Rammer's one-wave rProgram) and its launches
    left as they are (a wave of one launch stays it).

    The combined kernel is priced as what it is built as: on a device that builds Rammer's
    kernels unoptimised (PoCL: DeviceSpec.unoptimised_slowdown), through rprogram_time, which
    charges that. Priced as an ordinary kernel, three BERT MatMuls combined on PoCL were
    predicted at 120 µs and ran 6.9 ms, where the three launches took 165 µs. Under a CUDA graph
    (`graphs`) a separate launch costs no host launch overhead (launch_floor_us)."""
    out = []
    for w, info in zip(run.waves, run.wave_work()):
        info = dict(info, smem=run.smem)
        alone = sum(_wave_kernel_us([L], dict(wave_info([L], run.measured, run.prog), smem=run.rops[L.kernel].smem_bytes),
                                    dev, veus, graphs) for L in w)
        if len(w) == 1:
            out.append((alone, False))
            continue
        combined = (max(rprogram_time([info], max(1, veus), dev, 0)[0], launch_floor_us(dev, graphs)) + dev.kernel_gap_us
                    if dev.unoptimised_costs else _wave_kernel_us(w, info, dev, veus, graphs))
        out.append((combined, True) if combined <= alone else (alone, False))
    return out


@register_pass("rammer", RammerOptions, after=("lower", "astitch"), before=("memplan",))
def run_rammer(state: CompileState, opts: RammerOptions) -> None:
    """Co-schedule runs of launches as rTasks in table-driven persistent kernels (Rammer)."""
    ctx = state.ctx
    prog = ctx.program
    dev = state.device
    smem_limit = getattr(dev, "shared_mem_per_block", 48 * 1024)
    rops = {}

    def eligible(L: Launch):
        k = prog.kernels[L.kernel]
        if L.grid_sync or k.smem_bytes > smem_limit or (k.dynamic_smem and not joins_dynamic_smem(dev)):
            # (dynamic shared memory, a DEEP GEMM tiling's: a persistent kernel's array is static
            # unless the device spec says it may be dynamic)
            return None
        if k.block != BLOCK and not (k.normalisable and BLOCK % k.block == 0 and dev.kind != "cpu"):
            # A block size the persistent kernel's 256 threads cannot stand in for; or a CPU
            # device, where PoCL runs work-items one after another, so idle threads cost real time.
            return None
        if len(L.args) > MAX_SITE_ARGS:
            # Each call site is an out-of-line function of the launch's arguments: hundreds of
            # them (a Concat of 300 pieces) are passed on the stack, which ptxas counts as spills.
            return None
        if L.kernel not in rops:
            try:
                rops[L.kernel] = to_roperator(k.name, k.code, k.block, L.grid, k.smem_bytes)
            except NotAnROperator:
                rops[L.kernel] = None
        r = rops[L.kernel]
        return r if r is not None and not r.spin and r.tasks == L.grid and r.smem_bytes <= smem_limit else None

    cap = opts.call_sites or (CPU_CALL_SITES if dev.kind == "cpu" else GPU_CALL_SITES)
    runs = _split_runs(prog, eligible, cap, opts.min_launches)
    if not runs:
        state.log.append("rammer: no run of co-schedulable launches"
                         + (": run_join ignored" if opts.run_join else ""))
        ctx.rammer_runs = []
        retile_standalone(state, set())
        prog.prune_unlaunched()
        return

    sync_slots = state.graph.tensors[SYNC].shape[0] // 2 if SYNC in state.graph.tensors else 0
    tabs = sum(1 for t in state.graph.tensors if t.startswith("%rtab"))
    pos = {id(L): i for i, L in enumerate(prog.launches)}
    db = state.profile_db
    measured = measured_busy([prog.launches[i] for r in runs for i in r], db, dev)
    decided = []  # (run, groups, decision, veus, blocks per SM, why, predicted µs, per-wave µs)
    rk_why: dict[int, str] = {}
    run_table = []  # every run with more than one wave: the join decisions inspect and --tune see
    for r_no, idx in enumerate(runs):
        run = _Run(idx, [prog.launches[i] for i in idx], rops, ctx.resolve, measured, prog)
        per_sm = resident_per_sm(dev, run.smem, opts.blocks_per_sm)
        if per_sm < opts.blocks_per_sm and dev.kind != "cpu":
            state.log.append(f"rammer: blocks_per_sm={opts.blocks_per_sm} does not fit {dev.name} with {run.smem} B of "
                             f"shared memory a block; {per_sm}")
        veus, why = proven_veus(dev, run.smem, per_sm)
        if veus and opts.kernels != "fastest" and getattr(ctx, "gemm_tiling", None) is None:
            # (a tiling forced in `lower` stays)
            changed = choose_rkernels(run, veus, dev, ctx, opts.kernels)
            if changed:
                rk_why.update(changed)
                for L in run.Ls:
                    if id(L) in changed:
                        measured.pop(id(L), None)  # its time was measured for another rKernel
                        eligible(L)  # its rOperator form
                run = _Run(idx, run.Ls, rops, ctx.resolve, measured, prog)
                per_sm = resident_per_sm(dev, run.smem, opts.blocks_per_sm)
                veus, why = proven_veus(dev, run.smem, per_sm)
        if opts.veus and veus:
            if opts.veus > veus:
                state.log.append(f"rammer: veus={opts.veus} is more than the {veus} proven resident on {dev.name}; "
                                 f"using {veus}")
            else:
                why = f"{opts.veus}: the pipeline's veus option (proven: {why})"
            veus = min(veus, opts.veus)
        multi = len(run.waves) > 1
        persistent_us, wave_us = rprogram_time(run.wave_work(), max(1, veus), dev, len(run.waves) if multi else 0,
                                               per_sm)
        persistent_us += dev.kernel_gap_us  # one kernel's (each separate launch pays its own: _split_waves)
        split = _split_waves(run, dev, max(1, veus), state.graphs)
        split_us = sum(us for us, _ in split)
        if not multi:
            join = split[0][1]
            decision = ("one wave: one launch, no grid barrier" if join else
                        f"one wave: its {len(run.waves[0])} launches kept apart ({split_us:.1f} µs on {dev.name}, "
                        "less than combined into one kernel)")
        elif veus < 1:
            decision, join = (f"refused: co-residency cannot be proven ({why}); one launch per wave instead", False)
            state.log.append(f"rammer: {decision}")
        elif r_no in opts.run_join:
            join = opts.run_join[r_no]
            decision = (f"run_join: {'joined' if join else 'kept apart'} (pipeline option; the estimate: one "
                        f"persistent kernel {persistent_us:.1f} µs vs one launch per wave {split_us:.1f} µs)")
        elif opts.join == "never":
            decision, join = "join: never (pipeline option): one launch per wave", False
        elif opts.join == "always":
            decision, join = "join: always (pipeline option)", True
        else:
            join = persistent_us <= split_us
            decision = (f"estimate: one persistent kernel {persistent_us:.1f} µs vs one launch per wave "
                        f"{split_us:.1f} µs on {dev.name}{' (launches in one CUDA graph)' if state.graphs else ''}: "
                        f"{'joined' if join else 'kept apart'}")
        if multi:
            run_table.append({"run": r_no, "launches": len(run.Ls), "waves": len(run.waves), "joined": join,
                              "decidable": veus >= 1, "joined_us": round(persistent_us, 3),
                              "apart_us": round(split_us, 3), "decision": decision,
                              "first_node": run.Ls[0].node, "ops": sorted({L.op_type or "op" for L in run.Ls})})
        if join:
            groups = [(run.waves, multi)]
        else:  # one launch per wave where combining it pays; a wave of one op stays the original launch
            groups = [([w], False) for w, (_, combined) in zip(run.waves, split) if combined]
            if multi:  # no rProgram records it: the pass log says why the run stays apart
                state.log.append(f"rammer: a run of {len(run.Ls)} launches in {len(run.waves)} waves: {decision}; "
                                 f"{len(groups)} wave(s) combined into one launch each")
        decided.append((run, groups, decision, veus, per_sm, why, persistent_us if join else None,
                        wave_us if join else None))

    # Kernels that stay plain launches keep their own text; where that text already defines the
    # task function (GEMM/Conv are written as rOperators), a persistent kernel must not define it again.
    grouped = {id(L) for d in decided for waves, _ in d[1] for w in waves for L in w}
    retile_standalone(state, grouped)
    standalone = {L.kernel for L in prog.launches if id(L) not in grouped}
    included = {k for k in standalone if rops.get(k) is not None and rops[k].code == prog.kernels[k].code}
    # One kernel text may run both on its own and as an rTask: two stitches of one structure have
    # one name. Its own text then takes the rOperator form (a thin KERNEL calling the task
    # function), and the persistent kernel includes nothing of it again. Otherwise the helper
    # functions were defined twice, and neither nvcc nor OpenCL builds that (graph 900170 of the
    # bfloat16-model fuzz run: two Casts of 70 values, one joined, one after the last wave).
    joined = {L.kernel for L in prog.launches if id(L) in grouped}
    for k in sorted((joined & standalone) - included):
        if rops.get(k) is not None:
            prog.kernels[k].code = rops[k].code
            included.add(k)
    replaced: dict[int, list[Launch]] = {}
    drop: set[int] = set()
    report = []
    for run, groups, decision, veus, per_sm, why, persistent_us, wave_us in decided:
        by_first: dict[int, Launch] = {}
        for waves, spin in groups:
            P = _emit(state, waves, rops, spin, max(1, veus), per_sm if spin else 1, sync_slots, included, tabs, measured,
                      opts.sync)
            tabs += 1
            if spin:  # (counters: one per entry and one for the blocks that left, two to a slot)
                sync_slots += (sum(len(w) for w in waves) + 2) // 2 if opts.sync == "counters" else 1
            by_first[min(pos[id(L)] for w in waves for L in w)] = P
            report.append({
                "kernel": P.kernel, "launches": sum(len(w) for w in waves), "waves": len(waves),
                "veus": P.grid, "smem_bytes": run.smem, "veus_from": why if spin else
                f"{P.grid}: one per rTask (one wave, no grid barrier)",
                "sync_points": P.rprogram["sync_points"], "call_sites": P.rprogram["call_sites"],
                **({"sync": "counters", "dependencies": P.rprogram["dependencies"]} if "dependencies" in P.rprogram else {}),
                "decision": decision, "time_source": _time_source(waves, measured, db, dev),
                "predicted_us": persistent_us,
                "predicted_us_per_wave": [round(u, 3) for u in wave_us] if wave_us else None,
                "wave_ops": [[f"{L.op_type} ({L.grid} rTasks" + (f" x {L.block} threads" if L.block != BLOCK else "")
                              + f", {L.kernel})" for L in m] for m in waves],
                "tasks_per_wave": [sum(L.grid for L in m) for m in waves],
                "rkernels": [{"op": L.op_type, "node": L.node, "rkernel": L.kernel, "tasks": L.grid, "threads": L.block,
                              "why": rk_why.get(id(L)) or _why_rkernel(prog.kernels[L.kernel], opts.kernels)}
                             for w in waves for L in w]})
        new: list[Launch] = []
        for i in run.idx:
            L = prog.launches[i]
            if i in by_first:
                new.append(by_first[i])
            elif id(L) not in grouped:
                new.append(L)
        replaced[run.idx[0]] = new
        drop |= set(run.idx[1:])
    if sync_slots:
        state.graph.tensors[SYNC] = Tensor(SYNC, (2 * sync_slots,), "int32")
    before = len(prog.launches)
    out: list[Launch] = []
    for i, L in enumerate(prog.launches):
        if i in replaced:
            out += replaced[i]
        elif i not in drop:
            out.append(L)
    prog.launches = out
    prog.prune_unlaunched()
    ctx.rammer_report = report
    ctx.rammer_runs = run_table
    unknown = sorted(set(opts.run_join) - {r["run"] for r in run_table})
    if unknown:
        state.log.append(f"rammer: run_join names run(s) {', '.join(map(str, unknown))}, but this plan's runs of more "
                         f"than one wave are {', '.join(str(r['run']) for r in run_table) or 'none'}: ignored")
    state.log.append(f"rammer: {before} launch(es) -> {len(prog.launches)}; {len(report)} rProgram(s), "
                     f"{sum(r['waves'] for r in report)} wave(s)")


def _time_source(waves: list[list[Launch]], measured: dict, db, dev) -> str:
    """Where the rTask times behind an rProgram's estimate came from (the plan records it)."""
    model = f"cost model (roofline per wave, DeviceSpec {dev.name})"
    if db is None:
        return f"{model}; no profile database at compile time (--profile-db)"
    n = sum(len(w) for w in waves)
    hit = sum(1 for w in waves for L in w if id(L) in measured)
    full = sum(1 for w in waves if all(id(L) in measured for L in w))
    return (f"profile:{db.name}: {hit} of {n} rTask launches measured on {dev.name}; {full} of {len(waves)} "
            f"wave(s) priced from them, the rest by the {model}")


def _why_rkernel(k, policy: str = "wavefront") -> str:
    if (k.kind == "gemm" or k.tiling) and policy == "fastest":
        return f"tiling {k.tiling}: the fastest alone (kernels: fastest, the pipeline option)"
    if (k.kind == "gemm" or k.tiling) and policy == "efficient":
        return f"tiling {k.tiling}: the fastest alone, and also the least time x threads (kernels: efficient)"
    if k.kind == "gemm" or k.tiling:
        return (f"tiling {k.tiling}: the fastest alone (the lowering's cost model): its wave does not fill the vEUs, "
                "or this tiling is also the resource-efficient one")
    if k.block != BLOCK:
        return (f"the only rKernel of its op ({k.kind}, {k.block} threads, block-normalised: threads "
                f"{k.block}..{BLOCK - 1} of the vEU skip its work and join its barriers)")
    return f"the only rKernel of its op ({k.kind}, {BLOCK} threads)"
