"""Standard ONNX ops that dlcc writes as other standard ops at import, once the shapes are static:
OneHot, Hardmax, LpNormalization, LpPool, GlobalLpPool, EyeLike, ReverseSequence, Compress (by a
constant condition), Det (of small matrices), Einsum (einsum.py), GridSample (grid_sample.py) and DeformConv (deform_conv.py);
and the simple ops of the ai.onnx.ml domain (ml_ops.py).

Why a rewrite and not a kernel of their own: each is a short composition of ops dlcc already
lowers, checks and stitches (Equal against a Range, an ArgMax, a reduction, a pooling, a Gather),
and AStitch fuses the pieces back into one kernel where that pays. onnx defines none of them by a
function body (expand.py covers the ops it does), so the bodies are dlcc's, each written after
onnxruntime's CPU kernel, which the tests compare against.

They run after the dims are bound, the constants folded and the loops unrolled
(frontend.import_model), because most need a static shape: Einsum's reshapes, OneHot's depth,
Hardmax's row length. An op with a lowering of its own in the registry keeps it.
"""
from __future__ import annotations

import numpy as np
import onnx

from .fused_ops import _Builder
from .large_attributes import with_forest
from .rewrite import rewrite_rounds

_F = onnx.TensorProto.FLOAT


def lower_composite(model: onnx.ModelProto, infer, weights, path, supported: set[str],
                    float64: bool = False, forests: dict | None = None) -> tuple[onnx.ModelProto, list[str]]:
    """Rewrite (in place) every node of `model`'s main graph whose op is in REWRITES and has no
    lowering in `supported`. Returns the model and a note for the pass log. `float64`: a precision
    was asked for, so float64 may be computed in float32 (a tree ensemble's float64 input too).
    `forests`: the large forests the import kept aside (large_attributes.stash_forests)."""
    from .ml_ops import ML, ML_REWRITES
    from .ml_trees import TREE_OPS

    def chosen(n: onnx.NodeProto) -> bool:
        return (n.domain in ("", "ai.onnx") and n.op_type in REWRITES and n.op_type not in supported) or (
            n.domain == ML and n.op_type in ML_REWRITES) or (n.domain in ("", "ai.onnx") and _batch_major(n))

    def rewrite(b: _Builder) -> None:
        if b.node.domain in ("", "ai.onnx") and _batch_major(b.node):
            return _time_major(b)
        (ML_REWRITES if b.node.domain == ML else REWRITES)[b.node.op_type](b)

    if not any(chosen(n) for n in model.graph.node):
        return model, []
    notes = []
    from .frontend import opset_of

    ml = {n.op_type for n in model.graph.node if n.domain == ML and chosen(n)}
    need = 13 if ml & TREE_OPS else 11
    if ml and opset_of(model) < need:
        from .rewrite import raise_opset  # (LightGBM's converter writes opsets 8 and 9)

        model, note = raise_opset(model, need, path, "the ai.onnx.ml ops are written with "
                                  + ("opset 13's CumSum, GatherElements and LessOrEqual" if need == 13
                                     else "opset 11's integer constants"))
        notes.append(note)
    def builder(*args, **kw) -> _Builder:
        b = _Builder(*args, **kw)
        b.narrow_float64 = float64  # (read by ml_trees._input)
        b.attrs = with_forest(b.node, b.attrs, forests or {}, path)
        return b

    _, counts = rewrite_rounds(model, infer, weights, path, chosen, rewrite, builder)
    return model, notes + ["import: written as standard ops (dlcc/composite.py): "
                           + ", ".join(f"{n} {op}" for op, n in sorted(counts.items()))]


# -- recurrent layers, batch-major ----------------------------------------------------------------
#: The recurrent ops, and the positions of their initial states among the inputs.
_RECURRENT_STATES = {"LSTM": (5, 6), "GRU": (5,), "RNN": (5,)}


def _batch_major(n: onnx.NodeProto) -> bool:
    return n.op_type in _RECURRENT_STATES and any(a.name == "layout" and a.i == 1 for a in n.attribute)


