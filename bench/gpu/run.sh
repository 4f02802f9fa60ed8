#!/bin/bash
# The GPU benchmark and tests on the GPU machine (docs/gpu.md, docs/benchmarks.md), with the peers
# (PyTorch, DeepSpeed 0.14.5, from gpu-anchor copied to .gpu/) run in the same call on the same GPT.
#   STEPS="build test bench" bash bench/gpu/run.sh
#   build   configure + build this tree against the torch wheel's CUDA libtorch in /tmp/dsb
#   test    ctest -L gpu, -L unit, -L dist (TEST_LABELS to choose; CAP_TEST seconds each, CAP_GPU_TEST
#           for all the GPU tests; from a pack, one process per test suite: run_gpu_suites);
#           TEST_BESIDE="unit dist" runs those labels from a pack of every program on the CPU
#           cores while the GPU tests run (CAP_BESIDE in all)
#   pack    the built programs into $OUT/dsb.tgz; carried back as .gpu-build/dsb.tgz, a later call
#           on a fresh machine unpacks them instead of building (see pack() below)
#   bench   rows: deepspeed.cpp (gpt_train) and the peers at the gpu-anchor GPT (BENCH_SHAPE)
#   ROWS    which rows (default below); ours: dscpp_z0 dscpp_z1 dscpp_z2 dscpp_z3 dscpp_z2_off dscpp_z3_off
#           dscpp_z2_off (overlap_forward: the CPU Adam's last ranges run into the next forward);
#           dscpp_z2_off_bwd (overlap_forward false: the update during backward only, waited for
#           at the step); dscpp_z2_off_serial (overlap_step false: the CPU Adam after backward);
#           dscpp_z2_wcb dscpp_z2_off_wcb dscpp_z2_off_serial_wcb: the same with the engine's
#           timers printed every step (wall_clock_breakdown; they synchronize: diagnostics);
#           dscpp_z2_tadam: dscpp_z2 with libtorch's fused Adam on a widened gradient copy
#           (DS_DEVICE_ADAM=libtorch) instead of this library's kernel, what it bought;
#           dscpp_z2_off_lowp: dscpp_z2_off with bf16.bf16_master_weights_and_grads (a bf16 host
#           copy of the masters: 10 host bytes a parameter for the optimizer instead of 12);
#           dscpp_z2_lowp: dscpp_z2 with bf16 masters and bf16_optimizer_states (the partition
#           is the master: 4 GPU bytes instead of 12); LOWP=fp32_moments|bf16_moments in the
#           environment gives every row of ours those keys where initialize() accepts them
#           (stage 1-3; fp32_moments with the optimizer offloaded), e.g. with STEPS=largest
#   seed003 seed 003's setting into $OUT/seed003: GPU capped at 24 GiB, GPT-2-XL shape (48 layers,
#           d 1600, 25 heads), micro-batch 16 of 128 tokens: ZeRO-3 and ZeRO-2 with CPU offload
#           beside DeepSpeed's, stage 0 / PyTorch at micro-batch 16 and 1 (expected: out of memory)
#   largest the largest model with ZeRO-2 + CPU offload into $OUT/largest (BIG_LAYERS x BIG_D,
#           default 50 x 3584 = 7.89B, the goal is >= 7.7B; activation checkpointing, micro-batch
#           BIG_MB=8); DeepSpeed's largest was 5.1B at 104 GiB host RSS (gpu-anchor), not rerun:
#           at ~20 B/param it would exhaust the host
#   Shapes: LAYERS D HEADS MB CTX; MEMCAP caps the GPU (GiB) for every row; CKPT=1 checkpoints
#           activations in our rows; FLOORS=0 skips the floors.
# One device call runs at most 10 minutes and a session has 15 in all: build the pack on the CPU
# machine first (bench/gpu/cross_pack.sh), give each call a BUDGET_S, keep each peer in its row's
# call; docs/gpu.md "Still to run" has the calls. /tmp/dsb stays only while the machine is warm.
# Prints a table last (bench/gpu/table.py: every row beside its peer, the goal, the floors measured
# in the same call); logs under $OUT.
set -u
START=$(date +%s); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# DSB: the build folder, /tmp/dsb (the programs' RUNPATH and the pack's layout name it); another
# only for tests/tools/gpu_run.sh, which runs this script with stand-in programs.
ROOT=$PWD; G=$ROOT/.gpu; B=${DSB:-/tmp/dsb}; JIT_DONE=$B.jit_done
STEPS=${STEPS:-"build test bench"}
ROWS=${ROWS:-"torch dscpp_z2 ds_z2 dscpp_z2_off dscpp_z2_off_bwd dscpp_z2_off_serial ds_z2_off dscpp_z3_off ds_z3_off"}
LAYERS=${LAYERS:-24}; D=${D:-2048}; HEADS=${HEADS:-16}; MB=${MB:-8}; CTX=${CTX:-1024}
BSTEPS=${BSTEPS:-5}; WARM=${WARM:-2}; CAP_TEST=${CAP_TEST:-150}; ROW_CAP=${ROW_CAP:-150}
GPU_TEST_PROGRAMS="gpu_training_test device_adam_gpu_test onebit_gpu_test pipeline_gpu_test activation_checkpointing_gpu_test flops_profiler_gpu_test"  # tests/gpu
# On this machine a GPU test that skips for want of a GPU fails instead (tests/support/gpu_skip.h):
# a skip here would mean the CUDA path went untested. NCCL says why when a collective fails.
export DS_EXPECT_GPU=1 NCCL_DEBUG=${NCCL_DEBUG:-WARN}
# The GPU tests' environment (as tests/CMakeLists.txt gives ctest's): libtorch reads
# CUBLAS_WORKSPACE_CONFIG once, at the first cuBLAS call, so the deterministic tests need it from
# the start. Not exported: the benchmark rows keep cuBLAS's default workspace.
GPU_TEST_ENV=("DS_BIN_DIR=$B/bin" "DS_SOURCE_DIR=$ROOT" OMP_NUM_THREADS=1 CUBLAS_WORKSPACE_CONFIG=:4096:8)
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
PY=$(command -v python3)
TORCH_DIR=$($PY -c 'import torch, os; print(os.path.dirname(torch.__file__))')
NV_LIB=$($PY -c 'import nvidia, os; p=os.path.join(list(nvidia.__path__)[0], "cu13", "lib"); print(p if os.path.isdir(p) else "")' 2>/dev/null)
[ -n "$NV_LIB" ] && export LD_LIBRARY_PATH=$NV_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
NVCC=$(command -v nvcc); export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "${NVCC:-/usr/local/cuda/bin/nvcc}")")}
export TORCH_CUDA_ARCH_LIST=9.0
log() { echo "[$(( $(date +%s) - START ))s] $*" | tee -a "$OUT/summary.txt"; }
# BUDGET_S: this call's seconds (set it below the device call's timeout_s). Every test run and row
# is cut to what is left, less 20 s for the table and the archive, and a row that would have less
# than MIN_ROW_S is skipped, saying so: a call stopped by the device tool's limit would bring back
# only 8 loose files and no table.
BUDGET_S=${BUDGET_S:-0}
left() { if [ "$BUDGET_S" -gt 0 ]; then echo $(( BUDGET_S - 20 - ($(date +%s) - START) )); else echo 99999; fi; }
cap() { local l; l=$(left); if [ "$l" -lt "$1" ]; then echo $(( l > 1 ? l : 1 )); else echo "$1"; fi; }

