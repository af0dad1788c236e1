"""The PoCL 3.1 miscompiles dlcc works around (dlcc/testing/pocl_kernels.py), kept from coming
back: the loop forms dlcc emits must be right under both of PoCL's work-group methods, and the
vectorizer kernel must be right under the method `import dlcc` sets. Each run is a fresh process,
since PoCL reads its work-group method when it first builds a kernel.

`scripts/pocl_miscompiles.py` shows the other half of the proof: the original forms are wrong
under PoCL's defaults on this driver."""
from __future__ import annotations

import pytest

from conftest import opencl_device_available
from dlcc.testing.pocl_kernels import run_with_method

pytestmark = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")


@pytest.mark.parametrize("method", ["loopvec", "loops"])
@pytest.mark.parametrize("form", ["ONCE", "GRID_TURNS"])
def test_astitch_loop_forms_are_right_under_both_methods(form, method):
    got, want = run_with_method(form, method)
    assert got == want


@pytest.mark.parametrize("name", ["PEELED", "VECTORIZER"])
@pytest.mark.parametrize("method", ["loopvec", "loops"])
def test_unoptimised_builds_are_right(name, method):
    """Built with -cl-opt-disable (what the runtime does for persistent kernels on PoCL), both
    miscompiled kernels are right under both methods."""
    got, want = run_with_method(name, method, ["-cl-opt-disable"])
    assert got == want


def test_vectorizer_kernel_is_right_under_dlccs_method():
    got, want = run_with_method("VECTORIZER", None)
    assert got == want


def test_rammer_dispatcher_around_a_regional_stitch(tmp_path):
    """Fuzz graph 300024 (found at bf16, wrong at every precision) through `full-join-always`:
    a stitch whose Sqrt and Tanh stores follow Regional (shared-memory) reductions, joined with a
    GEMM rTask into a persistent kernel. Rammer's dispatch loop reads the block index (PEELED's
    shape), and optimised, PoCL 3.1 dropped those stores; the runtime builds persistent kernels
    unoptimised on PoCL (backends/opencl.py compile), and the outputs match onnxruntime's."""
    import onnx

    import dlcc
    from dlcc.testing import graphgen
    from dlcc.testing.oracle import compare_outputs, config_named

    case = graphgen.generate_valid(300024)
    onnx.save(case.model, tmp_path / "g.onnx")
    got = dlcc.compile(tmp_path / "g.onnx", target="opencl", pipeline=config_named("full-join-always").spec())(case.feeds)
    ok, notes, _ = compare_outputs(case.model, got, case.refs)
    assert ok, notes
