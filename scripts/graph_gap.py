#!/usr/bin/env python3
"""Device time a kernel costs inside a CUDA graph replay beyond its own work (issue 20: what a
separate launch costs Rammer's join decision when the plan is replayed as one graph, the
`kernel_fixed_us` floor of passes/rammer.py _launch_floor_us). Captures N launches of a one-element
add through PyTorch into one graph and prints the replay's µs per kernel (CUDA events, median).

    python scripts/graph_gap.py            # needs a CUDA build of torch and a GPU
"""
import argparse
import statistics

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=30)
    a = ap.parse_args()
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
