"""The `dlcc` command line (typer + rich): compile, run, verify, inspect, list.

Every failure caused by input is a DlccError: printed as one paragraph, exit code 2, no traceback.
Progress goes to stderr, so `--json` output on stdout stays machine-readable.
"""
from __future__ import annotations

import json
import sys
import traceback
import warnings
from pathlib import Path
from typing import List, Optional

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from .errors import DlccError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="dlcc — compile ONNX models to CUDA/OpenCL kernels, run them, check them against onnxruntime, and estimate what optimizations buy.")
out = Console()
err = Console(stderr=True)


@app.callback()
def _global_options(device_index: Optional[int] = typer.Option(
        None, "--device-index", help="CUDA device ordinal to run on and, with no --device, to plan for "
        "(default: $DLCC_CUDA_DEVICE, else 0)")):
    """dlcc — compile ONNX models to CUDA/OpenCL kernels, run them, check them against onnxruntime,
    and estimate what optimizations buy."""
    from .scratch import sweep_once

    sweep_once()  # temporary folders that killed dlcc processes left behind
    if device_index is not None:
        import os

        from .devices import CUDA_DEVICE_ENV

        if device_index < 0:
            raise DlccError(f"--device-index {device_index} is not a device index (0, 1, ...)")
        os.environ[CUDA_DEVICE_ENV] = str(device_index)  # read by the runtime and the device detection

ShapeOpt = typer.Option(None, "--shape", "--input-shape", "-s", help="bind an input's shape: NAME=1x3x224x224 (repeatable); "
                        "NAME=8 binds a symbolic dim, or the value of a scalar int input (sr=16000); FILE.yaml reads "
                        "bindings from `shapes: {NAME: [dims]}`")
TargetOpt = typer.Option("auto", "--target", "-t", help="auto (CUDA if a GPU is present, else OpenCL), cuda, opencl")
PipelineOpt = typer.Option("baseline", "--pipeline", "-p", help="pipeline name (configs/pipelines) or YAML file; "
                           "auto: the built-in pipeline `dlcc estimate` predicts fastest on the device")
DeviceOpt = typer.Option(None, "--device", "-d", help="device name (configs/devices) or YAML file; "
                         "default: the detected GPU, or pocl-cpu for OpenCL")
PrecisionOpt = typer.Option(None, "--precision", help="what GEMMs and convolutions compute at: fp32 (CUDA "
                            "cores); tf32x3 (tensor cores at float32's accuracy, three TF32 mmas a product); tf32, fp16 or bf16 (tensor cores, float32 accumulation; fp16/bf16 also store "
                            "weights and activations in that type; sm_80+, emulated on OpenCL); default: the pipeline's own "
                            "(fp32 unless it sets `precision:`). Any given precision also computes a float64 model in float32")
QuietOpt = typer.Option(False, "--quiet", "-q", help="no progress output")
JsonOpt = typer.Option(False, "--json", help="print one JSON object instead of tables")
ProfileDbOpt = typer.Option(None, "--profile-db", help="measured kernel times (a `dlcc profile` database): rammer "
                            "prices its rTasks and join decisions with them, and the plan records which were measured")


FallbackOpt = typer.Option(None, "--fallback", help="onnxruntime: run the nodes dlcc cannot compile (ops it "
                           "lacks, value-dependent shapes) on onnxruntime and the rest on dlcc, and list the segments")


def _segments_table(name: str, segments: list[dict]) -> Table:
    t = Table(title=_escape(f"{name}: segments, in the order they run"))
    for c in ("engine", "nodes", "ops", "why not dlcc"):
        t.add_column(c)
    for s in segments:
        t.add_row(s["engine"], str(s["nodes"]), _escape(", ".join(f"{op} x{n}" for op, n in s["ops"].items())),
                  _escape("; ".join(s.get("why", []))))
    return t


def _steps(quiet: bool):
    from .progress import RichSteps, Steps

    return Steps() if quiet else RichSteps(err)


def _compile(model, shape, target, pipeline, device, quiet, json_out, out_dir=None, profile_db=None, cache=None,
             precision=None, **tuning):
    import dlcc

    return dlcc.compile(model, out=out_dir, shapes=shape or [], target=target, pipeline=pipeline, device=device,
                        steps=_steps(quiet or json_out), profile_db=profile_db, cache=cache, precision=precision,
                        **tuning)


CacheOpt = typer.Option(None, "--cache", help="compile cache directory (default: $DLCC_CACHE_DIR, else "
                        "~/.cache/dlcc); a hit links the cached artifact in place of compiling")
NoCacheOpt = typer.Option(False, "--no-cache", help="compile afresh; neither read nor write the cache")


def _cache_arg(cache_dir, no_cache):
    return False if no_cache else (str(cache_dir) if cache_dir else True)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


@app.command()
def compile(model: Path = typer.Argument(..., help="ONNX model file"),
            output: Optional[Path] = typer.Option(None, "--output", "-o", help="artifact directory (default: MODEL stem + '.dlcc')"),
            shape: Optional[List[str]] = ShapeOpt, target: str = TargetOpt, pipeline: str = PipelineOpt,
            device: Optional[str] = DeviceOpt, precision: Optional[str] = PrecisionOpt,
            profile_db: Optional[Path] = ProfileDbOpt, quiet: bool = QuietOpt,
            json_out: bool = JsonOpt, cache_dir: Optional[Path] = CacheOpt, no_cache: bool = NoCacheOpt,
            tune: bool = typer.Option(False, "--tune", help="pick each GEMM's tiling and the pipeline by measuring "
                                      "them on the target device (the estimator's best pipelines); the times are "
                                      "kept in the cache's tuning records, so the same compile does not measure "
                                      "again"),
            tune_top: int = typer.Option(3, "--tune-top", help="with --tune: how many candidates to measure"),
            tune_repeat: int = typer.Option(10, "--tune-repeat", help="with --tune: timed runs per candidate "
                                            "(pipeline or tiling)"),
            fallback: Optional[str] = typer.Option(None, "--fallback", help="onnxruntime: run the nodes dlcc cannot "
                                                   "compile on onnxruntime and the rest on dlcc; the artifact holds "
                                                   "the model, where each node runs and the plans of its dlcc "
                                                   "segments (docs/fallback.md)")):
    """Compile MODEL into an artifact directory (kernels.cu, kernels.cl, plan.json, weights.bin, launcher.py;
    with --fallback: partition.json, model.onnx and the segments' plans)."""
    out_dir = output or model.with_suffix(".dlcc")
    if fallback is not None:
        return _compile_fallback(model, out_dir, shape, target, pipeline, device, precision, profile_db, quiet,
                                 json_out, _cache_arg(cache_dir, no_cache), tune, fallback)
    cm = _compile(model, shape, target, pipeline, device, quiet, json_out, out_dir, profile_db=profile_db,
                  cache=_cache_arg(cache_dir, no_cache), precision=precision, tune=tune, tune_top=tune_top,
                  tune_repeat=tune_repeat)
    s = cm.stats
    if json_out:
        print(json.dumps({"artifact": str(out_dir), "target": cm.target, "cache_hit": cm.cache_hit, **_summary(cm.plan),
                          **({"pipeline_choice": cm.plan["meta"]["pipeline_choice"]} if "pipeline_choice" in cm.plan["meta"] else {})}))
    elif not quiet:
        choice = cm.plan["meta"].get("pipeline_choice")
        if choice:
            how = "tuned" if choice.get("tuned") else "auto"
            out.print(f"pipeline {how} → [bold]{_escape(choice['chosen'])}[/]: {_escape(choice['why'])}")
            if choice.get("tuned"):
                out.print("  " + _escape(", ".join(f"{n} {t:.1f} µs" for n, t in sorted(choice["times_us"].items(),
                                                                                     key=lambda x: x[1]))))
        out.print(("[bold green]from cache[/] " if cm.cache_hit else "[bold green]compiled[/] ") + _escape(
                  f"{model} → {out_dir}  "
                  f"({s['kernels']} kernels, {s['launches']} launches, arena {_human(s['arena_bytes'])}, "
                  f"pipeline {cm.plan['meta']['pipeline']}, precision {cm.plan['meta'].get('precision', 'fp32')}, "
                  f"device {cm.plan['meta']['device']})"))
        if cm.plan["meta"].get("precision_note"):
            out.print(f"[yellow]note:[/] {_escape(cm.plan['meta']['precision_note'])}")
        _warn_spills(cm.plan)


