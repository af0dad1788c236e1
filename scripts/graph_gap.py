#!/usr/bin/env python3
"""Device time a kernel costs inside a CUDA graph replay beyond its own work (issue 20: what a
separate launch costs Rammer's join decision when the plan is replayed as one graph, the
`kernel_fixed_us` floor of passes/rammer.py _launch_floor_us). Captures N launches of a one-element
add through PyTorch into one graph and prints the replay's µs per kernel (CUDA events, median).

It also measures what the other side of that decision costs: one grid barrier of a persistent
kernel (dlcc_grid_sync, backends/prelude_common.h), the device spec's `grid_barrier_us` (2.0 µs,
AStitch's V100 figure, never measured on dlcc's own kernel). A kernel of one resident 256-thread
block per SM runs N barriers and none, each timed in a CUDA graph (dlcc's own runtime), and the
difference over N is printed.

    python scripts/graph_gap.py                     # needs a CUDA build of torch and a GPU
    python scripts/graph_gap.py --target opencl     # the barrier part only, on PoCL (a smoke test)
"""
import argparse
import statistics

BARRIER_KERNEL = """KERNEL void barriers(GPTR int* bar, const int n) {
    for (int i = 0; i < n; ++i) dlcc_grid_sync(bar);
}"""


def barrier_us(target: str, n: int, repeat: int) -> tuple[float, int]:
    """(µs per grid barrier, blocks) on `target`: the barrier kernel at n barriers minus at none,
    over n, at the grid the runtime proves resident (one block per SM on a GPU)."""
    import numpy as np

    from dlcc.backends.source import render
    from dlcc.executor import make_runtime
    from dlcc.tuning import time_kernel

    rt = make_runtime(target)
    with rt.active():
        rt.compile(render([BARRIER_KERNEL], rt.dialect))
        k = rt.kernel("barriers")
        grid = rt.resident_blocks(k, 256) if target == "opencl" else min(rt.resident_blocks(k, 256),
                                                                           rt.dev.get_attribute(rt.drv.device_attribute.MULTIPROCESSOR_COUNT))
        bar = rt.alloc(8)
        rt.write(bar, 0, np.zeros(2, np.int32))
        view = rt.view(bar, 0, 8)
        t0 = time_kernel(rt, k, grid, 256, [view, 0], repeat)
        tn = time_kernel(rt, k, grid, 256, [view, n], repeat)
        rt.finish()
    return (tn - t0) / n, grid


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", type=int, default=200)
    ap.add_argument("--barriers", type=int, default=200, help="grid barriers in the timed kernel")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--target", default="cuda", choices=["cuda", "opencl"])
    a = ap.parse_args()
    us, grid = barrier_us(a.target, a.barriers, a.repeat)
    print(f"{a.target}: {us:.2f} µs per grid barrier of {grid} blocks x 256 threads (dlcc_grid_sync; the device "
          f"spec's grid_barrier_us)")
    if a.target != "cuda":
        return 0
    import torch

    x = torch.zeros(1, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            x.add_(1)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(a.kernels):
            x.add_(1)
    g.replay()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(a.repeat):
        start.record()
        g.replay()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) * 1e3 / a.kernels)
    print(f"{torch.cuda.get_device_name()}: {statistics.median(samples):.2f} µs per kernel in a CUDA graph of "
          f"{a.kernels} one-element adds (median of {a.repeat} replays)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
