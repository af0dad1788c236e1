"""The simple ops of the `ai.onnx.ml` domain, written as standard ops at import (composite.py runs
them with its own rewrites): Scaler, Normalizer, Binarizer, ArrayFeatureExtractor,
LinearRegressor, LinearClassifier, Imputer, FeatureVectorizer, OneHotEncoder, LabelEncoder,
SVMRegressor and SVMClassifier.

Why: skl2onnx writes scikit-learn pipelines with them around the part that is a neural network,
a linear model or a forest: a StandardScaler before an MLPClassifier is a Scaler, the class
label after its argmax an ArrayFeatureExtractor of the classes, and a ColumnTransformer's
SimpleImputer and OneHotEncoder an Imputer, OneHotEncoders and a Concat. Each is a line or two of standard ops, which
AStitch fuses with the MatMuls around them, so the whole pipeline compiles to one plan instead of
running those nodes on onnxruntime (--fallback). Each body follows onnxruntime's CPU kernel:
inputs of any of its numeric types are converted to float32 first, and the arithmetic is its
float32 arithmetic.

The tree ensembles are in ml_trees.py. The other ML ops (the string encoders, CategoryMapper,
ZipMap's sequence of maps, DictVectorizer) and LinearClassifier's string labels and rarer score
transforms stay unsupported, listed by name; `--fallback onnxruntime` runs them there.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from .fused_ops import _Builder
from .ml_trees import TRANSFORMS, TREE_REWRITES, elem_name, logistic, score_transform, text_attr

_F, _I64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
ML = "ai.onnx.ml"


def _numeric(b: _Builder, x: str) -> int:
    """X's element type, one of the float, double, int64 and int32 the ML kernels take."""
    elem = b.elem(x)
    if elem not in (_F, onnx.TensorProto.DOUBLE, _I64, onnx.TensorProto.INT32):
        raise b.fail(f"input type {elem_name(elem)} is not float, double, int64 or int32")
    return elem


def _as_float(b: _Builder, x: str) -> str:
    """X as float32, as onnxruntime's ML kernels read their float, double, int64 or int32 inputs."""
    return x if _numeric(b, x) == _F else b.op("Cast", [x], to=_F)


def _as_rows(b: _Builder, x: str, shape: tuple) -> str:
    """X as float32 rows: [N, C] as it is, [C] as [1, C] (the ML kernels read a 1-D X as one row)."""
    xf = _as_float(b, x)
    return xf if len(shape) == 2 else b.op("Reshape", [xf, b.ints(1, shape[-1])])


def _scores(b: _Builder, x: str, shape: tuple, coef: np.ndarray, rows: int, inter: np.ndarray | None) -> str:
    """X (float32, [N, C] or [C] as [1, C]) · coef [rows, C]ᵀ + inter: the linear models' scores."""
    c = shape[-1]
    y = b.op("MatMul", [_as_rows(b, x, shape), b.constant(coef.reshape(rows, c).T.copy())])
    return y if inter is None else b.op("Add", [y, b.constant(inter)])


def _rank_1_or_2(b: _Builder, x: str) -> tuple[int, ...]:
    shape = b.shape(x)
    if len(shape) not in (1, 2):
        raise b.fail(f"the input must be [C] or [N, C], not of shape {list(shape)}")
    return shape


def _floats(b: _Builder, name: str) -> np.ndarray:
    v = b.attrs.get(name)
    if v is None or not len(v):
        raise b.fail(f"attribute {name!r} is required and must not be empty")
    return np.asarray(v, np.float32)


def _scaler(b: _Builder) -> None:
    """Y = (X - offset) * scale, one offset and scale for every value or one per column."""
    x = b.node.input[0]
    shape = _rank_1_or_2(b, x)
    offset, scale = _floats(b, "offset"), _floats(b, "scale")
    c = shape[-1]
    if not (offset.size == scale.size == 1 or offset.size == scale.size == c):
        raise b.fail(f"offset ({offset.size} values) and scale ({scale.size}) must both hold 1 value or one per "
                     f"column ({c})")
    shifted = b.op("Sub", [_as_float(b, x), b.constant(offset.reshape(-1) if offset.size > 1 else offset[0])])
    b.op("Mul", [shifted, b.constant(scale.reshape(-1) if scale.size > 1 else scale[0])], b.node.output[0])


