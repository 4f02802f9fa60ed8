#!/bin/bash
# Prints the exact losses (hex floats) of short example-GPT runs over a matrix of ZeRO stages,
# precisions, offload settings, accumulation and world sizes: one line per run. Two builds that
# print the same file train bit for bit the same. Used to check that a refactor changes nothing:
#   scripts/loss_fingerprint.sh build > before.txt   (on the old commit)
#   scripts/loss_fingerprint.sh build > after.txt && diff before.txt after.txt
set -euo pipefail
BUILD=${1:-build}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
config() {  # stage dtype offload accumulation
  /usr/bin/python3 - "$@" "$WORK" <<'PY'
import json, sys
stage, dtype, offload, accum, work = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
c = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": accum,
     "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
     "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 1e-3, "warmup_num_steps": 3}},
     "gradient_clipping": 1.0, "seed": 7,
     "zero_optimization": {"stage": stage, "reduce_bucket_size": 3000, "allgather_bucket_size": 5000,
                           "overlap_comm": True, "sub_group_size": 4000,
                           "stage3_param_persistence_threshold": 100, "stage3_prefetch_bucket_size": 8000}}
if dtype == "bf16": c["bf16"] = {"enabled": True}
if offload in ("opt", "both"):
    c["zero_optimization"]["offload_optimizer"] = {"device": "nvme", "nvme_path": work}
if offload == "both":
    c["zero_optimization"]["offload_param"] = {"device": "nvme", "nvme_path": work, "buffer_size": 100000, "max_in_cpu": 0}
print(json.dumps(c))
PY
}
run() {  # procs stage dtype offload accumulation
  local cfg="$WORK/c_$1_$2_$3_$4_$5.json"
  config "$2" "$3" "$4" "$5" > "$cfg"
  local losses
  losses=$(OMP_NUM_THREADS=1 "$BUILD/bin/dsrun" --num_procs "$1" "$BUILD/bin/gpt_train" \
    --deepspeed_config "$cfg" --steps 6 --n_layer 2 --n_head 2 --n_embd 64 --block_size 32 \
    --exact_loss 2>&1 | grep -o 'exact [^ ]*' | cut -d' ' -f2 | tr '\n' ' ')
  echo "procs=$1 stage=$2 $3 offload=$4 accum=$5: $losses"
}
for dtype in fp32 bf16; do
  for stage in 0 1 2 3; do
    run 2 $stage $dtype none 1
    run 2 $stage $dtype none 2
  done
  for stage in 1 2 3; do run 2 $stage $dtype opt 2; done
  run 2 3 $dtype both 2
  run 3 2 $dtype none 1
  run 3 3 $dtype none 2
  run 1 0 $dtype none 1
done
