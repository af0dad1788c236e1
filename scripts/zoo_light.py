#!/usr/bin/env python3
"""The ONNX model zoo's classic CNNs, as the onnx wheel ships them, through dlcc against onnxruntime.

onnx's backend tests carry nine "light" model-zoo files (onnx/backend/test/data/light: AlexNet,
DenseNet-121, Inception v1 and v2, ResNet-50, ShuffleNet, SqueezeNet, VGG-19, ZFNet-512): Caffe2
conversions at opset 9, with LRN, Sum, Dropout, old-style BatchNormalization and initializers
listed as graph inputs (IR version 3). To keep the files small their weights are ConstantOfShape
nodes, so every output is the same value and any compiler "matches". This script puts random
weights in their place (running variances and BatchNorm scales positive) and verifies each model
through the pipelines on this machine's best target, so what the comparison checks is the math.

    python scripts/zoo_light.py                                  # all nine, astitch and full
    python scripts/zoo_light.py --models resnet50,squeezenet --pipelines baseline

Prints one line per model and pipeline, and exits 1 if any output differs.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

MODELS = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet",
          "vgg19", "zfnet512"]


def with_random_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """`model` with every ConstantOfShape of a constant shape replaced by an initializer of random
    values: scaled by 1/sqrt(fan-in), and in [0.5, 1.5] where a BatchNormalization reads it as its
    scale or variance (a negative variance would make the reference NaN)."""
    rng = np.random.default_rng(seed)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    positive = {x for n in g.node if n.op_type == "BatchNormalization" for x in list(n.input[1:2]) + list(n.input[4:5])}
    keep = []
    for n in g.node:
        if n.op_type == "ConstantOfShape" and n.input[0] in consts:
            shape = [int(d) for d in consts[n.input[0]]]
            if n.output[0] in positive:
                w = rng.uniform(0.5, 1.5, shape)
            else:
                fan = int(np.prod(shape[1:])) if len(shape) > 1 else 1
                w = rng.uniform(-1.0, 1.0, shape) / np.sqrt(max(fan, 1))
            g.initializer.append(numpy_helper.from_array(w.astype(np.float32), n.output[0]))
        else:
            keep.append(n)
    del g.node[:]
    g.node.extend(keep)
    return m


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--pipelines", default="astitch,full")
    ap.add_argument("--target", default="auto", help="cuda, opencl or auto (the best one here)")
    a = ap.parse_args()
    import dlcc
    from dlcc.verify import verify_outputs

    light = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    failed = 0
    with tempfile.TemporaryDirectory(prefix="dlcc-zoo-light-") as tmp:
        for name in a.models.split(","):
            src = light / f"light_{name}.onnx"
            if not src.is_file():
                print(f"{name}: not in this onnx wheel ({src})")
                failed += 1
                continue
            path = Path(tmp) / f"{name}.onnx"
            onnx.save(with_random_weights(onnx.load(str(src))), str(path))
            for pipeline in a.pipelines.split(","):
                m = dlcc.compile(str(path), target=a.target, pipeline=pipeline)
                feeds = m.sample_inputs(0)
                rows = verify_outputs(str(path), m(feeds), feeds)
                ok = all(r["passed"] for r in rows)
                failed += not ok
                worst = max(r.get("max_rel_err") or 0.0 for r in rows)
                print(f"{name:13s} {pipeline:9s} {'PASS' if ok else 'FAIL'}  max rel err {worst:.3g}  "
                      f"({len(m.plan['launches'])} launches)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
