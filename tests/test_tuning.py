"""`dlcc compile --tune` (dlcc/tuning.py): the estimator's best candidates measured on the device,
the fastest kept, the times recorded in the cache so the same compile measures nothing, and a
tuning record that is corrupt, foreign or half-written never trusted."""
from __future__ import annotations

import json

import pytest

import dlcc
from dlcc import tuning
from dlcc.cli import main

from conftest import opencl_device_available
from test_bad_input import EXAMPLE

pytestmark = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")


def _fake_times(monkeypatch, times: dict, calls: list):
    """time_inference by pipeline name: the measurement is what these tests control."""
    def fake(cm, repeat):
        name = cm.plan["meta"]["pipeline"]
        calls.append(name)
        return times.get(name, 1000.0)

    monkeypatch.setattr(tuning, "time_inference", fake)


def _records(cache):
    d = cache / "tuning"
    return sorted(d.iterdir()) if d.exists() else []


def test_the_measured_fastest_candidate_wins_and_a_warm_compile_measures_nothing(monkeypatch, tmp_path):
    cache = tmp_path / "cache"
    from dlcc.estimate.plan_mode import estimate_plan

    ranked = [p.name for p in estimate_plan(EXAMPLE, device="pocl-cpu", what_ifs=False).pipelines][:3]
    times = {ranked[0]: 300.0, ranked[1]: 100.0, ranked[2]: 200.0}  # the estimator's second is the fastest
    calls = []
    _fake_times(monkeypatch, times, calls)
    m = dlcc.compile(EXAMPLE, target="opencl", tune=True, cache=cache, out=tmp_path / "a")
    choice = m.plan["meta"]["pipeline_choice"]
    assert calls == ranked and m.plan["meta"]["pipeline"] == ranked[1]
    assert choice["tuned"] and choice["measured"] and choice["times_us"] == times
    (rec,) = _records(cache)
    assert json.loads(rec.read_text())["chosen"] == ranked[1]
    calls.clear()
    again = dlcc.compile(EXAMPLE, target="opencl", tune=True, cache=cache, out=tmp_path / "b")
    assert calls == [] and again.plan["meta"]["pipeline"] == ranked[1]
    assert not again.plan["meta"]["pipeline_choice"]["measured"]


@pytest.mark.parametrize("damage", ["garbage", "foreign", "bad time"])
def test_a_corrupt_or_foreign_record_is_ignored_with_a_warning(monkeypatch, tmp_path, damage):
    cache = tmp_path / "cache"
    calls = []
    _fake_times(monkeypatch, {}, calls)
    dlcc.compile(EXAMPLE, target="opencl", tune=True, tune_top=2, cache=cache)
    (rec,) = _records(cache)
    data = json.loads(rec.read_text())
    if damage == "garbage":
        rec.write_text("{not json")
    elif damage == "foreign":
        rec.write_text(json.dumps({**data, "key": "0" * 64}))
    else:
        rec.write_text(json.dumps({**data, "times_us": {k: -1 for k in data["times_us"]}}))
    calls.clear()
    with pytest.warns(RuntimeWarning, match="ignoring the tuning record"):
        dlcc.compile(EXAMPLE, target="opencl", tune=True, tune_top=2, cache=cache)
    assert len(calls) == 2  # measured again
    assert json.loads(rec.read_text())["key"] == data["key"]  # and the record rewritten whole


def test_an_interrupted_tuning_leaves_no_record(monkeypatch, tmp_path):
    cache = tmp_path / "cache"
    seen = []

    def interrupted(cm, repeat):
        seen.append(1)
        if len(seen) == 2:
            raise KeyboardInterrupt
        return 5.0

    monkeypatch.setattr(tuning, "time_inference", interrupted)
    with pytest.raises(KeyboardInterrupt):
        dlcc.compile(EXAMPLE, target="opencl", tune=True, cache=cache)
    assert _records(cache) == []  # no record, and no temporary file either


def test_tuning_measures_for_real_on_pocl(tmp_path):
    m = dlcc.compile(EXAMPLE, target="opencl", tune=True, tune_top=2, tune_repeat=2, cache=tmp_path / "cache")
    c = m.plan["meta"]["pipeline_choice"]
    assert len(c["times_us"]) == 2 and all(t > 0 for t in c["times_us"].values())
    assert m.plan["meta"]["pipeline"] == min(c["times_us"], key=c["times_us"].get)


def test_tune_without_a_device_or_with_a_pipeline_is_one_clear_error(tmp_path, capsys, monkeypatch):
    from dlcc.backends import cuda

    monkeypatch.setattr(cuda, "available", lambda: False)
    code = None
    try:
        main(["compile", str(EXAMPLE), "-t", "cuda", "--tune", "-o", str(tmp_path / "x"), "--no-cache"])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and "--tune measures on the device, and the cuda target cannot run here" in err
    assert not (tmp_path / "x").exists()
    with pytest.raises(SystemExit) as e:
        main(["compile", str(EXAMPLE), "-t", "opencl", "--tune", "-p", "astitch", "-o", str(tmp_path / "y")])
    assert e.value.code == 2 and "drop --pipeline astitch" in capsys.readouterr().err


def test_estimate_says_which_rows_were_measured(monkeypatch, tmp_path):
    """After a tuned compile into the default cache, `dlcc estimate` marks the measured pipelines
    "tuned" with their measured time, the rest "modelled"."""
    from dlcc.estimate.plan_mode import estimate_plan

    monkeypatch.setenv("DLCC_CACHE_DIR", str(tmp_path / "cache"))
    before = estimate_plan(EXAMPLE, device="pocl-cpu", what_ifs=False).to_dict()["pipelines"]
    assert {p["source"] for p in before} == {"modelled"} and all(p["measured_ms"] is None for p in before)
    _fake_times(monkeypatch, {}, [])
    m = dlcc.compile(EXAMPLE, target="opencl", tune=True, tune_top=2, cache=True)
    rows = {p["name"]: p for p in estimate_plan(EXAMPLE, device="pocl-cpu", what_ifs=False).to_dict()["pipelines"]}
    tuned = m.plan["meta"]["pipeline_choice"]["times_us"]
    assert {n for n, p in rows.items() if p["source"] == "tuned"} == set(tuned)
    assert all(rows[n]["measured_ms"] == pytest.approx(t / 1e3) for n, t in tuned.items())
