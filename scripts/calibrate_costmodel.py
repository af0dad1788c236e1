#!/usr/bin/env python3
"""Check dlcc's kernel cost model (dlcc/estimate/costmodel.py) on real H100 kernels, and fit its
calibration constants.

Input: the PyTorch profiler traces h100_*.json.gz in $DLCC_TRACES (default ../shared/traces) (bf16 Hugging Face
inference, record_shapes on). Each GPU kernel is mapped to its innermost launching aten op:

1. the kernel's args["External id"] names a cpu_op directly, or
2. args["correlation"] -> the cuda_runtime/cuda_driver launch event -> the innermost cpu_op on the
   same thread whose span encloses the launch.

The op's FLOPs and DRAM bytes come from its "Input Dims" and "Input type" (and "Concrete Inputs"
for strides, reduction dims and is_causal):

- gemm: aten::mm/addmm/bmm/baddbmm (2·M·K·N per matrix), flash/efficient attention
  (4·B·H·Sq·Sk·D, halved when causal), cudnn_convolution (2·N·K·P·Q·C/g·R·S);
  bytes = inputs + output.
- elementwise (a fixed list of aten ops): bytes = tensor inputs + output (output = broadcast shape; in-place ops write their
  first input; copy_/fill_ do not read it); aten::cat reads and writes every piece; index_select
  reads and writes the selected rows.
- reduction: native_layer_norm, mean/sum/amax/all/any/..., _softmax: bytes = input + output.

Kernels whose class (dlcc.estimate.kernelclass) differs from the op's (cuDNN layout transposes
inside a convolution), ops that launch several kernels of their class, ops not modelled and
kernels with no launching event in the trace are counted as unmapped, with the reason.

Prediction: costmodel.kernel_time with configs/devices/h100.yaml at the op's dtype, the kernel's
real grid, block, registers and shared memory. Reported per class: count and median relative
error |pred - meas| / meas for

  roofline   the pure lower bound (costmodel.roofline_us: no fixed cost, no efficiencies),
  defaults   the model with the DeviceSpec field defaults for the calibration constants,
  yaml       the model with the constants now in the device yaml,
  fitted     the model with the constants fitted here, and
  held-out   the fitted model where each trace is predicted by constants fitted on the other two
             (leave-one-trace-out: the honest number for a new workload).

Fit (documented so it can be re-derived):
- kernel_fixed_us: the 25th percentile of the measured durations of non-gemm kernels whose pure
  roofline time is below 0.5 µs ("tiny" kernels: their duration is almost all fixed cost; a low
  percentile because some tiny kernels also pay extra latency, e.g. multi-pass reductions).
- gemm_fixed_us: the same for gemm-class kernels (small GEMMs and attention: K-loop pipeline fill
  and epilogue dominate them), 25th percentile of gemm kernels with roofline below 2 µs.
- dram_efficiency, compute_efficiency: with the fixed costs set, a grid search (0.02 steps) for
  the value minimizing the mean squared log error log(pred/meas) over the non-gemm kernels
  (dram; elementwise and reduction weighted equally as classes, so 844 elementwise kernels do not
  drown 86 reductions) and then over the gemm kernels (compute). Least squares on log time weighs
  a 2x miss the same on a 2 µs and on a 200 µs kernel.

What the data says about the model: ATen's
vectorized (contiguous) elementwise kernels reach ~85-95% of DRAM bandwidth, its strided/casting
`elementwise_kernel<128, 4>` and CatArrayBatchedCopy ~40-55%; one dram_efficiency sits between
them, which is most of the elementwise error. Flash attention at seq 559 (Qwen) runs ~2.5x slower
than the fitted GEMM rate. The costmodel docstring compares quantization variants on these
kernels.

Runs in about a second: `python scripts/calibrate_costmodel.py [--json] [--device h100] [TRACES...]`.
"""
from __future__ import annotations

import argparse
import bisect
import gzip
import json
import math
import os
import re
import statistics
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # (after site-packages: an installed dlcc, not the checkout's folder)

from dlcc.config import DeviceSpec, load_device  # noqa: E402
from dlcc.estimate.costmodel import kernel_time, roofline_us  # noqa: E402
from dlcc.estimate.kernelclass import classify_kernel  # noqa: E402

