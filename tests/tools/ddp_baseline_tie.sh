#!/bin/bash
# bench/ddp_baseline.py, the PyTorch DDP row of docs/benchmarks.md, trains gpt_train's model: on 2
# ranks, from the same seed, config and text, both print the same loss at every step (1e-5
# relative: fp32 sums in other orders), with the plain init and with --scaled_residual_init. The
# text is short enough that an epoch ends within the run on a partial micro-batch (9 windows, 5 a
# rank: micro-batches of 2, 2, 1), which deepspeed.cpp's loader keeps. The two inits must give
# different losses, so that an init, data or optimizer difference between the two programs
# cannot pass unseen.
# usage: ddp_baseline_tie.sh BUILD/bin   (exit 77: skipped, /usr/bin/python3 without torch)
set -uo pipefail
bin=${1:?usage: ddp_baseline_tie.sh BUILD/bin}
src=$(cd "$(dirname "$0")/../.." && pwd)
FAIL_TAIL_LINES=30
source "$(dirname "$0")/python_peer_prelude.bash"

# 81 bytes = 9 windows of 16 + 1 bytes every 8.
head -c 81 "$src/data/fortunes.txt" > "$T/text.txt"
cat > "$T/ds_config.json" << 'JSON'
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "steps_per_print": 1000000,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.99], "eps": 1e-8, "weight_decay": 0.01}},
 "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-3, "warmup_num_steps": 0}},
 "gradient_clipping": 1.0, "zero_optimization": {"stage": 0}, "seed": 1234}
JSON
model="--n_layer 2 --n_head 2 --n_embd 32 --block_size 16 --steps 6 --exact_loss"
port=$((29000 + RANDOM % 2000))
# run NAME PROGRAM ARGS...: on 2 ranks under dsrun, output in $T/NAME.log.
run() {
  port=$((port + 1))
  timeout 60 "$bin/dsrun" --num_procs 2 --master_port $port "${@:2}" > "$T/$1.log" 2>&1 ||
    fail "$1 exited $?"
}
for init in plain scaled; do
  flag=""; [ $init = scaled ] && flag=--scaled_residual_init
  run ours_$init "$bin/gpt_train" --deepspeed_config "$T/ds_config.json" --data "$T/text.txt" \
    --threads 1 --device cpu $model $flag
  # The script itself (its #!/usr/bin/python3): dsrun appends --local_rank, the script takes it.
  run ddp_$init "$src/bench/ddp_baseline.py" --config "$T/ds_config.json" \
    --data "$T/text.txt" --threads 1 $model $flag
done

# "[rank 0] step N loss X exact HEX" (both print it on rank 0, HEX as C's %a / Python's
# float.hex; dsrun adds the rank).
/usr/bin/python3 - "$T" << 'PY' || fail "the losses above"
import re, sys
d = sys.argv[1]
def losses(name):
    text = open(f"{d}/{name}.log").read()
    return [float.fromhex(h) for h in re.findall(r"^\[rank 0\] step \d+ loss \S+ exact (\S+)$", text, re.M)]
ok = True
for init in ("plain", "scaled"):
    ours, ddp = losses(f"ours_{init}"), losses(f"ddp_{init}")
    if len(ours) != 6 or len(ddp) != 6:
        print(f"{init}: {len(ours)} steps from gpt_train, {len(ddp)} from ddp_baseline.py, want 6")
        ok = False
        continue
    for step, (a, b) in enumerate(zip(ours, ddp), 1):
        if abs(a - b) > 1e-5 * abs(b):
            print(f"{init} init, step {step}: gpt_train {a!r} vs ddp_baseline.py {b!r}")
            ok = False
plain, scaled = losses("ours_plain"), losses("ours_scaled")
if ok and max(abs(a - b) for a, b in zip(plain, scaled)) <= 1e-4:
    print(f"the two inits train alike ({plain} vs {scaled}): this test would not see an init difference")
    ok = False
sys.exit(0 if ok else 1)
PY
echo "ddp_baseline_tie: ok"
