"""Graph passes, registered by name (TVM-style) and run in the order a pipeline YAML names them.

A pass is a function over the CompileState plus a pydantic model of its options, so a pipeline
file with a misspelt option fails at load time with the file and field, not halfway through a
compile. `PASSES` is the registry; an unknown name lists the valid ones.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import ConfigError


class NoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")


@dataclass
class CompileState:
    """Everything passes share; each pass reads what earlier ones left and adds its own part."""

    graph: Any
    device: Any
    ctx: Any = None  # LowerCtx once `lower` ran: kernels, launches, aliases
    memory: Any = None  # MemoryPlan once `memplan` ran
    profile_db: Any = None  # a ProfileDB of measured launch times (--profile-db): rammer prices rTasks with it
    precision: str = "fp32"  # what GEMMs compute at (config.PRECISIONS); `lower` picks their templates by it
    fp32_ops: tuple = ()  # op types whose GEMMs stay float32 at a tensor-core precision (PipelineSpec.fp32_ops)
    half_activations: bool = True  # at fp16/bf16, activations stored in the half type (PipelineSpec.half_activations)
    graphs: bool = False  # the plan is replayed as one CUDA graph (PipelineSpec.graphs on CUDA): no host cost per launch
    joins: bool = False  # the pipeline has `rammer`, which may join launches into persistent kernels
    log: list[str] = field(default_factory=list)


@dataclass
class Pass:
    name: str
    run: Callable[[CompileState, Any], None]
    options: type[BaseModel] = NoOptions
    doc: str = ""
    after: tuple = ()  # passes that must run earlier in the pipeline (what this one reads)
    before: tuple = ()  # passes that, where present, must run later (they consume what this one changes)

    def check_options(self, opts: dict, where: str) -> BaseModel:
        try:
            return self.options.model_validate(opts or {})
        except ValidationError as e:
            msgs = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors())
            raise ConfigError(f"{where}: {msgs}") from None


PASSES: dict[str, Pass] = {}


def register_pass(name: str, options: type[BaseModel] = NoOptions, after: tuple = (), before: tuple = ()):
    """`after`/`before` declare the pass's place in a pipeline; check_order enforces them when a
    pipeline loads, so a pass never runs on state it does not expect."""
    def deco(fn):
        PASSES[name] = Pass(name, fn, options, (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else "",
                            tuple(after), tuple(before))
        return fn
    return deco


#: Passes every pipeline has: lowering makes the kernels, memory planning places their buffers.
REQUIRED = ("lower", "memplan")


def check_order(names: list[str], where: str) -> None:
    """One ConfigError naming the first misplaced pass (`where`: the file, or the pipeline's
    name): a pass listed twice, one before a pass it must follow, or a required one missing."""
    seen: dict[str, int] = {}
    for k, name in enumerate(names):
        if name in seen:
            raise ConfigError(f"{where}: passes.{k}.name: {name!r} is already passes.{seen[name]}; each pass runs once")
        seen[name] = k
    for k, name in enumerate(names):
        p = PASSES.get(name)
        if p is None:
            continue
        for a in p.after:
            if a in REQUIRED + tuple(names) and seen.get(a, len(names)) > k:
                raise ConfigError(f"{where}: passes.{k}.name: {name!r} must come after {a!r}")
        for b in p.before:
            if seen.get(b, len(names)) < k:
                raise ConfigError(f"{where}: passes.{k}.name: {name!r} must come before {b!r}")
    missing = [r for r in REQUIRED if r not in seen]
    if missing:
        raise ConfigError(f"{where}: passes: the pipeline must include {' and '.join(map(repr, missing))}")


from . import astitch, fold_bn, lower, memplan, rammer, simplify  # noqa: E402,F401  (registration)
