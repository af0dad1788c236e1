#!/usr/bin/env bash
# Installs everything dlcc needs on a fresh machine, idempotently:
#   - PoCL (the OpenCL CPU device every numerics check runs on), through apt where apt exists;
#   - a virtual environment in .venv with dlcc (editable) and its extras.
# Usage: scripts/setup.sh [EXTRAS]   (default extras: opencl; the test command passes dev,models)
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${1:-opencl}"
# With an NVIDIA GPU, also install PyCUDA so the CUDA target is used by default.
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then EXTRAS="$EXTRAS,cuda"; fi
PY="${PYTHON:-python3}"

have_opencl_icd() { ls /etc/OpenCL/vendors/*.icd >/dev/null 2>&1; }

if ! have_opencl_icd; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    echo "[setup] installing PoCL (pocl-opencl-icd) with apt-get" >&2
    $SUDO apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq pocl-opencl-icd >/dev/null
  else
    echo "[setup] warning: no OpenCL ICD and no apt-get; install PoCL or a GPU OpenCL driver yourself" >&2
  fi
fi

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv" >&2
  "$PY" -m venv .venv
fi
# Reinstall only when pyproject.toml or the extras changed.
STAMP=".venv/.dlcc-setup-$(cat pyproject.toml | sha1sum | cut -c1-12)-${EXTRAS//,/_}"
if [ ! -f "$STAMP" ]; then
  echo "[setup] installing dlcc[$EXTRAS] into .venv (first run takes a few minutes)" >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null 2>&1 || true
  if ! .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$EXTRAS]" > .venv/setup.log 2>&1; then
    cat .venv/setup.log >&2
    if [[ "$EXTRAS" == *cuda* ]]; then
      echo "[setup] installing with PyCUDA failed; falling back to OpenCL only" >&2
      EXTRAS="${EXTRAS//,cuda/}"
      .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$EXTRAS]" >> .venv/setup.log 2>&1 \
        || { cat .venv/setup.log >&2; exit 1; }
    else
      exit 1
    fi
  fi
  .venv/bin/python -c "import dlcc" # fail loudly if the install did not work
  rm -f .venv/.dlcc-setup-*
  touch "$STAMP"
fi
