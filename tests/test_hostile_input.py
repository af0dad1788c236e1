"""Hostile input (issue 19): attributes outside the ONNX spec are one error naming the node and the
attribute (ops/checks.py), before anything can divide by zero, loop forever or compute a wrong
answer; names that look like rich markup print as themselves."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from typer.testing import CliRunner

import dlcc
from dlcc.cli import app
from dlcc.errors import DlccError, ModelError


def _model(path, node, inputs, outputs, inits=None, opset=17):
    g = h.make_graph([node], "g", [h.make_tensor_value_info(n, T.FLOAT, s) for n, s in inputs],
                     [h.make_tensor_value_info(n, T.FLOAT, s) for n, s in outputs],
                     [nh.from_array(v, k) for k, v in (inits or {}).items()])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", opset)]), path)
    return path


W = np.ones((4, 1, 3, 3), np.float32)
BN = {"s": np.ones(3, np.float32), "b": np.zeros(3, np.float32), "m": np.zeros(3, np.float32)}
X = [("x", [1, 4, 8, 8])]

CASES = {
    # a negative group made the depthwise kernel's loop bound negative: it never finished
    "conv-group-minus-one": (h.make_node("Conv", ["x", "w"], ["y"], group=-1, name="c"), X, [("y", [1, 4, 6, 6])],
                             {"w": W}, "group -1 must be at least 1"),
    "conv-group-zero": (h.make_node("Conv", ["x", "w"], ["y"], group=0, name="c"), X, [("y", [1, 4, 6, 6])],
                        {"w": W}, "group 0 must be at least 1"),
    "conv-group-not-dividing": (h.make_node("Conv", ["x", "w"], ["y"], group=3, name="c"), X, [("y", [1, 4, 6, 6])],
                                {"w": W}, "group 3 does not divide the input's 4 channels"),
    "conv-negative-stride": (h.make_node("Conv", ["x", "w"], ["y"], group=4, strides=[1, -1], name="c"), X,
                             [("y", [1, 4, 6, 6])], {"w": W}, "strides [1, -1] must be at least 1 in every entry"),
    "maxpool-zero-kernel": (h.make_node("MaxPool", ["x"], ["y"], kernel_shape=[0, 2], name="c"), X,
                            [("y", [1, 4, 8, 7])], {}, "kernel_shape [0, 2] must be at least 1 in every entry"),
    "lstm-hidden-zero": (h.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=0, name="c"), [("x", [5, 1, 4])],
                         [("y", [5, 1, 1, 0])], {"W": np.zeros((1, 0, 4), np.float32), "R": np.zeros((1, 0, 0), np.float32)},
                         "hidden_size 0 must be at least 1"),
    "lstm-sideways": (h.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=2, direction="sideways", name="c"),
                      [("x", [5, 1, 4])], [("y", [5, 1, 1, 2])],
                      {"W": np.zeros((1, 8, 4), np.float32), "R": np.zeros((1, 8, 2), np.float32)},
                      "direction 'sideways' is not forward, reverse or bidirectional"),
    # onnxruntime gives NaN where dlcc gave inf: no answer is right, so none is given
    "batchnorm-var-plus-eps-zero": (h.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=0.0,
                                                name="c"), [("x", [1, 3, 4, 4])], [("y", [1, 3, 4, 4])],
                                    {**BN, "v": np.array([1, 0, 2], np.float32)},
                                    "var + epsilon is not positive for 1 channel(s) (channel 1: var 0, epsilon 0)"),
    # found by scripts/hostile_corpus.py: an IndexError in the Transpose lowering
    "transpose-perm-not-a-permutation": (h.make_node("Transpose", ["x"], ["y"], perm=[0, 0, 1, 2], name="c"), X,
                                         [("y", [1, 1, 4, 8])], {}, "perm [0, 0, 1, 2] is not a permutation of the "
                                                                     "input's 4 axes"),
    "gatherelements-indices-of-another-rank": (h.make_node("GatherElements", ["x", "i"], ["y"], name="c"), X,
                                               [("y", [2, 2])], {"i": np.zeros((2, 2), np.int64)},
                                               "indices of rank 2 for data of rank 4: they must have the same rank"),
    # indices longer than data across the axis: GatherElements read past data's rows
    "gatherelements-indices-wider-than-data": (h.make_node("GatherElements", ["x", "i"], ["y"], axis=3, name="c"), X,
                                               [("y", [2, 4, 8, 3])], {"i": np.zeros((2, 4, 8, 3), np.int64)},
                                               "indices [2, 4, 8, 3] are longer than data [1, 4, 8, 8] along axis 0, "
                                               "which is not the GatherElements's axis 3"),
    # the axis is an input here: -3 of a rank-2 input read before the tensor
    "cumsum-axis-out-of-range": (h.make_node("CumSum", ["x2", "a"], ["y"], name="c"), [("x2", [3, 7])],
                                 [("y", [3, 7])], {"a": np.array(-3, np.int64)}, "axis -3 is outside [-2, 2)"),
    "gathernd-index-tuples-too-long": (h.make_node("GatherND", ["x", "i"], ["y"], name="c"), X, [("y", [2])],
                                       {"i": np.zeros((2, 5), np.int64)},
                                       "index tuples of 5 components for data of rank 4 with batch_dims 0"),
    "softmax-axis-far-out": (h.make_node("Softmax", ["x"], ["y"], axis=-(2 ** 63), name="c"), X, [("y", [1, 4, 8, 8])],
                             {}, f"axis {-(2 ** 63)} is outside [-4, 4)"),
    # opset 18's axes: a repeated or out-of-range axis
    "resize-axes-repeated": (h.make_node("Resize", ["x", "", "s"], ["y"], axes=[2, -2], name="c"), X,
                             [("y", [1, 4, 16, 8])], {"s": np.array([2.0, 2.0], np.float32)},
                             "axes [2, -2] must be distinct axes of a rank-4 input", 19),
    "resize-axes-out-of-range": (h.make_node("Resize", ["x", "", "s"], ["y"], axes=[2, 4], name="c"), X,
                                 [("y", [1, 4, 16, 8])], {"s": np.array([2.0, 2.0], np.float32)},
                                 "axes [2, 4] must be distinct axes of a rank-4 input", 19),
    "resize-scales-zero": (h.make_node("Resize", ["x", "", "s"], ["y"], name="c"), X, [("y", [1, 4, 8, 8])],
                           {"s": np.array([1, 1, 0, 1], np.float32)}, "scales [1.0, 1.0, 0.0, 1.0] must be finite and positive"),
    # ops/operand_checks.py: operands the kernels read past (garbage out), flags and strings outside
    # their values (read as something else), and combinations the spec rules out
    "clip-min-empty": (h.make_node("Clip", ["x", "lo"], ["y"], name="c"), X, [("y", [1, 4, 8, 8])],
                       {"lo": np.zeros(0, np.float32)}, "min has shape [0]; it must hold one value (a scalar)", 13),
    "pad-constant-value-two": (h.make_node("Pad", ["x", "p", "v"], ["y"], name="c"), X, [("y", [1, 4, 10, 8])],
                               {"p": np.array([0, 0, 1, 0, 0, 0, 1, 0], np.int64), "v": np.array([1, 2], np.float32)},
                               "constant_value has shape [2]; it must hold one value (a scalar)"),
    "prelu-slope-not-broadcasting": (h.make_node("PRelu", ["x", "s"], ["y"], name="c"), X, [("y", [1, 4, 8, 8])],
                                     {"s": np.ones(3, np.float32)},
                                     "the slope [3] does not broadcast to the input [1, 4, 8, 8]"),
    "gemm-c-not-broadcasting": (h.make_node("Gemm", ["a", "b", "cc"], ["y"], name="c"), [("a", [3, 4])], [("y", [3, 5])],
                                {"b": np.ones((4, 5), np.float32), "cc": np.ones(3, np.float32)},
                                "C [3] does not broadcast to the output [3, 5]"),
    "conv-bias-short": (h.make_node("Conv", ["x", "w", "b"], ["y"], group=4, name="c"), X, [("y", [1, 4, 6, 6])],
                        {"w": W, "b": np.ones(3, np.float32)}, "the bias [3] must hold one value per output channel (4)"),
    "instancenorm-scale-short": (h.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], name="c"), X,
                                 [("y", [1, 4, 8, 8])], {"s": np.ones(2, np.float32), "b": np.ones(4, np.float32)},
                                 "scale [2] must hold one value per channel (4)"),
    "reducesum-noop-flag-two": (h.make_node("ReduceSum", ["x"], ["y"], noop_with_empty_axes=2, name="c"), X,
                                [("y", [1, 1, 1, 1])], {}, "noop_with_empty_axes 2 is not 0 or 1"),
    "conv-auto-pad-foo": (h.make_node("Conv", ["x", "w"], ["y"], group=4, auto_pad="FOO", name="c"), X,
                          [("y", [1, 4, 6, 6])], {"w": W},
                          "auto_pad 'FOO' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID"),
    "conv-valid-with-pads": (h.make_node("Conv", ["x", "w"], ["y"], group=4, auto_pad="VALID", pads=[1, 1, 1, 1],
                                         name="c"), X, [("y", [1, 4, 6, 6])], {"w": W},
                             "pads [1, 1, 1, 1] are given with auto_pad 'VALID'; the spec allows one or the other"),
    "gelu-approximate-foo": (h.make_node("Gelu", ["x"], ["y"], approximate="foo", name="c"), X, [("y", [1, 4, 8, 8])],
                             {}, "approximate 'foo' is not one of none, tanh", 20),
    "mod-float-fmod-0": (h.make_node("Mod", ["x", "x"], ["y"], name="c"), X, [("y", [1, 4, 8, 8])], {},
                         "fmod 0 on floating-point inputs: the spec requires fmod 1 for them"),
    "maxpool-pads-as-long-as-the-kernel": (h.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], pads=[2, 0, 0, 0],
                                                       name="c"), X, [("y", [1, 4, 9, 7])], {},
                                           "pads [2, 0, 0, 0] must each be smaller than the kernel_shape [2, 2]"),
    "convtranspose-output-padding-past-the-stride": (
        h.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2], output_padding=[2, 0], name="c"), X,
        [("y", [1, 1, 19, 17])], {"w": np.ones((4, 1, 3, 3), np.float32)},
        "output_padding [2, 0] must be smaller than max(stride, dilation) along axis 0"),
    "split-num-outputs-not-the-outputs": (h.make_node("Split", ["x"], ["y"], axis=1, num_outputs=3, name="c"), X,
                                          [("y", [1, 2, 8, 8])], {}, "num_outputs 3 differs from the node's 1 outputs", 18),
    "squeeze-axis-attribute-out-of-range": (h.make_node("Squeeze", ["x"], ["y"], axes=[5], name="c"), X,
                                            [("y", [1, 4, 8, 8])], {}, "axes [5]: 5 is outside [-4, 4)", 11),
    "slice-starts-and-ends-of-two-lengths": (h.make_node("Slice", ["x", "s", "e"], ["y"], name="c"), X,
                                             [("y", [1, 4, 8, 8])],
                                             {"s": np.array([0, 0], np.int64), "e": np.array([1], np.int64)},
                                             "starts, ends, axes and steps differ in length: starts 2, ends 1"),
    "trilu-k-of-two-values": (h.make_node("Trilu", ["x", "k"], ["y"], name="c"), X, [("y", [1, 4, 8, 8])],
                              {"k": np.array([1, 2], np.int64)}, "k has shape [2]; it must hold one value (a scalar)", 14),
    "reshape-allowzero-five": (h.make_node("Reshape", ["x", "s"], ["y"], allowzero=5, name="c"), X, [("y", [4, 64])],
                               {"s": np.array([4, 64], np.int64)}, "allowzero 5 is not 0 or 1"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_attributes_outside_the_spec_are_one_clear_error(tmp_path, capsys, case):
    """Through the API, and through `dlcc compile`'s own entry point (in this process: its error
    handling is main()'s, and a process per case took a second and more to start): exit code 2,
    the message, no traceback, no output folder."""
    from dlcc.cli import main

    node, inputs, outputs, inits, needle, *opset = CASES[case]
    path = _model(tmp_path / f"{case}.onnx", node, inputs, outputs, inits, *opset)
    with pytest.raises(ModelError) as e:
        dlcc.compile(path, target="opencl")
    needle = f"attributes outside the ONNX spec: {node.op_type} node 'c': {needle}"
    assert needle in " ".join(str(e.value).split()), str(e.value)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["compile", str(path), "-o", str(tmp_path / "out"), "-q"])
    out = capsys.readouterr()
    assert exit_.value.code == 2 and "Traceback" not in out.out + out.err and needle in " ".join(out.err.split())
    assert not (tmp_path / "out").exists()


def test_a_reshape_to_an_empty_shape_that_loses_elements(tmp_path):
    """allowzero makes a 0 in the shape a 0-sized dim, and onnx's inference then does not compare
    the counts. The empty output got no launch, so the view's own check never ran: dlcc returned
    a [0, 256] where onnxruntime refuses the model. Views are lowered even when empty."""
    path = _model(tmp_path / "r.onnx", h.make_node("Reshape", ["x", "s"], ["y"], allowzero=1, name="c"), X,
                  [("y", [0, 256])], {"s": np.array([0, 256], np.int64)}, 14)
    with pytest.raises(DlccError, match=r"the output shape \[0, 256\] holds 0 elements, but the input \[1, 4, 8, 8\] holds 256"):
        dlcc.compile(path, target="opencl")


def test_an_integer_division_by_a_constant_zero_is_refused(tmp_path):
    """onnxruntime refuses the model; C leaves the quotient undefined (dlcc's kernel gave 7 / 0 = 7)."""
    for op in ("Div", "Mod"):
        g = h.make_graph([h.make_node(op, ["a", "d"], ["y"], name="c")], "g", [h.make_tensor_value_info("a", T.INT64, [3])],
                         [h.make_tensor_value_info("y", T.INT64, [3])], [nh.from_array(np.array([2, 0, 1], np.int64), "d")])
        onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]), tmp_path / "div.onnx")
        with pytest.raises(ModelError, match=rf"{op} node 'c': the integer divisor holds 0 \(at flat position 1\)"):
            dlcc.compile(tmp_path / "div.onnx", target="opencl")


