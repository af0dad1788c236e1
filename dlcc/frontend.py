"""ONNX import: read safely, bind dynamic dims, fold constants, infer shapes, build the Graph IR.

Folding uses onnxruntime at ORT_ENABLE_BASIC first (it folds Shape→Gather→Concat chains the way
NNFusion relies on), then `onnx.reference.ReferenceEvaluator` for anything left whose inputs are
all known (with the few ops it gets wrong replaced: reference_ops.py). Shapes come from
`onnx.shape_inference`. An If becomes plain nodes (control_flow.py).
"""
from __future__ import annotations

import itertools
import logging
import os
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper, shape_inference

from .errors import (DynamicShapeError, ModelError, ShapeError, UnboundDimError, UnsupportedControlFlowError,
                     UnsupportedDtypesError, first_line)
from .ir import HALF_FLOATS, INT32_MAX, SUPPORTED_DTYPES, Graph, Node, Tensor

log = logging.getLogger(__name__)

ShapeBindings = dict[str, tuple[int, ...]]


def parse_shape_binding(text: str) -> tuple[str, tuple[int, ...]]:
    """Parse `NAME=1x3x224x224` (also `NAME=1,3,224,224`; `NAME=8` binds a symbolic dim, or the
    value of a scalar int input: bind_values)."""
    if "=" not in text:
        raise ShapeError(f"--shape {text!r}: expected NAME=DIMxDIMx..., for example input=1x3x224x224")
    name, _, dims = text.rpartition("=")
    try:
        shape = tuple(int(d) for d in dims.replace(",", "x").split("x") if d != "")
    except ValueError:
        raise ShapeError(f"--shape {text!r}: dims must be positive integers separated by 'x'") from None
    if not name or not shape or len(shape) > 1 and any(d < 0 for d in shape):
        raise ShapeError(f"--shape {text!r}: expected NAME=DIMxDIMx... with dims of 0 or more")
    # (One number may be negative: the value of a scalar input. bind_shapes refuses it as a dim.)
    if any(d > INT32_MAX for d in shape):
        raise ShapeError(f"--shape {text!r}: a dim above {INT32_MAX} is more than dlcc's 32-bit indices address")
    return name, shape


def load_model(path: str | os.PathLike, external_data: bool = True) -> onnx.ModelProto:
    """Read an ONNX file; external data is accepted only from inside the model's own folder.
    `external_data=False` checks where it lies but does not read it (the signature alone)."""
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"{path}: no such file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf DecodeError and friends
        raise ModelError(f"{path}: not a readable ONNX model (truncated or not protobuf?): {e}") from None
    if not model.HasField("graph") or len(model.graph.node) == 0 and len(model.graph.output) == 0:
        raise ModelError(f"{path}: the file parsed but holds no ONNX graph (is it really an .onnx file?)")
    _check_text(model, path)
    _check_einsum_equations(model, path)
    base = path.resolve().parent
    for init in _all_initializers(model):
        if init.data_location == onnx.TensorProto.EXTERNAL:
            loc = {e.key: e.value for e in init.external_data}.get("location", "")
            if "\0" in loc or not loc:
                raise ModelError(f"{path}: initializer {init.name!r} names external data {loc!r}, which is not a "
                                 "file name")
            try:
                target = (base / loc).resolve()
            except (OSError, RuntimeError) as e:  # a symlink loop, a name too long
                raise ModelError(f"{path}: external data {loc!r} for initializer {init.name!r} cannot be "
                                 f"resolved: {e}") from None
            if os.path.isabs(loc) or not target.is_relative_to(base):
                raise ModelError(
                    f"{path}: initializer {init.name!r} points at external data {loc!r}, which lies outside "
                    f"the model's folder {base}; dlcc only reads external data from inside that folder"
                )
            if not target.is_file():
                raise ModelError(f"{path}: external data file {loc!r} for initializer {init.name!r} is missing")
    try:
        if external_data:
            onnx.load_external_data_for_model(model, str(base))
    except Exception as e:
        raise ModelError(f"{path}: could not load external data: {e}") from None
    _sort_nodes(model, path)
    return model


#: Initializers at least this big are weights: they leave the graph before the checker, folding
#: and shape inference, which then see a graph of a few hundred KB instead of hundreds of MB.
#: Shape-like constants (a Reshape's target, Gather indices) are far smaller, so they stay and
#: still fold. 4 KB also keeps BERT's int64 position ids [1, 512] in.
WEIGHT_BYTES = 4097


def _check_text(msg, path, where: str = "model") -> None:
    """Every string field of the model holds UTF-8 text. protobuf parses ONNX's proto2 strings
    without checking them and hands invalid ones to Python as bytes, which then broke whatever
    used the name (a UnicodeDecodeError deep in onnx.helper). Byte fields (raw tensor data) are
    not looked at, so the walk stays cheap for large models."""
    from google.protobuf.descriptor import FieldDescriptor as F

    for f, value in msg.ListFields():
        if f.type == F.TYPE_STRING:
            for v in (value if is_repeated_field(f) else [value]):
                if isinstance(v, bytes):
                    raise ModelError(f"{path}: {where}.{f.name} {v[:40]!r} is not UTF-8 text; the file is corrupt or "
                                     "not written by an ONNX exporter")
        elif f.type == F.TYPE_MESSAGE:
            items = value if is_repeated_field(f) else [value]
            for k, v in enumerate(items):
                _check_text(v, path, f"{where}.{f.name}[{k}]" if is_repeated_field(f) else f"{where}.{f.name}")


def _check_einsum_equations(model: onnx.ModelProto, path) -> None:
    """Every Einsum equation is letters, commas, spaces, one `->` at most and one `...` per term
    at most. onnx 1.23's shape inference (which onnxruntime shares) loops for ever on a stray dot
    (`i.j->i`), so such a model must be refused before anything infers it."""
    def nodes(g: onnx.GraphProto):
        for n in g.node:
            yield n
            for a in n.attribute:
                for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                    yield from nodes(sub)

    for n in itertools.chain(nodes(model.graph), (n for f in model.functions for n in f.node)):
        if n.op_type != "Einsum":
            continue
        eq = next((a.s for a in n.attribute if a.name == "equation"), b"")
        text = eq.decode("utf-8", "replace") if isinstance(eq, bytes) else str(eq)
        terms = text.replace(" ", "").split("->")
        bad = [t for part in terms for t in part.split(",") if not re.fullmatch(r"[A-Za-z]*(\.\.\.)?[A-Za-z]*", t)]
        if len(terms) > 2 or bad:
            what = ("more than one '->'" if len(terms) > 2 else
                    f"term {bad[0]!r} holds {next(c for c in bad[0].replace('...', '', 1) + '.' if not c.isalpha())!r}")
            raise ModelError(f"{path}: Einsum node {n.name or n.output[0]!r}: equation {text!r} is malformed ({what}): "
                             "terms of letters separated by commas, one '->' at most, one '...' per term at most")


def is_repeated_field(f) -> bool:
    rep = getattr(f, "is_repeated", None)  # protobuf >= 5.28; `label` went in 7
    return bool(rep) if rep is not None else f.label == f.LABEL_REPEATED


def split_weights(model: onnx.ModelProto, path) -> dict[str, np.ndarray]:
    """Take the weights out of `model` (in place), as typed graph inputs, and return their values.

    Why: onnxruntime's folding needs the model serialised to a file and parsed again, the checker
    and shape inference serialise it too; with a 440 MB BERT-base that was 7 of its 10 s of
    compile. Weight-only subgraphs (a Transpose of a weight, a Cast) are folded later by dlcc's own
    folder, which sees the values again (`_fold_and_infer`)."""
    listed = {i.name for i in model.graph.input}
    inits = model.graph.initializer
    weights: dict[str, np.ndarray] = {}
    for k in reversed(range(len(inits))):
        t = inits[k]
        if _tensor_bytes(t) < WEIGHT_BYTES or t.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
            continue
        weights[t.name] = tensor_value(t, path)
        if t.name not in listed:
            model.graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        del inits[k]
    return dict(reversed(weights.items()))