def _compile_fallback(model, out_dir, shape, target, pipeline, device, precision, profile_db, quiet, json_out, cache,
                      tune, fallback):
    """compile --fallback: the model split between dlcc and onnxruntime (dlcc/partition.py), run
    once on sample inputs so its dlcc segments compile, and saved as a partition artifact."""
    from collections import Counter

    import dlcc

    if tune:
        raise DlccError("--tune measures whole-model plans; it does not combine with --fallback")
    m = dlcc.compile(model, out=out_dir, shapes=shape or [], target=target, pipeline=pipeline, device=device,
                     precision=precision, profile_db=profile_db, cache=cache, fallback=fallback,
                     steps=_steps(quiet or json_out))
    segs = m.segments
    if json_out:
        print(json.dumps({"artifact": str(out_dir), "target": m.target, "fallback": fallback, "segments": segs,
                          "plans": m.saved_plans}))
        return
    if quiet:
        return
    out.print(_segments_table(model.name, segs))
    n = Counter(s["engine"] for s in segs)
    out.print("[bold green]compiled[/] " + _escape(
        f"{model} → {out_dir}  ({len(segs)} segments: {n['dlcc']} on dlcc, {n[fallback]} on {fallback}; "
        f"{m.saved_plans} plan(s) compiled for the sample inputs' shapes; target {m.target}, "
        f"pipeline {pipeline}, precision {precision or 'fp32'})"))
    if not m.saved_plans and n["dlcc"]:
        out.print("[yellow]note:[/] a dynamic dim is unbound, so no segment was compiled yet: each compiles at "
                  "its first call for the shapes it gets (bind dims with --shape to compile them now)")


def _warn_spills(plan: dict) -> None:
    """One line where nvcc spilled registers in a kernel of this plan: it runs, but slower (its
    spilled values go through local memory), and dlcc's tests hold every test model to none."""
    cuda = plan.get("cuda") or {}
    spilled = {k: r["spill_bytes"] for k, r in (cuda.get("resources") or {}).items() if r.get("spill_bytes")}
    if spilled:
        worst = sorted(spilled.items(), key=lambda kv: -kv[1])[:3]
        err.print(f"[yellow]warning:[/] nvcc ({_escape(cuda.get('arch', ''))}) spilled registers in {len(spilled)} "
                  f"kernel(s): " + _escape(", ".join(f"{k} ({b} B)" for k, b in worst))
                  + "; they run, slower. `dlcc inspect ARTIFACT --launches` lists them (please report it)",
                  soft_wrap=True)
    serial = cuda.get("wgmma_serialized") or {}
    if serial:
        k, why = next(iter(serial.items()))
        err.print(f"[yellow]warning:[/] ptxas serialized the wgmma instructions in {len(serial)} kernel(s) (C7510), "
                  f"which then run slower: " + _escape(f"{k}: {why}") + " (please report it)", soft_wrap=True)


@app.command()
def run(artifact: Path = typer.Argument(..., help="artifact directory from `dlcc compile`"),
        inputs: Optional[Path] = typer.Option(None, "--inputs", "-i", help=".npz with one array per model input "
                                              "(default: seeded random inputs)"),
        outputs: Optional[Path] = typer.Option(None, "--outputs", "-o", help="write outputs to this .npz"),
        target: str = TargetOpt, seed: int = typer.Option(0, help="seed for generated inputs"),
        quiet: bool = QuietOpt, json_out: bool = JsonOpt):
    """Run a compiled artifact on the target and print (or save) its outputs."""
    import time

    import dlcc

    from .partition import PartitionedModel

    cm = dlcc.load(artifact, target=target)
    feeds = _load_inputs(inputs) if inputs else cm.sample_inputs(seed)
    steps = _steps(quiet or json_out)
    timing = {}
    if isinstance(cm, PartitionedModel):  # (its segments build and run in turn)
        with steps.step(f"run (dlcc segments on {cm.target}, the rest on {cm.fallback})"):
            t0 = time.perf_counter()
            res = cm(feeds)
            timing["run_s"] = time.perf_counter() - t0
    else:
        with steps.step(f"build kernels ({cm.target})"):
            ex = cm.executor()
        with steps.step("run"):
            res = ex.run(feeds, timing)
    if outputs:
        _atomic_npz(outputs, res)
    rows = [_output_row(k, v) for k, v in res.items()]
    if json_out:
        print(json.dumps({"target": cm.target, "run_s": timing.get("run_s"), "outputs": rows}))
        return
    t = Table(title=f"outputs ({cm.target}, {timing.get('run_s', 0) * 1e3:.1f} ms)")
    for c in ("output", "shape", "dtype", "mean", "std"):
        t.add_column(c)
    for r in rows:
        stats = ("-", "-") if r["dtype"] == "string" else (f"{r['mean']:.6g}", f"{r['std']:.6g}")
        t.add_row(_escape(r["name"]), "x".join(map(str, r["shape"])), r["dtype"], *stats)
    if not quiet:
        out.print(t)


