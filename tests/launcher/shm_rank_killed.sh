# kill -9 of one of two ranks (started without dsrun, so the survivor's own error is what we
# read) while both loop on all_reduce of 1024 floats: the survivor's all_reduce fails well within
# the 60 s collective timeout, naming the operation and the dead rank, on the shared-memory path
# (the default for ranks on one host) as on Gloo's (DS_SHM_ALLREDUCE=0).
source "$(dirname "$0")/common.bash" "$1"

run_case() {
  local shm=$1 port
  port=$(free_port)
  rm -f "$TMP/rank1.pid"
  for r in 0 1; do
    env RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$port DS_SHM_ALLREDUCE=$shm OMP_NUM_THREADS=1 \
      "$COMM_WORKER" --mode hang_collective --fail_rank 1 --timeout 60 \
      --pid_file "$TMP/rank1.pid" --marker "$MARKER" >"$TMP/shm$shm.rank$r.out" \
      2>"$TMP/shm$shm.rank$r.err" &
    [ $r -eq 0 ] && SURVIVOR=$!
  done
  for ((i = 0; i < 300; i++)); do
    [ -s "$TMP/rank1.pid" ] && break
    sleep 0.1
  done
  [ -s "$TMP/rank1.pid" ] || fail "rank 1 never wrote its pid file (DS_SHM_ALLREDUCE=$shm)"
  VICTIM=$(cat "$TMP/rank1.pid")
  kill -9 "$VICTIM" || fail "could not kill rank 1 (pid $VICTIM)"
  for ((i = 0; i < 200; i++)); do
    kill -0 $SURVIVOR 2>/dev/null || break
    sleep 0.1
  done
  kill -0 $SURVIVOR 2>/dev/null &&
    fail "rank 0 still running 20 s after rank 1 was killed (DS_SHM_ALLREDUCE=$shm)"
  wait $SURVIVOR
  RC=$?
  [ $RC -eq 1 ] || fail "rank 0 exited $RC, expected 1 (a failed collective)"
  grep -qE "all_reduce of 1024 elements \(float\) on rank 0 of 2 failed after [0-9.]+ s \(timeout 60 s\)" \
    "$TMP/shm$shm.rank0.err" || fail "no named failure of the all_reduce (DS_SHM_ALLREDUCE=$shm)"
  grep -m1 "failed after" "$TMP/shm$shm.rank0.err"
}

run_case 1
expect_contains "$TMP/shm1.rank0.err" "shared-memory all_reduce #"
expect_contains "$TMP/shm1.rank0.err" "rank 1 (pid $VICTIM) has exited before contributing"
run_case 0
expect_absent "$TMP/shm0.rank0.err" "shared-memory"
no_leftovers
echo "PASS shm_rank_killed"
