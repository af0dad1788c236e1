"""Writing stitched kernels and fused rOperators in the portable dialect (one text, both preludes).

Every inlined (Local) node becomes an *element function*: `DEVICE T KNAME_efN(params, ctx, i)`
returns the node's value at flat index i, reading its inputs through further element functions,
the block's shared memory (Regional) or global memory. Names are derived from the kernel's own
name, so two kernels in one translation unit never collide; ONNX names never appear.
"""
from __future__ import annotations

import re

from ...kernels.gemm import GemmSpec, gemm_source
from ...kernels.map import MapView, prune_defs, unravel
from ...kernels.program import FLOAT_LOAD_MACROS, ctype, literal, load_float, store_float, value_ctype
from ...kernels.reduce import COMBINE, ReduceLayout, accumulate_init, accumulate_step
from .nodes import FLOATS
from .planner import BLOCK, Phase, Stitch

PD, PA = "@PD@", "@PA@"  # parameter declarations / arguments, filled in once all are known
PL = "@PL@"  # the same declarations as a kernel's own parameter list (no trailing comma)


def smem_value(dtype: str, val: str) -> str:
    """A value of `dtype` as the float that shared memory holds (nodes.SMEM_DTYPES): an int32
    as its bits (a reduction's float result made an int first, as its global store does), a
    bool or 8-bit integer converted (exact)."""
    if dtype in FLOATS:
        return val
    return f"AS_FLOAT((unsigned int)(int)({val}))" if dtype == "int32" else f"(float)({val})"


def smem_load(dtype: str, slot: str) -> str:
    """The value of `dtype` that shared memory's float `slot` holds (smem_value's inverse)."""
    if dtype in FLOATS:
        return slot
    return f"((int)AS_UINT({slot}))" if dtype == "int32" else f"(({ctype(dtype)})({slot}))"


class _View(MapView):
    def __init__(self, node, reader):
        n = len(node.in_shapes)
        super().__init__([f"o{j}" for j in range(len(node.out_shape))], "i", tuple(node.out_shape), list(node.in_shapes),
                         [f"x{k}" for k in range(n)], list(node.in_literals))
        self.reader = reader

    def _load(self, k, index):
        return self.reader(k, index)


class Builder:
    """Parameters, element functions and reads for one kernel."""

    def __init__(self, ng, planner, inline: set[int], ctx_decl: str = "", ctx_args: str = ""):
        self.ng, self.pl, self.inline = ng, planner, inline
        self.ctx_decl, self.ctx_args = ctx_decl, ctx_args
        self.params: dict[str, str] = {}  # tensor -> param name
        self.written: set[str] = set()
        self.funcs: list[str] = []
        self.fn: dict[tuple, str] = {}
        self.smem: dict[str, tuple[int, int]] = {}  # tensor -> (offset, per_unit) in the current phase
        self.phase = 0
        self.known: dict[str, str] = {}  # tensor -> local holding its value at the current index

    def param(self, t: str, write: bool = False) -> str:
        if t not in self.params:
            self.params[t] = f"ga{len(self.params)}"
        if write:
            self.written.add(t)
        return self.params[t]

    def read(self, t: str, idx: str) -> str:
        if t in self.known:
            return self.known[t]
        p = self.ng.producer.get(t)
        if p is not None and p in self.inline:
            return f"{self.value_fn(p)}({PA}{self.ctx_args}{idx})"
        if t in self.smem:
            off, per = self.smem[t]
            return smem_load(self.ng.tensor(t).dtype, f"sm[{off} + slot * {per} + (({idx}) - u * {per})]")
        return load_float(self.ng.tensor(t).dtype, self.param(t), idx)

    def body_value(self, node, index_var: str = "i") -> tuple[list[str], str]:
        """(statements, value) of map node `node` at flat index `index_var`."""
        v = _View(node, lambda k, idx: self.read(node.inputs[k], idx))
        coords, unr = unravel(index_var, node.out_shape, "o")
        v.o, v.i = coords, index_var
        stmts, expr = node.body(v)
        lines = list(stmts)
        return prune_defs(unr, "\n".join(lines) + "\n" + expr) + lines, expr

    def value_fn(self, nid: int) -> str:
        """The element function computing node `nid` from its inputs (in the current phase)."""
        key = (nid, self.phase, tuple(sorted(self.smem)))
        if key in self.fn:
            return self.fn[key]
        # Numbered in order of first use, not by node id, so that two stitches of the same structure
        # (every layer of a transformer) have the same text and are emitted and compiled once.
        name = f"KNAME_ef{len(self.fn)}"
        self.fn[key] = name
        node = self.ng.nodes[nid]
        stmts, expr = self.body_value(node)
        T = value_ctype(self.ng.tensor(node.output).dtype)
        inner = "\n    ".join(stmts)
        self.funcs.append(f"DEVICE {T} {name}({PD}{self.ctx_decl}const int i) {{\n    {inner}\n    return ({T})({expr});\n}}\n")
        return name

    def finish(self, text: str, extra_params: list[str] | None = None) -> tuple[str, list[str]]:
        """Fill in the parameter lists; returns (text, tensors in parameter order)."""
        order = list(self.params)
        decl = []
        for t in order:
            T = ctype(self.ng.tensor(t).dtype)
            decl.append(f"GPTR {T}* {self.params[t]}" if t in self.written else f"GPTR const {T}* {self.params[t]}")
        pd = "".join(d + ", " for d in decl)
        pa = "".join(self.params[t] + ", " for t in order)
        text = "\n".join(self.funcs) + "\n" + text
        return text.replace(PD, pd).replace(PA, pa).replace(PL, ", ".join(decl)), order


