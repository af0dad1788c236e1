"""The ONNX backend test suite (node tests) against dlcc on OpenCL — slow: `scripts/test.sh -m slow`.

dlcc implements `onnx.backend.base.Backend`; models with ops dlcc does not support are skipped
(reported as such), so failures are real wrong answers or crashes on supported ops.
Score with `scripts/conformance.sh` (prints passed / failed / skipped).
"""
from __future__ import annotations

import tempfile
import unittest
from pathlib import Path

import numpy as np
import onnx
import onnx.backend.base
import onnx.backend.test
import pytest

import dlcc
from dlcc.errors import DynamicShapeError, UnsupportedControlFlowError, UnsupportedDtypesError, UnsupportedOpsError
from dlcc.ops.context import LoweringError

pytestmark = pytest.mark.slow


#: Inputs that real models give as constants, and dlcc needs as constants (they decide shapes and
#: indexing): {op: the input positions}. The node tests feed them as graph inputs.
_CONSTANT_INPUTS = {
    "Resize": (1, 2, 3), "Upsample": (1,), "Pad": (1, 2, 3), "TopK": (1,), "Tile": (1,), "Expand": (1,),
    "Reshape": (1,), "Squeeze": (1,), "Unsqueeze": (1,), "Split": (1,), "CumSum": (1,), "Trilu": (1,),
    "OneHot": (1,), "ReduceSum": (1,), "ReduceMean": (1,), "ReduceMax": (1,), "ReduceMin": (1,),
    "ReduceProd": (1,), "ReduceL1": (1,), "ReduceL2": (1,), "ReduceLogSum": (1,), "ReduceLogSumExp": (1,),
    "ReduceSumSquare": (1,), "Slice": (1, 2, 3, 4), "CenterCropPad": (1,), "Clip": (1, 2),
    "Range": (0, 1, 2), "ConstantOfShape": (0,), "HannWindow": (0,), "HammingWindow": (0,), "BlackmanWindow": (0,),
    "CastLike": (1,), "MelWeightMatrix": (0, 1, 2, 3, 4),
}


def _as_constants(model: onnx.ModelProto, feeds: dict) -> tuple[onnx.ModelProto, dict]:
    """The model with each graph input that is read only where `_CONSTANT_INPUTS` says as an
    initializer holding the test's value (as a real model has it); the other feeds."""
    uses: dict[str, set] = {}
    for n in model.graph.node:
        for k, name in enumerate(n.input):
            uses.setdefault(name, set()).add(k in _CONSTANT_INPUTS.get(n.op_type, ()))
    baked = {n for n, a in feeds.items() if uses.get(n) == {True} and np.asarray(a).size <= 64}
    if not baked:
        return model, feeds
    m = onnx.ModelProto()
    m.CopyFrom(model)
    keep = [i for i in m.graph.input if i.name not in baked]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    m.graph.initializer.extend(onnx.numpy_helper.from_array(np.asarray(feeds[n]), n) for n in sorted(baked))
    return m, {n: a for n, a in feeds.items() if n not in baked}


class DlccRep(onnx.backend.base.BackendRep):
    """Compiles on first run, binding every input's shape from the arrays it is given (and the
    values of those `_CONSTANT_INPUTS` says a real model holds as constants)."""

    def __init__(self, model: onnx.ModelProto):
        self.proto = model
        self.compiled = None

    def run(self, inputs, **kwargs):
        inputs = [np.asarray(a) if isinstance(a, np.generic) else a for a in inputs]  # (a case's scalars)
        init = {i.name for i in self.proto.graph.initializer}
        names = [i.name for i in self.proto.graph.input if i.name not in init]
        if self.compiled is None:
            self.proto, kept = _as_constants(self.proto, dict(zip(names, inputs)))
            self.baked = [n for n in names if n not in kept]
            # (A scalar int or bool input's binding is its value: a DFT's axis, a Loop's trip count.)
            shapes = {n: (int(a) if a.ndim == 0 and a.dtype.name in ("int64", "int32", "int8", "uint8", "bool")
                      else tuple(a.shape))
                      for n, a in kept.items() if isinstance(a, np.ndarray)}
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "model.onnx"
                onnx.save(self.proto, path)
                try:
                    self.compiled = dlcc.compile(path, target="opencl", shapes=shapes)
                except (UnsupportedOpsError, UnsupportedDtypesError, LoweringError, DynamicShapeError,
                        UnsupportedControlFlowError) as e:
                    # Not a wrong answer: an op, dtype or attribute dlcc reports as unsupported.
                    raise unittest.SkipTest(" ".join(str(e).split())[:200]) from None
        outs = self.compiled({n: a for n, a in zip(names, inputs) if n not in self.baked})
        return [outs[t["name"]] for t in self.compiled.outputs]


class DlccBackend(onnx.backend.base.Backend):
    @classmethod
    def prepare(cls, model, device="CPU", **kwargs):
        return DlccRep(model)

    @classmethod
    def supports_device(cls, device):
        return device == "CPU"


backend_test = onnx.backend.test.BackendTest(DlccBackend, __name__)
backend_test.include(r"^test_.*_cpu$")
backend_test.exclude(r"_cuda$")
# The expected output of the inverse DFT cases is numpy's complex64 FFT, whose imaginary part at
# the Nyquist bin is 1.9e-7 where the exact value is 0 (numpy's complex128 FFT gives 7e-16): its own
# rounding, above the case's atol of 1e-7. dlcc's 3e-15 is nearer the exact answer and fails the check.
backend_test.xfail(r"^test_dft_inverse(_opset19)?_cpu$")
# Downscaling with align_corners by scales: the ONNX reference maps output x to x * (in - 1) /
# (in * scale - 1), with the fractional length 4 * 0.6 = 2.4; onnxruntime, verify's reference, uses
# the output's length, 2. dlcc follows onnxruntime (1 4 where the expected data says 1 3.142857).
backend_test.xfail(r"^test_resize_downsample_scales_(linear|cubic)_align_corners_cpu$")
# MaxUnpool with an output_shape larger than the default one: the ONNX reference places each
# index as if into the default shape (4 x 4 here) and pads; onnxruntime, verify's reference, takes
# the indices as flat positions in the given 5 x 5 output. dlcc follows onnxruntime.
backend_test.xfail(r"^test_maxunpool_export_with_output_shape_cpu$")
# Bernoulli's expected outputs are draws of numpy's generator (np.random.uniform after
# np.random.seed), which no other generator reproduces: dlcc draws Philox streams (docs/random.md),
# checked in tests/test_random.py against their host stream and Bernoulli's probability.
backend_test.xfail(r"^test_bernoulli(_double|_seed)?(_expanded)?_cpu$")
globals().update(backend_test.enable_report().test_cases)

__all__ = ["np"]
