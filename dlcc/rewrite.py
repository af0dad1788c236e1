"""Rewriting a model's nodes into standard ONNX ops at import, in rounds: the machinery that the
quantized ops (quantized.py) and onnxruntime's fused transformer ops (fused_ops.py) share.

Why rounds: a rewrite often needs an input's rank (where a per-channel scale broadcasts, whether a
mask is 1-D or 2-D). Where that input is the output of another op onnx cannot infer (a
com.microsoft op not rewritten yet), the node waits (`Later`) and the next round, after shape
inference sees the ops rewritten so far, tries again.

A `Builder` emits the nodes for one rewritten node, under names that cannot collide with the
model's (expand._prefix), and keeps large constants as weights the way split_weights leaves the
model's own.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .errors import DlccError, DynamicShapeError, ModelError, ShapeError, first_line
from .expand import _all_names, _prefix
from .spectral import _constants, _shapes_and_types

_F = onnx.TensorProto.FLOAT


class Later(Exception):
    """An input's rank (or shape) is not known in this round; the argument, if any, is the error
    to raise if no later round makes it known."""


class Builder:
    """Emits the nodes that replace one node, under names that start with its prefix."""

    def __init__(self, node, prefix, info, consts, weights, graph, path, cache, opset):
        self.node, self.prefix, self.info, self.consts = node, prefix, info, consts
        self.weights, self.graph, self.path, self.cache = weights, graph, path, cache
        self.opset = opset  # the ops written here take their opset-13 forms from 13 on (Split, Unsqueeze, ReduceSum)
        self.label = node.name or node.output[0]
        self.nodes: list[onnx.NodeProto] = []
        self.pending: list[tuple[str, np.ndarray]] = []  # weights, kept once the node is done
        try:
            self.attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        except Exception as e:  # a reference attribute outside a function, or an unknown type
            raise ModelError(f"{path}: {node.op_type} {self.label!r}: an attribute cannot be read: {first_line(e)}") from None
        self._n = 0
        self.track = True  # whether rewrite_rounds returns the nodes made among its `made` (a rewrite may opt out)

    # -- inputs ---------------------------------------------------------------------------
    def input(self, i: int) -> str:
        return self.node.input[i] if i < len(self.node.input) else ""

    def const(self, name: str) -> np.ndarray | None:
        return self.consts.get(name) if name else None

    def elem(self, name: str) -> int | None:
        c = self.const(name)
        if c is not None:
            return helper.np_dtype_to_tensor_dtype(c.dtype)
        return self.info.get(name, (None, None))[1] or None

    def note(self, name: str, shape, elem: int | None) -> str:
        """Record the shape (None: unknown; only its rank is read) and type of a tensor made here."""
        self.info[name] = (shape, elem)
        return name

    def rank(self, name: str) -> int:
        c = self.const(name)
        if c is not None:
            return c.ndim
        shape = self.info.get(name, (None, None))[0]
        if shape is None:
            raise Later()
        return len(shape)

    def shape(self, name: str) -> tuple[int, ...]:
        """The static shape of `name` (a constant's, or what inference found); waits for the next
        round (Later) while any dim is unknown."""
        c = self.const(name)
        if c is not None:
            return tuple(c.shape)
        shape = self.info.get(name, (None, None))[0]
        if shape is None or any(d is None for d in shape):
            raise Later(self._not_static(name))
        return tuple(int(d) for d in shape)

    def _not_static(self, name: str) -> Exception:
        """The error for an input whose shape stays unknown: with every graph input's shape bound,
        it depends on values computed at run time (a NonZero upstream; `--fallback onnxruntime`
        runs those nodes there); otherwise binding the dynamic dims may make it known."""
        inits = {t.name for t in self.graph.initializer}
        bound = all(vi.type.tensor_type.HasField("shape")
                    and all(d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim)
                    for vi in self.graph.input if vi.name not in inits)
        if bound:
            return DynamicShapeError(f"{self.path}: {self.node.op_type} {self.label!r}: the shape of input {name!r} "
                                     "depends on tensor values computed at run time (data-dependent shapes are not "
                                     "supported: dlcc compiles static shapes)", tensor=name)
        return self.fail(f"the shape of input {name!r} is not static here; bind the model's dynamic dims with --shape",
                         ShapeError)

    def fail(self, why: str, kind=ModelError) -> Exception:
        return kind(f"{self.path}: {self.node.op_type} {self.label!r}: {why}")

    # -- outputs --------------------------------------------------------------------------
    def fresh(self, hint: str) -> str:
        self._n += 1
        return f"{self.prefix}{hint}{self._n}"

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        out = out or self.fresh(op_type.lower())
        short = out[len(self.prefix):] if out.startswith(self.prefix) else out
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=f"{self.label}/{short}", **attrs))
        return out

    def constant(self, value, dtype=np.float32) -> str:
        """A constant: small ones as Constant nodes, large ones (a dequantized weight) as weights,
        which is how split_weights leaves the model's own."""
        arr = np.array(value, dtype)  # (a copy, C-ordered; np.ascontiguousarray would make a scalar 1-D)
        name = self.fresh("c")
        if arr.size > 64:
            self.pending.append((name, arr))
        else:
            self.nodes.append(helper.make_node("Constant", [], [name], name=f"{self.label}/{name[len(self.prefix):]}",
                                               value=numpy_helper.from_array(arr, name)))
        self.consts[name] = arr
        return name

    def commit(self, name: str, arr: np.ndarray) -> None:
        """Put a large constant in the model: a weight (as split_weights leaves the model's own),
        or an initializer where there are no split weights (exact_products)."""
        if self.weights is None:
            self.graph.initializer.append(numpy_helper.from_array(arr, name))
            return
        self.weights[name] = arr
        self.graph.input.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(arr.dtype), list(arr.shape)))

    def shared(self, key: tuple, make) -> str:
        """A large float32 constant derived from the model's constants (`make()`), made once per
        import and read by every node that derives the same one: an unrolled LSTM's R,
        centred, serves all its steps, instead of a copy per step."""
        if key not in self.cache:
            arr = np.array(make(), np.float32)
            if arr.size <= 64:
                return self.constant(arr)
            name = f"{self.prefix}shared{len(self.cache)}"
            self.commit(name, arr)
            self.cache[key] = (name, arr)
        name, arr = self.cache[key]
        self.consts[name] = arr
        return name


    def as_float(self, name: str) -> str:
        """`name` as a float32 tensor (a constant is converted here)."""
        c = self.const(name)
        if c is not None and c.size > 64:
            return self.shared(("float", name), lambda: c.astype(np.float32))
        if c is not None:
            return self.constant(c.astype(np.float32))
        return name if self.elem(name) == _F else self.op("Cast", [name], to=_F)



