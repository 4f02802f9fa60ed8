# --launcher openmpi and slurm start the ranks through mpirun/srun, which place a host's ranks on
# its devices 0..k-1 and set no CUDA_VISIBLE_DEVICES: an --include/--exclude choosing other slots
# is refused (exit 2, naming the flags, the launcher and the host) instead of being silently cut
# down to a slot count (it once was). Whole hosts and a host's first slots stay allowed. Stand-in
# mpirun and srun record their arguments; nothing reaches another host.
source "$(dirname "$0")/common.bash" "$1"

mkdir -p "$TMP/bin"
cat >"$TMP/bin/mpirun" <<'SH'
#!/bin/sh
printf '%s\n' "$@" >"$LAUNCHER_ARGS"
while [ $# -gt 0 ]; do [ "$1" = -hostfile ] && cat "$2" >>"$LAUNCHER_ARGS.hostfile"; shift; done
SH
cp "$TMP/bin/mpirun" "$TMP/bin/srun"
chmod +x "$TMP/bin/mpirun" "$TMP/bin/srun"
printf 'h0 slots=2\nh1 slots=2\n' >"$TMP/hostfile"

# run_backend NAME LAUNCHER SELECTION...: dsrun on the two-host hostfile through the stand-ins;
# the stand-in's arguments go to $TMP/NAME.args (and the MPI hostfile to $TMP/NAME.args.hostfile).
run_backend() {
  local name=$1 launcher=$2
  shift 2
  PATH="$TMP/bin:$PATH" LAUNCHER_ARGS="$TMP/$name.args" run_dsrun "$name" \
    --hostfile "$TMP/hostfile" --launcher "$launcher" --no_ssh_check "$@" \
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

no_leftovers
echo "PASS mpi_slot_selection"
