"""Batch manifests (`dlcc batch MANIFEST.yaml`): the YAML a team keeps beside its code, validated by
pydantic, and its expansion into concrete jobs.

    defaults: {target: opencl, pipeline: baseline}      # any compile option
    include: [more-models.yaml]                         # other manifests, relative to this one
    jobs:
      - model: models/bert.onnx                         # a path relative to the manifest, or a glob
        shapes: {input_ids: [1, 128]}
        pipelines: [baseline, astitch]                  # lists expand: models x pipelines x precisions x devices x targets
        precisions: [fp32, bf16]                        # GEMMs on CUDA cores or tensor cores
      - model: models/*.onnx
        verify: {rtol: 1e-3, atol: 1e-4}                # compile, run, compare with onnxruntime (default
                                                        # tolerances: the precision's, as `dlcc verify`)
      - model: models/exotic.onnx
        expect: unsupported                             # a known gap stays green until it is fixed
      - model: models/detector.onnx
        fallback: onnxruntime                           # what dlcc cannot compile runs on onnxruntime

Why expansion happens here, up front and deterministically: sharding (`--shard I/N`) must give every
CI machine the same job list without talking to the others, so names, order and costs depend only
on the manifest and the files it names. That is why measured costs come from files the manifest
names (`costs: [last-run.json]`, committed beside it) and not from whatever a machine's cache holds.
"""
from __future__ import annotations

import glob
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from ..config import Precision, load_yaml_model
from ..errors import ConfigError

Expect = Literal["pass", "unsupported", "fail"]
#: A job's time limit when neither the manifest nor `--timeout` sets one: generous (a compile takes
#: seconds, a verify of a large model on PoCL minutes), but a hung job cannot hold CI forever.
DEFAULT_TIMEOUT_S = 1800.0


class VerifySpec(BaseModel):
    """None tolerances are the job's precision's defaults (dlcc.verify.DEFAULT_TOLERANCE), filled in
    when the manifest expands."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    rtol: float | None = Field(None, ge=0)
    atol: float | None = Field(None, ge=0)
    seed: int = 0
    # A float16 or bfloat16 output is judged at least at its type's pair (verify.OUTPUT_TOLERANCE),
    # as `dlcc verify` does with its default tolerances; set where a tolerance is the default.
    half_output_floor: bool = False

    def for_precision(self, precision: str) -> "VerifySpec":
        from ..verify import DEFAULT_TOLERANCE

        r, a = DEFAULT_TOLERANCE.get(precision, DEFAULT_TOLERANCE["fp32"])
        return self.model_copy(update={"rtol": r if self.rtol is None else self.rtol,
                                       "atol": a if self.atol is None else self.atol,
                                       "half_output_floor": self.half_output_floor or None in (self.rtol, self.atol)})


class Options(BaseModel):
    """Compile options a job or the defaults may set. A singular key and its plural list are the
    same axis: `pipeline: astitch` or `pipelines: [baseline, astitch]`."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    target: str | None = None
    targets: list[str] | None = None
    pipeline: str | None = None
    pipelines: list[str] | None = None
    device: str | None = None
    devices: list[str] | None = None
    precision: Precision | None = None
    precisions: list[Precision] | None = None
    shapes: dict[str, list[PositiveInt] | PositiveInt] | None = None
    verify: bool | VerifySpec | None = None
    expect: Expect | None = None
    timeout: float | None = Field(None, gt=0, description="seconds a job may run (default: --timeout, else 1800)")
    fallback: Literal["onnxruntime"] | None = Field(None, description="run the nodes dlcc cannot compile on this "
                                                    "engine (docs/fallback.md)")

    @model_validator(mode="after")
    def _one_of_each(self):
        for one in ("target", "pipeline", "device", "precision"):
            if getattr(self, one) is not None and getattr(self, one + "s") is not None:
                raise ValueError(f"give `{one}` or `{one}s`, not both")
            if getattr(self, one + "s") == []:
                raise ValueError(f"`{one}s` is empty")
        return self


class JobSpec(Options):
    model: str | list[str] = Field(description="ONNX file(s), relative to the manifest; globs allowed")
    name: str | None = Field(None, description="job name prefix (default: the model file's stem)")
    cost: float | None = Field(None, gt=0, description="expected cost for --shard balancing (default: model size)")


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    defaults: Options = Options()
    include: list[str] = []
    jobs: list[JobSpec] = []
    costs: list[str] = Field([], description="summary.json files of earlier runs (relative to the manifest): "
                             "measured job times for --shard balancing")


