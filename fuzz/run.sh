#!/usr/bin/env bash
# Runs the libFuzzer harnesses built in BUILD (default build-asan, scripts/test.sh's sanitizer
# build; see fuzz/CMakeLists.txt):
# each one first over every committed corpus file (fuzz/corpus/<name>/), then fuzzing for
# SECONDS (default 45) from that corpus, the four harnesses at the same time (one process
# each, sharing the machine's cores: on CI's 2 cores, 30 s of wall time gives each harness
# ~15 s of CPU). New inputs go to a temporary folder, not the repo; a crash, sanitizer
# report, leak, timeout (10 s an input) or out-of-memory (2 GB) fails the script and leaves
# the input in BUILD/fuzz-artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build-asan}"
secs="${2:-45}"
names=(npy capture cli decode)
mkdir -p "$build/fuzz-artifacts"
base=/dev/shm; [[ -d $base && -w $base ]] || base="${TMPDIR:-/tmp}"
LOCKS_FUZZ_SCRATCH="$(mktemp -d "$base/locks_fuzz.XXXXXX")"
export LOCKS_FUZZ_SCRATCH
work="$(mktemp -d)"
trap 'rm -rf "$LOCKS_FUZZ_SCRATCH" "$work"' EXIT
for name in "${names[@]}"; do
  bin="$build/fuzz/fuzz_$name"
  corpus="fuzz/corpus/$name"
  [[ -x "$bin" ]] || { echo "fuzz/run.sh: $bin not built" >&2; exit 1; }
  files=("$corpus"/*)
  echo "== fuzz_$name: ${#files[@]} corpus files"
  "$bin" -artifact_prefix="$build/fuzz-artifacts/$name-" "${files[@]}" >"$build/fuzz-$name-corpus.log" 2>&1 ||
    { tail -40 "$build/fuzz-$name-corpus.log" >&2; exit 1; }
done
echo "== fuzzing ${names[*]}: ${secs} s, at the same time"
pids=()
for name in "${names[@]}"; do
  mkdir -p "$work/$name"
  "$build/fuzz/fuzz_$name" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
    -artifact_prefix="$build/fuzz-artifacts/$name-" -print_final_stats=1 \
    "$work/$name" "fuzz/corpus/$name" >"$build/fuzz-$name.log" 2>&1 &
  pids+=($!)
done
failed=0
for i in "${!names[@]}"; do
  name="${names[$i]}"
  status=0
  wait "${pids[$i]}" || status=$?
  echo "== fuzz_$name:"
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$build/fuzz-$name.log" || true
  if [[ $status -ne 0 ]]; then
    tail -60 "$build/fuzz-$name.log" >&2
    echo "fuzz/run.sh: fuzz_$name failed (status $status)" >&2
    failed=1
  fi
done
exit "$failed"
