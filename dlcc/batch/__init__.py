"""`dlcc batch`: compile (and optionally verify) every job of a YAML manifest in parallel worker
processes, for CI. manifest.py expands and shards the jobs, runner.py runs one, report.py writes
JUnit and JSON. CI's own matrix is the distributed engine: `--shard I/N` on N machines.
"""
from __future__ import annotations

import multiprocessing as mp
import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

from .manifest import Job, check_unique, load_manifest, shard
from .runner import blank_row, met, run_job

__all__ = ["Job", "load_manifest", "check_unique", "shard", "run_batch", "run_job", "met"]


def run_batch(jobs: list[Job], out_dir: str, workers: int | None = None, fail_fast: bool = False,
              on_start=None, on_done=None, cache: str | bool = False) -> list[dict]:
    """Run `jobs` on `workers` spawned processes (default: the core count); rows in job order.
    A worker that dies (a native crash in a compiler) breaks its pool and every job running in it:
    those are re-run one at a time, and the one that dies alone is an `error` row. With
    `fail_fast`, jobs not started after the first unmet expectation are left out of the rows."""
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs) or 1))
    os.makedirs(out_dir, exist_ok=True)
    rows: dict[str, dict] = {}
    state = {"stop": False}

    def done(j, row):
        rows[j.name] = row
        if on_done:
            on_done(j, row)
        if fail_fast and not row["met"]:
            state["stop"] = True

    todo, suspects = list(jobs), []
    while todo and not state["stop"]:
        broke, todo = _pool(todo, workers, out_dir, cache, state, on_start, done)
        suspects += broke
    for j in suspects:  # alone now: a second death is this job's own
        if not state["stop"] and _pool([j], 1, out_dir, cache, state, on_start, done)[0]:
            done(j, _crashed(j))
    return [rows[j.name] for j in jobs if j.name in rows]


def _pool(pending: list[Job], workers: int, out_dir: str, cache, state: dict, on_start,
          done) -> tuple[list[Job], list[Job]]:
    """Run `pending` on one process pool. If a worker dies, the pool breaks: returns the jobs that
    were running then, and those not yet started; else ([], [])."""
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
        running: dict = {}
        while pending or running:
            while pending and len(running) < workers and not state["stop"]:
                j = pending.pop(0)
                running[pool.submit(run_job, j.as_dict(), out_dir, cache)] = j
                if on_start:
                    on_start(j)
            if not running:
                return [], []
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for f in finished:
                try:
                    row = f.result()
                except BrokenProcessPool:
                    return list(running.values()), pending
                done(running.pop(f), row)
    return [], []


def _crashed(j: Job) -> dict:
    row = {**blank_row(j.as_dict()), "stdout": "",
           "error": "the worker process died (a native crash, e.g. in the OpenCL or CUDA compiler), "
                    "also when re-run alone"}
    row["met"] = met(row)
    return row
