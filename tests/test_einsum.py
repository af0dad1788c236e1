"""Einsum (opset 12), which dlcc writes at import as Transpose, Reshape, MatMul, Mul, ReduceSum and
Gather (dlcc/einsum.py), on PoCL against onnxruntime's CPU kernel.

Many Einsum nodes share one model, so that one compile checks them all; each model runs at opset
12 (ReduceSum's axes an attribute) and 18 (an input), through the baseline and the AStitch
pipelines. The equations cover the batched matmuls of attention, outer, dot and elementwise
products, transposes and full sums, implicit outputs, ellipsis broadcasting, three and four
operands, diagonals and size-1 letters. Then float16, bfloat16 and the integer path (Mul +
ReduceSum, since dlcc's MatMul is float only), zero-length dims, the malformed equations and the
forms refused, and a real torch.onnx export.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper as h

import dlcc
from conftest import opencl_device_available
from dlcc.errors import DlccError

needs_opencl = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")
#: baseline's runs of the other cases are under -m slow: astitch covers the same rewrite in the
#: default suite, and the first case runs both there.
SLOW_BASELINE = [pytest.param("baseline", marks=pytest.mark.slow), "astitch"]
PIPELINES = ["baseline", "astitch"]
RTOL, ATOL = 1e-4, 1e-5

# (equation, operand shapes): every one is a node of the same model
CASES = [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 8), (2, 3, 5, 8)]),  # attention scores: K read transposed
    ("bhqk,bhkd->bhqd", [(2, 3, 4, 5), (2, 3, 5, 8)]),  # attention output
    ("i,j->ij", [(3,), (4,)]),  # outer product: a Mul, nothing to contract
    ("ij->ji", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("i,i->", [(7,), (7,)]),
    ("ij,ij->ij", [(3, 4), (3, 4)]),
    ("ijk->ikj", [(2, 3, 4)]),
    ("ij,jk", [(3, 4), (4, 5)]),  # implicit: ik
    ("ba,ac", [(3, 4), (4, 5)]),  # implicit: bc, alphabetical, not the operands' order
    ("bA,Ac", [(3, 4), (4, 5)]),  # implicit, upper- and lower-case letters distinct
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (1, 5, 4, 2)]),  # size-1 ellipsis dims broadcast both ways
    ("...ij,...jk", [(3, 2, 4), (1, 4, 5)]),  # implicit with an ellipsis: its dims first
    ("i...j,j...->...i", [(2, 3, 4), (4, 3)]),
    ("bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)]),  # three operands, contracted left to right
    ("ab,bc,cd,de->ae", [(2, 3), (3, 4), (4, 5), (5, 2)]),
    ("abc,cd->abd", [(2, 3, 4), (4, 5)]),
    (" b i d , b j d -> b i j ", [(2, 3, 4), (2, 5, 4)]),  # spaces anywhere
    ("bi,bi->b", [(3, 6), (3, 6)]),  # batched dot products: Mul + ReduceSum
    ("kj,ij->ik", [(3, 4), (5, 4)]),
    ("ij,jk->ik", [(2, 1), (3, 4)]),  # a size-1 letter broadcast where it is summed
    ("bij,bjk->bik", [(4, 2, 3), (1, 3, 5)]),  # and where it is kept (the first operand has it full)
    ("ij,kl->", [(2, 3), (4, 5)]),  # each operand summed on its own before the product
    (",ij->ji", [(), (2, 3)]),  # a scalar operand
    ("ii->i", [(4, 4)]),  # diagonals: a Gather of the flat diagonal
    ("ii", [(4, 4)]),  # the trace
    ("iij->j", [(3, 3, 2)]),
    ("iji->ij", [(3, 2, 3)]),
    ("iii->i", [(3, 3, 3)]),
    ("bii,bij->bj", [(2, 3, 3), (2, 3, 4)]),
    ("ij,ji->", [(3, 4), (4, 3)]),  # trace of a product
]


def _ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _einsum_model(cases, feeds: dict, opset: int, ref_equations=None) -> tuple[onnx.ModelProto, list[np.ndarray]]:
    """A model of one Einsum per case (its inputs x{k}_{j}, its output y{k}) and onnxruntime's
    outputs, by which the outputs are typed. `ref_equations` replaces the equations in the model
    that onnxruntime runs (where its kernel cannot run an equation as written)."""
    dtype = next(iter(feeds.values())).dtype
    ins = [h.make_tensor_value_info(n, h.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds.items()]

    def make(equations):
        nodes = [h.make_node("Einsum", [f"x{k}_{j}" for j in range(len(shapes))], [f"y{k}"], name=f"einsum{k}",
                             equation=eq) for k, (eq, (_, shapes)) in enumerate(zip(equations, cases))]
        g = h.make_graph(nodes, "einsum", ins, [h.make_empty_tensor_value_info(f"y{k}") for k in range(len(cases))])
        return h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=8)

    m = make([eq for eq, _ in cases])
    refs = _ort(make(ref_equations) if ref_equations else m, feeds)
    for o, r in zip(m.graph.output, refs):
        o.CopyFrom(h.make_tensor_value_info(o.name, h.np_dtype_to_tensor_dtype(dtype), r.shape))
    return m, refs


def _feeds(cases, rng, dtype=np.float32) -> dict:
    feeds = {}
    for k, (_, shapes) in enumerate(cases):
        for j, s in enumerate(shapes):
            x = rng.standard_normal(s) * (4 if np.issubdtype(dtype, np.integer) else 1)
            feeds[f"x{k}_{j}"] = np.asarray(x).astype(dtype)
    return feeds


def _check(path, refs, feeds, pipeline, rtol=RTOL, atol=ATOL, shapes=None):
    got = dlcc.compile(path, target="opencl", pipeline=pipeline, shapes=shapes)(feeds)
    names = [o.name for o in onnx.load(path).graph.output]
    for n, r in zip(names, refs):
        assert got[n].shape == r.shape and got[n].dtype == r.dtype, (n, got[n].shape, r.shape, got[n].dtype, r.dtype)
        np.testing.assert_allclose(got[n].astype(np.float64), r.astype(np.float64), rtol=rtol, atol=atol, err_msg=n)
    return got


def _save(m: onnx.ModelProto, path) -> str:
    onnx.save(m, str(path))
    return str(path)


@needs_opencl
@pytest.mark.parametrize("opset, pipeline", [(18, "baseline"), (18, "astitch"), (12, "astitch"),
                                              pytest.param(12, "baseline", marks=pytest.mark.slow)])
def test_equations(tmp_path, opset, pipeline):
    """Every equation of CASES in one model, against onnxruntime."""
    feeds = _feeds(CASES, np.random.default_rng(opset))
    m, refs = _einsum_model(CASES, feeds, opset)
    _check(_save(m, tmp_path / "einsum.onnx"), refs, feeds, pipeline)


@needs_opencl
def test_implicit_output_in_ascii_order(tmp_path):
    """An implicit output puts its letters in ASCII order, upper case first (numpy's order and
    onnx's shape inference's). onnxruntime's kernel cannot write an upper-case letter into an
    implicit output, so its reference runs the same equations with that output written out."""
    cases = [("Ab,bc", [(2, 3), (3, 4)]), ("zY,Yx,aQ", [(2, 3), (3, 4), (5, 2)])]
    feeds = _feeds(cases, np.random.default_rng(1))
    m, refs = _einsum_model(cases, feeds, 17, ref_equations=["Ab,bc->Ac", "zY,Yx,aQ->Qaxz"])
    _check(_save(m, tmp_path / "implicit.onnx"), refs, feeds, "baseline")


@needs_opencl
def test_diagonal_keeps_infinities_off_it(tmp_path):
    """The diagonal is gathered, not masked with an eye and summed: an inf or NaN off the
    diagonal stays out of the result (0 * inf would be NaN)."""
    x = np.random.default_rng(2).standard_normal((4, 4)).astype(np.float32)
    x[0, 1], x[2, 3], x[3, 0] = np.inf, -np.inf, np.nan
    cases = [("ii->i", [(4, 4)]), ("ii", [(4, 4)])]
    feeds = {"x0_0": x, "x1_0": x}
    m, refs = _einsum_model(cases, feeds, 17)
    got = _check(_save(m, tmp_path / "diag.onnx"), refs, feeds, "astitch")
    assert np.isfinite(got["y0"]).all() and np.isfinite(got["y1"])


@needs_opencl
@pytest.mark.parametrize("pipeline", SLOW_BASELINE)
def test_float16(tmp_path, pipeline):
    """float16 keeps its type at the model's boundary and computes in float32 inside. The
    reference is onnxruntime on the model widened to float32, its outputs rounded to float16
    (dlcc.verify's), which is what a float32 plan computes. (onnx's Einsum takes no bfloat16.)"""
    from dlcc.verify import run_onnxruntime

    cases = [("bij,bjk->bik", [(2, 3, 8), (2, 8, 5)]), ("bhqd,bhkd->bhqk", [(1, 2, 4, 8), (1, 2, 5, 8)]),
             ("i,j->ij", [(3,), (4,)]), ("ij->", [(3, 4)]), ("ii->i", [(4, 4)]),
             ("bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)])]
    feeds = _feeds(cases, np.random.default_rng(3), np.float16)
    m, _ = _einsum_model(cases, feeds, 17)
    path = _save(m, tmp_path / "half.onnx")
    refs = run_onnxruntime(path, feeds)
    assert all(r.dtype == np.float16 for r in refs)
    _check(path, refs, feeds, pipeline, rtol=2e-3, atol=2e-3)


@needs_opencl
def test_integers(tmp_path):
    """int32 and int64: dlcc's MatMul takes floats only, so the contractions are a broadcasting
    Mul and a ReduceSum, exact like onnxruntime's."""
    cases = [("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("i,j->ij", [(3,), (4,)]), ("ij->", [(3, 4)]),
             ("ii->i", [(4, 4)]), ("bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)]), ("ij,jk", [(3, 4), (4, 2)])]
    for dtype in (np.int32, np.int64):
        feeds = _feeds(cases, np.random.default_rng(4), dtype)
        m, refs = _einsum_model(cases, feeds, 12 if dtype == np.int32 else 17)
        _check(_save(m, tmp_path / f"{np.dtype(dtype).name}.onnx"), refs, feeds, "astitch", rtol=0, atol=0)


@needs_opencl
def test_zero_length_dims(tmp_path):
    """A zero-length label gives an empty output, or zeros where it is summed (bound with
    shapes=, since a 0 in an input's shape reads as a dynamic dim). One model each: a plan with
    an empty constant output beside another constant output fails at run time in the OpenCL
    runtime (clCreateSubBuffer), Einsum or not."""
    for k, case in enumerate([("ij,jk->ik", [(2, 0), (0, 3)]), ("ij->i", [(2, 0)]), ("ij,jk->ik", [(0, 3), (3, 4)])]):
        feeds = _feeds([case], np.random.default_rng(5))
        m, refs = _einsum_model([case], feeds, 17)
        _check(_save(m, tmp_path / f"empty{k}.onnx"), refs, feeds, "baseline",
               shapes={k: list(v.shape) for k, v in feeds.items()})


def _one(path, eq: str, shapes: list[tuple], out_shape, opset=17, elem=onnx.TensorProto.FLOAT) -> str:
    """A model of a single Einsum, its output declared `out_shape` (None dims: not known)."""
    ins = [h.make_tensor_value_info(f"x{j}", elem, s) for j, s in enumerate(shapes)]
    node = h.make_node("Einsum", [f"x{j}" for j in range(len(shapes))], ["y"], name="the_einsum", equation=eq)
    g = h.make_graph([node], "einsum", ins, [h.make_tensor_value_info("y", elem, out_shape)])
    return _save(h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=8), path)


@pytest.mark.parametrize("eq,shapes,out,words", [
    ("ij,jk->ik", [(2, 3), (4, 5)], [2, 5], ["letter 'j'", "3 and 4"]),  # sizes that do not broadcast
    ("ij,jk->ik", [(2, 3)], [2, None], ["Einsum", "operands"]),  # operand count (onnx's inference says it)
    ("ijk->ik", [(2, 3)], [2, 3], ["Einsum", "Rank"]),  # rank (onnx's inference too)
    ("ij->ii", [(3, 3)], [3, 3], ["output letter 'i'", "repeats"]),
    ("ij->i->j", [(3, 3)], [None, None], ["one '->'"]),
    ("ij,jk->i.k", [(3, 3), (3, 3)], [3, 3], ["'.'", "letters"]),
    ("ii->i", [(2, 3)], [None], ["letter 'i'", "diagonal"]),
    ("...i->i", [(2, 3)], [3], ["ellipsis", "output has none"]),
    # onnx (and onnxruntime) require every ellipsis to stand for the same number of dims
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)], [2, 5, 3, 2], ["Ellipsis"]),
])
def test_malformed_equations_are_clear_errors(tmp_path, eq, shapes, out, words):
    """Malformed equations fail at import with a DlccError naming the node's problem (dlcc's
    check, or onnx's shape inference where that runs first), before anything is compiled."""
    with pytest.raises(DlccError) as e:
        dlcc.compile(_one(tmp_path / "bad.onnx", eq, shapes, out), target="opencl")
    assert all(w in str(e.value) for w in words), str(e.value)


