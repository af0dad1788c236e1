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