@app.command()
def verify(model: Path = typer.Argument(..., help="ONNX model file"),
           shape: Optional[List[str]] = ShapeOpt, target: str = TargetOpt, pipeline: str = PipelineOpt,
           device: Optional[str] = DeviceOpt, precision: Optional[str] = PrecisionOpt,
           inputs: Optional[Path] = typer.Option(None, "--inputs", "-i", help=".npz inputs (default: seeded random)"),
           rtol: Optional[float] = typer.Option(None, help="relative tolerance (default: the precision's, "
                                                "see `dlcc verify --help`)"),
           atol: Optional[float] = typer.Option(None, help="absolute tolerance (default: the precision's)"),
           seed: int = typer.Option(0, help="seed for generated inputs"),
           fallback: Optional[str] = FallbackOpt, profile_db: Optional[Path] = ProfileDbOpt, quiet: bool = QuietOpt,
           json_out: bool = JsonOpt):
    """Compile, run on the target, run onnxruntime on the same inputs, and compare every output of
    the model's graph (a missing or extra output fails). An output passes where |got - ref| <=
    atol + rtol·|ref| everywhere; the default tolerances depend on the precision: fp32 rtol 1e-3,
    atol 1e-4; tf32 and fp16 rtol 1e-2, atol 1e-2 (10 of float32's 23 mantissa bits); bf16 rtol
    5e-2, atol 5e-2 (7 bits). An output stored as float16 or bfloat16 gets at least that type's
    pair. A float16 or bfloat16 model's reference is onnxruntime on the model widened to float32,
    its outputs rounded to their own type."""
    from .verify import DEFAULT_TOLERANCE, OUTPUT_TOLERANCE, verify_outputs

    given = _load_inputs(inputs) if inputs else None
    shape = list(shape or []) + _shapes_of(given, shape, model)
    if fallback is not None:
        return _verify_fallback(model, shape, target, pipeline, device, precision, given, rtol, atol, seed, fallback,
                                profile_db, quiet, json_out)
    cm = _compile(model, shape, target, pipeline, device, quiet, json_out, profile_db=profile_db, precision=precision)
    prec = cm.plan["meta"].get("precision", "fp32")
    tol_from = ("given" if rtol is not None and atol is not None else f"{prec} default" if rtol is None and atol is None
                else f"{'rtol' if rtol is not None else 'atol'} given, the other the {prec} default")
    feeds = given if inputs else cm.sample_inputs(seed)
    steps = _steps(quiet or json_out)
    with steps.step(f"build kernels ({cm.target})"):
        ex = cm.executor()
    timing = {}
    with steps.step(f"run on {cm.target}"):
        got = ex.run(feeds, timing)
    with steps.step("run onnxruntime"):
        rows = verify_outputs(model, got, feeds, rtol, atol, precision=prec, compiled=cm)
    passed = all(r["passed"] for r in rows)
    if rtol is None or atol is None:
        halves = sorted({r["dtype"] for r in rows if r["dtype"] in OUTPUT_TOLERANCE})
        tol_from += f" ({' and '.join(halves)} outputs: at least their type's)" if halves else ""
    if json_out:
        print(json.dumps({"passed": passed, "target": cm.target, "device": ex.rt.device_name, "precision": prec,
                          "rtol": DEFAULT_TOLERANCE[prec][0] if rtol is None else rtol,
                          "atol": DEFAULT_TOLERANCE[prec][1] if atol is None else atol,
                          "tolerance_from": tol_from, "outputs": rows, **_summary(cm.plan)}))
    else:
        t = Table(title=_escape(f"{model.name} on {cm.target} ({ex.rt.device_name}, {prec}) vs onnxruntime"),
                  caption=f"tolerance: {tol_from}")
        for c in ("output", "shape", "max abs err", "max rel err", "tolerance", "result"):
            t.add_column(c)
        for r in rows:
            t.add_row(_escape(r["name"]), "x".join(map(str, r["shape"])), f"{r['max_abs_err']:.3g}", f"{r['max_rel_err']:.3g}",
                      f"{r['atol']:g} + {r['rtol']:g}·|ref|" if "rtol" in r else "-",
                      (f"[green]PASS ({r['judge']})[/]" if r.get("judge") else "[green]PASS[/]")
                      if r["passed"] else "[red]FAIL[/]")
        out.print(t)
        for r in rows:
            if "note" in r:
                out.print(_escape(f"{r['name']}: {r['note']}"))
        out.print("[bold green]all outputs match[/]" if passed else "[bold red]mismatch[/]")
    raise typer.Exit(0 if passed else 1)


def _verify_fallback(model, shape, target, pipeline, device, precision, given, rtol, atol, seed, fallback, profile_db,
                     quiet, json_out):
    """verify --fallback: the model split between dlcc and onnxruntime (dlcc/partition.py), its
    outputs compared as a plain verify compares them, and the segments listed."""
    import dlcc

    from .verify import verify_outputs

    steps = _steps(quiet or json_out)
    with steps.step("split the model between dlcc and onnxruntime"):
        m = dlcc.compile(model, shapes=shape, target=target, pipeline=pipeline, device=device, precision=precision,
                         profile_db=profile_db, fallback=fallback)
    feeds = given if given is not None else m.sample_inputs(seed)
    with steps.step(f"compile the dlcc segments and run ({m.target}, then {fallback})"):
        got = m(feeds)
    with steps.step("run onnxruntime"):
        rows = verify_outputs(model, got, feeds, rtol, atol, precision=precision or "fp32", compiled=m)
    passed = all(r["passed"] for r in rows)
    if json_out:
        print(json.dumps({"passed": passed, "target": m.target, "fallback": fallback, "segments": m.segments,
                          "outputs": rows}))
        raise typer.Exit(0 if passed else 1)
    out.print(_segments_table(model.name, m.segments))
    t = Table(title=_escape(f"{model.name} on {m.target} with {fallback} vs onnxruntime"))
    for c in ("output", "shape", "max abs err", "max rel err", "result"):
        t.add_column(c)
    for r in rows:
        t.add_row(_escape(r["name"]), "x".join(map(str, r["shape"])), f"{r['max_abs_err']:.3g}",
                  f"{r['max_rel_err']:.3g}", "[green]PASS[/]" if r["passed"] else "[red]FAIL[/]")
    out.print(t)
    out.print("[bold green]all outputs match[/]" if passed else "[bold red]mismatch[/]")
    raise typer.Exit(0 if passed else 1)


def _summary(plan: dict) -> dict:
    s = plan["stats"]
    keys = ("onnx_nodes", "nodes_after_folding", "kernels", "launches", "memory_bound_launches", "dram_bytes", "lower_bound_bytes",
            "arena_bytes", "naive_bytes", "weights_bytes", "flops", "inplace_pairs", "op_histogram")
    return {k: s[k] for k in keys if k in s}