def test_every_problem_is_listed_at_once(tmp_path):
    g = h.make_graph([h.make_node("Conv", ["x", "w"], ["a"], group=0, name="first"),
                      h.make_node("BatchNormalization", ["a", "s", "b", "m", "v"], ["y"], epsilon=-1.0, name="second")],
                     "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 8, 8])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 4, 6, 6])],
                     [nh.from_array(W, "w")] + [nh.from_array(np.ones(4, np.float32), k) for k in "sbmv"])
    path = tmp_path / "two.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
    with pytest.raises(ModelError) as e:
        dlcc.compile(path, target="opencl")
    assert "node 'first': group 0" in str(e.value) and "node 'second': var + epsilon" in str(e.value)


def test_names_that_look_like_markup_print_as_themselves(tmp_path):
    """A model file, an output name and a node name with rich markup in them: compile, run, verify
    and inspect print them verbatim instead of dying with rich.errors.MarkupError."""
    path = tmp_path / "m[red]x.onnx"
    g = h.make_graph([h.make_node("Relu", ["x"], ["y[/]"], name="n[bold]")], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, [4])], [h.make_tensor_value_info("y[/]", T.FLOAT, [4])])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
    run = CliRunner()
    art = tmp_path / "a[/]"
    for args, needles in ((["compile", str(path), "-o", str(art), "--no-cache"], ["m[red]x.onnx", "a[/]"]),
                          (["run", str(art)], ["y[/]"]),
                          (["verify", str(path), "-q"], ["y[/]", "m[red]x.onnx"]),
                          (["inspect", str(path), "-q", "--launches"], ["n[bold]", "m[red]x.onnx"])):
        r = run.invoke(app, args, terminal_width=250)
        assert r.exit_code == 0, (args, r.output, r.exception)
        flat = "".join(r.output.split())  # rich wraps long temp paths
        for n in needles:
            assert n in flat, (args, n, r.output)


