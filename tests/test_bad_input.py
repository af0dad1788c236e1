"""Bad input gets one clear paragraph and a non-zero exit, never a traceback, and loses nothing."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dlcc
from conftest import run_main
from dlcc.errors import ConfigError, ModelError, ShapeError, UnsupportedOpsError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "resnet-tiny.onnx"
cli = run_main


def assert_clean_error(rc, out, err, *needles):
    assert rc != 0
    assert "Traceback" not in err and "Traceback" not in out
    text = " ".join((out + err).split())
    for n in needles:
        assert n in text, f"{n!r} not in {text!r}"


def _save(model, path):
    onnx.save(model, path)
    return path


def _relu_model(path, in_shape=(2, 3)):
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(in_shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(in_shape))])
    return _save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_truncated_onnx(tmp_path):
    data = EXAMPLE.read_bytes()
    bad = tmp_path / "truncated.onnx"
    bad.write_bytes(data[: len(data) // 3])
    with pytest.raises(ModelError):
        dlcc.compile(bad, target="opencl")
    rc, out, err = cli("compile", bad, "-o", tmp_path / "o")
    assert_clean_error(rc, out, err, "truncated.onnx")
    assert not (tmp_path / "o").exists()


def test_garbage_file(tmp_path):
    bad = tmp_path / "garbage.onnx"
    bad.write_bytes(os.urandom(4096))
    rc, out, err = cli("verify", bad)
    assert_clean_error(rc, out, err, "garbage.onnx")


def test_missing_file(tmp_path):
    rc, out, err = cli("compile", tmp_path / "nope.onnx")
    assert_clean_error(rc, out, err, "no such file")


def test_unsupported_ops_listed_all_at_once(tmp_path):
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="ok"),
        helper.make_node("MaxRoiPool", ["x2", "rois"], ["b"], name="first_pool", pooled_shape=[2, 2]),
        helper.make_node("Unique", ["a"], ["d"], name="the_unique"),
        helper.make_node("MaxRoiPool", ["x2", "rois"], ["e"], name="pool1", pooled_shape=[2, 2]),
    ]
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
         helper.make_tensor_value_info("x2", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 2, 2, 2]),
         helper.make_tensor_value_info("d", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, 2, 2, 2])],
        [numpy_helper.from_array(np.array(1, np.int64), "ax"), numpy_helper.from_array(np.array([2], np.int64), "k"),
         numpy_helper.from_array(np.array([[0, 0, 0, 3, 3]], np.float32), "rois")])
    path = _save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "unsup.onnx")
    with pytest.raises(UnsupportedOpsError) as e:
        dlcc.compile(path, target="opencl")
    assert set(e.value.ops) == {"Unique", "MaxRoiPool"}
    assert e.value.ops["MaxRoiPool"] == (2, "first_pool")
    rc, out, err = cli("compile", path)
    assert_clean_error(rc, out, err, "MaxRoiPool", "x2", "first_pool", "Unique", "the_unique")


def test_an_op_on_a_dtype_it_does_not_take_is_listed_with_it(tmp_path):
    """ReduceSum and ReduceMax take int32 and int64 (ops/reduce.py INT_REDUCE), ReduceMean and
    ReduceL2 do not: those are listed with their dtype, with the rest, before any compile."""
    nodes = [helper.make_node("ReduceSum", ["i"], ["s"], keepdims=0), helper.make_node("ReduceMax", ["i"], ["m"], keepdims=0),
             helper.make_node("ReduceMean", ["i"], ["mean"], keepdims=0, name="the_mean"),
             helper.make_node("ReduceL2", ["i"], ["l2"], keepdims=0)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("i", TensorProto.INT64, [2, 4])],
                          [helper.make_tensor_value_info(o, TensorProto.INT64, []) for o in ("s", "m", "mean", "l2")])
    path = _save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "intred.onnx")
    with pytest.raises(UnsupportedOpsError) as e:
        dlcc.compile(path, target="opencl")
    assert set(e.value.ops) == {"ReduceMean(int64)", "ReduceL2(int64)"}
    assert e.value.ops["ReduceMean(int64)"] == (1, "the_mean")


def test_custom_domain_op_is_reported(tmp_path):
    g = helper.make_graph([helper.make_node("FancyOp", ["x"], ["y"], name="fancy", domain="com.example")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    path = _save(m, tmp_path / "custom.onnx")
    rc, out, err = cli("compile", path)
    assert_clean_error(rc, out, err, "com.example::FancyOp", "fancy")


def test_unbound_dynamic_dim(tmp_path):
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])])
    path = _save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "dyn.onnx")
    with pytest.raises(ShapeError, match="'x'.*'batch'"):
        dlcc.compile(path, target="opencl")
    rc, out, err = cli("compile", path)
    assert_clean_error(rc, out, err, "'x'", "'batch'", "--shape x=Nx3")
    # Bound, it compiles; a wrong binding is named clearly.
    assert dlcc.compile(path, target="opencl", shapes=["x=4x3"]).inputs[0]["shape"] == [4, 3]
    rc, out, err = cli("compile", path, "--shape", "x=4x5")
    assert_clean_error(rc, out, err, "fixed to 3")
    rc, out, err = cli("compile", path, "--shape", "nosuch=4x3")
    assert_clean_error(rc, out, err, "'nosuch'", "inputs are: x")
    rc, out, err = cli("compile", path, "--shape", "x=4xa")
    assert_clean_error(rc, out, err, "x=4xa")


def test_every_unbound_named_dim_is_listed_at_once(tmp_path):
    """An LLM export has several named dims (onnxruntime-genai's: batch, sequence, past, total,
    head size); the error names all that are left, with a binding of each by name."""
    g = helper.make_graph([helper.make_node("Concat", ["past", "new"], ["present"], axis=1)], "g",
                          [helper.make_tensor_value_info("past", TensorProto.FLOAT, ["batch", "past_len", 8]),
                           helper.make_tensor_value_info("new", TensorProto.FLOAT, ["batch", "seq", 8])],
                          [helper.make_tensor_value_info("present", TensorProto.FLOAT, ["batch", "total", 8])])
    path = _save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "kv.onnx")
    rc, out, err = cli("compile", path)
    assert_clean_error(rc, out, err, "'batch'", "Unbound too: 'past_len', 'seq'",
                       "--shape batch=N --shape past_len=N --shape seq=N")
    rc, out, err = cli("compile", path, "--shape", "batch=2")
    assert_clean_error(rc, out, err, "'past_len'", "Unbound too: 'seq'", "--shape past_len=N --shape seq=N")
    m = dlcc.compile(path, target="opencl", shapes=["batch=2", "past_len=0", "seq=3"])
    new = np.ones((2, 3, 8), np.float32)
    np.testing.assert_array_equal(m({"past": np.zeros((2, 0, 8), np.float32), "new": new})["present"], new)


@pytest.mark.parametrize("kind,body,needles", [
    ("pipelines", "name: p\npasses:\n  - name: lower\n    optionz: {}\n", ["passes.0.optionz", "unknown key"]),
    ("pipelines", "name: p\npasses: 3\n", ["passes"]),
    ("pipelines", "name: p\npasses:\n  - name: lowr\n", ["passes.0.name", "unknown pass 'lowr'", "memplan"]),
    ("pipelines", "name: p\npasses:\n  - name: memplan\n    options: {inplace: maybe}\n", ["inplace"]),
    ("pipelines", "name: [unclosed\n", ["not valid YAML"]),
    ("devices", "name: x\nsms: many\n", ["sms", "integer"]),
    ("devices", "name: x\nsms: 4\nmax_threads_per_sm: 1\nmax_blocks_per_sm: 1\nregisters_per_sm: 1\n"
                "shared_mem_per_sm: 1\nshared_mem_per_block: 1\ndram_bandwidth_gbps: 1\npeak_tflops: {}\n"
                "launch_overhead_us: 1\nbogus_key: 2\n", ["bogus_key", "unknown key"]),
])
def test_bad_yaml_names_file_and_field(tmp_path, kind, body, needles):
    y = tmp_path / "bad.yaml"
    y.write_text(body)
    flag = "--pipeline" if kind == "pipelines" else "--device"
    with pytest.raises(ConfigError):
        dlcc.compile(EXAMPLE, target="opencl", **{flag[2:]: str(y)})
    rc, out, err = cli("compile", EXAMPLE, flag, y, "-o", tmp_path / "o")
    assert_clean_error(rc, out, err, "bad.yaml", *needles)
    assert not (tmp_path / "o").exists()


def test_unknown_builtin_names_list_the_valid_ones():
    rc, out, err = cli("compile", EXAMPLE, "--device", "h1000")
    assert_clean_error(rc, out, err, "unknown device 'h1000'", "h100", "pocl-cpu")
    rc, out, err = cli("compile", EXAMPLE, "--pipeline", "fast")
    assert_clean_error(rc, out, err, "unknown pipeline 'fast'", "baseline")


def test_external_data_outside_model_folder_is_refused(tmp_path):
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = numpy_helper.from_array(w, "w")
    t.data_location = TensorProto.EXTERNAL
    del t.external_data[:]
    for k, v in (("location", "../secret.bin"), ("offset", "0"), ("length", str(w.nbytes))):
        e = t.external_data.add()
        e.key, e.value = k, v
    t.ClearField("raw_data")
    (tmp_path / "secret.bin").write_bytes(w.tobytes())
    sub = tmp_path / "model"
    sub.mkdir()
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [t])
    path = sub / "m.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    with pytest.raises(ModelError, match="outside"):
        dlcc.compile(path, target="opencl")
    rc, out, err = cli("compile", path)
    assert_clean_error(rc, out, err, "../secret.bin", "outside")


def test_external_data_inside_folder_works(tmp_path):
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                          [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, tmp_path / "m.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="m.data", size_threshold=0)
    cm = dlcc.compile(tmp_path / "m.onnx", target="opencl")
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(cm({"x": x})["y"], x + w)


EVIL = [
    'x"); system("rm -rf /"); //',
    "*/ #include <stdio.h> /*",
    "__kernel void pwn() {}",
    "a\nb\\\n}",
    "import os; os.system('echo pwned')",
    "1bad name with spaces",
]


def test_injected_names_never_reach_generated_source(tmp_path):
    """Node and tensor names full of C/OpenCL/Python syntax compile, run, and never appear in source."""
    w = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", [EVIL[0], EVIL[1]], [EVIL[2]], name=EVIL[3]),
        helper.make_node("Relu", [EVIL[2]], [EVIL[4]], name=EVIL[5]),
        helper.make_node("Softmax", [EVIL[4]], [EVIL[5]], name=EVIL[0], axis=-1),
    ]
    g = helper.make_graph(nodes, EVIL[1], [helper.make_tensor_value_info(EVIL[0], TensorProto.FLOAT, [3, 4])],
                          [helper.make_tensor_value_info(EVIL[5], TensorProto.FLOAT, [3, 4])],
                          [numpy_helper.from_array(w, EVIL[1])])
    path = _save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "evil.onnx")
    out = tmp_path / "evil.dlcc"
    m = dlcc.compile(path, out=out, target="opencl")
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    got = m({EVIL[0]: x})[EVIL[5]]
    e = np.exp(np.maximum(x @ w, 0))
    np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
    for f in ("kernels.cu", "kernels.cl", "launcher.py"):
        text = (out / f).read_text()
        for piece in EVIL + ["rm -rf", "#include <stdio.h>", "pwn", "system(", "with spaces"]:
            assert piece not in text, (f, piece)


def test_failed_compile_leaves_nothing_and_keeps_old_artifact(tmp_path, monkeypatch):
    out = tmp_path / "a.dlcc"
    dlcc.compile(EXAMPLE, out=out, target="opencl")
    before = (out / "plan.json").read_bytes()
    import dlcc.artifact as art

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(art, "render", boom)
    with pytest.raises(KeyboardInterrupt):
        dlcc.compile(EXAMPLE, out=out, target="opencl")
    assert (out / "plan.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.dlcc"]
    with pytest.raises(KeyboardInterrupt):
        dlcc.compile(EXAMPLE, out=tmp_path / "new.dlcc", target="opencl")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.dlcc"]


def test_refuses_to_replace_a_non_artifact_directory(tmp_path):
    d = tmp_path / "precious"
    d.mkdir()
    (d / "notes.txt").write_text("keep me")
    rc, out, err = cli("compile", EXAMPLE, "-o", d)
    assert_clean_error(rc, out, err, "not a dlcc artifact")
    assert (d / "notes.txt").read_text() == "keep me"


def test_wrong_inputs_at_run_time(tmp_path):
    m = dlcc.compile(_relu_model(tmp_path / "r.onnx"), target="opencl")
    with pytest.raises(dlcc.DlccError, match="shape"):
        m({"x": np.zeros((3, 3), np.float32)})
    with pytest.raises(dlcc.DlccError, match="missing"):
        m({"y": np.zeros((2, 3), np.float32)})
    np.savez(tmp_path / "in.npz", x=np.zeros((5, 5), np.float32))
    dlcc.compile(tmp_path / "r.onnx", out=tmp_path / "r.dlcc", target="opencl")
    rc, out, err = cli("run", tmp_path / "r.dlcc", "--inputs", tmp_path / "in.npz", "--target", "opencl")
    assert_clean_error(rc, out, err, "'x'", "[5, 5]")
    rc, out, err = cli("run", tmp_path / "nothing-here")
    assert_clean_error(rc, out, err, "not a dlcc artifact")


def test_cyclic_graph(tmp_path):
    g = helper.make_graph([helper.make_node("Relu", ["b"], ["a"], name="n1"), helper.make_node("Relu", ["a"], ["b"], name="n2")],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])])
    path = tmp_path / "cyc.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    rc, out, err = cli("compile", path)
    assert_clean_error(rc, out, err, "cyc.onnx", "cyclic")
    # a node that reads its own output, and a read of a tensor nothing produces
    for nodes, want in (([helper.make_node("Add", ["x", "b"], ["b"], name="self")], "cyclic"),
                        ([helper.make_node("Relu", ["nowhere"], ["b"], name="n1")], "'nowhere', which no node")):
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])])
        path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
        rc, out, err = cli("compile", path)
        assert_clean_error(rc, out, err, "cyc.onnx", want)


def test_nodes_out_of_order_are_sorted(tmp_path):
    """ONNX asks for nodes in an order that computes every input first, but onnxruntime sorts a
    graph written out of order and runs it (a hand edit, a graph surgeon's insertion); so does
    dlcc, and an If's branch that reads an outer value waits for it too. Same outputs as
    onnxruntime's."""
    f = TensorProto.FLOAT
    then = helper.make_graph([helper.make_node("Mul", ["t", "t"], ["o1"])], "then", [], [helper.make_tensor_value_info("o1", f, [2, 3])])
    other = helper.make_graph([helper.make_node("Neg", ["t"], ["o2"])], "else", [], [helper.make_tensor_value_info("o2", f, [2, 3])])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if"),
             helper.make_node("Tanh", ["s"], ["t"], name="tanh"),
             helper.make_node("ReduceSum", ["x"], ["r"], keepdims=0, name="sum"),
             helper.make_node("Greater", ["r", "zero"], ["c"], name="gt"),
             helper.make_node("Sigmoid", ["x"], ["s"], name="sig")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, [2, 3])], [helper.make_tensor_value_info("y", f, [2, 3])],
                          [numpy_helper.from_array(np.float32(0), "zero")])
    path = _save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "unsorted.onnx")
    import onnxruntime as ort

    for sign in (1, -1):
        feeds = {"x": sign * np.abs(np.random.default_rng(0).standard_normal((2, 3))).astype(np.float32)}
        ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        np.testing.assert_allclose(dlcc.compile(path, target="opencl")(feeds)["y"], ref, rtol=1e-6, atol=1e-6)


