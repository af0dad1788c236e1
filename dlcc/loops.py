"""`Scan` and `Loop` without control flow on the device: each is unrolled at import into plain
nodes, one copy of its body per iteration, when the number of iterations is known at compile
time. dlcc's kernels, AStitch and Rammer then see a straight-line graph, as they do for the
loops torch's tracer unrolls itself.

- **Scan** (opset 9 on): the iterations are the scan inputs' length along their scan axis,
  which `--shape` makes static. Iteration t reads slice t of each scan input (a Gather with a
  constant index; the last slice first where `scan_input_directions` says so), the body's state
  outputs feed the next iteration, and each scan output is the Concat of its per-iteration
  values along `scan_output_axes` (reversed where `scan_output_directions` says so). onnx-asr's
  WeSpeaker front end frames its waveform this way: a 2-node body run once per hop.
- **Loop** (a `for` loop): a trip count `M` that is a constant (after onnxruntime's folding,
  so one computed from static shapes counts), an initial condition that is absent or constant
  true, and a body whose condition output stays true: the body's own condition input passed
  through, or a constant true. The iteration number is a constant per copy. Loop-carried values
  may change shape from one iteration to the next, since each copy is inferred on its own.
  Scan outputs stack along a new first axis.
- **Loop** (a `while` loop that counts): a body whose condition follows from the iteration
  number, constants and loop-carried counters that start from constants, as tf2onnx writes
  every Keras RNN (`t < steps`, `t += 1`). That part of the body is run at compile time to count
  the iterations (`_counted_iterations`), and the loop is unrolled like a `for` loop; M, where
  given, still bounds it.

What stays an error, and says why: a Loop whose condition the body computes from data (a
`while` loop: its trip count is known only at run time), a `for` Loop without a trip count, a loop
of zero iterations with scan outputs (a zero-length tensor), opset 8's Scan (a batch axis and
`sequence_lens`), and a loop whose unrolled copies would exceed MAX_UNROLLED_NODES nodes.

A loop counted from what an earlier loop gives (the second layer of a stacked RNN counts the
first one's output, whose shape onnx's inference leaves open) is left for after the earlier one is
unrolled and the import has folded the Shape arithmetic between them (`unroll_loops` returns it);
a chain of such loops is bounded by MAX_CHAINED.

The body's own initializers are moved into the graph once, not once per iteration; its other
local names are renamed per iteration under a prefix no tensor of the model uses, and names it
reads from the enclosing graph stay as they are. A loop nested in a body is unrolled in the
next round, once its copies sit in the main graph.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from .control_flow import _all_names_deep, _constant_values, _static_shapes, copy_nodes
from .errors import ModelError, ShapeError, UnsupportedControlFlowError
from .expand import _prefix
from .frontend import opset_of

#: The most nodes the unrolled copies of one loop may add (iterations × body nodes).
MAX_UNROLLED_NODES = 20000
#: Loops nested in loop bodies are unrolled one level per round; this bounds the rounds.
MAX_DEPTH = 8
#: Loops counted from what earlier loops give (a stacked RNN's layers) are unrolled one per fold of
#: the import (unroll_loops returns them); this bounds the chain, and so the folds.
MAX_CHAINED = 32

LOOPS = ("Loop", "Scan")


def has_loop(model: onnx.ModelProto) -> bool:
    return any(n.op_type in LOOPS and n.domain in ("", "ai.onnx") for n in model.graph.node)


def unroll_loops(model: onnx.ModelProto, path, infer) -> tuple[onnx.ModelProto, list[str], bool]:
    """Unroll every Loop and Scan of `model`'s main graph, nested ones too (one level per round,
    `infer`, a lenient shape inference, between rounds). Returns (the model, pass-log notes,
    whether loops were left for after a fold).

    A loop whose trip count or condition is computed from what an earlier loop gives (a stacked
    RNN's second layer counts the first one's output: tf2onnx's Keras LSTMs) is known only once
    that loop is unrolled and the arithmetic between them folded. Such a loop is left as it is,
    and the model is returned with it (True): the caller folds constants and calls again. A
    round that unrolls nothing raises the first loop's error."""
    notes: list[str] = []
    for _ in range(MAX_DEPTH):
        if not has_loop(model):
            return model, notes, False
        model = infer(model)
        unrolled, deferred = _one_round(model, path, notes)
        if deferred:
            if not unrolled:
                raise deferred[0]
            return model, notes, True
    if has_loop(model):
        raise UnsupportedControlFlowError(f"{path}: loops nest more than {MAX_DEPTH} deep; dlcc unrolls at most that many levels")
    return model, notes, False


def _one_round(model: onnx.ModelProto, path, notes: list[str]) -> tuple[int, list[UnsupportedControlFlowError]]:
    """Unroll the main graph's loops once. Returns how many were unrolled, and the errors of the
    loops left for the next round because they read what an earlier loop of this round gives."""
    from .control_flow import node_reads

    g = model.graph
    opset = opset_of(model)
    consts, shapes = _constant_values(g), _static_shapes(g)
    taken = _all_names_deep(g)
    out: list[onnx.NodeProto] = []
    after_loop: set[str] = set()  # tensors computed from a loop's outputs (the graph is in order)
    unrolled, deferred = 0, []
    for k, node in enumerate(g.node):
        reads = node_reads(node)
        if node.op_type not in LOOPS or node.domain not in ("", "ai.onnx"):
            out.append(node)
            if after_loop.intersection(reads):
                after_loop.update(o for o in node.output if o)
            continue
        label = node.name or node.output[0]
        prefix = _prefix(node, k, taken)
        taken.add(prefix)
        unroll = _scan if node.op_type == "Scan" else _loop
        after_loop.update(o for o in node.output if o)
        try:
            nodes, note = unroll(node, label, prefix, g, consts, shapes, opset, path)
        except UnsupportedControlFlowError as e:
            if not after_loop.intersection(reads):
                raise
            out.append(node)
            deferred.append(e)
            continue
        out += nodes
        unrolled += 1
        notes.append(f"import: {node.op_type} {label!r}: {note}")
    del g.node[:]
    g.node.extend(out)
    del g.value_info[:]  # the caller infers the unrolled graph afresh
    return unrolled, deferred


def _body(node: onnx.NodeProto, label: str, path) -> onnx.GraphProto:
    body = next((a.g for a in node.attribute if a.name == "body"), None)
    if body is None:
        raise UnsupportedControlFlowError(f"{path}: {node.op_type} {label!r} has no body")
    for o in list(body.input) + list(body.output):
        # (A sequence of tensors may be carried: TorchScript's `outs.append(h)`; sequences.py
        # resolves it once the loop is unrolled.)
        seq = o.type.sequence_type.elem_type if o.type.HasField("sequence_type") else None
        if not (o.type.HasField("tensor_type") or (seq is not None and seq.HasField("tensor_type"))):
            raise UnsupportedControlFlowError(f"{path}: {node.op_type} {label!r}: body value {o.name!r} is not a tensor "
                                              "or a sequence of tensors (an optional or a map); dlcc compiles tensors only")
    return body


def _check_size(iterations: int, body: onnx.GraphProto, node, label, path) -> None:
    if iterations * len(body.node) > MAX_UNROLLED_NODES:
        raise UnsupportedControlFlowError(
            f"{path}: {node.op_type} {label!r} runs {iterations} iterations of a {len(body.node)}-node body; dlcc unrolls "
            f"loops, and that is more than its limit of {MAX_UNROLLED_NODES} nodes")


class _Unroller:
    """Emits the per-iteration copies of one body into the main graph `g`."""

    def __init__(self, body: onnx.GraphProto, prefix: str, g: onnx.GraphProto, label: str, opset: int):
        self.body, self.prefix, self.label, self.opset = body, prefix, label, opset
        self.nodes: list[onnx.NodeProto] = []
        self.consts: dict[tuple, str] = {}
        # The body's initializers go into the graph once, shared by every iteration.
        self.shared = {t.name: f"{prefix}c_{t.name}" for t in body.initializer}
        for t in body.initializer:
            c = onnx.TensorProto()
            c.CopyFrom(t)
            c.name = self.shared[t.name]
            g.initializer.append(c)

    def const(self, value: np.ndarray) -> str:
        key = (value.dtype.str, value.shape, value.tobytes())
        if key not in self.consts:
            name = f"{self.prefix}k{len(self.consts)}"
            self.nodes.append(helper.make_node("Constant", [], [name], name=f"{self.label}/{name}",
                                               value=numpy_helper.from_array(value, name)))
            self.consts[key] = name
        return self.consts[key]

    def node(self, op: str, inputs: list[str], output: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, inputs, [output], name=f"{self.label}/{output}", **attrs))
        return output

    def iteration(self, t: int, bind: dict[str, str]) -> list[str]:
        """One copy of the body with its inputs bound to `bind`; the names of its outputs."""
        pre = f"{self.prefix}i{t}_"
        rename = dict(self.shared)
        rename.update({o: f"{pre}{o}" for n in self.body.node for o in n.output if o})
        rename.update(bind)
        self.nodes += copy_nodes(self.body, pre, rename)
        return [rename.get(o.name, o.name) for o in self.body.output]

    def stack(self, values: list[str], axis: int, output: str, k: int) -> None:
        """`output` (scan output k) = the values, each given a new axis `axis`, concatenated along it."""
        if self.opset >= 13:
            ax = self.const(np.array([axis], np.int64))
            parts = [self.node("Unsqueeze", [v, ax], f"{self.prefix}s{k}_{j}") for j, v in enumerate(values)]
        else:  # (axes an attribute before opset 13)
            parts = [self.node("Unsqueeze", [v], f"{self.prefix}s{k}_{j}", axes=[axis]) for j, v in enumerate(values)]
        self.node("Concat", parts, output, axis=axis)


