"""Artifact directories, written atomically: a temp directory beside the target, renamed into place.

An interrupted or failed compile therefore never leaves a half-written artifact, and an existing
artifact is replaced only once the new one is complete.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import contextlib

from .backends.source import DIALECTS, file_name, render
from .errors import DlccError
from .plan_schema import check_arities, check_plan

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
    tmp = staging_dir(out)
    try:
        digests = {}
        for d in DIALECTS:
            text = render(kernel_codes, d).encode()
            (tmp / file_name(d)).write_bytes(text)
            digests[file_name(d)] = hashlib.sha256(text).hexdigest()
        if hasattr(weights, "write_to"):  # a plan.WeightsBlob: streamed from its arrays
            with open(tmp / "weights.bin", "wb") as f:
                weights.write_to(f)
        else:
            (tmp / "weights.bin").write_bytes(weights)
        for name, data in (binaries or {}).items():
            (tmp / name).write_bytes(data)
            digests[name] = hashlib.sha256(data).hexdigest()
        # The sha256 of each kernel file: a truncated or swapped kernels.cl is named as such when the
        # artifact is read, instead of failing in the OpenCL compiler or on a missing kernel. And
        # the plan's own (plan_digest), which the kernels' text fixes.
        body = json.loads(json.dumps({**plan, "file_sha256": digests}))
        (tmp / "plan.json").write_text(json.dumps({**body, "plan_sha256": plan_digest(body)}, indent=1))
        (tmp / "launcher.py").write_text(LAUNCHER)
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def staging_dir(out: Path) -> Path:
    """A fresh directory beside `out` to build it in (then replace_dir), its parents made first.
    A place that cannot hold it (a missing or read-only parent, /proc) is one error naming `out`,
    not the hidden staging name."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    except OSError as e:
        blocker = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
        why = f"{blocker} is not a directory" if blocker else e.strerror or str(e)
        raise DlccError(f"cannot write {out}: {why}") from None


def replace_dir(tmp: Path, out: Path) -> None:
    """Move the finished directory `tmp` to `out`, replacing an older artifact there; anything else
    at `out` is refused, never overwritten."""
    old = None
    if out.exists():
        if not ((out / "plan.json").is_file() or (out / "partition.json").is_file()):
            raise DlccError(f"{out} exists and is not a dlcc artifact; refusing to replace it")
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.replace(out, old / "a")
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


#: The keys of plan.json that plan_digest leaves out: the digests themselves.
_DIGEST_KEYS = ("file_sha256", "plan_sha256")


def plan_digest(plan: dict) -> str:
    """The sha256 of a plan as JSON (keys sorted), its digests left out. Each kernel's text is
    emitted for its launches, buffers and tensors (grids, blocks, offsets, shapes and dtypes are
    baked in: kernels/roperator.py), so a plan.json changed after the compile runs kernels out of
    bounds or reads outputs as the wrong type: a GEMM launched with one block more wrote past its
    output and corrupted the heap (found by scripts/hostile_corpus.py seed 39). The schema and
    arity checks name the changes that cannot be right; this refuses the rest."""
    body = {k: v for k, v in plan.items() if k not in _DIGEST_KEYS}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def read_binaries(path: str | os.PathLike, plan: dict) -> dict[str, bytes]:
    """The artifact's cubin, where it has one that matches the plan (a damaged one is left out:
    the runtime then builds from kernels.cu)."""
    cub = plan.get("cuda", {}).get("cubin")
    p = Path(path) / cub if isinstance(cub, str) and cub else None
    if p is None or not p.is_file():
        return {}
    data = p.read_bytes()
    want = (plan.get("file_sha256") or {}).get(cub)
    return {cub: data} if want is None or hashlib.sha256(data).hexdigest() == want else {}


def read_artifact(path: str | os.PathLike):
    """(plan, a function returning the weights' bytes, kernel sources by dialect)."""
    path = Path(path)
    if not (path / "plan.json").is_file():
        raise DlccError(f"{path}: not a dlcc artifact directory (no plan.json); create one with `dlcc compile`")
    try:
        raw = json.loads((path / "plan.json").read_bytes())  # bytes: JSON's own UTF-8/16/32 detection
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DlccError(f"{path}/plan.json is corrupt: {e}") from None
    plan = check_plan(raw, f"{path}/plan.json")
    digest = plan_digest(raw)  # as written, before the schema's coercions
    sources = {}
    for d in DIALECTS:
        f = path / file_name(d)
        if f.is_file():
            try:
                sources[d] = f.read_bytes().decode("utf-8")
            except UnicodeDecodeError as e:
                raise DlccError(f"{f} is not the UTF-8 text dlcc wrote ({e}); compile the model again") from None
    digests = plan.get("file_sha256") or {}
    if not isinstance(digests, dict):
        raise DlccError(f"{path}/plan.json: file_sha256 is not an object; compile the model again")
    for d, text in sources.items():
        want = digests.get(file_name(d))
        if want is not None and hashlib.sha256(text.encode()).hexdigest() != want:
            raise DlccError(f"{path / file_name(d)} is not the file this plan was compiled with (its sha256 "
                            "differs: truncated, edited or copied from another artifact); compile the model again")
    for text in sources.values():
        check_arities(plan, text, f"{path}/plan.json")
    if not sources or not (path / "weights.bin").is_file():
        raise DlccError(f"{path}: incomplete artifact (kernel sources or weights.bin missing); compile it again")
    wpath = path / "weights.bin"
    size = wpath.stat().st_size
    if size != plan["storages"]["weights"]:
        raise DlccError(f"{path}/weights.bin has {size} bytes, the plan expects {plan['storages']['weights']}")
    if raw.get("plan_sha256", digest) != digest:
        raise DlccError(f"{path}/plan.json is not the plan its kernels were compiled for (its sha256 differs: "
                        "edited or damaged after the compile); compile the model again")
    # The weights are read when first needed (a run), not to inspect or to hand out a cache hit.
    return plan, wpath.read_bytes, sources
