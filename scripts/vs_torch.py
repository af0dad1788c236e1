#!/usr/bin/env python3
"""dlcc beside PyTorch at every precision, in one process, on the same weights.

For each model and precision it times:
  - PyTorch eager, `torch.compile`, and `torch.compile(mode="reduce-overhead")` (CUDA graphs),
    and `torch.compile(backend="dlcc")` (`--torch-modes dlcc-backend`);
  - dlcc through each pipeline at that precision,
and checks every engine's outputs against onnxruntime on the float32 model, at the tolerance
`dlcc verify` documents for the precision, so a fast wrong answer shows as one.

Why one process: the ratio is what matters, and two processes on a lent GPU differ in clocks,
warm-up and allocator state. The weights are the same because scripts/models.py builds each
model from a fixed seed and exports the ONNX file from that module.

What each precision means on both sides:
  - fp32: TF32 off (`torch.backends.cuda.matmul.allow_tf32 = False`, cuDNN too); dlcc `--precision fp32`;
  - tf32: TF32 on for matmuls and convolutions; dlcc `--precision tf32`;
  - fp16, bf16: the module and its float inputs cast to the type (what an H100 user runs); dlcc
    `--precision fp16|bf16` on the float32 model (half weights, float32 accumulation).

Timing: one inference per sample, median of --repeat, inputs already on the device; CUDA events
on a GPU, wall time on the CPU (dlcc on PoCL). torch.compile's compile time is its first call.

    python scripts/vs_torch.py --size full --models bert,gpt2,vit,cnn --precisions fp32,tf32,bf16
    python scripts/vs_torch.py --size small --models bert --target opencl --precisions fp32 \\
        --torch-modes eager              # the script itself, on a machine without a GPU

Prints a markdown table (the README's); --json-out keeps every row. Exit status 1 when a dlcc
compile failed or a dlcc output was outside its tolerance.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

PRECISIONS = ("fp32", "tf32x3", "tf32", "fp16", "bf16")
#: "dlcc-backend" is torch.compile(backend="dlcc") (dlcc/torch_backend.py): dlcc's plans for the
#: graphs dynamo captures, at the row's precision through the `full` pipeline.
TORCH_MODES = ("eager", "default", "reduce-overhead", "dlcc-backend")


def torch_precision(precision: str):
    """Set PyTorch's global TF32 switches for `precision`; returns the dtype to cast the module to."""
    import torch

    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision, torch.float32)


def median_us(call, repeat: int, cuda: bool) -> float:
    """µs per call: CUDA events around each call on a GPU, wall time on the CPU."""
    import torch

    samples = []
    if cuda:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(repeat):
            s.record()
            call()
            e.record()
            e.synchronize()
            samples.append(s.elapsed_time(e) * 1e3)
    else:
        for _ in range(repeat):
            t0 = time.perf_counter()
            call()
            samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def torch_rows(name: str, size: str, precision: str, modes: list[str], path: Path, feeds: dict, repeat: int,
               cuda: bool) -> list[dict]:
    """One row per torch mode: time, compile time, and the outputs judged like dlcc's."""
    import models
    import torch

    from dlcc.verify import verify_outputs

    dtype = torch_precision(precision)
    dev = "cuda" if cuda else "cpu"
    built = models.build(name, size)
    mod = built.module.to(dev).to(dtype)
    # The ONNX inputs (sample_inputs) in the module's positional order, floats in the module's dtype.
    args = [torch.from_numpy(feeds[k]).to(dev) for k in built.inputs]
    args = [a.to(dtype) if a.is_floating_point() else a for a in args]
    rows = []
    for mode in modes:
        row = {"model": f"{name}-{size}", "precision": precision, "engine": f"torch {mode}"}
        try:
            torch._dynamo.reset()
            if mode == "dlcc-backend":
                fn = torch.compile(mod, backend="dlcc", dynamic=False,
                                   options={"pipeline": "full", "precision": precision})
            else:
                fn = mod if mode == "eager" else torch.compile(mod, mode=None if mode == "default" else mode)
            with torch.inference_mode():
                t0 = time.perf_counter()
                out = fn(*args)
                if cuda:
                    torch.cuda.synchronize()
                row["compile_s"] = time.perf_counter() - t0
                for _ in range(3):  # reduce-overhead records its CUDA graph after warm-up calls
                    out = fn(*args)
                outs = (out,) if isinstance(out, torch.Tensor) else out
                got = {n: o.detach().float().cpu().numpy() for n, o in zip(built.output_names, outs)}
                row["us"] = median_us(lambda: fn(*args), repeat, cuda)
            judge(row, verify_outputs(path, got, feeds, precision=precision))
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    del mod, args
    if cuda:
        torch.cuda.empty_cache()
    return rows


