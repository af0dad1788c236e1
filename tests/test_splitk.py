"""Split-K (dlcc/kernels/splitk.py): every GEMM template with its k loop split into chunks, each
its own rTask, the tile's last rTask adding the partial sums in k order. On PoCL against numpy
(ragged last chunks, batches, both B layouts), bitwise the same from run to run with the counters
back at zero, in models against onnxruntime (plain launches, AStitch's fused rOperators and
Rammer's persistent kernels), and through nvcc without spills."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import device_with

from dlcc.backends.nvcc import compile_cubin, find_nvcc
from dlcc.backends.source import render
from dlcc.config import load_device
from dlcc.kernels import splitk
from dlcc.kernels.gemm import (GemmSpec, TILINGS, choose_tiling, gemm_source, plain_spec, tasks_for, tiling_family_for,
                               tiling_named)
from dlcc.kernels.gemm_mma import choose_mma_tiling, mma_tilings
from dlcc.testing.pocl_kernels import grid_dependent_barrier_loops

#: One tiling of each template: SIMT, the register-staged TF32 mma, the cp.async bf16 pipeline
#: (as a raw half operand and through element loads).
BASES = {"simt": (TILINGS[0], "float32"), "tf32": (mma_tilings("tf32")[3], "float32"),
         "bf16": (mma_tilings("bf16")[4], "bfloat16"), "bf16-generic": (mma_tilings("bf16")[4], "float32")}


@pytest.fixture(scope="module")
def rt():
    from dlcc.executor import make_runtime

    return make_runtime("opencl")


def _batched_spec(batch: int, M: int, N: int, K: int, dtype: str) -> GemmSpec:
    """C[b] = A[b] · B[b]^T, A [batch, M, K] and B [batch, N, K] stored as `dtype`."""
    from dlcc.kernels.program import ctype, load_float

    return GemmSpec(batch=batch, M=M, N=N, K=K,
                    params=[f"GPTR const {ctype(dtype)}* A", f"GPTR const {ctype(dtype)}* B", "GPTR float* C"],
                    load_a=lambda m, k: ([], load_float(dtype, "A", f"bt * {M * K} + {m} * {K} + {k}")),
                    load_b=lambda k, n: ([], load_float(dtype, "B", f"bt * {N * K} + {n} * {K} + {k}")),
                    store=lambda m, n, acc: [f"C[bt * {M * N} + {m} * {N} + {n}] = {acc};"])


def _run(rt, t, spec, A, B, runs=2):
    """Launch tiling t's rOperator alone `runs` times; (outputs, counters after each run)."""
    name = "g_" + t.name
    kinds = [{"name": name, "kind": "gemm", "tiling": t.name}]
    rt.compile(render([gemm_source(name, spec, t)], rt.dialect), {"kernels": kinds})
    size_c = spec.batch * spec.M * spec.N * 4
    bufs = [rt.alloc(A.nbytes), rt.alloc(B.nbytes), rt.alloc(size_c)]
    rt.write(bufs[0], 0, np.ascontiguousarray(A).view(np.uint8))
    rt.write(bufs[1], 0, np.ascontiguousarray(B).view(np.uint8))
    grid, extra = splitk.standalone_args(rt, t, spec.batch, spec.M, spec.N)
    assert grid == tasks_for(t, spec.batch, spec.M, spec.N)
    args = [rt.view(b, 0, n) for b, n in zip(bufs, (A.nbytes, B.nbytes, size_c))] + extra
    outs, counters = [], []
    for _ in range(runs):
        rt.write(bufs[2], 0, np.full(size_c // 4, np.nan, np.float32))  # every element must be written
        rt.launch(rt.kernel(name), grid, t.threads, args)
        out = np.empty(size_c // 4, np.float32)
        rt.read(bufs[2], 0, out)
        rt.finish()
        outs.append(out)
        if extra:
            c = np.empty(splitk.tiles_of(t, spec.batch, spec.M, spec.N), np.int32)
            rt.read(extra[1], 0, c)
            rt.finish()
            counters.append(c)
    return outs, counters


@pytest.mark.parametrize("template", list(BASES))
@pytest.mark.parametrize("split", [2, 3])
@pytest.mark.parametrize("trans_b", [True, False], ids=["Bt", "B"])
def test_split_tilings_match_numpy_and_repeat_bitwise(rt, template, split, trans_b):
    """K = 200 in chunks of whole k steps leaves the last chunk ragged (zeros past K); M and N
    leave partial tiles; every element is written, twice the same bits, counters back at 0."""
    import ml_dtypes

    base, dtype = BASES[template]
    t = dataclasses.replace(base, splitk=split)
    M, N, K = 33, 70, 200
    spec = plain_spec(M, N, K, trans_b, a_dtype=dtype, b_dtype=dtype)
    rng = np.random.default_rng(split)
    A = rng.standard_normal((M, K), dtype=np.float32)
    B = rng.standard_normal((N, K) if trans_b else (K, N), dtype=np.float32)
    if dtype == "bfloat16":
        A, B = A.astype(ml_dtypes.bfloat16), B.astype(ml_dtypes.bfloat16)
    from dlcc.testing.rounding import operand_round

    prec = "fp32" if template == "simt" else ("tf32" if template == "tf32" else "bf16")
    a64 = operand_round(A.astype(np.float32), prec).astype(np.float64)
    b64 = operand_round(B.astype(np.float32), prec).astype(np.float64)
    ref = a64 @ (b64.T if trans_b else b64)
    outs, counters = _run(rt, t, spec, A, B)
    np.testing.assert_allclose(outs[0].reshape(M, N), ref, rtol=1e-4, atol=1e-3, err_msg=t.name)
    assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32)), "split-K must not depend on arrival order"
    assert all(not c.any() for c in counters), "every tile's last rTask sets its counter back to 0"


def test_split_tilings_over_a_batch(rt):
    t = dataclasses.replace(TILINGS[2], splitk=4)  # 32x64x16, 4 chunks of K = 96
    B_, M, N, K = 3, 40, 50, 96
    rng = np.random.default_rng(5)
    A = rng.standard_normal((B_, M, K), dtype=np.float32)
    B = rng.standard_normal((B_, N, K), dtype=np.float32)
    outs, counters = _run(rt, t, _batched_spec(B_, M, N, K, "float32"), A, B, runs=1)
    np.testing.assert_allclose(outs[0].reshape(B_, M, N), np.einsum("bmk,bnk->bmn", A, B), rtol=1e-4, atol=1e-4)
    assert not counters[0].any()


def test_split_kernels_have_no_grid_dependent_barrier_loops():
    """Each chunk runs the same constant number of k steps, so PoCL may build split kernels
    optimised: no loop around a barrier reads the block index (dlcc/testing/pocl_kernels.py)."""
    spec = plain_spec(128, 768, 3072)
    for base, dtype in BASES.values():
        t = dataclasses.replace(base, splitk=4)
        sp = plain_spec(128, 768, 3072, a_dtype=dtype, b_dtype=dtype) if dtype != "float32" else spec
        src = render([gemm_source("g", sp, t)], "opencl")
        assert grid_dependent_barrier_loops(src, ["g"]) == [], t.name


def test_split_factor_is_a_choice_of_gpu_devices_only():
    h100, pocl = load_device("h100"), load_device("pocl-cpu")
    # BERT-base's FFN down-projection at batch 1: 24 tiles of 64x64 would leave 108 of 132 SMs idle
    assert choose_tiling(1, 128, 768, 3072, h100).splitk > 1
    assert choose_mma_tiling(1, 128, 768, 3072, h100, "bf16").splitk > 1
    # many tiles already: no split (GPT-2's LM head)
    assert choose_mma_tiling(1, 128, 50257, 768, h100, "bf16").splitk == 1
    assert all(t.splitk == 1 for t in tiling_family_for("fp32", pocl) + tiling_family_for("bf16", pocl))
    assert {t.splitk for t in tiling_family_for("bf16", h100)} == {1, *splitk.SPLITS}
    # the register-staged TF32 128x128 tile stays whole (it spilled split, in convolutions); the
    # cp.async one splits
    tf32 = tiling_family_for("tf32", h100)
    staged = [t for t in tf32 if t.stages == 1 and t.bm * t.bn >= 128 * 128]
    assert staged and all(t.splitk == 1 for t in staged)
    assert {t.splitk for t in tf32 if t.stages > 1 and t.bm * t.bn >= 128 * 128} == {1, *splitk.SPLITS}
    assert {t.splitk for t in tf32} == {1, *splitk.SPLITS}
    for t in tiling_family_for("fp32", h100):
        assert tiling_named(t.name) == t and splitk.base_name(t.name) == dataclasses.replace(t, splitk=1).name


@pytest.mark.skipif(not find_nvcc(), reason="nvcc not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_split_tilings_build_under_nvcc_without_spills(arch):
    """Every base tiling of every template, split in 4, on a BERT-base shape."""
    from dlcc.kernels.gemm import ALL_TILINGS

    srcs, names = [], []
    for prec, bases in (("fp32", ALL_TILINGS), ("tf32", mma_tilings("tf32")), ("bf16", mma_tilings("bf16"))):
        dtype = "bfloat16" if prec == "bf16" else "float32"
        for base in bases:
            t = dataclasses.replace(base, splitk=4)
            names.append("g_" + t.name.replace("x", "_"))
            srcs.append(gemm_source(names[-1], plain_spec(128, 768, 3072, a_dtype=dtype, b_dtype=dtype), t))
    usage = compile_cubin(render(srcs, "cuda"), arch)
    for n in names:
        assert not usage[n].spills and usage[n].stack_bytes == 0, (n, usage[n])


@pytest.mark.skipif(not find_nvcc(), reason="nvcc not installed")
def test_split_gemms_in_a_persistent_kernel_build_without_spills(tmp_path):
    """The largest fp32 tiling split in 8, AStitch-fused (bias + Relu) and a call site of a
    persistent kernel, as BERT-base fp32 `full` has it: the last rTask's sum once held every
    chunk's loads in flight (255 registers, 324 B of spills); now one chunk's at a time."""
    import dlcc

    path = _branches(tmp_path / "b.onnx")
    pipe = tmp_path / "big.yaml"
    pipe.write_text("name: big\npasses:\n  - name: lower\n    options: {gemm_tilings: {1x64x512x768: 128x64x32_8x4_sk8}}\n"
                    "  - name: astitch\n  - name: rammer\n    options: {join: always}\n  - name: memplan\n")
    for arch, dev in (("sm_90", "h100"), ("sm_80", "a100")):
        m = dlcc.compile(path, target="opencl", pipeline=str(pipe), device=dev)
        assert m.plan["meta"].get("split_k") == {"128x64x32_8x4_sk8": 3}
        usage = compile_cubin(m.source("cuda"), arch)
        assert not [u for u in usage.values() if u.spills], usage


def _branches(path, n=3, M=64, K=768, N=512):
    """n independent Linear + Relu branches of one input: at batch 1 each GEMM is a few tiles
    with a long K (split on an H100), AStitch fuses the bias and Relu into the GEMM's store, and
    Rammer puts the n GEMMs in one wave."""
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(3)
    nodes, inits, outs = [], [], []
    for i in range(n):
        inits += [helper.make_tensor(f"W{i}", TensorProto.FLOAT, [K, N], rng.standard_normal(K * N) / np.sqrt(K)),
                  helper.make_tensor(f"b{i}", TensorProto.FLOAT, [N], rng.standard_normal(N))]
        nodes += [helper.make_node("MatMul", ["x", f"W{i}"], [f"m{i}"]), helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
                  helper.make_node("Relu", [f"a{i}"], [f"y{i}"])]
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [M, N]))
    g = helper.make_graph(nodes, "branches", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K])], outs, inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


