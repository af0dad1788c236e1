#!/usr/bin/env python3
"""Coverage-guided fuzzing of dlcc's input readers with atheris (libFuzzer for Python).

    pip install -e '.[fuzz]'          # atheris
    python scripts/fuzz_inputs.py --target onnx  --minutes 10
    python scripts/fuzz_inputs.py --target trace --runs 100000
    python scripts/fuzz_inputs.py --target yaml  --minutes 2
    python scripts/fuzz_inputs.py --target onnx --replay tests/fuzz_inputs/onnx   # no atheris needed

Targets and the property they check are in dlcc/testing/fuzz_targets.py: every input is accepted
or refused with a DlccError; any other exception, a hang (`--timeout`, default 20 s per input) or a
runaway allocation (`--rss-mb`) is a crash. The fuzzer starts from small real files (the bundled
example model and exporter-style graphs, the built-in YAML configs, a slice of a real PyTorch
profiler trace) and mutates them structurally: protobuf fields through their descriptors, JSON and
YAML trees value by value, and falls back to byte-level mutation where a mutant no longer parses.

A crash is written to --out (default .cache/fuzz/TARGET/crash-*) and the run stops, printing the
command that replays it. Fix it at its root, then copy the file into tests/fuzz_inputs/TARGET/:
tests/test_fuzz_inputs.py replays every file there in the default suite.

At the end it prints the number of executions, the inputs that raised a DlccError (refused) and
those accepted, and the coverage corpus size. Exit code 0: no crash.
"""
from __future__ import annotations

import argparse
import atexit
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", choices=("onnx", "yaml", "trace"), required=True)
    ap.add_argument("--minutes", type=float, default=None, help="stop after this long (default: 5 unless --runs)")
    ap.add_argument("--runs", type=int, default=None, help="stop after this many executions")
    ap.add_argument("--depth", choices=("load", "compile"), default="load",
                    help="onnx: stop after the import (load) or go on through lowering and memory planning")
    ap.add_argument("--fold", action="store_true", help="onnx: include onnxruntime's constant folding (slower)")
    ap.add_argument("--timeout", type=int, default=20, help="seconds one input may take before it counts as a hang")
    ap.add_argument("--rss-mb", type=int, default=4096, help="memory limit; more counts as a crash")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help="work folder (corpus/ and crash files); default "
                    ".cache/fuzz/TARGET")
    ap.add_argument("--replay", type=Path, nargs="*", help="run these files or folders once, without atheris")
    ap.add_argument("--seeds", type=Path, nargs="*", default=[],
                    help="more starting inputs (e.g. .cache/models/*-small.onnx): real files of the target's family")
    args = ap.parse_args()

    kw = {"depth": args.depth, "fold": args.fold} if args.target == "onnx" else {}
    if args.replay is not None:
        from dlcc.testing import fuzz_targets as ft

        return _replay(ft, args.target, args.replay, kw)
    try:
        import atheris
    except ImportError:
        print("atheris is not installed: pip install -e '.[fuzz]' (or pip install atheris)", file=sys.stderr)
        return 2
    # Coverage comes from instrumented bytecode, and only modules first imported inside this block
    # are instrumented: so no dlcc import before it.
    with atheris.instrument_imports(include=["dlcc"]):
        from dlcc.testing import fuzz_targets as ft

        ft.preload()
    out = args.out or ROOT / ".cache" / "fuzz" / args.target
    corpus = out / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    for k, s in enumerate(ft.seeds(args.target) + [p.read_bytes() for p in args.seeds]):
        (corpus / f"seed-{k}").write_bytes(s)
    stats = {"execs": 0, "refused": 0, "accepted": 0, "t0": time.time()}
    mutate = ft.MUTATORS[args.target]
    max_len = 1 << 20

    def one_input(data: bytes) -> None:
        stats["execs"] += 1
        if ft.accepts(args.target, data, **kw):
            stats["accepted"] += 1
        else:
            stats["refused"] += 1

    def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
        rng = random.Random(seed)
        if rng.random() < 0.75:
            m = mutate(data, rng, max_size)
            if m is not None:
                return m
        return atheris.Mutate(data, max_size)

    @atexit.register
    def report() -> None:
        dt = time.time() - stats["t0"]
        print(f"\nfuzz_inputs --target {args.target}: {stats['execs']} executions in {dt:.0f} s "
              f"({stats['execs'] / max(dt, 1e-9):.0f}/s): {stats['accepted']} accepted, {stats['refused']} refused "
              f"with a DlccError; corpus {len(list(corpus.iterdir()))} inputs in {corpus}", flush=True)

    minutes = args.minutes if args.minutes is not None else (None if args.runs else 5.0)
    flags = [sys.argv[0], str(corpus), f"-timeout={args.timeout}", f"-rss_limit_mb={args.rss_mb}",
             f"-max_len={max_len}", f"-seed={args.seed}", f"-artifact_prefix={out}/", "-print_final_stats=1"]
    if minutes is not None:
        flags.append(f"-max_total_time={int(minutes * 60)}")
    if args.runs is not None:
        flags.append(f"-runs={args.runs}")
    os.environ.setdefault("ORT_LOGGING_LEVEL", "4")
    atheris.Setup(flags, one_input, custom_mutator=custom_mutator)
    atheris.Fuzz()
    return 0


def _replay(ft, target: str, paths: list[Path], kw: dict) -> int:
    files = [f for p in paths for f in (sorted(p.iterdir()) if p.is_dir() else [p]) if f.is_file()]
    bad = 0
    for f in files:
        try:
            verdict = "accepted" if ft.accepts(target, f.read_bytes(), **kw) else "refused"
        except Exception as e:  # the bug the fuzzer found: report and go on
            bad += 1
            verdict = f"CRASH {type(e).__name__}: {str(e)[:200]}"
        print(f"{f}: {verdict}")
    print(f"{len(files)} input(s), {bad} crash(es)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
