#!/bin/bash
# bench/gpu compares like with like (docs/benchmarks.md "GPU"), with stand-in programs, no GPU:
# table.py (bench/gpu/table.py)
#   1. "GPU peak GiB" is the whole run's peak for our row (gpt_train's gpu_allocated_peak_total),
#      as the peer's torch.cuda.max_memory_allocated(), with the timed steps' peak beside it;
#   2. the peer's step time is its mean (step_s_mean, as ours), not its median, and its tokens/s
#      and the ratio against it follow from that mean;
#   3. a log of a gpt_train without the whole-run figure shows "?", not the timed figure;
#   3b. "GPU reserved GiB" is the whole run's reserved peak on both sides (gpt_train's
#      gpu_reserved_peak_total, the peer's max_memory_reserved()), blank where a log has none;
# run.sh (bench/gpu/run.sh)
#   4. our rows train gpt_bench.py's init (--scaled_residual_init);
#   5. DeepSpeed's ZeRO-3 row builds its model under zero.Init (--zero_init), the others do not;
#   6. the peers run with our rows' OMP_NUM_THREADS, whatever the caller's;
#   7. a *_wcb row is its row with the engine's timers printed every step (the others without),
#      and table.py sets it beside its row's peer with no goal;
#   8. table.py: a diverged row of ours is "failed"; a peers.jsonl line cut short is passed over.
# usage: gpu_fairness.sh [TABLE_PY]   (default: this tree's bench/gpu/table.py)
set -u
src=$(cd "$(dirname "$0")/../.." && pwd)
table=${1:-$src/bench/gpu/table.py}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
touch "$T/table.md"
fail() { echo "FAIL: $*"; cat "$T/table.md"; [ -f "$T/args" ] && cat "$T/args"; exit 1; }
GIB=1073741824
# Ours: 1000 tokens/s, 2 s a step, 3 GiB over the timed steps, 5 GiB over the whole run.
report() {  # extra fields
  echo "gpt_train_report rank=0 step_ms=2000.00 tokens_per_s=1000.0 final_loss=1.00000" \
    "params_bytes=0 grads_bytes=0 optim_bytes=0 comm_bytes=0 model_state_bytes=0" \
    "peak_rss_kb=1048576 num_params=1000000000 gathered_peak_bytes=0" \
    "gpu_allocated_peak=$((3 * GIB)) gpu_reserved_peak=$((4 * GIB))" \
    "comm_payload_bytes_per_step=0 host_state_bytes=0 $*"
}
report "gpu_allocated_peak_total=$((5 * GIB)) gpu_reserved_peak_total=$((7 * GIB))" > "$T/dscpp_z2.log"
report > "$T/dscpp_z3.log"
# The peer: 4 timed steps of 1, 1, 1 and 5 s (median 1, mean 2) at 2000 tokens a step: 1000
# tokens/s from the mean, 2000 from the median (gpt_bench.py's own tokens_per_s).
cat > "$T/peers.jsonl" <<'JSON'
{"row": "torch", "ok": true, "params": 1000000000, "tokens_per_step": 2000, "step_times": [1, 1, 1, 5], "step_s_median": 1.0, "step_s_mean": 2.0, "tokens_per_s": 2000.0, "tflops_6N": 12.0, "gpu_peak_alloc_gib": 6.0, "gpu_peak_reserved_gib": 8.0, "host_peak_rss_gib": 1.0}
JSON
/usr/bin/env python3 "$table" "$T" dscpp_z2 dscpp_z3 torch > "$T/table.md" || fail "table.py failed"
header=$(grep "^| row " "$T/table.md")
[[ $header == *"| GPU peak GiB | GPU peak timed steps GiB | GPU reserved GiB |"* ]] || fail "the header: $header"
grep -q "^| dscpp_z2 | 1.00B | 2.000 | 1000 | 6.0 | 5.00 | 3.00 | 7.00 | 1.00 |  | 1.00x torch | >= 1.0x: met |$" \
  "$T/table.md" || fail "dscpp_z2: the whole-run peak (5.00), the timed one (3.00), the whole run's reserved (7.00), 1.00x the peer's mean"
grep -q "^| torch | 1.00B | 2.000 | 1000 | 6.0 | 6.00 |  | 8.00 | 1.00 |  |  |  |$" "$T/table.md" ||
  fail "torch: its mean step (2.000 s), the tokens/s of it (1000), its reserved peak (8.00)"
grep -q "^| dscpp_z3 | 1.00B | 2.000 | 1000 | 6.0 | ? | 3.00 |  | " "$T/table.md" ||
  fail "dscpp_z3 (no gpu_allocated_peak_total, no gpu_reserved_peak_total): '?' in the compared column, a blank reserved one"

