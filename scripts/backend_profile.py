#!/usr/bin/env python3
"""Where the host time of a `torch.compile(backend="dlcc")` call goes, beside dlcc's own run().

On an H200, BERT small through the backend took 637 µs a call against 50 µs for the same plan's
launches alone: the call is host-bound, and this says by what. For one model it prints, in one
process:
  - µs per call of the compiled module (CUDA events around it, as scripts/vs_torch.py times it;
    wall time on the CPU), and its host time alone (the call returning, no synchronize);
  - the host time of dlcc's `run()` on the same plan with the same device tensors
    (outputs="device"), and of the launches alone;
  - a cProfile of --calls calls of the compiled module, the 30 most expensive functions by their
    own time and by cumulative time.

    python scripts/backend_profile.py --model bert --size small --precision fp32      # on a GPU
    .venv/bin/python scripts/backend_profile.py --model bert --calls 50                # PoCL, CPU tensors
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))


def host_us(call, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        call()
        samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="bert")
    ap.add_argument("--size", choices=("small", "full"), default="small")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--pipeline", default="full")
    ap.add_argument("--calls", type=int, default=200, help="calls profiled (default 200)")
    ap.add_argument("--repeat", type=int, default=50, help="calls timed (default 50)")
    ap.add_argument("--models-dir", type=Path, default=ROOT / ".cache" / "models")
    a = ap.parse_args(argv)

    import models
    import torch
    from vs_torch import median_us, torch_precision

    from dlcc.torch_backend import _Compiled

    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    dtype = torch_precision(a.precision)
    path = models.export(a.model, a.models_dir, a.size)
    feeds = models.sample_inputs(a.model, path, seed=0)
    built = models.build(a.model, a.size)
    mod = built.module.to(dev).to(dtype)
    args = [torch.from_numpy(feeds[k]).to(dev) for k in built.inputs]
    args = [x.to(dtype) if x.is_floating_point() else x for x in args]
    opts = {"pipeline": a.pipeline, "precision": a.precision}
    if not cuda:
        opts["target"] = "opencl"
    made = []
    real_init = _Compiled.__init__

    def keep(self, *xs, **kw):  # the backend's compiled graphs, to reach their dlcc models
        real_init(self, *xs, **kw)
        made.append(self)

    _Compiled.__init__ = keep
    fn = torch.compile(mod, backend="dlcc", dynamic=False, options=opts)
    lines = []
    with torch.inference_mode():
        fn(*args)
        for _ in range(3):
            fn(*args)
        if cuda:
            torch.cuda.synchronize()
        lines.append(f"graphs compiled by the backend: {len(made)}")
        lines.append(f"backend call, events (as vs_torch): {median_us(lambda: fn(*args), a.repeat, cuda):.0f} µs")
        lines.append(f"backend call, host time alone:      {host_us(lambda: fn(*args), a.repeat):.0f} µs")
        if cuda:
            torch.cuda.synchronize()
        if len(made) == 1:
            c = made[0]
            cm = c.model.last_used() if hasattr(c.model, "last_used") else c.model
            xs = dict(zip(c.names, args))  # (the module's inputs, in the graph's order where they match)
            try:
                lines.append(f"dlcc run(outputs='device'), host:  "
                             f"{host_us(lambda: cm.run(xs, outputs='device' if cuda else 'host'), a.repeat):.0f} µs")
            except Exception as e:  # noqa: BLE001 (the graph's inputs may not be the module's)
                lines.append(f"dlcc run() on the module's inputs: {type(e).__name__}: {str(e)[:200]}")
            ex = cm.executor()
            lines.append(f"launches alone ({len(ex.calls)}), host:         "
                         f"{host_us(lambda: ex.launch_all(), a.repeat):.0f} µs")
        if cuda:
            torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(a.calls):
            fn(*args)
        if cuda:
            torch.cuda.synchronize()
        prof.disable()
    print(f"{a.model}-{a.size} {a.precision} through torch.compile(backend='dlcc') on {dev}")
    print("\n".join(lines))
    for key in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(key).print_stats(30)
        print(f"\n--- {a.calls} calls, by {key} ---")
        print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
