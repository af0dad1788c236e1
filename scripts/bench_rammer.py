#!/usr/bin/env python3
"""baseline, astitch, rammer and full side by side, measured in one run (`scripts/bench.py --rammer`).

For each model and pipeline: launches per inference, the H100 latency `dlcc estimate` predicts
for the plan compiled for an H100 (each persistent kernel priced by its rProgram: waves on its
vEUs plus grid barriers), and with --run the PoCL wall time per inference (median of --repeat,
all pipelines run back to back in this process, compiled for the PoCL device). Then the issue's
floors, each checked against the numbers of this run:

  - LSTM-TC (lstm-tc full: 10 layers x 100 steps, hidden 256, batch 1), rammer: <= 10 launches, and
    predicted H100 latency <= 1/5 of baseline's;
  - BERT-small (bert-small full: batch 8, seq 128), full: <= 28 launches;
  - BERT-base (bert full: batch 1, seq 128), full: <= 76 launches;
  - GPU busy: the simulated GPU-busy share of BERT-small batch 1 (bert-small small) with full on
    an H100 >= 80%.

    .venv/bin/python scripts/bench_rammer.py                 # the floors' models, then the small models with --run
    .venv/bin/python scripts/bench_rammer.py --models lstm,bert --size small --run
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

PIPES = ("baseline", "astitch", "rammer", "full")
FLOOR_MODELS = [("lstm-tc", "full"), ("bert-small", "full"), ("bert-small", "small"), ("bert", "full")]
SMALL = ["cnn", "mobilenet", "yolo", "ocr", "lstm", "lstm-tc", "gru", "bert", "gpt2", "vit"]


def bench(name: str, size: str, out_dir: Path, repeat: int, run: bool) -> dict:
    import dlcc
    import models
    from dlcc.config import load_device
    from dlcc.estimate.plan_graph import plan_graph
    from dlcc.estimate.trace_mode import gpu_busy
    from dlcc.estimate.whatif import parse

    path = models.export(name, out_dir, size)
    row = {"model": f"{name}-{size}"}
    h100 = load_device("h100")
    for pipe in PIPES:
        t0 = time.perf_counter()
        m = dlcc.compile(path, target="opencl", pipeline=pipe, device="h100")
        g = plan_graph(m.plan, h100, name=pipe)
        us = g.simulate()
        row[pipe] = {"launches": len(m.plan["launches"]), "h100_us": us, "gpu_busy": gpu_busy(g, g.iterations),
                     "compile_s": time.perf_counter() - t0,
                     "persistent": sum(1 for L in m.plan["launches"] if L["op_type"] == "Rammer")}
        if pipe == "baseline":  # what the co-schedule what-if predicted before the pass existed
            h = parse("co-schedule").apply(g)
            row["co_schedule_whatif_us"] = h.simulate()
    if run:
        feeds = None
        for pipe in PIPES:
            m = dlcc.compile(path, target="opencl", pipeline=pipe)
            feeds = feeds or m.sample_inputs(0)
            m(feeds)
            ts = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                m(feeds)
                ts.append(time.perf_counter() - t0)
            row[pipe]["pocl_ms"] = statistics.median(ts) * 1e3
            row[pipe]["pocl_launches"] = len(m.plan["launches"])
    return row


def floors(rows: dict) -> list[tuple[str, str, bool]]:
    out = []
    tc = rows.get("lstm-tc-full")
    if tc:
        n, r = tc["rammer"]["launches"], tc["baseline"]["h100_us"] / tc["rammer"]["h100_us"]
        out.append(("LSTM-TC rammer launches <= 10", f"{n} (baseline {tc['baseline']['launches']})", n <= 10))
        out.append(("LSTM-TC predicted H100 baseline/rammer >= 5", f"{r:.1f}x ({tc['baseline']['h100_us']:.0f} -> "
                    f"{tc['rammer']['h100_us']:.0f} µs)", r >= 5))
    bs = rows.get("bert-small-full")
    if bs:
        n = bs["full"]["launches"]
        out.append(("BERT-small b8 full launches <= 28 (TVM 71)", str(n), n <= 28))
    bb = rows.get("bert-full")
    if bb:
        n = bb["full"]["launches"]
        out.append(("BERT-base b1 full launches <= 76 (TVM 191)", str(n), n <= 76))
    b1 = rows.get("bert-small-small")
    if b1:
        busy = b1["full"]["gpu_busy"]
        out.append(("BERT-small b1 full GPU busy >= 80% (eager PyTorch 7%)", f"{100 * busy:.0f}%", busy >= 0.8))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", help="comma-separated names (default: the floors' models, then the small models)")
    ap.add_argument("--size", choices=("small", "full"), default="small")
    ap.add_argument("--run", action="store_true", help="also time each pipeline on PoCL (small models)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out-dir", type=Path, default=ROOT / ".cache" / "models")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    err = Console(stderr=True)
    todo = ([(n, args.size) for n in args.models.split(",")] if args.models
            else FLOOR_MODELS + [(n, "small") for n in SMALL])
    rows = {}
    for name, size in todo:
        with err.status(f"{name}-{size}"):
            run = args.run and size == "small" and (name, size) not in FLOOR_MODELS
            rows[f"{name}-{size}"] = bench(name, size, args.out_dir, args.repeat, run)
        err.print(f"done {name}-{size}")
    checks = floors(rows)
    if args.json:
        print(json.dumps({"rows": rows, "floors": [{"floor": a, "measured": b, "met": c} for a, b, c in checks]},
                         indent=2))
        return 0 if all(c for _, _, c in checks) else 1
    t = Table(title="launches | predicted H100 µs (plans compiled for the H100) | PoCL ms (plans for PoCL)")
    t.add_column("model")
    for p in PIPES:
        t.add_column(p, justify="right")
    t.add_column("co-schedule what-if on baseline, µs", justify="right")
    t.add_column("PoCL ms b / a / r / f", justify="right")
    t.add_column("r/b, f/a (PoCL)", justify="right")
    for name, r in rows.items():
        cells = [f"{r[p]['launches']} | {r[p]['h100_us']:.0f}" for p in PIPES] + [f"{r['co_schedule_whatif_us']:.0f}"]
        if "pocl_ms" in r["baseline"]:
            ms = [r[p]["pocl_ms"] for p in PIPES]
            cells += [" / ".join(f"{x:.1f}" for x in ms), f"{ms[2] / ms[0]:.2f}, {ms[3] / ms[1]:.2f}"]
        else:
            cells += ["", ""]
        t.add_row(name, *cells)
    Console(width=200).print(t)
    f = Table(title="floors (issue 8)")
    for c in ("floor", "measured", "met"):
        f.add_column(c)
    for a, b, c in checks:
        f.add_row(a, b, "yes" if c else "NO")
    Console(width=200).print(f)
    return 0 if all(c for _, _, c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
