#!/usr/bin/env bash
# demo.sh — the main job: generate the kernels for the default config, compile them with NVRTC
# for the local GPU (sm_90 when there is none), run them on the GPU or the CPU emulator, and
# compare with the float64 reference.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build/release -j "$(nproc)" --target rdagen
exec build/release/rdagen demo configs/default.lua "$@"
