#!/usr/bin/env bash
# Builds and runs every CPU test: once optimised (CUDA kernels compiled when nvcc is
# present; GPU tests themselves run on a GPU machine via scripts/gpu_tests.sh), once
# under AddressSanitizer + UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
jobs="$(nproc)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs")
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DLOCKS_SANITIZE=ON -DLOCKS_CUDA=OFF -DLOCKS_BUILD_BENCH=OFF >/dev/null
cmake --build build-asan -j"$jobs"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j"$jobs")
# Python package (torch operators, transformers drop-in, SmolLM2 tests): pytest.
scripts/python_tests.sh
