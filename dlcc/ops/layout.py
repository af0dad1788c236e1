"""Layout and broadcast ops as index expressions (and zero-copy views where the bytes are the same)."""
from __future__ import annotations

import numpy as np

from ..ir import INTEGER_DTYPES
from ..kernels.map import MapExpr, emit_map, linear_index, unravel
from ..kernels.program import SAME_WIDTH_UNSIGNED, ctype, value_ctype
from ..kernels.transpose import emit_tiled_transpose, wants_tiled
from ..kernels.index_check import DIVISOR, FINITE, INDEX, emit_index_check, input_check_kernel, kind_meta, range_text
from ..kernels.scatter import emit_last_write_scatter
from .registry import ALIAS, LAYOUT, register


@register("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", since=1, category=ALIAS, half_io=True)
def _view(ctx, node):
    """Row-major data is unchanged by these: the output is a view of the input's bytes. A view
    must hold exactly the input's elements (onnx shape inference does not check a Reshape's
    target against its input; onnxruntime refuses the model when it runs)."""
    x, y = ctx.tensor(node.inputs[0]), ctx.tensor(node.outputs[0])
    if x.size != y.size:
        raise ctx.fail(f"the output shape {list(y.shape)} holds {y.size} elements, but the input "
                       f"{list(x.shape)} holds {x.size}")
    ctx.alias(node.outputs[0], node.inputs[0])


@register("Dropout", since=1, category=ALIAS)
def _dropout(ctx, node):
    """Inference: Dropout is the identity, and its mask output (if asked for) is all true: no
    element was dropped. Opset 12+ says so; before it the value was left open, and onnxruntime
    returns all false there (onnx.reference all true, as here)."""
    if len(node.inputs) > 2 and node.inputs[2]:
        tm = ctx.const(node.inputs[2])
        if tm is None or bool(tm.reshape(())):
            raise ctx.fail("training_mode must be a constant false (inference only)")
    ctx.alias(node.outputs[0], node.inputs[0])
    if len(node.outputs) > 1 and node.outputs[1]:
        emit_map(ctx, node.outputs[1], [], lambda v: ([], "1"), "DropoutMask", flops_per_elem=0)


def _axis(ax, rank):
    return ax + rank if ax < 0 else ax


@register("Transpose", since=1, category=LAYOUT, half_io=True)
def _transpose(ctx, node):
    shape = ctx.shape(node.inputs[0])
    rank = len(shape)
    perm = list(ctx.attr("perm", list(range(rank - 1, -1, -1))))
    imap = {0: lambda: _grid(shape).transpose(perm).reshape(-1)}
    if wants_tiled(shape, perm):
        emit_tiled_transpose(ctx, node.outputs[0], node.inputs[0], perm)
        ctx.program.launches[-1].expr = MapExpr([node.inputs[0]], node.outputs[0], lambda v: ([], v.ld(0, _perm_coords(v, perm))),
                                                inline_scalars=False, flops_per_elem=0, index_maps=imap)
        return

    emit_map(ctx, node.outputs[0], [node.inputs[0]], lambda v: ([], v.ld(0, _perm_coords(v, perm))), "Transpose",
             flops_per_elem=0, index_maps=imap)


def _perm_coords(v, perm):
    coords = [None] * len(perm)
    for j, p in enumerate(perm):
        coords[p] = v.o[j]
    return coords


def _grid(shape):
    """Flat element ids laid out in `shape`: numpy indexing on it gives index maps (AStitch)."""
    return np.arange(int(np.prod(shape)) if len(shape) else 1, dtype=np.int64).reshape(shape)


