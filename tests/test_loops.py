"""`Scan` and `Loop` (dlcc/loops.py): unrolled at import when their iteration count is known at
compile time. Results against onnxruntime on PoCL through every pipeline; the loops that cannot
be unrolled are one clear error each, naming the loop and why."""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

import dlcc
from conftest import opencl_device_available, run_ort
from dlcc.errors import ModelError, UnsupportedControlFlowError
from dlcc.frontend import import_model

try:
    import torch
except ImportError:  # (the models extra)
    torch = None

needs_opencl = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")
rng = np.random.default_rng(0)


def _vi(name, shape, t=TP.FLOAT):
    return h.make_tensor_value_info(name, t, shape)


def _save(path, nodes, inputs, outputs, inits=(), opset=17):
    m = h.make_model(h.make_graph(nodes, "loops", inputs, outputs, list(inits)),
                     opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, path)
    return str(path)


def scan_model(path, directions=(0, 0), out_direction=0, out_axis=0):
    """A running state s (+= tanh(a_t) * w, w the body's own initializer) and two scan inputs:
    a [6, 4] scanned along axis 0 and b [4, 6] along axis 1; scan outputs s·b_t and a_t − b_t."""
    body = h.make_graph(
        [h.make_node("Tanh", ["a_t"], ["t"]), h.make_node("Mul", ["t", "w"], ["tw"]),
         h.make_node("Add", ["s_in", "tw"], ["s_out"]), h.make_node("Mul", ["s_out", "b_t"], ["p"]),
         h.make_node("Sub", ["a_t", "b_t"], ["d"])],
        "body", [_vi("s_in", [4]), _vi("a_t", [4]), _vi("b_t", [4])],
        [_vi("s_out", [4]), _vi("p", [4]), _vi("d", [4])],
        [nh.from_array(rng.standard_normal(4).astype(np.float32), "w")])
    out_shape = [6, 4] if out_axis == 0 else [4, 6]
    node = h.make_node("Scan", ["s0", "a", "b"], ["s", "ps", "ds"], body=body, num_scan_inputs=2,
                       scan_input_axes=[0, 1], scan_input_directions=list(directions),
                       scan_output_axes=[out_axis, out_axis], scan_output_directions=[out_direction, 0])
    return _save(path, [node], [_vi("s0", [4]), _vi("a", [6, 4]), _vi("b", [4, 6])],
                 [_vi("s", [4]), _vi("ps", out_shape), _vi("ds", out_shape)], opset=16)


def _run_both(path, feeds, pipeline):
    m = dlcc.compile(path, target="opencl", pipeline=pipeline)
    got = m(feeds)
    for name, ref in zip([o.name for o in onnx.load(path).graph.output], run_ort(path, feeds)):
        np.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=1e-5, err_msg=name)
    return m


def _scan_feeds():
    return {"s0": rng.standard_normal(4).astype(np.float32), "a": rng.standard_normal((6, 4)).astype(np.float32),
            "b": rng.standard_normal((4, 6)).astype(np.float32)}


@needs_opencl
@pytest.mark.parametrize("pipeline", ["baseline", "astitch", "full"])
def test_scan_forward(tmp_path, pipeline):
    m = _run_both(scan_model(tmp_path / "s.onnx"), _scan_feeds(), pipeline)
    assert any("Scan" in line and "unrolled: 6 iterations of a 5-node body" in line for line in m.plan["meta"]["pass_log"])


@needs_opencl
@pytest.mark.parametrize("directions, out_direction, out_axis", [((1, 0), 0, 0), ((0, 1), 1, 1), ((1, 1), 0, -1)])
def test_scan_directions_and_axes(tmp_path, directions, out_direction, out_axis):
    _run_both(scan_model(tmp_path / "s.onnx", directions, out_direction, out_axis), _scan_feeds(), "astitch")


