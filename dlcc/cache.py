"""The compile cache: content-addressed artifacts, and nvcc cubins below them (Hidet-style).

Layout under the cache directory (default: $DLCC_CACHE_DIR, else $XDG_CACHE_HOME/dlcc, else
~/.cache/dlcc):

    artifacts/KEY/       one artifact directory (plan.json, weights.bin, kernels.*, ...) plus
                         entry.json: the key's parts and a sha256 per file, written last
    cubins/KEY/          kernels.cubin, kernels.cu (the source), nvcc.log, usage.json
    verified/KEY/        result.json: a passed `dlcc batch` verification of one artifact (below)
    memo/ID.json         file digests memoised by (path, size, mtime, inode)
    locks/KEY.lock       flock files: one compile per key at a time

**The key** is a sha256 over: the model's bytes and every external-data file it names, the shape
bindings, the pipeline spec and device spec *contents* (so editing a YAML misses), the resolved
target, the profile database's bytes, the dlcc version and a digest of dlcc's own source files
(a checkout that changed compiles afresh), and nvcc's version where the target is CUDA.

**Cheap hashing.** A 440 MB model costs about a second to sha256. The digest is memoised under
(absolute path, size, mtime_ns, inode); a file rewritten in place with the same size and an
unchanged mtime (`touch -d` to the old time) would be missed. That is the trade, and `--no-cache`
or `dlcc cache clear` is the way out.

**Safety.** An entry is built in a temp directory and published by one rename, with entry.json
(checksums) inside: an entry is either whole or absent, whatever kills the writer. Writers of one
key serialise on an flock, which the kernel releases when its holder dies, so a SIGKILLed compile
never wedges the next. A hit checks every file's size and sha256 (the sha256 memoised like the
model's) before use; a corrupt entry is removed and rebuilt. Hits are materialised by hard links
(read-only files; dlcc replaces files, it never writes into them), so a 440 MB artifact appears
in milliseconds; across file systems it is copied.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from functools import lru_cache
from pathlib import Path

from . import __version__

ENTRY = "entry.json"
#: The entry kinds (subdirectories holding entries).
KINDS = ("artifacts", "cubins", "verified")


def default_dir() -> Path:
    env = os.environ.get("DLCC_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dlcc"


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


@lru_cache(maxsize=1)
def source_digest() -> str:
    """sha256 over dlcc's own source (py, h, yaml), so that a changed checkout misses."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256(__version__.encode())
    roots = {root}
    for mod in ("passes", "backends", "configs"):  # installed as dlcc.passes etc.; in a checkout, beside dlcc/
        try:
            import importlib

            roots.add(Path(importlib.import_module(f"dlcc.{mod}").__file__).resolve().parent)
        except Exception:
            pass
    for r in sorted(roots):
        for p in sorted(r.rglob("*")):
            if p.suffix in (".py", ".h", ".yaml") and "__pycache__" not in p.parts:
                h.update(str(p.relative_to(r)).encode())
                h.update(p.read_bytes())
    return h.hexdigest()