@register("Slice", since=1, category=LAYOUT, half_io=True)
def _slice(ctx, node):
    shape = ctx.shape(node.inputs[0])
    rank = len(shape)
    if ctx.graph.opset >= 10 or len(node.inputs) > 1:
        vals = [ctx.const(n) if k < len(node.inputs) and node.inputs[k] else None for k, n in
                enumerate(list(node.inputs[1:5]) + [""] * (5 - len(node.inputs)))]
        starts, ends, axes, steps = vals[0], vals[1], vals[2], vals[3]
        if starts is None or ends is None or (len(node.inputs) > 3 and node.inputs[3] and axes is None) \
                or (len(node.inputs) > 4 and node.inputs[4] and steps is None):
            raise ctx.fail("starts/ends/axes/steps must be constants after folding")
    else:
        starts, ends, axes, steps = ctx.attr("starts"), ctx.attr("ends"), ctx.attr("axes"), None
    starts, ends = list(np.asarray(starts).reshape(-1)), list(np.asarray(ends).reshape(-1))
    axes = list(range(len(starts))) if axes is None else [_axis(int(a), rank) for a in np.asarray(axes).reshape(-1)]
    steps = [1] * len(starts) if steps is None else list(np.asarray(steps).reshape(-1))
    begin, step = [0] * rank, [1] * rank
    for a, s, e, st in zip(axes, starts, ends, steps):
        s, e, st = int(s), int(e), int(st)
        e = max(min(e, 2**62), -(2**62))
        b, _, _ = slice(s, e, st).indices(shape[a])
        begin[a], step[a] = b, st

    def body(v):
        coords = [f"{begin[j]} + {v.o[j]}*{step[j]}" if (begin[j] or step[j] != 1) else v.o[j] for j in range(rank)]
        return [], v.ld(0, coords)

    sl = tuple(slice(begin[j], None if step[j] > 0 else None, step[j]) for j in range(rank))
    oshape = ctx.shape(node.outputs[0])

    def imap():
        g = _grid(shape)[sl]
        return g[tuple(slice(0, d) for d in oshape)].reshape(-1)

    emit_map(ctx, node.outputs[0], [node.inputs[0]], body, "Slice", flops_per_elem=0, sparse_reads=True,
             index_maps={0: imap})


@register("Concat", since=4, category=LAYOUT, half_io=True)
def _concat(ctx, node):
    ins = [i for i in node.inputs if i and np.prod(ctx.shape(i)) > 0]
    rank = len(ctx.shape(node.outputs[0]))
    ax = _axis(ctx.attr("axis"), rank)

    def body(v):
        expr, bounds, start = None, [], 0
        for k, name in enumerate(ins):
            start_k = start
            start += ctx.shape(name)[ax]
            bounds.append((start_k, start))
        parts = []
        for k, (b0, b1) in enumerate(bounds):
            coords = list(v.o)
            coords[ax] = f"({v.o[ax]} - {b0})" if b0 else v.o[ax]
            parts.append((b1, v.ld(k, coords)))

        def select(lo: int, hi: int) -> str:
            """The load of the input among parts[lo:hi] that holds the element: a binary search,
            so that the conditionals nest log2(inputs) deep. A chain nested one level per input,
            and clang refuses more than 256 (a SplitToSequence into 300 pieces, concatenated)."""
            if hi - lo == 1:
                return parts[lo][1]
            mid = (lo + hi) // 2
            return f"({v.o[ax]} < {parts[mid - 1][0]} ? {select(lo, mid)} : {select(mid, hi)})"

        return [], select(0, len(parts))

    def imap(k):
        parts = [np.full(ctx.shape(n), -2, np.int64) for n in ins]
        parts[k] = _grid(ctx.shape(ins[k]))
        return np.concatenate(parts, axis=ax).reshape(-1)

    emit_map(ctx, node.outputs[0], ins, body, "Concat", flops_per_elem=0, inline_scalars=False,
             index_maps={k: (lambda k=k: imap(k)) for k in range(len(ins))})


@register("Split", since=2, category=LAYOUT, half_io=True)
def _split(ctx, node):
    x = node.inputs[0]
    rank = len(ctx.shape(x))
    ax = _axis(ctx.attr("axis", 0), rank)
    start = 0
    for out in node.outputs:
        n = ctx.shape(out)[ax]
        if out:
            def body(v, s=start):
                coords = list(v.o)
                coords[ax] = f"{v.o[ax]} + {s}" if s else v.o[ax]
                return [], v.ld(0, coords)
            def imap(s=start, n=n):
                return np.take(_grid(ctx.shape(x)), np.arange(s, s + n), axis=ax).reshape(-1)
            emit_map(ctx, out, [x], body, "Split", flops_per_elem=0, sparse_reads=True, index_maps={0: imap})
        start += n


