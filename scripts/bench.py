#!/usr/bin/env python3
"""Plan-quality benchmark: how good is the plan dlcc makes for real models?

For each model this exports the ONNX file with ``scripts/models.py`` (skipped
when the file already exists), compiles it twice with
``dlcc.compile(path, target="opencl")`` (compiling only builds the plan, so
no GPU or OpenCL device is needed), and prints one row of statistics from
``CompiledModel.stats``.  With ``--run`` it also runs the model on OpenCL and
on onnxruntime (CPU) with the same inputs.

Usage::

    python scripts/bench.py                       # all small models + full bert and cnn
    python scripts/bench.py --models cnn,bert --size both
    python scripts/bench.py --size small --run    # adds dlcc vs onnxruntime run times
    python scripts/bench.py --json > bench.json   # a JSON list of rows on stdout

Progress goes to stderr, so ``--json`` output stays machine-readable.  The
exit status is 1 when any model failed to export or compile (its row carries
``error``) or, with ``--run``, to run (``run_error``).

Columns
-------
model
    ``NAME-SIZE``: ``small`` models are CI sized; ``full`` ones are the real
    architectures (full ``cnn`` is ResNet-50 at 3x224x224, full ``bert`` is
    bert-base at batch 1, sequence 128).
ONNX nodes / after folding
    Nodes in the exported graph, and nodes left after dlcc's import (constant
    folding with onnxruntime and ``onnx.reference``, dead-code elimination).
    The difference is the shape arithmetic and constant glue the exporter
    emitted.
kernels
    Distinct kernels dlcc generated (a kernel is shared by every launch with
    the same specialization).
launches
    Kernel launches per inference.  In the baseline pipeline this is about
    one per node after folding; every launch is a round trip through DRAM.
DRAM
    Modelled DRAM traffic per inference: the sum of each launch's modelled
    bytes read and written.
lower bound
    Weights + inputs + outputs: what any implementation has to move at least
    once, and what an ideal fully fused (AStitch-style stitched) plan would
    approach, since it keeps every intermediate on chip.
DRAM/LB
    How far the one-kernel-per-op baseline is from that ideal.  1.0 would
    mean no intermediate ever reaches DRAM.  Large ratios point at chains of
    memory-bound ops (elementwise, norms, softmax, reshapes) whose
    intermediates could be stitched away; GEMM-heavy models at large batch
    sit near 1.
arena / naive
    Bytes of the activation arena after liveness-based memory planning (with
    in-place reuse), and the bytes it would take to give every intermediate
    its own buffer.
arena/naive
    The memory-planning gain: lower is better (0.25 means the plan needs a
    quarter of the naive activation memory).  Weights are not included.
compile cold (s)
    Wall time of the first ``dlcc.compile`` of this model in this process.
    dlcc, onnx and onnxruntime are imported before any timing, so no model
    pays the module imports, but the first model compiled still pays some
    process-wide first-use costs (onnxruntime's first session, lazily loaded
    op modules).
compile warm (s)
    Wall time of a second compile of the same model in the same process.
    ``dlcc.compile`` without ``cache=`` does not use the artifact cache, so this
    redoes all the work; the difference from the cold time is onnx/onnxruntime
    warm-up and the OS file cache, not anything dlcc reuses.
dlcc ms / ORT ms / dlcc/ORT (``--run`` only)
    Median wall time of ``m(feeds)`` (OpenCL, including copying inputs in and
    outputs out) and of onnxruntime's CPU ``InferenceSession.run`` on the same
    seeded inputs (``m.sample_inputs()``), each the median of ``--repeat``
    runs after one warm-up, measured in the same process one after the other.
    A ratio above 1 means dlcc is slower.  Here OpenCL is usually PoCL on the
    CPU, so the ratio compares dlcc's generated kernels with onnxruntime's
    hand-tuned CPU kernels on the same cores.  ``max|err|`` is the largest
    absolute difference between the two outputs, as a sanity check.  Only
    small models run by default; ``--run-full`` runs the full ones too.

The JSON rows carry the same numbers unformatted (bytes as ints, seconds as
floats) plus ``weights_bytes``, ``flops``, ``export_s``, the cold compile's
per-step times ``compile_steps_s`` and, on failure, ``error`` or ``run_error``.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # (after site-packages: an installed dlcc, not the checkout's folder)

from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn  # noqa: E402
from rich.table import Table  # noqa: E402
from rich.text import Text  # noqa: E402

DEFAULT_MODELS = ("cnn", "mobilenet", "yolo", "ocr", "lstm", "bert", "gpt2", "vit")
DEFAULT_FULL = ("bert", "cnn")
SIZES = ("small", "full")

# Piped or redirected output gets rich's default 80 columns, which crushes the table.
err = Console(stderr=True) if sys.stderr.isatty() else Console(stderr=True, width=160)
out = Console() if sys.stdout.isatty() else Console(width=240)


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or not b:
        return None
    return a / b


def fmt(x, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def shape_bindings(name: str, path: Path) -> dict[str, tuple[int, ...]]:
    """Bind symbolic input dims (only cnn-dynamic has any) the way models.sample_inputs does."""
    from scripts import models

    dims = models.MODELS[name].dim_values
    shapes = {}
    for iname, shape, _dt in models.input_signature(path):
        if any(not isinstance(d, int) for d in shape):
            shapes[iname] = tuple(d if isinstance(d, int) else dims.get(d, 1) for d in shape)
    return shapes


def progress_steps(progress: Progress, task, prefix: str):
    """A dlcc ``Steps`` that shows the current compile step in the progress bar."""
    from dlcc.progress import Steps

    class _Steps(Steps):
        def step(self, label: str):
            progress.update(task, description=f"{prefix}: {label}")
            return super().step(label)

    return _Steps()


def timed_median(fn, repeat: int) -> float:
    fn()  # warm-up (OpenCL program build, ORT arena growth, ...)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# --------------------------------------------------------------------------
# one model
# --------------------------------------------------------------------------


def bench_one(name: str, size: str, out_dir: Path, run: bool, repeat: int, progress: Progress, task,
              profile: int = 0) -> dict:
    import dlcc
    from scripts import models

    label = f"{name}-{size}"
    row: dict = {"model": label, "name": name, "size": size}

    progress.update(task, description=f"{label}: export")
    existed = (Path(out_dir) / f"{name}-{size}.onnx").exists()
    t0 = time.perf_counter()
    path = models.export(name, out_dir, size)
    row["exported"] = not existed
    row["export_s"] = round(time.perf_counter() - t0, 3)
    row["onnx_path"] = str(path)
    row["onnx_file_bytes"] = path.stat().st_size
    shapes = shape_bindings(name, path)

    prof = cProfile.Profile() if profile else None
    steps = progress_steps(progress, task, f"{label}: compile (cold)")
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    m = dlcc.compile(path, target="opencl", shapes=shapes, steps=steps)
    if prof:
        prof.disable()
    row["compile_cold_s"] = time.perf_counter() - t0
    row["compile_steps_s"] = dict(m.plan["meta"].get("compile_s", {}))
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(profile)
        row["profile"] = s.getvalue()
    del m

    # A cold compile as a user sees it: a fresh `dlcc compile --no-cache` process, artifact written.
    progress.update(task, description=f"{label}: dlcc compile (fresh process)")
    with tempfile.TemporaryDirectory(prefix="dlcc-bench-") as tmp:
        cmd = [sys.executable, "-m", "dlcc.cli", "compile", str(path), "-o", str(Path(tmp) / "a"), "-t", "opencl",
               "--no-cache", "--quiet"] + [f"--shape={k}={'x'.join(map(str, v))}" for k, v in shapes.items()]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        row["compile_cli_s"] = time.perf_counter() - t0 if p.returncode == 0 else None

    steps = progress_steps(progress, task, f"{label}: compile (warm)")
    t0 = time.perf_counter()
    m = dlcc.compile(path, target="opencl", shapes=shapes, steps=steps)
    row["compile_warm_s"] = time.perf_counter() - t0

    st = m.stats
    for k in ("onnx_nodes", "nodes_after_folding", "kernels", "launches", "dram_bytes", "lower_bound_bytes",
              "arena_bytes", "naive_bytes", "weights_bytes", "flops"):
        row[k] = st.get(k)
    row["dram_ratio"] = ratio(st.get("dram_bytes"), st.get("lower_bound_bytes"))
    row["arena_ratio"] = ratio(st.get("arena_bytes"), st.get("naive_bytes"))

    if run:
        try:
            run_both(m, path, repeat, row, progress, task, label)
        except Exception as e:  # keep the plan statistics of a model that compiles but fails to run
            row["run_error"] = one_line(e)
            row["traceback"] = traceback.format_exc()
    return row


def run_both(m, path: Path, repeat: int, row: dict, progress: Progress, task, label: str) -> None:
    """Time m(feeds) on OpenCL and onnxruntime CPU on the same feeds; fills the run columns of ``row``."""
    import numpy as np
    import onnxruntime as ort

    feeds = m.sample_inputs()
    res = {}

    def run_dlcc():
        res["dlcc"] = m(feeds)

    progress.update(task, description=f"{label}: run dlcc (OpenCL)")
    row["dlcc_s"] = timed_median(run_dlcc, repeat)
    row["opencl_device"] = getattr(m.executor().rt, "device_name", None)

    progress.update(task, description=f"{label}: run onnxruntime (CPU)")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    ort_feeds = {i.name: feeds[i.name] for i in sess.get_inputs()}

    def run_ort():
        res["ort"] = dict(zip(names, sess.run(names, ort_feeds)))

    row["ort_s"] = timed_median(run_ort, repeat)
    row["dlcc_ort_ratio"] = ratio(row["dlcc_s"], row["ort_s"])
    errs = []
    for n in names:
        a, b = res["dlcc"].get(n), res["ort"][n]
        if a is None or a.shape != b.shape:
            errs.append(float("inf"))
        else:
            errs.append(float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)), initial=0.0)))
    row["max_abs_err"] = max(errs) if errs else None


def one_line(e: BaseException) -> str:
    msg = str(e).strip()
    return f"{type(e).__name__}: {msg.splitlines()[0] if msg else ''}"


# --------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------


def make_table(rows: list[dict], run: bool) -> Table:
    t = Table(title="dlcc plan quality (baseline pipeline, target opencl)", title_justify="left")
    cols = [("model", "left"), ("ONNX nodes", "right"), ("after folding", "right"), ("kernels", "right"),
            ("launches", "right"), ("DRAM/inf", "right"), ("lower bound", "right"), ("DRAM/LB", "right"),
            ("arena", "right"), ("naive", "right"), ("arena/naive", "right"), ("compile cold s", "right"),
            ("compile warm s", "right")]
    if run:
        cols += [("dlcc ms", "right"), ("ORT ms", "right"), ("dlcc/ORT", "right"), ("max|err|", "right")]
    for c, j in cols:
        t.add_column(c, justify=j)
    for r in rows:
        if "error" in r:
            t.add_row(r["model"], Text(f"FAILED: {r['error']}", style="red"), *[""] * (len(cols) - 2))
            continue
        cells = [
            r["model"], str(r["onnx_nodes"]), str(r["nodes_after_folding"]), str(r["kernels"]), str(r["launches"]),
            human_bytes(r["dram_bytes"]), human_bytes(r["lower_bound_bytes"]), fmt(r["dram_ratio"]),
            human_bytes(r["arena_bytes"]), human_bytes(r["naive_bytes"]), fmt(r["arena_ratio"]),
            fmt(r["compile_cold_s"]), fmt(r["compile_warm_s"]),
        ]
        if run:
            if "run_error" in r:
                cells += [Text(f"FAILED: {r['run_error']}", style="red"), "", "", ""]
            elif "dlcc_s" in r:
                cells += [fmt(r["dlcc_s"] * 1e3), fmt(r["ort_s"] * 1e3), fmt(r["dlcc_ort_ratio"]),
                          fmt(r["max_abs_err"], ".1e")]
            else:
                cells += ["-", "-", "-", "-"]
        t.add_row(*cells)
    return t


def steps_table(rows: list[dict]) -> Table:
    """Cold compile time split by step (in-process), and a fresh `dlcc compile` process end to end,
    so that a regression in one step shows."""
    names = list(dict.fromkeys(k for r in rows for k in r.get("compile_steps_s", {})))
    t = Table(title="compile time by step, seconds (cold, in-process; and `dlcc compile --no-cache` in a fresh "
                    "process, artifact written)", title_justify="left")
    for c in ["model", *names, "other", "in-process", "dlcc compile"]:
        t.add_column(c, justify="left" if c == "model" else "right")
    for r in rows:
        if "error" in r:
            continue
        st = r.get("compile_steps_s", {})
        t.add_row(r["model"], *[fmt(st.get(n)) for n in names], fmt(r["compile_cold_s"] - sum(st.values())),
                  fmt(r["compile_cold_s"]), fmt(r.get("compile_cli_s")))
    return t


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------


def selection(models_arg: str | None, size: str | None) -> list[tuple[str, str]]:
    from scripts import models

    if models_arg:
        names = [n.strip() for n in models_arg.split(",") if n.strip()]
        unknown = [n for n in names if n not in models.MODELS]
        if unknown:
            raise SystemExit(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(models.MODELS)}")
    else:
        names = list(DEFAULT_MODELS)
    if size is None and not models_arg:
        return [(n, "small") for n in names] + [(n, "full") for n in DEFAULT_FULL]
    sizes = SIZES if size == "both" else (size or "small",)
    return [(n, s) for s in sizes for n in names if s in models.MODELS[n].sizes]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if "--astitch" in args:  # baseline and astitch side by side (scripts/bench_astitch.py)
        import bench_astitch

        return bench_astitch.main([a for a in args if a != "--astitch"])
    if "--rammer" in args:  # baseline, astitch, rammer and full side by side, and issue 8's floors
        import bench_rammer

        return bench_rammer.main([a for a in args if a != "--rammer"])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="See the module docstring (python -c 'import scripts.bench as b; "
                                        "help(b)') for what the columns mean.")
    ap.add_argument("--models", help=f"comma-separated model names (default: {','.join(DEFAULT_MODELS)})")
    ap.add_argument("--size", choices=("small", "full", "both"),
                    help="model size (default: small; with no --models either: all small models "
                         f"plus full {' and '.join(DEFAULT_FULL)})")
    ap.add_argument("--out-dir", type=Path, default=ROOT / ".cache" / "models",
                    help="where exported ONNX files go (default: REPO/.cache/models)")
    ap.add_argument("--run", action="store_true", help="also time dlcc (OpenCL) vs onnxruntime (CPU) runs")
    ap.add_argument("--run-full", action="store_true", help="with --run, run full-size models too")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per engine with --run (median; default 3)")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="cProfile each cold compile and print the top N cumulative entries to stderr "
                         "(inflates the cold compile time)")
    ap.add_argument("--json", action="store_true", help="print a JSON list of rows instead of the table")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    with err.status("importing dlcc, onnx, onnxruntime, torch…"):
        import dlcc  # noqa: F401
        import dlcc.compiler  # noqa: F401
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
        from scripts import models  # noqa: F401  (imports torch)
    err.print(f"[dim]imports took {time.perf_counter() - t0:.1f}s; models in {args.out_dir}[/]")
    todo = selection(args.models, args.size)

    rows: list[dict] = []
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                        TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                        console=err, transient=False)
    with progress:
        overall = progress.add_task("models", total=len(todo))
        for name, size in todo:
            label = f"{name}-{size}"
            run = args.run and (size == "small" or args.run_full)
            try:
                row = bench_one(name, size, args.out_dir, run, args.repeat, progress, overall, args.profile)
            except KeyboardInterrupt:
                raise
            except Exception as e:  # keep going: one broken model must not hide the others
                row = {"model": label, "name": name, "size": size, "error": one_line(e),
                       "traceback": traceback.format_exc()}
                progress.console.print(Text(f"✗ {label}: {row['error']}", style="red"))
            else:
                msg = (f"[green]✓[/] {label}: {row['launches']} launches, DRAM/LB {fmt(row['dram_ratio'])}, "
                       f"arena/naive {fmt(row['arena_ratio'])}, compile {row['compile_cold_s']:.2f}s cold / "
                       f"{row['compile_warm_s']:.2f}s warm")
                if "dlcc_s" in row:
                    msg += f", run dlcc/ORT {fmt(row['dlcc_ort_ratio'])}"
                progress.console.print(msg)
                if "run_error" in row:
                    progress.console.print(Text(f"✗ {label}: run failed: {row['run_error']}", style="red"))
            if "profile" in row:
                progress.console.print(f"[bold]cProfile of the cold compile of {label}[/] (cumulative):")
                progress.console.print(row["profile"], markup=False, highlight=False)
            rows.append(row)
            progress.advance(overall)
        progress.update(overall, description="done")

    if args.json:
        clean = [{k: v for k, v in r.items() if k not in ("traceback", "profile")} for r in rows]
        print(json.dumps(clean, indent=2))
    else:
        out.print(make_table(rows, args.run))
        out.print(steps_table(rows))
    for r in rows:
        if "traceback" in r:
            err.print(Text(f"{r['model']} failed:", style="bold red"))
            err.print(r["traceback"], markup=False, highlight=False)
    return 1 if any("error" in r or "run_error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
