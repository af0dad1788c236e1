"""Temporary folders that a killed dlcc does not leave behind for ever.

A process killed with SIGKILL (the OOM killer, a CI job's timeout, `kill -9`) runs no cleanup, so
its temporary folders stay in the temporary directory. The import's folding folder holds a copy of
the model, hundreds of MB for a large one, and a machine that kills compiles now and then fills
its /tmp. Nothing in the killed process can prevent that, so the next dlcc process cleans up:

- every folder is named for the process that made it: `dlcc-<kind>-<pid>-<random>`;
- once per process (every `dlcc` command, `dlcc.compile`, and the first folder a process makes),
  dlcc removes the folders of that form whose process is gone, that belong to the same user, and
  that nobody has written to for `STALE_AFTER_S`.

The age is a guard against a process ID from another PID namespace (a container sharing /tmp)
looking dead from here: its folder is left alone while it is in use.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
import time

KINDS = ("fold", "partition", "partition-cache", "dynamic", "fuzz", "batch")
STALE_AFTER_S = 3600.0
_NAME = re.compile(r"^dlcc-(?:%s)-(\d+)-" % "|".join(re.escape(k) for k in sorted(KINDS, key=len, reverse=True)))
_swept: set[str] = set()


def mkdtemp(kind: str) -> str:
    """A new private temporary folder for `kind` (one of KINDS), named for this process."""
    assert kind in KINDS, kind
    root = sweep_once()
    return tempfile.mkdtemp(prefix=f"dlcc-{kind}-{os.getpid()}-", dir=root)


def sweep_once() -> str:
    """Sweep the temporary directory the first time a process asks (every `dlcc` command and
    `dlcc.compile` does, so a compile answered from the cache cleans up too); returns it."""
    root = tempfile.gettempdir()
    if root not in _swept:
        _swept.add(root)
        sweep(root)
    return root


def sweep(root: str | None = None, now: float | None = None) -> list[str]:
    """Remove the stale folders under `root` (the temporary directory by default); returns their
    paths. Never raises: a folder that cannot be read or removed is left where it is."""
    root = root or tempfile.gettempdir()
    now = time.time() if now is None else now
    removed = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        m = _NAME.match(entry.name)
        if not m:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if not entry.is_dir(follow_symlinks=False) or st.st_uid != os.getuid():
                continue
        except OSError:
            continue
        if now - st.st_mtime < STALE_AFTER_S or _alive(int(m.group(1))):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        if not os.path.exists(entry.path):
            removed.append(entry.path)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # another user's process, or a number we cannot ask about: not ours to judge
    return True
