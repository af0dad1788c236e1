"""What the coverage-guided fuzzer (scripts/fuzz_inputs.py, atheris) feeds untrusted bytes into,
and the structure-aware mutators it uses. Kept apart from the driver so that the regression test
(tests/test_fuzz_inputs.py) replays every saved input through the very same code without atheris.

The property is the one every input family has (issue 19): an input is accepted, or refused with a
DlccError (one paragraph, exit code 2 on the CLI). Any other exception is a bug, and so is a hang
(the driver's per-input timeout) or a runaway allocation (its RSS limit).

Targets, each taking the file's bytes:
- `onnx`: the ONNX loader as `dlcc compile` runs it (read, checker, attribute checks, shape
  binding, shape inference, function expansion, import), by default without onnxruntime's folding
  (`fold=True` adds it: slower, and onnxruntime is not ours); `depth="compile"` goes on through
  the baseline lowering and memory plan.
- `yaml`: the same bytes as a pipeline file, a device file, a `--shape` file and a batch manifest.
- `trace`: `dlcc estimate --trace`'s path: read (gzip or JSON), build the task graph, replay.

The mutators stand in for libprotobuf-mutator (whose Python binding, atheris-libprotobuf-mutator,
ships no wheel and builds only with bazel): they parse the input, change one field through the
message's own descriptors (protobuf reflection) or the JSON/YAML tree, and serialise it again, so
most mutants stay well-formed enough to reach the checks behind the parser. A mutant that does not
parse falls back to byte-level mutation (`byte_mutate`, atheris.Mutate in the driver).
"""
from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Callable

from .. import scratch
from ..errors import DlccError
from ..frontend import is_repeated_field

TARGETS = ("onnx", "yaml", "trace")

_DIR = None


def _scratch(name: str, data: bytes) -> Path:
    """`data` written to a file in one temporary folder reused by every execution (a fuzzer runs
    the target hundreds of thousands of times; a folder per run would be most of its time)."""
    global _DIR
    if _DIR is None:
        _DIR = Path(scratch.mkdtemp("fuzz"))
    p = _DIR / name
    p.write_bytes(data)
    return p


def onnx_target(data: bytes, depth: str = "load", fold: bool = False) -> None:
    from ..compiler import check_static, check_supported
    from ..frontend import import_model
    from ..ops.checks import check_attributes

    path = _scratch("model.onnx", data)
    graph = import_model(path, None, fold=fold)  # import_checked, with folding optional
    check_supported(graph)
    check_static(graph, path)
    check_attributes(graph, path)
    if depth == "compile":
        from ..compiler import compile_model

        compile_model(path, None, target="opencl", pipeline="baseline", imported=graph)


def yaml_target(data: bytes) -> None:
    from ..batch.manifest import load_manifest
    from ..config import load_device, load_pipeline, load_shape_bindings

    path = _scratch("spec.yaml", data)
    refusals = []
    for load in (load_pipeline, load_device, load_shape_bindings, load_manifest):
        try:
            load(path)
        except DlccError as e:
            refusals.append(e)
    if len(refusals) == 4:  # no loader took it: refused; one that did makes the input accepted
        raise refusals[0]


def trace_target(data: bytes) -> None:
    from ..estimate.trace_mode import estimate_trace

    estimate_trace(_scratch("trace.json", data), what_ifs=["no-launch-overhead", "fuse-elementwise"] if len(data) < 200_000 else [])


def accepts(name: str, data: bytes, **kw) -> bool:
    """Run target `name` on `data`: True where the input was accepted, False where it was refused
    with a DlccError; anything else propagates (the bug the fuzzer is looking for)."""
    fn: Callable = {"onnx": onnx_target, "yaml": yaml_target, "trace": trace_target}[name]
    try:
        fn(data, **kw)
    except DlccError:
        return False
    return True


def preload() -> None:
    """Import every dlcc module a target reaches, so that the fuzzer's coverage instrumentation
    (atheris.instrument_imports, which only sees imports made inside it) covers them."""
    import importlib
    import pkgutil

    import dlcc

    for mod in pkgutil.walk_packages(dlcc.__path__, "dlcc."):
        if mod.name.startswith(("dlcc.testing", "dlcc.backends.cuda")):
            continue
        try:
            importlib.import_module(mod.name)
        except ImportError:
            pass


# -- mutation --------------------------------------------------------------------------------------

