"""The ONNX LSTM op, unrolled: one GEMM for every step's input projection, then per step a GEMM
for the recurrent projection and one elementwise kernel for the gates and states.

The per-step kernels take the step index as an argument, so each text is emitted once and
launched `seq` times — exactly the many-small-kernels pattern Rammer later co-schedules.
"""
from __future__ import annotations

import numpy as np

from ..kernels.gemm import GemmSpec, emit_gemm
from ..kernels.map import BLOCK
from .registry import COMPUTE, register

_DEFAULT_ACTS = ["Sigmoid", "Tanh", "Tanh"]


@register("LSTM", since=7, category=COMPUTE, float_only=True)
def _lstm(ctx, node):
    ins = list(node.inputs) + [""] * (8 - len(node.inputs))
    X, W, R, Bn, seq_lens, h0, c0, P = ins[:8]
    outs = list(node.outputs) + [""] * (3 - len(node.outputs))
    Y, Yh, Yc = outs[:3]
    if ctx.attr("layout", 0) != 0:
        raise ctx.fail("layout=1 (batch-major) is not supported")
    if ctx.attr("input_forget", 0):
        raise ctx.fail("input_forget=1 is not supported")
    if P:
        raise ctx.fail("peephole weights (input P) are not supported")
    direction = ctx.attr("direction", "forward")
    D = 2 if direction == "bidirectional" else 1
    acts = ctx.attr("activations", None)
    if acts is not None:
        acts = [a.decode() if isinstance(a, bytes) else a for a in acts]
        if acts != _DEFAULT_ACTS * D:
            raise ctx.fail(f"activations {acts} are not supported (only the default Sigmoid/Tanh/Tanh)")
    seq, batch, I = ctx.shape(X)
    H = ctx.attr("hidden_size", ctx.shape(R)[-1])
    if seq_lens:
        sl = ctx.const(seq_lens)
        if sl is None or not np.all(sl == seq):
            raise ctx.fail("sequence_lens other than the full length for every batch entry are not supported")
    clip = ctx.attr("clip", None)
    G4 = 4 * H

    # 1. Input projection for all steps and directions: XW[d] = X · W[d]^T + Wb[d] + Rb[d].
    xw = ctx.temp((D, seq * batch, G4))
    bias_term = f" + Bz[bt * {2 * G4} + n] + Bz[bt * {2 * G4} + {G4} + n]" if Bn else ""
    params = ["GPTR const float* X", "GPTR const float* W"] + (["GPTR const float* Bz"] if Bn else []) + ["GPTR float* Y"]
    spec = GemmSpec(
        batch=D, M=seq * batch, N=G4, K=I, params=params,
        load_a=lambda m, k: ([], f"X[{m} * {I} + {k}]"),
        load_b=lambda k, n: ([], f"W[bt * {G4 * I} + {n} * {I} + {k}]"),
        store=lambda m, n, acc: [f"Y[(bt * {seq * batch} + {m}) * {G4} + {n}] = {acc}{bias_term};"],
        b_n_contiguous=False,
    )
    gin = [X, W] + ([Bn] if Bn else [])
    emit_gemm(ctx, "LSTMInput", spec, gin + [xw], reads=gin, writes=[xw])

    # 2. State buffers (the Y_h / Y_c outputs themselves when requested), initialised once.
    hs = Yh or ctx.temp((D, batch, H))
    cs = Yc or ctx.temp((D, batch, H))
    y = Y or ctx.temp((seq, D, batch, H))
    n_state = D * batch * H
    for state, init in ((hs, h0), (cs, c0)):
        _init_state(ctx, state, init, n_state)

    # 3. Per step: HR = Hs · R^T (all directions at once), then the gate kernel.
    hr = ctx.temp((D, batch, G4))
    rspec = GemmSpec(
        batch=D, M=batch, N=G4, K=H,
        params=["GPTR const float* Hs", "GPTR const float* Rw", "GPTR float* Y"],
        load_a=lambda m, k: ([], f"Hs[(bt * {batch} + {m}) * {H} + {k}]"),
        load_b=lambda k, n: ([], f"Rw[bt * {G4 * H} + {n} * {H} + {k}]"),
        store=lambda m, n, acc: [f"Y[(bt * {batch} + {m}) * {G4} + {n}] = {acc};"],
        b_n_contiguous=False,
    )
    clip_s = (lambda v: f"F_MIN(F_MAX({v}, {-float(clip)}f), {float(clip)}f)") if clip else (lambda v: v)
    tt = {"forward": "t", "reverse": f"({seq - 1} - t)", "bidirectional": f"(d == 0 ? t : {seq - 1} - t)"}[direction]
    lines = [
        "const int i = BLOCK_ID * BLOCK_DIM + THREAD_ID;",
        f"if (i < {n_state}) {{",
        f"    const int j = i % {H}, b = (i / {H}) % {batch}, d = i / {H * batch};",
        f"    const int tt = {tt};",
        f"    const int xr = (d * {seq * batch} + tt * {batch} + b) * {G4} + j;",
        f"    const int hr = (d * {batch} + b) * {G4} + j;",
        f"    const float gi = {clip_s('XW[xr] + HR[hr]')};",
        f"    const float go = {clip_s(f'XW[xr + {H}] + HR[hr + {H}]')};",
        f"    const float gf = {clip_s(f'XW[xr + {2 * H}] + HR[hr + {2 * H}]')};",
        f"    const float gc = {clip_s(f'XW[xr + {3 * H}] + HR[hr + {3 * H}]')};",
        "    const float it = 1.0f / (1.0f + F_EXP(-gi));",
        "    const float ot = 1.0f / (1.0f + F_EXP(-go));",
        "    const float ft = 1.0f / (1.0f + F_EXP(-gf));",
        "    const float c = ft * Cs[i] + it * F_TANH(gc);",
        "    const float h = ot * F_TANH(c);",
        "    Cs[i] = c;",
        "    Hs[i] = h;",
        f"    Y[((tt * {D} + d) * {batch} + b) * {H} + j] = h;",
        "}",
    ]

    def make(name):
        return (f"KERNEL void {name}(GPTR const float* XW, GPTR const float* HR, GPTR float* Hs, GPTR float* Cs, "
                f"GPTR float* Y, const int t) {{\n    " + "\n    ".join(lines) + "\n}\n")

    step = ctx.program.add_kernel("LSTMCell", make, BLOCK, kind="map", pass_name=ctx.pass_name)
    for t in range(seq):
        emit_gemm(ctx, "LSTMRecurrent", rspec, [hs, R, hr], reads=[hs, R], writes=[hr])
        ctx.launch(step, -(-n_state // BLOCK), [xw, hr, hs, cs, y, t], reads=[xw, hr, hs, cs], writes=[hs, cs, y],
                   flops=20 * n_state, dram_bytes=4 * n_state * (8 + 4 + 1), category="elementwise")


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

    k = ctx.program.add_kernel("LSTMInit", make, BLOCK, kind="map", pass_name=ctx.pass_name)
    ctx.launch(k, -(-n // BLOCK), args, reads=reads, writes=[state], category="elementwise")
