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
    python scripts/plan_accuracy.py --fit --pipelines baseline,astitch,rammer,full,large-tiles
    python scripts/plan_accuracy.py --target cuda --size full --models bert,gpt2 --precision bf16 \
        --pipelines astitch,full --fit        # on a GPU: dlcc's own kernels at bf16 (gpu_session.sh 13)

With ``--fit`` the measured per-launch times also calibrate the cost model for the device on
dlcc's own kernels (fit_launches: the cost model itself on trial constants, least squares on log
time, one class of kernels per step: memory-bound, GEMM, AStitch's fused GEMMs, unoptimised builds
with persistent kernels).
The script prints the constants to put in the device YAML, the median per-launch error per class
before and after, and the whole-inference roofline prediction with the fitted constants.
``--pipelines`` compiles each model with each of them, so that every kind of kernel is measured.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # (after site-packages: an installed dlcc, not the checkout's folder)

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import dlcc  # noqa: E402
from dlcc.config import load_device  # noqa: E402
from dlcc.estimate.plan_graph import plan_graph  # noqa: E402
from dlcc.estimate.profiledb import ProfileDB  # noqa: E402

DEFAULT = "resnet-tiny,cnn,mobilenet,ocr,lstm,bert,vit"


def model_path(name: str, cache: Path, size: str = "small") -> Path:
    if name == "resnet-tiny":
        return ROOT / "examples" / "resnet-tiny.onnx"
    p = cache / f"{name}-{size}.onnx"
    if not p.exists():
        import subprocess

        subprocess.run([sys.executable, str(ROOT / "scripts" / "models.py"), "-o", str(cache), "--size", size,
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
    ap.add_argument("--samples", type=Path, default=None,
                    help="with --fit: also write the measured launches (launch, kernel, µs) to this JSON file")
    ap.add_argument("--size", default="small", choices=["small", "full"],
                    help="the test models' size (scripts/models.py; exported into --cache on first use)")
    ap.add_argument("--precision", default=None, help="compile at this precision (fp32, tf32, bf16...; default: the "
                    "pipeline's own)")
    ap.add_argument("--pipelines", default=None,
                    help="comma-separated pipelines to compile each model with (default: the target's default); "
                         "rows are MODEL/PIPELINE, and --fit sees every pipeline's kernels")
    args = ap.parse_args(argv)
    dev_key = args.device or ("pocl-cpu" if args.target == "opencl" else "h100")
    dev = load_device(dev_key)
    err = Console(stderr=True)
    rows, samples, plans = [], [], []
    pipes = args.pipelines.split(",") if args.pipelines else [None]
    for name, pipe in [(n, p) for n in args.models.split(",") for p in pipes]:
        path = model_path(name, args.cache, args.size)
        m = dlcc.compile(path, target=args.target, device=dev_key, precision=args.precision,
                         **({"pipeline": pipe} if pipe else {}))
        name = f"{name}/{pipe}" if pipe else name
        ex = m.executor()
        x = m.sample_inputs()
        times, how = ex.profile(x, args.repeat)
        db = ProfileDB("measured")
        for L, us in zip(m.plan["launches"], times):
            db.record(dev.name, L["kernel"], L["grid"], L["block"], us)
        if args.fit:
            samples += launch_samples(m.plan, times)
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
        if args.samples:
            args.samples.write_text(json.dumps([{"launch": {k: v for k, v in L.items() if k not in ("args", "reads", "writes")},
                                                 "kernel": k, "us": us} for L, k, us in samples]))
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


def launch_samples(plan: dict, times: list[float]) -> list[tuple]:
    """(launch, kernel entry, measured µs) per plan launch."""
    kernels = {k["name"]: k for k in plan.get("kernels", [])}
    return [(L, kernels.get(L["kernel"]), max(us, 1e-3)) for L, us in zip(plan["launches"], times)]


def sample_class(L: dict, k: dict | None) -> str:
    """The constants a launch's modelled time depends on: persistent (grid_barrier_us), unoptimised
    (unoptimised_slowdown), gemm (gemm_fixed_us, compute_efficiency), fused gemm (also
    fused_gemm_slowdown) or memory (kernel_fixed_us, dram_efficiency)."""
    from dlcc.backends.opencl import builds_unoptimised
    from dlcc.estimate.costmodel import is_gemm_launch

    if L.get("rprogram"):
        return "persistent"
    if builds_unoptimised(k, bool(L.get("grid_sync"))):
        return "unoptimised"
    if is_gemm_launch(L, k):
        return "fused gemm" if (k or {}).get("pass") == "astitch" else "gemm"
    return "memory"


#: The constants fitted per step, on the launches of the step's classes, each searched over its
#: grid with the earlier ones fixed ("fixed": the 0-50th percentiles of the classes' times).
FIT_STEPS = (
    (("memory",), {"kernel_fixed_us": "fixed", "dram_efficiency": [round(0.01 * i, 2) for i in range(1, 101)]}),
    (("gemm",), {"gemm_fixed_us": "fixed", "compute_efficiency": [round(0.005 * i, 3) for i in range(1, 201)]}),
    (("fused gemm",), {"fused_gemm_slowdown": [round(0.5 + 0.1 * i, 2) for i in range(0, 56)]}),
    (("unoptimised", "persistent"), {"unoptimised_slowdown": [round(1 + i, 2) for i in range(0, 40)],
                                     "unoptimised_task_us": [float(x) for x in range(0, 81, 2)],
                                     "grid_barrier_us": [float(x) for x in range(0, 201, 20)]}),
)


def fit_launches(samples, dev) -> dict:
    """The device's cost-model constants fitted on measured launches of dlcc's own kernels, by
    grid search on mean squared log error with the cost model itself (costmodel.launch_time on a
    trial DeviceSpec), class by class (FIT_STEPS): fixed costs from the 0-50th percentile of the
    class's times jointly with its efficiency; then the unoptimised builds' slowdown together
    with the persistent kernels' barrier cost. A CPU OpenCL device pays a large dispatch cost per launch,
    so fixed cost and efficiency are searched together."""
    import itertools
    import math

    from dlcc.estimate.costmodel import launch_time

    c = {k: getattr(dev, k) for _, grid in FIT_STEPS for k in grid}
    c["gemm_fixed_us"] = c["gemm_fixed_us"] if c["gemm_fixed_us"] is not None else c["kernel_fixed_us"]
    by_class = {}
    for L, k, us in samples:
        by_class.setdefault(sample_class(L, k), []).append((L, k, us))

    def err(group, trial):
        d = dev.model_copy(update=trial)
        return sum(math.log(launch_time(L, k, d).us / us) ** 2 for L, k, us in group) / len(group)

    for classes, grid in FIT_STEPS:
        group = [x for cls in classes for x in by_class.get(cls, [])]
        if not group:
            continue
        ts = sorted(us for _, _, us in group)
        axes = {key: (sorted({round(ts[int(q * (len(ts) - 1))], 2) for q in (0.05, 0.1, 0.2, 0.3, 0.5)} | {0.0})
                      if vals == "fixed" else vals) for key, vals in grid.items()}
        best = min((err(group, dict(c, **dict(zip(axes, combo)))), combo) for combo in itertools.product(*axes.values()))
        c.update(zip(axes, best[1]))
    return c


def fit_kernel_gap(rows, dev) -> float:
    """kernel_gap_us: what a whole inference takes beyond its launches' profiled times (composed by
    the task graph without the device's current gap), as a + b x launches by least squares over
    the plans; b, the per-launch part (a, the per-inference copies and synchronize, ranks no plan)."""
    import numpy as np

    pts = [(r["launches"], r["measured_us"] - (r["predicted_profile_us"] - r["launches"] * dev.kernel_gap_us))
           for r in rows]
    if len({n for n, _ in pts}) < 2:
        return dev.kernel_gap_us
    A = np.array([[1.0, n] for n, _ in pts])
    b = np.linalg.lstsq(A, np.array([g for _, g in pts]), rcond=None)[0][1]
    return round(max(0.0, float(b)), 1)


def fit_constants(samples, dev, rows, plans) -> dict:
    c = fit_launches(samples, dev)
    c["kernel_gap_us"] = fit_kernel_gap(rows, dev)
    tuned = dev.model_copy(update=c)
    from dlcc.estimate.costmodel import launch_time

    def errors(d):
        out = {}
        for L, k, us in samples:
            out.setdefault(sample_class(L, k), []).append(abs(launch_time(L, k, d).us - us) / us)
        return out

    before, after = errors(dev), errors(tuned)
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