def rewrite_rounds(model: onnx.ModelProto, infer, weights: dict[str, np.ndarray] | None, path,
                   chosen: Callable[[onnx.NodeProto], bool], lower: Callable[["Builder"], None],
                   builder=None, known: dict[str, tuple] | None = None,
                   partial: bool = False) -> tuple[set[str], dict[str, int]]:
    """Rewrite, in place and in rounds, every node of `model`'s main graph that `chosen` picks:
    `lower(b)` fills Builder `b` (of class `builder`) with the nodes that replace it, or raises
    Later to wait for the next round. `infer` is a lenient shape inference; `weights` holds the
    values split_weights took out (None: large constants become initializers); `known` gives
    shapes and element types inference may not find ({name: (shape, elem)}). Returns the names
    of the nodes made (by builders that keep `track`) and how many nodes of each op type were
    rewritten. `partial`: where no node can be rewritten yet, return what was done instead of
    raising (another rewrite may make the ranks known: frontend._lower_late)."""
    from .frontend import opset_of

    builder = builder or Builder
    made: set[str] = set()
    counts: dict[str, int] = {}
    cache: dict[tuple, tuple] = {}  # derived constants shared between nodes (Builder.shared)
    while any(chosen(n) for n in model.graph.node):
        g = model.graph
        try:
            info = _shapes_and_types(infer(model).graph)
        except Exception as e:  # a malformed node elsewhere (the checker has not run yet for fused ops)
            raise ModelError(f"{path}: ONNX shape inference failed: {first_line(e, 300)}") from None
        info.update({k: (tuple(shape), elem) for k, (shape, elem) in (known or {}).items()})
        consts = _constants(g, weights or {}, path)
        taken = _all_names(g)
        out: list[onnx.NodeProto] = []
        progress = False
        waiting = None  # the first error a node that waits would raise, were this the last round
        for k, node in enumerate(g.node):
            if not chosen(node):
                out.append(node)
                continue
            b = builder(node, _prefix(node, k, taken), info, consts, weights, g, path, cache, opset_of(model))
            taken.add(b.prefix)
            try:
                lower(b)
            except Later as e:
                out.append(node)
                waiting = waiting or (e.args[0] if e.args else None)
                continue
            except DlccError:
                raise
            except Exception as e:  # a malformed node the checks did not foresee
                raise b.fail(f"cannot be computed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}") from None
            out += b.nodes
            for name, arr in b.pending:
                b.commit(name, arr)
            if b.track:
                made.update(n.name for n in b.nodes)
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
            progress = True
        del g.node[:]
        g.node.extend(out)
        del g.value_info[:]
        if not progress:
            if partial:
                break
            if waiting is not None:
                raise waiting
            left = sorted({n.op_type for n in g.node if chosen(n)})
            unknown = sorted({f"{n.domain}.{n.op_type}" for n in g.node if n.domain not in ("", "ai.onnx")
                              and not chosen(n)})
            raise ModelError(f"{path}: the input ranks of {', '.join(left)} could not be inferred"
                             + (f": they follow {', '.join(unknown)}, which dlcc does not support and "
                                "onnx cannot infer" if unknown else "; bind the model's dynamic dims with --shape"))
    return made, counts


def raise_opset(model: onnx.ModelProto, to: int, path, why: str) -> tuple[onnx.ModelProto, str]:
    """`model` converted to opset `to` by onnx's version converter (which rewrites what changed
    on the way: Clip, Resize, ...), and a note for the pass log; `why` says what needs `to`."""
    from onnx import version_converter

    from .frontend import opset_of

    before = opset_of(model)
    try:
        model = version_converter.convert_version(model, to)
    except Exception as e:
        raise ModelError(f"{path}: {why}, and onnx's version converter cannot convert this model from opset {before} "
                         f"to {to}: {str(e).splitlines()[0][:300] if str(e) else type(e).__name__}") from None
    return model, f"import: converted from opset {before} to {to}: {why} (onnx.version_converter)"
