"""`dlcc cache ls | stats | verify | clear`: look into, check and empty the compile cache (dlcc/cache.py)."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

DirOpt = typer.Option(None, "--cache", help="cache directory (default: $DLCC_CACHE_DIR, else ~/.cache/dlcc)")
JsonOpt = typer.Option(False, "--json", help="print JSON")


def register(app: typer.Typer, out) -> None:
    sub = typer.Typer(help="the compile cache: ls | stats | verify | clear", no_args_is_help=True)
    app.add_typer(sub, name="cache")

    from .cli import _human  # (dlcc.cli registers this module once _human is defined)

    def _cache(d):
        from .cache import Cache

        return Cache.of(d or True)

    @sub.command("ls")
    def ls(cache_dir: Optional[Path] = DirOpt, json_out: bool = JsonOpt):
        """One line per entry: kind, key, size, age, and the model/target it was built for."""
        c = _cache(cache_dir)
        rows = c.entries()
        if json_out:
            print(json.dumps(rows))
            return
        t = Table(title=f"dlcc cache {escape(str(c.root))}")
        for c in ("kind", "key", "size", "age", "target / arch"):
            t.add_column(c)
        now = time.time()
        for r in rows:
            p = r["parts"]
            age = f"{(now - r['created']) / 3600:.1f} h" if r["created"] else "?"
            t.add_row(r["kind"], r["key"][:16], _human(r["bytes"]), age, escape(str(p.get("target") or p.get("arch") or "")))
        out.print(t)

    @sub.command()
    def stats(cache_dir: Optional[Path] = DirOpt, json_out: bool = JsonOpt):
        """Entries and bytes per kind."""
        from .cache import KINDS

        c = _cache(cache_dir)
        rows = c.entries()
        agg = {k: {"entries": sum(1 for r in rows if r["kind"] == k), "bytes": sum(r["bytes"] for r in rows if r["kind"] == k)}
               for k in KINDS}
        if json_out:
            print(json.dumps({"root": str(c.root), **agg}))
            return
        for k, v in agg.items():
            out.print(f"{k}: {v['entries']} entr{'y' if v['entries'] == 1 else 'ies'}, {_human(v['bytes'])}")
        out.print(f"in {escape(str(c.root))}")

    @sub.command()
    def verify(cache_dir: Optional[Path] = DirOpt, fix: bool = typer.Option(False, "--fix", help="remove corrupt entries"),
               json_out: bool = JsonOpt):
        """Re-hash every file of every entry against its checksums (exit 1 if any is corrupt)."""
        c = _cache(cache_dir)
        bad = []
        for r in c.entries():
            problem = c.check(Path(r["path"]), full=True)
            if problem:
                bad.append({"kind": r["kind"], "key": r["key"], "problem": problem})
                if fix:
                    c.remove(Path(r["path"]))
        if json_out:
            print(json.dumps({"corrupt": bad, "fixed": fix}))
        else:
            for b in bad:
                out.print(f"[red]corrupt[/] {b['kind']}/{b['key'][:16]}: {escape(b['problem'])}" + (" (removed)" if fix else ""))
            out.print("[green]every entry matches its checksums[/]" if not bad else f"{len(bad)} corrupt entr{'y' if len(bad) == 1 else 'ies'}")
        raise typer.Exit(1 if bad and not fix else 0)

    @sub.command()
    def clear(cache_dir: Optional[Path] = DirOpt):
        """Remove every entry (and the digest memo)."""
        c = _cache(cache_dir)
        n = c.clear()
        out.print(f"removed {n} entr{'y' if n == 1 else 'ies'} from {escape(str(c.root))}")
