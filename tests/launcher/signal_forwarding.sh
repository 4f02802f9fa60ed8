# SIGTERM, SIGINT, SIGHUP (terminal or ssh session closed) and SIGQUIT sent to dsrun reach every
# rank; dsrun exits 128+signal and leaves nothing running. If dsrun itself is SIGKILLed, its ranks
# die with it (parent-death signal). Under nohup, SIGHUP stays ignored by dsrun and its ranks.
source "$(dirname "$0")/common.bash" "$1"
ulimit -c 0  # the ranks SIGQUIT kills write no core files

start_sleepers() {  # NAME: 3 ranks that sleep; returns once all three are running
  local name=$1
  "$DSRUN" --num_procs 3 --master_port "$(free_port)" "$WORKER" --mode sleep --seconds 40 \
    --marker "$MARKER" >"$TMP/$name.out" 2>"$TMP/$name.err" &
  DSRUN_PID=$!
  wait_for 3 "sleeping" "$TMP/$name.out"
}

for sig in TERM INT HUP QUIT; do
  start_sleepers $sig
  kill -$sig $DSRUN_PID
  wait_gone $DSRUN_PID "SIG$sig to dsrun"
  want=$(( 128 + $(kill -l $sig) ))
  [ $RC -eq $want ] || fail "SIG$sig: dsrun exited $RC, expected $want"
  expect_contains "$TMP/$sig.err" "dsrun: received SIG$sig; forwarding it to the 3 running ranks"
  expect_absent "$TMP/$sig.err" "sending SIGKILL"  # the sleepers obey the forwarded signal
  no_leftovers
done

# `nohup dsrun ... &` (SIGHUP ignored on entry) outlives the session: a SIGHUP to dsrun or to a
# rank changes nothing and the job completes normally. (Before: dsrun caught SIGHUP anyway and
# stopped the job with exit status 129.)
nohup "$DSRUN" --num_procs 2 --master_port "$(free_port)" "$WORKER" --mode sleep --seconds 8 \
  --pid_file "$TMP/nohup.pid" --marker "$MARKER" >"$TMP/nohup.out" 2>"$TMP/nohup.err" &
DSRUN_PID=$!
wait_for 2 "sleeping" "$TMP/nohup.out"
RANK_PID=$(cat "$TMP/nohup.pid")  # the rank that wrote it last
kill -HUP $DSRUN_PID
kill -HUP "$RANK_PID"
sleep 0.5
# Both still there: the HUPs landed while the job ran (it sleeps 8 s), and changed nothing.
kill -0 $DSRUN_PID 2>/dev/null || fail "nohup dsrun: dsrun ended right after SIGHUP"
kill -0 "$RANK_PID" 2>/dev/null || fail "nohup dsrun: the rank ended right after SIGHUP"
wait_gone $DSRUN_PID "nohup dsrun"
[ $RC -eq 0 ] || fail "nohup dsrun: SIGHUP ended the job (exit status $RC, expected 0)"
expect_absent "$TMP/nohup.err" "received SIGHUP"
no_leftovers

start_sleepers parentkill
kill -9 $DSRUN_PID
wait $DSRUN_PID 2>/dev/null
no_leftovers
echo "PASS signal_forwarding"
