#!/bin/bash
# bench_module_granularity (every Linear a ZeroUnit, with and without
# stage3_module_granularity_threshold, against the hand-wrapped model and ZeRO-2) with its 2 ranks
# on 2 hosts, over links shaped with tbf: the all-gathers each unit costs now cross a link.
#
#   sudo bash bench/module_granularity_hosts.sh [BUILD_DIR]    (root: network namespaces, sshd)
#   LINKS="1gbit 10gbit" picks the links; ARGS the benchmark's arguments (default "8 64 10 3").
# Prints the benchmark's markdown table per link (docs/benchmarks.md).
set -uo pipefail
source "$(dirname "$0")/netns_harness.bash" "${1:-}" 2
[ -x "$BIN/bench_module_granularity" ] || fail "$BIN/bench_module_granularity not built"
write_hostfile "$TMP/hostfile1" 1
for link in ${LINKS:-1gbit 10gbit}; do
  shape_links "$link"
  # shellcheck disable=SC2086  # ARGS is a list of numbers
  run_on_host0 "granularity_$link" --hostfile "$TMP/hostfile1" --launcher_args "$SSH_ARGS" \
    --master_port "$(free_port)" --no_local_rank "$BIN/bench_module_granularity" ${ARGS:-8 64 10 3}
  [ "$RC" -eq 0 ] || fail "$link: dsrun exited $RC: $(tail -3 "$TMP/granularity_$link.err")"
  echo "link $link:"
  grep -E "rank 0\] (\||[0-9]+ ranks)" "$TMP/granularity_$link.out" | sed 's/^\[[^]]*rank 0\] //'
  echo
done
shape_links ""
