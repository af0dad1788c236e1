"""dlcc.estimate cost model, profile database and kernel classes (exact expectations)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlcc.config import DeviceSpec, load_device
from dlcc.errors import ConfigError
from dlcc.estimate.costmodel import (KernelTime, blocks_per_sm, launch_time, plan_kernel_times,
                                     roofline_us)
from dlcc.estimate.kernelclass import classify_kernel, is_half_precision, is_memory_bound_class
from dlcc.estimate.profiledb import ProfileDB

ROOT = Path(__file__).resolve().parent.parent


def dev(**kw) -> DeviceSpec:
    """10 SMs, 10 TFLOP/s fp32 (100 bf16), 1000 GB/s: 1e7 FLOP = 1 µs, 1e6 bytes = 1 µs."""
    base = dict(name="Test GPU", sms=10, max_threads_per_sm=2048, max_blocks_per_sm=32, registers_per_sm=65536,
                shared_mem_per_sm=100_000, shared_mem_per_block=100_000, dram_bandwidth_gbps=1000,
                peak_tflops={"float32": 10.0, "bfloat16": 100.0}, launch_overhead_us=5.0,
                kernel_fixed_us=0.0, dram_efficiency=1.0, compute_efficiency=1.0)
    base.update(kw)
    return DeviceSpec(**base)


# -- roofline -------------------------------------------------------------------------------------
def test_roofline_hand_numbers():
    d = dev()
    assert roofline_us(1e7, 0, "float32", d) == pytest.approx(1.0)
    assert roofline_us(0, 2e6, "float32", d) == pytest.approx(2.0)
    assert roofline_us(3e7, 2e6, "float32", d) == pytest.approx(3.0)  # compute-bound
    assert roofline_us(3e7, 2e6, "bf16", d) == pytest.approx(2.0)  # alias; memory-bound at 100 TF
    assert roofline_us(1e7, 0, "int64", d) == pytest.approx(1.0)  # no peak listed: float32's


def test_roofline_h100_numbers():
    h = load_device("h100")
    assert roofline_us(989.4e6, 0, "bfloat16", h) == pytest.approx(1.0)
    assert roofline_us(0, 3.35e6, "float32", h) == pytest.approx(1.0)


# -- occupancy and waves --------------------------------------------------------------------------
def test_blocks_per_sm_limits():
    d = dev()
    assert blocks_per_sm(d, 256) == 8  # 2048 threads / 256
    assert blocks_per_sm(d, 32) == 32  # block limit
    assert blocks_per_sm(d, 256, smem_bytes=30_000) == 3  # 100_000 // 30_000
    # 128 regs x 32 lanes = 4096 per warp, 8 warps -> 32768 per block -> 2 blocks in 65536
    assert blocks_per_sm(d, 256, registers=128) == 2
    assert blocks_per_sm(d, 1024, smem_bytes=200_000) == 1  # does not fit: still costed as 1


def _launch(grid, per_block_flops=0.0, per_block_bytes=0.0, block=256, **kw):
    return {"kernel": "k", "grid": grid, "block": block, "flops": per_block_flops * grid,
            "dram_bytes": per_block_bytes * grid, "category": "elementwise", **kw}


def test_wave_quantization_slots_plus_one_is_two_waves():
    d = dev()
    slots = d.sms * blocks_per_sm(d, 256)  # 80
    w = 1e6  # bytes per block: 1 µs at the full device rate
    one = launch_time(_launch(slots, per_block_bytes=w), None, d)
    two = launch_time(_launch(slots + 1, per_block_bytes=w), None, d)
    assert (one.waves, two.waves) == (1.0, 2.0)
    assert one.us == pytest.approx(80.0)
    assert two.us == pytest.approx(81.0)  # the extra block's share; no full second wave (see docstring)
    assert one.source == two.source == "roofline"


def test_idle_sms_quantization_and_fixed_cost():
    d = dev(kernel_fixed_us=2.0, gemm_fixed_us=5.0, dram_efficiency=0.5, compute_efficiency=0.25)
    # 1 block on a 10-SM GPU: only one SM works -> 10x the ideal time
    t = launch_time(_launch(1, per_block_bytes=1e6), None, d)
    assert t.memory_us == pytest.approx(1.0 / 0.5 * 10)
    assert t.us == pytest.approx(2.0 + 20.0)
    assert t.fixed_us == 2.0
    # a compute launch pays gemm_fixed_us and compute_efficiency
    g = launch_time(_launch(10, per_block_flops=1e6, category="compute"), {"name": "k", "kind": "gemm"}, d)
    assert g.compute_us == pytest.approx(1.0 / 0.25)
    assert g.us == pytest.approx(5.0 + 4.0)


def test_ptxas_resources_lower_occupancy():
    d = dev()
    L = _launch(17, per_block_bytes=1e5)
    assert launch_time(L, None, d).waves == 1.0  # 80 slots
    # 128 registers: 2 blocks per SM -> 20 slots; 255 registers + 40 KB smem: 1 per SM -> 10 slots
    assert launch_time(L, None, d, resources={"registers": 128}).waves == 1.0
    assert launch_time(L, {"smem_bytes": 40_000}, d, resources={"registers": 255}).waves == 2.0


def test_never_below_roofline():
    d = load_device("h100")
    for grid, fl, by in [(1, 1e3, 1e3), (132, 1e9, 1e6), (100_000, 1e6, 1e9), (7, 0, 0)]:
        L = {"kernel": "k", "grid": grid, "block": 128, "flops": fl, "dram_bytes": by, "category": "compute"}
        assert launch_time(L, None, d).us >= roofline_us(fl, by, "float32", d)


# -- profile database -----------------------------------------------------------------------------
def test_profiledb_hit_roundtrip(tmp_path):
    d = dev()
    db = ProfileDB()
    db.record(d.name, "Relu_abc", 16, 256, 3.0, count=2, where="bench")
    db.record(d.name, "Relu_abc", [16, 1, 1], [256], 6.0, count=1, where="bench")
    p = tmp_path / "prof.json"
    db.save(p)
    assert not list(tmp_path.glob("*.tmp"))
    db2 = ProfileDB.load(p)
    L = {"kernel": "Relu_abc", "grid": 16, "block": 256, "flops": 1, "dram_bytes": 1}
    t = launch_time(L, {"name": "Relu_abc", "block": 256}, d, db=db2)
    assert isinstance(t, KernelTime)
    assert t.us == pytest.approx(4.0)  # (3*2 + 6*1) / 3
    assert t.source == "profile:prof.json"
    miss = launch_time(dict(L, grid=17), None, d, db=db2)
    assert miss.source == "roofline"
    assert db2.lookup("Other GPU", L) is None
    assert json.loads(p.read_text())["entries"][0]["count"] == 3


@pytest.mark.parametrize("text,field", [
    ("{not json", "not valid JSON"),
    ('{"format": "something-else"}', "not a dlcc profile database"),
    ('{"format": "dlcc-profiledb", "version": 99, "entries": []}', "version"),
    ('{"format": "dlcc-profiledb", "version": 1, "entries": {}}', "entries: expected a list"),
    ('{"format": "dlcc-profiledb", "version": 1, "entries": [{"device": "x", "kernel": "k", '
     '"grid": [1], "block": [32], "us": -1}]}', "entries.0.us"),
    ('{"format": "dlcc-profiledb", "version": 1, "entries": [{"device": "x", "kernel": "k", '
     '"grid": [0], "block": [32], "us": 1}]}', "entries.0.grid"),
])
def test_profiledb_malformed_names_file(tmp_path, text, field):
    p = tmp_path / "bad-db.json"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        ProfileDB.load(p)
    assert str(p) in str(e.value) and field in str(e.value)


def test_profiledb_missing(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        ProfileDB.load(tmp_path / "none.json")
    assert len(ProfileDB.load(tmp_path / "none.json", missing_ok=True)) == 0


# -- kernel classes (names from the H100 profiler traces) ----------------------------------------------
KERNELS = [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas", "gemm", True),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x6_tn_align8>(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x6_tn_align8::Params)", "gemm", True),
    ("volta_sgemm_128x64_nn", "gemm", False),
    ("volta_scudnn_winograd_128x128_ldg1_ldg4_relu_tile148t_nt_v1", "gemm", False),
    ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize64x128x32_stage5_warpsize2x2x1_g1_tensor16x8x8_execute_kernel_cudnn_infer", "gemm", False),
    ("_ZN19cutlass_cudnn_train6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11threadblock22ImplicitGemmMultistageINS_4gemm9GemmShapeILi128ELi128ELi32EEE", "gemm", False),
    ("void cudnn::detail::dgrad_engine<float, 128, 6, 7, 3, 3, 5, false>(int, int, int, float const*, int, float const*, int, float*, kernel_grad_params, unsigned long long, int, unsigned long long, int, float, int, int, int)", "gemm", False),
    ("void implicit_convolve_sgemm<float, float, 128, 6, 7, 3, 3, 5, 1, false, true, true>(int, int, int, float const*, int, float*, float const*, kernel_conv_params, unsigned long long, int, float, float, int, float const*, float const*, bool, int, int)", "gemm", False),
    ("void fft2d_r2c_32x32<float, false, 0u, false>(float2*, float const*, int, int, int, int, int, int, int, int, int, cudnn::reduced_divisor, bool, int2, int, int)", "gemm", False),
    ("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, false, true, false, false, false, true, false>(pytorch_flash::Flash_fwd_params)", "gemm", True),
    ("void splitKreduce_kernel<32, 16, int, float, float, float, float, true, false, false>(cublasSplitKParams<float>, float const*, float const*, float*, float const*, float const*, float const*, float const*, float*, void*, long, float*, int*)", "reduction", False),
    ("void cudnn::bn_fw_tr_1C11_singleread<float, 512, true, 1, 2, 0>(cudnnTensorStruct, float const*, cudnnTensorStruct, float*, float const*, float const*, float, float, float*, float*, float*, float*, float, float, cudnn::reduced_divisor, int, cudnn::reduced_divisor)", "reduction", False),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)", "reduction", True),
    ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, true>(float*, float const*, int, int, int)", "reduction", False),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float>, unsigned int, float, 4>)", "reduction", False),
    ("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>(float*, float*, float*, long*, float*, bool, long, long, long, long)", "reduction", False),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)", "elementwise", False),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >(int, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>)", "elementwise", True),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::OpaqueType<2u>, unsigned int, 4, 64, 64>(at::native::(anonymous namespace)::OpaqueType<2u>*, at::native::(anonymous namespace)::CatArrInputTensorMetadata<at::native::(anonymous namespace)::OpaqueType<2u>, unsigned int, 64, 64>, at::native::(anonymous namespace)::TensorSizeStride<unsigned int, 4u>, int, unsigned int)", "elementwise", False),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>, std::plus<float>, float>(at::native::(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>, std::plus<float>, float)", "elementwise", False),
    ("void at::native::(anonymous namespace)::max_pool_forward_nchw<float, float>(int, float const*, int, int, int, int, int, int, int, int, int, int, int, int, int, int, float*, long*)", "elementwise", False),
    ("void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)2>(cudnn::ops::nchw2nhwc_params_t<float>, float const*, float*)", "elementwise", False),
    ("void cudnn::engines_precompiled::nchwToNhwcKernel<__nv_bfloat16, __nv_bfloat16, float, false, true, (cudnnKernelDataType_t)0>(cudnn::engines_precompiled::nchw2nhwc_params_t<float>, __nv_bfloat16 const*, __nv_bfloat16*)", "elementwise", True),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "comm", False),
    ("cask_cudnn::computeOffsetsKernel(cask_cudnn::ComputeOffsetsParams)", "other", False),
]


@pytest.mark.parametrize("name,cls,half", KERNELS, ids=[f"{c}-{i}" for i, (_, c, _) in enumerate(KERNELS)])
def test_classify_real_kernel_names(name, cls, half):
    assert classify_kernel(name) == cls
    assert is_half_precision(name) is half


def test_memory_bound_classes():
    assert [c for c in ("gemm", "reduction", "elementwise", "comm", "other") if is_memory_bound_class(c)] == \
        ["reduction", "elementwise"]
    assert classify_kernel("") == "other"


# -- a compiled plan ------------------------------------------------------------------------------
def test_plan_kernel_times_resnet_tiny():
    import dlcc

    m = dlcc.compile(str(ROOT / "examples" / "resnet-tiny.onnx"), target="opencl")
    plan = m.plan
    for name in ("h100", "pocl-cpu"):
        d = load_device(name)
        times = plan_kernel_times(plan, d)
        assert len(times) == len(plan["launches"]) > 0
        assert all(t.us > 0 and t.waves >= 1 for t in times)
        # GEMMs from their tiling where the device is calibrated for dlcc's GEMMs (h100), else the roofline
        tiled = {i for i, L in enumerate(plan["launches"]) if L.get("gemm") and d.gemm_cycle_us}
        assert {t.source for i, t in enumerate(times) if i not in tiled} == {"roofline"}
        assert all(times[i].source == "roofline + GEMM tiling model" for i in tiled)
        lower = sum(roofline_us(L["flops"], L["dram_bytes"], "float32", d) for L in plan["launches"])
        assert sum(t.us for t in times) >= lower
        assert sum(t.us for t in times) >= len(times) * d.kernel_fixed_us
    # a profile hit replaces exactly that launch's time
    d = load_device("h100")
    L0 = plan["launches"][0]
    db = ProfileDB("p.json")
    db.record(d.name, L0["kernel"], L0["grid"], L0["block"], 123.0)
    times = plan_kernel_times(plan, d, db=db)
    hits = [t for t, L in zip(times, plan["launches"])
            if (L["kernel"], L["grid"]) == (L0["kernel"], L0["grid"])]
    assert hits and all(t.us == 123.0 and t.source == "profile:p.json" for t in hits)


# -- the calibration script runs and maps most H100 kernels ---------------------------------------
_TRACES = Path(os.environ.get("DLCC_TRACES") or ROOT.parent / "shared" / "traces")


@pytest.mark.skipif(not list(_TRACES.glob("h100_*.json.gz")), reason="no H100 traces (DLCC_TRACES)")
def test_calibration_script_json():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "calibrate_costmodel.py"), "--json"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    r = json.loads(out)
    assert r["mapped"] > 1000 and r["mapped"] + r["unmapped"] == r["kernels"]
    rows = {x["class"]: x for x in r["median_rel_error"]}
    assert set(rows) == {"gemm", "elementwise", "reduction", "all"}
    assert rows["all"]["fitted"] < rows["all"]["roofline"]
    assert 0 < r["fitted"]["dram_efficiency"] <= 1 and 0 < r["fitted"]["compute_efficiency"] <= 1


# -- dlcc's GEMMs from their tiling (gemm_cycle_us) -------------------------------------------------
def _fit_output(*records) -> str:
    import subprocess
    import sys

    return subprocess.run([sys.executable, str(ROOT / "scripts" / "gemm_tilings.py"), "--fit",
                           *(str(ROOT / "scripts" / "data" / r) for r in records)],
                          capture_output=True, text=True, check=True).stdout


def _recorded_rows(*records) -> list:
    import json

    return [r for rec in records for r in json.loads((ROOT / "scripts" / "data" / rec).read_text())["rows"]]


SIMT_RECORDS = ("h100_gemm_measurements.json", "h200-2026-11-27/gemm_fp32_vector.json")


def test_gemm_tiling_model_matches_the_measurements_it_was_fitted_on():
    """The H100 spec's gemm_cycle_us is what `scripts/gemm_tilings.py --fit` gives on the recorded
    SIMT GEMMs (8 timed on an H100; 272 on an H200, vector tilings and their scalar twins), and
    every row the spec prices is within 2x."""
    from dlcc.estimate.costmodel import gemm_model_us
    from dlcc.kernels.gemm import tiling_named

    d = load_device("h100")
    rows = [r for r in _recorded_rows(*SIMT_RECORDS) if tiling_named(r["tiling"]) is not None]
    assert len(rows) >= 270
    for r in rows:
        us = d.kernel_fixed_us + gemm_model_us(r["tiling"], [1, *r["shape"]], d)
        assert 1 / 2.0 < us / r["us"] < 2.0, (r, us)
    assert f"{d.gemm_cycle_us:.6f} µs per modelled cycle" in _fit_output(*SIMT_RECORDS)


@pytest.mark.parametrize("key, records, within", [
    ("bf16", ("h200_gemm_bf16.json", "h200-2026-11-27/gemm_bf16.json"), 4.05),
    ("tf32", ("h200_gemm_tf32.json", "h200-2026-11-27/gemm_tf32.json"), 1.85),
    ("tf32_async", ("h200_gemm_tf32.json", "h200-2026-11-27/gemm_tf32.json"), 3.0)])
def test_tensor_core_tilings_are_priced_with_their_own_fitted_scale(key, records, within, tmp_path):
    """The H100 spec's mma_cycle_us[key] is what `gemm_tilings.py --fit` gives on the tensor-core
    GEMMs recorded on an H200 (scripts/data/h200_gemm_*.json, h200-2026-11-27/gemm_*.json),
    gemm_model_us prices those tilings with it (not with the SIMT template's gemm_cycle_us, which
    put them 3-4x too fast), and every recorded row of that scale is within `within` of its
    measured time. A key other than a tensor-core precision is a clear error."""
    import yaml

    from dlcc.estimate.costmodel import gemm_model_us
    from dlcc.kernels.gemm import tiling_and_cost
    from dlcc.kernels.gemm_mma import scale_key

    d = load_device("h100")
    rows = [r for r in _recorded_rows(*records) if scale_key(tiling_and_cost(r["tiling"], d)[0]) == key]
    assert len(rows) >= 200
    for r in rows:
        us = d.kernel_fixed_us + gemm_model_us(r["tiling"], [1, *r["shape"]], d)
        assert 1 / within < us / r["us"] < within, (r, us)
    fit = _fit_output(*records)
    assert f"mma_cycle_us[{key}] for NVIDIA H100 SXM: {d.mma_cycle_us[key]:.6f} µs per modelled cycle" in fit
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**d.model_dump(exclude_none=True), "mma_cycle_us": {"int8": 0.001}}))
    with pytest.raises(ConfigError, match="keys must be tf32, tf32_async, tf32x3, fp16, bf16"):
        load_device(str(bad))


def test_gemm_launches_priced_by_tiling_and_occupancy():
    from dlcc.estimate.costmodel import gemm_model_us, wave_gemm_us

    h100 = load_device("h100")
    L = {"kernel": "g", "grid": 96, "block": 256, "flops": 2 * 128 * 768 * 3072, "dram_bytes": 4 * (128 + 768) * 3072,
         "category": "compute", "gemm": {"shape": [1, 128, 768, 3072]}}
    k = {"name": "g", "kind": "gemm", "tiling": "32x32x64_2x2", "block": 256}
    t = launch_time(L, k, h100)
    alone = gemm_model_us("32x32x64_2x2", [1, 128, 768, 3072], h100)
    assert t.source == "roofline + GEMM tiling model" and t.us == pytest.approx(h100.kernel_fixed_us + alone)
    # the roofline alone (a device not calibrated for dlcc's GEMMs) is far faster than measured (87.3 µs)
    bare = h100.model_copy(update={"gemm_cycle_us": None})
    assert launch_time(L, k, bare).source == "roofline" and launch_time(L, k, bare).us < 0.5 * t.us
    # in a persistent kernel of one block per SM a GEMM gets no co-resident blocks to hide its k loop's
    # latency with (the SIMT model's latency term; its issue term seldom leaves that one binding)
    big = ["64x64x32_4x4", 1, 3136, 256, 1152]  # a ResNet-50 conv: 49 x 4 tiles, K steps of 32
    assert wave_gemm_us([big], 132, h100, 1) >= gemm_model_us(big[0], big[1:], h100)
    # two GEMMs of a wave share the vEUs: at least the longer one alone, at most both one after another
    w = wave_gemm_us([big, big], 132, h100, 1)
    one = wave_gemm_us([big], 132, h100, 1)
    assert one <= w <= 2 * one
    assert gemm_model_us("no-such-tiling", [1, 8, 8, 8], h100) is None
