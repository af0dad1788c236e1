"""The compile cache (dlcc/cache.py): hits, a miss for every part of the key, concurrent writers,
SIGKILL in the middle of a compile, corrupt entries, the cubin cache and `dlcc cache`."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dlcc
from dlcc.cache import Cache
from dlcc.cli import main


def _model(path: Path, scale: float = 2.0, n: int = 256, external: bool = False) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", n])
    w = numpy_helper.from_array(np.full((n, n), scale / n, np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                          "g", [x], [y], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    path.parent.mkdir(parents=True, exist_ok=True)
    if external:
        onnx.save(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=path.stem + ".data",
                  size_threshold=0)
    else:
        onnx.save(m, str(path))
    return path


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_hit_materialises_the_same_artifact(tmp_path):
    c = Cache(tmp_path / "cache")
    m = _model(tmp_path / "m.onnx")
    a = dlcc.compile(m, out=tmp_path / "a", shapes={"b": 4}, target="opencl", cache=c)
    b = dlcc.compile(m, out=tmp_path / "b", shapes={"b": 4}, target="opencl", cache=c)
    assert (a.cache_hit, b.cache_hit) == (False, True) and a.cache_key == b.cache_key
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    x = np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32)
    np.testing.assert_allclose(b({"x": x})["y"], np.maximum(x @ np.full((256, 256), 2 / 256, np.float32), 0), rtol=1e-5)
    # The linked files are read-only: nothing writes into the cache through an artifact.
    assert not os.access(tmp_path / "b" / "plan.json", os.W_OK) or os.geteuid() == 0
    assert (tmp_path / "b" / "plan.json").stat().st_mode & 0o222 == 0
    assert len(c.entries("artifacts")) == 1


# -- every part of the key -------------------------------------------------------------------------
def _key(c: Cache, model, **over):
    args = dict(shapes={"b": (4,)}, pipeline_spec="pipe", device_spec="dev", target="opencl", profile_db=None,
                nvcc_version=None)
    args.update(over)
    return c.artifact_key(model, **args)[0]


@pytest.mark.parametrize("part", ["model", "external_data", "shapes", "pipeline", "device", "target",
                                  "profile_db", "dlcc_source", "nvcc"])
def test_each_part_of_the_key_misses(tmp_path, part, monkeypatch):
    c = Cache(tmp_path / "cache")
    ext = part == "external_data"
    m = _model(tmp_path / "m.onnx", external=ext)
    db = tmp_path / "db.json"
    db.write_text("{}")
    before = _key(c, m, profile_db=db if part == "profile_db" else None)
    assert _key(c, m, profile_db=db if part == "profile_db" else None) == before  # stable
    time.sleep(0.01)  # a new mtime even on coarse clocks
    over = {}
    if part == "model":
        _model(m, scale=3.0)
    elif part == "external_data":
        data = tmp_path / "m.data"
        b = bytearray(data.read_bytes())
        b[0] ^= 1
        data.write_bytes(bytes(b))
    elif part == "shapes":
        over["shapes"] = {"b": (8,)}
    elif part == "pipeline":
        over["pipeline_spec"] = "pipe2"
    elif part == "device":
        over["device_spec"] = "dev2"
    elif part == "target":
        over["target"] = "cuda"
    elif part == "profile_db":
        db.write_text('{"x": 1}')
        over["profile_db"] = db
    elif part == "dlcc_source":
        monkeypatch.setattr("dlcc.cache.source_digest", lambda: "0" * 64)
    elif part == "nvcc":
        over["nvcc_version"] = "Build cuda_99.0"
    if part != "profile_db":
        over.setdefault("profile_db", None)
    assert _key(c, m, **over) != before


def test_edited_pipeline_and_device_yaml_miss_end_to_end(tmp_path):
    c = Cache(tmp_path / "cache")
    m = _model(tmp_path / "m.onnx")
    pipe = tmp_path / "p.yaml"
    pipe.write_text("name: p\npasses:\n  - name: lower\n  - name: memplan\n")
    dev = tmp_path / "d.yaml"
    dev.write_text(Path(dlcc.config.resolve("devices", "pocl-cpu")).read_text())
    kw = dict(shapes={"b": 4}, target="opencl", pipeline=str(pipe), device=str(dev), cache=c)
    assert not dlcc.compile(m, out=tmp_path / "o", **kw).cache_hit
    assert dlcc.compile(m, out=tmp_path / "o", **kw).cache_hit
    pipe.write_text("name: p\npasses:\n  - name: lower\n  - name: memplan\n    options: {inplace: false}\n")
    assert not dlcc.compile(m, out=tmp_path / "o", **kw).cache_hit
    dev.write_text(dev.read_text().replace("launch_overhead_us: 20.0", "launch_overhead_us: 21.0"))
    assert not dlcc.compile(m, out=tmp_path / "o", **kw).cache_hit


# -- concurrency and kills -------------------------------------------------------------------------
_WORKER = """
import sys, dlcc
from dlcc.cache import Cache
m, out, cache = sys.argv[1:4]
cm = dlcc.compile(m, out=out, shapes={"b": 4}, target="opencl", pipeline="astitch", cache=Cache(cache))
print("hit" if cm.cache_hit else "miss")
"""


def test_concurrent_compiles_into_one_cache(tmp_path):
    models = [_model(tmp_path / "m0.onnx"), _model(tmp_path / "m1.onnx", scale=5.0)]
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(models[i % 2]), str(tmp_path / f"o{i}"),
                               str(tmp_path / "cache")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(8)]  # the figure: 8 processes, two models
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    words = [o[0].strip() for o in outs]
    assert words.count("miss") == 2 and words.count("hit") == 6  # one compile per key; the rest waited and hit
    for i in range(2, 8):
        assert _files(tmp_path / f"o{i}") == _files(tmp_path / f"o{i % 2}")
    assert _files(tmp_path / "o0") != _files(tmp_path / "o1")
    c = Cache(tmp_path / "cache")
    assert len(c.entries("artifacts")) == 2 and all(c.check(Path(e["path"]), full=True) is None
                                                    for e in c.entries())


_KILLABLE = """
import contextlib, pathlib, sys, time, dlcc
from dlcc.cache import Cache
from dlcc.progress import Steps
m, out, cache, pause_at = sys.argv[1:5]

