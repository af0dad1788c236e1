"""ONNX Einsum (opset 12) written as standard ops at import: Transpose, Reshape, MatMul, Mul,
ReduceSum and Gather, which dlcc already lowers, checks and stitches.

Why at import and not a kernel of its own: an einsum is a layout change around a product, and
the product is best done by dlcc's tiled GEMM (MatMul), which a generic einsum kernel would not
match. The rewrite runs once every shape is static (composite.py), so each Transpose, Reshape and
the choice between MatMul and Mul can be fixed here; the ones that would change nothing are left
out.

The semantics are numpy.einsum's, which onnxruntime's CPU kernel follows: an explicit output
(`->`) or an implicit one (each letter used once, in ASCII order, after the ellipsis dims); `...`
for the broadcast batch dims, right-aligned where operands give it different numbers of dims;
size-1 dims broadcast, letters' as well as the ellipsis'; a letter repeated in one operand reads
its diagonal. Operands are contracted pairwise, left to right.
"""
from __future__ import annotations

import string
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto as TP

_FLOATS = (TP.FLOAT, TP.FLOAT16, TP.BFLOAT16)  # (onnx's Einsum does not list bfloat16; it would work here)
_INTS = (TP.INT32, TP.INT64)  # dlcc's MatMul is float only: ints are multiplied and summed (Mul + ReduceSum)
_ELLIPSIS = "..."


@dataclass
class _T:
    """A tensor made on the way: its name, the label of each dim (a letter, or `...k` for the k-th
    ellipsis dim counted from the left of the widest ellipsis), and its static dims."""
    name: str
    labels: list[str]
    dims: list[int]


def lower_einsum(b) -> None:
    """Write the Einsum node `b.node` as standard ops whose last one produces its output."""
    eq = _equation(b)
    inputs = list(b.node.input)
    if not inputs or not all(inputs):
        raise b.fail("takes 1 or more inputs, none of them omitted")
    elem = _elem(b, inputs)
    lhs, arrow, rhs = eq.partition("->")
    if "->" in rhs:
        raise b.fail(f"equation {eq!r} must have at most one '->', after the operands")
    terms = [_term(b, t, f"operand {k}", eq) for k, t in enumerate(lhs.split(","))]
    if len(terms) != len(inputs):
        raise b.fail(f"equation {eq!r} names {len(terms)} operand(s) but the node has {len(inputs)} input(s)")
    shapes = [b.shape(x) for x in inputs]
    ops, width = _label(b, terms, shapes, eq)
    sizes = _sizes(b, ops, eq)
    out = _output(b, rhs if arrow else None, terms, width, eq)

    out_dims = [sizes[lab] for lab in out]
    _check_inferred(b, out_dims, eq)
    if 0 in sizes.values():  # an empty output, or a sum over nothing: zeros either way
        _zeros(b, out_dims, elem)
        return
    ops = [_squeeze_broadcast(b, op, sizes) for op in ops]
    ops = [_diagonal(b, op) for op in ops]
    for k, op in enumerate(ops):  # letters only this operand has, which the output drops, are summed first
        elsewhere = set(out).union(*(o.labels for j, o in enumerate(ops) if j != k))
        ops[k] = _sum_out(b, op, [lab for lab in op.labels if lab not in elsewhere])
    acc = ops[0]
    for k in range(1, len(ops)):
        later = set(out).union(*(o.labels for o in ops[k + 1:]))
        acc = _contract(b, acc, ops[k], later, out if k == len(ops) - 1 else None, elem in _INTS)
    if sorted(acc.labels) != sorted(out):  # every label is summed or kept by now: a dlcc bug otherwise
        raise b.fail(f"internal: the product has labels {acc.labels}, the output {out}")
    acc = _transpose(b, acc, out)
    b.op("Identity", [acc.name], b.node.output[0])


# -- parsing --------------------------------------------------------------------------------------
def _equation(b) -> str:
    """The equation attribute as text, its spaces taken out (onnx allows them anywhere)."""
    eq = b.attrs.get("equation")
    if eq is None:
        raise b.fail("attribute 'equation' is required")
    if isinstance(eq, bytes):
        try:
            eq = eq.decode("ascii")
        except UnicodeDecodeError:
            raise b.fail(f"equation {eq[:100]!r} must be ASCII text") from None
    if not isinstance(eq, str):
        raise b.fail(f"attribute 'equation' must be a string, not {eq!r}"[:300])
    return "".join(eq.split())


