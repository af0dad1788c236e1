"""Run a step that may crash the whole process in a worker process instead, and survive it.

Why: dlcc hands every model to onnxruntime's graph optimiser for constant folding
(frontend.fold_with_onnxruntime). onnxruntime is native code, and on unusual graphs it can die
by a signal instead of raising: 1.23's basic optimisation segfaulted on Silero VAD once an If's
condition became a constant. In-process, that kills `dlcc compile` with no message at all, and
any Python program that called `dlcc.compile`. In a worker, a crash is a status: the import goes
on without onnxruntime's folding (dlcc's own folder, which evaluates constants with
onnx.reference, folds what it can) and says so.

How: one worker per process, `python -m dlcc.isolate`, started on first use (about half a
second: Python and onnxruntime) and kept: each call is a line on its stdin naming a step of
STEPS and its arguments, and a line back, so onnxruntime's own start-up is paid once. A worker
that crashed or timed out is replaced on the next call. A plain subprocess, not
multiprocessing: it never re-imports the caller's `__main__` (an unguarded script would run
twice) and pickles nothing. With DLCC_ISOLATE=0 in the environment (and on Windows, where
select() does not take pipes) the steps run in-process.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading


def _ort_optimize(*args) -> bool:
    from .frontend import _ort_optimize as step

    return step(*args)


def _signal(signum: int) -> bool:
    """The worker kills itself with `signum`: how the tests show that a crash is survived."""
    import signal

    os.kill(os.getpid(), int(signum) or signal.SIGSEGV)
    return False


#: The steps a worker runs, by name: module-level functions returning True when they succeeded,
#: whose effects go through files.
STEPS = {"ort_optimize": _ort_optimize, "signal": _signal}


class _Worker:
    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.pid = os.getpid()  # the process that started `proc` (a forked child starts its own)
        self.lock = threading.Lock()

    def _start(self) -> subprocess.Popen:
        import dlcc

        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.abspath(dlcc.__file__)))
        env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        # cwd: `python -m` puts its working directory first on sys.path. The caller's could hold a
        # dlcc/ folder other than the one running (a source checkout beside a `pip install .`,
        # whose dlcc/ lacks the backends the wheel maps into it): the worker would import that,
        # fail, and every compile would lose onnxruntime's folding. Its steps take absolute paths.
        return subprocess.Popen([sys.executable, "-m", "dlcc.isolate"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, env=env, cwd=root, text=True, bufsize=1)

    def call(self, step: str, args: list, timeout: float) -> str:
        with self.lock:
            if self.pid != os.getpid():  # forked since: the worker's pipes are the parent's
                self.proc, self.pid = None, os.getpid()
            if self.proc is None or self.proc.poll() is not None:
                self.proc = self._start()
            p = self.proc
            try:
                p.stdin.write(json.dumps([step, args]) + "\n")
                p.stdin.flush()
                ready, _, _ = select.select([p.stdout], [], [], timeout)
                line = p.stdout.readline() if ready else None
            except (BrokenPipeError, OSError):
                line = ""
            if line is None:
                p.kill()
                p.wait()
                self.proc = None
                return f"timed out after {timeout:g} s"
            if not line:  # the worker died during the step
                code = p.wait()
                self.proc = None
                return f"crashed (signal {-code})" if code < 0 else f"exited with status {code}"
            return "ok" if line.strip() == "ok" else "failed"


    def close(self) -> None:
        """End the worker (at exit): its stdin closes, it finishes, and it is waited for."""
        p, self.proc = self.proc, None
        if p is None or self.pid != os.getpid():
            return
        try:
            p.stdin.close()
            p.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            p.kill()
            p.wait()
        p.stdout.close()


_WORKER = _Worker()
atexit.register(_WORKER.close)


def run(step: str, args: list, timeout: float) -> str:
    """Run STEPS[step](*args) in the worker. Returns "ok", "failed" (it returned False or raised),
    "crashed (signal N)" or "timed out after T s" (the worker is then killed and replaced)."""
    if os.environ.get("DLCC_ISOLATE", "1") == "0" or sys.platform == "win32":  # (select() on pipes is POSIX)
        try:
            return "ok" if STEPS[step](*args) else "failed"
        except Exception:  # noqa: BLE001
            return "failed"
    return _WORKER.call(step, args, timeout)


def _serve() -> None:
    for line in sys.stdin:
        try:
            step, args = json.loads(line)
            ok = bool(STEPS[step](*args))
        except Exception:  # noqa: BLE001 (any failure is the same answer: not done)
            ok = False
        sys.stdout.write("ok\n" if ok else "failed\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve()