def check_model(model: onnx.ModelProto, path) -> None:
    if model.ir_version < 4 and not {t.name for t in model.graph.initializer} <= {i.name for i in model.graph.input}:
        # IR 3 wanted every initializer listed as a graph input; old exporters (onnxruntime's own
        # datasets/mul_1.onnx) did not, and onnxruntime runs them as IR 4 reads them: constants.
        model.ir_version = 4
    if not model.graph.name:
        # The checker wants a name; onnxruntime runs a main graph without one (crack-tcaptcha's
        # word_click_matcher.onnx). An unnamed If branch both refuse.
        model.graph.name = "main_graph"
    checked = model
    if any(o.type.HasField("tensor_type") and not o.type.tensor_type.HasField("shape") for o in model.graph.output):
        # The checker wants every graph output to carry a shape field; tf2onnx at opset 13 leaves
        # it off an Einsum's output, and onnxruntime runs such a model. The checker sees a copy
        # with an empty field there; the model keeps its output's shape unknown, for inference.
        checked = onnx.ModelProto()
        checked.CopyFrom(model)
        for o in checked.graph.output:
            if o.type.HasField("tensor_type") and not o.type.tensor_type.HasField("shape"):
                o.type.tensor_type.shape.SetInParent()
    try:
        onnx.checker.check_model(checked)
    except Exception as e:
        raise ModelError(f"{path}: the ONNX checker rejects this model: {first_line(e, 10**6)}") from None
    opset, known = opset_of(model), onnx.defs.onnx_opset_version()
    if not 1 <= opset <= known:
        # The checker lets any stamp through; ops would then be read by the rules of the newest
        # opset dlcc knows, which is not what a model from the future means.
        raise ModelError(f"{path}: the model is stamped with opset {opset} of the ONNX domain; this installation "
                         f"knows opsets 1 to {known} (onnx {onnx.__version__})")


def upgrade_legacy_opset(model: onnx.ModelProto, path, at_least: int = 1) -> tuple[onnx.ModelProto, list[str]]:
    """`model` converted by onnx's version converter to the lowest opset at which dlcc lowers
    every ONNX op it uses, where it uses an op only in a form older than dlcc's lowering (the
    registry's `since`): Pad before 11 (its pads an attribute), Add's and Gemm's `broadcast`
    attribute before 7, TopK's `k` attribute before 10, Relu's `consumed_inputs` before 6. The
    converter rewrites what changed between the versions, so a model zoo file from opset 3 reads
    as the opset dlcc knows; the note goes to the pass log. `at_least` raises an older model to
    that opset whatever it uses (verify's reference: onnxruntime runs opsets from 7)."""
    from .control_flow import nodes_deep
    from .ops.registry import lookup, supported_ops

    opset, since = opset_of(model), supported_ops()
    old = sorted({n.op_type for n in nodes_deep(model.graph) if n.domain in ("", "ai.onnx")
                  and n.op_type in since and lookup(n.op_type, opset) is None})
    need = max([min(since[op]) for op in old] + ([at_least] if opset < at_least else []), default=None)
    if need is None:
        return model, []
    from .rewrite import raise_opset

    if opset < 7:
        model = _align_legacy_broadcasts(model)
    model, note = raise_opset(model, need, path, f"dlcc lowers {', '.join(old)} as written from opset {need}"
                              if old else f"onnxruntime runs opsets from {at_least}")
    return model, [note]


#: Tests whose answer on a float is its answer on the float widened (IsInf of float64(x) is IsInf of x).
_WIDENING_BLIND = ("IsInf", "IsNaN")


def skip_exact_widenings(model: onnx.ModelProto) -> onnx.ModelProto:
    """IsInf and IsNaN of a float32 or float16 tensor widened to float64 read the tensor itself:
    the widening is exact, so the test's answer is the same. torch's TorchScript exporter writes
    `torch.nan_to_num` and `isinf` that way, and the float64 Cast, which dlcc's kernels do not
    have, is then left unread (and removed with the dead nodes)."""
    g = model.graph
    widened = {n.output[0]: n.input[0] for n in g.node
               if n.op_type == "Cast" and n.domain in ("", "ai.onnx") and len(n.input) == 1
               and any(a.name == "to" and a.i == onnx.TensorProto.DOUBLE for a in n.attribute)}
    tests = [n for n in g.node if n.op_type in _WIDENING_BLIND and n.domain in ("", "ai.onnx") and n.input
             and n.input[0] in widened]
    if not tests:
        return model
    try:
        typed = shape_inference.infer_shapes(model).graph
    except Exception:  # reported where the import infers shapes itself
        return model
    from .expand import _known_types

    types = _known_types(typed)
    narrow = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
    for n in tests:
        src = widened[n.input[0]]
        if src in types and types[src].tensor_type.elem_type in narrow:
            n.input[0] = src
    return model


#: The ops whose second input broadcast before opset 7 by `broadcast=1` and `axis`.
_LEGACY_BROADCAST = ("Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Greater", "Less")


def _align_legacy_broadcasts(model: onnx.ModelProto) -> onnx.ModelProto:
    """Before opset 7, B lined up with A's dims from `axis` (B [3] against A [2, 3, 4, 5] at axis
    1), and PRelu's slope of C values ran along the channel axis; numpy's rule from opset 7 lines
    dims up from the right. onnx's converter refuses the axis and keeps the slope as it is, so B
    first gets trailing unit dims here (an Unsqueeze: [3, 1, 1]), under which both rules agree."""
    try:
        shaped = shape_inference.infer_shapes(model)
    except Exception:  # the converter's own error says what is wrong
        return model
    from .expand import _known_types

    rank = {name: len(t.tensor_type.shape.dim) for name, t in _known_types(shaped.graph).items()
            if t.tensor_type.HasField("shape")}
    nodes = []
    for k, n in enumerate(model.graph.node):
        attrs = {a.name: a for a in n.attribute}
        a, b = (rank.get(n.input[i]) if len(n.input) > i else None for i in (0, 1))
        pad, start = 0, 1
        if n.domain in ("", "ai.onnx") and n.op_type in _LEGACY_BROADCAST and "axis" in attrs and a and b is not None:
            axis = attrs["axis"].i + (a if attrs["axis"].i < 0 else 0)
            pad, start = a - axis - b, b
            n.attribute.remove(attrs["axis"])
        elif n.domain in ("", "ai.onnx") and n.op_type == "PRelu" and b == 1 and a and a > 2:
            pad = a - 2
        if pad > 0:
            out = f"{n.input[1]}__legacy_axes_{k}"
            nodes.append(onnx.helper.make_node("Unsqueeze", [n.input[1]], [out], name=f"{n.name}__legacy_axes_{k}",
                                               axes=list(range(start, start + pad))))
            n.input[1] = out
        nodes.append(n)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def _all_initializers(model: onnx.ModelProto):
    yield from model.graph.initializer
    for node in model.graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                yield a.t


def _sort_nodes(model: onnx.ModelProto, path) -> None:
    """Every node's inputs exist, and the nodes are in an order that computes them first. ONNX
    asks for that order, but onnxruntime sorts a graph that is out of order and runs it, so a
    model a tool wrote unsorted (a hand edit, a graph surgeon's insertion) is sorted here too,
    keeping the file's order wherever it is free (Kahn's algorithm, the earliest node first). A
    tensor nothing produces, and a cycle, are errors."""
    import heapq

    from .control_flow import node_reads

    g = model.graph
    available = {i.name for i in g.input} | {i.name for i in g.initializer}
    producer = {o: k for k, n in enumerate(g.node) for o in n.output if o}
    produced = set(available)
    in_order = True
    for node in g.node:
        for i in node.input:
            if i and i not in produced:
                if i not in producer:
                    raise ModelError(f"{path}: node {node.name!r} ({node.op_type}) reads {i!r}, which no node, "
                                     "graph input or initializer produces")
                in_order = False
        produced.update(o for o in node.output if o)
    if in_order:
        return
    # (a subgraph's reads of the outer graph order its node too)
    deps = [{producer[t] for t in node_reads(n) if t in producer and t not in available} for n in g.node]
    users: dict[int, list[int]] = {}
    for k, d in enumerate(deps):
        for p in d:
            users.setdefault(p, []).append(k)
    waiting = [len(d) for d in deps]
    ready = [k for k, w in enumerate(waiting) if not w]
    heapq.heapify(ready)
    order = []
    while ready:
        k = heapq.heappop(ready)
        order.append(k)
        for u in users.get(k, ()):
            waiting[u] -= 1
            if not waiting[u]:
                heapq.heappush(ready, u)
    if len(order) < len(g.node):
        stuck = next(n for k, n in enumerate(g.node) if waiting[k])
        raise ModelError(f"{path}: the graph is cyclic: node {stuck.name!r} ({stuck.op_type}) needs, through its "
                         "inputs, its own output")
    nodes = [g.node[k] for k in order]
    del g.node[:]
    g.node.extend(nodes)