@pytest.mark.parametrize("passes,needle", [
    (["memplan", "lower"], "passes.0.name: 'memplan' must come after 'lower'"),
    (["astitch", "lower", "memplan"], "passes.0.name: 'astitch' must come after 'lower'"),
    (["lower", "rammer", "astitch", "memplan"], "passes.1.name: 'rammer' must come after 'astitch'"),
    (["lower", "memplan", "astitch"], "passes.2.name: 'astitch' must come before 'memplan'"),
    (["lower", "fold-bn", "memplan"], "passes.1.name: 'fold-bn' must come before 'lower'"),
    (["lower", "lower", "memplan"], "passes.1.name: 'lower' is already passes.0; each pass runs once"),
    (["lower"], "passes: the pipeline must include 'memplan'"),
])
def test_passes_out_of_order_are_refused_when_the_pipeline_loads(tmp_path, passes, needle):
    """Each pass declares what must run before and after it (register_pass's after/before): a
    pipeline file that breaks that is an error naming the file and the entry, before any work
    (memplan before lower was an AttributeError deep in memplan)."""
    from dlcc.config import load_pipeline
    from dlcc.errors import ConfigError

    path = tmp_path / "p.yaml"
    path.write_text("name: p\npasses:\n" + "".join(f"  - name: {p}\n" for p in passes))
    with pytest.raises(ConfigError) as e:
        load_pipeline(path)
    assert str(e.value) == f"{path}: {needle}"


@pytest.mark.parametrize("peaks,needle", [
    ("{}", "peak_tflops: Value error, needs a float32 peak"),
    ("{float32: 0}", "peak_tflops: Value error, peaks must be positive: {'float32': 0.0}"),
    ("{float32: 67, tf32: -1}", "peaks must be positive: {'tf32': -1.0}"),
    ("{float32: .inf}", "peak_tflops.float32: Input should be a finite number"),
])
def test_device_specs_the_cost_model_would_divide_by_zero_with(tmp_path, peaks, needle):
    """Empty or zero peaks were a ZeroDivisionError in the cost model; infinite ones made every
    time zero. The device file is refused, naming the file and the field."""
    from pathlib import Path

    from dlcc.config import builtin_dir, load_device
    from dlcc.errors import ConfigError

    text = (Path(builtin_dir("devices")) / "h100.yaml").read_text()
    path = tmp_path / "d.yaml"
    path.write_text("\n".join(f"peak_tflops: {peaks}" if ln.startswith("peak_tflops:") else ln
                              for ln in text.splitlines()))
    with pytest.raises(ConfigError) as e:
        load_device(path)
    assert str(e.value).startswith(f"{path}: ") and needle in str(e.value)


def _artifact(tmp_path):
    from pathlib import Path

    example = Path(__file__).resolve().parents[1] / "examples" / "resnet-tiny.onnx"
    out = tmp_path / "art"
    dlcc.compile(example, out, target="opencl")
    return out


def _first_arena_arg(plan):
    return next(a for L in plan["launches"] for a in L["args"] if a.get("storage") == "arena")


