# A rank printing faster than dsrun's stdout takes (a terminal, `| tee`, ssh) must not take the
# supervisor hostage: another rank's failure and signals to dsrun are still acted on, lines stay
# whole, and a rank's last words are not lost. (Before: dsrun wrote with blocking writes until the
# flooding rank's pipe was empty, which it never was, and hung.)
source "$(dirname "$0")/common.bash" "$1"

# The slow reader: 4 KiB per millisecond (or, with STOP_AFTER, nothing more after that many
# bytes: a stuck terminal; it creates $STOPPED when it stops reading). Creates $FLOWING once 1 MiB
# went through, and at EOF prints how many lines it saw, how many were not one whole prefixed
# line, and how many held a rank's last words.
# Usage: python3 -c "$READER" FLOWING STOP_AFTER STOPPED MARKER
READER='
import os, sys, time
flowing, stop_after, stopped = sys.argv[1], int(sys.argv[2]), sys.argv[3]
seen = lines = bad = last_words = 0
rest = b""
while True:
    data = sys.stdin.buffer.read(4096)
    if not data:
        break
    seen += len(data)
    if seen >= 1 << 20 and not os.path.exists(flowing):
        open(flowing, "w").close()
    if stop_after and seen >= stop_after:
        open(stopped, "w").close()
        time.sleep(60)
    parts = (rest + data).split(b"\n")
    rest = parts.pop()
    for line in parts:
        lines += 1
        if not line.startswith((b"[rank 0] ", b"[rank 1] ")) or line.count(b"[rank ") != 1:
            bad += 1
        if b"last words" in line:
            last_words += 1
    time.sleep(0.001)
print("lines=%d bad=%d last_words=%d" % (lines, bad, last_words + (b"last words" in rest)))
'

# Rank 0 floods stdout with `yes`; rank 1 waits until the flood is under way (the reader has taken
# 1 MiB), says its last words and exits 3. dsrun must stop rank 0 and exit 3.
FLOOD='if [ "$RANK" = 0 ]; then exec yes "$0"; fi
for i in $(seq 300); do [ -e "$1" ] && break; sleep 0.1; done
echo "rank 1 last words"; exit 3'
timeout -s KILL 40 "$DSRUN" --num_procs 2 --kill_grace 1 --no_local_rank --master_port "$(free_port)" \
  /bin/sh -c "$FLOOD" "$MARKER" "$TMP/flowing" 2>"$TMP/fail.err" |
  python3 -c "$READER" "$TMP/flowing" 0 - "$MARKER" >"$TMP/fail.out"
RC=${PIPESTATUS[0]}
[ $RC -ne 137 ] || fail "a flooding rank held dsrun: it did not act on rank 1's exit within 40 s"
[ $RC -eq 3 ] || fail "flood + failing rank: dsrun exited $RC, expected 3"
expect_contains "$TMP/fail.err" ") exited with status 3; terminating the other rank"
grep -qE '^lines=[1-9][0-9]* bad=0 last_words=1$' "$TMP/fail.out" ||
  fail "lines cut, mixed or lost: $(cat "$TMP/fail.out")"
no_leftovers

# wait_file PATH WHAT: until PATH exists (30 s at most).
wait_file() {
  local i
  for ((i = 0; i < 300; i++)); do
    [ -e "$1" ] && return 0
    sleep 0.1
  done
  fail "$2"
}

# A reader that stops reading altogether (stdout stuck) while the job floods it: SIGTERM to dsrun
# still stops the job; dsrun waits at most --kill_grace for its stuck stdout, then drops the rest
# and exits 143. The signal is sent only once the reader has stopped, so the flood has stdout
# stuck by then.
# stuck_sigterm NAME MESSAGE DSRUN-ARGS...: the job must print "ready" on stderr once started;
# MESSAGE is what dsrun must say on stderr.
stuck_sigterm() {
  local name=$1 message=$2 i
  shift 2
  mkfifo "$TMP/$name.pipe"
  python3 -c "$READER" "$TMP/$name.flowing" $((2 << 20)) "$TMP/$name.stopped" "$MARKER" \
    <"$TMP/$name.pipe" >/dev/null &
  local reader=$!
  "$DSRUN" --kill_grace 1 --master_port "$(free_port)" "$@" >"$TMP/$name.pipe" 2>"$TMP/$name.err" &
  local dsrun=$!
  wait_for 1 "ready" "$TMP/$name.err"
  wait_file "$TMP/$name.stopped" "$name: the flood did not reach the reader (2 MiB)"
  kill -TERM $dsrun
  wait_gone $dsrun "$name: SIGTERM to a dsrun whose stdout is stuck"
  [ $RC -eq 143 ] || fail "$name: SIGTERM with stdout stuck: dsrun exited $RC, expected 143"
  expect_contains "$TMP/$name.err" "$message"
  kill $reader 2>/dev/null
  wait $reader 2>/dev/null
  no_leftovers
}

# One node: rank 0 floods, rank 1 sleeps (its stderr still gets through: another file).
stuck_sigterm local "dsrun: received SIGTERM; forwarding it to the 2 running ranks" \
  --num_procs 2 --no_local_rank /bin/sh -c \
  'if [ "$RANK" = 0 ]; then exec yes "$0"; fi; echo ready >&2; exec "$1" --mode sleep --seconds 40 --marker "$0"' \
  "$MARKER" "$WORKER"

