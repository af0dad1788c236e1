"""The graph IR: static-shaped tensors and ONNX-level nodes after import and folding.

Shapes are fully static at this level (Rammer's assumption, DESIGN.md §2); the frontend binds
every dynamic dim before a Graph exists. ONNX names are kept as data only: anything that reaches
generated source goes through `sanitize` first.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

#: ONNX dtypes dlcc can hold in buffers, mapped to numpy; anything else is an unsupported dtype.
SUPPORTED_DTYPES = {
    "float32": np.float32,
    "float16": np.float16,  # stored as half, computed in float (see frontend.promote_half)
    "bfloat16": ml_dtypes.bfloat16,  # the same; also the half weights at precision bf16 (ops/narrow.py)
    "int64": np.int64,
    "int32": np.int32,
    "bool": np.bool_,
    "uint8": np.uint8,
    "int8": np.int8,
    "int16": np.int16,  # the narrow and unsigned integers: storage and integer arithmetic, as C does it
    "uint16": np.uint16,
    "uint32": np.uint32,
    "uint64": np.uint64,
    # Held, and computed only by Casts (frontend.dtype_problems): a float64 input or output read or
    # written through a Cast, or, with a precision asked for, a model computed in float32
    # (frontend.promote_half).
    "float64": np.float64,
}
#: The integer dtypes, and the unsigned ones among them: kernels compute them in their own C
#: type, wrapping as numpy does (kernels/program.py SAME_WIDTH_UNSIGNED).
UNSIGNED_DTYPES = ("uint64", "uint32", "uint16", "uint8")
INTEGER_DTYPES = ("int64", "int32", "int16", "int8") + UNSIGNED_DTYPES
#: The 16-bit float dtypes: storage only. Kernels load them into float and store from float.
HALF_FLOATS = ("float16", "bfloat16")


def is_float(dtype) -> bool:
    """A floating-point numpy dtype, ml_dtypes' bfloat16 included (numpy calls its kind "V")."""
    dt = np.dtype(dtype)
    return dt.kind == "f" or dt == np.dtype(ml_dtypes.bfloat16)


#: The largest index, dim or kernel integer argument: kernels index with 32-bit ints.
INT32_MAX = 2**31 - 1


@dataclass
class Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: str  # numpy dtype name, one of SUPPORTED_DTYPES
    value: np.ndarray | None = None  # set for initializers / folded constants

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize


@dataclass
class Node:
    op_type: str
    name: str
    inputs: list[str]  # "" marks an omitted optional input
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    domain: str = ""


@dataclass
class Graph:
    name: str
    nodes: list[Node]
    tensors: dict[str, Tensor]
    inputs: list[str]
    outputs: list[str]
    opset: int
    source_node_count: int = 0  # ONNX nodes before folding, for reports
    # Internal tensor -> the ONNX output name it is reported as (when an output had to be copied
    # into a tensor of its own, e.g. a graph output that is also a graph input).
    output_alias: dict[str, str] = field(default_factory=dict)
    # What the import did that a user should see in the pass log (control_flow.py: how each If was
    # inlined).
    notes: list[str] = field(default_factory=list)
    # Scalar inputs whose value the compile bound (frontend.bind_values): the run checks the feeds.
    bound_values: dict[str, int] = field(default_factory=dict)
    # Nodes that stay float32 at a half precision whatever the pipeline says (narrow.kept_float32):
    # the products the import makes of STFT and DFT.
    float32_nodes: set[str] = field(default_factory=set)
    # Whether sample inputs give attention masks without padding: onnxruntime leaves the padded
    # rows of some fused ops unspecified (fused_ops.PADDED_QUERIES_UNSPECIFIED), so verify would
    # compare dlcc with bytes onnxruntime never wrote.
    full_masks: bool = False
    # Inputs and outputs of a type dlcc holds in a wider one (held_types.py): name -> the model's
    # dtype, which the plan keeps at the boundary.
    held: dict[str, str] = field(default_factory=dict)

    def output_name(self, name: str) -> str:
        return self.output_alias.get(name, name)

    def is_const(self, name: str) -> bool:
        t = self.tensors.get(name)
        return t is not None and t.value is not None

    def op_histogram(self) -> dict[str, int]:
        hist: dict[str, int] = {}
        for n in self.nodes:
            hist[n.op_type] = hist.get(n.op_type, 0) + 1
        return dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])))


_IDENT_BAD = re.compile(r"[^A-Za-z0-9_]")


def sanitize(name: str, prefix: str = "n") -> str:
    """A C/OpenCL/Python-safe identifier derived from an arbitrary ONNX name.

    Only [A-Za-z0-9_] survive, the result is truncated, and it never starts with a digit or
    collides with reserved `__` names. Callers still add a unique suffix, since two ONNX names can
    sanitize to the same string.
    """
    s = _IDENT_BAD.sub("_", name)[:40].strip("_")
    s = re.sub(r"_+", "_", s)
    if not s or s[0].isdigit():
        s = prefix + "_" + s
    return s
