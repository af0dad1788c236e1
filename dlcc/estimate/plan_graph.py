"""The task graph of one of dlcc's own compiled plans (plan mode of `dlcc estimate`).

It mirrors what the launcher does (dlcc/executor.py): one host thread launches every kernel in
plan order on one stream, then synchronizes once. So the graph has

- per launch, a CPU "launch" task costing the DeviceSpec's `launch_overhead_us` (on a GPU device,
  when the plan replays its launches as a CUDA graph (`meta.graphs`), the first costs that for the
  whole graph and the others nothing: the host issues one cuGraphLaunch), and a GPU kernel
  task whose time comes from the cost model (`costmodel.launch_time`: roofline with wave
  quantization and a fixed cost, or a profile database's measurement; each task records which in
  ``args["source"]``), plus the device's `kernel_gap_us` (what a stream spends between two
  kernels, which no kernel's own timing sees: PoCL's dispatch of the next command);
- launch → kernel edges, stream order, data edges (kind "data": a kernel that reads a tensor
  another kernel wrote) that the co-scheduling what-if needs once it reorders the stream;
- a final synchronize that waits for the last kernel, and one iteration from the first launch to
  the synchronize's end: the predicted latency.
"""
from __future__ import annotations

from ..config import DeviceSpec
from .costmodel import launch_time, rprogram_time
from .graph import Dep, Iteration, Task, TaskGraph
from .profiledb import ProfileDB

SYNC_US = 1.0   # host cost of the final stream synchronize once the GPU is done


def plan_graph(plan: dict, device: DeviceSpec, db: ProfileDB | None = None, name: str = "plan") -> TaskGraph:
    g = TaskGraph(meta={"source": name, "device": device.name, "device_spec": device, "plan": plan, "db": db})
    kernels = {k["name"]: k for k in plan.get("kernels", [])}
    resources = (plan.get("cuda") or {}).get("resources") or {}
    if (plan.get("cuda") or {}).get("arch") not in (None, device.arch):
        resources = {}
    tensors = plan.get("tensors", {})
    host, stream = "cpu:host", "gpu0:stream 0"
    graphs = bool((plan.get("meta") or {}).get("graphs")) and device.kind == "gpu"
    begin = g.add(Task("begin inference", "marker", host, 0.0, iteration=0))
    writer: dict[str, Task] = {}
    last = None
    for i, L in enumerate(plan.get("launches", [])):
        k = kernels.get(L["kernel"])
        kt = launch_time(L, k, device, dtype=L.get("dtype") or "float32", resources=resources.get(L["kernel"]), db=db)
        overhead = device.launch_overhead_us if not graphs or i == 0 else 0.0
        cpu = g.add(Task(f"launch {L['kernel']}", "launch", host, overhead, iteration=0,
                         ops=(L.get("op_type") or "?",), args={"graph": graphs}))
        gpu = Task(L["kernel"], "kernel", stream, kt.us + device.kernel_gap_us, iteration=0, ops=(L.get("op_type") or "?",),
                   args={"index": i, "source": kt.source, "flops": L.get("flops", 0), "dram_bytes": L.get("dram_bytes", 0),
                         "category": L.get("category", ""), "class": "gemm" if L.get("category") == "compute" else "memory",
                         "grid": L.get("grid"), "block": L.get("block"), "node": L.get("node", ""),
                         "reads": L.get("reads", []), "writes": L.get("writes", []),
                         "compute_us": kt.compute_us, "memory_us": kt.memory_us})
        rp = L.get("rprogram")
        if rp:  # what the timeline needs to draw one track per vEU (timeline.py)
            veus = min(int(L.get("grid") or 1), int(rp.get("veus") or 1))
            _, per = rprogram_time(rp["waves"], veus, device, int(rp.get("sync_points") or 0))
            gpu.args["rprogram"] = {"veus": veus, "waves_us": per, "barrier_us": device.grid_barrier_us,
                                    "sync": bool(rp.get("sync_points")), "fixed_us": device.kernel_fixed_us,
                                    "waves": [w.get("entries") or [["op", w["tasks"]]] for w in rp["waves"]]}
        gpu.deps.append(Dep(cpu, "launch", 0.0))
        cpu.args["launches"] = [gpu]
        seen = set()
        for r in L.get("reads", []):
            w = writer.get(_base(tensors, r))
            if w is not None and id(w) not in seen:
                seen.add(id(w))
                gpu.deps.append(Dep(w, "data", 0.0))
        for w in L.get("writes", []):
            writer[_base(tensors, w)] = gpu
        g.add(gpu)
        last = gpu
    sync = g.add(Task("synchronize", "sync", host, SYNC_US, iteration=0))
    if last is not None:
        sync.waits.append(Dep(last, "sync", SYNC_US))  # returns SYNC_US after the GPU is done
    end = g.add(Task("end inference", "marker", host, 0.0, iteration=0))
    g.iterations.append(Iteration("inference", 0, begin, end, None))
    return g


def _base(tensors: dict, name: str) -> str:
    t = tensors.get(name)
    return (t or {}).get("view_of") or name