build() {
  BUILD_TRIED=1
  rm -f $B/cross_built  # what this builds is the device's own
  log "configure against $TORCH_DIR"
  # Unity batches, as `make` builds and as scripts/check-cuda-sources.sh checks them here.
  cmake -S "$ROOT" -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DTORCH_DIR="$TORCH_DIR" -DDS_UNITY_BUILD=ON \
    -DDS_GLOO_INCLUDE_DIR=$G/deps/gloo-src -DURING_INCLUDE_DIR=$G/deps/usr/include \
    -DURING_LIBRARY=$G/deps/usr/lib/x86_64-linux-gnu/liburing.a -DCMAKE_CUDA_COMPILER=$(command -v nvcc) \
    -DCUDAToolkit_ROOT=$CUDA_HOME -DCMAKE_POLICY_VERSION_MINIMUM=3.5 > "$OUT/build.log" 2>&1 || { log "configure failed"; tail -30 "$OUT/build.log"; return 1; }
  # What the configure chose (libtorch, CUDA, NCCL, fmt, protobuf) and any warning: build.log
  # itself may not come back.
  grep -E "^-- (deepspeed.cpp|TensorBoard)|CMake Warning" -A1 "$OUT/build.log" | head -20
  log "build ${BUILD_TARGETS:-all}"
  timeout $(cap ${BUILD_CAP:-330}) ninja -C $B -j16 -k 0 ${BUILD_TARGETS:-} >> "$OUT/build.log" 2>&1
  log "build rc=$?"; grep -E "error:|undefined reference" "$OUT/build.log" | sort | uniq -c | sort -rn | head -30
}
run_tests() {
  # TEST_BESIDE: CPU-only labels run from a pack of every program while the GPU tests run (they
  # use one core or two of the 16), TEST_J at a time, until CAP_BESIDE; waited for before the
  # next step, so that no benchmark row shares the cores with them.
  local beside_pid=""
  if [ -n "${TEST_BESIDE:-}" ]; then
    if [ -f $B/cross_built ] && [ ! -f $B/build.ninja ]; then
      local deadline=$(( $(date +%s) + $(cap ${CAP_BESIDE:-${CAP_GPU_TEST:-300}}) ))
      log "-L ${TEST_BESIDE// /, -L } beside the GPU tests (the packed programs, TEST_J=${TEST_J:-12})"
      ( for L in $TEST_BESIDE; do run_unpacked "$L" "$deadline"; done ) &
      beside_pid=$!
    else
      log "TEST_BESIDE needs a pack of every program (ALL=1 bench/gpu/cross_pack.sh): not run"
    fi
  fi
  for L in ${TEST_LABELS:-gpu unit dist}; do
    if [ "$(left)" -lt 30 ]; then log "ctest -L $L skipped: $(left) s left of BUDGET_S"; continue; fi
    # What the label needs, if an earlier call built less (BUILD_TARGETS): ninja is incremental.
    local need=""; [ "$L" = gpu ] && need="$GPU_TEST_PROGRAMS"
    if [ -f $B/build.ninja ]; then
      timeout $(cap ${BUILD_CAP:-330}) ninja -C $B -j16 -k 0 $need >> "$OUT/build.log" 2>&1
      log "build for -L $L rc=$?"
    fi
    log "ctest -L $L"
    if [ ! -f $B/build.ninja ] && [ "$L" = gpu ] && [ -x $B/bin/gpu_training_test ]; then
      run_gpu_suites; continue  # unpacked programs, no ctest files
    fi
    if [ ! -f $B/build.ninja ] && [ -f $B/cross_built ]; then run_unpacked "$L"; continue; fi
    local label_cap=$CAP_TEST; [ "$L" = gpu ] && label_cap=${CAP_GPU_TEST:-300}
    # The gpu tests are RUN_SERIAL (tests/CMakeLists.txt): one process on the GPU at a time.
    (cd $B && timeout $(cap $label_cap) env CUBLAS_WORKSPACE_CONFIG=:4096:8 \
       ctest -L $L -j${TEST_J:-6} --timeout 240 --output-on-failure) > "$OUT/ctest_$L.log" 2>&1
    grep -E "tests passed|tests failed|\((Failed|Timeout|SEGFAULT|Subprocess|Exception|Child)" "$OUT/ctest_$L.log" | head -40
  done
  if [ -n "$beside_pid" ]; then wait $beside_pid; log "the tests beside the GPU tests ended"; fi
}
# The GPU tests from a pack (no ctest files): one process per test suite, so that a hang, a crash,
# a sticky CUDA error or NCCL's watchdog abort costs that suite, not the cases gtest would run
# after it (it runs the TEST_P cases, Stages/OneGpu, after every plain TEST). The core results
# first: the suites of GPU_SUITE_ORDER, then the small programs' (quick), then the rest of
# gpu_training_test's. CAP_GPU_TEST bounds them all together; a suite may take a share of what
# is left (suite_share: half for Stages/OneGpu, the last all, never under MIN_SUITE_S), so one
# that hangs leaves the suites after it their time. A suite that crashed resumes at once, one cut
# at its cap after the others, without the cases it ran (the one it was in is named, not rerun).
# Each run's lines and rc: $OUT/ctest_gpu.log ($OUT/gpu/ one file each); a line a suite and one
# naming the suites that failed, timed out, crashed or did not run: summary.txt.
GPU_SUITE_ORDER="GpuAdamKernel Stages/OneGpu OneGpuOffload OneGpuMemory OneGpuNccl TwoRanksOneGpu"
KERNEL_CASE=GpuAdamKernel.EqualsTheCpuKernelBitForBit  # decides DS_DEVICE_ADAM (run_suite)
suite_share() {  # percent of the time left that suite $1 may take
  case $1 in Stages/OneGpu) echo 50 ;; GpuAdamKernel|OneGpuOffload|OneGpuMemory|OneGpuNccl|TwoRanksOneGpu) echo 35 ;; *) echo 25 ;; esac
}
gpu_listing() {  # program: "suite cases" a line, from gtest's --gtest_list_tests
  (cd $B && timeout 60 env "${GPU_TEST_ENV[@]}" bin/$1 --gtest_list_tests 2> /dev/null) |
    awk '/^[A-Za-z_][A-Za-z0-9_\/]*\.( .*)?$/ { if (s != "") print s, n; s = $1; sub(/\.$/, "", s); n = 0; next }
         /^  [^ ]/ && s != "" { n++ }
         END { if (s != "") print s, n }'
}
run_gpu_suites() {
  local log="$OUT/ctest_gpu.log" dir="$OUT/gpu" end prog s n listing="" i=0
  : > "$log"; mkdir -p "$dir"
  end=$(( $(date +%s) + $(cap ${CAP_GPU_TEST:-300}) ))
  Q_PROG=(); Q_SUITE=(); Q_DONE=(); Q_TRIES=(); SUITES_PASSED=""; SUITES_FAILED=""; SUITES_TIMED_OUT=""
  SUITES_CRASHED=""; SUITES_NOT_RUN=""; declare -gA SUITE_CASES=()
  for prog in $GPU_TEST_PROGRAMS; do
    [ -x $B/bin/$prog ] || { log "$prog not in the pack"; continue; }
    local lines; lines=$(gpu_listing $prog)
    if [ -z "$lines" ]; then log "$prog --gtest_list_tests listed no suite: running it whole"; lines="* 0"; fi
    while read -r s n; do listing="$listing$prog $s"$'\n'; SUITE_CASES[$prog.$s]=$n; done <<< "$lines"
  done
  local t pass
  for t in $GPU_SUITE_ORDER; do
    while read -r prog s; do [ "$s" = "$t" ] && gpu_queue "$prog" "$s"; done <<< "$listing"
  done
  for pass in small rest; do  # the small programs' suites, then gpu_training_test's others
    while read -r prog s; do
      [ -n "$s" ] && [[ " $GPU_SUITE_ORDER " != *" $s "* ]] || continue
      [ $pass = small ] && [ $prog = gpu_training_test ] && continue
      [ $pass = rest ] && [ $prog != gpu_training_test ] && continue
      gpu_queue "$prog" "$s"
    done <<< "$listing"
  done
  while [ $i -lt ${#Q_PROG[@]} ]; do
    run_gpu_suite $i "$end" "$dir" "$log"; i=$((i + 1))
  done
  grep -E "Failure|FAILED  \]|\[  SKIPPED \]" "$log" | head -40
  log "GPU test suites passed:${SUITES_PASSED:- none}${SUITES_FAILED:+; failed:$SUITES_FAILED}${SUITES_TIMED_OUT:+; timed out:$SUITES_TIMED_OUT}${SUITES_CRASHED:+; crashed:$SUITES_CRASHED}${SUITES_NOT_RUN:+; not run (CAP_GPU_TEST, BUDGET_S spent):$SUITES_NOT_RUN}"
}
gpu_queue() { Q_PROG+=("$1"); Q_SUITE+=("$2"); Q_DONE+=(""); Q_TRIES+=(0); }
run_gpu_suite() {  # queue index, end of the test time, log folder, log
  local i=$1 prog=${Q_PROG[$1]} s=${Q_SUITE[$1]} done=${Q_DONE[$1]} left_s c rc f filter status
  local name=$s; [ -n "$done" ] && name="$s(resumed)"
  left_s=$(( $2 - $(date +%s) ))
  if [ $left_s -lt 5 ]; then SUITES_NOT_RUN="$SUITES_NOT_RUN $name"; log "gpu $prog $name: not run, ${left_s}s left"; return; fi
  c=$(( left_s * $(suite_share "$s") / 100 ))
  [ $i -eq $(( ${#Q_PROG[@]} - 1 )) ] && c=$left_s
  [ $c -lt ${MIN_SUITE_S:-20} ] && c=${MIN_SUITE_S:-20}
  [ $c -gt $left_s ] && c=$left_s
  filter="$s.*"; [ "$s" = "*" ] && filter="*"
  [ -n "$done" ] && filter="$filter-${done#:}"
  f="$3/$i.$prog.${s//[\/*]/_}.log"
  (cd $B && timeout -k 10 $c env "${GPU_TEST_ENV[@]}" bin/$prog "--gtest_filter=$filter") > "$f" 2>&1
  rc=$?
  { echo "=== $prog --gtest_filter=$filter, cap ${c}s: rc=$rc"; cat "$f"; echo; } >> "$4"
  # Per case: "[ RUN      ] S.C" at its start, "[       OK ] S.C (N ms)" (FAILED, SKIPPED; a
  # TEST_P's FAILED line adds ", where GetParam() = ...") at its end.
  local ran ended ok failed skipped cut
  ran=$(sed -n 's/^\[ RUN      \] //p' "$f")
  ended=$(sed -nE 's/^\[ +(OK|FAILED|SKIPPED) +\] ([^ ,]+)(,| ).*\([0-9]+ ms\)$/\2/p' "$f")
  ok=$(grep -cE '^\[       OK \] .* \([0-9]+ ms\)$' "$f"); failed=$(grep -cE '^\[  FAILED  \] .* \([0-9]+ ms\)$' "$f")
  skipped=$(grep -cE '^\[  SKIPPED \] .* \([0-9]+ ms\)$' "$f")
  cut=$(comm -23 <(echo "$ran" | sort) <(echo "$ended" | sort) | head -1)
  if [ $rc = 124 ] || [ $rc = 137 ]; then status="timed out at its cap, ${c}s"; SUITES_TIMED_OUT="$SUITES_TIMED_OUT $name"
  elif ! grep -qE '^\[==========\] [0-9]+ tests? from .* ran\.' "$f"; then status="crashed (rc=$rc)"; SUITES_CRASHED="$SUITES_CRASHED $name"
  elif [ $((ok + failed + skipped)) = 0 ]; then status="ran no case (rc=$rc)"; SUITES_FAILED="$SUITES_FAILED $name"
  elif [ $rc = 0 ]; then status=passed; SUITES_PASSED="$SUITES_PASSED $name"
  else status="failed (rc=$rc)"; SUITES_FAILED="$SUITES_FAILED $name"; fi
  log "gpu $prog $name: $status; $ok passed, $failed failed, $skipped skipped${cut:+; stopped in $cut}"
  # Every other GPU test and every row of ours steps through the GPU Adam kernel: if its own case
  # (the kernel against the CPU kernel, bit for bit; the suite's first) did not pass, the rest of
  # the call runs with libtorch's fused Adam, saying so, rather than lose the call (and the
  # session's device time) to one kernel. Only that case decides: another case of the suite
  # failing (libtorch's kernel within a tolerance, a training comparison) or the suite cut at its
  # cap after it says nothing against the kernel. A caller's DS_DEVICE_ADAM stands.
  if [ "$s" = GpuAdamKernel ] &&
     grep -qE "^\[ +(OK|SKIPPED) +\] $KERNEL_CASE \(" "$f"; then KERNEL_CASE_PASSED=1; fi
  if [ "$s" = GpuAdamKernel ] && [ -z "${KERNEL_CASE_PASSED:-}" ] && [ -z "${DS_DEVICE_ADAM:-}" ]; then
    export DS_DEVICE_ADAM=libtorch; GPU_TEST_ENV+=(DS_DEVICE_ADAM=libtorch)
    log "GpuAdamKernel $status, $KERNEL_CASE not passed: the rest of this call runs with DS_DEVICE_ADAM=libtorch (libtorch's fused Adam on a widened gradient copy; dscpp_z2 is then dscpp_z2_tadam)"
  fi
  # The cases not reached run again, after the others when this one was cut at its cap.
  case $status in timed*|crashed*) ;; *) return ;; esac
  local started; started=$(( $(echo "$done" | tr ':' '\n' | grep -c .) + $(echo "$ran" | grep -c .) ))
  [ "$s" != "*" ] && [ -n "$ran" ] && [ $started -lt "${SUITE_CASES[$prog.$s]:-0}" ] && [ ${Q_TRIES[$i]} -lt 3 ] || return
  local at=$(( i + 1 )); [[ $status == timed* ]] && at=${#Q_PROG[@]}
  Q_PROG=("${Q_PROG[@]:0:at}" "$prog" "${Q_PROG[@]:at}"); Q_SUITE=("${Q_SUITE[@]:0:at}" "$s" "${Q_SUITE[@]:at}")
  Q_DONE=("${Q_DONE[@]:0:at}" "$done:$(echo "$ran" | paste -sd:)" "${Q_DONE[@]:at}")
  Q_TRIES=("${Q_TRIES[@]:0:at}" $(( ${Q_TRIES[$i]} + 1 )) "${Q_TRIES[@]:at}")
}
# A label's tests from a pack (ALL=1 bench/gpu/cross_pack.sh), without ctest's files: each test
# file as ctest would run it (tests/CMakeLists.txt: bin/<label>_tests with the file's suites as
# the filter, listed in bin/<label>_tests.files; the CPU path, Gloo), TEST_J at a time, each under
# CAP_TEST, none started after the deadline $2 (epoch seconds; "not-run" in the results) nor run
# past it. Logs in $OUT/<label>/.
run_unpacked() {
  local L=$1 dir="$OUT/$1" list="$B/bin/$1_tests.files" each deadline
  mkdir -p "$dir"; : > "$dir/results"
  if [ ! -f "$list" ] || [ ! -x "$B/bin/$1_tests" ]; then
    log "-L $L: bin/$1_tests or its .files listing is not in the pack"; return
  fi
  each=$(cap $CAP_TEST); deadline=${2:-$(( $(date +%s) + $(cap 99999) ))}
  xargs -P "${TEST_J:-12}" -n 2 bash -c "
    t=\$(( $deadline - \$(date +%s) )); [ \$t -gt $each ] && t=$each
    if [ \$t -lt 1 ]; then echo \"\$0 rc=not-run\" >> $dir/results; exit 0; fi
    cd $B && timeout \$t env DS_BIN_DIR=$B/bin DS_SOURCE_DIR=$ROOT OMP_NUM_THREADS=1 DS_DEVICE=cpu \
      DS_COMM_BACKEND=gloo bin/${L}_tests \"--gtest_filter=\$1\" > $dir/\$0.log 2>&1
    echo \"\$0 rc=\$?\" >> $dir/results" < "$list"
  local bad; bad=$(grep -v ' rc=0$' "$dir/results" | tr '\n' ' ')
  log "-L $L, the packed programs: $(grep -c ' rc=0$' "$dir/results") of $(wc -l < "$list") passed${bad:+; not: $bad}"
  for t in $(grep -v ' rc=0$' "$dir/results" | cut -d' ' -f1); do
    grep -E "Failure|FAILED  \]|error" "$dir/$t.log" 2> /dev/null | head -4
  done
}
ds_config() {  # stage, offload
  local z="\"stage\": $1, \"overlap_comm\": true, \"reduce_bucket_size\": 500000000"
  case $2 in
    opt) z="$z, \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true, \"overlap_forward\": true}" ;;
    opt_bwd) z="$z, \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}" ;;
    opt_serial) z="$z, \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true, \"overlap_step\": false}" ;;
    param_opt) z="$z, \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}, \"offload_param\": {\"device\": \"cpu\", \"pin_memory\": true}, \"stage3_max_live_parameters\": 1000000000, \"stage3_prefetch_bucket_size\": 50000000" ;;
  esac
  # LOWP: DeepSpeed's low-precision masters (docs/config.md): "fp32_moments" (bf16 masters, the
  # CPU Adam's fp32 moments: with offload) or "bf16_moments" (+ bf16_optimizer_states).
  local bf16='"enabled": true' lowp=${LOWP:-}
  # initialize() refuses the keys at stage 0, and fp32 moments without an offloaded optimizer:
  # such a row runs without them, saying so, instead of failing.
  if [ -n "$lowp" ] && { [ "$1" = 0 ] || { [ "$lowp" = fp32_moments ] && [ "$2" = none ]; }; }; then
    echo "run.sh: LOWP=$lowp does not apply at stage $1 with offload '$2': not set for this row" >&2
    lowp=""
  fi
  case $lowp in
    fp32_moments) bf16="$bf16, \"bf16_master_weights_and_grads\": true" ;;
    bf16_moments)
      bf16="$bf16, \"bf16_master_weights_and_grads\": true, \"bf16_optimizer_states\": true" ;;
  esac
  cat <<JSON
{"train_micro_batch_size_per_gpu": $MB, "gradient_accumulation_steps": 1, "bf16": {$bf16},
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
 "steps_per_print": $( [ "${WCB:-0}" = 1 ] && echo 1 || echo 1000000000 ), "zero_optimization": {$z}}
