/* dlcc portable kernel dialect -> CUDA C++.
 * Every kernel dlcc emits is written once against these macros; prelude_opencl.h maps the same
 * names to OpenCL C, so the text that runs on PoCL in CI is the text nvcc compiles for the GPU. */
#include <cuda_fp16.h>
#define KERNEL extern "C" __global__
#define DEVICE static __device__ __forceinline__
/* A persistent kernel's call site (passes/rammer.py): kept out of line, so ptxas allocates each
 * rTask's registers on its own and the kernel needs the max over its rTasks, not what inlining
 * them all into one loop nest keeps live (that spilled: vit, t5, convnext at 255 registers). */
#define SITE_FN static __device__ __noinline__
#define GPTR
#define LPTR
#define SHARED __shared__
#define THREAD_ID ((int)threadIdx.x)
#define BLOCK_ID ((int)blockIdx.x)
#define BLOCK_DIM ((int)blockDim.x)
#define GRID_DIM ((int)gridDim.x)
#define BARRIER() __syncthreads()
#define FENCE() __threadfence()
/* At most n threads, and one resident block per SM is enough: what the co-residency proofs assume
 * (passes/rammer.py proven_veus, astitch's spin kernels), so ptxas may use up to 255 registers
 * instead of squeezing into 128 for a second block nobody counts on (that spilled). */
#define LAUNCH_BOUNDS(n) __launch_bounds__(n, 1)
#define ATOMIC_LOAD_I32(p) (*(volatile int*)(p))
#define ATOMIC_STORE_I32(p, v) (*(volatile int*)(p) = (v))
#define ATOMIC_ADD_I32(p, v) atomicAdd((int*)(p), (v))
typedef long long i64;
typedef unsigned char u8;
typedef signed char i8;
#define DLCC_INF __int_as_float(0x7f800000)
#define DLCC_NAN __int_as_float(0x7fffffff)
#define F_EXP expf
#define F_LOG logf
#define F_SQRT sqrtf
#define F_RSQRT rsqrtf
#define F_POW powf
#define F_TANH tanhf
#define F_ERF erff
#define F_FABS fabsf
#define F_FLOOR floorf
#define F_CEIL ceilf
#define F_RINT rintf
#define F_MIN fminf
#define F_MAX fmaxf
#define F_SIN sinf
#define F_COS cosf
#define F_FMOD fmodf
#define F_ISNAN(x) isnan(x)
#define F_ISINF(x) isinf(x)
typedef __half f16;  /* float16 is storage only: loads and stores convert to and from float */
#define LOAD_F16(p, i) __half2float((p)[i])
#define STORE_F16(p, i, v) ((p)[i] = __float2half_rn(v))
typedef unsigned short bf16;  /* bfloat16 storage: a float's upper 16 bits (prelude_common.h converts) */
#define AS_UINT(x) __float_as_uint(x)
#define AS_FLOAT(u) __uint_as_float(u)
/* Tensor cores (kernels/gemm_mma.py; sm_80 and newer). TO_TF32 rounds a float to TF32 (10-bit
 * mantissa, nearest, ties away) as the hardware's cvt.rna does; MMA_TF32 is one warp-wide
 * mma.sync m16n8k8 (A row-major 16x8, B column-major 8x8, D += A.B in float32), each operand a
 * per-lane fragment (lane = 4 * groupID + threadID_in_group; PTX ISA "Matrix Fragments for
 * mma.m16n8k8"). An unused static function or macro emits nothing, so kernels that use
 * neither still build for sm_70.
 * MMA_EMU_FLOATS is the shared memory OpenCL's emulation needs per warp: none here. */
DEVICE float dlcc_to_tf32(float x) {
    unsigned u;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(u) : "f"(x));
    return __uint_as_float(u);
}
#define TO_TF32(x) dlcc_to_tf32(x)
#define MMA_TF32(d0, d1, d2, d3, a0, a1, a2, a3, b0, b1) \
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, " \
                 "{%0,%1,%2,%3};" : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) \
                 : "r"(__float_as_uint(a0)), "r"(__float_as_uint(a1)), "r"(__float_as_uint(a2)), \
                   "r"(__float_as_uint(a3)), "r"(__float_as_uint(b0)), "r"(__float_as_uint(b1)))
#define MMA_EMU_FLOATS 0
/* fp16 and bf16 (precision fp16/bf16): mma.sync m16n8k16, float32 accumulation. The template
 * hands each lane its 8 A and 4 B elements as floats already rounded to the half type (TO_F16,
 * TO_BF16); packing two into a .b32 register (the lower index in the lower 16 bits, PTX ISA
 * "Matrix Fragments for mma.m16n8k16 with floating point type") is exact. */
DEVICE float dlcc_to_f16(float x) { return __half2float(__float2half_rn(x)); }
#define TO_F16(x) dlcc_to_f16(x)
DEVICE unsigned dlcc_pack_f16(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&h);
}
DEVICE unsigned dlcc_pack_bf16(float lo, float hi) {
    return (__float_as_uint(hi) & 0xffff0000u) | (__float_as_uint(lo) >> 16);
}
#define DLCC_MMA_K16(type, pack, d0, d1, d2, d3, a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3) \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." type "." type ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, " \
                 "{%8,%9}, {%0,%1,%2,%3};" : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) \
                 : "r"(pack(a0, a1)), "r"(pack(a2, a3)), "r"(pack(a4, a5)), "r"(pack(a6, a7)), \
                   "r"(pack(b0, b1)), "r"(pack(b2, b3)))
#define MMA_F16(...) DLCC_MMA_K16("f16", dlcc_pack_f16, __VA_ARGS__)
#define MMA_BF16(...) DLCC_MMA_K16("bf16", dlcc_pack_bf16, __VA_ARGS__)
#define MMA_EMU_FLOATS_K16 0
/* The loops around MMA_TF32 unroll here (the accumulators must be registers); OpenCL keeps them. */
#define MMA_UNROLL _Pragma("unroll")

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

/* ---- kernels emitted by dlcc ---- */

