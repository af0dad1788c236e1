"""Property-based tests (hypothesis) for every input family a user hands dlcc: `--shape` strings,
pipeline and device YAML, single-node ONNX models with arbitrary attributes, artifact plans and
profiler trace events. The property is the same everywhere: the input is accepted, or refused
with a DlccError (one paragraph, exit code 2 on the CLI); never another exception. Bounded to
about a minute in all (issue 19); `--hypothesis-seed` reproduces a failure.
"""
from __future__ import annotations

import json
import string

import numpy as np
import onnx
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h

import dlcc
from dlcc.errors import DlccError

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.function_scoped_fixture])
SLOW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.function_scoped_fixture])

#: JSON-like values: what a YAML or JSON file can hold.
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12)


@FAST
@given(st.text(alphabet=string.printable + "×∞\x00", max_size=40))
def test_shape_strings(text):
    from dlcc.frontend import parse_shape_binding

    try:
        name, shape = parse_shape_binding(text)
    except DlccError:
        return
    # several numbers are dims (0 binds an empty one); one may also be a scalar input's value
    assert name and shape and all(d < 2**31 for d in shape) and (len(shape) == 1 or all(d >= 0 for d in shape))


@FAST
@given(st.dictionaries(st.sampled_from(["name", "precision", "passes", "fp32_ops", "half_activations", "x"]),
                       JSONISH, max_size=5))
def test_pipeline_yaml(tmp_path_factory, doc):
    from dlcc.config import load_pipeline

    path = tmp_path_factory.mktemp("p") / "p.yaml"
    path.write_text(yaml.safe_dump(doc))
    try:
        load_pipeline(path)
    except DlccError:
        pass


@FAST
@given(st.dictionaries(st.sampled_from(["name", "sms", "peak_tflops", "dram_bandwidth_gbps", "arch", "kind",
                                        "max_threads_per_sm", "shared_mem_per_block"]), JSONISH, max_size=6))
def test_device_yaml(tmp_path_factory, changes):
    from dlcc.config import builtin_dir, load_device

    base = yaml.safe_load((builtin_dir("devices") / "h100.yaml").read_text())
    base.update(changes)
    path = tmp_path_factory.mktemp("d") / "d.yaml"
    path.write_text(yaml.safe_dump(base))
    try:
        spec = load_device(path)
    except DlccError:
        return
    assert spec.peak_tflops["float32"] > 0


#: Single-node models: op, inputs (name, shape), and the attributes hypothesis varies.
OPS = {  # op: (inputs, attributes varied, the output's rank)
    "Conv": ([("x", [1, 4, 6, 6]), ("w", [4, 1, 3, 3])], ["group", "strides", "pads", "dilations"], 4),
    "MaxPool": ([("x", [1, 2, 6, 6])], ["kernel_shape", "strides", "pads"], 4),
    "Softmax": ([("x", [2, 3, 4])], ["axis"], 3),
    "Flatten": ([("x", [2, 3, 4])], ["axis"], 2),
    "Transpose": ([("x", [2, 3, 4])], ["perm"], 3),
    "Concat": ([("x", [2, 3]), ("x", [2, 3])], ["axis"], 2),
    "LeakyRelu": ([("x", [2, 3])], ["alpha"], 2),
    "ReduceMean": ([("x", [2, 3, 4])], ["axes", "keepdims"], 3),
    "Gather": ([("x", [5, 3]), ("i", [2])], ["axis"], 2),
    "DepthToSpace": ([("x", [1, 8, 2, 2])], ["blocksize"], 4),
    "LRN": ([("x", [1, 4, 3, 3])], ["size", "alpha"], 4),
}
INTS = st.integers(-2**63, 2**63 - 1) | st.integers(-3, 5)


def _attr(name):
    if name in ("alpha",):
        return st.floats(allow_nan=True, allow_infinity=True, width=32)
    if name in ("strides", "pads", "dilations", "kernel_shape", "perm", "axes"):
        return st.lists(st.integers(-3, 6) | st.integers(-2**63, 2**63 - 1), min_size=0, max_size=5)
    return INTS


@st.composite
def single_node(draw):
    op = draw(st.sampled_from(sorted(OPS)))
    ins, names, rank = OPS[op]
    attrs = {a: draw(_attr(a)) for a in names if draw(st.booleans())}
    return op, ins, attrs, rank


