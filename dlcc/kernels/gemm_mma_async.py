"""The tensor-core GEMM template with a multi-stage shared-memory pipeline (fp16, bf16, tf32, tf32x3): the
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

At tf32 and tf32x3 the same pipeline moves floats (kernels/gemm_mma.py TF32_ASYNC_TILINGS): a
float32 operand is copied four to a chunk, the buffers are padded rows instead of swizzled ones
(OperandTile), ldmatrix reads a k-contiguous operand's fragments as pairs of 16-bit halves (and
scalar reads the other layout's: ldmatrix cannot transpose 32-bit elements), and each fragment
element is rounded (TO_TF32) or, at tf32x3, split into two TF32 values (MMA_TF32X3) as it goes
into the mma: the operands cp.async copies cannot be rounded on the way.

The accumulators are the `acc[i][j]` grid of kernels/gemm_mma.py, so its store loop, and AStitch's
fused epilogues, apply unchanged. On OpenCL, cp.async copies land as late as the PTX ISA allows
(at the wait that covers their group), and a chunk whose address is not 16-byte aligned lands as
NaN where the hardware would fault; ldmatrix and the mma exchange lanes through local memory
(backends/prelude_opencl.h). So the same tile code, the same swizzled addresses, the same group
accounting and the same fragment registers run on PoCL in the default suite.
"""
from __future__ import annotations

from . import row_norm as rnorm
from . import splitk as sk
from .gemm import _indent, _per_thread_count
from .program import load_float
from .gemm_mma import MMA_KINDS, mma_loops, store_accumulators, task_head, thin_kernel, zero_accumulators

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


#: The precisions whose operands are float32 in shared memory (kernels/gemm_mma.py WIDE): four
#: to a 16-byte chunk, in padded rows instead of swizzled ones.
WIDE_CHUNK = 4


def async_ok(raw, precision: str, extent: int, K: int) -> bool:
    """Whether operand `raw` (a RawOperand or None) can be copied by cp.async: stored in the type
    the precision keeps in shared memory (its half type; float32 at tf32 and tf32x3), its rows a
    whole number of 16-byte chunks (stride and the contiguous extent multiples of the chunk), so
    every chunk is 16-byte aligned (the memory plan aligns every buffer to 256 bytes) and lies
    wholly inside or wholly outside the tensor."""
    stored, chunk = (HALF[precision][0], CHUNK) if precision in HALF else ("float32", WIDE_CHUNK)
    if raw is None or raw.dtype != stored:
        return False
    contiguous = K if raw.k_contiguous else extent
    return raw.stride % chunk == 0 and contiguous % chunk == 0


