"""TreeEnsembleRegressor and TreeEnsembleClassifier (ai.onnx.ml 1 and 3) written as standard ops
at import: the decision trees of scikit-learn, XGBoost and LightGBM models (skl2onnx, onnxmltools).

Why standard ops: a forest is a table walk. Every tree of every row descends one level per step,
all at once, as a [rows, trees] tensor of node indices (the "tree traversal" form Hummingbird
compiles to): per level, Gather the node's feature, threshold and children, GatherElements the
row's feature value, compare, and Where picks the child. A leaf's children are itself, so after
as many steps as the deepest tree every walk sits on its leaf. AStitch stitches each level's ops
into one kernel (a walk of 27 levels is about 30 launches), and nothing here needs a kernel of
its own.

The arithmetic is onnxruntime's CPU kernel's (onnxruntime/core/providers/cpu/ml/
tree_ensemble_common.h, tree_ensemble_aggregator.h and ml_common.h), down to the rounding:
  - the trees' leaf values are summed in the trees' order, from 0, a leaf's weights one at a
    time, as onnxruntime does on one thread: a CumSum along the trees whose last element AStitch
    computes alone. The order matters where a sum lands on a decision boundary (a random
    forest's 0.5 vote). (`dlcc verify` runs its reference on one thread: past 50 rows
    onnxruntime splits the trees between its threads, verify.has_tree_ensembles says why);
  - a tree starts at the first node of each run of nodes with one tree id, as onnxruntime reads
    the attribute lists; a leaf's first weight is its value for a single output;
  - a single-output regressor applies PROBIT and ignores the other score transforms; a
    classifier's label, and its scores in the two-class case, follow onnxruntime's rules for
    which classes got a score (see _binary), and a class or target no tree scored is written
    as 0;
  - LOGISTIC is onnxruntime's 1 / (1 + exp(-|x|)) mirrored, PROBIT its ErfInv approximation;
  - an integer input is compared as float, as onnxruntime's int-to-float conversion does.

A model onnxruntime refuses is refused with its reason (a leaf without a weight, a child in
another tree, a feature past the input's columns); one it would loop forever on (a cycle) too.
String class labels (a string output), a float64 input (compared in double), a node no walk
from its tree's first listed node reaches (onnxruntime gives its weights to another leaf), the
two-class cases where onnxruntime writes one score of the two stay unsupported, and
`--fallback onnxruntime` runs them there. docs/classic-ml.md has the whole story.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from .fused_ops import _Builder

_F, _I64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64

#: The comparison of each branch mode (the value on the left, the threshold on the right); NEQ
#: is Not(Equal), true for a NaN as C's != is.
MODES = {"BRANCH_LEQ": "LessOrEqual", "BRANCH_LT": "Less", "BRANCH_GTE": "GreaterOrEqual",
         "BRANCH_GT": "Greater", "BRANCH_EQ": "Equal", "BRANCH_NEQ": "Not"}
#: The opset-5 TreeEnsemble's categorical sets (BRANCH_MEMBER), as _tree_ensemble converts them:
#: a set of integers in 0..30, fewer than 31, holds a value equal to a member; a larger one (or
#: one reaching outside 0..30) holds a finite value whose truncation toward zero is a member, as
#: onnxruntime's BRANCH_MEMBER_BIGSET does (3.5 is in {1, 3, 40}). Only that conversion writes
#: them: a TreeEnsembleRegressor's own nodes_modes cannot name them.
MEMBER_MODES = ("BRANCH_MEMBER", "BRANCH_MEMBER_BIGSET")
TRANSFORMS = ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT")
AGGREGATES = ("SUM", "AVERAGE", "MIN", "MAX")

#: The deepest tree walked: each level is a handful of ops, so a degenerate tree thousands of
#: levels deep would make a graph of tens of thousands of nodes.
MAX_DEPTH = 512
#: The most values in a leaf table ([nodes, weights per leaf and output, outputs]): 512 MiB of
#: float32, so a hostile n_targets cannot make the compiler allocate without bound.
MAX_TABLE = 1 << 27


@dataclass
class Weights:
    """The leaves' weights as arrays, in onnxruntime's order (by tree id, node id, then the
    attribute order): whose leaf each is (a node position), for which class or target, and its
    value."""

    node: np.ndarray   # int64
    output: np.ndarray  # int64
    value: np.ndarray  # float32


@dataclass
class Forest:
    """The node tables of every tree, indexed by a node's position in the attribute lists."""

    feature: np.ndarray     # int64: the column a branch reads (0 at leaves)
    threshold: np.ndarray   # float32
    mode: np.ndarray        # int64: index into MODES' keys then MEMBER_MODES, -1 at leaves
    on_true: np.ndarray     # int64: the next node where the comparison holds (a leaf: itself)
    on_false: np.ndarray    # int64
    nan_true: np.ndarray    # bool: a NaN value takes the true branch
    roots: np.ndarray       # int64, one per tree, in onnxruntime's order
    weights: "Weights"      # the leaves' weights, in onnxruntime's order
    classes_named: frozenset  # the class (or target) ids the weights name, leaves or not
    all_positive: bool      # no weight is negative (onnxruntime's weights_are_all_positive_)
    sets: tuple = ()        # a member node's set (its threshold indexes these): int64 arrays
    branch_levels: list = field(default_factory=list)  # the branches a walk reaches at each level, roots' first

    @property
    def depth(self) -> int:
        """The most branches on any walk."""
        return len(self.branch_levels)

    @property
    def size(self) -> int:
        return len(self.feature)

    def modes_used(self) -> list[int]:
        return np.unique(self.mode[self.mode >= 0]).tolist()


def elem_name(elem: int | None) -> str:
    """An ONNX element type's name for a message ("unknown" where inference found none)."""
    return onnx.TensorProto.DataType.Name(elem) if elem else "unknown"


def text_attr(b: _Builder, name: str, default: str) -> str:
    """A string attribute (the ML ops' modes and transforms), decoded."""
    v = b.attrs.get(name, default)
    if not isinstance(v, (bytes, str)):
        raise b.fail(f"attribute {name!r} must be a string, not {v!r}"[:300])
    return v.decode(errors="replace") if isinstance(v, bytes) else v


