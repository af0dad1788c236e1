"""A small JSON database of measured kernel times, consulted before the cost model.

File format (UTF-8 JSON, written atomically: a temp file in the same folder, then os.replace):

    {
      "format": "dlcc-profiledb",
      "version": 1,
      "entries": [
        {"device": "NVIDIA H100 SXM",            # DeviceSpec.name the time was measured on
         "kernel": "Conv_32x32x16_2x2_9264f1161b",  # kernel identity (below)
         "grid": [2, 1, 1], "block": [256, 1, 1],   # launch shape, always 3 ints each
         "us": 3.21,                             # mean measured time per launch, µs
         "count": 20,                            # launches averaged into "us"
         "where": ["bench.py on h100-07"]}       # where it was measured (distinct notes, newest last)
      ]
    }

Key: (device, kernel, grid, block). `kernel` is the dlcc kernel name, which ends in a hash of the
kernel's source text (dlcc/kernels/program.py), so an entry never matches a changed kernel; for
kernels from a profiler trace it is the CUDA kernel name. A grid or block given as one int is
stored as [n, 1, 1]. Any malformed file raises ConfigError naming the file and the bad field.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from ..errors import ConfigError

FORMAT = "dlcc-profiledb"
VERSION = 1
_MAX_WHERE = 8


def _dim3(v, what: str) -> tuple[int, int, int]:
    if isinstance(v, bool):
        raise ValueError(f"{what}: expected an int or a list of 1-3 positive ints, got {v!r}")
    if isinstance(v, int):
        v = [v]
    if not isinstance(v, (list, tuple)) or not 1 <= len(v) <= 3 or \
            not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v):
        raise ValueError(f"{what}: expected an int or a list of 1-3 positive ints, got {v!r}")
    return tuple(list(v) + [1] * (3 - len(v)))  # type: ignore[return-value]


def _key(device: str, kernel: str, grid, block) -> tuple:
    return (device, kernel, _dim3(grid, "grid"), _dim3(block, "block"))


class ProfileDB:
    """Measured per-launch times keyed by (device name, kernel, grid, block)."""

    def __init__(self, name: str = "memory"):
        self.name = name  # the file's base name; shows in KernelTime.source as "profile:<name>"
        self._entries: dict[tuple, dict] = {}

    def __len__(self) -> int:
        return len(self._entries)

    # -- file I/O ----------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | os.PathLike, missing_ok: bool = False) -> ProfileDB:
        path = Path(path)
        db = cls(path.name)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            if missing_ok:
                return db
            raise ConfigError(f"{path}: profile database not found") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: cannot read profile database: {e}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}): {e.msg}") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ConfigError(f"{path}: not a dlcc profile database (expected a JSON object with "
                              f'"format": "{FORMAT}")')
        if data.get("version") != VERSION:
            raise ConfigError(f"{path}: version: unsupported profile database version "
                              f"{data.get('version')!r} (this dlcc reads version {VERSION})")
        entries = data.get("entries")
        if not isinstance(entries, list):
            raise ConfigError(f"{path}: entries: expected a list")
        for i, e in enumerate(entries):
            try:
                db._add_entry(e)
            except ValueError as err:
                raise ConfigError(f"{path}: entries.{i}.{err}") from None
        return db

    def _add_entry(self, e) -> None:
        if not isinstance(e, dict):
            raise ValueError(f"(entry): expected an object, got {type(e).__name__}")
        unknown = set(e) - {"device", "kernel", "grid", "block", "us", "count", "where"}
        if unknown:
            raise ValueError(f"{sorted(unknown)[0]}: unknown key")
        for f in ("device", "kernel"):
            if not isinstance(e.get(f), str) or not e.get(f):
                raise ValueError(f"{f}: expected a non-empty string")
        us = e.get("us")
        if isinstance(us, bool) or not isinstance(us, (int, float)) or not math.isfinite(us) or us < 0:
            raise ValueError(f"us: expected a non-negative number of microseconds, got {us!r}")
        count = e.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"count: expected a positive int, got {count!r}")
        where = e.get("where", [])
        if isinstance(where, str):
            where = [where]
        if not isinstance(where, list) or not all(isinstance(w, str) for w in where):
            raise ValueError("where: expected a list of strings")
        key = (e["device"], e["kernel"], _dim3(e.get("grid"), "grid"), _dim3(e.get("block"), "block"))
        if key in self._entries:
            raise ValueError("(entry): duplicate of an earlier entry with the same device, kernel, grid and block")
        self._entries[key] = {"us": float(us), "count": count, "where": list(where)}

    def save(self, path: str | os.PathLike) -> None:
        path = Path(path)
        from ..artifact import atomic_file

        data = {"format": FORMAT, "version": VERSION, "entries": self.entries()}
        with atomic_file(path) as f:
            json.dump(data, f, indent=1)
            f.write("\n")
        self.name = path.name

    # -- queries -----------------------------------------------------------------------------
    @staticmethod
    def kernel_id(launch: dict, kernel: dict | None = None) -> str:
        return str((kernel or {}).get("name") or launch.get("kernel") or "")

    def lookup(self, device_name: str, launch: dict, kernel: dict | None = None) -> float | None:
        """Measured µs for this launch on `device_name`, or None."""
        block = launch.get("block") or (kernel or {}).get("block")
        try:
            key = _key(device_name, self.kernel_id(launch, kernel), launch.get("grid"), block)
        except ValueError:
            return None
        hit = self._entries.get(key)
        return hit["us"] if hit else None

    def record(self, device_name: str, kernel: str, grid, block, us: float, count: int = 1,
               where: str = "") -> None:
        """Fold `count` launches averaging `us` µs into the entry (a running mean)."""
        if not (isinstance(us, (int, float)) and math.isfinite(us) and us >= 0):
            raise ValueError(f"us must be a non-negative number, got {us!r}")
        if count < 1:
            raise ValueError("count must be >= 1")
        key = _key(device_name, kernel, grid, block)
        e = self._entries.setdefault(key, {"us": 0.0, "count": 0, "where": []})
        total = e["count"] + count
        e["us"] = (e["us"] * e["count"] + float(us) * count) / total
        e["count"] = total
        if where:
            if where in e["where"]:
                e["where"].remove(where)
            e["where"] = (e["where"] + [where])[-_MAX_WHERE:]

    def entries(self) -> list[dict]:
        return [{"device": d, "kernel": k, "grid": list(g), "block": list(b), **v}
                for (d, k, g, b), v in sorted(self._entries.items())]
