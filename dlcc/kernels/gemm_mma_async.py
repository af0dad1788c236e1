"""The tensor-core GEMM template at fp16 and bf16 with a multi-stage shared-memory pipeline: the
rOperator contract of kernels/gemm.py (one BMxBN output tile per rTask, GemmSpec's loads and
store, `NAME_task(args..., task, tid, smem)` plus a thin KERNEL), built the way the hardware wants
its operands (PTX ISA: "cp.async", "ldmatrix", "mma.m16n8k16"):

  - Shared memory holds the operands as 16-bit values in STAGES buffers. While the warps compute
    on k block kb, the copies of blocks kb+1 .. kb+STAGES-1 are in flight.
  - An operand that is a plain tensor read already stored in the half type (GemmSpec.raw_a /
    raw_b, aligned to 16 bytes) goes from global to shared memory with `cp.async` in 16-byte
    chunks, past the registers; a chunk outside the tensor is zero-filled. Any other operand
    (an im2col window, a fused prologue, a float32 graph input) is loaded element by element
    into registers when its block is issued, and rounded and stored into the same layout after
    the current block's mmas, so that its latency overlaps arithmetic too.
  - The fragments come out of shared memory with `ldmatrix` (four 8x8 matrices per instruction;
    `.trans` where the operand's contiguous dimension is not k), already packed as the mma wants.
  - Each buffer is XOR-swizzled in 16-byte chunks (`swizzle` below), so that the eight rows one
    ldmatrix phase reads, and the eight chunks one cp.async phase writes, fall in distinct banks
    (tests/test_gemm_mma_async.py checks every tiling's address pattern).

The accumulators are the `acc[i][j]` grid of kernels/gemm_mma.py, so its store loop, and AStitch's
fused epilogues, apply unchanged. On OpenCL, cp.async copies land as late as the PTX ISA allows
(at the wait that covers their group), and a chunk whose address is not 16-byte aligned lands as
NaN where the hardware would fault; ldmatrix and the mma exchange lanes through local memory
(backends/prelude_opencl.h). So the same tile code, the same swizzled addresses, the same group
accounting and the same fragment registers run on PoCL in the default suite.
"""
from __future__ import annotations

from . import splitk as sk
from .gemm import _indent, _per_thread_count
from .gemm_mma import mma_loops, store_accumulators, task_head, thin_kernel, zero_accumulators

WARPS = 8
THREADS = 32 * WARPS
CHUNK = 8  # 16-bit elements in a 16-byte chunk (one cp.async, one ldmatrix row)
#: The half type each precision stores in shared memory, its MMA macro and store macro.
HALF = {"fp16": ("float16", "f16", "MMA_F16_P", "STORE_F16"), "bf16": ("bfloat16", "bf16", "MMA_BF16_P", "STORE_BF16")}