# DLCC_TRACES, else the project's traces folder beside the checkout (../shared/traces)
_TRACE_DIR = Path(os.environ.get("DLCC_TRACES") or Path(__file__).resolve().parents[2] / "shared" / "traces")
DEFAULT_TRACES = sorted(_TRACE_DIR.glob("h100_*.json.gz"))
CLASSES = ("gemm", "elementwise", "reduction")
CALIB_FIELDS = ("kernel_fixed_us", "gemm_fixed_us", "dram_efficiency", "compute_efficiency")

ELEM_SIZE = {
    "c10::BFloat16": 2, "c10::Half": 2, "float": 4, "double": 8, "long int": 8, "int": 4,
    "short int": 2, "bool": 1, "unsigned char": 1, "signed char": 1, "c10::complex<float>": 8,
}
PEAK_DTYPE = {"c10::BFloat16": "bfloat16", "c10::Half": "float16", "float": "float32", "double": "float32"}
COMPARE = {"aten::eq", "aten::ne", "aten::lt", "aten::le", "aten::gt", "aten::ge", "aten::logical_and",
           "aten::logical_or", "aten::logical_not", "aten::isnan", "aten::isinf"}
WRITE_ONLY_SELF = {"aten::copy_", "aten::fill_", "aten::zero_", "aten::normal_", "aten::uniform_"}
REDUCE_OPS = {"aten::mean", "aten::sum", "aten::amax", "aten::amin", "aten::max", "aten::min", "aten::all",
              "aten::any", "aten::prod", "aten::argmax", "aten::argmin", "aten::norm", "aten::linalg_vector_norm",
              "aten::std", "aten::var"}
SOFTMAX_OPS = {"aten::_softmax", "aten::_log_softmax", "aten::softmax", "aten::log_softmax"}
ELEMENTWISE_OPS = {f"aten::{n}" for n in (
    "add add_ sub sub_ mul mul_ div div_ neg pow rsqrt sqrt exp log abs reciprocal sign erf silu silu_ gelu relu relu_ "
    "tanh sigmoid sin cos clamp clamp_ clamp_min clamp_min_ clamp_max where masked_fill masked_fill_ copy_ fill_ zero_ "
    "eq ne lt le gt ge logical_and logical_or logical_not bitwise_and bitwise_or bitwise_not isnan isinf "
    "threshold_backward gelu_backward silu_backward sigmoid_backward tanh_backward hardtanh hardtanh_ "
    "leaky_relu leaky_relu_ minimum maximum floor ceil round remainder fmod lerp addcmul addcdiv addcmul_ addcdiv_"
).split()}
ATTENTION_OPS = {"aten::_flash_attention_forward", "aten::_efficient_attention_forward",
                 "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
                 "aten::_scaled_dot_product_cudnn_attention"}


class Unmapped(Exception):
    pass


@dataclass
class Work:
    kind: str  # gemm | elementwise | reduction
    flops: float
    bytes: float
    dtype: str  # peak_tflops key


@dataclass
class Sample:
    trace: str
    name: str
    cls: str
    op: str
    meas: float
    flops: float
    bytes: float
    dtype: str
    blocks: int
    threads: int
    smem: int
    regs: int | None
    ideal: tuple[float, float] | None = None


# -- op workloads ---------------------------------------------------------------------------------
def _numel(dims) -> int:
    return math.prod(int(d) for d in dims) if dims else 1


def _tensors(args) -> list[tuple[list[int], int]]:
    """(dims, element size) of every tensor input; 0-dim tensors included (numel 1)."""
    out = []
    for dims, t in zip(args.get("Input Dims", []), args.get("Input type", [])):
        if t in ELEM_SIZE and isinstance(dims, list) and all(isinstance(d, int) for d in dims):
            out.append((dims, ELEM_SIZE[t]))
    return out


def _concrete(args, i):
    c = args.get("Concrete Inputs") or []
    return c[i] if i < len(c) else ""


def _intlist(s: str) -> list[int] | None:
    s = (s or "").strip()
    if not s:
        return None
    try:
        v = json.loads(s)
    except json.JSONDecodeError:
        return None
    return [int(x) for x in v] if isinstance(v, list) else [int(v)]


def _broadcast(shapes: list[list[int]]) -> list[int]:
    n = max((len(s) for s in shapes), default=0)
    out = [1] * n
    for s in shapes:
        for i, d in enumerate(s, start=n - len(s)):
            out[i] = max(out[i], d)
    return out


