#!/bin/sh
# Builds smc_option.bpf.o from smc_option.bpf.c, reproducibly: fixed flags, no host headers,
# no paths in the object (DWARF is stripped; BTF keeps only the file's base name), so the
# same clang gives the same bytes in any directory. CI rebuilds and compares with the
# committed object (.ci/run). Usage: build.sh [OUT]  (default: smc_option.bpf.o beside it)
set -eu
dir=$(cd "$(dirname "$0")" && pwd)
out=${1:-$dir/smc_option.bpf.o}
CLANG=${CLANG:-clang}
STRIP=${LLVM_STRIP:-llvm-strip}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$dir/smc_option.bpf.c" "$dir/smc_bpf.h" "$tmp/"
cd "$tmp"
"$CLANG" -O2 -g -target bpf -mcpu=v2 -nostdinc -ffreestanding \
  -fdebug-compilation-dir=. -fno-ident \
  -c smc_option.bpf.c -o smc_option.bpf.o
"$STRIP" --strip-debug smc_option.bpf.o
cp smc_option.bpf.o "$out"