@app.command()
def inspect(path: Path = typer.Argument(..., help="ONNX model file or artifact directory"),
            shape: Optional[List[str]] = ShapeOpt, pipeline: str = PipelineOpt, device: Optional[str] = DeviceOpt,
            precision: Optional[str] = PrecisionOpt,
            launches: bool = typer.Option(False, "--launches", "-l", help="also list every launch in order: node, op, "
                                          "kernel, kind/tiling, grid x block, FLOPs, modelled DRAM bytes, arguments"),
            kernel: Optional[str] = typer.Option(None, "--kernel", "-k", help="print the source of this kernel "
                                                 "(name or unique prefix) and stop"),
            stitch: bool = typer.Option(False, "--stitch", help="show each stitched kernel and fused rOperator (astitch): "
                                        "ops, dominants, scheme of every edge, where intermediates live, thread "
                                        "mapping, DRAM bytes saved"),
            rprogram: bool = typer.Option(False, "--rprogram", help="show each persistent kernel (rammer): its vEUs "
                                          "and how they were derived, its waves with their ops and rTasks, sync points"),
            profile_db: Optional[Path] = ProfileDbOpt, json_out: bool = JsonOpt, quiet: bool = QuietOpt):
    """Summarise the graph and plan: ops, kernels, launches, DRAM bytes, lower bound, arena vs naive."""
    from .partition import MANIFEST

    if path.is_dir() and (path / MANIFEST).is_file():
        if launches or kernel is not None or stitch or rprogram:
            raise DlccError(f"{path} is a --fallback artifact: its segments are compiled per input shape, so "
                            "--launches, --kernel, --stitch and --rprogram have no one plan to show; inspect the "
                            "ONNX model instead")
        return _inspect_partition(path, json_out)
    if path.is_dir():
        from .artifact import read_artifact

        plan, _, sources = read_artifact(path)
        codes = None
    else:
        cm = _compile(path, shape, "opencl", pipeline, device, quiet, json_out, profile_db=profile_db, precision=precision)
        plan, codes = cm.plan, dict(zip((k["name"] for k in cm.plan["kernels"]), cm.kernel_codes))
    if kernel is not None:
        names = [k["name"] for k in plan["kernels"] if k["name"].startswith(kernel)]
        if len(names) != 1:
            raise DlccError(f"--kernel {kernel!r} matches {len(names)} kernels; names are listed by --launches"
                            + (f": {', '.join(names[:8])}" if names else ""))
        text = codes[names[0]] if codes else _kernel_text(sources.get("cuda", ""), names[0])
        print(text)
        return
    s = _summary(plan)
    kinfo = {k["name"]: k for k in plan["kernels"]}
    res = plan.get("cuda", {}).get("resources", {})  # ptxas figures, when compiled for CUDA with nvcc
    launch_rows = [{"index": i, "node": L["node"], "op": L["op_type"], "kernel": L["kernel"], "kind": kinfo[L["kernel"]]["kind"],
             "tiling": kinfo[L["kernel"]]["tiling"], "math": kinfo[L["kernel"]].get("math", "float32"),
             "grid": L["grid"], "block": L["block"], "flops": L["flops"],
             "dram_bytes": L["dram_bytes"],
             **({"registers": res[L["kernel"]]["registers"], "blocks_per_sm": res[L["kernel"]]["blocks_per_sm"],
                 "spill_bytes": res[L["kernel"]].get("spill_bytes", 0)} if L["kernel"] in res else {}),
             "args": [a["int"] if "int" in a else f"{a['storage']}+{a['offset']}" for a in L["args"]]}
            for i, L in enumerate(plan["launches"])] if launches else None
    by_kind: dict[str, int] = {}
    for L in plan["launches"]:
        by_kind[L["category"] or "other"] = by_kind.get(L["category"] or "other", 0) + 1
    if json_out:
        extra = {"launch_list": launch_rows} if launch_rows is not None else {}
        if stitch:
            extra["stitch"] = plan.get("stitch", [])
        if rprogram:
            extra["rprogram"] = plan.get("rprogram", [])
        print(json.dumps({**s, "launches_by_category": by_kind, "meta": plan["meta"], **extra}))
        return
    prec = plan["meta"].get("precision", "fp32")
    t = Table(title=_escape(f"{plan['meta']['model']} — pipeline {plan['meta']['pipeline']}, precision {prec}, "
                            f"device {plan['meta']['device']}"))
    t.add_column("metric")
    t.add_column("value", justify="right")
    rows = [("ONNX nodes", s["onnx_nodes"]), ("nodes after folding", s["nodes_after_folding"]),
            ("kernels (distinct)", s["kernels"]), ("launches per inference", s["launches"]),
            ("host launches on CUDA", "1 (a CUDA graph)" if plan["meta"].get("graphs") else s["launches"]),
            ("memory-bound launches", s.get("memory_bound_launches", "")),
            ("modelled DRAM bytes / inference", _human(s["dram_bytes"])),
            ("lower bound (weights + inputs + outputs)", _human(s["lower_bound_bytes"])),
            ("DRAM / lower bound", f"{s['dram_bytes'] / max(1, s['lower_bound_bytes']):.2f}x"),
            ("arena (memory plan)", _human(s["arena_bytes"])), ("naive sum of intermediates", _human(s["naive_bytes"])),
            ("in-place reuses", s["inplace_pairs"]), ("GFLOP / inference", f"{s['flops'] / 1e9:.3f}")]
    from .estimate.plan_mode import flops_by_math

    by_math = flops_by_math(plan)
    for m, f in sorted(by_math.items()):
        if m != "float32":
            rows.append((f"  of which on tensor cores ({m})", f"{f / 1e9:.3f}"))
    split = plan["meta"].get("split_k")
    if split:
        rows.append(("GEMMs split along K (tiling x launches)", ", ".join(f"{n} x{c}" for n, c in sorted(split.items()))))
    deep = [k for k in plan["kernels"] if k.get("dynamic_smem_bytes")]
    if deep:
        rows.append(("kernels with dynamic shared memory (DEEP GEMM tilings)",
                     ", ".join(f"{_escape(k.get('tiling') or k['name'])} {_human(k['dynamic_smem_bytes'])}" for k in deep)))
    kept = plan["meta"].get("float32_compute")
    if kept:
        rows.append((f"compute ops kept float32 at {prec}", ", ".join(f"{op} x{n}" for op, n in sorted(kept.items()))))
    for dt, (c, n) in sorted(_bytes_by_dtype(plan, "weights").items()):
        rows.append((f"weights stored as {dt}", _human(n)))
    if prec in ("fp16", "bf16"):  # the activations ops/narrow.py stores in the half type, and the rest
        for dt, (c, n) in sorted(_bytes_by_dtype(plan, "arena", floats_only=True).items()):
            rows.append((f"activations stored as {dt}", f"{c} ({_human(n)})"))
        f32 = plan["meta"].get("float32_activation_ops")
        if f32:
            rows.append(("ops keeping float32 activations", ", ".join(f"{op} x{n}" for op, n in f32.items())))
        if plan["meta"].get("float32_range_activations"):
            from .ops.narrow import HALF_DTYPES

            rows.append((f"activations kept float32 for {HALF_DTYPES[prec]}'s range",
                         str(plan["meta"]["float32_range_activations"])))
    for k, v in rows:
        t.add_row(_escape(k), _escape(str(v)))
    out.print(t)
    h = Table(title="op histogram (after folding)")
    h.add_column("op")
    h.add_column("count", justify="right")
    for op, c in s["op_histogram"].items():
        h.add_row(_escape(op), str(c))
    k = Table(title="launches by category")
    k.add_column("category")
    k.add_column("launches", justify="right")
    for cat, c in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        k.add_row(cat, str(c))
    out.print(h)
    out.print(k)
    said = plan["meta"].get("pass_log") or []
    if said:  # what each pass decided and why (GEMMs split, weights narrowed, DEEP tilings declined...)
        from .passes import PASSES

        pl = Table(title="what the passes said")
        pl.add_column("pass")
        pl.add_column("", overflow="fold")
        for line in said:
            name, _, rest = line.partition(": ")
            pl.add_row(*map(_escape, (name, rest) if name in PASSES or name == "import" else ("", line)))
        out.print(pl)
    _print_index_checks(plan["meta"])
    if launch_rows is not None:
        lt = Table(title="launches, in order")
        cols = ["#", "node", "op", "kernel", "kind", "grid x block", "MFLOP", "DRAM"]
        cols += ["regs", "blocks/SM", "spill B"] if res else []
        for c in cols + ["args (storage+offset)"]:
            lt.add_column(c, overflow="fold")
        for r in launch_rows:
            extra = ([str(r.get("registers", "")), str(r.get("blocks_per_sm", "")), str(r.get("spill_bytes", ""))]
                     if res else [])
            lt.add_row(*map(_escape, [
                str(r["index"]), r["node"], r["op"], r["kernel"],
                r["kind"] + (f" {r['tiling']}" if r["tiling"] else "") + (f" ({r['math']})" if r["math"] != "float32" else ""),
                f"{r['grid']} x {r['block']}", f"{r['flops'] / 1e6:.2f}", _human(r["dram_bytes"]), *extra,
                " ".join(map(str, r["args"]))]))
        out.print(lt)
    if stitch:
        _print_stitch(plan)
    if rprogram:
        _print_rprogram(plan)


def _inspect_partition(path: Path, json_out: bool) -> None:
    """inspect of a --fallback artifact: its compile options and its segments, from the manifest."""
    import dlcc

    m = dlcc.load(path)  # (checks the manifest and the model; compiles nothing)
    info = {"artifact": str(path), "target": m.target, "fallback": m.fallback, "plans": m.saved_plans,
            **m.options, "inputs": m.inputs, "outputs": m.outputs, "segments": m.segments}
    if json_out:
        print(json.dumps(info))
        return
    out.print(_segments_table(path.name, info["segments"]))
    out.print(_escape(f"target {info['target']}, pipeline {info['pipeline']}, precision {info['precision'] or 'fp32'}"
                      f", fallback {info['fallback']}; {info['plans']} plan(s) saved"))
    for i in info["inputs"]:
        out.print(_escape(f"  input  {i['name']}: {i['dtype']} {i['shape']}"))


