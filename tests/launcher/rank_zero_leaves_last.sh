# Rank 0 hosts the rendezvous store and, when it succeeds, leaves last (src/comm/exit_order.h):
# libtorch 1.13's store clients can abort ("Connection reset by peer", SIGABRT) when the store
# closes under them, so a rank still running when rank 0 exited could turn a finished job into a
# failed one.
# 1. linger_exit: rank 0 returns 0 at once, ranks 1 and 2 1.5 s later: dsrun exits 0, no rank
#    aborts, and rank 0's last exit handler runs after every other rank's.
# 2. linger_exit --status 3: a failing rank 0 does not wait for ranks that sleep 100 s: dsrun
#    exits 3 at once.
# 3. leave_collective: rank 0 returns 0 while ranks 1 and 2 wait for it in an all_reduce with a
#    60 s timeout: rank 0 drops its communicator before it waits, so they fail at once and dsrun
#    exits 1 long before the timeout.
source "$(dirname "$0")/common.bash" "$1"

run_dsrun linger --num_procs 3 --master_port "$(free_port)" "$COMM_WORKER" --mode linger_exit \
  --seconds 1.5 --timeout 60 --marker "$MARKER"
[ $RC -eq 0 ] || fail "linger_exit: dsrun exited $RC, expected 0"
expect_absent "$TMP/linger.err" "terminate called"
expect_absent "$TMP/linger.err" "Connection reset"
for r in 0 1 2; do
  expect_contains "$TMP/linger.out" "[rank $r] rank $r sum 3"
  expect_contains "$TMP/linger.out" "[rank $r] rank $r exit_ns "
done
grep -oE "rank [0-9] exit_ns [0-9]+" "$TMP/linger.out" |
  awk '$2 == 0 { zero = $4 } $2 != 0 && $4 > last { last = $4 } END { exit !(zero > last) }' ||
  fail "rank 0 exited before another rank: $(grep exit_ns "$TMP/linger.out" | tr '\n' ' ')"

# took NAME ARGS...: run_dsrun, then fail if it took 30 s or more (the collectives' timeout is 60 s).
took() {
  local name=$1 start=$(date +%s)
  run_dsrun "$@"
  local seconds=$(($(date +%s) - start))
  [ $seconds -lt 30 ] || fail "$name took $seconds s: a rank waited for the timeout"
}

took failed --num_procs 3 --master_port "$(free_port)" "$COMM_WORKER" --mode linger_exit \
  --status 3 --seconds 100 --timeout 60 --marker "$MARKER"
[ $RC -eq 3 ] || fail "linger_exit --status 3: dsrun exited $RC, expected 3"

took leave --num_procs 3 --master_port "$(free_port)" "$COMM_WORKER" --mode leave_collective \
  --fail_rank 0 --timeout 60 --marker "$MARKER"
[ $RC -eq 1 ] || fail "leave_collective: dsrun exited $RC, expected 1"
expect_contains "$TMP/leave.err" "rank 0 leaves the loop with status 0"
grep -qE "rank [12] collective failed" "$TMP/leave.err" || fail "no rank named its failed all_reduce"
no_leftovers
echo "PASS rank_zero_leaves_last"
