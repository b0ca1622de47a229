#!/usr/bin/env bash
# Compiles the CUDA registration of the torch operators (python/csrc/ops_cuda.cpp and the
# headers it includes) for syntax and types only, against the installed torch's headers and
# the CUDA toolkit's: the package is built without its CUDA operators where torch has no CUDA
# (the CI machine), so without this check a change to them would first compile on the GPU
# machine. Skips (exit 0) when there is no CUDA toolkit.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
nvcc_bin="$(command -v nvcc || true)"
[ -n "$nvcc_bin" ] || { echo "cuda_ops_syntax: no nvcc, skipped"; exit 0; }
cuda_inc="$(dirname "$(dirname "$nvcc_bin")")/include"
[ -f "$cuda_inc/cuda_runtime_api.h" ] || { echo "cuda_ops_syntax: no CUDA headers, skipped"; exit 0; }
mapfile -t torch_inc < <("$PY" -c "import torch.utils.cpp_extension as c
for p in c.include_paths(): print('-I' + p)" 2>/dev/null)
"${CXX:-g++}" -std=c++20 -fsyntax-only -DLOCKS_WITH_CUDA "${torch_inc[@]}" -I"$cuda_inc" -Iinclude \
  -Ipython/csrc python/csrc/ops_cuda.cpp
echo "cuda_ops_syntax: python/csrc/ops_cuda.cpp compiles"
