/* dlcc portable dialect: helpers written once in the dialect itself, after the dialect prelude. */

/* max/min that propagate NaN, as ONNX Relu/Clip/Max/Min do (fmaxf/fmax return the other operand). */
DEVICE float dlcc_nmax(float a, float b) { return (a != a || a > b) ? a : b; }
DEVICE float dlcc_nmin(float a, float b) { return (a != a || a < b) ? a : b; }
#define F_NMAX dlcc_nmax
#define F_NMIN dlcc_nmin

/* tanh, exactly +-1 past |x| = 10 (where the correctly rounded float32 tanh is +-1: 1 - tanh(10) is
 * 4e-9, under half an ulp of 1). PoCL's tanh stops at +-0.99999994 (within OpenCL's 5 ulp), and
 * 1 + tanh(u), Gelu's tanh form, then gives 6e-8 instead of 0: gelu(-1e10) came out -298, and
 * gelu(-inf) -inf where onnxruntime gives NaN (-inf times 0). NaN stays NaN. */
DEVICE float dlcc_tanh(float x) { return F_FABS(x) > 10.0f ? (x > 0.0f ? 1.0f : -1.0f) : F_TANH_RAW(x); }

/* bfloat16 storage (typedef bf16: the upper 16 bits of a float). Rounding is to nearest, ties to
 * even, as numpy's ml_dtypes and the hardware's cvt.rn.bf16 do; NaN stays NaN. TO_BF16 rounds a
 * float to the nearest bfloat16 value and keeps it a float (tensor-core operands, precision bf16). */
DEVICE float dlcc_to_bf16(float x) {
    unsigned int u = AS_UINT(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return AS_FLOAT(u | 0x00400000u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return AS_FLOAT(u & 0xffff0000u);
}
#define TO_BF16(x) dlcc_to_bf16(x)
#define LOAD_BF16(p, i) AS_FLOAT(((unsigned int)(p)[i]) << 16)
#define STORE_BF16(p, i, v) ((p)[i] = (bf16)(AS_UINT(dlcc_to_bf16(v)) >> 16))

/* Precision tf32x3 (float32 accuracy on tensor cores, as CUTLASS's 3xTF32), written once over
 * each dialect's TO_TF32 and MMA_TF32 (hardware on CUDA, emulated on OpenCL): each float32 operand
 * is split into big = TF32(x) and small = TF32(x - big) (the difference is exact), and
 * D += As.Bb + Ab.Bs + Ab.Bb in three TF32 mmas, the small products first. Only As.Bs (about 2^-22
 * of a product) is dropped. Infinities: an infinite operand's small part is 0 (not inf - inf), and
 * the two cross products see its big part as 0 too (else a 0 small part times it is NaN), so the
 * big x big product alone carries it, as a float32 product would. The template keeps the
 * operands float32 (TO_F32) up to here. */
#define TO_F32(x) (x)
DEVICE float dlcc_tf32_small(float x, float big) { return F_ISINF(big) ? 0.0f : TO_TF32(x - big); }
DEVICE float dlcc_tf32_finite(float big) { return F_ISINF(big) ? 0.0f : big; }
#define MMA_TF32X3(d0, d1, d2, d3, a0, a1, a2, a3, b0, b1) do { \
    const float x3a0 = (a0), x3a1 = (a1), x3a2 = (a2), x3a3 = (a3), x3b0 = (b0), x3b1 = (b1); \
    const float x3ab0 = TO_TF32(x3a0), x3ab1 = TO_TF32(x3a1), x3ab2 = TO_TF32(x3a2), x3ab3 = TO_TF32(x3a3); \
    const float x3bb0 = TO_TF32(x3b0), x3bb1 = TO_TF32(x3b1); \
    MMA_TF32(d0, d1, d2, d3, dlcc_tf32_small(x3a0, x3ab0), dlcc_tf32_small(x3a1, x3ab1), \
             dlcc_tf32_small(x3a2, x3ab2), dlcc_tf32_small(x3a3, x3ab3), dlcc_tf32_finite(x3bb0), \
             dlcc_tf32_finite(x3bb1)); \
    MMA_TF32(d0, d1, d2, d3, dlcc_tf32_finite(x3ab0), dlcc_tf32_finite(x3ab1), dlcc_tf32_finite(x3ab2), \
             dlcc_tf32_finite(x3ab3), dlcc_tf32_small(x3b0, x3bb0), dlcc_tf32_small(x3b1, x3bb1)); \
    MMA_TF32(d0, d1, d2, d3, x3ab0, x3ab1, x3ab2, x3ab3, x3bb0, x3bb1); \
} while (0)

/* Dependency counters for rPrograms with `sync: counters` (passes/rammer.py _emit): cnt[e] counts
 * the finished rTasks of table entry e in this launch. dlcc_wait_counts spins (thread 0) until each
 * (entry, rTask count) pair of `deps` is reached, then fences: the reader side; the caller meets
 * its block at a barrier next. The writer side is in the kernel: block barrier, fence, atomic add.
 * dlcc_counters_leave: the last of the grid's blocks to leave resets the n counters and the count
 * of blocks that left (cnt[n]), so the next launch starts from zeros; every other block has done
 * all its waits by then. Launched only with every block resident. */
DEVICE void dlcc_wait_counts(GPTR int* cnt, GPTR const int* deps, int n) {
    for (int i = 0; i < n; i++) {
        while (ATOMIC_LOAD_I32(cnt + deps[2 * i]) < deps[2 * i + 1]) { }
    }
    FENCE();
}
DEVICE void dlcc_counters_leave(GPTR int* cnt, int n) {
    BARRIER();
    if (THREAD_ID == 0) {
        FENCE();
        if (ATOMIC_ADD_I32(cnt + n, 1) == GRID_DIM - 1) {
            for (int e = 0; e < n; e++) ATOMIC_STORE_I32(cnt + e, 0);
            ATOMIC_STORE_I32(cnt + n, 0);
            FENCE();
        }
    }
}

/* Grid barrier for spin-waiting kernels (astitch Global scheme). bar[0] counts arrivals, bar[1]
 * is the generation. The last block to arrive resets the count before it bumps the generation,
 * so the counters are balanced after every barrier: no reset between inferences, and runs back to
 * back are safe. Writer side: block barrier, fence, then arrive; reader side: spin on the
 * generation, fence, block barrier (DESIGN.md §3). Launched only with every block resident. */
DEVICE void dlcc_grid_sync(GPTR int* bar) {
    BARRIER();
    if (THREAD_ID == 0) {
        const int gen = ATOMIC_LOAD_I32(bar + 1);
        FENCE();
        if (ATOMIC_ADD_I32(bar, 1) == GRID_DIM - 1) {
            ATOMIC_STORE_I32(bar, 0);
            FENCE();
            ATOMIC_ADD_I32(bar + 1, 1);
        } else {
            while (ATOMIC_LOAD_I32(bar + 1) == gen) { }
        }
        FENCE();
    }
    BARRIER();
}
