"""The one op registry: an entry per ONNX op type, resolved by opset version downward.

Each entry says which opset it is valid from, which category the op is in (the passes reason about
categories, never about op names), and how it lowers to kernels. Shapes and dtypes come from
`onnx.shape_inference` for every op (the `shape_rule` field says so), so no entry re-derives them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

COMPUTE = "compute"          # MatMul, Gemm, Conv, ...: tiled templates (Rammer rOperators)
ELEMENTWISE = "elementwise"  # one output element from the same-index input elements
REDUCTION = "reduction"      # reduces one or more axes (incl. Softmax, normalizations)
LAYOUT = "layout"            # broadcast/layout: Transpose, Slice, Concat, Gather, Expand, ...
ALIAS = "alias"              # no data movement: Reshape, Squeeze, Identity, ...
OTHER = "other"

CATEGORIES = (COMPUTE, ELEMENTWISE, REDUCTION, LAYOUT, ALIAS, OTHER)


@dataclass(frozen=True)
class OpDef:
    op_type: str
    since: int
    category: str
    lower: Callable  # (ctx: LowerCtx, node: Node) -> None
    float_only: bool = False  # the lowering computes in float: the first input must be float32
    # The lowering reads and writes its float tensors in their storage dtype (load_float and
    # store_float; 16-bit floats convert to float and round back), so at precision fp16/bf16 the
    # activations around it may be stored in the half type (ops/narrow.py narrow_activations).
    half_io: bool = False
    shape_rule: str = "onnx.shape_inference"
    # The first input's dtypes the lowering takes, where it takes more than float32 but not
    # every type (None: float_only decides).
    dtypes: tuple[str, ...] | None = None


_REGISTRY: dict[str, list[OpDef]] = {}


def register(*op_types: str, since: int = 1, category: str = OTHER, float_only: bool = False, half_io: bool = False,
             dtypes: tuple[str, ...] | None = None):
    """Decorator: `@register("Relu", since=6, category=ELEMENTWISE)` on a lowering function."""
    assert category in CATEGORIES, category

    def deco(fn):
        for op in op_types:
            entries = _REGISTRY.setdefault(op, [])
            if any(e.since == since for e in entries):
                raise ValueError(f"{op} since opset {since} registered twice")
            entries.append(OpDef(op, since, category, fn, float_only, half_io, dtypes=dtypes))
            entries.sort(key=lambda e: e.since)
        return fn

    return deco


def lookup(op_type: str, opset: int, domain: str = "") -> OpDef | None:
    """The entry for the highest `since` not above the model's opset (None if unsupported)."""
    if domain not in ("", "ai.onnx"):
        return None
    best = None
    for e in _REGISTRY.get(op_type, []):
        if e.since <= opset:
            best = e
    return best


def supported_ops() -> dict[str, list[int]]:
    return {op: [e.since for e in entries] for op, entries in sorted(_REGISTRY.items())}


def category_of(op_type: str, opset: int = 99) -> str:
    e = lookup(op_type, opset)
    return e.category if e else OTHER