def _elem(b, inputs: list[str]) -> int:
    """The inputs' one element type: a float (MatMul) or int32/int64 (Mul + ReduceSum)."""
    elems = {e for e in (b.elem(x) for x in inputs) if e}
    if len(elems) > 1:
        names = ", ".join(sorted(onnx.TensorProto.DataType.Name(e).lower() for e in elems))
        raise b.fail(f"the inputs must have one element type, not {names}")
    elem = elems.pop() if elems else TP.FLOAT
    if elem not in _FLOATS + _INTS:
        raise b.unsupported(f"Einsum on {onnx.TensorProto.DataType.Name(elem).lower()} "
                            "(float32, float16, bfloat16, int32 and int64 are)")
    return elem


def _term(b, term: str, what: str, eq: str) -> list[str]:
    """One operand's (or the output's) subscripts: letters, and `...` at most once."""
    if term.count(_ELLIPSIS) > 1:
        raise b.fail(f"{what} of equation {eq!r} has more than one ellipsis ('...')")
    head, dots, tail = term.partition(_ELLIPSIS)
    bad = sorted({c for c in head + tail if c not in string.ascii_letters})
    if bad:
        raise b.fail(f"{what} of equation {eq!r} holds {''.join(bad)!r}: subscripts are the letters a-z and A-Z "
                     "and one '...'")
    return list(head) + ([_ELLIPSIS] if dots else []) + list(tail)


def _label(b, terms: list[list[str]], shapes: list[tuple[int, ...]], eq: str) -> tuple[list[_T], int]:
    """Each input as a _T whose ellipsis stands for its own dims (right-aligned, numpy's rule),
    and the widest ellipsis' number of dims."""
    widths = []
    for k, (term, shape) in enumerate(zip(terms, shapes)):
        letters = len(term) - term.count(_ELLIPSIS)
        if (len(shape) != letters) if _ELLIPSIS not in term else (len(shape) < letters):
            raise b.fail(f"operand {k} of equation {eq!r} has {letters} subscript(s)"
                         f"{' and an ellipsis' if _ELLIPSIS in term else ''} but input {k} has rank {len(shape)} "
                         f"(shape {list(shape)})")
        widths.append(len(shape) - letters)
    width = max(widths, default=0)
    ops = []
    for k, (term, shape, w) in enumerate(zip(terms, shapes, widths)):
        labels = []
        for lab in term:
            labels += [f"...{width - w + j}" for j in range(w)] if lab == _ELLIPSIS else [lab]
        ops.append(_T(b.node.input[k], labels, list(shape)))
    return ops, width


def _sizes(b, ops: list[_T], eq: str) -> dict[str, int]:
    """Each label's size: equal wherever it is used, except that a size of 1 broadcasts (between
    operands; a diagonal's two dims must match)."""
    sizes: dict[str, int] = {}
    for k, op in enumerate(ops):
        own: dict[str, int] = {}
        for lab, d in zip(op.labels, op.dims):
            if own.setdefault(lab, d) != d:
                raise b.fail(f"letter {lab!r} repeats in operand {k} of equation {eq!r} over dims of sizes "
                             f"{own[lab]} and {d}: a diagonal needs them equal")
            cur = sizes.setdefault(lab, d)
            if cur != d and 1 not in (cur, d):
                what = f"ellipsis dim {lab[3:]}" if lab.startswith(_ELLIPSIS) else f"letter {lab!r}"
                raise b.fail(f"{what} of equation {eq!r} has sizes {cur} and {d} (in operand {k}), which do not "
                             "broadcast")
            sizes[lab] = d if cur == 1 else cur
    return sizes


def _check_inferred(b, out_dims: list[int], eq: str) -> None:
    """Refuse where the output's shape differs from the one onnx's shape inference gave it, on
    which the rest of the import already relies. That happens where a size-1 dim of the first
    operand that has the label broadcasts against a longer one and the output keeps it: onnx
    takes the first size it meets, numpy and onnxruntime the broadcast one."""
    known = b.info.get(b.node.output[0], (None, None))[0]
    if known is None or len(known) != len(out_dims):
        return
    if any(k is not None and int(k) != d for k, d in zip(known, out_dims)):
        got = [k if k is not None else "?" for k in known]
        raise b.unsupported(f"equation {eq!r} broadcasting a size-1 dim into the output: onnx's shape inference "
                            f"gives the output shape {got}, numpy and onnxruntime {out_dims} (Expand the operand "
                            "to the full size first)")