def opset_of(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return 1


def bind_values(model: onnx.ModelProto, shapes: ShapeBindings | None, weights=()) -> tuple[ShapeBindings, dict[str, int]]:
    """Bind the value of each scalar integer or bool input that `shapes` names (`--shape sr=16000`:
    a scalar has no dims, so the binding can only mean its value), as torch.compile specialises
    on a Python int. Every read of the input then reads a constant, so the Ifs and shape math it
    decides fold (Silero VAD picks its 8 or 16 kHz network by `sr`). The input stays in the
    signature, and the run checks that it is fed that value (plan meta `bound_values`).
    Returns (the bindings left for bind_shapes, the bound values)."""
    from .control_flow import rename_reads

    shapes = dict(shapes or {})
    init_names = {i.name for i in model.graph.initializer} | set(weights)
    values: dict[str, int] = {}
    for inp in model.graph.input:
        tt = inp.type.tensor_type if inp.type.HasField("tensor_type") else None
        if (inp.name in init_names or inp.name not in shapes or tt is None or not tt.HasField("shape")
                or len(tt.shape.dim) or tt.elem_type not in _VALUE_TYPES):
            continue
        want = shapes.pop(inp.name)
        if not len(want):  # (the scalar's own shape: it stays an input)
            continue
        if len(want) != 1:
            raise ShapeError(f"--shape {inp.name}: the input is a scalar, so a binding gives its value, one number")
        value = int(want[0])
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if dtype == np.bool_ and value not in (0, 1) or dtype != np.bool_ and not (
                np.iinfo(dtype).min <= value <= np.iinfo(dtype).max):
            raise ShapeError(f"--shape {inp.name}={value}: not a value of the input's type {dtype.name}")
        const = f"{inp.name}=bound"
        model.graph.initializer.append(numpy_helper.from_array(np.array(value, dtype), const))
        rename_reads(model.graph, {inp.name: const}, outputs=False)  # (an input that is an output stays)
        values[inp.name] = value
    return shapes, values


#: Scalar input types whose value `--shape NAME=V` can bind.
_VALUE_TYPES = (onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.INT8, onnx.TensorProto.UINT8,
                onnx.TensorProto.BOOL)


def bind_shapes(model: onnx.ModelProto, shapes: ShapeBindings | None, source: str = "model",
                weights=()) -> onnx.ModelProto:
    """Make every graph input static, from `shapes` (by input name or by symbolic dim name).
    `weights`: inputs that are really initializers (split_weights), not the model's inputs."""
    shapes = dict(shapes or {})
    for key, val in shapes.items():
        if any(int(d) < 0 for d in val):
            raise ShapeError(f"--shape {key}={'x'.join(map(str, val))}: dims must be 0 or more (only the value of a "
                             "scalar int input may be negative)")
    init_names = {i.name for i in model.graph.initializer} | set(weights)
    inputs = [i for i in model.graph.input if i.name not in init_names]
    input_names = [i.name for i in inputs]
    for vi in list(inputs) + list(model.graph.output):
        if not vi.type.HasField("tensor_type"):
            raise UnsupportedDtypesError(
                f"{'input' if vi in inputs else 'output'} {vi.name!r} of {source} is a {vi.type.WhichOneof('value')} "
                "value; dlcc compiles models whose inputs and outputs are tensors"
                + ("" if vi in inputs else " (with --fallback onnxruntime, the nodes that make it run on onnxruntime, "
                   "and it is returned as onnxruntime returns it: a list or a dict)"))
    symbols: dict[str, int] = {}
    for key, val in list(shapes.items()):
        if key not in input_names:
            if len(val) == 1 and any(
                d.dim_param == key for i in inputs for d in i.type.tensor_type.shape.dim
            ):
                symbols[key] = val[0]
                del shapes[key]
            else:
                raise ShapeError(
                    f"--shape names {key!r}, which is neither an input of {source} nor one of its symbolic "
                    f"dims; inputs are: {', '.join(input_names) or '(none)'}"
                )
    # Symbols bound through a named input apply to every input sharing them (batch, seq, ...).
    for inp in inputs:
        if inp.name in shapes:
            dims = inp.type.tensor_type.shape.dim
            want = shapes[inp.name]
            if len(dims) != len(want):
                raise ShapeError(
                    f"--shape {inp.name}: the input has rank {len(dims)}, the binding gives {len(want)} dims"
                )
            for d, w in zip(dims, want):
                if d.dim_param and not _anonymous(d.dim_param):
                    symbols.setdefault(d.dim_param, w)
    for inp in inputs:
        tt = inp.type.tensor_type
        if not tt.HasField("shape"):
            if inp.name not in shapes:
                raise UnboundDimError(f"input {inp.name!r} of {source} has no shape at all; bind it with --shape "
                                      f"{inp.name}=...")
            for _ in shapes[inp.name]:
                tt.shape.dim.add()
        want = shapes.get(inp.name)
        for k, d in enumerate(tt.shape.dim):
            if want is not None:
                if d.HasField("dim_value") and d.dim_value > 0 and d.dim_value != want[k]:
                    raise ShapeError(
                        f"--shape {inp.name}: dim {k} is fixed to {d.dim_value} in the model, the binding says {want[k]}"
                    )
                d.Clear()
                d.dim_value = want[k]
            elif d.HasField("dim_value") and d.dim_value > 0:
                continue
            elif d.dim_param and not _anonymous(d.dim_param) and d.dim_param in symbols:
                value = symbols[d.dim_param]
                d.Clear()
                d.dim_value = value
            elif d.HasField("dim_value") and d.dim_value == 0:
                raise UnboundDimError(
                    f"input {inp.name!r} of {source} has dim {k} of size 0, which exporters also write for a "
                    f"dynamic dim; bind it (to 0 for an empty input) with --shape {inp.name}=" + "x".join(
                        str(x.dim_value) if x.HasField("dim_value") and x.dim_value > 0 else "N" for x in tt.shape.dim))
            else:
                label = f"'{d.dim_param}'" if d.dim_param else "(unnamed)"
                raise UnboundDimError(
                    f"input {inp.name!r} of {source} has a dynamic dim {k} {label}; dlcc compiles static shapes, "
                    f"so bind it, e.g. --shape {inp.name}=" + "x".join(
                        str(x.dim_value) if x.HasField("dim_value") and x.dim_value > 0 else "N" for x in tt.shape.dim
                    ) + _other_unbound(inputs, shapes, symbols, d.dim_param)
                )
    # Stale intermediate shapes would fight the new bindings during inference; so would outputs
    # declared with -1 dims (paddle2onnx): those become unknown and are inferred.
    del model.graph.value_info[:]
    for out in model.graph.output:
        for d in out.type.tensor_type.shape.dim:
            if (d.HasField("dim_value") and d.dim_value <= 0) or (d.dim_param and _anonymous(d.dim_param)):
                d.Clear()
    return model


#: How long onnxruntime's folding of one model may take before the import goes on without it.
FOLD_TIMEOUT_S = 300


def _other_unbound(inputs, shapes, symbols, first: str) -> str:
    """The rest of an unbound-dim error: every other named dim left unbound, all at once, with
    the binding of each by name (an LLM export has five: batch, sequence, past, total, head)."""
    names: list[str] = []
    for inp in inputs:
        if inp.name in shapes or not inp.type.tensor_type.HasField("shape"):
            continue
        for d in inp.type.tensor_type.shape.dim:
            p = d.dim_param
            if p and not _anonymous(p) and p not in symbols and p != first and p not in names:
                names.append(p)
    if not names:
        return ""
    every = ([first] if first and not _anonymous(first) else []) + names
    return (f". Unbound too: {', '.join(map(repr, names))}; bind each named dim once for every input: "
            + " ".join(f"--shape {n}=N" for n in every))


def _lower_late(model: onnx.ModelProto, lenient, weights, path) -> tuple[onnx.ModelProto, list[str], set[str]]:
    """The quantization ops and GroupQueryAttention rewritten, in turns: an int4 LLM alternates
    them (MatMulNBits, GroupQueryAttention, MatMulNBits, ...), and each waits for the ranks of
    the other's outputs, which onnx's inference does not know. Where neither can go on, the
    strict rewrites say why. Returns the model, notes and the quantized nodes made."""
    from .fused_ops import LATE, lower_fused
    from .quantized import is_quantized_op, lower_quantized

    def left(m) -> int:
        return sum(1 for n in m.graph.node if (n.domain == "com.microsoft" and n.op_type in LATE) or is_quantized_op(n))

    notes: list[str] = []
    kept: set[str] = set()
    while left(model):
        before = left(model)
        model, more = lower_fused(model, lenient, weights, path, late=True, partial=True)
        notes += more
        model, more, made = lower_quantized(model, lenient, weights, path, partial=True)
        notes += more
        kept |= made
        if left(model) == before:  # neither could go on: the strict rewrites say why (and raise)
            lower_fused(model, lenient, weights, path, late=True)
            lower_quantized(model, lenient, weights, path)
            break
    return model, notes, kept


#: The ONNX element types of float16 and bfloat16 (ir.HALF_FLOATS as dtype names).
HALF_TYPES = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


def _has_half_floats(model: onnx.ModelProto) -> bool:
    """Whether the main graph holds a float16 or bfloat16 value: a typed input, output or value,
    an initializer, a Constant, or a Cast to either."""
    g = model.graph
    return (any(vi.type.tensor_type.elem_type in HALF_TYPES for vi in list(g.input) + list(g.output) + list(g.value_info))
            or any(t.data_type in HALF_TYPES for t in g.initializer)
            or any(a.i in HALF_TYPES if a.name == "to" else (a.type == onnx.AttributeProto.TENSOR
                                                             and a.t.data_type in HALF_TYPES)
                   for n in g.node for a in n.attribute))


def fold_with_onnxruntime(model: onnx.ModelProto, path="model") -> onnx.ModelProto | None:
    """Constant-fold with onnxruntime ORT_ENABLE_BASIC; None if ORT cannot load the model. ORT
    runs in a worker process (isolate.py): where it crashes or hangs, the import goes on without
    its folding, with a warning, instead of dying with it."""
    from . import isolate
    from .scratch import mkdtemp

    tmp = mkdtemp("fold")
    try:
        src = os.path.join(tmp, "in.onnx")
        dst = os.path.join(tmp, "out.onnx")
        large = _approx_bytes(model) > 1_800_000_000
        onnx.save(model, src, save_as_external_data=large)
        status = isolate.run("ort_optimize", [src, dst, large], FOLD_TIMEOUT_S)
        if status != "ok":
            if status != "failed":
                warnings.warn(f"dlcc: onnxruntime {status} while folding the constants of {path}; dlcc folds them "
                              f"itself (the compile goes on)", stacklevel=2)
            return None
        out = onnx.load(dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if any(n.domain not in ("", "ai.onnx") for n in out.graph.node) and not any(
        n.domain not in ("", "ai.onnx") for n in model.graph.node
    ):
        return None  # ORT introduced contrib ops; keep the portable graph
    if _introduced_unsupported(model, out):
        return None
    return out


#: Ops whose output shape depends on their input's values. onnxruntime's constant folding leaves
#: them alone even where every input is a constant.
VALUE_SHAPED = ("NonZero", "Unique", "Compress")


def fold_value_shaped(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """Evaluate the VALUE_SHAPED nodes whose inputs are all constants, in place (_fold_nodes), and
    return the model and how many were folded. Longformer and LED export their global-attention
    indices as NonZero of a mask built from an all-ones attention mask: constants once the input
    shapes are bound, but left unfolded, so the Einsums that read them had no static shape and
    the model was refused as data-dependent."""
    return _fold_nodes(model, lambda n, consts: n.op_type in VALUE_SHAPED)


#: Ops whose value is the same whatever precision a model computes in: they move, select or
#: convert values, and do no float arithmetic. (A Cast to float16 or bfloat16 is not one: a half
#: model computes in float32, and verify's widened reference does not round there.)
EXACT_OPS = frozenset({"Cast", "CastLike", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Concat",
                       "Gather", "Slice", "Transpose", "Shape", "Size", "Expand", "ConstantOfShape", "Split"})
_FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, *HALF_TYPES})
_DRAWS = frozenset({"RandomUniformLike", "RandomNormalLike", "Bernoulli", "Multinomial"})


def fold_exact_constants(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """Evaluate, in place (_fold_nodes), the nodes of constants whose value does not depend on the
    precision they are computed in: EXACT_OPS, and any op of integer and bool constants. What a
    half model's import does instead of onnxruntime's folding (`ort_folded` in import_model says
    why that is skipped there), so that the rewrites that read a constant get one: a bfloat16
    model's OneHot whose depth is a Cast of a bfloat16 constant was refused as computed at run time
    (fuzz graph 1900099). Outputs above 1024 values are left to the lowering."""
    def exact(n: onnx.NodeProto, consts: dict) -> bool:
        to = (next((a.i for a in n.attribute if a.name == "to"), None) if n.op_type == "Cast"
              else consts[n.input[1]].data_type if n.op_type == "CastLike" and len(n.input) > 1 else None)
        return n.op_type not in _DRAWS and to not in HALF_TYPES and (n.op_type in EXACT_OPS or all(
            consts[i].data_type not in _FLOAT_TYPES for i in n.input if i))

    return _fold_nodes(model, exact, limit=1024)


def _fold_nodes(model: onnx.ModelProto, foldable, limit: int | None = None) -> tuple[onnx.ModelProto, int]:
    """Evaluate (onnx.reference) each main-graph node that `foldable(node, consts)` picks among
    those whose inputs are all constants (initializers, Constant nodes' values, and what this
    folded before them), in place: its outputs become initializers. A node whose evaluation
    fails, or that gives more than `limit` values, is kept. Returns the model and how many nodes
    were folded."""
    from .reference_ops import evaluator

    g = model.graph
    consts = {t.name: t for t in g.initializer}
    for n in g.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and len(n.attribute) == 1 \
                and n.attribute[0].name == "value":
            consts[n.output[0]] = n.attribute[0].t
    keep, folded = [], 0
    for n in g.node:
        ins = [i for i in n.input if i]
        if (n.domain in ("", "ai.onnx") and n.op_type != "Constant" and ins and all(i in consts for i in ins)
                and not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute)
                and foldable(n, consts)):
            inits = [onnx.TensorProto() for _ in dict.fromkeys(ins)]
            for t, i in zip(inits, dict.fromkeys(ins)):
                t.CopyFrom(consts[i])
                t.name = i
            mini = onnx.helper.make_model(
                onnx.helper.make_graph([n], "fold", [], [onnx.helper.make_tensor_value_info(o, 0, None) for o in n.output if o],
                                       inits),
                opset_imports=list(model.opset_import))
            try:
                values = [np.asarray(v) for v in evaluator(mini).run(None, {})]
            except Exception:  # noqa: BLE001 (left to the import's own checks)
                values = None
            if values is not None and (limit is None or all(v.size <= limit for v in values)):
                for o, v in zip([o for o in n.output if o], values):
                    consts[o] = numpy_helper.from_array(v, o)
                    g.initializer.append(consts[o])
                folded += 1
                continue
        keep.append(n)
    if folded:
        del g.node[:]
        g.node.extend(keep)
    return model, folded


def _introduced_unsupported(before: onnx.ModelProto, after: onnx.ModelProto) -> bool:
    """Whether onnxruntime's folding brought in a standard op dlcc cannot compile. onnxruntime
    inlines some function ops (Bernoulli becomes RandomUniformLike, Greater and Cast): dlcc would
    then report an op the user never wrote, so the import keeps the graph as written, and the op
    is reported, or handed to the fallback, by its own name."""
    from .expand import compilable
    from .ops.registry import supported_ops

    had = {n.op_type for n in before.graph.node}
    new = {n.op_type for n in after.graph.node if n.domain in ("", "ai.onnx")} - had
    supported = set(supported_ops())
    bad = sorted(t for t in new if not compilable(t, opset_of(after), supported))
    if bad:
        log.debug("onnxruntime's folding introduced %s, which dlcc cannot compile; folding skipped", ", ".join(bad))
    return bool(bad)


def _ort_optimize(src: str, dst: str, large: bool) -> bool:
    """onnxruntime's basic optimisation of the model at `src`, written to `dst` (a step of
    isolate.py's worker); False where onnxruntime cannot load the model (dlcc reports that itself)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = dst
    so.log_severity_level = 4  # fatal only: a model ORT cannot load is dlcc's to report
    # onnxruntime's basic level also rewrites QuantizeLinear/DequantizeLinear pairs, and not
    # exactly: its DoubleQDQPairsRemover turns Q(s1) → DQ(s1) → Q(s2) → DQ(s2) into one pair,
    # which moved a quantized ViT's outputs by 0.24 (docs/quantized.md). Folding must not change
    # what a model computes, so those rewrites are off.
    so.add_session_config_entry("session.disable_quant_qdq", "1")
    so.add_session_config_entry("session.disable_double_qdq_remover", "1")
    if large:
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "out.data")
    try:
        ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
    except Exception:
        return False
    return True


def _approx_bytes(model: onnx.ModelProto) -> int:
    """Initializer bytes (cheap), instead of ModelProto.ByteSize() which walks the whole message."""
    return sum(_tensor_bytes(t) for t in model.graph.initializer)


def _tensor_bytes(t: onnx.TensorProto) -> int:
    return len(t.raw_data) or 4 * (len(t.float_data) + len(t.int32_data)) + 8 * (len(t.int64_data) + len(t.double_data))


def infer_shapes(model: onnx.ModelProto, path, declared: bool = True) -> onnx.ModelProto:
    """onnx's strict shape inference of `model`, with the lenient retries below for what
    onnxruntime runs; anything else is one ModelError. `declared`: whether the model still has
    its declared shapes (the retry without them is made once)."""
    try:
        return shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    except Exception as e:
        msg = str(e).strip().splitlines()
        try:
            # onnx 1.23's data propagation can fail where plain inference does not: it propagates
            # an Unsqueeze'd [batch] tensor as if it were still one-dimensional, and then finds
            # its Sub with a [200] constant "invalid" (onnx-asr's Kaldi front end, which
            # onnxruntime runs). dlcc's own folder computes what propagation would have known.
            out = shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=False)
            log.debug("%s: shape inference with data propagation failed (%s); inferred without it", path,
                      msg[0] if msg else e)
            return out
        except Exception:
            pass
        from .sequences import has_sequences

        if has_sequences(model):
            # Sequence ops the import could not resolve (sequences.py) are reported as
            # unsupported, by name, with every other such op; onnx's inference of them must not
            # stop the import first with a message about types.
            log.debug("%s: strict shape inference failed on a model with sequences (%s); lenient retry", path,
                      msg[0] if msg else e)
            return shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
        if "Inferred shape and existing shape differ" in str(e) and declared and (
                len(model.graph.value_info) or any(o.type.tensor_type.HasField("shape") for o in model.graph.output)):
            # The model declares a shape its producer does not make (a graph output or a
            # value_info an exporter guessed: tf2onnx's resizes, declared at TensorFlow's size).
            # onnxruntime merges leniently and keeps what the op computes; so does dlcc, by
            # inferring without the declarations (the graph outputs keep their names and types).
            bare = onnx.ModelProto()
            bare.CopyFrom(model)
            del bare.graph.value_info[:]
            for vi in bare.graph.output:
                if vi.type.HasField("tensor_type"):
                    vi.type.tensor_type.ClearField("shape")
            log.debug("%s: a declared shape differs from the inferred one (%s); inferred without the declarations",
                      path, msg[0] if msg else e)
            try:
                return infer_shapes(bare, path, declared=False)
            except ModelError:
                pass  # (the conflict is not the declarations': the first error is the one to report)
        if _in_function_body(str(e), opset_of(model)):
            # onnx's inference of an op defined by a function body can fail inside that body
            # (MeanVarianceNormalization's Constant, onnx 1.23): the op's own fault, not the
            # model's. Infer leniently; what stays unknown is inferred per node (_fold_and_infer).
            log.debug("%s: strict shape inference failed inside a function body (%s); lenient retry", path,
                      msg[0] if msg else e)
            return shape_inference.infer_shapes(model, check_type=True, strict_mode=False, data_prop=True)
        raise ModelError(f"{path}: ONNX shape inference failed: {msg[0] if msg else e}") from None


def _in_function_body(error: str, opset: int) -> bool:
    """Whether a strict-inference error is nested in a standard op that onnx defines by a function."""
    m = re.search(r"\(op_type:(\w+)\): \[ShapeInferenceError\] Inference error\(s\): \(op_type:", error)
    if not m:
        return False
    try:
        schema = onnx.defs.get_schema(m.group(1), opset)
    except Exception:
        return False
    return bool(schema.has_function or schema.has_context_dependent_function)


def _anonymous(dim_param: str) -> bool:
    """'?' and '-1' (paddle2onnx, some tf2onnx exports) mean "unknown", not a symbol shared between
    inputs: such a dim is bound per input, as onnxruntime treats it."""
    return dim_param.strip() in ("?", "-1", "")


def _tensor_type_info(vi: onnx.ValueInfoProto, path="model"):
    tt = vi.type.tensor_type
    try:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name if tt.elem_type else None
    except KeyError:
        raise ModelError(f"{path}: value {vi.name!r} has element type {tt.elem_type}, which is no ONNX data "
                         "type") from None
    if not tt.HasField("shape"):
        return None, dtype
    dims = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        else:
            return None, dtype
    return tuple(dims), dtype


def _mini_model(graph: Graph, node: Node, widen: bool = False) -> tuple[onnx.ModelProto, dict]:
    """A one-node model: constant inputs as initializers, the rest as typed graph inputs. With
    `widen`, float16 and bfloat16 inputs are float32 and a Cast to either is a Cast to float32:
    the node as promote_half has the runtime compute it."""
    ins = [i for i in node.inputs if i]
    feeds, vis, inits = {}, [], []
    for i in dict.fromkeys(ins):
        t = graph.tensors[i]
        dtype = "float32" if widen and t.dtype in HALF_FLOATS else t.dtype
        if t.value is not None:
            feeds[i] = np.asarray(t.value).astype(dtype)
            inits.append(numpy_helper.from_array(feeds[i], i))
        vis.append(onnx.helper.make_tensor_value_info(i, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), t.shape))
    outs = [onnx.helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.outputs if o]
    attrs = dict(node.attrs)
    if widen and node.op_type == "Cast" and attrs.get("to") in HALF_TYPES:
        attrs["to"] = onnx.TensorProto.FLOAT
    onode = onnx.helper.make_node(node.op_type, node.inputs, node.outputs, domain=node.domain or None, **attrs)
    g = onnx.helper.make_graph([onode], "one", vis, outs, inits)
    return onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", graph.opset)]), feeds


_NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                     "Bernoulli"}


def _gathernd_shape(graph: Graph, node: Node) -> tuple:
    data, idx = (graph.tensors[i].shape for i in node.inputs[:2])
    return _gathernd_out(data, idx, int(node.attrs.get("batch_dims", 0)))


def _gathernd_out(data: tuple, idx: tuple, batch_dims: int) -> tuple:
    return tuple(idx[:-1]) + tuple(data[batch_dims + idx[-1]:])


def complete_open_shapes(model: onnx.ModelProto, infer) -> onnx.ModelProto:
    """`model` inferred by `infer`, with the outputs onnx leaves shapeless that `_SHAPE_RULES` covers
    on the built graph (a GatherND with a rank-0 result: the one op it holds) given their shape
    here too, and inferred again so that what reads them is shaped too. The rewrites before the graph is built (spectral.py's DFT, which
    sizes its basis by its input) see the shapes the built graph will have."""
    out = infer(model)
    for _ in range(8):
        g = out.graph
        typed = {vi.name: vi.type.tensor_type for vi in [*g.input, *g.value_info, *g.output]}
        dims = {n: tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
                for n, tt in typed.items() if tt.HasField("shape")}
        dims.update({t.name: tuple(t.dims) for t in g.initializer})
        elem = {n: tt.elem_type for n, tt in typed.items()}
        elem.update({t.name: t.data_type for t in g.initializer})
        added = []
        for n in g.node:
            if n.domain in ("", "ai.onnx") and n.op_type == "GatherND" and len(n.input) >= 2 \
                    and n.output[0] not in dims and all(i in dims and None not in dims[i] for i in n.input[:2]):
                b = next((int(onnx.helper.get_attribute_value(a)) for a in n.attribute if a.name == "batch_dims"), 0)
                shape = _gathernd_out(dims[n.input[0]], dims[n.input[1]], b)
                added.append(onnx.helper.make_tensor_value_info(n.output[0], elem.get(n.input[0], 0), list(shape)))
        if not added:
            return out
        names = {vi.name for vi in added}
        model = onnx.ModelProto()
        model.CopyFrom(out)
        keep = [vi for vi in model.graph.value_info if vi.name not in names]
        del model.graph.value_info[:]
        model.graph.value_info.extend(keep + added)
        out = infer(model)
    return out


def _maxunpool_shape(graph: Graph, node: Node) -> tuple | None:
    """MaxUnpool's `output_shape` input, when it is a constant (onnx's inference reads only its
    shape, not its values)."""
    if len(node.inputs) < 3 or not node.inputs[2]:
        return None
    v = graph.tensors[node.inputs[2]].value
    return tuple(int(d) for d in np.asarray(v).reshape(-1)) if v is not None else None


def _resize_shape(graph: Graph, node: Node, opset: int) -> tuple | None:
    """onnxruntime's output shape for a Resize (or Upsample) by constant scales: each dim is
    `int(scale * dim)` multiplied in float32 (UpsampleBase::ComputeOutputShape). onnx's inference
    floors the float64 product instead, so where the float32 product rounds up to a whole number
    (13 / 7 stored as 1.8571428f, times 7: 12.9999996 in float64, 13.0 in float32) it says one
    less than onnxruntime makes. tf2onnx writes such scales for every Keras resize to a size that
    is not a multiple of the input's. None where the sizes input decides, or a value is unknown."""
    x = graph.tensors.get(node.inputs[0]) if node.inputs else None
    if x is None or x.shape is None or any(d is None for d in x.shape):
        return None
    if node.op_type == "Upsample" and "scales" in node.attrs:
        scales = np.asarray(node.attrs["scales"], np.float32)
    else:
        k = 2 if node.op_type == "Resize" and opset >= 11 else 1
        if node.op_type == "Resize" and opset >= 11 and len(node.inputs) > 3 and node.inputs[3]:
            sizes = graph.tensors.get(node.inputs[3])
            if sizes is None or sizes.value is None or np.asarray(sizes.value).size:
                return None
        t = graph.tensors.get(node.inputs[k]) if len(node.inputs) > k and node.inputs[k] else None
        if t is None or t.value is None or not np.asarray(t.value).size:
            return None
        scales = np.asarray(t.value, np.float32).reshape(-1)
    r = len(x.shape)
    axes = node.attrs.get("axes")
    axes = list(range(r)) if axes is None else [int(a) % r for a in axes]
    if len(axes) != scales.size or not np.all(np.isfinite(scales)) or np.any(scales <= 0):
        return None  # (the op's own checks say what is wrong)
    full = np.ones(r, np.float32)
    full[axes] = scales
    with np.errstate(over="ignore"):
        dims = full * np.asarray(x.shape, np.float32)
    if not np.all(dims < 2.0 ** 62):
        return None
    return tuple(int(d) for d in dims)


