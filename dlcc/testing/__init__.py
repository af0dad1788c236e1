"""Differential testing of dlcc against onnxruntime on generated graphs (issue 17).

- choices.py: the recorded random choices a graph is built from (what shrinking edits);
- graphgen.py: the graph generator, biased toward what AStitch, Rammer and GEMM fusion rewrite;
- oracle.py: every pipeline and option set a graph goes through, and the verdict for each;
- shrink.py: reducing a failing graph to a minimal regression case;
- pool.py: worker processes with a per-case timeout (a hang is a verdict too).

`scripts/fuzz.py` drives large runs; `tests/test_fuzz.py` runs a fixed batch in the default suite.
"""