@pytest.mark.parametrize("pipeline,precision", [("baseline", "tf32"), ("astitch", "fp32"), ("full", "fp32"),
                                                ("full", "bf16")])
def test_models_with_split_gemms_match_onnxruntime(tmp_path, pipeline, precision):
    """Plans for an H100, run on PoCL: split GEMMs as plain launches, as AStitch's fused rOperators
    (bias and Relu in the last rTask's store) and as rTasks of a persistent kernel, where the three
    GEMMs still share one wave (each has its own counters: Launch.regions). The DEEP tilings are
    off: their dynamic shared memory keeps them out of persistent kernels (passes/rammer.py)."""
    import dlcc
    from dlcc.verify import verify_outputs

    path = _branches(tmp_path / "b.onnx")
    dev = str(device_with(tmp_path, gemm_deep_pipelines=False))
    m = dlcc.compile(path, target="opencl", pipeline=pipeline, device=dev, precision=precision)
    assert m.plan["meta"].get("split_k"), "the H100 cost model splits these GEMMs"
    assert sum(m.plan["meta"]["split_k"].values()) == 3
    assert m.plan["storages"].get("splitk")
    if pipeline == "full":
        (P,) = [L for L in m.plan["launches"] if L["op_type"] == "Rammer"]
        assert P["rprogram"]["split_k"] and [w["ops"] for w in P["rprogram"]["waves"]][0] >= 3
    feeds = m.sample_inputs(0)
    first = m(feeds)
    rows = verify_outputs(path, first, feeds, precision=precision)
    assert all(r["passed"] for r in rows), rows
    again = m(feeds)
    for k in first:
        assert np.array_equal(first[k], again[k]), "split-K results must not depend on arrival order"


