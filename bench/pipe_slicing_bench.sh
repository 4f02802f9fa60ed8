#!/bin/bash
# pipeline.pipe_partitioned / grad_partitioned: pipe 2 x tensor 2 on 2 hosts x 2 ranks (the
# tensor groups within each host, stage 0 on host 0 and stage 1 on host 1, as tensor-parallel
# jobs are laid out), activations and gradients between the stages sent sliced over the tensor
# group (the default) or whole, over links shaped with tbf, in one run: step ms and the bytes host
# 1 put on its link per step (two runs of STEPS and 2 STEPS steps, differenced: start-up cancels).
#
#   sudo bash bench/pipe_slicing_bench.sh [BUILD_DIR]    (root: network namespaces, sshd)
#   LINKS="1gbit 10gbit" picks the links; STEPS (default 4) the shorter run's steps.
# Prints a markdown table (docs/benchmarks.md).
set -uo pipefail
source "$(dirname "$0")/netns_harness.bash" "${1:-}" 2
STEPS=${STEPS:-4}
write_hostfile "$TMP/hostfile2" 2
MODEL=(--n_layer 2 --n_head 4 --n_embd 256 --block_size 128 --random_tokens --threads 1
       --warmup 1 --pipeline_stages 2 --tensor_parallel 2)

config() {  # config SLICED FILE
  cat >"$2" <<JSON
{"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 4, "steps_per_print": 0,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}, "seed": 1,
 "zero_optimization": {"stage": 1},
 "pipeline": {"pipe_partitioned": $1, "grad_partitioned": $1},
 "comm_timeout_seconds": 120}
JSON
}

echo "| link | sends between stages | step ms | host-1 sent MB/step | final loss |"
echo "|---|---|---:|---:|---:|"
for link in ${LINKS:-1gbit 10gbit}; do
  shape_links "$link"
  for sliced in true false; do
    config "$sliced" "$TMP/p_$sliced.json"
    name="run_${link}_$sliced"
    sent_per_step "$name" "$TMP/hostfile2" "$STEPS" \
      "$BIN/gpt_train" --deepspeed_config "$TMP/p_$sliced.json" "${MODEL[@]}"
    what="whole"; [ "$sliced" = true ] && what="sliced (default)"
    ms=$(report_field "$TMP/$name.out" step_ms)
    loss=$(report_field "$TMP/$name.out" final_loss)
    printf '| %s | %s | %.0f | %.1f | %s |\n' "$link" "$what" "$ms" \
      "$(echo "$SENT / 1000000" | bc -l)" "$loss"
  done
done
shape_links ""