def test_a_bodys_initializer_is_moved_in_once(tmp_path):
    g = import_model(scan_model(tmp_path / "s.onnx"))
    weights = [t for t in g.tensors.values() if t.value is not None and t.shape == (4,) and t.dtype == "float32"]
    assert len(weights) == 1, [t.name for t in weights]


def loop_model(path, trip=5, cond_mode="passthrough", opset=17, trip_from_shape=False):
    """y = x; for i in range(trip): y = y * 0.9 + i * x (If i == 0 then add 1 else 0); the scan
    output stacks each iteration's y. The body's condition output is its input passed through,
    or a constant true, or computed from y (a while loop)."""
    then = h.make_graph([h.make_node("Constant", [], ["one"], value=nh.from_array(np.ones(1, np.float32)))], "then", [],
                        [_vi("one", [1])])
    els = h.make_graph([h.make_node("Constant", [], ["zero"], value=nh.from_array(np.zeros(1, np.float32)))], "else", [],
                       [_vi("zero", [1])])
    nodes = [h.make_node("Cast", ["i"], ["fi"], to=TP.FLOAT), h.make_node("Mul", ["fi", "x"], ["ix"]),
             h.make_node("Mul", ["y_in", "k"], ["decayed"]), h.make_node("Add", ["decayed", "ix"], ["y1"]),
             h.make_node("Equal", ["i", "i0"], ["first"]),
             h.make_node("If", ["first"], ["bump"], then_branch=then, else_branch=els),
             h.make_node("Add", ["y1", "bump"], ["y_out"]), h.make_node("Identity", ["y_out"], ["scan"])]
    inits = [nh.from_array(np.array(0.9, np.float32), "k"), nh.from_array(np.array(0, np.int64), "i0")]
    if cond_mode == "passthrough":
        nodes.append(h.make_node("Identity", ["c_in"], ["c_out"]))
    elif cond_mode == "constant":
        nodes.append(h.make_node("Constant", [], ["c_out"], value=nh.from_array(np.array(True))))
    else:
        nodes += [h.make_node("ReduceSum", ["y_out"], ["tot"], keepdims=0), h.make_node("Less", ["tot", "lim"], ["c_out"])]
        inits.append(nh.from_array(np.array(100.0, np.float32), "lim"))
    body = h.make_graph(nodes, "body", [_vi("i", [], TP.INT64), _vi("c_in", [], TP.BOOL), _vi("y_in", [2, 3])],
                        [_vi("c_out", [], TP.BOOL), _vi("y_out", [2, 3]), _vi("scan", [2, 3])], inits)
    outer = [nh.from_array(np.array(True), "c")]
    pre = []
    if trip_from_shape:  # trip = x.shape[1] + 2: known once the shapes are
        pre = [h.make_node("Shape", ["x"], ["xs"]), h.make_node("Gather", ["xs", "one_i"], ["d1"], axis=0),
               h.make_node("Add", ["d1", "two"], ["M"])]
        outer += [nh.from_array(np.array(1, np.int64), "one_i"), nh.from_array(np.array(2, np.int64), "two")]
        trip = 5
    elif trip is not None:
        outer.append(nh.from_array(np.array(trip, np.int64), "M"))
    loop = h.make_node("Loop", ["M" if trip is not None else "", "c", "x"], ["y", "ys"], body=body)
    return _save(path, pre + [loop], [_vi("x", [2, 3])], [_vi("y", [2, 3]), _vi("ys", [trip or 1, 2, 3])], outer,
                 opset=opset)


@needs_opencl
@pytest.mark.parametrize("pipeline", ["baseline", "astitch", "full"])
def test_loop_with_a_trip_count(tmp_path, pipeline):
    """The iteration number is a constant in each copy, so the If inside the body (i == 0) is
    decided at compile time too."""
    m = _run_both(loop_model(tmp_path / "l.onnx"), {"x": rng.standard_normal((2, 3)).astype(np.float32)}, pipeline)
    log = m.plan["meta"]["pass_log"]
    assert any("Loop" in line and "unrolled: 5 iterations" in line for line in log)
    assert sum("condition known at compile time" in line for line in log) == 5


