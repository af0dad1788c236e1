"""Every emitted kernel in Rammer's rOperator form: a device function
`NAME_task(args..., const int task_id, const int thread_id, LPTR float* smem)` plus a thin KERNEL
that runs task = block.

Why a rewrite of the text rather than a second emitter per op: every emitter already writes its
kernel against the portable dialect (THREAD_ID, BLOCK_ID, BLOCK_DIM, GRID_DIM, SHARED arrays), and
those are exactly the things an rTask must receive from its caller instead of reading from the
hardware. So one rewrite turns any kernel into an rOperator:

  - THREAD_ID -> thread_id, BLOCK_ID -> task_id;
  - BLOCK_DIM -> the kernel's block size, GRID_DIM -> its task count (both fixed by the plan;
    a spin kernel keeps GRID_DIM, since the runtime clamps its grid);
  - each `SHARED T name[n];` -> a pointer into the caller's `smem` at an aligned offset (OpenCL
    allows __local arrays only at kernel scope, and a persistent kernel's shared memory is the
    max over its rTasks, handed to whichever task runs).

GEMM and Conv are written as rOperators from the start (kernels/gemm.py) and are kept as they are.
Kernels with a grid barrier (AStitch's Global scheme) convert too, but are flagged `spin`: inside
a persistent kernel their barrier would be the rProgram's own sync, so Rammer must not schedule
them as ordinary rTasks.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import DlccError

_KERNEL = re.compile(r"KERNEL void (LAUNCH_BOUNDS(?:_SM)?\([\d, ]+\) )?(\w+)\(")
_SHARED = re.compile(r"SHARED (\w+) (\w+)\[(\d+)\];")
_BYTES = {"float": 4, "int": 4, "f16": 2, "bf16": 2, "i64": 8, "u8": 1, "i8": 1}
_ALIGN = 16


class NotAnROperator(DlccError):
    """The kernel text does not have the shape the rewrite expects (a dlcc bug, reported as such)."""


@dataclass
class ROperator:
    name: str  # the kernel's entry point; the task function is f"{name}_task"
    tasks: int  # rTasks per launch (the kernel's grid)
    threads: int  # threads per rTask (the kernel's block)
    smem_bytes: int  # shared memory one rTask needs
    spin: bool  # waits on other tasks (grid barrier): not an ordinary rTask
    code: str  # device functions, the task function, and the thin KERNEL
    device_code: str = ""  # the same without the thin KERNEL: what a persistent kernel includes

    @property
    def task_fn(self) -> str:
        return f"{self.name}_task"


def _close(text: str, start: int, open_ch: str, close_ch: str) -> int:
    """Index of the bracket that closes the one at `start`."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == open_ch:
            depth += 1
        elif text[i] == close_ch:
            depth -= 1
            if depth == 0:
                return i
    raise NotAnROperator("unbalanced brackets in kernel text")


def to_roperator(name: str, code: str, block: int, tasks: int, smem_bytes: int = 0) -> ROperator:
    """The rOperator form of kernel `name` (text `code`, launched as `tasks` blocks of `block`)."""
    m = next((m for m in _KERNEL.finditer(code) if m.group(2) == name), None)
    if m is None:
        raise NotAnROperator(f"no KERNEL {name} in its text")
    spin = "dlcc_grid_sync(" in code
    if re.search(rf"\b{re.escape(name)}_task\(", code[:m.start()]):
        return ROperator(name, tasks, block, smem_bytes, spin, code, code[:m.start()])  # GEMM/Conv: already one
    p_open = m.end() - 1
    p_close = _close(code, p_open, "(", ")")
    params = code[p_open + 1:p_close].strip()
    b_open = code.index("{", p_close)
    b_close = _close(code, b_open, "{", "}")
    head, body, tail = code[:m.start()], code[b_open + 1:b_close], code[b_close + 1:]
    if _KERNEL.search(tail) or _KERNEL.search(head):
        raise NotAnROperator(f"kernel text of {name} holds more than one KERNEL")
    offset = 0

    def shared(mm: re.Match) -> str:
        nonlocal offset
        ctype, var, n = mm.group(1), mm.group(2), int(mm.group(3))
        if ctype not in _BYTES:
            raise NotAnROperator(f"shared array of unknown type {ctype} in {name}")
        at = offset
        offset += -(-n * _BYTES[ctype] // _ALIGN) * _ALIGN
        return f"LPTR {ctype}* {var} = (LPTR {ctype}*)((LPTR char*)smem + {at});"

    body = _SHARED.sub(shared, body)
    subs = [("THREAD_ID", "thread_id"), ("BLOCK_ID", "task_id"), ("BLOCK_DIM", str(block))]
    if not spin:  # a spin kernel's grid is clamped at run time to the resident blocks: keep reading it
        subs.append(("GRID_DIM", str(tasks)))
    for macro, value in subs:
        body = re.sub(rf"\b{macro}\b", value, body)
    if "SHARED" in body:
        raise NotAnROperator(f"a shared declaration in {name} is not of the form `SHARED T name[n];`")
    args = ", ".join(p.split()[-1].lstrip("*") for p in params.split(",") if p.strip())
    bounds = m.group(1) or ""
    sep = ", " if params else ""
    device = (f"{head}DEVICE void {name}_task({params}{sep}const int task_id, const int thread_id, LPTR float* smem) {{"
              f"{body}}}\n\n")
    text = (f"{device}KERNEL void {bounds}{name}({params}) {{\n"
            f"    SHARED float smem[{max(1, offset // 4)}];\n"
            f"    {name}_task({args}{sep}BLOCK_ID, THREAD_ID, smem);\n}}\n{tail}")
    return ROperator(name, tasks, block, max(smem_bytes, offset), spin, text, device + tail)


def plan_roperators(plan: dict, kernel_codes: list[str]) -> list[ROperator]:
    """Every kernel of a compiled plan as an rOperator, in the plan's kernel order. Its task count
    is its launches' grid; a kernel launched with several grids has no single task count and is
    reported as such (dlcc's emitters bake sizes into the text, so that is a bug)."""
    grids: dict[str, set[int]] = {}
    for L in plan["launches"]:
        grids.setdefault(L["kernel"], set()).add(L["grid"])
    out = []
    for k, code in zip(plan["kernels"], kernel_codes):
        g = grids.get(k["name"], set())
        if len(g) > 1:
            raise NotAnROperator(f"kernel {k['name']} is launched with grids {sorted(g)}")
        out.append(to_roperator(k["name"], code, k["block"], next(iter(g), 1), k.get("smem_bytes", 0)))
    return out


def task_form_source(plan: dict, kernel_codes: list[str], dialect: str) -> str:
    """The whole translation unit with every kernel in rOperator form (each KERNEL only calls its
    task function): the same plan runs on it, which is how the rewrite is checked."""
    from ..backends.source import render

    return render([r.code for r in plan_roperators(plan, kernel_codes)], dialect)
