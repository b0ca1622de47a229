#!/usr/bin/env bash
# Installs and builds the Python package (scripts/python_setup.sh) and runs its tests (pytest
# tests/python), then the vLLM plugin's CPU tests. Called by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
PYTHON="$PY" scripts/python_setup.sh
export HF_HUB_OFFLINE=1
"$PY" -m pytest -q -p no:cacheprovider tests/python "$@"
# The vLLM plugin's CPU tests (python/locks/vllm, tests/vllm): installs vLLM 0.26.0 --no-deps.
PYTHON="$PY" scripts/vllm_tests.sh
