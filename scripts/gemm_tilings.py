#!/usr/bin/env python3
"""Every GEMM tiling on real GEMM shapes, timed on the target: calibrates `choose_tiling`.

dlcc's GEMM rOperator (dlcc/kernels/gemm.py) comes in several tilings, and `choose_tiling` picks
one per shape from a cost model. This script measures what the model only predicts: for each
shape (default: BERT-base's linear layers at b1 s128, a ResNet-50 conv as implicit GEMM, GPT-2's
LM head and a square one) it emits the rOperator for every tiling the device's family has (on a GPU
also each one split along K, kernels/splitk.py) plus candidate tilings not yet in it, checks each
against numpy, times it (on CUDA inside a CUDA graph of 20 launches, as --vs-torch times cuBLAS;
on OpenCL with profiling events), and prints the time, the rate, the kernel's registers, and which
tiling the model picks. (Before 2026-11-26 the CUDA times were 8 queued launches, which added up
to a microsecond or two to a short kernel: scripts/data/h200_gemm_*.json were timed that way.)

    python scripts/gemm_tilings.py                      # on CUDA (needs a GPU and PyCUDA)
    python scripts/gemm_tilings.py --target opencl --shapes 64x96x80 --repeat 3   # the script itself, on PoCL
    python scripts/gemm_tilings.py --precision tf32     # the tensor-core tilings (kernels/gemm_mma.py)

Shapes are MxNxK; B is stored [N, K] (a Linear/Gemm weight with transB=1), as in the models.
`--shapes models` takes every weight GEMM and ungrouped convolution (as implicit GEMM) of the
full-size BERT-base, GPT-2, ViT-B/16 and ResNet-50 (scripts/models.py), each shape once; the
attention's batched activation-by-activation MatMuls are not among them.

`--vs-torch` times `torch.matmul` at the same precision on each shape (cuBLAS on a GPU; TF32 only
at tf32; fp16/bf16 operands), as device time: 20 calls captured in one CUDA graph, replayed, so
the host's launch cost is not in it. The summary then gives dlcc's pick as a fraction of
torch's TFLOP/s, which issue 18's floors are stated in (>= 0.9 at fp32, >= 0.8 at tf32/fp16/bf16):

    python scripts/gemm_tilings.py --precision bf16 --vs-torch --shapes models
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from dlcc.backends.source import render
from dlcc.config import load_device
from dlcc.executor import make_runtime, use_dynamic_smem
from dlcc.kernels import splitk
from dlcc.kernels.gemm import (CPU_TILINGS, TILINGS, VECTOR_TILINGS, Tiling, choose_tiling, gemm_source, kernel_smem,
                               plain_spec, simt_cost, tilings_for)
from dlcc.tuning import time_kernel

SHAPES = ["128x768x768", "128x3072x768", "128x768x3072", "3136x64x576", "128x50257x768", "1024x1024x1024"]

#: Tilings measured beside the device's family: deeper k, larger per-thread tiles (fewer shared-memory reads
#: per FMA), fewer threads per block.
CANDIDATES = (
    Tiling(32, 32, 32, 2, 2),
    Tiling(32, 32, 64, 4, 4),
    Tiling(32, 64, 64, 2, 4),
    Tiling(32, 64, 64, 4, 4),
    Tiling(64, 64, 64, 4, 4),
    Tiling(64, 64, 32, 8, 8),
    Tiling(128, 64, 32, 8, 4),
    Tiling(128, 128, 16, 8, 8),
    Tiling(16, 64, 64, 2, 4),
)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="cuda")
    ap.add_argument("--device", default=None, help="DeviceSpec for the model's pick (default: h100; pocl-cpu when "
                    "the target runs on the CPU, whose tilings are the ones measured there)")
    ap.add_argument("--shapes", default=",".join(SHAPES),
                    help="MxNxK,... ; `models`: every GEMM shape of the full-size test models")
    ap.add_argument("--vs-torch", action="store_true", help="also time torch.matmul at the same precision")
    ap.add_argument("--models-dir", type=Path, default=Path(__file__).resolve().parents[1] / ".cache" / "models")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "tf32x3", "tf32", "fp16", "bf16"],
                    help="tf32, fp16, bf16: the tensor-core tilings (kernels/gemm_mma.py), checked against numpy "
                    "on operands rounded the same way; at fp16 and bf16 A and B are stored in the half type, as "
                    "a compiled model stores activations and weights (so both go by cp.async)")
    ap.add_argument("--json", dest="json_out", type=Path, default=None,
                    help="also write every measurement here ({device, rows: [{shape, tiling, precision, us}]}), "
                    "the form --fit reads")
    ap.add_argument("--fit", nargs="+", type=Path, default=None, metavar="MEASUREMENTS.json",
                    help="run nothing: fit the device's gemm_cycle_us (µs per cycle of the tiling cost models, what "
                    "plan mode prices dlcc's GEMMs with) on measurements written by --json, and print each row's "
                    "modelled against measured time")
    ap.add_argument("--tilings", default=None, metavar="NAMES",
                    help="time only these tilings (base names, comma-separated; their split variants too); "
                    "`vector`: the vector template's (kernels/gemm.py VECTOR_TILINGS) beside their scalar twins; "
                    "`wgmma`: Hopper's warpgroup-MMA ones (kernels/gemm_wgmma.py), on PoCL too (emulated)")
    ap.add_argument("--model-only", action="store_true",
                    help="run nothing: print the cost model's pick per shape on --device, unsplit and with split-K "
                    "(kernels/splitk.py), and the modelled gain")
    a = ap.parse_args(argv)
    if a.fit or a.model_only:
        a.device = a.device or "h100"
        return fit(a) if a.fit else model_only(a)
    rt = make_runtime(a.target)
    dev = load_device(a.device or ("pocl-cpu" if rt.is_cpu() else "h100"))
    # On a CPU device (PoCL) LLVM crashes optimising the larger per-thread tiles (GPU_TILINGS and
    # most CANDIDATES): only the CPU family and its scalar twins run there, and VECTOR_TILINGS when
    # asked for (they build).
    cpu = TILINGS + CPU_TILINGS + (VECTOR_TILINGS if a.tilings == "vector" else ())
    tilings = list(dict.fromkeys(cpu if rt.is_cpu() else tilings_for(dev, vector=True) + CANDIDATES))
    choose, cost, rnd, b_dtype = choose_tiling, simt_cost(dev), (lambda x: x), "float32"
    if a.precision != "fp32":
        from dlcc.kernels.gemm_mma import choose_mma_tiling, deep_tilings_fit, mma_cost, mma_family
        from dlcc.kernels.gemm_wgmma import wgmma_fits
        from dlcc.ops.narrow import HALF_DTYPES
        from dlcc.testing.rounding import operand_round

        # the DEEP tilings (dynamic shared memory) too, where the GPU's shared memory holds them
        deep = not rt.is_cpu() and deep_tilings_fit(dev)
        # Hopper's wgmma ones (kernels/gemm_wgmma.py) on an sm_90 spec and GPU, or wherever asked for
        # (`--tilings wgmma`: on PoCL, through the prelude's emulation)
        wg = (not rt.is_cpu() and wgmma_fits(dev)) or a.tilings == "wgmma"
        tilings = list(splitk.variants(mma_family(a.precision, dev, deep, wg), None if rt.is_cpu() else dev))
        cost = mma_cost
        choose = lambda *args: choose_mma_tiling(*args, precision=a.precision)  # noqa: E731
        rnd = lambda x: operand_round(x, a.precision)  # noqa: E731
        b_dtype = HALF_DTYPES.get(a.precision, "float32")
    if a.tilings:
        wanted = set(vector_and_twins() if a.tilings == "vector" else
                     [t.name for t in tilings if getattr(t, "wgmma", False)] if a.tilings == "wgmma" else a.tilings.split(","))
        tilings = [t for t in tilings if splitk.base_name(t.name) in wanted]
        if not tilings:
            print(f"--tilings {a.tilings}: none of the {a.precision} tilings is named so", file=sys.stderr)
            return 2
    rng = np.random.default_rng(0)
    summary, measured = [], []
    shapes = model_gemm_shapes(a.models_dir) if a.shapes == "models" else a.shapes.split(",")
    for shp in shapes:
        M, N, K = map(int, shp.split("x"))
        spec = plain_spec(M, N, K, b_dtype=b_dtype, a_dtype=b_dtype)
        names = {t: f"gemm_{shp}_{t.name}" for t in tilings}
        rt.compile(render([gemm_source(names[t], spec, t) for t in tilings], rt.dialect))
        use_dynamic_smem(rt, [{"name": names[t], "dynamic_smem_bytes": kernel_smem(t)["dynamic_smem"]} for t in tilings])
        A = rng.standard_normal((M, K), dtype=np.float32)
        B = rng.standard_normal((N, K), dtype=np.float32)
        ref = rnd(A).astype(np.float64) @ rnd(B).astype(np.float64).T
        A = A.astype(np.dtype(b_dtype)).view(np.uint8)  # storage in the precision's type (bytes: ml_dtypes' bfloat16)
        B = B.astype(np.dtype(b_dtype)).view(np.uint8)
        sizes = [A.nbytes, B.nbytes, M * N * 4]
        bufs = [rt.alloc(n) for n in sizes]
        rt.write(bufs[0], 0, A)
        rt.write(bufs[1], 0, B)
        args = [rt.view(b, 0, n) for b, n in zip(bufs, sizes)]
        pick = choose(1, M, N, K, dev)
        rows = []
        for t in tilings:
            k = rt.kernel(names[t])
            grid, extra = splitk.standalone_args(rt, t, 1, M, N)  # a split tiling's workspace and counters
            targs = args + extra
            rt.write(bufs[2], 0, np.full(M * N, np.nan, np.float32))  # poison: every element must be written
            rt.launch(k, grid, t.threads, targs)
            rt.finish()
            out = np.empty((M, N), np.float32)
            rt.read(bufs[2], 0, out)
            err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref)) if np.isfinite(out).all() else float("inf")
            us = time_kernel(rt, k, grid, t.threads, targs, a.repeat)  # in a CUDA graph on CUDA, as torch's
            regs = ""
            try:
                regs = k.get_attribute(rt.drv.function_attribute.NUM_REGS)
            except Exception:
                pass
            rows.append((us, t, err, regs, grid))
            measured.append({"shape": [M, N, K], "tiling": t.name, "precision": a.precision, "us": round(us, 3)})
            print(f"[gemm] {shp} {t.name}: {us:.1f} µs, rel err {err:.1e}", file=sys.stderr, flush=True)
        rows.sort(key=lambda r: r[0])
        best = rows[0][0]
        print(f"\n{M}x{N}x{K} (model picks {pick.name}; {2 * M * N * K / 1e9:.2f} GFLOP)")
        print("| tiling | threads | regs | grid | µs | TFLOP/s | × best | rel err | model cost |")
        print("|---|---|---|---|---|---|---|---|---|")
        for us, t, err, regs, grid in rows:
            mark = " ←" if t == pick else ""
            print(f"| {t.name}{mark} | {t.threads} | {regs} | {grid} | {us:.1f} | {2 * M * N * K / us / 1e6:.2f} | "
                  f"{us / best:.2f} | {err:.1e} | {cost(t, 1, M, N, K, dev):.0f} |")
        picked = next((r[0] for r in rows if r[1] == pick), float("nan"))
        torch_us = torch_matmul_us(M, N, K, a.precision, a.repeat) if a.vs_torch else None
        summary.append((shp, pick.name, picked, rows[0][1].name, best, torch_us))
        if any(r[2] > 1e-4 for r in rows):
            print("MISMATCH: " + ", ".join(r[1].name for r in rows if r[2] > 1e-4))
            return 1
    if a.json_out:
        a.json_out.write_text(json.dumps({"device": getattr(rt, "device_name", a.target), "rows": measured}, indent=1))
    print(f"\n{a.precision}" + (" (torch: share of torch.matmul's TFLOP/s = torch µs / dlcc µs)" if a.vs_torch else ""))
    print("| shape | model's pick | µs | fastest | µs | pick / fastest |" + (" torch µs | pick's share | fastest's share |"
                                                                           if a.vs_torch else ""))
    print("|---|---|---|---|---|---|" + ("---|---|---|" if a.vs_torch else ""))
    for shp, pn, pu, bn, bu, tu in summary:
        more = f" {tu:.1f} | {tu / pu:.2f} | {tu / bu:.2f} |" if tu else ""
        print(f"| {shp} | {pn} | {pu:.1f} | {bn} | {bu:.1f} | {pu / bu:.2f} |{more}")
    return 0


def vector_and_twins() -> list[str]:
    """The names of the vector template's tilings and of their scalar twins (same tile, vec off)."""
    import dataclasses

    return [n for t in VECTOR_TILINGS for n in (t.name, dataclasses.replace(t, vec=False).name)]


