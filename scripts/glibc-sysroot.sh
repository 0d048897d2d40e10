#!/usr/bin/env bash
# The oldest C and C++ run-time libraries the wheel's compiled pieces link against: glibc 2.31 and GCC 10's
# libstdc++ and libgcc_s (Debian 11 "bullseye", the same as Ubuntu 20.04's), unpacked from Debian's packages into a directory
# that the build links through (-DMOE_GLIBC_SYSROOT, CMakeLists.txt: moe_link_glibc_floor). A library links its
# glibc symbols at the version of the glibc it is linked against, so the wheel is manylinux_2_31 and installs on
# Ubuntu 20.04/22.04, RHEL/Rocky 9 and Amazon Linux 2023, although it is compiled on Debian 12 (glibc 2.36)
# against Debian's LLVM 22; what those newer headers and static libraries need beyond 2.31 is defined by
# lib/Support/GlibcFloor.cpp. Only the files the linker and the test read are kept (no headers).
#   scripts/glibc-sysroot.sh [DIR]     # DIR: $MOE_GLIBC_SYSROOT or .sysroot/glibc-2.31; prints DIR
# Idempotent: an existing, complete DIR is left alone. Each package is checked against its SHA-256 (from
# bullseye's Packages index); the download tries deb.debian.org, then archive.debian.org.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-${MOE_GLIBC_SYSROOT:-$ROOT/.sysroot/glibc-2.31}}"
STAMP="$DIR/.complete"
[ -f "$STAMP" ] && { echo "$DIR"; exit 0; }

PACKAGES=(
  "pool/main/g/glibc/libc6_2.31-13+deb11u11_amd64.deb 05f7264da867b37f4c5ce49266b558ea1e81e05a9464f623152fca70f3550282"
  "pool/main/g/glibc/libc6-dev_2.31-13+deb11u11_amd64.deb e7f7b45d9c5cfcf37609f0b6efd3c645272c812144703af89dfd32218fcb0fd3"
  "pool/main/g/gcc-10/libstdc++6_10.2.1-6_amd64.deb 5c155c58935870bf3b4bfe769116841c0d286a74f59eccfd5645693ac23f06b1"
  "pool/main/g/gcc-10/libgcc-s1_10.2.1-6_amd64.deb e478f2709d8474165bb664de42e16950c391f30eaa55bc9b3573281d83a29daf"
)
MIRRORS=(http://deb.debian.org/debian http://archive.debian.org/debian)

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for entry in "${PACKAGES[@]}"; do
  read -r path sha <<<"$entry"
  deb="$tmp/$(basename "$path")"
  for m in "${MIRRORS[@]}"; do
    curl -fsSL --retry 3 -o "$deb" "$m/$path" && break || rm -f "$deb"
  done
  [ -f "$deb" ] || { echo "glibc-sysroot: cannot download $path" >&2; exit 1; }
  echo "$sha  $deb" | sha256sum -c --quiet - || { echo "glibc-sysroot: $path: wrong SHA-256" >&2; exit 1; }
  dpkg-deb -x "$deb" "$tmp/root"
done

rm -rf "$DIR"
mkdir -p "$DIR"
# The linker's view: the C library's linker scripts, crt files and static parts, the shared libraries they name,
# and the loader (which the test runs the compiler under).
cp -a "$tmp/root/lib" "$tmp/root/lib64" "$DIR/"
mkdir -p "$DIR/usr/lib"
cp -a "$tmp/root/usr/lib/x86_64-linux-gnu" "$DIR/usr/lib/"
rm -rf "$DIR/usr/lib/x86_64-linux-gnu/gconv" "$DIR/usr/lib/x86_64-linux-gnu/audit"
# Absolute links (libm.so -> /lib/x86_64-linux-gnu/libm.so.6, the loader) would reach this system's libraries: made
# relative, inside DIR.
find "$DIR" -type l -lname '/*' | while read -r link; do
  ln -sfn "$(realpath -m --relative-to="$(dirname "$link")" "$DIR$(readlink "$link")")" "$link"
done
# libstdc++'s link name (libstdc++-10-dev's, without its headers): g++ links -lstdc++ from the first -L that has it.
ln -sf libstdc++.so.6 "$DIR/usr/lib/x86_64-linux-gnu/libstdc++.so"
touch "$STAMP"
echo "$DIR"
