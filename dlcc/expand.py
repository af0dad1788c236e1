"""Expand standard ONNX ops that onnx defines by a function body (MeanVarianceNormalization,
GroupNormalization, RMSNormalization, Attention, Swish, ...) into that body, when dlcc has
no lowering of its own for them. ReduceLogSumExp, whose body computes in float64, gets a body of
dlcc's own instead (OWN_BODIES).

Why: the onnx op schemas already say what such an op means in terms of simpler ops, and dlcc
lowers those. Expanding before lowering gives the whole family at once, and AStitch then
stitches the expanded elementwise and reduction nodes back together, so nothing is lost against
a lowering per op. An op with its own lowering keeps it, except in a form the lowering does not
cover (`_beyond_lowering`: LayerNormalization's Mean and InvStdDev outputs).

The expansion follows onnx's own FunctionExpandHelper, with one difference: an attribute
reference that the calling node leaves unset takes the schema's default value (onnx 1.23 leaves
the attribute out, and MeanVarianceNormalization's body then has a Constant with no value).
Bodies that depend on the inputs' types (context-dependent functions) are built from the types
that shape inference found.
"""
from __future__ import annotations

import bisect
import logging

import numpy as np
import onnx
from onnx import defs

log = logging.getLogger(__name__)

#: Expansions nest (a body may use another function op); this bounds the rounds.
MAX_ROUNDS = 4


def expand_functions(model: onnx.ModelProto, supported: set[str], opset: int) -> list[str]:
    """One round: expand, in place, every node of `model`'s main graph whose op is standard, not
    in `supported` (or in a form its lowering does not take), and defined by a function body at
    `opset`. Returns the op types expanded
    (empty if none: the model is untouched). A body may use another function op whose body
    depends on types the body computes: the caller infers shapes and calls again (MAX_ROUNDS).
    Ops that cannot be expanded are left for the caller to report as unsupported."""
    types = _known_types(model.graph)
    taken = _all_names(model.graph)
    nodes, done = [], []
    for k, node in enumerate(model.graph.node):
        body = None
        if node.domain in ("", "ai.onnx") and node.op_type in OWN_BODIES and node.op_type not in supported:
            nodes += OWN_BODIES[node.op_type](node, opset, _prefix(node, k, taken))
            done.append(node.op_type)
            continue
        if node.domain in ("", "ai.onnx") and (node.op_type not in supported or _beyond_lowering(node)):
            body = _body(node, opset, types, supported)
        if body is None:
            nodes.append(node)
            continue
        nodes += _inline(node, body, _schema(node.op_type, opset), _prefix(node, k, taken))
        done.append(node.op_type)
    if done:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        log.debug("expanded function ops into their bodies: %s", ", ".join(sorted(set(done))))
    return done


