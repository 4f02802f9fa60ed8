# --max_restarts on one node: a failed job is started again (DSRUN_RESTART_COUNT 0, 1, ...) up to
# N times, and dsrun exits with the last attempt's status. A rank's own exit status 2 is a failure
# like any other (it once passed for dsrun's usage error and was not restarted); dsrun's own errors
# before the start and a signal to dsrun are not restarted, even one that comes while dsrun is
# stopping a failed attempt.
source "$(dirname "$0")/common.bash" "$1"

run_dsrun exit2 --num_procs 1 --max_restarts 2 --no_local_rank --master_port "$(free_port)" \
  /bin/sh -c 'echo attempt $DSRUN_RESTART_COUNT; exit 2' "$MARKER"
[ $RC -eq 2 ] || fail "a rank exiting 2 three times: dsrun exited $RC, expected 2"
for k in 0 1 2; do
  grep -qxF "[rank 0] attempt $k" "$TMP/exit2.out" || fail "attempt $k did not run"
done
[ "$(grep -c attempt "$TMP/exit2.out")" -eq 3 ] || fail "expected exactly 3 attempts"
expect_contains "$TMP/exit2.err" "dsrun: the job failed (exit status 2); restarting it (restart 2 of 2)"

# Rank 1 fails on the first attempt only: the restart succeeds, dsrun exits 0.
run_dsrun recover --num_procs 2 --max_restarts 3 --master_port "$(free_port)" "$WORKER" \
  --mode exit3 --fail_rank 1 --fail_attempts 1 --seconds 0.5 --marker "$MARKER"
[ $RC -eq 0 ] || fail "a job that succeeds on its restart: dsrun exited $RC, expected 0"
expect_contains "$TMP/recover.out" "[rank 1] rank 1 started (restart 1)"
expect_absent "$TMP/recover.out" "(restart 2)"

# dsrun's own error before the start: reported once, not retried.
run_dsrun missing --max_restarts 2 "no_such_program_$MARKER"
[ $RC -eq 2 ] || fail "missing program: dsrun exited $RC, expected 2"
expect_absent "$TMP/missing.err" "restarting"
[ "$(grep -c "not found on PATH" "$TMP/missing.err")" -eq 1 ] || fail "the start was retried"

# SIGTERM to dsrun: the job stops for good.
"$DSRUN" --num_procs 1 --max_restarts 2 --master_port "$(free_port)" "$WORKER" --mode sleep \
  --seconds 40 --marker "$MARKER" >"$TMP/term.out" 2>"$TMP/term.err" &
DSRUN_PID=$!
wait_for 1 "sleeping" "$TMP/term.out"
kill -TERM $DSRUN_PID
wait_gone $DSRUN_PID "SIGTERM"
[ $RC -eq 143 ] || fail "SIGTERM: dsrun exited $RC, expected 143"
expect_absent "$TMP/term.err" "restarting"

# Ctrl-C while dsrun is stopping a failed job (rank 0 exited 4, rank 1 ignores SIGTERM, a long
# kill grace): the ranks are killed and the job is not restarted; exit status 130. (Before: the
# signal only cut the grace short, and the job was restarted.)
"$DSRUN" --num_procs 2 --max_restarts 3 --kill_grace 60 --no_local_rank \
  --master_port "$(free_port)" /bin/sh -c \
  'if [ "$RANK" = 1 ]; then exec "$1" --mode ignore_term --pid_file "$2" --marker "$0"; fi
   echo "attempt $DSRUN_RESTART_COUNT"
   for i in $(seq 300); do [ -e "$2" ] && break; sleep 0.1; done; exit 4' \
  "$MARKER" "$WORKER" "$TMP/int.pid" >"$TMP/int.out" 2>"$TMP/int.err" &
DSRUN_PID=$!
wait_for 1 "exited with status 4; terminating the other rank" "$TMP/int.err"
kill -INT $DSRUN_PID
wait_gone $DSRUN_PID "SIGINT during the kill grace"
[ $RC -eq 130 ] || fail "SIGINT during the kill grace after a failure: dsrun exited $RC, expected 130"
expect_contains "$TMP/int.err" "dsrun: received SIGINT while stopping the job; killing the ranks now"
expect_absent "$TMP/int.err" "restarting"
expect_absent "$TMP/int.out" "attempt 1"
no_leftovers

# The same in the multi-node launcher: a stand-in pdsh reports a failed node and ignores SIGTERM.
mkdir -p "$TMP/bin"
cat >"$TMP/bin/pdsh" <<'SH'
#!/bin/sh
trap '' TERM
echo "pdsh started" >>"$PDSH_LOG"
echo "pdsh@launcher: h1: ssh exited with exit code 4" >&2
while :; do sleep 0.1; done
SH
chmod +x "$TMP/bin/pdsh"
printf 'h0 slots=1\nh1 slots=1\n' >"$TMP/hostfile"
HOME="$TMP" PATH="$TMP/bin:$PATH" PDSH_LOG="$TMP/pdsh.log" "$DSRUN" --hostfile "$TMP/hostfile" \
  --launcher pdsh --no_ssh_check --max_restarts 3 --kill_grace 60 "$WORKER" --marker "$MARKER" \
  >"$TMP/pdsh.out" 2>"$TMP/pdsh.err" &
DSRUN_PID=$!
wait_for 1 "dsrun: pdsh reports a failed node" "$TMP/pdsh.err"
kill -INT $DSRUN_PID
wait_gone $DSRUN_PID "multi-node, SIGINT during the teardown"
[ $RC -eq 130 ] || fail "multi-node, SIGINT during the teardown: dsrun exited $RC, expected 130"
expect_absent "$TMP/pdsh.err" "restarting"
[ "$(wc -l <"$TMP/pdsh.log")" -eq 1 ] || fail "multi-node: the job was restarted after SIGINT"

no_leftovers
echo "PASS max_restarts"
