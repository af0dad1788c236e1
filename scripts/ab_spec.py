#!/usr/bin/env python3
"""A device-spec switch off and on, in one process: should the built-in spec turn it on?

The h100 spec's switches (`gemm_wgmma`, `persistent_dynamic_smem`, ...) go on once a GPU has run
the plans they make faster. Timed in two processes, as `scripts/gpu_session.sh` first did, the
answer drowned in the machine's drift: on an H200 torch.compile's own time for one model moved
15-30% between processes. So here each model is compiled with the spec as given and with the
switches on, both plans are checked against onnxruntime, and they are timed in interleaved rounds
(one inference of each in turn, so drift moves both alike): on CUDA, events around the launches
of one inference (inputs already on the device, as `scripts/gpu_check.py` times); elsewhere, wall
time around the launches and a finish.

    python scripts/ab_spec.py --models cnn,bert --size full --precision bf16 --switch gemm_wgmma --device h100
    .venv/bin/python scripts/ab_spec.py --models cnn --precision bf16 --switch gemm_wgmma --device h100 --plan-only

Prints a table (µs off, µs on, on / off, launches, and whether both plans are within the
precision's tolerance of onnxruntime); --json-out keeps the rows. Exit status 1 when a compile
failed or an output was out of tolerance. --plan-only compiles and compares the plans (kernels
and launches) without running them, built for OpenCL as `dlcc inspect` builds a GPU spec's plan:
the check on a machine without the device.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))


def spec_with(device: str, switches: list[str], folder: Path) -> Path:
    """`device`'s spec with each switch on, as a YAML file in `folder` (named for the switches)."""
    import yaml

    from dlcc.config import load_device

    d = load_device(device).model_dump()
    unknown = [s for s in switches if s not in d or not isinstance(d[s], bool)]
    if unknown:
        raise SystemExit(f"not a switch of the {device!r} spec: {', '.join(unknown)}")
    for s in switches:
        d[s] = True
    d["name"] += f" ({', '.join(switches)})"
    path = folder / f"{device}-{'-'.join(switches)}.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


def compare(path: Path, specs: dict, precision: str, pipeline: str, target: str, repeat: int,
            plan_only: bool) -> dict:
    """One model: each spec's plan compiled (and unless plan_only, checked and timed)."""
    import dlcc
    from dlcc.verify import verify_outputs

    row: dict = {}
    exs = {}
    for label, spec in specs.items():
        cm = dlcc.compile(path, target=target, pipeline=pipeline, precision=precision, device=str(spec))
        kernels = {k["name"]: k for k in cm.plan.get("kernels", [])}
        row[label] = {"launches": len(cm.plan.get("launches", [])),
                      "tilings": sorted({kernels[L["kernel"]].get("tiling") for L in cm.plan.get("launches", [])
                                         if kernels.get(L["kernel"], {}).get("tiling")})}
        if plan_only:
            continue
        ex = cm.executor()
        feeds = cm.sample_inputs(0)
        checks = verify_outputs(path, ex.run(feeds), feeds, precision=precision)
        row[label]["ok"] = all(c["passed"] for c in checks)
        exs[label] = ex
    if plan_only:
        return row
    from gpu_check import time_run

    samples = {label: [] for label in exs}
    for label, ex in exs.items():  # a warm-up each (the CUDA graph's capture)
        time_run(ex, 1)
    for _ in range(repeat):
        for label, ex in exs.items():
            samples[label].append(time_run(ex, 1))
    for label in exs:
        row[label]["us"] = statistics.median(samples[label])
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="cnn,bert", help="comma-separated names from scripts/models.py")
    ap.add_argument("--size", choices=("small", "full"), default="full")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--pipeline", default="full")
    ap.add_argument("--switch", required=True, help="the spec's switches to turn on (comma-separated)")
    ap.add_argument("--device", default="h100", help="the spec as shipped (default h100)")
    ap.add_argument("--target", default="auto", help="auto (CUDA if a GPU is present), cuda or opencl")
    ap.add_argument("--repeat", type=int, default=30, help="timed rounds (default 30)")
    ap.add_argument("--models-dir", type=Path, default=ROOT / ".cache" / "models")
    ap.add_argument("--plan-only", action="store_true", help="compile and compare the plans; run nothing")
    ap.add_argument("--json-out", type=Path)
    a = ap.parse_args(argv)

    import models
    from rich.console import Console
    from rich.table import Table

    from dlcc.executor import pick_target

    target = "opencl" if a.plan_only else pick_target(a.target)  # (plan-only: the spec's plans, built as inspect builds them)
    switches = [s.strip() for s in a.switch.split(",") if s.strip()]
    folder = Path(tempfile.mkdtemp(prefix="dlcc-ab-"))
    on = f"{a.device} + {', '.join(switches)}"
    specs = {a.device: a.device, on: spec_with(a.device, switches, folder)}
    rows, failed = {}, False
    a.models_dir.mkdir(parents=True, exist_ok=True)
    for name in a.models.split(","):
        try:
            path = models.export(name, a.models_dir, a.size)
            rows[name] = compare(Path(path), specs, a.precision, a.pipeline, target, a.repeat, a.plan_only)
            failed |= not all(r.get("ok", True) for r in rows[name].values())
        except Exception as e:  # noqa: BLE001 (one model's failure is a row; the others still run)
            traceback.print_exc()
            rows[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            failed = True
        print(json.dumps({name: rows[name]}), file=sys.stderr, flush=True)
    report = {"target": target, "device": a.device, "switches": switches, "precision": a.precision,
              "pipeline": a.pipeline, "size": a.size, "repeat": a.repeat, "rows": rows}
    if a.json_out:
        a.json_out.write_text(json.dumps(report, indent=1))
    t = Table(title=f"{', '.join(switches)} off and on ({a.pipeline}, {a.precision}, {target}; "
                    f"µs per inference, median of {a.repeat} interleaved rounds)")
    for c in ("model", "off µs", "on µs", "on / off", "launches off / on", "tilings changed", "within tolerance"):
        t.add_column(c)
    for name, r in rows.items():
        if "error" in r:
            t.add_row(name, r["error"], "", "", "", "", "no")
            continue
        off, onr = r[a.device], r[on]
        ratio = f"{onr['us'] / off['us']:.2f}x" if "us" in off else "-"
        t.add_row(name, *(f"{x['us']:.0f}" if "us" in x else "-" for x in (off, onr)), ratio,
                  f"{off['launches']} / {onr['launches']}", str(len(set(onr["tilings"]) - set(off["tilings"]))),
                  "-" if a.plan_only else ("yes" if off["ok"] and onr["ok"] else "no"))
    Console(width=160).print(t)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
