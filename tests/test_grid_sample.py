"""GridSample (opsets 16, 20, 22) and AffineGrid (opset 20), which dlcc writes as standard ops at
import (dlcc/grid_sample.py), on PoCL against onnxruntime's CPU kernels.

Grids reach past [-1, 1] (where the padding modes differ) and hold exact half-pixel points (where
nearest's round-half-to-even shows). Many nodes share one model, so that one compile checks them
all; each model runs through the baseline and the AStitch pipelines. Every gather index the
rewrite computes is clamped, so no device-side index check may be left in the plan. Two real
exports close the file: a spatial transformer (affine_grid + grid_sample) and a flow warp
(grid_sample alone), from torch.onnx's TorchScript exporter.
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

needs_opencl = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")
#: baseline's runs of the other cases are under -m slow: astitch covers the same rewrite in the
#: default suite, and the first case runs both there.
SLOW_BASELINE = [pytest.param("baseline", marks=pytest.mark.slow), "astitch"]
PIPELINES = ["baseline", "astitch"]
RTOL, ATOL = 1e-4, 1e-5


def _ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _model(path, nodes, feeds: dict, outputs: list[str], opset: int, inits: dict | None = None):
    """Save a model of `nodes` (its outputs typed from onnxruntime's results) and return its path
    and onnxruntime's outputs."""
    ins = [h.make_tensor_value_info(n, h.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds.items()]
    g = h.make_graph(nodes, "grid_sample", ins, [h.make_empty_tensor_value_info(o) for o in outputs],
                     [nh.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=10)
    refs = _ort(m, feeds)
    for o, r in zip(m.graph.output, refs):
        o.CopyFrom(h.make_tensor_value_info(o.name, h.np_dtype_to_tensor_dtype(r.dtype), r.shape))
    onnx.save(m, str(path))
    return str(path), refs


def _check(path, refs, feeds, pipeline, rtol=RTOL, atol=ATOL):
    f = dlcc.compile(path, target="opencl", pipeline=pipeline)
    got = f(feeds)
    names = [o.name for o in onnx.load(path).graph.output]
    for n, r in zip(names, refs):
        assert got[n].shape == r.shape and got[n].dtype == r.dtype, (n, got[n].shape, r.shape, got[n].dtype, r.dtype)
        np.testing.assert_allclose(got[n], r, rtol=rtol, atol=atol, err_msg=n)
    # every index is clamped into range where it is computed: none is left to check on the device
    assert not f.plan["meta"].get("device_index_checks"), f.plan["meta"]["device_index_checks"]
    return got


def _sample(name: str, x: str, grid: str, out: str, **attrs) -> onnx.NodeProto:
    return h.make_node("GridSample", [x, grid], [out], name=name, **attrs)


def _halves(lengths: tuple[int, int], align: bool, ks: list[int]) -> list[np.ndarray]:
    """Grid values that land exactly on k + 0.5 pixels along W and along H (x, y), for k in ks:
    the inverse of the kernel's denormalization, exact in float32 for these lengths."""
    out = []
    for L in reversed(lengths):  # x (along W) first
        k = np.asarray(ks, np.float64) + 0.5
        g = 2 * k / (L - 1) - 1 if align else (2 * k + 1) / L - 1
        out.append(g.astype(np.float32))
    return out


@needs_opencl
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_grid_sample_16_every_mode(tmp_path, pipeline):
    """Every mode x padding_mode x align_corners at opset 16, on a non-square input sampled to a
    non-square output; the grid reaches 1.3 past the borders and holds half-pixel points (-1.5,
    -0.5, 0.5, 3.5, W - 0.5, W + 0.5) for each align_corners' input."""
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((2, 3, 4, 8)).astype(np.float32)  # align_corners=0: (2k+1)/L exact
    x1 = rng.standard_normal((2, 3, 5, 9)).astype(np.float32)  # align_corners=1: 2k/(L-1) exact
    grid = rng.uniform(-1.3, 1.3, (2, 5, 6, 2)).astype(np.float32)
    ks = [-2, -1, 0, 3, 7, 8]
    for row, (lengths, align) in ((0, ((4, 8), False)), (2, ((5, 9), True))):
        gx, gy = _halves(lengths, align, ks)
        grid[:, row, :, 0], grid[:, row, :, 1] = gx, gy[::-1]  # both coordinates on half pixels
        grid[:, row + 1, :, 0] = gx[::-1]  # x alone on half pixels
        grid[1, row + 1, :, 1] = gy  # y alone, in the second batch entry
    nodes, outs = [], []
    for mode in ("bilinear", "nearest", "bicubic"):
        for pad in ("zeros", "border", "reflection"):
            for align in (0, 1):
                out = f"{mode}_{pad}_{align}"
                nodes.append(_sample(out, f"x{align}", "grid", out, mode=mode, padding_mode=pad, align_corners=align))
                outs.append(out)
    feeds = {"x0": x0, "x1": x1, "grid": grid}
    path, refs = _model(tmp_path / "gs16.onnx", nodes, feeds, outs, 16)
    _check(path, refs, feeds, pipeline)


@needs_opencl
@pytest.mark.parametrize("pipeline", SLOW_BASELINE)
def test_grid_sample_20_names_5d_and_thin_inputs(tmp_path, pipeline):
    """Opset 20's names (the default "linear", "cubic"), a one-channel tall input, an input one
    pixel high (every tap folds onto that row), and 5-D inputs (trilinear and nearest, every
    padding mode, both align_corners; onnxruntime has no 5-D cubic)."""
    rng = np.random.default_rng(1)
    feeds = {"x4": rng.standard_normal((1, 1, 6, 5)).astype(np.float32),
             "g4": rng.uniform(-1.3, 1.3, (1, 3, 4, 2)).astype(np.float32),
             "xh": rng.standard_normal((1, 2, 1, 3)).astype(np.float32),
             "gh": rng.uniform(-1.6, 1.6, (1, 2, 3, 2)).astype(np.float32),
             "x5": rng.standard_normal((2, 2, 3, 4, 5)).astype(np.float32),
             "g5": rng.uniform(-1.3, 1.3, (2, 2, 3, 4, 3)).astype(np.float32)}
    cases = [("x4", "g4", {}), ("x4", "g4", dict(mode="linear", padding_mode="border", align_corners=1)),
             ("x4", "g4", dict(mode="cubic", padding_mode="reflection")),
             ("x4", "g4", dict(mode="cubic", align_corners=1)), ("x4", "g4", dict(mode="cubic", padding_mode="border")),
             ("x4", "g4", dict(mode="nearest", padding_mode="reflection", align_corners=1)),
             ("xh", "gh", dict(mode="cubic", padding_mode="reflection")),
             ("xh", "gh", dict(mode="linear", padding_mode="border", align_corners=1)),
             ("xh", "gh", dict(mode="nearest", align_corners=1)), ("xh", "gh", dict(padding_mode="reflection"))]
    cases += [("x5", "g5", dict(mode=mode, padding_mode=pad, align_corners=align))
              for mode in ("linear", "nearest") for pad in ("zeros", "border", "reflection") for align in (0, 1)]
    nodes = [_sample(f"y{i}", x, g, f"y{i}", **attrs) for i, (x, g, attrs) in enumerate(cases)]
    path, refs = _model(tmp_path / "gs20.onnx", nodes, feeds, [n.output[0] for n in nodes], 20)
    _check(path, refs, feeds, pipeline)


@needs_opencl
@pytest.mark.parametrize("pipeline", SLOW_BASELINE)
def test_grid_sample_half(tmp_path, pipeline):
    """float16 input and grid at opset 22: computed in float32, rounded once at the end, as
    onnxruntime runs them (it has float kernels only and casts around them)."""
    rng = np.random.default_rng(2)
    feeds = {"x": rng.standard_normal((1, 2, 5, 6)).astype(np.float16),
             "g": rng.uniform(-1.3, 1.3, (1, 4, 3, 2)).astype(np.float16),
             "x5": rng.standard_normal((1, 2, 3, 4, 5)).astype(np.float16),
             "g5": rng.uniform(-1.3, 1.3, (1, 2, 2, 2, 3)).astype(np.float16)}
    nodes = [_sample("lin", "x", "g", "lin"),
             _sample("cub", "x", "g", "cub", mode="cubic", padding_mode="border", align_corners=1),
             _sample("near", "x", "g", "near", mode="nearest", padding_mode="reflection"),
             _sample("tri", "x5", "g5", "tri", padding_mode="reflection", align_corners=1)]
    path, refs = _model(tmp_path / "gs_half.onnx", nodes, feeds, ["lin", "cub", "near", "tri"], 22)
    _check(path, refs, feeds, pipeline, rtol=2e-3, atol=2e-3)


@needs_opencl
@pytest.mark.parametrize("pipeline", SLOW_BASELINE)
def test_affine_grid(tmp_path, pipeline):
    """AffineGrid 2-D and 3-D with both align_corners, a dim of length 1 (onnxruntime's base grid
    puts its one point at +1 with align_corners, at 0 without), and a GridSample reading one of
    the grids."""
    rng = np.random.default_rng(3)
    eye2, eye3 = np.eye(2, 3, dtype=np.float32), np.eye(3, 4, dtype=np.float32)
    feeds = {"t2": (eye2 + 0.3 * rng.standard_normal((2, 2, 3))).astype(np.float32),
             "t3": (eye3 + 0.3 * rng.standard_normal((2, 3, 4))).astype(np.float32),
             "x": rng.standard_normal((2, 3, 6, 8)).astype(np.float32)}
    inits = {"s2": np.array([2, 3, 5, 7], np.int64), "s3": np.array([2, 1, 3, 4, 5], np.int64),
             "s1": np.array([2, 3, 1, 4], np.int64), "s31": np.array([2, 1, 1, 3, 1], np.int64)}
    nodes, outs = [], []
    for theta, size in (("t2", "s2"), ("t3", "s3"), ("t2", "s1"), ("t3", "s31")):
        for align in (0, 1):
            out = f"grid_{size}_{align}"
            nodes.append(h.make_node("AffineGrid", [theta, size], [out], name=out, align_corners=align))
            outs.append(out)
    nodes.append(_sample("warp", "x", "grid_s2_0", "warp", padding_mode="reflection"))
    path, refs = _model(tmp_path / "affine.onnx", nodes, feeds, outs + ["warp"], 20, inits)
    _check(path, refs, feeds, pipeline)


def _export(module, x, path, opset: int) -> str:
    import torch

    torch.onnx.export(module, (x,), str(path), opset_version=opset, dynamo=False, input_names=["x"],
                      output_names=["y"])
    return str(path)


@needs_opencl
@pytest.mark.parametrize("pipeline", SLOW_BASELINE)
def test_exported_spatial_transformer(tmp_path, pipeline):
    """A spatial transformer as torch writes one: a small localization net predicts theta,
    affine_grid and grid_sample resample the input. The TorchScript exporter writes affine_grid
    from opset 20 only, so this is AffineGrid-20 + GridSample-20; the flow warp below covers
    GridSample-16 from an opset-17 export."""
    torch = pytest.importorskip("torch")

    class SpatialTransformer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.loc = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, stride=2), torch.nn.ReLU(), torch.nn.Flatten(),
                                           torch.nn.Linear(4 * 7 * 9, 6))
            self.register_buffer("identity", torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]))

        def forward(self, x):
            theta = self.loc(x).view(-1, 2, 3) * 0.2 + self.identity
            grid = torch.nn.functional.affine_grid(theta, [x.shape[0], x.shape[1], 12, 10], align_corners=False)
            return torch.nn.functional.grid_sample(x, grid, mode="bilinear", padding_mode="border",
                                                   align_corners=False)

    torch.manual_seed(0)
    x = np.random.default_rng(4).standard_normal((2, 3, 16, 20)).astype(np.float32)
    path = _export(SpatialTransformer().eval(), torch.from_numpy(x), tmp_path / "stn.onnx", 20)
    assert {"AffineGrid", "GridSample"} <= {n.op_type for n in onnx.load(path).graph.node}
    _check(path, _ort(onnx.load(path), {"x": x}), {"x": x}, pipeline)


