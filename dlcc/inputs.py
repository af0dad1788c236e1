"""Seeded sample inputs from a model's signature, shared by `verify`, `run` and the launcher."""
from __future__ import annotations

import re

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


def sample_inputs(signature: list[dict], seed: int = 0, int_high: dict[str, int] | None = None,
                  bound: dict[str, int] | None = None, full_masks: bool = False) -> dict[str, np.ndarray]:
    """Floats ~ N(0, 1); int or bool names with 'mask' → padding_mask (all ones with
    `full_masks`: a model whose reference leaves padded rows unspecified, Graph.full_masks); an
    int [batch] input named as lengths → valid lengths (length_bound); other ints in
    [0, int_high[name] or 2); other bools random; an input whose value the compile bound
    (`bound`, frontend.bind_values) that value."""
    rng = np.random.default_rng(seed)
    out = {}
    for t in signature:
        name, shape, dt = t["name"], tuple(t["shape"]), np.dtype(t["dtype"])
        if name in (bound or {}):
            out[name] = np.full(shape, bound[name], dt)
        elif dt.kind == "f":
            out[name] = rng.standard_normal(shape).astype(dt)
        elif "mask" in name.lower():
            out[name] = np.ones(shape, dt) if full_masks else padding_mask(rng, shape, dt)
        elif dt.kind in "iu" and name not in (int_high or {}) and (n := length_bound(name, shape, signature)):
            lens = rng.integers(max(1, n // 2), n + 1, shape)
            lens.flat[0] = n  # one row of the whole length, the others shorter or not
            out[name] = lens.astype(dt)
        elif dt.kind == "b":
            out[name] = rng.integers(0, 2, shape).astype(bool)
        else:
            out[name] = rng.integers(0, (int_high or {}).get(name, 2), shape).astype(dt)
        if t.get("model_dtype"):  # (a type held in a wider one: its own values, held_types.py)
            out[name] = out[name].astype(t["model_dtype"])
    return out


#: Words of an input's name that say it holds lengths (onnx-asr's `waveforms_lens`, `x_lengths`).
LENGTH_WORDS = {"len", "lens", "length", "lengths"}


def length_bound(name: str, shape, signature: list[dict]) -> int | None:
    """For an int input of shape [batch] named as lengths: the length of the input it describes
    (axis 1 of a float input of shape [batch, N, ...], else of another int one: a batch of token
    ids, as piper's diacritizer takes `input_lengths` beside `char_inputs`), else None. Drawn from
    [0, 2) instead, the lengths of onnx-asr's audio front ends masked out every frame but one,
    and verify compared zeros with zeros; tashkeel's packed GRUs ran one step or none."""
    if len(shape) != 1 or not LENGTH_WORDS & set(re.split(r"[^a-z]+", name.lower())):
        return None
    for kinds in ("f", "iu"):
        for t in signature:
            s = tuple(t["shape"])
            if t["name"] != name and np.dtype(t["dtype"]).kind in kinds and len(s) >= 2 and s[0] == shape[0] \
                    and s[1] > 0:
                return int(s[1])
    return None


#: Ops that pass an int input's values on unchanged (views, broadcasts, casts).
_VALUE_PRESERVING = ("Reshape", "Expand", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Cast")


def gather_bounds(graph) -> dict[str, int]:
    """Upper bounds (exclusive) for drawing int inputs, so that sample inputs mean something:
    - an input used as Gather indices: the size of the gathered axis (a safe bound, and it wins);
    - an input compared by Equal with a constant of non-negative ints (a one-hot encoding, as
      tf2onnx writes Magika's byte input): one past the constant's largest value. Drawn from
      [0, 2) instead, Magika's bytes were all 0 or 1, a degenerate input for its LayerNorm."""
    bounds: dict[str, int] = {}
    for n in graph.nodes:
        if n.op_type == "Gather" and len(n.inputs) > 1:
            src = n.inputs[1]
            axis = n.attrs.get("axis", 0)
            data = graph.tensors[n.inputs[0]]
            if src in graph.inputs and data.shape is not None:
                dim = data.shape[axis]
                bounds[src] = min(bounds.get(src, dim), dim)
    producer = {o: n for n in graph.nodes for o in n.outputs}
    for n in graph.nodes:
        if n.op_type != "Equal" or len(n.inputs) != 2:
            continue
        for here, other in (n.inputs, n.inputs[::-1]):
            src, const = _source_input(graph, producer, here), graph.tensors.get(other)
            if src is None or src in bounds or const is None or const.value is None:
                continue
            vals = np.asarray(const.value)
            if vals.size and vals.dtype.kind in "iu" and vals.min() >= 0 and vals.max() < 2**31 - 1:
                bounds[src] = int(vals.max()) + 1
    return bounds


def _source_input(graph, producer, name: str) -> str | None:
    """The int graph input whose values reach `name` unchanged, if any."""
    for _ in range(16):
        if name in graph.inputs:
            return name if np.dtype(graph.tensors[name].dtype).kind in "iu" else None
        n = producer.get(name)
        if n is None or n.op_type not in _VALUE_PRESERVING or not n.inputs:
            return None
        name = n.inputs[0]
    return None
