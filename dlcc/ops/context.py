"""LowerCtx: what an op's lowering function sees and the only way it emits work.

Lowerings ask for shapes, dtypes and constant values, and emit kernels and launches through
this object; they also declare views (`alias`) and scratch buffers (`temp`) so that memory
planning sees every buffer and its lifetime.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import DlccError
from ..ir import HALF_FLOATS, Graph, Node, Tensor
from ..kernels.program import KernelProgram, Launch
from .registry import lookup


class LoweringError(DlccError):
    """An op's attributes or shapes are outside what its lowering handles."""


class LowerCtx:
    def __init__(self, graph: Graph, device: Any = None, pass_name: str = "baseline"):
        self.graph = graph
        self.device = device
        self.pass_name = pass_name
        self.program = KernelProgram()
        self.aliases: dict[str, str] = {}
        self.node: Node | None = None
        self._ntemp = 0
        self.gemm_tiling = None  # a forced Tiling (lower option gemm_tiling), else chosen per GEMM
        # tf32/fp16/bf16: GEMMs and convolutions on the tensor-core template (kernels/gemm_mma.py)
        self.precision = "fp32"
        self.fp32_ops: set[str] = set()  # op types kept on the float32 template at those (PipelineSpec.fp32_ops)
        self.narrowed: list[str] = []  # constants stored in a half type (ops/narrow.py)
        self.transposed: list[str] = []  # GEMM constants also stored transposed (ops/matmul.py transposed_weight)
        self.folded_norms: list[str] = []  # LayerNorms computed inside their GEMMs (ops/fold_norm.py)
        self.transpose_weights = True  # `lower`'s option: whether transposed_weight may
        self.half_activations: list[str] = []  # activations stored in a half type (narrow_activations)
        self.float32_activation_ops: dict[str, int] = {}  # op type -> nodes keeping float32 activations
        self.float32_range: list[str] = []  # activations kept float32: beyond the half type's range (ops/narrow.py beyond_half)
        self.index_checks: list[dict] = []  # Gather indices read from graph inputs (ops/layout.py index_check)
        self.skipped_empty: list[str] = []  # nodes whose outputs are all empty: no launch (passes/lower.py)
        self.device_index_checks: list[dict] = []  # computed Gather indices (kernels/index_check.py)
        self.checked_indices: set[tuple] = set()  # (indices, bounds, per last axis) checked on the device already
        self.producers: dict | None = None  # tensor -> the node writing it, made once (ops/ranges.py)
        self.kept_float32: dict[str, int] = {}  # float32_compute() as lowered (passes/lower.py)
        self.unjoinable_us = 0.0  # what a GEMM no persistent kernel can run costs beyond its time (passes/lower.py)
        self.draws: list[dict] = []  # random draws (ops/random.py), for verify to recompute (random_draws.py)
        self.deep_declined: list[str] = []  # GEMM problems whose faster DEEP tiling gave way to a joinable one

    # -- queries ---------------------------------------------------------------------------
    def tensor(self, name: str) -> Tensor:
        return self.graph.tensors[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.graph.tensors[name].shape)

    def dtype(self, name: str) -> str:
        """The tensor's storage dtype (what its kernel parameters are declared as)."""
        return self.graph.tensors[name].dtype

    def value_dtype(self, name: str) -> str:
        """The dtype a kernel computes the tensor's values in: float32 for a 16-bit float (stored
        so by ops/narrow.py or at a half model's boundary; loads convert, stores round), else its
        own. Lowerings that branch on float against integer semantics ask this, not dtype()."""
        dt = self.graph.tensors[name].dtype
        return "float32" if dt in HALF_FLOATS else dt

    def const(self, name: str) -> np.ndarray | None:
        if not name:
            return None
        t = self.graph.tensors.get(name)
        return None if t is None else t.value

    def attr(self, key: str, default=None):
        v = self.node.attrs.get(key, default) if self.node else default
        if isinstance(v, bytes):
            v = v.decode()
        return v

    def fail(self, why: str) -> LoweringError:
        n = self.node
        return LoweringError(f"cannot lower {n.op_type} node {n.name!r}: {why}" if n else why)

    def resolve(self, name: str) -> str:
        while name in self.aliases:
            name = self.aliases[name]
        return name

    def float32_compute(self) -> dict[str, int]:
        """Nodes, by op type, whose FLOPs run in float32 arithmetic: at a tensor-core precision,
        the compute ops with no tensor-core kernel (depthwise Conv, ConvTranspose, ...) and those
        kept float32 by `fp32_ops`. Counted from the lowered launches (a node counts once)."""
        seen, out = set(), {}
        for L in self.program.launches:
            if L.flops and L.category == "compute" and L.math == "float32" and L.node not in seen:
                seen.add(L.node)
                out[L.op_type] = out.get(L.op_type, 0) + 1
        return out

    # -- emission --------------------------------------------------------------------------
    def alias(self, out: str, src: str) -> None:
        """`out` is a view of `src` (same bytes, another shape): no kernel, no copy."""
        self.aliases[out] = src

    def temp(self, shape, dtype: str = "float32") -> str:
        self._ntemp += 1
        name = f"%tmp{self._ntemp}"
        self.graph.tensors[name] = Tensor(name, tuple(int(d) for d in shape), dtype)
        return name

    def launch(self, kernel: str, grid: int, args: list, *, reads: list[str], writes: list[str],
               flops: int = 0, dram_bytes: int | None = None, category: str | None = None) -> None:
        k = self.program.kernels[kernel]
        if dram_bytes is None:
            dram_bytes = sum(self.tensor(t).nbytes for t in set(reads) | set(writes))
        node = self.node
        cat = category
        if cat is None and node is not None:
            d = lookup(node.op_type, self.graph.opset)
            cat = d.category if d else ""
        self.program.launches.append(Launch(
            kernel=kernel, grid=max(1, int(grid)), block=k.block,
            args=[("i", int(a)) if isinstance(a, (int, np.integer)) else ("t", a) for a in args],
            reads=list(reads), writes=list(writes),
            node=node.name if node else "", op_type=node.op_type if node else "",
            flops=int(flops), dram_bytes=int(dram_bytes), pass_name=self.pass_name, category=cat or "",
            math=k.math,
        ))
