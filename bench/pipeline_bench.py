#!/usr/bin/python3
"""Pipeline parallelism against data parallelism on the same GPT, data and rank count, in one run.

    /usr/bin/python3 bench/pipeline_bench.py [--build build] [--steps 6] [--micro 4,8,16]

For p = 2 and 4 ranks and m micro-batches per step it runs the example GPT (a model whose blocks
dominate: n_layer 8, n_embd 256) with gpt_train --pipeline_stages p (pipe p x data 1, ZeRO-1 in
each stage) and with plain data parallelism over the same p ranks (ZeRO-2, the same global batch:
m micro-batches of the same size, m / p accumulation steps per rank). Prints a markdown table:
tokens/s, the measured bubble (mean over ranks of the fraction of the schedule's wall time -- the
train_batch without its optimizer step, which the theory leaves out -- not spent in
forward/backward compute: waiting for neighbours and transfers) against the 1F1B theory
(p - 1) / (m + p - 1), the step's share of train_batch, and peak RSS per rank (VmHWM, max over ranks; run with
MALLOC_MMAP_THRESHOLD_=65536 so freed blocks go back to the OS).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PORT = [29811]


def run(build, procs, cfg, extra, model):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cfg, f)
    PORT[0] += 1
    cmd = [os.path.join(build, "bin", "dsrun"), "--num_procs", str(procs), "--master_port", str(PORT[0]),
           os.path.join(build, "bin", "gpt_train"), "--deepspeed_config", f.name, "--random_tokens",
           "--warmup", "2"] + model + extra
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_DEVICE="cpu", MALLOC_MMAP_THRESHOLD_="65536")
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
    os.unlink(f.name)
    if out.returncode != 0:
        sys.exit(f"failed ({out.returncode}): {' '.join(cmd)}\n{out.stdout[-3000:]}")
    reports = [dict(kv.split("=") for kv in line.split("gpt_train_report ")[1].split())
               for line in out.stdout.splitlines() if "gpt_train_report " in line]
    if len(reports) != procs:
        sys.exit(f"expected {procs} reports from: {' '.join(cmd)}\n{out.stdout[-3000:]}")
    return reports


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--micro", default="4,8,16", help="micro-batches per step")
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--micro_batch", type=int, default=2, help="samples per micro-batch")
    p.add_argument("--n_layer", type=int, default=8)
    p.add_argument("--n_embd", type=int, default=256)
    a = p.parse_args()
    model = ["--n_layer", str(a.n_layer), "--n_head", "4", "--n_embd", str(a.n_embd), "--block_size", "64",
             "--steps", str(a.steps)]
    print("| ranks | m | layout | tokens/s | measured bubble | 1F1B theory (p-1)/(m+p-1) | bubble / theory "
          "| step share | peak RSS/rank MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for procs in [int(x) for x in a.ranks.split(",")]:
        for m in [int(x) for x in a.micro.split(",")]:
            base = {"train_micro_batch_size_per_gpu": a.micro_batch, "steps_per_print": 0,
                    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}, "seed": 1}
            pipe = dict(base, gradient_accumulation_steps=m, zero_optimization={"stage": 1},
                        pipeline={"stages": procs})
            r = run(a.build, procs, pipe, ["--pipeline_stages", "-1"], model)
            bubble = sum(float(x["idle_fraction"]) for x in r) / len(r)
            step = sum(float(x["step_fraction"]) for x in r) / len(r)
            theory = (procs - 1) / (m + procs - 1)
            print(f"| {procs} | {m} | pipe {procs} x data 1 (ZeRO-1) | {float(r[0]['tokens_per_s']):.0f} | "
                  f"{bubble:.3f} | {theory:.3f} | {bubble / theory:.2f} | {step:.3f} | "
                  f"{max(int(x['peak_rss_kb']) for x in r) / 1024:.0f} |", flush=True)
            if m % procs == 0:
                dp = dict(base, gradient_accumulation_steps=m // procs, zero_optimization={"stage": 2})
                r = run(a.build, procs, dp, [], model)
                print(f"| {procs} | {m} | data {procs} (ZeRO-2) | {float(r[0]['tokens_per_s']):.0f} | – | – | – | – | "
                      f"{max(int(x['peak_rss_kb']) for x in r) / 1024:.0f} |", flush=True)


if __name__ == "__main__":
    main()
