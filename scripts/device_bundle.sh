#!/usr/bin/env bash
# Gathers the Debian 12 packages Ember needs besides LibTorch and CUDA into device-deps/
# (or $EMBER_DEVICE_DEPS), for a machine with no apt and no network: run it here, carry
# device-deps/ with the working tree, and build there with scripts/device_build.sh.
#
# apt-get download + dpkg -x, then pruned: only the headers, CMake configs, .pc files and
# libraries the build uses; Boost only as the closure of the headers the sources include.
# Linked statically where Debian ships an archive (xxHash, zlib, GoogleTest), shared
# otherwise, with the shared libraries they need in turn (found through their NEEDED
# entries, never glibc's or GCC's own), and Gloo's headers in fallback/ for a LibTorch
# wheel that lacks them. The .pc files are made relocatable (${pcfiledir});
# device-deps/bin/pkg-config is a pkgconf that sees only the bundle.
# device-deps/manifest.env records what the bundle needs of the host (newest GLIBC_ and
# GLIBCXX_ versions, the C++11 string ABI) for device_build.sh to check.
#
# Idempotent: when the bundle is there and neither this script, the package versions nor
# the Boost headers the sources include have changed, it says so and returns. The .debs
# are kept in .device-debs/ ($EMBER_DEVICE_DEBS), which is not carried.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${EMBER_DEVICE_DEPS:-$root/device-deps}"
debs="${EMBER_DEVICE_DEBS:-$root/.device-debs}"
max_mib="${EMBER_DEVICE_DEPS_MAX_MIB:-40}"

die() { echo "device_bundle: $*" >&2; exit 1; }
for tool in apt-get apt-cache dpkg dpkg-deb objdump nm g++ python3 sha256sum; do
  command -v "$tool" >/dev/null || die "needs $tool (a Debian 12 machine with binutils, g++ and python3)"
done
[ "$(dpkg --print-architecture)" = amd64 ] || die "needs an amd64 Debian: the GPU machine is x86-64"
ma=x86_64-linux-gnu

# The -dev packages (headers, CMake configs, .pc files, link libraries). libboost-dev is
# Debian's pointer to the versioned package, which holds the headers.
boost_dev="$(apt-cache depends libboost-dev 2>/dev/null | sed -n 's/^ *Depends: \(libboost[0-9.]*-dev\)$/\1/p' | head -1)"
[ -n "$boost_dev" ] || die "cannot resolve libboost-dev to its versioned package (apt-get update?)"
DEV_PACKAGES=(libzmq3-dev cppzmq-dev libtbb-dev "$boost_dev" libcli11-dev libspdlog-dev libfmt-dev
  nlohmann-json3-dev libxxhash-dev zlib1g-dev libdivide-dev libgtest-dev libgmock-dev
  libibverbs-dev librdmacm-dev pkgconf-bin)
# Libraries linked shared (their runtime packages come along) and statically (their .so
# link names are dropped, so CMake and pkg-config find the archive).
LINK_SHARED=(zmq tbb tbbmalloc tbbmalloc_proxy tbbbind_2_5 spdlog fmt ibverbs rdmacm)
LINK_STATIC=(xxhash z gtest gtest_main gmock gmock_main)
# What the host's toolchain provides: never bundled.
BASE_SONAMES=" libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 libresolv.so.2 libutil.so.1 libanl.so.1 ld-linux-x86-64.so.2 libgcc_s.so.1 libstdc++.so.6 "
base_package() { [[ "$1" =~ ^(libc6|libc6-dev|libc-dev|libgcc-s1|libstdc\+\+6|gcc-[0-9]+-base|libstdc\+\+-[0-9]+-dev|libcrypt1|libcrypt-dev)$ ]]; }

