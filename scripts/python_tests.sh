#!/usr/bin/env bash
# Installs and builds the Python package (scripts/python_setup.sh --vllm) and runs its tests
# and the vLLM plugin's CPU tests (pytest tests/python tests/vllm). Called by
# scripts/test.sh with LOCKS_PY_INSTALLED=1, after it has run that set-up itself beside the C++
# builds (the set-up is then skipped here).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
[ "${LOCKS_PY_INSTALLED:-}" = 1 ] || PYTHON="$PY" scripts/python_setup.sh --vllm
export LOCKS_PY_INSTALLED=1
export HF_HUB_OFFLINE=1
# The torch operators' CUDA registration, compiled for syntax against the CUDA toolkit (the
# package here is built without it).
PYTHON="$PY" scripts/cuda_ops_syntax.sh
# One pytest run over the package's tests and the vLLM plugin's CPU tests (tests/vllm; also
# scripts/vllm_tests.sh alone), one single-threaded worker per core (pytest-xdist): the slow tests
# are small-model CPU inference, where two one-thread processes finish tests/python in 202 s
# against 315 s for one two-thread process (2-core CI machine, 2026-12-03). Work stealing keeps
# both workers busy to the end. On the same machine, 2026-12-07: tests/python (-n 2) then
# tests/vllm (one process, which left a core idle) took 271 + 54 s, the one run 221-231 s.
OMP_NUM_THREADS=1 "$PY" -m pytest -q -p no:cacheprovider -n "$(nproc)" --dist worksteal \
  tests/python tests/vllm "$@"
