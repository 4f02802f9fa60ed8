# Checkpoints across real processes: 2 ranks of gpt_train under dsrun (ZeRO stage 2) save every
# 2 steps; a new 2-rank job resumes from `latest` and prints the losses of an uninterrupted run for
# steps 5-8, bit for bit (--exact_loss: step 5 reads only the restored weights, steps 6-8 also the
# restored Adam moments and step count, which a loss rounded to 4 decimals may not show);
# ds_to_fp32 exports the checkpoint; a 3-rank job at stage 1 resumes from it (resharding) and
# trains on.
source "$(dirname "$0")/common.bash" "$1"
for exe in "$BIN/gpt_train" "$BIN/ds_to_fp32"; do
  [ -x "$exe" ] || fail "$exe not built"
done

config() {  # config STAGE > file
  cat <<JSON
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "steps_per_print": 0,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
 "zero_optimization": {"stage": $1}, "seed": 9, "comm_timeout_seconds": 30}
JSON
}
config 2 >"$TMP/stage2.json"
config 1 >"$TMP/stage1.json"
MODEL=(--n_layer 1 --n_head 2 --n_embd 16 --block_size 16 --threads 1 --exact_loss)
CK=$TMP/ck

train() {  # train NAME PROCS CONFIG ARGS...
  local name=$1 procs=$2 cfg=$3
  shift 3
  run_dsrun "$name" --num_procs "$procs" --master_port "$(free_port)" "$BIN/gpt_train" \
    --deepspeed_config "$cfg" "${MODEL[@]}" "$@"
  [ $RC -eq 0 ] || fail "$name: dsrun exited $RC"
}
losses() {  # losses FILE FROM TO: "step N loss X exact H" of steps FROM..TO, rank prefix cut
  grep -oE "step [0-9]+ loss [0-9.]+ exact [0-9a-fx.p+-]+" "$1" | awk -v a="$2" -v b="$3" '$2 >= a && $2 <= b'
}

train full 2 "$TMP/stage2.json" --steps 8
train first 2 "$TMP/stage2.json" --steps 4 --save_dir "$CK" --save_interval 2
[ "$(cat "$CK/latest")" = global_step4 ] || fail "latest is '$(cat "$CK/latest")', expected global_step4"
for f in manifest.json mp_rank_00_model_states.safetensors \
         zero_pp_rank_0_mp_rank_00_optim_states.safetensors zero_pp_rank_1_mp_rank_00_optim_states.safetensors; do
  [ -f "$CK/global_step4/$f" ] || fail "missing $CK/global_step4/$f"
done
train resumed 2 "$TMP/stage2.json" --steps 8 --load_dir "$CK"
expect_contains "$TMP/resumed.out" "resumed from $CK/global_step4"
want=$(losses "$TMP/full.out" 5 8)
got=$(losses "$TMP/resumed.out" 1 8)
[ "$(echo "$want" | wc -l)" -eq 4 ] || fail "the uninterrupted run printed no exact losses for steps 5-8: '$want'"
[ "$want" = "$got" ] || fail "resumed losses differ: want '$want', got '$got'"

timeout -s KILL 45 "$BIN/ds_to_fp32" "$CK" "$TMP/w.safetensors" >"$TMP/export.out" 2>"$TMP/export.err" ||
  fail "ds_to_fp32 failed"
expect_contains "$TMP/export.out" "ds_to_fp32:"
[ -s "$TMP/w.safetensors" ] || fail "no export written"

train reshard 3 "$TMP/stage1.json" --steps 6 --load_dir "$CK"
expect_contains "$TMP/reshard.out" "resumed from $CK/global_step4"
expect_contains "$TMP/reshard.out" "step 6 loss"
echo "PASS checkpoint_resume"
