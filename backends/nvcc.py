"""Compile-check the CUDA text with nvcc and read ptxas resource usage (registers, shared
memory, spills) per kernel — what the occupancy model and the no-spill tests need. Runs on
machines without a GPU; nothing compiled here is executed here."""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from ..errors import CompileError

_FN = re.compile(r"Compiling entry function '([^']+)' for '(sm_\d+a?)'")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PROPS = re.compile(r"Function properties for (\S+)")
_USED = re.compile(r"Used (\d+) registers(?:, used \d+ barriers)?(?:, (\d+) bytes smem)?")


@dataclass
class Usage:
    kernel: str
    arch: str
    registers: int = 0
    smem_bytes: int = 0
    stack_bytes: int = 0
    spill_stores: int = 0
    spill_loads: int = 0

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


def find_nvcc() -> str | None:
    return shutil.which("nvcc") or (os.path.exists("/usr/local/cuda/bin/nvcc") and "/usr/local/cuda/bin/nvcc") or None


@functools.lru_cache(maxsize=4)
def nvcc_version(nvcc: str | None = None) -> str | None:
    """nvcc's release line (part of every cache key over its output); None without nvcc."""
    nvcc = nvcc or find_nvcc()
    if not nvcc:
        return None
    try:
        p = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    return lines[-1].strip() if lines else None


#: nvcc's warnings 177, "declared but never referenced", and 550, "set but never used": every
#: module carries the prelude's static helpers (dlcc_nmax, dlcc_grid_sync, ...) whether its
#: kernels call them or not, the shared tile templates name indices (a batch index where the
#: batch is 1) that a given tiling leaves unused, and the tensor-core templates set the scratch
#: pointer only OpenCL's emulation reads. On a GPU, PyCUDA turned each into a UserWarning at every
#: compile: 279 lines of them in one `dlcc compile --tune` of ResNet-50. The rest still show.
QUIET = ("--diag-suppress=177,550",)


def runtime_flags() -> list[str]:
    """nvcc options for the CUDA runtime's own compile (backends/cuda.py, through PyCUDA): the
    artifact build's (build_cubin) less what only that one reads (the cubin's name, the resource
    report)."""
    nvcc = find_nvcc()
    return ["-O3", *(_parallel_flags(nvcc) if nvcc else ()), *QUIET]


def _parallel_flags(nvcc: str) -> tuple[str, ...]:
    """`--split-compile=0` where nvcc has it (CUDA 12.1 on): nvcc optimises the translation unit's
    functions on every core. The machine code is the same (every .text section of ResNet-50's 27
    kernels compared equal with and without it); the compile is 1.3-1.6x shorter on 2 cores, and
    more on a GPU machine's 16. The release is read from nvcc_version's build line
    (`Build cuda_13.0.r13.0/...`)."""
    m = re.search(r"cuda_(\d+)\.(\d+)", nvcc_version(nvcc) or "")
    return ("--split-compile=0",) if m and (int(m.group(1)), int(m.group(2))) >= (12, 1) else ()


def arch_for(source: str, arch: str) -> str:
    """The nvcc arch to build `source` for on a device of `arch`: wgmma exists only in sm_90's
    arch-specific feature set, so a module holding it is built for sm_90a (its cubin loads on
    every sm_90 GPU; a PTX fallback for later archs could not hold it)."""
    from ..kernels.gemm_wgmma import uses_wgmma

    return "sm_90a" if arch == "sm_90" and uses_wgmma(source) else arch


def compile_cubin(source: str, arch: str = "sm_80", nvcc: str | None = None, timeout: int = 600) -> dict[str, Usage]:
    """nvcc -cubin -arch=ARCH --resource-usage; raises CompileError with the log on failure."""
    return build_cubin(source, arch, nvcc, timeout)[0]


def build_cubin(source: str, arch: str = "sm_80", nvcc: str | None = None,
                timeout: int = 600) -> tuple[dict[str, Usage], bytes, str]:
    """(per-kernel resource usage, the cubin, nvcc's log) for `source` compiled for `arch`."""
    nvcc = nvcc or find_nvcc()
    if not nvcc:
        raise CompileError("nvcc not found on PATH")
    arch = arch_for(source, arch)
    with tempfile.TemporaryDirectory(prefix="dlcc-nvcc-") as tmp:
        src = os.path.join(tmp, "kernels.cu")
        with open(src, "w") as f:
            f.write(source)
        cmd = [nvcc, "-cubin", f"-arch={arch}", "-O3", *_parallel_flags(nvcc), *QUIET, "--resource-usage",
               "-o", os.path.join(tmp, "k.cubin"), src]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        cubin_path = os.path.join(tmp, "k.cubin")
        cubin = open(cubin_path, "rb").read() if p.returncode == 0 and os.path.exists(cubin_path) else b""
    log = p.stdout + p.stderr
    if p.returncode != 0:
        raise CompileError(f"nvcc ({arch}) failed:\n{log[-4000:]}")
    usages: dict[str, Usage] = {}
    cur = None
    for line in log.splitlines():
        m = _FN.search(line)
        if m:
            cur = Usage(m.group(1), m.group(2))
            usages[cur.kernel] = cur
            continue
        m = _PROPS.search(line)
        if m and m.group(1) not in usages:
            # An out-of-line device function (a persistent kernel's call sites): its stack and
            # spills are its own, listed under its mangled name so that a spill anywhere shows.
            cur = usages[m.group(1)] = Usage(m.group(1), arch)
            continue
        if m:
            cur = usages[m.group(1)]
            continue
        if cur is None:
            continue
        m = _SPILL.search(line)
        if m:
            cur.stack_bytes, cur.spill_stores, cur.spill_loads = map(int, m.groups())
        m = _USED.search(line)
        if m:
            cur.registers = int(m.group(1))
            cur.smem_bytes = int(m.group(2) or 0)
    return usages, cubin, log


def blocks_per_sm(u: Usage, block: int, device) -> int:
    """Resident blocks of one kernel per SM: the least of the thread, block, register and shared
    memory limits (registers are allocated per warp in units of 256)."""
    warps = -(-block // device.warp_size)
    regs_per_warp = -(-max(u.registers, 1) * device.warp_size // 256) * 256
    by_regs = device.registers_per_sm // max(1, regs_per_warp * warps)
    by_smem = device.shared_mem_per_sm // u.smem_bytes if u.smem_bytes else device.max_blocks_per_sm
    by_threads = device.max_threads_per_sm // block
    return max(0, min(device.max_blocks_per_sm, by_threads, by_regs, by_smem))