@pytest.mark.parametrize("mutate,needle", [
    (lambda p: "{}", "plan.json is not a dlcc plan: storages: Field required"),
    (lambda p: "null", "plan.json: expected a JSON object with the plan's fields, found NoneType"),
    (lambda p: "[]", "plan.json: expected a JSON object with the plan's fields, found list"),
    (lambda p: b"\xff\xfe\x00{", "plan.json is corrupt"),
    (lambda p: p["storages"].update(arena=-5), "storages {'arena': -5} have negative sizes"),
    (lambda p: _first_arena_arg(p).update(offset=10**9), "lie outside arena"),
    (lambda p: p["launches"][0].update(grid=-1), "launches.0.grid: Input should be greater than or equal to 1"),
    (lambda p: p["inputs"][0].update(shape=[1 << 20, 1 << 20, 1 << 10]), "GiB, more than this machine's"),
    (lambda p: p["launches"][0].update(kernel="nope"), "launches.0.kernel 'nope' is not among the plan's kernels"),
    (lambda p: p["kernels"][0].update(name="x(); evil"), "kernels.0.name 'x(); evil' is not a kernel identifier"),
    # found by scripts/hostile_corpus.py: a float grid reached pyopencl (std::bad_cast), and an
    # argument dropped from a launch reached set_args (TypeError)
    (lambda p: p["launches"][0].update(grid=2e9), "launches.0.grid: Input should be a valid integer"),
    (lambda p: p["launches"][0]["args"].pop() and None, "launches.0 passes"),
    # a kernel's tiling of another type reached the OpenCL runtime's build options (AttributeError)
    (lambda p: p["kernels"][0].update(tiling=1.5), "kernels.0.tiling: Input should be a valid string"),
    (lambda p: p["kernels"][0].update(kind=[1]), "kernels.0.kind: Input should be a valid string"),
    # a GEMM launched with one block more wrote past its output: heap corruption, SIGABRT (seed 39);
    # and plans that every check above passes but that their kernels were not compiled for
    (lambda p: p["launches"][0].update(grid=p["launches"][0]["grid"] + 1), "is not the plan its kernels were"),
    (lambda p: p["launches"][0].update(block=p["launches"][0]["block"] // 2), "is not the plan its kernels were"),
    (lambda p: _first_arena_arg(p).update(offset=_first_arena_arg(p)["offset"] + 256), "is not the plan its kernels"),
    (lambda p: p["outputs"][0].update(dtype="int32"), "is not the plan its kernels were compiled for"),
])
def test_artifact_plans_are_checked_before_the_device(tmp_path, mutate, needle):
    """`dlcc run` and dlcc.load trust nothing in plan.json: each of these reached PyOpenCL or the
    device as a raw exception or a crash."""
    import json

    from dlcc.errors import DlccError

    art = _artifact(tmp_path)
    plan = json.loads((art / "plan.json").read_text())
    out = mutate(plan)
    data = out if out is not None else json.dumps(plan)
    (art / "plan.json").write_bytes(data if isinstance(data, bytes) else data.encode())
    with pytest.raises(DlccError) as e:
        dlcc.load(art)
    assert needle in str(e.value), str(e.value)


@pytest.mark.parametrize("file", ["kernels.cl", "kernels.cu"])
def test_a_truncated_kernel_file_is_named(tmp_path, file):
    """A kernels.cl cut short reached the OpenCL compiler ("a dlcc bug") or pyopencl's missing
    kernel (a traceback; found by scripts/hostile_corpus.py); the plan now carries each kernel
    file's sha256."""
    art = _artifact(tmp_path)
    text = (art / file).read_bytes()
    (art / file).write_bytes(text[: len(text) // 2])
    with pytest.raises(DlccError, match=f"{file} is not the file this plan was compiled with"):
        dlcc.load(art)


def test_an_artifact_without_its_targets_source_is_one_error(tmp_path):
    from dlcc.errors import DlccError

    art = _artifact(tmp_path)
    (art / "kernels.cl").unlink()
    m = dlcc.load(art, target="opencl")
    with pytest.raises(DlccError, match="the artifact has no kernels.cl for the opencl target"):
        m.executor()


@pytest.mark.parametrize("encoding,ok", [("utf-16", True), ("latin-1", False)])
def test_yaml_in_another_encoding(tmp_path, encoding, ok):
    """YAML's own detection reads UTF-16 with a BOM; bytes that are not UTF-8 are an error naming
    the file (they were a UnicodeDecodeError traceback)."""
    from dlcc.config import load_pipeline
    from dlcc.errors import ConfigError

    path = tmp_path / "p.yaml"
    path.write_bytes("name: café\npasses: [{name: lower}, {name: memplan}]\n".encode(encoding))
    if ok:
        assert load_pipeline(path).name == "café"
    else:
        with pytest.raises(ConfigError, match=f"{path}: not valid YAML: .*UTF-8"):
            load_pipeline(path)


def _gather_model(path, op="Gather", computed=False):
    """An embedding lookup (data [10, 4]) on indices that are a graph input, or computed from a
    float input (Cast) when `computed`."""
    idx_in = h.make_tensor_value_info("ids", T.FLOAT if computed else T.INT64, [2, 3] if op != "GatherND" else [2, 2])
    nodes = [h.make_node("Cast", ["ids"], ["i"], to=T.INT64)] if computed else []
    src = "i" if computed else "ids"
    out_shape = {"Gather": [2, 3, 4], "GatherND": [2]}[op]
    nodes.append(h.make_node(op, ["data", src], ["y"], name="g"))
    g = h.make_graph(nodes, "g", [idx_in], [h.make_tensor_value_info("y", T.FLOAT, out_shape)],
                     [nh.from_array(np.arange(40, dtype=np.float32).reshape(10, 4), "data")])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
    return path


def test_out_of_range_gather_ids_are_an_input_error(tmp_path):
    """An id past the table (1e9 killed the process with SIGSEGV) is refused before the launch,
    naming the input, the index, its position, the bounds and the node; negative ids in range
    wrap, as ONNX says."""
    from dlcc.executor import InputError

    m = dlcc.compile(_gather_model(tmp_path / "g.onnx"), target="opencl")
    ids = np.array([[0, 1, 2], [3, 10**9, -1]], np.int64)
    with pytest.raises(InputError, match=r"input 'ids': index 1000000000 at \[1, 1\] is outside \[-10, 10\) "
                                         r"for Gather node 'g'"):
        m({"ids": ids})
    ids[1, 1] = -10
    np.testing.assert_array_equal(m({"ids": ids})["y"], np.arange(40, dtype=np.float32).reshape(10, 4)[ids])
    nd = dlcc.compile(_gather_model(tmp_path / "nd.onnx", "GatherND"), target="opencl")
    with pytest.raises(InputError, match=r"index 4 at \[1, 1\] is outside \[-4, 4\) for GatherND"):
        nd({"ids": np.array([[0, 0], [9, 4]], np.int64)})


def _computed_index_model(path, op):
    """`op` on indices computed from a float input x (Floor, Cast), so only the device knows them:
    Gather and GatherElements on data [10, 4] (axis 0), GatherND on index pairs into it."""
    shape = {"Gather": [2, 3], "GatherElements": [3, 4], "GatherND": [3, 2], "ScatterElements": [3, 4],
             "ScatterND": [3, 2]}[op]
    out_shape = {"Gather": [2, 3, 4], "GatherElements": [3, 4], "GatherND": [3]}.get(op, [10, 4])
    updates = {"ScatterElements": [3, 4], "ScatterND": [3]}.get(op)
    nodes = [h.make_node("Floor", ["x"], ["f"]), h.make_node("Cast", ["f"], ["i"], to=T.INT64),
             h.make_node(op, ["data", "i"] + (["u"] if updates else []), ["g"], name="g"), h.make_node("Neg", ["g"], ["y"])]
    inits = [nh.from_array(np.arange(40, dtype=np.float32).reshape(10, 4), "data")]
    if updates:
        inits.append(nh.from_array(-100 - np.arange(np.prod(updates), dtype=np.float32).reshape(updates), "u"))
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, shape)],
                     [h.make_tensor_value_info("y", T.FLOAT, out_shape)], inits)
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
    return path


COMPUTED = {  # op: (indices in range, negative ones wrapping; an out-of-range one, its position and bound)
    "Gather": ([[0, 9, -1], [-10, 4, 5]], (1, 2), 10, "[1, 2]"),
    "GatherElements": ([[0, 1, 2, 3], [9, 8, 7, 6], [-1, -2, -10, 0]], (2, 3), 10, "[2, 3]"),
    "GatherND": ([[0, 0], [9, 3], [-1, -4]], (2, 1), 4, "[2, 1]"),
    # (Scatters: distinct targets; which of two updates of one element wins is the spec's to leave open.)
    "ScatterElements": ([[0, 1, 2, 3], [9, 8, 7, 6], [-2, -3, -10, 0]], (2, 3), 10, "[2, 3]"),
    "ScatterND": ([[0, 0], [9, 3], [-1, -4]], (2, 1), 4, "[2, 1]"),
}


@pytest.mark.parametrize("pipeline", ["baseline", "astitch", "rammer", "full"])
@pytest.mark.parametrize("op", sorted(COMPUTED))
def test_computed_indices_out_of_range_are_an_error_from_the_device(tmp_path, op, pipeline):
    """Indices computed inside the model cannot be checked before the launch. The Gather clamps
    them, so nothing reads outside the table (a Scatter compares against them, so nothing lands
    outside its output), and a check kernel records the first bad one; the
    run raises naming the node, the index, its position and the bound (onnxruntime refuses these
    too). In-range indices, negative ones wrapped, match onnxruntime, also right after an error
    (the error words are cleared)."""
    import onnxruntime as ort

    from dlcc.executor import DeviceIndexError

    path = _computed_index_model(tmp_path / "c.onnx", op)
    m = dlcc.compile(path, target="opencl", pipeline=pipeline)
    assert [c["node"] for c in m.plan["meta"]["device_index_checks"]] == ["g"]
    good, at, bound, pos = COMPUTED[op]
    x = np.array(good, np.float32) + np.float32(0.25)  # Floor brings them back to the integers
    ref = ort.InferenceSession(str(path)).run(None, {"x": x})[0]
    np.testing.assert_array_equal(m({"x": x})["y"], ref)
    for wild in (bound, -bound - 1, 1e9):
        bad = x.copy()
        bad[at] = wild
        with pytest.raises(DeviceIndexError) as e:
            m({"x": bad})
        assert (f"{op} node 'g': a computed index {int(np.floor(np.float32(wild)))} at {pos} is outside "
                f"[-{bound}, {bound})") in str(e.value)
        np.testing.assert_array_equal(m({"x": x})["y"], ref)


@pytest.mark.parametrize("pipeline", ["baseline", "astitch"])
@pytest.mark.parametrize("op", ["Div", "Mod"])
def test_an_integer_division_by_zero_at_run_time_is_an_error(tmp_path, op, pipeline):
    """A divisor given as an input is checked on the host, a computed one (b - c) on the device,
    as computed indices are; onnxruntime refuses both. The kernel itself never divides by 0 or
    takes the most negative value / -1 (x86 traps on those). Good divisors match onnxruntime,
    also right after an error."""
    import onnxruntime as ort

    from dlcc.executor import DeviceIndexError, InputError

    g = h.make_graph([h.make_node("Sub", ["b", "c"], ["d"], name="s"), h.make_node(op, ["a", "d"], ["y"], name="q"),
                      h.make_node(op, ["a", "b"], ["z"], name="r")], "g",
                     [h.make_tensor_value_info(n, T.INT64, [4]) for n in "abc"],
                     [h.make_tensor_value_info(n, T.INT64, [4]) for n in "yz"])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]), tmp_path / "m.onnx")
    m = dlcc.compile(tmp_path / "m.onnx", target="opencl", pipeline=pipeline)
    a, good, zero = np.array([7, -7, 5, -9]), np.array([3, 2, -4, -1]), np.zeros(4, np.int64)
    ref = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, {"a": a, "b": good, "c": zero})
    got = m({"a": a, "b": good, "c": zero})
    np.testing.assert_array_equal(got["y"], ref[0]), np.testing.assert_array_equal(got["z"], ref[1])
    with pytest.raises(InputError, match=rf"input 'b': divisor 0 at \[2\] for {op} node 'r'"):
        m({"a": a, "b": np.array([3, 2, 0, -1]), "c": zero})
    with pytest.raises(DeviceIndexError, match=rf"{op} node 'q': integer division by zero: a computed divisor holds 0 "
                                               r"at \[1\]"):
        m({"a": a, "b": good, "c": np.array([0, 2, 0, 0])})
    got = m({"a": a, "b": good, "c": zero})
    np.testing.assert_array_equal(got["y"], ref[0])


