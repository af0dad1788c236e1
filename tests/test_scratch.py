"""Temporary folders of killed dlcc processes are swept up by the next one (dlcc/scratch.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlcc import scratch


def _dead_pid() -> int:
    """The ID of a process that has exited and been reaped."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _folder(root: Path, name: str, age_s: float) -> Path:
    d = root / name
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "in.onnx").write_bytes(b"x" * 1000)
    t = time.time() - age_s
    os.utime(d, (t, t))
    return d


def test_only_old_folders_of_dead_dlcc_processes_are_removed(tmp_path):
    dead, old = _dead_pid(), 2 * scratch.STALE_AFTER_S
    stale = [_folder(tmp_path, f"dlcc-{k}-{dead}-abc", old) for k in scratch.KINDS]
    kept = [
        _folder(tmp_path, f"dlcc-fold-{dead}-new", 10),  # dead, but written to a moment ago
        _folder(tmp_path, f"dlcc-fold-{os.getpid()}-mine", old),  # this process's own
        _folder(tmp_path, f"dlcc-fold-{os.getppid()}-parent", old),  # a live process's
        _folder(tmp_path, "dlcc-fold-abcdefgh", old),  # no process ID in the name
        _folder(tmp_path, f"other-fold-{dead}-abc", old),  # not dlcc's
        _folder(tmp_path, f"dlcc-unknown-{dead}-abc", old),  # not a kind dlcc makes
    ]
    (tmp_path / f"dlcc-fold-{dead}-file").write_text("a file, not a folder")
    removed = scratch.sweep(str(tmp_path))
    assert sorted(removed) == sorted(str(p) for p in stale)
    assert not any(p.exists() for p in stale)
    assert all(p.exists() for p in kept)
    assert (tmp_path / f"dlcc-fold-{dead}-file").exists()


def test_a_compile_killed_while_folding_is_swept_up_by_the_next_one(tmp_path):
    """SIGKILL while onnxruntime folds (its worker holds the model's copy): the folder stays, named
    for the dead process; once it is old enough, the next compile removes it."""
    model = Path(__file__).parent.parent / "examples" / "resnet-tiny.onnx"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp), DLCC_CACHE_DIR=str(tmp_path / "cache"))  # the first compile misses
    # Stop the compile right after the folding folder is made: the ORT worker is told to sleep first.
    code = ("import sys, time, dlcc.isolate as iso\n"
            "def slow(*a, **k):\n"
            "    print('folding', flush=True); time.sleep(600)\n"
            "iso.run = slow\n"
            "import dlcc\n"
            f"dlcc.compile({str(model)!r}, target='opencl')\n")
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "folding"
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    left = [d for d in tmp.iterdir() if d.name.startswith(f"dlcc-fold-{p.pid}-")]
    assert len(left) == 1 and (left[0] / "in.onnx").exists()
    t = time.time() - 2 * scratch.STALE_AFTER_S
    os.utime(left[0], (t, t))
    done = subprocess.run([sys.executable, "-m", "dlcc.cli", "compile", str(model), "-o", str(tmp_path / "out"), "-q"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert not left[0].exists()
    assert not [d for d in tmp.iterdir() if d.name.startswith("dlcc-")], list(tmp.iterdir())
    # A compile answered from the cache makes no temporary folder, and sweeps all the same.
    again = tmp / f"dlcc-fold-{p.pid}-again"
    again.mkdir()
    os.utime(again, (t, t))
    done = subprocess.run([sys.executable, "-m", "dlcc.cli", "compile", str(model), "-o", str(tmp_path / "out2"), "-q"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert not again.exists()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
