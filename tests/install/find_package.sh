#!/bin/bash
# The installable package: `cmake --install` into a temporary prefix, then a separate user project
# (tests/install/consumer) does find_package(deepspeed_cpp), links it and trains two steps.
# Usage: find_package.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$src/tests/install/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/consumer" -j2 >/dev/null
out=$(LD_LIBRARY_PATH="$tmp/prefix/lib:${LD_LIBRARY_PATH:-}" OMP_NUM_THREADS=1 "$tmp/consumer/consumer")
echo "$out"
grep -q "consumer: 2 steps" <<<"$out"
