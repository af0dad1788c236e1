#!/usr/bin/env python3
"""Plan mode's H100 predictions against the H100 times recorded for dlcc (no GPU needed).

`scripts/data/h100_model_measurements.json` holds what earlier sessions measured on an H100 for
the full-size test models (fp32, launches queued one by one: no CUDA graphs, no split-K). This
compiles each model through the same pipelines as those runs had (split_k: false, graphs: false),
asks `dlcc estimate`'s plan mode for the H100 time, and prints predicted against measured: issue
20's accuracy floor is within 1.5x. The plans have moved on since those runs (stitches, tilings),
so a row compares today's plan with yesterday's measurement of a similar one; a GPU session
refreshes the measurements (scripts/gpu_check.py --size full).

    python scripts/estimate_vs_recorded.py [--models-dir DIR] [--json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))


def as_recorded(name: str):
    """Built-in pipeline `name` as the recorded runs had it: no split-K, no CUDA graphs."""
    from dlcc.config import load_pipeline

    p = load_pipeline(name)
    passes = [ps.model_copy(update={"options": {**ps.options, "split_k": False}}) if ps.name == "lower" else ps
              for ps in p.passes]
    return p.model_copy(update={"passes": passes, "graphs": False})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models-dir", type=Path, default=ROOT / ".cache" / "models")
    ap.add_argument("--measurements", type=Path, default=ROOT / "scripts" / "data" / "h100_model_measurements.json")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-gemm-model", action="store_true", help="price GEMMs by the roofline, as before the H100 "
                    "spec had gemm_cycle_us (for comparison)")
    a = ap.parse_args(argv)

    from dlcc.config import load_device
    from dlcc.estimate.plan_mode import estimate_plan
    from gpu_check import model_path

    rec = json.loads(a.measurements.read_text())
    dev = load_device("h100")
    if a.no_gemm_model:
        dev = dev.model_copy(update={"gemm_cycle_us": None})
    rows = []
    for model in dict.fromkeys(r["model"] for r in rec["rows"]):
        mine = [r for r in rec["rows"] if r["model"] == model]
        est = estimate_plan(model_path(model, "full", a.models_dir), device=dev, what_ifs=False,
                            pipelines=[as_recorded(r["pipeline"]) for r in mine])
        pred = {p.name: p.predicted_us for p in est.pipelines}
        for r in mine:
            rows.append({**r, "predicted_us": pred[r["pipeline"]], "ratio": pred[r["pipeline"]] / r["us"]})
            print(f"[estimate] {model} {r['pipeline']}: predicted {pred[r['pipeline']]:.0f} µs, "
                  f"measured {r['us']} µs", file=sys.stderr, flush=True)
    if a.json:
        print(json.dumps({"device": dev.name, "rows": rows}, indent=1))
        return 0
    print(f"\nplan mode on {dev.name} against recorded H100 runs (fp32)")
    print("| model | pipeline | measured µs | predicted µs | predicted / measured | recorded in |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['pipeline']} | {r['us']} | {r['predicted_us']:.0f} | {r['ratio']:.2f} | {r['from']} |")
    worst = max(max(r["ratio"], 1 / r["ratio"]) for r in rows)
    print(f"worst: {worst:.2f}x off")
    return 0


if __name__ == "__main__":
    sys.exit(main())
