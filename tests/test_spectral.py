"""STFT and DFT (dlcc/spectral.py): products with a constant Fourier basis, checked on PoCL
against numpy's FFT in float64 (the exact answer; onnxruntime's STFT of a 400-sample frame is
itself about 1e-3 off in a log-mel front end), and against onnxruntime where its answer is
accurate. Models from torch's exporter and hand-built ones cover every input form the spec and
onnxruntime accept; what cannot be a product is one clear error."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

import dlcc
from conftest import opencl_device_available, run_ort
from dlcc.errors import DlccError

needs_opencl = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")
rng = np.random.default_rng(0)


def _save(path, nodes, inputs, outputs, inits=(), opset=17):
    g = h.make_graph(nodes, "spectral", inputs, outputs, list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8 if opset < 20 else 10
    onnx.save(m, path)
    return str(path)


def _f(name, shape, t=TP.FLOAT):
    """A value of `shape`; an int shape is a rank, its dims left symbolic (what onnx infers for a
    rank-2 STFT is wrong, so outputs are not given dims here)."""
    if isinstance(shape, int):
        shape = [f"{name}{k}" for k in range(shape)]
    return h.make_tensor_value_info(name, t, shape)


def _stft_ref(x, step, window, onesided=True):
    """numpy, float64: frames of len(window) every `step` samples, windowed, FFT'd; [B, F, bins, 2]."""
    z = x[..., 0] + 1j * x[..., 1] if x.ndim == 3 and x.shape[-1] == 2 else x.reshape(x.shape[0], -1)
    n = len(window)
    frames = (z.shape[1] - n) // step + 1
    taken = z[:, np.arange(frames)[:, None] * step + np.arange(n)] * window
    spec = np.fft.rfft(taken, axis=-1) if onesided else np.fft.fft(taken, axis=-1)
    return np.stack([spec.real, spec.imag], -1)


def _close(got, ref, scale=None):
    """float32 products of n terms: within a few units of float32 of the largest magnitude."""
    scale = scale if scale is not None else np.abs(ref).max()
    np.testing.assert_allclose(got, ref, rtol=0, atol=2e-5 * scale)


@needs_opencl
@pytest.mark.parametrize("pipeline", ["baseline", "astitch", "full"])
def test_stft_of_a_rank2_signal_with_a_hann_window(tmp_path, pipeline):
    """onnx-script's audio front ends (onnx-asr: GigaAM, Whisper, NeMo) feed STFT a [batch,
    samples] signal, which onnxruntime accepts and onnx's shape inference mis-sizes; the window
    is a 400-sample Hann constant, and the power spectrum follows."""
    window = np.hanning(402)[1:-1].astype(np.float32)
    nodes = [h.make_node("STFT", ["x", "step", "window"], ["s"]),
             h.make_node("ReduceSumSquare", ["s"], ["y"], axes=[-1], keepdims=0)]
    path = _save(tmp_path / "stft.onnx", nodes, [_f("x", [2, 2000])], [_f("y", 3)],
                 [nh.from_array(np.array(160, np.int64), "step"), nh.from_array(window, "window"),
                  ])
    m = dlcc.compile(path, target="opencl", pipeline=pipeline)
    x = rng.standard_normal((2, 2000)).astype(np.float32)
    got = m({"x": x})["y"]
    s = _stft_ref(x.astype(np.float64), 160, window.astype(np.float64))
    _close(got, (s ** 2).sum(-1))
    assert any("STFT" in line and "strided Conv against a 402x1x400 Fourier basis" in line
               for line in m.plan["meta"]["pass_log"])


