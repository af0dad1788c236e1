#!/usr/bin/env python3
"""Which of the minimal kernels in dlcc/testing/pocl_kernels.py this OpenCL driver gets wrong,
under each of PoCL's work-group methods. On PoCL 3.1 (Debian 12) VECTORIZER is wrong under
"loopvec" (PoCL's default, which dlcc keeps) and right under "loops"; PEELED is wrong under
both; ONCE and GRID_TURNS, the forms dlcc emits instead, and VECTORIZER's body in those forms,
are right under both. dlcc builds every kernel whose loops around barriers depend on the grid
with -cl-opt-disable (backends/opencl.py unoptimised_kernels).

    .venv/bin/python scripts/pocl_miscompiles.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from dlcc.testing.pocl_kernels import KERNELS, run_with_method  # noqa: E402


def main() -> int:
    import pyopencl as cl

    plat = cl.get_platforms()[0]
    t = Table(title=f"{plat.name.strip()} {plat.version.strip()}: o[0] of each kernel")
    methods = ["loopvec", "loops"]
    for c in ["kernel", "expected"] + methods:
        t.add_column(c)
    for name in KERNELS:
        cells, want = [], None
        for m in methods:
            got, want = run_with_method(name, m)
            cells.append(f"{got:g} " + ("[green]right[/]" if got == want else "[red]WRONG[/]"))
        t.add_row(name, f"{want:g}", *cells)
    Console().print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