def _ints(node: onnx.NodeProto, name: str, n: int, default: int) -> list[int]:
    got = next((list(helper.get_attribute_value(a)) for a in node.attribute if a.name == name), None)
    return [default] * n if got is None else [int(v) for v in got]


def _one_value(value, kinds: str, what: str):
    """The single value of a Loop's M (an int64) or cond (a bool), which the spec makes a scalar
    or a one-element tensor; anything else is one clear error, not a numpy ValueError."""
    v = np.asarray(value)
    if v.size != 1 or v.dtype.kind not in kinds:
        raise ModelError(f"{what} must be one {'integer' if kinds == 'iu' else 'bool'}; it is {v.dtype} of shape "
                         f"{list(v.shape)}")
    return v.reshape(())


def _scan_attrs(node, label, path, m: int, n_out: int):
    """Scan's per-input and per-output axes and directions: one entry each, directions 0 or 1."""
    got = {}
    for name, count in (("scan_input_axes", m), ("scan_input_directions", m), ("scan_output_axes", n_out),
                        ("scan_output_directions", n_out)):
        got[name] = v = _ints(node, name, count, 0)
        if len(v) != count:
            raise ModelError(f"{path}: Scan {label!r}: {name} has {len(v)} entries for its {count} "
                             f"{'scan inputs' if 'input' in name else 'scan outputs'}")
        if name.endswith("directions") and any(d not in (0, 1) for d in v):
            raise ModelError(f"{path}: Scan {label!r}: {name} {v} must each be 0 (forward) or 1 (reverse)")
    return got.values()


