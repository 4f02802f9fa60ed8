# A rank 0 killed while the local all-reduce's shared-memory segment exists but is not yet
# unlinked (its setup) would leave the segment in /dev/shm until reboot: dsrun removes the
# segments its ranks' pids named once the job is over, and says so.
source "$(dirname "$0")/common.bash" "$1"

PORT=$(free_port)
# Not run_dsrun: its hang check reads 137 as its own SIGKILL, and 137 is the answer here.
timeout 45 "$DSRUN" --num_procs 2 --master_port $PORT "$WORKER" --mode shm_leak --seconds 40 \
  --marker "$MARKER" >"$TMP/leak.out" 2>"$TMP/leak.err"
RC=$?
[ $RC -eq 124 ] && fail "dsrun hung (stopped by the test's timeout)"
[ $RC -eq 137 ] || fail "dsrun exited $RC, expected 137 (rank 0 killed by SIGKILL)"
NAME=$(grep -oE "created /ds_shm_[0-9]+_0" "$TMP/leak.out" | cut -d' ' -f2)
[ -n "$NAME" ] || fail "rank 0 did not report its segment"
[ -e "/dev/shm${NAME}" ] && fail "/dev/shm${NAME} is still there after the job"
expect_contains "$TMP/leak.err" "removed the shared-memory segment /dev/shm${NAME} left by rank 0"
no_leftovers
echo "PASS shm_segment_sweep"
