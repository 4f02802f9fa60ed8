# One rank of three frozen (SIGSTOP) while all loop on all_reduce: the process is alive but silent,
# as a host behind a cut link is. The others' all_reduce times out after the collective timeout
# (6 s), and the error names the silent rank (the peer watch: its heartbeat in the store stopped),
# not only the collective.
source "$(dirname "$0")/common.bash" "$1"

PORT=$(free_port)
"$DSRUN" --num_procs 3 --master_port $PORT "$COMM_WORKER" --mode hang_collective --fail_rank 1 \
  --timeout 6 --pid_file "$TMP/rank1.pid" --marker "$MARKER" >"$TMP/frozen.out" 2>"$TMP/frozen.err" &
DSRUN_PID=$!
for ((i = 0; i < 300; i++)); do
  [ -s "$TMP/rank1.pid" ] && break
  kill -0 $DSRUN_PID 2>/dev/null || fail "dsrun ended before rank 1 entered the collective loop"
  sleep 0.1
done
[ -s "$TMP/rank1.pid" ] || fail "rank 1 never wrote its pid file"
VICTIM=$(cat "$TMP/rank1.pid")
kill -STOP "$VICTIM" || fail "could not stop rank 1 (pid $VICTIM)"

wait_gone $DSRUN_PID "rank 1 frozen"
[ $RC -ne 0 ] || fail "dsrun exited 0 with a frozen rank"
grep -qE "all_reduce of 1024 elements \(float\) on rank [02] of 3 failed after [0-9.]+ s \(timeout 6 s\)" \
  "$TMP/frozen.err" || fail "no named timeout of the all_reduce"
grep -qE "not heard from for up to [0-9.]+ s: rank 1 \(host [^)]*127\.0\.0\.1\)" "$TMP/frozen.err" ||
  fail "the timeout does not name the silent rank 1"
grep -oE "not heard from for up to [0-9.]+ s: .*" "$TMP/frozen.err" | grep -qE "rank [02] " &&
  fail "a live rank was named silent"
cat "$TMP/frozen.err" | grep -m1 "not heard from"
no_leftovers
echo "PASS rank_frozen_mid_collective"
