#!/usr/bin/env bash
# test.sh — the whole test suite, as CI runs it: a -Werror build and its tests, then the same
# tests built with AddressSanitizer + UBSan (the emulated kernels included), then built with
# ThreadSanitizer (host code), all but the kernel matrices (test_fwd*, test_bwd*: one host
# thread) and test_nvrtc (NVRTC compiles for six targets, hours under TSan's interceptors).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=$(nproc)

cmake -S . -B build/release -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRDA_WERROR=ON >/dev/null
cmake --build build/release -j "$jobs"
ctest --test-dir build/release --output-on-failure -j "$jobs"

cmake -S . -B build/asan -DCMAKE_BUILD_TYPE=Debug -DRDA_WERROR=ON -DRDA_SANITIZE=ON >/dev/null
cmake --build build/asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build/asan --output-on-failure -j "$jobs"

cmake -S . -B build/tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRDA_WERROR=ON -DRDA_TSAN=ON >/dev/null
cmake --build build/tsan -j "$jobs"
ctest --test-dir build/tsan --output-on-failure -j "$jobs" -E '^test_(fwd|bwd|nvrtc)'
