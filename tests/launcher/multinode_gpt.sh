# The example GPT with ZeRO-2 across two network-namespace hosts (netns.bash) x 2 ranks, launched
# over ssh from host 0, Gloo finding its interface by the route to MASTER_ADDR (no
# GLOO_SOCKET_IFNAME):
#   - the losses equal those of 4 ranks on one host, bit for bit (fp32, --exact_loss) with
#     DS_GLOO_HIERARCHICAL=0, within 1e-5 with the default (sums added within hosts first);
#   - --max_restarts 1 after kill -9 of a remote rank resumes from `latest` (--load_dir) and
#     continues exactly as an uninterrupted run;
#   - a link cut mid-run (ip link set ... down) ends the job with a named timeout error within
#     comm_timeout_seconds (5 s here) plus the teardown, never a hang; the error names the peer
#     that went silent (or the store this rank lost).
source "$(dirname "$0")/common.bash" "$1"
source "$(dirname "$0")/netns.bash"
[ -x "$BIN/gpt_train" ] || fail "$BIN/gpt_train not built"
netns_setup 2
H1=${HOSTS[1]}
cd "$TMP" || fail "cd $TMP"
unset GLOO_SOCKET_IFNAME
export OMP_NUM_THREADS=1

cat >"$TMP/zero2.json" <<JSON
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "steps_per_print": 0,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
 "zero_optimization": {"stage": 2}, "seed": 9, "comm_timeout_seconds": 5}
JSON
GPT=("$BIN/gpt_train" --deepspeed_config "$TMP/zero2.json" --n_layer 1 --n_head 2 --n_embd 16
     --block_size 16 --threads 1 --exact_loss)
MULTI=(--hostfile "$TMP/hostfile" --launcher_args "$SSH_ARGS")
losses() {  # losses FILE FROM TO: "step N loss X exact H" of steps FROM..TO, prefixes cut
  grep -oE "step [0-9]+ loss [0-9.]+ exact [0-9a-fx.p+-]+" "$1" | awk -v a="$2" -v b="$3" '$2 >= a && $2 <= b'
}

# 1. Same losses as 4 local ranks: bit for bit when every rank sends to every rank; within
#    rounding with the default within-host-then-across reduce-scatter (src/comm/gloo_hierarchy.h:
#    its partial sums add in another order).
run_on_host0 local --num_procs 4 --master_port "$(free_port)" "${GPT[@]}" --steps 6
[ $RC -eq 0 ] || fail "4 local ranks: dsrun exited $RC"
DS_GLOO_HIERARCHICAL=0 run_on_host0 flat "${MULTI[@]}" --master_port "$(free_port)" "${GPT[@]}" \
  --steps 6
[ $RC -eq 0 ] || fail "2 hosts x 2 ranks, DS_GLOO_HIERARCHICAL=0: dsrun exited $RC"
want=$(losses "$TMP/local.out" 1 6)
got=$(losses "$TMP/flat.out" 1 6)
[ "$(echo "$want" | wc -l)" -eq 6 ] || fail "4 local ranks printed no 6 losses: '$want'"
[ "$want" = "$got" ] || fail "2 hosts x 2 ranks differ from 4 local ranks: want '$want', got '$got'"
expect_contains "$TMP/flat.out" "gpt_train: "  # rank 0's banner came through
echo "2 hosts x 2 ranks (every rank to every rank) = 4 local ranks (6 steps, bit-identical)"
run_on_host0 multi "${MULTI[@]}" --master_port "$(free_port)" "${GPT[@]}" --steps 6
[ $RC -eq 0 ] || fail "2 hosts x 2 ranks: dsrun exited $RC"
got=$(losses "$TMP/multi.out" 1 6)
python3 - "$want" "$got" <<'PY' || fail "2 hosts x 2 ranks (within, then across hosts) differ"
import sys
want, got = ([float.fromhex(line.split()[-1]) for line in text.splitlines()]
             for text in sys.argv[1:])
assert len(got) == len(want) == 6, f"{len(got)} losses, want 6"
for step, (w, g) in enumerate(zip(want, got), 1):
    assert abs(g - w) <= 1e-5 * abs(w), f"step {step}: {g} against {w}"