@dataclass(frozen=True)
class Job:
    """One compile (and maybe verify) of one model with one pipeline, device and target."""
    name: str
    model: str  # absolute path
    pipeline: str
    device: str | None
    target: str
    shapes: dict = field(default_factory=dict, hash=False, compare=False)
    verify: VerifySpec | None = None
    expect: Expect = "pass"
    cost: float = 1.0
    cost_source: Literal["manifest", "measured", "size"] = "size"  # where `cost` came from (see with_costs)
    where: str = ""  # manifest file and field, for messages
    timeout: float | None = None  # seconds; None: the batch's default (DEFAULT_TIMEOUT_S unless --timeout)
    precision: str | None = None  # None: the pipeline's own
    fallback: str | None = None  # "onnxruntime": a split model (dlcc/partition.py)

    def as_dict(self) -> dict:
        return {"name": self.name, "model": self.model, "pipeline": self.pipeline, "precision": self.precision,
                "device": self.device,
                "target": self.target, "shapes": self.shapes, "expect": self.expect, "cost": self.cost,
                "verify": self.verify.model_dump() if self.verify else None, "where": self.where,
                "timeout": self.timeout, "cost_source": self.cost_source, "fallback": self.fallback}


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(s: str) -> str:
    """A file-system-safe job name part (artifact directories and JUnit names use it)."""
    return _UNSAFE.sub("_", s).strip("._") or "x"


def _axis(spec: Options, defaults: Options, one: str, fallback):
    for o in (spec, defaults):
        if getattr(o, one + "s") is not None:
            return list(getattr(o, one + "s"))
        if getattr(o, one) is not None:
            return [getattr(o, one)]
    return [fallback]


def _pick(spec: Options, defaults: Options, key: str, fallback):
    v = getattr(spec, key)
    return v if v is not None else (getattr(defaults, key) if getattr(defaults, key) is not None else fallback)


def _models(spec: JobSpec, base: Path, where: str) -> list[Path]:
    pats = [spec.model] if isinstance(spec.model, str) else spec.model
    found: list[Path] = []
    for pat in pats:
        try:
            p = Path(pat).expanduser()
            p = p if p.is_absolute() else base / p
            if glob.has_magic(str(p)):
                hits = sorted(Path(h) for h in glob.glob(str(p), recursive=True) if Path(h).is_file())
                if not hits:
                    raise ConfigError(f"{where}.model: the glob {pat!r} matches no file (relative to {base})")
                found += hits
            elif not p.is_file():
                raise ConfigError(f"{where}.model: {pat!r} not found (looked for {p})")
            else:
                found.append(p)
        except (OSError, ValueError, RuntimeError) as e:  # a name too long, a NUL byte, ~nosuchuser
            raise ConfigError(f"{where}.model: {pat[:80]!r} is not a usable path: {getattr(e, 'strerror', None) or e}"
                              ) from None
    return list(dict.fromkeys(p.resolve() for p in found))


def load_manifest(path: str | Path, _seen: tuple = ()) -> list[Job]:
    """The jobs of manifest `path` (and of the manifests it includes), in order, with unique names."""
    try:
        path = Path(path).resolve()
        present = path.is_file()
    except (OSError, ValueError, RuntimeError) as e:
        raise ConfigError(f"{_seen[-1] if _seen else 'manifest'}: {str(path)[:80]!r} is not a usable path: "
                          f"{getattr(e, 'strerror', None) or e}") from None
    if path in _seen:
        raise ConfigError(f"{_seen[-1]}: include: {path} includes itself (cycle: "
                          f"{' -> '.join(str(p) for p in _seen + (path,))})")
    if not present:
        raise ConfigError(f"{path}: manifest not found" if not _seen else f"{_seen[-1]}: include: {path} not found")
    man: Manifest = load_yaml_model(path, Manifest)
    base = path.parent
    jobs: list[Job] = []
    for inc in man.include:
        jobs += load_manifest(base / inc if not Path(inc).is_absolute() else Path(inc), _seen + (path,))
    d = man.defaults
    for k, spec in enumerate(man.jobs):
        where = f"{path}: jobs.{k}"
        verify = _pick(spec, d, "verify", None)
        verify = VerifySpec() if verify is True else (None if verify is False else verify)
        shapes = {k: list(v) if isinstance(v, list) else [v] for k, v in (_pick(spec, d, "shapes", {}) or {}).items()}
        expect = _pick(spec, d, "expect", "pass")
        models = _models(spec, base, where)
        for model in models:
            stem = model.stem if not spec.name else (f"{spec.name}-{model.stem}" if len(models) > 1 else spec.name)
            size = model.stat().st_size or 1
            for pipeline, precision in ((p, q) for p in _axis(spec, d, "pipeline", "baseline")
                                        for q in _axis(spec, d, "precision", None)):
                for device in _axis(spec, d, "device", None):
                    for target in _axis(spec, d, "target", "auto"):
                        parts = [stem, pipeline] + ([precision] if precision else []) + [device or "default", target]
                        name = "-".join(safe_name(Path(p).stem if p.endswith((".yaml", ".yml")) else p)
                                        for p in parts)
                        vspec = verify.for_precision(precision or _pipeline_precision(pipeline, base)) if verify else None
                        jobs.append(Job(name, str(model), pipeline, device, target, dict(shapes), vspec, expect,
                                        spec.cost or size / 1e6, "manifest" if spec.cost else "size", where,
                                        _pick(spec, d, "timeout", None), precision,
                                        _pick(spec, d, "fallback", None)))
    return with_costs(jobs, [_read_costs(base / c, f"{path}: costs.{k}") for k, c in enumerate(man.costs)])


