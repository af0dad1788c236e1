"""dlcc: a deep-learning compiler — ONNX in, CUDA/OpenCL kernels out.

    import dlcc
    model = dlcc.compile("model.onnx", shapes={"input": (1, 3, 224, 224)})
    outputs = model({"input": x})
    model.save("out/"); dlcc.load("out/")
"""
__version__ = "0.1.0"

from .backends.opencl import claim_pocl_threads  # noqa: E402

claim_pocl_threads()  # before anything touches the OpenCL platform (DESIGN §3)

from .api import CompiledModel, compile, load  # noqa: E402,F401
from .errors import DlccError  # noqa: E402,F401
