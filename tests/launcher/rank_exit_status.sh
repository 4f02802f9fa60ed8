# A rank exiting 3 makes dsrun name it, terminate the other ranks (and their own children, by
# process group) and exit 3 itself.
source "$(dirname "$0")/common.bash" "$1"

PORT=$(free_port)
run_dsrun fail4 --num_procs 4 --master_port $PORT "$WORKER" --mode exit3 --fail_rank 1 \
  --seconds 40 --marker "$MARKER"
[ $RC -eq 3 ] || fail "dsrun exited $RC, expected 3"
expect_contains "$TMP/fail4.err" "dsrun: rank 1 (pid "
expect_contains "$TMP/fail4.err" ") exited with status 3; terminating the other 3 ranks"
expect_contains "$TMP/fail4.err" "[rank 1] rank 1 failing with status 3"
# The rank's last words come before dsrun's verdict.
last_words=$(grep -nF "failing with status 3" "$TMP/fail4.err" | cut -d: -f1)
verdict=$(grep -nF "exited with status 3" "$TMP/fail4.err" | cut -d: -f1)
[ "$last_words" -lt "$verdict" ] || fail "dsrun's message came before rank 1's output"
no_leftovers

# Grandchildren: each rank is a shell that starts a worker in the background; rank 1's shell
# exits 5. The other shells and every background worker must be gone afterwards.
PORT=$(free_port)
run_dsrun grand --num_procs 3 --no_local_rank --master_port $PORT bash -c '
  "$0" --mode sleep --seconds 40 --marker "$1" &
  if [ "$RANK" = 1 ]; then sleep 1; exit 5; fi
  wait' "$WORKER" "$MARKER"
[ $RC -eq 5 ] || fail "dsrun exited $RC, expected 5"
expect_contains "$TMP/grand.err" ") exited with status 5; terminating the other 2 ranks"
no_leftovers

# All ranks succeed after one finished early: exit 0, nothing reported.
PORT=$(free_port)
run_dsrun allok --num_procs 3 --master_port $PORT "$WORKER" --mode exit3 --fail_rank -1 \
  --seconds 0.5 --marker "$MARKER"
[ $RC -eq 0 ] || fail "dsrun exited $RC for a job whose ranks all exit 0"
expect_absent "$TMP/allok.err" "dsrun:"
echo "PASS rank_exit_status"
