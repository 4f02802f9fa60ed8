#!/bin/bash
# ZeRO-Offload's update during backward on the CPU (offload_optimizer.overlap_step): the same
# gpt_train run with the CPU Adam after backward ("serial") and during it ("overlapped"), in the
# same call, at 1 intra-op thread (a core left for the update thread, as a GPU leaves the host's
# cores free) and at 2 (backward has every core). Prints a table of median step times.
#   bash bench/offload_overlap.sh [build/bin] [repeats]
#   BUCKET=500000000: reduce_bucket_size (default 2000000; 5e8 is DeepSpeed's usual, one bucket here)
set -eu
BIN=${1:-build/bin}; REPS=${2:-3}
MODEL="--n_layer 4 --n_embd 512 --n_head 8 --block_size 128 --steps 12 --warmup 2"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
for ov in true false; do
  cat > "$TMP/$ov.json" <<JSON
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "bf16": {"enabled": true},
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.1}}, "steps_per_print": 1000000,
 "zero_optimization": {"stage": 2, "overlap_comm": true, "reduce_bucket_size": ${BUCKET:-2000000},
   "offload_optimizer": {"device": "cpu", "overlap_step": $ov}}}
JSON
done
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "| threads | serial ms/step | overlapped ms/step | overlapped / serial |"
echo "|---:|---:|---:|---:|"
for threads in 1 2; do
  for ov in false true; do
    for r in $(seq "$REPS"); do
      DS_DEVICE=cpu OMP_NUM_THREADS=$threads "$BIN/gpt_train" --deepspeed_config "$TMP/$ov.json" \
        $MODEL --threads "$threads" 2>&1 | grep -oE "step_ms=[0-9.]+" | cut -d= -f2
    done | median > "$TMP/$threads.$ov"
  done
  s=$(cat "$TMP/$threads.false"); o=$(cat "$TMP/$threads.true")
  echo "| $threads | $s | $o | $(awk -v o="$o" -v s="$s" 'BEGIN {printf "%.2f", o / s}') |"
done
