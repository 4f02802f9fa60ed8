# --launcher openmpi and slurm start the ranks through mpirun/srun, which place a host's ranks on
# its devices 0..k-1 and set no CUDA_VISIBLE_DEVICES: an --include/--exclude choosing other slots
# is refused (exit 2, naming the flags, the launcher and the host) instead of being silently cut
# down to a slot count (it once was). Whole hosts and a host's first slots stay allowed. Also what
# mpirun and srun are given to keep the hostfile's order and --ssh_port. Stand-in mpirun and srun
# record their arguments (and the SLURM_HOSTFILE they see); nothing reaches another host.
source "$(dirname "$0")/common.bash" "$1"

mkdir -p "$TMP/bin"
cat >"$TMP/bin/mpirun" <<'SH'
#!/bin/sh
printf '%s\n' "$@" >"$LAUNCHER_ARGS"
while [ $# -gt 0 ]; do [ "$1" = -hostfile ] && cat "$2" >>"$LAUNCHER_ARGS.hostfile"; shift; done
if [ -n "${SLURM_HOSTFILE:-}" ]; then
  echo "$SLURM_HOSTFILE" >"$LAUNCHER_ARGS.slurm_hostfile_path"
  cat "$SLURM_HOSTFILE" >"$LAUNCHER_ARGS.slurm_hostfile"
fi
exit 0
SH
cp "$TMP/bin/mpirun" "$TMP/bin/srun"
chmod +x "$TMP/bin/mpirun" "$TMP/bin/srun"
printf 'h0 slots=2\nh1 slots=2\n' >"$TMP/hostfile"

# run_backend NAME LAUNCHER SELECTION...: dsrun on the two-host hostfile ($HOSTFILE if set) through
# the stand-ins; the stand-in's arguments go to $TMP/NAME.args (and the MPI hostfile to
# $TMP/NAME.args.hostfile).
run_backend() {
  local name=$1 launcher=$2
  shift 2
  PATH="$TMP/bin:$PATH" LAUNCHER_ARGS="$TMP/$name.args" run_dsrun "$name" \
    --hostfile "${HOSTFILE:-$TMP/hostfile}" --launcher "$launcher" --no_ssh_check "$@" \
    "$WORKER" --mode ok --marker "$MARKER"
}

# refused NAME LAUNCHER HOST SLOTS SELECTION...: exit 2, the message, nothing started.
refused() {
  local name=$1 launcher=$2 host=$3 slots=$4
  shift 4
  run_backend "$name" "$launcher" "$@"
  [ $RC -eq 2 ] || fail "$name: dsrun exited $RC, expected 2"
  expect_contains "$TMP/$name.err" "dsrun: --launcher $launcher cannot run chosen slots"
  expect_contains "$TMP/$name.err" "--include/--exclude leave host $host with slots $slots"
  [ -e "$TMP/$name.args" ] && fail "$name: the $launcher stand-in ran"
  return 0
}
refused mpi_include openmpi h0 1 --include h0:1@h1
refused mpi_exclude openmpi h1 1 --exclude h1:0
refused slurm_include slurm h0 1 --include h0:1@h1:1
refused slurm_exclude slurm h1 1 --exclude h0:1@h1:0

# Whole hosts and first slots: what mpirun/srun place is what was chosen.
run_backend mpi_first openmpi --include h0:0@h1
[ $RC -eq 0 ] || fail "openmpi --include h0:0@h1: dsrun exited $RC"
grep -qxF "h0 slots=1" "$TMP/mpi_first.args.hostfile" || fail "mpi_first: no 'h0 slots=1'"
grep -qxF "h1 slots=2" "$TMP/mpi_first.args.hostfile" || fail "mpi_first: no 'h1 slots=2'"
run_backend slurm_hosts slurm --exclude h0:1@h1:1
[ $RC -eq 0 ] || fail "slurm --exclude h0:1@h1:1: dsrun exited $RC"
grep -qxF -- "--ntasks-per-node=1" "$TMP/slurm_hosts.args" || fail "slurm_hosts: not 1 task a node"
[ "$(tr '\n' ' ' <"$TMP/slurm_hosts.args.slurm_hostfile")" = "h0 h1 " ] ||
  fail "slurm_hosts: SLURM_HOSTFILE is not 'h0 h1': $(cat "$TMP/slurm_hosts.args.slurm_hostfile")"

# Slurm sorts a --nodelist and places tasks in its own order, so rank 0 could run on another host
# than MASTER_ADDR (the hostfile's first host). dsrun gives srun the tasks' hosts in world order
# (SLURM_HOSTFILE, one line a task) with --distribution=arbitrary, and no --nodelist (srun reads
# SLURM_HOSTFILE only without one); the file is removed when srun has ended.
printf 'h1 slots=2\nh0 slots=2\n' >"$TMP/hostfile_h1_first"
HOSTFILE=$TMP/hostfile_h1_first run_backend slurm_order slurm
[ $RC -eq 0 ] || fail "slurm, h1 listed first: dsrun exited $RC"
grep -qxF -- "--distribution=arbitrary" "$TMP/slurm_order.args" || fail "slurm_order: no --distribution=arbitrary"
expect_absent "$TMP/slurm_order.args" "--nodelist"
[ -s "$TMP/slurm_order.args.slurm_hostfile" ] || fail "slurm_order: srun saw no SLURM_HOSTFILE"
[ "$(tr '\n' ' ' <"$TMP/slurm_order.args.slurm_hostfile")" = "h1 h1 h0 h0 " ] ||
  fail "slurm_order: SLURM_HOSTFILE is not 'h1 h1 h0 h0': $(cat "$TMP/slurm_order.args.slurm_hostfile")"
expect_contains "$TMP/slurm_order.args" "MASTER_ADDR=h1,"
[ -e "$(cat "$TMP/slurm_order.args.slurm_hostfile_path")" ] && fail "slurm_order: SLURM_HOSTFILE left behind"

# --ssh_port reaches mpirun's ssh as --mca plm_rsh_args "-p P" (it was dropped), after the user's
# own OMPI_MCA_plm_rsh_args (which a --mca on the command line would otherwise replace); a
# plm_rsh_args in --launcher_args too is refused, naming both.
rsh_args_of() { grep -A1 -xF plm_rsh_args "$TMP/$1.args" | tail -n1; }
run_backend mpi_port openmpi --ssh_port 2222
[ $RC -eq 0 ] || fail "openmpi --ssh_port 2222: dsrun exited $RC"
[ "$(rsh_args_of mpi_port)" = "-p 2222" ] || fail "mpi_port: plm_rsh_args is '$(rsh_args_of mpi_port)'"
OMPI_MCA_plm_rsh_args="-F my config" run_backend mpi_port_env openmpi --ssh_port 2222
[ $RC -eq 0 ] || fail "openmpi --ssh_port 2222 with OMPI_MCA_plm_rsh_args: dsrun exited $RC"
[ "$(rsh_args_of mpi_port_env)" = "-F my config -p 2222" ] ||
  fail "mpi_port_env: plm_rsh_args is '$(rsh_args_of mpi_port_env)'"
run_backend mpi_no_port openmpi
[ $RC -eq 0 ] || fail "openmpi without --ssh_port: dsrun exited $RC"
expect_absent "$TMP/mpi_no_port.args" "plm_rsh_args"
run_backend mpi_port_twice openmpi --ssh_port 2222 --launcher_args "--mca plm_rsh_args -q"
[ $RC -eq 2 ] || fail "mpi_port_twice: dsrun exited $RC, expected 2"
expect_contains "$TMP/mpi_port_twice.err" \
  "dsrun: --ssh_port 2222 and --launcher_args' --mca plm_rsh_args both set mpirun's ssh options"
[ -e "$TMP/mpi_port_twice.args" ] && fail "mpi_port_twice: the mpirun stand-in ran"

no_leftovers
echo "PASS mpi_slot_selection"