def _print_index_checks(meta: dict) -> None:
    """Where each Gather's indices are checked (kernels/index_check.py): constants at compile time
    (not listed), graph inputs on the host before a run (by a device kernel when they come as
    device arrays), computed indices by a device kernel."""
    host, dev = meta.get("index_checks", []), meta.get("device_index_checks", [])
    if not host and not dev:
        return
    t = Table(title="index checks (out-of-range indices are errors, as in onnxruntime)")
    for c in ("node", "op", "indices", "checked", "bound"):
        t.add_column(c, overflow="fold")
    def bound(c):
        return {"divisor": "not 0 (a divisor)", "finite": "finite"}.get(c.get("kind"), " x ".join(map(str, c["bounds"])))

    for c in host:
        where = "on the host, before the run" + (f"; device arrays: {c['kernel']}" if c.get("kernel") else "")
        t.add_row(*map(_escape, [c["node"], c["op"], f"input {c['name']}", where, bound(c)]))
    for c in dev:
        t.add_row(*map(_escape, [c["node"], c["op"], f"computed {c['shape']}", f"on the device: {c['kernel']}", bound(c)]))
    out.print(t)


def _bytes_by_dtype(plan: dict, storage: str, floats_only: bool = False) -> dict[str, tuple[int, int]]:
    """(tensors, bytes) of one storage by dtype, views not counted twice: at fp16/bf16 the GEMM
    weights and the activations between converting ops are half (ops/narrow.py)."""
    out: dict[str, tuple[int, int]] = {}
    for t in plan.get("tensors", {}).values():
        if t.get("storage") == storage and not t.get("view_of") and (not floats_only or "float" in t["dtype"]):
            c, n = out.get(t["dtype"], (0, 0))
            out[t["dtype"]] = (c + 1, n + t["nbytes"])
    return out


def _print_rprogram(plan: dict) -> None:
    """`inspect --rprogram`: per persistent kernel the rammer pass made, its vDevice, waves with
    their rTasks and predicted time, and the rKernel chosen for each op and why; then every run of
    more than one wave with its join decision (the indices `run_join` and --tune name)."""
    rep = plan.get("rprogram")
    if not rep and not plan.get("rammer_runs"):
        out.print("[yellow]no rProgram: add the rammer pass to the pipeline (docs/rammer.md)[/]")
        return
    rep = rep or []
    for r in rep:
        t = Table(title=f"{_escape(r['kernel'])}: {r['launches']} launches in {r['waves']} wave(s), "
                        + (f"{r['dependencies']} dependency wait(s) (sync: counters), " if r.get("sync") == "counters"
                           else f"{r['sync_points']} grid barrier(s), ")
                        + f"{r.get('call_sites', '?')} call site(s), "
                        f"{r['smem_bytes']} B shared memory")
        t.add_column("wave", justify="right")
        t.add_column("rTasks", justify="right")
        t.add_column("µs (est.)", justify="right")
        t.add_column("ops (rTasks, rOperator)", overflow="fold")
        per = r.get("predicted_us_per_wave") or []
        rows = list(enumerate(zip(r["tasks_per_wave"], r["wave_ops"])))
        shown = rows if len(rows) <= 24 else rows[:12] + [None] + rows[-12:]
        for row in shown:
            if row is None:
                t.add_row("...", "", "", f"{len(rows) - 24} more waves (--json lists them all)")
                continue
            w, (n, ops) = row
            t.add_row(str(w), str(n), f"{per[w]:.2f}" if w < len(per) else "", _escape("; ".join(ops)))
        out.print(t)
        out.print(f"vEUs: {_escape(r['veus_from'])}")
        out.print(f"schedule: {_escape(r.get('decision', ''))}"
                  + (f"; predicted {r['predicted_us']:.1f} µs" if r.get("predicted_us") else ""))
        out.print(f"rTask times: {_escape(r.get('time_source', ''))}")
        seen = {}
        for k in r.get("rkernels", []):
            seen.setdefault(k["rkernel"], k)
        for name, k in seen.items():
            out.print(f"  rKernel {_escape(name)} for {_escape(k['op'])}: {_escape(k['why'])}")
    _print_runs(plan.get("rammer_runs") or [])


def _print_runs(runs: list[dict]) -> None:
    """The join decision of each run of more than one wave (plan["rammer_runs"])."""
    if not runs:
        return
    t = Table(title="runs of co-schedulable launches (run_join's indices)")
    for c, j in (("run", "right"), ("launches", "right"), ("waves", "right"), ("joined µs (est.)", "right"),
                 ("apart µs (est.)", "right"), ("decision", "left"), ("first op", "left")):
        t.add_column(c, justify=j, overflow="fold")
    for r in runs:
        t.add_row(str(r["run"]), str(r["launches"]), str(r["waves"]), f"{r['joined_us']:.1f}", f"{r['apart_us']:.1f}",
                  ("[green]joined[/]" if r["joined"] else "apart") + ": " + _escape(r["decision"]),
                  _escape(r["first_node"] or ""))
    out.print(t)


def _print_stitch(plan: dict) -> None:
    """`inspect --stitch`: one panel per stitched kernel or fused rOperator."""
    rep = plan.get("stitch")
    if rep is None:
        out.print("[yellow]no astitch report: compile with --pipeline astitch[/]")
        return
    for r in rep:
        saved = r["baseline_dram_bytes"] - r["dram_bytes"]
        if r["kind"] == "gemm":
            out.print(f"[bold]{_escape(r['kernel'])}[/] " + _escape(
                      f"rOperator {' + '.join(r['ops'])}  prologue: "
                      f"{', '.join(r['prologue']) or '-'}  epilogue: {', '.join(r['epilogue']) or '-'}  "
                      f"DRAM {_human(r['dram_bytes'])} (saves {_human(saved)})"
                      + (f"  math: {r['math']} ({'SIMT' if r['math'] == 'float32' else 'tensor cores'})"
                         if r.get("math") else "")))
            continue
        mp = r["mapping"]
        out.print(f"[bold]{_escape(r['kernel'])}[/] " + _escape(f"stitch of {len(r['ops'])} ops: {', '.join(r['ops'])}"))
        out.print(_escape(f"  dominants: {', '.join(r['dominants']) or '-'}   independent parts: {r['independent_components']}   "
                          f"DRAM {_human(r['dram_bytes'])} vs baseline {_human(r['baseline_dram_bytes'])} (saves {_human(saved)})"))
        e = Table(title="edges", title_justify="left")
        for c in ("producer", "consumer", "dependency", "scheme", "where"):
            e.add_column(c)
        for x in r["edges"]:
            e.add_row(*map(_escape, (x["producer"], x["consumer"], x["dependency"], x["scheme"], x["where"])))
        if r["edges"]:
            out.print(e)
        i = Table(title="intermediates", title_justify="left")
        for c in ("op", "phase", "lives in", "demoted"):
            i.add_column(c)
        for x in r["intermediates"]:
            i.add_row(_escape(x["op"]), "" if x["phase"] is None else str(x["phase"]), _escape(x["where"]),
                      "yes" if x["demoted"] else "")
        out.print(i)
        m = Table(title=f"thread mapping: block {mp['block']}, grid {mp['grid']}, {mp['waves']} wave(s)"
                        + (f", grid barrier (resident {mp['resident_blocks']}: {mp['residency']})" if mp["grid_sync"] else "")
                        + (f", split segment {mp['split_segment']}" if mp["split_segment"] is not None else ""),
                  title_justify="left")
        for c in ("phase", "units", "threads/unit", "units/block (horizontal)", "vertical", "split", "barrier before",
                  "block barriers", "smem", "stages"):
            m.add_column(c)
        for k, ph in enumerate(mp["phases"]):
            m.add_row(str(k), str(ph["units"]), str(ph["threads_per_unit"]), str(ph["units_per_block"]),
                      str(ph["vertical_packing"]), str(ph["split"]), "grid" if ph["grid_barrier_before"] else "",
                      f"{ph.get('block_barriers', len(ph['stages']))} of {len(ph['stages'])}",
                      _human(ph["smem_bytes"]), ", ".join(ph["stages"]))
        out.print(m)


