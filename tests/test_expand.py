"""Ops onnx defines by a function body, expanded into it when dlcc has no lowering (dlcc/expand.py).
The single-op cases (MVN, GroupNorm, RMSNorm, Attention, Swish) run through every pipeline in
tests/test_ops.py; here: a real exporter's opset-23 model, what is and is not expanded, names."""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import dlcc
from dlcc.frontend import import_model
from dlcc.verify import run_onnxruntime


def _opset23_export(path):
    """torch's dynamo exporter at opset 23 writes RMSNormalization, Attention and
    GroupNormalization nodes (none of which dlcc lowers directly)."""
    torch = pytest.importorskip("torch")

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.q, self.gn = torch.nn.RMSNorm(32), torch.nn.Linear(32, 32), torch.nn.GroupNorm(2, 4)

        def forward(self, x, img):
            q = self.q(self.norm(x)).view(1, 8, 4, 8).transpose(1, 2)
            a = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
            return a.transpose(1, 2).reshape(1, 8, 32) + x, torch.nn.functional.silu(self.gn(img))

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Block().eval(), (torch.randn(1, 8, 32), torch.randn(2, 4, 5, 5)), str(path), dynamo=True,
                          opset_version=23, input_names=["x", "img"], output_names=["y", "z"])
    return path


def test_a_real_opset23_export_expands_and_matches_onnxruntime(tmp_path):
    path = _opset23_export(tmp_path / "block23.onnx")
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert {"RMSNormalization", "Attention", "GroupNormalization"} <= ops
    assert not {"RMSNormalization", "Attention", "GroupNormalization"} & {n.op_type for n in import_model(path).nodes}
    launches = {}
    for pipeline in ("baseline", "astitch"):
        m = dlcc.compile(path, target="opencl", pipeline=pipeline)
        feeds = m.sample_inputs(0)
        got = m(feeds)
        for name, ref in zip(["y", "z"], run_onnxruntime(str(path), feeds, ["y", "z"])):
            np.testing.assert_allclose(got[name], ref, rtol=1e-3, atol=1e-4, err_msg=f"{pipeline}: {name}")
        launches[pipeline] = len(m.plan["launches"])
    assert launches["astitch"] < launches["baseline"] / 2  # the expanded norms stitch back together


def _one(op, ins, opset, **attrs):
    vis = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in ins.items()]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(ins[next(iter(ins))]))
    return helper.make_model(helper.make_graph([helper.make_node(op, list(ins), ["y"], **attrs)], "g", vis, [y]),
                             opset_imports=[helper.make_opsetid("", opset)])


def test_ops_dlcc_lowers_stay_and_ops_without_a_usable_body_are_reported(tmp_path):
    # LayerNormalization has a function body too, but dlcc lowers it itself: it is kept.
    ln = _one("LayerNormalization", {"x": [2, 8], "s": [8]}, 17)
    onnx.save(ln, str(tmp_path / "ln.onnx"))
    assert [n.op_type for n in import_model(tmp_path / "ln.onnx").nodes] == ["LayerNormalization"]
    # Bernoulli has a body (Greater(U, p): 1 with probability 1 - p, against the op's text), which
    # onnxruntime's folding would inline; dlcc writes it as Less(U, p) first (random_draws.py).
    onnx.save(_one("Bernoulli", {"x": [4, 7]}, 15), str(tmp_path / "bernoulli.onnx"))
    ops = [n.op_type for n in import_model(tmp_path / "bernoulli.onnx").nodes]
    assert "Less" in ops and "RandomUniformLike" in ops and "Greater" not in ops
    # Shrink has a body from opset 18, and a lowering of dlcc's own for every opset: kept.
    x = np.linspace(-1, 1, 28, dtype=np.float32).reshape(4, 7)
    for opset in (9, 18):
        path = tmp_path / f"shrink{opset}.onnx"
        onnx.save(_one("Shrink", {"x": [4, 7]}, opset, lambd=0.3, bias=0.1), str(path))
        assert [n.op_type for n in import_model(path).nodes] == ["Shrink"]
        m = dlcc.compile(path, target="opencl")
        np.testing.assert_allclose(m({"x": x})["y"], run_onnxruntime(str(path), {"x": x}, ["y"])[0],
                                   rtol=1e-6, atol=1e-6)


def test_body_names_never_collide_with_the_models(tmp_path):
    """The model already uses the names an expansion would pick for the body's tensors."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6, 3])
    nodes = [helper.make_node("Relu", ["x"], ["_MeanVarianceNormalization1_X_RM"]),
             helper.make_node("MeanVarianceNormalization", ["_MeanVarianceNormalization1_X_RM"], ["m"], axes=[1]),
             helper.make_node("Add", ["m", "_MeanVarianceNormalization1_X_RM"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(model, str(tmp_path / "clash.onnx"))
    m = dlcc.compile(tmp_path / "clash.onnx", target="opencl")
    feeds = m.sample_inputs(0)
    np.testing.assert_allclose(m(feeds)["y"], run_onnxruntime(str(tmp_path / "clash.onnx"), feeds, ["y"])[0],
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("axis", [1, -1, 0])
def test_layer_normalization_with_its_mean_and_inv_std_dev_outputs_is_expanded(tmp_path, axis):
    """The lowering writes Y only; a node that names Mean or InvStdDev (the training form) is
    expanded into its body instead, all three outputs checked against onnxruntime, and AStitch
    stitches the body back into fewer kernels than baseline's one per body node."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4, 5])
    norm = [4, 5] if axis == 1 else [5] if axis == -1 else [3, 4, 5]
    s, b = (helper.make_tensor_value_info(n, TensorProto.FLOAT, norm) for n in "sb")
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "mean", "inv")]
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y", "mean", "inv"], axis=axis, epsilon=1e-3)
    model = helper.make_model(helper.make_graph([node], "g", [x, s, b], outs), opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "ln_train.onnx"
    onnx.save(model, str(path))
    assert "LayerNormalization" not in {n.op_type for n in import_model(path).nodes}
    launches = {}
    for pipeline in ("baseline", "astitch"):
        m = dlcc.compile(path, target="opencl", pipeline=pipeline)
        feeds = m.sample_inputs(0)
        got = m(feeds)
        for name, ref in zip(["y", "mean", "inv"], run_onnxruntime(str(path), feeds, ["y", "mean", "inv"])):
            assert got[name].shape == ref.shape, name
            np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-5, err_msg=f"{pipeline}: {name}")
        launches[pipeline] = len(m.plan["launches"])
    assert launches["astitch"] < launches["baseline"]
