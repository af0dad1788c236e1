"""The rammer pass (passes/rammer.py): table-driven rPrograms in persistent kernels. Whole models
against onnxruntime on PoCL (the built-in pipelines in test_numerics/test_hf_zoo; here variants
that always join waves, so that grid barriers run), waves from dependencies, the LSTM layers x time
wavefront, the co-residency refusal, repeated runs, a long rProgram, and nvcc for the kernels."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import dlcc

from conftest import export_model, run_ort


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
    }


def _check(path, m, seed=0):
    feeds = m.sample_inputs(seed)
    got = m(feeds)
    ref = run_ort(path, feeds, [o["name"] for o in m.outputs])
    for (name, g), r in zip(got.items(), ref):
        np.testing.assert_allclose(g, r, rtol=1e-3, atol=1e-4, err_msg=name)
    return feeds, got


@pytest.mark.parametrize("pipeline", ["rammer-joined", "full-joined"])
@pytest.mark.parametrize("model", ["cnn", "mobilenet", "yolo", "ocr", "lstm", "lstm-tc", "bert", "gpt2"])
def test_joined_rprograms_match_onnxruntime(model, pipeline, pipes):
    """Every run joined into one persistent kernel (grid barriers between waves) on PoCL."""
    path = export_model(model)
    m = dlcc.compile(path, target="opencl", pipeline=pipes[pipeline])
    base = dlcc.compile(path, target="opencl", pipeline="baseline" if pipeline.startswith("rammer") else "astitch")
    assert any(L["op_type"] == "Rammer" and L.get("grid_sync") for L in m.plan["launches"])
    assert len(m.plan["launches"]) < len(base.plan["launches"])
    _check(path, m)


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
    # The table: wave starts [0, 2, 3], then (call site, first rTask, rTask count) per entry.
    tab = next(t for n, t in m.plan["tensors"].items() if n.startswith("%rtab"))
    table = np.frombuffer(m.weights, np.int32, count=tab["nbytes"] // 4, offset=tab["offset"])
    grid = L["rprogram"]["waves"][1]["tasks"]
    assert list(table[:3]) == [0, 2, 3] and list(table[3:6]) == [0, 0, grid] and list(table[6:9]) == [1, grid, grid]
    x = m.sample_inputs(3)["x"]
    np.testing.assert_allclose(m({"x": x})["y"], np.maximum(x, 0) + 1 / (1 + np.exp(-x)), rtol=1e-5, atol=1e-6)


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
    """Two LSTM layers x 120 steps in persistent kernels on PoCL: one kernel per layer (6 call sites
    each, PoCL's stack limit), each of 240 waves ended by a grid barrier; run twice, the outputs
    match onnxruntime and repeat bit for bit."""
    path = _long_lstm(tmp_path / "long.onnx")
    m = dlcc.compile(path, target="opencl", pipeline=pipes["rammer-long"])
    Ls = m.plan["launches"]
    assert len(Ls) == 2 and all(L.get("grid_sync") and L["rprogram"]["sync_points"] >= 240 for L in Ls)
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
    assert any(r["decision"].startswith("refused") for r in m.plan["rprogram"])
    _check(path, m)


def test_repeated_runs_and_a_run_after_an_exception_are_identical(pipes):
    m = dlcc.compile(export_model("bert"), target="opencl", pipeline=pipes["full-joined"])
    assert any(L.get("grid_sync") and L["op_type"] == "Rammer" for L in m.plan["launches"])
    feeds = m.sample_inputs(0)
    first = m(feeds)
    with pytest.raises(dlcc.DlccError):
        m({k: v[..., :1] for k, v in feeds.items()})  # wrong shapes: refused before any launch
    for _ in range(2):
        again = m(feeds)
        for k in first:
            assert np.array_equal(first[k], again[k])


def test_join_never_is_one_launch_per_wave(tmp_path):
    path = _branches(tmp_path / "b.onnx")
    p = tmp_path / "never.yaml"
    p.write_text("name: never\npasses:\n  - name: simplify\n  - name: lower\n  - name: rammer\n"
                 "    options: {join: never}\n  - name: memplan\n")
    m = dlcc.compile(path, target="opencl", pipeline=str(p))
    ops = [L["op_type"] for L in m.plan["launches"]]
    assert ops == ["Rammer", "Add"] and not any(L.get("grid_sync") for L in m.plan["launches"])


@pytest.mark.skipif(__import__("dlcc.backends.nvcc", fromlist=["find_nvcc"]).find_nvcc() is None,
                    reason="nvcc is not installed on this machine")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("model,pipeline", [("bert", "full"), ("lstm-tc", "rammer"), ("cnn", "full")])
def test_persistent_kernels_compile_under_nvcc_without_spills(arch, model, pipeline):
    from dlcc.backends.nvcc import compile_cubin

    m = dlcc.compile(export_model(model), target="opencl", pipeline=pipeline, device="h100")
    assert any(L.get("grid_sync") for L in m.plan["launches"] if L["op_type"] == "Rammer")
    usage = compile_cubin(m.source("cuda"), arch)
    rammer = [k for k in usage if k.startswith("Rammer_")]
    assert rammer and not [k for k, u in usage.items() if u.spills]


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
