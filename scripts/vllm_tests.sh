#!/usr/bin/env bash
# CPU tests of the vLLM plugin (tests/vllm), called by scripts/python_tests.sh after `locks` is
# installed; vLLM 0.26.0 (--no-deps) and the pure-Python packages its imports need come from
# scripts/python_deps.sh --vllm (skipped under LOCKS_PY_INSTALLED=1, where the caller has run
# it: its import checks alone take ~30 s). About 1 minute of installs cold; tests ~5-45 s.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
[ "${LOCKS_PY_INSTALLED:-}" = 1 ] || PYTHON="$PY" scripts/python_deps.sh --vllm
"$PY" -m pytest -q -p no:cacheprovider tests/vllm "$@"
