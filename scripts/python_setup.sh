#!/usr/bin/env bash
# Installs what the Python package needs (PyPI: scripts/python_deps.sh; with --vllm also vLLM's
# Python side for the plugin's CPU tests) and builds and installs the package `locks` against
# that torch. Called by scripts/test.sh (in the background), scripts/python_tests.sh and
# scripts/demo.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
PYTHON="$PY" scripts/python_deps.sh "$@"
# Build against the torch installed above (no build isolation: it would fetch a second torch).
"$PY" -m pip install -q --disable-pip-version-check --no-build-isolation .