# --------------------------------------------------------------------------------------------
def stitch_source(ng, planner, st: Stitch) -> tuple[str, list[str], int]:
    """(kernel text with KNAME placeholders, tensor args in order, shared bytes) of one stitch."""
    b = Builder(ng, planner, st.inlined, ctx_decl="LPTR float* sm, const int u, const int slot, ",
                ctx_args="sm, u, slot, ")
    smem_floats = max([ph.smem_floats for ph in st.phases] + [1])
    has_red = any(ng.nodes[s.node].kind == "reduce" and ph.tpr > 1 for ph in st.phases for s in ph.stages)
    body = [f"SHARED float sm[{smem_floats}];"]
    if has_red:
        body.append(f"SHARED float red[{BLOCK}];")
    body.append("const int tid = THREAD_ID;")
    for pi, ph in enumerate(st.phases):
        b.phase = pi
        b.smem = {}
        if ph.grid_barrier:
            body.append("dlcc_grid_sync(dsync + syncoff);")
        body += _phase_code(ng, b, ph, once=not st.spin)
    sync = ", GPTR int* dsync, const int syncoff" if st.spin else ""
    bounds = f" LAUNCH_BOUNDS({BLOCK})" if st.spin else ""
    text = "KERNEL void" + bounds + " KNAME(" + PL + sync + ") {\n    " + "\n    ".join(body) + "\n}\n"
    text, order = b.finish(text)
    return text, order, 4 * (smem_floats + (BLOCK if has_red else 0))


