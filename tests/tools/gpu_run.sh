#!/bin/bash
# bench/gpu/run.sh's own logic, with stand-in programs and no GPU:
#   1. BUDGET_S: a row that would have less than MIN_ROW_S is skipped and the table says so, the
#      call still ends with its table and archive, and DeepSpeed's cpu_adam JIT, still running,
#      is stopped with everything it started;
#   2. the unit/dist runner for a pack of every program (run_unpacked): each test program runs
#      with the CPU path's environment, and those that fail are named;
#   3. the GPU tests from a pack (run_gpu_suites): one process per suite, the core suites first;
#      one that hangs is cut at its share of CAP_GPU_TEST and the suites after it still run and
#      report, one that crashes resumes without its finished cases; the GPU environment
#      (DS_EXPECT_GPU, CUBLAS_WORKSPACE_CONFIG, NCCL_DEBUG) reaches them;
#   4. the floors wait for DeepSpeed's cpu_adam JIT instead of sharing the cores with it;
#   5. TEST_BESIDE: the CPU labels of a full pack run while the GPU tests run, none started or
#      running past CAP_BESIDE, and the step ends only once they have;
#   6. the kit's DeepSpeed links kept as small files naming their target become copies of it;
#   7. the backtrace step runs each BT_TESTS entry under cuda-gdb and keeps the top frames;
#   8. a GPU Adam kernel whose own case fails turns the rest of the call (the later GPU suites and
#      our rows) to libtorch's fused Adam, DS_DEVICE_ADAM=libtorch, and says so; another case of
#      its suite failing does not;
#   9. seed003's tables and summary reach the call's; out of memory reads "cannot fit", a peer
#      cut at its cap "timed out".
set -u
src=$(cd "$(dirname "$0")/../.." && pwd)
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; for f in "$T"/log*; do echo "== $f"; cat "$f"; done; exit 1; }
root=$T/root; B=$T/dsb
mkdir -p "$root/.gpu/bench" "$root/tests/unit" "$B/bin"
ln -s "$src/bench" "$root/bench"
stand_in() {  # name, body
  printf '#!/bin/bash\n%s\n' "$2" > "$B/bin/$1"; chmod +x "$B/bin/$1"
}

# 1. One peer row runs; the next waits for the JIT until the budget is spent, so it and the row
#    after it are skipped; the JIT (a sleep that outlives the call) is stopped. (run.sh keeps 20 s
#    of BUDGET_S back: 32 leaves 12 for the rows, and the wait lasts that long.)
marker=61.$$
printf 'sleep %s\n' "$marker" > "$root/.gpu/run_device.sh"
printf 'print("RESULT stand-in")\n' > "$root/.gpu/bench/gpt_bench.py"
for p in gpt_train bench_cpu_adam bench_transfer; do stand_in $p 'echo "gpt_train: done"'; done
(cd "$root" && OUT=$T/out1 DSB=$B BUDGET_S=32 MIN_ROW_S=4 STEPS=bench FLOORS=0 \
   ROWS="torch ds_z2_off dscpp_z2" bash bench/gpu/run.sh > "$T/log1" 2>&1)
grep -q "^| torch | failed: no result" "$T/out1/table.md" || fail "the torch row did not run"
grep -q "^| ds_z2_off | skipped: .* left of BUDGET_S" "$T/out1/table.md" || fail "ds_z2_off not skipped"
grep -q "^| dscpp_z2 | skipped: " "$T/out1/table.md" || fail "dscpp_z2 not skipped"
[ -f "$T/out1/all.tgz" ] || fail "no archive"
grep -q "stopped the unfinished cpu_adam JIT" "$T/out1/summary.txt" || fail "the JIT was not stopped"
sleep 1
for cmd in /proc/[0-9]*/cmdline; do  # (no procps on a minimal Debian)
  if [ "$(tr '\0' ' ' 2> /dev/null < "$cmd")" = "sleep $marker " ]; then
    kill "$(basename "$(dirname "$cmd")")"; fail "the JIT outlived the call"
  fi