DEVICE void g_tc128x128x32_w2x4_fp16_task(GPTR const float* A, GPTR const float* B, GPTR float* C, const int task, const int tid, LPTR float* smem) {
    LPTR float* As = smem;
    LPTR float* Bs = smem + 4608;
    const int mma_lane = tid % 32, mma_warp = tid / 32;
    LPTR float* mma_scr = smem + 9216 + mma_warp * MMA_EMU_FLOATS_K16;  /* OpenCL's emulation */
    (void)mma_scr;
    const int bt = task / 6;
    const int tile = task % 6;
    const int m0 = (tile / 6) * 128;
    const int n0 = (tile % 6) * 128;
    const int mma_wm0 = (mma_warp / 4) * 64, mma_wn0 = (mma_warp % 4) * 32;
    const int mma_g = mma_lane / 4, mma_t = mma_lane % 4;
    float acc[8][8];
    #pragma unroll
    for (int i = 0; i < 8; ++i) {
        #pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
    }
    float ra[16], rb[16];
    #pragma unroll
    for (int r = 0; r < 16; ++r) {
        const int l = tid + r * 256;
        const int xx = l / 32, kk = l % 32;
        const int m = m0 + xx, k = 0 + kk;
        float val = 0.0f;
        if (m < 128 && k < 768) {
            val = A[m * 768 + k];
        }
        ra[r] = val;
    }
    #pragma unroll
    for (int r = 0; r < 16; ++r) {
        const int l = tid + r * 256;
        const int xx = l / 32, kk = l % 32;
        const int k = 0 + kk, n = n0 + xx;
        float val = 0.0f;
        if (k < 768 && n < 768) {
            val = B[n * 768 + k];
        }
        rb[r] = val;
    }
    for (int k0 = 0; k0 < 768; k0 += 32) {
        #pragma unroll
        for (int r = 0; r < 16; ++r) {
            const int l = tid + r * 256;
            const int xx = l / 32, kk = l % 32;
            As[(xx) * 36 + (kk)] = TO_F16(ra[r]);
        }
        #pragma unroll
        for (int r = 0; r < 16; ++r) {
            const int l = tid + r * 256;
            const int xx = l / 32, kk = l % 32;
            Bs[(xx) * 36 + (kk)] = TO_F16(rb[r]);
        }
        BARRIER();
        if (k0 + 32 < 768) {
            #pragma unroll
            for (int r = 0; r < 16; ++r) {
                const int l = tid + r * 256;
                const int xx = l / 32, kk = l % 32;
                const int m = m0 + xx, k = (k0 + 32) + kk;
                float val = 0.0f;
                if (m < 128 && k < 768) {
                    val = A[m * 768 + k];
                }
                ra[r] = val;
            }
            #pragma unroll
            for (int r = 0; r < 16; ++r) {
                const int l = tid + r * 256;
                const int xx = l / 32, kk = l % 32;
                const int k = (k0 + 32) + kk, n = n0 + xx;
                float val = 0.0f;
                if (k < 768 && n < 768) {
                    val = B[n * 768 + k];
                }
                rb[r] = val;
            }
        }
        MMA_UNROLL
        for (int kk = 0; kk < 32; kk += 16) {
            float mma_af[4][8], mma_bf[4][4];
            #pragma unroll
            for (int mi = 0; mi < 4; ++mi) {
                mma_af[mi][0] = As[(mma_wm0 + mi * 16 + mma_g + 0) * 36 + (kk + 2 * mma_t + 0)];
                mma_af[mi][1] = As[(mma_wm0 + mi * 16 + mma_g + 0) * 36 + (kk + 2 * mma_t + 1)];
                mma_af[mi][2] = As[(mma_wm0 + mi * 16 + mma_g + 8) * 36 + (kk + 2 * mma_t + 0)];
                mma_af[mi][3] = As[(mma_wm0 + mi * 16 + mma_g + 8) * 36 + (kk + 2 * mma_t + 1)];
                mma_af[mi][4] = As[(mma_wm0 + mi * 16 + mma_g + 0) * 36 + (kk + 2 * mma_t + 8)];
                mma_af[mi][5] = As[(mma_wm0 + mi * 16 + mma_g + 0) * 36 + (kk + 2 * mma_t + 9)];
                mma_af[mi][6] = As[(mma_wm0 + mi * 16 + mma_g + 8) * 36 + (kk + 2 * mma_t + 8)];
                mma_af[mi][7] = As[(mma_wm0 + mi * 16 + mma_g + 8) * 36 + (kk + 2 * mma_t + 9)];
            }
            #pragma unroll
            for (int ni = 0; ni < 4; ++ni) {
                mma_bf[ni][0] = Bs[(mma_wn0 + ni * 8 + mma_g) * 36 + (kk + 2 * mma_t + 0)];
                mma_bf[ni][1] = Bs[(mma_wn0 + ni * 8 + mma_g) * 36 + (kk + 2 * mma_t + 1)];
                mma_bf[ni][2] = Bs[(mma_wn0 + ni * 8 + mma_g) * 36 + (kk + 2 * mma_t + 8)];
                mma_bf[ni][3] = Bs[(mma_wn0 + ni * 8 + mma_g) * 36 + (kk + 2 * mma_t + 9)];
            }
            MMA_UNROLL
            for (int mi = 0; mi < 4; ++mi) {
                MMA_UNROLL
                for (int ni = 0; ni < 4; ++ni) {
                    MMA_F16(acc[2 * mi][2 * ni], acc[2 * mi][2 * ni + 1], acc[2 * mi + 1][2 * ni],
                             acc[2 * mi + 1][2 * ni + 1], mma_af[mi][0], mma_af[mi][1], mma_af[mi][2], mma_af[mi][3], mma_af[mi][4], mma_af[mi][5], mma_af[mi][6], mma_af[mi][7], mma_bf[ni][0], mma_bf[ni][1], mma_bf[ni][2], mma_bf[ni][3]);
                }
            }
        }
        BARRIER();
    }
    #pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int m = m0 + mma_wm0 + (i / 2) * 16 + (i % 2) * 8 + mma_g;
        #pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int n = n0 + mma_wn0 + (j / 2) * 8 + 2 * mma_t + (j % 2);
            if (m < 128 && n < 768) {
                C[m * 768 + n] = acc[i][j];
            }
        }
    }
}

KERNEL void g_tc128x128x32_w2x4_fp16(GPTR const float* A, GPTR const float* B, GPTR float* C) {
    SHARED float smem[9216 + 8 * MMA_EMU_FLOATS_K16];
    g_tc128x128x32_w2x4_fp16_task(A, B, C, BLOCK_ID, THREAD_ID, smem);
}

