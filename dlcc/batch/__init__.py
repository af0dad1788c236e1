"""`dlcc batch`: compile (and optionally verify) every job of a YAML manifest in parallel worker
processes, for CI. manifest.py expands and shards the jobs, runner.py runs one, report.py writes
JUnit and JSON. CI's own matrix is the distributed engine: `--shard I/N` on N machines.
"""
from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import shutil
import tempfile
import time
from pathlib import Path
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

from .. import scratch as scratch_dirs
from .. import sigint
from .manifest import DEFAULT_TIMEOUT_S, Job, check_unique, load_manifest, shard
from .runner import blank_row, met, run_job, try_hit

__all__ = ["Job", "load_manifest", "check_unique", "shard", "run_batch", "run_job", "met", "blank_row"]


def run_batch(jobs: list[Job], out_dir: str, workers: int | None = None, fail_fast: bool = False,
              on_start=None, on_done=None, cache: str | bool = False, worker=run_job) -> list[dict]:
    """Run `jobs` on `workers` spawned processes (default: the core count); rows in job order.

    - Jobs the cache answers whole are done first, here, without a worker (runner.try_hit).
    - A worker that dies (a native crash in a compiler) breaks its pool and every job running in
      it: those are re-run one at a time, and the one that dies alone is an `error` row.
    - A job running past its `timeout` is an `error` row: the pool's workers are killed (a hung
      OpenCL call cannot be interrupted any other way), and the other jobs that were running
      start again on a fresh pool.
    - With `fail_fast`, jobs not started after the first unmet expectation are left out of the rows.

    `worker(job_dict, out_dir, cache) -> row` runs one job in a worker; tests pass their own."""
    os.makedirs(out_dir, exist_ok=True)
    rows: dict[str, dict] = {}
    state = {"stop": False}

    def done(j, row):
        rows[j.name] = row
        if on_done:
            on_done(j, row)
        if fail_fast and not row["met"]:
            state["stop"] = True

    todo = []
    for j in jobs:
        row = None if state["stop"] else try_hit(j.as_dict(), out_dir, cache)
        if row is None:
            todo.append(j)
        else:
            if on_start:
                on_start(j)
            done(j, row)
    workers = max(1, min(workers or os.cpu_count() or 1, len(todo) or 1))
    suspects = []
    while todo and not state["stop"]:
        broke, todo = _pool(todo, workers, out_dir, cache, state, on_start, done, worker)
        suspects += broke
    for j in suspects:  # alone now: a second death is this job's own
        if not state["stop"] and _pool([j], 1, out_dir, cache, state, on_start, done, worker)[0]:
            done(j, _error_row(j, "the worker process died (a native crash, e.g. in the OpenCL or CUDA compiler), "
                                  "also when re-run alone"))
    return [rows[j.name] for j in jobs if j.name in rows]


def _pool(pending: list[Job], workers: int, out_dir: str, cache, state: dict, on_start, done,
          worker) -> tuple[list[Job], list[Job]]:
    """Run `pending` on one process pool. Returns (jobs that were running when a worker died,
    jobs still to run): ([], []) when all ran; ([], rest) after a timeout killed the pool.

    A job's clock starts when its worker picks it up (the worker says so on `starts`), so a
    worker's spawn and imports do not count against it; until then its deadline has START_GRACE_S
    more (a worker too stuck to say so is still stopped)."""
    ctx = mp.get_context("spawn")
    starts = ctx.Queue()
    scratch = scratch_dirs.mkdtemp("batch")  # the workers' temporary files (_init_worker)
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker,
                                 initargs=(starts, scratch)) as pool:
            running: dict = {}  # future -> (job, deadline)
            try:
                return _drive(pool, starts, running, pending, workers, out_dir, cache, state, on_start, done, worker)
            except KeyboardInterrupt:  # Ctrl-C: stop the workers now rather than wait for their jobs
                _kill_workers(pool, out_dir, [j.name for j, _ in running.values()])
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _drive(pool, starts, running: dict, pending: list[Job], workers: int, out_dir: str, cache, state: dict,
           on_start, done, worker) -> tuple[list[Job], list[Job]]:
    """_pool's loop: keep `workers` jobs running, collect rows, enforce timeouts."""
    while pending or running:
        while pending and len(running) < workers and not state["stop"]:
            j = pending.pop(0)
            with sigint.blocked_while_spawning(_spawns(pool)):
                f = pool.submit(_run, worker, j.as_dict(), out_dir, cache)
            running[f] = (j, time.time() + _limit(j) + START_GRACE_S)
            if on_start:
                on_start(j)
        if not running:
            return [], []
        _note_starts(starts, running)
        first = min(d for _, d in running.values())
        finished, _ = wait(running, timeout=min(1.0, max(0.0, first - time.time())), return_when=FIRST_COMPLETED)
        for f in finished:
            try:
                row = f.result()
            except BrokenProcessPool:
                return [j for j, _ in running.values()], pending
            done(running.pop(f)[0], row)
        _note_starts(starts, running)
        late = [f for f, (_, d) in running.items() if not f.done() and d <= time.time()]
        if late:
            _kill_workers(pool, out_dir, [j.name for j, _ in running.values()])
            for f in late:
                j = running.pop(f)[0]
                done(j, _error_row(j, f"timed out after {_limit(j):g} s (the job's `timeout`; "
                                      "its worker was killed)"))
            return [], [j for j, _ in running.values()] + pending
    return [], []


