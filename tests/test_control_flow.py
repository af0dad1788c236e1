"""`If` (dlcc/control_flow.py): a condition known at compile time inlines the branch it takes; one
computed from the inputs runs both branches and selects with Where. Results against onnxruntime
on PoCL with inputs that take each branch; the branches that cannot be selected are clear errors."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

import dlcc
from conftest import opencl_device_available, run_ort
from dlcc.errors import UnsupportedControlFlowError
from dlcc.frontend import import_model

needs_opencl = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")
rng = np.random.default_rng(0)


def _branch(name, nodes, out, shape, inits=()):
    return h.make_graph(nodes, name, [], [h.make_tensor_value_info(out, TP.FLOAT, shape)], list(inits))


def then_else(shape=(4, 6), else_shape=None):
    """Two branches over the outer x that both define `t` and `w` (renaming must keep them apart):
    then: exp(x) @ w + 1, with w its own initializer; else: sqrt(x) * w' - x, whose sqrt of a
    negative x is NaN wherever the else branch is not taken."""
    k = shape[-1]
    then = _branch("then", [h.make_node("Exp", ["x"], ["t"]), h.make_node("MatMul", ["t", "w"], ["u"]),
                            h.make_node("Add", ["u", "one"], ["y_then"])], "y_then", list(shape),
                   [nh.from_array(rng.standard_normal((k, k)).astype(np.float32) * 0.3, "w"),
                    nh.from_array(np.ones((1,), np.float32), "one")])
    eshape = else_shape or shape
    enodes = [h.make_node("Sqrt", ["x"], ["t"]), h.make_node("Mul", ["t", "w"], ["u"]),
              h.make_node("Sub", ["u", "x"], ["y_else"])]
    if else_shape:
        enodes.append(h.make_node("ReduceSum", ["y_else", "ax"], ["y_else2"], keepdims=0))
    els = _branch("else", enodes, "y_else2" if else_shape else "y_else", list(eshape[:-1] if else_shape else eshape),
                  [nh.from_array(rng.standard_normal((k,)).astype(np.float32), "w")]
                  + ([nh.from_array(np.array([-1], np.int64), "ax")] if else_shape else []))
    return then, els


def _save(path, nodes, inits, shape=(4, 6), out_shape=(4, 6), opset=17):
    g = h.make_graph(nodes, "if_model", [h.make_tensor_value_info("x", TP.FLOAT, list(shape))],
                     [h.make_tensor_value_info("y", TP.FLOAT, list(out_shape))], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, path)
    return str(path)


def computed_if(path, shape=(4, 6), else_shape=None, extra_then=()):
    """y = If(sum(x) > 0, then, else) * 2: the condition depends on the input."""
    then, els = then_else(shape, else_shape)
    then.node.extend(extra_then)
    nodes = [h.make_node("ReduceSum", ["x"], ["s"], keepdims=0), h.make_node("Greater", ["s", "zero"], ["c"]),
             h.make_node("If", ["c"], ["r"], then_branch=then, else_branch=els),
             h.make_node("Mul", ["r", "two"], ["y"])]
    return _save(path, nodes, [nh.from_array(np.zeros((), np.float32), "zero"),
                               nh.from_array(np.full((1,), 2, np.float32), "two")], shape)


def constant_if(path, value: bool):
    then, els = then_else()
    nodes = [h.make_node("If", ["c"], ["r"], then_branch=then, else_branch=els), h.make_node("Relu", ["r"], ["y"])]
    return _save(path, nodes, [nh.from_array(np.array(value), "c")])


def _check(path, x, pipeline="astitch"):
    cm = dlcc.compile(path, target="opencl", pipeline=pipeline)
    got = cm({"x": x})["y"]
    ref = run_ort(path, {"x": x})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    return cm


@pytest.mark.parametrize("fold", [True, False])
def test_constant_condition_inlines_only_the_taken_branch(tmp_path, fold):
    """dlcc inlines such an If itself, before onnxruntime's folding (which crashed the process on
    a bound Silero VAD), with or without that folding, and says so."""
    for value in (True, False):
        g = import_model(constant_if(tmp_path / f"c{value}.onnx", value), fold=fold)
        ops = [n.op_type for n in g.nodes]
        assert "If" not in ops and "Where" not in ops
        assert ("Exp" in ops) == value and ("Sqrt" in ops) == (not value)
        assert any("inlined" in n for n in g.notes)


@needs_opencl
@pytest.mark.parametrize("value", [True, False])
def test_constant_condition_matches_onnxruntime(tmp_path, value):
    x = np.abs(rng.standard_normal((4, 6))).astype(np.float32)
    _check(constant_if(tmp_path / "c.onnx", value), x)


@needs_opencl
@pytest.mark.parametrize("pipeline", ["baseline", "astitch", "full"])
def test_computed_condition_selects_the_branch_onnxruntime_takes(tmp_path, pipeline):
    """Inputs that take each branch; the else branch's Sqrt of a negative x is NaN where the then
    branch is taken, and must not leak into the selected output."""
    path = computed_if(tmp_path / "m.onnx")
    cm = dlcc.compile(path, target="opencl", pipeline=pipeline)
    for x in (np.abs(rng.standard_normal((4, 6))).astype(np.float32) + 0.1,      # then (and else is finite)
              rng.standard_normal((4, 6)).astype(np.float32) + 0.5,              # then; else has NaNs
              -np.abs(rng.standard_normal((4, 6))).astype(np.float32) - 0.1):     # else
        got, ref = cm({"x": x})["y"], run_ort(path, {"x": x})[0]
        assert np.isfinite(ref).all() == np.isfinite(got).all()
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    assert any("both branches computed" in line for line in cm.plan["meta"]["pass_log"])


@needs_opencl
def test_nested_if(tmp_path):
    """A computed If inside the then branch of a computed If: inlined over two rounds."""
    inner_then, inner_else = then_else()
    inner = [h.make_node("ReduceMax", ["x"], ["m"], keepdims=0), h.make_node("Greater", ["m", "lim"], ["c2"]),
             h.make_node("If", ["c2"], ["z"], then_branch=inner_then, else_branch=inner_else)]
    outer_then = _branch("outer_then", inner, "z", [4, 6], [nh.from_array(np.array(1.5, np.float32), "lim")])
    outer_else = _branch("outer_else", [h.make_node("Neg", ["x"], ["n"])], "n", [4, 6])
    nodes = [h.make_node("ReduceSum", ["x"], ["s"], keepdims=0), h.make_node("Greater", ["s", "zero"], ["c"]),
             h.make_node("If", ["c"], ["y"], then_branch=outer_then, else_branch=outer_else)]
    path = _save(tmp_path / "n.onnx", nodes, [nh.from_array(np.zeros((), np.float32), "zero")])
    g = import_model(path)
    assert [n.op_type for n in g.nodes].count("Where") == 2
    for x in (np.abs(rng.standard_normal((4, 6))).astype(np.float32) * 0.2,   # outer then, inner else
              np.abs(rng.standard_normal((4, 6))).astype(np.float32) * 3,     # outer then, inner then
              -np.abs(rng.standard_normal((4, 6))).astype(np.float32)):       # outer else
        _check(path, x)


def test_branches_of_different_shapes_are_one_clear_error(tmp_path):
    path = computed_if(tmp_path / "d.onnx", else_shape=(4, 6))
    with pytest.raises(UnsupportedControlFlowError, match=r"If .*both branches.*then_branch.*else_branch"):
        dlcc.compile(path, target="opencl", pipeline="baseline")


def test_computed_indices_in_a_branch_are_refused(tmp_path):
    gather = [h.make_node("ArgMax", ["x"], ["i"], axis=1, keepdims=0),
              h.make_node("Gather", ["x", "i"], ["g"], axis=1)]
    path = computed_if(tmp_path / "g.onnx", extra_then=gather)
    with pytest.raises(UnsupportedControlFlowError, match="Gather"):
        import_model(path)


def test_cli_reports_the_if_error_without_a_traceback(tmp_path):
    from test_bad_input import assert_clean_error, cli

    path = computed_if(tmp_path / "d.onnx", else_shape=(4, 6))
    rc, out, err = cli("compile", path, "-t", "opencl", "-o", tmp_path / "out")
    assert_clean_error(rc, out, err, "else_branch", "float32[4]")
    assert not (tmp_path / "out").exists()


def mode_if(path):
    """y = If(mode == 16, then: x * 2, else: Reshape(x, [-1]) summed to a scalar) + 0: the branches
    differ in shape, so with `mode` left an input the If cannot be selected elementwise; bound
    (`--shape mode=16`) it inlines. The then branch also holds a shape test on x (`x.dim() == 2`)
    that is known only once the branch is in the main graph."""
    inner_then = _branch("dim2", [h.make_node("Mul", ["x", "two"], ["d2"])], "d2", [4, 6])
    inner_else = _branch("dimn", [h.make_node("Neg", ["x"], ["dn"])], "dn", [4, 6])
    then = _branch("then", [h.make_node("Shape", ["x"], ["shp"]), h.make_node("Size", ["shp"], ["rank"]),
                            h.make_node("Equal", ["rank", "two_i"], ["is2"]),
                            h.make_node("If", ["is2"], ["t"], then_branch=inner_then, else_branch=inner_else)],
                   "t", [4, 6])
    els = _branch("else", [h.make_node("ReduceSum", ["x"], ["e"], keepdims=0)], "e", [])
    nodes = [h.make_node("Equal", ["mode", "sixteen"], ["c"]),
             h.make_node("If", ["c"], ["r"], then_branch=then, else_branch=els),
             h.make_node("Add", ["r", "zero"], ["y"])]
    g = h.make_graph(nodes, "mode", [h.make_tensor_value_info("x", TP.FLOAT, [4, 6]),
                                     h.make_tensor_value_info("mode", TP.INT64, [])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [4, 6])],
                     [nh.from_array(np.array(16, np.int64), "sixteen"), nh.from_array(np.array(2, np.int64), "two_i"),
                      nh.from_array(np.float32(2), "two"), nh.from_array(np.zeros((1,), np.float32), "zero")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return str(path)


def test_a_bound_scalar_input_decides_the_if_at_compile_time(tmp_path):
    path = mode_if(tmp_path / "mode.onnx")
    with pytest.raises(UnsupportedControlFlowError, match=r"input\(s\) mode"):
        import_model(path)  # both branches would run, and their outputs differ in shape
    g = import_model(path, {"mode": (16,)})
    assert g.bound_values == {"mode": 16} and "mode" in g.inputs
    ops = [n.op_type for n in g.nodes]
    assert "If" not in ops and "Where" not in ops and "Neg" not in ops and "ReduceSum" not in ops
    assert sum("inlined" in n for n in g.notes) == 2  # the If on mode, then the shape test inside it


@needs_opencl
def test_a_bound_value_is_checked_when_the_model_runs(tmp_path):
    from dlcc.executor import InputError

    path = mode_if(tmp_path / "mode.onnx")
    cm = dlcc.compile(path, target="opencl", pipeline="astitch", shapes={"mode": (16,)})
    assert cm.plan["meta"]["bound_values"] == {"mode": 16}
    feeds = cm.sample_inputs(0)
    assert feeds["mode"] == 16
    np.testing.assert_allclose(cm(feeds)["y"], run_ort(path, feeds)[0], rtol=1e-6)
    with pytest.raises(InputError, match="compiled for mode=16"):
        cm({"x": feeds["x"], "mode": np.array(8)})


def test_a_value_binding_must_fit_the_scalar(tmp_path):
    from dlcc.errors import ShapeError

    path = mode_if(tmp_path / "mode.onnx")
    with pytest.raises(ShapeError, match="one number"):
        import_model(path, {"mode": (16, 2)})
    # the scalar's own shape, (), binds nothing: the input stays one, its value given at run time
    # (here the branches differ, so the import then asks for the value instead)
    with pytest.raises(UnsupportedControlFlowError, match="Binding the value of a scalar int input"):
        import_model(path, {"mode": ()})


def test_a_value_binding_may_be_negative_where_a_dim_may_not(tmp_path):
    """A scalar input's value may be 0 or negative; a dim may be 0 (an empty input: a KV cache's
    first step), never negative."""
    from dlcc.errors import ShapeError
    from dlcc.frontend import parse_shape_binding

    path = mode_if(tmp_path / "mode.onnx")
    g = import_model(path, dict([parse_shape_binding("mode=0")]))
    ops = [n.op_type for n in g.nodes]
    assert g.bound_values == {"mode": 0} and "ReduceSum" in ops and "Mul" not in ops
    assert import_model(path, dict([parse_shape_binding("mode=-3")])).bound_values == {"mode": -3}
    with pytest.raises(ShapeError, match="dims must be 0 or more"):
        import_model(path, {"mode": (16,), "x": (4, -1)})
    with pytest.raises(ShapeError, match="dims of 0 or more"):
        parse_shape_binding("x=4x-1")
    assert parse_shape_binding("x=4x0") == ("x", (4, 0))