def test_refused_forms_say_why(tmp_path):
    """A size-1 dim of the first operand broadcast into the output: onnx's shape inference (which
    the import has already relied on) gives the output the size 1, numpy and onnxruntime the
    broadcast size; dlcc refuses rather than pick one. float64 is refused as dlcc computes none."""
    with pytest.raises(DlccError) as e:
        dlcc.compile(_one(tmp_path / "bcast.onnx", "bij,bjk->bik", [(1, 2, 3), (4, 3, 5)], [None] * 3),
                     target="opencl")
    assert "the_einsum" in str(e.value) and "[1, 2, 5]" in str(e.value) and "[4, 2, 5]" in str(e.value), str(e.value)
    with pytest.raises(DlccError) as e:
        dlcc.compile(_one(tmp_path / "f64.onnx", "ij,jk->ik", [(2, 3), (3, 4)], [2, 4], elem=onnx.TensorProto.DOUBLE),
                     target="opencl")
    assert "double" in str(e.value) or "float64" in str(e.value), str(e.value)


@needs_opencl
def test_an_operand_shaped_by_values_is_a_data_dependent_shape(tmp_path):
    """An operand whose shape a NonZero of the input decides, in a model whose inputs are all
    static: the error says the shape depends on run-time values (not "bind
    the dynamic dims", which would not help) and names the fallback, which then runs the model."""
    from dlcc.errors import DynamicShapeError

    f = onnx.TensorProto.FLOAT
    nodes = [h.make_node("NonZero", ["x"], ["i"]), h.make_node("Cast", ["i"], ["c"], to=f),
             h.make_node("Einsum", ["c", "c"], ["y"], equation="ij,ij->j")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", f, [6])], [h.make_tensor_value_info("y", f, ["n"])])
    path = tmp_path / "nz.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
    with pytest.raises(DynamicShapeError) as e:
        dlcc.compile(path, target="opencl")
    assert e.value.tensor == "c" and "depends on tensor values computed at run time" in str(e.value), str(e.value)
    assert "--fallback onnxruntime" in str(e.value) and "--shape" not in str(e.value)
    x = np.array([0, 1.5, 0, 2, 3, 0], np.float32)
    got = dlcc.compile(path, target="opencl", fallback="onnxruntime")({"x": x})["y"]
    np.testing.assert_array_equal(got, np.einsum("ij,ij->j", *[np.stack(np.nonzero(x)).astype(np.float32)] * 2))


@needs_opencl
def test_indices_of_a_mask_built_from_a_shape_are_folded(tmp_path):
    """NonZero of a mask the model builds from its input's shape (Longformer's and LED's global
    attention from an all-ones attention mask): onnxruntime's folding leaves NonZero alone, so
    dlcc folds it, and the Einsum reading it gets a static shape and compiles, no fallback."""
    f, i64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    nodes = [h.make_node("Shape", ["x"], ["s"]),
             h.make_node("ConstantOfShape", ["s"], ["ones"], value=onnx.helper.make_tensor("v", i64, [1], [1])),
             h.make_node("Equal", ["ones", "one"], ["mask"]), h.make_node("NonZero", ["mask"], ["i"]),
             h.make_node("Cast", ["i"], ["c"], to=f), h.make_node("Einsum", ["c", "x"], ["y"], equation="ij,ik->jk")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", f, [2, 6])], [h.make_tensor_value_info("y", f, [12, 6])],
                     [onnx.numpy_helper.from_array(np.array(1, np.int64), "one")])
    path = tmp_path / "mask.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
    x = np.random.default_rng(4).standard_normal((2, 6)).astype(np.float32)
    got = dlcc.compile(path, target="opencl", pipeline="astitch")({"x": x})["y"]
    c = np.stack(np.nonzero(np.ones((2, 6)))).astype(np.float32)
    np.testing.assert_allclose(got, np.einsum("ij,ik->jk", c, x), rtol=RTOL, atol=ATOL)


@needs_opencl
@pytest.mark.parametrize("pipeline", SLOW_BASELINE)
def test_exported_torch_einsum(tmp_path, pipeline):
    """torch.einsum as torch.onnx's TorchScript exporter writes it (opset 17): multi-head
    attention's scores and output, and a bilinear form of two pooled vectors, compiled by dlcc
    and compared with onnxruntime on the same file."""
    torch = pytest.importorskip("torch")

    class EinsumBlock(torch.nn.Module):
        def __init__(self, d=16, heads=2, out=3):
            super().__init__()
            self.heads = heads
            self.qkv = torch.nn.Linear(d, 3 * d)
            self.bilinear = torch.nn.Parameter(torch.randn(out, d, d) * 0.1)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).unbind(2)
            s = torch.einsum("bqhd,bkhd->bhqk", q, k) / (d // self.heads) ** 0.5
            o = torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v).reshape(b, t, d)
            first, last = o[:, 0], x.mean(1)
            return o, torch.einsum("bi,oij,bj->bo", first, self.bilinear, last)

    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    path = tmp_path / "einsum_block.onnx"
    torch.onnx.export(EinsumBlock().eval(), (x,), str(path), opset_version=17, dynamo=False, input_names=["x"],
                      output_names=["o", "form"])
    m = onnx.load(str(path))
    assert sum(n.op_type == "Einsum" for n in m.graph.node) == 3
    feeds = {"x": x.numpy()}
    _check(str(path), _ort(m, feeds), feeds, pipeline)
