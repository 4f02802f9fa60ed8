# Failures across two network-namespace hosts (netns.bash), 2 ranks each, launched from host 0
# over ssh: a remote rank killed with SIGKILL, a remote node agent killed, a remote rank exiting
# with an error (3, and 255 as a lost ssh connection would), dsrun interrupted; --max_restarts; and the errors found before any rank starts.
# Each failure must stop every rank on both hosts, name the host and the rank, and exit non-zero.
source "$(dirname "$0")/common.bash" "$1"
source "$(dirname "$0")/netns.bash"
netns_setup 2
H0=${HOSTS[0]} H1=${HOSTS[1]}
cd "$TMP" || fail "cd $TMP"
LAUNCH=(--hostfile "$TMP/hostfile" --launcher_args "$SSH_ARGS")

# start_bg NAME ARGS...: dsrun on host 0 in the background (DSRUN_PID).
start_bg() {
  local name=$1
  shift
  ip netns exec "${NS[0]}" "$DSRUN" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" &
  DSRUN_PID=$!
}
# finish_bg LIMIT: waits for DSRUN_PID at most LIMIT seconds; sets RC and ELAPSED.
finish_bg() {
  local limit=$1 start=$SECONDS i
  for ((i = 0; i < limit * 10; i++)); do
    kill -0 $DSRUN_PID 2>/dev/null || break
    sleep 0.1
  done
  kill -0 $DSRUN_PID 2>/dev/null && { kill -9 $DSRUN_PID; fail "dsrun still running after $limit s"; }
  wait $DSRUN_PID
  RC=$?
  ELAPSED=$((SECONDS - start))
}

# 1. kill -9 of a remote rank: its agent reports it, dsrun stops node 0 too.
start_bg kill_rank "${LAUNCH[@]}" --master_port "$(free_port)" "$WORKER" --mode hang_collective \
  --fail_rank 3 --pid_file "$TMP/rank3.pid" --marker "$MARKER"
wait_for 4 "collective loop" "$TMP/kill_rank.out" 20
[ -s "$TMP/rank3.pid" ] || fail "rank 3 wrote no pid file"
kill -9 "$(cat "$TMP/rank3.pid")"
finish_bg 20
[ $RC -eq 137 ] || fail "killed remote rank: dsrun exited $RC, expected 137"
expect_contains "$TMP/kill_rank.err" "rank 3 (pid $(cat "$TMP/rank3.pid")) on $H1 was killed by signal 9 (SIGKILL)"
expect_contains "$TMP/kill_rank.err" "dsrun: node 1 ($H1) failed with exit status 137; stopping the other 1 node"
no_leftovers
echo "killed remote rank: dsrun exited $RC after ${ELAPSED}s"

# 1b. The same through pdsh: dsrun learns of the failed node from pdsh's report and stops pdsh.
if command -v pdsh >/dev/null; then
  rm -f "$TMP/rank3.pid"
  PDSH_SSH_ARGS_APPEND="$SSH_ARGS" start_bg pdsh_kill --hostfile "$TMP/hostfile" --launcher pdsh \
    --master_port "$(free_port)" "$WORKER" --mode hang_collective --fail_rank 3 \
    --pid_file "$TMP/rank3.pid" --marker "$MARKER"
  wait_for 4 "collective loop" "$TMP/pdsh_kill.out" 20
  kill -9 "$(cat "$TMP/rank3.pid")"
  finish_bg 20
  [ $RC -eq 137 ] || fail "pdsh, killed remote rank: dsrun exited $RC, expected 137"
  expect_contains "$TMP/pdsh_kill.err" "on $H1 was killed by signal 9 (SIGKILL)"
  expect_contains "$TMP/pdsh_kill.err" "dsrun: pdsh reports a failed node"
  no_leftovers
fi

# 2. kill -9 of the remote node agent (its ranks die with it: parent-death signal).
start_bg kill_agent "${LAUNCH[@]}" --master_port "$(free_port)" "$WORKER" --mode sleep --marker "$MARKER"
wait_for 4 "sleeping" "$TMP/kill_agent.out" 20
AGENT=$(pgrep -f -- "^[^ ]*/dsrun --node_rank 1 .*$MARKER" | head -n1)  # not the ssh carrying it
[ -n "$AGENT" ] || fail "no agent process for node 1"
kill -9 "$AGENT"
finish_bg 20
[ $RC -ne 0 ] || fail "killed agent: dsrun exited 0"
expect_contains "$TMP/kill_agent.err" "dsrun: node 1 ($H1): lost the ssh connection to its agent"
no_leftovers
echo "killed remote agent: dsrun exited $RC after ${ELAPSED}s"

# 3. A remote rank exits with status 3: dsrun exits 3 and names it.
run_on_host0 exit3 "${LAUNCH[@]}" --master_port "$(free_port)" "$WORKER" --mode exit3 --fail_rank 2 \
  --marker "$MARKER"
[ $RC -eq 3 ] || fail "remote rank exit 3: dsrun exited $RC"
expect_contains "$TMP/exit3.err" "rank 2 (pid"
expect_contains "$TMP/exit3.err" ") on $H1 exited with status 3"
expect_contains "$TMP/exit3.err" "dsrun: node 1 ($H1) failed with exit status 3"
no_leftovers

