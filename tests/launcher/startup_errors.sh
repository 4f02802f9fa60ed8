# Problems found before any rank starts: a clear message and exit status 2.
source "$(dirname "$0")/common.bash" "$1"

# Port in use (a listening socket held by python3 for the duration).
PORT=$(free_port)
python3 -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
print("listening", flush=True); time.sleep(40)' $PORT "$MARKER" >"$TMP/holder.out" &
HOLDER=$!
wait_for 1 listening "$TMP/holder.out" 10
run_dsrun port --num_procs 2 --master_port $PORT "$WORKER" --mode ok --marker "$MARKER"
kill $HOLDER; wait $HOLDER 2>/dev/null
[ $RC -eq 2 ] || fail "port in use: dsrun exited $RC, expected 2"
expect_contains "$TMP/port.err" \
  "dsrun: --master_port $PORT on 127.0.0.1 is already in use (choose another with --master_port)"
[ -s "$TMP/port.out" ] && fail "port in use: a rank was started"

# Missing program, a non-executable file, a directory.
run_dsrun missing --num_procs 2 --master_port "$(free_port)" no_such_program_$MARKER
[ $RC -eq 2 ] || fail "missing program: dsrun exited $RC, expected 2"
expect_contains "$TMP/missing.err" "program 'no_such_program_$MARKER' not found on PATH"

touch "$TMP/not_exec"
run_dsrun notexec --master_port "$(free_port)" "$TMP/not_exec"
[ $RC -eq 2 ] || fail "non-executable program: dsrun exited $RC, expected 2"
expect_contains "$TMP/notexec.err" "program '$TMP/not_exec' cannot be run: it is not executable"

run_dsrun dir --master_port "$(free_port)" "$TMP"
[ $RC -eq 2 ] || fail "directory as program: dsrun exited $RC, expected 2"
expect_contains "$TMP/dir.err" "it is a directory"

run_dsrun nofile --master_port "$(free_port)" ./no_such_file_$MARKER
[ $RC -eq 2 ] || fail "missing path: dsrun exited $RC, expected 2"
expect_contains "$TMP/nofile.err" "program './no_such_file_$MARKER' cannot be run: No such file"

# Usage errors.
run_dsrun noprog --num_procs 2
[ $RC -eq 2 ] || fail "no program: dsrun exited $RC, expected 2"
expect_contains "$TMP/noprog.err" "dsrun: no PROGRAM given"
run_dsrun badopt --bogus "$WORKER"
[ $RC -eq 2 ] || fail "unknown option: dsrun exited $RC, expected 2"
expect_contains "$TMP/badopt.err" "unknown option '--bogus'"
run_dsrun autotune --autotuning run "$WORKER"
[ $RC -eq 2 ] || fail "--autotuning: dsrun exited $RC, expected 2"
expect_contains "$TMP/autotune.err" "DeepSpeed's --autotuning is not supported"
run_dsrun zero --num_procs 0 "$WORKER"
[ $RC -eq 2 ] || fail "--num_procs 0: dsrun exited $RC, expected 2"
run_dsrun both --num_procs 2 --num_gpus 2 "$WORKER"
[ $RC -eq 2 ] || fail "--num_procs with --num_gpus: dsrun exited $RC, expected 2"
DSRUN_KILL_GRACE_S=soon run_dsrun grace "$WORKER"
[ $RC -eq 2 ] || fail "bad DSRUN_KILL_GRACE_S: dsrun exited $RC, expected 2"
expect_contains "$TMP/grace.err" "DSRUN_KILL_GRACE_S='soon'"
# The per-node agent form (`dsrun --node_rank K --world_info W`, DeepSpeed's --no_ssh) of a world
# of several nodes needs --master_addr: rank 0's store runs on node 0, and the default 127.0.0.1
# sent the other nodes' ranks to their own loopback until the rendezvous timed out.
run_dsrun agent_no_addr --node_rank 1 --world_info h0:0@h1:0 --master_port "$(free_port)" \
  "$WORKER" --mode ok --marker "$MARKER"
[ $RC -eq 2 ] || fail "agent of a 2-node world without --master_addr: dsrun exited $RC, expected 2"
expect_contains "$TMP/agent_no_addr.err" \
  "dsrun: --world_info h0:0@h1:0 has 2 nodes: pass --master_addr (node 0's address"
[ -s "$TMP/agent_no_addr.out" ] && fail "agent without --master_addr: a rank was started"
# With it, and for a one-node world without it, the agent runs.
run_dsrun agent_addr --node_rank 1 --world_info h0:0@h1:0 --master_addr 127.0.0.1 \
  --master_port "$(free_port)" "$WORKER" --mode ok --marker "$MARKER"
[ $RC -eq 0 ] || fail "agent with --master_addr: dsrun exited $RC"
expect_contains "$TMP/agent_addr.out" "[h1 rank 1] env WORLD_SIZE=2"
run_dsrun agent_one_node --node_rank 0 --world_info h0:0 --master_port "$(free_port)" \
  "$WORKER" --mode ok --marker "$MARKER"
[ $RC -eq 0 ] || fail "agent of a one-node world: dsrun exited $RC"
# DeepSpeed's --no_ssh points at that form, --master_addr included.
run_dsrun no_ssh --no_ssh "$WORKER"
[ $RC -eq 2 ] || fail "--no_ssh: dsrun exited $RC, expected 2"
expect_contains "$TMP/no_ssh.err" "run 'dsrun --node_rank K --world_info W --master_addr A PROGRAM'"

run_dsrun help --help
[ $RC -eq 0 ] || fail "--help exited $RC"
expect_contains "$TMP/help.out" "--num_procs"

no_leftovers
echo "PASS startup_errors"
