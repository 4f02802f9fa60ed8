# Every child dsrun starts holds its own pipes and no other child's: the pipes are close-on-exec
# in dsrun (spawn_piped). A child that inherited a sibling's pipe would hold it open: a node
# launcher holding another node's stdin keeps that node's agent running after dsrun is gone, and
# a host check holding another check's output keeps it from ending until both have. Checked for
# local ranks, for the concurrent host checks and for the node launchers of a multi-node job (a
# stand-in `ssh` on PATH runs the remote command here, as in host_check_fanout.sh). Each child
# lists its descriptors (ls -l /proc/PID/fd); a pipe is named by its inode, the same at both ends.
source "$(dirname "$0")/common.bash" "$1"

mkdir -p "$TMP/bin" "$TMP/fds" "$TMP/work"

# check_disjoint WHAT FILE...: each FILE is one child's listing; the pipes on its descriptors 0-2
# must appear in no other FILE. Prints the pipes each listing holds, for a failure's message.
check_disjoint() {
  local what=$1
  shift
  python3 - "$@" <<'PY' || fail "$what: a child holds another child's pipe (see above)"
import re, sys
own, held = {}, {}
for path in sys.argv[1:]:
    pairs = re.findall(r" (\d+) -> pipe:\[(\d+)\]", open(path).read())
    own[path] = {inode for fd, inode in pairs if int(fd) <= 2}
    held[path] = {inode for fd, inode in pairs}
bad = [(p, q, own[p] & held[q]) for p in own for q in held if p != q and own[p] & held[q]]
for p, q, inodes in bad:
    print(f"{q} holds pipe(s) {sorted(inodes)} of {p}", file=sys.stderr)
if not all(own.values()):
    print("a listing has no pipe on descriptors 0-2: " + str(own), file=sys.stderr)
    sys.exit(1)
sys.exit(1 if bad else 0)
PY
}

# 1. Local ranks: each lists its own descriptors on its stdout.
run_dsrun local --no_local_rank --num_procs 3 --master_port "$(free_port)" \
  /bin/sh -c 'ls -l /proc/$$/fd; : '"$MARKER"
[ $RC -eq 0 ] || fail "three local ranks: dsrun exited $RC"
for r in 0 1 2; do
  sed -n "s/^\[rank $r\] //p" "$TMP/local.out" >"$TMP/fds/rank$r"
  grep -q " 1 -> pipe:" "$TMP/fds/rank$r" || fail "rank $r: its stdout is not a pipe"
done
check_disjoint "local ranks" "$TMP/fds"/rank*

# 2. Three stand-in hosts: the checks (run at once) and the node launchers list their descriptors.
cat >"$TMP/bin/ssh" <<'SH'
#!/bin/bash
# ssh [OPTIONS] HOST COMMAND: the host is the next-to-last word, the command the last.
host=${@: -2:1} cmd=${@: -1}
if [[ $cmd == *--preflight* ]]; then kind=check; else kind=launch; fi
ls -l /proc/$$/fd >"$FDS/$kind.$host"
if [ $kind = check ]; then
  # Held until every host's check has listed its descriptors: all three checks are alive at once.
  for ((i = 0; i < 100 && $(ls "$FDS" | grep -c '^check\.') < 3; i++)); do sleep 0.1; done
fi
exec /bin/sh -c "$cmd"
SH
chmod +x "$TMP/bin/ssh"
printf 'h0 slots=1\nh1 slots=1\nh2 slots=1\n' >"$TMP/hostfile"
cd "$TMP/work" || fail "cd $TMP/work"
rm -f "$TMP/fds"/*
PATH="$TMP/bin:$PATH" FDS="$TMP/fds" timeout -s KILL 60 "$DSRUN" --hostfile "$TMP/hostfile" \
  --master_port "$(free_port)" "$WORKER" --mode ok --marker "$MARKER" \
  >"$TMP/nodes.out" 2>"$TMP/nodes.err"
RC=$?
[ $RC -ne 137 ] || fail "dsrun over three stand-in hosts hung"
[ $RC -eq 0 ] || fail "three stand-in hosts: dsrun exited $RC"
for h in h0 h1 h2; do
  [ -s "$TMP/fds/check.$h" ] || fail "no host check of $h ran"
  [ -s "$TMP/fds/launch.$h" ] || fail "no node launcher of $h ran"
  grep -q " 0 -> pipe:" "$TMP/fds/launch.$h" || fail "the node launcher of $h: stdin is not a pipe"
done
check_disjoint "host checks" "$TMP/fds"/check.*
check_disjoint "node launchers" "$TMP/fds"/launch.*
no_leftovers
echo "PASS child_descriptors"