@needs_opencl
@pytest.mark.parametrize("variant", ["constant-cond", "opset11", "trip-from-shape"])
def test_loop_variants(tmp_path, variant):
    path = loop_model(tmp_path / "l.onnx", cond_mode="constant" if variant == "constant-cond" else "passthrough",
                      opset=11 if variant == "opset11" else 17, trip_from_shape=variant == "trip-from-shape")
    _run_both(path, {"x": rng.standard_normal((2, 3)).astype(np.float32)}, "astitch")


@pytest.mark.parametrize("case, needle", [
    ("while", r"Loop 'y' is a while loop: its body computes whether to go on \('c_out'\)"),
    ("no-trip", r"Loop 'y' is a while loop: .* from values known only at run time"),
    ("too-long", r"runs 5000 iterations of a 9-node body; dlcc unrolls loops, and that is more than its limit"),
])
def test_loops_that_cannot_be_unrolled_are_one_clear_error(tmp_path, case, needle):
    path = loop_model(tmp_path / "l.onnx", trip={"no-trip": None, "too-long": 5000}.get(case, 5),
                      cond_mode="computed" if case in ("while", "no-trip") else "passthrough")
    with pytest.raises(UnsupportedControlFlowError, match=needle):
        dlcc.compile(path, target="opencl")


def counted_while_model(path, steps=6, trip=2**31 - 1, start="constant"):
    """A recurrence as tf2onnx writes a Keras SimpleRNN: a while loop carrying an int32 time step
    t, which it adds 1 to, and a state h; it goes on while t < steps and the iteration number is
    below its maximum. Each iteration reads x[t] and stacks h."""
    body = h.make_graph(
        [h.make_node("Gather", ["x", "t_in"], ["xt"], axis=0), h.make_node("MatMul", ["xt", "w"], ["a"]),
         h.make_node("MatMul", ["h_in", "u"], ["b"]), h.make_node("Add", ["a", "b"], ["ab"]),
         h.make_node("Tanh", ["ab"], ["h_out"]), h.make_node("Identity", ["h_out"], ["h_seq"]),
         h.make_node("Add", ["t_in", "one32"], ["t_out"]), h.make_node("Cast", ["t_out"], ["t64"], to=TP.INT64),
         h.make_node("Less", ["t64", "steps"], ["more"]), h.make_node("Less", ["i", "maxit"], ["below"]),
         h.make_node("And", ["more", "below"], ["c_out"])],
        "body", [_vi("i", [], TP.INT64), _vi("c_in", [], TP.BOOL), _vi("t_in", [], TP.INT32), _vi("h_in", [1, 4])],
        [_vi("c_out", [], TP.BOOL), _vi("t_out", [], TP.INT32), _vi("h_out", [1, 4]), _vi("h_seq", [1, 4])],
        [nh.from_array(np.array(1, np.int32), "one32"), nh.from_array(np.array(steps, np.int64), "steps")])
    inits = [nh.from_array((rng.standard_normal((3, 4)) * 0.5).astype(np.float32), "w"),
             nh.from_array((rng.standard_normal((4, 4)) * 0.5).astype(np.float32), "u"),
             nh.from_array(np.zeros((1, 4), np.float32), "h0"), nh.from_array(np.array(True), "c"),
             nh.from_array(np.array(1000, np.int64), "maxit")]
    inputs = [_vi("x", [steps, 1, 3])]
    if start == "constant":
        inits.append(nh.from_array(np.array(0, np.int32), "t0"))
    else:  # the time step starts from a graph input: its count is known only at run time
        inputs.append(_vi("t0", [], TP.INT32))
    if trip is not None:
        inits.append(nh.from_array(np.array(trip, np.int64), "M"))
    n = min(steps, trip or steps)
    loop = h.make_node("Loop", ["M" if trip is not None else "", "c", "t0", "h0"], ["t", "hN", "hs"], body=body)
    return _save(path, [loop], inputs, [_vi("hN", [1, 4]), _vi("hs", [n, 1, 4])], inits)


