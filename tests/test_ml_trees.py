"""Tree ensembles (dlcc/ml_trees.py) against onnxruntime's CPU kernel on PoCL: random forests of
every shape the attributes allow (mixed branch modes, NaN tracking, nodes listed out of order,
leaves with several weights or none for an output), every aggregate and score transform, and
onnxruntime's two-class rules; and the models onnxruntime refuses, refused with their reason."""
from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as h
import pytest

import dlcc
from dlcc.errors import DlccError

from conftest import opencl_device_available

needs_opencl = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")
F, I64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
ML = "ai.onnx.ml"
MODES = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]
#: Thresholds are drawn from these, and so are a third of the inputs, so equal values happen.
GRID = np.float32([-1.5, -0.5, 0.0, 0.25, 1.0])


def forest(rng, trees: int, columns: int, outputs: int, depth: int, kind: str, modes=("BRANCH_LEQ",),
           nan_tracks: bool = False, weights: str = "all", scale: float = 1.0, shuffle: bool = True) -> dict:
    """The attributes of a random forest. `kind`: "class" or "target" (the weights' prefix).
    `weights`: "all" (each leaf weighs every output), "one" (one output per leaf), "sparse" (a
    random set, repeats included) or "vote" (binary: class 0 weighs 0 or scale, a random forest's
    vote). `shuffle`: a tree's nodes after its root listed in random order."""
    a = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_values", "nodes_modes",
                         "nodes_truenodeids", "nodes_falsenodeids", "nodes_missing_value_tracks_true")}
    w = {k: [] for k in ("ids", "nodeids", "treeids", "weights")}
    base_id = 0
    for t in range(trees):
        nodes: list = []

        def grow(d: int) -> int:
            i = len(nodes)
            nodes.append(None)
            if d == depth or (d and rng.random() < 0.3):
                nodes[i] = ("LEAF", 0, 0.0, 0, 0)
            else:
                mode = str(rng.choice(modes))
                thr = float(rng.choice(GRID)) if rng.random() < 0.7 else float(rng.standard_normal())
                nodes[i] = (mode, int(rng.integers(columns)), thr, grow(d + 1), grow(d + 1))
            return i

        grow(0)
        order = np.r_[0, 1 + rng.permutation(len(nodes) - 1)] if shuffle else np.arange(len(nodes))
        for i in order:
            mode, feat, thr, yes, no = nodes[i]
            a["nodes_treeids"].append(t)
            a["nodes_nodeids"].append(base_id + int(i))
            a["nodes_featureids"].append(feat)
            a["nodes_values"].append(thr)
            a["nodes_modes"].append(mode)
            a["nodes_truenodeids"].append(base_id + yes if mode != "LEAF" else 0)
            a["nodes_falsenodeids"].append(base_id + no if mode != "LEAF" else 0)
            a["nodes_missing_value_tracks_true"].append(int(nan_tracks and rng.random() < 0.5))
            if mode != "LEAF":
                continue
            if weights == "all":
                given = list(range(outputs))
            elif weights == "one":
                given = [int(rng.integers(outputs))]
            elif weights == "vote":
                given = [0]
            else:
                given = list(rng.integers(outputs, size=int(rng.integers(1, 4))))
            for k in given:
                w["ids"].append(int(k))
                w["nodeids"].append(base_id + int(i))
                w["treeids"].append(t)
                w["weights"].append(float(scale * rng.integers(0, 2)) if weights == "vote"
                                    else float(np.float32(scale * rng.standard_normal())))
        base_id += len(nodes)
    a.update({f"{kind}_{k}": v for k, v in w.items()})
    return a


def inputs(rng, rows: int, columns: int, nans: bool = False) -> np.ndarray:
    x = rng.standard_normal((rows, columns)).astype(np.float32)
    on_grid = rng.random((rows, columns)) < 0.35
    x[on_grid] = rng.choice(GRID, size=int(on_grid.sum()))
    if nans:
        x[rng.random((rows, columns)) < 0.1] = np.nan
    return x