def _normalizer(b: _Builder) -> None:
    """Each row divided by its maximum (MAX, the largest value, not the largest magnitude), by the
    sum of its magnitudes (L1), or by its Euclidean norm (L2, as sign(x)·sqrt(x² / Σx²)); a row
    whose divisor is 0 is kept as it is."""
    x = b.node.input[0]
    _rank_1_or_2(b, x)
    norm = text_attr(b, "norm", "MAX")
    xf = _as_float(b, x)
    zero = b.constant(np.float32(0))
    if norm == "MAX":
        d = b.reduce("ReduceMax", xf, [-1])
        y = b.op("Div", [xf, d])
    elif norm == "L1":
        d = b.reduce("ReduceSum", b.op("Abs", [xf]), [-1])
        y = b.op("Div", [xf, d])
    elif norm == "L2":
        sq = b.op("Mul", [xf, xf])
        d = b.reduce("ReduceSum", sq, [-1])
        mag = b.op("Sqrt", [b.op("Div", [sq, d])])
        y = b.op("Where", [b.op("Less", [xf, zero]), b.op("Neg", [mag]), mag])
    else:
        raise b.fail(f"norm {norm!r} is not MAX, L1 or L2")
    b.op("Where", [b.op("Equal", [d, zero]), xf, y], b.node.output[0])


def _binarizer(b: _Builder) -> None:
    """Y = 1 where X > threshold, else 0, in X's type. A NaN is not above the threshold, so gives 0,
    as the spec reads; onnxruntime refuses an input holding NaN instead."""
    x = b.node.input[0]
    np_type = onnx.helper.tensor_dtype_to_np_dtype(_numeric(b, x))
    t = b.constant(np.asarray(float(b.attr("threshold", 0.0))).astype(np_type), np_type)
    hit = b.op("Greater", [x, t])
    b.op("Where", [hit, b.constant(np.ones((), np_type), np_type), b.constant(np.zeros((), np_type), np_type)],
         b.node.output[0])


def _array_feature_extractor(b: _Builder) -> None:
    """The columns Y of X along its last axis: X's shape with the last dim replaced by the number
    of indices ([1, n] for a 1-D X). An index outside [0, C) is an error, as in onnxruntime: a
    negative one is moved out of range, so the Gather's index check reports it instead of
    counting it from the end."""
    x, y = b.node.input[0], b.node.input[1]
    shape = b.shape(x)
    if not shape:
        raise b.fail("X must have at least one dimension")
    if b.elem(y) != _I64:
        raise b.fail("Y (the indices) must be int64")
    c = shape[-1]
    idx = b.op("Reshape", [y, b.ints(-1)])
    given = b.const(y)
    if given is not None:
        bad = np.asarray(given).reshape(-1)
        bad = bad[(bad < 0) | (bad >= c)]
        if bad.size:
            raise b.fail(f"index {int(bad[0])} is outside [0, {c - 1}] for the {c} columns of X")
    else:
        idx = b.op("Where", [b.op("Less", [idx, b.constant(np.int64(0), np.int64)]),
                             b.constant(np.int64(c), np.int64), idx])
    out = b.node.output[0]
    if len(shape) == 1:
        b.unsqueeze(b.op("Gather", [x, idx], axis=0), [0], out)
    else:
        b.op("Gather", [x, idx], out, axis=len(shape) - 1)


def _linear_regressor(b: _Builder) -> None:
    """Y = X · coefficientsᵀ + intercepts, [N, targets] in float32 ([1, targets] for a 1-D X),
    through the post_transform as onnxruntime applies it: to several targets with its formulas
    (ml_trees.score_transform), to one target PROBIT only (the others leave one score as it is)."""
    x = b.node.input[0]
    shape = _rank_1_or_2(b, x)
    post = text_attr(b, "post_transform", "NONE")
    if post not in TRANSFORMS:
        raise b.fail(f"post_transform {post!r} is not one of {', '.join(TRANSFORMS)}")
    targets = int(b.attr("targets", 1))
    coef = _floats(b, "coefficients")
    c = shape[-1]
    if targets < 1 or coef.size != targets * c:
        raise b.fail(f"coefficients hold {coef.size} values, not targets ({targets}) x columns ({c})")
    inter = b.attrs.get("intercepts")
    inter = np.asarray(inter, np.float32) if inter is not None and len(inter) else None
    if inter is not None and inter.size != targets:
        raise b.fail(f"intercepts hold {inter.size} values, not one per target ({targets})")
    y = _scores(b, x, shape, coef, targets, inter)
    b.op("Identity", [score_transform(b, y, post) if targets > 1 or post == "PROBIT" else y], b.node.output[0])