JSON
}
row_ours() {  # name stage offload
  ds_config $2 $3 > /tmp/$1.json
  local extra=""
  [ -n "${MEMCAP:-}" ] && extra="$extra --gpu_mem_cap_gib $MEMCAP"
  [ "${CKPT:-0}" = 1 ] && extra="$extra --activation_checkpointing"
  # A *_wcb row: the engine's timers (fwd, bwd, bwd_inner, bwd_allreduce, step) printed every
  # step; each synchronizes the device, so the row is a diagnostic beside the untimed one.
  [ "${WCB:-0}" = 1 ] && extra="$extra --wall_clock_breakdown"
  local row_cap; row_cap=$(cap $ROW_CAP)
  # gpt_bench.py's GPT: its shape and its init (GPT-2's scaled std for the residual projections).
  env OMP_NUM_THREADS=${OMP_THREADS:-16} timeout $row_cap $B/bin/gpt_train --deepspeed_config /tmp/$1.json --device cuda \
    --random_tokens --vocab_size 50304 --block_size $CTX --n_layer $LAYERS --n_embd $D --n_head $HEADS \
    --no_bias --tie_embeddings --gelu_tanh --scaled_residual_init --steps $((BSTEPS + WARM)) --warmup $WARM --threads ${OMP_THREADS:-16} $extra > "$OUT/$1.log" 2>&1
  local rc=$?
  [ $rc = 124 ] && echo "gpt_train: error: timed out after ${row_cap}s (ROW_CAP, BUDGET_S)" >> "$OUT/$1.log"
  log "row $1 rc=$rc: $(grep -E 'gpt_train: done|GPU memory' "$OUT/$1.log" | tr '\n' ' ')"
  # After GpuAdamKernel failed (run_gpu_suite), every row of ours ran libtorch's Adam: said per row.
  [ -n "${DS_DEVICE_ADAM:-}" ] && log "row $1 ran with DS_DEVICE_ADAM=$DS_DEVICE_ADAM"
  [ "${WCB:-0}" = 1 ] && grep -F "time (ms)" "$OUT/$1.log" | tail -2 | tee -a "$OUT/summary.txt"
  # A warning may mean the row measured another step than its name says (overlap_forward
  # ignored, say): shown with the errors.
  grep -E "error|warning" "$OUT/$1.log" | head -4
}
row_peer() {
  export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((29500 + RANDOM % 1000))
  local PP=""; [[ $1 == ds_* ]] && PP=$G/ds:$G/pylib/usr/lib/python3/dist-packages:$G/pylib
  # DeepSpeed 0.14.5 imports distutils, gone from Python 3.12: gpu-anchor's shim, as its driver does.
  [[ $1 == ds_* ]] && ! $PY -c 'import distutils.spawn' 2>/dev/null && PP=$PP:$G/pycompat
  # DeepSpeed's ZeRO-3 as its users run a model this size: built under deepspeed.zero.Init, not
  # whole in fp32 on the GPU first (that transient copy would count in its whole-run GPU peak, the
  # figure table.py compares). Ours moves one unit at a time there at initialize() (stage 3 never
  # holds the whole model: docs/gpu.md), built whole in host memory.
  local extra=""; [[ $1 == ds_z3* ]] && extra="--zero_init"
  # The same intra-op threads as our rows (the CPU Adam of the offload rows, the host-side ops).
  local row_cap; row_cap=$(cap $ROW_CAP)
  env OMP_NUM_THREADS=${OMP_THREADS:-16} PYTHONPATH=$PP TORCH_EXTENSIONS_DIR=/tmp/ds_ext DS_ACCELERATOR=cuda PYTHONUNBUFFERED=1 \
    timeout $row_cap $PY $G/bench/gpt_bench.py --row $1 \
    --layers $LAYERS --d $D --heads $HEADS --mb $MB --ctx $CTX --warmup $WARM --steps $BSTEPS $extra \
    ${MEMCAP:+--mem_cap_gib $MEMCAP} --out "$OUT/peers.jsonl" > "$OUT/$1.log" 2>&1
  local rc=$?
  # Killed at its cap, gpt_bench.py writes no line: the table says so instead of "no result".
  [ $rc = 124 ] && printf '{"row": "%s", "ok": false, "error": "timed out after %ss (ROW_CAP, BUDGET_S)"}\n' \
    "$1" "$row_cap" >> "$OUT/peers.jsonl"
  log "row $1 rc=$rc: $(grep RESULT "$OUT/$1.log" | cut -c1-400)"
}
# DeepSpeed's cpu_adam JIT (~50 s, as gpu-anchor's driver builds it), started as early as the
# call knows an offload row of DeepSpeed's will run: it builds while the GPU tests run. A marker
# file, not a pid, says it is done: seed003 waits for it from a subshell.
start_jit() {
  [ -f $JIT_DONE ] || [ -n "${JIT_STARTED:-}" ] && return 0
  JIT_STARTED=1; mkdir -p "$OUT/jit"
  # In a session of its own, so that the end of the call can stop it and all it started (a JIT
  # still running would change files under $OUT while they are archived).
  setsid bash -c "STEPS=none FORCE_JIT=1 OUT=$OUT/jit bash $G/run_device.sh; touch '$JIT_DONE'" \
    > /dev/null 2>&1 < /dev/null &
  JIT_PID=$!
  log "cpu_adam JIT started in the background"
}
stop_jit() {
  if [ -n "${JIT_PID:-}" ] && [ ! -f $JIT_DONE ]; then
    kill -- -"$JIT_PID" 2> /dev/null; log "stopped the unfinished cpu_adam JIT"
  fi
}
wait_jit() {
  [ -n "${JIT_STARTED:-}" ] || return 0
  local waited=0 most; most=$(cap 180)
  while [ ! -f $JIT_DONE ] && [ $waited -lt "$most" ]; do sleep 1; waited=$((waited + 1)); done
  [ $waited -gt 0 ] && log "waited ${waited}s for the cpu_adam JIT"
  return 0
}
floors() {  # what bounds an offloaded step, measured in this call: host memory and copy bandwidth
  wait_jit  # not beside DeepSpeed's cpu_adam JIT (started at the top of the call), on the same cores
  if [ "$(left)" -lt 120 ]; then log "floors skipped: $(left) s left of BUDGET_S"; return; fi
  log "floors: bench_cpu_adam, bench_transfer"
  OMP_NUM_THREADS=${OMP_THREADS:-16} timeout $(cap 120) $B/bin/bench_cpu_adam 27 3 > "$OUT/cpu_adam.log" 2>&1
  timeout $(cap 60) $B/bin/bench_transfer 1024 5 > "$OUT/transfer.log" 2>&1
  grep -E "^memory bandwidth|transfer_report" "$OUT/cpu_adam.log" "$OUT/transfer.log" | tee -a "$OUT/summary.txt"
}
bench() {
  [[ "$ROWS" == *_off* && "${FLOORS:-1}" = 1 ]] && floors
  [[ "$ROWS" == *ds_*off* ]] && start_jit
  for r in $ROWS; do
    # Our rows and DeepSpeed's offload rows run with no compiler beside them: the CPU Adam (and
    # the thread launching kernels) would share the cores with the cpu_adam JIT build.
    if [[ $r == dscpp_* || $r == ds_*off ]]; then wait_jit; fi
    if [ "$(left)" -lt "${MIN_ROW_S:-60}" ]; then
      echo "$r $(left) s left of BUDGET_S" >> "$OUT/skipped.txt"; log "row $r skipped: $(left) s left of BUDGET_S"; continue
    fi
    case $r in
      dscpp_z0) row_ours $r 0 none ;; dscpp_z1) row_ours $r 1 none ;; dscpp_z2) row_ours $r 2 none ;;
      dscpp_z3) row_ours $r 3 none ;; dscpp_z2_off) row_ours $r 2 opt ;;
      dscpp_z3_off) row_ours $r 3 param_opt ;;
      dscpp_z2_off_serial) row_ours $r 2 opt_serial ;;  # the CPU Adam after backward
      dscpp_z2_off_bwd) row_ours $r 2 opt_bwd ;;  # during backward only, waited for at the step
      dscpp_z2_wcb) WCB=1 row_ours $r 2 none ;; dscpp_z2_off_wcb) WCB=1 row_ours $r 2 opt ;;
      dscpp_z2_tadam) DS_DEVICE_ADAM=libtorch row_ours $r 2 none ;;  # libtorch's fused Adam
      dscpp_z2_off_serial_wcb) WCB=1 row_ours $r 2 opt_serial ;;
      dscpp_z2_off_lowp) LOWP=fp32_moments row_ours $r 2 opt ;;  # bf16 masters, host copy
      dscpp_z2_lowp) LOWP=bf16_moments row_ours $r 2 none ;;  # bf16 masters and moments on the GPU
      ds_*off) row_peer $r ;;
      *) row_peer $r ;;
    esac
  done
  # Appended: a step before this one (seed003, largest) may have put its tables there already.
  MEMCAP=${MEMCAP:-} $PY "$ROOT/bench/gpu/table.py" "$OUT" $ROWS | tee -a "$OUT/table.md"
}
# A step's tables and summary lines (written under $OUT/<step>/ and below), added to the call's:
# the end of the call archives and removes everything but $OUT's own summary.txt and table.md.
keep_step_results() {  # the step's folder under $OUT
  local d
  for d in "$OUT/$1" "$OUT/$1"/*/; do
    d=${d%/}
    [ -f "$d/table.md" ] && { echo; echo "## ${d#"$OUT"/}"; cat "$d/table.md"; } >> "$OUT/table.md"
    [ -f "$d/summary.txt" ] && sed "s|^|${d#"$OUT"/}: |" "$d/summary.txt" >> "$OUT/summary.txt"
  done
  return 0
}
seed003() {  # in a subshell: its shape and OUT stay there
  ( OUT=$OUT/seed003; mkdir -p "$OUT"; FLOORS=0 MEMCAP=24 LAYERS=48 D=1600 HEADS=25 MB=16 CTX=128
    log "seed 003: 24 GiB cap, 48 x 1600, micro-batch 16 x 128"
    ROWS="dscpp_z3_off ds_z3_off dscpp_z2_off ds_z2_off dscpp_z0 torch" bench
    OUT=$OUT/mb1; mkdir -p "$OUT"; MB=1; log "seed 003 at micro-batch 1"
    ROWS="dscpp_z0 torch" bench )
  keep_step_results seed003
}
largest() {
  ( OUT=$OUT/largest; mkdir -p "$OUT"; LAYERS=${BIG_LAYERS:-50} D=${BIG_D:-3584} HEADS=${BIG_HEADS:-28}
    MB=${BIG_MB:-8} CKPT=1 FLOORS=0; export SIZE_GOAL=7.7e9 BSTEPS=${BIG_STEPS:-3} ROW_CAP=${BIG_CAP:-420}
    log "largest: $LAYERS x $D, micro-batch $MB, activation checkpointing"
    ROWS="dscpp_z2_off" bench )
  keep_step_results largest
}
# backtrace: BT_TESTS ("label:gtest_filter" each) under cuda-gdb (the machine has no gdb; it
# debugs host code too), BT_J at a time, CAP_BT each: where a test that crashed on the wheel
# (rc=139 in a label's results) crashes, as the backtrace of the thread that took the signal.
# Logs in $OUT/bt/, the top frames of each in summary.txt.
backtraces() {
  local dir="$OUT/bt" gdb; gdb=$(command -v cuda-gdb || echo /usr/local/cuda/bin/cuda-gdb)
  mkdir -p "$dir"
  [ -x "$gdb" ] || { log "backtrace: no cuda-gdb"; return; }
  log "backtrace: ${BT_TESTS:-none}"
  printf '%s\n' ${BT_TESTS:-} | xargs -P "${BT_J:-8}" -I{} bash -c "
    spec={}; label=\${spec%%:*}; filter=\${spec#*:}; f=$dir/\$(echo \"\$filter\" | tr -c 'A-Za-z0-9_.\n-' _).log
    cd $B && timeout $(cap ${CAP_BT:-120}) env DS_BIN_DIR=$B/bin DS_SOURCE_DIR=$ROOT OMP_NUM_THREADS=1 DS_DEVICE=cpu \
      DS_COMM_BACKEND=gloo $gdb -batch -ex 'set pagination off' -ex 'handle SIGPIPE nostop noprint pass' \
      -ex run -ex 'bt 30' -ex 'info threads' --args bin/\${label}_tests --gtest_filter=\$filter > \$f 2>&1
    echo \"== \$filter: \$(grep -m1 -E 'received signal|exited' \$f)\" >> $dir/summary
    grep -E '^#[0-9]+ ' \$f | head -14 | cut -c1-240 >> $dir/summary"
  cat "$dir/summary" >> "$OUT/summary.txt" 2> /dev/null
}
# The machine goes back after ~30 s idle, and /tmp/dsb with it: a step that finds no build makes
# what it needs first (the benchmark steps only gpt_train and the two floor programs).
ensure_built() {  # the programs a step runs (none named: everything, with ctest's files)
  local missing=""; for t in ${*:-gpt_train}; do [ -x $B/bin/$t ] || missing="$missing $t"; done
  [ -z "$missing" ] && { [ $# -gt 0 ] || [ -f $B/build.ninja ]; } && return 0
  [ -n "${BUILD_TRIED:-}" ] && return 0  # this call built already (and failed): not twice
  if [ -f $B/build.ninja ] && [ $# -gt 0 ]; then
    log "building$missing"; timeout $(cap ${BUILD_CAP:-330}) ninja -C $B -j16 $missing >> "$OUT/build.log" 2>&1
    return 0
  fi
  # A fresh machine (or cross-built programs that did not load): a step that names programs gets
  # every program of the pack, so that the later steps and `pack` find theirs.
  local targets; targets=$(for f in $PACKED; do case $f in bin/*) printf '%s ' "${f#bin/}" ;; esac; done)
  log "no build in $B: building ${*:+$targets}${*:-all}"
  if [ $# -gt 0 ]; then BUILD_TARGETS="$targets" build; else BUILD_TARGETS="" build; fi
}
# pack: the built programs (and DeepSpeed's JIT-built cpu_adam) into $OUT/dsb.tgz, ~10 MB. Bring
# it back, copy it to .gpu-build/dsb.tgz (ignored) and carry .gpu-build: a later call on a fresh
# machine unpacks it into /tmp/dsb instead of building again (bench/gpu/pack.sh; a pack is used
# only for the sources it was built from). bench/gpu/cross_pack.sh builds the same pack on the
# CPU machine, so that even the first call needs no build.
source "$ROOT/bench/gpu/pack.sh"
pack() {  # DeepSpeed's JIT folder only when complete (a half-built one holds a lock that hangs)
  wait_jit
  local jit=ds_ext; [ -n "${JIT_STARTED:-}" ] && [ ! -f $JIT_DONE ] && jit=""
  local have; have=$(pack_build "$ROOT" $B "$OUT/dsb.tgz" $jit) && log "packed:$have $(du -h "$OUT/dsb.tgz" | cut -f1)"
}
# A cross-built pack (bench/gpu/cross_pack.sh) was linked against stub libraries in
# /tmp/torch211/lib, its RUNPATH: that folder becomes the wheel's torch/lib. Its programs were
# linked with -z now, so a symbol the wheel lacks fails the load here, at once.
use_cross_built() {
  mkdir -p /tmp/torch211 && ln -sfn "$TORCH_DIR/lib" /tmp/torch211/lib
  local p err
  for p in "gpt_train --help" "gpu_training_test --gtest_list_tests"; do
    if ! err=$(timeout 60 $B/bin/$p 2>&1 > /dev/null); then
      log "the cross-built $p does not run here: $(echo "$err" | head -3 | cut -c1-300); building instead"
      rm -rf $B; return 1
    fi
  done
  log "the cross-built programs load against $TORCH_DIR/lib ($(head -1 $B/cross_built))"
}
if [ -f "$ROOT/.gpu-build/dsb.tgz" ] && [ ! -x $B/bin/gpt_train ] && [ ! -f $B/build.ninja ]; then
  packed_stamp=$(tar xzf "$ROOT/.gpu-build/dsb.tgz" -O dsb/source.stamp 2>/dev/null)
  if [ "$packed_stamp" = "$(source_stamp "$ROOT")" ]; then
    tar xzf "$ROOT/.gpu-build/dsb.tgz" -C /tmp && log "unpacked .gpu-build/dsb.tgz into $B (and /tmp/ds_ext)"
    [ -f $B/cross_built ] && use_cross_built
  else
    log "the pack in .gpu-build was built from other sources: building again"
    mkdir -p /tmp/ds_ext && tar xzf "$ROOT/.gpu-build/dsb.tgz" -C /tmp ds_ext 2>/dev/null  # DeepSpeed's JIT is still good
  fi
fi
# The kit's DeepSpeed tree holds its three symbolic links (deepspeed/accelerator, ops/op_builder,
# ops/csrc) as small files naming the target (as git writes a link where links are not kept):
# DeepSpeed then fails to import deepspeed.accelerator. Each becomes a copy of its target.
repair_kit_links() {
  local f t
  for f in $(find "$G/ds" -type f -size -100c 2> /dev/null); do
    t=$(head -c 100 "$f"); [[ $t == ../* ]] && [ -d "$(dirname "$f")/$t" ] || continue
    rm -f "$f" && cp -r "$(dirname "$f")/$t" "${f%/}" && log "kit: $f, a link kept as a file, is now a copy of $t"
  done
}
[ -d "$G/ds" ] && repair_kit_links
[[ " $STEPS " == *" seed003 "* || ( " $STEPS " == *" bench "* && "$ROWS" == *ds_*off* ) ]] && start_jit
for s in $STEPS; do
  case $s in
    build) build ;;
    pack) pack ;;
    test) if [ "${TEST_LABELS:-}" = gpu ]; then ensure_built $GPU_TEST_PROGRAMS
          elif [ -f $B/cross_built ] && [ -x $B/bin/dsrun ]; then :  # every program packed (ALL=1)
          else ensure_built; fi
          run_tests ;;
    bench|seed003|largest) ensure_built gpt_train bench_cpu_adam bench_transfer; $s ;;
    backtrace) backtraces ;;
  esac
done
stop_jit
log "total"
# Every file under $OUT in one archive: the device tool brings back at most 8 files. Kept beside
# it: the summary, the table and the packed build.
tar czf /tmp/run_out.tgz --exclude=./dsb.tgz -C "$OUT" . 2>/dev/null && {
  find "$OUT" -mindepth 1 -maxdepth 1 ! -name summary.txt ! -name table.md ! -name dsb.tgz -exec rm -rf {} +
  mv /tmp/run_out.tgz "$OUT/all.tgz"
}
