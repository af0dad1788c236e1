"""Which device a compile plans for, when the user names none, and which GPU the runtime uses.

The built-in device YAMLs (configs/devices) carry cost-model constants fitted on real traces, so
a GPU that is one of them is planned with it. Any other GPU (an H200, an L4, an H100 PCIe with
114 SMs rather than the SXM's 132) is planned with a DeviceSpec derived from the driver's own
attributes: SMs, threads, blocks, registers and shared memory per SM, the clock, and the memory
clock and bus width that give its DRAM bandwidth. Planning an unknown GPU as an H100 (what dlcc
once did silently) gets its occupancy, its co-residency and its roofline wrong. Where a built-in
spec has the same SM design (compute capability and SM count: an H200 and the H100 SXM), the
derived spec takes that spec's cost-model calibration, which belongs to the SMs. The compile says
which spec it used (`meta.device_from`).

`DLCC_CUDA_DEVICE` (or `--device-index`) picks the GPU by its CUDA ordinal, for both the
detection here and the runtime (backends/cuda.py).
"""
from __future__ import annotations

import os

from .config import DeviceSpec, builtin_names, load_device
from .errors import DlccError

CUDA_DEVICE_ENV = "DLCC_CUDA_DEVICE"

#: Per SM and clock, by compute capability: float32 lanes, and dense fp16 tensor-core FLOPs with
#: float32 accumulation (NVIDIA's architecture whitepapers: V100 125 TFLOP/s over 80 SMs at
#: 1.53 GHz, A100 312 over 108 at 1.41, H100 SXM 989 over 132 at 1.83, L4 121 over 58 at 2.04).
#: An unlisted capability gets the nearest lower one's figures.
_PER_SM_CLOCK = {(7, 0): (64, 1024), (7, 5): (64, 1024), (8, 0): (64, 2048), (8, 6): (128, 1024),
                 (8, 7): (128, 1024), (8, 9): (128, 1024), (9, 0): (128, 4096)}
#: Resident blocks per SM where the driver does not report it (CUDA_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR).
_BLOCKS_PER_SM = {(7, 0): 32, (7, 5): 16, (8, 0): 32, (8, 6): 16, (8, 7): 16, (8, 9): 24, (9, 0): 32}

#: The driver attributes spec_from_attributes reads (pycuda's device_attribute names).
ATTRIBUTES = ("MULTIPROCESSOR_COUNT", "MAX_THREADS_PER_MULTIPROCESSOR", "MAX_BLOCKS_PER_MULTIPROCESSOR",
              "MAX_THREADS_PER_BLOCK", "MAX_REGISTERS_PER_MULTIPROCESSOR", "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR",
              "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", "MAX_SHARED_MEMORY_PER_BLOCK", "CLOCK_RATE", "MEMORY_CLOCK_RATE",
              "GLOBAL_MEMORY_BUS_WIDTH", "L2_CACHE_SIZE", "WARP_SIZE")


def cuda_device_index() -> int:
    """The CUDA ordinal dlcc uses: $DLCC_CUDA_DEVICE, else 0."""
    raw = os.environ.get(CUDA_DEVICE_ENV, "").strip()
    if not raw:
        return 0
    try:
        index = int(raw)
    except ValueError:
        index = -1
    if index < 0:
        raise DlccError(f"{CUDA_DEVICE_ENV}={raw!r} is not a device index (0, 1, ...)")
    return index


def _table(table: dict, cc: tuple[int, int]):
    known = [k for k in sorted(table) if k <= tuple(cc)]
    return table[known[-1] if known else min(table)]


