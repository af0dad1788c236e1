#!/usr/bin/env python3
"""Rammer's two ways of waiting, measured in one run: `sync: grid-barrier` (one grid barrier per
wave) against `sync: counters` (per-entry dependency counters), docs/rammer.md.

For each model, `PIPELINE` (default `full`) is compiled with `join: always` (every run that can be
joined is one persistent kernel, so the waits are what differs) in each sync mode, beside the
pipeline's own `join: auto` plan. All three run on the target (CUDA where a GPU is present, else
OpenCL/PoCL) in interleaved rounds (dlcc/tuning.py time_inferences), after their outputs are
checked against onnxruntime. The table prints µs per inference and the ratio counters / barrier:
below 1, counters pay on that model and device.

    .venv/bin/python scripts/bench_sync.py --models cnn,bert,lstm --size small --repeat 15
    python scripts/bench_sync.py --models lstm-tc,bert,gpt2,yolo --size full --device h100   # on a GPU
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

MODES = ("grid-barrier", "counters")


def variants(pipeline: str) -> dict:
    """Label -> PipelineSpec: the pipeline itself, and joined with each sync mode."""
    from dlcc.tuning import pipeline_with

    out = {pipeline: pipeline}
    for mode in MODES:
        out[f"join: always, sync: {mode}"] = pipeline_with(pipeline, {}, {"join": "always", "sync": mode})
    return out


def bench(path: Path, pipeline: str, target: str, device: str | None, repeat: int) -> dict:
    import dlcc
    from dlcc.tuning import time_inferences
    from dlcc.verify import verify_outputs

    cms, row = {}, {}
    for label, spec in variants(pipeline).items():
        cm = dlcc.compile(path, target=target, pipeline=spec, device=device)
        feeds = cm.sample_inputs(0)
        rows = verify_outputs(path, cm(feeds), feeds)
        if not all(r["passed"] for r in rows):
            raise SystemExit(f"{path.name} {label}: outputs differ from onnxruntime: {rows}")
        spin = [L["rprogram"] for L in cm.plan["launches"] if L.get("grid_sync") and L.get("rprogram")]
        row[label] = {"launches": len(cm.plan["launches"]), "persistent": len(spin),
                      "waits": sum(r.get("dependencies", r.get("sync_points", 0)) for r in spin)}
        cms[label] = cm
    for label, us in time_inferences(cms, repeat).items():
        row[label]["us"] = us
    b, c = (row[f"join: always, sync: {m}"]["us"] for m in MODES)
    row["counters_over_barrier"] = c / b
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="cnn,bert,lstm,ocr", help="comma-separated test-model names")
    ap.add_argument("--size", choices=("small", "full"), default="small")
    ap.add_argument("--pipeline", default="full", help="a pipeline that runs rammer (default full)")
    ap.add_argument("--target", default="auto", help="auto (CUDA if a GPU is present), cuda or opencl")
    ap.add_argument("--device", default=None, help="device spec to plan for (default: the target's)")
    ap.add_argument("--repeat", type=int, default=15, help="timed rounds (default 15)")
    ap.add_argument("--out-dir", type=Path, default=ROOT / ".cache" / "models")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--json-out", type=Path, help="also write that JSON object to this file")
    a = ap.parse_args(argv)

    import models
    from rich.console import Console
    from rich.table import Table

    from dlcc.executor import pick_target

    target = pick_target(a.target)
    rows = {}
    a.out_dir.mkdir(parents=True, exist_ok=True)
    for name in a.models.split(","):
        path = models.export(name, a.out_dir, a.size)
        rows[f"{name}-{a.size}"] = bench(Path(path), a.pipeline, target, a.device, a.repeat)
    report = {"target": target, "pipeline": a.pipeline, "size": a.size, "repeat": a.repeat, "rows": rows}
    if a.json_out:
        a.json_out.write_text(json.dumps(report, indent=1))
    if a.json:
        print(json.dumps(report))
        return 0
    t = Table(title=f"Rammer sync modes on {target} ({a.pipeline}; µs per inference, median of {a.repeat})")
    labels = list(variants(a.pipeline))
    for c in ["model"] + labels + ["counters / barrier"]:
        t.add_column(c, justify="right" if c != "model" else "left")
    for m, r in rows.items():
        t.add_row(m, *(f"{r[x]['us']:.0f} ({r[x]['launches']} launches, {r[x]['waits']} waits)" for x in labels),
                  f"{r['counters_over_barrier']:.2f}x")
    Console().print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
