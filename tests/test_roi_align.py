"""RoiAlign (dlcc/ops/roi.py) on PoCL: against onnxruntime's CPU kernel on many configurations at
once, and the edges tests/test_ops.py's cases do not reach: samples exactly on the map's borders,
ROIs far larger than the map (whose loops must stay bounded), NaN and inf in X, corners that
overflow float32, and the errors onnxruntime raises (batch indices outside [0, N), ROIs holding
an inf or a NaN) wherever the operand is first known: a constant, a graph input, a computed
tensor.
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
F32, I64 = np.float32, np.int64


def _ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _roi(name, x="x", rois="rois", bidx="bidx", **attrs) -> onnx.NodeProto:
    return h.make_node("RoiAlign", [x, rois, bidx], [name], name=name, **attrs)


def _save(path, nodes, feeds: dict, outputs: list[str], opset: int = 16, inits: dict | None = None,
          elem=TP.FLOAT) -> str:
    ins = [h.make_tensor_value_info(n, h.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds.items()]
    g = h.make_graph(nodes, "roi", ins, [h.make_tensor_value_info(o, elem, None) for o in outputs],
                     [nh.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    m = onnx.shape_inference.infer_shapes(h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=10))
    onnx.save(m, str(path))
    return str(path)


def _compare(path, feeds, pipeline="baseline", ref_feeds=None):
    """dlcc's outputs and onnxruntime's: equal where both are numbers, NaN in the same places."""
    m = onnx.load(path)
    refs = _ort(m, ref_feeds or feeds)
    got = dlcc.compile(path, target="opencl", pipeline=pipeline)(feeds)
    for o, r in zip(m.graph.output, refs):
        np.testing.assert_array_equal(np.isnan(got[o.name]), np.isnan(r), err_msg=o.name)
        np.testing.assert_allclose(got[o.name], r, rtol=1e-5, atol=1e-6, err_msg=o.name)
    return got, refs


def _feeds(rng, n=2, c=3, hw=(9, 11), rois=None, batch=None):
    x = rng.standard_normal((n, c, *hw)).astype(F32)
    if rois is None:
        corner = rng.uniform(-4, max(hw) + 2, (7, 2))
        rois = np.concatenate([corner, corner + rng.uniform(-2, 1.5 * max(hw), (7, 2))], 1).astype(F32)
        rois[::2] = np.round(rois[::2] * 2) / 2  # half-pixel corners
    if batch is None:
        batch = rng.integers(0, n, len(rois)).astype(I64)
    return {"x": x, "rois": np.asarray(rois, F32), "bidx": np.asarray(batch, I64)}


@pytest.mark.parametrize("pipeline", ["baseline", pytest.param("astitch", marks=pytest.mark.slow)])
def test_every_mode_ratio_and_scale_matches_onnxruntime(tmp_path, pipeline):
    """avg and max x both coordinate modes x sampling ratios 0 (adaptive) to 3 x four scales, on
    random ROIs inside, across and outside a non-square map, some of negative size: one model of 32
    nodes, equal to onnxruntime to rounding (the same float operations in the same order). The
    kernel reads X through its own pointers, so AStitch leaves it alone: astitch's run is under
    -m slow."""
    rng = np.random.default_rng(3)
    feeds = _feeds(rng)
    nodes = []
    for mode in ("avg", "max"):
        for ctm in ("half_pixel", "output_half_pixel"):
            for ratio in range(4):
                for scale in (1.0, 0.5, 2.0, 0.3):
                    if (ratio + int(scale * 10)) % 2:  # half of the scale x ratio grid, spread over both
                        continue
                    nodes.append(_roi(f"{mode}_{ctm}_{ratio}_{scale}", mode=mode, coordinate_transformation_mode=ctm,
                                      sampling_ratio=ratio, spatial_scale=scale, output_height=1 + ratio,
                                      output_width=4 - ratio))
    # onnxruntime refuses an adaptive grid of negative size across (its sample table's size
    # overflows): those ROIs appear only where the ratio is fixed or the offset is not subtracted
    ok = (feeds["rois"][:, 2:] - feeds["rois"][:, :2] > 0.5).all(1)
    feeds["rois"], feeds["bidx"] = feeds["rois"][ok], feeds["bidx"][ok]
    path = _save(tmp_path / "every.onnx", nodes, feeds, [n.name for n in nodes])
    _compare(path, feeds, pipeline)


def test_samples_exactly_on_the_borders_land_where_onnxruntime_puts_them(tmp_path):
    """One sample per bin, placed exactly at -1, 0, H - 1 and H (and W's): at -1 and H it still
    counts (clamped onto the edge row), just past them it is skipped. A position computed with an
    FMA would round across those lines; F_MUL_RN keeps the products unfused."""
    rng = np.random.default_rng(4)
    rois = [[-3, -3, 1, 1], [7, 7, 9, 9], [-3, 6, 1, 10], [8, -3, 12, 1], [-3.0001, -3, 1, 1], [7, 7, 9.0001, 9.0001]]
    feeds = _feeds(rng, hw=(8, 8), rois=rois, batch=[0, 1, 1, 0, 1, 0])
    nodes = [_roi(f"{m}_{c}", mode=m, coordinate_transformation_mode=c, sampling_ratio=1, output_height=1,
                  output_width=1) for m in ("avg", "max") for c in ("half_pixel", "output_half_pixel")]
    path = _save(tmp_path / "borders.onnx", nodes, feeds, [n.name for n in nodes])
    got, refs = _compare(path, feeds)
    assert (np.asarray(refs) != 0).any() and (np.asarray(refs) == 0).any()  # some samples in, some out


def test_a_roi_far_larger_than_the_map_costs_no_more_than_the_map(tmp_path):
    """An adaptive grid of ceil(3000 / 3) = 1000 samples per axis per bin: the kernel loops only over
    the few that can lie in the map and counts the rest, equal to onnxruntime, which visits them
    all. ROIs of 1e12 pixels (onnxruntime cannot allocate its sample table) and of 3e38 (whose
    positions overflow) finish too: averages of almost nothing are near 0 and finite, NaN only
    where the positions are NaN along one axis and inside the map along the other."""
    rng = np.random.default_rng(5)
    rois = [[-1500, -1500, 1500, 1500], [-2000, 2, 1000, 5], [0, 0, 3000, 3000]]
    feeds = _feeds(rng, hw=(8, 10), rois=rois, batch=[0, 1, 0])
    nodes = [_roi(f"{m}_{r}", mode=m, sampling_ratio=r, output_height=3, output_width=3, spatial_scale=1.0)
             for m in ("avg", "max") for r in (0, 2)]
    path = _save(tmp_path / "large.onnx", nodes, feeds, [n.name for n in nodes])
    _compare(path, feeds)

    feeds = _feeds(rng, hw=(8, 10), rois=[[-1e12, -1e12, 1e12, 1e12], [0, 0, 1e12, 3]], batch=[0, 1])
    nodes = [_roi("avg", sampling_ratio=0, output_height=3, output_width=3)]
    path = _save(tmp_path / "huge.onnx", nodes, feeds, ["avg"])
    got = dlcc.compile(path, target="opencl", pipeline="baseline")(feeds)["avg"]
    assert np.isfinite(got).all() and np.abs(got).max() < 1e-6

    feeds = _feeds(rng, hw=(8, 10), rois=[[-3e38, -3e38, 3e38, 3e38], [1, 1, 5, 5]], batch=[0, 1])
    nodes = [_roi(m, mode=m, sampling_ratio=2, output_height=3, output_width=3, coordinate_transformation_mode=c)
             for m, c in (("avg", "half_pixel"), ("max", "output_half_pixel"))]
    path = _save(tmp_path / "overflow.onnx", nodes, feeds, [n.name for n in nodes])
    got, _ = _compare(path, feeds)  # onnxruntime reads at an undefined index there; its NaN is the same
    assert np.isnan(got["avg"][0, :, 0, 0]).all() and not np.isnan(got["avg"][0, :, 1:, :]).any()


def test_nan_and_inf_in_x(tmp_path):
    """A NaN or inf pixel makes every bin that samples it NaN (0 times inf too: a weight of 0 on
    an infinite neighbour). X's first element is also what a skipped sample's zero weights meet, so
    an inf there turns the bins with skipped samples to NaN, as in onnxruntime. In max mode dlcc
    keeps a NaN wherever it comes (onnxruntime only where it comes first): NaN in a superset of
    onnxruntime's bins, equal elsewhere."""
    rng = np.random.default_rng(6)
    feeds = _feeds(rng, hw=(8, 8), rois=[[-3, -3, 4, 4], [2, 2, 6, 6], [5, 5, 12, 12], [0, 0, 7, 7]],
                   batch=[0, 1, 1, 0])
    feeds["x"][0, 0, 0, 0] = np.inf
    feeds["x"][1, 1, 3, 4] = np.nan
    avg = [_roi("avg", sampling_ratio=2, output_height=3, output_width=3)]
    path = _save(tmp_path / "avg.onnx", avg, feeds, ["avg"])
    got, _ = _compare(path, feeds)
    assert np.isnan(got["avg"]).any()

    path = _save(tmp_path / "max.onnx", [_roi("max", mode="max", sampling_ratio=2, output_height=3, output_width=3)],
                 feeds, ["max"])
    want = _ort(onnx.load(path), feeds)[0]
    got = dlcc.compile(path, target="opencl", pipeline="baseline")(feeds)["max"]
    assert (np.isnan(got) >= np.isnan(want)).all() and np.isnan(got).sum() > np.isnan(want).sum()
    both = ~np.isnan(got)
    np.testing.assert_allclose(got[both], want[both], rtol=1e-5, atol=1e-6)


def test_opset_10_and_float16(tmp_path):
    """RoiAlign-10 (no coordinate_transformation_mode: no half-pixel offset) and a float16 model,
    computed in float32 and stored in float16, against onnxruntime on the float32 model (its CPU
    kernel has no float16)."""
    rng = np.random.default_rng(7)
    feeds = _feeds(rng)
    node = _roi("y", mode="avg", sampling_ratio=0, output_height=2, output_width=3, spatial_scale=0.5)
    _compare(_save(tmp_path / "ten.onnx", [node], feeds, ["y"], opset=10), feeds)

    half = {k: v.astype(np.float16) if v.dtype == F32 else v for k, v in feeds.items()}
    path = _save(tmp_path / "half.onnx", [node], half, ["y"], opset=16, elem=TP.FLOAT16)
    want = _ort(onnx.load(_save(tmp_path / "widened.onnx", [node], {k: v.astype(F32) if v.dtype == np.float16 else v
                                                                     for k, v in half.items()}, ["y"])),
                {k: v.astype(F32) if v.dtype == np.float16 else v for k, v in half.items()})[0]
    got = dlcc.compile(path, target="opencl", pipeline="baseline")(half)["y"]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(F32), want.astype(np.float16).astype(F32), rtol=0, atol=0)


