#!/usr/bin/env bash
# Splits the vLLM bundle's two 51 MB parts (.vstage/p1/part0, .vstage/p2/part1, from
# ../shared/gpu/vllm/stage.sh) in halves, for when the working tree has grown so that a part
# and the tree no longer fit the 64 MiB a device call carries (the tree was 15.1 MB on
# 2026-12-07). Writes .vstage/p1a, p1b (part0's halves) and p2a, p2b (part1's halves; p2b also
# holds p2's scripts). Then the calls are (scripts/vllm_gpu_calls.sh): 0 (carry .vstage/p0),
# 1a (p1a), 1b (p1b), 2a (p2a), then 2 carrying .vstage/p2b and .devcarry/py.
set -euo pipefail
cd "$(dirname "$0")/.."
for f in .vstage/p1/part0 .vstage/p2/part1; do
  [ -f "$f" ] || { echo "missing $f: run ../shared/gpu/vllm/stage.sh first" >&2; exit 2; }
done
mkdir -p .vstage/p1a .vstage/p1b .vstage/p2a .vstage/p2b
tmp=$(mktemp -d)
split -n 2 -d -a 1 .vstage/p1/part0 "$tmp/a."
mv "$tmp/a.0" .vstage/p1a/part0.a && mv "$tmp/a.1" .vstage/p1b/part0.b
split -n 2 -d -a 1 .vstage/p2/part1 "$tmp/b."
mv "$tmp/b.0" .vstage/p2a/part1.a && mv "$tmp/b.1" .vstage/p2b/part1.b
rmdir "$tmp"
find .vstage/p2 -maxdepth 1 -type f ! -name part1 -exec cp {} .vstage/p2b/ \;
du -sh .vstage/p1a .vstage/p1b .vstage/p2a .vstage/p2b
