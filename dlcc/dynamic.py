"""Models with dynamic dims, compiled for each input shape at call time.

dlcc plans static shapes: every kernel's grid, tiling and arena offset is fixed at compile time.
A model whose inputs have dynamic dims (a batch, a sequence length) is therefore compiled once per
shape. `dlcc.compile(model, dynamic=True)` does that on demand, as torch.compile recompiles when
a guard on an input's shape fails, and TensorRT builds an engine per shape profile:

- the first call with a new set of input shapes compiles a plan for exactly those shapes (the
  same plan `--shape` would give) and keeps it; a call with shapes seen before reuses its plan;
- shapes are checked against the model's signature before anything compiles: the rank, the
  dims the model fixes, and a named dim (`batch`, `sequence_length`) given the same value by
  every input that uses it;
- at most `max_plans` plans stay in memory, the least recently used dropped first, and a warning
  says so once: a model that sees a new shape on every call (a growing KV cache) should bind the
  dim that changes, or use a fixed-size buffer (docs/interop.md);
- with `cache=`, each plan also goes through the content-addressed compile cache, so the next
  process compiles nothing for shapes it has seen.

Calls on one plan are serialised by its executor; calls with different shapes run on different
plans and may run concurrently. Two threads that need the same new plan compile it once.
"""
from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import warnings
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import scratch
from .errors import DlccError, ShapeError
from .executor import InputError, castable, check_input_names, pick_target

log = logging.getLogger(__name__)

#: Plans a dynamic model keeps in memory by default (torch.compile's recompile limit is 8 too).
MAX_PLANS = 8


@dataclass(frozen=True)
class InputSpec:
    """One input of the model's signature. `dims`: an int where the model fixes the dim, the
    symbol's name where a named dim is shared between inputs, None where it is unknown ('?',
    '-1', 0 or no name: bound per input)."""

    name: str
    dtype: str | None
    dims: tuple | None  # None: the model gives no shape at all (any rank)

    @property
    def dynamic(self) -> bool:
        return self.dims is None or any(not isinstance(d, int) for d in self.dims)

    def describe(self) -> str:
        if self.dims is None:
            return f"{self.name}: {self.dtype or '?'}[any rank]"
        return f"{self.name}: {self.dtype or '?'}[{', '.join('?' if d is None else str(d) for d in self.dims)}]"


def read_signature(path) -> list[InputSpec]:
    """The model's inputs (initializers that are also graph inputs left out), read without its
    external data."""
    import onnx

    from .frontend import _anonymous, load_model

    model = load_model(path, external_data=False)
    inits = {i.name for i in model.graph.initializer}
    specs = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        try:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name if tt is not None and tt.elem_type else None
        except KeyError:
            dtype = None  # (the compile names it)
        if tt is None or not tt.HasField("shape"):
            specs.append(InputSpec(vi.name, dtype, None))
            continue
        dims = []
        for d in tt.shape.dim:
            if d.HasField("dim_value") and d.dim_value > 0:
                dims.append(int(d.dim_value))
            elif d.dim_param and not _anonymous(d.dim_param):
                dims.append(d.dim_param)
            else:
                dims.append(None)
        specs.append(InputSpec(vi.name, dtype, tuple(dims)))
    return specs


def shape_of(x) -> tuple[int, ...]:
    """An input value's shape, read without touching its data: numpy, torch (CPU or CUDA), CuPy,
    JAX and pyopencl arrays have `.shape`; anything else is what numpy makes of it."""
    s = getattr(x, "shape", None)
    if s is None:
        s = np.shape(x)
    try:
        return tuple(int(d) for d in s)
    except (TypeError, ValueError):
        raise InputError(f"an input of type {type(x).__name__} has no readable shape ({s!r})") from None


