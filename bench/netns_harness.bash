# The preamble of the benchmarks over network-namespace hosts (bench/*_bench.sh), sourced with the
# build folder (default build/): the test harness's helpers (tests/launcher/common.bash,
# netns.bash), gpt_train checked, N hosts up, one thread per rank.
#   source "$(dirname "$0")/netns_harness.bash" "${1:-}" 2      (2 hosts)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:-$ROOT/build}
source "$ROOT/tests/launcher/common.bash" "$BUILD/bin"
source "$ROOT/tests/launcher/netns.bash"
[ -x "$BIN/gpt_train" ] || fail "$BIN/gpt_train not built"
netns_setup "$2"
export OMP_NUM_THREADS=1