def _index(var: str, value: str, dim: int) -> list[str]:
    """Statements setting i64 `var` to index `value` wrapped (ONNX's negative indices) and then
    clamped into [0, dim): a kernel never reads outside its tensor, whatever the index. Every
    index is also checked (index_check), so a clamped read never becomes an answer."""
    return [f"i64 {var} = (i64)({value});", f"if ({var} < 0) {var} += {dim};",
            f"{var} = {var} < 0 ? 0 : ({var} >= {dim} ? {dim - 1} : {var});"]


def index_check(ctx, node, idx: str, bounds: list[int], last_axis: bool = False, from_zero: bool = False,
                kind: str = INDEX) -> None:
    """Check node's indices `idx` against `bounds` (one bound for every element; with `last_axis`,
    `bounds[j]` for component j of the last axis, GatherND's index tuples) where they are first
    known (kernels/index_check.py): a constant now, a graph input (through views) on the host
    before every run (Executor.check_indices) or, given as a device array, by a check kernel the
    executor launches first; a computed index on the device after the Gather. An index lies in
    [-bound, bound), or in [0, bound) with `from_zero`. Other kinds check other values the same
    ways (bounds unused): DIVISOR, an integer Div's or Mod's divisor, for a 0; FINITE, a float
    operand, for an inf or a NaN."""
    value = ctx.const(idx)
    if value is not None:
        if kind == DIVISOR and not np.asarray(value).all():
            raise ctx.fail("the integer divisor holds 0")
        if kind == FINITE and not np.isfinite(np.asarray(value, np.float64)).all():
            raise ctx.fail(f"the constant {idx!r} holds an inf or a NaN, and its values must be finite")
        if kind == INDEX:
            _check_constant(ctx, np.asarray(value), bounds, last_axis, from_zero)
        return
    src = ctx.resolve(idx)
    if src in ctx.graph.inputs:
        ctx.index_checks.append({"input": src, "node": node.name, "op": node.op_type, "bounds": [int(b) for b in bounds],
                                 "per_last_axis": last_axis, "shape": [int(d) for d in ctx.shape(src)],
                                 "from_zero": from_zero, **kind_meta(kind),
                                 **input_check_kernel(ctx, src, bounds, last_axis, from_zero, kind)})
        return
    if kind != FINITE:
        from .ranges import value_range

        lo, hi = value_range(ctx, idx) or (None, None)
        if lo is not None and ((lo > 0 or hi < 0) if kind == DIVISOR
                               else (0 if from_zero else -min(bounds)) <= lo and hi < min(bounds)):
            return  # in range (or never 0) by construction (ops/ranges.py): the check could never fire
    emit_index_check(ctx, node, idx, bounds, last_axis, from_zero, kind)


def _check_constant(ctx, value: np.ndarray, bounds: list[int], last_axis: bool, from_zero: bool = False) -> None:
    if value.size == 0:
        return
    b = np.asarray(bounds, np.int64) if last_axis else np.int64(bounds[0])
    bad = (value < (0 if from_zero else -b)) | (value >= b)
    if bad.any():
        pos = [int(x) for x in np.argwhere(bad)[0]]
        bound = int(bounds[pos[-1]]) if last_axis else int(bounds[0])
        raise ctx.fail(f"constant index {int(value[tuple(pos)])} at {pos} is outside {range_text(bound, from_zero)}")


@register("Gather", since=1, category=LAYOUT, half_io=True)
def _gather(ctx, node):
    data, idx = node.inputs[:2]
    dshape, ishape = ctx.shape(data), ctx.shape(idx)
    ax = _axis(ctx.attr("axis", 0), len(dshape))
    q = len(ishape)
    dim = dshape[ax]

    def body(v):
        icoords = v.o[ax:ax + q]
        s = _index("g", v.ld(1, icoords), dim)
        coords = v.o[:ax] + ["(int)g"] + v.o[ax + q:]
        return s, v.ld(0, coords)

    const_idx = ctx.const(idx)

    def imap():
        if const_idx is None:
            return np.full(int(np.prod(ctx.shape(node.outputs[0]))), -1, np.int64)
        ii = np.where(const_idx < 0, const_idx + dim, const_idx)
        return np.take(_grid(dshape), ii, axis=ax).reshape(-1)

    def imap_indices():  # output element (outer, i, inner) reads indices[i]
        grid = _grid(ishape).reshape((1,) * ax + tuple(ishape) + (1,) * (len(dshape) - ax - 1))
        return np.broadcast_to(grid, ctx.shape(node.outputs[0])).reshape(-1)

    emit_map(ctx, node.outputs[0], [data, idx], body, "Gather", flops_per_elem=0, inline_scalars=False, sparse_reads=True,
             index_maps={0: imap, 1: imap_indices})
    index_check(ctx, node, idx, [dim])  # after the Gather: a stitch may compute idx inside it


