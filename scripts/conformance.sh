#!/usr/bin/env bash
# The ONNX backend test suite (node and simple-model tests) against dlcc on OpenCL/PoCL.
# Prints passed / failed / skipped; a skip is a case using an op, dtype or attribute dlcc reports
# as unsupported (its reason is shown with -rs). Takes about 5 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh "dev,models"
exec .venv/bin/python -m pytest -m slow tests/test_onnx_backend.py -n "${DLCC_TEST_WORKERS:-2}" -q -rf --tb=line "$@"