@needs_opencl
@pytest.mark.parametrize("trip", [2**31 - 1, None, 4])
def test_a_while_loop_that_counts_is_unrolled(tmp_path, trip):
    """tf2onnx writes every Keras RNN as such a while loop. Its condition follows from the time
    step and constants alone, so dlcc runs that part of the body at compile time to count the
    iterations (6, or the trip count M where it is smaller) and unrolls it."""
    path = counted_while_model(tmp_path / "w.onnx", trip=trip)
    m = _run_both(path, {"x": rng.standard_normal((6, 1, 3)).astype(np.float32)}, "astitch")
    n = 4 if trip == 4 else 6
    assert any("Loop" in line and f"unrolled: {n} iterations" in line for line in m.plan["meta"]["pass_log"])
    assert "Less" not in {n.op_type for n in import_model(path).nodes}  # (the counting copies are dead)


def stacked_loops_model(path, steps=5):
    """Two loops in a row, as tf2onnx writes a stacked Keras RNN: the first runs Shape(x)[0]
    times and stacks tanh(x[i]); the second counts its own trip count, and its initial condition
    0 < n, from the shape of what the first stacked, which onnx's shape inference leaves open."""
    first = h.make_graph(
        [h.make_node("Gather", ["x", "i"], ["xi"], axis=0), h.make_node("Tanh", ["xi"], ["y"])], "first",
        [_vi("i", [], TP.INT64), _vi("c", [], TP.BOOL)], [_vi("c", [], TP.BOOL), _vi("y", [3])])
    second = h.make_graph(
        [h.make_node("Gather", ["ys", "j"], ["yj"], axis=0), h.make_node("Add", ["s_in", "yj"], ["s_out"]),
         h.make_node("Mul", ["s_out", "half"], ["z"]), h.make_node("Add", ["j", "one"], ["j1"]),
         h.make_node("Less", ["j1", "n2"], ["more"])], "second",
        [_vi("j", [], TP.INT64), _vi("c2", [], TP.BOOL), _vi("s_in", [3])],
        [_vi("more", [], TP.BOOL), _vi("s_out", [3]), _vi("z", [3])],
        [nh.from_array(np.array(1, np.int64), "one"), nh.from_array(np.array(0.5, np.float32), "half")])
    nodes = [h.make_node("Shape", ["x"], ["sx"]), h.make_node("Gather", ["sx", "zero"], ["n1"], axis=0),
             h.make_node("Loop", ["n1", "yes"], ["ys"], body=first),
             h.make_node("Shape", ["ys"], ["sy"]), h.make_node("Gather", ["sy", "zero"], ["n2"], axis=0),
             h.make_node("Less", ["zero", "n2"], ["go"]),
             h.make_node("Loop", ["", "go", "s0"], ["sN", "zs"], body=second)]
    inits = [nh.from_array(np.array(0, np.int64), "zero"), nh.from_array(np.array(True), "yes"),
             nh.from_array(np.zeros(3, np.float32), "s0")]
    return _save(path, nodes, [_vi("x", ["T", 3])], [_vi("sN", [3]), _vi("zs", ["T", 3])], inits)


