/* dlcc portable kernel dialect -> OpenCL C 1.2 (see prelude_cuda.h for why there are two). */
#define KERNEL __kernel
#ifdef cl_khr_fp64  /* float64 models' boundary Casts (frontend.promote_half) */
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
#define DEVICE static inline
/* The tensor-core emulations below (mma, cp.async, ldmatrix, wgmma) are always inlined: PoCL 3's
 * optimised build miscompiled an out-of-line one. dlcc_wgmma_run, called out of line with the
 * task's __local buffer, read zeros where the task itself read the data just written (every
 * product 0, in a module holding one wgmma kernel alone); inlined, the same text computes right.
 * tests/test_pocl_miscompiles.py keeps a kernel of that shape. */
#define EMULATED static inline __attribute__((always_inline))
#define SITE_FN static inline  /* PoCL inlines everything that holds a barrier anyway */
#define GPTR __global
#define LPTR __local
#define SHARED __local __attribute__((aligned(16)))  /* cp.async's 16-byte chunks */
#define DYNAMIC_SHARED(type, name, n) __local __attribute__((aligned(16))) type name[n]  /* CUDA's is sized at launch */
#define THREAD_ID ((int)get_local_id(0))
#define BLOCK_ID ((int)get_group_id(0))
#define BLOCK_DIM ((int)get_local_size(0))
#define GRID_DIM ((int)get_num_groups(0))
#define BARRIER() barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE)
#define FENCE() mem_fence(CLK_GLOBAL_MEM_FENCE)
#define LAUNCH_BOUNDS(n) __attribute__((reqd_work_group_size(n, 1, 1)))
#define LAUNCH_BOUNDS_SM(n, b) __attribute__((reqd_work_group_size(n, 1, 1)))
#define ATOMIC_LOAD_I32(p) (*(volatile __global int*)(p))
#define ATOMIC_STORE_I32(p, v) (*(volatile __global int*)(p) = (v))
#define ATOMIC_ADD_I32(p, v) atomic_add((volatile __global int*)(p), (v))
#define ATOMIC_CAS_I32(p, cmp, v) atomic_cmpxchg((volatile __global int*)(p), (cmp), (v))
#define ATOMIC_MAX_I32(p, v) atomic_max((volatile __global int*)(p), (v))
#define LOAD_CG(p) (*(volatile __global const float*)(p))
typedef long i64;
typedef uchar u8;
typedef char i8;
typedef short i16;
typedef ushort u16;
typedef uint u32;
typedef ulong u64;
#define DLCC_INF INFINITY
#define DLCC_NAN NAN
#define F_EXP exp
#define F_LOG log
#define F_SQRT sqrt
#define F_RSQRT rsqrt
#define F_POW pow
#define F_TANH_RAW tanh
#define F_TANH dlcc_tanh  /* prelude_common.h: exactly +-1 where tanh rounds to it */
#define F_ERF erf
#define F_FABS fabs
#define F_FLOOR floor
#define F_CEIL ceil
#define F_RINT rint
#define F_MIN fmin
#define F_MAX fmax
#define F_SIN sin
#define F_COS cos
#define F_TAN tan
#define F_ASIN asin
#define F_ACOS acos
#define F_ATAN atan
#define F_SINH sinh
#define F_COSH cosh
#define F_ASINH asinh
#define F_ACOSH acosh
#define F_ATANH atanh
#define F_FMOD fmod
#define F_ISNAN(x) isnan(x)
#define F_ISINF(x) isinf(x)
#define F_ISFINITE(x) isfinite(x)
/* A product never fused into an FMA (prelude_cuda.h says why): OpenCL C contracts a * b + c within
 * one expression only, so a product returned by a function stays a rounded product. */