done

# 2. A pack of every program: a_test passes only with the CPU path's environment, b_test fails.
touch "$B/cross_built"; stand_in dsrun 'exit 0'
printf 'a_test A.*:A/*:*/A.*:\nb_test B.*:B/*:*/B.*:\n' > "$B/bin/unit_tests.files"
stand_in unit_tests 'case "$1" in
  --gtest_filter=A.*) [ "$DS_DEVICE" = cpu ] && [ "$DS_COMM_BACKEND" = gloo ] && [ -d "$DS_SOURCE_DIR/tests" ] ;;
  --gtest_filter=B.*) echo "b_test.cpp:1: Failure"; exit 3 ;;
  *) echo "unexpected arguments: $*"; exit 9 ;;
esac'
(cd "$root" && OUT=$T/out2 DSB=$B BUDGET_S=120 STEPS=test TEST_LABELS=unit TEST_J=2 \
   bash bench/gpu/run.sh > "$T/log2" 2>&1)
grep -q -- "-L unit, the packed programs: 1 of 2 passed; not: b_test rc=3" "$T/out2/summary.txt" ||
  fail "run_unpacked's summary"
grep -q "b_test.cpp:1: Failure" "$T/log2" || fail "the failing program's lines were not shown"

# 3. The GPU programs of a pack. gpu_training_test lists its TEST_P suite after plain ones (as
#    gtest runs them); Stages/OneGpu hangs in its first case and is cut, OneGpuPinned crashes in
#    its first: the later suites still report, both resume without the case they were in.
env_ok='[ "$DS_EXPECT_GPU" = 1 ] && [ "$CUBLAS_WORKSPACE_CONFIG" = :4096:8 ] && [ "$NCCL_DEBUG" = WARN ]'
pass_case() {  # gtest's lines for one passing case
  echo "echo '[ RUN      ] $1'; echo '[       OK ] $1 (1 ms)'"
}
done_line='echo "[==========] 1 test from 1 test suite ran. (1 ms total)"; echo "[  PASSED  ] 1 test."'
stand_in gpu_training_test "echo \"\$*\" >> $T/order
case \"\$1\" in
  --gtest_list_tests) printf 'Running main() from gtest_main.cc\nOneGpuPinned.\n  Copies\n  Slices\nOneGpuNccl.\n  AllToAll\nStages/OneGpu.\n  TrainsAsStageZero/stage1  # GetParam() = 12-byte object\n  TrainsAsStageZero/stage2  # GetParam() = 12-byte object\n' ;;
  --gtest_filter=Stages/OneGpu.\\*) echo '[ RUN      ] Stages/OneGpu.TrainsAsStageZero/stage1'; exec sleep 60 ;;
  --gtest_filter=Stages/OneGpu.\\*-Stages/OneGpu.TrainsAsStageZero/stage1) $(pass_case Stages/OneGpu.TrainsAsStageZero/stage2); $done_line ;;
  --gtest_filter=OneGpuNccl.\\*) $env_ok || { echo 'the GPU environment is missing'; exit 1; }; $(pass_case OneGpuNccl.AllToAll); $done_line ;;
  --gtest_filter=OneGpuPinned.\\*) echo '[ RUN      ] OneGpuPinned.Copies'; kill -SEGV \$\$ ;;
  --gtest_filter=OneGpuPinned.\\*-OneGpuPinned.Copies) $(pass_case OneGpuPinned.Slices); $done_line ;;
  *) echo \"unexpected arguments: \$*\"; exit 9 ;;
esac"
one_suite_program() {  # program, suite, case: lists the one case and passes it, noting its arguments
  stand_in "$1" "echo \"\$*\" >> $T/order
case \"\$1\" in
  --gtest_list_tests) printf '$2.\n  $3\n' ;;
  *) $(pass_case "$2.$3"); $done_line ;;
