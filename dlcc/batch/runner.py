"""Running batch jobs: each in its own worker process, so that one job's crash, hang-free PoCL abort
or leaked warnings cannot take the batch (or its terminal) with it.

Why spawned workers rather than forked ones: an OpenCL or CUDA context does not survive fork, and
the parent never touches one; each worker imports dlcc afresh. A worker writes its job's artifact
(atomically, dlcc.artifact) and its log, and returns one result row.

A job the cache already answers whole (`try_hit`) never reaches a worker: the parent materialises
it, so a re-run that changes nothing costs hashes and hard links, not worker start-ups.
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
import time
import traceback
import warnings
from pathlib import Path

from .report import write_atomic

#: Outcomes: what happened. A job *meets its expectation* when its outcome is the expected one
#: (`pass` expects "passed", `unsupported` expects "unsupported", `fail` expects "failed").
OUTCOMES = ("passed", "failed", "unsupported", "error")
_EXPECTED = {"pass": "passed", "unsupported": "unsupported", "fail": "failed"}


def met(row: dict) -> bool:
    return row["outcome"] == _EXPECTED[row["expect"]]


def blank_row(job: dict) -> dict:
    """A result row before anything ran: an `error` until the job says otherwise."""
    return {**{k: job[k] for k in ("name", "model", "pipeline", "device", "target", "expect")},
            "outcome": "error", "error": None, "launches": None, "dram_bytes": None, "lower_bound_bytes": None,
            "verify_max_abs_err": None, "verify_cached": None, "artifact": None, "seconds": 0.0, "cache_hit": None}


def run_job(job: dict, out_dir: str, cache: str | bool = False) -> dict:
    """Compile (and, if asked, verify) one job; never raises. The row carries the outcome, the
    one-paragraph error, the plan summary and timings; the full log goes to OUT/NAME.log."""
    from ..errors import DlccError
    from ..partition import refusals

    t0 = time.perf_counter()
    row = blank_row(job)
    art = Path(out_dir) / job["name"]
    with _captured(redirect=True) as log:
        try:
            import dlcc

            cm = dlcc.compile(job["model"], out=art, shapes=job["shapes"] or None, target=job["target"],
                              pipeline=job["pipeline"], device=job["device"], cache=cache,
                              precision=job.get("precision"), fallback=job.get("fallback"))
            _compiled(row, cm, art, log)
            row["outcome"] = "passed"
            if job.get("verify"):
                _verify(job, cm, row, cache, log)
        except refusals() as e:  # (what `--fallback onnxruntime` would run on onnxruntime)
            row.update(outcome="unsupported", error=str(e))
        except DlccError as e:
            row.update(outcome="failed", error=str(e))
        except Exception as e:  # a dlcc bug: the job fails alone, with its traceback in the log
            row.update(outcome="error", error=f"internal error ({type(e).__name__}: {e}); traceback in the log")
            traceback.print_exc()
    return _finish(row, log.getvalue(), out_dir, t0)


def try_hit(job: dict, out_dir: str, cache: str | bool) -> dict | None:
    """The job's row if the cache already holds all of it (the artifact, and a passed verification
    when the job verifies), with the artifact materialised; else None, and a worker runs the job.
    Runs in the batch's own process: a warm batch then starts no worker at all (a worker's
    imports cost more than a hit). Never raises: anything unexpected is left to the worker."""
    if not cache or job.get("fallback"):  # (a split model's artifact is made by a sample run: a worker's job)
        return None
    t0 = time.perf_counter()
    row = blank_row(job)
    try:
        with _captured(redirect=False) as log:  # (the parent's stdout belongs to rich's live display)
            from ..api import _merge_shapes, cache_key, load
            from ..cache import materialise
            from ..executor import pick_target

            tgt = pick_target(job["target"])
            c, key, _ = cache_key(job["model"], _merge_shapes(job["shapes"] or None), tgt, job["pipeline"],
                                  job["device"], None, cache, job.get("precision"))
            entry = c.lookup("artifacts", key)
            checked = None
            if entry is not None and job.get("verify"):
                checked = _cached_verification(c, key, job["verify"], tgt)[2]
            if entry is None or (job.get("verify") and checked is None):
                return None
            art = Path(out_dir) / job["name"]
            materialise(entry, art)
            cm = load(art, target=tgt)
            cm.cache_hit, cm.cache_key = True, key
            print(f"cache hit {key[:16]}: materialised from {entry}", file=log)
            _compiled(row, cm, art, log)
            row["outcome"] = "passed"
            if checked is not None:
                _report_verify(job, row, checked, True, log)
    except Exception:
        return None
    return _finish(row, log.getvalue(), out_dir, t0)


@contextlib.contextmanager
def _captured(redirect: bool):
    """Everything a job logs or warns (and, with `redirect`, prints: PoCL's and nvcc's output
    included) goes to one buffer, which becomes its log: never the batch's terminal."""
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    lg = logging.getLogger("dlcc")
    level = lg.level
    lg.addHandler(handler)
    lg.setLevel(logging.DEBUG)
    try:
        with warnings.catch_warnings(record=True) as caught, \
                contextlib.redirect_stdout(log) if redirect else contextlib.nullcontext(), \
                contextlib.redirect_stderr(log) if redirect else contextlib.nullcontext():
            warnings.simplefilter("always")
            yield log
            for w in caught:
                print(f"warning: {w.category.__name__}: {w.message}", file=log)
    finally:
        lg.removeHandler(handler)
        lg.setLevel(level)