@needs_opencl
@pytest.mark.parametrize("form", ["real-no-window", "complex", "runtime-window", "hann-op"])
def test_stft_input_forms(tmp_path, form):
    """[B, N, 1] with only frame_length (a rectangular window, onesided=0); [B, N, 2] complex;
    a window given at run time (multiplied into the basis in the plan); a window computed by
    HannWindow of a constant size (folded into the basis)."""
    step, n, length = 8, 96, 32
    inputs = [_f("x", [2, n, 2 if form == "complex" else 1])]
    inits = [nh.from_array(np.array(step, np.int64), "step")]
    feeds = {"x": rng.standard_normal((2, n, 2 if form == "complex" else 1)).astype(np.float32)}
    window = np.ones(length)
    if form == "real-no-window":
        inits.append(nh.from_array(np.array(length, np.int64), "len"))
        nodes = [h.make_node("STFT", ["x", "step", "", "len"], ["y"], onesided=0)]
        onesided = False
    elif form == "complex":
        window = rng.uniform(0.2, 1, length)
        inits.append(nh.from_array(window.astype(np.float32), "w"))
        nodes = [h.make_node("STFT", ["x", "step", "w"], ["y"], onesided=0)]
        onesided = False
    elif form == "runtime-window":
        window = rng.uniform(0.2, 1, length).astype(np.float32)
        inputs.append(_f("w", [length]))
        feeds["w"] = window
        nodes = [h.make_node("STFT", ["x", "step", "w"], ["y"])]
        onesided = True
    else:
        inits.append(nh.from_array(np.array(length, np.int64), "wl"))
        nodes = [h.make_node("HannWindow", ["wl"], ["w"]), h.make_node("STFT", ["x", "step", "w"], ["y"])]
        window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(length) / length)  # periodic, the op's default
        onesided = True
    path = _save(tmp_path / "stft.onnx", nodes, inputs, [_f("y", 4)], inits)
    got = dlcc.compile(path, target="opencl", pipeline="astitch")(feeds)["y"]
    ref = _stft_ref(feeds["x"].astype(np.float64), step, np.asarray(window, np.float64), onesided)
    _close(got, ref)
    if form != "complex":  # (onnxruntime's FFT of a power-of-two frame is accurate: it agrees too)
        _close(got, run_ort(path, feeds)[0], np.abs(ref).max())


def _dft_model(tmp_path, shape, opset=20, axis=None, length=None, inverse=0, onesided=0):
    ins = ["x", "n" if length is not None else ""]
    inits = [nh.from_array(np.array(length, np.int64), "n")] if length is not None else []
    attrs = {"inverse": inverse, "onesided": onesided}
    if opset >= 20:
        if axis is not None:
            ins.append("axis")
            inits.append(nh.from_array(np.array(axis, np.int64), "axis"))
    elif axis is not None:
        attrs["axis"] = axis
    while ins and not ins[-1]:
        ins.pop()
    return _save(tmp_path / "dft.onnx", [h.make_node("DFT", ins, ["y"], **attrs)], [_f("x", list(shape))],
                 [_f("y", len(shape))], inits, opset)


def _complex(x):
    return x[..., 0] + 1j * x[..., 1] if x.shape[-1] == 2 else x[..., 0]


def _as_pairs(z):
    return np.stack([z.real, z.imag], -1)


DFT_CASES = {
    # id: (input shape, DFT arguments, numpy's answer as a function of the complex input)
    "opset17-axis1-real": ((3, 16, 1), dict(opset=17, axis=1), lambda z: np.fft.fft(z, axis=1)),
    "rfft-default-axis": ((2, 3, 24, 1), dict(onesided=1), lambda z: np.fft.rfft(z, axis=-1)),
    "complex-inverse": ((2, 20, 2), dict(inverse=1, axis=1), lambda z: np.fft.ifft(z, axis=1)),
    "irfft": ((2, 9, 2), dict(inverse=1, onesided=1, axis=1), lambda z: np.fft.irfft(z, n=16, axis=1)[..., None]),
    "zero-padded": ((2, 12, 1), dict(length=20, axis=1), lambda z: np.fft.fft(z, n=20, axis=1)),
    "truncated": ((2, 12, 2), dict(length=8, axis=1), lambda z: np.fft.fft(z, n=8, axis=1)),
    "middle-axis": ((2, 10, 3, 2), dict(axis=1), lambda z: np.fft.fft(z, axis=1)),
}


@needs_opencl
@pytest.mark.parametrize("case", sorted(DFT_CASES))
def test_dft(tmp_path, case):
    shape, kw, fn = DFT_CASES[case]
    path = _dft_model(tmp_path, shape, **kw)
    x = rng.standard_normal(shape).astype(np.float32)
    got = dlcc.compile(path, target="opencl", pipeline="astitch")({"x": x})["y"]
    exact = fn(_complex(x.astype(np.float64)))
    ref = exact if case == "irfft" else _as_pairs(exact)
    _close(got, ref)
    _close(got, run_ort(path, {"x": x})[0], np.abs(ref).max())