def _output(b, rhs: str | None, terms: list[list[str]], width: int, eq: str) -> list[str]:
    """The output's labels: the explicit ones, or (implicit) the ellipsis dims and then each
    letter used exactly once, in ASCII order (numpy's and onnx's shape inference's order)."""
    dots = [f"...{j}" for j in range(width)]
    letters = [lab for term in terms for lab in term if lab != _ELLIPSIS]
    if rhs is None:
        return dots + sorted(lab for lab in set(letters) if letters.count(lab) == 1)
    term = _term(b, rhs, "the output", eq)
    if width and _ELLIPSIS not in term:
        raise b.fail(f"the operands of equation {eq!r} have an ellipsis standing for {width} dim(s) but the output "
                     "has none")
    for lab in term:
        if lab != _ELLIPSIS and lab not in letters:
            raise b.fail(f"output letter {lab!r} of equation {eq!r} is in no operand")
        if lab != _ELLIPSIS and term.count(lab) > 1:
            raise b.fail(f"output letter {lab!r} of equation {eq!r} repeats")
    out = []
    for lab in term:
        out += dots if lab == _ELLIPSIS else [lab]
    return out


# -- building blocks ------------------------------------------------------------------------------
def _reshape(b, t: _T, dims: list[int]) -> str:
    """t's data with dims `dims` (no node where they are t's already)."""
    return t.name if list(dims) == list(t.dims) else b.op("Reshape", [t.name, b.ints(*dims)])


def _transpose(b, t: _T, order: list[str]) -> _T:
    """t with its dims in the order of the labels `order` (no node where it is t's already)."""
    perm = [t.labels.index(lab) for lab in order]
    if perm == list(range(len(perm))):
        return t
    return _T(b.op("Transpose", [t.name], perm=perm), list(order), [t.dims[p] for p in perm])


def _reduce_sum(b, x: str, axes: list[int]) -> str:
    """ReduceSum over `axes`, which it drops, in the model's opset's form (axes an input from 13)."""
    if b.opset >= 13:
        return b.op("ReduceSum", [x, b.ints(*axes)], keepdims=0)
    return b.op("ReduceSum", [x], axes=axes, keepdims=0)


def _sum_out(b, t: _T, labels: list[str]) -> _T:
    """t summed over the dims of `labels`."""
    if not labels:
        return t
    axes = [i for i, lab in enumerate(t.labels) if lab in labels]
    keep = [i for i in range(len(t.labels)) if i not in axes]
    return _T(_reduce_sum(b, t.name, axes), [t.labels[i] for i in keep], [t.dims[i] for i in keep])


def _zeros(b, dims: list[int], elem: int) -> None:
    """The output where a label has size 0: empty, or a sum over nothing, hence all zeros."""
    dt = onnx.helper.tensor_dtype_to_np_dtype(elem)
    zero = b.constant(np.zeros((), dt), dt)
    b.op("Expand", [zero, b.ints(*dims)], b.node.output[0])


def _squeeze_broadcast(b, t: _T, sizes: dict[str, int]) -> _T:
    """t without its size-1 dims that broadcast against a longer one elsewhere: an operand that
    does not vary along a label is the same product with the label left out of it, and
    nothing downstream then has to broadcast."""
    keep = [i for i, (lab, d) in enumerate(zip(t.labels, t.dims)) if not (d == 1 and sizes[lab] != 1)]
    if len(keep) == len(t.dims):
        return t
    dims = [t.dims[i] for i in keep]
    return _T(_reshape(b, t, dims), [t.labels[i] for i in keep], dims)


def _diagonal(b, t: _T) -> _T:
    """t with each repeated label read along its diagonal, once: the repeated dims are moved to
    the front and flattened, and a Gather picks the flat offsets of the diagonal (no multiply
    by an eye mask, which would turn an inf off the diagonal into a NaN)."""
    while True:
        lab = next((lab for lab in t.labels if t.labels.count(lab) > 1), None)
        if lab is None:
            return t
        at = [i for i, x in enumerate(t.labels) if x == lab]
        rest = [i for i in range(len(t.labels)) if i not in at]
        n, k = t.dims[at[0]], len(at)
        perm = at + rest
        moved = _T(t.name if perm == list(range(len(perm))) else b.op("Transpose", [t.name], perm=perm),
                   [t.labels[i] for i in perm], [t.dims[i] for i in perm])
        flat = [n ** k] + [t.dims[i] for i in rest]
        step = sum(n ** j for j in range(k))  # from (i, i, ..., i) to (i+1, i+1, ..., i+1), flattened
        idx = b.constant(np.arange(n, dtype=np.int64) * step, np.int64)
        t = _T(b.op("Gather", [_reshape(b, moved, flat), idx], axis=0), [lab] + [t.labels[i] for i in rest],
               [n] + [t.dims[i] for i in rest])