def _kernel_text(source: str, name: str) -> str:
    """One kernel (its device functions and entry point) cut out of an artifact's kernels.cu."""
    import re

    first = re.search(rf"\b{re.escape(name)}(_ef\d+|_task)?\(", source)
    entry = re.search(rf"KERNEL void (LAUNCH_BOUNDS(?:_SM)?\([\d, ]+\) )?{re.escape(name)}\(", source)
    if first is None or entry is None:
        return ""
    start = source.rfind("\n", 0, first.start()) + 1
    end = source.find("\n}\n", entry.start()) + 3
    return source[start:end]

@app.command("list")
def list_(what: str = typer.Argument("ops", help="ops | devices | pipelines | passes | what-ifs"), json_out: bool = JsonOpt):
    """List supported ops, built-in devices, pipelines, registered passes or estimate's what-ifs."""
    from . import ops  # noqa: F401
    from .config import builtin_names, load_device, load_pipeline
    from .ops.registry import _REGISTRY
    from .passes import PASSES
    from .composite import listed as composite_ops
    from .fused_ops import MICROSOFT as FUSED, ONNX_DOMAIN as FUSED_ONNX_DOMAIN
    from .ml_ops import ML, ML_REWRITES
    from .ml_trees import TREE_OPS
    from .quantized import MICROSOFT

    if what == "ops":
        rows = sorted([(op, e[-1].category, ", ".join(str(x.since) for x in e)) for op, e in _REGISTRY.items()]
                      + [("If", "control flow: plain nodes at import (dlcc/control_flow.py)", "1"),
                         ("Loop", "control flow: unrolled at import (dlcc/loops.py)", "1"),
                         ("Scan", "control flow: unrolled at import (dlcc/loops.py)", "9"),
                         ("STFT", "a strided Conv against a Fourier basis, at import (dlcc/spectral.py)", "17"),
                         ("DFT", "a MatMul against a Fourier basis, at import (dlcc/spectral.py)", "17, 20"),
                         ("Bernoulli", "a uniform draw and Less, at import (dlcc/random_draws.py)", "15")]
                      + [(op, "standard ops at import (dlcc/composite.py)", since) for op, since in composite_ops()]
                      + [(op, "quantized: float32 arithmetic at import (dlcc/quantized.py)", since)
                         for op, since in (("QuantizeLinear", "10"), ("DequantizeLinear", "10"), ("DynamicQuantizeLinear", "11"),
                                           ("MatMulInteger", "10"), ("ConvInteger", "10"), ("QLinearMatMul", "10"),
                                           ("QLinearConv", "10"))]
                      + [(f"com.microsoft::{op}", "quantized: float32 arithmetic at import (dlcc/quantized.py)", "1")
                         for op in sorted(MICROSOFT)]
                      + [(f"com.microsoft::{op}", "onnxruntime's fused op: standard ops at import (dlcc/fused_ops.py)", "1")
                         for op in FUSED]
                      + [(f"{op} (onnxruntime's)", "onnxruntime's ONNX-domain op: standard ops at import (dlcc/fused_ops.py)",
                          "1" if op == "SimplifiedLayerNormalization" else "1 to 16") for op in FUSED_ONNX_DOMAIN]
                      + [(f"{ML}::{op}", "classic ML (skl2onnx, onnxmltools): standard ops at import ("
                          + ("dlcc/ml_trees.py)" if op in TREE_OPS else "dlcc/ml_ops.py)"),
                          "5" if op == "TreeEnsemble" else "1, 3" if op in TREE_OPS else "1") for op in sorted(ML_REWRITES)])
        cols = ("op", "category", "since opsets")
    elif what == "devices":
        rows = []
        for n in builtin_names("devices"):
            d = load_device(n)
            peaks = [f"{d.peak_tflops[k]:g}" if k in d.peak_tflops else "-" for k in ("float32", "tf32", "bfloat16")]
            rows.append((n, d.name, str(d.sms), f"{d.dram_bandwidth_gbps:g} GB/s", *peaks))
        cols = ("name", "device", "SMs", "DRAM", "fp32 TFLOP/s", "tf32 TFLOP/s", "bf16 TFLOP/s")
    elif what == "pipelines":
        rows = [(n, " → ".join(p.name for p in spec.passes), spec.precision, spec.description)
                for n in builtin_names("pipelines") for spec in [load_pipeline(n)]]
        cols = ("name", "passes", "precision", "description")
    elif what == "passes":
        rows = [(n, p.doc, _pass_options(p.options)) for n, p in sorted(PASSES.items())]
        cols = ("pass", "what it does", "options (pipeline YAML: name = default: what it sets)")
    elif what in ("what-ifs", "whatifs"):
        from .estimate.whatif import WHATIFS

        rows = [(w.signature(), w.help) for _, w in sorted(WHATIFS.items())]
        cols = ("what-if", "what it models")
    else:
        raise DlccError(f"unknown list {what!r}; choose ops, devices, pipelines, passes or what-ifs")
    if json_out:
        print(json.dumps([dict(zip(cols, r)) for r in rows]))
        return
    t = Table(title=what)
    for c in cols:
        t.add_column(c)
    for r in rows:
        t.add_row(*(_escape(str(v)) for v in r))
    out.print(t)


def _pass_options(model) -> str:
    """A pass's options, one line each, from its pydantic model: what a pipeline file may set."""
    lines = []
    for name, f in model.model_fields.items():
        default = f.default if f.default_factory is None else f.default_factory()
        lines.append(f"{name} = {json.dumps(default) if not isinstance(default, str) else default}"
                     + (f": {f.description}" if f.description else ""))
    return "\n".join(lines) or "-"


