"""Measured selection: `dlcc compile --tune` picks the pipeline by timing it on the device.

`--pipeline auto` trusts the estimator, whose constants were fitted on other kernels than dlcc's;
where its ranking is wrong, a user pays for it on every inference. TensorRT's builder and TVM's
tuning records answer that by measuring: `--tune` compiles the estimator's top candidates
(`--tune-top`, default 3), runs them on the target device (a warm-up each, then `--tune-repeat`
rounds that run every candidate once in turn on the model's sample inputs; the median per
candidate; candidates that build the same plan are one measurement), and keeps the fastest.

Then it measures Rammer's join decisions, which the estimator also makes, where it is in doubt
(join_variants): beside the fastest measured pipeline that runs `rammer`, each of the JOIN_FLIPS
least certain runs' decisions flipped alone (run_join), all doubtful runs joined and all apart,
and on a GPU two resident blocks per SM and dependency counters instead of grid barriers (`sync:
counters`), all timed in one set of rounds with the candidates;
flips that each paid are then timed together. A variant is labelled "PIPELINE (what it
changes)", and the record keeps how to build each label.

Before all that, it measures the rKernel choice: every GEMM problem of the model (weights GEMMs,
convolutions as implicit GEMMs, and batched ones such as attention's) is timed on the device in each tiling of its family
(the SIMT tilings at fp32, the tensor-core ones otherwise), as the rOperator alone on plain
operands of the same shape and layout, and checked against numpy. Where one beats the cost
model's pick, the candidates are compiled with it (`lower`'s gemm_tilings option), like TVM's
per-operator tuning records.

The times go into tuning records in the compile cache (`CACHE/tuning/KEY.json`). A pipeline
record is keyed like an artifact (model, shapes, target, device spec, precision, dlcc's source)
plus the device that measured, the candidates and the tilings; a tiling record by the problem,
its candidates, the measuring device, the precision and dlcc's source, so models that share a
GEMM share its record. A second compile of the same thing measures nothing. A record is
written once every candidate is measured, atomically (a temporary file renamed over it): an
interrupted tuning leaves no record, never half of one. A record that does not parse, or whose
key is not its file's, is ignored with a warning and measured again.
"""
from __future__ import annotations

import hashlib
import json
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

from .errors import DlccError

SCHEMA = 1
#: How much faster a measured tiling must be than the cost model's pick to replace it.
MIN_GAIN = 0.05
#: Runs of Rammer's whose join decision --tune flips one at a time: the ones whose two estimates
#: (one persistent kernel against one launch per wave) are closest, where the estimate is least sure.
JOIN_FLIPS = 4
#: A run's decision is worth measuring only where its two estimates are within this factor of each
#: other. Outside it the estimate is not in doubt: on PoCL, whose persistent kernels are built
#: unoptimised, joining is predicted 5-30x slower and measured 1.3-9x slower, and each joined
#: variant of a full-size model costs minutes of kernel builds.
JOIN_DOUBT = 3.0


class TuningError(DlccError):
    """--tune cannot measure here (no device to run on, nothing to choose among)."""


def _record_path(cache, key: str) -> Path:
    return cache.root / "tuning" / f"{key}.json"


def load_record(cache, key: str) -> dict | None:
    """The tuning record for `key`, or None (absent; or corrupt or foreign, with a warning)."""
    path = _record_path(cache, key)
    if not path.is_file():
        return None
    try:
        rec = json.loads(path.read_text())
        times = rec["times_us"]
        ok = (rec.get("schema") == SCHEMA and rec.get("key") == key and isinstance(times, dict) and times
              and all(isinstance(v, (int, float)) and v > 0 for v in times.values()) and rec.get("chosen") in times)
    except (OSError, ValueError, KeyError, TypeError):
        ok = False
    if ok and rec.get("kind") is None:  # a pipeline record: how to build each candidate it timed
        opts = rec.get("options")
        ok = (isinstance(opts, dict) and set(opts) == set(times)
              and all(isinstance(o, dict) and isinstance(o.get("pipeline"), str) and isinstance(o.get("rammer"), dict)
                      for o in opts.values()))
    if not ok:
        warnings.warn(f"dlcc: ignoring the tuning record {path} (corrupt, or not this compile's): measuring again",
                      RuntimeWarning, stacklevel=3)
        return None
    return rec