def spec_from_attributes(name: str, cc: tuple[int, int], attrs: dict[str, int]) -> DeviceSpec:
    """A DeviceSpec for GPU `name` of compute capability `cc` from its driver attributes (keys as
    in ATTRIBUTES; a missing optional one falls back to the capability's figure). The peaks are
    dense: float32 from the SM's lanes, tensor cores from the per-SM rate (tf32 at half the fp16
    rate, bf16 at the fp16 rate, from sm_80 on); the cost-model constants keep their defaults."""
    need = ("MULTIPROCESSOR_COUNT", "MAX_THREADS_PER_MULTIPROCESSOR", "MAX_REGISTERS_PER_MULTIPROCESSOR",
            "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR", "CLOCK_RATE", "MEMORY_CLOCK_RATE", "GLOBAL_MEMORY_BUS_WIDTH")
    missing = [k for k in need if not attrs.get(k)]
    if missing:
        raise DlccError(f"the driver did not report {', '.join(missing)} for {name}; name a device spec with --device")
    cc = (int(cc[0]), int(cc[1]))
    sms, clock_hz = attrs["MULTIPROCESSOR_COUNT"], attrs["CLOCK_RATE"] * 1e3
    lanes, tc = _table(_PER_SM_CLOCK, cc)
    fp16 = sms * tc * clock_hz / 1e12
    peaks = {"float32": round(sms * lanes * 2 * clock_hz / 1e12, 1), "float16": round(fp16, 1),
             "int8": round(2 * fp16, 1)}
    if cc >= (8, 0):
        peaks.update(tf32=round(fp16 / 2, 1), bfloat16=round(fp16, 1))
    per_block = attrs.get("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN") or attrs.get("MAX_SHARED_MEMORY_PER_BLOCK") or 49152
    return DeviceSpec(
        name=f"{name} (from its attributes)",
        kind="gpu",
        arch=f"sm_{cc[0]}{cc[1]}",
        sms=sms,
        warp_size=attrs.get("WARP_SIZE") or 32,
        max_threads_per_sm=attrs["MAX_THREADS_PER_MULTIPROCESSOR"],
        max_blocks_per_sm=attrs.get("MAX_BLOCKS_PER_MULTIPROCESSOR") or _table(_BLOCKS_PER_SM, cc),
        max_threads_per_block=attrs.get("MAX_THREADS_PER_BLOCK") or 1024,
        registers_per_sm=attrs["MAX_REGISTERS_PER_MULTIPROCESSOR"],
        shared_mem_per_sm=attrs["MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"],
        shared_mem_per_block=per_block,
        # DDR: two transfers per memory clock over the bus (an H100 SXM: 2 x 2619 MHz x 640 B = 3352 GB/s)
        dram_bandwidth_gbps=round(2 * attrs["MEMORY_CLOCK_RATE"] * 1e3 * attrs["GLOBAL_MEMORY_BUS_WIDTH"] / 8 / 1e9, 1),
        peak_tflops=peaks,
        launch_overhead_us=4.0,
        l2_bytes=attrs.get("L2_CACHE_SIZE") or None,
        notes=f"derived by dlcc from the driver's attributes of device {name!r} (sm_{cc[0]}{cc[1]})",
    )


#: Name fragments of the built-in GPU specs (a GPU's name contains one).
_BUILTIN_KEYS = {"h100": "h100", "a100": "a100", "v100": "v100", "2080": "rtx2080ti"}


#: The cost-model calibration a derived spec takes from a built-in one of the same SM design: the
#: constants fitted on dlcc's kernels and on traces, which belong to the SMs, not to the memory
#: (an H200 is an H100's 132 sm_90 SMs with faster DRAM: its bandwidth still comes from its own
#: attributes). The tensor-core constants in h100.yaml were fitted on an H200.
CALIBRATION_FIELDS = ("kernel_fixed_us", "gemm_fixed_us", "dram_efficiency", "compute_efficiency", "gemm_cycle_us",
                      "mma_cycle_us", "grid_barrier_us", "launch_overhead_us", "gemm_deep_pipelines",
                      "gemm_wgmma", "simt_vector_tilings", "persistent_dynamic_smem")


