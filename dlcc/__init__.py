"""dlcc: a deep-learning compiler — ONNX in, CUDA/OpenCL kernels out.

    import dlcc
    model = dlcc.compile("model.onnx", shapes={"input": (1, 3, 224, 224)})
    outputs = model({"input": x})
    model.save("out/"); dlcc.load("out/")
    dynamic = dlcc.compile("model.onnx", dynamic=True)  # a plan per input shape, at call time
"""
__version__ = "0.1.0"

import ml_dtypes  # noqa: E402,F401  registers numpy's "bfloat16" dtype name (bfloat16 models, half weights)

from .backends.opencl import configure_pocl  # noqa: E402

configure_pocl()  # before anything touches the OpenCL platform (DESIGN §3)

from .api import CompiledModel, compile, load  # noqa: E402,F401
from .dynamic import DynamicModel  # noqa: E402,F401
from .errors import DlccError  # noqa: E402,F401
