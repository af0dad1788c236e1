#!/usr/bin/env python3
"""Plan mode against a real device: predicted vs measured latency of dlcc's own plans.

No GPU is needed: the device is whatever OpenCL finds (PoCL on the CPU here; a GPU through its
OpenCL driver elsewhere), or CUDA with ``--target cuda``. For each model this

1. compiles it for the target and times every launch alone on the device (`dlcc profile`'s
   method: OpenCL profiling events / CUDA events, median of ``--repeat``);
2. predicts the whole inference with plan mode twice: from those per-launch times (a profile
   database) and from the roofline cost model of ``--device``;
3. measures the whole inference (median wall time of ``--repeat`` runs, inputs already on the
   device) and prints both predictions' errors.

The first check is of the task graph (launch costs, stream order, the final sync composed over
measured kernels); the second also of the cost model's constants for that device.

Usage::

    python scripts/plan_accuracy.py                         # small models, OpenCL, pocl-cpu spec
    python scripts/plan_accuracy.py --models cnn,bert --repeat 21 --json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import dlcc  # noqa: E402
from dlcc.config import load_device  # noqa: E402
from dlcc.estimate.plan_graph import plan_graph  # noqa: E402
from dlcc.estimate.profiledb import ProfileDB  # noqa: E402

DEFAULT = "resnet-tiny,cnn,mobilenet,ocr,lstm,bert,vit"


def model_path(name: str, cache: Path) -> Path:
    if name == "resnet-tiny":
        return ROOT / "examples" / "resnet-tiny.onnx"
    p = cache / f"{name}-small.onnx"
    if not p.exists():
        import subprocess

        subprocess.run([sys.executable, str(ROOT / "scripts" / "models.py"), "-o", str(cache), "--size", "small",
                        name], check=True, stdout=subprocess.DEVNULL)
    return p


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=DEFAULT)
    ap.add_argument("--target", default="opencl", choices=["opencl", "cuda"])
    ap.add_argument("--device", default=None, help="DeviceSpec for the roofline (default: pocl-cpu for OpenCL, h100 for CUDA)")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--cache", type=Path, default=ROOT / ".cache" / "models")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    dev_key = args.device or ("pocl-cpu" if args.target == "opencl" else "h100")
    dev = load_device(dev_key)
    err = Console(stderr=True)
    rows = []
    for name in args.models.split(","):
        path = model_path(name, args.cache)
        m = dlcc.compile(path, target=args.target, device=dev_key)
        ex = m.executor()
        x = m.sample_inputs()
        times, how = ex.profile(x, args.repeat)
        db = ProfileDB("measured")
        for L, us in zip(m.plan["launches"], times):
            db.record(dev.name, L["kernel"], L["grid"], L["block"], us)
        pred_db = plan_graph(m.plan, dev, db).simulate()
        pred_rf = plan_graph(m.plan, dev, None).simulate()
        ex.run(x)
        walls = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            ex.run(x)
            walls.append(time.perf_counter() - t0)
        # ex.run also copies inputs in and outputs out; the plan covers launches + the sync only
        meas = statistics.median(walls) * 1e6
        rows.append({"model": name, "launches": len(m.plan["launches"]), "measured_us": meas,
                     "predicted_profile_us": pred_db, "predicted_roofline_us": pred_rf, "timed_by": how,
                     "profile_error_pct": 100 * (pred_db - meas) / meas,
                     "roofline_error_pct": 100 * (pred_rf - meas) / meas})
        err.print(f"[dim]{name}: measured {meas:.0f} µs[/]")
    summary = {"device": dev.name, "target": args.target,
               "median_abs_profile_error_pct": statistics.median(abs(r["profile_error_pct"]) for r in rows),
               "median_abs_roofline_error_pct": statistics.median(abs(r["roofline_error_pct"]) for r in rows)}
    if args.json:
        print(json.dumps({"rows": rows, **summary}))
        return 0
    t = Table(title=f"plan mode vs measured whole inference on {dev.name} ({args.target})")
    for c in ("model", "launches", "measured µs", "from profile µs", "error", f"roofline ({dev_key}) µs", "error"):
        t.add_column(c, justify="left" if c == "model" else "right")
    for r in rows:
        t.add_row(r["model"], str(r["launches"]), f"{r['measured_us']:.0f}", f"{r['predicted_profile_us']:.0f}",
                  f"{r['profile_error_pct']:+.0f}%", f"{r['predicted_roofline_us']:.0f}", f"{r['roofline_error_pct']:+.0f}%")
    Console().print(t)
    Console().print(f"median |error|: from profile {summary['median_abs_profile_error_pct']:.0f}%, "
                    f"roofline {summary['median_abs_roofline_error_pct']:.0f}% (launches timed by {rows[0]['timed_by']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