#: Seconds a submitted job may wait for its worker to start it (spawn, imports) before its own
#: timeout starts anyway.
START_GRACE_S = 120.0
_STARTS = None  # in a worker: the queue it reports job starts on


def _init_worker(starts, scratch: str) -> None:
    """In a worker: where job starts are reported, Ctrl-C ignored (the parent handles it and kills
    the workers), and temporary files (onnxruntime's folding copies the model; nvcc's files) made
    under `scratch`, which the parent removes once the pool is done: a SIGKILLed worker cannot
    clean up after itself, and a model's copy can be hundreds of MB."""
    global _STARTS
    _STARTS = starts
    sigint.ignore_in_worker()
    os.environ["TMPDIR"] = scratch  # (the subprocesses a job starts inherit it)
    tempfile.tempdir = scratch


def _spawns(pool: ProcessPoolExecutor) -> bool:
    """Whether the pool's next submit starts a worker: with the spawn start method it starts one
    per submit until it has max_workers (concurrent.futures' _adjust_process_count)."""
    spawned = len(getattr(pool, "_processes", None) or {})
    return spawned < getattr(pool, "_max_workers", spawned + 1)


def _run(worker, job: dict, out_dir: str, cache) -> dict:
    """In a worker: say when the job starts (its timeout's clock), then run it."""
    if _STARTS is not None:
        _STARTS.put((job["name"], time.time()))
    return worker(job, out_dir, cache)


def _note_starts(starts, running: dict) -> None:
    """Restart the clock of each job whose worker reported it started."""
    by_name = {j.name: f for f, (j, _) in running.items()}
    while True:
        try:
            name, t = starts.get_nowait()
        except queue.Empty:
            return
        except (OSError, ValueError, EOFError):  # (a worker killed mid-put)
            return
        f = by_name.get(name)
        if f is not None:
            j = running[f][0]
            running[f] = (j, t + _limit(j))


def _limit(j: Job) -> float:
    return j.timeout or DEFAULT_TIMEOUT_S


def _kill_workers(pool: ProcessPoolExecutor, out_dir: str, names: list[str]) -> None:
    """SIGKILL every worker of `pool` (the only way to stop one stuck in native code), then remove
    what they left half-written for jobs `names` under `out_dir`: dlcc.artifact's temp directories
    and files (`.NAME.tmp-*`, `.NAME.old-*`, `.NAME.log.*.tmp`). Published artifacts are never
    touched. The pool is broken afterwards; its other jobs are re-run by the caller."""
    procs = list(getattr(pool, "_processes", {}).values())
    for p in procs:
        with contextlib.suppress(Exception):
            p.kill()
    for p in procs:
        with contextlib.suppress(Exception):
            p.join(10)
    out = Path(out_dir)
    for name in names:
        for pat in (f".{name}.tmp-*", f".{name}.old-*", f".{name}.log.*.tmp", f"{name}/.*.tmp"):
            for left in out.glob(pat):
                if left.is_dir():
                    shutil.rmtree(left, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        left.unlink()


def _error_row(j: Job, error: str) -> dict:
    row = {**blank_row(j.as_dict()), "stdout": "", "error": error}
    row["met"] = met(row)
    return row