def _linear_classifier(b: _Builder) -> None:
    """Scores X · coefficientsᵀ + intercepts, one per class, then a label and the transformed
    scores as onnxruntime gives them:

    - several classes: the label of the first largest score (before the transform); scores
      through the transform, onnxruntime's formulas (ml_trees.score_transform: LOGISTIC
      mirrored for negative scores, SOFTMAX_ZERO, PROBIT's ErfInv approximation);
    - one class with two labels (a binary model): the second label where the score is above 0,
      else the first; scores [1 - s, s], with s the score through LOGISTIC where that is the
      transform and the raw score otherwise (onnxruntime applies neither SOFTMAX nor
      SOFTMAX_ZERO to one score).

    String labels (a string output), and PROBIT on one score (onnxruntime 1.32 packs one score
    per row into the first rows of its two-column output) are refused as unsupported."""
    x = b.node.input[0]
    shape = _rank_1_or_2(b, x)
    if b.attrs.get("classlabels_strings"):
        raise b.unsupported("string class labels (a string output)")
    post = text_attr(b, "post_transform", "NONE")
    if post not in TRANSFORMS:
        raise b.fail(f"post_transform {post!r} is not one of {', '.join(TRANSFORMS)}")
    inter = _floats(b, "intercepts")
    coef = _floats(b, "coefficients")
    classes, c = inter.size, shape[-1]
    if coef.size != classes * c:
        raise b.fail(f"coefficients hold {coef.size} values, not classes ({classes}, one per intercept) x "
                     f"columns ({c})")
    if post == "PROBIT" and classes == 1:
        raise b.unsupported("PROBIT for one score (onnxruntime packs one score per row into the first rows "
                            "of its two-column output)")
    labels = np.asarray(b.attrs.get("classlabels_ints") or [], np.int64)
    if labels.size != (2 if classes == 1 else classes):
        raise b.fail(f"classlabels_ints must hold {2 if classes == 1 else classes} labels for {classes} "
                     f"class{'es' if classes > 1 else ''}, not {labels.size}")
    score = _scores(b, x, shape, coef, classes, inter)
    label_out, scores_out = b.node.output[0], (b.node.output[1] if len(b.node.output) > 1 else "")
    if classes == 1:
        flat = b.op("Reshape", [score, b.ints(-1)])
        above = b.op("Greater", [flat, b.constant(np.float32(0))])
        b.op("Where", [above, b.constant(labels[1], np.int64), b.constant(labels[0], np.int64)], label_out)
        if scores_out:
            p = logistic(b, score) if post == "LOGISTIC" else score
            b.op("Concat", [b.op("Sub", [b.constant(np.float32(1)), p]), p], scores_out, axis=1)
        return
    best = b.op("ArgMax", [score], axis=1, keepdims=0)
    b.op("Gather", [b.constant(labels, np.int64), best], label_out, axis=0)
    if scores_out:
        b.op("Identity", [score_transform(b, score, post)], scores_out)


def _imputer(b: _Builder) -> None:
    """Y = X with the values equal to replaced_value_float (NaN: every NaN) or
    replaced_value_int64 replaced by the imputed value of their column, or by the first imputed
    value where there are not one per column (onnxruntime's reading). float32 and int64 X, the
    types onnxruntime has kernels for; [C] or [N, C]."""
    x = b.node.input[0]
    shape = _rank_1_or_2(b, x)
    elem = b.elem(x)
    floats, ints = b.attrs.get("imputed_value_floats") or [], b.attrs.get("imputed_value_int64s") or []
    if bool(floats) == bool(ints):
        raise b.fail("exactly one of imputed_value_floats and imputed_value_int64s must be given")
    if elem not in (_F, _I64):
        raise b.unsupported(f"input type {elem_name(elem)} (onnxruntime's Imputer takes float and int64)")
    values = np.asarray(floats if elem == _F else ints, np.float32 if elem == _F else np.int64)
    if not values.size:
        raise b.fail(f"the imputed values for {'a float' if elem == _F else 'an int64'} input "
                     f"(imputed_value_{'floats' if elem == _F else 'int64s'}) are not given")
    if values.size != shape[-1]:
        values = values[:1]
    dtype = values.dtype
    if elem == _F:
        replaced = np.float32(b.attr("replaced_value_float", 0.0))
        hit = b.op("IsNaN", [x]) if np.isnan(replaced) else b.op("Equal", [x, b.constant(replaced)])
    else:
        hit = b.op("Equal", [x, b.constant(np.int64(b.attr("replaced_value_int64", 0)), np.int64)])
    fill = b.constant(values if values.size > 1 else values[0], dtype)
    b.op("Where", [hit, fill, x], b.node.output[0])