#: Output shapes that onnx 1.23's shape inference leaves open, from the input shapes (and constant
#: values): a GatherND with a rank-0 result (indices of shape [rank of data]), and a MaxUnpool
#: given `output_shape`. A rule returns None where it cannot tell either.
_SHAPE_RULES = {"GatherND": _gathernd_shape, "MaxUnpool": _maxunpool_shape}


def _fold_and_infer(graph: Graph) -> None:
    """Walk the nodes in order: fold those whose inputs are all known values (onnx.reference), and
    infer the output shapes that whole-model inference left open (they often become known once a
    shape subgraph is folded). Shapes of static tensors fold `Shape` and `Size` directly."""
    from .reference_ops import evaluator

    keep: list[Node] = []
    declared = set(graph.outputs)
    stale: set[str] = set()  # tensors shaped from a Resize whose shape was corrected, to infer again
    for node in graph.nodes:
        if stale & set(node.inputs):
            for o in node.outputs:
                if o and graph.tensors[o].value is None:
                    graph.tensors[o].shape = None
                    stale.add(o)
        ins = [i for i in node.inputs if i]
        known = all(graph.tensors.get(i) is not None and graph.tensors[i].shape is not None for i in ins)
        if node.domain == "" and node.op_type in ("Shape", "Size") and known:
            t = graph.tensors[node.inputs[0]]
            if node.op_type == "Size":
                val = np.array(t.size, dtype=np.int64)
            else:
                val = np.array(t.shape, dtype=np.int64)[node.attrs.get("start", 0):node.attrs.get("end", None)]
            _set_value(graph.tensors[node.outputs[0]], val)
            continue
        if node.domain == "" and node.op_type not in _NONDETERMINISTIC and ins and all(graph.is_const(i) for i in ins):
            # A float16 or bfloat16 model computes in float32 (promote_half), and so do the nodes
            # folded here: a constant rounded to the half type where the same node at run time
            # is not would differ from the run, and from verify's reference, by half an ulp of the
            # half type (the bf16-model fuzz run found a folded PRelu). A graph output keeps its
            # type, rounded once, as promote_half's Cast at the boundary rounds it.
            to_half = node.op_type == "Cast" and node.attrs.get("to") in HALF_TYPES
            widen = to_half or any(graph.tensors[i].dtype in HALF_FLOATS for i in ins)
            try:
                m, feeds = _mini_model(graph, node, widen=widen)
                results = evaluator(m).run(None, feeds)
                for o, v in zip([o for o in node.outputs if o], results):
                    v = np.asarray(v)
                    if o in declared and graph.tensors[o].dtype in HALF_FLOATS and v.dtype == np.float32:
                        # (a node whose inputs were widened by an earlier fold is computed in
                        # float32 without widening anything itself: the output's type decides)
                        v = v.astype(SUPPORTED_DTYPES[graph.tensors[o].dtype])
                    _set_value(graph.tensors[o], v)
                continue
            except Exception:
                pass
        # A graph output's shape is the model's declaration, which can be wrong (an exporter's
        # guess, or a model edited by hand); a kernel sized by the declaration but fed by its
        # inputs wrote past the output's buffer. As onnxruntime does, the shape its producer
        # computes wins.
        if known and any(o and (graph.tensors[o].shape is None or o in declared) for o in node.outputs):
            try:
                m, _ = _mini_model(graph, node)
                inferred = shape_inference.infer_shapes(m, data_prop=True).graph.output
                for vi in inferred:
                    shape, dtype = _tensor_type_info(vi)
                    t = graph.tensors[vi.name]
                    if shape is not None and (t.shape is None or vi.name in declared):
                        t.shape = shape
                    if dtype is not None:
                        t.dtype = dtype
            except Exception:
                pass
        rule = _SHAPE_RULES.get(node.op_type) if node.domain == "" else None
        if known and rule and node.outputs[0] and graph.tensors[node.outputs[0]].shape is None:
            graph.tensors[node.outputs[0]].shape = rule(graph, node)
        if known and node.domain == "" and node.op_type in ("Resize", "Upsample") and node.outputs[0]:
            t = graph.tensors[node.outputs[0]]
            ort_shape = _resize_shape(graph, node, graph.opset)
            if ort_shape is not None and t.shape is not None and tuple(t.shape) != ort_shape:
                t.shape = ort_shape
                stale.add(node.outputs[0])
        keep.append(node)
    graph.nodes = keep


