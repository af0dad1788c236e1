"""verify's judge for outputs chosen by ranking: a TopK, ArgMax or ArgMin that picks another
element at a near tie is not a wrong result, and this proves that is all that happened.

A detector's head ranks its scores (YOLOv10's and RT-DETR's TopK over sigmoid scores) and
gathers boxes by the ranks. dlcc and onnxruntime compute the scores in different orders, with
different exp and sigmoid, so two scores closer than that rounding can rank the other way, and
the gathered outputs then differ by far more than verify's tolerance. On random inputs a small
detector's scores are all near 1e-5 and thousands lie within a rounding of each other.
(onnxruntime's scores are the farther off there: 1.3e-7 from the float64 answer against dlcc's
5e-9, on the YOLOv10 head isbnx ships.)

The judge checks what makes such a run correct, with onnxruntime as the reference (optimizations
off), as quant_judge.py does for quantized values:

1. dlcc's plan is compiled again with every ranked tensor and every selection as extra outputs
   (the same pipeline, precision, device and shapes), and must give the same outputs, bit for
   bit, as the plan under test;
2. dlcc's selections follow exactly from its own ranked values, by ONNX's rules (the larger or
   smaller value first, the lower index first among equal values; ArgMax's select_last_index);
3. onnxruntime runs the model *forced*: every selection is fed from dlcc's, and every ranked
   tensor is an output. Then
   - each ranked tensor of dlcc's is within verify's tolerance of onnxruntime's;
   - in onnxruntime's own values, what dlcc selected is as good as what onnxruntime selected:
     the values at dlcc's picks, in rank order, are within the tolerance of the values at
     onnxruntime's picks (so every pick apart is a tie within the tolerance);
   - given dlcc's selections, every output of onnxruntime's is within the tolerance of dlcc's.

A row that passes says `PASS (selection)` and how many picks fell the other way. Anything else
leaves the row failed: a ranked value off by more than the tolerance, a selection that does not
follow from dlcc's own values, or an output off given the same selections."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

#: The ops that select by ranking, and how many of their outputs are selections.
SELECTORS = {"TopK": 2, "ArgMax": 1, "ArgMin": 1}


def selectors(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The main graph's ranking nodes over a float input."""
    return [n for n in graph.node if n.op_type in SELECTORS and n.domain in ("", "ai.onnx") and n.input
            and n.input[0] and all(o for o in n.output[:SELECTORS[n.op_type]])]


def _attr(n: onnx.NodeProto, name: str, default: int) -> int:
    return next((int(helper.get_attribute_value(a)) for a in n.attribute if a.name == name), default)


def _expected(n: onnx.NodeProto, x: np.ndarray, k: int | None) -> np.ndarray:
    """The indices ONNX's rules select from `x` (TopK: [.., k, ..] along its axis, in rank
    order; ArgMax/ArgMin: one per row, keepdims as the node says)."""
    axis = _attr(n, "axis", -1 if n.op_type == "TopK" else 0) % x.ndim
    xs = np.moveaxis(x.astype(np.float64), axis, -1)
    idx = np.broadcast_to(np.arange(xs.shape[-1]), xs.shape)
    if n.op_type == "TopK":
        key = -xs if _attr(n, "largest", 1) else xs
        order = np.lexsort((idx, key), axis=-1)[..., :k]
        return np.moveaxis(order, -1, axis)
    key = -xs if n.op_type == "ArgMax" else xs
    if _attr(n, "select_last_index", 0):
        pick = xs.shape[-1] - 1 - np.argmin(key[..., ::-1], axis=-1)
    else:
        pick = np.argmin(key, axis=-1)
    return np.expand_dims(pick, axis) if _attr(n, "keepdims", 1) else pick


def _rank_values(n: onnx.NodeProto, x: np.ndarray, picks: np.ndarray) -> np.ndarray:
    """x's values at `picks` (indices as the node outputs them), in rank order."""
    axis = _attr(n, "axis", -1 if n.op_type == "TopK" else 0) % x.ndim
    if n.op_type != "TopK" and not _attr(n, "keepdims", 1):
        picks = np.expand_dims(picks, axis)
    v = np.take_along_axis(x.astype(np.float64), picks.astype(np.int64), axis)
    if n.op_type == "TopK":
        v = np.sort(v, axis=axis)
        v = np.flip(v, axis) if _attr(n, "largest", 1) else v
    return v