def _scan(node, label, prefix, g, consts, shapes, opset, path):
    if opset < 9:
        raise UnsupportedControlFlowError(f"{path}: Scan {label!r} is opset 8's (a batch axis and sequence_lens); dlcc "
                                          f"unrolls the Scan of opset 9 on")
    body = _body(node, label, path)
    m = next((int(helper.get_attribute_value(a)) for a in node.attribute if a.name == "num_scan_inputs"), None)
    if m is None or not 0 < m <= len(node.input):
        raise UnsupportedControlFlowError(f"{path}: Scan {label!r}: num_scan_inputs {m} does not fit its "
                                          f"{len(node.input)} inputs")
    n_state = len(node.input) - m
    n_out = len(body.output) - n_state
    if len(body.input) != n_state + m or n_out < 0:
        raise UnsupportedControlFlowError(f"{path}: Scan {label!r}: its body takes {len(body.input)} inputs and gives "
                                          f"{len(body.output)} outputs, for {n_state} states and {m} scan inputs")
    in_axes, in_dirs, out_axes, out_dirs = _scan_attrs(node, label, path, m, n_out)
    lengths = set()
    xs = node.input[n_state:]
    for j, x in enumerate(xs):
        shape = shapes.get(x)
        if shape is None:
            raise ShapeError(f"{path}: Scan {label!r} scans {x!r}, whose shape is not static here; bind the model's "
                             f"dynamic dims with --shape NAME=DIMS")
        if not -len(shape) <= in_axes[j] < len(shape):
            raise UnsupportedControlFlowError(f"{path}: Scan {label!r}: scan axis {in_axes[j]} of {x!r} is outside its "
                                              f"{len(shape)} dimensions")
        in_axes[j] %= len(shape)
        lengths.add(shape[in_axes[j]])
    if len(lengths) != 1:
        raise UnsupportedControlFlowError(f"{path}: Scan {label!r}: its scan inputs differ in length ({sorted(lengths)})")
    iterations = lengths.pop()
    if iterations == 0 and any(node.output[n_state:]):
        raise UnsupportedControlFlowError(f"{path}: Scan {label!r} runs zero iterations, so its scan outputs are empty; "
                                          f"dlcc has no zero-length tensors")
    _check_size(iterations, body, node, label, path)
    u = _Unroller(body, prefix, g, label, opset)
    states = list(node.input[:n_state])
    per_iter: list[list[str]] = [[] for _ in range(n_out)]
    for t in range(iterations):
        bind = {body.input[i].name: states[i] for i in range(n_state)}
        for j, x in enumerate(xs):
            idx = u.const(np.array(iterations - 1 - t if in_dirs[j] else t, np.int64))
            bind[body.input[n_state + j].name] = u.node("Gather", [x, idx], f"{prefix}g{t}_{j}", axis=in_axes[j])
        outs = u.iteration(t, bind)
        states = outs[:n_state]
        for k in range(n_out):
            per_iter[k].append(outs[n_state + k])
    _finish(u, node, states, per_iter, out_axes, out_dirs)
    return u.nodes, f"unrolled: {iterations} iterations of a {len(body.node)}-node body"


