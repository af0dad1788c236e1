"""Element-level dependencies, computed from index maps rather than op names.

For a map node's input k, `input_index(node, k)` is an int array over the node's output elements
(flat, row-major): the flat input element each output element reads, -1 where that depends on
data (Gather with computed indices) or is unknown, -2 where the input is not read at all (the
other branch of a Concat, a constant Pad border). Inputs read through the default numpy
broadcast (`v.x(k)`, detected by probing the body) get their map from the shapes alone; layout
ops give theirs explicitly (ops/layout.py `index_maps`). For a reduce node the domain is
(output o, step r) and the map is the layout's base(o) + off(r).

The stitcher traces these maps through the Local (inlined) chain between two materialized nodes
and asks one question per edge: does unit u of the consumer read only unit u of the producer?
Yes: the producer's slice can stay in the block's shared memory (Regional); no or unknown: it
must go through global memory behind a grid barrier (Global). Unknown is always the safe answer.
"""
from __future__ import annotations

import numpy as np

from ...kernels.map import MapView

#: Tensors above this many elements are not traced (their edges are classified conservatively).
MAX_TRACE = 1 << 22


class _Probe(MapView):
    """A MapView that records how the body reads each input: default broadcast or custom coords."""

    def __init__(self, node):
        n = len(node.in_shapes)
        super().__init__([f"o{j}" for j in range(len(node.out_shape))], "i", tuple(node.out_shape),
                         list(node.in_shapes), [f"x{k}" for k in range(n)], list(node.in_literals), [False] * n)
        self.how: dict[int, str] = {}

    def ld(self, k, coords=None):
        if self.in_literals[k] is None:
            prev = self.how.get(k)
            self.how[k] = "bcast" if coords is None and prev in (None, "bcast") else "custom"
        return f"x{k}[0]"

    def ld_flat(self, k, flat):
        if self.in_literals[k] is None:
            self.how[k] = "custom"
        return f"x{k}[0]"


def access_kinds(node) -> dict[int, str]:
    if "_how" not in node.__dict__:
        p = _Probe(node)
        node.body(p)
        node.__dict__["_how"] = p.how
    return node.__dict__["_how"]


def _grid(shape):
    n = int(np.prod(shape)) if len(shape) else 1
    return np.arange(n, dtype=np.int64).reshape(shape)


def broadcast_index(in_shape, out_shape) -> np.ndarray:
    shp = (1,) * (len(out_shape) - len(in_shape)) + tuple(in_shape)
    return np.broadcast_to(_grid(shp), tuple(out_shape)).reshape(-1)


def input_index(node, k: int) -> np.ndarray | None:
    """Flat input-k element read by each output element of map node `node` (see module doc)."""
    size = int(np.prod(node.out_shape)) if node.out_shape else 1
    if size > MAX_TRACE:
        return None
    cache = node.__dict__.setdefault("_imaps", {})
    if k in cache:
        return cache[k]
    how = access_kinds(node).get(k)
    fn = node.index_maps.get(k, "absent")
    if how is None:  # never read (a literal or an unused input)
        m = np.full(size, -2, np.int64)
    elif how == "bcast":
        m = broadcast_index(node.in_shapes[k], node.out_shape)
    elif callable(fn):
        m = np.asarray(fn(), dtype=np.int64).reshape(-1)
        if m.size != size:
            m = np.full(size, -1, np.int64)
    else:
        m = np.full(size, -1, np.int64)
    cache[k] = m
    return m


def reduce_index(red) -> np.ndarray | None:
    """[O, R] flat input elements read for output o at step r (any reduced axes)."""
    shape, axes = tuple(red.shape), list(red.axes)
    if int(np.prod(shape)) > MAX_TRACE:
        return None
    kept = [a for a in range(len(shape)) if a not in axes]
    g = _grid(shape).transpose(kept + axes)
    O = int(np.prod([shape[a] for a in kept])) if kept else 1
    return g.reshape(O, -1)


def is_identity(m: np.ndarray | None, size: int) -> bool:
    return m is not None and m.size == size and bool(np.array_equal(m, np.arange(size)))


def same_shape_broadcast(node, k: int) -> bool | None:
    """For input k of map node `node` read through the default broadcast: whether its shape is
    the output's (left-padded with 1s), so output element i reads its element i. None for other
    reads (custom coordinates, literals, unread inputs), which need their traced map."""
    if access_kinds(node).get(k) != "bcast":
        return None
    shp = tuple(node.in_shapes[k])
    out = tuple(node.out_shape)
    return (1,) * (len(out) - len(shp)) + shp == out


def reads_identity(node, k: int, size: int) -> bool:
    """Whether output element i of map node `node` reads element i of its input k, for all `size`
    output elements. A broadcast read answers from the shapes at any size (a 12 x 1024 x 1024
    attention score tensor is past MAX_TRACE, and tracing it would take 100 MB); other reads are
    traced, and unknown (past MAX_TRACE) is no."""
    same = same_shape_broadcast(node, k)
    if same is not None:
        return same and int(np.prod(node.out_shape) if node.out_shape else 1) == size
    return is_identity(input_index(node, k), size)

