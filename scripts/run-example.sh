#!/usr/bin/env bash
# The README's first command: set up, then compile the bundled example model for the best target
# here (CUDA when a GPU and PyCUDA are present, else OpenCL on the CPU through PoCL), run it, and
# verify it against onnxruntime.  Extra arguments go to `dlcc verify` (e.g. --target opencl).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh "${DLCC_EXTRAS:-opencl}"
MODEL=examples/resnet-tiny.onnx
.venv/bin/dlcc compile "$MODEL" -o out/resnet-tiny
.venv/bin/dlcc run out/resnet-tiny
.venv/bin/dlcc estimate "$MODEL" --device h100 --quiet   # predicted latency of each pipeline on an H100
.venv/bin/dlcc verify "$MODEL" "$@"
