#!/usr/bin/env bash
# gpu_carry.sh — run HERE (the dev machine, Debian/Ubuntu x86-64, apt working) before a GPU
# session: fetches the Debian packages the build needs and the device machine lacks (it has no
# apt and no network), unpacks them with `dpkg -x` into carry/root (git-ignored; name `carry` in
# the device call's carry list), makes them relocatable, and records the commit the session
# tests. scripts/gpu_session.sh, run THERE, builds against carry/root. Idempotent.
#
# Packages: Lua 5.4 (headers, liblua5.4.a, liblua5.4.so for librda.so), cmocka (header, .so,
# .pc) and pkg-config (pkgconf: CMake's FindPkgConfig needs the program; the device image is not
# known to have it). Nothing is installed on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(liblua5.4-dev liblua5.4-0 libcmocka-dev libcmocka0 pkgconf pkgconf-bin libpkgconf3)
carry=carry
debs=$carry/debs
root=$carry/root
limit_mib=64

die() { echo "gpu_carry: error: $*" >&2; exit 1; }
command -v apt-get >/dev/null || die "apt-get not found: run this on the Debian/Ubuntu dev machine"
command -v dpkg >/dev/null || die "dpkg not found"
[ "$(uname -m)" = x86_64 ] || die "this machine is $(uname -m); the device machine is x86_64"
# The repository must ignore carry/ (it travels only as a carried path).
if command -v git >/dev/null && git rev-parse --git-dir >/dev/null 2>&1; then
  git check-ignore -q "$carry/x" || die "$carry/ is not git-ignored: add /$carry/ to .gitignore"
fi

mkdir -p "$debs"
for p in "${pkgs[@]}"; do
  if compgen -G "$debs/${p}_*.deb" >/dev/null; then continue; fi
  echo "gpu_carry: downloading $p" >&2
  # apt-get download writes into the current folder; as root it warns about the _apt sandbox.
  (cd "$debs" && apt-get download -q "$p" 2>&1 | grep -v "unsandboxed" >&2) ||
    die "apt-get download $p failed (stale package lists? run apt-get update)"
  compgen -G "$debs/${p}_*.deb" >/dev/null || die "apt-get download $p produced no .deb"
done

# Unpack afresh, so the tree is exactly these packages.
rm -rf "$root"
mkdir -p "$root"
for f in "$debs"/*.deb; do dpkg -x "$f" "$root"; done
rm -rf "$root/usr/share/doc" "$root/usr/share/man" "$root/usr/share/lintian"

multi=usr/lib/x86_64-linux-gnu
[ -e "$root/usr/include/lua5.4/lua.h" ] || die "lua.h missing from $root"
[ -e "$root/$multi/liblua5.4.a" ] || die "liblua5.4.a missing from $root"
[ -e "$root/$multi/liblua5.4.so" ] || die "liblua5.4.so missing from $root"
[ -e "$root/usr/include/cmocka.h" ] || die "cmocka.h missing from $root"
[ -e "$root/usr/bin/pkgconf" ] || die "pkgconf missing from $root"

# Debian's luaconf.h includes "lua5.4-deb-multiarch.h", which lives in /usr/include/<triplet>,
# a system include folder there but not under carry/root: a copy beside luaconf.h is found first.
cp "$root/usr/include/x86_64-linux-gnu/lua5.4-deb-multiarch.h" "$root/usr/include/lua5.4/"

# .pc files name /usr: make them relative to their own folder (pkg-config's ${pcfiledir}), so
# the tree works wherever the device machine puts the repository.
for pc in "$root/$multi"/pkgconfig/*.pc; do
  sed -i -e 's#^prefix=/usr$#prefix=${pcfiledir}/../../..#' \
    -e 's#\([ =]\)-L/usr/#\1-L${pcfiledir}/../../../#g' \
    -e 's#\([ =]\)-I/usr/#\1-I${pcfiledir}/../../../#g' "$pc"
  left=$(grep -v '^#' "$pc" | grep -E '(=|-[IL])/usr' || true)
  [ -z "$left" ] || die "$pc still names /usr: $left"
done

# The commit the session tests (the device machine's copy of the tree may have no .git).
{
  if command -v git >/dev/null && git rev-parse HEAD >/dev/null 2>&1; then
    echo "commit $(git rev-parse HEAD)"
    echo "changed_files $(git status --porcelain --untracked-files=no | wc -l)"
  else
    echo "commit unknown"
  fi
  echo "written $(date -u +%Y-%m-%dT%H:%M:%SZ) by scripts/gpu_carry.sh"
} >"$carry/commit.txt"

# A quick check that the carried tree is what CMake will be pointed at.
PKG_CONFIG_PATH="$root/$multi/pkgconfig" PKG_CONFIG_LIBDIR="$root/$multi/pkgconfig" \
  pkg-config --cflags --libs cmocka >/dev/null 2>&1 || echo "gpu_carry: note: pkg-config here" \
  "could not read the carried cmocka.pc (checked again there)" >&2

kib=$(du -sk "$carry" | cut -f1)
echo "gpu_carry: $carry/ holds $((kib / 1024)).$((kib % 1024 * 10 / 1024)) MiB" \
  "($(find "$root" -type f | wc -l) files under $root; limit ${limit_mib} MiB for all carried paths)"
[ "$kib" -lt $((limit_mib * 1024 / 4)) ] || die "$carry/ is over a quarter of the carry limit"
echo "gpu_carry: $(cat "$carry/commit.txt" | head -n 1); next: a device call with carry [\"$carry\"]" \
  "running: bash scripts/gpu_session.sh"