@needs_opencl
def test_a_loop_counted_from_what_an_earlier_loop_stacked(tmp_path):
    """The second loop's count and initial condition are known only once the first loop is
    unrolled and the Shape between them folded: dlcc leaves it for the next round (piper-tts's
    nakdimon.onnx, stacked bidirectional LSTMs from tf2onnx, was refused before)."""
    path = stacked_loops_model(tmp_path / "stacked.onnx")
    x = rng.standard_normal((5, 3)).astype(np.float32)
    m = dlcc.compile(path, target="opencl", pipeline="astitch", shapes={"T": 5})
    got = m({"x": x})
    for name, ref in zip(["sN", "zs"], run_ort(path, {"x": x})):
        np.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=1e-5, err_msg=name)
    assert sum("unrolled: 5 iterations" in line for line in m.plan["meta"]["pass_log"]) == 2


def test_a_chain_of_loops_past_the_bound_is_one_clear_error(tmp_path):
    """Each loop of a chain waits for a fold of the one before it; a chain longer than the bound
    (a hostile model) stops with one error, instead of folding once per loop without end."""
    from dlcc.loops import MAX_CHAINED, MAX_DEPTH

    nodes, prev = [], "x"
    for k in range(MAX_DEPTH + MAX_CHAINED + 2):
        body = h.make_graph([h.make_node("Gather", [prev, f"i{k}"], [f"xi{k}"], axis=0)], f"b{k}",
                            [_vi(f"i{k}", [], TP.INT64), _vi(f"c{k}", [], TP.BOOL)],
                            [_vi(f"c{k}", [], TP.BOOL), _vi(f"xi{k}", [3])])
        nodes += [h.make_node("Shape", [prev], [f"s{k}"]), h.make_node("Gather", [f"s{k}", "zero"], [f"n{k}"], axis=0),
                  h.make_node("Less", ["zero", f"n{k}"], [f"go{k}"]),
                  h.make_node("Loop", [f"n{k}", f"go{k}"], [f"ys{k}"], body=body)]
        prev = f"ys{k}"
    path = _save(tmp_path / "chain.onnx", nodes, [_vi("x", [2, 3])], [_vi(prev, [2, 3])],
                 [nh.from_array(np.array(0, np.int64), "zero")])
    with pytest.raises(UnsupportedControlFlowError, match="follow from each other's outputs more than"):
        dlcc.compile(path, target="opencl", pipeline="baseline")


def test_a_while_loop_whose_counter_starts_at_run_time_is_one_clear_error(tmp_path):
    with pytest.raises(UnsupportedControlFlowError, match="is a while loop: .* from values known only at run time"):
        dlcc.compile(counted_while_model(tmp_path / "w.onnx", start="input"), target="opencl")


def test_a_condition_that_builds_tensors_is_not_run_at_compile_time(tmp_path):
    """Only scalar counter arithmetic runs at compile time: a condition that sums a tensor of
    `t * 10**6` ones (which a hostile model could grow without bound) leaves the loop a while
    loop, refused, instead of allocating it."""
    path = counted_while_model(tmp_path / "w.onnx")
    m = onnx.load(path)
    body = m.graph.node[0].attribute[0].g
    for name in ("more", "c_out"):  # (the And that reads `more` goes after its new producer)
        body.node.remove(next(n for n in body.node if n.output[0] == name))
    body.initializer.append(nh.from_array(np.array([10**6], np.int64), "big"))
    body.node.extend([h.make_node("Mul", ["t64", "big"], ["n"]),
                      h.make_node("ConstantOfShape", ["n"], ["ones"], value=nh.from_array(np.ones(1, np.float32))),
                      h.make_node("ReduceSum", ["ones"], ["total"], keepdims=0),
                      h.make_node("Cast", ["steps"], ["steps_f"], to=TP.FLOAT),
                      h.make_node("Less", ["total", "steps_f"], ["more"]),
                      h.make_node("And", ["more", "below"], ["c_out"])])
    onnx.save(m, path)
    with pytest.raises(UnsupportedControlFlowError, match="is a while loop"):
        dlcc.compile(path, target="opencl")