class Cache:
    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root).expanduser() if root else default_dir()

    @classmethod
    def of(cls, cache) -> "Cache":
        """The `cache=` argument of dlcc.compile and dlcc batch: a Cache, a directory, or True."""
        return cache if isinstance(cache, Cache) else cls(None if cache is True else cache)

    # -- file digests, memoised ---------------------------------------------------------------------
    def file_digest(self, path: str | os.PathLike) -> str:
        return self._memo(path)["sha256"]

    def _memo(self, path: str | os.PathLike, onnx_model: bool = False, digest: str | None = None) -> dict:
        """{sha256, and for a model the external-data files it names}, memoised by stat. `digest`:
        a sha256 just computed for this file (an entry's files, at publish), memoised as it is."""
        p = Path(path).resolve()
        st = p.stat()
        memo = self._memo_path(p, onnx_model)
        stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
        if digest is None:
            try:
                m = json.loads(memo.read_text())
                if m["stamp"] == stamp:
                    return m
            except (OSError, ValueError, KeyError):
                pass
        m = {"path": str(p), "stamp": stamp, "sha256": digest or sha256_file(p)}
        if onnx_model:
            m["external"] = external_data_files(p)
        _write_json(memo, m)
        return m

    def _external_digest(self, folder: Path, name: str) -> str:
        """The digest of one external-data file; for a name that is no readable file (a NUL byte,
        a symlink loop, missing) a marker, so that the compile itself reports it (frontend's
        load_model) instead of the key failing first with a raw exception."""
        try:
            return self.file_digest(folder / name)
        except (OSError, RuntimeError, ValueError) as e:
            return f"unreadable: {type(e).__name__}"

    def _memo_path(self, p: Path, onnx_model: bool) -> Path:
        return self.root / "memo" / f"{hashlib.sha1(f'{p}|{onnx_model}'.encode()).hexdigest()}.json"

    # -- keys ------------------------------------------------------------------------------------------
    def artifact_key(self, model, shapes: dict, pipeline_spec: str, device_spec: str, target: str,
                     profile_db=None, nvcc_version: str | None = None) -> tuple[str, dict]:
        """(key, its parts). Every part that changes the artifact is in it (module docstring)."""
        model = Path(model)
        info = self._memo(model, onnx_model=True)
        parts = {
            "model": info["sha256"],
            "external_data": {name: self._external_digest(model.parent, name) for name in info["external"]},
            "shapes": {k: list(v) for k, v in sorted((shapes or {}).items())},
            "pipeline": hashlib.sha256(pipeline_spec.encode()).hexdigest(),
            "device": hashlib.sha256(device_spec.encode()).hexdigest(),
            "target": target,
            "profile_db": self.file_digest(profile_db) if profile_db else None,
            "dlcc": f"{__version__}+{source_digest()[:16]}",
            "nvcc": nvcc_version,
        }
        key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
        return key, parts

    def verified_key(self, artifact_key: str, spec: dict, target: str) -> tuple[str, dict]:
        """Key of a passed verification: the artifact's key, the tolerances and seed, and the
        versions of what computes both sides (onnxruntime, numpy, the target's Python runtime).
        The trade: the OpenCL/CUDA driver and the machine are not in it; a batch shared between
        machines with different drivers trusts one machine's pass. `--no-cache` re-verifies."""
        import importlib.metadata as md

        def version(pkg):
            try:
                return md.version(pkg)
            except md.PackageNotFoundError:
                return None

        parts = {"artifact": artifact_key, "verify": dict(sorted(spec.items())), "target": target,
                 "versions": {p: version(p) for p in ("onnxruntime", "numpy", "pyopencl" if target == "opencl" else "pycuda")}}
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest(), parts

    # -- artifacts -------------------------------------------------------------------------------------
    def entry_dir(self, kind: str, key: str) -> Path:
        return self.root / kind / key

    @contextlib.contextmanager
    def lock(self, key: str):
        """Exclusive per-key lock (flock: released by the kernel if the holder dies)."""
        d = self.root / "locks"
        d.mkdir(parents=True, exist_ok=True)
        with open(d / f"{key}.lock", "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def lookup(self, kind: str, key: str) -> Path | None:
        """The entry, if present and intact; a corrupt one is removed (and so rebuilt)."""
        d = self.entry_dir(kind, key)
        if not (d / ENTRY).is_file():
            return None
        problem = self.check(d)
        if problem is None:
            return d
        self.remove(d)
        return None

    def check(self, d: Path, full: bool = False) -> str | None:
        """None if entry `d` matches its checksums; else what is wrong. `full` re-hashes every file
        (no memo): what `dlcc cache verify` does."""
        try:
            entry = json.loads((d / ENTRY).read_text())
            files = entry["files"]
        except (OSError, ValueError, KeyError) as e:
            return f"unreadable {ENTRY}: {e}"
        for name, (size, digest) in files.items():
            p = d / name
            try:
                if p.stat().st_size != size:
                    return f"{name}: size {p.stat().st_size} != {size}"
                got = sha256_file(p) if full else self.file_digest(p)
            except OSError as e:
                return f"{name}: {e.strerror or e}"
            if got != digest:
                return f"{name}: checksum mismatch"
        return None

    def store(self, kind: str, key: str, parts: dict, write) -> Path:
        """Build entry `key` by `write(dir)` (`dir` does not exist yet: write creates it) in a temp
        directory beside the entries, add its checksums, and publish it by one rename."""
        final = self.entry_dir(kind, key)
        final.parent.mkdir(parents=True, exist_ok=True)
        _sweep(final.parent)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:16]}.tmp-", dir=final.parent))
        try:
            stage = tmp / "e"
            write(stage)
            files = {}
            for p in sorted(stage.rglob("*")):
                if p.is_file():
                    os.chmod(p, 0o444)
                    files[str(p.relative_to(stage))] = [p.stat().st_size, sha256_file(p)]
            _write_json(stage / ENTRY, {"key": key, "kind": kind, "parts": parts, "files": files,
                                        "created": time.time()})
            if final.exists():  # a racing writer of the same key won; its entry is as good
                return final
            os.replace(stage, final)
            for name, (_, digest) in files.items():  # a rename keeps size, mtime and inode: so
                self._memo(final / name, digest=digest)  # the next hit's checks need not re-hash
            return final
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def remove(self, d: Path) -> None:
        trash = d.with_name(f".{d.name}.trash-{os.getpid()}")
        with contextlib.suppress(OSError):
            os.replace(d, trash)
        _rmtree(trash)

    def entries(self, kind: str | None = None) -> list[dict]:
        rows = []
        for k in ([kind] if kind else KINDS):
            base = self.root / k
            if not base.is_dir():
                continue
            for d in sorted(base.iterdir()):
                if d.name.startswith(".") or not d.is_dir():
                    continue
                try:
                    e = json.loads((d / ENTRY).read_text())
                except (OSError, ValueError):
                    e = {"parts": {}, "created": None}
                size = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
                rows.append({"kind": k, "key": d.name, "path": str(d), "bytes": size, "created": e.get("created"),
                             "parts": e.get("parts", {})})
        return rows

    def clear(self) -> int:
        n = 0
        for k in (*KINDS, "memo", "locks"):
            d = self.root / k
            if d.is_dir():
                n += sum(1 for _ in d.iterdir()) if k in KINDS else 0
                _rmtree(d)
        return n


