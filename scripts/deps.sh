#!/usr/bin/env bash
# Installs what the C++ build and tests need (Debian packages, PyPI packages); clang and
# libomp-dev build the libFuzzer harnesses (fuzz/); clang-format checks the sources (ctest format).
# ninja-build: the generator scripts/configure.sh picks.
# Idempotent: skips apt-get when everything is already there.
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
pkgs="cmake g++ make ninja-build libeigen3-dev nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev gnuplot-nox python3 python3-pip clang clang-format libomp-dev"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi
python3 -c "import numpy" 2>/dev/null || python3 -m pip install -q numpy