def save_record(cache, key: str, rec: dict) -> Path:
    """Write `rec` for `key` atomically: a reader sees the old record or the whole new one."""
    path = _record_path(cache, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tuning-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(rec, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def run_signature(cm) -> str:
    """What decides how an inference of `cm` runs: its launches (kernels, grids, arguments, arena
    offsets), its storages and its kernel source. Two pipelines that build the same plan (AStitch
    finding nothing to stitch in an RNN) have one signature, and are one measurement."""
    h = hashlib.sha256(json.dumps([cm.plan["launches"], cm.plan["storages"]], sort_keys=True, default=str).encode())
    h.update(cm.source(cm.target).encode())  # the target names its dialect
    return h.hexdigest()


def time_inferences(cms: dict, repeat: int) -> dict[str, float]:
    """µs per inference of each compiled model in `cms` (name -> model) on its target: one warm-up
    run each (kernel builds, the CUDA graph's capture), then `repeat` rounds that run every model
    once, in turn, and the median wall time of its runs on its sample inputs.

    Interleaved rounds, not one model's runs after another's: a machine whose speed drifts (a
    neighbour's load, clocks, a CPU's turbo) moves every candidate alike, instead of whichever ran
    during the slow stretch; sequential medians on PoCL put two identical plans 20% apart.
    Models with one run_signature are run once and given the same time."""
    sig_of = {n: run_signature(cm) for n, cm in cms.items()}
    runs = {}  # signature -> (executor, feeds)
    for n, cm in cms.items():
        if sig_of[n] not in runs:
            ex, feeds = cm.executor(), cm.sample_inputs(0)
            ex.run(feeds)
            runs[sig_of[n]] = (ex, feeds)
    samples: dict[str, list[float]] = {s: [] for s in runs}
    for _ in range(max(1, repeat)):
        for s, (ex, feeds) in runs.items():
            t0 = time.perf_counter()
            ex.run(feeds)
            samples[s].append((time.perf_counter() - t0) * 1e6)
    return {n: statistics.median(samples[sig_of[n]]) for n in cms}


def gemm_problems(plan: dict) -> list[dict]:
    """The distinct GEMM problems of `plan`'s launches (their "gemm" entries, plan.py), each with the
    tiling the plan chose ("picked"): weights GEMMs and convolutions (batch 1), and batched ones
    (attention's Q·Kᵀ and P·V where no fused attention kernel holds them)."""
    kernels = {k["name"]: k for k in plan.get("kernels", [])}
    seen: dict[str, dict] = {}
    for L in plan.get("launches", []):
        g, k = L.get("gemm"), kernels.get(L["kernel"]) or {}
        if not g or k.get("kind") != "gemm" or not k.get("tiling"):
            continue
        key = json.dumps([g["shape"], g["a_k_contiguous"], g["b_n_contiguous"]])
        seen.setdefault(key, dict(g, picked=k["tiling"]))
    return list(seen.values())


def time_tilings(rt, problem: dict, tilings, precision: str, repeat: int) -> dict[str, float]:
    """µs of the GEMM `problem` in each of `tilings` on runtime `rt`: the rOperator alone on plain
    operands of the problem's shape and layout (kernels/gemm.py plain_spec), stored as the
    precision stores them, each checked against numpy first (a tiling that computes wrong is an
    error, never a choice); the median of `repeat` device timings."""
    import numpy as np

    from .backends.source import render
    from .kernels import splitk
    from .kernels.gemm import gemm_source, plain_spec
    from .ops.narrow import HALF_DTYPES
    from .testing.rounding import operand_round

    batch, M, N, K = problem["shape"]
    half = HALF_DTYPES.get(precision, "float32")
    spec = plain_spec(M, N, K, trans_b=not problem["b_n_contiguous"], b_dtype=half, a_dtype=half,
                      trans_a=not problem["a_k_contiguous"], batch=batch)
    names = {t: f"tune_{t.name}" for t in tilings}
    from .executor import use_dynamic_smem
    from .kernels.gemm import kernel_smem

    kernels = [{"name": names[t], "tiling": t.name, "kind": "gemm",
                "dynamic_smem_bytes": kernel_smem(t)["dynamic_smem"]} for t in tilings]
    rt.compile(render([gemm_source(names[t], spec, t) for t in tilings], rt.dialect), {"kernels": kernels})
    use_dynamic_smem(rt, kernels)
    rng = np.random.default_rng(0)
    A = rng.standard_normal((batch,) + ((K, M) if not problem["a_k_contiguous"] else (M, K)), dtype=np.float32)
    B = rng.standard_normal((batch,) + ((K, N) if problem["b_n_contiguous"] else (N, K)), dtype=np.float32)
    a64 = operand_round(A, precision).astype(np.float64)
    b64 = operand_round(B, precision).astype(np.float64)
    ref = (a64.swapaxes(1, 2) if not problem["a_k_contiguous"] else a64) @ (b64 if problem["b_n_contiguous"]
                                                                            else b64.swapaxes(1, 2))
    host = [A.astype(np.dtype(half)).view(np.uint8), B.astype(np.dtype(half)).view(np.uint8)]
    sizes = [host[0].nbytes, host[1].nbytes, batch * M * N * 4]
    bufs = [rt.alloc(n) for n in sizes]
    for b, h in zip(bufs, host):
        rt.write(b, 0, h)
    args = [rt.view(b, 0, n) for b, n in zip(bufs, sizes)]
    times = {}
    for t in tilings:
        grid, extra = splitk.standalone_args(rt, t, batch, M, N)
        k, targs = rt.kernel(names[t]), args + extra
        rt.write(bufs[2], 0, np.full(batch * M * N, np.nan, np.float32))
        rt.launch(k, grid, t.threads, targs)
        rt.finish()
        out = np.empty((batch, M, N), np.float32)
        rt.read(bufs[2], 0, out)
        err = float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)) if np.isfinite(out).all() else np.inf
        if not err <= 1e-3:
            raise DlccError(f"--tune: the {t.name} GEMM rOperator computed {batch}x{M}x{N}x{K} wrong on {rt.device_name} "
                            f"(relative error {err:.1e}); a dlcc bug, please report it")
        times[t.name] = time_kernel(rt, k, grid, t.threads, targs, repeat)
    return times


