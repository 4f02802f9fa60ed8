#!/bin/bash
# bench/tp_inference.py's "same tokens as PyTorch" column compares every generated token of every
# row (it compared row 0's first 8): bench_tp_inference prints all of them, and on a tiny GPT
# (batch 2, 12 new tokens, tp 1 and 2) every row of the table says "yes". first_difference names
# where two generations part. A tiny correctness run, not the benchmark.
# usage: tp_inference_tokens.sh BUILD/bin   (exit 77: skipped, /usr/bin/python3 without torch)
set -uo pipefail
bin=${1:?usage: tp_inference_tokens.sh BUILD/bin}
src=$(cd "$(dirname "$0")/../.." && pwd)
source "$(dirname "$0")/python_peer_prelude.bash"
model=(--n_layer 1 --n_embd 32 --n_head 2 --block_size 32)
gen=(--batch 2 --prompt_len 4 --new_tokens 12 --reps 1)

# 1. bench_tp_inference's tokens: 2 rows of 12.
"$bin/bench_tp_inference" --write_weights "$T/w.safetensors" "${model[@]}" > "$T/write.log" 2>&1 ||
  fail "--write_weights"
timeout 60 "$bin/dsrun" --num_procs 1 --master_port $((29000 + RANDOM % 2000)) \
  "$bin/bench_tp_inference" --weights "$T/w.safetensors" --tensor_parallel 1 "${model[@]}" \
  "${gen[@]}" > "$T/bench.log" 2>&1 || fail "bench_tp_inference"
tokens=$(sed -n 's/.*tp_inference tp=1 .* tokens=\([0-9,;]*\)$/\1/p' "$T/bench.log")
/usr/bin/python3 -c '
import sys
rows = [r.split(",") for r in sys.argv[1].split(";")]
sys.exit(0 if len(rows) == 2 and all(len(r) == 12 for r in rows) else 1)' "$tokens" ||
  fail "bench_tp_inference printed tokens=$tokens, want 2 rows of 12"

# 2. The driver: PyTorch's tokens against tp 1 and tp 2, every row "yes".
timeout 120 /usr/bin/python3 "$src/bench/tp_inference.py" --build "$bin/.." "${model[@]}" "${gen[@]}" \
  --tp 1,2 > "$T/table.log" 2>&1 || fail "tp_inference.py"
[ "$(grep -c "^| fp32 | .* | yes |$" "$T/table.log")" = 3 ] || fail "not every row the same tokens"

# 3. first_difference.
(cd "$src/bench" && /usr/bin/python3 -c '
from tp_inference import first_difference as d
assert d("1,2;3,4", "1,2;3,5") == "row 1, token 1: 4 vs 5", d("1,2;3,4", "1,2;3,5")
assert d("1,2;3", "1,2;3,4") == "row 1, token 1: none vs 4"
assert d("1,2", "1,2;3,4") == "1 rows vs 2"') > "$T/difference.log" 2>&1 || fail "first_difference"
echo "tp_inference_tokens: ok"
