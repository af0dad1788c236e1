"""`dlcc compile --tune` (dlcc/tuning.py): each GEMM problem's tilings and the estimator's best
pipelines measured on the device, the fastest kept, the times recorded in the cache so the same
compile measures nothing, and a tuning record that is corrupt, foreign or half-written never
trusted."""
from __future__ import annotations

import json

import pytest

import dlcc
from dlcc import tuning
from dlcc.cli import main

from conftest import opencl_device_available
from test_bad_input import EXAMPLE

pytestmark = pytest.mark.skipif(not opencl_device_available(), reason="no OpenCL device here")


def _fake_times(monkeypatch, times: dict, calls: list, tilings=None):
    """time_inferences by pipeline name, and time_tilings (the cost model's pick fastest unless
    `tilings` says {tiling: µs}): the measurement is what these tests control."""
    def fake(cms, repeat):
        calls.extend(cms)
        # (a variant of Rammer's join decisions is labelled "PIPELINE (what it changes)")
        assert all(cm.plan["meta"]["pipeline"] == name.split(" (")[0] for name, cm in cms.items())
        return {name: times.get(name, 1000.0) for name in cms}

    def fake_tilings(rt, problem, cands, precision, repeat):
        return {t.name: (tilings or {}).get(t.name, 100.0 if t.name == problem["picked"] else 200.0) for t in cands}

    monkeypatch.setattr(tuning, "time_inferences", fake)
    monkeypatch.setattr(tuning, "time_tilings", fake_tilings)


def _records(cache, kind=None):
    """The pipeline records (kind None) or the tiling records (kind "tiling") in `cache`."""
    d = cache / "tuning"
    return [f for f in sorted(d.iterdir()) if json.loads(f.read_text()).get("kind") == kind] if d.exists() else []


def test_the_measured_fastest_candidate_wins_and_a_warm_compile_measures_nothing(monkeypatch, tmp_path):
    cache = tmp_path / "cache"
    from dlcc.estimate.plan_mode import estimate_plan

    ranked = [p.name for p in estimate_plan(EXAMPLE, device="pocl-cpu", what_ifs=False).pipelines][:3]
    times = {ranked[0]: 300.0, ranked[1]: 100.0, ranked[2]: 200.0}  # the estimator's second is the fastest
    calls = []
    _fake_times(monkeypatch, times, calls)
    m = dlcc.compile(EXAMPLE, target="opencl", tune=True, cache=cache, out=tmp_path / "a")
    choice = m.plan["meta"]["pipeline_choice"]
    assert calls[:3] == ranked and m.plan["meta"]["pipeline"] == ranked[1]
    assert choice["tuned"] and choice["measured"] and {n: choice["times_us"][n] for n in ranked} == times
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
    measured = len(calls)
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
    assert len(calls) == measured  # measured again
    assert json.loads(rec.read_text())["key"] == data["key"]  # and the record rewritten whole


def _cli_ok(args):
    try:
        main(args)
    except SystemExit as e:
        assert e.code in (0, None), e.code


def test_the_cli_says_it_ignored_a_record_in_one_warning_line(monkeypatch, tmp_path, capsys):
    """Through `dlcc compile --tune`, the warning is one `warning:` line naming the record, not
    Python's form with dlcc's file, line and source."""
    cache = tmp_path / "cache"
    _fake_times(monkeypatch, {}, [])
    args = ["compile", str(EXAMPLE), "-t", "opencl", "--tune", "--tune-top", "2", "--cache", str(cache)]
    _cli_ok(args + ["-o", str(tmp_path / "a")])
    (rec,) = _records(cache)
    rec.write_text("{not json")
    capsys.readouterr()
    _cli_ok(args + ["-o", str(tmp_path / "b")])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "warning" in ln.lower()]
    assert len(lines) == 1 and lines[0].startswith("warning: ignoring the tuning record") and rec.name in lines[0], lines
    assert "RuntimeWarning" not in lines[0] and "tuning.py" not in lines[0]


def test_an_interrupted_tuning_leaves_no_record(monkeypatch, tmp_path):
    cache = tmp_path / "cache"
    def interrupted(cms, repeat):
        raise KeyboardInterrupt  # in the middle of the timed rounds

    _fake_times(monkeypatch, {}, [])
    monkeypatch.setattr(tuning, "time_inferences", interrupted)
    with pytest.raises(KeyboardInterrupt):
        dlcc.compile(EXAMPLE, target="opencl", tune=True, cache=cache)
    assert _records(cache) == []  # no pipeline record
    assert not list((cache / "tuning").glob(".tuning-*"))  # and no temporary file either


