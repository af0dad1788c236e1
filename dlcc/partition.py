"""Graph breaks: the nodes dlcc cannot compile run on onnxruntime, the rest on dlcc.

`dlcc.compile(model, fallback="onnxruntime")` splits the model's graph into segments, as
onnxruntime splits one between execution providers (GetCapability) and torch.compile splits a
program at a graph break:

- a **dlcc segment** is a sub-model of nodes dlcc compiles: a dlcc.dynamic.DynamicModel, so it is
  compiled at the first call for the shapes it sees (a segment after a NonZero or a
  NonMaxSuppression gets shapes only at run time);
- an **onnxruntime segment** is a sub-model run by an onnxruntime CPU session: the ops dlcc has
  no lowering for, the ops whose output shape depends on values (NonZero, NonMaxSuppression,
  Unique, ...), and anything a dlcc segment refused when it compiled.

The segments run one after another in a topological order of the nodes that keeps each kind
together where the dependencies allow, so a detector whose NonMaxSuppression comes last is one
dlcc segment and one onnxruntime segment. Tensors pass between segments as host arrays.

Which nodes run where is found in two steps. At construction, nodes whose op dlcc does not know
at all go to onnxruntime (`dlcc_knows`). At run time, a dlcc segment whose compile fails with an
"unsupported" error (an op form, a data-dependent shape, a dtype) hands the nodes the error names
to onnxruntime (the whole segment where it names none), and the segments are formed again; the
segments that did not change keep their plans. Each refusal is logged, and `segments` says where
every node runs.
"""
from __future__ import annotations

import heapq
import logging
import os
import shutil
import tempfile
import threading
import weakref
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import onnx
from onnx import helper
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from . import scratch as scratch_dirs
from .control_flow import node_reads
from .errors import (DlccError, DynamicShapeError, UnsupportedControlFlowError, UnsupportedDtypesError,
                     UnsupportedOpsError)

log = logging.getLogger(__name__)

#: A dlcc segment whose weights pass this many bytes is saved with its weights beside it (a
#: protobuf message cannot hold 2 GB; dlcc reads external data from the model's own folder).
EXTERNAL_DATA_BYTES = 1 << 30

#: The engines a model's unsupported nodes may fall back to.
FALLBACKS = ("onnxruntime",)

#: An artifact of a partitioned model (PartitionedModel.save): its manifest, and the model file.
MANIFEST, MODEL_FILE = "partition.json", "model.onnx"
FORMAT, FORMAT_VERSION = "dlcc-partition", 1

#: Ops whose output shape depends on the values of their inputs: they never compile statically.
DATA_DEPENDENT = {"NonZero", "NonMaxSuppression", "Unique", "StringNormalizer", "TfIdfVectorizer",
                  "RegexFullMatch", "StringConcat", "StringSplit"}


#: Ops of the arithmetic exporters write on shapes (_shape_math): index, slice, join and compute.
_SHAPE_OPS = {"Constant", "Identity", "Gather", "Slice", "Concat", "Unsqueeze", "Squeeze", "Cast", "Add", "Sub", "Mul",
              "Div", "Neg", "Equal", "Less", "Greater", "Where", "Max", "Min", "Abs", "ReduceProd", "ReduceSum",
              "ReduceMax", "ReduceMin", "Reshape", "ConstantOfShape", "Range", "Floor", "Ceil", "Mod", "Not", "And",
              "Or", "Expand", "Tile", "Sqrt"}


def refusals() -> tuple:
    """The errors that mean "dlcc cannot compile this part", as opposed to bad input or a bug."""
    from .ops.context import LoweringError

    return (UnsupportedOpsError, DynamicShapeError, UnsupportedControlFlowError, UnsupportedDtypesError,
            LoweringError)


