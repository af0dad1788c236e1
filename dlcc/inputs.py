"""Seeded sample inputs from a model's signature, shared by `verify`, `run` and the launcher."""
from __future__ import annotations

import numpy as np


def sample_inputs(signature: list[dict], seed: int = 0, int_high: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Floats ~ N(0, 1); names with 'mask' → ones; other ints in [0, int_high[name] or 2); bools random."""
    rng = np.random.default_rng(seed)
    out = {}
    for t in signature:
        name, shape, dt = t["name"], tuple(t["shape"]), np.dtype(t["dtype"])
        if dt.kind == "f":
            out[name] = rng.standard_normal(shape).astype(dt)
        elif dt.kind == "b":
            out[name] = rng.integers(0, 2, shape).astype(bool)
        elif "mask" in name.lower():
            out[name] = np.ones(shape, dt)
        else:
            out[name] = rng.integers(0, (int_high or {}).get(name, 2), shape).astype(dt)
    return out


def gather_bounds(graph) -> dict[str, int]:
    """For int inputs used as Gather indices, the size of the gathered axis (a safe upper bound)."""
    bounds: dict[str, int] = {}
    for n in graph.nodes:
        if n.op_type == "Gather" and len(n.inputs) > 1:
            src = n.inputs[1]
            axis = n.attrs.get("axis", 0)
            data = graph.tensors[n.inputs[0]]
            if src in graph.inputs and data.shape is not None:
                dim = data.shape[axis]
                bounds[src] = min(bounds.get(src, dim), dim)
    return bounds