def fit(a) -> int:
    """DeviceSpec.gemm_cycle_us (SIMT rows) or mma_cycle_us[key] (tensor-core rows: one scale per
    template and precision, gemm_mma.py scale_key) from measured GEMM rOperators: µs =
    kernel_fixed_us + cycles x f, f the geometric mean of (µs - fixed) / cycles over the rows of
    its key (least squares on log time, so a 2x miss counts the same on a 20 and a 400 µs GEMM).
    Prints each row's modelled time with it."""
    from dlcc.kernels.gemm import tiling_and_cost
    from dlcc.kernels.gemm_mma import scale_key

    # the model's raw cycles: without the device's scales, which weigh one template against another
    dev = load_device(a.device).model_copy(update={"mma_cycle_us": None})
    rows = []
    for p in a.fit:
        try:
            data = json.loads(p.read_text())
            rows += [r for r in data["rows"] if r["us"] > 0 and len(r["shape"]) == 3]
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"--fit: {p}: not a measurements file written by --json ({type(e).__name__}: {e})", file=sys.stderr)
            return 2
    groups: dict[str, list] = {}
    for r in rows:
        found = tiling_and_cost(r["tiling"], dev)
        if found is None:
            print(f"skipped: unknown tiling {r['tiling']}", file=sys.stderr)
            continue
        t, cost = found
        key = scale_key(t) if hasattr(t, "precision") else "fp32"  # a tensor-core tiling, or SIMT
        groups.setdefault(key, []).append((r, cost(t, 1, *r["shape"], dev), getattr(t, "vec", False)))
    if not groups:
        print("no rows to fit", file=sys.stderr)
        return 1
    fixed = dev.kernel_fixed_us
    for key, pts in sorted(groups.items()):
        f = math.exp(statistics.fmean(math.log(max(r["us"] - fixed, 1e-3) / c) for r, c, _ in pts))
        field = "gemm_cycle_us" if key == "fp32" else f"mma_cycle_us[{key}]"
        print(f"{field} for {dev.name}: {f:.6f} µs per modelled cycle (a {1e-3 / f:.2f} GHz clock) "
              f"(kernel_fixed_us {fixed}), {len(pts)} rows")
        print("| M×N×K | tiling | measured µs | modelled µs | modelled / measured |")
        print("|---|---|---|---|---|")
        worst = 1.0
        for r, c, _ in pts:
            us = fixed + c * f
            worst = max(worst, us / r["us"], r["us"] / us)
            print(f"| {'x'.join(map(str, r['shape']))} | {r['tiling']} | {r['us']:.1f} | {us:.1f} | {us / r['us']:.2f} |")
        print(f"worst ratio {worst:.2f}x\n")
        if key == "fp32" and len({v for *_, v in pts}) == 2:
            # the scalar and vector SIMT forms share the scale, and the model counts the vector
            # form's float4 reads as one instruction each: a vector form measured slower than
            # modelled, against the scalar one, says the saving is smaller than counted
            for form, vec in (("scalar", False), ("vector", True)):
                ratios = [r["us"] / (fixed + c * f) for r, c, v in pts if v == vec]
                print(f"{form} rows: measured / modelled {math.exp(statistics.fmean(map(math.log, ratios))):.2f}x "
                      f"(geometric mean of {len(ratios)})")
            print()
    return 0