def _set_value(t: Tensor, val: np.ndarray) -> None:
    """A folded value, with its shape and dtype at once: a later node whose shape inference needs
    this tensor (a ReduceMean's axes from a folded Range) sees it as known."""
    t.value, t.shape, t.dtype = val, tuple(val.shape), val.dtype.name


def promote_half(graph: Graph, float64: bool = False) -> None:
    """float16 and bfloat16 models compute in float32: 16-bit tensors stay so only at the model's
    boundary. With `float64` (a precision asked for: compiler.import_checked), float64 tensors are
    narrowed the same way, as OpenVINO runs float64 models in float32; without it a float64 tensor
    is refused wherever a node other than a Cast or a view reads or writes it (dtype_problems).

    Constants are widened once at compile time (exactly: every 16-bit float is a float32), graph
    inputs get a Cast to float32 and graph outputs a Cast back to their own 16-bit type, and Casts
    to a 16-bit float inside the graph become Casts to float32. Kernels therefore only ever compute
    in float; 16-bit types appear as storage in the boundary Casts (LOAD_F16 / STORE_F16 and
    LOAD_BF16 / STORE_BF16 in the dialect). At precision fp16 or bf16, ops/narrow.py stores the
    GEMM and Conv weights in the half type again, so those keep the model's bytes.
    """
    narrow = HALF_FLOATS + (("float64",) if float64 else ())
    if not any(t.dtype in narrow for t in graph.tensors.values()):
        return
    boundary = set(graph.inputs) | set(graph.outputs)
    inside = [t for t in graph.tensors.values() if t.dtype in narrow and t.name not in boundary]
    if float64 and any(t.dtype == "float64" for t in graph.tensors.values()):
        graph.notes.append(f"import: float64 computes in float32 (a precision was asked for): "
                           f"{sum(t.dtype == 'float64' for t in inside)} float64 tensor(s) narrowed; the model's "
                           "float64 inputs and outputs keep their type")
    for t in inside:
        if t.value is not None:
            t.value = t.value.astype(np.float32)
        t.dtype = "float32"
    wide = set(HALF_TYPES) | ({onnx.TensorProto.DOUBLE} if float64 else set())
    for n in graph.nodes:
        if n.op_type == "Cast" and n.attrs.get("to") in wide and n.outputs[0] not in boundary:
            n.attrs["to"] = onnx.TensorProto.FLOAT
        elif float64 and n.attrs.get("dtype") == onnx.TensorProto.DOUBLE:  # EyeLike, RandomNormal, ...
            n.attrs["dtype"] = onnx.TensorProto.FLOAT

    def rename(old: str, new: str) -> None:
        for n in graph.nodes:
            n.inputs = [new if i == old else i for i in n.inputs]
            n.outputs = [new if o == old else o for o in n.outputs]

    head, tail = [], []
    for name in graph.inputs:
        t = graph.tensors[name]
        if t.dtype in narrow:
            wide = f"%f32:{name}"
            graph.tensors[wide] = Tensor(wide, t.shape, "float32")
            for n in graph.nodes:
                n.inputs = [wide if i == name else i for i in n.inputs]
            head.append(Node("Cast", f"%widen:{name}", [name], [wide], {"to": onnx.TensorProto.FLOAT}))
    for name in graph.outputs:
        t = graph.tensors[name]
        if t.dtype in narrow and name not in graph.inputs and t.value is None:
            wide = f"%f32:{name}"
            graph.tensors[wide] = Tensor(wide, t.shape, "float32")
            rename(name, wide)
            to = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(SUPPORTED_DTYPES[t.dtype]))
            tail.append(Node("Cast", f"%narrow:{name}", [wide], [name], {"to": to}))
    graph.nodes = head + graph.nodes + tail


