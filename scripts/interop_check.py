#!/usr/bin/env python3
"""dlcc inside a PyTorch program on a real GPU (docs/interop.md; issue 21's floors). Needs CUDA,
PyCUDA and a CUDA build of torch, so it runs on a GPU machine only.

Each scenario runs in a fresh process, since what it checks is what one process's CUDA state
allows:
  - torch-first: torch eager and torch.compile on the GPU, then a dlcc model, then torch eager and
    torch.compile again (dlcc's own context, as pycuda.autoinit made, broke this last step with
    "invalid resource handle");
  - dlcc-first: the same, dlcc before torch is imported;
  - device-io: a torch CUDA tensor in, `outputs="device"` out through DLPack, equal to the
    host-array run, with the torch profiler's count of host<->device copies during the device
    inference (the floor: none);
  - threads: one model called from 4 threads with different device inputs, each output equal to
    the same call made alone;
  - host-time: the host's time per inference (the floor: 30 µs), as the wall time of calls on
    device tensors with device outputs queued behind a busy stream (torch.cuda._sleep), so none
    waits for the GPU: of a bound call (`model.bind`, the floor) and of run() beside it; then the
    bound outputs are checked against the host-array run.

    python scripts/interop_check.py                      # every scenario, the bundled example
    python scripts/interop_check.py --model bert.onnx --scenario device-io

Prints one line per scenario and exits 1 if any failed.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ("torch-first", "dlcc-first", "device-io", "threads", "host-time")


def _torch_work(torch) -> None:
    """torch eager and torch.compile on the GPU, each checked against the CPU."""
    a = torch.randn(256, 256, device="cuda")
    assert torch.allclose((a @ a).cpu(), a.cpu() @ a.cpu(), rtol=1e-3, atol=1e-3), "torch eager matmul"
    f = torch.compile(lambda x: torch.sin(x) * 2 + 1)
    assert torch.allclose(f(a).cpu(), torch.sin(a.cpu()) * 2 + 1, rtol=1e-4, atol=1e-4), "torch.compile"
    torch.cuda.synchronize()


def _dlcc_work(model: str):
    import dlcc
    from dlcc.verify import verify_outputs

    m = dlcc.compile(model, target="cuda", cache=False)
    feeds = m.sample_inputs(0)
    rows = verify_outputs(model, m(feeds), feeds)
    assert all(r["passed"] for r in rows), f"dlcc vs onnxruntime: {rows}"
    return m, feeds


def scenario(name: str, model: str) -> dict:
    if name == "torch-first":
        import torch

        _torch_work(torch)
        _dlcc_work(model)
        _torch_work(torch)
        return {}
    if name == "dlcc-first":
        _dlcc_work(model)
        import torch

        _torch_work(torch)
        _dlcc_work(model)
        return {}
    import numpy as np
    import torch

    m, feeds = _dlcc_work(model)
    host = m(feeds)
    dev = {k: torch.from_numpy(np.ascontiguousarray(v)).cuda() for k, v in feeds.items()}
    if name == "device-io":
        m.run(dev, outputs="device")  # warm-up
        torch.cuda.synchronize()
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            outs = m.run(dev, outputs="device")
            torch.cuda.synchronize()
        copies = [e.name for e in prof.events() if "Memcpy HtoD" in e.name or "Memcpy DtoH" in e.name]
        for k, v in outs.items():
            t = torch.from_dlpack(v)
            assert t.is_cuda and np.array_equal(t.cpu().numpy(), host[k]), f"device output {k}"
        # the floor: no host copy in the inference (token ids are checked on the device, and the
        # check's report is mapped host memory)
        assert not copies, f"host copies during a device inference: {copies}"
        return {"host_copies": len(copies)}
    if name == "host-time":
        import statistics
        import time

        def host_us(call) -> tuple[float, bool]:
            """The median wall time of 50 calls queued behind about a second of GPU work."""
            call()  # warm-up: the graph is captured
            torch.cuda.synchronize()
            walls = []
            torch.cuda._sleep(2_000_000_000)
            for _ in range(50):
                t0 = time.perf_counter()
                call()
                walls.append((time.perf_counter() - t0) * 1e6)
            busy = not torch.cuda.current_stream().query()
            m.synchronize()
            torch.cuda.synchronize()
            return statistics.median(walls), busy

        run_us, busy_run = host_us(lambda: m.run(dev, outputs="device"))
        bound = m.bind(dev, outputs="device")
        bound_us, busy = host_us(bound)
        for k, v in bound.outputs.items():
            assert np.array_equal(torch.from_dlpack(v).cpu().numpy(), host[k]), f"bound device output {k}"
        assert busy and busy_run, "the stream drained before the calls were timed: the wall time may include waiting"
        # the floor is the bound call's: the loop a serving program runs (run() rechecks its inputs
        # and allocates its outputs at every call, and is printed beside it)
        assert bound_us <= 30, f"host time per bound call {bound_us:.1f} µs > 30 µs (run(): {run_us:.1f} µs)"
        return {"bound_us": round(bound_us, 1), "run_us": round(run_us, 1), "launches": len(m.plan["launches"])}
    if name == "threads":
        import threading

        inputs = [{k: torch.from_numpy(np.ascontiguousarray(v)).cuda() for k, v in m.sample_inputs(s).items()}
                  for s in range(4)]
        alone = [m(x) for x in inputs]
        bad = []

        def work(i):
            for _ in range(25):
                got = m(inputs[i])
                if not all(np.array_equal(got[k], alone[i][k]) for k in got):
                    bad.append(i)

        ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert not bad, f"threads {sorted(set(bad))} got outputs other than the call made alone"
        return {"calls": 100}
    raise SystemExit(f"unknown scenario {name!r}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "examples" / "resnet-tiny.onnx"))
    ap.add_argument("--scenario", choices=SCENARIOS, action="append")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:  # one scenario in this process
        try:
            print(json.dumps({"scenario": a.child, "ok": True, **scenario(a.child, a.model)}))
            return 0
        except Exception as e:
            print(json.dumps({"scenario": a.child, "ok": False, "error": f"{type(e).__name__}: {e}"[:500]}))
            return 1
    failed = 0
    for name in a.scenario or SCENARIOS:
        p = subprocess.run([sys.executable, __file__, "--model", a.model, "--child", name], capture_output=True,
                           text=True)
        line = (p.stdout.strip().splitlines() or [json.dumps({"scenario": name, "ok": False,
                                                               "error": p.stderr.strip()[-500:]})])[-1]
        print(line, flush=True)
        failed += p.returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