_INTS = (0, 1, -1, 2, 3, 7, 64, 255, 256, 2**31 - 1, -2**31, 2**31, 2**32, 2**63 - 1, -2**63)
_FLOATS = (0.0, -0.0, 1.0, -1.0, 1e-45, 3.4e38, 1e300, math.inf, -math.inf, math.nan)
_STRINGS = ("", "x", "[/]", "[bold]", "a" * 300, "\x00", "../../etc/passwd", "é", "0", "-1", "NaN", "%s")


def byte_mutate(data: bytes, rng: random.Random, max_size: int) -> bytes:
    """A plain byte-level mutation (flip, insert, delete, splice a number), for where no structure
    parses; the driver uses atheris.Mutate instead where it can."""
    b = bytearray(data or b"\0")
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(4)
        i = rng.randrange(len(b)) if b else 0
        if op == 0 and b:
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 2 and len(b) > 1:
            del b[i:i + rng.randint(1, 8)]
        else:
            b[i:i] = str(rng.choice(_INTS)).encode()
    return bytes(b[:max_size])


def _mutate_message(msg, rng: random.Random, depth: int = 0) -> None:
    """Change one field somewhere in protobuf message `msg`, chosen through its descriptor: a
    scalar gets an edge value, a repeated field loses, gains or duplicates an element, a
    sub-message is mutated in turn."""
    from google.protobuf.descriptor import FieldDescriptor as F

    fields = list(msg.DESCRIPTOR.fields)
    if not fields:
        return
    present = [f for f in fields if (is_repeated_field(f) and len(getattr(msg, f.name)))
               or (not is_repeated_field(f) and (f.type != F.TYPE_MESSAGE or msg.HasField(f.name)))]
    f = rng.choice(present if present and rng.random() < 0.8 else fields)
    value = getattr(msg, f.name)
    if is_repeated_field(f):
        n = len(value)
        r = rng.random()
        if f.type == F.TYPE_MESSAGE:
            if n and r < 0.55 and depth < 8:
                _mutate_message(value[rng.randrange(n)], rng, depth + 1)
            elif n and r < 0.7:
                del value[rng.randrange(n)]
            elif n and r < 0.85:
                value.add().CopyFrom(value[rng.randrange(n)])
            else:
                new = value.add()
                if n:
                    new.CopyFrom(value[rng.randrange(n)])
                _mutate_message(new, rng, depth + 1)
        else:
            if n and r < 0.5:
                value[rng.randrange(n)] = _scalar(f, rng, value[rng.randrange(n)])
            elif n and r < 0.7:
                del value[rng.randrange(n)]
            else:
                value.append(_scalar(f, rng, value[0] if n else None))
        return
    if f.type == F.TYPE_MESSAGE:
        if depth < 8:
            _mutate_message(getattr(msg, f.name), rng, depth + 1)
        return
    try:
        setattr(msg, f.name, _scalar(f, rng, value))
    except (ValueError, TypeError):
        pass


def _scalar(f, rng: random.Random, old):
    from google.protobuf.descriptor import FieldDescriptor as F

    t = f.type
    if t in (F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32, F.TYPE_ENUM):
        v = rng.choice(_INTS + (rng.randint(-40, 40),) * 4)
        return max(-2**31, min(2**31 - 1, v))
    if t in (F.TYPE_INT64, F.TYPE_SINT64, F.TYPE_SFIXED64):
        return max(-2**63, min(2**63 - 1, rng.choice(_INTS + (rng.randint(-40, 40),) * 4)))
    if t in (F.TYPE_UINT32, F.TYPE_FIXED32):
        return rng.choice((0, 1, 2, 255, 2**32 - 1, rng.randint(0, 40)))
    if t in (F.TYPE_UINT64, F.TYPE_FIXED64):
        return rng.choice((0, 1, 2, 2**64 - 1, rng.randint(0, 40)))
    if t in (F.TYPE_FLOAT, F.TYPE_DOUBLE):
        return rng.choice(_FLOATS + (rng.uniform(-10, 10),))
    if t == F.TYPE_BOOL:
        return not old
    if t == F.TYPE_STRING:
        if isinstance(old, str) and old and rng.random() < 0.4:
            return old[:rng.randrange(len(old))] + rng.choice(_STRINGS)
        return rng.choice(_STRINGS)
    if t == F.TYPE_BYTES:
        b = bytes(old or b"")
        r = rng.random()
        if b and r < 0.4:
            return b[:rng.randrange(len(b))]
        if r < 0.7:
            return b + bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        return rng.choice((b"", b"\0" * 4, b"\xff" * 8, b"[/]"))
    return old


