"""dlcc as a torch.compile backend: `torch.compile(model, backend="dlcc")`.

TorchDynamo hands a backend each graph it captures (an FX GraphModule) with example inputs, and
runs whatever callable the backend returns in its place. This backend exports the graph to ONNX
(torch.onnx's TorchScript exporter, which traces a GraphModule like any module), compiles it
with dlcc, and returns a function that feeds it the call's tensors and hands back torch tensors,
as torch's own "onnxrt" backend does with onnxruntime.

- **Weights are constants.** Dynamo lifts a module's parameters and buffers into graph inputs;
  they are baked into the ONNX model as initializers instead, so dlcc folds and lays them out
  once. Each call checks their version counters: a weight changed in place since the compile
  (an optimizer step) makes the next call compile again, so a call never runs stale weights.
- **Inference.** The compiled function computes no gradients. A graph called with grad enabled
  on tensors that require it runs eagerly instead (with a warning), as does a graph whose inputs
  are other than tensors and sizes, or whose outputs are not all tensors.
- **Shapes.** Dynamo guards on shapes and calls the backend again for a new one. A graph with
  symbolic sizes (`dynamic=True`, or dynamo's automatic dynamic shapes after a second shape) is
  exported and compiled once per set of sizes it is called with (`_Specializing`), since dlcc
  plans static shapes. A graph dlcc refuses part of can run split with onnxruntime:
  `options={"fallback": "onnxruntime"}`.
- **Devices.** On CUDA, device tensors go in and come out through DLPack without host copies
  (dlcc/interop.py); elsewhere CPU tensors go through numpy.
- **The export runs on the CPU, in float32** (`_export_copy`). ONNX has no device, so the graph
  is traced on a copy whose device arguments, constants and inputs are the CPU's: on CUDA,
  torch.onnx's tracer had met a CUDA tensor beside a CPU one inside GPT-2's graph and refused
  it. A bfloat16 graph is traced with every bfloat16 in it read as float32: dynamo records the
  dtypes a module casts to (`softmax(..., dtype=float32).to(bfloat16)`, `zeros(..., dtype=
  bfloat16)`), and with the inputs and weights widened, those casts would meet float32 tensors.

Options (`torch.compile(m, backend="dlcc", options={...})`): pipeline, precision, target,
device, fallback, cache, and eager_fallback (True: a graph dlcc cannot compile runs eagerly with
a warning instead of raising).
"""
from __future__ import annotations

import logging
import re
import tempfile
import threading
import warnings
from pathlib import Path

import numpy as np

from .dynamic import MAX_PLANS
from .errors import DlccError

log = logging.getLogger(__name__)

#: Dynamo's names for the placeholders it lifts from a module's state (parameters and buffers).
_STATE = re.compile(r"(^|_)(parameters|buffers)_")
#: What `options` may hold, and what each goes to.
OPTIONS = {"pipeline", "precision", "target", "device", "fallback", "cache", "eager_fallback"}


def dlcc_backend(gm, example_inputs, options: dict | None = None):
    """The torch.compile backend (registered as "dlcc" through the torch_dynamo_backends entry point)."""
    import torch

    opts = dict(options or {})
    unknown = sorted(set(opts) - OPTIONS)
    if unknown:
        raise DlccError(f"torch.compile(backend='dlcc') options {unknown}: the options are {sorted(OPTIONS)}")
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    why = _eager_reason(example_inputs, placeholders)
    if why:
        warnings.warn(f"dlcc: this graph runs eagerly: {why}", stacklevel=2)
        return gm.forward
    if any(not isinstance(x, torch.Tensor) for x in example_inputs):  # symbolic sizes: compiled per value
        return _Specializing(gm, example_inputs, placeholders, opts)
    try:
        return _Compiled(gm, example_inputs, placeholders, opts)
    except DlccError as e:
        if not opts.get("eager_fallback"):
            raise
        warnings.warn(f"dlcc: this graph runs eagerly, dlcc cannot compile it: {str(e).splitlines()[0]}", stacklevel=2)
        return gm.forward


def _eager_reason(example_inputs, placeholders) -> str | None:
    import torch

    if len(example_inputs) != len(placeholders):
        return f"{len(example_inputs)} inputs for {len(placeholders)} placeholders"
    for x, p in zip(example_inputs, placeholders):
        if not isinstance(x, (torch.Tensor, int, torch.SymInt)) or isinstance(x, bool):
            return f"input {p.target!r} is a {type(x).__name__}, neither a tensor nor a size"
    return None