def _compiled(row: dict, cm, art: Path, log) -> None:
    row["artifact"] = str(art)
    if getattr(cm, "fallback", None):  # a split model: its segments, no one plan
        engines = [s["engine"] for s in cm.segments]
        row.update(segments=len(engines), fallback_segments=sum(e != "dlcc" for e in engines), plans=cm.saved_plans)
        print(f"compiled {row['model']} -> {art}: {len(engines)} segments ({row['fallback_segments']} on "
              f"{cm.fallback}), {cm.saved_plans} plan(s)", file=log)
        return
    row["cache_hit"] = cm.cache_hit
    s = cm.plan["stats"]
    row.update(launches=s["launches"], kernels=s["kernels"], dram_bytes=s["dram_bytes"],
               lower_bound_bytes=s["lower_bound_bytes"], pipeline_resolved=cm.plan["meta"]["pipeline"],
               device_resolved=cm.plan["meta"]["device"])
    print(f"compiled {row['model']} -> {art}: {s['kernels']} kernels, {s['launches']} launches, "
          f"DRAM {s['dram_bytes']} B (lower bound {s['lower_bound_bytes']} B)", file=log)


def _verify(job: dict, cm, row: dict, cache, log) -> None:
    """Run the artifact on its target and compare with onnxruntime. With a cache, a passed
    verification of this very artifact (Cache.verified_key) is reused, and a new pass stored."""
    from ..cache import Cache
    from ..verify import verify_outputs

    v = job["verify"]
    c = None
    if getattr(cm, "fallback", None):  # a split model runs its segments in turn, host arrays in and out
        feeds = cm.sample_inputs(v["seed"])
        res = verify_outputs(job["model"], cm(feeds), feeds, v["rtol"], v["atol"],
                             half_output_floor=v.get("half_output_floor", False), compiled=cm)
        _report_verify(job, row, [_result(r) for r in res], False, log)
        return
    if cache and cm.cache_key:
        c = Cache.of(cache)
        vkey, vparts, passed = _cached_verification(c, cm.cache_key, v, cm.target)
        if passed is not None:
            _report_verify(job, row, passed, True, log)
            return
    feeds = cm.sample_inputs(v["seed"])
    ex = cm.executor()
    got = ex.run(feeds)
    res = verify_outputs(job["model"], got, feeds, v["rtol"], v["atol"],
                         half_output_floor=v.get("half_output_floor", False), compiled=cm)
    res = [_result(r) for r in res]
    build_log = getattr(ex.rt, "build_log", "")
    if build_log:
        print(f"{cm.target} compiler output:\n{build_log}", file=log)
    _report_verify(job, row, res, False, log)
    if c is not None and row["outcome"] == "passed":
        def write(d: Path):
            d.mkdir()
            (d / "result.json").write_text(json.dumps({"results": res, "job": job["name"]}))
        c.store("verified", vkey, vparts, write)


def _result(r: dict) -> dict:
    """One output's verify row as the report and the verification cache keep it."""
    return {"name": r["name"], "max_abs_err": float(r["max_abs_err"]), "max_rel_err": float(r["max_rel_err"]),
            "passed": bool(r["passed"]), **({"note": r["note"]} if "note" in r else {})}


def _cached_verification(c, artifact_key: str, verify: dict, target: str):
    """(key, key parts, the stored per-output results or None) of a passed verification."""
    vkey, vparts = c.verified_key(artifact_key, verify, target)
    hit = c.lookup("verified", vkey)
    return vkey, vparts, json.loads((hit / "result.json").read_text())["results"] if hit else None


def _report_verify(job: dict, row: dict, res: list[dict], cached: bool, log) -> None:
    v = job["verify"]
    row["verify_max_abs_err"] = max((r["max_abs_err"] for r in res), default=0.0)
    row["verify_cached"] = cached
    for r in res:
        print(f"verify {r['name']}: max abs err {r['max_abs_err']:.3g}, max rel err "
              f"{r['max_rel_err']:.3g}: {'PASS' if r['passed'] else 'FAIL'}" + (" (a cached pass)" if cached else "")
              + (f" ({r['note']})" if r.get("note") else ""), file=log)
    bad = [r for r in res if not r["passed"]]
    if bad:
        row["outcome"] = "failed"
        row["error"] = (f"{len(bad)} of {len(res)} output(s) differ from onnxruntime beyond atol "
                        f"{v['atol']:g} + rtol {v['rtol']:g}: " + ", ".join(
                            f"{r['name']} ({r.get('note') or 'max abs err %.3g' % r['max_abs_err']})" for r in bad))


def _finish(row: dict, text: str, out_dir: str, t0: float) -> dict:
    """Time, expectation, and the logs: OUT/NAME.log always, batch.log and batch.json in the artifact."""
    row["seconds"] = round(time.perf_counter() - t0, 3)
    row["met"] = met(row)
    text += f"{row['outcome']}: {row['error']}\n" if row["error"] else f"{row['outcome']}\n"
    row["log"] = str(Path(out_dir) / f"{row['name']}.log")
    write_atomic(Path(row["log"]), text)
    if row["artifact"]:
        art = Path(row["artifact"])
        write_atomic(art / "batch.log", text)
        write_atomic(art / "batch.json", json.dumps({k: v for k, v in row.items() if k != "log"}, indent=1))
    row["stdout"] = text[-4000:]
    return row
