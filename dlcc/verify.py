"""Compare a compiled model's outputs with onnxruntime's on the same inputs (Polygraphy-style)."""
from __future__ import annotations

import numpy as np


#: verify's default (rtol, atol) per precision (Polygraphy-style: one pair per precision, printed
#: with the result). TF32 rounds every GEMM operand to 10 mantissa bits (2**-11 relative), so a
#: K-long dot product and the layers after it drift by about 1e-3 relative, more through softmax
#: and normalisation; float32 accumulation keeps it from growing with K.
#: fp16 keeps 10 bits as TF32 does (and the same tolerance); bf16 keeps 7 (2**-8 relative), about
#: 8x TF32's error, and its pair is looser by that much.
DEFAULT_TOLERANCE = {"fp32": (1e-3, 1e-4), "tf32": (1e-2, 1e-2), "fp16": (1e-2, 1e-2), "bf16": (5e-2, 5e-2)}


def compare(name: str, got: np.ndarray, ref: np.ndarray, rtol: float, atol: float) -> dict:
    """max abs error, max rel error (|d| / max(|ref|, atol)) and pass: |d| <= atol + rtol·|ref| everywhere.
    NaNs must sit where onnxruntime's are, and infinities must equal onnxruntime's (same sign, same
    place): inf - inf is NaN, so equal values count as d = 0 before any arithmetic on them. The
    shape and the dtype must be onnxruntime's: an int64 output returned as int32, or a bool one as
    uint8, is wrong for the program that reads it, whatever the values."""
    row = {"name": name, "shape": list(ref.shape), "dtype": str(ref.dtype)}
    if got.shape != ref.shape or got.dtype != ref.dtype:
        what = (f"shape {list(got.shape)} != {list(ref.shape)}" if got.shape != ref.shape
                else f"dtype {got.dtype} != {ref.dtype}")
        return {**row, "max_abs_err": float("inf"), "max_rel_err": float("inf"), "passed": False, "note": what}
    if ref.dtype.kind in "biu":
        d = np.abs(got.astype(np.int64) - ref.astype(np.int64))
        mx = float(d.max()) if d.size else 0.0
        return {**row, "max_abs_err": mx, "max_rel_err": mx, "passed": mx == 0}
    g, r = got.astype(np.float64), ref.astype(np.float64)
    nan_mismatch = bool(np.any(np.isnan(g) != np.isnan(r)))
    both = ~(np.isnan(g) | np.isnan(r))
    g, r = g[both], r[both]
    with np.errstate(invalid="ignore", divide="ignore"):
        d = np.where(g == r, 0.0, np.abs(g - r))  # inf against finite or -inf: d = inf
        rel = np.where(d == 0, 0.0, np.where(np.isinf(d), np.inf, d / np.maximum(np.abs(r), atol)))
    ok = (not nan_mismatch) and bool(np.all((d == 0) | (np.isfinite(d) & (d <= atol + rtol * np.abs(r)))))
    res = {**row, "max_abs_err": float(d.max()) if d.size else 0.0,
           "max_rel_err": float(rel.max()) if d.size else 0.0, "passed": ok}
    return {**res, "note": "NaN where onnxruntime has none, or the reverse"} if nan_mismatch else res


def _session(model_path):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])


def run_onnxruntime(model_path: str, feeds: dict, output_names: list[str] | None = None) -> list[np.ndarray]:
    return _session(model_path).run(output_names, feeds)


def verify_outputs(model_path, got: dict[str, np.ndarray], feeds: dict, rtol: float, atol: float) -> list[dict]:
    """One row per output: every graph output of the model (onnxruntime's list, not dlcc's), then
    every output dlcc returned that the model does not have. The model's list is the oracle, so an
    output that dlcc drops or renames fails instead of going unchecked."""
    sess = _session(model_path)
    names = [o.name for o in sess.get_outputs()]
    rows = []
    for n, ref in zip(names, sess.run(names, feeds)):
        if n in got:
            rows.append(compare(n, np.asarray(got[n]), ref, rtol, atol))
        else:
            rows.append({"name": n, "shape": list(ref.shape), "dtype": str(ref.dtype), "max_abs_err": float("inf"),
                         "max_rel_err": float("inf"), "passed": False, "note": "missing from dlcc's outputs"})
    for n in got:
        if n not in names:
            g = np.asarray(got[n])
            rows.append({"name": n, "shape": list(g.shape), "dtype": str(g.dtype), "max_abs_err": float("inf"),
                         "max_rel_err": float("inf"), "passed": False, "note": "not an output of the model"})
    return rows