def _clamped_index_model(path, clamp_hi: int, wide: bool = False) -> str:
    """Gathers from a 10-row table at i = Min(Max(Cast(x), 0), clamp_hi) (and, `wide`, at i + 2^62
    + 2^62, which wraps in int64), twice at each index, as a KV cache's K and V are gathered."""
    nodes = [h.make_node("Cast", ["x"], ["xi"], to=T.INT64), h.make_node("Max", ["xi", "zero"], ["lo"]),
             h.make_node("Min", ["lo", "hi"], ["i"])]
    if wide:
        nodes += [h.make_node("Add", ["i", "big"], ["i1"]), h.make_node("Add", ["i1", "big"], ["i2"])]
    idx = "i2" if wide else "i"
    nodes += [h.make_node("Gather", ["data", idx], ["k"], name="gk"), h.make_node("Gather", ["data2", idx], ["v"], name="gv"),
              h.make_node("Add", ["k", "v"], ["y"])]
    inits = [nh.from_array(np.arange(40, dtype=np.float32).reshape(10, 4), "data"),
             nh.from_array(np.arange(40, dtype=np.float32).reshape(10, 4) * 3, "data2"), nh.from_array(np.array(0, np.int64), "zero"),
             nh.from_array(np.array(clamp_hi, np.int64), "hi"), nh.from_array(np.array(2**62, np.int64), "big")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [5])], [h.make_tensor_value_info("y", T.FLOAT, [5, 4])],
                     inits)
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
    return str(path)


@pytest.mark.parametrize("pipeline", ["baseline", "astitch"])
def test_indices_in_range_by_construction_are_not_checked_and_one_index_is_checked_once(tmp_path, pipeline):
    """An index clamped into its table (Min/Max, Range, Where: ops/ranges.py) needs no check
    kernel; one that may leave it is checked, once for the two Gathers that read it; one whose
    arithmetic wraps in int64 is checked, its range unknown."""
    x = np.array([-3, 0, 4, 9, 20], np.float32)
    clamped = dlcc.compile(_clamped_index_model(tmp_path / "a.onnx", 9), target="opencl", pipeline=pipeline)
    assert clamped.plan["meta"].get("device_index_checks", []) == []
    rows = np.clip(x.astype(np.int64), 0, 9)
    np.testing.assert_array_equal(clamped({"x": x})["y"], 4 * np.arange(40, dtype=np.float32).reshape(10, 4)[rows])
    loose = dlcc.compile(_clamped_index_model(tmp_path / "b.onnx", 10), target="opencl", pipeline=pipeline)
    assert [c["node"] for c in loose.plan["meta"]["device_index_checks"]] == ["gk"]
    with pytest.raises(DlccError, match=r"Gather node 'gk': a computed index 10 at \[4\] is outside \[-10, 10\)"):
        loose({"x": x})
    wrapped = dlcc.compile(_clamped_index_model(tmp_path / "c.onnx", 9, wide=True), target="opencl", pipeline=pipeline)
    assert [c["node"] for c in wrapped.plan["meta"]["device_index_checks"]] == ["gk"]


def test_constant_indices_out_of_range_fail_the_compile(tmp_path):
    g = h.make_graph([h.make_node("Gather", ["data", "i"], ["y"], name="g")], "g",
                     [h.make_tensor_value_info("data", T.FLOAT, [10, 4])], [h.make_tensor_value_info("y", T.FLOAT, [2, 4])],
                     [nh.from_array(np.array([3, 10], np.int64), "i")])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "k.onnx")
    with pytest.raises(DlccError, match=r"Gather node 'g': constant index 10 at \[1\] is outside \[-10, 10\)"):
        dlcc.compile(tmp_path / "k.onnx", target="opencl")


def test_inspect_says_where_indices_are_checked(tmp_path):
    res = CliRunner().invoke(app, ["inspect", str(_computed_index_model(tmp_path / "c.onnx", "Gather"))])
    assert res.exit_code == 0, res.output
    text = "".join(res.output.split())
    assert "indexchecks" in text and "computed" in text and "check_index_" in text