# The multi-node launcher's loop (--launcher slurm), with a stand-in srun that floods.
mkdir -p "$TMP/bin"
printf '#!/bin/sh\necho ready >&2\nexec yes "srun $*"\n' >"$TMP/bin/srun"
chmod +x "$TMP/bin/srun"
printf 'h0 slots=1\nh1 slots=1\n' >"$TMP/hostfile"
PATH="$TMP/bin:$PATH" stuck_sigterm slurm "dsrun: received SIGTERM; stopping the job on every node" \
  --hostfile "$TMP/hostfile" --launcher slurm "$WORKER" --marker "$MARKER"

# stderr stuck when the job ends after SIGTERM, with a segment in /dev/shm left by a rank 0 that
# was SIGKILLed (it ignored SIGTERM): dsrun removes the segment and still exits within the kill
# grace. (Before: the sweep ran after the signal handling was gone and its message was written
# with a blocking write: dsrun hung on the stuck stderr.)
mkfifo "$TMP/sweep.pipe"
python3 -c "$READER" "$TMP/sweep.flowing" $((1 << 20)) "$TMP/sweep.stopped" "$MARKER" \
  <"$TMP/sweep.pipe" >/dev/null &
READER_PID=$!
"$DSRUN" --num_procs 2 --kill_grace 1 --no_local_rank --master_port "$(free_port)" /bin/sh -c \
  'if [ "$RANK" = 1 ]; then exec yes "$0" >&2; fi
   : >"/dev/shm/ds_shm_$$_0"; echo "rank 0 pid $$"; exec "$1" --mode ignore_term --marker "$0"' \
  "$MARKER" "$WORKER" >"$TMP/sweep.out" 2>"$TMP/sweep.pipe" &
DSRUN_PID=$!
wait_for 1 "ignoring SIGTERM" "$TMP/sweep.out"
RANK0_PID=$(sed -n 's/^\[rank 0\] rank 0 pid //p' "$TMP/sweep.out")
[ -e "/dev/shm/ds_shm_${RANK0_PID}_0" ] || fail "sweep: rank 0 made no segment"
wait_file "$TMP/sweep.stopped" "sweep: the flood did not reach the stderr reader (1 MiB)"
kill -TERM $DSRUN_PID
wait_gone $DSRUN_PID "sweep: SIGTERM to a dsrun whose stderr is stuck"
[ $RC -eq 143 ] || fail "sweep: dsrun exited $RC, expected 143"
if [ -e "/dev/shm/ds_shm_${RANK0_PID}_0" ]; then
  rm -f "/dev/shm/ds_shm_${RANK0_PID}_0"
  fail "sweep: the segment of rank 0 was not removed"
fi
kill $READER_PID 2>/dev/null
wait $READER_PID 2>/dev/null
no_leftovers

# dsrun's stdout is a terminal that is full (rank 0 floods it) and is then read only a little;
# rank 1 ignores SIGTERM. After SIGTERM to dsrun, rank 1 is SIGKILLed when the kill grace ends and
# dsrun exits 143. (Before: once poll() said the terminal had room, dsrun wrote PIPE_BUF bytes
# with a blocking write, but a terminal takes only what it has room for and waits for the rest;
# only a signal got dsrun out of that write, and at the end of the grace none came: dsrun hung.)
PTY='
import fcntl, os, signal, struct, subprocess, sys, termios, time
rank0_pid_file, rank1_pid_file, err_path = sys.argv[1:4]
master, slave = os.openpty()
with open(err_path, "wb") as err:
    job = subprocess.Popen(sys.argv[4:], stdin=subprocess.DEVNULL, stdout=slave, stderr=err)
os.close(slave)
def unread():
    return struct.unpack("i", fcntl.ioctl(master, termios.FIONREAD, b"\0" * 4))[0]
def wait(what, done):
    limit = time.time() + 30
    while not done():
        if time.time() > limit:
            job.kill()
            sys.exit("timed out waiting until " + what)
        time.sleep(0.05)
wait("both ranks run", lambda: os.path.exists(rank0_pid_file) and os.path.exists(rank1_pid_file))
state = {"last": -1, "since": time.time()}
def full():  # the terminal took nothing more for a second
    n = unread()
    if n != state["last"]:
        state["last"], state["since"] = n, time.time()
    return n > 0 and time.time() - state["since"] > 1
wait("the terminal is full", full)
job.send_signal(signal.SIGTERM)
rank0 = "/proc/" + open(rank0_pid_file).read().strip()
wait("dsrun reaped rank 0", lambda: not os.path.exists(rank0))
os.read(master, 4096)  # room for a few lines: dsrun writes again
try:
    print("rc=%d" % job.wait(timeout=30))
except subprocess.TimeoutExpired:
    job.kill()
    sys.exit("dsrun did not exit within 30 s of SIGTERM while its terminal was full")
'
timeout -s KILL 150 python3 -c "$PTY" "$TMP/tty0.pid" "$TMP/tty1.pid" "$TMP/tty.err" "$DSRUN" \
  --num_procs 2 --kill_grace 1 --no_local_rank --master_port "$(free_port)" /bin/sh -c \
  'if [ "$RANK" = 0 ]; then echo $$ >"$2.tmp"; mv "$2.tmp" "$2"; exec yes "$0"; fi
   exec "$1" --mode ignore_term --pid_file "$3" --marker "$0"' \
  "$MARKER" "$WORKER" "$TMP/tty0.pid" "$TMP/tty1.pid" >"$TMP/tty.out" 2>&1
[ $? -eq 0 ] || fail "terminal: $(cat "$TMP/tty.out")"
grep -qxF 'rc=143' "$TMP/tty.out" || fail "terminal: dsrun exited $(cat "$TMP/tty.out"), expected 143"
expect_contains "$TMP/tty.err" "is still running 1 s after SIGTERM; sending SIGKILL"
no_leftovers
echo "PASS output_backpressure"
