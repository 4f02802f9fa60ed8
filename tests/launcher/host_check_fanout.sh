# dsrun checks every host of a multi-node job at once, not one ssh after another (a 64-node job
# waited for 64 ssh round trips before anything started). A stand-in `ssh` on PATH runs the remote
# command on this machine, but holds each host check until every host's check has begun: checks
# run one at a time never all begin, so the held one gives up and fails like a lost connection.
# Also: with several hosts failing, the first in hostfile order is named (whichever answered
# first) and the others are counted; nothing starts. Needs no root or network namespaces.
source "$(dirname "$0")/common.bash" "$1"

mkdir -p "$TMP/bin" "$TMP/checks" "$TMP/work"
cat >"$TMP/bin/ssh" <<'SH'
#!/bin/bash
# ssh [OPTIONS] HOST COMMAND: the host is the next-to-last word, the command the last.
host=${@: -2:1} cmd=${@: -1}
if [[ $cmd == *--preflight* ]]; then
  : >"$CHECKS/$host"
  for ((i = 0; i < 80; i++)); do
    [ "$(ls "$CHECKS" | wc -l)" -ge "$HOSTS" ] && break
    sleep 0.1
  done
  if [ "$(ls "$CHECKS" | wc -l)" -lt "$HOSTS" ]; then
    echo "stand-in ssh: the check of $host ran alone ($(ls "$CHECKS" | wc -l) of $HOSTS begun)" >&2
    exit 255
  fi
  for bad in $FAIL_HOSTS; do
    [ "$host" = "$bad" ] && { echo "ssh: connect to host $host port 22: Connection refused" >&2; exit 255; }
  done
fi
exec /bin/sh -c "$cmd"
SH
chmod +x "$TMP/bin/ssh"
printf 'h0 slots=1\nh1 slots=1\nh2 slots=1\n' >"$TMP/hostfile"
cd "$TMP/work" || fail "cd $TMP/work"

# run_fake NAME [VAR=VALUE...]: dsrun over the three stand-in hosts.
run_fake() {
  local name=$1
  shift
  rm -f "$TMP/checks"/*
  env "$@" PATH="$TMP/bin:$PATH" CHECKS="$TMP/checks" HOSTS=3 \
    timeout -s KILL 60 "$DSRUN" --hostfile "$TMP/hostfile" --master_port "$(free_port)" "$WORKER" \
    --mode ok --marker "$MARKER" >"$TMP/$name.out" 2>"$TMP/$name.err"
  RC=$?
  [ $RC -ne 137 ] || fail "dsrun $name hung"
}

run_fake all_pass
[ $RC -eq 0 ] || fail "three hosts: dsrun exited $RC: $(tail -3 "$TMP/all_pass.err")"
for r in 0 1 2; do expect_contains "$TMP/all_pass.out" "[h$r rank $r] env RANK=$r"; done
expect_absent "$TMP/all_pass.err" "ran alone"
no_leftovers

run_fake two_fail FAIL_HOSTS="h2 h1"
[ $RC -eq 2 ] || fail "two hosts failing their check: dsrun exited $RC, expected 2"
expect_contains "$TMP/two_fail.err" \
  "cannot reach host h1 over ssh: ssh: connect to host h1 port 22: Connection refused"
expect_contains "$TMP/two_fail.err" "; the check failed on 1 more host too: h2"
[ -s "$TMP/two_fail.out" ] && fail "two hosts failing their check: something was started"
no_leftovers
echo "PASS host_check_fanout"
