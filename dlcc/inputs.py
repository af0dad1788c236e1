"""Seeded sample inputs from a model's signature, shared by `verify`, `run` and the launcher."""
from __future__ import annotations

import numpy as np


def padding_mask(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    """An attention mask as a right-padded batch has it: each row (the last axis, length S) is ones
    for a random length in [1, S], then zeros. All-ones masks would leave masking unchecked, so for
    S > 1 at least one row is padded; no row is all zeros (a fully masked softmax row is not a
    real input and its result differs between implementations)."""
    shape = tuple(shape)
    if not shape or 0 in shape:
        return np.ones(shape, dtype)
    s = shape[-1]
    lens = np.asarray(rng.integers(1, s + 1, shape[:-1]))
    if s > 1 and (lens == s).all():
        lens.flat[rng.integers(lens.size)] = rng.integers(1, s)
    return (np.arange(s) < lens[..., None]).astype(dtype)


def sample_inputs(signature: list[dict], seed: int = 0, int_high: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Floats ~ N(0, 1); int or bool names with 'mask' → padding_mask; other ints in
    [0, int_high[name] or 2); other bools random."""
    rng = np.random.default_rng(seed)
    out = {}
    for t in signature:
        name, shape, dt = t["name"], tuple(t["shape"]), np.dtype(t["dtype"])
        if dt.kind == "f":
            out[name] = rng.standard_normal(shape).astype(dt)
        elif "mask" in name.lower():
            out[name] = padding_mask(rng, shape, dt)
        elif dt.kind == "b":
            out[name] = rng.integers(0, 2, shape).astype(bool)
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