def _save(tmp_path, nodes, ins, outs, name, opset=17):
    g = h.make_graph(nodes, name, [h.make_tensor_value_info(k, t, s) for k, (t, s) in ins.items()],
                     [h.make_tensor_value_info(k, t, s) for k, (t, s) in outs.items()])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset), h.make_opsetid(ML, 3)])
    onnx.checker.check_model(m)
    path = tmp_path / f"{name}.onnx"
    onnx.save(m, path)
    return path


def _check(path, feeds, pipeline="astitch"):
    """Every output equal to onnxruntime's on one thread (the trees summed in their order; see
    verify.has_tree_ensembles): labels exactly, scores to float32 rounding."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    got = dlcc.compile(path, target="opencl", pipeline=pipeline)(feeds)
    for o, ref in zip(sess.get_outputs(), sess.run(None, feeds)):
        assert got[o.name].shape == ref.shape and got[o.name].dtype == ref.dtype, o.name
        if ref.dtype == np.int64:
            np.testing.assert_array_equal(got[o.name], ref, err_msg=o.name)
        else:
            np.testing.assert_allclose(got[o.name], ref, rtol=2e-6, atol=1e-7, err_msg=o.name)


@needs_opencl
def test_regressors(tmp_path):
    """One model, eight regressors: a single target summed (mixed modes, NaN tracked, a base
    value), averaged through PROBIT, its MIN and MAX (several weights per leaf: the first counts);
    three targets summed with base values through LOGISTIC, their MAX with outputs some leaves
    leave out (0 where no tree weighs them) through SOFTMAX_ZERO, averaged through SOFTMAX; and a
    single row."""
    rng = np.random.default_rng(0)
    c, rows = 5, 60
    specs = [("sum1", dict(trees=7, outputs=1, depth=5, modes=MODES, nan_tracks=True), dict(base_values=[0.5])),
             ("avg1", dict(trees=4, outputs=1, depth=3, scale=0.2), dict(aggregate_function="AVERAGE",
                                                                        post_transform="PROBIT")),
             ("min1", dict(trees=5, outputs=1, depth=4, weights="sparse"), dict(aggregate_function="MIN")),
             ("max1", dict(trees=5, outputs=1, depth=4, modes=("BRANCH_GT", "BRANCH_EQ")),
              dict(aggregate_function="MAX", base_values=[-1.0])),
             ("sum3", dict(trees=6, outputs=3, depth=4, modes=("BRANCH_LT",), nan_tracks=True),
              dict(base_values=[0.1, -0.2, 0.3], post_transform="LOGISTIC")),
             ("max3", dict(trees=4, outputs=3, depth=3, weights="sparse"),
              dict(aggregate_function="MAX", post_transform="SOFTMAX_ZERO")),
             ("avg3", dict(trees=3, outputs=3, depth=4, weights="one", shuffle=False),
              dict(aggregate_function="AVERAGE", post_transform="SOFTMAX"))]
    nodes, outs = [], {}
    for name, spec, extra in specs:
        attrs = forest(rng, columns=c, kind="target", **spec)
        nodes.append(h.make_node("TreeEnsembleRegressor", ["x"], [name], domain=ML, n_targets=spec["outputs"],
                                 **attrs, **extra))
        outs[name] = (F, [rows, spec["outputs"]])
    nodes.append(h.make_node("TreeEnsembleRegressor", ["v"], ["row"], domain=ML, n_targets=1,
                             **forest(rng, 3, c, 1, 4, "target", modes=MODES)))
    outs["row"] = (F, [1, 1])
    path = _save(tmp_path, nodes, {"x": (F, [rows, c]), "v": (F, [1, c])}, outs, "regressors")
    x = inputs(rng, rows, c, nans=True)
    _check(path, {"x": x, "v": x[3:4]})


@needs_opencl
def test_classifiers(tmp_path):
    """One model at opset 9 (raised to 13 at import, as LightGBM's are), eight classifiers:
    several classes with base values through SOFTMAX; with sparse weights (a class no tree
    scores is passed over for the label); a random forest's binary vote summed to exact ties at
    0.5 (the second label above it); boosted binary models through LOGISTIC with one base value
    and with two; a two-class model whose leaves name both classes (its label 1 or 0, as
    onnxruntime gives), and one whose weights name class 1 alone, through PROBIT; an int64
    input."""
    rng = np.random.default_rng(1)
    c, rows = 4, 70
    specs = [("soft", [2, 5, 7, 9], dict(trees=6, depth=4, weights="one"),
              dict(base_values=[0.1, 0.2, -0.3, 0.0], post_transform="SOFTMAX")),
             ("sparse", [0, 1, 2], dict(trees=3, depth=3, weights="sparse", modes=MODES), {}),
             ("vote", [3, 7], dict(trees=20, depth=3, weights="vote", scale=0.05), {}),
             ("boost1", [0, 1], dict(trees=8, depth=3, weights="vote", nan_tracks=True),
              dict(base_values=[-0.2], post_transform="LOGISTIC")),
             ("boost2", [4, 6], dict(trees=8, depth=3, weights="vote"), dict(base_values=[0.3, -0.1])),
             ("both", [5, 9], dict(trees=3, depth=2, weights="one"), dict(post_transform="LOGISTIC")),
             ("bothall", [5, 9], dict(trees=3, depth=3), dict(post_transform="SOFTMAX"))]
    nodes, outs = [], {}
    for name, labels, spec, extra in specs:
        attrs = forest(rng, columns=c, outputs=len(labels), kind="class", **spec)
        if name == "boost1":  # boosted trees' weights are of either sign
            attrs["class_weights"] = [float(np.float32(v)) for v in rng.standard_normal(len(attrs["class_weights"]))]
        nodes.append(h.make_node("TreeEnsembleClassifier", ["x"], [f"{name}_label", f"{name}_scores"], domain=ML,
                                 classlabels_int64s=labels, **attrs, **extra))
        outs.update({f"{name}_label": (I64, [rows]), f"{name}_scores": (F, [rows, len(labels)])})
    one = forest(rng, 4, c, 2, 3, "class", scale=0.3)
    one["class_ids"] = [1] * len(one["class_ids"])
    nodes.append(h.make_node("TreeEnsembleClassifier", ["x"], ["one_label", "one_scores"], domain=ML,
                             classlabels_int64s=[0, 1], post_transform="PROBIT", **one))
    outs.update({"one_label": (I64, [rows]), "one_scores": (F, [rows, 2])})
    nodes.append(h.make_node("TreeEnsembleClassifier", ["xi"], ["int_label", "int_scores"], domain=ML,
                             classlabels_int64s=[0, 1, 2], **forest(rng, 3, c, 3, 4, "class", modes=MODES)))
    outs.update({"int_label": (I64, [rows]), "int_scores": (F, [rows, 3])})
    path = _save(tmp_path, nodes, {"x": (F, [rows, c]), "xi": (I64, [rows, c])}, outs, "classifiers", opset=9)
    xi = rng.integers(-2, 3, (rows, c)).astype(np.int64)
    _check(path, {"x": inputs(rng, rows, c, nans=True), "xi": xi})


def _tree(**over) -> dict:
    """A stump: node 0 splits feature 0 at 0; leaves 1 and 2 weigh class (target) 0."""
    a = dict(nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0], nodes_values=[0.0] * 3,
             nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
             class_ids=[0, 0], class_nodeids=[1, 2], class_treeids=[0, 0], class_weights=[0.2, 0.7],
             classlabels_int64s=[0, 1])
    a.update(over)
    return {k: v for k, v in a.items() if v is not None}


@pytest.mark.parametrize("over, match", [
    (dict(nodes_truenodeids=[0, 0, 0]), "node 0 in tree 0 is its own true branch"),
    (dict(nodes_falsenodeids=[5, 0, 0]), "node 5, which that tree does not have"),
    (dict(nodes_modes=["BRANCH_LEQ", "BRANCH_LEQ", "LEAF"], nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 2, 0]),
     "form a cycle"),
    (dict(class_nodeids=[1, 1]), "leaf 2 of tree 0 has no weight"),
    (dict(nodes_featureids=[4, 0, 0]), "reads feature 4, but the input has 3 column"),
    (dict(class_ids=[0, 2]), r"outside \[0, 1\]"),
    (dict(nodes_modes=["BRANCH_LE", "LEAF", "LEAF"]), "node mode 'BRANCH_LE' is not"),
    (dict(nodes_nodeids=[0, 1, 1]), "node 1 of tree 0 is given twice"),
    (dict(post_transform="SIGMOID"), "post_transform 'SIGMOID' is not one of"),
    (dict(nodes_values=[0.0]), "nodes_values holds 1 values"),
])
def test_malformed_forests_are_refused_with_the_reason(tmp_path, over, match):
    node = h.make_node("TreeEnsembleClassifier", ["x"], ["y", "z"], domain=ML, **_tree(**over))
    path = _save(tmp_path, [node], {"x": (F, [2, 3])}, {"y": (I64, [2]), "z": (F, [2, 2])}, "bad")
    with pytest.raises(DlccError, match=match):
        dlcc.compile(path, target="opencl")


@pytest.mark.parametrize("over, x_type, match", [
    (dict(classlabels_int64s=None, classlabels_strings=["a", "b"]), F, "string class labels"),
    ({}, onnx.TensorProto.DOUBLE, "a float64 input"),
    (dict(post_transform="PROBIT"), F, "two-class model whose leaves may give class 1 no weight, with PROBIT"),
])
def test_what_stays_unsupported_is_named(tmp_path, over, x_type, match):
    """Each refusal names what is missing; `--fallback onnxruntime` runs these nodes there."""
    node = h.make_node("TreeEnsembleClassifier", ["x"], ["y", "z"], domain=ML, **_tree(**over))
    label = onnx.TensorProto.STRING if "classlabels_strings" in over else I64
    path = _save(tmp_path, [node], {"x": (x_type, [2, 3])}, {"y": (label, [2]), "z": (F, [2, 2])}, "unsupported")
    with pytest.raises(DlccError, match=match):
        dlcc.compile(path, target="opencl")


@needs_opencl
def test_string_labels_run_on_onnxruntime_through_the_fallback(tmp_path):
    """A classifier with string labels: refused, with --fallback onnxruntime made there. `verify`
    compares the strings (equal, or not), and `run -o` stores them as a unicode array, which
    numpy reads without pickle."""
    import json

    import onnxruntime as ort
    from typer.testing import CliRunner

    from dlcc.cli import app
    from dlcc.verify import compare, verify_outputs

    rng = np.random.default_rng(4)
    attrs = forest(rng, 4, 3, 3, 3, "class")
    node = h.make_node("TreeEnsembleClassifier", ["x"], ["label", "scores"], domain=ML,
                       classlabels_strings=["cat", "dog", "eel"], **attrs)
    path = _save(tmp_path, [node], {"x": (F, [6, 3])},
                 {"label": (onnx.TensorProto.STRING, [6]), "scores": (F, [6, 3])}, "strings")
    with pytest.raises(DlccError, match="string class labels"):
        dlcc.compile(path, target="opencl")
    x = inputs(rng, 6, 3)
    got = dlcc.compile(path, target="opencl", fallback="onnxruntime")({"x": x})
    label, _ = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(got["label"], label)
    rows = verify_outputs(path, got, {"x": x})
    assert [(r["name"], r["passed"]) for r in rows] == [("label", True), ("scores", True)]
    wrong = label.copy()
    wrong[1] = "owl"
    assert compare("label", wrong, label, 1e-3, 1e-4)["note"] == "1 string(s) differ"
    art, npz = tmp_path / "art", tmp_path / "out.npz"
    runner = CliRunner()
    res = runner.invoke(app, ["compile", str(path), "--fallback", "onnxruntime", "-o", str(art), "-q"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["run", str(art), "-o", str(npz), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["outputs"][0]["dtype"] == "string"
    with np.load(npz) as z:
        assert z["label"].dtype.kind == "U" and z["label"].shape == (6,)
        assert set(z["label"].tolist()) <= {"cat", "dog", "eel"}  # (run's own sample inputs)


@needs_opencl
def test_a_float64_input_is_compared_in_float32_when_a_precision_is_asked_for(tmp_path):
    """skl2onnx's double pipelines give the forest a float64 X. Refused without a precision
    (onnxruntime compares it in double); with --precision fp32 it is rounded to float32 first, which
    agrees with onnxruntime's double walk wherever no X lies within half a float32 step of a
    threshold, as here (thresholds and inputs drawn apart)."""
    from dlcc.verify import verify_outputs

    rng = np.random.default_rng(40)
    node = h.make_node("TreeEnsembleClassifier", ["x"], ["y", "z"], domain=ML, classlabels_int64s=[0, 1, 2],
                       **forest(rng, 5, 4, 3, 3, "class"))
    path = _save(tmp_path, [node], {"x": (onnx.TensorProto.DOUBLE, [64, 4])}, {"y": (I64, [64]), "z": (F, [64, 3])},
                 "double")
    with pytest.raises(DlccError, match="a float64 input"):
        dlcc.compile(path, target="opencl")
    m = dlcc.compile(path, target="opencl", precision="fp32")
    x = inputs(rng, 64, 4).astype(np.float64)
    rows = verify_outputs(path, m({"x": x}), {"x": x}, compiled=m)
    assert all(r["passed"] for r in rows), rows


def _as_v5(a: dict, outputs: int, **extra) -> onnx.NodeProto:
    """The TreeEnsemble (ai.onnx.ml 5) of a forest() regressor with one weight per leaf: branches
    and leaves in two lists, each child named by its index in one of them."""
    key = list(zip(a["nodes_treeids"], a["nodes_nodeids"]))
    branches = [i for i, m in enumerate(a["nodes_modes"]) if m != "LEAF"]
    leaves = [i for i, m in enumerate(a["nodes_modes"]) if m == "LEAF"]
    at_b, at_l = {key[i]: k for k, i in enumerate(branches)}, {key[i]: k for k, i in enumerate(leaves)}
    weight = {(t, n): (c, w) for c, n, t, w in zip(a["target_ids"], a["target_nodeids"], a["target_treeids"],
                                                   a["target_weights"])}

    def child(i, side):
        k = (a["nodes_treeids"][i], a[f"nodes_{side}nodeids"][i])
        return (at_l[k], 1) if k in at_l else (at_b[k], 0)

    trues, falses = [child(i, "true") for i in branches], [child(i, "false") for i in branches]
    roots = [at_b[key[i]] for i in range(len(key)) if i == 0 or a["nodes_treeids"][i] != a["nodes_treeids"][i - 1]]
    return h.make_node(
        "TreeEnsemble", ["x"], ["y"], domain=ML, n_targets=outputs, tree_roots=roots,
        nodes_featureids=[a["nodes_featureids"][i] for i in branches],
        nodes_splits=onnx.numpy_helper.from_array(np.float32([a["nodes_values"][i] for i in branches])),
        nodes_modes=onnx.numpy_helper.from_array(np.uint8([MODES.index(a["nodes_modes"][i]) for i in branches])),
        nodes_truenodeids=[c for c, _ in trues], nodes_trueleafs=[leaf for _, leaf in trues],
        nodes_falsenodeids=[c for c, _ in falses], nodes_falseleafs=[leaf for _, leaf in falses],
        nodes_missing_value_tracks_true=[a["nodes_missing_value_tracks_true"][i] for i in branches],
        leaf_targetids=[weight[key[i]][0] for i in leaves],
        leaf_weights=onnx.numpy_helper.from_array(np.float32([weight[key[i]][1] for i in leaves])), **extra)


@needs_opencl
@pytest.mark.parametrize("outputs, modes, extra", [
    (1, MODES, {}),
    (3, ("BRANCH_LT", "BRANCH_GTE"), dict(aggregate_function=0, post_transform=2)),  # AVERAGE, SOFTMAX
    (2, ("BRANCH_LEQ",), dict(aggregate_function=3, post_transform=1)),  # MAX, LOGISTIC
    (2, ("BRANCH_GT", "BRANCH_NEQ"), dict(aggregate_function=2, post_transform=3)),  # MIN, SOFTMAX_ZERO
])
def test_the_opset_5_tree_ensemble(tmp_path, outputs, modes, extra):
    """ai.onnx.ml 5's TreeEnsemble (newer skl2onnx and onnxmltools; LightGBM forests in a pip
    package were refused), as onnxruntime converts it to a TreeEnsembleRegressor: every mode,
    NaN tracked, each aggregate and transform, against onnxruntime on one thread. (onnxruntime
    reads post_transform 1 as LOGISTIC and 2 as SOFTMAX, the other way round from the spec.)"""
    rng = np.random.default_rng(outputs)
    c, rows = 5, 40
    a = forest(rng, 6, c, outputs, 4, "target", modes=modes, nan_tracks=True, weights="one")
    g = h.make_graph([_as_v5(a, outputs, **extra)], "v5", [h.make_tensor_value_info("x", F, [rows, c])],
                     [h.make_tensor_value_info("y", F, [rows, outputs])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 21), h.make_opsetid(ML, 5)])
    onnx.checker.check_model(m)
    onnx.save(m, tmp_path / "v5.onnx")
    _check(tmp_path / "v5.onnx", {"x": inputs(rng, rows, c, nans=True)})


#: Categorical sets, one per BRANCH_MEMBER node in turn: integers in 0..30 (onnxruntime's chain of
#: equalities), one with fractions (the chain itself), and sets of 31 or more or reaching outside
#: 0..30 (its BRANCH_MEMBER_BIGSET, which truncates the value toward zero).
SETS = [[0, 2, 3], [0.5, 1, 2.5], [1, 3, 40], list(range(0, 62, 2)), [-3, 7], [30]]
#: The inputs the sets are read with: members, truncations of members, and past the ends.
CATEGORIES = np.float32([0, 1, 2, 2.5, 3, 3.5, -0.5, -0.9, -3, -3.5, 7.9, 40, 40.5, 30, 31, 60.5, np.nan,
                         np.inf, -np.inf, 1e10])


@needs_opencl
@pytest.mark.parametrize("nan_tracks", [False, True])
def test_the_opset_5_tree_ensemble_categorical_sets(tmp_path, nan_tracks):
    """BRANCH_MEMBER nodes (categorical splits): the value must be in the node's set. Small sets
    of integers and fractions compare for equality; large ones, or ones reaching outside 0..30,
    hold a value whose truncation toward zero is a member (3.5 is in {1, 3, 40}), as onnxruntime's
    BRANCH_MEMBER_BIGSET does; NaN goes where the node tracks it. Against onnxruntime."""
    rng = np.random.default_rng(7)
    c, rows = 4, 200
    a = forest(rng, 8, c, 1, 4, "target", modes=("BRANCH_LEQ", "BRANCH_EQ"), nan_tracks=nan_tracks, weights="one")
    node = _as_v5(a, 1)
    attrs = {x.name: x for x in node.attribute}
    modes = onnx.numpy_helper.to_array(attrs["nodes_modes"].t).copy()
    members = []
    for n, k in enumerate(range(0, modes.size, 2)):  # (every other branch, each set in turn)
        modes[k] = 6
        members += SETS[n % len(SETS)] + [np.nan]
    assert n >= len(SETS)
    attrs["nodes_modes"].t.CopyFrom(onnx.numpy_helper.from_array(modes))
    node.attribute.append(h.make_attribute("membership_values", onnx.numpy_helper.from_array(np.float32(members))))
    g = h.make_graph([node], "v5", [h.make_tensor_value_info("x", F, [rows, c])],
                     [h.make_tensor_value_info("y", F, [rows, 1])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 21), h.make_opsetid(ML, 5)])
    onnx.checker.check_model(m)
    onnx.save(m, tmp_path / "sets.onnx")
    x = rng.choice(CATEGORIES, size=(rows, c)).astype(np.float32)
    _check(tmp_path / "sets.onnx", {"x": x})


def test_categorical_sets_onnxruntime_refuses_are_clear_errors(tmp_path):
    """A BRANCH_MEMBER node without a set, an empty set, and a large set with a fraction (which
    onnxruntime cannot compare as int32) are one clear error each."""
    from dlcc.errors import DlccError

    rng = np.random.default_rng(8)
    a = forest(rng, 1, 2, 1, 2, "target", weights="one")
    for members, why in (([], "holds 0 set"), ([np.nan], "empty set"), ([0.5, 40, np.nan], "must hold integers")):
        node = _as_v5(a, 1)
        attrs = {x.name: x for x in node.attribute}
        modes = onnx.numpy_helper.to_array(attrs["nodes_modes"].t).copy()
        modes[0] = 6
        attrs["nodes_modes"].t.CopyFrom(onnx.numpy_helper.from_array(modes))
        if members:
            node.attribute.append(h.make_attribute("membership_values", onnx.numpy_helper.from_array(np.float32(members))))
        g = h.make_graph([node], "v5", [h.make_tensor_value_info("x", F, [3, 2])], [h.make_tensor_value_info("y", F, [3, 1])])
        onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 21), h.make_opsetid(ML, 5)]), tmp_path / "bad.onnx")
        with pytest.raises(DlccError, match=why):
            dlcc.compile(tmp_path / "bad.onnx", target="opencl")


@needs_opencl
@pytest.mark.parametrize("model", ["regressors", "classifiers"])
def test_large_forests_wait_outside_the_model(tmp_path, monkeypatch, model):
    """A large forest's attributes wait outside the model until its rewrite, with a one-leaf
    stand-in through onnx's checker, shape inference, the version converter and onnxruntime's
    folding (large_attributes.py): every forest of the two models above is moved here (LARGE
    0), and every output still equals onnxruntime's."""
    from dlcc import large_attributes

    moved = []
    stash = large_attributes.stash_forests
    monkeypatch.setattr(large_attributes, "LARGE", 0)
    monkeypatch.setattr(large_attributes, "stash_forests", lambda m, p: moved.append(stash(m, p)) or moved[-1])
    {"regressors": test_regressors, "classifiers": test_classifiers}[model](tmp_path)
    assert moved and len(moved[0]) == {"regressors": 8, "classifiers": 9}[model]


