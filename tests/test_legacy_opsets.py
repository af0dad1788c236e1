"""Models from old opsets (frontend.upgrade_legacy_opset): an op dlcc lowers only in a newer form
(Pad before 11, TopK before 10, Add's `broadcast` before 7) makes the import convert the model
with onnx's version converter first. Opsets 7 to 10 are checked against onnxruntime on the model
as written; opsets before 7, which onnxruntime does not run, against numpy."""
from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as h
import pytest

import dlcc
from dlcc.errors import ModelError
from dlcc.verify import verify_outputs

from conftest import opencl_device_available, run_ort

needs_opencl = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")
F, I64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64


def _model(tmp_path, node, inputs: dict[str, list[int]], outputs: dict[str, int], opset: int):
    """One node over float inputs, at `opset`; outputs typed, their shapes left to inference."""
    g = h.make_graph([node], "legacy", [h.make_tensor_value_info(k, F, s) for k, s in inputs.items()],
                     [h.make_tensor_value_info(k, t, None) for k, t in outputs.items()])
    for o in g.output:
        o.type.tensor_type.shape.SetInParent()
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 3 if opset < 8 else 7
    onnx.checker.check_model(m)
    path = tmp_path / f"{node.op_type}{opset}.onnx"
    onnx.save(m, path)
    return path


def _feeds(inputs: dict[str, list[int]]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in inputs.items()}


CASES = {  # op at an opset before dlcc's lowering: (node, inputs, outputs, opset)
    "Pad10_constant": (h.make_node("Pad", ["x"], ["y"], pads=[0, 0, 1, 2, 0, 0, 2, 1], value=1.5),
                       {"x": [1, 4, 5, 5]}, {"y": F}, 10),
    "Pad10_reflect": (h.make_node("Pad", ["x"], ["y"], pads=[0, 1, 2, 0, 0, 0, 1, 2], mode="reflect"),
                      {"x": [1, 4, 5, 5]}, {"y": F}, 10),
    "Pad2_edge": (h.make_node("Pad", ["x"], ["y"], pads=[1, 0, 0, 2], mode="edge"), {"x": [3, 4]}, {"y": F}, 2),
    "TopK9": (h.make_node("TopK", ["x"], ["v", "i"], k=3, axis=0), {"x": [7, 5]}, {"v": F, "i": I64}, 9),
    "DepthToSpace10": (h.make_node("DepthToSpace", ["x"], ["y"], blocksize=2), {"x": [1, 8, 3, 3]}, {"y": F}, 10),
    "Max7": (h.make_node("Max", ["a", "b", "c"], ["y"]), {"a": [3, 4], "b": [3, 4], "c": [3, 4]}, {"y": F}, 7),
}


@needs_opencl
@pytest.mark.parametrize("case", sorted(CASES))
def test_an_op_older_than_its_lowering_is_converted_and_matches_onnxruntime(tmp_path, case):
    node, inputs, outputs, opset = CASES[case]
    path = _model(tmp_path, node, inputs, outputs, opset)
    feeds = _feeds(inputs)
    cm = dlcc.compile(path, target="opencl", pipeline="astitch")
    assert any(f"converted from opset {opset} to" in n for n in cm.plan["meta"]["pass_log"]), cm.plan["meta"]["pass_log"]
    got = cm(feeds)
    for name, ref in zip(outputs, run_ort(path, feeds)):
        np.testing.assert_array_equal(got[name], ref, err_msg=name)