def test_tuning_measures_for_real_on_pocl(tmp_path, monkeypatch):
    """The pipelines really timed on PoCL (the tilings' real timing is
    test_tiling_times_are_real_and_checked_on_pocl's: every tiling of every GEMM here would take a
    minute of kernel builds)."""
    monkeypatch.setattr(tuning, "tune_tilings", lambda *a, **k: {})
    m = dlcc.compile(EXAMPLE, target="opencl", tune=True, tune_top=2, tune_repeat=2, cache=tmp_path / "cache")
    c = m.plan["meta"]["pipeline_choice"]
    assert len(c["candidates"]) == 2 and set(c["candidates"]) <= set(c["times_us"])
    assert all(t > 0 for t in c["times_us"].values())
    assert m.plan["meta"]["pipeline"] == min(c["times_us"], key=c["times_us"].get)


def test_pipelines_that_build_one_plan_are_one_measurement(tmp_path):
    """time_inferences runs a plan once per round however many candidates built it, so identical
    plans get one time (not two medians that differ by the machine's noise), and different plans
    their own."""
    a = dlcc.compile(EXAMPLE, target="opencl", pipeline="baseline", cache=False)
    b = dlcc.compile(EXAMPLE, target="opencl", pipeline="baseline", cache=False)
    c = dlcc.compile(EXAMPLE, target="opencl", pipeline="astitch", cache=False)
    assert tuning.run_signature(a) == tuning.run_signature(b) != tuning.run_signature(c)
    t = tuning.time_inferences({"a": a, "b": b, "c": c}, 3)
    assert t["a"] == t["b"] and t["c"] != t["a"] and all(v > 0 for v in t.values())
    assert b._exec is None  # b was never run: its twin a stood for it


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
    choice = m.plan["meta"]["pipeline_choice"]
    tuned = {n: choice["times_us"][n] for n in choice["candidates"]}  # (join variants have no row)
    assert {n for n, p in rows.items() if p["source"] == "tuned"} == set(tuned)
    assert all(rows[n]["measured_ms"] == pytest.approx(t / 1e3) for n, t in tuned.items())


@pytest.mark.parametrize("model", ["example", "bert"])
def test_gemm_problems_are_the_plans_distinct_gemms(model):
    """Weights GEMMs and convolutions, and batched ones: BERT's attention Q·Kᵀ and P·V."""
    from conftest import export_model

    m = dlcc.compile(EXAMPLE if model == "example" else export_model(model), target="opencl", pipeline="baseline")
    probs = tuning.gemm_problems(m.plan)
    kernels = {k["name"]: k for k in m.plan["kernels"]}
    want = {(tuple(L["gemm"]["shape"]), L["gemm"]["a_k_contiguous"], L["gemm"]["b_n_contiguous"])
            for L in m.plan["launches"] if L.get("gemm") and kernels[L["kernel"]]["kind"] == "gemm"}
    assert len(probs) == len(want) > 0
    assert {(tuple(p["shape"]), p["a_k_contiguous"], p["b_n_contiguous"]) for p in probs} == want
    assert any(p["shape"][0] > 1 for p in probs) == (model == "bert")
    assert all(p["picked"] == kernels[L["kernel"]]["tiling"] for p in probs for L in m.plan["launches"]
               if L.get("gemm") and L["gemm"]["shape"] == p["shape"])


