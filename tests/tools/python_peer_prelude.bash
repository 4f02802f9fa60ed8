# Sourced by the tools tests that run a Python peer under /usr/bin/python3 (bench/*.py): skips the
# test (exit 77) without Debian's python3-torch, makes $T (removed at exit), defines
# fail MESSAGE (prints it and the last FAIL_TAIL_LINES lines of every $T/*.log, exits 1), and sets one
# thread per rank on the CPU over Gloo. The caller may set FAIL_TAIL_LINES (default 20) and `src`, `bin`.
if ! /usr/bin/python3 -c 'import torch' > /dev/null 2>&1; then
  echo "SKIP: /usr/bin/python3 with torch (Debian's python3-torch) is not installed"; exit 77
fi
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; for f in "$T"/*.log; do echo "== $f"; tail -n "${FAIL_TAIL_LINES:-20}" "$f"; done; exit 1; }
export OMP_NUM_THREADS=1 DS_DEVICE=cpu DS_COMM_BACKEND=gloo