DEVICE void g_tc128x64x32_w4x2_fp16_task(GPTR const float* A, GPTR const float* B, GPTR float* C, const int task, const int tid, LPTR float* smem) {
    LPTR float* As = smem;
    LPTR float* Bs = smem + 4608;
    const int mma_lane = tid % 32, mma_warp = tid / 32;
    LPTR float* mma_scr = smem + 6912 + mma_warp * MMA_EMU_FLOATS_K16;  /* OpenCL's emulation */
    (void)mma_scr;
    const int bt = task / 12;
    const int tile = task % 12;
    const int m0 = (tile / 12) * 128;
    const int n0 = (tile % 12) * 64;
    const int mma_wm0 = (mma_warp / 2) * 32, mma_wn0 = (mma_warp % 2) * 32;
    const int mma_g = mma_lane / 4, mma_t = mma_lane % 4;
    float acc[4][8];
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
        #pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
    }
    float ra[16], rb[8];
    #pragma unroll
    for (int r = 0; r < 16; ++r) {
        const int l = tid + r * 256;
        const int xx = l / 32, kk = l % 32;
        const int m = m0 + xx, k = 0 + kk;
        float val = 0.0f;
        if (m < 128 && k < 768) {
            val = A[m * 768 + k];
        }
        ra[r] = val;
    }
    #pragma unroll
    for (int r = 0; r < 8; ++r) {
        const int l = tid + r * 256;
        const int xx = l / 32, kk = l % 32;
        const int k = 0 + kk, n = n0 + xx;
        float val = 0.0f;
        if (k < 768 && n < 768) {
            val = B[n * 768 + k];
        }
        rb[r] = val;
    }
    for (int k0 = 0; k0 < 768; k0 += 32) {
        #pragma unroll
        for (int r = 0; r < 16; ++r) {
            const int l = tid + r * 256;
            const int xx = l / 32, kk = l % 32;
            As[(xx) * 36 + (kk)] = TO_F16(ra[r]);
        }
        #pragma unroll
        for (int r = 0; r < 8; ++r) {
            const int l = tid + r * 256;
            const int xx = l / 32, kk = l % 32;
            Bs[(xx) * 36 + (kk)] = TO_F16(rb[r]);
        }
        BARRIER();
        if (k0 + 32 < 768) {
            #pragma unroll
            for (int r = 0; r < 16; ++r) {
                const int l = tid + r * 256;
                const int xx = l / 32, kk = l % 32;
                const int m = m0 + xx, k = (k0 + 32) + kk;
                float val = 0.0f;
                if (m < 128 && k < 768) {
                    val = A[m * 768 + k];
                }
                ra[r] = val;
            }
            #pragma unroll
            for (int r = 0; r < 8; ++r) {
                const int l = tid + r * 256;
                const int xx = l / 32, kk = l % 32;
                const int k = (k0 + 32) + kk, n = n0 + xx;
                float val = 0.0f;
                if (k < 768 && n < 768) {
                    val = B[n * 768 + k];
                }
                rb[r] = val;
            }
        }
        MMA_UNROLL
        for (int kk = 0; kk < 32; kk += 16) {
            float mma_af[2][8], mma_bf[4][4];
            #pragma unroll
            for (int mi = 0; mi < 2; ++mi) {
                mma_af[mi][0] = As[(mma_wm0 + mi * 16 + mma_g + 0) * 36 + (kk + 2 * mma_t + 0)];
                mma_af[mi][1] = As[(mma_wm0 + mi * 16 + mma_g + 0) * 36 + (kk + 2 * mma_t + 1)];
                mma_af[mi][2] = As[(mma_wm0 + mi * 16 + mma_g + 8) * 36 + (kk + 2 * mma_t + 0)];
                mma_af[mi][3] = As[(mma_wm0 + mi * 16 + mma_g + 8) * 36 + (kk + 2 * mma_t + 1)];
                mma_af[mi][4] = As[(mma_wm0 + mi * 16 + mma_g + 0) * 36 + (kk + 2 * mma_t + 8)];
                mma_af[mi][5] = As[(mma_wm0 + mi * 16 + mma_g + 0) * 36 + (kk + 2 * mma_t + 9)];
                mma_af[mi][6] = As[(mma_wm0 + mi * 16 + mma_g + 8) * 36 + (kk + 2 * mma_t + 8)];
                mma_af[mi][7] = As[(mma_wm0 + mi * 16 + mma_g + 8) * 36 + (kk + 2 * mma_t + 9)];
            }
            #pragma unroll
            for (int ni = 0; ni < 4; ++ni) {
                mma_bf[ni][0] = Bs[(mma_wn0 + ni * 8 + mma_g) * 36 + (kk + 2 * mma_t + 0)];
                mma_bf[ni][1] = Bs[(mma_wn0 + ni * 8 + mma_g) * 36 + (kk + 2 * mma_t + 1)];
                mma_bf[ni][2] = Bs[(mma_wn0 + ni * 8 + mma_g) * 36 + (kk + 2 * mma_t + 8)];
                mma_bf[ni][3] = Bs[(mma_wn0 + ni * 8 + mma_g) * 36 + (kk + 2 * mma_t + 9)];
            }
            MMA_UNROLL
            for (int mi = 0; mi < 2; ++mi) {
                MMA_UNROLL
                for (int ni = 0; ni < 4; ++ni) {
                    MMA_F16(acc[2 * mi][2 * ni], acc[2 * mi][2 * ni + 1], acc[2 * mi + 1][2 * ni],
                             acc[2 * mi + 1][2 * ni + 1], mma_af[mi][0], mma_af[mi][1], mma_af[mi][2], mma_af[mi][3], mma_af[mi][4], mma_af[mi][5], mma_af[mi][6], mma_af[mi][7], mma_bf[ni][0], mma_bf[ni][1], mma_bf[ni][2], mma_bf[ni][3]);
                }
            }
        }
        BARRIER();
    }
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int m = m0 + mma_wm0 + (i / 2) * 16 + (i % 2) * 8 + mma_g;
        #pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int n = n0 + mma_wn0 + (j / 2) * 8 + 2 * mma_t + (j % 2);
            if (m < 128 && n < 768) {
                C[m * 768 + n] = acc[i][j];
            }
        }
    }
}

KERNEL void g_tc128x64x32_w4x2_fp16(GPTR const float* A, GPTR const float* B, GPTR float* C) {
    SHARED float smem[6912 + 8 * MMA_EMU_FLOATS_K16];
    g_tc128x64x32_w4x2_fp16_task(A, B, C, BLOCK_ID, THREAD_ID, smem);
}

