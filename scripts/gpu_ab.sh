#!/usr/bin/env bash
# A same-run A/B of two revisions on the device without building there. Device minutes are the
# scarce part of a GPU session (a machine start costs ~2 min, a rebuild there ~1.5 min), and a
# call carries at most 64 MiB: so the binaries are built here, stripped and xz-compressed
# (~29 MB for the three), and the device call only unpacks them.
#   here:   scripts/gpu_ab.sh pack BASE_REV NEW_REV
#           builds locks_bench_cuda at BASE_REV and at NEW_REV, and locks_cuda_tests at NEW_REV
#           (git worktrees /tmp/gpu-ab/src-{base,new}, Release: ~6 min a revision on 2 cores the
#           first time, then only what the revisions change), into
#           .devcarry/abx/ (or $LOCKS_AB_PACK) with the revisions in REVS.
#   device: scripts/gpu_ab.sh run [PHASES...]   (carry .devcarry/abx; default phases: tests ab)
#           unpacks into /tmp/gpu-ab-bin and runs scripts/gpu_tests.sh with NEW_REV's binaries
#           (LOCKS_CUDA_BUILD) and BASE_REV's bench (LOCKS_BENCH_BASE); LOCKS_AB_ROWS and the
#           other gpu_tests.sh variables pass through. LOCKS_COMMIT is set to NEW_REV's hash.
set -euo pipefail
cd "$(dirname "$0")/.."
PACK=${LOCKS_AB_PACK:-.devcarry/abx}  # one folder a pair (e.g. .devcarry/abx-BRANCH)
mode=${1:-}
[ $# -gt 0 ] && shift
case "$mode" in
  pack)
    [ $# -eq 2 ] || { echo "usage: scripts/gpu_ab.sh pack BASE_REV NEW_REV" >&2; exit 2; }
    base=$(git rev-parse --short "$1^{commit}") new=$(git rev-parse --short "$2^{commit}")
    root=/tmp/gpu-ab
    mkdir -p "$root" "$PACK"
    rm -f "$PACK"/*.xz "$PACK"/REVS
    build() {  # build SLOT REV TARGETS...: prints the build folder
      # One worktree and build folder a slot (base, new), checked out at REV: a later pack
      # rebuilds only what changed (~1 min against ~6 for a fresh build on 2 cores).
      local wt=$root/src-$1 bd=$root/build-$1 rev=$2
      shift 2
      if [ -d "$wt" ]; then
        git -C "$wt" checkout -q --detach "$rev" >&2
      else
        git worktree add -q --detach "$wt" "$rev" >&2
      fi
      if [ -x "$wt/scripts/configure.sh" ]; then
        "$wt/scripts/configure.sh" "$bd" -DCMAKE_BUILD_TYPE=Release -DLOCKS_BUILD_BENCH=ON >&2
      else  # revisions before scripts/configure.sh (2026-12-07)
        cmake -S "$wt" -B "$bd" -DCMAKE_BUILD_TYPE=Release -DLOCKS_BUILD_BENCH=ON >&2
      fi
      cmake --build "$bd" -j"$(nproc)" --target "$@" >&2
      echo "$bd"
    }
    bb=$(build base "$base" locks_bench_cuda)
    nb=$(build new "$new" locks_bench_cuda locks_cuda_tests)
    strip -o "$root/locks_bench_base" "$bb/bench/cuda/locks_bench_cuda"
    strip -o "$root/locks_bench_new" "$nb/bench/cuda/locks_bench_cuda"
    strip -o "$root/locks_cuda_tests" "$nb/tests/cuda/locks_cuda_tests"
    for f in locks_bench_base locks_bench_new locks_cuda_tests; do
      xz -T"$(nproc)" -c "$root/$f" >"$PACK/$f.xz"
    done
    printf 'base %s\nnew %s\n' "$base" "$new" >"$PACK/REVS"
    du -sh "$PACK"
    echo "carry $PACK; on the device: scripts/gpu_ab.sh run [tests] [ab] (LOCKS_AB_ROWS=...)"
    ;;
  run)
    [ -f "$PACK/REVS" ] || { echo "no $PACK/REVS: carry $PACK (scripts/gpu_ab.sh pack)" >&2; exit 2; }
    bin=/tmp/gpu-ab-bin
    mkdir -p "$bin/new/bench/cuda" "$bin/new/tests/cuda"
    xz -dc "$PACK/locks_bench_base.xz" >"$bin/locks_bench_base"
    xz -dc "$PACK/locks_bench_new.xz" >"$bin/new/bench/cuda/locks_bench_cuda"
    xz -dc "$PACK/locks_cuda_tests.xz" >"$bin/new/tests/cuda/locks_cuda_tests"
    chmod +x "$bin/locks_bench_base" "$bin/new/bench/cuda/locks_bench_cuda" \
      "$bin/new/tests/cuda/locks_cuda_tests"
    cat "$PACK/REVS"
    export LOCKS_CUDA_BUILD="$bin/new" LOCKS_BENCH_BASE="$bin/locks_bench_base"
    export LOCKS_COMMIT="${LOCKS_COMMIT:-$(sed -n 's/^new //p' "$PACK/REVS")}"
    [ $# -eq 0 ] && set -- tests ab
    exec scripts/gpu_tests.sh "$@"
    ;;
  *)
    echo "usage: scripts/gpu_ab.sh pack BASE_REV NEW_REV | run [PHASES...]" >&2
    exit 2
    ;;
esac
