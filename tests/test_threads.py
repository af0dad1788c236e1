"""One compiled model called from several threads at once (issue 21): every output equals the same
call made alone. The executor serialises calls on one model (its arena, input/output buffers and
grid-barrier counters are one set), so a serving program may share a model between threads."""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

import dlcc

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "resnet-tiny.onnx"


@pytest.mark.parametrize("pipeline", ["astitch", "full"])
def test_one_model_from_four_threads(pipeline):
    m = dlcc.compile(EXAMPLE, target="opencl", pipeline=pipeline)
    name = m.inputs[0]["name"]
    shape = m.inputs[0]["shape"]
    feeds = [{name: np.random.RandomState(k).randn(*shape).astype(np.float32)} for k in range(100)]
    expected = [m(f) for f in feeds]  # one after another
    got: dict[int, dict] = {}
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for k in range(t, 100, 4):  # 4 threads x 25 calls, interleaved
                got[k] = m(feeds[k])
        except BaseException as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for k in range(100):
        for out, ref in expected[k].items():
            np.testing.assert_array_equal(got[k][out], ref, err_msg=f"call {k}, output {out}")


def test_two_models_from_two_threads():
    a = dlcc.compile(EXAMPLE, target="opencl", pipeline="baseline")
    b = dlcc.compile(EXAMPLE, target="opencl", pipeline="astitch")
    name, shape = a.inputs[0]["name"], a.inputs[0]["shape"]
    x = [np.random.RandomState(k).randn(*shape).astype(np.float32) for k in range(20)]
    ref = [a({name: v}) for v in x]
    out: dict = {}

    def run(model, tag):
        out[tag] = [model({name: v}) for v in x]

    ts = [threading.Thread(target=run, args=(a, "a")), threading.Thread(target=run, args=(b, "b"))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for k in range(20):
        for o in ref[k]:
            np.testing.assert_array_equal(out["a"][k][o], ref[k][o])
            np.testing.assert_allclose(out["b"][k][o], ref[k][o], rtol=1e-4, atol=1e-5)
