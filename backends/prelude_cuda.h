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
/* 16-byte aligned: cp.async and ldmatrix (kernels/gemm_mma_async.py) address 16-byte chunks. */
#define SHARED __shared__ __align__(16)
/* More than 48 KiB a block (kernels/gemm_mma.py DEEP_TILINGS): dynamic shared memory, sized at the
 * launch; the runtime opts the kernel in first (CudaRuntime.set_dynamic_smem). */
#define DYNAMIC_SHARED(type, name, n) extern __shared__ __align__(16) type name[]
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
/* A persistent kernel that counts on b resident blocks per SM (passes/rammer.py blocks_per_sm):
 * ptxas caps its registers so that b blocks fit (65536 / (n * b) a thread); spills are reported
 * (compiler.kernel_spills). */
#define LAUNCH_BOUNDS_SM(n, b) __launch_bounds__(n, b)
#define ATOMIC_LOAD_I32(p) (*(volatile int*)(p))
#define ATOMIC_STORE_I32(p, v) (*(volatile int*)(p) = (v))
#define ATOMIC_ADD_I32(p, v) atomicAdd((int*)(p), (v))
#define ATOMIC_CAS_I32(p, cmp, v) atomicCAS((int*)(p), (cmp), (v))
#define ATOMIC_MAX_I32(p, v) atomicMax((int*)(p), (v))
/* A float another block wrote (split-K's partial sums, kernels/splitk.py): read from L2, past this
 * SM's L1, which may still hold the bytes an earlier GEMM left at the same workspace address. */
#define LOAD_CG(p) __ldcg(p)
typedef long long i64;
typedef unsigned char u8;
typedef signed char i8;
typedef short i16;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
#define DLCC_INF __int_as_float(0x7f800000)
#define DLCC_NAN __int_as_float(0x7fffffff)
#define F_EXP expf
#define F_LOG logf
#define F_SQRT sqrtf
#define F_RSQRT rsqrtf
#define F_POW powf
#define F_TANH_RAW tanhf
#define F_TANH dlcc_tanh  /* prelude_common.h: exactly +-1 where tanh rounds to it */
#define F_ERF erff
#define F_FABS fabsf
#define F_FLOOR floorf
#define F_CEIL ceilf
#define F_RINT rintf
#define F_MIN fminf
#define F_MAX fmaxf
#define F_SIN sinf
#define F_COS cosf
#define F_TAN tanf
#define F_ASIN asinf
#define F_ACOS acosf
#define F_ATAN atanf
#define F_SINH sinhf
#define F_COSH coshf
#define F_ASINH asinhf
#define F_ACOSH acoshf
#define F_ATANH atanhf
#define F_FMOD fmodf
#define F_ISNAN(x) isnan(x)
#define F_ISINF(x) isinf(x)
#define F_ISFINITE(x) isfinite(x)
/* A product never fused into an FMA with the sum it feeds (nvcc contracts a * b + c by default):
 * where a coordinate decides a branch (RoiAlign's samples inside or outside the map), it must be
 * the one onnxruntime's unfused C++ computes. */
#define F_MUL_RN(a, b) __fmul_rn((a), (b))
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
/* The fp16/bf16 pipeline (kernels/gemm_mma_async.py; sm_80 and newer): shared memory holds raw
 * 16-bit values (u16). CP_ASYNC16 copies 16 bytes global -> shared without the registers, zero-
 * filling where `valid` is 0 (src-size 0: nothing is read); COMMIT closes a group of copies and
 * WAIT(n) returns when at most n of this thread's groups are still in flight (PTX ISA "cp.async").
 * LDSM_X4/X2 are ldmatrix: lane l gives the address of row l % 8 of matrix l / 8 and receives,
 * of each matrix, row l / 4's elements 2(l % 4), 2(l % 4) + 1 packed low to high (_T: the
 * transposed matrix's). MMA_F16_P/MMA_BF16_P are the m16n8k16 mma on such packed registers. */
