"""`If` without control flow on the device: each If of the main graph becomes plain nodes before
lowering, so dlcc's kernels, AStitch and Rammer never see a branch.

- **A condition known at compile time**: an initializer, a Constant, a scalar input whose value
  `--shape sr=16000` bound (frontend.bind_values), or a shape test (torch's `if x.dim() == 2`)
  computed from static shapes with onnx.reference (`_shape_condition`). The taken branch's
  nodes replace the If, and the other branch is dropped. Most Ifs in real models are of this
  kind. The import inlines them before onnxruntime's folding (inline_ifs says why).
- **A condition computed from the inputs** (openWakeWord's detectors run a verifier network only
  when the first score passes a threshold): both branches are inlined and each output is
  `Where(cond, then_output, else_output)` (if-conversion, as GPU compilers predicate short
  branches). The answer is the one the If gives, because ONNX ops have no side effects and Where
  does not look at the value it does not select (NaN or Inf in the branch not taken stays
  there). The cost is the work of the branch not taken, and the pass log says so. One clear
  error, naming the inputs that decide the If, instead: two branches whose outputs differ in
  shape or type (they cannot be selected elementwise); a branch that does not type-check at the
  bound shapes (Silero VAD's 8 kHz network given a 16 kHz chunk: the frontend reports it,
  `branches_do_not_type_check`); a branch that indexes with computed indices (Gather,
  GatherElements, GatherND; constant indices are checked when the plan is compiled), because
  dlcc checks every index it reads and would report an out-of-range index that the branch not
  taken computed, where onnxruntime, which does not run that branch, reports nothing. Binding
  the deciding input's value avoids all three.

Branch-local names (node outputs and the branch's own initializers) are renamed under a prefix
no tensor of the model uses, since both branches may define the same name. Names the branch reads
from the enclosing graph stay as they are. An If inside a branch is inlined in the next round.

Loops (Loop, Scan) are not handled here: loops.py unrolls them, and an If in a body they unroll
is inlined by the next round here.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from .errors import UnsupportedControlFlowError, first_line
from .frontend import opset_of
from .expand import TakenNames, _all_names, _has_subgraph, _prefix

#: Nested Ifs are inlined one level per round; this bounds the rounds.
MAX_DEPTH = 8
#: Ops whose indices dlcc checks at run time (kernels/index_check.py): a branch that is computed
#: but not taken must not contain one, or its indices could raise an error onnxruntime never sees.
CHECKED_INDEX_OPS = ("Gather", "GatherElements", "GatherND")


def inline_ifs(model: onnx.ModelProto, path, infer, computed: bool = True) -> tuple[onnx.ModelProto, list[str], list]:
    """Replace the Ifs of `model`'s main graph (nested ones too) by plain nodes, one nesting level
    per round, until a round changes nothing. `infer` (a function of a model, returning it with
    shapes inferred, leniently) runs after each round: an If nested in an inlined branch often
    tests a shape (Silero VAD's `if x.dim() == 2`), which is known only once the branch sits in
    the main graph. `computed`: also if-convert the Ifs whose condition the inputs decide (else
    they stay). Returns (the model, notes for the pass log, selects): each select is (If name,
    output, then value, else value, the inputs that decide it), whose shapes the caller checks
    once shapes are known (`check_selects`).

    Why not onnxruntime's folding between rounds: with an If whose condition has become a
    constant, onnxruntime 1.23's basic optimisation crashes the process (a segmentation fault on
    Silero VAD with `sr` bound); so the caller inlines the known conditions (computed=False)
    before it lets onnxruntime fold the graph at all."""
    notes: list[str] = []
    selects: list[tuple[str, str, str, str, list[str]]] = []
    if not has_if(model):
        return model, notes, selects
    model = infer(model)
    for _ in range(MAX_DEPTH):
        if not _one_round(model, path, notes, selects, computed):
            return model, notes, selects
        model = infer(model)
    raise UnsupportedControlFlowError(f"{path}: If nodes nest more than {MAX_DEPTH} deep; dlcc inlines at most that many levels")


def has_if(model: onnx.ModelProto) -> bool:
    return any(n.op_type == "If" and n.domain in ("", "ai.onnx") for n in model.graph.node)


def _one_round(model, path, notes: list[str], selects: list, computed: bool) -> bool:
    """One level of inlining; whether anything changed."""
    g = model.graph
    opset = opset_of(model)
    consts = _constant_values(g)
    taken = _all_names_deep(g)
    out: list[onnx.NodeProto] = []
    changed, view = False, None
    for k, node in enumerate(g.node):
        if node.op_type != "If" or node.domain not in ("", "ai.onnx"):
            out.append(node)
            continue
        branches = {a.name: a.g for a in node.attribute if a.name in ("then_branch", "else_branch")}
        label = node.name or node.output[0]
        if len(branches) != 2:
            raise UnsupportedControlFlowError(f"{path}: If {label!r} lacks a then_branch or an else_branch")
        for b in branches.values():
            if len(b.output) != len(node.output):
                raise UnsupportedControlFlowError(f"{path}: If {label!r}: a branch has {len(b.output)} output(s) where the "
                                          f"node has {len(node.output)}")
            _tensor_outputs(b, label, path)
        prefix = _prefix(node, k, taken)
        cond = node.input[0]
        value = consts.get(cond)
        if value is None:
            if view is None:  # (once a round, and only where a condition is not a plain constant)
                view = ({o: n for n in g.node for o in n.output if o}, _static_shapes(g))
            value = _shape_condition(cond, consts, opset, *view)
        if value is not None:
            value = np.asarray(value)
            if value.size != 1:
                raise UnsupportedControlFlowError(f"{path}: If {label!r}: its condition holds {value.size} values, not one")
            which = "then_branch" if bool(value.reshape(())) else "else_branch"
            body, values = _inline_branch(branches[which], f"{prefix}{which[:4]}_", g)
            out += body
            out += [onnx.helper.make_node("Identity", [v], [o], name=f"{label}/{which}/out{i}")
                    for i, (v, o) in enumerate(zip(values, node.output)) if o]
            notes.append(f"import: If {label!r}: condition known at compile time, {which} inlined")
            changed = True
            continue
        if not computed:
            out.append(node)
            continue
        changed = True
        deciders = _deciding_inputs(g, cond)
        known = {t.name for t in g.initializer} | set(consts)
        for name, b in branches.items():
            local = _local_constants(b)
            bad = sorted({n.op_type for n in nodes_deep(b) if n.op_type in CHECKED_INDEX_OPS
                          and n.input[1] not in known | local})
            if bad:
                raise UnsupportedControlFlowError(
                    f"{path}: If {label!r}: its condition is computed from {_from(deciders)}, so dlcc would run "
                    f"both branches and select; its {name} indexes with computed indices ({', '.join(bad)}), "
                    f"whose index checks could then fail in the branch not taken.{_bind_hint(deciders)}")
        for i, (a, b) in enumerate(zip(branches["then_branch"].output, branches["else_branch"].output)):
            ta, tb = _static_type(branches["then_branch"], a.name), _static_type(branches["else_branch"], b.name)
            if ta and tb and ta != tb:
                _differ(path, label, node.output[i], ta, tb, deciders)
        t_nodes, t_vals = _inline_branch(branches["then_branch"], f"{prefix}then_", g)
        e_nodes, e_vals = _inline_branch(branches["else_branch"], f"{prefix}else_", g)
        scalar = f"{prefix}cond"
        shape0 = f"{prefix}scalar_shape"
        g.initializer.append(numpy_helper.from_array(np.zeros((0,), np.int64), shape0))
        out += t_nodes + e_nodes
        out.append(onnx.helper.make_node("Reshape", [cond, shape0], [scalar], name=f"{label}/cond"))
        for i, (tv, ev, o) in enumerate(zip(t_vals, e_vals, node.output)):
            if o:
                out.append(onnx.helper.make_node("Where", [scalar, tv, ev], [o], name=f"{label}/select{i}"))
                selects.append((label, o, tv, ev, deciders))
        notes.append(f"import: If {label!r}: condition computed from {_from(deciders)}; "
                     f"both branches computed ({len(t_nodes)} + {len(e_nodes)} nodes) and each output selected "
                     "by Where")
    del g.node[:]
    g.node.extend(out)
    return changed


def branches_do_not_type_check(path, selects: list, error: Exception) -> UnsupportedControlFlowError:
    """The error for an if-converted model that onnx shape inference rejects: one of the branches
    that now always runs does not type-check at the bound input shapes (Silero VAD's 8 kHz network
    given a 16 kHz chunk), where onnxruntime would never have run it. `selects`: inline_ifs's."""
    converted = list(dict.fromkeys((label, tuple(deciders)) for label, _, _, _, deciders in selects))
    shown = "; ".join(f"If {label!r}: condition computed from {_from(d)}" for label, d in converted[:2])
    shown += f"; and {len(converted) - 2} more" if len(converted) > 2 else ""
    return UnsupportedControlFlowError(
        f"{path}: dlcc runs both branches of an If whose condition the inputs decide ({shown}), and one "
        f"of them does not type-check at these input shapes ({first_line(error, 300)})."
        f"{_bind_hint(list(converted[0][1]) if converted else None)}")


