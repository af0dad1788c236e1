"""The simple ai.onnx.ml ops skl2onnx writes around a network (dlcc/ml_ops.py), each against
onnxruntime's CPU kernel on PoCL; and what stays unsupported is named."""
from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as h
import onnx.numpy_helper as nh
import pytest

import dlcc
from dlcc.errors import DlccError, UnsupportedOpsError

from conftest import opencl_device_available

needs_opencl = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")
F, I64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
ML = "ai.onnx.ml"


def _model(tmp_path, nodes, inputs, outputs, inits=None, name="m"):
    """`inputs` and `outputs`: {name: (elem type, shape)}."""
    g = h.make_graph(nodes, name, [h.make_tensor_value_info(k, t, s) for k, (t, s) in inputs.items()],
                     [h.make_tensor_value_info(k, t, s) for k, (t, s) in outputs.items()],
                     [nh.from_array(v, k) for k, v in (inits or {}).items()])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(ML, 1)])
    path = tmp_path / f"{name}.onnx"
    onnx.save(m, path)
    return path


def _check(path, feeds, pipeline="astitch", rtol=1e-6, atol=1e-7):
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    m = dlcc.compile(path, target="opencl", pipeline=pipeline)
    got = m(feeds)
    for o, ref in zip(sess.get_outputs(), sess.run(None, feeds)):
        assert got[o.name].shape == ref.shape and got[o.name].dtype == ref.dtype, o.name
        np.testing.assert_allclose(got[o.name], ref, rtol=rtol, atol=atol, err_msg=o.name)
    return m


@needs_opencl
def test_scaler_normalizer_binarizer(tmp_path):
    """Scaler with one offset and scale and with one per column, on float and int64 input;
    Normalizer's three norms, with a row of zeros (kept as it is), negative values and an
    all-negative row (MAX divides by its largest value, a negative one); Binarizer at its
    threshold and, where onnxruntime refuses, NaN."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    x[1] = 0
    x[3] = -np.abs(x[3])
    xi = rng.integers(-9, 9, (5, 4)).astype(np.int64)
    xb = x.copy()
    xb[2, 1] = 0.25  # on the threshold: not above it
    nodes = [h.make_node("Scaler", ["x"], ["s1"], domain=ML, offset=[0.5], scale=[2.0]),
             h.make_node("Scaler", ["xi"], ["s2"], domain=ML, offset=[0.1, -1, 2, 0], scale=[1, 0.5, -3, 4]),
             h.make_node("Normalizer", ["x"], ["nmax"], domain=ML, norm="MAX"),
             h.make_node("Normalizer", ["x"], ["nl1"], domain=ML, norm="L1"),
             h.make_node("Normalizer", ["xi"], ["nl2"], domain=ML, norm="L2"),
             h.make_node("Binarizer", ["xb"], ["b"], domain=ML, threshold=0.25)]
    shape = (F, [5, 4])
    path = _model(tmp_path, nodes, {"x": shape, "xi": (I64, [5, 4]), "xb": shape},
                  {o: shape for o in ("s1", "s2", "nmax", "nl1", "nl2", "b")})
    m = _check(path, {"x": x, "xi": xi, "xb": xb})
    xb[0, 0] = np.nan  # onnxruntime refuses NaN here; dlcc gives the spec's answer, not above: 0
    assert m({"x": x, "xi": xi, "xb": xb})["b"][0, 0] == 0


@needs_opencl
def test_a_float64_input_is_read_as_float_as_onnxruntime_reads_it(tmp_path):
    """skl2onnx's double pipelines: Scaler, Normalizer and LinearRegressor on a float64 X, which
    onnxruntime's ML kernels read as float; dlcc's float64 buffer feeds a Cast (tests/test_float64.py)."""
    x = np.random.default_rng(3).standard_normal((5, 3)) * 1e3
    nodes = [h.make_node("Scaler", ["x"], ["s"], domain=ML, offset=[1.0, 2.0, 3.0], scale=[0.5, 2.0, -1.0]),
             h.make_node("Normalizer", ["x"], ["n"], domain=ML, norm="L2"),
             h.make_node("LinearRegressor", ["s"], ["y"], domain=ML, coefficients=[1.0, 2.0, 3.0], intercepts=[0.5])]
    path = _model(tmp_path, nodes, {"x": (onnx.TensorProto.DOUBLE, [5, 3])},
                  {"s": (F, [5, 3]), "n": (F, [5, 3]), "y": (F, [5, 1])})
    _check(path, {"x": x}, rtol=1e-6, atol=1e-5)


@needs_opencl
def test_array_feature_extractor_and_linear_regressor(tmp_path):
    """skl2onnx's classifier tail: the class label is ArrayFeatureExtractor(classes, argmax), with
    indices computed at run time; constant columns of a 2-D and a 1-D X; LinearRegressor with
    two targets and intercepts, and with one target and none on a 1-D X."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 3)).astype(np.float32)
    inits = {"w": rng.standard_normal((3, 4)).astype(np.float32), "classes": np.array([3, 8, 1, 5], np.int64),
             "cols": np.array([[2, 0], [2, 1]], np.int64), "one": np.array([1], np.int64)}
    nodes = [h.make_node("MatMul", ["x", "w"], ["z"]), h.make_node("ArgMax", ["z"], ["am"], axis=1),
             h.make_node("ArrayFeatureExtractor", ["classes", "am"], ["label2"], domain=ML),
             h.make_node("Reshape", ["label2", "minus1"], ["label"]),
             h.make_node("ArrayFeatureExtractor", ["x", "cols"], ["picked"], domain=ML),
             h.make_node("ArrayFeatureExtractor", ["v", "one"], ["picked1"], domain=ML),
             h.make_node("LinearRegressor", ["x"], ["r2"], domain=ML, targets=2,
                         coefficients=rng.standard_normal(6).tolist(), intercepts=[0.5, -1.0]),
             h.make_node("LinearRegressor", ["v"], ["r1"], domain=ML, coefficients=[0.3, -2.0, 1.5])]
    inits["minus1"] = np.array([-1], np.int64)
    path = _model(tmp_path, nodes, {"x": (F, [6, 3]), "v": (F, [3])},
                  {"label": (I64, [6]), "picked": (F, [6, 4]), "picked1": (F, [1, 1]), "r2": (F, [6, 2]),
                   "r1": (F, [1, 1])}, inits)
    _check(path, {"x": x, "v": rng.standard_normal(3).astype(np.float32)})