def _feature_vectorizer(b: _Builder) -> None:
    """Y [N, sum(inputdimensions)] float32: each input's first inputdimensions[i] values per row
    (fewer: the rest 0), converted to float, side by side. Every input has the same N rows."""
    dims = [int(d) for d in b.attr("inputdimensions", [])]
    ins = list(b.node.input)
    if len(dims) != len(ins) or not ins or any(d < 0 for d in dims):
        raise b.fail(f"inputdimensions ({dims}) must give one size, 0 or more, per input ({len(ins)})")
    shapes = [b.shape(i) for i in ins]
    if len({_numeric(b, i) for i in ins}) > 1:
        raise b.fail("the inputs must all have one element type (the schema's T1)")
    rows = {1 if len(s) <= 1 else s[0] for s in shapes}
    if len(rows) != 1:
        raise b.fail(f"the inputs have different numbers of rows ({sorted(rows)})")
    n = rows.pop()
    if n * sum(dims) >= 2**31:
        raise b.unsupported(f"an output of {n} x {sum(dims)} values (2^31 or more)")
    parts = []
    for i, shape, d in zip(ins, shapes, dims):
        size = int(np.prod(shape[1:] if len(shape) > 1 else shape))
        flat = b.op("Reshape", [_as_float(b, i), b.ints(n, size)])
        keep = min(size, d)
        if keep:
            parts.append(flat if keep == size else b.slice(flat, 0, keep, 1))
        if d > keep:
            parts.append(b.op("ConstantOfShape", [b.ints(n, d - keep)],
                              value=numpy_helper.from_array(np.zeros(1, np.float32))))
    if not parts:
        raise b.fail("the output would have no columns")
    if len(parts) > 1:
        b.op("Concat", parts, b.node.output[0], axis=1)
    else:
        b.op("Identity", parts, b.node.output[0])


def _one_hot_encoder(b: _Builder) -> None:
    """Y = X.shape + [categories] float32: 1 where a value (converted to int64, as onnxruntime's
    kernel converts a float) equals the category (the last of equal categories), else 0. A value
    outside the categories is a row of zeros with `zeros` 1, and an error at run time with
    `zeros` 0: its index is moved out of range, so a Gather's index check reports it. Integer
    categories; [C] or [N, C] X of float or int64 (double, which onnxruntime also takes, is not
    held by dlcc; onnxruntime has no int32 kernel)."""
    x = b.node.input[0]
    _rank_1_or_2(b, x)
    if b.attrs.get("cats_strings"):
        raise b.unsupported("string categories (a string input)")
    cats = np.asarray(b.attrs.get("cats_int64s") or [], np.int64)
    if not cats.size:
        raise b.fail("cats_int64s (or cats_strings) is required and must not be empty")
    if b.elem(x) not in (_F, _I64):
        raise b.unsupported(f"input type {elem_name(b.elem(x))} (onnxruntime's OneHotEncoder takes float, double, "
                            "int64 and strings)")
    last = {int(c): k for k, c in enumerate(cats)}  # (a repeated category: the last one counts)
    column = np.array([last[int(c)] == k for k, c in enumerate(cats)])
    xi = x if b.elem(x) == _I64 else b.op("Cast", [x], to=_I64)
    hit = b.op("And", [b.op("Equal", [b.unsqueeze(xi, [-1]), b.constant(cats, np.int64)]),
                       b.constant(column, np.bool_)])
    y = b.op("Cast", [hit], to=_F)
    if int(b.attr("zeros", 1)) == 0:  # an unknown category is an error: an index past the table
        known = b.op("Cast", [b.reduce("ReduceMax", b.op("Cast", [hit], to=_I64), [-1])], to=onnx.TensorProto.BOOL)
        idx = b.op("Where", [known, b.constant(np.int64(0), np.int64), b.constant(np.int64(1), np.int64)])
        checked = b.op("Gather", [b.constant(np.zeros(1, np.float32)), idx], axis=0)  # [..., 1] of 0
        y = b.op("Add", [y, checked])
    b.op("Identity", [y], b.node.output[0])


