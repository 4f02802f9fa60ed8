# A /dev/shm too small for the shared-memory all-reduce's segment (Docker's default is 64 MiB; the
# segment is 4 slots x ranks x 1 MiB per group): tmpfs sizes files sparsely, so without reserving
# the pages up front the first copy into a slot beyond the room would kill the rank with SIGBUS
# and no message. The group must fall back to Gloo instead, saying why, and the job succeed.
# Runs in a private mount namespace with a one-page tmpfs on /dev/shm (skipped where that is not
# permitted): tmpfs counts pages touched, not file sizes, and one all-reduce of 16 floats touches
# a page of the segment beyond its header page, which needs no more room than that.
source "$(dirname "$0")/common.bash" "$1"

skip() {
  echo "SKIPPED: $*"
  exit 77
}
why=$(unshare -m --propagation private sh -c 'mount -t tmpfs -o size=4k tmpfs /dev/shm' 2>&1) ||
  skip "cannot mount a small tmpfs on /dev/shm in a private mount namespace (unshare -m: $why)"

PORT=$(free_port)
# linger_exit: every rank joins init_distributed() and all-reduces 16 floats once
# (small enough for the shared-memory path); each rank prints the sum.
timeout -s KILL 45 unshare -m --propagation private sh -c \
  'mount -t tmpfs -o size=4k tmpfs /dev/shm && exec "$@"' sh \
  "$DSRUN" --num_procs 2 --master_port "$PORT" "$COMM_WORKER" --mode linger_exit --seconds 0 \
  --timeout 30 --marker "$MARKER" >"$TMP/small.out" 2>"$TMP/small.err"
RC=$?
[ $RC -ne 137 ] || fail "dsrun hung (killed by the test's timeout)"
[ $RC -eq 0 ] || fail "dsrun exited $RC, expected 0"
expect_contains "$TMP/small.out" "rank 0 sum 2"
expect_contains "$TMP/small.err" "shared-memory all-reduce off for this group"
expect_contains "$TMP/small.err" "segment /dev/shm/ds_shm_"
expect_contains "$TMP/small.err" "(posix_fallocate: No space left on device)"
grep -m1 "shared-memory all-reduce off" "$TMP/small.err"
no_leftovers
echo "PASS shm_small_dev_shm"