def _loop(node, label, prefix, g, consts, shapes, opset, path):
    body = _body(node, label, path)
    inputs = list(node.input) + [""] * (2 - len(node.input))
    trip, cond = inputs[0], inputs[1]
    n_state = len(node.input) - 2
    n_out = len(body.output) - 1 - n_state
    if len(body.input) != n_state + 2 or n_out < 0:
        raise UnsupportedControlFlowError(f"{path}: Loop {label!r}: its body takes {len(body.input)} inputs and gives "
                                          f"{len(body.output)} outputs, for {n_state} loop-carried values")
    stays_true = _stays_true(body, consts)
    if trip and trip in consts:
        iterations = int(_one_value(consts[trip], "iu", f"{path}: Loop {label!r}: the trip count M"))
    elif trip or stays_true:
        why = "has no trip count" if not trip else f"has a trip count {trip!r} computed at run time"
        raise UnsupportedControlFlowError(f"{path}: Loop {label!r} {why}; dlcc unrolls loops, so it needs the number of "
                                          f"iterations at compile time (a constant, or one computed from --shape)")
    else:
        iterations = None  # (a while loop without M: its condition alone ends it)
    if cond:
        if cond not in consts:
            raise UnsupportedControlFlowError(f"{path}: Loop {label!r}: its initial condition {cond!r} is computed at run "
                                              f"time; dlcc unrolls loops whose condition is known")
        if not bool(_one_value(consts[cond], "b", f"{path}: Loop {label!r}: the condition")):
            iterations = 0
    if not stays_true and iterations != 0:
        limit = MAX_UNROLLED_NODES // max(len(body.node), 1) + 1
        counted = _counted_iterations(node, body, consts, limit if iterations is None else min(iterations, limit), opset)
        if counted is None:
            raise UnsupportedControlFlowError(
                f"{path}: Loop {label!r} is a while loop: its body computes whether to go on ({body.output[0].name!r}) "
                f"from values known only at run time; dlcc unrolls loops whose iterations it can count at compile time")
        iterations = counted
    iterations = max(iterations, 0)
    if iterations == 0 and any(node.output[n_state:]):
        raise UnsupportedControlFlowError(f"{path}: Loop {label!r} runs zero iterations, so its scan outputs are empty; "
                                          f"dlcc has no zero-length tensors")
    _check_size(iterations, body, node, label, path)
    u = _Unroller(body, prefix, g, label, opset)
    states = list(node.input[2:])
    per_iter: list[list[str]] = [[] for _ in range(n_out)]
    true = u.const(np.array(True))
    for t in range(iterations):
        bind = {body.input[0].name: u.const(np.array(t, np.int64)), body.input[1].name: true}
        bind.update({body.input[2 + i].name: states[i] for i in range(n_state)})
        outs = u.iteration(t, bind)
        states = outs[1:1 + n_state]
        for k in range(n_out):
            per_iter[k].append(outs[1 + n_state + k])
    _finish(u, node, states, per_iter, [0] * n_out, [0] * n_out)
    return u.nodes, f"unrolled: {iterations} iterations of a {len(body.node)}-node body"