def time_kernel(rt, kernel, grid: int, block: int, args: list, repeat: int) -> float:
    """µs of one launch on `rt`: on CUDA inside a CUDA graph (CudaRuntime.time_graph, as a graphed
    plan runs it and as scripts/gemm_tilings.py times cuBLAS), elsewhere the median of `repeat`
    timed launches (OpenCL's profiling events)."""
    if hasattr(rt, "time_graph"):
        return rt.time_graph(kernel, grid, block, args, repeat=max(1, repeat))
    return statistics.median(rt.time_launch(kernel, grid, block, args) for _ in range(max(1, repeat)))


def tune_tilings(model, shapes: dict, tgt: str, device, precision, repeat: int, cache, steps=None) -> dict[str, str]:
    """{"BATCHxMxNxK": tiling} for every GEMM problem of the model where a measured tiling beats the
    cost model's pick on the device by more than MIN_GAIN (tiling records in the cache answer what
    was measured before)."""
    from .api import _compile
    from .cache import Cache, source_digest
    from .devices import resolve_device
    from .executor import make_runtime
    from .kernels.gemm import shape_key, tiling_family_for
    from .progress import Steps

    steps = steps or Steps()
    rt = make_runtime(tgt)
    dev = resolve_device(device, tgt)[0]
    cm = _compile(model, shapes, tgt, "baseline", device, None, None, precision=precision)
    prec = (cm.plan.get("meta") or {}).get("precision") or precision or "fp32"
    family = tiling_family_for(prec, dev)
    c = Cache.of(cache if cache else True)
    chosen = {}
    for prob in gemm_problems(cm.plan):
        cands = [t for t in family if t.name != prob["picked"]] + [t for t in family if t.name == prob["picked"]]
        key = hashlib.sha256(json.dumps({"kind": "tiling", "problem": {k: prob[k] for k in ("shape", "a_k_contiguous",
                                                                                             "b_n_contiguous")},
                                         "candidates": sorted(t.name for t in cands), "precision": prec,
                                         "measured_on": rt.device_name, "repeat": repeat, "dlcc": source_digest()},
                                        sort_keys=True).encode()).hexdigest()
        rec = load_record(c, key)
        if rec is None:
            shape = prob["shape"] if prob["shape"][0] > 1 else prob["shape"][1:]  # (BATCHx)MxNxK
            with steps.step(f"tune: {len(cands)} tilings of {'x'.join(map(str, shape))} on {rt.device_name}"):
                times = time_tilings(rt, prob, cands, prec, repeat)
            best = min(times, key=lambda n: (times[n], n != prob["picked"]))
            # a win smaller than the spread of device timings is noise: the model's pick stays
            best = best if times[best] < (1 - MIN_GAIN) * times[prob["picked"]] else prob["picked"]
            rec = {"schema": SCHEMA, "key": key, "kind": "tiling", "problem": prob, "times_us": times,
                   "chosen": best, "measured_on": rt.device_name, "precision": prec}
            save_record(c, key, rec)
        if rec["chosen"] != prob["picked"]:
            chosen[shape_key(*prob["shape"])] = rec["chosen"]
    return chosen