def test_a_measured_tiling_is_compiled_and_recorded(monkeypatch, tmp_path):
    """A tiling measured faster than the cost model's pick (by more than MIN_GAIN) replaces it in
    every candidate and in the result, which matches onnxruntime; a win under MIN_GAIN does not;
    a warm compile measures no tiling again."""
    from dlcc.kernels.gemm import CPU_TILINGS
    from dlcc.verify import verify_outputs

    cache = tmp_path / "cache"
    base = dlcc.compile(EXAMPLE, target="opencl", pipeline="baseline")
    picked = {t for t in (k["tiling"] for k in base.plan["kernels"]) if t}
    other = next(t.name for t in CPU_TILINGS if t.name not in picked)
    measured = []
    _fake_times(monkeypatch, {}, [])

    def counting(rt, problem, cands, precision, repeat):
        measured.append(problem["shape"])
        return {t.name: 10.0 if t.name == other else 100.0 for t in cands}

    monkeypatch.setattr(tuning, "time_tilings", counting)
    m = dlcc.compile(EXAMPLE, target="opencl", tune=True, tune_top=2, cache=cache, out=tmp_path / "a")
    choice = m.plan["meta"]["pipeline_choice"]
    assert choice["gemm_tilings"] and set(choice["gemm_tilings"].values()) == {other}
    assert {k["tiling"] for k in m.plan["kernels"] if k["kind"] == "gemm"} == {other}
    assert "GEMM tiling(s) measured faster" in choice["why"]
    feeds = m.sample_inputs(0)
    assert all(c["passed"] for c in verify_outputs(EXAMPLE, m(feeds), feeds, 1e-3, 1e-4))
    n = len(measured)
    assert n == len(_records(cache, "tiling")) > 0
    dlcc.compile(EXAMPLE, target="opencl", tune=True, tune_top=2, cache=cache, out=tmp_path / "b")
    assert len(measured) == n  # read from the tiling records
    _fake_times(monkeypatch, {}, [], tilings={other: 98.0})  # 2% faster than the pick: noise
    m2 = dlcc.compile(EXAMPLE, target="opencl", tune=True, tune_top=2, cache=tmp_path / "c2")
    assert m2.plan["meta"]["pipeline_choice"]["gemm_tilings"] == {}


def test_a_measured_batched_tiling_is_compiled(monkeypatch, tmp_path):
    """BERT's attention products (batch = heads) measured faster in another tiling are compiled
    with it ({"BATCHxMxNxK": tiling}), and the model still matches onnxruntime."""
    from conftest import export_model
    from dlcc.kernels.gemm import CPU_TILINGS
    from dlcc.verify import verify_outputs

    path = export_model("bert")
    base = dlcc.compile(path, target="opencl", pipeline="baseline")
    kernels = {k["name"]: k for k in base.plan["kernels"]}
    (batched,) = {tuple(L["gemm"]["shape"]): kernels[L["kernel"]]["tiling"] for L in base.plan["launches"]
                  if L.get("gemm") and L["gemm"]["shape"][0] > 1}.items()
    other = next(t.name for t in CPU_TILINGS if t.name != batched[1])
    _fake_times(monkeypatch, {"baseline": 10.0}, [])  # (where no fused attention kernel holds them)

    def faster_batched(rt, problem, cands, precision, repeat):
        win = other if problem["shape"][0] > 1 else problem["picked"]
        return {t.name: 10.0 if t.name == win else 100.0 for t in cands}

    monkeypatch.setattr(tuning, "time_tilings", faster_batched)
    m = dlcc.compile(path, target="opencl", tune=True, tune_top=9, cache=tmp_path / "cache")
    assert m.plan["meta"]["pipeline"] == "baseline"
    key = "x".join(map(str, batched[0]))
    assert m.plan["meta"]["pipeline_choice"]["gemm_tilings"] == {key: other}
    kernels = {k["name"]: k for k in m.plan["kernels"]}
    used = {kernels[L["kernel"]].get("tiling") for L in m.plan["launches"]
            if L.get("gemm") and L["gemm"]["shape"][0] > 1}
    assert used == {other}, used
    feeds = m.sample_inputs(0)
    assert all(c["passed"] for c in verify_outputs(path, m(feeds), feeds, 1e-3, 1e-4))


def test_tiling_times_are_real_and_checked_on_pocl():
    """time_tilings runs each candidate on the device on operands of the problem's layout; a
    tiling computing wrong is an error, not a choice."""
    from dlcc.executor import make_runtime
    from dlcc.kernels import gemm
    from dlcc.kernels.gemm import TILINGS

    rt = make_runtime("opencl")
    for batch, a_kc, b_nk in ((1, True, True), (1, True, False), (3, True, False), (3, False, True)):
        prob = {"shape": [batch, 40, 24, 36], "a_k_contiguous": a_kc, "b_n_contiguous": b_nk, "picked": TILINGS[0].name}
        times = tuning.time_tilings(rt, prob, TILINGS[:3], "fp32", 2)
        assert set(times) == {t.name for t in TILINGS[:3]} and all(v > 0 for v in times.values())
    import dataclasses

    right = gemm.plain_spec

    def wrong_spec(M, N, K, **kw):  # a store that drops the accumulator: the check must refuse it
        return dataclasses.replace(right(M, N, K, **kw), store=lambda m, n, acc: [f"C[{m} * {N} + {n}] = 0.0f;"])

    def first_batch_only(M, N, K, **kw):  # every batch's product written over the first's
        return dataclasses.replace(right(M, N, K, **kw), store=lambda m, n, acc: [f"C[{m} * {N} + {n}] = {acc};"])

    try:
        gemm.plain_spec = wrong_spec
        with pytest.raises(dlcc.DlccError, match="computed 3x40x24x36 wrong"):
            tuning.time_tilings(rt, prob, TILINGS[:1], "fp32", 1)
        gemm.plain_spec = first_batch_only
        with pytest.raises(dlcc.DlccError, match="computed 3x40x24x36 wrong"):
            tuning.time_tilings(rt, prob, TILINGS[:1], "fp32", 1)
    finally:
        gemm.plain_spec = right