DEVICE void dlcc_cp_async16(void* dst, const void* src, int valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
#define CP_ASYNC_STATE  /* the hardware keeps the groups (OpenCL's emulation needs a queue) */
#define CP_ASYNC16(dst, src, valid) dlcc_cp_async16((dst), (src), (valid))
#define CP_ASYNC_COMMIT() asm volatile("cp.async.commit_group;\n" ::: "memory")
#define CP_ASYNC_WAIT(n) asm volatile("cp.async.wait_group %0;\n" :: "n"(n) : "memory")
#define DLCC_LDSM4(tr, r0, r1, r2, r3, base, off) \
    asm volatile("ldmatrix.sync.aligned.m8n8.x4" tr ".shared.b16 {%0,%1,%2,%3}, [%4];\n" \
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"((unsigned)__cvta_generic_to_shared((base) + (off))) : "memory")
#define DLCC_LDSM2(tr, r0, r1, base, off) \
    asm volatile("ldmatrix.sync.aligned.m8n8.x2" tr ".shared.b16 {%0,%1}, [%2];\n" \
                 : "=r"(r0), "=r"(r1) : "r"((unsigned)__cvta_generic_to_shared((base) + (off))) : "memory")
#define LDSM_X4(...) DLCC_LDSM4("", __VA_ARGS__)
#define LDSM_X4_T(...) DLCC_LDSM4(".trans", __VA_ARGS__)
#define LDSM_X2(...) DLCC_LDSM2("", __VA_ARGS__)
#define LDSM_X2_T(...) DLCC_LDSM2(".trans", __VA_ARGS__)
#define DLCC_MMA_P(type, d0, d1, d2, d3, a0, a1, a2, a3, b0, b1) \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." type "." type ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, " \
                 "{%8,%9}, {%0,%1,%2,%3};" : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) \
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))
#define MMA_F16_P(...) DLCC_MMA_P("f16", __VA_ARGS__)
#define MMA_BF16_P(...) DLCC_MMA_P("bf16", __VA_ARGS__)
/* The loops around MMA_TF32 unroll here (the accumulators must be registers); OpenCL keeps them. */
#define MMA_UNROLL _Pragma("unroll")
/* The SIMT GEMM's inner k loop unrolls in full (its a/b fragments stay registers); OpenCL: by 4. */
#define K_UNROLL _Pragma("unroll")
/* A tile copy through a stitched prologue unrolls in full here (its staging values stay
 * registers); OpenCL keeps it a loop. */
#define PROLOGUE_UNROLL _Pragma("unroll")
/* Four floats from shared memory in one 16-byte read (the vector SIMT GEMM; p 16-byte aligned). */
#define LOAD4_LOCAL(p) (*(const float4*)(p))
/* Hopper's warpgroup MMA (kernels/gemm_wgmma.py; sm_90a: backends/nvcc.py builds a module holding it
 * for that arch). A warpgroup (four warps) multiplies a 64 x N x 16 block out of shared memory,
 * each operand named by a 64-bit descriptor (start address, stride byte offset, swizzle), into
 * the accumulators acc[2][N / 4] of each thread: the D fragment is mma.m16n8's, warp w of the
 * group holding rows 16w..16w+15, so acc[i][j] is row g + 8i, column 8(j / 2) + 2t + (j % 2).
 * The wgmma is asynchronous: WGMMA_ARRIVE (wgmma.fence, after the accumulators were last
 * written), the wgmmas, WGMMA_COMMIT, WGMMA_WAIT(n) until at most n groups are in flight. The
 * empty asms on the accumulators (CUTLASS's warpgroup_fence_operand) keep the compiler from
 * moving their reads or writes across the wait or the fence. cp.async writes shared memory
 * through the generic proxy and wgmma reads it through the async one: WGMMA_PROXY_FENCE
 * (fence.proxy.async) makes the writes visible before the barrier that publishes them. */
typedef unsigned long long wg_desc_t;
#define WG_SMEM_ADDR(p) ((unsigned)__cvta_generic_to_shared(p))
#define WGMMA_STATE  /* the hardware keeps the groups (OpenCL's emulation needs a queue) */
#define WGMMA_PROXY_FENCE() asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory")
#define WGMMA_COMMIT() asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory")
#define DLCC_WG_D1(acc, j) "+f"(acc[0][2 * (j)]), "+f"(acc[0][2 * (j) + 1]), "+f"(acc[1][2 * (j)]), "+f"(acc[1][2 * (j) + 1])
#define DLCC_WG_D2(acc, j) DLCC_WG_D1(acc, j), DLCC_WG_D1(acc, (j) + 1)
#define DLCC_WG_D4(acc, j) DLCC_WG_D2(acc, j), DLCC_WG_D2(acc, (j) + 2)
#define DLCC_WG_D8(acc, j) DLCC_WG_D4(acc, j), DLCC_WG_D4(acc, (j) + 4)
#define DLCC_WG_D16(acc, j) DLCC_WG_D8(acc, j), DLCC_WG_D8(acc, (j) + 8)
#define DLCC_WG_R8 "%0,%1,%2,%3,%4,%5,%6,%7"
#define DLCC_WG_R16 DLCC_WG_R8 ",%8,%9,%10,%11,%12,%13,%14,%15"
#define DLCC_WG_R32 DLCC_WG_R16 ",%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
#define DLCC_WG_R64 DLCC_WG_R32 ",%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47" \
    ",%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
