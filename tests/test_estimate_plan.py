"""Plan mode of `dlcc estimate`: plan task graphs, pipeline ranking, plan what-ifs, --pipeline auto,
and the profile database path (`dlcc profile` → `dlcc estimate --profile-db`)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import dlcc
from dlcc.cli import main
from dlcc.config import load_device
from dlcc.errors import ConfigError, DlccError
from dlcc.estimate.graph import Dep
from dlcc.estimate.plan_graph import SYNC_US, plan_graph
from dlcc.estimate.plan_mode import estimate_plan
from dlcc.estimate.profiledb import ProfileDB
from dlcc.estimate.whatif import WHATIFS

from conftest import device_with, opencl_device_available

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "examples" / "resnet-tiny.onnx"


def run_cli(capsys, *argv):
    code = 0
    try:
        main(list(argv))
    except SystemExit as e:
        code = e.code or 0
    cap = capsys.readouterr()
    return code, cap.out, cap.err


@pytest.fixture(scope="module")
def plan():
    return dlcc.compile(MODEL, target="opencl", device="h100").plan


def fake_db(plan, device_name, us_of) -> ProfileDB:
    db = ProfileDB("fake.json")
    for k, L in enumerate(plan["launches"]):
        db.record(device_name, L["kernel"], L["grid"], L["block"], us_of(k, L))
    return db


def test_graph_shape_and_sources(plan):
    dev = load_device("h100")
    g = plan_graph(plan, dev)
    ks = g.select(kind="kernel")
    assert len(ks) == len(plan["launches"])
    assert len(g.select(kind="launch")) == len(plan["launches"])
    # the H100 spec is calibrated on dlcc's GEMMs (gemm_cycle_us): GEMM launches come from their tiling
    gemm = {i for i, L in enumerate(plan["launches"]) if L.get("gemm")}
    assert gemm and {t.args["source"] for t in ks if t.args["index"] in gemm} == {"roofline + GEMM tiling model"}
    assert {t.args["source"] for t in ks if t.args["index"] not in gemm} == {"roofline"}
    # every data edge points at an earlier launch that writes a tensor this one reads
    for t in ks:
        for d in t.deps:
            if d.kind == "data":
                assert d.task.args["index"] < t.args["index"]


def test_latency_exact_when_gpu_bound(plan, tmp_path):
    """No launch cost: the GPU runs kernels back to back, so latency = sum of kernel times + sync."""
    dev = load_device(device_with(tmp_path, launch_overhead_us=0.0))
    db = fake_db(plan, dev.name, lambda k, L: 10.0 + k)
    g = plan_graph(plan, dev, db)
    # launches that share (kernel, grid, block) share one database entry: the mean of theirs
    expect = sum(db.lookup(dev.name, L, None) for L in plan["launches"]) + SYNC_US
    assert g.simulate() == pytest.approx(expect)
    assert {t.args["source"] for t in g.select(kind="kernel")} == {"profile:fake.json"}


def test_the_kernel_gap_is_paid_per_launch(plan, tmp_path):
    """kernel_gap_us (PoCL's dispatch between two commands, which profiling events do not see):
    GPU-bound, every kernel pays it on the stream, so the latency grows by n x the gap."""
    db_of = lambda dev: fake_db(plan, dev.name, lambda k, L: 10.0 + k)  # noqa: E731
    base = load_device(device_with(tmp_path, launch_overhead_us=0.0))
    gap = load_device(device_with(tmp_path, launch_overhead_us=0.0, kernel_gap_us=7.0))
    n = len(plan["launches"])
    assert plan_graph(plan, gap, db_of(gap)).simulate() == pytest.approx(
        plan_graph(plan, base, db_of(base)).simulate() + 7.0 * n)


def test_latency_exact_when_launch_bound(plan, tmp_path):
    """Launches cost 100 µs, kernels 1 µs: kernel by kernel, latency = n launches + the last
    kernel + the sync; replayed as a CUDA graph (`meta.graphs`), one launch + n kernels + the sync."""
    dev = load_device(device_with(tmp_path, launch_overhead_us=100.0))
    db = fake_db(plan, dev.name, lambda k, L: 1.0)
    n = len(plan["launches"])
    assert n > 2
    plain = {**plan, "meta": {**plan.get("meta", {}), "graphs": False}}
    assert plan_graph(plain, dev, db).simulate() == pytest.approx(n * 100.0 + 1.0 + SYNC_US)
    graphed = {**plan, "meta": {**plan.get("meta", {}), "graphs": True}}
    assert plan_graph(graphed, dev, db).simulate() == pytest.approx(100.0 + n * 1.0 + SYNC_US)


def test_predicted_latency_equals_timeline_span(tmp_path, capsys):
    tl = tmp_path / "plan-timeline.json"
    code, out, err = run_cli(capsys, "estimate", str(MODEL), "--device", "h100", "--timeline", str(tl), "--json")
    assert code == 0, err
    d = json.loads(out)
    doc = json.loads(tl.read_text())
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    for p in d["pipelines"]:
        pid = next(k for k, v in names.items() if v == f"pipeline {p['name']}")
        xs = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == pid]
        span = max(e["ts"] + e["dur"] for e in xs) - min(e["ts"] for e in xs)
        assert span / 1e3 == pytest.approx(p["predicted_ms"], rel=1e-6, abs=1e-6)
    for w in d["what_ifs"]:
        pid = next(k for k, v in names.items() if v.startswith(f"what-if {w['name']} "))
        xs = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == pid]
        span = max(e["ts"] + e["dur"] for e in xs) - min(e["ts"] for e in xs)
        assert span / 1e3 == pytest.approx(w["predicted_ms"], rel=1e-6, abs=1e-6)


def test_ranking_is_deterministic_and_sorted(capsys):
    a = estimate_plan(MODEL, device="h100").to_dict()
    b = estimate_plan(MODEL, device="h100").to_dict()
    assert [p["name"] for p in a["pipelines"]] == [p["name"] for p in b["pipelines"]]
    assert [p["predicted_ms"] for p in a["pipelines"]] == [p["predicted_ms"] for p in b["pipelines"]]
    keys = [(p["predicted_ms"], p["name"]) for p in a["pipelines"]]
    assert keys == sorted(keys)
    assert {p["name"] for p in a["pipelines"]} >= {"baseline", "large-tiles"}
    for p in a["pipelines"]:
        assert set(p) >= {"name", "predicted_ms", "launches", "dram_bytes", "lower_bound_ms"}
        assert 0 < p["lower_bound_ms"] <= p["predicted_ms"]
    assert a["best"] == a["pipelines"][0]["name"]


def test_plan_what_ifs_fewer_launches_and_keep_data_order():
    # on the baseline plan: an astitch plan has already merged what the stitch what-if would merge
    est = estimate_plan(MODEL, device="h100", pipelines=["baseline"])
    base = est.best
    for name, g, t, _ in est.what_ifs:
        ks = g.select(kind="kernel")
        assert len(ks) < base.launches, name
        assert t <= base.predicted_us + 1e-9, name
        for k in ks:  # a kernel never starts before the kernels whose outputs it reads have ended
            for d in k.deps:
                if d.kind == "data":
                    assert k.start >= d.task.end - 1e-9, (name, k.name, d.task.name)


def test_co_schedule_merges_independent_kernels(tmp_path):
    """Two independent kernels in one wave become one launch; a dependent one stays after them."""
    from dlcc.estimate.graph import Iteration, Task, TaskGraph

    dev = load_device("h100")
    g = TaskGraph(meta={"device_spec": dev, "plan": {"tensors": {}, "outputs": []}})
    begin = g.add(Task("begin", "marker", "cpu:host", 0.0))
    ks = []
    for i, (reads, writes) in enumerate([([], ["a"]), ([], ["b"]), (["a", "b"], ["c"])]):
        L = g.add(Task(f"launch {i}", "launch", "cpu:host", 1.0))
        k = Task(f"k{i}", "kernel", "gpu0:stream 0", 10.0, args={"index": i, "flops": 0, "dram_bytes": 1000,
                 "category": "elementwise", "grid": 1, "block": 128, "reads": reads, "writes": writes})
        k.deps.append(Dep(L, "launch"))
        L.args["launches"] = [k]
        ks.append(k)
    ks[2].deps += [Dep(ks[0], "data"), Dep(ks[1], "data")]
    for k in ks:
        g.add(k)
    end = g.add(Task("end", "marker", "cpu:host", 0.0))
    g.iterations.append(Iteration("inference", 0, begin, end))
    WHATIFS["co-schedule"].fn(g)
    g.simulate()
    left = g.select(kind="kernel")
    assert [t.name for t in left][1] == "k2" and len(left) == 2
    assert len(g.select(kind="launch")) == 2
    assert left[1].start >= left[0].end


def test_compile_pipeline_auto_records_choice(tmp_path, capsys):
    code, out, err = run_cli(capsys, "compile", str(MODEL), "-o", str(tmp_path / "m.dlcc"), "--pipeline", "auto",
                             "--target", "opencl", "--device", "h100", "--json")
    assert code == 0, err
    d = json.loads(out)
    choice = d["pipeline_choice"]
    best = estimate_plan(MODEL, device="h100").best.name
    assert choice["chosen"] == best
    assert json.loads((tmp_path / "m.dlcc" / "plan.json").read_text())["meta"]["pipeline"] == best
    assert best in choice["why"] or "predicted" in choice["why"]
    assert [r["name"] for r in choice["ranking"]][0] == best


def test_profile_then_estimate_uses_measurements(tmp_path, capsys):
    if not opencl_device_available():
        pytest.skip("no OpenCL device here")
    db = tmp_path / "prof.json"
    code, out, err = run_cli(capsys, "profile", str(MODEL), "--db", str(db), "--target", "opencl", "--repeat", "2", "--json")
    assert code == 0, err
    prof = json.loads(out)
    keys = {(L["kernel"], L["grid"], L["block"]) for L in prof["launches"]}
    entries = json.loads(db.read_text())["entries"]
    assert len(entries) == len(keys)
    # keyed by the plan's spec; the note names the device that measured (PoCL's CPU here)
    assert {e["device"] for e in entries} == {prof["device"]} and prof["measured_on"]
    assert all(prof["measured_on"] in e["where"][-1] for e in entries)
    code, out, err = run_cli(capsys, "estimate", str(MODEL), "--device", "pocl-cpu", "--profile-db", str(db),
                             "-p", "baseline", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["time_sources"] == ["profile:prof.json"]


@pytest.mark.parametrize("argv, needle", [
    (["estimate", str(MODEL), "-p", "nope"], "unknown pipeline 'nope'"),
    (["estimate", str(MODEL), "--device", "nope"], "unknown device 'nope'"),
    (["estimate"], "give either an ONNX MODEL"),
    (["estimate", str(MODEL), "--trace", "x.json"], "not both"),
    (["estimate", "missing.onnx"], "missing.onnx"),
])
def test_plan_mode_bad_input(capsys, argv, needle):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert needle in err.replace("\n", " ")


def test_bad_profile_db_names_the_file(tmp_path, capsys):
    bad = tmp_path / "db.json"
    bad.write_text("{not json")
    code, out, err = run_cli(capsys, "estimate", str(MODEL), "--profile-db", str(bad))
    assert code == 2 and "db.json" in err


def test_plan_what_if_on_a_trace_is_refused():
    from dlcc.estimate.graph import TaskGraph

    with pytest.raises(DlccError, match="dlcc plans"):
        WHATIFS["co-schedule"].fn(TaskGraph())


def test_example_what_if_file_in_plan_mode(capsys):
    """examples/my_whatif.py (the example in docs/estimate.md) loads, and its parameters work in plan mode."""
    code, out, err = run_cli(capsys, "estimate", str(MODEL), "-p", "baseline", "--what-if-file",
                             str(ROOT / "examples" / "my_whatif.py"), "-w", "fast-attention:pattern=Conv,factor=2", "--json")
    assert code == 0, err
    d = json.loads(out)
    w = {x["name"]: x for x in d["what_ifs"]}
    assert "fast-attention:pattern=Conv,factor=2" in w
    assert w["fast-attention:pattern=Conv,factor=2"]["predicted_ms"] < d["pipelines"][0]["predicted_ms"]


def test_list_what_ifs(capsys):
    code, out, err = run_cli(capsys, "list", "what-ifs", "--json")
    assert code == 0, err
    names = {r["what-if"].split(":")[0].split("=")[0] for r in json.loads(out)}
    assert names >= {"amp", "scale", "gpu-speed", "no-launch-overhead", "dataloader", "fused-optimizer",
                     "fuse-elementwise", "ddp", "stitch-memory-bound", "co-schedule"}


def _script(name, *args):
    import subprocess
    import sys

    return subprocess.run([sys.executable, str(ROOT / "scripts" / name), *args], capture_output=True, text=True,
                          timeout=300)


def test_estimate_accuracy_script_on_the_kept_traces():
    """scripts/estimate_accuracy.py runs, and its targets hold on the two V100 traces in the repo."""
    r = _script("estimate_accuracy.py", "--traces", str(ROOT / "tests" / "data" / "traces"), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["ok"] and len(d["loads"]) == 2 and len(d["dataloader"]) == 1
    assert abs(d["dataloader"][0]["dataloader"]["error_pct"]) <= 8.0


def test_plan_accuracy_script_smoke():
    if not opencl_device_available():
        pytest.skip("no OpenCL device here")
    r = _script("plan_accuracy.py", "--models", "resnet-tiny", "--repeat", "2", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    (row,) = d["rows"]
    assert row["launches"] == 16 and row["measured_us"] > 0 and row["predicted_profile_us"] > 0


def test_a_device_spec_brings_its_profile_database(tmp_path, capsys):
    """A device YAML's `profile_db:` (a file beside it) is what rammer, `dlcc estimate` and
    `--pipeline auto` use where no --profile-db is given: the estimate's times come from it, the
    plan records it, a changed database changes the compile's cache key, a --profile-db replaces
    it, and a file that is not there is one error naming the field."""
    if not opencl_device_available():
        pytest.skip("no OpenCL device here")
    import yaml

    from dlcc.api import cache_key
    from dlcc.config import load_device
    from dlcc.errors import ConfigError

    spec = load_device("pocl-cpu").model_dump(exclude_none=True)
    dev = tmp_path / "cpu.yaml"
    dev.write_text(yaml.safe_dump({**spec, "profile_db": "cpu.profile.json"}))
    with pytest.raises(ConfigError, match="cpu.yaml: profile_db: 'cpu.profile.json' is not a file"):
        load_device(str(dev))
    db = tmp_path / "cpu.profile.json"
    code, out, err = run_cli(capsys, "profile", str(MODEL), "--db", str(db), "--target", "opencl", "--device", "pocl-cpu",
                             "--repeat", "2", "--json")
    assert code == 0, err
    code, out, err = run_cli(capsys, "estimate", str(MODEL), "--device", str(dev), "-p", "baseline", "--json")
    assert code == 0, err
    assert json.loads(out)["time_sources"] == ["profile:cpu.profile.json"]
    cm = dlcc.compile(MODEL, target="opencl", device=str(dev), pipeline="rammer", cache=False)
    assert cm.plan["meta"]["profile_db"] == "cpu.profile.json"
    assert "profile_db" not in dlcc.compile(MODEL, target="opencl", pipeline="rammer", cache=False).plan["meta"]
    other = tmp_path / "other.json"
    other.write_text(db.read_text())
    code, out, err = run_cli(capsys, "estimate", str(MODEL), "--device", str(dev), "-p", "baseline",
                             "--profile-db", str(other), "--json")
    assert code == 0 and json.loads(out)["time_sources"] == ["profile:other.json"], err
    key = cache_key(MODEL, {}, "opencl", "baseline", str(dev), cache=tmp_path / "cache")[1]
    data = json.loads(db.read_text())
    data["entries"][0]["us"] *= 2
    db.write_text(json.dumps(data))
    assert cache_key(MODEL, {}, "opencl", "baseline", str(dev), cache=tmp_path / "cache")[1] != key
