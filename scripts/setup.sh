#!/usr/bin/env bash
# setup.sh — install what building rda needs and is missing (idempotent). Debian packages:
# cmake, a C/C++ compiler, Lua 5.4 (headers and static library), cmocka, pkg-config, and Python
# 3 with numpy for the independent SPEC oracle (tests/spec_oracle).
# The CUDA toolkit (NVRTC) is expected at /usr/local/cuda or $CUDAToolkit_ROOT.
set -euo pipefail

need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in cmake make gcc g++ pkg-config liblua5.4-dev libcmocka-dev python3 python3-numpy; do
  have_pkg "$p" || need+=("$p")
done

if ((${#need[@]})); then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  echo "setup: installing ${need[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

cuda="${CUDAToolkit_ROOT:-/usr/local/cuda}"
if [ ! -e "$cuda/include/nvrtc.h" ]; then
  echo "setup: error: the CUDA toolkit (NVRTC) is not at $cuda; set CUDAToolkit_ROOT" >&2
  exit 1
fi
