# Checkpoints of tensor-parallel training across real processes: gpt_train --tensor_parallel 2 on
# 4 ranks (tp 2 x dp 2, ZeRO-1) saves every 2 steps; a new job resumes from `latest` and prints
# the uninterrupted run's losses for steps 5-6 bit for bit (--exact_loss: the hex floats, which a
# loss rounded to 4 decimals may not tell apart, as in checkpoint_resume.sh); jobs at --tensor_parallel 4 and without tensor
# parallelism reshard it and follow those losses; ds_to_fp32 exports the checkpoint whole; and
# gpt_generate prints the same greedy continuation from it at --tensor_parallel 1 and 4.
source "$(dirname "$0")/common.bash" "$1"
for exe in "$BIN/gpt_train" "$BIN/ds_to_fp32" "$BIN/gpt_generate"; do
  [ -x "$exe" ] || fail "$exe not built"
done

config() {  # config MICRO_BATCH > file: 4 samples a step at data-parallel size 4 / MICRO_BATCH
  cat <<JSON
{"train_micro_batch_size_per_gpu": $1, "gradient_accumulation_steps": 1, "steps_per_print": 0,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}, "gradient_clipping": 0.5,
 "zero_optimization": {"stage": 1}, "seed": 9, "comm_timeout_seconds": 30}
JSON
}
config 2 >"$TMP/tp2.json"   # dp 2
config 4 >"$TMP/tp4.json"   # dp 1
config 1 >"$TMP/tp1.json"   # dp 4
MODEL=(--n_layer 1 --n_head 4 --n_embd 16 --block_size 16)
CK=$TMP/ck

train() {  # [TP=N] train NAME ARGS... (tensor parallel 2 unless TP says otherwise)
  local name=$1
  shift
  run_dsrun "$name" --num_procs 4 --master_port "$(free_port)" "$BIN/gpt_train" \
    --deepspeed_config "$TMP/tp${TP:-2}.json" --tensor_parallel "${TP:-2}" "${MODEL[@]}" --threads 1 \
    --exact_loss "$@"
  [ $RC -eq 0 ] || fail "$name: dsrun exited $RC"
}
losses() {  # losses FILE FROM TO: the "step N loss X" lines of steps FROM..TO, rank prefix cut
  grep -oE "step [0-9]+ loss [0-9.]+" "$1" | awk -v a="$2" -v b="$3" '$2 >= a && $2 <= b'
}
exact_losses() {  # exact_losses FILE FROM TO: "step N loss X exact H" of steps FROM..TO
  grep -oE "step [0-9]+ loss [0-9.]+ exact [0-9a-fx.p+-]+" "$1" | awk -v a="$2" -v b="$3" '$2 >= a && $2 <= b'
}

train full --steps 6
train first --steps 4 --save_dir "$CK" --save_interval 2
for f in manifest.json mp_rank_00_model_states.safetensors mp_rank_01_model_states.safetensors \
         zero_pp_rank_1_mp_rank_00_optim_states.safetensors zero_pp_rank_1_mp_rank_01_optim_states.safetensors; do
  [ -f "$CK/global_step4/$f" ] || fail "missing $CK/global_step4/$f"
done
train resumed --steps 6 --load_dir "$CK"
expect_contains "$TMP/resumed.out" "resumed from $CK/global_step4"
want_exact=$(exact_losses "$TMP/full.out" 5 6)
got_exact=$(exact_losses "$TMP/resumed.out" 1 6)
[ "$(echo "$want_exact" | wc -l)" -eq 2 ] ||
  fail "the uninterrupted run printed no exact losses for steps 5-6: '$want_exact'"
[ "$want_exact" = "$got_exact" ] || fail "resumed losses differ: want '$want_exact', got '$got_exact'"
want=$(losses "$TMP/full.out" 5 6)

# Resharded (only summation orders differ): the printed losses within 1e-3.
for tp in 4 1; do
  TP=$tp train "reshard$tp" --steps 6 --load_dir "$CK"
  expect_contains "$TMP/reshard$tp.out" "resumed from $CK/global_step4"
  got=$(losses "$TMP/reshard$tp.out" 1 6)
  paste <(echo "$want") <(echo "$got") | awk '{ d = $4 - $8; if (d < 0) d = -d; if (NF != 8 || d > 1e-3) exit 1 }' ||
    fail "tp $tp resharded losses differ: want '$want', got '$got'"
done

timeout -s KILL 45 "$BIN/ds_to_fp32" "$CK" "$TMP/w.safetensors" >"$TMP/export.out" 2>"$TMP/export.err" ||
  fail "ds_to_fp32 failed"
expect_contains "$TMP/export.out" "ds_to_fp32:"
# The unsplit shapes: q/k/v [48, 16], the MLP's proj [16, 64].
python3 - "$TMP/w.safetensors" <<'PY' || fail "exported shapes are not the unsplit model's"
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
assert header["block0.attn.qkv.weight"]["shape"] == [48, 16], header["block0.attn.qkv.weight"]
assert header["block0.mlp.proj.weight"]["shape"] == [16, 64], header["block0.mlp.proj.weight"]
assert header["wte.weight"]["shape"] == [256, 16], header["wte.weight"]
PY

GEN=(--load_dir "$CK" "${MODEL[@]}" --prompt "The " --max_new_tokens 12 --greedy)
timeout -s KILL 60 "$BIN/gpt_generate" "${GEN[@]}" >"$TMP/gen1.out" 2>"$TMP/gen1.err" ||
  fail "gpt_generate at tp 1 failed"
run_dsrun gen4 --num_procs 4 --master_port "$(free_port)" "$BIN/gpt_generate" --tensor_parallel 4 "${GEN[@]}"
[ $RC -eq 0 ] || fail "gpt_generate --tensor_parallel 4: dsrun exited $RC"
one=$(tail -n 1 "$TMP/gen1.out")
four=$(grep '^\[rank 0\] ' "$TMP/gen4.out" | tail -n 1 | sed 's/^\[rank 0\] //')
[ -n "$one" ] && [ "$one" = "$four" ] || fail "tp 1 printed '$one', tp 4 printed '$four'"
echo "PASS tp_checkpoint"
