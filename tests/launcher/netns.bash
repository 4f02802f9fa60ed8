# Several "hosts" on one machine for the multi-node launcher tests (sourced after common.bash; not a
# test itself). Each host is a network namespace with one veth link (eth0, 10.213.0.K+1/24) to a
# bridge that lives in a namespace of its own, and an sshd listening on that address with a
# throw-away host key; root logs in with a throw-away key. Nothing is added to the machine's own
# network namespace, so all traffic stays inside these namespaces and parallel tests do not meet.
#
#   netns_setup N        creates hosts 0..N-1 (HOSTS[K] = address, NS[K] = namespace), writes
#                        $TMP/hostfile (2 slots each) and $TMP/ssh/config; exits 77 (skipped) with
#                        the reason when the machine cannot do it (not root, no namespaces, no sshd)
#   on_host K CMD...     runs CMD in host K's namespace
#   cut_link K / mend_link K   takes host K's link down / up at the bridge (host K stays alive)
#   shape_links RATE / link_tx_bytes K   tbf on every link; bytes host K sent (benchmarks)
#   SSH_ARGS             --launcher_args value that makes dsrun's ssh use the generated config
# The launching dsrun runs on host 0 (on_host 0 "$DSRUN" ...), as on a real cluster's first node.

NETNS_PREFIX="dsrun$$"
NS=()
HOSTS=()
SSHD_PIDS=()

skip() {
  echo "SKIPPED: $*"
  exit 77
}

netns_cleanup() {
  local pid ns
  for pid in "${SSHD_PIDS[@]}"; do kill -9 "$pid" 2>/dev/null; done
  # Processes left in a namespace (ranks of a failed test) would keep its veth alive: kill them.
  for ns in "${NS[@]}" "${NETNS_PREFIX}br"; do
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
  cleanup
}
trap netns_cleanup EXIT

netns_setup() {
  local n=$1 k
  [ "$(id -u)" -eq 0 ] || skip "network-namespace hosts need root"
  [ -x /usr/sbin/sshd ] || skip "no /usr/sbin/sshd (Debian package openssh-server)"
  command -v ssh-keygen >/dev/null || skip "no ssh-keygen (openssh-client)"
  local br="${NETNS_PREFIX}br"
  ip netns add "$br" 2>/dev/null || skip "cannot create network namespaces (ip netns add failed)"
  # In a chroot `ip netns add` can half-work (the namespace exists but cannot be entered): skip
  # there too, naming what failed, rather than fail a machine that cannot host these tests.
  local why
  why=$(ip -n "$br" link add br0 type bridge 2>&1) ||
    skip "network namespaces do not work here (ip -n $br link add br0 type bridge: $why)"
  ip -n "$br" link set br0 up
  ip -n "$br" link set lo up

  mkdir -p "$TMP/ssh" /run/sshd
  ssh-keygen -q -t ed25519 -N '' -f "$TMP/ssh/host_key" || fail "ssh-keygen (host key)"
  ssh-keygen -q -t ed25519 -N '' -f "$TMP/ssh/id" || fail "ssh-keygen (client key)"
  cp "$TMP/ssh/id.pub" "$TMP/ssh/authorized_keys"
  cat >"$TMP/ssh/config" <<EOF
Host *
  User root
  IdentityFile $TMP/ssh/id
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
EOF
  SSH_ARGS="-F $TMP/ssh/config"
  : >"$TMP/hostfile"
  for ((k = 0; k < n; k++)); do
    local ns="${NETNS_PREFIX}h$k" addr="10.213.0.$((k + 1))"
    ip netns add "$ns" || fail "ip netns add $ns"
    NS+=("$ns")
    HOSTS+=("$addr")
    why=$(ip link add "vh$$_$k" type veth peer name "vb$$_$k" 2>&1) ||
      skip "cannot create veth pairs here (ip link add ... type veth: $why)"
    ip link set "vh$$_$k" netns "$ns"
    ip link set "vb$$_$k" netns "$br"
    ip -n "$ns" link set "vh$$_$k" name eth0
    ip -n "$ns" addr add "$addr/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    ip -n "$br" link set "vb$$_$k" master br0
    ip -n "$br" link set "vb$$_$k" up
    cat >"$TMP/ssh/sshd_$k.conf" <<EOF
ListenAddress $addr
Port 22
HostKey $TMP/ssh/host_key
AuthorizedKeysFile $TMP/ssh/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile none
LogLevel ERROR
EOF
    ip netns exec "$ns" /usr/sbin/sshd -D -e -f "$TMP/ssh/sshd_$k.conf" 2>"$TMP/sshd_$k.log" &
    SSHD_PIDS+=($!)
    disown $!  # no "Killed" notice from bash when the cleanup kills it
    echo "$addr slots=2" >>"$TMP/hostfile"
  done
  # Ready when host 0 can log in to every host.
  for ((k = 0; k < n; k++)); do
    local i
    for ((i = 0; i < 50; i++)); do
      on_host 0 ssh $SSH_ARGS -o BatchMode=yes -o ConnectTimeout=2 "${HOSTS[$k]}" true 2>/dev/null && break
      sleep 0.1
    done
    [ $i -lt 50 ] || fail "cannot ssh from host 0 to host $k (${HOSTS[$k]}): $(cat "$TMP/sshd_$k.log")"
  done
}

