#!/usr/bin/env bash
# Builds everything and runs the main job: `locks demo` on its embedded default
# (the seed configuration: 65,536 tokens, head_dim 128, P 16, r 8, b 2048).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
build/tools/locks demo
