/* dlcc portable dialect: helpers written once in the dialect itself, after the dialect prelude. */

/* max/min that propagate NaN, as ONNX Relu/Clip/Max/Min do (fmaxf/fmax return the other operand). */
DEVICE float dlcc_nmax(float a, float b) { return (a != a || a > b) ? a : b; }
DEVICE float dlcc_nmin(float a, float b) { return (a != a || a < b) ? a : b; }
#define F_NMAX dlcc_nmax
#define F_NMIN dlcc_nmin

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