def _eliminate_dead(graph: Graph) -> None:
    live = set(graph.outputs)
    kept = []
    for node in reversed(graph.nodes):
        if any(o in live for o in node.outputs):
            kept.append(node)
            live.update(i for i in node.inputs if i)
    graph.nodes = list(reversed(kept))


def import_model(path: str | os.PathLike, shapes: ShapeBindings | None = None, fold: bool = True,
                 float64: bool = False) -> Graph:
    """ONNX file → static-shaped, folded Graph. Raises DlccError subclasses on bad input.
    `float64`: compute float64 in float32 (promote_half)."""
    path = Path(path)
    model = load_model(path)
    source_nodes = len(model.graph.node)
    # The signature is the original model's: folding may drop initializers that old (IR < 4)
    # models also list as graph inputs, and those must not turn into required inputs.
    orig_init = {i.name for i in model.graph.initializer}
    signature = [i.name for i in model.graph.input if i.name not in orig_init]
    declared = {o.name: tuple(d.dim_value if d.HasField("dim_value") else None for d in o.type.tensor_type.shape.dim)
                for o in model.graph.output if o.type.tensor_type.HasField("shape")}
    weights = split_weights(model, path)
    # A large forest waits outside the model until its rewrite (large_attributes.py says why).
    from .large_attributes import stash_forests

    forests = stash_forests(model, path)

    def lenient(m: onnx.ModelProto) -> onnx.ModelProto:
        # A branch not taken may not type-check at these shapes until it is dropped.
        return complete_open_shapes(
            m, lambda x: shape_inference.infer_shapes(x, check_type=False, strict_mode=False, data_prop=True))

    # onnxruntime's fused ops become standard ops first (fused_ops.py): two of them sit in the
    # ONNX domain, where the checker rejects them.
    from .fused_ops import PADDED_QUERIES_UNSPECIFIED, lower_fused

    full_masks = any(n.domain == "com.microsoft" and n.op_type in PADDED_QUERIES_UNSPECIFIED for n in model.graph.node)
    model, fused_notes = lower_fused(model, lenient, weights, path)
    # Bernoulli as a draw and plain ops, before onnxruntime's folding inlines onnx's body for it
    # (which inverts its probability: random_draws.py).
    from .random_draws import rewrite_compound

    model, more = rewrite_compound(model)
    fused_notes += more
    check_model(model, path)
    model, more = upgrade_legacy_opset(model, path)
    fused_notes += more
    model = skip_exact_widenings(model)
    shapes, bound_values = bind_values(model, shapes, weights)
    model = bind_shapes(model, shapes, source=str(path), weights=weights)
    # Attributes are checked on the model as written: onnxruntime's folding below fuses a
    # BatchNormalization into the Conv before it, inf or NaN weights included.
    from .ops.checks import check_attributes

    from .control_flow import branches_do_not_type_check, check_selects, has_if, inline_ifs
    from .loops import MAX_CHAINED, MAX_DEPTH as MAX_LOOP_DEPTH, has_loop, unroll_loops
    from .sequences import resolve_sequences
    from .quantized import lower_quantized
    from .spectral import lower_spectral

    # Ifs whose condition is known now (a constant, a bound value, a shape test) are inlined
    # before onnxruntime folds anything (control_flow.inline_ifs says why).
    model, notes, _ = inline_ifs(model, path, lenient, computed=False)
    notes = fused_notes + notes
    try:
        shaped = infer_shapes(model, path)
    except ModelError:  # reported below, after folding, where folding does not cure it
        shaped = model
    check_attributes(_attribute_view(shaped, path), path)

    def ort_folded(m: onnx.ModelProto) -> onnx.ModelProto | None:
        """onnxruntime's folding of `m` where it is asked for and `m` is not a half model: there
        onnxruntime folds and fuses (a BatchNormalization into the Conv before it) in the model's
        float16, and the fused weights rounded to float16 put a float16 model at fp32 3.5% off on
        small outputs (fuzz graph 950025), where a half model computes in float32 (promote_half).
        dlcc's own folder does it in float32 (_fold_and_infer)."""
        return None if not fold or _has_half_floats(m) else fold_with_onnxruntime(m, path)

    if fold:
        folded = ort_folded(model)
        if folded is not None:
            model = folded
        for _ in range(4):  # what reads a folded NonZero is foldable now, and may feed another
            if folded is None:  # (a half model: its exact arithmetic on constants, by dlcc)
                model, _ = fold_exact_constants(model)
            model, more = fold_value_shaped(model)
            if not more:
                break
            model = ort_folded(model) or model
    # STFT and DFT become products with a Fourier basis (spectral.py), before strict inference,
    # which gets a rank-2 STFT wrong; after folding, which makes a computed window a constant.
    model, more, float32_nodes = lower_spectral(model, lenient, weights, path)
    notes += more
    # Quantization ops become float32 arithmetic (quantized.py), after folding for the same
    # reason: a scale or zero point the model computes from constants is a constant by then; so
    # does GroupQueryAttention (fused_ops.LATE), whose cache's form depends on a length the
    # model computes from a shape.
    model, more, kept = _lower_late(model, lenient, weights, path)
    notes += more
    float32_nodes |= kept
    # Loops with a known trip count are unrolled (loops.py), and the Ifs left are if-converted;
    # a loop inside a branch, or an If inside a loop's body, surfaces for the next round.
    selects: list = []
    inlined = False
    for _ in range(MAX_LOOP_DEPTH + MAX_CHAINED):
        # (Sequences first too: a Scan over a ConcatFromSequence has a static length only once
        # the sequence is resolved. One built in a loop's body waits for the unrolling below.)
        model, more = resolve_sequences(model, lenient)
        notes += more
        model, more, left = unroll_loops(model, path, lenient)
        notes += more
        if left:  # a loop counts what an unrolled one gave: fold the arithmetic between them
            model = ort_folded(model) or (fold_exact_constants(model)[0] if fold else model)
        model, more = resolve_sequences(model, lenient)
        notes += more
        # (Leniently while computed Ifs remain: their branches may differ in shape, which the
        # if-conversion below reports in its own words.)
        model = lenient(model) if has_if(model) else infer_shapes(model, path)
        model, more, chosen = inline_ifs(model, path, lenient)
        notes += more
        selects += chosen
        inlined = inlined or bool(more)
        if not has_loop(model):
            break
    else:
        raise UnsupportedControlFlowError(f"{path}: loops nest or follow from each other's outputs more than "
                                          f"{MAX_LOOP_DEPTH + MAX_CHAINED} deep; dlcc unrolls at most that many")
    if inlined:
        try:
            model = infer_shapes(model, path)
        except ModelError as e:
            if not selects:
                raise
            raise branches_do_not_type_check(path, selects, e) from None
    opset = opset_of(model)
    from .composite import lower_composite
    from .expand import MAX_ROUNDS, expand_functions
    from .ops.registry import supported_ops

    lowered = set(supported_ops())
    # Ops dlcc writes as other standard ops (composite.py), now that the shapes are static.
    model, more = lower_composite(model, lenient, weights, path, lowered, float64=float64, forests=forests)
    if more:
        notes += more
        model = infer_shapes(model, path)
        opset = opset_of(model)  # (raised for the ai.onnx.ml ops of an old model)
    for _ in range(MAX_ROUNDS):  # ops onnx defines by a function body, when dlcc has no lowering
        if not expand_functions(model, lowered, opset):
            break
        model = infer_shapes(model, path)
    g = model.graph

    tensors: dict[str, Tensor] = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        shape, dtype = _tensor_type_info(vi, path)
        if dtype is not None:
            tensors[vi.name] = Tensor(vi.name, shape if shape is not None else None, dtype)  # type: ignore[arg-type]
    for init in g.initializer:
        arr = tensor_value(init, path)
        tensors[init.name] = Tensor(init.name, tuple(arr.shape), arr.dtype.name, arr)
    for name, arr in weights.items():
        tensors[name] = Tensor(name, tuple(arr.shape), arr.dtype.name, arr)
    nodes: list[Node] = []
    for k, n in enumerate(g.node):
        attrs = node_attributes(n, k, path)
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            m = onnx.helper.make_model(onnx.helper.make_graph([n], "c", [], [onnx.helper.make_tensor_value_info(n.output[0], 0, None)]),
                                       opset_imports=[onnx.helper.make_opsetid("", opset)])
            from .reference_ops import evaluator

            try:
                val = np.asarray(evaluator(m).run(None, {})[0])
            except Exception as e:  # a value attribute whose data does not match its dims or type
                raise ModelError(f"{path}: Constant node {n.name or n.output[0]!r} cannot be evaluated: "
                                 f"{first_line(e)}") from None
            tensors[n.output[0]] = Tensor(n.output[0], tuple(val.shape), val.dtype.name, val)
            continue
        nodes.append(Node(n.op_type, n.name or f"{n.op_type}_{k}", list(n.input), list(n.output), attrs, n.domain))
        for o in n.output:
            if o and o not in tensors:
                tensors[o] = Tensor(o, None, "float32")  # type: ignore[arg-type]
    graph = Graph(
        name=g.name or path.stem,
        nodes=nodes,
        tensors=tensors,
        inputs=[n for n in signature if n in tensors],
        outputs=[o.name for o in g.output],
        opset=opset,
        source_node_count=source_nodes,
        notes=notes,
        bound_values=bound_values,
        float32_nodes=float32_nodes,
        full_masks=full_masks,
    )
    _fold_and_infer(graph)
    _warn_declared_outputs(graph, declared, path)
    check_selects(graph, selects, path)
    for t in graph.tensors.values():
        if t.value is not None:
            t.shape = tuple(t.value.shape)
            t.dtype = t.value.dtype.name
    from .held_types import hold

    hold(graph)
    promote_half(graph, float64)
    _eliminate_dead(graph)
    return graph


