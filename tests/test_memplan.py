"""Memory planning: buffers that are live at the same time never share bytes; reuse really happens."""
from __future__ import annotations

import pytest

from dlcc.compiler import compile_model

from conftest import SMALL_MODELS


def _lifetimes(state):
    ctx, mem = state.ctx, state.memory
    first, last = {}, {}
    for i, L in enumerate(ctx.program.launches):
        for t in L.reads + L.writes:
            b = ctx.resolve(t)
            if mem.placements[b].storage == "arena":
                first.setdefault(b, i)
                last[b] = i
    return first, last


@pytest.mark.parametrize("name", SMALL_MODELS)
def test_live_buffers_never_overlap(model_path, name):
    res = compile_model(model_path(name), target="opencl")
    st = res.state
    first, last = _lifetimes(st)
    mem = st.memory
    names = sorted(first)
    for i, a in enumerate(names):
        pa = mem.placements[a]
        for b in names[i + 1:]:
            pb = mem.placements[b]
            if last[a] < first[b] or last[b] < first[a]:
                continue  # disjoint lifetimes may share
            bytes_overlap = pa.offset < pb.offset + pb.nbytes and pb.offset < pa.offset + pa.nbytes
            if not bytes_overlap:
                continue
            # The only allowed overlap: in place, one dies at the launch the other is born in.
            assert pa.offset == pb.offset and (last[a] == first[b] or last[b] == first[a]), (a, b)
    assert mem.arena_bytes <= mem.naive_bytes
    for p in mem.placements.values():
        assert p.offset % 256 == 0


def test_reuse_and_inplace_on_a_deep_model(model_path):
    res = compile_model(model_path("yolo"), target="opencl")
    mem = res.state.memory
    assert mem.arena_bytes < 0.5 * mem.naive_bytes
    assert mem.inplace_pairs > 0


def test_memplan_options_turn_reuse_off(model_path, tmp_path):
    y = tmp_path / "noshare.yaml"
    y.write_text("name: noshare\npasses:\n  - name: lower\n  - name: memplan\n    options: {inplace: false, share: false}\n")
    res = compile_model(model_path("yolo"), target="opencl", pipeline=str(y))
    assert res.state.memory.inplace_pairs == 0
    assert res.state.memory.arena_bytes == res.state.memory.naive_bytes