@app.command()
def estimate(model: Optional[Path] = typer.Argument(None, help="ONNX model (plan mode); leave out with --trace"),
             trace: Optional[Path] = typer.Option(None, "--trace", help="PyTorch profiler (Kineto) trace, .json or .json.gz (trace mode)"),
             what_if: Optional[List[str]] = typer.Option(None, "--what-if", "-w", help="what-if to predict (repeatable): "
                                                         "NAME, NAME=VALUE or NAME:KEY=VALUE,...; see `dlcc list what-ifs`. "
                                                         "In plan mode they apply to the best plan"),
             what_if_file: Optional[List[Path]] = typer.Option(None, "--what-if-file", help="Python file defining what-ifs "
                                                                "with @whatif (all of them are predicted)"),
             steps: Optional[str] = typer.Option(None, "--steps", help="only iterations N..M (ProfilerStep numbers)"),
             iterations: Optional[str] = typer.Option(None, "--iterations", help="regex of an annotation whose starts delimit "
                                                      "iterations (one match: its own span), for traces without ProfilerStep#N"),
             timeline: Optional[Path] = typer.Option(None, "--timeline", help="write the simulated timelines as Chrome-trace JSON"),
             shape: Optional[List[str]] = ShapeOpt,
             device: Optional[str] = typer.Option(None, "--device", "-d", help="plan mode: device name or YAML (default h100)"),
             pipeline: Optional[List[str]] = typer.Option(None, "--pipeline", "-p", help="plan mode: pipelines to rank "
                                                          "(repeatable; default: every configs/pipelines file)"),
             precision: Optional[List[str]] = typer.Option(None, "--precision", help="plan mode: precisions to rank "
                                                           "each pipeline at (repeatable: fp32, tf32x3, tf32, fp16, bf16; "
                                                           "default: each pipeline's own)"),
             profile_db: Optional[Path] = typer.Option(None, "--profile-db", help="plan mode: measured kernel times (JSON) to use "
                                                       "instead of the roofline where they exist"),
             quiet: bool = QuietOpt, json_out: bool = JsonOpt):
    """Predict latency with a Daydream-style simulation: what-ifs on a real trace, or dlcc's pipelines on a model."""
    from .errors import DlccError as _E

    if (model is None) == (trace is None):
        raise _E("give either an ONNX MODEL (plan mode: rank pipelines) or --trace RUN.json (trace mode: what-ifs), "
                 "not both")
    log = _steps(quiet or json_out)
    if trace is not None:
        from .estimate.trace_mode import estimate_trace

        est = estimate_trace(trace, what_if or [], [str(f) for f in what_if_file or []], steps, iterations, log)
        d = est.to_dict()
        if timeline:
            from .estimate.timeline import write_timeline

            write_timeline(timeline, [("baseline (replay)", est.graph)] + [(f"what-if {c.spec}", h) for c, h in est.what_ifs])
        if json_out:
            print(json.dumps(d))
        else:
            _print_trace_estimate(d, timeline)
        return
    from .estimate.plan_mode import estimate_plan

    if steps or iterations:
        raise _E("--steps and --iterations select iterations of a trace; plan mode has one inference")
    res = estimate_plan(model, shapes=shape or [], device=device or "h100", pipelines=pipeline or None,
                        precisions=precision or None, profile_db=profile_db, steps=log, extra_what_ifs=what_if or [],
                        what_if_files=[str(f) for f in what_if_file or []])
    if timeline:
        from .estimate.timeline import write_timeline

        write_timeline(timeline, res.scenarios())
    if json_out:
        print(json.dumps(res.to_dict()))
    else:
        _print_plan_estimate(res.to_dict(), timeline)


@app.command()
def profile(model: Path = typer.Argument(..., help="ONNX model file"),
            db: Path = typer.Option(..., "--db", help="profile database (JSON) to add the measurements to; created if missing"),
            shape: Optional[List[str]] = ShapeOpt, target: str = TargetOpt, pipeline: str = PipelineOpt,
            device: Optional[str] = DeviceOpt, precision: Optional[str] = PrecisionOpt,
            repeat: int = typer.Option(5, "--repeat", min=1, help="timed runs per launch (median)"),
            quiet: bool = QuietOpt, json_out: bool = JsonOpt):
    """Measure every kernel launch of MODEL on the target and record the times in a profile database,
    which `dlcc estimate --profile-db` then prefers to the roofline model."""
    from .estimate.profiledb import ProfileDB

    store = ProfileDB.load(db, missing_ok=True)  # a malformed database fails before any work
    cm = _compile(model, shape, target, pipeline, device, quiet, json_out, precision=precision)
    steps = _steps(quiet or json_out)
    ex = cm.executor()
    with steps.step(f"time {len(cm.plan['launches'])} launches x {repeat} on {cm.target}"):
        times, how = ex.profile(cm.sample_inputs(), repeat)
    # Entries are keyed by the plan's device spec (what estimate and auto look them up by); the
    # note says which device really ran them (an H200 measuring for the h100 spec, say).
    dev = cm.plan["meta"]["device"]
    ran_on = getattr(ex.rt, "device_name", cm.target)
    where = f"dlcc profile {model.name} ({cm.target}, {ran_on})"
    rows = []
    for L, us in zip(cm.plan["launches"], times):
        store.record(dev, L["kernel"], L["grid"], L["block"], us, where=where)
        rows.append({"kernel": L["kernel"], "op_type": L["op_type"], "grid": L["grid"], "block": L["block"], "us": us})
    store.save(db)
    if json_out:
        print(json.dumps({"db": str(db), "device": dev, "measured_on": ran_on, "target": cm.target, "timed_by": how,
                          "launches": rows}))
        return
    if quiet:
        return
    t = Table(title=f"slowest launches on {_escape(ran_on)}, recorded for the {_escape(dev)} spec (timed by {how})")
    for c in ("kernel", "op", "grid", "block", "µs"):
        t.add_column(c, justify="right" if c in ("grid", "block", "µs") else "left", overflow="fold")
    for r in sorted(rows, key=lambda r: -r["us"])[:15]:
        t.add_row(_escape(r["kernel"]), _escape(r["op_type"]), str(r["grid"]), str(r["block"]), f"{r['us']:.1f}")
    out.print(t)
    out.print(f"recorded {len(rows)} launches in {_escape(str(db))} ({len(store)} entries); "
              f"use it with: dlcc estimate {_escape(str(model))} --device {_escape(cm.plan['meta'].get('device_key', '...'))} "
              f"--profile-db {_escape(str(db))}")


def _short(help_text: str) -> str:
    """The first clause of a what-if's help, for tables (`dlcc list what-ifs` has the rest)."""
    k = help_text.find(":")
    return help_text[:k].strip() if 0 < k <= 60 else help_text


