#!/usr/bin/env bash
# On the device (carry .devcarry/l1 from prepare.sh): each variant's bench against main's,
# same run, two-level rows (Llama-3.1-8B 1M b1, GLM-4-9B 1M b1, Llama-3.1-8B 128K b8; ROWS= to
# change) each twice, alternating binaries; then the 3-block variant's
# two-level tests and memcheck of them. ~4-6 min.
set -u
cd "$(dirname "$0")/../../../.." || exit 2
P=.devcarry/l1 B=/tmp/l1bin OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
for v in main b3 b4 b3p; do
  mkdir -p $B/$v/bench/cuda
  xz -dc $P/bench_$v.xz >$B/$v/bench/cuda/locks_bench_cuda && chmod +x $B/$v/bench/cuda/locks_bench_cuda
done
mkdir -p $B/b3/tests/cuda
xz -dc $P/tests_b3.xz >$B/b3/tests/cuda/locks_cuda_tests && chmod +x $B/b3/tests/cuda/locks_cuda_tests
export LOCKS_AB_ROWS="${ROWS:-Llama 1048576 1;GLM 1048576 1;Llama 131072 8}"
export LOCKS_AB_ARGS=--two-level LOCKS_AB_BASE_ARGS=--two-level
for v in ${VARIANTS:-b3 b4 b3p}; do
  echo "##### $v"
  LOCKS_COMMIT=$v LOCKS_CUDA_BUILD=$B/$v LOCKS_BENCH_BASE=$B/main/bench/cuda/locks_bench_cuda \
    OUT="$OUT/ab_$v" timeout 150 scripts/gpu_tests.sh ab >"$OUT/ab_$v.stdout" 2>&1
  python3 scripts/ab_table.py "$OUT/ab_$v/ab.log"
done
LOCKS_COMMIT=b3 LOCKS_CUDA_BUILD=$B/b3 OUT="$OUT/b3" LOCKS_MEMCHECK_FILTER='CudaTwoLevel.*:CudaSuperBuild.*' \
  timeout 200 scripts/gpu_tests.sh memcheck
LOCKS_COMMIT=b3 $B/b3/tests/cuda/locks_cuda_tests --gtest_filter='CudaTwoLevel.*:CudaSuperBuild.*' 2>&1 | tail -3
