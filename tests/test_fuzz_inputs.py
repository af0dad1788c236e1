"""Every input the coverage-guided fuzzer (scripts/fuzz_inputs.py) found crashing dlcc, replayed
through the same target: each is now accepted or refused with a DlccError, never another
exception. The seeds the fuzzer starts from are replayed too (they must be accepted)."""
from __future__ import annotations

from pathlib import Path

import pytest

from dlcc.testing.fuzz_targets import TARGETS, accepts, seeds

HERE = Path(__file__).resolve().parent / "fuzz_inputs"
CASES = [(t, p) for t in TARGETS if (HERE / t).is_dir() for p in sorted((HERE / t).iterdir()) if p.is_file()]


@pytest.mark.parametrize("target,path", CASES, ids=[f"{t}/{p.name}" for t, p in CASES])
def test_found_by_the_fuzzer(target, path):
    depth = {"depth": "compile"} if target == "onnx" else {}
    accepts(target, path.read_bytes(), **depth)  # a DlccError is caught there; anything else fails here


@pytest.mark.parametrize("target", TARGETS)
def test_the_fuzzers_seeds_are_accepted(target):
    """A seed that dlcc refuses would make the fuzzer explore only error paths."""
    for k, s in enumerate(seeds(target)):
        assert accepts(target, s, **({"depth": "compile"} if target == "onnx" else {})), f"{target} seed {k}"
