#!/usr/bin/env bash
# Here (no GPU): the three v45 variants as commits on top of BASE (default main), their
# binaries built and packed, and one carry folder for call.sh (~47 MB with the suite binary).
#   docs/lab/results/v45_level1_blocks/prepare.sh [BASE]
set -euo pipefail
cd "$(dirname "$0")/../../../.."
here=docs/lab/results/v45_level1_blocks
base=$(git rev-parse --short "${1:-main}^{commit}")
out=.devcarry/l1
mkdir -p "$out"
for v in l1-b3 l1-b4 l1-b3p; do
  git branch -f "$v" "$base"
  wt=/tmp/v45-$v
  rm -rf "$wt" && git worktree prune && git worktree add -q --detach "$wt" "$v"
  git -C "$wt" apply "$PWD/$here/$v.patch"
  git -C "$wt" commit -qam "super_score: v45 variant $v (experiment; $here)"
  git branch -f "$v" "$(git -C "$wt" rev-parse HEAD)"
  git worktree remove --force "$wt"
  LOCKS_AB_PACK=.devcarry/abx-$v scripts/gpu_ab.sh pack "$base" "$v"
  cp .devcarry/abx-$v/locks_bench_new.xz "$out/bench_${v#l1-}.xz"
done
cp .devcarry/abx-l1-b3/locks_bench_base.xz "$out/bench_main.xz"
cp .devcarry/abx-l1-b3/locks_cuda_tests.xz "$out/tests_b3.xz"  # the suite with 3 blocks
echo "$base" >"$out/BASE"
du -sh "$out"
echo "on the device: carry $out; run bash $here/call.sh"