# 3b. A remote rank exits 255 (exit(-1)): its agent, and so its ssh, exit 255 too, which is also
#     ssh's status for a lost connection. The agent's line about its rank tells them apart: dsrun
#     once said "lost the ssh connection" here, contradicting the agent.
run_on_host0 exit255 "${LAUNCH[@]}" --master_port "$(free_port)" "$WORKER" --mode exit3 \
  --fail_rank 2 --fail_status 255 --marker "$MARKER"
[ $RC -eq 255 ] || fail "remote rank exit 255: dsrun exited $RC"
expect_contains "$TMP/exit255.err" ") on $H1 exited with status 255"
expect_contains "$TMP/exit255.err" "dsrun: node 1 ($H1) failed with exit status 255"
expect_absent "$TMP/exit255.err" "lost the ssh connection"
no_leftovers

# 4. SIGTERM to the launching dsrun stops every node.
start_bg term "${LAUNCH[@]}" --master_port "$(free_port)" "$WORKER" --mode sleep --marker "$MARKER"
wait_for 4 "sleeping" "$TMP/term.out" 20
kill -TERM $DSRUN_PID
finish_bg 20
[ $RC -eq 143 ] || fail "SIGTERM to dsrun: exited $RC, expected 143"
expect_contains "$TMP/term.err" "received SIGTERM; stopping the job on every node"
no_leftovers

# 5. --max_restarts: rank 2 fails in the first attempt only (once every rank has started: the
#    --started_dir marks); the second runs to the end with DSRUN_RESTART_COUNT=1. Without
#    restarts left, the failure is final.
mkdir -p "$TMP/started"
run_on_host0 restart "${LAUNCH[@]}" --max_restarts 1 --master_port "$(free_port)" "$WORKER" \
  --mode exit3 --fail_rank 2 --fail_attempts 1 --seconds 1 --started_dir "$TMP/started" \
  --marker "$MARKER"
[ $RC -eq 0 ] || fail "--max_restarts 1: dsrun exited $RC"
expect_contains "$TMP/restart.err" "dsrun: the job failed (exit status 3); restarting it (restart 1 of 1)"
expect_contains "$TMP/restart.out" "[$H1 rank 3] rank 3 started (restart 1)"
expect_contains "$TMP/restart.out" "[$H0 rank 0] rank 0 started (restart 0)"
run_on_host0 restart_out "${LAUNCH[@]}" --max_restarts 1 --master_port "$(free_port)" "$WORKER" \
  --mode exit3 --fail_rank 2 --fail_attempts 2 --seconds 1 --marker "$MARKER"
[ $RC -eq 3 ] || fail "--max_restarts 1 with two failures: dsrun exited $RC"
no_leftovers

# 6. Errors found before any rank starts (exit status 2, nothing on stdout).
before_start() {  # before_start NAME EXPECTED-TEXT DSRUN-ARGS...
  local name=$1 text=$2
  shift 2
  run_on_host0 "$name" "$@"
  [ $RC -eq 2 ] || fail "$name: dsrun exited $RC, expected 2"
  expect_contains "$TMP/$name.err" "$text"
  [ -s "$TMP/$name.out" ] && fail "$name: something was started"
  return 0
}
PROG=("$WORKER" --mode ok --marker "$MARKER")
before_start unreachable "cannot reach host $H0 over ssh: ssh: connect to host $H0 port 2222: Connection refused" \
  "${LAUNCH[@]}" --ssh_port 2222 "${PROG[@]}"
printf '%s slots=2\n%s slots=two\n' "$H0" "$H1" >"$TMP/bad_hostfile"
before_start bad_line "hostfile $TMP/bad_hostfile line 2 '$H1 slots=two': slots must be a whole number >= 1" \
  --hostfile "$TMP/bad_hostfile" "${PROG[@]}"
before_start unknown_host "--include '10.9.9.9': host 10.9.9.9 is not in the hostfile ($H0, $H1)" \
  "${LAUNCH[@]}" --include 10.9.9.9 "${PROG[@]}"
before_start unknown_slot "--exclude '$H1:5': host $H1 has no slot 5" "${LAUNCH[@]}" --exclude "$H1:5" "${PROG[@]}"
before_start no_program "host $H0: program 'no_such_program_$MARKER' not found on PATH" \
  "${LAUNCH[@]}" "no_such_program_$MARKER"
PORT=$(free_port)
ip netns exec "${NS[0]}" python3 -c '
import socket, sys, time
s = socket.socket(); s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen()
print("listening", flush=True); time.sleep(40)' $PORT "$MARKER" >"$TMP/holder.out" &
HOLDER=$!
wait_for 1 listening "$TMP/holder.out" 10
before_start port "host $H0: --master_port $PORT on 0.0.0.0 is already in use" \
  "${LAUNCH[@]}" --master_port $PORT "${PROG[@]}"
kill $HOLDER; wait $HOLDER 2>/dev/null
before_start bad_launcher "--launcher 'rsh' is not one of ssh, pdsh, openmpi, slurm" \
  "${LAUNCH[@]}" --launcher rsh "${PROG[@]}"

no_leftovers
echo "PASS multinode_failures"