def _warn_declared_outputs(graph: Graph, declared: dict, path) -> None:
    """A graph output whose declared dims differ from what its producer makes is run at the shape
    computed, as onnxruntime runs it (it warns and merges leniently); say so, since a program
    sized by the declaration would read a different shape. An exporter's wrong guess (a reshaped
    output) or a model edited by hand: outputs are never sized by the declaration, which once let
    a kernel write past its buffer."""
    for name in graph.outputs:
        want, t = declared.get(name), graph.tensors.get(name)
        if want is None or t is None or t.shape is None or len(want) != len(t.shape):
            continue
        if any(w not in (None, 0) and w != d for w, d in zip(want, t.shape)):
            shown = "x".join("?" if w in (None, 0) else str(w) for w in want)
            warnings.warn(f"dlcc: {Path(path).name}: output {name!r} is declared {shown} but its producer makes "
                          f"{'x'.join(map(str, t.shape))}; it is returned at the shape computed, as onnxruntime does")


def _attribute_view(model: onnx.ModelProto, path="model") -> Graph:
    """A light Graph of `model` for ops/checks.py: nodes with their attributes, tensors with the
    shapes shape inference gave, and the values of small constants only (a check reads a
    variance, split sizes, K or scales, never a weight)."""
    g = model.graph
    tensors: dict[str, Tensor] = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        shape, dtype = _tensor_type_info(vi, path)
        if dtype is not None:
            tensors[vi.name] = Tensor(vi.name, shape, dtype)  # type: ignore[arg-type]
    small = [(i.name, i) for i in g.initializer if int(np.prod(i.dims)) <= 65536]
    small += [(n.output[0], n.attribute[0].t) for n in g.node
              if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"]
    for name, t in small:
        try:
            arr = numpy_helper.to_array(t)
        except Exception:  # external or malformed data: the loaders report it; no value here
            continue
        tensors[name] = Tensor(name, tuple(arr.shape), arr.dtype.name, arr)
    nodes = [Node(n.op_type, n.name or f"{n.op_type}_{k}", list(n.input), list(n.output),
                  node_attributes(n, k, path), n.domain)
             for k, n in enumerate(g.node)]
    return Graph(name=g.name, nodes=nodes, tensors=tensors, inputs=[], outputs=[o.name for o in g.output],
                 opset=opset_of(model))


def tensor_value(t: onnx.TensorProto, path, what: str = "initializer") -> np.ndarray:
    """The array of TensorProto `t`; a ModelError naming it where its data does not match its dims
    or its type (raw data of the wrong length, an unknown data_type, segments): the checker lets
    those through, and numpy's ValueError named nothing."""
    try:
        return numpy_helper.to_array(t)
    except Exception as e:
        raise ModelError(f"{path}: {what} {t.name!r} cannot be read (data_type {t.data_type}, dims {list(t.dims)}): "
                         f"{first_line(e)}") from None


def _text(v):
    """Attribute strings as str: bytes that are not UTF-8 keep their place as U+FFFD, so a check
    names the value (\"direction '\ufffd' is not ...\") instead of raising UnicodeDecodeError."""
    if isinstance(v, bytes):
        return v.decode("utf-8", errors="replace")
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [x.decode("utf-8", errors="replace") for x in v]
    return v


def node_attributes(n: onnx.NodeProto, k: int, path) -> dict:
    """Node `n`'s attributes by name, with a ModelError naming the node and the attribute where
    one cannot be read: a reference to a function's attribute outside any function, a value of
    a type the field does not hold."""
    out = {}
    for a in n.attribute:
        where = f"{path}: {n.op_type} node {n.name or f'{n.op_type}_{k}'!r}: attribute {a.name!r}"
        if a.ref_attr_name:
            raise ModelError(f"{where} refers to {a.ref_attr_name!r}, an attribute of a function, outside any "
                             "function body")
        try:
            out[a.name] = _text(onnx.helper.get_attribute_value(a))
        except Exception as e:
            raise ModelError(f"{where} cannot be read: {first_line(e)}") from None
    return out


def check_static(graph: Graph, path) -> None:
    """Every tensor a node produces must have a static shape by now (after binding and folding)."""
    for node in graph.nodes:
        for o in node.outputs:
            if o and graph.tensors[o].shape is None:
                _check_shapes_fit(graph, node, path)
                raise DynamicShapeError(
                    f"{path}: the shape of {o!r} (output of {node.op_type} node {node.name!r}) is unknown at compile "
                    "time even with every input shape bound; it depends on tensor values computed at run time "
                    "(data-dependent shapes are not supported: dlcc compiles static shapes)", tensor=o
                )
            if o and any(d < 0 for d in graph.tensors[o].shape):
                # onnx shape inference computes a pooling or convolution window larger than its
                # padded input as a negative dim, and does not object
                raise ShapeError(
                    f"{path}: the shape of {o!r} (output of {node.op_type} node {node.name!r}) comes out as "
                    f"{list(graph.tensors[o].shape)}: a negative dim (is a kernel or window larger than its input?)"
                )


def _check_shapes_fit(graph: Graph, node: Node, path) -> None:
    """A node whose input shapes are all known but whose output shape is not: where onnx's strict
    shape inference rejects those inputs (a MatMul's batch dims that do not broadcast: a model
    onnxruntime refuses to load too), that is the error, not a data-dependent shape."""
    ins = [i for i in node.inputs if i]
    if node.domain not in ("", "ai.onnx") or not all(graph.tensors[i].shape is not None for i in ins):
        return
    try:
        m, _ = _mini_model(graph, node)
        shape_inference.infer_shapes(m, strict_mode=True, data_prop=True)
    except Exception as e:  # noqa: BLE001 (any rejection is the answer)
        shapes = ", ".join(f"{i!r} {list(graph.tensors[i].shape)}" for i in ins)
        raise ShapeError(f"{path}: {node.op_type} node {node.name!r} cannot take the shapes of its inputs ({shapes}): "
                         f"{first_line(e, 300)}") from None


#: The ops that may read or write a float64 tensor: Cast converts it exactly, and the others only
#: view or copy its bytes.
FLOAT64_OPS = ("Cast", "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze")


def dtype_problems(graph: Graph) -> list[str]:
    """Tensors with dtypes the backends cannot hold (float16, double, strings, ...)."""
    bad: dict[str, str] = {}
    for node in graph.nodes:
        for name in list(node.inputs) + list(node.outputs):
            t = graph.tensors.get(name) if name else None
            if t is not None and t.dtype not in SUPPORTED_DTYPES and t.dtype not in bad:
                # (the node's output named too: --fallback hands the node it names to onnxruntime,
                # and an unnamed node's name here is one the import made up)
                makes = next((o for o in node.outputs if o), "")
                bad[t.dtype] = (f"  dtype {t.dtype}: first seen on {name!r} at node {node.name!r}"
                                + (f", which computes {makes!r}" if makes and makes != name else ""))
            elif t is not None and t.dtype == "float64" and node.op_type not in FLOAT64_OPS and "float64" not in bad:
                bad["float64"] = (f"  dtype float64: first seen on {name!r} at node {node.name!r} (dlcc's kernels compute "
                                  f"float64 only in Casts; --precision fp32 computes this model in float32, its "
                                  "float64 inputs and outputs kept)")
    for name in graph.outputs:  # (an output folded to a constant has no node left)
        t = graph.tensors.get(name)
        if t is not None and t.dtype not in SUPPORTED_DTYPES and t.dtype not in bad:
            bad[t.dtype] = f"  dtype {t.dtype}: graph output {name!r}"
    return list(bad.values())
