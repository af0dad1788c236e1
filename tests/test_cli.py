"""The CLI as a user runs it: compile → run → verify → inspect, JSON shapes, config listings."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from dlcc.config import builtin_names, load_device, load_pipeline

from test_bad_input import EXAMPLE, cli


def test_compile_run_verify_inspect(tmp_path):
    art = tmp_path / "r.dlcc"
    rc, out, err = cli("compile", EXAMPLE, "-o", art, "--target", "opencl")
    assert rc == 0, err
    assert {p.name for p in art.iterdir()} == {"kernels.cu", "kernels.cl", "plan.json", "weights.bin", "launcher.py"}
    # Same kernel text, two preludes.
    cu, cl = (art / "kernels.cu").read_text(), (art / "kernels.cl").read_text()
    assert cu.split("---- kernels emitted by dlcc ----")[1] == cl.split("---- kernels emitted by dlcc ----")[1]

    x = np.random.default_rng(3).standard_normal((1, 3, 32, 32)).astype(np.float32)
    np.savez(tmp_path / "in.npz", input=x)
    rc, out, err = cli("run", art, "-i", tmp_path / "in.npz", "-o", tmp_path / "out.npz", "--target", "opencl", "--json")
    assert rc == 0, err
    info = json.loads(out)
    assert info["outputs"][0]["name"] == "logits"
    from conftest import run_ort

    (ref,) = run_ort(EXAMPLE, {"input": x})
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["logits"], ref, rtol=1e-4, atol=1e-5)

    rc, out, err = cli("verify", EXAMPLE, "--json", "--target", "opencl")
    assert rc == 0, err
    v = json.loads(out)
    assert v["passed"] is True and v["outputs"][0]["passed"] is True
    assert {"name", "max_abs_err", "max_rel_err", "passed"} <= set(v["outputs"][0])

    # --rtol/--atol are the tolerances applied: the errors above are not zero, so rtol = atol = 0
    # fails with exit 1; atol alone at twice the largest error passes, and so does rtol alone at
    # twice the largest relative error (atol 0 makes max_rel_err |d| / |ref|).
    worst = max(o["max_abs_err"] for o in v["outputs"])
    assert worst > 0, v
    rc, out, err = cli("verify", EXAMPLE, "--json", "--target", "opencl", "--rtol", "0", "--atol", "0")
    v = json.loads(out)
    assert rc == 1 and v["passed"] is False and (v["rtol"], v["atol"]) == (0, 0), (rc, v)
    worst_rel = max(o["max_rel_err"] for o in v["outputs"])
    assert 0 < worst_rel < float("inf"), v
    for rtol, atol in ((0.0, 2 * worst), (2 * worst_rel, 0.0)):
        rc, out, err = cli("verify", EXAMPLE, "--json", "--target", "opencl", "--rtol", repr(rtol), "--atol", repr(atol))
        v = json.loads(out)
        assert rc == 0 and v["passed"] is True and (v["rtol"], v["atol"]) == (rtol, atol), (rc, v, err)

    for target in (EXAMPLE, art):
        rc, out, err = cli("inspect", target, "--json")
        assert rc == 0, err
        s = json.loads(out)
        for key in ("kernels", "launches", "dram_bytes", "lower_bound_bytes", "arena_bytes", "naive_bytes"):
            assert isinstance(s[key], int), key
        assert s["lower_bound_bytes"] <= s["dram_bytes"]
    rc, out, err = cli("inspect", EXAMPLE)
    assert rc == 0 and "launches per inference" in out
    # the pass log, one row per line the passes wrote (what they decided and why)
    said = out[out.index("what the passes said"):]
    assert "lower" in said and "kernel(s)" in said and "memplan" in said


def test_launcher_runs_alone(tmp_path):
    import subprocess
    import sys

    art = tmp_path / "r.dlcc"
    assert cli("compile", EXAMPLE, "-o", art, "-q")[0] == 0
    p = subprocess.run([sys.executable, str(art / "launcher.py"), "--target", "opencl"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "logits (1, 10) float32" in p.stdout


def test_quiet_and_progress(tmp_path):
    rc, out, err = cli("compile", EXAMPLE, "-o", tmp_path / "a", "--quiet")
    assert rc == 0 and out == "" and err == ""
    rc, out, err = cli("compile", EXAMPLE, "-o", tmp_path / "b", "--no-cache")
    assert rc == 0 and "pass lower" in err and "compiled" in out
    rc, out, err = cli("compile", EXAMPLE, "-o", tmp_path / "c")  # the first compile's cache entry
    assert rc == 0 and "cache lookup" in err and "from cache" in out and "pass lower" not in err


def test_builtin_configs_load():
    assert {"h100", "a100", "v100", "rtx2080ti", "pocl-cpu"} <= set(builtin_names("devices"))
    for n in builtin_names("devices"):
        d = load_device(n)
        assert d.sms > 0 and d.dram_bandwidth_gbps > 0 and "float32" in d.peak_tflops
    assert "baseline" in builtin_names("pipelines")
    for n in builtin_names("pipelines"):
        load_pipeline(n)
    for what in ("ops", "devices", "pipelines", "passes"):
        rc, out, err = cli("list", what, "--json")
        assert rc == 0, err
        assert json.loads(out)
    rc, out, err = cli("list", "stuff")
    assert rc != 0 and "choose ops" in err
    # every pass's options, with their defaults and what they set, as a pipeline file writes them
    rc, out, err = cli("list", "passes", "--json")
    opts = {r["pass"]: r["options (pipeline YAML: name = default: what it sets)"] for r in json.loads(out)}
    from dlcc.passes import PASSES

    for name, p in PASSES.items():
        assert all(f"{field} = " in opts[name] for field in p.options.model_fields), name
    assert "blocks_per_sm = 1: resident blocks per SM" in opts["rammer"] and "attention = auto" in opts["astitch"]


def test_device_choice_changes_tiling_not_numerics(tmp_path):
    import dlcc

    a = dlcc.compile(EXAMPLE, target="opencl", device="pocl-cpu")
    b = dlcc.compile(EXAMPLE, target="opencl", device="h100")
    feeds = a.sample_inputs()
    np.testing.assert_allclose(a(feeds)["logits"], b(feeds)["logits"], rtol=1e-4, atol=1e-5)
    assert Path(EXAMPLE).exists()


def test_register_spills_are_counted_with_their_kernel_and_reported(capsys):
    """A persistent kernel's call sites are out-of-line functions, which ptxas lists under mangled
    names: their spills count as the kernel's. `dlcc compile` then prints one warning line."""
    from dlcc.backends.nvcc import Usage
    from dlcc.cli import _warn_spills
    from dlcc.compiler import kernel_spills

    usage = {"Rammer_Stitch_ab12": Usage("Rammer_Stitch_ab12", "sm_90"),
             "_ZN41_INTERNAL_c0f0Rammer_Stitch_ab12_site2EPfS0_": Usage("x", "sm_90", spill_stores=204, spill_loads=212),
             "_ZN41_INTERNAL_c0f0Rammer_Stitch_ab12_site6EPfS0_": Usage("x", "sm_90", spill_stores=8),
             "MatMul_64x64_cd34": Usage("MatMul_64x64_cd34", "sm_90", spill_stores=4, spill_loads=4),
             "Relu_ef56": Usage("Relu_ef56", "sm_90")}
    kernels = ["Rammer_Stitch_ab12", "MatMul_64x64_cd34", "Relu_ef56"]
    assert kernel_spills(usage, kernels) == {"Rammer_Stitch_ab12": 424, "MatMul_64x64_cd34": 8}

    _warn_spills({"cuda": {"arch": "sm_90", "resources": {"Relu_ef56": {"spill_bytes": 0}}}})
    assert "spill" not in capsys.readouterr().err
    _warn_spills({"cuda": {"arch": "sm_90", "resources": {k: {"spill_bytes": b} for k, b in
                                                          kernel_spills(usage, kernels).items()}}})
    err = capsys.readouterr().err
    assert "spilled registers in 2 kernel(s)" in err and "Rammer_Stitch_ab12 (424 B)" in err


