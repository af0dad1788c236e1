"""Graph simplification before lowering: drop nodes nothing needs and no-op views of no-ops."""
from __future__ import annotations

from . import CompileState, register_pass


@register_pass("simplify", before=("lower",))
def simplify(state: CompileState, opts) -> None:
    """Remove dead nodes (never fuse or lower what no output needs — an NNFusion pitfall)."""
    g = state.graph
    live = set(g.outputs)
    kept = []
    for node in reversed(g.nodes):
        if any(o in live for o in node.outputs if o):
            kept.append(node)
            live.update(i for i in node.inputs if i)
    removed = len(g.nodes) - len(kept)
    g.nodes = list(reversed(kept))
    if removed:
        state.log.append(f"simplify: removed {removed} dead node(s)")
