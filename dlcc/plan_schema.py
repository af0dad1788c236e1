"""The schema of an artifact's plan.json, checked before anything touches a device.

Why: `dlcc run` and `dlcc.load` take a directory from anywhere (a cache, a colleague, a CI job),
and the executor trusts the plan to size buffers and bind kernel arguments. A `plan.json` of
`{}`, an offset past the end of the arena, a grid of -1 or a shape of 8 TiB reached PyOpenCL or
the device as a raw exception or a crash. Here every field the executor reads is typed (pydantic),
every argument view lies inside its storage, every launch names a kernel the plan lists, and the
buffers fit in this machine's memory; a violation is one error naming the field.
"""
import math
import os
import re
from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import DlccError
from .held_types import HELD
from .ir import INT32_MAX as _INT32
from .ir import SUPPORTED_DTYPES
_NAME = re.compile(r"[A-Za-z_]\w*\Z")


class _Open(BaseModel):
    # strict: the executor reads the JSON values themselves, not pydantic's coercions, so a grid of
    # 2000000000.0 must be refused here, not reach pyopencl as a float (std::bad_cast)
    model_config = ConfigDict(extra="allow", allow_inf_nan=False, strict=True)


class IOSpec(_Open):
    name: str
    shape: list[int] = Field(..., description="every dim >= 0")
    dtype: Literal[tuple(SUPPORTED_DTYPES)]  # type: ignore[valid-type]  (a dtype dlcc knows)
    # the model's type where the buffer holds a narrower one (held_types.py)
    model_dtype: Literal[tuple(HELD)] | None = None  # type: ignore[valid-type]


class ViewArg(_Open):
    storage: str
    offset: int = Field(ge=0)
    nbytes: int = Field(ge=0)


class IntArg(_Open):
    value: int = Field(alias="int", ge=-_INT32 - 1, le=_INT32)


class LaunchSpec(_Open):
    kernel: str
    grid: int = Field(ge=1, le=_INT32)
    block: int = Field(ge=1, le=1024)
    args: list[Union[IntArg, ViewArg]]
    grid_sync: bool = False


class KernelSpec(_Open):
    name: str
    block: int = Field(ge=1, le=1024)
    smem_bytes: int = Field(0, ge=0)
    dynamic_smem_bytes: int = Field(0, ge=0, le=1 << 20)  # CUDA dynamic shared memory at each launch
    # read by the runtimes to choose build options (backends/opencl.py builds_unoptimised)
    kind: str | None = None
    tiling: str | None = None


class HostIndexCheck(_Open):
    """An index input the executor checks before a run (Executor.check_indices)."""
    input: int = Field(ge=0)
    name: str
    node: str
    op: str
    bounds: list[int] = Field(min_length=1)
    per_last_axis: bool = False
    shape: list[int] | None = None
    kernel: str | None = None  # the check kernel for a device array (kernels/index_check.py)
    elements: int | None = Field(None, ge=1)


class DeviceIndexCheck(_Open):
    """A site of a device index check (kernels/index_check.py decode_error)."""
    node: str
    op: str
    bounds: list[int] = Field(min_length=1)
    per_last_axis: bool = False
    shape: list[int]


class Meta(_Open):
    index_checks: list[HostIndexCheck] = []
    device_index_checks: list[DeviceIndexCheck] = []
    graphs: bool = False


class PlanFile(_Open):
    storages: dict[str, int]
    inputs: list[IOSpec]
    outputs: list[IOSpec]
    kernels: list[KernelSpec]
    launches: list[LaunchSpec]
    meta: Meta = Meta()


def _nbytes(t: IOSpec) -> int:
    import numpy as np

    n = 1
    for d in t.shape:
        n *= d
    return n * np.dtype(t.dtype).itemsize


