"""Every bug the fuzzer found, as the minimal model it shrank to (tests/fuzz_cases/NAME/): the
model, its inputs, and the configuration that failed (case.json, with a note on the root cause).
Each runs through that configuration on OpenCL and is compared with onnxruntime under `dlcc
verify`'s rule, over the model's own graph outputs (a float16 or bfloat16 model's reference is
the model widened, as verify's is); a case found by the `nvcc` target is built
for sm_90 and sm_80 instead (skipped where nvcc is absent). A case marked `"expect": "unstable"` was a
finding of the oracle, not of dlcc (an ill-conditioned graph it misjudged): its verdict must be
`unstable` (or `pass`), never `mismatch`. scripts/fuzz.py --shrink --regressions adds
cases here."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from dlcc.backends.nvcc import find_nvcc
from dlcc.testing.graphgen import reference_widened
from dlcc.testing.oracle import Config, check_model

CASES = Path(__file__).parent / "fuzz_cases"


def _cases():
    return sorted(d.name for d in CASES.iterdir() if (d / "case.json").is_file()) if CASES.is_dir() else []


def test_there_are_regression_cases():
    assert _cases(), "tests/fuzz_cases is empty"


@pytest.mark.parametrize("name", _cases())
def test_fuzz_regression(name):
    d = CASES / name
    meta = json.loads((d / "case.json").read_text())
    model = onnx.load(str(d / "model.onnx"))
    feeds = dict(np.load(d / "feeds.npz"))
    if meta.get("target") == "nvcc" and find_nvcc() is None:
        pytest.skip("a CUDA compile case, and nvcc is not installed on this machine")
    refs = reference_widened(model, feeds)  # (a half model's, as the campaign takes it; else onnxruntime's)
    v = check_model(model, feeds, refs, [Config.from_dict(meta["config"])], meta.get("target", "opencl"))[0]
    allowed = {"pass", meta.get("expect", "pass")}
    assert v.status in allowed, f"{name} ({meta['config']['name']}): {v.status}: {v.detail}\n{meta['note']}"