def test_an_unnamed_main_graph_runs_as_onnxruntime_runs_it(tmp_path):
    """The checker wants every graph named; onnxruntime runs a model whose main graph has no name
    (crack-tcaptcha ships one), and so does dlcc: same outputs. (Both refuse an unnamed branch.)"""
    f = TensorProto.FLOAT
    then = helper.make_graph([helper.make_node("Neg", ["x"], ["a"])], "then", [], [helper.make_tensor_value_info("a", f, [2])])
    other = helper.make_graph([helper.make_node("Abs", ["x"], ["b"])], "else", [], [helper.make_tensor_value_info("b", f, [2])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["r"], keepdims=0), helper.make_node("Greater", ["r", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    g = helper.make_graph(nodes, "", [helper.make_tensor_value_info("x", f, [2])], [helper.make_tensor_value_info("y", f, [2])],
                          [numpy_helper.from_array(np.float32(0), "zero")])
    path = tmp_path / "unnamed.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    import onnxruntime as ort

    for x in ([1.0, 2.0], [-1.0, -2.0]):
        feeds = {"x": np.array(x, np.float32)}
        ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        np.testing.assert_array_equal(dlcc.compile(path, target="opencl")(feeds)["y"], ref)


def test_shapes_that_do_not_fit_once_folded_are_named(tmp_path):
    """A MatMul whose operand is reshaped to a shape only dlcc's folding finds (the target goes
    through a Cast, which onnx's shape inference does not propagate), to batch dims that do not
    broadcast with the other operand's. onnxruntime refuses such a model; dlcc names the node and
    both shapes, not the Shape nodes left unfolded (as an unsupported op), nor a data-dependent
    shape. (A tiny CANINE export from transformers looked like this.)"""
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    nodes = [helper.make_node("Shape", ["a"], ["s"]), helper.make_node("Cast", ["s"], ["sf"], to=f),
             helper.make_node("Cast", ["sf"], ["si"], to=i64), helper.make_node("Concat", ["si", "si"], ["t"], axis=0),
             helper.make_node("Reshape", ["x", "t"], ["r"]), helper.make_node("MatMul", ["r", "b"], ["y"], name="mm"),
             helper.make_node("Shape", ["y"], ["ys"]), helper.make_node("Cast", ["ys"], ["z"], to=f)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", f, [2, 3]), helper.make_tensor_value_info("x", f, [36]),
                                       helper.make_tensor_value_info("b", f, [4, 3, 3, 2])],
                          [helper.make_tensor_value_info("z", f, [4])])
    path = _save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "mm.onnx")
    with pytest.raises(ShapeError) as e:
        dlcc.compile(path, target="opencl")
    assert "MatMul node 'mm' cannot take the shapes of its inputs" in str(e.value), str(e.value)
    assert "[2, 3, 2, 3]" in str(e.value) and "[4, 3, 3, 2]" in str(e.value)
    rc, out, err = cli("compile", path, "-o", tmp_path / "out")
    assert_clean_error(rc, out, err, "MatMul node 'mm' cannot take the shapes of its inputs")
    assert "Shape" not in err.split("cannot take")[0] and not (tmp_path / "out").exists()


def test_shape_bindings_from_yaml(tmp_path):
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "n"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "n"])])
    path = _save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "dyn2.onnx")
    good = tmp_path / "shapes.yaml"
    good.write_text("shapes:\n  batch: 2\n  n: 5\n")
    assert dlcc.compile(path, target="opencl", shapes=[str(good)]).inputs[0]["shape"] == [2, 5]
    good.write_text("shapes:\n  x: [3, 4]\n")
    rc, out, err = cli("compile", path, "--shape", good, "-o", tmp_path / "o", "-q")
    assert rc == 0, err
    bad = tmp_path / "bad_shapes.yaml"
    bad.write_text("shapes:\n  x: [3, -4]\nextra: 1\n")
    rc, out, err = cli("compile", path, "--shape", bad)
    assert_clean_error(rc, out, err, "bad_shapes.yaml", "shapes.x", "extra")


