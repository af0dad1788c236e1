"""Classify GPU kernels by name: gemm, reduction, elementwise, comm or other.

Profiler traces name kernels, not operators, so Daydream-style what-ifs ("AMP: compute-bound
kernels /3, the rest /2") and the cost model's calibration need a kernel's class from its name
alone. The rules below come from the distinct kernel names in the 11 real Kineto traces in
the project's profiler traces (cuDNN, cuBLAS/cuBLASLt, CUTLASS, PyTorch ATen, NCCL and flash-attention
kernels on V100, RTX 2080 Ti, A100 and H100); each rule says which names it exists for.

Matching is on a *signature*: the name, lower-cased, with "(anonymous namespace)" removed and the
function parameter list cut off (the first "(" outside template brackets). The parameter list
is dropped because argument types mislead: cuDNN batch-norm kernels take a
`cudnn::reduced_divisor`, FFT convolutions take `cudnn::reduced_divisor`, and almost every ATen
kernel takes a `TensorIterator`. Template arguments are kept because they carry the functor
(`vectorized_elementwise_kernel<4, ...GeluCUDAKernelImpl...>`, `cutlass::Kernel2<cutlass_80_
tensorop_bf16_s16816gemm...>`). Mangled names (`_ZN19cutlass_cudnn_train6Kernel...`) have no
parentheses and are matched whole.

Rules are tried in this order (first match wins):

1. comm: `nccl` (ncclKernel_AllReduce_RING_LL_Sum_float, ncclDevKernel_*, ...), and generic
   all_reduce/all_gather/reduce_scatter/broadcast-collective names. First, because NCCL names
   contain `Sum`, which would otherwise look like a reduction.
2. Helper kernels that belong to a GEMM/convolution library but are not the matrix product:
   - reduction: cuBLAS/cuBLASLt `splitKreduce_kernel`, CUTLASS `ReduceSplitK`, cuDNN
     `reduce_wgrad_nchw_helper` -- they sum split-K partial products: memory-bound reductions.
   - elementwise: cuDNN layout transposes `nchwToNhwcKernel` / `nhwcToNchwKernel`,
     `scalePackedTensor_kernel`, `im2col4d_kernel`, cuBLASLt `epilogue::impl::globalKernel`
     (bias/activation epilogue) -- streaming, memory-bound.
   - other: cuDNN/CASK `computeOffsetsKernel`, `computeBOffsetsKernel`, `computeWgrad*OffsetsKernel`
     -- tiny index-table setup kernels with no meaningful FLOPs or bytes.
   These come before the gemm rule because their names contain cudnn/cutlass/cublas too.
3. gemm (tensor-core or SIMT matrix products, convolutions, fused attention):
   `gemm` (volta_sgemm_*, ampere_sgemm_*, cutlass_80_tensorop_s1688gemm, sm90_xmma_gemm_*,
   gcgemm), `conv` (implicit_convolve_sgemm, explicit_convolve_sgemm, ImplicitGemmConvolution),
   `scudnn` (volta_scudnn_128x64_relu_*, cudnn_*_scudnn_*), `xmma`, `cutlass` (remaining CUTLASS
   kernels: Kernel/Kernel2<...gemm...>, cutlass_tensorop_*fprop/dgrad/wgrad), `wgrad`, `dgrad`,
   `fprop` (cuDNN wgrad_alg0_engine, dgrad_engine, sm80_xmma_fprop_*), `winograd` (cuDNN Winograd
   convolution incl. its data/filter/output transforms, which run only as part of a convolution),
   `fft2d_` (FFT convolution), `nvjet` (cuBLAS's Hopper JIT GEMMs), `flash`/`fmha`/`attention`
   (flash_fwd_kernel, fused multi-head attention), a leading `sm80_`/`sm90_`/`sm100_` (cuBLAS and
   cuDNN tensor-core kernels that are named after the architecture), `hmma`/`s16816`/`s1688`
   (tensor-core instruction shapes in CUTLASS names).
4. reduction (each output combines many inputs; memory-bound, with a cross-thread combine):
   `softmax` (softmax_warp_forward/backward, also log_softmax), `layer_norm`/`layernorm`/
   `rms_norm`/`rmsnorm`/`group_norm`/`groupnorm`, training batch norm (cuDNN `bn_fw_tr_`,
   `bn_bw_`, ATen `batch_norm_collect_statistics`, `batch_norm_backward_reduce`), `reduce`
   (at::native::reduce_kernel<...sum_functor/MeanOps/and_kernel...>), `nll_loss`,
   `classnllcriterion`, `cross_entropy`, `argmax`/`argmin`, `topk`, `cumsum`/`scan`,
   `norm_kernel`, and `sum_functor`/`meanops` wherever they appear.
   Inference batch norm (`bn_fw_inf`, `batch_norm_transform`, `batch_norm_elemt`) is a per-channel
   affine map and is elementwise, as in dlcc (BatchNormalization is an ELEMENTWISE op).
5. elementwise (one output per input element or a plain copy; memory-bound streaming):
   `elementwise` (vectorized_/unrolled_elementwise_kernel, elementwise_kernel,
   elementwise_kernel_with_index, distribution_elementwise_grid_stride_kernel), `multi_tensor_apply`
   (optimizer updates), `catarray` (torch.cat), `index` (indexSelectLargeIndex, index_elementwise),
   `copy`, `fill`, `dropout`, `gelu`/`relu`/`silu`/`sigmoid`/`tanh`, `transpose`, `gather`/
   `scatter`, `embedding`, `where`, `clamp`, `cast`, `convert` (dtype conversions).
   Pooling (`max_pool_forward_nchw`, `max_pool_backward_nchw`, `avg_pool`, `adaptive_average_pool`,
   `adaptive_max_pool`) is also classed elementwise: PyTorch's kernels assign one thread per output
   and read a small window, so they stream memory like an elementwise kernel with no cross-thread
   combine (dlcc classes MaxPool/AveragePool as LAYOUT, also memory-bound). Global pooling in
   PyTorch runs as reduce_kernel<MeanOps> and is a reduction by rule 4.
6. other: everything else (including memcpy/memset records if passed by name).
"""
from __future__ import annotations

