# Two network-namespace hosts with sshd (netns.bash), 2 ranks each, launched from host 0 through
# ssh and through pdsh: every rank sees its global RANK, LOCAL_RANK, NODE_RANK, WORLD_SIZE, the
# forwarded environment and .deepspeed_env (its values expanded by the remote shell, as in
# DeepSpeed: they were once single-quoted, so a rank saw a literal `$OMP_NUM_THREADS`; spaces
# around KEY and VALUE dropped); output carries "[HOST rank K] ". The host check runs PROGRAM's
# lookup with the job's own `cd CWD && export ...`, and a working directory missing on a host is
# an error naming it.
source "$(dirname "$0")/common.bash" "$1"
source "$(dirname "$0")/netns.bash"
netns_setup 2
H0=${HOSTS[0]} H1=${HOSTS[1]}
mkdir -p "$TMP/work"
cd "$TMP/work" || fail "cd $TMP/work"
# $OMP_NUM_THREADS: forwarded (1), exported before the file's lines.
echo "FROM_DEEPSPEED_ENV = a value with spaces='and quotes' \$OMP_NUM_THREADS " >.deepspeed_env

check_ranks() {  # check_ranks NAME: the 4 ranks' environment in $TMP/NAME.out
  local name=$1 k node local_rank host
  for k in 0 1 2 3; do
    node=$((k / 2)) local_rank=$((k % 2)) host=${HOSTS[$((k / 2))]}
    P="[$host rank $k] "
    for kv in RANK=$k LOCAL_RANK=$local_rank WORLD_SIZE=4 LOCAL_SIZE=2 LOCAL_WORLD_SIZE=2 \
              NODE_RANK=$node GROUP_RANK=$node CROSS_RANK=$node CROSS_SIZE=2 MASTER_ADDR=$H0 \
              MASTER_PORT=$PORT OMP_NUM_THREADS=1 DSRUN_RESTART_COUNT=0 CUDA_VISIBLE_DEVICES=0,1 \
              "FROM_DEEPSPEED_ENV=a value with spaces='and quotes' 1"; do
      grep -qxF -- "${P}env $kv" "$TMP/$name.out" || fail "$name: missing line '${P}env $kv'"
    done
    grep -qxF -- "${P}argv[1]=--local_rank=$local_rank" "$TMP/$name.out" ||
      fail "$name: rank $k lacks --local_rank=$local_rank"
    grep -qxF -- "${P}stderr line from rank $k" "$TMP/$name.err" || fail "$name: rank $k stderr"
  done
}

# ssh: one agent per node; master_addr found by the host check (node 0's address).
PORT=$(free_port)
OMP_NUM_THREADS=1 run_on_host0 ssh --hostfile "$TMP/hostfile" --launcher_args "$SSH_ARGS" \
  --master_port $PORT "$WORKER" --mode ok --marker "$MARKER"
[ $RC -eq 0 ] || fail "ssh launch: dsrun exited $RC"
check_ranks ssh

# pdsh: one pdsh for both agents (pdsh numbers them with %n); its ssh gets the config this way.
if command -v pdsh >/dev/null; then
  PORT=$(free_port)
  OMP_NUM_THREADS=1 PDSH_SSH_ARGS_APPEND="$SSH_ARGS" run_on_host0 pdsh --hostfile "$TMP/hostfile" \
    --launcher pdsh --master_port $PORT "$WORKER" --mode ok --marker "$MARKER"
  [ $RC -eq 0 ] || fail "pdsh launch: dsrun exited $RC"
  # pdsh puts "HOST: " before every line it relays.
  for s in out err; do sed -E 's/^[0-9.]+: //' "$TMP/pdsh.$s" >"$TMP/pdsh_lines.$s"; done
  check_ranks pdsh_lines
else
  echo "pdsh not installed: pdsh launch not tested"
fi