def test_unknown_target(tmp_path):
    rc, out, err = cli("compile", EXAMPLE, "--target", "metal", "-o", tmp_path / "o")
    assert_clean_error(rc, out, err, "unknown target 'metal'", "opencl")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args,needle", [
    (["compile"], "Missing argument"),
    (["frobnicate"], "No such command"),
    (["verify", "x.onnx", "--rtol", "abc"], "--rtol"),
])
def test_usage_errors_are_not_tracebacks(args, needle):
    rc, out, err = cli(*args)
    assert rc == 2
    assert_clean_error(rc, out, err, needle)
    assert "internal error" not in err


def test_unwritable_and_incomplete_paths(tmp_path):
    rc, out, err = cli("compile", EXAMPLE, "-o", tmp_path / "missing" / "deeper" / "x", "-q")
    assert rc == 0, err  # parents are created
    rc, out, err = cli("run", tmp_path / "missing" / "deeper" / "x", "--outputs", tmp_path / "nodir" / "o.npz")
    assert_clean_error(rc, out, err, "does not exist")
    (tmp_path / "missing" / "deeper" / "x" / "weights.bin").unlink()
    rc, out, err = cli("run", tmp_path / "missing" / "deeper" / "x")
    assert_clean_error(rc, out, err, "incomplete artifact")