LEGACY = {  # opset 6 and before: (node, inputs, what numpy computes from the feeds)
    "Add6_axis": (h.make_node("Add", ["a", "b"], ["y"], broadcast=1, axis=1), {"a": [2, 3, 4, 5], "b": [3, 4]},
                  lambda f: f["a"] + f["b"][None, :, :, None]),
    "Mul6_suffix": (h.make_node("Mul", ["a", "b"], ["y"], broadcast=1), {"a": [2, 3, 4], "b": [4]},
                    lambda f: f["a"] * f["b"]),
    "PRelu6_channels": (h.make_node("PRelu", ["x", "s"], ["y"]), {"x": [2, 3, 4, 5], "s": [3]},
                        lambda f: np.where(f["x"] > 0, f["x"], f["x"] * f["s"][None, :, None, None])),
    "Gemm6": (h.make_node("Gemm", ["a", "b", "c"], ["y"], broadcast=1, transB=1, alpha=0.5),
              {"a": [2, 3], "b": [4, 3], "c": [4]}, lambda f: 0.5 * f["a"] @ f["b"].T + f["c"]),
    "Relu1": (h.make_node("Relu", ["x"], ["y"]), {"x": [3, 4]}, lambda f: np.maximum(f["x"], 0)),
    "BatchNormalization6": (h.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], is_test=1,
                                        epsilon=1e-3),
                            {"x": [2, 3, 4], "s": [3], "b": [3], "m": [3], "v": [3]},
                            lambda f: (f["x"] - f["m"][:, None]) / np.sqrt(np.abs(f["v"][:, None]) + 1e-3)
                            * f["s"][:, None] + f["b"][:, None]),
}


@needs_opencl
@pytest.mark.parametrize("case", sorted(LEGACY))
def test_a_model_from_before_opset_7_computes_what_its_opset_says(tmp_path, case):
    """Legacy broadcasting lines B up with A from `axis` (and a PRelu slope with the channels):
    numpy's right-aligned rule would give another answer or none. verify's reference runs the
    model converted to opset 7, and says so."""
    node, inputs, expect = LEGACY[case]
    path = _model(tmp_path, node, inputs, {"y": F}, 6 if node.op_type != "Relu" else 1)
    feeds = _feeds(inputs)
    if "v" in feeds:
        feeds["v"] = np.abs(feeds["v"])
    got = dlcc.compile(path, target="opencl")(feeds)
    np.testing.assert_allclose(got["y"], expect(feeds), rtol=1e-5, atol=1e-6)
    rows = verify_outputs(path, got, feeds)
    assert rows[0]["passed"] and "converted to opset 7" in rows[0]["note"], rows


def test_a_conversion_onnx_cannot_make_is_one_clear_error(tmp_path):
    """Pad 1 (`paddings`) has no adapter in onnx's converter: the error names the op, the opsets
    and the converter, and nothing is compiled."""
    path = _model(tmp_path, h.make_node("Pad", ["x"], ["y"], paddings=[0, 1, 0, 1]), {"x": [2, 3]}, {"y": F}, 1)
    with pytest.raises(ModelError, match=r"dlcc lowers Pad as written from opset 11, and onnx's version "
                                         r"converter cannot convert this model from opset 1 to 11"):
        dlcc.compile(path, target="opencl")


@needs_opencl
@pytest.mark.parametrize("opset", [9, 10])
def test_a_torch_export_at_an_old_opset_with_padding_matches_onnxruntime(tmp_path, opset):
    """torch's TorchScript exporter writes Pad with its pads as an attribute below opset 11 (a
    style-transfer net's reflection padding, a ResNet's zero padding): before the conversion,
    every such model was refused as using an unsupported op."""
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.ReflectionPad2d(2), nn.Conv2d(3, 8, 5), nn.InstanceNorm2d(8, affine=True),
                                      nn.ReLU(), nn.ZeroPad2d((1, 2, 0, 1)), nn.ReplicationPad2d(1),
                                      nn.Upsample(scale_factor=2), nn.Conv2d(8, 3, 3, padding=1), nn.Tanh())

        def forward(self, x):
            return self.body(x)

    torch.manual_seed(0)
    path = tmp_path / f"style{opset}.onnx"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Net().eval(), (torch.randn(1, 3, 12, 12),), str(path), opset_version=opset, dynamo=False,
                          input_names=["x"], output_names=["y"])
    assert "Pad" in {n.op_type for n in onnx.load(str(path)).graph.node}
    m = dlcc.compile(path, target="opencl", pipeline="astitch")
    feeds = m.sample_inputs(0)
    np.testing.assert_allclose(m(feeds)["y"], run_ort(path, feeds)[0], rtol=1e-4, atol=1e-5)
