#!/usr/bin/env python3
"""Differential fuzzing of dlcc against onnxruntime (issue 17): generated graphs through every
pipeline and option set (dlcc/testing/oracle.py: all_configs) on OpenCL/PoCL, and on CUDA where
a GPU is present. Crashes, tracebacks, hangs (per-graph timeout) and mismatches are failures.

    .venv/bin/python scripts/fuzz.py --n 1000 --seed 0 --minutes 60 --json fuzz.json --junit fuzz.xml
    .venv/bin/python scripts/fuzz.py --n 200 --shrink --regressions tests/fuzz_cases

The JSON report is rewritten every --checkpoint-minutes (and on Ctrl-C or SIGTERM), so a long run that is
interrupted goes on where it stopped, with its own parameters:

    .venv/bin/python scripts/fuzz.py --resume fuzz.json

--shrink reduces every failing graph (dlcc/testing/shrink.py) and, with --regressions DIR, writes
each minimal case there, where tests/test_fuzz_regressions.py runs it in the default suite.
Exit code 0 only when nothing failed.
"""
from __future__ import annotations

import argparse
import re
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # (after site-packages: an installed dlcc, not the checkout's folder)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100, help="generated graphs (default 100)")
    ap.add_argument("--seed", type=int, default=0, help="first seed; graph k uses seed + k")
    ap.add_argument("--minutes", type=float, default=None, help="stop handing out graphs after this long")
    ap.add_argument("--workers", "-j", type=int, default=None, help="worker processes (default: the cores)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds one graph may take through every "
                    "configuration before it counts as a hang (default 600)")
    ap.add_argument("--targets", default=None, help="opencl, cuda or opencl,cuda (default: OpenCL, and CUDA "
                    "when PyCUDA sees a GPU)")
    ap.add_argument("--nvcc-every", type=int, default=None, metavar="K", help="also build every K-th graph's CUDA "
                    "text with nvcc for sm_90 and sm_80, checking for errors and register spills (the `nvcc` "
                    "target; default 10 where nvcc is installed, 0: never)")
    ap.add_argument("--configs", default=None, help="comma-separated configuration names (default: all; "
                    "`--list-configs` shows them)")
    ap.add_argument("--list-configs", action="store_true", help="print the configuration names and exit")
    ap.add_argument("--precision", default=None, choices=["fp32", "tf32x3", "tf32", "fp16", "bf16"], help="run the "
                    "configurations at this precision (NAME@bf16: GEMMs on the tensor-core template, judged at "
                    "verify's tolerance for it with the operand rounding in the arbiter's spread); a name in "
                    "--configs may also say it")
    ap.add_argument("--max-patterns", type=int, default=8, help="patterns per graph (default 8)")
    ap.add_argument("--extremes", action="store_true", help="also generate float32's edge values as models write "
                    "them (-inf, finfo.min and -1e9 masks before a Softmax or a max, MaxPool over -inf padding, clamps "
                    "to float32's limits, scales past float16's largest): other graphs than without it, seed for seed")
    ap.add_argument("--more-ops", action="store_true", help="also generate the ops only rewrites lower "
                    "(QDQ and dynamic quantization, Einsum, GridSample, AffineGrid, DeformConv, Shape/Range/"
                    "ConstantOfShape arithmetic, OneHot, Compress, ReverseSequence, Hardmax, Lp norms and pools, Loop, "
                    "sequence ops; at opset 23 Attention, RotaryEmbedding, RMSNormalization): other graphs than "
                    "without it, seed for seed")
    ap.add_argument("--half-models", nargs="?", const="fp16", default=False, choices=["fp16", "bf16"],
                    help="convert each graph into a float16 model with onnxconverter-common (float16 weights and "
                    "Casts; half keep float32 inputs and outputs), or with `bf16` into a bfloat16 one (the same, "
                    "each float16 then bfloat16, ops without a bfloat16 schema kept float32 between Casts), judged "
                    "as verify judges one: against onnxruntime on the model widened to float32")
    ap.add_argument("--unsupported", type=int, default=None, help="graphs dlcc must refuse, checked for the "
                    "one-paragraph error (default: n/20)")
    ap.add_argument("--quick-build", action="store_true", help="build OpenCL kernels without optimisation "
                    "(-cl-opt-disable: about 4x faster builds; the kernels run unoptimised)")
    ap.add_argument("--json", dest="json_path", default=None, help="write a JSON report here")
    ap.add_argument("--junit", default=None, help="write a JUnit XML report here")
    ap.add_argument("--resume", default=None, metavar="REPORT", help="go on with the run whose JSON report this "
                    "is: its parameters, its cases kept, the rest run (the report is rewritten in place)")
    ap.add_argument("--checkpoint-minutes", type=float, default=5.0, help="rewrite the JSON report this often, "
                    "so an interrupted run loses at most this much (default 5)")
    ap.add_argument("--shrink", action="store_true", help="shrink each failing graph")
    ap.add_argument("--regressions", default=None, help="with --shrink: write the minimal cases into this folder")
    ap.add_argument("--shrink-tries", type=int, default=600, help="compile-and-run tries per shrink (default 600)")
    args = ap.parse_args(argv)

    import os

    earlier = None
    if args.resume:
        earlier = _load_report(args.resume)
        if earlier is None:
            return 2
        _take_parameters(args, earlier["meta"])
    if "POCL_CACHE_DIR" not in os.environ:
        # PoCL keeps every program it builds in its kernel cache (~/.cache/pocl), and a run builds
        # thousands that never come back: the workers share a cache of the run's own, removed at
        # the end. Set POCL_CACHE_DIR to keep one.
        import atexit
        import shutil
        import tempfile

        os.environ["POCL_CACHE_DIR"] = tempfile.mkdtemp(prefix="dlcc-fuzz-pocl-")
        atexit.register(shutil.rmtree, os.environ["POCL_CACHE_DIR"], True)
    if args.quick_build:  # read by every worker's OpenCL runtime (backends/opencl.py: build_options)
        os.environ["DLCC_OPENCL_BUILD_OPTIONS"] = (os.environ.get("DLCC_OPENCL_BUILD_OPTIONS", "")
                                                   + " -cl-opt-disable").strip()
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    import dlcc  # noqa: F401  (configures PoCL before any worker's platform is touched)
    from dlcc.batch.report import write_atomic
    from dlcc.testing.campaign import STATUSES, Campaign, case_name
    from dlcc.testing.oracle import all_configs, config_named, default_targets
    from dlcc.testing.pool import run_tasks

    con = Console(stderr=True)
    if args.list_configs:
        for c in all_configs():
            print(c.name)
        return 0
    configs = [c.strip() for c in re.split(r",(?![^\[]*\])", args.configs)] if args.configs else None
    if args.precision and args.precision != "fp32":
        configs = [c if "@" in c else f"{c}@{args.precision}" for c in configs or [c.name for c in all_configs()]]
    for c in configs or []:
        try:
            config_named(c)
        except KeyError as e:
            con.print(f"error: {e.args[0]}", markup=False)
            return 2
    targets = [t.strip() for t in args.targets.split(",")] if args.targets else default_targets()
    n_uns = args.n // 20 if args.unsupported is None else args.unsupported
    if args.nvcc_every is None:
        from dlcc.backends.nvcc import find_nvcc

        args.nvcc_every = 10 if find_nvcc() and "cuda" not in targets else 0
    meta = {"n": args.n, "seed": args.seed, "unsupported": n_uns, "targets": targets, "nvcc_every": args.nvcc_every,
            "configs": configs or [c.name for c in all_configs()], "max_patterns": args.max_patterns,
            "extremes": args.extremes, "more_ops": args.more_ops, "half_models": args.half_models,
            "timeout": args.timeout,
            "quick_build": args.quick_build,
            "segments": (earlier["meta"].get("segments", []) if earlier else []) + [_segment()]}
    def targets_of(k: int) -> list[str]:
        return targets + (["nvcc"] if args.nvcc_every and k % args.nvcc_every == 0 else [])

    tasks = [(("g", args.seed + k), {"seed": args.seed + k, "configs": configs, "targets": targets_of(k),
                                      "max_patterns": args.max_patterns, "extremes": args.extremes,
                                      "more_ops": args.more_ops, "half": args.half_models})
             for k in range(args.n)]
    # graphs dlcc must refuse go in among the others, so a run cut short by --minutes has its share
    for k in reversed(range(n_uns)):  # from the back, so earlier positions do not move
        tasks.insert((k * args.n) // n_uns, (("u", args.seed + k), {"kind": "unsupported", "seed": args.seed + k}))
    camp = Campaign.resumed(earlier) if earlier else Campaign()
    seen = camp.done()
    tasks = [t for t in tasks if case_name(t[0]) not in seen]
    json_path = args.json_path or args.resume

    def save() -> None:
        meta["segments"][-1]["cases"] = len(camp.records) - len(seen)
        if json_path:
            write_atomic(json_path, camp.json_report(meta))

    stop_at = time.time() + 60 * args.minutes if args.minutes is not None else None
    workers = args.workers or os.cpu_count() or 1
    con.print(f"dlcc fuzz: {args.n} graphs from seed {args.seed} (+{n_uns} unsupported on purpose), "
              f"{len(configs or all_configs())} configurations, targets {', '.join(targets)}"
              + (f" (and nvcc on 1 graph in {args.nvcc_every})" if args.nvcc_every else "") + f", {workers} workers"
              + (f"; resuming {args.resume}: {len(seen)} cases done, {len(tasks)} to go" if earlier else ""),
              markup=False)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[status]}"), console=con) as prog:
        bar = prog.add_task("graphs", total=len(tasks) + len(seen), completed=len(seen), status="")

        last, saved = [time.time()], [time.time()]

        def on_result(key, rec):
            camp.add(key, rec)
            s = camp.summary()
            status = "  ".join(f"{k} {s[k]}" for k in STATUSES if k != "spill" or s[k])
            prog.update(bar, advance=1, status=status)
            if not con.is_terminal and time.time() - last[0] > 60:  # a log file gets a line a minute
                last[0] = time.time()
                print(f"[{s['seconds']:.0f} s] {len(camp.records)}/{len(tasks) + len(seen)} cases: {status}",
                      file=sys.stderr, flush=True)
            if time.time() - saved[0] > 60 * args.checkpoint_minutes:
                saved[0] = time.time()
                save()

        def stop(signum, frame):  # SIGTERM (a CI timeout, `kill`) ends the run the way Ctrl-C does
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, stop)
        try:
            run_tasks(tasks, "dlcc.testing.oracle:fuzz_task", workers=workers, timeout=args.timeout,
                      on_result=on_result, stop_at=stop_at)
        except KeyboardInterrupt:
            save()
            con.print(f"interrupted after {len(camp.records)} cases"
                      + (f"; go on with: scripts/fuzz.py --resume {json_path}" if json_path else
                         " (no --json report to resume from)"), markup=False)
            return 130

    s = camp.summary()
    t = Table(title=f"dlcc fuzz: {s['graphs']} graphs ({s['nodes']} nodes), {s['seconds']:.0f} s")
    for c in ("verdict", "configurations", "distinct plans run"):
        t.add_column(c)
    for st in STATUSES:
        t.add_row(st, str(s[st]), str(s["distinct_plans"][st]))
    Console().print(t)
    if camp.unsupported:
        print(f"unsupported on purpose: {dict(camp.unsupported)} (pass = the one-paragraph error)")
    for f in camp.failures[:50]:
        print(f"FAIL {f.case} [{f.target}] {f.config}: {f.status}: {f.detail.splitlines()[0] if f.detail else ''}"[:400])
    for case, e in camp.generator_bugs + camp.harness_errors:
        print(f"BUG {case}: {e}"[:400])
    save()
    if args.junit:
        write_atomic(args.junit, camp.junit())
    if args.shrink and camp.failures:
        _shrink_all(camp, args, con)
    return 1 if camp.failed else 0


