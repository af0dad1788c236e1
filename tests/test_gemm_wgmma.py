"""The wgmma GEMM rKernel (kernels/gemm_wgmma.py): Hopper's warpgroup MMA out of 128B-swizzled shared
memory, fed by the cp.async pipeline. No GPU here: on PoCL the prelude queues each wgmma and runs it
at the wait that covers it, reading both operands through their descriptors as the hardware does,
so these tests check the tile code, the swizzled layout, the descriptors and the group accounting
against numpy; nvcc builds the same text for sm_90a."""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from conftest import gemm_plan, nvcc_ptx_and_ptxas, opencl_device_available
from dlcc.backends.nvcc import arch_for, find_nvcc
from dlcc.backends.source import render
from dlcc.config import load_device
from dlcc.kernels import splitk as sk
from dlcc.kernels.gemm import all_tiling_names, gemm_source, plain_spec, tiling_family_for
from dlcc.kernels.gemm_mma import choose_mma_tiling, mma_tilings
from dlcc.kernels.gemm_mma_async import swizzle
from dlcc.kernels.gemm_wgmma import TILINGS, chooses_wgmma, uses_wgmma, wg_n, wgmma_fits, wgmma_tilings
from test_gemm_mma_async import HALF, _operands, _reference, _run

needs_opencl = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")


@pytest.fixture(scope="module")
def rt():
    from dlcc.executor import make_runtime

    return make_runtime("opencl")


#: (precision, M, N, K, A transposed, B stored [N, K], A in the half type): K over more k blocks
#: than the deepest tiling's stages where it matters; odd M and N cut every edge tile.
CASES = [
    ("bf16", 70, 136, 640, False, True, True),    # both K-major in the half type: both by cp.async
    ("fp16", 37, 70, 200, False, False, True),    # B [K, N]: loaded per element into the K-major tile
    ("bf16", 40, 72, 48, True, True, False),      # A [K, M] in float32: per element; K under one block
]


def _check(rt, tilings, precision, M, N, K, trans_a, trans_b, a_half):
    a_dtype, b_dtype = (HALF[precision] if a_half else "float32"), HALF[precision]
    spec = plain_spec(M, N, K, trans_b, b_dtype=b_dtype, a_dtype=a_dtype, trans_a=trans_a)
    names = [(f"g_{t.name}", t) for t in tilings]
    rt.compile(render([gemm_source(n, spec, t) for n, t in names], rt.dialect), gemm_plan(names))
    A, B = _operands(M, N, K, trans_a, trans_b)
    ref = _reference(A, B, precision, trans_a, trans_b)
    for n, t in names:
        out = _run(rt, n, t, spec, A, B, a_dtype, b_dtype)
        np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5, err_msg=t.name)


@needs_opencl
@pytest.mark.parametrize("precision,M,N,K,trans_a,trans_b,a_half", CASES,
                         ids=[f"{c[0]}-{c[1]}x{c[2]}x{c[3]}-{'At' if c[4] else 'A'}{'Bt' if c[5] else 'B'}" for c in CASES])
def test_every_wgmma_tiling_matches_numpy(rt, precision, M, N, K, trans_a, trans_b, a_half):
    _check(rt, wgmma_tilings(precision), precision, M, N, K, trans_a, trans_b, a_half)


@needs_opencl
def test_split_wgmma_tilings_match_numpy(rt):
    """Split along K (each chunk its own rTask, the last one adding the partial sums in k order),
    with both warpgroup layouts: rows split (128-row tiles) and columns split (64-row tiles)."""
    import ml_dtypes
    from test_splitk import _run as run_split

    split = [t for t in sk.variants(wgmma_tilings("bf16"), load_device("h100")) if t.splitk > 1]
    M, N, K = 70, 96, 520
    spec = plain_spec(M, N, K, True, b_dtype="bfloat16", a_dtype="bfloat16")
    A, B = _operands(M, N, K, False, True)
    ref = _reference(A, B, "bf16", False, True)
    for t in (next(t for t in split if t.bm == 128 and t.splitk == 2), next(t for t in split if t.bm == 64 and t.splitk == 4)):
        outs, counters = run_split(rt, t, spec, A.astype(ml_dtypes.bfloat16), B.astype(ml_dtypes.bfloat16))
        np.testing.assert_allclose(outs[0].reshape(M, N), ref, rtol=2e-5, atol=2e-5, err_msg=t.name)
        assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32)), t.name
        assert all(not c.any() for c in counters)