def test_shape_bindings_past_32_bits(tmp_path):
    from dlcc.errors import ConfigError, ShapeError
    from dlcc.frontend import parse_shape_binding

    with pytest.raises(ShapeError, match="a dim above 2147483647"):
        parse_shape_binding("x=99999999999999999999999x16")
    from dlcc.config import load_shape_bindings

    f = tmp_path / "s.yaml"
    f.write_text("shapes:\n  x: [99999999999999999999999, 16]\n")
    with pytest.raises(ConfigError, match="shapes.x.0: Input should be less than or equal to 2147483647"):
        load_shape_bindings(f)


@pytest.mark.parametrize("loc,needle", [("loop.bin", "cannot be resolved: Symlink loop"),
                                        ("a\0b.bin", "which is not a file name")])
def test_external_data_names_that_are_no_file(tmp_path, loc, needle):
    """A symlink loop and a NUL byte in an external-data location were a RuntimeError and a
    ValueError, first in the cache key, then in the loader."""
    from onnx.external_data_helper import set_external_data

    t = nh.from_array(np.ones(4, np.float32), "w")
    set_external_data(t, location=loc)
    t.ClearField("raw_data")
    t.data_location = onnx.TensorProto.EXTERNAL
    g = h.make_graph([h.make_node("Add", ["x", "w"], ["y"])], "g", [h.make_tensor_value_info("x", T.FLOAT, [4])],
                     [h.make_tensor_value_info("y", T.FLOAT, [4])], [t])
    path = tmp_path / "m.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
    (tmp_path / "loop.bin").symlink_to("loop.bin")
    for cache in (None, tmp_path / "cache"):  # the cache key reads the external data's names first
        with pytest.raises(ModelError, match=needle):
            dlcc.compile(path, tmp_path / "out", target="opencl", cache=cache)


def _trace(events):
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100"}], "traceEvents": events}


def _kernel(**k):
    e = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 0, "dur": 5,
         "args": {"correlation": 1, "stream": 7, "device": 0}}
    e.update(k)
    return e


@pytest.mark.parametrize("event,needle", [
    (_kernel(name=5), "traceEvents[0]: 'name' is int '5', expected a string"),
    (_kernel(name=float("nan")), "traceEvents[0]: 'name' is float 'nan', expected a string"),
    (_kernel(pid={"a": 1}), "traceEvents[0]: 'pid' is dict"),
    (_kernel(args=3), "traceEvents[0]: 'args' is int '3', expected an object"),
    (_kernel(args={"correlation": [1, 2]}), "traceEvents[0]: args['correlation'] is list '[1, 2]', expected an integer"),
])
def test_trace_fields_of_the_wrong_type(tmp_path, event, needle):
    """Each was a raw TypeError or KeyError in the trace reader or the simulator."""
    import json

    from dlcc.errors import TraceError
    from dlcc.estimate.kineto import load_trace

    path = tmp_path / "t.json"
    path.write_text(json.dumps(_trace([event, _kernel(ts=10, name="k2")]), allow_nan=True))
    with pytest.raises(TraceError) as e:
        load_trace(path)
    assert str(e.value) == f"{path}: {needle}" or needle in str(e.value), str(e.value)


def test_a_trace_nested_too_deeply(tmp_path):
    from dlcc.errors import TraceError
    from dlcc.estimate.kineto import load_trace

    path = tmp_path / "deep.json"
    path.write_text('{"traceEvents":' + "[" * 100000 + "]" * 100000 + "}")
    with pytest.raises(TraceError, match="nested too deeply"):
        load_trace(path)


def test_found_by_the_property_tests(tmp_path):
    """Each case tests/test_properties.py found: LRN of size 2**63 - 1 (a loop that never
    finished: the window is clamped to the channels), DepthToSpace whose block does not divide the
    channels (computed silently; onnxruntime refuses), and a pooling window larger than its input
    (a negative output dim, then a ValueError at run time)."""
    x = np.random.default_rng(0).standard_normal((1, 4, 3, 3)).astype(np.float32)
    path = _model(tmp_path / "lrn.onnx", h.make_node("LRN", ["x"], ["y"], size=2**63 - 1, alpha=1e-4),
                  [("x", [1, 4, 3, 3])], [("y", [1, 4, 3, 3])])
    got = dlcc.compile(path, target="opencl")({"x": x})["y"]
    sq = (x ** 2).sum(axis=1, keepdims=True)  # every channel is inside the window
    np.testing.assert_allclose(got, x / (1.0 + 1e-4 / (2**63 - 1) * sq) ** 0.75, rtol=1e-5)
    path = _model(tmp_path / "d2s.onnx", h.make_node("DepthToSpace", ["x"], ["y"], blocksize=3, name="c"),
                  [("x", [1, 8, 2, 2])], [("y", [1, 0, 6, 6])])
    with pytest.raises(ModelError, match="blocksize 3: the input's 8 channels are not a multiple of 9"):
        dlcc.compile(path, target="opencl")
    path = _model(tmp_path / "pool.onnx", h.make_node("MaxPool", ["x"], ["y"], kernel_shape=[1, 8], name="c"),
                  [("x", [1, 2, 6, 6])], [("y", [1, 2, 6, "w"])])
    with pytest.raises(DlccError, match=r"comes out as \[1, 2, 6, -1\]: a negative dim"):
        dlcc.compile(path, target="opencl")


EMPTY_CASES = {  # op(s) applied to sl = x[:, :, 4:4], an empty [2, 3, 0] computed at run time
    # a GEMM with N = 0 divided by its zero tiles per row, and hung PoCL
    "matmul-n0": [h.make_node("MatMul", ["x", "w80"], ["y"])],
    "matmul-k0": [h.make_node("MatMul", ["sl", "w0"], ["y"])],
    # astitch's planner divided by the empty output's rows (ZeroDivisionError)
    "reducemax-empty-output": [h.make_node("ReduceMax", ["sl"], ["y"], axes=[1], keepdims=1)],
    # the mean of nothing was 0 / 0 = NaN; onnxruntime gives 0
    "reducemean-over-nothing": [h.make_node("ReduceMean", ["sl"], ["y"], axes=[2], keepdims=1)],
    "reducemax-over-nothing": [h.make_node("ReduceMax", ["sl"], ["y"], axes=[2], keepdims=1)],
    "concat-with-empty": [h.make_node("Concat", ["sl", "x"], ["y"], axis=2)],
    "gather-no-indices": [h.make_node("Gather", ["x", "eidx"], ["y"], axis=2)],
    "pad-an-empty-axis": [h.make_node("Pad", ["sl", "pads"], ["y"])],
}