def test_gemm_tilings_option_is_validated(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text("name: x\npasses:\n  - name: simplify\n  - name: lower\n    options:\n"
                   "      gemm_tilings: {1x2x3x4: nope}\n  - name: memplan\n")
    with pytest.raises(dlcc.DlccError, match="gemm_tilings"):
        dlcc.compile(EXAMPLE, target="opencl", pipeline=str(bad))


def test_a_measured_join_decision_is_compiled_and_a_warm_compile_rebuilds_it(monkeypatch, tmp_path):
    """Rammer's join decisions are candidates too: where flipping one run's decision measures
    fastest, the compile joins that run (run_join), says so in the plan, and a warm compile
    rebuilds the same plan from the record (its run index read back from JSON) without measuring."""
    monkeypatch.setattr(tuning, "JOIN_DOUBT", 1e9)  # (pocl-cpu's estimates are far from in doubt)
    cache = tmp_path / "cache"
    calls = []
    _fake_times(monkeypatch, {"full": 900.0, "full (run 1 joined)": 100.0}, calls)
    m = dlcc.compile(EXAMPLE, target="opencl", tune=True, tune_top=5, cache=cache, out=tmp_path / "a")
    c = m.plan["meta"]["pipeline_choice"]
    assert c["chosen"] == "full (run 1 joined)" and c["rammer_options"] == {"run_join": {1: True}}
    assert {"full (join: always)", "full (run 0 joined)", "full (run 1 joined)"} <= set(calls)
    assert "full (join: never)" not in calls  # the estimate joins nothing here: it would be full again
    runs = {r["run"]: r for r in m.plan["rammer_runs"]}
    assert runs[1]["joined"] and runs[1]["decision"].startswith("run_join: joined") and not runs[0]["joined"]
    assert any(L["op_type"] == "Rammer" and L.get("grid_sync") for L in m.plan["launches"])
    calls.clear()
    again = dlcc.compile(EXAMPLE, target="opencl", tune=True, tune_top=5, cache=cache, out=tmp_path / "b")
    assert calls == [] and tuning.run_signature(again) == tuning.run_signature(m)


def test_join_decisions_the_estimate_is_sure_of_are_not_measured(monkeypatch, tmp_path):
    """On PoCL joining is predicted 20-30x slower here: no join variant is compiled or timed."""
    calls = []
    _fake_times(monkeypatch, {}, calls)
    m = dlcc.compile(EXAMPLE, target="opencl", tune=True, tune_top=5, cache=tmp_path / "cache")
    assert "full" in calls and not [n for n in calls if " (" in n]
    assert m.plan["meta"]["pipeline_choice"]["times_us"].keys() == set(calls)


def test_run_flips_that_each_pay_are_measured_together(monkeypatch, tmp_path):
    from conftest import export_model

    monkeypatch.setattr(tuning, "JOIN_DOUBT", 1e9)
    path = export_model("bert")
    plan = dlcc.compile(path, target="opencl", pipeline="full", cache=False).plan
    flips = [n for n, o in tuning.join_variants("full", plan, gpu=False).items() if len(o.get("run_join", {})) == 1]
    a, b = flips[:2]
    both = tuning._combined_flips("full", {a: tuning.join_variants("full", plan, False)[a],
                                           b: tuning.join_variants("full", plan, False)[b]})[0]
    calls, rounds = [], []
    _fake_times(monkeypatch, {"full": 1000.0, a: 500.0, b: 600.0, both: 200.0}, calls)
    fake = tuning.time_inferences
    monkeypatch.setattr(tuning, "time_inferences", lambda cms, repeat: rounds.append(list(cms)) or fake(cms, repeat))
    m = dlcc.compile(path, target="opencl", tune=True, tune_top=5, cache=tmp_path / "cache")
    c = m.plan["meta"]["pipeline_choice"]
    assert c["chosen"] == both and len(c["rammer_options"]["run_join"]) == 2 and calls[-1] == both
    # the combination is timed in one set of rounds with every plan, so every recorded time is from it
    assert set(rounds[-1]) == set(c["times_us"]) and both in rounds[-1] and len(rounds) == 3
    joined = {r["run"] for r in m.plan["rammer_runs"] if r["joined"]}
    assert joined == set(c["rammer_options"]["run_join"])


def test_join_variants_flip_the_least_certain_runs():
    runs = [{"run": i, "joined": i == 0, "decidable": True, "joined_us": 100.0, "apart_us": a}
            for i, a in enumerate([150.0, 101.0, 5000.0, 99.0, 120.0, 280.0, 110.0])]
    runs.append({"run": 7, "joined": False, "decidable": False, "joined_us": 1.0, "apart_us": 1.0})
    v = tuning.join_variants("full", {"rammer_runs": runs}, gpu=True)
    assert list(v) == ["full (run 1 joined)", "full (run 3 joined)", "full (run 6 joined)", "full (run 4 joined)",
                       "full (runs 1, 3, 4, 5, 6 joined)", "full (run 0 apart)", "full (2 blocks per SM)",
                       "full (sync: counters)"]
    # (run 2's estimates are 50x apart: never flipped; run 7 cannot be joined: never named)
    assert v["full (runs 1, 3, 4, 5, 6 joined)"] == {"run_join": {1: True, 3: True, 4: True, 5: True, 6: True}}
    assert v["full (2 blocks per SM)"] == {"blocks_per_sm": 2}
    assert v["full (sync: counters)"] == {"sync": "counters"}
    assert not {"full (2 blocks per SM)", "full (sync: counters)"} & set(tuning.join_variants("full", {"rammer_runs": runs},
                                                                                              gpu=False))
    both = [dict(r, joined=False) for r in runs[:2]]  # every decidable run in doubt: the pass's own options
    assert tuning.join_variants("full", {"rammer_runs": both}, gpu=False) == {
        "full (run 1 joined)": {"run_join": {1: True}}, "full (run 0 joined)": {"run_join": {0: True}},
        "full (join: always)": {"join": "always"}}
    assert tuning.join_variants("astitch", {}, gpu=True) == {}


def test_a_flipped_run_computes_as_onnxruntime_and_inspect_lists_the_runs(tmp_path):
    """run_join joins one run (grid barriers between its waves) on PoCL and matches onnxruntime; a
    run index the plan lacks is a pass-log line; `inspect --rprogram` shows every run's decision."""
    from dlcc.verify import verify_outputs

    pipe = tuning.pipeline_with("full", {}, {"run_join": {0: True, 9: False}})
    m = dlcc.compile(EXAMPLE, target="opencl", pipeline=pipe, cache=False)
    runs = m.plan["rammer_runs"]
    assert runs[0]["joined"] and not runs[1]["joined"]
    assert sum(1 for L in m.plan["launches"] if L["op_type"] == "Rammer" and L.get("grid_sync")) == 1
    assert any("run_join names run(s) 9" in line for line in m.plan["meta"]["pass_log"])
    feeds = m.sample_inputs(0)
    rows = verify_outputs(str(EXAMPLE), m(feeds), feeds, 1e-3, 1e-4)
    assert all(r["passed"] for r in rows), rows
    m.save(tmp_path / "art")
    from typer.testing import CliRunner

    from dlcc.cli import app

    res = CliRunner().invoke(app, ["inspect", str(tmp_path / "art"), "--rprogram"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "runs of co-schedulable launches" in res.output and "run_join: joined" in res.output
    assert "estimate: one persistent kernel" in res.output  # run 1, decided by the estimate


def test_the_choice_names_candidates_that_built_its_plan(monkeypatch, tmp_path):
    """Candidates measured as one plan (one time) are named as such, and "faster than the next"
    compares with the next different plan."""
    _fake_times(monkeypatch, {"astitch": 100.0, "full": 100.0, "baseline": 150.0}, [])
    m = dlcc.compile(EXAMPLE, target="opencl", tune=True, tune_top=3, cache=tmp_path / "cache")
    why = m.plan["meta"]["pipeline_choice"]["why"]
    assert "(the same plan as full)" in why and "1.50x faster than the next, baseline (150.0 µs)" in why, why