def _deciding_inputs(g: onnx.GraphProto, cond: str) -> list[str]:
    """The graph inputs that `cond` is computed from."""
    producer = {o: n for n in g.node for o in n.output if o}
    inputs = {i.name for i in g.input}
    found, todo, seen = [], [cond], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in inputs:
            found.append(name)
        elif name in producer:
            todo += [i for i in producer[name].input if i]
    return sorted(found)


def check_selects(graph, selects, path) -> None:
    """After shapes are known: an if-converted output's two branch values must agree in shape and
    dtype, or Where would broadcast them into a shape the If never produces."""
    for label, out, tv, ev, deciders in selects:
        t, e = graph.tensors.get(tv), graph.tensors.get(ev)
        if t is None or e is None:
            continue
        if t.shape != e.shape or t.dtype != e.dtype:
            _differ(path, label, out, (t.dtype, list(t.shape or [])), (e.dtype, list(e.shape or [])), deciders)


def _differ(path, label, out, then_type, else_type, deciders=None):
    raise UnsupportedControlFlowError(
        f"{path}: If {label!r}: its condition is computed from {_from(deciders)}, so dlcc runs both branches and "
        f"selects, which needs outputs alike; output {out!r} is {then_type[0]}{then_type[1]} from then_branch and "
        f"{else_type[0]}{else_type[1]} from else_branch.{_bind_hint(deciders)}")


