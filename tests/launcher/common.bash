# Shared by tests/launcher/*.sh (sourced; not a test itself: ctest runs only *.sh).
# Usage in a test: source "$(dirname "$0")/common.bash" "$1"
set -uo pipefail

BIN=${1:?usage: bash $0 <build>/bin}
DSRUN=$BIN/dsrun
# The lite worker has every mode but hang_collective and starts without loading libtorch;
# COMM_WORKER (linked to the library) is for the collective test only.
WORKER=$BIN/dsrun_test_worker_lite
COMM_WORKER=$BIN/dsrun_test_worker
for exe in "$DSRUN" "$WORKER" "$COMM_WORKER"; do
  [ -x "$exe" ] || { echo "FAIL: $exe not built" >&2; exit 1; }
done

# Every process a test starts carries this argument, so leftovers can be found with pgrep -f.
MARKER="dsrun_launcher_test_$$_$RANDOM"
TMP=$(mktemp -d /tmp/dsrun_test.XXXXXX)
export DSRUN_KILL_GRACE_S=${DSRUN_KILL_GRACE_S:-2}  # keep failing tests short

cleanup() {
  local pids
  pids=$(pgrep -f "$MARKER")
  [ -n "$pids" ] && kill -9 $pids 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  for f in "$TMP"/*.out "$TMP"/*.err; do
    [ -f "$f" ] && { echo "---- $f" >&2; tail -n 40 "$f" >&2; }
  done
  exit 1
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# expect_contains FILE TEXT: fixed-string match.
expect_contains() {
  grep -qF -- "$2" "$1" || fail "expected '$2' in $1"
}
# expect_absent FILE TEXT: FILE exists and does not contain TEXT (a missing file fails: grep's
# exit 2 would otherwise pass as "absent").
expect_absent() {
  [ -f "$1" ] || fail "expected $1 to exist (checking that '$2' is absent)"
  ! grep -qF -- "$2" "$1" || fail "did not expect '$2' in $1"
}

# wait_for COUNT TEXT FILE [SECONDS]: until FILE holds COUNT lines containing TEXT.
wait_for() {
  local n=$1 text=$2 file=$3 limit=${4:-30} i
  for ((i = 0; i < limit * 10; i++)); do
    local seen
    seen=$(grep -cF -- "$text" "$file" 2>/dev/null)
    [ "${seen:-0}" -ge "$n" ] && return 0
    sleep 0.1
  done
  fail "timed out waiting for $n lines with '$text' in $file"
}

# wait_gone PID WHAT [SECONDS]: bounded wait (default 30 s) for a background dsrun to exit; sets RC
# to its exit status. A dsrun still running then fails the test naming WHAT, instead of hanging
# until ctest's timeout.
wait_gone() {
  local pid=$1 what=$2 limit=${3:-30} i
  for ((i = 0; i < limit * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -0 "$pid" 2>/dev/null && fail "$what: dsrun still running after $limit s"
  wait "$pid"
  RC=$?
}

# no_leftovers: every process carrying MARKER is gone (allowing a moment for the kernel to reap).
no_leftovers() {
  local i
  for ((i = 0; i < 30; i++)); do
    pgrep -f "$MARKER" >/dev/null || return 0
    sleep 0.1
  done
  fail "processes left behind: $(pgrep -af "$MARKER")"
}

# run_dsrun NAME ARGS...: runs dsrun in the foreground with a hard limit; sets RC, writes
# $TMP/NAME.out and $TMP/NAME.err.
run_dsrun() {
  local name=$1
  shift
  timeout -s KILL 45 "$DSRUN" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
  RC=$?
  [ $RC -ne 137 ] || fail "dsrun $* hung (killed by the test's timeout)"
}