def test_split_k_option_turns_it_off(tmp_path):
    import dlcc

    path = _branches(tmp_path / "b.onnx", n=1)
    pipe = tmp_path / "nosplit.yaml"
    pipe.write_text("name: nosplit\npasses:\n  - name: lower\n    options: {split_k: false}\n  - name: memplan\n")
    on = dlcc.compile(path, target="opencl", pipeline="baseline", device="h100")
    off = dlcc.compile(path, target="opencl", pipeline=str(pipe), device="h100")
    assert on.plan["meta"].get("split_k") and not off.plan["meta"].get("split_k")
    assert "splitk" not in off.plan["storages"]
    feeds = on.sample_inputs(1)
    a, b = on(feeds), off(feeds)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-4, atol=1e-4)


def test_standalone_args_keep_the_workspace_and_counters_alive():
    """On CUDA a view is a bare pointer, so the split launch's arguments must be the workspace
    and counter allocations themselves: as views, nothing held them once standalone_args
    returned, and the first split GEMM in scripts/gemm_tilings.py (and --tune) on an H200 read
    freed memory (CUDA error 700, an illegal address)."""
    live = []

    class Allocation:  # freed when the last reference goes, as PyCUDA's DeviceAllocation is
        def __init__(self, n):
            live.append(id(self))

        def __del__(self):
            live.remove(id(self))

        def __int__(self):
            return id(self)

    class PointerViews:  # CudaRuntime's view: the address, no reference to the allocation
        def alloc(self, n):
            return Allocation(n)

        def view(self, buf, offset, nbytes):
            return np.uintp(int(buf) + offset)

        def write(self, buf, offset, data):
            pass

    t = dataclasses.replace(TILINGS[0], splitk=2)
    grid, extra = splitk.standalone_args(PointerViews(), t, 1, 64, 64)
    assert grid == 2 * splitk.tiles_of(t, 1, 64, 64)
    assert len(live) == 2 and sorted(int(a) for a in extra[:2]) == sorted(live)