DEVICE void g_tc64x128x32_w2x4_fp16_task(GPTR const float* A, GPTR const float* B, GPTR float* C, const int task, const int tid, LPTR float* smem) {
    LPTR float* As = smem;
    LPTR float* Bs = smem + 2304;
    const int mma_lane = tid % 32, mma_warp = tid / 32;
    LPTR float* mma_scr = smem + 6912 + mma_warp * MMA_EMU_FLOATS_K16;  /* OpenCL's emulation */
    (void)mma_scr;
    const int bt = task / 12;
    const int tile = task % 12;
    const int m0 = (tile / 6) * 64;
    const int n0 = (tile % 6) * 128;
    const int mma_wm0 = (mma_warp / 4) * 32, mma_wn0 = (mma_warp % 4) * 32;
    const int mma_g = mma_lane / 4, mma_t = mma_lane % 4;
    float acc[4][8];
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
        #pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
    }
    float ra[8], rb[16];
    #pragma unroll
    for (int r = 0; r < 8; ++r) {
        const int l = tid + r * 256;
        const int xx = l / 32, kk = l % 32;
        const int m = m0 + xx, k = 0 + kk;
        float val = 0.0f;
        if (m < 128 && k < 768) {
            val = A[m * 768 + k];
        }
        ra[r] = val;
    }
    #pragma unroll
    for (int r = 0; r < 16; ++r) {
        const int l = tid + r * 256;
        const int xx = l / 32, kk = l % 32;
        const int k = 0 + kk, n = n0 + xx;
        float val = 0.0f;
        if (k < 768 && n < 768) {
            val = B[n * 768 + k];
        }
        rb[r] = val;
    }
    for (int k0 = 0; k0 < 768; k0 += 32) {
        #pragma unroll
        for (int r = 0; r < 8; ++r) {
            const int l = tid + r * 256;
            const int xx = l / 32, kk = l % 32;
            As[(xx) * 36 + (kk)] = TO_F16(ra[r]);
        }
        #pragma unroll
        for (int r = 0; r < 16; ++r) {
            const int l = tid + r * 256;
            const int xx = l / 32, kk = l % 32;
            Bs[(xx) * 36 + (kk)] = TO_F16(rb[r]);
        }
        BARRIER();
        if (k0 + 32 < 768) {
            #pragma unroll
            for (int r = 0; r < 8; ++r) {
                const int l = tid + r * 256;
                const int xx = l / 32, kk = l % 32;
                const int m = m0 + xx, k = (k0 + 32) + kk;
                float val = 0.0f;
                if (m < 128 && k < 768) {
                    val = A[m * 768 + k];
                }
                ra[r] = val;
            }
            #pragma unroll
            for (int r = 0; r < 16; ++r) {
                const int l = tid + r * 256;
                const int xx = l / 32, kk = l % 32;
                const int k = (k0 + 32) + kk, n = n0 + xx;
                float val = 0.0f;
                if (k < 768 && n < 768) {
                    val = B[n * 768 + k];
                }
                rb[r] = val;
            }
        }
        MMA_UNROLL
        for (int kk = 0; kk < 32; kk += 16) {
            float mma_af[2][8], mma_bf[4][4];
            #pragma unroll
            for (int mi = 0; mi < 2; ++mi) {
                mma_af[mi][0] = As[(mma_wm0 + mi * 16 + mma_g + 0) * 36 + (kk + 2 * mma_t + 0)];
                mma_af[mi][1] = As[(mma_wm0 + mi * 16 + mma_g + 0) * 36 + (kk + 2 * mma_t + 1)];
                mma_af[mi][2] = As[(mma_wm0 + mi * 16 + mma_g + 8) * 36 + (kk + 2 * mma_t + 0)];
                mma_af[mi][3] = As[(mma_wm0 + mi * 16 + mma_g + 8) * 36 + (kk + 2 * mma_t + 1)];
                mma_af[mi][4] = As[(mma_wm0 + mi * 16 + mma_g + 0) * 36 + (kk + 2 * mma_t + 8)];
                mma_af[mi][5] = As[(mma_wm0 + mi * 16 + mma_g + 0) * 36 + (kk + 2 * mma_t + 9)];
                mma_af[mi][6] = As[(mma_wm0 + mi * 16 + mma_g + 8) * 36 + (kk + 2 * mma_t + 8)];
                mma_af[mi][7] = As[(mma_wm0 + mi * 16 + mma_g + 8) * 36 + (kk + 2 * mma_t + 9)];
            }
            #pragma unroll
            for (int ni = 0; ni < 4; ++ni) {
                mma_bf[ni][0] = Bs[(mma_wn0 + ni * 8 + mma_g) * 36 + (kk + 2 * mma_t + 0)];
                mma_bf[ni][1] = Bs[(mma_wn0 + ni * 8 + mma_g) * 36 + (kk + 2 * mma_t + 1)];
                mma_bf[ni][2] = Bs[(mma_wn0 + ni * 8 + mma_g) * 36 + (kk + 2 * mma_t + 8)];
                mma_bf[ni][3] = Bs[(mma_wn0 + ni * 8 + mma_g) * 36 + (kk + 2 * mma_t + 9)];
            }
            MMA_UNROLL
            for (int mi = 0; mi < 2; ++mi) {
                MMA_UNROLL
                for (int ni = 0; ni < 4; ++ni) {
                    MMA_F16(acc[2 * mi][2 * ni], acc[2 * mi][2 * ni + 1], acc[2 * mi + 1][2 * ni],
                             acc[2 * mi + 1][2 * ni + 1], mma_af[mi][0], mma_af[mi][1], mma_af[mi][2], mma_af[mi][3], mma_af[mi][4], mma_af[mi][5], mma_af[mi][6], mma_af[mi][7], mma_bf[ni][0], mma_bf[ni][1], mma_bf[ni][2], mma_bf[ni][3]);
                }
            }
        }
        BARRIER();
    }
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int m = m0 + mma_wm0 + (i / 2) * 16 + (i % 2) * 8 + mma_g;
        #pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int n = n0 + mma_wn0 + (j / 2) * 8 + 2 * mma_t + (j % 2);
            if (m < 128 && n < 768) {
                C[m * 768 + n] = acc[i][j];
            }
        }
    }
}

KERNEL void g_tc64x128x32_w2x4_fp16(GPTR const float* A, GPTR const float* B, GPTR float* C) {
    SHARED float smem[6912 + 8 * MMA_EMU_FLOATS_K16];
    g_tc64x128x32_w2x4_fp16_task(A, B, C, BLOCK_ID, THREAD_ID, smem);
}

