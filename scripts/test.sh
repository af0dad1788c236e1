#!/usr/bin/env bash
# The README's test command (and what .ci/run calls): set up, then run the default test suite.
# Extra arguments go to pytest, e.g. scripts/test.sh -m slow   (the long suites; see README).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh "dev,models"
exec .venv/bin/python -m pytest -n "${DLCC_TEST_WORKERS:-2}" -q "$@"
