#!/bin/bash
# ZeRO-3 against ZeRO++ (qwZ, qgZ, hpZ): step time of the example GPT on 2 hosts x 2 ranks over a
# link shaped with tbf to 1 Gbit/s, with the bytes moved per step: the payload handed to the
# world communicator's collectives (gpt_train's counters, timed steps; hpZ's group gathers are
# not in it) and the bytes host 1 put on its link per step (interface counters: a run of 2·STEPS
# steps minus a run of STEPS steps, divided by STEPS, so start-up and warm-up cancel out).
# stage3_max_reuse_distance 0 releases each block after its forward, so the backward gathers again
# (where hpZ acts: groups of 2 = the two ranks of a host, so its backward gathers never cross the
# link).
#
#   sudo bash bench/zeropp_bench.sh [BUILD_DIR]       (root: network namespaces, sshd)
#
# Same harness as bench/multinode_bench.sh (bench/netns_harness.bash). Prints a markdown table
# (docs/benchmarks.md).
set -uo pipefail
source "$(dirname "$0")/netns_harness.bash" "${1:-}" 2
STEPS=${STEPS:-6}
WARMUP=2
MODEL=(--n_layer 4 --n_head 4 --n_embd 256 --block_size 32 --random_tokens --threads 1
       --warmup "$WARMUP")
write_hostfile "$TMP/hostfile2" 2

config() {  # config FILE ZEROPP_KEYS
  cat >"$1" <<JSON
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "steps_per_print": 0,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}, "seed": 1,
 "zero_optimization": {"stage": 3, "stage3_max_reuse_distance": 0 $2},
 "comm_timeout_seconds": 120}
JSON
}

NAMES=("ZeRO-3" "+ qwZ" "+ qgZ" "+ qwZ + qgZ" "+ qwZ + hpZ 2 + qgZ")
KEYS=("" ', "zero_quantized_weights": true' ', "zero_quantized_gradients": true'
      ', "zero_quantized_weights": true, "zero_quantized_gradients": true'
      ', "zero_quantized_weights": true, "zero_hpz_partition_size": 2, "zero_quantized_gradients": true')
shape_links 1gbit
echo "| stage 3 | step ms | world payload KB/step | host-1 sent KB/step | final loss |"
echo "|---|---|---|---|---|"
for i in "${!NAMES[@]}"; do
  config "$TMP/zpp$i.json" "${KEYS[$i]}"
  GPT=("$BIN/gpt_train" --deepspeed_config "$TMP/zpp$i.json" "${MODEL[@]}")
  sent_per_step "run_zpp$i" "$TMP/hostfile2" "$STEPS" "${GPT[@]}"
  out="$TMP/run_zpp$i.out"
  python3 - "${NAMES[$i]}" "$(report_field "$out" step_ms)" "$(report_field "$out" comm_payload_bytes_per_step)" \
    "$SENT" "$(report_field "$out" final_loss)" <<'PY'
import sys
name, ms, payload, sent, loss = sys.argv[1:]
print(f"| {name} | {float(ms):.0f} | {int(payload) / 1e3:.0f} | {int(sent) / 1e3:.0f} | {loss} |")
PY
done
shape_links ""