def pipeline_with(name: str, tilings: dict[str, str], rammer: dict | None = None):
    """Built-in pipeline `name`, with measured GEMM tilings given to its `lower` pass and `rammer`
    (options measured by --tune: join, run_join, blocks_per_sm, sync) to its `rammer` pass (the name
    alone where there are neither)."""
    from .config import load_pipeline, with_gemm_tilings

    if not tilings and not rammer:
        return name
    pipe = with_gemm_tilings(load_pipeline(name), tilings)
    if rammer:
        pipe = pipe.model_copy(update={"passes": [
            p.model_copy(update={"options": {**p.options, **rammer}}) if p.name == "rammer" else p
            for p in pipe.passes]})
    return pipe


def join_variants(name: str, plan: dict, gpu: bool) -> dict[str, dict]:
    """Label -> rammer options of the join decisions --tune measures beside pipeline `name`'s own
    (whose plan is `plan`), over the runs whose two estimates are within JOIN_DOUBT of each other:
    - each of the JOIN_FLIPS least certain of them flipped alone (run_join);
    - all of them joined, and all of them apart (`join: always` and `join: never` where they are
      every run the plan could join);
    - on a GPU, where the plan joins a run, two resident blocks per SM, and dependency counters
      instead of a grid barrier per wave (`sync: counters`).
    A variant that builds a plan already listed (or `name`'s own) is left out."""
    import math

    def doubt(r):  # how close the two estimates are: |log(joined / apart)|
        return abs(math.log(max(r["joined_us"], 1e-9) / max(r["apart_us"], 1e-9)))

    decidable = [r for r in plan.get("rammer_runs") or [] if r.get("decidable")]
    runs = sorted((r for r in decidable if doubt(r) <= math.log(JOIN_DOUBT)),
                  key=lambda r: (doubt(r), -max(r["joined_us"], r["apart_us"])))
    if not runs:
        return {}
    seen = {join_effect(plan, {})}
    out: dict[str, dict] = {}

    def add(label: str, flips: dict[int, bool], opts: dict | None = None) -> None:
        effect = join_effect(plan, opts or {"run_join": flips})
        if effect not in seen:
            seen.add(effect)
            out[f"{name} ({label})"] = opts or {"run_join": flips}

    for r in runs[:JOIN_FLIPS]:
        add(f"run {r['run']} {'apart' if r['joined'] else 'joined'}", {r["run"]: not r["joined"]})
    every = len(runs) == len(decidable)
    for want, word, join in ((True, "joined", "always"), (False, "apart", "never")):
        flips = {r["run"]: want for r in runs if r["joined"] != want}
        if flips:
            add(f"join: {join}" if every else
                f"run{'s' if len(flips) > 1 else ''} {', '.join(map(str, sorted(flips)))} {word}", flips,
                {"join": join} if every else None)
    if gpu and any(r["joined"] for r in decidable):
        out[f"{name} (2 blocks per SM)"] = {"blocks_per_sm": 2}
        out[f"{name} (sync: counters)"] = {"sync": "counters"}
    return out


