#!/bin/bash
# Compile-checks the library (in unity batches) and the other CUDA/NCCL-specific sources against
# libtorch 2.11 + CUDA 13 + NCCL headers (the GPU machine's), with no GPU and no libtorch 2.x
# installed: `g++ -fsyntax-only` through ../shared/tools/libtorch2-headers/check.sh. CI runs it
# so the CUDA path cannot rot between GPU runs; it is skipped, saying so, where that kit is absent
# (a user's clone).
set -euo pipefail
cd "$(dirname "$0")/.."
CHECK=${LIBTORCH2_CHECK:-../shared/tools/libtorch2-headers/check.sh}
if [ ! -x "$CHECK" ] && [ ! -f "$CHECK" ]; then
  echo "check-cuda-sources: $CHECK not found: CUDA sources not compile-checked"
  exit 0
fi
# The library as `make` compiles it (DS_UNITY_BUILD, CMakeLists.txt): every src/*.cpp, in CMake's
# order and unity batches, so that a CUDA-only name clash between two files of a batch shows here
# too. Then, one by one, the other files with CUDA/NCCL code or with APIs that changed in 2.x
# (the example GPT, the GPU tests and the CPU tests of the device and communicator code).
OTHERS=(
  examples/gpt/model.cpp
  examples/gpt/tp_model.cpp
  tests/gpu/gpu_training_test.cpp
  tests/gpu/device_adam_gpu_test.cpp
  tests/gpu/onebit_gpu_test.cpp
  tests/gpu/pipeline_gpu_test.cpp
  tests/gpu/activation_checkpointing_gpu_test.cpp
  tests/gpu/flops_profiler_gpu_test.cpp
  tests/support/ranks.cpp
  tests/unit/device_test.cpp
  tests/unit/out_of_memory_test.cpp
  tests/dist/comm_test.cpp
  tests/dist/deferred_init_test.cpp
  bench/transfer.cpp
)
batch=$(sed -n 's/^ds_unity(deepspeed_cpp \([0-9]*\)).*/\1/p' CMakeLists.txt)
[ -n "$batch" ] || { echo "check-cuda-sources: no ds_unity(deepspeed_cpp N) in CMakeLists.txt" >&2; exit 2; }
mapfile -t LIBRARY < <(find src -name '*.cpp' | LC_ALL=C sort)
UNITS_DIR=$(mktemp -d /tmp/check-cuda-unity.XXXXXX)
trap 'rm -rf "$UNITS_DIR"' EXIT
UNITS=()
for ((i = 0; i < ${#LIBRARY[@]}; i += batch)); do
  unit="$UNITS_DIR/unity_$((i / batch)).cpp"
  for s in "${LIBRARY[@]:i:batch}"; do echo "#include \"$PWD/$s\""; done > "$unit"
  UNITS+=("$unit")
done
FILES=("${UNITS[@]}" "${OTHERS[@]}")
# --all: every C++ source of the tree one by one (about 300 files, ~25 min on 2 cores; too long
# for CI): what to run before a GPU session, so that its build finds no 2.x incompatibility,
# whether it compiles in unity batches or not.
if [ "${1:-}" = "--all" ]; then
  mapfile -t FILES < <(find src tests examples bench tools -name '*.cpp' | sort)
fi
echo "check-cuda-sources: ${#LIBRARY[@]} library files in ${#UNITS[@]} unity batches and ${#OTHERS[@]} others against libtorch 2.11 / CUDA 13 / NCCL headers"
# The compile definitions CMake gives some targets (examples/gpt, tests/support).
FLAGS=(-DDS_WITH_CUDA=1 -DDS_WITH_CUDA_KERNELS=1 -DFMT_HEADER_ONLY=1 '-DDS_DEFAULT_TEXT="data/fortunes.txt"'
       "-DDS_TEST_SOURCE_DIR=\"$PWD\"" -I include -I src -I tests -I examples -I tools/dsrun)
# An empty file first: check.sh unpacks the headers once, before anything runs beside it.
: > "$UNITS_DIR/empty.cpp"
bash "$CHECK" "$UNITS_DIR/empty.cpp"
# Parsing libtorch 2.11's torch/torch.h is ~15 s of each file's ~25 s. The build force-includes
# src/util/pch.h (CMakeLists.txt: target_precompile_headers) in every translation unit, so each
# file is checked the same way here: a wrapper includes pch.h, then the file, and pch.h is
# precompiled once for the 2.11 headers. GCC uses the .gch only when it was made with check.sh's
# own flags (mirrored in KIT_FLAGS below); when they drift, -Winvalid-pch says so and GCC parses
# the header's text instead: the check stays the same, only slower. Included from a wrapper, a
# file counts as a header to GCC, hence -Wno-subobject-linkage (its anonymous-namespace fixtures).
H=${LIBTORCH2_HEADERS:-/tmp/libtorch2-headers}
KIT=$(cd "$(dirname "$CHECK")" && pwd)
KIT_FLAGS=(-std=c++17 -Wno-interference-size -DUSE_CUDA -DUSE_C10D_NCCL -DUSE_C10D_GLOO
           -isystem "$H/torch/include" -isystem "$H/torch/include/torch/csrc/api/include"
           -isystem "$H/cuda/include" -isystem "$H/nccl" -isystem "$KIT/../gpu-anchor/deps/gloo-src")
echo "#include \"$PWD/src/util/pch.h\"" > "$UNITS_DIR/ds_pch.h"
if ! g++ "${KIT_FLAGS[@]}" "${FLAGS[@]}" -x c++-header "$UNITS_DIR/ds_pch.h" -o "$UNITS_DIR/ds_pch.h.gch"; then
  echo "check-cuda-sources: src/util/pch.h not precompiled; every file parses it itself" >&2
  rm -f "$UNITS_DIR/ds_pch.h.gch"
fi
WRAPPED=()
for f in "${FILES[@]}"; do
  wrapper="$UNITS_DIR/check_$(echo "${f#"$UNITS_DIR"/}" | tr '/' '_')"
  { echo '#include "ds_pch.h"'; echo "#include \"$(cd "$(dirname "$f")" && pwd)/$(basename "$f")\""; } > "$wrapper"
  WRAPPED+=("$wrapper")
done
# Every core, the big batches first.
printf '%s\n' "${WRAPPED[@]}" | xargs -P "$(nproc)" -n 1 bash "$CHECK" -Winvalid-pch -Wno-subobject-linkage "${FLAGS[@]}"
# The CUDA kernels themselves, with nvcc as CMakeLists.txt compiles them (where a CUDA toolkit is).
NVCC=${CUDA_HOME:-/usr/local/cuda}/bin/nvcc
if [ -x "$NVCC" ]; then
  for cu in $(find src -name '*.cu' | LC_ALL=C sort); do
    "$NVCC" -std=c++17 --fmad=false -gencode arch=compute_90,code=sm_90 -I src -Xcompiler -Wall,-Wextra \
      -c "$cu" -o /dev/null
  done
  echo "check-cuda-sources: $(find src -name '*.cu' | wc -l) CUDA kernel files compiled with $("$NVCC" --version | tail -1)"
else
  echo "check-cuda-sources: no nvcc at $NVCC (CUDA_HOME): the .cu kernels not compiled"
fi
echo "check-cuda-sources: ok"
