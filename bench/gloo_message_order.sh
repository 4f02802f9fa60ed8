#!/bin/bash
# Each direction of a link under Gloo's collectives and point-to-point messages, with the
# receive posted before or after the send: 2 network-namespace hosts, tbf-shaped links, one
# Python rank (torch.distributed over Gloo) each. Why src/comm/gloo_exchange.h posts every
# receive first. Prints a markdown table per link (docs/benchmarks.md).
#
#   sudo bash bench/gloo_message_order.sh [BUILD_DIR]        (root: network namespaces)
#   LINKS="1gbit 10gbit" MEGABYTES=6.6 ... (default: 1gbit, 6.6 MB each way: the partition of
#   bench/multinode_bench.sh's 3.3M-parameter GPT at 2 ranks)
set -uo pipefail
source "$(dirname "$0")/netns_harness.bash" "${1:-}" 2
export GLOO_SOCKET_IFNAME=eth0
PY=/usr/bin/python3
"$PY" -c "import torch.distributed" 2>/dev/null || skip "no torch.distributed for $PY"
for link in ${LINKS:-1gbit}; do
  echo "link: $link"
  shape_links "$link"
  port=$(free_port)
  on_host 1 "$PY" "$ROOT/bench/gloo_message_order.py" 1 "${HOSTS[0]}" "$port" \
    "${MEGABYTES:-6.6}" >"$TMP/rank1.out" 2>&1 &
  on_host 0 "$PY" "$ROOT/bench/gloo_message_order.py" 0 "${HOSTS[0]}" "$port" \
    "${MEGABYTES:-6.6}" || fail "rank 0 failed"
  wait $! || fail "rank 1 failed: $(cat "$TMP/rank1.out")"
done
shape_links ""
