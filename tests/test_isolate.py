"""onnxruntime's folding runs in a worker process (dlcc/isolate.py): a crash or a hang there is a
status and a warning, and the compile goes on without it, instead of dying with it."""
from __future__ import annotations

import signal
import warnings

import numpy as np
import pytest

import dlcc
from conftest import opencl_device_available, run_ort
from dlcc import isolate


def test_a_worker_that_crashes_is_a_status_and_is_replaced():
    assert isolate.run("signal", [int(signal.SIGSEGV)], 60) == f"crashed (signal {int(signal.SIGSEGV)})"
    assert isolate.run("signal", [int(signal.SIGABRT)], 60) == f"crashed (signal {int(signal.SIGABRT)})"
    assert isolate.run("ort_optimize", ["/nonexistent/in.onnx", "/nonexistent/out.onnx", False], 60) == "failed"


def test_a_worker_that_hangs_is_killed():
    assert isolate.run("signal", [int(signal.SIGSTOP)], 2).startswith("timed out after 2 s")
    assert isolate.run("ort_optimize", ["/nonexistent/in.onnx", "/nonexistent/out.onnx", False], 60) == "failed"


@pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")
def test_the_compile_goes_on_when_onnxruntime_crashes(monkeypatch, tmp_path):
    from test_bad_input import EXAMPLE

    monkeypatch.setattr(isolate, "run", lambda *a, **k: "crashed (signal 11)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = dlcc.compile(EXAMPLE, target="opencl", cache=False)
    assert any("onnxruntime crashed (signal 11) while folding the constants" in str(w.message) for w in caught)
    feeds = m.sample_inputs(0)
    got = m(feeds)
    for name, ref in zip(got, run_ort(EXAMPLE, feeds, list(got))):
        np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-5)


def test_a_forked_child_gets_a_worker_of_its_own():
    """After os.fork, the inherited worker's pipes are the parent's; the child starts its own."""
    import os

    assert isolate.run("ort_optimize", ["/nonexistent/a", "/nonexistent/b", False], 60) == "failed"
    parent_worker = isolate._WORKER.proc.pid
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a step through a worker of its own, then report it
        try:
            status = isolate.run("ort_optimize", ["/nonexistent/a", "/nonexistent/b", False], 60)
            os.write(w, f"{status} {isolate._WORKER.proc.pid}".encode())
        finally:
            os._exit(0)
    os.close(w)
    status, child_worker = os.read(r, 200).decode().split()
    os.waitpid(pid, 0)
    assert status == "failed" and int(child_worker) != parent_worker
    assert isolate.run("ort_optimize", ["/nonexistent/a", "/nonexistent/b", False], 60) == "failed"
    assert isolate._WORKER.proc.pid == parent_worker


def test_a_dlcc_folder_in_the_callers_directory_does_not_shadow_the_worker(monkeypatch, tmp_path):
    """`python -m` puts its working directory first on sys.path: run from a source checkout beside
    a `pip install .` (whose dlcc/ lacks the backends the wheel maps into it), the worker imported
    the checkout's dlcc, exited with status 1, and every compile lost onnxruntime's folding (seen
    on the GPU machine). The worker starts in the running dlcc's own root instead."""
    import onnx
    from onnx import TensorProto, helper

    shadow = tmp_path / "checkout" / "dlcc"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('a dlcc that is not the one running')\n")
    graph = helper.make_graph(
        [helper.make_node("Add", ["c", "c"], ["k"]), helper.make_node("Mul", ["x", "k"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [helper.make_tensor("c", TensorProto.FLOAT, [2], [1.0, 2.0])])
    src, dst = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), src)
    isolate._WORKER.close()  # the next step starts a worker from the directory below
    monkeypatch.chdir(shadow.parent)
    try:
        assert isolate.run("ort_optimize", [str(src), str(dst), False], 60) == "ok"
    finally:
        isolate._WORKER.close()
    assert [n.op_type for n in onnx.load(dst).graph.node] == ["Mul"]  # the Add was folded