def host_dtype(x, spec: InputSpec):
    """For a host value (numpy, or what numpy converts: lists, numbers), the signature's dtype it
    converts to as a compiled model converts it (numpy's same_kind rule), or an InputError before
    anything compiles. Device arrays (torch, CuPy, pyopencl) are None: the plan checks them
    exactly, dtype and all."""
    if spec.dtype is None or not (isinstance(x, (np.ndarray, np.generic, list, tuple, int, float, bool))):
        return None
    dt = x.dtype if isinstance(x, (np.ndarray, np.generic)) else np.asarray(x).dtype
    want = np.dtype(spec.dtype)
    if not castable(dt, want):
        raise InputError(f"input {spec.name!r} has dtype {dt}, expected {want}")
    return want


class DynamicModel:
    """What `dlcc.compile(model, dynamic=True)` returns: called like a CompiledModel, it compiles
    a plan for each distinct set of input shapes it is called with (module docstring)."""

    def __init__(self, model, shapes: dict, compile_kwargs: dict, max_plans: int = MAX_PLANS):
        if not isinstance(max_plans, int) or isinstance(max_plans, bool) or max_plans < 1:
            raise DlccError(f"max_plans={max_plans!r}: give the number of plans to keep in memory, 1 or more")
        self.model = Path(model)
        self.target = pick_target(compile_kwargs.pop("target", "auto"))
        self.max_plans = max_plans
        self._kwargs = compile_kwargs
        self._base = dict(shapes)
        specs = read_signature(self.model)
        scalars = {s.name for s in specs if s.dims == ()}
        self._values = {k: v for k, v in self._base.items() if k in scalars}  # bound values (`sr=16000`)
        self._symbols: dict[str, int] = {}
        self._fixed: dict[str, tuple[int, ...]] = {}
        names = {s.name for s in specs}
        symbols = {d for s in specs for d in (s.dims or ()) if isinstance(d, str)}
        for k, v in self._base.items():
            if k in self._values:
                continue
            if k in names:
                self._fixed[k] = tuple(v)
            elif k in symbols and len(v) == 1:
                self._symbols[k] = int(v[0])
            else:
                raise ShapeError(f"shapes names {k!r}, which is neither an input of {self.model} nor one of its "
                                 f"symbolic dims; inputs are: {', '.join(sorted(names)) or '(none)'}")
        self.signature = specs
        self._plans: OrderedDict[tuple, object] = OrderedDict()
        self._compiling: dict[tuple, threading.Lock] = {}
        self._lock = threading.Lock()
        self._warned = False
        self.compiles = 0  # plans compiled (or read from the cache) so far, dropped ones included
        self._dir: Path | None = None
        if self._kwargs.get("cache"):
            self._dir = Path(scratch.mkdtemp("dynamic"))
            weakref.finalize(self, shutil.rmtree, str(self._dir), True)

    # -- the signature ----------------------------------------------------------------------------
    @property
    def bound_values(self) -> dict[str, tuple[int]]:
        """The scalar inputs whose value `shapes=` binds (`sr=16000`), as given there."""
        return dict(self._values)

    @property
    def inputs(self) -> list[dict]:
        """The model's inputs, with '?' for dims the call decides."""
        return [{"name": s.name, "dtype": s.dtype, "shape": None if s.dims is None else
                 [d if isinstance(d, int) else (d or "?") for d in s.dims]} for s in self.signature]

    @property
    def plans(self) -> list[dict[str, tuple[int, ...]]]:
        """The input shapes of each plan held now, least recently used first."""
        with self._lock:
            return [dict(k) for k in self._plans]

    def shapes_for(self, feeds: dict) -> dict[str, tuple[int, ...]]:
        """Every input's static shape for a call with `feeds` (name -> array), checked against the
        signature: the names, each rank, the dims the model or `shapes=` fix, and one value for
        each named dim."""
        check_input_names(feeds, [s.name for s in self.signature])
        for s in self.signature:
            host_dtype(feeds[s.name], s)
        return self._resolve({s.name: shape_of(feeds[s.name]) for s in self.signature}, {}, "input")

    def _resolve(self, given: dict[str, tuple], symbols: dict[str, int], what: str) -> dict[str, tuple[int, ...]]:
        """Full shapes from `given` (input -> shape) and `symbols` (named dim -> value), checked;
        `what` words the errors ("input" for a call's feeds, "shapes" for specialize())."""
        symbols = dict(self._symbols, **symbols)
        for s in self.signature:  # a named dim takes its value from any input that has it
            shape = given.get(s.name, self._fixed.get(s.name))
            if shape is not None and s.dims is not None and len(shape) == len(s.dims):
                for d, want in zip(shape, s.dims):
                    if isinstance(want, str):
                        symbols.setdefault(want, int(d))
        seen: dict[str, tuple[int, str]] = {}  # symbol -> (value, the input that gave it)
        out: dict[str, tuple[int, ...]] = {}
        problems: list[str] = []
        for s in self.signature:
            if s.name in self._values:
                out[s.name] = ()
                continue
            shape = given.get(s.name, self._fixed.get(s.name))
            if shape is None:
                if s.dims is None or any(d is None or isinstance(d, str) and d not in symbols for d in s.dims):
                    problems.append(f"{s.describe()} is not bound")
                    continue
                shape = tuple(d if isinstance(d, int) else symbols[d] for d in s.dims)
            shape = tuple(int(d) for d in shape)
            if s.dims is not None and len(shape) != len(s.dims):
                problems.append(f"{what} {s.name!r} has shape {list(shape)}, of rank {len(shape)}; the model's is "
                                f"{s.describe()}")
                continue
            if s.name in self._fixed and shape != self._fixed[s.name]:
                problems.append(f"{what} {s.name!r} has shape {list(shape)}; the model was compiled with "
                                f"shapes={{{s.name!r}: {self._fixed[s.name]}}}")
                continue
            for k, (d, want) in enumerate(zip(shape, s.dims or ())):
                if isinstance(want, int) and d != want:
                    problems.append(f"{what} {s.name!r} has shape {list(shape)}; the model fixes dim {k} to {want}")
                elif isinstance(want, str):
                    if want in self._symbols and d != self._symbols[want]:
                        problems.append(f"{what} {s.name!r} has {want}={d}; the model was compiled with "
                                        f"shapes={{{want!r}: {self._symbols[want]}}}")
                    elif want in seen and seen[want][0] != d:
                        problems.append(f"{what} {s.name!r} has {want}={d}, and {what} {seen[want][1]!r} has "
                                        f"{want}={seen[want][0]}: a named dim takes one value in a call")
                    seen.setdefault(want, (d, s.name))
            out[s.name] = shape
        if problems:
            raise (InputError if what == "input" else ShapeError)("; ".join(problems))
        return out

    def bound_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every input's shape from the bindings given at compile time alone (an error naming the
        inputs whose dims they leave open)."""
        return self._resolve({}, {}, "shapes")

    # -- plans ------------------------------------------------------------------------------------
    def specialize(self, shapes: dict | None = None):
        """The CompiledModel for the given shapes (by input name or named dim, as `shapes=` of
        dlcc.compile takes them), compiled now if it is not held: a warm-up before serving, as
        TensorRT builds an engine per profile."""
        from .api import _merge_shapes

        given = _merge_shapes(shapes)
        names = {s.name for s in self.signature}
        named = {d for s in self.signature for d in (s.dims or ()) if isinstance(d, str)}
        symbols = {k: v[0] for k, v in given.items() if k not in names and k in named and len(v) == 1}
        unknown = [k for k in given if k not in names and k not in symbols]
        if unknown:
            raise ShapeError(f"specialize() names {', '.join(map(repr, unknown))}: neither an input nor a named dim")
        for k, v in given.items():
            if k in self._values and tuple(v) != tuple(self._base[k]):
                raise ShapeError(f"{k!r} was bound to the value {self._base[k][0]} at compile time")
        return self._plan(self._resolve({k: v for k, v in given.items() if k in names and k not in self._values},
                                        symbols, "shapes"))

    def _plan(self, full: dict[str, tuple[int, ...]]):
        key = tuple(sorted(full.items()))
        with self._lock:
            cm = self._plans.get(key)
            if cm is not None:
                self._plans.move_to_end(key)
                return cm
            gate = self._compiling.setdefault(key, threading.Lock())
        with gate:  # one compile per new key, however many threads wait for it
            with self._lock:
                cm = self._plans.get(key)
            if cm is None:
                cm = self._compile(full)
                with self._lock:
                    self._plans[key] = cm
                    self.compiles += 1
                    self._compiling.pop(key, None)
                    dropped = []
                    while len(self._plans) > self.max_plans:
                        dropped.append(self._plans.popitem(last=False)[0])
                if dropped:
                    self._warn_dropped()
        return cm

    def last_used(self):
        """The CompiledModel of the plan called (or compiled) last, or None before any call."""
        with self._lock:
            return next(reversed(self._plans.values()), None)

    def held(self) -> list[tuple[dict[str, tuple[int, ...]], object]]:
        """(the shape bindings it was compiled with, the CompiledModel) for each plan held now."""
        with self._lock:
            return [(self.bindings(dict(k)), cm) for k, cm in self._plans.items()]

    def bindings(self, full: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        """The `shapes=` a plan for inputs of shapes `full` is compiled with: the dynamic inputs'
        shapes and the bound values (what its cache key is made of)."""
        spec = {s.name: s for s in self.signature}
        bindings = {n: s for n, s in full.items() if n not in self._values and spec[n].dynamic}  # (static: none)
        bindings.update(self._values)
        return bindings

    def _compile(self, full: dict[str, tuple[int, ...]]):
        from .api import compile as compile_model

        bindings = self.bindings(full)
        text = ", ".join(f"{n}={'x'.join(map(str, s))}" for n, s in bindings.items()) or "its static shapes"
        log.info("dlcc: compiling %s for %s", self.model.name, text)
        out = None
        if self._dir is not None:
            out = Path(tempfile.mkdtemp(prefix="plan-", dir=self._dir)) / "model.dlcc"
        return compile_model(self.model, out=out, shapes=bindings, target=self.target, **self._kwargs)

    def _warn_dropped(self) -> None:
        if self._warned:
            return
        self._warned = True
        warnings.warn(
            f"dlcc: {self.model.name} has been called with more than max_plans={self.max_plans} distinct input "
            "shapes, so it keeps the most recently used plans and compiles again when an older shape comes back. "
            "If one dim changes on every call (a growing KV cache), bind it (shapes=) or feed a fixed-size buffer; "
            "else raise max_plans", stacklevel=4)

    # -- calls ------------------------------------------------------------------------------------
    def __call__(self, inputs: dict | None = None, **kw) -> dict[str, np.ndarray]:
        feeds = dict(inputs or {}, **kw)
        return self._plan(self.shapes_for(feeds))(feeds)

    def run(self, inputs: dict, outputs: str = "host", stream=None, out: dict | None = None) -> dict:
        """CompiledModel.run on the plan for these inputs' shapes."""
        feeds = dict(inputs)
        return self._plan(self.shapes_for(feeds)).run(feeds, outputs=outputs, stream=stream, out=out)

    def bind(self, inputs: dict, outputs: str = "host", stream=None, out: dict | None = None):
        """CompiledModel.bind on the plan for these inputs' shapes (they cannot change later)."""
        feeds = dict(inputs)
        return self._plan(self.shapes_for(feeds)).bind(feeds, outputs=outputs, stream=stream, out=out)

    def synchronize(self) -> None:
        """Wait for every inference queued on any plan held now."""
        with self._lock:
            held = list(self._plans.values())
        for cm in held:
            cm.synchronize()

    def sample_inputs(self, shapes: dict | None = None, seed: int = 0) -> dict[str, np.ndarray]:
        """Seeded inputs for the given shapes, drawn as `dlcc run` draws them (the plan for them is
        compiled first, since the plan knows the index ranges the inputs must respect)."""
        return self.specialize(shapes).sample_inputs(seed)