# openmpi: mpirun starts the 4 ranks itself (its ssh, and dsrun's host check, get the config
# through OMPI_MCA_plm_rsh_args); each rank has OpenMPI's variables and the exported
# MASTER_ADDR/PORT. mpirun wants root's consent.
if command -v mpirun >/dev/null; then
  PORT=$(free_port)
  OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    OMPI_MCA_plm_rsh_args="$SSH_ARGS" run_on_host0 mpi \
    --hostfile "$TMP/hostfile" --launcher openmpi --master_port $PORT \
    --launcher_args "--mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0" \
    "$WORKER" --mode ok --marker "$MARKER"
  [ $RC -eq 0 ] || { cat "$TMP/mpi.err"; fail "mpirun launch: dsrun exited $RC"; }
  # mpirun does not prefix the ranks' lines: the worker's last line, which has no newline, can
  # run into another rank's first line, so lines are matched by how they end.
  ending() { awk -v t="$1" 'substr($0, length($0) - length(t) + 1) == t { n++ } END { print n + 0 }' "$TMP/mpi.out"; }
  for k in 0 1 2 3; do
    [ "$(ending "env OMPI_COMM_WORLD_RANK=$k")" -eq 1 ] || fail "mpirun: no rank $k"
  done
  [ "$(ending "env OMPI_COMM_WORLD_LOCAL_RANK=1")" -eq 2 ] || fail "mpirun: local ranks"
  [ "$(ending "env MASTER_ADDR=$H0")" -eq 4 ] || fail "mpirun: MASTER_ADDR not exported: $(grep -n MASTER_ADDR "$TMP/mpi.out" | tr '\n' ' ')"
  [ "$(ending "env MASTER_PORT=$PORT")" -eq 4 ] || fail "mpirun: MASTER_PORT not exported: $(grep -n MASTER_PORT "$TMP/mpi.out" | tr '\n' ' ')"
  expect_absent "$TMP/mpi.out" "--local_rank"
else
  echo "mpirun not installed: openmpi launch not tested"
fi

# --include / --num_procs / --num_nodes select hosts and slots; the agent still numbers globally.
PORT=$(free_port)
OMP_NUM_THREADS=1 run_on_host0 incl --hostfile "$TMP/hostfile" --launcher_args "$SSH_ARGS" \
  --include "$H0:1@$H1" --master_port $PORT --force_multi "$WORKER" --mode ok --marker "$MARKER"
[ $RC -eq 0 ] || fail "--include launch: dsrun exited $RC"
expect_contains "$TMP/incl.out" "[$H0 rank 0] env CUDA_VISIBLE_DEVICES=1"
expect_contains "$TMP/incl.out" "[$H1 rank 2] env WORLD_SIZE=3"
expect_contains "$TMP/incl.out" "[$H1 rank 2] env LOCAL_RANK=1"
PORT=$(free_port)
OMP_NUM_THREADS=1 run_on_host0 nodes --hostfile "$TMP/hostfile" --launcher_args "$SSH_ARGS" \
  --num_nodes 1 --num_procs 1 --force_multi --master_port $PORT "$WORKER" --mode ok --marker "$MARKER"
[ $RC -eq 0 ] || fail "--num_nodes 1 --force_multi: dsrun exited $RC"
expect_contains "$TMP/nodes.out" "[$H0 rank 0] env WORLD_SIZE=1"
expect_absent "$TMP/nodes.out" "rank 1]"

# The host check looks PROGRAM up as the job will: after the job's `cd` and exports, so a PATH that
# .deepspeed_env extends finds a bare program name. (It once ran without them: exit 2, "not found
# on PATH", for a job that would have run.)
echo "PATH=$BIN:\$PATH" >"$TMP/path.env"
PORT=$(free_port)
DS_ENV_FILE=$TMP/path.env run_on_host0 bare --hostfile "$TMP/hostfile" --launcher_args "$SSH_ARGS" \
  --master_port $PORT "$(basename "$WORKER")" --mode ok --marker "$MARKER"
[ $RC -eq 0 ] || fail "bare program name on .deepspeed_env's PATH: dsrun exited $RC"
expect_contains "$TMP/bare.out" "[$H1 rank 3] env WORLD_SIZE=4"

# A working directory host 1 lacks (hidden there by a tmpfs over its parent, in the mount
# namespace of host 1's sshd): the host check names the host and the directory, and nothing
# starts. (It once ignored a failed cd: node 0's ranks started, node 1's agent failed, and
# --max_restarts would have restarted it.)
if command -v nsenter >/dev/null; then
  mkdir -p "$TMP/hidden/work"
  nsenter -t "${SSHD_PIDS[1]}" -m mount -t tmpfs none "$TMP/hidden" || fail "tmpfs over $TMP/hidden on host 1"
  cd "$TMP/hidden/work" || fail "cd $TMP/hidden/work"
  run_on_host0 nocwd --hostfile "$TMP/hostfile" --launcher_args "$SSH_ARGS" --max_restarts 1 \
    --master_port "$(free_port)" "$WORKER" --mode ok --marker "$MARKER"
  cd "$TMP/work" || fail "cd $TMP/work"
  [ $RC -eq 2 ] || fail "working directory missing on host 1: dsrun exited $RC, expected 2"
  expect_contains "$TMP/nocwd.err" "dsrun: host $H1: cannot enter the working directory $TMP/hidden/work"
  [ -s "$TMP/nocwd.out" ] && fail "working directory missing on host 1: ranks were started"
  expect_absent "$TMP/nocwd.err" "restarting"
else
  echo "nsenter not installed: a working directory missing on a host not tested"
fi

no_leftovers
echo "PASS multinode_env"