def _values(b: _Builder, name: str, dtype, required: bool = True) -> np.ndarray:
    """A list attribute, or its `_as_tensor` twin (a float32 tensor: onnxruntime cannot read a
    double one for a float model)."""
    plain, tensor = b.attrs.get(name), b.attrs.get(f"{name}_as_tensor")
    if plain is not None and len(plain) and tensor is not None:
        raise b.fail(f"only one of the attributes {name!r} and '{name}_as_tensor' may be given")
    if tensor is not None:
        if not isinstance(tensor, onnx.TensorProto) or tensor.data_type != _F:
            raise b.fail(f"attribute '{name}_as_tensor' must be a float32 tensor for a float model")
        return numpy_helper.to_array(tensor).reshape(-1).astype(dtype)
    if plain is None or not len(plain):
        if required:
            raise b.fail(f"attribute {name!r} is required and must not be empty")
        return np.zeros(0, dtype)
    arr = np.asarray(plain)  # (one conversion: a LightGBM forest's lists hold millions of values)
    if arr.dtype.kind not in "biuf":
        raise b.fail(f"attribute {name!r} must hold numbers")
    return arr.astype(dtype, copy=False)


def _coded_strings(b: _Builder, name: str) -> tuple[list[str], np.ndarray]:
    """A long string attribute (a forest's nodes_modes: one per node, millions in a LightGBM
    model) as its distinct values and an int64 code per element: decoding each element alone
    took seconds."""
    v = b.attrs.get(name)
    if v is None or not len(v):
        return [], np.zeros(0, np.int64)
    raw = np.asarray(v)
    if raw.dtype.kind not in "SU":
        raise b.fail(f"attribute {name!r} must hold strings")
    distinct, code = np.unique(raw, return_inverse=True)
    return [s.decode(errors="replace") if isinstance(s, bytes) else str(s) for s in distinct.tolist()], code


class _NodeKeys:
    """Finds a node's position by its (tree id, node id) pair, for arrays of pairs at once.

    Why: a LightGBM forest has millions of nodes, and a dict of Python tuples took most of a
    minute to build and query. The ids are ranked among their distinct values, so a pair is one
    int64 (below nodes², whatever ids the file holds), and the pairs are searched sorted."""

    def __init__(self, tree: np.ndarray, node_id: np.ndarray):
        self.trees, tree_rank = np.unique(tree, return_inverse=True)
        self.nodes, node_rank = np.unique(node_id, return_inverse=True)
        key = tree_rank.astype(np.int64) * self.nodes.size + node_rank
        self.order = np.argsort(key, kind="stable")
        self.sorted = key[self.order]

    def twice(self) -> int | None:
        """The first position (in file order) of a pair given before it, or None."""
        again = np.flatnonzero(self.sorted[1:] == self.sorted[:-1]) + 1
        return int(self.order[again].min()) if again.size else None

    def find(self, tree: np.ndarray, node_id: np.ndarray) -> np.ndarray:
        """The position of each (tree, node_id) pair; -1 where there is none."""
        out = np.full(tree.size, -1, np.int64)
        if not self.sorted.size or not tree.size:
            return out
        t = np.minimum(np.searchsorted(self.trees, tree), self.trees.size - 1)
        k = np.minimum(np.searchsorted(self.nodes, node_id), self.nodes.size - 1)
        ok = (self.trees[t] == tree) & (self.nodes[k] == node_id)
        key = t.astype(np.int64) * self.nodes.size + k
        at = np.minimum(np.searchsorted(self.sorted, key), self.sorted.size - 1)
        ok &= self.sorted[at] == key
        out[ok] = self.order[at[ok]]
        return out