def materialise(entry: Path, out: Path) -> None:
    """Artifact entry -> directory `out` (replaced atomically): hard links where possible."""
    from .artifact import replace_dir, staging_dir

    out = Path(out)
    tmp = staging_dir(out)
    try:
        for p in entry.rglob("*"):
            if p.name == ENTRY or not p.is_file():
                continue
            dst = tmp / p.relative_to(entry)
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(p, dst)
            except OSError:
                shutil.copy2(p, dst)
        replace_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def external_data_files(model: Path) -> list[str]:
    """Relative paths of the external-data files an ONNX model names (the proto read without its
    external weights; Cache._memo keeps the answer with the model's digest)."""
    import onnx

    try:
        m = onnx.load(str(model), load_external_data=False)
    except Exception:
        return []  # the compile itself reports a malformed model
    names = set()
    for t in _all_tensors(m.graph):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            for kv in t.external_data:
                if kv.key == "location":
                    names.add(kv.value)
    return sorted(names)


def _all_tensors(g):
    yield from g.initializer
    for n in g.node:
        for a in n.attribute:
            if a.HasField("t"):
                yield a.t
            if a.HasField("g"):
                yield from _all_tensors(a.g)
            for sg in a.graphs:
                yield from _all_tensors(sg)


#: Temp directories of a killed writer are removed by the next publish once this old (no live
#: compile takes an hour between making its temp directory and renaming it).
STALE_S = 3600


def _sweep(parent: Path) -> None:
    now = time.time()
    for d in parent.glob(".*"):
        with contextlib.suppress(OSError):
            if d.is_dir() and now - d.stat().st_mtime > STALE_S:
                _rmtree(d)


def _write_json(path: Path, obj) -> None:
    from .artifact import atomic_file

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as f:
        json.dump(obj, f)


def _rmtree(d: Path) -> None:
    """rmtree that also removes read-only entries (cache files are 0444)."""
    def onerror(func, path, _exc):
        with contextlib.suppress(OSError):
            os.chmod(path, 0o755)
            func(path)
    if d.exists():
        shutil.rmtree(d, onerror=onerror)