def _finish(u: _Unroller, node, states, per_iter, axes, dirs) -> None:
    """The loop's outputs: the final states, then each scan output stacked."""
    for i, s in enumerate(states):
        if i < len(node.output) and node.output[i]:
            u.node("Identity", [s], node.output[i])
    for k, values in enumerate(per_iter):
        o = len(states) + k
        if o < len(node.output) and node.output[o]:
            u.stack(values[::-1] if dirs[k] else values, axes[k], node.output[o], k)


#: What a counting condition is computed with: scalar arithmetic, comparisons and logic, and the
#: ops exporters put around them. Nothing that makes large tensors (ConstantOfShape, Range, Expand)
#: runs at compile time on a model's say-so; every value stays within _COUNTER_SIZE elements.
_COUNTER_OPS = {"Add", "Sub", "Mul", "Div", "Mod", "Neg", "Abs", "Min", "Max", "Less", "LessOrEqual", "Greater",
                "GreaterOrEqual", "Equal", "And", "Or", "Not", "Xor", "Cast", "Identity", "Constant", "Squeeze",
                "Unsqueeze", "Reshape", "Where", "Gather", "Slice", "Floor", "Ceil"}
_COUNTER_SIZE = 64


def _counted_iterations(node: onnx.NodeProto, body: onnx.GraphProto, outer: dict, cap: int, opset: int) -> int | None:
    """How many times a `while` Loop runs (at most `cap`), where its condition follows from the
    iteration number, constants and loop-carried counters alone; None where it depends on data.

    tf2onnx writes every Keras RNN (LSTM, GRU, SimpleRNN) this way: TensorFlow's while loop
    carries a time step `t`, adds 1 to it each iteration, and goes on while `t < steps` and the
    iteration number is below the maximum. The part of the body that computes the condition and
    those counters (its "control slice") is run here with onnx.reference, iteration by iteration,
    from the counters' constant initial values, until the condition turns false. The loop is then
    unrolled as a `for` loop of that many iterations; the slice's copies compute values nothing
    reads, and are dropped with the other dead nodes."""
    produced = {o: n for n in body.node for o in n.output if o}
    local = {t.name for t in body.initializer}
    carried = {body.input[2 + i].name: i for i in range(len(body.input) - 2)}
    need: set[str] = set()  # body node outputs in the slice
    used_outer: set[str] = set()
    states: set[int] = set()

    def walk(name: str) -> bool:
        todo = [name]
        while todo:
            x = todo.pop()
            if not x or x in need or x in local or x in used_outer:
                continue
            if x in carried:
                states.add(carried[x])
            elif x in (body.input[0].name, body.input[1].name):
                continue
            elif x in produced:
                n = produced[x]
                if n.domain not in ("", "ai.onnx") or n.op_type not in _COUNTER_OPS:
                    return False  # (a loop, a random draw, a tensor op: not a plain counter)
                need.update(o for o in n.output if o)
                todo += list(n.input)
            elif x in outer:
                used_outer.add(x)
            else:
                return False  # a value of the enclosing graph known only at run time
        return True

    if not walk(body.output[0].name):
        return None
    done: set[int] = set()
    while states - done:
        i = min(states - done)
        done.add(i)
        if not walk(body.output[1 + i].name):
            return None
    order = sorted(states)
    if any(node.input[2 + i] not in outer for i in order):
        return None
    slice_nodes = [n for n in body.node if any(o in need for o in n.output)]
    read = {x for n in slice_nodes for x in n.input}
    inits = [t for t in body.initializer if t.name in read]
    if any(int(np.prod(t.dims)) > _COUNTER_SIZE for t in inits):
        return None  # (a counter compared with a large constant is no counter)
    inits += [numpy_helper.from_array(np.asarray(outer[x]), x) for x in sorted(used_outer)]
    ins = [body.input[0], body.input[1]] + [body.input[2 + i] for i in order]
    outs = [body.output[0].name] + [body.output[1 + i].name for i in order]
    from .reference_ops import evaluator

    def control(shapes: list[tuple]) -> onnx.ModelProto:
        typed = [helper.make_tensor_value_info(v.name, v.type.tensor_type.elem_type, list(sh))
                 for v, sh in zip(ins, shapes)]
        g = helper.make_graph(slice_nodes, "control", typed, [onnx.ValueInfoProto(name=o) for o in outs], inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])

    def small(model: onnx.ModelProto) -> bool:
        """Whether every value of the slice has a known shape of at most _COUNTER_SIZE elements
        (onnx's inference says so before anything runs: a broadcast could otherwise grow a
        counter's product past memory)."""
        try:
            found = shape_inference.infer_shapes(model, strict_mode=True, data_prop=True).graph
        except Exception:
            return False
        seen = {vi.name: vi for vi in list(found.value_info) + list(found.output)}
        for name in need:  # (every value a slice node makes; the inputs' shapes are given)
            vi = seen.get(name)
            if vi is None:
                return False
            dims = vi.type.tensor_type.shape.dim
            if not vi.type.tensor_type.HasField("shape") or any(not d.HasField("dim_value") for d in dims) \
                    or int(np.prod([d.dim_value for d in dims])) > _COUNTER_SIZE:
                return False
        return True

    values = [np.asarray(outer[node.input[2 + i]]) for i in order]
    runners: dict[tuple, object] = {}  # by the counters' shapes, each checked once
    t = 0
    try:
        while t < cap:
            key = ((), ()) + tuple(a.shape for a in values)
            if key not in runners:
                m = control(list(key))
                runners[key] = evaluator(m) if small(m) else None
            if runners[key] is None:
                return None
            got = runners[key].run(None, {ins[0].name: np.array(t, np.int64), ins[1].name: np.array(True),
                                          **{v.name: a for v, a in zip(ins[2:], values)}})
            t += 1
            if np.asarray(got[0]).size != 1 or not bool(np.asarray(got[0]).reshape(())):
                return t
            values = [np.asarray(a) for a in got[1:]]
    except Exception:  # onnx.reference cannot evaluate the slice: the loop stays unsupported
        return None
    return t  # (the trip count M ended it, or `cap` is past what _check_size lets dlcc unroll)


def _stays_true(body: onnx.GraphProto, outer: dict) -> bool:
    """Whether the body's condition output is true in every iteration: its condition input passed
    through (via Identity), or a constant true (its own, or the enclosing graph's)."""
    produced = {o: n for n in body.node for o in n.output if o}
    local = _constant_values(body)
    name, seen = body.output[0].name, set()
    while name not in seen:
        seen.add(name)
        if name == body.input[1].name:
            return True
        value = local.get(name, outer.get(name) if name not in produced else None)
        if value is not None:
            return bool(np.asarray(value).size == 1 and np.asarray(value).reshape(()))
        n = produced.get(name)
        if n is None or n.op_type != "Identity":
            return False
        name = n.input[0]
    return False
