#!/usr/bin/env python3
"""dlcc on a real NVIDIA GPU, in one process: every model × pipeline compiled for CUDA, checked
against onnxruntime on two input seeds, and timed; PyTorch eager timed beside it on the same GPU.

Why one script: a lent GPU machine is held for minutes, not hours, so everything that needs it
(PyCUDA build check, numerics, timing) runs in one call and prints one table at the end.

Per model and pipeline it reports:
  - `ok`: every output within `dlcc verify`'s default tolerance (atol 1e-4 + rtol 1e-3·|ref|) of
    onnxruntime's, for input seeds 0 and 1 (a race or an unwritten output shows up as a mismatch
    that differs between seeds);
  - `launches`, `spin`: kernel launches per inference, and how many of them wait on other blocks
    (grid barrier) with the grid the runtime clamped them to;
  - `run µs`: one inference, CUDA events around the whole launch loop, median of --repeat; this
    includes the host's launch overhead whenever the GPU outruns Python;
  - `kernel µs`: the sum of the per-launch device times (`dlcc profile`'s measurement), i.e. the
    time the GPU is busy;
  - `torch µs`: the same model in PyTorch eager (float32, TF32 off), CUDA events, median; only for
    the models scripts/models.py can build;
  - `pred µs`, `pred/run`: plan mode's prediction (`dlcc estimate`'s cost model for the device
    spec the plan was compiled for) and its ratio to `run µs`.

With more than one pipeline, a second table gives per model the pipeline the cost model ranks
first, the measured-fastest one, the first one's measured time over the fastest's, and Kendall's
τ between the predicted and the measured order (issue 20's floors: within 1.05, τ >= 0.8).

    python scripts/gpu_check.py --models-dir .gpu/models                       # the small models
    python scripts/gpu_check.py --size full --models bert,cnn,gpt2,vit --json-out results.json

Exit status 1 when any compile or comparison failed.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

SMALL = ["cnn", "mobilenet", "yolo", "ocr", "lstm", "gru", "bert", "gpt2", "vit"]
HF = ["hf-convnext", "hf-deit", "hf-distilbert", "hf-llama", "hf-roberta", "hf-swin", "hf-t5-encoder"]


def model_path(name: str, size: str, models_dir: Path) -> Path:
    p = models_dir / (f"{name}.onnx" if name.startswith("hf-") else f"{name}-{size}.onnx")
    if p.exists():
        return p
    import models  # exports with the torch on this machine

    return models.export(name, models_dir, size)


def feeds_for(name: str, path: Path, cm, seed: int) -> dict:
    import models

    if name in models.MODELS:
        return models.sample_inputs(name, path, seed)
    return cm.sample_inputs(seed)


def time_run(ex, repeat: int) -> float:
    """µs per inference: CUDA events around the launch loop (inputs already on the device)."""
    rt = ex.rt
    samples = []
    if not hasattr(rt, "timer"):  # OpenCL: wall time around launches + finish
        for _ in range(repeat):
            t0 = time.perf_counter()
            ex.launch_all()
            rt.finish()
            samples.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(samples)
    with rt.active():  # dlcc's work runs in the primary context, current only inside active()
        start, stop = rt.timer()
        for _ in range(repeat):
            start.record()
            ex.launch_all()
            stop.record()
            stop.synchronize()
            samples.append(start.time_till(stop) * 1e3)
    return statistics.median(samples)


def time_torch(name: str, size: str, repeat: int) -> float | None:
    import models
    import torch

    if name not in models.MODELS or not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    built = models.build(name, size)
    mod = built.module.cuda()
    args = [t.cuda() for t in built.inputs.values()]
    with torch.inference_mode():
        for _ in range(3):
            mod(*args)
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        samples = []
        for _ in range(repeat):
            s.record()
            mod(*args)
            e.record()
            e.synchronize()
            samples.append(s.elapsed_time(e) * 1e3)
    del mod, args
    torch.cuda.empty_cache()
    return statistics.median(samples)


def check(name: str, size: str, pipeline: str, models_dir: Path, repeat: int, target: str = "cuda",
          task_form: bool = False) -> dict:
    import dlcc
    from dlcc.verify import verify_outputs

    row = {"model": name if name.startswith("hf-") else f"{name}-{size}", "pipeline": pipeline}
    path = model_path(name, size, models_dir)
    t0 = time.perf_counter()
    cm = dlcc.compile(path, target=target, pipeline=pipeline)
    row["compile_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if task_form:  # every kernel rewritten into its rOperator form (Rammer's task functions)
        from dlcc.executor import Executor, make_runtime
        from dlcc.kernels.roperator import task_form_source

        rt = make_runtime(target)
        ex = Executor(cm.plan, cm.weights, task_form_source(cm.plan, cm.kernel_codes, rt.dialect), rt)
        row["pipeline"] += " (task form)"
    else:
        ex = cm.executor()
    row["load_s"] = time.perf_counter() - t0
    row["device"] = ex.rt.device_name
    row["launches"] = len(ex.calls)
    spin = [(L["kernel"], L["grid"], g) for L, (_, g, _, _) in zip(cm.plan["launches"], ex.calls) if L.get("grid_sync")]
    row["spin_launches"] = len(spin)
    row["spin_grids"] = spin[:8]
    worst, ok = 0.0, True
    for seed in (0, 1):
        feeds = feeds_for(name, path, cm, seed)
        # the model's graph outputs (not dlcc's list): a dropped or renamed output fails
        for c in verify_outputs(path, ex.run(feeds), feeds, 1e-3, 1e-4):
            ok &= c["passed"]
            worst = max(worst, c["max_rel_err"])
    row["ok"] = ok
    row["max_rel_err"] = worst
    row["run_us"] = time_run(ex, repeat)
    from dlcc.devices import resolve_device
    from dlcc.estimate.plan_graph import plan_graph

    row["predicted_us"] = plan_graph(cm.plan, resolve_device(None, target)[0]).simulate()
    times, how = ex.profile(feeds, max(3, repeat // 4))
    row["kernel_us"] = sum(times)
    row["timed_by"] = how
    top = sorted(zip(times, cm.plan["launches"]), key=lambda t: -t[0])[:3]
    row["slowest"] = [(L["kernel"], L["op_type"], round(us, 1)) for us, L in top]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", help="comma-separated (default: the small models and the hf zoo)")
    ap.add_argument("--size", choices=("small", "full"), default="small")
    ap.add_argument("--pipelines", default="baseline,astitch")
    ap.add_argument("--models-dir", type=Path, default=ROOT / ".cache" / "models")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--target", default="cuda", help="cuda (default); opencl to try the script without a GPU")
    ap.add_argument("--task-form", action="store_true", help="run every kernel through its rOperator task function")
    ap.add_argument("--json-out", type=Path)
    a = ap.parse_args(argv)
    names = a.models.split(",") if a.models else (SMALL + HF if a.size == "small" else ["bert", "cnn", "gpt2", "vit"])
    rows, failed = [], False
    for n in names:
        torch_us = None
        if not a.no_torch:
            try:
                torch_us = time_torch(n, a.size, a.repeat)
            except Exception as e:
                print(f"[gpu] {n}: torch timing failed: {type(e).__name__}: {e}", file=sys.stderr)
        for p in a.pipelines.split(","):
            print(f"[gpu] {n} {p}", file=sys.stderr, flush=True)
            try:
                r = check(n, a.size, p, a.models_dir, a.repeat, a.target, a.task_form)
            except Exception as e:
                traceback.print_exc()
                r = {"model": n, "pipeline": p, "ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
            r["torch_us"] = torch_us
            failed |= not r["ok"]
            rows.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
            if a.json_out:
                a.json_out.write_text(json.dumps(rows, indent=1))
    print(f"device: {next((r['device'] for r in rows if 'device' in r), '?')}")
    print("| model | pipeline | ok | max rel err | launches | spin | run µs | kernel µs | pred µs | pred/run "
          "| torch eager µs | compile s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | {r['pipeline']} | ERROR | {r['error'][:120]} |")
            continue
        tu = f"{r['torch_us']:.0f}" if r.get("torch_us") else "-"
        print(f"| {r['model']} | {r['pipeline']} | {'yes' if r['ok'] else 'NO'} | {r['max_rel_err']:.1e} | "
              f"{r['launches']} | {r['spin_launches']} | {r['run_us']:.0f} | {r['kernel_us']:.0f} | "
              f"{r['predicted_us']:.0f} | {r['predicted_us'] / r['run_us']:.2f} | {tu} | {r['compile_s']:.1f} |")
    ranking_table(rows)
    return 1 if failed else 0


def ranking_table(rows: list[dict]) -> None:
    """Per model with two or more timed pipelines: predicted-first against measured-fastest, and
    Kendall's tau of the two orders."""
    from auto_accuracy import kendall_tau

    by_model: dict[str, list[dict]] = {}
    for r in rows:
        if "error" not in r:
            by_model.setdefault(r["model"], []).append(r)
    ranked = {m: rs for m, rs in by_model.items() if len(rs) > 1}
    if not ranked:
        return
    print("\n| model | predicted first | measured fastest | first / fastest | Kendall τ |")
    print("|---|---|---|---|---|")
    for m, rs in ranked.items():
        pred = [r["pipeline"] for r in sorted(rs, key=lambda r: (r["predicted_us"], r["pipeline"]))]
        meas = [r["pipeline"] for r in sorted(rs, key=lambda r: r["run_us"])]
        run = {r["pipeline"]: r["run_us"] for r in rs}
        tau = kendall_tau({r["pipeline"]: r["predicted_us"] for r in rs}, run)
        print(f"| {m} | {pred[0]} | {meas[0]} | {run[pred[0]] / run[meas[0]]:.2f} | {tau:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