def _log_sum_exp(node: onnx.NodeProto, opset: int, prefix: str) -> list[onnx.NodeProto]:
    """ReduceLogSumExp as max + log(sum(exp(x - max))): onnx's own body computes in float64 (a
    dtype dlcc's kernels do not have) so that exp does not overflow; subtracting the row's
    maximum first avoids the overflow in float32 (torch.logsumexp's formulation). A row whose
    maximum is infinite subtracts 0 instead: all -inf gives -inf, a +inf gives +inf, as the
    exact answer does. AStitch stitches the six nodes back into reductions with their maps."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    keepdims = int(attrs.get("keepdims", 1))
    extra = {"noop_with_empty_axes": attrs["noop_with_empty_axes"]} if "noop_with_empty_axes" in attrs else {}
    axes_in = node.input[1] if len(node.input) > 1 and node.input[1] else None  # opset 18's input
    axes_attr = attrs.get("axes")
    out, nodes = node.output[0], []
    name = node.name or node.op_type

    def reduce(op: str, x: str, y: str, keep: int) -> None:
        as_input = opset >= (18 if op == "ReduceMax" else 13)
        ins, kw = [x], dict(keepdims=keep, **(extra if opset >= 18 else {}))
        if as_input and axes_in:
            ins.append(axes_in)
        elif as_input and axes_attr is not None:
            c = f"{prefix}axes"
            if not any(n.output[0] == c for n in nodes):
                nodes.append(onnx.helper.make_node("Constant", [], [c], name=f"{name}/axes",
                                                   value=onnx.numpy_helper.from_array(np.array(axes_attr, np.int64))))
            ins.append(c)
        elif axes_attr is not None:
            kw["axes"] = list(axes_attr)
        nodes.append(onnx.helper.make_node(op, ins, [y], name=f"{name}/{y[len(prefix):]}", **kw))

    def finite_or_zero(m: str, y: str) -> None:
        nodes.extend([onnx.helper.make_node("IsInf", [m], [f"{y}_inf"], name=f"{name}/{y[len(prefix):]}_inf"),
                      onnx.helper.make_node("Constant", [], [f"{y}_zero"], name=f"{name}/{y[len(prefix):]}_zero",
                                            value=onnx.helper.make_tensor(f"{y}_zero", onnx.TensorProto.FLOAT, [], [0.0])),
                      onnx.helper.make_node("CastLike", [f"{y}_zero", m], [f"{y}_z"], name=f"{name}/{y[len(prefix):]}_z")
                      if opset >= 15 else onnx.helper.make_node("Identity", [f"{y}_zero"], [f"{y}_z"]),
                      onnx.helper.make_node("Where", [f"{y}_inf", f"{y}_z", m], [y], name=f"{name}/{y[len(prefix):]}")])

    x = node.input[0]
    reduce("ReduceMax", x, f"{prefix}max", 1)
    finite_or_zero(f"{prefix}max", f"{prefix}shift")
    nodes += [onnx.helper.make_node("Sub", [x, f"{prefix}shift"], [f"{prefix}d"], name=f"{name}/sub"),
              onnx.helper.make_node("Exp", [f"{prefix}d"], [f"{prefix}e"], name=f"{name}/exp")]
    reduce("ReduceSum", f"{prefix}e", f"{prefix}sum", keepdims)
    nodes.append(onnx.helper.make_node("Log", [f"{prefix}sum"], [f"{prefix}log"], name=f"{name}/log"))
    shift = f"{prefix}shift"
    if not keepdims:  # (the guarded maximum, its reduced axes dropped: one element each, not x again)
        reduce("ReduceMax", shift, f"{prefix}shift_k", 0)
        shift = f"{prefix}shift_k"
    nodes.append(onnx.helper.make_node("Add", [f"{prefix}log", shift], [out], name=f"{name}/add"))
    return nodes


def _beyond_lowering(node: onnx.NodeProto) -> bool:
    """A node of an op dlcc lowers, in a form its lowering does not cover, which its body does:
    LayerNormalization's Mean and InvStdDev outputs (the training form; the lowering writes Y
    only). Expanded, the body's ReduceMean, Sub, Sqrt and Reciprocal stitch into one kernel."""
    return node.op_type == "LayerNormalization" and any(node.output[1:])


#: Ops with no lowering that the import evaluates itself once shapes are static (a body's
#: Shape/Size arithmetic, RMSNormalization's Range over the normalised axes).
FOLDED = {"Constant", "Shape", "Size", "ConstantOfShape", "Range"}

#: Ops whose onnx body dlcc cannot run, expanded into a body of dlcc's own instead.
OWN_BODIES = {"ReduceLogSumExp": _log_sum_exp}


def _schema(op_type: str, opset: int):
    try:
        return defs.get_schema(op_type, opset, "")
    except Exception:
        return None


def _body(node: onnx.NodeProto, opset: int, types: dict, supported: set[str]) -> onnx.FunctionProto | None:
    """The op's function body at `opset` (the newest version not above it), or None when there is
    none or when it holds an op dlcc could not compile either."""
    s = _schema(node.op_type, opset)
    if s is None:
        return None
    try:
        fp = _plain_body(s, opset)
        if fp is None:
            dep = [v for v in s.context_dependent_function_opset_versions if v <= opset]
            if not dep or any(i and i not in types for i in node.input):
                return None
            arg_types = [types[i].SerializeToString() if i else onnx.TypeProto().SerializeToString()
                         for i in node.input]
            fp = _parsed(s.get_context_dependent_function_with_opset_version(max(dep), node.SerializeToString(),
                                                                             arg_types))
        if fp is None:
            return None
    except Exception as e:  # onnx could not build the body: the op stays, reported as unsupported
        log.debug("no function body for %s: %s", node.op_type, e)
        return None
    if any(n.domain not in ("", "ai.onnx") or _has_subgraph(n) for n in fp.node):
        return None
    if not all(compilable(n.op_type, opset, supported) for n in fp.node):
        # (Bernoulli's body draws with RandomUniformLike: expanding it would make the error name
        # an op the user never wrote. Left whole, the op is reported, or falls back, by its name.)
        return None
    return fp


