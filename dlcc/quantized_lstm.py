"""com.microsoft's DynamicQuantizeLSTM, unrolled into the steps onnxruntime takes with int8
weights (quantized.py's rewrite of one node; its DynamicQuantizeLinear and MatMulInteger nodes are
rewritten by the next round there). Kept apart from quantized.py because it is the one op that
becomes a program of its own: a step per time step and direction."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from .quantized import _F, _Builder, _Later


def dynamic_quantize_lstm(b: _Builder) -> None:
    """com.microsoft's DynamicQuantizeLSTM (what quantize_dynamic makes of an LSTM), unrolled
    into the steps onnxruntime's UniDirectionalLstm takes with int8 weights:

    - X·W for every step at once: X [seq·batch, input] quantized as DynamicQuantizeLinear does
      (one scale over all of X), an exact integer product with W [input, 4·hidden], times
      x_scale·w_scale;
    - then per step: h_{t−1} [batch, hidden] quantized the same way (its own scale each step;
      the initial state's zeros give scale 1), an exact product with R, times h_scale·r_scale,
      added to the step's X·W; plus Wb + Rb; gates i, o, f, c in ONNX's order, sigmoid, tanh,
      tanh, optional clip and peepholes.

    The DynamicQuantizeLinear and MatMulInteger nodes written here are rewritten by the next
    round. Needs: static X, constant weights, scales and zero points, the default activations,
    input_forget 0.

    sequence_lens (constant, or an input: torch's packed sequences) as onnxruntime applies them:
    entry b runs len[b] steps, a step past it keeps h and c and writes 0 to Y. The reverse
    direction runs each entry's first len[b] steps reversed (ReverseSequence on X·W, whose rows
    are only permuted, so X's one quantization scale is the same), and its Y is reversed back.
    X's scale covers the first max(len) steps only, as onnxruntime's X·W does.

    The step's h is quantized as onnxruntime quantizes it. It splits the batch across its
    threads when it has more than 4 rows, or 2 or more with a hidden size of at most 256
    (UniDirectionalLstm::SetNumThreads), and quantizes each thread's rows together. Where it does
    not split, all of h shares one scale, here too. Where it splits, the answer depends on its
    thread count; here each sequence's h is quantized on its own, which is its answer with a
    thread per sequence, and a sequence's outputs then do not depend on the rest of its batch."""
    x, w, r, bias, lens, h0, c0, peep, w_s, w_zp, r_s, r_zp = (b.input(i) for i in range(12))
    shape = b.info.get(x, (None, None))[0]
    if shape is None or len(shape) != 3 or any(d is None for d in shape):
        # (An LSTM before it may still have to be unrolled for its shape to be known.)
        raise _Later(b.fail(f"needs X of a static [seq, batch, input] shape, not {shape}; bind its dims with --shape"))
    seq, batch, width = shape
    hidden = int(b.attrs.get("hidden_size", 0))
    direction = b.attrs.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else str(direction)
    dirs = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}.get(direction)
    consts = {k: b.const(v) for k, v in (("W", w), ("R", r), ("W_scale", w_s), ("W_zero_point", w_zp),
                                           ("R_scale", r_s), ("R_zero_point", r_zp))}
    missing = [k for k, v in consts.items() if v is None]
    acts = [a.decode().lower() if isinstance(a, bytes) else str(a).lower() for a in b.attrs.get("activations", [])]
    lens_v = b.const(lens) if lens else None
    lens_shape = lens_v.shape if lens_v is not None else b.info.get(lens, (None, None))[0] if lens else None
    why = ("an unknown direction" if dirs is None else f"{', '.join(missing)} computed at run time" if missing
           else "activations other than sigmoid, tanh, tanh" if acts and acts != ["sigmoid", "tanh", "tanh"] * len(dirs)
           else "input_forget" if int(b.attrs.get("input_forget", 0))
           else f"sequence_lens of shape {'unknown' if lens_shape is None else list(lens_shape)}, not [{batch}]"
           if lens and (lens_shape is None or tuple(lens_shape) != (batch,))
           else f"sequence_lens {lens_v.tolist()} outside 1..{seq} (the sequence's length)"
           if lens_v is not None and (np.any(lens_v < 1) or np.any(lens_v > seq))
           else "" if hidden > 0 and consts["W"].shape == (len(dirs), width, 4 * hidden) else "W's shape does not fit")
    if why:
        raise b.fail(f"{why} is not supported")
    clip = float(b.attrs["clip"]) if "clip" in b.attrs else None
    cb, cp = b.const(bias) if bias else None, b.const(peep) if peep else None
    if (bias and cb is None) or (peep and cp is None):
        raise b.fail("a bias or peephole computed at run time is not supported")

    def per_dir(v: np.ndarray, d: int) -> np.ndarray:
        return v[d] if v.ndim >= 1 and v.shape[0] == len(dirs) else v

    def state(name: str, d: int) -> str:
        if not name:
            return b.constant(np.zeros((batch, hidden), np.float32))
        return b.op("Gather", [b.as_float(name), b.constant(np.int64(d), np.int64)], axis=0)

    lo, hi = (b.constant(np.float32(-clip)), b.constant(np.float32(clip))) if clip is not None else ("", "")

    def gate(v: str, k: int, peephole: int | None = None, c_: str = "") -> str:
        """Gate k of [i, o, f, c]: plus c_·P[peephole] (P holds i, o, f), plus Wb + Rb, clipped."""
        if cp is not None and peephole is not None:
            v = b.op("Add", [v, b.op("Mul", [c_, b.constant(cp[d, peephole * hidden:(peephole + 1) * hidden].astype(np.float32))])])
        if cb is not None:
            v = b.op("Add", [v, b.constant(cb[d, k * hidden:(k + 1) * hidden].astype(np.float32)
                                           + cb[d, (4 + k) * hidden:(5 + k) * hidden].astype(np.float32))])
        return b.op("Clip", [v, lo, hi]) if clip is not None else v

    # One scale for the whole batch's h per step, as onnxruntime has when it does not split the
    # batch across its threads (UniDirectionalLstm::SetNumThreads); else one per sequence.
    joint = batch == 1 or (batch <= 4 and hidden > 256)
    wants_y = bool(b.node.output[0]) if b.node.output else False
    # Entries that stop early: their lengths as int64 [batch, 1], to mask each step against.
    short = bool(lens) and (lens_v is None or bool(np.any(lens_v != seq)))
    lens64 = b.op("Cast", [lens], to=onnx.TensorProto.INT64) if short else ""
    stops = b.op("Reshape", [lens64, b.constant(np.array([batch, 1], np.int64), np.int64)]) if short else ""

    def masked(t: int, new: str, old: str) -> str:
        """`new` for the entries still running at step t, `old` for those past their length."""
        return b.op("Where", [b.op("Less", [b.constant(np.int64(t), np.int64), stops]), new, old])

    def reversed_in_length(v: str) -> str:
        return b.op("ReverseSequence", [v, lens64], batch_axis=1, time_axis=0)

    xf = b.as_float(x)
    if short:
        # onnxruntime's X·W covers the first max(sequence_lens) steps only, so what follows is
        # not in X's quantization range: zeroed, it is not (the range holds 0 anyway), and no
        # step reads it (every entry has stopped). Each entry's reversal stays within those steps.
        if lens_v is None:
            steps = b.constant(np.arange(seq, dtype=np.int64).reshape(seq, 1, 1), np.int64)
            xf = b.op("Where", [b.op("Less", [steps, b.op("ReduceMax", [lens64], keepdims=1)]), xf,
                                b.constant(np.float32(0))])
        elif int(lens_v.max()) < seq:
            xf = b.op("Where", [b.constant((np.arange(seq) < int(lens_v.max())).reshape(seq, 1, 1), np.bool_), xf,
                                b.constant(np.float32(0))])
    x2 = b.op("Reshape", [xf, b.constant(np.array([seq * batch, width], np.int64), np.int64)])
    zeros = b.constant(np.zeros((batch, hidden), np.float32)) if short else ""
    ys, hs, cs = [], [], []
    split = b.constant(np.full(4, hidden, np.int64), np.int64)
    for d, backward in enumerate(dirs):
        wq = b.constant(consts["W"][d], consts["W"].dtype)
        rq = b.constant(consts["R"][d], consts["R"].dtype)
        wz = b.constant(per_dir(consts["W_zero_point"], d), consts["W_zero_point"].dtype)
        rz = b.constant(per_dir(consts["R_zero_point"], d), consts["R_zero_point"].dtype)
        xw = _dynamic_product(b, x2, wq, wz, per_dir(consts["W_scale"], d))
        xw = b.op("Reshape", [xw, b.constant(np.array([seq, batch, 4 * hidden], np.int64), np.int64)])
        if short and backward:  # each entry's steps in its own reverse order, then run forward
            xw = reversed_in_length(xw)
        h, c = state(h0, d), state(c0, d)
        read = h  # what the next step's product reads: h, or with Y asked for, the step's Y
        outs: dict[int, str] = {}
        for t in (range(seq - 1, -1, -1) if backward and not short else range(seq)):
            xt = b.op("Gather", [xw, b.constant(np.int64(t), np.int64)], axis=0)
            if joint:
                hr = _dynamic_product(b, read, rq, rz, per_dir(consts["R_scale"], d))
            else:  # each sequence's h quantized on its own (the docstring says why)
                hr = _dynamic_product_rows(b, read, batch, rq, rz, per_dir(consts["R_scale"], d))
            g = b.op("Add", [xt, hr])
            gi, go, gf, gc = (b.fresh(k) for k in "iofc")
            b.nodes.append(helper.make_node("Split", [g, split] if b.opset >= 13 else [g], [gi, go, gf, gc],
                                            name=f"{b.label}/{gi[len(b.prefix):]}", axis=1,
                                            **({} if b.opset >= 13 else {"split": [hidden] * 4})))
            # GateComputations' order per gate: + c·P (P holds i, o, f; i and f read the previous
            # c, o the new one), + Wb + Rb, clipped, activated; then h = tanh(c)·o, c unclipped.
            i_ = b.op("Sigmoid", [gate(gi, 0, 0, c)])
            f_ = b.op("Sigmoid", [gate(gf, 2, 2, c)])
            c_new = b.op("Add", [b.op("Mul", [c, f_]), b.op("Mul", [i_, b.op("Tanh", [gate(gc, 3)])])])
            o_ = b.op("Sigmoid", [gate(go, 1, 1, c_new)])
            h_new = b.op("Mul", [b.op("Tanh", [c_new]), o_])
            b.note(h_new, (batch, hidden), _F)
            if short:
                h, c, outs[t] = masked(t, h_new, h), masked(t, c_new, c), masked(t, h_new, zeros)
                # (onnxruntime's next product reads the rows it wrote: Y's, where a stopped entry
                # has 0, else the final state's, where it keeps its h; this matters only to a
                # scale that all rows share)
                read = outs[t] if joint and wants_y else h
            else:
                h, c, outs[t] = h_new, c_new, h_new
                read = h
        y = b.op("Concat", [outs[t] for t in range(seq)], axis=0)  # [seq·batch, hidden], in time order
        if short and backward:
            shape3 = b.constant(np.array([seq, batch, hidden], np.int64), np.int64)
            y = b.op("Reshape", [reversed_in_length(b.op("Reshape", [y, shape3])),
                                 b.constant(np.array([seq * batch, hidden], np.int64), np.int64)])
        ys.append(y)
        hs.append(h)
        cs.append(c)
    out = list(b.node.output) + ["", "", ""]
    if out[0]:
        parts = [b.op("Reshape", [y, b.constant(np.array([seq, 1, batch, hidden], np.int64), np.int64)]) for y in ys]
        b.op("Concat", parts, out[0], axis=1)
    for name, finals in ((out[1], hs), (out[2], cs)):
        if name:
            b.op("Concat", [b.op("Unsqueeze", [f, b.constant(np.array([0], np.int64), np.int64)]) if b.opset >= 13
                            else b.op("Unsqueeze", [f], axes=[0]) for f in finals], name, axis=0)


def _dynamic_product(b: _Builder, a: str, wq: str, wz: str, w_scale: np.ndarray) -> str:
    """onnxruntime's quantized ComputeGemm: `a` (float) quantized as DynamicQuantizeLinear does,
    an int32 product with the int8 weight, times a_scale · w_scale (float32, in that order)."""
    q, s, z = _quantize(b, a)
    return _scaled_product(b, q, z, s, wq, wz, w_scale)


def _dynamic_product_rows(b: _Builder, a: str, rows: int, wq: str, wz: str, w_scale: np.ndarray) -> str:
    """`_dynamic_product` of each row of `a` [rows, k] quantized on its own, as one integer
    product: MatMulInteger takes a zero point per row of A, and row r's float32 arithmetic is the
    same as a product of that row alone (an exact int32 product, times s_r · w_scale). Why not a
    product per row: a GEMM of M=1 per sequence per step, and its nodes, made an unrolled
    LSTM's graph grow by a third for every sequence in the batch."""
    one = b.constant(np.array([1], np.int64), np.int64)
    qs, ss, zs = zip(*(_quantize(b, b.op("Gather", [a, b.constant(np.array([r], np.int64), np.int64)], axis=0))
                       for r in range(rows)))
    z = b.op("Concat", [b.op("Reshape", [v, one]) for v in zs], axis=0)
    s = b.op("Reshape", [b.op("Concat", [b.op("Reshape", [v, one]) for v in ss], axis=0),
                         b.constant(np.array([rows, 1], np.int64), np.int64)])
    return _scaled_product(b, b.op("Concat", list(qs), axis=0), z, s, wq, wz, w_scale)


def _quantize(b: _Builder, a: str) -> tuple[str, str, str]:
    """A DynamicQuantizeLinear node of `a`: its (q, scale, zero point)."""
    q, s, z = b.fresh("q"), b.fresh("s"), b.fresh("z")
    b.nodes.append(helper.make_node("DynamicQuantizeLinear", [a], [q, s, z], name=f"{b.label}/{q[len(b.prefix):]}"))
    return q, s, z


def _scaled_product(b: _Builder, q: str, z: str, s: str, wq: str, wz: str, w_scale: np.ndarray) -> str:
    """float32(MatMulInteger(q, wq, z, wz)) · (s · w_scale)."""
    acc = b.op("MatMulInteger", [q, wq, z, wz])
    scale = b.op("Mul", [s, b.constant(np.asarray(w_scale, np.float32))])
    return b.op("Mul", [b.op("Cast", [acc], to=_F), scale])