@register("GatherElements", since=11, category=LAYOUT, half_io=True)
def _gather_elements(ctx, node):
    data, idx = node.inputs[:2]
    dshape = ctx.shape(data)
    ax = _axis(ctx.attr("axis", 0), len(dshape))

    def body(v):
        s = _index("g", v.ld(1, v.o), dshape[ax])
        coords = list(v.o)
        coords[ax] = "(int)g"
        return s, v.ld(0, coords)

    size = int(np.prod(ctx.shape(node.outputs[0])))  # output element i reads indices[i]
    emit_map(ctx, node.outputs[0], [data, idx], body, "GatherElements", flops_per_elem=0, inline_scalars=False,
             sparse_reads=True, index_maps={1: lambda: np.arange(size, dtype=np.int64)})
    index_check(ctx, node, idx, [dshape[ax]])


@register("GatherND", since=11, category=LAYOUT, half_io=True)
def _gather_nd(ctx, node):
    """out[o] = data[o[:b], indices[o[:q]], o[q:]]: q = rank(indices) - 1, b = batch_dims."""
    data, idx = node.inputs[:2]
    dshape, ishape = ctx.shape(data), ctx.shape(idx)
    b = ctx.attr("batch_dims", 0)
    q, k = len(ishape) - 1, ishape[-1]

    def body(v):
        s, coords = [], list(v.o[:b])
        for j in range(k):
            s += _index(f"g{j}", v.ld(1, v.o[:q] + [str(j)]), dshape[b + j])
            coords.append(f"(int)g{j}")
        return s, v.ld(0, coords + v.o[q:])

    emit_map(ctx, node.outputs[0], [data, idx], body, "GatherND", flops_per_elem=0, inline_scalars=False, sparse_reads=True)
    index_check(ctx, node, idx, [dshape[b + j] for j in range(k)], last_axis=True)


#: How a scatter combines an update with the value already there (ONNX's `reduction`); max and
#: min are std::max/std::min's comparisons, as onnxruntime applies them.
_SCATTER_COMBINE = {
    "none": lambda acc, u: u,
    "add": lambda acc, u: f"{acc} + {u}",
    "mul": lambda acc, u: f"{acc} * {u}",
    "max": lambda acc, u: f"(({acc}) < ({u}) ? ({u}) : ({acc}))",
    "min": lambda acc, u: f"(({u}) < ({acc}) ? ({u}) : ({acc}))",
}


def _scatter_combine(ctx):
    reduction = ctx.attr("reduction", "none")
    if reduction not in _SCATTER_COMBINE:
        raise ctx.fail(f"reduction {reduction!r} is not one of {', '.join(_SCATTER_COMBINE)}")
    return _SCATTER_COMBINE[reduction]


#: Up to this many updates per output element (ScatterElements: indices.shape[axis]; ScatterND:
#: all of them), a scatter is one map kernel that scans them; beyond it, without a reduction,
#: three launches in O(outputs + updates) (kernels/scatter.py).
SCATTER_SCAN_MAX = 64