esac"
}
one_suite_program flops_profiler_gpu_test FlopsProfilerGpu LatencyIncludesTheKernels
one_suite_program device_adam_gpu_test GpuAdamKernel EqualsTheCpuKernelBitForBit
one_suite_program onebit_gpu_test OneBitGpu CompressedAllReduceOnTheGpuMatchesTheHostLoops
one_suite_program pipeline_gpu_test PipelineGpu TwoStagesTrainAsOneModule
# It lists no suite: run whole, it runs none.
stand_in activation_checkpointing_gpu_test "echo \"\$*\" >> $T/order
echo '[==========] 0 tests from 0 test suites ran. (0 ms total)'"
# 30 s: the hung suite takes half (~14 s), the listing and the seven others ~2 s idle; 16 s left
# the last two "not run" when ctest started this beside the multi-node tests (2026-12-02).
(cd "$root" && OUT=$T/out3 DSB=$B BUDGET_S=0 STEPS=test TEST_LABELS=gpu CAP_GPU_TEST=30 MIN_SUITE_S=1 \
   bash bench/gpu/run.sh > "$T/log3" 2>&1)
grep -v -- --gtest_list_tests "$T/order" > "$T/order.run"
expected='--gtest_filter=GpuAdamKernel.*
--gtest_filter=Stages/OneGpu.*
--gtest_filter=OneGpuNccl.*
--gtest_filter=OneBitGpu.*
--gtest_filter=PipelineGpu.*
--gtest_filter=*
--gtest_filter=FlopsProfilerGpu.*
--gtest_filter=OneGpuPinned.*
--gtest_filter=OneGpuPinned.*-OneGpuPinned.Copies
--gtest_filter=Stages/OneGpu.*-Stages/OneGpu.TrainsAsStageZero/stage1'
[ "$(cat "$T/order.run")" = "$expected" ] || fail "the suites' order: $(cat "$T/order.run")"
grep -q "gpu gpu_training_test Stages/OneGpu: timed out at its cap, [0-9]*s; 0 passed, 0 failed, 0 skipped; stopped in Stages/OneGpu.TrainsAsStageZero/stage1" "$T/out3/summary.txt" ||
  fail "the hung suite's line"
grep -q "gpu gpu_training_test OneGpuNccl: passed; 1 passed" "$T/out3/summary.txt" || fail "OneGpuNccl after the hang"
tar xzf "$T/out3/all.tgz" -O ./ctest_gpu.log | grep -q "^\[       OK \] OneGpuNccl.AllToAll (1 ms)" ||
  fail "OneGpuNccl's lines in the log"
grep -q "gpu gpu_training_test OneGpuPinned: crashed (rc=139); 0 passed, 0 failed, 0 skipped; stopped in OneGpuPinned.Copies" "$T/out3/summary.txt" ||
  fail "the crashed suite's line"
grep -q "GPU test suites passed: GpuAdamKernel OneGpuNccl OneBitGpu PipelineGpu FlopsProfilerGpu OneGpuPinned(resumed) Stages/OneGpu(resumed); failed: \*; timed out: Stages/OneGpu; crashed: OneGpuPinned" "$T/out3/summary.txt" ||
  fail "the suites' summary"
rm -f "$B/bin/gpu_training_test"

