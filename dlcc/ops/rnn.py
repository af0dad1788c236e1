"""The ONNX LSTM, GRU and RNN ops, unrolled: one GEMM for every step's input projection, then per step
a GEMM for the recurrent projection and an elementwise kernel for the gates and states.

The per-step kernels take the step index as an argument, so each text is emitted once and
launched `seq` times — exactly the many-small-kernels pattern Rammer later co-schedules.
All directions of a bidirectional layer run in the same launches (the GEMM batch is the
direction), the reverse direction reading step `seq - 1 - t`.

With the lower option `rnn_input: per-step` (or `auto`, on a GPU device for one direction) an LSTM computes each step's input projection inside
that step's GEMM instead (K = input + hidden: [x_t, h] · [W; R]^T), so step t of layer l needs
only step t of layer l-1, not its whole sequence. Every per-step launch records the time step it
touches (Launch.regions), so rammer's dependency analysis sees cell (l, t) wait only for (l, t-1)
and (l-1, t): the layers x time wavefront of Rammer's LSTM-TC case. The batched projection stays
the default: one large GEMM beats `seq` small ones when each launch costs a kernel of its own.

`sequence_lens` shorter than the sequence (torch's packed sequences: the lengths of a padded
batch, known only at run time) are read by every step kernel, as onnxruntime applies them: batch
entry b runs len[b] steps; the reverse direction starts at position len[b] - 1; a step past
len[b] keeps the state and writes zeros to Y; so Y_h (and Y_c) are each entry's last live state.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..kernels.gemm import GemmSpec, emit_gemm
from ..kernels.map import BLOCK
from ..kernels.program import literal
from .registry import COMPUTE, register


@dataclass
class Rnn:
    D: int  # directions
    seq: int
    batch: int
    I: int  # input size
    H: int  # hidden size
    direction: str
    clip: float | None
    acts: list[list] = field(default_factory=list)  # per direction, the op's activation functions
    lens: str = ""  # the sequence_lens tensor where entries may stop early ("" where every entry runs `seq`)

    def act(self, k: int, x: str) -> str:
        """C expression: activation function `k` of the op (LSTM's f, g, h; GRU's f, g; RNN's f)
        applied to `x`, choosing by direction where the directions' functions differ."""
        texts = [fns[k](x) for fns in self.acts]
        return texts[0] if len(set(texts)) == 1 else f"(d == 0 ? {texts[0]} : {texts[1]})"

    @property
    def n_state(self) -> int:
        return self.D * self.batch * self.H

    def step_index(self) -> str:
        """C expression: the sequence position direction `d` processes at step `t` (with lengths,
        at a live step: the reverse direction starts from the entry's `len - 1`)."""
        last = "(len - 1)" if self.lens else self.seq - 1
        return {"forward": "t", "reverse": f"({last} - t)", "bidirectional": f"(d == 0 ? t : {last} - t)"}[self.direction]

    def clipped(self, v: str) -> str:
        if not self.clip:
            return v
        return f"F_MIN(F_MAX({v}, {literal(-self.clip)}), {literal(self.clip)})"


def _rnn_attrs(ctx, node, default_acts: list[str]) -> Rnn:
    """The attributes every recurrent op shares; `default_acts`: the op's activation functions
    when the node names none (one direction's)."""
    X, R = node.inputs[0], node.inputs[2]
    if ctx.attr("layout", 0) != 0:  # (composite.py writes batch-major layers time-major first)
        raise ctx.fail("layout=1 (batch-major) is not supported")
    direction = ctx.attr("direction", "forward")
    D = 2 if direction == "bidirectional" else 1
    acts = _activation_functions(ctx, default_acts, D)
    seq, batch, I = ctx.shape(X)
    seq_lens = node.inputs[4] if len(node.inputs) > 4 else ""
    lens = ""
    if seq_lens:
        if tuple(ctx.shape(seq_lens)) != (batch,):
            raise ctx.fail(f"sequence_lens is {list(ctx.shape(seq_lens))}, not [{batch}] (one length per batch entry)")
        sl = ctx.const(seq_lens)
        if sl is not None and (np.any(sl < 1) or np.any(sl > seq)):
            raise ctx.fail(f"sequence_lens {sl.tolist()} must lie in 1..{seq} (the sequence's length)")
        if sl is None or not np.all(sl == seq):
            lens = seq_lens
    H = ctx.attr("hidden_size", ctx.shape(R)[-1])
    clip = ctx.attr("clip", None)
    return Rnn(D, seq, batch, I, H, direction, float(clip) if clip else None, acts, lens)


#: The activation functions the recurrent ops take (the RNN, GRU and LSTM schemas' list), by
#: lower-case name: whether each takes alpha and beta, and its C expression of x. onnxruntime's
#: forms (rnn_activation_functors.h): ThresholdedRelu keeps x > alpha, Softplus is log(1 + e^x).
_ACTIVATIONS = {
    "relu": (False, False, lambda x, a, b: f"F_MAX({x}, 0.0f)"),
    "tanh": (False, False, lambda x, a, b: f"F_TANH({x})"),
    "sigmoid": (False, False, lambda x, a, b: f"1.0f / (1.0f + F_EXP(-({x})))"),
    "affine": (True, True, lambda x, a, b: f"({a} * ({x}) + {b})"),
    "leakyrelu": (True, False, lambda x, a, b: f"(({x}) >= 0.0f ? ({x}) : {a} * ({x}))"),
    "thresholdedrelu": (True, False, lambda x, a, b: f"(({x}) > {a} ? ({x}) : 0.0f)"),
    "scaledtanh": (True, True, lambda x, a, b: f"({a} * F_TANH({b} * ({x})))"),
    "hardsigmoid": (True, True, lambda x, a, b: f"F_MIN(F_MAX({a} * ({x}) + {b}, 0.0f), 1.0f)"),
    "elu": (True, False, lambda x, a, b: f"(({x}) >= 0.0f ? ({x}) : {a} * (F_EXP({x}) - 1.0f))"),
    "softsign": (False, False, lambda x, a, b: f"(({x}) / (1.0f + F_FABS({x})))"),
    "softplus": (False, False, lambda x, a, b: f"F_LOG(1.0f + F_EXP({x}))"),
}
#: alpha and beta where activation_alpha / activation_beta run out: onnxruntime's defaults
#: (rnn_helpers.cc), 0 for the functions not listed.
_ACTIVATION_DEFAULTS = {"leakyrelu": (0.01, 0.0), "hardsigmoid": (0.2, 0.5), "elu": (1.0, 0.0)}


def _activation_functions(ctx, defaults: list[str], D: int) -> list[list]:
    """Per direction, the node's activation functions as builders of C expressions. The names
    run forward's then reverse's; alpha and beta are taken from activation_alpha and
    activation_beta in that order by the functions that use them, as onnxruntime reads them."""
    raw = ctx.attr("activations", None)
    names = [a.decode() if isinstance(a, bytes) else a for a in raw] if raw is not None else defaults * D
    n = len(defaults)
    if len(names) == 2 * n and D == 1 and raw is not None and n == 1:
        names = names[:1]  # (the RNN schema's default lists two; one direction takes the first)
    if len(names) != n * D:
        raise ctx.fail(f"activations {names}: {n * D} expected, {n} per direction")
    unknown = sorted({a for a in names if a.lower() not in _ACTIVATIONS})
    if unknown:
        raise ctx.fail(f"activations {unknown} are not recurrent activation functions "
                       f"(one of {', '.join(_ACTIVATIONS)}, in any case)")
    alphas, betas = list(ctx.attr("activation_alpha", None) or []), list(ctx.attr("activation_beta", None) or [])
    fns = []
    for name in names:
        takes_a, takes_b, make = _ACTIVATIONS[name.lower()]
        da, db = _ACTIVATION_DEFAULTS.get(name.lower(), (0.0, 0.0))
        a = (alphas.pop(0) if alphas else da) if takes_a else 0.0
        b = (betas.pop(0) if betas else db) if takes_b else 0.0
        fns.append(lambda x, make=make, a=literal(float(a)), b=literal(float(b)): make(x, a, b))
    return [fns[d * n:(d + 1) * n] for d in range(D)]


def _input_projection(ctx, r: Rnn, X: str, W: str, B: str, gates: int, rb_cols: int, hint: str) -> str:
    """XW[d] = X · W[d]^T + Wb[d] (+ Rb[d] on the first `rb_cols` columns), for all steps at once."""
    G = gates * r.H
    xw = ctx.temp((r.D, r.seq * r.batch, G))
    if B:
        bias = f" + Bz[bt * {2 * G} + n]"
        if rb_cols:
            bias += f" + (n < {rb_cols} ? Bz[bt * {2 * G} + {G} + n] : 0.0f)" if rb_cols < G else f" + Bz[bt * {2 * G} + {G} + n]"
    else:
        bias = ""
    params = ["GPTR const float* X", "GPTR const float* W"] + (["GPTR const float* Bz"] if B else []) + ["GPTR float* Y"]
    spec = GemmSpec(
        batch=r.D, M=r.seq * r.batch, N=G, K=r.I, params=params,
        load_a=lambda m, k: ([], f"X[{m} * {r.I} + {k}]"),
        load_b=lambda k, n: ([], f"W[bt * {G * r.I} + {n} * {r.I} + {k}]"),
        store=lambda m, n, acc: [f"Y[(bt * {r.seq * r.batch} + {m}) * {G} + {n}] = {acc}{bias};"],
        b_n_contiguous=False,
    )
    ins = [X, W] + ([B] if B else [])
    emit_gemm(ctx, hint, spec, ins + [xw], reads=ins, writes=[xw])
    return xw


def _recurrent_spec(r: Rnn, gates_total: int, row0: int, rows: int) -> GemmSpec:
    """Out[d] = S[d] · R[d][row0:row0+rows]^T for every direction d (the GEMM batch)."""
    G, H = gates_total * r.H, r.H
    return GemmSpec(
        batch=r.D, M=r.batch, N=rows, K=H, params=["GPTR const float* S", "GPTR const float* Rw", "GPTR float* Y"],
        load_a=lambda m, k: ([], f"S[(bt * {r.batch} + {m}) * {H} + {k}]"),
        load_b=lambda k, n: ([], f"Rw[bt * {G * H} + ({row0} + {n}) * {H} + {k}]"),
        store=lambda m, n, acc: [f"Y[(bt * {r.batch} + {m}) * {rows} + {n}] = {acc};"],
        b_n_contiguous=False,
    )


def _step_kernel(ctx, hint: str, params: str, body: list[str], r: Rnn, gates: int, writes_y: bool = False) -> str:
    """A per-step elementwise kernel over (direction, batch, hidden unit), with index helpers.
    With `writes_y`, the body's new state `h` is also this step's output: Y[yi] = h after it.
    With sequence lengths (r.lens) it takes them as its first parameter `SL`: a step past an
    entry's length runs none of `body`, and writes 0 to Y[yi] where the step writes Y."""
    body = body + (["Y[yi] = h;"] if writes_y else [])
    if r.lens:
        head = [f"const int sl = SL[b], len = sl < 0 ? 0 : (sl > {r.seq} ? {r.seq} : sl);",
                "const int live = t < len;",
                f"const int tt = live ? {r.step_index()} : t;"]
        tail = ["if (live) {", *["    " + s for s in body], "}"]
        if writes_y:
            tail += ["else {", "    Y[yi] = 0.0f;", "}"]
        params = "GPTR const int* SL, " + params
    else:
        head, tail = [f"const int tt = {r.step_index()};"], body
    lines = [
        "const int i = BLOCK_ID * BLOCK_DIM + THREAD_ID;",
        f"if (i < {r.n_state}) {{",
        f"    const int j = i % {r.H}, b = (i / {r.H}) % {r.batch}, d = i / {r.H * r.batch};",
        *["    " + s for s in head],
        f"    const int xr = (d * {r.seq * r.batch} + tt * {r.batch} + b) * {gates * r.H} + j;",
        f"    const int yi = ((tt * {r.D} + d) * {r.batch} + b) * {r.H} + j;",
        *["    " + s for s in tail],
        "}",
    ]

    def make(name):
        return f"KERNEL void {name}({params}, const int t) {{\n    " + "\n    ".join(lines) + "\n}\n"

    return ctx.program.add_kernel(hint, make, BLOCK, kind="map", pass_name=ctx.pass_name)


@register("LSTM", since=7, category=COMPUTE, float_only=True)
def _lstm(ctx, node):
    ins = list(node.inputs) + [""] * (8 - len(node.inputs))
    X, W, R, Bn, _, h0, c0, P = ins[:8]
    outs = list(node.outputs) + [""] * (3 - len(node.outputs))
    Y, Yh, Yc = outs[:3]
    r = _rnn_attrs(ctx, node, ["Sigmoid", "Tanh", "Tanh"])
    H, G4 = r.H, 4 * r.H
    if P and tuple(ctx.shape(P)) != (r.D, 3 * H):
        raise ctx.fail(f"the peephole weights P are {list(ctx.shape(P))}, not [{r.D}, {3 * H}] (directions, 3 x hidden)")
    forget = bool(ctx.attr("input_forget", 0))
    mode = getattr(ctx, "rnn_input", "batched")
    if mode == "auto":  # per step where it buys a wavefront: one direction, on a GPU (rammer joins it there)
        mode = "per-step" if r.D == 1 and getattr(ctx.device, "kind", "gpu") == "gpu" else "batched"
    if r.lens:  # (each entry's own position: the per-step GEMM reads one position for the whole batch)
        mode = "batched"
    if mode == "per-step":
        return _lstm_per_step(ctx, r, X, W, R, Bn, h0, c0, P, forget, Y, Yh, Yc)

    # 1. Input projection for all steps and directions (both biases folded in).
    xw = _input_projection(ctx, r, X, W, Bn, 4, G4, "LSTMInput")
    # 2. State buffers (the Y_h / Y_c outputs themselves when requested), initialised once.
    hs = Yh or ctx.temp((r.D, r.batch, H))
    cs = Yc or ctx.temp((r.D, r.batch, H))
    y = Y or ctx.temp((r.seq, r.D, r.batch, H))
    for state, init in ((hs, h0), (cs, c0)):
        _init_state(ctx, state, init, r.n_state)
    # 3. Per step: HR = Hs · R^T (all directions at once), then the gate kernel (gate order i, o, f, c).
    hr = ctx.temp((r.D, r.batch, G4))
    rspec = _recurrent_spec(r, 4, 0, G4)
    pre = [f"XW[xr + {k * H}] + HR[hr + {k * H}]" for k in range(4)]
    step = _step_kernel(ctx, "LSTMCell", "GPTR const float* XW, GPTR const float* HR, "
                        + ("GPTR const float* P, " if P else "") + "GPTR float* Hs, GPTR float* Cs, GPTR float* Y",
                        _lstm_cell(r, pre, bool(P), forget), r, 4, writes_y=True)
    peep = [P] if P else []
    for t in range(r.seq):
        emit_gemm(ctx, "LSTMRecurrent", rspec, [hs, R, hr], reads=[hs, R], writes=[hr])
        ctx.launch(step, -(-r.n_state // BLOCK), _sl(r) + [xw, hr] + peep + [hs, cs, y, t],
                   reads=_sl(r) + [xw, hr, hs, cs] + peep,
                   writes=[hs, cs, y], flops=20 * r.n_state, dram_bytes=4 * r.n_state * 13, category="elementwise")
        ctx.program.launches[-1].regions.update(_step_regions(r, t, {y: r.D * r.batch * H, xw: r.batch * G4}))


def _lstm_cell(r: Rnn, pre: list[str], peephole: bool, input_forget: bool) -> list[str]:
    """The LSTM cell update for unit i from its four gates' pre-activations `pre` (order i, o, f,
    c), with the op's activations f, g and h. As onnxruntime computes it: a peephole term P ⊙ C is
    added before the clip, the previous cell's to the input and forget gates and the new cell's
    to the output gate; with input_forget the forget gate is 1 - i."""
    H = r.H

    def gate(k: int, cell: str) -> str:
        peep = f" + P[d * {3 * H} + {k * H} + j] * {cell}" if peephole else ""
        return r.act(0, r.clipped(pre[k] + peep))

    return [
        f"const int hr = (d * {r.batch} + b) * {4 * H} + j;",
        "const float cp = Cs[i];",
        f"const float it = {gate(0, 'cp')};",
        f"const float ft = {'1.0f - it' if input_forget else gate(2, 'cp')};",
        f"const float c = ft * cp + it * {r.act(1, r.clipped(pre[3]))};",
        f"const float ot = {gate(1, 'c')};",
        f"const float h = ot * {r.act(2, 'c')};",
        "Cs[i] = c;",
        "Hs[i] = h;",
    ]


def _step_regions(r: Rnn, t: int, per_step: dict[str, int]) -> dict:
    """Byte ranges of sequence buffers laid out step-major ([seq, ...], `per_step` floats a step)
    that step t touches. Only for one direction: a bidirectional step touches t and seq-1-t, and
    with sequence lengths a reverse step's position is the entry's own."""
    if r.D != 1 or r.lens:
        return {}
    pos = t if r.direction == "forward" else r.seq - 1 - t
    return {name: (4 * n * pos, 4 * n * (pos + 1)) for name, n in per_step.items()}


def _lstm_per_step(ctx, r: Rnn, X, W, R, Bn, h0, c0, P, forget: bool, Y, Yh, Yc) -> None:
    """The LSTM with each step's input projection in its own GEMM ([x_t, h] · [W; R]^T); see the
    module docstring. Two launches per step, both tagged with the step they touch."""
    H, G4, I, B = r.H, 4 * r.H, r.I, r.batch
    hs = Yh or ctx.temp((r.D, B, H))
    cs = Yc or ctx.temp((r.D, B, H))
    y = Y or ctx.temp((r.seq, r.D, B, H))
    for state, init in ((hs, h0), (cs, c0)):
        _init_state(ctx, state, init, r.n_state)
    gates = ctx.temp((r.D, B, G4))
    tt = r.step_index().replace("d == 0", "bt == 0")  # the GEMM batch is the direction
    spec = GemmSpec(
        batch=r.D, M=B, N=G4, K=I + H,
        params=["GPTR const float* X", "GPTR const float* S", "GPTR const float* W", "GPTR const float* Rw",
                "GPTR float* Y", "const int t"],
        load_a=lambda m, k: ([], f"(({k}) < {I} ? X[({tt} * {B} + {m}) * {I} + ({k})] "
                                 f": S[(bt * {B} + {m}) * {H} + ({k}) - {I}])"),
        load_b=lambda k, n: ([], f"(({k}) < {I} ? W[bt * {G4 * I} + ({n}) * {I} + ({k})] "
                                 f": Rw[bt * {G4 * H} + ({n}) * {H} + ({k}) - {I}])"),
        store=lambda m, n, acc: [f"Y[(bt * {B} + {m}) * {G4} + {n}] = {acc};"],
        b_n_contiguous=False,
    )
    bias = (lambda k: f" + Bz[d * {2 * G4} + {k * H} + j] + Bz[d * {2 * G4} + {G4 + k * H} + j]") if Bn \
        else (lambda k: "")
    pre = [f"HR[hr + {k * H}]{bias(k)}" for k in range(4)]
    step = _step_kernel(ctx, "LSTMStepCell", "GPTR const float* HR, " + ("GPTR const float* Bz, " if Bn else "")
                        + ("GPTR const float* P, " if P else "") + "GPTR float* Hs, GPTR float* Cs, GPTR float* Y",
                        _lstm_cell(r, pre, bool(P), forget), r, 4, writes_y=True)
    peep = [P] if P else []
    for t in range(r.seq):
        emit_gemm(ctx, "LSTMStep", spec, [X, hs, W, R, gates, t], reads=[X, hs, W, R], writes=[gates])
        gemm = ctx.program.launches[-1]
        gemm.expr = None  # an opaque rOperator for AStitch: its loads switch between two tensors
        gemm.regions.update(_step_regions(r, t, {X: B * I}))  # (a split GEMM has its counters there)
        ctx.launch(step, -(-r.n_state // BLOCK), [gates] + ([Bn] if Bn else []) + peep + [hs, cs, y, t],
                   reads=[gates, hs, cs] + ([Bn] if Bn else []) + peep, writes=[hs, cs, y], flops=20 * r.n_state,
                   dram_bytes=4 * r.n_state * 9, category="elementwise")
        ctx.program.launches[-1].regions.update(_step_regions(r, t, {y: r.D * B * H}))


@register("GRU", since=7, category=COMPUTE, float_only=True)
def _gru(ctx, node):
    """GRU (gate order z, r, h). PyTorch exports linear_before_reset=1: h~ = tanh(XWh + r ⊙ (H·Rh +
    Rbh)), one recurrent GEMM per step. With linear_before_reset=0, h~ = tanh(XWh + (r ⊙ H)·Rh + Rbh)
    needs r first, so each step is GEMM(z, r) → gates → GEMM(h) → update."""
    ins = list(node.inputs) + [""] * (6 - len(node.inputs))
    X, W, R, Bn, _, h0 = ins[:6]
    outs = list(node.outputs) + [""] * (2 - len(node.outputs))
    Y, Yh = outs[:2]
    r = _rnn_attrs(ctx, node, ["Sigmoid", "Tanh"])
    H, G3 = r.H, 3 * r.H
    lbr = ctx.attr("linear_before_reset", 0)
    # Rb joins the input projection for z and r always, and for h unless it must sit inside r ⊙ (...).
    xw = _input_projection(ctx, r, X, W, Bn, 3, 2 * H if lbr else G3, "GRUInput")
    hs = Yh or ctx.temp((r.D, r.batch, H))
    y = Y or ctx.temp((r.seq, r.D, r.batch, H))
    _init_state(ctx, hs, h0, r.n_state)
    z = lambda hr: r.clipped(f"XW[xr] + {hr}")  # noqa: E731
    rg = lambda hr: r.clipped(f"XW[xr + {H}] + {hr}")  # noqa: E731
    if lbr:
        hr = ctx.temp((r.D, r.batch, G3))
        rspec = _recurrent_spec(r, 3, 0, G3)
        bias_rows = ""
        if Bn:  # Rbh is added inside the reset product: add it to HR's h part in the kernel
            bias_rows = f" + Bz[d * {2 * G3} + {G3 + 2 * H} + j]"
        step = _step_kernel(ctx, "GRUCell", "GPTR const float* XW, GPTR const float* HR, "
                            + ("GPTR const float* Bz, " if Bn else "") + "GPTR float* Hs, GPTR float* Y", [
                                f"const int hr = (d * {r.batch} + b) * {G3} + j;",
                                f"const float zt = {r.act(0, z('HR[hr]'))};",
                                f"const float rt = {r.act(0, rg(f'HR[hr + {H}]'))};",
                                f"const float nt = {r.act(1, r.clipped(f'XW[xr + {2 * H}] + rt * (HR[hr + {2 * H}]{bias_rows})'))};",
                                "const float h = (1.0f - zt) * nt + zt * Hs[i];",
                                "Hs[i] = h;",
                            ], r, 3, writes_y=True)
        for t in range(r.seq):
            emit_gemm(ctx, "GRURecurrent", rspec, [hs, R, hr], reads=[hs, R], writes=[hr])
            args = _sl(r) + [xw, hr] + ([Bn] if Bn else []) + [hs, y, t]
            ctx.launch(step, -(-r.n_state // BLOCK), args, reads=_sl(r) + [xw, hr, hs] + ([Bn] if Bn else []),
                       writes=[hs, y], flops=15 * r.n_state, dram_bytes=4 * r.n_state * 10, category="elementwise")
        return
    hzr = ctx.temp((r.D, r.batch, 2 * H))
    rh = ctx.temp((r.D, r.batch, H))
    zbuf = ctx.temp((r.D, r.batch, H))
    hh = ctx.temp((r.D, r.batch, H))
    spec_zr = _recurrent_spec(r, 3, 0, 2 * H)
    spec_h = _recurrent_spec(r, 3, 2 * H, H)
    gates = _step_kernel(ctx, "GRUGates", "GPTR const float* XW, GPTR const float* HR, GPTR const float* Hs, "
                         "GPTR float* Z, GPTR float* RH", [
                             f"const int hr = (d * {r.batch} + b) * {2 * H} + j;",
                             f"Z[i] = {r.act(0, z('HR[hr]'))};",
                             f"RH[i] = {r.act(0, rg(f'HR[hr + {H}]'))} * Hs[i];",
                         ], r, 3)
    update = _step_kernel(ctx, "GRUUpdate", "GPTR const float* XW, GPTR const float* HH, GPTR const float* Z, "
                          "GPTR float* Hs, GPTR float* Y", [
                              f"const float nt = {r.act(1, r.clipped(f'XW[xr + {2 * H}] + HH[i]'))};",
                              "const float h = (1.0f - Z[i]) * nt + Z[i] * Hs[i];",
                              "Hs[i] = h;",
                          ], r, 3, writes_y=True)
    grid = -(-r.n_state // BLOCK)
    for t in range(r.seq):
        emit_gemm(ctx, "GRURecurrentZR", spec_zr, [hs, R, hzr], reads=[hs, R], writes=[hzr])
        ctx.launch(gates, grid, _sl(r) + [xw, hzr, hs, zbuf, rh, t], reads=_sl(r) + [xw, hzr, hs], writes=[zbuf, rh],
                   flops=10 * r.n_state, category="elementwise")
        emit_gemm(ctx, "GRURecurrentH", spec_h, [rh, R, hh], reads=[rh, R], writes=[hh])
        ctx.launch(update, grid, _sl(r) + [xw, hh, zbuf, hs, y, t], reads=_sl(r) + [xw, hh, zbuf, hs], writes=[hs, y],
                   flops=8 * r.n_state, category="elementwise")


@register("RNN", since=7, category=COMPUTE, float_only=True)
def _rnn(ctx, node):
    """The simple (Elman) RNN, as torch.nn.RNN exports it: h = f(X·W^T + Wb + H·R^T + Rb) per step,
    f one activation per direction. One recurrent GEMM and one elementwise kernel a step, like
    LSTM and GRU."""
    ins = list(node.inputs) + [""] * (6 - len(node.inputs))
    X, W, R, Bn, _, h0 = ins[:6]
    outs = list(node.outputs) + [""] * (2 - len(node.outputs))
    Y, Yh = outs[:2]
    r = _rnn_attrs(ctx, node, ["Tanh"])
    H = r.H
    xw = _input_projection(ctx, r, X, W, Bn, 1, H, "RNNInput")  # both biases folded in
    hs = Yh or ctx.temp((r.D, r.batch, H))
    y = Y or ctx.temp((r.seq, r.D, r.batch, H))
    _init_state(ctx, hs, h0, r.n_state)
    value = r.act(0, r.clipped("XW[xr] + HR[hr]"))
    hr = ctx.temp((r.D, r.batch, H))
    rspec = _recurrent_spec(r, 1, 0, H)
    step = _step_kernel(ctx, "RNNCell", "GPTR const float* XW, GPTR const float* HR, GPTR float* Hs, GPTR float* Y", [
        f"const int hr = (d * {r.batch} + b) * {H} + j;",
        f"const float h = {value};",
        "Hs[i] = h;",
    ], r, 1, writes_y=True)
    for t in range(r.seq):
        emit_gemm(ctx, "RNNRecurrent", rspec, [hs, R, hr], reads=[hs, R], writes=[hr])
        ctx.launch(step, -(-r.n_state // BLOCK), _sl(r) + [xw, hr, hs, y, t], reads=_sl(r) + [xw, hr, hs], writes=[hs, y],
                   flops=4 * r.n_state, dram_bytes=4 * r.n_state * 5, category="elementwise")
        ctx.program.launches[-1].regions.update(_step_regions(r, t, {y: r.D * r.batch * H, xw: r.batch * H}))


def _sl(r: Rnn) -> list[str]:
    """The sequence_lens tensor, as the first argument and read of every step kernel that takes it."""
    return [r.lens] if r.lens else []


def _init_state(ctx, state: str, init: str, n: int) -> None:
    if init:
        body = "y[i] = x[i];"
        params = "GPTR const float* x, GPTR float* y"
        args, reads = [init, state], [init]
    else:
        body = "y[i] = 0.0f;"
        params = "GPTR float* y"
        args, reads = [state], []

    def make(name):
        return (f"KERNEL void {name}({params}) {{\n    const int i = BLOCK_ID * BLOCK_DIM + THREAD_ID;\n"
                f"    if (i < {n}) {body}\n}}\n")

    k = ctx.program.add_kernel("RNNInit", make, BLOCK, kind="map", pass_name=ctx.pass_name)
    ctx.launch(k, -(-n // BLOCK), args, reads=reads, writes=[state], category="elementwise")