def _svm_kernel(b: _Builder, xf: str, c: int) -> tuple[str, np.ndarray]:
    """K [N, vectors]: the SVM kernel of each row of xf ([N, C] float32) with each support vector,
    as onnxruntime's SVMCommon computes it: RBF exp(-gamma · Σ (x - sv)²), LINEAR x · sv,
    POLY (gamma · x · sv + coef0)^degree, SIGMOID tanh(gamma · x · sv + coef0), with
    kernel_params = [gamma, coef0, degree]. Also returns the support vectors [vectors, C]."""
    kernel = text_attr(b, "kernel_type", "LINEAR")
    if kernel not in ("LINEAR", "POLY", "RBF", "SIGMOID"):
        raise b.fail(f"kernel_type {kernel!r} is not LINEAR, POLY, RBF or SIGMOID")
    params = np.asarray(b.attrs.get("kernel_params") or [], np.float32)
    if params.size < 3:  # (onnxruntime requires the attribute too)
        raise b.fail(f"kernel_params must hold gamma, coef0 and degree, not {params.size} value(s)")
    gamma, coef0, degree = (np.float32(v) for v in params[:3])
    sv = np.asarray(b.attrs.get("support_vectors") or [], np.float32)
    count = sv.size // c if c else 0
    if not count or sv.size != count * c:
        raise b.fail(f"support_vectors hold {sv.size} values, not whole vectors of the input's {c} features")
    sv = sv.reshape(count, c)
    if kernel == "RBF":
        diff = b.op("Sub", [b.unsqueeze(xf, [1]), b.constant(sv.reshape(1, count, c))])
        dist = b.reduce("ReduceSum", b.op("Mul", [diff, diff]), [2])
        return b.op("Exp", [b.op("Mul", [b.op("Reshape", [dist, b.ints(-1, count)]), b.constant(-gamma)])]), sv
    k = b.op("MatMul", [xf, b.constant(sv.T.copy())])
    if kernel == "LINEAR":
        return k, sv
    k = b.op("Add", [b.op("Mul", [k, b.constant(gamma)]), b.constant(coef0)])
    if kernel == "SIGMOID":
        return b.op("Tanh", [k]), sv
    if degree == 2:
        return b.op("Mul", [k, k]), sv
    if degree == 3:
        return b.op("Mul", [b.op("Mul", [k, k]), k]), sv
    return b.op("Pow", [k, b.constant(degree)]), sv


def _svm_regressor(b: _Builder) -> None:
    """Y [N, 1] = Σ_s coefficients[s] · K(x, support vector s) + rho[0] (n_supports > 0: SVR,
    NuSVR, OneClassSVM), or X · coefficientsᵀ + rho[0] (no support vectors: a linear SVR), as
    onnxruntime's kernel computes them (_svm_kernel); one_class: 1 where the value is above 0,
    else -1. post_transform is read and not applied (onnxruntime's kernel ignores it). float32 X
    only (onnxruntime has no other kernel); [C] or [N, C]."""
    x = b.node.input[0]
    shape = _rank_1_or_2(b, x)
    if b.elem(x) != _F:
        raise b.unsupported(f"input type {elem_name(b.elem(x))} (onnxruntime's SVMRegressor takes float)")
    coef, rho = _floats(b, "coefficients"), _floats(b, "rho")
    count, c = int(b.attr("n_supports", 0)), shape[-1]
    xf = _as_rows(b, x, shape)
    if count > 0:
        k, sv = _svm_kernel(b, xf, c)
        if sv.shape[0] != count or coef.size != count:
            raise b.fail(f"support_vectors ({sv.shape[0]} of {c} features) and coefficients ({coef.size}) must "
                         f"hold n_supports ({count}) vectors and one coefficient each")
        y = b.op("Add", [b.op("MatMul", [k, b.constant(coef.reshape(count, 1))]), b.constant(rho[:1])])
    else:
        if coef.size != c:
            raise b.fail(f"coefficients hold {coef.size} values, not one per feature ({c})")
        y = b.op("Add", [b.op("MatMul", [xf, b.constant(coef.reshape(c, 1))]), b.constant(rho[:1])])
    if int(b.attr("one_class", 0)):
        y = b.op("Where", [b.op("Greater", [y, b.constant(np.float32(0))]), b.constant(np.float32(1)),
                           b.constant(np.float32(-1))])
    b.op("Identity", [y], b.node.output[0])