def swizzle(chunk: int, per_row: int) -> int:
    """Where linear 16-byte chunk `chunk` of a buffer whose rows are `per_row` chunks lives: its
    low three bits XORed with the row (rows of 8 or more chunks) or with its 128-byte line (shorter
    rows, several to a line). Eight consecutive rows at one chunk column (an ldmatrix phase) and
    eight consecutive chunks (a cp.async phase) then cover all 32 banks."""
    return chunk ^ ((chunk // max(per_row, 8)) & 7)


def swizzle_expr(chunk: str, per_row: int) -> str:
    """swizzle() as C text over int expression `chunk`."""
    return f"(({chunk}) ^ ((({chunk}) / {max(per_row, 8)}) & 7))"


def async_ok(raw, precision: str, extent: int, K: int) -> bool:
    """Whether operand `raw` (a RawOperand or None) can be copied by cp.async: stored in the
    precision's half type, its rows a whole number of 16-byte chunks (stride and the contiguous
    extent multiples of 8), so every chunk is 16-byte aligned (the memory plan aligns every
    buffer to 256 bytes) and lies wholly inside or wholly outside the tensor."""
    if raw is None or raw.dtype != HALF[precision][0]:
        return False
    contiguous = K if raw.k_contiguous else extent
    return raw.stride % CHUNK == 0 and contiguous % CHUNK == 0


class OperandTile:
    """One operand's buffer geometry in the tile: `rows` x `per_row` chunks, k-contiguous (rows
    are m or n, chunks run along k) or not (rows are k, chunks run along m or n)."""

    def __init__(self, which: str, t, kc: bool):
        self.which, self.kc = which, kc
        self.ext = t.bm if which == "a" else t.bn
        self.rows, self.per_row = (self.ext, t.bk // CHUNK) if kc else (t.bk, self.ext // CHUNK)
        self.elems = self.ext * t.bk
        self.chunks = self.elems // CHUNK

    def addr(self, row: str, chunk: str) -> str:
        """Element offset of the first element of chunk (row, chunk) in a stage buffer."""
        return f"{swizzle_expr(f'({row}) * {self.per_row} + ({chunk})', self.per_row)} * {CHUNK}"


def _fill_raw(op: OperandTile, t, spec, raw, dst: str, k0: str) -> list[str]:
    """cp.async of one k block of a raw operand into stage buffer `dst`."""
    x0, xext = ("m0", spec.M) if op.which == "a" else ("n0", spec.N)
    per = _per_thread_count(op.chunks, THREADS)
    if op.kc:
        where = [f"const int x = {x0} + row, k = {k0} + ch * {CHUNK};"]
        idx = f"{raw.base} + x * {raw.stride} + k"
    else:
        where = [f"const int k = {k0} + row, x = {x0} + ch * {CHUNK};"]
        idx = f"{raw.base} + k * {raw.stride} + x"
    guard = [] if op.chunks % THREADS == 0 else [f"    if (l >= {op.chunks}) continue;"]
    return ["#pragma unroll", f"for (int r = 0; r < {per}; ++r) {{", f"    const int l = tid + r * {THREADS};", *guard,
            f"    const int row = l / {op.per_row}, ch = l % {op.per_row};", *_indent(where, 4),
            f"    const int ok = x < {xext} && k < {spec.K};",
            f"    CP_ASYNC16({dst} + {swizzle_expr('l', op.per_row)} * {CHUNK}, {raw.ptr} + (ok ? {idx} : 0), ok);", "}"]


def _generic_walk(op: OperandTile, t) -> tuple[list[str], str, str, int]:
    """A thread's share of one k block of an operand loaded element by element: the loop head
    (element l = tid + r*THREADS, split so that consecutive threads walk the contiguous
    dimension into `xx`, `kk`), and the swizzled shared offset of element (xx, kk)."""
    per = _per_thread_count(op.elems, THREADS)
    contiguous = t.bk if op.kc else op.ext
    pos = (f"const int xx = l / {contiguous}, kk = l % {contiguous};" if op.kc
           else f"const int kk = l / {contiguous}, xx = l % {contiguous};")
    row, col = ("xx", "kk") if op.kc else ("kk", "xx")
    guard = [] if op.elems % THREADS == 0 else [f"    if (l >= {op.elems}) continue;"]
    # MMA_UNROLL: unrolled for nvcc; a loop on OpenCL, where PoCL's LLVM 15 crashed (SIGSEGV in
    # the inliner) building an AStitch-fused kernel whose unrolled fills each inlined a prologue.
    head = ["MMA_UNROLL", f"for (int r = 0; r < {per}; ++r) {{", f"    const int l = tid + r * {THREADS};", *guard,
            f"    {pos}"]
    return head, f"{op.addr(row, f'{col} / {CHUNK}')} + {col} % {CHUNK}", f"stage_{op.which}", per


def _load_generic(op: OperandTile, t, spec, k0: str) -> list[str]:
    """Element loads of one k block of an operand into the thread's staging registers (`stage_a`
    or `stage_b`), zero outside the tensor."""
    head, _, regs, _ = _generic_walk(op, t)
    if op.which == "a":
        (stmts, val), (x, x0, xext) = spec.load_a("m", "k"), ("m", "m0", spec.M)
    else:
        (stmts, val), (x, x0, xext) = spec.load_b("k", "n"), ("n", "n0", spec.N)
    return [*head, f"    const int {x} = {x0} + xx, k = {k0} + kk;", "    float val = 0.0f;",
            f"    if ({x} < {xext} && k < {spec.K}) {{", *_indent(stmts, 8), f"        val = {val};", "    }",
            f"    {regs}[r] = val;", "}"]


def _store_generic(op: OperandTile, t, dst: str, store: str) -> list[str]:
    """The staging registers, rounded into the half type, where the swizzled layout puts them."""
    head, addr, regs, _ = _generic_walk(op, t)
    return [*head, f"    {store}({dst}, {addr}, {regs}[r]);", "}"]


def a_lane_address(op: OperandTile) -> str:
    """The element offset lane `mma_lane` gives ldmatrix for A's fragment of mma tile `mi` at k
    offset `kk`: four 8x8 matrices, rows 0-7 / 8-15 of the mma tile x k 0-7 / 8-15, in the
    register order a01, a23, a45, a67 (lane l addresses row l % 8 of matrix l / 8)."""
    if op.kc:
        row = "mma_wm0 + mi * 16 + (mma_lane % 8) + 8 * ((mma_lane / 8) % 2)"
        chunk = f"kk / {CHUNK} + mma_lane / 16"
    else:
        row = "kk + (mma_lane % 8) + 8 * (mma_lane / 16)"
        chunk = f"(mma_wm0 + mi * 16 + 8 * ((mma_lane / 8) % 2)) / {CHUNK}"
    return op.addr(row, chunk)


def b_lane_address(op: OperandTile, pair: bool) -> str:
    """The same for B's fragments of mma tiles `ni` and `ni + 1` (pair: x4), or of `ni` alone
    (x2, where only lanes 0-15 address): k 0-7 / 8-15 of tile ni, then of ni + 1."""
    lane = "mma_lane" if pair else "(mma_lane % 16)"
    if op.kc:
        row = f"mma_wn0 + (ni + {lane} / 16) * 8 + ({lane} % 8)"
        chunk = f"kk / {CHUNK} + ({lane} / 8) % 2"
    else:
        row = f"kk + ({lane} % 8) + 8 * (({lane} / 8) % 2)"
        chunk = f"(mma_wn0 + (ni + {lane} / 16) * 8) / {CHUNK}"
    return op.addr(row, chunk)


def _ldsm_a(op: OperandTile, buf: str) -> list[str]:
    macro = "LDSM_X4" if op.kc else "LDSM_X4_T"  # .trans where k is not the contiguous dimension
    return [f"{macro}(mma_af[mi][0], mma_af[mi][1], mma_af[mi][2], mma_af[mi][3], {buf}, {a_lane_address(op)});"]


def _ldsm_b(op: OperandTile, buf: str, pair: bool) -> list[str]:
    macro = f"LDSM_X{4 if pair else 2}" + ("" if op.kc else "_T")
    regs = "mma_bf[ni][0], mma_bf[ni][1]" + (", mma_bf[ni + 1][0], mma_bf[ni + 1][1]" if pair else "")
    return [f"{macro}({regs}, {buf}, {b_lane_address(op, pair)});"]


def async_mma_source(name: str, spec, t) -> str:
    """The rOperator text of async tiling `t` (MmaTiling with stages > 1) for `spec`."""
    _, stype, mma, store_macro = HALF[t.precision]
    tiles_m, tiles_n = -(-spec.M // t.bm), -(-spec.N // t.bn)
    a = OperandTile("a", t, spec.a_k_contiguous)
    b = OperandTile("b", t, not spec.b_n_contiguous)
    S, KB = t.stages, sk.steps_per_chunk(t, spec.K)  # k blocks of this rTask (all of K unsplit)
    k_first = "" if t.splitk == 1 else f"{sk.chunk_start(t, spec.K)} + "
    wtm, wtn = t.bm // t.warps_m, t.bn // t.warps_n
    MI, NI = t.mi, t.ni
    tile_floats = S * (a.elems + b.elems) // 2

    a_raw = async_ok(spec.raw_a, t.precision, spec.M, spec.K) and (spec.raw_a.k_contiguous == a.kc)
    b_raw = async_ok(spec.raw_b, t.precision, spec.N, spec.K) and (spec.raw_b.k_contiguous == b.kc)
    raws = [(op, raw) for op, ok, raw in ((a, a_raw, spec.raw_a), (b, b_raw, spec.raw_b)) if ok]
    generic = [op for op, ok in ((a, a_raw), (b, b_raw)) if not ok]
    dst = lambda op: f"{op.which.upper()}s + st * {op.elems}"  # noqa: E731
    # Copies issued now: cp.async for the raw operands; the other operands' loads go into
    # registers here and into shared memory after the block's mmas, so that their latency, too,
    # overlaps arithmetic (the SIMT template's register pipeline).
    issue = [line for op, raw in raws for line in _fill_raw(op, t, spec, raw, dst(op), "kf")]
    issue += [line for op in generic for line in _load_generic(op, t, spec, "kf")]
    land = [line for op in generic for line in _store_generic(op, t, dst(op), store_macro)]
    staging = [f"float stage_{op.which}[{_generic_walk(op, t)[3]}];" for op in generic]
    b_loads = ["#pragma unroll", f"for (int ni = 0; ni + 1 < {NI}; ni += 2) {{",
               *_indent(_ldsm_b(b, "Bt", True), 4), "}"]
    if NI % 2:
        b_loads += ["{", f"    const int ni = {NI - 1};", *_indent(_ldsm_b(b, "Bt", False), 4), "}"]
    src = [
        task_head(name, spec, t),
        f"    LPTR {stype}* As = (LPTR {stype}*)smem;  /* {S} stages of {t.bm}x{t.bk}, then of {t.bn}x{t.bk} */",
        f"    LPTR {stype}* Bs = As + {S * a.elems};",
        "    const int mma_lane = tid % 32, mma_warp = tid / 32;",
        f"    LPTR float* mma_scr = smem + {tile_floats} + mma_warp * MMA_EMU_FLOATS_K16;  /* OpenCL's emulation */",
        "    (void)mma_scr;",
        "    CP_ASYNC_STATE",
        *_indent(sk.tile_decode(t, tiles_m, tiles_n), 4),
        f"    const int m0 = (tile / {tiles_n}) * {t.bm};",
        f"    const int n0 = (tile % {tiles_n}) * {t.bn};",
        f"    const int mma_wm0 = (mma_warp / {t.warps_n}) * {wtm}, mma_wn0 = (mma_warp % {t.warps_n}) * {wtn};",
        *_indent(spec.prologue or [], 4),
        *zero_accumulators(MI, NI),
        *_indent(staging, 4),
        f"    for (int st = 0; st < {S - 1}; ++st) {{  /* the first {S - 1} k blocks in flight */",
        f"        if (st < {KB}) {{",
        f"            const int kf = {k_first}st * {t.bk};",
        *_indent(issue, 12),
        *_indent(land, 12),
        "        }",
        "        CP_ASYNC_COMMIT();",
        "    }",
        f"    for (int kb = 0; kb < {KB}; ++kb) {{",
        f"        CP_ASYNC_WAIT({S - 2});  /* this thread's copies of block kb have landed */",
        "        BARRIER();  /* everyone's have, and nobody still reads the buffer refilled next */",
        f"        const int kn = kb + {S - 1}, st = kn % {S};  /* the block refilled meanwhile, and its buffer */",
        f"        if (kn < {KB}) {{",
        f"            const int kf = {k_first}kn * {t.bk};",
        *_indent(issue, 12),
        "        }",
        "        CP_ASYNC_COMMIT();",
        f"        LPTR const u16* At = (LPTR const u16*)(As + (kb % {S}) * {a.elems});",
        f"        LPTR const u16* Bt = (LPTR const u16*)(Bs + (kb % {S}) * {b.elems});",
        # A loop on both targets: unrolled, ptxas gave the rTask 255 registers and 240 bytes of
        # spills as the out-of-line call site of a persistent kernel (BERT-base's GEMMs; 70 as a
        # loop, the whole kernel 143 and none spilled), though a kernel of its own did not. A DEEP
        # tiling is never an rTask of a persistent kernel (its shared memory is dynamic), so its
        # loop is unrolled: the next k offset's ldmatrix can then issue under this one's mmas.
        "        #pragma unroll" if t.dynamic else "        #pragma unroll 1",
        f"        for (int kk = 0; kk < {t.bk}; kk += 16) {{",
        f"            unsigned int mma_af[{MI}][4], mma_bf[{NI}][2];",
        "            #pragma unroll",
        f"            for (int mi = 0; mi < {MI}; ++mi) {{",
        *_indent(_ldsm_a(a, "At"), 16),
        "            }",
        *_indent(b_loads, 12),
        *_indent(mma_loops(mma, MI, NI, "mma_af[mi][0], mma_af[mi][1], mma_af[mi][2], mma_af[mi][3], "
                                         "mma_bf[ni][0], mma_bf[ni][1]"), 12),
        "        }",
        *([f"        if (kn < {KB}) {{", *_indent(land, 12), "        }"] if land else []),
        "    }",
        "    CP_ASYNC_WAIT(0);",
        "    BARRIER();  /* the buffers are free for the next rTask that runs on this block */",
        "    const int mma_g = mma_lane / 4, mma_t = mma_lane % 4;",
        *store_accumulators(spec, t),
        "}",
        "",
        *thin_kernel(name, spec, f"{tile_floats} + {WARPS} * MMA_EMU_FLOATS_K16", t),
    ]
    return "\n".join(src)
