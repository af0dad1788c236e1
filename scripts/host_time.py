#!/usr/bin/env python3
"""dlcc's own host time per inference, without a GPU: a model called on device arrays with device
outputs through `run()` and through a bound call (`model.bind`, dlcc/bound.py), against the fake
PyCUDA of tests/test_cuda_runtime.py (every driver call a Python function that records it), so
what is timed is dlcc's Python plus the fake's bookkeeping. Issue 21's floor (30 µs a call) is
measured on a GPU by scripts/interop_check.py --scenario host-time; this shows where dlcc's side
stands on any machine, and the ratio of the two paths in the same run.

    python scripts/host_time.py                          # the bundled example and bert-small
    python scripts/host_time.py --models a.onnx,b.onnx --calls 500
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def _device_array(sig: dict, ptr: int):
    """What torch hands over for a CUDA tensor: `__cuda_array_interface__` (built anew on each
    read, as torch's is) and `__dlpack_device__`."""
    from dlcc import interop

    class TorchLike:
        @property
        def __cuda_array_interface__(self):
            return {"shape": tuple(sig["shape"]), "typestr": np.dtype(sig["dtype"]).str, "data": (ptr, False),
                    "version": 3}

        def __dlpack_device__(self):
            return (interop.KDL_CUDA, 0)

    return TorchLike()


def _median_us(call, drv, calls: int) -> float:
    call()  # the first call captures the graph
    walls = []
    for _ in range(calls):
        t0 = time.perf_counter()
        call()
        walls.append((time.perf_counter() - t0) * 1e6)
        drv.launches.clear()  # the fake's logs, which would otherwise grow with every call
        drv.d2d.clear()
    return statistics.median(walls)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=f"{ROOT / 'examples' / 'resnet-tiny.onnx'},"
                                        f"{ROOT / '.cache' / 'models' / 'bert-small.onnx'}")
    ap.add_argument("--calls", type=int, default=300)
    a = ap.parse_args(argv)
    from _pytest.monkeypatch import MonkeyPatch

    import dlcc
    from dlcc.backends.cuda import CudaRuntime
    from test_cuda_runtime import install_fake_pycuda

    mp = MonkeyPatch()
    try:
        drv = install_fake_pycuda(mp)
        mp.setattr(CudaRuntime, "pointer_device", lambda self, ptr: 0)
        print(f"{'model':<24} {'launches':>8} {'run() µs':>9} {'bound µs':>9} {'bound/run':>9} "
              f"{'of which the fake replaying the graph, µs':>42}")
        for path in a.models.split(","):
            if not Path(path).is_file():
                print(f"{Path(path).name:<24} (missing: python scripts/models.py exports the test models)")
                continue
            m = dlcc.compile(path, target="cuda", device="h100", cache=False)
            feeds = {t["name"]: _device_array(t, 0x7f0000001000 + 0x1000000 * i) for i, t in enumerate(m.inputs)}
            run_us = _median_us(lambda: m.run(feeds, outputs="device"), drv, a.calls)
            with m.bind(feeds, outputs="device") as call:
                bound_us = _median_us(call, drv, a.calls)
                rt = m.executor().rt
                with rt.active():  # what the fake itself spends in cuGraphLaunch (a GPU's driver: a few µs)
                    fake_us = _median_us(lambda: rt.launch_graph(call._graph), drv, a.calls)
            print(f"{Path(path).name:<24} {len(m.plan['launches']):>8} {run_us:>9.1f} {bound_us:>9.1f} "
                  f"{bound_us / run_us:>9.2f} {fake_us:>42.1f}")
    finally:
        mp.undo()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
