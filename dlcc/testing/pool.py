"""Worker processes that run fuzz cases with a per-case timeout.

A case that runs past its timeout is a `hang` verdict, and one whose worker dies (a native crash
in a driver or compiler) is a `crash`: the worker is killed or reaped and a fresh one started, and
the other workers go on. A hung OpenCL or CUDA call cannot be interrupted from Python, so killing
the process is the only way out (dlcc batch does the same for its jobs).

Workers are spawned (not forked: an OpenCL platform does not survive a fork), each runs cases one
at a time, and says when it starts one, so the clock does not count its spawn and imports.

A worker is replaced after `max_cases` cases: PoCL 3.1 never unmaps a kernel library it loaded,
even once the program is released (about 4 memory maps per kernel: build and release programs
in a loop and count the lines of /proc/self/maps), so a worker that builds ~13,000 kernels
reaches Linux's vm.max_map_count (65,530) and PoCL aborts (SIGABRT) on its next build.
"""
from __future__ import annotations

import multiprocessing as mp
import time
from multiprocessing.connection import wait as conn_wait

from .. import sigint


def _worker(conn, fn_path: str) -> None:
    import importlib
    import os
    import signal

    # Ctrl-C (and a SIGTERM sent to the process group) reaches every worker: the parent stops the
    # run and ends the workers, and a case cut short by it must not come back as a worker that
    # "died" (a crash verdict).
    sigint.ignore_in_worker()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

    # OpenCL compilers print their diagnostics straight to file descriptor 2 (clang's "N warnings
    # generated"): not the user's to act on, and everything a case found comes back as its result.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)

    mod, name = fn_path.rsplit(":", 1)
    fn = getattr(importlib.import_module(mod), name)
    conn.send(("ready", None, None))
    while True:
        msg = conn.recv()
        if msg is None:
            return
        key, task = msg
        conn.send(("start", key, time.time()))
        try:
            res = fn(task)
        except Exception as e:  # a bug in the harness itself: reported, never lost
            import traceback

            res = {"harness_error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=8)}
        conn.send(("done", key, res))


class _Slot:
    def __init__(self, ctx, fn_path: str):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, fn_path), daemon=True)
        with sigint.blocked_while_spawning():
            self.proc.start()
        child.close()
        self.key = None
        self.task = None
        self.deadline = None
        self.ready = False
        self.done = 0  # cases finished


def _death(proc) -> str:
    """What killed a worker whose pipe closed: its exit code once reaped (-9: SIGKILL, often the
    kernel's out-of-memory killer; -11: a segmentation fault in native code)."""
    proc.join(5)
    code = proc.exitcode
    if code is not None and code < 0:
        import signal
        try:
            return f"the worker process died ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"the worker process died (exit code {code})"


def run_tasks(tasks: list, fn_path: str, workers: int = 2, timeout: float = 600.0, on_result=None,
              stop_at: float | None = None, max_cases: int | None = 200) -> dict:
    """Run fn(task) for each (key, task) in `tasks` on `workers` processes. `fn_path` is
    "module:function". Returns {key: result}; a case past `timeout` seconds gives
    {"hang": ...}, a dead worker {"died": ...}. `on_result(key, result)` is called as each ends.
    `stop_at` (a time.time() value) stops handing out new cases then; a worker is replaced by a
    fresh one after `max_cases` cases (None: never)."""
    ctx = mp.get_context("spawn")
    pending = list(tasks)
    results: dict = {}
    slots = [_Slot(ctx, fn_path) for _ in range(max(1, min(workers, len(pending) or 1)))]

    def finish(key, res):
        results[key] = res
        if on_result:
            on_result(key, res)

    def restart(i):
        s = slots[i]
        if s.key is None:  # an idle worker (retired): let it leave on its own first
            try:
                s.conn.send(None)
                s.proc.join(10)
            except (OSError, ValueError):
                pass
        if s.proc.is_alive():
            s.proc.kill()
        s.proc.join(10)
        slots[i] = _Slot(ctx, fn_path)

    def accepting() -> bool:
        return bool(pending) and (stop_at is None or time.time() < stop_at)

    try:
        while True:
            for s in slots:
                if s.ready and s.key is None and accepting():
                    s.key, s.task = pending.pop(0)
                    s.deadline = time.time() + timeout + 120  # until it says it started (spawn, imports)
                    s.conn.send((s.key, s.task))
            if all(s.key is None for s in slots) and not accepting():
                break
            ready = conn_wait([s.conn for s in slots] + [s.proc.sentinel for s in slots], timeout=1.0)
            for i, s in enumerate(slots):
                if s.conn in ready:
                    try:
                        kind, key, val = s.conn.recv()
                    except (EOFError, OSError):
                        kind = "eof"
                    if kind == "ready":
                        s.ready = True
                    elif kind == "start" and key == s.key:
                        s.deadline = val + timeout
                    elif kind == "done" and key == s.key:
                        finish(key, val)
                        s.key = s.task = None
                        s.done += 1
                        if max_cases and s.done >= max_cases and accepting():
                            restart(i)
                    elif kind == "eof":
                        if s.key is not None:
                            finish(s.key, {"died": _death(s.proc)})
                        restart(i)
                elif s.proc.sentinel in ready and not s.proc.is_alive():
                    if s.key is not None:
                        finish(s.key, {"died": _death(s.proc)})
                    restart(i)
            now = time.time()
            for i, s in enumerate(slots):
                if s.key is not None and s.deadline is not None and now > s.deadline:
                    finish(s.key, {"hang": f"no verdict after {timeout:g} s; the worker was killed"})
                    restart(i)
    finally:
        for s in slots:
            try:
                s.conn.send(None)
            except Exception:
                pass
        for s in slots:
            s.proc.join(5)
            if s.proc.is_alive():
                s.proc.kill()
    return results