def _prod(dims: list[int]) -> int:
    return int(np.prod(dims, dtype=np.int64))


# -- one pairwise contraction ---------------------------------------------------------------------
def _contract(b, x: _T, y: _T, later: set[str], out: list[str] | None, ints: bool) -> _T:
    """x times y, summed over the labels both have and nothing later needs (`later`: the labels
    of the operands still to come and of the output). `out`, on the last contraction, is the
    output's order, which the layout chosen here tries to leave in place.

    The labels sort into batch (both, kept), left (x only), right (y only) and contracted (both,
    summed). Floats with something to contract go to MatMul as [batch, L, K] @ [batch, K, R];
    with nothing to contract (outer and elementwise products), or a product of one row by one
    column, a broadcasting Mul (and a ReduceSum) does it, as it does for ints, which dlcc's
    MatMul does not take."""
    x = _sum_out(b, x, [lab for lab in x.labels if lab not in y.labels and lab not in later])
    y = _sum_out(b, y, [lab for lab in y.labels if lab not in x.labels and lab not in later])
    best = None
    for a, c in ((x, y), (y, x)):  # which one is the left operand
        both = [lab for lab in a.labels if lab in c.labels]
        batch = [lab for lab in both if lab in later]
        summed = [lab for lab in both if lab not in later]
        left = [lab for lab in a.labels if lab not in c.labels]
        right = [lab for lab in c.labels if lab not in a.labels]
        dims = dict(zip(a.labels + c.labels, a.dims + c.dims))
        mul = ints or not summed or (_prod([dims[v] for v in left]) == 1 and _prod([dims[v] for v in right]) == 1)
        for bo in _orders(batch, a.labels, c.labels, out):
            for so in _orders(summed, a.labels, c.labels, None):
                a_order = bo + left + (so if summed else [])
                c_order = bo + (right + so if mul else so + right)
                cost = (a_order != a.labels) + (c_order != c.labels) + (out is not None and bo + left + right != out)
                if best is None or cost < best[0]:
                    best = (cost, a, c, bo, so, left, right, dims, mul)
    _, a, c, batch, summed, left, right, dims, mul = best
    bd, ld, sd, rd = ([dims[v] for v in g] for g in (batch, left, summed, right))
    labels = batch + left + right
    if mul:
        a = _transpose(b, a, batch + left + summed)
        c = _transpose(b, c, batch + right + summed)
        # (leading 1s are left out: Mul broadcasts from the right)
        av = _reshape(b, a, (bd + ld + [1] * len(rd) if bd or ld else []) + sd)
        cv = _reshape(b, c, (bd + [1] * len(ld) if bd else []) + rd + sd)
        p = b.op("Mul", [av, cv])
        if summed:
            n = len(bd) + len(ld) + len(rd)
            p = _reduce_sum(b, p, list(range(n, n + len(sd))))
        return _T(p, labels, bd + ld + rd)
    a = _transpose(b, a, batch + left + summed)
    c = _transpose(b, c, batch + summed + right)
    if batch or not left:  # [batch, L, K] @ [batch, K, R]
        a_dims = bd + [_prod(ld), _prod(sd)]
        m_dims = bd + [_prod(ld), _prod(rd)]
    else:  # no batch: x's left dims stay, as a MatMul with a 2-D B folds them into its rows
        a_dims = ld + [_prod(sd)]
        m_dims = ld + [_prod(rd)]
    m = _T(b.op("MatMul", [_reshape(b, a, a_dims), _reshape(b, c, bd + [_prod(sd), _prod(rd)])]), [], m_dims)
    return _T(_reshape(b, m, bd + ld + rd), labels, bd + ld + rd)


def _orders(group: list[str], a: list[str], c: list[str], out: list[str] | None) -> list[list[str]]:
    """The orders worth trying for a group of labels that both operands share: as the left one
    has them, as the right one has, and (on the last contraction) as the output has."""
    found = []
    for src in (a, c) + ((out,) if out is not None else ()):
        o = [lab for lab in src if lab in group]
        if o not in found:
            found.append(o)
    return found
