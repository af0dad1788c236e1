"""Shared fixtures: test models from real exporters (scripts/models.py), cached between runs."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

MODEL_DIR = Path(os.environ.get("DLCC_MODEL_CACHE", ROOT / ".cache" / "models"))

# `dlcc compile` caches artifacts in the user's cache directory by default: tests use their own,
# removed at exit, so that they neither read a developer's entries nor leave theirs behind.
if "DLCC_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["DLCC_CACHE_DIR"] = tempfile.mkdtemp(prefix="dlcc-test-cache-")
    atexit.register(shutil.rmtree, os.environ["DLCC_CACHE_DIR"], True)
SMALL_MODELS = ["cnn", "mobilenet", "yolo", "ocr", "lstm", "gru", "bert", "gpt2", "vit"]


def export_model(name: str, size: str = "small") -> Path:
    """Export (once; cached on disk) a model with the real exporter; needs torch (+ transformers)."""
    pytest.importorskip("torch", reason="test models are exported with torch: run scripts/test.sh, which installs it")
    import models  # scripts/models.py

    MODEL_DIR.mkdir(parents=True, exist_ok=True)
    return models.export(name, MODEL_DIR, size)


@pytest.fixture(scope="session")
def model_path():
    return export_model


def opencl_device_available() -> bool:
    """Whether pyopencl finds an OpenCL device on any platform. Tests skip on this, never on an
    error's text: dlcc's own errors ("the OpenCL compiler rejected the generated kernels (a dlcc
    bug)") say "OpenCL" too."""
    import dlcc  # noqa: F401  (fixes PoCL's worker threads before the platform is first touched)

    try:
        import pyopencl as cl

        platforms = cl.get_platforms()
    except Exception:  # no pyopencl, no ICD loader, or no platform
        return False
    for p in platforms:
        try:
            if p.get_devices():
                return True
        except Exception:  # DEVICE_NOT_FOUND on this platform
            continue
    return False


def device_with(tmp_path, base: str = "h100", **over) -> Path:
    """A device YAML under `tmp_path`: built-in spec `base` with the fields `over` changed (a test
    of what a spec's switch does, such as gemm_deep_pipelines off on an H100)."""
    import yaml

    from dlcc.config import load_device

    d = load_device(base).model_dump()
    d.update(over)
    p = tmp_path / f"{base}-with.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def gemm_plan(named_tilings) -> dict:
    """The plan entries of GEMM kernels `(name, tiling)`, for OpenCLRuntime.compile: a tiling test
    builds each kernel as a plan's kernel on that tiling is built (on PoCL, the GPU-only SIMT
    tilings and the multi-stage fp16/bf16 tensor-core ones from the -cl-opt-disable build, where
    optimising them is what plans avoid; backends/opencl.py builds_unoptimised), not through a
    build that no plan uses."""
    return {"kernels": [{"name": name, "kind": "gemm", "tiling": t.name} for name, t in named_tilings]}


def nvcc_ptx_and_ptxas(src: Path, arch: str) -> tuple[str, str]:
    """The PTX nvcc makes of the CUDA file `src` for `arch`, and ptxas -v's report (registers,
    spills, shared memory) on building it: one front-end run, where `nvcc -cubin -Xptxas -v` and
    then `nvcc -ptx` would run cicc twice on the same text (the PTX ptxas gets is the same)."""
    import shutil
    import subprocess

    from dlcc.backends.nvcc import find_nvcc

    nvcc = find_nvcc()
    ptxas = os.path.join(os.path.dirname(nvcc), "ptxas")
    ptxas = ptxas if os.path.exists(ptxas) else shutil.which("ptxas")
    ptx = src.with_suffix(".ptx")
    r = subprocess.run([nvcc, "-ptx", f"-arch={arch}", "-o", str(ptx), str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([ptxas, f"-arch={arch}", "-O3", "-v", "-o", str(src.with_suffix(".cubin")), str(ptx)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return ptx.read_text(), r.stdout + r.stderr


def run_ort(path, feeds, names=None):
    from dlcc.verify import run_onnxruntime

    return run_onnxruntime(path, feeds, names)


def pytest_ignore_collect(collection_path, config):
    """Generating the ONNX backend suite's cases takes a while; only do it when slow tests run."""
    if collection_path.name == "test_onnx_backend.py":
        expr = config.getoption("markexpr") or ""
        wanted = "slow" in expr.replace("not slow", "")
        return None if wanted else True
    return None


def parallel_gemms(path, n, M=128, K=768, N=768):
    """n independent MatMuls of one input: a single wave of n GEMMs (Rammer's tests)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(2)
    outs = [f"y{i}" for i in range(n)]
    inits = [helper.make_tensor(f"W{i}", TensorProto.FLOAT, [K, N], rng.standard_normal(K * N) / np.sqrt(K))
             for i in range(n)]
    g = helper.make_graph([helper.make_node("MatMul", ["x", f"W{i}"], [o]) for i, o in enumerate(outs)], "gemms",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K])],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, [M, N]) for o in outs], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def run_main(*args, cwd=None) -> tuple[int, str, str]:
    """The console entry point that the `dlcc` script runs (dlcc.cli.main: all of its error
    handling), in this process: (exit code, stdout, stderr). A process per call took a second and
    more just to start; tests/test_cli.py runs the script itself."""
    import contextlib
    import io

    from dlcc.cli import main

    out, err, here, code = io.StringIO(), io.StringIO(), os.getcwd(), 0
    try:
        if cwd:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main([str(a) for a in args])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(bool(e.code))
    finally:
        os.chdir(here)
    return code, out.getvalue(), err.getvalue()