# 4. The floors (bench_cpu_adam) start once DeepSpeed's cpu_adam JIT, started at the top of the
#    call for an offload row of DeepSpeed's, is done.
printf 'sleep 2\n' > "$root/.gpu/run_device.sh"
stand_in bench_cpu_adam "[ -f $B.jit_done ] && echo 'memory bandwidth: after the JIT' || echo 'memory bandwidth: beside the JIT'"
(cd "$root" && OUT=$T/out4 DSB=$B STEPS=bench ROWS=ds_z2_off bash bench/gpu/run.sh > "$T/log4" 2>&1)
rm -f "$B.jit_done"
grep -q "memory bandwidth: after the JIT" "$T/out4/summary.txt" || fail "the floors ran beside the JIT"
# 5. a_test must be running while the GPU suite runs (the suite waits for its marker); it outlives
#    CAP_BESIDE and is cut, c_test (TEST_J=1, after it) is not started; the step waits for both.
printf 'a_test A.*:\nc_test C.*:\n' > "$B/bin/unit_tests.files"
stand_in unit_tests "case \"\$1\" in
  --gtest_filter=A.*) touch $T/beside_started; exec sleep 30 ;;
  *) echo \"unexpected arguments: \$*\"; exit 9 ;;
esac"
stand_in gpu_training_test "case \"\$1\" in
  --gtest_list_tests) printf 'OneGpuNccl.\n  AllToAll\n' ;;
  *) $(pass_case OneGpuNccl.AllToAll); $done_line ;;
esac"
stand_in flops_profiler_gpu_test "case \"\$1\" in
  --gtest_list_tests) printf 'FlopsProfilerGpu.\n  LatencyIncludesTheKernels\n' ;;
  *) for i in 1 2 3 4 5 6 7 8 9 10; do [ -f $T/beside_started ] && break; sleep 0.5; done
     [ -f $T/beside_started ] || { echo 'the unit tests did not run beside'; exit 1; }
     $(pass_case FlopsProfilerGpu.LatencyIncludesTheKernels); $done_line ;;
esac"
(cd "$root" && OUT=$T/out5 DSB=$B STEPS=test TEST_LABELS=gpu TEST_BESIDE=unit TEST_J=1 CAP_BESIDE=4 \
   MIN_SUITE_S=1 bash bench/gpu/run.sh > "$T/log5" 2>&1)
grep -q "gpu flops_profiler_gpu_test FlopsProfilerGpu: passed" "$T/out5/summary.txt" ||
  fail "the unit tests did not run beside the GPU suites"
grep -q -- "-L unit, the packed programs: 0 of 2 passed; not: a_test rc=124 c_test rc=not-run" "$T/out5/summary.txt" ||
  fail "CAP_BESIDE did not bound the tests beside"
tail -2 "$T/out5/summary.txt" | head -1 | grep -q "the tests beside the GPU tests ended" ||
  fail "the step did not wait for the tests beside"
# 6. A link kept as a file (as the kit holds deepspeed/accelerator -> ../accelerator/).
mkdir -p "$root/.gpu/ds/accelerator" "$root/.gpu/ds/deepspeed"
echo "import marker" > "$root/.gpu/ds/accelerator/__init__.py"
printf '../accelerator/' > "$root/.gpu/ds/deepspeed/accelerator"
(cd "$root" && OUT=$T/out6 DSB=$B STEPS=none bash bench/gpu/run.sh > "$T/log6" 2>&1)
[ -f "$root/.gpu/ds/deepspeed/accelerator/__init__.py" ] || fail "the kit's link was not made a copy"

# 7. cuda-gdb (a stand-in on PATH) runs the named test and reports where it stopped.
mkdir -p "$T/path"
printf '#!/bin/bash\necho "args: $*"\necho "Thread 3 \\"dist_tests\\" received signal SIGSEGV, Segmentation fault."\necho "#0  0x1 in crash_site ()"\necho "#1  0x2 in caller ()"\n' > "$T/path/cuda-gdb"
chmod +x "$T/path/cuda-gdb"
(cd "$root" && PATH=$T/path:$PATH OUT=$T/out7 DSB=$B STEPS=backtrace BT_TESTS="dist:Suite.Case/1" \
   bash bench/gpu/run.sh > "$T/log7" 2>&1)
