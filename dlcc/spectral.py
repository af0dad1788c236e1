"""STFT and DFT as matrix products: each node becomes a Conv or a MatMul against a constant
Fourier basis at import, before anything is lowered.

Why a basis and not an FFT kernel:
- the transforms in real models are short (audio front ends: 400- or 512-sample frames; Whisper,
  NeMo, GigaAM, Kaldi-style and WeSpeaker features; `torch.stft` and `torch.fft.rfft` through
  torch's exporter). A length-N transform as a product is N·2K multiply-adds per frame, and it
  runs on dlcc's GEMM and convolution rOperators, which AStitch fuses with what follows
  (the power spectrum, the mel matrix, the log) and Rammer schedules like any other GEMM;
- the framing of an STFT is a strided convolution: each output channel is one (window × cos) or
  (window × −sin) row, and the stride is the hop. Nothing copies frames out;
- the onnx-script audio front ends ship their own `*_conv.onnx` twins built exactly this way,
  and the two agree with onnxruntime's FFT to float32 rounding.

The basis is computed in float64 (angles reduced as (k·n mod N) / N, so they stay exact for
long frames) and stored in the signal's type. It is a weight of the plan, like any other: a
512-sample onesided STFT is 257 × 2 × 512 values (1 MB in float32). A transform whose basis would
exceed MAX_BASIS_ELEMENTS is one clear error, not a slow compile.

What must be known at compile time: the frame step and frame length of an STFT, and the DFT's
length and axis (they set shapes), and the signal's length along the transformed axis (after
`--shape`). A constant window (also one the model computes from constants, HannWindow of a
constant size: onnxruntime's folding has made it an initializer by the time this runs) is folded
into the basis; a window computed at run time multiplies the basis in the plan.

onnx's shape inference gets STFT's output wrong for a rank-2 signal [batch, samples] (which
onnxruntime accepts, and onnx-script's front ends feed it); rewriting before strict inference
keeps that bug out of dlcc."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
from onnx import helper, numpy_helper

from .errors import ModelError, ShapeError
from .expand import _all_names, _prefix
from .frontend import HALF_TYPES, opset_of, tensor_value

#: The largest basis a transform may have (values): 32M float32 values are 128 MB of weights.
MAX_BASIS_ELEMENTS = 32 * 2**20

_DTYPES = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.DOUBLE: np.float64,
           onnx.TensorProto.FLOAT16: np.float16, onnx.TensorProto.BFLOAT16: ml_dtypes.bfloat16}


def has_spectral(model: onnx.ModelProto) -> bool:
    return any(n.op_type in ("STFT", "DFT") and n.domain in ("", "ai.onnx") for n in model.graph.node)


def lower_spectral(model: onnx.ModelProto, infer, weights: dict[str, np.ndarray],
                   path) -> tuple[onnx.ModelProto, list[str], set[str]]:
    """Rewrite every STFT and DFT of the main graph (in place) into plain ops with a constant
    basis. `infer` is a lenient shape inference (a function of a model); `weights` holds the
    values split_weights took out of the graph, and receives the bases (each also a typed graph
    input, as split_weights leaves weights). Returns (the model, notes for the pass log, the
    names of the Conv and MatMul nodes made: they stay float32 at every precision, as
    torch.autocast keeps stft and fft in float32; Graph.float32_nodes)."""
    if not has_spectral(model):
        return model, [], set()
    # Shapes come from an inferred copy; the model itself is rewritten, so that what onnx
    # inferred downstream of a transform (a rank-2 STFT's wrong bins, also in the graph's
    # output types) is not kept.
    shapes = _shapes_and_types(infer(model).graph)
    g = model.graph
    consts = _constants(g, weights, path)
    taken = _all_names(g)
    out: list[onnx.NodeProto] = []
    notes: list[str] = []
    products: set[str] = set()
    for k, node in enumerate(g.node):
        if node.op_type not in ("STFT", "DFT") or node.domain not in ("", "ai.onnx"):
            out.append(node)
            continue
        label = node.name or node.output[0]
        prefix = _prefix(node, k, taken)
        taken.add(prefix)
        lower = _stft if node.op_type == "STFT" else _dft
        node, head, tail = _in_float32(node, prefix, shapes, consts, label)
        nodes, basis, note = lower(node, label, prefix, shapes, consts, opset_of(model), path)
        nodes = head + nodes + tail
        out += nodes
        products.update(n.name for n in nodes if n.op_type in ("Conv", "MatMul"))
        weights[basis.name] = numpy_helper.to_array(basis)
        g.input.append(helper.make_tensor_value_info(basis.name, basis.data_type, list(basis.dims)))
        notes.append(f"import: {node.op_type} {label!r}: {note}")
    del g.node[:]
    g.node.extend(out)
    del g.value_info[:]  # the caller infers the rewritten graph afresh
    return model, notes, products


def _in_float32(node, prefix: str, shapes: dict, consts: dict, label: str):
    """A transform of float16 or bfloat16 values, as one of float32 values between Casts: (the
    node reading Casts of its computed float inputs and writing a float32 output, the Casts
    before it, the Cast after it). Why: a half model computes in float32 (frontend.promote_half,
    and verify's widened reference), and a basis made in the half type was rounded to it, which
    put a bfloat16 DFT a bfloat16 ulp off at fp32 (the bf16-model fuzz run, graph 920117). At a
    half precision the products stay float32 anyway (Graph.float32_nodes)."""
    elem = (shapes.get(node.input[0]) or (None, None))[1]
    if elem not in HALF_TYPES:
        return node, [], []
    wide = onnx.NodeProto()
    wide.CopyFrom(node)
    head = []
    for i, name in enumerate(node.input):
        if name and name not in consts and (shapes.get(name) or (None, None))[1] in HALF_TYPES:
            wide.input[i] = f"{prefix}wide_in{i}"
            shapes[wide.input[i]] = (shapes[name][0], onnx.TensorProto.FLOAT)
            head.append(helper.make_node("Cast", [name], [wide.input[i]], name=f"{label}/widen_{i}",
                                         to=onnx.TensorProto.FLOAT))
    wide.output[0] = f"{prefix}wide_out"
    tail = [helper.make_node("Cast", [wide.output[0]], [node.output[0]], name=f"{label}/narrow", to=elem)]
    return wide, head, tail


def _stft(node, label, prefix, shapes, consts, opset, path):
    """STFT(signal [B, N] | [B, N, 1] | [B, N, 2], frame_step, window?, frame_length?) →
    Conv(signal as [B, C, N], basis [2·bins, C, L], stride = step) → [B, 2·bins, F] →
    Reshape [B, 2, bins, F] → Transpose → [B, F, bins, 2]."""
    inputs = list(node.input) + [""] * (4 - len(node.input))
    signal, step_name, window_name, length_name = inputs[:4]
    shape, elem = _shape(signal, shapes, label, path)
    if len(shape) not in (2, 3) or (len(shape) == 3 and shape[2] not in (1, 2)):
        raise ModelError(f"{path}: STFT {label!r}: its signal has shape {_fmt(shape)}; STFT takes [batch, samples], "
                         f"[batch, samples, 1] (real) or [batch, samples, 2] (complex)")
    complex_in = len(shape) == 3 and shape[2] == 2
    step = _scalar_int(step_name, "frame_step", consts, label, path)
    window, runtime_window, wlen = None, False, None
    if window_name:
        # A constant window is folded into the basis; one computed at run time multiplies it there.
        if window_name in consts:
            window = np.asarray(consts[window_name], dtype=np.float64)
            wshape = window.shape
        else:
            runtime_window = True
            wshape = _shape(window_name, shapes, label, path)[0]
        if len(wshape) != 1:
            raise ModelError(f"{path}: STFT {label!r}: its window has shape {_fmt(wshape)}, not one dimension")
        wlen = wshape[0]
    length = _scalar_int(length_name, "frame_length", consts, label, path) if length_name else None
    if wlen is not None and length is not None and length != wlen:
        raise ModelError(f"{path}: STFT {label!r}: frame_length {length} differs from the window's length {wlen}")
    n = shape[1]
    length = length if length is not None else (wlen if wlen is not None else n)
    if window is None:
        window = np.ones(length)
    if step < 1 or length < 1 or length > n:
        raise ModelError(f"{path}: STFT {label!r}: frame_step {step} and frame_length {length} do not fit a signal of "
                         f"{n} samples")
    onesided = _attr(node, "onesided", 1)
    if onesided and complex_in:
        raise ModelError(f"{path}: STFT {label!r}: a complex signal has no onesided transform (set onesided=0)")
    bins = length // 2 + 1 if onesided else length
    channels = 2 if complex_in else 1
    _check_size(2 * bins * channels * length, "STFT", label, path)
    # basis[p·bins + k, c, n]: output part p (0 real, 1 imaginary) of bin k, from input part c.
    cos, sin = _angles(np.arange(bins), np.arange(length), length)
    basis = np.zeros((2, bins, channels, length))
    basis[0, :, 0], basis[1, :, 0] = cos * window, -sin * window
    if complex_in:
        basis[0, :, 1], basis[1, :, 1] = sin * window, cos * window
    basis_t = numpy_helper.from_array(basis.reshape(2 * bins, channels, length).astype(_np_type(elem, label, path)),
                                      f"{prefix}basis")
    x = f"{prefix}x"
    nodes = _to_channels(signal, x, shape, prefix, label)
    weight = basis_t.name
    if runtime_window:
        nodes.append(_const_node(f"{prefix}window_shape", np.array([1, 1, length], np.int64), label))
        nodes.append(helper.make_node("Reshape", [window_name, f"{prefix}window_shape"], [f"{prefix}window"],
                                      name=f"{label}/window"))
        nodes.append(helper.make_node("Mul", [basis_t.name, f"{prefix}window"], [f"{prefix}windowed"],
                                      name=f"{label}/windowed"))
        weight = f"{prefix}windowed"
    conv = f"{prefix}conv"
    nodes.append(helper.make_node("Conv", [x, weight], [conv], name=f"{label}/conv", strides=[step],
                                  kernel_shape=[length]))
    split, shp = f"{prefix}split", f"{prefix}split_shape"
    nodes.append(_const_node(shp, np.array([0, 2, bins, -1], np.int64), label))
    nodes.append(helper.make_node("Reshape", [conv, shp], [split], name=f"{label}/split"))
    nodes.append(helper.make_node("Transpose", [split], [node.output[0]], name=f"{label}/frames_last", perm=[0, 3, 2, 1]))
    frames = (n - length) // step + 1
    note = (f"a strided Conv against a {2 * bins}x{channels}x{length} Fourier basis ({frames} frames of {length}, "
            f"hop {step}, {bins} bins)")
    return nodes, basis_t, note


def _dft(node, label, prefix, shapes, consts, opset, path):
    """DFT(input [..., N, C], dft_length?, axis?) → (the axis moved next to the last) →
    Reshape [..., N·C] → MatMul basis [N·C, K·P] → Reshape [..., K, P] → (axis moved back)."""
    inputs = list(node.input) + [""] * (3 - len(node.input))
    shape, elem = _shape(inputs[0], shapes, label, path)
    r = len(shape)
    if r < 2 or shape[-1] not in (1, 2):
        raise ModelError(f"{path}: DFT {label!r}: its input has shape {_fmt(shape)}; its last dimension must be 1 (real) "
                         f"or 2 (complex)")
    if opset >= 20:
        axis = _scalar_int(inputs[2], "axis", consts, label, path) if inputs[2] else -2
    else:
        axis = _attr(node, "axis", 1)
    if not (-r <= axis <= -2 or 0 <= axis <= r - 2):
        raise ModelError(f"{path}: DFT {label!r}: axis {axis} is outside [-{r}, -2] and [0, {r - 2}] for rank {r}")
    axis %= r
    inverse, onesided = _attr(node, "inverse", 0), _attr(node, "onesided", 0)
    n, channels = shape[axis], shape[-1]
    irfft = bool(onesided and inverse)
    if onesided and not inverse and channels != 1:
        raise ModelError(f"{path}: DFT {label!r}: a onesided forward transform takes a real input ([..., 1]), not a "
                         f"complex one")
    if irfft and channels != 2:
        raise ModelError(f"{path}: DFT {label!r}: a onesided inverse transform takes a complex input ([..., 2])")
    default = 2 * (n - 1) if irfft else n
    length = _scalar_int(inputs[1], "dft_length", consts, label, path) if inputs[1] else default
    if length < 1:
        raise ModelError(f"{path}: DFT {label!r}: dft_length {length} is not positive")
    if irfft:
        out_len, parts = length, 1
    else:
        out_len, parts = (length // 2 + 1 if onesided else length), 2
    _check_size(n * channels * out_len * parts, "DFT", label, path)
    basis = _dft_basis(n, channels, length, out_len, parts, inverse, irfft).astype(_np_type(elem, label, path))
    basis_t = numpy_helper.from_array(basis, f"{prefix}basis")
    # The transformed axis goes next to the complex one, where one MatMul reaches it.
    perm = [d for d in range(r - 1) if d != axis] + [axis, r - 1]
    moved = perm != list(range(r))
    nodes, x = [], inputs[0]
    if moved:
        nodes.append(helper.make_node("Transpose", [x], [f"{prefix}moved"], name=f"{label}/axis_last", perm=perm))
        x = f"{prefix}moved"
    keep = [0] * (r - 2)  # Reshape's 0 copies a dimension: the leading ones stay as they are
    nodes.append(_const_node(f"{prefix}flat_shape", np.array(keep + [n * channels], np.int64), label))
    nodes.append(helper.make_node("Reshape", [x, f"{prefix}flat_shape"], [f"{prefix}flat"], name=f"{label}/flatten"))
    nodes.append(helper.make_node("MatMul", [f"{prefix}flat", basis_t.name], [f"{prefix}prod"], name=f"{label}/matmul"))
    nodes.append(_const_node(f"{prefix}out_shape", np.array(keep + [out_len, parts], np.int64), label))
    last = f"{prefix}unmoved" if moved else node.output[0]
    nodes.append(helper.make_node("Reshape", [f"{prefix}prod", f"{prefix}out_shape"], [last], name=f"{label}/unflatten"))
    if moved:
        back = [perm.index(d) for d in range(r)]
        nodes.append(helper.make_node("Transpose", [last], [node.output[0]], name=f"{label}/axis_back", perm=back))
    kind = "irfft" if irfft else ("rfft" if onesided else ("inverse DFT" if inverse else "DFT"))
    note = f"a MatMul against a {n * channels}x{out_len * parts} Fourier basis ({kind} of length {length} on axis {axis})"
    return nodes, basis_t, note


def _dft_basis(n, channels, length, out_len, parts, inverse, irfft) -> np.ndarray:
    """[n·channels, out_len·parts]: row (m, c) is input sample m's part c, column (k, p) output
    k's part p. Samples past `length` are dropped (zero rows); samples short of it are the zero
    padding (absent rows)."""
    used = min(n, length)
    basis = np.zeros((n, channels, out_len, parts))
    m = np.arange(used)
    if irfft:
        # A real signal from the half spectrum X[0..length/2]: x[j] = (1/len) Σ_k c_k (Re X_k cos θ
        # − Im X_k sin θ), c_k = 2 except for k = 0 and the Nyquist bin (where sin θ = 0, so
        # their imaginary parts are ignored, as numpy's and torch's irfft ignore them).
        cos, sin = _angles(m, np.arange(out_len), length)  # [used, out_len]: input bin m, output sample j
        weight = np.where((m == 0) | (2 * m == length), 1.0, 2.0)[:, None]
        weight = np.where(m[:, None] <= length // 2, weight, 0.0)
        basis[:used, 0, :, 0] = weight * cos / length
        basis[:used, 1, :, 0] = -weight * sin / length
        return basis.reshape(n * channels, out_len)
    cos, sin = _angles(m, np.arange(out_len), length)  # [used, out_len]
    sign = 1.0 if inverse else -1.0  # e^{sign·iθ}
    scale = 1.0 / length if inverse else 1.0
    # (a + ib)(cos θ + i·sign·sin θ) = (a cos θ − sign·b sin θ) + i(sign·a sin θ + b cos θ)
    basis[:used, 0, :, 0] = cos * scale
    basis[:used, 0, :, 1] = sign * sin * scale
    if channels == 2:
        basis[:used, 1, :, 0] = -sign * sin * scale
        basis[:used, 1, :, 1] = cos * scale
    return basis.reshape(n * channels, out_len * parts)


def _angles(a: np.ndarray, b: np.ndarray, period: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of 2π·a·b/period over the outer product, with a·b reduced mod period first
    (exact in int64), so a long transform's angles keep float64's accuracy."""
    theta = 2 * np.pi * (np.multiply.outer(a.astype(np.int64), b.astype(np.int64)) % period) / period
    return np.cos(theta), np.sin(theta)


def _to_channels(signal: str, out: str, shape: tuple, prefix: str, label: str) -> list[onnx.NodeProto]:
    """[B, N] → [B, 1, N]; [B, N, C] → [B, C, N]: the layout a 1-D Conv reads."""
    if len(shape) == 2:
        return [_const_node(f"{prefix}chan_axis", np.array([1], np.int64), label),
                helper.make_node("Unsqueeze", [signal, f"{prefix}chan_axis"], [out], name=f"{label}/channels")]
    return [helper.make_node("Transpose", [signal], [out], name=f"{label}/channels", perm=[0, 2, 1])]


def _shape(name, shapes, label, path) -> tuple[tuple[int, ...], int]:
    got = shapes.get(name)
    if got is None or got[0] is None or any(d is None for d in got[0]):
        raise ShapeError(f"{path}: {label!r} transforms {name!r}, whose shape is not static here; bind the model's "
                         f"dynamic dims with --shape NAME=DIMS")
    return got


def _scalar_int(name, what, consts, label, path) -> int:
    if name not in consts:
        raise ModelError(f"{path}: {label!r}: its {what} {name!r} is computed at run time; dlcc needs it constant "
                         f"(it sets the shapes)")
    v = np.asarray(consts[name])
    if v.size != 1 or not np.issubdtype(v.dtype, np.integer):
        raise ModelError(f"{path}: {label!r}: its {what} is {v.dtype} of shape {_fmt(v.shape)}, not one integer")
    return int(v.reshape(()))


def _check_size(elements: int, op: str, label: str, path) -> None:
    if elements > MAX_BASIS_ELEMENTS:
        raise ModelError(f"{path}: {op} {label!r}: dlcc computes it as a product with a Fourier basis of "
                         f"{elements:,} values, above its limit of {MAX_BASIS_ELEMENTS:,} (a transform this long "
                         f"needs an FFT kernel, which dlcc does not have)")


def _np_type(elem: int, label: str, path):
    if elem not in _DTYPES:
        raise ModelError(f"{path}: {label!r}: a Fourier transform of {onnx.TensorProto.DataType.Name(elem)} values")
    return _DTYPES[elem]


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((int(helper.get_attribute_value(a)) for a in node.attribute if a.name == name), default)


def _const_node(name: str, value: np.ndarray, label: str) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=f"{label}/{name}", value=numpy_helper.from_array(value, name))


def _constants(g: onnx.GraphProto, weights: dict, path="model") -> dict[str, np.ndarray]:
    """Every initializer, split-out weight and Constant value; one whose data does not match its
    dims is a ModelError naming it (frontend.tensor_value)."""
    vals = {t.name: tensor_value(t, path) for t in g.initializer}
    vals.update(weights)
    for n in g.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            for a in n.attribute:
                if a.name == "value":
                    vals[n.output[0]] = tensor_value(a.t, path, "Constant")
    return vals


def _shapes_and_types(g: onnx.GraphProto) -> dict[str, tuple[tuple | None, int]]:
    out = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        t = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if t is None:
            continue
        dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim) if t.HasField("shape") else None
        out[vi.name] = (dims, t.elem_type)
    for t in g.initializer:
        out[t.name] = (tuple(t.dims), t.data_type)
    return out


def _fmt(shape) -> str:
    return "x".join(str(d) for d in shape) or "scalar"