import re

CLASSES = ("gemm", "reduction", "elementwise", "comm", "other")

_COMM = re.compile(r"nccl|all_?reduce|all_?gather|reduce_?scatter|alltoall|all_to_all|sendrecv")

_HELPER_REDUCTION = re.compile(r"splitkreduce|reducesplitk|reduce_wgrad")
_HELPER_ELEMENTWISE = re.compile(
    r"nchwtonhwc|nhwctonchw|scalepackedtensor|im2col|epilogue::impl::globalkernel")
_HELPER_OTHER = re.compile(r"compute\w*offsetskernel")

_GEMM = re.compile(
    r"gemm|conv(?!ert)|scudnn|xmma|cutlass|wgrad|dgrad|fprop|winograd|fft2d_|nvjet|flash|fmha|attention"
    r"|hmma|s16816|s1688|^(?:void )?sm\d{2,3}_")

_INFER_BN = re.compile(r"bn_fw_inf|batch_norm_transform|batch_norm_elemt")
_REDUCTION = re.compile(
    r"softmax|layer_?norm|rms_?norm|group_?norm|bn_fw_tr|bn_bw|batch_norm_collect|batch_norm_backward"
    r"|reduce|nll_?loss|classnllcriterion|cross_?entropy|arg_?max|arg_?min|topk|cumsum|\bscan|norm_kernel"
    r"|sum_functor|meanops")

_ELEMENTWISE = re.compile(
    r"elementwise|multi_tensor_apply|catarray|index|copy|fill|dropout|gelu|relu|silu|sigmoid|tanh"
    r"|transpose|gather|scatter|embedding|where|clamp|cast|convert|pool")

_HALF = re.compile(r"bf16|f16|fp16|h1688|h16816|hmma|half|bfloat16|__nv_bfloat16|float16")

_MEMORY_BOUND = frozenset({"elementwise", "reduction"})


def signature(name: str) -> str:
    """Lower-cased name without "(anonymous namespace)" and without the function parameter list."""
    s = name.replace("(anonymous namespace)", "")
    depth = 0
    for i, ch in enumerate(s):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0:
            s = s[:i]
            break
    return s.strip().lower()


def classify_kernel(name: str) -> str:
    """One of CLASSES for a GPU kernel name (demangled or mangled); see the module docstring."""
    sig = signature(name or "")
    if not sig:
        return "other"
    if _COMM.search(sig):
        return "comm"
    if _HELPER_REDUCTION.search(sig):
        return "reduction"
    if _HELPER_ELEMENTWISE.search(sig):
        return "elementwise"
    if _HELPER_OTHER.search(sig):
        return "other"
    if _GEMM.search(sig):
        return "gemm"
    if _INFER_BN.search(sig):
        return "elementwise"
    if _REDUCTION.search(sig):
        return "reduction"
    if _ELEMENTWISE.search(sig):
        return "elementwise"
    return "other"


def is_half_precision(name: str) -> bool:
    """True when the name says the kernel computes in fp16/bf16 (bf16, f16, h1688, hmma, half,
    c10::BFloat16, __nv_bfloat16, ...). Unlike classification this looks at the whole name,
    parameter types included, because ATen kernels carry their dtype only there or in the
    template arguments."""
    return bool(_HALF.search((name or "").lower()))


def is_memory_bound_class(cls: str) -> bool:
    """Elementwise and reduction kernels are bound by DRAM bandwidth; gemm is compute-bound, and
    comm/other are neither (treated as not memory-bound)."""
    return cls in _MEMORY_BOUND