grep -q "== Suite.Case/1: Thread 3 .* received signal SIGSEGV" "$T/out7/summary.txt" || fail "the backtrace's signal line"
grep -q "^#0  0x1 in crash_site ()" "$T/out7/summary.txt" || fail "the backtrace's frames"
tar xzf "$T/out7/all.tgz" -O ./bt/Suite.Case_1.log | grep -q -- "--args bin/dist_tests --gtest_filter=Suite.Case/1" ||
  fail "cuda-gdb was not given the test program and its filter"

# 8. GpuAdamKernel fails; the suite after it and the row must see DS_DEVICE_ADAM=libtorch.
stand_in device_adam_gpu_test "case \"\$1\" in
  --gtest_list_tests) printf 'GpuAdamKernel.\n  EqualsTheCpuKernelBitForBit\n' ;;
  *) echo '[ RUN      ] GpuAdamKernel.EqualsTheCpuKernelBitForBit'
     echo '[  FAILED  ] GpuAdamKernel.EqualsTheCpuKernelBitForBit (1 ms)'
     echo '[==========] 1 test from 1 test suite ran. (1 ms total)'; exit 1 ;;
esac"
# A GPU suite after the kernel's that passes only if its environment passes the check $1 (says $2).
later_suite_checks() {
  stand_in flops_profiler_gpu_test "case \"\$1\" in
  --gtest_list_tests) printf 'FlopsProfilerGpu.\n  LatencyIncludesTheKernels\n' ;;
  *) $1 || { echo '$2'; exit 1; }
     $(pass_case FlopsProfilerGpu.LatencyIncludesTheKernels); $done_line ;;
esac"
}
later_suite_checks '[ "$DS_DEVICE_ADAM" = libtorch ]' 'DS_DEVICE_ADAM not set after the kernel failed'
stand_in gpt_train 'echo "gpt_train: done with DS_DEVICE_ADAM=${DS_DEVICE_ADAM:-unset}"'
(cd "$root" && OUT=$T/out8 DSB=$B BUDGET_S=120 STEPS="test bench" TEST_LABELS=gpu MIN_SUITE_S=1 \
   FLOORS=0 ROWS=dscpp_z2 bash bench/gpu/run.sh > "$T/log8" 2>&1)
grep -q "GpuAdamKernel failed (rc=1), GpuAdamKernel.EqualsTheCpuKernelBitForBit not passed: the rest of this call runs with DS_DEVICE_ADAM=libtorch" "$T/out8/summary.txt" ||
  fail "the kernel's failure did not turn the call to libtorch's Adam"
grep -q "gpu flops_profiler_gpu_test FlopsProfilerGpu: passed" "$T/out8/summary.txt" ||
  fail "a later GPU suite did not run with DS_DEVICE_ADAM=libtorch"
grep -q "row dscpp_z2 rc=0: gpt_train: done with DS_DEVICE_ADAM=libtorch" "$T/out8/summary.txt" ||
  fail "the row did not run with DS_DEVICE_ADAM=libtorch"
# 8b. The kernel's own case passes and another case of the suite fails: the kernel stays.
stand_in device_adam_gpu_test "case \"\$1\" in
  --gtest_list_tests) printf 'GpuAdamKernel.\n  EqualsTheCpuKernelBitForBit\n  LibtorchsFusedKernelStaysAChoice\n' ;;
  *) $(pass_case GpuAdamKernel.EqualsTheCpuKernelBitForBit)
     echo '[ RUN      ] GpuAdamKernel.LibtorchsFusedKernelStaysAChoice'
     echo '[  FAILED  ] GpuAdamKernel.LibtorchsFusedKernelStaysAChoice (1 ms)'
     echo '[==========] 2 tests from 1 test suite ran. (2 ms total)'; exit 1 ;;
esac"
later_suite_checks '[ -z "${DS_DEVICE_ADAM:-}" ]' 'DS_DEVICE_ADAM set though the kernel passed'
(cd "$root" && OUT=$T/out9 DSB=$B BUDGET_S=120 STEPS="test bench" TEST_LABELS=gpu MIN_SUITE_S=1 \
   FLOORS=0 ROWS=dscpp_z2 bash bench/gpu/run.sh > "$T/log9" 2>&1)
