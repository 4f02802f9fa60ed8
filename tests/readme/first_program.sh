#!/usr/bin/env bash
# Runs the README's first program (built from README.md) with gradient accumulation 2 and checks
# that it prints one loss line per optimizer step (steps 1..100, each once) and that it learns.
set -euo pipefail
exe="$1"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
cat > "$dir/ds_config.json" <<'JSON'
{
  "train_micro_batch_size_per_gpu": 16,
  "gradient_accumulation_steps": 2,
  "steps_per_print": 0,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
  "zero_optimization": {"stage": 1}
}
JSON
OMP_NUM_THREADS=1 "$exe" --deepspeed_config "$dir/ds_config.json" > "$dir/out.txt" 2>&1 || {
  cat "$dir/out.txt"; echo "FAIL: the README program exited with an error"; exit 1; }
steps="$(grep -oE '^step [0-9]+ loss' "$dir/out.txt" | awk '{print $2}' | tr '\n' ' ')"
expected="$(seq 1 100 | tr '\n' ' ')"
if [[ "$steps" != "$expected" ]]; then
  cat "$dir/out.txt"; echo "FAIL: expected one line per optimizer step 1..100, got: $steps"; exit 1
fi
first="$(grep -m1 -oE '^step 1 loss [0-9.]+' "$dir/out.txt" | awk '{print $4}')"
last="$(grep -oE '^step 100 loss [0-9.]+' "$dir/out.txt" | awk '{print $4}')"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a / 2) }' || {
  cat "$dir/out.txt"; echo "FAIL: loss $first -> $last did not halve"; exit 1; }
echo "ok: 100 optimizer steps, loss $first -> $last"