@needs_opencl
def test_a_feature_index_outside_the_columns_is_an_error(tmp_path):
    """A constant index outside [0, C) at compile time; a computed one, negative too (onnxruntime
    refuses it rather than counting from the end), when the model runs."""
    path = _model(tmp_path, [h.make_node("ArrayFeatureExtractor", ["x", "i"], ["y"], domain=ML)],
                  {"x": (F, [2, 4])}, {"y": (F, [2, 1])}, {"i": np.array([4], np.int64)}, "const")
    with pytest.raises(DlccError, match=r"index 4 is outside \[0, 3\]"):
        dlcc.compile(path, target="opencl")
    path = _model(tmp_path, [h.make_node("ArrayFeatureExtractor", ["x", "i"], ["y"], domain=ML)],
                  {"x": (F, [2, 4]), "i": (I64, [1])}, {"y": (F, [2, 1])}, name="computed")
    m = dlcc.compile(path, target="opencl")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(m({"x": x, "i": np.array([3], np.int64)})["y"], x[:, 3:])
    for bad in (4, -1):
        with pytest.raises(DlccError, match="out of range|outside"):
            m({"x": x, "i": np.array([bad], np.int64)})


@needs_opencl
def test_linear_classifier(tmp_path):
    """Three classes through NONE, SOFTMAX and LOGISTIC (the label from the raw scores, the first
    largest on a tie); a binary model (one score, two labels: [1 - s, s], s through LOGISTIC
    where asked, and the second label above 0) on int64 and 1-D input; rows scoring exactly 0."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((7, 4)).astype(np.float32)
    x[5] = 0  # every score is its intercept: a tie between the first two classes
    coef3 = rng.standard_normal(12).tolist()
    nodes = [h.make_node("LinearClassifier", ["x"], [f"l_{p}", f"z_{p}"], domain=ML, coefficients=coef3,
                         intercepts=[0.2, 0.2, -0.1], classlabels_ints=[7, 3, 9], post_transform=p)
             for p in ("NONE", "SOFTMAX", "LOGISTIC")]
    coef1 = rng.standard_normal(4).tolist()
    nodes += [h.make_node("LinearClassifier", ["x"], [f"lb_{p}", f"zb_{p}"], domain=ML, coefficients=coef1,
                          intercepts=[0.0], classlabels_ints=[4, 6], post_transform=p) for p in ("NONE", "LOGISTIC")]
    nodes += [h.make_node("LinearClassifier", ["xi"], ["lbi", "zbi"], domain=ML, coefficients=coef1, intercepts=[0.5],
                          classlabels_ints=[0, 1], post_transform="SOFTMAX"),
              h.make_node("LinearClassifier", ["v"], ["lv", "zv"], domain=ML, coefficients=coef3, intercepts=[0.0, 1.0, 0.0],
                          classlabels_ints=[0, 1, 2])]
    outs = {f"l_{p}": (I64, [7]) for p in ("NONE", "SOFTMAX", "LOGISTIC")}
    outs.update({f"z_{p}": (F, [7, 3]) for p in ("NONE", "SOFTMAX", "LOGISTIC")})
    outs.update({f"lb_{p}": (I64, [7]) for p in ("NONE", "LOGISTIC")})
    outs.update({f"zb_{p}": (F, [7, 2]) for p in ("NONE", "LOGISTIC")})
    outs.update({"lbi": (I64, [7]), "zbi": (F, [7, 2]), "lv": (I64, [1]), "zv": (F, [1, 3])})
    path = _model(tmp_path, nodes, {"x": (F, [7, 4]), "xi": (I64, [7, 4]), "v": (F, [4])}, outs)
    _check(path, {"x": x, "xi": rng.integers(-3, 3, (7, 4)).astype(np.int64), "v": x[0]})


@needs_opencl
def test_linear_regressor_transforms(tmp_path):
    """onnxruntime applies a LinearRegressor's post_transform to several targets with its
    formulas, and to one target only PROBIT (LOGISTIC and the softmaxes leave one score as it
    is); scores kept near 0.5 so that PROBIT's are finite."""
    rng = np.random.default_rng(4)
    x = (0.3 * rng.standard_normal((12, 3))).astype(np.float32)
    posts = ("LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT")
    nodes, outs = [], {}
    for targets in (1, 3):
        for p in posts:
            coef = (0.3 * rng.standard_normal(3 * targets)).astype(np.float32).tolist()
            nodes.append(h.make_node("LinearRegressor", ["x"], [f"y{targets}_{p}"], domain=ML, coefficients=coef,
                                     intercepts=[0.5] * targets, targets=targets, post_transform=p))
            outs[f"y{targets}_{p}"] = (F, [12, targets])
    path = _model(tmp_path, nodes, {"x": (F, [12, 3])}, outs)
    _check(path, {"x": x}, rtol=1e-5, atol=2e-6)  # (PROBIT: see test_linear_classifier_transforms)


