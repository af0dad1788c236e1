"""Reducing a failing generated graph to a minimal regression case.

Three reductions, each kept only while the graph still fails the same way (same verdict, same
configuration, same target):

1. **Options off.** Of the configurations that fail, the simplest one (oracle.all_configs' order:
   plain pipelines before forced joins and `schemes` subsets) is the one kept.
2. **The choices.** The graph is rebuilt from edited choice lists (choices.py): runs of answers are
   deleted (nodes dropped) and answers are lowered toward 0 (smaller dims, simpler ops, options
   off), as Hypothesis shrinks. Any edited list builds a valid graph or is rejected.
3. **The graph.** On the result, nodes no output needs are dropped, then one output at a time,
   then every intermediate tensor is tried as the only output (onnx.utils.Extractor); unused
   inputs go too.

`write_regression` stores the result under tests/fuzz_cases/NAME/ (model.onnx, feeds.npz,
case.json), where tests/test_fuzz_regressions.py runs it against onnxruntime in the default suite.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from .graphgen import Case, GeneratorBug, InvalidCase, generate, reference, reference_widened
from .oracle import FAILURES, Config, all_configs, check_model, config_named


@dataclass
class Shrunk:
    model: onnx.ModelProto
    feeds: dict
    config: Config
    target: str
    status: str
    detail: str
    seed: int
    tries: int
    seconds: float


def _verdict(model, feeds, refs, cfg: Config, target: str):
    return check_model(model, feeds, refs, [cfg], target)[0]


def shrink(seed: int, config: Config, target: str = "opencl", max_tries: int = 600, budget_s: float = 1800.0,
           log=None, configs: list[Config] | None = None, max_patterns: int = 8, extremes: bool = False,
           half: bool | str = False, more_ops: bool = False) -> Shrunk:
    """Shrink the graph `generate(seed, max_patterns=, extremes=, half=, more_ops=)` (the campaign's) that fails under
    `config` on `target`. The result depends only on the inputs, not on the machine's speed:
    `max_tries` bounds the work (each try compiles and runs one configuration); `budget_s` is only a
    safety stop."""
    t0 = time.time()
    log = log or (lambda msg: None)
    gen = {"max_patterns": max_patterns, "extremes": extremes, "half": half, "more_ops": more_ops}
    case = generate(seed, **gen)
    first = _verdict(case.model, case.feeds, case.refs, config, target)
    if first.status not in FAILURES:
        raise ValueError(f"seed {seed} does not fail under {config.name} on {target} ({first.status})")
    status = first.status
    tries = 0

    def out_of_budget() -> bool:
        return tries >= max_tries or time.time() - t0 > budget_s

    def fails(c: Case, cfg: Config) -> bool:
        nonlocal tries
        tries += 1
        return _verdict(c.model, c.feeds, c.refs, cfg, target).status == status

    # 1. the simplest configuration that still fails, at the failing one's precision
    same = [config_named(f"{c.name}@{config.precision}") if config.precision != "fp32" else c for c in all_configs()]
    for cfg in configs or same:
        if cfg.name == config.name:
            break
        if fails(case, cfg):
            log(f"configuration {config.name} -> {cfg.name}")
            config = cfg
            break

    # 2. the choice list
    choices = list(case.choices)

    def attempt(new: list[int]) -> Case | None:
        """The case `new` builds, if it still fails and its own choice list is simpler than the
        current one (shorter, or as long and lexicographically smaller: Hypothesis' shortlex
        order, which makes every accepted step progress; a replay that runs out records zeros,
        so the list it records can be longer than `new`)."""
        if out_of_budget():
            return None
        try:
            c = generate(seed, replay=new, **gen)
        except (InvalidCase, GeneratorBug):
            return None
        if (len(c.choices), c.choices) >= (len(choices), choices):
            return None
        return c if fails(c, config) else None

    progress = True
    while progress and not out_of_budget():
        progress = False
        for size in (32, 16, 8, 4, 2, 1):  # delete runs of answers, from the end
            i = len(choices) - size
            while i >= 0:
                c = attempt(choices[:i] + choices[i + size:])
                if c is not None:
                    choices, case, progress = c.choices, c, True
                    log(f"deleted {size} choice(s): {len(case.model.graph.node)} node(s)")
                i = min(i, len(choices)) - size
        i = 0
        while i < len(choices):  # lower each answer (an accepted edit may shorten the list)
            for v in sorted({0, choices[i] // 2, choices[i] - 1}):
                if not 0 <= v < choices[i]:
                    continue
                c = attempt(choices[:i] + [v] + choices[i + 1:])
                if c is not None:
                    choices, case, progress = c.choices, c, True
                    break
            i += 1

    # 3. the graph: dead nodes dropped, then fewer outputs, then a single intermediate output
    model, feeds = case.model, case.feeds
    progress = True
    while progress and time.time() - t0 < budget_s:  # (the cuts are few: not counted against max_tries)
        progress = False
        outs = [o.name for o in model.graph.output]
        tries_here = [outs] + [[o for o in outs if o != drop] for drop in outs if len(outs) > 1] + \
                     [[name] for name in _intermediates(model)] + [("bypass", k) for k in range(len(model.graph.node))]
        for names in tries_here:
            sub = _bypass(model, names[1]) if names[0] == "bypass" else _cut(model, names)
            if sub is None or (len(sub.graph.node), len(sub.graph.output)) >= (len(model.graph.node),
                                                                              len(model.graph.output)):
                continue
            f = {k: v for k, v in feeds.items() if k in {i.name for i in sub.graph.input}}
            try:
                refs = _finite_reference(sub, f, half)
            except InvalidCase:
                continue
            if _verdict(sub, f, refs, config, target).status == status:
                model, feeds, progress = sub, f, True
                log(f"cut to outputs {names}: {len(model.graph.node)} node(s)")
                break
    refs = (reference_widened if half else reference)(model, feeds)
    last = _verdict(model, feeds, refs, config, target)
    return Shrunk(model, feeds, config, target, status, last.detail, seed, tries, time.time() - t0)


def _finite_reference(model, feeds, half: bool | str = False) -> dict:
    """The campaign's reference of a cut graph: a half model's is the widened one (graphgen)."""
    refs = (reference_widened if half else reference)(model, feeds)
    for r in refs.values():
        if r.dtype.kind == "f" and not np.all(np.isfinite(r)):
            raise InvalidCase("not finite")
    return refs


def _intermediates(model: onnx.ModelProto) -> list[str]:
    outs = {o.name for o in model.graph.output}
    return [t for n in model.graph.node for t in n.output if t and t not in outs]


def _cut(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto | None:
    """The part of `model` that computes `names`, which are its outputs."""
    from onnx.utils import Extractor

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        sub = Extractor(inferred).extract_model([i.name for i in model.graph.input], names)
    except Exception:
        return None
    used = {i for n in sub.graph.node for i in n.input}
    keep = [i for i in sub.graph.input if i.name in used]
    del sub.graph.input[:]
    sub.graph.input.extend(keep)
    del sub.graph.value_info[:]
    try:
        onnx.checker.check_model(sub, full_check=True)
    except Exception:
        return None
    return sub


def _bypass(model: onnx.ModelProto, k: int) -> onnx.ModelProto | None:
    """`model` without node k: its readers read instead an input of it with the same type and
    shape (Relu(x) -> x). None where it has no such input or its output is a graph output."""
    from onnx import helper

    node = model.graph.node[k]
    if len(node.output) != 1 or node.output[0] in {o.name for o in model.graph.output}:
        return None
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except Exception:
        return None
    types = {vi.name: vi.type.SerializeToString() for vi in
             list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output)}
    for init in model.graph.initializer:
        types[init.name] = helper.make_tensor_type_proto(init.data_type, list(init.dims)).SerializeToString()
    out = node.output[0]
    same = [i for i in node.input if i and i in types and types[i] == types.get(out)]
    if not same:
        return None
    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.node[k]
    for n in m.graph.node:
        for j, i in enumerate(n.input):
            if i == out:
                n.input[j] = same[0]
    return _cut(m, [o.name for o in m.graph.output])


def write_regression(s: Shrunk, root: str | Path, name: str | None = None, note: str = "") -> Path:
    """tests/fuzz_cases/NAME/{model.onnx, feeds.npz, case.json}: the case the default suite runs."""
    name = name or f"seed{s.seed}-{s.config.name}-{s.target}".replace("[", "-").replace("]", "").replace(",", "-")
    d = Path(root) / name
    d.mkdir(parents=True, exist_ok=True)
    onnx.save(s.model, str(d / "model.onnx"))
    np.savez(d / "feeds.npz", **s.feeds)
    meta = {"seed": s.seed, "config": s.config.as_dict(), "target": s.target, "status_when_found": s.status,
            "detail_when_found": s.detail, "nodes": len(s.model.graph.node),
            "ops": [n.op_type for n in s.model.graph.node], "note": note}
    (d / "case.json").write_text(json.dumps(meta, indent=1) + "\n")
    return d
