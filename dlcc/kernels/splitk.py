"""Split-K for every GEMM template (kernels/gemm.py SIMT, gemm_mma.py, gemm_mma_async.py).

Why: at batch 1 a GEMM has few output tiles. BERT-base's 128x768 projections are 24 tiles of
64x64 on an H100's 132 SMs, so 108 SMs idle while 24 walk all of K, each streaming its strip of
the weights alone; the FFN down-projection (K = 3072) is the same 24 tiles over four times the k
steps. cuBLAS splits such GEMMs along K (its traces show `splitKreduce_kernel`). Here a tiling
with `splitk` S > 1 makes each rTask one (tile, k chunk): S times the rTasks, each 1/S of the k
steps, and the partial sums are added up without a second launch and without waiting:

  - every rTask of a tile writes its accumulators (as its threads hold them, thread-major, so the
    layout is the same for the SIMT grid and the mma fragments) to its slot of a workspace,
    fences, and counts itself in on the tile's counter (an atomic add);
  - the rTask that arrives last (the counter's old value is S - 1) adds the S partial sums in k
    order, 0 .. S-1, its own read back like the others, and stores the tile through the op's store (and
    AStitch's epilogue), then sets the counter back to 0 for the next inference.

Nothing spins, so no co-residency is needed (a split GEMM may run as a plain launch, inside a
persistent kernel, or one rTask at a time). The sum's order does not depend on which rTask came
last, so results are bitwise the same on every run. This is the "last block reduces" pattern of
CUDA's threadFenceReduction sample; the counters are a storage of their own (memplan
OWN_STORAGES: zeroed once when a plan is loaded; every tile's last rTask leaves its counter at 0).

Every chunk runs the same constant number of k steps (`steps_per_chunk`); a ragged last chunk
loads zeros past K (the templates' guards). So no loop's bounds read the block index: PoCL 3.1
miscompiles such loops around barriers (dlcc/testing/pocl_kernels.py), and nvcc gets a constant
trip count.

The workspace is a scratch tensor of the launch (tiles x S x BM x BN floats, and 2 x THREADS more
per chunk for a folded LayerNorm's row sums; in the arena, alive only during the launch; in L2 on
a GPU), its counters `tiles` ints of the `%splitk` storage.
"""
from __future__ import annotations

import dataclasses

from ..ir import Tensor

#: The split factors a GPU device's GEMM families offer (kernels/gemm.py tiling_family_for): each
#: base tiling once unsplit and once per factor. A CPU device (PoCL, a few cores) gets none: its
#: tiles already outnumber its cores.
SPLITS = (2, 4, 8)
#: The counters' storage (memplan OWN_STORAGES): `tiles` int32 per split launch.
COUNTERS = "%splitk"
#: Parameters a split rOperator takes after the op's own: the workspace, the counters, and the
#: launch's first counter.
PARAMS = ["GPTR float* sk_ws", "GPTR int* sk_cnt", "const int sk_off"]
ARG_NAMES = ["sk_ws", "sk_cnt", "sk_off"]


def splittable(t) -> bool:
    """Whether tiling `t` comes split at all. Not the register-staged TF32 tile of 128x128 (64
    accumulators a thread, next to the staged A and B fragments): unsplit it already takes 240 of
    the 255 registers a thread may have, and split it spilled in convolutions (ViT-B/16's patch
    embedding, ResNet-50's convolutions at tf32). Its smaller siblings split instead."""
    return not (getattr(t, "wide", False) and t.stages == 1 and t.bm * t.bn >= 128 * 128)


def variants(tilings, device=None, split: bool = True) -> tuple:
    """`tilings` followed by their split variants (those splittable) on a GPU `device` (None: a
    generic GPU), unless `split` is off (`lower`'s option split_k: false)."""
    if getattr(device, "kind", "gpu") == "cpu" or not split:
        return tuple(tilings)
    return tuple(tilings) + tuple(dataclasses.replace(t, splitk=s) for s in SPLITS for t in tilings if splittable(t))


def suffix(splitk: int) -> str:
    """What a split tiling's name adds to its base's: `_sk4`."""
    return f"_sk{splitk}" if splitk > 1 else ""


def base_name(name: str) -> str:
    """The tiling name without its split suffix."""
    head, sep, tail = name.rpartition("_sk")
    return head if sep and tail.isdigit() else name


