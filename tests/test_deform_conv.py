"""DeformConv (opsets 19, 22), which dlcc writes as standard ops at import (dlcc/deform_conv.py), on
PoCL against onnxruntime's CPU kernel: groups and offset groups, strides, dilations and uneven pads,
with and without the bias and the mask; offsets that land exactly on pixels, on the map's edges
and far outside it; NaN and inf where a zero mask or the map's border must hide them; a float16
model; and the malformed nodes' errors. Every gather index is clamped where it is computed, so no
device-side index check may be left in the plan.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

import dlcc
from conftest import opencl_device_available
from dlcc.errors import DlccError

pytestmark = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")
F32 = np.float32
RTOL, ATOL = 1e-5, 1e-5


def _ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _out_size(size, k, stride, dil, lo, hi):
    return (size + lo + hi - dil * (k - 1) - 1) // stride + 1


class _Model:
    """A graph of DeformConv nodes over shared inputs, saved with each output typed."""

    def __init__(self, rng, n=2, c=4, hw=(7, 8)):
        self.rng, self.n, self.c, self.hw = rng, n, c, hw
        self.feeds = {"x": rng.standard_normal((n, c, *hw)).astype(F32)}
        self.inits, self.nodes, self.outs = {}, [], []

    def add(self, name, m=6, k=(3, 3), group=1, og=1, strides=(1, 1), dil=(1, 1), pads=(1, 1, 1, 1), bias=True,
            mask=True, spread=2.0, offsets=None):
        oh = _out_size(self.hw[0], k[0], strides[0], dil[0], pads[0], pads[2])
        ow = _out_size(self.hw[1], k[1], strides[1], dil[1], pads[1], pads[3])
        kk = k[0] * k[1]
        off = (self.rng.standard_normal((self.n, og * 2 * kk, oh, ow)) * spread).astype(F32)
        off[:, ::3] = np.round(off[:, ::3])  # whole pixels: a neighbour's weight exactly 0
        if offsets is not None:
            off = offsets(off)
        self.feeds[f"{name}_off"] = off
        self.inits[f"{name}_w"] = self.rng.standard_normal((m, self.c // group, *k)).astype(F32)
        ins = ["x", f"{name}_w", f"{name}_off"]
        if bias:
            self.inits[f"{name}_b"] = self.rng.standard_normal(m).astype(F32)
        ins.append(f"{name}_b" if bias else "")
        if mask:
            mk = self.rng.uniform(-0.5, 1.5, (self.n, og * kk, oh, ow)).astype(F32)
            self.feeds[f"{name}_mask"] = np.where(mk < 0, 0, mk).astype(F32)  # some samples masked out
            ins.append(f"{name}_mask")
        while ins[-1] == "":
            ins.pop()
        self.nodes.append(h.make_node("DeformConv", ins, [name], name=name, kernel_shape=list(k), group=group,
                                      offset_group=og, strides=list(strides), dilations=list(dil), pads=list(pads)))
        self.outs.append(name)
        return self

    def save(self, path, opset=19, elem=TP.FLOAT):
        ins = [h.make_tensor_value_info(k, h.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in self.feeds.items()]
        g = h.make_graph(self.nodes, "deform", ins, [h.make_tensor_value_info(o, elem, None) for o in self.outs],
                         [nh.from_array(v, k) for k, v in self.inits.items()])
        m = onnx.shape_inference.infer_shapes(h.make_model(g, opset_imports=[h.make_opsetid("", opset)],
                                                           ir_version=10))
        onnx.save(m, str(path))
        return str(path)


def _check(path, feeds, pipeline="baseline", rtol=RTOL, atol=ATOL):
    m = onnx.load(path)
    refs = _ort(m, feeds)
    f = dlcc.compile(path, target="opencl", pipeline=pipeline)
    got = f(feeds)
    for o, r in zip(m.graph.output, refs):
        np.testing.assert_array_equal(np.isnan(got[o.name]), np.isnan(r), err_msg=o.name)
        np.testing.assert_allclose(got[o.name], r, rtol=rtol, atol=atol, err_msg=o.name)
    assert not f.plan["meta"].get("device_index_checks"), f.plan["meta"]["device_index_checks"]
    return got, refs


@pytest.mark.parametrize("pipeline", [pytest.param("baseline", marks=pytest.mark.slow), "astitch"])
def test_groups_strides_pads_bias_and_mask_match_onnxruntime(tmp_path, pipeline):
    """Seven nodes over one input: plain 3x3 with bias and mask; two groups and two offset groups;
    four offset groups without bias or mask; a 2x3 kernel with stride, dilation and uneven pads;
    a 1x1 kernel; offsets spread 6 pixels (many samples off the map); a 5x5 kernel at opset 22.
    (baseline's run is under -m slow: the rewrite is the same, astitch only fuses its maps.)"""
    rng = np.random.default_rng(0)
    md = (_Model(rng).add("plain").add("groups", m=4, group=2, og=2).add("og4", og=4, bias=False, mask=False)
          .add("strided", k=(2, 3), strides=(2, 1), dil=(1, 2), pads=(0, 2, 1, 0))
          .add("pointwise", k=(1, 1), pads=(0, 0, 0, 0), mask=False).add("wide", spread=6.0)
          .add("big", k=(5, 5), pads=(2, 1, 2, 3), m=3))
    path = md.save(tmp_path / "m.onnx", opset=22)
    _check(path, md.feeds, pipeline)


def test_offsets_on_pixels_edges_and_far_outside(tmp_path):
    """Offsets that put samples exactly on -1, 0, H - 1 and H (and W's), where ORT's border test
    and each neighbour's test decide, and a million pixels away; without padding, so a zero offset
    is a plain convolution, which this also checks against onnxruntime's Conv."""
    rng = np.random.default_rng(1)
    edges = np.array([-1, -0.5, 0, 6, 6.5, 7, 8, 1e6, -1e6, 0.25], F32)

    def place(off):
        flat = off.reshape(-1)
        flat[: flat.size // 2] = rng.choice(edges, flat.size // 2)
        return off

    md = _Model(rng, n=1, c=3, hw=(7, 8)).add("edges", pads=(0, 0, 0, 0), offsets=place, mask=False)
    md.add("zero", pads=(0, 0, 0, 0), offsets=np.zeros_like, mask=False)
    path = md.save(tmp_path / "m.onnx")
    got, _ = _check(path, md.feeds)
    conv = h.make_graph([h.make_node("Conv", ["x", "w", "b"], ["y"])], "conv",
                        [h.make_tensor_value_info("x", TP.FLOAT, md.feeds["x"].shape)],
                        [h.make_tensor_value_info("y", TP.FLOAT, None)],
                        [nh.from_array(md.inits["zero_w"], "w"), nh.from_array(md.inits["zero_b"], "b")])
    want = _ort(h.make_model(conv, opset_imports=[h.make_opsetid("", 19)]), {"x": md.feeds["x"]})[0]
    np.testing.assert_allclose(got["zero"], want, rtol=RTOL, atol=ATOL)


def test_nan_and_inf_in_x_offsets_and_mask(tmp_path):
    """An inf or NaN in X read by a sample makes NaN or inf there, even under a mask of 0 (inf
    times 0), as in onnxruntime; read only by a neighbour outside the map it stays out (that
    neighbour reads 0). A NaN offset reads 0, as a position off the map does."""
    rng = np.random.default_rng(2)
    md = _Model(rng, n=1, c=2, hw=(6, 6)).add("y", m=2, pads=(1, 1, 1, 1), spread=1.0)
    md.feeds["x"][0, 0, 2, 3] = np.inf
    md.feeds["x"][0, 1, 5, 0] = np.nan
    md.feeds["y_mask"][0, :, :3] = 0  # the upper half of the output masked out
    md.feeds["y_off"][0, 5, 4, 4] = np.nan
    path = md.save(tmp_path / "m.onnx")
    got, refs = _check(path, md.feeds)
    assert np.isnan(refs[0]).any() and np.isfinite(refs[0]).any()


def test_float16_model(tmp_path):
    """Computed in float32 and rounded to float16 at the end: equal to onnxruntime's float32 kernel
    on the same (widened) values, rounded the same way."""
    rng = np.random.default_rng(3)
    md = _Model(rng, n=1, c=4, hw=(6, 7)).add("y", group=2, og=2, m=4)
    wide = md.save(tmp_path / "wide.onnx")
    half_feeds = {k: v.astype(np.float16) for k, v in md.feeds.items()}
    md.feeds = half_feeds
    md.inits = {k: v.astype(np.float16) for k, v in md.inits.items()}
    path = md.save(tmp_path / "half.onnx", elem=TP.FLOAT16)
    m = onnx.load(wide)  # its weights are the float32 originals: give it the float16-rounded ones
    for t in m.graph.initializer:
        t.CopyFrom(nh.from_array(nh.to_array(t).astype(np.float16).astype(F32), t.name))
    want = _ort(m, {k: v.astype(F32) for k, v in half_feeds.items()})[0]
    got = dlcc.compile(path, target="opencl", pipeline="astitch")(half_feeds)["y"]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(F32), want.astype(np.float16).astype(F32), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("change, match", [
    (lambda n: n.input.__setitem__(2, "short_off"), r"offset must have shape \[1, 18, 3, 4\], not \[1, 9, 3, 4\]"),
    (lambda n: n.attribute.append(h.make_attribute("group", 3)), "must be W's 4 times group 3"),
    (lambda n: n.attribute.append(h.make_attribute("offset_group", 3)), "divide by offset_group 3"),
    (lambda n: n.input.__setitem__(3, "long_b"), r"B must have shape \[6\]"),
])
def test_malformed_nodes_are_clear_errors(tmp_path, change, match):
    rng = np.random.default_rng(4)
    md = _Model(rng, n=1, c=4, hw=(5, 6)).add("y", pads=(0, 0, 0, 0), mask=False)
    md.feeds["short_off"] = md.feeds["y_off"][:, :9]
    md.inits["long_b"] = np.zeros(7, F32)
    node = md.nodes[0]
    for a in list(node.attribute):
        if a.name in ("group", "offset_group"):
            node.attribute.remove(a)
    change(node)
    ins = [h.make_tensor_value_info(k, TP.FLOAT, v.shape) for k, v in md.feeds.items()]
    g = h.make_graph(md.nodes, "bad", ins, [h.make_tensor_value_info("y", TP.FLOAT, ["n", "m", "oh", "ow"])],
                     [nh.from_array(v, k) for k, v in md.inits.items()])
    path = tmp_path / "bad.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 19)], ir_version=10), str(path))
    with pytest.raises(DlccError, match=match):
        dlcc.compile(str(path), target="opencl", pipeline="baseline")