# 4-6: run.sh's bench step with stand-ins that record their environment's thread count and
# their arguments (its layout as tests/tools/gpu_run.sh builds it).
root=$T/root; B=$T/dsb
mkdir -p "$root/.gpu/bench" "$B/bin"
ln -s "$src/bench" "$root/bench"
printf 'exit 0\n' > "$root/.gpu/run_device.sh"  # DeepSpeed's cpu_adam JIT
printf 'import os, sys\nopen(os.environ["ARGS_LOG"], "a").write("peer OMP=%%s %%s\\n" %% (os.environ.get("OMP_NUM_THREADS"), " ".join(sys.argv[1:])))\n' \
  > "$root/.gpu/bench/gpt_bench.py"
for p in gpt_train bench_cpu_adam bench_transfer; do
  printf '#!/bin/bash\necho "ours OMP=$OMP_NUM_THREADS $*" >> "$ARGS_LOG"\n' > "$B/bin/$p"; chmod +x "$B/bin/$p"
done
(cd "$root" && ARGS_LOG=$T/args OMP_NUM_THREADS=3 OUT=$T/out DSB=$B STEPS=bench FLOORS=0 \
   ROWS="dscpp_z2 dscpp_z3_off torch ds_z2_off ds_z3_off" bash bench/gpu/run.sh > "$T/run.log" 2>&1)
[ "$(grep -c "^ours .*--scaled_residual_init" "$T/args")" = 2 ] ||
  fail "our rows without --scaled_residual_init"
grep -q "^peer .*--row ds_z3_off .*--zero_init" "$T/args" || fail "ds_z3_off without --zero_init"
[ "$(grep -c -- "--zero_init" "$T/args")" = 1 ] || fail "--zero_init on a row other than ds_z3_off"
[ "$(grep -c "^peer OMP=16 " "$T/args")" = 3 ] || fail "a peer without our rows' OMP_NUM_THREADS (16)"
[ "$(grep -c "^ours OMP=16 " "$T/args")" = 2 ] || fail "our rows' OMP_NUM_THREADS"
# 7. The timers only on the _wcb row: the flag, and steps_per_print 1 in its config alone.
: > "$T/args"
(cd "$root" && ARGS_LOG=$T/args OUT=$T/out7 DSB=$B STEPS=bench FLOORS=0 \
   ROWS="dscpp_z2_off dscpp_z2_off_wcb" bash bench/gpu/run.sh > "$T/run7.log" 2>&1)
[ "$(grep -c -- "--wall_clock_breakdown" "$T/args")" = 1 ] || fail "--wall_clock_breakdown not on the _wcb row alone"
grep -q '"steps_per_print": 1,' /tmp/dscpp_z2_off_wcb.json || fail "the _wcb row's config does not print every step"
grep -q '"steps_per_print": 1000000000,' /tmp/dscpp_z2_off.json || fail "the plain row's config prints"
grep -q "offload_optimizer" /tmp/dscpp_z2_off_wcb.json || fail "the _wcb row is not its row's config"
report > "$T/dscpp_z2_off_wcb.log"
echo '{"row": "ds_z2_off", "ok": true, "params": 1000000000, "tokens_per_step": 2000, "step_times": [2], "step_s_median": 2.0, "step_s_mean": 2.0, "tokens_per_s": 1000.0, "gpu_peak_alloc_gib": 6.0, "host_peak_rss_gib": 1.0}' > "$T/peers.jsonl"
/usr/bin/env python3 "$table" "$T" dscpp_z2_off_wcb ds_z2_off > "$T/table.md" || fail "table.py failed"
grep -q "^| dscpp_z2_off_wcb | 1.00B | .* | 1.00x ds_z2_off |  |$" "$T/table.md" || fail "the _wcb row beside its peer, no goal"
# 8. A row of ours whose final loss is not finite measured a broken run: "failed", no figures. A
#    peers.jsonl line cut short (a peer killed while writing) is passed over; the others count.
report | sed 's/final_loss=1.00000/final_loss=nan/' > "$T/dscpp_z2.log"
{ echo '{"row": "ds_z2_off", "ok": true, "params": 1000000000, "tokens_per_step": 2000, "step_times": [2], "step_s_median": 2.0, "step_s_mean": 2.0, "tokens_per_s": 1000.0, "gpu_peak_alloc_gib": 6.0, "host_peak_rss_gib": 1.0}'
  printf '{"row": "torch", "ok": tr'; } > "$T/peers.jsonl"
/usr/bin/env python3 "$table" "$T" dscpp_z2 ds_z2_off torch > "$T/table.md" || fail "table.py failed on a cut line"
grep -q "^| dscpp_z2 | failed: final loss nan: the run diverged |" "$T/table.md" || fail "a diverged row of ours was not 'failed'"
grep -q "^| ds_z2_off | 1.00B | 2.000 | 1000 " "$T/table.md" || fail "the line before the cut one was lost"
grep -q "^| torch | failed: no result |" "$T/table.md" || fail "the cut line's row"
echo "gpu_fairness: ok"
