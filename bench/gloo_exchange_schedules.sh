#!/bin/bash
# An all-to-all among 2 network-namespace hosts x PER_HOST ranks (torch.distributed over Gloo)
# moved in several message orders: Gloo's alltoall, and point-to-point messages with every
# receive posted first in the orders src/comm/gloo_exchange.cpp could post. Why that file posts
# the order it does when several ranks share a host. Prints a markdown table per link.
#
#   sudo bash bench/gloo_exchange_schedules.sh [BUILD_DIR]     (root: network namespaces)
#   PER_HOST=2 LINKS=1gbit KB="44 690" (default: the per-peer sizes of zeropp_bench's qwZ
#   gathers and ZeRO-3 reduce-scatters at 2 x 2, docs/benchmarks.md)
set -uo pipefail
source "$(dirname "$0")/netns_harness.bash" "${1:-}" 2
export GLOO_SOCKET_IFNAME=eth0
PY=/usr/bin/python3
"$PY" -c "import torch.distributed" 2>/dev/null || skip "no torch.distributed for $PY"
PER_HOST=${PER_HOST:-2}
WORLD=$((2 * PER_HOST))
for link in ${LINKS:-1gbit}; do
  echo "link: $link"
  shape_links "$link"
  port=$(free_port)
  pids=()
  for ((r = WORLD - 1; r >= 0; r--)); do
    log="$TMP/rank$r.out"
    [ $r -eq 0 ] && log=/dev/stdout
    on_host $((r / PER_HOST)) "$PY" "$ROOT/bench/gloo_exchange_schedules.py" "$r" "$WORLD" \
      "$PER_HOST" "${HOSTS[0]}" "$port" ${KB:-44 690} >"$log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || fail "a rank failed: $(cat "$TMP"/rank*.out)"; done
done
shape_links ""
