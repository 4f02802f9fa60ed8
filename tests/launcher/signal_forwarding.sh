# SIGTERM and SIGINT sent to dsrun reach every rank; dsrun exits 128+signal and leaves nothing
# running. If dsrun itself is SIGKILLed, its ranks die with it (parent-death signal).
source "$(dirname "$0")/common.bash" "$1"

start_sleepers() {  # NAME: 3 ranks that sleep; returns once all three are running
  local name=$1
  "$DSRUN" --num_procs 3 --master_port "$(free_port)" "$WORKER" --mode sleep --seconds 40 \
    --marker "$MARKER" >"$TMP/$name.out" 2>"$TMP/$name.err" &
  DSRUN_PID=$!
  wait_for 3 "sleeping" "$TMP/$name.out"
}

wait_exit() {  # bounded wait for DSRUN_PID; sets RC
  local i
  for ((i = 0; i < 200; i++)); do
    kill -0 $DSRUN_PID 2>/dev/null || break
    sleep 0.1
  done
  kill -0 $DSRUN_PID 2>/dev/null && fail "dsrun did not exit within 20 s of the signal"
  wait $DSRUN_PID
  RC=$?
}

for sig in TERM INT; do
  start_sleepers $sig
  kill -$sig $DSRUN_PID
  wait_exit
  want=$(( 128 + $(kill -l $sig) ))
  [ $RC -eq $want ] || fail "SIG$sig: dsrun exited $RC, expected $want"
  expect_contains "$TMP/$sig.err" "dsrun: received SIG$sig; forwarding it to the 3 running ranks"
  expect_absent "$TMP/$sig.err" "sending SIGKILL"  # the sleepers obey the forwarded signal
  no_leftovers
done

start_sleepers parentkill
kill -9 $DSRUN_PID
wait $DSRUN_PID 2>/dev/null
no_leftovers
echo "PASS signal_forwarding"
