#!/bin/bash
# The bench programs' command lines: -h/--help prints the usage line and exits 0 without running
# the benchmark; an argument that is not a number, one too many, or a --dtype other than fp32/bf16
# exits 2 naming it. (The positional ones read "--help" with std::atoi as 0 and ran;
# bench_shm_allreduce aborted on --help and ran fp32 for --dtype fp16.) No benchmark runs here.
set -uo pipefail
bin=${1:?usage: bench_args.sh BUILD/bin}
fail() { echo "FAIL: $*"; exit 1; }
# run NAME ARGS...: sets RC and OUT (stdout and stderr); 20 s is far beyond a usage line.
run() { OUT=$(timeout 20 "$bin/$1" "${@:2}" 2>&1); RC=$?; }

for name in activation_checkpointing cpu_adam monitor_write transfer shm_allreduce grad_norm; do
  for flag in --help -h; do
    run bench_$name $flag
    [ $RC -eq 0 ] || fail "bench_$name $flag exited $RC: $OUT"
    [[ $OUT == *"Usage: "*"bench_$name"* ]] || fail "bench_$name $flag printed no usage line: $OUT"
    [ "$(printf '%s\n' "$OUT" | wc -l)" -eq 1 ] || fail "bench_$name $flag printed more than usage: $OUT"
  done
done

for name in activation_checkpointing cpu_adam monitor_write transfer grad_norm; do
  run bench_$name 12x
  [ $RC -eq 2 ] || fail "bench_$name 12x exited $RC: $OUT"
  [[ $OUT == *"argument 1: '12x' is not a whole number"* && $OUT == *"Usage: "* ]] ||
    fail "bench_$name 12x: $OUT"
done
run bench_cpu_adam 10 3 4
[ $RC -eq 2 ] && [[ $OUT == *"at most 2 arguments, got 3"* ]] || fail "bench_cpu_adam 10 3 4 ($RC): $OUT"
run bench_monitor_write 0
[ $RC -eq 2 ] && [[ $OUT == *"steps 0 is not positive"* ]] || fail "bench_monitor_write 0 ($RC): $OUT"
run bench_grad_norm 0
[ $RC -eq 2 ] && [[ $OUT == *"million_elements 0 is not positive"* ]] ||
  fail "bench_grad_norm 0 ($RC): $OUT"

run bench_shm_allreduce --dtype fp16
[ $RC -eq 2 ] && [[ $OUT == *"--dtype 'fp16' is not fp32 or bf16"* ]] ||
  fail "bench_shm_allreduce --dtype fp16 ($RC): $OUT"
run bench_shm_allreduce --sizes 768,x
[ $RC -eq 2 ] && [[ $OUT == *"--sizes: 'x' is not a whole number"* ]] ||
  fail "bench_shm_allreduce --sizes 768,x ($RC): $OUT"
run bench_shm_allreduce --bogus 1
[ $RC -eq 2 ] && [[ $OUT == *"unknown argument '--bogus'"* ]] ||
  fail "bench_shm_allreduce --bogus 1 ($RC): $OUT"
echo "PASS"