def _phase_code(ng, b: Builder, ph: Phase, once: bool) -> list[str]:
    """A phase: its stages, run by each block for its units.

    `once`: the grid covers every unit (a kernel without grid barriers is launched with one block
    per P units), so each block takes one turn, written as a block, not a loop. A kernel with grid
    barriers loops, since the runtime may clamp its grid to the blocks it proves resident: turn
    `it` of block b takes units (b + it·GRID_DIM)·P onwards, and the turn count depends on the grid
    only, so it is the same in every block and every work-item.

    Both forms keep PoCL 3.1 from miscompiling the barriers of this code (its work-item loops
    lose stores when barriers sit in a loop whose condition reads the block index, and in loops
    around inner loops that its vectorizer rewrites; tests/test_pocl_miscompiles.py holds the
    minimal kernels, and backends/opencl.py turns that vectorizer off)."""
    P, T = ph.per_block, ph.tpr
    head = f"    const int slot = tid / {T}, lt = tid % {T};"
    blocks = -(-ph.U // P)
    loop = (f"    {{ const int u0 = BLOCK_ID * {P};" if once else
            f"    for (int it = 0; it < ({blocks} + GRID_DIM - 1) / GRID_DIM; ++it) {{ "
            f"const int u0 = (BLOCK_ID + it * GRID_DIM) * {P};")
    out = ["{",
           head,
           loop,
           "        const int u = u0 + slot;",
           f"        const int act = u < {ph.U};"]
    for si, s in enumerate(ph.stages):
        n = ng.nodes[s.node]
        lines = _map_stage(ng, b, ph, s, n) if n.kind == "map" else _reduce_stage(ng, b, ph, s, n)
        out += ["        " + x for x in lines]
        if s.barrier:
            out.append("        BARRIER();")
        if s.smem:
            b.smem[n.output] = (s.smem_off, s.per_unit)
    out += ["    }", "}"]
    return out


def _store(ng, b: Builder, s, n, idx: str, local: str, val: str) -> list[str]:
    lines = []
    if s.smem:
        lines.append(f"sm[{s.smem_off} + slot * {s.per_unit} + {local}] = {smem_value(ng.tensor(n.output).dtype, val)};")
    if s.glob:
        lines.append(store_float(ng.tensor(n.output).dtype, b.param(n.output, write=True), idx, val))
    return lines


def _map_stage(ng, b, ph, s, n) -> list[str]:
    size = ng.size(n.output)
    T = value_ctype(ng.tensor(n.output).dtype)
    stmts, expr = b.body_value(n, "i")
    return [f"for (int j = lt; j < {s.per_unit}; j += {ph.tpr}) {{",
            f"    const int i = u * {s.per_unit} + j;",
            f"    if (act && i < {size}) {{",
            *["        " + x for x in stmts],
            f"        const {T} val = ({T})({expr});",
            *["        " + x for x in _store(ng, b, s, n, "i", "j", "val")],
            "    }",
            "}"]


def _reduce_stage(ng, b, ph, s, n) -> list[str]:
    red = n.red
    lay = ReduceLayout(red.shape, red.axes)
    bst, base = lay.base("o")
    ost, off = lay.offset("r")
    post = red.post.replace("R_F", _lit(lay.R))
    x = n.inputs[0]
    T = ph.tpr
    lines = [f"for (int q = 0; q < {s.per_unit}; ++q) {{",
             f"    const int o = u * {s.per_unit} + q;",
             *["    " + z for z in accumulate_init(red.op)],
             "    if (act) {",
             *["        " + z for z in bst],
             f"        const int base = {base};",
             f"        for (int r = lt; r < {lay.R}; r += {T}) {{",
             *["            " + z for z in ost],
             f"            const float v = (float)({b.read(x, f'base + {off}')});",
             *["            " + z for z in accumulate_step(red.op, red.pre)],
             "        }",
             "    }"]
    if T > 1:
        c = COMBINE[red.op].format(a="red[tid]", b="red[tid + s]")
        lines += ["    red[tid] = acc;", "    BARRIER();",
                  f"    for (int s = {T // 2}; s > 0; s >>= 1) {{",
                  f"        if (lt < s) red[tid] = {c};",
                  "        BARRIER();", "    }",
                  f"    acc = red[slot * {T}];", "    BARRIER();"]
    lines += ["    if (act && lt == 0) {",
              f"        const float res = {post};",
              *["        " + z for z in _store(ng, b, s, n, "o", "q", "res")],
              "    }", "}"]
    return lines


def _lit(v) -> str:
    return literal(float(v))


# --------------------------------------------------------------------------------------------
def _subst_loads(text: str, name: str, repl) -> str:
    """Replace every load of `name` in generated text by repl(expr): `name[expr]`, and
    `LOAD_F16(name, expr)` / `LOAD_BF16(name, expr)` for 16-bit storage."""
    for macro in FLOAT_LOAD_MACROS:
        text = _subst_bracketed(text, f"{macro}({name}, ", "()", repl)
    return _subst_bracketed(text, name + "[", "[]", repl)


def _subst_bracketed(text: str, key: str, pair: str, repl) -> str:
    """Replace every `key expr CLOSE` (key ends with the opening bracket of `pair`; brackets
    balanced; `key` not preceded by an identifier character) by repl(expr)."""
    out, i = [], 0
    while True:
        j = text.find(key, i)
        if j < 0:
            out.append(text[i:])
            return "".join(out)
        if j > 0 and (text[j - 1].isalnum() or text[j - 1] == "_"):
            out.append(text[i:j + len(key)])
            i = j + len(key)
            continue
        depth, k = 1, j + len(key)
        while depth:
            depth += {pair[0]: 1, pair[1]: -1}.get(text[k], 0)
            k += 1
        out.append(text[i:j])
        out.append(repl(text[j + len(key):k - 1]))
        i = k


def gemm_source_fused(ng, planner, fus) -> tuple[str, list[str], list[str], list[str], tuple]:
    """A GEMM/Conv rOperator re-emitted with operands loaded through element functions and the
    epilogue computed in its store. Returns (text with KNAME, tensor args in order, reads, writes,
    (spec, text(tiling) with KNAME): how to emit the same rOperator with another tiling)."""
    g = ng.nodes[fus.node]
    e = g.gemm
    spec: GemmSpec = e.spec
    b = Builder(ng, planner, planner.gemm_inline)
    pnames = [p.split()[-1].lstrip("*") for p in spec.params]
    ptens = [ng.res(a) for a in e.args]
    inl = [(pn, t) for pn, t in zip(pnames[:-1], ptens[:-1])
           if ng.producer.get(t) is not None and ng.producer.get(t) in planner.gemm_inline]
    keep = [(pn, t) for pn, t in zip(pnames[:-1], ptens[:-1]) if (pn, t) not in inl]
    for pn, t in keep:  # the kernel's own parameter names stay (its load/store text uses them)
        b.params.setdefault(t, pn)
    a_st, a_val = spec.load_a("m", "k")
    b_st, b_val = spec.load_b("k", "n")
    if not fus.epilogue:
        b.params.setdefault(ptens[-1], pnames[-1])
        b.written.add(ptens[-1])
        store = spec.store("m", "n", "acc[i][j]")
    else:
        store = _epilogue(b, ng, g, spec, fus)
    texts = ["\n".join(a_st), a_val, "\n".join(b_st), b_val, "\n".join(spec.prologue or []), "\n".join(store)]
    texts_in = list(texts)
    for pn, t in keep:  # one tensor under two parameters (B and the Gemm bias C both x): one name
        if b.params[t] != pn:
            texts = [_subst_loads(x, pn, lambda idx, first=b.params[t], dt=ng.tensor(t).dtype: load_float(dt, first, idx))
                     for x in texts]
    for pn, t in inl:  # operands computed in the loads, through element functions
        texts = [_subst_loads(x, pn, lambda idx, t=t: b.read(t, idx)) for x in texts]
    a_st2, a_val2, b_st2, b_val2, pro2, store2 = texts
    ordered = list(b.params)
    decls = []
    for t in ordered:
        T = ctype(ng.tensor(t).dtype)
        decls.append(f"GPTR {T}* {b.params[t]}" if t in b.written else f"GPTR const {T}* {b.params[t]}")
    lines = lambda x: [y for y in x.split("\n") if y]  # noqa: E731
    new = GemmSpec(batch=spec.batch, M=spec.M, N=spec.N, K=spec.K, params=decls,
                   load_a=lambda m, k: (lines(a_st2), a_val2),
                   load_b=lambda k, n: (lines(b_st2), b_val2),
                   store=lambda m, n, acc: lines(store2),
                   prologue=lines(pro2),
                   a_k_contiguous=spec.a_k_contiguous, b_n_contiguous=spec.b_n_contiguous,
                   # an operand whose load text survived unchanged is still the plain tensor read
                   raw_a=spec.raw_a if (a_st2, a_val2) == tuple(texts_in[:2]) else None,
                   raw_b=spec.raw_b if (b_st2, b_val2) == tuple(texts_in[2:4]) else None,
                   row_norm=spec.row_norm)  # (its parameters keep their names: `keep`)
    pd = "".join(d + ", " for d in decls)
    pa = "".join(b.params[t] + ", " for t in ordered)
    funcs = "\n".join(b.funcs)

    def text_for(tiling) -> str:
        return (funcs + "\n" + gemm_source("KNAME", new, tiling)).replace(PD, pd).replace(PA, pa)

    reads = [t for t in ordered if t not in b.written]
    writes = [t for t in ordered if t in b.written]
    return text_for(e.tiling), ordered, reads, writes, (new, text_for)


def _chain(b, ng, head: str, index: str, value: str, nodes: list[int], prefix: str) -> list[str]:
    """Statements that compute `value` (tensor `head`'s element) at flat index `ei` = `index`,
    then each map node of `nodes` in order at the same index, into locals `{prefix}0..`; b.known
    maps each tensor to its local (a GEMM epilogue, an attention's score and output)."""
    b.known = {head: f"{prefix}0"}
    stmts = [f"const int ei = {index};", f"const float {prefix}0 = {value};"]
    for k, cid in enumerate(nodes, start=1):
        c = ng.nodes[cid]
        if cid in b.pl.remaps:  # a Transpose: the same value, stored elsewhere (store_index)
            stmts.append(f"const float {prefix}{k} = {b.known[c.inputs[0]]};")
            b.known[c.output] = f"{prefix}{k}"
            continue
        st, expr = b.body_value(c, "ei")
        stmts += [f"float {prefix}{k};", "{", *["    " + x for x in st], f"    {prefix}{k} = (float)({expr});", "}"]
        b.known[c.output] = f"{prefix}{k}"
    return stmts


def store_index(b, t: str) -> str:
    """Where an epilogue stores tensor `t` of its chain: at the flat index `ei`, or where the
    Transpose that made it puts that element (planner.remaps)."""
    p = b.ng.producer.get(t)
    return b.pl.remaps[p]("ei") if p in b.pl.remaps else "ei"


def _epilogue(b, ng, g, spec, fus) -> list[str]:
    """Store statements: the GEMM's value, then each absorbed consumer at the same flat index (a
    Transpose's output where the Transpose puts it: store_index)."""
    store = _chain(b, ng, g.output, spec.store_index("m", "n"), spec.store_value("m", "n", "acc[i][j]"),
                   fus.epilogue, "e")
    for t in fus.stored:
        store.append(store_float(ng.tensor(t).dtype, b.param(t, write=True), store_index(b, t), b.known[t]))
    return store


def attention_source_fused(ng, planner, af, math: str = "float32") -> tuple[str, list[str], list[str], list[str]]:
    """The fused attention rOperator (passes/astitch/attention.py) in kernels/attention.py's
    template: Q and K through Q·Kᵀ's loads, V through P·V's B load, each operand that AStitch
    computes in a load (the head transposes) through its element function as in a fused GEMM;
    the score through Q·Kᵀ's epilogue nodes at its flat index; the output through P·V's store
    and epilogue. Every tensor is a parameter of the Builder (`gaN`), so the two GEMMs' own
    parameter names (both call their B operand `B`) cannot meet, and P·V's prologue variables
    are renamed apart from Q·Kᵀ's. `math`: the template (kernels/attention_mma.py ATTENTION_MATHS:
    float32 the SIMT one, tf32/fp16/bf16 the tensor-core one). Returns (text with KNAME, tensor
    args in order, reads, writes)."""
    from ...kernels.attention import AttentionSpec
    from ...kernels.attention_mma import fused_attention_source

    g1, g2 = ng.nodes[af.qk], ng.nodes[af.pv]
    s1, s2 = g1.gemm.spec, g2.gemm.spec
    b = Builder(ng, planner, planner.gemm_inline)

    def through_builder(g, spec, texts: list[str]) -> list[str]:
        pnames = [p.split()[-1].lstrip("*") for p in spec.params]
        for pn, t in zip(pnames[:-1], [ng.res(a) for a in g.gemm.args][:-1]):
            texts = [_subst_loads(x, pn, lambda idx, t=t: b.read(t, idx)) for x in texts]
        return texts

    own = set(re.findall(r"\bconst int (\w+)\s*=", "\n".join(s2.prologue or [])))

    def apart(text: str) -> str:  # P·V's prologue names, renamed apart from Q·Kᵀ's
        return re.sub(r"\b(" + "|".join(map(re.escape, sorted(own))) + r")\b", r"pv_\1", text) if own else text

    def load(g, spec, fn, i, j, rename=False):
        st, val = fn(i, j)
        out = through_builder(g, spec, ["\n".join(st), val])
        if rename:
            out = [apart(x) for x in out]
        return [y for y in out[0].split("\n") if y], out[1]

    def score(m, n, s):
        value = through_builder(g1, s1, [s1.store_value(m, n, s)])[0]
        stmts = _chain(b, ng, g1.output, s1.store_index(m, n), value, af.score, "at_e")
        return stmts, b.known[ng.nodes[af.score[-1]].output] if af.score else "at_e0"

    def store(m, e, value):
        # (a Gemm's beta * C reads C, a parameter of its own: through the Builder, like its loads)
        value = apart(through_builder(g2, s2, [s2.store_value(m, e, value)])[0])
        stmts = _chain(b, ng, g2.output, apart(s2.store_index(m, e)), value, af.epilogue, "at_o")
        for t in af.stored:
            stmts.append(store_float(ng.tensor(t).dtype, b.param(t, write=True), store_index(b, t), b.known[t]))
        return stmts

    prologue = [*(s1.prologue or []), *[apart(x) for x in (s2.prologue or [])]]

    def spec(params):
        return AttentionSpec(batch=s1.batch, M=s1.M, N=s1.N, D=s1.K, Dv=s2.N, params=params, prologue=prologue,
                             load_q=lambda m, d: load(g1, s1, s1.load_a, m, d),
                             load_k=lambda d, n: load(g1, s1, s1.load_b, d, n),
                             load_v=lambda n, e: load(g2, s2, s2.load_b, n, e, rename=True),
                             score=score, store=store)

    fused_attention_source("KNAME", spec([]), math)  # a first pass finds the parameters (the Builder's)
    decls = [f"GPTR {ctype(ng.tensor(t).dtype)}* {p}" if t in b.written else f"GPTR const {ctype(ng.tensor(t).dtype)}* {p}"
             for t, p in b.params.items()]
    text, order = b.finish(fused_attention_source("KNAME", spec(decls), math))
    reads = [t for t in order if t not in b.written]
    writes = [t for t in order if t in b.written]
    return text, order, reads, writes
