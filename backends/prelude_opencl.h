/* dlcc portable kernel dialect -> OpenCL C 1.2 (see prelude_cuda.h for why there are two). */
#define KERNEL __kernel
#define DEVICE static inline
#define SITE_FN static inline  /* PoCL inlines everything that holds a barrier anyway */
#define GPTR __global
#define LPTR __local
#define SHARED __local
#define THREAD_ID ((int)get_local_id(0))
#define BLOCK_ID ((int)get_group_id(0))
#define BLOCK_DIM ((int)get_local_size(0))
#define GRID_DIM ((int)get_num_groups(0))
#define BARRIER() barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE)
#define FENCE() mem_fence(CLK_GLOBAL_MEM_FENCE)
#define LAUNCH_BOUNDS(n) __attribute__((reqd_work_group_size(n, 1, 1)))
#define ATOMIC_LOAD_I32(p) (*(volatile __global int*)(p))
#define ATOMIC_STORE_I32(p, v) (*(volatile __global int*)(p) = (v))
#define ATOMIC_ADD_I32(p, v) atomic_add((volatile __global int*)(p), (v))
typedef long i64;
typedef uchar u8;
typedef char i8;
#define DLCC_INF INFINITY
#define DLCC_NAN NAN
#define F_EXP exp
#define F_LOG log
#define F_SQRT sqrt
#define F_RSQRT rsqrt
#define F_POW pow
#define F_TANH tanh
#define F_ERF erf
#define F_FABS fabs
#define F_FLOOR floor
#define F_CEIL ceil
#define F_RINT rint
#define F_MIN fmin
#define F_MAX fmax
#define F_SIN sin
#define F_COS cos
#define F_FMOD fmod
#define F_ISNAN(x) isnan(x)
#define F_ISINF(x) isinf(x)
typedef half f16;  /* pointers to half need no cl_khr_fp16; vload/vstore_half convert */
#define LOAD_F16(p, i) vload_half((i), (p))
#define STORE_F16(p, i, v) vstore_half_rte((v), (i), (p))
