# Ranks that ignore SIGTERM are SIGKILLed after the grace period, both when dsrun is told to stop
# and when another rank fails; dsrun never hangs on them.
source "$(dirname "$0")/common.bash" "$1"

# 1. SIGTERM to dsrun; grace from --kill_grace.
"$DSRUN" --num_procs 2 --kill_grace 1 --master_port "$(free_port)" "$WORKER" --mode ignore_term \
  --seconds 40 --marker "$MARKER" >"$TMP/term.out" 2>"$TMP/term.err" &
DSRUN_PID=$!
wait_for 2 "ignoring SIGTERM" "$TMP/term.out"
kill -TERM $DSRUN_PID
for ((i = 0; i < 200; i++)); do kill -0 $DSRUN_PID 2>/dev/null || break; sleep 0.1; done
kill -0 $DSRUN_PID 2>/dev/null && fail "dsrun still running 20 s after SIGTERM with --kill_grace 1"
wait $DSRUN_PID
RC=$?
[ $RC -eq 143 ] || fail "dsrun exited $RC, expected 143"
expect_contains "$TMP/term.err" "dsrun: rank 0 (pid "
expect_contains "$TMP/term.err" "is still running 1 s after SIGTERM; sending SIGKILL"
no_leftovers

# 2. A failing rank; grace from DSRUN_KILL_GRACE_S. Ranks 1-2 ignore SIGTERM (and then write a
# pid file); rank 0 exits 3 once both are ready.
DSRUN_KILL_GRACE_S=1 run_dsrun fail --num_procs 3 --no_local_rank --master_port "$(free_port)" \
  bash -c 'if [ "$RANK" = 0 ]; then
             for i in $(seq 300); do [ -s "$2/r1.pid" ] && [ -s "$2/r2.pid" ] && break; sleep 0.1; done
             exit 3
           fi
           exec "$0" --mode ignore_term --pid_file "$2/r$RANK.pid" --seconds 40 --marker "$1"' \
  "$WORKER" "$MARKER" "$TMP"
[ $RC -eq 3 ] || fail "dsrun exited $RC, expected 3"
expect_contains "$TMP/fail.err" "exited with status 3; terminating the other 2 ranks"
expect_contains "$TMP/fail.err" "dsrun: rank 2 (pid "
expect_contains "$TMP/fail.err" "is still running 1 s after SIGTERM; sending SIGKILL"
no_leftovers
# 3. A rank's own child ignores SIGTERM while the rank itself dies of it: once no rank is left,
# dsrun SIGKILLs the process groups at once rather than leaving the child behind.
"$DSRUN" --num_procs 2 --no_local_rank --master_port "$(free_port)" bash -c '
  "$0" --mode ignore_term --pid_file "$2/g$RANK.pid" --seconds 40 --marker "$1" &
  wait' "$WORKER" "$MARKER" "$TMP" >"$TMP/grand.out" 2>"$TMP/grand.err" &
DSRUN_PID=$!
wait_for 2 "ignoring SIGTERM" "$TMP/grand.out"
kill -TERM $DSRUN_PID
for ((i = 0; i < 200; i++)); do kill -0 $DSRUN_PID 2>/dev/null || break; sleep 0.1; done
kill -0 $DSRUN_PID 2>/dev/null && fail "dsrun still running 20 s after SIGTERM (grandchildren case)"
wait $DSRUN_PID
RC=$?
[ $RC -eq 143 ] || fail "grandchildren case: dsrun exited $RC, expected 143"
no_leftovers
echo "PASS kill_escalation"