def test_the_cli_names_the_loop(tmp_path):
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "dlcc.cli", "compile", loop_model(tmp_path / "l.onnx", cond_mode="computed"),
                        "-t", "opencl", "-o", str(tmp_path / "out")], capture_output=True, text=True)
    assert p.returncode == 2, p.stderr
    assert "while loop" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "out").exists()


def test_a_scan_axis_outside_the_input_is_one_clear_error(tmp_path):
    path = scan_model(tmp_path / "s.onnx")
    m = onnx.load(path)
    for a in m.graph.node[0].attribute:
        if a.name == "scan_input_axes":
            a.ints[1] = 5
    onnx.save(m, path)
    with pytest.raises(UnsupportedControlFlowError, match=r"Scan 's': scan axis 5 of 'b' is outside its 2 dimensions"):
        dlcc.compile(path, target="opencl")


def _with(path, edit):
    m = onnx.load(path)
    edit(m)
    onnx.save(m, path)
    return path


def test_a_scan_direction_outside_0_and_1_is_one_clear_error(tmp_path):
    """A direction of 2 read as reverse, and an axes list of another length as the first ones."""
    path = scan_model(tmp_path / "s.onnx", directions=(0, 2))
    with pytest.raises(ModelError, match=r"Scan 's': scan_input_directions \[0, 2\] must each be 0 \(forward\) or 1"):
        dlcc.compile(path, target="opencl")

    def drop_an_axis(m):
        a = next(a for a in m.graph.node[0].attribute if a.name == "scan_output_axes")
        del a.ints[1]
    path = _with(scan_model(tmp_path / "s2.onnx"), drop_an_axis)
    with pytest.raises(ModelError, match=r"scan_output_axes has 1 entries for its 2 scan outputs"):
        dlcc.compile(path, target="opencl")


@pytest.mark.parametrize("what, value, needle", [
    ("M", np.zeros(0, np.int64), r"the trip count M must be one integer; it is int64 of shape \[0\]"),
    ("M", np.array(2.0, np.float32), r"the trip count M must be one integer; it is float32 of shape \[\]"),
    ("c", np.zeros(0, bool), r"the condition must be one bool; it is bool of shape \[0\]"),
])
def test_a_loop_count_or_condition_that_is_not_one_value(tmp_path, what, value, needle):
    """An empty M or cond was a numpy ValueError (`cannot reshape array of size 0`)."""
    def swap(m):
        k = next(k for k, t in enumerate(m.graph.initializer) if t.name == what)
        m.graph.initializer[k].CopyFrom(nh.from_array(value, what))
    path = _with(loop_model(tmp_path / "l.onnx"), swap)
    with pytest.raises(ModelError, match=needle):
        dlcc.compile(path, target="opencl")


if torch is not None:
    class _Appends(torch.nn.Module):
        """A TorchScript loop that appends to a list: torch's TorchScript exporter writes a Loop
        that carries a sequence (SequenceEmpty, SequenceInsert in the body, ConcatFromSequence
        after it)."""

        def forward(self, x):
            h = torch.zeros_like(x[0])
            outs: list[torch.Tensor] = []
            for i in range(x.size(0)):
                h = torch.tanh(h * 0.5 + x[i])
                outs.append(h)
            return torch.stack(outs), h


@needs_opencl
@pytest.mark.skipif(torch is None, reason="torch (the models extra) is not installed")
def test_a_torchscript_loop_that_appends_to_a_list(tmp_path):
    path = tmp_path / "appends.onnx"
    x = torch.randn(5, 3, 4)
    with warnings.catch_warnings():  # (TorchScript export is deprecated in torch 2.13; it is still how such models were made)
        warnings.simplefilter("ignore")
        torch.onnx.export(torch.jit.script(_Appends()), (x,), str(path), dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["ys", "h"])
    assert {"Loop", "SequenceEmpty", "ConcatFromSequence"} <= {n.op_type for n in onnx.load(str(path)).graph.node}
    m = _run_both(str(path), {"x": x.numpy()}, "astitch")
    assert any("sequence op(s) resolved" in line for line in m.plan["meta"]["pass_log"])
    want = _Appends()(x)
    np.testing.assert_allclose(m({"x": x.numpy()})["ys"], want[0].numpy(), rtol=1e-5, atol=1e-6)


