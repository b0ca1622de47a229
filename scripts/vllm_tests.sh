#!/usr/bin/env bash
# CPU tests of the vLLM plugin (tests/vllm), called by scripts/python_tests.sh after `locks` is
# installed. vLLM 0.26.0 pins torch 2.11; it is installed with --no-deps beside whatever torch
# is there (the plugin's CPU tests only import vLLM's Python side), plus the pure-Python
# packages those imports need (found by importing the modules the tests use; pins from
# ../shared/gpu/vllm/light.txt where it has them). About 1 minute warm; tests ~45 s.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if ! "$PY" -c "import vllm, sys; sys.exit(vllm.__version__ != '0.26.0')" 2>/dev/null; then
  "$PY" -m pip install -q --disable-pip-version-check --no-deps vllm==0.26.0
fi
mods="import vllm.v1.attention.backend, vllm.v1.attention.backends.flash_attn, vllm.v1.core.kv_cache_utils, vllm.config.compilation, vllm.model_executor.layers.attention_layer_base"
if ! "$PY" -c "$mods" 2>/dev/null; then
  "$PY" -m pip install -q --disable-pip-version-check --no-deps \
    pyzmq==27.3.0 cbor2==6.3.0 msgspec==0.23.0 pybase64==1.5.1 cachetools==8.0.2 openai==3.57.0 \
    openai-harmony==0.0.8 llguidance==1.7.6 xgrammar==0.2.7 apache-tvm-ffi==0.1.10 \
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
    httpx2==2.16.2 httpcore2==2.16.2 sniffio==1.3.1 truststore==0.10.5 py-cpuinfo==9.0.0 \
    aiohttp==3.14.5 multidict==7.2.1 yarl==1.25.1 propcache==0.5.4 aiohappyeyeballs==2.7.1 \
    aiosignal==1.4.0 frozenlist==1.8.0 attrs anyio h11 certifi idna einops==0.8.2 pillow \
    uvloop==0.23.0 prometheus_client==0.26.0 cloudpickle psutil
  "$PY" -c "$mods" || echo "vllm_tests: vLLM's modules do not import (see above); tests/vllm will be skipped"
fi
"$PY" -m pytest -q -p no:cacheprovider tests/vllm "$@"