def op_work(op: dict, kernel_name: str) -> Work:
    name, args = op["name"], op.get("args", {})
    dims, types = args.get("Input Dims"), args.get("Input type")
    if dims is None or types is None:
        raise Unmapped("op has no Input Dims (record_shapes off)")
    ts = _tensors(args)
    first_t = next((t for t in types if t in ELEM_SIZE), None)
    peak = PEAK_DTYPE.get(first_t, "float32")
    if name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"):
        mats = ts[1:3] if name in ("aten::addmm", "aten::baddbmm") else ts[0:2]
        if len(mats) != 2:
            raise Unmapped(f"{name}: unexpected inputs")
        (a, es), (b, _) = mats
        batch = _numel(a[:-2])
        m, k, n = a[-2], a[-1], b[-1]
        bias = ts[0][0] if name in ("aten::addmm", "aten::baddbmm") else None
        byt = (batch * (m * k + k * n + m * n) + (_numel(bias) if bias else 0)) * es
        return Work("gemm", 2.0 * batch * m * k * n, byt, peak)
    if name in ATTENTION_OPS:
        (q, es), (k, _), (v, _) = ts[0:3]
        if name.startswith("aten::_scaled_dot_product"):  # [B, H, S, D]
            b, h, sq, d = q
            sk = k[2]
            causal = _concrete(args, 4) == "True"
        else:  # _flash/_efficient_attention_forward: [B, S, H, D]
            b, sq, h, d = q
            sk = k[1]
            causal = _concrete(args, 8) == "True"
        flops = 4.0 * b * h * sq * sk * d * (0.5 if causal else 1.0)
        return Work("gemm", flops, (2 * _numel(q) + _numel(k) + _numel(v)) * es, peak)
    if name in ("aten::cudnn_convolution", "aten::convolution", "aten::_convolution"):
        (x, es), (w, _) = ts[0:2]
        base = 3 if name != "aten::cudnn_convolution" else 2
        pad, stride, dil = (_intlist(_concrete(args, base + i)) for i in range(3))
        groups = int(_concrete(args, base + (5 if name != "aten::cudnn_convolution" else 3)) or 1)
        if not (pad and stride and dil):
            raise Unmapped(f"{name}: padding/stride/dilation not recorded")
        nb, c = x[0], x[1]
        outsp = [(x[2 + i] + 2 * pad[i] - dil[i] * (w[2 + i] - 1) - 1) // stride[i] + 1 for i in range(len(w) - 2)]
        out = nb * w[0] * _numel(outsp)
        flops = 2.0 * out * (c // groups) * _numel(w[2:])
        return Work("gemm", flops, (_numel(x) + _numel(w) + out) * es, peak)
    if name == "aten::native_layer_norm":
        (x, es) = ts[0]
        rows = _numel(x) // max(1, x[-1])
        params = sum(_numel(d) * e for d, e in ts[1:])
        return Work("reduction", 8.0 * _numel(x), 2 * _numel(x) * es + params + 2 * rows * 4, peak)
    if name in SOFTMAX_OPS:
        (x, es) = ts[0]
        return Work("reduction", 5.0 * _numel(x), 2 * _numel(x) * es, peak)
    if name in REDUCE_OPS:
        (x, es) = ts[0]
        red = _intlist(_concrete(args, 1)) if len(dims) > 1 else None
        if red:
            keep = [d for i, d in enumerate(x) if i not in {r % len(x) for r in red}]
            out = _numel(keep)
        else:
            out = 1
        oes = 1 if name in ("aten::all", "aten::any") else 8 if name in ("aten::argmax", "aten::argmin") else es
        return Work("reduction", float(_numel(x)), _numel(x) * es + out * oes, peak)
    if name == "aten::cat":
        m = re.search(r"OpaqueType<(\d+)u>", kernel_name)
        if not m:
            raise Unmapped("aten::cat: element size not in the trace (TensorList) nor the kernel name")
        pieces = dims[0] if dims and isinstance(dims[0], list) else []
        total = sum(_numel(p) for p in pieces if isinstance(p, list))
        return Work("elementwise", 0.0, 2 * total * int(m.group(1)), peak)
    if name == "aten::index_select":
        (src, es) = ts[0]
        idx = ts[-1][0]
        rows = _numel(idx)
        row = _numel(src[1:]) if len(src) > 1 else 1
        return Work("elementwise", 0.0, 2 * rows * row * es + rows * ts[-1][1], peak)
    if name in ("aten::arange", "aten::empty", "aten::zeros", "aten::ones", "aten::full", "aten::randn"):
        raise Unmapped(f"{name}: output size not recorded in the trace")
    if name not in ELEMENTWISE_OPS:
        raise Unmapped(f"{name}: op not modelled")
    # elementwise (unary, binary, copy, comparisons, activations)
    if not ts:
        raise Unmapped(f"{name}: no tensor inputs")
    shapes = [d for d, _ in ts]
    inputs = sum(_numel(d) * e for d, e in ts)
    if name.endswith("_"):
        out_bytes = _numel(ts[0][0]) * ts[0][1]
        byt = inputs if name in WRITE_ONLY_SELF else inputs + out_bytes
        return Work("elementwise", float(_numel(ts[0][0])), byt, peak)
    out_numel = _numel(_broadcast(shapes))
    nonzero_dim = [e for d, e in ts if len(d) > 0] or [ts[0][1]]
    oes = 1 if name in COMPARE else max(nonzero_dim)
    return Work("elementwise", float(out_numel), inputs + out_numel * oes, peak)


def _ext(e: dict):
    """The External id (new schema) or external id (2021 schema) of an event."""
    a = e.get("args", {})
    return a.get("External id", a.get("external id"))


# -- trace mapping --------------------------------------------------------------------------------
def load_samples(path: Path, unmapped: Counter) -> list[Sample]:
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    trace = path.name.removesuffix(".json.gz")
    ops_by_ext: dict = {}
    cpu_by_tid: dict = defaultdict(list)
    runtime: dict = {}
    kernels = []
    for e in events:
        cat = e.get("cat")
        if e.get("ph") != "X":
            continue
        if cat in ("cpu_op", "Operator"):
            ext = _ext(e)
            if ext is not None:
                ops_by_ext[ext] = e
            cpu_by_tid[e.get("tid")].append(e)
        elif cat in ("cuda_runtime", "cuda_driver", "Runtime"):
            c = e.get("args", {}).get("correlation")
            if c is not None:
                runtime[c] = e
        elif cat in ("kernel", "Kernel"):
            kernels.append(e)
    starts = {}
    for tid, lst in cpu_by_tid.items():
        lst.sort(key=lambda o: (o["ts"], -o["dur"]))
        starts[tid] = [o["ts"] for o in lst]

    def enclosing(r):
        lst = cpu_by_tid.get(r.get("tid"), [])
        i = bisect.bisect_right(starts.get(r.get("tid"), []), r["ts"])
        best = None
        for o in reversed(lst[max(0, i - 400):i]):  # innermost = latest start that still encloses
            if o["ts"] + o["dur"] >= r["ts"] + r.get("dur", 0):
                best = o
                break
        return best

    op_of = {}
    for k in kernels:
        a = k.get("args", {})
        op = ops_by_ext.get(_ext(k))
        if op is None:
            r = runtime.get(a.get("correlation"))
            if r is None:
                unmapped[(trace, "no launching runtime event in the trace (queued before the profiling window)")] += 1
                continue
            op = enclosing(r)
            if op is None:
                unmapped[(trace, "launched outside any aten op")] += 1
                continue
        op_of[id(k)] = op
    # kernels per op instance and class, to drop ops whose work is split over several kernels
    per_op = Counter((id(op_of[id(k)]), classify_kernel(k["name"])) for k in kernels if id(k) in op_of)
    samples = []
    for k in kernels:
        op = op_of.get(id(k))
        if op is None:
            continue
        if not float(k.get("dur") or 0) > 0:
            unmapped[(trace, "zero duration (integer-µs trace)")] += 1
            continue
        cls = classify_kernel(k["name"])
        if cls not in CLASSES:
            unmapped[(trace, f"kernel class {cls}")] += 1
            continue
        try:
            w = op_work(op, k["name"])
        except Unmapped as err:
            unmapped[(trace, str(err))] += 1
            continue
        except (ValueError, IndexError, TypeError, KeyError) as err:
            unmapped[(trace, f"{op['name']}: unexpected inputs ({type(err).__name__})")] += 1
            continue
        if w.kind != cls:
            unmapped[(trace, f"{cls} helper kernel inside a {w.kind} op ({op['name']})")] += 1
            continue
        if per_op[(id(op), cls)] > 1:
            unmapped[(trace, f"{op['name']} launched several {cls} kernels (work split unknown)")] += 1
            continue
        a = k["args"]
        samples.append(Sample(trace, k["name"], cls, op["name"], float(k["dur"]), w.flops, w.bytes, w.dtype,
                              math.prod(a.get("grid", [1])), math.prod(a.get("block", [1])),
                              int(a.get("shared memory") or 0), a.get("registers per thread")))
    return samples


# -- prediction and fitting -----------------------------------------------------------------------
def ideal(s: Sample, dev: DeviceSpec) -> tuple[float, float]:
    """(compute, memory) µs at 100% efficiency with no fixed cost: the model's two terms before
    calibration, so that trying constants is arithmetic (kernel_time is linear in 1/efficiency)."""
    if s.ideal is None:
        k = kernel_time(s.flops, s.bytes, s.dtype, dev, blocks=s.blocks, threads=s.threads, smem_bytes=s.smem,
                        registers=s.regs, fixed_us=0.0, compute_efficiency=1.0, dram_efficiency=1.0)
        s.ideal = (k.compute_us, k.memory_us)
    return s.ideal


def predict(s: Sample, dev: DeviceSpec, c: dict) -> float:
    """costmodel.kernel_time(...).us with the constants `c` (same formula, from the cached terms)."""
    tc, tm = ideal(s, dev)
    fixed = c["gemm_fixed_us"] if s.cls == "gemm" else c["kernel_fixed_us"]
    return fixed + max(tc / c["compute_efficiency"], tm / c["dram_efficiency"])


def constants_of(dev: DeviceSpec) -> dict:
    return {"kernel_fixed_us": dev.kernel_fixed_us,
            "gemm_fixed_us": dev.gemm_fixed_us if dev.gemm_fixed_us is not None else dev.kernel_fixed_us,
            "dram_efficiency": dev.dram_efficiency, "compute_efficiency": dev.compute_efficiency}


def default_constants() -> dict:
    f = DeviceSpec.model_fields
    d = {k: f[k].default for k in CALIB_FIELDS}
    if d["gemm_fixed_us"] is None:
        d["gemm_fixed_us"] = d["kernel_fixed_us"]
    return d


def _percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    pos = (len(xs) - 1) * p
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def fit(samples: list[Sample], dev: DeviceSpec) -> dict:
    rl = {id(s): roofline_us(s.flops, s.bytes, s.dtype, dev) for s in samples}
    tiny = [s.meas for s in samples if s.cls != "gemm" and rl[id(s)] < 0.5]
    tiny_g = [s.meas for s in samples if s.cls == "gemm" and rl[id(s)] < 2.0]
    c = default_constants()
    c["kernel_fixed_us"] = round(_percentile(tiny, 0.25), 2) if tiny else c["kernel_fixed_us"]
    c["gemm_fixed_us"] = round(_percentile(tiny_g, 0.25), 2) if tiny_g else c["kernel_fixed_us"]
    grid = [round(0.02 * i, 2) for i in range(1, 51)]

    def msle(group, field):
        # mean squared log error, each class weighted equally (a class's kernels share weight 1)
        n = Counter(s.cls for s in group)
        best = None
        for v in grid:
            trial = dict(c, **{field: v})
            err = sum(math.log(predict(s, dev, trial) / s.meas) ** 2 / n[s.cls] for s in group)
            if best is None or err < best[0] - 1e-12:
                best = (err, v)
        return best[1]

    mem = [s for s in samples if s.cls != "gemm"]
    gem = [s for s in samples if s.cls == "gemm"]
    if mem:
        c["dram_efficiency"] = msle(mem, "dram_efficiency")
    if gem:
        c["compute_efficiency"] = msle(gem, "compute_efficiency")
    return c


def rel_errors(samples, f) -> dict[str, list[float]]:
    out = defaultdict(list)
    for s in samples:
        e = abs(f(s) - s.meas) / s.meas
        out[s.cls].append(e)
        out["all"].append(e)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="*", type=Path, default=DEFAULT_TRACES)
    ap.add_argument("--device", default="h100", help="built-in device name or yaml path (default h100)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of tables")
    args = ap.parse_args(argv)
    dev = load_device(args.device)
    unmapped: Counter = Counter()
    samples: list[Sample] = []
    total = 0
    for p in args.traces:
        got = load_samples(p, unmapped)
        samples += got
    total = len(samples) + sum(unmapped.values())
    fitted = fit(samples, dev)
    traces = sorted({s.trace for s in samples})
    held = {}
    for t in traces:
        train = [s for s in samples if s.trace != t]
        c = fit(train, dev) if train else fitted
        for s in samples:
            if s.trace == t:
                held[id(s)] = predict(s, dev, c)
    models = {
        "roofline": lambda s: roofline_us(s.flops, s.bytes, s.dtype, dev),
        "defaults": (lambda c: lambda s: predict(s, dev, c))(default_constants()),
        "yaml": (lambda c: lambda s: predict(s, dev, c))(constants_of(dev)),
        "fitted": (lambda c: lambda s: predict(s, dev, c))(fitted),
        "held-out": lambda s: held[id(s)],
    }
    errs = {m: rel_errors(samples, f) for m, f in models.items()}
    rows = []
    for cls in (*CLASSES, "all"):
        n = len(errs["fitted"].get(cls, []))
        rows.append({"class": cls, "count": n, "meas_us_median": statistics.median(
            [s.meas for s in samples if cls in (s.cls, "all")]) if n else None,
            **{m: (statistics.median(errs[m][cls]) if n else None) for m in models}})
    per_trace = []
    for t in traces:
        ss = [s for s in samples if s.trace == t]
        per_trace.append({"trace": t, "count": len(ss),
                          "fitted": statistics.median(rel_errors(ss, models["fitted"])["all"]),
                          "held-out": statistics.median(rel_errors(ss, models["held-out"])["all"]),
                          "sum_meas_us": sum(s.meas for s in ss),
                          "sum_fitted_us": sum(models["fitted"](s) for s in ss)})
    unm = [{"trace": t, "reason": r, "count": n} for (t, r), n in sorted(unmapped.items(), key=lambda x: -x[1])]
    result = {"device": dev.name, "traces": [str(p) for p in args.traces], "kernels": total,
              "mapped": len(samples), "unmapped": sum(unmapped.values()), "median_rel_error": rows,
              "per_trace": per_trace, "unmapped_reasons": unm, "fitted": fitted, "defaults": default_constants(),
              "yaml": constants_of(dev)}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    con = Console()
    t = Table(title=f"Cost model vs {len(samples)} measured kernels on {dev.name} "
                    f"(median |pred-meas|/meas; {total - len(samples)} of {total} kernels unmapped)")
    t.add_column("class")
    t.add_column("count", justify="right")
    t.add_column("median meas µs", justify="right")
    for m in models:
        t.add_column(m, justify="right")
    for r in rows:
        t.add_row(r["class"], str(r["count"]), f"{r['meas_us_median']:.2f}" if r["meas_us_median"] else "-",
                  *[f"{r[m]:.1%}" if r[m] is not None else "-" for m in models])
    con.print(t)
    t2 = Table(title="Per trace (all classes)")
    for col in ("trace", "count", "fitted", "held-out", "Σ meas µs", "Σ fitted µs"):
        t2.add_column(col, justify="left" if col == "trace" else "right")
    for r in per_trace:
        t2.add_row(r["trace"], str(r["count"]), f"{r['fitted']:.1%}", f"{r['held-out']:.1%}",
                   f"{r['sum_meas_us']:.0f}", f"{r['sum_fitted_us']:.0f}")
    con.print(t2)
    t3 = Table(title="Unmapped kernels")
    for col in ("trace", "reason", "count"):
        t3.add_column(col, justify="right" if col == "count" else "left")
    for r in unm:
        t3.add_row(r["trace"], r["reason"], str(r["count"]))
    con.print(t3)
    t4 = Table(title="Calibration constants (put 'fitted' into the device yaml)")
    for col in ("field", "defaults", "yaml", "fitted"):
        t4.add_column(col, justify="left" if col == "field" else "right")
    for k in CALIB_FIELDS:
        t4.add_row(k, *(str(result[m][k]) for m in ("defaults", "yaml", "fitted")))
    con.print(t4)
    return 0


if __name__ == "__main__":
    sys.exit(main())