@pytest.mark.parametrize("case", sorted(EMPTY_CASES))
def test_empty_tensors_inside_a_model(tmp_path, case):
    """Zero-sized intermediates, as onnxruntime allows them: nodes with only empty outputs get no
    launch (passes/lower.py), and the rest match onnxruntime on every pipeline."""
    import onnxruntime as ort

    def c(name, v, dt=np.int64):
        return nh.from_array(np.array(v, dt), name)

    nodes = [h.make_node("Slice", ["x", "s", "e", "ax"], ["sl"])] + EMPTY_CASES[case]
    inits = [c("s", [4]), c("e", [4]), c("ax", [2]), c("w0", np.ones((0, 5)), np.float32),
             c("w80", np.ones((8, 0)), np.float32), c("eidx", np.zeros(0)), c("pads", [0, 0, 1, 0, 0, 2])]
    used = {i for n in nodes for i in n.input}
    g = h.make_graph(nodes, "e", [h.make_tensor_value_info("x", T.FLOAT, [2, 3, 8])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], [t for t in inits if t.name in used])
    m = onnx.shape_inference.infer_shapes(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]))
    for v in m.graph.value_info:  # the output's inferred shape (where inference left it here)
        if v.name == "y":
            m.graph.output[0].CopyFrom(v)
    path = tmp_path / "e.onnx"
    onnx.save(m, path)
    x = np.random.RandomState(0).randn(2, 3, 8).astype(np.float32)
    ref = ort.InferenceSession(str(path)).run(None, {"x": x})[0]
    for pipeline in ("baseline", "astitch", "full"):
        got = dlcc.compile(path, target="opencl", pipeline=pipeline)({"x": x})["y"]
        assert got.shape == ref.shape, pipeline
        np.testing.assert_allclose(got, ref, rtol=1e-6, err_msg=pipeline)


def test_an_input_with_a_zero_dim_is_refused_clearly(tmp_path):
    g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "z", [h.make_tensor_value_info("x", T.FLOAT, [0, 16])],
                     [h.make_tensor_value_info("y", T.FLOAT, [0, 16])])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "z.onnx")
    with pytest.raises(DlccError, match=r"input 'x' of .*z.onnx has dim 0 of size 0, which exporters also write "
                                        r"for a dynamic dim; bind it \(to 0 for an empty input\) with --shape x=Nx16"):
        dlcc.compile(tmp_path / "z.onnx", target="opencl")
    m = dlcc.compile(tmp_path / "z.onnx", target="opencl", shapes={"x": (2, 16)})
    np.testing.assert_array_equal(m({"x": -np.ones((2, 16), np.float32)})["y"], np.zeros((2, 16), np.float32))
    empty = dlcc.compile(tmp_path / "z.onnx", target="opencl", shapes={"x": (0, 16)})
    assert empty({"x": np.zeros((0, 16), np.float32)})["y"].shape == (0, 16)


@pytest.mark.parametrize("pipeline", ["baseline", "astitch", "full"])
def test_an_input_bound_empty_runs_as_onnxruntime_runs_it(tmp_path, pipeline):
    """A KV cache's first step: the past bound to length 0 (--shape past=...x0x...), concatenated
    before the new keys, and read by the attention that follows, on every pipeline."""
    import onnxruntime as ort

    nodes = [h.make_node("Concat", ["past", "k"], ["present"], axis=1),
             h.make_node("Transpose", ["present"], ["kt"], perm=[0, 2, 1]),
             h.make_node("MatMul", ["q", "kt"], ["scores"]),
             h.make_node("Softmax", ["scores"], ["p"], axis=-1),
             h.make_node("MatMul", ["p", "present"], ["y"]),
             h.make_node("ReduceSum", ["past"], ["past_sum"], axes=[1], keepdims=0)]
    g = h.make_graph(nodes, "kv", [h.make_tensor_value_info("past", T.FLOAT, [2, "P", 8]),
                                   h.make_tensor_value_info("k", T.FLOAT, [2, 3, 8]),
                                   h.make_tensor_value_info("q", T.FLOAT, [2, 3, 8])],
                     [h.make_tensor_value_info("y", T.FLOAT, [2, 3, 8]), h.make_tensor_value_info("present", T.FLOAT, [2, "T", 8]),
                      h.make_tensor_value_info("past_sum", T.FLOAT, [2, 8])])
    path = tmp_path / "kv.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 12)]), path)
    rng = np.random.default_rng(0)
    feeds = {"past": np.zeros((2, 0, 8), np.float32), "k": rng.standard_normal((2, 3, 8)).astype(np.float32),
             "q": rng.standard_normal((2, 3, 8)).astype(np.float32)}
    ref = ort.InferenceSession(str(path)).run(None, feeds)
    got = dlcc.compile(path, target="opencl", pipeline=pipeline, shapes={"P": (0,)})(feeds)
    for name, r in zip(("y", "present", "past_sum"), ref):
        assert got[name].shape == r.shape, name
        np.testing.assert_allclose(got[name], r, rtol=1e-5, atol=1e-6, err_msg=name)


def test_an_empty_constant_output_at_the_end_of_the_weights(tmp_path):
    """Outputs that fold to constants are copied from the weights storage; an empty one laid out
    last sits at the storage's end, where OpenCL refuses a sub-buffer to start
    (clCreateSubBuffer INVALID_VALUE, found through Einsum's zero-length tests)."""
    nodes = [h.make_node("Expand", ["c", "s1"], ["full"]), h.make_node("Expand", ["c", "s0"], ["empty"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [2])],
                     [h.make_tensor_value_info("full", T.FLOAT, [3, 4]), h.make_tensor_value_info("empty", T.FLOAT, [0, 4])],
                     [nh.from_array(np.array([1.5], np.float32), "c"), nh.from_array(np.array([3, 4], np.int64), "s1"),
                      nh.from_array(np.array([0, 4], np.int64), "s0")])
    path = tmp_path / "e.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
    got = dlcc.compile(path, target="opencl")({"x": np.ones(2, np.float32)})
    assert got["empty"].shape == (0, 4) and (got["full"] == 1.5).all()


