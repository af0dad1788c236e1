"""Running batch jobs: each in its own worker process, so that one job's crash, hang-free PoCL abort
or leaked warnings cannot take the batch (or its terminal) with it.

Why spawned workers rather than forked ones: an OpenCL or CUDA context does not survive fork, and
the parent never touches one; each worker imports dlcc afresh. A worker writes its job's artifact
(atomically, dlcc.artifact) and its log, and returns one result row.
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
            "verify_max_abs_err": None, "artifact": None, "seconds": 0.0, "cache_hit": None}


def run_job(job: dict, out_dir: str, cache: str | bool = False) -> dict:
    """Compile (and, if asked, verify) one job; never raises. The row carries the outcome, the
    one-paragraph error, the plan summary and timings; the full log goes to OUT/NAME.log."""
    from ..errors import DlccError, UnsupportedDtypesError, UnsupportedOpsError

    t0 = time.perf_counter()
    row = blank_row(job)
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    logging.getLogger("dlcc").addHandler(handler)
    logging.getLogger("dlcc").setLevel(logging.DEBUG)
    art = Path(out_dir) / job["name"]
    try:
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(log), \
                contextlib.redirect_stderr(log):
            warnings.simplefilter("always")
            try:
                import dlcc
                from ..verify import compare, run_onnxruntime

                cm = dlcc.compile(job["model"], out=art, shapes=job["shapes"] or None, target=job["target"],
                                  pipeline=job["pipeline"], device=job["device"], cache=cache)
                row["artifact"] = str(art)
                row["cache_hit"] = cm.cache_hit
                s = cm.plan["stats"]
                row.update(launches=s["launches"], kernels=s["kernels"], dram_bytes=s["dram_bytes"],
                           lower_bound_bytes=s["lower_bound_bytes"], pipeline_resolved=cm.plan["meta"]["pipeline"],
                           device_resolved=cm.plan["meta"]["device"])
                print(f"compiled {job['model']} -> {art}: {s['kernels']} kernels, {s['launches']} launches, "
                      f"DRAM {s['dram_bytes']} B (lower bound {s['lower_bound_bytes']} B)")
                outcome = "passed"
                v = job.get("verify")
                if v:
                    feeds = cm.sample_inputs(v["seed"])
                    ex = cm.executor()
                    got = ex.run(feeds)
                    names = [o["name"] for o in cm.outputs]
                    ref = run_onnxruntime(job["model"], feeds, names)
                    res = [compare(n, got[n], r, v["rtol"], v["atol"]) for n, r in zip(names, ref)]
                    row["verify_max_abs_err"] = max((float(r["max_abs_err"]) for r in res), default=0.0)
                    build_log = getattr(ex.rt, "build_log", "")
                    if build_log:
                        print(f"{cm.target} compiler output:\n{build_log}")
                    bad = [r for r in res if not r["passed"]]
                    for r in res:
                        print(f"verify {r['name']}: max abs err {r['max_abs_err']:.3g}, max rel err "
                              f"{r['max_rel_err']:.3g}: {'PASS' if r['passed'] else 'FAIL'}")
                    if bad:
                        outcome = "failed"
                        row["error"] = (f"{len(bad)} of {len(res)} output(s) differ from onnxruntime beyond atol "
                                        f"{v['atol']:g} + rtol {v['rtol']:g}: " + ", ".join(
                                            f"{r['name']} (max abs err {r['max_abs_err']:.3g})" for r in bad))
                row["outcome"] = outcome
            except (UnsupportedOpsError, UnsupportedDtypesError) as e:
                row.update(outcome="unsupported", error=str(e))
            except DlccError as e:
                row.update(outcome="failed", error=str(e))
            except Exception as e:  # a dlcc bug: the job fails alone, with its traceback in the log
                row.update(outcome="error", error=f"internal error ({type(e).__name__}: {e}); traceback in the log")
                traceback.print_exc(file=log)
            for w in caught:
                print(f"warning: {w.category.__name__}: {w.message}", file=log)
    finally:
        logging.getLogger("dlcc").removeHandler(handler)
    row["seconds"] = round(time.perf_counter() - t0, 3)
    row["met"] = met(row)
    text = log.getvalue() + (f"{row['outcome']}: {row['error']}\n" if row["error"] else f"{row['outcome']}\n")
    row["log"] = str(Path(out_dir) / f"{job['name']}.log")
    write_atomic(Path(row["log"]), text)
    if row["artifact"]:
        write_atomic(art / "batch.log", text)
        write_atomic(art / "batch.json", json.dumps({k: v for k, v in row.items() if k != "log"}, indent=1))
    row["stdout"] = text[-4000:]
    return row
