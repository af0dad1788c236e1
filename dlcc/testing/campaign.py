"""A fuzzing campaign: many generated graphs through the oracle, in worker processes, with a
summary, JSON and JUnit reports, and the failures shrunk into regression cases.

`scripts/fuzz.py` is its command line; tests/test_fuzz.py runs `check_case_task` in-process on a
fixed batch.
"""
from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field

from .oracle import FAILURES

#: Every verdict, in the order reports list them.
STATUSES = ("pass", "mismatch", "crash", "hang", "spill", "refused", "unstable")


def case_name(key: tuple) -> str:
    """A case's name in reports: "graph-SEED", or "unsupported-SEED" for a graph dlcc must refuse
    (`key` is ("g", seed) or ("u", seed), as oracle.fuzz_task's callers key them)."""
    kind, seed = key
    return f"{'unsupported' if kind == 'u' else 'graph'}-{seed}"


@dataclass
class Failure:
    case: str  # "graph-SEED" or "unsupported-SEED"
    seed: int
    target: str
    config: str
    status: str
    detail: str
    case_seed: int | None = None


@dataclass
class Campaign:
    """Counts and failures of a run; fed one case record at a time (`add`)."""

    graphs: int = 0
    invalid: int = 0
    generator_bugs: list = field(default_factory=list)
    harness_errors: list = field(default_factory=list)
    runs: Counter = field(default_factory=Counter)  # (target, status) -> configurations
    unique_runs: Counter = field(default_factory=Counter)  # (target, status) -> distinct plans run
    nodes: int = 0
    ops: Counter = field(default_factory=Counter)
    failures: list = field(default_factory=list)
    unsupported: Counter = field(default_factory=Counter)  # status -> unsupported-on-purpose graphs
    records: list = field(default_factory=list)
    started: float = field(default_factory=time.time)
    earlier_seconds: float = 0.0  # spent by the runs this one resumes

    @classmethod
    def resumed(cls, report: dict) -> "Campaign":
        """The campaign a JSON report (`json_report`) was written from, to go on with: its case
        records are replayed, so counts and failures are what they were. Cases the harness itself
        failed on (a generator bug, a harness error) never reached dlcc: they are dropped, so the
        resumed run, with the harness fixed, runs them again."""
        camp = cls(earlier_seconds=float(report.get("summary", {}).get("seconds", 0.0)))
        for rec in report.get("cases", []):
            if "generator_bug" in rec or "harness_error" in rec:
                continue
            rec = dict(rec)
            name, seed = rec.pop("case"), rec.pop("seed")
            camp.add(("u" if name.startswith("unsupported-") else "g", seed), rec)
        return camp

    @property
    def seconds(self) -> float:
        """Run time so far, with that of the runs this one resumes."""
        return self.earlier_seconds + time.time() - self.started

    def done(self) -> set:
        """The case names already run: "graph-SEED" and "unsupported-SEED"."""
        return {r["case"] for r in self.records}

    def add(self, key: tuple, rec: dict) -> None:
        """One case's record; `key` is ("g", seed) for a generated graph, ("u", seed) for a graph
        dlcc must refuse (oracle.fuzz_task)."""
        kind, seed = key
        name = case_name(key)
        self.records.append({"case": name, "seed": seed, **rec})
        if kind == "u" and "unsupported_kind" in rec:
            self.unsupported[rec["status"]] += 1
            if rec["status"] != "pass":
                self.failures.append(Failure(name, seed, "opencl", "compile", rec["status"], rec.get("detail", "")))
            return
        if "hang" in rec or "died" in rec:
            self.graphs += kind == "g"
            status = "hang" if "hang" in rec else "crash"
            self.runs[("?", status)] += 1
            self.failures.append(Failure(name, seed, "?", "(whole case)", status, rec.get("hang") or rec.get("died")))
            return
        if "harness_error" in rec:
            self.harness_errors.append((name, rec["harness_error"]))
            return
        if "invalid" in rec:
            self.invalid += 1
            return
        if "generator_bug" in rec:
            self.generator_bugs.append((name, rec["generator_bug"]))
            return
        self.graphs += 1
        self.nodes += rec.get("nodes", 0)
        self.ops.update(rec.get("ops", []))
        for target, verdicts in rec.get("verdicts", {}).items():
            for v in verdicts:
                self.runs[(target, v["status"])] += 1
                if not v.get("same_as"):
                    self.unique_runs[(target, v["status"])] += 1
                if v["status"] in FAILURES:
                    self.failures.append(Failure(name, seed, target, v["config"], v["status"], v.get("detail", ""),
                                                 rec.get("case_seed")))

    @property
    def failed(self) -> bool:
        return bool(self.failures or self.generator_bugs or self.harness_errors)

    def count(self, status: str, unique: bool = False) -> int:
        c = self.unique_runs if unique else self.runs
        return sum(n for (t, s), n in c.items() if s == status)

    def summary(self) -> dict:
        statuses = list(STATUSES)
        return {
            "graphs": self.graphs, "invalid_skipped": self.invalid, "nodes": self.nodes,
            "configurations_run": sum(self.runs.values()), "distinct_plans_run": sum(self.unique_runs.values()),
            **{s: self.count(s) for s in statuses},
            "distinct_plans": {s: self.count(s, unique=True) for s in statuses},
            "unsupported_graphs": dict(self.unsupported),
            "generator_bugs": len(self.generator_bugs), "harness_errors": len(self.harness_errors),
            "failures": len(self.failures),
            "seconds": round(self.seconds, 1),
            "passed": not self.failed,
        }

    def json_report(self, meta: dict) -> str:
        return json.dumps({"meta": meta, "summary": self.summary(),
                           "failures": [f.__dict__ for f in self.failures],
                           "generator_bugs": [{"case": c, "error": e} for c, e in self.generator_bugs],
                           "harness_errors": [{"case": c, "error": e} for c, e in self.harness_errors],
                           "ops": dict(self.ops.most_common()), "cases": self.records}, indent=1, default=str)

    def junit(self, suite: str = "dlcc fuzz") -> bytes:
        """One testcase per graph (and per unsupported-on-purpose graph); a failing verdict is a
        <failure> naming the configuration and target."""
        from ..batch.report import _clean

        by_case: dict[str, list[Failure]] = {}
        for f in self.failures:
            by_case.setdefault(f.case, []).append(f)
        cases = [r for r in self.records if "invalid" not in r]
        n_fail = sum(1 for r in cases if r["case"] in by_case or "generator_bug" in r or "harness_error" in r)
        secs = f"{self.seconds:.3f}"
        root = ET.Element("testsuites", name=suite, tests=str(len(cases)), failures=str(n_fail), time=secs)
        ts = ET.SubElement(root, "testsuite", name=suite, tests=str(len(cases)), failures=str(n_fail), time=secs)
        for r in cases:
            kind = r["case"].split("-")[0]
            tc = ET.SubElement(ts, "testcase", classname=f"dlcc.fuzz.{kind}", name=r["case"], time="0")
            problems = [f"{f.target} {f.config}: {f.status}: {f.detail}" for f in by_case.get(r["case"], [])]
            if "generator_bug" in r:
                problems.append("generator bug: " + r["generator_bug"])
            if "harness_error" in r:
                problems.append("harness error: " + r["harness_error"])
            if problems:
                el = ET.SubElement(tc, "failure", message=_clean(problems[0])[:500], type="fuzz")
                el.text = _clean("\n".join(problems))
        ET.indent(root)
        return ET.tostring(root, encoding="utf-8", xml_declaration=True)