DEVICE float dlcc_mul_rn(float a, float b) { return a * b; }
#define F_MUL_RN(a, b) dlcc_mul_rn((a), (b))
typedef half f16;  /* pointers to half need no cl_khr_fp16; vload/vstore_half convert */
#define LOAD_F16(p, i) vload_half((i), (p))
#define STORE_F16(p, i, v) vstore_half_rte((v), (i), (p))
typedef ushort bf16;  /* bfloat16 storage: a float's upper 16 bits (prelude_common.h converts) */
#define AS_UINT(x) as_uint(x)
#define AS_FLOAT(u) as_float(u)
/* Tensor cores, emulated (prelude_cuda.h has the hardware's). OpenCL has no warp-wide matrix
 * instruction, so a warp (32 consecutive work-items) exchanges its fragments through local memory:
 * each lane stores its A and B elements where the PTX fragment layout puts them, and reads back
 * the four D elements the same layout gives it. A template that loads the wrong fragment, or
 * stores the wrong accumulator, gives wrong numbers here exactly as it would on a GPU. The two
 * barriers need every work-item of the group to call it the same number of times, which the
 * GEMM templates do (warp-uniform, unrolled loops). `mma_scr` (MMA_EMU_FLOATS floats of the
 * warp's own) and `mma_lane` are the caller's. The products are exact in float32 (TF32 inputs); the
 * sums are in k order. */
DEVICE float dlcc_to_tf32(float x) {
    uint u = as_uint(x);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;  /* nearest, ties away */
    return as_float(u);
}
#define TO_TF32(x) dlcc_to_tf32(x)
/* A .tf32 mma operand register holds a TF32 value; what the hardware makes of the lower 13 bits of
 * an unrounded float is not specified. Here they are dropped (truncation), so an operand the
 * template forgot to round gives other numbers than its rounded twin, and the tests see it. */
DEVICE float dlcc_tf32_bits(float x) { return as_float(as_uint(x) & 0xffffe000u); }
#define MMA_EMU_FLOATS 192
/* Once every lane has stored its fragments: lane (g, t)'s four D elements from A (16 x K,
 * row-major) and B (K x 8, k-major), summed in k order, then the scratch is free again. */