def dlcc_knows(node: onnx.NodeProto, opset: int) -> bool:
    """Whether dlcc has a way to compile `node`'s op at all: a lowering, a rewrite at import, or an
    onnx function body. Forms it refuses (an attribute, a dtype) are found when a segment compiles."""
    from . import ops  # noqa: F401  (registers the lowerings)
    from .composite import REWRITES
    from .expand import FOLDED
    from .fused_ops import is_fused_op
    from .ops.registry import lookup
    from .quantized import is_quantized_op

    if node.op_type in DATA_DEPENDENT:
        return False
    if node.domain not in ("", "ai.onnx"):
        from .ml_ops import ML, ML_REWRITES

        return is_fused_op(node, opset) or is_quantized_op(node) or (node.domain == ML and node.op_type in ML_REWRITES)
    if lookup(node.op_type, opset) is not None or node.op_type in REWRITES or is_fused_op(node, opset):
        return True
    if node.op_type in FOLDED or node.op_type in (
            "If", "Loop", "Scan", "STFT", "DFT", "SequenceEmpty", "SequenceInsert", "SequenceConstruct", "SequenceAt",
            "SequenceLength", "ConcatFromSequence", "SplitToSequence") or is_quantized_op(node):
        return True
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
    except Exception:  # not an op onnx knows at this opset: onnxruntime may still (or may refuse it too)
        return False
    return bool(schema.has_function or schema.has_context_dependent_function)