PY
echo "2 hosts x 2 ranks (within hosts, then across) = 4 local ranks within 1e-5"

# 2. --max_restarts 1: the first attempt trains 4 steps (checkpoint global_step4), then rank 3 (on
#    host 1) dies by SIGKILL while the others wait; the restart (DSRUN_RESTART_COUNT=1) resumes
#    from `latest` and its steps 5-6 equal the uninterrupted run's. (A wrapper makes the kill
#    land at a known step: these tiny steps take milliseconds.)
CK=$TMP/ck
cat >"$TMP/attempt.sh" <<'SH'
#!/bin/bash
if [ "$DSRUN_RESTART_COUNT" = 0 ]; then
  "$@" --steps 4 || exit
  [ "$RANK" = 3 ] && kill -9 $$
  sleep 30
  exit 0
fi
exec "$@" --steps 6
SH
chmod +x "$TMP/attempt.sh"
run_on_host0 restart "${MULTI[@]}" --max_restarts 1 --no_local_rank --master_port "$(free_port)" \
  "$TMP/attempt.sh" "${GPT[@]}" --save_dir "$CK" --save_interval 2 --load_dir "$CK"
[ $RC -eq 0 ] || fail "--max_restarts 1: dsrun exited $RC"
grep -qE "rank 3 \(pid [0-9]+\) on $H1 was killed by signal 9 \(SIGKILL\)" "$TMP/restart.err" ||
  fail "restart: the kill of rank 3 on $H1 was not reported"
expect_contains "$TMP/restart.err" "restarting it (restart 1 of 1)"
expect_contains "$TMP/restart.out" "resumed from $CK/global_step4"
want=$(losses "$TMP/multi.out" 5 6)
got=$(awk "/resumed from/{found=1} found" "$TMP/restart.out" | losses /dev/stdin 1 6)
[ -n "$want" ] && [ "$want" = "$got" ] || fail "restart from global_step4: want '$want', got '$got'"
echo "restart after SIGKILL of rank 3 resumed from global_step4 and continued identically"

# 3. Cut host 1's link mid-run: a timeout error naming the collective, well before the 60 s limit.
ip netns exec "${NS[0]}" "$DSRUN" "${MULTI[@]}" --master_port "$(free_port)" "${GPT[@]}" \
  --steps 100000 >"$TMP/cut.out" 2>"$TMP/cut.err" &
LAUNCHER=$!
wait_for 1 "step 3 loss" "$TMP/cut.out" 60
cut_link 1
start=$SECONDS
for ((i = 0; i < 600; i++)); do kill -0 $LAUNCHER 2>/dev/null || break; sleep 0.1; done
kill -0 $LAUNCHER 2>/dev/null && { kill -9 $LAUNCHER; fail "cut link: dsrun still running after 60 s"; }
wait $LAUNCHER
RC=$?
elapsed=$((SECONDS - start))
[ $RC -ne 0 ] || fail "cut link: dsrun exited 0"
grep -qE "failed after [0-9.]+ s \(timeout 5 s\)" "$TMP/cut.err" || fail "cut link: no named timeout error"
# The error names the peer: host 0's ranks have not heard from host 1's ranks (peer watch), or
# host 1's ranks could not reach the store on host 0.
grep -qE "not heard from for up to [0-9.]+ s: rank [23] \(host [^)]*$H1\)|this rank has not reached the rendezvous store" \
  "$TMP/cut.err" || fail "cut link: the error does not name the unreachable peer or store"
echo "cut link: dsrun exited $RC after ${elapsed}s: $(grep -m1 -E "failed after [0-9.]+ s \(timeout 5 s\)" "$TMP/cut.err" | cut -c1-300)"
mend_link 1

# gpt_train takes no marker argument: its config path (in this test's $TMP) identifies its ranks.
for ((i = 0; i < 30; i++)); do pgrep -f -- "$TMP/zero2.json" >/dev/null || break; sleep 0.1; done
pgrep -f -- "$TMP/zero2.json" >/dev/null && fail "processes left behind: $(pgrep -af -- "$TMP/zero2.json")"
echo "PASS multinode_gpt"