def read_forest(b: _Builder, prefix: str, outputs: int, columns: int, sets: tuple = ()) -> Forest:
    """The trees of the node's attributes (`prefix`: "class" or "target", naming the weights),
    checked as onnxruntime checks them at load, and for cycles. `sets`: the membership sets that
    _tree_ensemble's member nodes index (MEMBER_MODES). Every step is on whole arrays: a
    LightGBM model holds millions of nodes."""
    tree = _values(b, "nodes_treeids", np.int64)
    n = tree.size
    node_id = _values(b, "nodes_nodeids", np.int64)
    feature = _values(b, "nodes_featureids", np.int64)
    threshold = _values(b, "nodes_values", np.float32)
    t_id, f_id = _values(b, "nodes_truenodeids", np.int64), _values(b, "nodes_falsenodeids", np.int64)
    mode_names, mode_code = _coded_strings(b, "nodes_modes")
    for name, arr in (("nodes_nodeids", node_id), ("nodes_featureids", feature), ("nodes_values", threshold),
                      ("nodes_truenodeids", t_id), ("nodes_falsenodeids", f_id), ("nodes_modes", mode_code)):
        if len(arr) != n:
            raise b.fail(f"{name} holds {len(arr)} values, not one per node ({n}, as nodes_treeids)")
    known = (*MODES, *MEMBER_MODES) if sets else tuple(MODES)
    unknown = sorted(m for m in mode_names if m != "LEAF" and m not in known)
    if unknown:
        raise b.fail(f"node mode {unknown[0]!r} is not LEAF or one of {', '.join(MODES)}")
    missing = _values(b, "nodes_missing_value_tracks_true", np.int64, required=False)[:n]
    nan_true = np.zeros(n, bool)
    nan_true[:missing.size] = missing == 1

    keys = _NodeKeys(tree, node_id)
    i = keys.twice()
    if i is not None:
        raise b.fail(f"node {node_id[i]} of tree {tree[i]} is given twice")
    mode = np.array([known.index(m) if m in known else -1 for m in mode_names], np.int64)[mode_code]
    leaf = mode < 0
    branch = ~leaf
    on_true, on_false = np.arange(n, dtype=np.int64), np.arange(n, dtype=np.int64)
    at = np.flatnonzero(branch)
    problems = []  # (node position, the order onnxruntime's walk checks them in, message)
    for rank, (side, ids, table) in enumerate((("true", t_id, on_true), ("false", f_id, on_false))):
        j = keys.find(tree[at], ids[at])
        table[at] = j
        for i in at[j < 0][:1]:
            problems.append((i, 2 * rank, f"the {side} branch of node {node_id[i]} in tree {tree[i]} is node "
                                          f"{ids[i]}, which that tree does not have"))
        for i in at[j == at][:1]:
            problems.append((i, 2 * rank + 1, f"node {node_id[i]} in tree {tree[i]} is its own {side} branch"))
    if problems:
        raise b.fail(min(problems)[2])
    if n and feature.max() >= columns:  # (onnxruntime's check reads every node's, leaves included)
        raise b.fail(f"a node reads feature {int(feature.max())}, but the input has {columns} column(s)")
    if branch.any() and feature[branch].min() < 0:
        raise b.fail(f"a branch reads feature {int(feature[branch].min())}")
    feature = np.where(branch, feature, 0)

    targets = np.r_[t_id[branch], f_id[branch]]
    outside = targets[(targets < 0) | (targets >= n)]
    if outside.size:  # (onnxruntime's check, though a node id is only a name)
        raise b.fail(f"a branch leads to node id {int(outside[0])}, outside [0, {n - 1}] (onnxruntime requires "
                     "node ids below the number of nodes)")
    starts = np.flatnonzero(np.r_[True, tree[1:] != tree[:-1]]) if n else np.zeros(0, np.int64)
    if not starts.size:
        raise b.fail("the ensemble has no trees")
    reached, levels = _levels(b, starts, on_true, on_false, branch)
    if not reached.all():
        i = int(np.flatnonzero(~reached)[0])
        raise b.unsupported(f"node {node_id[i]} of tree {tree[i]}, which no walk from the tree's first listed node "
                            "reaches (onnxruntime walks from the first node listed, and gives such nodes' weights "
                            "to another leaf)")

    ids = _values(b, f"{prefix}_ids", np.int64, required=False)
    nodes, trees = _values(b, f"{prefix}_nodeids", np.int64, False), _values(b, f"{prefix}_treeids", np.int64, False)
    w = _values(b, f"{prefix}_weights", np.float32, required=False)
    if not (ids.size == nodes.size == trees.size == w.size):
        raise b.fail(f"{prefix}_ids, {prefix}_nodeids, {prefix}_treeids and {prefix}_weights must hold one "
                     f"value each per weight, not {ids.size}, {nodes.size}, {trees.size} and {w.size}")
    bad = ids[(ids < 0) | (ids >= outputs)]
    if bad.size:
        raise b.fail(f"a weight is for {prefix} {int(bad[0])}, outside [0, {outputs - 1}]")
    order = np.lexsort((np.arange(ids.size), nodes, trees))  # onnxruntime's order
    j = keys.find(trees[order], nodes[order])
    if (j < 0).any():
        k = order[np.flatnonzero(j < 0)[0]]
        raise b.fail(f"a weight is for node {nodes[k]} of tree {trees[k]}, which is not there")
    kept = leaf[j]  # (onnxruntime ignores weights on branches, which old onnxmltools wrote)
    weights = Weights(j[kept], ids[order][kept], w[order][kept])
    bare = np.flatnonzero(leaf & (np.bincount(weights.node, minlength=n) == 0))
    if bare.size:
        raise b.fail(f"leaf {node_id[bare[0]]} of tree {tree[bare[0]]} has no weight")
    return Forest(feature, threshold, mode, on_true, on_false, nan_true, starts.astype(np.int64), weights,
                  frozenset(np.unique(ids).tolist()), not bool((w < 0).any()), tuple(sets), levels)