class OperandTile:
    """One operand's buffer geometry in the tile: `rows` x `per_row` 16-byte chunks of `chunk`
    elements, k-contiguous (rows are m or n, chunks run along k) or not (rows are k, chunks run
    along m or n). 16-bit values are XOR-swizzled by chunk (swizzle); floats (tf32, tf32x3) sit in
    rows padded by 4 (k-contiguous) or 8 floats, as the register-staged template keeps them
    (kernels/gemm_mma.py): ldmatrix's eight rows, and the scalar fragment reads of lanes
    (g, t) at t * row + g, then fall in distinct banks."""

    def __init__(self, which: str, t, kc: bool):
        self.which, self.kc, self.wide = which, kc, t.wide
        self.chunk = WIDE_CHUNK if t.wide else CHUNK
        self.ext = t.bm if which == "a" else t.bn
        self.rows, self.per_row = (self.ext, t.bk // self.chunk) if kc else (t.bk, self.ext // self.chunk)
        self.elems = self.ext * t.bk  # of one k block
        self.chunks = self.elems // self.chunk
        self.row_elems = self.per_row * self.chunk + ((4 if kc else 8) if t.wide else 0)
        self.size = self.rows * self.row_elems  # elements of one stage buffer, padding included

    def addr(self, row: str, chunk: str) -> str:
        """Element offset of the first element of chunk (row, chunk) in a stage buffer."""
        if self.wide:
            return f"({row}) * {self.row_elems} + ({chunk}) * {self.chunk}"
        return f"{swizzle_expr(f'({row}) * {self.per_row} + ({chunk})', self.per_row)} * {CHUNK}"

    def at(self, row: str, col: str) -> str:
        """Element offset of element `col` of row `row` in a stage buffer."""
        if self.wide:
            return f"({row}) * {self.row_elems} + ({col})"
        return f"{self.addr(row, f'({col}) / {CHUNK}')} + ({col}) % {CHUNK}"


def _fill_raw(op: OperandTile, t, spec, raw, dst: str, k0: str) -> list[str]:
    """cp.async of one k block of a raw operand into stage buffer `dst`."""
    x0, xext = ("m0", spec.M) if op.which == "a" else ("n0", spec.N)
    per = _per_thread_count(op.chunks, THREADS)
    if op.kc:
        where = [f"const int x = {x0} + row, k = {k0} + ch * {op.chunk};"]
        idx = f"{raw.base} + x * {raw.stride} + k"
    else:
        where = [f"const int k = {k0} + row, x = {x0} + ch * {op.chunk};"]
        idx = f"{raw.base} + k * {raw.stride} + x"
    guard = [] if op.chunks % THREADS == 0 else [f"    if (l >= {op.chunks}) continue;"]
    return ["#pragma unroll", f"for (int r = 0; r < {per}; ++r) {{", f"    const int l = tid + r * {THREADS};", *guard,
            f"    const int row = l / {op.per_row}, ch = l % {op.per_row};", *_indent(where, 4),
            f"    const int ok = x < {xext} && k < {spec.K};",
            f"    CP_ASYNC16({dst} + {op.addr('row', 'ch')}, {raw.ptr} + (ok ? {idx} : 0), ok);", "}"]


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
    return head, op.at(row, col), f"stage_{op.which}", per


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


def _store_generic(op: OperandTile, t, dst: str, store: str | None) -> list[str]:
    """The staging registers where the layout puts them: rounded into the half type by `store`
    (STORE_F16, STORE_BF16), or as floats (None: tf32 and tf32x3 round as the fragments go into
    the mma, as they must for the operands cp.async copies)."""
    head, addr, regs, _ = _generic_walk(op, t)
    put = f"{store}({dst}, {addr}, {regs}[r]);" if store else f"({dst})[{addr}] = {regs}[r];"
    return [*head, f"    {put}", "}"]


def a_lane_address(op: OperandTile) -> str:
    """The element offset lane `mma_lane` gives ldmatrix for A's fragment of mma tile `mi` at k
    offset `kk`: four 8x8 matrices, rows 0-7 / 8-15 of the mma tile x k 0-7 / 8-15, in the
    register order a01, a23, a45, a67 (lane l addresses row l % 8 of matrix l / 8)."""
    if op.kc:
        row = "mma_wm0 + mi * 16 + (mma_lane % 8) + 8 * ((mma_lane / 8) % 2)"
        chunk = f"kk / {op.chunk} + mma_lane / 16"
    else:
        assert not op.wide, "ldmatrix.trans moves 16-bit elements"
        row = "kk + (mma_lane % 8) + 8 * (mma_lane / 16)"
        chunk = f"(mma_wm0 + mi * 16 + 8 * ((mma_lane / 8) % 2)) / {CHUNK}"
    return op.addr(row, chunk)


def b_lane_address(op: OperandTile, pair: bool) -> str:
    """The same for B's fragments of mma tiles `ni` and `ni + 1` (pair: x4), or of `ni` alone
    (x2, where only lanes 0-15 address): k 0-7 / 8-15 of tile ni, then of ni + 1."""
    lane = "mma_lane" if pair else "(mma_lane % 16)"
    if op.kc:
        row = f"mma_wn0 + (ni + {lane} / 16) * 8 + ({lane} % 8)"
        chunk = f"kk / {op.chunk} + ({lane} / 8) % 2"
    else:
        assert not op.wide, "ldmatrix.trans moves 16-bit elements"
        row = f"kk + ({lane} % 8) + 8 * (({lane} / 8) % 2)"
        chunk = f"(mma_wn0 + (ni + {lane} / 16) * 8) / {CHUNK}"
    return op.addr(row, chunk)


def _ldsm_args(op: OperandTile, buf: str, offset: str) -> str:
    """ldmatrix's base and element offset: 16-bit elements as they are; floats as pairs of them
    (an 8x8 matrix of b16 is then 8 rows of four floats, and lane l receives float l % 4 of row
    l / 4: the TF32 fragment's element)."""
    return f"(LPTR const u16*){buf}, 2 * ({offset})" if op.wide else f"{buf}, {offset}"


def _frag_a(op: OperandTile, buf: str) -> list[str]:
    """mma tile `mi`'s A fragment at k offset `kk` into `mma_af[mi]`: ldmatrix.x4 (.trans where k
    is not the contiguous dimension), or at tf32 with m contiguous, which ldmatrix cannot
    transpose in 32-bit elements, four scalar reads of a0 (g, t), a1 (g+8, t), a2 (g, t+4),
    a3 (g+8, t+4)."""
    regs = "mma_af[mi][0], mma_af[mi][1], mma_af[mi][2], mma_af[mi][3]"
    if op.wide and not op.kc:
        m = "mma_wm0 + mi * 16 + mma_g"
        return [f"mma_af[mi][{e}] = AS_UINT({buf}[{op.at(f'kk + mma_t + {dk}', f'{m} + {dm}')}]);"
                for e, (dm, dk) in enumerate(((0, 0), (8, 0), (0, 4), (8, 4)))]
    macro = "LDSM_X4" if op.kc else "LDSM_X4_T"  # .trans where k is not the contiguous dimension
    return [f"{macro}({regs}, {_ldsm_args(op, buf, a_lane_address(op))});"]


def _ldsm_b(op: OperandTile, buf: str, pair: bool) -> list[str]:
    macro = f"LDSM_X{4 if pair else 2}" + ("" if op.kc else "_T")
    regs = "mma_bf[ni][0], mma_bf[ni][1]" + (", mma_bf[ni + 1][0], mma_bf[ni + 1][1]" if pair else "")
    return [f"{macro}({regs}, {_ldsm_args(op, buf, b_lane_address(op, pair))});"]


def _frag_b(op: OperandTile, buf: str, NI: int) -> list[str]:
    """The B fragments of the warp's NI mma tiles at k offset `kk` into `mma_bf`: ldmatrix two
    tiles at a time (x4, then x2 for an odd last one), or at tf32 with n contiguous two scalar
    reads each, b0 (t, g) and b1 (t+4, g)."""
    if op.wide and not op.kc:
        n = "mma_wn0 + ni * 8 + mma_g"
        return ["#pragma unroll", f"for (int ni = 0; ni < {NI}; ++ni) {{",
                *[f"    mma_bf[ni][{e}] = AS_UINT({buf}[{op.at(f'kk + mma_t + {4 * e}', n)}]);" for e in (0, 1)], "}"]
    loads = ["#pragma unroll", f"for (int ni = 0; ni + 1 < {NI}; ni += 2) {{", *_indent(_ldsm_b(op, buf, True), 4), "}"]
    if NI % 2:
        loads += ["{", f"    const int ni = {NI - 1};", *_indent(_ldsm_b(op, buf, False), 4), "}"]
    return loads


def operand_copies(t, spec, a: OperandTile, b: OperandTile, a_raw: bool, b_raw: bool,
                   store_macro: str | None) -> tuple[list[str], list[str], list[str]]:
    """How one k block reaches the stage buffers (`st`, at k offset `kf`): the copies issued (cp.async
    for the raw operands; the others' element loads into registers), the lines that land the
    latter in shared memory after the block's arithmetic (so that their latency, too, overlaps
    it: the SIMT template's register pipeline), and their staging registers."""
    raws = [(op, raw) for op, ok, raw in ((a, a_raw, spec.raw_a), (b, b_raw, spec.raw_b)) if ok]
    generic = [op for op, ok in ((a, a_raw), (b, b_raw)) if not ok]
    dst = lambda op: f"{op.which.upper()}s + st * {op.size}"  # noqa: E731
    issue = [line for op, raw in raws for line in _fill_raw(op, t, spec, raw, dst(op), "kf")]
    issue += [line for op in generic for line in _load_generic(op, t, spec, "kf")]
    land = [line for op in generic for line in _store_generic(op, t, dst(op), store_macro)]
    staging = [f"float stage_{op.which}[{_generic_walk(op, t)[3]}];" for op in generic]
    return issue, land, staging


def pipeline_fill(t, KB: int, k_first: str, issue: list[str], land: list[str], ahead: int | None = None) -> list[str]:
    """The first `ahead` k blocks (STAGES - 1 unless given) put in flight, each its own cp.async group."""
    ahead = t.stages - 1 if ahead is None else ahead
    return [f"    for (int st = 0; st < {ahead}; ++st) {{  /* the first {ahead} k blocks in flight */",
            f"        if (st < {KB}) {{", f"            const int kf = {k_first}st * {t.bk};",
            *_indent(issue, 12), *_indent(land, 12), "        }", "        CP_ASYNC_COMMIT();", "    }"]


def pipeline_step(t, KB: int, k_first: str, issue: list[str], publish: list[str], ahead: int | None = None) -> list[str]:
    """The head of k block `kb`: its copies waited for, `publish` (a fence its readers need), the
    barrier after which everyone's have landed and nobody still reads the buffer refilled next,
    and block kb + `ahead` (STAGES - 1 unless given) issued into that buffer."""
    S, ahead = t.stages, t.stages - 1 if ahead is None else ahead
    return [f"        CP_ASYNC_WAIT({ahead - 1});  /* this thread's copies of block kb have landed */", *publish,
            "        BARRIER();  /* everyone's have, and nobody still reads the buffer refilled next */",
            f"        const int kn = kb + {ahead}, st = kn % {S};  /* the block refilled meanwhile, and its buffer */",
            f"        if (kn < {KB}) {{", f"            const int kf = {k_first}kn * {t.bk};", *_indent(issue, 12),
            "        }", "        CP_ASYNC_COMMIT();"]


def pipeline_end(t, spec, KB: int, land: list[str], after_loop: tuple[str, ...] = ()) -> list[str]:
    """The k loop's end (the element-loaded operands of the block refilled landed in shared memory,
    after this block's arithmetic), `after_loop`, the buffers freed, the accumulators stored, the
    task closed."""
    return [*([f"        if (kn < {KB}) {{", *_indent(land, 12), "        }"] if land else []), "    }", *after_loop,
            "    CP_ASYNC_WAIT(0);", "    BARRIER();  /* the buffers are free for the next rTask that runs on this block */",
            *store_accumulators(spec, t),
            *(["    BARRIER();  /* the statistics are read before the next rTask reuses the buffers */"]
              if spec.row_norm is not None else []), "}", ""]


def row_norm_stats(t, spec, a: OperandTile, stype: str, k_first: str, wide: bool = False) -> tuple[list[str], list[str]]:
    """A folded LayerNorm's (kernels/row_norm.py) per-thread state, and its sums over k block `kb`'s
    A tile in shared memory; nothing without one."""
    rn = spec.row_norm
    if rn is None:
        return [], []
    assert rnorm.supported(t, spec), (t.name, "row_norm")
    load = (lambda off: f"Ar[{off}]") if wide else (lambda off: load_float(HALF[t.precision][0], "Ar", off))
    stats = [f"LPTR const {stype}* Ar = As + (kb % {t.stages}) * {a.size};",
             *rnorm.accumulate(t, spec.K, a.at, load, f"{k_first}kb * {t.bk}")]
    return stats, rnorm.declare(t, spec, shifted=False)  # (store_accumulators finishes them)


def async_mma_source(name: str, spec, t) -> str:
    """The rOperator text of async tiling `t` (MmaTiling with stages > 1) for `spec`."""
    _, _, mma, _, emu = MMA_KINDS[t.precision]
    if t.wide:  # floats in shared memory, rounded (tf32) or split (tf32x3) as they enter the mma
        stype, store_macro, rnd = "float", None, MMA_KINDS[t.precision][1]
        mma_args = ", ".join([f"{rnd}(AS_FLOAT(mma_af[mi][{e}]))" for e in range(4)]
                             + [f"{rnd}(AS_FLOAT(mma_bf[ni][{e}]))" for e in range(2)])
    else:
        _, stype, mma, store_macro = HALF[t.precision]
        mma_args = "mma_af[mi][0], mma_af[mi][1], mma_af[mi][2], mma_af[mi][3], mma_bf[ni][0], mma_bf[ni][1]"
    tiles_m, tiles_n = -(-spec.M // t.bm), -(-spec.N // t.bn)
    a = OperandTile("a", t, spec.a_k_contiguous)
    b = OperandTile("b", t, not spec.b_n_contiguous)
    S, KB = t.stages, sk.steps_per_chunk(t, spec.K)  # k blocks of this rTask (all of K unsplit)
    k_first = "" if t.splitk == 1 else f"{sk.chunk_start(t, spec.K)} + "
    wtm, wtn = t.bm // t.warps_m, t.bn // t.warps_n
    MI, NI = t.mi, t.ni
    tile_floats = t.tile_floats
    assert S * (a.size + b.size) * (1 if t.wide else 0.5) <= tile_floats

    a_raw = async_ok(spec.raw_a, t.precision, spec.M, spec.K) and (spec.raw_a.k_contiguous == a.kc)
    b_raw = async_ok(spec.raw_b, t.precision, spec.N, spec.K) and (spec.raw_b.k_contiguous == b.kc)
    issue, land, staging = operand_copies(t, spec, a, b, a_raw, b_raw, store_macro)
    frag_type = "float" if t.wide else "u16"
    stats, rn_decl = row_norm_stats(t, spec, a, stype, k_first, t.wide)  # a folded LayerNorm (kernels/row_norm.py)
    src = [
        task_head(name, spec, t),
        f"    LPTR {stype}* As = (LPTR {stype}*)smem;  /* {S} stages of {t.bm}x{t.bk}, then of {t.bn}x{t.bk} */",
        f"    LPTR {stype}* Bs = As + {S * a.size};",
        "    const int mma_lane = tid % 32, mma_warp = tid / 32;",
        "    const int mma_g = mma_lane / 4, mma_t = mma_lane % 4;",
        f"    LPTR float* mma_scr = smem + {tile_floats} + mma_warp * {emu};  /* OpenCL's emulation */",
        "    (void)mma_scr;",
        "    CP_ASYNC_STATE",
        *_indent(sk.tile_decode(t, tiles_m, tiles_n), 4),
        f"    const int m0 = (tile / {tiles_n}) * {t.bm};",
        f"    const int n0 = (tile % {tiles_n}) * {t.bn};",
        f"    const int mma_wm0 = (mma_warp / {t.warps_n}) * {wtm}, mma_wn0 = (mma_warp % {t.warps_n}) * {wtn};",
        *_indent(spec.prologue or [], 4),
        *zero_accumulators(MI, NI),
        *_indent(staging, 4),
        *_indent(rn_decl, 4),
        *pipeline_fill(t, KB, k_first, issue, land),
        f"    for (int kb = 0; kb < {KB}; ++kb) {{",
        *pipeline_step(t, KB, k_first, issue, []),
        *_indent(stats, 8),
        f"        LPTR const {frag_type}* At = (LPTR const {frag_type}*)(As + (kb % {S}) * {a.size});",
        f"        LPTR const {frag_type}* Bt = (LPTR const {frag_type}*)(Bs + (kb % {S}) * {b.size});",
        # A loop on both targets: unrolled, ptxas gave the rTask 255 registers and 240 bytes of
        # spills as the out-of-line call site of a persistent kernel (BERT-base's GEMMs; 70 as a
        # loop, the whole kernel 143 and none spilled), though a kernel of its own did not. A DEEP
        # tiling is never an rTask of a persistent kernel (its shared memory is dynamic), so its
        # loop is unrolled: the next k offset's ldmatrix can then issue under this one's mmas.
        "        #pragma unroll" if t.dynamic else "        #pragma unroll 1",
        f"        for (int kk = 0; kk < {t.bk}; kk += {t.kstep}) {{",
        f"            unsigned int mma_af[{MI}][4], mma_bf[{NI}][2];",
        "            #pragma unroll",
        f"            for (int mi = 0; mi < {MI}; ++mi) {{",
        *_indent(_frag_a(a, "At"), 16),
        "            }",
        *_indent(_frag_b(b, "Bt", NI), 12),
        *_indent(mma_loops(mma, MI, NI, mma_args), 12),
        "        }",
        *pipeline_end(t, spec, KB, land),
        *thin_kernel(name, spec, f"{tile_floats} + {WARPS} * {emu}", t),
    ]
    return "\n".join(src)
