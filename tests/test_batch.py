"""`dlcc batch` (dlcc/batch): manifest validation with file and field, expansion, sharding, the
worker pool, expectations, JUnit (parsed back with junitparser) and JSON."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from dlcc.batch import check_unique, load_manifest, shard
from dlcc.cli import main
from dlcc.errors import ConfigError


def _tiny(path: Path, op: str = "Relu", n: int = 64) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, n])
    nodes = [helper.make_node(op, ["x"], ["a"]), helper.make_node("Add", ["a", "x"], ["y"])]
    if op == "Det":  # dlcc writes out determinants up to 4 x 4 only
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 5])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 5])
        nodes = [helper.make_node("Det", ["x"], ["d"]), helper.make_node("Add", ["x", "d"], ["y"])]
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", [x], [y]),
                                opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.fixture
def repo(tmp_path):
    _tiny(tmp_path / "models" / "relu.onnx")
    _tiny(tmp_path / "models" / "sigmoid.onnx", "Sigmoid", 96)
    _tiny(tmp_path / "gaps" / "det.onnx", "Det")
    return tmp_path


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# -- validation: each error names the file and the field -------------------------------------
@pytest.mark.parametrize("text,field,words", [
    ("jobs:\n  - model: models/relu.onnx\n    pipline: astitch\n", "jobs.0.pipline", "unknown key"),
    ("jobs:\n  - model: models/relu.onnx\n    verify: {rtol: lots}\n", "jobs.0.verify", "number"),
    ("jobs:\n  - model: models/missing.onnx\n", "jobs.0.model", "not found"),
    ("jobs:\n  - model: models/*.pb\n", "jobs.0.model", "matches no file"),
    ("defaults: {pipeline: astitch, pipelines: [baseline]}\njobs: []\n", "defaults", "not both"),
    ("jobs:\n  - model: models/relu.onnx\n    expect: maybe\n", "jobs.0.expect", "pass"),
    ("jobz: []\n", "jobz", "unknown key"),
])
def test_manifest_errors_name_file_and_field(repo, text, field, words):
    m = _write(repo / "bad.yaml", text)
    with pytest.raises(ConfigError) as e:
        load_manifest(m)
    assert str(m) in str(e.value) and field in str(e.value) and words in str(e.value), str(e.value)


def test_duplicate_job_names_are_refused(repo):
    m = _write(repo / "dup.yaml", "jobs:\n  - model: models/relu.onnx\n  - model: models/relu.onnx\n")
    with pytest.raises(ConfigError, match=r"(?s)duplicate job names.*jobs\.0.*jobs\.1"):
        check_unique(load_manifest(m))


def test_include_cycle_and_missing_include(repo):
    _write(repo / "a.yaml", "include: [b.yaml]\n")
    _write(repo / "b.yaml", "include: [a.yaml]\n")
    with pytest.raises(ConfigError, match="includes itself"):
        load_manifest(repo / "a.yaml")
    _write(repo / "c.yaml", "include: [nope.yaml]\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: include: .*nope\.yaml not found"):
        load_manifest(repo / "c.yaml")


# -- expansion ----------------------------------------------------------------------------------
def test_matrix_expansion_globs_and_includes(repo):
    _write(repo / "sub.yaml", "defaults: {pipeline: astitch}\njobs:\n  - model: gaps/det.onnx\n    expect: unsupported\n")
    m = _write(repo / "m.yaml", """
