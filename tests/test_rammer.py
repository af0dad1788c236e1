"""The rammer pass, first version (passes/rammer.py): runs of launches as rTasks in persistent
kernels, wave by wave. Whole models against onnxruntime on PoCL, waves from dependencies, repeated
runs, and nvcc for the persistent kernels."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import dlcc

from conftest import export_model, run_ort

PIPES = {
    "rammer": ["simplify", "lower", "rammer", "memplan"],
    "full": ["simplify", "fold-bn", "lower", "astitch", "rammer", "memplan"],
}


@pytest.fixture(scope="module")
def pipes(tmp_path_factory):
    d = tmp_path_factory.mktemp("pipes")
    out = {}
    for name, passes in PIPES.items():
        p = d / f"{name}.yaml"
        p.write_text(f"name: {name}\npasses:\n" + "".join(f"  - name: {x}\n" for x in passes))
        out[name] = str(p)
    return out


@pytest.mark.parametrize("pipeline", list(PIPES))
@pytest.mark.parametrize("model", ["cnn", "mobilenet", "ocr", "lstm", "bert", "gpt2"])
def test_models_match_onnxruntime(model, pipeline, pipes):
    path = export_model(model)
    m = dlcc.compile(path, target="opencl", pipeline=pipes[pipeline])
    base = dlcc.compile(path, target="opencl", pipeline="baseline" if pipeline == "rammer" else "astitch")
    persistent = [L for L in m.plan["launches"] if L["op_type"] == "Rammer"]
    assert persistent and len(m.plan["launches"]) < len(base.plan["launches"])
    feeds = m.sample_inputs(0)
    got = m(feeds)
    ref = run_ort(path, feeds, [o["name"] for o in m.outputs])
    for (name, g), r in zip(got.items(), ref):
        np.testing.assert_allclose(g, r, rtol=1e-3, atol=1e-4, err_msg=name)


def _branches(path):
    """x -> Relu -> a; x -> Sigmoid -> b; a + b -> y: two independent ops, then one that needs both."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 1000])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 1000])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Sigmoid", ["x"], ["b"]),
                           helper.make_node("Add", ["a", "b"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_independent_ops_share_a_wave_and_waves_are_separated_by_a_grid_barrier(tmp_path, pipes):
    path = _branches(tmp_path / "b.onnx")
    m = dlcc.compile(path, target="opencl", pipeline=pipes["rammer"])
    (L,) = m.plan["launches"]
    assert L["op_type"] == "Rammer" and L.get("grid_sync") and m.plan["storages"].get("sync")
    src = m.source("opencl")
    assert src.count("/* wave 0: 2 op(s)") == 1 and src.count("/* wave 1: 1 op(s)") == 1
    assert src.count("dlcc_grid_sync(rsync + rslot);") == 1
    feeds = m.sample_inputs(3)
    x = feeds["x"]
    np.testing.assert_allclose(m(feeds)["y"], np.maximum(x, 0) + 1 / (1 + np.exp(-x)), rtol=1e-5, atol=1e-6)


def test_repeated_runs_are_identical(pipes):
    m = dlcc.compile(export_model("bert"), target="opencl", pipeline=pipes["full"])
    assert any(L.get("grid_sync") and L["op_type"] == "Rammer" for L in m.plan["launches"])
    feeds = m.sample_inputs(0)
    first = m(feeds)
    for _ in range(2):
        again = m(feeds)
        for k in first:
            assert np.array_equal(first[k], again[k])


@pytest.mark.skipif(__import__("dlcc.backends.nvcc", fromlist=["find_nvcc"]).find_nvcc() is None,
                    reason="nvcc is not installed on this machine")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_persistent_kernels_compile_under_nvcc_without_spills(arch, pipes):
    from dlcc.backends.nvcc import compile_cubin

    m = dlcc.compile(export_model("bert"), target="opencl", pipeline=pipes["full"], device="h100")
    usage = compile_cubin(m.source("cuda"), arch)
    rammer = [k for k in usage if k.startswith("Rammer_")]
    assert rammer and not [k for k, u in usage.items() if u.spills]


def test_inspect_rprogram_json(tmp_path, pipes):
    import json

    from typer.testing import CliRunner

    from dlcc.cli import app

    path = _branches(tmp_path / "b.onnx")
    r = CliRunner().invoke(app, ["inspect", str(path), "-p", pipes["rammer"], "--rprogram", "--json"])
    assert r.exit_code == 0, r.output
    (rp,) = json.loads(r.output.strip().splitlines()[-1])["rprogram"]
    assert rp["launches"] == 3 and rp["waves"] == 2 and rp["sync_points"] == 1
    assert [len(w) for w in rp["wave_ops"]] == [2, 1] and rp["tasks_per_wave"][1] > 0
    assert rp["wave_ops"][0][0].startswith(("Relu", "Sigmoid")) and rp["wave_ops"][1][0].startswith("Add")
    r = CliRunner().invoke(app, ["inspect", str(path), "--rprogram", "--quiet"])  # baseline: says what to do
    assert r.exit_code == 0 and "add the rammer pass" in r.output