def dlcc_row(name: str, size: str, precision: str, pipeline: str, path: Path, feeds: dict, repeat: int,
             target: str, device: str | None = None) -> dict:
    import dlcc
    from dlcc.verify import verify_outputs
    from gpu_check import time_run

    row = {"model": f"{name}-{size}", "precision": precision, "engine": f"dlcc {pipeline}"}
    t0 = time.perf_counter()
    cm = dlcc.compile(path, target=target, pipeline=pipeline, precision=precision, device=device)
    row["compile_s"] = time.perf_counter() - t0
    ex = cm.executor()
    judge(row, verify_outputs(path, ex.run(feeds), feeds, precision=precision))
    row["us"] = time_run(ex, repeat)  # inputs stay on the device from the run above
    row["launches"] = len(ex.calls)
    row["device_from"] = cm.plan["meta"].get("device_from")
    row["graph"] = getattr(ex, "graph", None) is not None  # replayed as one CUDA graph
    return row


def judge(row: dict, checks: list[dict]) -> None:
    """Fold verify_outputs' rows into `row`: within tolerance, and the worst relative error."""
    row["ok"] = all(c["passed"] for c in checks)
    row["max_rel_err"] = max(c["max_rel_err"] for c in checks)
    row["tolerance"] = sorted({f"rtol {c['rtol']:g} atol {c['atol']:g}" for c in checks if "rtol" in c})


def table(rows: list[dict], device: str) -> str:
    """Markdown: per model and precision, each engine's time and its ratio to reduce-overhead
    (else to torch.compile, else eager) at the same precision (fp32 for dlcc's tf32x3)."""
    lines = [f"device: {device}", "",
             "| model | precision | engine | µs | × torch ref | within tolerance | max rel err | compile s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['precision']} | {r['engine']} | error: {r['error'][:100]} | | | | |")
            continue
        ref_prec = "fp32" if r["precision"] == "tf32x3" else r["precision"]  # torch's side of tf32x3: its fp32
        same = {x["engine"]: x.get("us") for x in rows if x["model"] == r["model"] and x["precision"] == ref_prec}
        ref = next((same[k] for k in ("torch reduce-overhead", "torch default", "torch eager") if same.get(k)), None)
        ratio = f"{r['us'] / ref:.2f}" if ref else "-"
        lines.append(f"| {r['model']} | {r['precision']} | {r['engine']} | {r['us']:.0f} | {ratio} | "
                     f"{'yes' if r['ok'] else 'NO'} | {r['max_rel_err']:.1e} | {r['compile_s']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="bert,gpt2,vit,cnn", help="comma-separated names from scripts/models.py")
    ap.add_argument("--size", choices=("small", "full"), default="full")
    ap.add_argument("--precisions", default="fp32,tf32,bf16", help=f"comma-separated, of {', '.join(PRECISIONS)}")
    ap.add_argument("--pipelines", default="full,astitch", help="dlcc pipelines (comma-separated)")
    ap.add_argument("--torch-modes", default=",".join(TORCH_MODES), help=f"of {', '.join(TORCH_MODES)}")
    ap.add_argument("--target", default="cuda", help="cuda (default); opencl to try the script without a GPU")
    ap.add_argument("--models-dir", type=Path, default=ROOT / ".cache" / "models")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--device", help="dlcc's device spec (default: the detected GPU's, as a user gets)")
    ap.add_argument("--json-out", type=Path)
    a = ap.parse_args(argv)
    precisions = a.precisions.split(",")
    modes = [m for m in a.torch_modes.split(",") if m]
    bad = [p for p in precisions if p not in PRECISIONS] + [m for m in modes if m not in TORCH_MODES]
    if bad:
        ap.error(f"unknown precision or torch mode: {', '.join(bad)}")
    import torch

    from gpu_check import model_path

    cuda = a.target == "cuda" and torch.cuda.is_available()
    if a.target == "cuda" and not cuda:
        ap.error("no CUDA GPU for torch here; use --target opencl to try the script on the CPU")
    rows, failed = [], False
    for name in a.models.split(","):
        path = model_path(name, a.size, a.models_dir)
        import models

        feeds = models.sample_inputs(name, path, 0)
        for pr in precisions:
            print(f"[vs-torch] {name} {pr}", file=sys.stderr, flush=True)
            if pr == "tf32x3" and "fp32" in precisions:
                pass  # torch's side of tf32x3 is its fp32 (TF32 off): timed once, in the fp32 rows
            else:
                rows += torch_rows(name, a.size, "fp32" if pr == "tf32x3" else pr, modes, path, feeds, a.repeat, cuda)
            for p in a.pipelines.split(","):
                try:
                    r = dlcc_row(name, a.size, pr, p, path, feeds, a.repeat, a.target, a.device)
                except Exception as e:
                    traceback.print_exc()
                    r = {"model": f"{name}-{a.size}", "precision": pr, "engine": f"dlcc {p}", "ok": False,
                         "error": f"{type(e).__name__}: {str(e)[:200]}"}
                failed |= not r["ok"]
                rows.append(r)
                print(json.dumps(r), file=sys.stderr, flush=True)
            if a.json_out:
                a.json_out.write_text(json.dumps(rows, indent=1))
    device = torch.cuda.get_device_name() if cuda else f"CPU (dlcc on {a.target})"
    print(table(rows, device))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