def _print_trace_estimate(d: dict, timeline) -> None:
    out.print(f"[bold]{_escape(d['trace'])}[/]  device {_escape(str(d['device']))}, {d['schema']} schema, "
              f"{d['tasks']} tasks on {len(d['resources'])} resources")
    deps = ", ".join(f"{k} {v}" for k, v in d["dependencies"].items() if v)
    out.print(f"[dim]dependencies: {deps}[/]")
    its = d["iterations"]
    shown = its[:max(0, min(12, (out.width - 62) // 10))]
    t = Table(title="iteration times (ms): measured, simulated baseline, and each what-if")
    t.add_column("scenario", overflow="fold")
    t.add_column("mean", justify="right")
    t.add_column("speedup", justify="right")
    t.add_column("GPU busy", justify="right")
    for r in shown:
        t.add_column(_escape(r["iteration"].replace("ProfilerStep", "step")), justify="right")
    t.add_row("measured", f"{d['measured_ms']:.2f}", "", "", *[f"{r['measured_ms']:.2f}" for r in shown])
    t.add_row(f"baseline (replay, {d['replay_error_pct']:+.2f}%)", f"{d['baseline_ms']:.2f}", "1.00x",
              f"{100 * d['gpu_busy']:.0f}%", *[f"{r['baseline_ms']:.2f}" for r in shown])
    if d["what_ifs"]:
        t.add_section()
    for w in sorted(d["what_ifs"], key=lambda w: w["predicted_ms"]):
        t.add_row(_escape(w["name"]), f"{w['predicted_ms']:.2f}", f"{w['speedup']:.2f}x", f"{100 * w['gpu_busy']:.0f}%",
                  *[f"{r['what_ifs'][w['name']]:.2f}" for r in shown])
    out.print(t)
    if len(its) > len(shown):
        out.print(f"[dim]{len(its) - len(shown)} more iteration(s): widen the terminal or use --json[/]")
    for w in d["what_ifs"]:
        out.print(f"[dim]{_escape(w['name'])}: {_escape(_short(w['help']))}[/]")
    if timeline:
        out.print(f"timeline → {_escape(str(timeline))} (open in https://ui.perfetto.dev)")


def _print_plan_estimate(d: dict, timeline) -> None:
    out.print(f"[bold]{_escape(d['model'])}[/] on {_escape(d['device'])}: kernel times from {', '.join(d['time_sources'])}")
    t = Table(title="pipelines ranked by predicted latency")
    for c in ("rank", "pipeline", "predicted µs", "time from", "launches", "DRAM", "lower bound µs", "vs bound"):
        t.add_column(c, justify="left" if c in ("pipeline", "time from") else "right", overflow="fold")
    for k, p in enumerate(d["pipelines"], 1):
        src = p.get("source", "modelled")
        if p.get("measured_ms") is not None:  # --tune measured it: the device's time beside the model's
            src = f"tuned: {p['measured_ms'] * 1e3:.1f} µs measured"
        t.add_row(str(k), _escape(p["name"]), f"{p['predicted_ms'] * 1e3:.1f}", _escape(src), str(p["launches"]),
                  _human(p["dram_bytes"]), f"{p['lower_bound_ms'] * 1e3:.2f}",
                  f"{p['predicted_ms'] / p['lower_bound_ms']:.1f}x" if p["lower_bound_ms"] else "-")
    out.print(t)
    if d.get("what_ifs"):
        w = Table(title=f"what-ifs on {_escape(d['pipelines'][0]['name'])} (the AStitch and Rammer estimates say what those passes should buy)")
        for c in ("what-if", "predicted µs", "launches", "speedup", "what it models"):
            w.add_column(c, justify="left" if c in ("what-if", "what it models") else "right")
        for x in d["what_ifs"]:
            w.add_row(_escape(x["name"]), f"{x['predicted_ms'] * 1e3:.1f}", str(x["launches"]), f"{x['speedup']:.2f}x",
                      _escape(_short(x["help"])))
        out.print(w)
    out.print(f"best: [bold]{_escape(d['best'])}[/] — {_escape(d['why'])}")
    if timeline:
        out.print(f"timeline → {_escape(str(timeline))} (open in https://ui.perfetto.dev)")


def _shapes_of(feeds: dict | None, shape, model) -> list[str]:
    """`--shape` bindings NAME=AxB for the arrays of `--inputs` that `--shape` does not bind, of
    the model's inputs with a dynamic dim: such a model is compiled for the inputs it is given.
    (Arrays that are no input of the model are left to the run, which names them.)"""
    if not feeds:
        return []
    import onnx

    try:
        graph = onnx.load(str(model), load_external_data=False).graph
    except Exception:
        return []  # the compile reports an unreadable model
    dynamic = {i.name for i in graph.input
               if any(not d.HasField("dim_value") for d in i.type.tensor_type.shape.dim)}
    bound = {str(b).split("=", 1)[0] for b in shape or [] if "=" in str(b)}
    return [f"{k}={'x'.join(map(str, v.shape))}" for k, v in feeds.items()
            if k in dynamic and k not in bound and getattr(v, "ndim", 0) > 0]


def _load_inputs(path: Path) -> dict:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except Exception as e:
        raise DlccError(f"{path}: cannot read inputs (.npz with one array per model input): {e}") from None


def _output_row(name: str, v) -> dict:
    """An output's row for `dlcc run`: shape, dtype, and the mean and spread of its numbers. A
    sequence or map (a fallback model's ZipMap, from onnxruntime) shows its length and kind, and
    the numbers inside it."""
    from .verify import value_kind, value_leaves

    if isinstance(v, (list, tuple, dict)):
        leaves: dict = {}
        value_leaves(v, "", leaves)
        nums = [np.asarray(a, np.float64).ravel() for a in leaves.values() if isinstance(a, np.ndarray)
                and a.dtype.kind in "biuf"]
        flat = np.concatenate(nums) if nums else np.zeros(0)
        shape, dtype = [len(v)], value_kind(v)
    else:
        a = np.asarray(v)
        shape, dtype = list(a.shape), str(a.dtype)
        # (in float64: ml_dtypes' bfloat16 and float8 would sum in their own type and overflow)
        flat = np.zeros(0) if a.dtype.kind in "OSU" else a.astype(np.float64)
        if a.dtype.kind in "OSU":  # strings (a fallback segment's labels): no mean to show
            dtype = "string"
    return {"name": name, "shape": shape, "dtype": dtype,
            "mean": float(np.mean(flat)) if flat.size else 0.0, "std": float(np.std(flat)) if flat.size else 0.0}


def _jsonable(v):
    """A sequence or map as JSON: lists, objects with string keys, numbers."""
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return np.asarray(v).tolist()


def _atomic_npz(path: Path, arrays: dict) -> None:
    """Outputs as an .npz, written whole or not at all. A sequence or map (a fallback model's
    ZipMap) is stored as its JSON text, and a string tensor (its labels) as a unicode array:
    both are arrays numpy reads without pickle."""
    from .artifact import atomic_file

    path = Path(path)
    if not path.resolve().parent.is_dir():
        raise DlccError(f"{path}: the directory {path.resolve().parent} does not exist")
    from .executor import ML_DTYPES

    # (ml_dtypes' types as voids of their bytes: numpy writes float8_e5m2 as "<f1", which no
    # numpy reads back; `.view(ml_dtypes.float8_e5m2)` restores it, and `dlcc run -i` takes it)
    arrays = {k: (np.array(json.dumps(_jsonable(v))) if isinstance(v, (list, tuple, dict))
                  else np.asarray(v).astype(str) if np.asarray(v).dtype.kind == "O"
                  else np.asarray(v).view(f"V{np.asarray(v).itemsize}") if np.asarray(v).dtype.name in ML_DTYPES
                  else v)
              for k, v in arrays.items()}
    with atomic_file(path, "wb") as f:
        np.savez(f, **arrays)


def _register_subcommands() -> None:
    from .batch.cli import register
    from .cache_cli import register as register_cache

    register(app, out, err)
    register_cache(app, out)


_register_subcommands()


def _warning_printer(fallback):
    """A warnings.showwarning that prints dlcc's own warnings (their text starts "dlcc: ") as one
    `warning:` line on stderr, like its errors: Python's form adds dlcc's file, line and source
    line, which are not the user's to act on. Other libraries' warnings go to `fallback`."""
    def show(message, category, filename, lineno, file=None, line=None):
        text = str(message)
        if text.startswith("dlcc: "):
            err.print("[yellow]warning:[/] " + _escape(text[len("dlcc: "):]), highlight=False, soft_wrap=True)
        else:
            fallback(message, category, filename, lineno, file, line)

    return show


def main(argv: list[str] | None = None) -> None:
    shown = warnings.showwarning
    warnings.showwarning = _warning_printer(shown)
    try:
        _main(argv)
    finally:
        warnings.showwarning = shown


def _main(argv: list[str] | None) -> None:
    try:
        rv = app(args=argv, standalone_mode=False)
        if rv == 130:  # typer turns Ctrl-C (KeyboardInterrupt) into a return code of 130
            _interrupted()
        if isinstance(rv, int):
            sys.exit(rv)
    except DlccError as e:
        err.print("[bold red]error:[/] " + _escape(str(e)), highlight=False, soft_wrap=True)
        sys.exit(e.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except OSError as e:
        # A path the user gave cannot be read or written (missing directory, permissions, disk full).
        where = f" {e.filename}" if e.filename else ""
        err.print("[bold red]error:[/] " + _escape(f"{e.strerror or e}:{where}"), highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        _interrupted()
    except Exception as e:
        # Usage errors (missing argument, bad option value, unknown command) come from the click
        # that typer bundles (typer._click) or from click itself: both have show() and exit_code.
        if hasattr(e, "show") and hasattr(e, "exit_code"):
            e.show()
            sys.exit(e.exit_code)
        if type(e).__name__ == "Abort":  # click's form of Ctrl-C
            _interrupted()
        traceback.print_exc()
        err.print("[bold red]internal error[/] — this is a dlcc bug; please report it with the traceback above")
        sys.exit(70)


def _interrupted():
    err.print("[red]interrupted[/] — nothing half-written is left: artifacts, cache entries and reports are "
              "written atomically")
    sys.exit(130)


def _escape(s: str) -> str:
    from rich.markup import escape

    return escape(s)


if __name__ == "__main__":
    main()
