"""rammer (DESIGN.md §5), first version: runs of launches become one persistent kernel each, with
their rTasks co-scheduled wave by wave on a virtual device.

What it does today:
  - every eligible launch is an rOperator (kernels/roperator.py: `NAME_task(args, task_id,
    thread_id, smem)`); eligible means not spin-waiting itself, 256 threads per task, and shared
    memory within the device's per-block limit;
  - a maximal run of eligible launches (capped by `max_kernels` and `max_params`) is split into
    BFS waves from its read/write sets (RAW, WAR and WAW on the resolved buffers): launches in the
    same wave are independent, so their rTasks share the vEUs;
  - the persistent kernel deals each wave's rTasks round-robin to the vEUs (vEU v runs tasks v,
    v+G, ...), one loop per op, with a block barrier after each task (the next one reuses `smem`)
    and a grid barrier (generation counters, no reset between runs) between waves;
  - a run of one wave needs no grid barrier and launches as many blocks as it has rTasks; a run
    with several waves is a spin-waiting launch, which the executor clamps to the blocks the
    runtime proves resident, as for AStitch's Global scheme.

Not yet (issue 8): built-in pipelines, the schedule as a device table instead of unrolled loops,
mixed block sizes, kernel choice per wave, fine-grained dependency counters, the LSTM layers x time wavefront,
operand addressing by storage base + offset, `inspect --rprogram`, and the estimator's rProgram model.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ..ir import Tensor
from ..kernels.program import Launch, ctype
from ..kernels.roperator import NotAnROperator, to_roperator
from . import CompileState, register_pass

from .astitch import SYNC  # noqa: E402  (two ints per spin-waiting launch, shared with astitch)
BLOCK = 256


class RammerOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_kernels: int = Field(4, ge=2, description="launches per persistent kernel. PoCL keeps every "
                             "work-item's values that live across a barrier on its worker thread's stack, for every "
                             "inlined rTask; at 6 GEMM-heavy launches that stack overflows (segfault), at 4 every "
                             "test model runs")
    max_params: int = Field(96, ge=4, description="distinct tensor parameters per persistent kernel")
    min_launches: int = Field(2, ge=2, description="runs shorter than this stay plain launches")


def _deps(launches: list[Launch], res) -> list[int]:
    """BFS wave (0-based) of each launch in a run: one more than the latest earlier launch it
    conflicts with (read-after-write, write-after-read, write-after-write on resolved buffers)."""
    sets = [({res(t) for t in L.reads}, {res(t) for t in L.writes}) for L in launches]
    level = []
    for i, (r, w) in enumerate(sets):
        lv = 0
        for j, (pr, pw) in enumerate(sets[:i]):
            if pw & (r | w) or pr & w:
                lv = max(lv, level[j] + 1)
        level.append(lv)
    return level


@register_pass("rammer", RammerOptions)
def run_rammer(state: CompileState, opts: RammerOptions) -> None:
    """Co-schedule runs of launches as rTasks in persistent kernels, wave by wave (Rammer)."""
    ctx = state.ctx
    prog = ctx.program
    dev = state.device
    smem_limit = getattr(dev, "shared_mem_per_block", 48 * 1024)
    rops = {}

    def eligible(L: Launch):
        k = prog.kernels[L.kernel]
        if L.grid_sync or k.block != BLOCK or k.smem_bytes > smem_limit:
            return None
        if k.kind == "stitch" and "BARRIER()" in k.code:
            # A stitched kernel whose phases sync on block barriers gave NaN inside a persistent
            # kernel on PoCL (hf llama and t5-encoder through astitch + rammer), though it runs
            # right in task form on its own: left as its own launch until that is understood.
            return None
        if L.kernel not in rops:
            try:
                rops[L.kernel] = to_roperator(k.name, k.code, k.block, L.grid, k.smem_bytes)
            except NotAnROperator:
                rops[L.kernel] = None
        r = rops[L.kernel]
        return r if r is not None and not r.spin and r.tasks == L.grid and r.smem_bytes <= smem_limit else None

    runs: list[list[int]] = []
    cur: list[int] = []
    params: set[str] = set()
    for i, L in enumerate(prog.launches):
        ok = eligible(L) is not None
        tens = {a for kind, a in L.args if kind == "t"}
        if ok and cur and (len(cur) >= opts.max_kernels or len(params | tens) > opts.max_params):
            runs.append(cur)
            cur, params = [], set()
        if ok:
            cur.append(i)
            params |= tens
        else:
            if cur:
                runs.append(cur)
            cur, params = [], set()
    if cur:
        runs.append(cur)
    runs = [r for r in runs if len(r) >= opts.min_launches]
    if not runs:
        state.log.append("rammer: no run of co-schedulable launches")
        return

    sync_slots = state.graph.tensors[SYNC].shape[0] // 2 if SYNC in state.graph.tensors else 0
    replaced: dict[int, Launch] = {}
    drop: set[int] = set()
    report = []
    included: set[str] = set()  # task functions already defined by an earlier persistent kernel (one source)
    for run in runs:
        Ls = [prog.launches[i] for i in run]
        level = _deps(Ls, ctx.resolve)
        waves = max(level) + 1
        by_wave = [[L for L, lv in zip(Ls, level) if lv == w] for w in range(waves)]
        tensors: list[str] = []
        for L in Ls:
            for kind, a in L.args:
                if kind == "t" and a not in tensors:
                    tensors.append(a)
        pname = {t: f"p{j}" for j, t in enumerate(tensors)}
        spin = waves > 1
        decls = [f"GPTR {ctype(state.graph.tensors[t].dtype)}* {pname[t]}" for t in tensors]
        if spin:
            decls += ["GPTR int* rsync", "const int rslot"]
        dev_code = []
        smem = max([rops[L.kernel].smem_bytes for L in Ls] + [4])
        body = [f"SHARED float smem[{-(-smem // 4)}];", "const int tid = THREAD_ID;"]
        widest = 0
        for w, members in enumerate(by_wave):
            total = sum(L.grid for L in members)
            widest = max(widest, total)
            body.append(f"/* wave {w}: {len(members)} op(s), {total} rTasks */")
            off = 0
            for L in members:
                r = rops[L.kernel]
                if L.kernel not in included:
                    included.add(L.kernel)
                    dev_code.append(r.device_code)
                call_args = [pname[a] if kind == "t" else str(int(a)) for kind, a in L.args]
                call = f"{r.task_fn}({', '.join(call_args + [f't - {off}', 'tid', 'smem'])});"
                # The wave's rTasks are numbered across its ops and dealt round-robin to the vEUs;
                # one loop per op (not an if-chain in one loop) keeps every barrier in straight-line
                # code under a uniform loop condition, which PoCL's barrier handling needs.
                start = "BLOCK_ID" if off == 0 else f"BLOCK_ID + ({off} - BLOCK_ID + GRID_DIM - 1) / GRID_DIM * GRID_DIM"
                if off:
                    start = f"(BLOCK_ID >= {off} ? BLOCK_ID : {start})"
                body += [f"for (int t = {start}; t < {off + L.grid}; t += GRID_DIM) {{", f"    {call}", "    BARRIER();",
                         "}"]
                off += L.grid
            if w < waves - 1:
                body.append("dlcc_grid_sync(rsync + rslot);")
        bounds = "LAUNCH_BOUNDS(256) " if spin else ""
        text = "".join(dev_code) + (f"KERNEL void {bounds}KNAME({', '.join(decls)}) {{\n    "
                                    + "\n    ".join(body) + "\n}\n")
        hint = "Rammer_" + "_".join(dict.fromkeys(L.op_type or "op" for L in Ls))[:40]
        kname = prog.add_kernel(hint, lambda nm, t=text: t.replace("KNAME", nm), BLOCK, smem_bytes=smem,
                                kind="persistent", pass_name="rammer")
        args = [("t", t) for t in tensors]
        reads = list(dict.fromkeys(t for L in Ls for t in L.reads))
        writes = list(dict.fromkeys(t for L in Ls for t in L.writes))
        if spin:
            args += [("t", SYNC), ("i", 2 * sync_slots)]
            writes.append(SYNC)
            sync_slots += 1
        # A spin launch asks for one vEU per SM (LAUNCH_BOUNDS proves that many resident), never
        # more than its widest wave; the executor clamps it further to what the runtime proves.
        grid = min(widest, max(1, getattr(dev, "sms", 1))) if spin else widest
        P = Launch(kernel=kname, grid=grid, block=BLOCK, args=args, reads=reads, writes=writes,
                   node="+".join(L.node for L in Ls[:3]) + ("+..." if len(Ls) > 3 else ""), op_type="Rammer",
                   flops=sum(L.flops for L in Ls), dram_bytes=sum(L.dram_bytes for L in Ls), pass_name="rammer",
                   category="compute" if any(L.category == "compute" for L in Ls) else "elementwise")
        P.grid_sync = spin
        replaced[run[0]] = P
        drop |= set(run[1:])
        report.append({
            "kernel": kname, "launches": len(Ls), "waves": waves, "veus": grid, "smem_bytes": smem,
            "veus_from": (f"{grid} = min(widest wave, SMs x 1 block: LAUNCH_BOUNDS(256)); the runtime clamps it "
                          "to the blocks it proves resident" if spin else f"{grid}: one per rTask (one wave, no grid barrier)"),
            "sync_points": waves - 1,
            "wave_ops": [[f"{L.op_type} ({L.grid} rTasks, {L.kernel})" for L in m] for m in by_wave],
            "tasks_per_wave": [sum(L.grid for L in m) for m in by_wave]})
    if sync_slots:
        state.graph.tensors[SYNC] = Tensor(SYNC, (2 * sync_slots,), "int32")
    before = len(prog.launches)
    prog.launches = [replaced.get(i, L) for i, L in enumerate(prog.launches) if i not in drop]
    used = {L.kernel for L in prog.launches}
    prog.kernels = {n: k for n, k in prog.kernels.items() if n in used}
    ctx.rammer_report = report
    state.log.append(f"rammer: {before} launch(es) -> {len(prog.launches)}; {len(runs)} persistent kernel(s), "
                     f"{sum(r['waves'] for r in report)} wave(s)")