def steps_per_chunk(t, K: int) -> int:
    """k steps (of t.bk) each of the S chunks runs: all of them the same count."""
    return -(-(-(-K // t.bk)) // t.splitk)


def tile_decode(t, tiles_m: int, tiles_n: int) -> list[str]:
    """The task's batch `bt`, tile `tile`, and, split, its k chunk `sk_kc` and first k `sk_k0`
    (rTasks of one tile are consecutive, chunk fastest)."""
    tiles = tiles_m * tiles_n
    if t.splitk == 1:
        return [f"const int bt = task / {tiles};", f"const int tile = task % {tiles};"]
    return [f"const int sk_kc = task % {t.splitk}, sk_tile = task / {t.splitk};",
            f"const int bt = sk_tile / {tiles};", f"const int tile = sk_tile % {tiles};"]


def chunk_start(t, K: int) -> str:
    """The first k of this rTask's chunk (a C expression)."""
    return "0" if t.splitk == 1 else f"sk_kc * {steps_per_chunk(t, K) * t.bk}"


#: Partial sums a thread may have in flight at once in a split tile's read-back: S chunks of its
#: accumulators where S x accumulators is at most this, else one chunk at a time.
READBACK_REGISTERS = 32


#: Floats a thread adds to its chunk's partial sums for a LayerNorm folded into the GEMM
#: (kernels/row_norm.py): its two sums over the chunk's columns of its row.
STATS = 2


def reduce_partials(t, rows: int, cols: int, threads: int, stats: bool = False) -> list[str]:
    """After the k loop, with shared memory free (the loop's last barrier passed): the partial
    sums of a split rTask into the workspace, the count, and, in the tile's last rTask, the sum
    of all S in k order into `acc`, read back from the workspace (its own slot too, written by the
    same threads). Where S x the thread's accumulators fits READBACK_REGISTERS (the small tiles
    batch-1 GEMMs split: 8 accumulators a thread in 32x64, S 2 or 4), the chunk loop is unrolled
    so that all S chunks' loads are in flight together, one L2 round trip instead of S; the sums
    are still added in k order, so the bits do not change. Larger tiles keep one chunk's loads in
    flight at a time (the loop rolled): all S of them, nvcc had hoisted into 255 registers and
    spills inside persistent kernels (BERT-base fp32 `full`, 4x4 SIMT tiles in 4 chunks).
    With `stats`, a folded LayerNorm's two row sums (`rn_s1`, `rn_s2`, kernels/row_norm.py) go
    out and come back beside the accumulators, summed over the chunks in the same order.
    Defines `sk_last` (1: this rTask stores the tile). Every barrier is at the task's top level;
    the branch holds none. Empty for an unsplit tiling."""
    if t.splitk == 1:
        return []
    S, per = t.splitk, rows * cols
    P = per + (STATS if stats else 0)  # floats a thread keeps per chunk
    slot = f"(({{q}}) * {P} + i * {cols} + j) * {threads} + tid"
    stat = f"(({{q}}) * {P} + {per} + {{e}}) * {threads} + tid"
    out = [] if not stats else [f"sk_w[{stat.format(q='sk_kc', e=0)}] = rn_s1;", f"sk_w[{stat.format(q='sk_kc', e=1)}] = rn_s2;"]
    back = [] if not stats else [
        "    rn_s1 = 0.0f; rn_s2 = 0.0f;  /* a folded LayerNorm's sums over every chunk, in k order */",
        f"    for (int q = 0; q < {S}; ++q) {{ rn_s1 += LOAD_CG(sk_w + {stat.format(q='q', e=0)}); "
        f"rn_s2 += LOAD_CG(sk_w + {stat.format(q='q', e=1)}); }}"]
    return [
        "/* split-K (kernels/splitk.py): partial sums out, count in; the last of the tile's rTasks adds them up */",
        f"GPTR float* sk_w = sk_ws + sk_tile * {S * P * threads};",
        "#pragma unroll",
        f"for (int i = 0; i < {rows}; ++i) {{",
        "    #pragma unroll",
        f"    for (int j = 0; j < {cols}; ++j) sk_w[{slot.format(q='sk_kc')}] = acc[i][j];",
        "}",
        *out,
        "FENCE();",
        "BARRIER();",
        f"if (tid == 0) ((LPTR int*)smem)[0] = ATOMIC_ADD_I32(sk_cnt + sk_off + sk_tile, 1) == {S - 1};",
        "BARRIER();",
        "const int sk_last = ((LPTR int*)smem)[0];",
        "if (sk_last) {",
        "    FENCE();",
        "    #pragma unroll",
        f"    for (int i = 0; i < {rows}; ++i) {{",
        "        #pragma unroll",
        f"        for (int j = 0; j < {cols}; ++j) acc[i][j] = 0.0f;",
        "    }",
        "    #pragma unroll" if S * per <= READBACK_REGISTERS else "    #pragma unroll 1",
        f"    for (int q = 0; q < {S}; ++q) {{",
        "        #pragma unroll",
        f"        for (int i = 0; i < {rows}; ++i) {{",
        "            #pragma unroll",
        f"            for (int j = 0; j < {cols}; ++j) acc[i][j] += LOAD_CG(sk_w + {slot.format(q='q')});",
        "        }",
        "    }",
        *back,
        "    if (tid == 0) ATOMIC_STORE_I32(sk_cnt + sk_off + sk_tile, 0);",
        "}",
    ]


def guard_store(t, store: list[str]) -> list[str]:
    """The template's store loop, run only by the rTask that holds the whole sum when split."""
    if t.splitk == 1:
        return store
    return ["if (sk_last) {", *["    " + s for s in store], "}"]


def params(t) -> list[str]:
    return PARAMS if t.splitk > 1 else []


def arg_names(t) -> list[str]:
    return ARG_NAMES if t.splitk > 1 else []


def tiles_of(t, batch: int, M: int, N: int) -> int:
    return batch * -(-M // t.bm) * -(-N // t.bn)


def launch_args(ctx, t, batch: int, M: int, N: int, stats: bool = False) -> list:
    """The three launch arguments a split tiling adds after the op's: a fresh workspace tensor,
    the counter storage, and this launch's first counter (the counters grow by its tiles).
    Empty for an unsplit tiling. `ctx`: the LowerCtx (its graph gets the tensors). `stats`: a
    LayerNorm folded into the GEMM, whose row sums each chunk adds to its partials."""
    if t.splitk == 1:
        return []
    tiles = tiles_of(t, batch, M, N)
    ws = ctx.temp((tiles * t.splitk * (t.bm * t.bn + (STATS * t.threads if stats else 0)),), "float32")
    g = ctx.graph
    have = g.tensors[COUNTERS].shape[0] if COUNTERS in g.tensors else 0
    g.tensors[COUNTERS] = Tensor(COUNTERS, (have + tiles,), "int32")
    return [ws, COUNTERS, have]


def factor(tiling_name: str) -> int:
    """The split factor a tiling name carries (1: none)."""
    head, sep, tail = (tiling_name or "").rpartition("_sk")
    return int(tail) if sep and tail.isdigit() else 1


def count(program, launches=None) -> dict[str, int]:
    """{tiling name: launches} of the GEMM launches split along K among `launches` (default: the
    KernelProgram's), the rTasks of persistent kernels included (rammer records theirs in
    Launch.rprogram["split_k"])."""
    out: dict[str, int] = {}
    for L in program.launches if launches is None else launches:
        tiling = program.kernels[L.kernel].tiling if L.kernel in program.kernels else ""
        inner = (L.rprogram or {}).get("split_k") or ({tiling: 1} if factor(tiling) > 1 else {})
        for name, n in inner.items():
            out[name] = out.get(name, 0) + n
    return out


def split_tensors(args: list) -> tuple[list[str], list[str]]:
    """(reads, writes) the split arguments add to a launch: the workspace and the counters, both
    written (a launch may read what it writes; the workspace lives only during the launch)."""
    if not args:
        return [], []
    return [], [args[0], args[1]]


def typed(args: list) -> list[tuple[str, object]]:
    """launch_args as Launch.args entries."""
    return [("i", a) if isinstance(a, int) else ("t", a) for a in args]


def tensors(args: list) -> set[str]:
    """The tensors among a split launch's extra arguments (workspace, counters)."""
    return {a for a in args if isinstance(a, str)}


def mark(L, args: list, t, batch: int, M: int, N: int) -> None:
    """Narrow launch L's use of the counters to its own (Launch.regions), so that two split GEMMs
    do not look dependent through the one `%splitk` storage (Rammer's waves)."""
    if args:
        L.regions[COUNTERS] = (4 * args[2], 4 * (args[2] + tiles_of(t, batch, M, N)))


def workspace_cycles(t, per_sm: int, issue_per_cycle: float, latency: float) -> float:
    """Modelled cycles an SM spends on split-K's reduction for `per_sm` rTasks: writing the
    partials and the last rTask reading the other S - 1 (about one tile's floats each, as warp
    instructions: the slot loads amortised over the S rTasks of a tile), plus a fence and atomic
    round trip per rTask. Zero unsplit."""
    if t.splitk == 1:
        return 0.0
    tile_instr = t.bm * t.bn / 32
    return per_sm * (tile_instr * (1 + (t.splitk - 1) / t.splitk) / issue_per_cycle + 2 * latency)


def standalone_args(rt, t, batch: int, M: int, N: int) -> tuple[int, list]:
    """(grid, extra arguments) to launch tiling `t`'s rOperator on its own on runtime `rt` (its
    thin KERNEL, after the op's arguments): for a split tiling a workspace and zeroed counters of
    its own, the rTasks of every tile and chunk. What --tune, scripts/gemm_tilings.py and the
    tests run a tiling with."""
    import numpy as np

    grid = tiles_of(t, batch, M, N) * t.splitk
    if t.splitk == 1:
        return grid, []
    tiles = tiles_of(t, batch, M, N)
    ws = rt.alloc(tiles * t.splitk * t.bm * t.bn * 4)
    cnt = rt.alloc(tiles * 4)
    rt.write(cnt, 0, np.zeros(tiles, np.int32))
    # The allocations themselves, not views of them: a CUDA view is a bare pointer, and the
    # workspace freed on return made the first split launch on a GPU an illegal address.
    return grid, [ws, cnt, 0]