@SLOW
@given(single_node())
def test_single_node_models_with_arbitrary_attributes(tmp_path_factory, case):
    op, ins, attrs, rank = case
    inputs, inits, names = [], [], []
    for k, (n, shape) in enumerate(ins):
        name = f"{n}{k}"
        names.append(name)
        if n in ("w", "i"):
            arr = np.ones(shape, np.float32) if n == "w" else np.zeros(shape, np.int64)
            inits.append(onnx.numpy_helper.from_array(arr, name))
        else:
            inputs.append(h.make_tensor_value_info(name, T.FLOAT, shape))
    path = tmp_path_factory.mktemp("m") / "m.onnx"
    try:
        node = h.make_node(op, names, ["y"], **attrs)
        # symbolic output dims: the checker wants a shape; dlcc infers the real one
        y = h.make_tensor_value_info("y", T.FLOAT, [f"d{j}" for j in range(rank)])
        g = h.make_graph([node], "g", inputs, [y], inits)
        model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
        try:  # the output's type, where onnx can infer it (else dlcc's checker refuses the model)
            model = onnx.shape_inference.infer_shapes(model)
        except Exception:
            pass
        onnx.save(model, path)
    except (ValueError, TypeError):
        return  # the attribute cannot even be written into a model
    try:
        m = dlcc.compile(path, target="opencl")
    except DlccError:
        return
    feeds = {i.name: np.random.default_rng(0).standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim])
             .astype(np.float32) for i in inputs}
    from dlcc.verify import verify_outputs

    got = m(feeds)
    try:
        rows = verify_outputs(path, got, feeds)  # what compiles must also be right
    except Exception as e:
        if "ONNXRuntimeError" not in str(e) and "onnxruntime" not in type(e).__module__:
            raise
        return  # onnxruntime refuses what the spec allows (LRN of an even size): no reference
    assert all(r["passed"] for r in rows), (op, attrs, rows)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    from pathlib import Path

    example = Path(__file__).resolve().parents[1] / "examples" / "resnet-tiny.onnx"
    out = tmp_path_factory.mktemp("art") / "a"
    dlcc.compile(example, out, target="opencl")
    return out, json.loads((out / "plan.json").read_text())


def _paths(obj, prefix=()):
    """Every key path into a JSON value."""
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:3]):
            yield from _paths(v, prefix + (i,))


@SLOW
@given(st.data())
def test_mutated_plans(artifact, tmp_path_factory, data):
    import shutil

    src, plan = artifact
    paths = [p for p in _paths(plan) if p and p[0] != "meta"]
    where = data.draw(st.sampled_from(paths))
    value = data.draw(JSONISH)
    mutated = json.loads(json.dumps(plan))
    cur = mutated
    for k in where[:-1]:
        cur = cur[k]
    cur[where[-1]] = value
    dst = tmp_path_factory.mktemp("m") / "a"
    shutil.copytree(src, dst)
    (dst / "plan.json").write_text(json.dumps(mutated))
    try:
        dlcc.load(dst)
    except DlccError:
        pass


EVENT_KEYS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "args"]


@FAST
@given(st.lists(st.dictionaries(st.sampled_from(EVENT_KEYS), JSONISH | st.sampled_from(["X", "kernel", "cpu_op"]),
                                max_size=8), max_size=6))
def test_trace_events(tmp_path_factory, events):
    from dlcc.estimate.kineto import load_trace

    kernel = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 0, "dur": 5,
              "args": {"correlation": 1, "stream": 7, "device": 0}}
    path = tmp_path_factory.mktemp("t") / "t.json"
    path.write_text(json.dumps({"traceEvents": events + [kernel]}))
    try:
        g = load_trace(path)
        g.simulate()
    except DlccError:
        pass


@FAST
@given(st.lists(st.text("_Ab01", max_size=7), max_size=30), st.lists(st.text("_Ab01", max_size=7), max_size=10),
       st.lists(st.text("_Ab01", max_size=5), min_size=1, max_size=10))
def test_internal_name_prefixes_collide_with_no_name(names, added, probes):
    """The rewrites name their nodes' internals under a prefix no tensor name starts with
    (expand._prefix). TakenNames answers "does any name start with p" by binary search; it agrees
    with a scan of every name, after names are added too, and a prefix handed out is one that
    no name starts with."""
    from dlcc.expand import TakenNames, _all_names, _prefix

    g = h.make_graph([h.make_node("Relu", [n], [n + "_y"]) for n in names], "g", [], [])
    taken = _all_names(g)
    assert isinstance(taken, TakenNames) and set(taken) == {n for n in names} | {n + "_y" for n in names}
    taken.update(added)
    for p in probes + [n[:3] for n in names]:
        assert taken.any_starts_with(p) == any(t.startswith(p) for t in taken), p
    node = h.make_node("A", [], ["b"])
    for k in range(3):
        p = _prefix(node, k, taken)
        assert not any(t.startswith(p) for t in taken)
        taken.add(p)