def _from(deciders) -> str:
    return f"input(s) {', '.join(deciders)}" if deciders else "the inputs"


def _bind_hint(deciders) -> str:
    """How to avoid the if-conversion: bind the deciding scalar inputs' values."""
    names = deciders or ["NAME"]
    return (" Binding the value of a scalar int input that decides it (" + ", ".join(f"--shape {n}=V" for n in names)
            + ") compiles the branch that value takes.")


def _static_type(b: onnx.GraphProto, name: str):
    """(dtype name, dims) of value `name` as the branch declares or shape inference found it, when
    every dim is a number; else None."""
    for vi in list(b.output) + list(b.value_info):
        if vi.name == name and vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            dims = vi.type.tensor_type.shape.dim
            if all(d.HasField("dim_value") for d in dims):
                return (onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type).name,
                        [d.dim_value for d in dims])
    return None


def _inline_branch(b: onnx.GraphProto, prefix: str, g: onnx.GraphProto) -> tuple[list[onnx.NodeProto], list[str]]:
    """The branch's nodes with its own names under `prefix`, its initializers moved into `g`, and
    the (renamed) names of its outputs."""
    local = {o for n in b.node for o in n.output if o} | {t.name for t in b.initializer}
    rename = {name: f"{prefix}{name}" for name in local}
    for t in b.initializer:
        c = onnx.TensorProto()
        c.CopyFrom(t)
        c.name = rename[t.name]
        g.initializer.append(c)
    return copy_nodes(b, prefix, rename), [rename.get(o.name, o.name) for o in b.output]