#: The parameters that define a run, and so come from the report on --resume.
RUN_PARAMETERS = ("n", "seed", "unsupported", "targets", "nvcc_every", "configs", "max_patterns", "extremes",
                  "more_ops", "half_models", "timeout", "quick_build")


def _load_report(path: str):
    """The JSON report of an earlier run, or None after printing why it cannot be resumed."""
    import json

    try:
        report = json.loads(Path(path).read_text())
        if not isinstance(report, dict) or not isinstance(report.get("meta"), dict) \
                or not isinstance(report.get("cases"), list) or "n" not in report["meta"]:
            raise ValueError("it is not a report written by scripts/fuzz.py --json")
    except (OSError, ValueError) as e:
        print(f"error: cannot resume from {path}: {e}", file=sys.stderr)
        return None
    return report


def _take_parameters(args, meta: dict) -> None:
    """The resumed run's parameters replace the command line's (a report from before `nvcc_every`
    existed ran no nvcc target)."""
    meta = {"nvcc_every": 0, "more_ops": False, **meta}
    for k in RUN_PARAMETERS:
        if k in meta:
            v = meta[k]
            setattr(args, k, ",".join(v) if k in ("targets", "configs") and v is not None else v)


def _segment() -> dict:
    """Which code this part of the run tested: the commit, and whether the tree had changes."""
    import datetime
    import subprocess

    def git(*a):
        try:
            return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {"commit": git("rev-parse", "HEAD") or None, "modified": bool(git("status", "--porcelain", "-uno")),
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "cases": 0}


def _shrink_all(camp, args, con) -> None:
    from dlcc.testing.oracle import config_named
    from dlcc.testing.shrink import shrink, write_regression

    done = set()
    for f in camp.failures:
        if f.config in ("(whole case)", "compile") or f.case_seed is None or (f.case_seed, f.target) in done:
            continue
        done.add((f.case_seed, f.target))
        con.print(f"shrinking seed {f.case_seed} ({f.config} on {f.target}) ...", markup=False)
        try:
            s = shrink(f.case_seed, config_named(f.config), f.target, max_tries=args.shrink_tries,
                       max_patterns=args.max_patterns, extremes=args.extremes, half=args.half_models,
                       more_ops=args.more_ops)
        except ValueError as e:  # it no longer fails alone (a flaky failure is worth a look too)
            con.print(f"  not reproduced alone: {e}", markup=False)
            continue
        con.print(f"  -> {len(s.model.graph.node)} node(s) under {s.config.name}: {s.status}: {s.detail[:200]}",
                  markup=False)
        if args.regressions:
            con.print(f"  written to {write_regression(s, args.regressions)}", markup=False)


if __name__ == "__main__":
    sys.exit(main())