def test_small_split_tiles_read_their_chunks_back_together():
    """The last rTask's read-back: all S chunks' loads in flight where S x a thread's accumulators
    fits READBACK_REGISTERS (the unrolled chunk loop), one chunk at a time otherwise (rolled: all
    of them spilled inside persistent kernels)."""
    import re

    from dlcc.kernels.gemm import Tiling, gemm_source, plain_spec
    from dlcc.kernels.gemm_mma import MmaTiling

    spec = plain_spec(128, 768, 3072, True)

    def chunk_loop(t):
        src = gemm_source("g", spec, t)
        return re.search(r"#pragma unroll( 1)?\n\s*for \(int q = 0; q < \d+; \+\+q\)", src).group(1) is None

    small = MmaTiling(32, 64, 64, 2, 4, "bf16", 3, splitk=4)  # 8 accumulators a thread, 4 chunks: 32
    assert small.mi * small.ni * 4 * small.splitk <= splitk.READBACK_REGISTERS and chunk_loop(small)
    assert not chunk_loop(dataclasses.replace(small, splitk=8))  # 64
    assert not chunk_loop(Tiling(64, 64, 16, 4, 4, splitk=4))  # a 4x4 SIMT tile in 4 chunks: 64
    assert chunk_loop(Tiling(64, 64, 16, 4, 4, splitk=2))  # in 2: 32
