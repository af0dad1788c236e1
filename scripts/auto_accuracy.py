#!/usr/bin/env python3
"""How well `--pipeline auto` picks, measured on the target device (issue 20's floors).

For each model: `dlcc estimate`'s ranking of the built-in pipelines for the device spec, then every
pipeline compiled and timed on the target (dlcc/tuning.py's time_inferences: a warm-up each, then
--repeat rounds that run every pipeline once in turn, the median per pipeline; pipelines that
build the same plan are one measurement), and

  - `auto / fastest`: the measured time of the pipeline auto picks over the measured-fastest one
    (the floor: within 1.05 on every model);
  - Kendall's tau between the predicted and the measured order (the floor: >= 0.8);
  - predicted / measured for auto's pick.

    python scripts/auto_accuracy.py                          # small models, OpenCL (PoCL here)
    python scripts/auto_accuracy.py --target cuda --device h100 --models bert,cnn,gpt2,vit --size full

Exit status 0; the numbers are the result.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))


def kendall_tau(predicted: dict[str, float], measured: dict[str, float]) -> float:
    """Kendall's tau-b between two orders of the same names given as times (1: the same order,
    -1: reversed). A tie (two pipelines predicted alike, or one plan measured once for both) is
    neither agreement nor disagreement."""
    names = sorted(predicted)
    conc = disc = tp = tm = 0
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            dp = (predicted[x] > predicted[y]) - (predicted[x] < predicted[y])
            dm = (measured[x] > measured[y]) - (measured[x] < measured[y])
            tp += dp == 0
            tm += dm == 0
            conc += dp * dm > 0
            disc += dp * dm < 0
    pairs = len(names) * (len(names) - 1) // 2
    denom = ((pairs - tp) * (pairs - tm)) ** 0.5
    return (conc - disc) / denom if denom else 1.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="cnn,mobilenet,yolo,ocr,lstm,gru,bert,gpt2,vit")
    ap.add_argument("--size", default="small", choices=["small", "full"])
    ap.add_argument("--target", default="opencl", choices=["opencl", "cuda"])
    ap.add_argument("--device", default=None, help="device spec for the estimate (default: the target's default)")
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--models-dir", type=Path, default=ROOT / ".cache" / "models")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)

    import dlcc
    from dlcc.devices import resolve_device
    from dlcc.estimate.plan_mode import estimate_plan
    from dlcc.tuning import time_inferences
    from gpu_check import model_path

    dev = resolve_device(a.device, a.target)[0]
    rows = []
    for name in a.models.split(","):
        path = model_path(name, a.size, a.models_dir)
        est = estimate_plan(path, device=dev, what_ifs=False)
        predicted = {p.name: p.predicted_us for p in est.pipelines}
        cms = {p: dlcc.compile(path, target=a.target, pipeline=p, device=dev, cache=False) for p in predicted}
        measured = time_inferences(cms, a.repeat)
        del cms
        for p in predicted:
            print(f"[auto] {name} {p}: predicted {predicted[p]:.0f} µs, measured {measured[p]:.0f} µs",
                  file=sys.stderr, flush=True)
        pick, fastest = est.best.name, min(measured, key=measured.get)
        row = {"model": name, "auto": pick, "fastest": fastest, "auto_over_fastest": measured[pick] / measured[fastest],
               "kendall_tau": kendall_tau(predicted, measured),
               "predicted_over_measured": predicted[pick] / measured[pick], "measured_us": measured,
               "predicted_us": predicted}
        rows.append(row)
    if a.json:
        print(json.dumps({"target": a.target, "device": dev.name, "rows": rows}, indent=1))
        return 0
    print(f"\n{a.target} on {dev.name}, {a.size} models, median of {a.repeat}")
    print("| model | auto picks | measured fastest | auto / fastest | Kendall τ | predicted / measured (pick) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['auto']} | {r['fastest']} | {r['auto_over_fastest']:.2f} | {r['kendall_tau']:.2f} "
              f"| {r['predicted_over_measured']:.2f} |")
    within = sum(r["auto_over_fastest"] <= 1.05 for r in rows)
    print(f"\nauto within 5% of the fastest on {within} of {len(rows)} models; "
          f"median τ {sorted(r['kendall_tau'] for r in rows)[len(rows) // 2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