def model_only(a) -> int:
    """The cost model's best tiling per shape without and with split-K, and the modelled ratio."""
    from dlcc.kernels.gemm import tiling_cost
    from dlcc.kernels.gemm_mma import choose_mma_tiling, mma_cost

    dev = load_device(a.device)
    if a.precision == "fp32":
        pick, cost = (lambda s, *x: choose_tiling(*x, dev, split=s)), (lambda t, *x: simt_cost(dev)(t, *x, dev))
    else:
        pick = lambda s, *x: choose_mma_tiling(*x, dev, a.precision, s)  # noqa: E731
        cost = lambda t, *x: mma_cost(t, *x, dev)  # noqa: E731
    shapes = model_gemm_shapes(a.models_dir) if a.shapes == "models" else a.shapes.split(",")
    print(f"{a.precision} on {dev.name}: the cost model's pick, modelled cycles")
    print("| M×N×K | unsplit | cycles | with split-K | cycles | modelled gain |")
    print("|---|---|---|---|---|---|")
    for shp in shapes:
        M, N, K = map(int, shp.split("x"))
        t0, t1 = pick(False, 1, M, N, K), pick(True, 1, M, N, K)
        c0, c1 = cost(t0, 1, M, N, K), cost(t1, 1, M, N, K)
        print(f"| {shp} | {t0.name} | {c0:.0f} | {t1.name} | {c1:.0f} | {c0 / c1:.2f}x |")
    return 0


