#!/usr/bin/env bash
# gpu_session.sh — one device call's work on the lent GPU machine (no apt, no network): build
# rda against the packages scripts/gpu_carry.sh unpacked into carry/root, run the GPU tests, then
# the benchmarks, each step under its own time limit inside one overall budget, and collect
# everything under $OUT (build/gpu-out when $OUT is unset). Run HERE first: bash
# scripts/gpu_carry.sh; then in one device call with carry ["carry"]: bash scripts/gpu_session.sh
#
# usage: gpu_session.sh [all | build | tests | bench | tune] ...   (default all = build, tests
#        and bench; tests, bench and tune build first, incrementally: a warm machine keeps
#        build/gpu between calls). tune is never part of all: it takes a device call of its own.
# environment:
#   OUT                   where results go (default build/gpu-out)
#   GPU_SESSION_BUDGET_S  seconds for the whole script (default 540: a device call stops at 600)
#   GPU_SESSION_TESTS     the CTest tests to run (default: the ones below)
#   GPU_SESSION_JOBS      parallel build jobs (default: the CPU count, at most 16)
#   GPU_SESSION_BUILD_DIR the build folder (default build/gpu)
#   GPU_SESSION_FORCE_BENCH=1  run the benchmarks even when no GPU is seen
#   CUDAToolkit_ROOT      the CUDA toolkit (default: detected, see find_cuda)
# Files under $OUT (at most 8 come back from a device call): session.log (everything),
# results.jsonl (a header, one record per step and test, every benchmark's JSON line), env.txt
# (device, driver, tools, paths, commit), build.log, ctest.log, ring_sim.txt, ring_timeline.json,
# kernel_times.jsonl (per-kernel device times of the d128 backward bench, one line for the
# mma.sync run and one for the wgmma run: bench/bench_ring.c --kernel-times appends).
# The tune phase: tune.log (rdagen tune's tables) and tuning_db.lua (the database it wrote: every
# candidate tile of the benchmark configs, wgmma ones included, checked against the float64
# reference on the GPU and timed; commit it as tuning/db.lua once it has been looked at).
set -uo pipefail
SELF=$(readlink -f "$0")
cd "$(dirname "$SELF")/.." || exit 1
REPO=$(pwd)

OUT=${OUT:-$REPO/build/gpu-out}
mkdir -p "$OUT" || { echo "gpu_session: error: cannot create $OUT" >&2; exit 1; }
OUT=$(cd "$OUT" && pwd)

# Everything this script prints also goes to session.log, written as it runs (so a call cut
# off at its limit still brings the log back).
if [ -z "${GPU_SESSION_INNER:-}" ]; then
  : >"$OUT/session.log"
  GPU_SESSION_INNER=1 OUT="$OUT" bash "$SELF" "$@" 2>&1 | tee -a "$OUT/session.log"
  exit "${PIPESTATUS[0]}"
fi

BUDGET=${GPU_SESSION_BUDGET_S:-540}
BUILD=${GPU_SESSION_BUILD_DIR:-$REPO/build/gpu}
CARRY_ROOT=$REPO/carry/root
MULTI=usr/lib/x86_64-linux-gnu
RESULTS=$OUT/results.jsonl
ENVTXT=$OUT/env.txt
DEFAULT_TESTS="test_cuda test_fwd test_bwd test_nccl test_api test_api_ring test_api_ring_streams test_cli test_ring_rows test_random"
TESTS=${GPU_SESSION_TESTS:-$DEFAULT_TESTS}
T0=$SECONDS
: >"$RESULTS"
: >"$ENVTXT"