def test_a_moved_forest_keeps_the_checkers_attribute_types(tmp_path, monkeypatch):
    """The checker does not see a moved forest, so its attribute types are checked as it would:
    nodes_modes given as INTS is refused, naming the node and the attribute; and a stand-in
    whose forest went missing is an error, never a rewrite of one leaf."""
    from dlcc import large_attributes

    monkeypatch.setattr(large_attributes, "LARGE", 0)
    good = h.make_node("TreeEnsembleClassifier", ["x"], ["y", "z"], domain=ML, **_tree())
    path = _save(tmp_path, [good], {"x": (F, [2, 3])}, {"y": (I64, [2]), "z": (F, [2, 2])}, "good")
    model = onnx.load(path)
    model.graph.node[0].attribute.remove(next(a for a in model.graph.node[0].attribute if a.name == "nodes_modes"))
    model.graph.node[0].attribute.append(h.make_attribute("nodes_modes", [1, 0, 0]))
    onnx.save(model, tmp_path / "bad.onnx")
    with pytest.raises(DlccError, match="attribute 'nodes_modes' must be STRINGS, not INTS"):
        dlcc.compile(tmp_path / "bad.onnx", target="opencl")
    model = onnx.load(path)
    assert large_attributes.stash_forests(model, "m")
    stand_in = {a.name: h.get_attribute_value(a) for a in model.graph.node[0].attribute}
    with pytest.raises(DlccError, match="lost its trees during the import"):
        large_attributes.with_forest(model.graph.node[0], stand_in, {}, "m")