defaults: {target: opencl, pipeline: baseline}
include: [sub.yaml]
jobs:
  - model: models/*.onnx
    pipelines: [baseline, astitch]
    devices: [pocl-cpu, h100]
  - model: models/relu.onnx
    name: relu-shapes
    shapes: {x: [4, 64]}
    verify: true
""")
    jobs = load_manifest(m)
    check_unique(jobs)
    names = [j.name for j in jobs]
    assert names[0] == "det-astitch-default-auto"  # the include's own defaults
    assert jobs[0].expect == "unsupported"
    grid = [j for j in jobs[1:] if not j.name.startswith("relu-shapes")]
    assert len(grid) == 2 * 2 * 2 and {(j.pipeline, j.device, j.target) for j in grid} == {
        (p, d, "opencl") for p in ("baseline", "astitch") for d in ("pocl-cpu", "h100")}
    assert "sigmoid-astitch-h100-opencl" in names
    (v,) = [j for j in jobs if j.name.startswith("relu-shapes")]
    assert v.verify is not None and v.verify.rtol == 1e-3 and v.shapes == {"x": [4, 64]}


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7])
def test_shards_are_disjoint_and_cover_every_job(repo, n):
    m = _write(repo / "m.yaml", "jobs:\n  - model: models/*.onnx\n    pipelines: [baseline, astitch, rammer, full]\n"
                                "    devices: [pocl-cpu, h100, a100]\n  - model: gaps/det.onnx\n    cost: 9\n")
    jobs = load_manifest(m)
    parts = [shard(jobs, i, n) for i in range(1, n + 1)]
    names = [j.name for p in parts for j in p]
    assert sorted(names) == sorted(j.name for j in jobs) and len(set(names)) == len(jobs)
    assert parts == [shard(load_manifest(m), i, n) for i in range(1, n + 1)]  # deterministic
    loads = [sum(j.cost for j in p) for p in parts]
    assert max(loads) - min(loads) <= max(j.cost for j in jobs)  # balanced by cost (the heavy det job alone)
    with pytest.raises(ConfigError):
        shard(jobs, n + 1, n)


def test_measured_costs_from_an_earlier_summary_balance_the_shards(repo):
    """`costs:` names summary.json files of earlier runs: a measured job costs its seconds (cache
    hits excepted), a `cost:` in the manifest still wins, and the rest are scaled into seconds."""
    _tiny(repo / "models" / "tanh.onnx", "Tanh", 80)
    (repo / "last.json").write_text(json.dumps({"rows": [
        {"name": "relu-baseline-default-auto", "seconds": 30.0, "cache_hit": False},
        {"name": "sigmoid-baseline-default-auto", "seconds": 10.0, "cache_hit": False},
        {"name": "tanh-baseline-default-auto", "seconds": 0.01, "cache_hit": True},   # a hit: not a cost
        {"name": "det-baseline-default-auto", "seconds": 99.0, "cache_hit": False}]}))
    m = _write(repo / "m.yaml", "costs: [last.json]\njobs:\n  - model: models/*.onnx\n  - model: gaps/det.onnx\n"
                                "    cost: 5\n")
    by = {j.name: j for j in load_manifest(m)}
    assert (by["relu-baseline-default-auto"].cost, by["relu-baseline-default-auto"].cost_source) == (30.0, "measured")
    assert (by["det-baseline-default-auto"].cost, by["det-baseline-default-auto"].cost_source) == (5, "manifest")
    tanh, sig = by["tanh-baseline-default-auto"], by["sigmoid-baseline-default-auto"]
    size = (repo / "models" / "tanh.onnx").stat().st_size / 1e6  # scaled by the median seconds per size-cost
    ratios = sorted([30.0 / ((repo / "models" / "relu.onnx").stat().st_size / 1e6),
                     10.0 / ((repo / "models" / "sigmoid.onnx").stat().st_size / 1e6)])
    assert tanh.cost_source == "size" and tanh.cost == pytest.approx(size * ratios[1])
    assert sig.cost == 10.0
    # Two shards: the two ~30 s jobs (relu measured, tanh scaled from its size) go to different ones.
    one = {j.name for j in shard(list(by.values()), 1, 2)}
    assert ("relu-baseline-default-auto" in one) != ("tanh-baseline-default-auto" in one)
    (repo / "last.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"m.yaml: costs.0: .*last.json is not a `dlcc batch` summary"):
        load_manifest(m)
    (repo / "last.json").unlink()
    with pytest.raises(ConfigError, match=r"costs.0: .*not found"):
        load_manifest(m)


# -- running ---------------------------------------------------------------------------------------
def test_batch_runs_jobs_meets_expectations_and_reports(repo, capsys):
    junitparser = pytest.importorskip("junitparser")
    m = _write(repo / "m.yaml", """
defaults: {target: opencl}
jobs:
  - model: models/*.onnx
    pipelines: [baseline, astitch]
    verify: {rtol: 1e-3, atol: 1e-4}
  - model: gaps/det.onnx
    expect: unsupported
  - model: gaps/det.onnx
    name: det-split
    fallback: onnxruntime
    verify: true
  - model: models/relu.onnx
    name: wrongly-expected-gap
    expect: unsupported
""")
    out, junit = repo / "out", repo / "report.xml"
    with pytest.raises(SystemExit) as e:
        main(["batch", str(m), "-j", "2", "--out", str(out), "--junit", str(junit), "--json"])
    assert e.value.code == 1  # one job missed its expectation
    res = json.loads(capsys.readouterr().out)
    rows = {r["name"]: r for r in res["rows"]}
    assert len(rows) == 7 and res["not_met"] == 1
    assert all(rows[f"{s}-{p}-default-opencl"]["outcome"] == "passed" and rows[f"{s}-{p}-default-opencl"]["met"]
               for s in ("relu", "sigmoid") for p in ("baseline", "astitch"))
    assert rows["relu-baseline-default-opencl"]["verify_max_abs_err"] < 1e-5
    assert rows["det-baseline-default-opencl"]["outcome"] == "unsupported" and rows["det-baseline-default-opencl"]["met"]
    split = rows["det-split-baseline-default-opencl"]  # Det on onnxruntime, the Add after it on dlcc
    assert split["outcome"] == "passed" and split["met"] and split["verify_max_abs_err"] < 1e-5, split
    assert (split["segments"], split["fallback_segments"], split["plans"]) == (2, 1, 1)
    assert (out / "det-split-baseline-default-opencl" / "partition.json").is_file()
    bad = rows["wrongly-expected-gap-baseline-default-opencl"]
    assert bad["outcome"] == "passed" and not bad["met"]
    for r in rows.values():  # artifacts and logs, one per job
        assert Path(r["log"]).is_file()
        assert (r["artifact"] is not None) == (r["outcome"] == "passed")
    assert (out / "relu-astitch-default-opencl" / "plan.json").is_file()
    assert "Det" in (out / "det-baseline-default-opencl.log").read_text()

    xml = junitparser.JUnitXml.fromfile(str(junit))
    suites = list(xml) if isinstance(xml, junitparser.JUnitXml) else [xml]
    cases = [c for s in suites for c in s]
    assert len(cases) == 7
    failed = [c for c in cases if c.result and any(isinstance(r, junitparser.Failure) for r in c.result)]
    assert [c.name for c in failed] == ["wrongly-expected-gap-baseline-default-opencl"]
    assert "expected to be reported unsupported, but passed" in failed[0].result[0].message
    assert all(c.time >= 0 for c in cases) and "launches" in cases[0].system_out


def test_a_failing_job_fails_alone_and_shards_run_their_part(repo, capsys):
    (repo / "models" / "broken.onnx").write_bytes(b"not an onnx file")
    m = _write(repo / "m.yaml", "defaults: {target: opencl}\njobs:\n  - model: models/*.onnx\n")
    outs = []
    for i in (1, 2):
        with pytest.raises(SystemExit):
            main(["batch", str(m), "-j", "1", "--shard", f"{i}/2", "--out", str(repo / "out"), "--json"])
        outs.append(json.loads(capsys.readouterr().out))
    rows = [r for o in outs for r in o["rows"]]
    assert sorted(r["name"] for r in rows) == ["broken-baseline-default-opencl", "relu-baseline-default-opencl",
                                               "sigmoid-baseline-default-opencl"]
    by = {r["name"]: r for r in rows}
    assert by["broken-baseline-default-opencl"]["outcome"] == "failed"
    assert "broken.onnx" in by["broken-baseline-default-opencl"]["error"]
    assert by["relu-baseline-default-opencl"]["met"] and by["sigmoid-baseline-default-opencl"]["met"]


def test_bad_shard_and_list(repo, capsys):
    m = _write(repo / "m.yaml", "jobs:\n  - model: models/*.onnx\n")
    with pytest.raises(SystemExit) as e:
        main(["batch", str(m), "--shard", "3/2"])
    assert e.value.code == 2 and "I/N" in capsys.readouterr().err
    main(["batch", str(m), "--list", "--json"])
    listed = json.loads(capsys.readouterr().out)
    assert [j["name"] for j in listed["jobs"]] == ["relu-baseline-default-auto", "sigmoid-baseline-default-auto"]


def test_project_test_models_through_dlcc_batch(tmp_path):
    """The project's own CI compiles and verifies its test models through `dlcc batch` (a real
    subprocess, two workers, a JUnit report parsed back), as a team's CI would."""
    import subprocess
    import sys

    junitparser = pytest.importorskip("junitparser")
    from conftest import ROOT, export_model

    models = [export_model(n) for n in ("cnn", "lstm", "bert")]
    m = _write(tmp_path / "models.yaml", "defaults: {target: opencl, verify: true}\njobs:\n"
               f"  - model: {ROOT / 'examples' / 'resnet-tiny.onnx'}\n    pipelines: [baseline, astitch, rammer, full]\n"
               f"  - model: [{', '.join(str(p) for p in models)}]\n    pipelines: [baseline, full]\n")
    p = subprocess.run([sys.executable, "-m", "dlcc.cli", "batch", str(m), "-j", "2", "--out", str(tmp_path / "out"),
                        "--junit", str(tmp_path / "junit.xml")], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "CompilerWarning" not in p.stderr and "Traceback" not in p.stderr
    assert "10 of 10 job(s) met their expectation" in p.stdout
    xml = junitparser.JUnitXml.fromfile(str(tmp_path / "junit.xml"))
    cases = [c for s in (list(xml) if isinstance(xml, junitparser.JUnitXml) else [xml]) for c in s]
    assert len(cases) == 10 and all(c.is_passed for c in cases)
    assert all("verify max abs err" in c.system_out for c in cases)


def test_fail_fast_reports_jobs_not_started_as_skipped(repo):
    junitparser = pytest.importorskip("junitparser")
    (repo / "models" / "broken.onnx").write_bytes(b"garbage")
    m = _write(repo / "m.yaml", "defaults: {target: opencl}\njobs:\n  - model: models/broken.onnx\n"
                                "  - model: models/relu.onnx\n    pipelines: [baseline, astitch, rammer]\n")
    with pytest.raises(SystemExit) as e:
        main(["batch", str(m), "-j", "1", "--fail-fast", "--out", str(repo / "o"), "--junit", str(repo / "j.xml"), "-q",
              "--no-cache"])  # (a cache hit would be answered before the broken job ran)
    assert e.value.code == 1
    xml = junitparser.JUnitXml.fromfile(str(repo / "j.xml"))
    cases = {c.name: c for s in (list(xml) if isinstance(xml, junitparser.JUnitXml) else [xml]) for c in s}
    assert len(cases) == 4
    assert isinstance(cases["broken-baseline-default-opencl"].result[0], junitparser.Failure)
    skipped = [n for n, c in cases.items() if c.result and isinstance(c.result[0], junitparser.Skipped)]
    assert sorted(skipped) == sorted(f"relu-{p}-default-opencl" for p in ("baseline", "astitch", "rammer"))


def test_a_warm_rerun_starts_no_worker_and_reuses_verification(repo, tmp_path):
    """Everything the cache holds (the artifact and a passed verification of it) is answered by the
    batch's own process: the second run's worker would fail every job it were given."""
    from dlcc.batch import run_batch

    m = _write(repo / "m.yaml", "defaults: {target: opencl, verify: true}\njobs:\n  - model: models/*.onnx\n"
                                "    pipelines: [baseline, astitch]\n")
    jobs = load_manifest(m)
    cache = str(tmp_path / "cache")
    cold = run_batch(jobs, str(tmp_path / "o1"), 1, cache=cache)
    assert all(r["met"] and r["cache_hit"] is False and r["verify_cached"] is False for r in cold)
    warm = run_batch(jobs, str(tmp_path / "o2"), 1, cache=cache, worker=_misbehave)
    assert [r["name"] for r in warm] == [j.name for j in jobs]
    # (The message is short, so that a failure names the row and the flag that missed.)
    assert all(r["met"] and r["cache_hit"] and r["verify_cached"] for r in warm), [
        (r["name"], r["met"], r["cache_hit"], r["verify_cached"], r["outcome"], (r["error"] or "")[:300]) for r in warm]
    assert all((tmp_path / "o2" / r["name"] / "plan.json").is_file() for r in warm)
    assert "(a cached pass)" in Path(warm[0]["log"]).read_text()
    # Other tolerances are another verification: a worker runs it (here, the one that fails).
    tight = [replace(j, verify=type(j.verify)(rtol=0, atol=1e-9)) for j in jobs[:1]]
    assert run_batch(tight, str(tmp_path / "o3"), 1, cache=cache, worker=_misbehave)[0]["outcome"] == "error"


def test_a_hung_job_times_out_and_a_crashing_one_fails_alone(repo, tmp_path):
    """A job past its timeout is killed and reported; a worker that dies is re-run alone and then
    reported; the batch goes on with the others (no cache: every job reaches a worker)."""
    from dlcc.batch import run_batch

    m = _write(repo / "m.yaml", "defaults: {target: opencl}\njobs:\n  - model: models/relu.onnx\n    name: hang\n"
                                "    timeout: 2\n  - model: models/relu.onnx\n    name: crash\n"
                                "  - model: models/*.onnx\n    timeout: 1\n")  # (less than a worker's start-up:
    jobs = load_manifest(m)                                             # the clock starts with the job)
    rows = {r["name"]: r for r in run_batch(jobs, str(tmp_path / "o"), 2, cache=False, worker=_misbehave)}
    assert len(rows) == 4
    assert rows["hang-baseline-default-opencl"]["outcome"] == "error"
    assert "timed out after 2 s" in rows["hang-baseline-default-opencl"]["error"]
    assert rows["crash-baseline-default-opencl"]["outcome"] == "error"
    assert "died" in rows["crash-baseline-default-opencl"]["error"]
    assert rows["relu-baseline-default-opencl"]["met"] and rows["sigmoid-baseline-default-opencl"]["met"]


def _misbehave(job: dict, out_dir: str, cache) -> dict:
    """A worker for the tests above (imported by name in the spawned workers): `hang` sleeps,
    `crash` kills its own process, anything else fails with an `error` row."""
    import os
    import signal
    import time

    from dlcc.batch import blank_row, met

    if job["name"].startswith("hang"):
        time.sleep(600)
    if job["name"].startswith("crash"):
        os.kill(os.getpid(), signal.SIGKILL)
    row = {**blank_row(job), "stdout": ""}
    if job["name"].startswith(("relu", "sigmoid")) and not job["verify"]:
        row["outcome"] = "passed"
    row["met"] = met(row)
    return row


def _ctrl_c_as_in_a_terminal() -> None:
    """In the batch's process: SIGINT's default action, as a terminal's foreground job has it. A
    test run started in the background of a non-interactive shell (`cmd &`) has SIGINT ignored,
    and a child inherits that: it would never see the Ctrl-C."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("when", ["workers-importing", "jobs-running"])
def test_ctrl_c_stops_the_batch_and_its_workers(repo, when):
    """SIGINT to the batch's process group (what Ctrl-C sends): exit 130 with a one-line message, no
    traceback (not even from a worker still importing dlcc), and no worker left behind."""
    import os
    import signal
    import subprocess
    import sys
    import time

    m = _write(repo / "m.yaml", "defaults: {target: opencl}\njobs:\n  - model: models/*.onnx\n"
                                "    pipelines: [baseline, astitch, rammer, full]\n    devices: [pocl-cpu, h100, a100]\n")
    out = repo / "out"
    tmp = repo / "tmp"  # the batch's TMPDIR: what killed workers were writing there must go too
    tmp.mkdir()
    p = subprocess.Popen([sys.executable, "-m", "dlcc.cli", "batch", str(m), "-j", "2", "--no-cache", "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         env={**os.environ, "TMPDIR": str(tmp)}, preexec_fn=_ctrl_c_as_in_a_terminal)
    deadline = time.monotonic() + 300

    def ready() -> bool:
        if when == "jobs-running":  # the first job has finished: the workers are up and busy
            return bool(list(out.glob("*.log")))
        kids = subprocess.run(["pgrep", "-P", str(p.pid), "-f", "multiprocessing"], capture_output=True, text=True)
        return len(kids.stdout.split()) >= 2  # both workers spawned (the resource tracker aside)

    while not ready() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert p.poll() is None, "the batch finished before it could be interrupted"
    os.killpg(p.pid, signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err, err[-3000:]
    for _ in range(100):  # the workers die with the batch (SIGKILLed, not waited for)
        try:
            os.killpg(p.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("worker processes outlived the interrupted batch")
    assert not list(out.glob(".*tmp*")), "a half-written artifact was left behind"
    assert not list(tmp.iterdir()), f"temporary files were left behind: {sorted(tmp.iterdir())}"
