"""The thin PyCUDA runtime, driven by the shared executor against a fake `pycuda` (no GPU here).

It checks what the CUDA path does with a real plan: one allocation per storage, weights uploaded,
every launch with the plan's grid/block and each buffer argument as base pointer + byte offset.
Whether the kernels themselves compile for the GPU is tests/test_nvcc.py's job.
"""
from __future__ import annotations

import sys
import types

import numpy as np
import pytest

import dlcc

from test_bad_input import EXAMPLE


class FakeDriver:
    def __init__(self):
        self.next_ptr = 1 << 20
        self.allocs, self.h2d, self.launches = [], [], []
        outer = self

        class Ctx:
            @staticmethod
            def get_device():
                return types.SimpleNamespace(name=lambda: "Fake H100", compute_capability=lambda: (9, 0))

            @staticmethod
            def synchronize():
                pass

        class Fn:
            def __init__(self, name):
                self.name = name

            def prepare(self, sig):
                assert set(sig) <= {"P", "i"}
                self.sig = sig

            def prepared_call(self, grid, block, *args):
                # Record what PyCUDA would pack: 'i' as a 32-bit int, 'P' as a pointer.
                assert len(args) == len(self.sig) and all(type(a) is int for a in args)
                packed = tuple(np.int32(a) if f == "i" else np.uintp(a) for f, a in zip(self.sig, args))
                outer.launches.append((self.name, packed, block, grid))

        self.Context = Ctx
        self.Fn = Fn

    def mem_alloc(self, n):
        p = self.next_ptr
        self.next_ptr += (n + 4095) // 4096 * 4096
        self.allocs.append((p, n))
        return p

    def memcpy_htod(self, ptr, arr):
        self.h2d.append((int(ptr), arr.nbytes))

    def memcpy_dtoh(self, out, ptr):
        out[...] = 0


@pytest.fixture
def fake_pycuda(monkeypatch):
    drv = FakeDriver()
    pkg = types.ModuleType("pycuda")
    compiler = types.ModuleType("pycuda.compiler")

    class SourceModule:
        def __init__(self, source, no_extern_c, arch, options):
            assert no_extern_c and arch == "sm_90" and "#define KERNEL extern \"C\" __global__" in source
            self.source = source

        def get_function(self, name):
            assert f"KERNEL void {name}(" in self.source
            return drv.Fn(name)

    compiler.SourceModule = SourceModule
    driver = types.ModuleType("pycuda.driver")
    for k in ("Context", "mem_alloc", "memcpy_htod", "memcpy_dtoh"):
        setattr(driver, k, getattr(drv, k))
    drv.loaded_cubins = []

    class Module:
        def get_function(self, name):
            return drv.Fn(name)

    def module_from_buffer(data):
        drv.loaded_cubins.append(data)
        return Module()

    driver.module_from_buffer = module_from_buffer
    monkeypatch.setitem(sys.modules, "pycuda", pkg)
    monkeypatch.setitem(sys.modules, "pycuda.autoinit", types.ModuleType("pycuda.autoinit"))
    monkeypatch.setitem(sys.modules, "pycuda.driver", driver)
    monkeypatch.setitem(sys.modules, "pycuda.compiler", compiler)
    pkg.driver, pkg.compiler = driver, compiler
    return drv


def test_cuda_runtime_binds_the_plan(fake_pycuda):
    # Planned for an A100 (sm_80) but run on the fake H100: the sm_80 cubin does not fit, so the
    # runtime compiles the CUDA text for sm_90 through SourceModule.
    m = dlcc.compile(EXAMPLE, target="cuda", device="a100")
    assert m.target == "cuda"
    outs = m(m.sample_inputs())
    plan = m.plan
    assert list(outs) == [o["name"] for o in plan["outputs"]]
    drv = fake_pycuda
    assert len(drv.launches) == len(plan["launches"])
    ptr_of = {}  # storage -> base pointer, from the executor's allocations
    ex = m.executor()
    for name, base in ex.storages.items():
        ptr_of[name] = int(base)
    for (fname, args, block, grid), L in zip(drv.launches, plan["launches"]):
        assert fname == L["kernel"] and block == (L["block"], 1, 1) and grid == (L["grid"], 1)
        for a, spec in zip(args, L["args"]):
            if "int" in spec:
                assert isinstance(a, np.int32) and int(a) == spec["int"]
            else:
                assert isinstance(a, np.uintp) and int(a) == ptr_of[spec["storage"]] + spec["offset"]
    # Weights uploaded once, inputs per run.
    assert (ptr_of["weights"], plan["storages"]["weights"]) in drv.h2d


@pytest.mark.skipif(__import__("dlcc.backends.nvcc", fromlist=["find_nvcc"]).find_nvcc() is None,
                    reason="nvcc is not installed on this machine")
def test_cuda_artifact_carries_cubin_and_resources(fake_pycuda, tmp_path):
    """Compiling for CUDA runs nvcc for the device's arch: the cubin and ptxas' figures go into the
    artifact, and the runtime loads that cubin instead of compiling at start-up."""
    out = tmp_path / "c.dlcc"
    m = dlcc.compile(EXAMPLE, out=out, target="cuda", device="h100")
    plan = m.plan
    assert plan["cuda"]["arch"] == "sm_90" and (out / "kernels.sm_90.cubin").stat().st_size > 0
    res = plan["cuda"]["resources"]
    assert set(res) == {k["name"] for k in plan["kernels"]}
    for k in plan["kernels"]:
        r = res[k["name"]]
        assert r["registers"] > 0 and r["spill_bytes"] == 0 and 1 <= r["blocks_per_sm"] <= 32
    loaded = dlcc.load(out, target="cuda")
    loaded(loaded.sample_inputs())
    assert fake_pycuda.loaded_cubins == [(out / "kernels.sm_90.cubin").read_bytes()]
    assert len(fake_pycuda.launches) == len(plan["launches"])
