#!/bin/bash
# Builds the GPU pack on this CPU-only machine, so that a GPU session spends its device minutes
# (15 in all) on tests and benchmarks instead of a build:
#   bash bench/gpu/cross_pack.sh        ->  .gpu-build/dsb.tgz (carry .gpu and .gpu-build)
#   ALL=1 bash bench/gpu/cross_pack.sh  ->  the same with every program of the tree (the unit and
#                                           dist tests, dsrun, the tools), for run.sh's
#                                           STEPS=test TEST_LABELS="unit dist" without a build
# The programs of bench/gpu/pack.sh are compiled against the GPU machine's libtorch 2.11 + CUDA 13
# + NCCL headers (../shared/tools/libtorch2-headers) and this machine's CUDA 13 toolkit, in /tmp/dsb
# as on the device. libtorch's shared libraries are not here: the programs are linked against stub
# libraries with the real names (libtorch_cpu.so, libc10.so, ...) that define every symbol the
# programs use. At run time the dynamic linker looks symbols up by name in whatever libraries are
# loaded, so the real libtorch of the wheel serves them; bench/gpu/run.sh points /tmp/torch211/lib
# (the RUNPATH here) at the wheel's torch/lib and checks that the programs load before using them
# (a symbol the wheel lacks fails the load at once: -z now), building on the device otherwise.
# Everything is compiled -fPIC, executables too: position-dependent code would reach libtorch's
# variables through copy relocations sized by the stubs (checked below: none).
# Time: 942 s on this machine's 2 cores (measured 2026-11-28); the pack is 2.6 MB.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SHARED=${SHARED:-$ROOT/../shared}
H=${LIBTORCH2_HEADERS:-/tmp/libtorch2-headers}
P=/tmp/torch211                  # a libtorch prefix: the 2.11 headers and cmake files, stub libs
B=/tmp/dsb                       # bench/gpu/run.sh's build folder (the programs' RUNPATH)
G=$SHARED/tools/gpu-anchor
CUDA=${CUDA_HOME:-/usr/local/cuda}
JOBS=${JOBS:-$(nproc)}
TARGETS="gpt_train bench_cpu_adam bench_transfer gpu_training_test device_adam_gpu_test onebit_gpu_test pipeline_gpu_test activation_checkpointing_gpu_test flops_profiler_gpu_test"
[ "${ALL:-0}" = 1 ] && TARGETS=all
STUB_LIBS="c10 c10_cuda torch torch_cpu torch_cuda torch_nvshmem"
source "$ROOT/bench/gpu/pack.sh"
say() { echo "cross_pack: $*"; }
fail() { echo "cross_pack: error: $*" >&2; exit 1; }

[ -x "$CUDA/bin/nvcc" ] || fail "no CUDA toolkit at $CUDA (CUDA_HOME): the configure needs libcudart"
[ -d "$G/deps/gloo-src" ] || fail "no gpu-anchor kit at $G (SHARED=<the shared folder>)"
# check.sh unpacks the headers once (its usage error after that is expected).
bash "$SHARED/tools/libtorch2-headers/check.sh" > /dev/null 2>&1 || true
[ -f "$H/.done" ] || fail "the libtorch 2.11 headers did not unpack into $H"

mkdir -p "$P/lib"
ln -sfn "$H/torch/include" "$P/include"
ln -sfn "$H/torch/share" "$P/share"

make_stubs() {  # $1: an assembly file defining symbols for libtorch_cpu.so (the others: none)
  local l
  for l in $STUB_LIBS; do
    if [ $l = torch_cpu ] && [ -n "${1:-}" ]; then
      gcc -shared -o "$P/lib/lib$l.so" -Wl,-soname,lib$l.so "$1"
    else
      gcc -shared -fPIC -o "$P/lib/lib$l.so" -Wl,-soname,lib$l.so -x c /dev/null
    fi
  done
}

configure() {
  cmake -S "$ROOT" -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DTORCH_DIR=$P -DDS_UNITY_BUILD=ON \
    -DDS_GLOO_INCLUDE_DIR="$G/deps/gloo-src" -DDS_NCCL_INCLUDE_DIR="$H/nccl" \
    -DURING_INCLUDE_DIR="$G/deps/usr/include" \
    -DURING_LIBRARY="$G/deps/usr/lib/x86_64-linux-gnu/liburing.a" \
    -DCUDAToolkit_ROOT="$CUDA" -DCMAKE_CUDA_COMPILER="$CUDA/bin/nvcc" -DCMAKE_CXX_FLAGS=-fPIC \
    -DCMAKE_EXE_LINKER_FLAGS="-Wl,--no-demangle -Wl,-z,now" \
    -DCMAKE_SHARED_LINKER_FLAGS="-Wl,-z,now" > $B.configure.log 2>&1 ||
    { tail -30 $B.configure.log; fail "configure failed (log: $B.configure.log)"; }
  grep -E "^-- deepspeed.cpp" $B.configure.log || true
}

