#!/bin/bash
# Compile-checks the CUDA/NCCL-specific sources against libtorch 2.11 + CUDA 13 + NCCL headers
# (the GPU machine's), with no GPU and no libtorch 2.x installed: `g++ -fsyntax-only` through
# ../shared/tools/libtorch2-headers/check.sh. CI runs it so the CUDA path cannot rot between GPU
# runs; it is skipped, saying so, where that kit is absent (a user's clone).
set -euo pipefail
cd "$(dirname "$0")/.."
CHECK=${LIBTORCH2_CHECK:-../shared/tools/libtorch2-headers/check.sh}
if [ ! -x "$CHECK" ] && [ ! -f "$CHECK" ]; then
  echo "check-cuda-sources: $CHECK not found: CUDA sources not compile-checked"
  exit 0
fi
# Every file with code under DS_WITH_CUDA / USE_C10D_NCCL / TORCH_VERSION_MAJOR >= 2, what the
# NCCL communicator shares with Gloo, what uses APIs that changed in 2.x (c10::Allocator, the
# default generator), and the GPU tests.
FILES=(
  src/comm/nccl_communicator.cpp
  src/comm/communicator_base.cpp
  src/comm/local_reduce.cpp
  src/comm/split.cpp
  src/comm/gloo_communicator.cpp
  src/comm/init.cpp
  src/comm/exit_order.cpp
  src/comm/shm_allreduce.cpp
  src/comm/shm_segment.cpp
  src/tp/deferred_init.cpp
  src/device/device.cpp
  src/runtime/build_engine.cpp
  src/device/device_memory.cpp
  src/device/out_of_memory.cpp
  src/device/transfer_stream.cpp
  src/device/pinned_memory.cpp
  src/device/download.cpp
  src/offload/param_store.cpp
  src/offload/grad_store.cpp
  src/zero/step_during_backward.cpp
  src/zero/host_grad_partition.cpp
  src/zero/grad_partition.cpp
  src/comm/quantize.cpp
  src/zero/flat_grad_reducer.cpp
  src/zero/stage3/stage3.cpp
  src/zero/stage3/unit_gatherer.cpp
  src/zero/stage3/unit_gradients.cpp
  src/zero/stage3/quantized_gather.cpp
  src/optim/device_adam.cpp
  src/optim/fused_adam.cpp
  src/zero/shard_optimizer.cpp
  src/zero/tensor_facts.cpp
  src/activation/checkpoint_function.cpp
  src/activation/rng_state.cpp
  src/activation/autocast_state.cpp
  src/util/allocation_meter.cpp
  src/monitor/wall_clock.cpp
  src/monitor/flops_profiler.cpp
  src/monitor/flop_formulas.cpp
  examples/gpt/model.cpp
  examples/gpt/tp_model.cpp
  tests/gpu/gpu_training_test.cpp
  tests/gpu/activation_checkpointing_gpu_test.cpp
  tests/gpu/flops_profiler_gpu_test.cpp
  tests/support/ranks.cpp
  tests/unit/device_test.cpp
  tests/unit/out_of_memory_test.cpp
  tests/dist/comm_test.cpp
  tests/dist/deferred_init_test.cpp
  bench/transfer.cpp
)
# --all: every C++ source of the tree (about 270 files, ~25 min on 2 cores; too long for CI): what
# to run before a GPU session, so that its build finds no 2.x incompatibility.
if [ "${1:-}" = "--all" ]; then
  mapfile -t FILES < <(find src tests examples bench tools -name '*.cpp' | sort)
fi
echo "check-cuda-sources: ${#FILES[@]} files against libtorch 2.11 / CUDA 13 / NCCL headers"
# The compile definitions CMake gives some targets (examples/gpt, tests/support).
FLAGS=(-DDS_WITH_CUDA=1 -DFMT_HEADER_ONLY=1 '-DDS_DEFAULT_TEXT="data/fortunes.txt"'
       "-DDS_TEST_SOURCE_DIR=\"$PWD\"" -I include -I src -I tests -I examples -I tools/dsrun)
# The first file alone (it unpacks the headers once), then the rest on every core: each file is a
# separate ~10 s g++ run, so this part of CI scales with the cores.
bash "$CHECK" "${FLAGS[@]}" "${FILES[0]}"
printf '%s\n' "${FILES[@]:1}" | xargs -P "$(nproc)" -n 2 bash "$CHECK" "${FLAGS[@]}"
echo "check-cuda-sources: ok"