def test_ir3_model_with_an_unlisted_initializer_compiles(tmp_path):
    """IR 3 wanted every initializer among the graph inputs; old writers (onnxruntime's own
    datasets/mul_1.onnx) left them out, the checker refuses that, and onnxruntime runs it anyway.
    dlcc reads it as IR 4 does (the initializer is a constant) and matches onnxruntime."""
    import onnxruntime as ort

    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [3, 2])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, 2])
    w = helper.make_tensor("W", TensorProto.FLOAT, [3, 2], [1, 2, 3, 4, 5, 6])
    m = helper.make_model(helper.make_graph([helper.make_node("Mul", ["X", "W"], ["Y"])], "g", [x], [y], [w]),
                          opset_imports=[helper.make_opsetid("", 7)], ir_version=3)
    path = tmp_path / "mul_1.onnx"
    onnx.save(m, str(path))
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(onnx.load(str(path)))  # (what the checker says of the file itself)
    feeds = {"X": np.arange(6, dtype=np.float32).reshape(3, 2)}
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = dlcc.compile(path, target="opencl")(feeds)["Y"]
    np.testing.assert_array_equal(got, ref)


def test_shape_inference_failing_inside_an_ops_function_body_is_not_the_models_fault(tmp_path):
    """onnx 1.23's strict inference fails inside MeanVarianceNormalization's function body (its
    Constant): dlcc retries leniently for such ops, while a model's own shape error still fails."""
    from dlcc.frontend import infer_shapes

    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [3, 3, 3, 1])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, 3, 3, 1])
    mvn = helper.make_model(helper.make_graph([helper.make_node("MeanVarianceNormalization", ["X"], ["Y"])], "g",
                                              [x], [y]), opset_imports=[helper.make_opsetid("", 13)])
    assert infer_shapes(mvn, "mvn.onnx").graph.output[0].name == "Y"
    a = helper.make_tensor_value_info("A", TensorProto.FLOAT, [3, 4])
    b = helper.make_tensor_value_info("B", TensorProto.FLOAT, [5, 6])
    bad = helper.make_model(helper.make_graph([helper.make_node("Add", ["A", "B"], ["C"])], "g", [a, b],
                                              [helper.make_tensor_value_info("C", TensorProto.FLOAT, None)]),
                            opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(ModelError, match="shape inference failed"):
        infer_shapes(bad, "bad.onnx")
