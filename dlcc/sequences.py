"""Tensor sequences resolved at import: where every sequence op's positions are known at compile
time, a sequence is a list of tensor names, and its ops become plain nodes (or nothing).

Why: torch's TorchScript exporter writes a scripted `outs.append(h)` loop as a Loop that carries
a sequence (SequenceEmpty before it, SequenceInsert in its body, ConcatFromSequence after it).
Once loops.py has unrolled the Loop, the sequence is a straight chain of inserts whose length is
known, so `torch.stack(outs)` is one Concat of the appended tensors: no sequence ever reaches a
kernel.

- SequenceEmpty, SequenceConstruct: a new list (SequenceConstruct's inputs in order);
- SequenceInsert, SequenceErase: the list with one tensor inserted or removed (at the end, or at
  a constant position, negative ones counting from the end);
- SequenceAt: an Identity of the tensor at a constant position;
- SequenceLength: a constant;
- ConcatFromSequence: a Concat of the tensors (with `new_axis`, each Unsqueezed first);
- SplitToSequence with constant split sizes (or none: pieces of one along the axis): a Split
  (with `keepdims=0` and no sizes, each piece Squeezed);
- Identity of a sequence: the same list.

A sequence op whose position is computed at run time, or a sequence that leaves the graph (a
graph output) or enters an op that is not one of these, stays, and the import reports the op as
unsupported, naming it.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .control_flow import _constant_values, _static_shapes
from .expand import _all_names, _prefix
from .frontend import opset_of

SEQUENCE_OPS = ("SequenceEmpty", "SequenceConstruct", "SequenceInsert", "SequenceErase", "SequenceAt",
                "SequenceLength", "ConcatFromSequence", "SplitToSequence")


def has_sequences(model: onnx.ModelProto) -> bool:
    return any(n.op_type in SEQUENCE_OPS and n.domain in ("", "ai.onnx") for n in model.graph.node)


def resolve_sequences(model: onnx.ModelProto, infer) -> tuple[onnx.ModelProto, list[str]]:
    """Rewrite the main graph's sequence ops (module docstring), in place, where they can be.
    `infer` (lenient shape inference) gives SplitToSequence its input's shape. Returns (the
    model, notes for the pass log)."""
    if not has_sequences(model):
        return model, []
    g = model.graph
    consts = _constant_values(g)
    shapes = _static_shapes(infer(model).graph) if any(n.op_type == "SplitToSequence" for n in g.node) else {}
    opset = opset_of(model)
    taken = _all_names(g)
    seqs: dict[str, list[str]] = {}
    out: list[onnx.NodeProto] = []
    resolved = 0
    for k, node in enumerate(g.node):
        rewrite = None
        if node.domain in ("", "ai.onnx") and (node.op_type in SEQUENCE_OPS or
                                                (node.op_type == "Identity" and node.input[0] in seqs)):
            prefix = _prefix(node, k, taken)
            taken.add(prefix)
            rewrite = _rewrite(node, seqs, consts, shapes, opset, prefix)
        if rewrite is None:
            out.append(node)
        else:
            out += rewrite
            resolved += 1
    if not resolved:
        return model, []
    # A sequence still read by a node that was not rewritten (or returned by the graph) keeps its
    # producers: the import then reports them as unsupported, naming them.
    needed = {i for n in out if n.op_type not in SEQUENCE_OPS for i in n.input if i in seqs}
    needed |= {o.name for o in g.output if o.name in seqs}
    if needed:
        return model, []
    del g.node[:]
    g.node.extend(out)
    del g.value_info[:]
    return model, [f"import: {resolved} sequence op(s) resolved at compile time (a sequence is a list of tensors)"]


def _rewrite(node, seqs, consts, shapes, opset, prefix) -> list[onnx.NodeProto] | None:
    """The nodes replacing `node`, recording the lists it makes in `seqs`; None to keep it."""
    op, ins = node.op_type, list(node.input)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}

    def position(i: int, length: int, insert: bool) -> int | None:
        if len(ins) <= i or not ins[i]:
            return length if insert else length - 1
        v = consts.get(ins[i])
        if v is None:
            return None
        p = int(np.asarray(v).reshape(()))
        p = p + length if p < 0 else p
        return p if 0 <= p <= length - (0 if insert else 1) else None

    if op == "SequenceEmpty":
        seqs[node.output[0]] = []
        return []
    if op == "SequenceConstruct":
        seqs[node.output[0]] = list(ins)
        return []
    if op == "Identity":
        seqs[node.output[0]] = list(seqs[ins[0]])
        return []
    if op == "SplitToSequence":
        return _split(node, ins, attrs, seqs, consts, shapes, opset, prefix)
    if not ins or ins[0] not in seqs:
        return None
    items = seqs[ins[0]]
    if op == "SequenceInsert":
        p = position(2, len(items), insert=True)
        if p is None:
            return None
        seqs[node.output[0]] = items[:p] + [ins[1]] + items[p:]
        return []
    if op == "SequenceErase":
        p = position(1, len(items), insert=False)
        if p is None:
            return None
        seqs[node.output[0]] = items[:p] + items[p + 1:]
        return []
    if op == "SequenceAt":
        p = position(1, len(items), insert=False)
        if p is None or len(ins) < 2:
            return None
        return [helper.make_node("Identity", [items[p]], [node.output[0]], name=f"{prefix}at")]
    if op == "SequenceLength":
        return [helper.make_node("Constant", [], [node.output[0]], name=f"{prefix}length",
                                 value=numpy_helper.from_array(np.array(len(items), np.int64)))]
    if op == "ConcatFromSequence":
        if not items:
            return None
        axis = int(attrs.get("axis", 0))
        nodes, parts = [], list(items)
        if attrs.get("new_axis", 0):
            if opset >= 13:
                nodes.append(helper.make_node("Constant", [], [f"{prefix}axis"], name=f"{prefix}axis",
                                              value=numpy_helper.from_array(np.array([axis], np.int64))))
                parts = [f"{prefix}u{j}" for j in range(len(items))]
                nodes += [helper.make_node("Unsqueeze", [t, f"{prefix}axis"], [p], name=p) for t, p in zip(items, parts)]
            else:
                parts = [f"{prefix}u{j}" for j in range(len(items))]
                nodes += [helper.make_node("Unsqueeze", [t], [p], name=p, axes=[axis]) for t, p in zip(items, parts)]
        nodes.append(helper.make_node("Concat", parts, [node.output[0]], name=f"{prefix}concat", axis=axis))
        return nodes
    return None


def _split(node, ins, attrs, seqs, consts, shapes, opset, prefix):
    """SplitToSequence(x, split?) with sizes known: a Split, pieces Squeezed when keepdims=0."""
    x = ins[0]
    shape = shapes.get(x)
    if shape is None:
        return None
    axis = int(attrs.get("axis", 0))
    axis = axis + len(shape) if axis < 0 else axis
    if not 0 <= axis < len(shape):
        return None
    n = shape[axis]
    split = consts.get(ins[1]) if len(ins) > 1 and ins[1] else None
    if len(ins) > 1 and ins[1] and split is None:
        return None
    squeeze = False
    if split is None:
        sizes, squeeze = [1] * n, not attrs.get("keepdims", 1)
    elif np.asarray(split).ndim == 0:
        step = int(split)
        if step < 1:
            return None
        sizes = [step] * (n // step) + ([n % step] if n % step else [])
    else:
        sizes = [int(v) for v in np.asarray(split).reshape(-1)]
        if sum(sizes) != n or any(s < 0 for s in sizes):
            return None
    pieces = [f"{prefix}p{j}" for j in range(len(sizes))]
    nodes = [helper.make_node("Constant", [], [f"{prefix}sizes"], name=f"{prefix}sizes",
                              value=numpy_helper.from_array(np.array(sizes, np.int64)))]
    if opset >= 13:
        nodes.append(helper.make_node("Split", [x, f"{prefix}sizes"], pieces, name=f"{prefix}split", axis=axis))
    else:
        nodes = [helper.make_node("Split", [x], pieces, name=f"{prefix}split", axis=axis, split=sizes)]
    if squeeze:
        names = [f"{prefix}s{j}" for j in range(len(sizes))]
        if opset >= 13:
            nodes.append(helper.make_node("Constant", [], [f"{prefix}axis"], name=f"{prefix}axis",
                                          value=numpy_helper.from_array(np.array([axis], np.int64))))
            nodes += [helper.make_node("Squeeze", [p, f"{prefix}axis"], [s], name=s) for p, s in zip(pieces, names)]
        else:
            nodes += [helper.make_node("Squeeze", [p], [s], name=s, axes=[axis]) for p, s in zip(pieces, names)]
        pieces = names
    seqs[node.output[0]] = pieces
    return nodes