def _one(rt, src_of, t, M=64, N=64, K=256, seed=5):
    spec = plain_spec(M, N, K, True, b_dtype="bfloat16", a_dtype="bfloat16")
    good = gemm_source("g_good", spec, t)
    bad = src_of(good)
    assert bad != good
    rt.compile(render([bad], rt.dialect), gemm_plan([("g_good", t)]))
    A, B = _operands(M, N, K, False, True, seed=seed)
    return _run(rt, "g_good", t, spec, A, B, "bfloat16", "bfloat16"), _reference(A, B, "bf16", False, True)


@needs_opencl
@pytest.mark.parametrize("which", [5, 3], ids=["2-stage", "6-stage"])
def test_waiting_for_too_few_wgmma_groups_is_caught(rt, which):
    """The emulated wgmmas run at the wait that covers them: a k loop whose last wait leaves a
    group in flight leaves the last block's products out, as it would store unfinished
    accumulators on a GPU. From three stages on one group stays in flight inside the loop."""
    t = wgmma_tilings("bf16")[which]
    n = wg_n(t)
    src = gemm_source("g", plain_spec(64, 64, 256, True, b_dtype="bfloat16", a_dtype="bfloat16"), t)
    assert src.count(f"WGMMA_WAIT_N{n}(0, acc);") == 1 and src.count(f"WGMMA_WAIT_N{n}(1, acc);") == (t.stages >= 3)
    assert f"const int kn = kb + {t.stages - 1 - (t.stages >= 3)}," in src  # copies run one block less ahead
    out, ref = _one(rt, lambda s: s.replace(f"WGMMA_WAIT_N{n}(0, acc);", f"WGMMA_WAIT_N{n}(1, acc);"), t)
    assert not np.allclose(out, ref, rtol=1e-2, atol=1e-2)


@needs_opencl
@pytest.mark.parametrize("slip", ["stride", "swizzle", "unaligned", "k-step"])
def test_a_wrong_descriptor_or_layout_is_caught(rt, slip):
    """Plausible slips give wrong numbers or NaN on PoCL, as on a GPU: a stride byte offset of 512
    (rows of 64 bytes), no swizzle mode, buffers 16 bytes off their 1 KiB atom, k steps of 16 bytes."""
    t = wgmma_tilings("bf16")[5]
    edits = {
        "stride": lambda s: s.replace("(wg_desc_t)(1024 >> 4) << 32", "(wg_desc_t)(512 >> 4) << 32"),
        "swizzle": lambda s: s.replace("((wg_desc_t)1 << 62) | ", ""),
        "unaligned": lambda s: s.replace("& 1023u)) & 1023u))", "& 1023u)) & 1023u) + 16)"),
        "k-step": lambda s: s.replace("da + 2, db + 2", "da + 1, db + 1"),
    }
    out, ref = _one(rt, edits[slip], t)
    assert np.isnan(out).any() or not np.allclose(out, ref, rtol=1e-2, atol=1e-2)