DEVICE void g_tc64x64x32_w2x4_fp16_task(GPTR const float* A, GPTR const float* B, GPTR float* C, const int task, const int tid, LPTR float* smem) {
    LPTR float* As = smem;
    LPTR float* Bs = smem + 2304;
    const int mma_lane = tid % 32, mma_warp = tid / 32;
    LPTR float* mma_scr = smem + 4608 + mma_warp * MMA_EMU_FLOATS_K16;  /* OpenCL's emulation */
    (void)mma_scr;
    const int bt = task / 24;
    const int tile = task % 24;
    const int m0 = (tile / 12) * 64;
    const int n0 = (tile % 12) * 64;
    const int mma_wm0 = (mma_warp / 4) * 32, mma_wn0 = (mma_warp % 4) * 16;
    const int mma_g = mma_lane / 4, mma_t = mma_lane % 4;
    float acc[4][4];
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
        #pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    }
    float ra[8], rb[8];
    #pragma unroll
    for (int r = 0; r < 8; ++r) {
        const int l = tid + r * 256;
        const int xx = l / 32, kk = l % 32;
        const int m = m0 + xx, k = 0 + kk;
        float val = 0.0f;
        if (m < 128 && k < 768) {
            val = A[m * 768 + k];
        }
        ra[r] = val;
    }
    #pragma unroll
    for (int r = 0; r < 8; ++r) {
        const int l = tid + r * 256;
        const int xx = l / 32, kk = l % 32;
        const int k = 0 + kk, n = n0 + xx;
        float val = 0.0f;
        if (k < 768 && n < 768) {
            val = B[n * 768 + k];
        }
        rb[r] = val;
    }
    for (int k0 = 0; k0 < 768; k0 += 32) {
        #pragma unroll
        for (int r = 0; r < 8; ++r) {
            const int l = tid + r * 256;
            const int xx = l / 32, kk = l % 32;
            As[(xx) * 36 + (kk)] = TO_F16(ra[r]);
        }
        #pragma unroll
        for (int r = 0; r < 8; ++r) {
            const int l = tid + r * 256;
            const int xx = l / 32, kk = l % 32;
            Bs[(xx) * 36 + (kk)] = TO_F16(rb[r]);
        }
        BARRIER();
        if (k0 + 32 < 768) {
            #pragma unroll
            for (int r = 0; r < 8; ++r) {
                const int l = tid + r * 256;
                const int xx = l / 32, kk = l % 32;
                const int m = m0 + xx, k = (k0 + 32) + kk;
                float val = 0.0f;
                if (m < 128 && k < 768) {
                    val = A[m * 768 + k];
                }
                ra[r] = val;
            }
            #pragma unroll
            for (int r = 0; r < 8; ++r) {
                const int l = tid + r * 256;
                const int xx = l / 32, kk = l % 32;
                const int k = (k0 + 32) + kk, n = n0 + xx;
                float val = 0.0f;
                if (k < 768 && n < 768) {
                    val = B[n * 768 + k];
                }
                rb[r] = val;
            }
        }
        MMA_UNROLL
        for (int kk = 0; kk < 32; kk += 16) {
            float mma_af[2][8], mma_bf[2][4];
            #pragma unroll
            for (int mi = 0; mi < 2; ++mi) {
                mma_af[mi][0] = As[(mma_wm0 + mi * 16 + mma_g + 0) * 36 + (kk + 2 * mma_t + 0)];
                mma_af[mi][1] = As[(mma_wm0 + mi * 16 + mma_g + 0) * 36 + (kk + 2 * mma_t + 1)];
                mma_af[mi][2] = As[(mma_wm0 + mi * 16 + mma_g + 8) * 36 + (kk + 2 * mma_t + 0)];
                mma_af[mi][3] = As[(mma_wm0 + mi * 16 + mma_g + 8) * 36 + (kk + 2 * mma_t + 1)];
                mma_af[mi][4] = As[(mma_wm0 + mi * 16 + mma_g + 0) * 36 + (kk + 2 * mma_t + 8)];
                mma_af[mi][5] = As[(mma_wm0 + mi * 16 + mma_g + 0) * 36 + (kk + 2 * mma_t + 9)];
                mma_af[mi][6] = As[(mma_wm0 + mi * 16 + mma_g + 8) * 36 + (kk + 2 * mma_t + 8)];
                mma_af[mi][7] = As[(mma_wm0 + mi * 16 + mma_g + 8) * 36 + (kk + 2 * mma_t + 9)];
            }
            #pragma unroll
            for (int ni = 0; ni < 2; ++ni) {
                mma_bf[ni][0] = Bs[(mma_wn0 + ni * 8 + mma_g) * 36 + (kk + 2 * mma_t + 0)];
                mma_bf[ni][1] = Bs[(mma_wn0 + ni * 8 + mma_g) * 36 + (kk + 2 * mma_t + 1)];
                mma_bf[ni][2] = Bs[(mma_wn0 + ni * 8 + mma_g) * 36 + (kk + 2 * mma_t + 8)];
                mma_bf[ni][3] = Bs[(mma_wn0 + ni * 8 + mma_g) * 36 + (kk + 2 * mma_t + 9)];
            }
            MMA_UNROLL
            for (int mi = 0; mi < 2; ++mi) {
                MMA_UNROLL
                for (int ni = 0; ni < 2; ++ni) {
                    MMA_F16(acc[2 * mi][2 * ni], acc[2 * mi][2 * ni + 1], acc[2 * mi + 1][2 * ni],
                             acc[2 * mi + 1][2 * ni + 1], mma_af[mi][0], mma_af[mi][1], mma_af[mi][2], mma_af[mi][3], mma_af[mi][4], mma_af[mi][5], mma_af[mi][6], mma_af[mi][7], mma_bf[ni][0], mma_bf[ni][1], mma_bf[ni][2], mma_bf[ni][3]);
                }
            }
        }
        BARRIER();
    }
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int m = m0 + mma_wm0 + (i / 2) * 16 + (i % 2) * 8 + mma_g;
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int n = n0 + mma_wn0 + (j / 2) * 8 + 2 * mma_t + (j % 2);
            if (m < 128 && n < 768) {
                C[m * 768 + n] = acc[i][j];
            }
        }
    }
}

KERNEL void g_tc64x64x32_w2x4_fp16(GPTR const float* A, GPTR const float* B, GPTR float* C) {
    SHARED float smem[4608 + 8 * MMA_EMU_FLOATS_K16];
    g_tc64x64x32_w2x4_fp16_task(A, B, C, BLOCK_ID, THREAD_ID, smem);
}

