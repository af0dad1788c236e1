#!/usr/bin/env python3
"""baseline against astitch, side by side, measured in one run (`scripts/bench.py --astitch` runs this).

For each model: launches and memory-bound launches per inference, modelled DRAM bytes against the
lower bound (weights + inputs + outputs), the H100 latency `dlcc estimate` predicts, compile time,
and the PoCL wall time per inference as the ratio astitch / baseline (median of --repeat runs,
both pipelines run back to back in this process). Also the `stitch-memory-bound` what-if's
prediction on the baseline plan, to compare with what the pass achieved.

    .venv/bin/python scripts/bench_astitch.py                    # small models + BERT-base, ResNet-50, GPT-2, ViT-B/16
    .venv/bin/python scripts/bench_astitch.py --models bert --size full --json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

SMALL = ["cnn", "mobilenet", "yolo", "ocr", "lstm", "gru", "bert", "gpt2", "vit"]
FULL = ["bert", "cnn", "gpt2", "vit"]  # BERT-base (b1, s128), ResNet-50, GPT-2, ViT-B/16


def bench(name: str, size: str, out_dir: Path, repeat: int, run: bool) -> dict:
    import dlcc
    import models
    from dlcc.estimate.plan_mode import estimate_plan
    from dlcc.estimate.whatif import parse

    path = models.export(name, out_dir, size)
    row = {"model": f"{name}-{size}"}
    comp = {}
    for pipe in ("baseline", "astitch"):
        t0 = time.perf_counter()
        m = dlcc.compile(path, target="opencl", pipeline=pipe)
        row[f"{pipe}_compile_s"] = time.perf_counter() - t0
        s = m.stats
        row[f"{pipe}_launches"] = s["launches"]
        row[f"{pipe}_memory_bound_launches"] = s["memory_bound_launches"]
        row[f"{pipe}_dram_over_lb"] = s["dram_bytes"] / max(1, s["lower_bound_bytes"])
        comp[pipe] = m
    est = estimate_plan(path, (), "h100", pipelines=["baseline", "astitch"], what_ifs=False)
    by = {p.name: p for p in est.pipelines}
    for pipe in ("baseline", "astitch"):
        row[f"{pipe}_h100_us"] = by[pipe].predicted_us
    row["whatif_stitch_us"] = parse("stitch-memory-bound").apply(by["baseline"].graph).simulate()
    if run:
        feeds = comp["baseline"].sample_inputs(0)
        times = {}
        exs = {p: comp[p].executor() for p in comp}
        for p in exs:
            exs[p].run(feeds)  # warm-up
        samples = {p: [] for p in exs}
        for _ in range(repeat):
            for p, ex in exs.items():
                t = {}
                ex.run(feeds, t)
                samples[p].append(t["run_s"])
        for p in exs:
            times[p] = statistics.median(samples[p])
            row[f"{p}_pocl_ms"] = times[p] * 1e3
        row["pocl_ratio"] = times["astitch"] / times["baseline"]
    b, a = row["baseline_memory_bound_launches"], row["astitch_memory_bound_launches"]
    row["memory_bound_cut"] = 1 - a / max(1, b)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", help="comma-separated names (default: all small, then the full four)")
    ap.add_argument("--size", choices=("small", "full", "both"), default="both")
    ap.add_argument("--out-dir", type=Path, default=ROOT / ".cache" / "models")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-run", action="store_true", help="skip the PoCL wall-time runs")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    names = a.models.split(",") if a.models else None
    sel = []
    if a.size in ("small", "both"):
        sel += [(n, "small") for n in (names or SMALL)]
    if a.size in ("full", "both"):
        sel += [(n, "full") for n in (names or FULL)]
    rows = []
    for n, size in sel:
        print(f"[bench] {n}-{size}", file=sys.stderr, flush=True)
        try:
            rows.append(bench(n, size, a.out_dir, a.repeat, not a.no_run))
        except Exception as e:  # a row per failure, the rest still measured
            rows.append({"model": f"{n}-{size}", "error": f"{type(e).__name__}: {e}"})
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    hdr = ("model", "launches b→a", "mem-bound b→a", "cut", "DRAM/LB b→a", "H100 µs b→a (what-if)", "compile s b/a",
           "PoCL ms b→a", "a/b")
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | error: {r['error']} |")
            continue
        pocl = (f"{r['baseline_pocl_ms']:.2f} → {r['astitch_pocl_ms']:.2f}", f"{r['pocl_ratio']:.2f}") \
            if "pocl_ratio" in r else ("-", "-")
        print(f"| {r['model']} | {r['baseline_launches']} → {r['astitch_launches']} | "
              f"{r['baseline_memory_bound_launches']} → {r['astitch_memory_bound_launches']} | "
              f"{100 * r['memory_bound_cut']:.0f}% | {r['baseline_dram_over_lb']:.2f} → {r['astitch_dram_over_lb']:.2f} | "
              f"{r['baseline_h100_us']:.0f} → {r['astitch_h100_us']:.0f} ({r['whatif_stitch_us']:.0f}) | "
              f"{r['baseline_compile_s']:.1f} / {r['astitch_compile_s']:.1f} | {pocl[0]} | {pocl[1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
