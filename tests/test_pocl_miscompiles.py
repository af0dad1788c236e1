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


def test_vectorizer_kernel_is_right_under_dlccs_method():
    got, want = run_with_method("VECTORIZER", None)
    assert got == want
