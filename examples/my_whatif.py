"""An example what-if for `dlcc estimate --trace RUN.json --what-if-file examples/my_whatif.py`.

Question: what would a 2x faster attention kernel buy, if its launch also went through a CUDA
graph? Every what-if in this file is predicted; parameters come from the command line
(`--what-if fast-attention:factor=3`).
"""
from dlcc.estimate.whatif import whatif


@whatif("fast-attention", help="attention 2x faster: attention/softmax kernels run `factor`x "
                               "faster and their launches cost nothing")
def fast_attention(g, factor: float = 2.0, pattern: str = r"fmha|flash|attention|softmax"):
    kernels = g.select(kind="kernel", name=pattern)          # Daydream's select
    g.shrink(kernels, factor)                                # ... and shrink
    for k in kernels:                                        # their launch calls (CPU tasks)
        for dep in k.deps:
            if dep.kind == "launch":
                dep.task.dur = 0.0