note() { printf '[gpu_session +%3ds] %s\n' "$((SECONDS - T0))" "$*"; }
warn() { note "WARNING: $*"; }
die() {
  note "error: $*"
  record_step "abort" 1 0 "$*"
  exit 1
}
remaining() { echo $((BUDGET - (SECONDS - T0))); }
# A JSON string literal (enough for paths, names and one-line messages).
jstr() {
  local s=${1//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\n'/ }
  s=${s//$'\t'/ }
  printf '"%s"' "$s"
}
record_step() { # name rc seconds [note]
  printf '{"step": %s, "rc": %d, "seconds": %d, "timed_out": %s, "note": %s}\n' "$(jstr "$1")" \
    "$2" "$3" "$([ "$2" -eq 124 ] && echo true || echo false)" "$(jstr "${4:-}")" >>"$RESULTS"
}

# run_step NAME MAX_S RESERVE_S LOG CMD...: runs CMD under timeout min(MAX_S, time left -
# RESERVE_S) (the reserve keeps time for later steps), its output appended to LOG ("-": this
# script's output); records the step; returns CMD's status (124 when it ran out of time, 125
# when there was no time to start it).
run_step() {
  local name=$1 max=$2 reserve=$3 log=$4
  shift 4
  local left=$(($(remaining) - reserve)) t
  t=$((max < left ? max : left))
  if [ "$t" -lt 5 ]; then
    note "SKIP $name: no time left (${left}s after the reserve of ${reserve}s)" >&2
    record_step "$name" 125 0 "skipped: no time left"
    return 125
  fi
  note "BEGIN $name (limit ${t}s): $*" >&2
  local t1=$SECONDS rc
  if [ "$log" = - ]; then
    timeout -k 10 "$t" "$@"
  else
    timeout -k 10 "$t" "$@" >>"$log" 2>&1
  fi
  rc=$?
  local dt=$((SECONDS - t1))
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    note "END $name: TIMED OUT after ${dt}s (limit ${t}s)" >&2
    rc=124
  else
    note "END $name: rc $rc in ${dt}s" >&2
  fi
  record_step "$name" "$rc" "$dt"
  return "$rc"
}

want_phase() {
  local p
  for p in "${PHASES[@]}"; do [ "$p" = all ] || [ "$p" = "$1" ] && return 0; done
  return 1
}
# A phase that `all` leaves out: only when named.
want_named() {
  local p
  for p in "${PHASES[@]}"; do [ "$p" = "$1" ] && return 0; done
  return 1
}

PHASES=("$@")
[ ${#PHASES[@]} -gt 0 ] || PHASES=(all)
for p in "${PHASES[@]}"; do
  case $p in
    all | build | tests | bench | tune) ;;
    *)
      echo "usage: gpu_session.sh [all | build | tests | bench | tune] ..." >&2
      exit 2
      ;;
  esac
done

note "phases: ${PHASES[*]}; budget ${BUDGET}s; results in $OUT; build in $BUILD"

# --- what the machine has ----------------------------------------------------------------------

# The torch venv's site-packages (and any other python3's): NCCL and NVRTC wheels live there.
site_dirs() {
  local py
  for py in python3 /opt/torch/.venv/bin/python3; do
    command -v "$py" >/dev/null 2>&1 || continue
    "$py" -c 'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' \
      2>/dev/null
  done
  ls -d /opt/torch/.venv/lib/python3*/site-packages 2>/dev/null
}
mapfile -t SITES < <(site_dirs | awk 'NF && !seen[$0]++')

# A CUDA toolkit root with include/nvrtc.h and lib64/libnvrtc.so, as CMakeLists.txt looks for
# them: $CUDAToolkit_ROOT, $CUDA_HOME, /usr/local/cuda, nvcc's, /usr/local/cuda-*. Failing
# that, a stand-in toolkit beside the build folder: links to any nvrtc.h and libnvrtc.so.N
# found (toolkits laid out otherwise, or the nvidia-cuda-nvrtc wheel of the torch venv).
find_cuda() {
  local c cands=() nvcc
  [ -n "${CUDAToolkit_ROOT:-}" ] && cands+=("$CUDAToolkit_ROOT")
  [ -n "${CUDA_HOME:-}" ] && cands+=("$CUDA_HOME")
  cands+=(/usr/local/cuda)
  nvcc=$(command -v nvcc 2>/dev/null) && cands+=("$(dirname "$(dirname "$(readlink -f "$nvcc")")")")
  while read -r c; do cands+=("$c"); done < <(ls -d /usr/local/cuda-* 2>/dev/null | sort -rV)
  for c in "${cands[@]}"; do
    if [ -e "$c/include/nvrtc.h" ] && [ -e "$c/lib64/libnvrtc.so" ]; then
      CUDA_ROOT=$c
      return 0
    fi
  done
  local inc="" lib="" d s
  for c in "${cands[@]}"; do
    [ -z "$inc" ] && [ -e "$c/include/nvrtc.h" ] && inc=$c/include
    for d in "$c/lib64" "$c/lib" "$c/targets/x86_64-linux/lib"; do
      [ -z "$lib" ] && lib=$(ls "$d"/libnvrtc.so.[0-9]* 2>/dev/null | grep -v alt | sort -V | tail -n 1)
    done
  done
  for s in "${SITES[@]}"; do
    for d in "$s"/nvidia/cu1[0-9] "$s"/nvidia/cuda_nvrtc; do
      [ -z "$inc" ] && [ -e "$d/include/nvrtc.h" ] && inc=$d/include
      [ -z "$lib" ] && lib=$(ls "$d"/lib/libnvrtc.so.[0-9]* 2>/dev/null | grep -v alt | sort -V | tail -n 1)
    done
  done
  [ -n "$inc" ] && [ -n "$lib" ] || return 1
  CUDA_ROOT=$BUILD-cuda
  rm -rf "$CUDA_ROOT"
  mkdir -p "$CUDA_ROOT/lib64"
  ln -s "$inc" "$CUDA_ROOT/include"
  ln -s "$lib" "$CUDA_ROOT/lib64/libnvrtc.so"
  note "no toolkit with include/nvrtc.h and lib64/libnvrtc.so: using $CUDA_ROOT ($inc, $lib)"
}

CUDA_ROOT=""
find_cuda || die "no NVRTC found (include/nvrtc.h and libnvrtc.so): set CUDAToolkit_ROOT"
NVRTC_SO=$(readlink -f "$CUDA_ROOT/lib64/libnvrtc.so")
note "CUDA toolkit: $CUDA_ROOT (NVRTC $NVRTC_SO)"

# NCCL: the library the transport dlopens (libnccl.so.2) and nccl.h, without which
# runtime/transport_nccl.c compiles to RDA_ERR_UNSUPPORTED stubs. The torch venv's wheel first
# (the NCCL PyTorch uses with this driver), then the toolkit, then the system.
NCCL_LIBDIR="" NCCL_INC=""
for d in "${SITES[@]/%//nvidia/nccl/lib}" "$CUDA_ROOT/lib64" "$CUDA_ROOT/lib"; do
  if [ -e "$d/libnccl.so.2" ]; then NCCL_LIBDIR=$(readlink -f "$d"); break; fi
done
if [ -z "$NCCL_LIBDIR" ]; then
  so=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 / {print $NF; exit}')
  [ -n "$so" ] && NCCL_LIBDIR=$(dirname "$so")
fi
if [ -n "$NCCL_LIBDIR" ] && [ -e "$NCCL_LIBDIR/../include/nccl.h" ]; then
  NCCL_INC=$(readlink -f "$NCCL_LIBDIR/../include")
fi
for d in "$CUDA_ROOT/include" /usr/include /usr/local/include "${SITES[@]/%//nvidia/nccl/include}"; do
  [ -z "$NCCL_INC" ] && [ -e "$d/nccl.h" ] && NCCL_INC=$d
done
[ -n "$NCCL_LIBDIR" ] || warn "libnccl.so.2 not found: the NCCL tests will skip"
[ -n "$NCCL_INC" ] || warn "nccl.h not found: rda builds without the NCCL transport"
note "NCCL: library in ${NCCL_LIBDIR:-(none)}, nccl.h in ${NCCL_INC:-(none)}"

# The driver (libcuda.so.1): on the loader's path already where PyTorch works; the driver
# folder of these machines is added in case it is not.
DRIVER_DIRS=""
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64; do
  [ -e "$d/libcuda.so.1" ] && DRIVER_DIRS=${DRIVER_DIRS:+$DRIVER_DIRS:}$d
done

# The carried packages (scripts/gpu_carry.sh), else the system's.
LUA_INC="" LUA_A="" LUA_SO=""
if [ -e "$CARRY_ROOT/usr/include/lua5.4/lua.h" ]; then
  LUA_INC=$CARRY_ROOT/usr/include/lua5.4
  LUA_A=$CARRY_ROOT/$MULTI/liblua5.4.a
  LUA_SO=$CARRY_ROOT/$MULTI/liblua5.4.so
  note "Lua 5.4 and cmocka from $CARRY_ROOT"
elif [ -e /usr/include/lua5.4/lua.h ]; then
  note "Lua 5.4 from the system (no $CARRY_ROOT)"
else
  die "no Lua 5.4: run scripts/gpu_carry.sh on the dev machine and carry [\"carry\"]"
fi
export PKG_CONFIG_PATH=$CARRY_ROOT/$MULTI/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
LDP=$CARRY_ROOT/$MULTI
[ -n "$NCCL_LIBDIR" ] && LDP=$LDP:$NCCL_LIBDIR
# (NVRTC's folder is the binaries' build RPATH; a stand-in toolkit links only libnvrtc.so.)
[ "$CUDA_ROOT" = "$BUILD-cuda" ] && LDP=$LDP:$(dirname "$NVRTC_SO")
[ -n "$DRIVER_DIRS" ] && LDP=$LDP:$DRIVER_DIRS
ORIG_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
export LD_LIBRARY_PATH=$LDP${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
PKGCONF=$(command -v pkg-config 2>/dev/null || true)
if [ -z "$PKGCONF" ] && [ -x "$CARRY_ROOT/usr/bin/pkgconf" ]; then PKGCONF=$CARRY_ROOT/usr/bin/pkgconf; fi
[ -n "$PKGCONF" ] || die "no pkg-config: run scripts/gpu_carry.sh on the dev machine and carry [\"carry\"]"
"$PKGCONF" --exists cmocka || die "cmocka not found by $PKGCONF (PKG_CONFIG_PATH=$PKG_CONFIG_PATH)"
note "pkg-config: $PKGCONF; cmocka: $("$PKGCONF" --cflags --libs cmocka | tr -s ' ')"

CC_BIN=$(command -v cc || command -v gcc || true)
CXX_BIN=$(command -v c++ || command -v g++ || true)
[ -n "$CC_BIN" ] && [ -n "$CXX_BIN" ] || die "no C/C++ compiler (cc, c++) on this machine"
GEN=()
if command -v ninja >/dev/null 2>&1; then
  GEN=(-G Ninja)
elif ! command -v make >/dev/null 2>&1; then
  die "neither ninja nor make on this machine"
fi
JOBS=${GPU_SESSION_JOBS:-$(nproc)}
[ "$JOBS" -gt 16 ] && JOBS=16

GPU_NAME=""
if command -v nvidia-smi >/dev/null 2>&1 &&
  GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1) &&
  [ -n "$GPU_NAME" ]; then
  note "GPU: $GPU_NAME"
else
  GPU_NAME=""
  note "no GPU seen (nvidia-smi missing or lists none): GPU tests skip, benchmarks are left out"
fi

# --- env.txt and the results header --------------------------------------------------------------

# carry/commit.txt first: the device machine's copy of .git can be older than the tree sent.
COMMIT=""
if [ -e "$REPO/carry/commit.txt" ]; then
  COMMIT="$(awk '$1 == "commit" {print $2}' "$REPO/carry/commit.txt") (carry/commit.txt)"
fi
[ -n "$COMMIT" ] || COMMIT=$(git rev-parse HEAD 2>/dev/null || true)
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: ${COMMIT:-unknown}"
  [ -e "$REPO/carry/commit.txt" ] && sed 's/^/carry\/commit.txt: /' "$REPO/carry/commit.txt"
  echo "host: $(uname -srm); $(nproc) CPUs; $(awk '/MemTotal/ {print $2 / 1048576 " GiB"}' /proc/meminfo)"
  echo "cuda toolkit: $CUDA_ROOT; nvrtc: $NVRTC_SO"
  echo "nccl: lib ${NCCL_LIBDIR:-none}; header ${NCCL_INC:-none}"
  echo "driver dirs: ${DRIVER_DIRS:-none on the usual paths}"
  echo "lua: ${LUA_INC:-system}; pkg-config: $PKGCONF; PKG_CONFIG_PATH=$PKG_CONFIG_PATH"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "compilers: $("$CC_BIN" --version | head -n 1); $("$CXX_BIN" --version | head -n 1)"
  echo "cmake: $(cmake --version | head -n 1); generator: ${GEN[*]:-Unix Makefiles}"
  command -v nvcc >/dev/null && echo "nvcc: $(nvcc --version | tail -n 2 | tr '\n' ' ')"
  echo "python3: $(command -v python3) $(python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null || echo '(no torch)')"
  if [ -n "$GPU_NAME" ]; then
    echo "--- nvidia-smi"
    nvidia-smi 2>&1
    echo "--- nvidia-smi -q (excerpt)"
    nvidia-smi -q 2>&1 | grep -E -i '^ *(Product Name|Product Architecture|Driver Version|CUDA Version|VBIOS|Persistence Mode|Compute Mode|MIG Mode|Current|Pending|Total|Used|Free|Performance State|Graphics|SM|Memory|Video|Power Draw|Current Power Limit|Max Power Limit|GPU Current Temp|Bus Id|Link Width|PCIe Generation|Max|Current)\b' |
      head -n 120
  fi
} >"$ENVTXT" 2>&1
printf '{"session": "gpu_session", "date": %s, "commit": %s, "device": %s, "phases": %s, "budget_s": %d}\n' \
  "$(jstr "$(date -u +%Y-%m-%dT%H:%M:%SZ)")" "$(jstr "${COMMIT:-unknown}")" \
  "$(jstr "${GPU_NAME:-none}")" "$(jstr "${PHASES[*]}")" "$BUDGET" >>"$RESULTS"

# --- build ------------------------------------------------------------------------------------

# Time the tests leave for the benchmarks (240 s of the default 540).
BENCH_RESERVE=0
if want_phase bench && { [ -n "$GPU_NAME" ] || [ "${GPU_SESSION_FORCE_BENCH:-0}" = 1 ]; }; then
  BENCH_RESERVE=$((BUDGET * 4 / 9))
fi
CFG=(-DCMAKE_BUILD_TYPE=Release -DRDA_WERROR=OFF -DCUDAToolkit_ROOT="$CUDA_ROOT"
  -DPKG_CONFIG_EXECUTABLE="$PKGCONF" -DCMAKE_C_COMPILER="$CC_BIN" -DCMAKE_CXX_COMPILER="$CXX_BIN")
[ -n "$LUA_INC" ] && CFG+=(-DLUA_INCLUDE_DIR="$LUA_INC" -DLUA_STATIC="$LUA_A" -DLUA_SHARED="$LUA_SO")
# nccl.h outside the toolkit's include folder: on the compiler's path (as a system header).
if [ -n "$NCCL_INC" ] && [ ! -e "$CUDA_ROOT/include/nccl.h" ] && [ "$NCCL_INC" != /usr/include ]; then
  CFG+=(-DCMAKE_C_FLAGS="-isystem $NCCL_INC")
fi
# A build folder made by another generator cannot be reused.
if [ -e "$BUILD/CMakeCache.txt" ] && ! grep -q "CMAKE_GENERATOR:INTERNAL=${GEN[1]:-Unix Makefiles}\$" "$BUILD/CMakeCache.txt"; then
  rm -rf "$BUILD"
fi

: >"$OUT/build.log"
if ! run_step configure 120 0 "$OUT/build.log" \
  cmake -S "$REPO" -B "$BUILD" "${GEN[@]}" "${CFG[@]}"; then
  tail -n 40 "$OUT/build.log"
  die "cmake configure failed (build.log)"
fi

# Only what the steps run: the tests asked for, rdagen and the benchmarks.
TARGETS=(rdagen)
for t in $TESTS; do [ -e "$REPO/tests/$t.c" ] && TARGETS+=("$t"); done
for b in fwd ring; do [ -e "$REPO/bench/bench_$b.c" ] && TARGETS+=("rda_bench_$b"); done
KEEP_GOING=(-k 0)
[ ${#GEN[@]} -eq 0 ] && KEEP_GOING=(-k)
if ! run_step build 300 0 "$OUT/build.log" \
  cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}" -- "${KEEP_GOING[@]}"; then
  grep -E -B2 -A6 'error|Error' "$OUT/build.log" | tail -n 60
  warn "the build failed (build.log); running what was built"
fi
nwarn=$(grep -c 'warning:' "$OUT/build.log")
[ "$nwarn" -eq 0 ] || warn "$nwarn compiler warnings (build.log)"
# transport_nccl.c names the NCCL entry points only when it was compiled against nccl.h.
if [ -e "$BUILD/librda_core.a" ]; then
  if grep -q -a ncclCommInitRankConfig "$BUILD/librda_core.a"; then
    note "the NCCL transport is compiled in"
  else
    warn "the NCCL transport is NOT compiled in (no nccl.h on the include path)"
  fi
fi

export RDA_HOME=$REPO
export RDA_CACHE_DIR=$BUILD/bench-cache

# --- tests ------------------------------------------------------------------------------------

if want_phase tests; then
  re=$(echo "$TESTS" | tr -s ' ' '|')
  ntests=$(echo "$TESTS" | wc -w)
  # All the tests at once (the emulated ones are CPU-bound); -V so that cmocka's SKIPPED lines
  # reach ctest.log: a GPU test that skips on the GPU machine is a finding.
  tlimit=$(($(remaining) - BENCH_RESERVE))
  [ "$tlimit" -gt 330 ] && tlimit=330
  # Every test stops 10 s before the step's limit, so ctest reports a straggler as a timeout
  # (--timeout does not override the tests' TIMEOUT property; --stop-time does).
  stop_at=$(date -d "+$((tlimit - 10)) seconds" +%H:%M:%S)
  : >"$OUT/ctest.log"
  run_step ctest 330 "$BENCH_RESERVE" "$OUT/ctest.log" \
    ctest --test-dir "$BUILD" -R "^($re)\$" -j "$ntests" -V --stop-time "$stop_at"
  grep -E '^ *[0-9]+/[0-9]+ Test +#|tests passed|tests failed|Errors while running' "$OUT/ctest.log"
  # The whole forward and backward matrices once more with the sm_90a wgmma path on (their
  # d = 64 and 128 cases take wgmma tiles; their own wgmma cases ran above either way).
  if [ -n "$GPU_NAME" ]; then
    for t in test_fwd test_bwd; do
      [ -x "$BUILD/$t" ] && run_step "${t}_wgmma" 120 "$BENCH_RESERVE" "$OUT/ctest.log" \
        env RDA_WGMMA=1 "$BUILD/$t"
    done
  fi
  # One record per test: result, time, cmocka's skipped count, the first failure line.
  python3 - "$OUT/ctest.log" $TESTS >>"$RESULTS" <<'EOF' || warn "could not summarize ctest.log"
import json, re, sys
text = open(sys.argv[1], errors="replace").read()
names, recs = {}, {}
for m in re.finditer(r"^ *(\d+)/\d+ Test +#(\d+): (\S+) \.+\**\s*(.*?)\s+([\d.]+) sec$", text, re.M):
    names[m.group(2)] = m.group(3)
    recs[m.group(3)] = {"test": m.group(3), "result": m.group(4).strip(), "seconds": float(m.group(5))}
for num, name in names.items():
    lines = [l[len(num) + 2:] for l in text.splitlines() if l.startswith(num + ": ")]
    r = recs[name]
    # cmocka names a skipped or failed test twice (where it ran, and in the closing list).
    def named(tag):
        return sorted({l.split()[-1] for l in lines if re.match(r"\[ *" + tag + r" *\] \S+$", l)})
    r["skipped"], r["failed"], r["passed"] = (len(named(t)) for t in ("SKIPPED", "FAILED", "OK"))
    r["skipped_tests"], r["failed_tests"] = named("SKIPPED"), named("FAILED")
    bad = [l for l in lines if "FAIL" in l or "error" in l.lower()]
    r["first_failure"] = bad[0][:300] if r["failed"] and bad else ""
    if r["result"] != "Passed":  # a crash or a timeout: how far it got
        r["last_lines"] = [l[:300] for l in lines if l.strip()][-6:]
for name in sys.argv[2:]:
    recs.setdefault(name, {"test": name, "result": "no result (not built, or the step ran out of "
                           "time)", "seconds": 0.0, "skipped": 0, "passed": 0, "failed": 0})
for r in recs.values():
    print(json.dumps(dict(step="ctest", **r)))
    print(f"  {r['test']:16s} {r['result'][:20]:20s} {r['seconds']:7.1f}s  ok {r['passed']}  "
          f"skipped {r['skipped']}  failed {r['failed']}", file=sys.stderr)
EOF
fi

# --- benchmarks -------------------------------------------------------------------------------

# bench_json NAME MAX_S RESERVE_S CMD...: a step whose JSON lines (stdout lines that start with
# '{') go to results.jsonl.
bench_json() {
  local name=$1 max=$2 reserve=$3 tmp=$OUT/.$1.out rc
  shift 3
  run_step "$name" "$max" "$reserve" - "$@" >"$tmp"
  rc=$?
  cat "$tmp"
  grep '^{' "$tmp" >>"$RESULTS"
  rm -f "$tmp"
  return "$rc"
}

if want_phase bench; then
  if [ -z "$GPU_NAME" ] && [ "${GPU_SESSION_FORCE_BENCH:-0}" != 1 ]; then
    note "SKIP the GPU benchmarks: no GPU (GPU_SESSION_FORCE_BENCH=1 runs them anyway)"
    record_step "bench" 125 0 "skipped: no GPU"
  else
    bench_json bench_fwd 90 170 "$BUILD/rda_bench_fwd" bench/target_d128.lua --n 65536
    # The same on the sm_90a wgmma path (its record's kernel ends in _wg).
    bench_json bench_fwd_wgmma 60 170 env RDA_WGMMA=1 "$BUILD/rda_bench_fwd" bench/target_d128.lua \
      --n 65536
    # The issue-4 target's backward on one device (a one-rank ring reports the single-device
    # passes too), mma.sync and then with the wgmma dK/dV and dQ; each also times its kernels
    # (one line each in kernel_times.jsonl, emptied first: a rerun into the same $OUT appends).
    : >"$OUT/kernel_times.jsonl"
    bench_json bench_bwd_d128 60 170 "$BUILD/rda_bench_ring" bench/target_d128.lua --n 65536 \
      --ranks 1 --backward 1 --iters 5 --kernel-times "$OUT/kernel_times.jsonl"
    bench_json bench_bwd_d128_wgmma 60 170 env RDA_WGMMA=1 "$BUILD/rda_bench_ring" \
      bench/target_d128.lua --n 65536 --ranks 1 --backward 1 --iters 5 \
      --kernel-times "$OUT/kernel_times.jsonl"
    # PyTorch with the loader path it came with (the toolkit's CUDA libraries must not shadow
    # its wheels').
    bench_json sdpa_baseline 75 110 env PYTHONUNBUFFERED=1 LD_LIBRARY_PATH="$ORIG_LD_LIBRARY_PATH" \
      python3 bench/sdpa_baseline.py \
      --n 65536 --w 8192 --heads 16 --head-dim 128
    # Takes what is left: its host-side inputs alone (4 x 537M bf16 normal draws, 10 GB of fp32
    # outputs) took 115 s on the 2-core dev machine.
    # --timeline: one more traced pass each way, the device time of every rank's every step
    # (ring_timeline.json, and a per-rank summary in the log).
    bench_json bench_ring 400 20 "$BUILD/rda_bench_ring" bench/target_ring.lua --n 262144 --ranks 8 \
      --timeline "$OUT/ring_timeline.json"
  fi
  # The model needs no GPU: as the issue asks (defaults: 450 GB/s NVLink, 400 TFLOP/s), and
  # with the forward rate measured above when there is one.
  sim=("$BUILD/rdagen" ring-sim bench/target_ring.lua --n 1048576 --ranks 8)
  {
    echo "=== rdagen ring-sim bench/target_ring.lua --n 1048576 --ranks 8"
    run_step ring_sim 20 0 - "${sim[@]}"
  } >"$OUT/ring_sim.txt" 2>&1
  cat "$OUT/ring_sim.txt"
  sim_json() { # record one ring-sim --json document as one line
    local doc
    doc=$(timeout 20 "${sim[@]}" --json "$@") &&
      python3 -c 'import json, sys; d = json.loads(sys.argv[1]); print(json.dumps({"bench": "ring_sim", "predicted": True, "args": sys.argv[2:], "sim": d}))' \
        "$doc" "$@" >>"$RESULTS" || warn "ring-sim --json $* failed"
  }
  sim_json
  tflops=$(python3 -c 'import json, sys
for l in open(sys.argv[1]):
    d = json.loads(l)
    if d.get("bench") == "fwd" and d.get("effective_tflops") and "_wg" not in d.get("kernel", ""):
        print(d["effective_tflops"])' \
    "$RESULTS" 2>/dev/null | tail -n 1)
  if [ -n "$tflops" ]; then
    {
      echo "=== the same with --tflops $tflops (rda_bench_fwd's measured rate)"
      run_step ring_sim_at_measured_rate 20 0 - "${sim[@]}" --tflops "$tflops"
    } >>"$OUT/ring_sim.txt" 2>&1
    tail -n +2 "$OUT/ring_sim.txt" | sed -n '/--tflops/,$p'
    sim_json --tflops "$tflops"
  fi
fi

# --- tuning -----------------------------------------------------------------------------------

# Every candidate tile of the benchmark configs' kernels, forward and backward, wgmma tiles
# included: each checked against the float64 reference on the GPU (so this is also the wgmma
# kernels' native check), then timed; the rankings go to $OUT/tuning_db.lua.
if want_named tune; then
  if [ -z "$GPU_NAME" ]; then
    note "SKIP tune: no GPU"
    record_step "tune" 125 0 "skipped: no GPU"
  else
    export RDA_TUNING_DB=$OUT/tuning_db.lua
    rm -f "$RDA_TUNING_DB"
    : >"$OUT/tune.log"
    # Smallest first: every candidate compiles (with its ring twin where the plan has one),
    # and the three-branch ring config has the most; a step cut off writes nothing.
    for spec in "bench/target_d128.lua 200" "configs/default.lua 120" "bench/target_ring.lua 400"; do
      read -r cfg limit <<<"$spec"
      name=tune_$(basename "$cfg" .lua)
      run_step "$name" "$limit" 10 "$OUT/tune.log" \
        "$BUILD/rdagen" tune "$cfg" --backend cuda --backward --wgmma
      grep -E '^(sm_|  (tile|bm|bn|FAILED))' "$OUT/tune.log" | tail -n 40
    done
    unset RDA_TUNING_DB
  fi
fi

# --- summary ----------------------------------------------------------------------------------

# No file may exceed what a device call brings back (16 MiB each).
for f in "$OUT"/*; do
  if [ -f "$f" ] && [ "$f" != "$OUT/session.log" ] && [ "$(stat -c %s "$f")" -gt 15000000 ]; then
    { head -c 7000000 "$f"; echo "[... truncated ...]"; tail -c 7000000 "$f"; } >"$f.tmp"
    mv "$f.tmp" "$f"
  fi
done
note "done in $((SECONDS - T0))s; results:"
grep -v '"step": "ctest", "test"' "$RESULTS" | cut -c 1-400
failed=$(grep '"rc": ' "$RESULTS" | grep -c -v -E '"rc": (0|125),')
skipped=$(grep -c -E '"rc": 125,' "$RESULTS")
ctest_bad=$(grep '"step": "ctest", "test"' "$RESULTS" | grep -c -v '"result": "Passed"')
note "$failed step(s) failed, $skipped skipped, $ctest_bad test program(s) did not pass;" \
  "files: $(cd "$OUT" && ls | tr '\n' ' ')"
[ "$failed" -eq 0 ]