def _computed(path, feeds, make_bad):
    """A model whose ROIs and batch indices are computed (Mul by 1, Cast from float), so only a
    device check can see them."""
    nodes = [h.make_node("Mul", ["rois_in", "one"], ["rois"]), h.make_node("Cast", ["b_in"], ["bidx"], to=TP.INT64),
             _roi("y", sampling_ratio=2, output_height=2, output_width=2)]
    ins = {"x": feeds["x"], "rois_in": feeds["rois"], "b_in": feeds["bidx"].astype(F32)}
    make_bad(ins)
    return _save(path, nodes, ins, ["y"], inits={"one": np.float32(1)}), ins


@pytest.mark.parametrize("where", ["input", "computed", "constant"])
@pytest.mark.parametrize("what", ["batch index 2", "batch index -1", "nan roi", "inf roi"])
def test_bad_batch_indices_and_non_finite_rois_are_errors(tmp_path, where, what):
    """onnxruntime's two run-time errors, wherever the operand is first known: a constant at
    compile time, a graph input on the host before the run, a computed one on the device after
    it (kernels/index_check.py). The error names the node, the value and where it is."""
    rng = np.random.default_rng(8)
    feeds = _feeds(rng)

    def spoil(f):
        if what.startswith("batch"):
            key = "b_in" if "b_in" in f else "bidx"
            f[key] = f[key].copy()
            f[key][3] = float(what.split()[-1])
        else:
            key = "rois_in" if "rois_in" in f else "rois"
            f[key] = f[key].copy()
            f[key][2, 1] = np.nan if what.startswith("nan") else -np.inf

    if where == "computed":
        path, feeds = _computed(tmp_path / "m.onnx", feeds, spoil)
        with pytest.raises(DlccError, match=r"RoiAlign node 'y'.*(computed index|computed operand)"):
            dlcc.compile(path, target="opencl", pipeline="baseline")(feeds)
        return
    spoil(feeds)
    node = _roi("y", sampling_ratio=2, output_height=2, output_width=2)
    if where == "input":
        path = _save(tmp_path / "m.onnx", [node], feeds, ["y"])
        key = "bidx" if what.startswith("batch") else "rois"
        with pytest.raises(DlccError, match=rf"input '{key}'.*RoiAlign node 'y'"):
            dlcc.compile(path, target="opencl", pipeline="baseline")(feeds)
        return
    consts = {k: feeds.pop(k) for k in ("rois", "bidx")}
    path = _save(tmp_path / "m.onnx", [node], feeds, ["y"], inits=consts)
    with pytest.raises(DlccError, match=r"RoiAlign node 'y'.*(outside \[0, 2\)|must be finite)"):
        dlcc.compile(path, target="opencl", pipeline="baseline")