def test_python_dash_m_dlcc_is_the_cli(tmp_path):
    """`python -m dlcc` runs the same CLI as the console script (where that script is not on
    PATH), with its exit codes: a listing succeeds, a bad command fails with usage."""
    import subprocess
    import sys

    ok = subprocess.run([sys.executable, "-m", "dlcc", "list", "devices"], capture_output=True, text=True, cwd=tmp_path)
    assert ok.returncode == 0 and "h100" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "dlcc", "no-such-command"], capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode != 0 and "no-such-command" in bad.stdout + bad.stderr


def test_verify_binds_dynamic_dims_from_its_inputs(tmp_path):
    """`verify -i FILE` on a model with a dynamic dim compiles for the arrays it is given (as a
    user of silero-vad's op15 export, batch x sequence, would try it); --shape still wins, and
    an array that is no input is named by the one error."""
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "dyn",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])])
    model = tmp_path / "dyn.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), model)
    np.savez(tmp_path / "in.npz", x=np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32))
    rc, out, err = cli("verify", model, "-i", tmp_path / "in.npz", "--target", "opencl", "--json")
    assert rc == 0, err
    assert json.loads(out)["outputs"][0]["shape"] == [3, 5]
    rc, out, err = cli("verify", model, "-i", tmp_path / "in.npz", "-s", "x=2x5", "--target", "opencl")
    assert rc != 0 and "Traceback" not in err and "x" in err
    np.savez(tmp_path / "bad.npz", z=np.zeros((3, 5), np.float32))
    rc, out, err = cli("verify", model, "-i", tmp_path / "bad.npz", "--target", "opencl")
    assert rc != 0 and "Traceback" not in err and "'batch'" in err, err
