"""ONNX op lowerings. Importing this package registers every op in dlcc.ops.registry."""
from . import conv, elementwise, layout, matmul, random, reduce, resize, rnn, roi, tensor_scatter  # noqa: F401
from .registry import COMPUTE, ELEMENTWISE, LAYOUT, REDUCTION, lookup, register, supported_ops  # noqa: F401