/* d (N/2 accumulators), A and B descriptors, scale-d 1 (accumulate), scale-a and -b 1, both K-major */
/* (The accumulator lists come last, as __VA_ARGS__: expanded, they are many arguments.) */
#define DLCC_WGMMA(n, ty, regs, ia, ib, da, db, ...) \
    asm volatile("wgmma.mma_async.sync.aligned.m64n" #n "k16.f32." ty "." ty " {" regs "}, " ia ", " ib ", 1, 1, 1, 0, 0;\n" \
                 : __VA_ARGS__ : "l"(da), "l"(db))
#define DLCC_WG_FENCE(...) asm volatile("" : __VA_ARGS__ :: "memory")
#define DLCC_WG_ARRIVE(...) do { DLCC_WG_FENCE(__VA_ARGS__); asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); } while (0)
#define DLCC_WG_WAIT(n, ...) do { asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(n) : "memory"); DLCC_WG_FENCE(__VA_ARGS__); } while (0)
#define WGMMA_BF16_N16(acc, da, db) DLCC_WGMMA(16, "bf16", DLCC_WG_R8, "%8", "%9", da, db, DLCC_WG_D2(acc, 0))
#define WGMMA_BF16_N32(acc, da, db) DLCC_WGMMA(32, "bf16", DLCC_WG_R16, "%16", "%17", da, db, DLCC_WG_D4(acc, 0))
#define WGMMA_BF16_N64(acc, da, db) DLCC_WGMMA(64, "bf16", DLCC_WG_R32, "%32", "%33", da, db, DLCC_WG_D8(acc, 0))
#define WGMMA_BF16_N128(acc, da, db) DLCC_WGMMA(128, "bf16", DLCC_WG_R64, "%64", "%65", da, db, DLCC_WG_D16(acc, 0))
#define WGMMA_F16_N16(acc, da, db) DLCC_WGMMA(16, "f16", DLCC_WG_R8, "%8", "%9", da, db, DLCC_WG_D2(acc, 0))
#define WGMMA_F16_N32(acc, da, db) DLCC_WGMMA(32, "f16", DLCC_WG_R16, "%16", "%17", da, db, DLCC_WG_D4(acc, 0))
#define WGMMA_F16_N64(acc, da, db) DLCC_WGMMA(64, "f16", DLCC_WG_R32, "%32", "%33", da, db, DLCC_WG_D8(acc, 0))
#define WGMMA_F16_N128(acc, da, db) DLCC_WGMMA(128, "f16", DLCC_WG_R64, "%64", "%65", da, db, DLCC_WG_D16(acc, 0))
#define WGMMA_ARRIVE_N16(acc) DLCC_WG_ARRIVE(DLCC_WG_D2(acc, 0))
#define WGMMA_ARRIVE_N32(acc) DLCC_WG_ARRIVE(DLCC_WG_D4(acc, 0))
#define WGMMA_ARRIVE_N64(acc) DLCC_WG_ARRIVE(DLCC_WG_D8(acc, 0))
#define WGMMA_ARRIVE_N128(acc) DLCC_WG_ARRIVE(DLCC_WG_D16(acc, 0))
#define WGMMA_WAIT_N16(n, acc) DLCC_WG_WAIT(n, DLCC_WG_D2(acc, 0))
#define WGMMA_WAIT_N32(n, acc) DLCC_WG_WAIT(n, DLCC_WG_D4(acc, 0))
#define WGMMA_WAIT_N64(n, acc) DLCC_WG_WAIT(n, DLCC_WG_D8(acc, 0))
#define WGMMA_WAIT_N128(n, acc) DLCC_WG_WAIT(n, DLCC_WG_D16(acc, 0))