DEVICE void g_tc32x64x32_w2x4_fp16_task(GPTR const float* A, GPTR const float* B, GPTR float* C, const int task, const int tid, LPTR float* smem) {
    LPTR float* As = smem;
    LPTR float* Bs = smem + 1280;
    const int mma_lane = tid % 32, mma_warp = tid / 32;
    LPTR float* mma_scr = smem + 3584 + mma_warp * MMA_EMU_FLOATS_K16;  /* OpenCL's emulation */
    (void)mma_scr;
    const int bt = task / 48;
    const int tile = task % 48;
    const int m0 = (tile / 12) * 32;
    const int n0 = (tile % 12) * 64;
    const int mma_wm0 = (mma_warp / 4) * 16, mma_wn0 = (mma_warp % 4) * 16;
    const int mma_g = mma_lane / 4, mma_t = mma_lane % 4;
    float acc[2][4];
    #pragma unroll
    for (int i = 0; i < 2; ++i) {
        #pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    }
    float ra[4], rb[8];
    #pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int l = tid + r * 256;
        const int xx = l / 32, kk = l % 32;
        const int m = m0 + xx, k = 0 + kk;
        float val = 0.0f;
        if (m < 128 && k < 768) {
            val = A[m * 768 + k];
        }
        ra[r] = val;
    }
    #pragma unroll
    for (int r = 0; r < 8; ++r) {
        const int l = tid + r * 256;
        const int xx = l / 32, kk = l % 32;
        const int k = 0 + kk, n = n0 + xx;
        float val = 0.0f;
        if (k < 768 && n < 768) {
            val = B[n * 768 + k];
        }
        rb[r] = val;
    }
    for (int k0 = 0; k0 < 768; k0 += 32) {
        #pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int l = tid + r * 256;
            const int xx = l / 32, kk = l % 32;
            As[(xx) * 36 + (kk)] = TO_F16(ra[r]);
        }
        #pragma unroll
        for (int r = 0; r < 8; ++r) {
            const int l = tid + r * 256;
            const int xx = l / 32, kk = l % 32;
            Bs[(xx) * 36 + (kk)] = TO_F16(rb[r]);
        }
        BARRIER();
        if (k0 + 32 < 768) {
            #pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int l = tid + r * 256;
                const int xx = l / 32, kk = l % 32;
                const int m = m0 + xx, k = (k0 + 32) + kk;
                float val = 0.0f;
                if (m < 128 && k < 768) {
                    val = A[m * 768 + k];
                }
                ra[r] = val;
            }
            #pragma unroll
            for (int r = 0; r < 8; ++r) {
                const int l = tid + r * 256;
                const int xx = l / 32, kk = l % 32;
                const int k = (k0 + 32) + kk, n = n0 + xx;
                float val = 0.0f;
                if (k < 768 && n < 768) {
                    val = B[n * 768 + k];
                }
                rb[r] = val;
            }
        }
        MMA_UNROLL
        for (int kk = 0; kk < 32; kk += 16) {
            float mma_af[1][8], mma_bf[2][4];
            #pragma unroll
            for (int mi = 0; mi < 1; ++mi) {
                mma_af[mi][0] = As[(mma_wm0 + mi * 16 + mma_g + 0) * 36 + (kk + 2 * mma_t + 0)];
                mma_af[mi][1] = As[(mma_wm0 + mi * 16 + mma_g + 0) * 36 + (kk + 2 * mma_t + 1)];
                mma_af[mi][2] = As[(mma_wm0 + mi * 16 + mma_g + 8) * 36 + (kk + 2 * mma_t + 0)];
                mma_af[mi][3] = As[(mma_wm0 + mi * 16 + mma_g + 8) * 36 + (kk + 2 * mma_t + 1)];
                mma_af[mi][4] = As[(mma_wm0 + mi * 16 + mma_g + 0) * 36 + (kk + 2 * mma_t + 8)];
                mma_af[mi][5] = As[(mma_wm0 + mi * 16 + mma_g + 0) * 36 + (kk + 2 * mma_t + 9)];
                mma_af[mi][6] = As[(mma_wm0 + mi * 16 + mma_g + 8) * 36 + (kk + 2 * mma_t + 8)];
                mma_af[mi][7] = As[(mma_wm0 + mi * 16 + mma_g + 8) * 36 + (kk + 2 * mma_t + 9)];
            }
            #pragma unroll
            for (int ni = 0; ni < 2; ++ni) {
                mma_bf[ni][0] = Bs[(mma_wn0 + ni * 8 + mma_g) * 36 + (kk + 2 * mma_t + 0)];
                mma_bf[ni][1] = Bs[(mma_wn0 + ni * 8 + mma_g) * 36 + (kk + 2 * mma_t + 1)];
                mma_bf[ni][2] = Bs[(mma_wn0 + ni * 8 + mma_g) * 36 + (kk + 2 * mma_t + 8)];
                mma_bf[ni][3] = Bs[(mma_wn0 + ni * 8 + mma_g) * 36 + (kk + 2 * mma_t + 9)];
            }
            MMA_UNROLL
            for (int mi = 0; mi < 1; ++mi) {
                MMA_UNROLL
                for (int ni = 0; ni < 2; ++ni) {
                    MMA_F16(acc[2 * mi][2 * ni], acc[2 * mi][2 * ni + 1], acc[2 * mi + 1][2 * ni],
                             acc[2 * mi + 1][2 * ni + 1], mma_af[mi][0], mma_af[mi][1], mma_af[mi][2], mma_af[mi][3], mma_af[mi][4], mma_af[mi][5], mma_af[mi][6], mma_af[mi][7], mma_bf[ni][0], mma_bf[ni][1], mma_bf[ni][2], mma_bf[ni][3]);
                }
            }
        }
        BARRIER();
    }
    #pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int m = m0 + mma_wm0 + (i / 2) * 16 + (i % 2) * 8 + mma_g;
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int n = n0 + mma_wn0 + (j / 2) * 8 + 2 * mma_t + (j % 2);
            if (m < 128 && n < 768) {
                C[m * 768 + n] = acc[i][j];
            }
        }
    }
}

KERNEL void g_tc32x64x32_w2x4_fp16(GPTR const float* A, GPTR const float* B, GPTR float* C) {
    SHARED float smem[3584 + 8 * MMA_EMU_FLOATS_K16];
    g_tc32x64x32_w2x4_fp16_task(A, B, C, BLOCK_ID, THREAD_ID, smem);
}

