#!/usr/bin/env bash
# iproute2's ip, tc and rdma from Debian 12, with the shared libraries they need, into
# device-tools/ (or $EMBER_DEVICE_TOOLS): the GPU machine has none of them, and
# scripts/device_check.sh needs them there for the namespace cluster benchmark and
# soft-RoCE. Carry device-tools/ with the working tree beside device-deps/.
#
# device-tools/bin/{ip,tc,rdma} run the Debian binaries through the host's own loader with
# --library-path: the bundled libraries serve those programs alone and do not reach what
# `ip netns exec` starts. Idempotent: returns when the tools are there for the same
# package versions. The .debs are kept in .device-debs/ ($EMBER_DEVICE_DEBS).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${EMBER_DEVICE_TOOLS:-$root/device-tools}"
debs="${EMBER_DEVICE_DEBS:-$root/.device-debs}"
die() { echo "device_tools: $*" >&2; exit 1; }
for tool in apt-get dpkg-deb objdump; do command -v "$tool" >/dev/null || die "needs $tool (Debian 12 with binutils)"; done
[ "$(dpkg --print-architecture)" = amd64 ] || die "needs an amd64 Debian: the GPU machine is x86-64"

# iproute2 and the libraries ip, tc and rdma link against (glibc's own are the host's).
PACKAGES=(iproute2 libbpf1 libbsd0 libmd0 libcap2 libelf1 libmnl0 libxtables12 zlib1g)
BINARIES=(bin/ip sbin/tc usr/bin/rdma)
versions="$(apt-cache policy "${PACKAGES[@]}" | awk '/^[^ ]/ {p=$1} /Candidate:/ {print p, $2}')"
[ -n "$versions" ] || die "apt-cache knows none of ${PACKAGES[*]} (apt-get update?)"
stamp="$( { sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1; echo "$versions"; } | sha256sum | cut -d' ' -f1)"
if [ -f "$out/.stamp" ] && [ "$(cat "$out/.stamp")" = "$stamp" ]; then
  echo "device_tools: $out is up to date; nothing to do"
  exit 0
fi

mkdir -p "$debs"
work="$(mktemp -d)"
stage="$out.tmp-$$"
trap 'rm -rf "$work" "$stage"' EXIT
(cd "$debs" && apt-get download -q "${PACKAGES[@]}" >/dev/null) || die "apt-get download ${PACKAGES[*]} failed"
for p in "${PACKAGES[@]}"; do
  f="$(ls -t "$debs/${p}_"*.deb 2>/dev/null | head -1)"
  [ -n "$f" ] || die "apt-get download $p wrote no .deb in $debs"
  dpkg-deb -x "$f" "$work/x"
done
mkdir -p "$stage/bin" "$stage/libexec" "$stage/lib"
for b in "${BINARIES[@]}"; do
  [ -f "$work/x/$b" ] || die "iproute2 has no $b"
  cp "$work/x/$b" "$stage/libexec/"
done
# The NEEDED closure but glibc's own, from the packages above.
changed=1
while [ "$changed" = 1 ]; do
  changed=0
  for n in $(for b in "$stage"/libexec/* "$stage"/lib/*; do [ -e "$b" ] && objdump -p "$b" | awk '$1 == "NEEDED" {print $2}'; done | sort -u); do
    case "$n" in libc.so.*|libm.so.*|ld-linux*|libpthread.so.*|libdl.so.*|librt.so.*|libresolv.so.*) continue ;; esac
    [ -e "$stage/lib/$n" ] && continue
    f="$(find "$work/x" -name "$n" | head -1)"
    [ -n "$f" ] || die "no package above provides $n"
    cp -L "$f" "$stage/lib/"
    changed=1
  done
done
for b in "${BINARIES[@]}"; do
  name="$(basename "$b")"
  cat >"$stage/bin/$name" <<EOF
#!/bin/sh
# Debian 12's $name (scripts/device_tools.sh), its libraries for it alone.
d="\$(cd "\$(dirname "\$0")/.." && pwd)"
exec /lib64/ld-linux-x86-64.so.2 --library-path "\$d/lib" "\$d/libexec/$name" "\$@"
EOF
  chmod +x "$stage/bin/$name"
done
"$stage/bin/ip" -V >/dev/null || die "the bundled ip does not run here"
echo "$versions" >"$stage/packages.txt"
echo "$stamp" >"$stage/.stamp"
rm -rf "$out"
mv "$stage" "$out"
echo "device_tools: $out: $(du -sh "$out" | cut -f1), $(ls "$out/bin" | tr '\n' ' ')from $(echo "$versions" | head -1)"