def join_effect(plan: dict, rammer: dict) -> tuple:
    """Which of `plan`'s decidable runs the rammer options `rammer` (join, run_join) leave joined:
    two variants with one effect build one plan."""
    join = rammer.get("join")
    flips = {int(k): v for k, v in (rammer.get("run_join") or {}).items()}
    out = []
    for r in plan.get("rammer_runs") or []:
        if r.get("decidable"):
            out.append((r["run"], flips.get(r["run"], {"always": True, "never": False}.get(join, r["joined"]))))
    return tuple(out)


def _combined_flips(name: str, won: dict[str, dict]) -> tuple[str, dict]:
    """The label and options of several winning run flips applied together."""
    flips = {k: v for o in won.values() for k, v in o["run_join"].items()}
    return (f"{name} (" + ", ".join(f"run {k} {'joined' if v else 'apart'}" for k, v in sorted(flips.items())) + ")",
            {"run_join": flips})


def tune(model, shapes: dict, tgt: str, device, precision, top: int, repeat: int, cache, steps=None) -> dict:
    """The pipeline and tiling choice by measurement: {"chosen", "gemm_tilings", "why", "device",
    "tuned": True, "times_us", "measured"} (measured: False when the records in the cache
    answered). The GEMM tilings are measured first (tune_tilings), and every candidate pipeline
    is compiled with them."""
    from .api import _compile, cache_key
    from .cache import Cache
    from .devices import resolve_device
    from .estimate.plan_mode import choose_pipeline
    from .executor import make_runtime
    from .progress import Steps

    steps = steps or Steps()
    if top < 1:
        raise TuningError(f"--tune-top {top}: measure at least one candidate")
    try:
        rt = make_runtime(tgt)
    except DlccError as e:
        raise TuningError(f"--tune measures on the device, and the {tgt} target cannot run here: {e}") from None
    dev = resolve_device(device, tgt)[0]
    _, est = choose_pipeline(model, shapes, dev, steps=steps, precision=precision)
    candidates = [p.name.split("@")[0] for p in est.pipelines][:top]
    c = Cache.of(cache if cache else True)
    tilings = tune_tilings(model, shapes, tgt, device, precision, repeat, c, steps)
    _, base_key, parts = cache_key(model, shapes, tgt, "auto", device, None, c, precision)
    key = hashlib.sha256(json.dumps({"artifact": base_key, "measured_on": rt.device_name, "gemm_tilings": tilings,
                                     "candidates": candidates, "repeat": repeat}, sort_keys=True).encode()).hexdigest()
    rec = load_record(c, key)
    measured = rec is None
    if rec is None:
        options = {n: {"pipeline": n, "rammer": {}} for n in candidates}

        def compile_all(which: list[str]) -> dict:
            out = {}
            for name in which:
                with steps.step(f"tune: compile {name}"):
                    o = options[name]
                    out[name] = _compile(model, shapes, tgt, pipeline_with(o["pipeline"], tilings, o["rammer"]),
                                         device, None, None, precision=precision)
            return out

        def time_all(cms: dict) -> dict[str, float]:
            with steps.step(f"tune: time {', '.join(cms)} on {rt.device_name} ({repeat} interleaved rounds)"):
                return time_inferences(cms, repeat)

        cms = compile_all(candidates)
        times = time_all(cms)
        # Rammer's join decisions: the fastest pipeline that joins, against its variants (timed in one
        # set of rounds with every candidate, so they are compared under the same conditions)
        rammers = [n for n in candidates if "rammer_runs" in cms[n].plan]
        if rammers:
            base = min(rammers, key=lambda n: (times[n], candidates.index(n)))
            variants = join_variants(base, cms[base].plan, dev.kind == "gpu")
            options.update({v: {"pipeline": base, "rammer": o} for v, o in variants.items()})
            if variants:
                cms.update(compile_all(list(variants)))
                times = time_all(cms)
                won = {v: o for v, o in variants.items() if "run_join" in o and times[v] < (1 - MIN_GAIN) * times[base]}
                label, o = _combined_flips(base, won) if len(won) > 1 else (None, None)
                if label and all(join_effect(cms[base].plan, o) != join_effect(cms[base].plan, x)
                                 for x in variants.values()):  # flips that each paid alone, together (not yet timed)
                    options[label] = {"pipeline": base, "rammer": o}
                    cms.update(compile_all([label]))
                    # every plan again, in one set of rounds with the combination: times from two sets of
                    # rounds are not comparable when the machine's speed drifts between them
                    times = time_all(cms)
        del cms
        order = list(options)
        chosen = min(times, key=lambda n: (times[n], order.index(n)))
        rec = {"schema": SCHEMA, "key": key, "candidates": candidates, "times_us": times, "chosen": chosen,
               "options": options, "measured_on": rt.device_name, "model_sha256": parts["model"],
               "precision": precision, "device": dev.name, "shapes": parts["shapes"],
               "predicted_us": {p.name.split("@")[0]: p.predicted_us for p in est.pipelines}}
        save_record(c, key, rec)
    times = rec["times_us"]
    chosen = rec["chosen"]
    # (a candidate with exactly the chosen one's time built the same plan: time_inferences ran it once)
    same = [n for n, t in times.items() if n != chosen and t == times[chosen]]
    rest = sorted((t, n) for n, t in times.items() if n != chosen and n not in same)
    why = (f"measured {times[chosen]:.1f} µs on {rec['measured_on']}"
           + (f" (the same plan as {', '.join(same)})" if same else "")
           + (f", {rest[0][0] / times[chosen]:.2f}x faster than the next, {rest[0][1]} ({rest[0][0]:.1f} µs)"
              if rest else "") + ("" if measured else "; from the tuning record"))
    if tilings:
        why += f"; {len(tilings)} GEMM tiling(s) measured faster than the cost model's pick: " + ", ".join(
            f"{k} {v}" for k, v in sorted(tilings.items()))
    return {"chosen": chosen, "pipeline": rec["options"][chosen]["pipeline"],
            "rammer_options": rec["options"][chosen]["rammer"], "gemm_tilings": tilings, "why": why,
            "device": est.device, "tuned": True,
            "measured": measured, "times_us": times, "candidates": rec["candidates"],
            "ranking": [{"name": p.name, "predicted_ms": p.predicted_us / 1e3} for p in est.pipelines]}


def measured_times(model, device_name: str, precision: str | None, cache=None) -> dict[str, float]:
    """Pipeline -> µs measured by `--tune` for `model` (any shapes bound as in the record) planned
    for device spec `device_name` at `precision`, from the tuning records of the default cache
    (or `cache`): what `dlcc estimate` shows beside its predictions. Unreadable records are
    skipped silently here (the compile that owns them warns)."""
    from .cache import Cache

    c = Cache.of(cache if cache else True)
    d = c.root / "tuning"
    if not d.is_dir():
        return {}
    try:
        sha = c.file_digest(model)
    except OSError:
        return {}
    out: dict[str, float] = {}
    for f in sorted(d.glob("*.json")):
        try:
            rec = json.loads(f.read_text())
            if (rec.get("schema") == SCHEMA and rec.get("model_sha256") == sha and rec.get("device") == device_name
                    and rec.get("precision") == precision):
                out.update({k: float(v) for k, v in rec["times_us"].items()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return out