@needs_opencl
def test_linear_classifier_transforms(tmp_path):
    """Every post_transform with onnxruntime's formulas: three classes through LOGISTIC (mirrored
    below 0), SOFTMAX_ZERO (a class scoring exactly 0 is left out of the sum) and PROBIT (its
    ErfInv approximation; scores kept inside (0, 1), NaN outside it, as onnxruntime gives); a
    binary model through SOFTMAX and SOFTMAX_ZERO, which onnxruntime does not apply to one score."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, 4)).astype(np.float32)
    wide = (2 * rng.standard_normal(12)).astype(np.float32)
    wide[:4] = 0  # class 0 scores exactly 0 (its intercept too)
    narrow = (0.1 * rng.standard_normal(12)).astype(np.float32).tolist()
    nodes = [h.make_node("LinearClassifier", ["x"], [f"l_{p}", f"z_{p}"], domain=ML, coefficients=wide.tolist(),
                         intercepts=[0.0, 0.4, -0.3], classlabels_ints=[1, 2, 3], post_transform=p)
             for p in ("LOGISTIC", "SOFTMAX_ZERO")]
    nodes += [h.make_node("LinearClassifier", ["x"], ["l_PROBIT", "z_PROBIT"], domain=ML, coefficients=narrow,
                          intercepts=[0.5, 0.3, 0.95], classlabels_ints=[1, 2, 3], post_transform="PROBIT")]
    nodes += [h.make_node("LinearClassifier", ["x"], [f"lb_{p}", f"zb_{p}"], domain=ML, coefficients=wide[4:8].tolist(),
                          intercepts=[0.1], classlabels_ints=[5, 8], post_transform=p) for p in ("SOFTMAX", "SOFTMAX_ZERO")]
    outs = {f"l_{p}": (I64, [16]) for p in ("LOGISTIC", "SOFTMAX_ZERO", "PROBIT")}
    outs.update({f"z_{p}": (F, [16, 3]) for p in ("LOGISTIC", "SOFTMAX_ZERO", "PROBIT")})
    outs.update({f"lb_{p}": (I64, [16]) for p in ("SOFTMAX", "SOFTMAX_ZERO")})
    outs.update({f"zb_{p}": (F, [16, 2]) for p in ("SOFTMAX", "SOFTMAX_ZERO")})
    path = _model(tmp_path, nodes, {"x": (F, [16, 4])}, outs)
    # (PROBIT's log and square roots round apart from onnxruntime's by an ulp or two, and the
    # approximation amplifies that to about 2e-6)
    _check(path, {"x": x}, rtol=1e-5, atol=2e-6)


def test_the_ml_ops_dlcc_lacks_are_named(tmp_path):
    nodes = [h.make_node("Scaler", ["x"], ["s"], domain=ML, offset=[0.0], scale=[1.0]),
             h.make_node("LinearClassifier", ["s"], ["label", "scores"], domain=ML, coefficients=[1.0] * 4,
                         intercepts=[0.0], classlabels_ints=[0, 1], post_transform="PROBIT"),
             h.make_node("CategoryMapper", ["i"], ["r"], domain=ML, cats_int64s=[1, 2], cats_strings=["a", "b"])]
    path = _model(tmp_path, [nodes[0], nodes[2]], {"x": (F, [3, 4]), "i": (I64, [3])},
                  {"s": (F, [3, 4]), "r": (onnx.TensorProto.STRING, [3])})
    with pytest.raises(UnsupportedOpsError, match="ai.onnx.ml::CategoryMapper") as e:
        dlcc.compile(path, target="opencl")
    assert "Scaler" not in str(e.value)
    path = _model(tmp_path, nodes[:2], {"x": (F, [3, 4])}, {"label": (I64, [3]), "scores": (F, [3, 2])}, name="probit")
    with pytest.raises(DlccError, match="PROBIT for one score"):
        dlcc.compile(path, target="opencl")
    bad = _model(tmp_path, [h.make_node("Scaler", ["x"], ["s"], domain=ML, offset=[0.0, 1.0], scale=[1.0])],
                 {"x": (F, [3, 4])}, {"s": (F, [3, 4])}, name="bad")
    with pytest.raises(DlccError, match="must both hold 1 value or one per column"):
        dlcc.compile(bad, target="opencl")


@needs_opencl
def test_imputer_feature_vectorizer_one_hot_encoder(tmp_path):
    """The preprocessing of a scikit-learn ColumnTransformer: Imputer replacing NaN (one value per
    column, and one for all) and an int64 value; FeatureVectorizer joining float and 3-D inputs,
    and int64 ones, cut short and padded with zeros; OneHotEncoder of int64 and float values (converted
    to int64 as onnxruntime does: 2.7 is category 2), a repeated category (the last counts) and
    unknown values (a row of zeros)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 3)).astype(np.float32)
    x[[0, 2, 5], [1, 0, 2]] = np.nan
    xi = rng.integers(-1, 4, (6, 2)).astype(np.int64)
    x3 = rng.standard_normal((6, 2, 2)).astype(np.float32)
    cats = rng.choice([0.0, 1.0, 2.7, -1.2, 3.5, 9.0], (6,)).astype(np.float32)
    nodes = [h.make_node("Imputer", ["x"], ["imp"], domain=ML, imputed_value_floats=[0.5, -1.0, 2.0],
                         replaced_value_float=float("nan")),
             h.make_node("Imputer", ["x"], ["imp1"], domain=ML, imputed_value_floats=[7.0], replaced_value_float=float("nan")),
             h.make_node("Imputer", ["xi"], ["impi"], domain=ML, imputed_value_int64s=[5, 6], replaced_value_int64=0),
             h.make_node("FeatureVectorizer", ["imp", "x", "x3"], ["fv"], domain=ML, inputdimensions=[2, 3, 4]),
             h.make_node("FeatureVectorizer", ["xi", "impi"], ["fvi"], domain=ML, inputdimensions=[1, 3]),
             h.make_node("OneHotEncoder", ["xi"], ["ohe"], domain=ML, cats_int64s=[0, 1, 2, 1], zeros=1),
             h.make_node("OneHotEncoder", ["c"], ["ohef"], domain=ML, cats_int64s=[2, 0, -1, 3], zeros=1)]
    outs = {"imp": (F, [6, 3]), "imp1": (F, [6, 3]), "impi": (I64, [6, 2]), "fv": (F, [6, 9]),
            "fvi": (F, [6, 4]), "ohe": (F, [6, 2, 4]), "ohef": (F, [6, 4])}
    path = _model(tmp_path, nodes, {"x": (F, [6, 3]), "xi": (I64, [6, 2]), "x3": (F, [6, 2, 2]), "c": (F, [6])}, outs)
    _check(path, {"x": x, "xi": xi, "x3": x3, "c": cats})


