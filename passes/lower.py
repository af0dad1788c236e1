"""The baseline lowering: every op through its registry entry, one kernel (or a few) per op."""
from __future__ import annotations


from ..ops import registry
from ..ops.context import LowerCtx
from ..ops.layout import identity_copy
from . import CompileState, register_pass


def lower_graph(graph, device, pass_name: str = "baseline") -> LowerCtx:
    ctx = LowerCtx(graph, device, pass_name=pass_name)
    for node in graph.nodes:
        entry = registry.lookup(node.op_type, graph.opset, node.domain)
        assert entry is not None, node.op_type  # unsupported ops are rejected before passes run
        ctx.node = node
        entry.lower(ctx, node)
    ctx.node = None
    _materialize_outputs(ctx)
    return ctx


def _materialize_outputs(ctx: LowerCtx) -> None:
    """Each graph output gets its own bytes: copy where it is an input, a constant or a shared view."""
    g = ctx.graph
    claimed: set[str] = set()
    for k, out in enumerate(list(g.outputs)):
        t = g.tensors[out]
        if out in g.inputs:
            # The output *is* an input: it needs its own bytes, under a tensor of its own.
            copy = ctx.temp(t.shape, t.dtype)
            identity_copy(ctx, copy, out)
            g.outputs[k] = copy
            g.output_alias[copy] = out
            claimed.add(copy)
            continue
        if t.value is not None:
            src = ctx.temp(t.shape, t.dtype)
            g.tensors[src].value = t.value
            t.value = None
            identity_copy(ctx, out, src)
            claimed.add(out)
            continue
        base = ctx.resolve(out)
        if base in g.inputs or g.tensors[base].value is not None or base in claimed or \
                (base != out and base in g.outputs):
            ctx.aliases.pop(out, None)
            identity_copy(ctx, out, base)
            base = out
        claimed.add(base)


@register_pass("lower")
def lower(state: CompileState, opts) -> None:
    """Lower every node with its registry entry (baseline: one kernel per op)."""
    state.ctx = lower_graph(state.graph, state.device)
    n = len(state.ctx.program.launches)
    state.log.append(f"lower: {len(state.ctx.program.kernels)} kernel(s), {n} launch(es)")
