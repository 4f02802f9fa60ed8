#!/bin/bash
# Adam against 1-bit Adam after its freeze, 0/1 Adam after its variance freeze (every step a sync,
# and with local steps), Lamb against 1-bit Lamb after its freeze: step time of the example GPT (n_layer 4, n_embd 512,
# 12.7 M parameters, micro-batch 2 x 32 tokens: scaled so communication dominates) on 2 hosts x 1 rank over
# a link shaped with tbf to 1 Gbit/s, and unshaped (loopback, 2 ranks on one host), with the bytes
# moved per step: the payload handed to the collectives (gpt_train's communicator counters, timed
# steps only) and the bytes host 1 put on its link per step after the warm-up (interface counters:
# a run of 2·STEPS steps minus a run of STEPS steps, divided by STEPS, so start-up and warm-up
# cancel out).
# The untimed warm-up steps (--warmup) are the 1-bit optimizers' exact phase (freeze_step and
# var_freeze_step = WARMUP), so every timed step is a compressed (or local) one. Adam and Lamb run
# without bias correction, as the 1-bit optimizers do. "0/1 Adam, local steps" sets
# local_step_scaler 1 so the interval between syncs doubles every step up to local_step_clipper 4.
# OPTS picks rows (default: all).
#
#   sudo bash bench/onebit_bench.sh [BUILD_DIR]       (root: network namespaces, sshd)
#
# Same harness as bench/multinode_bench.sh (bench/netns_harness.bash). Prints a markdown table
# (docs/benchmarks.md).
set -uo pipefail
source "$(dirname "$0")/netns_harness.bash" "${1:-}" 2
STEPS=${STEPS:-8}
WARMUP=3
MODEL=(--n_layer 4 --n_head 8 --n_embd 512 --block_size 32 --random_tokens --threads 1
       --warmup "$WARMUP")
write_hostfile "$TMP/hostfile1" 1

config() {  # config OPTIMIZER FILE
  local opt
  case $1 in
    adam) opt='"type": "Adam", "params": {"lr": 3e-4, "bias_correction": false}' ;;
    onebit) opt='"type": "OneBitAdam", "params": {"lr": 3e-4, "freeze_step": '$WARMUP'}' ;;
    zeroone) opt='"type": "ZeroOneAdam", "params": {"lr": 3e-4, "var_freeze_step": '$WARMUP'}' ;;
    zeroone_local) opt='"type": "ZeroOneAdam", "params": {"lr": 3e-4, "var_freeze_step": '$WARMUP',
       "local_step_scaler": 1, "local_step_clipper": 4}' ;;
    lamb) opt='"type": "Lamb", "params": {"lr": 3e-3, "bias_correction": false}' ;;
    onebitlamb) opt='"type": "OneBitLamb", "params": {"lr": 3e-3, "freeze_step": '$WARMUP'}' ;;
    *) fail "unknown optimizer row $1" ;;
  esac
  cat >"$2" <<JSON
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "steps_per_print": 0,
 "optimizer": {$opt}, "seed": 1,
 "zero_optimization": {"stage": 0, "reduce_bucket_size": 5e6},
 "comm_timeout_seconds": 120}
JSON
}

echo "| link | optimizer | step ms | payload KB/step | host-1 sent KB/step | final loss |"
echo "|---|---|---|---|---|---|"
for link in loopback 1gbit; do
  for opt in ${OPTS:-adam onebit zeroone zeroone_local lamb onebitlamb}; do
    config "$opt" "$TMP/$opt.json"
    GPT=("$BIN/gpt_train" --deepspeed_config "$TMP/$opt.json" "${MODEL[@]}")
    if [ "$link" = loopback ]; then
      shape_links ""
      run_on_host0 "run_${link}_$opt" --num_procs 2 --master_port "$(free_port)" "${GPT[@]}" \
        --steps $((2 * STEPS))
      sent="-"
    else
      shape_links "$link"
      sent_per_step "run_${link}_$opt" "$TMP/hostfile1" "$STEPS" "${GPT[@]}"
      sent=$SENT
    fi
    out="$TMP/run_${link}_$opt.out"
    [ "$RC" -eq 0 ] || fail "$link $opt: dsrun exited $RC"
    ms=$(report_field "$out" step_ms)
    payload=$(report_field "$out" comm_payload_bytes_per_step)
    loss=$(report_field "$out" final_loss)
    case $opt in
      adam) name=Adam ;; onebit) name="1-bit Adam" ;; zeroone) name="0/1 Adam" ;;
      zeroone_local) name="0/1 Adam, local steps" ;; lamb) name=Lamb ;; onebitlamb) name="1-bit Lamb" ;;
    esac
    python3 - "$link" "$name" "$ms" "$payload" "$sent" "${loss:--}" <<'PY'
import sys
link, name, ms, payload, sent, loss = sys.argv[1:]
sent_kb = "-" if sent == "-" else f"{int(sent) / 1e3:.0f}"
print(f"| {link} | {name} | {float(ms):.0f} | {int(payload) / 1e3:.0f} | {sent_kb} | {loss} |")
PY
  done
done
shape_links ""
