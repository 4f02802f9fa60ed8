#!/bin/bash
# ZeRO-Offload's CPU Adam on the CPU, three ways in the same call: after backward ("serial",
# overlap_step false), range by range during backward ("backward", overlap_step true), and with
# the last ranges running on into the next forward ("forward", overlap_forward true as well), at
# 1 intra-op thread (a core left for the update thread, as a GPU leaves the host's cores free)
# and at 2 (the model's work has every core). Prints a table of median step times.
#   bash bench/offload_overlap.sh [build/bin] [repeats]
#   BUCKET=500000000: reduce_bucket_size (default 2000000; 5e8 is DeepSpeed's usual, one bucket here)
#   MODEL="..." MB=n: another shape and micro-batch (gpt_train flags; default below, micro-batch 4)
set -eu
BIN=${1:-build/bin}; REPS=${2:-3}
MODEL=${MODEL:-"--n_layer 4 --n_embd 512 --n_head 8 --block_size 128"}" --steps 12 --warmup 2"
MB=${MB:-4}
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
write_config() {  # name overlap_step overlap_forward
  cat > "$TMP/$1.json" <<JSON
{"train_micro_batch_size_per_gpu": $MB, "gradient_accumulation_steps": 1, "bf16": {"enabled": true},
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.1}}, "steps_per_print": 1000000,
 "zero_optimization": {"stage": 2, "overlap_comm": true, "reduce_bucket_size": ${BUCKET:-2000000},
   "offload_optimizer": {"device": "cpu", "overlap_step": $2, "overlap_forward": $3}}}
JSON
}
write_config serial false false
write_config backward true false
write_config forward true true
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
echo "| threads | serial ms/step | backward ms/step | forward ms/step | backward / serial | forward / serial |"
echo "|---:|---:|---:|---:|---:|---:|"
for threads in 1 2; do
  for way in serial backward forward; do
    for r in $(seq "$REPS"); do
      DS_DEVICE=cpu OMP_NUM_THREADS=$threads "$BIN/gpt_train" --deepspeed_config "$TMP/$way.json" \
        $MODEL --threads "$threads" 2>&1 | grep -oE "step_ms=[0-9.]+" | cut -d= -f2
    done | median > "$TMP/$threads.$way"
  done
  s=$(cat "$TMP/$threads.serial"); b=$(cat "$TMP/$threads.backward"); f=$(cat "$TMP/$threads.forward")
  echo "| $threads | $s | $b | $f | $(ratio "$b" "$s") | $(ratio "$f" "$s") |"
done