def test_good_computed_operands_pass_their_device_checks(tmp_path):
    """The same computed model with good values: the checks are in the plan and stay silent."""
    rng = np.random.default_rng(9)
    path, feeds = _computed(tmp_path / "m.onnx", _feeds(rng), lambda f: None)
    f = dlcc.compile(path, target="opencl", pipeline="astitch")
    kinds = sorted(c.get("kind", "index") for c in f.plan["meta"]["device_index_checks"])
    assert kinds == ["finite", "index"]
    want = _ort(onnx.load(path), feeds)[0]
    np.testing.assert_allclose(f(feeds)["y"], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("attrs, match", [
    ({"mode": "mean"}, "mode 'mean' is not one of avg, max"),
    ({"coordinate_transformation_mode": "align_corners"}, "coordinate_transformation_mode 'align_corners'"),
    ({"sampling_ratio": -1}, "sampling_ratio must be 0"),
])
def test_bad_attributes_are_clear_errors(tmp_path, attrs, match):
    feeds = _feeds(np.random.default_rng(10))
    path = _save(tmp_path / "m.onnx", [_roi("y", output_height=2, output_width=2, **attrs)], feeds, ["y"])
    with pytest.raises(DlccError, match=match):
        dlcc.compile(path, target="opencl", pipeline="baseline")