def mutate_onnx(data: bytes, rng: random.Random, max_size: int) -> bytes | None:
    """One structure-aware mutation of a serialised ModelProto (None where it does not parse)."""
    import onnx

    m = onnx.ModelProto()
    try:
        m.ParseFromString(data)
    except Exception:
        return None
    g = m.graph
    r = rng.random()
    if r < 0.35 and len(g.node):  # most bugs hide in a node's attributes, inputs and op type
        node = g.node[rng.randrange(len(g.node))]
        if node.attribute and rng.random() < 0.7:
            _mutate_message(node.attribute[rng.randrange(len(node.attribute))], rng)
        elif rng.random() < 0.5:
            names = [v for n in g.node for v in list(n.input) + list(n.output)] + [i.name for i in g.initializer]
            io = node.input if (node.input and rng.random() < 0.6) else node.output
            if io:
                io[rng.randrange(len(io))] = rng.choice(names + ["", "nope"])
        else:
            _mutate_message(node, rng)
    elif r < 0.5 and len(g.initializer):
        _mutate_message(g.initializer[rng.randrange(len(g.initializer))], rng)
    elif r < 0.6 and len(m.opset_import):
        m.opset_import[0].version = rng.choice((1, 6, 7, 11, 13, 17, 18, 21, 22, 99, 0, -1))
    else:
        _mutate_message(m, rng)
    out = m.SerializeToString()
    return out if len(out) <= max_size else None


def _mutate_tree(doc, rng: random.Random, depth: int = 0):
    """`doc` (parsed JSON or YAML) with one value somewhere replaced, deleted or duplicated."""
    if isinstance(doc, (dict, list)) and doc and depth < 12:
        k = rng.choice(list(doc)) if isinstance(doc, dict) else rng.randrange(len(doc))
        r = rng.random()
        if r < 0.6:
            doc[k] = _mutate_tree(doc[k], rng, depth + 1)
        elif r < 0.75:
            del doc[k]
        elif isinstance(doc, dict):
            doc[rng.choice(_STRINGS + (k,))] = _edge_value(rng)
        else:
            doc.insert(rng.randrange(len(doc) + 1), json.loads(json.dumps(doc[k])) if rng.random() < 0.7
                       else _edge_value(rng))
        return doc
    return _edge_value(rng, doc)


def _edge_value(rng: random.Random, old=None):
    r = rng.random()
    if isinstance(old, (int, float)) and not isinstance(old, bool) and r < 0.4:
        return rng.choice((old * 2, old + 1, -old, old * 1e9, old / 3))
    if r < 0.6:
        return rng.choice(_INTS)
    if r < 0.75:
        return rng.choice(_FLOATS)
    if r < 0.9:
        return rng.choice(_STRINGS)
    return rng.choice((None, True, [], {}, [1, [2, [3]]], {"a": {"b": None}}))