@needs_opencl
def test_a_signal_shaped_only_past_onnxs_inference(tmp_path):
    """onnx leaves a GatherND with a rank-0 result shapeless, and so everything after it; the DFT
    of a signal computed from one was refused as dynamic (fuzz seed 940354). The import gives
    such outputs their shape before the transform is sized."""
    nodes = [h.make_node("GatherND", ["t", "i"], ["s"]),  # one element of t: a scalar
             h.make_node("Add", ["x", "s"], ["sig"]),
             h.make_node("DFT", ["sig"], ["y"], axis=1)]
    t, i = rng.standard_normal((4, 6)).astype(np.float32), np.array([2, 3], np.int64)
    path = _save(tmp_path / "m.onnx", nodes, [_f("x", [2, 12, 1])], [_f("y", [2, 12, 2])],
                 [nh.from_array(t, "t"), nh.from_array(i, "i")])
    x = rng.standard_normal((2, 12, 1)).astype(np.float32)
    got = dlcc.compile(path, target="opencl", pipeline="baseline")({"x": x})["y"]
    _close(got, _as_pairs(np.fft.fft(_complex(x.astype(np.float64) + float(t[2, 3])), axis=1)))


@needs_opencl
def test_torch_stft_and_rfft_through_torchs_exporter(tmp_path):
    """What torch 2.13's exporter (dynamo, opset 20) writes for torch.stft (centred, reflect-padded,
    Hann window) and torch.fft.rfft: STFT and DFT nodes, which dlcc compiles and runs as torch does."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")

    class Features(torch.nn.Module):
        def forward(self, x):
            s = torch.stft(x, n_fft=64, hop_length=16, window=torch.hann_window(64), return_complex=True)
            r = torch.fft.rfft(x[:, :128], dim=-1)
            return torch.log1p(s.abs() ** 2), torch.view_as_real(r)

    x = torch.randn(2, 512)
    path = tmp_path / "features.onnx"
    torch.onnx.export(Features().eval(), (x,), str(path), dynamo=True, verbose=False)
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert {"STFT", "DFT"} <= ops, ops
    m = dlcc.compile(path, target="opencl", pipeline="astitch")
    name = m.inputs[0]["name"]
    got = m({name: x.numpy()})
    want = [t.numpy() for t in Features()(x)]
    for g, w in zip(got.values(), want):
        _close(g, w)


def test_the_pass_log_says_what_each_transform_became(tmp_path):
    path = _dft_model(tmp_path, (2, 16, 1), onesided=1, axis=1)
    from dlcc.frontend import import_model

    g = import_model(path)
    assert any("DFT" in n and "MatMul against a 16x18 Fourier basis (rfft of length 16 on axis 1)" in n
               for n in g.notes), g.notes


@pytest.mark.parametrize("bad, needle", [
    ("runtime-step", "its frame_step 'step' is computed at run time"),
    ("complex-onesided", "a complex signal has no onesided transform"),
    ("huge-dft", "above its limit"),
    ("runtime-length", "its dft_length 'n' is computed at run time"),
])
def test_what_cannot_be_a_product_is_one_clear_error(tmp_path, bad, needle):
    if bad == "runtime-step":
        path = _save(tmp_path / "m.onnx", [h.make_node("STFT", ["x", "step"], ["y"])],
                     [_f("x", [1, 64, 1]), _f("step", [], TP.INT64)], [_f("y", 4)])
        shapes = {"x": [1, 64, 1]}
    elif bad == "complex-onesided":
        path = _save(tmp_path / "m.onnx", [h.make_node("STFT", ["x", "step", "", "n"], ["y"], onesided=1)],
                     [_f("x", [1, 64, 2])], [_f("y", 4)],
                     [nh.from_array(np.array(8, np.int64), "step"), nh.from_array(np.array(16, np.int64), "n")])
        shapes = None
    elif bad == "huge-dft":
        path = _dft_model(tmp_path, (1, 8192, 2), axis=1)
        shapes = None
    else:
        path = _save(tmp_path / "m.onnx", [h.make_node("DFT", ["x", "n"], ["y"])],
                     [_f("x", [1, 16, 1]), _f("n", [], TP.INT64)], [_f("y", 3)], opset=20)
        shapes = None
    with pytest.raises(DlccError, match=needle):
        dlcc.compile(path, target="opencl", shapes=shapes)


@needs_opencl
def test_the_fourier_products_stay_float32_at_bf16(tmp_path):
    """A 16-bit basis would put every weak bin of a spectrum under the rounding of the strong ones
    (onnx-asr's Kaldi and NeMo front ends were 2.5 off in their log-mel features at bf16). As
    torch.autocast keeps stft and fft in float32, dlcc keeps the products it makes of them float32
    at every precision; the rest of the graph (here the log) follows the precision."""
    window = np.hanning(258)[1:-1].astype(np.float32)
    nodes = [h.make_node("STFT", ["x", "step", "window"], ["s"]),
             h.make_node("ReduceSumSquare", ["s"], ["p"], axes=[-1], keepdims=0), h.make_node("Log", ["p"], ["y"])]
    path = _save(tmp_path / "stft.onnx", nodes, [_f("x", [1, 4096])], [_f("y", 3)],
                 [nh.from_array(np.array(128, np.int64), "step"), nh.from_array(window, "window")])
    m = dlcc.compile(path, target="opencl", pipeline="astitch", precision="bf16")
    assert m.plan["meta"]["float32_compute"] == {"Conv": 1}
    t = np.arange(4096) / 16000
    x = (np.sin(2 * np.pi * 440 * t) + 1e-3 * rng.standard_normal(4096)).astype(np.float32)  # one loud tone
    s = _stft_ref(x[None].astype(np.float64), 128, window.astype(np.float64))
    exact = np.log((s ** 2).sum(-1))
    np.testing.assert_allclose(m({"x": x[None]})["y"], exact, rtol=0, atol=0.05)


@needs_opencl
@pytest.mark.parametrize("half", [TP.BFLOAT16, TP.FLOAT16])
@pytest.mark.parametrize("op", ["DFT", "STFT"])
def test_a_half_models_transform_computes_in_float32(tmp_path, half, op):
    """A float16 or bfloat16 model's DFT or STFT, at fp32, is a product with a float32 basis
    between Casts, as the rest of a half model computes in float32 and verify's widened reference
    has it: a basis made in the half type was rounded to it (a bfloat16 DFT was a bfloat16 ulp
    off, 0.0035 on values near 1: the bf16-model fuzz run, graph 920117)."""
    import ml_dtypes

    dt = ml_dtypes.bfloat16 if half == TP.BFLOAT16 else np.float16
    x = rng.standard_normal((1, 64)).astype(dt).astype(np.float32)  # (on the half grid: the Cast is exact)
    if op == "DFT":
        core = [h.make_node("Unsqueeze", ["xh", "ax"], ["u"]), h.make_node("DFT", ["u"], ["zh"], axis=1)]
        inits = [nh.from_array(np.array([-1], np.int64), "ax")]
        want = np.fft.fft(x.astype(np.float64), axis=1)
        want = np.stack([want.real, want.imag], -1)
    else:
        core = [h.make_node("STFT", ["xh", "step"], ["zh"], onesided=1)]
        inits = [nh.from_array(np.array(64, np.int64), "step")]
        want = np.fft.rfft(x.astype(np.float64), axis=1)[:, None]
        want = np.stack([want.real, want.imag], -1)
    nodes = [h.make_node("Cast", ["x"], ["xh"], to=half), *core, h.make_node("Cast", ["zh"], ["z"], to=TP.FLOAT)]
    g = h.make_graph(nodes, "t", [h.make_tensor_value_info("x", TP.FLOAT, [1, 64])],
                     [h.make_tensor_value_info("z", TP.FLOAT, None)], inits)
    path = tmp_path / "half_transform.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
    got = dlcc.compile(str(path), target="opencl", pipeline="baseline")({"x": x})["z"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