def model_gemm_shapes(models_dir: Path, names=("bert", "gpt2", "vit", "cnn"), size: str = "full") -> list[str]:
    """MxNxK of every MatMul/Gemm with a constant B and every ungrouped Conv (implicit GEMM: M =
    batch x output pixels, N = output channels, K = input channels x kernel area) of the full-size
    models, first-seen order, each once. Shapes are dlcc's own (import_model: folded and inferred,
    every dim concrete)."""
    from dlcc.frontend import import_model

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_check import model_path

    seen: dict[str, None] = {}
    for name in names:
        g = import_model(model_path(name, size, models_dir))
        for n in g.nodes:
            if n.op_type not in ("MatMul", "Gemm", "Conv") or g.tensors[n.inputs[1]].value is None:
                continue
            x, w = g.tensors[n.inputs[0]].shape, g.tensors[n.inputs[1]].shape
            if n.op_type == "Conv":
                if n.attrs.get("group", 1) != 1:
                    continue
                y = g.tensors[n.outputs[0]].shape
                M, N, K = int(np.prod((y[0],) + y[2:])), w[0], int(np.prod(w[1:]))
            elif n.attrs.get("transA"):
                M, K = x[-1], x[-2]
            else:
                M, K = int(np.prod(x[:-1])), x[-1]
            if n.op_type != "Conv":
                N = w[0] if n.attrs.get("transB") else w[-1]
            seen[f"{M}x{N}x{K}"] = None
    return list(seen)


def torch_matmul_us(M: int, N: int, K: int, precision: str, repeat: int) -> float:
    """torch.matmul(A, B.T) on [M, K] x [N, K] at `precision`, µs per call: on a GPU, 20 calls in
    one CUDA graph, replayed and timed with events; on the CPU, wall time."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from vs_torch import torch_precision

    dtype = torch_precision(precision)
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    A = torch.randn(M, K, device=dev).to(dtype)
    B = torch.randn(N, K, device=dev).to(dtype)
    C = torch.empty(M, N, device=dev, dtype=dtype)
    samples = []
    if not cuda:
        for _ in range(3 + repeat):
            t0 = time.perf_counter()
            torch.matmul(A, B.T, out=C)
            samples.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(samples[3:])  # the first calls warm up
    calls = 20
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (cuBLAS picks its kernel here)
        for _ in range(3):
            torch.matmul(A, B.T, out=C)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            torch.matmul(A, B.T, out=C)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(repeat):
        s.record()
        graph.replay()
        e.record()
        e.synchronize()
        samples.append(s.elapsed_time(e) * 1e3 / calls)
    return statistics.median(samples)


if __name__ == "__main__":
    sys.exit(main())