def _levels(b: _Builder, roots: np.ndarray, on_true: np.ndarray, on_false: np.ndarray,
            branch: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Which nodes a walk from the roots reaches, and the branches reached at each level, from
    the roots' (as many levels as the most branches on a walk): level by level over the set of
    nodes reached (a tree's levels hold each node once, so this is linear in the nodes). A walk
    still on a branch after as many levels as there are nodes has met a cycle."""
    level, depth = np.unique(roots), 0
    reached = np.zeros(branch.size, bool)
    seen = np.zeros(branch.size, bool)
    levels = []
    while True:
        reached[level] = True
        level = level[branch[level]]
        if not level.size:
            return reached, levels
        levels.append(level)
        depth += 1
        if depth > MAX_DEPTH:
            if depth > branch.size:
                raise b.fail("a tree's branches form a cycle (onnxruntime would walk it forever)")
            raise b.unsupported(f"a tree deeper than {MAX_DEPTH} levels")
        nxt = np.concatenate([on_true[level], on_false[level]])
        if nxt.size * 64 < branch.size:  # (a small level: sorting it is cheaper than a pass over every node)
            level = np.unique(nxt)
        else:
            seen[nxt] = True
            level = np.flatnonzero(seen)
            seen[level] = False


# -- the walk -------------------------------------------------------------------------------------
def _compare(b: _Builder, mode: int, value: str, limit: str, f: Forest, tables) -> str:
    if mode >= len(MODES):
        return _member(b, MEMBER_MODES[mode - len(MODES)] == "BRANCH_MEMBER", value, limit, f, tables)
    op = list(MODES.values())[mode]
    if op == "Not":
        return b.op("Not", [b.op("Equal", [value, limit])])
    return b.op(op, [value, limit])


def _member(b: _Builder, exact: bool, value: str, limit: str, f: Forest, table) -> str:
    """Whether `value` is in the set `limit` indexes (MEMBER_MODES): one bool table of every
    set over the span of all their members, read at set · span + (trunc(value) − lowest). `exact`:
    the value must be that integer itself; else its truncation toward zero (a finite value
    within the span) will do."""
    lo = min(int(s.min()) for s in f.sets)
    span = max(int(s.max()) for s in f.sets) - lo + 1
    if len(f.sets) * span > MAX_TABLE:
        raise b.unsupported(f"{len(f.sets)} categorical sets whose members span {span} integers (more than "
                            f"{MAX_TABLE} table entries)")
    member = np.zeros((len(f.sets), span), np.bool_)
    for k, s in enumerate(f.sets):
        member[k, s - lo] = True
    if exact:
        inside = b.op("And", [b.op("GreaterOrEqual", [value, b.constant(np.float32(lo))]),
                              b.op("LessOrEqual", [value, b.constant(np.float32(lo + span - 1))])])
    else:  # (trunc(v) in [lo, hi] for v in (lo − 1, hi + 1); NaN and ±inf are outside)
        inside = b.op("And", [b.op("Greater", [value, b.constant(np.float32(lo - 1))]),
                              b.op("Less", [value, b.constant(np.float32(lo + span))])])
    whole = b.op("Cast", [b.op("Where", [inside, value, b.constant(np.float32(lo))])], to=onnx.TensorProto.INT32)
    at = b.op("Add", [b.op("Mul", [b.op("Cast", [limit], to=onnx.TensorProto.INT32), b.constant(np.int32(span), np.int32)]),
                      b.op("Sub", [whole, b.constant(np.int32(lo), np.int32)])])
    hit = b.op("And", [inside, b.op("Gather", [table("member", member.reshape(-1), np.bool_), at], axis=0)])
    if exact:
        hit = b.op("And", [hit, b.op("Equal", [b.op("Cast", [whole], to=_F), value])])
    return hit


def _leaves(b: _Builder, x: str, rows: int, f: Forest) -> str:
    """[rows, trees] int32: the leaf each tree reaches for each row of x ([rows, C] float32).
    (int32 indices: half the bytes of int64 per level, and a forest's nodes number far fewer
    than 2^31.)"""
    tables = {}

    def table(name: str, arr: np.ndarray, dtype) -> str:
        if name not in tables:
            tables[name] = b.constant(arr, dtype)
        return tables[name]

    cur = b.op("Expand", [b.constant(f.roots.reshape(1, -1), np.int32), b.ints(rows, f.roots.size)])
    used = f.modes_used()
    nan_true = bool(f.nan_true[f.mode >= 0].any())
    for _ in range(f.depth):
        column = b.op("Gather", [table("feature", f.feature, np.int32), cur], axis=0)
        value = b.op("GatherElements", [x, column], axis=1)
        limit = b.op("Gather", [table("threshold", f.threshold, np.float32), cur], axis=0)
        if len(used) == 1:
            cond = _compare(b, used[0], value, limit, f, table)
        else:
            mode = b.op("Gather", [table("mode", f.mode, np.int32), cur], axis=0)
            cond = None
            for m in used:
                hit = b.op("And", [b.op("Equal", [mode, b.constant(np.int32(m), np.int32)]),
                                   _compare(b, m, value, limit, f, table)])
                cond = hit if cond is None else b.op("Or", [cond, hit])
        if nan_true:
            track = b.op("Gather", [table("nan_true", f.nan_true, np.bool_), cur], axis=0)
            cond = b.op("Or", [cond, b.op("And", [b.op("IsNaN", [value]), track])])
        cur = b.op("Where", [cond, b.op("Gather", [table("on_true", f.on_true, np.int32), cur], axis=0),
                             b.op("Gather", [table("on_false", f.on_false, np.int32), cur], axis=0)])
    return cur


def _per_leaf(b: _Builder, f: Forest, outputs: int, how: str) -> tuple[np.ndarray, np.ndarray]:
    """[nodes, slots, outputs] tables of each leaf's values per output, and [nodes, outputs] of
    whether it gives that output a weight. `how`: "sum": a leaf's weights for an output one per
    slot, in their order (onnxruntime adds them to the running sum one at a time; 0 in the slots
    left over); "min" or "max" of them (one slot; ±inf where it gives none; onnxruntime keeps a
    leaf's first weight and then a smaller (larger) one, so a first NaN stays and a later one
    does not count); "first": its first weight (a single output, which onnxruntime reads so)."""
    wt = f.weights
    node, out, val = wt.node, wt.output, wt.value
    if how == "first":  # (each leaf's weights are contiguous, in order)
        first = np.flatnonzero(np.r_[True, node[1:] != node[:-1]]) if node.size else np.zeros(0, np.int64)
        node, out, val = node[first], np.zeros(first.size, np.int64), val[first]
    # A weight's rank among its leaf's weights for its output (a stable sort keeps their order).
    pair = node * outputs + out
    order = np.argsort(pair, kind="stable")
    sp = pair[order]
    starts = np.r_[True, sp[1:] != sp[:-1]] if sp.size else np.zeros(0, bool)
    group_start = np.maximum.accumulate(np.where(starts, np.arange(sp.size), 0)) if sp.size else sp
    rank = np.empty(sp.size, np.int64)
    rank[order] = np.arange(sp.size) - group_start
    slots = int(rank.max()) + 1 if how == "sum" and rank.size else 1
    if f.size * slots * outputs > MAX_TABLE:
        raise b.unsupported(f"a leaf table of {f.size} nodes x {slots} weight(s) x {outputs} outputs "
                            f"(more than {MAX_TABLE} values)")
    value = np.full((f.size, slots, outputs), {"min": np.inf, "max": -np.inf}.get(how, 0.0), np.float32)
    has = np.zeros((f.size, outputs), bool)
    has[node, out] = True
    if how in ("sum", "first"):
        value[node, rank, out] = val
    else:
        (np.fmin if how == "min" else np.fmax).at(value[:, 0, :], (node, out), val)
        lead = rank == 0
        nan_first = lead & np.isnan(val)
        value[node[nan_first], 0, out[nan_first]] = np.nan
    return value, has


@dataclass
class Scores:
    """The aggregated scores [rows, outputs], and whether each output got a weight from some
    tree: a [outputs] numpy bool array where the trees decide it for every row, else a
    [rows, outputs] bool tensor."""

    value: str
    has: object


def _aggregate(b: _Builder, x: str, rows: int, f: Forest, outputs: int, agg: str, single: bool) -> Scores:
    """The trees' leaf values combined per row: summed in the trees' order from 0, a leaf's
    weights in theirs (the last element of a CumSum, which AStitch computes alone: one
    sequential sum per output, as onnxruntime's loop adds), averaged, or their min or max.
    `single`: a single output, for which onnxruntime reads each leaf's first weight."""
    leaves = _leaves(b, x, rows, f)
    how = "first" if single else ("sum" if agg in ("SUM", "AVERAGE") else agg.lower())
    value, has = _per_leaf(b, f, outputs, how)
    slots = value.shape[1]
    per_tree = b.op("Gather", [b.constant(value.reshape(f.size, -1)), leaves], axis=0)  # [rows, trees, slots*outputs]
    per_tree = b.op("Reshape", [per_tree, b.ints(rows, f.roots.size * slots, outputs)])
    if agg in ("SUM", "AVERAGE"):
        total = b.op("CumSum", [per_tree, b.constant(np.int64(1), np.int64)])
        total = b.slice(total, -1, np.iinfo(np.int64).max, 1)
    else:
        total = b.reduce("ReduceMin" if agg == "MIN" else "ReduceMax", per_tree, [1])
    total = b.op("Reshape", [total, b.ints(rows, outputs)])
    if agg == "AVERAGE":
        total = b.op("Div", [total, b.constant(np.float32(f.roots.size))])
    # An output some tree weighs at every leaf it can reach is scored on every row; one no leaf
    # weighs, on none. (Every node is reached: read_forest checks. A branch's "every leaf"
    # is both children's, settled bottom up, level by level from the deepest.)
    every = has.copy()
    for br in reversed(f.branch_levels):  # (the deepest first: a branch's children are settled)
        every[br] = every[f.on_true[br]] & every[f.on_false[br]]
    always, never = every[f.roots].any(axis=0), ~has.any(axis=0)
    if (always | never).all():
        return Scores(total, always)
    some = b.reduce("ReduceMax", b.op("Gather", [b.constant(has.astype(np.float32)), leaves], axis=0), [1])
    return Scores(total, b.op("Greater", [b.op("Reshape", [some, b.ints(rows, outputs)]), b.constant(np.float32(0))]))


# -- score transforms (ml_common.h) ---------------------------------------------------------------
def logistic(b: _Builder, x: str) -> str:
    """onnxruntime's ComputeLogistic: v = 1 / (1 + exp(-|x|)), and 1 - v for a negative x."""
    one = b.constant(np.float32(1))
    v = b.op("Div", [one, b.op("Add", [one, b.op("Exp", [b.op("Neg", [b.op("Abs", [x])])])])])
    return b.op("Where", [b.op("Less", [x, b.constant(np.float32(0))]), b.op("Sub", [one, v]), v])


def _probit(b: _Builder, x: str) -> str:
    """onnxruntime's ComputeProbit: sqrt(2) * ErfInv(2x - 1), with its float ErfInv
    approximation (constant 0.147) step for step."""
    f32 = np.float32
    c = lambda v: b.constant(f32(v))  # noqa: E731
    t = b.op("Sub", [b.op("Mul", [c(2), x]), c(1)])
    sign = b.op("Where", [b.op("Less", [t, c(0)]), c(-1), c(1)])
    lg = b.op("Log", [b.op("Mul", [b.op("Sub", [c(1), t]), b.op("Add", [c(1), t])])])
    v = b.op("Add", [c(f32(2) / (f32(np.pi) * f32(0.147))), b.op("Mul", [c(0.5), lg])])
    v2 = b.op("Mul", [c(f32(1) / f32(0.147)), lg])
    v3 = b.op("Add", [b.op("Neg", [v]), b.op("Sqrt", [b.op("Sub", [b.op("Mul", [v, v]), v2])])])
    return b.op("Mul", [c(np.sqrt(f32(2))), b.op("Mul", [sign, b.op("Sqrt", [v3])])])


def _softmax_zero(b: _Builder, x: str) -> str:
    """onnxruntime's ComputeSoftmaxZero: values within 1e-7 of 0 are scaled by exp(-max) and
    left out of the sum."""
    f32 = np.float32
    top = b.op("Max", [b.reduce("ReduceMax", x, [-1]), b.constant(-np.finfo(f32).max)])
    eps = f32(0.0000001)
    live = b.op("Or", [b.op("Greater", [x, b.constant(eps)]), b.op("Less", [x, b.constant(-eps)])])
    e = b.op("Where", [live, b.op("Exp", [b.op("Sub", [x, top])]), b.op("Mul", [x, b.op("Exp", [b.op("Neg", [top])])])])
    total = b.reduce("ReduceSum", b.op("Where", [live, e, b.constant(f32(0))]), [-1])
    return b.op("Div", [e, total])


def score_transform(b: _Builder, x: str, post: str) -> str:
    """A [rows, k] score tensor through onnxruntime's write_scores transform for k >= 2 (the ML
    classifiers share it: ml_ops' SVMClassifier too)."""
    if post == "LOGISTIC":
        return logistic(b, x)
    if post == "SOFTMAX":
        return b.op("Softmax", [x], axis=-1)
    if post == "SOFTMAX_ZERO":
        return _softmax_zero(b, x)
    if post == "PROBIT":
        return _probit(b, x)
    return x


# -- the ops --------------------------------------------------------------------------------------
def _input(b: _Builder) -> tuple[str, int, int]:
    """X [rows, columns] as float32: integers are converted, as onnxruntime compares them with
    the float thresholds. (A 1-D X is refused, as onnxruntime's shape inference refuses it.) A
    float64 X is converted only where a precision was asked for (`b.narrow_float64`): onnxruntime
    compares it in double, and an X within half a float32 step under a threshold can take the
    other branch once rounded."""
    x = b.node.input[0]
    shape = b.shape(x)
    if len(shape) != 2:
        raise b.fail(f"the input must be 2-D [N, C], not of shape {list(shape)}")
    elem = b.elem(x)
    if elem == onnx.TensorProto.DOUBLE and not getattr(b, "narrow_float64", False):
        raise b.unsupported("a float64 input (onnxruntime compares it with the thresholds in double; "
                            "--precision fp32 compares it in float32)")
    if elem not in (_F, _I64, onnx.TensorProto.INT32, onnx.TensorProto.DOUBLE):
        raise b.fail(f"input type {elem_name(elem)} is not float, double, int64 or int32")
    return (x if elem == _F else b.op("Cast", [x], to=_F)), shape[0], shape[1]


def _choice(b: _Builder, name: str, default: str, allowed: tuple) -> str:
    v = text_attr(b, name, default)
    if v not in allowed:
        raise b.fail(f"{name} {v!r} is not one of {', '.join(allowed)}")
    return v


def _tree_regressor(b: _Builder, out_elem: int = _F, sets: tuple = ()) -> None:
    """Y [rows, n_targets]: the trees' values aggregated (SUM by default, AVERAGE, MIN or MAX),
    plus the base values, through the score transform; of type `out_elem`. `sets`: read_forest's."""
    x, rows, cols = _input(b)
    targets = int(b.attr("n_targets", 0))
    if targets < 1:
        raise b.fail(f"n_targets must be at least 1, not {targets}")
    post = _choice(b, "post_transform", "NONE", TRANSFORMS)
    agg = _choice(b, "aggregate_function", "SUM", AGGREGATES)
    base = _values(b, "base_values", np.float32, required=False)
    if base.size not in (0, targets):
        raise b.fail(f"base_values holds {base.size} values, not 0 or one per target ({targets})")
    forest = read_forest(b, "target", targets, cols, sets)
    sc = _aggregate(b, x, rows, forest, targets, agg, single=targets == 1)
    if targets == 1:  # (onnxruntime's single-output path: one base value, and PROBIT alone)
        y = b.op("Add", [sc.value, b.constant(base[0] if base.size == 1 else np.float32(0))])
        y = _probit(b, y) if post == "PROBIT" else y
    else:
        y = sc.value
        if base.size == targets:
            y = b.op("Add", [b.constant(base), y])
        if not (isinstance(sc.has, np.ndarray) and sc.has.all()):  # an unscored target is written as 0
            has = b.constant(sc.has, np.bool_) if isinstance(sc.has, np.ndarray) else sc.has
            y = b.op("Where", [has, y, b.constant(np.float32(0))])
        y = score_transform(b, y, post)
    if out_elem == _F:
        b.op("Identity", [y], b.node.output[0])
    else:
        b.op("Cast", [y], b.node.output[0], to=out_elem)


def _select(b: _Builder, cond, yes: str, no: str) -> str:
    """yes where cond holds: cond a Python bool, or a bool tensor."""
    if isinstance(cond, (bool, np.bool_)):
        return yes if cond else no
    return b.op("Where", [cond, yes, no])


def _tree_classifier(b: _Builder) -> None:
    """Label [rows] (int64) and scores [rows, classes]: the trees' class weights summed, plus the
    base values, through onnxruntime's rules for the label and the score transform."""
    x, rows, cols = _input(b)
    if b.attrs.get("classlabels_strings"):
        raise b.unsupported("string class labels (a string output)")
    labels = np.asarray(b.attrs.get("classlabels_int64s") or [], np.int64)
    if labels.size < 2:
        if not labels.size:
            raise b.fail("classlabels_int64s or classlabels_strings is required")
        raise b.unsupported("a classifier with a single class")
    post = _choice(b, "post_transform", "NONE", TRANSFORMS)
    base = _values(b, "base_values", np.float32, required=False)
    k = labels.size
    if base.size not in (0, k) and not (k == 2 and base.size == 1):
        raise b.fail(f"base_values holds {base.size} values, not 0 or one per class ({k})")
    forest = read_forest(b, "class", k, cols)
    sc = _aggregate(b, x, rows, forest, k, "SUM", single=False)
    label, scores = (_binary if k == 2 else _multiclass)(b, sc, base, labels, post, forest, rows)
    b.op("Identity", [label], b.node.output[0])
    if len(b.node.output) > 1 and b.node.output[1]:
        b.op("Identity", [scores], b.node.output[1])


def _multiclass(b: _Builder, sc: Scores, base: np.ndarray, labels: np.ndarray, post: str, forest: Forest,
                rows: int) -> tuple[str, str]:
    """Three classes or more: the base values are added, and the label is that of the first
    largest score among the scored classes."""
    s, has = sc.value, sc.has
    if base.size:  # (one per class: every class counts as scored)
        s, has = b.op("Add", [s, b.constant(base)]), np.ones(labels.size, bool)
    pick = s
    if not (isinstance(has, np.ndarray) and has.all()):
        mask = b.constant(has, np.bool_) if isinstance(has, np.ndarray) else has
        pick = b.op("Where", [mask, s, b.constant(np.float32(-np.inf))])
    best = b.op("ArgMax", [pick], axis=1, keepdims=0)
    return b.op("Gather", [b.constant(labels, np.int64), best], axis=0), score_transform(b, s, post)


def _binary(b: _Builder, sc: Scores, base: np.ndarray, labels: np.ndarray, post: str, forest: Forest,
            rows: int) -> tuple[str, str]:
    """Two classes, after onnxruntime's TreeAggregatorClassifier::FinalizeScores and write_scores.
    Which case a row takes depends on whether class 1 got a weight there (h1; h0 likewise):
      - with h1, or with two base values, two scores go through the transform: [-(s0 + b1),
        s0 + b1] with h1 and two base values, [s0 + b0, s1 + b1] without h1, else [s0 (+ b0), s1];
      - otherwise one score p = s0 (+ b0) is written as two: through LOGISTIC [L(-p), L(p)];
        else [1 - p, p] where the model is binary (its weights name one class) and no weight is
        negative, else [-p, p] (onnxruntime 1.32's results: its older sources apply LOGISTIC
        to mixed weights only);
      - a score whose class got no weight is read as 0 when written (onnxruntime's ScoreValue),
        base value or not;
      - the label compares the positive score (s1 with h1, else p where h0, else 0) with 0.5
        (binary, no negative weight) or 0; a model whose weights name both classes gets the
        label 1 or 0 itself, not its class labels, as onnxruntime gives."""
    f32 = np.float32
    s0, s1 = (b.slice(sc.value, i, i + 1, 1) for i in (0, 1))
    flag = lambda i: (bool(sc.has[i]) if isinstance(sc.has, np.ndarray)  # noqa: E731
                      else b.slice(sc.has, i, i + 1, 1))
    h0, h1 = flag(0), flag(1)
    binary, positive = len(forest.classes_named) == 1, forest.all_positive
    zero = b.constant(f32(0))
    plus = lambda s, i: b.op("Add", [s, b.constant(base[i])])  # noqa: E731

    def written(p0, has0, p1, has1) -> str:  # two scores as write_scores reads them, transformed
        zeros = b.constant(np.zeros((rows, 1), f32))
        pair = b.op("Concat", [_select(b, has0, p0, zeros), _select(b, has1, p1, zeros)], axis=1)
        return score_transform(b, pair, post)

    z_yes = pos_yes = z_no = pos_no = None
    if h1 is not False:  # class 1 scored
        if base.size == 2:
            p1 = plus(s0, 1)
            z_yes, pos_yes = written(b.op("Neg", [p1]), h0, p1, True), p1
        else:
            z_yes, pos_yes = written(plus(s0, 0) if base.size == 1 else s0, h0, s1, True), s1
    if h1 is not True:  # class 1 not scored
        if base.size == 2:
            p0 = plus(s0, 0)
            z_no, pos_no = written(p0, h0, p0, False), _select(b, h0, p0, zero)
        else:
            if post == "PROBIT" or not (binary or base.size == 0):
                raise b.unsupported("a two-class model whose leaves may give class 1 no weight, with "
                                    + ("PROBIT" if post == "PROBIT" else "one base value and weights for both classes")
                                    + " (onnxruntime writes one score of the two)")
            p = pos_no = _select(b, h0, plus(s0, 0) if base.size == 1 else s0, zero)
            if post == "LOGISTIC":
                z_no = b.op("Concat", [logistic(b, b.op("Neg", [p])), logistic(b, p)], axis=1)
            elif binary and positive:
                z_no = b.op("Concat", [b.op("Sub", [b.constant(f32(1)), p]), p], axis=1)
            else:
                z_no = b.op("Concat", [b.op("Neg", [p]), p], axis=1)
    z = z_yes if z_no is None else (z_no if z_yes is None else _select(b, h1, z_yes, z_no))
    pos = pos_yes if pos_no is None else (pos_no if pos_yes is None else _select(b, h1, pos_yes, pos_no))
    pos = b.op("Reshape", [pos, b.ints(rows)])
    if binary:
        hit = b.op("Greater", [pos, b.constant(f32(0.5) if positive else f32(0))])
        pair_labels = (labels[1], labels[0])
    else:
        hit, pair_labels = b.op("Greater", [pos, zero]), (1, 0)
    label = b.op("Where", [hit, b.constant(np.int64(pair_labels[0]), np.int64),
                           b.constant(np.int64(pair_labels[1]), np.int64)])
    return label, z


#: TreeEnsemble's nodes_modes (ai.onnx.ml 5), by value.
V5_MODES = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ", "BRANCH_MEMBER")
V5_AGGREGATES = {0: "AVERAGE", 1: "SUM", 2: "MIN", 3: "MAX"}
#: post_transform by value as onnxruntime reads it (its POST_EVAL_TRANSFORM enum). The ONNX spec
#: lists SOFTMAX as 1 and LOGISTIC as 2; onnxruntime, the reference verify checks against, swaps
#: them (a test against it fails the other way round).
V5_TRANSFORMS = {0: "NONE", 1: "LOGISTIC", 2: "SOFTMAX", 3: "SOFTMAX_ZERO", 4: "PROBIT"}


def _tree_ensemble(b: _Builder) -> None:
    """ai.onnx.ml 5's TreeEnsemble (newer skl2onnx and onnxmltools write it), as the
    TreeEnsembleRegressor that onnxruntime turns it into (TreeEnsembleAttributesV5::convert_to_v3),
    then read and computed as that one is. Each tree is walked depth first from its root, the true
    side first: a branch is numbered before its true subtree, which is before its false one, and
    a leaf becomes a node with its one weight (a leaf two branches reach, twice). Why the same
    conversion: the trees' order and each leaf's place in it are the order the sum runs in.

    A BRANCH_MEMBER node's set is its run of membership_values up to the next NaN. onnxruntime
    unrolls a set of fewer than 31 values in 0..30 into a chain of BRANCH_EQ nodes (one per value,
    each true to the same subtree), and turns a larger one into BRANCH_MEMBER_BIGSET, which holds
    a value whose truncation toward zero is a member. Here an unrolled set of integers is one
    node of MEMBER_MODES' first kind (the chain's equality, one walk level); a set with a
    fraction (0.5) is unrolled as onnxruntime unrolls it; a larger one is a node of the second
    kind, and must hold integers, as onnxruntime requires."""
    x = b.node.input[0]
    if b.elem(x) not in (_F, onnx.TensorProto.DOUBLE):
        raise b.fail(f"input type {elem_name(b.elem(x))} is not float or double")

    def tensor(name: str) -> np.ndarray:
        v = b.attrs.get(name)
        if v is None:
            return np.zeros(0)
        if not isinstance(v, onnx.TensorProto):
            raise b.fail(f"attribute {name!r} must be a tensor")
        return numpy_helper.to_array(v).reshape(-1)

    def ints(name: str) -> list[int]:
        v = b.attrs.get(name) or []
        if any(not isinstance(i, (int, np.integer)) for i in v):
            raise b.fail(f"attribute {name!r} must hold integers")
        return [int(i) for i in v]

    modes, splits = tensor("nodes_modes").astype(np.int64), tensor("nodes_splits").astype(np.float32)
    weights, targets = tensor("leaf_weights").astype(np.float32), ints("leaf_targetids")
    feature, t_id, f_id = ints("nodes_featureids"), ints("nodes_truenodeids"), ints("nodes_falsenodeids")
    t_leaf, f_leaf, roots = ints("nodes_trueleafs"), ints("nodes_falseleafs"), ints("tree_roots")
    missing = ints("nodes_missing_value_tracks_true")
    n = len(feature)
    for name, v in (("nodes_modes", modes), ("nodes_splits", splits), ("nodes_truenodeids", t_id),
                    ("nodes_falsenodeids", f_id), ("nodes_trueleafs", t_leaf), ("nodes_falseleafs", f_leaf)):
        if len(v) != n:
            raise b.fail(f"{name} holds {len(v)} values, not one per node ({n}, as nodes_featureids)")
    if len(weights) != len(targets):
        raise b.fail(f"leaf_weights holds {len(weights)} values and leaf_targetids {len(targets)}, not one each per leaf")
    bad = [int(m) for m in modes if not 0 <= m < len(V5_MODES)]
    if bad:
        raise b.fail(f"node mode {bad[0]} is not one of 0 to 6")
    agg, post = int(b.attr("aggregate_function", 1)), int(b.attr("post_transform", 0))
    if agg not in V5_AGGREGATES or post not in V5_TRANSFORMS:
        raise b.fail(f"aggregate_function {agg} or post_transform {post} is not a known value")
    if not roots:
        raise b.fail("tree_roots is empty: the ensemble has no trees")
    members_v = tensor("membership_values")
    members = _membership_sets(b, modes, members_v)
    sets: list[np.ndarray] = []

    v3: dict[str, list] = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_values",
                                           "nodes_modes", "nodes_truenodeids", "nodes_falsenodeids",
                                           "nodes_missing_value_tracks_true", "target_ids", "target_nodeids",
                                           "target_treeids", "target_weights")}
    limit = 4 * (n + len(weights) + len(members_v)) + 16  # (a walk longer than every node twice over has met a cycle)
    for tree, root in enumerate(roots):
        if not 0 <= root < n:
            raise b.fail(f"tree root {root} is not a node (there are {n})")
        is_leaf = t_id[root] == f_id[root] and bool(t_leaf[root]) and bool(f_leaf[root])
        stack, last = [(t_id[root] if is_leaf else root, 0, is_leaf, -1)], 0
        while stack:
            if len(v3["nodes_nodeids"]) > limit:
                raise b.fail("a tree's branches form a cycle (onnxruntime would walk it forever)")
            k, nid, leaf, placeholder = stack.pop()
            nid = last + 1 if nid == -1 else nid
            last = nid
            if placeholder != -1:
                v3["nodes_falsenodeids"][placeholder] = nid
            if not 0 <= k < (len(weights) if leaf else n):
                raise b.fail(f"a branch leads to {'leaf' if leaf else 'node'} {k}, which is not there")
            if leaf:
                v3["nodes_nodeids"].append(nid)
                v3["nodes_treeids"].append(tree)
                v3["nodes_modes"].append("LEAF")
                v3["nodes_featureids"].append(0)
                v3["nodes_values"].append(0.0)
                v3["nodes_truenodeids"].append(0)
                v3["nodes_falsenodeids"].append(0)
                v3["nodes_missing_value_tracks_true"].append(0)
                v3["target_ids"].append(targets[k])
                v3["target_nodeids"].append(nid)
                v3["target_treeids"].append(tree)
                v3["target_weights"].append(float(weights[k]))
                continue
            mode, split, chain = V5_MODES[modes[k]], float(splits[k]), len(v3["nodes_truenodeids"])
            if modes[k] == 6:
                mode, split, nid = _member_node(b, members[k], sets, v3, tree, nid, feature[k],
                                                missing[k] if k < len(missing) else 0)
            v3["nodes_nodeids"].append(nid)
            v3["nodes_treeids"].append(tree)
            v3["nodes_modes"].append(mode)
            v3["nodes_featureids"].append(feature[k])
            v3["nodes_values"].append(split)
            v3["nodes_truenodeids"][chain:] = [nid + 1] * (len(v3["nodes_truenodeids"]) - chain)  # (a chain's too)
            v3["nodes_truenodeids"].append(nid + 1)
            v3["nodes_falsenodeids"].append(-1)
            v3["nodes_missing_value_tracks_true"].append(missing[k] if k < len(missing) else 0)
            stack.append((f_id[k], -1, bool(f_leaf[k]), len(v3["nodes_falsenodeids"]) - 1))
            stack.append((t_id[k], nid + 1, bool(t_leaf[k]), -1))
    b.attrs = {**v3, "n_targets": int(b.attr("n_targets", 0)), "aggregate_function": V5_AGGREGATES[agg],
               "post_transform": V5_TRANSFORMS[post]}
    # (Y has X's type: a float64 X, compared in float32 where a precision was asked for, as
    # _input says, gives a float64 Y)
    _tree_regressor(b, out_elem=b.elem(x), sets=tuple(sets))


def _membership_sets(b: _Builder, modes: np.ndarray, values: np.ndarray) -> dict[int, np.ndarray]:
    """{node: its set} for the BRANCH_MEMBER nodes, in order: membership_values holds one run per
    such node, each ended by a NaN (the last one may end with the list)."""
    at = np.flatnonzero(modes == 6)
    runs = np.split(values, np.flatnonzero(np.isnan(values)))
    runs = [r[1:] if k else r for k, r in enumerate(runs)]  # (each after the first starts at its NaN)
    if runs and not runs[-1].size and np.isnan(values[-1:]).all():
        runs.pop()
    if len(runs) < at.size:
        raise b.fail(f"membership_values holds {len(runs)} set(s), not one per BRANCH_MEMBER node ({at.size})")
    empty = [int(k) for k, r in zip(at, runs) if not r.size]
    if empty:
        raise b.fail(f"BRANCH_MEMBER node {empty[0]} has an empty set")
    return {int(k): r for k, r in zip(at, runs)}


def _member_node(b: _Builder, members: np.ndarray, sets: list, v3: dict, tree: int, nid: int, feature: int,
                 missing: int) -> tuple[str, float, int]:
    """A BRANCH_MEMBER node as _tree_ensemble says: the chain's BRANCH_EQ nodes but the last go
    into `v3` here (their true ids are set by the caller), and a new set into `sets`. Returns the
    last node's (mode, value, id)."""
    if members.size < 31 and members.max() <= 30 and members.min() >= 0:
        if np.all(members == np.floor(members)):
            sets.append(members.astype(np.int64))
            return "BRANCH_MEMBER", float(len(sets) - 1), nid
        for m in members[:-1]:  # (onnxruntime's unrolled chain: each false to the next)
            for key, v in (("nodes_nodeids", nid), ("nodes_treeids", tree), ("nodes_featureids", feature),
                           ("nodes_modes", "BRANCH_EQ"), ("nodes_values", float(m)), ("nodes_falsenodeids", nid + 1),
                           ("nodes_truenodeids", -1), ("nodes_missing_value_tracks_true", missing)):
                v3[key].append(v)
            nid += 1
        return "BRANCH_EQ", float(members[-1]), nid
    if not (np.all(members == np.floor(members)) and members.min() >= -2 ** 31 and members.max() < 2 ** 31):
        raise b.fail("a BRANCH_MEMBER set of 31 or more values, or reaching outside 0..30, must hold integers "
                     "(onnxruntime compares them as int32)")
    sets.append(members.astype(np.int64))
    return "BRANCH_MEMBER_BIGSET", float(len(sets) - 1), nid


TREE_REWRITES = {"TreeEnsembleRegressor": _tree_regressor, "TreeEnsembleClassifier": _tree_classifier,
                 "TreeEnsemble": _tree_ensemble}
#: The ensemble ops ml_trees writes (composite.py raises old models to the opset they need).
TREE_OPS = frozenset(TREE_REWRITES)
