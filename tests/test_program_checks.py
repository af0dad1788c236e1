"""The program invariant checked after every pass (dlcc/compiler.py: _check_reads): no launch reads
a tensor before some launch wrote it. A pass that breaks it fails the compile as a dlcc bug,
naming itself, instead of leaving a kernel that reads bytes nothing wrote (a wrong answer that
no error would show: fuzz seed 12747 was one)."""
from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from dlcc.compiler import compile_model
from dlcc.config import PassSpec, PipelineSpec
from dlcc.errors import CompileError
from dlcc.passes import PASSES, register_pass


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """y = Relu(Exp(x) + 1): three launches under baseline, each reading the one before."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    g = helper.make_graph([helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Add", ["e", "one"], ["a"]),
                           helper.make_node("Relu", ["a"], ["y"])], "chain", [x], [y], [one])
    path = tmp_path_factory.mktemp("m") / "chain.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


def _pipeline(broken: str) -> PipelineSpec:
    return PipelineSpec(name=f"with-{broken}", passes=[PassSpec(name="lower"), PassSpec(name=broken),
                                                       PassSpec(name="memplan")])


@pytest.fixture(scope="module", autouse=True)
def broken_passes():
    @register_pass("test_drop_first_launch")
    def drop(state, opts):
        """Drops the first launch (its readers read bytes nothing wrote)."""
        del state.ctx.program.launches[0]

    @register_pass("test_reverse_launches")
    def reverse(state, opts):
        """Runs the launches backwards (readers before writers)."""
        state.ctx.program.launches.reverse()

    @register_pass("test_keep_launches")
    def keep(state, opts):
        """Changes nothing."""

    yield
    for name in ("test_drop_first_launch", "test_reverse_launches", "test_keep_launches"):
        PASSES.pop(name, None)


@pytest.mark.parametrize("broken", ["test_drop_first_launch", "test_reverse_launches"])
def test_a_pass_that_breaks_the_program_fails_the_compile(chain, broken):
    with pytest.raises(CompileError, match=rf"after the '{broken}' pass, launch \S+ .* reads tensor .* dlcc bug"):
        compile_model(chain, target="opencl", pipeline=_pipeline(broken))


def test_a_pass_that_keeps_the_program_whole_compiles(chain):
    cm = compile_model(chain, target="opencl", pipeline=_pipeline("test_keep_launches"))
    assert len(cm.plan["launches"]) == 3


def test_the_check_sees_order_and_views():
    """unwritten_read: a read before the write fails; a read through a view resolves to the tensor
    the view names; a launch may read what it writes itself."""
    from dlcc.kernels.program import KernelProgram, Launch

    def launch(name, reads, writes):
        return Launch(name, 1, 1, [], reads, writes, name, "Op")

    views = {"v": "t"}
    resolve = lambda n: views.get(n, n)  # noqa: E731
    p = KernelProgram(launches=[launch("w", ["x"], ["t"]), launch("r", ["v"], ["y"]), launch("self", ["z"], ["z"])])
    assert p.unwritten_read({"x"}, resolve) is None
    p.launches.reverse()
    L, t = p.unwritten_read({"x"}, resolve)
    assert (L.kernel, t) == ("r", "t")
