#!/bin/bash
# bench/gpu/run.sh's own logic, with stand-in programs and no GPU:
#   1. BUDGET_S: a row that would have less than MIN_ROW_S is skipped and the table says so, the
#      call still ends with its table and archive, and DeepSpeed's cpu_adam JIT, still running,
#      is stopped with everything it started;
#   2. the unit/dist runner for a pack of every program (run_unpacked): each test program runs
#      with the CPU path's environment, and those that fail are named.
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
#    after it are skipped; the JIT (a sleep that outlives the call) is stopped.
marker=61.$$
printf 'sleep %s\n' "$marker" > "$root/.gpu/run_device.sh"
printf 'print("RESULT stand-in")\n' > "$root/.gpu/bench/gpt_bench.py"
for p in gpt_train bench_cpu_adam bench_transfer; do stand_in $p 'echo "gpt_train: done"'; done
(cd "$root" && OUT=$T/out1 DSB=$B BUDGET_S=45 MIN_ROW_S=15 STEPS=bench FLOORS=0 \
   ROWS="torch ds_z2_off dscpp_z2" bash bench/gpu/run.sh > "$T/log1" 2>&1)
grep -q "^| torch | failed: no result" "$T/out1/table.md" || fail "the torch row did not run"
grep -q "^| ds_z2_off | skipped: .* left of BUDGET_S" "$T/out1/table.md" || fail "ds_z2_off not skipped"
grep -q "^| dscpp_z2 | skipped: " "$T/out1/table.md" || fail "dscpp_z2 not skipped"
[ -f "$T/out1/all.tgz" ] || fail "no archive"
grep -q "stopped the unfinished cpu_adam JIT" "$T/out1/summary.txt" || fail "the JIT was not stopped"
sleep 1
for cmd in /proc/[0-9]*/cmdline; do  # (no procps on a minimal Debian)
  if [ "$(tr '\0' ' ' < "$cmd" 2> /dev/null)" = "sleep $marker " ]; then
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
echo "gpu_run: ok"
