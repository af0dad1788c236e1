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
    python scripts/plan_accuracy.py --fit                   # also fit the device's cost-model constants

With ``--fit`` the measured per-launch times also calibrate the cost model for the device, with
the fitter of scripts/calibrate_costmodel.py (fixed costs from the fastest kernels, efficiencies
by least squares on log time, kernel classes weighted equally), on dlcc's own kernels: the
script prints the constants to put in the device YAML, the median per-launch error per class
before and after, and the whole-inference roofline prediction with the fitted constants.
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
    ap.add_argument("--fit", action="store_true", help="fit the device's cost-model constants on the measured launches")
    args = ap.parse_args(argv)
    dev_key = args.device or ("pocl-cpu" if args.target == "opencl" else "h100")
    dev = load_device(dev_key)
    err = Console(stderr=True)
    rows, samples, plans = [], [], []
    for name in args.models.split(","):
        path = model_path(name, args.cache)
        m = dlcc.compile(path, target=args.target, device=dev_key)
        ex = m.executor()
        x = m.sample_inputs()
        times, how = ex.profile(x, args.repeat)
        db = ProfileDB("measured")
        for L, us in zip(m.plan["launches"], times):
            db.record(dev.name, L["kernel"], L["grid"], L["block"], us)
        if args.fit:
            samples += launch_samples(name, m.plan, times)
        plans.append(m.plan)
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
    fitted = None
    if args.fit:
        fitted = fit_constants(samples, dev, rows, plans)
        summary["fit"] = fitted
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
    if fitted:
        t = Table(title=f"cost model on {len(samples)} measured launches of dlcc's kernels (median |pred-meas|/meas)")
        for c in ("class", "launches", "device yaml", "fitted"):
            t.add_column(c, justify="left" if c == "class" else "right")
        for cls, v in fitted["per_class"].items():
            t.add_row(cls, str(v["n"]), f"{100 * v['yaml']:.0f}%", f"{100 * v['fitted']:.0f}%")
        Console().print(t)
        Console().print("fitted constants (for the device YAML): " +
                        ", ".join(f"{k}: {v}" for k, v in fitted["constants"].items()))
        Console().print("whole inference with them: " + ", ".join(
            f"{r['model']} {r['roofline_fitted_error_pct']:+.0f}%" for r in rows) +
            f"; median |error| {fitted['median_abs_whole_error_pct']:.0f}%")
    return 0


def launch_samples(model: str, plan: dict, times: list[float]):
    """calibrate_costmodel.Sample per plan launch, with its measured time."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from calibrate_costmodel import Sample

    out = []
    for L, us in zip(plan["launches"], times):
        cls = "gemm" if L.get("category") == "compute" else ("reduction" if L.get("category") == "reduction" else "elementwise")
        out.append(Sample(model, L["kernel"], cls, L.get("op_type", ""), max(us, 1e-3), float(L["flops"]),
                          float(L["dram_bytes"]), "float32", int(L["grid"]), int(L["block"]), 0, None))
    return out


def joint_fit(samples, dev, predict, start: dict) -> dict:
    """Each fixed cost together with its efficiency, by grid search on mean squared log error.

    calibrate_costmodel.fit takes fixed costs from the fastest GPU kernels, which suits an H100;
    on a CPU OpenCL device every launch pays a large dispatch cost, so fixed cost and efficiency
    are searched jointly here (fixed: 5th-50th percentile of the class's times)."""
    import math

    c = dict(start)
    groups = {("kernel_fixed_us", "dram_efficiency"): [s for s in samples if s.cls != "gemm"],
              ("gemm_fixed_us", "compute_efficiency"): [s for s in samples if s.cls == "gemm"]}
    effs = [round(0.01 * i, 2) for i in range(1, 101)]
    for (fk, ek), group in groups.items():
        if not group:
            continue
        ts = sorted(s.meas for s in group)
        fixed = sorted({round(ts[int(q * (len(ts) - 1))], 2) for q in (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5)} | {0.0})
        best = None
        for f in fixed:
            for e in effs:
                trial = dict(c, **{fk: f, ek: e})
                err = sum(math.log(predict(s, dev, trial) / s.meas) ** 2 for s in group) / len(group)
                if best is None or err < best[0] - 1e-12:
                    best = (err, f, e)
        c[fk], c[ek] = best[1], best[2]
    return c


def fit_constants(samples, dev, rows, plans) -> dict:
    sys.path.insert(0, str(ROOT / "scripts"))
    from calibrate_costmodel import constants_of, predict, rel_errors

    c = joint_fit(samples, dev, predict, constants_of(dev))
    before = rel_errors(samples, lambda s: predict(s, dev, constants_of(dev)))
    after = rel_errors(samples, lambda s: predict(s, dev, c))
    tuned = dev.model_copy(update=c)
    for r, plan in zip(rows, plans):
        p = plan_graph(plan, tuned, None).simulate()
        r["roofline_fitted_us"] = p
        r["roofline_fitted_error_pct"] = 100 * (p - r["measured_us"]) / r["measured_us"]
    return {"constants": c,
            "per_class": {k: {"n": len(before[k]), "yaml": statistics.median(before[k]), "fitted": statistics.median(after[k])}
                          for k in before},
            "median_abs_whole_error_pct": statistics.median(abs(r["roofline_fitted_error_pct"]) for r in rows)}


if __name__ == "__main__":
    sys.exit(main())
