"""A tree ensemble's forest kept out of the import's whole-model steps until the rewrite that reads it.

Why: a LightGBM model holds its forest in the attributes of one TreeEnsembleClassifier (a real
one, shipped in a pip package: 4.8 million nodes, 194 MB). Every whole-model step of the import
(onnx's checker, shape inference, the version converter, onnxruntime's folding in a worker
process) serializes and parses the whole model, 2 to 3 s each for that node alone, and none of
them reads a forest: shape inference reads the class labels, and the node's input is never a
constant, so nothing folds it. So after loading, a large forest's attributes move to a side
table, as numpy arrays read straight from the protobuf fields, and the node carries a forest of
one leaf meanwhile, which every one of those steps accepts. composite.py's builder reads the
real attributes back for the rewrite (ml_trees.py). The checker does not see the forest's
attributes, so their types are checked here against the op's schema, as it would.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import AttributeProto, helper

from .errors import ModelError

ML = "ai.onnx.ml"
#: The ops whose forest is moved, and the attributes that hold it (a prefix), with the one-leaf
#: forest the node carries meanwhile.
FORESTS = {
    "TreeEnsembleClassifier": ("nodes_", "class_"),
    "TreeEnsembleRegressor": ("nodes_", "target_"),
}
#: The stand-in's tree id: a node that carries it without an entry in the table lost its forest
#: on the way (a step renamed its output), which must be an error, never a rewrite of one leaf.
STAND_IN_TREE = 1_000_000_007
_ONE_LEAF = dict(nodes_treeids=[STAND_IN_TREE], nodes_nodeids=[0], nodes_featureids=[0], nodes_values=[0.0],
                 nodes_modes=["LEAF"], nodes_truenodeids=[0], nodes_falsenodeids=[0])
_ONE_WEIGHT = {p: {f"{p}ids": [0], f"{p}nodeids": [0], f"{p}treeids": [STAND_IN_TREE], f"{p}weights": [0.0]}
               for p in ("class_", "target_")}
#: A forest of more list values than this is moved (a small one costs nothing to carry along).
LARGE = 100_000

_LISTS = {AttributeProto.INTS: "ints", AttributeProto.FLOATS: "floats", AttributeProto.STRINGS: "strings"}


def _size(a: AttributeProto) -> int:
    return len(getattr(a, _LISTS[a.type])) if a.type in _LISTS else 0


def _value(a: AttributeProto):
    """A list attribute as a numpy array (one copy out of the protobuf field, where a Python list
    of millions of numbers took seconds); anything else as onnx reads it."""
    if a.type == AttributeProto.INTS:
        return np.array(a.ints, np.int64)
    if a.type == AttributeProto.FLOATS:
        return np.array(a.floats, np.float32)
    if a.type == AttributeProto.STRINGS:
        return np.array(a.strings) if len(a.strings) else np.zeros(0, "S1")
    return helper.get_attribute_value(a)


def _check_type(node: onnx.NodeProto, a: AttributeProto, opset: int, path) -> None:
    """The checker's test of an attribute's type against the op's schema, which it no longer
    sees on this node."""
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, ML)
    except Exception:  # (an opset the schemas do not know: the checker reports it on the node)
        return
    want = schema.attributes.get(a.name)
    if want is not None and want.type != a.type:
        raise ModelError(f"{path}: {node.op_type} node {node.name or node.output[0]!r}: attribute {a.name!r} must "
                         f"be {AttributeProto.AttributeType.Name(want.type)}, not "
                         f"{AttributeProto.AttributeType.Name(a.type)}")


def stash_forests(model: onnx.ModelProto, path) -> dict[str, dict]:
    """Move each large forest of `model`'s main graph (FORESTS, more than LARGE list values) into
    the returned table, keyed by the node's first output, and give the node one leaf instead (in
    place). Returns {} where there is none."""
    opset = next((o.version for o in model.opset_import if o.domain == ML), 1)
    table: dict[str, dict] = {}
    for node in model.graph.node:
        prefixes = FORESTS.get(node.op_type) if node.domain == ML else None
        if not prefixes or not node.output or not node.output[0] or node.output[0] in table:
            continue
        at = [k for k, a in enumerate(node.attribute) if a.name.startswith(prefixes) and not a.ref_attr_name]
        moved = [node.attribute[k] for k in at]
        if sum(_size(a) for a in moved) <= LARGE:
            continue
        names = [a.name for a in moved]
        for a in moved:
            if names.count(a.name) > 1:
                raise ModelError(f"{path}: {node.op_type} node {node.name or node.output[0]!r}: attribute "
                                 f"{a.name!r} is given {names.count(a.name)} times")
            _check_type(node, a, opset, path)
        table[node.output[0]] = {a.name: _value(a) for a in moved}
        kept = [a for k, a in enumerate(node.attribute) if k not in at]
        del node.attribute[:]
        node.attribute.extend(kept)
        stand_in = {**_ONE_LEAF, **_ONE_WEIGHT[prefixes[1]]}
        node.attribute.extend(helper.make_attribute(k, v) for k, v in sorted(stand_in.items()))
    return table


def with_forest(node: onnx.NodeProto, attrs: dict, table: dict[str, dict], path) -> dict:
    """`attrs` (node's, as the rewrite reads them) with the forest stash_forests moved from it put
    back in place of the stand-in; `attrs` itself for a node it did not touch."""
    prefixes = FORESTS.get(node.op_type) if node.domain == ML else None
    if not prefixes:
        return attrs
    moved = table.get(node.output[0]) if node.output else None
    if moved is None:
        trees = attrs.get("nodes_treeids")
        if trees is not None and len(trees) == 1 and trees[0] == STAND_IN_TREE:
            raise ModelError(f"{path}: {node.op_type} node {node.name or node.output[0]!r} lost its trees during the "
                             "import (a dlcc bug)")
        return attrs
    return {**{k: v for k, v in attrs.items() if not k.startswith(prefixes)}, **moved}