def mutate_json(data: bytes, rng: random.Random, max_size: int) -> bytes | None:
    """One mutation of a JSON trace's tree, mostly inside one event (None where it does not parse)."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return None
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if isinstance(events, list) and events and rng.random() < 0.85:
        i = rng.randrange(len(events))
        if rng.random() < 0.2:
            events.insert(rng.randrange(len(events) + 1), json.loads(json.dumps(events[i])))
        else:
            events[i] = _mutate_tree(events[i], rng)
    else:
        doc = _mutate_tree(doc, rng)
    out = json.dumps(doc, allow_nan=True).encode()
    return out if len(out) <= max_size else None


def mutate_yaml(data: bytes, rng: random.Random, max_size: int) -> bytes | None:
    import yaml

    try:
        doc = yaml.safe_load(data)
    except Exception:
        return None
    try:
        out = yaml.safe_dump(_mutate_tree(doc, rng), allow_unicode=rng.random() < 0.5).encode()
    except (yaml.YAMLError, RecursionError, ValueError):
        return None
    return out if len(out) <= max_size else None


def _guarded(fn):
    """A mutator that fails on a strange input (a name protobuf hands over as bytes) gives that
    input up (None: byte-level mutation instead); the mutator is not what is under test."""
    def run(data: bytes, rng: random.Random, max_size: int) -> bytes | None:
        try:
            return fn(data, rng, max_size)
        except Exception:
            return None
    return run


MUTATORS = {"onnx": _guarded(mutate_onnx), "yaml": _guarded(mutate_yaml), "trace": _guarded(mutate_json)}


def seeds(target: str) -> list[bytes]:
    """Starting inputs: small real-world files of each family (the bundled example model and a few
    exporter-style graphs, the built-in configs, a slice of a real profiler trace)."""
    root = Path(__file__).resolve().parents[2]
    if target == "onnx":
        return _onnx_seeds(root)
    if target == "yaml":
        from ..config import builtin_dir

        out = [p.read_bytes() for kind in ("pipelines", "devices") for p in sorted(builtin_dir(kind).glob("*.yaml"))]
        out.append(b"shapes:\n  x: [1, 3, 224, 224]\n  ids: 128\n")
        man = root / "examples" / "ci" / "dlcc-batch.yaml"
        if man.is_file():  # its model paths made absolute: the target reads it from a scratch folder
            out.append(man.read_bytes().replace(b"../resnet-tiny.onnx", str(man.parent.parent / "resnet-tiny.onnx")
                                                 .encode()))
        return out
    if target == "trace":
        return [_trace_seed(root)]
    raise ValueError(target)


def _onnx_seeds(root: Path) -> list[bytes]:
    import numpy as np
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    out = []
    ex = root / "examples" / "resnet-tiny.onnx"
    if ex.is_file():
        out.append(ex.read_bytes())

    def model(nodes, inputs, outputs, inits=(), opset=17):
        g = h.make_graph(nodes, "seed", [h.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                         [h.make_tensor_value_info(n, t, s) for n, t, s in outputs],
                         [nh.from_array(v, k) for k, v in inits])
        return h.make_model(g, opset_imports=[h.make_opsetid("", opset)]).SerializeToString()

    rng = np.random.RandomState(0)
    f = np.float32
    # an embedding + LayerNorm + attention-ish block
    out.append(model([
        h.make_node("Gather", ["emb", "ids"], ["e"], axis=0),
        h.make_node("LayerNormalization", ["e", "g", "b"], ["n"], axis=-1, epsilon=1e-5),
        h.make_node("MatMul", ["n", "w"], ["q"]),
        h.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1]),
        h.make_node("MatMul", ["q", "qt"], ["s"]),
        h.make_node("Softmax", ["s"], ["p"], axis=-1),
        h.make_node("ReduceMean", ["p"], ["y"], axes=[1], keepdims=0),
    ], [("ids", T.INT64, [1, 6])], [("y", T.FLOAT, [1, 6])],
        [("emb", rng.randn(20, 8).astype(f)), ("g", np.ones(8, f)), ("b", np.zeros(8, f)), ("w", rng.randn(8, 8).astype(f))]))
    # conv / pool / resize / concat
    out.append(model([
        h.make_node("Conv", ["x", "cw", "cb"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=1, strides=[1, 1]),
        h.make_node("Relu", ["c"], ["r"]),
        h.make_node("MaxPool", ["r"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
        h.make_node("Resize", ["mp", "", "sc"], ["up"], mode="nearest"),
        h.make_node("Concat", ["up", "r"], ["cc"], axis=1),
        h.make_node("BatchNormalization", ["cc", "bs", "bb", "bm", "bv"], ["bn"], epsilon=1e-5),
        h.make_node("GlobalAveragePool", ["bn"], ["y"]),
    ], [("x", T.FLOAT, [1, 2, 8, 8])], [("y", T.FLOAT, [1, 8, 1, 1])],
        [("cw", rng.randn(4, 2, 3, 3).astype(f)), ("cb", np.zeros(4, f)), ("sc", np.array([1, 1, 2, 2], f)),
         ("bs", np.ones(8, f)), ("bb", np.zeros(8, f)), ("bm", np.zeros(8, f)), ("bv", np.ones(8, f))]))
    # shape arithmetic, slicing, split, topk, lstm
    out.append(model([
        h.make_node("Shape", ["x"], ["sh"]),
        h.make_node("Slice", ["x", "st", "en", "ax"], ["sl"]),
        h.make_node("Split", ["sl", "sp"], ["s0", "s1"], axis=2),
        h.make_node("Add", ["s0", "s1"], ["a"]),
        h.make_node("LSTM", ["a", "W", "R"], ["ly"], hidden_size=3, direction="forward"),
        h.make_node("TopK", ["x", "k"], ["tv", "ti"], axis=-1),
        h.make_node("Reshape", ["ly", "rs"], ["y"]),
    ], [("x", T.FLOAT, [5, 1, 8])], [("y", T.FLOAT, [5, 3]), ("tv", T.FLOAT, [5, 1, 2]), ("sh", T.INT64, [3])],
        [("st", np.array([0], np.int64)), ("en", np.array([4], np.int64)), ("ax", np.array([2], np.int64)),
         ("sp", np.array([2, 2], np.int64)), ("W", rng.randn(1, 12, 2).astype(f)), ("R", rng.randn(1, 12, 3).astype(f)),
         ("k", np.array([2], np.int64)), ("rs", np.array([5, 3], np.int64))]))
    # constant operands the spec sizes (bounds, pads, slopes, an axis, k, C) and a pool's indices
    out.append(model([
        h.make_node("Clip", ["x", "lo", "hi"], ["c"]),
        h.make_node("Pad", ["c", "pads", "cval"], ["p"], mode="constant"),
        h.make_node("PRelu", ["p", "slope"], ["pr"]),
        h.make_node("MaxPool", ["pr"], ["mp", "idx"], kernel_shape=[2, 2], strides=[2, 2]),
        h.make_node("MaxUnpool", ["mp", "idx"], ["un"], kernel_shape=[2, 2], strides=[2, 2]),
        h.make_node("CumSum", ["un", "axis"], ["cs"], exclusive=0),
        h.make_node("Trilu", ["cs", "tk"], ["tr"], upper=1),
        h.make_node("Flatten", ["tr"], ["fl"], axis=1),
        h.make_node("Gemm", ["fl", "gw", "gc"], ["y"], transB=0),
    ], [("x", T.FLOAT, [1, 2, 6, 6])], [("y", T.FLOAT, [1, 3])],
        [("lo", np.array(-1, f)), ("hi", np.array(2, f)), ("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)),
         ("cval", np.array(0.5, f)), ("slope", rng.randn(2, 1, 1).astype(f)), ("axis", np.array(3, np.int64)),
         ("tk", np.array(1, np.int64)), ("gw", rng.randn(128, 3).astype(f)), ("gc", np.zeros(3, f))]))
    # sampling ops whose operands the spec sizes and whose indices are checked: a deformable
    # convolution, ROIs pooled from its output, and the result written into a cache
    out.append(model([
        h.make_node("DeformConv", ["x", "dw", "off"], ["dc"], kernel_shape=[3, 3]),
        h.make_node("RoiAlign", ["dc", "rois", "bi"], ["ra"], output_height=2, output_width=2, sampling_ratio=0),
        h.make_node("TensorScatter", ["past", "ra", "wi"], ["y"], axis=-2, mode="circular"),
    ], [("x", T.FLOAT, [1, 2, 6, 6])], [("y", T.FLOAT, [2, 2, 5, 2])],
        [("dw", rng.randn(2, 2, 3, 3).astype(f)), ("off", rng.randn(1, 18, 4, 4).astype(f)),
         ("rois", np.array([[0, 0, 3, 3], [1, 0.5, 2.5, 3]], f)), ("bi", np.zeros(2, np.int64)),
         ("past", np.zeros((2, 2, 5, 2), f)), ("wi", np.array([1, 4], np.int64))], opset=24))
    return out


def _trace_seed(root: Path) -> bytes:
    """About 300 events of a real Kineto trace (tests/data/traces), with two ProfilerStep spans
    put around them, so that the reader and the replay see real event shapes."""
    import gzip

    src = root / "tests" / "data" / "traces" / "v100_resnet50_train_bs32_nw0_steps05-10.json.gz"
    data = json.loads(gzip.decompress(src.read_bytes()))
    events = [e for e in data["traceEvents"] if isinstance(e, dict) and e.get("ph") in ("X", "s", "f", "i")
              and "ProfilerStep" not in str(e.get("name"))]
    events.sort(key=lambda e: e.get("ts", 0))
    pick = events[len(events) // 3: len(events) // 3 + 300]
    t0, t1 = pick[0]["ts"], max(e["ts"] + e.get("dur", 0) for e in pick)
    mid = (t0 + t1) / 2
    pid = next((e["pid"] for e in pick if e.get("cat") == "cpu_op"), 0)
    tid = next((e["tid"] for e in pick if e.get("cat") == "cpu_op"), 0)
    steps = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k}", "pid": pid, "tid": tid,
              "ts": a, "dur": b - a} for k, (a, b) in enumerate(((t0, mid), (mid, t1 + 1)))]
    doc = {k: v for k, v in data.items() if k != "traceEvents"}
    doc["traceEvents"] = steps + pick
    return json.dumps(doc).encode()