def copy_nodes(b: onnx.GraphProto, prefix: str, rename: dict[str, str]) -> list[onnx.NodeProto]:
    """Copies of `b`'s nodes, named under `prefix`, with every name in `rename` renamed where
    they read or write it, in the graphs nested in them too (an If branch inlined, a loop body
    unrolled: loops.py)."""
    nodes = []
    for j, bn in enumerate(b.node):
        n = onnx.NodeProto()
        n.CopyFrom(bn)
        n.name = f"{prefix}{bn.name or bn.op_type + str(j)}"
        del n.input[:], n.output[:]
        n.input.extend(rename.get(i, i) for i in bn.input)
        n.output.extend(rename.get(o, o) for o in bn.output)
        for a in n.attribute:
            for sub in _graphs_of(a):
                rename_reads(sub, rename)
        nodes.append(n)
    return nodes


def outer_reads(g: onnx.GraphProto) -> set[str]:
    """Names a subgraph reads from the scopes around it (its own inputs, initializers and node
    outputs excluded), its nested subgraphs included."""
    defined = {i.name for i in g.input} | {i.name for i in g.initializer}
    reads: set[str] = set()
    for n in g.node:
        reads.update(x for x in n.input if x)
        for a in n.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                reads |= outer_reads(sub)
        defined.update(o for o in n.output if o)
    return reads - defined


def node_reads(node: onnx.NodeProto) -> list[str]:
    """Every tensor `node` reads: its inputs, and what its subgraphs read from outside them."""
    names = [x for x in node.input if x]
    for a in node.attribute:
        for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            names += sorted(outer_reads(sub) - set(names))
    return names


def rename_reads(g: onnx.GraphProto, rename: dict[str, str], outputs: bool = True) -> None:
    """Rename the reads of names in `rename`, in `g` and the graphs nested in it, and (`outputs`)
    `g`'s own outputs that are such names (a nested graph that returns an outer value)."""
    for n in g.node:
        for k, i in enumerate(n.input):
            if i in rename:
                n.input[k] = rename[i]
        for a in n.attribute:
            for sub in _graphs_of(a):
                rename_reads(sub, rename)
    for k, o in enumerate(g.output if outputs else []):
        if o.name in rename:
            g.output[k].name = rename[o.name]


def _tensor_outputs(b: onnx.GraphProto, label: str, path) -> None:
    for o in b.output:
        if o.type.HasField("sequence_type") or o.type.HasField("optional_type") or o.type.HasField("map_type"):
            raise UnsupportedControlFlowError(f"{path}: If {label!r}: branch output {o.name!r} is not a tensor (a sequence, "
                                      "optional or map); dlcc compiles tensors only")


#: How many nodes a condition's computation may take to be evaluated at compile time.
MAX_CONDITION_NODES = 200


