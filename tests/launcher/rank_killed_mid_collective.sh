# kill -9 of one rank while all ranks loop on all_reduce: dsrun names the rank and the signal,
# terminates the others and exits 128+9.
source "$(dirname "$0")/common.bash" "$1"

PORT=$(free_port)
"$DSRUN" --num_procs 3 --master_port $PORT "$COMM_WORKER" --mode hang_collective --fail_rank 1 \
  --pid_file "$TMP/rank1.pid" --marker "$MARKER" >"$TMP/kill.out" 2>"$TMP/kill.err" &
DSRUN_PID=$!
for ((i = 0; i < 300; i++)); do
  [ -s "$TMP/rank1.pid" ] && break
  kill -0 $DSRUN_PID 2>/dev/null || fail "dsrun ended before rank 1 entered the collective loop"
  sleep 0.1
done
[ -s "$TMP/rank1.pid" ] || fail "rank 1 never wrote its pid file"
VICTIM=$(cat "$TMP/rank1.pid")
kill -9 "$VICTIM" || fail "could not kill rank 1 (pid $VICTIM)"

# Bounded wait for dsrun (grace is short; a hang fails here instead of at ctest's timeout).
wait_gone $DSRUN_PID "rank 1 killed"
[ $RC -eq 137 ] || fail "dsrun exited $RC, expected 137 (128 + SIGKILL)"
expect_contains "$TMP/kill.err" "dsrun: rank 1 (pid $VICTIM) was killed by signal 9 (SIGKILL)"
no_leftovers
echo "PASS rank_killed_mid_collective"