def _pipeline_precision(pipeline: str, base: Path) -> str:
    """The precision a pipeline sets itself (for its verify tolerances); fp32 where it cannot be
    read here (the job's compile then reports why)."""
    from ..config import load_pipeline

    try:
        p = Path(pipeline)
        return load_pipeline(base / p if p.suffix in (".yaml", ".yml") and not p.is_absolute() else pipeline).precision
    except Exception:
        return "fp32"


def _read_costs(path: Path, where: str) -> dict[str, float]:
    """{job name: seconds} from a `dlcc batch` summary.json (OUT/summary.json or `--json`), counting
    only jobs that compiled (a cache hit's seconds say nothing of the job's cold cost)."""
    import json

    try:
        rows = json.loads(path.read_text())["rows"]
        return {r["name"]: float(r["seconds"]) for r in rows if r.get("cache_hit") is not True and r.get("seconds")}
    except FileNotFoundError:
        raise ConfigError(f"{where}: {path} not found (a summary.json of an earlier `dlcc batch` run)") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{where}: {path} is not a `dlcc batch` summary.json ({type(e).__name__}: {e})") from None


def with_costs(jobs: list[Job], measured: list[dict[str, float]]) -> list[Job]:
    """Jobs with measured costs: a `cost:` in the manifest wins; else the job's measured seconds
    (the last file that has it); else its size-based cost scaled by the median seconds-per-cost of
    the measured jobs, so that measured and unmeasured jobs are in one unit."""
    times: dict[str, float] = {}
    for m in measured:
        times.update(m)
    hits = [j for j in jobs if j.cost_source == "size" and j.name in times]
    if not hits:
        return jobs
    ratios = sorted(times[j.name] / j.cost for j in hits)
    scale = ratios[len(ratios) // 2]
    return [j if j.cost_source == "manifest" else
            replace(j, cost=times[j.name], cost_source="measured") if j.name in times else
            replace(j, cost=j.cost * scale) if j.cost_source == "size" else j for j in jobs]


def check_unique(jobs: list[Job]) -> None:
    """Two jobs with one name would write one artifact directory: refuse, naming both."""
    seen: dict[str, Job] = {}
    dups = []
    for j in jobs:
        if j.name in seen:
            dups.append(f"  {j.name}: {seen[j.name].where} ({seen[j.name].model}) and {j.where} ({j.model})")
        else:
            seen[j.name] = j
    if dups:
        raise ConfigError("duplicate job names (give one of each pair a `name:`, or drop the repeat):\n"
                          + "\n".join(dups))


def shard(jobs: list[Job], index: int, count: int) -> list[Job]:
    """Shard `index` (1-based) of `count`: a deterministic, disjoint part; all shards together are
    every job once. Balanced by expected cost: longest first, each to the least loaded shard
    (ties to the lowest shard), so each machine computes the same split on its own."""
    if count < 1 or not 1 <= index <= count:
        raise ConfigError(f"--shard {index}/{count}: want I/N with 1 <= I <= N")
    load = [0.0] * count
    mine: set[str] = set()
    for j in sorted(jobs, key=lambda j: (-j.cost, j.name)):
        s = min(range(count), key=lambda i: (load[i], i))
        load[s] += j.cost
        if s == index - 1:
            mine.add(j.name)
    return [j for j in jobs if j.name in mine]