@needs_opencl
@pytest.mark.parametrize("pipeline", SLOW_BASELINE)
def test_exported_flow_warp(tmp_path, pipeline):
    """An image warped by a flow a conv predicts (optical-flow and deformable models): grid =
    base + flow, bicubic with zero padding, exported at opset 17 (GridSample-16)."""
    torch = pytest.importorskip("torch")

    class FlowWarp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.flow = torch.nn.Conv2d(3, 2, 3, padding=1)
            ys, xs = torch.meshgrid(torch.linspace(-1, 1, 9), torch.linspace(-1, 1, 11), indexing="ij")
            self.register_buffer("base", torch.stack([xs, ys], dim=-1)[None])

        def forward(self, x):
            grid = self.base + 0.3 * torch.tanh(self.flow(x)).permute(0, 2, 3, 1)
            return torch.nn.functional.grid_sample(x, grid, mode="bicubic", padding_mode="zeros", align_corners=True)

    torch.manual_seed(0)
    x = np.random.default_rng(5).standard_normal((2, 3, 9, 11)).astype(np.float32)
    path = _export(FlowWarp().eval(), torch.from_numpy(x), tmp_path / "warp.onnx", 17)
    assert "GridSample" in {n.op_type for n in onnx.load(path).graph.node}
    _check(path, _ort(onnx.load(path), {"x": x}), {"x": x}, pipeline)