def _shape_condition(cond: str, consts: dict, opset: int, producer: dict, shapes: dict) -> np.ndarray | None:
    """The value of `cond` when it is computed only from constants and from the shapes of
    tensors whose shapes are static here (`Shape`, `Size`): torch's exported shape tests
    (`if x.dim() == 2`, `if x.shape[-1] == 64`), evaluated with onnx.reference. onnxruntime's
    folding does this too, but cannot load a graph once an inlined branch holds a nested If whose
    untaken side does not type-check at the bound shapes (Silero VAD's unbatched-LSTM path).
    None where anything else feeds the condition. `producer`: each value's node; `shapes`: the
    static shapes (_static_shapes)."""
    leaves: dict[str, np.ndarray] = {}
    nodes: list[onnx.NodeProto] = []
    seen: set[str] = set()

    def resolve(name: str) -> bool:
        if name in seen or name in leaves:
            return True
        if name in consts:
            leaves[name] = np.asarray(consts[name])
            return True
        n = producer.get(name)
        if n is None or n.domain not in ("", "ai.onnx") or len(nodes) >= MAX_CONDITION_NODES or _has_subgraph(n) \
                or n.op_type.startswith("Random"):
            return False
        if n.op_type in ("Shape", "Size"):
            if n.input[0] not in shapes:
                return False
            dims = np.array(shapes[n.input[0]], np.int64)
            if n.op_type == "Size":
                leaves[name] = np.array(int(np.prod(dims)), np.int64)
            else:
                at = {a.name: a.i for a in n.attribute}
                leaves[name] = dims[at.get("start", 0):at.get("end", len(dims))]
            return True
        if not all(resolve(i) for i in n.input if i):
            return False
        seen.update(o for o in n.output if o)
        nodes.append(n)
        return True

    if not resolve(cond):
        return None
    if cond in leaves:
        return leaves[cond]
    from .reference_ops import evaluator

    m = onnx.helper.make_model(
        onnx.helper.make_graph(nodes, "condition", [], [onnx.helper.make_empty_tensor_value_info(cond)],
                               [numpy_helper.from_array(v, k) for k, v in leaves.items()]),
        opset_imports=[onnx.helper.make_opsetid("", opset)])
    try:
        return np.asarray(evaluator(m).run(None, {})[0])
    except Exception:  # an op onnx.reference cannot evaluate here: the condition stays computed
        return None


def _static_shapes(g: onnx.GraphProto) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        t = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if t is not None and t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            shapes[vi.name] = tuple(d.dim_value for d in t.shape.dim)
    shapes.update({t.name: tuple(t.dims) for t in g.initializer})
    return shapes


def _constant_values(g: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Small constants of the main graph: initializers of up to 64 values in at most one dim, and
    Constant nodes with a small `value`. (onnxruntime's folding turns Constant nodes into
    initializers, so a SplitToSequence's list of sizes is one by the time sequences.py reads it.)"""
    vals = {t.name: numpy_helper.to_array(t) for t in g.initializer if len(t.dims) <= 1 and np.prod(t.dims) <= 64}
    for n in g.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            for a in n.attribute:
                if a.name == "value" and a.t.ByteSize() < 64:
                    vals[n.output[0]] = numpy_helper.to_array(a.t)
    return vals


def _local_constants(b: onnx.GraphProto) -> set[str]:
    """Names a branch defines as constants (initializers and Constant nodes, in it and in the
    branches nested in it): indices read from these are checked when the plan is compiled, not
    at run time."""
    names = {t.name for t in b.initializer}
    for n in nodes_deep(b):
        if n.op_type == "Constant":
            names.add(n.output[0])
        for a in n.attribute:
            for sub in _graphs_of(a):
                names.update(t.name for t in sub.initializer)
    return names


def _graphs_of(a: onnx.AttributeProto) -> list[onnx.GraphProto]:
    """The graphs an attribute holds (an If's branch, a Loop's body), none for other attributes."""
    return [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)


def nodes_deep(g: onnx.GraphProto):
    for n in g.node:
        yield n
        for a in n.attribute:
            for sub in _graphs_of(a):
                yield from nodes_deep(sub)


def _all_names_deep(g: onnx.GraphProto) -> TakenNames:
    names = set(_all_names(g))
    for n in nodes_deep(g):
        names.update(n.input)
        names.update(n.output)
    return TakenNames(names)