@register("Scatter", since=9, category=LAYOUT, half_io=True)
@register("ScatterElements", since=11, category=LAYOUT, half_io=True)
def _scatter_elements(ctx, node):
    """out = data, then out[j with j[axis] = indices[j]] = updates[j] for every j of indices, in
    order (a later duplicate wins, or combines by `reduction`).

    As a map: each output element starts from data and scans the updates that could land on it
    (those sharing its other coordinates: indices.shape[axis] of them), applying the matches in
    index order. That is the order onnxruntime applies them in, so duplicates and reductions
    give its answer, with no atomics and no second kernel writing the same buffer. The cost is
    indices.shape[axis] compares per output element: small for the scatters real models make
    (a padded edge, a KV-cache row), and priced as such. Past SCATTER_SCAN_MAX of them, without a
    reduction, the updates claim their targets instead (kernels/scatter.py)."""
    data, idx, upd = node.inputs[:3]
    dshape, ishape = ctx.shape(data), ctx.shape(idx)
    r = len(dshape)
    ax = _axis(ctx.attr("axis", 0), r)
    # Along the axis the indices may be longer than data (several updates per element, as
    # onnxruntime allows); across it they must fit inside.
    if len(ishape) != r or ctx.shape(upd) != ishape or any(i > d for j, (d, i) in enumerate(zip(dshape, ishape))
                                                          if j != ax):
        raise ctx.fail(f"indices {list(ishape)} and updates {list(ctx.shape(upd))} must have the same rank and "
                       f"shape as each other, within data {list(dshape)} but along axis {ax}")
    combine = _scatter_combine(ctx)
    if ctx.attr("reduction", "none") == "none" and ishape[ax] > SCATTER_SCAN_MAX:
        def slot_of(u):
            coords, stmts = unravel(u, ishape, "c")
            coords[ax] = "g"
            return (stmts + [f"i64 g = (i64)ix[{u}]; if (g < 0) g += {dshape[ax]};"],
                    f"(g < 0 || g >= {dshape[ax]} ? (i64)-1 : (i64)({linear_index(coords, dshape)}))")

        count = int(np.prod(ishape))
        emit_last_write_scatter(ctx, node.op_type, node.outputs[0], data, idx, upd, count, 1, slot_of)
        index_check(ctx, node, idx, [dshape[ax]])
        return
    acc_t = value_ctype(ctx.dtype(data))

    def body(v):
        coords = list(v.o)
        coords[ax] = "q"
        inside = [f"{v.o[d]} < {ishape[d]}" for d in range(r) if d != ax and ishape[d] < dshape[d]]
        loop = (f"for (int q = 0; q < {ishape[ax]}; ++q) {{ "
                f"i64 g = (i64)({v.ld(1, coords)}); if (g < 0) g += {dshape[ax]}; "
                f"if (g == {v.o[ax]}) acc = {combine('acc', v.ld(2, coords))}; }}")
        s = [f"{acc_t} acc = {v.ld(0)};", f"if ({' && '.join(inside)}) {{ {loop} }}" if inside else loop]
        return s, "acc"

    emit_map(ctx, node.outputs[0], [data, idx, upd], body, node.op_type, flops_per_elem=max(1, ishape[ax]),
             inline_scalars=False)
    index_check(ctx, node, idx, [dshape[ax]])


@register("ScatterND", since=11, category=LAYOUT, half_io=True)
def _scatter_nd(ctx, node):
    """out = data, then out[indices[u]] = updates[u] for every index tuple u, in order (k =
    indices.shape[-1] leading coordinates each; a later duplicate wins, or combines by
    `reduction`). As a map, like ScatterElements: each output element scans the U index tuples
    and applies those naming its leading coordinates, in order (U compares per element)."""
    data, idx, upd = node.inputs[:3]
    dshape, ishape = ctx.shape(data), ctx.shape(idx)
    k = ishape[-1] if ishape else 0
    if not ishape or not 1 <= k <= len(dshape):
        raise ctx.fail(f"indices {list(ishape)} must end in a tuple length between 1 and data's rank {len(dshape)}")
    want = tuple(ishape[:-1]) + tuple(dshape[k:])
    if tuple(ctx.shape(upd)) != want:
        raise ctx.fail(f"updates have shape {list(ctx.shape(upd))}; indices {list(ishape)} into data "
                       f"{list(dshape)} need {list(want)}")
    combine = _scatter_combine(ctx)
    acc_t = value_ctype(ctx.dtype(data))
    count = int(np.prod(ishape[:-1])) if len(ishape) > 1 else 1
    inner = int(np.prod(dshape[k:])) if k < len(dshape) else 1
    if ctx.attr("reduction", "none") == "none" and count > SCATTER_SCAN_MAX:
        _scatter_nd_claimed(ctx, node, k, count, inner)
        return

    def body(v):
        rest = linear_index(v.o[k:], dshape[k:]) if k < len(dshape) else "0"
        reads = " ".join(f"i64 g{j} = (i64)({v.ld_flat(1, f'u * {k} + {j}')}); if (g{j} < 0) g{j} += {dshape[j]};"
                         for j in range(k))
        match = " && ".join(f"g{j} == {v.o[j]}" for j in range(k))
        loop = (f"for (int u = 0; u < {count}; ++u) {{ {reads} "
                f"if ({match}) acc = {combine('acc', v.ld_flat(2, f'u * {inner} + {rest}'))}; }}")
        return [f"{acc_t} acc = {v.ld(0)};", loop], "acc"

    emit_map(ctx, node.outputs[0], [data, idx, upd], body, "ScatterND", flops_per_elem=max(1, count),
             inline_scalars=False)
    index_check(ctx, node, idx, [dshape[j] for j in range(k)], last_axis=True)


