"""Artifact directories, written atomically: a temp directory beside the target, renamed into place.

An interrupted or failed compile therefore never leaves a half-written artifact, and an existing
artifact is replaced only once the new one is complete.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import contextlib

from .backends.source import DIALECTS, file_name, render
from .errors import DlccError
from .plan_schema import check_plan

@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w"):
    """Open a temp file beside `path` for writing; it replaces `path` only if the block succeeds,
    so a reader never sees half a file and a failure keeps the old one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent or "."))
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


LAUNCHER = '''#!/usr/bin/env python3
"""Run this compiled dlcc artifact: python launcher.py [--inputs in.npz] [--outputs out.npz] [--target auto]"""
import argparse, os, sys
import numpy as np
import dlcc

p = argparse.ArgumentParser(description=__doc__)
p.add_argument("--inputs"); p.add_argument("--outputs"); p.add_argument("--target", default="auto")
a = p.parse_args()
model = dlcc.load(os.path.dirname(os.path.abspath(__file__)), target=a.target)
inputs = dict(np.load(a.inputs)) if a.inputs else model.sample_inputs()
outs = model(inputs)
if a.outputs:
    np.savez(a.outputs, **outs)
for k, v in outs.items():
    print(k, v.shape, v.dtype)
'''


def write_artifact(out_dir: str | os.PathLike, plan: dict, weights: bytes, kernel_codes: list[str],
                   binaries: dict[str, bytes] | None = None) -> Path:
    out = Path(out_dir).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        for d in DIALECTS:
            (tmp / file_name(d)).write_text(render(kernel_codes, d))
        if hasattr(weights, "write_to"):  # a plan.WeightsBlob: streamed from its arrays
            with open(tmp / "weights.bin", "wb") as f:
                weights.write_to(f)
        else:
            (tmp / "weights.bin").write_bytes(weights)
        (tmp / "plan.json").write_text(json.dumps(plan, indent=1))
        (tmp / "launcher.py").write_text(LAUNCHER)
        for name, data in (binaries or {}).items():
            (tmp / name).write_bytes(data)
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def replace_dir(tmp: Path, out: Path) -> None:
    """Move the finished directory `tmp` to `out`, replacing an older artifact there; anything else
    at `out` is refused, never overwritten."""
    old = None
    if out.exists():
        if not (out / "plan.json").is_file():
            raise DlccError(f"{out} exists and is not a dlcc artifact; refusing to replace it")
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.replace(out, old / "a")
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def read_binaries(path: str | os.PathLike, plan: dict) -> dict[str, bytes]:
    cub = plan.get("cuda", {}).get("cubin")
    p = Path(path) / cub if cub else None
    return {cub: p.read_bytes()} if p is not None and p.is_file() else {}


def read_artifact(path: str | os.PathLike):
    """(plan, a function returning the weights' bytes, kernel sources by dialect)."""
    path = Path(path)
    if not (path / "plan.json").is_file():
        raise DlccError(f"{path}: not a dlcc artifact directory (no plan.json); create one with `dlcc compile`")
    try:
        plan = json.loads((path / "plan.json").read_bytes())  # bytes: JSON's own UTF-8/16/32 detection
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DlccError(f"{path}/plan.json is corrupt: {e}") from None
    plan = check_plan(plan, f"{path}/plan.json")
    sources = {}
    for d in DIALECTS:
        f = path / file_name(d)
        if f.is_file():
            try:
                sources[d] = f.read_bytes().decode("utf-8")
            except UnicodeDecodeError as e:
                raise DlccError(f"{f} is not the UTF-8 text dlcc wrote ({e}); compile the model again") from None
    if not sources or not (path / "weights.bin").is_file():
        raise DlccError(f"{path}: incomplete artifact (kernel sources or weights.bin missing); compile it again")
    wpath = path / "weights.bin"
    size = wpath.stat().st_size
    if size != plan["storages"]["weights"]:
        raise DlccError(f"{path}/weights.bin has {size} bytes, the plan expects {plan['storages']['weights']}")
    # The weights are read when first needed (a run), not to inspect or to hand out a cache hit.
    return plan, wpath.read_bytes, sources