DEVICE void g_tc32x64x64_w2x4_fp16_task(GPTR const float* A, GPTR const float* B, GPTR float* C, const int task, const int tid, LPTR float* smem) {
    LPTR float* As = smem;
    LPTR float* Bs = smem + 2560;
    const int mma_lane = tid % 32, mma_warp = tid / 32;
    LPTR float* mma_scr = smem + 7168 + mma_warp * MMA_EMU_FLOATS_K16;  /* OpenCL's emulation */
    (void)mma_scr;
    const int bt = task / 48;
    const int tile = task % 48;
    const int m0 = (tile / 12) * 32;
    const int n0 = (tile % 12) * 64;
    const int mma_wm0 = (mma_warp / 4) * 16, mma_wn0 = (mma_warp % 4) * 16;
    const int mma_g = mma_lane / 4, mma_t = mma_lane % 4;
    float acc[2][4];
    #pragma unroll
    for (int i = 0; i < 2; ++i) {
        #pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    }
    float ra[8], rb[16];
    #pragma unroll
    for (int r = 0; r < 8; ++r) {
        const int l = tid + r * 256;
        const int xx = l / 64, kk = l % 64;
        const int m = m0 + xx, k = 0 + kk;
        float val = 0.0f;
        if (m < 128 && k < 768) {
            val = A[m * 768 + k];
        }
        ra[r] = val;
    }
    #pragma unroll
    for (int r = 0; r < 16; ++r) {
        const int l = tid + r * 256;
        const int xx = l / 64, kk = l % 64;
        const int k = 0 + kk, n = n0 + xx;
        float val = 0.0f;
        if (k < 768 && n < 768) {
            val = B[n * 768 + k];
        }
        rb[r] = val;
    }
    for (int k0 = 0; k0 < 768; k0 += 64) {
        #pragma unroll
        for (int r = 0; r < 8; ++r) {
            const int l = tid + r * 256;
            const int xx = l / 64, kk = l % 64;
            As[(xx) * 68 + (kk)] = TO_F16(ra[r]);
        }
        #pragma unroll
        for (int r = 0; r < 16; ++r) {
            const int l = tid + r * 256;
            const int xx = l / 64, kk = l % 64;
            Bs[(xx) * 68 + (kk)] = TO_F16(rb[r]);
        }
        BARRIER();
        if (k0 + 64 < 768) {
            #pragma unroll
            for (int r = 0; r < 8; ++r) {
                const int l = tid + r * 256;
                const int xx = l / 64, kk = l % 64;
                const int m = m0 + xx, k = (k0 + 64) + kk;
                float val = 0.0f;
                if (m < 128 && k < 768) {
                    val = A[m * 768 + k];
                }
                ra[r] = val;
            }
            #pragma unroll
            for (int r = 0; r < 16; ++r) {
                const int l = tid + r * 256;
                const int xx = l / 64, kk = l % 64;
                const int k = (k0 + 64) + kk, n = n0 + xx;
                float val = 0.0f;
                if (k < 768 && n < 768) {
                    val = B[n * 768 + k];
                }
                rb[r] = val;
            }
        }
        MMA_UNROLL
        for (int kk = 0; kk < 64; kk += 16) {
            float mma_af[1][8], mma_bf[2][4];
            #pragma unroll
            for (int mi = 0; mi < 1; ++mi) {
                mma_af[mi][0] = As[(mma_wm0 + mi * 16 + mma_g + 0) * 68 + (kk + 2 * mma_t + 0)];
                mma_af[mi][1] = As[(mma_wm0 + mi * 16 + mma_g + 0) * 68 + (kk + 2 * mma_t + 1)];
                mma_af[mi][2] = As[(mma_wm0 + mi * 16 + mma_g + 8) * 68 + (kk + 2 * mma_t + 0)];
                mma_af[mi][3] = As[(mma_wm0 + mi * 16 + mma_g + 8) * 68 + (kk + 2 * mma_t + 1)];
                mma_af[mi][4] = As[(mma_wm0 + mi * 16 + mma_g + 0) * 68 + (kk + 2 * mma_t + 8)];
                mma_af[mi][5] = As[(mma_wm0 + mi * 16 + mma_g + 0) * 68 + (kk + 2 * mma_t + 9)];
                mma_af[mi][6] = As[(mma_wm0 + mi * 16 + mma_g + 8) * 68 + (kk + 2 * mma_t + 8)];
                mma_af[mi][7] = As[(mma_wm0 + mi * 16 + mma_g + 8) * 68 + (kk + 2 * mma_t + 9)];
            }
            #pragma unroll
            for (int ni = 0; ni < 2; ++ni) {
                mma_bf[ni][0] = Bs[(mma_wn0 + ni * 8 + mma_g) * 68 + (kk + 2 * mma_t + 0)];
                mma_bf[ni][1] = Bs[(mma_wn0 + ni * 8 + mma_g) * 68 + (kk + 2 * mma_t + 1)];
                mma_bf[ni][2] = Bs[(mma_wn0 + ni * 8 + mma_g) * 68 + (kk + 2 * mma_t + 8)];
                mma_bf[ni][3] = Bs[(mma_wn0 + ni * 8 + mma_g) * 68 + (kk + 2 * mma_t + 9)];
            }
            MMA_UNROLL
            for (int mi = 0; mi < 1; ++mi) {
                MMA_UNROLL
                for (int ni = 0; ni < 2; ++ni) {
                    MMA_F16(acc[2 * mi][2 * ni], acc[2 * mi][2 * ni + 1], acc[2 * mi + 1][2 * ni],
                             acc[2 * mi + 1][2 * ni + 1], mma_af[mi][0], mma_af[mi][1], mma_af[mi][2], mma_af[mi][3], mma_af[mi][4], mma_af[mi][5], mma_af[mi][6], mma_af[mi][7], mma_bf[ni][0], mma_bf[ni][1], mma_bf[ni][2], mma_bf[ni][3]);
                }
            }
        }
        BARRIER();
    }
    #pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int m = m0 + mma_wm0 + (i / 2) * 16 + (i % 2) * 8 + mma_g;
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int n = n0 + mma_wn0 + (j / 2) * 8 + 2 * mma_t + (j % 2);
            if (m < 128 && n < 768) {
                C[m * 768 + n] = acc[i][j];
            }
        }
    }
}

KERNEL void g_tc32x64x64_w2x4_fp16(GPTR const float* A, GPTR const float* B, GPTR float* C) {
    SHARED float smem[7168 + 8 * MMA_EMU_FLOATS_K16];
    g_tc32x64x64_w2x4_fp16_task(A, B, C, BLOCK_ID, THREAD_ID, smem);
}

