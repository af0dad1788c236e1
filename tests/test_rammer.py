"""The rammer pass (passes/rammer.py): table-driven rPrograms in persistent kernels. Whole models
against onnxruntime on PoCL (the built-in pipelines in test_numerics/test_hf_zoo; here variants
that always join waves, so that grid barriers run), waves from dependencies, the LSTM layers x time
wavefront, the co-residency refusal, repeated runs, a long rProgram, and nvcc for the kernels."""
from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import dlcc
from dlcc.verify import verify_outputs

from conftest import SMALL_MODELS, export_model, parallel_gemms
from test_hf_zoo import NAMES as HF_NAMES
from test_hf_zoo import _export as hf_export


def _pipeline(d, name, passes, rammer_opts):
    p = d / f"{name}.yaml"
    lines = [f"name: {name}", "passes:"]
    for x in passes:
        if x == "rammer":
            lines += ["  - name: rammer", f"    options: {rammer_opts}"]
        elif x == "lower":
            lines += ["  - name: lower", "    options: {rnn_input: per-step}"]
        else:
            lines.append(f"  - name: {x}")
    p.write_text("\n".join(lines) + "\n")
    return str(p)


@pytest.fixture(scope="module")
def pipes(tmp_path_factory):
    d = tmp_path_factory.mktemp("pipes")
    base = ["simplify", "lower", "rammer", "memplan"]
    full = ["simplify", "fold-bn", "lower", "astitch", "rammer", "memplan"]
    return {
        "rammer-joined": _pipeline(d, "rammer-joined", base, "{join: always}"),
        "full-joined": _pipeline(d, "full-joined", full, "{join: always}"),
        "rammer-long": _pipeline(d, "rammer-long", base, "{join: always, call_sites: 6}"),
        "rammer-counters": _pipeline(d, "rammer-counters", base, "{join: always, sync: counters}"),
        "full-counters": _pipeline(d, "full-counters", full, "{join: always, sync: counters}"),
    }


def _check(path, m, seed=0):
    feeds = m.sample_inputs(seed)
    got = m(feeds)
    rows = verify_outputs(path, got, feeds, 1e-3, 1e-4)
    assert all(r["passed"] for r in rows), rows
    return feeds, got


#: Joined runs in the default suite: one model per mechanism (the LSTM wavefront; attention, and
#: stitched rTasks with block barriers, through AStitch). PoCL takes minutes to compile the bigger persistent
#: kernels (yolo: ~5 min), so every other model x pipeline (vit rammer-joined, which once hung,
#: among them) runs under `-m slow`; the built-in pipelines run on every model in test_numerics.
_JOINED_DEFAULT = {("lstm-tc", "rammer-joined"), ("bert", "full-joined"), ("cnn", "rammer-counters"),
                   ("bert", "full-counters")}
_JOINED = [pytest.param(m, p, marks=() if (m, p) in _JOINED_DEFAULT else pytest.mark.slow)
           for m in ["cnn", "mobilenet", "yolo", "ocr", "lstm", "lstm-tc", "bert", "gpt2", "vit"]
           for p in ["rammer-joined", "full-joined", "rammer-counters", "full-counters"]]


@pytest.mark.parametrize("model,pipeline", _JOINED)
def test_joined_rprograms_match_onnxruntime(model, pipeline, pipes):
    """Every run joined into one persistent kernel (grid barriers between waves, or dependency
    counters: `sync: counters`) on PoCL."""
    path = export_model(model)
    m = dlcc.compile(path, target="opencl", pipeline=pipes[pipeline])
    base = dlcc.compile(path, target="opencl", pipeline="baseline" if pipeline.startswith("rammer") else "astitch")
    assert any(L["op_type"] == "Rammer" and L.get("grid_sync") for L in m.plan["launches"])
    assert len(m.plan["launches"]) < len(base.plan["launches"])
    # (gpt2 and vit have none: their LayerNorms fold into the GEMMs, attention is one rOperator)
    if pipeline.startswith("full") and model in ("bert", "ocr"):
        assert stitched_rtasks_with_barriers(m), "no stitched kernel with block barriers ran as an rTask"
    feeds, first = _check(path, m)
    if "counters" in pipeline:  # no grid barrier: per-entry dependency counters, left at zero
        assert any((L.get("rprogram") or {}).get("sync") == "counters" for L in m.plan["launches"])
        assert not _sync_words(m).any()
    if (model, pipeline) in (("bert", "full-joined"), ("bert", "full-counters")):  # (here: one PoCL build)
        _repeated_runs_and_a_run_after_an_exception_are_identical(m, feeds, first)