@needs_opencl
def test_one_hot_encoder_without_zeros_refuses_an_unknown_category(tmp_path):
    """zeros=0 (scikit-learn's handle_unknown='error'): known values encode, and an unknown one
    is an error at run time, as onnxruntime's."""
    path = _model(tmp_path, [h.make_node("OneHotEncoder", ["x"], ["y"], domain=ML, cats_int64s=[3, 5], zeros=0)],
                  {"x": (I64, [4])}, {"y": (F, [4, 2])})
    m = dlcc.compile(path, target="opencl")
    np.testing.assert_array_equal(m({"x": np.array([3, 5, 5, 3], np.int64)})["y"], [[1, 0], [0, 1], [0, 1], [1, 0]])
    with pytest.raises(DlccError, match="out of range|outside"):
        m({"x": np.array([3, 4, 5, 3], np.int64)})


@needs_opencl
def test_svm_regressor(tmp_path):
    """SVR's four kernels (RBF, LINEAR, POLY of degree 3 and 2.5, SIGMOID) over support vectors,
    a linear SVR without them, and OneClassSVM's sign, against onnxruntime. (To 1e-5: onnxruntime
    forms the kernels' dot products with MLAS's blocked GEMM, whose sums run in another order
    than dlcc's MatMul; the cube then triples their rounding.)"""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((7, 4)).astype(np.float32)
    sv = rng.standard_normal(5 * 4).tolist()
    coef = rng.standard_normal(5).tolist()

    def svr(out, kernel, params, **kw):
        return h.make_node("SVMRegressor", ["x"], [out], domain=ML, kernel_type=kernel, kernel_params=params,
                           rho=[0.3], **kw)

    nodes = [svr("rbf", "RBF", [0.4, 0.0, 3.0], coefficients=coef, support_vectors=sv, n_supports=5),
             svr("lin", "LINEAR", [0.4, 0.0, 3.0], coefficients=coef, support_vectors=sv, n_supports=5),
             svr("poly3", "POLY", [0.4, 0.5, 3.0], coefficients=coef, support_vectors=sv, n_supports=5),
             svr("poly", "POLY", [0.1, 3.0, 2.5], coefficients=coef, support_vectors=sv, n_supports=5),
             svr("sig", "SIGMOID", [0.2, -0.1, 3.0], coefficients=coef, support_vectors=sv, n_supports=5),
             svr("plain", "LINEAR", [0.0, 0.0, 0.0], coefficients=coef[:4], n_supports=0),
             svr("one", "RBF", [0.4, 0.0, 3.0], coefficients=coef, support_vectors=sv, n_supports=5, one_class=1)]
    path = _model(tmp_path, nodes, {"x": (F, [7, 4])}, {n.output[0]: (F, [7, 1]) for n in nodes})
    _check(path, {"x": x}, rtol=1e-5, atol=1e-6)