# The symbols the programs take from libtorch: the library's unversioned undefined symbols (what
# libstdc++, libc, libgomp or libcudart resolved carries a version) and what the executables'
# links reported missing, less what the system and CUDA libraries define.
wanted_symbols() {
  {
    nm -D --undefined-only --format=posix $B/lib/libdeepspeed_cpp.so | awk '$2 == "U" && $1 !~ /@/ {print $1}'
    grep -ho "undefined reference to \`[^']*'" $B.link1.log | sed "s/.*\`//; s/'$//"
  } | sort -u > $B.wanted
  local lib
  for lib in /lib/x86_64-linux-gnu/libstdc++.so.6 /lib/x86_64-linux-gnu/libc.so.6 \
             /lib/x86_64-linux-gnu/libm.so.6 /lib/x86_64-linux-gnu/libgcc_s.so.1 \
             /usr/lib/x86_64-linux-gnu/libgomp.so.1 "$CUDA"/lib64/libcudart.so.*[0-9]; do
    [ -f "$lib" ] && nm -D --defined-only --format=posix "$lib" | awk '{sub(/@.*/, "", $1); print $1}'
  done | sort -u > $B.provided
  comm -23 $B.wanted $B.provided
}

# A thread-local must be defined as one in the stub, or the link refuses it (TLS mismatch).
tls_symbols() {
  find $B -name '*.o' -print0 | xargs -0 readelf -rW 2>/dev/null |
    awk '$3 ~ /TLSGD|TLSLD|GOTTPOFF|TPOFF|DTPOFF/ {print $5}' | sort -u
}

stub_assembly() {  # $1: symbols, $2: thread-locals -> assembly on stdout
  echo '.text'
  comm -23 "$1" "$2" | awk '{printf ".globl \"%s\"\n.type \"%s\",@function\n\"%s\": ret\n", $1, $1, $1}'
  echo '.section .tbss,"awT",@nobits'
  comm -12 "$1" "$2" | awk '{printf ".globl \"%s\"\n.type \"%s\",@object\n.size \"%s\",8\n\"%s\": .zero 8\n", $1, $1, $1, $1}'
  echo '.section .note.GNU-stack,"",@progbits'  # no executable stack
}

T0=$(date +%s)
STAMP=$(source_stamp "$ROOT")  # of the sources as the build starts
# An earlier cross build's objects are reused (ninja is incremental; the stubs change, so every
# program is linked again); anything else in /tmp/dsb is not.
grep -qs "^TORCH_DIR:[A-Z]*=$P\$" $B/CMakeCache.txt || rm -rf $B
make_stubs ""
say "configure against the libtorch 2.11 headers (stub libraries in $P/lib)"
configure
say "compile (the library first; the executables' first link fails on purpose: it lists their needs)"
ninja -C $B -j"$JOBS" deepspeed_cpp > $B.build.log 2>&1 || { grep -E "error" $B.build.log | head -20; fail "the library did not build (log: $B.build.log)"; }
ninja -C $B -j"$JOBS" -k 0 $TARGETS > $B.link1.log 2>&1 || true
compile_errors=$(grep -E "error:" $B.link1.log | grep -v -e "undefined reference" -e "collect2: error: ld returned" || true)
[ -z "$compile_errors" ] || { echo "$compile_errors" | head -20; fail "compile errors (log: $B.link1.log)"; }
wanted_symbols > $B.symbols
tls_symbols | sort -u > $B.tls
say "$(wc -l < $B.symbols) libtorch symbols, $(comm -12 $B.symbols $B.tls | wc -l) of them thread-local"
stub_assembly $B.symbols $B.tls > $P/stub_torch.s
make_stubs $P/stub_torch.s
ninja -C $B -j"$JOBS" $TARGETS > $B.link2.log 2>&1 || { grep -E "error|undefined" $B.link2.log | head -20; fail "link against the stubs failed (log: $B.link2.log)"; }

[ "${ALL:-0}" = 1 ] && PACKED="lib/libdeepspeed_cpp.so $(cd $B && echo bin/*)"
# A copy relocation against a stub's symbol would size libtorch's variable by the stub's (wrong)
# size. (Against libstdc++'s or libc's, real here, they are sized right.)
for f in $PACKED; do
  case $f in *.files) continue ;; esac  # the test programs' suite lists (text)
  copies=$(readelf -rW $B/$f | awk '$3 == "R_X86_64_COPY" {print $5}' | sed 's/@.*//' | sort -u |
           comm -12 - $B.symbols | tr '\n' ' ')
  [ -z "$copies" ] || fail "$f has copy relocations against libtorch's $copies: build it -fPIC"
done
say "NEEDED of gpu_training_test: $(readelf -dW $B/bin/gpu_training_test | awk '/NEEDED/ {gsub(/[][]/, "", $5); printf "%s ", $5}')"
{ echo "libtorch headers: $(cat "$SHARED"/tools/libtorch2-headers/torch211_include.tar.xz | sha1sum | cut -c1-12)"
  echo "compiler: $(c++ --version | head -1)"; echo "cuda: $($CUDA/bin/nvcc --version | tail -1)"; } > $B/cross_built
mkdir -p "$ROOT/.gpu-build"
have=$(pack_build "$ROOT" $B "$ROOT/.gpu-build/dsb.tgz")
say "packed:$(echo $have | wc -w) programs${ALL:+ (ALL=1)}: $(echo $have | cut -c1-200) into .gpu-build/dsb.tgz ($(du -h "$ROOT/.gpu-build/dsb.tgz" | cut -f1), $(( $(date +%s) - T0 )) s)"
