"""The side-by-side benchmark scripts run where CI runs (no GPU): scripts/vs_torch.py judges torch's
and dlcc's outputs against onnxruntime and prints the table, and scripts/gemm_tilings.py finds the
GEMM shapes of a model. Their timings need a GPU and are not checked here (no timed tests)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import MODEL_DIR, ROOT

pytest.importorskip("torch", reason="the scripts compare against PyTorch: run scripts/test.sh, which installs it")


def test_vs_torch_runs_on_the_cpu(tmp_path, model_path):
    model_path("bert")
    out = tmp_path / "rows.json"
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "vs_torch.py"), "--size", "small", "--models", "bert",
                        "--target", "opencl", "--precisions", "bf16", "--torch-modes", "eager",
                        "--pipelines", "astitch", "--repeat", "2", "--models-dir", str(MODEL_DIR),
                        "--json-out", str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [r["engine"] for r in rows] == ["torch eager", "dlcc astitch"]
    # Both engines' outputs were judged at bf16's documented tolerance, and both are within it.
    assert all(r["ok"] and r["tolerance"] == ["rtol 0.05 atol 0.05"] for r in rows), rows
    assert "| bert-small | bf16 | dlcc astitch |" in p.stdout


def test_vs_torch_refuses_an_unknown_precision():
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "vs_torch.py"), "--precisions", "fp8",
                        "--target", "opencl"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "unknown precision or torch mode: fp8" in p.stderr


def test_gemm_shapes_of_a_model(model_path):
    """BERT (small: hidden 64, FFN 128, 16 tokens): Q/K/V/out, FFN up and down, the pooler."""
    from gemm_tilings import model_gemm_shapes

    model_path("bert")
    assert model_gemm_shapes(MODEL_DIR, ("bert",), "small") == ["16x64x64", "16x128x64", "16x64x128", "1x64x64"]


def test_ab_spec_runs_on_the_cpu(tmp_path, model_path):
    """scripts/ab_spec.py, which a GPU session runs to decide a spec switch: both plans compiled,
    checked against onnxruntime and timed on PoCL, and a plan-only comparison for the h100 spec."""
    model_path("cnn")
    out = tmp_path / "ab.json"
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "ab_spec.py"), "--models", "cnn", "--size", "small",
                        "--precision", "fp32", "--switch", "simt_vector_tilings", "--device", "pocl-cpu",
                        "--target", "opencl", "--repeat", "2", "--models-dir", str(MODEL_DIR), "--json-out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    row = json.loads(out.read_text())["rows"]["cnn"]
    assert set(row) == {"pocl-cpu", "pocl-cpu + simt_vector_tilings"}
    assert all(r["ok"] and r["us"] > 0 and r["launches"] > 0 for r in row.values()), row
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "ab_spec.py"), "--models", "cnn", "--size", "small",
                        "--precision", "bf16", "--switch", "gemm_wgmma", "--plan-only", "--models-dir", str(MODEL_DIR)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and "gemm_wgmma off and on" in p.stdout, p.stdout + p.stderr[-3000:]
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "ab_spec.py"), "--switch", "no_such_switch",
                        "--plan-only"], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "not a switch of the 'h100' spec: no_such_switch" in p.stdout + p.stderr


def test_backend_profile_runs_on_the_cpu(model_path):
    """scripts/backend_profile.py, which a GPU session runs on the torch backend's host time."""
    model_path("bert")
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "backend_profile.py"), "--model", "bert",
                        "--calls", "5", "--repeat", "5", "--models-dir", str(MODEL_DIR)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    assert "graphs compiled by the backend: 1" in p.stdout and "by cumulative" in p.stdout