# The Boost headers the sources include (the seeds of the closure kept below).
boost_seeds="$(grep -rhoE '^\s*#\s*include\s*[<"]boost/[^>"]+[>"]' \
  "$root"/{common,data,cache,scheduler,transport,ps,worker,bench,tests} 2>/dev/null \
  | sed -E 's/.*[<"](boost\/[^>"]+)[>"].*/\1/' | sort -u | tr '\n' ' ' || true)"

mkdir -p "$debs"
work="$(mktemp -d)"
stage="$out.tmp-$$"
trap 'rm -rf "$work" "$stage"' EXIT
mkdir -p "$work/uris"  # empty: apt-get prints no URI for a .deb already in the current folder
# deb_name PKG: the file apt-get download writes for the candidate version (looked up
# for many packages at once by resolve_names, since each apt-get call takes a while).
declare -A debfile
resolve_names() {
  local todo=() p
  for p in "$@"; do [ -n "${debfile[$p]:-}" ] || todo+=("$p"); done
  [ ${#todo[@]} -gt 0 ] || return 0
  while read -r _ p _; do
    [ -n "${p:-}" ] && debfile[${p%%_*}]=$p
  done < <(cd "$work/uris" && apt-get download --print-uris "${todo[@]}" 2>/dev/null || echo FAILED)
  for p in "${todo[@]}"; do
    [ -n "${debfile[$p]:-}" ] || die "apt-get has no download for $p (apt-get update, or not a Debian 12 package?)"
  done
}
deb_name() { resolve_names "$1"; echo "${debfile[$1]}"; }
fingerprint() {  # over this script, the Boost seeds and the .deb names of the packages given
  local names
  names="$(cd "$work/uris" && apt-get download --print-uris "$@" 2>/dev/null | awk '{print $2}' | sort)" ||
    die "apt-get cannot download some of: $* (apt-get update?)"
  { sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1; echo "$boost_seeds"; echo "$names"; } | sha256sum | cut -d' ' -f1
}

if [ -f "$out/.fingerprint" ] && [ -f "$out/.packages" ]; then
  mapfile -t had <"$out/.packages"
  if [ "$(fingerprint "${had[@]}")" = "$(cat "$out/.fingerprint")" ]; then
    echo "device_bundle: $out is up to date ($(du -sh "$out" | cut -f1)); nothing to do"
    exit 0
  fi
fi

x="$work/x"  # x/PKG: the package's files
mkdir -p "$x"
fetched=()
fetch() {  # downloads (once, into the cache) and extracts each package
  local p f
  resolve_names "$@"
  for p in "$@"; do
    [ -d "$x/$p" ] && continue
    f="$(deb_name "$p")"
    if [ ! -f "$debs/$f" ]; then
      (cd "$debs" && apt-get download -q "$p" >/dev/null 2>&1) || die "apt-get download $p failed"
      [ -f "$debs/$f" ] || die "apt-get download $p did not write $f"
    fi
    mkdir -p "$x/$p"
    dpkg-deb -x "$debs/$f" "$x/$p"
    fetched+=("$p")
  done
}
declare -A depends_cache
depends_of() {  # DEPS=( PKG's Depends, less virtual packages and the toolchain's own )
  [ -n "${depends_cache[$1]+x}" ] || depends_cache[$1]="$(depends_query "$1")"
  DEPS=()
  [ -z "${depends_cache[$1]}" ] || mapfile -t DEPS <<<"${depends_cache[$1]}"
}
depends_query() {
  apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces --no-enhances "$1" 2>/dev/null |
    sed -n 's/^ *|\?\(Pre\)\?Depends: \([^<> ]*\)$/\2/p' | sort -u | while read -r d; do base_package "$d" || echo "$d"; done
}
libdirs_of() { local d; for d in "$x/$1/usr/lib/$ma" "$x/$1/lib/$ma"; do [ -d "$d" ] && echo "$d"; done; return 0; }

echo "device_bundle: downloading ${#DEV_PACKAGES[@]} -dev packages into $debs"
fetch "${DEV_PACKAGES[@]}"

mkdir -p "$stage/usr/lib/$ma" "$stage/usr/include" "$stage/bin"
lib="$stage/usr/lib/$ma"
declare -A owner  # file name in lib/ -> the package it came from

# Headers (Boost apart), CMake configs, .pc files and the link names of the kept libraries.
for p in "${DEV_PACKAGES[@]}"; do
  if [ "$p" != "$boost_dev" ] && [ -d "$x/$p/usr/include" ]; then cp -a "$x/$p/usr/include/." "$stage/usr/include/"; fi
  for d in usr/share/cmake usr/share/pkgconfig "usr/lib/$ma/cmake" "usr/lib/$ma/pkgconfig"; do
    if [ -d "$x/$p/$d" ]; then mkdir -p "$stage/$d" && cp -a "$x/$p/$d/." "$stage/$d/"; fi
  done
  for l in "${LINK_SHARED[@]}"; do
    for d in $(libdirs_of "$p"); do [ -e "$d/lib$l.so" ] || [ -L "$d/lib$l.so" ] && { cp -P "$d/lib$l.so" "$lib/"; owner[lib$l.so]=$p; }; done
  done
  for l in "${LINK_STATIC[@]}"; do
    for d in $(libdirs_of "$p"); do [ -f "$d/lib$l.a" ] && { cp "$d/lib$l.a" "$lib/"; owner[lib$l.a]=$p; }; done
  done
  [ -f "$x/$p/usr/bin/pkgconf" ] && { cp "$x/$p/usr/bin/pkgconf" "$stage/bin/pkgconf.bin"; owner[pkgconf.bin]=$p; }
done
[ -f "$stage/bin/pkgconf.bin" ] || die "pkgconf-bin did not provide usr/bin/pkgconf"

# The runtime closure: every file a link name points to, and every soname a bundled
# library or pkgconf needs, from the runtime package that holds it. A missing one is
# looked for first among the requesting package's dependencies named like it, then among
# the rest of them.
provider_of() {  # FILE: the fetched package whose lib dir holds FILE
  local p d
  for p in "${fetched[@]}"; do
    for d in $(libdirs_of "$p"); do [ -e "$d/$1" ] && { echo "$p"; return 0; }; done
  done
  return 1
}
take_runtime() {  # PKG: copy its versioned shared libraries into lib/
  local d f n
  for d in $(libdirs_of "$1"); do
    for f in "$d"/lib*.so.*; do
      [ -e "$f" ] || [ -L "$f" ] || continue
      n="$(basename "$f")"
      [ -e "$lib/$n" ] && continue
      if [ -L "$f" ]; then ln -sfn "$(basename "$(readlink "$f")")" "$lib/$n"; else cp "$f" "$lib/$n"; fi
      owner[$n]=$1
    done
  done
}
want() {  # FILE REQUESTER
  local file=$1 req=$2 q stem d depth=0 frontier=() next=() cands=() nondev=() dev=()
  stem="${file%%.so*}"; stem="${stem//_/-}"
  depends_of "$req"; frontier=("${DEPS[@]}")
  # Breadth first through the requester's dependencies: at each level the packages named
  # like the file, then the other libraries, then the -dev packages.
  while ! provider_of "$file" >/dev/null && [ ${#frontier[@]} -gt 0 ] && [ $depth -lt 4 ]; do
    cands=(); nondev=(); dev=()
    for d in "${frontier[@]}"; do
      if [[ "$d" == "$stem"* ]]; then cands+=("$d"); elif [[ "$d" == *-dev ]]; then dev+=("$d"); else nondev+=("$d"); fi
    done
    for group in cands nondev dev; do
      local -n g=$group
      if [ ${#g[@]} -gt 0 ] && ! provider_of "$file" >/dev/null; then fetch "${g[@]}"; fi
    done
    next=()
    for d in "${frontier[@]}"; do
      if [ -d "$x/$d" ]; then depends_of "$d"; next+=("${DEPS[@]}"); fi
    done
    frontier=()
    for d in "${next[@]}"; do [ -d "$x/$d" ] || frontier+=("$d"); done
    depth=$((depth + 1))
  done
  q="$(provider_of "$file")" || die "no dependency of $req provides $file"
  take_runtime "$q"
}
changed=1
while [ "$changed" = 1 ]; do
  changed=0
  for f in "$lib"/* "$stage/bin/pkgconf.bin"; do
    n="$(basename "$f")"
    if [ -L "$f" ] && [ ! -e "$f" ]; then
      want "$(basename "$(readlink "$f")")" "${owner[$n]}"; changed=1; continue
    fi
    [ -L "$f" ] || [[ "$n" != *.so* && "$n" != pkgconf.bin ]] && continue
    for s in $(objdump -p "$f" | awk '$1 == "NEEDED" {print $2}'); do
      [[ "$BASE_SONAMES" == *" $s "* ]] && continue
      [ -e "$lib/$s" ] && continue
      want "$s" "${owner[$n]}"; changed=1
    done
  done
done
# Absolute symlinks (Debian's /lib vs /usr/lib) point at the copy beside them.
for f in "$lib"/*; do
  if [ -L "$f" ] && [[ "$(readlink "$f")" == /* ]]; then ln -sfn "$(basename "$(readlink "$f")")" "$f"; fi
done
for f in "$lib"/*; do [ -e "$f" ] || die "dangling link in the bundle: $f"; done

# Boost: the closure of #include <boost/...> from the seeds, all of boost/config (its
# headers are chosen by macros), and what the compiler actually opens for the seeds (the
# few more headers macros choose), with their folders.
[ -n "$boost_seeds" ] || die "no #include <boost/...> in the sources: nothing to keep of Boost"
python3 - "$x/$boost_dev/usr/include" "$stage/usr/include" "$work" $boost_seeds <<'EOF'
import os, re, shutil, subprocess, sys
src, dst, work, seeds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
inc = re.compile(r'^\s*#\s*include\s*[<"](boost/[^>"]+)[>"]', re.M)
keep, todo = set(), list(seeds)
while todo:
    h = todo.pop()
    if h in keep or not os.path.isfile(os.path.join(src, h)):
        continue
    keep.add(h)
    todo += inc.findall(open(os.path.join(src, h), errors='replace').read())
for d, _, files in os.walk(os.path.join(src, 'boost', 'config')):
    keep |= {os.path.relpath(os.path.join(d, f), src) for f in files}
keep.add('boost/config.hpp')
tu = os.path.join(work, 'boost_seeds.cc')
open(tu, 'w').write(''.join(f'#include <{s}>\n' for s in seeds))
deps = subprocess.run(['g++', '-std=c++20', '-isystem', src, '-M', tu], capture_output=True, text=True, check=True)
opened = {os.path.relpath(t, src) for t in deps.stdout.replace('\\\n', ' ').split() if t.startswith(src + '/boost/')}
for h in opened - keep:  # chosen by macros: keep their whole folder
    d = os.path.dirname(os.path.join(src, h))
    keep |= {os.path.relpath(os.path.join(d, f), src) for f in os.listdir(d) if os.path.isfile(os.path.join(d, f))}
for h in keep:
    os.makedirs(os.path.dirname(os.path.join(dst, h)), exist_ok=True)
    shutil.copy2(os.path.join(src, h), os.path.join(dst, h))
print(f'device_bundle: Boost: {len(keep)} headers kept for {" ".join(seeds)} '
      f'({sum(os.path.getsize(os.path.join(src, h)) for h in keep) / 2**20:.1f} MiB)')
EOF
mkdir -p "$stage/usr/lib/$ma/cmake"
for f in "$x/$boost_dev/usr/lib/$ma/cmake/"{Boost-*,boost_headers-*,BoostDetectToolset-*}; do
  if [ -e "$f" ]; then cp -a "$f" "$stage/usr/lib/$ma/cmake/"; fi
done
compgen -G "$stage/usr/lib/$ma/cmake/Boost-*/BoostConfig.cmake" >/dev/null || die "$boost_dev has no BoostConfig.cmake"

# Gloo's headers, apart: a fallback for a LibTorch wheel that ships none (ProcessGroupGloo.hpp
# includes them; Ember only declares through them, never builds Gloo's own code).
fetch libgloo-dev
mkdir -p "$stage/fallback/gloo/include"
cp -a "$x/libgloo-dev/usr/include/gloo" "$stage/fallback/gloo/include/"
echo "Debian libgloo-dev $(dpkg-deb -f "$debs/$(deb_name libgloo-dev)" Version)" >"$stage/fallback/gloo/VERSION"

# .pc files: only those whose libraries are all in the bundle; Requires.private dropped
# (they matter only to static linking of the shared ones, and name packages not bundled);
# paths made relative to the .pc file's own folder.
kept_libs=" ${LINK_SHARED[*]} ${LINK_STATIC[*]} pkgconf pthread m dl rt stdc++ "
for pc in "$stage"/usr/lib/$ma/pkgconfig/*.pc "$stage"/usr/share/pkgconfig/*.pc; do
  [ -f "$pc" ] || continue
  for l in $(sed -n 's/^Libs:\(.*\)/\1/p' "$pc" | grep -oE '(^|\s)-l[^ ]+' | sed 's/^ *-l//'); do
    [[ "$kept_libs" == *" $l "* ]] || { rm -f "$pc"; continue 2; }
  done
  rel="$(python3 -c 'import os,sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' "$stage/usr" "$(dirname "$pc")")"
  sed -i -E -e '/^Requires\.private:/d' \
    -e "s#^(prefix|exec_prefix|libdir|includedir)=/usr(/|\$)#\1=\${pcfiledir}/$rel\2#" \
    -e "s#(-[IL])/usr/#\1\${pcfiledir}/$rel/#g" "$pc"
  if grep -qE '(=|-[IL])/usr' "$pc"; then die "an absolute /usr path is left in $(basename "$pc")"; fi
done
for pc in "$stage"/usr/lib/$ma/pkgconfig/*.pc "$stage"/usr/share/pkgconfig/*.pc; do  # Requires must be there too
  [ -f "$pc" ] || continue
  for r in $(sed -n 's/^Requires:\(.*\)/\1/p' "$pc" | tr ',' ' ' | grep -oE '(^| )[A-Za-z][A-Za-z0-9_.+-]*'); do
    [ -f "$stage/usr/lib/$ma/pkgconfig/$r.pc" ] || [ -f "$stage/usr/share/pkgconfig/$r.pc" ] ||
      die "$(basename "$pc") requires $r, which is not in the bundle"
  done
done
cat >"$stage/bin/pkg-config" <<'EOF'
#!/bin/sh
# pkgconf from the bundle, seeing only the bundle's .pc files (device_bundle.sh).
d="$(cd "$(dirname "$0")/.." && pwd)"
export PKG_CONFIG_LIBDIR="$d/usr/lib/x86_64-linux-gnu/pkgconfig:$d/usr/share/pkgconfig"
unset PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR
LD_LIBRARY_PATH="$d/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$d/bin/pkgconf.bin" "$@"
EOF
chmod +x "$stage/bin/pkg-config"
"$stage/bin/pkg-config" --modversion libxxhash >/dev/null || die "the bundled pkg-config does not work"

# What the bundle needs of the host: the newest GLIBC_/GLIBCXX_/CXXABI_ versions its
# binaries reference, and the C++11 string ABI of its C++ libraries.
newest() {  # PREFIX: the newest PREFIX version any bundled binary requires
  for f in "$lib"/*.so.* "$stage/bin/pkgconf.bin"; do [ -L "$f" ] || objdump -p "$f"; done |
    awk -v p="$1" '$NF ~ "^"p"_[0-9]" {sub(p"_", "", $NF); print $NF}' | sort -uV | tail -1
}
glibc="$(newest GLIBC)"; glibcxx="$(newest GLIBCXX)"; cxxabi="$(newest CXXABI)"
cxx11=0
for f in "$lib"/libspdlog.so.* "$lib"/libfmt.so.* "$lib"/libgtest.a; do
  [ -L "$f" ] && continue
  if [ "$( { nm -D --defined-only "$f" 2>/dev/null || nm --defined-only "$f" 2>/dev/null || true; } | grep -c __cxx11)" -gt 0 ]; then cxx11=1; fi
done
{
  echo "# Written by scripts/device_bundle.sh; read by scripts/device_build.sh."
  echo "EMBER_BUNDLE_MULTIARCH=$ma"
  echo "EMBER_BUNDLE_GLIBC=$glibc"
  echo "EMBER_BUNDLE_GLIBCXX=$glibcxx"
  echo "EMBER_BUNDLE_CXXABI=$cxxabi"
  echo "EMBER_BUNDLE_CXX11_ABI=$cxx11"
  echo "EMBER_BUNDLE_BUILT_WITH='$(g++ --version | head -1) on $(. /etc/os-release && echo "$PRETTY_NAME")'"
} >"$stage/manifest.env"
for p in "${fetched[@]}"; do
  f="$(deb_name "$p")"
  echo "$(dpkg-deb -f "$debs/$f" Package) $(dpkg-deb -f "$debs/$f" Version)"
done | sort >"$stage/packages.txt"
printf '%s\n' "${fetched[@]}" >"$stage/.packages"
fingerprint "${fetched[@]}" >"$stage/.fingerprint"

size_kib="$(du -sk "$stage" | cut -f1)"
[ "$size_kib" -le $((max_mib * 1024)) ] || die "the bundle is $((size_kib / 1024)) MiB, over $max_mib MiB"
rm -rf "$out"
mv "$stage" "$out"
echo "device_bundle: $out: $(du -sh "$out" | cut -f1) ($(find "$out" -type f | wc -l) files) from ${#fetched[@]} packages;" \
  "needs GLIBC $glibc, GLIBCXX $glibcxx, CXXABI $cxxabi; C++11 ABI $cxx11"