DEVICE void g_tc16x64x64_w1x8_fp16_task(GPTR const float* A, GPTR const float* B, GPTR float* C, const int task, const int tid, LPTR float* smem) {
    LPTR float* As = smem;
    LPTR float* Bs = smem + 1536;
    const int mma_lane = tid % 32, mma_warp = tid / 32;
    LPTR float* mma_scr = smem + 6144 + mma_warp * MMA_EMU_FLOATS_K16;  /* OpenCL's emulation */
    (void)mma_scr;
    const int bt = task / 96;
    const int tile = task % 96;
    const int m0 = (tile / 12) * 16;
    const int n0 = (tile % 12) * 64;
    const int mma_wm0 = (mma_warp / 8) * 16, mma_wn0 = (mma_warp % 8) * 8;
    const int mma_g = mma_lane / 4, mma_t = mma_lane % 4;
    float acc[2][2];
    #pragma unroll
    for (int i = 0; i < 2; ++i) {
        #pragma unroll
        for (int j = 0; j < 2; ++j) acc[i][j] = 0.0f;
    }
    float ra[4], rb[16];
    #pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int l = tid + r * 256;
        const int xx = l / 64, kk = l % 64;
        const int m = m0 + xx, k = 0 + kk;
        float val = 0.0f;
        if (m < 128 && k < 768) {
            val = A[m * 768 + k];
        }
        ra[r] = val;
    }
    #pragma unroll
    for (int r = 0; r < 16; ++r) {
        const int l = tid + r * 256;
        const int xx = l / 64, kk = l % 64;
        const int k = 0 + kk, n = n0 + xx;
        float val = 0.0f;
        if (k < 768 && n < 768) {
            val = B[n * 768 + k];
        }
        rb[r] = val;
    }
    for (int k0 = 0; k0 < 768; k0 += 64) {
        #pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int l = tid + r * 256;
            const int xx = l / 64, kk = l % 64;
            As[(xx) * 68 + (kk)] = TO_F16(ra[r]);
        }
        #pragma unroll
        for (int r = 0; r < 16; ++r) {
            const int l = tid + r * 256;
            const int xx = l / 64, kk = l % 64;
            Bs[(xx) * 68 + (kk)] = TO_F16(rb[r]);
        }
        BARRIER();
        if (k0 + 64 < 768) {
            #pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int l = tid + r * 256;
                const int xx = l / 64, kk = l % 64;
                const int m = m0 + xx, k = (k0 + 64) + kk;
                float val = 0.0f;
                if (m < 128 && k < 768) {
                    val = A[m * 768 + k];
                }
                ra[r] = val;
            }
            #pragma unroll
            for (int r = 0; r < 16; ++r) {
                const int l = tid + r * 256;
                const int xx = l / 64, kk = l % 64;
                const int k = (k0 + 64) + kk, n = n0 + xx;
                float val = 0.0f;
                if (k < 768 && n < 768) {
                    val = B[n * 768 + k];
                }
                rb[r] = val;
            }
        }
        MMA_UNROLL
        for (int kk = 0; kk < 64; kk += 16) {
            float mma_af[1][8], mma_bf[1][4];
            #pragma unroll
            for (int mi = 0; mi < 1; ++mi) {
                mma_af[mi][0] = As[(mma_wm0 + mi * 16 + mma_g + 0) * 68 + (kk + 2 * mma_t + 0)];
                mma_af[mi][1] = As[(mma_wm0 + mi * 16 + mma_g + 0) * 68 + (kk + 2 * mma_t + 1)];
                mma_af[mi][2] = As[(mma_wm0 + mi * 16 + mma_g + 8) * 68 + (kk + 2 * mma_t + 0)];
                mma_af[mi][3] = As[(mma_wm0 + mi * 16 + mma_g + 8) * 68 + (kk + 2 * mma_t + 1)];
                mma_af[mi][4] = As[(mma_wm0 + mi * 16 + mma_g + 0) * 68 + (kk + 2 * mma_t + 8)];
                mma_af[mi][5] = As[(mma_wm0 + mi * 16 + mma_g + 0) * 68 + (kk + 2 * mma_t + 9)];
                mma_af[mi][6] = As[(mma_wm0 + mi * 16 + mma_g + 8) * 68 + (kk + 2 * mma_t + 8)];
                mma_af[mi][7] = As[(mma_wm0 + mi * 16 + mma_g + 8) * 68 + (kk + 2 * mma_t + 9)];
            }
            #pragma unroll
            for (int ni = 0; ni < 1; ++ni) {
                mma_bf[ni][0] = Bs[(mma_wn0 + ni * 8 + mma_g) * 68 + (kk + 2 * mma_t + 0)];
                mma_bf[ni][1] = Bs[(mma_wn0 + ni * 8 + mma_g) * 68 + (kk + 2 * mma_t + 1)];
                mma_bf[ni][2] = Bs[(mma_wn0 + ni * 8 + mma_g) * 68 + (kk + 2 * mma_t + 8)];
                mma_bf[ni][3] = Bs[(mma_wn0 + ni * 8 + mma_g) * 68 + (kk + 2 * mma_t + 9)];
            }
            MMA_UNROLL
            for (int mi = 0; mi < 1; ++mi) {
                MMA_UNROLL
                for (int ni = 0; ni < 1; ++ni) {
                    MMA_F16(acc[2 * mi][2 * ni], acc[2 * mi][2 * ni + 1], acc[2 * mi + 1][2 * ni],
                             acc[2 * mi + 1][2 * ni + 1], mma_af[mi][0], mma_af[mi][1], mma_af[mi][2], mma_af[mi][3], mma_af[mi][4], mma_af[mi][5], mma_af[mi][6], mma_af[mi][7], mma_bf[ni][0], mma_bf[ni][1], mma_bf[ni][2], mma_bf[ni][3]);
                }
            }
        }
        BARRIER();
    }
    #pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int m = m0 + mma_wm0 + (i / 2) * 16 + (i % 2) * 8 + mma_g;
        #pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int n = n0 + mma_wn0 + (j / 2) * 8 + 2 * mma_t + (j % 2);
            if (m < 128 && n < 768) {
                C[m * 768 + n] = acc[i][j];
            }
        }
    }
}

KERNEL void g_tc16x64x64_w1x8_fp16(GPTR const float* A, GPTR const float* B, GPTR float* C) {
    SHARED float smem[6144 + 8 * MMA_EMU_FLOATS_K16];
    g_tc16x64x64_w1x8_fp16_task(A, B, C, BLOCK_ID, THREAD_ID, smem);
}