@needs_opencl
def test_refused(tmp_path):
    """What is refused, with the reason: cubic on a 5-D input (onnxruntime refuses it too), an
    AffineGrid whose size comes at run time, and an opset-20 mode name in an opset-16 model
    (onnxruntime takes each opset's own names only)."""
    import onnxruntime as ort

    f = np.float32
    cases = [
        ([_sample("s", "x", "g", "y", mode="cubic")],
         {"x": np.zeros((1, 1, 2, 3, 4), f), "g": np.zeros((1, 1, 2, 2, 3), f)}, 20, [1, 1, 1, 2, 2],
         "cubic mode on a 5-D input"),
        ([h.make_node("AffineGrid", ["t", "size"], ["y"])],
         {"t": np.zeros((1, 2, 3), f), "size": np.array([1, 1, 2, 2])}, 20, [1, 2, 2, 2],
         "a size computed at run time"),
        ([_sample("s", "x", "g", "y", mode="linear")], {"x": np.zeros((1, 1, 2, 3), f), "g": np.zeros((1, 2, 2, 2), f)},
         16, [1, 1, 2, 2], "mode must be one of bilinear, nearest, bicubic"),
    ]
    for i, (nodes, feeds, opset, shape, why) in enumerate(cases):
        ins = [h.make_tensor_value_info(n, h.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds.items()]
        g = h.make_graph(nodes, "refused", ins, [h.make_tensor_value_info("y", TP.FLOAT, shape)])
        m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=10)
        path = str(tmp_path / f"refused{i}.onnx")
        onnx.save(m, path)
        if "run time" not in why:  # onnxruntime refuses these as well
            with pytest.raises(Exception):
                ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
        with pytest.raises(DlccError, match=why):
            dlcc.compile(path, target="opencl", pipeline="baseline")
