#!/usr/bin/env python3
"""`dlcc batch` timings on the test models, measured in one run (issue 9's benchmark; not a test):

  - a cold cache against a warm one (floor: warm <= 1/5 of cold);
  - -j 1 against -j 2 (cold caches);
  - shard 1/2 + shard 2/2 (each -j 1, cold, one after the other: two CI machines) against the
    whole batch at -j 1: the sum shows the split's overhead, the max what two machines would take;
    split by model size, then by the times the -j 1 run measured (a manifest's `costs:`).

    .venv/bin/python scripts/bench_batch.py [--models cnn,bert,...] [--pipelines baseline,full] [--verify]

Every run is a real `dlcc batch` subprocess with its own fresh cache directory (except the warm
one), so worker start-up, imports and cache I/O are all in the figures.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))


def batch(manifest: Path, out: Path, cache: Path, *extra: str) -> tuple[float, dict]:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "dlcc.cli", "batch", str(manifest), "--out", str(out), "--cache", str(cache),
                        "--json", *extra], capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"dlcc batch {' '.join(extra)} failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return dt, json.loads(p.stdout)


def main(argv=None) -> None:
    import models

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="cnn,mobilenet,yolo,ocr,lstm,gru,bert,gpt2,vit")
    ap.add_argument("--full", default="bert,bert-small,lstm-tc", help="full-size models too (BERT-base: 440 MB)")
    ap.add_argument("--pipelines", default="baseline,astitch,rammer,full")
    ap.add_argument("--verify", action="store_true", help="verify every job against onnxruntime too")
    a = ap.parse_args(argv)
    mdir = ROOT / ".cache" / "models"
    paths = [models.export(n, mdir, "small") for n in a.models.split(",") if n]
    paths += [models.export(n, mdir, "full") for n in a.full.split(",") if n]
    with tempfile.TemporaryDirectory(prefix="dlcc-bench-batch-") as tmp:
        tmp = Path(tmp)
        man = tmp / "bench.yaml"
        man.write_text("defaults: {target: opencl" + (", verify: true" if a.verify else "") + "}\njobs:\n"
                       f"  - model: [{', '.join(str(p) for p in paths)}]\n    pipelines: [{a.pipelines}]\n")
        n = len(paths) * len(a.pipelines.split(","))
        print(f"{n} jobs ({len(paths)} models, {a.full or 'none'} at full size, x {a.pipelines})"
              f"{' with verify' if a.verify else ''}", flush=True)
        rows = []
        cold2, s = batch(man, tmp / "o1", tmp / "c1", "-j", "2")
        warm2, s2 = batch(man, tmp / "o2", tmp / "c1", "-j", "2")
        hits = sum(1 for r in s2["rows"] if r.get("cache_hit"))
        vhits = sum(1 for r in s2["rows"] if r.get("verify_cached"))
        rows.append(("cold cache, -j 2", cold2, ""))
        rows.append(("warm cache, -j 2", warm2, f"{warm2 / cold2:.3f} of cold ({hits}/{n} hits"
                                                + (f", {vhits}/{n} cached verifications" if a.verify else "")
                                                + "; floor <= 0.2)"))
        slow = max(s2["rows"], key=lambda r: r["seconds"])
        rows.append(("  slowest warm job", slow["seconds"], f"{slow['name']} (a hit: key, checks, hard links)"))
        cold1, _ = batch(man, tmp / "o3", tmp / "c3", "-j", "1")
        rows.append(("cold cache, -j 1", cold1, f"-j 2 is {cold1 / cold2:.2f}x faster"))
        # Shards balanced by model size, then by the times the -j 1 run measured (`costs:`).
        timed = tmp / "timed.yaml"
        timed.write_text(man.read_text() + f"costs: [{tmp / 'o3' / 'summary.json'}]\n")
        for label, m in (("by size", man), ("by measured time", timed)):
            s1, _ = batch(m, tmp / f"o4{label}", tmp / f"c4{label}", "-j", "1", "--shard", "1/2")
            s2t, _ = batch(m, tmp / f"o5{label}", tmp / f"c5{label}", "-j", "1", "--shard", "2/2")
            rows.append((f"shard 1/2, -j 1 ({label})", s1, ""))
            rows.append((f"shard 2/2, -j 1 ({label})", s2t, f"sum {(s1 + s2t) / cold1:.2f}x, max "
                                                           f"{max(s1, s2t) / cold1:.2f}x the whole batch at -j 1"))
    w = max(len(r[0]) for r in rows)
    for name, sec, note in rows:
        print(f"{name:<{w}}  {sec:7.2f} s  {note}")


if __name__ == "__main__":
    main()