def compilable(op_type: str, opset: int, supported: set[str], depth: int = 0) -> bool:
    """Whether a body node of `op_type` can end up compiled: dlcc lowers it, the import folds it
    (FOLDED: shapes are static by then), or it is itself a function op whose (plain) body is
    compilable. A context-dependent body needs the input types to be built, so it is given the
    benefit of the doubt."""
    if op_type in supported or op_type in OWN_BODIES or op_type in FOLDED:
        return True
    s = _schema(op_type, opset)
    if s is None or depth >= MAX_ROUNDS:
        return False
    if not any(v <= opset for v in s.function_opset_versions):
        return any(v <= opset for v in s.context_dependent_function_opset_versions)
    try:
        fp = _plain_body(s, opset)
    except Exception:  # onnx could not build the body
        return False
    return fp is not None and all(n.domain in ("", "ai.onnx") and compilable(n.op_type, opset, supported, depth + 1)
                                  for n in fp.node)


def _plain_body(s, opset: int) -> onnx.FunctionProto | None:
    """Schema `s`'s function body that needs no input types, at the newest version not above
    `opset` (None where it has none)."""
    plain = [v for v in s.function_opset_versions if v <= opset]
    return _parsed(s.get_function_with_opset_version(max(plain))) if plain else None


def _parsed(raw) -> onnx.FunctionProto | None:
    """A FunctionProto from what onnx's schema API returns (bytes or a proto; empty: none)."""
    if not raw:
        return None
    fp = onnx.FunctionProto()
    fp.ParseFromString(raw if isinstance(raw, bytes) else raw.SerializeToString())
    return fp


def _inline(node: onnx.NodeProto, fp: onnx.FunctionProto, schema, prefix: str) -> list[onnx.NodeProto]:
    """The body's nodes, wired to `node`'s inputs and outputs, internal names under `prefix`."""
    rename = {formal: (node.input[i] if i < len(node.input) else "") for i, formal in enumerate(fp.input)}
    rename.update({formal: (node.output[i] if i < len(node.output) and node.output[i] else f"{prefix}{formal}")
                   for i, formal in enumerate(fp.output)})
    given = {a.name: a for a in fp.attribute_proto}  # the function's own defaults
    if schema is not None:
        for name, spec in schema.attributes.items():
            if spec.default_value is not None and spec.default_value.type != onnx.AttributeProto.UNDEFINED:
                given.setdefault(name, spec.default_value)
    given.update({a.name: a for a in node.attribute})
    out = []
    for j, bn in enumerate(fp.node):
        n = onnx.NodeProto()
        n.op_type, n.domain = bn.op_type, bn.domain
        n.name = f"{node.name or node.op_type}/{bn.name or bn.op_type}_{j}"
        n.input.extend(rename.get(i, f"{prefix}{i}") if i else "" for i in bn.input)
        n.output.extend(rename.get(o, f"{prefix}{o}") if o else "" for o in bn.output)
        for a in bn.attribute:
            if a.ref_attr_name:
                if a.ref_attr_name in given:
                    c = onnx.AttributeProto()
                    c.CopyFrom(given[a.ref_attr_name])
                    c.name = a.name
                    n.attribute.append(c)
            else:
                n.attribute.append(a)
        out.append(n)
    return out


def _known_types(g: onnx.GraphProto) -> dict[str, onnx.TypeProto]:
    types = {vi.name: vi.type for vi in list(g.input) + list(g.value_info) + list(g.output) if vi.type.HasField("tensor_type")}
    for t in g.initializer:
        if t.name not in types:
            types[t.name] = onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims))
    return types


class TakenNames(set):
    """A graph's tensor names and the prefixes handed out so far, with a sorted copy, so that
    whether any name starts with a prefix is a binary search. Why: `_prefix` asks that once a node
    rewritten, and a scan of every name each time was quadratic (an unrolled graph of 20,000
    nodes spent 13 s there). Names are only ever added."""

    def __init__(self, names=()):
        super().__init__(names)
        self._sorted = sorted(self)

    def add(self, name: str) -> None:
        if name not in self:
            super().add(name)
            bisect.insort(self._sorted, name)

    def update(self, *groups) -> None:
        for names in groups:
            for name in names:
                self.add(name)

    def any_starts_with(self, prefix: str) -> bool:
        i = bisect.bisect_left(self._sorted, prefix)
        return i < len(self._sorted) and self._sorted[i].startswith(prefix)


def _all_names(g: onnx.GraphProto) -> TakenNames:
    names = {vi.name for vi in list(g.input) + list(g.value_info) + list(g.output)} | {t.name for t in g.initializer}
    for n in g.node:
        names.update(n.input)
        names.update(n.output)
    return TakenNames(names)


def _prefix(node: onnx.NodeProto, k: int, taken: TakenNames) -> str:
    """A prefix no existing tensor name starts with (so internal names cannot collide)."""
    base = f"_{node.op_type}{k}_"
    p, i = base, 0
    while taken.any_starts_with(p):
        i += 1
        p = f"{base}{i}_"
    return p


def _has_subgraph(n: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute)
