# DeepSpeed's single-node commands: without a hostfile the pool is {localhost: device count}, so
# `--num_nodes 1` and `--include/--exclude localhost:...` work on it (the ranks get the chosen slot
# ids as CUDA_VISIBLE_DEVICES, as on a hostfile's host); --num_nodes > 1 needs a hostfile. A
# one-host hostfile in OpenMPI's style (`slots=2 max_slots=2`) runs here too, whatever --launcher
# says (DeepSpeed's multi_node_exec = force_multi or more than one host; openmpi and slurm once
# went to mpirun/srun for one host), unless --force_multi.
source "$(dirname "$0")/common.bash" "$1"
# The pool's size is the device count; CUDA_VISIBLE_DEVICES fixes it at 4 whatever this machine has.
export CUDA_VISIBLE_DEVICES=0,1,2,3

# check_ranks NAME COUNT VISIBLE: COUNT ranks ran, each with CUDA_VISIBLE_DEVICES=VISIBLE.
check_ranks() {
  local name=$1 n=$2 visible=$3 k
  [ $RC -eq 0 ] || fail "$name: dsrun exited $RC"
  for ((k = 0; k < n; k++)); do
    for kv in RANK=$k LOCAL_RANK=$k WORLD_SIZE=$n CUDA_VISIBLE_DEVICES=$visible; do
      grep -qxF -- "[rank $k] env $kv" "$TMP/$name.out" || fail "$name: missing '[rank $k] env $kv'"
    done
  done
  expect_absent "$TMP/$name.out" "[rank $n]"
}

run_dsrun nodes1 --num_nodes 1 --num_gpus 2 --master_port "$(free_port)" "$WORKER" --mode ok \
  --marker "$MARKER"
check_ranks nodes1 2 0,1,2,3  # no selection: the ranks keep the environment's devices

run_dsrun include --include localhost:1,3 --master_port "$(free_port)" "$WORKER" --mode ok \
  --marker "$MARKER"
check_ranks include 2 1,3

run_dsrun exclude --exclude localhost:0 --num_nodes 1 --master_port "$(free_port)" "$WORKER" \
  --mode ok --marker "$MARKER"
check_ranks exclude 3 1,2,3

run_dsrun include_n --include localhost --num_procs 2 --master_port "$(free_port)" "$WORKER" \
  --mode ok --marker "$MARKER"
check_ranks include_n 2 0,1

printf 'localhost slots=2 max_slots=2  # OpenMPI style\n' >"$TMP/hostfile"
run_dsrun mpi_style --hostfile "$TMP/hostfile" --master_port "$(free_port)" "$WORKER" --mode ok \
  --marker "$MARKER"
check_ranks mpi_style 2 0,1

# One host under --launcher openmpi/slurm: here, not through mpirun/srun (stand-ins say if they ran).
mkdir -p "$TMP/bin"
printf '#!/bin/sh\necho "stand-in $(basename "$0") ran"\n' >"$TMP/bin/mpirun"
cp "$TMP/bin/mpirun" "$TMP/bin/srun"
chmod +x "$TMP/bin/mpirun" "$TMP/bin/srun"
for launcher in openmpi slurm; do
  PATH="$TMP/bin:$PATH" run_dsrun one_$launcher --hostfile "$TMP/hostfile" --launcher $launcher \
    --master_port "$(free_port)" "$WORKER" --mode ok --marker "$MARKER"
  check_ranks one_$launcher 2 0,1
  expect_absent "$TMP/one_$launcher.out" "stand-in"
done
PATH="$TMP/bin:$PATH" run_dsrun forced --hostfile "$TMP/hostfile" --launcher openmpi --force_multi \
  --no_ssh_check "$WORKER" --mode ok --marker "$MARKER"
[ $RC -eq 0 ] || fail "--force_multi --launcher openmpi: dsrun exited $RC"
expect_contains "$TMP/forced.out" "stand-in mpirun ran"

# Errors before anything starts (exit 2, nothing on stdout).
run_dsrun nodes2 --num_nodes 2 "$WORKER" --mode ok --marker "$MARKER"
[ $RC -eq 2 ] || fail "--num_nodes 2 without a hostfile: dsrun exited $RC, expected 2"
expect_contains "$TMP/nodes2.err" "dsrun: --num_nodes 2 needs a --hostfile listing the hosts"
run_dsrun other_host --include worker-1 "$WORKER" --mode ok --marker "$MARKER"
[ $RC -eq 2 ] || fail "--include of another host without a hostfile: dsrun exited $RC, expected 2"
expect_contains "$TMP/other_host.err" \
  "--include 'worker-1': host worker-1 is not in the pool without a hostfile (localhost)"
run_dsrun no_slot --include localhost:4 "$WORKER" --mode ok --marker "$MARKER"
[ $RC -eq 2 ] || fail "--include localhost:4 of 4 slots: dsrun exited $RC, expected 2"
expect_contains "$TMP/no_slot.err" "host localhost has no slot 4"
CUDA_VISIBLE_DEVICES=2,3 run_dsrun renumbered --include localhost:1 "$WORKER" --mode ok \
  --marker "$MARKER"
[ $RC -eq 2 ] || fail "--include under CUDA_VISIBLE_DEVICES=2,3: dsrun exited $RC, expected 2"
expect_contains "$TMP/renumbered.err" "CUDA_VISIBLE_DEVICES=2,3 already chooses and renumbers them"
for name in nodes2 other_host no_slot renumbered; do
  [ -s "$TMP/$name.out" ] && fail "$name: something was started"
done

# Without --num_procs/--num_gpus (and no hostfile or selection): one rank per visible GPU, as
# DeepSpeed's `deepspeed train.py` (its pool is {localhost: device count}); the ranks keep the
# user's CUDA_VISIBLE_DEVICES. No GPU (the variable empty, or unset without /dev/nvidiaN): the
# CPU accelerator's device count, LOCAL_SIZE when set, else one rank per NUMA node with CPUs.
unset LOCAL_SIZE
CUDA_VISIBLE_DEVICES=0,1,2 run_dsrun per_gpu --master_port "$(free_port)" "$WORKER" --mode ok \
  --marker "$MARKER"
check_ranks per_gpu 3 0,1,2
CUDA_VISIBLE_DEVICES=0,1,2 run_dsrun given --num_procs 2 --master_port "$(free_port)" "$WORKER" \
  --mode ok --marker "$MARKER"
check_ranks given 2 0,1,2  # an explicit count wins
CUDA_VISIBLE_DEVICES= LOCAL_SIZE=2 run_dsrun hidden --master_port "$(free_port)" "$WORKER" \
  --mode ok --marker "$MARKER"
check_ranks hidden 2 ""
unset CUDA_VISIBLE_DEVICES
gpus=$(ls /dev | grep -cE '^nvidia[0-9]+$')
# The NUMA nodes with CPUs, a node listing the last counted node's CPUs (fake NUMA) once; 1 when
# none can be read (the unit test dsrun_cpu_devices_test covers the cases).
numa=0 last=""
for cpus in $(ls -d /sys/devices/system/node/node[0-9]* 2>/dev/null | sort -V |
              while read -r node; do echo "x$(cat "$node/cpulist" 2>/dev/null)"; done); do
  [ "$cpus" = x ] || [ "$cpus" = "$last" ] || { numa=$((numa + 1)); last=$cpus; }
done
run_dsrun unset --master_port "$(free_port)" "$WORKER" --mode ok --marker "$MARKER"
check_ranks unset $((gpus > 0 ? gpus : (numa > 0 ? numa : 1))) "<unset>"

no_leftovers
echo "PASS local_host_selection"