@needs_opencl
def test_svm_classifier(tmp_path):
    """SVC one-vs-one: three classes (RBF, and SIGMOID through SOFTMAX over the pairs' scores) and
    two (LINEAR: [-s, s]; POLY through LOGISTIC: [L(-s), L(s)]; RBF through SOFTMAX:
    [1 - s, s]), labels by votes, against
    onnxruntime: labels exactly, scores to 1e-4 (onnxruntime sums each pair in double, dlcc in
    float32). Probability estimates are refused as unsupported."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((9, 3)).astype(np.float32)

    def svc(out, kernel, per_class, labels, **kw):
        v = sum(per_class)
        return h.make_node("SVMClassifier", ["x"], [out, out + "_s"], domain=ML, kernel_type=kernel,
                           kernel_params=[0.5, 0.2, 3.0], vectors_per_class=per_class, classlabels_ints=labels,
                           support_vectors=rng.standard_normal(v * 3).tolist(),
                           coefficients=rng.standard_normal((len(labels) - 1) * v).tolist(),
                           rho=rng.standard_normal(len(labels) * (len(labels) - 1) // 2).tolist(), **kw)

    nodes = [svc("rbf", "RBF", [2, 3, 2], [0, 1, 2]), svc("sig", "SIGMOID", [1, 2, 2], [5, 6, 7], post_transform="SOFTMAX"),
             svc("lin", "LINEAR", [3, 2], [4, 9]), svc("poly", "POLY", [2, 2], [0, 1], post_transform="LOGISTIC"),
             svc("soft2", "RBF", [1, 2], [3, 2], post_transform="SOFTMAX")]
    outs = {}
    for n in nodes:
        k = len(h.get_attribute_value(n.attribute[[a.name for a in n.attribute].index("classlabels_ints")]))
        outs.update({n.output[0]: (I64, [9]), n.output[1]: (F, [9, k * (k - 1) // 2 if k > 2 else 2])})
    path = _model(tmp_path, nodes, {"x": (F, [9, 3])}, outs)
    _check(path, {"x": x}, rtol=1e-4, atol=1e-5)
    prob = _model(tmp_path, [svc("p", "RBF", [2, 2], [0, 1], prob_a=[1.0], prob_b=[0.0])], {"x": (F, [9, 3])},
                  {"p": (I64, [9]), "p_s": (F, [9, 2])}, name="prob")
    with pytest.raises(DlccError, match="probability estimates"):
        dlcc.compile(prob, target="opencl")


@needs_opencl
def test_label_encoder(tmp_path):
    """Numeric LabelEncoders against onnxruntime: int64 keys to float values (a repeated key: the
    first counts; unknown keys: default_float, and -0.0 by default) and float keys to int64
    values (-0.0 finds the key 0.0; the default -1), at opset 2; opset 4's tensor attributes.
    String keys are refused as unsupported."""
    import onnx.numpy_helper as nh2

    xi = np.array([[1, 5, 3], [7, 1, 0]], np.int64)
    xf = np.array([0.5, -0.0, 2.0, np.nan, 1.5], np.float32)
    nodes = [h.make_node("LabelEncoder", ["xi"], ["a"], domain=ML, keys_int64s=[1, 3, 1, 7], values_floats=[0.5, 1.5, 9.0, -2.0],
                         default_float=4.0),
             h.make_node("LabelEncoder", ["xi"], ["b"], domain=ML, keys_int64s=[3], values_floats=[1.0]),
             h.make_node("LabelEncoder", ["xf"], ["c"], domain=ML, keys_floats=[0.5, 0.0, 1.5], values_int64s=[10, 20, 30])]
    outs = {"a": (F, [2, 3]), "b": (F, [2, 3]), "c": (I64, [5])}
    g = h.make_graph(nodes, "le", [h.make_tensor_value_info("xi", I64, [2, 3]), h.make_tensor_value_info("xf", F, [5])],
                     [h.make_tensor_value_info(k, t, s) for k, (t, s) in outs.items()])
    path = tmp_path / "le.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(ML, 2)]), path)
    _check(path, {"xi": xi, "xf": xf})
    t4 = h.make_node("LabelEncoder", ["xi"], ["d"], domain=ML, keys_tensor=nh2.from_array(np.array([5, 0], np.int64)),
                     values_tensor=nh2.from_array(np.array([2, 4], np.int64)),
                     default_tensor=nh2.from_array(np.array([8], np.int64)))
    g = h.make_graph([t4], "le4", [h.make_tensor_value_info("xi", I64, [2, 3])], [h.make_tensor_value_info("d", I64, [2, 3])])
    path4 = tmp_path / "le4.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(ML, 4)]), path4)
    _check(path4, {"xi": xi})
    s = h.make_node("LabelEncoder", ["xi"], ["e"], domain=ML, keys_int64s=[1], values_strings=["one"])
    g = h.make_graph([s], "les", [h.make_tensor_value_info("xi", I64, [2, 3])],
                     [h.make_tensor_value_info("e", onnx.TensorProto.STRING, [2, 3])])
    paths = tmp_path / "les.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(ML, 2)]), paths)
    with pytest.raises(DlccError, match="string keys or values"):
        dlcc.compile(paths, target="opencl")
