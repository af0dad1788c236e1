"""YAML configs as pydantic models: devices, pipelines and batch manifests.

Loading is a YAML safe load into models that forbid unknown keys; every error names the file and
the field (`pipelines/x.yaml: passes.0.name: ...`). Names resolve to the files shipped under
configs/ (installed as dlcc.configs), and a path to a user's own file works wherever a name does.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, PrivateAttr, ValidationError, field_validator

from .errors import ConfigError
from .ir import INT32_MAX


class Strict(BaseModel):
    # allow_inf_nan=False: a bandwidth or peak of .inf or .nan in a YAML file would pass gt=0 and
    # make the cost model's times zero or NaN
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class DeviceSpec(Strict):
    """What the planner and the cost model need to know about a target device."""

    name: str
    kind: Literal["gpu", "cpu"] = "gpu"
    arch: str | None = Field(None, description="nvcc -arch value, e.g. sm_90 (GPUs only)")
    sms: int = Field(gt=0, description="streaming multiprocessors (compute units on OpenCL)")
    warp_size: int = Field(32, gt=0)
    max_threads_per_sm: int = Field(gt=0)
    max_blocks_per_sm: int = Field(gt=0)
    max_threads_per_block: int = Field(1024, gt=0)
    registers_per_sm: int = Field(gt=0)
    max_registers_per_thread: int = Field(255, gt=0)
    shared_mem_per_sm: int = Field(gt=0, description="bytes")
    shared_mem_per_block: int = Field(gt=0, description="bytes usable by one block")
    dram_bandwidth_gbps: float = Field(gt=0, description="GB/s (1e9 bytes per second)")
    peak_tflops: dict[str, float] = Field(description="peak TFLOP/s per dtype, e.g. {float32: 67}")

    @field_validator("mma_cycle_us")
    @classmethod
    def _mma_scales(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        """Keys are the tensor-core precisions; every scale positive."""
        if v is None:
            return v
        keys = ("tf32", "tf32_async", "tf32x3", "fp16", "bf16")
        bad = sorted(k for k in v if k not in keys) + sorted(k for k, x in v.items() if not x > 0)
        if bad:
            raise ValueError(f"keys must be {', '.join(keys)}, each a positive µs per cycle; not: {', '.join(bad)}")
        return v

    @field_validator("peak_tflops")
    @classmethod
    def _peaks(cls, v: dict[str, float]) -> dict[str, float]:
        """The cost model divides by these: float32 must be there, and every peak positive."""
        if "float32" not in v:
            raise ValueError("needs a float32 peak (the cost model's default dtype)")
        bad = {k: x for k, x in v.items() if not x > 0}
        if bad:
            raise ValueError(f"peaks must be positive: {bad}")
        return v
    launch_overhead_us: float = Field(ge=0, description="typical host cost of one kernel launch")
    l2_bytes: int | None = None
    notes: str = ""
    # Cost-model calibration (dlcc.estimate.costmodel); fitted per device by
    # scripts/calibrate_costmodel.py where real kernel timings exist, defaults otherwise.
    kernel_fixed_us: float = Field(2.0, ge=0, description="GPU time every kernel costs beyond its roofline "
                                   "(ramp-up, tail, first-byte latency), in µs")
    gemm_fixed_us: float | None = Field(None, ge=0, description="the same for gemm/conv/attention kernels "
                                        "(K-loop pipeline fill); None: kernel_fixed_us")
    dram_efficiency: float = Field(0.8, gt=0, le=1, description="achievable fraction of dram_bandwidth_gbps")
    compute_efficiency: float = Field(0.7, gt=0, le=1, description="achievable fraction of peak_tflops")
    gemm_cycle_us: float | None = Field(None, gt=0, description="µs per cycle of dlcc's GEMM tiling cost models "
                                        "(kernels/gemm.py tiling_cost, gemm_mma.py mma_cost) on this device, fitted on "
                                        "dlcc's own GEMM rOperators timed there (scripts/gemm_tilings.py --fit); "
                                        "plan mode then prices a GEMM from its tiling, with the occupancy it gets "
                                        "(its own, or a persistent kernel's). None: from its FLOPs (roofline)")
    mma_cycle_us: dict[str, float] | None = Field(None, description="the same for the tensor-core tilings "
                                                  "(gemm_mma.py mma_cost), per precision (tf32, fp16, bf16; tf32_async "
                                                  "for tf32 on the cp.async pipeline, tf32x3), fitted on them "
                                                  "(scripts/gemm_tilings.py --fit); tf32_async and tf32x3 not given "
                                                  "use bf16's (the same pipeline: gemm_mma.py SCALE_FALLBACK), any "
                                                  "other precision not given gemm_cycle_us")
    profile_db: str | None = Field(None, description="a dlcc profile database that comes with this spec (a file "
                                   "name, beside the YAML): kernel times measured on the device, which rammer, "
                                   "`dlcc estimate` and `--pipeline auto` use where no --profile-db is given")
    # The folder of the YAML this spec was loaded from (load_device), where profile_db lies.
    _yaml_dir: Path | None = PrivateAttr(None)
    gemm_deep_pipelines: bool = Field(False, description="whether the cost model picks among the fp16/bf16 GEMM "
                                      "tilings with 4-8 stages in dynamic shared memory (kernels/gemm_mma.py "
                                      "DEEP_TILINGS) on this device: turn it on where scripts/gemm_tilings.py "
                                      "measured them faster; --tune times them wherever they fit regardless")
    gemm_wgmma: bool = Field(False, description="whether the cost model picks among the fp16/bf16 GEMM tilings "
                             "on Hopper's warpgroup MMA (kernels/gemm_wgmma.py; sm_90 only) on this device: turn it "
                             "on where scripts/gemm_tilings.py measured them faster (--tune times them only where it is on)")
    @field_validator("gemm_wgmma")
    @classmethod
    def _wgmma_arch(cls, v: bool, info) -> bool:
        """wgmma exists on sm_90 alone (kernels/gemm_wgmma.py): a spec of another arch that turns it
        on is a mistake, not a switch to ignore."""
        arch = info.data.get("arch")
        if v and arch != "sm_90":
            raise ValueError(f"wgmma exists on sm_90 GPUs alone; this spec's arch is {arch or 'none'}")
        return v

    simt_vector_tilings: bool = Field(False, description="whether the cost model picks among the fp32 SIMT GEMM "
                                      "tilings of the vector template (kernels/gemm.py VECTOR_TILINGS: two shared "
                                      "stages, float4 shared reads) on this device: turn it on where "
                                      "scripts/gemm_tilings.py measured them faster; --tune times them regardless")
    persistent_dynamic_smem: bool = Field(False, description="whether Rammer's persistent kernels may take their "
                                          "shared memory dynamically (beyond CUDA's 48 KiB static limit), so that "
                                          "GEMMs on the DEEP tilings can be their rTasks; off until a GPU measured "
                                          "it faster (scripts/gpu_session.sh 14)")
    grid_barrier_us: float = Field(2.0, ge=0, description="one grid barrier across the resident blocks of a "
                                   "persistent kernel, in µs (AStitch measured 2.5-2.7 µs on a V100)")
    fused_gemm_slowdown: float = Field(1.0, gt=0, description="factor on the modelled time of a GEMM that AStitch "
                                       "re-emitted with a fused prologue or epilogue (1 on GPUs, where they ride "
                                       "along; PoCL vectorizes them worse)")
    unoptimised_slowdown: float = Field(1.0, ge=1, description="factor on the modelled time of the kernels "
                                        "the OpenCL runtime builds with -cl-opt-disable on this device "
                                        "(PoCL: backends/opencl.py builds_unoptimised); 1 elsewhere")
    kernel_gap_us: float = Field(0.0, ge=0, description="device time between two kernels of one stream that "
                                 "a kernel's own timing (profiling events) does not see, so a plan pays it per "
                                 "launch: PoCL handing the next command to its worker threads (fitted from whole "
                                 "inferences by scripts/plan_accuracy.py --fit); 0 on GPUs")
    unoptimised_task_us: float = Field(0.0, ge=0, description="what each block (a persistent kernel: each "
                                       "rTask) of such a kernel costs besides, in waves over the SMs: an "
                                       "unoptimised work-group's per-item overhead on a CPU")

    @property
    def unoptimised_costs(self) -> bool:
        """Whether the kernels built unoptimised here (persistent ones, on PoCL) cost more than
        the model of an optimised build says: rprogram_time charges it, and Rammer compares it."""
        return self.unoptimised_slowdown != 1.0 or bool(self.unoptimised_task_us)


class PassSpec(Strict):
    name: str
    options: dict[str, Any] = Field(default_factory=dict)


#: What GEMMs and convolutions compute at (`precision:` in a pipeline, `--precision` on the CLI):
#: fp32 on CUDA cores; tf32, fp16 and bf16 on tensor cores (kernels/gemm_mma.py): operands rounded
#: to the precision's type, float32 accumulation; tf32x3 on tensor cores at float32's accuracy
#: (each float32 operand split into two TF32 values, three mmas: CUTLASS's 3xTF32). At fp16 and bf16 the GEMM and Conv weights, and
#: the activations between ops that convert, are also stored in that type (ops/narrow.py); every
#: op computes in float32.
PRECISIONS = ("fp32", "tf32x3", "tf32", "fp16", "bf16")
BUILT_PRECISIONS = ("fp32", "tf32x3", "tf32", "fp16", "bf16")
Precision = Literal["fp32", "tf32x3", "tf32", "fp16", "bf16"]


class PipelineSpec(Strict):
    """A named, ordered list of passes (TVM-style), validated against the pass registry, and the
    precision its GEMMs compute at."""

    name: str
    description: str = ""
    precision: Precision = "fp32"
    # Op types whose GEMMs stay on the float32 SIMT template (and keep float32 weights) at a
    # tensor-core precision: TensorRT's per-layer precision, by op type (e.g. [MatMul] keeps
    # attention's score and context products in float32 while Gemm/Conv use tensor cores).
    fp32_ops: list[str] = Field(default_factory=list)
    # At fp16/bf16: store intermediate tensors in the half type wherever every op around them
    # converts on load and store (ops/narrow.py narrow_activations); false keeps them float32 and
    # narrows only the GEMM/Conv weights.
    half_activations: bool = True
    # On CUDA: capture the plan's whole launch sequence into a CUDA graph once and replay it per
    # inference (one launch from the host instead of one per kernel); false launches each kernel.
    graphs: bool = True
    passes: list[PassSpec]


def with_precision(pipe: PipelineSpec, precision: str | None) -> PipelineSpec:
    """`pipe` at `precision` (None keeps the pipeline's own). The plan's meta records the
    precision, and the cache key covers it (the pipeline's JSON)."""
    if precision is None or precision == pipe.precision:
        return pipe
    if precision not in PRECISIONS:
        raise ConfigError(f"unknown precision {precision!r}; choose one of: {', '.join(PRECISIONS)}")
    return pipe.model_copy(update={"precision": precision})


def precision_asked(pipe: PipelineSpec, precision: str | None) -> bool:
    """Whether the user chose the precision (`precision`, or `precision:` in the pipeline file)
    rather than leaving it to the model: a half model then computes at it rather than at its own,
    and a float64 model computes in float32 rather than being refused. The cache key covers it,
    since the same pipeline JSON compiles either way."""
    return precision is not None or "precision" in pipe.model_fields_set


def with_gemm_tilings(pipe: PipelineSpec, tilings: dict[str, str]) -> PipelineSpec:
    """`pipe` with `tilings` ({"BATCHxMxNxK": tiling}, measured by `--tune`) given to its `lower`
    pass (its gemm_tilings option, validated there). The cache key covers them (the pipeline's JSON)."""
    if not tilings:
        return pipe
    passes = [p.model_copy(update={"options": {**p.options, "gemm_tilings": {**p.options.get("gemm_tilings", {}),
                                                                             **tilings}}})
              if p.name == "lower" else p for p in pipe.passes]
    return pipe.model_copy(update={"passes": passes})


def check_precision(precision: str, device: DeviceSpec, target: str) -> str | None:
    """Refuse a precision dlcc cannot compile for `device` (one error naming both); returns a note
    where it compiles but is emulated (tensor cores on OpenCL)."""
    if precision not in BUILT_PRECISIONS:
        raise ConfigError(f"precision {precision} is not available yet: dlcc compiles "
                          f"{' and '.join(BUILT_PRECISIONS)}")
    if precision == "fp32":
        return None
    arch = int(device.arch.removeprefix("sm_")) if device.arch and device.arch.startswith("sm_") else None
    if device.kind == "gpu" and arch is not None and arch < 80:
        raise ConfigError(f"precision {precision} needs tensor cores with {precision.upper().removesuffix('X3')} "
                          f"(sm_80 or newer); "
                          f"device {device.name} is {device.arch}")
    if target != "cuda":
        rounding = "TF32 rounding of the split operands" if precision == "tf32x3" else f"{precision.upper()} rounding"
        # (a GPU spec's plan built for OpenCL: `dlcc inspect --device h100`, the suite's H100 plans on PoCL)
        where = f"planned for {device.name}; on {target}" if device.kind == "gpu" else f"on {target}"
        return (f"precision {precision} {where}: no tensor cores there; the mma instructions are emulated "
                f"(the same fragment layout and {rounding}: for testing, not for speed)")
    return None


#: A bound dim: positive, and within the kernels' 32-bit indices.
Dim = Annotated[int, Field(gt=0, le=INT32_MAX)]


class ShapeBindings(Strict):
    """`shapes:` maps an input name to its dims, or a symbolic dim name to one value.

        shapes:
          input_ids: [1, 128]
          batch: 8
    """

    shapes: dict[str, list[Dim] | Dim]


def load_shape_bindings(path: str | Path) -> dict[str, tuple[int, ...]]:
    spec = load_yaml_model(path, ShapeBindings)
    return {k: tuple(v) if isinstance(v, list) else (v,) for k, v in spec.shapes.items()}


def _fmt_validation(path: str, err: ValidationError) -> str:
    lines = []
    seen = set()
    for e in err.errors():
        # Drop pydantic's union-member tags (`list[constrained-int]`) from the field path.
        parts = [str(x) for x in e["loc"] if not (isinstance(x, str) and ("[" in x or "-" in x))]
        loc = ".".join(parts) or "(top level)"
        if (loc, e["type"]) in seen:
            continue
        seen.add((loc, e["type"]))
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key (not a field of this config)"
        lines.append(f"{path}: {loc}: {msg}")
    return "\n".join(lines)


#: libyaml's safe loader where PyYAML was built with it (about 10x faster: a warm `dlcc batch` loads
#: two specs per job), else the pure-Python one. Both accept the same documents.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml_model(path: str | Path, cls: type[BaseModel]) -> Any:
    path = Path(path)
    try:
        text = path.read_bytes()  # bytes: YAML's own encoding detection (UTF-8, or UTF-16 with a BOM)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        data = yaml.load(text, Loader=_LOADER)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of {cls.__name__} fields at the top level")
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_fmt_validation(str(path), e)) from None


def builtin_dir(kind: str) -> Path:
    return Path(str(resources.files("dlcc.configs").joinpath(kind)))


def builtin_names(kind: str) -> list[str]:
    d = builtin_dir(kind)
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def resolve(kind: str, name_or_path: str | Path) -> Path:
    """A built-in name (`h100`) or a path to a YAML file."""
    s = str(name_or_path)
    if s.endswith((".yaml", ".yml")) or "/" in s or Path(s).is_file():
        return Path(s)
    p = builtin_dir(kind) / f"{s}.yaml"
    if not p.is_file():
        raise ConfigError(f"unknown {kind[:-1]} {s!r}; built-in ones are: {', '.join(builtin_names(kind))} "
                          f"(or pass a path to a .yaml file)")
    return p


def load_device(name_or_path: str | Path) -> DeviceSpec:
    path = resolve("devices", name_or_path)
    spec = load_yaml_model(path, DeviceSpec)
    spec._yaml_dir = Path(path).parent
    if spec.profile_db and not device_profile_db(spec).is_file():
        raise ConfigError(f"{path}: profile_db: {spec.profile_db!r} is not a file beside it")
    return spec


def device_profile_db(spec: DeviceSpec) -> Path | None:
    """The profile database `spec` comes with (DeviceSpec.profile_db, beside its YAML), or None."""
    if not spec.profile_db:
        return None
    return (spec._yaml_dir or Path.cwd()) / spec.profile_db


def load_pipeline(name_or_path: str | Path) -> PipelineSpec:
    path = resolve("pipelines", name_or_path)
    spec = load_yaml_model(path, PipelineSpec)
    from .passes import PASSES

    for k, p in enumerate(spec.passes):
        if p.name not in PASSES:
            raise ConfigError(f"{path}: passes.{k}.name: unknown pass {p.name!r}; registered passes are: "
                              f"{', '.join(sorted(PASSES))}")
        PASSES[p.name].check_options(p.options, f"{path}: passes.{k}.options")
    from .passes import check_order

    check_order([p.name for p in spec.passes], str(path))
    from .ops.registry import _REGISTRY

    for k, op in enumerate(spec.fp32_ops):
        if op not in _REGISTRY:
            raise ConfigError(f"{path}: fp32_ops.{k}: {op!r} is not an op type dlcc lowers "
                              f"(`dlcc list ops` shows them)")
    return spec