def judge_selection(model_path, rows: list[dict], got: dict, feeds: dict, compiled, recompile=None) -> None:
    """Re-judge failing rows of a model that ranks (module docstring); changes `rows` in place."""
    failing = [r for r in rows if not r["passed"] and "note" not in r and r["name"] in got]
    if not failing or compiled is None:
        return
    from .quant_judge import _instrumented_run, judge_rows

    nodes = []

    def prepare():
        model = onnx.load(str(model_path))
        nodes.extend(selectors(model.graph))
        if not nodes:
            return None
        for i in model.graph.input:  # (the feeds' dims: the instrumented plan is compiled at these shapes)
            if i.name in feeds and i.type.tensor_type.HasField("shape"):
                for d, v in zip(i.type.tensor_type.shape.dim, np.shape(feeds[i.name])):
                    d.Clear()
                    d.dim_value = int(v)
        ranked = list(dict.fromkeys(n.input[0] for n in nodes))
        chosen = [o for n in nodes for o in n.output[:SELECTORS[n.op_type]]]
        mine = _instrumented_run(model, ranked + chosen, feeds, compiled, recompile)
        return mine, _forced_run(model, nodes, chosen, feeds, mine)

    def check(mine, forced):
        rtol, atol = failing[0]["rtol"], failing[0]["atol"]
        apart = total = 0
        for n in nodes:
            bad = _check_selector(n, mine, forced, rtol, atol)
            if bad:
                return bad, ""
            at = n.output[1] if n.op_type == "TopK" else n.output[0]
            apart += int((np.asarray(mine[at]) != np.asarray(forced[at + "#ref"])).sum())
            total += np.asarray(mine[at]).size
        return "", (f"judged with dlcc's selections: {apart} of {total} picks differ from onnxruntime's, at ties "
                    f"within the tolerance of onnxruntime's ranked values (dlcc's follow exactly from its own values)")

    judge_rows(failing, got, "selection", "selections", prepare, check)


def _check_selector(n: onnx.NodeProto, mine: dict, forced: dict, rtol: float, atol: float) -> str:
    """The first thing wrong with dlcc's selection at node `n` (module docstring, 2 and 3), or ""."""
    from .verify import compare

    x_mine, x_ref = np.asarray(mine[n.input[0]]), np.asarray(forced[n.input[0] + "#x"])
    at = n.output[1] if n.op_type == "TopK" else n.output[0]  # (the indices)
    picks, theirs = np.asarray(mine[at]), np.asarray(forced[at + "#ref"])
    where = f"{n.op_type} {n.name or n.output[0]!r}"
    if x_mine.dtype.kind != "f" or not (np.isfinite(x_mine).all() and np.isfinite(x_ref).all()):
        return f"{where}: its input is not finite floats"
    ranked = compare(n.input[0], x_mine, x_ref, rtol, atol)
    if not ranked["passed"]:
        return f"{where}: dlcc's ranked values are {ranked['max_abs_err']:.3g} from onnxruntime's"
    k = picks.shape[_attr(n, "axis", -1) % picks.ndim] if n.op_type == "TopK" else None
    if not np.array_equal(_expected(n, x_mine, k), picks):
        return f"{where}: dlcc's selection does not follow from its own values"
    if n.op_type == "TopK" and not np.array_equal(np.take_along_axis(x_mine, picks, _attr(n, "axis", -1)),
                                                  np.asarray(mine[n.output[0]])):
        return f"{where}: dlcc's values are not its input's at its indices"
    as_good = compare(n.output[0], _rank_values(n, x_ref, picks), _rank_values(n, x_ref, theirs), rtol, atol)
    if not as_good["passed"]:
        return f"{where}: in onnxruntime's values, dlcc's picks are {as_good['max_abs_err']:.3g} from onnxruntime's"
    return ""


def _forced_run(model: onnx.ModelProto, nodes: list[onnx.NodeProto], chosen: list[str], feeds: dict,
                mine: dict) -> dict:
    """onnxruntime (optimizations off) on `model` with every selection fed from dlcc's values;
    onnxruntime's own selections come out as `NAME#ref`, each ranked input as `NAME#x`, and the
    model's outputs as themselves."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    wanted = {n.output[0] for n in nodes}
    extra = []
    for n in g.node:
        if n.output and n.output[0] in wanted:
            for i in range(SELECTORS[n.op_type]):
                v = np.asarray(mine[n.output[i]])
                extra.append((n.output[i] + "#ref", helper.np_dtype_to_tensor_dtype(v.dtype)))
                n.output[i] = n.output[i] + "#ref"
    for x in dict.fromkeys(n.input[0] for n in nodes):
        g.node.append(helper.make_node("Identity", [x], [x + "#x"], name=f"{x}#x/identity"))
        extra.append((x + "#x", helper.np_dtype_to_tensor_dtype(np.asarray(mine[x]).dtype)))
    for c in chosen:
        v = np.asarray(mine[c])
        g.input.append(helper.make_tensor_value_info(c, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape)))
    g.output.extend(helper.make_tensor_value_info(e, t, None) for e, t in extra)
    from .quant_judge import run_forced

    return run_forced(m, chosen, feeds, mine)
