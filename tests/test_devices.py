"""The device a compile plans for when none is named (dlcc/devices.py): a built-in spec only for
the GPU it describes, otherwise one derived from the driver's attributes, and the compile says
which. The attributes below are what the CUDA driver reports for those GPUs (deviceQuery)."""
from __future__ import annotations

import pytest

import dlcc
from dlcc import devices
from dlcc.errors import DlccError

H100_SXM = {"MULTIPROCESSOR_COUNT": 132, "MAX_THREADS_PER_MULTIPROCESSOR": 2048, "MAX_BLOCKS_PER_MULTIPROCESSOR": 32,
            "MAX_THREADS_PER_BLOCK": 1024, "MAX_REGISTERS_PER_MULTIPROCESSOR": 65536,
            "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR": 233472, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": 232448,
            "MAX_SHARED_MEMORY_PER_BLOCK": 49152, "CLOCK_RATE": 1980000, "MEMORY_CLOCK_RATE": 2619000,
            "GLOBAL_MEMORY_BUS_WIDTH": 5120, "L2_CACHE_SIZE": 52428800, "WARP_SIZE": 32}
H100_PCIE = dict(H100_SXM, MULTIPROCESSOR_COUNT=114, CLOCK_RATE=1755000, MEMORY_CLOCK_RATE=1593000)
H200 = dict(H100_SXM, MEMORY_CLOCK_RATE=3201000, GLOBAL_MEMORY_BUS_WIDTH=6144, L2_CACHE_SIZE=62914560)
L4 = {"MULTIPROCESSOR_COUNT": 58, "MAX_THREADS_PER_MULTIPROCESSOR": 1536, "MAX_BLOCKS_PER_MULTIPROCESSOR": 24,
      "MAX_THREADS_PER_BLOCK": 1024, "MAX_REGISTERS_PER_MULTIPROCESSOR": 65536,
      "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR": 102400, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": 101376,
      "CLOCK_RATE": 2040000, "MEMORY_CLOCK_RATE": 6251000, "GLOBAL_MEMORY_BUS_WIDTH": 192, "L2_CACHE_SIZE": 50331648}


def test_a_gpu_without_a_built_in_spec_is_planned_from_its_attributes():
    h200 = devices.spec_from_attributes("NVIDIA H200", (9, 0), H200)
    assert h200.arch == "sm_90" and h200.sms == 132 and h200.shared_mem_per_block == 232448
    assert 4800 < h200.dram_bandwidth_gbps < 5000  # the datasheet's 4.8 TB/s; an H100 SXM is 3.35
    l4 = devices.spec_from_attributes("NVIDIA L4", (8, 9), L4)
    assert l4.arch == "sm_89" and l4.sms == 58 and l4.max_threads_per_sm == 1536 and l4.max_blocks_per_sm == 24
    assert 290 < l4.dram_bandwidth_gbps < 310  # 300 GB/s
    assert 115 < l4.peak_tflops["bfloat16"] < 125 and l4.peak_tflops["tf32"] == pytest.approx(l4.peak_tflops["float16"] / 2)
    assert 28 < l4.peak_tflops["float32"] < 32  # 30.3 TFLOP/s
    assert "from its attributes" in l4.name and "sm_89" in l4.notes


def test_a_gpu_before_sm_80_has_no_tf32_or_bf16_peak():
    t4 = devices.spec_from_attributes("Tesla T4", (7, 5), dict(L4, MULTIPROCESSOR_COUNT=40, CLOCK_RATE=1590000,
                                                                 MAX_BLOCKS_PER_MULTIPROCESSOR=0))
    assert "bfloat16" not in t4.peak_tflops and "tf32" not in t4.peak_tflops
    assert t4.max_blocks_per_sm == 16  # the capability's figure where the driver reports none


def test_missing_attributes_are_one_clear_error():
    with pytest.raises(DlccError, match="MEMORY_CLOCK_RATE.*--device"):
        devices.spec_from_attributes("odd GPU", (9, 0), {k: v for k, v in H200.items() if k != "MEMORY_CLOCK_RATE"})


def test_the_built_in_spec_is_used_only_for_the_gpu_it_describes():
    assert devices.match_builtin("NVIDIA H100 80GB HBM3", 132) == "h100"
    assert devices.match_builtin("NVIDIA H100 PCIe", 114) is None  # 114 SMs: not the built-in SXM's 132
    assert devices.match_builtin("NVIDIA H200", 132) is None
    assert devices.match_builtin("NVIDIA A100-SXM4-80GB", 108) == "a100"


@pytest.mark.parametrize("gpu,attrs,expect", [("NVIDIA H100 80GB HBM3", H100_SXM, "built-in h100"),
                                              ("NVIDIA H100 PCIe", H100_PCIE, "derived"),
                                              ("NVIDIA H200", H200, "derived"),
                                              ("NVIDIA L4", L4, "derived")])
