"""`dlcc batch MANIFEST.yaml`: the command (registered on dlcc.cli's app). Progress goes to stderr (one
overall bar, one line per running job); the summary table or `--json` goes to stdout."""
from __future__ import annotations

import json
import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from rich.markup import escape

from ..errors import ConfigError

_OUTCOME_STYLE = {"passed": "green", "unsupported": "yellow", "failed": "red", "error": "bold red"}


def _cache_cell(r: dict) -> str:
    """hit / miss for the artifact, `+ verify` when a passed verification came from the cache too."""
    cell = {True: "hit", False: "miss"}.get(r.get("cache_hit"), "-")
    return cell + (" + verify" if r.get("verify_cached") else "")


def parse_shard(s: str | None) -> tuple[int, int] | None:
    if s is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", s)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ConfigError(f"--shard {s!r}: want I/N with 1 <= I <= N, e.g. --shard 2/4")
    return int(m.group(1)), int(m.group(2))


def register(app: typer.Typer, out, err) -> None:
    @app.command()
    def batch(manifest: Path = typer.Argument(..., help="YAML manifest of jobs (see docs/batch-and-cache.md)"),
              jobs_n: Optional[int] = typer.Option(None, "-j", "--jobs", min=1, help="worker processes (default: cores)"),
              shard_spec: Optional[str] = typer.Option(None, "--shard", help="run part I of N (e.g. 2/4): a deterministic, "
                                                       "disjoint, cost-balanced split; N machines together run every job once"),
              out_dir: Optional[Path] = typer.Option(None, "--out", "-o", help="artifact directory, one subdirectory "
                                                     "per job (default: MANIFEST stem + '.batch' beside the manifest)"),
              junit: Optional[Path] = typer.Option(None, "--junit", help="write a JUnit XML report here"),
              json_out: bool = typer.Option(False, "--json", help="print the summary as JSON instead of a table"),
              verify: bool = typer.Option(False, "--verify", help="verify every job against onnxruntime "
                                          "(jobs with their own `verify:` keep their tolerances)"),
              fail_fast: bool = typer.Option(False, "--fail-fast", help="start no new job after one misses its expectation"),
              list_only: bool = typer.Option(False, "--list", help="print the expanded (and sharded) jobs; run nothing"),
              cache_dir: Optional[Path] = typer.Option(None, "--cache", help="compile cache shared by the jobs (default: "
                                                       "$DLCC_CACHE_DIR, else ~/.cache/dlcc)"),
              no_cache: bool = typer.Option(False, "--no-cache", help="compile (and verify) every job afresh"),
              timeout: Optional[float] = typer.Option(None, "--timeout", min=1, help="seconds a job may run before its "
                                                      "worker is killed, for jobs without their own `timeout:` (default 1800)"),
              quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress output")):
        """Compile (and optionally verify) every job of a YAML manifest in parallel; JUnit/JSON reports for CI."""
        from . import check_unique, load_manifest, run_batch, shard
        from .manifest import VerifySpec
        from ..cache import default_dir
        from .report import junit_xml, summary, summary_line, write_atomic

        all_jobs = load_manifest(manifest)
        check_unique(all_jobs)
        sh = parse_shard(shard_spec)
        jobs = shard(all_jobs, *sh) if sh else all_jobs
        if verify:
            jobs = [j if j.verify else replace(j, verify=VerifySpec().for_precision(j.precision or "fp32"))
                    for j in jobs]
        if timeout:
            jobs = [j if j.timeout else replace(j, timeout=timeout) for j in jobs]
        label = f"{sh[0]}/{sh[1]}" if sh else None
        if list_only:
            if json_out:
                print(json.dumps({"shard": label, "total": len(all_jobs), "jobs": [j.as_dict() for j in jobs]}))
            else:
                for j in jobs:
                    out.print(escape(f"{j.name}  ({j.model}; cost {j.cost:.3g}, {j.cost_source})"), highlight=False)
                out.print(f"{len(jobs)} of {len(all_jobs)} job(s)" + (f" in shard {label}" if label else ""))
            return
        dest = out_dir or manifest.resolve().parent / f"{manifest.stem}.batch"
        t0 = time.perf_counter()
        progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=err, disable=quiet or json_out, transient=True)
        with progress:
            overall = progress.add_task(f"batch {manifest.name}" + (f" shard {label}" if label else ""), total=len(jobs))
            lines: dict[str, int] = {}

            def started(j):
                lines[j.name] = progress.add_task(escape(f"  {j.name}"), total=None)

            def finished(j, row):
                if j.name in lines:
                    progress.remove_task(lines.pop(j.name))
                progress.advance(overall)
                if not row["met"] and not (quiet or json_out):
                    progress.console.print(f"[red]✗[/] {escape(j.name)}: {escape(row['outcome'])}"
                                           + (f" — {escape((row['error'] or '').splitlines()[0])}" if row["error"] else ""),
                                           highlight=False)

            cache = False if no_cache else str(cache_dir or default_dir())
            rows = run_batch(jobs, str(dest), jobs_n, fail_fast, started, finished, cache=cache)
        seconds = time.perf_counter() - t0
        ran = {r["name"] for r in rows}
        not_started = [j.as_dict() for j in jobs if j.name not in ran]
        if junit:
            write_atomic(junit, junit_xml(rows, f"dlcc batch {manifest.name}" + (f" shard {label}" if label else ""),
                                          seconds, not_started))
        report = summary(rows, seconds, label)
        write_atomic(dest / "summary.json", json.dumps(report, indent=1))
        skipped = len(not_started)
        if json_out:
            print(json.dumps(report))
        elif not quiet:
            t = Table(title=escape(f"dlcc batch {manifest.name}" + (f" (shard {label})" if label else "") + f": {seconds:.1f} s"))
            for c in ("job", "outcome", "expect", "time", "cache", "launches", "DRAM / bound", "verify err"):
                t.add_column(c, justify="right" if c in ("time", "launches", "DRAM / bound", "verify err") else "left",
                             overflow="fold", min_width=12 if c in ("job", "outcome", "expect") else None)
            for r in rows:
                ratio = (f"{r['dram_bytes'] / r['lower_bound_bytes']:.2f}" if r.get("dram_bytes") and
                         r.get("lower_bound_bytes") else "-")
                style = _OUTCOME_STYLE.get(r["outcome"], "")
                t.add_row(escape(r["name"]), f"[{style}]{r['outcome']}[/]" + ("" if r["met"] else " [red](unmet)[/]"),
                          r["expect"], f"{r['seconds']:.1f} s",
                          _cache_cell(r), str(r["launches"] if r["launches"] is not None else
                                             f"{r['segments']} segments" if r.get("segments") else "-"),
                          ratio, f"{r['verify_max_abs_err']:.2g}" if r.get("verify_max_abs_err") is not None else "-")
            out.print(t)
            bad = [r for r in rows if not r["met"]]
            for r in bad:
                out.print(f"[red]{escape(r['name'])}[/]: {escape(summary_line(r))}\n  {escape(r['error'] or '')}\n"
                          f"  log: {escape(r.get('log') or '-')}", highlight=False)
            out.print(f"[bold {'green' if not bad and not skipped else 'red'}]{len(rows) - len(bad)} of {len(jobs)} "
                      f"job(s) met their expectation[/]" + (f"; {skipped} not started (--fail-fast)" if skipped else "")
                      + f"; artifacts in {escape(str(dest))}")
        raise typer.Exit(0 if all(r["met"] for r in rows) and not skipped else 1)
