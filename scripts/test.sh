#!/usr/bin/env bash
# Builds and runs every CPU test: once optimised (CUDA kernels compiled when nvcc is
# present; GPU tests themselves run on a GPU machine via scripts/gpu_tests.sh), once
# under AddressSanitizer + UBSan; then the libFuzzer harnesses (clang).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
jobs="$(nproc)"
# The PyPI installs of the Python tests (torch, transformers, the model packages, vLLM's Python
# side: ~3 min of download, unpacking and bytecode compiles) run beside the C++ builds at the
# lowest CPU and disk priority, so that they take the builds' idle time rather than slow them
# (at normal priority they cost the Release build 232 s and saved ~185 s); waited for before
# pytest, their output shown then.
pydeps_log="$(mktemp)"
low=(nice -n 19)
ionice -c 3 true 2>/dev/null && low+=(ionice -c 3)
"${low[@]}" scripts/python_deps.sh --vllm >"$pydeps_log" 2>&1 &
pydeps=$!
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs")
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DLOCKS_SANITIZE=ON -DLOCKS_CUDA=OFF -DLOCKS_BUILD_BENCH=OFF >/dev/null
cmake --build build-asan -j"$jobs"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j"$jobs")
# libFuzzer harnesses (fuzz/, issue #12): the .npy reader, the capture reader and the CLI option
# parser, built with clang (-fsanitize=fuzzer,address,undefined); every corpus file, then 20 s
# of fuzzing each (CI time; `fuzz/run.sh build-fuzz SECONDS` for longer runs).
cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug -DLOCKS_FUZZ=ON -DLOCKS_CUDA=OFF -DLOCKS_BUILD_BENCH=OFF >/dev/null
cmake --build build-fuzz -j"$jobs" --target fuzz_npy fuzz_capture fuzz_cli
fuzz/run.sh build-fuzz 20
# Python package (torch operators, transformers drop-in, SmolLM2 tests): pytest.
pydeps_rc=0
wait "$pydeps" || pydeps_rc=$?
cat "$pydeps_log" && rm -f "$pydeps_log"
[ "$pydeps_rc" -eq 0 ] || { echo "scripts/python_deps.sh failed (exit $pydeps_rc)"; exit "$pydeps_rc"; }
scripts/python_tests.sh