def same_design(cc: tuple[int, int], sms: int) -> str | None:
    """The built-in GPU spec with compute capability `cc` and `sms` SMs, if any."""
    arch = f"sm_{int(cc[0])}{int(cc[1])}"
    for builtin in builtin_names("devices"):
        spec = load_device(builtin)
        if spec.kind == "gpu" and spec.arch == arch and spec.sms == sms:
            return builtin
    return None


def calibrated_like(spec: DeviceSpec, builtin: str) -> DeviceSpec:
    """`spec` with the cost-model calibration (CALIBRATION_FIELDS) of built-in spec `builtin`."""
    b = load_device(builtin)
    update = {f: getattr(b, f) for f in CALIBRATION_FIELDS}
    update["notes"] = f"{spec.notes}; cost-model calibration from the built-in {builtin} (the same {b.arch} and {b.sms} SMs)"
    return spec.model_copy(update=update)


def match_builtin(name: str, sms: int) -> str | None:
    """The built-in spec for GPU `name` with `sms` SMs: its name fragment and its SM count must
    both match (an H100 PCIe has 114 SMs, the built-in H100 SXM 132)."""
    low = name.lower()
    for key, builtin in _BUILTIN_KEYS.items():
        if key in low and builtin in builtin_names("devices") and load_device(builtin).sms == sms:
            return builtin
    return None


def read_cuda_device(index: int | None = None) -> tuple[str, tuple[int, int], dict[str, int]]:
    """(name, compute capability, ATTRIBUTES) of CUDA device `index` (default: cuda_device_index()),
    read from the driver without creating a context."""
    import pycuda.driver as drv

    drv.init()
    index = cuda_device_index() if index is None else index
    if index >= drv.Device.count():
        raise DlccError(f"CUDA device {index} does not exist: this machine has {drv.Device.count()} "
                        f"({CUDA_DEVICE_ENV} or --device-index picks one)")
    dev = drv.Device(index)
    attrs = {}
    for a in ATTRIBUTES:
        which = getattr(drv.device_attribute, a, None)
        if which is not None:
            try:
                attrs[a] = int(dev.get_attribute(which))
            except Exception:  # an attribute this driver does not know
                pass
    return dev.name(), dev.compute_capability(), attrs


def default_device(target: str) -> tuple[str | DeviceSpec, str]:
    """The device a compile for `target` plans for when none is named, and how it was chosen (the
    plan's `meta.device_from`): a built-in spec's name, or a DeviceSpec derived from the GPU."""
    if target != "cuda":
        return "pocl-cpu", "built-in pocl-cpu (the OpenCL target's default)"
    try:
        name, cc, attrs = read_cuda_device()
    except DlccError:
        raise
    except Exception:  # no pycuda, no driver, no GPU: a cross-compile for the common case
        return "h100", "built-in h100: no CUDA device here to read (--device names another)"
    builtin = match_builtin(name, attrs.get("MULTIPROCESSOR_COUNT", 0))
    if builtin:
        return builtin, f"built-in {builtin}: matches {name}"
    spec, how = spec_from_attributes(name, cc, attrs), f"derived from the attributes of {name} (no built-in spec matches it)"
    like = same_design(cc, attrs.get("MULTIPROCESSOR_COUNT", 0))
    if like:
        spec = calibrated_like(spec, like)
        how += f", calibrated as the built-in {like} (the same {spec.arch} and {spec.sms} SMs)"
    return spec, how


def resolve_device(device, target: str) -> tuple[DeviceSpec, str | None, str]:
    """(spec, the name to key caches and `--device` hints on, how it was chosen) for `device` as
    given to a compile (a DeviceSpec, a built-in name or YAML path, or None for the default)."""
    if isinstance(device, DeviceSpec):
        return device, None, "given"
    if device:
        return load_device(device), str(device), f"--device {device}"
    chosen, how = default_device(target)
    if isinstance(chosen, DeviceSpec):
        return chosen, None, how
    return load_device(chosen), chosen, how
