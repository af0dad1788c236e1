#!/usr/bin/env python3
"""A corpus of malformed inputs in the five families of issue 19, run through dlcc's CLI the way a
user runs it, each case in a worker process with a timeout. Prints a table of verdicts per family.

    python scripts/hostile_corpus.py                     # about 1,500 cases, 2 workers
    python scripts/hostile_corpus.py --cases 200 --seed 7 --families onnx-structure,trace
    python scripts/hostile_corpus.py --show crash,hang,wrong   # also print each such case's output

Families (the case count of each follows the issue's proportions; `--cases` scales them):
- `onnx-bytes`: the example model and small exporter-style graphs with flipped bytes, truncated, or
  with a varint overwritten (`dlcc compile`);
- `onnx-structure`: the same graphs with one to three structure-aware mutations (attributes,
  inputs, initializers, dims, opset: dlcc/testing/fuzz_targets.py), through `dlcc verify` on the
  baseline, astitch or full pipeline, so a wrong answer is seen;
- `binding`: hostile `--shape` strings, `.npz` inputs of the wrong name, dtype or shape, and
  artifact directories with a mutated `plan.json` or a missing or truncated file (`dlcc run`);
- `yaml`: mutated built-in pipeline and device files (`dlcc compile -p FILE` / `-d FILE`);
- `trace`: mutated slices of a real PyTorch profiler trace, gzip truncated (`dlcc estimate --trace`).

Verdicts: `ok` (exit 0), `refused` (exit 2 and one message, no traceback), `wrong` (verify
exit 1: dlcc's outputs differ from onnxruntime's; where onnxruntime cannot run the model, verify
refuses with exit 2), `traceback` (a Python traceback in the output, or dlcc's "internal error"
exit 70), `crash` (the worker died), `hang` (past --timeout). The floor: 0 wrong, 0 traceback, 0 crash, 0 hang. Exit code 1 when any of those occur.
"""
from __future__ import annotations

import argparse
import gzip
import io
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = {"onnx-bytes": 270, "onnx-structure": 756, "binding": 221, "yaml": 128, "trace": 198}
BAD = ("wrong", "traceback", "crash", "hang")


# -- building cases (parent process) -----------------------------------------------------------

def build_cases(n_total: int, seed: int, families: list[str], models: list[Path] = ()) -> list[tuple[str, dict]]:
    from dlcc.testing import fuzz_targets as ft

    rng = random.Random(seed)
    scale = n_total / sum(FAMILIES.values())
    onnx_seeds, trace_seed = ft.seeds("onnx") + [p.read_bytes() for p in models], ft.seeds("trace")[0]
    yaml_seeds = {k: [p.read_bytes() for p in sorted((ROOT / "configs" / k).glob("*.yaml"))]
                  for k in ("pipelines", "devices")}
    cases = []
    for fam in families:
        for k in range(max(1, round(FAMILIES[fam] * scale))):
            cases.append((f"{fam}-{k:04d}", _case(fam, k, rng, ft, onnx_seeds, trace_seed, yaml_seeds)))
    return cases