def _svm_classifier(b: _Builder) -> None:
    """An SVC without probability estimates, as onnxruntime's SVMClassifier computes it: each
    pair of classes (i < j) scores Σ coef · K over both classes' support vectors + rho, a vote
    goes to i where that is above 0 and to j otherwise, and the label is the first class with
    the most votes. The scores are the pairs' (through the transform over the pairs), or for two
    classes [-s, s] (NONE), [L(-s), L(s)] (LOGISTIC) or [1 - s, s]. onnxruntime sums each pair in
    double, dlcc in float32: the scores agree to about 1e-5 where the terms cancel, and a row
    within that of a decision boundary could vote otherwise. Probability estimates (prob_a,
    prob_b: an iterative solve), string labels, PROBIT for two classes and the liblinear form
    without support vectors are unsupported."""
    x = b.node.input[0]
    shape = _rank_1_or_2(b, x)
    if b.attrs.get("classlabels_strings"):
        raise b.unsupported("string class labels (a string output)")
    if b.attrs.get("prob_a") or b.attrs.get("prob_b"):
        raise b.unsupported("probability estimates (prob_a, prob_b: onnxruntime's iterative pairwise coupling)")
    labels = np.asarray(b.attrs.get("classlabels_ints") or [], np.int64)
    per_class = [int(v) for v in b.attrs.get("vectors_per_class") or []]
    if labels.size < 2:
        raise b.fail("classlabels_ints must name two classes or more")
    if not sum(per_class):
        raise b.unsupported("the liblinear form (no support vectors)")
    k_classes = labels.size
    if len(per_class) != k_classes or min(per_class) < 0:
        raise b.fail(f"vectors_per_class ({per_class}) must give a count, 0 or more, per class ({k_classes})")
    post = text_attr(b, "post_transform", "NONE")
    if post not in ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT"):
        raise b.fail(f"post_transform {post!r} is not NONE, LOGISTIC, SOFTMAX, SOFTMAX_ZERO or PROBIT")
    if post == "PROBIT" and k_classes == 2:
        raise b.unsupported("PROBIT for two classes (onnxruntime writes one score of the two)")
    kern, sv = _svm_kernel(b, _as_rows(b, x, shape), shape[-1])
    v = sv.shape[0]
    coef, rho = _floats(b, "coefficients"), _floats(b, "rho")
    n_pairs = k_classes * (k_classes - 1) // 2
    if v != sum(per_class) or coef.size != (k_classes - 1) * v or rho.size < n_pairs:
        raise b.fail(f"support_vectors ({v}), coefficients ({coef.size}) and rho ({rho.size}) must hold "
                     f"sum(vectors_per_class) = {sum(per_class)} vectors, (classes - 1) x vectors coefficients "
                     f"and one rho per pair of classes ({n_pairs})")
    if v * n_pairs > 1 << 27:  # (the pairs' coefficient table: 512 MiB of float32)
        raise b.unsupported(f"{v} support vectors for {n_pairs} pairs of classes (a table of more than 2^27 values)")
    pairs = [(i, j) for i in range(k_classes - 1) for j in range(i + 1, k_classes)]
    start = np.r_[0, np.cumsum(per_class)[:-1]]
    w = np.zeros((v, len(pairs)), np.float32)
    win, lose = np.zeros((len(pairs), k_classes), np.float32), np.zeros((len(pairs), k_classes), np.float32)
    for p, (i, j) in enumerate(pairs):
        for cls, row in ((i, j - 1), (j, i)):
            lo, hi = start[cls], start[cls] + per_class[cls]
            w[lo:hi, p] = coef[row * v + lo: row * v + hi]
        win[p, i], lose[p, j] = 1, 1
    scores = b.op("Add", [b.op("MatMul", [kern, b.constant(w)]), b.constant(rho[:len(pairs)])])
    above = b.op("Cast", [b.op("Greater", [scores, b.constant(np.float32(0))])], to=_F)
    votes = b.op("Add", [b.op("MatMul", [above, b.constant(win)]),
                         b.op("MatMul", [b.op("Sub", [b.constant(np.float32(1)), above]), b.constant(lose)])])
    best = b.op("ArgMax", [votes], axis=1, keepdims=0)
    b.op("Gather", [b.constant(labels, np.int64), best], b.node.output[0], axis=0)
    if len(b.node.output) < 2 or not b.node.output[1]:
        return
    if len(pairs) == 1:  # two classes: one score s, written as two (onnxruntime 1.32's results)
        if post == "NONE":
            pair = [b.op("Neg", [scores]), scores]
        elif post == "LOGISTIC":
            pair = [logistic(b, b.op("Neg", [scores])), logistic(b, scores)]
        else:
            pair = [b.op("Sub", [b.constant(np.float32(1)), scores]), scores]
        b.op("Concat", pair, b.node.output[1], axis=1)
        return
    b.op("Identity", [score_transform(b, scores, post)], b.node.output[1])