def _repeated_runs_and_a_run_after_an_exception_are_identical(m, feeds, first):
    """Grid-barrier counters stay balanced: runs back to back, and after a refused run, agree bit
    for bit."""
    with pytest.raises(dlcc.DlccError):
        m({k: v[..., :1] for k, v in feeds.items()})  # wrong shapes: refused before any launch
    for _ in range(2):
        again = m(feeds)
        for k in first:
            assert np.array_equal(first[k], again[k])


def stitched_rtasks_with_barriers(m) -> list[str]:
    """AStitch kernels with block barriers (Add+LayerNorm, reductions) called from a persistent kernel."""
    text = "\n".join(m.kernel_codes)
    codes = {k["name"]: c for k, c in zip(m.plan["kernels"], m.kernel_codes)}
    found = []
    for L in m.plan["launches"]:
        if L["op_type"] == "Rammer":  # its call sites and its loop follow the rProgram comment
            for t in re.findall(r"\b(Stitch_\w+?)_task\(", codes[L["kernel"]].split("/* rProgram")[1]):
                i = text.index(f"void {t}_task(")
                if "BARRIER()" in text[i:text.index("\n}\n", i)]:
                    found.append(t)
    return found


def _branches(path):
    """x -> Relu -> a; x -> Sigmoid -> b; a + b -> y: two independent ops, then one that needs both."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 1000])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 1000])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Sigmoid", ["x"], ["b"]),
                           helper.make_node("Add", ["a", "b"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_pocl_spinning_grids_leave_a_worker_thread_spare():
    """dlcc fixes PoCL's worker threads when it is imported (before the platform is touched) and
    proves at most threads - 1 work-groups resident: with 2 threads, a 2-group spinning grid hung."""
    import os

    from dlcc.backends import opencl
    from dlcc.executor import make_runtime

    assert opencl.POCL_THREADS == int(os.environ["POCL_MAX_PTHREAD_COUNT"])
    rt = make_runtime("opencl")
    if "portable computing language" not in rt.device.platform.name.lower():
        pytest.skip("not PoCL")
    rt.compile("__kernel void k(__global int* x) { x[get_global_id(0)] = 1; }")
    assert 1 <= rt.resident_blocks(rt.kernel("k"), 256) <= opencl.POCL_THREADS - 1


def test_independent_ops_share_a_wave_and_the_schedule_is_a_table(tmp_path, pipes):
    path = _branches(tmp_path / "b.onnx")
    m = dlcc.compile(path, target="opencl", pipeline=pipes["rammer-joined"])
    (L,) = m.plan["launches"]
    assert L["op_type"] == "Rammer" and L.get("grid_sync") and m.plan["storages"].get("sync")
    rp = L["rprogram"]
    assert [w["ops"] for w in rp["waves"]] == [2, 1] and rp["call_sites"] == 3 and rp["sync_points"] == 2
    src = m.source("opencl")
    # One call site per rOperator, one grid barrier in the wave loop: code does not grow with waves.
    assert src.count("/* call site ") == 3 and src.count("dlcc_grid_sync(rsync + rslot);") == 1
    # The table: wave starts [0, 2, 3], then per entry (call site, first rTask, rTask count) and a
    # (storage, element offset) pair per tensor operand (3 slots: Add has x-derived a, b and y).
    tab = next(t for n, t in m.plan["tensors"].items() if n.startswith("%rtab"))
    table = np.frombuffer(m.weights, np.int32, count=tab["nbytes"] // 4, offset=tab["offset"])
    grid = L["rprogram"]["waves"][1]["tasks"]
    es = 3 + 2 * 3
    e0, e1, e2 = (table[3 + k * es:3 + (k + 1) * es] for k in range(3))
    assert list(table[:3]) == [0, 2, 3] and list(e0[:3]) == [0, 0, grid] and list(e1[:3]) == [1, grid, grid]
    assert list(e2[:3]) == [2, 0, grid]
    storages = [a["storage"] for a in L["args"] if "storage" in a]  # the kernel's storage parameters, in order
    placed = {(t["storage"], t["offset"]) for t in m.plan["tensors"].values()}

    def operands(e, n):
        return [(storages[e[3 + 2 * j]], 4 * int(e[4 + 2 * j])) for j in range(n)]
    for e, n in ((e0, 2), (e1, 2), (e2, 3)):
        assert set(operands(e, n)) <= placed
    assert operands(e0, 2)[0] == operands(e1, 2)[0] == ("input:0", 0) and operands(e2, 3)[2] == ("output:0", 0)
    assert {operands(e2, 3)[0], operands(e2, 3)[1]} == {operands(e0, 2)[1], operands(e1, 2)[1]}
    x = m.sample_inputs(3)["x"]
    np.testing.assert_allclose(m({"x": x})["y"], np.maximum(x, 0) + 1 / (1 + np.exp(-x)), rtol=1e-5, atol=1e-6)


def _diamond(path):
    """x -> Relu -> a -> Neg -> c; x -> Sigmoid -> b; b + c -> y: three waves, where Neg needs only
    Relu and Add needs Sigmoid and Neg."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 1000])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 1000])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Sigmoid", ["x"], ["b"]),
                           helper.make_node("Neg", ["a"], ["c"]), helper.make_node("Add", ["b", "c"], ["y"])],
                          "g", [x], [y])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _sync_words(m) -> np.ndarray:
    """The plan's sync storage (grid-barrier and dependency counters) as the device holds it."""
    ex = m._exec
    out = np.zeros(m.plan["storages"]["sync"] // 4, np.int32)
    ex.rt.read(ex.storages["sync"], 0, out)
    return out


def test_dependency_counters_wait_only_for_the_entries_they_conflict_with(tmp_path, pipes):
    """`sync: counters`: no grid barrier; before its first rTask of an entry a block waits for the
    entries that one conflicts with, each to have counted all its rTasks done. The dependency lists
    follow the entries in the table, as (entry, rTask count) pairs; every launch leaves the counters
    at zero, so runs back to back (and after a refused one) agree with numpy."""
    path = _diamond(tmp_path / "d.onnx")
    m = dlcc.compile(path, target="opencl", pipeline=pipes["rammer-counters"])
    (L,) = m.plan["launches"]
    rp = L["rprogram"]
    assert L["op_type"] == "Rammer" and L.get("grid_sync") and rp["sync"] == "counters"
    assert [w["ops"] for w in rp["waves"]] == [2, 1, 1] and rp["dependencies"] == 3
    src = m.source("opencl")
    assert "dlcc_wait_counts(rsync + rslot" in src and "dlcc_counters_leave(rsync + rslot, 4);" in src
    assert "dlcc_grid_sync(rsync + rslot)" not in src
    tab = next(t for n, t in m.plan["tensors"].items() if n.startswith("%rtab"))
    table = np.frombuffer(m.weights, np.int32, count=tab["nbytes"] // 4, offset=tab["offset"])
    nw, es = 3, 3 + 2 + 2 * 3  # entry: site, first rTask, count, dependency start and length, 3 operand slots
    entries = [table[nw + 1 + k * es:nw + 1 + (k + 1) * es] for k in range(4)]
    deps_at = nw + 1 + 4 * es
    names = [op for w in m.plan["rprogram"][0]["wave_ops"] for op in w]
    deps = {names[k].split()[0]: sorted(names[int(table[deps_at + j])].split()[0]
                                        for j in range(e[3], e[3] + 2 * e[4], 2)) for k, e in enumerate(entries)}
    assert deps == {"Relu": [], "Sigmoid": [], "Neg": ["Relu"], "Add": ["Neg", "Sigmoid"]}, deps
    for k, e in enumerate(entries):  # each wait is for every rTask of the entry waited on
        for j in range(e[3], e[3] + 2 * e[4], 2):
            assert table[deps_at + j + 1] == entries[table[deps_at + j]][2]
    for seed in range(3):
        x = m.sample_inputs(seed)["x"]
        np.testing.assert_allclose(m({"x": x})["y"], 1 / (1 + np.exp(-x)) - np.maximum(x, 0), rtol=1e-5, atol=1e-6)
        assert not _sync_words(m).any()
        with pytest.raises(dlcc.DlccError):
            m({"x": x[:, :1]})


def _mixed_blocks(path):
    """Softmax over 16 (a 32-thread row rTask), MatMul (256-thread GEMM tiles), LayerNorm over 64 and
    ReduceSum over 64 (64-thread rTasks), each with its own shared-memory need, in one chain."""
    rng = np.random.default_rng(1)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 64])
    inits = [helper.make_tensor("W", TensorProto.FLOAT, [16, 64], rng.standard_normal(16 * 64)),
             helper.make_tensor("g", TensorProto.FLOAT, [64], rng.standard_normal(64)),
             helper.make_tensor("b", TensorProto.FLOAT, [64], rng.standard_normal(64)),
             helper.make_tensor("ax", TensorProto.INT64, [1], [1])]
    nodes = [helper.make_node("Softmax", ["x"], ["s"], axis=-1), helper.make_node("MatMul", ["s", "W"], ["m"]),
             helper.make_node("LayerNormalization", ["m", "g", "b"], ["n"], axis=-1),
             helper.make_node("ReduceSum", ["n", "ax"], ["r"], keepdims=1), helper.make_node("Add", ["n", "r"], ["y"])]
    g = helper.make_graph(nodes, "mixed", [x], [y], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_mixed_block_sizes_share_one_persistent_kernel(tmp_path, pipes):
    """Block-size normalisation: 32- and 64-thread row rTasks and 256-thread GEMM tiles, with
    different shared-memory needs, in one persistent kernel of 256 threads whose shared memory is
    the max over them; threads past an rTask's own block skip its work and join its barriers.
    The grid barriers and the normalised rTasks run on PoCL and match onnxruntime."""
    path = _mixed_blocks(tmp_path / "mixed.onnx")
    base = dlcc.compile(path, target="opencl", pipeline="baseline")
    blocks = {L["block"] for L in base.plan["launches"]}
    assert {32, 64, 256} <= blocks
    # Planned for an H100 (on a CPU device the small rTasks stay apart: PoCL runs work-items one
    # after another, so idle threads would cost real time), run on PoCL.
    cpu = dlcc.compile(path, target="opencl", pipeline=pipes["rammer-joined"])
    assert any(L["block"] < 256 for L in cpu.plan["launches"])
    m = dlcc.compile(path, target="opencl", pipeline=pipes["rammer-joined"], device="h100")
    (L,) = m.plan["launches"]
    assert L["op_type"] == "Rammer" and L.get("grid_sync") and L["block"] == 256
    entries = [e for w in L["rprogram"]["waves"] for e in w["entries"]]
    assert {e[2] for e in entries} == blocks and len(entries) == len(base.plan["launches"])
    smems = {k["smem_bytes"] for k in base.plan["kernels"] if k["block"] < 256}
    # the same launches planned for the H100 apart (its GEMM tiling is not the CPU device's)
    apart = dlcc.compile(path, target="opencl", pipeline="baseline", device="h100")
    assert len(smems) > 1 and {k["smem_bytes"] for k in m.plan["kernels"]} == {
        max(k["smem_bytes"] for k in apart.plan["kernels"])}
    rk = m.plan["rprogram"][0]["rkernels"]
    assert any("block-normalised" in r["why"] for r in rk)
    for seed in (0, 1):
        _check(path, m, seed)


def test_rtask_times_come_from_the_profile_database(tmp_path, pipes, capsys):
    """`dlcc profile` measures the baseline launches; compiling with --profile-db prices each wave
    whose launches were all measured from those times (costmodel.rprogram_time), and the plan says
    where the times came from."""
    from typer.testing import CliRunner

    from dlcc.cli import app
    from dlcc.config import load_device
    from dlcc.estimate.profiledb import ProfileDB

    path = _branches(tmp_path / "b.onnx")
    db = tmp_path / "db.json"
    r = CliRunner().invoke(app, ["profile", str(path), "--db", str(db), "-t", "opencl", "--repeat", "2", "-q"])
    assert r.exit_code == 0, r.output
    m = dlcc.compile(path, target="opencl", pipeline=pipes["rammer-joined"], profile_db=db)
    (rp,) = m.plan["rprogram"]
    assert rp["time_source"].startswith("profile:db.json: 3 of 3 rTask launches measured") and m.plan["meta"]["profile_db"] == "db.json"
    dev, store = load_device("pocl-cpu"), ProfileDB.load(db)
    (L,) = m.plan["launches"]
    base = dlcc.compile(path, target="opencl", pipeline="baseline")
    # busy time: the measurement less the fixed cost, never below 0 (measured_busy): on PoCL a Relu
    # can run in less than pocl-cpu's kernel_fixed_us (4.84 µs), which made this test flaky
    busy = {Lb["op_type"]: max(0.0, store.lookup(dev.name, Lb) - dev.kernel_fixed_us) for Lb in base.plan["launches"]}
    w0 = L["rprogram"]["waves"][0]
    assert sorted(b for b, _ in w0["measured"]) == pytest.approx(sorted([busy["Relu"], busy["Sigmoid"]]), abs=1e-3)
    v = min(L["rprogram"]["veus"], dev.sms)
    expect = max(busy["Relu"], busy["Sigmoid"], sum(b * min(t, dev.sms) for b, t in w0["measured"]) / v)
    # PoCL builds the persistent kernel unoptimised: the device spec's slowdown and per-rTask cost
    # (the latter on the last wave)
    expect *= dev.unoptimised_slowdown
    waves = L["rprogram"]["waves"]
    if len(waves) == 1:
        expect += -(-sum(w["tasks"] for w in waves) // dev.sms) * dev.unoptimised_task_us
    assert rp["predicted_us_per_wave"][0] == pytest.approx(expect, abs=1e-2)
    plain = dlcc.compile(path, target="opencl", pipeline=pipes["rammer-joined"])
    assert "no profile database" in plain.plan["rprogram"][0]["time_source"]
    assert "measured" not in plain.plan["launches"][0]["rprogram"]["waves"][0]
    from dlcc.cli import main

    with pytest.raises(SystemExit) as e:  # a missing database: a clear error before any work
        main(["inspect", str(path), "-p", pipes["rammer-joined"], "--rprogram", "--quiet",
              "--profile-db", str(tmp_path / "missing.json")])
    assert e.value.code != 0 and "profile database not found" in capsys.readouterr().err


def test_rkernel_choice_per_wave(tmp_path):
    """The wavefront policy on an H100 plan: two GEMMs that leave vEUs idle keep their fastest
    tiling; four that fill the 132 vEUs switch to the tiling that minimises the wave's modelled
    time counting time x threads, and the report says why. The re-tiled plan runs right on PoCL."""
    from dlcc.config import load_device
    from dlcc.kernels.gemm import choose_tiling, tiling_cost, tilings_for

    dev = load_device("h100")
    family = tilings_for(dev)  # the device's SIMT tilings, split along K too (kernels/splitk.py)
    fastest = choose_tiling(1, 128, 768, 768, dev)
    two = dlcc.compile(parallel_gemms(tmp_path / "two.onnx", 2), target="opencl", pipeline="rammer", device="h100")
    rk = two.plan["rprogram"][0]["rkernels"]
    assert len(rk) == 2 and all(_tiling_of(r, family) == fastest and "chosen for its wave" not in r["why"] for r in rk)
    path = parallel_gemms(tmp_path / "four.onnx", 4)
    four = dlcc.compile(path, target="opencl", pipeline="rammer", device="h100")
    (rp,) = four.plan["rprogram"]
    assert rp["tasks_per_wave"][0] >= rp["veus"]
    tilings = {_tiling_of(r, family) for r in rp["rkernels"]}
    assert len(rp["rkernels"]) == 4 and len(tilings) == 1 and fastest not in tilings
    (chosen,) = tilings
    one = dev.model_copy(update={"sms": 1})

    def wave(t):
        return max(tiling_cost(t, 1, 128, 768, 768, dev), 4 * tiling_cost(t, 1, 128, 768, 768, one) / rp["veus"])
    assert wave(chosen) == min(wave(t) for t in family) < wave(fastest)
    assert all("chosen for its wave" in r["why"] for r in rp["rkernels"])
    _check(path, four)


def test_rkernel_policy_option(tmp_path):
    """`kernels: fastest` keeps the lowering's tiling even where the wave fills the vEUs;
    `kernels: efficient` takes the least SM-time tiling even where it does not."""
    from dlcc.config import load_device
    from dlcc.kernels.gemm import choose_tiling, tiling_cost, tilings_for

    dev = load_device("h100")
    TILINGS = tilings_for(dev)  # the GPU-only tilings too: rammer re-tiles among the device's
    one = dev.model_copy(update={"sms": 1})
    fastest = choose_tiling(1, 128, 768, 768, dev)
    leanest = min(TILINGS, key=lambda t: tiling_cost(t, 1, 128, 768, 768, one))
    assert leanest != fastest
    base = ["simplify", "lower", "rammer", "memplan"]

    def tilings(n, policy):
        pipe = _pipeline(tmp_path, policy, base, f"{{kernels: {policy}}}")
        m = dlcc.compile(parallel_gemms(tmp_path / f"{n}.onnx", n), target="opencl", pipeline=pipe, device="h100")
        (rp,) = m.plan["rprogram"]
        assert all(f"kernels: {policy}" in r["why"] for r in rp["rkernels"]), rp["rkernels"]
        return {_tiling_of(r, TILINGS).name for r in rp["rkernels"]}, m

    assert tilings(4, "fastest")[0] == {fastest.name}
    got, m = tilings(2, "efficient")
    assert got == {leanest.name}
    _check(tmp_path / "2.onnx", m)


def _tiling_of(rkernel: dict, family):
    """The tiling of `family` an rKernel report entry names (kernel names are HINT_TILING_HASH)."""
    (t,) = [t for t in family if re.search(rf"_{re.escape(t.name)}_[0-9a-f]+$", rkernel["rkernel"])]
    return t


def test_lstm_layers_run_as_a_wavefront_over_time():
    """Rammer's LSTM-TC case at small size: cell (l, t) waits only for (l, t-1) and (l-1, t), so the
    whole stack is one persistent kernel on an H100 whose waves are the diagonals l + t."""
    path = export_model("lstm-tc")  # 3 layers x 6 steps
    base = dlcc.compile(path, target="opencl", pipeline="baseline", device="h100")
    m = dlcc.compile(path, target="opencl", pipeline="rammer", device="h100")
    assert len(base.plan["launches"]) > 40
    (L,) = m.plan["launches"]
    layers, steps = 3, 6
    gemm_waves = [w for w in L["rprogram"]["waves"] if w["gemm"]]
    # one GEMM wave per diagonal, holding min(diagonal, layers, ...) cells
    assert len(gemm_waves) == steps + layers - 1
    assert [w["ops"] for w in gemm_waves] == [1, 2, 3, 3, 3, 3, 2, 1]
    (rp,) = m.plan["rprogram"]
    assert rp["sync_points"] == len(rp["tasks_per_wave"]) and "SMs x 1 block" in rp["veus_from"]


def _long_lstm(path, seq=120, hidden=8, layers=2):
    """Stacked ONNX LSTM nodes (random weights) with a long sequence: a long rProgram."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    x = "x"
    for i in range(layers):
        for nm, shape in ((f"W{i}", [1, 4 * hidden, hidden]), (f"R{i}", [1, 4 * hidden, hidden]), (f"B{i}", [1, 8 * hidden])):
            inits.append(helper.make_tensor(nm, TensorProto.FLOAT, shape, (0.4 * rng.standard_normal(shape)).ravel()))
        nodes.append(helper.make_node("LSTM", [x, f"W{i}", f"R{i}", f"B{i}"], [f"Y{i}"], hidden_size=hidden))
        nodes.append(helper.make_node("Squeeze", [f"Y{i}", "ax"], [f"y{i}"]))
        x = f"y{i}"
    inits.append(helper.make_tensor("ax", TensorProto.INT64, [1], [1]))
    g = helper.make_graph(nodes, "lstm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, 1, hidden])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [seq, 1, hidden])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)]), path)
    return path


def test_stress_long_rprogram_with_many_sync_points(tmp_path, pipes):
    """Two LSTM layers x 120 steps in one persistent kernel on PoCL (a call site per rOperator, the
    steps' operands from the table), its 240+ waves each ended by a grid barrier; run twice, the
    outputs match onnxruntime and repeat bit for bit."""
    path = _long_lstm(tmp_path / "long.onnx")
    m = dlcc.compile(path, target="opencl", pipeline=pipes["rammer-long"])
    (L,) = m.plan["launches"]
    assert L.get("grid_sync") and L["rprogram"]["sync_points"] >= 240 and L["rprogram"]["entries"] >= 480
    feeds, first = _check(path, m)
    again = m(feeds)
    assert all(np.array_equal(first[k], again[k]) for k in first)


def test_coresidency_refused_falls_back_to_one_launch_per_wave(tmp_path, pipes):
    """A device whose SM cannot hold the persistent kernel's shared memory: no co-residency can be
    proven, so rammer refuses the spin-waiting kernel (log line, report) and emits one launch per
    wave; nothing that waits on other blocks is launched, and the numbers still match."""
    import yaml

    from dlcc.config import builtin_dir

    spec = yaml.safe_load((builtin_dir("devices") / "pocl-cpu.yaml").read_text())
    spec.update(name="tiny-smem", shared_mem_per_sm=2)  # not even the 4-byte minimum fits
    dev = tmp_path / "tiny.yaml"
    dev.write_text(yaml.safe_dump(spec))
    path = export_model("cnn")
    m = dlcc.compile(path, target="opencl", pipeline=pipes["rammer-joined"], device=str(dev))
    assert not any(L["op_type"] == "Rammer" and L.get("grid_sync") for L in m.plan["launches"])
    assert any("refused: co-residency cannot be proven" in line for line in m.plan["meta"]["pass_log"])
    assert all(r["decision"].startswith("refused") and not r["sync_points"] for r in m.plan.get("rprogram", []))
    _check(path, m)


def test_join_never_is_one_launch_per_wave(tmp_path):
    path = _branches(tmp_path / "b.onnx")
    p = tmp_path / "never.yaml"
    p.write_text("name: never\npasses:\n  - name: simplify\n  - name: lower\n  - name: rammer\n"
                 "    options: {join: never}\n  - name: memplan\n")
    m = dlcc.compile(path, target="opencl", pipeline=str(p), device="h100")  # where combining a wave pays
    ops = [L["op_type"] for L in m.plan["launches"]]
    assert ops == ["Rammer", "Add"] and not any(L.get("grid_sync") for L in m.plan["launches"])


def test_join_auto_prices_the_unoptimised_build(tmp_path):
    """A wave of three GEMMs: on an H100 one combined launch pays; on PoCL, which builds Rammer's
    kernels unoptimised (about 40x slower there), the three launches stay apart, as every other
    run of the test models does (a combined BERT MatMul wave was priced as an ordinary kernel,
    120 µs, and ran 6.9 ms against 165 µs apart). Both plans match numpy."""
    path = parallel_gemms(tmp_path / "g.onnx", 3, M=32, K=64, N=64)
    gpu = dlcc.compile(path, target="opencl", pipeline="rammer", device="h100")
    cpu = dlcc.compile(path, target="opencl", pipeline="rammer")
    assert [L["op_type"] for L in gpu.plan["launches"]] == ["Rammer"]
    assert [L["op_type"] for L in cpu.plan["launches"]] == ["MatMul"] * 3
    for m in (gpu, cpu):
        _check(path, m)
    for name in ("bert", "mobilenet"):  # and no test model's built-in plan joins anything on PoCL
        for pipe, plain in (("rammer", "baseline"), ("full", "astitch")):
            a = dlcc.compile(export_model(name), target="opencl", pipeline=pipe)
            assert not [L for L in a.plan["launches"] if L["op_type"] == "Rammer"]
            assert a.stats["launches"] == dlcc.compile(export_model(name), target="opencl", pipeline=plain).stats["launches"]


@pytest.mark.skipif(__import__("dlcc.backends.nvcc", fromlist=["find_nvcc"]).find_nvcc() is None,
                    reason="nvcc is not installed on this machine")
@pytest.mark.parametrize("model", [
    # yolo (20 s here; its plans' rKernels are cnn's and mobilenet's), and the encoders whose
    # kernels bert/vit's already are, run under `-m slow`
    pytest.param(m, marks=pytest.mark.slow) if m in ("yolo", "hf-distilbert", "hf-roberta", "hf-t5-encoder", "hf-deit")
    else m for m in SMALL_MODELS + ["lstm-tc"] + [f"hf-{n}" for n in HF_NAMES]])
def test_persistent_kernels_compile_under_nvcc_without_spills(model, pipes):
    """Every test model's H100 plans through `rammer` and `full` with every run joined (`join:
    always`: the largest persistent kernels those pipelines can make; `join: auto` keeps some runs
    apart on an H100), for sm_80 and sm_90: every kernel, and every out-of-line call site of a
    persistent kernel, compiles with no spill. (Inlined call sites spilled at 255 registers on vit,
    t5 and convnext before SITE_FN and LAUNCH_BOUNDS(n, 1).)"""
    from dlcc.backends.nvcc import compile_cubin

    path = hf_export(model[3:]) if model.startswith("hf-") else export_model(model)
    counters = ("full-counters",) if model in ("cnn", "bert", "lstm-tc") else ()  # (sync: counters' waits)
    for pipeline in ("rammer-joined", "full-joined") + counters:
        m = dlcc.compile(path, target="opencl", pipeline=pipes[pipeline], device="h100")
        assert any(L["op_type"] == "Rammer" for L in m.plan["launches"]), pipeline
        for arch in ("sm_80", "sm_90"):
            usage = compile_cubin(m.source("cuda"), arch)
            sites = [k for k in usage if "_site" in k]
            assert sites and [k for k in usage if k.startswith("Rammer_")], (pipeline, arch)
            assert not {k: u.spill_stores for k, u in usage.items() if u.spills}, (pipeline, arch)


def test_grid_barrier_orders_its_fences():
    """dlcc_grid_sync (DESIGN §3): block barrier, then a fence before the arrive (release); the
    waiter spins on a volatile/atomic load, then fences before the block barrier (acquire)."""
    from dlcc.backends.source import prelude

    src = prelude("cuda")
    body = src[src.index("DEVICE void dlcc_grid_sync("):]
    body = body[:body.index("\n}\n")]
    order = [body.index(s) for s in ("BARRIER();", "FENCE();", "ATOMIC_ADD_I32(bar, 1)",
                                     "while (ATOMIC_LOAD_I32(bar + 1) == gen)")]
    assert order == sorted(order)
    after_spin = body[body.index("while (ATOMIC_LOAD_I32"):]
    assert after_spin.index("FENCE();") < after_spin.rindex("BARRIER();")
    assert "__threadfence()" in src and "volatile" in src


def test_inspect_rprogram_json(tmp_path, pipes):
    import json

    from typer.testing import CliRunner

    from dlcc.cli import app

    path = _branches(tmp_path / "b.onnx")
    r = CliRunner().invoke(app, ["inspect", str(path), "-p", pipes["rammer-joined"], "--rprogram", "--json"])
    assert r.exit_code == 0, r.output
    (rp,) = json.loads(r.output.strip().splitlines()[-1])["rprogram"]
    assert rp["launches"] == 3 and rp["waves"] == 2 and rp["sync_points"] == 2 and rp["call_sites"] == 3
    assert [len(w) for w in rp["wave_ops"]] == [2, 1] and rp["tasks_per_wave"][1] > 0
    assert rp["wave_ops"][0][0].startswith(("Relu", "Sigmoid")) and rp["wave_ops"][1][0].startswith("Add")
    assert rp["decision"] == "join: always (pipeline option)" and len(rp["rkernels"]) == 3
    assert len(rp["predicted_us_per_wave"]) == 2
    r = CliRunner().invoke(app, ["inspect", str(path), "--rprogram", "--quiet"])  # baseline: says what to do
    assert r.exit_code == 0 and "add the rammer pass" in r.output
    r = CliRunner().invoke(app, ["inspect", str(path), "-p", pipes["rammer-joined"], "--rprogram", "--quiet"])
    assert r.exit_code == 0 and "call site" in r.output and "schedule: join: always" in r.output
    r = CliRunner().invoke(app, ["inspect", str(path), "-p", pipes["rammer-counters"], "--rprogram", "--quiet"])
    assert r.exit_code == 0 and "2 dependency wait(s) (sync: counters)" in " ".join(r.output.split()), r.output


def test_blocks_per_sm_caps_registers_and_counts_the_veus(tmp_path):
    """`blocks_per_sm: 2` (issue 20: a persistent kernel at one 256-thread block per SM ran at
    12.5% occupancy where the same convolutions alone ran 3 blocks per SM): the spin-waiting
    kernel is emitted with LAUNCH_BOUNDS_SM(256, 2), so nvcc caps its registers at 128 and an
    SM holds two of its blocks; the vEUs and the plan say 2 x SMs; on PoCL (a CPU device) it is
    1, and the numbers still match onnxruntime. Shared memory that does not fit two blocks gives
    fewer, with a log line."""
    from dlcc.backends.nvcc import compile_cubin, find_nvcc
    from dlcc.config import load_device
    from dlcc.passes.rammer import resident_per_sm

    path = export_model("bert")
    two = _pipeline(tmp_path, "two", ["simplify", "fold-bn", "lower", "astitch", "rammer", "memplan"],
                    "{join: always, blocks_per_sm: 2}")
    m = dlcc.compile(path, target="opencl", pipeline=two, device="h100")
    spin = [L for L in m.plan["launches"] if L.get("grid_sync")]
    assert spin and all(L["rprogram"]["blocks_per_sm"] == 2 for L in spin)
    rep = [r for r in m.plan["rprogram"] if r["sync_points"]]
    assert rep and all("132 SMs x 2 blocks" in r["veus_from"] for r in rep)
    src = m.source("cuda")
    assert all(f"KERNEL void LAUNCH_BOUNDS_SM(256, 2) {L['kernel']}(" in src for L in spin)
    if find_nvcc() is not None:
        usage = compile_cubin(src, "sm_90")
        for L in spin:
            assert usage[L["kernel"]].registers <= 128
    h100 = load_device("h100")
    assert resident_per_sm(h100, 48 * 1024, 2) == 2 and resident_per_sm(h100, 100 * 1024, 4) == 2
    assert resident_per_sm(h100, 0, 8) == 4  # 64 registers a thread at the least: 65536 / (64 x 256)
    assert resident_per_sm(load_device("pocl-cpu"), 0, 2) == 1
    # on PoCL: one block per worker thread whatever was asked, and the same numbers
    cpu = dlcc.compile(path, target="opencl", pipeline=two)
    assert not any(L.get("rprogram", {}).get("blocks_per_sm") for L in cpu.plan["launches"])
    _check(path, cpu)


def test_under_a_cuda_graph_a_separate_launch_costs_no_host_overhead():
    """Planned for an H100 with the launches replayed as one CUDA graph (the CUDA target's
    default), a separate launch costs the device's fixed cost, not the host's launch overhead, so
    Rammer builds no persistent kernel for BERT: on an H200, BERT-base's persistent kernel ran
    1.22-1.36x slower than its graphed launches, and the plan that keeps the waves apart (combining
    only one-wave runs) ran 0.95x torch.compile at bf16. Without a graph the same plan joins."""
    from dlcc.compiler import compile_model
    from dlcc.config import load_device
    from dlcc.passes.rammer import launch_floor_us

    h100 = load_device("h100")
    assert launch_floor_us(h100, True) == h100.kernel_fixed_us < launch_floor_us(h100, False) == h100.launch_overhead_us
    path = export_model("bert")
    plans = {g: compile_model(path, target="opencl", pipeline="full", device="h100", graphs=g).plan for g in (False, True)}
    astitch = compile_model(path, target="opencl", pipeline="astitch", device="h100", graphs=True).plan
    assert any(L.get("grid_sync") for L in plans[False]["launches"])  # joined without a graph
    assert not any(L.get("grid_sync") for L in plans[True]["launches"])  # kept apart under one
    assert len(plans[True]["launches"]) < len(astitch["launches"])  # one-wave runs still combined
    assert plans[True]["meta"]["graphs"] is True
    assert any("(launches in one CUDA graph): kept apart" in line for line in plans[True]["meta"]["pass_log"])