@dataclass(frozen=True)
class Segment:
    """Consecutive nodes (indices into the graph) that run on one engine, the tensors they read
    from before them and the ones they give to what follows (or to the graph's outputs)."""

    engine: str  # "dlcc" or "onnxruntime"
    nodes: tuple[int, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


class _CompileOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pipeline: str
    device: str | None = None
    precision: str | None = None


class _Manifest(BaseModel):
    """partition.json as PartitionedModel.save writes it; `load` trusts nothing it does not check."""
    format: Literal[FORMAT]
    version: Literal[FORMAT_VERSION]
    fallback: Literal["onnxruntime"]
    max_plans: int = Field(ge=1)
    compile: _CompileOptions
    shapes: dict[str, list[int]]
    profile_db: Literal["profile_db.json"] | None = None
    plans: int = Field(0, ge=0)
    onnxruntime_nodes: dict[int, str]


class PartitionedModel:
    """What `dlcc.compile(model, fallback="onnxruntime")` returns: called like a CompiledModel
    with host arrays, it runs each segment on its engine (module docstring)."""

    def __init__(self, model, shapes: dict, compile_kwargs: dict, max_plans: int, fallback: str = "onnxruntime"):
        from .dynamic import DynamicModel
        from .frontend import load_model, opset_of

        if fallback not in FALLBACKS:
            raise DlccError(f"fallback={fallback!r}: dlcc falls back to {' or '.join(FALLBACKS)}")
        self.model_path = Path(model)
        self.fallback = fallback
        self._shapes = dict(shapes)
        self.saved_plans = 0  # plans read from the artifact it was loaded from (load)
        self._signature = DynamicModel(model, shapes, dict(compile_kwargs), max_plans)  # checks calls; never compiles
        self.target = self._signature.target
        self._kwargs = dict(compile_kwargs, target=self.target)
        self.max_plans = max_plans
        m = load_model(model)
        self._model = m
        self._opset = opset_of(m)
        g = m.graph
        self._inits = {t.name: t for t in g.initializer}
        self.outputs = [o.name for o in g.output]
        self._node_reads = [node_reads(n) for n in g.node]
        self._producer = {o: k for k, n in enumerate(g.node) for o in n.output if o}
        try:
            inferred = onnx.shape_inference.infer_shapes(m, check_type=False, strict_mode=False)
            self._types = {v.name: v.type for v in list(inferred.graph.value_info) + list(inferred.graph.output)
                           if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type}
        except Exception:  # a model onnx cannot infer: each sub-model is inferred on its own
            self._types = {}
        self._host = {k for k, n in enumerate(g.node) if not dlcc_knows(n, self._opset)}
        self._lock = threading.Lock()
        self._runners: dict[tuple, object] = {}
        self._refused: dict[int, str] = {k: "dlcc has no lowering for the op" for k in self._host}
        self._segments = self._partition()
        self._dir = Path(scratch_dirs.mkdtemp("partition"))
        weakref.finalize(self, shutil.rmtree, str(self._dir), True)

    # -- where each node runs ---------------------------------------------------------------------
    def _partition(self) -> list[Segment]:
        """A topological order of the nodes that switches engine only when no node of the current
        one is ready (Kahn's algorithm with a preference), cut where the engine changes."""
        g = self._model.graph
        n = len(g.node)
        deps = [{self._producer[x] for x in self._node_reads[k] if x in self._producer} for k in range(n)]
        users: list[list[int]] = [[] for _ in range(n)]
        for k, d in enumerate(deps):
            for p in d:
                users[p].append(k)
        left = [len(d) for d in deps]
        ready: dict[str, list[int]] = {"dlcc": [], "onnxruntime": []}  # a heap per engine, in graph order
        for k in range(n):
            if not left[k]:
                heapq.heappush(ready[self._engine(k)], k)
        order: list[int] = []
        engine = "dlcc"
        while ready["dlcc"] or ready["onnxruntime"]:
            if not ready[engine]:
                engine = "onnxruntime" if engine == "dlcc" else "dlcc"
            pick = heapq.heappop(ready[engine])
            order.append(pick)
            for u in users[pick]:
                left[u] -= 1
                if not left[u]:
                    heapq.heappush(ready[self._engine(u)], u)
        if len(order) != n:
            raise DlccError(f"{self.model_path}: the graph has a cycle; it cannot be split into segments")
        runs: list[list[int]] = []
        for k in order:
            if runs and self._engine(runs[-1][0]) == self._engine(k):
                runs[-1].append(k)
            else:
                runs.append([k])
        # A dlcc run also computes again the shape math it reads (_with_shape_math), and so reads
        # the tensors whose shapes that takes: what each run gives to later ones counts those reads.
        full = [self._with_shape_math(run) if self._engine(run[0]) == "dlcc" else run for run in runs]
        later_reads: list[set[str]] = []
        acc = set(self.outputs)
        for run in reversed(full):
            later_reads.append(set(acc))
            for k in run:
                acc.update(self._node_reads[k])
        later_reads.reverse()
        segments = []
        for own, run, later in zip(runs, full, later_reads):
            outs = [o for k in own for o in g.node[k].output if o and o in later]
            made = {o for k in run for o in g.node[k].output if o}
            ins: list[str] = []
            for k in run:  # (one node may read a tensor twice: Mul(d, d))
                ins += [x for x in dict.fromkeys(self._node_reads[k]) if x not in made and x not in self._inits
                        and x not in ins]
            segments.append(Segment(self._engine(run[0]), tuple(run), tuple(ins), tuple(outs)))
        return segments

    def _with_shape_math(self, run: list[int]) -> list[int]:
        """`run` with the shape arithmetic it reads computed again inside it. A Reshape's target,
        a Slice's ends or an Expand's shape computed from Shape nodes folds to a constant in a
        whole-model compile; handed over from another segment as an array, it is a value known
        only at run time, and dlcc would refuse the shape it decides. So the nodes that compute
        such a value from shapes and constants alone (`_shape_math`) are copied into the segment,
        reading the tensors whose shapes they take."""
        g = self._model.graph
        have = set(run)
        made = {o for k in run for o in g.node[k].output if o}
        extra: set[int] = set()
        todo = [x for k in run for x in self._node_reads[k] if x not in made]
        while todo:
            x = todo.pop()
            k = self._producer.get(x)
            if k is None or k in have or k in extra or k not in self._shape_math:
                continue
            extra.add(k)
            if g.node[k].op_type not in ("Shape", "Size"):
                todo += self._node_reads[k]
        return sorted(set(run) | extra) if extra else run  # (the graph's order is topological)

    @property
    def _shape_math(self) -> set[int]:
        """Nodes whose value follows from tensor shapes and constants alone: Shape and Size, and
        the arithmetic on their results that exporters write around them."""
        if not hasattr(self, "_shape_math_nodes"):
            g = self._model.graph
            found: set[int] = set()
            for k, n in enumerate(g.node):
                if n.op_type in ("Shape", "Size"):
                    found.add(k)
                elif n.op_type in _SHAPE_OPS and n.domain in ("", "ai.onnx") and all(
                        x in self._inits or self._producer.get(x) in found for x in self._node_reads[k]):
                    found.add(k)
            self._shape_math_nodes = found
        return self._shape_math_nodes

    def _engine(self, k: int) -> str:
        return "onnxruntime" if k in self._host else "dlcc"

    @property
    def inputs(self) -> list[dict]:
        """The model's inputs, with '?' for dims each call decides."""
        return self._signature.inputs

    @property
    def options(self) -> dict:
        """The compile options each dlcc segment is compiled with (pipeline, precision, device)."""
        return {k: self._kwargs.get(k) for k in ("pipeline", "precision", "device")}

    @property
    def segments(self) -> list[dict]:
        """Each segment in run order: its engine, its node count, the op types in it, and for
        onnxruntime's, why dlcc does not run them."""
        g = self._model.graph
        with self._lock:
            segs = list(self._segments)
        rows = []
        for s in segs:
            row = {"engine": s.engine, "nodes": len(s.nodes),
                   "ops": dict(Counter(g.node[k].op_type for k in s.nodes).most_common())}
            if s.engine == "onnxruntime":
                row["why"] = sorted({self._refused.get(k, "") for k in s.nodes} - {""})
            rows.append(row)
        return rows

    # -- calls ------------------------------------------------------------------------------------
    def __call__(self, inputs: dict | None = None, **kw) -> dict[str, np.ndarray]:
        from .dynamic import host_dtype
        from .executor import as_input

        feeds = dict(inputs or {}, **kw)
        self._signature.shapes_for(feeds)  # names, dtypes, ranks and bound dims, before anything runs
        values: dict[str, np.ndarray] = {}
        for spec in self._signature.signature:  # host arrays of the model's types: the segments are typed by them
            a = np.asarray(feeds[spec.name])
            values[spec.name] = a if host_dtype(feeds[spec.name], spec) is None else as_input(a, spec.name, spec.dtype)
        before = None  # the partition before this call moved nodes, to put back if the call fails
        while True:
            with self._lock:
                segments = list(self._segments)
            try:
                for seg in segments:
                    outs = self._runner(seg, values)(seg, values)
                    values.update(outs)
                break
            except _Refused as r:
                if before is None:
                    with self._lock:
                        before = (set(self._host), dict(self._refused), self._segments)
                self._refuse(r.segment, r.error)
            except BaseException:
                # A call that fails on onnxruntime too was bad input (a shape the model cannot take),
                # not a part dlcc cannot compile: the nodes it moved go back for the next call.
                if before is not None:
                    with self._lock:
                        self._host, self._refused, self._segments = before
                raise
        for name in self.outputs:
            if name not in values and name in self._inits:
                values[name] = onnx.numpy_helper.to_array(self._inits[name])
        return {name: values[name] for name in self.outputs}

    def run(self, inputs: dict, outputs: str = "host", stream=None, out: dict | None = None) -> dict:
        """One inference; a model with onnxruntime segments passes host arrays between them, so
        its inputs and outputs are host arrays."""
        if outputs != "host" or stream is not None or out is not None:
            raise DlccError("a model that falls back to onnxruntime takes and returns host arrays: outputs='host', "
                            "no stream= and no out=")
        return self(inputs)

    def sample_inputs(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Seeded inputs for the shapes bound at compile time (every dynamic dim must be bound)."""
        from .inputs import sample_inputs

        try:
            shapes = self._signature.bound_shapes()
        except DlccError as e:
            raise type(e)(f"{e}; sample inputs need every dynamic dim bound: --shape NAME=... (shapes= in "
                          "Python), or give the inputs") from None
        sig = [{"name": s.name, "dtype": s.dtype, "shape": list(shapes[s.name])} for s in self._signature.signature]
        return sample_inputs(sig, seed, bound={k: int(v[0]) for k, v in self._signature.bound_values.items()})

    # -- as an artifact ---------------------------------------------------------------------------
    def save(self, out: str | Path) -> Path:
        """Write the model as an artifact directory that `dlcc.load` and `dlcc run` reopen:

        - ``partition.json``: the manifest, with the compile's options and where each node runs
          (the nodes moved to onnxruntime, and why);
        - ``model.onnx``: the model the segments are cut from (its weights beside it, as
          ``model.data``, past EXTERNAL_DATA_BYTES);
        - ``cache/``: a dlcc compile cache holding the plans the segments have compiled so far,
          so a loaded artifact finds them instead of compiling again (`dlcc compile --fallback`
          runs the model once on sample inputs first, which compiles every dlcc segment);
        - ``profile_db.json``, ``pipeline.yaml``, ``device.yaml``: the compile's profile database,
          pipeline and device spec, where they were given as files.

        The directory is written beside `out` and moved into place whole, so an interrupted save
        leaves the older artifact, or nothing."""
        import json

        from . import __version__
        from .artifact import replace_dir, staging_dir

        out = Path(out)
        tmp = staging_dir(out)
        try:
            big = sum(len(t.raw_data) for t in self._model.graph.initializer) > EXTERNAL_DATA_BYTES
            onnx.save(self._model, str(tmp / MODEL_FILE), save_as_external_data=big, location="model.data")
            plans = self._store_plans(tmp / "cache")
            for scratch in ("memo", "locks"):  # (the cache's own bookkeeping, about paths in `tmp`)
                shutil.rmtree(tmp / "cache" / scratch, ignore_errors=True)
            db = self._kwargs.get("profile_db")
            if db:
                shutil.copyfile(db, tmp / "profile_db.json")
            options = self.options
            for key in ("pipeline", "device"):  # a YAML file goes along: the artifact may be opened elsewhere
                given = options[key]
                if isinstance(given, (str, os.PathLike)) and str(given).endswith((".yaml", ".yml")) \
                        and Path(given).is_file():
                    shutil.copyfile(given, tmp / f"{key}.yaml")
                    options[key] = f"{key}.yaml"
            with self._lock:
                refused = {str(k): why for k, why in sorted(self._refused.items())}
            manifest = {"format": FORMAT, "version": FORMAT_VERSION, "dlcc": __version__, "fallback": self.fallback,
                        "target": self.target, "max_plans": self.max_plans,
                        "compile": options,
                        "shapes": {k: list(v) for k, v in self._shapes.items()},
                        "profile_db": "profile_db.json" if db else None, "plans": plans,
                        "onnxruntime_nodes": refused, "segments": self.segments}
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
            os.chmod(tmp, 0o755)  # (mkdtemp makes it private; an artifact is a plain directory)
            replace_dir(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return out

    def _store_plans(self, root: Path) -> int:
        """Put the plans the dlcc segments hold into a compile cache at `root`, under the keys a
        DynamicModel with cache=root looks up (the segment files are written the same way each
        time, so their digests, and the keys, come out the same after `load`)."""
        from .api import cache_key
        from .cache import Cache, materialise

        dest = Cache(root)
        src = Cache.of(self._kwargs["cache"]) if self._kwargs.get("cache") else None
        with self._lock:
            runners = [r for r in self._runners.values() if isinstance(r, _DlccSegment)]
        stored = 0
        for r in runners:
            dm = r.model
            for bindings, cm in dm.held():
                _, key, parts = cache_key(dm.model, bindings, self.target, self._kwargs.get("pipeline", "baseline"),
                                          self._kwargs.get("device"), self._kwargs.get("profile_db"), dest,
                                          self._kwargs.get("precision"))
                if dest.lookup("artifacts", key) is not None:
                    continue
                # A plan read from a cache is an artifact there already (it cannot save itself).
                entry = src.lookup("artifacts", key) if src is not None and getattr(cm, "cache_key", None) == key \
                    else None
                dest.store("artifacts", key, parts, cm.save if entry is None else lambda d, e=entry: materialise(e, d))
                stored += 1
        return stored

    @classmethod
    def load(cls, path: str | Path, target: str = "auto") -> "PartitionedModel":
        """Reopen an artifact that `save` wrote. The plans in its cache are found again where the
        target is the one they were compiled for (`auto` is CUDA where a GPU is present, as for
        any artifact); a shape or target it has no plan for compiles at its first call, into that
        cache where it is writable."""
        import json

        path = Path(path)
        try:
            manifest = json.loads((path / MANIFEST).read_bytes())
        except (OSError, ValueError) as e:
            raise DlccError(f"{path / MANIFEST} cannot be read ({e}); compile the model again") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise DlccError(f"{path / MANIFEST} is not a dlcc partition manifest; compile the model again")
        if manifest.get("version") != FORMAT_VERSION:  # (before the schema: a newer dlcc's file is not "damaged")
            raise DlccError(f"{path / MANIFEST} has format version {manifest.get('version')!r}; this dlcc reads "
                            f"version {FORMAT_VERSION}: compile the model again")
        try:
            man = _Manifest.model_validate(manifest)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first["loc"]) or "(top level)"
            raise DlccError(f"{path / MANIFEST} is damaged: {where}: {first['msg']}; compile the model again") from None
        opts, db, saved = man.compile.model_dump(), man.profile_db, man.plans
        for key in ("pipeline", "device"):  # (a YAML file that `save` put beside the manifest)
            if opts[key] == f"{key}.yaml":
                opts[key] = str(path / opts[key])
        shapes = {k: tuple(v) for k, v in man.shapes.items()}
        moved, max_plans, fallback = man.onnxruntime_nodes, man.max_plans, man.fallback
        cache = path / "cache"
        if not cache.is_dir():
            cache = None
        elif not os.access(cache, os.W_OK | os.X_OK):  # a read-only artifact: its plans are read from a copy
            scratch = Path(scratch_dirs.mkdtemp("partition-cache"))
            shutil.copytree(cache, scratch / "cache")
            cache = scratch / "cache"
        kwargs = dict(opts, target=target, cache=cache, profile_db=str(path / db) if db else None)
        m = cls(path / MODEL_FILE, shapes, kwargs, max_plans, fallback)
        if cache is not None and cache.parent.name.startswith("dlcc-partition-cache-"):
            weakref.finalize(m, shutil.rmtree, str(cache.parent), True)
        n = len(m._model.graph.node)
        if any(not 0 <= k < n for k in moved):
            raise DlccError(f"{path / MANIFEST} names nodes model.onnx does not have; compile the model again")
        m.saved_plans = saved
        with m._lock:
            m._refused.update(moved)
            m._host |= set(moved)
            m._segments = m._partition()
        return m

    def compiled_parts(self) -> list:
        """The CompiledModel each dlcc segment ran last (verify reads their random draws)."""
        with self._lock:
            runners = list(self._runners.values())
        return [cm for r in runners if isinstance(r, _DlccSegment) and (cm := r.model.last_used()) is not None]

    # -- the engines ------------------------------------------------------------------------------
    def _runner(self, seg: Segment, values: dict):
        key = (seg.engine, seg.nodes)
        with self._lock:
            runner = self._runners.get(key)
            if runner is None:
                runner = self._runners[key] = (_DlccSegment if seg.engine == "dlcc" else _OrtSegment)(self, seg, values)
        return runner

    def _refuse(self, seg: Segment, error: DlccError) -> None:
        """Hand the nodes of `seg` that `error` names (all of them where it names none) to
        onnxruntime, and form the segments again."""
        g = self._model.graph
        text = str(error)
        if isinstance(error, UnsupportedOpsError):
            named = {k for k in seg.nodes if g.node[k].op_type in error.ops}
        elif isinstance(error, DynamicShapeError) and getattr(error, "tensor", None) in self._producer:
            named = {self._producer[error.tensor]} & set(seg.nodes)
        else:
            named = {k for k in seg.nodes if any(f"'{x}'" in text for x in (g.node[k].name, *g.node[k].output) if x)}
        named = named or set(seg.nodes)
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()] or [""]
        head = " ".join(lines[:2]) if lines[0].endswith(":") else lines[0]  # (a list's first item)
        why = f"{type(error).__name__}: {head[:200]}"
        log.warning("dlcc: %d node(s) of %s run on onnxruntime instead (%s)", len(named), self.model_path.name, why)
        with self._lock:
            for k in named:
                self._refused[k] = why
            self._host |= named
            self._segments = self._partition()

    def _submodel(self, seg: Segment, values: dict) -> onnx.ModelProto:
        """The segment as a model of its own: its nodes, the initializers they read, inputs typed
        from the arrays they get (every dim dynamic), outputs typed by shape inference."""
        g = self._model.graph
        nodes = [g.node[k] for k in seg.nodes]
        reads = {x for k in seg.nodes for x in self._node_reads[k]}
        # Each input dim gets a name of its own: onnxruntime takes dims with one dim_param to be equal
        # (and plans its buffer reuse on it), so "?" for every dim made Longformer's segment fail
        # with "Shape mismatch attempting to re-use buffer".
        inputs = []
        for name in seg.inputs:
            a = values[name]
            dims = [f"dim{len(inputs)}_{i}" for i in range(a.ndim)]
            inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), dims))
        graph = helper.make_graph(nodes, f"{g.name or 'model'}_part", inputs, [],
                                  [self._inits[x] for x in sorted(reads) if x in self._inits])
        sub = helper.make_model(graph, opset_imports=list(self._model.opset_import), ir_version=self._model.ir_version)
        sub.functions.extend(self._model.functions)
        inferred = {}
        for static in (True, False):  # this call's shapes give ranks where symbolic dims do not; those if it fails
            probe = onnx.ModelProto()
            probe.CopyFrom(sub)
            if static:
                for vi in probe.graph.input:
                    for d, n in zip(vi.type.tensor_type.shape.dim, values[vi.name].shape):
                        d.Clear()
                        d.dim_value = int(n)
            try:
                found = onnx.shape_inference.infer_shapes(probe, check_type=False, strict_mode=False, data_prop=True)
            except Exception:
                continue
            inferred = {v.name: v.type for v in found.graph.value_info}
            break
        for name in seg.outputs:
            t = inferred.get(name)
            if t is None or not t.tensor_type.HasField("shape"):
                t = self._types.get(name, t)
            vi = onnx.ValueInfoProto(name=name)
            if t is not None:
                vi.type.CopyFrom(t)
                for d in vi.type.tensor_type.shape.dim:  # every dim left to the run (unknown, unnamed)
                    d.Clear()
            sub.graph.output.append(vi)
        # (A sequence or map, which only an onnxruntime segment makes, keeps its inferred type: a
        # ZipMap's list of {label: probability} dicts goes to the caller as onnxruntime gives it.)
        unranked = [vi for vi in sub.graph.output if vi.type.WhichOneof("value") in (None, "tensor_type")
                    and not vi.type.tensor_type.HasField("shape")]
        if unranked:  # the checker wants a rank for each graph output: onnxruntime's run of the part says it
            ran = _ort_run(sub, {x: values[x] for x in seg.inputs}, [vi.name for vi in unranked])
            for vi in unranked:
                if ran is None:
                    raise _Refused(seg, DynamicShapeError(f"onnx cannot infer the rank of {vi.name!r}", tensor=vi.name))
                a = ran[vi.name]
                vi.type.tensor_type.elem_type = helper.np_dtype_to_tensor_dtype(a.dtype)
                for _ in range(a.ndim):
                    vi.type.tensor_type.shape.dim.add()
        return sub


def _ort_run(model: onnx.ModelProto, feeds: dict, names: list[str]) -> dict | None:
    """`names` computed by onnxruntime on `model` (None where it cannot run it)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4
    try:
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return dict(zip(names, sess.run(names, feeds)))
    except Exception:
        return None


class _Refused(Exception):
    def __init__(self, segment: Segment, error: DlccError):
        super().__init__(str(error))
        self.segment, self.error = segment, error


class _DlccSegment:
    """A dlcc segment: its sub-model compiled per input shape (dlcc.dynamic.DynamicModel)."""

    def __init__(self, owner: PartitionedModel, seg: Segment, values: dict):
        from .dynamic import DynamicModel

        path = Path(tempfile.mkdtemp(prefix="seg-", dir=owner._dir)) / "part.onnx"
        sub = owner._submodel(seg, values)
        big = sum(len(t.raw_data) for t in sub.graph.initializer) > EXTERNAL_DATA_BYTES
        onnx.save(sub, str(path), save_as_external_data=big, location="part.data")  # (protobuf stops at 2 GB)
        bound = {k: v for k, v in owner._signature.bound_values.items() if k in seg.inputs}
        self.model = DynamicModel(path, bound, dict(owner._kwargs), owner.max_plans)
        self.path, self.model_path = path, owner.model_path

    def __call__(self, seg: Segment, values: dict) -> dict:
        try:
            return self.model({x: values[x] for x in seg.inputs})
        except refusals() as e:
            raise _Refused(seg, e) from None
        except DlccError as e:
            # (an error about the model names the user's file, not the segment's temporary one)
            if e.args and isinstance(e.args[0], str) and str(self.path) in e.args[0]:
                e.args = (e.args[0].replace(str(self.path), f"{self.model_path} (its part dlcc compiles)"),
                          *e.args[1:])
            raise


class _OrtSegment:
    """An onnxruntime segment: a CPU session on its sub-model."""

    def __init__(self, owner: PartitionedModel, seg: Segment, values: dict):
        import onnxruntime as ort

        from .held_types import float_boundary, held_io

        so = ort.SessionOptions()
        so.log_severity_level = 4  # (its errors are raised as dlcc's, not printed too)
        sub = owner._submodel(seg, values)
        # (float8 and int4 in and out of onnxruntime's binding as float32: held_types.held_io says why)
        self.held_in, held_out = held_io(sub.graph)
        self.held_out = {n: helper.tensor_dtype_to_np_dtype(t) for n, t in held_out.items()}
        if self.held_in or held_out:
            sub = float_boundary(sub, self.held_in, held_out)
        try:
            self.session = ort.InferenceSession(sub.SerializeToString(), so, providers=["CPUExecutionProvider"])
        except Exception as e:
            raise DlccError(f"{owner.model_path}: onnxruntime cannot run the part of the model dlcc falls back on "
                            f"({', '.join(sorted({owner._model.graph.node[k].op_type for k in seg.nodes}))}): "
                            f"{str(e).splitlines()[0][:300]}") from None
        self.names = [o.name for o in self.session.get_outputs()]

    def __call__(self, seg: Segment, values: dict) -> dict:
        try:
            outs = self.session.run(self.names, {x: (np.asarray(values[x]).astype(np.float32) if x in self.held_in
                                                     else values[x]) for x in seg.inputs})
        except Exception as e:
            raise DlccError(f"onnxruntime failed on its part of the model: {str(e).splitlines()[0][:300]}") from None
        return {n: (o.astype(self.held_out[n]) if n in self.held_out else o) for n, o in zip(self.names, outs)}
