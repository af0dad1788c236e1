"""Measured selection: `dlcc compile --tune` picks the pipeline by timing it on the device.

`--pipeline auto` trusts the estimator, whose constants were fitted on other kernels than dlcc's;
where its ranking is wrong, a user pays for it on every inference. TensorRT's builder and TVM's
tuning records answer that by measuring: `--tune` compiles the estimator's top candidates
(`--tune-top`, default 3), runs each on the target device (a warm-up, then the median of
`--tune-repeat` timed inferences on the model's sample inputs), and keeps the fastest.

The times go into a tuning record in the compile cache (`CACHE/tuning/KEY.json`), keyed like an
artifact (model, shapes, target, device spec, precision, dlcc's source) plus the device that
measured and the candidates, so a second compile of the same thing measures nothing. A record is
written once every candidate is measured, atomically (a temporary file renamed over it): an
interrupted tuning leaves no record, never half of one. A record that does not parse, or whose
key is not its file's, is ignored with a warning and measured again.
"""
from __future__ import annotations

import hashlib
import json
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

from .errors import DlccError

SCHEMA = 1


class TuningError(DlccError):
    """--tune cannot measure here (no device to run on, nothing to choose among)."""


def _record_path(cache, key: str) -> Path:
    return cache.root / "tuning" / f"{key}.json"


def load_record(cache, key: str) -> dict | None:
    """The tuning record for `key`, or None (absent; or corrupt or foreign, with a warning)."""
    path = _record_path(cache, key)
    if not path.is_file():
        return None
    try:
        rec = json.loads(path.read_text())
        times = rec["times_us"]
        ok = (rec.get("schema") == SCHEMA and rec.get("key") == key and isinstance(times, dict) and times
              and all(isinstance(v, (int, float)) and v > 0 for v in times.values()) and rec.get("chosen") in times)
    except (OSError, ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        warnings.warn(f"dlcc: ignoring the tuning record {path} (corrupt, or not this compile's): measuring again",
                      RuntimeWarning, stacklevel=3)
        return None
    return rec


def save_record(cache, key: str, rec: dict) -> Path:
    """Write `rec` for `key` atomically: a reader sees the old record or the whole new one."""
    path = _record_path(cache, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tuning-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(rec, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def time_inference(cm, repeat: int) -> float:
    """µs per inference of compiled model `cm` on its target: one warm-up run (kernel builds,
    the CUDA graph's capture), then the median wall time of `repeat` runs on its sample inputs."""
    ex = cm.executor()
    feeds = cm.sample_inputs(0)
    ex.run(feeds)
    samples = []
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        ex.run(feeds)
        samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def tune(model, shapes: dict, tgt: str, device, precision, top: int, repeat: int, cache, steps=None) -> dict:
    """The pipeline choice by measurement: {"chosen", "why", "device", "tuned": True, "times_us",
    "measured"} (measured: False when the record in the cache answered)."""
    from .api import _compile, cache_key
    from .cache import Cache
    from .devices import resolve_device
    from .estimate.plan_mode import choose_pipeline
    from .executor import make_runtime
    from .progress import Steps

    steps = steps or Steps()
    if top < 1:
        raise TuningError(f"--tune-top {top}: measure at least one candidate")
    try:
        rt = make_runtime(tgt)
    except DlccError as e:
        raise TuningError(f"--tune measures on the device, and the {tgt} target cannot run here: {e}") from None
    dev = resolve_device(device, tgt)[0]
    _, est = choose_pipeline(model, shapes, dev, steps=steps, precision=precision)
    candidates = [p.name.split("@")[0] for p in est.pipelines][:top]
    c = Cache.of(cache if cache else True)
    _, base_key, parts = cache_key(model, shapes, tgt, "auto", device, None, c, precision)
    key = hashlib.sha256(json.dumps({"artifact": base_key, "measured_on": rt.device_name,
                                     "candidates": candidates, "repeat": repeat}, sort_keys=True).encode()).hexdigest()
    rec = load_record(c, key)
    measured = rec is None
    if rec is None:
        times = {}
        for name in candidates:
            with steps.step(f"tune: compile + time {name} on {rt.device_name}"):
                cm = _compile(model, shapes, tgt, name, device, None, None, precision=precision)
                times[name] = time_inference(cm, repeat)
                del cm
        chosen = min(times, key=lambda n: (times[n], candidates.index(n)))
        rec = {"schema": SCHEMA, "key": key, "candidates": candidates, "times_us": times, "chosen": chosen,
               "measured_on": rt.device_name, "model_sha256": parts["model"], "precision": precision,
               "device": dev.name, "shapes": parts["shapes"],
               "predicted_us": {p.name.split("@")[0]: p.predicted_us for p in est.pipelines}}
        save_record(c, key, rec)
    times = rec["times_us"]
    chosen = rec["chosen"]
    rest = sorted((t, n) for n, t in times.items() if n != chosen)
    why = (f"measured {times[chosen]:.1f} µs on {rec['measured_on']}"
           + (f", {rest[0][0] / times[chosen]:.2f}x faster than the next, {rest[0][1]} ({rest[0][0]:.1f} µs)"
              if rest else "") + ("" if measured else "; from the tuning record"))
    return {"chosen": chosen, "why": why, "device": est.device, "tuned": True, "measured": measured,
            "times_us": times, "candidates": rec["candidates"],
            "ranking": [{"name": p.name, "predicted_ms": p.predicted_us / 1e3} for p in est.pipelines]}


def measured_times(model, device_name: str, precision: str | None, cache=None) -> dict[str, float]:
    """Pipeline -> µs measured by `--tune` for `model` (any shapes bound as in the record) planned
    for device spec `device_name` at `precision`, from the tuning records of the default cache
    (or `cache`): what `dlcc estimate` shows beside its predictions. Unreadable records are
    skipped silently here (the compile that owns them warns)."""
    from .cache import Cache

    c = Cache.of(cache if cache else True)
    d = c.root / "tuning"
    if not d.is_dir():
        return {}
    try:
        sha = c.file_digest(model)
    except OSError:
        return {}
    out: dict[str, float] = {}
    for f in sorted(d.glob("*.json")):
        try:
            rec = json.loads(f.read_text())
            if (rec.get("schema") == SCHEMA and rec.get("model_sha256") == sha and rec.get("device") == device_name
                    and rec.get("precision") == precision):
                out.update({k: float(v) for k, v in rec["times_us"].items()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return out