class _Specializing:
    """A graph with symbolic sizes (dynamo's dynamic shapes): each call's sizes and tensor shapes
    get a graph of their own, exported with the sizes as constants and compiled, as dynamo would
    with dynamic=False; the `MAX_PLANS` most recent stay."""

    MAX_PLANS = MAX_PLANS  # (as many as a dynamic model keeps)

    def __init__(self, gm, example_inputs, placeholders, opts: dict):
        import torch

        self.gm, self.placeholders, self.opts = gm, placeholders, opts
        self.sizes = [k for k, x in enumerate(example_inputs) if not isinstance(x, torch.Tensor)]
        self.plans: dict[tuple, _Compiled] = {}
        self._lock = threading.Lock()
        self._warned = False

    def __call__(self, *inputs):
        import torch

        key = tuple(int(inputs[k]) for k in self.sizes) + tuple(
            (tuple(x.shape), x.dtype) for x in inputs if isinstance(x, torch.Tensor))
        with self._lock:
            plan = self.plans.pop(key, None)
            if plan is None:
                plan = _Compiled(self.gm, list(inputs), self.placeholders, self.opts)
                if len(self.plans) >= self.MAX_PLANS:
                    self.plans.pop(next(iter(self.plans)))
                    if not self._warned:
                        self._warned = True
                        warnings.warn(f"dlcc: a graph with dynamic sizes has seen more than {self.MAX_PLANS} of "
                                      "them; the oldest plans are dropped and compiled again if they come back",
                                      stacklevel=2)
            self.plans[key] = plan  # (most recently used last)
        return plan(*inputs)


