"""Compare a compiled model's outputs with onnxruntime's on the same inputs (Polygraphy-style)."""
from __future__ import annotations

import numpy as np


def compare(name: str, got: np.ndarray, ref: np.ndarray, rtol: float, atol: float) -> dict:
    """max abs error, max rel error (|d| / max(|ref|, atol)) and pass: |d| <= atol + rtol·|ref| everywhere."""
    row = {"name": name, "shape": list(ref.shape), "dtype": str(ref.dtype)}
    if got.shape != ref.shape:
        return {**row, "max_abs_err": float("inf"), "max_rel_err": float("inf"), "passed": False,
                "note": f"shape {list(got.shape)} != {list(ref.shape)}"}
    if ref.dtype.kind in "biu":
        d = np.abs(got.astype(np.int64) - ref.astype(np.int64))
        mx = float(d.max()) if d.size else 0.0
        return {**row, "max_abs_err": mx, "max_rel_err": mx, "passed": mx == 0}
    g, r = got.astype(np.float64), ref.astype(np.float64)
    nan_mismatch = bool(np.any(np.isnan(g) != np.isnan(r)))
    both = ~(np.isnan(g) | np.isnan(r))
    d = np.abs(g - r)[both]
    rr = np.abs(r)[both]
    mx = float(d.max()) if d.size else 0.0
    rel = float((d / np.maximum(rr, atol)).max()) if d.size else 0.0
    ok = (not nan_mismatch) and bool(np.all(d <= atol + rtol * rr))
    return {**row, "max_abs_err": mx, "max_rel_err": rel, "passed": ok}


def run_onnxruntime(model_path: str, feeds: dict, output_names: list[str]) -> list[np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
    return sess.run(output_names, feeds)