def _scatter_nd_claimed(ctx, node, k: int, count: int, inner: int) -> None:
    """ScatterND without a reduction, by many updates (kernels/scatter.py): each index tuple's
    slot is its row-major offset among data's first k axes, a negative coordinate counted from
    the end."""
    data, idx, upd = node.inputs[:3]
    dshape = ctx.shape(data)

    def slot_of(u):
        s = ["i64 slot = 0; int bad = 0;"]
        for j in range(k):
            s.append(f"{{ i64 g = (i64)ix[(i64){u} * {k} + {j}]; if (g < 0) g += {dshape[j]}; "
                     f"bad |= g < 0 || g >= {dshape[j]}; slot = slot * {dshape[j]} + g; }}")
        return s, "(bad ? (i64)-1 : slot)"

    emit_last_write_scatter(ctx, "ScatterND", node.outputs[0], data, idx, upd, count, inner, slot_of)
    index_check(ctx, node, idx, [dshape[j] for j in range(k)], last_axis=True)


@register("Expand", since=8, category=LAYOUT, half_io=True)
def _expand(ctx, node):
    emit_map(ctx, node.outputs[0], [node.inputs[0]], lambda v: ([], v.x(0)), "Expand", flops_per_elem=0,
             inline_scalars=False)


@register("Tile", since=6, category=LAYOUT, half_io=True)
def _tile(ctx, node):
    shape = ctx.shape(node.inputs[0])
    emit_map(ctx, node.outputs[0], [node.inputs[0]],
             lambda v: ([], v.ld(0, [f"{c} % {d}" if d != 1 else "0" for c, d in zip(v.o, shape)])),
             "Tile", flops_per_elem=0, inline_scalars=False,
             index_maps={0: lambda: np.tile(_grid(shape), [o // d for o, d in zip(ctx.shape(node.outputs[0]), shape)]).reshape(-1)})


@register("Pad", since=11, category=LAYOUT, half_io=True)
def _pad(ctx, node):
    x = node.inputs[0]
    shape = ctx.shape(x)
    rank = len(shape)
    pads = ctx.const(node.inputs[1])
    if pads is None:
        raise ctx.fail("pads must be a constant after folding")
    pads = [int(p) for p in pads.reshape(-1)]
    axes = list(range(rank))
    if len(node.inputs) > 3 and node.inputs[3]:
        axes = [_axis(int(a), rank) for a in ctx.const(node.inputs[3]).reshape(-1)]
    begin, end = [0] * rank, [0] * rank
    for k, a in enumerate(axes):
        begin[a], end[a] = pads[k], pads[len(axes) + k]
    mode = ctx.attr("mode", "constant")
    if mode not in ("constant", "edge", "reflect", "wrap"):
        raise ctx.fail(f"mode {mode!r} is not constant, edge, reflect or wrap")
    cval = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else ""

    def body(v):
        """Negative pads crop first, and the modes then pad what is left (as onnxruntime does):
        along axis j the kept input is [lo, lo + n), and output coordinate o reads q = o - pad
        of it, q mapped into [0, n) by the mode. Pads of any size stay inside the input."""
        s, coords, conds = [], [], []
        for j in range(rank):
            c, lo = f"p{j}", max(0, -begin[j])
            n = shape[j] - lo - max(0, -end[j])
            s.append(f"int {c} = {v.o[j]} - {max(begin[j], 0)};")
            if mode == "edge":
                s.append(f"{c} = {c} < 0 ? 0 : ({c} >= {n} ? {n - 1} : {c});")
            elif mode == "reflect":  # mirrored about the first and last element, period 2(n - 1)
                if n == 1:
                    s.append(f"{c} = 0;")
                else:
                    s.append(f"{c} = (({c} % {2 * n - 2}) + {2 * n - 2}) % {2 * n - 2};")
                    s.append(f"{c} = {c} < {n} ? {c} : {2 * n - 2} - {c};")
            elif mode == "wrap":
                s.append(f"{c} = (({c} % {n}) + {n}) % {n};")
            else:
                conds.append(f"{c} >= {lo} && {c} < {lo + n}")  # (tested after the shift below)
            if lo:
                s.append(f"{c} += {lo};")
            coords.append(c)
        if mode != "constant":
            return s, v.ld(0, coords)
        fill = v.x(1) if cval else "0"
        return s, f"({' && '.join(conds) or '1'}) ? {v.ld(0, coords)} : {fill}"

    ins = [x, cval] if cval else [x]
    oshape = ctx.shape(node.outputs[0])

    def imap():
        if any(b < 0 for b in begin) or any(o < d + b for o, d, b in zip(oshape, shape, begin)):
            return np.full(int(np.prod(oshape)), -1, np.int64)  # cropping pads: left to the generic rule
        widths = [(b, o - d - b) for b, o, d in zip(begin, oshape, shape)]
        if mode != "constant":
            return np.pad(_grid(shape), widths, mode=mode).reshape(-1)
        return np.pad(_grid(shape), widths, constant_values=-2).reshape(-1)

    emit_map(ctx, node.outputs[0], ins, body, "Pad", flops_per_elem=0, index_maps={0: imap})


@register("DepthToSpace", since=11, category=LAYOUT, half_io=True)
def _depth_to_space(ctx, node):
    n, c, h, w = ctx.shape(node.inputs[0])
    b = ctx.attr("blocksize")
    mode = ctx.attr("mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise ctx.fail(f"mode {mode!r} is not DCR or CRD")
    crd = mode == "CRD"
    oc = c // (b * b)

    def body(v):
        s = [f"const int bh = {v.o[2]} % {b}, bw = {v.o[3]} % {b};"]
        ch = f"({v.o[1]} * {b * b} + bh * {b} + bw)" if crd else f"((bh * {b} + bw) * {oc} + {v.o[1]})"
        return s, v.ld(0, [v.o[0], ch, f"{v.o[2]} / {b}", f"{v.o[3]} / {b}"])

    emit_map(ctx, node.outputs[0], [node.inputs[0]], body, "DepthToSpace", flops_per_elem=0)


@register("Col2Im", since=18, category=LAYOUT, half_io=True)
def _col2im(ctx, node):
    """The columns of sliding blocks summed back into an image (torch.nn.Fold, the inverse of an
    im2col): output pixel y of channel c adds, for each kernel offset k, the column entry of the
    block that covers y at k, where one does (y + pad - k * dilation a multiple of the stride, and
    the block inside the grid of blocks)."""
    x = node.inputs[0]
    image, block = (ctx.const(node.inputs[k]) for k in (1, 2))
    if image is None or block is None:
        raise ctx.fail("image_shape and block_shape must be constants after folding")
    image, block = [int(d) for d in image.reshape(-1)], [int(d) for d in block.reshape(-1)]
    nd = len(image)
    dil = [int(d) for d in ctx.attr("dilations", [1] * nd)]
    strides = [int(d) for d in ctx.attr("strides", [1] * nd)]
    pads = [int(d) for d in ctx.attr("pads", [0] * (2 * nd))]
    grid = [(image[j] + pads[j] + pads[nd + j] - dil[j] * (block[j] - 1) - 1) // strides[j] + 1 for j in range(nd)]
    n, ckk, L = ctx.shape(x)
    K = int(np.prod(block))
    if min(grid) < 1 or int(np.prod(grid)) != L or ckk % K:
        raise ctx.fail(f"an input of shape {[n, ckk, L]} does not hold {K}-element columns of a "
                       f"{'x'.join(map(str, grid))} grid of blocks")

    dt = ctx.value_dtype(x)
    if dt != "float32" and dt not in INTEGER_DTYPES:
        raise ctx.fail(f"Col2Im of {dt} values is not supported (floats and integers are: it sums them)")
    # integers sum exactly, wrapping as numpy does: in the unsigned type of their width (a float
    # rounds past 2^24, and signed overflow is undefined in C)
    acc_t, add, result = ("float", "", "acc") if dt == "float32" else (
        SAME_WIDTH_UNSIGNED[dt], f"({SAME_WIDTH_UNSIGNED[dt]})", f"({ctype(dt)})acc")

    def body(v):
        s = [f"{acc_t} acc = 0;", f"for (int kk = 0; kk < {K}; ++kk) {{", "    int ok = 1, l = 0, r = kk;"]
        for j in reversed(range(nd)):  # kernel offset k_j, then the block whose offset k_j covers y_j
            s += [f"    const int k{j} = r % {block[j]}; r /= {block[j]};",
                  f"    const int q{j} = {v.o[2 + j]} + {pads[j]} - k{j} * {dil[j]};",
                  f"    ok = ok && q{j} >= 0 && q{j} % {strides[j]} == 0 && q{j} / {strides[j]} < {grid[j]};"]
        s.append("    if (ok) {")
        stride = 1
        for j in reversed(range(nd)):
            s.append(f"        l += (q{j} / {strides[j]}) * {stride};")
            stride *= grid[j]
        s += [f"        acc += {add}{v.ld(0, [v.o[0], f'{v.o[1]} * {K} + kk', 'l'])};", "    }", "}"]
        return s, result

    emit_map(ctx, node.outputs[0], [x], body, "Col2Im", flops_per_elem=K)


@register("SpaceToDepth", since=1, category=LAYOUT, half_io=True)
def _space_to_depth(ctx, node):
    """Each b x b block of pixels into channels. DCR (the default, and the only order before
    opset 28): block offset major, output channel (bh * b + bw) * C + c reads
    x[c, h * b + bh, w * b + bw] (YOLOX's and YOLOv5's Focus stem). CRD (opset 28's `mode`):
    channel major, output channel c * b * b + bh * b + bw."""
    _, c, _, _ = ctx.shape(node.inputs[0])
    b = ctx.attr("blocksize")
    mode = ctx.attr("mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise ctx.fail(f"mode {mode!r} is not DCR or CRD")

    def body(v):
        if mode == "CRD":
            s = [f"const int sc = {v.o[1]} / {b * b}, sd = {v.o[1]} % {b * b};"]
        else:
            s = [f"const int sd = {v.o[1]} / {c}, sc = {v.o[1]} % {c};"]
        return s, v.ld(0, [v.o[0], "sc", f"{v.o[2]} * {b} + sd / {b}", f"{v.o[3]} * {b} + sd % {b}"])

    emit_map(ctx, node.outputs[0], [node.inputs[0]], body, "SpaceToDepth", flops_per_elem=0)


@register("Trilu", since=14, category=LAYOUT, half_io=True)
def _trilu(ctx, node):
    k = 0
    if len(node.inputs) > 1 and node.inputs[1]:
        kv = ctx.const(node.inputs[1])
        if kv is None:
            raise ctx.fail("k must be a constant")
        k = int(kv.reshape(()))
    upper = ctx.attr("upper", 1)

    def body(v):
        r, c = v.o[-2], v.o[-1]
        cond = f"{c} - {r} >= {k}" if upper else f"{c} - {r} <= {k}"
        return [], f"({cond}) ? {v.x(0)} : 0"

    emit_map(ctx, node.outputs[0], [node.inputs[0]], body, "Trilu", flops_per_elem=0)


def identity_copy(ctx, out: str, src: str) -> None:
    """A plain copy kernel (used where a view cannot be used, e.g. an output that is an input)."""
    shape = ctx.shape(src)
    emit_map(ctx, out, [src], lambda v: ([], v.ld(0, v.o) if shape == ctx.shape(out) else v.ld_flat(0, v.i)),
             "Copy", flops_per_elem=0, inline_scalars=False)
