"""Kernels and launches: what lowering produces and what the plan, emitters and runtimes consume.

A Kernel is dialect source (see backends/prelude_*.h) for one `KERNEL` entry plus its device
functions; identical text is emitted once and launched many times (e.g. every LSTM step). A
Launch binds a kernel to tensors by internal tensor id; ONNX names never appear in source.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

import numpy as np

from ..errors import DlccError

_CTYPE = {
    "float32": "float",
    "float16": "f16",  # storage only: map kernels convert with LOAD_F16 / STORE_F16
    "int64": "i64",
    "int32": "int",
    "bool": "u8",
    "uint8": "u8",
    "int8": "i8",
    "int16": "i16",
    "uint16": "u16",
    "uint32": "u32",
    "uint64": "u64",
    "float64": "double",  # only Casts read or write it (frontend.dtype_problems)
    "bfloat16": "bf16",  # storage only: the upper 16 bits of a float (LOAD_BF16)
}

#: The unsigned C type of each integer's width: where a signed result must wrap (a left shift, a
#: product, a sum), C leaves signed overflow undefined, so it is computed there and converted back.
SAME_WIDTH_UNSIGNED = {"int64": "u64", "int32": "u32", "int16": "u16", "int8": "u8",
                       "uint64": "u64", "uint32": "u32", "uint16": "u16", "uint8": "u8"}

#: 16-bit float storage: loads convert to float, and stores round from float (to nearest, ties to
#: even), through these macros (backends/prelude_*.h).
_FLOAT_LOADS = {"float16": "LOAD_F16", "bfloat16": "LOAD_BF16"}
_FLOAT_STORES = {"float16": "STORE_F16", "bfloat16": "STORE_BF16"}
#: The load macros' names, for passes that rewrite loads in generated text (AStitch's operands).
FLOAT_LOAD_MACROS = tuple(_FLOAT_LOADS.values())


def ctype(dtype: str) -> str:
    return _CTYPE[dtype]


def value_ctype(dtype: str) -> str:
    """The C type a kernel computes a `dtype` value in: float for the 16-bit floats (storage only,
    converted by load_float / store_value), else the storage type."""
    return "float" if dtype in _FLOAT_LOADS else _CTYPE[dtype]


#: A call of an element function, AStitch's stitched producer computed where its consumer reads
#: it (passes/astitch/codegen.py names them KERNEL_efN).
_ELEMENT_CALL = re.compile(r"_ef\d+\(")


def copy_unroll(stmts: list[str], value: str) -> str:
    """The pragma line of a loop copying a tile whose element is `value` after `stmts`: unrolled
    in full, or PROLOGUE_UNROLL where the element comes through a stitched prologue (the OpenCL
    prelude keeps that loop a loop: PoCL's LLVM crashed inlining 16 unrolled copies of one)."""
    return "PROLOGUE_UNROLL" if _ELEMENT_CALL.search("\n".join([*stmts, value])) else "#pragma unroll"


def load_float(dtype: str, ptr: str, idx: str) -> str:
    """The float value of element `idx` of parameter `ptr`, a buffer of `dtype`: a plain load, or a
    conversion from 16-bit storage."""
    macro = _FLOAT_LOADS.get(dtype)
    return f"{macro}({ptr}, {idx})" if macro else f"{ptr}[{idx}]"


def store_value(dtype: str, ptr: str, idx: str, value: str) -> str:
    """The statement storing `value` into element `idx` of parameter `ptr`, a buffer of `dtype`:
    a C conversion (which truncates toward zero for integers, as ONNX Cast does), or a rounding
    into 16-bit float storage."""
    macro = _FLOAT_STORES.get(dtype)
    return f"{macro}({ptr}, {idx}, (float)({value}));" if macro else f"{ptr}[{idx}] = ({ctype(dtype)})({value});"


def store_float(dtype: str, ptr: str, idx: str, value: str) -> str:
    """The statement storing float `value` into element `idx` of `ptr`, a float buffer of `dtype`:
    a plain assignment for float32 (the text the float32 templates always had), a rounding into
    16-bit storage otherwise."""
    return f"{ptr}[{idx}] = {value};" if dtype == "float32" else store_value(dtype, ptr, idx, value)


def literal(value, dtype: str = "float32") -> str:
    """A C literal that means the same in CUDA and OpenCL C."""
    if dtype == "float32":
        v = float(value)
        if np.isnan(v):
            return "DLCC_NAN"
        if np.isinf(v):
            return "DLCC_INF" if v > 0 else "(-DLCC_INF)"
        r = repr(float(np.float32(v)))
        if "e" not in r and "." not in r:
            r += ".0"
        return f"{r}f"
    if dtype == "bool":
        return "1" if bool(value) else "0"
    v = int(value)
    if dtype == "int64":
        return f"((i64){v}LL)" if abs(v) >= 2**31 - 1 else f"((i64){v})"
    if dtype == "uint64":
        return f"((u64){v}ULL)"
    if dtype == "uint32":
        return f"((u32){v}u)"
    return str(v)


@dataclass
class Kernel:
    name: str  # unique entry point, derived from the op type and a hash of the text
    code: str
    block: int
    smem_bytes: int = 0
    pass_name: str = "baseline"
    kind: str = "map"  # map | reduce | gemm | conv | direct | ...
    tiling: str = ""
    # Block-normalisable: correct when run by more threads than `block`, the extra ones doing no
    # work but reaching every barrier (the row-reduction templates guard their work on
    # `tid < block`). Rammer runs such rTasks with its 256 threads, so blocks of 32..128 threads
    # share one persistent kernel with 256-thread GEMM tiles.
    normalisable: bool = False
    # The arithmetic its FLOPs run at: "float32" (CUDA cores), or "tf32" for the tensor-core GEMM
    # template (kernels/gemm_mma.py). The cost model prices FLOPs at that dtype's peak.
    math: str = "float32"
    # Shared memory it takes as CUDA dynamic shared memory at each launch (a DEEP GEMM tiling's
    # stages, over the 48 KiB a static array may hold; kernels/gemm_mma.py), else 0.
    dynamic_smem: int = 0


@dataclass
class Launch:
    kernel: str
    grid: int
    block: int
    args: list[tuple[str, object]]  # ("t", tensor_id) | ("i", int)
    reads: list[str]
    writes: list[str]
    node: str
    op_type: str
    flops: int = 0
    dram_bytes: int = 0
    pass_name: str = "baseline"
    category: str = ""
    # For map kernels: the index-expression form (inputs, output, body) the kernel was generated
    # from, kept so that stitching passes can compose producers into consumers (not serialized).
    expr: object = None
    # A kernel that spin-waits on other blocks (grid barrier): runtimes clamp its grid to the
    # blocks they can prove resident, and refuse to launch it where that is none.
    grid_sync: bool = False
    # Byte ranges [lo, hi) of the tensors this launch touches, where it touches only part of one
    # (an RNN step reads and writes one time step of its sequence buffers). Dependency analysis
    # (rammer's waves) treats a tensor without an entry as touched whole.
    regions: dict = field(default_factory=dict)
    # A persistent kernel (rammer): its vEUs, sync points and per-wave work, for the estimator.
    rprogram: dict | None = None
    # Tensor args are addressed as storage base + offset (bind_storage_operands): the kernel's
    # text holds STORAGE_PARAMS and @OPERANDj@ for the j-th tensor arg, filled in after memplan.
    storage_operands: bool = False
    # A persistent kernel's per-entry operands: {"table", "first_entry", "entry_size", "slot_base",
    # "slots": [[tensor, ...] per table entry]}; fill_operand_table writes (storage, offset) pairs.
    operand_table: dict | None = None
    # The kernel's Kernel.math (its FLOPs' dtype for the cost model); a persistent kernel's waves
    # say it per rTask launch instead (wave_info's math_flops).
    math: str = "float32"
    # A GEMM launch whose `expr` is not its GemmExpr (AStitch's fused rOperators): its problem
    # {"shape": [batch, M, N, K], "a_k_contiguous", "b_n_contiguous"}, for the cost model's
    # tiling model (plan.py gemm_problem).
    gemm_problem: dict | None = None
    # A GEMM whose faster DEEP tiling `lower` gave up for one a persistent kernel can run (its own
    # launch priced in: passes/lower.py _unjoinable_us): that tiling, which Rammer gives back where
    # the launch stays on its own after all (passes/rammer.py retile_standalone). Not serialized.
    deep_tiling: object = None
    # AStitch's fused GEMM rOperator: (hint, spec, text(tiling) with KNAME, split-K args), so that
    # Rammer can re-emit it with another tiling (kernels/gemm.py retile). Not serialized.
    fused_gemm: tuple | None = None
    # A fused attention launch (passes/astitch/attention.py): [batch, M, N, D, Dv, math], for the
    # cost model's attention model (kernels/attention_mma.py fused_attention_cost).
    attention: list | None = None


@dataclass
class KernelProgram:
    kernels: dict[str, Kernel] = field(default_factory=dict)
    launches: list[Launch] = field(default_factory=list)

    #: Kernels the executor launches itself (an input's index check, kernels/index_check.py), kept
    #: by prune_unlaunched though no launch of the plan names them.
    pinned: set[str] = field(default_factory=set)

    def add_kernel(self, hint: str, make_code, block: int, smem_bytes: int = 0, kind: str = "map", tiling: str = "",
                   pass_name: str = "baseline", normalisable: bool = False, math: str = "float32",
                   pinned: bool = False, dynamic_smem: int = 0) -> str:
        """Register kernel text built by `make_code(name)`; identical text is shared. `pinned`: no
        launch of the plan will name it, and it stays (the executor launches it)."""
        probe = make_code("KNAME")
        digest = hashlib.sha1(probe.encode()).hexdigest()[:10]
        name = f"{hint}_{digest}"
        if name not in self.kernels:
            self.kernels[name] = Kernel(name, make_code(name), block, smem_bytes, pass_name, kind, tiling, normalisable,
                                        math, dynamic_smem)
        if pinned:
            self.pinned.add(name)
        return name

    def prune_unlaunched(self) -> None:
        """Drop the kernels no launch names any more (a pass replaced their launches), except the
        pinned ones."""
        used = {L.kernel for L in self.launches} | self.pinned
        self.kernels = {n: k for n, k in self.kernels.items() if n in used}

    def unwritten_read(self, ready, resolve) -> tuple[Launch, str] | None:
        """The first launch that reads a tensor before any launch wrote it, and that tensor; None
        when there is none. `ready`: the tensors that hold data before the first launch (graph
        inputs, constants); `resolve`: a view's name to the tensor that holds its bytes.

        Why: a pass that drops, reorders or half-replaces launches (a stitch covering part of a
        decomposed Softmax once did) leaves a kernel reading arena bytes nothing wrote. That is a
        wrong answer, never an error, unless it is caught here. A launch may read what it writes
        itself (a persistent kernel's rTasks pass intermediates through memory)."""
        written = {resolve(t) for t in ready}
        for L in self.launches:
            mine = {resolve(t) for t in L.writes}
            for t in L.reads:
                b = resolve(t) if t else ""
                if b and b not in written and b not in mine:
                    return L, b
            written |= mine
        return None


#: Placeholders for a storage-addressed kernel's storage parameters and the private array of
#: them that table-driven operands index (Launch.storage_operands).
STORAGE_PARAMS = "DLCC_STORAGE_PARAMS"
STORAGE_ARRAY = "DLCC_STORAGE_ARRAY;"


def bind_storage_operands(code: str, tensors: list[str], view, more: list[str] = ()) -> tuple[str, list[str]]:
    """Fill a storage-addressed kernel in once the memory plan is known.

    `view(t)` gives tensor t's {"storage", "offset"}. Each distinct storage of `tensors` and `more`
    (operands read from a table) becomes one parameter `GPTR char* sK`, in order of first use, and
    the private array `S` of them; the j-th of `tensors` (`@OPERANDj@`) becomes `sK + offset`.
    Why: a persistent kernel touches hundreds of tensors but only a few storages, so its parameter
    list stays a few pointers (CUDA's 4 KB limit) and the runtime binds no sub-buffers. Returns the
    text and the storages, in parameter order.
    """
    views = [view(t) for t in tensors]
    storages = list(dict.fromkeys([v["storage"] for v in views] + [view(t)["storage"] for t in more]))
    for j, v in enumerate(views):
        code = code.replace(f"@OPERAND{j}@", f"s{storages.index(v['storage'])} + {int(v['offset'])}")
    names = [f"s{k}" for k in range(len(storages))]
    code = code.replace(STORAGE_PARAMS, ", ".join(f"GPTR char* {n}" for n in names))
    code = code.replace(STORAGE_ARRAY, f"GPTR char* S[{len(names)}] = {{{', '.join(names)}}};")
    return code, storages


def fill_operand_table(table: np.ndarray, spec: dict, storages: list[str], view, itemsize) -> None:
    """Write each table entry's operands as (storage index, element offset) pairs (see rammer's
    _emit for the layout). Element offsets keep int32 enough for 8 GB of float storage."""
    for e, tens in enumerate(spec["slots"]):
        at = spec["first_entry"] + e * spec["entry_size"] + spec["slot_base"]
        for j, t in enumerate(tens):
            v = view(t)
            size = itemsize(t)
            if v["offset"] % size:
                raise DlccError(f"a persistent kernel's operand at byte offset {v['offset']} of storage "
                                f"{v['storage']} is not aligned to its {size}-byte elements (a dlcc bug)")
            off = v["offset"] // size
            if off >= 2**31:
                raise DlccError(f"a persistent kernel's operand lies {v['offset']} bytes into storage {v['storage']}: "
                                "past what its int32 schedule table can address; compile without the rammer pass")
            table[at + 2 * j] = storages.index(v["storage"])
            table[at + 2 * j + 1] = off


#: The most tensor arguments a kernel takes as a parameter each. OpenCL promises only 1,024 bytes
#: of parameters (CL_DEVICE_MAX_PARAMETER_SIZE), 128 pointers, and CUDA 4 KB before 12.1; a
#: Concat or Sum of hundreds of inputs, and the stitch around it, can take more. A launch past it
#: is addressed by storage instead (address_wide_launches), as a persistent kernel always is.
MAX_KERNEL_ARGS = 64

_SIGNATURE = r"KERNEL\s+void\s+(?:LAUNCH_BOUNDS\(\s*\d+\s*\)\s*)?{name}\s*\("


def address_by_storage(code: str, name: str, kinds: list[str]) -> str | None:
    """`code` (kernel `name`'s text) with its tensor parameters taken as storage base + offset:
    the signature takes STORAGE_PARAMS and then its int parameters, and the body opens by declaring
    each tensor parameter, by its old name, as `(type)(@OPERANDj@)`, so the rest of the text is
    unchanged. `kinds`: the launch's argument kinds ("t" or "i") in order. None where the
    signature does not read as those arguments (the kernel is then left as it is)."""
    m = re.search(_SIGNATURE.format(name=re.escape(name)), code)
    if not m:
        return None
    close = code.find(")", m.end())
    brace = code.find("{", close)
    if close < 0 or brace < 0 or code[close + 1:brace].strip():
        return None
    params = [p.strip() for p in code[m.end():close].split(",")]
    if len(params) != len(kinds):
        return None
    ints, decls = [], []
    for p, kind in zip(params, kinds):
        pointer = re.fullmatch(r"(GPTR\s+(?:const\s+)?\w+\s*\*)\s*(\w+)", p)
        if (kind == "t") != bool(pointer):
            return None
        if pointer:
            decls.append(f"    {p} = ({pointer.group(1)})(@OPERAND{len(decls)}@);\n")
        else:
            ints.append(p)
    head = code[:m.end()] + ", ".join([STORAGE_PARAMS] + ints) + ") {\n"
    return head + "".join(decls) + code[brace + 1:]


def address_wide_launches(prog: KernelProgram, max_args: int = MAX_KERNEL_ARGS) -> tuple[int, list[str]]:
    """Give each launch of more than `max_args` tensor arguments its own copy of its kernel,
    addressed by storage (address_by_storage; plan.py binds the offsets once the memory plan is
    known). Each launch gets a copy because the offsets are written into the text. Returns how
    many launches were changed, and the kernels whose signature could not be read that way (a
    dlcc bug: they keep their parameters, which a device with room for them still runs)."""
    changed, kept = 0, []
    for i, L in enumerate(prog.launches):
        kinds = [kind for kind, _ in L.args]
        if L.storage_operands or kinds.count("t") <= max_args:
            continue
        k = prog.kernels[L.kernel]
        text = address_by_storage(k.code, k.name, kinds)
        if text is None:
            kept.append(k.name)
            continue
        text = f"/* launch {i}: its {kinds.count('t')} tensors addressed by storage */\n" + text
        hint = k.name.rsplit("_", 1)[0]
        L.kernel = prog.add_kernel(hint, lambda nm, t=text, old=k.name: t.replace(old, nm), k.block,
                                   smem_bytes=k.smem_bytes, kind=k.kind, tiling=k.tiling, pass_name=k.pass_name,
                                   normalisable=k.normalisable, math=k.math, dynamic_smem=k.dynamic_smem)
        L.storage_operands = True
        changed += 1
    if changed:
        prog.prune_unlaunched()
    return changed, list(dict.fromkeys(kept))
