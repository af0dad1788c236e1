#!/usr/bin/env bash
# The README's test command (and what .ci/run calls): set up, then run the default test suite.
# Extra arguments go to pytest, e.g. scripts/test.sh -m slow   (the long suites; see README).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh "dev,models"
# One worker more than the cores (at most 8: each holds models and PoCL builds in memory): a worker
# waiting on a subprocess (nvcc, a batch's workers, the onnxruntime folder) leaves its core to the
# others. On CI's 2 cores, 3 workers took 942-954 s of pytest where 2 took 1,027-1,075 s.
workers=$(( $(nproc 2>/dev/null || echo 2) + 1 ))
exec .venv/bin/python -m pytest -n "${DLCC_TEST_WORKERS:-$(( workers < 8 ? workers : 8 ))}" -q "$@"