def _host_memory() -> "int | None":
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_plan(data, where: str) -> dict:
    """`data` (plan.json, parsed) if it is a plan the executor can run safely; DlccError otherwise."""
    if not isinstance(data, dict):
        raise DlccError(f"{where}: expected a JSON object with the plan's fields, found {type(data).__name__}; "
                        "compile the model again")
    try:
        plan = PlanFile.model_validate(data)
    except ValidationError as e:
        first = e.errors()[:5]
        msgs = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in first)
        more = f" (and {e.error_count() - 5} more)" if e.error_count() > 5 else ""
        raise DlccError(f"{where} is not a dlcc plan: {msgs}{more}; compile the model again") from None
    st = plan.storages
    for need in ("arena", "weights"):
        if need not in st:
            raise DlccError(f"{where}: storages.{need} is missing; compile the model again")
    bad = {k: v for k, v in st.items() if v < 0}
    if bad:
        raise DlccError(f"{where}: storages {bad} have negative sizes")
    for side in ("inputs", "outputs"):
        for k, t in enumerate(getattr(plan, side)):
            if any(d < 0 for d in t.shape):
                raise DlccError(f"{where}: {side}.{k}.shape {t.shape} has a negative dim")
    sizes = dict(st)
    sizes.update({f"input:{k}": _nbytes(t) for k, t in enumerate(plan.inputs)})
    sizes.update({f"output:{k}": _nbytes(t) for k, t in enumerate(plan.outputs)})
    mem = _host_memory()
    total = sum(sizes.values())
    if mem is not None and total > mem:
        raise DlccError(f"{where}: its buffers need {total / 2**30:.1f} GiB, more than this machine's "
                        f"{mem / 2**30:.1f} GiB of memory")
    for k, c in enumerate(plan.meta.index_checks):
        if c.input >= len(plan.inputs):
            raise DlccError(f"{where}: meta.index_checks.{k}.input {c.input} names no input")
        shape = plan.inputs[c.input].shape
        if c.per_last_axis and (not shape or shape[-1] != len(c.bounds)):
            raise DlccError(f"{where}: meta.index_checks.{k} has {len(c.bounds)} bounds for index tuples of "
                            f"{shape[-1] if shape else 0} components")
    names = set()
    for k, kern in enumerate(plan.kernels):
        if not _NAME.match(kern.name):
            raise DlccError(f"{where}: kernels.{k}.name {kern.name!r} is not a kernel identifier")
        names.add(kern.name)
    if plan.meta.device_index_checks and "report" not in st:
        raise DlccError(f"{where}: the plan checks indices on the device but has no report storage (an artifact "
                        "of an older dlcc); compile the model again")
    for k, c in enumerate(plan.meta.index_checks):
        if c.kernel is None:
            continue
        if c.kernel not in names or c.elements != math.prod(plan.inputs[c.input].shape):
            raise DlccError(f"{where}: meta.index_checks.{k} names check kernel {c.kernel!r} over {c.elements} "
                            "elements, which is not a kernel of the plan over its input")
        if not {"errors", "report"} <= set(st):
            raise DlccError(f"{where}: meta.index_checks.{k} has a check kernel but the plan has no errors and "
                            "report storages; compile the model again")
    for j, L in enumerate(plan.launches):
        if L.kernel not in names:
            raise DlccError(f"{where}: launches.{j}.kernel {L.kernel!r} is not among the plan's kernels")
        if L.grid * L.block > _INT32:  # kernels index threads with 32-bit ints
            raise DlccError(f"{where}: launches.{j} has {L.grid} x {L.block} threads, more than 32-bit thread "
                            "indices reach")
        for i, a in enumerate(L.args):
            if isinstance(a, ViewArg):
                size = sizes.get(a.storage)
                if size is None:
                    raise DlccError(f"{where}: launches.{j}.args.{i}: unknown storage {a.storage!r}")
                if a.offset + a.nbytes > size:
                    raise DlccError(f"{where}: launches.{j}.args.{i}: bytes {a.offset}..{a.offset + a.nbytes} lie "
                                    f"outside {a.storage} ({size} bytes)")
    return data


_SIGNATURE = re.compile(r"KERNEL void (?:LAUNCH_BOUNDS(?:_SM)?\([\d, ]+\) )?(\w+)\(([^)]*)\)")


def check_arities(plan: dict, source: str, where: str) -> None:
    """Every launch passes as many arguments as its kernel's signature in `source` takes (each
    emitter writes one signature per kernel, its parameters without parentheses). A launch with
    one argument too few reached pyopencl's set_args; on CUDA it would read a stale pointer."""
    arity = {m.group(1): len([p for p in m.group(2).split(",") if p.strip()])
             for m in _SIGNATURE.finditer(source or "")}
    for j, L in enumerate(plan["launches"]):
        want = arity.get(L["kernel"])
        if want is not None and want != len(L["args"]):
            raise DlccError(f"{where}: launches.{j} passes {len(L['args'])} arguments to kernel {L['kernel']}, which "
                            f"takes {want} (a damaged or hand-edited plan); compile the model again")