@pytest.mark.parametrize("equation", ["i.j->i", "....i->i", "ij->i->j"])
def test_an_einsum_equation_with_stray_dots_is_refused_not_a_hang(tmp_path, equation):
    """onnx's shape inference loops for ever on a stray dot in an Einsum equation; the equation is
    checked when the model is read (in a subprocess here, so that a regression fails by timeout)."""
    g = h.make_graph([h.make_node("Einsum", ["x"], ["y"], equation=equation)], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, [2, 3])], [h.make_tensor_value_info("y", T.FLOAT, [2])])
    path = tmp_path / "dots.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
    p = subprocess.run([sys.executable, "-m", "dlcc.cli", "compile", str(path), "-o", str(tmp_path / "out"), "-q"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "is malformed" in p.stderr, p.stderr


def test_an_opset_from_the_future_is_refused(tmp_path):
    """onnx's checker lets any opset stamp through; dlcc would have read the ops by the newest rules
    it knows (found by scripts/hostile_corpus.py: opset 256 compiled)."""
    path = _model(tmp_path / "o.onnx", h.make_node("Relu", ["x"], ["y"]), [("x", [2])], [("y", [2])], opset=256)
    with pytest.raises(ModelError, match=r"stamped with opset 256 of the ONNX domain; this installation knows "
                                         r"opsets 1 to \d+"):
        dlcc.compile(path, target="opencl")


def test_verify_where_onnxruntime_cannot_run_the_model(tmp_path):
    """Where the reference refuses (here: LayerNormalization over an empty axis, which dlcc runs to
    an empty output), verify says so with exit code 2; it was an internal error with a traceback."""
    nodes = [h.make_node("Slice", ["x", "s", "e", "ax"], ["sl"]),
             h.make_node("LayerNormalization", ["sl", "g", "b"], ["y"], axis=-1)]
    inits = [nh.from_array(np.array([4], np.int64), n) for n in ("s", "e")] + [
        nh.from_array(np.array([2], np.int64), "ax"), nh.from_array(np.ones(0, np.float32), "g"),
        nh.from_array(np.zeros(0, np.float32), "b")]
    g = h.make_graph(nodes, "e", [h.make_tensor_value_info("x", T.FLOAT, [2, 3, 8])],
                     [h.make_tensor_value_info("y", T.FLOAT, [2, 3, 0])], inits)
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "ln.onnx")
    res = subprocess.run([sys.executable, "-m", "dlcc.cli", "verify", str(tmp_path / "ln.onnx"), "-q", "-t", "opencl"],
                         capture_output=True, text=True)
    text = "".join((res.stdout + res.stderr).split())
    assert res.returncode == 2, res.stdout + res.stderr
    assert "onnxruntime,thereference,cannotrunthismodelontheseinputs" in text and "Traceback" not in text


def test_a_graph_output_declared_with_the_wrong_shape(tmp_path):
    """The declaration says [1, 10], the MatMul computes [4, 10]. The computed shape wins, as in
    onnxruntime (which warns and merges leniently), and dlcc warns too: a kernel sized by the
    declaration but fed by its inputs once wrote 160 bytes into the 40-byte output buffer (heap
    corruption, SIGABRT on PoCL; found by scripts/hostile_corpus.py). tf2onnx declares its
    resizes at TensorFlow's size, which onnx's inference disagrees with (test_resize_shapes)."""
    from dlcc.frontend import _fold_and_infer
    from dlcc.ir import Graph, Node, Tensor

    w = np.random.RandomState(0).randn(8, 10).astype(np.float32)
    g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"])], "g", [h.make_tensor_value_info("x", T.FLOAT, [4, 8])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 10])], [nh.from_array(w, "w")])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "o.onnx")
    with pytest.warns(UserWarning, match=r"output 'y' is declared 1x10 but its producer makes 4x10"):
        m = dlcc.compile(tmp_path / "o.onnx", target="opencl")
    assert [o["shape"] for o in m.outputs] == [[4, 10]]
    graph = Graph(name="g", nodes=[Node("MatMul", "mm", ["x", "w"], ["y"], {}, "")],
                  tensors={"x": Tensor("x", (4, 8), "float32"), "w": Tensor("w", (8, 10), "float32", w),
                           "y": Tensor("y", (1, 10), "float32")},
                  inputs=["x"], outputs=["y"], opset=17, source_node_count=1)
    _fold_and_infer(graph)
    assert graph.tensors["y"].shape == (4, 10)


def test_a_graph_output_without_a_shape_field(tmp_path):
    """tf2onnx at opset 13 writes an Einsum's graph output with its element type and no shape
    field, which onnx's checker rejects and onnxruntime runs; so does dlcc, at the shape it
    computes."""
    w = np.random.RandomState(1).randn(8, 3).astype(np.float32)
    out = onnx.ValueInfoProto(name="y")
    out.type.tensor_type.elem_type = T.FLOAT
    g = h.make_graph([h.make_node("Einsum", ["x", "w"], ["y"], equation="ij,jk->ik")], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, [4, 8])], [out], [nh.from_array(w, "w")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 7
    onnx.save(m, tmp_path / "s.onnx")
    c = dlcc.compile(tmp_path / "s.onnx", target="opencl")
    x = np.random.RandomState(2).randn(4, 8).astype(np.float32)
    np.testing.assert_allclose(c({"x": x})["y"], x @ w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scale_shape,bias_shape", [([1, 6, 8], [8]), ([8], [6, 8]), ([6, 1], [1])])
def test_layernorm_scale_that_varies_across_rows(tmp_path, scale_shape, bias_shape):
    """A LayerNormalization scale or bias broadcasting over more than the normalised axis: the row
    template read it within a row only, a wrong answer on every pipeline (found by
    scripts/hostile_corpus.py: a scale input rewired to the activation itself)."""
    import onnxruntime as ort

    rng = np.random.RandomState(0)
    g = h.make_graph([h.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, [1, 6, 8])], [h.make_tensor_value_info("y", T.FLOAT, [1, 6, 8])],
                     [nh.from_array(rng.randn(*scale_shape).astype(np.float32), "g"),
                      nh.from_array(rng.randn(*bias_shape).astype(np.float32), "b")])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "ln.onnx")
    x = rng.randn(1, 6, 8).astype(np.float32)
    ref = ort.InferenceSession(str(tmp_path / "ln.onnx")).run(None, {"x": x})[0]
    for pipeline in ("baseline", "astitch", "full"):
        got = dlcc.compile(tmp_path / "ln.onnx", target="opencl", pipeline=pipeline)({"x": x})["y"]
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5, err_msg=pipeline)


@pytest.mark.parametrize("mutate,needle", [
    (lambda p: p["meta"]["index_checks"][0].update(elements=7), "meta.index_checks.0 names check kernel"),
    (lambda p: p["meta"]["index_checks"][0].update(kernel="check_index_nope"), "meta.index_checks.0 names check kernel"),
    (lambda p: p["storages"].pop("report") and None, "has a check kernel but the plan has no errors and report"),
])
def test_an_input_index_check_kernel_is_checked_before_the_device(tmp_path, mutate, needle):
    """The check kernel an input's device arrays go through (kernels/index_check.py) is named in
    plan.json with its element count and needs the errors and report storages: a plan that says
    otherwise is refused at load, before a kernel reads past the input or writes nowhere."""
    import json

    from dlcc.errors import DlccError

    art = tmp_path / "g"
    dlcc.compile(_gather_model(tmp_path / "g.onnx"), art, target="opencl")
    plan = json.loads((art / "plan.json").read_text())
    assert plan["meta"]["index_checks"][0]["kernel"]
    mutate(plan)
    (art / "plan.json").write_text(json.dumps(plan))
    with pytest.raises(DlccError) as e:
        dlcc.load(art)
    assert needle in str(e.value), str(e.value)


@pytest.mark.parametrize("cache", [False, True])
def test_an_output_directory_that_cannot_be_made_names_itself(tmp_path, cache):
    """`-o` under a regular file: one error naming the output the user gave, not the hidden
    staging directory beside it, with the artifact (or the cache's copy) written nowhere."""
    model = _model(str(tmp_path / "m.onnx"), h.make_node("Relu", ["x"], ["y"]), [("x", [4])], [("y", [4])])
    (tmp_path / "file").write_text("not a directory")
    out = tmp_path / "file" / "art"
    args = ["compile", model, "-o", str(out), "-q"] + ([] if cache else ["--no-cache"])
    r = subprocess.run([sys.executable, "-m", "dlcc", *args], capture_output=True, text=True,
                       env={**os.environ, "DLCC_CACHE_DIR": str(tmp_path / "cache")})
    assert r.returncode == 2 and r.stdout == "", (r.stdout, r.stderr)
    assert f"cannot write {out}: {tmp_path / 'file'} is not a directory" in " ".join(r.stderr.split()), r.stderr
    assert "Traceback" not in r.stderr and ".tmp-" not in r.stderr
    assert (tmp_path / "file").read_text() == "not a directory"