def test_the_layout_is_the_128_byte_swizzle():
    """cp.async's chunk placement (gemm_mma_async.swizzle, rows of eight 16-byte chunks) is the
    hardware's 128B swizzle (bits 4-6 of the byte address XORed with bits 7-9) of a row-major
    [rows, 64] buffer on a 1 KiB boundary, which is what the descriptors tell the hardware."""
    for row in range(64):
        for k in range(64):
            linear = row * 128 + k * 2
            hw = linear ^ (((linear >> 7) & 7) << 4)
            ours = swizzle(row * 8 + k // 8, 8) * 16 + (k % 8) * 2
            assert hw == ours, (row, k)


def test_only_sm_90_runs_them_and_only_a_measured_spec_picks_them():
    h100, a100 = load_device("h100"), load_device("a100")
    assert wgmma_fits(h100) and not wgmma_fits(a100) and not wgmma_fits(load_device("pocl-cpu"))
    assert not chooses_wgmma(h100)  # off until a GPU times them (scripts/gpu_session.sh 17)
    on = h100.model_copy(update={"gemm_wgmma": True})
    assert chooses_wgmma(on) and not chooses_wgmma(a100.model_copy(update={"gemm_wgmma": True}))
    # --tune's family has them where the spec has them on (sm_90 only); a pipeline may name them;
    # none at the float precisions
    wg = {t.name for t in wgmma_tilings("bf16")}
    assert wg <= {t.name for t in tiling_family_for("bf16", on)}
    assert not wg & {t.name for t in tiling_family_for("bf16", h100)}
    assert not wg & {t.name for t in tiling_family_for("bf16", a100.model_copy(update={"gemm_wgmma": True}))}
    assert wg <= set(all_tiling_names()) and wgmma_tilings("tf32") == ()
    # the cost model prices them (finite, positive) and picks one only where the spec says so
    for shape in ((1, 128, 768, 768), (1, 1024, 1024, 1024)):
        assert not choose_mma_tiling(*shape, h100, "bf16").wgmma
        assert choose_mma_tiling(*shape, on, "bf16").name in {t.name for t in sk.variants(wgmma_tilings("bf16"), on)} | {
            t.name for t in sk.variants(mma_tilings("bf16", True), on)}


def test_a_wgmma_module_is_built_for_sm_90a():
    spec = plain_spec(128, 768, 768, True, b_dtype="bfloat16", a_dtype="bfloat16")
    wg, plain = (render([gemm_source("g", spec, t)], "cuda") for t in (wgmma_tilings("bf16")[0],
                                                                      choose_mma_tiling(1, 128, 768, 768, None, "bf16")))
    assert uses_wgmma(wg) and not uses_wgmma(plain)  # (the prelude defines the macros in both)
    assert arch_for(wg, "sm_90") == "sm_90a" and arch_for(plain, "sm_90") == "sm_90"


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed on this machine")
def test_nvcc_builds_every_wgmma_tiling_without_spills(tmp_path):
    """Every tiling at both precisions, with operands copied raw and loaded per element, unsplit
    and split, builds for sm_90a; the PTX holds the wgmma of each width, its fences, commits and
    waits, and the proxy fence; nothing spills; the dynamic ones hold no static shared memory."""
    sources, dynamic = [], []
    for precision, half in HALF.items():
        for tb in (True, False):
            spec = plain_spec(128, 768, 768, tb, b_dtype=half, a_dtype=half)
            for t in wgmma_tilings(precision) + tuple(dataclasses.replace(t, splitk=4) for t in wgmma_tilings(precision)[:2]):
                sources.append(gemm_source(f"g_{t.name}_{int(tb)}", spec, t))
                dynamic += [f"g_{t.name}_{int(tb)}"] if t.dynamic else []
    src = tmp_path / "k.cu"
    src.write_text(render(sources, "cuda"))
    ptx, log = nvcc_ptx_and_ptxas(src, arch_for(src.read_text(), "sm_90"))
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", log)]
    stacks = [int(x) for x in re.findall(r"(\d+) bytes stack frame", log)]
    assert len(spills) == len(sources) and not any(spills) and not any(stacks), log[-3000:]
    assert "C7510" not in log and "serialized" not in log, log[-3000:]  # ptxas kept the wgmma pipeline
    used = dict(re.findall(r"Function properties for (\w+)\n.*\n.*Used \d+ registers([^\n]*)", log))
    assert dynamic and all(n in used and "bytes smem" not in used[n] for n in dynamic)
    for n_ in sorted({wg_n(t) for t in wgmma_tilings("bf16")}):
        for ty in ("f16", "bf16"):
            assert f"wgmma.mma_async.sync.aligned.m64n{n_}k16.f32.{ty}.{ty}" in ptx, (n_, ty)
    assert ptx.count("wgmma.fence.sync.aligned") >= len(sources)
    assert ptx.count("wgmma.commit_group.sync.aligned") >= len(sources)
    assert ptx.count("wgmma.wait_group.sync.aligned") >= len(sources)
    assert ptx.count("fence.proxy.async.shared::cta") >= len(sources)
    assert len(TILINGS) == 7


def _wgmma_h100(tmp_path):
    from conftest import device_with

    return str(device_with(tmp_path, "h100", gemm_wgmma=True))


@needs_opencl
@pytest.mark.parametrize("name,pipeline", [("bert", "astitch"), ("gpt2", "full"), ("cnn", "astitch")])
def test_models_on_wgmma_tilings_match_onnxruntime(model_path, tmp_path, monkeypatch, name, pipeline):
    """An H100 plan with the wgmma tilings on (`gemm_wgmma`) and the mma.sync ones taken away (the
    small models' GEMMs would pick those), run on PoCL through the emulation: every GEMM (and
    convolution, as an implicit GEMM loaded element by element into the K-major tiles) takes a
    wgmma tiling, AStitch's epilogues and the persistent kernel's rTasks included; [K, N] weights
    are stored [N, K], so that cp.async copies them; the outputs are within the bf16 tolerance of
    onnxruntime's float32."""
    from test_precision import _max_err

    import dlcc
    from dlcc.kernels import gemm_mma
    from dlcc.verify import DEFAULT_TOLERANCE

    monkeypatch.setattr(gemm_mma, "mma_tilings", lambda precision="tf32", deep=False: ())
    path = model_path(name)
    cm = dlcc.compile(path, target="opencl", pipeline=pipeline, device=_wgmma_h100(tmp_path), precision="bf16")
    tilings = [k["tiling"] for k in cm.plan["kernels"] if k.get("tiling")]  # (a persistent kernel's rTasks too)
    tilings += [g[0] for L in cm.plan["launches"] for w in (L.get("rprogram") or {}).get("waves", [])
                for g in w.get("gemms", [])]
    assert tilings and all(t.endswith("_wg") or "_wg_sk" in t for t in tilings if t.startswith("tc")), tilings
    if name != "cnn":
        assert any("K-major, for wgmma" in x for x in cm.plan["meta"]["pass_log"])
    assert "WGMMA_COMMIT();" in cm.source("cuda")
    err, got, ref = _max_err(cm, path)
    rtol, atol = DEFAULT_TOLERANCE["bf16"]
    for n in ref:
        np.testing.assert_allclose(got[n], ref[n], rtol=rtol, atol=atol, err_msg=n)


def test_a_wgmma_plan_is_refused_on_another_gpu(monkeypatch):
    """A plan whose GEMMs use wgmma (sm_90 only) on a GPU of another arch is one clear error
    before anything is built, not nvcc's or ptxas' complaint; on an sm_90 GPU it is built for
    sm_90a."""
    from test_cuda_runtime import install_fake_pycuda

    from dlcc.errors import CompileError
    from dlcc.executor import make_runtime

    drv = install_fake_pycuda(monkeypatch)
    spec = plain_spec(128, 768, 768, True, b_dtype="bfloat16", a_dtype="bfloat16")
    src = render([gemm_source("g", spec, wgmma_tilings("bf16")[0])], "cuda")
    monkeypatch.setattr(drv.Device, "compute_capability", lambda self: (8, 0))
    with pytest.raises(CompileError, match=r"wgmma: sm_90 only.*this GPU is sm_80"):
        make_runtime("cuda").compile(src)


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed on this machine")
@pytest.mark.parametrize("name,pipeline", [("bert", "astitch"), ("gpt2", "full")])
def test_nvcc_builds_wgmma_plans_unserialized(model_path, tmp_path, monkeypatch, name, pipeline):
    """The CUDA build of a wgmma plan (sm_90a): no spills, and ptxas serializes no wgmma (its
    warning C7510, which a wgmma rTask behind a persistent kernel's out-of-line call site drew:
    passes/rammer.py inlines those call sites)."""
    import dlcc
    from dlcc.compiler import wgmma_serialized
    from dlcc.kernels import gemm_mma

    monkeypatch.setattr(gemm_mma, "mma_tilings", lambda precision="tf32", deep=False: ())
    cm = dlcc.compile(model_path(name), target="cuda", pipeline=pipeline, device=_wgmma_h100(tmp_path),
                      precision="bf16")
    cuda = cm.plan["cuda"]
    assert cuda["arch"] == "sm_90" and "wgmma_serialized" not in cuda, cuda.get("wgmma_serialized")
    assert not any(r["spill_bytes"] for r in cuda["resources"].values()), cuda["resources"]
    assert wgmma_serialized("ptxas info    : (C7510) Potential Performance Loss: wgmma.mma_async instructions are "
                            "serialized due to a reason in the function 'k'") == {"k": "a reason"}


def test_a_spec_that_turns_wgmma_on_for_another_arch_is_refused(tmp_path):
    """A device YAML with `gemm_wgmma: true` on an sm_80 spec is one error naming the file and the
    field, not a switch silently ignored."""
    from conftest import device_with

    from dlcc.errors import DlccError

    path = device_with(tmp_path, "a100", gemm_wgmma=True)
    with pytest.raises(DlccError, match=r"(?s)a100-with\.yaml.*gemm_wgmma.*sm_90 GPUs alone.*sm_80"):
        load_device(str(path))


def test_rammer_retiles_wgmma_gemms_only_to_tilings_a_persistent_kernel_holds(tmp_path):
    """Rammer re-tiles a wave's GEMMs within their template; for wgmma ones, only to tilings in
    static shared memory (five of the seven are dynamic, which a persistent kernel's rTask takes
    only on some specs). Re-tiled to a dynamic one, the run lost its rOperator (a KeyError in the
    `rammer` pass: BERT-base's plan and `dlcc estimate` on a wgmma spec)."""
    import dlcc
    from conftest import parallel_gemms
    from dlcc.kernels.gemm import tiling_and_cost

    path = parallel_gemms(tmp_path / "g.onnx", 3, M=128, K=768, N=768)
    for pipeline in ("rammer", "full"):
        cm = dlcc.compile(path, target="opencl", pipeline=pipeline, device=_wgmma_h100(tmp_path), precision="bf16")
        (L,) = [L for L in cm.plan["launches"] if L.get("rprogram")]
        tilings = [g[0] for w in L["rprogram"]["waves"] for g in w["gemms"]]
        assert tilings and all("_wg" in t and not tiling_and_cost(t)[0].dynamic for t in tilings), tilings