def _label_encoder(b: _Builder) -> None:
    """Y = the value of X's key (the first of equal keys, as onnxruntime's map keeps the first),
    else the default (default_float, -0.0, or default_int64, -1), for numeric keys and values
    (int64 or float; opset 2's lists, opset 4's tensors). String keys or values (opset 1's
    classes_strings too) and NaN keys (matched from opset 4 on) are unsupported."""
    x = b.node.input[0]
    if b.attrs.get("classes_strings") or b.attrs.get("keys_strings") or b.attrs.get("values_strings"):
        raise b.unsupported("string keys or values (a string tensor)")

    def listed(kind: str) -> np.ndarray | None:
        t = b.attrs.get(f"{kind}_tensor")
        if isinstance(t, onnx.TensorProto):
            if t.data_type not in (_F, _I64):
                raise b.unsupported(f"{kind}_tensor of type {elem_name(t.data_type)}")
            return numpy_helper.to_array(t).reshape(-1)
        for suffix, dtype in (("floats", np.float32), ("int64s", np.int64)):
            v = b.attrs.get(f"{kind}_{suffix}")
            if v:
                return np.asarray(v, dtype)
        return None

    keys, values = listed("keys"), listed("values")
    if keys is None or values is None or keys.size != values.size:
        raise b.fail("keys and values must be given, as many of each (keys_*/values_* or keys_tensor/values_tensor)")
    if keys.dtype == np.float32 and np.isnan(keys).any():
        raise b.unsupported("a NaN key (matched only from opset 4 on)")
    want = _F if keys.dtype == np.float32 else _I64
    if b.elem(x) != want:
        raise b.fail(f"the input must be {'float' if want == _F else 'int64'}, as the keys are")
    dt = b.attrs.get("default_tensor")
    if isinstance(dt, onnx.TensorProto):
        default = numpy_helper.to_array(dt).reshape(-1)[:1].astype(values.dtype)
    elif values.dtype == np.float32:
        default = np.asarray([b.attr("default_float", -0.0)], np.float32)
    else:
        default = np.asarray([b.attr("default_int64", -1)], np.int64)
    shape = b.shape(x)
    hit = b.op("Cast", [b.op("Equal", [b.unsqueeze(x, [-1]), b.constant(keys, keys.dtype)])], to=_F)
    first = b.op("ArgMax", [hit], axis=-1, keepdims=1)  # (the first of equal keys)
    found = b.op("Greater", [b.reduce("ReduceMax", hit, [-1]), b.constant(np.float32(0))])
    picked = b.op("Gather", [b.constant(values, values.dtype), first], axis=0)
    y = b.op("Where", [found, picked, b.constant(default[0], values.dtype)])
    b.op("Reshape", [y, b.ints(*shape)], b.node.output[0])


ML_REWRITES = {"Scaler": _scaler, "Normalizer": _normalizer, "Binarizer": _binarizer,
               "ArrayFeatureExtractor": _array_feature_extractor, "LinearRegressor": _linear_regressor,
               "LinearClassifier": _linear_classifier, "Imputer": _imputer, "FeatureVectorizer": _feature_vectorizer,
               "OneHotEncoder": _one_hot_encoder, "SVMRegressor": _svm_regressor,
               "SVMClassifier": _svm_classifier, "LabelEncoder": _label_encoder, **TREE_REWRITES}
