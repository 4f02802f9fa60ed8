# dsrun gives each rank RANK/LOCAL_RANK/WORLD_SIZE/... and --local_rank=K, prefixes every line
# with "[rank K] " on the stream it came from, and passes the program's own arguments untouched.
source "$(dirname "$0")/common.bash" "$1"

NPROC=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc itself obeys OMP_NUM_THREADS
for N in 1 2 3 4; do
  PORT=$(free_port)
  env -u OMP_NUM_THREADS "$DSRUN" --num_procs $N --master_port $PORT "$WORKER" --mode ok \
    --num_procs 99 --marker "$MARKER" >"$TMP/n$N.out" 2>"$TMP/n$N.err"
  RC=$?
  [ $RC -eq 0 ] || fail "N=$N: dsrun exited $RC"
  OMP=$(( NPROC / N )); [ $OMP -ge 1 ] || OMP=1
  for ((k = 0; k < N; k++)); do
    P="[rank $k] "
    for kv in RANK=$k LOCAL_RANK=$k WORLD_SIZE=$N LOCAL_SIZE=$N MASTER_ADDR=127.0.0.1 \
              MASTER_PORT=$PORT CROSS_RANK=0 CROSS_SIZE=1 OMP_NUM_THREADS=$OMP LOCAL_WORLD_SIZE=$N \
              NODE_RANK=0 GROUP_RANK=0 DSRUN_RESTART_COUNT=0 CUDA_VISIBLE_DEVICES='<unset>'; do
      grep -qxF -- "${P}env $kv" "$TMP/n$N.out" || fail "N=$N: missing line '${P}env $kv'"
    done
    # DeepSpeed's order: --local_rank right after the program, then the user's arguments.
    grep -qxF -- "${P}argv[1]=--local_rank=$k" "$TMP/n$N.out" || fail "N=$N: rank $k lacks --local_rank=$k"
    grep -qxF -- "${P}argv[3]=ok" "$TMP/n$N.out" || fail "N=$N: rank $k argv shifted"
    grep -qxF -- "${P}argv[4]=--num_procs" "$TMP/n$N.out" || fail "N=$N: program args not passed through"
    # The partial last line is flushed as a line of its own.
    grep -qxF -- "${P}partial line without newline" "$TMP/n$N.out" || fail "N=$N: partial line lost"
    grep -qxF -- "${P}stderr line from rank $k" "$TMP/n$N.err" || fail "N=$N: stderr line missing"
  done
  expect_absent "$TMP/n$N.out" "stderr line"
  expect_absent "$TMP/n$N.out" "[rank $N]"
  bad=$(grep -cv '^\[rank [0-9]*\] ' "$TMP/n$N.out")
  [ "$bad" -eq 0 ] || fail "N=$N: $bad stdout lines without a rank prefix"
  [ "$(wc -l <"$TMP/n$N.out")" -eq $((N * 24)) ] || fail "N=$N: expected $((N * 24)) stdout lines"
done

# A user's OMP_NUM_THREADS is kept; --num_gpus is --num_procs; --no_local_rank drops the flag.
PORT=$(free_port)
OMP_NUM_THREADS=7 "$DSRUN" --num_gpus 2 --no_local_rank --master_addr localhost --master_port $PORT \
  "$WORKER" --mode ok --marker "$MARKER" >"$TMP/opts.out" 2>"$TMP/opts.err" || fail "options run failed"
expect_contains "$TMP/opts.out" "[rank 1] env OMP_NUM_THREADS=7"
expect_contains "$TMP/opts.out" "[rank 1] env WORLD_SIZE=2"
expect_contains "$TMP/opts.out" "[rank 0] env MASTER_ADDR=localhost"
expect_contains "$TMP/opts.out" "[rank 0] argv[1]=--mode"
expect_absent "$TMP/opts.out" "--local_rank"

# Per-rank log files hold that rank's lines, unprefixed, stdout and stderr together.
PORT=$(free_port)
"$DSRUN" --num_procs 2 --master_port $PORT --enable_each_rank_log "$TMP/logs" "$WORKER" --mode ok \
  --marker "$MARKER" >"$TMP/logs.out" 2>"$TMP/logs.err" || fail "log run failed"
for k in 0 1; do
  LOG=$(ls "$TMP"/logs/*_rank$k.log 2>/dev/null | head -n1)
  [ -n "$LOG" ] || fail "no log file for rank $k in $TMP/logs: $(ls "$TMP/logs")"
  grep -qxF "env RANK=$k" "$LOG" || fail "$LOG lacks 'env RANK=$k'"
  grep -qxF "stderr line from rank $k" "$LOG" || fail "$LOG lacks its stderr line"
  expect_absent "$LOG" "[rank"
done

no_leftovers
echo "PASS env_and_local_rank"
