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
# Same harness as bench/multinode_bench.sh (tests/launcher/netns.bash). Prints a markdown table
# (docs/benchmarks.md).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
source "$ROOT/tests/launcher/common.bash" "$BUILD/bin"
source "$ROOT/tests/launcher/netns.bash"
[ -x "$BIN/gpt_train" ] || fail "$BIN/gpt_train not built"
netns_setup 2
export OMP_NUM_THREADS=1
STEPS=${STEPS:-6}
WARMUP=2
MODEL=(--n_layer 4 --n_head 4 --n_embd 256 --block_size 32 --random_tokens --threads 1
       --warmup "$WARMUP")
: >"$TMP/hostfile2"
for h in "${HOSTS[@]}"; do echo "$h slots=2" >>"$TMP/hostfile2"; done

config() {  # config FILE ZEROPP_KEYS
  cat >"$1" <<JSON
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "steps_per_print": 0,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}, "seed": 1,
 "zero_optimization": {"stage": 3, "stage3_max_reuse_distance": 0 $2},
 "comm_timeout_seconds": 120}
JSON
}

field() {  # field FILE NAME: NAME=value of rank 0's gpt_train_report
  grep -oE "gpt_train_report rank=0 .*" "$1" | grep -oE " $2=[0-9.]+" | head -1 | cut -d= -f2
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
  sent=0
  for n in "$STEPS" $((2 * STEPS)); do  # the longer run last: its report is the one read
    before=$(link_tx_bytes 1)
    run_on_host0 "run_zpp$i" --hostfile "$TMP/hostfile2" --launcher_args "$SSH_ARGS" \
      --master_port "$(free_port)" "${GPT[@]}" --steps "$n"
    [ "$RC" -eq 0 ] || fail "${NAMES[$i]} ($n steps): dsrun exited $RC"
    after=$(link_tx_bytes 1)
    sent=$(( after - before - sent ))
  done
  sent=$(( sent / STEPS ))
  out="$TMP/run_zpp$i.out"
  python3 - "${NAMES[$i]}" "$(field "$out" step_ms)" "$(field "$out" comm_payload_bytes_per_step)" \
    "$sent" "$(field "$out" final_loss)" <<'PY'
import sys
name, ms, payload, sent, loss = sys.argv[1:]
print(f"| {name} | {float(ms):.0f} | {int(payload) / 1e3:.0f} | {int(sent) / 1e3:.0f} | {loss} |")
PY
done
shape_links ""