grep -q "gpu device_adam_gpu_test GpuAdamKernel: failed (rc=1); 1 passed, 1 failed" "$T/out9/summary.txt" ||
  fail "the suite's other failing case was not reported"
grep -q "DS_DEVICE_ADAM=libtorch" "$T/out9/summary.txt" && fail "a failure beside the kernel's case turned the call to libtorch's Adam"
grep -q "gpu flops_profiler_gpu_test FlopsProfilerGpu: passed" "$T/out9/summary.txt" ||
  fail "a later GPU suite saw DS_DEVICE_ADAM set"
grep -q "row dscpp_z2 rc=0: gpt_train: done with DS_DEVICE_ADAM=unset" "$T/out9/summary.txt" ||
  fail "the row did not run with the kernel"
# 9. STEPS=seed003: its tables and summary lines reach the call's own (the step's folder is
#    archived and removed); a row out of GPU memory "cannot fit under 24 GiB"; a peer cut at its
#    cap says it timed out. Stand-ins: every row of ours and the peers at micro-batch 1 run out of
#    memory, the torch row at micro-batch 16 hangs.
touch "$B.jit_done"  # no JIT to wait for
# (The engine's own words, longer than a table cell: the cut must not hide what it says.)
stand_in gpt_train 'echo "gpt_train: error: rank 0, initialize(): out of GPU memory on cuda:0 in initialize() building the stage'"'"'s partitions, buckets and optimizer state while allocating the fp32 master partition (2.00 GiB) (zero stage 0): tried to allocate 2.00 GiB; tensors held 23.10 GiB, peak 23.90 GiB, of 24.00 GiB. Try ZeRO stage 2 or 3"; exit 1'
cat > "$root/.gpu/bench/gpt_bench.py" <<'PY'
import json, sys, time
a = sys.argv; row = a[a.index("--row") + 1]; mb = a[a.index("--mb") + 1]; out = a[a.index("--out") + 1]
if row == "torch" and mb == "16":
    time.sleep(30)
err = "OutOfMemoryError: CUDA out of memory" if mb == "1" else "RuntimeError: something else"
open(out, "a").write(json.dumps({"row": row, "ok": False, "error": err}) + "\n")
PY
(cd "$root" && OUT=$T/out10 DSB=$B STEPS=seed003 ROW_CAP=3 bash bench/gpu/run.sh > "$T/log10" 2>&1)
rm -f "$B.jit_done"
grep -q "^## seed003/mb1" "$T/out10/table.md" || fail "seed003's micro-batch-1 table is not in the call's"
sed -n '/^## seed003\/mb1/,$p' "$T/out10/table.md" | grep -q "^| dscpp_z0 | cannot fit under 24 GiB (out of memory)" ||
  fail "our stage 0 out of memory at micro-batch 1 is not 'cannot fit'"
sed -n '/^## seed003\/mb1/,$p' "$T/out10/table.md" | grep -q "^| torch | cannot fit under 24 GiB (out of memory)" ||
  fail "PyTorch out of memory at micro-batch 1 is not 'cannot fit'"
sed -n '/^## seed003$/,/^## seed003\/mb1/p' "$T/out10/table.md" | grep -q "^| torch | failed: timed out after 3s" ||
  fail "the peer cut at its cap is not said to have timed out"
sed -n '/^## seed003$/,/^## seed003\/mb1/p' "$T/out10/table.md" | grep -q "^| ds_z2_off | failed: RuntimeError: something else" ||
  fail "a peer's other failure is not shown as failed"
grep -q "^seed003: .*seed 003: 24 GiB cap" "$T/out10/summary.txt" || fail "seed003's summary lines are not in the call's"
echo "gpu_run: ok"
