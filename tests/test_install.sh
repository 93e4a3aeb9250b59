#!/bin/sh
# test_install.sh — the installed package as a consumer sees it: `cmake --install` to a
# temporary prefix, build examples/ with find_package(rda) and with pkg-config, run them on the
# emulator device (forward checks its output against its own float64 reference, ring each rank's
# rows against the single-device forward). CTest runs it.
# usage: test_install.sh BUILD_DIR SOURCE_DIR [EXTRA_CFLAGS (the sanitizer flags of the build)]
set -eu
build=$1
src=$2
flags=${3:-}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/rda-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
prefix=$tmp/prefix

fail() { echo "test_install: FAIL: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log" >&2; fail "cmake --install"; }
for f in include/rda.h bin/rdagen; do
  [ -e "$prefix/$f" ] || fail "$f was not installed"
done
lib=$(ls -d "$prefix"/lib*/librda.so.0 2>/dev/null | head -n 1)
[ -n "$lib" ] || fail "librda.so.0 (the SONAME link) was not installed"
libdir=$(dirname "$lib")
[ -e "$libdir/cmake/rda/rdaConfig.cmake" ] || fail "rdaConfig.cmake was not installed"
[ -e "$libdir/pkgconfig/rda.pc" ] || fail "rda.pc was not installed"
soname=$(objdump -p "$lib" | awk '/SONAME/ {print $2}')
[ "$soname" = "librda.so.0" ] || fail "SONAME is '$soname', expected librda.so.0"
# Exactly the functions rda.h declares with RDA_API are exported, nothing else.
want=$(sed -n 's/^RDA_API .*[ *]\(rda_[a-z_0-9]*\)(.*/\1/p' "$prefix/include/rda.h" | sort)
have=$(nm -D --defined-only "$lib" | awk '{print $3}' | sort)
[ -n "$want" ] || fail "no RDA_API declarations found in the installed rda.h"
[ "$want" = "$have" ] || fail "librda.so exports [$have], rda.h declares [$want]"
"$prefix/bin/rdagen" --version >/dev/null 2>&1 ||
  fail "the installed rdagen does not run"

# The header compiles warning-free as C++ too (for C++ hosts and extensions).
printf '#include <rda.h>\nint main() { rda_attn_config c = RDA_CONFIG_INIT; return c.heads; }\n' \
  >"$tmp/header.cc"
c++ -std=c++17 -Wall -Wextra -Wpedantic -Werror -I"$prefix/include" -fsyntax-only "$tmp/header.cc" ||
  fail "include/rda.h does not compile as C++"

# 1. find_package(rda) from a separate CMake project.
cmake -S "$src/examples" -B "$tmp/ex" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" >"$tmp/ex.log" 2>&1 ||
  { cat "$tmp/ex.log" >&2; fail "configuring examples/ with find_package(rda)"; }
cmake --build "$tmp/ex" >>"$tmp/ex.log" 2>&1 || { cat "$tmp/ex.log" >&2; fail "building examples/"; }
# Without RDA_HOME: the installed library must find what it needs by itself.
env -u RDA_HOME "$tmp/ex/forward" || fail "examples/forward (find_package build) failed"
env -u RDA_HOME "$tmp/ex/ring" || fail "examples/ring (find_package build) failed"

# 2. pkg-config.
PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --exists rda || fail "pkg-config does not find rda"
cc_flags=$(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --cflags --libs rda)
# shellcheck disable=SC2086
cc -std=c11 $flags "$src/examples/forward.c" -o "$tmp/forward_pc" $cc_flags -lm \
  -Wl,-rpath,"$libdir" || fail "building examples/forward.c with pkg-config"
"$tmp/forward_pc" || fail "examples/forward (pkg-config build) failed"
# shellcheck disable=SC2086
cc -std=c11 -pthread $flags "$src/examples/ring.c" -o "$tmp/ring_pc" $cc_flags -lm \
  -Wl,-rpath,"$libdir" || fail "building examples/ring.c with pkg-config"
"$tmp/ring_pc" || fail "examples/ring (pkg-config build) failed"
echo "test_install: ok (installed to a temporary prefix; find_package and pkg-config builds ran)"