def test_default_device_says_how_it_chose(monkeypatch, gpu, attrs, expect):
    monkeypatch.setattr(devices, "read_cuda_device", lambda index=None: (gpu, (9, 0) if "H" in gpu else (8, 9), attrs))
    chosen, how = devices.default_device("cuda")
    assert how.startswith(expect) and gpu in how
    spec, key, _ = devices.resolve_device(None, "cuda")
    assert spec.sms == attrs["MULTIPROCESSOR_COUNT"] and (key == "h100") == (expect == "built-in h100")


def test_without_a_gpu_the_cuda_default_is_h100_and_says_so(monkeypatch):
    def no_gpu(index=None):
        raise RuntimeError("cuInit failed: no CUDA-capable device is detected")

    monkeypatch.setattr(devices, "read_cuda_device", no_gpu)
    assert devices.default_device("cuda") == ("h100", "built-in h100: no CUDA device here to read (--device names another)")
    assert devices.default_device("opencl")[0] == "pocl-cpu"


def test_the_cuda_device_index_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(devices.CUDA_DEVICE_ENV, raising=False)
    assert devices.cuda_device_index() == 0
    monkeypatch.setenv(devices.CUDA_DEVICE_ENV, "1")
    assert devices.cuda_device_index() == 1
    for bad in ("gpu1", "-1"):
        monkeypatch.setenv(devices.CUDA_DEVICE_ENV, bad)
        with pytest.raises(DlccError, match="DLCC_CUDA_DEVICE"):
            devices.cuda_device_index()


def test_a_cuda_compile_plans_for_the_derived_spec_and_records_it(monkeypatch, model_path, tmp_path):
    """A cross-compile for an L4 (no GPU here): the plan is built for sm_89's 58 SMs, and the
    plan's meta says the spec was derived; `dlcc compile` prints the device's name."""
    monkeypatch.setattr(devices, "read_cuda_device", lambda index=None: ("NVIDIA L4", (8, 9), L4))
    m = dlcc.compile(model_path("cnn"), target="cuda", pipeline="full", cache=False)
    meta = m.plan["meta"]
    assert meta["device"] == "NVIDIA L4 (from its attributes)" and meta["device_key"] is None
    assert meta["device_from"].startswith("derived from the attributes of NVIDIA L4")
    if "cuda" in m.plan:  # nvcc is here: the cubin is for the L4's arch
        assert m.plan["cuda"]["arch"] == "sm_89"
    named = dlcc.compile(model_path("cnn"), target="cuda", pipeline="full", device="a100", cache=False)
    assert named.plan["meta"]["device_from"] == "--device a100" and named.plan["meta"]["device_key"] == "a100"


def test_device_index_option(monkeypatch, capsys):
    from dlcc.cli import main

    monkeypatch.setenv(devices.CUDA_DEVICE_ENV, "0")  # restored after the test; --device-index sets it
    with pytest.raises(SystemExit) as e:
        main(["--device-index", "-1", "list", "devices"])
    assert e.value.code == 2 and "--device-index -1 is not a device index" in capsys.readouterr().err
    main(["--device-index", "1", "list", "devices", "--json"])
    assert devices.cuda_device_index() == 1


def test_a_derived_spec_takes_the_calibration_of_a_built_in_one_of_the_same_sms(monkeypatch):
    """An H200 is the H100 SXM's 132 sm_90 SMs with faster memory: its derived spec keeps its own
    bandwidth, L2 and name, and takes the h100 spec's cost-model calibration (the tensor-core
    constants there were fitted on an H200), so plan mode prices dlcc's GEMMs there as on an H100.
    An H100 PCIe (114 SMs) and an L4 (sm_89) have no such twin and keep the defaults."""
    from dlcc.config import load_device

    h100 = load_device("h100")
    monkeypatch.setattr(devices, "read_cuda_device", lambda index=None: ("NVIDIA H200", (9, 0), H200))
    spec, how = devices.default_device("cuda")
    assert "calibrated as the built-in h100 (the same sm_90 and 132 SMs)" in how
    assert all(getattr(spec, f) == getattr(h100, f) for f in devices.CALIBRATION_FIELDS)
    assert spec.gemm_cycle_us and spec.mma_cycle_us["bf16"] == h100.mma_cycle_us["bf16"]
    assert spec.dram_bandwidth_gbps > 4800 > h100.dram_bandwidth_gbps and spec.l2_bytes == H200["L2_CACHE_SIZE"]
    assert "from its attributes" in spec.name and "calibration from the built-in h100" in spec.notes
    for gpu, cc, attrs in (("NVIDIA H100 PCIe", (9, 0), H100_PCIE), ("NVIDIA L4", (8, 9), L4)):
        monkeypatch.setattr(devices, "read_cuda_device", lambda index=None, g=gpu, c=cc, a=attrs: (g, c, a))
        spec, how = devices.default_device("cuda")
        assert "calibrated" not in how and spec.gemm_cycle_us is None