def _sequence_model(path, position_input=False):
    """Every sequence op with known positions: construct, insert (at a negative position), erase,
    at, length, split, concat with and without a new axis."""
    c = lambda name, v: nh.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes = [h.make_node("SequenceConstruct", ["a", "b"], ["s1"]),
             h.make_node("SequenceInsert", ["s1", "c", "m1"], ["s2"]),  # [a, c, b]
             h.make_node("SplitToSequence", ["c"], ["parts"], axis=1),  # c's 3 columns, kept [2, 1]
             h.make_node("SequenceAt", ["parts", "p" if position_input else "k2"], ["col"]),
             h.make_node("SequenceInsert", ["s2", "col"], ["s3"]),  # [a, c, b, col]
             h.make_node("SequenceErase", ["s3", "k0"], ["s4"]),  # [c, b, col]
             h.make_node("SequenceLength", ["s4"], ["n"]),
             h.make_node("SequenceErase", ["s4"], ["s5"]),  # [c, b]
             h.make_node("ConcatFromSequence", ["s5"], ["cat"], axis=1),
             h.make_node("ConcatFromSequence", ["s5"], ["stk"], axis=0, new_axis=1)]
    inputs = [_vi("a", [2, 3]), _vi("b", [2, 3]), _vi("c", [2, 3])] + ([_vi("p", [], TP.INT64)] if position_input else [])
    return _save(path, nodes, inputs, [_vi("cat", [2, 6]), _vi("stk", [2, 2, 3]), _vi("n", [], TP.INT64), _vi("col", [2, 1])],
                 [c("m1", -1), c("k2", 2), c("k0", 0)])


@needs_opencl
def test_sequence_ops_with_known_positions(tmp_path):
    feeds = {k: rng.standard_normal((2, 3)).astype(np.float32) for k in "abc"}
    _run_both(_sequence_model(tmp_path / "s.onnx"), feeds, "astitch")


@needs_opencl
@pytest.mark.parametrize("split", [[2, 1, 2], [4, 1], 2])
def test_a_split_into_a_sequence_by_sizes_held_in_an_initializer(tmp_path, split):
    """SplitToSequence's sizes as an initializer of several values, as onnxruntime's folding
    leaves a Constant node's list: the split is resolved at compile time (it was refused as an
    unsupported op; fuzz graph 1100065, `--more-ops`)."""
    nodes = [h.make_node("SplitToSequence", ["x", "sizes"], ["parts"], axis=1),
             h.make_node("SequenceAt", ["parts", "last"], ["y"]), h.make_node("Relu", ["y"], ["r"])]
    n = 5 % split if isinstance(split, int) else split[-1]
    path = _save(tmp_path / "split.onnx", nodes, [_vi("x", [3, 5])], [_vi("r", [3, n or split])],
                 [nh.from_array(np.array(split, np.int64), "sizes"), nh.from_array(np.array(-1, np.int64), "last")])
    _run_both(path, {"x": rng.standard_normal((3, 5)).astype(np.float32)}, "astitch")


def test_a_position_known_only_at_run_time_is_reported_unsupported(tmp_path):
    from dlcc.errors import UnsupportedOpsError

    path = _sequence_model(tmp_path / "s.onnx", position_input=True)
    with pytest.raises(UnsupportedOpsError, match="SequenceAt"):
        dlcc.compile(path, target="opencl")
    # (Binding the position's value, --shape p=1, makes it known.)
    cm = dlcc.compile(path, target="opencl", shapes={"p": 1})
    c = rng.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(cm({"a": c, "b": c, "c": c, "p": np.array(1, np.int64)})["col"], c[:, 1:2])
