#!/usr/bin/env python3
"""The table of a bench/gpu/run.sh call: every row's step time, tokens/s, TFLOP/s (6 * params *
tokens/s), GPU peak (over the whole process, as the peers' torch.cuda.max_memory_allocated();
ours also over the timed steps alone) and host peak, host bytes of ZeRO state per parameter (the floor is 12: fp32
master and two moments), and deepspeed.cpp's rows against their peer from the same call
with the issue's goal beside the ratio. Then the floors measured in the same call (host memory
bandwidth and CPU Adam rate from bench_cpu_adam, copy bandwidth from bench_transfer).

usage: table.py OUT_DIR [ROW ...]   (rows: run.sh's ROWS; default: every row found)
SIZE_GOAL=7.7e9 in the environment: the goal of our rows is that many parameters trained (the
largest-model step), not a ratio.

Ours come from gpt_train's `gpt_train_report` line of rank 0 in OUT_DIR/<row>.log (step time:
the mean of the timed steps), the peers from OUT_DIR/peers.jsonl (gpu-anchor's gpt_bench.py): the
same statistic, its step_s_mean (its own tokens_per_s and TFLOP/s come from the median, so both
are recomputed from the mean here). GPU peak: gpt_train resets the allocator's peak after the
warm-up steps, so its gpu_allocated_peak covers the timed steps only; the column compared with
the peers is gpu_allocated_peak_total (the whole run, model building and warm-up included); a
log without it (gpt_train before that field) shows "?" there. "GPU reserved GiB": the whole run's
reserved peak on both sides (gpt_train's gpu_reserved_peak_total, the peers' max_memory_reserved():
what the caching allocator took, fragmentation included); blank where a log has none. A row that failed or is missing
shows why instead of numbers; one that ran out of GPU memory says "cannot fit" (under MEMCAP
GiB, from the environment, when set); one of ours whose final loss is not finite, "failed"."""
import json
import math
import os
import re
import sys

# deepspeed.cpp row -> (peer row, goal as a ratio of tokens/s), from issue 14.
PEERS = {
    "dscpp_z0": ("torch", 1.0), "dscpp_z1": ("torch", 1.0), "dscpp_z2": ("torch", 1.0),
    "dscpp_z3": ("torch", 0.9), "dscpp_z2_off": ("ds_z2_off", 2.0),
    "dscpp_z2_off_serial": ("ds_z2_off", None), "dscpp_z2_off_bwd": ("ds_z2_off", None),
    "dscpp_z3_off": ("ds_z3_off", 3.0),
    # Diagnostics: the engine's timers on (they synchronize the device), no goal.
    "dscpp_z2_wcb": ("torch", None), "dscpp_z2_off_wcb": ("ds_z2_off", None),
    "dscpp_z2_off_serial_wcb": ("ds_z2_off", None),
    # libtorch's fused Adam on a widened copy instead of ours (DS_DEVICE_ADAM=libtorch), no goal.
    "dscpp_z2_tadam": ("torch", None),
    # Low-precision masters (bf16_master_weights_and_grads): memory, no goal of the issue's.
    "dscpp_z2_off_lowp": ("ds_z2_off", None), "dscpp_z2_lowp": ("torch", None),
}
GIB = 2.0 ** 30


def out_of_gpu_memory(message):
    """The GPU's memory ran out: the engine's "out of GPU memory on cuda:N in ..." (its own words
    around libtorch's), libtorch's "CUDA out of memory", PyTorch's OutOfMemoryError. Read before a
    message is cut for its table cell. Not a bare "CUDA error: out of memory" (page-locked host
    memory among its causes), nor the engine's "GPU or page-locked host memory"."""
    return re.search(r"out of GPU memory on|CUDA out of memory|OutOfMemoryError", message) is not None


def ours(out, row):
    path = os.path.join(out, row + ".log")
    if not os.path.exists(path):
        return {"error": "no log"}
    text = open(path, errors="replace").read()
    m = re.search(r"^gpt_train_report rank=0 (.*)$", text, re.M)
    if not m:
        lines = text.strip().splitlines()
        errors = [l for l in lines if "error" in l.lower()]
        return {"error": (errors or lines or ["empty log"])[-1][:160],
                "oom": any(out_of_gpu_memory(l) for l in errors)}
    kv = dict(f.split("=", 1) for f in m.group(1).split())
    # A row whose loss went non-finite measured a broken run: no figure, as the peers' script
    # raises on a non-finite loss.
    if "final_loss" in kv and not math.isfinite(float(kv["final_loss"])):
        return {"error": f"final loss {kv['final_loss']}: the run diverged"}
    step_s = float(kv["step_ms"]) / 1e3
    tps = float(kv["tokens_per_s"])
    params = int(kv["num_params"])
    return {"step_s": step_s, "tokens_per_s": tps, "params": params,
            "tflops": 6 * params * tps / 1e12,
            # The whole run's peak, the peers' figure; the timed steps' beside it.
            "gpu_peak_gib": (int(kv["gpu_allocated_peak_total"]) / GIB
                             if "gpu_allocated_peak_total" in kv else None),
            "gpu_peak_timed_gib": int(kv["gpu_allocated_peak"]) / GIB,
            "gpu_reserved_gib": (int(kv["gpu_reserved_peak_total"]) / GIB
                                 if "gpu_reserved_peak_total" in kv else None),
            "host_peak_gib": int(kv["peak_rss_kb"]) * 1024 / GIB,
            "host_state_gib": int(kv.get("host_state_bytes", 0)) / GIB}


