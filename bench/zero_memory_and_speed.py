#!/usr/bin/python3
"""ZeRO stages against PyTorch DDP on the same GPT, data and ranks, measured in one run.

    /usr/bin/python3 bench/zero_memory_and_speed.py [--build build] [--procs 2] [--steps 8]
                                                   [--stages 0,1,2,3] [--precisions fp32,bf16]
                                                   [--micro_batch N]
                                                   [--shm on,large,gloo_gather,off]
                                                   [--malloc tuned,glibc] [--ddp_malloc_as_ours]
                                                   [--no_memory]

For each precision, each deepspeed.cpp stage and PyTorch DDP (Gloo; for bf16 DDP runs under
torch.autocast, PyTorch's own bf16 mixed precision) it runs the example GPT
(default n_layer 6, n_head 8, n_embd 512: 19.3M parameters) on --procs ranks with one thread each,
twice: once for speed (plain malloc) and once for memory (MALLOC_MMAP_THRESHOLD_=65536, so freed
blocks go back to the OS and VmHWM shows what was really needed). Prints a markdown table:
step time, tokens/s, model-state bytes per rank (from the engine's memory report / the tensors'
storages) against the ZeRO formula, and peak RSS per rank (VmHWM, max over ranks).
--shm on,large,gloo_gather,off runs every deepspeed.cpp stage with the shared-memory path on (the
default: all-reduces up to DS_SHM_ALLREDUCE_MAX_BYTES, all-gathers up to
DS_SHM_ALLGATHER_MAX_BYTES), on for all-reduces of every size (large:
DS_SHM_ALLREDUCE_MAX_BYTES=2^30, larger ones in pieces), on but with every all-gather through Gloo
(gloo_gather: DS_SHM_ALLGATHER_MAX_BYTES=1) and off (DS_SHM_ALLREDUCE=0: every collective
through Gloo); the other DS_SHM_* variables pass through from the caller. --malloc tuned,glibc
runs every deepspeed.cpp stage with its host allocator settings (tuned, the default: glibc malloc
keeps freed memory for reuse, src/util/host_allocator.h) and/or without them (glibc:
DS_MALLOC_TUNING=0); --ddp_malloc_as_ours gives the DDP rows the same thresholds through glibc's
own variables (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_). The memory run sets
MALLOC_MMAP_THRESHOLD_, so neither applies there; the speed run's peak RSS (its own column) shows
what the settings keep. --no_memory skips the memory run (its columns then read 0).
DDP runs with its defaults (broadcast_buffers=True, gradient_as_bucket_view=False: the published
rows); --ddp_no_broadcast_buffers and --ddp_gradient_as_bucket_view pass ddp_baseline.py's lean
options through (the row's name says which), e.g. both for the DDP that keeps no second fp32
gradient copy (-4 bytes per parameter of peak memory).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, env_extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", **env_extra)
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
    if out.returncode != 0:
        sys.exit(f"failed ({out.returncode}): {' '.join(cmd)}\n{out.stdout[-3000:]}")
    reports = [dict(kv.split("=") for kv in line.split("gpt_train_report ")[1].split())
               for line in out.stdout.splitlines() if "gpt_train_report " in line]
    if not reports:
        sys.exit(f"no report from: {' '.join(cmd)}\n{out.stdout[-3000:]}")
    return reports


def formula(stage, psi, n, precision):
    if precision == "fp32":
        return {0: 16 * psi, 1: 8 * psi + 8 * psi / n, 2: 4 * psi + 12 * psi / n, 3: 16 * psi / n}[stage]
    return {0: 16 * psi, 1: 4 * psi + 12 * psi / n, 2: 2 * psi + 14 * psi / n, 3: 16 * psi / n}[stage]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--n_layer", type=int, default=6)
    p.add_argument("--n_head", type=int, default=8)
    p.add_argument("--n_embd", type=int, default=512)
    p.add_argument("--stages", default="0,1,2,3")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--micro_batch", type=int, default=0, help="override the config's micro-batch per rank")
    p.add_argument("--shm", default="on",
                   help="deepspeed.cpp runs: on, large, gloo_gather and/or off (see above)")
    p.add_argument("--malloc", default="tuned",
                   help="deepspeed.cpp runs: tuned (default) and/or glibc (DS_MALLOC_TUNING=0)")
    p.add_argument("--ddp_malloc_as_ours", action="store_true",
                   help="DDP with the malloc thresholds of deepspeed.cpp's host allocator")
    p.add_argument("--no_memory", action="store_true", help="speed run only")
    p.add_argument("--ddp_no_broadcast_buffers", action="store_true",
                   help="DDP without broadcast_buffers (its default re-broadcasts the causal masks every forward)")
    p.add_argument("--ddp_gradient_as_bucket_view", action="store_true",
                   help="DDP with gradient_as_bucket_view (its default keeps a second fp32 gradient copy)")
    a = p.parse_args()
    for shm in a.shm.split(","):
        if shm not in ("on", "large", "gloo_gather", "off"):
            p.error(f"--shm: '{shm}' is not on, large, gloo_gather or off")
    for m in a.malloc.split(","):
        if m not in ("tuned", "glibc"):
            p.error(f"--malloc: '{m}' is not tuned or glibc")
    model = ["--n_layer", str(a.n_layer), "--n_head", str(a.n_head), "--n_embd", str(a.n_embd), "--block_size", "128"]
    data = os.path.join(ROOT, "data", "fortunes.txt")
    base = json.load(open(os.path.join(ROOT, "examples", "gpt", "ds_config.json")))
    if a.micro_batch > 0:
        base["train_micro_batch_size_per_gpu"] = a.micro_batch
    dsrun = os.path.join(a.build, "bin", "dsrun")
    rows = []
    port = 29700
    with tempfile.TemporaryDirectory() as tmp:
        runs = []
        for prec in a.precisions.split(","):
            for s in a.stages.split(","):
                for shm in a.shm.split(","):
                    for m in a.malloc.split(","):
                        how = "" if a.shm == "on" else {
                            "on": ", shm up to the limit", "large": ", shm any size",
                            "gloo_gather": ", all-gathers through Gloo", "off": ", Gloo only"}[shm]
                        how += "" if a.malloc == "tuned" else {
                            "tuned": ", malloc tuned", "glibc": ", glibc's malloc settings"}[m]
                        runs.append((f"deepspeed.cpp ZeRO-{s} {prec}{how}", int(s), prec, shm, m))
            lean = [o for o, on in (("no broadcast_buffers", a.ddp_no_broadcast_buffers),
                                    ("gradient_as_bucket_view", a.ddp_gradient_as_bucket_view),
                                    ("malloc as deepspeed.cpp's", a.ddp_malloc_as_ours)) if on]
            runs.append((f"PyTorch DDP (Gloo) {'fp32' if prec == 'fp32' else 'bf16 autocast'}"
                         + (f", {', '.join(lean)}" if lean else ""), None, prec, "on",
                         "tuned" if a.ddp_malloc_as_ours else "glibc"))
        for name, stage, prec, shm, malloc in runs:
            cfg = json.loads(json.dumps(base))
            cfg["zero_optimization"]["stage"] = stage if stage is not None else 0
            cfg["steps_per_print"] = 0
            if prec == "bf16":
                cfg["bf16"] = {"enabled": True}
            if stage == 3:
                # DeepSpeed's defaults (1e9 elements) would keep every block gathered from its
                # forward to its backward on a model this small (and so does deepspeed.cpp): bound
                # the working set to about two blocks instead.
                block = 12 * a.n_embd * a.n_embd + 13 * a.n_embd
                cfg["zero_optimization"].update({
                    "stage3_max_live_parameters": 2 * block + 1024,
                    "stage3_prefetch_bucket_size": block + 1024,
                    "stage3_max_reuse_distance": 0,
                })
            path = os.path.join(tmp, f"cfg{stage}{prec}.json")
            json.dump(cfg, open(path, "w"))
            if stage is None:
                prog = [os.path.join(ROOT, "bench", "ddp_baseline.py"), "--config", path, "--data", data]
                if prec == "bf16":
                    prog.append("--autocast_bf16")
                if a.ddp_no_broadcast_buffers:
                    prog.append("--no_broadcast_buffers")
                if a.ddp_gradient_as_bucket_view:
                    prog.append("--gradient_as_bucket_view")
            else:
                prog = [os.path.join(a.build, "bin", "gpt_train"), "--deepspeed_config", path, "--data", data]
            results = {}
            modes = [("speed", {})]
            if not a.no_memory:
                modes.append(("memory", {"MALLOC_MMAP_THRESHOLD_": "65536"}))
            for mode, env in modes:
                port += 1
                cmd = [dsrun, "--num_procs", str(a.procs), "--master_port", str(port)] + prog + model + ["--steps", str(a.steps)]
                run_env = {"DS_SHM_ALLREDUCE": "0" if shm == "off" else "1"}
                if shm == "large":
                    run_env["DS_SHM_ALLREDUCE_MAX_BYTES"] = str(1 << 30)
                if shm == "gloo_gather":
                    run_env["DS_SHM_ALLGATHER_MAX_BYTES"] = "1"
                if malloc == "glibc":
                    run_env["DS_MALLOC_TUNING"] = "0"
                elif stage is None and mode == "speed":  # DDP given deepspeed.cpp's thresholds
                    run_env.update(MALLOC_MMAP_THRESHOLD_=str(32 << 20),
                                   MALLOC_TRIM_THRESHOLD_=str(1 << 30))
                results[mode] = run(cmd, dict(env, **run_env))
                print(f"  {name} ({mode}): done", file=sys.stderr, flush=True)
            speed = results["speed"]
            mem = results.get("memory", [{"model_state_bytes": 0, "peak_rss_kb": 0}])
            psi = int(speed[0]["num_params"])
            rows.append({
                "name": name,
                "stage": stage,
                "precision": prec,
                "psi": psi,
                "step_ms": max(float(r["step_ms"]) for r in speed),
                "tokens_per_s": min(float(r["tokens_per_s"]) for r in speed),
                "loss": float(speed[0]["final_loss"]),
                "model_state": max(int(r["model_state_bytes"]) for r in mem),
                "rss_kb": max(int(r["peak_rss_kb"]) for r in mem),
                "speed_rss_kb": max(int(r["peak_rss_kb"]) for r in speed),
                "gathered": max(int(r.get("gathered_peak_bytes", 0)) for r in mem),
            })
    print(f"\n{a.procs} ranks x 1 thread, GPT n_layer {a.n_layer} n_head {a.n_head} n_embd {a.n_embd} block 128, "
          f"{rows[0]['psi'] / 1e6:.1f}M parameters, micro-batch {base['train_micro_batch_size_per_gpu']} per rank, "
          f"AdamW, {a.steps} steps (first step not timed)\n")
    print("| run | step time (ms) | tokens/s | loss after last step | model-state MB per rank | "
          "ZeRO formula MB | ZeRO-3 gathered peak MB | peak RSS MB per rank | "
          "speed run's peak RSS MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        # DDP under autocast keeps fp32 weights, gradients and moments: the fp32 formula applies.
        prec = r["precision"] if r["stage"] is not None else "fp32"
        f = formula(r["stage"] if r["stage"] is not None else 0, r["psi"], a.procs, prec) / 1e6
        gathered = f"{r['gathered'] / 1e6:.1f}" if r["stage"] == 3 else ""
        print(f"| {r['name']} | {r['step_ms']:.0f} | {r['tokens_per_s']:.0f} | {r['loss']:.4f} | "
              f"{r['model_state'] / 1e6:.1f} | {f:.1f} | {gathered} | {r['rss_kb'] / 1024:.0f} | "
              f"{r['speed_rss_kb'] / 1024:.0f} |")


if __name__ == "__main__":
    main()
