"""The tiled shared-memory GEMM template, emitted as a Rammer rOperator.

Every compute op (MatMul, Gemm, Conv as implicit GEMM, the LSTM's projections) is a batch of
C[b] = A[b] (MxK) · B[b] (KxN) whose element loads are C expressions supplied by the op, so one
template serves transposed operands, broadcast batches and im2col-free convolution. Each
BMxBN output tile is one rTask, emitted as a device function
`NAME_task(args..., task_id, thread_id, smem)` plus a thin KERNEL that runs task = block id;
Rammer's persistent kernels later call the same device function from a vEU loop.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Tiling:
    bm: int
    bn: int
    bk: int
    tm: int
    tn: int

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)

    @property
    def smem_floats(self) -> int:
        return self.bk * (self.bm + self.bn)

    @property
    def name(self) -> str:
        return f"{self.bm}x{self.bn}x{self.bk}_{self.tm}x{self.tn}"


#: Several rKernels per rOperator: big tiles for big GEMMs, small and skinny ones to fill the device.
TILINGS = (
    Tiling(64, 64, 16, 4, 4),
    Tiling(32, 64, 16, 2, 4),
    Tiling(16, 64, 16, 1, 4),
    Tiling(32, 32, 16, 2, 2),
)


def tasks_for(t: Tiling, batch: int, M: int, N: int) -> int:
    return batch * -(-M // t.bm) * -(-N // t.bn)


def choose_tiling(batch: int, M: int, N: int, K: int, slots: int) -> Tiling:
    """Fewest padded-tile waves: cost = ceil(tasks / slots) × tile area (a wave-quantized roofline).

    `slots` is the number of thread blocks resident at once on the target (SMs × blocks per SM).
    Ties go to the larger tile (better reuse of each loaded element).
    """
    best, best_cost = None, None
    for t in TILINGS:
        tasks = tasks_for(t, batch, M, N)
        waves = -(-tasks // max(1, slots))
        cost = waves * t.bm * t.bn * (1.0 + 16.0 / t.bm + 16.0 / t.bn)
        if best_cost is None or cost < best_cost - 1e-9:
            best, best_cost = t, cost
    return best


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
    # Set where the store is exactly `OUT[store_index(m, n)] = store_value(acc)` on the last param:
    # AStitch then fuses elementwise consumers of the output into the store (a GEMM epilogue).
    store_index: Callable[[str, str], str] | None = None
    store_value: Callable[[str], str] | None = None


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


def _indent(lines, n):
    return [" " * n + s for s in lines]


def gemm_source(name: str, spec: GemmSpec, t: Tiling) -> str:
    tiles_m, tiles_n = -(-spec.M // t.bm), -(-spec.N // t.bn)
    T = t.threads
    cols = t.bn // t.tn
    rows = t.bm // t.tm
    arg_names = [p.split()[-1].lstrip("*") for p in spec.params]
    sa, va = spec.load_a("m", "k")
    sb, vb = spec.load_b("k", "n")
    if spec.a_k_contiguous:
        a_idx = [f"const int mm = l / {t.bk}, kk = l % {t.bk};"]
    else:
        a_idx = [f"const int kk = l / {t.bm}, mm = l % {t.bm};"]
    if spec.b_n_contiguous:
        b_idx = [f"const int kk = l / {t.bn}, nn = l % {t.bn};"]
    else:
        b_idx = [f"const int nn = l / {t.bk}, kk = l % {t.bk};"]
    store = spec.store("m", "n", "acc[i][j]")
    dev = [
        f"DEVICE void {name}_task({', '.join(spec.params)}, const int task, const int tid, LPTR float* smem) {{",
        f"    LPTR float* As = smem;",
        f"    LPTR float* Bs = smem + {t.bk * t.bm};",
        f"    const int bt = task / {tiles_m * tiles_n};",
        f"    const int tile = task % {tiles_m * tiles_n};",
        f"    const int m0 = (tile / {tiles_n}) * {t.bm};",
        f"    const int n0 = (tile % {tiles_n}) * {t.bn};",
        f"    const int tx = tid % {cols}, ty = tid / {cols};",
        *_indent(spec.prologue or [], 4),
        f"    float acc[{t.tm}][{t.tn}];",
        f"    for (int i = 0; i < {t.tm}; ++i) for (int j = 0; j < {t.tn}; ++j) acc[i][j] = 0.0f;",
        f"    for (int k0 = 0; k0 < {spec.K}; k0 += {t.bk}) {{",
        f"        for (int l = tid; l < {t.bm * t.bk}; l += {T}) {{",
        *_indent(a_idx, 12),
        f"            const int m = m0 + mm, k = k0 + kk;",
        f"            float val = 0.0f;",
        f"            if (m < {spec.M} && k < {spec.K}) {{",
        *_indent(sa, 16),
        f"                val = {va};",
        f"            }}",
        f"            As[kk * {t.bm} + mm] = val;",
        f"        }}",
        f"        for (int l = tid; l < {t.bk * t.bn}; l += {T}) {{",
        *_indent(b_idx, 12),
        f"            const int k = k0 + kk, n = n0 + nn;",
        f"            float val = 0.0f;",
        f"            if (k < {spec.K} && n < {spec.N}) {{",
        *_indent(sb, 16),
        f"                val = {vb};",
        f"            }}",
        f"            Bs[kk * {t.bn} + nn] = val;",
        f"        }}",
        f"        BARRIER();",
        f"        #pragma unroll",
        f"        for (int kk = 0; kk < {t.bk}; ++kk) {{",
        f"            float a[{t.tm}], b[{t.tn}];",
        f"            #pragma unroll",
        f"            for (int i = 0; i < {t.tm}; ++i) a[i] = As[kk * {t.bm} + ty + i * {rows}];",
        f"            #pragma unroll",
        f"            for (int j = 0; j < {t.tn}; ++j) b[j] = Bs[kk * {t.bn} + tx + j * {cols}];",
        f"            #pragma unroll",
        f"            for (int i = 0; i < {t.tm}; ++i) {{",
        f"                #pragma unroll",
        f"                for (int j = 0; j < {t.tn}; ++j) acc[i][j] += a[i] * b[j];",
        f"            }}",
        f"        }}",
        f"        BARRIER();",
        f"    }}",
        f"    #pragma unroll",
        f"    for (int i = 0; i < {t.tm}; ++i) {{",
        f"        const int m = m0 + ty + i * {rows};",
        f"        #pragma unroll",
        f"        for (int j = 0; j < {t.tn}; ++j) {{",
        f"            const int n = n0 + tx + j * {cols};",
        f"            if (m < {spec.M} && n < {spec.N}) {{",
        *_indent(store, 16),
        f"            }}",
        f"        }}",
        f"    }}",
        f"}}",
        "",
        f"KERNEL void {name}({', '.join(spec.params)}) {{",
        f"    SHARED float smem[{t.smem_floats}];",
        f"    {name}_task({', '.join(arg_names)}, BLOCK_ID, THREAD_ID, smem);",
        f"}}",
        "",
    ]
    return "\n".join(dev)


def emit_gemm(ctx, hint: str, spec: GemmSpec, args: list[str], reads: list[str], writes: list[str],
              tiling: Tiling | None = None) -> str:
    """Pick a tiling for the target device, emit the rOperator and launch one block per rTask."""
    if tiling is None:
        tiling = getattr(ctx, "gemm_tiling", None)
    if tiling is None:
        slots = ctx.device.block_slots(tiling_threads=256) if ctx.device is not None else 80
        tiling = choose_tiling(spec.batch, spec.M, spec.N, spec.K, slots)
    name = ctx.program.add_kernel(f"{hint}_{tiling.name}", lambda n: gemm_source(n, spec, tiling), tiling.threads,
                                  smem_bytes=4 * tiling.smem_floats, kind="gemm", tiling=tiling.name,
                                  pass_name=ctx.pass_name)
    ctx.launch(name, tasks_for(tiling, spec.batch, spec.M, spec.N), args, reads=reads, writes=writes,
               flops=2 * spec.batch * spec.M * spec.N * spec.K)
    ctx.program.launches[-1].expr = GemmExpr(hint, spec, tiling, list(args), list(reads), list(writes))
    return name