def peers(out):
    found = {}
    path = os.path.join(out, "peers.jsonl")
    if not os.path.exists(path):
        return found
    for line in open(path):
        line = line.strip()
        if not line:
            continue
        try:
            r = json.loads(line)
        except ValueError:  # a line cut short (a peer killed while writing): the rest still counts
            continue
        if not r.get("ok"):
            error = r.get("error", "failed")
            found[r["row"]] = {"error": error[:160], "oom": out_of_gpu_memory(error)}
            continue
        # The mean of the timed steps, as ours (gpt_bench.py's tokens_per_s is from the median).
        step_s = r["step_s_mean"]
        tps = r["tokens_per_step"] / step_s if step_s > 0 else 0.0
        found[r["row"]] = {"step_s": step_s, "tokens_per_s": tps,
                           "params": r.get("params", 0), "tflops": 6 * r.get("params", 0) * tps / 1e12,
                           "gpu_peak_gib": r.get("gpu_peak_alloc_gib", 0.0),
                           "gpu_reserved_gib": r.get("gpu_peak_reserved_gib"),
                           "host_peak_gib": r.get("host_peak_rss_gib", 0.0)}
    return found


def floors(out):
    lines = []
    for name in ("cpu_adam.log", "transfer.log"):
        path = os.path.join(out, name)
        if os.path.exists(path):
            for l in open(path, errors="replace"):
                if l.startswith(("memory bandwidth", "| deepspeed::optim::adam_step", "transfer_report")):
                    lines.append(l.rstrip())
    return lines


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    theirs = peers(out)
    rows = sys.argv[2:] or sorted(
        {f[:-4] for f in os.listdir(out) if f.startswith("dscpp_") and f.endswith(".log")} | set(theirs))
    print("| row | params | step s | tokens/s | TFLOP/s | GPU peak GiB | GPU peak timed steps GiB "
          "| GPU reserved GiB | host peak GiB | host B/param | vs peer | goal |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    skipped = {}  # run.sh's BUDGET_S: rows it did not start, and why
    if os.path.exists(os.path.join(out, "skipped.txt")):
        for line in open(os.path.join(out, "skipped.txt")):
            name, _, why = line.strip().partition(" ")
            skipped[name] = why
    for row in rows:
        if row in skipped:
            print(f"| {row} | skipped: {skipped[row]} | | | | | | | | | | |")
            continue
        r = ours(out, row) if row.startswith("dscpp_") else theirs.get(row, {"error": "no result"})
        if "error" in r:
            reason = " ".join(r["error"].replace("|", "/").split())  # one table cell
            # Out of memory is a result, not a failure, where a row is there to show it (seed 003:
            # stage 0 and PyTorch at micro-batch 1 under the cap).
            if r.get("oom"):
                cap = os.environ.get("MEMCAP")
                print(f"| {row} | cannot fit{f' under {cap} GiB' if cap else ''} (out of memory): "
                      f"{reason} | | | | | | | | | | |")
            else:
                print(f"| {row} | failed: {reason} | | | | | | | | | | |")
            continue
        versus, goal = "", ""
        size_goal = float(os.environ.get("SIZE_GOAL", "0"))
        if size_goal and row.startswith("dscpp_"):
            goal = f">= {size_goal / 1e9:.1f}B trained: {'met' if r['params'] >= size_goal else 'NOT met'}"
        elif row in PEERS:
            peer, want = PEERS[row]
            p = theirs.get(peer)
            if p and "error" not in p and p["tokens_per_s"] > 0:
                ratio = r["tokens_per_s"] / p["tokens_per_s"]
                versus = f"{ratio:.2f}x {peer}"
                if want is not None:
                    goal = f">= {want}x: {'met' if ratio >= want else 'NOT met'}"
            else:
                versus = f"no {peer} row"
        p = r["params"]
        size = f"{p / 1e9:.2f}B" if p >= 1e8 else f"{p / 1e6:.2f}M"
        per_param = f"{r['host_state_gib'] * GIB / p:.1f}" if r.get("host_state_gib") and p else ""
        peak = "?" if r["gpu_peak_gib"] is None else f"{r['gpu_peak_gib']:.2f}"
        timed = f"{r['gpu_peak_timed_gib']:.2f}" if "gpu_peak_timed_gib" in r else ""
        reserved = "" if r.get("gpu_reserved_gib") is None else f"{r['gpu_reserved_gib']:.2f}"
        print(f"| {row} | {size} | {r['step_s']:.3f} | {r['tokens_per_s']:.0f} | {r['tflops']:.1f} | "
              f"{peak} | {timed} | {reserved} | {r['host_peak_gib']:.2f} | {per_param} | {versus} | "
              f"{goal} |")
    f = floors(out)
    if f:
        print("\nMeasured in the same call (floors of the offloaded rows):")
        for l in f:
            print("  " + l)


if __name__ == "__main__":
    main()
