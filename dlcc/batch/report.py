"""Batch results as CI reads them: JUnit XML (one testcase per job), a JSON summary with the same
rows, and the rich summary table.

JUnit mapping: a job that met its expectation passes; one that did not is a <failure> whose message
is the one-paragraph error; an internal dlcc error is an <error>. <system-out> carries the plan
summary and the job's log tail, so a CI UI shows why without opening artifacts.
"""
from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path

#: JUnit XML 1.0 forbids most control characters; compiler logs can hold them.
_BAD_XML = dict.fromkeys(c for c in range(32) if c not in (9, 10, 13))


def _clean(s: str | None) -> str:
    return (s or "").translate(_BAD_XML)


def junit_xml(rows: list[dict], suite: str, seconds: float, not_started: list[dict] = ()) -> bytes:
    """`not_started`: jobs --fail-fast never ran (name, pipeline), reported as skipped testcases."""
    failures = sum(1 for r in rows if not r["met"] and r["outcome"] != "error")
    errors = sum(1 for r in rows if not r["met"] and r["outcome"] == "error")
    n = len(rows) + len(not_started)
    root = ET.Element("testsuites", name="dlcc batch", tests=str(n), failures=str(failures),
                      errors=str(errors), time=f"{seconds:.3f}")
    ts = ET.SubElement(root, "testsuite", name=suite, tests=str(n), failures=str(failures),
                       errors=str(errors), skipped=str(len(not_started)), time=f"{seconds:.3f}")
    for j in not_started:
        tc = ET.SubElement(ts, "testcase", classname=f"dlcc.batch.{j['pipeline']}", name=j["name"], time="0")
        ET.SubElement(tc, "skipped", message="not started: --fail-fast stopped the batch after an unmet expectation")
    for r in rows:
        tc = ET.SubElement(ts, "testcase", classname=f"dlcc.batch.{r['pipeline']}", name=r["name"],
                           time=f"{r['seconds']:.3f}")
        if not r["met"]:
            want = {"pass": "pass", "unsupported": "be reported unsupported", "fail": "fail"}[r["expect"]]
            msg = _clean(f"expected to {want}, but {r['outcome']}" + (f": {r['error']}" if r["error"] else ""))
            el = ET.SubElement(tc, "error" if r["outcome"] == "error" else "failure",
                               message=msg.splitlines()[0][:500] if msg else r["outcome"], type=r["outcome"])
            el.text = msg
        out = ET.SubElement(tc, "system-out")
        out.text = _clean(summary_line(r) + "\n" + (r.get("stdout") or ""))
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def summary_line(r: dict) -> str:
    parts = [f"{r['outcome']} (expected {r['expect']}) in {r['seconds']:.2f} s"]
    if r.get("launches") is not None:
        parts.append(f"{r['launches']} launches")
    if r.get("segments"):
        parts.append(f"{r['segments']} segments, {r['fallback_segments']} on the fallback")
    if r.get("dram_bytes") and r.get("lower_bound_bytes"):
        parts.append(f"DRAM {r['dram_bytes'] / r['lower_bound_bytes']:.2f}x the lower bound")
    if r.get("verify_max_abs_err") is not None:
        parts.append(f"verify max abs err {r['verify_max_abs_err']:.3g}")
    if r.get("artifact"):
        parts.append(f"artifact {r['artifact']}")
    return "; ".join(parts)


def summary(rows: list[dict], seconds: float, shard: str | None) -> dict:
    return {"jobs": len(rows), "met": sum(r["met"] for r in rows), "not_met": sum(not r["met"] for r in rows),
            "seconds": round(seconds, 3), "shard": shard, "passed": all(r["met"] for r in rows),
            "rows": [{k: v for k, v in r.items() if k != "stdout"} for r in rows]}


def write_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    from ..artifact import atomic_file

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())

