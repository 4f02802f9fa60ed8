#!/bin/bash
# ZeRO-0/2/3 step time of the example GPT on 2 hosts x PER_HOST ranks (default 1) over links
# shaped with tbf to 10 Gbit/s and 1 Gbit/s, against as many ranks on one host (loopback), in one
# run, with the bytes moved per step: the payload handed to the collectives (gpt_train's
# communicator counters, timed steps) and the bytes host 1 sent on its link (its interface
# counters, whole run / steps; all its ranks'), set against the ZeRO paper's per-rank volume
# (stages 0-2: 2 psi, stage 3: 3 psi elements per step; a ring over n ranks sends (n-1)/n of it).
#
#   sudo bash bench/multinode_bench.sh [BUILD_DIR]       (root: network namespaces, sshd)
#   STAGES="0 1 2 3" LINKS="1gbit" ... picks the rows (default: stages 0 2 3, every link);
#   GATHERS="wait overlap" adds, at stages 1 and 2, rows with zero_optimization.overlap_param_gather
#   (the all-gather after the step running into the next forward; default: wait only);
#   EXCHANGES="auto 0" adds rows with DS_GLOO_EXCHANGE=0 (reduce-scatter and all-gather through
#   Gloo's alltoall and broadcasts instead of messages with the receives posted first,
#   src/comm/gloo_exchange.h; "1" forces the messages on one host too; default: auto only);
#   PER_HOST=2 runs 2 ranks on each host (4 on the loopback rows); HIERARCHICAL="1 0" adds rows
#   with DS_GLOO_HIERARCHICAL=0 (every rank to every rank instead of within each host and then
#   across, src/comm/gloo_hierarchy.h; it applies with 2+ ranks per host; default: 1 only).
#
# The hosts are network namespaces joined by veth links to a bridge, with sshd, launched through
# dsrun's real ssh path (tests/launcher/netns.bash). tbf shapes each host's egress on its link.
# Prints a markdown table (docs/benchmarks.md).
set -uo pipefail
source "$(dirname "$0")/netns_harness.bash" "${1:-}" 2
STEPS=${STEPS:-8}
WARMUP=2
MODEL=(--n_layer 4 --n_head 4 --n_embd 256 --block_size 64 --random_tokens --threads 1
       --steps "$STEPS" --warmup "$WARMUP")
PER_HOST=${PER_HOST:-1}
WORLD=$((2 * PER_HOST))
write_hostfile "$TMP/hostfile1" "$PER_HOST"

config() {  # config STAGE FILE OVERLAP_PARAM_GATHER
  cat >"$2" <<JSON
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "steps_per_print": 0,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}, "seed": 1,
 "zero_optimization": {"stage": $1, "reduce_bucket_size": 5e6, "allgather_bucket_size": 5e6,
                       "overlap_param_gather": $3},
 "comm_timeout_seconds": 120}
JSON
}

echo -n "| link | ZeRO stage | param gather | exchange | hierarchical | step ms | payload MB/step "
echo "| host-1 sent MB/step | ZeRO volume x (n-1)/n MB | link busy |"
echo "|---|---|---|---|---|---|---|---|---|---|"
rows() {  # stage:gather:exchange; overlap only where there is a gather after the step
  for stage in ${STAGES:-0 2 3}; do
    for gather in ${GATHERS:-wait}; do
      for exchange in ${EXCHANGES:-auto}; do
        for hier in ${HIERARCHICAL:-1}; do
          case "$stage:$gather" in
            1:*|2:*) echo "$stage:$gather:$exchange:$hier" ;;
            *:wait) echo "$stage:-:$exchange:$hier" ;;
          esac
        done
      done
    done
  done
}
for link in ${LINKS:-loopback 10gbit 1gbit}; do
  for row in $(rows); do
    IFS=: read -r stage gather exchange hier <<<"$row"
    export DS_GLOO_EXCHANGE=$exchange DS_GLOO_HIERARCHICAL=$hier
    name="run_${link}_${stage}_${gather}_${exchange}_$hier"
    overlap=false; [ "$gather" = overlap ] && overlap=true
    config "$stage" "$TMP/z$stage.json" "$overlap"
    GPT=("$BIN/gpt_train" --deepspeed_config "$TMP/z$stage.json" "${MODEL[@]}")
    if [ "$link" = loopback ]; then
      shape_links ""
      run_on_host0 "$name" --num_procs "$WORLD" --master_port "$(free_port)" \
        "${GPT[@]}"
      sent="-"
    else
      shape_links "$link"
      before=$(link_tx_bytes 1)
      run_on_host0 "$name" --hostfile "$TMP/hostfile1" \
        --launcher_args "$SSH_ARGS" --master_port "$(free_port)" "${GPT[@]}"
      after=$(link_tx_bytes 1)
      sent=$(( (after - before) / STEPS ))
    fi
    out="$TMP/$name.out"
    [ "$RC" -eq 0 ] || fail "$link stage $stage: dsrun exited $RC"
    ms=$(report_field "$out" step_ms)
    payload=$(report_field "$out" comm_payload_bytes_per_step)
    psi=$(report_field "$out" num_params)
    factor=2; [ "$stage" = 3 ] && factor=3
    # fp32 communication; a ring over n ranks sends (n-1)/n of the volume per rank
    expect=$(( psi * 4 * factor * (WORLD - 1) / WORLD ))
    python3 - "$link" "$stage" "$gather" "$exchange" "$hier" "$ms" "$payload" "$sent" \
      "$expect" <<'PY'
import sys
link, stage, gather, exchange, hier, ms, payload, sent, expect = sys.argv[1:]
ms = float(ms)
rate = {"10gbit": 10e9, "1gbit": 1e9}.get(link)
sent_mb = "-" if sent == "-" else f"{int(sent) / 1e6:.1f}"
busy = "-" if sent == "-" else f"{int(sent) * 8 / (rate * ms / 1e3):.0%}"
cells = [link, stage, gather, exchange, hier, f"{ms:.0f}", f"{int(payload) / 1e6:.1f}", sent_mb,
         f"{int(expect) / 1e6:.1f}", busy]
print("| " + " | ".join(cells) + " |")
PY
  done
done
shape_links ""