def _time_major(b: _Builder) -> None:
    """An LSTM, GRU or RNN with layout=1 (X [batch, seq, input], states [batch, directions,
    hidden], Y [batch, seq, directions, hidden]) as the time-major layer the lowering computes,
    between Transposes: of X and the initial states in, of Y and the final states out."""
    n = b.node
    ins = list(n.input)
    for k in (0, *_RECURRENT_STATES[n.op_type]):
        if k < len(ins) and ins[k]:
            ins[k] = b.op("Transpose", [ins[k]], perm=[1, 0, 2])
    outs = [b.fresh(f"time_major{k}") if o else "" for k, o in enumerate(n.output)]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute if a.name != "layout"}
    b.nodes.append(onnx.helper.make_node(n.op_type, ins, outs, name=f"{b.label}/time_major", **attrs))
    for k, (o, t) in enumerate(zip(n.output, outs)):
        if o:
            b.op("Transpose", [t], o, perm=[2, 0, 1, 3] if k == 0 else [1, 0, 2])


def _axis(b: _Builder, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise b.fail(f"axis {axis} is outside [{-rank}, {rank - 1}] for an input of rank {rank}")
    return axis % rank


def _along(b: _Builder, n: int, axis: int, rank: int) -> str:
    """0, 1, ..., n-1 as an int64 tensor of rank `rank`, laid along `axis` (ones elsewhere), so it
    broadcasts against a tensor of that rank."""
    shape = [1] * rank
    shape[axis] = n
    return b.constant(np.arange(n, dtype=np.int64).reshape(shape), np.int64)


# -- OneHot ---------------------------------------------------------------------------------------
def _one_hot(b: _Builder) -> None:
    """out[..., j, ...] = on where j == index (a negative index counts from depth), else off; an
    index outside [-depth, depth) gives a row of off values, as onnxruntime's kernel does."""
    if len(b.node.input) != 3 or not all(b.node.input):
        raise b.fail("takes 3 inputs: indices, depth, values")
    idx, depth_name, values = b.node.input
    depth = b.const(depth_name)
    if depth is None:
        raise b.unsupported("a depth computed at run time (the output's shape would depend on it)")
    if depth.size != 1:
        raise b.fail(f"depth must hold one value, not {depth.size}")
    n = int(np.asarray(depth).reshape(-1)[0])
    if n < 1:
        raise b.fail(f"depth must be at least 1, not {n}")
    rank = len(b.shape(idx)) + 1
    axis = _axis(b, int(b.attr("axis", -1)), rank)
    i = idx if b.elem(idx) == onnx.TensorProto.INT64 else b.op("Cast", [idx], to=onnx.TensorProto.INT64)
    zero, width = b.constant(np.int64(0), np.int64), b.constant(np.int64(n), np.int64)
    i = b.op("Where", [b.op("Less", [i, zero]), b.op("Add", [i, width]), i])
    hit = b.op("Equal", [b.unsqueeze(i, [axis]), _along(b, n, axis, rank)])
    if b.shape(values) not in ((2,),):
        raise b.fail(f"values must be [off, on], of shape [2], not {list(b.shape(values))}")
    off = b.op("Gather", [values, b.constant(np.int64(0), np.int64)], axis=0)
    on = b.op("Gather", [values, b.constant(np.int64(1), np.int64)], axis=0)
    b.op("Where", [hit, on, off], b.node.output[0])


# -- Hardmax --------------------------------------------------------------------------------------
def _hardmax(b: _Builder) -> None:
    """1 at the first maximum along `axis`, 0 elsewhere. Before opset 13 the input is seen as 2-D,
    [prod(dims before axis), prod(dims from axis on)], and the maximum is taken over each row."""
    x = b.node.input[0]
    shape = b.shape(x)
    rank = len(shape)
    if b.opset >= 13:
        axis = _axis(b, int(b.attr("axis", -1)), rank)
        y, n, r, flat = x, shape[axis], rank, None
    else:
        axis = _axis(b, int(b.attr("axis", 1)), rank) if rank else 0
        rows, n = int(np.prod(shape[:axis], dtype=np.int64)), int(np.prod(shape[axis:], dtype=np.int64))
        flat = b.ints(*shape)
        y, axis, r = b.op("Reshape", [x, b.ints(rows, n)]), 1, 2
    if n == 0 or 0 in shape:
        b.op("Identity", [x], b.node.output[0])
        return
    first = b.op("ArgMax", [y], axis=axis, keepdims=1)
    one_hot = b.op("Cast", [b.op("Equal", [first, _along(b, n, axis, r)])], to=b.elem(x) or _F)
    b.op("Reshape", [one_hot, flat], b.node.output[0]) if flat else b.op("Identity", [one_hot], b.node.output[0])


# -- norms and pools ------------------------------------------------------------------------------
def _lp_normalization(b: _Builder) -> None:
    """x / ||x||_p along `axis` (p 1 or 2); a row whose norm is 0 gives 0s, as onnxruntime's
    kernel does (also where x's squares underflow to a norm of 0 while x is not 0)."""
    x = b.node.input[0]
    rank = len(b.shape(x))
    axis = _axis(b, int(b.attr("axis", -1)), rank)
    p = int(b.attr("p", 2))
    if p not in (1, 2):
        raise b.fail(f"p must be 1 or 2, not {p}")
    op = "ReduceL1" if p == 1 else "ReduceL2"
    norm = (b.op(op, [x, b.ints(axis)], keepdims=1) if b.opset >= 18 else b.op(op, [x], axes=[axis], keepdims=1))
    zero = b.const_of(0.0, x)
    b.op("Where", [b.op("Equal", [norm, zero]), zero, b.op("Div", [x, norm])], b.node.output[0])


def _abs_pow(b: _Builder, x: str, p: int) -> str:
    a = b.op("Abs", [x])
    return a if p == 1 else b.op("Mul", [a, a]) if p == 2 else b.op("Pow", [a, b.const_of(float(p), x)])


def _root(b: _Builder, s: str, p: int, out: str) -> None:
    if p == 1:
        b.op("Identity", [s], out)
    elif p == 2:
        b.op("Sqrt", [s], out)
    else:
        b.op("Pow", [s, b.const_of(1.0 / p, s)], out)


def _p(b: _Builder) -> int:
    p = int(b.attr("p", 2))
    if p < 1:
        raise b.fail(f"p must be 1 or more, not {p}")
    return p


def _global_lp_pool(b: _Builder) -> None:
    """(sum of |x|^p over the spatial dims)^(1/p), keeping them as 1s."""
    x, p = b.node.input[0], _p(b)
    rank = len(b.shape(x))
    axes = list(range(2, rank))
    s = _abs_pow(b, x, p)
    if axes:
        s = b.op("ReduceSum", [s, b.ints(*axes)], keepdims=1) if b.opset >= 13 else b.op("ReduceSum", [s], axes=axes,
                                                                                           keepdims=1)
    _root(b, s, p, b.node.output[0])


def _lp_pool(b: _Builder) -> None:
    """(sum of |x|^p over each window)^(1/p): an AveragePool of |x|^p that counts the padding (which
    adds zeros, as LpPool's does) times the window's size. The window attributes pass through."""
    x, p = b.node.input[0], _p(b)
    kernel = b.attr("kernel_shape", [])
    if not kernel:
        raise b.fail("attribute 'kernel_shape' is required")
    attrs = {k: v for k, v in b.attrs.items() if k in ("kernel_shape", "strides", "pads", "auto_pad", "ceil_mode",
                                                        "dilations")}
    if "dilations" in attrs and any(d != 1 for d in attrs["dilations"]) and b.opset < 19:
        raise b.unsupported("a dilated LpPool before opset 19")
    avg = b.op("AveragePool", [_abs_pow(b, x, p)], count_include_pad=1, **attrs)
    s = b.op("Mul", [avg, b.const_of(float(np.prod(kernel)), x)])
    _root(b, s, p, b.node.output[0])


# -- shapes and sequences -------------------------------------------------------------------------
def _eye_like(b: _Builder) -> None:
    """A constant: ones on diagonal k of the input's 2-D shape, in `dtype` (else the input's)."""
    shape = b.shape(b.node.input[0])
    if len(shape) != 2:
        raise b.fail(f"the input must be 2-D, not of rank {len(shape)}")
    elem = int(b.attr("dtype", 0)) or b.elem(b.node.input[0]) or _F
    try:
        dt = onnx.helper.tensor_dtype_to_np_dtype(elem)
    except KeyError:
        raise b.fail(f"dtype {elem} is no ONNX type") from None
    eye = np.eye(shape[0], shape[1], int(b.attr("k", 0)), dtype=dt)
    b.op("Identity", [b.constant(eye, dt)], b.node.output[0])


def _reverse_sequence(b: _Builder) -> None:
    """Each batch entry's first sequence_lens[b] steps reversed, the rest kept: a GatherElements
    along the time axis with index (t < n ? n - 1 - t : t)."""
    x, lens = b.node.input[0], b.node.input[1]
    shape = b.shape(x)
    if len(shape) < 2:
        raise b.fail(f"the input must have rank 2 or more, not {len(shape)}")
    batch, time = int(b.attr("batch_axis", 1)), int(b.attr("time_axis", 0))
    if sorted((batch, time)) != [0, 1]:
        raise b.fail(f"batch_axis {batch} and time_axis {time} must be 0 and 1, one each")
    B, T = shape[batch], shape[time]
    if b.shape(lens) != (B,):
        raise b.fail(f"sequence_lens must have shape [{B}], not {list(b.shape(lens))}")
    n = lens if b.elem(lens) == onnx.TensorProto.INT64 else b.op("Cast", [lens], to=onnx.TensorProto.INT64)
    # n along the batch axis, t along the time axis, both of x's rank
    n = b.op("Reshape", [n, b.ints(*[B if a == batch else 1 for a in range(len(shape))])])
    t = _along(b, T, time, len(shape))
    rev = b.op("Sub", [b.op("Sub", [n, b.constant(np.int64(1), np.int64)]), t])
    idx = b.op("Where", [b.op("Less", [t, n]), rev, t])
    idx = b.op("Expand", [idx, b.ints(*shape)])
    b.op("GatherElements", [x, idx], b.node.output[0], axis=time)


def _compress(b: _Builder) -> None:
    """Compress by a constant condition: a Gather of the positions where it is true (along
    `axis`, or of the flattened input without one). Its output shape is then known; tf2onnx
    writes TensorFlow's SYMMETRIC MirrorPad as a reflect Pad followed by such Compresses, with a
    mask the shapes alone decide. A condition shorter than the axis drops the rest, as the spec
    and onnxruntime do; a longer one is an error. A condition computed from data keeps the
    output's shape unknown until run time, and is refused as data-dependent."""
    from .errors import DynamicShapeError

    if len(b.node.input) != 2 or not all(b.node.input):
        raise b.fail("takes 2 inputs: input, condition")
    x, cond_name = b.node.input
    cond = b.const(cond_name)
    if cond is None:
        raise DynamicShapeError(f"{b.path}: Compress {b.label!r}: its condition is computed at run time, so its output's "
                                "shape depends on tensor values (data-dependent shapes are not supported: dlcc compiles "
                                "static shapes; --fallback onnxruntime runs such nodes there)", tensor=b.node.output[0])
    cond = np.asarray(cond)
    if cond.ndim != 1:
        raise b.fail(f"the condition must be 1-D, not of shape {list(cond.shape)}")
    shape = b.shape(x)
    axis = b.attrs.get("axis")
    if axis is None:
        x = b.op("Reshape", [x, b.ints(-1)])
        length, axis = int(np.prod(shape, dtype=np.int64)), 0
    else:
        axis = _axis(b, int(axis), len(shape))
        length = shape[axis]
    if cond.size > length:
        raise b.fail(f"the condition has {cond.size} values, more than the {length} along the axis it selects from")
    keep = np.flatnonzero(cond.astype(bool)).astype(np.int64)
    if not keep.size:
        raise b.unsupported("a Compress that keeps nothing (a zero-size output)")
    b.op("Gather", [x, b.constant(keep, np.int64)], b.node.output[0], axis=axis)


#: The largest matrix whose determinant is written out by cofactors (Det).
DET_MAX = 4


def _det(b: _Builder) -> None:
    """The determinant of each [n, n] matrix in the last two axes, for n up to DET_MAX, written
    out by cofactor expansion along the first row, each minor once (they are shared: a 4 x 4
    needs six 2 x 2 minors of its last two rows). onnxruntime factors the matrix (LU with
    partial pivoting); the two agree to float32 rounding on matrices that are not near-singular.
    torch.det and torch.linalg.det export to it (geometry, normalizing flows)."""
    x = b.node.input[0]
    shape = b.shape(x)
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise b.fail(f"the input must be square matrices [..., n, n], not {list(shape)}")
    if b.elem(x) != _F:
        raise b.unsupported("Det of other than float32 matrices")
    n = shape[-1]
    if not 1 <= n <= DET_MAX:
        raise b.unsupported(f"Det of {n} x {n} matrices (dlcc writes out up to {DET_MAX} x {DET_MAX})")
    flat = b.op("Reshape", [x, b.ints(*shape[:-2], n * n)])
    elem = [[b.op("Gather", [flat, b.constant(np.int64(i * n + j), np.int64)], axis=-1) for j in range(n)]
            for i in range(n)]
    minors: dict[tuple, str] = {}

    def det(row: int, cols: tuple[int, ...]) -> str:
        """The determinant of rows row.. and columns `cols`."""
        if len(cols) == 1:
            return elem[row][cols[0]]
        if (row, cols) not in minors:
            acc = None
            for k, c in enumerate(cols):
                term = b.op("Mul", [elem[row][c], det(row + 1, cols[:k] + cols[k + 1:])])
                acc = term if acc is None else b.op("Sub" if k % 2 else "Add", [acc, term])
            minors[(row, cols)] = acc
        return minors[(row, cols)]

    b.op("Identity", [det(0, tuple(range(n)))], b.node.output[0])


def _einsum(b: _Builder) -> None:
    from .einsum import lower_einsum

    lower_einsum(b)


def _grid_sample(b: _Builder) -> None:
    from .grid_sample import lower_grid_sample

    lower_grid_sample(b)


def _affine_grid(b: _Builder) -> None:
    from .grid_sample import lower_affine_grid

    lower_affine_grid(b)


def _deform_conv(b: _Builder) -> None:
    from .deform_conv import lower_deform_conv

    lower_deform_conv(b)


REWRITES = {
    "OneHot": _one_hot, "Hardmax": _hardmax, "LpNormalization": _lp_normalization, "LpPool": _lp_pool,
    "GlobalLpPool": _global_lp_pool, "EyeLike": _eye_like, "ReverseSequence": _reverse_sequence, "Einsum": _einsum, "GridSample": _grid_sample, "AffineGrid": _affine_grid,
    "DeformConv": _deform_conv, "Compress": _compress, "Det": _det,
}

def listed() -> list[tuple[str, str]]:
    """(op, the opsets onnx has versions of it from) for `dlcc list ops`."""
    from onnx import defs

    since: dict[str, set[int]] = {}
    for sc in defs.get_all_schemas_with_history():
        if sc.domain == "" and sc.name in REWRITES:
            since.setdefault(sc.name, set()).add(sc.since_version)
    return [(op, ", ".join(map(str, sorted(since.get(op, ()))))) for op in sorted(REWRITES)]