EMULATED void dlcc_mma_emu_dot(LPTR float* A, LPTR float* B, int K, int g, int t, float* d0, float* d1, float* d2,
                             float* d3) {
    barrier(CLK_LOCAL_MEM_FENCE);
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    for (int k = 0; k < K; ++k) {
        s0 += A[g * K + k] * B[k * 8 + 2 * t];
        s1 += A[g * K + k] * B[k * 8 + 2 * t + 1];
        s2 += A[(g + 8) * K + k] * B[k * 8 + 2 * t];
        s3 += A[(g + 8) * K + k] * B[k * 8 + 2 * t + 1];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    *d0 += s0; *d1 += s1; *d2 += s2; *d3 += s3;
}
EMULATED void dlcc_mma_tf32(float* d0, float* d1, float* d2, float* d3, float a0, float a1, float a2, float a3,
                          float b0, float b1, LPTR float* scr, int lane) {
    const int g = lane >> 2, t = lane & 3;
    LPTR float* A = scr;         /* 16 x 8, row-major */
    LPTR float* B = scr + 128;   /* 8 x 8, k-major: B[k * 8 + n] */
    A[g * 8 + t] = dlcc_tf32_bits(a0); A[(g + 8) * 8 + t] = dlcc_tf32_bits(a1);
    A[g * 8 + t + 4] = dlcc_tf32_bits(a2); A[(g + 8) * 8 + t + 4] = dlcc_tf32_bits(a3);
    B[t * 8 + g] = dlcc_tf32_bits(b0); B[(t + 4) * 8 + g] = dlcc_tf32_bits(b1);
    dlcc_mma_emu_dot(A, B, 8, g, t, d0, d1, d2, d3);
}
/* The loops around MMA_TF32 stay loops here: unrolled, each emulated mma's two barriers would be
 * copied per mma tile and k step, and PoCL's work-group compiler (one region per barrier) took
 * minutes on a persistent kernel holding a few tensor-core rTasks. */
#define MMA_UNROLL _Pragma("nounroll")
/* The SIMT GEMM's inner k loop (over a shared tile's BK columns) unrolls by 4 here, in full on
 * CUDA. PoCL's work-group compiler spent 2.5-3.5 s on each BK = 64 rKernel unrolled in full (a
 * cold first run of a small ConvNeXt: 20 s, of BERT-small: 14 s); by 4 it is 0.3 s, and the
 * kernels ran no slower on the CPU (faster, on bert/cnn/vit-small through astitch). */
#define K_UNROLL _Pragma("unroll 4")
/* A loop copying a tile whose elements come through a stitched prologue (AStitch's element
 * functions) stays a loop here, unrolled on CUDA: PoCL 3's LLVM 15 crashed (SIGSEGV in the
 * inliner, which no caller can catch) building timm's EVA-02, whose attention K tile copied 16
 * elements a thread, each through a seven-deep rotary-embedding prologue. */
#define PROLOGUE_UNROLL _Pragma("nounroll")
/* Four floats from local memory in one read (the vector SIMT GEMM; CUDA's is a float4 load). */
#define LOAD4_LOCAL(p) vload4(0, (p))
#define MMA_TF32(d0, d1, d2, d3, a0, a1, a2, a3, b0, b1) \
    dlcc_mma_tf32(&(d0), &(d1), &(d2), &(d3), (a0), (a1), (a2), (a3), (b0), (b1), mma_scr, mma_lane)
/* fp16 and bf16: the m16n8k16 fragments (PTX ISA "Matrix Fragments for mma.m16n8k16 with
 * floating point type"), exchanged the same way: A 16 x 16 (a0..a7), B 16 x 8 (b0..b3). The
 * operands are already rounded to the half type (TO_F16, TO_BF16), so the products are exact. */
DEVICE float dlcc_to_f16(float x) {
    ushort h;
    vstore_half_rte(x, 0, (__private half*)&h);
    return vload_half(0, (__private const half*)&h);
}
#define TO_F16(x) dlcc_to_f16(x)
#define MMA_EMU_FLOATS_K16 384
EMULATED void dlcc_mma_k16(float* d0, float* d1, float* d2, float* d3, float a0, float a1, float a2, float a3,
                         float a4, float a5, float a6, float a7, float b0, float b1, float b2, float b3,
                         LPTR float* scr, int lane) {
    const int g = lane >> 2, t = lane & 3;
    LPTR float* A = scr;         /* 16 x 16, row-major */
    LPTR float* B = scr + 256;   /* 16 x 8, k-major: B[k * 8 + n] */
    A[g * 16 + 2 * t] = a0; A[g * 16 + 2 * t + 1] = a1;
    A[(g + 8) * 16 + 2 * t] = a2; A[(g + 8) * 16 + 2 * t + 1] = a3;
    A[g * 16 + 2 * t + 8] = a4; A[g * 16 + 2 * t + 9] = a5;
    A[(g + 8) * 16 + 2 * t + 8] = a6; A[(g + 8) * 16 + 2 * t + 9] = a7;
    B[(2 * t) * 8 + g] = b0; B[(2 * t + 1) * 8 + g] = b1; B[(2 * t + 8) * 8 + g] = b2; B[(2 * t + 9) * 8 + g] = b3;
    dlcc_mma_emu_dot(A, B, 16, g, t, d0, d1, d2, d3);
}
#define DLCC_MMA_K16(d0, d1, d2, d3, a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3) \
    dlcc_mma_k16(&(d0), &(d1), &(d2), &(d3), (a0), (a1), (a2), (a3), (a4), (a5), (a6), (a7), (b0), (b1), (b2), (b3), \
                 mma_scr, mma_lane)
#define MMA_F16 DLCC_MMA_K16
#define MMA_BF16 DLCC_MMA_K16
/* The fp16/bf16 pipeline (kernels/gemm_mma_async.py), emulated. cp.async is emulated at its
 * latest: CP_ASYNC16 only queues the copy (in the task's CP_ASYNC_STATE), COMMIT closes a group,
 * and WAIT(n) lands every queued group but the n newest, as the PTX ISA allows no later. So a
 * template that waited for too few groups, or read a buffer before the barrier that follows its
 * wait, reads stale data here as it might on a GPU. A chunk whose global or shared address is not
 * 16-byte aligned, which the hardware would fault on, lands as NaN (0x7fff in both half types).
 * LDSM_* exchange the lanes' row addresses through the warp's scratch and hand each lane what
 * ldmatrix would (prelude_cuda.h); the packed mmas unpack their registers into dlcc_mma_k16. */
#define DLCC_CPQ_MAX 32
typedef struct {
    LPTR ushort* dst[DLCC_CPQ_MAX];
    GPTR const ushort* src[DLCC_CPQ_MAX];
    int valid[DLCC_CPQ_MAX], group[DLCC_CPQ_MAX];
    int n, groups;
} dlcc_cpq_t;
#define CP_ASYNC_STATE dlcc_cpq_t dlcc_cpq; dlcc_cpq.n = 0; dlcc_cpq.groups = 0;
EMULATED void dlcc_cp_land(LPTR ushort* d, GPTR const ushort* s, int valid) {
    const int aligned = ((((size_t)d) | ((size_t)s)) & 15) == 0;
    for (int i = 0; i < 8; ++i) d[i] = !aligned ? (ushort)0x7fff : valid ? s[i] : (ushort)0;
}
EMULATED void dlcc_cp_async16(dlcc_cpq_t* q, LPTR void* dst, GPTR const void* src, int valid) {
    if (q->n == DLCC_CPQ_MAX) {  /* more copies in flight than any tiling issues: make it visible */
        dlcc_cp_land((LPTR ushort*)dst, (GPTR const ushort*)src, valid);
        return;
    }
    q->dst[q->n] = (LPTR ushort*)dst;
    q->src[q->n] = (GPTR const ushort*)src;
    q->valid[q->n] = valid;
    q->group[q->n] = q->groups;
    q->n++;
}
EMULATED void dlcc_cp_wait(dlcc_cpq_t* q, int pending) {
    int keep = 0;
    for (int i = 0; i < q->n; ++i) {
        if (q->group[i] < q->groups - pending) {
            dlcc_cp_land(q->dst[i], q->src[i], q->valid[i]);
        } else {
            q->dst[keep] = q->dst[i]; q->src[keep] = q->src[i];
            q->valid[keep] = q->valid[i]; q->group[keep] = q->group[i];
            keep++;
        }
    }
    q->n = keep;
}
#define CP_ASYNC16(dst, src, valid) dlcc_cp_async16(&dlcc_cpq, (dst), (src), (valid))
#define CP_ASYNC_COMMIT() (dlcc_cpq.groups++)
#define CP_ASYNC_WAIT(n) dlcc_cp_wait(&dlcc_cpq, (n))
EMULATED void dlcc_ldsm(uint* r0, uint* r1, uint* r2, uint* r3, int n, int trans, LPTR const ushort* base, int off,
                      LPTR float* scr, int lane) {
    LPTR int* rows = (LPTR int*)scr;
    const int g = lane >> 2, t = lane & 3;
    uint v[4];
    rows[lane] = off;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = 0; i < n; ++i) {
        uint lo, hi;
        if (trans) {
            lo = base[rows[i * 8 + 2 * t] + g];
            hi = base[rows[i * 8 + 2 * t + 1] + g];
        } else {
            lo = base[rows[i * 8 + g] + 2 * t];
            hi = base[rows[i * 8 + g] + 2 * t + 1];
        }
        v[i] = lo | (hi << 16);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    *r0 = v[0];
    *r1 = v[1];
    if (n == 4) { *r2 = v[2]; *r3 = v[3]; }
}
#define LDSM_X4(r0, r1, r2, r3, base, off) dlcc_ldsm(&(r0), &(r1), &(r2), &(r3), 4, 0, (base), (off), mma_scr, mma_lane)
#define LDSM_X4_T(r0, r1, r2, r3, base, off) dlcc_ldsm(&(r0), &(r1), &(r2), &(r3), 4, 1, (base), (off), mma_scr, mma_lane)
#define LDSM_X2(r0, r1, base, off) dlcc_ldsm(&(r0), &(r1), &(r0), &(r1), 2, 0, (base), (off), mma_scr, mma_lane)
#define LDSM_X2_T(r0, r1, base, off) dlcc_ldsm(&(r0), &(r1), &(r0), &(r1), 2, 1, (base), (off), mma_scr, mma_lane)
DEVICE float dlcc_f16_bits(uint h) {
    ushort u = (ushort)(h & 0xffffu);
    return vload_half(0, (__private const half*)&u);
}
DEVICE float dlcc_bf16_bits(uint h) { return as_float((h & 0xffffu) << 16); }
#define DLCC_MMA_P(cv, d0, d1, d2, d3, a0, a1, a2, a3, b0, b1) \
    dlcc_mma_k16(&(d0), &(d1), &(d2), &(d3), cv(a0), cv((a0) >> 16), cv(a1), cv((a1) >> 16), cv(a2), cv((a2) >> 16), \
                 cv(a3), cv((a3) >> 16), cv(b0), cv((b0) >> 16), cv(b1), cv((b1) >> 16), mma_scr, mma_lane)
#define MMA_F16_P(...) DLCC_MMA_P(dlcc_f16_bits, __VA_ARGS__)
#define MMA_BF16_P(...) DLCC_MMA_P(dlcc_bf16_bits, __VA_ARGS__)
/* Hopper's warpgroup MMA (kernels/gemm_wgmma.py), emulated. A wgmma is queued at issue and run at
 * the WGMMA_WAIT that covers its group, the latest moment the hardware may read its operands, so
 * a template that refills a buffer before waiting for the wgmmas reading it reads the new data
 * here, as it might on a GPU. It reads both operands as the hardware does, through their
 * descriptors: address = start + (row / 8) * stride byte offset + (row % 8) * 128 + k * 2, then
 * the 128B swizzle on the address bits (bits 4-6 ^= bits 7-9). Shared addresses are offsets from
 * the task's `smem` (WG_SMEM_ADDR). Each thread then adds its
 * own D fragment elements (rows g and g + 8 of its warp's 16, columns 8(j / 2) + 2t + (j % 2)),
 * summed in k order; the products of half-type values are exact in float32. Another swizzle
 * mode, or a start address off its 1 KiB atom, makes the whole product NaN. */
typedef ulong wg_desc_t;
#define WG_SMEM_ADDR(p) ((uint)((LPTR const char*)(p) - (LPTR const char*)smem))
#define DLCC_WGQ_MAX 8
typedef struct {
    ulong a[DLCC_WGQ_MAX], b[DLCC_WGQ_MAX];
    int n[DLCC_WGQ_MAX], bf[DLCC_WGQ_MAX], group[DLCC_WGQ_MAX];
    int count, groups;
} dlcc_wgq_t;
#define WGMMA_STATE dlcc_wgq_t dlcc_wgq; dlcc_wgq.count = 0; dlcc_wgq.groups = 0;
EMULATED int dlcc_wg_desc_ok(ulong desc) {  /* 128B swizzle, the start on its 1 KiB atom (bits 7-9 clear) */
    return (desc >> 62) == 1ul && ((((uint)(desc & 0x3fffu) << 4) >> 7) & 7u) == 0u;
}
EMULATED float dlcc_wg_elem(LPTR const ushort* sm, ulong desc, int row, int k, int bf) {
    const uint start = (uint)(desc & 0x3fffu) << 4, sbo = (uint)((desc >> 32) & 0x3fffu) << 4;
    uint addr = start + (uint)(row >> 3) * sbo + (uint)(row & 7) * 128u + (uint)k * 2u;
    addr ^= ((addr >> 7) & 7u) << 4;
    const uint h = sm[addr >> 1];
    return bf ? dlcc_bf16_bits(h) : dlcc_f16_bits(h);
}
EMULATED void dlcc_wgmma_run(ulong da, ulong db, int n, int bf, float* acc, LPTR const ushort* sm, int tid) {
    const int lane = tid & 31, g = lane >> 2, t = lane & 3, w = (tid >> 5) & 3, cols = n / 4;
    /* A descriptor this emulation does not read as the hardware would poisons the whole product. */
    const float poison = dlcc_wg_desc_ok(da) && dlcc_wg_desc_ok(db) ? 0.0f : NAN;
    for (int i = 0; i < 2; ++i) {
        const int r = 16 * w + g + 8 * i;
        for (int j = 0; j < cols; ++j) {
            const int c = 8 * (j >> 1) + 2 * t + (j & 1);
            float s = poison;
            for (int k = 0; k < 16; ++k) s += dlcc_wg_elem(sm, da, r, k, bf) * dlcc_wg_elem(sm, db, c, k, bf);
            acc[i * cols + j] += s;
        }
    }
}
EMULATED void dlcc_wgmma_issue(dlcc_wgq_t* q, ulong da, ulong db, int n, int bf, float* acc, LPTR const ushort* sm,
                             int tid) {
    if (q->count == DLCC_WGQ_MAX) {  /* more in flight than any tiling issues: run it now */
        dlcc_wgmma_run(da, db, n, bf, acc, sm, tid);
        return;
    }
    q->a[q->count] = da; q->b[q->count] = db; q->n[q->count] = n; q->bf[q->count] = bf;
    q->group[q->count] = q->groups;
    q->count++;
}
EMULATED void dlcc_wgmma_wait(dlcc_wgq_t* q, int pending, float* acc, LPTR const ushort* sm, int tid) {
    int keep = 0;
    for (int i = 0; i < q->count; ++i) {
        if (q->group[i] < q->groups - pending) {
            dlcc_wgmma_run(q->a[i], q->b[i], q->n[i], q->bf[i], acc, sm, tid);
        } else {
            q->a[keep] = q->a[i]; q->b[keep] = q->b[i]; q->n[keep] = q->n[i];
            q->bf[keep] = q->bf[i]; q->group[keep] = q->group[i];
            keep++;
        }
    }
    q->count = keep;
}
#define WGMMA_PROXY_FENCE()
#define WGMMA_COMMIT() (dlcc_wgq.groups++)
#define DLCC_WGMMA(n, bf, acc, da, db) \
    dlcc_wgmma_issue(&dlcc_wgq, (da), (db), (n), (bf), (float*)(acc), (LPTR const ushort*)smem, tid)
#define WGMMA_BF16_N16(acc, da, db) DLCC_WGMMA(16, 1, acc, da, db)
#define WGMMA_BF16_N32(acc, da, db) DLCC_WGMMA(32, 1, acc, da, db)
#define WGMMA_BF16_N64(acc, da, db) DLCC_WGMMA(64, 1, acc, da, db)
#define WGMMA_BF16_N128(acc, da, db) DLCC_WGMMA(128, 1, acc, da, db)
#define WGMMA_F16_N16(acc, da, db) DLCC_WGMMA(16, 0, acc, da, db)
#define WGMMA_F16_N32(acc, da, db) DLCC_WGMMA(32, 0, acc, da, db)
#define WGMMA_F16_N64(acc, da, db) DLCC_WGMMA(64, 0, acc, da, db)
#define WGMMA_F16_N128(acc, da, db) DLCC_WGMMA(128, 0, acc, da, db)
#define WGMMA_ARRIVE_N16(acc)
#define WGMMA_ARRIVE_N32(acc)
#define WGMMA_ARRIVE_N64(acc)
#define WGMMA_ARRIVE_N128(acc)
#define DLCC_WG_WAIT(n, acc) dlcc_wgmma_wait(&dlcc_wgq, (n), (float*)(acc), (LPTR const ushort*)smem, tid)
#define WGMMA_WAIT_N16(n, acc) DLCC_WG_WAIT(n, acc)
#define WGMMA_WAIT_N32(n, acc) DLCC_WG_WAIT(n, acc)
#define WGMMA_WAIT_N64(n, acc) DLCC_WG_WAIT(n, acc)
#define WGMMA_WAIT_N128(n, acc) DLCC_WG_WAIT(n, acc)