class _Compiled:
    """The callable dynamo runs in place of one graph: dlcc's model of it, and the constants it
    was compiled with (module docstring)."""

    def __init__(self, gm, example_inputs, placeholders, opts: dict):
        import torch

        self.gm, self.opts = gm, opts
        self.state = [k for k, (x, p) in enumerate(zip(example_inputs, placeholders)) if isinstance(x, torch.Tensor)
                      and (isinstance(x, torch.nn.Parameter) or _STATE.search(str(p.target)))]
        self.sizes = {k: int(x) for k, x in enumerate(example_inputs) if not isinstance(x, torch.Tensor)}
        self.args = [k for k in range(len(placeholders)) if k not in self.state and k not in self.sizes]
        self.names = [f"input_{k}" for k in range(len(self.args))]
        self._lock = threading.Lock()
        self._build(example_inputs)

    def _build(self, inputs) -> None:
        import torch

        # ONNX at opset 17 has no bfloat16 Conv, MatMul or LayerNormalization: a bfloat16 graph is
        # exported in float32 and compiled at precision bf16 (weights and activations in bfloat16
        # again inside dlcc), its inputs widened and its outputs narrowed at each call.
        self.widen = any(isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16 for x in inputs)

        consts = {k: _host(inputs[k], self.widen) for k in self.state} | self.sizes  # (sizes: this plan's values)
        self.versions = {k: inputs[k]._version for k in self.state}
        gm, n = _export_copy(self.gm, self.widen), len(inputs)

        class Bound(torch.nn.Module):
            """The graph with its state bound as constants: the module torch.onnx traces."""

            def forward(self, *xs):
                it = iter(xs)
                full = [consts[k] if k in consts else next(it) for k in range(n)]
                out = gm(*full)
                return tuple(torch.utils._pytree.tree_flatten(out)[0])

        with torch.no_grad():
            example = [_host(inputs[k], self.widen) for k in self.args]
            out = self.gm(*[inputs[k].detach() if isinstance(inputs[k], torch.Tensor) else inputs[k] for k in range(n)])
        flat, self.spec = torch.utils._pytree.tree_flatten(out)
        if not all(isinstance(t, torch.Tensor) for t in flat):
            raise DlccError("the graph returns values that are not tensors; dlcc compiles tensor programs")
        self.out_devices = [t.device for t in flat]
        self.out_dtypes = [t.dtype for t in flat]
        self._dir = tempfile.TemporaryDirectory(prefix="dlcc-torch-")
        path = Path(self._dir.name) / "graph.onnx"
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (the TorchScript exporter's deprecation notice, every time)
            try:
                torch.onnx.export(Bound(), tuple(example), str(path), input_names=self.names,
                                  output_names=[f"output_{k}" for k in range(len(flat))], opset_version=17,
                                  dynamo=False)
            except Exception as e:
                raise DlccError(f"torch.onnx cannot export this graph for dlcc: {str(e).splitlines()[0][:300]}") \
                    from None
        import dlcc

        kw = {k: self.opts[k] for k in ("pipeline", "precision", "device", "cache") if k in self.opts}
        if self.widen:
            kw.setdefault("precision", "bf16")
        target = self.opts.get("target") or _target_for([inputs[k] for k in self.args])
        if self.opts.get("fallback"):
            self.model = dlcc.compile(path, target=target, fallback=self.opts["fallback"], **kw)
        else:
            # (dynamic=True binds whatever dims the exporter left symbolic to this call's shapes; the
            # plan is then called directly, without the dynamic model's per-call shape resolution)
            self.model = dlcc.compile(path, target=target, dynamic=True, **kw).specialize(
                {name: tuple(x.shape) for name, x in zip(self.names, example)})
        self.outputs = [f"output_{k}" for k in range(len(flat))]
        log.info("dlcc: compiled a graph of %d nodes for %s", len(self.gm.graph.nodes), target)

    def __call__(self, *inputs):
        import torch

        if torch.is_grad_enabled() and any(x.requires_grad for x in inputs if isinstance(x, torch.Tensor)):
            warnings.warn("dlcc: a call with gradients needed runs eagerly (dlcc compiles inference)", stacklevel=2)
            return self.gm(*inputs)
        with self._lock:
            if any(inputs[k]._version != v for k, v in self.versions.items()):  # weights changed in place
                log.info("dlcc: a parameter or buffer changed since the compile; compiling again")
                self._build(inputs)
            model, outputs = self.model, self.outputs
        args = [inputs[k] for k in self.args]  # (the state is baked in: only these go to dlcc)
        if self.widen:  # (never the weights: widening them every call cost BERT-base 3 ms on an H200)
            args = [x.float() if x.dtype == torch.bfloat16 else x for x in args]
        feeds = {name: _to_array(x) for name, x in zip(self.names, args)}
        cuda = not self.opts.get("fallback") and model.target == "cuda" and all(x.is_cuda for x in args)
        res = model.run(feeds, outputs="device") if cuda else model(feeds)
        flat = [_to_tensor(res[o], dev) for o, dev in zip(outputs, self.out_devices)]
        flat = [t if t.dtype == d else t.to(d) for t, d in zip(flat, self.out_dtypes)]  # (a widened graph's)
        return torch.utils._pytree.tree_unflatten(flat, self.spec)


def _export_copy(gm, widen: bool):
    """A copy of the graph module to trace for the export (module docstring): every device its
    nodes name is the CPU, every tensor it holds is on the CPU, and where `widen` every bfloat16
    it names or holds is float32. `gm` itself, which dynamo runs when a call falls back to eager,
    is left as it is."""
    import copy

    import torch
    from torch.fx.node import map_aggregate

    cpu = torch.device("cpu")

    def plain(a):
        if isinstance(a, torch.device):
            return cpu
        if widen and a is torch.bfloat16:
            return torch.float32
        return a

    def held(t):
        if isinstance(t, torch.Tensor):
            return _host(t, widen)
        if isinstance(t, torch.nn.Module):  # (a call_module target: its own copy, moved)
            t = copy.deepcopy(t).to(cpu)
            return t.float() if widen else t
        return t

    def named(a):  # a device given by name ("cuda:0"), where only a device can stand
        return "cpu" if isinstance(a, str) and a.split(":")[0] in ("cuda", "cpu", "mps", "xpu") else a

    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    for node in graph.nodes:
        if node.op == "call_method" and node.target == "cuda":  # x.cuda(): x.cpu()
            node.target, node.args, node.kwargs = "cpu", node.args[:1], {}
        node.args = map_aggregate(node.args, plain)
        if node.op == "call_method" and node.target == "to":
            node.args = tuple(named(a) for a in node.args)
        node.kwargs = {k: named(v) if k == "device" else v for k, v in map_aggregate(node.kwargs, plain).items()}
    out = torch.fx.GraphModule(gm, graph)
    # GraphModule shares the submodules that call_module nodes name, and makes new parents for the
    # rest: the shared ones are replaced by copies first, so that setting a tensor below (a get_attr
    # into such a submodule) never reaches gm's.
    targets = [n.target for n in graph.nodes if n.op == "call_module"]
    for target in dict.fromkeys(targets + [n.target for n in graph.nodes if n.op == "get_attr"]):
        *path, name = target.split(".")
        parent = out.get_submodule(".".join(path)) if path else out
        value = held(getattr(parent, name))
        if name in parent._parameters:
            parent._parameters[name] = torch.nn.Parameter(value, requires_grad=False)
        elif name in parent._buffers:
            parent._buffers[name] = value
        else:
            setattr(parent, name, value)
    return out


def _host(t, widen: bool):
    """A tensor as the export's copy holds it (module docstring): detached, on the CPU (moved
    before widening, so a GPU copies half the bytes), float32 where `widen` and bfloat16."""
    import torch

    t = t.detach().cpu()
    return t.float() if widen and t.dtype == torch.bfloat16 else t


def _target_for(example) -> str:
    """CUDA where the graph's tensors are on a GPU and dlcc's CUDA runtime is there, else auto."""
    return "cuda" if any(getattr(x, "is_cuda", False) for x in example) else "auto"


def _to_array(x):
    """A CPU tensor as numpy (bfloat16 as ml_dtypes' type, which numpy cannot take from torch);
    a CUDA tensor as it is, for the CUDA runtime's DLPack path."""
    import torch

    if x.is_cuda:
        return x.detach().contiguous()
    x = x.detach().contiguous()
    if x.dtype == torch.bfloat16:
        import ml_dtypes

        return x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return x.numpy()


def _to_tensor(a, device):
    import torch

    if hasattr(a, "__dlpack__") and not isinstance(a, np.ndarray):  # a dlcc DeviceArray
        return torch.from_dlpack(a)
    a = np.asarray(a)
    if a.dtype.name == "bfloat16":
        t = torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(np.ascontiguousarray(a))
    return t.to(device) if device.type != "cpu" else t