on_host() {
  local k=$1
  shift
  ip netns exec "${NS[$k]}" "$@"
}

cut_link() { ip -n "${NETNS_PREFIX}br" link set "vb$$_$1" down; }
mend_link() { ip -n "${NETNS_PREFIX}br" link set "vb$$_$1" up; }

# shape_links RATE: tbf on every host's egress (RATE as tc takes it: 1gbit, 10gbit); "" removes
# it. The benchmarks' slow links (netem, for delay, is not in this kernel).
shape_links() {
  local k burst=256kb
  [ "$1" = 10gbit ] && burst=2mb  # a burst below rate/HZ would cap the rate lower
  for ((k = 0; k < ${#NS[@]}; k++)); do
    on_host "$k" tc qdisc del dev eth0 root 2>/dev/null
    if [ -n "$1" ]; then
      on_host "$k" tc qdisc add dev eth0 root tbf rate "$1" burst "$burst" latency 100ms ||
        fail "tc tbf $1 on host $k"
    fi
  done
}
# link_tx_bytes K: bytes host K has sent on its link so far.
link_tx_bytes() { on_host "$1" cat /sys/class/net/eth0/statistics/tx_bytes; }

# run_on_host0 NAME ARGS...: dsrun on host 0 with a hard limit; sets RC, writes $TMP/NAME.out/.err.
run_on_host0() {
  local name=$1
  shift
  timeout -s KILL 60 ip netns exec "${NS[0]}" "$DSRUN" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
  RC=$?
  [ $RC -ne 137 ] || fail "dsrun $* hung (killed by the test's timeout)"
}

# --- helpers of the benchmarks over these hosts (bench/*_bench.sh) ---

# write_hostfile FILE SLOTS: every host with SLOTS slots.
write_hostfile() {
  local h
  : >"$1"
  for h in "${HOSTS[@]}"; do echo "$h slots=$2" >>"$1"; done
}

# report_field FILE NAME: NAME=value from rank 0's gpt_train_report line in FILE.
report_field() {
  grep -oE "gpt_train_report rank=0 .*" "$1" | grep -oE " $2=[0-9.]+" | head -1 | cut -d= -f2
}

# sent_per_step NAME HOSTFILE STEPS CMD...: runs CMD under dsrun across the hosts twice, for STEPS
# and 2·STEPS steps, and sets SENT to the bytes host 1 put on its link per step: the difference of
# the two runs divided by STEPS, so start-up and warm-up cancel out. The longer run goes last, so
# $TMP/NAME.out holds its report.
sent_per_step() {
  local name=$1 hostfile=$2 steps=$3 n before after
  shift 3
  SENT=0
  for n in "$steps" $((2 * steps)); do
    before=$(link_tx_bytes 1)
    run_on_host0 "$name" --hostfile "$hostfile" --launcher_args "$SSH_ARGS" \
      --master_port "$(free_port)" "$@" --steps "$n"
    [ "$RC" -eq 0 ] || fail "$name ($n steps): dsrun exited $RC: $(tail -3 "$TMP/$name.err")"
    after=$(link_tx_bytes 1)
    SENT=$((after - before - SENT))
  done
  SENT=$((SENT / steps))
}