def _case(fam, k, rng, ft, onnx_seeds, trace_seed, yaml_seeds) -> dict:
    if fam == "onnx-bytes":
        data = bytearray(rng.choice(onnx_seeds))
        how = rng.choice(("flip", "truncate", "varint"))
        if how == "truncate":
            data = data[:rng.randrange(1, len(data))]
        elif how == "flip":
            for _ in range(rng.randint(1, 6)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        else:
            at = rng.randrange(len(data) - 10)
            data[at:at + rng.randint(1, 10)] = b"\xff" * rng.randint(1, 10)
        return {"files": {"m.onnx": bytes(data)}, "argv": ["compile", "m.onnx", "-o", "out", "-q", "-t", "opencl"],
                "what": how}
    if fam == "onnx-structure":
        data = rng.choice(onnx_seeds)
        for _ in range(rng.randint(1, 3)):
            data = ft.MUTATORS["onnx"](data, rng, 1 << 22) or data
        pipe = rng.choice(("baseline", "astitch", "full"))
        return {"files": {"m.onnx": data}, "argv": ["verify", "m.onnx", "-q", "-t", "opencl", "-p", pipe],
                "what": pipe}
    if fam == "binding":
        return _binding_case(rng, ft)
    if fam == "yaml":
        kind = rng.choice(("pipelines", "devices"))
        data = rng.choice(yaml_seeds[kind])
        for _ in range(rng.randint(1, 3)):
            data = ft.MUTATORS["yaml"](data, rng, 1 << 20) or data
        if rng.random() < 0.1:
            data = data.decode("utf-8", "replace").encode(rng.choice(("utf-16", "latin-1", "utf-32")))
        flag = "-p" if kind == "pipelines" else "-d"
        return {"files": {"spec.yaml": data}, "example": True,
                "argv": ["compile", "example.onnx", "-o", "out", "-q", "-t", "opencl", flag, "spec.yaml"], "what": kind}
    if fam == "trace":
        data = trace_seed
        for _ in range(rng.randint(1, 4)):
            data = ft.MUTATORS["trace"](data, rng, 1 << 22) or data
        if rng.random() < 0.2:
            data = gzip.compress(data)
            if rng.random() < 0.5:
                data = data[:rng.randrange(10, len(data))]
        return {"files": {"t.json": data}, "argv": ["estimate", "--trace", "t.json", "-q"], "what": "trace"}
    raise ValueError(fam)


_SHAPES = ("x=1x3x32x32", "input=0x3x32x32", "input=-1x3x32x32", "input=1x3", "input=1x3x32x32x1",
           "input=99999999999999999999x3x32x32", "input=1x3x2x2", "input=", "=1", "input=1e3x3x32x32",
           "input=1x3x32x32,input=2x3x32x32", "input=1x3x[/]x32", "input=1x3x\u221ex32", "input=2**40x3x1x1",
           "input=1x3x65536x65536", "input=1x3x1x1", "input=1 x3x32x32", "input=0x0")


def _binding_case(rng, ft) -> dict:
    import numpy as np

    kind = rng.choice(("shape", "npz", "artifact"))
    if kind == "shape":
        shp = rng.choice(_SHAPES)
        return {"files": {}, "example": True, "what": "shape",
                "argv": ["compile", "example.onnx", "-o", "out", "-q", "-t", "opencl", "--shape", shp]}
    if kind == "npz":
        good = np.random.RandomState(0).randn(1, 3, 32, 32).astype(np.float32)
        choice = rng.choice(("name", "dtype", "shape", "nan", "int", "scalar", "extra", "garbage"))
        arrays = {"input": good}
        if choice == "name":
            arrays = {"[/]x": good}
        elif choice == "dtype":
            arrays = {"input": good.astype(rng.choice((np.float64, np.int64, np.complex64, np.bool_, np.float16)))}
        elif choice == "shape":
            arrays = {"input": good.reshape(rng.choice(((3, 32, 32), (1, 3, 16, 64), (1, 3, 32, 32, 1))))}
        elif choice == "nan":
            arrays = {"input": np.full_like(good, rng.choice((np.nan, np.inf, 3e38)))}
        elif choice == "int":
            arrays = {"input": np.full((1, 3, 32, 32), 2**40, np.int64)}
        elif choice == "scalar":
            arrays = {"input": np.float32(1)}
        elif choice == "extra":
            arrays = {"input": good, "more": good}
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        data = buf.getvalue() if choice != "garbage" else buf.getvalue()[:rng.randrange(10, 200)]
        return {"files": {"in.npz": data}, "artifact": True, "what": f"npz-{choice}",
                "argv": ["run", "art", "-i", "in.npz", "-q", "-t", "opencl"]}
    how = rng.choice(("plan", "plan", "plan", "missing", "truncate", "garbage"))
    victim = rng.choice(("plan.json", "weights.bin", "kernels.cl", "kernels.cu"))
    return {"files": {}, "artifact": True, "what": f"artifact-{how}-{victim if how != 'plan' else ''}",
            "tamper": {"how": how, "file": victim, "seed": rng.randrange(2**31)},
            "argv": ["run", "art", "-q", "-t", "opencl"]}


# -- running one case (worker process) ---------------------------------------------------------

_ART = None


def run_case(task: dict) -> dict:
    import contextlib
    import os
    import shutil
    import tempfile

    from dlcc.cli import main

    global _ART
    example = ROOT / "examples" / "resnet-tiny.onnx"
    with tempfile.TemporaryDirectory(prefix="dlcc-hostile-") as tmp:
        d = Path(tmp)
        for name, data in task["files"].items():
            (d / name).write_bytes(data)
        if task.get("example"):
            shutil.copy(example, d / "example.onnx")
        if task.get("artifact"):
            if _ART is None:  # one good artifact per worker, copied per case
                _ART = Path(tempfile.mkdtemp(prefix="dlcc-hostile-art-")) / "art"
                import dlcc

                dlcc.compile(example, _ART, target="opencl")
            shutil.copytree(_ART, d / "art")
            if task.get("tamper"):
                _tamper(d / "art", task["tamper"])
        out, errbuf = io.StringIO(), io.StringIO()
        cwd = os.getcwd()
        os.chdir(d)
        code = None
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(errbuf):
                try:
                    main(task["argv"])
                    code = 0
                except SystemExit as e:
                    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
        except BaseException as e:  # escaped main(): the worst case
            import traceback

            errbuf.write("Traceback (escaped main)\n" + traceback.format_exc())
            code = -1
        finally:
            os.chdir(cwd)
        text = out.getvalue() + errbuf.getvalue()
    if "Traceback" in text or code in (70, -1):
        verdict = "traceback"
    elif code == 0:
        verdict = "ok"
    elif code == 2:
        verdict = "refused"
    elif code == 1 and task["argv"][0] == "verify":
        verdict = "wrong"
    elif code == 130:
        verdict = "hang"
    else:
        verdict = f"exit-{code}"
    return {"verdict": verdict, "code": code, "output": text[-3000:]}


def _tamper(art: Path, t: dict) -> None:
    from dlcc.testing import fuzz_targets as ft

    rng = random.Random(t["seed"])
    how, f = t["how"], art / t["file"]
    if how == "plan":
        data = (art / "plan.json").read_bytes()
        for _ in range(rng.randint(1, 3)):
            data = _mutate_plan(data, rng) or data
        (art / "plan.json").write_bytes(data)
    elif how == "missing":
        if f.exists():
            f.unlink()
    elif how == "truncate":
        if f.exists():
            b = f.read_bytes()
            f.write_bytes(b[:rng.randrange(0, max(1, len(b)))])
    else:
        f.write_bytes(bytes(rng.randrange(256) for _ in range(rng.randint(0, 300))))


def _mutate_plan(data: bytes, rng) -> bytes | None:
    from dlcc.testing.fuzz_targets import _edge_value, _mutate_tree

    try:
        doc = json.loads(data)
    except ValueError:
        return None
    # mostly where the executor looks: launches, storages, inputs/outputs, kernels, meta checks
    key = rng.choice(["launches", "launches", "storages", "inputs", "outputs", "kernels", "meta", None])
    if key is None or key not in doc:
        doc = _mutate_tree(doc, rng)
    elif rng.random() < 0.1:
        doc[key] = _edge_value(rng)
    else:
        doc[key] = _mutate_tree(doc[key], rng)
    return json.dumps(doc).encode()


# -- driver --------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=sum(FAMILIES.values()))
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per case before it is a hang")
    ap.add_argument("--show", default="wrong,traceback,crash,hang", help="verdicts whose output is printed")
    ap.add_argument("--json", type=Path, help="write every case's verdict here")
    ap.add_argument("--models", type=Path, nargs="*", default=[],
                    help="more ONNX files to mutate in the onnx families (e.g. .cache/models/*-small.onnx)")
    args = ap.parse_args()
    fams = [f for f in args.families.split(",") if f]
    unknown = [f for f in fams if f not in FAMILIES]
    if unknown:
        ap.error(f"unknown families {unknown}; choose from {list(FAMILIES)}")
    from dlcc.testing.pool import run_tasks

    cases = build_cases(args.cases, args.seed, fams, args.models)
    tasks = dict(cases)
    t0 = time.time()
    done = [0]

    def progress(key, res):
        done[0] += 1
        if done[0] % 50 == 0 or done[0] == len(cases):
            print(f"  {done[0]}/{len(cases)} cases, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)

    sys.path.insert(0, str(ROOT / "scripts"))  # the workers import this file as module hostile_corpus
    results = run_tasks(cases, "hostile_corpus:run_case",
                        workers=args.workers, timeout=args.timeout, on_result=progress, max_cases=150)
    table: dict = {f: {} for f in fams}
    show = set(args.show.split(","))
    rows = {}
    for key, res in results.items():
        fam = key.rsplit("-", 1)[0]
        v = ("hang" if "hang" in res else "crash" if "died" in res else
             "harness-error" if "harness_error" in res else res["verdict"])
        table[fam][v] = table[fam].get(v, 0) + 1
        rows[key] = {"verdict": v, "what": tasks[key].get("what"), "argv": tasks[key]["argv"]}
        if v in show:
            print(f"--- {key} ({tasks[key].get('what')}): {v}\n{res.get('output') or res}\n")
    verdicts = sorted({v for t in table.values() for v in t})
    print(f"\n{len(cases)} cases in {time.time() - t0:.0f} s (seed {args.seed})")
    print("family".ljust(16) + "".join(v.rjust(16) for v in verdicts))
    for fam in fams:
        print(fam.ljust(16) + "".join(str(table[fam].get(v, 0)).rjust(16) for v in verdicts))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    bad = sum(n for t in table.values() for v, n in t.items() if v in BAD or v.startswith(("exit-", "harness")))
    print(f"failing (wrong, traceback, crash, hang, other exits): {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