class Pausing(Steps):  # stops inside step `pause_at` and says so, to be killed there
    @contextlib.contextmanager
    def step(self, label):
        with super().step(label):
            if label == pause_at:
                pathlib.Path(out + ".paused").touch()
                time.sleep(600)
            yield

cm = dlcc.compile(m, out=out, shapes={"b": 4}, target="opencl", cache=Cache(cache), steps=Pausing())
print("hit" if cm.cache_hit else "miss")
"""


@pytest.mark.parametrize("step", ["pass lower", "cache store", "link artifact"])
def test_sigkill_mid_compile_leaves_the_cache_consistent(tmp_path, step):
    """Killed while compiling (holding the key's lock), while publishing the entry, or while
    linking the artifact out: the next compile of the key is not wedged, and is right."""
    m = _model(tmp_path / "m.onnx")
    cache, out = tmp_path / "cache", tmp_path / "o"
    p = subprocess.Popen([sys.executable, "-c", _KILLABLE, str(m), str(out), str(cache), step],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while time.time() < deadline and p.poll() is None and not Path(f"{out}.paused").exists():
        time.sleep(0.01)
    assert Path(f"{out}.paused").exists(), p.communicate()[1][-2000:]
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert not out.exists()  # no half-written artifact
    q = subprocess.run([sys.executable, "-c", _KILLABLE, str(m), str(out), str(cache), "-"],
                       capture_output=True, text=True, timeout=300)
    assert q.returncode == 0, q.stderr[-2000:]  # the dead holder's lock did not wedge it
    assert q.stdout.strip() == ("hit" if step == "link artifact" else "miss")
    assert (out / "plan.json").is_file()
    c = Cache(cache)
    assert len(c.entries("artifacts")) == 1 and c.check(Path(c.entries()[0]["path"]), full=True) is None
    fresh = dlcc.compile(m, shapes={"b": 4}, target="opencl")
    assert (out / "weights.bin").read_bytes() == fresh.weights


def test_corrupt_entry_is_detected_and_rebuilt(tmp_path):
    c = Cache(tmp_path / "cache")
    m = _model(tmp_path / "m.onnx")
    dlcc.compile(m, out=tmp_path / "a", shapes={"b": 4}, target="opencl", cache=c)
    (entry,) = c.entries("artifacts")
    w = Path(entry["path"]) / "weights.bin"
    os.chmod(w, 0o644)
    time.sleep(0.01)
    data = bytearray(w.read_bytes())
    data[100] ^= 0xFF
    w.write_bytes(bytes(data))
    assert "checksum" in (c.check(Path(entry["path"]), full=True) or "")
    with pytest.raises(SystemExit) as e:
        main(["cache", "verify", "--cache", str(c.root)])
    assert e.value.code == 1
    b = dlcc.compile(m, out=tmp_path / "b", shapes={"b": 4}, target="opencl", cache=c)
    assert not b.cache_hit  # never used: removed and rebuilt
    # (Artifact a shares its files with the entry through hard links, so it saw the damage too.)
    fresh = dlcc.compile(m, shapes={"b": 4}, target="opencl")
    assert _files(tmp_path / "b")["weights.bin"] == fresh.weights
    assert c.check(Path(c.entries("artifacts")[0]["path"]), full=True) is None


@pytest.mark.skipif(__import__("dlcc.backends.nvcc", fromlist=["find_nvcc"]).find_nvcc() is None,
                    reason="nvcc is not installed on this machine")
def test_cubins_are_cached_below_the_artifacts(tmp_path):
    c = Cache(tmp_path / "cache")
    m = _model(tmp_path / "m.onnx")
    a = dlcc.compile(m, out=tmp_path / "a", shapes={"b": 4}, target="cuda", device="h100", cache=c)
    (cub,) = c.entries("cubins")
    d = Path(cub["path"])
    assert (d / "kernels.cubin").stat().st_size > 0 and "ptxas" in (d / "nvcc.log").read_text()
    assert (d / "kernels.cu").read_text() == (tmp_path / "a" / "kernels.cu").read_text()
    assert a.plan["cuda"]["cubin"] and (tmp_path / "a" / a.plan["cuda"]["cubin"]).read_bytes() == \
        (d / "kernels.cubin").read_bytes()
    # Another model with the same kernels (only the weights differ) reuses the cubin.
    dlcc.compile(_model(tmp_path / "m2.onnx", scale=7.0), out=tmp_path / "b", shapes={"b": 4}, target="cuda",
                 device="h100", cache=c)
    assert len(c.entries("cubins")) == 1 and len(c.entries("artifacts")) == 2


def test_cache_commands(tmp_path, capsys):
    c = Cache(tmp_path / "cache")
    dlcc.compile(_model(tmp_path / "m.onnx"), out=tmp_path / "a", shapes={"b": 4}, target="opencl", cache=c)
    main(["cache", "stats", "--cache", str(c.root), "--json"])
    assert json.loads(capsys.readouterr().out)["artifacts"]["entries"] == 1
    main(["cache", "ls", "--cache", str(c.root), "--json"])
    (row,) = json.loads(capsys.readouterr().out)
    assert row["parts"]["target"] == "opencl"
    with pytest.raises(SystemExit) as e:
        main(["cache", "verify", "--cache", str(c.root)])
    assert e.value.code == 0
    main(["cache", "clear", "--cache", str(c.root)])
    assert "removed 1 entry" in capsys.readouterr().out and c.entries() == []
    args = ["compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "c"), "-s", "b=4", "-t", "opencl", "--json"]
    hits = []
    for extra in (["--cache", str(c.root)], ["--cache", str(c.root)], ["--no-cache"]):
        main(args + extra)  # `dlcc compile` uses the cache; --no-cache skips it
        hits.append(json.loads(capsys.readouterr().out)["cache_hit"])
    assert hits == [False, True, None]
