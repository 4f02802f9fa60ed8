#!/usr/bin/python3
"""What monitoring costs: gpt_train's step time with the monitors off and on, in one run.

    /usr/bin/python3 bench/monitor_overhead.py [--build build] [--procs 2] [--steps 30]
                                              [--rounds 3] [--n_layer 4] [--n_embd 256]

Runs the reference workload (GPT n_layer 4, n_head 4, n_embd 256, block 128, micro-batch 8 per
rank, AdamW, ZeRO-2, --procs ranks with one thread each) in four modes: everything off;
tensorboard + csv_monitor on (flushing every steps_per_print = 10 steps); wall_clock_breakdown on;
and all of them plus comms_logger. The modes run interleaved, --rounds times, so that drift in
the machine's load spreads over all of them; each mode's figure is the median of its rounds'
step times (gpt_train's own step_ms: steps 2..N, the slowest rank). Prints a markdown table with
the overhead against "off", then the monitors' own cost measured directly by
build/bin/bench_monitor_write (one optimizer step's events into both monitors with the timer
events, a flush every 10 steps; a timer start/stop pair), as a share of the "off" step time:
on this shared machine that figure is below the end-to-end noise.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODES = [
    ("off", {}),
    ("tensorboard + csv_monitor", {"monitors": True}),
    ("wall_clock_breakdown", {"wall_clock_breakdown": True}),
    ("all + comms_logger", {"monitors": True, "wall_clock_breakdown": True, "comms_logger": True}),
]


def step_ms(cmd):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
    if out.returncode != 0:
        sys.exit(f"failed ({out.returncode}): {' '.join(cmd)}\n{out.stdout[-3000:]}")
    times = [float(line.split("step_ms=")[1].split()[0]) for line in out.stdout.splitlines()
             if "gpt_train_report " in line]
    if not times:
        sys.exit(f"no report from: {' '.join(cmd)}\n{out.stdout[-3000:]}")
    return max(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--n_layer", type=int, default=4)
    p.add_argument("--n_head", type=int, default=4)
    p.add_argument("--n_embd", type=int, default=256)
    a = p.parse_args()
    model = ["--n_layer", str(a.n_layer), "--n_head", str(a.n_head), "--n_embd", str(a.n_embd), "--block_size", "128"]
    base = json.load(open(os.path.join(ROOT, "examples", "gpt", "ds_config.json")))
    base["steps_per_print"] = 10
    dsrun = os.path.join(a.build, "bin", "dsrun")
    times = {name: [] for name, _ in MODES}
    port = 29900
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for name, mode in MODES:
                cfg = json.loads(json.dumps(base))
                if mode.get("wall_clock_breakdown"):
                    cfg["wall_clock_breakdown"] = True
                if mode.get("comms_logger"):
                    cfg["comms_logger"] = {"enabled": True}
                if mode.get("monitors"):
                    for block in ("tensorboard", "csv_monitor"):
                        cfg[block] = {"enabled": True, "output_path": os.path.join(tmp, f"m{r}"), "job_name": block}
                path = os.path.join(tmp, "cfg.json")
                json.dump(cfg, open(path, "w"))
                port += 1
                cmd = [dsrun, "--num_procs", str(a.procs), "--master_port", str(port),
                       os.path.join(a.build, "bin", "gpt_train"), "--deepspeed_config", path,
                       "--steps", str(a.steps)] + model
                times[name].append(step_ms(cmd))
                print(f"  round {r + 1}: {name}: {times[name][-1]:.2f} ms", file=sys.stderr, flush=True)
    off = statistics.median(times["off"])
    with tempfile.TemporaryDirectory() as tmp:
        direct = subprocess.run([os.path.join(a.build, "bin", "bench_monitor_write"), "5000", tmp],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=True).stderr
    report = dict(kv.split("=") for kv in direct.split("monitor_write_report ")[1].split())
    print(f"\n{a.procs} ranks x 1 thread, GPT n_layer {a.n_layer} n_head {a.n_head} n_embd {a.n_embd} block 128, "
          f"micro-batch {base['train_micro_batch_size_per_gpu']} per rank, ZeRO-2, {a.steps} steps "
          f"(first not timed), steps_per_print 10; median of {a.rounds} interleaved rounds\n")
    print("| monitoring | step time (ms) | vs off | rounds (ms) |")
    print("|---|---:|---:|---|")
    for name, _ in MODES:
        med = statistics.median(times[name])
        print(f"| {name} | {med:.2f} | {100 * (med / off - 1):+.1f}% | {', '.join(f'{t:.1f}' for t in times[name])} |")
    us = float(report["us_per_step"])
    print(f"\nMeasured directly (bench_monitor_write): one step's events into tensorboard + csv_monitor "
          f"{us:.1f} us ({100 * us / 1000 / off:.3f}% of the off step); a wall_clock_breakdown timer "
          f"start/stop pair {float(report['timer_pair_ns_enabled']):.0f} ns enabled, "
          f"{float(report['timer_pair_ns_disabled']):.1f} ns disabled (5 pairs per micro-step).")


if __name__ == "__main__":
    main()
